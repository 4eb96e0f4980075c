//! The watches that feed the drain's loop (the node's pods, the budgets, the DaemonSets' names,
//! the evidence of [`crate::drain::evidence`]) and the view of them the schedule asks
//! ([`BudgetView`]).

use super::*;

/// The `disruptionsAllowed` of the budget `key` (`namespace/name`) in the drain's view.
pub(super) fn allowed_in(
    budgets: &[std::sync::Arc<PodDisruptionBudget>],
    key: &str,
) -> Option<i32> {
    budgets
        .iter()
        .find(|b| plan::budget_key(b) == key)
        .and_then(|b| b.status.as_ref())
        .map(|s| s.disruptions_allowed)
}

/// Whether a budget among `budgets` selecting the pod allows a disruption now.
pub(super) fn budget_open(budgets: &[std::sync::Arc<PodDisruptionBudget>], pod: &Tracked) -> bool {
    plan::budgets_for(
        &pod.pod.namespace,
        &pod.labels,
        budgets.iter().map(AsRef::as_ref),
    )
    .iter()
    .any(|b| b.status.as_ref().is_some_and(|s| s.disruptions_allowed > 0))
}

/// The schedule's questions about budgets, answered from one snapshot of the drain's watches.
pub(super) struct BudgetView<'a> {
    /// The budgets.
    pub(super) budgets: &'a [std::sync::Arc<PodDisruptionBudget>],
    /// The cluster's Pending pods, once a budget blocked a pod ([`Evidence`]).
    pub(super) pending: &'a [std::sync::Arc<Pod>],
    /// Every Node, once listed.
    pub(super) nodes: Option<&'a [std::sync::Arc<Node>]>,
    /// The node drained.
    pub(super) node: &'a str,
    /// [`DrainOptions::cluster_shutdown`].
    pub(super) cluster_shutdown: bool,
    /// What the owner of each blocked pod (by UID) wants.
    pub(super) wanted: &'a BTreeMap<String, Wanted>,
    /// Whether an autoscaler may add a node.
    pub(super) autoscaler: Autoscaler,
}

impl crate::drain::step::Budgets for BudgetView<'_> {
    fn open(&self, t: &Tracked) -> bool {
        budget_open(self.budgets, t)
    }
    fn unsatisfiable(&self, t: &Tracked) -> Option<crate::drain::unsatisfiable::Why> {
        if self.cluster_shutdown {
            return Some(crate::drain::unsatisfiable::Why::ClusterShutdown);
        }
        plan::budgets_for(
            &t.pod.namespace,
            &t.labels,
            self.budgets.iter().map(AsRef::as_ref),
        )
        .into_iter()
        .find_map(|b| {
            crate::drain::unsatisfiable::judge(
                b,
                self.pending.iter().map(AsRef::as_ref),
                self.nodes,
                self.node,
                self.wanted
                    .get(&t.pod.uid)
                    .copied()
                    .unwrap_or(Wanted::Unknown),
                self.autoscaler,
            )
        })
    }
    fn of(&self, t: &Tracked) -> Vec<String> {
        plan::budgets_for(
            &t.pod.namespace,
            &t.labels,
            self.budgets.iter().map(AsRef::as_ref),
        )
        .into_iter()
        .map(plan::budget_key)
        .collect()
    }
}

/// How long the drain's start waits for the budgets' list once the pods are listed.
pub(super) const BUDGET_LIST_GRACE: Duration = Duration::from_millis(250);

/// Whether the DaemonSet `namespace/name` is in the drain's watch cache.
pub(super) fn daemonset_in(
    daemonsets: &Mirror<PartialObjectMeta<DaemonSet>>,
) -> impl Fn(&str, &str) -> bool {
    move |namespace, name| daemonsets.get(name, Some(namespace)).is_some()
}

/// The drain's three watches and what they have delivered: the node's pods (how the drain
/// learns a pod is really gone), the budgets (when to retry a blocked eviction) and the
/// DaemonSets' names (whether a DaemonSet pod's DaemonSet still exists).
pub(super) struct Watches<'a> {
    pub(super) pod_events: BoxStream<'a, watcher::Result<watcher::Event<Pod>>>,
    pub(super) pdb_events: BoxStream<'a, watcher::Result<watcher::Event<PodDisruptionBudget>>>,
    pub(super) ds_events:
        BoxStream<'a, watcher::Result<watcher::Event<PartialObjectMeta<DaemonSet>>>>,
    pub(super) pods: Mirror<Pod>,
    pub(super) budgets: Mirror<PodDisruptionBudget>,
    pub(super) daemonsets: Mirror<PartialObjectMeta<DaemonSet>>,
    pub(super) evidence: Evidence<'a>,
}

/// One step's view of the watches, from which [`BudgetView`] answers.
pub(super) struct Snapshot {
    pub(super) budgets: Vec<std::sync::Arc<PodDisruptionBudget>>,
    pub(super) pending: Vec<std::sync::Arc<Pod>>,
    pub(super) nodes: Option<Vec<std::sync::Arc<Node>>>,
    pub(super) wanted: BTreeMap<String, Wanted>,
    pub(super) autoscaler: Autoscaler,
}

