//! The drain's scheduling under a synthetic clock: every instant below is `t0` plus an offset,
//! so waves, deadlines, fallbacks and retries are checked to the millisecond without waiting.

use serde_json::json;

use super::*;
use crate::config::Wave;
use crate::drain::plan::Cause;

const MS: Duration = Duration::from_millis(1);

/// The DaemonSet watch of a cluster without DaemonSets (these pods are a ReplicaSet's).
fn no_daemonsets(_: &str, _: &str) -> bool {
    false
}

fn pod(name: &str, priority: i32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": {"app": "web"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "r", "controller": true}]},
        "spec": {"containers": [{"name": "c"}], "priority": priority},
        "status": {"phase": "Running"}
    }))
    .expect("pod")
}

/// Two waves (critical pods last, 30% of the deadline), 10 s, concurrency 10.
fn schedule(on_deadline: OnDeadline, concurrency: usize, t0: Instant) -> Schedule {
    schedule_within(on_deadline, concurrency, Duration::from_secs(10), t0)
}

/// [`schedule`] with a deadline of `timeout`.
fn schedule_within(
    on_deadline: OnDeadline,
    concurrency: usize,
    timeout: Duration,
    t0: Instant,
) -> Schedule {
    let limits = Limits {
        concurrency,
        timeout,
        on_deadline,
        unsatisfiable: UnsatisfiableBudgets::Act,
    };
    schedule_limited(limits, t0)
}

/// A schedule of two waves (critical pods last, 30% of the deadline) under `limits`.
fn schedule_limited(limits: Limits, t0: Instant) -> Schedule {
    Schedule::new(
        limits,
        PlanOptions {
            force: false,
            delete_emptydir_data: false,
            waves: vec![
                Wave {
                    min_priority: i32::MIN,
                    share_of_deadline: 0.7,
                },
                Wave {
                    min_priority: 1000,
                    share_of_deadline: 0.3,
                },
            ],
            surge: false,
        },
        t0,
    )
}

fn closed(_: &Tracked) -> bool {
    false
}

fn open(_: &Tracked) -> bool {
    true
}

fn answer(code: u16, cause: Cause) -> Answer {
    Answer {
        code,
        cause,
        matching_budgets: 1,
        message: "m".into(),
    }
}

/// The names evicted by a step, and its wake-up offset from `t0`.
fn run(s: &mut Schedule, t0: Instant, at: Duration, budgets: &dyn Fn(&Tracked) -> bool) -> Step {
    s.step(t0 + at, &budgets)
}

fn evicted(step: &Step) -> Vec<String> {
    match step {
        Step::Run { commands, .. } => commands
            .iter()
            .filter_map(|c| match c {
                Command::Evict(p) => Some(p.name.clone()),
                _ => None,
            })
            .collect(),
        Step::Done(_) => Vec::new(),
    }
}

fn wake(step: &Step, t0: Instant) -> Duration {
    match step {
        Step::Run { wake, .. } => *wake - t0,
        Step::Done(o) => panic!("expected a wait, got Done({o:?})"),
    }
}

fn gone(s: &mut Schedule, names: &[&str]) {
    let present: BTreeSet<String> = s
        .tracked()
        .map(|t| t.pod.uid.clone())
        .filter(|u| !names.contains(&u.as_str()))
        .collect();
    s.observe(&present);
}

#[test]
fn waves_go_in_order_and_the_next_starts_when_the_first_is_gone() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    for p in [pod("a", 0), pod("b", 0), pod("dns", 2000)] {
        s.track(&p, &no_daemonsets);
    }
    let first = run(&mut s, t0, Duration::ZERO, &closed);
    assert_eq!(evicted(&first), ["a", "b"], "only the first wave");
    assert_eq!(
        wake(&first, t0),
        Duration::from_secs(7),
        "its share ends at 7 s"
    );
    for p in ["a", "b"] {
        s.evict_answered(p, &answer(201, Cause::None), vec![], t0 + 10 * MS);
    }
    let waiting = run(&mut s, t0, 20 * MS, &closed);
    assert!(evicted(&waiting).is_empty(), "accepted, not gone yet");
    gone(&mut s, &["a", "b"]);
    let second = run(&mut s, t0, 30 * MS, &closed);
    let Step::Run { commands, .. } = &second else {
        panic!("{second:?}")
    };
    assert_eq!(
        commands[0],
        Command::WaveEnded {
            wave: 0,
            settled: true
        }
    );
    assert_eq!(evicted(&second), ["dns"]);
    s.evict_answered("dns", &answer(201, Cause::None), vec![], t0 + 40 * MS);
    gone(&mut s, &["dns"]);
    assert_eq!(
        run(&mut s, t0, 50 * MS, &closed),
        Step::Done(DrainOutcome::Drained)
    );
    let tally = s.finish();
    assert_eq!(tally.evicted.len(), 3);
    assert_eq!(tally.eviction_requests, 3);
}

