//! The drain's schedule, driven against a model API server that enforces budgets as
//! kube-apiserver does (an eviction is accepted only while the budget allows a disruption,
//! answers come back after a latency, some requests fail with 500, evicted pods take a while to
//! go and their replacements a while to become healthy elsewhere, or never do). Properties, for
//! any such cluster:
//! - no budget ever falls below its minimum except through the `delete` fallback, which sends
//!   nothing before its time, only for pods still on the node whose eviction was tried, and
//!   never with a grace of 0 s (a forced removal);
//! - no more evictions are in flight than the drain's concurrency;
//! - a drain that does not wait past its deadline is over by then;
//! - the report accounts for every pod once: gone (and how), refused, or left behind.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::config::Wave;
use crate::drain::plan::Cause;

/// One budget: pods it selects elsewhere (healthy), disruptions it allows at the start, and
/// when a replacement of an evicted pod becomes healthy elsewhere (never if `None`).
#[derive(Debug, Clone)]
struct Budget {
    elsewhere: u32,
    slack: u32,
    replace_ms: Option<u64>,
}

#[derive(Debug, Clone)]
struct Case {
    /// Per pod on the node: the budget that selects it, and its priority.
    pods: Vec<(Option<usize>, i32)>,
    budgets: Vec<Budget>,
    concurrency: usize,
    delete_fallback: bool,
    /// Per eviction request, cyclically: whether the API server fails it with 500.
    flaky: Vec<bool>,
    latency_ms: u64,
    leave_ms: u64,
    timeout_s: u64,
}

fn cases() -> impl Strategy<Value = Case> {
    let budget = (0u32..4, 0u32..3, prop::option::of(10u64..3_000)).prop_map(
        |(elsewhere, slack, replace_ms)| Budget {
            elsewhere,
            slack,
            replace_ms,
        },
    );
    (
        prop::collection::vec(budget, 1..4),
        prop::collection::vec((0usize..5, prop::sample::select(vec![0, 2000])), 1..25),
        1usize..6,
        any::<bool>(),
        prop::collection::vec(prop::bool::weighted(0.15), 1..8),
        1u64..200,
        0u64..2_000,
        2u64..30,
    )
        .prop_map(
            |(
                budgets,
                pods,
                concurrency,
                delete_fallback,
                flaky,
                latency_ms,
                leave_ms,
                timeout_s,
            )| {
                let n = budgets.len();
                Case {
                    // An index past the budgets means no budget.
                    pods: pods
                        .into_iter()
                        .map(|(b, p)| ((b < n).then_some(b), p))
                        .collect(),
                    budgets,
                    concurrency,
                    delete_fallback,
                    flaky,
                    latency_ms,
                    leave_ms,
                    timeout_s,
                }
            },
        )
}

fn pod(i: usize, budget: Option<usize>, priority: i32) -> Pod {
    let label = budget.map_or_else(|| "none".to_string(), |b| format!("b{b}"));
    serde_json::from_value(json!({
        "metadata": {"name": format!("p{i}"), "namespace": "ns", "uid": format!("p{i}"),
            "labels": {"budget": label},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                "uid": "r", "controller": true}]},
        "spec": {"containers": [{"name": "c"}], "priority": priority},
        "status": {"phase": "Running"}
    }))
    .expect("pod")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnNode {
    Healthy,
    Leaving,
    Gone,
}

#[derive(Debug)]
enum Event {
    Evicted(String, Answer),
    PodGone(String),
    Replaced(usize),
}

/// The model API server and cluster.
struct Model {
    budget_of: BTreeMap<String, Option<usize>>,
    pods: BTreeMap<String, OnNode>,
    healthy: Vec<i64>,
    min: Vec<i64>,
    replace_ms: Vec<Option<u64>>,
    flaky: Vec<bool>,
    requests: usize,
    events: BTreeMap<Instant, Vec<Event>>,
    in_flight: usize,
    deleted: BTreeSet<String>,
    evicted: BTreeSet<String>,
    /// Pods an eviction was sent for.
    tried: BTreeSet<String>,
    leave: Duration,
    latency: Duration,
}

impl Model {
    fn at(&mut self, when: Instant, e: Event) {
        self.events.entry(when).or_default().push(e);
    }

    fn budget_open(&self, t: &Tracked) -> bool {
        match self.budget_of.get(&t.pod.uid).copied().flatten() {
            Some(b) => self.healthy[b] > self.min[b],
            None => true,
        }
    }

