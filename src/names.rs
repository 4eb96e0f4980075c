//! The Kubernetes names nodeward owns: the labels, taints, annotations and condition it puts on
//! Nodes and pods, and the field manager of its writes. One place, so the agent, the drain, the
//! readiness controller, the scaler and the rendered user data always agree.

use crate::validate::TaintEffect;

/// The label every node of a group carries; the scaler finds its nodes by it.
pub const NODE_GROUP_LABEL: &str = "nodeward.io/node-group";

/// The taint a new node registers with; it goes when the readiness gates pass. Under
/// `readiness.k8s.io/`, the only prefix a node-readiness-controller `NodeReadinessRule` may own,
/// so that controller can lift it as well as nodeward's own.
pub const STARTUP_TAINT_KEY: &str = "readiness.k8s.io/nodeward";

/// The startup taint's effect: new pods stay away, running ones (DaemonSets) stay.
pub const STARTUP_TAINT_EFFECT: TaintEffect = TaintEffect::NoSchedule;

/// The startup taint's key up to nodeward 0.1. Nodes registered with it before an upgrade are
/// still recognised (the agent, the controller and the scaler treat it as the startup taint;
/// lifting the taint lifts both keys) until nodeward 0.3, which drops it.
pub const LEGACY_STARTUP_TAINT_KEY: &str = "node.nodeward.io/not-ready";

/// Whether a taint key is the startup taint's, current or legacy.
pub fn is_startup_taint_key(key: &str) -> bool {
    key == STARTUP_TAINT_KEY || key == LEGACY_STARTUP_TAINT_KEY
}

/// The Node condition the agent reports: `True` when every readiness gate passes.
pub const CONDITION_TYPE: &str = "nodeward.io/Ready";

/// The Node annotation recording that nodeward cordoned it, why and when.
pub const CORDONED_BY: &str = "nodeward.io/cordoned-by";

/// The pod annotation its owner sets to `never` to keep nodeward from ever evicting the pod.
pub const DRAIN_ANNOTATION: &str = "nodeward.io/drain";

/// The pod annotation capping how long a drain waits for the pod's budget (a duration such as
/// `90s`) before the drain's deadline policy applies to it.
pub const DRAIN_TIMEOUT_ANNOTATION: &str = "nodeward.io/drain-timeout";

/// The annotation holding the RFC 3339 time the scaler found a node unneeded.
pub const UNNEEDED_SINCE: &str = "nodeward.io/unneeded-since";

/// An operator's opt-out from scale-down, as in cluster-autoscaler.
pub const SCALE_DOWN_DISABLED: &str = "nodeward.io/scale-down-disabled";

/// The fingerprint (`scaler::decide::scale_down_fingerprint`) of a node's pods and budgets when
/// its scale-down drain last failed and the node was given back: the node is not picked again
/// until the fingerprint differs (a pod came or went, or a budget's `disruptionsAllowed` moved),
/// so a budget that blocks the drain does not make the scaler drain, time out and uncordon the
/// same node every unneeded-time.
pub const SCALE_DOWN_FAILED: &str = "nodeward.io/scale-down-failed";

/// The ConfigMap recording a whole-cluster shutdown (`nodeward cluster shutdown`): while it is
/// live (a node still holds the shutdown's cordon, [`crate::cluster::intent::is_live`]), agents
/// drain without waiting on budgets and the scaler neither scales nor repairs.
pub const CLUSTER_SHUTDOWN_CONFIGMAP: &str = "nodeward-cluster-shutdown";

/// Where [`CLUSTER_SHUTDOWN_CONFIGMAP`] lives: the namespace every cluster has, whose objects
/// only administrators write.
pub const CLUSTER_SHUTDOWN_NAMESPACE: &str = "kube-system";

/// Field manager recorded in managedFields for every write nodeward makes.
pub const FIELD_MANAGER: &str = "nodeward";

/// Labels of hosts the scaler must never remove, whatever group label they carry: the default
/// of `scaler.controller_node_labels`.
pub const PROTECTED_ROLE_LABELS: &[&str] = &[
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
    "node-role.kubernetes.io/etcd",
];

/// The Node annotation the agent writes before it lets a power-off go on: a JSON
/// [`crate::out_of_service::PowerOff`] record (boot ID, time, the pods left behind and those
/// whose objects stay Terminating). Only at a power-off, never at a reboot or an unknown kind.
pub const POWER_OFF: &str = "nodeward.io/power-off";

/// Kubernetes' out-of-service taint (KEP-2268): on a NotReady node, the pod GC force-deletes its
/// terminating pods and the attach-detach controller detaches their volumes at once.
pub const OUT_OF_SERVICE_TAINT_KEY: &str = "node.kubernetes.io/out-of-service";

/// The out-of-service taint's value nodeward (and the KEP's examples) use.
pub const OUT_OF_SERVICE_TAINT_VALUE: &str = "nodeshutdown";

/// The out-of-service taint's effect: pods that do not tolerate it are evicted.
pub const OUT_OF_SERVICE_TAINT_EFFECT: TaintEffect = TaintEffect::NoExecute;
