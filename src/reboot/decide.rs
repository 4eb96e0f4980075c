//! The coordinated reboot's decisions, from facts and `now`: what this node does next, whether
//! it may take a slot, and when it is back. No I/O here; `run.rs` gathers and acts.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};

use crate::config::RebootSettings;

/// Who asks for the reboot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Request {
    /// The sentinel file exists (a package asked).
    Sentinel,
    /// The sentinel command said so.
    Command,
    /// `nodeward reboot` on this node.
    Manual,
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sentinel => "the sentinel file",
            Self::Command => "the sentinel command",
            Self::Manual => "nodeward reboot",
        })
    }
}

/// What a node records on itself (annotation [`RECORD`]) from taking a slot until its slot is
/// given back, so the agent that starts after the reboot knows it was one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The slot held.
    pub slot: String,
    /// The boot the slot was taken in.
    pub boot_id: String,
    /// `draining` or `rebooting`.
    pub phase: String,
    /// When the slot was taken (RFC 3339).
    pub since: String,
}

/// The Node annotation holding the [`Record`].
pub const RECORD: &str = "nodeward.io/reboot";

/// The record on `node`, if any (one that does not parse counts as none: it is rewritten when
/// a slot is next taken).
pub fn record(node: &Node) -> Option<Record> {
    let text = node.metadata.annotations.as_ref()?.get(RECORD)?;
    serde_json::from_str(text).ok()
}

/// What to do on this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Nothing asked, nothing held.
    Idle,
    /// A reboot is asked for: check whether a slot may be taken.
    Try(Request),
    /// The slot was taken in this boot and the reboot is still asked for (the agent restarted
    /// meanwhile): drain (again) and reboot.
    Resume(Record),
    /// The slot was taken in this boot but the request is gone: give everything back.
    Abandon(Record),
    /// The node rebooted since it took the slot: wait until it is back, then give the slot.
    Back(Record),
}

/// The pass's step from the request, the Node's record and this boot's id.
pub fn next(requested: Option<Request>, record: Option<Record>, boot_id: &str) -> Next {
    match (record, requested) {
        (Some(r), _) if r.boot_id != boot_id => Next::Back(r),
        (Some(r), Some(_)) => Next::Resume(r),
        (Some(r), None) => Next::Abandon(r),
        (None, Some(q)) => Next::Try(q),
        (None, None) => Next::Idle,
    }
}

/// Why a node that wants a reboot waits; each is the `nodeward.io/Reboot` condition's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// kured runs in this cluster and holds its lock: the two must not reboot nodes together.
    Kured(String),
    /// Whether kured holds its lock cannot be read (the DaemonSets could not be listed).
    KuredUnknown(String),
    /// Outside the maintenance window.
    Window(Option<Timestamp>),
    /// Every slot is held.
    Slot(Vec<String>),
    /// Pods matching a blocking selector run.
    Pods(Vec<String>),
    /// Alerts fire, or the alerts API cannot be asked.
    Alerts(Result<Vec<String>, String>),
    /// Too many nodes are unavailable.
    Health {
        /// The unavailable others, with why.
        unavailable: Vec<String>,
        /// How many may be, this node included.
        allowed: u32,
    },
    /// The fleet's health cannot be read (the Node list failed): unknown health is not good
    /// health.
    HealthUnknown(String),
    /// The node's pods' budgets do not allow the drain now.
    Budgets(Vec<String>),
    /// Pods the drain may not evict (no controller, emptyDir data, annotated): a reboot would
    /// kill them, so the drain could never finish.
    Unevictable(Vec<String>),
}

impl Wait {
    /// The condition's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Kured(_) => "KuredPresent",
            Self::KuredUnknown(_) => "KuredUnknown",
            Self::Window(_) => "WaitingForWindow",
            Self::Slot(_) => "WaitingForSlot",
            Self::Pods(_) => "BlockedByPods",
            Self::Alerts(_) => "BlockedByAlerts",
            Self::Health { .. } => "WaitingForHealth",
            Self::HealthUnknown(_) => "HealthUnknown",
            Self::Budgets(_) => "WaitingForBudgets",
            Self::Unevictable(_) => "BlockedByUnevictablePods",
        }
    }

    /// One line for people.
    pub fn message(&self) -> String {
        let list = |v: &[String]| {
            let shown: Vec<&str> = v.iter().take(5).map(String::as_str).collect();
            let more = v.len().saturating_sub(5);
            if more > 0 {
                format!("{} and {more} more", shown.join(", "))
            } else {
                shown.join(", ")
            }
        };
        match self {
            Self::Kured(holder) => format!(
                "kured's lock annotation is present ({holder}); nodeward does not reboot nodes while kured does: remove kured first (docs: reboot.md, \"Moving from kured\")"
            ),
            Self::KuredUnknown(e) => format!(
                "cannot tell whether kured holds its lock ({e}); nodeward does not reboot a node while it cannot tell"
            ),
            Self::Window(Some(at)) => format!("outside the maintenance window; it opens at {at}"),
            Self::Window(None) => "the maintenance window lists no day".into(),
            Self::Slot(holders) => format!("every reboot slot is held: {}", list(holders)),
            Self::Pods(pods) => format!("blocking pods run: {}", list(pods)),
            Self::Alerts(Ok(names)) => format!("alerts firing: {}", list(names)),
            Self::Alerts(Err(e)) => format!("cannot tell whether alerts fire: {e}"),
            Self::Health {
                unavailable,
                allowed,
            } => format!(
                "{} other nodes are unavailable and at most {allowed} may be, this one included: {}",
                unavailable.len(),
                list(unavailable)
            ),
            Self::HealthUnknown(e) => format!(
                "cannot tell how many nodes are unavailable ({e}); unknown health is not good health, so the node waits"
            ),
            Self::Budgets(short) => {
                format!("the budgets do not allow the drain now: {}", list(short))
            }
            Self::Unevictable(pods) => format!(
                "pods the drain may not evict run here (a reboot would kill them; delete them, or see [drain] force and delete_emptydir_data_on_shutdown): {}",
                list(pods)
            ),
        }
    }
}

