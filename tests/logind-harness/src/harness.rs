//! [`LogindHarness`]: the private bus, the systemd mock and logind (real or mocked), started in
//! order, each awaited by watching its bus name, and all torn down together.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use nix::sys::signal::Signal;
use tempfile::TempDir;
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;
use tokio::time::Instant;
use zbus::proxy::CacheProperties;
use zbus::zvariant::{OwnedFd, Value};

use crate::child::ManagedChild;
use crate::preflight::{Tools, preflight};
use crate::proxy::{
    LOGIN1_MANAGER, LOGIN1_NAME, LOGIN1_PATH, LoginManagerProxy, MOCK_IFACE, MockProxy,
    SYSTEMD1_MANAGER, SYSTEMD1_NAME, SYSTEMD1_PATH, SYSTEMD1_UNIT, variant_str,
};
use crate::render;
use crate::{Error, Result};

/// logind's own default for `InhibitDelayMaxSec` (systemd 252 `logind.conf(5)`), used unless a
/// test asks for another so that tests see production behaviour by default.
pub const DEFAULT_INHIBIT_DELAY_MAX: Duration = Duration::from_secs(5);

/// Upper bound for bringing up all parts. Idle, the whole start takes about half a second (most
/// of it Python importing dbusmock); on a loaded two-core machine compiling in parallel it can take
/// several seconds. A timeout fails the test with the child's output, so being generous costs
/// nothing when things work.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a child may take to exit after SIGTERM before it gets SIGKILL. logind, dbus-daemon and
/// dbusmock all exit within milliseconds of SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// How long `sighup_logind` waits for logind's "Config file reloaded." line; logind handles the
/// signal on its next event-loop turn, normally within a millisecond.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(5);

/// The line systemd 252's logind logs (at info level) after re-reading its configuration on
/// SIGHUP (`manager_dispatch_reload_signal`).
const RELOADED_LINE: &str = "Config file reloaded";

/// How long to wait for dbus-daemon to drop a dead process's bus name; it notices the closed
/// socket at once.
const NAME_GONE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest interval between two `ListInhibitors` calls in `wait_for_inhibitors`. logind announces
/// lock changes with `PropertiesChanged`, so this only matters for the dbusmock logind (which
/// announces nothing) and for changes that leave `DelayInhibited` as it was (a second lock of
/// the same kind).
pub const INHIBITOR_POLL: Duration = Duration::from_millis(20);

/// Longest unix socket path (`sizeof(sun_path)` minus the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// `PATH` given to every child; children get a cleared environment so nothing from the test
/// process (`NOTIFY_SOCKET`, `DBUS_SESSION_BUS_ADDRESS`, `PYTHONPATH`, …) leaks into them.
const CHILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Which logind the harness runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// The real `/lib/systemd/systemd-logind` in its own mount namespace, with dbusmock's
    /// `systemd` template as PID 1's bus API. Locks, `PrepareForShutdown` and the delay are real.
    #[default]
    Real,
    /// dbusmock's `logind` template: starts in a few hundred milliseconds, lets a test emit any
    /// signal in any order, but has no delay semantics (`PowerOff` only emits
    /// `PrepareForShutdown(true)`; locks never hold anything up). No systemd mock is started.
    DbusmockLogind,
}

/// How to start the harness.
#[derive(Debug, Clone)]
pub struct Options {
    /// Real logind or dbusmock's logind template.
    pub mode: Mode,
    /// `InhibitDelayMaxSec` written to the harness's drop-in (real mode) or the
    /// `InhibitDelayMaxUSec` property of the mock (dbusmock mode), in whole microseconds.
    pub inhibit_delay_max: Duration,
    /// Upper bound for each of `start` and `restart_logind`.
    pub startup_timeout: Duration,
    /// Run logind with `SYSTEMD_LOG_LEVEL=debug` (its output is logged with `tracing::debug!` and
    /// appears in errors).
    pub logind_debug: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::Real,
            inhibit_delay_max: DEFAULT_INHIBIT_DELAY_MAX,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            logind_debug: false,
        }
    }
}

/// One entry of logind's `ListInhibitors`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inhibitor {
    /// Colon-separated lock types, e.g. `shutdown` or `shutdown:sleep`.
    pub what: String,
    /// Who holds it, as given to `Inhibit`.
    pub who: String,
    /// Why, as given to `Inhibit`.
    pub why: String,
    /// `delay` or `block`.
    pub mode: String,
    /// Uid of the process that took the lock.
    pub uid: u32,
    /// Pid of the process that took the lock.
    pub pid: u32,
}