impl Snapshot {
    pub(super) fn view<'a>(&'a self, node: &'a str, cluster_shutdown: bool) -> BudgetView<'a> {
        BudgetView {
            budgets: &self.budgets,
            pending: &self.pending,
            nodes: self.nodes.as_deref(),
            node,
            cluster_shutdown,
            wanted: &self.wanted,
            autoscaler: self.autoscaler,
        }
    }
}

impl Watches<'_> {
    pub(super) fn start(client: &Client, node: &str) -> Self {
        let pods_api: Api<Pod> = Api::all(client.clone());
        let pod_events = watcher(
            pods_api,
            watcher::Config::default().fields(&format!("spec.nodeName={node}")),
        )
        .default_backoff()
        .boxed();
        let pdb_api: Api<PodDisruptionBudget> = Api::all(client.clone());
        let pdb_events = watcher(pdb_api, watcher::Config::default())
            .default_backoff()
            .boxed();
        // Only names matter (does a pod's DaemonSet still exist?): metadata, not whole objects.
        let ds_api: Api<PartialObjectMeta<DaemonSet>> = Api::all(client.clone());
        let ds_events = watcher(ds_api, watcher::Config::default())
            .default_backoff()
            .boxed();
        Self {
            pod_events,
            pdb_events,
            ds_events,
            pods: Mirror::default(),
            budgets: Mirror::default(),
            daemonsets: Mirror::default(),
            evidence: Evidence::idle(),
        }
    }

    /// This step's view; the evidence watches start with the first pod a budget blocks, and the
    /// count of each blocked pod's owner is read while it is blocked.
    pub(super) fn snapshot(&mut self, schedule: &Schedule, client: &Client) -> Snapshot {
        let blocked: Vec<_> = schedule
            .tracked()
            .filter(|t| matches!(t.state, PodState::Blocked { .. }))
            .filter_map(|t| self.pods.get(&t.pod.name, Some(&t.pod.namespace)))
            .collect();
        if !blocked.is_empty() {
            self.evidence.start(client);
        }
        let now = Instant::now();
        let mut wanted = BTreeMap::new();
        for pod in blocked {
            if let Some(owner) = Owner::of(&pod) {
                self.evidence.ask(owner, client, now);
            }
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            wanted.insert(uid, self.evidence.wanted(&pod));
        }
        Snapshot {
            wanted,
            autoscaler: self.evidence.autoscaler,
            budgets: self.budgets.state(),
            pending: self.evidence.pending.state(),
            nodes: self
                .evidence
                .nodes
                .synced()
                .then(|| self.evidence.nodes.state()),
        }
    }

    /// Waits for the pods' and DaemonSets' initial lists before anything is planned (a
    /// DaemonSet pod is skipped only if its DaemonSet exists). Budgets only time the retries of
    /// a refused eviction (the Eviction API itself enforces them), so evictions do not wait for
    /// their list; the main loop keeps applying their events.
    pub(super) async fn initial_lists(
        &mut self,
        node: &str,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<()> {
        let mut last_error = String::from("no answer");
        while !self.pods.synced() || !self.daemonsets.synced() {
            tokio::select! {
                Some(ev) = self.pod_events.next() => match ev {
                    Ok(ev) => self.pods.apply(&ev),
                    Err(e) => {
                        check_watch_error(node, &e, "list and watch pods")?;
                        last_error = e.to_string();
                    }
                },
                Some(ev) = self.ds_events.next() => match ev {
                    Ok(ev) => self.daemonsets.apply(&ev),
                    Err(e) => {
                        check_watch_error(node, &e, "list and watch daemonsets")?;
                        last_error = e.to_string();
                    }
                },
                Some(ev) = self.pdb_events.next() => match ev {
                    Ok(ev) => self.budgets.apply(&ev),
                    Err(e) => check_watch_error(node, &e, "list and watch poddisruptionbudgets")?,
                },
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(Error::PodsNotListed {
                        node: node.to_string(),
                        waited: timeout,
                        last_error,
                    });
                }
            }
        }
        self.budgets_listed(node, deadline).await
    }

    /// Waits a moment for the budgets' list, if it is not in yet: with it, the first evictions
    /// already go one per budget (see `step::Budgets::of`). Never needed for safety (the API
    /// server enforces every budget), so never longer than [`BUDGET_LIST_GRACE`].
    pub(super) async fn budgets_listed(&mut self, node: &str, deadline: Instant) -> Result<()> {
        let until = deadline.min(later(Instant::now(), BUDGET_LIST_GRACE));
        while !self.budgets.synced() {
            tokio::select! {
                Some(ev) = self.pdb_events.next() => match ev {
                    Ok(ev) => self.budgets.apply(&ev),
                    Err(e) => check_watch_error(node, &e, "list and watch poddisruptionbudgets")?,
                },
                _ = tokio::time::sleep_until(until) => break,
            }
        }
        Ok(())
    }
}

/// A 403 on a watch the drain needs is a missing permission: say which, and stop. Any other
/// error is logged; the watcher relists with back-off.
pub(super) fn check_watch_error(node: &str, e: &watcher::Error, verb: &'static str) -> Result<()> {
    let forbidden = matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) | watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 403);
    if forbidden {
        warn!(node, "missing permission: {verb}");
        return Err(Error::Forbidden { verb, pod: None });
    }
    warn!(node, error = %e, "watch failed; the watcher relists");
    Ok(())
}
