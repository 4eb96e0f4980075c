//! Coordinated reboots: a fleet whose nodes ask for a reboot (a kernel update's
//! `/var/run/reboot-required`, a command, `nodeward reboot`) reboots `concurrency` nodes at a
//! time, each only inside its maintenance window, with no blocking pod or firing alert, with the
//! cluster healthy and the node's budgets admitting its drain; it drains first, reboots only if the
//! drain finished, and gives its slot to the next node only once it is back, its gates pass, its
//! cordon is lifted and a settle time has passed.
//!
//! A slot is a ConfigMap `nodeward-reboot-N` held in the node's name and renewed by its agent,
//! with a Lease's fields and rules ([`slot`]; a kubelet identity may write no Lease but its own
//! heartbeat): a dead holder's slot frees itself when its duration passes unrenewed. What the node is doing is recorded on its own Node (annotation
//! [`decide::RECORD`]: the slot and the boot it was taken in), so the agent that starts after
//! the reboot knows it was one; the `nodeward.io/Reboot` condition, Events, `nodeward status`
//! and `nodeward_reboot_*` say what it waits for.
//!
//! The decisions are pure ([`decide`], [`crate::window`]); [`run`] gathers the facts and acts.

pub mod alerts;
pub mod decide;
pub mod metrics;
pub mod run;
pub mod slot;
pub mod status;

pub use crate::config::SLOT_PREFIX;

/// The Node condition the coordinator writes.
pub const CONDITION_TYPE: &str = "nodeward.io/Reboot";

/// The `nodeward.io/Reboot` condition a reboot's moment says: `True` while the reboot holds its
/// slot (draining, rebooting, settling), `False` with why it waits or how it ended otherwise.
/// (A moment that is not a reboot's has no say here: `False`, `NotRequested`.)
pub fn condition_of(m: &crate::lifecycle::Moment<'_>) -> crate::lifecycle::Want {
    use crate::lifecycle::{Moment, Want};
    let (status, reason, message) = match *m {
        Moment::RebootWaiting { reason, message } | Moment::RebootOver { reason, message } => {
            (false, reason, message)
        }
        Moment::RebootUnderway { reason, message } => (true, reason, message),
        _ => (false, "NotRequested", "the reboot request was withdrawn"),
    };
    Want::new(CONDITION_TYPE, status, reason, message)
}

/// The reason the reboot's cordon records: the reboot lifts only a cordon that gives it.
pub const CORDON_REASON: &str = "reboot";

/// kured's lock annotation (on its DaemonSet), whose presence means kured reboots nodes here.
pub const KURED_LOCK: &str = "weave.works/kured-node-lock";

/// Where the kernel says which boot this is.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// Where `nodeward.service` copies it, in its runtime directory (its sandbox hides `/proc/sys`).
const BOOT_ID_COPY: &str = "boot-id";

/// This boot's id, or `None` when it cannot be read. From, in order: `NODEWARD_BOOT_ID_FILE`
/// (tests, which reboot an agent without rebooting the machine), the unit's copy in
/// `$RUNTIME_DIRECTORY`, the kernel's file.
pub fn boot_id() -> Option<String> {
    let env = |k: &str| std::env::var_os(k).map(std::path::PathBuf::from);
    let candidates = [
        env("NODEWARD_BOOT_ID_FILE"),
        env("RUNTIME_DIRECTORY").map(|d| d.join(BOOT_ID_COPY)),
        Some(BOOT_ID.into()),
    ];
    candidates
        .into_iter()
        .flatten()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::Moment;

    /// The reboot's condition used to get `lastTransitionTime = now` on every write, so a node
    /// waiting for an hour through several reasons looked as if it had just started waiting.
    #[test]
    fn the_reboot_condition_keeps_its_transition_time_while_it_waits() {
        let since = "2026-12-05T08:00:00Z";
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "resourceVersion": "3"},
            "status": {"conditions": [{"type": CONDITION_TYPE, "status": "False",
                "reason": "WaitingForWindow", "message": "m", "lastTransitionTime": since}]},
        }))
        .expect("node");
        let now: jiff::Timestamp = "2026-12-05T09:00:00Z".parse().expect("time");
        let transition = |m: Moment<'_>| {
            let (p, _) = crate::lifecycle::patch(&node, &[condition_of(&m)], now);
            p.expect("a write")["status"]["conditions"][0]["lastTransitionTime"].clone()
        };
        let waiting = Moment::RebootWaiting {
            reason: "WaitingForSlot",
            message: "every slot is held",
        };
        assert_eq!(transition(waiting), since);
        let underway = Moment::RebootUnderway {
            reason: "Draining",
            message: "draining",
        };
        assert_eq!(transition(underway), now.to_string());
    }
}
