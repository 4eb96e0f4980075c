//! The drain's scheduling, decided purely: the state of every pod and `now` in, the commands to
//! run out (evict, delete past the budget, finish, or wait until a time).
//!
//! Nothing here performs I/O or reads the clock. `exec.rs` owns the watches and the requests: it
//! feeds this state what it saw (pods listed or gone, answers to evictions and deletions), asks
//! [`Schedule::step`] what to do at `now`, runs the commands and sleeps until an event or the
//! returned wake-up time. Waves, the deadline and each `on_deadline` policy, and the retry rules
//! of a budget-blocked or backed-off pod are therefore table-tested with synthetic instants.
//!
//! Read `step.rs` first ([`Schedule::step`], `Schedule::wake`), then `pod.rs` (one pod's
//! state), `answers.rs` (what an answer or a watch event does) and `deadline.rs` (waves, the
//! deadline's policy, a hopeless budget, the outcome).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use super::plan::{self, Answer, Decision, Outcome, PlanOptions, PodRef, RefuseReason, SkipReason};
use super::unsatisfiable::Why;
use crate::config::{OnDeadline, UnsatisfiableBudgets};

mod answers;
mod deadline;
mod pod;

use answers::*;
pub use pod::{PodState, Refusal, Tracked};

/// After a 429 from a budget, the earliest retry even if the budget reopens at once: keeps a
/// budget that flaps from turning into a hot loop.
pub const BUDGET_RETRY_FLOOR: Duration = Duration::from_millis(50);
/// Retry a budget-blocked pod at least this often even without a budget event; kubectl drain
/// also retries a 429 after 5 s.
pub const BUDGET_RETRY_CEILING: Duration = Duration::from_secs(5);
/// First backoff after a server error or throttling; doubles per attempt.
pub const RETRY_BASE: Duration = Duration::from_millis(100);
/// Backoff cap for server errors, so a recovered API server is noticed within seconds; also how
/// often a drain that waits past its deadline (`on_deadline = wait`) looks again.
pub const RETRY_CAP: Duration = Duration::from_secs(5);
/// How long a budget must be judged hopeless without a break before the drain acts on it: the
/// budget's status passes through states that look hopeless and are not (with an integer
/// `minAvailable` the disruption controller expects as many pods as exist, so between an
/// evicted pod's deletion and its replacement's creation the budget "requires every pod"), and
/// the scheduler's verdict on a pod lags a node becoming Ready by its own retry. Found on the
/// real control plane (issue 43).
pub const VERDICT_SETTLE: Duration = Duration::from_secs(5);
/// The longest wait [`later`] adds: thirty years (tokio's own stand-in for "never"), beyond any
/// drain's deadline and far from where an `Instant` overflows.
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// `at + by` without the panic of `Instant + Duration` on overflow: a wait longer than
/// [`FAR_FUTURE`] (only a bug's or a hostile value's could be) is taken as that long, which no
/// drain outlives; every instant the drain computes goes through here.
pub fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by.min(FAR_FUTURE)).unwrap_or(at)
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Every evictable pod is gone.
    Drained,
    /// Every evictable pod is gone, but some pods were refused and are still there.
    Refused,
    /// The deadline passed with pods still on the node.
    DeadlineExceeded,
    /// Pods are still on the node because their budgets cannot allow their eviction
    /// ([`super::unsatisfiable`]), and the deadline policy was applied to them before the
    /// deadline (or at it, with every pod left judged so).
    BudgetUnsatisfiable,
    /// Stopped before its end ([`super::DrainOptions::stop`]): the shutdown it was for was
    /// cancelled.
    Cancelled,
}

impl fmt::Display for DrainOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Drained => "drained",
            Self::Refused => "drained except refused pods",
            Self::DeadlineExceeded => "deadline exceeded",
            Self::BudgetUnsatisfiable => "left pods whose budgets cannot allow their eviction",
            Self::Cancelled => "cancelled",
        })
    }
}

/// What the schedule asks of the drain's view of the budgets.
pub trait Budgets {
    /// Whether a budget selecting the pod allows a disruption now.
    fn open(&self, t: &Tracked) -> bool;
    /// The budgets (`namespace/name`) that select the pod. The API server takes evictions under
    /// one budget one at a time (each updates the budget's status; a concurrent one that loses
    /// that race is retried inside the API server about 500 ms later), so the schedule keeps one
    /// eviction in flight per budget.
    fn of(&self, t: &Tracked) -> Vec<String>;
    /// Why the budget blocking the pod can never allow its eviction, if the drain can show it
    /// ([`super::unsatisfiable::judge`]); asked only of pods a budget blocks.
    fn unsatisfiable(&self, _t: &Tracked) -> Option<Why> {
        None
    }
}

