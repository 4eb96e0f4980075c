use std::sync::Arc;

use serde_json::json;

use super::*;

/// A budget selecting `app=web` in `default` with this status.
fn budget(expected: i32, desired: i32, current: i32) -> PodDisruptionBudget {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "generation": 2},
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
        "status": {"observedGeneration": 2, "expectedPods": expected, "desiredHealthy": desired,
            "currentHealthy": current, "disruptionsAllowed": (current - desired).max(0)}
    }))
    .expect("valid budget")
}

/// A Pending `app=web` replica in `default`, with the scheduler's verdict if any.
fn pending(name: &str, scheduler: Option<&str>) -> Pod {
    let conditions = scheduler.map_or(json!([]), |reason| {
        json!([{"type": "PodScheduled", "status": "False", "reason": reason,
            "message": "0/3 nodes are available: 3 node(s) were unschedulable."}])
    });
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Pending", "conditions": conditions}
    }))
    .expect("valid pod")
}

/// A node, cordoned or not, Ready or not.
fn node(name: &str, cordoned: bool, ready: bool) -> Arc<Node> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"unschedulable": cordoned},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .expect("valid node"),
    )
}

/// The judgement of the cases that do not ask about autoscalers.
const NO_AUTOSCALER: Autoscaler = Autoscaler::Absent;

fn with(mut p: Pod, f: impl FnOnce(&mut Pod)) -> Pod {
    f(&mut p);
    p
}

#[test]
fn a_budget_that_requires_every_pod_never_allows_one() {
    let why = judge(
        &budget(3, 3, 3),
        [],
        None,
        "a",
        Wanted::NoOwner,
        NO_AUTOSCALER,
    )
    .expect("unsatisfiable");
    assert_eq!(
        why,
        Why::NeverAllows {
            budget: "default/web".into(),
            desired_healthy: 3,
            expected: 3
        }
    );
    assert!(why.to_string().contains("requires 3 healthy pods of the 3"));
}

/// A case: what it shows, the budget, the Pending pods, the nodes known.
type Case<'a> = (
    &'a str,
    PodDisruptionBudget,
    Vec<Pod>,
    Option<&'a [Arc<Node>]>,
);

#[test]
fn what_may_still_open_is_waited_for() {
    let others_up = [node("a", true, true), node("b", false, true)];
    let only_cordoned = [node("a", true, true)];
    let cases: Vec<Case<'_>> = vec![
        ("allows one now", budget(3, 2, 3), vec![], None),
        (
            "a replacement the scheduler has not judged yet",
            budget(3, 2, 2),
            vec![pending("r1", None)],
            Some(&others_up),
        ),
        (
            "pending for another reason than Unschedulable",
            budget(3, 2, 2),
            vec![pending("r1", Some("SchedulingGated"))],
            None,
        ),
        (
            "a pod short but not pending (crash-looping elsewhere, say)",
            budget(3, 2, 2),
            vec![],
            Some(&only_cordoned),
        ),
        (
            "fewer stuck than the budget tolerates",
            budget(4, 2, 2),
            vec![pending("r1", Some("Unschedulable"))],
            None,
        ),
        (
            "a stuck pod of another workload",
            budget(3, 2, 2),
            vec![with(pending("r1", Some("Unschedulable")), |p| {
                p.metadata.labels = Some([("app".into(), "db".into())].into());
            })],
            None,
        ),
        (
            "a stuck pod of another namespace",
            budget(3, 2, 2),
            vec![with(pending("r1", Some("Unschedulable")), |p| {
                p.metadata.namespace = Some("other".into());
            })],
            None,
        ),
        (
            "a preemption under way for it",
            budget(3, 2, 2),
            vec![with(pending("r1", Some("Unschedulable")), |p| {
                if let Some(s) = p.status.as_mut() {
                    s.nominated_node_name = Some("b".into());
                }
            })],
            None,
        ),
        (
            "being deleted",
            budget(3, 2, 2),
            vec![with(pending("r1", Some("Unschedulable")), |p| {
                p.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        jiff::Timestamp::UNIX_EPOCH,
                    ));
            })],
            None,
        ),
        (
            "a status older than the budget's spec",
            with_budget(budget(3, 3, 3), |b| b.metadata.generation = Some(3)),
            vec![],
            None,
        ),
        (
            "no status yet",
            with_budget(budget(3, 3, 3), |b| b.status = None),
            vec![],
            None,
        ),
        ("expects no pods", budget(0, 0, 0), vec![], None),
    ];
    for (case, b, pods, nodes) in cases {
        assert_eq!(
            judge(&b, &pods, nodes, "a", Wanted::NoOwner, NO_AUTOSCALER),
            None,
            "{case}"
        );
    }
}

fn with_budget(
    mut b: PodDisruptionBudget,
    f: impl FnOnce(&mut PodDisruptionBudget),
) -> PodDisruptionBudget {
    f(&mut b);
    b
}

