//! Who cordoned a node, decided purely from the Node object.
//!
//! Kubernetes records who set `spec.unschedulable` only as field ownership (the Node's
//! managedFields), not why or for what. So nodeward records its own cordons in the annotation
//! `nodeward.io/cordoned-by` (JSON: reason, time, whether it also added the load-balancer
//! exclusion label), and [`nodeward_cordon`] counts that record only while nodeward's field
//! manager owns `spec.unschedulable`: `kubectl uncordon` removes the field but leaves the
//! annotation, and a later `kubectl cordon` (field manager `kubectl-cordon`) must not read as
//! nodeward's. Only nodeward's cordon is ever undone automatically: anyone else's is theirs to
//! lift.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde::{Deserialize, Serialize};

pub use crate::names::CORDONED_BY;
use crate::names::FIELD_MANAGER;
/// The label that makes cloud load balancers stop sending traffic to a node.
pub const EXCLUDE_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// What nodeward writes into [`CORDONED_BY`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CordonRecord {
    /// Why (e.g. "shutdown (poweroff)", "drain by operator").
    pub reason: String,
    /// RFC 3339 time of the cordon.
    pub at: String,
    /// nodeward added [`EXCLUDE_LB_LABEL`] and must remove it when uncordoning.
    #[serde(default)]
    pub excluded_from_lb: bool,
    /// The cordon was made because the machine was shutting down. Only such a cordon is lifted
    /// by the agent once the node is back and its readiness gates pass; a drain an operator
    /// asked for (`systemctl stop nodeward-drain`, `nodeward drain`) stays until they lift it.
    #[serde(default)]
    pub shutdown: bool,
    /// The record of the nodeward cordon this one took over (a cluster shutdown meeting a node
    /// cordoned for maintenance): the lifting moment gives the cordon back to it rather than
    /// lifting it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<Box<CordonRecord>>,
}

/// Who is lifting a cordon: each moment lifts only the cordons it made ([`CordonRecord::is_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifter<'a> {
    /// An operator's `nodeward uncordon`: any of nodeward's cordons.
    Operator,
    /// The agent once the node is back from a shutdown: a cordon made because the machine was
    /// shutting down.
    Shutdown,
    /// The moment whose cordons carry this reason: a reboot's, a scale-down's, a cluster
    /// shutdown's.
    Reason(&'a str),
}

impl CordonRecord {
    /// The one answer to "did this moment make this cordon".
    pub fn is_for(&self, by: Lifter<'_>) -> bool {
        match by {
            Lifter::Operator => true,
            Lifter::Shutdown => self.shutdown,
            Lifter::Reason(r) => self.reason == r,
        }
    }
}

/// Whether the node is cordoned.
pub fn is_cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// The one answer to "is this cordon nodeward's": its record, when the node is cordoned, the
/// record parses, and nodeward's field manager alone owns `spec.unschedulable` (its own write
/// set the field and no one has set or removed it since). Otherwise the record, if any, is
/// stale (left by `kubectl uncordon`) or hand-edited, and never a reason to uncordon or to
/// finish a scale-down.
pub fn nodeward_cordon(node: &Node) -> Option<CordonRecord> {
    let owners = unschedulable_owners(node);
    let ours = is_cordoned(node)
        && !owners.is_empty()
        && owners
            .iter()
            .all(|e| e.manager.as_deref() == Some(FIELD_MANAGER));
    ours.then(|| record(node)).flatten()
}

/// The record on the node, whoever's the cordon is now (a malformed record counts as none).
fn record(node: &Node) -> Option<CordonRecord> {
    node.metadata
        .annotations
        .as_ref()?
        .get(CORDONED_BY)
        .and_then(|v| serde_json::from_str(v).ok())
}

/// The managedFields entries that own `spec.unschedulable`.
fn unschedulable_owners(node: &Node) -> Vec<&ManagedFieldsEntry> {
    node.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|mf| {
            mf.fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:spec"))
                .and_then(|s| s.get("f:unschedulable"))
                .is_some()
        })
        .collect()
}

/// What to do when asked to cordon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CordonDecision {
    /// Not cordoned: cordon and record it.
    Cordon,
    /// nodeward cordoned it already.
    AlreadyOurs,
    /// Someone else cordoned it; leave their cordon (and its ownership) alone.
    AlreadyByOther,
}

