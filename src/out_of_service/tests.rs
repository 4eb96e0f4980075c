use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use super::*;

const BOOT: &str = "11111111-2222-3333-4444-555555555555";
const AT: &str = "2026-11-28T12:00:00Z";

fn ts(s: &str) -> jiff::Timestamp {
    s.parse().expect("timestamp")
}

/// A node whose record (if any) was written at [`AT`] for [`BOOT`], whose kubelet reports `boot`
/// and `Ready` = `ready` since `since`, with the out-of-service taint when `taint` (and the record
/// saying nodeward added it when `ours`).
struct N {
    record: bool,
    ours: bool,
    taint: bool,
    boot: &'static str,
    ready: &'static str,
    since: &'static str,
}

const BASE: N = N {
    record: true,
    ours: false,
    taint: false,
    boot: BOOT,
    ready: "False",
    since: "2026-11-28T12:00:40Z",
};

fn node(n: &N) -> Node {
    let mut record =
        json!({"bootId": BOOT, "at": AT, "leftBehind": ["db/db-0"], "terminating": []});
    if n.ours {
        record["taintedAt"] = json!("2026-11-28T12:01:40Z");
    }
    let annotations = if n.record {
        json!({POWER_OFF: record.to_string()})
    } else {
        json!({})
    };
    let taints = if n.taint {
        json!([{"key": OUT_OF_SERVICE_TAINT_KEY, "value": "nodeshutdown", "effect": "NoExecute"}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": "n", "annotations": annotations},
        "spec": {"taints": taints},
        "status": {
            "nodeInfo": {"bootID": n.boot, "machineID": "", "systemUUID": "", "kernelVersion": "",
                "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "conditions": [{"type": "Ready", "status": n.ready, "lastTransitionTime": n.since}]
        }
    }))
    .expect("node")
}

#[test]
fn the_taint_goes_on_only_a_node_announced_off_and_down_long_enough() {
    let after = Duration::from_secs(60);
    let silent = after;
    let now = ts("2026-11-28T12:01:40Z");
    let clear = |untaint| Some(Change::Clear { untaint });
    let cases: [(&str, N, Option<Change>); 14] = [
        ("announced, NotReady 60 s", BASE, Some(Change::Taint)),
        (
            "announced, Unknown 60 s",
            N {
                ready: "Unknown",
                ..BASE
            },
            Some(Change::Taint),
        ),
        (
            "NotReady before the announcement (a CNI fault), silent since",
            N {
                since: "2026-11-28T11:00:00Z",
                ..BASE
            },
            Some(Change::Taint),
        ),
        (
            "no announcement",
            N {
                record: false,
                ..BASE
            },
            None,
        ),
        (
            "still Ready since before the announcement",
            N {
                ready: "True",
                since: "2026-11-28T10:00:00Z",
                ..BASE
            },
            None,
        ),
        (
            "already tainted by nodeward",
            N {
                taint: true,
                ours: true,
                ..BASE
            },
            None,
        ),
        (
            "an operator's taint is left alone",
            N {
                taint: true,
                ..BASE
            },
            None,
        ),
        (
            "a new boot clears nodeward's taint",
            N {
                taint: true,
                ours: true,
                boot: "new",
                ..BASE
            },
            clear(true),
        ),
        (
            "a new boot before the taint clears the record",
            N {
                boot: "new",
                ..BASE
            },
            clear(false),
        ),
        (
            "a new boot keeps an operator's taint",
            N {
                taint: true,
                boot: "new",
                ..BASE
            },
            clear(false),
        ),
        (
            "Ready again on the same boot",
            N {
                taint: true,
                ours: true,
                ready: "True",
                since: "2026-11-28T12:01:30Z",
                ..BASE
            },
            clear(true),
        ),
        (
            "Ready again before the taint (the power-off was cancelled)",
            N {
                ready: "True",
                since: "2026-11-28T12:00:30Z",
                ..BASE
            },
            clear(false),
        ),
        (
            "a kubelet that reports no boot ID yet",
            N { boot: "", ..BASE },
            Some(Change::Taint),
        ),
        (
            "NotReady only 10 min after the record: stale, not the power-off",
            N {
                since: "2026-11-28T12:10:01Z",
                ..BASE
            },
            clear(false),
        ),
    ];
    for (what, n, want) in cases {
        assert_eq!(decide(&node(&n), after, now, silent), want, "{what}");
    }
}

/// Issue 58, item 1: NotReady is no witness of a machine that is off. A kubelet that reports
/// NotReady itself (a CNI or runtime fault) while it still renews its Lease, or a controller
/// whose clock runs ahead, must not bring the taint: only the heartbeat's silence, as the
/// controller saw it, does, and only once it has lasted `after`.
#[test]
fn the_taint_waits_for_the_heartbeat_to_be_silent_for_after_whatever_the_clocks_say() {
    let after = Duration::from_secs(60);
    let long_notready = N {
        since: "2026-11-28T11:00:00Z",
        ..BASE
    };
    // Hours past the record by the wall clock (a replica whose clock runs ahead, or a kubelet
    // NotReady since before the record): the heartbeat still beats, so no taint.
    let later = ts("2026-11-28T12:09:00Z");
    for silent in [0, 1, 30, 59] {
        let silent = Duration::from_secs(silent);
        assert_eq!(
            decide(&node(&long_notready), after, later, silent),
            None,
            "heartbeat silent only {silent:?}"
        );
        assert_eq!(decide(&node(&BASE), after, later, silent), None);
    }
    assert_eq!(
        decide(&node(&long_notready), after, later, after),
        Some(Change::Taint)
    );
    // Silent for long, but Ready: not down.
    let ready = N {
        ready: "True",
        since: "2026-11-28T10:00:00Z",
        ..BASE
    };
    assert_eq!(
        decide(&node(&ready), after, ts("2026-11-28T12:05:00Z"), after * 10),
        None
    );
}

#[test]
fn a_record_on_a_node_still_ready_10_minutes_later_is_stale() {
    let ready = N {
        ready: "True",
        since: "2026-11-28T10:00:00Z",
        ..BASE
    };
    let n = node(&ready);
    assert_eq!(
        decide(
            &n,
            Duration::ZERO,
            ts("2026-11-28T12:10:00Z"),
            Duration::ZERO
        ),
        None
    );
    assert_eq!(
        decide(
            &n,
            Duration::ZERO,
            ts("2026-11-28T12:10:01Z"),
            Duration::ZERO
        ),
        Some(Change::Clear { untaint: false })
    );
}

#[test]
fn a_node_being_deleted_or_with_an_unreadable_record_gets_nothing() {
    let now = ts("2026-11-28T13:00:00Z");
    let mut n = node(&BASE);
    n.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    assert_eq!(decide(&n, Duration::ZERO, now, Duration::MAX), None);
    let mut n = node(&BASE);
    n.metadata
        .annotations
        .get_or_insert_default()
        .insert(POWER_OFF.into(), "not json".into());
    assert_eq!(decide(&n, Duration::ZERO, now, Duration::MAX), None);
}

#[test]
fn the_taint_patch_marks_the_record_and_keeps_other_taints() {
    let mut n = node(&BASE);
    n.spec.get_or_insert_default().taints = Some(vec![Taint {
        key: "other".into(),
        effect: "NoSchedule".into(),
        ..Taint::default()
    }]);
    let now = ts("2026-11-28T12:01:40Z");
    let p = write::patch_for(&n, Change::Taint, now);
    let taints = p["spec"]["taints"].as_array().expect("list");
    assert_eq!(taints.len(), 2, "{p}");
    assert_eq!(taints[1]["key"], OUT_OF_SERVICE_TAINT_KEY);
    assert_eq!(taints[1]["value"], "nodeshutdown");
    assert_eq!(taints[1]["effect"], "NoExecute");
    let record: PowerOff = serde_json::from_str(
        p["metadata"]["annotations"][POWER_OFF]
            .as_str()
            .expect("text"),
    )
    .expect("record");
    assert_eq!(record.tainted_at.as_deref(), Some("2026-11-28T12:01:40Z"));
    assert_eq!(record.left_behind, ["db/db-0"]);

    let mut tainted = node(&N {
        taint: true,
        ours: true,
        ..BASE
    });
    let p = write::patch_for(&tainted, Change::Clear { untaint: true }, now);
    assert_eq!(p["spec"]["taints"], serde_json::Value::Null, "{p}");
    assert_eq!(
        p["metadata"]["annotations"][POWER_OFF],
        serde_json::Value::Null
    );
    tainted.spec = None;
    let p = write::patch_for(&tainted, Change::Clear { untaint: false }, now);
    assert!(p.get("spec").is_none(), "{p}");
}

fn lease(node: &str, renewed: &str, version: &str) -> k8s_openapi::api::coordination::v1::Lease {
    serde_json::from_value(json!({
        "metadata": {"name": node, "namespace": NODE_LEASE_NAMESPACE, "resourceVersion": version},
        "spec": {"holderIdentity": node, "renewTime": renewed, "leaseDurationSeconds": 40}
    }))
    .expect("lease")
}

/// Issue 58, item 1: the silence is timed by the controller's own clock from the last Lease
/// change it saw, or from the record it saw first, whichever is later; a replica that never saw
/// the Lease change counts from its own list; nothing is silent before that list.
#[test]
fn a_heartbeat_is_silent_from_the_last_change_this_replica_saw() {
    use kube::runtime::watcher::Event;
    let t0 = tokio::time::Instant::now();
    let s = |n: u64| t0 + Duration::from_secs(n);
    let n = node(&BASE);
    let mut hb = Heartbeats::default();
    hb.seen(&Event::Init, t0);
    hb.seen(&Event::InitApply(lease("n", AT, "1")), t0);
    assert_eq!(hb.silent_for(&n, s(5)), Duration::ZERO, "not listed yet");
    hb.seen(&Event::InitDone, s(5));
    let mut other = node(&BASE);
    other.metadata.name = Some("other".into());
    assert_eq!(hb.silent_for(&other, s(5)), Duration::ZERO);
    // The record was first seen at 5 s, the Lease last changed at 0 s: silent from 5 s.
    assert_eq!(hb.silent_for(&n, s(20)), Duration::from_secs(15));
    // A renewal restarts the count; the same record again does not.
    hb.seen(
        &Event::Apply(lease("n", "2026-11-28T12:00:10Z", "2")),
        s(30),
    );
    assert_eq!(hb.silent_for(&n, s(40)), Duration::from_secs(10));
    // A write that only moves the resourceVersion is a sign of life too.
    hb.seen(
        &Event::Apply(lease("n", "2026-11-28T12:00:10Z", "3")),
        s(50),
    );
    assert_eq!(hb.silent_for(&n, s(50)), Duration::ZERO);
    // The same Lease seen again (a relist) is no change.
    hb.seen(
        &Event::Apply(lease("n", "2026-11-28T12:00:10Z", "3")),
        s(70),
    );
    assert_eq!(hb.silent_for(&n, s(80)), Duration::from_secs(30));
    // A deleted Lease is a change: the silence starts there.
    hb.seen(
        &Event::Delete(lease("n", "2026-11-28T12:00:10Z", "3")),
        s(90),
    );
    assert_eq!(hb.silent_for(&n, s(95)), Duration::from_secs(5));

    // A node whose Lease this replica never saw: from the list (and its record, seen then).
    assert_eq!(hb.silent_for(&other, s(95)), Duration::from_secs(90));
    // A new record (a later power-off) counts from when it was first seen.
    let mut again = node(&BASE);
    let record = json!({"bootId": BOOT, "at": "2026-11-28T13:00:00Z"}).to_string();
    again
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(POWER_OFF.into(), record);
    assert_eq!(hb.silent_for(&again, s(100)), Duration::ZERO);
    assert_eq!(hb.silent_for(&again, s(103)), Duration::from_secs(3));
    // No record: nothing silent, and nothing kept.
    let mut none = node(&BASE);
    none.metadata.annotations = None;
    assert_eq!(hb.silent_for(&none, s(200)), Duration::ZERO);
}
