//! What `decide` sees: plain views of Nodes, Pods and provider machines, converted from the API
//! objects once per pass. Keeping decide off the k8s-openapi types keeps it fast (30,000 pods)
//! and its tests short.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod, PodAffinityTerm, PodSpec, PodStatus, Toleration};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

pub use crate::drain::plan::{Fate, LeaveRules, PodFacts, SkipReason};
use crate::names::{NODE_GROUP_LABEL, is_startup_taint_key};
pub use crate::names::{SCALE_DOWN_DISABLED, SCALE_DOWN_FAILED, UNNEEDED_SINCE};
use crate::resources::Resources;
pub use crate::selector::{Requirement, SelectorOperator, SelectorView};
pub use crate::validate::TaintEffect;
/// A pod annotation that blocks (`"false"`) or allows (`"true"`) removing its node.
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
/// The node lifecycle controller's taint on a node whose Ready condition is not True (also put
/// on every new Node by the TaintNodesByCondition admission plugin).
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// A taint as decide uses it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaintView {
    /// Key.
    pub key: String,
    /// Value (empty when none).
    pub value: String,
    /// Effect; one this version does not know is read as `NoSchedule` ([`taint_effect`]).
    pub effect: TaintEffect,
}

/// A taint's effect as the API gives it. One this version does not know (the apiserver accepts
/// only the three today, so it comes from a newer Kubernetes) is read as `NoSchedule`, in every
/// respect: it keeps away pods that do not tolerate it, and a toleration naming `NoSchedule`
/// tolerates it. Conservative: the scaler would rather start a node than count on one a pod may
/// be refused.
pub fn taint_effect(effect: &str) -> TaintEffect {
    TaintEffect::parse(effect).unwrap_or(TaintEffect::NoSchedule)
}

/// A Node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<TaintView>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// nodeward cordoned it for a scale-down (its cordon record says so).
    pub scale_down_in_progress: bool,
    /// Ready condition is True.
    pub ready: bool,
    /// When the Ready condition last changed.
    pub ready_transition: Option<Timestamp>,
    /// Allocatable.
    pub allocatable: Resources,
    /// Creation time.
    pub created: Option<Timestamp>,
    /// [`UNNEEDED_SINCE`], parsed.
    pub unneeded_since: Option<Timestamp>,
    /// [`SCALE_DOWN_DISABLED`] is `"true"`.
    pub scale_down_disabled: bool,
    /// The agent gave up on it: its `nodeward.io/Ready` condition has reason `NotReadyInTime`.
    pub not_ready_in_time: bool,
    /// It has been ready before: its startup taint was put back ([`ever_ready`]). A node that
    /// reboots is judged by the NotReady rule and its guards, never as one that never came up.
    pub ever_ready: bool,
    /// [`SCALE_DOWN_FAILED`]: the fingerprint recorded when a scale-down drain last failed.
    pub scale_down_failed: Option<String>,
}

impl NodeView {
    /// The node group label's value.
    pub fn group(&self) -> Option<&str> {
        self.labels.get(NODE_GROUP_LABEL).map(String::as_str)
    }

    /// Still booting: registered with the startup taint the agent removes when ready, or given
    /// it back while it comes up again.
    pub fn booting(&self) -> bool {
        self.taints.iter().any(|t| is_startup_taint_key(&t.key))
    }

    /// Booting for the first time: the startup taint is the one it registered with. Only such a
    /// node can "never become ready"; one that was ready before and reboots is NotReady at worst.
    pub fn first_boot(&self) -> bool {
        self.booting() && !self.ever_ready
    }

    /// The taints pods will still meet once this node is up: without nodeward's startup taint
    /// ("coming") and, on a node that is Ready or booting, without the node lifecycle
    /// controller's `node.kubernetes.io/not-ready`, which it removes within seconds of Ready
    /// (seen on the real control plane: counting it made the scaler create a third machine for
    /// pods that fit the two just registered).
    pub fn lasting_taints(&self) -> Vec<TaintView> {
        let coming = self.ready || self.booting();
        self.taints
            .iter()
            .filter(|t| !is_startup_taint_key(&t.key))
            .filter(|t| !(coming && t.key == NOT_READY_TAINT))
            .cloned()
            .collect()
    }

