//! Whether a budget that refused an eviction can ever allow it before the drain's deadline,
//! decided purely from the budget, the pods it waits for and the nodes.
//!
//! A budget allows `currentHealthy - desiredHealthy` disruptions. Of the `expectedPods` it
//! counts, the pods that cannot become healthy — a replacement the scheduler found no node for,
//! or one that no node could take at all because every other node is cordoned or not Ready — cap
//! what it can ever allow at `expectedPods - stuck - desiredHealthy`. When that is zero or less,
//! waiting is waiting for nothing: the drain applies its deadline policy to the pod now, not at
//! the deadline ([`crate::config::UnsatisfiableBudgets`]).
//!
//! A budget counts what exists: with an integer `minAvailable` the disruption controller expects
//! the pods there are, so between an evicted pod's deletion and its replacement's creation it
//! reads "allows nothing, ever". What the owner wants is the truth: where the pod's owner is
//! scalable ([`Wanted`], its `spec.replicas` through the scale subresource), the budget expects
//! at least that many, and replacements not created yet are slow, never hopeless. A pod no node
//! takes is stuck only where no autoscaler ([`Autoscaler`]) could add one.
//!
//! Every doubt reads as "it may open": a status older than the budget's spec, an owner whose
//! count is not known, an autoscaler that may be there, a pod the
//! scheduler has not judged while some node could still take it, a preemption under way. The
//! nodes are asked only whether they take pods at all (not cordoned, Ready), never whether they
//! fit this pod: a fit the drain got wrong would call a budget hopeless that is not, and missing
//! one only means waiting, as the drain did before it could tell.

use std::fmt;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

/// Why a budget cannot allow the disruption the drain waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// Its arithmetic: it requires as many healthy pods as it expects (`minAvailable` equal to
    /// the replicas, `maxUnavailable: 0`), so it allows a disruption only if someone scales up.
    NeverAllows {
        /// The budget, `namespace/name`.
        budget: String,
        /// Healthy pods it requires.
        desired_healthy: i32,
        /// Pods it counts.
        expected: i32,
    },
    /// Pods it counts cannot become healthy: no node will take them.
    Unschedulable {
        /// The budget, `namespace/name`.
        budget: String,
        /// The stuck pods (`namespace/name`) and why each is stuck.
        stuck: Vec<(String, Stuck)>,
        /// Missing pods it tolerates at most (`expectedPods - desiredHealthy`).
        tolerates: i32,
    },
    /// The cluster is being shut down as a whole (`nodeward cluster shutdown`): no node will
    /// take the pod back, so no budget is waited for.
    ClusterShutdown,
}

/// Why one pod the budget counts cannot become healthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stuck {
    /// The scheduler marked it `Unschedulable`, with this message.
    Unschedulable(String),
    /// No node but the draining one takes pods: every other is cordoned or not Ready.
    NoNode,
}

impl Why {
    /// Whether the verdict is read from state that passes through hopeless-looking moments (a
    /// budget's status, the scheduler's conditions) and must hold a while before it is acted
    /// on ([`super::step::VERDICT_SETTLE`]); the cluster's recorded shutdown need not.
    pub fn needs_settling(&self) -> bool {
        !matches!(self, Self::ClusterShutdown)
    }
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NeverAllows {
                budget,
                desired_healthy,
                expected,
            } => write!(
                f,
                "budget {budget} requires {desired_healthy} healthy pods of the {expected} it expects: it allows no disruption unless its workload scales up"
            ),
            Self::Unschedulable {
                budget,
                stuck,
                tolerates,
            } => {
                let (pod, why) = &stuck[0];
                write!(
                    f,
                    "budget {budget} tolerates {tolerates} missing pods and {} cannot be scheduled ({pod}: {why})",
                    stuck.len()
                )
            }
            Self::ClusterShutdown => {
                f.write_str("the cluster is shutting down: no node takes the pod back")
            }
        }
    }
}

impl fmt::Display for Stuck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unschedulable(message) => write!(f, "the scheduler says {message:?}"),
            Self::NoNode => f.write_str("no node but the draining one is schedulable and Ready"),
        }
    }
}

