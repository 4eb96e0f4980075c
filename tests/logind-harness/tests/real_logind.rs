//! Proves the harness against the real systemd-logind, with a raw zbus client (no nodeward code):
//! locks are listed, `PowerOff` waits for a delay lock and proceeds when its fd closes, the delay
//! cap holds, a drop-in plus SIGHUP changes the cap, logind survives a restart, and teardown leaves
//! nothing behind.
//!
//! These tests need root and the Debian packages `systemd dbus python3-dbusmock util-linux`;
//! without them they fail with a message saying what to install.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use logind_harness::{Error, LogindHarness, Mode, Options, Signal};
use zbus::zvariant::OwnedFd;

/// Upper bound for "logind noticed the closed fd and started poweroff.target". logind reacts to
/// the FIFO's EOF in the same event-loop turn (about 1–2 ms measured); the rest is headroom for a
/// loaded two-core machine.
const RELEASE_LATENCY_BOUND: Duration = Duration::from_millis(100);

/// How long a test waits for something that should happen "at once" (a signal, a unit start).
const SOON: Duration = Duration::from_secs(5);

/// Window in which a held lock must keep logind from starting the unit. Well below the 5 s
/// default cap, long enough that logind would certainly have acted without the lock.
const HELD_WINDOW: Duration = Duration::from_millis(500);

/// sd-event fires logind's inhibit timer within its default 250 ms accuracy window; add scheduling
/// headroom on top.
const CAP_SLACK: Duration = Duration::from_millis(600);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "logind_harness=info".into()),
        )
        .try_init();
}

async fn start(inhibit_delay_max: Duration) -> LogindHarness {
    init_tracing();
    match LogindHarness::start(Options {
        mode: Mode::Real,
        inhibit_delay_max,
        ..Options::default()
    })
    .await
    {
        Ok(h) => h,
        Err(e) => panic!("{e}\n{}", error_chain(&e)),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = String::new();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&format!("caused by: {c}\n"));
        cur = c.source();
    }
    s
}

async fn manager(conn: &zbus::Connection) -> zbus::Proxy<'static> {
    zbus::proxy::Builder::new(conn)
        .destination("org.freedesktop.login1")
        .and_then(|b| b.path("/org/freedesktop/login1"))
        .and_then(|b| b.interface("org.freedesktop.login1.Manager"))
        .expect("static names are valid")
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .expect("login1 proxy")
}

async fn take_delay_lock(m: &zbus::Proxy<'_>) -> OwnedFd {
    m.call("Inhibit", &("shutdown", "test", "why", "delay"))
        .await
        .expect("Inhibit(shutdown, test, why, delay)")
}

async fn next_prepare_for_shutdown(stream: &mut zbus::proxy::SignalStream<'_>) -> bool {
    let msg = tokio::time::timeout(SOON, stream.next())
        .await
        .expect("PrepareForShutdown within 5 s")
        .expect("signal stream open");
    msg.body()
        .deserialize::<bool>()
        .expect("PrepareForShutdown(b)")
}

#[tokio::test]
async fn delay_lock_is_listed_and_released() {
    let h = start(Duration::from_secs(5)).await;
    let conn = h.connection().await.expect("connect");
    let m = manager(&conn).await;

    assert!(h.list_inhibitors().await.expect("list").is_empty());
    let fd = take_delay_lock(&m).await;
    let list = h.list_inhibitors().await.expect("list");
    assert_eq!(list.len(), 1, "{list:?}");
    let l = &list[0];
    assert_eq!(
        (
            l.what.as_str(),
            l.who.as_str(),
            l.why.as_str(),
            l.mode.as_str()
        ),
        ("shutdown", "test", "why", "delay")
    );
    assert_eq!(l.uid, 0);
    assert_eq!(l.pid, std::process::id(), "logind records the caller's pid");
    // logind itself reports the lock in its DelayInhibited property.
    let delay_inhibited: String = m.get_property("DelayInhibited").await.expect("property");
    assert_eq!(delay_inhibited, "shutdown");

    drop(fd);
    let list = h
        .wait_for_inhibitors(SOON, |l| l.is_empty())
        .await
        .expect("lock gone after closing the fd");
    assert!(list.is_empty());
    h.shutdown().await;
}

