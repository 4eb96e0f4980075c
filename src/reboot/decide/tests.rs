use super::*;
use crate::config::Unavailable;

fn rec(boot: &str) -> Record {
    Record {
        slot: "nodeward-reboot-0".into(),
        boot_id: boot.into(),
        phase: "rebooting".into(),
        since: "2026-11-28T08:00:00Z".into(),
    }
}

/// (request, record, this boot) → next step.
#[test]
fn the_pass_follows_the_record_and_the_request() {
    let cases = [
        (None, None, Next::Idle),
        (Some(Request::Sentinel), None, Next::Try(Request::Sentinel)),
        (
            Some(Request::Manual),
            Some(rec("b1")),
            Next::Resume(rec("b1")),
        ),
        (None, Some(rec("b1")), Next::Abandon(rec("b1"))),
        // Another boot: the reboot happened, whatever is asked now.
        (None, Some(rec("b0")), Next::Back(rec("b0"))),
        (
            Some(Request::Sentinel),
            Some(rec("b0")),
            Next::Back(rec("b0")),
        ),
    ];
    for (requested, record, want) in cases {
        assert_eq!(
            next(requested, record.clone(), "b1"),
            want,
            "{requested:?} {record:?}"
        );
    }
}

fn clear() -> Before {
    Before {
        pods: vec![],
        alerts: Ok(vec![]),
        unavailable: Ok(vec![]),
        nodes: 8,
        budgets: vec![],
        unevictable: vec![],
    }
}

/// Each check holds the slot on its own, in the order blockers, alerts, health, budgets.
#[test]
fn every_check_holds_the_slot_and_says_why() {
    let s = RebootSettings {
        concurrency: 2,
        ..RebootSettings::default()
    };
    assert_eq!(may_take_slot(&s, &clear()), Ok(()));
    type Change = Box<dyn Fn(&mut Before)>;
    let cases: [(Change, &str); 7] = [
        (
            Box::new(|b| b.pods = vec!["db/backup-1".into()]),
            "BlockedByPods",
        ),
        (
            Box::new(|b| b.alerts = Ok(vec!["DiskFull".into()])),
            "BlockedByAlerts",
        ),
        (
            Box::new(|b| b.alerts = Err("connection refused".into())),
            "BlockedByAlerts",
        ),
        // concurrency 2: one other unavailable plus this node is 2, allowed...
        (
            Box::new(|b| b.unavailable = Ok(vec!["n1 (NotReady)".into(), "n2 (cordoned)".into()])),
            "WaitingForHealth",
        ),
        (
            Box::new(|b| b.budgets = vec!["web/web allows 0, needs 1".into()]),
            "WaitingForBudgets",
        ),
        (
            Box::new(|b| {
                b.budgets = vec!["x".into()];
                b.pods = vec!["y".into()];
            }),
            "BlockedByPods",
        ),
        (
            Box::new(|b| {
                b.budgets = vec!["x".into()];
                b.unevictable = vec!["default/bare (no controller)".into()];
            }),
            "BlockedByUnevictablePods",
        ),
    ];
    for (change, reason) in cases {
        let mut b = clear();
        change(&mut b);
        let e = may_take_slot(&s, &b).unwrap_err();
        assert_eq!(e.reason(), reason, "{}", e.message());
    }
    // ...so one other unavailable node passes.
    let mut b = clear();
    b.unavailable = Ok(vec!["n1 (rebooting)".into()]);
    assert_eq!(may_take_slot(&s, &b), Ok(()));
}

#[test]
fn the_health_gate_counts_a_share_of_the_nodes() {
    let s = RebootSettings {
        max_unavailable: Some(Unavailable::Percent(25)),
        ..RebootSettings::default()
    };
    let mut b = clear();
    b.unavailable = Ok(vec!["n1 (NotReady)".into()]);
    // 25% of 8 is 2: one other plus this one.
    assert_eq!(may_take_slot(&s, &b), Ok(()));
    b.unavailable = Ok(vec!["n1 (NotReady)".into(), "n2 (NotReady)".into()]);
    let e = may_take_slot(&s, &b).unwrap_err();
    assert!(e.message().contains("at most 2 may be"), "{}", e.message());
}

fn node(name: &str, ready: bool, cordoned: bool) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"unschedulable": cordoned},
        "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
    }))
    .unwrap()
}

#[test]
fn a_node_is_unavailable_when_not_ready_cordoned_or_rebooting() {
    let holders = vec!["n3".to_string()];
    assert_eq!(unavailable(&node("n1", true, false), &holders), None);
    assert_eq!(
        unavailable(&node("n1", false, false), &holders),
        Some("NotReady")
    );
    assert_eq!(
        unavailable(&node("n1", true, true), &holders),
        Some("cordoned")
    );
    assert_eq!(
        unavailable(&node("n3", true, false), &holders),
        Some("rebooting")
    );
}