    /// A control-plane or etcd host: it has one of `controller_labels` (the setting
    /// `scaler.controller_node_labels`).
    pub fn protected_role(&self, controller_labels: &[String]) -> bool {
        controller_labels
            .iter()
            .any(|l| self.labels.contains_key(l.as_str()))
    }
}

/// The namespaces whose pods a pod (anti-)affinity term counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Namespaces {
    /// Every namespace: a `namespaceSelector` is set. Exact for the empty selector `{}`; for any
    /// other a simplification, since the scaler does not list Namespaces and their labels.
    All,
    /// The term's `namespaces` (sorted), or the pod's own namespace when it names none.
    Only(Vec<String>),
}

impl Namespaces {
    /// Whether a pod of namespace `ns` is counted.
    pub fn contain(&self, ns: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(v) => v.iter().any(|n| n == ns),
        }
    }
}

/// A required (`requiredDuringSchedulingIgnoredDuringExecution`) pod affinity or anti-affinity
/// term.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodTermView {
    /// Whose pods it counts.
    pub namespaces: Namespaces,
    /// `labelSelector`; `None` selects no pod, as in core/v1.
    pub selector: Option<SelectorView>,
    /// `topologyKey`: the node label whose value is the domain.
    pub topology_key: String,
}

/// A topology spread constraint with `whenUnsatisfiable: DoNotSchedule` (the scaler ignores
/// `ScheduleAnyway`, which never keeps a pod pending).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpreadView {
    /// `maxSkew`.
    pub max_skew: u32,
    /// `topologyKey`.
    pub topology_key: String,
    /// `labelSelector`, over the pod's own namespace; `None` selects no pod.
    pub selector: Option<SelectorView>,
    /// `minDomains` (1 when unset): with fewer eligible domains the global minimum counts as 0.
    pub min_domains: u32,
    /// `nodeAffinityPolicy: Ignore`: every node with the key is a domain, not only those the
    /// pod's node selector and required node affinity accept (`Honor`, the default).
    pub ignore_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor`: a node whose lasting `NoSchedule`/`NoExecute` taints the pod
    /// does not tolerate is no domain (`Ignore`, the default, counts every node).
    pub honor_taints: bool,
}

/// A pod's hard inter-pod placement constraints. Absent (`None` in [`PodView`]) for the many pods
/// that have none, so they cost one pointer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodConstraints {
    /// Required pod affinity terms (all must hold).
    pub affinity: Vec<PodTermView>,
    /// Required pod anti-affinity terms (all must hold).
    pub anti_affinity: Vec<PodTermView>,
    /// `DoNotSchedule` topology spread constraints.
    pub spread: Vec<SpreadView>,
}

/// A PodDisruptionBudget, as scale-down needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetView {
    /// Namespace: a budget selects pods of its own namespace only.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.selector`; `None` (no selector) selects no pod, an empty one every pod of the
    /// namespace, as in policy/v1.
    pub selector: Option<SelectorView>,
    /// `status.disruptionsAllowed`; 0 while the disruption controller has not computed it.
    pub disruptions_allowed: i32,
}

/// Converts a PodDisruptionBudget.
pub fn budget_view(b: &PodDisruptionBudget) -> BudgetView {
    BudgetView {
        namespace: b.metadata.namespace.clone().unwrap_or_default(),
        name: b.metadata.name.clone().unwrap_or_default(),
        selector: b
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .map(SelectorView::from_selector),
        disruptions_allowed: b.status.as_ref().map_or(0, |s| s.disruptions_allowed),
    }
}

/// How a toleration compares its value with a taint's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TolerationOperator {
    /// Any value (and, with an empty key, any key).
    Exists,
    /// The same value; what the API means when the operator is missing.
    Equal,
}

/// A toleration. One with an operator or an effect this version does not know is none
/// ([`pod_view`] leaves it out): it tolerates nothing, as the scheduler's `ToleratesTaint` has
/// it for an unknown operator, and it cannot be matched against our reading of unknown taint
/// effects ([`taint_effect`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TolerationView {
    /// Key; empty with `Exists` tolerates everything.
    pub key: String,
    /// `Equal` (when missing) or `Exists`.
    pub operator: TolerationOperator,
    /// Value for `Equal`.
    pub value: String,
    /// Effect; `None` (empty in the API) matches every effect.
    pub effect: Option<TaintEffect>,
}