#[tokio::test]
async fn power_off_waits_for_the_delay_lock_and_proceeds_when_its_fd_closes() {
    let h = start(Duration::from_secs(10)).await;
    let conn = h.connection().await.expect("connect");
    let m = manager(&conn).await;
    let mut pfs = m
        .receive_signal("PrepareForShutdown")
        .await
        .expect("subscribe");
    let fd = take_delay_lock(&m).await;

    h.power_off().await.expect("PowerOff");
    assert!(
        next_prepare_for_shutdown(&mut pfs).await,
        "PrepareForShutdown(true)"
    );
    let preparing: bool = m
        .get_property("PreparingForShutdown")
        .await
        .expect("property");
    assert!(preparing);

    // While the fd is open logind holds the shutdown back.
    match h
        .wait_for_unit_started("poweroff.target", HELD_WINDOW)
        .await
    {
        Err(Error::Timeout { .. }) => {}
        other => panic!("poweroff.target must not start while the lock is held: {other:?}"),
    }
    assert!(h.started_units().await.expect("calls").is_empty());

    let t0 = Instant::now();
    drop(fd);
    h.wait_for_unit_started("poweroff.target", SOON)
        .await
        .expect("poweroff.target after the fd closed");
    let latency = t0.elapsed();
    println!("PowerOff -> StartUnit(poweroff.target) after fd close: {latency:?}");
    assert!(
        latency < RELEASE_LATENCY_BOUND,
        "logind took {latency:?} to proceed after the lock was released"
    );
    assert_eq!(h.started_units().await.expect("calls"), ["poweroff.target"]);
    h.shutdown().await;
}

#[tokio::test]
async fn delay_cap_lets_the_shutdown_proceed_while_the_fd_is_still_open() {
    let cap = Duration::from_secs(1);
    let h = start(cap).await;
    assert_eq!(h.inhibit_delay_max().await.expect("property"), cap);
    let conn = h.connection().await.expect("connect");
    let m = manager(&conn).await;
    let fd = take_delay_lock(&m).await;

    let t0 = Instant::now();
    h.power_off().await.expect("PowerOff");
    h.wait_for_unit_started("poweroff.target", cap + SOON)
        .await
        .expect("poweroff.target after the cap");
    let waited = t0.elapsed();
    println!("delay cap {cap:?}: poweroff.target started after {waited:?}");
    assert!(
        waited >= cap,
        "logind did not wait for the lock: {waited:?}"
    );
    assert!(
        waited < cap + CAP_SLACK,
        "logind waited {waited:?} for a {cap:?} cap"
    );
    // The lock is still held (and listed); logind went ahead anyway.
    assert_eq!(h.list_inhibitors().await.expect("list").len(), 1);
    assert!(
        h.logind_output().contains("inhibitor timeout is reached"),
        "{}",
        h.logind_output()
    );
    drop(fd);
    h.shutdown().await;
}

#[tokio::test]
async fn reboot_starts_reboot_target_at_once_without_locks() {
    let h = start(Duration::from_secs(5)).await;
    let conn = h.connection().await.expect("connect");
    let m = manager(&conn).await;
    let mut pfs = m
        .receive_signal("PrepareForShutdown")
        .await
        .expect("subscribe");
    h.reboot().await.expect("Reboot");
    assert!(next_prepare_for_shutdown(&mut pfs).await);
    h.wait_for_unit_started("reboot.target", SOON)
        .await
        .expect("reboot.target");
    assert_eq!(h.started_units().await.expect("calls"), ["reboot.target"]);
    h.shutdown().await;
}

#[tokio::test]
async fn dropin_plus_sighup_changes_inhibit_delay_max() {
    let h = start(Duration::from_secs(1)).await;
    let conn = h.connection().await.expect("connect");
    // A property-caching proxy, as zbus builds by default.
    let cached = zbus::proxy::Builder::<zbus::Proxy<'_>>::new(&conn)
        .destination("org.freedesktop.login1")
        .and_then(|b| b.path("/org/freedesktop/login1"))
        .and_then(|b| b.interface("org.freedesktop.login1.Manager"))
        .expect("static names are valid")
        .build()
        .await
        .expect("proxy");
    let before: u64 = cached
        .get_property("InhibitDelayMaxUSec")
        .await
        .expect("property");
    assert_eq!(before, 1_000_000);

    std::fs::write(
        h.dropin_dir().join("90-nodeward.conf"),
        "[Login]\nInhibitDelayMaxSec=42\n",
    )
    .expect("write drop-in");
    h.sighup_logind().await.expect("reload");
    assert_eq!(
        h.inhibit_delay_max().await.expect("property"),
        Duration::from_secs(42)
    );
    // logind marks the property const and sends no PropertiesChanged on reload: a caching proxy
    // keeps the old value. Clients must read it uncached.
    let stale: u64 = cached
        .get_property("InhibitDelayMaxUSec")
        .await
        .expect("property");
    assert_eq!(stale, 1_000_000, "zbus cache is expected to be stale");

    std::fs::remove_file(h.dropin_dir().join("90-nodeward.conf")).expect("remove drop-in");
    h.sighup_logind().await.expect("reload");
    assert_eq!(
        h.inhibit_delay_max().await.expect("property"),
        Duration::from_secs(1)
    );
    h.shutdown().await;
}

