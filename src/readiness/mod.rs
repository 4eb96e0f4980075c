//! Readiness as a real cluster allows it: the node reports, a central controller untaints.
//!
//! kube-apiserver's NodeRestriction admission plugin refuses a node's own identity
//! (`system:node:NAME`, the kubelet's credentials the agent uses) any change to its Node's
//! `spec.taints` ("node … is not allowed to modify taints"), but lets it write its Node's status.
//! So, as Kubernetes' node-readiness-controller (KEP-5233) does it, the agent publishes its gates
//! as one Node condition, [`CONDITION_TYPE`], through `nodes/status`; and a controller with its
//! own identity ([`controller`]) removes the startup taint when that condition is `True`, puts it
//! back when it turns `False` (in [`Mode::Continuous`]), and never touches another taint.
//!
//! Decisions here are pure functions of a Node: [`desired_condition`] from the gates' verdict,
//! [`condition_is_current`], [`decide`]. The writes are [`write_condition`] and
//! [`set_startup_taint`] (the agent's) and [`reconcile_startup_taint`] (the controller's), both
//! the one guarded read-modify-write of the startup taint.

pub mod controller;
pub mod metrics;

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use serde_json::json;
use tracing::info;

use crate::gate::Verdict;
pub use crate::names::{CONDITION_TYPE, STARTUP_TAINT_EFFECT, STARTUP_TAINT_KEY};
use crate::node_write::{self, NodeWrite, status_word};

/// `reason` of a `True` condition.
pub const REASON_PASSED: &str = "GatesPassed";
/// `reason` of a `False` condition.
pub const REASON_FAILING: &str = "GatesFailing";
/// `reason` of a `False` condition past the agent's boot deadline: the machine should be
/// replaced (the scaler's NeverReady repair).
pub const REASON_NOT_READY_IN_TIME: &str = "NotReadyInTime";
/// The API keeps condition messages short in practice; ours names the failing gates.
const MESSAGE_MAX: usize = 1024;

/// What the agent wants its condition to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `True` or `False`.
    pub status: bool,
    /// [`REASON_PASSED`], [`REASON_FAILING`] or [`REASON_NOT_READY_IN_TIME`].
    pub reason: &'static str,
    /// Which gates fail, or that all pass.
    pub message: String,
}

/// The condition that describes `verdict`.
pub fn desired_condition(verdict: &Verdict) -> Condition {
    if verdict.all_pass {
        Condition {
            status: true,
            reason: REASON_PASSED,
            message: format!("all {} readiness gates pass", verdict.gates.len()),
        }
    } else {
        let mut message = format!("failing: {}", verdict.failing().join("; "));
        crate::events::truncate_at_char(&mut message, MESSAGE_MAX);
        Condition {
            status: false,
            reason: if verdict.overdue {
                REASON_NOT_READY_IN_TIME
            } else {
                REASON_FAILING
            },
            message,
        }
    }
}

/// Whether the node's agent reports it did not become ready by its boot deadline.
pub fn reports_not_ready_in_time(node: &Node) -> bool {
    condition(node).is_some_and(|c| {
        c.status == "False" && c.reason.as_deref() == Some(REASON_NOT_READY_IN_TIME)
    })
}

/// The Node's [`CONDITION_TYPE`] condition, if it reports one.
pub fn condition(node: &Node) -> Option<&NodeCondition> {
    node_write::condition(node, CONDITION_TYPE)
}

/// Whether `node` already reports `want` (status, reason and message alike).
pub fn condition_is_current(node: &Node, want: &Condition) -> bool {
    condition(node).is_some_and(|c| {
        c.status == status_word(want.status)
            && c.reason.as_deref() == Some(want.reason)
            && c.message.as_deref() == Some(want.message.as_str())
    })
}

/// Writes `want` as the Node's [`CONDITION_TYPE`] condition through `nodes/status` (a strategic
/// merge keyed by `type`, so kubelet's own conditions are untouched). `lastTransitionTime` moves
/// only when the status flips. Returns the Node as written.
#[tracing::instrument(skip(client, current, want), err)]
pub async fn write_condition(
    client: &kube::Client,
    node: &str,
    current: Option<&Node>,
    want: &Condition,
) -> Result<Node, Error> {
    let status = status_word(want.status);
    let transition = current
        .and_then(condition)
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.as_ref())
        .map_or_else(|| jiff::Timestamp::now().to_string(), |t| t.0.to_string());
    let patch = node_write::ConditionPatch {
        type_: CONDITION_TYPE,
        status: want.status,
        reason: want.reason,
        message: &want.message,
        last_transition: &transition,
    };
    let n = node_write::write_condition(client, node, &patch)
        .await
        .map_err(|source| Error::Api {
            node: node.into(),
            action: "write the readiness condition of",
            source,
        })?;
    info!(node, condition = CONDITION_TYPE, status, reason = want.reason, message = %want.message, "readiness condition written");
    Ok(n)
}