impl TolerationView {
    /// Whether it tolerates the taint: effect, then key and value, as the scheduler's
    /// `ToleratesTaint` (an empty key tolerates only with `Exists`, the only operator the
    /// apiserver accepts with one).
    #[inline]
    pub fn tolerates(&self, t: &TaintView) -> bool {
        self.effect.is_none_or(|e| e == t.effect)
            && match self.operator {
                TolerationOperator::Exists => self.key.is_empty() || self.key == t.key,
                TolerationOperator::Equal => {
                    !self.key.is_empty() && self.key == t.key && self.value == t.value
                }
            }
    }
}

/// A Pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (seeds the random expander).
    pub uid: String,
    /// Labels (what budgets and pod affinity select).
    pub labels: BTreeMap<String, String>,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// Effective requests (containers summed, init containers' max, overhead), pods = 1.
    pub requests: Resources,
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// Required node affinity terms (ORed; requirements in a term ANDed). Empty: none.
    pub affinity_terms: Vec<Vec<Requirement>>,
    /// Tolerations.
    pub tolerations: Vec<TolerationView>,
    /// Required pod affinity and anti-affinity, `DoNotSchedule` topology spread; `None`: none.
    pub constraints: Option<Box<PodConstraints>>,
    /// Pending with PodScheduled=False reason Unschedulable.
    pub unschedulable: bool,
    /// What happens to it when its node goes: the drain's own verdict
    /// ([`crate::drain::plan::fate`]) under the scale-down drain's rules.
    pub fate: Fate,
    /// [`SAFE_TO_EVICT`]: `Some(true)`, `Some(false)` or absent.
    pub safe_to_evict: Option<bool>,
    /// Has a hostPath volume (cluster-autoscaler's "local storage" besides emptyDir, which the
    /// drain itself judges).
    pub host_path: bool,
}

impl PodView {
    /// `namespace/name`. Built without the formatting machinery: a pass builds one per pod it
    /// names in an action (10,000 at the bench's larger size).
    pub fn key(&self) -> String {
        let mut key = String::with_capacity(self.namespace.len() + 1 + self.name.len());
        key.push_str(&self.namespace);
        key.push('/');
        key.push_str(&self.name);
        key
    }

    /// A live DaemonSet's pod or a mirror pod: runs on every node (the overhead a new node
    /// brings) and leaves with it.
    pub fn daemon(&self) -> bool {
        matches!(
            self.fate,
            Fate::Skip(SkipReason::DaemonSet | SkipReason::Mirror)
        )
    }

    /// The drain leaves it on the node, which goes with it: nothing to move.
    pub fn stays(&self) -> bool {
        matches!(self.fate, Fate::Skip(_))
    }

    /// Keeps its node from being scaled down: the drain would refuse it (so a scale-down would
    /// fail), or, for a pod the drain would move, cluster-autoscaler's annotation or a hostPath
    /// volume says to keep it (the scaler's own, stricter rule). A pod that stays with its node
    /// (DaemonSet, mirror, finished) never does: flannel's DaemonSet pod, with its hostPath
    /// volumes, is on every node of a flannel cluster, and on a real node it kept an empty node
    /// from ever being scaled down.
    pub fn blocks_scale_down(&self) -> bool {
        matches!(self.fate, Fate::Refuse(_))
            || (!self.stays()
                && (self.safe_to_evict == Some(false)
                    || (self.host_path && self.safe_to_evict != Some(true))))
    }
}

/// How the scaler judges what leaves with a node: its scale-down drain's rules, and which
/// DaemonSets exist (as the drain's watch would say).
#[derive(Debug, Clone, Copy, Default)]
pub struct LeaveContext<'a> {
    /// The scale-down drain's overrides.
    pub rules: LeaveRules,
    /// The `apps/v1` DaemonSets that exist by namespace and name; `None`: take every one to.
    pub daemonsets: Option<&'a std::collections::HashSet<(String, String)>>,
}

impl LeaveContext<'_> {
    fn daemonset_exists(&self, namespace: &str, name: &str) -> bool {
        self.daemonsets
            .is_none_or(|d| d.contains(&(namespace.to_string(), name.to_string())))
    }
}