    /// A pod starts leaving: unhealthy now, gone later, replaced elsewhere later still.
    fn disrupt(&mut self, uid: &str, now: Instant) {
        self.pods.insert(uid.to_string(), OnNode::Leaving);
        self.at(now + self.leave, Event::PodGone(uid.to_string()));
        if let Some(b) = self.budget_of[uid] {
            self.healthy[b] -= 1;
            if let Some(ms) = self.replace_ms[b] {
                self.at(now + Duration::from_millis(ms), Event::Replaced(b));
            }
        }
    }

    fn evict(&mut self, uid: &str, now: Instant) -> Answer {
        let flaky = self.flaky[self.requests % self.flaky.len()];
        self.requests += 1;
        let answer = |code, cause| Answer {
            code,
            cause,
            matching_budgets: 1,
            message: String::new(),
        };
        if flaky {
            return answer(500, Cause::None);
        }
        match self.pods[uid] {
            OnNode::Gone => answer(404, Cause::None),
            OnNode::Leaving => answer(201, Cause::None),
            OnNode::Healthy => {
                let allowed = self.budget_of[uid].is_none_or(|b| self.healthy[b] > self.min[b]);
                if allowed {
                    self.evicted.insert(uid.to_string());
                    self.disrupt(uid, now);
                    answer(201, Cause::None)
                } else {
                    answer(429, Cause::DisruptionBudget)
                }
            }
        }
    }

    fn delete(&mut self, uid: &str, now: Instant) -> Deleted {
        match self.pods[uid] {
            OnNode::Gone => Deleted::Gone,
            OnNode::Leaving => Deleted::Accepted,
            OnNode::Healthy => {
                self.deleted.insert(uid.to_string());
                self.disrupt(uid, now);
                Deleted::Accepted
            }
        }
    }

    fn next_event(&self) -> Option<Instant> {
        self.events.keys().next().copied()
    }
}