#[test]
fn replacements_the_scheduler_cannot_place_close_the_budget() {
    let pods = [
        pending("r1", Some("Unschedulable")),
        pending("r2", Some("Unschedulable")),
    ];
    let why = judge(
        &budget(4, 2, 2),
        &pods,
        None,
        "a",
        Wanted::NoOwner,
        NO_AUTOSCALER,
    )
    .expect("unsatisfiable");
    let Why::Unschedulable {
        stuck, tolerates, ..
    } = &why
    else {
        panic!("{why:?}");
    };
    assert_eq!(*tolerates, 2);
    assert_eq!(stuck.len(), 2);
    assert!(
        matches!(&stuck[0].1, Stuck::Unschedulable(m) if m.contains("unschedulable")),
        "{stuck:?}"
    );
    assert!(why.to_string().contains("default/r1"), "{why}");
}

#[test]
fn with_no_other_node_taking_pods_an_unjudged_replacement_is_stuck_too() {
    let pods = [pending("r1", None)];
    let cases: [(&str, Vec<Arc<Node>>, bool); 5] = [
        ("only the draining node", vec![node("a", false, true)], true),
        (
            "others cordoned",
            vec![node("a", true, true), node("b", true, true)],
            true,
        ),
        (
            "others NotReady",
            vec![node("a", true, true), node("b", false, false)],
            true,
        ),
        (
            "one other takes pods",
            vec![node("a", true, true), node("b", false, true)],
            false,
        ),
        ("no node known (empty list)", vec![], true),
    ];
    for (case, nodes, hopeless) in cases {
        let why = judge(
            &budget(3, 2, 2),
            &pods,
            Some(&nodes),
            "a",
            Wanted::NoOwner,
            NO_AUTOSCALER,
        );
        assert_eq!(why.is_some(), hopeless, "{case}: {why:?}");
        if let Some(Why::Unschedulable { stuck, .. }) = why {
            assert_eq!(stuck[0].1, Stuck::NoNode, "{case}");
        }
    }
}

/// Issue 58: with an integer `minAvailable` the budget expects the pods that exist. Between an
/// evicted pod's deletion and its replacement's creation it reads "requires 2 healthy of the 2",
/// but its ReplicaSet wants 3: the budget is short only by a replacement not created yet, slow.
#[test]
fn a_budget_short_only_by_uncreated_replacements_is_slow() {
    let b = budget(2, 2, 2);
    let cases = [
        (
            "the owner wants one more than exist",
            Wanted::Replicas(3),
            None,
        ),
        ("the owner's count not known yet", Wanted::Unknown, None),
        ("the owner wants what exists", Wanted::Replicas(2), Some(2)),
        (
            "the owner was scaled below what exists",
            Wanted::Replicas(1),
            Some(2),
        ),
        ("no owner to ask: what exists", Wanted::NoOwner, Some(2)),
    ];
    for (case, wanted, never) in cases {
        let why = judge(&b, [], None, "a", wanted, NO_AUTOSCALER);
        let expected = why.as_ref().and_then(|w| match w {
            Why::NeverAllows { expected, .. } => Some(*expected),
            _ => None,
        });
        assert_eq!(expected, never, "{case}: {why:?}");
    }
}

/// What the owner wants counts in what the budget tolerates, and replacements the scheduler
/// cannot place still close it when they are as many as it tolerates.
#[test]
fn uncreated_replacements_count_as_tolerated_not_as_stuck() {
    let one = [pending("r1", Some("Unschedulable"))];
    // 3 exist (1 of them stuck), the owner wants 4, 2 must be healthy: 2 tolerated, 1 stuck.
    let why = judge(
        &budget(3, 2, 2),
        &one,
        None,
        "a",
        Wanted::Replicas(4),
        NO_AUTOSCALER,
    );
    assert_eq!(why, None);
    let two = [
        pending("r1", Some("Unschedulable")),
        pending("r2", Some("Unschedulable")),
    ];
    let why = judge(
        &budget(3, 2, 1),
        &two,
        None,
        "a",
        Wanted::Replicas(4),
        NO_AUTOSCALER,
    );
    assert!(
        matches!(why, Some(Why::Unschedulable { tolerates: 2, .. })),
        "{why:?}"
    );
}

/// Issue 58: a replacement no node takes is stuck only where no autoscaler could add a node.
#[test]
fn an_autoscaler_makes_an_unplaceable_replacement_slow() {
    let pods = [pending("r1", Some("Unschedulable"))];
    let only_draining = [node("a", true, true)];
    for (autoscaler, hopeless) in [
        (Autoscaler::Absent, true),
        (Autoscaler::Present, false),
        (Autoscaler::Unknown, false),
    ] {
        let why = judge(
            &budget(3, 2, 2),
            &pods,
            Some(&only_draining),
            "a",
            Wanted::Replicas(3),
            autoscaler,
        );
        assert_eq!(why.is_some(), hopeless, "{autoscaler:?}: {why:?}");
    }
    // Arithmetic no node changes: an autoscaler does not open it.
    let why = judge(
        &budget(3, 3, 3),
        [],
        None,
        "a",
        Wanted::Replicas(3),
        Autoscaler::Present,
    );
    assert!(matches!(why, Some(Why::NeverAllows { .. })), "{why:?}");
}