/// A private D-Bus system bus with logind (real or mocked) and a systemd mock on it.
///
/// Dropping it kills every child; [`LogindHarness::shutdown`] stops them gracefully and reports
/// nothing left behind.
pub struct LogindHarness {
    opts: Options,
    tools: Tools,
    bus_address: String,
    dropin_dir: PathBuf,
    run_dir: PathBuf,
    etc_dir: PathBuf,
    conn: zbus::Connection,
    logind: Option<ManagedChild>,
    logind_pid: Option<u32>,
    systemd_mock: Option<ManagedChild>,
    dbus: Option<ManagedChild>,
    // Last, so the directory outlives every child.
    dir: TempDir,
}

impl std::fmt::Debug for LogindHarness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogindHarness")
            .field("mode", &self.opts.mode)
            .field("bus_address", &self.bus_address)
            .field("dir", &self.dir.path())
            .field("logind_pid", &self.logind_pid)
            .finish_non_exhaustive()
    }
}

impl LogindHarness {
    /// Starts dbus-daemon, the systemd mock (real mode) and logind, and returns once logind
    /// answers on the bus.
    ///
    /// # Errors
    ///
    /// [`Error::MissingPrerequisites`] naming the apt packages to install, [`Error::NotRoot`], or
    /// an error saying which part failed to come up, with its output.
    #[tracing::instrument(skip_all, err, fields(mode = ?opts.mode))]
    pub async fn start(opts: Options) -> Result<Self> {
        let tools = preflight(opts.mode).await?;
        let deadline = Deadline::after(opts.startup_timeout);

        let dir = tempfile::Builder::new()
            .prefix("logind-harness-")
            .tempdir()
            .map_err(|source| Error::TempDir {
                reason: "tempdir() failed".into(),
                source: Some(source),
            })?;
        // 0755 like /run: the bus socket and the drop-in directory stay reachable for a test's
        // unprivileged children.
        set_mode(dir.path(), 0o755)?;
        let socket = dir.path().join("bus.sock");
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(Error::TempDir {
                reason: format!(
                    "socket path {} is longer than {MAX_SOCKET_PATH} bytes; set TMPDIR to a shorter directory",
                    socket.display()
                ),
                source: None,
            });
        }
        let run_dir = dir.path().join("run");
        let etc_dir = dir.path().join("etc-systemd");
        let dropin_dir = etc_dir.join("logind.conf.d");
        for d in [&run_dir, &dropin_dir] {
            std::fs::create_dir_all(d).map_err(|source| Error::Write {
                path: d.clone(),
                source,
            })?;
            set_mode(d, 0o755)?;
        }
        let bus_conf = dir.path().join("bus.conf");
        write(&bus_conf, &render::bus_config(&socket))?;
        if opts.mode == Mode::Real {
            write(
                &dropin_dir.join(render::HARNESS_DROPIN),
                &render::logind_dropin(opts.inhibit_delay_max),
            )?;
        }

        let (dbus, bus_address) = start_dbus(&tools, &bus_conf, deadline).await?;
        let conn = connect(&bus_address).await?;

        let mut harness = LogindHarness {
            opts,
            tools,
            bus_address,
            dropin_dir,
            run_dir,
            etc_dir,
            conn,
            logind: None,
            logind_pid: None,
            systemd_mock: None,
            dbus: Some(dbus),
            dir,
        };

        if harness.opts.mode == Mode::Real {
            harness.start_systemd_mock(deadline).await?;
        }
        harness.start_logind(deadline).await?;