#[tokio::test]
async fn logind_restart_keeps_locks_and_accepts_new_ones() {
    let mut h = start(Duration::from_secs(5)).await;
    let conn = h.connection().await.expect("connect");
    let m = manager(&conn).await;
    let first = take_delay_lock(&m).await;
    let old_pid = h.logind_pid().expect("running");

    h.kill_logind().await.expect("stop logind");
    assert_eq!(h.logind_pid(), None);
    let dbus = zbus::fdo::DBusProxy::new(&conn).await.expect("dbus proxy");
    assert!(
        !dbus
            .name_has_owner("org.freedesktop.login1".try_into().expect("name"))
            .await
            .expect("NameHasOwner")
    );
    let err = m
        .call::<_, _, OwnedFd>("Inhibit", &("shutdown", "test", "why", "delay"))
        .await
        .expect_err("no logind, no lock");
    println!("Inhibit without logind: {err}");

    h.restart_logind().await.expect("restart");
    let new_pid = h.logind_pid().expect("running");
    assert_ne!(new_pid, old_pid);
    // logind re-reads /run/systemd/inhibit: the lock taken before the restart is still there.
    let list = h.list_inhibitors().await.expect("list");
    assert_eq!(list.len(), 1, "{list:?}");
    let second = take_delay_lock(&m).await;
    assert_eq!(h.list_inhibitors().await.expect("list").len(), 2);

    // A crash (SIGKILL) and restart: still the same state, and locks can be taken.
    h.kill_logind_with(Signal::SIGKILL).await.expect("crash");
    h.restart_logind().await.expect("restart after crash");
    assert_eq!(h.list_inhibitors().await.expect("list").len(), 2);
    let third = take_delay_lock(&m).await;
    assert_eq!(h.list_inhibitors().await.expect("list").len(), 3);

    // The lock from before both restarts still holds a shutdown back.
    drop((second, third));
    h.wait_for_inhibitors(SOON, |l| l.len() == 1)
        .await
        .expect("two locks released");
    h.power_off().await.expect("PowerOff");
    match h
        .wait_for_unit_started("poweroff.target", HELD_WINDOW)
        .await
    {
        Err(Error::Timeout { .. }) => {}
        other => panic!("the pre-restart lock must still delay the shutdown: {other:?}"),
    }
    drop(first);
    h.wait_for_unit_started("poweroff.target", SOON)
        .await
        .expect("poweroff.target once the old lock is released");
    h.shutdown().await;
}

#[tokio::test]
async fn cancelled_shutdown_job_sends_prepare_for_shutdown_false_and_locks_work_again() {
    let h = start(Duration::from_secs(5)).await;
    let conn = h.connection().await.expect("connect");
    let m = manager(&conn).await;
    let mut pfs = m
        .receive_signal("PrepareForShutdown")
        .await
        .expect("subscribe");
    let fd = take_delay_lock(&m).await;

    // Nothing to cancel yet.
    assert!(matches!(
        h.cancel_shutdown().await,
        Err(Error::NothingToCancel)
    ));

    h.power_off().await.expect("PowerOff");
    assert!(next_prepare_for_shutdown(&mut pfs).await);
    drop(fd);
    h.wait_for_unit_started("poweroff.target", SOON)
        .await
        .expect("poweroff.target");

    // While the shutdown job runs, logind refuses new delay locks.
    let err = m
        .call::<_, _, OwnedFd>("Inhibit", &("shutdown", "test", "why", "delay"))
        .await
        .expect_err("lock refused while shutting down");
    println!("Inhibit during the shutdown job: {err}");
    assert!(
        matches!(&err, zbus::Error::MethodError(name, _, _) if name.as_str() == "org.freedesktop.login1.OperationInProgress"),
        "{err:?}"
    );

    h.cancel_shutdown().await.expect("cancel");
    assert!(
        !next_prepare_for_shutdown(&mut pfs).await,
        "PrepareForShutdown(false)"
    );
    let preparing: bool = m
        .get_property("PreparingForShutdown")
        .await
        .expect("property");
    assert!(!preparing);
    let again = take_delay_lock(&m).await;
    assert_eq!(h.list_inhibitors().await.expect("list").len(), 1);
    drop(again);
    h.shutdown().await;
}

fn pid_alive(pid: u32) -> bool {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid fits"));
    nix::sys::signal::kill(pid, None).is_ok()
}

fn host_mounts() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo")
}

#[tokio::test]
async fn teardown_leaves_no_processes_mounts_or_files() {
    // Graceful shutdown.
    let h = start(Duration::from_secs(5)).await;
    let pids = h.child_pids();
    assert_eq!(pids.len(), 3, "dbus-daemon, systemd mock, logind: {pids:?}");
    let dir = h.dir().to_path_buf();
    let dir_str = dir.display().to_string();
    assert!(
        !host_mounts().contains(&dir_str),
        "logind's bind mounts must stay in its own namespace"
    );
    h.shutdown().await;
    for pid in &pids {
        assert!(!pid_alive(*pid), "pid {pid} still running after shutdown");
    }
    assert!(!dir.exists(), "{} left behind", dir.display());

    // Drop without shutdown.
    let h = start(Duration::from_secs(5)).await;
    let pids = h.child_pids();
    let dir = h.dir().to_path_buf();
    drop(h);
    for pid in &pids {
        assert!(!pid_alive(*pid), "pid {pid} still running after drop");
    }
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(!host_mounts().contains(&dir.display().to_string()));
}
