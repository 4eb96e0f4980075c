//! The I/O half of a drain: cordon, evict wave by wave, and wait — on watches, not polls.
//!
//! One event loop owns all state. Two watches feed it: the node's pods (field selector
//! `spec.nodeName`), which is how a drain learns that a pod is really gone rather than merely
//! accepted for eviction, and the PodDisruptionBudgets, so a pod blocked by a budget is retried
//! the moment the budget's `disruptionsAllowed` rises (never sooner than [`BUDGET_RETRY_FLOOR`](super::step::BUDGET_RETRY_FLOOR),
//! and at the latest after [`BUDGET_RETRY_CEILING`](super::step::BUDGET_RETRY_CEILING) in case a watch event was missed). Evictions
//! run with bounded concurrency as futures polled by the same loop, so nothing needs a lock.
//! What to send when is decided by [`super::step::Schedule`], purely; this folder only performs it.
//!
//! Read `exec.rs` first (the loop, [`drain`]), then the file that answers the question:
//! - `options.rs` — what a drain is asked ([`DrainOptions`]) and the errors that stop it;
//! - `cordoning.rs` — cordon and uncordon with nodeward's record (decided by [`super::cordon`]);
//! - `watches.rs` — the watches that feed the loop and the budgets' view the schedule asks;
//! - `pods.rs` — a pod gone (its watch) or stopped (the node's cgroups);
//! - `requests.rs` — evictions, deletions and surges sent, and what their answers do;
//! - `finish.rs` — the ending: surges given back, the report, its Event and condition;
//! - `dry.rs` — the dry run's plan.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::stream::{BoxStream, FuturesUnordered};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, EvictParams, PartialObjectMeta, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::watcher::{self, watcher};
use kube::{Client, Resource};
use serde_json::json;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::cgroups::Cgroups;
use super::cordon::{
    self, CORDONED_BY, CordonDecision, CordonRecord, EXCLUDE_LB_LABEL, Lifter, UncordonDecision,
};
use super::evidence::{Evidence, Owner};
use super::explain;
use super::narrate::Narrator;
use super::plan::{self, Answer, Cause, Outcome, Plan, PlanOptions, PodRef};
pub use super::step::DrainOutcome;
use super::step::{
    Command, Deleted, Limits, PodState, Refusal, Schedule, Step, Tracked, Verdict, later,
};
use super::surging::{self, Surges};
use super::unsatisfiable::{Autoscaler, Wanted};
use crate::config::{OnDeadline, UnsatisfiableBudgets};
use crate::node_write::{self, NodeWrite, WriteError};
use crate::store::Mirror;

mod cordoning;
mod dry;
mod finish;
mod options;
mod pods;
mod requests;
mod watches;

pub use cordoning::{
    CordonOutcome, UncordonOutcome, cordon, cordon_for_shutdown, cordon_taking_over, uncordon,
};
use cordoning::{Kind, api_err, cordon_recorded};
pub use dry::{dry_run, dry_run_with_pods};
pub use finish::{DrainReport, ENDING};
pub use options::{DrainOptions, Error, Gone, Result};
use watches::*;

/// How often a drain on its own node looks for stopped containers in the cgroup tree.
const NODE_POLL: Duration = Duration::from_millis(200);

/// Whether `stop` says stop now.
fn stop_set(stop: Option<&tokio::sync::watch::Receiver<bool>>) -> bool {
    stop.is_some_and(|s| *s.borrow())
}

/// Resolves when `stop` says stop; never without one, or once its sender is gone unset.
async fn stop_requested(stop: Option<&mut tokio::sync::watch::Receiver<bool>>) {
    if let Some(s) = stop
        && s.wait_for(|stop| *stop).await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// A request's answer, fed back to the schedule.
enum Reply {
    Evict(std::result::Result<(), kube::Error>),
    Delete(std::result::Result<(), kube::Error>),
    Surge(super::surging::Started),
    SurgeReady(std::result::Result<bool, kube::Error>),
}

type Request = futures::future::BoxFuture<'static, (PodRef, Reply)>;

/// How long a drain's start waits for its `DrainInProgress` write: one read and one patch on an
/// API server that just answered the cordon; longer means it is struggling, and the evictions
/// matter more than the word.
const LIFECYCLE_WRITE_WAIT: Duration = Duration::from_secs(2);

/// Drains `node`: cordon, evict wave by wave, wait until every evictable pod is gone or the
/// deadline passes, then apply the deadline policy. Returns a report; errors only for problems
/// that make going on pointless (node missing, permission denied, pods never listed).
pub async fn drain(client: &Client, node: &str, opts: &DrainOptions) -> Result<DrainReport> {
    Drain::new(client, node, opts).run().await
}

struct Drain<'a> {
    client: &'a Client,
    node: &'a str,
    opts: &'a DrainOptions,
    recorder: Recorder,
    node_ref: Option<k8s_openapi::api::core::v1::ObjectReference>,
}

