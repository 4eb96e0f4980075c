//! The I/O half of a drain: cordon, evict wave by wave, and wait — on watches, not polls.
//!
//! One event loop owns all state. Two watches feed it: the node's pods (field selector
//! `spec.nodeName`), which is how a drain learns that a pod is really gone rather than merely
//! accepted for eviction, and the PodDisruptionBudgets, so a pod blocked by a budget is retried
//! the moment the budget's `disruptionsAllowed` rises (never sooner than [`BUDGET_RETRY_FLOOR`],
//! and at the latest after [`BUDGET_RETRY_CEILING`] in case a watch event was missed). Evictions
//! run with bounded concurrency as futures polled by the same loop, so nothing needs a lock.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures::stream::{BoxStream, FuturesUnordered};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::watcher::{self, watcher};
use kube::{Client, Resource};
use serde_json::json;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::cordon::{
    self, CORDONED_BY, CordonDecision, CordonRecord, EXCLUDE_LB_LABEL, UncordonDecision,
};
use super::plan::{self, Answer, Decision, Outcome, Plan, PlanOptions, PodRef};
use crate::config::OnDeadline;

/// After a 429 from a budget, the earliest retry even if the budget reopens at once: keeps a
/// budget that flaps from turning into a hot loop.
pub const BUDGET_RETRY_FLOOR: Duration = Duration::from_millis(50);
/// Retry a budget-blocked pod at least this often even without a budget event; kubectl drain
/// also retries a 429 after 5 s.
pub const BUDGET_RETRY_CEILING: Duration = Duration::from_secs(5);
/// First backoff after a server error or throttling; doubles per attempt.
const RETRY_BASE: Duration = Duration::from_millis(100);
/// Backoff cap for server errors, so a recovered API server is noticed within seconds.
const RETRY_CAP: Duration = Duration::from_secs(5);
/// Conflicting writes to the Node retried this many times (another writer is active).
const PATCH_ATTEMPTS: usize = 5;
/// Progress lines at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Errors that stop a drain, cordon or uncordon.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node does not exist.
    #[error("node {node} not found")]
    NodeNotFound {
        /// The node.
        node: String,
    },
    /// An API call failed.
    #[error("cannot {action} node {node}: {source}")]
    Api {
        /// The node.
        node: String,
        /// What was being done.
        action: &'static str,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The credentials lack a permission the drain needs.
    #[error(
        "permission denied: the credentials cannot {verb} (pod {pod}); grant it (see packaging/kubernetes/rbac-agent.yaml)"
    )]
    Forbidden {
        /// The RBAC verb and resource.
        verb: &'static str,
        /// The pod it was tried on.
        pod: String,
    },
    /// The node's pods could not be listed before the deadline: nothing is known to be drained.
    #[error(
        "could not list the pods of node {node} within {waited:?} ({last_error}); the node is cordoned but not known to be drained"
    )]
    PodsNotListed {
        /// The node.
        node: String,
        /// How long the drain tried.
        waited: Duration,
        /// The last watch error.
        last_error: String,
    },
    /// Another writer kept changing the Node.
    #[error("node {node} kept changing under us ({attempts} conflicting writes); try again")]
    Conflict {
        /// The node.
        node: String,
        /// How many tries.
        attempts: usize,
    },
    /// Someone else cordoned the node and `--force` was not given.
    #[error("node {node} was cordoned by {}, not by nodeward; refusing to uncordon it (use --force to override)", who.as_deref().unwrap_or("someone else"))]
    CordonedByOther {
        /// The node.
        node: String,
        /// Who, if managedFields tell.
        who: Option<String>,
    },
}

/// `pub type Result` for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a drain behaves.
#[derive(Debug, Clone)]
pub struct DrainOptions {
    /// Which pods go and in which waves.
    pub plan: PlanOptions,
    /// Evictions in flight at once.
    pub concurrency: usize,
    /// Overall deadline.
    pub timeout: Duration,
    /// What happens when the deadline nears.
    pub on_deadline: OnDeadline,
    /// Add the load-balancer exclusion label while draining.
    pub exclude_from_load_balancers: bool,
    /// Why, recorded in the cordon annotation and events.
    pub reason: String,
    /// The machine is shutting down: the cordon is recorded as a shutdown cordon, which the
    /// agent lifts when the node comes back (see [`cordon::lift_after_shutdown`]).
    pub shutdown: bool,
}

