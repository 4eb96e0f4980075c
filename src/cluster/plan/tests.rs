use serde_json::{Value, json};

use super::*;

/// A running pod named `name` on node n1, owned by `kind`, with `priority` and `extra` merged in.
fn pod(name: &str, kind: Option<&str>, priority: i32, extra: Value) -> Pod {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "ns", "uid": name},
        "spec": {"nodeName": "n1", "priority": priority, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"}
    });
    if let Some(kind) = kind {
        v["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind,
            "name": "owner", "uid": "o", "controller": true}]);
    }
    merge(&mut v, extra);
    serde_json::from_value(v).expect("pod")
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn claim() -> Value {
    json!({"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}})
}

fn bands() -> Vec<Band> {
    crate::config::Settings::default().drain.waves
}

/// The only DaemonSet: ns/owner.
fn ds_exists(ns: &str, name: &str) -> bool {
    (ns, name) == ("ns", "owner")
}

fn rules() -> LeaveRules {
    LeaveRules {
        force: false,
        delete_emptydir_data: true,
    }
}

/// The plan's waves as (tier, priority, pod names).
fn waves_of(pods: &[Pod]) -> Vec<(Tier, i32, Vec<String>)> {
    plan(pods, rules(), &bands(), &ds_exists, &BTreeSet::new())
        .waves
        .into_iter()
        .map(|w| {
            let names = w.pods.into_iter().map(|p| p.name).collect();
            (w.key.tier, w.key.priority, names)
        })
        .collect()
}

#[test]
fn tiers() {
    let cases = [
        (
            "a Deployment's pod",
            pod("a", Some("ReplicaSet"), 0, json!({})),
            Tier::Stateless,
        ),
        (
            "a StatefulSet's pod",
            pod("b", Some("StatefulSet"), 0, json!({})),
            Tier::Stateful,
        ),
        (
            "a StatefulSet's pod with a claim",
            pod("c", Some("StatefulSet"), 0, claim()),
            Tier::Volumes,
        ),
        (
            "a Deployment's pod with a claim",
            pod("d", Some("ReplicaSet"), 0, claim()),
            Tier::Volumes,
        ),
        (
            "an emptyDir and a ConfigMap stay on the node",
            pod(
                "e",
                Some("ReplicaSet"),
                0,
                json!({"spec": {"volumes": [
                {"name": "s", "emptyDir": {}}, {"name": "c", "configMap": {"name": "x"}}]}}),
            ),
            Tier::Stateless,
        ),
        (
            "a CSI volume does not",
            pod(
                "f",
                Some("ReplicaSet"),
                0,
                json!({"spec": {"volumes": [
                {"name": "s", "csi": {"driver": "d"}}]}}),
            ),
            Tier::Volumes,
        ),
    ];
    for (what, p, want) in cases {
        assert_eq!(Tier::of(&p), want, "{what}");
    }
}

/// The order: lower bands first (system-critical last); within a band stateless, stateful, with
/// volumes; within a tier, lower priority first; one wave per distinct key.
#[test]
fn waves_in_order() {
    let critical = 2_000_000_000;
    let pods = [
        pod("db-0", Some("StatefulSet"), 1000, claim()),
        pod("cache-0", Some("StatefulSet"), 0, json!({})),
        pod("web-2", Some("ReplicaSet"), 1000, json!({})),
        pod("batch", Some("Job"), -10, json!({})),
        pod("web-1", Some("ReplicaSet"), 0, json!({})),
        pod("web-0", Some("ReplicaSet"), 0, json!({})),
        pod("dns", Some("ReplicaSet"), critical, json!({})),
        pod("uploads", Some("ReplicaSet"), -10, claim()),
    ];
    let names = |n: &[&str]| n.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(
        waves_of(&pods),
        vec![
            (Tier::Stateless, -10, names(&["batch"])),
            (Tier::Stateless, 0, names(&["web-0", "web-1"])),
            (Tier::Stateless, 1000, names(&["web-2"])),
            (Tier::Stateful, 0, names(&["cache-0"])),
            (Tier::Volumes, -10, names(&["uploads"])),
            (Tier::Volumes, 1000, names(&["db-0"])),
            (Tier::Stateless, critical, names(&["dns"])),
        ]
    );
}

/// What a drain leaves, a cluster shutdown leaves; unbound pods are counted, not stopped; pods
/// given up on are not planned again.
#[test]
fn what_is_left_alone() {
    let pods = [
        pod("daemon", Some("DaemonSet"), 0, json!({})),
        pod(
            "mirror",
            None,
            0,
            json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}),
        ),
        pod(
            "done",
            Some("Job"),
            0,
            json!({"status": {"phase": "Succeeded"}}),
        ),
        pod("bare", None, 0, json!({})),
        pod(
            "never",
            Some("ReplicaSet"),
            0,
            json!({"metadata": {"annotations": {"nodeward.io/drain": "never"}}}),
        ),
        pod(
            "pending",
            Some("ReplicaSet"),
            0,
            json!({"spec": {"nodeName": null}}),
        ),
        pod("stuck", Some("ReplicaSet"), 0, json!({})),
        pod("web", Some("ReplicaSet"), 0, json!({})),
    ];
    let except = BTreeSet::from(["stuck".to_string()]);
    let p = plan(&pods, rules(), &bands(), &ds_exists, &except);
    let left: Vec<(String, Left)> = p.left.into_iter().map(|(r, l)| (r.name, l)).collect();
    assert_eq!(
        left,
        vec![
            ("bare".into(), Left::Refuse(RefuseReason::Unmanaged)),
            ("daemon".into(), Left::Skip(SkipReason::DaemonSet)),
            ("done".into(), Left::Skip(SkipReason::Finished)),
            ("mirror".into(), Left::Skip(SkipReason::Mirror)),
            ("never".into(), Left::Refuse(RefuseReason::Annotated)),
        ]
    );
    assert_eq!(p.unscheduled, 1);
    assert_eq!(p.waves.len(), 1);
    assert_eq!(p.waves[0].pods.len(), 1);
    assert_eq!(p.waves[0].pods[0].name, "web");
}

