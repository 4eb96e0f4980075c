//! How a drain ends: the surges given back, the report ([`DrainReport`]), its Event and the
//! Node's condition.

use super::*;

/// What a drain did.
#[derive(Debug, Clone)]
pub struct DrainReport {
    /// The node.
    pub node: String,
    /// How it ended.
    pub outcome: DrainOutcome,
    /// Pods evicted and gone.
    pub evicted: Vec<PodRef>,
    /// Pods left alone, and why.
    pub skipped: Vec<(PodRef, plan::SkipReason)>,
    /// Pods refused, and why.
    pub refused: Vec<(PodRef, Refusal)>,
    /// Pods still on the node at the deadline.
    pub left_behind: Vec<PodRef>,
    /// Pods deleted bypassing their budgets by the `delete` deadline policy.
    pub force_deleted: Vec<PodRef>,
    /// Of the pods left behind or deleted past their budgets, those whose budget could not
    /// allow their eviction, and why ([`crate::drain::unsatisfiable`]).
    pub unsatisfiable: Vec<(PodRef, crate::drain::unsatisfiable::Why)>,
    /// Eviction requests sent.
    pub eviction_requests: usize,
    /// Pods being deleted whose containers had stopped when the drain ended, their objects
    /// still there ([`Gone::Stopped`]): they stay Terminating until their kubelet is back, or
    /// go with the Node.
    pub stopped: Vec<PodRef>,
    /// Wall time.
    pub elapsed: Duration,
}

impl DrainReport {
    /// The report of a drain of `node` that ended with `outcome` after `elapsed`, with the pods
    /// that had `stopped` though their objects were still there.
    pub(super) fn of(
        node: &str,
        outcome: DrainOutcome,
        tally: crate::drain::step::Tally,
        stopped: Vec<PodRef>,
        elapsed: Duration,
    ) -> Self {
        Self {
            node: node.to_string(),
            outcome,
            evicted: tally.evicted,
            skipped: tally.skipped,
            refused: tally.refused,
            left_behind: tally.left_behind,
            force_deleted: tally.force_deleted,
            unsatisfiable: tally.unsatisfiable,
            eviction_requests: tally.eviction_requests,
            stopped,
            elapsed,
        }
    }
}

impl DrainReport {
    /// Nothing that leaves with the node is left on it: no pod left behind or refused, and the
    /// drain was not stopped (`Drained=True`).
    pub fn emptied(&self) -> bool {
        self.outcome != DrainOutcome::Cancelled
            && self.left_behind.is_empty()
            && self.refused.is_empty()
    }
}

impl std::fmt::Display for DrainReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "node {}: {} in {:.3}s: {} evicted, {} skipped, {} refused, {} left behind, {} deleted past their budget ({} eviction requests)",
            self.node,
            self.outcome,
            self.elapsed.as_secs_f64(),
            self.evicted.len(),
            self.skipped.len(),
            self.refused.len(),
            self.left_behind.len(),
            self.force_deleted.len(),
            self.eviction_requests
        )?;
        for (p, why) in &self.refused {
            writeln!(f, "  refused {p}: {why}")?;
        }
        for p in &self.left_behind {
            writeln!(f, "  left behind {p}")?;
        }
        for p in &self.force_deleted {
            writeln!(f, "  deleted past its budget {p}")?;
        }
        for (p, why) in &self.unsatisfiable {
            writeln!(f, "  budget unsatisfiable for {p}: {why}")?;
        }
        for p in &self.stopped {
            writeln!(
                f,
                "  stopped, its object still there: {p} (Terminating until its kubelet is back, or the Node goes)"
            )?;
        }
        Ok(())
    }
}

/// How long a drain that ended waits for its surges' replicas to be given back.
pub(super) const GIVE_BACK_LIMIT: Duration = Duration::from_secs(10);

/// How long the end Event and the last Draining condition write may take together: the
/// condition waits [`crate::drain::narrate`]'s one second, the Event as long beside it.
pub(super) const ANNOUNCE_LIMIT: Duration = Duration::from_secs(2);

/// A drain's ending when nothing shorter is asked for ([`DrainOptions::ending`]): the give-back
/// and the announcement, each at its own limit.
pub const ENDING: Duration = GIVE_BACK_LIMIT.saturating_add(ANNOUNCE_LIMIT);

/// How `ending` is shared: (surge give-back, announcement). The announcement gets its limit
/// first, or half of a shorter ending; the give-back what is left, up to its own limit.
pub(super) fn ending_split(ending: Duration) -> (Duration, Duration) {
    let announce = ANNOUNCE_LIMIT.min(ending / 2);
    (GIVE_BACK_LIMIT.min(ending - announce), announce)
}