/// A bare "is its budget open" answer: no budget is known to select any pod.
impl<F: Fn(&Tracked) -> bool> Budgets for F {
    fn open(&self, t: &Tracked) -> bool {
        self(t)
    }
    fn of(&self, _: &Tracked) -> Vec<String> {
        Vec::new()
    }
}

/// Something to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Send an eviction for the pod (UID precondition); answer with [`Schedule::evict_answered`].
    Evict(PodRef),
    /// `on_deadline = delete`: delete the pod past its budget with this grace period; answer
    /// with [`Schedule::delete_answered`].
    Delete {
        /// The pod.
        pod: PodRef,
        /// Its grace period: the time left before the deadline ([`plan::fallback_grace`]).
        grace_seconds: u32,
    },
    /// A wave ended; `settled` is false when its share of the deadline ran out first.
    WaveEnded {
        /// The wave that ended.
        wave: usize,
        /// Every pod of it (and the waves before) is gone or refused.
        settled: bool,
    },
    /// The deadline passed and `on_deadline = wait`: the drain goes on (said once).
    WaitingPastDeadline,
    /// Ask the pod's Deployment (through `replica_set`) for a replacement before the eviction;
    /// answer with [`Schedule::replaced`] once it is Ready, or at once when no surge is made.
    Surge {
        /// The pod.
        pod: PodRef,
        /// Its controller.
        replica_set: String,
        /// Whether a budget selecting the pod allows a disruption now.
        budget_open: bool,
    },
    /// The replacement was not Ready in time: the pod is evicted without it, and the
    /// Deployment's replica count goes back.
    SurgeGaveUp(PodRef),
    /// The pod's budget cannot allow its eviction (said once per verdict); `acting`: the
    /// deadline policy is applied to it now.
    Unsatisfiable {
        /// The pod.
        pod: PodRef,
        /// Why.
        why: Why,
        /// Whether the deadline policy is applied now rather than at the deadline.
        acting: bool,
    },
}

/// What to do at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Run the commands, then wait for an event, or until `wake`.
    Run {
        /// In order.
        commands: Vec<Command>,
        /// When to step again if nothing happens.
        wake: Instant,
    },
    /// The drain is over.
    Done(DrainOutcome),
}

/// How a deletion of the fallback ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The API accepted it.
    Accepted,
    /// 404: the pod was already gone.
    Gone,
    /// Any other failure (logged by the executor); the pod stays until the deadline.
    Failed,
}

/// The eviction answer, decided: what the executor must stop for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing special; go on stepping.
    Continue,
    /// The credentials cannot create `pods/eviction`: the drain stops.
    Forbidden,
}

/// Timing and concurrency of a drain.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Evictions in flight at once.
    pub concurrency: usize,
    /// The overall deadline.
    pub timeout: Duration,
    /// What happens when the deadline nears.
    pub on_deadline: OnDeadline,
    /// Whether a pod whose budget cannot allow its eviction gets that now.
    pub unsatisfiable: UnsatisfiableBudgets,
}

/// The whole scheduling state of one drain.
#[derive(Debug)]
pub struct Schedule {
    limits: Limits,
    plan: PlanOptions,
    deadline: Instant,
    fallback_at: Instant,
    wave_ends: Vec<Instant>,
    wave: usize,
    pods: BTreeMap<String, Tracked>,
    skipped: Vec<(PodRef, SkipReason)>,
    notes: Vec<String>,
    force_deleted: Vec<PodRef>,
    in_flight: usize,
    eviction_requests: usize,
    fallback_started: bool,
    said_past_deadline: bool,
}

impl Schedule {
    /// A drain that started at `started`.
    pub fn new(limits: Limits, plan: PlanOptions, started: Instant) -> Self {
        let wave_ends = plan::wave_deadlines(limits.timeout, &plan.waves)
            .into_iter()
            .map(|d| later(started, d))
            .collect();
        let margin = plan::fallback_margin(limits.timeout);
        Self {
            fallback_at: later(started, limits.timeout.saturating_sub(margin)),
            deadline: later(started, limits.timeout),
            wave_ends,
            wave: 0,
            pods: BTreeMap::new(),
            skipped: Vec::new(),
            notes: Vec::new(),
            force_deleted: Vec::new(),
            in_flight: 0,
            eviction_requests: 0,
            fallback_started: false,
            said_past_deadline: false,
            limits,
            plan,
        }
    }

