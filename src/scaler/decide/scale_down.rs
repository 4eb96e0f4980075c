//! Scale-down, in three phases: which nodes could go ([`candidates`]: ready, not protected,
//! light, every pod evictable under at most one budget), whether all their pods fit elsewhere now
//! ([`Room`]: budgets, room, selectors, taints and inter-pod constraints, node by node, least
//! used first), and which of the nodes so found unneeded go in this pass ([`remove`]: standby,
//! unneeded time, cool-down, the group's minimum, bulk limits). A node found needed on the way
//! loses its unneeded mark.

use super::*;

/// A node whose pods could all leave, if there is room for them elsewhere.
struct Candidate<'a> {
    node: &'a NodeView,
    group: usize,
    machine: &'a MachineView,
    utilisation: f64,
    /// The pods a drain would move, by index in `snap.pods`.
    movable: Vec<usize>,
    /// One entry per evictable pod a budget selects: the disruptions its drain takes.
    disruptions: Vec<usize>,
}

/// Scale-down: finish scale-downs in progress, find the nodes whose pods could all leave now
/// (room elsewhere, budgets), count their unneeded time, and remove those past it.
pub(super) fn scale_down<'a>(cx: &Context<'a>, plan: &mut Plan<'a>) {
    let budgets = BudgetIndex::new(&cx.snap.budgets);
    let mut needed: Vec<&NodeView> = Vec::new();
    let mut candidates = candidates(cx, plan, &budgets, &mut needed);
    candidates.sort_by(|a, b| {
        a.utilisation
            .total_cmp(&b.utilisation)
            .then_with(|| a.node.name.cmp(&b.node.name))
    });
    let unneeded = Room::new(cx, plan, &candidates).unneeded(cx, &candidates, &mut needed);
    remove(cx, plan, unneeded, &mut needed);
    for n in needed {
        if n.unneeded_since.is_some() {
            plan.actions.push(Action::ClearUnneeded {
                node: n.name.clone(),
            });
        }
    }
}

/// Phase one: the group's nodes, each either dealt with (a scale-down in progress finished or
/// cancelled, a Node left behind deleted), needed, or a candidate.
fn candidates<'a>(
    cx: &Context<'a>,
    plan: &mut Plan<'a>,
    budgets: &BudgetIndex,
    needed: &mut Vec<&'a NodeView>,
) -> Vec<Candidate<'a>> {
    let claimed: HashSet<&str> = plan
        .bins
        .iter()
        .filter(|b| b.claimed && !b.name.is_empty())
        .map(|b| b.name)
        .collect();
    let mut out = Vec::new();
    for n in &cx.snap.nodes {
        let Some(&gi) = n.group().and_then(|g| cx.groups.get(g)) else {
            continue;
        };
        let Some(machine) = in_progress(cx, plan, n, gi, needed) else {
            continue;
        };
        match candidate(
            cx,
            n,
            gi,
            machine,
            claimed.contains(n.name.as_str()),
            budgets,
        ) {
            Some(c) => out.push(c),
            None => needed.push(n),
        }
    }
    out
}

/// A node of group `gi` whose machine is gone, is being repaired, or is already being scaled
/// down is dealt with here (`None`); otherwise its machine, for [`candidate`] to judge.
fn in_progress<'a>(
    cx: &Context<'a>,
    plan: &mut Plan<'a>,
    n: &'a NodeView,
    gi: usize,
    needed: &mut Vec<&'a NodeView>,
) -> Option<&'a MachineView> {
    let group = || cx.s.groups[gi].name.clone();
    let Some(machine) = cx.machine_by_host.get(n.name.as_str()).copied() else {
        if n.scale_down_in_progress {
            // Our scale-down deleted the machine; a failure before the Node's deletion left the
            // Node behind.
            plan.actions.push(Action::DeleteNode {
                group: group(),
                node: n.name.clone(),
                reason: DeleteNodeReason::ScaledDown,
            });
        }
        return None;
    };
    if plan.repaired.contains(n.name.as_str()) {
        return None;
    }
    if n.scale_down_in_progress && n.scale_down_disabled {
        // Opted out since the scale-down began: the operator's word wins over ours.
        plan.actions.push(Action::CancelScaleDown {
            group: group(),
            node: n.name.clone(),
        });
        needed.push(n);
        return None;
    }
    if n.scale_down_in_progress {
        // A scale-down a previous pass (or scaler) started: finish it (drain is idempotent).
        plan.actions.push(Action::ScaleDown {
            group: group(),
            node: n.name.clone(),
            machine: machine.id.clone(),
            empty: cx.empty(n),
        });
        plan.size[gi] = plan.size[gi].saturating_sub(1);
        return None;
    }
    Some(machine)
}