/// How many replicas the owner of the blocked pod wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// The pod has no owner whose count the drain reads (a bare pod, a kind with no scale
    /// subresource it knows): the budget is judged from the pods that exist.
    NoOwner,
    /// Its owner is scalable, but its count is not known (not read yet, or refused): a doubt.
    Unknown,
    /// Its owner's `spec.replicas`.
    Replicas(i32),
}

/// Whether an autoscaler could add a node for a pod no node takes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Autoscaler {
    /// None is there: nodeward's scaler holds no Lease, cluster-autoscaler keeps no status,
    /// Karpenter has no NodePool.
    Absent,
    /// One is there.
    Present,
    /// Not known (not asked yet, or the question was refused): a doubt.
    Unknown,
}

/// Whether `budget`, which refused an eviction, can never allow it. `pending` are Pending pods
/// of the budget's namespace (any: the ones it selects are picked here); `nodes` every Node the
/// drain knows, `None` while it knows none; `draining` the node being drained; `wanted` what the
/// blocked pod's owner wants; `autoscaler` whether a node may be added.
pub fn judge<'a>(
    budget: &PodDisruptionBudget,
    pending: impl IntoIterator<Item = &'a Pod>,
    nodes: Option<&[std::sync::Arc<Node>]>,
    draining: &str,
    wanted: Wanted,
    autoscaler: Autoscaler,
) -> Option<Why> {
    let status = budget.status.as_ref()?;
    let fresh = status.observed_generation.unwrap_or(0) >= budget.metadata.generation.unwrap_or(0);
    if !fresh || status.disruptions_allowed > 0 || status.expected_pods <= 0 {
        return None;
    }
    let expected = match wanted {
        Wanted::NoOwner => status.expected_pods,
        Wanted::Unknown => return None,
        Wanted::Replicas(n) => status.expected_pods.max(n),
    };
    let name = super::plan::budget_key(budget);
    let tolerates = expected - status.desired_healthy;
    if tolerates <= 0 {
        return Some(Why::NeverAllows {
            budget: name,
            desired_healthy: status.desired_healthy,
            expected,
        });
    }
    if autoscaler != Autoscaler::Absent {
        return None;
    }
    let no_node = nodes.is_some_and(|nodes| {
        !nodes
            .iter()
            .any(|n| n.metadata.name.as_deref() != Some(draining) && takes_pods(n))
    });
    let selector = budget.spec.as_ref()?.selector.as_ref()?;
    let stuck: Vec<(String, Stuck)> = pending
        .into_iter()
        .filter(|p| p.metadata.namespace == budget.metadata.namespace)
        .filter(|p| {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            super::plan::selector_matches(selector, &labels)
        })
        .filter_map(|p| Some((super::plan::PodRef::of(p).to_string(), stuck(p, no_node)?)))
        .collect();
    (i32::try_from(stuck.len()).unwrap_or(i32::MAX) >= tolerates).then_some(Why::Unschedulable {
        budget: name,
        stuck,
        tolerates,
    })
}

/// Why a pending pod cannot become healthy, if it cannot: not bound, not being deleted, no
/// preemption under way for it, and either marked `Unschedulable` by the scheduler or with no
/// node left to take it.
fn stuck(pod: &Pod, no_node: bool) -> Option<Stuck> {
    let status = pod.status.as_ref()?;
    let unbound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_none());
    let pending = status.phase.as_deref() == Some("Pending");
    if !unbound
        || !pending
        || pod.metadata.deletion_timestamp.is_some()
        || status.nominated_node_name.is_some()
    {
        return None;
    }
    let verdict = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .filter(|c| c.reason.as_deref() == Some("Unschedulable"));
    match verdict {
        Some(c) => Some(Stuck::Unschedulable(c.message.clone().unwrap_or_default())),
        None if no_node => Some(Stuck::NoNode),
        None => None,
    }
}

/// Whether a node takes new pods at all: not cordoned, and Ready.
fn takes_pods(node: &Node) -> bool {
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    !cordoned && ready
}

#[cfg(test)]
mod tests;
