//! Inter-pod constraints for scale-up's packing: required pod affinity and anti-affinity (the
//! pod's own, and the anti-affinity of pods already placed against it, as the scheduler checks
//! both ways) and `DoNotSchedule` topology spread.
//!
//! All three are counts of pods per topology domain (the value of a node label), so the index
//! keeps one counter per distinct (namespaces, selector, topology key): pods it selects, per
//! domain, filled from the running pods once and bumped as the simulation places pending pods. A
//! second set of counters holds, per domain, the pods that *carry* an anti-affinity term, for the
//! symmetric check. Each pending pod is compiled once into the counters it must check and the
//! counters it bumps, so a pod without constraints that no counter selects costs nothing, and a
//! check is a few vector reads.
//!
//! Scale-down's simulation uses the same index with the pods it would move as the ones to place:
//! [`Topology::lift`] takes a pod's counts off the node it leaves first.
//!
//! A new node is its own `kubernetes.io/hostname` domain and takes every other domain from its
//! group's template labels (zone, region). A group's trial expansion is undone through a journal
//! ([`Topology::mark`], [`Topology::rollback`]) so the expander compares groups on the same state.
//! A new node becomes a domain of the spreads its group is eligible for; which of them it may add
//! a domain to is worked out once per group (a zone the existing nodes have is already one), so
//! placing a pod does not look at every spread of the pass.
//!
//! A pod's affinity terms are counted together, as the scheduler does: a pod counts for them
//! only if it matches every term (then in each term's topology domain), so two pods that each
//! match one term satisfy nothing. Anti-affinity and spread count per term. `matchLabelKeys`
//! arrive merged into the selectors (`model::pod_view`).
//!
//! A spread's eligible domains follow `nodeAffinityPolicy` and `nodeTaintsPolicy`: under `Honor`
//! a node (or a group's new node) whose lasting taints the pod does not tolerate adds none.
//!
//! Simplified: `namespaceSelector` counts every namespace (the scaler does not list Namespaces);
//! a spread counts the matching pods on every node of a domain, also those on nodes its policies
//! leave out, and counts a new node's domain once a pod is placed there. A scale-down keeps the domains of the node it empties among a spread's eligible
//! ones (a hostname spread then sees an empty domain, and may refuse a move the scheduler would
//! take: never the other way round).

use std::collections::{BTreeMap, HashMap};

use super::label_sets::LabelSet;
use super::{FastMap, selects, tolerates};
use crate::scaler::model::{
    Namespaces, NodeView, PodTermView, PodView, Requirement, SelectorView, SpreadView, TaintView,
    TolerationView,
};

/// The label that makes every node its own domain.
pub(super) const HOSTNAME: &str = "kubernetes.io/hostname";

/// Where a pod might go.
#[derive(Debug, Clone, Copy)]
pub(super) enum Place {
    /// Bin `i` of the packing: a node, or a machine still registering.
    Bin(usize),
    /// A new node of group `group` whose hostname domain is `host`.
    New {
        /// The group.
        group: usize,
        /// Its `kubernetes.io/hostname` domain.
        host: u32,
    },
}

/// The snapshot's pods as the index needs them.
pub(super) struct Pods<'a> {
    /// Every pod of the snapshot.
    pub all: &'a [PodView],
    /// Per pod, the index of the node it is bound to (`None`: unbound, or its node is not
    /// listed).
    pub node_of: &'a [Option<usize>],
    /// The pods that carry pod anti-affinity, by index in `all`, in order.
    pub carrying: &'a [usize],
    /// The pods' distinct namespaces and label sets.
    pub sets: &'a [LabelSet<'a>],
    /// Per pod, its index in `sets`; may be empty when no pod has inter-pod constraints.
    pub set_of: &'a [usize],
}

/// A bin as the index needs it.
pub(super) struct BinSite<'a> {
    /// Its labels (a registering machine: its group's template labels).
    pub labels: &'a BTreeMap<String, String>,
    /// The group of a registering machine (its own hostname domain); `None` for a node.
    pub machine_of: Option<usize>,
    /// A node's index in the nodes given with it, whose domains it shares.
    pub node: Option<usize>,
}

/// Which pods a counter counts: those every one of its terms selects (one term but for a pod's
/// affinity terms, which count together).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Matcher {
    terms: Vec<Selects>,
}

/// One term of a [`Matcher`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Selects {
    namespaces: Namespaces,
    /// `None` selects no pod.
    selector: Option<SelectorView>,
}

impl Matcher {
    fn one(namespaces: Namespaces, selector: Option<SelectorView>) -> Self {
        Self {
            terms: vec![Selects {
                namespaces,
                selector,
            }],
        }
    }

    /// Whether it counts the pods of namespace `ns` with `labels`.
    fn selects(&self, (ns, labels): LabelSet<'_>) -> bool {
        !self.terms.is_empty()
            && self.terms.iter().all(|t| {
                t.selector
                    .as_ref()
                    .is_some_and(|s| t.namespaces.contain(ns) && s.selects(labels))
            })
    }
}

/// A pod's namespace and labels.
fn set_of(p: &PodView) -> LabelSet<'_> {
    (&p.namespace, &p.labels)
}

/// Pods per domain of one topology key.
#[derive(Debug, Clone)]
struct Counter {
    matcher: Matcher,
    key: usize,
    counts: Vec<u32>,
    total: u32,
}

impl Counter {
    fn at(&self, d: u32) -> u32 {
        self.counts.get(d as usize).copied().unwrap_or(0)
    }
}

/// One spread constraint's eligible domains and their minimum count. Eligible: the domains of
/// the nodes the pod's node selector and required node affinity accept (all nodes with the key
/// under `nodeAffinityPolicy: Ignore`).
#[derive(Debug, Clone)]
struct Spread {
    counter: usize,
    eligible: Vec<bool>,
    domains: Vec<u32>,
    /// The minimum count over `domains`, `None` when it must be recomputed.
    min: Option<u32>,
    min_domains: u32,
    /// Whether a new node of each group is eligible.
    group_eligible: Vec<bool>,
}