#[test]
fn a_wave_that_uses_up_its_share_lets_the_next_one_start() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    s.track(&pod("stuck", 0), &no_daemonsets);
    s.track(&pod("dns", 2000), &no_daemonsets);
    assert_eq!(
        evicted(&run(&mut s, t0, Duration::ZERO, &closed)),
        ["stuck"]
    );
    let refused_at = t0 + Duration::from_secs(4);
    s.evict_answered(
        "stuck",
        &answer(429, Cause::DisruptionBudget),
        vec!["ns/web".into()],
        refused_at,
    );
    let before = run(&mut s, t0, Duration::from_millis(6999), &closed);
    assert!(evicted(&before).is_empty());
    let at_share = run(&mut s, t0, Duration::from_secs(7), &closed);
    let Step::Run { commands, .. } = &at_share else {
        panic!("{at_share:?}")
    };
    assert!(commands.contains(&Command::WaveEnded {
        wave: 0,
        settled: false
    }));
    assert_eq!(
        evicted(&at_share),
        ["dns"],
        "the blocked pod waits for its budget"
    );
}

#[test]
fn each_deadline_policy() {
    let cases: [(OnDeadline, &str); 3] = [
        (OnDeadline::Abandon, "done"),
        (OnDeadline::Wait, "waits"),
        (OnDeadline::Delete, "deletes"),
    ];
    for (policy, expect) in cases {
        let t0 = Instant::now();
        let mut s = schedule(policy, 10, t0);
        s.track(&pod("a", 0), &no_daemonsets);
        assert_eq!(evicted(&run(&mut s, t0, Duration::ZERO, &closed)), ["a"]);
        s.evict_answered(
            "a",
            &answer(429, Cause::DisruptionBudget),
            vec!["ns/web".into()],
            t0,
        );
        let first = run(&mut s, t0, MS, &closed);
        // Without budget events the blocked pod is tried again every 5 s (the ceiling) ...
        assert_eq!(wake(&first, t0), BUDGET_RETRY_CEILING, "{policy:?}");
        match expect {
            "done" => {
                assert_eq!(
                    run(&mut s, t0, Duration::from_secs(10), &closed),
                    Step::Done(DrainOutcome::DeadlineExceeded)
                );
                assert_eq!(s.finish().left_behind.len(), 1);
            }
            "waits" => {
                let past = run(&mut s, t0, Duration::from_secs(10), &closed);
                let Step::Run { commands, wake } = &past else {
                    panic!("{past:?}")
                };
                assert!(commands.contains(&Command::WaitingPastDeadline));
                assert_eq!(
                    *wake - t0,
                    Duration::from_secs(15),
                    "looks again after RETRY_CAP"
                );
                let later = run(&mut s, t0, Duration::from_secs(11), &closed);
                let Step::Run { commands, .. } = &later else {
                    panic!("{later:?}")
                };
                assert!(
                    !commands.contains(&Command::WaitingPastDeadline),
                    "said once"
                );
            }
            _ => {
                // ... and the fallback starts a tenth of the deadline (at least 1 s) before it.
                assert_eq!(evicted(&run(&mut s, t0, 5001 * MS, &closed)), ["a"]);
                let refused = vec!["ns/web".into()];
                s.evict_answered(
                    "a",
                    &answer(429, Cause::DisruptionBudget),
                    refused,
                    t0 + 5001 * MS,
                );
                let before = run(&mut s, t0, 7001 * MS, &closed);
                assert_eq!(
                    wake(&before, t0),
                    Duration::from_secs(9),
                    "wakes for the fallback"
                );
                let fb = run(&mut s, t0, Duration::from_secs(9), &closed);
                let Step::Run { commands, .. } = &fb else {
                    panic!("{fb:?}")
                };
                assert!(
                    commands
                        .iter()
                        .any(|c| matches!(c, Command::Delete { pod, grace_seconds }
                        if pod.name == "a" && *grace_seconds == 1)),
                    "{commands:?}"
                );
                s.delete_answered("a", Deleted::Accepted);
                gone(&mut s, &["a"]);
                assert_eq!(
                    run(&mut s, t0, Duration::from_millis(9500), &closed),
                    Step::Done(DrainOutcome::Drained)
                );
                assert_eq!(s.finish().force_deleted.len(), 1);
            }
        }
    }
}

#[test]
fn a_budget_blocked_pod_is_retried_when_its_budget_opens_but_not_sooner_than_the_floor() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    s.track(&pod("a", 0), &no_daemonsets);
    run(&mut s, t0, Duration::ZERO, &closed);
    s.evict_answered(
        "a",
        &answer(429, Cause::DisruptionBudget),
        vec!["ns/web".into()],
        t0,
    );
    type Budget<'a> = &'a dyn Fn(&Tracked) -> bool;
    let table: [(Duration, Budget, bool, Duration); 4] = [
        // (at, budget, evicts, wake)
        (10 * MS, &open, false, BUDGET_RETRY_FLOOR),
        (10 * MS, &closed, false, BUDGET_RETRY_CEILING),
        (BUDGET_RETRY_FLOOR, &closed, false, BUDGET_RETRY_CEILING),
        (BUDGET_RETRY_FLOOR, &open, true, Duration::from_secs(7)),
    ];
    for (i, (at, budget, evicts, wakes)) in table.into_iter().enumerate() {
        let step = run(&mut s, t0, at, budget);
        assert_eq!(!evicted(&step).is_empty(), evicts, "case {i}: {step:?}");
        assert_eq!(wake(&step, t0), wakes, "case {i}");
    }
    assert_eq!(s.get("a").map(|t| t.attempts), Some(2));
}

