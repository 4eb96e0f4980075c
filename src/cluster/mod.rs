//! Whole-cluster shutdown: `nodeward cluster shutdown` and `nodeward cluster start`.
//!
//! A drain is graceful because the rest of the cluster takes the pods back. When every node goes
//! down at once (a planned power-down, a lab closing for the night) nothing takes them back:
//! drains started at every node's shutdown evict pods onto nodes about to go themselves, every
//! budget blocks, every drain waits out its deadline, and storage may stop before the apps that
//! write to it. So the whole cluster is stopped from one place instead, in an order of its own:
//!
//! 1. the intent is recorded in the cluster (ConfigMap
//!    [`crate::names::CLUSTER_SHUTDOWN_CONFIGMAP`] in kube-system), which the agents and the
//!    scaler read: an agent's shutdown drain waits on no budget, the scaler holds still;
//! 2. every node is cordoned at once, as nodeward's cordon, and the ConfigMap lists the nodes it
//!    cordoned (an operator's own cordon stays theirs);
//! 3. the workloads stop in waves ([`plan::plan`], pure): lower priority bands first; within a
//!    band stateless pods, then StatefulSets' pods, then pods with volumes that outlive their node
//!    (claims, CSI, network volumes); within those, lower priority first. A pod stops by graceful
//!    deletion with its own grace period, not by eviction: no budget can open while every node is
//!    cordoned, and waiting on them is what hangs drains at a power-down. The controllers
//!    recreate what is deleted; with every node cordoned the replacements stay Pending, and
//!    schedule again at `cluster start`. Each wave waits, on a watch, for its pods to be gone.
//!
//! `nodeward cluster start` lifts nodeward's cordons (the listed ones, never the operator's) and
//! removes the intent. Nothing the operator set (replica counts, their cordons, budgets) changes.

pub mod intent;
pub mod plan;
pub mod run;

pub use run::{
    ShutdownOptions, ShutdownReport, StartReport, intent_exists, read_intent, shutdown, start,
};

/// Why nodeward cordoned a node for a cluster shutdown, recorded in the cordon's annotation: how
/// `cluster start` finds the nodes it cordoned even if the ConfigMap's list missed one (the
/// command stopped between a cordon and the list's write).
pub const CORDON_REASON: &str = "nodeward cluster shutdown";