impl DrainOptions {
    /// Options from the `[drain]` settings.
    pub fn from_settings(s: &crate::config::DrainSettings, reason: impl Into<String>) -> Self {
        Self {
            plan: PlanOptions {
                force: s.force,
                delete_emptydir_data: s.delete_emptydir_data,
                waves: s.waves.clone(),
            },
            concurrency: usize::try_from(s.concurrency).unwrap_or(usize::MAX),
            timeout: s.timeout,
            on_deadline: s.on_deadline,
            exclude_from_load_balancers: s.exclude_from_load_balancers,
            reason: reason.into(),
            shutdown: false,
        }
    }
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
}

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
    pub refused: Vec<(PodRef, String)>,
    /// Pods still on the node at the deadline.
    pub left_behind: Vec<PodRef>,
    /// Pods deleted bypassing their budgets by the `delete` deadline policy.
    pub force_deleted: Vec<PodRef>,
    /// Eviction requests sent.
    pub eviction_requests: usize,
    /// Wall time.
    pub elapsed: Duration,
}

impl std::fmt::Display for DrainReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verdict = match self.outcome {
            DrainOutcome::Drained => "drained",
            DrainOutcome::Refused => "drained except refused pods",
            DrainOutcome::DeadlineExceeded => "deadline exceeded",
        };
        writeln!(
            f,
            "node {}: {verdict} in {:.3}s: {} evicted, {} skipped, {} refused, {} left behind, {} deleted past their budget ({} eviction requests)",
            self.node,
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
        Ok(())
    }
}

/// Whether a cordon was done now or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CordonOutcome {
    /// nodeward cordoned the node now.
    Cordoned,
    /// nodeward had cordoned it before.
    AlreadyOurs,
    /// Someone else had cordoned it; their cordon stays theirs.
    AlreadyByOther,
}

/// What an uncordon did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UncordonOutcome {
    /// The cordon was lifted.
    Uncordoned,
    /// It was not cordoned.
    NotCordoned,
}

fn api_err<'n>(node: &'n str, action: &'static str) -> impl FnOnce(kube::Error) -> Error + 'n {
    move |source| match &source {
        kube::Error::Api(s) if s.code == 404 => Error::NodeNotFound {
            node: node.to_string(),
        },
        _ => Error::Api {
            node: node.to_string(),
            action,
            source,
        },
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Field manager recorded in the Node's managedFields for nodeward's writes.
const FIELD_MANAGER: &str = "nodeward";

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

/// Cordons `node`, recording nodeward's ownership; leaves a cordon by someone else as it is.
pub async fn cordon(
    client: &Client,
    node: &str,
    reason: &str,
    exclude_lb: bool,
) -> Result<CordonOutcome> {
    cordon_recorded(client, node, reason, exclude_lb, false).await
}

/// [`cordon`] because the machine is shutting down: recorded as a shutdown cordon, which the
/// agent lifts once the node is back and its gates pass.
pub async fn cordon_for_shutdown(
    client: &Client,
    node: &str,
    reason: &str,
    exclude_lb: bool,
) -> Result<CordonOutcome> {
    cordon_recorded(client, node, reason, exclude_lb, true).await
}

/// What a guarded Node write decided after reading the Node.
enum NodeWrite<T> {
    /// Nothing to write: the answer is already known.
    Done(T),
    /// Apply this JSON merge patch, then answer `T`.
    Patch(serde_json::Value, T),
}

/// Reads the Node, lets `decide` choose, and applies its patch with the read resourceVersion as
/// a precondition; on a conflict (someone else wrote the Node in between) it reads and decides
/// again, so a concurrent change such as an admin's cordon is never overwritten.
async fn write_node_guarded<T: std::fmt::Debug>(
    client: &Client,
    node: &str,
    action: &'static str,
    decide: impl Fn(&Node) -> Result<NodeWrite<T>>,
) -> Result<T> {
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..PATCH_ATTEMPTS {
        let current = nodes.get(node).await.map_err(api_err(node, "get"))?;
        let (mut patch, outcome) = match decide(&current)? {
            NodeWrite::Done(outcome) => return Ok(outcome),
            NodeWrite::Patch(patch, outcome) => (patch, outcome),
        };
        patch["metadata"]["resourceVersion"] = json!(current.metadata.resource_version);
        match nodes
            .patch(node, &patch_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(node, action, ?outcome, "node written");
                return Ok(outcome);
            }
            Err(e) if is_conflict(&e) => debug!(node, action, "conflict; re-reading the node"),
            Err(e) => return Err(api_err(node, action)(e)),
        }
    }
    Err(Error::Conflict {
        node: node.to_string(),
        attempts: PATCH_ATTEMPTS,
    })
}

/// [`cordon`], recording whether the cordon is for a shutdown.
async fn cordon_recorded(
    client: &Client,
    node: &str,
    reason: &str,
    exclude_lb: bool,
    shutdown: bool,
) -> Result<CordonOutcome> {
    write_node_guarded(client, node, "cordon", |current| {
        match cordon::cordon_decision(current) {
            CordonDecision::AlreadyOurs => return Ok(NodeWrite::Done(CordonOutcome::AlreadyOurs)),
            CordonDecision::AlreadyByOther => {
                info!(
                    node,
                    "node was already cordoned by someone else; leaving their cordon as it is"
                );
                return Ok(NodeWrite::Done(CordonOutcome::AlreadyByOther));
            }
            CordonDecision::Cordon => {}
        }
        let had_lb_label = current
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(EXCLUDE_LB_LABEL));
        let add_lb = exclude_lb && !had_lb_label;
        let record = CordonRecord {
            reason: reason.to_string(),
            at: jiff::Timestamp::now().to_string(),
            excluded_from_lb: add_lb,
            shutdown,
        };
        let mut patch = json!({
            "metadata": {
                "annotations": {CORDONED_BY: serde_json::to_string(&record).unwrap_or_default()},
            },
            "spec": {"unschedulable": true},
        });
        if add_lb {
            patch["metadata"]["labels"] = json!({EXCLUDE_LB_LABEL: "true"});
        }
        Ok(NodeWrite::Patch(patch, CordonOutcome::Cordoned))
    })
    .await
}

