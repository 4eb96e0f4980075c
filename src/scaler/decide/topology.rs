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
//! placing a pod does not look at every spread of the pass. When the eligible groups offer more
//! than one domain of a spread's key (zones, regions), those domains count from the start, empty
//! ones included, as Karpenter counts its NodePool's zones (`index::offered_domains`): a zone
//! spread on an empty cluster is spread over every zone the groups offer, not met in the first.
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
//!
//! The types are here; `index.rs` builds the counters from a pass's pods and nodes, `place.rs`
//! answers whether a place allows a pod and keeps the counts as pods are placed and undone.

use std::collections::{BTreeMap, HashMap};

mod index;
mod place;

use place::{ByLabel, bump, set_flag};

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