/// A machine at the provider, tagged with this cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineView {
    /// Provider id.
    pub id: String,
    /// Hostname, which is the Node's name.
    pub hostname: String,
    /// `k8s-nodepool` tag.
    pub group: String,
    /// Creation time (providers must tell it: it is what times out a machine that never
    /// registers).
    pub created: Timestamp,
}

/// One group's back-off, kept in the status ConfigMap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Backoff {
    /// Consecutive failed machines.
    pub failures: u32,
    /// When the last one failed.
    pub last_failure: Option<Timestamp>,
    /// No scale-up before this.
    pub until: Option<Timestamp>,
}

/// Everything one decision needs.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Every Node.
    pub nodes: Vec<NodeView>,
    /// Every pod that is not finished (bound or pending).
    pub pods: Vec<PodView>,
    /// The cluster's machines at the provider.
    pub machines: Vec<MachineView>,
    /// Back-off per group.
    pub backoff: BTreeMap<String, Backoff>,
    /// When a cluster-health guard last held, by guard: `""` the cluster's, else the group's
    /// name (the status ConfigMap's `guard_held`, [`crate::scaler::decide::remember_guards`]).
    pub guard_held: BTreeMap<String, jiff::Timestamp>,
    /// Every PodDisruptionBudget.
    pub budgets: Vec<BudgetView>,
    /// A whole-cluster shutdown is recorded (`nodeward cluster shutdown`): the scaler holds
    /// still until `nodeward cluster start` removes it.
    pub cluster_shutdown: Option<ClusterShutdownView>,
}

/// What the scaler knows of a recorded cluster shutdown, for its status and log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterShutdownView {
    /// Who asked.
    pub requested_by: String,
    /// RFC 3339 time it started.
    pub started_at: String,
    /// A node still holds the shutdown's cordon ([`crate::cluster::intent::is_live`]): obeyed.
    /// Otherwise stale (an interrupted shutdown whose cordons were lifted by hand): reported,
    /// not obeyed.
    pub live: bool,
}

/// FNV-1a's offset basis.
pub(super) const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;

/// FNV-1a: a stable hash (std's hasher is randomly seeded per process, and these values are
/// compared across processes and restarts).
pub(super) fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01B3);
    }
    h
}

fn ts(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Option<Timestamp> {
    Some(t.0)
}

/// Converts a Node. A node the agent gave up on says so in its own `nodeward.io/Ready` condition
/// (reason `NotReadyInTime`): written through `nodes/status`, which NodeRestriction confines to
/// the node's own Node. The agent's `NodeNotReadyInTime` Event says the same but is no trigger:
/// any node identity may create Events about any Node.
pub fn node_view(node: &Node) -> NodeView {
    let name = node.metadata.name.clone().unwrap_or_default();
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    let spec = node.spec.clone().unwrap_or_default();
    let status = node.status.clone().unwrap_or_default();
    let ready_cond = status
        .conditions
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    let allocatable = status
        .allocatable
        .as_ref()
        .or(status.capacity.as_ref())
        .map(|m| Resources::from_quantities(m.iter().map(|(k, v)| (k.as_str(), v.0.as_str()))))
        .unwrap_or_default();
    let scale_down_in_progress = crate::drain::cordon::nodeward_cordon(node)
        .is_some_and(|r| r.reason.starts_with(super::SCALE_DOWN_REASON));
    NodeView {
        not_ready_in_time: crate::readiness::reports_not_ready_in_time(node),
        ever_ready: ever_ready(node),
        name,
        labels: node.metadata.labels.clone().unwrap_or_default(),
        taints: spec
            .taints
            .unwrap_or_default()
            .into_iter()
            .map(|t| TaintView {
                key: t.key,
                value: t.value.unwrap_or_default(),
                effect: taint_effect(&t.effect),
            })
            .collect(),
        unschedulable: spec.unschedulable.unwrap_or(false),
        scale_down_in_progress,
        ready: ready_cond.is_some_and(|c| c.status == "True"),
        ready_transition: ready_cond.and_then(|c| c.last_transition_time.as_ref().and_then(ts)),
        allocatable,
        created: node.metadata.creation_timestamp.as_ref().and_then(ts),
        unneeded_since: annotations.get(UNNEEDED_SINCE).and_then(|s| s.parse().ok()),
        scale_down_disabled: annotations.get(SCALE_DOWN_DISABLED).map(String::as_str)
            == Some("true"),
        scale_down_failed: annotations.get(SCALE_DOWN_FAILED).cloned(),
    }
}

/// Whether `node`, booting, has been ready before: its startup taint carries a `timeAdded` only
/// when nodeward put it back after lifting it ([`crate::readiness::set_startup_taint`], the
/// controller's continuous mode), and nodeward lifts it only when the node reports ready;
/// kubelet's `--register-with-taints` never sets it. (Only read while the node is booting.)
pub fn ever_ready(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|t| is_startup_taint_key(&t.key) && t.time_added.is_some())
}

