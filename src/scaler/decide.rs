//! The pure decision: snapshot and `now` in, actions out. No clock, no I/O, no randomness that
//! does not come from the input — the same snapshot always gives the same actions, which is what
//! makes the safety rules (never above max, never below min, never a control-plane host, never a
//! pod stranded against its budget) testable as tables.
//!
//! Scale-up packs unschedulable pods first-fit-decreasing: onto free room on schedulable nodes,
//! onto nodes still booting (the startup taint means "coming", not "unschedulable"), onto machines
//! created but not yet registered, and only then onto new nodes of a group, chosen by the
//! expander. Packing honours the hard inter-pod constraints — required pod affinity and
//! anti-affinity, both the pending pod's and running pods' against it, and `DoNotSchedule`
//! topology spread — counted per topology domain by [`topology`]; a new node is its own hostname
//! domain. Soft ones (preferred terms, `ScheduleAnyway`) are ignored: they never keep a pod
//! pending. First fit uses per-class segment trees ([`first_fit`]) rather than a scan of every
//! bin per pod. Scale-down simulates moving every pod of an under-used node onto the other nodes,
//! under the same hard inter-pod constraints, each pod counted at its new node and no longer at
//! the one it leaves; the node is removed only after it stayed unneeded for
//! `scale_down_unneeded_time`, a time kept in the node's annotation so a restarted scaler picks
//! up where the last one stopped.
//!
//! [`decide`] runs five phases in order — `repair`, `scale_up`, `min_and_standby`, `cap_boots`,
//! `scale_down` — each a function of the indexed snapshot (`Context`: the pods, most of a
//! snapshot, read once in their order into per-node lists and sums) and the plan the earlier
//! phases left (`Plan`: group sizes, back-off, machines planned, where pods can go), tested on
//! its own as well as through `decide`. Back-off is decided here only: [`back_off`] is the rule, for
//! repaired machines and for the refused creates the executor reports back.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use jiff::{SignedDuration, Timestamp};

use super::model::{
    Backoff, BudgetView, FNV_OFFSET, MachineView, NodeView, PodView, Requirement, Snapshot,
    TaintEffect, TaintView, TolerationView, fnv,
};
use crate::config::{Expander, GroupSettings, ScalerSettings};
use crate::names::NODE_GROUP_LABEL;
use crate::resources::Resources;
use first_fit::{FirstFit, Probe};
use label_sets::LabelSets;
use node_index::NodeIndex;
use topology::{BinSite, HOSTNAME, Place, Pods, Topology};

/// A map with a fast hash, for keys made of the pods' own strings that one pass looks up
/// thousands of times. Never iterated: its order, seeded per process, never shows in a decision.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Why a group grows; in the status, `pending-pods`, `below-min` or `standby`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScaleUpReason {
    /// Pending pods fit nowhere else.
    PendingPods,
    /// The group is below its `min`.
    BelowMin,
    /// Fewer empty nodes than `standby`.
    Standby,
}

/// Why a machine is deleted without a drain; in the status, `never-registered`, `never-ready`
/// or `unready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RepairReason {
    /// No Node registered within `max_provision_time`.
    NeverRegistered,
    /// The Node still had the startup taint after `max_provision_time`, or the agent reported
    /// `NodeNotReadyInTime`.
    NeverReady,
    /// The Node was NotReady for `unready_delete_time`.
    Unready,
}

impl fmt::Display for RepairReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NeverRegistered => "no Node registered within max_provision_time",
            Self::NeverReady => "the Node did not become ready within max_provision_time",
            Self::Unready => "the Node was NotReady for unready_delete_time",
        })
    }
}

/// Why a Node whose machine is gone is deleted; in the status, `scaled-down` or `unready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeleteNodeReason {
    /// A scale-down deleted the machine and stopped before the Node.
    ScaledDown,
    /// The machine was deleted outside the scaler and the Node has been NotReady for
    /// `unready_delete_time`.
    Unready,
}

impl fmt::Display for DeleteNodeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ScaledDown => "a scale-down deleted its machine",
            Self::Unready => {
                "it has no machine at the provider and was NotReady for unready_delete_time"
            }
        })
    }
}

/// One thing the executor does.
///
/// The status ConfigMap's `last_actions` shows each as an object: `action`, the variant's name
/// in kebab-case (`scale-up`, `no-scale-up`, `mark-unneeded`, `clear-unneeded`, `scale-down`,
/// `repair`, `back-off`, `delete-node`, `cancel-scale-down`, `clear-back-off`,
/// `guard-holds`, `cluster-shutdown`), beside the variant's fields under their own names; times in RFC 3339, reasons
/// in kebab-case, an absent `node` or `group` as `null`. For example
/// `{"action": "clear-unneeded", "node": "n1"}`. Readers rely on this shape: add fields, never
/// rename or remove them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Action {
    /// Create `count` machines in `group`.
    ScaleUp {
        /// The group.
        group: String,
        /// How many machines.
        count: u32,
        /// Why.
        reason: ScaleUpReason,
        /// `namespace/name` of the pending pods the new machines are for.
        pods: Vec<String>,
    },
    /// A pending pod for which no machine is created.
    NoScaleUp {
        /// `namespace/name`.
        pod: String,
        /// Why, for the `NotTriggerScaleUp` event.
        reason: String,
    },
    /// Record that a node became unneeded now.
    MarkUnneeded {
        /// The node.
        node: String,
        /// The time to record.
        since: Timestamp,
    },
    /// The node is needed again; remove its unneeded-since record.
    ClearUnneeded {
        /// The node.
        node: String,
    },
    /// Cordon and drain the node, then delete its machine and the Node.
    ScaleDown {
        /// The group.
        group: String,
        /// The node.
        node: String,
        /// Its machine.
        machine: String,
        /// Whether it has no pods to move (daemon pods aside).
        empty: bool,
    },
    /// Delete a broken machine (and its Node, if any) without draining.
    Repair {
        /// The group.
        group: String,
        /// Its machine.
        machine: String,
        /// The Node, if one registered.
        node: Option<String>,
        /// Why.
        reason: RepairReason,
    },
    /// Record failed machines: the group backs off until `until`.
    BackOff {
        /// The group.
        group: String,
        /// New consecutive failure count.
        failures: u32,
        /// No scale-up before this.
        until: Timestamp,
    },
    /// Delete a Node whose machine is gone.
    DeleteNode {
        /// The group.
        group: String,
        /// The node.
        node: String,
        /// Why.
        reason: DeleteNodeReason,
    },
    /// A scale-down under way on a node opted out since (`nodeward.io/scale-down-disabled`):
    /// lift nodeward's cordon and forget it instead of finishing it.
    CancelScaleDown {
        /// The group.
        group: String,
        /// The node.
        node: String,
    },
    /// A machine of the group became ready after its last failure: forget the back-off.
    ClearBackOff {
        /// The group.
        group: String,
    },
    /// The cluster-health guard holds: too many nodes are NotReady at once to take them for
    /// broken machines, so none is replaced, no Node deleted and nothing scaled down.
    GuardHolds {
        /// The node group whose guard holds; `None`: the whole cluster's.
        group: Option<String>,
        /// NotReady nodes (booting ones aside).
        unready: u32,
        /// All nodes (of the group).
        total: u32,
        /// Repairs and Node deletions held back this pass.
        held: u32,
    },
    /// A whole-cluster shutdown is recorded: every node is cordoned and going down on purpose,
    /// its pods' replacements Pending on purpose. Nothing is scaled up, scaled down, repaired or
    /// deleted until `nodeward cluster start` removes the record.
    ClusterShutdown {
        /// Who asked for it.
        requested_by: String,
        /// When it started (RFC 3339).
        started_at: String,
    },
    /// A cluster shutdown is recorded, but no node holds its cordon any more: stale, reported,
    /// and not obeyed (the scaler acts as usual).
    StaleClusterShutdown {
        /// Who asked for it.
        requested_by: String,
        /// When it started (RFC 3339).
        started_at: String,
    },
}