/// Lifts nodeward's own cordon; refuses someone else's unless `force`.
pub async fn uncordon(client: &Client, node: &str, force: bool) -> Result<UncordonOutcome> {
    write_node_guarded(client, node, "uncordon", |current| {
        let mut patch = json!({"metadata": {"annotations": {CORDONED_BY: null}}});
        Ok(match cordon::uncordon_decision(current, force) {
            UncordonDecision::ByOther { who } => {
                return Err(Error::CordonedByOther {
                    node: node.to_string(),
                    who,
                });
            }
            UncordonDecision::NotCordoned {
                stale_record: false,
            } => NodeWrite::Done(UncordonOutcome::NotCordoned),
            UncordonDecision::NotCordoned { stale_record: true } => {
                NodeWrite::Patch(patch, UncordonOutcome::NotCordoned)
            }
            UncordonDecision::Uncordon { remove_lb_label } => {
                patch["spec"] = json!({"unschedulable": null});
                if remove_lb_label {
                    patch["metadata"]["labels"] = json!({EXCLUDE_LB_LABEL: null});
                }
                NodeWrite::Patch(patch, UncordonOutcome::Uncordoned)
            }
        })
    })
    .await
}

/// A live copy of watched objects, following the watcher's relist protocol (a relist replaces
/// the whole set, so objects deleted while the watch was down disappear too).
struct Mirror<K> {
    live: HashMap<String, K>,
    relisting: Option<HashMap<String, K>>,
    synced: bool,
    key: fn(&K) -> String,
}

impl<K> Mirror<K> {
    fn new(key: fn(&K) -> String) -> Self {
        Self {
            live: HashMap::new(),
            relisting: None,
            synced: false,
            key,
        }
    }

    fn apply(&mut self, event: watcher::Event<K>) {
        match event {
            watcher::Event::Apply(k) => {
                self.live.insert((self.key)(&k), k);
            }
            watcher::Event::Delete(k) => {
                self.live.remove(&(self.key)(&k));
            }
            watcher::Event::Init => self.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(k) => {
                let key = (self.key)(&k);
                self.relisting.get_or_insert_default().insert(key, k);
            }
            watcher::Event::InitDone => {
                self.live = self.relisting.take().unwrap_or_default();
                self.synced = true;
            }
        }
    }
}

