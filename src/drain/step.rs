//! The drain's scheduling, decided purely: the state of every pod and `now` in, the commands to
//! run out (evict, delete past the budget, finish, or wait until a time).
//!
//! Nothing here performs I/O or reads the clock. `exec.rs` owns the watches and the requests: it
//! feeds this state what it saw (pods listed or gone, answers to evictions and deletions), asks
//! [`Schedule::step`] what to do at `now`, runs the commands and sleeps until an event or the
//! returned wake-up time. Waves, the deadline and each `on_deadline` policy, and the retry rules
//! of a budget-blocked or backed-off pod are therefore table-tested with synthetic instants.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use super::plan::{self, Answer, Decision, Outcome, PlanOptions, PodRef, RefuseReason, SkipReason};
use super::unsatisfiable::Why;
use crate::config::{OnDeadline, UnsatisfiableBudgets};

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

/// Why a pod stays on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The plan refused it (unmanaged, emptyDir, annotated).
    Plan(RefuseReason),
    /// More than one budget selects it: the Eviction API cannot evict it.
    MultipleBudgets(Vec<String>),
    /// A 403 that concerns this pod only ([`Outcome::Denied`]): an admission check, NodeRestriction
    /// or the Eviction API's own budget checks.
    Denied {
        /// The API's message, naming who denied it and why.
        message: String,
    },
    /// The API rejected the eviction for good (a 4xx other than the ones a drain waits out).
    Rejected {
        /// HTTP status.
        code: u16,
        /// The API's message.
        message: String,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Plan(r) => r.fmt(f),
            Self::MultipleBudgets(b) => write!(
                f,
                "selected by more than one PodDisruptionBudget ({})",
                b.join(", ")
            ),
            Self::Denied { message } => write!(f, "eviction denied (403): {message}"),
            Self::Rejected { code, message } => write!(f, "eviction rejected ({code}): {message}"),
        }
    }
}

/// Where one pod is in its eviction.
#[derive(Debug, Clone, PartialEq)]
pub enum PodState {
    /// Not tried yet.
    Pending,
    /// An eviction (or the fallback's deletion) is in flight.
    InFlight,
    /// A budget said no at `since`; retry when it opens.
    Blocked {
        /// When the budget refused.
        since: Instant,
        /// The budgets (`namespace/name`) that select the pod.
        budgets: Vec<String>,
    },
    /// A transient error; retry at `until`.
    Backoff {
        /// When to try again.
        until: Instant,
    },
    /// Accepted, deleted by the fallback, or deleted by its namespace: waiting for it to go.
    Leaving,
    /// Gone from the node.
    Gone,
    /// Will not be evicted.
    Refused(Refusal),
    /// Its budget blocked it past its own `nodeward.io/drain-timeout` under `on_deadline =
    /// abandon`: the drain no longer waits for it (reported as left behind).
    GaveUp,
    /// A replacement was asked of its Deployment ([`super::surge`]); evicted once it is Ready
    /// elsewhere, or at `until` without it.
    Surging {
        /// When the surge was asked for.
        since: Instant,
        /// When the drain stops waiting for the replacement.
        until: Instant,
    },
}

/// One pod the drain evicts or refuses.
#[derive(Debug, Clone)]
pub struct Tracked {
    /// The pod.
    pub pod: PodRef,
    /// Its labels, to find the budgets that select it.
    pub labels: BTreeMap<String, String>,
    /// Its wave.
    pub wave: usize,
    /// Where it is.
    pub state: PodState,
    /// Eviction requests sent for it.
    pub attempts: u32,
    /// Requests for it not answered yet (the pod may be gone before its answer comes back).
    pub outstanding: u32,
    /// The `delete` fallback sent its deletion (once per pod; a failed one leaves the pod to
    /// the evictions and the deadline).
    pub fallback_sent: bool,
    /// How long the drain waits for its budget (`nodeward.io/drain-timeout`), if it says.
    pub budget_wait: Option<Duration>,
    /// When a budget first refused it.
    pub first_blocked: Option<Instant>,
    /// The ReplicaSet to surge through before its eviction ([`super::surge::wish`]), until the
    /// surge was tried (once).
    pub surge: Option<String>,
    /// The budgets its eviction in flight goes through (see [`Budgets::of`]).
    pub evicting_under: Vec<String>,
    /// Why its budget cannot allow its eviction, once judged so for [`VERDICT_SETTLE`] while a
    /// budget blocked it ([`Budgets::unsatisfiable`]).
    pub unsatisfiable: Option<Why>,
    /// Since when every judgement of its budget has found it hopeless.
    pub hopeless_since: Option<Instant>,
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

impl Tracked {
    /// Gone, refused or given up: the drain no longer waits for it.
    pub fn settled(&self) -> bool {
        matches!(
            self.state,
            PodState::Gone | PodState::Refused(_) | PodState::GaveUp
        )
    }

