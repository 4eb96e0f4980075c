//! The out-of-service taint after a power-off, applied automatically and only where it is safe.
//!
//! A node that powers off with pods still bound to it (the drain's deadline left them, or the
//! evicted ones whose objects stay Terminating once the kubelet is gone) keeps them there: a
//! StatefulSet's replacement never starts and its volumes stay attached. Kubernetes' answer
//! (KEP-2268) is the taint `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` on the
//! NotReady node: the pod GC force-deletes its terminating pods and their volumes are detached.
//! It must only go on a machine that is really off, so it needs two witnesses:
//!
//! - the node itself says it is powering off: before it releases logind's lock at a power-off
//!   (never at a reboot or a shutdown of unknown kind), the agent writes a [`PowerOff`] record,
//!   with its boot ID, on its Node ([`crate::names::POWER_OFF`]);
//! - the cluster sees it gone: the kubelet's `Ready` condition is `False` or `Unknown`, and the
//!   controller itself has seen no heartbeat from the node (its Lease in `kube-node-lease`
//!   unchanged) for the configured time since it saw the record, by its own monotonic clock
//!   ([`Heartbeats`]). `Ready` alone is no witness: a kubelet reports NotReady itself for a
//!   CNI or runtime fault, the usual reason to power a node off, while systemd may still be
//!   stopping its containers.
//!
//! The readiness controller (with `--out-of-service`) then adds the taint ([`decide`]), marks
//! the record as its own, and removes both when the node reports a new boot ID or is Ready again.
//! A taint an operator added is never touched. The writes are in `write.rs`. The agent withdraws
//! its record when logind cancels the power-off ([`withdraw`]).

mod heartbeat;
mod write;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use serde::{Deserialize, Serialize};

use crate::names::{OUT_OF_SERVICE_TAINT_EFFECT, OUT_OF_SERVICE_TAINT_KEY, POWER_OFF};
pub use heartbeat::{Heartbeats, NODE_LEASE_NAMESPACE};
pub use write::{Error, announce, reconcile, withdraw};

/// A node goes NotReady within this long of its power-off record, or the record is stale (a
/// power-off cancelled after it was written, a machine that stayed up): the record goes and no
/// taint follows. A power-off stops the kubelet within the shutdown's first minutes and the node
/// lifecycle controller says NotReady a grace period (50 s) later; ten minutes leaves room for a
/// slow shutdown and none for a partition days later to pass for the announced power-off.
pub const ANNOUNCED_WITHIN: Duration = Duration::from_secs(600);

/// What the agent leaves on its Node before a power-off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PowerOff {
    /// The boot that is ending (`/proc/sys/kernel/random/boot_id`, as the kubelet reports it in
    /// `status.nodeInfo.bootID`).
    pub boot_id: String,
    /// When the record was written (RFC 3339).
    pub at: String,
    /// Pods still on the node when the drain ended (`namespace/name`).
    #[serde(default)]
    pub left_behind: Vec<String>,
    /// Pods evicted or deleted whose containers stopped but whose objects stay Terminating once
    /// the kubelet is gone.
    #[serde(default)]
    pub terminating: Vec<String>,
    /// When the readiness controller added the out-of-service taint for this record: the taint
    /// is then nodeward's to remove.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tainted_at: Option<String>,
}

impl PowerOff {
    /// The record on `node`, if it has a readable one.
    pub fn of(node: &Node) -> Option<Self> {
        let text = node.metadata.annotations.as_ref()?.get(POWER_OFF)?;
        serde_json::from_str(text).ok()
    }

    fn at(&self) -> Option<jiff::Timestamp> {
        self.at.parse().ok()
    }
}

/// What the controller does about one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Add the out-of-service taint (and mark the record as tainted).
    Taint,
    /// The machine is back (a new boot, or Ready again): remove the record, and the taint when
    /// nodeward added it (`untaint`).
    Clear {
        /// The taint is there and nodeward's.
        untaint: bool,
    },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Change::Taint => "taint",
            Change::Clear { untaint: true } => "untaint",
            Change::Clear { untaint: false } => "clear",
        })
    }
}

/// What to do about `node` at `now`, when its heartbeat has been `silent` (as the controller saw
/// it since the record: [`Heartbeats::silent_for`]) and a node announced as powered off must be
/// NotReady and silent for `after` before it is tainted. Nothing for a node without a readable
/// [`PowerOff`] record, one being deleted, one without a kubelet `Ready` condition, one still
/// Ready since before the record, or one an operator tainted already. `now` only judges whether
/// the record is stale: never when the taint comes.
pub fn decide(
    node: &Node,
    after: Duration,
    now: jiff::Timestamp,
    silent: Duration,
) -> Option<Change> {
    if node.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let record = PowerOff::of(node)?;
    let tainted = has_taint(node);
    let ours = tainted && record.tainted_at.is_some();
    if boot_id(node).is_some_and(|b| b != record.boot_id) {
        return Some(Change::Clear { untaint: ours });
    }
    let ready = crate::node_write::condition(node, "Ready")?;
    let since = ready
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(now);
    let announced = record.at().unwrap_or(now);
    let window = jiff::SignedDuration::try_from(ANNOUNCED_WITHIN).unwrap_or_default();
    let stale = |t: jiff::Timestamp| t.duration_since(announced) > window;
    if ready.status == "True" {
        // Ready since the announcement (the machine is back), or still Ready long after it (the
        // power-off did not happen).
        return (since > announced || stale(now)).then_some(Change::Clear { untaint: ours });
    }
    if tainted {
        return None;
    }
    if stale(since) {
        // NotReady only long after the record: not the power-off it announced.
        return Some(Change::Clear { untaint: false });
    }
    (silent >= after).then_some(Change::Taint)
}

/// The kubelet's boot ID in the Node's status (empty counts as none).
fn boot_id(node: &Node) -> Option<&str> {
    let id = node.status.as_ref()?.node_info.as_ref()?.boot_id.as_str();
    (!id.is_empty()).then_some(id)
}

/// Whether `node` carries the out-of-service taint (any value, any adder).
pub fn has_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(is_taint))
}

fn is_taint(t: &Taint) -> bool {
    t.key == OUT_OF_SERVICE_TAINT_KEY && t.effect == OUT_OF_SERVICE_TAINT_EFFECT.as_str()
}

#[cfg(test)]
mod tests;
