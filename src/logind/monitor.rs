//! Which shutdown logind is about to announce, where logind does not say (systemd < 255).
//!
//! systemd 252 (Debian 12) sends a plain `PrepareForShutdown(true)`, and starts `poweroff.target`
//! or `reboot.target` only once every delay lock is released, so neither the signal nor
//! systemd's job queue tells a power-off from a reboot while the agent drains. What does tell is
//! the call that asked for it: `PowerOff`, `Reboot`, `Halt`, `KExec` (and their `…WithFlags`) or
//! `ScheduleShutdown` to `org.freedesktop.login1`. As root, the agent watches the system bus for
//! those calls with `org.freedesktop.DBus.Monitoring.BecomeMonitor` on a connection of its own
//! (a monitor may send nothing more), remembers the last one with its time, and
//! [`decide_kind`] uses it when nothing better says, if it is recent. When unsure, the kind
//! stays [`ShutdownKind::Unknown`], which the out-of-service taint treats as a reboot.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::ShutdownKind;
use super::client::LOGIN1;

/// logind's manager interface, whose calls are watched.
const MANAGER: &str = "org.freedesktop.login1.Manager";

/// The calls to logind that ask for a shutdown now (or cancel a scheduled one).
const MEMBERS: &[&str] = &[
    "PowerOff",
    "PowerOffWithFlags",
    "Halt",
    "HaltWithFlags",
    "Reboot",
    "RebootWithFlags",
    "KExec",
    "KExecWithFlags",
    "SoftReboot",
    "SoftRebootWithFlags",
    "ScheduleShutdown",
    "CancelScheduledShutdown",
];

/// A call at most this old when `PrepareForShutdown(true)` arrives names its shutdown: logind
/// announces a shutdown within milliseconds of the call (its polkit check included), while a
/// minute leaves room for a slow machine and nothing for an unrelated call long before.
pub const RECENT: Duration = Duration::from_secs(60);

/// A scheduled shutdown may fire this much before its time on the agent's clock (logind's timer
/// and the agent read one wall clock; this only absorbs rounding).
const EARLY: Duration = Duration::from_secs(5);

/// After the monitor connection fails (no bus, the bus restarted), it is made again after this,
/// doubling up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest wait between attempts: a bus that comes back is watched again within it.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The last call to logind that asked for a shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Called {
    /// The kind it asked for.
    pub kind: ShutdownKind,
    /// The method (`PowerOff`, `ScheduleShutdown`, …), for the logs.
    pub method: String,
    /// When the shutdown it asked for begins: the call's arrival, or a scheduled shutdown's time.
    pub at: jiff::Timestamp,
}

/// What one watched call means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallMeaning {
    /// A shutdown of this kind, at once (`at: None`) or at a scheduled time (microseconds of
    /// `CLOCK_REALTIME`, as `ScheduleShutdown` takes it).
    Shutdown(ShutdownKind, Option<u64>),
    /// `CancelScheduledShutdown`: forget a scheduled one.
    Cancel,
}

/// What the call `member` (with `ScheduleShutdown`'s `(type, usec)` arguments) means; `None` for
/// anything that asks for no shutdown (a `dry-` scheduled one, an unknown type or member).
pub fn meaning(member: &str, schedule: Option<(&str, u64)>) -> Option<CallMeaning> {
    let now = |kind| Some(CallMeaning::Shutdown(kind, None));
    match member.strip_suffix("WithFlags").unwrap_or(member) {
        "PowerOff" | "Halt" => now(ShutdownKind::PowerOff),
        "Reboot" | "KExec" | "SoftReboot" => now(ShutdownKind::Reboot),
        "CancelScheduledShutdown" => Some(CallMeaning::Cancel),
        "ScheduleShutdown" => {
            let (kind, usec) = schedule?;
            match ShutdownKind::from_metadata_type(kind) {
                ShutdownKind::Unknown => None,
                k => Some(CallMeaning::Shutdown(k, Some(usec))),
            }
        }
        _ => None,
    }
}