/// What the checks before a slot found (each empty when its check is off).
#[derive(Debug, Clone)]
pub struct Before {
    /// Blocking pods (`namespace/name`, and where).
    pub pods: Vec<String>,
    /// The firing alerts that block, or why the API could not tell.
    pub alerts: Result<Vec<String>, String>,
    /// The other nodes that are unavailable, with why ([`unavailable`]); `Err`: why the Node
    /// list could not tell.
    pub unavailable: Result<Vec<String>, String>,
    /// All nodes (the `health_nodes` among them).
    pub nodes: u32,
    /// The budgets the drain would exceed now ([`crate::drain::plan::budgets_short`]).
    pub budgets: Vec<String>,
    /// Pods the drain's plan refuses, with why.
    pub unevictable: Vec<String>,
}

/// Whether the node may look for a slot: not while kured holds its lock, or while that cannot be
/// read (`kured`: the lock's holder, if any; `Err`: why the DaemonSets could not be listed);
/// then not outside the window.
pub fn may_look_for_slot(
    s: &RebootSettings,
    kured: Result<Option<String>, String>,
    now: Timestamp,
) -> Result<(), Wait> {
    match kured {
        Ok(Some(holder)) => Err(Wait::Kured(holder)),
        Err(e) => Err(Wait::KuredUnknown(e)),
        Ok(None) if !s.window.contains(now) => Err(Wait::Window(s.window.next_open(now))),
        Ok(None) => Ok(()),
    }
}

/// Whether the node may take a slot, on the checks' findings: blockers first (an operator's
/// explicit "not now"), then the cluster's health, then what the drain would meet: pods it may
/// not evict, then the budgets.
pub fn may_take_slot(s: &RebootSettings, b: &Before) -> Result<(), Wait> {
    if !b.pods.is_empty() {
        return Err(Wait::Pods(b.pods.clone()));
    }
    match &b.alerts {
        Ok(names) if names.is_empty() => {}
        other => return Err(Wait::Alerts(other.clone())),
    }
    let unavailable = b
        .unavailable
        .as_ref()
        .map_err(|e| Wait::HealthUnknown(e.clone()))?;
    let allowed = s.max_unavailable_of(b.nodes);
    let others = u32::try_from(unavailable.len()).unwrap_or(u32::MAX);
    if others.saturating_add(1) > allowed {
        return Err(Wait::Health {
            unavailable: unavailable.clone(),
            allowed,
        });
    }
    if !b.unevictable.is_empty() {
        return Err(Wait::Unevictable(b.unevictable.clone()));
    }
    if !b.budgets.is_empty() {
        return Err(Wait::Budgets(b.budgets.clone()));
    }
    Ok(())
}

/// Why `n` is unavailable, as machine-config-operator counts a node unavailable: NotReady,
/// cordoned, or rebooting (holding a slot: `holders`). `None`: available.
pub fn unavailable(n: &Node, holders: &[String]) -> Option<&'static str> {
    let name = n.metadata.name.as_deref().unwrap_or_default();
    let ready = crate::node_write::condition(n, "Ready").is_some_and(|c| c.status == "True");
    if holders.iter().any(|h| h == name) {
        Some("rebooting")
    } else if !ready {
        Some("NotReady")
    } else if crate::drain::cordon::is_cordoned(n) {
        Some("cordoned")
    } else {
        None
    }
}

/// The node as it comes back after the reboot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Return {
    /// kubelet's `Ready` condition is True.
    pub kubelet_ready: bool,
    /// Every readiness gate passes, as the agent judges them in this boot.
    pub gates_pass: bool,
    /// The startup taint is still on.
    pub startup_taint: bool,
    /// Who cordoned it.
    pub cordon: Cordon,
}

/// Whose cordon is on the Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cordon {
    /// None.
    None,
    /// nodeward's: the reboot's own, lifted once the node is back.
    Ours,
    /// Someone else's: theirs to lift; the reboot is done without it.
    Other,
}

/// What to do with a node that is coming back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackStep {
    /// Not back yet: waiting for this.
    Wait(&'static str),
    /// Back: lift the reboot's cordon.
    Uncordon,
    /// Back and schedulable since `since`; the slot goes at `until`.
    Settle {
        /// When the node was first seen back.
        since: Timestamp,
        /// When the slot goes.
        until: Timestamp,
    },
    /// Settled: give the slot to the next node.
    Release,
}

/// The step for a returning node, `back_since` being when it was first seen back (gates passing,
/// untainted, schedulable), if it has been.
pub fn back(
    r: Return,
    back_since: Option<Timestamp>,
    settle: Duration,
    now: Timestamp,
) -> BackStep {
    if !r.kubelet_ready {
        return BackStep::Wait("kubelet's Ready condition");
    }
    if !r.gates_pass {
        return BackStep::Wait("the readiness gates");
    }
    if r.startup_taint {
        return BackStep::Wait("the startup taint's removal");
    }
    if r.cordon == Cordon::Ours {
        return BackStep::Uncordon;
    }
    let since = back_since.unwrap_or(now);
    let until = since
        .checked_add(jiff::SignedDuration::try_from(settle).unwrap_or(jiff::SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX);
    if now >= until {
        BackStep::Release
    } else {
        BackStep::Settle { since, until }
    }
}

#[cfg(test)]
mod tests;
