//! Building the index: the running pods counted once per counter, each pending pod compiled into
//! the counters it checks and bumps, the domains, and which spreads a new node may add to.

use super::*;

/// The index of `item`, added with `add` when it is new.
pub(super) fn intern<T: PartialEq + Eq + std::hash::Hash + Clone, S: std::hash::BuildHasher>(
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
pub(super) struct Interner<'p> {
    pub(super) keys: FastMap<String, usize>,
    pub(super) counters: FastMap<(Matcher, usize), usize>,
    pub(super) carriers: FastMap<(Matcher, usize), usize>,
    /// (anti-affinity term, whether a carrier counter) → counter.
    pub(super) by_term: FastMap<(&'p PodTermView, bool), usize>,
    /// A pod's affinity terms → their counters, one per term.
    pub(super) by_affinity: FastMap<&'p [PodTermView], Vec<usize>>,
    /// (namespace, selector, topology key) of a spread constraint → counter.
    pub(super) by_spread: FastMap<(&'p str, &'p Option<SelectorView>, &'p str), usize>,
}

impl<'p> Interner<'p> {
    pub(super) fn key(&mut self, t: &mut Topology, k: &str) -> usize {
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

    pub(super) fn counter(
        &mut self,
        t: &mut Topology,
        carrier: bool,
        m: Matcher,
        key: usize,
    ) -> usize {
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
    pub(super) fn term(&mut self, t: &mut Topology, term: &'p PodTermView, carrier: bool) -> usize {
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
    pub(super) fn affinity(&mut self, t: &mut Topology, terms: &'p [PodTermView]) -> Vec<usize> {
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
    pub(super) fn spread(&mut self, t: &mut Topology, ns: &'p str, sc: &'p SpreadView) -> usize {
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
pub(super) struct SpreadPods<'p> {
    pub(super) pod: Vec<&'p PodView>,
    pub(super) ignore: Vec<bool>,
    pub(super) honor: Vec<bool>,
}

/// The domains of key `key` the eligible groups may create nodes in, when they offer more than
/// one (zones, regions, any label their templates vary): a spread counts them as its domains
/// before any node is there, as the scheduler will once the nodes are, and as Karpenter counts
/// its NodePool's zones. Without it the first zone a tie picked was the only domain, every pod
/// of a zone spread "met" it there, and the scale-up put the whole spread in one zone. A key
/// the groups do not vary (or the hostname, each new node's own) adds nothing: a new node adds
/// its domain once a pod is placed on it, as before.
pub(super) fn offered_domains(
    group_domains: &[Vec<Option<u32>>],
    eligible: &[bool],
    key: usize,
) -> Vec<u32> {
    if key == 0 {
        return Vec::new();
    }
    let mut offered: Vec<u32> = group_domains
        .iter()
        .zip(eligible)
        .filter(|&(_, &e)| e)
        .filter_map(|(domains, _)| domains.get(key).copied().flatten())
        .collect();
    offered.sort_unstable();
    offered.dedup();
    if offered.len() < 2 {
        offered.clear();
    }
    offered
}

/// The distinct domains of key `key` among the nodes' domains, in the nodes' order.
pub(super) fn distinct(node_domains: &[Vec<Option<u32>>], key: usize) -> Vec<u32> {
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
    pub(in crate::scaler::decide) fn new(
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
    pub(super) fn empty(pending: usize) -> Self {
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
    pub(super) fn index_pending<'p>(
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
    pub(super) fn index_running<'p>(
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
    pub(super) fn index_domains(
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
    pub(super) fn count_bound(
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
    pub(super) fn spread_eligibility(
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
            let offered = offered_domains(&self.group_domains, &s.group_eligible, key);
            for d in offered {
                if !s.eligible.get(d as usize).copied().unwrap_or(false) {
                    set_flag(&mut s.eligible, d, true);
                    s.domains.push(d);
                }
            }
        }
    }

    /// A domain id per key for a node with `labels`; `host` overrides the hostname label.
    pub(super) fn domains_of(
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
    pub(super) fn fresh_spreads(&self, g: usize, domains: &[Option<u32>]) -> Vec<usize> {
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
}