/// What one pending pod checks and changes.
#[derive(Debug, Clone, Default)]
struct Needs {
    affinity: Vec<usize>,
    /// The pod matches all its affinity terms: it may start a series where none exists yet.
    self_affine: bool,
    anti: Vec<usize>,
    /// (spread, maxSkew, whether the pod counts itself).
    spread: Vec<(usize, u32, bool)>,
    /// Carrier counters of this pod's anti-affinity terms.
    carries: Vec<usize>,
}

/// The counters one label set's pods are counted by, and the carriers whose anti-affinity
/// selects them: the same for every pod of a workload, so kept once per set, not per pod.
#[derive(Debug, Clone, Default)]
struct Matched {
    counted_by: Vec<usize>,
    hit_by: Vec<usize>,
}

/// What a pending pod is: the index of its own [`Needs`] (a pod without constraints has none)
/// and of its label set's [`Matched`], each [`NONE`] when it has none. Two words a pod: most of
/// a scale-down's movers (240,000 at 15,000 nodes) carry no constraint, and a `Needs` each
/// was 25 MB to fill and free per pass.
#[derive(Debug, Clone, Copy)]
struct Pending {
    needs: u32,
    set: u32,
}

const NONE: u32 = u32::MAX;

enum Undo {
    /// One pod counted (`up`: by [`Topology::place`]) or no longer counted (by
    /// [`Topology::lift`]) in a counter, of the carriers when `carrier`, at domain `d`.
    Count {
        carrier: bool,
        counter: usize,
        d: u32,
        up: bool,
    },
    Eligible {
        spread: usize,
    },
}

/// A point to roll back to.
pub(super) struct Mark {
    journal: usize,
    next_host: u32,
}

/// The index: see the module documentation.
pub(super) struct Topology {
    /// Topology keys; `HOSTNAME` is key 0.
    keys: Vec<String>,
    /// Per key, domain value → id.
    values: Vec<FastMap<String, u32>>,
    /// Per key, the next free id.
    next: Vec<u32>,
    /// Per bin, its domain per key.
    bin_domains: Vec<Vec<Option<u32>>>,
    /// Per group, a new node's domain per key (the hostname key's is per node).
    group_domains: Vec<Vec<Option<u32>>>,
    counters: Vec<Counter>,
    carriers: Vec<Counter>,
    spreads: Vec<Spread>,
    /// Per counter, the spreads over it.
    spreads_of: Vec<Vec<usize>>,
    /// Per group, the spreads to which a new node of it may add its domain: those it is
    /// eligible for, but for the domains the existing nodes already made eligible (they stay).
    group_fresh: Vec<Vec<usize>>,
    /// The same per bin, for the bins of registering machines (empty for a node's).
    bin_fresh: Vec<Vec<usize>>,
    /// Per pending pod, where its needs and its set's matches are.
    pending: Vec<Pending>,
    /// The pending pods' own needs, for those with constraints.
    needs: Vec<Needs>,
    /// Per label set of the snapshot's pods, what counts or hits its pods.
    matched: Vec<Matched>,
    journal: Vec<Undo>,
}

/// The index of `item`, added with `add` when it is new.
fn intern<T: PartialEq + Eq + std::hash::Hash + Clone, S: std::hash::BuildHasher>(
    index: &mut HashMap<T, usize, S>,
    item: T,
    add: impl FnOnce(T) -> usize,
) -> usize {
    if let Some(&i) = index.get(&item) {
        return i;
    }
    let i = add(item.clone());
    index.insert(item, i);
    i
}

/// What [`Topology::new`] has interned so far: topology keys, counters by what they count, and
/// the same counters by the term or spread constraint that asked for them. The replicas of a
/// workload carry equal terms, and finding a counter by its [`Matcher`] first clones the term
/// into one: a term seen before is found without that.
#[derive(Default)]
struct Interner<'p> {
    keys: FastMap<String, usize>,
    counters: FastMap<(Matcher, usize), usize>,
    carriers: FastMap<(Matcher, usize), usize>,
    /// (anti-affinity term, whether a carrier counter) → counter.
    by_term: FastMap<(&'p PodTermView, bool), usize>,
    /// A pod's affinity terms → their counters, one per term.
    by_affinity: FastMap<&'p [PodTermView], Vec<usize>>,
    /// (namespace, selector, topology key) of a spread constraint → counter.
    by_spread: FastMap<(&'p str, &'p Option<SelectorView>, &'p str), usize>,
}

impl<'p> Interner<'p> {
    fn key(&mut self, t: &mut Topology, k: &str) -> usize {
        if let Some(&i) = self.keys.get(k) {
            return i;
        }
        intern(&mut self.keys, k.to_string(), |k| {
            t.keys.push(k);
            t.values.push(FastMap::default());
            t.next.push(0);
            t.keys.len() - 1
        })
    }

    fn counter(&mut self, t: &mut Topology, carrier: bool, m: Matcher, key: usize) -> usize {
        let index = if carrier {
            &mut self.carriers
        } else {
            &mut self.counters
        };
        intern(index, (m, key), |(matcher, key)| {
            let list = if carrier {
                &mut t.carriers
            } else {
                &mut t.counters
            };
            list.push(Counter {
                matcher,
                key,
                counts: Vec::new(),
                total: 0,
            });
            if !carrier {
                t.spreads_of.push(Vec::new());
            }
            list.len() - 1
        })
    }

    /// The counter (or, `carrier`, the carrier counter) of a pod anti-affinity term.
    fn term(&mut self, t: &mut Topology, term: &'p PodTermView, carrier: bool) -> usize {
        if let Some(&ci) = self.by_term.get(&(term, carrier)) {
            return ci;
        }
        let key = self.key(t, &term.topology_key);
        let m = Matcher::one(term.namespaces.clone(), term.selector.clone());
        let ci = self.counter(t, carrier, m, key);
        self.by_term.insert((term, carrier), ci);
        ci
    }

    /// The counters of a pod's affinity `terms`: per term, in its topology key, the pods that
    /// match all of them.
    fn affinity(&mut self, t: &mut Topology, terms: &'p [PodTermView]) -> Vec<usize> {
        if let Some(cis) = self.by_affinity.get(terms) {
            return cis.clone();
        }
        let m = Matcher {
            terms: terms
                .iter()
                .map(|term| Selects {
                    namespaces: term.namespaces.clone(),
                    selector: term.selector.clone(),
                })
                .collect(),
        };
        let cis: Vec<usize> = terms
            .iter()
            .map(|term| {
                let key = self.key(t, &term.topology_key);
                self.counter(t, false, m.clone(), key)
            })
            .collect();
        self.by_affinity.insert(terms, cis.clone());
        cis
    }

    /// The counter of a spread constraint of a pod in namespace `ns`.
    fn spread(&mut self, t: &mut Topology, ns: &'p str, sc: &'p SpreadView) -> usize {
        let at = (ns, &sc.selector, sc.topology_key.as_str());
        if let Some(&ci) = self.by_spread.get(&at) {
            return ci;
        }
        let key = self.key(t, &sc.topology_key);
        let m = Matcher::one(Namespaces::Only(vec![ns.to_string()]), sc.selector.clone());
        let ci = self.counter(t, false, m, key);
        self.by_spread.insert(at, ci);
        ci
    }
}

/// Per spread of the pending pods (by index in `Topology::spreads`): the pod it was first seen
/// on (whose selector, affinity and tolerations decide its eligible domains), and its
/// `nodeAffinityPolicy: Ignore` and `nodeTaintsPolicy: Honor`.
#[derive(Default)]
struct SpreadPods<'p> {
    pod: Vec<&'p PodView>,
    ignore: Vec<bool>,
    honor: Vec<bool>,
}