/// Decides a cordon.
pub fn cordon_decision(node: &Node) -> CordonDecision {
    match (is_cordoned(node), nodeward_cordon(node).is_some()) {
        (false, _) => CordonDecision::Cordon,
        (true, true) => CordonDecision::AlreadyOurs,
        (true, false) => CordonDecision::AlreadyByOther,
    }
}

/// The record with which a moment cordoning for `reason` takes over nodeward's cordon made for
/// another reason, so that nothing lifts it before that moment does (and that moment then gives
/// it back: [`UncordonDecision::GiveBack`]). `None` when the cordon is not nodeward's or is
/// already for `reason`.
pub fn take_over(node: &Node, reason: &str, at: &str) -> Option<CordonRecord> {
    let current = nodeward_cordon(node)?;
    (current.reason != reason).then(|| CordonRecord {
        reason: reason.to_string(),
        at: at.to_string(),
        excluded_from_lb: current.excluded_from_lb,
        shutdown: false,
        before: Some(Box::new(current)),
    })
}

/// What to do when asked to uncordon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UncordonDecision {
    /// Lift the cordon and remove the record (and the LB label if nodeward added it).
    Uncordon {
        /// Remove [`EXCLUDE_LB_LABEL`] too.
        remove_lb_label: bool,
    },
    /// nodeward's cordon, made by another moment than the lifter: it stays.
    Kept {
        /// The reason its record gives.
        reason: String,
    },
    /// The lifter's cordon, which took over an earlier one of nodeward's: that one's record
    /// goes back on, and the node stays cordoned.
    GiveBack {
        /// The earlier record.
        to: CordonRecord,
    },
    /// Not cordoned; only a stale record (if any) to clean up.
    NotCordoned {
        /// A record is present and should be removed.
        stale_record: bool,
    },
    /// Cordoned by someone else; refuse (unless forced).
    ByOther {
        /// Who, if the node's managedFields tell (the field manager that set unschedulable).
        who: Option<String>,
    },
}

/// Decides an uncordon by `by`. `force` lifts any cordon, someone else's too.
pub fn uncordon_decision(node: &Node, force: bool, by: Lifter<'_>) -> UncordonDecision {
    if !is_cordoned(node) {
        return UncordonDecision::NotCordoned {
            stale_record: record(node).is_some(),
        };
    }
    match nodeward_cordon(node) {
        Some(r) if !force && !r.is_for(by) => UncordonDecision::Kept { reason: r.reason },
        Some(CordonRecord {
            before: Some(to), ..
        }) if !force && by != Lifter::Operator => UncordonDecision::GiveBack { to: *to },
        Some(r) => UncordonDecision::Uncordon {
            remove_lb_label: r.excluded_from_lb,
        },
        None if force => UncordonDecision::Uncordon {
            remove_lb_label: false,
        },
        None => UncordonDecision::ByOther {
            who: cordoned_by_manager(node),
        },
    }
}

