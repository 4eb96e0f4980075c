//! Cordon and uncordon, with nodeward's record of who cordoned and why ([`crate::drain::cordon`]
//! decides; this writes, guarded by the Node's resourceVersion).

use super::*;

/// Whether a cordon was done now or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CordonOutcome {
    /// nodeward cordoned the node now.
    Cordoned,
    /// nodeward had cordoned it before.
    AlreadyOurs,
    /// Someone else had cordoned it; their cordon stays theirs.
    AlreadyByOther,
    /// nodeward had cordoned it for another reason; the cordon is now this one's, and goes back
    /// to that reason when this one is lifted ([`cordon::take_over`]).
    TakenOver {
        /// The earlier reason.
        from: String,
    },
}

/// What an uncordon did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UncordonOutcome {
    /// The cordon was lifted.
    Uncordoned,
    /// It was not cordoned.
    NotCordoned,
    /// nodeward's cordon for another moment: it stays (the lifter did not make it).
    Kept {
        /// The reason its record gives.
        reason: String,
    },
    /// This moment's cordon had taken over an earlier one of nodeward's: given back to it, the
    /// node still cordoned.
    GivenBack {
        /// The earlier reason, now the cordon's again.
        reason: String,
    },
}

pub(super) fn api_err<'n>(
    node: &'n str,
    action: &'static str,
) -> impl FnOnce(kube::Error) -> Error + 'n {
    move |source| match &source {
        kube::Error::Api(s) if s.code == 404 => Error::NodeNotFound {
            node: node.to_string(),
        },
        _ => Error::Api {
            node: node.to_string(),
            action,
            source,
        },
    }
}

/// Cordons `node`, recording nodeward's ownership; leaves a cordon by someone else as it is.
pub async fn cordon(
    client: &Client,
    node: &str,
    reason: &str,
    exclude_lb: bool,
) -> Result<CordonOutcome> {
    cordon_recorded(client, node, reason, exclude_lb, Kind::Plain).await
}

/// [`cordon`] for a moment that must own the cordon until it lifts it (a cluster shutdown): a
/// cordon nodeward made for another reason is taken over ([`CordonOutcome::TakenOver`]).
pub async fn cordon_taking_over(
    client: &Client,
    node: &str,
    reason: &str,
) -> Result<CordonOutcome> {
    cordon_recorded(client, node, reason, false, Kind::TakeOver).await
}

/// What a cordon is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A plain one.
    Plain,
    /// Because the machine is shutting down.
    Shutdown,
    /// Taking over nodeward's cordon for another reason.
    TakeOver,
}

/// [`cordon`] because the machine is shutting down: recorded as a shutdown cordon, which the
/// agent lifts once the node is back and its gates pass.
pub async fn cordon_for_shutdown(
    client: &Client,
    node: &str,
    reason: &str,
    exclude_lb: bool,
) -> Result<CordonOutcome> {
    cordon_recorded(client, node, reason, exclude_lb, Kind::Shutdown).await
}

/// [`node_write::write_guarded`] with this module's errors.
pub(super) async fn write_node_guarded<T: std::fmt::Debug>(
    client: &Client,
    node: &str,
    action: &'static str,
    decide: impl Fn(&Node) -> Result<NodeWrite<T>>,
) -> Result<T> {
    match node_write::write_guarded(client, node, action, None, decide).await {
        Ok((_, outcome)) => {
            info!(node, action, ?outcome, "node written");
            Ok(outcome)
        }
        Err(WriteError::Refused(e)) => Err(e),
        Err(WriteError::Api { action, source }) => Err(api_err(node, action)(source)),
        Err(WriteError::Conflict) => Err(Error::Conflict {
            node: node.to_string(),
            attempts: node_write::ATTEMPTS,
        }),
    }
}

