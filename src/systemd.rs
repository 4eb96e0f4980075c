//! PID 1's manager interface on the system bus: what the drain unit asks at a shutdown (is the
//! system stopping, and for which target) and what the agent does to the drain unit (stop it while
//! it drains for a shutdown, start it again when the shutdown is cancelled).
//!
//! Also the notifications every nodeward process sends its unit (`sd_notify`), among them the
//! drain unit's request for time to reach its own deadline.
//!
//! Asking over D-Bus costs no `systemctl` process; in the drain unit's ExecStop, two of those took
//! most of its 3.6 s under the bench's emulated CPU. (PID 1's private socket would spare the bus,
//! but zbus rejects the sender field systemd puts on its messages there.)

use std::time::Duration;

use zbus::proxy::CacheProperties;
use zbus::zvariant::OwnedObjectPath;

use crate::logind::ShutdownKind;

/// The unit whose stop drains the node (`ExecStop=nodeward drain`).
pub const DRAIN_UNIT: &str = "nodeward-drain.service";

/// How long one question to systemd may take before the answer counts as "don't know".
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// Sends `states` to the service manager; a failure is logged, never fatal. Without
/// `NOTIFY_SOCKET` (not started by systemd, or by a unit that takes no notifications) it does
/// nothing.
pub fn notify(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

/// As a stopping unit's control process (nodeward-drain.service's ExecStop, which has
/// `NotifyAccess=exec`): asks systemd to wait at least `budget` from now before it kills this
/// stop (`EXTEND_TIMEOUT_USEC`). That only ever lengthens the unit's `TimeoutStopSec=`, which
/// stays the backstop; it spares a drain whose configured deadline lies beyond it from being
/// killed mid-way, before its deadline fallback runs. Outside such a unit it does nothing.
pub fn extend_stop_timeout(budget: Duration) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let usec = u64::try_from(budget.as_micros()).unwrap_or(u64::MAX);
    tracing::info!(
        seconds = budget.as_secs(),
        "asking systemd to wait this long for this stop"
    );
    notify(&[sd_notify::NotifyState::Custom(&format!(
        "EXTEND_TIMEOUT_USEC={usec}"
    ))]);
}

const MANAGER: &str = "org.freedesktop.systemd1.Manager";
const UNIT: &str = "org.freedesktop.systemd1.Unit";
const DESTINATION: &str = "org.freedesktop.systemd1";

/// One entry of `ListJobs`: id, unit, job type, state, job path, unit path.
type Job = (
    u32,
    String,
    String,
    String,
    OwnedObjectPath,
    OwnedObjectPath,
);

/// PID 1's manager object.
pub struct Systemd {
    conn: zbus::Connection,
    manager: zbus::Proxy<'static>,
}

impl Systemd {
    /// Connects to the system bus (honouring `DBUS_SYSTEM_BUS_ADDRESS`).
    ///
    /// # Errors
    ///
    /// No bus, or the proxy could not be built.
    pub async fn connect() -> zbus::Result<Self> {
        Self::on(&zbus::Connection::system().await?).await
    }

    /// On a connection the caller already has (the agent's, to logind).
    ///
    /// # Errors
    ///
    /// The proxy could not be built.
    pub async fn on(conn: &zbus::Connection) -> zbus::Result<Self> {
        let manager = zbus::proxy::Builder::new(conn)
            .destination(DESTINATION)?
            .path("/org/freedesktop/systemd1")?
            .interface(MANAGER)?
            .cache_properties(CacheProperties::No)
            .build()
            .await?;
        Ok(Self {
            conn: conn.clone(),
            manager,
        })
    }

    /// Whether systemd is shutting the machine down (`SystemState` is "stopping").
    ///
    /// # Errors
    ///
    /// systemd did not answer.
    pub async fn stopping(&self) -> zbus::Result<bool> {
        let state: String = self.manager.get_property("SystemState").await?;
        Ok(state == "stopping")
    }

    /// The kind of shutdown systemd performs, from its job queue.
    ///
    /// # Errors
    ///
    /// systemd did not answer.
    pub async fn kind(&self) -> zbus::Result<ShutdownKind> {
        let jobs: Vec<Job> = self.manager.call("ListJobs", &()).await?;
        Ok(kind_from_jobs(
            jobs.iter().map(|j| (j.1.as_str(), j.2.as_str())),
        ))
    }

    /// `unit`'s `ActiveState` ("active", "inactive", …).
    ///
    /// # Errors
    ///
    /// The unit is not loaded, or systemd did not answer.
    pub async fn active_state(&self, unit: &str) -> zbus::Result<String> {
        let path: OwnedObjectPath = self.manager.call("GetUnit", &(unit,)).await?;
        let proxy = zbus::proxy::Builder::<zbus::Proxy<'_>>::new(&self.conn)
            .destination(DESTINATION)?
            .path(path)?
            .interface(UNIT)?
            .cache_properties(CacheProperties::No)
            .build()
            .await?;
        proxy.get_property("ActiveState").await
    }

    /// When this userspace started, on `CLOCK_MONOTONIC` (`UserspaceTimestampMonotonic`): the
    /// kernel's boot for a full boot, the switch-over for a `systemctl soft-reboot`, which keeps
    /// the kernel and its clocks.
    ///
    /// # Errors
    ///
    /// systemd did not answer.
    pub async fn userspace_start_monotonic(&self) -> zbus::Result<Duration> {
        let usec: u64 = self
            .manager
            .get_property("UserspaceTimestampMonotonic")
            .await?;
        Ok(Duration::from_micros(usec))
    }

    /// Queues a stop job for `unit` (mode "replace"); does not wait for it to finish.
    ///
    /// # Errors
    ///
    /// systemd refused or did not answer.
    pub async fn stop_unit(&self, unit: &str) -> zbus::Result<()> {
        let _job: OwnedObjectPath = self.manager.call("StopUnit", &(unit, "replace")).await?;
        Ok(())
    }

    /// Queues a start job for `unit` (mode "replace"); does not wait for it to finish.
    ///
    /// # Errors
    ///
    /// systemd refused or did not answer.
    pub async fn start_unit(&self, unit: &str) -> zbus::Result<()> {
        let _job: OwnedObjectPath = self.manager.call("StartUnit", &(unit, "replace")).await?;
        Ok(())
    }
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
}