/// How the end of a drain is told: the Event's type and reason, and the words the Event and the
/// Draining condition share. The pods deleted past their budgets are counted apart from the
/// evicted ones and named, and make the Event a Warning: those budgets were not honoured. Each
/// refused pod is named with why.
pub(super) fn ending(report: &DrainReport, timeout: Duration) -> (EventType, &'static str, String) {
    let names = |pods: &[PodRef]| pods.iter().map(ToString::to_string).collect::<Vec<_>>();
    let deleted = names(&report.force_deleted);
    let (past_budgets, which) = if deleted.is_empty() {
        (String::new(), String::new())
    } else {
        (
            format!(", {} deleted past their budgets", deleted.len()),
            format!(" (deleted: {})", deleted.join(", ")),
        )
    };
    match report.outcome {
        DrainOutcome::Cancelled => {
            let note = format!(
                "stopped after {:.1}s, its shutdown cancelled: {} pods evicted{past_budgets}, {} still on the node{which}",
                report.elapsed.as_secs_f64(),
                report.evicted.len(),
                report.left_behind.len()
            );
            (EventType::Normal, "DrainCancelled", note)
        }
        DrainOutcome::DeadlineExceeded | DrainOutcome::BudgetUnsatisfiable => {
            let left = names(&report.left_behind);
            let mut note = if report.outcome == DrainOutcome::DeadlineExceeded {
                format!("{} pods left after {timeout:?}: ", left.len())
            } else {
                format!(
                    "{} pods left after {:.1}s, their budgets unable to allow their eviction: ",
                    left.len(),
                    report.elapsed.as_secs_f64()
                )
            };
            note.push_str(&left.join(", "));
            if !deleted.is_empty() {
                let evicted = report.evicted.len();
                note.push_str(&format!("; {evicted} pods evicted{past_budgets}{which}"));
            }
            note.push_str(&unsatisfiable_note(report));
            let reason = match report.outcome {
                DrainOutcome::DeadlineExceeded => "DrainTimedOut",
                _ => "DrainBudgetUnsatisfiable",
            };
            (EventType::Warning, reason, note)
        }
        DrainOutcome::Drained | DrainOutcome::Refused => {
            let refused: Vec<String> = report
                .refused
                .iter()
                .map(|(p, why)| format!("{p} ({why})"))
                .collect();
            let mut note = format!(
                "{} pods evicted{past_budgets} in {:.1}s{which}",
                report.evicted.len(),
                report.elapsed.as_secs_f64()
            );
            if !refused.is_empty() {
                note.push_str(&format!("; refused: {}", refused.join(", ")));
            }
            note.push_str(&unsatisfiable_note(report));
            if !report.stopped.is_empty() {
                note.push_str(&format!(
                    "; {} stopped, their objects Terminating until the kubelet is back",
                    report.stopped.len()
                ));
            }
            let type_ = if deleted.is_empty() {
                EventType::Normal
            } else {
                EventType::Warning
            };
            (type_, "DrainSucceeded", note)
        }
    }
}

/// "; budget unsatisfiable: pod (why), ..." for the pods left or deleted because their budgets
/// could not allow their eviction; empty when none were.
pub(super) fn unsatisfiable_note(report: &DrainReport) -> String {
    if report.unsatisfiable.is_empty() {
        return String::new();
    }
    let each: Vec<String> = report
        .unsatisfiable
        .iter()
        .map(|(p, why)| format!("{p} ({why})"))
        .collect();
    format!("; budget unsatisfiable: {}", each.join(", "))
}

impl Drain<'_> {
    /// The drain's ending, within [`DrainOptions::ending`] whatever ended it: surge replicas
    /// given back, then the end said on the Node.
    pub(super) async fn end(
        &self,
        outcome: DrainOutcome,
        schedule: Schedule,
        surges: Surges,
        pods: &Mirror<Pod>,
        started: Instant,
        narrator: Option<Narrator>,
    ) -> DrainReport {
        let (give_back, announce) = ending_split(self.opts.ending);
        surges.finish(self.client, give_back).await;
        let stopped = self.stopped(pods);
        let report = DrainReport::of(
            self.node,
            outcome,
            schedule.finish(),
            stopped,
            started.elapsed(),
        );
        let end = self.announce_end(&report, narrator);
        if tokio::time::timeout(announce, end).await.is_err() {
            warn!(
                node = self.node,
                "the drain's end was not said on the Node in {announce:?}"
            );
        }
        info!(node = self.node, summary = %report.to_string().trim_end(), "drain finished");
        report
    }

    /// Says how the drain ended: an Event on the Node (for a drain that had pods to move, or
    /// that ran out of time) and the Draining condition turned `False` with the same words.
    pub(super) async fn announce_end(&self, report: &DrainReport, narrator: Option<Narrator>) {
        let (type_, reason, note) = ending(report, self.opts.timeout);
        if matches!(
            report.outcome,
            DrainOutcome::DeadlineExceeded | DrainOutcome::BudgetUnsatisfiable
        ) {
            let names: Vec<String> = report.left_behind.iter().map(ToString::to_string).collect();
            warn!(node = self.node, left = names.len(), pods = %names.join(", "), "drain ended {}", report.outcome);
        }
        if let Some(m) = &self.opts.metrics {
            m.ended(report.outcome, report.elapsed.as_secs_f64());
            m.pods_ended(report);
        }
        // The narrator runs for a drain that had pods to move (an eventful one).
        let eventful = narrator.is_some();
        let event = async {
            if eventful || report.outcome == DrainOutcome::DeadlineExceeded {
                self.event(type_, reason, note.clone()).await;
            }
        };
        let condition = async {
            if let Some(n) = narrator {
                n.finish(report.outcome, &note).await;
            }
        };
        let ended = crate::lifecycle::Moment::DrainEnded {
            emptied: report.emptied(),
            reason: crate::drain::explain::outcome_reason(report.outcome),
            message: &note,
        };
        tokio::join!(event, condition, self.lifecycle(&ended));
    }
}

#[cfg(test)]
mod tests;
