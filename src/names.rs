//! The Kubernetes names nodeward owns: the labels, taints, annotations and condition it puts on
//! Nodes and pods, and the field manager of its writes. One place, so the agent, the drain, the
//! readiness controller, the scaler and the rendered user data always agree.

/// The label every node of a group carries; the scaler finds its nodes by it.
pub const NODE_GROUP_LABEL: &str = "nodeward.io/node-group";

/// The taint a new node registers with; it goes when the readiness gates pass.
pub const STARTUP_TAINT_KEY: &str = "node.nodeward.io/not-ready";

/// The Node condition the agent reports: `True` when every readiness gate passes.
pub const CONDITION_TYPE: &str = "nodeward.io/Ready";

/// The Node annotation recording that nodeward cordoned it, why and when.
pub const CORDONED_BY: &str = "nodeward.io/cordoned-by";

/// The pod annotation its owner sets to `never` to keep nodeward from ever evicting the pod.
pub const DRAIN_ANNOTATION: &str = "nodeward.io/drain";

/// Field manager recorded in managedFields for every write nodeward makes.
pub const FIELD_MANAGER: &str = "nodeward";
