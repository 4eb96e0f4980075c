//! One pod as the schedule tracks it: its state, why it was refused, what its budget said.

use super::*;

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
    /// A replacement was asked of its Deployment ([`crate::drain::surge`]); evicted once it is Ready
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
    /// The ReplicaSet to surge through before its eviction ([`crate::drain::surge::wish`]), until the
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
    pub(super) fn deletable(&self) -> bool {
        !self.settled()
            && self.state != PodState::Leaving
            && self.attempts > 0
            && self.outstanding == 0
            && !self.fallback_sent
    }

    /// The `delete` fallback's deletion of the pod, now in flight (sent once per pod).
    pub(super) fn fallback_delete(&mut self, grace_seconds: u32) -> Command {
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
    pub(super) fn own_deadline(&self) -> Option<Instant> {
        Some(later(self.first_blocked?, self.budget_wait?))
    }

    /// A budget blocks it and cannot allow its eviction.
    pub(super) fn hopeless(&self) -> bool {
        matches!(self.state, PodState::Blocked { .. }) && self.unsatisfiable.is_some()
    }
}