/// Converts a toleration; `None` for one that tolerates nothing ([`TolerationView`]).
fn toleration(t: &Toleration) -> Option<TolerationView> {
    let operator = match t.operator.as_deref() {
        None | Some("Equal") => TolerationOperator::Equal,
        Some("Exists") => TolerationOperator::Exists,
        Some(_) => return None,
    };
    let effect = match t.effect.as_deref() {
        None | Some("") => None,
        Some(e) => Some(TaintEffect::parse(e)?),
    };
    Some(TolerationView {
        key: t.key.clone().unwrap_or_default(),
        operator,
        value: t.value.clone().unwrap_or_default(),
        effect,
    })
}

/// `selector` narrowed to the pod's own values of `match_keys` (`key In [value]`) and, for pod
/// affinity, `mismatch_keys` (`key NotIn [value]`), as kube-apiserver merges them at creation
/// (1.33 for affinity, 1.34 for spread) and older schedulers at scheduling. A key the pod does
/// not have is ignored, as there; a requirement already in the selector is not added again.
fn with_label_keys(
    selector: Option<SelectorView>,
    labels: &BTreeMap<String, String>,
    match_keys: Option<&Vec<String>>,
    mismatch_keys: Option<&Vec<String>>,
) -> Option<SelectorView> {
    let mut selector = selector?;
    let matching = match_keys
        .into_iter()
        .flatten()
        .map(|k| (k, SelectorOperator::In));
    let mismatching = mismatch_keys
        .into_iter()
        .flatten()
        .map(|k| (k, SelectorOperator::NotIn));
    for (key, operator) in matching.chain(mismatching) {
        let Some(value) = labels.get(key) else {
            continue;
        };
        let r = Requirement {
            key: key.clone(),
            operator,
            values: vec![value.clone()],
            field: false,
        };
        if !selector.expressions.contains(&r) {
            selector.expressions.push(r);
        }
    }
    Some(selector)
}

fn pod_term(
    t: &PodAffinityTerm,
    own_namespace: &str,
    labels: &BTreeMap<String, String>,
) -> PodTermView {
    let namespaces = if t.namespace_selector.is_some() {
        Namespaces::All
    } else {
        let mut v = t.namespaces.clone().unwrap_or_default();
        if v.is_empty() {
            v.push(own_namespace.to_string());
        }
        v.sort();
        v.dedup();
        Namespaces::Only(v)
    };
    PodTermView {
        namespaces,
        selector: with_label_keys(
            t.label_selector.as_ref().map(SelectorView::from_selector),
            labels,
            t.match_label_keys.as_ref(),
            t.mismatch_label_keys.as_ref(),
        ),
        topology_key: t.topology_key.clone(),
    }
}