#[test]
fn server_errors_back_off_doubling_to_the_cap() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    s.track(&pod("a", 0), &no_daemonsets);
    let mut now = Duration::ZERO;
    let mut waits = Vec::new();
    for _ in 0..5 {
        assert_eq!(evicted(&run(&mut s, t0, now, &closed)), ["a"]);
        s.evict_answered("a", &answer(503, Cause::None), vec![], t0 + now);
        let next = wake(&run(&mut s, t0, now, &closed), t0);
        waits.push((next - now).as_millis());
        now = next;
    }
    assert_eq!(waits, [200, 400, 800, 1600, 3200]);
    assert_eq!(backoff(6), RETRY_CAP);
    assert_eq!(backoff(60), RETRY_CAP);
}

#[test]
fn concurrency_bounds_the_evictions_in_flight() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 2, t0);
    for n in ["a", "b", "c", "d", "e"] {
        s.track(&pod(n, 0), &no_daemonsets);
    }
    assert_eq!(
        evicted(&run(&mut s, t0, Duration::ZERO, &closed)),
        ["a", "b"]
    );
    assert!(
        evicted(&run(&mut s, t0, MS, &closed)).is_empty(),
        "both slots busy"
    );
    s.evict_answered("a", &answer(201, Cause::None), vec![], t0 + MS);
    assert_eq!(evicted(&run(&mut s, t0, 2 * MS, &closed)), ["c"]);
}

#[test]
fn a_pod_gone_before_its_answer_frees_its_slot_and_counts_its_deletion() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Delete, 1, t0);
    s.track(&pod("a", 0), &no_daemonsets);
    s.track(&pod("b", 0), &no_daemonsets);
    assert_eq!(evicted(&run(&mut s, t0, Duration::ZERO, &closed)), ["a"]);
    gone(&mut s, &["a"]);
    s.evict_answered("a", &answer(201, Cause::None), vec![], t0 + MS);
    assert_eq!(
        evicted(&run(&mut s, t0, 2 * MS, &closed)),
        ["b"],
        "the slot is free"
    );
    s.evict_answered(
        "b",
        &answer(429, Cause::DisruptionBudget),
        vec!["ns/web".into()],
        t0,
    );
    let fb = run(&mut s, t0, Duration::from_secs(9), &closed);
    assert!(
        matches!(&fb, Step::Run { commands, .. } if commands.iter().any(|c| matches!(c, Command::Delete { .. })))
    );
    gone(&mut s, &["a", "b"]);
    assert!(
        matches!(
            run(&mut s, t0, Duration::from_millis(9050), &closed),
            Step::Run { .. }
        ),
        "gone, but its deletion's answer is still due"
    );
    s.delete_answered("b", Deleted::Accepted);
    assert_eq!(
        run(&mut s, t0, Duration::from_millis(9100), &closed),
        Step::Done(DrainOutcome::Drained)
    );
    assert_eq!(
        s.finish().force_deleted.len(),
        1,
        "deleted past its budget, and said so"
    );
}

/// Issue 41: the fallback's deletions were counted among the evictions (the DrainSucceeded Event,
/// the agent's DrainSummary) though they bypassed the budgets.
#[test]
fn a_pod_deleted_past_its_budget_is_not_counted_as_evicted() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Delete, 10, t0);
    s.track(&pod("a", 0), &no_daemonsets);
    s.track(&pod("b", 0), &no_daemonsets);
    run(&mut s, t0, Duration::ZERO, &closed);
    s.evict_answered("a", &answer(201, Cause::None), vec![], t0);
    s.evict_answered("b", &answer(429, Cause::DisruptionBudget), vec![], t0);
    run(&mut s, t0, Duration::from_secs(9), &closed);
    s.delete_answered("b", Deleted::Accepted);
    gone(&mut s, &["a", "b"]);
    assert_eq!(
        run(&mut s, t0, Duration::from_millis(9100), &closed),
        Step::Done(DrainOutcome::Drained)
    );
    let tally = s.finish();
    let names = |pods: &[PodRef]| pods.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&tally.evicted), ["a"], "evicted through its budget");
    assert_eq!(
        names(&tally.force_deleted),
        ["b"],
        "deleted past it, and only that"
    );
}

#[test]
fn what_each_answer_leaves_the_pod_in() {
    let t0 = Instant::now();
    let rbac = r#"pods "a" is forbidden: User "u" cannot create resource "pods/eviction" in API group "" in the namespace "ns""#;
    let cases: [(u16, Cause, usize, &str, &str); 7] = [
        (201, Cause::None, 1, "m", "leaving"),
        (404, Cause::None, 1, "m", "leaving"),
        (403, Cause::NamespaceTerminating, 1, "m", "leaving"),
        (500, Cause::None, 2, "m", "refused"),
        (422, Cause::None, 1, "m", "refused"),
        (403, Cause::None, 1, rbac, "forbidden"),
        (
            403,
            Cause::None,
            1,
            "admission webhook \"w\" denied the request",
            "refused",
        ),
    ];
    for (code, cause, budgets, message, want) in cases {
        let mut s = schedule(OnDeadline::Abandon, 10, t0);
        s.track(&pod("a", 0), &no_daemonsets);
        run(&mut s, t0, Duration::ZERO, &closed);
        let a = Answer {
            code,
            cause,
            matching_budgets: budgets,
            message: message.into(),
        };
        let verdict = s.evict_answered("a", &a, vec!["ns/x".into(); budgets], t0);
        let state = s.get("a").map(|t| t.state.clone());
        let got = match (verdict, state) {
            (Verdict::Forbidden, _) => "forbidden",
            (Verdict::Continue, Some(PodState::Leaving)) => "leaving",
            (Verdict::Continue, Some(PodState::Refused(_))) => "refused",
            (v, st) => panic!("{code} {cause:?}: {v:?} {st:?}"),
        };
        assert_eq!(got, want, "{code} {cause:?}");
        if want == "leaving" {
            assert!(
                evicted(&run(&mut s, t0, Duration::from_secs(6), &open)).is_empty(),
                "a pod on its way out is never evicted again"
            );
        }
    }
}

