//! `nodeward drain` as `nodeward-drain.service`'s ExecStop during a system shutdown: the same
//! `[shutdown]` policy as the agent, and never a drain the agent already did.
//!
//! The unit catches the shutdowns that bypass logind (`systemctl isolate poweroff.target`, a
//! shutdown while the agent is not running). When logind announces a shutdown, the agent drains
//! and stops the unit right away, so that systemd's shutdown later finds it stopped and kubelet
//! (ordered before it) does not wait for its ExecStop. The ExecStop then waits for the agent's
//! outcome in its status file (under /run, so of this boot) and does nothing more — no second
//! full drain after the agent's drain gave up at its deadline, and no Events — unless the agent
//! dies first: then the drain is the unit's. Without the agent, what kind of shutdown it is comes
//! from systemd's job queue (`poweroff.target` or `reboot.target` being started), since no
//! PrepareForShutdown reaches the unit.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::agent::state::Phase;
use crate::agent::status::{ShutdownOutcome, Status};
use crate::config::{OnDeadline, ShutdownPolicy, ShutdownSettings};
use crate::logind::{self, ShutdownKind};
use crate::systemd::Systemd;

/// While the agent drains, its liveness is checked this often (an exit writes no status).
const AGENT_CHECK: Duration = Duration::from_millis(500);

/// What a stopping `nodeward drain` asks systemd for beyond its own deadline: starting, asking
/// systemd, connecting, cordoning, the deadline fallback's deletions, reporting.
pub const STOP_SLACK: Duration = Duration::from_secs(30);

/// How long systemd should wait for `nodeward drain` as a unit's ExecStop, from when it starts
/// the work bounded by `timeout`: that deadline plus [`STOP_SLACK`]. `None` for
/// `on_deadline = "wait"`, a drain without an end to announce: then the unit's
/// `TimeoutStopSec=` alone bounds it.
pub fn stop_budget(timeout: Duration, on_deadline: OnDeadline) -> Option<Duration> {
    (on_deadline != OnDeadline::Wait).then(|| timeout.saturating_add(STOP_SLACK))
}

/// What the unit does at a shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitAction {
    /// The agent finished its drain for this shutdown (with this outcome): nothing to do.
    AgentDone(Option<ShutdownOutcome>),
    /// The agent stopped the unit for a shutdown that was then cancelled: nothing to do (the
    /// agent starts the unit again).
    Cancelled,
    /// Apply the policy for this kind of shutdown.
    Apply(ShutdownKind, ShutdownPolicy),
}

/// What the agent's status file says about a shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSays {
    /// The agent (still running) drains for a shutdown logind announced: wait for its outcome.
    Draining,
    /// The agent drained for this shutdown, with this outcome.
    Done(Option<ShutdownOutcome>),
    /// The agent stopped draining without an outcome: the shutdown was cancelled.
    Cancelled,
    /// The agent was draining for a shutdown and is gone: the shutdown is underway, and the
    /// drain is the unit's.
    Died,
    /// The agent's drain ended because the API server refused its credentials (401): a
    /// client certificate kubelet rotated after the agent built its client. The drain is the
    /// unit's, whose client is built now.
    Unauthorized,
    /// Nothing about a shutdown (no file, or an agent not in a shutdown).
    Nothing,
}

/// Reads the agent's status (`None`: no file) with `alive` telling whether its pid runs.
pub fn agent_says(agent: Option<&Status>, alive: impl FnOnce(u32) -> bool) -> AgentSays {
    match agent {
        Some(st) if st.phase == Phase::Drained => {
            match st.last_drain.as_ref().map(|d| &d.outcome) {
                Some(ShutdownOutcome::Unauthorized(_)) => AgentSays::Unauthorized,
                outcome => AgentSays::Done(outcome.cloned()),
            }
        }
        Some(st) if st.phase == Phase::Draining && alive(st.pid) => AgentSays::Draining,
        Some(st) if st.phase == Phase::Draining => AgentSays::Died,
        _ => AgentSays::Nothing,
    }
}

/// While waiting for the agent with `pid`, which was draining: what the status file says now.
/// An agent back to any other phase under the same pid saw the shutdown cancelled; a new pid
/// means the draining agent died (and was started again).
pub fn after_waiting(pid: u32, now: Option<&Status>, alive: impl FnOnce(u32) -> bool) -> AgentSays {
    match agent_says(now, alive) {
        AgentSays::Nothing if now.is_some_and(|st| st.pid == pid) => AgentSays::Cancelled,
        AgentSays::Nothing => AgentSays::Died,
        says => says,
    }
}

