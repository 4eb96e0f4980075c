//! Scale-up: pending pods packed first-fit-decreasing onto free room, coming nodes and planned
//! machines, then onto new nodes of the group the expander picks; `min` and standby kept; boots
//! capped.

use super::*;

/// The inter-pod constraints of `movers` (pods to place: pending ones, or those a scale-down
/// would move; `sets`: each one's label set) indexed against the snapshot and the packing's
/// bins.
pub(super) fn topology(
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
pub(super) fn scale_up<'a>(cx: &'a Context<'a>, plan: &mut Plan<'a>) {
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
    let mut refill = Refill::new(&topo, &unplaced, &unplaced_q, &candidates);
    // Per group, its scale-up action of this pass.
    let mut action_of: Vec<Option<usize>> = vec![None; templates.len()];
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
        let first_host = topo.peek_host();
        o.place(&mut topo, &mut remaining, &unplaced_q);
        let action = grow_action(
            actions,
            &mut action_of[o.group],
            &s.groups[o.group].name,
            o,
            &unplaced,
        );
        if let Some(r) = refill.as_mut() {
            r.planned(o, &templates[o.group], first_host, &unplaced, action);
            r.fill(&mut topo, &unplaced, &unplaced_q, &mut remaining, actions);
        }
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

/// Grows the group's one scale-up action of the pass (`action`: its index in `actions`, once
/// there is one) by expansion `o`: a group chosen again, in a spread's later round, asks once
/// for all its nodes. Returns the action's index.
fn grow_action(
    actions: &mut Vec<Action>,
    action: &mut Option<usize>,
    group: &str,
    o: &Expansion,
    unplaced: &[&PodView],
) -> usize {
    let i = *action.get_or_insert_with(|| {
        actions.push(Action::ScaleUp {
            group: group.to_string(),
            count: 0,
            reason: ScaleUpReason::PendingPods,
            pods: Vec::new(),
        });
        actions.len() - 1
    });
    if let Some(Action::ScaleUp { count, pods, .. }) = actions.get_mut(i) {
        *count += o.nodes;
        pods.extend(o.placed.iter().map(|&pi| unplaced[pi].key()));
    }
    i
}

/// The pods one group's expansion may take: its candidates in order, the floors of what they
/// request, and which are still unplaced.
pub(super) struct Candidates<'c, 'p> {
    pub(super) list: &'c [usize],
    pub(super) floors: &'c [Resources],
    pub(super) unplaced: &'c [&'p PodView],
    pub(super) unplaced_q: &'c [usize],
    pub(super) remaining: &'c [bool],
}

/// One group's trial: up to `room` new nodes of template `t`, packed first fit with its
/// candidates; marks in `blocked` the pods only (anti-)affinity or spread kept off a new node.
/// The trial's placements are undone after it: groups are compared on one state.
// Inlined: a phase of scale_up, called per group and round. Split out without it, the scaler bench's
// decide time rose by half (15.5 -> 24 ms at 1,000 nodes, 132 -> 206 ms at 5,000 light nodes).
#[inline(always)]
pub(super) fn trial(
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
        // Not probed node by node (on a spread's later rounds, most of decide's time).
        if topo.closed_to_group(qi, gi) {
            blocked[pi] |= (nodes.len() as u32) < room;
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
    Some(Expansion::new(
        gi,
        t,
        nodes.len() as u32,
        &requested,
        placed,
        on_node,
    ))
}

/// The expansion the configured expander picks among `options`. The random expander's
/// generator is seeded on its first draw, from `now` and the unplaced pods' UIDs.
pub(super) fn choose<'o>(
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
pub(super) fn existing_bins<'a>(cx: &'a Context<'a>, plan: &mut Plan<'a>) {
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
pub(super) fn pending_order(cx: &Context<'_>) -> (Vec<usize>, Vec<usize>) {
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
pub(super) fn pack_onto_bins(
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
pub(super) fn template_candidates(
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
            let mut floor = vec![no_floor(); list.len() + 1];
            for (k, &pi) in list.iter().enumerate().rev() {
                floor[k] = floor_with(&floor[k + 1], &unplaced[pi].requests);
            }
            floor
        })
        .collect();
    (candidates, floors)
}

/// What the expansion left: the pods not placed, and why no group took them.
pub(super) struct Leftover<'l, 'p> {
    pub(super) unplaced: &'l [&'p PodView],
    pub(super) remaining: &'l [bool],
    pub(super) blocked: &'l [Vec<bool>],
    pub(super) backing_off: &'l [bool],
    pub(super) planned: &'l [u32],
    pub(super) size: &'l [u32],
}

/// A `NoScaleUp` for each pod no group took, saying for each group why not.
pub(super) fn why_no_scale_up(
    cx: &Context<'_>,
    left: &Leftover<'_, '_>,
    actions: &mut Vec<Action>,
) {
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
pub(super) fn min_and_standby(cx: &Context<'_>, plan: &mut Plan<'_>) {
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
pub(super) fn cap_boots(cx: &Context<'_>, plan: &mut Plan<'_>) {
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