/// Issue 41: a ValidatingAdmissionPolicy refusing one pod's eviction (reason Forbidden) ended
/// the drain with an error, and the pods of later waves were never evicted.
#[test]
fn a_pod_an_admission_check_denies_is_refused_and_the_drain_goes_on() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    s.track(&pod("db", 0), &no_daemonsets);
    s.track(&pod("late", 1000), &no_daemonsets);
    assert_eq!(evicted(&run(&mut s, t0, Duration::ZERO, &closed)), ["db"]);
    let denial = Answer {
        code: 403,
        cause: Cause::None,
        matching_budgets: 0,
        message: r#"pods "db" is forbidden: ValidatingAdmissionPolicy 'keep-db' with binding 'keep-db' denied request: the primary database is never evicted"#.into(),
    };
    assert_eq!(
        s.evict_answered("db", &denial, Vec::new(), t0),
        Verdict::Continue,
        "one pod's denial does not stop the drain"
    );
    assert_eq!(
        evicted(&run(&mut s, t0, MS, &closed)),
        ["late"],
        "the next wave goes on"
    );
    s.evict_answered("late", &answer(201, Cause::None), Vec::new(), t0 + MS);
    s.gone("late");
    assert_eq!(
        run(&mut s, t0, 2 * MS, &closed),
        Step::Done(DrainOutcome::Refused)
    );
    let tally = s.finish();
    assert_eq!(tally.evicted.len(), 1);
    let (refused, why) = &tally.refused[0];
    assert_eq!(refused.name, "db");
    assert!(
        why.to_string()
            .contains("ValidatingAdmissionPolicy 'keep-db'"),
        "{why}"
    );
}

#[test]
fn refused_pods_end_the_drain_as_refused_and_say_why() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    let mut unmanaged = pod("lonely", 0);
    unmanaged.metadata.owner_references = None;
    s.track(&unmanaged, &no_daemonsets);
    assert_eq!(s.counts(), (0, 1));
    assert_eq!(
        run(&mut s, t0, Duration::ZERO, &closed),
        Step::Done(DrainOutcome::Refused)
    );
    let tally = s.finish();
    assert_eq!(
        tally.refused[0].1,
        Refusal::Plan(RefuseReason::Unmanaged),
        "a typed reason"
    );
    assert!(tally.refused[0].1.to_string().contains("--force"));
}

#[test]
fn nothing_to_do_is_drained_at_once_and_a_pod_is_tracked_once() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    assert!(s.is_empty());
    assert_eq!(
        run(&mut s, t0, Duration::ZERO, &closed),
        Step::Done(DrainOutcome::Drained)
    );
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    s.track(&pod("a", 0), &no_daemonsets);
    run(&mut s, t0, Duration::ZERO, &closed);
    s.track(&pod("a", 0), &no_daemonsets);
    assert_eq!(
        s.get("a").map(|t| t.state.clone()),
        Some(PodState::InFlight),
        "a later watch event does not reset a tracked pod"
    );
}

fn annotated(name: &str, timeout: &str) -> Pod {
    let mut p = pod(name, 0);
    p.metadata.annotations = Some(
        [(
            plan::DRAIN_TIMEOUT_ANNOTATION.to_string(),
            timeout.to_string(),
        )]
        .into(),
    );
    p
}

fn blocked_at(s: &mut Schedule, name: &str, at: Instant) {
    s.evict_answered(
        name,
        &answer(429, Cause::DisruptionBudget),
        vec!["ns/web".into()],
        at,
    );
}