/// The cluster-health guard's verdict on a snapshot: `Some((unready, total))` when more than
/// `ok_unready_count` nodes *and* more than `max_unready_percent` % of all nodes are NotReady
/// (nodes booting for the first time are neither; rebooting ones are NotReady), as cluster-autoscaler judges a cluster unhealthy.
pub fn unhealthy(snap: &Snapshot, s: &ScalerSettings) -> Option<(u32, u32)> {
    let total = u32::try_from(snap.nodes.len()).unwrap_or(u32::MAX);
    let unready = snap
        .nodes
        .iter()
        .filter(|n| !n.ready && !n.first_boot())
        .count();
    let unready = u32::try_from(unready).unwrap_or(u32::MAX);
    let over_share = u64::from(unready) * 100 > u64::from(s.max_unready_percent) * u64::from(total);
    (unready > s.ok_unready_count && over_share).then_some((unready, total))
}

/// One group's membership, as the provider and the Nodes tell it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupState {
    /// Members: machines, plus labelled Nodes without a machine.
    pub size: u32,
    /// Ready nodes without the startup taint.
    pub ready: u32,
    /// Nodes with the startup taint.
    pub booting: u32,
    /// Machines without a Node yet.
    pub registering: u32,
    /// Back-off in force at `now`.
    pub backing_off: bool,
}

/// Per-group membership at `now`.
pub fn group_states(
    snap: &Snapshot,
    now: Timestamp,
    s: &ScalerSettings,
) -> BTreeMap<String, GroupState> {
    let by_name: HashMap<&str, &NodeView> =
        snap.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut out: BTreeMap<String, GroupState> = s
        .groups
        .iter()
        .map(|g| {
            let backing_off = snap
                .backoff
                .get(&g.name)
                .and_then(|b| b.until)
                .is_some_and(|u| u > now);
            (
                g.name.clone(),
                GroupState {
                    backing_off,
                    ..GroupState::default()
                },
            )
        })
        .collect();
    let mut machine_hosts = std::collections::HashSet::new();
    for m in &snap.machines {
        machine_hosts.insert(m.hostname.as_str());
        let Some(st) = out.get_mut(&m.group) else {
            continue;
        };
        st.size += 1;
        match by_name.get(m.hostname.as_str()) {
            None => st.registering += 1,
            Some(n) if n.booting() => st.booting += 1,
            Some(n) if n.ready => st.ready += 1,
            Some(_) => {}
        }
    }
    for n in &snap.nodes {
        if machine_hosts.contains(n.name.as_str()) {
            continue;
        }
        let Some(st) = n.group().and_then(|g| out.get_mut(g)) else {
            continue;
        };
        st.size += 1;
        if n.booting() {
            st.booting += 1;
        } else if n.ready {
            st.ready += 1;
        }
    }
    out
}

/// Whether the pod's node selector and required node affinity accept a node with these labels
/// (and this name, for `matchFields`).
pub fn selects(pod: &PodView, labels: &BTreeMap<String, String>, name: &str) -> bool {
    pod.node_selector
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
        && (pod.affinity_terms.is_empty()
            || pod
                .affinity_terms
                .iter()
                .any(|term| term.iter().all(|r| r.selects(labels, name))))
}

/// The budgets of a snapshot by namespace, so finding a pod's budgets does not scan them all.
struct BudgetIndex<'a> {
    budgets: &'a [BudgetView],
    by_namespace: HashMap<&'a str, Vec<usize>>,
}

impl<'a> BudgetIndex<'a> {
    fn new(budgets: &'a [BudgetView]) -> Self {
        let mut by_namespace: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, b) in budgets.iter().enumerate() {
            by_namespace
                .entry(b.namespace.as_str())
                .or_default()
                .push(i);
        }
        Self {
            budgets,
            by_namespace,
        }
    }

    /// Indices of the budgets that select the pod.
    fn of(&self, p: &PodView) -> Vec<usize> {
        self.by_namespace
            .get(p.namespace.as_str())
            .into_iter()
            .flatten()
            .copied()
            .filter(|&i| {
                self.budgets[i]
                    .selector
                    .as_ref()
                    .is_some_and(|sel| sel.selects(&p.labels))
            })
            .collect()
    }
}

/// What [`SCALE_DOWN_FAILED`](super::model::SCALE_DOWN_FAILED) records when a scale-down drain
/// fails: a hash of the node's evictable pods (by UID) and of the budgets that select them (name
/// and `disruptionsAllowed`). The same pods under the same budgets give the same string, in
/// whatever order they are listed; a pod that comes or goes, or a budget that opens or closes,
/// gives another.
pub fn scale_down_fingerprint(pods: &[&PodView], budgets: &[BudgetView]) -> String {
    let index = BudgetIndex::new(budgets);
    let mut parts: Vec<String> = Vec::new();
    for p in pods.iter().filter(|p| !p.stays()) {
        parts.push(format!("pod {}", p.uid));
        for i in index.of(p) {
            let b = &budgets[i];
            parts.push(format!(
                "pdb {}/{} {}",
                b.namespace, b.name, b.disruptions_allowed
            ));
        }
    }
    parts.sort();
    parts.dedup();
    let h = parts
        .iter()
        .fold(FNV_OFFSET, |h, part| fnv(b"\n", fnv(part.as_bytes(), h)));
    format!("{h:016x}")
}

/// Whether the pod tolerates every NoSchedule/NoExecute taint (and every taint whose effect
/// this version does not know, read as NoSchedule).
pub fn tolerates(pod: &PodView, taints: &[TaintView]) -> bool {
    taints
        .iter()
        .filter(|t| t.effect != TaintEffect::PreferNoSchedule)
        .all(|t| pod.tolerations.iter().any(|tol| tol.tolerates(t)))
}

/// Where a pod could go during packing.
#[derive(Debug, Clone)]
struct Bin<'a> {
    name: &'a str,
    labels: &'a BTreeMap<String, String>,
    taints: &'a [TaintView],
    free: Resources,
    /// A pending pod was placed here in this decision.
    claimed: bool,
}

/// Whether a pod's node selector or required node affinity looks at a node's own name, so bins
/// that share labels but for their hostname may still differ for it.
fn hostname_sensitive(p: &PodView) -> bool {
    p.node_selector.contains_key(HOSTNAME)
        || p.affinity_terms
            .iter()
            .flatten()
            .any(|r| r.field || r.key == HOSTNAME)
}

/// Bins with the same labels (hostname aside) and lasting taints form a class: a pod's node
/// selector, node affinity and tolerations are checked once per class, and each class keeps a
/// [`FirstFit`] tree over its bins' free room, so packing 10,000 pending pods is not a scan of
/// every bin per pod.
struct BinClasses<'a> {
    classes: Vec<BinClass<'a>>,
}

struct BinClass<'a> {
    /// The labels of the class, without the hostname.
    labels: BTreeMap<String, String>,
    taints: &'a [TaintView],
    /// Bin indices, ascending.
    bins: Vec<usize>,
    fit: FirstFit,
}

