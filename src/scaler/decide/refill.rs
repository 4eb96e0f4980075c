//! Refill: the new nodes earlier rounds of a scale-up planned, offered again to the pods a
//! spread or a pod affinity kept off them.
//!
//! A round plans one group's new nodes and packs them first fit; a pod whose zone spread was at
//! its skew in that group's zone is left for a later round. Once other rounds have put pods in
//! the other zones, the skew allows it in the first zone again, and the node planned there may
//! still have room. Without this, every later round opened a fresh node for it: 30 pods of a
//! zone spread over three single-zone groups asked for 21 nodes where 6 hold them.
//! Anti-affinity only ever closes places, so pods with nothing else are not looked at again,
//! and a pass whose pending pods have neither spread nor affinity does no refill work at all.

use super::*;

/// A new node a round planned, with the room it has left.
struct Opened {
    group: usize,
    /// Its hostname domain, as the round took it.
    host: u32,
    free: Resources,
    /// Its round's [`Action::ScaleUp`], which lists the pods it takes.
    action: usize,
}

/// The planned nodes and the pods that may go to them.
pub(super) struct Refill {
    /// The pods (indexes into the unplaced pods) with a spread or an affinity, in packing
    /// order, each with the groups whose template takes it.
    pods: Vec<(usize, Vec<usize>)>,
    /// The least CPU, memory and pod slots any of them requests: a node with less room left
    /// takes none of them, and is not looked at again.
    floor: Resources,
    opened: Vec<Opened>,
}

impl Refill {
    /// The refill for `unplaced` (`candidates`: per group, the pods its template takes); `None`
    /// when no pod could use one: none has a spread or an affinity a group's nodes can meet.
    pub(super) fn new(
        topo: &Topology,
        unplaced: &[&PodView],
        unplaced_q: &[usize],
        candidates: &[Vec<usize>],
    ) -> Option<Self> {
        let mut groups_of: Vec<Option<Vec<usize>>> = unplaced_q
            .iter()
            .map(|&qi| topo.may_open_later(qi).then(Vec::new))
            .collect();
        if groups_of.iter().all(Option::is_none) {
            return None;
        }
        for (gi, list) in candidates.iter().enumerate() {
            for &pi in list {
                if let Some(Some(groups)) = groups_of.get_mut(pi) {
                    groups.push(gi);
                }
            }
        }
        let pods: Vec<(usize, Vec<usize>)> = groups_of
            .into_iter()
            .enumerate()
            .filter_map(|(pi, g)| g.filter(|g| !g.is_empty()).map(|g| (pi, g)))
            .collect();
        let floor = pods.iter().fold(no_floor(), |f, &(pi, _)| {
            floor_with(&f, &unplaced[pi].requests)
        });
        (!pods.is_empty()).then(|| Refill {
            pods,
            floor,
            opened: Vec::new(),
        })
    }

    /// Records the nodes of expansion `o` (its hostnames from `first_host` on, its pods'
    /// requests taken from `t.free`), planned by action `action`.
    pub(super) fn planned(
        &mut self,
        o: &Expansion,
        t: &Template,
        first_host: u32,
        unplaced: &[&PodView],
        action: usize,
    ) {
        let start = self.opened.len();
        self.opened.extend((0..o.nodes).map(|j| Opened {
            group: o.group,
            host: first_host + j,
            free: t.free.clone(),
            action,
        }));
        for (&pi, &j) in o.placed.iter().zip(&o.on_node) {
            if let Some(n) = self.opened.get_mut(start + j) {
                n.free.sub(&unplaced[pi].requests);
            }
        }
    }

    /// Places the remaining pods that the planned nodes now allow, first fit in the order the
    /// nodes were planned, until a pass places none (a placement may open a place to a pod
    /// looked at before it); each goes on its node's action.
    pub(super) fn fill(
        &mut self,
        topo: &mut Topology,
        unplaced: &[&PodView],
        unplaced_q: &[usize],
        remaining: &mut [bool],
        actions: &mut [Action],
    ) {
        self.pods.retain(|&(pi, _)| remaining[pi]);
        let floor = &self.floor;
        self.opened.retain(|n| n.free.fits(floor));
        let mut open: Vec<usize> = Vec::new();
        let mut placed_any = true;
        while placed_any {
            placed_any = false;
            for (pi, groups) in &self.pods {
                let pi = *pi;
                if !remaining[pi] {
                    continue;
                }
                let (p, qi) = (unplaced[pi], unplaced_q[pi]);
                // The groups whose nodes may take it, judged once per group.
                open.clear();
                open.extend(
                    groups
                        .iter()
                        .copied()
                        .filter(|&group| !topo.closed_to_group(qi, group)),
                );
                if open.is_empty() {
                    continue;
                }
                let Some(n) = self.opened.iter_mut().find(|n| {
                    open.contains(&n.group)
                        && n.free.fits(&p.requests)
                        && topo.allows(
                            qi,
                            Place::New {
                                group: n.group,
                                host: n.host,
                            },
                        )
                }) else {
                    continue;
                };
                n.free.sub(&p.requests);
                let place = Place::New {
                    group: n.group,
                    host: n.host,
                };
                topo.place(qi, place);
                remaining[pi] = false;
                placed_any = true;
                if let Some(Action::ScaleUp { pods, .. }) = actions.get_mut(n.action) {
                    pods.push(p.key());
                }
            }
        }
    }
}
