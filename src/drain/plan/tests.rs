use serde_json::json;

use super::*;

fn pod(v: serde_json::Value) -> Pod {
    let mut base = json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "u1",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "r", "controller": true}]},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Running"}
    });
    merge(&mut base, v);
    serde_json::from_value(base).expect("valid pod")
}

fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn opts(force: bool, emptydir: bool) -> PlanOptions {
    PlanOptions {
        force,
        delete_emptydir_data: emptydir,
        waves: crate::config::Settings::default().drain.waves,
        surge: false,
    }
}

/// The cluster's DaemonSets: only `default/ds`.
fn only_default_ds(namespace: &str, name: &str) -> bool {
    (namespace, name) == ("default", "ds")
}

/// A pod controlled by a DaemonSet of `api_version` named `name`.
fn daemonset(api_version: &str, name: &str) -> serde_json::Value {
    json!({"metadata": {"ownerReferences": [{"apiVersion": api_version, "kind": "DaemonSet", "name": name, "uid": "d", "controller": true}]}})
}

fn merged(mut a: serde_json::Value, b: serde_json::Value) -> serde_json::Value {
    merge(&mut a, b);
    a
}

fn plain(wave: usize) -> Decision {
    Decision::Evict {
        wave,
        rule: EvictRule::PLAIN,
    }
}

fn evict(owner: Owner, deletes_emptydir_data: bool) -> Decision {
    Decision::Evict {
        wave: 0,
        rule: EvictRule {
            owner,
            deletes_emptydir_data,
        },
    }
}

#[test]
fn every_plan_rule() {
    use Decision::*;
    let unmanaged = json!({"metadata": {"ownerReferences": null}});
    let emptydir = json!({"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]}});
    let cases: Vec<(&str, serde_json::Value, bool, bool, Decision)> = vec![
        ("replicaset pod", json!({}), false, false, plain(0)),
        (
            "daemonset pod",
            daemonset("apps/v1", "ds"),
            true,
            true,
            Skip(SkipReason::DaemonSet),
        ),
        (
            "pod of a missing daemonset",
            daemonset("apps/v1", "gone"),
            false,
            true,
            Refuse(RefuseReason::OrphanedDaemonSet),
        ),
        (
            "pod of a missing daemonset, forced",
            daemonset("apps/v1", "gone"),
            true,
            false,
            evict(Owner::OrphanForced, false),
        ),
        (
            "pod of a missing daemonset with emptyDir, forced but emptyDir not allowed",
            merged(daemonset("apps/v1", "gone"), emptydir.clone()),
            true,
            false,
            Refuse(RefuseReason::EmptyDir),
        ),
        (
            "finished pod of a missing daemonset",
            merged(
                daemonset("apps/v1", "gone"),
                json!({"status": {"phase": "Succeeded"}}),
            ),
            false,
            false,
            Skip(SkipReason::Finished),
        ),
        (
            "daemonset of another api group (same name as a live one)",
            daemonset("apps.kruise.io/v1alpha1", "ds"),
            false,
            false,
            evict(Owner::ForeignDaemonSet, false),
        ),
        (
            "daemonset of a retired api version",
            daemonset("extensions/v1beta1", "ds"),
            false,
            false,
            evict(Owner::ForeignDaemonSet, false),
        ),
        (
            "non-controller daemonset owner",
            json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "d"}]}}),
            false,
            false,
            Refuse(RefuseReason::Unmanaged),
        ),
        (
            "mirror pod",
            json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}, "ownerReferences": null}}),
            false,
            false,
            Skip(SkipReason::Mirror),
        ),
        (
            "succeeded",
            json!({"status": {"phase": "Succeeded"}}),
            false,
            false,
            Skip(SkipReason::Finished),
        ),
        (
            "failed unmanaged",
            json!({"status": {"phase": "Failed"}, "metadata": {"ownerReferences": null}}),
            false,
            false,
            Skip(SkipReason::Finished),
        ),
        (
            "unmanaged",
            unmanaged.clone(),
            false,
            true,
            Refuse(RefuseReason::Unmanaged),
        ),
        (
            "unmanaged forced",
            unmanaged.clone(),
            true,
            false,
            evict(Owner::Forced, false),
        ),
        (
            "unmanaged with emptyDir, both allowed",
            merged(unmanaged, emptydir.clone()),
            true,
            true,
            evict(Owner::Forced, true),
        ),
        (
            "emptydir",
            emptydir.clone(),
            true,
            false,
            Refuse(RefuseReason::EmptyDir),
        ),
        (
            "emptydir allowed",
            emptydir,
            false,
            true,
            evict(Owner::Controller, true),
        ),
        (
            "annotated never",
            json!({"metadata": {"annotations": {"nodeward.io/drain": "never"}}}),
            true,
            true,
            Refuse(RefuseReason::Annotated),
        ),
        (
            "annotated other value",
            json!({"metadata": {"annotations": {"nodeward.io/drain": "sure"}}}),
            false,
            false,
            plain(0),
        ),
        (
            "critical by priority",
            json!({"spec": {"priority": 2000001000}}),
            false,
            false,
            plain(1),
        ),
        (
            "critical by class only",
            json!({"spec": {"priorityClassName": "system-cluster-critical"}}),
            false,
            false,
            plain(1),
        ),
        (
            "negative priority",
            json!({"spec": {"priority": -10}}),
            false,
            false,
            plain(0),
        ),
    ];
    for (name, patch, force, emptydir, expected) in cases {
        assert_eq!(
            decide(&pod(patch), &opts(force, emptydir), &only_default_ds),
            expected,
            "{name}"
        );
    }
}