impl<'b> BinClasses<'b> {
    fn new(bins: &[Bin<'b>], startup_free: &'b [Vec<TaintView>]) -> Self {
        type ClassKey<'k> = (Vec<(&'k str, &'k str)>, &'k [TaintView]);
        let mut index: HashMap<ClassKey<'_>, usize> = HashMap::new();
        let mut classes: Vec<BinClass<'b>> = Vec::new();
        for (i, b) in bins.iter().enumerate() {
            let taints: &'b [TaintView] = startup_free.get(i).map_or(b.taints, Vec::as_slice);
            let labels: Vec<(&str, &str)> = b
                .labels
                .iter()
                .filter(|(k, _)| k.as_str() != HOSTNAME)
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let ci = *index
                .entry((labels, taints))
                .or_insert_with_key(|(labels, _)| {
                    classes.push(BinClass {
                        labels: labels
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                        taints,
                        bins: Vec::new(),
                        fit: FirstFit::default(),
                    });
                    classes.len() - 1
                });
            classes[ci].bins.push(i);
            classes[ci].fit.push(&b.free);
        }
        Self { classes }
    }
}

/// What one new node of a group looks like.
#[derive(Debug, Clone)]
struct Template {
    labels: BTreeMap<String, String>,
    taints: Vec<TaintView>,
    allocatable: Resources,
    /// Allocatable less the DaemonSet pods every node runs.
    free: Resources,
}

fn template(g: &GroupSettings, cx: &Context<'_>) -> Template {
    let snap = cx.snap;
    // Every nodeward node runs Linux (the cloud-init templates are Linux's). The architecture is
    // the plan's, which only the group knows: it comes from the group's `labels`
    // (`kubernetes.io/arch`) or from a node of the group, never from a guess.
    let mut labels = BTreeMap::from([("kubernetes.io/os".to_string(), "linux".to_string())]);
    if !g.plan.is_empty() {
        labels.insert("node.kubernetes.io/instance-type".into(), g.plan.clone());
    }
    if !g.region.is_empty() {
        labels.insert("topology.kubernetes.io/region".into(), g.region.clone());
    }
    let sample = snap
        .nodes
        .iter()
        .filter(|n| n.group() == Some(g.name.as_str()) && n.ready && !n.booting())
        .min_by(|a, b| a.name.cmp(&b.name));
    let mut allocatable = g.capacity.resources.clone();
    let mut overhead = Resources::default();
    if let Some(n) = sample {
        for (k, v) in &n.labels {
            if k != "kubernetes.io/hostname" {
                labels.insert(k.clone(), v.clone());
            }
        }
        allocatable = n.allocatable.clone();
        for p in cx.pods_on(&n.name) {
            if p.daemon() {
                overhead.add(&p.requests);
            }
        }
    }
    labels.extend(g.labels.clone());
    labels.insert(NODE_GROUP_LABEL.into(), g.name.clone());
    let mut free = allocatable.clone();
    free.sub(&overhead);
    Template {
        labels,
        taints: g
            .taints
            .iter()
            .map(|t| TaintView {
                key: t.key.clone(),
                value: t.value.clone().unwrap_or_default(),
                effect: t.effect,
            })
            .collect(),
        allocatable,
        free,
    }
}

fn elapsed(now: Timestamp, since: Timestamp) -> std::time::Duration {
    let d: SignedDuration = now.duration_since(since);
    d.try_into().unwrap_or_default()
}

/// The back-off after `failures` consecutive failed machines: `backoff_initial` doubled per
/// failure, capped at `backoff_max`.
pub fn backoff_for(failures: u32, s: &ScalerSettings) -> std::time::Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(31));
    s.backoff_initial.saturating_mul(factor).min(s.backoff_max)
}

/// The group's back-off after `failed` more failed machines at `now`, on top of `prev`; `None`
/// when nothing failed. The one place the rule lives: for machines [`decide`] repairs and for
/// creates the provider refused for good, which the executor reports back through it.
pub fn back_off(
    group: &str,
    prev: Option<Backoff>,
    failed: u32,
    now: Timestamp,
    s: &ScalerSettings,
) -> Option<Action> {
    if failed == 0 {
        return None;
    }
    let failures = prev.unwrap_or_default().failures.saturating_add(failed);
    let until = now
        .checked_add(
            SignedDuration::try_from(backoff_for(failures, s)).unwrap_or(SignedDuration::MAX),
        )
        .unwrap_or(Timestamp::MAX);
    Some(Action::BackOff {
        group: group.to_string(),
        failures,
        until,
    })
}

/// A small deterministic generator (splitmix64) for the random expander, seeded from the input.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// One group's simulated scale-up.
struct Expansion {
    group: usize,
    nodes: u32,
    /// Indices into the unplaced pods.
    placed: Vec<usize>,
    /// For each placed pod, which of the new nodes it went to.
    on_node: Vec<usize>,
    waste: f64,
}

impl Expansion {
    /// Its pods are placed: on its new nodes in the topology (hostnames taken in order), and no
    /// longer `remaining`.
    fn place(&self, topo: &mut Topology, remaining: &mut [bool], unplaced_q: &[usize]) {
        let first_host = topo.peek_host();
        for _ in 0..self.nodes {
            topo.take_host();
        }
        for (&pi, &j) in self.placed.iter().zip(&self.on_node) {
            remaining[pi] = false;
            let host = first_host + j as u32;
            topo.place(
                unplaced_q[pi],
                Place::New {
                    group: self.group,
                    host,
                },
            );
        }
    }
}

fn share(used: i64, total: i64) -> f64 {
    if total <= 0 {
        0.0
    } else {
        (used as f64 / total as f64).clamp(0.0, 1.0)
    }
}

/// What the pods bound to a node take, summed in one pass over the pods for every phase.
#[derive(Debug, Default)]
struct NodeUsage {
    /// The requests of all its pods.
    requested: Resources,
    /// The requests of the pods a drain would move (all but DaemonSet and mirror pods).
    movable: Resources,
    /// It holds a pod a drain would move.
    has_movable: bool,
    /// One of those keeps it from scale-down: `safe-to-evict: false`, no controller, or local
    /// storage without `safe-to-evict: true`.
    pinned: bool,
}

/// The snapshot indexed once, for every phase.
struct Context<'a> {
    snap: &'a Snapshot,
    now: Timestamp,
    s: &'a ScalerSettings,
    groups: HashMap<&'a str, usize>,
    node_by_name: HashMap<&'a str, &'a NodeView>,
    machine_by_host: HashMap<&'a str, &'a MachineView>,
    /// Each node's index in `snap.nodes`, by name.
    node_index: NodeIndex<'a>,
    /// Per pod of `snap.pods`, the index of the node it is bound to (`None`: unbound, or its
    /// node is not listed).
    node_of: Vec<Option<usize>>,
    /// The bound pods (by index in `snap.pods`) grouped by node index, in snapshot order within
    /// a node: node `i`'s are `bound[pods_from[i]..pods_from[i + 1]]`. One list sized once, not a
    /// list per node grown pod by pod.
    bound: Vec<usize>,
    pods_from: Vec<usize>,
    /// Per node index, what they take.
    usage: Vec<NodeUsage>,
    /// The pods the scheduler found no node for, by index in `snap.pods`, in snapshot order.
    unschedulable: Vec<usize>,
    /// The pods that carry pod anti-affinity, by index in `snap.pods`, in snapshot order.
    carrying: Vec<usize>,
    /// The pods' distinct namespaces and label sets, for the topology counters.
    label_sets: LabelSets<'a>,
    /// Per pod of `snap.pods`, its set in `label_sets`; empty when no pod has inter-pod
    /// constraints (then no counter counts any pod).
    label_set: Vec<usize>,
    /// What one new node of each group looks like.
    templates: Vec<Template>,
}

