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
    let now = ts("2026-11-28T12:01:40Z");
    let clear = |untaint| Some(Change::Clear { untaint });
    let cases: [(&str, N, Option<Change>); 15] = [
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
            "announced, NotReady 59 s",
            N {
                since: "2026-11-28T12:00:41Z",
                ..BASE
            },
            None,
        ),
        (
            "NotReady before the announcement: counted from the announcement",
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
        assert_eq!(decide(&node(&n), after, now), want, "{what}");
    }
}

#[test]
fn a_record_on_a_node_still_ready_10_minutes_later_is_stale() {
    let ready = N {
        ready: "True",
        since: "2026-11-28T10:00:00Z",
        ..BASE
    };
    let n = node(&ready);
    assert_eq!(decide(&n, Duration::ZERO, ts("2026-11-28T12:10:00Z")), None);
    assert_eq!(
        decide(&n, Duration::ZERO, ts("2026-11-28T12:10:01Z")),
        Some(Change::Clear { untaint: false })
    );
}

#[test]
fn a_node_being_deleted_or_with_an_unreadable_record_gets_nothing() {
    let now = ts("2026-11-28T13:00:00Z");
    let mut n = node(&BASE);
    n.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    assert_eq!(decide(&n, Duration::ZERO, now), None);
    let mut n = node(&BASE);
    n.metadata
        .annotations
        .get_or_insert_default()
        .insert(POWER_OFF.into(), "not json".into());
    assert_eq!(decide(&n, Duration::ZERO, now), None);
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
