//! `nodeward scaler`: node groups that grow for pending pods and shrink when idle, safely.
//!
//! The scaler keeps no state of its own. Every pass rebuilds the world from the provider's
//! machines (tagged `k8s-cluster`/`k8s-nodepool`), the Nodes (label `nodeward.io/node-group`,
//! annotation `nodeward.io/unneeded-since`) and the status ConfigMap (per-group back-off), so a
//! restart — or a new leader — resumes in-flight creations and countdowns instead of repeating
//! them. [`decide`] is pure (snapshot and `now` in, actions out) and carries the safety rules;
//! the executor only carries the actions out.

pub mod decide;
pub mod model;
pub mod provider;
pub mod resources;

pub use decide::{Action, decide};

/// The cordon reason a scale-down records; a node cordoned with it is a scale-down in progress.
pub const SCALE_DOWN_REASON: &str = "nodeward scaler: scale-down";