        if harness.opts.mode == Mode::Real {
            let actual = harness.inhibit_delay_max().await?;
            // logind keeps microseconds; anything finer was never written.
            if actual.as_micros() != harness.opts.inhibit_delay_max.as_micros() {
                return Err(Error::ConfigNotApplied {
                    expected: harness.opts.inhibit_delay_max,
                    actual,
                    dropin: harness.dropin_dir.join(render::HARNESS_DROPIN),
                });
            }
        }
        tracing::info!(
            bus = %harness.bus_address,
            logind_pid = ?harness.logind_pid,
            "logind harness ready"
        );
        Ok(harness)
    }

    /// The mode the harness runs in.
    pub fn mode(&self) -> Mode {
        self.opts.mode
    }

    /// The bus address, e.g. `unix:path=/tmp/logind-harness-XXXX/bus.sock,guid=…`: set it as
    /// `DBUS_SYSTEM_BUS_ADDRESS` for a child process, or pass it to
    /// `zbus::connection::Builder::address`.
    pub fn bus_address(&self) -> &str {
        &self.bus_address
    }

    /// Host path of the directory logind sees as `/etc/systemd/logind.conf.d`. It holds the
    /// harness's `00-logind-harness.conf`; an agent under test writes its own drop-in here and
    /// then SIGHUPs [`logind_pid`](Self::logind_pid). Ignored in [`Mode::DbusmockLogind`].
    pub fn dropin_dir(&self) -> &Path {
        &self.dropin_dir
    }

    /// Host path that logind sees as `/run` (its `/run/systemd/inhibit` state lives there).
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// The harness's temporary directory (bus socket, configs, dbusmock logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Pid of logind (or of the dbusmock process playing it), as the bus reports it; `None`
    /// after [`kill_logind`](Self::kill_logind).
    pub fn logind_pid(&self) -> Option<u32> {
        self.logind_pid
    }

    /// Pids of every child still running (dbus-daemon, mocks, logind).
    pub fn child_pids(&self) -> Vec<u32> {
        [&self.logind, &self.systemd_mock, &self.dbus]
            .into_iter()
            .flatten()
            .filter_map(|c| u32::try_from(c.pid()).ok())
            .collect()
    }

    /// The last lines logind wrote (stderr; logind logs there because the journal socket is
    /// hidden from it).
    pub fn logind_output(&self) -> String {
        self.logind
            .as_ref()
            .map(ManagedChild::output_tail)
            .unwrap_or_default()
    }

    /// A new connection to the private bus, owned by the caller (locks it takes via `Inhibit` are
    /// its own).
    ///
    /// # Errors
    ///
    /// [`Error::DBus`] if the bus cannot be reached.
    pub async fn connection(&self) -> Result<zbus::Connection> {
        connect(&self.bus_address).await
    }

    /// Takes an inhibitor lock through the harness's own connection and returns the fd; the lock
    /// lasts until every copy of it is closed. Handy to play another lock holder (kubelet).
    ///
    /// # Errors
    ///
    /// [`Error::DBus`] with logind's reply, e.g. `OperationInProgress` while a shutdown job runs.
    pub async fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> Result<OwnedFd> {
        self.login()
            .await?
            .inhibit(what, who, why, mode)
            .await
            .map_err(Error::dbus("Inhibit"))
    }

    /// logind's `ListInhibitors`.
    ///
    /// # Errors
    ///
    /// [`Error::DBus`] if logind does not answer.
    pub async fn list_inhibitors(&self) -> Result<Vec<Inhibitor>> {
        let list = self
            .login()
            .await?
            .list_inhibitors()
            .await
            .map_err(Error::dbus("ListInhibitors"))?;
        Ok(list
            .into_iter()
            .map(|(what, who, why, mode, uid, pid)| Inhibitor {
                what,
                who,
                why,
                mode,
                uid,
                pid,
            })
            .collect())
    }

    /// Waits until `ListInhibitors` satisfies `done` and returns that list — e.g. until an agent
    /// under test has taken its lock, or a closed fd's lock is gone. Re-checks whenever logind
    /// announces a change (`PropertiesChanged` on its manager, sent when `DelayInhibited` or
    /// `BlockInhibited` change) and at least every [`INHIBITOR_POLL`].
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] with the last list seen, or [`Error::DBus`].
    pub async fn wait_for_inhibitors<F>(
        &self,
        timeout: Duration,
        mut done: F,
    ) -> Result<Vec<Inhibitor>>
    where
        F: FnMut(&[Inhibitor]) -> bool,
    {
        let props = zbus::fdo::PropertiesProxy::builder(&self.conn)
            .destination(LOGIN1_NAME)
            .and_then(|b| b.path(LOGIN1_PATH))
            .map_err(Error::dbus("properties proxy"))?
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(Error::dbus("properties proxy"))?;
        let mut changes = props
            .receive_properties_changed()
            .await
            .map_err(Error::dbus("subscribe to PropertiesChanged"))?;
        let deadline = Instant::now() + timeout;
        loop {
            let list = self.list_inhibitors().await?;
            if done(&list) {
                return Ok(list);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("inhibitors to reach the expected state; last seen: {list:?}"),
                    timeout,
                    output: String::new(),
                });
            }
            let next_check = (Instant::now() + INHIBITOR_POLL).min(deadline);
            tokio::select! {
                _ = changes.next() => {}
                () = tokio::time::sleep_until(next_check) => {}
            }
        }
    }

    /// logind's `InhibitDelayMaxUSec`, read fresh (never from a cache).
    ///
    /// # Errors
    ///
    /// [`Error::DBus`] if logind does not answer.
    pub async fn inhibit_delay_max(&self) -> Result<Duration> {
        let usec = self
            .login()
            .await?
            .inhibit_delay_max_usec()
            .await
            .map_err(Error::dbus("get InhibitDelayMaxUSec"))?;
        Ok(Duration::from_micros(usec))
    }

    /// Calls logind's `PowerOff(false)`. Returns once logind has accepted the call: by then it has
    /// sent `PrepareForShutdown(true)` and is waiting for delay locks (or, with none, has already
    /// asked systemd to start `poweroff.target`).
    ///
    /// # Errors
    ///
    /// [`Error::DBus`] with logind's refusal (e.g. a shutdown already in progress).
    pub async fn power_off(&self) -> Result<()> {
        self.login()
            .await?
            .power_off(false)
            .await
            .map_err(Error::dbus("PowerOff"))
    }

    /// Calls logind's `Reboot(false)`; like [`power_off`](Self::power_off), ending in
    /// `reboot.target`.
    ///
    /// # Errors
    ///
    /// [`Error::DBus`] with logind's refusal.
    pub async fn reboot(&self) -> Result<()> {
        self.login()
            .await?
            .reboot(false)
            .await
            .map_err(Error::dbus("Reboot"))
    }

    /// Makes the systemd mock answer as PID 1 does while it shuts the machine down for `target`
    /// (`poweroff.target`, `reboot.target`, …): `SystemState` is "stopping" and `ListJobs` lists
    /// a start job for `target` and a stop job for nodeward-drain.service. What
    /// nodeward-drain.service's ExecStop asks; logind itself is not involved.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] in dbusmock mode (there is no systemd mock), or [`Error::DBus`].
    pub async fn systemd_stopping_for(&self, target: &str) -> Result<()> {
        let mock = self.systemd_mock("systemd_stopping_for").await?;
        mock.update_properties(
            SYSTEMD1_MANAGER,
            HashMap::from([("SystemState", Value::from("stopping"))]),
        )
        .await
        .map_err(Error::dbus("UpdateProperties(SystemState)"))?;
        let code = render::list_jobs_code(&[
            (target, "start", "waiting"),
            ("nodeward-drain.service", "stop", "running"),
        ]);
        mock.add_method(SYSTEMD1_MANAGER, "ListJobs", "", "a(usssoo)", &code)
            .await
            .map_err(Error::dbus("AddMethod(ListJobs)"))
    }

    /// Units the systemd mock was asked to start, oldest first.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] in dbusmock mode (there is no systemd mock), or [`Error::DBus`].
    pub async fn started_units(&self) -> Result<Vec<String>> {
        self.unit_calls("StartUnit").await
    }

    /// Units the systemd mock was asked to stop (`StopUnit`), oldest first.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] in dbusmock mode (there is no systemd mock), or [`Error::DBus`].
    pub async fn stopped_units(&self) -> Result<Vec<String>> {
        self.unit_calls("StopUnit").await
    }

    /// The unit named in each call of `method` on the systemd mock, oldest first.
    async fn unit_calls(&self, method: &'static str) -> Result<Vec<String>> {
        let mock = self.systemd_mock(method).await?;
        let calls = mock
            .get_method_calls(method)
            .await
            .map_err(Error::dbus(format!("GetMethodCalls({method})")))?;
        Ok(calls
            .iter()
            .filter_map(|(_, args)| args.first().and_then(|v| variant_str(v)))
            .collect())
    }

    /// Waits until the systemd mock was asked (by logind or an agent) to start `unit`; returns
    /// at once if it already was. Watches dbusmock's `MethodCalled` signal, subscribing before
    /// it checks the call log, so no call is missed.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] (with logind's output) if the unit was not started in time,
    /// [`Error::Unsupported`] in dbusmock mode.
    pub async fn wait_for_unit_started(&self, unit: &str, timeout: Duration) -> Result<()> {
        let mock = self.systemd_mock("wait_for_unit_started").await?;
        let mut calls = mock
            .receive_method_called()
            .await
            .map_err(Error::dbus("subscribe to MethodCalled"))?;
        if self.started_units().await?.iter().any(|u| u == unit) {
            return Ok(());
        }
        let watch = async {
            while let Some(sig) = calls.next().await {
                let Ok(args) = sig.args() else { continue };
                if args.name == "StartUnit"
                    && args.args.first().and_then(|v| variant_str(v)).as_deref() == Some(unit)
                {
                    return true;
                }
            }
            false
        };
        match tokio::time::timeout(timeout, watch).await {
            Ok(true) => Ok(()),
            Ok(false) | Err(_) => Err(Error::Timeout {
                what: format!("StartUnit({unit}) at the systemd mock"),
                timeout,
                output: self.logind_output(),
            }),
        }
    }

    /// Cancels the shutdown in progress, so logind sends `PrepareForShutdown(false)` and agents
    /// take their locks again.
    ///
    /// - Real mode: if logind already asked for the shutdown unit, the mock ends that job with
    ///   `JobRemoved(…, "canceled")` — what `systemctl cancel` does on a real host; otherwise a
    ///   scheduled shutdown is cancelled with `CancelScheduledShutdown`.
    /// - dbusmock mode: the mock emits `PrepareForShutdown(false)`.
    ///
    /// # Errors
    ///
    /// [`Error::NothingToCancel`] in real mode when no job is pending and nothing is scheduled —
    /// including while logind is still waiting for delay locks, which logind 252 cannot cancel.
    pub async fn cancel_shutdown(&self) -> Result<()> {
        match self.opts.mode {
            Mode::DbusmockLogind => self.emit_prepare_for_shutdown(false).await,
            Mode::Real => {
                let mock = self.systemd_mock("cancel_shutdown").await?;
                let units = mock
                    .harness_finish_jobs("canceled")
                    .await
                    .map_err(Error::dbus(render::FINISH_JOBS_METHOD))?;
                if !units.is_empty() {
                    tracing::info!(?units, "cancelled pending shutdown jobs");
                    return Ok(());
                }
                let cancelled = self
                    .login()
                    .await?
                    .cancel_scheduled_shutdown()
                    .await
                    .map_err(Error::dbus("CancelScheduledShutdown"))?;
                if cancelled {
                    Ok(())
                } else {
                    Err(Error::NothingToCancel)
                }
            }
        }
    }

    /// dbusmock mode only: sets `PreparingForShutdown` and emits `PrepareForShutdown(start)` from
    /// the mock logind, in any order a test wants.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] in real mode (real logind sends its own signals).
    pub async fn emit_prepare_for_shutdown(&self, start: bool) -> Result<()> {
        if self.opts.mode != Mode::DbusmockLogind {
            return Err(Error::Unsupported {
                operation: "emit_prepare_for_shutdown",
                mode: self.opts.mode,
                why: "real logind emits PrepareForShutdown itself; use power_off/cancel_shutdown",
            });
        }
        let mock = self.mock_at(LOGIN1_NAME, LOGIN1_PATH).await?;
        mock.update_properties(
            LOGIN1_MANAGER,
            HashMap::from([("PreparingForShutdown", Value::Bool(start))]),
        )
        .await
        .map_err(Error::dbus("UpdateProperties(PreparingForShutdown)"))?;
        mock.emit_signal(
            LOGIN1_MANAGER,
            "PrepareForShutdown",
            "b",
            &[Value::Bool(start)],
        )
        .await
        .map_err(Error::dbus("EmitSignal(PrepareForShutdown)"))
    }

    /// Sends SIGHUP to logind and waits until it has re-read its configuration (its
    /// "Config file reloaded." line), so a property read afterwards sees the new values.
    ///
    /// # Errors
    ///
    /// [`Error::LogindNotRunning`], [`Error::Timeout`], or [`Error::Unsupported`] in dbusmock mode.
    pub async fn sighup_logind(&self) -> Result<()> {
        if self.opts.mode != Mode::Real {
            return Err(Error::Unsupported {
                operation: "sighup_logind",
                mode: self.opts.mode,
                why: "the dbusmock logind has no configuration to reload",
            });
        }
        let logind = self.logind.as_ref().ok_or(Error::LogindNotRunning)?;
        let mut lines = logind.subscribe();
        logind.signal(Signal::SIGHUP)?;
        let wait = async {
            loop {
                match lines.recv().await {
                    Ok(l) if l.contains(RELOADED_LINE) => return true,
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return false,
                }
            }
        };
        match tokio::time::timeout(RELOAD_TIMEOUT, wait).await {
            Ok(true) => Ok(()),
            Ok(false) | Err(_) => Err(Error::Timeout {
                what: format!("logind's {RELOADED_LINE:?} after SIGHUP"),
                timeout: RELOAD_TIMEOUT,
                output: self.logind_output(),
            }),
        }
    }

    /// Stops logind with SIGTERM (what `systemctl restart systemd-logind` does) and waits until
    /// it has exited and its bus name is gone.
    ///
    /// # Errors
    ///
    /// [`Error::LogindNotRunning`], or [`Error::Timeout`] if the name does not go away.
    pub async fn kill_logind(&mut self) -> Result<()> {
        self.kill_logind_with(Signal::SIGTERM).await
    }

    /// Like [`kill_logind`](Self::kill_logind) with any signal; `SIGKILL` plays a crash.
    ///
    /// # Errors
    ///
    /// As [`kill_logind`](Self::kill_logind), or [`Error::Signal`].
    pub async fn kill_logind_with(&mut self, signal: Signal) -> Result<()> {
        let mut child = self.logind.take().ok_or(Error::LogindNotRunning)?;
        self.logind_pid = None;
        let dbus = zbus::fdo::DBusProxy::new(&self.conn)
            .await
            .map_err(Error::dbus("DBus proxy"))?;
        let mut changes = dbus
            .receive_name_owner_changed_with_args(&[(0, LOGIN1_NAME)])
            .await
            .map_err(Error::dbus("subscribe to NameOwnerChanged"))?;
        child.signal(signal)?;
        if tokio::time::timeout(STOP_GRACE, child.wait())
            .await
            .is_err()
        {
            tracing::warn!(?signal, "logind did not exit; killing");
            child.terminate(Duration::ZERO).await;
        }
        drop(child);
        let gone = async {
            loop {
                if !name_has_owner(&dbus, LOGIN1_NAME).await? {
                    return Ok(());
                }
                if changes.next().await.is_none() {
                    return Err(Error::Timeout {
                        what: "NameOwnerChanged stream ended".into(),
                        timeout: NAME_GONE_TIMEOUT,
                        output: String::new(),
                    });
                }
            }
        };
        tokio::time::timeout(NAME_GONE_TIMEOUT, gone)
            .await
            .map_err(|_| Error::Timeout {
                what: format!("{LOGIN1_NAME} to leave the bus"),
                timeout: NAME_GONE_TIMEOUT,
                output: String::new(),
            })?
    }

    /// Starts logind again (stopping it first if it runs), with the same namespace set-up and the
    /// same `/run` and drop-in directory, so inhibitor state survives as on a real host.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn restart_logind(&mut self) -> Result<()> {
        if self.logind.is_some() {
            self.kill_logind().await?;
        }
        let deadline = Deadline::after(self.opts.startup_timeout);
        self.start_logind(deadline).await
    }

    /// Stops logind, the mocks and dbus-daemon with SIGTERM (SIGKILL after a grace period), in
    /// that order, and removes the harness directory.
    pub async fn shutdown(mut self) {
        for child in [
            self.logind.take(),
            self.systemd_mock.take(),
            self.dbus.take(),
        ]
        .into_iter()
        .flatten()
        {
            let mut child = child;
            let status = child.terminate(STOP_GRACE).await;
            tracing::debug!(child = child.name(), %status, "stopped");
        }
        self.logind_pid = None;
    }

    async fn login(&self) -> Result<LoginManagerProxy<'static>> {
        LoginManagerProxy::builder(&self.conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(Error::dbus("login1 proxy"))
    }

    async fn mock_at(&self, service: &'static str, path: &str) -> Result<MockProxy<'static>> {
        MockProxy::builder(&self.conn)
            .destination(service)
            .and_then(|b| b.path(path.to_owned()))
            .map_err(Error::dbus("mock proxy"))?
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(Error::dbus("mock proxy"))
    }

    async fn systemd_mock(&self, operation: &'static str) -> Result<MockProxy<'static>> {
        if self.opts.mode != Mode::Real {
            return Err(Error::Unsupported {
                operation,
                mode: self.opts.mode,
                why: "dbusmock mode runs no systemd mock; the mock logind never starts units",
            });
        }
        self.mock_at(SYSTEMD1_NAME, SYSTEMD1_PATH).await
    }

    async fn start_systemd_mock(&mut self, deadline: Deadline) -> Result<()> {
        let log = self.dir.path().join("systemd-mock.log");
        let cmd = self.dbusmock_command("systemd", &log);
        let (mut child, _) = ManagedChild::spawn("systemd mock (dbusmock)", cmd, false)?;
        wait_for_name(&self.conn, SYSTEMD1_NAME, &mut child, deadline).await?;
        self.systemd_mock = Some(child);

        let mock = self.mock_at(SYSTEMD1_NAME, SYSTEMD1_PATH).await?;
        for unit in render::MOCK_UNITS {
            mock.add_mock_unit(unit)
                .await
                .map_err(Error::dbus(format!("AddMockUnit({unit})")))?;
            let props = HashMap::from([
                ("Id", Value::from(*unit)),
                ("Names", Value::from(vec![*unit])),
                ("LoadState", Value::from("loaded")),
                ("ActiveState", Value::from("inactive")),
            ]);
            mock.add_object(&render::unit_object_path(unit), SYSTEMD1_UNIT, props, &[])
                .await
                .map_err(Error::dbus(format!("AddObject for {unit}")))?;
        }
        // Armed, as after the package's postinst, at both of its paths (GetUnit answers
        // dbusmock's; the template's StopUnit turns that one inactive).
        for path in [
            render::dbusmock_unit_path(render::DRAIN_UNIT),
            render::unit_object_path(render::DRAIN_UNIT),
        ] {
            self.mock_at(SYSTEMD1_NAME, &path)
                .await?
                .update_properties(
                    SYSTEMD1_UNIT,
                    HashMap::from([("ActiveState", Value::from("active"))]),
                )
                .await
                .map_err(Error::dbus(
                    "UpdateProperties(ActiveState) of the drain unit",
                ))?;
        }
        // PID 1 answers these for anyone; a running system with an empty job queue until a
        // test says otherwise (systemd_stopping_for).
        mock.add_property(SYSTEMD1_MANAGER, "SystemState", &Value::from("running"))
            .await
            .map_err(Error::dbus("AddProperty(SystemState)"))?;
        mock.add_method(
            SYSTEMD1_MANAGER,
            "ListJobs",
            "",
            "a(usssoo)",
            &render::list_jobs_code(&[]),
        )
        .await
        .map_err(Error::dbus("AddMethod(ListJobs)"))?;
        mock.add_method(
            SYSTEMD1_MANAGER,
            "StartUnit",
            "ss",
            "o",
            render::START_UNIT_CODE,
        )
        .await
        .map_err(Error::dbus("AddMethod(StartUnit)"))?;
        mock.add_method(
            MOCK_IFACE,
            render::FINISH_JOBS_METHOD,
            "s",
            "as",
            render::FINISH_JOBS_CODE,
        )
        .await
        .map_err(Error::dbus("AddMethod(HarnessFinishJobs)"))?;
        Ok(())
    }

    async fn start_logind(&mut self, deadline: Deadline) -> Result<()> {
        let mut child = match self.opts.mode {
            Mode::Real => {
                let mut cmd = Command::new(self.tools.unshare.clone().unwrap_or_default());
                cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
                    .arg(render::LOGIND_NAMESPACE_SCRIPT)
                    .env_clear()
                    .env("PATH", CHILD_PATH)
                    .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus_address)
                    // No journal socket inside the namespace; say so rather than let logind probe.
                    .env("SYSTEMD_LOG_TARGET", "console")
                    .env("SYSTEMD_LOG_COLOR", "0")
                    .env("SYSTEMD_LOG_LOCATION", "0")
                    .env(
                        "SYSTEMD_LOG_LEVEL",
                        if self.opts.logind_debug {
                            "debug"
                        } else {
                            "info"
                        },
                    )
                    .env(render::ENV_RUN_DIR, &self.run_dir)
                    .env(render::ENV_ETC_DIR, &self.etc_dir)
                    .env(
                        render::ENV_LOGIND,
                        self.tools.logind.clone().unwrap_or_default(),
                    );
                ManagedChild::spawn("systemd-logind", cmd, false)?.0
            }
            Mode::DbusmockLogind => {
                let log = self.dir.path().join("logind-mock.log");
                let cmd = self.dbusmock_command("logind", &log);
                ManagedChild::spawn("logind mock (dbusmock)", cmd, false)?.0
            }
        };
        let owner = wait_for_name(&self.conn, LOGIN1_NAME, &mut child, deadline).await?;
        let dbus = zbus::fdo::DBusProxy::new(&self.conn)
            .await
            .map_err(Error::dbus("DBus proxy"))?;
        let pid = dbus
            .get_connection_unix_process_id(bus_name(&owner)?)
            .await
            .map_err(Error::fdo("GetConnectionUnixProcessID(login1)"))?;
        if i32::try_from(pid).ok() != Some(child.pid()) {
            tracing::warn!(
                bus_pid = pid,
                child_pid = child.pid(),
                "logind pid differs from child pid"
            );
        }
        self.logind = Some(child);
        self.logind_pid = Some(pid);

        if self.opts.mode == Mode::DbusmockLogind {
            let mock = self.mock_at(LOGIN1_NAME, LOGIN1_PATH).await?;
            let usec = u64::try_from(self.opts.inhibit_delay_max.as_micros()).unwrap_or(u64::MAX);
            mock.add_property(LOGIN1_MANAGER, "InhibitDelayMaxUSec", &Value::U64(usec))
                .await
                .map_err(Error::dbus("AddProperty(InhibitDelayMaxUSec)"))?;
            for method in ["PowerOff", "Reboot"] {
                mock.add_method(
                    LOGIN1_MANAGER,
                    method,
                    "b",
                    "",
                    render::MOCK_LOGIND_SHUTDOWN_CODE,
                )
                .await
                .map_err(Error::dbus(format!("AddMethod({method})")))?;
            }
        }
        tracing::debug!(pid, "logind up");
        Ok(())
    }

    fn dbusmock_command(&self, template: &str, log: &Path) -> Command {
        let mut cmd = Command::new(&self.tools.python);
        cmd.args([
            "-m",
            "dbusmock",
            "--system",
            "--template",
            template,
            "--logfile",
        ])
        .arg(log)
        .env_clear()
        .env("PATH", CHILD_PATH)
        .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus_address)
        // Unbuffered, so a traceback reaches the harness before the process dies.
        .env("PYTHONUNBUFFERED", "1");
        cmd
    }
}