#[test]
fn a_pods_own_drain_timeout_starts_at_its_first_refusal_and_applies_the_policy_to_it_alone() {
    for policy in [OnDeadline::Delete, OnDeadline::Abandon, OnDeadline::Wait] {
        let t0 = Instant::now();
        let mut s = schedule(policy, 10, t0);
        s.track(&annotated("capped", "2s"), &no_daemonsets);
        s.track(&pod("free", 0), &no_daemonsets);
        assert!(s.take_notes().is_empty());
        assert_eq!(
            evicted(&run(&mut s, t0, Duration::ZERO, &closed)),
            ["capped", "free"]
        );
        // Refused first at 1 s, again at 2.5 s: its own 2 s count from the first refusal.
        blocked_at(&mut s, "capped", t0 + Duration::from_secs(1));
        blocked_at(&mut s, "free", t0 + Duration::from_secs(1));
        let early = run(&mut s, t0, Duration::from_millis(1500), &closed);
        // Under wait the pod's own timeout changes nothing: the next wake is the budget
        // retry's ceiling, 5 s after the refusal.
        let want_wake = if policy == OnDeadline::Wait {
            t0 + Duration::from_secs(1) + BUDGET_RETRY_CEILING
        } else {
            t0 + Duration::from_secs(3)
        };
        assert_eq!(wake(&early, t0), want_wake - t0, "{policy:?}");
        let at = run(&mut s, t0, Duration::from_secs(3), &closed);
        let Step::Run { commands, .. } = &at else {
            panic!("{policy:?}: {at:?}")
        };
        let deleted: Vec<&str> = commands
            .iter()
            .filter_map(|c| match c {
                Command::Delete { pod, grace_seconds } => {
                    assert_eq!(*grace_seconds, 7, "the time left to the node's deadline");
                    Some(pod.name.as_str())
                }
                _ => None,
            })
            .collect();
        let capped = s.get("capped").map(|t| t.state.clone());
        match policy {
            OnDeadline::Delete => assert_eq!(deleted, ["capped"]),
            OnDeadline::Abandon => {
                assert!(deleted.is_empty());
                assert_eq!(capped, Some(PodState::GaveUp));
                // The other pod goes: the drain ends without waiting for the capped one.
                gone(&mut s, &["free"]);
                assert_eq!(
                    run(&mut s, t0, Duration::from_secs(4), &closed),
                    Step::Done(DrainOutcome::DeadlineExceeded)
                );
                let tally = s.finish();
                assert_eq!(tally.left_behind.len(), 1);
                assert_eq!(tally.left_behind[0].name, "capped");
            }
            OnDeadline::Wait => {
                assert!(deleted.is_empty());
                assert!(matches!(capped, Some(PodState::Blocked { .. })));
            }
        }
    }
}

#[test]
fn a_drain_timeout_that_is_not_a_duration_is_said_once_and_ignored() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    s.track(&annotated("typo", "ninety seconds"), &no_daemonsets);
    let notes = s.take_notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("ns/typo")
            && notes[0].contains("nodeward.io/drain-timeout")
            && notes[0].contains("\"90s\""),
        "{}",
        notes[0]
    );
    assert!(s.take_notes().is_empty());
    assert_eq!(s.get("typo").and_then(|t| t.budget_wait), None);
}

/// A value that parses as a duration but overflows an `Instant` (about 9.5e18 s): once its
/// budget refused the pod, the step added it to the refusal's instant and panicked.
#[test]
fn a_drain_timeout_beyond_any_deadline_is_said_and_ignored_without_a_panic() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Delete, 10, t0);
    s.track(&annotated("huge", "300000000000y"), &no_daemonsets);
    assert_eq!(evicted(&run(&mut s, t0, Duration::ZERO, &closed)), ["huge"]);
    blocked_at(&mut s, "huge", t0 + Duration::from_secs(1));
    let after = run(&mut s, t0, Duration::from_secs(2), &closed);
    assert_eq!(
        wake(&after, t0),
        Duration::from_secs(1) + BUDGET_RETRY_CEILING,
        "waits for its budget as a pod without the annotation"
    );
    let notes = s.take_notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("ns/huge")
            && notes[0].contains("nodeward.io/drain-timeout")
            && notes[0].contains("from 0s to 7days"),
        "{}",
        notes[0]
    );
    assert_eq!(s.get("huge").and_then(|t| t.budget_wait), None);
}

/// The deletions of a delete fallback, with their grace.
fn deletions(step: &Step) -> Vec<(String, u32)> {
    commands(step)
        .into_iter()
        .filter_map(|c| match c {
            Command::Delete { pod, grace_seconds } => Some((pod.name, grace_seconds)),
            _ => None,
        })
        .collect()
}

/// A deadline inside the fallback's 1 s margin (the agent's retry after an API outage, a short
/// InhibitDelayMaxSec, `--timeout` or `nodeward.io/drain-timeout`): the fallback is due at once,
/// yet every pod, of every wave, is first tried with an eviction, and its deletion gives it at
/// least a second of grace (0 s is a forced removal).
#[test]
fn a_deadline_inside_the_fallbacks_margin_evicts_first_and_deletes_with_a_second_of_grace() {
    let t0 = Instant::now();
    let timeout = Duration::from_millis(500);
    let mut s = schedule_within(OnDeadline::Delete, 10, timeout, t0);
    for p in [pod("a", 0), pod("dns", 2000)] {
        s.track(&p, &no_daemonsets);
    }
    let first = run(&mut s, t0, Duration::ZERO, &closed);
    assert_eq!(deletions(&first), [], "no deletion before an eviction");
    assert_eq!(evicted(&first), ["a", "dns"]);
    for p in ["a", "dns"] {
        blocked_at(&mut s, p, t0 + 10 * MS);
    }
    let fallback = run(&mut s, t0, 20 * MS, &closed);
    assert_eq!(deletions(&fallback), [("a".into(), 1), ("dns".into(), 1)]);
}

fn commands(step: &Step) -> Vec<Command> {
    match step {
        Step::Run { commands, .. } => commands.clone(),
        Step::Done(o) => panic!("expected commands, got Done({o:?})"),
    }
}

fn surge_pod(name: &str) -> Pod {
    let mut p = pod(name, 0);
    p.metadata.annotations = Some([("nodeward.io/drain".into(), "surge".into())].into());
    p
}

