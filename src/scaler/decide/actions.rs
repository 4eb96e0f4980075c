//! What `decide` answers: the actions, and the reasons each gives.

use super::*;

/// Why a group grows; in the status, `pending-pods`, `below-min` or `standby`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScaleUpReason {
    /// Pending pods fit nowhere else.
    PendingPods,
    /// The group is below its `min`.
    BelowMin,
    /// Fewer empty nodes than `standby`.
    Standby,
}

/// Why a machine is deleted without a drain; in the status, `never-registered`, `never-ready`
/// or `unready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RepairReason {
    /// No Node registered within `max_provision_time`.
    NeverRegistered,
    /// The Node still had the startup taint after `max_provision_time`, or the agent reported
    /// `NodeNotReadyInTime`.
    NeverReady,
    /// The Node was NotReady for `unready_delete_time`.
    Unready,
}

impl fmt::Display for RepairReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NeverRegistered => "no Node registered within max_provision_time",
            Self::NeverReady => "the Node did not become ready within max_provision_time",
            Self::Unready => "the Node was NotReady for unready_delete_time",
        })
    }
}

/// Why a Node whose machine is gone is deleted; in the status, `scaled-down` or `unready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeleteNodeReason {
    /// A scale-down deleted the machine and stopped before the Node.
    ScaledDown,
    /// The machine was deleted outside the scaler and the Node has been NotReady for
    /// `unready_delete_time`.
    Unready,
}

impl fmt::Display for DeleteNodeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ScaledDown => "a scale-down deleted its machine",
            Self::Unready => {
                "it has no machine at the provider and was NotReady for unready_delete_time"
            }
        })
    }
}

/// One thing the executor does.
///
/// The status ConfigMap's `last_actions` shows each as an object: `action`, the variant's name
/// in kebab-case (`scale-up`, `no-scale-up`, `mark-unneeded`, `clear-unneeded`, `scale-down`,
/// `repair`, `back-off`, `delete-node`, `cancel-scale-down`, `clear-back-off`,
/// `guard-holds`, `cluster-shutdown`), beside the variant's fields under their own names; times in RFC 3339, reasons
/// in kebab-case, an absent `node` or `group` as `null`. For example
/// `{"action": "clear-unneeded", "node": "n1"}`. Readers rely on this shape: add fields, never
/// rename or remove them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Action {
    /// Create `count` machines in `group`.
    ScaleUp {
        /// The group.
        group: String,
        /// How many machines.
        count: u32,
        /// Why.
        reason: ScaleUpReason,
        /// `namespace/name` of the pending pods the new machines are for.
        pods: Vec<String>,
    },
    /// A pending pod for which no machine is created.
    NoScaleUp {
        /// `namespace/name`.
        pod: String,
        /// Why, for the `NotTriggerScaleUp` event.
        reason: String,
    },
    /// Record that a node became unneeded now.
    MarkUnneeded {
        /// The node.
        node: String,
        /// The time to record.
        since: Timestamp,
    },
    /// The node is needed again; remove its unneeded-since record.
    ClearUnneeded {
        /// The node.
        node: String,
    },
    /// Cordon and drain the node, then delete its machine and the Node.
    ScaleDown {
        /// The group.
        group: String,
        /// The node.
        node: String,
        /// Its machine.
        machine: String,
        /// Whether it has no pods to move (daemon pods aside).
        empty: bool,
    },
    /// Delete a broken machine (and its Node, if any) without draining.
    Repair {
        /// The group.
        group: String,
        /// Its machine.
        machine: String,
        /// The Node, if one registered.
        node: Option<String>,
        /// Why.
        reason: RepairReason,
    },
    /// Record failed machines: the group backs off until `until`.
    BackOff {
        /// The group.
        group: String,
        /// New consecutive failure count.
        failures: u32,
        /// No scale-up before this.
        until: Timestamp,
    },
    /// Delete a Node whose machine is gone.
    DeleteNode {
        /// The group.
        group: String,
        /// The node.
        node: String,
        /// Why.
        reason: DeleteNodeReason,
    },
    /// A scale-down under way on a node opted out since (`nodeward.io/scale-down-disabled`):
    /// lift nodeward's cordon and forget it instead of finishing it.
    CancelScaleDown {
        /// The group.
        group: String,
        /// The node.
        node: String,
    },
    /// A machine of the group became ready after its last failure: forget the back-off.
    ClearBackOff {
        /// The group.
        group: String,
    },
    /// The cluster-health guard holds: too many nodes are NotReady at once to take them for
    /// broken machines, so none is replaced, no Node deleted and nothing scaled down.
    GuardHolds {
        /// The node group whose guard holds; `None`: the whole cluster's.
        group: Option<String>,
        /// NotReady nodes (booting ones aside).
        unready: u32,
        /// All nodes (of the group).
        total: u32,
        /// Repairs and Node deletions held back this pass.
        held: u32,
    },
    /// A whole-cluster shutdown is recorded: every node is cordoned and going down on purpose,
    /// its pods' replacements Pending on purpose. Nothing is scaled up, scaled down, repaired or
    /// deleted until `nodeward cluster start` removes the record.
    ClusterShutdown {
        /// Who asked for it.
        requested_by: String,
        /// When it started (RFC 3339).
        started_at: String,
    },
    /// A cluster shutdown is recorded, but no node holds its cordon any more: stale, reported,
    /// and not obeyed (the scaler acts as usual).
    StaleClusterShutdown {
        /// Who asked for it.
        requested_by: String,
        /// When it started (RFC 3339).
        started_at: String,
    },
}