#[test]
fn waves_by_priority() {
    let waves = vec![
        Wave {
            min_priority: 0,
            share_of_deadline: 0.2,
        },
        Wave {
            min_priority: 1000,
            share_of_deadline: 0.3,
        },
        Wave {
            min_priority: 2_000_000_000,
            share_of_deadline: 0.5,
        },
    ];
    for (prio, wave) in [
        (-5, 0),
        (0, 0),
        (999, 0),
        (1000, 1),
        (1_999_999_999, 1),
        (2_000_001_000, 2),
    ] {
        assert_eq!(wave_of(prio, &waves), wave, "priority {prio}");
    }
}

#[test]
fn plan_orders_by_wave_then_name() {
    let pods = vec![
        pod(json!({"metadata": {"name": "z", "uid": "1"}})),
        pod(json!({"metadata": {"name": "crit", "uid": "2"}, "spec": {"priority": 2000000000}})),
        pod(json!({"metadata": {"name": "a", "uid": "3"}})),
        pod(json!({"metadata": {"name": "lonely", "uid": "4", "ownerReferences": null}})),
    ];
    let plan = Plan::new(&pods, &opts(false, true), &only_default_ds);
    let names: Vec<_> = plan.pods.iter().map(|p| p.pod.name.as_str()).collect();
    assert_eq!(names, ["a", "z", "crit", "lonely"]);
    assert_eq!(plan.evictions().count(), 3);
    assert_eq!(plan.refused().count(), 1);
}

#[test]
fn wave_deadlines_accumulate_and_end_at_the_deadline() {
    let waves = vec![
        Wave {
            min_priority: 0,
            share_of_deadline: 0.5,
        },
        Wave {
            min_priority: 1,
            share_of_deadline: 0.25,
        },
        Wave {
            min_priority: 2,
            share_of_deadline: 0.1,
        },
    ];
    let d = wave_deadlines(Duration::from_secs(100), &waves);
    assert_eq!(
        d,
        [
            Duration::from_secs(50),
            Duration::from_secs(75),
            Duration::from_secs(100)
        ]
    );
    assert_eq!(
        fallback_margin(Duration::from_secs(90)),
        Duration::from_secs(9)
    );
    assert_eq!(
        fallback_margin(Duration::from_secs(3)),
        Duration::from_secs(1)
    );
    assert_eq!(
        fallback_margin(Duration::from_secs(600)),
        Duration::from_secs(15)
    );
}