/// A pod that asks for a surge is not evicted at its turn: the Deployment is asked for a
/// replacement first (with what its budget allows now), and the eviction goes once the
/// replacement is Ready; the pod waits in its own state, which the explanation names.
#[test]
fn a_surge_comes_before_the_eviction() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    s.track(&surge_pod("solo"), &no_daemonsets);
    s.track(&pod("other", 0), &no_daemonsets);
    let first = run(&mut s, t0, Duration::ZERO, &closed);
    assert_eq!(evicted(&first), ["other"], "the other pod goes as always");
    assert!(commands(&first).contains(&Command::Surge {
        pod: PodRef {
            namespace: "ns".into(),
            name: "solo".into(),
            uid: "solo".into()
        },
        replica_set: "rs".into(),
        budget_open: false,
    }));
    let waiting = run(&mut s, t0, 10 * MS, &closed);
    assert!(evicted(&waiting).is_empty(), "waits for the replacement");
    assert!(
        matches!(
            s.get("solo").map(|t| &t.state),
            Some(PodState::Surging { .. })
        ),
        "{:?}",
        s.get("solo")
    );
    s.replaced("solo");
    let now = run(&mut s, t0, 20 * MS, &closed);
    assert_eq!(
        evicted(&now),
        ["solo"],
        "evicted once the replacement is Ready"
    );
    // Only once: a budget's refusal after this is retried as any other, with no second surge.
    s.evict_answered(
        "solo",
        &answer(429, Cause::DisruptionBudget),
        vec![],
        t0 + 30 * MS,
    );
    let retry = run(&mut s, t0, 100 * MS, &open);
    assert_eq!(evicted(&retry), ["solo"]);
    assert!(
        !commands(&retry)
            .iter()
            .any(|c| matches!(c, Command::Surge { .. }))
    );
}

/// A surge that is not needed (or refused) evicts at once; one whose replacement is not Ready by
/// half the time left gives up and evicts without it, saying so.
#[test]
fn a_surge_gives_way_to_the_eviction() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    s.track(&surge_pod("a"), &no_daemonsets);
    s.track(&surge_pod("b"), &no_daemonsets);
    let first = run(&mut s, t0, Duration::ZERO, &open);
    assert!(evicted(&first).is_empty());
    // No surge made for a (not needed); b's replacement is on its way.
    s.replaced("a");
    let next = run(&mut s, t0, 10 * MS, &open);
    assert_eq!(evicted(&next), ["a"], "no surge needed: evicted now");
    // 10 s deadline: b's surge waits 5 s at most, and the schedule wakes for it.
    assert_eq!(wake(&next, t0), Duration::from_secs(5));
    let late = run(&mut s, t0, Duration::from_secs(5), &open);
    let c = commands(&late);
    assert!(
        c.iter()
            .any(|c| matches!(c, Command::SurgeGaveUp(p) if p.name == "b")),
        "{c:?}"
    );
    assert_eq!(evicted(&late), ["b"]);
}

/// `drain.surge = true` surges every Deployment's pod; a StatefulSet's pod asking for one is
/// evicted without it, and told why.
#[test]
fn surge_for_the_node_and_never_for_a_statefulset() {
    let t0 = Instant::now();
    let mut s = Schedule::new(
        Limits {
            concurrency: 10,
            timeout: Duration::from_secs(10),
            on_deadline: OnDeadline::Abandon,
            unsatisfiable: UnsatisfiableBudgets::Act,
        },
        PlanOptions {
            force: false,
            delete_emptydir_data: false,
            waves: crate::config::Settings::default().drain.waves,
            surge: true,
        },
        t0,
    );
    s.track(&pod("web", 0), &no_daemonsets);
    let mut db = surge_pod("db-0");
    if let Some(r) = db.metadata.owner_references.as_mut() {
        r[0].kind = "StatefulSet".into();
    }
    s.track(&db, &no_daemonsets);
    let notes = s.take_notes();
    assert!(
        notes.len() == 1 && notes[0].contains("StatefulSet"),
        "{notes:?}"
    );
    let first = run(&mut s, t0, Duration::ZERO, &open);
    assert_eq!(evicted(&first), ["db-0"]);
    assert!(
        commands(&first)
            .iter()
            .any(|c| matches!(c, Command::Surge { pod, .. } if pod.name == "web"))
    );
}

/// Pods `a*` under budget ns/a, `b*` under ns/b, `x` under none.
struct TwoBudgets;

impl Budgets for TwoBudgets {
    fn open(&self, _: &Tracked) -> bool {
        true
    }
    fn of(&self, t: &Tracked) -> Vec<String> {
        match t.pod.name.chars().next() {
            Some('a') => vec!["ns/a".into()],
            Some('b') => vec!["ns/b".into()],
            _ => Vec::new(),
        }
    }
}

/// One eviction in flight per budget (the API server takes them one at a time, and a concurrent
/// one waits ~500 ms inside it): the next under the same budget goes when the answer comes;
/// pods under no budget, or another, go at once. The drain does not spin while it waits.
#[test]
fn one_eviction_in_flight_per_budget() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    for name in ["a1", "a2", "a3", "b1", "b2", "x1", "x2"] {
        s.track(&pod(name, 0), &no_daemonsets);
    }
    let first = s.step(t0, &TwoBudgets);
    assert_eq!(evicted(&first), ["a1", "b1", "x1", "x2"]);
    assert_eq!(
        wake(&first, t0),
        Duration::from_secs(7),
        "the queued pods wait for an answer, not a timer"
    );
    s.evict_answered("a1", &answer(201, Cause::None), vec![], t0 + 5 * MS);
    let next = s.step(t0 + 5 * MS, &TwoBudgets);
    assert_eq!(evicted(&next), ["a2"], "b's eviction is still in flight");
    s.evict_answered(
        "b1",
        &answer(429, Cause::DisruptionBudget),
        vec![],
        t0 + 6 * MS,
    );
    let after = s.step(t0 + 6 * MS, &TwoBudgets);
    assert_eq!(evicted(&after), ["b2"], "a refusal frees the budget too");
}