/// Decides what the unit does, from what the agent says and — when the agent has not handled
/// the shutdown — the kind of shutdown systemd performs.
pub fn unit_action(agent: &AgentSays, kind: ShutdownKind, s: &ShutdownSettings) -> UnitAction {
    match agent {
        AgentSays::Done(outcome) => UnitAction::AgentDone(outcome.clone()),
        AgentSays::Cancelled => UnitAction::Cancelled,
        _ => UnitAction::Apply(kind, logind::policy_for(kind, s)),
    }
}

/// At a system shutdown, what `nodeward drain` (the unit's ExecStop) does instead of a full
/// drain; `None` outside a shutdown (an operator's `systemctl stop nodeward-drain`). systemd is
/// asked only when the agent's status does not already tell, and only over one connection
/// within [`crate::systemd::TIMEOUT`] in all.
pub async fn for_this_shutdown(settings: &crate::config::Settings) -> Option<UnitAction> {
    let path = &settings.agent.status_file;
    let agent = crate::agent::status::read(path).ok();
    let says = match agent_says(agent.as_ref(), crate::agent::status::alive) {
        AgentSays::Draining => {
            let pid = agent.as_ref().map_or(0, |st| st.pid);
            info!(
                pid,
                "the agent drains for this shutdown; waiting for its outcome"
            );
            // The agent's deadline is at most drain.timeout (logind's cap may shorten it).
            crate::systemd::extend_stop_timeout(settings.drain.timeout.saturating_add(STOP_SLACK));
            wait_for_agent(path, pid).await
        }
        says => says,
    };
    let kind = match says {
        AgentSays::Done(_) | AgentSays::Cancelled => ShutdownKind::Unknown,
        AgentSays::Died => {
            warn!("the agent died while it drained for this shutdown; the drain is this unit's");
            shutdown_kind(true).await?
        }
        AgentSays::Unauthorized => {
            warn!(
                "the API server refused the agent's credentials; the drain is this unit's, with a client built now"
            );
            shutdown_kind(true).await?
        }
        AgentSays::Nothing | AgentSays::Draining => shutdown_kind(false).await?,
    };
    Some(unit_action(&says, kind, &settings.shutdown))
}

/// The kind of shutdown systemd performs (from its job queue; `Unknown` without an answer), or
/// `None` when it is not shutting down or cannot say so. With `stopping` already known (the
/// agent said a shutdown was underway), only the job queue is asked.
async fn shutdown_kind(stopping: bool) -> Option<ShutdownKind> {
    let until = Instant::now() + crate::systemd::TIMEOUT;
    let systemd = answer(until, Systemd::connect()).await;
    let stopping = match &systemd {
        Some(sd) if !stopping => answer(until, sd.stopping()).await == Some(true),
        _ => stopping,
    };
    if !stopping {
        return None;
    }
    let kind = match &systemd {
        Some(sd) => answer(until, sd.kind()).await,
        None => None,
    };
    Some(kind.unwrap_or(ShutdownKind::Unknown))
}

/// systemd's answer by `until`; `None` (logged) when there is none.
async fn answer<T>(
    until: Instant,
    question: impl std::future::Future<Output = zbus::Result<T>>,
) -> Option<T> {
    match tokio::time::timeout_at(until, question).await {
        Ok(Ok(t)) => Some(t),
        Ok(Err(e)) => {
            warn!(error = %e, "cannot ask systemd");
            None
        }
        Err(_) => {
            warn!("systemd did not answer in time");
            None
        }
    }
}

