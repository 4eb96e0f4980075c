//! The I/O half of a drain: cordon, evict wave by wave, and wait — on watches, not polls.
//!
//! One event loop owns all state. Two watches feed it: the node's pods (field selector
//! `spec.nodeName`), which is how a drain learns that a pod is really gone rather than merely
//! accepted for eviction, and the PodDisruptionBudgets, so a pod blocked by a budget is retried
//! the moment the budget's `disruptionsAllowed` rises (never sooner than [`BUDGET_RETRY_FLOOR`](super::step::BUDGET_RETRY_FLOOR),
//! and at the latest after [`BUDGET_RETRY_CEILING`](super::step::BUDGET_RETRY_CEILING) in case a watch event was missed). Evictions
//! run with bounded concurrency as futures polled by the same loop, so nothing needs a lock.
//! What to send when is decided by [`super::step::Schedule`], purely; this file only performs it.

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
        "permission denied: the credentials cannot {verb}{}; grant it (see packaging/kubernetes/rbac-agent.yaml)",
        pod.as_ref().map(|p| format!(" (pod {p})")).unwrap_or_default()
    )]
    Forbidden {
        /// The RBAC verb and resource.
        verb: &'static str,
        /// The pod it was tried on, if it was one pod's request.
        pod: Option<String>,
    },
    /// The node's pods could not be listed before the deadline: nothing is known to be drained.
    #[error(
        "could not list the pods of node {node} and the DaemonSets within {waited:?} ({last_error}); the node is cordoned but not known to be drained"
    )]
    PodsNotListed {
        /// The node.
        node: String,
        /// How long the drain tried.
        waited: Duration,
        /// The last watch error.
        last_error: String,
    },
    /// The API server did not answer before the deadline (a stopped or unreachable server
    /// accepts the connection and never replies; without this the drain would wait for the
    /// client's read timeout, minutes past its deadline).
    #[error(
        "cannot {action} node {node}: no answer from the API server within the drain deadline ({waited:?}); the node may not be cordoned"
    )]
    NoAnswer {
        /// The node.
        node: String,
        /// What was being done.
        action: &'static str,
        /// The deadline.
        waited: Duration,
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

impl Error {
    /// Whether the API server refused the client's credentials (401): a client built again
    /// from the kubeconfig's files may be accepted (kubelet rotated its certificate).
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, Self::Api { source: kube::Error::Api(s), .. } if s.code == 401)
    }

    /// Whether trying again can help: an unreachable or overloaded API server, a conflict, pods
    /// not listed yet. A missing node or permission, or a cordon that is not ours, stays so.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Api { source, .. } => match source {
                kube::Error::Api(s) => matches!(s.code, 409 | 429 | 500..=599),
                _ => true,
            },
            Self::PodsNotListed { .. } | Self::Conflict { .. } | Self::NoAnswer { .. } => true,
            Self::NodeNotFound { .. } | Self::Forbidden { .. } | Self::CordonedByOther { .. } => {
                false
            }
        }
    }
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
    /// Whether a pod whose budget cannot allow its eviction gets `on_deadline` at once.
    pub unsatisfiable: UnsatisfiableBudgets,
    /// Add the load-balancer exclusion label while draining.
    pub exclude_from_load_balancers: bool,
    /// Why, recorded in the cordon annotation and events.
    pub reason: String,
    /// Where the drain's figures go (the agent's `/metrics`), if anywhere.
    pub metrics: Option<std::sync::Arc<super::metrics::DrainMetrics>>,
    /// The machine is shutting down: the cordon is recorded as a shutdown cordon, which the
    /// agent lifts when the node comes back (see [`cordon::lift_after_shutdown`]).
    pub shutdown: bool,
    /// Where what the drain waits on goes, each time the Node's condition is written (the
    /// agent's status file), if anywhere.
    pub progress: Option<super::narrate::Progress>,
    /// When an evicted pod counts as gone.
    pub gone: Gone,
    /// Set the moment this drain's own write cordons the node ([`CordonOutcome::Cordoned`], not
    /// a cordon it found), for a caller that may drop the drain before its report (the agent,
    /// when a shutdown is cancelled), if any.
    pub cordoned: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// How long the drain's end may take once its loop is over (deadline, stop, every pod
    /// gone): surge replicas given back, the end Event, the last `nodeward.io/Draining` write.
    /// The drain may run this long past `timeout`.
    pub ending: Duration,
    /// `true` stops the drain: it ends [`DrainOutcome::Cancelled`], through the same ending.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// The whole cluster is being shut down (`nodeward cluster shutdown` recorded its intent,
    /// [`crate::names::CLUSTER_SHUTDOWN_CONFIGMAP`]): every node is cordoned and going down, so
    /// a budget that refuses an eviction cannot open before this node goes, and the drain need
    /// not wait on it. Set by the agent's shutdown drain when the intent exists as it starts;
    /// `false` for every other drain.
    pub cluster_shutdown: bool,
}

