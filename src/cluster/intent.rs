//! The intent ConfigMap's data, read and written purely: what phase the shutdown is in, who asked
//! and why, and which nodes nodeward cordoned for it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Where a cluster shutdown is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nodes cordoned (or being cordoned), workloads stopping.
    Stopping,
    /// Every workload that stops has stopped: safe to power off.
    Stopped,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
        })
    }
}

/// The keys of the ConfigMap's data.
pub mod keys {
    /// [`super::Phase`].
    pub const PHASE: &str = "phase";
    /// RFC 3339 time the shutdown started.
    pub const STARTED_AT: &str = "started-at";
    /// Who asked (the API server's name for the operator's identity).
    pub const REQUESTED_BY: &str = "requested-by";
    /// Why, as the operator said.
    pub const REASON: &str = "reason";
    /// JSON array of the nodes nodeward cordoned for this shutdown.
    pub const CORDONED: &str = "cordoned";
}

/// A cluster shutdown's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// Where it is.
    pub phase: Phase,
    /// RFC 3339 time it started.
    pub started_at: String,
    /// Who asked.
    pub requested_by: String,
    /// Why.
    pub reason: String,
    /// The nodes nodeward cordoned for it (and only those: `cluster start` lifts these).
    pub cordoned: BTreeSet<String>,
}

impl Intent {
    /// The ConfigMap's `data`.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (keys::PHASE.into(), self.phase.to_string()),
            (keys::STARTED_AT.into(), self.started_at.clone()),
            (keys::REQUESTED_BY.into(), self.requested_by.clone()),
            (keys::REASON.into(), self.reason.clone()),
            (
                keys::CORDONED.into(),
                serde_json::to_string(&self.cordoned).unwrap_or_else(|_| "[]".into()),
            ),
        ])
    }

    /// Reads a ConfigMap's `data`. A hand-edited record still counts as an intent (its existence
    /// is what agents and the scaler obey); what cannot be read is reported and defaulted: an
    /// unknown phase as [`Phase::Stopping`], an unreadable node list as empty.
    pub fn from_data(data: &BTreeMap<String, String>) -> (Self, Vec<String>) {
        let mut problems = Vec::new();
        let text = |k: &str| data.get(k).cloned().unwrap_or_default();
        let phase = match data.get(keys::PHASE).map(String::as_str) {
            Some("stopped") => Phase::Stopped,
            Some("stopping") => Phase::Stopping,
            other => {
                problems.push(format!(
                    "{}: {other:?} is not stopping or stopped; taken as stopping",
                    keys::PHASE
                ));
                Phase::Stopping
            }
        };
        let cordoned = match data.get(keys::CORDONED) {
            None => BTreeSet::new(),
            Some(v) => serde_json::from_str(v).unwrap_or_else(|e| {
                problems.push(format!(
                    "{}: not a JSON array of node names ({e}); nodes are found by their cordon's record instead",
                    keys::CORDONED
                ));
                BTreeSet::new()
            }),
        };
        let intent = Self {
            phase,
            started_at: text(keys::STARTED_AT),
            requested_by: text(keys::REQUESTED_BY),
            reason: text(keys::REASON),
            cordoned,
        };
        (intent, problems)
    }
}

/// Whether `intent` is still obeyed, judged from `nodes` (all of the cluster's, or the one node
/// an agent asks for): live while any of them holds the shutdown's own cordon (nodeward's, its
/// record giving the shutdown's reason: listed or cordoned just before the list was written).
/// Once every such cordon is gone — lifted by hand after an interrupted shutdown, the nodes
/// deleted — the intent is stale: reported, not obeyed. No timer: the power-off follows the
/// operator's run, so a record renewed by that run would go stale exactly when the shutdown
/// drains read it.
pub fn is_live<'a>(nodes: impl IntoIterator<Item = &'a k8s_openapi::api::core::v1::Node>) -> bool {
    use crate::drain::cordon::{Lifter, nodeward_cordon};
    let by = Lifter::Reason(super::CORDON_REASON);
    nodes
        .into_iter()
        .any(|n| nodeward_cordon(n).is_some_and(|r| r.is_for(by)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(
        unschedulable: bool,
        manager: &str,
        reason: Option<&str>,
    ) -> k8s_openapi::api::core::v1::Node {
        let mut v = serde_json::json!({
            "metadata": {"name": "n", "managedFields": [{"manager": manager, "operation": "Update",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:unschedulable": {}}}}]},
            "spec": {"unschedulable": unschedulable}
        });
        if let Some(r) = reason {
            let record = serde_json::json!({"reason": r, "at": "2026-01-01T00:00:00Z"}).to_string();
            v["metadata"]["annotations"] = serde_json::json!({crate::names::CORDONED_BY: record});
        }
        serde_json::from_value(v).expect("node")
    }

    /// Issue 58, item 3: an intent is obeyed only while a node still holds the shutdown's
    /// cordon. After an interrupted shutdown and a reflexive `kubectl uncordon` of every node
    /// (or the nodes' deletion) it is stale; a node cordoned since for another reason, by
    /// nodeward or by hand, does not keep it live.
    #[test]
    fn an_intent_is_live_only_while_a_node_holds_the_shutdowns_cordon() {
        let ours = Some(crate::cluster::CORDON_REASON);
        let held = node(true, "nodeward", ours);
        let uncordoned = node(false, "kubectl-cordon", ours);
        let by_hand = node(true, "kubectl-cordon", ours);
        let maint = node(true, "nodeward", Some("maint"));
        assert!(is_live([&uncordoned, &held]));
        assert!(
            !is_live([&uncordoned, &by_hand, &maint]),
            "every shutdown cordon lifted"
        );
        assert!(!is_live(std::iter::empty()), "the nodes are gone");
    }

    #[test]
    fn data_round_trips() {
        let i = Intent {
            phase: Phase::Stopped,
            started_at: "2026-01-01T00:00:00Z".into(),
            requested_by: "alice".into(),
            reason: "datacenter move".into(),
            cordoned: BTreeSet::from(["n1".into(), "n2".into()]),
        };
        let data = i.to_data();
        assert_eq!(data[keys::CORDONED], r#"["n1","n2"]"#);
        assert_eq!(data[keys::PHASE], "stopped");
        assert_eq!(Intent::from_data(&data), (i, vec![]));
    }

    #[test]
    fn a_hand_edited_record_is_read_as_far_as_it_goes() {
        let data = BTreeMap::from([
            (keys::PHASE.to_string(), "paused".to_string()),
            (keys::CORDONED.to_string(), "n1,n2".to_string()),
        ]);
        let (i, problems) = Intent::from_data(&data);
        assert_eq!(i.phase, Phase::Stopping);
        assert!(i.cordoned.is_empty());
        assert_eq!(problems.len(), 2, "{problems:?}");
        let (i, problems) = Intent::from_data(&BTreeMap::new());
        assert_eq!((i.phase, problems.len()), (Phase::Stopping, 1));
    }
}