    /// Takes a pod into the drain (once per UID): evicted in its wave, refused, or skipped. A pod
    /// already terminating needs no eviction, only the wait. New pods that appear on the node
    /// during the drain (bound before the cordon) are taken in the same way.
    /// `daemonset_exists(namespace, name)` answers from the drain's DaemonSet watch.
    pub fn track(&mut self, pod: &Pod, daemonset_exists: &dyn Fn(&str, &str) -> bool) {
        let r = PodRef::of(pod);
        if self.pods.contains_key(&r.uid) || self.skipped.iter().any(|(p, _)| p.uid == r.uid) {
            return;
        }
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let budget_wait = plan::budget_wait(pod).unwrap_or_else(|note| {
            self.notes.push(note);
            None
        });
        let surge = match super::surge::wish(pod, self.plan.surge) {
            super::surge::Wish::Through(rs) => Some(rs),
            super::surge::Wish::No => None,
            super::surge::Wish::Cannot(note) => {
                self.notes.push(note);
                None
            }
        };
        let (wave, state) = match plan::decide(pod, &self.plan, daemonset_exists) {
            Decision::Evict { wave, .. } if pod.metadata.deletion_timestamp.is_some() => {
                (wave, PodState::Leaving)
            }
            Decision::Evict { wave, .. } => (wave, PodState::Pending),
            Decision::Refuse(why) => (0, PodState::Refused(Refusal::Plan(why))),
            Decision::Skip(why) => {
                self.skipped.push((r, why));
                return;
            }
        };
        self.pods.insert(
            r.uid.clone(),
            Tracked {
                pod: r,
                labels,
                wave,
                state,
                attempts: 0,
                outstanding: 0,
                fallback_sent: false,
                budget_wait,
                first_blocked: None,
                surge,
                evicting_under: Vec::new(),
                unsatisfiable: None,
                hopeless_since: None,
            },
        );
    }

    /// What tracking found wrong with pods (an annotation that is not a duration), each once,
    /// for the executor to log.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// The pods to evict and the pods refused by the plan.
    pub fn counts(&self) -> (usize, usize) {
        let refused = self
            .pods
            .values()
            .filter(|t| matches!(t.state, PodState::Refused(_)))
            .count();
        (self.pods.len() - refused, refused)
    }

    /// The pods left alone (DaemonSet, mirror, finished).
    pub fn skipped(&self) -> usize {
        self.skipped.len()
    }

    /// No pod to evict or refuse (nothing a drain would report as an Event).
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// A tracked pod.
    pub fn get(&self, uid: &str) -> Option<&Tracked> {
        self.pods.get(uid)
    }

    /// Every tracked pod.
    pub fn tracked(&self) -> impl Iterator<Item = &Tracked> {
        self.pods.values()
    }

    /// What to do at `now`. `budget_open(pod)` tells whether a budget selecting the pod allows a
    /// disruption now (from the budget watch; asked by labels at each step, so a pod refused
    /// before the budgets were listed is still retried the moment its budget opens).
    pub fn step(&mut self, now: Instant, budgets: &dyn Budgets) -> Step {
        let mut commands = Vec::new();
        self.advance_waves(now, &mut commands);
        if self.pods.values().all(Tracked::settled) {
            // Every pod is gone or refused; answers still on their way (a deletion the watch saw
            // before its answer) are waited for, up to the deadline, so the report counts them.
            if self.in_flight > 0 && now < self.deadline {
                return Step::Run {
                    commands,
                    wake: self.deadline,
                };
            }
            return Step::Done(self.outcome());
        }
        let wait = self.limits.on_deadline == OnDeadline::Wait;
        if now >= self.deadline {
            if !wait {
                return Step::Done(self.left_outcome(DrainOutcome::DeadlineExceeded));
            }
            if !self.said_past_deadline {
                self.said_past_deadline = true;
                commands.push(Command::WaitingPastDeadline);
            }
        }
        self.judge_budgets(now, budgets, &mut commands);
        self.own_deadlines(now, &mut commands);
        self.surges_due(now, &mut commands);
        self.fallback(now, &mut commands);
        self.evict(now, budgets, &mut commands);
        Step::Run {
            wake: self.wake(now, budgets),
            commands,
        }
    }