#[test]
fn selectors() {
    let labels: BTreeMap<String, String> = [("app", "web"), ("tier", "fe")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let sel =
        |v: serde_json::Value| -> LabelSelector { serde_json::from_value(v).expect("selector") };
    let cases = [
        (json!({}), true),
        (json!({"matchLabels": {"app": "web"}}), true),
        (json!({"matchLabels": {"app": "db"}}), false),
        (
            json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["fe", "be"]}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["fe"]}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "app", "operator": "Bogus"}]}),
            false,
        ),
    ];
    for (s, expected) in cases {
        assert_eq!(selector_matches(&sel(s.clone()), &labels), expected, "{s}");
    }
}

#[test]
fn every_eviction_answer() {
    use Cause::{DisruptionBudget as Budget, NamespaceTerminating as Terminating, None as No};
    let a = |code, cause, matching_budgets| {
        Answer {
            code,
            cause,
            matching_budgets,
            message: String::new(),
        }
        .outcome()
    };
    let cases = [
        (a(201, No, 0), Outcome::Evicted),
        (a(200, No, 1), Outcome::Evicted),
        (a(404, No, 0), Outcome::Gone),
        (a(429, Budget, 1), Outcome::BudgetExhausted),
        (a(429, No, 1), Outcome::Retry),
        (a(500, No, 2), Outcome::MultipleBudgets),
        (a(500, No, 1), Outcome::Retry),
        (a(503, No, 0), Outcome::Retry),
        (a(409, No, 0), Outcome::Retry),
        (a(403, No, 0), Outcome::Denied),
        (a(403, Terminating, 0), Outcome::NamespaceTerminating),
        (a(403, Budget, 0), Outcome::Denied),
        (a(429, Terminating, 0), Outcome::Retry),
        (a(422, No, 0), Outcome::Rejected),
        (a(400, No, 0), Outcome::Rejected),
    ];
    for (i, (got, want)) in cases.iter().enumerate() {
        assert_eq!(got, want, "case {i}");
    }
}

/// A 403 stops the drain only when the authorizer said the identity may not evict; every other
/// 403 (admission, NodeRestriction, the Eviction API's own budget checks) concerns one pod. The
/// messages are kube-apiserver's, as `apierrors.NewForbidden` and each plugin render them.
#[test]
fn a_403_stops_the_drain_only_when_the_authorizer_denied_it() {
    use Cause::{DisruptionBudget as Budget, None as No};
    let cases: [(&str, Cause, &str, bool); 10] = [
        (
            "RBAC: the identity lacks create on pods/eviction",
            No,
            r#"pods "web-0" is forbidden: User "system:serviceaccount:kube-system:nodeward" cannot create resource "pods/eviction" in API group "" in the namespace "default""#,
            true,
        ),
        (
            "a webhook authorizer's denial, its reason appended",
            No,
            r#"pods "web-0" is forbidden: User "alice" cannot create resource "pods/eviction" in API group "" in the namespace "default": no policy allows it"#,
            true,
        ),
        (
            "the Node authorizer refusing a node identity",
            No,
            r#"pods "web-0" is forbidden: User "system:node:worker-1" cannot create resource "pods/eviction" in API group "" in the namespace "default": no relationship found between node 'worker-1' and this object"#,
            true,
        ),
        (
            "NodeRestriction: the pod was recreated on another node",
            No,
            r#"pods "web-0" is forbidden: node worker-1 can only evict pods with spec.nodeName set to itself"#,
            false,
        ),
        (
            "a ValidatingAdmissionPolicy with reason Forbidden",
            No,
            r#"pods "web-0" is forbidden: ValidatingAdmissionPolicy 'keep-db' with binding 'keep-db' denied request: the primary database is never evicted"#,
            false,
        ),
        (
            "a ValidatingAdmissionPolicy without a binding name",
            No,
            r#"pods "web-0" is forbidden: ValidatingAdmissionPolicy 'keep-db' denied request: failed expression: object.metadata.name != 'db-0'"#,
            false,
        ),
        (
            "an admission webhook answering 403",
            No,
            r#"admission webhook "validation.gatekeeper.sh" denied the request: [keep-db] the primary database is never evicted"#,
            false,
        ),
        (
            "a budget whose disruptionsAllowed is negative",
            No,
            r#"poddisruptionbudget.policy "web" is forbidden: pdb disruptions allowed is negative"#,
            false,
        ),
        (
            "too many evictions not confirmed yet, with the cause newer servers add",
            Budget,
            r#"poddisruptionbudget.policy "web" is forbidden: DisruptedPods map too big - too many evictions not confirmed by PDB controller"#,
            false,
        ),
        (
            "a 403 without a message says nothing about the identity",
            No,
            "",
            false,
        ),
    ];
    for (what, cause, message, stops) in cases {
        let answer = Answer {
            code: 403,
            cause,
            matching_budgets: 1,
            message: message.to_string(),
        };
        assert_eq!(answer.outcome() == Outcome::Forbidden, stops, "{what}");
    }
}