/// The distinct domains of key `key` among the nodes' domains, in the nodes' order.
fn distinct(node_domains: &[Vec<Option<u32>>], key: usize) -> Vec<u32> {
    let mut seen = Vec::new();
    let mut list = Vec::new();
    for d in node_domains.iter().filter_map(|domains| domains[key]) {
        if !seen.get(d as usize).copied().unwrap_or(false) {
            set_flag(&mut seen, d, true);
            list.push(d);
        }
    }
    list
}

impl Topology {
    /// Indexes the constraints of `pending` (`pending_sets`: each one's label set in
    /// `pods.sets`) against the pods bound to `nodes`, the packing's bins and the groups'
    /// template labels. The caller found the pods that carry anti-affinity and each pod's label
    /// set when it read the pods: a pass over 150,000 pods of its own costs a cache miss or more
    /// per pod. The counters are matched once per label set, then bumped per pod from the
    /// pods' nodes and sets alone, without reading the pods again.
    pub(super) fn new(
        nodes: &[NodeView],
        pods: &Pods<'_>,
        bins: &[BinSite<'_>],
        templates: &[(&BTreeMap<String, String>, &[TaintView])],
        pending: &[&PodView],
        pending_sets: &[usize],
    ) -> Self {
        let mut t = Self::empty(pending.len());
        let mut index = Interner::default();
        index.keys.insert(HOSTNAME.to_string(), 0);
        let spread_pods = t.index_pending(&mut index, pending);
        let running_carriers = t.index_running(&mut index, nodes, pods);
        if t.counters.is_empty() && t.carriers.is_empty() {
            return t;
        }
        let node_domains = t.index_domains(nodes, bins, templates);
        t.count_bound(pods, &node_domains, running_carriers, pending_sets);
        t.spread_eligibility(nodes, &node_domains, templates, &spread_pods);
        t.group_fresh = (0..templates.len())
            .map(|g| t.fresh_spreads(g, &t.group_domains[g]))
            .collect();
        t.bin_fresh = bins
            .iter()
            .zip(&t.bin_domains)
            .map(|(b, domains)| match b.machine_of {
                Some(g) => t.fresh_spreads(g, domains),
                None => Vec::new(),
            })
            .collect();
        t
    }

    /// No key but the hostname, no counter, no constraint: `pending` pods that need nothing.
    fn empty(pending: usize) -> Self {
        Self {
            keys: vec![HOSTNAME.to_string()],
            values: vec![FastMap::default()],
            next: vec![0],
            bin_domains: Vec::new(),
            group_domains: Vec::new(),
            counters: Vec::new(),
            carriers: Vec::new(),
            spreads: Vec::new(),
            spreads_of: Vec::new(),
            group_fresh: Vec::new(),
            bin_fresh: Vec::new(),
            pending: vec![
                Pending {
                    needs: NONE,
                    set: NONE
                };
                pending
            ],
            needs: Vec::new(),
            matched: Vec::new(),
            journal: Vec::new(),
        }
    }

    /// The pending pods' own terms: each pod's needs, with a counter per distinct term and a
    /// spread per distinct (counter, what its eligible domains depend on).
    fn index_pending<'p>(
        &mut self,
        index: &mut Interner<'p>,
        pending: &[&'p PodView],
    ) -> SpreadPods<'p> {
        // (counter, minDomains, nodeAffinityPolicy Ignore, node selector, node affinity, the
        // tolerations under nodeTaintsPolicy Honor): what a spread's state depends on.
        type SpreadKey<'p> = (
            usize,
            u32,
            bool,
            &'p BTreeMap<String, String>,
            &'p Vec<Vec<Requirement>>,
            Option<&'p Vec<TolerationView>>,
        );
        let mut spread_index: FastMap<SpreadKey<'_>, usize> = FastMap::default();
        let mut spread_pods = SpreadPods::default();
        for (qi, p) in pending.iter().enumerate() {
            let Some(c) = p.constraints.as_deref() else {
                continue;
            };
            let mut needs = Needs::default();
            if !c.affinity.is_empty() {
                needs.affinity = index.affinity(self, &c.affinity);
            }
            needs.self_affine = needs
                .affinity
                .iter()
                .all(|&ci| self.counters[ci].matcher.selects(set_of(p)));
            for term in &c.anti_affinity {
                needs.anti.push(index.term(self, term, false));
                needs.carries.push(index.term(self, term, true));
            }
            for sc in &c.spread {
                let ci = index.spread(self, &p.namespace, sc);
                let self_match = self.counters[ci].matcher.selects(set_of(p));
                let key = (
                    ci,
                    sc.min_domains,
                    sc.ignore_node_affinity,
                    &p.node_selector,
                    &p.affinity_terms,
                    sc.honor_taints.then_some(&p.tolerations),
                );
                let si = intern(&mut spread_index, key, |_| {
                    self.spreads.push(Spread {
                        counter: ci,
                        eligible: Vec::new(),
                        domains: Vec::new(),
                        min: None,
                        min_domains: sc.min_domains,
                        group_eligible: Vec::new(),
                    });
                    self.spreads_of[ci].push(self.spreads.len() - 1);
                    spread_pods.pod.push(p);
                    spread_pods.ignore.push(sc.ignore_node_affinity);
                    spread_pods.honor.push(sc.honor_taints);
                    self.spreads.len() - 1
                });
                needs.spread.push((si, sc.max_skew, self_match));
            }
            self.pending[qi].needs = u32::try_from(self.needs.len()).unwrap_or(NONE);
            self.needs.push(needs);
        }
        spread_pods
    }

    /// The anti-affinity every running pod carries: (its node, its carrier counter) per term.
    fn index_running<'p>(
        &mut self,
        index: &mut Interner<'p>,
        nodes: &[NodeView],
        pods: &Pods<'p>,
    ) -> Vec<(usize, usize)> {
        let mut running_carriers = Vec::new();
        let carrying = pods.carrying.iter().filter_map(|&i| {
            let ni = pods.node_of.get(i).copied().flatten()?;
            Some((ni, pods.all.get(i)?)).filter(|_| ni < nodes.len())
        });
        for (ni, p) in carrying {
            for term in p.constraints.iter().flat_map(|c| &c.anti_affinity) {
                running_carriers.push((ni, index.term(self, term, true)));
            }
        }
        running_carriers
    }

    /// Domains: every node's (returned), then the bins', then a new node's per group.
    fn index_domains(
        &mut self,
        nodes: &[NodeView],
        bins: &[BinSite<'_>],
        templates: &[(&BTreeMap<String, String>, &[TaintView])],
    ) -> Vec<Vec<Option<u32>>> {
        let mut node_domains: Vec<Vec<Option<u32>>> = Vec::with_capacity(nodes.len());
        for n in nodes {
            let d = self.domains_of(&n.labels, None);
            node_domains.push(d);
        }
        for b in bins {
            let d = match (b.machine_of, b.node.and_then(|ni| node_domains.get(ni))) {
                (Some(_), _) => {
                    let host = self.take_host();
                    self.domains_of(b.labels, Some(host))
                }
                (None, Some(d)) => d.clone(),
                (None, None) => self.domains_of(b.labels, None),
            };
            self.bin_domains.push(d);
        }
        for &(labels, _) in templates {
            let d = self.domains_of(labels, None);
            self.group_domains.push(d);
        }
        node_domains
    }

    /// Counts the bound pods in the counters that select them, and the running pods' carried
    /// anti-affinity in their domains; tells each pending pod which counters count it and whose
    /// carried anti-affinity selects it. Matched once per label set, as the pods of one
    /// workload share one.
    fn count_bound(
        &mut self,
        pods: &Pods<'_>,
        node_domains: &[Vec<Option<u32>>],
        running_carriers: Vec<(usize, usize)>,
        pending_sets: &[usize],
    ) {
        let (counters, carriers) = (&self.counters, &self.carriers);
        let (counters_by_label, carriers_by_label) =
            (ByLabel::new(counters), ByLabel::new(carriers));
        let matches: Vec<(Vec<usize>, Vec<usize>)> = pods
            .sets
            .iter()
            .map(|&set| {
                (
                    counters_by_label.selecting(counters, set),
                    carriers_by_label.selecting(carriers, set),
                )
            })
            .collect();
        for (&ni, &m) in pods.node_of.iter().zip(pods.set_of) {
            let (Some(domains), Some((counted_by, _))) =
                (ni.and_then(|ni| node_domains.get(ni)), matches.get(m))
            else {
                continue;
            };
            for &ci in counted_by {
                let c = &mut self.counters[ci];
                if let Some(d) = domains[c.key] {
                    bump(c, d);
                }
            }
        }
        for (ni, ci) in running_carriers {
            let c = &mut self.carriers[ci];
            if let Some(d) = node_domains[ni][c.key] {
                bump(c, d);
            }
        }
        for (pending, &m) in self.pending.iter_mut().zip(pending_sets) {
            if m < matches.len() {
                pending.set = u32::try_from(m).unwrap_or(NONE);
            }
        }
        self.matched = matches
            .into_iter()
            .map(|(counted_by, hit_by)| Matched { counted_by, hit_by })
            .collect();
    }

    /// Spread: the eligible domains of the existing nodes, and whether each group's new nodes
    /// are eligible. For a pod that takes any node, every domain a node has: found once per
    /// key, not once per spread over all the nodes.
    fn spread_eligibility(
        &mut self,
        nodes: &[NodeView],
        node_domains: &[Vec<Option<u32>>],
        templates: &[(&BTreeMap<String, String>, &[TaintView])],
        spread_pods: &SpreadPods<'_>,
    ) {
        let mut every_domain: Vec<Option<Vec<u32>>> = vec![None; self.keys.len()];
        // The taints a pod meets on each node once it is up, for `nodeTaintsPolicy: Honor`.
        let lasting: Vec<Vec<TaintView>> = if spread_pods.honor.contains(&true) {
            nodes.iter().map(NodeView::lasting_taints).collect()
        } else {
            Vec::new()
        };
        for (si, p) in spread_pods.pod.iter().enumerate() {
            let key = self.counters[self.spreads[si].counter].key;
            let (ignore, honor) = (spread_pods.ignore[si], spread_pods.honor[si]);
            // Without a node selector or affinity, and without taints to honour, every node is
            // eligible.
            let any =
                !honor && (ignore || (p.node_selector.is_empty() && p.affinity_terms.is_empty()));
            // Whether a node (or a group's new node) with these labels and lasting taints makes
            // its domain eligible.
            let admits = |labels: &BTreeMap<String, String>, name: &str, taints: &[TaintView]| {
                (ignore || selects(p, labels, name)) && (!honor || tolerates(p, taints))
            };
            let s = &mut self.spreads[si];
            if any {
                let list = every_domain[key].get_or_insert_with(|| distinct(node_domains, key));
                for &d in list.iter() {
                    set_flag(&mut s.eligible, d, true);
                }
                s.domains.extend_from_slice(list);
            } else {
                for (ni, (n, domains)) in nodes.iter().zip(node_domains).enumerate() {
                    let Some(d) = domains[key] else {
                        continue;
                    };
                    let taints = if honor { lasting[ni].as_slice() } else { &[] };
                    if admits(&n.labels, &n.name, taints)
                        && !s.eligible.get(d as usize).copied().unwrap_or(false)
                    {
                        set_flag(&mut s.eligible, d, true);
                        s.domains.push(d);
                    }
                }
            }
            s.group_eligible = templates
                .iter()
                .map(|&(labels, taints)| admits(labels, "", taints))
                .collect();
        }
    }

    /// A domain id per key for a node with `labels`; `host` overrides the hostname label.
    fn domains_of(
        &mut self,
        labels: &BTreeMap<String, String>,
        host: Option<u32>,
    ) -> Vec<Option<u32>> {
        (0..self.keys.len())
            .map(|k| {
                if k == 0 && host.is_some() {
                    return host;
                }
                let v = labels.get(&self.keys[k])?;
                if let Some(&d) = self.values[k].get(v) {
                    return Some(d);
                }
                self.next[k] += 1;
                self.values[k].insert(v.clone(), self.next[k] - 1);
                Some(self.next[k] - 1)
            })
            .collect()
    }

    /// The spreads a place of group `g`'s template with these domains may add a domain to:
    /// those it is eligible for, where the place has a domain (a new node's hostname domain is
    /// its own) that the existing nodes did not already make eligible. Computed once the
    /// existing nodes' domains are in; a domain eligible then stays eligible.
    fn fresh_spreads(&self, g: usize, domains: &[Option<u32>]) -> Vec<usize> {
        (0..self.spreads.len())
            .filter(|&si| {
                let s = &self.spreads[si];
                let key = self.counters[s.counter].key;
                s.group_eligible.get(g).copied().unwrap_or(false)
                    && match domains.get(key).copied().flatten() {
                        Some(d) => !s.eligible.get(d as usize).copied().unwrap_or(false),
                        None => key == 0,
                    }
            })
            .collect()
    }

    /// The hostname domain the next new node gets, without taking it.
    pub(super) fn peek_host(&self) -> u32 {
        self.next[0]
    }

    /// Takes a fresh hostname domain for a new node.
    pub(super) fn take_host(&mut self) -> u32 {
        self.next[0] += 1;
        self.next[0] - 1
    }

    fn domain(&self, key: usize, place: Place) -> Option<u32> {
        match place {
            Place::Bin(i) => self.bin_domains.get(i)?.get(key).copied().flatten(),
            Place::New { host, .. } if key == 0 => Some(host),
            Place::New { group, .. } => self.group_domains.get(group)?.get(key).copied().flatten(),
        }
    }

    /// The spreads to which a pod placed at `place` may add the place's domain: see
    /// [`fresh_spreads`](Self::fresh_spreads). `None` for a bin past the index.
    fn fresh_mut(&mut self, place: Place) -> Option<&mut Vec<usize>> {
        match place {
            Place::Bin(i) => self.bin_fresh.get_mut(i),
            Place::New { group, .. } => self.group_fresh.get_mut(group),
        }
    }

    /// Whether pending pod `qi` may go to `place` as far as inter-pod constraints go.
    pub(super) fn allows(&mut self, qi: usize, place: Place) -> bool {
        const NOTHING: &Needs = &Needs {
            affinity: Vec::new(),
            self_affine: false,
            anti: Vec::new(),
            spread: Vec::new(),
            carries: Vec::new(),
        };
        let Some(&pending) = self.pending.get(qi) else {
            return true;
        };
        let needs = self.needs.get(pending.needs as usize).unwrap_or(NOTHING);
        let hit_by: &[usize] = self
            .matched
            .get(pending.set as usize)
            .map_or(&[], |m| &m.hit_by);
        if needs.affinity.is_empty()
            && needs.anti.is_empty()
            && needs.spread.is_empty()
            && hit_by.is_empty()
        {
            return true;
        }
        let exists = needs.affinity.iter().all(|&ci| {
            let c = &self.counters[ci];
            self.domain(c.key, place).is_some_and(|d| c.at(d) > 0)
        });
        if !exists {
            // The first of a series with affinity to itself may go anywhere with the keys.
            let first = needs.self_affine
                && needs.affinity.iter().all(|&ci| {
                    let c = &self.counters[ci];
                    c.total == 0 && self.domain(c.key, place).is_some()
                });
            if !first {
                return false;
            }
        }
        let clear = |list: &[Counter], ci: usize| {
            let c = &list[ci];
            self.domain(c.key, place).is_none_or(|d| c.at(d) == 0)
        };
        if !needs.anti.iter().all(|&ci| clear(&self.counters, ci))
            || !hit_by.iter().all(|&ci| clear(&self.carriers, ci))
        {
            return false;
        }
        for k in 0..needs.spread.len() {
            let (si, max_skew, self_match) = self.needs[pending.needs as usize].spread[k];
            let ci = self.spreads[si].counter;
            let Some(d) = self.domain(self.counters[ci].key, place) else {
                return false;
            };
            let count = self.counters[ci].at(d);
            let min = self.min(si);
            let s = &self.spreads[si];
            let listed = s.eligible.get(d as usize).copied().unwrap_or(false);
            let (min, domains) = if listed {
                (min, s.domains.len())
            } else {
                (
                    Some(min.map_or(count, |m| m.min(count))),
                    s.domains.len() + 1,
                )
            };
            let min = if (domains as u32) < s.min_domains {
                0
            } else {
                min.unwrap_or(count)
            };
            if i64::from(count) + i64::from(self_match) - i64::from(min) > i64::from(max_skew) {
                return false;
            }
        }
        true
    }

    /// The minimum count over a spread's eligible domains (`None`: it has none).
    fn min(&mut self, si: usize) -> Option<u32> {
        let s = &self.spreads[si];
        if s.min.is_none() && !s.domains.is_empty() {
            let c = &self.counters[s.counter];
            let m = s.domains.iter().map(|&d| c.at(d)).min();
            self.spreads[si].min = m;
        }
        self.spreads[si].min
    }

    /// Records pending pod `qi` at `place`.
    pub(super) fn place(&mut self, qi: usize, place: Place) {
        // Taken out and put back, so placing does not allocate.
        let Some((counted_by, carries)) = self.take_lists(qi) else {
            return;
        };
        let fresh = self
            .fresh_mut(place)
            .map(std::mem::take)
            .unwrap_or_default();
        // A node that is not there yet becomes a domain of the spreads it is eligible for.
        for &si in &fresh {
            let s = &self.spreads[si];
            let key = self.counters[s.counter].key;
            let Some(d) = self.domain(key, place) else {
                continue;
            };
            if s.eligible.get(d as usize).copied().unwrap_or(false) {
                continue;
            }
            let count = self.counters[s.counter].at(d);
            let s = &mut self.spreads[si];
            set_flag(&mut s.eligible, d, true);
            s.domains.push(d);
            s.min = s.min.map(|m| m.min(count));
            self.journal.push(Undo::Eligible { spread: si });
        }
        for &ci in &counted_by {
            let Some(d) = self.domain(self.counters[ci].key, place) else {
                continue;
            };
            let before = self.counters[ci].at(d);
            bump(&mut self.counters[ci], d);
            for &si in &self.spreads_of[ci] {
                let s = &mut self.spreads[si];
                if s.min == Some(before) && s.eligible.get(d as usize).copied().unwrap_or(false) {
                    s.min = None;
                }
            }
            self.journal.push(Undo::Count {
                carrier: false,
                counter: ci,
                d,
                up: true,
            });
        }
        for &ci in &carries {
            let Some(d) = self.domain(self.carriers[ci].key, place) else {
                continue;
            };
            self.count(true, ci, d, true);
            self.journal.push(Undo::Count {
                carrier: true,
                counter: ci,
                d,
                up: true,
            });
        }
        self.put_lists(qi, counted_by, carries);
        if let Some(list) = self.fresh_mut(place) {
            *list = fresh;
        }
    }

    /// Takes pod `qi`'s counts off `place`, where it runs now, before it is placed elsewhere: a
    /// pod a scale-down would move is counted at its new place only.
    pub(super) fn lift(&mut self, qi: usize, place: Place) {
        let Some((counted_by, carries)) = self.take_lists(qi) else {
            return;
        };
        for (carrier, list) in [(false, &counted_by), (true, &carries)] {
            for &ci in list {
                let c = if carrier {
                    &self.carriers[ci]
                } else {
                    &self.counters[ci]
                };
                let Some(d) = self.domain(c.key, place).filter(|&d| c.at(d) > 0) else {
                    continue;
                };
                self.count(carrier, ci, d, false);
                self.journal.push(Undo::Count {
                    carrier,
                    counter: ci,
                    d,
                    up: false,
                });
            }
        }
        self.put_lists(qi, counted_by, carries);
    }

    /// Pending pod `qi`'s counters that count it and carriers it carries, taken out of the index
    /// (so the index can change while they are read) until [`put_lists`](Self::put_lists).
    /// `None` past the pending pods.
    fn take_lists(&mut self, qi: usize) -> Option<(Vec<usize>, Vec<usize>)> {
        let p = *self.pending.get(qi)?;
        let counted_by = self
            .matched
            .get_mut(p.set as usize)
            .map(|m| std::mem::take(&mut m.counted_by))
            .unwrap_or_default();
        let carries = self
            .needs
            .get_mut(p.needs as usize)
            .map(|n| std::mem::take(&mut n.carries))
            .unwrap_or_default();
        Some((counted_by, carries))
    }

    /// Puts back what [`take_lists`](Self::take_lists) took.
    fn put_lists(&mut self, qi: usize, counted_by: Vec<usize>, carries: Vec<usize>) {
        let Some(p) = self.pending.get(qi).copied() else {
            return;
        };
        if let Some(m) = self.matched.get_mut(p.set as usize) {
            m.counted_by = counted_by;
        }
        if let Some(n) = self.needs.get_mut(p.needs as usize) {
            n.carries = carries;
        }
    }

    /// Counts one pod more (`up`) or less in counter `ci` (of the carriers, `carrier`) at
    /// domain `d`; the minimum of the spreads over it is recomputed when next asked.
    fn count(&mut self, carrier: bool, ci: usize, d: u32, up: bool) {
        let c = if carrier {
            &mut self.carriers[ci]
        } else {
            for &si in &self.spreads_of[ci] {
                self.spreads[si].min = None;
            }
            &mut self.counters[ci]
        };
        if up {
            bump(c, d);
        } else if let Some(n) = c.counts.get_mut(d as usize) {
            *n = n.saturating_sub(1);
            c.total = c.total.saturating_sub(1);
        }
    }

    /// Where [`rollback`](Self::rollback) returns to.
    pub(super) fn mark(&self) -> Mark {
        Mark {
            journal: self.journal.len(),
            next_host: self.next[0],
        }
    }

    /// Undoes every placement since `mark`.
    pub(super) fn rollback(&mut self, mark: &Mark) {
        while self.journal.len() > mark.journal {
            match self.journal.pop() {
                Some(Undo::Count {
                    carrier,
                    counter,
                    d,
                    up,
                }) => self.count(carrier, counter, d, !up),
                Some(Undo::Eligible { spread }) => {
                    let s = &mut self.spreads[spread];
                    if let Some(d) = s.domains.pop() {
                        set_flag(&mut s.eligible, d, false);
                    }
                    s.min = None;
                }
                None => break,
            }
        }
        self.next[0] = mark.next_host;
    }
}