/// What [`Context`] learns in its one pass over the pods, in their order (the pods are most of
/// the snapshot).
struct PodPass<'a> {
    node_of: Vec<Option<usize>>,
    /// Per node index, how many pods are bound to it.
    per_node: Vec<usize>,
    usage: Vec<NodeUsage>,
    unschedulable: Vec<usize>,
    carrying: Vec<usize>,
    label_sets: LabelSets<'a>,
    label_set: Vec<usize>,
}

impl<'a> PodPass<'a> {
    #[inline]
    fn over(snap: &'a Snapshot, node_index: &NodeIndex<'_>) -> Self {
        let mut pass = Self {
            node_of: Vec::with_capacity(snap.pods.len()),
            per_node: vec![0; snap.nodes.len()],
            usage: std::iter::repeat_with(NodeUsage::default)
                .take(snap.nodes.len())
                .collect(),
            unschedulable: Vec::new(),
            carrying: Vec::new(),
            label_sets: LabelSets::default(),
            label_set: Vec::new(),
        };
        // Label sets are taken from the first pod with constraints on, the pods before it
        // caught up then: a snapshot without any pays nothing for them.
        let mut interning = false;
        for (i, p) in snap.pods.iter().enumerate() {
            if p.unschedulable {
                pass.unschedulable.push(i);
            }
            if p.constraints
                .as_ref()
                .is_some_and(|c| !c.anti_affinity.is_empty())
            {
                pass.carrying.push(i);
            }
            let ni = p.node.as_deref().and_then(|n| node_index.get(n));
            pass.node_of.push(ni);
            if !interning && p.constraints.is_some() {
                interning = true;
                pass.label_set.reserve(snap.pods.len());
                for q in &snap.pods[..i] {
                    let id = pass.label_sets.id((q.namespace.as_str(), &q.labels));
                    pass.label_set.push(id);
                }
            }
            if interning {
                let id = pass.label_sets.id((p.namespace.as_str(), &p.labels));
                pass.label_set.push(id);
            }
            let Some(ni) = ni else { continue };
            pass.per_node[ni] += 1;
            let u = &mut pass.usage[ni];
            u.requested.add(&p.requests);
            if !p.stays() {
                u.movable.add(&p.requests);
                u.has_movable = true;
            }
            u.pinned |= p.blocks_scale_down();
        }
        pass
    }
}

/// The bound pods grouped by node, from `node_of` alone (the pods themselves are not read
/// again): `bound`, and where each node's start in it (`pods_from`, one more than the nodes).
fn by_node(node_of: &[Option<usize>], per_node: Vec<usize>) -> (Vec<usize>, Vec<usize>) {
    let mut pods_from = Vec::with_capacity(per_node.len() + 1);
    let mut sum = 0;
    pods_from.push(0);
    for n in per_node {
        sum += n;
        pods_from.push(sum);
    }
    let mut next = pods_from.clone();
    let mut bound: Vec<usize> = vec![0; sum];
    for (i, ni) in node_of.iter().enumerate() {
        if let Some(&ni) = ni.as_ref() {
            bound[next[ni]] = i;
            next[ni] += 1;
        }
    }
    (bound, pods_from)
}

impl<'a> Context<'a> {
    fn new(snap: &'a Snapshot, now: Timestamp, s: &'a ScalerSettings) -> Self {
        let node_index = NodeIndex::new(snap.nodes.iter().map(|n| n.name.as_str()));
        let pods = PodPass::over(snap, &node_index);
        let (bound, pods_from) = by_node(&pods.node_of, pods.per_node);
        let mut cx = Self {
            snap,
            now,
            s,
            groups: s
                .groups
                .iter()
                .enumerate()
                .map(|(i, g)| (g.name.as_str(), i))
                .collect(),
            node_by_name: snap.nodes.iter().map(|n| (n.name.as_str(), n)).collect(),
            machine_by_host: snap
                .machines
                .iter()
                .map(|m| (m.hostname.as_str(), m))
                .collect(),
            node_index,
            node_of: pods.node_of,
            bound,
            pods_from,
            usage: pods.usage,
            unschedulable: pods.unschedulable,
            carrying: pods.carrying,
            label_sets: pods.label_sets,
            label_set: pods.label_set,
            templates: Vec::new(),
        };
        cx.templates = s.groups.iter().map(|g| template(g, &cx)).collect();
        cx
    }

    /// The pods bound to the node named `n`, by index in `snap.pods`.
    fn pod_ids_on(&self, n: &str) -> &[usize] {
        self.node_index
            .get(n)
            .and_then(|i| self.bound.get(self.pods_from[i]..self.pods_from[i + 1]))
            .unwrap_or_default()
    }

    /// The pods bound to the node named `n`.
    fn pods_on(&self, n: &str) -> impl Iterator<Item = &'a PodView> + '_ {
        let snap: &'a Snapshot = self.snap;
        self.pod_ids_on(n)
            .iter()
            .filter_map(move |&i| snap.pods.get(i))
    }

    /// The snapshot's pods as the topology index reads them.
    fn topology_pods(&self) -> Pods<'_> {
        Pods {
            all: &self.snap.pods,
            node_of: &self.node_of,
            carrying: &self.carrying,
            sets: self.label_sets.sets(),
            set_of: &self.label_set,
        }
    }

    /// What the pods bound to the node named `n` take.
    fn usage(&self, n: &str) -> Option<&NodeUsage> {
        self.node_index.get(n).map(|i| &self.usage[i])
    }

    /// Holds no pods but DaemonSet and mirror pods.
    fn empty(&self, n: &NodeView) -> bool {
        self.usage(&n.name).is_none_or(|u| !u.has_movable)
    }
}

/// The decision so far, handed from phase to phase.
struct Plan<'a> {
    actions: Vec<Action>,
    /// Members per group, less what the earlier phases remove.
    size: Vec<u32>,
    /// Groups that may not grow in this pass.
    backing_off: Vec<bool>,
    /// Hostnames of the machines being repaired.
    repaired: HashSet<&'a str>,
    /// New machines planned per group.
    planned: Vec<u32>,
    /// Where pending pods can go: usable nodes, then machines still registering.
    bins: Vec<Bin<'a>>,
    /// Each bin's group.
    bin_group: Vec<Option<usize>>,
    /// Each node bin's lasting taints (what pods meet once it is up).
    startup_free: Vec<Vec<TaintView>>,
    /// Each bin's node, by index in `snap.nodes` (`None`: a machine still registering).
    bin_node: Vec<Option<usize>>,
}

impl Plan<'_> {
    fn new(cx: &Context<'_>) -> Self {
        let states = group_states(cx.snap, cx.now, cx.s);
        let state = |g: &GroupSettings| states.get(&g.name).cloned().unwrap_or_default();
        Self {
            actions: Vec::new(),
            size: cx.s.groups.iter().map(|g| state(g).size).collect(),
            backing_off: cx.s.groups.iter().map(|g| state(g).backing_off).collect(),
            repaired: HashSet::new(),
            planned: vec![0; cx.s.groups.len()],
            bins: Vec::new(),
            bin_group: Vec::new(),
            startup_free: Vec::new(),
            bin_node: Vec::new(),
        }
    }
}

/// How many more machines group `gi` may get.
fn headroom(s: &ScalerSettings, gi: usize, planned: &[u32], size: &[u32]) -> u32 {
    s.groups[gi].max.saturating_sub(size[gi] + planned[gi])
}

