//! What the scaler says: its log, Events, metrics and the status ConfigMap.

use super::*;

/// The status ConfigMap's `status` key, as YAML.
#[derive(Debug, serde::Serialize)]
pub(super) struct StatusDoc<'a> {
    pub(super) time: String,
    pub(super) leader: &'a str,
    /// Set while the cluster-health guard holds: what it holds back and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) guard: Option<String>,
    pub(super) pending_unschedulable_pods: usize,
    pub(super) groups: BTreeMap<&'a str, GroupStatus>,
    /// The pass's actions but [`Action::NoScaleUp`], at most [`STATUS_ACTIONS`], each in the
    /// shape [`Action`] documents.
    pub(super) last_actions: Vec<&'a Action>,
}

/// One group in [`StatusDoc`].
#[derive(Debug, serde::Serialize)]
pub(super) struct GroupStatus {
    pub(super) size: u32,
    pub(super) ready: u32,
    pub(super) booting: u32,
    pub(super) registering: u32,
    pub(super) min: u32,
    pub(super) max: u32,
    pub(super) backoff_until: Option<String>,
}

/// One line for the guard's status, Event and log.
pub(super) fn guard_note(group: Option<&str>, unready: u32, total: u32, held: u32) -> String {
    match group {
        None => format!(
            "{unready} of {total} nodes NotReady, more than the cluster-health guard tolerates \
             (max_unready_percent, ok_unready_count): taken for a partition or an API server \
             outage, not broken machines; {held} repairs held back, no scale-down until fewer \
             are NotReady"
        ),
        Some(g) => format!(
            "{unready} of node group {g}'s {total} nodes NotReady, more than its guard tolerates \
             (max_unready_group_percent): taken for a fault of the group, not broken machines; \
             {held} of its repairs held back until fewer are NotReady"
        ),
    }
}

pub(super) fn log_action(a: &Action, dry_run: bool) {
    match a {
        Action::ClusterShutdown { .. } | Action::StaleClusterShutdown { .. } => {
            log_cluster_shutdown(a, dry_run);
        }
        Action::GuardHolds {
            group,
            unready,
            total,
            held,
        } => warn!(
            dry_run,
            "{}",
            guard_note(group.as_deref(), *unready, *total, *held)
        ),
        Action::ScaleUp {
            group,
            count,
            reason,
            pods,
        } => {
            info!(dry_run, group, count, reason = ?reason, pods = pods.len(), "decision: scale up");
        }
        Action::NoScaleUp { pod, reason } => {
            debug!(dry_run, pod, reason, "decision: no scale-up for pod")
        }
        Action::MarkUnneeded { node, since } => {
            info!(dry_run, node, %since, "decision: node unneeded")
        }
        Action::ClearUnneeded { node } => info!(dry_run, node, "decision: node needed again"),
        Action::ScaleDown {
            group,
            node,
            machine,
            empty,
        } => {
            info!(dry_run, group, node, machine, empty, "decision: scale down");
        }
        Action::Repair {
            group,
            machine,
            node,
            reason,
        } => {
            warn!(dry_run, group, machine, node, %reason, "decision: delete broken machine");
        }
        Action::BackOff {
            group,
            failures,
            until,
        } => {
            warn!(dry_run, group, failures, %until, "decision: group backs off");
        }
        Action::ClearBackOff { group } => info!(dry_run, group, "decision: back-off cleared"),
        Action::CancelScaleDown { group, node } => {
            info!(
                dry_run,
                group, node, "decision: cancel the scale-down of an opted-out node"
            )
        }
        Action::DeleteNode {
            group,
            node,
            reason,
        } => {
            info!(dry_run, group, node, %reason, "decision: delete a Node whose machine is gone")
        }
    }
}

/// [`log_action`] for a recorded cluster shutdown, obeyed or stale.
pub(super) fn log_cluster_shutdown(a: &Action, dry_run: bool) {
    let (requested_by, started_at, what) = match a {
        Action::ClusterShutdown {
            requested_by,
            started_at,
        } => (
            requested_by,
            started_at,
            "a cluster shutdown is recorded: no scale-up, scale-down or repair until `nodeward cluster start`",
        ),
        Action::StaleClusterShutdown {
            requested_by,
            started_at,
        } => (
            requested_by,
            started_at,
            "a cluster shutdown is recorded but stale: no node holds its cordon any more (lifted by hand after an interrupted shutdown?); not obeyed: `nodeward cluster start` removes the record",
        ),
        _ => return,
    };
    warn!(dry_run, requested_by, started_at, "{what}");
}

/// The cluster shutdown's intent ConfigMap.
pub(super) fn intent_ref() -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: Some(crate::names::CLUSTER_SHUTDOWN_CONFIGMAP.into()),
        namespace: Some(crate::names::CLUSTER_SHUTDOWN_NAMESPACE.into()),
        ..ObjectReference::default()
    }
}

pub(super) fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.to_string()),
        ..ObjectReference::default()
    }
}

