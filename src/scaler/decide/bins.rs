//! The bins pods are packed into: existing nodes' free room and the templates new nodes of a group
//! would have, grouped into classes for first fit.

use super::*;

/// Where a pod could go during packing.
#[derive(Debug, Clone)]
pub(super) struct Bin<'a> {
    pub(super) name: &'a str,
    pub(super) labels: &'a BTreeMap<String, String>,
    pub(super) taints: &'a [TaintView],
    pub(super) free: Resources,
    /// A pending pod was placed here in this decision.
    pub(super) claimed: bool,
}

/// Whether a pod's node selector or required node affinity looks at a node's own name, so bins
/// that share labels but for their hostname may still differ for it.
pub(super) fn hostname_sensitive(p: &PodView) -> bool {
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
pub(super) struct BinClasses<'a> {
    pub(super) classes: Vec<BinClass<'a>>,
}

impl<'b> BinClasses<'b> {
    pub(super) fn new(bins: &[Bin<'b>], startup_free: &'b [Vec<TaintView>]) -> Self {
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

pub(super) struct BinClass<'a> {
    /// The labels of the class, without the hostname.
    pub(super) labels: BTreeMap<String, String>,
    pub(super) taints: &'a [TaintView],
    /// Bin indices, ascending.
    pub(super) bins: Vec<usize>,
    pub(super) fit: FirstFit,
}

/// What one new node of a group looks like.
#[derive(Debug, Clone)]
pub(super) struct Template {
    pub(super) labels: BTreeMap<String, String>,
    pub(super) taints: Vec<TaintView>,
    pub(super) allocatable: Resources,
    /// Allocatable less the DaemonSet pods every node runs.
    pub(super) free: Resources,
}

pub(super) fn template(g: &GroupSettings, cx: &Context<'_>) -> Template {
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

/// A small deterministic generator (splitmix64) for the random expander, seeded from the input.
pub(super) struct SplitMix(pub(super) u64);

impl SplitMix {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// One group's simulated scale-up.
pub(super) struct Expansion {
    pub(super) group: usize,
    pub(super) nodes: u32,
    /// Indices into the unplaced pods.
    pub(super) placed: Vec<usize>,
    /// For each placed pod, which of the new nodes it went to.
    pub(super) on_node: Vec<usize>,
    pub(super) waste: f64,
}

impl Expansion {
    /// `nodes` new nodes of group `gi` (template `t`) taking the pods `placed`, each on its
    /// node in `on_node`, which request `requested` in all; its waste is the share of their
    /// CPU and memory left unrequested, the two averaged.
    pub(super) fn new(
        gi: usize,
        t: &Template,
        nodes: u32,
        requested: &Resources,
        placed: Vec<usize>,
        on_node: Vec<usize>,
    ) -> Self {
        let n = i64::from(nodes);
        let waste = (1.0 - share(requested.cpu_milli, t.allocatable.cpu_milli * n) + 1.0
            - share(requested.memory, t.allocatable.memory * n))
            / 2.0;
        Expansion {
            group: gi,
            nodes,
            placed,
            on_node,
            waste,
        }
    }

    /// Its pods are placed: on its new nodes in the topology (hostnames taken in order), and no
    /// longer `remaining`.
    pub(super) fn place(&self, topo: &mut Topology, remaining: &mut [bool], unplaced_q: &[usize]) {
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

/// The floor of no request yet: any node's room fits under it.
pub(super) fn no_floor() -> Resources {
    Resources {
        cpu_milli: i64::MAX,
        memory: i64::MAX,
        pods: i64::MAX,
        ..Resources::default()
    }
}

/// `floor` lowered to `r`'s CPU, memory and pod slots where they are less: the least any of a
/// set of pods requests, so a node with less room left takes none of them.
pub(super) fn floor_with(floor: &Resources, r: &Resources) -> Resources {
    Resources {
        cpu_milli: floor.cpu_milli.min(r.cpu_milli),
        memory: floor.memory.min(r.memory),
        pods: floor.pods.min(r.pods),
        ..Resources::default()
    }
}

pub(super) fn share(used: i64, total: i64) -> f64 {
    if total <= 0 {
        0.0
    } else {
        (used as f64 / total as f64).clamp(0.0, 1.0)
    }
}
