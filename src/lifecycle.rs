//! Kubernetes 1.37's node lifecycle conditions (KEP-5683: `GracefulNodeShutdownInProgress`,
//! `DrainInProgress`, `Drained`, `MaintenancePlanned`, `MaintenanceInProgress`): the words the
//! whole ecosystem reads for a node that is leaving, written beside nodeward's own
//! `nodeward.io/*` conditions. Core Kubernetes reserves the types and leaves "setting and
//! clearing" them to the administrator's tools; nothing in core reads or writes them, so the
//! `NodeLifecycleConditions` feature gate changes nothing here.
//!
//! Which moment sets which condition is decided here, purely ([`wants`] of a [`Moment`], and
//! [`settle`] of the Node as it is, for what the node's agent clears once a moment is over);
//! [`write`] is the one write path: `nodes/status`, field manager `nodeward`, `lastTransitionTime`
//! kept while the status does not flip, guarded by the read resourceVersion.
//!
//! Never fight another writer: a lifecycle condition that another field manager has set (an
//! operator's tool, another controller, a future `kubectl drain`) is left alone and said once
//! ([`foreign`]); `[conditions] lifecycle = false` turns all five off for a cluster where another
//! tool owns them.

use std::collections::BTreeSet;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Node;
use serde_json::json;
use tracing::warn;

use crate::names::FIELD_MANAGER;
use crate::node_write::{self, NodeError, NodeWrite, status_word};

/// `True` from logind's `PrepareForShutdown(true)`; `False` when the shutdown is cancelled, or
/// once the node is up again (the agent's first look at its Node after the boot).
pub const GRACEFUL_SHUTDOWN: &str = "GracefulNodeShutdownInProgress";
/// `True` while a drain runs (any: the operator's, a shutdown's, a scale-down's, a reboot's).
pub const DRAIN_IN_PROGRESS: &str = "DrainInProgress";
/// At a drain's end: `True` when nothing that leaves with the node is left on it; `False` while
/// a drain runs.
pub const DRAINED: &str = "Drained";
/// `True` while a coordinated reboot is asked for and waits (the reason says for what).
pub const MAINTENANCE_PLANNED: &str = "MaintenancePlanned";
/// `True` from a reboot's slot until its return, and on every node a cluster shutdown cordoned
/// until `cluster start`.
pub const MAINTENANCE_IN_PROGRESS: &str = "MaintenanceInProgress";

/// The five types, in the order a leaving node goes through them.
pub const TYPES: [&str; 5] = [
    MAINTENANCE_PLANNED,
    MAINTENANCE_IN_PROGRESS,
    GRACEFUL_SHUTDOWN,
    DRAIN_IN_PROGRESS,
    DRAINED,
];

/// The reason both drain conditions turn `False` with once the node is schedulable again.
pub const REASON_UNCORDONED: &str = "Uncordoned";
/// The reason `MaintenanceInProgress` says a cluster shutdown with (and `cluster start` clears).
pub const REASON_CLUSTER_SHUTDOWN: &str = "ClusterShutdown";
/// The reason `GracefulNodeShutdownInProgress` turns `False` with on the next boot.
pub const REASON_BOOTED: &str = "NodeBooted";

/// One condition as a moment wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// The condition's type.
    pub type_: &'static str,
    /// `True` or `False`.
    pub status: bool,
    /// CamelCase.
    pub reason: String,
    /// One line for people.
    pub message: String,
}

impl Want {
    /// `type_` with `status`, `reason` and `message`.
    pub fn new(type_: &'static str, status: bool, reason: &str, message: &str) -> Self {
        Self {
            type_,
            status,
            reason: reason.to_string(),
            message: message.to_string(),
        }
    }

    /// Whether this is one of the five lifecycle conditions (the rest are nodeward's own).
    pub fn is_lifecycle(&self) -> bool {
        TYPES.contains(&self.type_)
    }
}

