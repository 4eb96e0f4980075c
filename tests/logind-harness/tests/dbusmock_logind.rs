//! The harness in `Mode::DbusmockLogind`: dbusmock's `logind` template on the private bus, for
//! edge cases real logind cannot be made to produce on demand (signals in any order, a logind
//! that comes back without its state). Uses a raw zbus client, no nodeward code.
//!
//! Needs the Debian packages `dbus python3-dbusmock`; without them it fails saying so.

use std::time::Duration;

use futures_util::StreamExt;
use logind_harness::{Error, LogindHarness, Mode, Options};
use zbus::zvariant::OwnedFd;

/// How long the test waits for something that should happen at once.
const SOON: Duration = Duration::from_secs(5);

async fn next_bool(stream: &mut zbus::proxy::SignalStream<'_>) -> bool {
    let msg = tokio::time::timeout(SOON, stream.next())
        .await
        .expect("signal within 5 s")
        .expect("signal stream open");
    msg.body().deserialize::<bool>().expect("(b)")
}

#[tokio::test]
async fn dbusmock_logind_locks_signals_and_restart() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let mut h = match LogindHarness::start(Options {
        mode: Mode::DbusmockLogind,
        inhibit_delay_max: Duration::from_secs(3),
        ..Options::default()
    })
    .await
    {
        Ok(h) => h,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        h.child_pids().len(),
        2,
        "dbus-daemon and the logind mock only"
    );
    assert_eq!(
        h.inhibit_delay_max().await.expect("property"),
        Duration::from_secs(3)
    );

    let conn = h.connection().await.expect("connect");
    let m = zbus::proxy::Builder::<zbus::Proxy<'_>>::new(&conn)
        .destination("org.freedesktop.login1")
        .and_then(|b| b.path("/org/freedesktop/login1"))
        .and_then(|b| b.interface("org.freedesktop.login1.Manager"))
        .expect("static names are valid")
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .expect("proxy");
    let mut pfs = m
        .receive_signal("PrepareForShutdown")
        .await
        .expect("subscribe");

    // Locks: the template hands out a pipe and lists it with a fixed uid/pid.
    let fd: OwnedFd = m
        .call("Inhibit", &("shutdown", "test", "why", "delay"))
        .await
        .expect("Inhibit");
    let list = h.list_inhibitors().await.expect("list");
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(
        (list[0].what.as_str(), list[0].mode.as_str()),
        ("shutdown", "delay")
    );
    assert_eq!((list[0].uid, list[0].pid), (1000, 123_456));
    drop(fd);
    h.wait_for_inhibitors(SOON, |l| l.is_empty())
        .await
        .expect("the mock drops the lock when the fd closes");

    // PowerOff announces the shutdown at once; cancel announces its end.
    h.power_off().await.expect("PowerOff");
    assert!(next_bool(&mut pfs).await);
    let preparing: bool = m
        .get_property("PreparingForShutdown")
        .await
        .expect("property");
    assert!(preparing);
    h.cancel_shutdown().await.expect("cancel");
    assert!(!next_bool(&mut pfs).await);

    // Orders real logind never produces: a "false" with no "true" before it, twice.
    h.emit_prepare_for_shutdown(false).await.expect("emit");
    h.emit_prepare_for_shutdown(false).await.expect("emit");
    assert!(!next_bool(&mut pfs).await);
    assert!(!next_bool(&mut pfs).await);

    // Real-logind-only operations say so.
    assert!(matches!(
        h.wait_for_unit_started("poweroff.target", SOON).await,
        Err(Error::Unsupported { .. })
    ));
    assert!(matches!(
        h.sighup_logind().await,
        Err(Error::Unsupported { .. })
    ));

    // logind goes away and comes back: a fresh mock with no locks; a stream subscribed by
    // well-known name keeps receiving from the new owner.
    let fd: OwnedFd = m
        .call("Inhibit", &("shutdown", "test", "why", "delay"))
        .await
        .expect("Inhibit");
    let old_pid = h.logind_pid().expect("running");
    h.kill_logind().await.expect("kill");
    h.restart_logind().await.expect("restart");
    assert_ne!(h.logind_pid(), Some(old_pid));
    assert!(
        h.list_inhibitors().await.expect("list").is_empty(),
        "the mock keeps no state across restarts (real logind does)"
    );
    h.power_off().await.expect("PowerOff on the new mock");
    assert!(
        next_bool(&mut pfs).await,
        "old subscription sees the new owner's signal"
    );
    drop(fd);
    h.shutdown().await;
}
