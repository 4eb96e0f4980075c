use super::*;

fn node(conditions: serde_json::Value, unschedulable: bool, managed: serde_json::Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "n1", "resourceVersion": "7", "managedFields": managed},
        "spec": {"unschedulable": unschedulable},
        "status": {"conditions": conditions},
    }))
    .expect("node")
}

fn cond(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-12-01T00:00:00Z"})
}

/// A condition as the tables write it: type, status, reason.
type Said<'a> = (&'static str, bool, &'a str);

fn said(ws: &[Want]) -> Vec<Said<'_>> {
    ws.iter()
        .map(|w| (w.type_, w.status, w.reason.as_str()))
        .collect()
}

/// The table `docs/src/monitoring.md` shows: each moment and what it sets.
#[test]
fn each_moment_sets_its_conditions() {
    let table: Vec<(Moment<'_>, Vec<Said<'_>>)> = vec![
        (
            Moment::DrainStarted {
                cause: "nodeward drain",
            },
            vec![
                (DRAIN_IN_PROGRESS, true, "Draining"),
                (DRAINED, false, "Draining"),
            ],
        ),
        (
            Moment::DrainEnded {
                emptied: true,
                reason: "Drained",
                message: "m",
            },
            vec![
                (DRAIN_IN_PROGRESS, false, "DrainEnded"),
                (DRAINED, true, "Drained"),
            ],
        ),
        (
            Moment::DrainEnded {
                emptied: false,
                reason: "BudgetUnsatisfiable",
                message: "m",
            },
            vec![
                (DRAIN_IN_PROGRESS, false, "DrainEnded"),
                (DRAINED, false, "BudgetUnsatisfiable"),
            ],
        ),
        (
            Moment::ShutdownPreparing { kind: "PowerOff" },
            vec![(GRACEFUL_SHUTDOWN, true, "PowerOff")],
        ),
        (
            Moment::ShutdownCancelled,
            vec![(GRACEFUL_SHUTDOWN, false, "ShutdownCancelled")],
        ),
        (
            Moment::RebootWaiting {
                reason: "WaitingForWindow",
                message: "m",
            },
            vec![(MAINTENANCE_PLANNED, true, "WaitingForWindow")],
        ),
        (
            Moment::RebootWithdrawn,
            vec![(MAINTENANCE_PLANNED, false, "NotRequested")],
        ),
        (
            Moment::RebootUnderway {
                reason: "Draining",
                message: "m",
            },
            vec![
                (MAINTENANCE_PLANNED, false, "Started"),
                (MAINTENANCE_IN_PROGRESS, true, "Draining"),
            ],
        ),
        (
            Moment::RebootOver {
                reason: "RebootDone",
                message: "m",
            },
            vec![
                (MAINTENANCE_PLANNED, false, "RebootDone"),
                (MAINTENANCE_IN_PROGRESS, false, "RebootDone"),
            ],
        ),
        (
            Moment::ClusterShutdown,
            vec![(MAINTENANCE_IN_PROGRESS, true, "ClusterShutdown")],
        ),
        (
            Moment::ClusterStarted,
            vec![(MAINTENANCE_IN_PROGRESS, false, "ClusterStarted")],
        ),
    ];
    for (m, want) in table {
        assert_eq!(said(&wants(&m)), want, "{m:?}");
        assert!(wants(&m).iter().all(Want::is_lifecycle), "{m:?}");
    }
}

#[test]
fn the_agent_clears_what_is_over_and_nothing_running() {
    let drained = json!([
        cond(DRAIN_IN_PROGRESS, "False", "DrainEnded", "m"),
        cond(DRAINED, "True", "Drained", "m"),
        cond(GRACEFUL_SHUTDOWN, "True", "Reboot", "m"),
    ]);
    let booted_at: jiff::Timestamp = "2026-12-02T00:00:00Z".parse().expect("time");
    let idle = Agent {
        shutting_down: false,
        booted_at,
    };
    // Back from a reboot, uncordoned: the shutdown and the drain are over.
    assert_eq!(
        said(&settle(&node(drained.clone(), false, json!([])), idle)),
        vec![
            (GRACEFUL_SHUTDOWN, false, REASON_BOOTED),
            (DRAIN_IN_PROGRESS, false, REASON_UNCORDONED),
            (DRAINED, false, REASON_UNCORDONED),
        ]
    );
    // Still cordoned: drained it stays; the shutdown of the last boot is over.
    assert_eq!(
        said(&settle(&node(drained.clone(), true, json!([])), idle)),
        vec![(GRACEFUL_SHUTDOWN, false, REASON_BOOTED)]
    );
    // Shutting down and draining: nothing is over.
    let busy = Agent {
        shutting_down: true,
        booted_at,
    };
    assert!(settle(&node(drained.clone(), false, json!([])), busy).is_empty());
    // A shutdown announced in this boot and not under way was cancelled: the cancel says so,
    // not "booted".
    let earlier: jiff::Timestamp = "2026-11-30T00:00:00Z".parse().expect("time");
    let this_boot = Agent {
        shutting_down: false,
        booted_at: earlier,
    };
    assert!(
        !said(&settle(&node(drained, true, json!([])), this_boot)).contains(&(
            GRACEFUL_SHUTDOWN,
            false,
            REASON_BOOTED
        ))
    );
    // Nothing True: nothing to clear (no write on every Node event).
    let quiet = json!([cond(DRAINED, "False", REASON_UNCORDONED, "m")]);
    assert!(settle(&node(quiet, false, json!([])), idle).is_empty());
}