/// When an evicted pod counts as gone from its node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Gone {
    /// When its object is deleted, as kubectl drain waits: the node's kubelet keeps running and
    /// removes it seconds after the containers stop, and whoever runs `kubectl get pods` after the
    /// drain expects the node empty.
    #[default]
    Object,
    /// When its containers have stopped ([`plan::left_node`]): the kubelet stops with the machine
    /// and removes the objects when it is back, or they go with the Node. With the node's cgroup
    /// hierarchy when the drain runs on the node it drains: a pod whose containers have no
    /// process left there has stopped before its kubelet has said so.
    Stopped(Option<Cgroups>),
}

impl DrainOptions {
    /// Options for a node that is leaving (a system shutdown, the scaler removing the machine):
    /// the `[drain]` settings with `delete_emptydir_data_on_shutdown`, and the cordon recorded as
    /// a shutdown cordon when `shutdown`.
    pub fn for_leaving_node(
        s: &crate::config::DrainSettings,
        reason: impl Into<String>,
        shutdown: bool,
    ) -> Self {
        let mut opts = Self::from_settings(s, reason);
        opts.plan.delete_emptydir_data = s.delete_emptydir_data_on_shutdown;
        opts.shutdown = shutdown;
        // A shutdown drain runs on the machine that shuts down, whose kubelet stops with it.
        if shutdown {
            opts.gone = Gone::Stopped(Some(Cgroups::system()));
        }
        opts
    }

    /// Options for an operator's drain of a node that stays, from the `[drain]` settings.
    pub fn from_settings(s: &crate::config::DrainSettings, reason: impl Into<String>) -> Self {
        Self {
            plan: PlanOptions {
                force: s.force,
                delete_emptydir_data: s.delete_emptydir_data,
                waves: s.waves.clone(),
                surge: s.surge,
            },
            concurrency: usize::try_from(s.concurrency).unwrap_or(usize::MAX),
            timeout: s.timeout,
            on_deadline: s.on_deadline,
            unsatisfiable: s.unsatisfiable_budgets,
            exclude_from_load_balancers: s.exclude_from_load_balancers,
            reason: reason.into(),
            metrics: None,
            shutdown: false,
            progress: None,
            gone: Gone::Object,
            cordoned: None,
            ending: ENDING,
            stop: None,
            cluster_shutdown: false,
        }
    }
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
    pub refused: Vec<(PodRef, Refusal)>,
    /// Pods still on the node at the deadline.
    pub left_behind: Vec<PodRef>,
    /// Pods deleted bypassing their budgets by the `delete` deadline policy.
    pub force_deleted: Vec<PodRef>,
    /// Of the pods left behind or deleted past their budgets, those whose budget could not
    /// allow their eviction, and why ([`super::unsatisfiable`]).
    pub unsatisfiable: Vec<(PodRef, super::unsatisfiable::Why)>,
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
    fn of(
        node: &str,
        outcome: DrainOutcome,
        tally: super::step::Tally,
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

/// Whether a cordon was done now or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CordonOutcome {
    /// nodeward cordoned the node now.
    Cordoned,
    /// nodeward had cordoned it before.
    AlreadyOurs,
    /// Someone else had cordoned it; their cordon stays theirs.
    AlreadyByOther,
    /// nodeward had cordoned it for another reason; the cordon is now this one's, and goes back
    /// to that reason when this one is lifted ([`cordon::take_over`]).
    TakenOver {
        /// The earlier reason.
        from: String,
    },
}

/// What an uncordon did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UncordonOutcome {
    /// The cordon was lifted.
    Uncordoned,
    /// It was not cordoned.
    NotCordoned,
    /// nodeward's cordon for another moment: it stays (the lifter did not make it).
    Kept {
        /// The reason its record gives.
        reason: String,
    },
    /// This moment's cordon had taken over an earlier one of nodeward's: given back to it, the
    /// node still cordoned.
    GivenBack {
        /// The earlier reason, now the cordon's again.
        reason: String,
    },
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

/// Cordons `node`, recording nodeward's ownership; leaves a cordon by someone else as it is.
pub async fn cordon(
    client: &Client,
    node: &str,
    reason: &str,
    exclude_lb: bool,
) -> Result<CordonOutcome> {
    cordon_recorded(client, node, reason, exclude_lb, Kind::Plain).await
}

/// [`cordon`] for a moment that must own the cordon until it lifts it (a cluster shutdown): a
/// cordon nodeward made for another reason is taken over ([`CordonOutcome::TakenOver`]).
pub async fn cordon_taking_over(
    client: &Client,
    node: &str,
    reason: &str,
) -> Result<CordonOutcome> {
    cordon_recorded(client, node, reason, false, Kind::TakeOver).await
}

/// What a cordon is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A plain one.
    Plain,
    /// Because the machine is shutting down.
    Shutdown,
    /// Taking over nodeward's cordon for another reason.
    TakeOver,
}

/// [`cordon`] because the machine is shutting down: recorded as a shutdown cordon, which the
/// agent lifts once the node is back and its gates pass.
pub async fn cordon_for_shutdown(
    client: &Client,
    node: &str,
    reason: &str,
    exclude_lb: bool,
) -> Result<CordonOutcome> {
    cordon_recorded(client, node, reason, exclude_lb, Kind::Shutdown).await
}