#[test]
fn causes_are_read_from_their_reasons() {
    assert_eq!(Cause::of(["DisruptionBudget"]), Cause::DisruptionBudget);
    assert_eq!(
        Cause::of(["FieldValueInvalid", "NamespaceTerminating"]),
        Cause::NamespaceTerminating
    );
    assert_eq!(Cause::of(["Forbidden"]), Cause::None);
    assert_eq!(Cause::of([]), Cause::None);
}

#[test]
fn budgets_for_matches_namespace_and_selector() {
    let pdb = |ns: &str, sel: serde_json::Value| -> PodDisruptionBudget {
        serde_json::from_value(
            json!({"metadata": {"name": "b", "namespace": ns}, "spec": {"selector": sel}}),
        )
        .expect("pdb")
    };
    let labels: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
    let budgets = [
        pdb("default", json!({"matchLabels": {"app": "web"}})),
        pdb("other", json!({"matchLabels": {"app": "web"}})),
        pdb("default", json!({"matchLabels": {"app": "db"}})),
        pdb("default", json!({})),
    ];
    assert_eq!(budgets_for("default", &labels, &budgets).len(), 2);
}

#[test]
fn a_pod_has_left_its_node_once_stopped_unless_something_waits_for_its_object() {
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-11-27T10:00:00Z"}});
    let failed = json!({"status": {"phase": "Failed"}});
    let stopped = merged(deleting.clone(), failed.clone());
    let volume = |v: serde_json::Value| json!({"spec": {"volumes": [v]}});
    let local = json!([
        {"name": "a", "configMap": {"name": "c"}},
        {"name": "b", "secret": {"secretName": "s"}},
        {"name": "c", "projected": {"sources": []}},
        {"name": "d", "downwardAPI": {}},
        {"name": "e", "emptyDir": {}},
        {"name": "f", "hostPath": {"path": "/x"}},
        {"name": "g", "image": {"reference": "r"}}
    ]);
    let cases = [
        ("running", json!({}), false),
        ("evicted, containers still running", deleting.clone(), false),
        ("finished but not being deleted", failed, false),
        ("stopped: Failed", stopped.clone(), true),
        (
            "stopped: Succeeded",
            merged(deleting.clone(), json!({"status": {"phase": "Succeeded"}})),
            true,
        ),
        (
            "stopped, every volume node-local",
            merged(stopped.clone(), json!({"spec": {"volumes": local}})),
            true,
        ),
        (
            "stopped, a claim",
            merged(
                stopped.clone(),
                volume(json!({"name": "d", "persistentVolumeClaim": {"claimName": "d"}})),
            ),
            false,
        ),
        (
            "stopped, a CSI volume",
            merged(
                stopped.clone(),
                volume(json!({"name": "d", "csi": {"driver": "x"}})),
            ),
            false,
        ),
        (
            "stopped, an ephemeral claim",
            merged(
                stopped.clone(),
                volume(json!({"name": "d", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}})),
            ),
            false,
        ),
        (
            "stopped, a StatefulSet's",
            merged(
                stopped.clone(),
                json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s", "controller": true}]}}),
            ),
            false,
        ),
        (
            "stopped, a StatefulSet's but not its controller",
            merged(
                stopped,
                json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s"}]}}),
            ),
            true,
        ),
    ];
    for (what, patch, want) in cases {
        assert_eq!(left_node(&pod(patch), None), want, "{what}");
    }
    // The node's own word on the containers, where the kubelet has not said it yet.
    let evicted = pod(deleting);
    assert!(
        left_node(&evicted, Some(false)),
        "no container has a process"
    );
    assert!(!left_node(&evicted, Some(true)), "a container still runs");
    assert!(
        !left_node(&pod(json!({})), Some(false)),
        "not being deleted"
    );
    let claim = merged(
        json!({"metadata": {"deletionTimestamp": "2026-11-27T10:00:00Z"}}),
        volume(json!({"name": "d", "persistentVolumeClaim": {"claimName": "d"}})),
    );
    assert!(
        !left_node(&pod(claim), Some(false)),
        "a claim's pod waits for its object"
    );
}