fn managed(manager: &str, type_: &str) -> serde_json::Value {
    json!([{
        "manager": manager, "operation": "Update", "subresource": "status", "apiVersion": "v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {"f:conditions": {
            format!("k:{{\"type\":\"{type_}\"}}"): {".": {}, "f:type": {}, "f:status": {}}
        }}}
    }])
}

#[test]
fn a_condition_another_manager_set_is_theirs() {
    let c = json!([cond(DRAIN_IN_PROGRESS, "True", "Draining", "theirs")]);
    let theirs = node(c.clone(), true, managed("kubectl-drain", DRAIN_IN_PROGRESS));
    assert_eq!(
        foreign(&theirs, DRAIN_IN_PROGRESS).as_deref(),
        Some("kubectl-drain")
    );
    assert_eq!(foreign(&theirs, DRAINED), None);
    let ours = node(c, true, managed(FIELD_MANAGER, DRAIN_IN_PROGRESS));
    assert_eq!(foreign(&ours, DRAIN_IN_PROGRESS), None);
    // Left out of the patch, and said.
    let m = Moment::DrainEnded {
        emptied: true,
        reason: "Drained",
        message: "m",
    };
    let (p, skipped) = patch(&theirs, &wants(&m), jiff::Timestamp::UNIX_EPOCH);
    assert_eq!(
        skipped,
        vec![(DRAIN_IN_PROGRESS, "kubectl-drain".to_string())]
    );
    let p = p.expect("Drained is still nodeward's to write");
    let types: Vec<&str> = p["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .filter_map(|c| c["type"].as_str())
        .collect();
    assert_eq!(types, vec![DRAINED]);
    // nodeward's own conditions are never judged foreign: an edit does not silence readiness.
    let edited = node(
        json!([]),
        false,
        managed("kubectl-edit", "nodeward.io/Reboot"),
    );
    let own = [Want::new("nodeward.io/Reboot", true, "Draining", "m")];
    assert!(
        patch(&edited, &own, jiff::Timestamp::UNIX_EPOCH)
            .0
            .is_some()
    );
}

#[test]
fn status_shows_each_condition_and_whose() {
    let c = json!([
        cond(DRAINED, "True", "Drained", "m"),
        cond(MAINTENANCE_PLANNED, "True", "WaitingForWindow", "m"),
    ]);
    let n = node(c, true, managed("ops-tool", MAINTENANCE_PLANNED));
    assert_eq!(
        summary(&n),
        vec![
            "MaintenancePlanned=True (WaitingForWindow, set by ops-tool)".to_string(),
            "Drained=True (Drained)".to_string(),
        ]
    );
}

#[test]
fn the_transition_time_moves_only_when_the_status_flips() {
    let now: jiff::Timestamp = "2026-12-05T10:00:00Z".parse().expect("time");
    let n = node(
        json!([cond(MAINTENANCE_PLANNED, "True", "WaitingForWindow", "old")]),
        false,
        json!([]),
    );
    let transition = |w: Want| {
        let (p, _) = patch(&n, &[w], now);
        p.expect("a write")["status"]["conditions"][0]["lastTransitionTime"]
            .as_str()
            .map(str::to_string)
    };
    // Same status, another reason: kept.
    assert_eq!(
        transition(Want::new(MAINTENANCE_PLANNED, true, "WaitingForSlot", "m")).as_deref(),
        Some("2026-12-01T00:00:00Z")
    );
    // Flipped: now.
    assert_eq!(
        transition(Want::new(MAINTENANCE_PLANNED, false, "Started", "m")).as_deref(),
        Some("2026-12-05T10:00:00Z")
    );
    // Already said word for word: nothing to write.
    let same = Want::new(MAINTENANCE_PLANNED, true, "WaitingForWindow", "old");
    assert!(patch(&n, &[same], now).0.is_none());
    // The write is guarded by the resourceVersion it was decided from.
    let (p, _) = patch(&n, &[Want::new(DRAINED, true, "Drained", "m")], now);
    assert_eq!(p.expect("a write")["metadata"]["resourceVersion"], "7");
}

/// `cluster start` clears only the maintenance a cluster shutdown said.
#[test]
fn cluster_start_clears_only_the_shutdowns_maintenance() {
    let shutdown = json!([cond(
        MAINTENANCE_IN_PROGRESS,
        "True",
        REASON_CLUSTER_SHUTDOWN,
        "m"
    )]);
    assert_eq!(
        said(&cluster_started(&node(shutdown, true, json!([])))),
        vec![(MAINTENANCE_IN_PROGRESS, false, "ClusterStarted")]
    );
    let reboot = json!([cond(MAINTENANCE_IN_PROGRESS, "True", "Rebooting", "m")]);
    assert!(cluster_started(&node(reboot, true, json!([]))).is_empty());
    assert!(cluster_started(&node(json!([]), false, json!([]))).is_empty());
}
