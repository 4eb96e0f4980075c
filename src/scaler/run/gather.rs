//! The pass's snapshot: what the API server and the provider show, read fresh each pass.

use super::*;
use crate::kube_client::list_paged;

impl<P: Provider + 'static> Inner<P> {
    #[instrument(skip(self), err)]
    pub(super) async fn gather(&self) -> Result<Snapshot> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let pods: Api<Pod> = Api::all(self.client.clone());
        let status: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        let budgets: Api<PodDisruptionBudget> = Api::all(self.client.clone());
        let all = ListParams::default();
        let live = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        // Nodes and Pods are turned into views a page at a time (`list_paged`): whole objects
        // are never all held at once. A Node's cordon by a cluster shutdown is read on the way.
        let mut shutdown_cordons = false;
        let node_views = list_paged(&nodes, &all, |n| {
            shutdown_cordons |= crate::cluster::intent::is_live([n]);
            Some(model::node_view(n))
        });
        // The pods' views need the DaemonSets (what leaves with a node), so they come first.
        let pod_views = async {
            let daemonsets = self.daemonsets().await?;
            let cx = self.leave_context(&daemonsets);
            list_paged(&pods, &live, |p| model::pod_view(p, &cx))
                .await
                .map_err(api("list pods"))
        };
        let (nodes, pods, status, budgets, machines, cluster_shutdown) = tokio::join!(
            node_views,
            pod_views,
            status.get_opt(STATUS_CONFIGMAP),
            budgets.list(&all),
            self.provider.list(),
            crate::cluster::read_intent(&self.client),
        );
        let cluster_shutdown = match cluster_shutdown {
            // A scaler whose RBAC predates cluster shutdowns acts as it did.
            Err(kube::Error::Api(s)) if s.code == 403 => {
                warn!(
                    "cannot read ConfigMap kube-system/nodeward-cluster-shutdown (needs get on it: apply packaging/kubernetes/rbac-scaler.yaml); a cluster shutdown would not pause this scaler"
                );
                None
            }
            other => other.map_err(api("read ConfigMap kube-system/nodeward-cluster-shutdown"))?,
        };
        let nodes = nodes.map_err(api("list nodes"))?;
        let cluster_shutdown = cluster_shutdown.map(|i| model::ClusterShutdownView {
            requested_by: i.requested_by,
            started_at: i.started_at,
            live: shutdown_cordons,
        });
        let pods = pods?;
        let status = status.map_err(api("read the status ConfigMap"))?;
        let budgets = budgets.map_err(api("list poddisruptionbudgets"))?;
        let machines = machines?;
        let data = status.and_then(|cm| cm.data).unwrap_or_default();
        let backoff = data
            .get("backoff")
            .and_then(|b| serde_json::from_str(b).ok())
            .unwrap_or_default();
        let guard_held = data
            .get("guard_held")
            .and_then(|g| serde_json::from_str(g).ok())
            .unwrap_or_default();
        Ok(Snapshot {
            nodes,
            pods,
            machines,
            backoff,
            guard_held,
            budgets: budgets.items.iter().map(model::budget_view).collect(),
            cluster_shutdown,
        })
    }

    /// The DaemonSets (`apps/v1`) that exist, by namespace and name: whether a DaemonSet's pod
    /// stays with its node or keeps the drain from completing, as the drain's own watch says.
    pub(super) async fn daemonsets(&self) -> Result<HashSet<(String, String)>> {
        let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::all(self.client.clone());
        let list = daemonsets
            .list_metadata(&ListParams::default())
            .await
            .map_err(api("list daemonsets"))?;
        Ok(list
            .items
            .into_iter()
            .map(|d| {
                (
                    d.metadata.namespace.unwrap_or_default(),
                    d.metadata.name.unwrap_or_default(),
                )
            })
            .collect())
    }

    /// What leaves with a node, judged as this scaler's scale-down drain will judge it.
    pub(super) fn leave_context<'a>(
        &self,
        daemonsets: &'a HashSet<(String, String)>,
    ) -> model::LeaveContext<'a> {
        model::LeaveContext {
            rules: self.drain.plan.rules(),
            daemonsets: Some(daemonsets),
        }
    }

    /// The node's pods and budgets as they are now, reduced to
    /// [`decide::scale_down_fingerprint`].
    pub(super) async fn fingerprint(&self, node: &str) -> Result<String> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let budgets: Api<PodDisruptionBudget> = Api::all(self.client.clone());
        let on_node = ListParams::default().fields(&format!(
            "spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed"
        ));
        let all = ListParams::default();
        let (pods, budgets, daemonsets) =
            tokio::join!(pods.list(&on_node), budgets.list(&all), self.daemonsets());
        let daemonsets = daemonsets?;
        let pods: Vec<model::PodView> = pods
            .map_err(api("list the node's pods"))?
            .items
            .iter()
            .filter_map(|p| model::pod_view(p, &self.leave_context(&daemonsets)))
            .collect();
        let budgets: Vec<model::BudgetView> = budgets
            .map_err(api("list poddisruptionbudgets"))?
            .items
            .iter()
            .map(model::budget_view)
            .collect();
        Ok(decide::scale_down_fingerprint(
            &pods.iter().collect::<Vec<_>>(),
            &budgets,
        ))
    }
}
