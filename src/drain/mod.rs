//! Draining a node: cordon it, then give every pod back to the cluster through the Eviction API.
//!
//! Evicting rather than deleting is the point: an eviction asks the API server to honour the
//! pod's PodDisruptionBudget, so a drain never takes down more replicas than their owners allow.
//! `plan.rs` decides (which pods, which wave, what an answer means), `step.rs` decides what to
//! send when (waves, deadline, retries), `explain.rs` says what the drain waits on (the Node's
//! `nodeward.io/Draining` condition) and `cordon.rs` decides who owns a cordon — all pure;
//! `exec.rs` acts, driven by watches so it reacts in milliseconds and
//! reports done only when the pods are really gone (`cgroups.rs`: what the node itself says about
//! a pod's containers, for a drain on the node it drains).

pub mod access;
pub mod cgroups;
pub mod cordon;
mod evidence;
pub mod exec;
pub mod explain;
pub mod metrics;
pub mod narrate;
pub mod plan;
pub mod step;
pub mod surge;
mod surging;
pub mod unsatisfiable;

pub use cordon::Lifter;
pub use evidence::{CLUSTER_AUTOSCALER_STATUS, SCALER_LEASE};
pub use exec::{
    CordonOutcome, DrainOptions, DrainOutcome, DrainReport, Gone, UncordonOutcome, cordon,
    cordon_for_shutdown, cordon_taking_over, drain, dry_run, uncordon,
};