/// Decides what to do, in five phases that each read the snapshot and the plan so far. See the
/// module documentation. While a live cluster shutdown is recorded, nothing: the cordoned nodes
/// and Pending pods are the operator's plan, not a fault to repair or a demand to scale for. A
/// stale one (no node holds its cordon) is reported and not obeyed.
pub fn decide(snap: &Snapshot, now: Timestamp, s: &ScalerSettings) -> Vec<Action> {
    let mut stale = None;
    if let Some(cs) = &snap.cluster_shutdown {
        let (requested_by, started_at) = (cs.requested_by.clone(), cs.started_at.clone());
        if cs.live {
            return vec![Action::ClusterShutdown {
                requested_by,
                started_at,
            }];
        }
        stale = Some(Action::StaleClusterShutdown {
            requested_by,
            started_at,
        });
    }
    let cx = Context::new(snap, now, s);
    let mut plan = Plan::new(&cx);
    plan.actions.extend(stale);
    let guard = unhealthy(snap, s);
    repair(&cx, &mut plan, guard);
    scale_up(&cx, &mut plan);
    min_and_standby(&cx, &mut plan);
    cap_boots(&cx, &mut plan);
    if s.scale_down_enabled && guard.is_none() {
        scale_down::scale_down(&cx, &mut plan);
    }
    plan.actions
}

/// Repair: machines that never became nodes, nodes that never became ready or stopped being;
/// the back-off their failures cause, and the back-off a recovered group no longer needs. While
/// the cluster-health guard holds (`guard`: NotReady and total nodes), no NotReady node is
/// replaced and no Node deleted; otherwise at most `max_unready_repairs_per_pass` of them.
fn repair<'a>(cx: &Context<'a>, plan: &mut Plan<'a>, guard: Option<(u32, u32)>) {
    let groups = unready_by_group(cx);
    let mut budget = UnreadyBudget {
        left: if guard.is_some() {
            0
        } else {
            cx.s.max_unready_repairs_per_pass
        },
        held: 0,
        cluster_guard: guard.is_some(),
        group_held: groups.iter().map(|g| g.holds.then_some(0)).collect(),
    };
    let failures = repair_machines(cx, plan, &mut budget);
    delete_machineless_nodes(cx, plan, &mut budget);
    if let Some((unready, total)) = guard {
        plan.actions.push(Action::GuardHolds {
            group: None,
            unready,
            total,
            held: budget.held,
        });
    } else {
        for (gi, g) in groups.iter().enumerate() {
            if let Some(held) = budget.group_held[gi] {
                plan.actions.push(Action::GuardHolds {
                    group: Some(cx.s.groups[gi].name.clone()),
                    unready: g.unready,
                    total: g.total,
                    held,
                });
            }
        }
    }
    back_offs(cx, plan, &failures);
}

/// One group's NotReady nodes (first boots aside) among its nodes, and whether the per-group
/// guard holds: more than one NotReady *and* more than `max_unready_group_percent` % of them.
struct GroupHealth {
    unready: u32,
    total: u32,
    holds: bool,
}

fn unready_by_group(cx: &Context<'_>) -> Vec<GroupHealth> {
    let mut counts = vec![(0u32, 0u32); cx.s.groups.len()];
    for n in &cx.snap.nodes {
        if let Some(&gi) = n.group().and_then(|g| cx.groups.get(g)) {
            counts[gi].1 += 1;
            counts[gi].0 += u32::from(!n.ready && !n.first_boot());
        }
    }
    let pct = u64::from(cx.s.max_unready_group_percent);
    counts
        .into_iter()
        .map(|(unready, total)| GroupHealth {
            unready,
            total,
            holds: unready > 1 && u64::from(unready) * 100 > pct * u64::from(total),
        })
        .collect()
}

/// NotReady repairs and Node deletions still allowed this pass, and those held back: by the
/// per-pass cap and the cluster guard (`held`), or by a group's guard (`group_held`, `Some`
/// for each group whose guard holds).
struct UnreadyBudget {
    left: u32,
    held: u32,
    cluster_guard: bool,
    group_held: Vec<Option<u32>>,
}

impl UnreadyBudget {
    /// Takes one for group `gi`, or counts it as held.
    fn take(&mut self, gi: usize) -> bool {
        if self.cluster_guard {
            self.held += 1;
            false
        } else if let Some(Some(held)) = self.group_held.get_mut(gi) {
            *held += 1;
            false
        } else if self.left == 0 {
            self.held += 1;
            false
        } else {
            self.left -= 1;
            true
        }
    }
}

/// Machines that never registered, never became ready, or whose Node has been NotReady too
/// long; returns the failures per group (NotReady nodes are no failure of the group's).
fn repair_machines<'a>(
    cx: &Context<'a>,
    plan: &mut Plan<'a>,
    budget: &mut UnreadyBudget,
) -> BTreeMap<&'a str, u32> {
    let (snap, now, s) = (cx.snap, cx.now, cx.s);
    let (groups, node_by_name) = (&cx.groups, &cx.node_by_name);
    let Plan {
        actions,
        size,
        repaired,
        ..
    } = plan;
    let mut failures: BTreeMap<&str, u32> = BTreeMap::new();
    for m in &snap.machines {
        let Some(&gi) = groups.get(m.group.as_str()) else {
            continue;
        };
        let node = node_by_name.get(m.hostname.as_str());
        let age = elapsed(now, m.created);
        let reason = match node {
            None if age >= s.max_provision_time => Some(RepairReason::NeverRegistered),
            None => None,
            // Never a control-plane or etcd host, nor a node an operator protected.
            Some(n) if n.protected_role(&s.controller_node_labels) || n.scale_down_disabled => None,
            // Only a first boot can fail to come up: a node that was ready and reboots (the
            // startup taint back, its agent perhaps giving up) is judged NotReady, below.
            Some(n) if n.first_boot() && (n.not_ready_in_time || age >= s.max_provision_time) => {
                Some(RepairReason::NeverReady)
            }
            Some(n) if !n.first_boot() && !n.ready => {
                let since = n.ready_transition.or(n.created).unwrap_or(m.created);
                (elapsed(now, since) >= s.unready_delete_time).then_some(RepairReason::Unready)
            }
            Some(_) => None,
        };
        if reason == Some(RepairReason::Unready) && !budget.take(gi) {
            continue;
        }
        if let Some(reason) = reason {
            repaired.insert(m.hostname.as_str());
            size[gi] = size[gi].saturating_sub(1);
            if reason != RepairReason::Unready {
                *failures.entry(m.group.as_str()).or_default() += 1;
            }
            actions.push(Action::Repair {
                group: m.group.clone(),
                machine: m.id.clone(),
                node: node.map(|n| n.name.clone()),
                reason,
            });
        }
    }
    failures
}

/// Labelled Nodes without a machine, NotReady too long.
fn delete_machineless_nodes<'a>(cx: &Context<'a>, plan: &mut Plan<'a>, budget: &mut UnreadyBudget) {
    let (snap, now, s) = (cx.snap, cx.now, cx.s);
    let groups = &cx.groups;
    let Plan {
        actions,
        size,
        repaired,
        ..
    } = plan;
    // A labelled Node without a machine counts as a member (see `group_states`) while it may
    // come back. NotReady for `unready_delete_time`, its machine is taken as gone for good (as
    // a cloud's node lifecycle controller takes a Node whose instance no longer exists): the
    // Node is deleted and stops counting. A scale-down's own left-behind Nodes are scale-down's.
    for n in &snap.nodes {
        let Some(&gi) = n.group().and_then(|g| groups.get(g)) else {
            continue;
        };
        if cx.machine_by_host.contains_key(n.name.as_str())
            || n.ready
            || n.first_boot()
            || n.scale_down_in_progress
            || n.protected_role(&s.controller_node_labels)
            || n.scale_down_disabled
        {
            continue;
        }
        if n.ready_transition
            .or(n.created)
            .is_some_and(|since| elapsed(now, since) >= s.unready_delete_time)
            && budget.take(gi)
        {
            repaired.insert(n.name.as_str());
            size[gi] = size[gi].saturating_sub(1);
            actions.push(Action::DeleteNode {
                group: s.groups[gi].name.clone(),
                node: n.name.clone(),
                reason: DeleteNodeReason::Unready,
            });
        }
    }
}