#[test]
fn a_pods_drain_timeout_is_read_within_bounds() {
    let annotated =
        |v: &str| pod(json!({"metadata": {"annotations": {DRAIN_TIMEOUT_ANNOTATION: v}}}));
    let ok: [(&str, Duration); 4] = [
        ("90s", Duration::from_secs(90)),
        (" 5m ", Duration::from_secs(300)),
        ("0s", Duration::ZERO),
        ("7days", Duration::from_secs(7 * 24 * 3600)),
    ];
    for (v, want) in ok {
        assert_eq!(budget_wait(&annotated(v)), Ok(Some(want)), "{v:?}");
    }
    assert_eq!(budget_wait(&pod(json!({}))), Ok(None));
    let refused: [(&str, &str); 4] = [
        ("ninety seconds", "\"90s\""),
        ("168h 1s", "from 0s to 7days"),
        ("300000000000y", "from 0s to 7days"),
        ("18446744073709551615s", "from 0s to 7days"),
    ];
    for (v, says) in refused {
        let Err(e) = budget_wait(&annotated(v)) else {
            panic!("{v:?} accepted")
        };
        assert!(
            e.contains("default/p") && e.contains(DRAIN_TIMEOUT_ANNOTATION) && e.contains(says),
            "{v:?}: {e}"
        );
    }
}

#[test]
fn the_fallbacks_grace_is_whole_seconds_rounded_up_and_never_zero() {
    let ms = Duration::from_millis;
    let cases: [(Duration, u32); 8] = [
        (Duration::ZERO, 1),
        (ms(1), 1),
        (ms(999), 1),
        (ms(1000), 1),
        (ms(1001), 2),
        (ms(7000), 7),
        (Duration::from_secs(u64::from(u32::MAX) + 1), u32::MAX),
        (Duration::MAX, u32::MAX),
    ];
    for (left, want) in cases {
        assert_eq!(fallback_grace(left), want, "{left:?} left");
    }
}

/// A coordinated reboot takes its slot only when every budget its drain meets allows a
/// disruption now: two web pods under a budget allowing one can go (one, then the other once its
/// replacement is ready); a budget allowing none holds it; one selecting none of the pods, or in
/// another namespace, does not count.
#[test]
fn budgets_short_names_each_budget_that_allows_no_disruption_now() {
    let pdb = |ns: &str, name: &str, app: &str, allowed: i32| -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 3, "desiredHealthy": 2,
                       "expectedPods": 3}
        }))
        .expect("pdb")
    };
    let web = |n: &str| pod(json!({"metadata": {"name": n, "labels": {"app": "web"}}}));
    let (w1, w2) = (web("w1"), web("w2"));
    let db = pod(json!({"metadata": {"name": "db", "labels": {"app": "db"}}}));
    let pods = [&w1, &w2, &db];
    let budgets = [
        pdb("default", "web", "web", 1),
        pdb("default", "db", "db", 0),
        pdb("other", "web", "web", 0),
        pdb("default", "cache", "cache", 0),
    ];
    assert_eq!(
        budgets_short(&pods, &budgets),
        ["default/db allows 0 disruptions now, the drain needs 1"]
    );
    let open = [
        pdb("default", "web", "web", 1),
        pdb("default", "db", "db", 1),
    ];
    assert!(budgets_short(&pods, &open).is_empty());
    assert!(
        budgets_short(&[], &budgets).is_empty(),
        "no pods, nothing to allow"
    );
}