#[test]
fn the_record_is_read_from_the_node_annotation() {
    let mut n = node("n1", true, false);
    assert_eq!(record(&n), None);
    n.metadata.annotations = Some(
        [(
            RECORD.to_string(),
            serde_json::to_string(&rec("b0")).unwrap(),
        )]
        .into(),
    );
    assert_eq!(record(&n), Some(rec("b0")));
    n.metadata.annotations = Some([(RECORD.to_string(), "{not json".to_string())].into());
    assert_eq!(record(&n), None);
}

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// A node coming back is waited for gate by gate, uncordoned, then settles before its slot goes.
#[test]
fn a_returning_node_releases_its_slot_only_after_it_settled() {
    let settle = Duration::from_secs(60);
    let now = at("2026-11-28T09:00:00Z");
    let back_ok = Return {
        kubelet_ready: true,
        gates_pass: true,
        startup_taint: false,
        cordon: Cordon::None,
    };
    let cases = [
        (
            Return {
                kubelet_ready: false,
                ..back_ok
            },
            None,
            BackStep::Wait("kubelet's Ready condition"),
        ),
        (
            Return {
                gates_pass: false,
                ..back_ok
            },
            None,
            BackStep::Wait("the readiness gates"),
        ),
        (
            Return {
                startup_taint: true,
                ..back_ok
            },
            None,
            BackStep::Wait("the startup taint's removal"),
        ),
        (
            Return {
                cordon: Cordon::Ours,
                ..back_ok
            },
            None,
            BackStep::Uncordon,
        ),
        (
            back_ok,
            None,
            BackStep::Settle {
                since: now,
                until: at("2026-11-28T09:01:00Z"),
            },
        ),
        (
            back_ok,
            Some(at("2026-11-28T08:59:30Z")),
            BackStep::Settle {
                since: at("2026-11-28T08:59:30Z"),
                until: at("2026-11-28T09:00:30Z"),
            },
        ),
        (back_ok, Some(at("2026-11-28T08:59:00Z")), BackStep::Release),
        // An administrator's cordon is theirs: the reboot is over without lifting it.
        (
            Return {
                cordon: Cordon::Other,
                ..back_ok
            },
            Some(at("2026-11-28T08:58:00Z")),
            BackStep::Release,
        ),
    ];
    for (r, since, want) in cases {
        assert_eq!(back(r, since, settle, now), want, "{r:?} {since:?}");
    }
}

/// Unknown health is not good health: a Node list that failed holds the slot whatever
/// `max_unavailable` allows. Before, it counted as one unavailable node out of none, which a
/// `max_unavailable` of 2 or more let through.
#[test]
fn a_failed_node_list_holds_the_slot() {
    for max in [1, 2, 5] {
        let s = RebootSettings {
            concurrency: 2,
            max_unavailable: Some(Unavailable::Count(max)),
            ..RebootSettings::default()
        };
        let mut b = clear();
        b.unavailable = Err("nodes is forbidden".into());
        let e = may_take_slot(&s, &b).unwrap_err();
        assert_eq!(e.reason(), "HealthUnknown", "max_unavailable {max}");
        assert!(
            e.message().contains("nodes is forbidden"),
            "{}",
            e.message()
        );
    }
    // Blockers still come first: the operator's explicit "not now" is the reason shown.
    let mut b = clear();
    b.unavailable = Err("500".into());
    b.pods = vec!["db/backup".into()];
    let e = may_take_slot(&RebootSettings::default(), &b).unwrap_err();
    assert_eq!(e.reason(), "BlockedByPods");
}

/// kured's lock, then the window; a DaemonSet list that failed is not "no kured".
#[test]
fn kured_and_the_window_come_before_the_slots() {
    let open = RebootSettings::default();
    let now = at("2026-12-06T03:00:00Z");
    assert_eq!(may_look_for_slot(&open, Ok(None), now), Ok(()));
    let cases = [
        (
            Ok(Some("kube-system/kured: {}".to_string())),
            "KuredPresent",
        ),
        (
            Err("daemonsets.apps is forbidden".to_string()),
            "KuredUnknown",
        ),
    ];
    for (kured, reason) in cases {
        let e = may_look_for_slot(&open, kured, now).unwrap_err();
        assert_eq!(e.reason(), reason, "{}", e.message());
    }
    let closed = RebootSettings {
        window: crate::window::Window::new(
            &[jiff::civil::Weekday::Monday],
            jiff::civil::time(0, 0, 0, 0),
            jiff::civil::time(0, 0, 0, 0),
            jiff::tz::TimeZone::UTC,
            "UTC",
        ),
        ..open.clone()
    };
    // 2026-12-06 is a Sunday.
    let e = may_look_for_slot(&closed, Ok(None), now).unwrap_err();
    assert_eq!(e.reason(), "WaitingForWindow", "{}", e.message());
    // kured's lock is said before the window.
    let e = may_look_for_slot(&closed, Err("500".into()), now).unwrap_err();
    assert_eq!(e.reason(), "KuredUnknown");
}
