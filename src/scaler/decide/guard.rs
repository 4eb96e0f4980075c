//! The cluster-health guard: too many nodes NotReady (in the cluster, or in one group) is an
//! outage, not broken machines; repairs and scale-down wait.

use super::*;

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

/// One group's NotReady nodes (first boots aside) among its nodes, and whether the per-group
/// guard holds: more than one NotReady *and* more than `max_unready_group_percent` % of them.
pub(super) struct GroupHealth {
    pub(super) unready: u32,
    pub(super) total: u32,
    pub(super) holds: bool,
}

pub(super) fn unready_by_group(cx: &Context<'_>) -> Vec<GroupHealth> {
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
pub(super) struct UnreadyBudget {
    pub(super) left: u32,
    pub(super) held: u32,
    pub(super) cluster_guard: bool,
    pub(super) group_held: Vec<Option<u32>>,
}

impl UnreadyBudget {
    /// Takes one for group `gi`, or counts it as held.
    pub(super) fn take(&mut self, gi: usize) -> bool {
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

/// From when a NotReady node's time counts towards `unready_delete_time`: its own NotReady
/// transition (`since`), or the last pass a guard over it held (the cluster's, or its group's),
/// whichever is later. An outage's nodes come back one by one: the guard lets go once few are
/// left NotReady, and a node whose kubelet reports a second later than the others must not be
/// taken for a broken machine because the outage itself lasted longer than `unready_delete_time`.
pub(super) fn unready_since(
    snap: &Snapshot,
    group: &str,
    since: Option<Timestamp>,
) -> Option<Timestamp> {
    [snap.guard_held.get(""), snap.guard_held.get(group)]
        .into_iter()
        .flatten()
        .copied()
        .chain(since)
        .max()
}

/// The guards' memory after a pass, for the status ConfigMap: each guard that held in `actions`
/// (a [`Action::GuardHolds`]) at `now`, the others as they were, forgetting what is older than
/// `keep` (`unready_delete_time`: no NotReady time counts from further back than that anyway).
pub fn remember_guards(
    before: &BTreeMap<String, Timestamp>,
    actions: &[Action],
    now: Timestamp,
    keep: std::time::Duration,
) -> BTreeMap<String, Timestamp> {
    let mut held = before.clone();
    for a in actions {
        if let Action::GuardHolds { group, .. } = a {
            held.insert(group.clone().unwrap_or_default(), now);
        }
    }
    held.retain(|_, at| elapsed(now, *at) < keep);
    held
}