/// What the node is doing, as the writer that knows it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment<'a> {
    /// A drain started (after its cordon); `cause` says whose.
    DrainStarted {
        /// E.g. `nodeward drain`, `shutdown (poweroff)`, `scale-down`.
        cause: &'a str,
    },
    /// A drain ended.
    DrainEnded {
        /// Nothing that leaves with the node is left on it (no pod left behind, none refused,
        /// not cancelled).
        emptied: bool,
        /// The outcome's reason (`Drained`, `DeadlineExceeded`, …).
        reason: &'a str,
        /// The drain's summary.
        message: &'a str,
    },
    /// logind announced a shutdown (`PrepareForShutdown(true)`).
    ShutdownPreparing {
        /// `Reboot`, `PowerOff` or `Unknown`.
        kind: &'a str,
    },
    /// The shutdown was cancelled (`PrepareForShutdown(false)`).
    ShutdownCancelled,
    /// A coordinated reboot is asked for and waits for `reason`.
    RebootWaiting {
        /// Why it waits (`WaitingForWindow`, `WaitingForSlot`, …).
        reason: &'a str,
        /// The same for people.
        message: &'a str,
    },
    /// The reboot's request was withdrawn before it started.
    RebootWithdrawn,
    /// The reboot holds its slot: draining, rebooting or settling.
    RebootUnderway {
        /// `Draining`, `Rebooting`, `Settling`.
        reason: &'a str,
        /// The same for people.
        message: &'a str,
    },
    /// The reboot is over (done, failed or given up).
    RebootOver {
        /// `RebootDone`, `RebootFailed`, …
        reason: &'a str,
        /// The same for people.
        message: &'a str,
    },
    /// `nodeward cluster shutdown` cordoned the node.
    ClusterShutdown,
    /// `nodeward cluster start` lifted the shutdown's cordon.
    ClusterStarted,
}

/// The lifecycle conditions `m` sets, in the order they should land (one patch carries them).
pub fn wants(m: &Moment<'_>) -> Vec<Want> {
    match *m {
        // Not drained while a drain runs, whatever an earlier one ended with.
        Moment::DrainStarted { cause } => {
            let message = format!("draining: {cause}");
            vec![
                Want::new(DRAIN_IN_PROGRESS, true, "Draining", &message),
                Want::new(DRAINED, false, "Draining", &message),
            ]
        }
        Moment::DrainEnded {
            emptied,
            reason,
            message,
        } => vec![
            Want::new(DRAIN_IN_PROGRESS, false, "DrainEnded", message),
            Want::new(DRAINED, emptied, reason, message),
        ],
        Moment::ShutdownPreparing { kind } => vec![Want::new(
            GRACEFUL_SHUTDOWN,
            true,
            kind,
            &format!(
                "logind announced a shutdown ({}); nodeward's lock holds it while the node drains",
                kind.to_lowercase()
            ),
        )],
        Moment::ShutdownCancelled => vec![Want::new(
            GRACEFUL_SHUTDOWN,
            false,
            "ShutdownCancelled",
            "the shutdown was cancelled",
        )],
        Moment::RebootWaiting { reason, message } => {
            vec![Want::new(MAINTENANCE_PLANNED, true, reason, message)]
        }
        Moment::RebootWithdrawn => vec![Want::new(
            MAINTENANCE_PLANNED,
            false,
            "NotRequested",
            "the reboot request was withdrawn",
        )],
        Moment::RebootUnderway { reason, message } => vec![
            Want::new(
                MAINTENANCE_PLANNED,
                false,
                "Started",
                "the reboot holds its slot",
            ),
            Want::new(MAINTENANCE_IN_PROGRESS, true, reason, message),
        ],
        Moment::RebootOver { reason, message } => vec![
            Want::new(MAINTENANCE_PLANNED, false, reason, message),
            Want::new(MAINTENANCE_IN_PROGRESS, false, reason, message),
        ],
        Moment::ClusterShutdown => vec![Want::new(
            MAINTENANCE_IN_PROGRESS,
            true,
            REASON_CLUSTER_SHUTDOWN,
            "cordoned by `nodeward cluster shutdown` until `nodeward cluster start`",
        )],
        Moment::ClusterStarted => vec![Want::new(
            MAINTENANCE_IN_PROGRESS,
            false,
            "ClusterStarted",
            "`nodeward cluster start` lifted the cluster shutdown's cordon",
        )],
    }
}

