//! systemd-logind: the delay inhibitor lock that lets the agent drain before a shutdown.
//!
//! A `delay` lock for `shutdown` makes logind announce a shutdown with `PrepareForShutdown(true)`
//! and then wait — until every holder has closed its lock fd, or at most `InhibitDelayMaxUSec` —
//! before it asks systemd to start `poweroff.target`. That window is where the drain runs, so its
//! deadline is derived from logind's cap ([`drain_deadline`]), and a cap too short for the
//! configured drain is raised with a drop-in and a SIGHUP at start. The decisions here are pure;
//! `client.rs` talks D-Bus (zbus, logind-zbus proxies, properties never cached because logind
//! declares `InhibitDelayMaxUSec` constant yet changes it on reload).

pub mod client;
pub mod monitor;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ShutdownPolicy, ShutdownSettings};

pub use client::{Error, Heard, Logind, LogindEvent};

/// `who` of nodeward's lock, as `systemd-inhibit --list` shows it.
pub const WHO: &str = "nodeward";
/// `why` of nodeward's lock.
pub const WHY: &str = "draining Kubernetes node before shutdown";

/// The kind of shutdown logind announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShutdownKind {
    /// power-off or halt: the machine is going away (scale-in) or down for a while.
    PowerOff,
    /// reboot, kexec or soft-reboot: the machine comes back.
    Reboot,
    /// logind did not say (systemd < 255 sends no metadata) or said something new.
    Unknown,
}

impl ShutdownKind {
    /// From the `type` of `PrepareForShutdownWithMetadata` (systemd 255+).
    pub fn from_metadata_type(t: &str) -> Self {
        match t {
            "power-off" | "poweroff" | "halt" => Self::PowerOff,
            "reboot" | "kexec" | "soft-reboot" => Self::Reboot,
            _ => Self::Unknown,
        }
    }
}

/// The configured policy for a kind of shutdown.
pub fn policy_for(kind: ShutdownKind, s: &ShutdownSettings) -> ShutdownPolicy {
    match kind {
        ShutdownKind::PowerOff => s.on_poweroff,
        ShutdownKind::Reboot => s.on_reboot,
        ShutdownKind::Unknown => s.on_unknown,
    }
}

/// The shutdown drain's deadline: logind's cap less the margin, and no more than the drain
/// timeout. With a cap at or below the margin (logind left at a tiny value), half the cap, so
/// the drain still gets a chance and the lock is still released before logind gives up.
pub fn drain_deadline(cap: Duration, margin: Duration, timeout: Duration) -> Duration {
    let usable = cap.checked_sub(margin).filter(|d| !d.is_zero());
    usable.unwrap_or(cap / 2).min(timeout)
}

/// Whether logind's cap is too short for the configured drain plus margin.
pub fn cap_too_short(cap: Duration, drain_timeout: Duration, margin: Duration) -> bool {
    cap < drain_timeout.saturating_add(margin)
}

/// The `InhibitDelayMaxSec` to configure: the configured value, or drain plus margin if that is
/// longer (whole seconds, rounded up).
pub fn wanted_cap(s: &ShutdownSettings, drain_timeout: Duration) -> Duration {
    let need = drain_timeout.saturating_add(s.safety_margin);
    let secs = need.as_secs() + u64::from(need.subsec_nanos() > 0);
    s.inhibit_delay_max.max(Duration::from_secs(secs))
}

/// The logind drop-in that sets the cap.
pub fn dropin_text(cap: Duration) -> String {
    let secs = cap.as_secs() + u64::from(cap.subsec_nanos() > 0);
    format!(
        "# Written by nodeward: logind waits this long for nodeward to drain the node before a\n\
         # shutdown. nodeward releases its lock earlier (shutdown.safety_margin) in any case.\n\
         [Login]\nInhibitDelayMaxSec={secs}\n"
    )
}

/// One entry of `ListInhibitors`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InhibitorInfo {
    /// Colon-separated lock types (`shutdown:sleep`).
    pub what: String,
    /// Holder's name.
    pub who: String,
    /// Holder's reason.
    pub why: String,
    /// `delay` or `block`.
    pub mode: String,
    /// Holder's uid.
    pub uid: u32,
    /// Holder's pid.
    pub pid: u32,
}

impl InhibitorInfo {
    /// A delay lock on shutdown.
    pub fn delays_shutdown(&self) -> bool {
        self.mode == "delay" && self.what.split(':').any(|w| w == "shutdown")
    }
}

