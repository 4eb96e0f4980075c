//! Scale-down: an idle node cordoned, drained, deleted with its machine; or given back.

use super::*;

impl<P: Provider + 'static> Inner<P> {
    /// Starts the node's scale-down in a task of its own, unless this process already runs
    /// it: a drain can outlast many passes.
    pub(super) fn start_scale_down(self: &Arc<Self>, group: &str, node: &str, machine: &str) {
        let fresh = lock(&self.draining).insert(node.to_string());
        if fresh {
            let me = self.clone();
            let (group, node, machine) = (group.to_string(), node.to_string(), machine.to_string());
            tokio::spawn(async move { me.scale_down(&group, &node, &machine).await });
        }
    }

    pub(super) async fn annotate(&self, node: &str, value: Option<String>) {
        let annotations = json!({UNNEEDED_SINCE: value});
        self.write_annotations(node, annotations, "the unneeded-since annotation")
            .await;
    }

    /// Merges `annotations` (`null` removes one) into the Node's; a failure is logged.
    pub(super) async fn write_annotations(
        &self,
        node: &str,
        annotations: serde_json::Value,
        what: &str,
    ) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"metadata": {"annotations": annotations}});
        if let Err(e) = nodes
            .patch(
                node,
                &crate::node_write::patch_params(),
                &Patch::Merge(&patch),
            )
            .await
        {
            warn!(node, error = %e, "cannot update {what}");
        }
    }

    pub(super) async fn scale_down(&self, group: &str, node: &str, machine: &str) {
        info!(group, node, machine, "scale-down: draining");
        self.event(
            &node_ref(node),
            EventType::Normal,
            "ScaleDown",
            "ScaleDown",
            format!("node unneeded: nodeward scaler drains it and deletes machine {machine} of group {group}"),
        )
        .await;
        let result = crate::drain::drain(&self.client, node, &self.drain).await;
        match result {
            Ok(r) if r.outcome == DrainOutcome::Drained => {
                self.delete_drained(group, node, machine, r.evicted.len())
                    .await;
            }
            Ok(r) => self.give_back(group, node, &r).await,
            Err(e) => {
                self.metrics
                    .failures
                    .get_or_create(&metrics::failure(group, "drain"))
                    .inc();
                warn!(group, node, error = %e, "scale-down: drain failed; the next pass retries");
            }
        }
        lock(&self.draining).remove(node);
    }

    /// Deletes a drained node's machine, then its Node; not if the node was opted out since
    /// (its scale-down is cancelled), cannot be re-read, or this replica no longer leads.
    pub(super) async fn delete_drained(
        &self,
        group: &str,
        node: &str,
        machine: &str,
        evicted: usize,
    ) {
        match self.opted_out(node).await {
            Ok(false) => {}
            Ok(true) => {
                self.cancel_scale_down(group, node).await;
                return;
            }
            Err(e) => {
                warn!(group, node, error = %e, "scale-down: cannot re-read the Node before deleting its machine; the next pass retries");
                return;
            }
        }
        // Not the leader any more: the node stays cordoned with nodeward's scale-down record,
        // and the leader finishes the scale-down.
        let Some(deleted) = self.delete_machine(group, machine).await else {
            return;
        };
        match deleted {
            Ok(()) => {
                self.delete_node(node).await;
                self.metrics
                    .scale_downs
                    .get_or_create(&metrics::group(group))
                    .inc();
                info!(
                    group,
                    node, machine, evicted, "scale-down: machine and Node deleted"
                );
            }
            Err(e) => {
                self.metrics
                    .failures
                    .get_or_create(&metrics::failure(group, "delete"))
                    .inc();
                warn!(group, node, machine, error = %e, "scale-down: cannot delete the machine; the next pass retries");
            }
        }
    }

    /// Gives back a node whose drain did not complete: uncordoned, its unneeded record
    /// cleared, and what it held recorded so decide does not pick it for the same failure.
    pub(super) async fn give_back(&self, group: &str, node: &str, r: &DrainReport) {
        self.metrics
            .failures
            .get_or_create(&metrics::failure(group, "drain"))
            .inc();
        warn!(group, node, outcome = ?r.outcome, left_behind = r.left_behind.len(), refused = r.refused.len(), "scale-down: drain incomplete; giving the node back");
        self.event(
            &node_ref(node),
            EventType::Warning,
            "ScaleDownFailed",
            "ScaleDown",
            format!("drain ended {:?}; node uncordoned", r.outcome),
        )
        .await;
        if let Err(e) = crate::drain::uncordon(&self.client, node, false, SCALE_DOWN_LIFTER).await {
            warn!(node, error = %e, "cannot uncordon after a failed scale-down");
        }
        // Remember what the node held, so decide does not pick it again for the same
        // drain to fail the same way.
        let failed = match self.fingerprint(node).await {
            Ok(f) => Some(f),
            Err(e) => {
                warn!(node, error = %e, "cannot record the failed scale-down; the node may be picked again");
                None
            }
        };
        let annotations = json!({UNNEEDED_SINCE: None::<String>, SCALE_DOWN_FAILED: failed});
        self.write_annotations(node, annotations, "the record of the failed scale-down")
            .await;
    }

    /// Whether the Node was opted out of scale-down (`nodeward.io/scale-down-disabled`) since
    /// the snapshot its scale-down was decided on.
    pub(super) async fn opted_out(&self, node: &str) -> kube::Result<bool> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let n = nodes.get(node).await?;
        Ok(n.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(model::SCALE_DOWN_DISABLED))
            .is_some_and(|v| v == "true"))
    }

    /// Gives back a node opted out during its scale-down: nodeward's cordon lifted (never an
    /// administrator's), its unneeded record cleared, an Event saying so.
    pub(super) async fn cancel_scale_down(&self, group: &str, node: &str) {
        info!(
            group,
            node, "scale-down cancelled: the node was opted out since it began"
        );
        if let Err(e) = crate::drain::uncordon(&self.client, node, false, SCALE_DOWN_LIFTER).await {
            warn!(node, error = %e, "cannot uncordon the opted-out node; the next pass retries");
            return;
        }
        self.annotate(node, None).await;
        self.event(
            &node_ref(node),
            EventType::Normal,
            "ScaleDownCancelled",
            "ScaleDown",
            format!(
                "{} is set: nodeward scaler stopped scaling this node down and uncordoned it",
                model::SCALE_DOWN_DISABLED
            ),
        )
        .await;
    }
}