/// What `nodeward cluster start` clears on a node: the `MaintenanceInProgress` a cluster
/// shutdown said (whatever `[conditions] lifecycle` said then), and nothing else: another
/// moment's or another writer's maintenance stays.
pub fn cluster_started(node: &Node) -> Vec<Want> {
    let said = node_write::condition(node, MAINTENANCE_IN_PROGRESS).is_some_and(|c| {
        c.status == "True" && c.reason.as_deref() == Some(REASON_CLUSTER_SHUTDOWN)
    });
    if said {
        wants(&Moment::ClusterStarted)
    } else {
        Vec::new()
    }
}

/// What the node's agent knows besides its Node, for [`settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agent {
    /// A shutdown of this boot is under way (logind announced it and did not cancel it): its
    /// drain may be running, so the drain's conditions are not cleared either.
    pub shutting_down: bool,
    /// When this boot began (wall clock).
    pub booted_at: jiff::Timestamp,
}

/// What the node's agent clears, from its Node as it is: a moment that is over but whose
/// writer could not say so. `GracefulNodeShutdownInProgress` stays `True` through the lock's
/// release (systemd is still stopping kubelet) and is cleared by the next boot (it turned `True`
/// before this boot began; one of this boot is a shutdown under way, or a cancelled one, which
/// the cancel says itself); the drain's
/// two turn `False` once the node is schedulable again, whoever uncordoned it (an operator's
/// `kubectl uncordon` says the drain is over as much as nodeward's own uncordon does). `False`
/// rather than removed: the condition's `lastTransitionTime` then says when the node came back,
/// and a remove would need a JSON patch by list index, racing every other writer.
pub fn settle(node: &Node, agent: Agent) -> Vec<Want> {
    let is_true = |t: &str| node_write::condition(node, t).is_some_and(|c| c.status == "True");
    let mut out = Vec::new();
    let before_this_boot = node_write::condition(node, GRACEFUL_SHUTDOWN)
        .and_then(|c| c.last_transition_time.as_ref())
        .is_some_and(|t| t.0 < agent.booted_at);
    if !agent.shutting_down && is_true(GRACEFUL_SHUTDOWN) && before_this_boot {
        out.push(Want::new(
            GRACEFUL_SHUTDOWN,
            false,
            REASON_BOOTED,
            "the node is up again",
        ));
    }
    let schedulable = !node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    if schedulable && !agent.shutting_down && (is_true(DRAIN_IN_PROGRESS) || is_true(DRAINED)) {
        let msg = "the node is schedulable again";
        for t in [DRAIN_IN_PROGRESS, DRAINED] {
            if node_write::condition(node, t).is_some() {
                out.push(Want::new(t, false, REASON_UNCORDONED, msg));
            }
        }
    }
    out
}

/// The field manager, other than nodeward's, that has set condition `type_` on `node`, if any
/// (its `managedFields` name the condition's entry, `k:{"type":"…"}`, under `f:status`).
pub fn foreign(node: &Node, type_: &str) -> Option<String> {
    let key = format!("k:{}", json!({ "type": type_ }));
    node.metadata
        .managed_fields
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|m| m.manager.as_deref() != Some(FIELD_MANAGER))
        .find(|m| {
            m.fields_v1
                .as_ref()
                .and_then(|f| f.0.pointer("/f:status/f:conditions"))
                .and_then(|c| c.get(&key))
                .is_some()
        })
        .map(|m| m.manager.clone().unwrap_or_else(|| "(unnamed)".into()))
}

/// The lifecycle conditions `node` shows, one `Type=Status (Reason)` each in [`TYPES`]' order,
/// naming the writer of one nodeward leaves alone: what `nodeward status` prints.
pub fn summary(node: &Node) -> Vec<String> {
    TYPES
        .iter()
        .filter_map(|t| {
            let c = node_write::condition(node, t)?;
            let by = foreign(node, t).map_or_else(String::new, |m| format!(", set by {m}"));
            Some(format!(
                "{t}={} ({}{by})",
                c.status,
                c.reason.as_deref().unwrap_or("")
            ))
        })
        .collect()
}

