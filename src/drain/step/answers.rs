//! What the API server's answers and the pods' watch do to the schedule: an eviction or deletion
//! answered, a pod gone or replaced, and when a refused pod is tried again.

use super::*;

/// When a pod may be tried (again): at once when pending; after its backoff; for a pod a
/// budget blocked, [`BUDGET_RETRY_FLOOR`] after the refusal once a budget selecting it opens,
/// and [`BUDGET_RETRY_CEILING`] after it in any case. `None`: not to be tried.
pub(super) fn retry_at(t: &Tracked, now: Instant, budgets: &dyn Budgets) -> Option<Instant> {
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

impl Schedule {
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

    /// The pod `uid` left the node: a watch saw it deleted, or stopped ([`crate::drain::plan::left_node`]).
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

    /// The surge's replacement is Ready (or there will be none): the pod is evicted now.
    pub fn replaced(&mut self, uid: &str) {
        if let Some(t) = self.pods.get_mut(uid)
            && matches!(t.state, PodState::Surging { .. })
        {
            t.state = PodState::Pending;
        }
    }
}