/// A node as a cordon by `manager` left it, with nodeward's record giving `reason`.
fn node(name: &str, cordoned: bool, manager: &str, reason: Option<&str>) -> Node {
    let mut v = json!({
        "metadata": {"name": name, "managedFields": [{"manager": manager, "operation": "Update",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:unschedulable": {}}}}]},
        "spec": {"unschedulable": cordoned}
    });
    if let Some(r) = reason {
        let record = json!({"reason": r, "at": "2026-01-01T00:00:00Z"}).to_string();
        v["metadata"]["annotations"] = json!({cordon::CORDONED_BY: record});
    }
    serde_json::from_value(v).expect("node")
}

#[test]
fn start_lifts_only_the_shutdowns_own_cordons() {
    let ours = Some(crate::cluster::CORDON_REASON);
    let nodes = [
        node("listed", true, "nodeward", ours),
        node("unlisted-but-ours", true, "nodeward", ours),
        node("operators", true, "kubectl-cordon", None),
        node("listed-now-operators", true, "kubectl-cordon", ours),
        node("nodeward-drain", true, "nodeward", Some("nodeward drain")),
        node("listed-uncordoned", false, "nodeward", ours),
        // Issue 58, item 2: `kubectl uncordon X; nodeward cordon X --reason maint` during the
        // shutdown: nodeward's cordon, but the operator's moment, not the shutdown's.
        node("listed-now-maint", true, "nodeward", Some("maint")),
    ];
    let recorded = BTreeSet::from([
        "listed".to_string(),
        "listed-now-operators".to_string(),
        "listed-uncordoned".to_string(),
        "listed-now-maint".to_string(),
        "gone".to_string(),
    ]);
    assert_eq!(
        start_plan(&nodes, &recorded),
        StartPlan {
            lift: vec!["listed".into(), "unlisted-but-ours".into()],
            not_ours: vec!["listed-now-operators".into()],
            kept: vec![("listed-now-maint".into(), "maint".into())],
        }
    );
}

/// Waves only go forward: the first wave of the plan now is stopped if it comes after the last
/// one stopped; one at or before it is pods that came back (bound despite the cordons).
#[test]
fn waves_only_go_forward() {
    let pods = [
        pod("web-0", Some("ReplicaSet"), 0, json!({})),
        pod("db-0", Some("StatefulSet"), 0, claim()),
    ];
    let now = |pods: &[Pod]| plan(pods, rules(), &bands(), &ds_exists, &BTreeSet::new());
    let key = |tier| WaveKey {
        band: 0,
        tier,
        priority: 0,
    };
    let first = match next(now(&pods), None) {
        Next::Stop(w) => w,
        other => panic!("{other:?}"),
    };
    assert_eq!(first.key, key(Tier::Stateless));
    assert!(matches!(
        next(now(&pods[1..]), Some(first.key)),
        Next::Stop(Wave { key: k, .. }) if k == key(Tier::Volumes)
    ));
    assert_eq!(
        next(now(&pods), Some(key(Tier::Volumes))),
        Next::CameBack(vec![PodRef::of(&pods[0])]),
        "a stateless pod bound after the stateless wave"
    );
    assert_eq!(
        next(now(&pods[1..]), Some(key(Tier::Volumes))),
        Next::CameBack(vec![PodRef::of(&pods[1])]),
        "the same key again"
    );
    assert_eq!(next(now(&[]), Some(key(Tier::Volumes))), Next::Done);
}