impl Drop for LogindHarness {
    fn drop(&mut self) {
        // Each ManagedChild SIGKILLs its process group when dropped; logind first, the bus last.
        drop(self.logind.take());
        drop(self.systemd_mock.take());
        drop(self.dbus.take());
    }
}

async fn start_dbus(
    tools: &Tools,
    conf: &Path,
    deadline: Deadline,
) -> Result<(ManagedChild, String)> {
    let mut cmd = Command::new(&tools.dbus_daemon);
    cmd.arg(format!("--config-file={}", conf.display()))
        .args(["--nofork", "--print-address", "--nopidfile", "--nosyslog"])
        .env_clear()
        .env("PATH", CHILD_PATH);
    let (mut child, stdout) = ManagedChild::spawn("dbus-daemon", cmd, true)?;
    let Some(stdout) = stdout else {
        return Err(child.exited_error().await);
    };
    // dbus-daemon prints its address once it listens: that line is the readiness signal.
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout_at(deadline.at, lines.next_line()).await;
    match line {
        Err(_) => Err(Error::Timeout {
            what: "dbus-daemon to print its address".into(),
            timeout: deadline.total,
            output: child.output_tail(),
        }),
        Ok(Ok(Some(address))) if !address.trim().is_empty() => {
            child.adopt_output(lines.into_inner());
            Ok((child, address.trim().to_owned()))
        }
        _ => Err(child.exited_error().await),
    }
}