/// Waits while the status file says that the agent with `pid` drains; returns what it says then
/// ([`after_waiting`]: its outcome, a cancelled shutdown, or its death). Woken by inotify on the
/// file's directory, and every [`AGENT_CHECK`] to see whether the agent still runs.
async fn wait_for_agent(path: &Path, pid: u32) -> AgentSays {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watch = crate::gate::watch::FileWatcher::new(vec![path.to_path_buf()], tx);
    if let Err(e) = &watch {
        warn!(error = %e, "cannot watch the agent's status file; reading it every {AGENT_CHECK:?}");
    }
    loop {
        let now = crate::agent::status::read(path).ok();
        let says = after_waiting(pid, now.as_ref(), crate::agent::status::alive);
        if says != AgentSays::Draining || now.as_ref().is_some_and(|st| st.pid != pid) {
            return says;
        }
        tokio::select! {
            Some(()) = rx.recv() => {}
            () = tokio::time::sleep(AGENT_CHECK) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(pid: u32, phase: Phase) -> Status {
        Status {
            pid,
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
            draining: None,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn the_agents_status_says_whether_to_wait_do_nothing_or_drain() {
        let alive = |_| true;
        let dead = |_| false;
        let cases = [
            (None, true, AgentSays::Nothing),
            (Some(status(7, Phase::Ready)), true, AgentSays::Nothing),
            (Some(status(7, Phase::Draining)), true, AgentSays::Draining),
            (Some(status(7, Phase::Draining)), false, AgentSays::Died),
            (
                Some(status(7, Phase::Drained)),
                false,
                AgentSays::Done(None),
            ),
        ];
        for (st, running, want) in cases {
            let got = if running {
                agent_says(st.as_ref(), alive)
            } else {
                agent_says(st.as_ref(), dead)
            };
            assert_eq!(got, want, "{st:?} running {running}");
        }
    }

    /// The agent's drain met a 401: its client held a certificate kubelet had rotated away. A
    /// fresh client (this unit's own process) would work, so the drain is the unit's; any other
    /// outcome stands (issue 41, defect 4).
    #[test]
    fn a_drain_the_api_server_refused_the_agents_credentials_for_is_the_units() {
        let summary = crate::agent::status::DrainSummary::of;
        let mut st = status(7, Phase::Drained);
        st.last_drain = Some(summary(ShutdownOutcome::Unauthorized("401".into())));
        assert_eq!(agent_says(Some(&st), |_| false), AgentSays::Unauthorized);
        st.last_drain = Some(summary(ShutdownOutcome::Failed("403".into())));
        assert!(matches!(
            agent_says(Some(&st), |_| false),
            AgentSays::Done(Some(ShutdownOutcome::Failed(_)))
        ));
        let s = crate::config::Settings::default().shutdown;
        assert!(matches!(
            unit_action(&AgentSays::Unauthorized, ShutdownKind::PowerOff, &s),
            UnitAction::Apply(ShutdownKind::PowerOff, _)
        ));
    }

    #[test]
    fn after_waiting_a_new_agent_means_the_draining_one_died() {
        let alive = |_| true;
        let ready = status(7, Phase::Ready);
        assert_eq!(after_waiting(7, Some(&ready), alive), AgentSays::Cancelled);
        let restarted = status(8, Phase::Booting);
        assert_eq!(after_waiting(7, Some(&restarted), alive), AgentSays::Died);
        assert_eq!(after_waiting(7, None, alive), AgentSays::Died);
        let drained = status(7, Phase::Drained);
        assert_eq!(
            after_waiting(7, Some(&drained), alive),
            AgentSays::Done(None)
        );
    }

    #[test]
    fn the_unit_applies_the_agents_policy_unless_the_agent_drained() {
        let mut s = crate::config::Settings::default().shutdown;
        s.on_reboot = ShutdownPolicy::Cordon;
        s.on_poweroff = ShutdownPolicy::Drain;
        s.on_unknown = ShutdownPolicy::Nothing;
        let cases = [
            (
                AgentSays::Done(None),
                ShutdownKind::PowerOff,
                UnitAction::AgentDone(None),
            ),
            (
                AgentSays::Cancelled,
                ShutdownKind::Unknown,
                UnitAction::Cancelled,
            ),
            (
                AgentSays::Nothing,
                ShutdownKind::PowerOff,
                UnitAction::Apply(ShutdownKind::PowerOff, ShutdownPolicy::Drain),
            ),
            (
                AgentSays::Died,
                ShutdownKind::Reboot,
                UnitAction::Apply(ShutdownKind::Reboot, ShutdownPolicy::Cordon),
            ),
            (
                AgentSays::Nothing,
                ShutdownKind::Unknown,
                UnitAction::Apply(ShutdownKind::Unknown, ShutdownPolicy::Nothing),
            ),
        ];
        for (agent, kind, want) in cases {
            assert_eq!(unit_action(&agent, kind, &s), want, "{agent:?} {kind:?}");
        }
    }

    #[test]
    fn the_unit_asks_for_its_deadline_plus_slack_unless_it_waits_past_it() {
        let secs = Duration::from_secs;
        assert_eq!(stop_budget(secs(90), OnDeadline::Abandon), Some(secs(120)));
        assert_eq!(stop_budget(secs(300), OnDeadline::Delete), Some(secs(330)));
        assert_eq!(stop_budget(secs(300), OnDeadline::Wait), None);
        assert_eq!(
            stop_budget(Duration::MAX, OnDeadline::Abandon),
            Some(Duration::MAX)
        );
    }
}