fn pod_key(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

fn pdb_key(b: &PodDisruptionBudget) -> String {
    format!(
        "{}/{}",
        b.metadata.namespace.as_deref().unwrap_or_default(),
        b.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Where one pod is in its eviction.
#[derive(Debug, Clone, PartialEq)]
enum PodState {
    /// Not tried yet.
    Pending,
    /// A request is in flight.
    InFlight,
    /// A budget said no at `since`; retry when it opens.
    Blocked {
        since: Instant,
        budgets: Vec<String>,
    },
    /// A transient error; retry at `until`.
    Backoff { until: Instant },
    /// Accepted (or deleted by the fallback); waiting for the pod to disappear.
    Leaving,
    /// Gone from the node.
    Gone,
    /// Will not be evicted.
    Refused(String),
}

struct Tracked {
    pod: PodRef,
    /// The pod's labels, to find the budgets that select it.
    labels: BTreeMap<String, String>,
    wave: usize,
    state: PodState,
    attempts: u32,
}

impl Tracked {
    fn settled(&self) -> bool {
        matches!(self.state, PodState::Gone | PodState::Refused(_))
    }
}

type EvictionResult = (String, std::result::Result<(), kube::Error>);

/// Drains `node`: cordon, evict wave by wave, wait until every evictable pod is gone or the
/// deadline passes, then apply the deadline policy. Returns a report; errors only for problems
/// that make going on pointless (node missing, permission denied).
pub async fn drain(client: &Client, node: &str, opts: &DrainOptions) -> Result<DrainReport> {
    Drain::new(client, node, opts).run().await
}

/// Computes the plan a drain would follow, changing nothing.
pub async fn dry_run(client: &Client, node: &str, opts: &DrainOptions) -> Result<Plan> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.get(node).await.map_err(api_err(node, "get"))?;
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(api_err(node, "list pods of"))?;
    Ok(Plan::new(&list.items, &opts.plan))
}

struct Drain<'a> {
    client: &'a Client,
    node: &'a str,
    opts: &'a DrainOptions,
    recorder: Recorder,
    node_ref: Option<k8s_openapi::api::core::v1::ObjectReference>,
    tracked: BTreeMap<String, Tracked>,
    skipped: Vec<(PodRef, plan::SkipReason)>,
    force_deleted: Vec<PodRef>,
    eviction_requests: usize,
}

impl<'a> Drain<'a> {
    fn new(client: &'a Client, node: &'a str, opts: &'a DrainOptions) -> Self {
        Self {
            client,
            node,
            opts,
            recorder: crate::events::recorder(client, "nodeward", None),
            node_ref: None,
            tracked: BTreeMap::new(),
            skipped: Vec::new(),
            force_deleted: Vec::new(),
            eviction_requests: 0,
        }
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        if let Some(reference) = &self.node_ref {
            crate::events::publish(&self.recorder, reference, type_, reason, "Drain", note).await;
        }
    }

    fn track(&mut self, pod: &Pod) {
        let r = PodRef::of(pod);
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        match plan::decide(pod, &self.opts.plan) {
            Decision::Evict { wave } => {
                // A pod already terminating needs no eviction, only the wait.
                let state = if pod.metadata.deletion_timestamp.is_some() {
                    PodState::Leaving
                } else {
                    PodState::Pending
                };
                self.tracked.insert(
                    r.uid.clone(),
                    Tracked {
                        pod: r,
                        labels,
                        wave,
                        state,
                        attempts: 0,
                    },
                );
            }
            Decision::Refuse(why) => {
                self.tracked.insert(
                    r.uid.clone(),
                    Tracked {
                        pod: r,
                        labels,
                        wave: 0,
                        state: PodState::Refused(why.to_string()),
                        attempts: 0,
                    },
                );
            }
            Decision::Skip(why) => self.skipped.push((r, why)),
        }
    }

    async fn run(mut self) -> Result<DrainReport> {
        let started = Instant::now();
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node_obj = nodes
            .get(self.node)
            .await
            .map_err(api_err(self.node, "get"))?;
        self.node_ref = Some(node_obj.object_ref(&()));
        let cordoned = cordon_recorded(
            self.client,
            self.node,
            &self.opts.reason,
            self.opts.exclude_from_load_balancers,
            self.opts.shutdown,
        )
        .await?;
        if cordoned == CordonOutcome::Cordoned {
            self.event(
                EventType::Normal,
                "Cordoned",
                format!("cordoned by nodeward: {}", self.opts.reason),
            )
            .await;
        }

        let pods_api: Api<Pod> = Api::all(self.client.clone());
        let mut pod_events: BoxStream<'_, _> = watcher(
            pods_api,
            watcher::Config::default().fields(&format!("spec.nodeName={}", self.node)),
        )
        .default_backoff()
        .boxed();
        let pdb_api: Api<PodDisruptionBudget> = Api::all(self.client.clone());
        let mut pdb_events: BoxStream<'_, _> = watcher(pdb_api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut pods = Mirror::new(pod_key);
        let mut budgets = Mirror::new(pdb_key);

        // The pods' initial list before anything is planned. Budgets only time the retries of
        // a refused eviction (the Eviction API itself enforces them), so evictions do not wait
        // for their list; the main loop keeps applying their events.
        let mut last_pod_error = String::from("no answer");
        while !pods.synced {
            tokio::select! {
                Some(ev) = pod_events.next() => match ev {
                    Ok(ev) => pods.apply(ev),
                    Err(e) => {
                        check_watch_error(self.node, &e, "list and watch pods")?;
                        last_pod_error = e.to_string();
                    }
                },
                Some(ev) = pdb_events.next() => match ev {
                    Ok(ev) => budgets.apply(ev),
                    Err(e) => check_watch_error(self.node, &e, "list and watch poddisruptionbudgets")?,
                },
                _ = tokio::time::sleep_until(started + self.opts.timeout) => {
                    return Err(Error::PodsNotListed {
                        node: self.node.to_string(),
                        waited: self.opts.timeout,
                        last_error: last_pod_error,
                    });
                }
            }
        }
        let initial: Vec<Pod> = pods.live.values().cloned().collect();
        for pod in &initial {
            self.track(pod);
        }
        let to_evict = self
            .tracked
            .values()
            .filter(|t| !matches!(t.state, PodState::Refused(_)))
            .count();
        info!(
            node = self.node,
            evict = to_evict,
            skipped = self.skipped.len(),
            refused = self.tracked.len() - to_evict,
            timeout = ?self.opts.timeout,
            "drain started"
        );
        // Nothing to evict or refuse (the agent already drained for this shutdown, say): the
        // drain is logged, but no empty DrainStarted/DrainSucceeded pair goes on the Node.
        let eventful = !self.tracked.is_empty();
        if eventful {
            self.event(
                EventType::Normal,
                "DrainStarted",
                format!(
                    "evicting {to_evict} pods within {:?}: {}",
                    self.opts.timeout, self.opts.reason
                ),
            )
            .await;
        }

        let waves = plan::wave_deadlines(self.opts.timeout, &self.opts.plan.waves);
        let deadline = started + self.opts.timeout;
        let fallback_at = deadline - plan::fallback_margin(self.opts.timeout);
        let mut wave = 0usize;
        let mut inflight: FuturesUnordered<futures::future::BoxFuture<'static, EvictionResult>> =
            FuturesUnordered::new();
        let mut fallback_done = false;
        let mut waiting_past_deadline = false;
        let mut last_progress = started;
        let mut progress_dirty = true;

        let outcome = loop {
            let now = Instant::now();
            self.mark_gone(&pods);
            // Advance through waves whose pods are all settled or whose share of time is spent.
            while wave + 1 < waves.len() {
                let wave_settled = self
                    .tracked
                    .values()
                    .filter(|t| t.wave <= wave)
                    .all(Tracked::settled);
                if wave_settled || now >= started + waves[wave] {
                    if !wave_settled {
                        warn!(
                            node = self.node,
                            wave,
                            "wave used up its share of the deadline; starting the next one while its pods keep leaving"
                        );
                    }
                    wave += 1;
                    debug!(node = self.node, wave, "next wave");
                } else {
                    break;
                }
            }
            if self.tracked.values().all(Tracked::settled) {
                break if self
                    .tracked
                    .values()
                    .any(|t| matches!(t.state, PodState::Refused(_)))
                {
                    DrainOutcome::Refused
                } else {
                    DrainOutcome::Drained
                };
            }
            if now >= deadline && self.opts.on_deadline != OnDeadline::Wait {
                break DrainOutcome::DeadlineExceeded;
            }
            if now >= deadline && !waiting_past_deadline {
                warn!(
                    node = self.node,
                    "deadline passed; on_deadline = wait, so the drain goes on"
                );
                waiting_past_deadline = true;
            }
            if now >= fallback_at && self.opts.on_deadline == OnDeadline::Delete && !fallback_done {
                fallback_done = true;
                self.delete_remaining(deadline - now).await;
            }
            self.launch(now, wave, &budgets, &mut inflight);
            if progress_dirty && now >= last_progress + PROGRESS_EVERY {
                self.log_progress();
                last_progress = now;
                progress_dirty = false;
            }

            let mut wake = if self.opts.on_deadline == OnDeadline::Wait {
                now + RETRY_CAP
            } else {
                deadline
            };
            if self.opts.on_deadline == OnDeadline::Delete && !fallback_done {
                wake = wake.min(fallback_at);
            }
            if wave + 1 < waves.len() {
                wake = wake.min(started + waves[wave]);
            }
            if progress_dirty {
                wake = wake.min(last_progress + PROGRESS_EVERY);
            }
            if inflight.len() < self.opts.concurrency
                && let Some(t) = self.next_retry(wave, &budgets)
            {
                wake = wake.min(t);
            }
            tokio::select! {
                Some((uid, result)) = inflight.next(), if !inflight.is_empty() => {
                    self.answer(&uid, result, &budgets)?;
                    progress_dirty = true;
                }
                Some(ev) = pod_events.next() => {
                    match ev {
                        Ok(ev) => {
                            if let watcher::Event::Apply(p) = &ev
                                && !self.tracked.contains_key(&pod_key(p))
                                && p.metadata.deletion_timestamp.is_none()
                            {
                                self.track(p);
                            }
                            pods.apply(ev);
                        }
                        Err(e) => check_watch_error(self.node, &e, "list and watch pods")?,
                    }
                    progress_dirty = true;
                }
                Some(ev) = pdb_events.next() => match ev {
                    Ok(ev) => budgets.apply(ev),
                    Err(e) => check_watch_error(self.node, &e, "list and watch poddisruptionbudgets")?,
                },
                _ = tokio::time::sleep_until(wake) => {}
            }
        };

        let elapsed = started.elapsed();
        let mut report = DrainReport {
            node: self.node.to_string(),
            outcome,
            evicted: Vec::new(),
            skipped: std::mem::take(&mut self.skipped),
            refused: Vec::new(),
            left_behind: Vec::new(),
            force_deleted: std::mem::take(&mut self.force_deleted),
            eviction_requests: self.eviction_requests,
            elapsed,
        };
        for t in std::mem::take(&mut self.tracked).into_values() {
            match t.state {
                PodState::Gone => report.evicted.push(t.pod),
                PodState::Refused(why) => report.refused.push((t.pod, why)),
                _ => report.left_behind.push(t.pod),
            }
        }
        match outcome {
            DrainOutcome::DeadlineExceeded => {
                let names: Vec<String> =
                    report.left_behind.iter().map(ToString::to_string).collect();
                warn!(node = self.node, left = names.len(), pods = %names.join(", "), "drain deadline exceeded");
                self.event(
                    EventType::Warning,
                    "DrainTimedOut",
                    format!(
                        "{} pods left after {:?}: {}",
                        names.len(),
                        self.opts.timeout,
                        names.join(", ")
                    ),
                )
                .await;
            }
            DrainOutcome::Drained | DrainOutcome::Refused => {
                let refused: Vec<String> =
                    report.refused.iter().map(|(p, _)| p.to_string()).collect();
                let note = if refused.is_empty() {
                    format!(
                        "{} pods evicted in {:.1}s",
                        report.evicted.len(),
                        elapsed.as_secs_f64()
                    )
                } else {
                    format!(
                        "{} pods evicted in {:.1}s; refused: {}",
                        report.evicted.len(),
                        elapsed.as_secs_f64(),
                        refused.join(", ")
                    )
                };
                if eventful {
                    self.event(EventType::Normal, "DrainSucceeded", note).await;
                }
            }
        }
        info!(node = self.node, summary = %report.to_string().trim_end(), "drain finished");
        Ok(report)
    }

    fn mark_gone(&mut self, pods: &Mirror<Pod>) {
        if !pods.synced {
            return;
        }
        for (uid, t) in &mut self.tracked {
            if !t.settled() && !pods.live.contains_key(uid) {
                debug!(pod = %t.pod, "gone");
                t.state = PodState::Gone;
            }
        }
    }

    fn budget_open(budgets: &Mirror<PodDisruptionBudget>, keys: &[String]) -> bool {
        keys.iter().any(|k| {
            budgets
                .live
                .get(k)
                .and_then(|b| b.status.as_ref())
                .is_some_and(|s| s.disruptions_allowed > 0)
        })
    }

    /// When the earliest blocked or backed-off pod of the active waves may be tried again.
    fn next_retry(&self, wave: usize, budgets: &Mirror<PodDisruptionBudget>) -> Option<Instant> {
        self.tracked
            .values()
            .filter(|t| t.wave <= wave)
            .filter_map(|t| match &t.state {
                PodState::Backoff { until } => Some(*until),
                PodState::Blocked {
                    since,
                    budgets: keys,
                } => Some(if Self::budget_open(budgets, keys) {
                    *since + BUDGET_RETRY_FLOOR
                } else {
                    *since + BUDGET_RETRY_CEILING
                }),
                _ => None,
            })
            .min()
    }

    fn launch(
        &mut self,
        now: Instant,
        wave: usize,
        budgets: &Mirror<PodDisruptionBudget>,
        inflight: &mut FuturesUnordered<futures::future::BoxFuture<'static, EvictionResult>>,
    ) {
        for t in self.tracked.values_mut() {
            if inflight.len() >= self.opts.concurrency {
                return;
            }
            if t.wave > wave {
                continue;
            }
            let ready = match &t.state {
                PodState::Pending => true,
                PodState::Backoff { until } => now >= *until,
                PodState::Blocked {
                    since,
                    budgets: keys,
                } => {
                    now >= *since + BUDGET_RETRY_CEILING
                        || (now >= *since + BUDGET_RETRY_FLOOR && Self::budget_open(budgets, keys))
                }
                _ => false,
            };
            if !ready {
                continue;
            }
            t.state = PodState::InFlight;
            t.attempts += 1;
            self.eviction_requests += 1;
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &t.pod.namespace);
            let pod = t.pod.clone();
            inflight.push(
                async move {
                    let params = EvictParams {
                        delete_options: Some(DeleteParams {
                            preconditions: Some(kube::api::Preconditions {
                                uid: Some(pod.uid.clone()),
                                resource_version: None,
                            }),
                            ..DeleteParams::default()
                        }),
                        post_options: PostParams::default(),
                    };
                    let result = api.evict(&pod.name, &params).await.map(|_| ());
                    (pod.uid, result)
                }
                .boxed(),
            );
        }
    }

    fn answer(
        &mut self,
        uid: &str,
        result: std::result::Result<(), kube::Error>,
        budgets: &Mirror<PodDisruptionBudget>,
    ) -> Result<()> {
        let Some(t) = self.tracked.get_mut(uid) else {
            return Ok(());
        };
        if t.state != PodState::InFlight {
            return Ok(());
        }
        let (code, budget_cause, message) = match &result {
            Ok(()) => (201, false, String::new()),
            Err(kube::Error::Api(s)) => (
                s.code,
                s.details
                    .as_ref()
                    .is_some_and(|d| d.causes.iter().any(|c| c.reason == "DisruptionBudget")),
                s.message.clone(),
            ),
            // No answer at all (connection refused, reset, timeout): as retryable as a 503.
            Err(e) => (503, false, e.to_string()),
        };
        let matching: Vec<String> =
            plan::budgets_for(&t.pod.namespace, &t.labels, budgets.live.values())
                .into_iter()
                .map(pdb_key)
                .collect();
        let outcome = Answer {
            code,
            budget_cause,
            matching_budgets: matching.len(),
        }
        .outcome();
        let now = Instant::now();
        match outcome {
            Outcome::Evicted | Outcome::Gone => {
                debug!(pod = %t.pod, code, "eviction accepted");
                t.state = PodState::Leaving;
            }
            Outcome::BudgetExhausted => {
                debug!(pod = %t.pod, "blocked by a disruption budget");
                t.state = PodState::Blocked {
                    since: now,
                    budgets: matching,
                };
            }
            Outcome::Retry => {
                let backoff = RETRY_BASE
                    .saturating_mul(1 << t.attempts.min(6))
                    .min(RETRY_CAP);
                debug!(pod = %t.pod, code, ?backoff, %message, "eviction failed; retrying");
                t.state = PodState::Backoff {
                    until: now + backoff,
                };
            }
            Outcome::MultipleBudgets => {
                warn!(pod = %t.pod, budgets = ?matching, "more than one PodDisruptionBudget selects the pod; the Eviction API cannot evict it");
                t.state = PodState::Refused(format!(
                    "selected by more than one PodDisruptionBudget ({})",
                    matching.join(", ")
                ));
            }
            Outcome::Forbidden => {
                warn!(pod = %t.pod, "missing permission: create pods/eviction");
                return Err(Error::Forbidden {
                    verb: "create pods/eviction",
                    pod: t.pod.to_string(),
                });
            }
            Outcome::Rejected => {
                warn!(pod = %t.pod, code, %message, "eviction rejected");
                t.state = PodState::Refused(format!("eviction rejected ({code}): {message}"));
            }
        }
        Ok(())
    }

    /// The `delete` fallback: delete what is left with the remaining time as grace period,
    /// bypassing budgets. Loud by design.
    async fn delete_remaining(&mut self, left: Duration) {
        let grace = i64::try_from(left.as_secs()).unwrap_or(i64::MAX);
        for t in self.tracked.values_mut() {
            if t.settled() || t.state == PodState::Leaving {
                continue;
            }
            error!(pod = %t.pod, grace_seconds = grace, "deadline near: deleting pod past its disruption budget (drain.on_deadline = delete)");
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &t.pod.namespace);
            let dp = DeleteParams {
                grace_period_seconds: Some(u32::try_from(grace).unwrap_or(u32::MAX)),
                preconditions: Some(kube::api::Preconditions {
                    uid: Some(t.pod.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&t.pod.name, &dp).await {
                Ok(_) => {
                    self.force_deleted.push(t.pod.clone());
                    t.state = PodState::Leaving;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => t.state = PodState::Gone,
                Err(e) => warn!(pod = %t.pod, error = %e, "cannot delete pod"),
            }
        }
    }

    fn log_progress(&self) {
        let total = self
            .tracked
            .values()
            .filter(|t| !matches!(t.state, PodState::Refused(_)))
            .count();
        let gone = self
            .tracked
            .values()
            .filter(|t| t.state == PodState::Gone)
            .count();
        let mut blocked: BTreeMap<&str, usize> = BTreeMap::new();
        for t in self.tracked.values() {
            if let PodState::Blocked { budgets, .. } = &t.state {
                for b in budgets {
                    *blocked.entry(b.as_str()).or_default() += 1;
                }
            }
        }
        let waiting: usize = self
            .tracked
            .values()
            .filter(|t| matches!(t.state, PodState::Blocked { .. }))
            .count();
        let on: Vec<&str> = blocked.keys().copied().collect();
        if waiting > 0 {
            info!(
                node = self.node,
                evicted = gone,
                total,
                waiting,
                "evicted {gone}/{total}, {waiting} waiting on PDB {}",
                on.join(", ")
            );
        } else {
            info!(
                node = self.node,
                evicted = gone,
                total,
                "evicted {gone}/{total}"
            );
        }
    }
}

/// This machine's hostname, for the event reporter instance.
pub fn hostname() -> Option<String> {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
}

/// A 403 on a watch the drain needs is a missing permission: say which, and stop. Any other
/// error is logged; the watcher relists with back-off.
fn check_watch_error(node: &str, e: &watcher::Error, verb: &'static str) -> Result<()> {
    let forbidden = matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) | watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 403);
    if forbidden {
        warn!(node, "missing permission: {verb}");
        return Err(Error::Forbidden {
            verb,
            pod: "-".into(),
        });
    }
    warn!(node, error = %e, "watch failed; the watcher relists");
    Ok(())
}