/// The strategic merge patch of `node`'s status that writes `wants` at `now`, and the lifecycle
/// conditions left out because another writer owns them (type, manager). A want the Node
/// already shows (status, reason and message alike) is left out: nothing to say. `None` when
/// nothing is left to write.
pub fn patch(
    node: &Node,
    wants: &[Want],
    now: jiff::Timestamp,
) -> (Option<serde_json::Value>, Vec<(&'static str, String)>) {
    let mut skipped = Vec::new();
    let mut conditions = Vec::new();
    for w in wants {
        if let Some(m) = w.is_lifecycle().then(|| foreign(node, w.type_)).flatten() {
            skipped.push((w.type_, m));
            continue;
        }
        let current = node_write::condition(node, w.type_);
        let status = status_word(w.status);
        if current.is_some_and(|c| {
            c.status == status
                && c.reason.as_deref() == Some(w.reason.as_str())
                && c.message.as_deref() == Some(w.message.as_str())
        }) {
            continue;
        }
        let transition = current
            .filter(|c| c.status == status)
            .and_then(|c| c.last_transition_time.as_ref())
            .map_or(now, |t| t.0);
        conditions.push(json!({
            "type": w.type_,
            "status": status,
            "reason": w.reason,
            "message": w.message,
            "lastHeartbeatTime": now.to_string(),
            "lastTransitionTime": transition.to_string(),
        }));
    }
    let patch = (!conditions.is_empty()).then(|| {
        json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "status": {"conditions": conditions},
        })
    });
    (patch, skipped)
}

/// Says once per process, per node and type, that another writer owns a lifecycle condition.
fn say_foreign(node: &str, skipped: &[(&'static str, String)]) {
    static SAID: Mutex<BTreeSet<(String, &'static str)>> = Mutex::new(BTreeSet::new());
    let Ok(mut said) = SAID.lock() else { return };
    for (type_, manager) in skipped {
        if said.insert((node.to_string(), type_)) {
            warn!(node, condition = type_, manager = %manager, "another writer owns this lifecycle condition; nodeward leaves it alone");
        }
    }
}

/// Writes `wants` on `node`: [`write_deciding`] with the same conditions whatever the Node says.
pub async fn write(
    client: &kube::Client,
    node: &str,
    current: Option<Node>,
    wants: &[Want],
    lifecycle: bool,
) -> Result<Option<Node>, NodeError> {
    write_deciding(client, node, current, |_| wants.to_vec(), lifecycle).await
}

/// Writes the conditions `decide` wants of the Node as read (starting from `current`, a copy
/// the caller holds, else reading it): one strategic merge patch of `nodes/status` under
/// nodeward's field manager, guarded by the read resourceVersion
/// ([`node_write::write_status_guarded`]); on a conflict the Node is read and decided again, so
/// a condition another writer set since the read is seen before it could be overwritten. With
/// `lifecycle` false the five lifecycle conditions are dropped. Returns the Node as written
/// (`None`: nothing to write).
#[tracing::instrument(skip(client, current, decide), err)]
pub async fn write_deciding(
    client: &kube::Client,
    node: &str,
    current: Option<Node>,
    decide: impl Fn(&Node) -> Vec<Want>,
    lifecycle: bool,
) -> Result<Option<Node>, NodeError> {
    let (n, written) =
        node_write::write_status_guarded(client, node, "write the conditions of", current, |n| {
            let mut wants = decide(n);
            wants.retain(|w| lifecycle || !w.is_lifecycle());
            let (p, skipped) = patch(n, &wants, jiff::Timestamp::now());
            say_foreign(node, &skipped);
            Ok::<_, std::convert::Infallible>(match p {
                Some(p) => NodeWrite::Patch(p, true),
                None => NodeWrite::Done(false),
            })
        })
        .await
        .map_err(|e| e.for_node(node))?;
    Ok(written.then_some(n))
}

#[cfg(test)]
mod tests;