/// The back-off the failures cause, and the back-off a recovered group no longer needs.
fn back_offs(cx: &Context<'_>, plan: &mut Plan<'_>, failures: &BTreeMap<&str, u32>) {
    let (snap, now, s) = (cx.snap, cx.now, cx.s);
    let groups = &cx.groups;
    let Plan {
        actions,
        backing_off,
        ..
    } = plan;
    for (group, n) in failures {
        if let Some(&gi) = groups.get(group) {
            backing_off[gi] = true;
        }
        actions.extend(back_off(
            group,
            snap.backoff.get(*group).copied(),
            *n,
            now,
            s,
        ));
    }
    for (group, b) in &snap.backoff {
        let Backoff {
            failures: f,
            last_failure,
            ..
        } = *b;
        if f == 0 || failures.contains_key(group.as_str()) {
            continue;
        }
        let recovered = snap.nodes.iter().any(|n| {
            n.group() == Some(group.as_str())
                && n.ready
                && !n.booting()
                && match (n.created, last_failure) {
                    (Some(c), Some(l)) => c > l,
                    _ => true,
                }
        });
        if recovered {
            actions.push(Action::ClearBackOff {
                group: group.clone(),
            });
        }
    }
}

/// The inter-pod constraints of `movers` (pods to place: pending ones, or those a scale-down
/// would move; `sets`: each one's label set) indexed against the snapshot and the packing's
/// bins.
fn topology(
    cx: &Context<'_>,
    bins: &[Bin<'_>],
    bin_group: &[Option<usize>],
    bin_node: &[Option<usize>],
    movers: &[&PodView],
    sets: &[usize],
) -> Topology {
    let sites: Vec<BinSite<'_>> = bins
        .iter()
        .zip(bin_group)
        .enumerate()
        .map(|(i, (b, &g))| BinSite {
            labels: b.labels,
            // A registering machine is its own hostname domain.
            machine_of: if b.name.is_empty() { g } else { None },
            node: bin_node.get(i).copied().flatten(),
        })
        .collect();
    let templates: Vec<(&BTreeMap<String, String>, &[TaintView])> = cx
        .templates
        .iter()
        .map(|t| (&t.labels, t.taints.as_slice()))
        .collect();
    Topology::new(
        &cx.snap.nodes,
        &cx.topology_pods(),
        &sites,
        &templates,
        movers,
        sets,
    )
}

/// Scale-up: pack the pending pods onto free room, booting nodes and registering machines, then
/// onto new nodes of the groups the expander chooses; say why for each pod left over.
fn scale_up<'a>(cx: &'a Context<'a>, plan: &mut Plan<'a>) {
    existing_bins(cx, plan);
    let (snap, now, s) = (cx.snap, cx.now, cx.s);
    let templates = &cx.templates;
    let Plan {
        actions,
        size,
        backing_off,
        planned,
        bins,
        bin_group,
        startup_free,
        bin_node,
        ..
    } = plan;
    let (pending, pending_sets) = pending_order(cx);
    let pending: Vec<&PodView> = pending.iter().map(|&i| &snap.pods[i]).collect();
    let mut topo = topology(cx, bins, bin_group, bin_node, &pending, &pending_sets);
    let unplaced_q = pack_onto_bins(bins, startup_free, &mut topo, &pending);
    let unplaced: Vec<&PodView> = unplaced_q.iter().map(|&qi| pending[qi]).collect();
    let (candidates, floors) = template_candidates(templates, &unplaced);
    let mut remaining: Vec<bool> = vec![true; unplaced.len()];
    // Pods a group's new node would take but for pod (anti-)affinity or topology spread.
    let mut blocked: Vec<Vec<bool>> = vec![vec![false; unplaced.len()]; templates.len()];
    // Seeded only when the random expander first draws: hashing 10,000 UIDs byte by byte is
    // not free, and the other expanders never draw.
    let mut rng: Option<SplitMix> = None;
    loop {
        let mut options: Vec<Expansion> = Vec::new();
        for (gi, t) in templates.iter().enumerate() {
            let room = headroom(s, gi, planned, size);
            if room == 0 || backing_off[gi] {
                continue;
            }
            let pods = Candidates {
                list: &candidates[gi],
                floors: &floors[gi],
                unplaced: &unplaced,
                unplaced_q: &unplaced_q,
                remaining: &remaining,
            };
            if let Some(o) = trial(gi, t, room, &pods, &mut topo, &mut blocked[gi]) {
                options.push(o);
            }
        }
        if options.is_empty() {
            break;
        }
        let Some(o) = choose(s, &options, &mut rng, now, &unplaced) else {
            break;
        };
        planned[o.group] += o.nodes;
        o.place(&mut topo, &mut remaining, &unplaced_q);
        actions.push(Action::ScaleUp {
            group: s.groups[o.group].name.clone(),
            count: o.nodes,
            reason: ScaleUpReason::PendingPods,
            pods: o.placed.iter().map(|&pi| unplaced[pi].key()).collect(),
        });
    }
    let left = Leftover {
        unplaced: &unplaced,
        remaining: &remaining,
        blocked: &blocked,
        backing_off,
        planned,
        size,
    };
    why_no_scale_up(cx, &left, actions);
}

/// The pods one group's expansion may take: its candidates in order, the floors of what they
/// request, and which are still unplaced.
struct Candidates<'c, 'p> {
    list: &'c [usize],
    floors: &'c [Resources],
    unplaced: &'c [&'p PodView],
    unplaced_q: &'c [usize],
    remaining: &'c [bool],
}

/// One group's trial: up to `room` new nodes of template `t`, packed first fit with its
/// candidates; marks in `blocked` the pods only (anti-)affinity or spread kept off a new node.
/// The trial's placements are undone after it: groups are compared on one state.
// Inlined: a phase of scale_up, called per group and round. Split out without it, the scaler bench's
// decide time rose by half (15.5 -> 24 ms at 1,000 nodes, 132 -> 206 ms at 5,000 light nodes).
#[inline(always)]
fn trial(
    gi: usize,
    t: &Template,
    room: u32,
    pods: &Candidates<'_, '_>,
    topo: &mut Topology,
    blocked: &mut [bool],
) -> Option<Expansion> {
    let mark = topo.mark();
    let mut nodes: Vec<(Resources, u32)> = Vec::new();
    let mut fit = FirstFit::default();
    let mut placed = Vec::new();
    let mut on_node = Vec::new();
    let mut requested = Resources::default();
    for (k, &pi) in pods.list.iter().enumerate() {
        if nodes.len() as u32 >= room && !fit.may_take(&pods.floors[k]) {
            break;
        }
        let (p, qi) = (pods.unplaced[pi], pods.unplaced_q[pi]);
        if !pods.remaining[pi] {
            continue;
        }
        let target = fit.first_where(&p.requests, |j| {
            let (free, host) = &nodes[j];
            let place = Place::New {
                group: gi,
                host: *host,
            };
            if free.fits(&p.requests) && topo.allows(qi, place) {
                Probe::Take
            } else {
                Probe::Skip
            }
        });
        let j = match target {
            Some(j) => j,
            None if (nodes.len() as u32) < room => {
                let host = topo.peek_host();
                if !topo.allows(qi, Place::New { group: gi, host }) {
                    blocked[pi] = true;
                    continue;
                }
                nodes.push((t.free.clone(), topo.take_host()));
                fit.push(&t.free);
                nodes.len() - 1
            }
            None => continue,
        };
        let (free, host) = &mut nodes[j];
        free.sub(&p.requests);
        fit.set(j, free);
        topo.place(
            qi,
            Place::New {
                group: gi,
                host: *host,
            },
        );
        requested.add(&p.requests);
        placed.push(pi);
        on_node.push(j);
    }
    topo.rollback(&mark);
    if placed.is_empty() {
        return None;
    }
    let n = nodes.len() as i64;
    let waste = (1.0 - share(requested.cpu_milli, t.allocatable.cpu_milli * n) + 1.0
        - share(requested.memory, t.allocatable.memory * n))
        / 2.0;
    Some(Expansion {
        group: gi,
        nodes: nodes.len() as u32,
        placed,
        on_node,
        waste,
    })
}