/// kubelet's own shutdown delay locks: with `shutdownGracePeriod` set, kubelet kills pods
/// (ignoring PodDisruptionBudgets) at the same signal nodeward drains on.
pub fn kubelet_locks(list: &[InhibitorInfo]) -> Vec<&InhibitorInfo> {
    list.iter()
        .filter(|i| i.delays_shutdown() && i.who.to_ascii_lowercase().contains("kubelet"))
        .collect()
}

/// nodeward's own shutdown delay locks held by process `pid`.
pub fn own_locks(list: &[InhibitorInfo], pid: u32) -> Vec<&InhibitorInfo> {
    list.iter()
        .filter(|i| i.delays_shutdown() && i.who == WHO && i.pid == pid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ShutdownSettings {
        crate::config::Settings::default().shutdown
    }

    #[test]
    fn kinds_from_metadata() {
        for (t, k) in [
            ("power-off", ShutdownKind::PowerOff),
            ("halt", ShutdownKind::PowerOff),
            ("reboot", ShutdownKind::Reboot),
            ("kexec", ShutdownKind::Reboot),
            ("soft-reboot", ShutdownKind::Reboot),
            ("hibernate-ish", ShutdownKind::Unknown),
            ("", ShutdownKind::Unknown),
        ] {
            assert_eq!(ShutdownKind::from_metadata_type(t), k, "{t}");
        }
    }

    #[test]
    fn policies_by_kind() {
        let mut s = settings();
        s.on_reboot = ShutdownPolicy::Cordon;
        s.on_unknown = ShutdownPolicy::Nothing;
        assert_eq!(
            policy_for(ShutdownKind::PowerOff, &s),
            ShutdownPolicy::Drain
        );
        assert_eq!(policy_for(ShutdownKind::Reboot, &s), ShutdownPolicy::Cordon);
        assert_eq!(
            policy_for(ShutdownKind::Unknown, &s),
            ShutdownPolicy::Nothing
        );
    }

    #[test]
    fn deadlines() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // (cap, margin, timeout) -> deadline
        let cases = [
            (s(120), s(5), s(90), s(90)),
            (s(60), s(5), s(90), s(55)),
            (s(5), s(5), s(90), ms(2500)),
            (s(4), s(5), s(90), s(2)),
            (s(3), ms(500), s(2), s(2)),
            (Duration::ZERO, s(5), s(90), Duration::ZERO),
        ];
        for (cap, margin, timeout, want) in cases {
            let got = drain_deadline(cap, margin, timeout);
            assert_eq!(
                got, want,
                "cap {cap:?} margin {margin:?} timeout {timeout:?}"
            );
            assert!(got <= cap, "never past logind's cap");
        }
    }

    #[test]
    fn cap_checks_and_dropin() {
        let s = settings();
        assert!(cap_too_short(
            Duration::from_secs(5),
            Duration::from_secs(90),
            s.safety_margin
        ));
        assert!(!cap_too_short(
            Duration::from_secs(95),
            Duration::from_secs(90),
            s.safety_margin
        ));
        assert_eq!(
            wanted_cap(&s, Duration::from_secs(90)),
            Duration::from_secs(120)
        );
        assert_eq!(
            wanted_cap(&s, Duration::from_millis(200_500)),
            Duration::from_secs(206),
            "drain plus margin, rounded up, when longer than the configured cap"
        );
        let text = dropin_text(Duration::from_secs(120));
        assert!(text.contains("[Login]\nInhibitDelayMaxSec=120\n"), "{text}");
    }

    #[test]
    fn finds_kubelet_and_own_locks() {
        let lock = |what: &str, who: &str, mode: &str, pid: u32| InhibitorInfo {
            what: what.into(),
            who: who.into(),
            why: "x".into(),
            mode: mode.into(),
            uid: 0,
            pid,
        };
        let list = vec![
            lock("shutdown", "kubelet", "delay", 10),
            lock("sleep", "kubelet", "delay", 10),
            lock("shutdown:sleep", "Kubelet graceful shutdown", "delay", 11),
            lock("shutdown", "kubelet", "block", 12),
            lock("shutdown", WHO, "delay", 42),
            lock("shutdown", WHO, "delay", 43),
        ];
        let k: Vec<u32> = kubelet_locks(&list).iter().map(|i| i.pid).collect();
        assert_eq!(k, [10, 11]);
        assert_eq!(own_locks(&list, 42).len(), 1);
    }
}