    /// Whether the `delete` fallback may delete it: it is still there and not leaving, an
    /// eviction of it was tried (the fallback is for pods their budget keeps, never a way around
    /// the Eviction API), none is unanswered (if one went through, a deletion now would be
    /// reported as bypassing its budget when it did not), and no deletion was sent before.
    fn deletable(&self) -> bool {
        !self.settled()
            && self.state != PodState::Leaving
            && self.attempts > 0
            && self.outstanding == 0
            && !self.fallback_sent
    }

    /// The `delete` fallback's deletion of the pod, now in flight (sent once per pod).
    fn fallback_delete(&mut self, grace_seconds: u32) -> Command {
        self.state = PodState::InFlight;
        self.evicting_under.clear();
        self.fallback_sent = true;
        self.outstanding += 1;
        Command::Delete {
            pod: self.pod.clone(),
            grace_seconds,
        }
    }

    /// When its own wait for its budget ends, if it has one and a budget has refused it.
    fn own_deadline(&self) -> Option<Instant> {
        Some(later(self.first_blocked?, self.budget_wait?))
    }

    /// A budget blocks it and cannot allow its eviction.
    fn hopeless(&self) -> bool {
        matches!(self.state, PodState::Blocked { .. }) && self.unsatisfiable.is_some()
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

    /// The pod `uid` left the node: a watch saw it deleted, or stopped ([`super::plan::left_node`]).
    pub fn gone(&mut self, uid: &str) {
        if let Some(t) = self.pods.get_mut(uid)
            && !t.settled()
        {
            t.state = PodState::Gone;
        }
    }

    /// After a relist: marks every pod not in `present` (UIDs on the node, from a synced pod list) as gone.
    pub fn observe(&mut self, present: &BTreeSet<String>) {
        for (uid, t) in &mut self.pods {
            if !t.settled() && !present.contains(uid) {
                t.state = PodState::Gone;
            }
        }
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

    /// How a drain whose pods are all settled ended.
    fn outcome(&self) -> DrainOutcome {
        let refused = self
            .pods
            .values()
            .any(|t| matches!(t.state, PodState::Refused(_)));
        if self.pods.values().any(|t| t.state == PodState::GaveUp) {
            self.left_outcome(DrainOutcome::DeadlineExceeded)
        } else if refused {
            DrainOutcome::Refused
        } else {
            DrainOutcome::Drained
        }
    }

    /// `otherwise`, unless every pod the drain leaves (given up, or still waited for) was left
    /// because its budget cannot allow its eviction: then [`DrainOutcome::BudgetUnsatisfiable`].
    fn left_outcome(&self, otherwise: DrainOutcome) -> DrainOutcome {
        let mut left = self
            .pods
            .values()
            .filter(|t| t.state == PodState::GaveUp || !t.settled())
            .peekable();
        if left.peek().is_some() && left.all(|t| t.unsatisfiable.is_some()) {
            DrainOutcome::BudgetUnsatisfiable
        } else {
            otherwise
        }
    }

    /// Asks of every pod a budget blocks whether that budget can ever allow its eviction; a pod
    /// found hopeless at every step for [`VERDICT_SETTLE`] gets the verdict, said once.
    fn judge_budgets(&mut self, now: Instant, budgets: &dyn Budgets, commands: &mut Vec<Command>) {
        let acting = self.limits.unsatisfiable == UnsatisfiableBudgets::Act
            && self.limits.on_deadline != OnDeadline::Wait;
        for t in self.pods.values_mut() {
            if !matches!(t.state, PodState::Blocked { .. }) {
                continue;
            }
            let Some(why) = budgets.unsatisfiable(t) else {
                t.hopeless_since = None;
                t.unsatisfiable = None;
                continue;
            };
            let since = *t.hopeless_since.get_or_insert(now);
            if why.needs_settling() && now < later(since, VERDICT_SETTLE) {
                continue;
            }
            if t.unsatisfiable.is_none() {
                commands.push(Command::Unsatisfiable {
                    pod: t.pod.clone(),
                    why: why.clone(),
                    acting,
                });
            }
            t.unsatisfiable = Some(why);
        }
    }

    /// `on_deadline = delete` near the deadline: every pod still there is deleted, once, after
    /// an eviction of it was tried (from now on the pods of every wave are evicted, so a pod
    /// whose wave has not begun is tried first too).
    fn fallback(&mut self, now: Instant, commands: &mut Vec<Command>) {
        if self.limits.on_deadline != OnDeadline::Delete || now < self.fallback_at {
            return;
        }
        self.fallback_started = true;
        let grace = plan::fallback_grace(self.deadline.saturating_duration_since(now));
        for t in self.pods.values_mut().filter(|t| t.deletable()) {
            commands.push(t.fallback_delete(grace));
            self.in_flight += 1;
        }
    }

    /// The last wave whose pods are evicted now: every wave once the `delete` fallback started.
    fn open_wave(&self) -> usize {
        if self.fallback_started {
            usize::MAX
        } else {
            self.wave
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

    /// The surge's replacement is Ready (or there will be none): the pod is evicted now.
    pub fn replaced(&mut self, uid: &str) {
        if let Some(t) = self.pods.get_mut(uid)
            && matches!(t.state, PodState::Surging { .. })
        {
            t.state = PodState::Pending;
        }
    }

    /// Pods whose budget has blocked them past their own drain timeout, or whose budget cannot
    /// allow their eviction (unless `unsatisfiable_budgets = wait`), get the deadline policy now,
    /// not at the node's deadline: deleted under `delete` (with the time left to the node's
    /// deadline as grace), given up under `abandon`; `wait` waits on.
    fn own_deadlines(&mut self, now: Instant, commands: &mut Vec<Command>) {
        let grace = plan::fallback_grace(self.deadline.saturating_duration_since(now));
        let act = self.limits.unsatisfiable == UnsatisfiableBudgets::Act;
        for t in self.pods.values_mut() {
            let due = t.own_deadline().is_some_and(|d| now >= d) || (act && t.hopeless());
            if !due || t.settled() || t.state == PodState::Leaving || t.outstanding > 0 {
                continue;
            }
            match self.limits.on_deadline {
                OnDeadline::Delete if t.deletable() => {
                    commands.push(t.fallback_delete(grace));
                    self.in_flight += 1;
                }
                OnDeadline::Abandon => t.state = PodState::GaveUp,
                OnDeadline::Delete | OnDeadline::Wait => {}
            }
        }
    }

    /// Advances through waves whose pods are all settled or whose share of time is spent.
    fn advance_waves(&mut self, now: Instant, commands: &mut Vec<Command>) {
        while self.wave + 1 < self.wave_ends.len() {
            let settled = self
                .pods
                .values()
                .filter(|t| t.wave <= self.wave)
                .all(Tracked::settled);
            if !settled && now < self.wave_ends[self.wave] {
                return;
            }
            commands.push(Command::WaveEnded {
                wave: self.wave,
                settled,
            });
            self.wave += 1;
        }
    }

    /// The answer to an eviction of `uid` at `now`; `matching` are the budgets that select the
    /// pod in the drain's view of them.
    pub fn evict_answered(
        &mut self,
        uid: &str,
        answer: &Answer,
        matching: Vec<String>,
        now: Instant,
    ) -> Verdict {
        let Some(t) = self.pods.get_mut(uid) else {
            return Verdict::Continue;
        };
        if t.outstanding > 0 {
            t.outstanding -= 1;
            self.in_flight -= 1;
        }
        if t.state != PodState::InFlight {
            return Verdict::Continue;
        }
        t.state = match answer.outcome() {
            Outcome::Evicted | Outcome::Gone | Outcome::NamespaceTerminating => PodState::Leaving,
            Outcome::BudgetExhausted => {
                t.first_blocked.get_or_insert(now);
                PodState::Blocked {
                    since: now,
                    budgets: matching,
                }
            }
            Outcome::Retry => PodState::Backoff {
                until: later(now, backoff(t.attempts)),
            },
            Outcome::MultipleBudgets => PodState::Refused(Refusal::MultipleBudgets(matching)),
            Outcome::Denied => PodState::Refused(Refusal::Denied {
                message: answer.message.clone(),
            }),
            Outcome::Rejected => PodState::Refused(Refusal::Rejected {
                code: answer.code,
                message: answer.message.clone(),
            }),
            Outcome::Forbidden => {
                t.state = PodState::Pending;
                return Verdict::Forbidden;
            }
        };
        Verdict::Continue
    }

    /// The answer to a deletion of the `delete` fallback.
    pub fn delete_answered(&mut self, uid: &str, result: Deleted) {
        let Some(t) = self.pods.get_mut(uid) else {
            return;
        };
        if t.outstanding > 0 {
            t.outstanding -= 1;
            self.in_flight -= 1;
        }
        if result == Deleted::Accepted {
            // Counted even when the watch saw the pod go before this answer came back.
            self.force_deleted.push(t.pod.clone());
        }
        if t.state != PodState::InFlight {
            return;
        }
        t.state = match result {
            Deleted::Accepted => PodState::Leaving,
            Deleted::Gone => PodState::Gone,
            // Left to the evictions and the deadline.
            Deleted::Failed => PodState::Pending,
        };
    }

    /// The report's lists: evicted, skipped, refused, left behind, deleted past the budget, and
    /// the eviction requests sent.
    pub fn finish(self) -> Tally {
        let mut tally = Tally {
            skipped: self.skipped,
            force_deleted: self.force_deleted,
            eviction_requests: self.eviction_requests,
            ..Tally::default()
        };
        for t in self.pods.into_values() {
            let deleted = tally.force_deleted.iter().any(|p| p.uid == t.pod.uid);
            let left = !matches!(t.state, PodState::Gone | PodState::Refused(_));
            if let Some(why) = t.unsatisfiable.clone()
                && (deleted || left)
            {
                tally.unsatisfiable.push((t.pod.clone(), why));
            }
            match t.state {
                // Counted once, apart: it went past its budget, not through it.
                PodState::Gone if deleted => {}
                PodState::Gone => tally.evicted.push(t.pod),
                PodState::Refused(why) => tally.refused.push((t.pod, why)),
                _ => tally.left_behind.push(t.pod),
            }
        }
        tally
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

/// When a pod may be tried (again): at once when pending; after its backoff; for a pod a
/// budget blocked, [`BUDGET_RETRY_FLOOR`] after the refusal once a budget selecting it opens,
/// and [`BUDGET_RETRY_CEILING`] after it in any case. `None`: not to be tried.
fn retry_at(t: &Tracked, now: Instant, budgets: &dyn Budgets) -> Option<Instant> {
    match &t.state {
        PodState::Pending => Some(now),
        PodState::Backoff { until } => Some(*until),
        PodState::Blocked { since, .. } => Some(if budgets.open(t) {
            later(*since, BUDGET_RETRY_FLOOR)
        } else {
            later(*since, BUDGET_RETRY_CEILING)
        }),
        _ => None,
    }
}

/// The backoff after `attempts` failed tries: doubling from [`RETRY_BASE`], capped at
/// [`RETRY_CAP`].
pub fn backoff(attempts: u32) -> Duration {
    RETRY_BASE
        .saturating_mul(1 << attempts.min(6))
        .min(RETRY_CAP)
}

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