/// The schedule of `case`'s drain (two waves, its deadline policy), started at `t0`.
fn schedule(case: &Case, t0: Instant) -> Schedule {
    Schedule::new(
        Limits {
            concurrency: case.concurrency,
            timeout: Duration::from_secs(case.timeout_s),
            on_deadline: if case.delete_fallback {
                OnDeadline::Delete
            } else {
                OnDeadline::Abandon
            },
            unsatisfiable: UnsatisfiableBudgets::Act,
        },
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

impl Model {
    /// The cluster of `case`: every pod on the node healthy, each budget's minimum its healthy
    /// count less its slack.
    fn of(case: &Case) -> Self {
        let mut m = Model {
            budget_of: BTreeMap::new(),
            pods: BTreeMap::new(),
            healthy: Vec::new(),
            min: Vec::new(),
            replace_ms: case.budgets.iter().map(|b| b.replace_ms).collect(),
            flaky: case.flaky.clone(),
            requests: 0,
            events: BTreeMap::new(),
            in_flight: 0,
            deleted: BTreeSet::new(),
            evicted: BTreeSet::new(),
            tried: BTreeSet::new(),
            leave: Duration::from_millis(case.leave_ms),
            latency: Duration::from_millis(case.latency_ms),
        };
        for (b, budget) in case.budgets.iter().enumerate() {
            let on_node = case.pods.iter().filter(|(p, _)| *p == Some(b)).count();
            let total = i64::try_from(on_node).unwrap_or(i64::MAX) + i64::from(budget.elsewhere);
            m.healthy.push(total);
            m.min.push((total - i64::from(budget.slack)).max(0));
        }
        for (i, (b, _)) in case.pods.iter().enumerate() {
            m.budget_of.insert(format!("p{i}"), *b);
            m.pods.insert(format!("p{i}"), OnNode::Healthy);
        }
        m
    }

    /// Feeds the schedule everything that happened by `now`, in order.
    fn deliver(&mut self, s: &mut Schedule, now: Instant) {
        while let Some(at) = self.next_event().filter(|at| *at <= now) {
            for e in self.events.remove(&at).unwrap_or_default() {
                match e {
                    Event::Evicted(uid, answer) => {
                        self.in_flight -= 1;
                        let matching = self.budget_of[&uid]
                            .map(|b| vec![format!("ns/b{b}")])
                            .unwrap_or_default();
                        s.evict_answered(&uid, &answer, matching, at);
                    }
                    Event::PodGone(uid) => {
                        self.pods.insert(uid.clone(), OnNode::Gone);
                        s.gone(&uid);
                    }
                    Event::Replaced(b) => self.healthy[b] += 1,
                }
            }
        }
    }

    /// Runs the step's commands as the API server would, checking each.
    fn perform(
        &mut self,
        s: &mut Schedule,
        case: &Case,
        commands: &[Command],
        now: Instant,
        fallback_at: Instant,
    ) -> Result<(), TestCaseError> {
        for c in commands {
            match c {
                Command::Evict(p) => {
                    self.in_flight += 1;
                    prop_assert!(
                        self.in_flight <= case.concurrency,
                        "{} evictions in flight, concurrency {}",
                        self.in_flight,
                        case.concurrency
                    );
                    self.tried.insert(p.uid.clone());
                    let answer = self.evict(&p.uid, now);
                    self.at(now + self.latency, Event::Evicted(p.uid.clone(), answer));
                }
                Command::Unsatisfiable { pod, .. } => {
                    prop_assert!(false, "{pod} judged unsatisfiable with no evidence asked");
                }
                Command::Delete { pod, grace_seconds } => {
                    prop_assert!(case.delete_fallback, "a delete without the delete fallback");
                    prop_assert!(self.tried.contains(&pod.uid), "a delete before an eviction");
                    prop_assert!(*grace_seconds >= 1, "a forced delete (grace 0)");
                    prop_assert!(now >= fallback_at, "a delete before the fallback's time");
                    prop_assert!(
                        self.pods[&pod.uid] != OnNode::Gone,
                        "a delete of a pod already gone"
                    );
                    let result = self.delete(&pod.uid, now);
                    s.delete_answered(&pod.uid, result);
                }
                Command::WaveEnded { .. } | Command::WaitingPastDeadline => {}
                Command::Surge { .. } | Command::SurgeGaveUp(_) => {
                    prop_assert!(false, "a surge no pod asked for: {c:?}");
                }
            }
        }
        Ok(())
    }

    /// No budget below its minimum but through a fallback delete of one of its pods.
    fn check_budgets(&self) -> Result<(), TestCaseError> {
        for b in 0..self.healthy.len() {
            let forced = self.deleted.iter().any(|u| self.budget_of[u] == Some(b));
            prop_assert!(
                self.healthy[b] >= self.min[b] || forced,
                "budget b{b} at {} healthy, minimum {}, with no fallback delete",
                self.healthy[b],
                self.min[b]
            );
        }
        Ok(())
    }
}

/// The drain ended at `now`: by its deadline, its report matching what happened.
fn check_report(
    s: Schedule,
    m: &Model,
    case: &Case,
    now: Instant,
    deadline: Instant,
) -> Result<(), TestCaseError> {
    prop_assert!(
        now <= deadline + m.latency,
        "a drain that does not wait ended {:?} after its deadline",
        now - deadline
    );
    let tally = s.finish();
    let evicted: BTreeSet<String> = tally.evicted.iter().map(|p| p.uid.clone()).collect();
    let model_gone: BTreeSet<String> = m
        .pods
        .iter()
        .filter(|(_, st)| **st == OnNode::Gone)
        .map(|(u, _)| u.clone())
        .collect();
    let forced: BTreeSet<String> = tally.force_deleted.iter().map(|p| p.uid.clone()).collect();
    prop_assert_eq!(
        forced.clone(),
        m.deleted.clone(),
        "the report's deleted pods"
    );
    prop_assert_eq!(
        evicted,
        &model_gone - &forced,
        "the report's evicted pods: gone, and not deleted past a budget"
    );
    prop_assert_eq!(
        tally.evicted.len()
            + tally.refused.len()
            + tally.left_behind.len()
            + model_gone.intersection(&forced).count(),
        case.pods.len(),
        "every pod once"
    );
    Ok(())
}

/// Runs the drain of `case` to its end, checking the properties on the way.
fn drive(case: &Case) -> Result<(), TestCaseError> {
    let t0 = Instant::now();
    let mut s = schedule(case, t0);
    let mut m = Model::of(case);
    for (i, (b, priority)) in case.pods.iter().enumerate() {
        s.track(&pod(i, *b, *priority), &|_, _| false);
    }
    let timeout = Duration::from_secs(case.timeout_s);
    let (deadline, fallback_at) = (t0 + timeout, t0 + timeout - plan::fallback_margin(timeout));
    let mut now = t0;
    for _ in 0..100_000 {
        m.deliver(&mut s, now);
        let (commands, wake) = match s.step(now, &|t: &Tracked| m.budget_open(t)) {
            Step::Done(_) => return check_report(s, &m, case, now, deadline),
            Step::Run { commands, wake } => (commands, wake),
        };
        m.perform(&mut s, case, &commands, now, fallback_at)?;
        m.check_budgets()?;
        // Answers are events; with none due, sleep until the next event or the wake-up.
        let next = m.next_event().map_or(wake, |e| e.min(wake));
        now = if commands.is_empty() {
            next.max(now + Duration::from_millis(1))
        } else {
            now + Duration::from_millis(1)
        };
    }
    Err(TestCaseError::fail("the drain never ended"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_drain_keeps_budgets_concurrency_and_its_deadline(case in cases()) {
        drive(&case)?;
    }
}