/// The last call as it stands after a call meaning `m` arrived at `now`.
pub fn remember(m: CallMeaning, method: &str, now: jiff::Timestamp) -> Option<Called> {
    match m {
        CallMeaning::Cancel => None,
        CallMeaning::Shutdown(kind, usec) => {
            let at = usec
                .filter(|u| *u > 0)
                .and_then(|u| i64::try_from(u).ok())
                .and_then(|u| jiff::Timestamp::from_microsecond(u).ok())
                .unwrap_or(now);
            Some(Called {
                kind,
                method: method.to_string(),
                at,
            })
        }
    }
}

/// The kind of the shutdown just announced, from what each source says: logind's own metadata
/// (systemd 255+), else the last call to logind if it was [`RECENT`] at `now`.
/// [`ShutdownKind::Unknown`] when neither says. (systemd's job queue is no source here: logind
/// queues the target only after the delay locks are gone, when the agent has decided.)
pub fn decide_kind(
    metadata: Option<ShutdownKind>,
    called: Option<&Called>,
    now: jiff::Timestamp,
) -> ShutdownKind {
    if let Some(k) = metadata.filter(|k| *k != ShutdownKind::Unknown) {
        return k;
    }
    let recent = |c: &&Called| {
        let age = now.duration_since(c.at);
        age >= -jiff::SignedDuration::try_from(EARLY).unwrap_or_default()
            && age <= jiff::SignedDuration::try_from(RECENT).unwrap_or_default()
    };
    called
        .filter(recent)
        .map_or(ShutdownKind::Unknown, |c| c.kind)
}

/// The match rules given to `BecomeMonitor`: method calls of [`MEMBERS`] on logind's manager.
fn rules() -> Vec<String> {
    MEMBERS
        .iter()
        .map(|m| format!("type='method_call',interface='{MANAGER}',member='{m}'"))
        .collect()
}