/// Whether node `n` could go, pods aside from where they land: ready, schedulable, not
/// protected, opted out or claimed by this pass's scale-up, used below the threshold, no pod
/// pinned to it, not a drain that failed with the same pods and budgets, and each pod it would
/// move selected by at most one budget (the Eviction API refuses more).
fn candidate<'a>(
    cx: &Context<'a>,
    n: &'a NodeView,
    group: usize,
    machine: &'a MachineView,
    claimed: bool,
    budgets: &BudgetIndex,
) -> Option<Candidate<'a>> {
    let (snap, s) = (cx.snap, cx.s);
    if !n.ready
        || n.booting()
        || n.unschedulable
        || n.protected_role(&s.controller_node_labels)
        || n.scale_down_disabled
        || claimed
    {
        return None;
    }
    let no_pods = NodeUsage::default();
    let u = cx.usage(&n.name).unwrap_or(&no_pods);
    let utilisation = share(u.movable.cpu_milli, n.allocatable.cpu_milli)
        .max(share(u.movable.memory, n.allocatable.memory));
    if u.pinned || utilisation >= s.scale_down_utilization_threshold {
        return None;
    }
    let ids = cx.pod_ids_on(&n.name);
    // A drain that failed here before, with the same pods under the same budgets, would fail
    // again: wait for something to change.
    if let Some(failed) = n.scale_down_failed.as_deref() {
        let pods: Vec<&PodView> = ids.iter().map(|&i| &snap.pods[i]).collect();
        if failed == scale_down_fingerprint(&pods, &snap.budgets) {
            return None;
        }
    }
    let movable: Vec<usize> = ids
        .iter()
        .copied()
        .filter(|&i| !snap.pods[i].stays())
        .collect();
    let mut disruptions = Vec::new();
    for &i in &movable {
        let of = budgets.of(&snap.pods[i]);
        if of.len() > 1 {
            return None;
        }
        disruptions.extend(of);
    }
    Some(Candidate {
        node: n,
        group,
        machine,
        utilisation,
        movable,
        disruptions,
    })
}

/// Phase two's state: where the candidates' pods may go, as the candidates found unneeded so far
/// left it.
struct Room<'p, 'a> {
    plan: &'p Plan<'a>,
    /// Each bin's room: this pass's scale-up's leftovers, less what the pods of the nodes found
    /// unneeded took.
    free: Vec<Resources>,
    /// Whether a bin may take pods: a ready, schedulable node.
    target: Vec<bool>,
    /// A first-fit tree over `free`, as scale-up packs: a scan of every bin per pod was quadratic
    /// once many nodes were light (21 s at 5,000 nodes).
    fit: FirstFit,
    /// Each node bin's index, by node name.
    bin_of: HashMap<&'a str, usize>,
    /// Inter-pod constraints, counted as scale-up counts them, with the candidates' pods as the
    /// ones to place (`movers`, in candidate order): each is lifted off the node it leaves
    /// before it is placed again. Only when some pod has constraints.
    topo: Option<Topology>,
    /// What each budget still allows after the nodes found unneeded.
    allowed: Vec<i32>,
}