/// The counters of one list that may select a pod, found from the pod's labels rather than by
/// trying each: at the bench's larger size (200 counters, 1,000 distinct pending label sets)
/// trying every counter on every label set was 5–8% of `decide`. A counter whose selector
/// requires a label value (`matchLabels`) is listed under its first such pair and tried only on
/// pods with that label (a counter of several terms: its first term's); one without (expressions only) is tried on every pod; one without a
/// selector selects none.
struct ByLabel<'c> {
    required: HashMap<(&'c str, &'c str), Vec<usize>>,
    others: Vec<usize>,
}

impl<'c> ByLabel<'c> {
    fn new(list: &'c [Counter]) -> Self {
        let mut required: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
        let mut others = Vec::new();
        for (i, c) in list.iter().enumerate() {
            // A pod the first term does not select is selected by none.
            let Some(sel) = c.matcher.terms.first().and_then(|t| t.selector.as_ref()) else {
                continue;
            };
            match sel.labels.iter().next() {
                Some((k, v)) => required
                    .entry((k.as_str(), v.as_str()))
                    .or_default()
                    .push(i),
                None => others.push(i),
            }
        }
        Self { required, others }
    }

    /// The counters of `list` (the list this was built from) that select the pods of `set`,
    /// ascending.
    fn selecting(&self, list: &[Counter], set: LabelSet<'_>) -> Vec<usize> {
        let mut out: Vec<usize> = self.others.clone();
        if !self.required.is_empty() {
            for (k, v) in set.1 {
                if let Some(l) = self.required.get(&(k.as_str(), v.as_str())) {
                    out.extend_from_slice(l);
                }
            }
        }
        out.retain(|&i| list[i].matcher.selects(set));
        out.sort_unstable();
        out
    }
}