impl<'a> Drain<'a> {
    fn new(client: &'a Client, node: &'a str, opts: &'a DrainOptions) -> Self {
        Self {
            client,
            node,
            opts,
            recorder: crate::events::recorder(client, "nodeward", None),
            node_ref: None,
        }
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        if let Some(reference) = &self.node_ref {
            crate::events::publish(&self.recorder, reference, type_, reason, "Drain", note).await;
        }
    }

    /// `request`, bounded by the drain's deadline (unless `on_deadline = wait`).
    async fn by_deadline<T>(
        &self,
        deadline: Instant,
        action: &'static str,
        request: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        if self.opts.on_deadline == OnDeadline::Wait {
            return request.await;
        }
        tokio::time::timeout_at(deadline, request)
            .await
            .unwrap_or_else(|_| {
                Err(Error::NoAnswer {
                    node: self.node.to_string(),
                    action,
                    waited: self.opts.timeout,
                })
            })
    }

    async fn run(mut self) -> Result<DrainReport> {
        let started = Instant::now();
        if stop_set(self.opts.stop.as_ref()) {
            // Stopped before it began (between two attempts): nothing cordoned, nothing to say.
            let (outcome, tally) = (DrainOutcome::Cancelled, Default::default());
            return Ok(DrainReport::of(
                self.node,
                outcome,
                tally,
                Vec::new(),
                Duration::ZERO,
            ));
        }
        let deadline = later(started, self.opts.timeout);
        self.cordon_first(deadline).await?;
        let _running = self.opts.metrics.as_deref().map(|m| m.started());
        let mut w = Watches::start(self.client, self.node);
        w.initial_lists(self.node, deadline, self.opts.timeout)
            .await?;
        let mut schedule = self.schedule(&w, started);
        let mut narrator = self.begin(&schedule).await;
        let mut inflight: FuturesUnordered<Request> = FuturesUnordered::new();
        let mut surges = Surges::default();
        let mut stop = self.opts.stop.clone();
        let outcome = loop {
            if stop_set(stop.as_ref()) {
                break DrainOutcome::Cancelled;
            }
            let now = Instant::now();
            // Before the step, so that a pod the node says has left counts in this very step.
            let next_poll = self.poll_node(&mut schedule, &w.pods, &mut surges, now);
            // One snapshot of the budgets per step, not one per blocked pod.
            let snapshot = w.snapshot(&schedule, self.client);
            let (commands, mut wake) =
                match schedule.step(now, &snapshot.view(self.node, self.opts.cluster_shutdown)) {
                    Step::Done(outcome) => break outcome,
                    Step::Run { commands, wake } => (commands, wake),
                };
            if let Some(at) = next_poll {
                wake = wake.min(at);
            }
            for c in commands {
                self.perform(c, &mut inflight, &mut surges);
            }
            if let Some(at) = self.check_surges(now, &mut surges, &mut inflight) {
                wake = wake.min(at);
            }
            if let Some(at) = self.explain(
                &schedule,
                &snapshot.budgets,
                now,
                deadline,
                narrator.as_mut(),
            ) {
                wake = wake.min(at);
            }
            tokio::select! {
                Some((pod, reply)) = inflight.next(), if !inflight.is_empty() => {
                    self.answered(&mut schedule, &w.budgets, &pod, reply, narrator.as_mut(), &mut surges)?;
                }
                Some(ev) = w.pod_events.next() => {
                    self.pod_event(&mut schedule, &mut w.pods, &w.daemonsets, ev, &mut surges)?;
                }
                Some(ev) = w.pdb_events.next() => match ev {
                    Ok(ev) => w.budgets.apply(&ev),
                    Err(e) => check_watch_error(self.node, &e, "list and watch poddisruptionbudgets")?,
                },
                Some(ev) = w.ds_events.next() => match ev {
                    Ok(ev) => w.daemonsets.apply(&ev),
                    Err(e) => check_watch_error(self.node, &e, "list and watch daemonsets")?,
                },
                Some(seen) = w.evidence.events.next() => w.evidence.apply(seen, self.node),
                () = stop_requested(stop.as_mut()) => break DrainOutcome::Cancelled,
                _ = tokio::time::sleep_until(wake) => {}
            }
        };
        Ok(self
            .end(outcome, schedule, surges, &w.pods, started, narrator)
            .await)
    }

