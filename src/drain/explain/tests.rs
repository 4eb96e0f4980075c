//! The explanation of a drain under a synthetic clock.

use std::collections::BTreeMap;

use super::*;

fn tracked(name: &str, state: PodState) -> Tracked {
    Tracked {
        pod: PodRef {
            namespace: "default".into(),
            name: name.into(),
            uid: name.into(),
        },
        labels: BTreeMap::new(),
        wave: 0,
        state,
        attempts: 1,
        outstanding: 0,
        fallback_sent: false,
        budget_wait: None,
        first_blocked: None,
        surge: None,
        evicting_under: Vec::new(),
        unsatisfiable: None,
        hopeless_since: None,
    }
}

/// The drain's view of the budgets knows none yet: the refusals' budgets stand.
fn none(_: &Tracked) -> Vec<String> {
    Vec::new()
}

fn blocked(name: &str, since: Instant) -> Tracked {
    tracked(
        name,
        PodState::Blocked {
            since,
            budgets: vec!["default/web".into()],
        },
    )
}

#[test]
fn a_budget_blocked_drain_names_the_longest_blocked_pod_its_budget_and_the_deadline() {
    let t0 = Instant::now();
    let pods = [
        blocked("web-b", t0 + Duration::from_secs(10)),
        blocked("web-a", t0 + Duration::from_secs(3)),
        tracked("api", PodState::Leaving),
        tracked("done", PodState::Gone),
    ];
    let now = t0 + Duration::from_secs(45);
    let e = explain(&pods, now, t0 + Duration::from_secs(123), &none, &|b| {
        (b == "default/web").then_some(0)
    });
    assert_eq!(e.reason, Reason::WaitingForBudget);
    assert_eq!(
        e.to_string(),
        "3 pods left; default/web-a blocked by PDB default/web (0 disruptions allowed) for 42 s, \
         2 pods blocked in all; deadline in 78 s"
    );
}

#[test]
fn each_reason() {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(60);
    let unknown = |_: &str| None;
    let cases = [
        (vec![tracked("a", PodState::Pending)], Reason::Evicting),
        (
            vec![
                tracked("a", PodState::InFlight),
                tracked("b", PodState::Leaving),
            ],
            Reason::Evicting,
        ),
        (
            vec![tracked("a", PodState::Backoff { until: deadline })],
            Reason::WaitingForRetry,
        ),
        (
            vec![tracked("a", PodState::Leaving)],
            Reason::WaitingForTermination,
        ),
        (
            vec![tracked("a", PodState::Pending), blocked("b", t0)],
            Reason::WaitingForBudget,
        ),
    ];
    for (pods, want) in cases {
        assert_eq!(
            explain(&pods, t0, deadline, &none, &unknown).reason,
            want,
            "{pods:?}"
        );
    }
}

#[test]
fn refused_and_gone_pods_are_not_left_and_a_passed_deadline_is_said() {
    let t0 = Instant::now();
    let pods = [
        tracked(
            "bare",
            PodState::Refused(super::super::step::Refusal::MultipleBudgets(vec![])),
        ),
        tracked("gone", PodState::Gone),
        tracked("slow", PodState::Leaving),
    ];
    let e = explain(&pods, t0 + Duration::from_secs(5), t0, &none, &|_| None);
    assert_eq!(e.left, 1);
    assert_eq!(e.to_string(), "1 pod left; deadline passed, still waiting");
}

#[test]
fn the_cause_ignores_the_timers_and_writes_are_spaced() {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(60);
    let pods = [blocked("a", t0)];
    let allowed = |_: &str| Some(0);
    let early = explain(
        &pods,
        t0 + Duration::from_secs(1),
        deadline,
        &none,
        &allowed,
    );
    let later = explain(
        &pods,
        t0 + Duration::from_secs(9),
        deadline,
        &none,
        &allowed,
    );
    assert_ne!(early.to_string(), later.to_string());
    assert!(early.same_cause(&later), "only the timers moved");
    let opened = explain(&pods, t0 + Duration::from_secs(9), deadline, &none, &|_| {
        Some(1)
    });
    assert!(
        !early.same_cause(&opened),
        "the budget's allowance is part of it"
    );

    assert_eq!(write_at(None, false), None, "never written: now");
    assert_eq!(write_at(Some(t0), true), Some(t0 + MIN_WRITE_GAP));
    assert_eq!(write_at(Some(t0), false), Some(t0 + REFRESH));
}