impl<P: Provider + 'static> Inner<P> {
    /// The cluster-health guard's Warning Event, on the status ConfigMap (the scaler's own
    /// object: the guard is about the cluster, not one Node).
    pub(super) async fn guard_event(&self, note: String) {
        let status = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            namespace: Some(self.settings.namespace.clone()),
            name: Some(STATUS_CONFIGMAP.into()),
            ..ObjectReference::default()
        };
        self.event(
            &status,
            EventType::Warning,
            "ClusterUnhealthy",
            "Repair",
            note,
        )
        .await;
    }

    /// A Warning Event on the cluster shutdown's ConfigMap: its record is stale, not obeyed.
    pub(super) async fn say_stale_intent(&self, requested_by: &str, started_at: &str) {
        let note = format!(
            "the cluster shutdown recorded by {requested_by} at {started_at} is stale: no node holds its cordon any more; not obeyed (the scaler acts, shutdown drains wait on budgets); `nodeward cluster start` removes the record"
        );
        let reason = "ClusterShutdownStale";
        self.event(&intent_ref(), EventType::Warning, reason, "Ignore", note)
            .await;
    }

    /// The pass's figures: pending pods, each group's size, whether the guard holds.
    pub(super) fn export(
        &self,
        states: &BTreeMap<String, decide::GroupState>,
        pending: usize,
        actions: &[Action],
    ) {
        self.metrics
            .pending_pods
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
        for (g, st) in states {
            self.metrics
                .group_size
                .get_or_create(&metrics::group(g))
                .set(i64::from(st.size));
        }
        let holding = actions
            .iter()
            .any(|a| matches!(a, Action::GuardHolds { .. }));
        self.metrics.guard_holding.set(i64::from(holding));
        let stale = actions
            .iter()
            .any(|a| matches!(a, Action::StaleClusterShutdown { .. }));
        self.metrics.cluster_shutdown_stale.set(i64::from(stale));
    }

    /// Writes the pass's status and the groups' back-off to the status ConfigMap, where
    /// readers and the next pass (this leader's or another's) find them.
    pub(super) async fn write_status(
        &self,
        now: Timestamp,
        states: &BTreeMap<String, GroupState>,
        backoff: &BTreeMap<String, Backoff>,
        guard_held: &BTreeMap<String, Timestamp>,
        pending: usize,
        actions: &[Action],
    ) {
        let doc = self.status_doc(now, states, backoff, pending, actions);
        let text = match serde_norway::to_string(&doc) {
            Ok(t) => t,
            Err(e) => {
                warn!(error = %e, "cannot write the status as YAML");
                return;
            }
        };
        let data = json!({
            "status": text,
            "backoff": serde_json::to_string(backoff).unwrap_or_default(),
            "guard_held": serde_json::to_string(guard_held).unwrap_or_default(),
        });
        self.put_status(data).await;
    }

    /// The pass as the status shows it: leader, guard, pending pods, each configured group's
    /// size, bounds and back-off, and the actions worth listing.
    pub(super) fn status_doc<'a>(
        &'a self,
        now: Timestamp,
        states: &BTreeMap<String, GroupState>,
        backoff: &BTreeMap<String, Backoff>,
        pending: usize,
        actions: &'a [Action],
    ) -> StatusDoc<'a> {
        StatusDoc {
            time: now.to_string(),
            leader: &self.opts.identity,
            guard: actions.iter().find_map(|a| match a {
                Action::GuardHolds {
                    group,
                    unready,
                    total,
                    held,
                } => Some(guard_note(group.as_deref(), *unready, *total, *held)),
                _ => None,
            }),
            pending_unschedulable_pods: pending,
            groups: self
                .settings
                .groups
                .iter()
                .map(|g| {
                    let st = states.get(&g.name).cloned().unwrap_or_default();
                    let status = GroupStatus {
                        size: st.size,
                        ready: st.ready,
                        booting: st.booting,
                        registering: st.registering,
                        min: g.min,
                        max: g.max,
                        backoff_until: backoff
                            .get(&g.name)
                            .and_then(|b| b.until)
                            .map(|u| u.to_string()),
                    };
                    (g.name.as_str(), status)
                })
                .collect(),
            last_actions: actions
                .iter()
                .filter(|a| !matches!(a, Action::NoScaleUp { .. }))
                .take(STATUS_ACTIONS)
                .collect(),
        }
    }

    /// Merges `data` into the status ConfigMap, creating it if it is not there yet; a failure
    /// is logged and the next pass writes again.
    pub(super) async fn put_status(&self, data: serde_json::Value) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        let patch = json!({"data": data});
        match api
            .patch(
                STATUS_CONFIGMAP,
                &crate::node_write::patch_params(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {
                let cm: ConfigMap = match serde_json::from_value(json!({
                    "metadata": {"name": STATUS_CONFIGMAP, "namespace": self.settings.namespace},
                    "data": data,
                })) {
                    Ok(cm) => cm,
                    Err(e) => {
                        warn!(error = %e, "cannot build the status ConfigMap");
                        return;
                    }
                };
                if let Err(e) = api.create(&PostParams::default(), &cm).await {
                    warn!(error = %e, "cannot create the status ConfigMap");
                }
            }
            Err(e) => warn!(error = %e, "cannot write the status ConfigMap"),
        }
    }
}