/// Watches the system bus for calls to logind asking for a shutdown and publishes the last one
/// in `last`, for as long as anyone holds a receiver. Reconnects after the bus is lost; stops
/// when the bus refuses to make it a monitor (not root), which it logs once.
pub async fn run(last: watch::Sender<Option<Called>>) {
    let mut wait = RETRY_MIN;
    let mut said = None;
    while !last.is_closed() {
        match watch_once(&last).await {
            Err(e) if is_refused(&e) => {
                warn!(error = %e, "the system bus refuses to let the agent watch calls to logind (it must run as root); a systemd 252 shutdown's kind stays unknown, treated as a reboot");
                return;
            }
            Err(e) => {
                let text = e.to_string();
                if said.as_ref() != Some(&text) {
                    warn!(error = %text, retry_in = ?wait, "cannot watch calls to logind");
                    said = Some(text);
                }
            }
            Ok(()) => {
                debug!("the monitor connection ended; watching again");
                wait = RETRY_MIN;
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RETRY_MAX);
    }
}

fn is_refused(e: &zbus::Error) -> bool {
    match e {
        zbus::Error::MethodError(name, _, _) => {
            name.as_str() == "org.freedesktop.DBus.Error.AccessDenied"
        }
        zbus::Error::FDO(e) => matches!(**e, zbus::fdo::Error::AccessDenied(_)),
        _ => false,
    }
}

/// One monitor connection, until the bus drops it.
async fn watch_once(last: &watch::Sender<Option<Called>>) -> zbus::Result<()> {
    let conn = zbus::Connection::system().await?;
    conn.call_method(
        Some("org.freedesktop.DBus"),
        "/org/freedesktop/DBus",
        Some("org.freedesktop.DBus.Monitoring"),
        "BecomeMonitor",
        &(rules(), 0u32),
    )
    .await?;
    info!("watching the system bus for calls to logind that ask for a shutdown");
    // From here on the connection only receives: a monitor that sends is disconnected.
    let mut messages = zbus::MessageStream::from(conn);
    while let Some(msg) = messages.next().await {
        let msg = msg?;
        let header = msg.header();
        let to_logind = header.destination().is_none_or(|d| d.as_str() == LOGIN1);
        let Some(member) = header.member().filter(|_| to_logind) else {
            continue;
        };
        let member = member.to_string();
        let schedule: Option<(String, u64)> = (member == "ScheduleShutdown")
            .then(|| msg.body().deserialize().ok())
            .flatten();
        let schedule = schedule.as_ref().map(|(t, u)| (t.as_str(), *u));
        if let Some(m) = meaning(&member, schedule) {
            let called = remember(m, &member, jiff::Timestamp::now());
            info!(method = %member, kind = ?called.as_ref().map(|c| c.kind), "a call to logind asks for a shutdown");
            last.send_replace(called);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn each_call_means_its_kind() {
        use CallMeaning::*;
        use ShutdownKind::*;
        type Case = (
            &'static str,
            Option<(&'static str, u64)>,
            Option<CallMeaning>,
        );
        let cases: [Case; 12] = [
            ("PowerOff", None, Some(Shutdown(PowerOff, None))),
            ("PowerOffWithFlags", None, Some(Shutdown(PowerOff, None))),
            ("Halt", None, Some(Shutdown(PowerOff, None))),
            ("Reboot", None, Some(Shutdown(Reboot, None))),
            ("RebootWithFlags", None, Some(Shutdown(Reboot, None))),
            ("KExecWithFlags", None, Some(Shutdown(Reboot, None))),
            ("SoftReboot", None, Some(Shutdown(Reboot, None))),
            (
                "ScheduleShutdown",
                Some(("poweroff", 7)),
                Some(Shutdown(PowerOff, Some(7))),
            ),
            ("ScheduleShutdown", Some(("dry-poweroff", 7)), None),
            ("ScheduleShutdown", None, None),
            ("CancelScheduledShutdown", None, Some(Cancel)),
            ("Suspend", None, None),
        ];
        for (member, schedule, want) in cases {
            assert_eq!(meaning(member, schedule), want, "{member} {schedule:?}");
        }
    }

    #[test]
    fn a_scheduled_shutdown_counts_from_its_time_and_a_cancel_forgets_it() {
        let now = ts("2026-11-28T12:00:00Z");
        let at = ts("2026-11-28T12:05:00Z");
        let usec = u64::try_from(at.as_microsecond()).expect("positive");
        let m = CallMeaning::Shutdown(ShutdownKind::PowerOff, Some(usec));
        let c = remember(m, "ScheduleShutdown", now).expect("remembered");
        assert_eq!(c.at, at);
        let m = CallMeaning::Shutdown(ShutdownKind::Reboot, None);
        assert_eq!(remember(m, "Reboot", now).expect("call").at, now);
        assert_eq!(remember(CallMeaning::Cancel, "x", now), None);
    }

    #[test]
    fn the_kind_comes_from_the_best_source_and_an_old_call_says_nothing() {
        use ShutdownKind::*;
        let now = ts("2026-11-28T12:00:00Z");
        let call = |kind, at: &str| Called {
            kind,
            method: "m".into(),
            at: ts(at),
        };
        let fresh = call(PowerOff, "2026-11-28T11:59:59Z");
        let minute = call(PowerOff, "2026-11-28T11:59:00Z");
        let stale = call(PowerOff, "2026-11-28T11:58:59Z");
        let later = call(PowerOff, "2026-11-28T12:05:00Z");
        let soon = call(PowerOff, "2026-11-28T12:00:03Z");
        let reboot = call(Reboot, "2026-11-28T11:59:59Z");
        let cases = [
            (Some(Reboot), Some(&fresh), Reboot),
            (Some(PowerOff), None, PowerOff),
            (Some(PowerOff), Some(&reboot), PowerOff),
            (Some(Unknown), Some(&reboot), Reboot),
            (None, Some(&fresh), PowerOff),
            (None, Some(&minute), PowerOff),
            (None, Some(&stale), Unknown),
            (None, Some(&later), Unknown),
            (None, Some(&soon), PowerOff),
            (None, Some(&reboot), Reboot),
            (Some(Unknown), None, Unknown),
            (None, None, Unknown),
        ];
        for (meta, called, want) in cases {
            assert_eq!(decide_kind(meta, called, now), want, "{meta:?} {called:?}");
        }
    }
}
