//! Repair: machines that never registered (or whose node stayed NotReady) deleted and replaced,
//! within the guard; Nodes left without a machine deleted.

use super::*;

/// Repair: machines that never became nodes, nodes that never became ready or stopped being;
/// the back-off their failures cause, and the back-off a recovered group no longer needs. While
/// the cluster-health guard holds (`guard`: NotReady and total nodes), no NotReady node is
/// replaced and no Node deleted; otherwise at most `max_unready_repairs_per_pass` of them.
pub(super) fn repair<'a>(cx: &Context<'a>, plan: &mut Plan<'a>, guard: Option<(u32, u32)>) {
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

/// Machines that never registered, never became ready, or whose Node has been NotReady too
/// long; returns the failures per group (NotReady nodes are no failure of the group's).
pub(super) fn repair_machines<'a>(
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
                let own = n.ready_transition.or(n.created).unwrap_or(m.created);
                let since = unready_since(snap, &m.group, Some(own)).unwrap_or(own);
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
pub(super) fn delete_machineless_nodes<'a>(
    cx: &Context<'a>,
    plan: &mut Plan<'a>,
    budget: &mut UnreadyBudget,
) {
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
        let own = n.ready_transition.or(n.created);
        if unready_since(snap, &s.groups[gi].name, own)
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