fn bump(c: &mut Counter, d: u32) {
    let i = d as usize;
    if c.counts.len() <= i {
        c.counts.resize(i + 1, 0);
    }
    c.counts[i] += 1;
    c.total += 1;
}

fn set_flag(flags: &mut Vec<bool>, d: u32, v: bool) {
    let i = d as usize;
    if flags.len() <= i {
        flags.resize(i + 1, false);
    }
    flags[i] = v;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::resources::Resources;
    use crate::scaler::model::{PodConstraints, SpreadView};

    const ZONE: &str = "topology.kubernetes.io/zone";

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn node(name: &str, zone: &str) -> NodeView {
        NodeView {
            name: name.into(),
            labels: labels(&[(HOSTNAME, name), (ZONE, zone), ("pool", "x")]),
            taints: Vec::new(),
            unschedulable: false,
            scale_down_in_progress: false,
            ready: true,
            ready_transition: None,
            allocatable: Resources::default(),
            created: None,
            unneeded_since: None,
            scale_down_disabled: false,
            not_ready_in_time: false,
            ever_ready: false,
            scale_down_failed: None,
        }
    }

    /// A pending `app=web` pod spread over zones and hosts, on `pool=x` nodes only.
    fn spread_pod() -> PodView {
        let spread = |key: &str| SpreadView {
            max_skew: 1,
            topology_key: key.into(),
            selector: Some(SelectorView {
                labels: labels(&[("app", "web")]),
                expressions: Vec::new(),
            }),
            min_domains: 1,
            ignore_node_affinity: false,
            honor_taints: false,
        };
        PodView {
            namespace: "default".into(),
            name: "web".into(),
            uid: "web".into(),
            labels: labels(&[("app", "web")]),
            node: None,
            requests: Resources::default(),
            node_selector: labels(&[("pool", "x")]),
            affinity_terms: Vec::new(),
            tolerations: Vec::new(),
            constraints: Some(Box::new(PodConstraints {
                spread: vec![spread(ZONE), spread(HOSTNAME)],
                ..PodConstraints::default()
            })),
            unschedulable: true,
            fate: crate::drain::plan::Fate::Refuse(crate::drain::plan::RefuseReason::Unmanaged),
            safe_to_evict: None,
            host_path: false,
        }
    }

    /// [`ByLabel`] finds the counters trying each one finds: selectors with and without
    /// `matchLabels`, with expressions, none at all, and namespaces that do not hold the pod.
    #[test]
    fn by_label_finds_the_counters_trying_each_finds() {
        let req = |key: &str, operator: &str, values: &[&str]| Requirement {
            key: key.into(),
            operator: crate::selector::SelectorOperator::of_label_selector(operator),
            values: values.iter().map(|v| v.to_string()).collect(),
            field: false,
        };
        let sel = |pairs: &[(&str, &str)], expressions: Vec<Requirement>| {
            Some(SelectorView {
                labels: labels(pairs),
                expressions,
            })
        };
        let default = || Namespaces::Only(vec!["default".into()]);
        let matchers = [
            (default(), None),
            (default(), sel(&[], Vec::new())),
            (Namespaces::All, sel(&[("app", "web")], Vec::new())),
            (
                default(),
                sel(&[("app", "web"), ("tier", "front")], Vec::new()),
            ),
            (default(), sel(&[("tier", "front")], Vec::new())),
            (default(), sel(&[], vec![req("app", "In", &["web", "db"])])),
            (default(), sel(&[], vec![req("app", "DoesNotExist", &[])])),
            (
                default(),
                sel(&[("app", "db")], vec![req("tier", "Exists", &[])]),
            ),
            (
                Namespaces::Only(vec!["other".into()]),
                sel(&[("app", "web")], Vec::new()),
            ),
            (Namespaces::All, sel(&[("app", "web")], Vec::new())),
        ];
        let mut list: Vec<Counter> = matchers
            .into_iter()
            .map(|(namespaces, selector)| Counter {
                matcher: Matcher::one(namespaces, selector),
                key: 0,
                counts: Vec::new(),
                total: 0,
            })
            .collect();
        // A pod's affinity terms, counted together: listed by the first term's labels.
        let together = |terms: Vec<(Namespaces, Option<SelectorView>)>| Counter {
            matcher: Matcher {
                terms: terms
                    .into_iter()
                    .map(|(namespaces, selector)| Selects {
                        namespaces,
                        selector,
                    })
                    .collect(),
            },
            key: 0,
            counts: Vec::new(),
            total: 0,
        };
        list.push(together(vec![
            (default(), sel(&[("app", "web")], Vec::new())),
            (default(), sel(&[("tier", "front")], Vec::new())),
        ]));
        list.push(together(vec![
            (default(), sel(&[], vec![req("tier", "Exists", &[])])),
            (Namespaces::All, sel(&[("app", "db")], Vec::new())),
        ]));
        list.push(together(vec![
            (default(), sel(&[("app", "web")], Vec::new())),
            (default(), None),
        ]));
        let index = ByLabel::new(&list);
        let pod_labels = [
            labels(&[]),
            labels(&[("app", "web")]),
            labels(&[("app", "web"), ("tier", "front")]),
            labels(&[("app", "db"), ("tier", "back")]),
            labels(&[("tier", "front"), ("zone", "a")]),
        ];
        for ns in ["default", "other"] {
            for l in &pod_labels {
                let mut p = spread_pod();
                p.namespace = ns.into();
                p.labels = l.clone();
                let want: Vec<usize> = (0..list.len())
                    .filter(|&i| list[i].matcher.selects(set_of(&p)))
                    .collect();
                assert_eq!(index.selecting(&list, set_of(&p)), want, "{ns} {l:?}");
            }
        }
    }

    fn eligible(t: &Topology) -> Vec<BTreeSet<u32>> {
        t.spreads
            .iter()
            .map(|s| s.domains.iter().copied().collect())
            .collect()
    }

    /// Placing only looks at the spreads a place may add a domain to ([`Topology::fresh_spreads`]);
    /// the eligible domains must still be what looking at every spread gives: each spread the
    /// place's group is eligible for gains the place's domain.
    #[test]
    fn placing_adds_the_domains_looking_at_every_spread_would() {
        let nodes = vec![node("n1", "a"), node("n2", "b")];
        let pods = [spread_pod()];
        let pending: Vec<&PodView> = pods.iter().collect();
        // Groups: 0 in an existing zone, 1 in a new zone, 2 not eligible (pool y).
        let templates = [
            labels(&[(ZONE, "a"), ("pool", "x")]),
            labels(&[(ZONE, "c"), ("pool", "x")]),
            labels(&[(ZONE, "d"), ("pool", "y")]),
        ];
        let template_refs: Vec<(&BTreeMap<String, String>, &[TaintView])> =
            templates.iter().map(|l| (l, &[][..])).collect();
        // Bins: node n1, then a registering machine of each group.
        let bins: Vec<BinSite<'_>> = std::iter::once(BinSite {
            labels: &nodes[0].labels,
            machine_of: None,
            node: Some(0),
        })
        .chain(templates.iter().enumerate().map(|(g, labels)| BinSite {
            labels,
            machine_of: Some(g),
            node: None,
        }))
        .collect();
        let sets = [set_of(&pods[0])];
        let running = Pods {
            all: &[],
            node_of: &[],
            carrying: &[],
            sets: &sets,
            set_of: &[],
        };
        let mut t = Topology::new(&nodes, &running, &bins, &template_refs, &pending, &[0]);
        assert_eq!(t.spreads.len(), 2);
        let mark = t.mark();
        let initial = eligible(&t);
        let mut places = vec![Place::Bin(0), Place::Bin(1), Place::Bin(2), Place::Bin(3)];
        for g in [0, 1, 2, 1, 0] {
            let host = t.take_host();
            places.push(Place::New { group: g, host });
        }
        for place in places {
            let mut want = eligible(&t);
            let group = match place {
                Place::Bin(i) => bins[i].machine_of,
                Place::New { group, .. } => Some(group),
            };
            if let Some(g) = group {
                for (si, s) in t.spreads.iter().enumerate() {
                    let key = t.counters[s.counter].key;
                    if s.group_eligible[g]
                        && let Some(d) = t.domain(key, place)
                    {
                        want[si].insert(d);
                    }
                }
            }
            t.place(0, place);
            assert_eq!(eligible(&t), want, "after placing at {place:?}");
        }
        t.rollback(&mark);
        assert_eq!(eligible(&t), initial);
    }
}
