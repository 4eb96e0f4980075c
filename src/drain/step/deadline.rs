//! Waves and deadlines: a wave opened when the one before used its share, a pod's own budget wait,
//! a hopeless budget judged, the deadline's policy, and the drain's outcome.

use super::*;

impl Schedule {
    /// Asks of every pod a budget blocks whether that budget can ever allow its eviction; a pod
    /// found hopeless at every step for [`VERDICT_SETTLE`] gets the verdict, said once.
    pub(super) fn judge_budgets(
        &mut self,
        now: Instant,
        budgets: &dyn Budgets,
        commands: &mut Vec<Command>,
    ) {
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
    pub(super) fn fallback(&mut self, now: Instant, commands: &mut Vec<Command>) {
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
    pub(super) fn open_wave(&self) -> usize {
        if self.fallback_started {
            usize::MAX
        } else {
            self.wave
        }
    }

    /// Pods whose budget has blocked them past their own drain timeout, or whose budget cannot
    /// allow their eviction (unless `unsatisfiable_budgets = wait`), get the deadline policy now,
    /// not at the node's deadline: deleted under `delete` (with the time left to the node's
    /// deadline as grace), given up under `abandon`; `wait` waits on.
    pub(super) fn own_deadlines(&mut self, now: Instant, commands: &mut Vec<Command>) {
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
    pub(super) fn advance_waves(&mut self, now: Instant, commands: &mut Vec<Command>) {
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

    /// How a drain whose pods are all settled ended.
    pub(super) fn outcome(&self) -> DrainOutcome {
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
    pub(super) fn left_outcome(&self, otherwise: DrainOutcome) -> DrainOutcome {
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
}