impl<'p, 'a> Room<'p, 'a> {
    fn new(cx: &'p Context<'a>, plan: &'p Plan<'a>, candidates: &[Candidate<'a>]) -> Self {
        let snap = cx.snap;
        let movers: Vec<usize> = candidates
            .iter()
            .flat_map(|c| c.movable.iter().copied())
            .collect();
        let topo = (!cx.label_set.is_empty() && !movers.is_empty()).then(|| {
            let pods: Vec<&PodView> = movers.iter().map(|&i| &snap.pods[i]).collect();
            let sets: Vec<usize> = movers
                .iter()
                .filter_map(|&i| cx.label_set.get(i).copied())
                .collect();
            topology(
                cx,
                &plan.bins,
                &plan.bin_group,
                &plan.bin_node,
                &pods,
                &sets,
            )
        });
        let bins = &plan.bins;
        let free: Vec<Resources> = bins.iter().map(|b| b.free.clone()).collect();
        let target: Vec<bool> = bins
            .iter()
            .map(|b| {
                !b.name.is_empty()
                    && cx
                        .node_by_name
                        .get(b.name)
                        .is_some_and(|n| n.ready && !n.booting() && !n.unschedulable)
            })
            .collect();
        let mut fit = FirstFit::default();
        for (i, f) in free.iter().enumerate() {
            fit.push(f);
            if !target[i] {
                fit.close(i);
            }
        }
        Self {
            plan,
            free,
            target,
            fit,
            bin_of: bins
                .iter()
                .enumerate()
                .filter(|(_, b)| !b.name.is_empty())
                .map(|(i, b)| (b.name, i))
                .collect(),
            topo,
            allowed: snap.budgets.iter().map(|b| b.disruptions_allowed).collect(),
        }
    }

    /// The candidates, least used first, whose evictions the budgets allow on top of those
    /// already taken and whose pods all fit elsewhere; the others are needed.
    fn unneeded<'c>(
        mut self,
        cx: &Context<'a>,
        candidates: &'c [Candidate<'a>],
        needed: &mut Vec<&'a NodeView>,
    ) -> Vec<&'c Candidate<'a>> {
        let mut out = Vec::new();
        // The candidates' movers are `movers` in order: this candidate's start here.
        let mut first = 0;
        for c in candidates {
            let movers = first..first + c.movable.len();
            first = movers.end;
            let mut need: BTreeMap<usize, i32> = BTreeMap::new();
            for &b in &c.disruptions {
                *need.entry(b).or_default() += 1;
            }
            if need.iter().any(|(&b, &n)| self.allowed[b] < n) || !self.moves(cx, c, movers) {
                needed.push(c.node);
                continue;
            }
            for (b, n) in need {
                self.allowed[b] -= n;
            }
            out.push(c);
        }
        out
    }

    /// Places the candidate's pods (movers `movers`) elsewhere, largest first, and keeps them
    /// there; or, when one does not fit, undoes it all and says no.
    fn moves(
        &mut self,
        cx: &Context<'a>,
        c: &Candidate<'a>,
        movers: std::ops::Range<usize>,
    ) -> bool {
        let from = self.bin_of.get(c.node.name.as_str()).copied();
        if let Some(from) = from {
            self.fit.close(from);
        }
        // (bin, its room before) for each pod placed, to undo when the node must stay.
        let mut taken: Vec<(usize, Resources)> = Vec::new();
        let mark = self.topo.as_ref().map(Topology::mark);
        if let (Some(topo), Some(from)) = (self.topo.as_mut(), from) {
            for qi in movers.clone() {
                topo.lift(qi, Place::Bin(from));
            }
        }
        // (index in `movers`, pod), largest first.
        let mut pods: Vec<(usize, &PodView)> = movers
            .zip(&c.movable)
            .map(|(qi, &i)| (qi, &cx.snap.pods[i]))
            .collect();
        pods.sort_by(|(_, a), (_, b)| {
            (b.requests.cpu_milli, b.requests.memory)
                .cmp(&(a.requests.cpu_milli, a.requests.memory))
        });
        for (qi, p) in pods {
            let Some(i) = self.place(qi, p) else {
                for (i, before) in taken.into_iter().rev() {
                    self.free[i] = before;
                    self.fit.set(i, &self.free[i]);
                }
                if let Some(from) = from.filter(|&from| self.target[from]) {
                    self.fit.set(from, &self.free[from]);
                }
                if let (Some(topo), Some(mark)) = (self.topo.as_mut(), mark) {
                    topo.rollback(&mark);
                }
                return false;
            };
            taken.push((i, self.free[i].clone()));
            self.free[i].sub(&p.requests);
            self.fit.set(i, &self.free[i]);
            if let Some(topo) = self.topo.as_mut() {
                topo.place(qi, Place::Bin(i));
            }
        }
        true
    }

    /// The first bin pod `p` (mover `qi`) fits on: room, its node selector and affinity, the
    /// bin's lasting taints, its inter-pod constraints.
    #[inline(always)]
    fn place(&mut self, qi: usize, p: &PodView) -> Option<usize> {
        let Self {
            plan,
            free,
            fit,
            topo,
            ..
        } = self;
        fit.first_where(&p.requests, |i| {
            let b = &plan.bins[i];
            if free[i].fits(&p.requests)
                && selects(p, b.labels, b.name)
                && plan.startup_free.get(i).is_some_and(|t| tolerates(p, t))
                && topo.as_mut().is_none_or(|t| t.allows(qi, Place::Bin(i)))
            {
                Probe::Take
            } else {
                Probe::Skip
            }
        })
    }
}

