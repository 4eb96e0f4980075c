//! Tells the cluster what a running drain waits on, without ever holding it up: the Node's
//! `nodeward.io/Draining` condition ([`super::explain`] decides what it says and when) and one
//! Event on each pod a budget blocks, naming the budget. Every write runs in a task of its own;
//! a write that fails is logged (once as a warning: an operator's `nodeward drain` may lack
//! `nodes/status`) and never fails the drain.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::runtime::events::{EventType, Recorder};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::explain::{self, CONDITION_TYPE, Explanation};
use super::plan::PodRef;
use super::step::{DrainOutcome, later};
use crate::node_write::{self, ConditionPatch};

/// How long the drain's end waits for its final condition write (the shutdown path releases
/// logind's lock after it, so it must stay short even when the API server is gone).
const FINAL_WRITE_WAIT: Duration = Duration::from_secs(1);

/// The narrator of one drain.
pub(super) struct Narrator {
    client: kube::Client,
    node: String,
    /// When the drain started, wall clock: the condition's `lastTransitionTime` while it runs.
    since: String,
    last: Option<(Instant, Explanation)>,
    writing: Option<JoinHandle<()>>,
    warned: Arc<AtomicBool>,
    recorder: Recorder,
    blocked_told: HashSet<String>,
    progress: Option<Progress>,
}

/// Where a drain's [`explain::Progress`] goes as the condition is written (the agent's status
/// file), and `None` when the drain ends.
pub type Progress = std::sync::Arc<tokio::sync::watch::Sender<Option<explain::Progress>>>;

impl Narrator {
    pub(super) fn new(
        client: &kube::Client,
        node: &str,
        recorder: Recorder,
        progress: Option<Progress>,
    ) -> Self {
        Self {
            client: client.clone(),
            node: node.to_string(),
            since: jiff::Timestamp::now().to_string(),
            last: None,
            writing: None,
            warned: Arc::new(AtomicBool::new(false)),
            recorder,
            blocked_told: HashSet::new(),
            progress,
        }
    }

    /// Writes the condition for `e` if it is due at `now`; returns when to look again.
    pub(super) fn update(&mut self, now: Instant, e: &Explanation) -> Instant {
        let changed = self.last.as_ref().is_none_or(|(_, p)| !p.same_cause(e));
        let due = explain::write_at(self.last.as_ref().map(|(at, _)| *at), changed);
        if let Some(at) = due.filter(|at| now < *at) {
            return at;
        }
        if self.writing.as_ref().is_some_and(|h| !h.is_finished()) {
            // The API server is slow: one write at a time, the newest when this one is done.
            return later(now, explain::MIN_WRITE_GAP);
        }
        let (client, node, since, warned) = (
            self.client.clone(),
            self.node.clone(),
            self.since.clone(),
            self.warned.clone(),
        );
        let (reason, message) = (e.reason.as_str(), e.to_string());
        if changed {
            // One line per change (at most one a second): what `nodeward drain` shows.
            info!(node = self.node, reason, "{message}");
        }
        if let Some(p) = &self.progress {
            p.send_replace(Some(explain::Progress::of(e, jiff::Timestamp::now())));
        }
        self.writing = Some(tokio::spawn(async move {
            write(&client, &node, true, reason, &message, &since, &warned).await;
        }));
        self.last = Some((now, e.clone()));
        later(now, explain::REFRESH)
    }

    /// Says once, on the pod, which budget blocks its eviction; not before the drain knows
    /// which (a refusal can come back before the budgets are listed: a later one names it).
    pub(super) fn blocked(&mut self, pod: &PodRef, budgets: &[String], allowed: Option<i32>) {
        if budgets.is_empty() || !self.blocked_told.insert(pod.uid.clone()) {
            return;
        }
        let reference = pod.object_ref();
        let allows = allowed.map_or_else(String::new, |a| format!(" ({a} disruptions allowed)"));
        let note = format!(
            "eviction from node {} blocked by PodDisruptionBudget {}{allows}; nodeward retries when the budget allows",
            self.node,
            budgets.join(", "),
        );
        crate::events::publish_detached(
            &self.recorder,
            reference,
            EventType::Normal,
            "EvictionBlocked",
            "Drain",
            note,
        );
    }

    /// The drain is over: the condition turns `False` with its outcome.
    pub(super) async fn finish(mut self, outcome: DrainOutcome, summary: &str) {
        if let Some(p) = &self.progress {
            p.send_replace(None);
        }
        if let Some(h) = self.writing.take() {
            h.abort();
        }
        let now = jiff::Timestamp::now().to_string();
        let reason = explain::outcome_reason(outcome);
        let last = write(
            &self.client,
            &self.node,
            false,
            reason,
            summary,
            &now,
            &self.warned,
        );
        if tokio::time::timeout(FINAL_WRITE_WAIT, last).await.is_err() {
            debug!(
                node = self.node,
                "the final Draining condition was not written in time"
            );
        }
    }
}

async fn write(
    client: &kube::Client,
    node: &str,
    status: bool,
    reason: &str,
    message: &str,
    transition: &str,
    warned: &AtomicBool,
) {
    let patch = ConditionPatch {
        type_: CONDITION_TYPE,
        status,
        reason,
        message,
        last_transition: transition,
    };
    match node_write::write_condition(client, node, &patch).await {
        Ok(_) => debug!(node, reason, message, "Draining condition written"),
        Err(e) if !warned.swap(true, Ordering::Relaxed) => {
            warn!(node, error = %e, "cannot write the Node's Draining condition (needs patch on nodes/status); the drain goes on without it");
        }
        Err(e) => debug!(node, error = %e, "cannot write the Draining condition"),
    }
}