#[test]
fn nodeward_status_describes_a_running_drain_and_the_last_one() {
    let now: jiff::Timestamp = "2026-11-26T22:00:20Z".parse().expect("time");
    let c = |status: &str, reason: &str, message: &str| -> NodeCondition {
        serde_json::from_value(serde_json::json!({
            "type": CONDITION_TYPE, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": "2026-11-26T22:00:17Z",
            "lastTransitionTime": "2026-11-26T22:00:00Z"
        }))
        .expect("condition")
    };
    assert_eq!(
        describe(
            &c("True", "WaitingForBudget", "2 pods left; deadline in 78 s"),
            now
        ),
        "draining since 2026-11-26T22:00:00Z: WaitingForBudget: 2 pods left; deadline in 78 s (said 3 s ago)"
    );
    assert_eq!(
        describe(&c("False", "Drained", "6 pods evicted in 1.2s"), now),
        "not draining; the last drain ended 2026-11-26T22:00:00Z: Drained: 6 pods evicted in 1.2s"
    );
}

/// The first refusals can come back before the drain has listed the budgets: the pod's budget
/// is named as soon as the drain's view of them knows it, and never as an empty name.
#[test]
fn a_budget_not_listed_yet_is_named_once_it_is() {
    let t0 = Instant::now();
    let mut pod = blocked("web-a", t0);
    pod.state = PodState::Blocked {
        since: t0,
        budgets: Vec::new(),
    };
    let pods = [pod];
    let deadline = t0 + Duration::from_secs(60);
    let early = explain(&pods, t0, deadline, &none, &|_| None);
    assert_eq!(
        early.to_string(),
        "1 pod left; default/web-a blocked by a PodDisruptionBudget for 0 s; deadline in 60 s"
    );
    let listed = explain(
        &pods,
        t0,
        deadline,
        &|_| vec!["default/web".into()],
        &|_| Some(0),
    );
    assert_eq!(
        listed.to_string(),
        "1 pod left; default/web-a blocked by PDB default/web (0 disruptions allowed) for 0 s; deadline in 60 s"
    );
    assert!(
        !early.same_cause(&listed),
        "rewritten once the budget is known"
    );
}

/// A pod waiting for its surge's replacement is what the drain waits on, said with the count.
#[test]
fn a_surge_in_progress_is_named() {
    let t0 = Instant::now();
    let surging = PodState::Surging {
        since: t0,
        until: t0 + Duration::from_secs(30),
    };
    let pods = [tracked("solo", surging), tracked("api", PodState::Leaving)];
    let e = explain(
        &pods,
        t0 + Duration::from_secs(2),
        t0 + Duration::from_secs(60),
        &none,
        &|_| None,
    );
    assert_eq!(e.reason, Reason::WaitingForReplacement);
    assert_eq!(
        e.to_string(),
        "2 pods left; 1 pod waiting for a replacement to be Ready elsewhere (surge); deadline in 58 s"
    );
}

/// Issue 43: a drain that waits on a budget it has shown cannot open says so on the Node, not
/// just "waiting for budget".
#[test]
fn a_budget_that_cannot_open_is_named_as_such() {
    let t0 = Instant::now();
    let mut hopeless = blocked("web-a", t0 + Duration::from_secs(3));
    hopeless.unsatisfiable = Some(crate::drain::unsatisfiable::Why::NeverAllows {
        budget: "default/web".into(),
        desired_healthy: 2,
        expected: 2,
    });
    let pods = [blocked("web-b", t0 + Duration::from_secs(1)), hopeless];
    let now = t0 + Duration::from_secs(5);
    let e = explain(&pods, now, t0 + Duration::from_secs(60), &none, &|_| {
        Some(0)
    });
    assert_eq!(e.reason, Reason::BudgetUnsatisfiable);
    assert_eq!(
        e.to_string(),
        "2 pods left; default/web-b blocked by PDB default/web (0 disruptions allowed) for 4 s, \
         2 pods blocked in all; budget unsatisfiable for default/web-a: budget default/web \
         requires 2 healthy pods of the 2 it expects: it allows no disruption unless its workload \
         scales up; deadline in 55 s"
    );
    let progress = Progress::of(&e, jiff::Timestamp::UNIX_EPOCH);
    assert_eq!(progress.reason, "BudgetUnsatisfiable");
    let lines = progress.blocked_lines(jiff::Timestamp::UNIX_EPOCH);
    assert!(
        lines[1].contains("cannot open: budget default/web requires"),
        "{lines:?}"
    );
}