/// The field manager that owns `spec.unschedulable`, from managedFields (`kubectl-cordon`,
/// `kubectl`, a controller's name).
pub fn cordoned_by_manager(node: &Node) -> Option<String> {
    unschedulable_owners(node).first().map(|mf| {
        let when = mf
            .time
            .as_ref()
            .map(|t| format!(" at {}", t.0))
            .unwrap_or_default();
        format!(
            "{}{when}",
            mf.manager.as_deref().unwrap_or("an unnamed field manager")
        )
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A node as nodeward's own write left it: its field manager owns `spec.unschedulable`.
    fn node(unschedulable: bool, annotation: Option<&str>) -> Node {
        owned(unschedulable, annotation, &[FIELD_MANAGER])
    }

    fn bare(unschedulable: bool, annotation: Option<&str>) -> Node {
        let mut v = json!({"metadata": {"name": "n"}, "spec": {"unschedulable": unschedulable}});
        if let Some(a) = annotation {
            v["metadata"]["annotations"] = json!({CORDONED_BY: a});
        }
        serde_json::from_value(v).expect("node")
    }

    const OURS: &str =
        r#"{"reason":"shutdown","at":"2026-01-01T00:00:00Z","excluded_from_lb":true}"#;

    #[test]
    fn cordon_decisions() {
        assert_eq!(cordon_decision(&node(false, None)), CordonDecision::Cordon);
        assert_eq!(
            cordon_decision(&node(false, Some(OURS))),
            CordonDecision::Cordon
        );
        assert_eq!(
            cordon_decision(&node(true, Some(OURS))),
            CordonDecision::AlreadyOurs
        );
        assert_eq!(
            cordon_decision(&node(true, None)),
            CordonDecision::AlreadyByOther
        );
        assert_eq!(
            cordon_decision(&node(true, Some("garbage"))),
            CordonDecision::AlreadyByOther,
            "a malformed record is not ours"
        );
    }

    #[test]
    fn uncordon_decisions() {
        assert_eq!(
            uncordon_decision(&node(true, Some(OURS)), false, Lifter::Operator),
            UncordonDecision::Uncordon {
                remove_lb_label: true
            }
        );
        assert_eq!(
            uncordon_decision(&bare(true, None), false, Lifter::Operator),
            UncordonDecision::ByOther { who: None }
        );
        assert_eq!(
            uncordon_decision(&node(true, None), true, Lifter::Operator),
            UncordonDecision::Uncordon {
                remove_lb_label: false
            }
        );
        assert_eq!(
            uncordon_decision(&node(false, Some(OURS)), false, Lifter::Operator),
            UncordonDecision::NotCordoned { stale_record: true }
        );
        assert_eq!(
            uncordon_decision(&node(false, None), false, Lifter::Operator),
            UncordonDecision::NotCordoned {
                stale_record: false
            }
        );
    }

    /// A node as `owners` left it: each of them owns `spec.unschedulable` in managedFields.
    fn owned(unschedulable: bool, annotation: Option<&str>, owners: &[&str]) -> Node {
        let mut n = bare(unschedulable, annotation);
        let entries = owners
            .iter()
            .map(|m| {
                json!({"manager": m, "operation": "Update", "fieldsType": "FieldsV1",
                       "fieldsV1": {"f:spec": {"f:unschedulable": {}}}})
            })
            .chain([json!({"manager": "kubelet", "operation": "Update",
                           "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}})])
            .collect::<Vec<_>>();
        n.metadata.managed_fields = serde_json::from_value(json!(entries)).expect("managedFields");
        n
    }

    /// The record counts only while nodeward's field manager alone owns `spec.unschedulable`: a
    /// record `kubectl uncordon` left behind says nothing about a later `kubectl cordon`.
    #[test]
    fn cordon_is_ours_only_while_nodeward_owns_unschedulable() {
        let cases: [(&str, Node, bool); 8] = [
            (
                "nodeward's write",
                owned(true, Some(OURS), &["nodeward"]),
                true,
            ),
            (
                "kubectl cordon over a stale record",
                owned(true, Some(OURS), &["kubectl-cordon"]),
                false,
            ),
            (
                "shared with an applier",
                owned(true, Some(OURS), &["nodeward", "ops-apply"]),
                false,
            ),
            ("no owner known", owned(true, Some(OURS), &[]), false),
            (
                "nodeward owns it, no record",
                owned(true, None, &["nodeward"]),
                false,
            ),
            (
                "malformed record",
                owned(true, Some("garbage"), &["nodeward"]),
                false,
            ),
            (
                "not cordoned",
                owned(false, Some(OURS), &["nodeward"]),
                false,
            ),
            (
                "not cordoned, no owner",
                owned(false, Some(OURS), &[]),
                false,
            ),
        ];
        for (what, n, ours) in cases {
            let cordoned = is_cordoned(&n);
            let want = match (cordoned, ours) {
                (false, _) => CordonDecision::Cordon,
                (true, true) => CordonDecision::AlreadyOurs,
                (true, false) => CordonDecision::AlreadyByOther,
            };
            assert_eq!(cordon_decision(&n), want, "{what}");
            let lifts = matches!(
                uncordon_decision(&n, false, Lifter::Operator),
                UncordonDecision::Uncordon { .. }
            );
            assert_eq!(lifts, ours, "{what}");
        }
    }

    #[test]
    fn manager_of_unschedulable_is_named() {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "managedFields": [
                {"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}},
                {"manager": "kubectl-cordon", "operation": "Update", "fieldsType": "FieldsV1", "time": "2026-01-02T03:04:05Z",
                 "fieldsV1": {"f:spec": {"f:unschedulable": {}}}}
            ]},
            "spec": {"unschedulable": true}
        }))
        .expect("node");
        assert_eq!(
            uncordon_decision(&n, false, Lifter::Operator),
            UncordonDecision::ByOther {
                who: Some("kubectl-cordon at 2026-01-02T03:04:05Z".into())
            }
        );
    }

    fn with_record(r: &CordonRecord) -> Node {
        node(true, Some(&serde_json::to_string(r).expect("json")))
    }

    fn rec(reason: &str, shutdown: bool) -> CordonRecord {
        CordonRecord {
            reason: reason.into(),
            at: "2026-01-01T00:00:00Z".into(),
            excluded_from_lb: false,
            shutdown,
            before: None,
        }
    }

    /// Issue 58, item 2: each moment lifts only the cordons it made. A reboot's return does not
    /// lift an operator's `nodeward cordon --reason disk` or a cluster shutdown's; `cluster
    /// start` does not lift a maintenance cordon; the agent lifts only a shutdown's; an
    /// operator's `nodeward uncordon` lifts any of nodeward's.
    #[test]
    fn each_moment_lifts_only_its_own_cordon() {
        let reboot = Lifter::Reason("reboot");
        let cluster = Lifter::Reason("nodeward cluster shutdown");
        let kept = |r: &str| UncordonDecision::Kept { reason: r.into() };
        let lift = UncordonDecision::Uncordon {
            remove_lb_label: false,
        };
        let cases = [
            (
                "the reboot's own",
                rec("reboot", false),
                reboot,
                lift.clone(),
            ),
            (
                "an operator's, at the reboot's return",
                rec("disk", false),
                reboot,
                kept("disk"),
            ),
            (
                "a cluster shutdown's, at the reboot's return",
                rec("nodeward cluster shutdown", false),
                reboot,
                kept("nodeward cluster shutdown"),
            ),
            (
                "a maintenance cordon, at cluster start",
                rec("maint", false),
                cluster,
                kept("maint"),
            ),
            (
                "a shutdown's, by the agent",
                rec("shutdown (poweroff)", true),
                Lifter::Shutdown,
                lift.clone(),
            ),
            (
                "an operator's drain, by the agent",
                rec("drain by operator", false),
                Lifter::Shutdown,
                kept("drain by operator"),
            ),
            (
                "a reboot's, by the agent",
                rec("reboot", false),
                Lifter::Shutdown,
                kept("reboot"),
            ),
            (
                "anything of nodeward's, by the operator",
                rec("reboot", false),
                Lifter::Operator,
                lift.clone(),
            ),
        ];
        for (what, r, by, want) in cases {
            assert_eq!(
                uncordon_decision(&with_record(&r), false, by),
                want,
                "{what}"
            );
        }
        // --force lifts whatever it is.
        assert_eq!(
            uncordon_decision(&with_record(&rec("disk", false)), true, reboot),
            lift
        );
    }

    /// A cluster shutdown takes over a maintenance cordon of nodeward's (so nothing lifts it
    /// before `cluster start`), and `cluster start` gives it back instead of lifting it; an
    /// operator's uncordon lifts both.
    #[test]
    fn a_cordon_taken_over_is_given_back() {
        let reason = "nodeward cluster shutdown";
        let maint = CordonRecord {
            excluded_from_lb: true,
            ..rec("maint", false)
        };
        let n = with_record(&maint);
        let taken = take_over(&n, reason, "2026-02-02T00:00:00Z").expect("taken over");
        assert_eq!(taken.reason, reason);
        assert_eq!(taken.before.as_deref(), Some(&maint));
        assert!(
            taken.excluded_from_lb,
            "the label nodeward added goes with the last lift"
        );
        assert_eq!(
            take_over(&with_record(&taken), reason, "later"),
            None,
            "already the shutdown's"
        );
        assert_eq!(
            take_over(&bare(true, None), reason, "later"),
            None,
            "someone else's"
        );
        let n = with_record(&taken);
        assert_eq!(
            uncordon_decision(&n, false, Lifter::Reason(reason)),
            UncordonDecision::GiveBack { to: maint }
        );
        assert_eq!(
            uncordon_decision(&n, false, Lifter::Reason("reboot")),
            UncordonDecision::Kept {
                reason: reason.into()
            }
        );
        assert_eq!(
            uncordon_decision(&n, false, Lifter::Operator),
            UncordonDecision::Uncordon {
                remove_lb_label: true
            }
        );
    }
}
