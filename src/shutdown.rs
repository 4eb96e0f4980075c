//! `nodeward drain` as `nodeward-drain.service`'s ExecStop during a system shutdown: the same
//! `[shutdown]` policy as the agent, and never a drain the agent already did.
//!
//! The unit catches the shutdowns that bypass logind (`systemctl isolate poweroff.target`, a
//! shutdown while the agent is not running). When logind announced the shutdown, the agent has
//! already applied the policy and released its lock by the time systemd stops the unit; its
//! status file (under /run, so of this boot) says so, and the unit then does nothing — no second
//! full drain after the agent's drain gave up at its deadline, and no Events. What kind of
//! shutdown it is comes from systemd's job queue (`poweroff.target` or `reboot.target` being
//! started), since no PrepareForShutdown reaches the unit.

use std::time::Duration;

use crate::agent::state::Phase;
use crate::agent::status::{ShutdownOutcome, Status};
use crate::config::{ShutdownPolicy, ShutdownSettings};
use crate::logind::{self, ShutdownKind};

/// How long a `systemctl` query may take before the answer counts as "don't know".
const SYSTEMCTL_TIMEOUT: Duration = Duration::from_secs(2);

/// What the unit does at a shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitAction {
    /// The agent finished its drain for this shutdown (with this outcome): nothing to do.
    AgentDone(Option<ShutdownOutcome>),
    /// Apply the policy for this kind of shutdown.
    Apply(ShutdownKind, ShutdownPolicy),
}

/// Decides what the unit does, from the agent's status (if it could be read) and the kind of
/// shutdown systemd is performing.
pub fn unit_action(agent: Option<&Status>, kind: ShutdownKind, s: &ShutdownSettings) -> UnitAction {
    match agent {
        Some(st) if st.phase == Phase::Drained => {
            UnitAction::AgentDone(st.last_drain.as_ref().map(|d| d.outcome.clone()))
        }
        _ => UnitAction::Apply(kind, logind::policy_for(kind, s)),
    }
}

/// At a system shutdown, what `nodeward drain` (the unit's ExecStop) does instead of a full
/// drain; `None` outside a shutdown (an operator's `systemctl stop nodeward-drain`).
pub async fn for_this_shutdown(settings: &crate::config::Settings) -> Option<UnitAction> {
    let kind = system_shutdown().await?;
    let agent = crate::agent::status::read(&settings.agent.status_file).ok();
    Some(unit_action(agent.as_ref(), kind, &settings.shutdown))
}

/// The kind of shutdown from `systemctl list-jobs --no-legend --plain` (lines of `JOB UNIT TYPE
/// STATE`): the target being started tells.
pub fn kind_from_jobs(jobs: &str) -> ShutdownKind {
    let mut kind = ShutdownKind::Unknown;
    for line in jobs.lines() {
        let mut cols = line.split_whitespace().skip(1);
        let (Some(unit), Some("start")) = (cols.next(), cols.next()) else {
            continue;
        };
        match unit {
            "poweroff.target" | "halt.target" => return ShutdownKind::PowerOff,
            "reboot.target" | "kexec.target" | "soft-reboot.target" => kind = ShutdownKind::Reboot,
            _ => {}
        }
    }
    kind
}

/// Whether systemd is shutting the machine down, and if so which kind of shutdown: `None` when
/// `systemctl is-system-running` does not say "stopping" (an operator's `systemctl stop`, or no
/// systemd at all).
async fn system_shutdown() -> Option<ShutdownKind> {
    if systemctl(&["is-system-running"]).await?.trim() != "stopping" {
        return None;
    }
    let jobs = systemctl(&["list-jobs", "--no-legend", "--plain"])
        .await
        .unwrap_or_default();
    Some(kind_from_jobs(&jobs))
}

/// `systemctl ARGS`'s standard output, or `None` when it cannot run in time.
async fn systemctl(args: &[&str]) -> Option<String> {
    let run = tokio::process::Command::new("systemctl")
        .args(args)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(SYSTEMCTL_TIMEOUT, run).await {
        Ok(Ok(out)) => Some(String::from_utf8_lossy(&out.stdout).into_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_comes_from_the_target_being_started() {
        let cases = [
            (
                "1 poweroff.target start waiting\n2 kubelet.service stop running\n",
                ShutdownKind::PowerOff,
            ),
            ("7 reboot.target start waiting\n", ShutdownKind::Reboot),
            ("7 kexec.target start waiting\n", ShutdownKind::Reboot),
            ("3 halt.target start waiting\n", ShutdownKind::PowerOff),
            (
                "4 nodeward-drain.service stop running\n",
                ShutdownKind::Unknown,
            ),
            ("5 reboot.target stop waiting\n", ShutdownKind::Unknown),
            ("", ShutdownKind::Unknown),
        ];
        for (jobs, want) in cases {
            assert_eq!(kind_from_jobs(jobs), want, "{jobs:?}");
        }
    }

    fn status(phase: Phase) -> Status {
        Status {
            pid: 1,
            node: "n".into(),
            phase,
            lock: crate::agent::state::Lock::Released,
            lock_takes: 1,
            inhibit_delay_max_ms: None,
            waiting_for: String::new(),
            ready: true,
            node_registered: true,
            gates: Vec::new(),
            not_ready_in_time: false,
            startup_taint: false,
            cordoned_by: None,
            last_drain: None,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn the_unit_applies_the_agents_policy_unless_the_agent_drained() {
        let mut s = crate::config::Settings::default().shutdown;
        s.on_reboot = ShutdownPolicy::Cordon;
        s.on_poweroff = ShutdownPolicy::Drain;
        s.on_unknown = ShutdownPolicy::Nothing;
        let drained = status(Phase::Drained);
        let ready = status(Phase::Ready);
        let cases = [
            (
                Some(&drained),
                ShutdownKind::PowerOff,
                UnitAction::AgentDone(None),
            ),
            (
                Some(&ready),
                ShutdownKind::PowerOff,
                UnitAction::Apply(ShutdownKind::PowerOff, ShutdownPolicy::Drain),
            ),
            (
                None,
                ShutdownKind::Reboot,
                UnitAction::Apply(ShutdownKind::Reboot, ShutdownPolicy::Cordon),
            ),
            (
                Some(&ready),
                ShutdownKind::Unknown,
                UnitAction::Apply(ShutdownKind::Unknown, ShutdownPolicy::Nothing),
            ),
        ];
        for (agent, kind, want) in cases {
            assert_eq!(unit_action(agent, kind, &s), want, "{agent:?} {kind:?}");
        }
    }
}