/// The expansion the configured expander picks among `options`. The random expander's
/// generator is seeded on its first draw, from `now` and the unplaced pods' UIDs.
fn choose<'o>(
    s: &ScalerSettings,
    options: &'o [Expansion],
    rng: &mut Option<SplitMix>,
    now: Timestamp,
    unplaced: &[&PodView],
) -> Option<&'o Expansion> {
    let least_waste = |a: &Expansion, b: &Expansion| {
        a.waste
            .total_cmp(&b.waste)
            .then_with(|| b.placed.len().cmp(&a.placed.len()))
            .then_with(|| a.nodes.cmp(&b.nodes))
            .then_with(|| s.groups[a.group].name.cmp(&s.groups[b.group].name))
    };
    match s.expander {
        Expander::LeastWaste => options.iter().min_by(|a, b| least_waste(a, b)),
        Expander::Priority => options.iter().min_by(|a, b| {
            s.groups[b.group]
                .priority
                .cmp(&s.groups[a.group].priority)
                .then_with(|| least_waste(a, b))
        }),
        Expander::Random => {
            let rng = rng.get_or_insert_with(|| {
                SplitMix(fnv(
                    &now.as_second().to_le_bytes(),
                    unplaced
                        .iter()
                        .fold(FNV_OFFSET, |h, p| fnv(p.uid.as_bytes(), h)),
                ))
            });
            let i = (rng.next() % options.len() as u64) as usize;
            options.get(i)
        }
    }
}

/// The bins pending pods can go to: usable nodes (ready and schedulable, or booting), then
/// machines still registering (as their group's template).
// Inlined: a phase of scale_up, called once a pass. Split out without it, the scaler bench's
// decide time rose by half (15.5 -> 24 ms at 1,000 nodes, 132 -> 206 ms at 5,000 light nodes).
#[inline(always)]
fn existing_bins<'a>(cx: &'a Context<'a>, plan: &mut Plan<'a>) {
    let (snap, groups, node_by_name, templates) =
        (cx.snap, &cx.groups, &cx.node_by_name, &cx.templates);
    let Plan {
        repaired,
        bins,
        bin_group,
        startup_free,
        bin_node,
        ..
    } = plan;
    for (ni, n) in snap.nodes.iter().enumerate() {
        if repaired.contains(n.name.as_str()) || n.scale_down_in_progress {
            continue;
        }
        let usable = (n.ready && !n.unschedulable) || n.booting();
        if !usable {
            continue;
        }
        let mut free = n.allocatable.clone();
        if let Some(u) = cx.usage(&n.name) {
            free.sub(&u.requested);
        }
        bins.push(Bin {
            name: &n.name,
            labels: &n.labels,
            // The startup taint is how a booting node says "coming": not counted against pods.
            taints: &n.taints,
            free,
            claimed: false,
        });
        bin_group.push(n.group().and_then(|g| groups.get(g).copied()));
        startup_free.push(n.lasting_taints());
        bin_node.push(Some(ni));
    }
    for m in &snap.machines {
        let Some(&gi) = groups.get(m.group.as_str()) else {
            continue;
        };
        if node_by_name.contains_key(m.hostname.as_str()) || repaired.contains(m.hostname.as_str())
        {
            continue;
        }
        let t = &templates[gi];
        bins.push(Bin {
            name: "",
            labels: &t.labels,
            taints: &t.taints,
            free: t.free.clone(),
            claimed: false,
        });
        bin_group.push(Some(gi));
        bin_node.push(None);
    }
}

/// The pending pods (indexes in `snap.pods`) in packing order, and their label sets.
// Inlined: a phase of scale_up, called once a pass. Split out without it, the scaler bench's
// decide time rose by half (15.5 -> 24 ms at 1,000 nodes, 132 -> 206 ms at 5,000 light nodes).
#[inline(always)]
fn pending_order(cx: &Context<'_>) -> (Vec<usize>, Vec<usize>) {
    let snap = cx.snap;
    let mut pending: Vec<usize> = cx.unschedulable.clone();
    // Largest first (FFD), then by namespace and name, compared in place: a `namespace/name`
    // string per pod was 10,000 allocations at the bench's larger size.
    pending.sort_by_key(|&i| {
        let p = &snap.pods[i];
        (
            std::cmp::Reverse((p.requests.cpu_milli, p.requests.memory)),
            p.namespace.as_str(),
            p.name.as_str(),
        )
    });
    let pending_sets: Vec<usize> = pending
        .iter()
        .filter_map(|&i| cx.label_set.get(i).copied())
        .collect();
    (pending, pending_sets)
}