/// [`cordon`], recording what the cordon is for.
pub(super) async fn cordon_recorded(
    client: &Client,
    node: &str,
    reason: &str,
    exclude_lb: bool,
    kind: Kind,
) -> Result<CordonOutcome> {
    write_node_guarded(client, node, "cordon", |current| {
        match cordon::cordon_decision(current) {
            CordonDecision::AlreadyOurs if kind == Kind::TakeOver => {
                let now = jiff::Timestamp::now().to_string();
                let Some(record) = cordon::take_over(current, reason, &now) else {
                    return Ok(NodeWrite::Done(CordonOutcome::AlreadyOurs));
                };
                let from = record
                    .before
                    .as_ref()
                    .map(|b| b.reason.clone())
                    .unwrap_or_default();
                let text = serde_json::to_string(&record).unwrap_or_default();
                let patch = json!({"metadata": {"annotations": {CORDONED_BY: text}}});
                return Ok(NodeWrite::Patch(patch, CordonOutcome::TakenOver { from }));
            }
            CordonDecision::AlreadyOurs => return Ok(NodeWrite::Done(CordonOutcome::AlreadyOurs)),
            CordonDecision::AlreadyByOther => {
                info!(
                    node,
                    "node was already cordoned by someone else; leaving their cordon as it is"
                );
                return Ok(NodeWrite::Done(CordonOutcome::AlreadyByOther));
            }
            CordonDecision::Cordon => {}
        }
        let had_lb_label = current
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(EXCLUDE_LB_LABEL));
        let add_lb = exclude_lb && !had_lb_label;
        let record = CordonRecord {
            reason: reason.to_string(),
            at: jiff::Timestamp::now().to_string(),
            excluded_from_lb: add_lb,
            shutdown: kind == Kind::Shutdown,
            before: None,
        };
        let mut patch = json!({
            "metadata": {
                "annotations": {CORDONED_BY: serde_json::to_string(&record).unwrap_or_default()},
            },
            "spec": {"unschedulable": true},
        });
        if add_lb {
            patch["metadata"]["labels"] = json!({EXCLUDE_LB_LABEL: "true"});
        }
        Ok(NodeWrite::Patch(patch, CordonOutcome::Cordoned))
    })
    .await
}

/// Lifts nodeward's own cordon if `by` made it ([`cordon::uncordon_decision`]): another
/// moment's stays ([`UncordonOutcome::Kept`]), one this moment took over goes back to its
/// earlier reason ([`UncordonOutcome::GivenBack`]); refuses someone else's unless `force`.
pub async fn uncordon(
    client: &Client,
    node: &str,
    force: bool,
    by: Lifter<'_>,
) -> Result<UncordonOutcome> {
    write_node_guarded(client, node, "uncordon", |current| {
        let mut patch = json!({"metadata": {"annotations": {CORDONED_BY: null}}});
        Ok(match cordon::uncordon_decision(current, force, by) {
            UncordonDecision::Kept { reason } => NodeWrite::Done(UncordonOutcome::Kept { reason }),
            UncordonDecision::GiveBack { to } => {
                let reason = to.reason.clone();
                let text = serde_json::to_string(&to).unwrap_or_default();
                patch["metadata"]["annotations"][CORDONED_BY] = json!(text);
                NodeWrite::Patch(patch, UncordonOutcome::GivenBack { reason })
            }
            UncordonDecision::ByOther { who } => {
                return Err(Error::CordonedByOther {
                    node: node.to_string(),
                    who,
                });
            }
            UncordonDecision::NotCordoned {
                stale_record: false,
            } => NodeWrite::Done(UncordonOutcome::NotCordoned),
            UncordonDecision::NotCordoned { stale_record: true } => {
                NodeWrite::Patch(patch, UncordonOutcome::NotCordoned)
            }
            UncordonDecision::Uncordon { remove_lb_label } => {
                patch["spec"] = json!({"unschedulable": null});
                if remove_lb_label {
                    patch["metadata"]["labels"] = json!({EXCLUDE_LB_LABEL: null});
                }
                NodeWrite::Patch(patch, UncordonOutcome::Uncordoned)
            }
        })
    })
    .await
}