/// Phase three: of the unneeded nodes, least used first, those that go now. Standby keeps that
/// many empty nodes per group; a node is first marked unneeded, and goes once it has been so
/// for `scale_down_unneeded_time`, with no scale-up in this pass and none within
/// `scale_down_delay_after_add`, its group above its minimum, at most `max_empty_bulk_delete`
/// empty nodes and one busy node per pass.
fn remove<'a>(
    cx: &Context<'a>,
    plan: &mut Plan<'a>,
    unneeded: Vec<&Candidate<'a>>,
    needed: &mut Vec<&'a NodeView>,
) {
    let (now, s) = (cx.now, cx.s);
    let scaling_up = plan.planned.iter().any(|&p| p > 0);
    // cluster-autoscaler's --scale-down-delay-after-add, cluster-wide as there: the last
    // scale-up is the newest machine of a configured group (its creation time at the provider).
    let last_add = cx
        .snap
        .machines
        .iter()
        .filter(|m| cx.groups.contains_key(m.group.as_str()))
        .map(|m| m.created)
        .max();
    let cooling_down = !s.scale_down_delay_after_add.is_zero()
        && last_add.is_some_and(|t| elapsed(now, t) < s.scale_down_delay_after_add);
    let mut keep: Vec<u32> = s.groups.iter().map(|g| g.standby).collect();
    let (mut empties_removed, mut busy_removed) = (0u32, 0u32);
    for c in unneeded {
        let is_empty = c.movable.is_empty();
        if is_empty && keep[c.group] > 0 {
            keep[c.group] -= 1;
            needed.push(c.node);
            continue;
        }
        let Some(since) = c.node.unneeded_since else {
            plan.actions.push(Action::MarkUnneeded {
                node: c.node.name.clone(),
                since: now,
            });
            continue;
        };
        if scaling_up || cooling_down || elapsed(now, since) < s.scale_down_unneeded_time {
            continue;
        }
        if plan.size[c.group] <= s.groups[c.group].min {
            continue;
        }
        let room = if is_empty {
            empties_removed < s.max_empty_bulk_delete
        } else {
            busy_removed < 1
        };
        if !room {
            continue;
        }
        if is_empty {
            empties_removed += 1;
        } else {
            busy_removed += 1;
        }
        plan.size[c.group] -= 1;
        plan.actions.push(Action::ScaleDown {
            group: s.groups[c.group].name.clone(),
            node: c.node.name.clone(),
            machine: c.machine.id.clone(),
            empty: is_empty,
        });
    }
}