async fn connect(address: &str) -> Result<zbus::Connection> {
    zbus::connection::Builder::address(address)
        .map_err(Error::dbus(format!("bus address {address}")))?
        .build()
        .await
        .map_err(Error::dbus(format!("connect to {address}")))
}

async fn name_has_owner(dbus: &zbus::fdo::DBusProxy<'_>, name: &'static str) -> Result<bool> {
    dbus.name_has_owner(bus_name(name)?)
        .await
        .map_err(Error::fdo(format!("NameHasOwner({name})")))
}

/// Waits until `name` has an owner, watching `NameOwnerChanged` (subscribed before the first
/// check, so the appearance cannot slip between the two) and the child that should claim it.
/// Returns the owner's unique name.
async fn wait_for_name(
    conn: &zbus::Connection,
    name: &'static str,
    child: &mut ManagedChild,
    deadline: Deadline,
) -> Result<String> {
    let dbus = zbus::fdo::DBusProxy::new(conn)
        .await
        .map_err(Error::dbus("DBus proxy"))?;
    let mut changes = dbus
        .receive_name_owner_changed_with_args(&[(0, name)])
        .await
        .map_err(Error::dbus("subscribe to NameOwnerChanged"))?;
    let get_owner = || async {
        match dbus.get_name_owner(bus_name(name)?).await {
            Ok(owner) => Ok(Some(owner.to_string())),
            Err(zbus::fdo::Error::NameHasNoOwner(_)) => Ok(None),
            Err(e) => Err(Error::fdo(format!("GetNameOwner({name})"))(e)),
        }
    };
    if let Some(owner) = get_owner().await? {
        return Ok(owner);
    }
    enum Event {
        Owner(String),
        Closed,
        Exited,
        Deadline,
        Other,
    }
    loop {
        let event = tokio::select! {
            change = changes.next() => match change {
                None => Event::Closed,
                Some(change) => match change.args() {
                    Ok(args) => match args.new_owner().as_ref() {
                        Some(owner) => Event::Owner(owner.to_string()),
                        None => Event::Other,
                    },
                    Err(_) => Event::Other,
                },
            },
            _ = child.wait() => Event::Exited,
            () = tokio::time::sleep_until(deadline.at) => Event::Deadline,
        };
        match event {
            Event::Owner(owner) => return Ok(owner),
            Event::Other => {}
            Event::Exited => return Err(child.exited_error().await),
            Event::Closed => {
                return Err(Error::Timeout {
                    what: format!("{name} (the bus connection closed)"),
                    timeout: deadline.total,
                    output: child.output_tail(),
                });
            }
            Event::Deadline => {
                return Err(Error::Timeout {
                    what: format!("{} to own {name}", child.name()),
                    timeout: deadline.total,
                    output: child.output_tail(),
                });
            }
        }
    }
}

/// When a start-up must be done by, and the budget it was given (for error messages).
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: Instant,
    total: Duration,
}

impl Deadline {
    fn after(total: Duration) -> Self {
        Deadline {
            at: Instant::now() + total,
            total,
        }
    }
}

fn bus_name(name: &str) -> Result<zbus::names::BusName<'_>> {
    zbus::names::BusName::try_from(name).map_err(|e| Error::DBus {
        context: format!("bus name {name:?}"),
        source: Box::new(e.into()),
    })
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
        Error::Write {
            path: path.to_path_buf(),
            source,
        }
    })
}