/// The pod's required inter-pod constraints; `None` when it has none.
fn constraints(
    spec: &PodSpec,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Option<Box<PodConstraints>> {
    let terms = |ts: Option<&Vec<PodAffinityTerm>>| -> Vec<PodTermView> {
        ts.into_iter()
            .flatten()
            .map(|t| pod_term(t, namespace, labels))
            .collect()
    };
    let affinity = spec.affinity.as_ref();
    let c = PodConstraints {
        affinity: terms(
            affinity
                .and_then(|a| a.pod_affinity.as_ref())
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
        ),
        anti_affinity: terms(
            affinity
                .and_then(|a| a.pod_anti_affinity.as_ref())
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
        ),
        spread: spec
            .topology_spread_constraints
            .iter()
            .flatten()
            .filter(|c| c.when_unsatisfiable == "DoNotSchedule")
            .map(|c| SpreadView {
                max_skew: u32::try_from(c.max_skew).unwrap_or(1).max(1),
                topology_key: c.topology_key.clone(),
                selector: with_label_keys(
                    c.label_selector.as_ref().map(SelectorView::from_selector),
                    labels,
                    c.match_label_keys.as_ref(),
                    None,
                ),
                min_domains: c
                    .min_domains
                    .and_then(|m| u32::try_from(m).ok())
                    .unwrap_or(1)
                    .max(1),
                ignore_node_affinity: c.node_affinity_policy.as_deref() == Some("Ignore"),
                honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
            })
            .collect(),
    };
    (c != PodConstraints::default()).then(|| Box::new(c))
}

/// What the pod asks of a node: its containers' requests summed, each dimension raised to an
/// init container's where that is larger, plus the pod's overhead, and one pod slot.
#[inline]
fn pod_requests(spec: &PodSpec) -> Resources {
    let mut requests = Resources::default();
    let container_requests = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .map(|m| Resources::from_quantities(m.iter().map(|(k, v)| (k.as_str(), v.0.as_str()))))
            .unwrap_or_default()
    };
    for c in &spec.containers {
        requests.add(&container_requests(c));
    }
    for c in spec.init_containers.iter().flatten() {
        requests.max(&container_requests(c));
    }
    if let Some(o) = &spec.overhead {
        requests.add(&Resources::from_quantities(
            o.iter().map(|(k, v)| (k.as_str(), v.0.as_str())),
        ));
    }
    requests.pods = 1;
    requests
}

/// The pod's required node affinity: one list of requirements per node selector term, its
/// expressions then its fields; a node must meet every requirement of some term.
#[inline]
fn required_node_affinity(spec: &PodSpec) -> Vec<Vec<Requirement>> {
    spec.affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|sel| {
            sel.node_selector_terms
                .iter()
                .map(|t| {
                    let mut reqs: Vec<Requirement> = t
                        .match_expressions
                        .iter()
                        .flatten()
                        .map(|r| Requirement::of_node_selector(r, false))
                        .collect();
                    reqs.extend(
                        t.match_fields
                            .iter()
                            .flatten()
                            .map(|r| Requirement::of_node_selector(r, true)),
                    );
                    reqs
                })
                .collect()
        })
        .unwrap_or_default()
}

/// [`is_unschedulable`] of a whole Pod: the pods a scale-up is for.
pub(crate) fn unschedulable(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .is_some_and(|spec| is_unschedulable(spec, pod.status.as_ref()))
}

/// Whether the scheduler found no node for the pod: it is not bound, and its `PodScheduled`
/// condition is `False` with reason `Unschedulable`.
#[inline]
fn is_unschedulable(spec: &PodSpec, status: Option<&PodStatus>) -> bool {
    spec.node_name.is_none()
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
}

/// Converts a Pod; `None` for a finished pod (Succeeded or Failed), which holds no resources.
pub fn pod_view(pod: &Pod, leave: &LeaveContext<'_>) -> Option<PodView> {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if phase == "Succeeded" || phase == "Failed" {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let requests = pod_requests(spec);
    let affinity_terms = required_node_affinity(spec);
    let unschedulable = is_unschedulable(spec, status);
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let fate = crate::drain::plan::fate(&PodFacts::of(pod), &namespace, leave.rules, &|ns, n| {
        leave.daemonset_exists(ns, n)
    });
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    Some(PodView {
        constraints: constraints(spec, &namespace, &labels),
        namespace,
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        labels,
        node: spec.node_name.clone(),
        requests,
        node_selector: spec.node_selector.clone().unwrap_or_default(),
        affinity_terms,
        tolerations: spec
            .tolerations
            .iter()
            .flatten()
            .filter_map(toleration)
            .collect(),
        unschedulable,
        fate,
        safe_to_evict: pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SAFE_TO_EVICT))
            .map(|v| v == "true"),
        host_path: spec.volumes.iter().flatten().any(|v| v.host_path.is_some()),
    })
}
