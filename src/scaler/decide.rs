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
//!
//! Read `decide.rs` first ([`decide`], `Context`, `Plan`), then the file that answers:
//! - `actions.rs` — the actions and their reasons;
//! - `scale_up.rs` — packing pending pods, choosing a group, `min` and standby, the boot cap;
//! - `scale_down.rs` — which idle node goes, simulated under the budgets;
//! - `repair.rs` — machines that never registered, Nodes without a machine;
//! - `guard.rs` — the cluster-health guard that holds repairs and scale-down back;
//! - `backoff.rs` — the back-off rule and where it holds;
//! - `bins.rs`, `first_fit.rs`, `topology.rs`, `label_sets.rs`, `node_index.rs` — the packing's
//!   pieces: bins and templates, first fit, inter-pod constraints by domain, label indexes.

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

pub use actions::{Action, DeleteNodeReason, RepairReason, ScaleUpReason};
use backoff::*;
pub use backoff::{back_off, backoff_for};
use bins::*;
use guard::*;
pub use guard::{remember_guards, unhealthy};
use refill::Refill;
use repair::*;
use scale_up::*;

/// A map with a fast hash, for keys made of the pods' own strings that one pass looks up
/// thousands of times. Never iterated: its order, seeded per process, never shows in a decision.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

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

mod actions;
mod backoff;
mod bins;
mod first_fit;
mod guard;
mod label_sets;
mod node_index;
mod refill;
mod repair;
mod scale_down;
mod scale_up;
#[cfg(test)]
mod tests;
mod topology;