#[test]
fn later_adds_and_saturates_instead_of_panicking() {
    let t0 = Instant::now();
    let second = Duration::from_secs(1);
    assert_eq!(later(t0, second), t0 + second);
    assert_eq!(later(t0, Duration::MAX), t0 + FAR_FUTURE);
    assert!(later(t0, Duration::MAX) > later(t0, plan::MAX_BUDGET_WAIT));
}

/// Budgets that never open, and that the drain can show will not for the pods named here.
struct Hopeless(&'static [&'static str]);

impl Budgets for Hopeless {
    fn open(&self, _: &Tracked) -> bool {
        false
    }
    fn of(&self, t: &Tracked) -> Vec<String> {
        // One budget per pod: evictions are not queued behind each other.
        vec![format!("ns/{}", t.pod.name)]
    }
    fn unsatisfiable(&self, t: &Tracked) -> Option<Why> {
        self.0
            .contains(&t.pod.name.as_str())
            .then(|| Why::NeverAllows {
                budget: "ns/web".into(),
                desired_healthy: 2,
                expected: 2,
            })
    }
}

/// The `Unsatisfiable` commands of a step: (pod, acting).
fn verdicts(step: &Step) -> Vec<(String, bool)> {
    match step {
        Step::Run { commands, .. } => commands
            .iter()
            .filter_map(|c| match c {
                Command::Unsatisfiable { pod, acting, .. } => Some((pod.name.clone(), *acting)),
                _ => None,
            })
            .collect(),
        Step::Done(_) => Vec::new(),
    }
}

/// Issue 43: a budget that can never open was waited for until the deadline (90 s at a
/// shutdown), indistinguishable from a slow one. Now the pod gets the deadline policy the moment
/// its refusal is judged hopeless, the verdict is said once, and the drain ends saying why.
#[test]
fn a_budget_that_cannot_open_gets_the_deadline_policy_at_once_and_says_why() {
    let cases = [
        (OnDeadline::Abandon, UnsatisfiableBudgets::Act, "gave up"),
        (OnDeadline::Delete, UnsatisfiableBudgets::Act, "deleted"),
        (OnDeadline::Wait, UnsatisfiableBudgets::Act, "waits"),
        (OnDeadline::Abandon, UnsatisfiableBudgets::Wait, "waits"),
    ];
    for (on_deadline, unsatisfiable, want) in cases {
        let case = format!("{on_deadline:?} {unsatisfiable:?}");
        let t0 = Instant::now();
        let limits = Limits {
            concurrency: 10,
            timeout: Duration::from_secs(10),
            on_deadline,
            unsatisfiable,
        };
        let mut s = schedule_limited(limits, t0);
        s.track(&pod("stuck", 0), &no_daemonsets);
        s.track(&pod("slow", 0), &no_daemonsets);
        let hopeless = Hopeless(&["stuck"]);
        let first = s.step(t0, &hopeless);
        assert_eq!(evicted(&first), ["slow", "stuck"], "{case}");
        assert!(
            verdicts(&first).is_empty(),
            "{case}: judged before any refusal"
        );
        blocked_at(&mut s, "stuck", t0 + Duration::from_secs(1));
        blocked_at(&mut s, "slow", t0 + Duration::from_secs(1));
        let first_look = s.step(t0 + Duration::from_secs(1), &hopeless);
        assert!(
            verdicts(&first_look).is_empty(),
            "{case}: not before it settles"
        );
        let settled = Duration::from_secs(1) + VERDICT_SETTLE;
        assert!(
            wake(&first_look, t0) <= settled,
            "{case}: wakes to settle it"
        );
        let judged = s.step(t0 + settled, &hopeless);
        let acting = want != "waits";
        assert_eq!(verdicts(&judged), [("stuck".to_string(), acting)], "{case}");
        let again = s.step(t0 + settled + 100 * MS, &hopeless);
        assert!(verdicts(&again).is_empty(), "{case}: said once");
        let stuck = s.get("stuck").map(|t| t.state.clone());
        match want {
            "gave up" => assert_eq!(stuck, Some(PodState::GaveUp), "{case}"),
            "deleted" => assert_eq!(stuck, Some(PodState::InFlight), "{case}"),
            // Still the drain's: blocked, or retried after its budget's retry ceiling.
            _ => assert!(
                matches!(stuck, Some(PodState::Blocked { .. } | PodState::InFlight)),
                "{case}: {stuck:?}"
            ),
        }
        if let Step::Run { commands, .. } = &judged
            && want == "deleted"
        {
            assert!(
                commands.iter().any(|c| matches!(c, Command::Delete { pod, grace_seconds: 4 } if pod.name == "stuck")),
                "{case}: deleted with the time left as grace: {commands:?}"
            );
        }
    }
}

