//! Real systemd-logind on a private D-Bus system bus, for nodeward tests.
//!
//! nodeward's agent holds a logind *delay* inhibitor lock and drains its node when logind sends
//! `PrepareForShutdown(true)`. What matters — that logind really waits while the lock's fd is
//! open, proceeds the moment it closes, gives up after `InhibitDelayMaxUSec`, re-reads that cap on
//! SIGHUP, keeps locks across its own restart — is logind's behaviour, so the tests run the real
//! `/lib/systemd/systemd-logind` rather than a model of it. PID 1 is not systemd on the machines
//! the tests run on, so the harness builds just enough of a system around logind:
//!
//! 1. a `dbus-daemon` with a `<type>system</type>` configuration, an allow-all policy and a unix
//!    socket in a temporary directory (its printed address is the readiness signal);
//! 2. python-dbusmock's `systemd` template as `org.freedesktop.systemd1`, with mock units
//!    `poweroff.target`, `reboot.target` and `halt.target`;
//! 3. logind, started as `unshare --mount --propagation private sh -c '…'`, which bind-mounts a
//!    harness directory over `/run` and another over `/etc/systemd` and then `exec`s logind, so the
//!    child's pid is logind's pid and no mount is ever visible on the host.
//!
//! Every start-up step waits for the bus name to appear (`NameOwnerChanged`, subscribed before
//! checking `GetNameOwner`) or for the child to die, never for a fixed time. [`Mode::DbusmockLogind`]
//! replaces 3 with dbusmock's `logind` template (and skips 2) for fast edge cases: signals in any
//! order, a logind that loses its state on restart.
//!
//! ```no_run
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use logind_harness::{LogindHarness, Options};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let h = LogindHarness::start(Options {
//!     inhibit_delay_max: Duration::from_secs(1),
//!     ..Options::default()
//! })
//! .await?;
//! // The code under test connects like this (or gets DBUS_SYSTEM_BUS_ADDRESS in its environment).
//! let conn = zbus::connection::Builder::address(h.bus_address())?.build().await?;
//! let login1 = zbus::Proxy::new(
//!     &conn,
//!     "org.freedesktop.login1",
//!     "/org/freedesktop/login1",
//!     "org.freedesktop.login1.Manager",
//! )
//! .await?;
//! let mut prepare = login1.receive_signal("PrepareForShutdown").await?;
//! let lock: zbus::zvariant::OwnedFd =
//!     login1.call("Inhibit", &("shutdown", "test", "drain first", "delay")).await?;
//!
//! h.power_off().await?;
//! let start: bool = prepare.next().await.ok_or("stream ended")?.body().deserialize()?;
//! assert!(start);
//! drop(lock); // logind starts poweroff.target within a few milliseconds
//! h.wait_for_unit_started("poweroff.target", Duration::from_secs(5)).await?;
//! h.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # What it needs
//!
//! Root (for `unshare --mount` and `mount`, and because logind lets only privileged callers power
//! off without PolicyKit) and the Debian 12 packages `systemd dbus python3-dbusmock util-linux`:
//! `apt-get install -y systemd dbus python3-dbusmock util-linux`. [`LogindHarness::start`] checks
//! first and fails with [`Error::MissingPrerequisites`] naming what to install; a test never passes
//! silently without logind. dbusmock runs under `/usr/bin/python3` (Debian's), never a `python3`
//! found on `PATH` (pyenv/venv interpreters lack the Debian `dbus`/`gi` modules).
//!
//! # Behaviour observed (systemd 252.38 on Debian 12, python-dbusmock 0.28.7)
//!
//! - **No `PrepareForShutdownWithMetadata`.** It arrived in systemd 255; logind 252 sends only
//!   `PrepareForShutdown(b)`, so an agent cannot tell reboot from power-off by the signal here.
//! - **Release latency.** With a delay lock held, `PowerOff(false)` returns after logind has sent
//!   `PrepareForShutdown(true)`; closing the lock's fd makes logind call `StartUnit` on the mock
//!   within a few milliseconds: 1.8–7.3 ms over nine runs with eight harnesses in parallel on two
//!   cores (measured from `close` to the harness seeing dbusmock's `MethodCalled`).
//! - **The cap.** With `InhibitDelayMaxSec=1` and the fd never closed, `StartUnit` came after
//!   1.02–1.25 s: sd-event's default 250 ms timer accuracy adds up to a quarter second. logind logs
//!   "Delay lock is active … but inhibitor timeout is reached." and the lock stays listed.
//! - **Unit object paths.** Before `PowerOff`, logind reads `LoadState` at
//!   `/org/freedesktop/systemd1/unit/poweroff_2etarget` (systemd's bus-label escaping). dbusmock's
//!   `AddMockUnit` registers `…/unit/poweroff_target` only; without a second object at the escaped
//!   path `PowerOff` fails with the unhelpful "Invalid request descriptor" (`EBADR`). The harness
//!   adds both.
//! - **Shutdown jobs and `PrepareForShutdown(false)`.** logind sends `PrepareForShutdown(false)`
//!   when the job it started is removed (`JobRemoved`). dbusmock's stock `StartUnit` removes the
//!   job at once, which would announce "shutdown over" a millisecond after it began; the harness
//!   replaces `StartUnit` so the job stays pending, as on a host that is going down.
//!   [`LogindHarness::cancel_shutdown`] then ends it with result `canceled` — what
//!   `systemctl cancel` does — and logind sends `PrepareForShutdown(false)`.
//! - **No new delay locks during a shutdown.** While the job is pending, `Inhibit("shutdown", …,
//!   "delay")` fails with `org.freedesktop.login1.OperationInProgress`; after
//!   `PrepareForShutdown(false)` it works again.
//! - **What cannot be cancelled.** logind 252 has no way to cancel a `PowerOff` that is waiting for
//!   delay locks. `CancelScheduledShutdown` cancels only a `ScheduleShutdown` timer; called after
//!   the timer fired (during the delay) it returns `true` and logs "System shutdown has been
//!   cancelled", yet the power-off still happens when the lock goes. `cancel_shutdown` therefore
//!   returns [`Error::NothingToCancel`] in that phase.
//! - **SIGHUP reloads `logind.conf.d`** and logind logs "Config file reloaded.";
//!   [`LogindHarness::sighup_logind`] waits for that line. `InhibitDelayMaxUSec` is declared
//!   constant (`EmitsChangedSignal=const`) and no `PropertiesChanged` follows a reload, so a
//!   property-caching zbus proxy keeps returning the old value — zbus's default, and
//!   `logind_zbus::manager::ManagerProxy::new` (checked: logind-zbus 5.3.2 on zbus 5.19 with only
//!   the `tokio` feature builds, works, and reads 2 s after a reload to 30 s). Build the proxy with
//!   `.cache_properties(CacheProperties::No)`. A test asserts the stale cache.
//! - **Locks survive a logind restart.** logind keeps inhibitors in `/run/systemd/inhibit/` (state
//!   file plus FIFO) and re-reads them on start, after SIGTERM and after SIGKILL alike; the old fd
//!   still delays a shutdown. The harness therefore binds a directory that outlives logind as
//!   `/run`. An agent that "re-takes" its lock after a logind restart ends up with two locks and
//!   must close both.
//! - **No bus activation.** The private bus has no service files, so calls to `login1` while logind
//!   is down fail at once with `org.freedesktop.DBus.Error.ServiceUnknown` (a real host would
//!   activate logind and queue the call).
//! - **PolicyKit.** No polkit runs on the bus. logind lets uid 0 call `PowerOff`, `Reboot` and
//!   `Inhibit`; for any other uid they fail with "Access denied" — agents under test run as root.
//! - **Host isolation.** Left alone, logind pre-allocates and tracks the host's VTs (it logged
//!   "Preallocating VTs…" and "VT changed to 1"), would handle power/lid keys, and
//!   `ScheduleShutdown` writes `/run/nologin`. The
//!   harness's drop-in `00-logind-harness.conf` sets `NAutoVTs=0`, `ReserveVT=0`, all `Handle*Key`
//!   and lid switches to `ignore`, `KillUserProcesses=no`, `RemoveIPC=no`; the private `/run`
//!   hides the host's `/run/nologin`, udev database, utmp and journal socket (so logind logs to
//!   stderr, which the harness keeps). Bind-mounting over all of `/etc/systemd` (not just
//!   `logind.conf.d`) means the host's `logind.conf` is never read and no directory is ever
//!   created in the real `/etc`.
//! - **Nothing else is needed**: logind 252 runs without sessions, seats (it creates `seat0`
//!   itself), `/run/user`, cgroup write access or utmp ("Failed to create inotify watch on
//!   /var/run/utmp" is harmless). dbus-daemon's "Failed to set fd limit to 65536: Operation not
//!   permitted" is harmless too.
//! - **dbusmock's `logind` template** does nothing on `PowerOff`/`Reboot` (the harness makes them
//!   set `PreparingForShutdown` and emit `PrepareForShutdown(true)`), has no
//!   `InhibitDelayMaxUSec` (the harness adds it), lists every lock with uid 1000 and pid 123456,
//!   never delays anything, and forgets its locks when restarted. Its `UpdateProperties` needs
//!   `dbus.Boolean`, not a Python `bool`. A zbus signal stream subscribed by well-known name keeps
//!   receiving from the new owner after a restart.
//! - **zbus and the lock fd.** Deserialising the `h` reply into `zvariant::OwnedFd` duplicates the
//!   fd and zbus drops the reply message, so dropping the `OwnedFd` does release the lock.
//!
//! # Teardown
//!
//! Every child runs in its own process group with `PR_SET_PDEATHSIG=SIGKILL`.
//! [`LogindHarness::shutdown`] sends SIGTERM (SIGKILL after a grace period) to logind, the mock and
//! dbus-daemon in that order; `Drop` SIGKILLs the groups and reaps them. The mounts live only in
//! logind's namespace and vanish with it; the temporary directory is removed. If the test process
//! itself is SIGKILLed, the children still die (parent-death signal) but the temporary directory
//! `$TMPDIR/logind-harness-*` stays. The parent-death signal is tied to the *thread* that started
//! the child: start the harness from a runtime thread that lives as long as the harness
//! (`#[tokio::test]`, a `main` runtime), not from `spawn_blocking`.

mod child;
mod error;
mod harness;
pub mod preflight;
pub mod proxy;
mod render;

pub use error::{Error, Result};
pub use harness::{
    DEFAULT_INHIBIT_DELAY_MAX, DEFAULT_STARTUP_TIMEOUT, INHIBITOR_POLL, Inhibitor, LogindHarness,
    Mode, Options,
};
pub use nix::sys::signal::Signal;