/// Packs the pending pods onto the bins, first fit across classes of alike bins; returns the
/// pods (by index in `pending`) that fit none.
// Inlined: a phase of scale_up, called once a pass. Split out without it, the scaler bench's
// decide time rose by half (15.5 -> 24 ms at 1,000 nodes, 132 -> 206 ms at 5,000 light nodes).
#[inline(always)]
fn pack_onto_bins(
    bins: &mut [Bin<'_>],
    startup_free: &[Vec<TaintView>],
    topo: &mut Topology,
    pending: &[&PodView],
) -> Vec<usize> {
    let mut classes = BinClasses::new(bins, startup_free);
    // Pending pods (by index in `pending`) that fit no bin.
    let mut unplaced_q: Vec<usize> = Vec::new();
    for (qi, p) in pending.iter().enumerate() {
        let host_free = !hostname_sensitive(p);
        // First fit across the classes: the lowest bin index any of them offers.
        let mut best: Option<(usize, usize, usize)> = None;
        for (ci, class) in classes.classes.iter().enumerate() {
            // The tree's root first: when the nodes are full, that is all a class costs.
            if !class.fit.may_take(&p.requests)
                || host_free && !(selects(p, &class.labels, "") && tolerates(p, class.taints))
            {
                continue;
            }
            let found = class.fit.first_where(&p.requests, |pos| {
                let i = class.bins[pos];
                if best.is_some_and(|(b, ..)| b < i) {
                    return Probe::Stop;
                }
                let b = &bins[i];
                let taints: &[TaintView] = startup_free.get(i).map_or(b.taints, Vec::as_slice);
                if b.free.fits(&p.requests)
                    && selects(p, b.labels, b.name)
                    && tolerates(p, taints)
                    && topo.allows(qi, Place::Bin(i))
                {
                    Probe::Take
                } else {
                    Probe::Skip
                }
            });
            if let Some(pos) = found {
                best = Some((class.bins[pos], ci, pos));
            }
        }
        match best {
            Some((i, ci, pos)) => {
                let b = &mut bins[i];
                b.free.sub(&p.requests);
                b.claimed = true;
                classes.classes[ci].fit.set(pos, &b.free);
                topo.place(qi, Place::Bin(i));
            }
            None => unplaced_q.push(qi),
        }
    }
    unplaced_q
}

/// Per group, the pods its template can take (pods fewer groups can take first, then by size),
/// and the floors of what they request from each position on.
// Inlined: a phase of scale_up, called once a pass. Split out without it, the scaler bench's
// decide time rose by half (15.5 -> 24 ms at 1,000 nodes, 132 -> 206 ms at 5,000 light nodes).
#[inline(always)]
fn template_candidates(
    templates: &[Template],
    unplaced: &[&PodView],
) -> (Vec<Vec<usize>>, Vec<Vec<Resources>>) {
    // Which pods each group's template can ever take (selector, affinity, taints, size); pod by
    // pod, so each pod is read once for all the groups, and once per shape: the replicas of a
    // workload ask alike, and are checked against the templates once.
    type Shape<'p> = (
        &'p Resources,
        &'p BTreeMap<String, String>,
        &'p Vec<Vec<Requirement>>,
        &'p Vec<TolerationView>,
    );
    let mut shapes: FastMap<Shape<'_>, Vec<bool>> = FastMap::default();
    let mut fits_template: Vec<Vec<bool>> = vec![vec![false; unplaced.len()]; templates.len()];
    for (pi, p) in unplaced.iter().enumerate() {
        let shape = (
            &p.requests,
            &p.node_selector,
            &p.affinity_terms,
            &p.tolerations,
        );
        let row = shapes.entry(shape).or_insert_with(|| {
            templates
                .iter()
                .map(|t| {
                    t.free.fits(&p.requests) && selects(p, &t.labels, "") && tolerates(p, &t.taints)
                })
                .collect()
        });
        for (fits, &f) in fits_template.iter_mut().zip(row.iter()) {
            fits[pi] = f;
        }
    }
    // Pods that fewer groups can take are packed first, so a group does not fill up with pods
    // that could have gone elsewhere and strand the ones that could not (then by size, FFD).
    let mut order: Vec<usize> = (0..unplaced.len()).collect();
    let takers: Vec<usize> = (0..unplaced.len())
        .map(|pi| fits_template.iter().filter(|f| f[pi]).count())
        .collect();
    order.sort_by_key(|&pi| (takers[pi], pi));
    // Per group, in that order, the pods its template can take.
    let candidates: Vec<Vec<usize>> = fits_template
        .iter()
        .map(|fits| order.iter().copied().filter(|&pi| fits[pi]).collect())
        .collect();
    // Per group, the least CPU, memory and pods its candidates from each position on request:
    // once a trial is out of room and no new node has that much left, none of them fits.
    let floors: Vec<Vec<Resources>> = candidates
        .iter()
        .map(|list| {
            let mut floor = vec![
                Resources {
                    cpu_milli: i64::MAX,
                    memory: i64::MAX,
                    pods: i64::MAX,
                    ..Resources::default()
                };
                list.len() + 1
            ];
            for (k, &pi) in list.iter().enumerate().rev() {
                let (r, next) = (&unplaced[pi].requests, &floor[k + 1]);
                floor[k] = Resources {
                    cpu_milli: r.cpu_milli.min(next.cpu_milli),
                    memory: r.memory.min(next.memory),
                    pods: r.pods.min(next.pods),
                    ..Resources::default()
                };
            }
            floor
        })
        .collect();
    (candidates, floors)
}

/// What the expansion left: the pods not placed, and why no group took them.
struct Leftover<'l, 'p> {
    unplaced: &'l [&'p PodView],
    remaining: &'l [bool],
    blocked: &'l [Vec<bool>],
    backing_off: &'l [bool],
    planned: &'l [u32],
    size: &'l [u32],
}

/// A `NoScaleUp` for each pod no group took, saying for each group why not.
fn why_no_scale_up(cx: &Context<'_>, left: &Leftover<'_, '_>, actions: &mut Vec<Action>) {
    let (s, templates) = (cx.s, &cx.templates);
    let Leftover {
        unplaced,
        remaining,
        blocked,
        backing_off,
        planned,
        size,
    } = *left;
    for (pi, p) in unplaced.iter().enumerate() {
        if !remaining[pi] {
            continue;
        }
        let mut why = Vec::new();
        for (gi, g) in s.groups.iter().enumerate() {
            let t = &templates[gi];
            let reason = if !selects(p, &t.labels, "") {
                "node selector or affinity does not match"
            } else if !tolerates(p, &t.taints) {
                "does not tolerate the group's taints"
            } else if !t.free.fits(&p.requests) {
                "requests more than a new node offers"
            } else if backing_off[gi] {
                "backing off after failed machines"
            } else if headroom(s, gi, planned, size) == 0 {
                "at max size"
            } else if blocked[gi][pi] {
                "pod affinity, anti-affinity or topology spread cannot be satisfied by a new node"
            } else {
                "no room left in this pass"
            };
            why.push(format!("{}: {reason}", g.name));
        }
        let reason = if why.is_empty() {
            "no node groups are configured".to_string()
        } else {
            format!("no node group can take it ({})", why.join("; "))
        };
        actions.push(Action::NoScaleUp {
            pod: p.key(),
            reason,
        });
    }
}

/// Groups below `min`, or with fewer empty nodes (or machines coming) than `standby`, grow.
fn min_and_standby(cx: &Context<'_>, plan: &mut Plan<'_>) {
    let (s, node_by_name) = (cx.s, &cx.node_by_name);
    let Plan {
        actions,
        size,
        backing_off,
        planned,
        bins,
        bin_group,
        ..
    } = plan;
    let mut standby_nodes: Vec<u32> = vec![0; s.groups.len()];
    for (i, b) in bins.iter().enumerate() {
        let Some(gi) = bin_group[i] else { continue };
        if b.claimed {
            continue;
        }
        // A machine still registering, a booting node or an empty schedulable node all count.
        let available = b.name.is_empty()
            || node_by_name
                .get(b.name)
                .is_some_and(|n| !n.unschedulable && cx.empty(n));
        if available {
            standby_nodes[gi] += 1;
        }
    }
    for (gi, g) in s.groups.iter().enumerate() {
        if backing_off[gi] {
            continue;
        }
        let total = size[gi] + planned[gi];
        let (want, reason) = if total < g.min {
            (g.min - total, ScaleUpReason::BelowMin)
        } else if standby_nodes[gi] < g.standby {
            (g.standby - standby_nodes[gi], ScaleUpReason::Standby)
        } else {
            continue;
        };
        let count = want.min(headroom(s, gi, planned, size));
        if count > 0 {
            planned[gi] += count;
            actions.push(Action::ScaleUp {
                group: g.name.clone(),
                count,
                reason,
                pods: Vec::new(),
            });
        }
    }
}

/// `max_boots_per_pass` (the nodemanager's `MaxBootPerIteration`): the machines of this pass's
/// scale-ups together stay within the cap, taken in the order they were decided (pending pods,
/// then min, then standby); a scale-up left with none is dropped. The next pass sees the
/// machines created as registering and asks again for what is still missing.
fn cap_boots(cx: &Context<'_>, plan: &mut Plan<'_>) {
    let Some(mut left) = cx.s.max_boots_per_pass else {
        return;
    };
    let Plan {
        actions, planned, ..
    } = plan;
    actions.retain_mut(|a| {
        let Action::ScaleUp { group, count, .. } = a else {
            return true;
        };
        let allowed = (*count).min(left);
        left -= allowed;
        if let Some(&gi) = cx.groups.get(group.as_str()) {
            planned[gi] = planned[gi].saturating_sub(*count - allowed);
        }
        *count = allowed;
        allowed > 0
    });
}

mod first_fit;
mod label_sets;
mod node_index;
mod scale_down;
#[cfg(test)]
mod tests;
mod topology;