    /// Evictions for the pods of the waves begun whose time has come, up to the concurrency.
    fn evict(&mut self, now: Instant, budgets: &dyn Budgets, commands: &mut Vec<Command>) {
        // One eviction in flight per budget (see Budgets::of).
        let mut busy = self.busy_budgets();
        let open_wave = self.open_wave();
        for t in self.pods.values_mut() {
            if self.in_flight >= self.limits.concurrency {
                break;
            }
            if t.wave <= open_wave && retry_at(t, now, budgets).is_some_and(|at| now >= at) {
                if let Some(replica_set) = t.surge.take() {
                    // Half the time left: the eviction keeps the other half if no replacement
                    // comes.
                    let until = later(now, self.deadline.saturating_duration_since(now) / 2);
                    t.state = PodState::Surging { since: now, until };
                    commands.push(Command::Surge {
                        pod: t.pod.clone(),
                        replica_set,
                        budget_open: budgets.open(t),
                    });
                    continue;
                }
                let under = budgets.of(t);
                if under.iter().any(|b| busy.contains(b)) {
                    // Its budget's eviction in flight answers first; the answer wakes the drain.
                    continue;
                }
                busy.extend(under.iter().cloned());
                t.evicting_under = under;
                t.state = PodState::InFlight;
                t.attempts += 1;
                t.outstanding += 1;
                self.in_flight += 1;
                self.eviction_requests += 1;
                commands.push(Command::Evict(t.pod.clone()));
            }
        }
    }

    /// The budgets with an eviction in flight.
    fn busy_budgets(&self) -> BTreeSet<String> {
        self.pods
            .values()
            .filter(|t| t.state == PodState::InFlight)
            .flat_map(|t| t.evicting_under.iter().cloned())
            .collect()
    }

    /// When to step again if nothing happens: the deadline (or the next look past it), the
    /// fallback, the wave's end, a pod's own deadline or its next retry, whichever comes first.
    fn wake(&self, now: Instant, budgets: &dyn Budgets) -> Instant {
        let wait = self.limits.on_deadline == OnDeadline::Wait;
        let mut wake = if wait {
            later(now, RETRY_CAP)
        } else {
            self.deadline
        };
        if self.limits.on_deadline == OnDeadline::Delete && !self.fallback_started {
            wake = wake.min(self.fallback_at);
        }
        if self.wave + 1 < self.wave_ends.len() {
            wake = wake.min(self.wave_ends[self.wave]);
        }
        for t in self.pods.values() {
            if let PodState::Surging { until, .. } = t.state {
                wake = wake.min(until);
            }
            if let Some(since) = t.hopeless_since
                && t.unsatisfiable.is_none()
            {
                wake = wake.min(later(since, VERDICT_SETTLE));
            }
        }
        if let Some(own) = self
            .pods
            .values()
            .filter(|t| !wait && !t.settled())
            .filter_map(Tracked::own_deadline)
            .filter(|d| *d > now)
            .min()
        {
            wake = wake.min(own);
        }
        if self.in_flight < self.limits.concurrency {
            let busy = self.busy_budgets();
            let due = |t: &Tracked| {
                let at = retry_at(t, now, budgets)?;
                // Due, but behind its budget's eviction in flight: that answer wakes the drain.
                let queued =
                    at <= now && !busy.is_empty() && budgets.of(t).iter().any(|b| busy.contains(b));
                (!queued).then_some(at)
            };
            if let Some(t) = self
                .pods
                .values()
                .filter(|t| t.wave <= self.open_wave())
                .filter_map(due)
                .min()
            {
                wake = wake.min(t);
            }
        }
        wake
    }

    /// Surges whose replacement is not Ready by their `until`: the pod is evicted without it.
    fn surges_due(&mut self, now: Instant, commands: &mut Vec<Command>) {
        for t in self.pods.values_mut() {
            if let PodState::Surging { until, .. } = t.state
                && now >= until
            {
                t.state = PodState::Pending;
                commands.push(Command::SurgeGaveUp(t.pod.clone()));
            }
        }
    }
}

/// What became of the pods, for the report.
#[derive(Debug, Default)]
pub struct Tally {
    /// Evicted and gone (never one of [`Self::force_deleted`]).
    pub evicted: Vec<PodRef>,
    /// Left alone, and why.
    pub skipped: Vec<(PodRef, SkipReason)>,
    /// Refused, and why.
    pub refused: Vec<(PodRef, Refusal)>,
    /// Still on the node.
    pub left_behind: Vec<PodRef>,
    /// Deleted past their budget by the fallback.
    pub force_deleted: Vec<PodRef>,
    /// Of the pods left behind or deleted past their budgets, those whose budget could not
    /// allow their eviction, and why.
    pub unsatisfiable: Vec<(PodRef, Why)>,
    /// Eviction requests sent.
    pub eviction_requests: usize,
}

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