/// [`node_write::write_guarded`] with this module's errors.
async fn write_node_guarded<T: std::fmt::Debug>(
    client: &Client,
    node: &str,
    action: &'static str,
    decide: impl Fn(&Node) -> Result<NodeWrite<T>>,
) -> Result<T> {
    match node_write::write_guarded(client, node, action, None, decide).await {
        Ok((_, outcome)) => {
            info!(node, action, ?outcome, "node written");
            Ok(outcome)
        }
        Err(WriteError::Refused(e)) => Err(e),
        Err(WriteError::Api { action, source }) => Err(api_err(node, action)(source)),
        Err(WriteError::Conflict) => Err(Error::Conflict {
            node: node.to_string(),
            attempts: node_write::ATTEMPTS,
        }),
    }
}

/// [`cordon`], recording what the cordon is for.
async fn cordon_recorded(
    client: &Client,
    node: &str,
    reason: &str,
    exclude_lb: bool,
    kind: Kind,
) -> Result<CordonOutcome> {
    write_node_guarded(client, node, "cordon", |current| {
        match cordon::cordon_decision(current) {
            CordonDecision::AlreadyOurs if kind == Kind::TakeOver => {
                let now = jiff::Timestamp::now().to_string();
                let Some(record) = cordon::take_over(current, reason, &now) else {
                    return Ok(NodeWrite::Done(CordonOutcome::AlreadyOurs));
                };
                let from = record
                    .before
                    .as_ref()
                    .map(|b| b.reason.clone())
                    .unwrap_or_default();
                let text = serde_json::to_string(&record).unwrap_or_default();
                let patch = json!({"metadata": {"annotations": {CORDONED_BY: text}}});
                return Ok(NodeWrite::Patch(patch, CordonOutcome::TakenOver { from }));
            }
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
            shutdown: kind == Kind::Shutdown,
            before: None,
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

/// Lifts nodeward's own cordon if `by` made it ([`cordon::uncordon_decision`]): another
/// moment's stays ([`UncordonOutcome::Kept`]), one this moment took over goes back to its
/// earlier reason ([`UncordonOutcome::GivenBack`]); refuses someone else's unless `force`.
pub async fn uncordon(
    client: &Client,
    node: &str,
    force: bool,
    by: Lifter<'_>,
) -> Result<UncordonOutcome> {
    write_node_guarded(client, node, "uncordon", |current| {
        let mut patch = json!({"metadata": {"annotations": {CORDONED_BY: null}}});
        Ok(match cordon::uncordon_decision(current, force, by) {
            UncordonDecision::Kept { reason } => NodeWrite::Done(UncordonOutcome::Kept { reason }),
            UncordonDecision::GiveBack { to } => {
                let reason = to.reason.clone();
                let text = serde_json::to_string(&to).unwrap_or_default();
                patch["metadata"]["annotations"][CORDONED_BY] = json!(text);
                NodeWrite::Patch(patch, UncordonOutcome::GivenBack { reason })
            }
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

/// The `disruptionsAllowed` of the budget `key` (`namespace/name`) in the drain's view.
fn allowed_in(budgets: &[std::sync::Arc<PodDisruptionBudget>], key: &str) -> Option<i32> {
    budgets
        .iter()
        .find(|b| plan::budget_key(b) == key)
        .and_then(|b| b.status.as_ref())
        .map(|s| s.disruptions_allowed)
}

/// Whether a budget among `budgets` selecting the pod allows a disruption now.
fn budget_open(budgets: &[std::sync::Arc<PodDisruptionBudget>], pod: &Tracked) -> bool {
    plan::budgets_for(
        &pod.pod.namespace,
        &pod.labels,
        budgets.iter().map(AsRef::as_ref),
    )
    .iter()
    .any(|b| b.status.as_ref().is_some_and(|s| s.disruptions_allowed > 0))
}

/// The UIDs of the pods on the node.
/// The schedule's questions about budgets, answered from one snapshot of the drain's watches.
struct BudgetView<'a> {
    /// The budgets.
    budgets: &'a [std::sync::Arc<PodDisruptionBudget>],
    /// The cluster's Pending pods, once a budget blocked a pod ([`Evidence`]).
    pending: &'a [std::sync::Arc<Pod>],
    /// Every Node, once listed.
    nodes: Option<&'a [std::sync::Arc<Node>]>,
    /// The node drained.
    node: &'a str,
    /// [`DrainOptions::cluster_shutdown`].
    cluster_shutdown: bool,
    /// What the owner of each blocked pod (by UID) wants.
    wanted: &'a BTreeMap<String, Wanted>,
    /// Whether an autoscaler may add a node.
    autoscaler: Autoscaler,
}

impl super::step::Budgets for BudgetView<'_> {
    fn open(&self, t: &Tracked) -> bool {
        budget_open(self.budgets, t)
    }
    fn unsatisfiable(&self, t: &Tracked) -> Option<super::unsatisfiable::Why> {
        if self.cluster_shutdown {
            return Some(super::unsatisfiable::Why::ClusterShutdown);
        }
        plan::budgets_for(
            &t.pod.namespace,
            &t.labels,
            self.budgets.iter().map(AsRef::as_ref),
        )
        .into_iter()
        .find_map(|b| {
            super::unsatisfiable::judge(
                b,
                self.pending.iter().map(AsRef::as_ref),
                self.nodes,
                self.node,
                self.wanted
                    .get(&t.pod.uid)
                    .copied()
                    .unwrap_or(Wanted::Unknown),
                self.autoscaler,
            )
        })
    }
    fn of(&self, t: &Tracked) -> Vec<String> {
        plan::budgets_for(
            &t.pod.namespace,
            &t.labels,
            self.budgets.iter().map(AsRef::as_ref),
        )
        .into_iter()
        .map(plan::budget_key)
        .collect()
    }
}

/// How often a drain on its own node looks for stopped containers in the cgroup tree.
const NODE_POLL: Duration = Duration::from_millis(200);

/// How long the drain's start waits for the budgets' list once the pods are listed.
const BUDGET_LIST_GRACE: Duration = Duration::from_millis(250);

/// How long a drain that ended waits for its surges' replicas to be given back.
const GIVE_BACK_LIMIT: Duration = Duration::from_secs(10);

/// How long the end Event and the last Draining condition write may take together: the
/// condition waits [`super::narrate`]'s one second, the Event as long beside it.
const ANNOUNCE_LIMIT: Duration = Duration::from_secs(2);

/// A drain's ending when nothing shorter is asked for ([`DrainOptions::ending`]): the give-back
/// and the announcement, each at its own limit.
pub const ENDING: Duration = GIVE_BACK_LIMIT.saturating_add(ANNOUNCE_LIMIT);

/// How `ending` is shared: (surge give-back, announcement). The announcement gets its limit
/// first, or half of a shorter ending; the give-back what is left, up to its own limit.
fn ending_split(ending: Duration) -> (Duration, Duration) {
    let announce = ANNOUNCE_LIMIT.min(ending / 2);
    (GIVE_BACK_LIMIT.min(ending - announce), announce)
}

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

/// Drains `node`: cordon, evict wave by wave, wait until every evictable pod is gone or the
/// deadline passes, then apply the deadline policy. Returns a report; errors only for problems
/// that make going on pointless (node missing, permission denied, pods never listed).
pub async fn drain(client: &Client, node: &str, opts: &DrainOptions) -> Result<DrainReport> {
    Drain::new(client, node, opts).run().await
}

/// Computes the plan a drain would follow, changing nothing.
pub async fn dry_run(client: &Client, node: &str, opts: &DrainOptions) -> Result<Plan> {
    dry_run_with_pods(client, node, opts)
        .await
        .map(|(plan, _)| plan)
}

/// [`dry_run`], with the node's pods it planned for.
pub async fn dry_run_with_pods(
    client: &Client,
    node: &str,
    opts: &DrainOptions,
) -> Result<(Plan, Vec<Pod>)> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.get(node).await.map_err(api_err(node, "get"))?;
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(api_err(node, "list pods of"))?;
    let daemonsets: Api<DaemonSet> = Api::all(client.clone());
    let daemonsets = daemonsets
        .list_metadata(&kube::api::ListParams::default())
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 403 => Error::Forbidden {
                verb: "list daemonsets",
                pod: None,
            },
            e => api_err(node, "list the daemonsets for")(e),
        })?;
    let present: BTreeSet<(&str, &str)> = daemonsets
        .items
        .iter()
        .map(|d| {
            let m = &d.metadata;
            (
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default(),
            )
        })
        .collect();
    let exists = |ns: &str, name: &str| present.contains(&(ns, name));
    let plan = Plan::new(&list.items, &opts.plan, &exists);
    Ok((plan, list.items))
}

/// Whether the DaemonSet `namespace/name` is in the drain's watch cache.
fn daemonset_in(daemonsets: &Mirror<PartialObjectMeta<DaemonSet>>) -> impl Fn(&str, &str) -> bool {
    move |namespace, name| daemonsets.get(name, Some(namespace)).is_some()
}

/// The drain's three watches and what they have delivered: the node's pods (how the drain
/// learns a pod is really gone), the budgets (when to retry a blocked eviction) and the
/// DaemonSets' names (whether a DaemonSet pod's DaemonSet still exists).
struct Watches<'a> {
    pod_events: BoxStream<'a, watcher::Result<watcher::Event<Pod>>>,
    pdb_events: BoxStream<'a, watcher::Result<watcher::Event<PodDisruptionBudget>>>,
    ds_events: BoxStream<'a, watcher::Result<watcher::Event<PartialObjectMeta<DaemonSet>>>>,
    pods: Mirror<Pod>,
    budgets: Mirror<PodDisruptionBudget>,
    daemonsets: Mirror<PartialObjectMeta<DaemonSet>>,
    evidence: Evidence<'a>,
}

/// One step's view of the watches, from which [`BudgetView`] answers.
struct Snapshot {
    budgets: Vec<std::sync::Arc<PodDisruptionBudget>>,
    pending: Vec<std::sync::Arc<Pod>>,
    nodes: Option<Vec<std::sync::Arc<Node>>>,
    wanted: BTreeMap<String, Wanted>,
    autoscaler: Autoscaler,
}

impl Snapshot {
    fn view<'a>(&'a self, node: &'a str, cluster_shutdown: bool) -> BudgetView<'a> {
        BudgetView {
            budgets: &self.budgets,
            pending: &self.pending,
            nodes: self.nodes.as_deref(),
            node,
            cluster_shutdown,
            wanted: &self.wanted,
            autoscaler: self.autoscaler,
        }
    }
}

impl Watches<'_> {
    fn start(client: &Client, node: &str) -> Self {
        let pods_api: Api<Pod> = Api::all(client.clone());
        let pod_events = watcher(
            pods_api,
            watcher::Config::default().fields(&format!("spec.nodeName={node}")),
        )
        .default_backoff()
        .boxed();
        let pdb_api: Api<PodDisruptionBudget> = Api::all(client.clone());
        let pdb_events = watcher(pdb_api, watcher::Config::default())
            .default_backoff()
            .boxed();
        // Only names matter (does a pod's DaemonSet still exist?): metadata, not whole objects.
        let ds_api: Api<PartialObjectMeta<DaemonSet>> = Api::all(client.clone());
        let ds_events = watcher(ds_api, watcher::Config::default())
            .default_backoff()
            .boxed();
        Self {
            pod_events,
            pdb_events,
            ds_events,
            pods: Mirror::default(),
            budgets: Mirror::default(),
            daemonsets: Mirror::default(),
            evidence: Evidence::idle(),
        }
    }

    /// This step's view; the evidence watches start with the first pod a budget blocks, and the
    /// count of each blocked pod's owner is read while it is blocked.
    fn snapshot(&mut self, schedule: &Schedule, client: &Client) -> Snapshot {
        let blocked: Vec<_> = schedule
            .tracked()
            .filter(|t| matches!(t.state, PodState::Blocked { .. }))
            .filter_map(|t| self.pods.get(&t.pod.name, Some(&t.pod.namespace)))
            .collect();
        if !blocked.is_empty() {
            self.evidence.start(client);
        }
        let now = Instant::now();
        let mut wanted = BTreeMap::new();
        for pod in blocked {
            if let Some(owner) = Owner::of(&pod) {
                self.evidence.ask(owner, client, now);
            }
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            wanted.insert(uid, self.evidence.wanted(&pod));
        }
        Snapshot {
            wanted,
            autoscaler: self.evidence.autoscaler,
            budgets: self.budgets.state(),
            pending: self.evidence.pending.state(),
            nodes: self
                .evidence
                .nodes
                .synced()
                .then(|| self.evidence.nodes.state()),
        }
    }

    /// Waits for the pods' and DaemonSets' initial lists before anything is planned (a
    /// DaemonSet pod is skipped only if its DaemonSet exists). Budgets only time the retries of
    /// a refused eviction (the Eviction API itself enforces them), so evictions do not wait for
    /// their list; the main loop keeps applying their events.
    async fn initial_lists(
        &mut self,
        node: &str,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<()> {
        let mut last_error = String::from("no answer");
        while !self.pods.synced() || !self.daemonsets.synced() {
            tokio::select! {
                Some(ev) = self.pod_events.next() => match ev {
                    Ok(ev) => self.pods.apply(&ev),
                    Err(e) => {
                        check_watch_error(node, &e, "list and watch pods")?;
                        last_error = e.to_string();
                    }
                },
                Some(ev) = self.ds_events.next() => match ev {
                    Ok(ev) => self.daemonsets.apply(&ev),
                    Err(e) => {
                        check_watch_error(node, &e, "list and watch daemonsets")?;
                        last_error = e.to_string();
                    }
                },
                Some(ev) = self.pdb_events.next() => match ev {
                    Ok(ev) => self.budgets.apply(&ev),
                    Err(e) => check_watch_error(node, &e, "list and watch poddisruptionbudgets")?,
                },
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(Error::PodsNotListed {
                        node: node.to_string(),
                        waited: timeout,
                        last_error,
                    });
                }
            }
        }
        self.budgets_listed(node, deadline).await
    }

    /// Waits a moment for the budgets' list, if it is not in yet: with it, the first evictions
    /// already go one per budget (see `step::Budgets::of`). Never needed for safety (the API
    /// server enforces every budget), so never longer than [`BUDGET_LIST_GRACE`].
    async fn budgets_listed(&mut self, node: &str, deadline: Instant) -> Result<()> {
        let until = deadline.min(later(Instant::now(), BUDGET_LIST_GRACE));
        while !self.budgets.synced() {
            tokio::select! {
                Some(ev) = self.pdb_events.next() => match ev {
                    Ok(ev) => self.budgets.apply(&ev),
                    Err(e) => check_watch_error(node, &e, "list and watch poddisruptionbudgets")?,
                },
                _ = tokio::time::sleep_until(until) => break,
            }
        }
        Ok(())
    }
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
        let progress = self.opts.progress.clone();
        Some(Narrator::new(
            self.client,
            self.node,
            self.recorder.clone(),
            progress,
        ))
    }

    /// The drain's ending, within [`DrainOptions::ending`] whatever ended it: surge replicas
    /// given back, then the end said on the Node.
    async fn end(
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

    /// What the pod watch saw: a pod on the node (taken in), gone, or a relist.
    fn pod_event(
        &self,
        schedule: &mut Schedule,
        pods: &mut Mirror<Pod>,
        daemonsets: &Mirror<PartialObjectMeta<DaemonSet>>,
        ev: watcher::Result<watcher::Event<Pod>>,
        surges: &mut Surges,
    ) -> Result<()> {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => return check_watch_error(self.node, &e, "list and watch pods"),
        };
        pods.apply(&ev);
        match &ev {
            watcher::Event::Apply(p) => {
                self.track(schedule, p, daemonsets);
                if self.has_left(p) {
                    self.left(schedule, surges, p);
                }
            }
            watcher::Event::Delete(p) => self.left(schedule, surges, p),
            // A relist replaced the set: whatever it lacks (or has only as a stopped pod) is gone.
            watcher::Event::InitDone => {
                let present = self.on_node(pods);
                surges.end_all_but(self.client, &present);
                schedule.observe(&present);
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
        Ok(())
    }

    /// Whether `pod` has left the node though its object is still there: never when the drain
    /// waits for objects ([`Gone`]), else [`plan::left_node`], with the node's own word on its
    /// containers when the drain runs there.
    fn has_left(&self, pod: &Pod) -> bool {
        let Gone::Stopped(cgroups) = &self.opts.gone else {
            return false;
        };
        if pod.metadata.deletion_timestamp.is_none() {
            return false;
        }
        let running = cgroups.as_ref().and_then(|c| c.containers_running(pod));
        plan::left_node(pod, running)
    }

    /// The pods that have left though their objects are still there ([`Self::has_left`]).
    fn stopped(&self, pods: &Mirror<Pod>) -> Vec<PodRef> {
        pods.state()
            .iter()
            .filter(|p| self.has_left(p))
            .map(|p| PodRef::of(p))
            .collect()
    }

    /// The UIDs of the pods still on the node: listed, and not [`Self::has_left`].
    fn on_node(&self, pods: &Mirror<Pod>) -> BTreeSet<String> {
        pods.state()
            .iter()
            .filter(|p| !self.has_left(p))
            .filter_map(|p| p.metadata.uid.clone())
            .collect()
    }

    /// On the node it drains, a stopped container says so in the cgroup tree and nowhere the
    /// watch sees: looks at the pods being deleted every [`NODE_POLL`] until they have left.
    /// Answers when to look again, if there is anything to look for.
    fn poll_node(
        &self,
        schedule: &mut Schedule,
        pods: &Mirror<Pod>,
        surges: &mut Surges,
        now: Instant,
    ) -> Option<Instant> {
        let Gone::Stopped(Some(_)) = &self.opts.gone else {
            return None;
        };
        let mut waiting = false;
        for p in pods.state() {
            let uid = p.metadata.uid.as_deref().unwrap_or_default();
            if p.metadata.deletion_timestamp.is_none()
                || schedule.get(uid).is_none_or(Tracked::settled)
            {
                continue;
            }
            if self.has_left(&p) {
                self.left(schedule, surges, &p);
            } else {
                waiting = true;
            }
        }
        waiting.then(|| later(now, NODE_POLL))
    }

    /// `pod` left the node: its object deleted, or its containers stopped ([`plan::left_node`]).
    fn left(&self, schedule: &mut Schedule, surges: &mut Surges, pod: &Pod) {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        schedule.gone(uid);
        surges.end(self.client, uid);
    }

    /// Says how the drain ended: an Event on the Node (for a drain that had pods to move, or
    /// that ran out of time) and the Draining condition turned `False` with the same words.
    async fn announce_end(&self, report: &DrainReport, narrator: Option<Narrator>) {
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
        tokio::join!(event, condition);
    }

    /// Takes a pod into the drain; what its annotations get wrong is logged and said on the pod.
    fn track(
        &self,
        schedule: &mut Schedule,
        pod: &Pod,
        daemonsets: &Mirror<PartialObjectMeta<DaemonSet>>,
    ) {
        schedule.track(pod, &daemonset_in(daemonsets));
        for note in schedule.take_notes() {
            warn!(node = self.node, "{note}");
            crate::events::publish_detached(
                &self.recorder,
                pod.object_ref(&()),
                EventType::Warning,
                "BadDrainAnnotation",
                "Drain",
                note,
            );
        }
    }

    /// Starts what the schedule asked for; answers come back through `inflight`.
    fn perform(
        &self,
        command: Command,
        inflight: &mut FuturesUnordered<Request>,
        surges: &mut Surges,
    ) {
        match command {
            Command::Surge {
                pod,
                replica_set,
                budget_open,
            } => {
                let client = self.client.clone();
                inflight.push(
                    async move {
                        let started =
                            surging::start(&client, &pod, &replica_set, budget_open).await;
                        (pod, Reply::Surge(started))
                    }
                    .boxed(),
                );
            }
            Command::SurgeGaveUp(pod) => {
                warn!(pod = %pod, "surge: the replacement is not Ready after half the time left; evicting without it");
                surges.end(self.client, &pod.uid);
            }
            Command::Evict(pod) => {
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
                inflight.push(
                    async move {
                        let params = EvictParams {
                            delete_options: Some(DeleteParams {
                                preconditions: Some(uid_precondition(&pod)),
                                ..DeleteParams::default()
                            }),
                            post_options: PostParams::default(),
                        };
                        let result = api.evict(&pod.name, &params).await.map(|_| ());
                        (pod, Reply::Evict(result))
                    }
                    .boxed(),
                );
            }
            Command::Delete { pod, grace_seconds } => {
                error!(pod = %pod, grace_seconds, "deadline near: deleting pod past its disruption budget (drain.on_deadline = delete)");
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
                inflight.push(
                    async move {
                        let params = DeleteParams {
                            grace_period_seconds: Some(grace_seconds),
                            preconditions: Some(uid_precondition(&pod)),
                            ..DeleteParams::default()
                        };
                        let result = api.delete(&pod.name, &params).await.map(|_| ());
                        (pod, Reply::Delete(result))
                    }
                    .boxed(),
                );
            }
            Command::WaveEnded { wave, settled } => {
                if settled {
                    debug!(node = self.node, wave, "wave done; next wave");
                } else {
                    warn!(
                        node = self.node,
                        wave,
                        "wave used up its share of the deadline; starting the next one while its pods keep leaving"
                    );
                }
            }
            Command::WaitingPastDeadline => warn!(
                node = self.node,
                "deadline passed; on_deadline = wait, so the drain goes on"
            ),
            Command::Unsatisfiable { pod, why, acting } => self.unsatisfiable(&pod, &why, acting),
        }
    }

    /// A pod's budget cannot allow its eviction: said in the log, an Event on the pod and the
    /// metrics, with what the drain does about it (the drain's end Event on the Node names them
    /// all).
    fn unsatisfiable(&self, pod: &PodRef, why: &super::unsatisfiable::Why, acting: bool) {
        let now = if acting {
            format!(
                "drain.on_deadline = {} applies to it now",
                self.opts.on_deadline.as_str()
            )
        } else {
            "the drain waits for it until its deadline".to_string()
        };
        warn!(node = self.node, pod = %pod, "BudgetUnsatisfiable: {why}; {now}");
        if let Some(m) = &self.opts.metrics {
            m.unsatisfiable(acting);
        }
        crate::events::publish_detached(
            &self.recorder,
            pod.object_ref(),
            EventType::Warning,
            "BudgetUnsatisfiable",
            "Drain",
            format!("eviction from node {}: {why}; {now}", self.node),
        );
    }

    /// Reads the ready count of the surges waiting for their replacement, every
    /// [`surging::CHECK_EVERY`]; returns when to look next.
    fn check_surges(
        &self,
        now: Instant,
        surges: &mut Surges,
        inflight: &mut FuturesUnordered<Request>,
    ) -> Option<Instant> {
        let (due, next) = surges.due(now);
        for s in due {
            let client = self.client.clone();
            inflight.push(
                async move {
                    let ready = surging::ready(&client, &s).await;
                    (s.pod, Reply::SurgeReady(ready))
                }
                .boxed(),
            );
        }
        next
    }

    /// A surge's answer: started (wait for the replacement), or not (evict now); a read of its
    /// ready count.
    fn surge_answered(
        &self,
        schedule: &mut Schedule,
        surges: &mut Surges,
        pod: &PodRef,
        reply: Reply,
    ) {
        match reply {
            Reply::Surge(surging::Started::Surged(s)) => {
                surges.started(s);
            }
            Reply::Surge(surging::Started::Without(why)) => {
                info!(pod = %pod, "surge: none: {why}; evicting as usual");
                schedule.replaced(&pod.uid);
            }
            Reply::SurgeReady(Ok(ready)) => {
                surges.checked(&pod.uid, ready);
                if ready {
                    info!(pod = %pod, "surge: the replacement is Ready; evicting");
                    schedule.replaced(&pod.uid);
                }
            }
            Reply::SurgeReady(Err(e)) => {
                debug!(pod = %pod, error = %e, "surge: cannot read the Deployment; trying again");
                surges.checked(&pod.uid, false);
            }
            Reply::Evict(_) | Reply::Delete(_) => {}
        }
    }

    /// Feeds an answer back to the schedule, logging what it means.
    fn answered(
        &self,
        schedule: &mut Schedule,
        budgets: &Mirror<PodDisruptionBudget>,
        pod: &PodRef,
        reply: Reply,
        narrator: Option<&mut Narrator>,
        surges: &mut Surges,
    ) -> Result<()> {
        let result = match reply {
            Reply::Surge(_) | Reply::SurgeReady(_) => {
                self.surge_answered(schedule, surges, pod, reply);
                return Ok(());
            }
            Reply::Delete(result) => {
                let deleted = match result {
                    Ok(()) => Deleted::Accepted,
                    Err(kube::Error::Api(s)) if s.code == 404 => Deleted::Gone,
                    Err(e) => {
                        warn!(pod = %pod, error = %e, "cannot delete pod");
                        Deleted::Failed
                    }
                };
                schedule.delete_answered(&pod.uid, deleted);
                return Ok(());
            }
            Reply::Evict(result) => result,
        };
        let (code, cause, message) = status_of(&result);
        let labels = schedule
            .get(&pod.uid)
            .map(|t| t.labels.clone())
            .unwrap_or_default();
        let all = budgets.state();
        let matching: Vec<String> =
            plan::budgets_for(&pod.namespace, &labels, all.iter().map(AsRef::as_ref))
                .into_iter()
                .map(plan::budget_key)
                .collect();
        if let Some(m) = &self.opts.metrics {
            m.answered(code);
        }
        let answer = Answer {
            code,
            cause,
            matching_budgets: matching.len(),
            message,
        };
        log_answer(pod, &answer, &matching);
        if answer.outcome() == Outcome::BudgetExhausted
            && let Some(n) = narrator
        {
            let allowed = matching.first().and_then(|b| allowed_in(&all, b));
            n.blocked(pod, &matching, allowed);
        }
        let verdict = schedule.evict_answered(&pod.uid, &answer, matching, Instant::now());
        if schedule
            .get(&pod.uid)
            .is_some_and(|t| t.state == PodState::Gone)
        {
            // Gone already (a 404): its surge's replica goes back. An accepted eviction keeps
            // the replica out until the watch sees the pod deleted ([`Surges`]).
            surges.end(self.client, &pod.uid);
        }
        match verdict {
            Verdict::Continue => Ok(()),
            Verdict::Forbidden => Err(Error::Forbidden {
                verb: "create pods/eviction",
                pod: Some(pod.to_string()),
            }),
        }
    }
}

/// How the end of a drain is told: the Event's type and reason, and the words the Event and the
/// Draining condition share. The pods deleted past their budgets are counted apart from the
/// evicted ones and named, and make the Event a Warning: those budgets were not honoured. Each
/// refused pod is named with why.
fn ending(report: &DrainReport, timeout: Duration) -> (EventType, &'static str, String) {
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
fn unsatisfiable_note(report: &DrainReport) -> String {
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

/// An eviction's answer as the schedule reads it: status code, cause and message.
fn status_of(result: &std::result::Result<(), kube::Error>) -> (u16, Cause, String) {
    match result {
        Ok(()) => (201, Cause::None, String::new()),
        Err(kube::Error::Api(s)) => (
            s.code,
            Cause::of(
                s.details
                    .iter()
                    .flat_map(|d| d.causes.iter().map(|c| c.reason.as_str())),
            ),
            s.message.clone(),
        ),
        // No answer at all (connection refused, reset, timeout): as retryable as a 503.
        Err(e) => (503, Cause::None, e.to_string()),
    }
}

/// One log line per eviction answer, at the level it deserves.
fn log_answer(pod: &PodRef, answer: &Answer, matching: &[String]) {
    let code = answer.code;
    match answer.outcome() {
        Outcome::Evicted | Outcome::Gone => debug!(pod = %pod, code, "eviction accepted"),
        Outcome::NamespaceTerminating => info!(
            pod = %pod,
            "its namespace is being deleted, which deletes the pod; waiting for it to go"
        ),
        Outcome::BudgetExhausted => debug!(pod = %pod, "blocked by a disruption budget"),
        Outcome::Retry => {
            debug!(pod = %pod, code, message = %answer.message, "eviction failed; retrying");
        }
        Outcome::MultipleBudgets => {
            warn!(pod = %pod, budgets = ?matching, "more than one PodDisruptionBudget selects the pod; the Eviction API cannot evict it");
        }
        Outcome::Forbidden => warn!(pod = %pod, "missing permission: create pods/eviction"),
        Outcome::Denied => {
            warn!(pod = %pod, message = %answer.message, "eviction denied for this pod; refused, the drain goes on");
        }
        Outcome::Rejected => {
            warn!(pod = %pod, code, message = %answer.message, "eviction rejected");
        }
    }
}

fn uid_precondition(pod: &PodRef) -> kube::api::Preconditions {
    kube::api::Preconditions {
        uid: Some(pod.uid.clone()),
        resource_version: None,
    }
}

/// A 403 on a watch the drain needs is a missing permission: say which, and stop. Any other
/// error is logged; the watcher relists with back-off.
fn check_watch_error(node: &str, e: &watcher::Error, verb: &'static str) -> Result<()> {
    let forbidden = matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) | watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 403);
    if forbidden {
        warn!(node, "missing permission: {verb}");
        return Err(Error::Forbidden { verb, pod: None });
    }
    warn!(node, error = %e, "watch failed; the watcher relists");
    Ok(())
}

#[cfg(test)]
mod tests;