#[test]
fn a_drain_left_only_with_hopeless_pods_ends_budget_unsatisfiable() {
    // Given up at once: the drain ends as soon as the rest is gone, saying why.
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    s.track(&pod("stuck", 0), &no_daemonsets);
    s.track(&pod("free", 0), &no_daemonsets);
    let hopeless = Hopeless(&["stuck"]);
    s.step(t0, &hopeless);
    blocked_at(&mut s, "stuck", t0 + MS);
    s.evict_answered("free", &answer(201, Cause::None), vec![], t0 + MS);
    s.step(t0 + 2 * MS, &hopeless);
    s.step(t0 + 2 * MS + VERDICT_SETTLE, &hopeless);
    gone(&mut s, &["free"]);
    assert_eq!(
        s.step(t0 + 3 * MS + VERDICT_SETTLE, &hopeless),
        Step::Done(DrainOutcome::BudgetUnsatisfiable)
    );
    let tally = s.finish();
    assert_eq!(tally.left_behind.len(), 1);
    assert_eq!(tally.unsatisfiable.len(), 1);
    assert_eq!(tally.unsatisfiable[0].0.name, "stuck");

    // Waited for (unsatisfiable_budgets = wait) beside a pod that is only slow: at the deadline
    // the drain cannot say every pod left was hopeless, so it is the deadline that ended it.
    let limits = |unsatisfiable| Limits {
        concurrency: 10,
        timeout: Duration::from_secs(10),
        on_deadline: OnDeadline::Abandon,
        unsatisfiable,
    };
    for (others, want) in [
        (true, DrainOutcome::DeadlineExceeded),
        (false, DrainOutcome::BudgetUnsatisfiable),
    ] {
        let mut s = schedule_limited(limits(UnsatisfiableBudgets::Wait), t0);
        s.track(&pod("stuck", 0), &no_daemonsets);
        if others {
            s.track(&pod("slow", 0), &no_daemonsets);
        }
        s.step(t0, &hopeless);
        blocked_at(&mut s, "stuck", t0 + MS);
        if others {
            blocked_at(&mut s, "slow", t0 + MS);
        }
        s.step(t0 + 2 * MS, &hopeless);
        s.step(t0 + 2 * MS + VERDICT_SETTLE, &hopeless);
        assert_eq!(
            s.step(t0 + Duration::from_secs(10), &hopeless),
            Step::Done(want),
            "others left: {others}"
        );
    }
}

/// Budgets whose verdict on every pod is whatever `hopeless` says at the moment.
struct Flickering {
    hopeless: std::cell::Cell<bool>,
}

impl Budgets for Flickering {
    fn open(&self, _: &Tracked) -> bool {
        false
    }
    fn of(&self, _: &Tracked) -> Vec<String> {
        vec!["ns/web".into()]
    }
    fn unsatisfiable(&self, t: &Tracked) -> Option<Why> {
        Hopeless(&["stuck"])
            .unsatisfiable(t)
            .filter(|_| self.hopeless.get())
    }
}

/// Found on the real control plane: an integer `minAvailable` "requires every pod" for the
/// moment between an evicted pod's deletion and its replacement's creation. A verdict must hold
/// at every look for [`VERDICT_SETTLE`]; one look that finds the budget may open starts over.
#[test]
fn a_verdict_that_does_not_hold_throughout_its_settling_is_not_given() {
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    s.track(&pod("stuck", 0), &no_daemonsets);
    let budgets = Flickering {
        hopeless: std::cell::Cell::new(true),
    };
    s.step(t0, &budgets);
    blocked_at(&mut s, "stuck", t0 + MS);
    s.step(t0 + Duration::from_secs(1), &budgets);
    budgets.hopeless.set(false);
    s.step(t0 + Duration::from_secs(3), &budgets);
    budgets.hopeless.set(true);
    s.step(t0 + Duration::from_secs(4), &budgets);
    let at_six = s.step(t0 + Duration::from_secs(6), &budgets);
    assert!(verdicts(&at_six).is_empty(), "{at_six:?}");
    assert_eq!(evicted(&at_six), ["stuck"], "retried, not given up");
    blocked_at(&mut s, "stuck", t0 + Duration::from_secs(6) + MS);
    let at_nine = s.step(t0 + Duration::from_secs(4) + VERDICT_SETTLE, &budgets);
    assert_eq!(verdicts(&at_nine), [("stuck".to_string(), true)]);
    assert_eq!(s.get("stuck").map(|t| &t.state), Some(&PodState::GaveUp));
}

/// During a recorded cluster shutdown every budget-blocked pod is hopeless at once: no node will
/// take it back, and that is not read from a status that needs to settle.
#[test]
fn a_cluster_shutdown_needs_no_settling() {
    struct ShuttingDown;
    impl Budgets for ShuttingDown {
        fn open(&self, _: &Tracked) -> bool {
            false
        }
        fn of(&self, _: &Tracked) -> Vec<String> {
            vec!["ns/web".into()]
        }
        fn unsatisfiable(&self, _: &Tracked) -> Option<Why> {
            Some(Why::ClusterShutdown)
        }
    }
    let t0 = Instant::now();
    let mut s = schedule(OnDeadline::Abandon, 10, t0);
    s.track(&pod("web", 0), &no_daemonsets);
    s.step(t0, &ShuttingDown);
    blocked_at(&mut s, "web", t0 + MS);
    let judged = s.step(t0 + 2 * MS, &ShuttingDown);
    assert_eq!(verdicts(&judged), [("web".to_string(), true)]);
    assert_eq!(
        s.step(t0 + 3 * MS, &ShuttingDown),
        Step::Done(DrainOutcome::BudgetUnsatisfiable)
    );
}