    /// The drain's start said on the Node: the DrainStarted Event, and the narrator that keeps
    /// `nodeward.io/Draining` and the blocked pods told what the drain waits on. Nothing to
    /// evict or refuse (the agent already drained for this shutdown, say): the drain is logged,
    /// but no empty DrainStarted/DrainSucceeded pair goes on the Node, and there is no narrator.
    async fn begin(&self, schedule: &Schedule) -> Option<Narrator> {
        if schedule.is_empty() {
            return None;
        }
        let (to_evict, _) = schedule.counts();
        let note = format!(
            "evicting {to_evict} pods within {:?}: {}",
            self.opts.timeout, self.opts.reason
        );
        self.event(EventType::Normal, "DrainStarted", note).await;
        let started = crate::lifecycle::Moment::DrainStarted {
            cause: &self.opts.reason,
        };
        // Awaited (briefly) so that the end's write can never land before it.
        if tokio::time::timeout(LIFECYCLE_WRITE_WAIT, self.lifecycle(&started))
            .await
            .is_err()
        {
            debug!(node = self.node, "DrainInProgress was not written in time");
        }
        let progress = self.opts.progress.clone();
        Some(Narrator::new(
            self.client,
            self.node,
            self.recorder.clone(),
            progress,
        ))
    }

    /// Writes the lifecycle conditions of `moment` on the Node (when `[conditions] lifecycle`);
    /// a failure is logged and changes nothing else, as the Draining condition's.
    async fn lifecycle(&self, moment: &crate::lifecycle::Moment<'_>) {
        if !self.opts.lifecycle {
            return;
        }
        let wants = crate::lifecycle::wants(moment);
        if let Err(e) = crate::lifecycle::write(self.client, self.node, None, &wants, true).await {
            debug!(node = self.node, error = %e, "cannot write the drain's lifecycle conditions");
        }
    }

    /// Says what the drain waits on at `now`: on the Node (through the narrator, which answers
    /// when it wants to write next) and in the metrics.
    fn explain(
        &self,
        schedule: &Schedule,
        budgets: &[std::sync::Arc<PodDisruptionBudget>],
        now: Instant,
        deadline: Instant,
        narrator: Option<&mut Narrator>,
    ) -> Option<Instant> {
        if narrator.is_none() && self.opts.metrics.is_none() {
            return None;
        }
        let selecting = |t: &Tracked| {
            plan::budgets_for(
                &t.pod.namespace,
                &t.labels,
                budgets.iter().map(AsRef::as_ref),
            )
            .into_iter()
            .map(plan::budget_key)
            .collect()
        };
        let e = explain::explain(schedule.tracked(), now, deadline, &selecting, &|b| {
            allowed_in(budgets, b)
        });
        if let Some(m) = &self.opts.metrics {
            m.waiting(&e);
        }
        narrator.map(|n| n.update(now, &e))
    }

    /// Reads the Node and cordons it (recording nodeward's ownership), both by the deadline.
    async fn cordon_first(&mut self, deadline: Instant) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let get = async {
            nodes
                .get(self.node)
                .await
                .map_err(api_err(self.node, "get"))
        };
        let node_obj = self.by_deadline(deadline, "get", get).await?;
        self.node_ref = Some(node_obj.object_ref(&()));
        let cordon = cordon_recorded(
            self.client,
            self.node,
            &self.opts.reason,
            self.opts.exclude_from_load_balancers,
            if self.opts.shutdown {
                Kind::Shutdown
            } else {
                Kind::Plain
            },
        );
        if self.by_deadline(deadline, "cordon", cordon).await? == CordonOutcome::Cordoned {
            if let Some(c) = &self.opts.cordoned {
                c.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            self.event(
                EventType::Normal,
                "Cordoned",
                format!("cordoned by nodeward: {}", self.opts.reason),
            )
            .await;
        }
        Ok(())
    }

    /// The drain's schedule, with every pod the first list found on the node.
    fn schedule(&self, w: &Watches<'_>, started: Instant) -> Schedule {
        let limits = Limits {
            concurrency: self.opts.concurrency,
            timeout: self.opts.timeout,
            on_deadline: self.opts.on_deadline,
            unsatisfiable: self.opts.unsatisfiable,
        };
        let mut schedule = Schedule::new(limits, self.opts.plan.clone(), started);
        for pod in w.pods.state() {
            self.track(&mut schedule, &pod, &w.daemonsets);
        }
        let (to_evict, refused) = schedule.counts();
        info!(
            node = self.node,
            evict = to_evict,
            skipped = schedule.skipped(),
            refused,
            timeout = ?self.opts.timeout,
            "drain started"
        );
        schedule
    }
}
