//! `nodeward drain` as `nodeward-drain.service`'s ExecStop during a system shutdown: the same
//! `[shutdown]` policy as the agent, and never a drain the agent already did.
//!
//! The unit catches the shutdowns that bypass logind (`systemctl isolate poweroff.target`, a
//! shutdown while the agent is not running). When logind announced the shutdown, the agent has
//! already applied the policy and released its lock by the time systemd stops the unit; its
//! status file (under /run, so of this boot) says so, and the unit then does nothing — no second
//! full drain after the agent's drain gave up at its deadline, and no Events. What kind of
//! shutdown it is comes from systemd's job queue (`poweroff.target` or `reboot.target` being
//! started), since no PrepareForShutdown reaches the unit. Both questions go to PID 1 over D-Bus,
//! as `systemctl` would, but without a `systemctl` process.

use std::time::Duration;

use zbus::proxy::CacheProperties;
use zbus::zvariant::OwnedObjectPath;

use crate::agent::state::Phase;
use crate::agent::status::{ShutdownOutcome, Status};
use crate::config::{ShutdownPolicy, ShutdownSettings};
use crate::logind::{self, ShutdownKind};

/// How long asking systemd may take before the answer counts as "don't know".
const SYSTEMD_TIMEOUT: Duration = Duration::from_secs(2);

/// What the unit does at a shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitAction {
    /// The agent finished its drain for this shutdown (with this outcome): nothing to do.
    AgentDone(Option<ShutdownOutcome>),
    /// Apply the policy for this kind of shutdown.
    Apply(ShutdownKind, ShutdownPolicy),
}

/// [`UnitAction::AgentDone`] when the agent's status says it drained for this shutdown.
pub fn agent_done(agent: Option<&Status>) -> Option<UnitAction> {
    agent
        .filter(|st| st.phase == Phase::Drained)
        .map(|st| UnitAction::AgentDone(st.last_drain.as_ref().map(|d| d.outcome.clone())))
}

/// Decides what the unit does, from the agent's status (if it could be read) and the kind of
/// shutdown systemd is performing.
pub fn unit_action(agent: Option<&Status>, kind: ShutdownKind, s: &ShutdownSettings) -> UnitAction {
    agent_done(agent).unwrap_or_else(|| UnitAction::Apply(kind, logind::policy_for(kind, s)))
}

/// At a system shutdown, what `nodeward drain` (the unit's ExecStop) does instead of a full
/// drain; `None` outside a shutdown (an operator's `systemctl stop nodeward-drain`). The job
/// queue is only read when the agent has not already handled the shutdown.
pub async fn for_this_shutdown(settings: &crate::config::Settings) -> Option<UnitAction> {
    let systemd = tokio::time::timeout(SYSTEMD_TIMEOUT, Systemd::connect())
        .await
        .ok()?
        .ok()?;
    if !systemd.stopping().await {
        return None;
    }
    let agent = crate::agent::status::read(&settings.agent.status_file).ok();
    if let Some(done) = agent_done(agent.as_ref()) {
        return Some(done);
    }
    let kind = systemd.kind().await;
    Some(unit_action(agent.as_ref(), kind, &settings.shutdown))
}

/// The kind of shutdown from systemd's job queue, as `(unit, job type)` pairs: the target being
/// started tells.
pub fn kind_from_jobs<'a>(jobs: impl IntoIterator<Item = (&'a str, &'a str)>) -> ShutdownKind {
    let mut kind = ShutdownKind::Unknown;
    for (unit, job_type) in jobs {
        if job_type != "start" {
            continue;
        }
        match unit {
            "poweroff.target" | "halt.target" => return ShutdownKind::PowerOff,
            "reboot.target" | "kexec.target" | "soft-reboot.target" => kind = ShutdownKind::Reboot,
            _ => {}
        }
    }
    kind
}

/// PID 1's manager interface on the system bus. The unit is ordered after dbus.service, so the
/// bus is still up when systemd stops the unit. Asking over D-Bus costs no `systemctl` process in
/// the shutdown's critical path (kubelet waits for this unit): two of those took most of the
/// unit's 3.6 s ExecStop under the bench's emulated CPU. (PID 1's private socket would spare the
/// bus, but zbus rejects the sender field systemd puts on its messages there.)
struct Systemd(zbus::Proxy<'static>);

/// One entry of `ListJobs`: id, unit, job type, state, job path, unit path.
type Job = (
    u32,
    String,
    String,
    String,
    OwnedObjectPath,
    OwnedObjectPath,
);

impl Systemd {
    async fn connect() -> zbus::Result<Self> {
        let conn = zbus::Connection::system().await?;
        let proxy = zbus::proxy::Builder::new(&conn)
            .destination("org.freedesktop.systemd1")?
            .path("/org/freedesktop/systemd1")?
            .interface("org.freedesktop.systemd1.Manager")?
            .cache_properties(CacheProperties::No)
            .build()
            .await?;
        Ok(Self(proxy))
    }

    /// Whether systemd is shutting the machine down (`SystemState` is "stopping"); `false`
    /// when it does not answer in time.
    async fn stopping(&self) -> bool {
        let state = self.0.get_property::<String>("SystemState");
        matches!(
            tokio::time::timeout(SYSTEMD_TIMEOUT, state).await,
            Ok(Ok(s)) if s == "stopping"
        )
    }

    /// The kind of shutdown systemd performs, `Unknown` when it does not answer in time.
    async fn kind(&self) -> ShutdownKind {
        let jobs = self.0.call::<_, _, Vec<Job>>("ListJobs", &());
        match tokio::time::timeout(SYSTEMD_TIMEOUT, jobs).await {
            Ok(Ok(jobs)) => kind_from_jobs(jobs.iter().map(|j| (j.1.as_str(), j.2.as_str()))),
            _ => ShutdownKind::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_comes_from_the_target_being_started() {
        let cases: [(&[(&str, &str)], ShutdownKind); 7] = [
            (
                &[("poweroff.target", "start"), ("kubelet.service", "stop")],
                ShutdownKind::PowerOff,
            ),
            (&[("reboot.target", "start")], ShutdownKind::Reboot),
            (&[("kexec.target", "start")], ShutdownKind::Reboot),
            (&[("halt.target", "start")], ShutdownKind::PowerOff),
            (&[("nodeward-drain.service", "stop")], ShutdownKind::Unknown),
            (&[("reboot.target", "stop")], ShutdownKind::Unknown),
            (&[], ShutdownKind::Unknown),
        ];
        for (jobs, want) in cases {
            assert_eq!(kind_from_jobs(jobs.iter().copied()), want, "{jobs:?}");
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