/// How the controller treats a node whose condition turns `False` after it was untainted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Only remove the startup taint, once; a later failure is reported, not acted on.
    Bootstrap,
    /// Remove it when ready, put it back when the condition turns `False`.
    Continuous,
}

/// A change to the startup taint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintChange {
    /// Remove it: the node reports ready.
    Remove,
    /// Put it back: the node reports not ready (continuous mode).
    Add,
}

/// What the controller does about `node`: nothing for a node without nodeward's condition (no
/// agent: not ours to judge), for one being deleted, or for an `Unknown` condition.
pub fn decide(node: &Node, mode: Mode) -> Option<TaintChange> {
    if node.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let c = condition(node)?;
    let tainted = has_startup_taint(node);
    match (c.status.as_str(), tainted, mode) {
        ("True", true, _) => Some(TaintChange::Remove),
        ("False", false, Mode::Continuous) => Some(TaintChange::Add),
        _ => None,
    }
}

/// Whether the Node carries the startup taint.
pub fn has_startup_taint(n: &Node) -> bool {
    taints(n).iter().any(is_startup_taint)
}

fn taints(n: &Node) -> Vec<Taint> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// The startup taint under its current key or the legacy one ([`crate::names::LEGACY_STARTUP_TAINT_KEY`]).
fn is_startup_taint(t: &Taint) -> bool {
    crate::names::is_startup_taint_key(&t.key) && t.effect == STARTUP_TAINT_EFFECT.as_str()
}

/// Errors writing the Node: [`crate::node_write::NodeError`], shared with every Node writer.
pub use crate::node_write::NodeError as Error;

/// Adds (`add`) or removes the startup taint, starting from `current` when the caller has a
/// fresh copy (else it reads the Node); returns the Node as it now is and whether this call
/// wrote it (`false`: nothing to change). A merge patch replaces the taint list whole, so it
/// carries the resourceVersion it was computed from: a concurrent change makes it 409, and it
/// is recomputed from a fresh read — another writer's taint is never dropped.
#[tracing::instrument(skip(client, current), err)]
pub async fn set_startup_taint(
    client: &kube::Client,
    node: &str,
    add: bool,
    current: Option<Node>,
) -> Result<(Node, bool), Error> {
    let (n, change) = write_startup_taint(client, node, current, |_| {
        Some(if add {
            TaintChange::Add
        } else {
            TaintChange::Remove
        })
    })
    .await?;
    Ok((n, change.is_some()))
}

/// The controller's write: decides from the Node's condition ([`decide`]) at every read, the
/// first from `current` (the controller's cache, perhaps stale) and, after a conflict, from a
/// fresh one. So a replica acting on an old event never undoes what a newer condition says, and
/// of several replicas acting on one change exactly one writes: the others' patches conflict
/// and their fresh read finds nothing to do. Returns the change this call wrote, if any.
pub async fn reconcile_startup_taint(
    client: &kube::Client,
    node: &str,
    mode: Mode,
    current: Option<Node>,
) -> Result<Option<TaintChange>, Error> {
    let (_, change) = write_startup_taint(client, node, current, |n| decide(n, mode)).await?;
    Ok(change)
}

/// The one guarded read-modify-write of the startup taint: `want` says, from each read of the
/// Node, which change it needs (`None`: none); returns the Node as written or read and the
/// change written.
async fn write_startup_taint(
    client: &kube::Client,
    node: &str,
    current: Option<Node>,
    want: impl Fn(&Node) -> Option<TaintChange>,
) -> Result<(Node, Option<TaintChange>), Error> {
    let action = "patch taints of";
    let written = node_write::write_guarded(client, node, action, current, |n| {
        let mut list = taints(n);
        let present = list.iter().any(is_startup_taint);
        let change = match want(n) {
            Some(TaintChange::Add) if !present => TaintChange::Add,
            Some(TaintChange::Remove) if present => TaintChange::Remove,
            _ => return Ok::<_, std::convert::Infallible>(NodeWrite::Done(None)),
        };
        if change == TaintChange::Add {
            // Put back, never registered with: `timeAdded` says so to the scaler, which must
            // judge a rebooting node as NotReady, never as one that never came up
            // (`scaler::model::ever_ready`). kubelet's `--register-with-taints` leaves it unset.
            list.push(Taint {
                key: STARTUP_TAINT_KEY.into(),
                effect: STARTUP_TAINT_EFFECT.to_string(),
                time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::now(),
                )),
                ..Taint::default()
            });
        } else {
            list.retain(|t| !is_startup_taint(t));
        }
        let taints = if list.is_empty() {
            serde_json::Value::Null
        } else {
            json!(list)
        };
        Ok(NodeWrite::Patch(
            json!({"spec": {"taints": taints}}),
            Some(change),
        ))
    })
    .await;
    match written {
        Ok((n, change)) => {
            if let Some(change) = change {
                info!(
                    node,
                    taint = STARTUP_TAINT_KEY,
                    added = change == TaintChange::Add,
                    "startup taint changed"
                );
            }
            Ok((n, change))
        }
        Err(e) => Err(e.for_node(node)),
    }
}

#[cfg(test)]
mod tests;
