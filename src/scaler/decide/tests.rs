use super::*;
use crate::config::{Capacity, GroupSettings};
use crate::drain::plan::{EvictRule, Fate, RefuseReason, SkipReason};
use crate::names::STARTUP_TAINT_KEY;
use crate::scaler::model::{
    Namespaces, PodConstraints, PodTermView, SelectorView, SpreadView, TaintEffect,
    TolerationOperator, TolerationView, UNNEEDED_SINCE,
};

const GI: i64 = 1024 * 1024 * 1024;

fn t0() -> Timestamp {
    "2026-01-01T00:00:00Z".parse().expect("time")
}

fn at(minutes: i64) -> Timestamp {
    t0() + SignedDuration::from_secs(minutes * 60)
}

fn res(cpu_milli: i64, mem_gi: i64, pods: i64) -> Resources {
    Resources {
        cpu_milli,
        memory: mem_gi * GI,
        pods,
        ..Resources::default()
    }
}

fn group(name: &str, min: u32, max: u32) -> GroupSettings {
    GroupSettings {
        name: name.into(),
        min,
        max,
        standby: 0,
        priority: 0,
        plan: String::new(),
        region: String::new(),
        image: String::new(),
        ssh_keys: Vec::new(),
        labels: BTreeMap::new(),
        taints: Vec::new(),
        template: "/t".into(),
        hostname_pattern: None,
        capacity: Capacity {
            resources: res(4000, 16, 110),
        },
        cherry: Default::default(),
    }
}

fn settings(groups: Vec<GroupSettings>) -> ScalerSettings {
    ScalerSettings {
        groups,
        ..ScalerSettings::default()
    }
}

fn node(name: &str, group: Option<&str>) -> NodeView {
    let mut labels = BTreeMap::from([("kubernetes.io/hostname".to_string(), name.to_string())]);
    if let Some(g) = group {
        labels.insert(NODE_GROUP_LABEL.into(), g.into());
    }
    NodeView {
        name: name.into(),
        labels,
        taints: Vec::new(),
        unschedulable: false,
        scale_down_in_progress: false,
        ready: true,
        ready_transition: Some(t0()),
        allocatable: res(4000, 16, 110),
        created: Some(t0()),
        unneeded_since: None,
        scale_down_disabled: false,
        not_ready_in_time: false,
        ever_ready: false,
        scale_down_failed: None,
    }
}

fn machine(host: &str, group: &str, created: Timestamp) -> MachineView {
    MachineView {
        id: format!("m-{host}"),
        hostname: host.into(),
        group: group.into(),
        created,
    }
}

fn pod(name: &str, cpu_milli: i64, mem_gi: i64) -> PodView {
    PodView {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        labels: BTreeMap::new(),
        node: None,
        requests: res(cpu_milli, mem_gi, 1),
        node_selector: BTreeMap::new(),
        affinity_terms: Vec::new(),
        tolerations: Vec::new(),
        constraints: None,
        unschedulable: true,
        fate: Fate::Evict(EvictRule::PLAIN),
        safe_to_evict: None,
        host_path: false,
    }
}

fn on(mut p: PodView, node: &str) -> PodView {
    p.node = Some(node.into());
    p.unschedulable = false;
    p
}

/// A group member: machine plus ready node.
fn member(snap: &mut Snapshot, name: &str, group: &str) {
    snap.nodes.push(node(name, Some(group)));
    snap.machines.push(machine(name, group, t0()));
}

fn scale_ups(actions: &[Action]) -> Vec<(String, u32, ScaleUpReason)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ScaleUp {
                group,
                count,
                reason,
                ..
            } => Some((group.clone(), *count, *reason)),
            _ => None,
        })
        .collect()
}

fn scale_downs(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ScaleDown { node, .. } => Some(node.clone()),
            _ => None,
        })
        .collect()
}

fn no_scale_up(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::NoScaleUp { pod, reason } => Some(format!("{pod}: {reason}")),
            _ => None,
        })
        .collect()
}

#[test]
fn pending_pods_fill_existing_room_before_new_nodes() {
    let mut snap = Snapshot::default();
    member(&mut snap, "a", "web");
    snap.pods.push(on(pod("busy", 1000, 4), "a"));
    snap.pods.push(pod("p1", 2000, 4));
    let s = settings(vec![group("web", 0, 10)]);
    assert!(scale_ups(&decide(&snap, t0(), &s)).is_empty());
    snap.pods.push(pod("p2", 2000, 4));
    let a = decide(&snap, t0(), &s);
    assert_eq!(
        scale_ups(&a),
        vec![("web".into(), 1, ScaleUpReason::PendingPods)]
    );
}

#[test]
fn first_fit_decreasing_packs_tightly() {
    // 3 x 3 CPU and 3 x 1 CPU on 4 CPU nodes: FFD needs 3 nodes.
    let mut snap = Snapshot::default();
    for (i, cpu) in [1000, 3000, 1000, 3000, 1000, 3000].into_iter().enumerate() {
        snap.pods.push(pod(&format!("p{i}"), cpu, 1));
    }
    let a = decide(&snap, t0(), &settings(vec![group("web", 0, 10)]));
    assert_eq!(
        scale_ups(&a),
        vec![("web".into(), 3, ScaleUpReason::PendingPods)]
    );
    let pods = a
        .iter()
        .find_map(|a| match a {
            Action::ScaleUp { pods, .. } => Some(pods.len()),
            _ => None,
        })
        .expect("scale-up");
    assert_eq!(pods, 6);
}

#[test]
fn constrained_pods_are_packed_before_flexible_ones() {
    // "a" has room for one node; the pinned pod can only go there, the free one anywhere.
    let s = settings(vec![group("a", 0, 1), group("b", 0, 1)]);
    let mut snap = Snapshot::default();
    snap.pods.push(pod("a-free", 4000, 1));
    let mut pinned = pod("b-pinned", 4000, 1);
    pinned
        .node_selector
        .insert(NODE_GROUP_LABEL.into(), "a".into());
    snap.pods.push(pinned);
    let a = decide(&snap, t0(), &s);
    assert!(no_scale_up(&a).is_empty(), "{a:?}");
    assert_eq!(scale_ups(&a).len(), 2);
}

#[test]
fn the_lifecycle_controllers_not_ready_taint_on_a_fresh_node_is_coming_too() {
    // Seen on the real control plane: just untainted by the readiness controller, Ready, but
    // node.kubernetes.io/not-ready not yet removed by the node lifecycle controller.
    let s = settings(vec![group("web", 0, 10)]);
    let not_ready = TaintView {
        key: crate::scaler::model::NOT_READY_TAINT.into(),
        value: String::new(),
        effect: TaintEffect::NoSchedule,
    };
    let mut snap = Snapshot::default();
    let mut n = node("b", Some("web"));
    n.taints.push(not_ready.clone());
    snap.nodes.push(n);
    snap.machines.push(machine("b", "web", at(-1)));
    snap.pods.push(pod("p", 1000, 1));
    assert!(scale_ups(&decide(&snap, t0(), &s)).is_empty());
    // A node that is really not Ready keeps it: the pod needs another machine.
    let mut snap = Snapshot::default();
    let mut n = node("b", Some("web"));
    n.taints.push(not_ready);
    n.ready = false;
    snap.nodes.push(n);
    snap.machines.push(machine("b", "web", at(-1)));
    snap.pods.push(pod("p", 1000, 1));
    assert_eq!(scale_ups(&decide(&snap, t0(), &s)).len(), 1);
}

#[test]
fn booting_nodes_and_registering_machines_count_as_coming() {
    let s = settings(vec![group("web", 0, 10)]);
    // A booting node (startup taint) takes the pod: no new machine.
    let mut snap = Snapshot::default();
    let mut n = node("b", Some("web"));
    n.taints.push(TaintView {
        key: STARTUP_TAINT_KEY.into(),
        value: String::new(),
        effect: TaintEffect::NoSchedule,
    });
    n.ready = false;
    snap.nodes.push(n);
    snap.machines.push(machine("b", "web", at(-1)));
    snap.pods.push(pod("p", 1000, 1));
    assert!(scale_ups(&decide(&snap, t0(), &s)).is_empty());
    // A machine without a Node yet (in flight, e.g. after a restart) also takes it.
    let mut snap = Snapshot::default();
    snap.machines.push(machine("c", "web", at(-1)));
    snap.pods.push(pod("p", 1000, 1));
    assert!(scale_ups(&decide(&snap, t0(), &s)).is_empty());
    // But only as much as one template node offers.
    snap.pods.push(pod("q", 3500, 1));
    assert_eq!(
        scale_ups(&decide(&snap, t0(), &s)),
        vec![("web".into(), 1, ScaleUpReason::PendingPods)]
    );
}

#[test]
fn max_caps_scale_up_and_counts_in_flight_machines() {
    let mut snap = Snapshot::default();
    member(&mut snap, "a", "web");
    snap.pods.push(on(pod("full", 4000, 1), "a"));
    snap.machines.push(machine("x", "web", at(-1)));
    snap.pods.push(pod("p0", 4000, 1)); // goes to the in-flight machine
    for i in 1..10 {
        snap.pods.push(pod(&format!("p{i}"), 4000, 1));
    }
    let a = decide(&snap, t0(), &settings(vec![group("web", 0, 5)]));
    assert_eq!(
        scale_ups(&a),
        vec![("web".into(), 3, ScaleUpReason::PendingPods)]
    );
    let refused = no_scale_up(&a);
    assert_eq!(refused.len(), 6, "{refused:?}");
    assert!(refused[0].contains("at max size"), "{refused:?}");
}

#[test]
fn scale_from_zero_uses_the_capacity_template() {
    let mut g = group("gpu", 0, 3);
    g.capacity
        .resources
        .extended
        .insert("nvidia.com/gpu".into(), 1);
    let s = settings(vec![group("web", 0, 3), g]);
    let mut snap = Snapshot::default();
    let mut p = pod("train", 1000, 1);
    p.requests.extended.insert("nvidia.com/gpu".into(), 1);
    snap.pods.push(p);
    assert_eq!(
        scale_ups(&decide(&snap, t0(), &s)),
        vec![("gpu".into(), 1, ScaleUpReason::PendingPods)]
    );
    // Bigger than any template: refused with the reason.
    let mut snap = Snapshot::default();
    snap.pods.push(pod("huge", 64_000, 1));
    let a = decide(&snap, t0(), &s);
    assert!(scale_ups(&a).is_empty());
    assert!(
        no_scale_up(&a)[0].contains("requests more than a new node offers"),
        "{a:?}"
    );
}

/// The architecture of a new node is the group's (its labels, or a node of it), not amd64 for
/// every group.
#[test]
fn scale_from_zero_takes_the_architecture_from_the_group() {
    const ARCH: &str = "kubernetes.io/arch";
    let mut arm = group("arm", 0, 3);
    arm.labels.insert(ARCH.into(), "arm64".into());
    let s = settings(vec![group("unsaid", 0, 3), arm]);
    let wants = |arch: &str| {
        let mut p = pod(&format!("wants-{arch}"), 500, 1);
        p.node_selector.insert(ARCH.into(), arch.into());
        Snapshot {
            pods: vec![p],
            ..Snapshot::default()
        }
    };
    let a = decide(&wants("arm64"), t0(), &s);
    assert_eq!(
        scale_ups(&a),
        vec![("arm".into(), 1, ScaleUpReason::PendingPods)]
    );
    // No group says amd64, and none has a node to copy it from: nothing is created for it.
    let a = decide(&wants("amd64"), t0(), &s);
    assert!(scale_ups(&a).is_empty(), "{a:?}");
    assert!(
        no_scale_up(&a)[0].contains("unsaid: node selector or affinity does not match"),
        "{a:?}"
    );
    // Once the group has a ready node, its labels are the template's.
    let mut snap = wants("amd64");
    member(&mut snap, "u1", "unsaid");
    snap.nodes[0].labels.insert(ARCH.into(), "amd64".into());
    snap.pods.push(on(pod("fills-u1", 3900, 1), "u1"));
    assert_eq!(
        scale_ups(&decide(&snap, t0(), &s)),
        vec![("unsaid".into(), 1, ScaleUpReason::PendingPods)]
    );
}

/// A node affinity requirement.
fn req(key: &str, op: &str, values: &[&str]) -> Requirement {
    Requirement {
        key: key.into(),
        operator: crate::selector::SelectorOperator::of_node_selector(op),
        values: values.iter().map(|v| v.to_string()).collect(),
        field: false,
    }
}

/// Selectors, affinity and tolerations against group templates: which group (if any) grows.
#[test]
fn selectors_affinity_and_taints() {
    let mut gpu = group("gpu", 0, 3);
    gpu.labels.insert("example.com/accel".into(), "a100".into());
    gpu.taints
        .push("dedicated=gpu:NoSchedule".parse().expect("taint"));
    gpu.plan = "gpu_plan".into();
    let web = group("web", 0, 3);
    let s = settings(vec![web, gpu]);
    let tol = TolerationView {
        key: "dedicated".into(),
        operator: TolerationOperator::Equal,
        value: "gpu".into(),
        effect: Some(TaintEffect::NoSchedule),
    };
    type Case = (
        &'static str,
        Box<dyn Fn(&mut PodView)>,
        Option<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "plain pod goes to web (gpu is tainted)",
            Box::new(|_| {}),
            Some("web"),
        ),
        (
            "selector for the gpu label without toleration fits nowhere",
            Box::new(|p| {
                p.node_selector
                    .insert("example.com/accel".into(), "a100".into());
            }),
            None,
        ),
        (
            "selector plus toleration goes to gpu",
            Box::new({
                let tol = tol.clone();
                move |p| {
                    p.node_selector
                        .insert("example.com/accel".into(), "a100".into());
                    p.tolerations.push(tol.clone());
                }
            }),
            Some("gpu"),
        ),
        (
            "affinity In on the group label",
            Box::new({
                let tol = tol.clone();
                move |p| {
                    p.affinity_terms = vec![vec![req(NODE_GROUP_LABEL, "In", &["gpu"])]];
                    p.tolerations.push(tol.clone());
                }
            }),
            Some("gpu"),
        ),
        (
            "affinity NotIn web, tolerating all",
            Box::new(|p| {
                p.affinity_terms = vec![vec![req(NODE_GROUP_LABEL, "NotIn", &["web"])]];
                p.tolerations.push(TolerationView {
                    key: String::new(),
                    operator: TolerationOperator::Exists,
                    value: String::new(),
                    effect: None,
                });
            }),
            Some("gpu"),
        ),
        (
            "affinity Exists on the instance-type label only gpu sets",
            Box::new({
                let tol = tol.clone();
                move |p| {
                    p.affinity_terms =
                        vec![vec![req("node.kubernetes.io/instance-type", "Exists", &[])]];
                    p.tolerations.push(tol.clone());
                }
            }),
            Some("gpu"),
        ),
        (
            "affinity DoesNotExist on the gpu label goes to web",
            Box::new(|p| {
                p.affinity_terms = vec![vec![req("example.com/accel", "DoesNotExist", &[])]];
            }),
            Some("web"),
        ),
        (
            "two terms are ORed",
            Box::new(|p| {
                p.affinity_terms = vec![
                    vec![req(NODE_GROUP_LABEL, "In", &["nope"])],
                    vec![req(NODE_GROUP_LABEL, "In", &["web"])],
                ];
            }),
            Some("web"),
        ),
        (
            "requirements in a term are ANDed",
            Box::new(|p| {
                p.affinity_terms = vec![vec![
                    req(NODE_GROUP_LABEL, "In", &["web"]),
                    req("example.com/accel", "Exists", &[]),
                ]];
            }),
            None,
        ),
        (
            "hostname selector fits no template",
            Box::new(|p| {
                p.node_selector
                    .insert("kubernetes.io/hostname".into(), "node-9".into());
            }),
            None,
        ),
        (
            "os selector fits the generic template labels",
            Box::new(|p| {
                p.node_selector
                    .insert("kubernetes.io/os".into(), "linux".into());
            }),
            Some("web"),
        ),
    ];
    for (what, f, want) in cases {
        let mut p = pod("p", 500, 1);
        f(&mut p);
        let snap = Snapshot {
            pods: vec![p],
            ..Snapshot::default()
        };
        let a = decide(&snap, t0(), &s);
        let got: Vec<String> = scale_ups(&a).into_iter().map(|(g, _, _)| g).collect();
        assert_eq!(
            got,
            want.into_iter().map(String::from).collect::<Vec<_>>(),
            "{what}: {a:?}"
        );
        if want.is_none() {
            assert_eq!(no_scale_up(&a).len(), 1, "{what}: a NoScaleUp is reported");
        }
    }
}

const ZONE: &str = "topology.kubernetes.io/zone";

/// An `app=<app>` term over the default namespace on `key`.
fn app_term(app: &str, key: &str) -> PodTermView {
    PodTermView {
        namespaces: Namespaces::Only(vec!["default".into()]),
        selector: Some(SelectorView {
            labels: BTreeMap::from([("app".to_string(), app.to_string())]),
            expressions: Vec::new(),
        }),
        topology_key: key.into(),
    }
}

fn constrained(mut p: PodView, c: PodConstraints) -> PodView {
    p.constraints = Some(Box::new(c));
    p
}

fn anti(p: PodView, app: &str, key: &str) -> PodView {
    constrained(
        p,
        PodConstraints {
            anti_affinity: vec![app_term(app, key)],
            ..PodConstraints::default()
        },
    )
}

fn near(p: PodView, app: &str, key: &str) -> PodView {
    constrained(
        p,
        PodConstraints {
            affinity: vec![app_term(app, key)],
            ..PodConstraints::default()
        },
    )
}

fn zone_spread(p: PodView, app: &str, max_skew: u32) -> PodView {
    constrained(
        p,
        PodConstraints {
            spread: vec![SpreadView {
                max_skew,
                topology_key: ZONE.into(),
                selector: app_term(app, ZONE).selector,
                min_domains: 1,
                ignore_node_affinity: false,
                honor_taints: false,
            }],
            ..PodConstraints::default()
        },
    )
}

/// Groups `za`, `zb`, `zc`, one per zone, empty.
fn three_zones() -> Vec<GroupSettings> {
    vec![
        zoned("za", 0, 10, "zone-1"),
        zoned("zb", 0, 10, "zone-2"),
        zoned("zc", 0, 10, "zone-3"),
    ]
}

/// `n` pending 500m pods of app `web` with a zone spread of maxSkew 1 and `min_domains`, on an
/// empty cluster.
fn spread_pods(n: usize, min_domains: u32) -> Snapshot {
    let mut snap = Snapshot::default();
    for i in 0..n {
        let mut web = zone_spread(labelled(pod(&format!("web-{i}"), 500, 1), "web"), "web", 1);
        if let Some(c) = web.constraints.as_deref_mut() {
            c.spread[0].min_domains = min_domains;
        }
        snap.pods.push(web);
    }
    snap
}

fn zoned(name: &str, min: u32, max: u32, zone: &str) -> GroupSettings {
    let mut g = group(name, min, max);
    g.labels.insert(ZONE.into(), zone.into());
    g
}

/// A group member in `zone`.
fn zoned_member(snap: &mut Snapshot, name: &str, group: &str, zone: &str) {
    member(snap, name, group);
    if let Some(n) = snap.nodes.last_mut() {
        n.labels.insert(ZONE.into(), zone.into());
    }
}

/// Group "a"'s node n1 in zone-1 and a node n2 outside any group in zone-2 with `taints`, both
/// full (n1 with an `app=web` pod).
fn zone_2_outside_the_groups(taints: Vec<TaintView>) -> Snapshot {
    let mut snap = Snapshot::default();
    zoned_member(&mut snap, "n1", "a", "zone-1");
    snap.pods
        .push(on(labelled(pod("web-0", 4000, 1), "web"), "n1"));
    let mut n2 = node("n2", None);
    n2.labels.insert(ZONE.into(), "zone-2".into());
    n2.taints = taints;
    snap.nodes.push(n2);
    snap.pods.push(on(pod("filler", 4000, 1), "n2"));
    snap
}

/// Required pod affinity, anti-affinity (both ways) and `DoNotSchedule` spread: which groups
/// grow by how much, and which pods are refused for a constraint no new node can meet.
#[test]
fn inter_pod_constraints_shape_the_scale_up() {
    struct Case {
        name: &'static str,
        groups: Vec<GroupSettings>,
        snap: Snapshot,
        ups: Vec<(&'static str, u32)>,
        refused: Vec<&'static str>,
    }
    let web = || vec![group("web", 0, 10)];
    let cases = vec![
        Case {
            name: "hostname anti-affinity: three replicas need three nodes",
            groups: web(),
            snap: Snapshot {
                pods: (0..3)
                    .map(|i| {
                        anti(
                            labelled(pod(&format!("r{i}"), 500, 1), "db"),
                            "db",
                            HOSTNAME,
                        )
                    })
                    .collect(),
                ..Snapshot::default()
            },
            ups: vec![("web", 3)],
            refused: vec![],
        },
        Case {
            name: "anti-affinity against a running pod: a new node, not the node with room",
            groups: web(),
            snap: {
                let mut snap = Snapshot::default();
                member(&mut snap, "a", "web");
                snap.pods.push(on(labelled(pod("db-0", 500, 1), "db"), "a"));
                snap.pods
                    .push(anti(labelled(pod("db-1", 500, 1), "db"), "db", HOSTNAME));
                snap
            },
            ups: vec![("web", 1)],
            refused: vec![],
        },
        Case {
            name: "a running pod's anti-affinity keeps the pending pod off its node",
            groups: web(),
            snap: {
                let mut snap = Snapshot::default();
                member(&mut snap, "a", "web");
                snap.pods.push(on(
                    anti(labelled(pod("db-0", 500, 1), "db"), "cache", HOSTNAME),
                    "a",
                ));
                snap.pods.push(labelled(pod("cache-0", 500, 1), "cache"));
                snap
            },
            ups: vec![("web", 1)],
            refused: vec![],
        },
        Case {
            name: "hostname affinity to a running pod on a full node: no useless scale-up",
            groups: web(),
            snap: {
                let mut snap = Snapshot::default();
                member(&mut snap, "a", "web");
                member(&mut snap, "b", "web");
                snap.pods
                    .push(on(labelled(pod("db-0", 4000, 1), "db"), "b"));
                snap.pods.push(near(pod("sidecar", 500, 1), "db", HOSTNAME));
                snap
            },
            ups: vec![],
            refused: vec!["default/sidecar"],
        },
        Case {
            name: "zone affinity to a running pod: the group in its zone grows",
            groups: vec![zoned("a", 0, 10, "zone-2"), zoned("b", 0, 10, "zone-1")],
            snap: {
                let mut snap = Snapshot::default();
                zoned_member(&mut snap, "n1", "b", "zone-1");
                snap.pods
                    .push(on(labelled(pod("db-0", 4000, 1), "db"), "n1"));
                snap.pods.push(near(pod("client", 500, 1), "db", ZONE));
                snap
            },
            ups: vec![("b", 1)],
            refused: vec![],
        },
        Case {
            name: "two affinity terms: one pod must match both (as the scheduler counts), not one pod each",
            groups: vec![zoned("a", 0, 10, "zone-1"), zoned("b", 0, 10, "zone-2")],
            snap: {
                let mut snap = Snapshot::default();
                zoned_member(&mut snap, "n1", "a", "zone-1");
                zoned_member(&mut snap, "n2", "b", "zone-2");
                let back = |mut p: PodView| {
                    p.labels.insert("tier".into(), "back".into());
                    p
                };
                // zone-1 has room and a pod for each term; only zone-2's full node has a pod
                // matching both.
                snap.pods
                    .push(on(labelled(pod("db-0", 500, 1), "db"), "n1"));
                snap.pods.push(on(back(pod("batch-0", 500, 1)), "n1"));
                snap.pods
                    .push(on(back(labelled(pod("db-1", 4000, 1), "db")), "n2"));
                let mut client = near(pod("client", 500, 1), "db", ZONE);
                if let Some(c) = client.constraints.as_deref_mut() {
                    let mut tier = app_term("", ZONE);
                    tier.selector = Some(SelectorView {
                        labels: BTreeMap::from([("tier".to_string(), "back".to_string())]),
                        expressions: Vec::new(),
                    });
                    c.affinity.push(tier);
                }
                snap.pods.push(client);
                snap
            },
            ups: vec![("b", 1)],
            refused: vec![],
        },
        Case {
            name: "a series with affinity to itself starts on one node, and stops when it is full",
            groups: web(),
            snap: Snapshot {
                pods: (0..5)
                    .map(|i| near(labelled(pod(&format!("s{i}"), 1000, 1), "s"), "s", HOSTNAME))
                    .collect(),
                ..Snapshot::default()
            },
            ups: vec![("web", 1)],
            refused: vec!["default/s4"],
        },
        Case {
            name: "zone anti-affinity: one replica per zone, one node per group",
            groups: vec![
                zoned("a", 0, 10, "zone-1"),
                zoned("b", 0, 10, "zone-2"),
                zoned("c", 0, 10, "zone-3"),
            ],
            snap: Snapshot {
                pods: (0..3)
                    .map(|i| anti(labelled(pod(&format!("r{i}"), 500, 1), "db"), "db", ZONE))
                    .collect(),
                ..Snapshot::default()
            },
            ups: vec![("a", 1), ("b", 1), ("c", 1)],
            refused: vec![],
        },
        Case {
            name: "zone spread with maxSkew 1: the zone that would not violate it grows",
            groups: vec![zoned("a", 0, 10, "zone-1"), zoned("b", 0, 10, "zone-2")],
            snap: {
                let mut snap = Snapshot::default();
                zoned_member(&mut snap, "n1", "a", "zone-1");
                zoned_member(&mut snap, "n2", "b", "zone-2");
                snap.pods
                    .push(on(labelled(pod("web-0", 4000, 1), "web"), "n1"));
                snap.pods.push(on(pod("filler", 4000, 1), "n2"));
                snap.pods
                    .push(zone_spread(labelled(pod("web-1", 500, 1), "web"), "web", 1));
                snap
            },
            ups: vec![("b", 1)],
            refused: vec![],
        },
        Case {
            name: "zone spread no group can satisfy: refused, not a useless node",
            groups: vec![zoned("a", 0, 10, "zone-1")],
            snap: {
                // The node outside any group keeps zone-2 in the spread, at 0.
                let mut snap = zone_2_outside_the_groups(Vec::new());
                snap.pods
                    .push(zone_spread(labelled(pod("web-1", 500, 1), "web"), "web", 1));
                snap
            },
            ups: vec![],
            refused: vec!["default/web-1"],
        },
        Case {
            name: "zone spread, nodeTaintsPolicy Honor: a zone whose only node repels the pod is no domain",
            groups: vec![zoned("a", 0, 10, "zone-1")],
            snap: {
                // Under Ignore the tainted node keeps zone-2 in the spread (the case above).
                let mut snap = zone_2_outside_the_groups(vec![TaintView {
                    key: "dedicated".into(),
                    value: "db".into(),
                    effect: TaintEffect::NoSchedule,
                }]);
                let mut web = zone_spread(labelled(pod("web-1", 500, 1), "web"), "web", 1);
                if let Some(c) = web.constraints.as_deref_mut() {
                    c.spread[0].honor_taints = true;
                }
                snap.pods.push(web);
                snap
            },
            ups: vec![("a", 1)],
            refused: vec![],
        },
        Case {
            name: "two pods of one spread with different minDomains: each is held to its own",
            groups: vec![zoned("a", 0, 10, "zone-1"), zoned("b", 0, 10, "zone-2")],
            snap: {
                let mut snap = Snapshot::default();
                zoned_member(&mut snap, "n1", "a", "zone-1");
                zoned_member(&mut snap, "n2", "b", "zone-2");
                snap.pods
                    .push(on(labelled(pod("web-0", 4000, 1), "web"), "n1"));
                snap.pods
                    .push(on(labelled(pod("web-1", 4000, 1), "web"), "n2"));
                // Two zones: minDomains 3 takes the global minimum as 0, so a second pod in
                // either zone skews it by 2.
                for (name, min_domains) in [("web-a", 1), ("web-b", 3)] {
                    let mut web = zone_spread(labelled(pod(name, 500, 1), "web"), "web", 1);
                    if let Some(c) = web.constraints.as_deref_mut() {
                        c.spread[0].min_domains = min_domains;
                    }
                    snap.pods.push(web);
                }
                snap
            },
            ups: vec![("a", 1)],
            refused: vec!["default/web-b"],
        },
        Case {
            name: "zone spread on an empty cluster: the zones the groups offer are its domains, 10/10/10",
            groups: three_zones(),
            snap: spread_pods(30, 1),
            ups: vec![("za", 2), ("zb", 2), ("zc", 2)],
            refused: vec![],
        },
        Case {
            name: "zone spread with minDomains 3 on an empty cluster: the three zones offered meet it",
            groups: three_zones(),
            snap: spread_pods(30, 3),
            ups: vec![("za", 2), ("zb", 2), ("zc", 2)],
            refused: vec![],
        },
        Case {
            name: "zone spread over groups that offer one zone: that zone alone, as before",
            groups: vec![zoned("za", 0, 10, "zone-1"), zoned("zb", 0, 10, "zone-1")],
            snap: spread_pods(3, 1),
            ups: vec![("za", 1)],
            refused: vec![],
        },
        Case {
            name: "without constraints, three replicas share one node as before",
            groups: web(),
            snap: Snapshot {
                pods: (0..3)
                    .map(|i| labelled(pod(&format!("r{i}"), 500, 1), "db"))
                    .collect(),
                ..Snapshot::default()
            },
            ups: vec![("web", 1)],
            refused: vec![],
        },
    ];
    for c in cases {
        let a = decide(&c.snap, t0(), &settings(c.groups));
        let ups: Vec<(String, u32)> = scale_ups(&a).into_iter().map(|(g, n, _)| (g, n)).collect();
        let want: Vec<(String, u32)> = c.ups.iter().map(|(g, n)| (g.to_string(), *n)).collect();
        assert_eq!(ups, want, "{}: {a:?}", c.name);
        let refused: Vec<String> = a
            .iter()
            .filter_map(|a| match a {
                Action::NoScaleUp { pod, reason }
                    if reason.contains(
                        "pod affinity, anti-affinity or topology spread cannot be satisfied",
                    ) =>
                {
                    Some(pod.clone())
                }
                _ => None,
            })
            .collect();
        assert_eq!(refused, c.refused, "{}: {a:?}", c.name);
    }
}

/// Only hard constraints reach the scaler: preferred terms and `ScheduleAnyway` spread leave a
/// pod without constraints.
#[test]
fn pod_view_keeps_only_required_terms_and_do_not_schedule_spread() {
    let pod = |affinity: serde_json::Value, spread: serde_json::Value| {
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}], "affinity": affinity,
                "topologySpreadConstraints": spread},
        }))
        .expect("pod");
        crate::scaler::model::pod_view(&p, &Default::default())
            .expect("view")
            .constraints
    };
    let term = serde_json::json!({"labelSelector": {"matchLabels": {"app": "db"}},
        "topologyKey": HOSTNAME});
    let soft = pod(
        serde_json::json!({
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
                [{"weight": 100, "podAffinityTerm": term}]},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
                [{"weight": 100, "podAffinityTerm": term}]},
        }),
        serde_json::json!([{"maxSkew": 1, "topologyKey": ZONE,
            "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "db"}}}]),
    );
    assert_eq!(soft, None);
    let hard = pod(
        serde_json::json!({
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]},
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE,
                 "namespaceSelector": {}}]},
        }),
        serde_json::json!([{"maxSkew": 2, "topologyKey": ZONE, "minDomains": 3,
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "db"}},
            "nodeTaintsPolicy": "Honor"}]),
    )
    .expect("constraints");
    let mut own = app_term("db", HOSTNAME);
    own.namespaces = Namespaces::Only(vec!["ns".into()]);
    assert_eq!(hard.anti_affinity, vec![own]);
    let mut all = app_term("db", ZONE);
    all.namespaces = Namespaces::All;
    assert_eq!(hard.affinity, vec![all]);
    assert_eq!(
        hard.spread,
        vec![SpreadView {
            max_skew: 2,
            topology_key: ZONE.into(),
            selector: app_term("db", ZONE).selector,
            min_domains: 3,
            ignore_node_affinity: false,
            honor_taints: true,
        }]
    );
}

/// `matchLabelKeys` (and affinity's `mismatchLabelKeys`) narrow a term to the pod's own values
/// of those labels, as kube-apiserver merges them into the selector at creation since 1.33/1.34
/// (the real one does: tests/scaler_real.rs) and older schedulers do at scheduling: a rollout's
/// new replicas spread among themselves, not against the old ReplicaSet's. Merged once, from
/// either: a selector the API server already merged gains nothing; a key the pod lacks is
/// ignored.
#[test]
fn pod_view_merges_match_label_keys_into_the_selectors() {
    let view = |expressions: serde_json::Value| {
        let selector = serde_json::json!({"matchLabels": {"app": "web"},
            "matchExpressions": expressions});
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns",
                "labels": {"app": "web", "pod-template-hash": "abc", "tenant": "t1"}},
            "spec": {"containers": [{"name": "c"}],
                "affinity": {
                    "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": selector, "topologyKey": ZONE,
                         "matchLabelKeys": ["pod-template-hash", "absent"],
                         "mismatchLabelKeys": ["tenant"]}]},
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": selector, "topologyKey": HOSTNAME,
                         "matchLabelKeys": ["pod-template-hash"]}]}},
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
                    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": selector,
                    "matchLabelKeys": ["pod-template-hash"]}]},
        }))
        .expect("pod");
        let c = crate::scaler::model::pod_view(&p, &Default::default())
            .expect("view")
            .constraints
            .expect("constraints");
        let sel = |s: &Option<SelectorView>| s.clone().expect("selector");
        (
            sel(&c.affinity[0].selector),
            sel(&c.anti_affinity[0].selector),
            sel(&c.spread[0].selector),
        )
    };
    let hash = req("pod-template-hash", "In", &["abc"]);
    let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
    let want = |expressions: Vec<Requirement>| SelectorView {
        labels: labels.clone(),
        expressions,
    };
    let (affinity, anti, spread) = view(serde_json::json!([]));
    assert_eq!(
        affinity,
        want(vec![hash.clone(), req("tenant", "NotIn", &["t1"])])
    );
    assert_eq!(anti, want(vec![hash.clone()]));
    assert_eq!(spread, want(vec![hash.clone()]));
    // As kube-apiserver 1.37 stores it: already merged.
    let merged = serde_json::json!([
        {"key": "pod-template-hash", "operator": "In", "values": ["abc"]},
        {"key": "tenant", "operator": "NotIn", "values": ["t1"]}]);
    let (affinity, anti, spread) = view(merged);
    assert_eq!(
        affinity,
        want(vec![hash.clone(), req("tenant", "NotIn", &["t1"])])
    );
    assert_eq!(
        anti,
        want(vec![hash.clone(), req("tenant", "NotIn", &["t1"])])
    );
    assert_eq!(
        spread,
        want(vec![hash.clone(), req("tenant", "NotIn", &["t1"])])
    );
}

#[test]
fn existing_node_taints_and_cordons_are_respected() {
    let s = settings(vec![group("web", 0, 3)]);
    let mut snap = Snapshot::default();
    member(&mut snap, "a", "web");
    snap.nodes[0].taints.push(TaintView {
        key: "dedicated".into(),
        value: "x".into(),
        effect: TaintEffect::NoSchedule,
    });
    member(&mut snap, "b", "web");
    snap.nodes[1].unschedulable = true;
    snap.pods.push(pod("p", 500, 1));
    assert_eq!(scale_ups(&decide(&snap, t0(), &s)).len(), 1);
    // PreferNoSchedule does not keep a pod away.
    snap.nodes[0].taints[0].effect = TaintEffect::PreferNoSchedule;
    assert!(scale_ups(&decide(&snap, t0(), &s)).is_empty());
}

/// Taints and tolerations as the API gives them, read by `node_view` and `pod_view`: an
/// effect or operator this version does not know never panics; an unknown taint effect keeps
/// pods away as NoSchedule does; a toleration with no effect tolerates every effect of its key,
/// one with no operator is `Equal`, and one with an unknown operator or effect tolerates
/// nothing.
#[test]
fn tolerations_against_taints_as_the_api_gives_them() {
    use serde_json::{Value, json};
    let tolerates_taint = |taint: Value, toleration: Value| {
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
            "metadata": {"name": "n"}, "spec": {"taints": [taint]},
        }))
        .expect("node");
        let tolerations = if toleration.is_null() {
            json!([])
        } else {
            json!([toleration])
        };
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}], "tolerations": tolerations},
        }))
        .expect("pod");
        let node = crate::scaler::model::node_view(&node);
        let pod = crate::scaler::model::pod_view(&p, &Default::default()).expect("view");
        tolerates(&pod, &node.taints)
    };
    let taint = |effect: &str| json!({"key": "k", "value": "v", "effect": effect});
    let cases = [
        (
            "NoSchedule, no toleration",
            taint("NoSchedule"),
            Value::Null,
            false,
        ),
        (
            "NoExecute, no toleration",
            taint("NoExecute"),
            Value::Null,
            false,
        ),
        (
            "PreferNoSchedule never blocks",
            taint("PreferNoSchedule"),
            Value::Null,
            true,
        ),
        (
            "an unknown effect blocks",
            taint("Sometimes"),
            Value::Null,
            false,
        ),
        ("an empty effect blocks", taint(""), Value::Null, false),
        (
            "no effect: every effect of the key",
            taint("NoExecute"),
            json!({"key": "k", "operator": "Exists"}),
            true,
        ),
        (
            "no effect: an unknown effect too",
            taint("Sometimes"),
            json!({"key": "k", "operator": "Exists"}),
            true,
        ),
        (
            "an unknown effect is NoSchedule",
            taint("Sometimes"),
            json!({"key": "k", "operator": "Exists", "effect": "NoSchedule"}),
            true,
        ),
        (
            "another effect",
            taint("NoExecute"),
            json!({"key": "k", "operator": "Exists", "effect": "NoSchedule"}),
            false,
        ),
        (
            "no operator is Equal: same value",
            taint("NoSchedule"),
            json!({"key": "k", "value": "v"}),
            true,
        ),
        (
            "no operator is Equal: other value",
            taint("NoSchedule"),
            json!({"key": "k", "value": "w"}),
            false,
        ),
        (
            "no key, Exists: everything",
            taint("Sometimes"),
            json!({"operator": "Exists"}),
            true,
        ),
        (
            "no key, Equal: nothing",
            taint("NoSchedule"),
            json!({"operator": "Equal", "value": "v"}),
            false,
        ),
        (
            "an unknown operator tolerates nothing",
            taint("NoSchedule"),
            json!({"key": "k", "operator": "Gt", "value": "v"}),
            false,
        ),
        (
            "an unknown toleration effect tolerates nothing",
            taint("Sometimes"),
            json!({"key": "k", "operator": "Exists", "effect": "Sometimes"}),
            false,
        ),
    ];
    for (name, taint, toleration, want) in cases {
        assert_eq!(tolerates_taint(taint, toleration), want, "{name}");
    }
}

#[test]
fn expanders() {
    let mut small = group("small", 0, 10);
    small.capacity.resources = res(2000, 4, 110);
    let mut big = group("big", 0, 10);
    big.capacity.resources = res(16_000, 64, 110);
    big.priority = 10;
    let mut snap = Snapshot::default();
    snap.pods.push(pod("p", 1500, 3));
    // least-waste: one small node wastes less than one big node.
    let mut s = settings(vec![small.clone(), big.clone()]);
    assert_eq!(scale_ups(&decide(&snap, t0(), &s))[0].0, "small");
    s.expander = Expander::Priority;
    assert_eq!(scale_ups(&decide(&snap, t0(), &s))[0].0, "big");
    // random: repeatable for the same input, and both groups come up across inputs.
    s.expander = Expander::Random;
    let first = decide(&snap, t0(), &s);
    assert_eq!(first, decide(&snap, t0(), &s), "same input, same choice");
    let chosen: std::collections::BTreeSet<String> = (0..40)
        .map(|i| scale_ups(&decide(&snap, at(i), &s))[0].0.clone())
        .collect();
    assert_eq!(
        chosen.len(),
        2,
        "random picks both groups over time: {chosen:?}"
    );
}

#[test]
fn min_and_standby() {
    let mut g = group("web", 2, 5);
    let s = settings(vec![g.clone()]);
    let snap = Snapshot::default();
    assert_eq!(
        scale_ups(&decide(&snap, t0(), &s)),
        vec![("web".into(), 2, ScaleUpReason::BelowMin)]
    );
    // Standby: two empty ready nodes wanted, one exists, one busy.
    g.min = 0;
    g.standby = 2;
    let s = settings(vec![g]);
    let mut snap = Snapshot::default();
    member(&mut snap, "a", "web");
    member(&mut snap, "b", "web");
    snap.pods.push(on(pod("busy", 3000, 1), "b"));
    assert_eq!(
        scale_ups(&decide(&snap, t0(), &s)),
        vec![("web".into(), 1, ScaleUpReason::Standby)]
    );
    // A registering machine counts as standby.
    snap.machines.push(machine("c", "web", t0()));
    assert!(scale_ups(&decide(&snap, t0(), &s)).is_empty());
    // Standby nodes are never scaled down, even when unneeded for long.
    let mut snap = Snapshot::default();
    member(&mut snap, "a", "web");
    member(&mut snap, "b", "web");
    for n in &mut snap.nodes {
        n.unneeded_since = Some(at(-60));
    }
    let a = decide(&snap, t0(), &s);
    assert!(scale_downs(&a).is_empty(), "{a:?}");
}

/// Builds a group of three nodes where "a" is lightly used and could go.
fn scale_down_snapshot() -> Snapshot {
    let mut snap = Snapshot::default();
    for n in ["a", "b", "c"] {
        member(&mut snap, n, "web");
    }
    snap.pods.push(on(pod("light", 500, 1), "a"));
    snap.pods.push(on(pod("b1", 2500, 1), "b"));
    snap.pods.push(on(pod("c1", 2500, 1), "c"));
    snap
}

#[test]
fn unneeded_nodes_are_marked_then_removed_after_the_unneeded_time() {
    let s = settings(vec![group("web", 0, 10)]);
    let mut snap = scale_down_snapshot();
    let a = decide(&snap, t0(), &s);
    let marked: Vec<&String> = a
        .iter()
        .filter_map(|a| match a {
            Action::MarkUnneeded { node, since } if *since == t0() => Some(node),
            _ => None,
        })
        .collect();
    assert_eq!(marked, ["a"], "b and c are above the threshold: {a:?}");
    snap.nodes[0].unneeded_since = Some(t0());
    assert!(
        scale_downs(&decide(&snap, at(9), &s)).is_empty(),
        "not before 10 minutes"
    );
    assert_eq!(scale_downs(&decide(&snap, at(10), &s)), ["a"]);
    // Load came back: the mark is cleared.
    snap.pods.push(on(pod("heavy", 3000, 1), "a"));
    let a = decide(&snap, at(10), &s);
    assert!(scale_downs(&a).is_empty());
    assert!(
        a.contains(&Action::ClearUnneeded { node: "a".into() }),
        "{a:?}"
    );
}

/// Every protection keeps node "a" (unneeded for an hour otherwise) from being removed.
#[test]
fn scale_down_protections() {
    type Case = (&'static str, Box<dyn Fn(&mut Snapshot)>);
    let cases: Vec<Case> = vec![
        (
            "control-plane label",
            Box::new(|s| {
                s.nodes[0].labels.insert(
                    "node-role.kubernetes.io/control-plane".into(),
                    String::new(),
                );
            }),
        ),
        (
            "master label",
            Box::new(|s| {
                s.nodes[0]
                    .labels
                    .insert("node-role.kubernetes.io/master".into(), String::new());
            }),
        ),
        (
            "etcd label",
            Box::new(|s| {
                s.nodes[0]
                    .labels
                    .insert("node-role.kubernetes.io/etcd".into(), String::new());
            }),
        ),
        (
            "scale-down-disabled annotation",
            Box::new(|s| s.nodes[0].scale_down_disabled = true),
        ),
        (
            "safe-to-evict false",
            Box::new(|s| s.pods[0].safe_to_evict = Some(false)),
        ),
        (
            "emptyDir (the drain refuses it)",
            Box::new(|s| s.pods[0].fate = Fate::Refuse(RefuseReason::EmptyDir)),
        ),
        ("hostPath", Box::new(|s| s.pods[0].host_path = true)),
        (
            "no controller (the drain refuses it)",
            Box::new(|s| s.pods[0].fate = Fate::Refuse(RefuseReason::Unmanaged)),
        ),
        (
            "drain: never (the drain refuses it)",
            Box::new(|s| s.pods[0].fate = Fate::Refuse(RefuseReason::Annotated)),
        ),
        (
            "no group label",
            Box::new(|s| {
                s.nodes[0].labels.remove(NODE_GROUP_LABEL);
                s.machines.remove(0);
            }),
        ),
        (
            "group not configured",
            Box::new(|s| {
                s.nodes[0]
                    .labels
                    .insert(NODE_GROUP_LABEL.into(), "other".into());
                s.machines[0].group = "other".into();
            }),
        ),
        (
            "no machine at the provider",
            Box::new(|s| {
                s.machines.remove(0);
            }),
        ),
        (
            "pods do not fit elsewhere",
            Box::new(|s| {
                s.pods[0].requests.cpu_milli = 1900;
                s.pods[1].requests.cpu_milli = 2500;
                s.pods[2].requests.cpu_milli = 2500;
            }),
        ),
        (
            "pod's selector matches only this node",
            Box::new(|s| {
                s.pods[0]
                    .node_selector
                    .insert("kubernetes.io/hostname".into(), "a".into());
            }),
        ),
        (
            "utilisation above threshold",
            Box::new(|s| s.pods[0].requests.memory = 9 * GI),
        ),
        (
            "booting node",
            Box::new(|s| {
                s.nodes[0].taints.push(TaintView {
                    key: STARTUP_TAINT_KEY.into(),
                    value: String::new(),
                    effect: TaintEffect::NoSchedule,
                });
            }),
        ),
        (
            "cordoned by someone else",
            Box::new(|s| s.nodes[0].unschedulable = true),
        ),
    ];
    let s = settings(vec![group("web", 0, 10)]);
    let mut base = scale_down_snapshot();
    base.nodes[0].unneeded_since = Some(at(-60));
    assert_eq!(
        scale_downs(&decide(&base, t0(), &s)),
        ["a"],
        "the base case removes a"
    );
    for (what, f) in cases {
        let mut snap = base.clone();
        f(&mut snap);
        let a = decide(&snap, t0(), &s);
        assert!(!scale_downs(&a).contains(&"a".to_string()), "{what}: {a:?}");
    }
    // DaemonSet and mirror pods do not block, not even with a hostPath volume and no
    // safe-to-evict annotation: flannel's pod on a real node (every node of a flannel cluster)
    // kept the scaler from ever taking an empty node away.
    for f in [
        |p: &mut PodView| p.fate = Fate::Skip(SkipReason::DaemonSet),
        |p: &mut PodView| p.fate = Fate::Skip(SkipReason::Mirror),
    ] {
        let mut snap = base.clone();
        let mut ds = on(pod("ds", 100, 1), "a");
        ds.host_path = true;
        f(&mut ds);
        snap.pods.push(ds);
        assert_eq!(scale_downs(&decide(&snap, t0(), &s)), ["a"]);
    }
    // safe-to-evict "true" lets a hostPath pod go (it cannot overrule the drain's refusals).
    let mut snap = base.clone();
    snap.pods[0].host_path = true;
    snap.pods[0].safe_to_evict = Some(true);
    assert_eq!(scale_downs(&decide(&snap, t0(), &s)), ["a"]);
}

#[test]
fn never_below_min_and_bounded_per_pass() {
    let mut snap = Snapshot::default();
    for i in 0..15 {
        member(&mut snap, &format!("n{i:02}"), "web");
        snap.nodes[i].unneeded_since = Some(at(-60));
    }
    let s = settings(vec![group("web", 12, 20)]);
    assert_eq!(
        scale_downs(&decide(&snap, t0(), &s)).len(),
        3,
        "15 nodes, min 12"
    );
    let s = settings(vec![group("web", 0, 20)]);
    assert_eq!(
        scale_downs(&decide(&snap, t0(), &s)).len(),
        10,
        "max_empty_bulk_delete empty nodes per pass"
    );
    // Non-empty nodes go one per pass.
    for i in 0..15 {
        snap.pods
            .push(on(pod(&format!("p{i}"), 100, 1), &format!("n{i:02}")));
    }
    assert_eq!(scale_downs(&decide(&snap, t0(), &s)).len(), 1);
}

#[test]
fn no_scale_down_while_scaling_up() {
    let s = settings(vec![group("web", 0, 10)]);
    let mut snap = scale_down_snapshot();
    snap.nodes[0].unneeded_since = Some(at(-60));
    snap.pods.push(pod("needs-room", 3900, 1));
    let a = decide(&snap, t0(), &s);
    assert!(scale_downs(&a).is_empty(), "{a:?}");
}

/// A node that was ready before and reboots gets the startup taint back (the continuous
/// controller, the agent) until its gates pass again: however old its machine, it is no
/// "never ready" node. NotReady long enough, it is replaced by the NotReady rule, under its
/// per-pass cap and the cluster-health guard (issue 41, defect 1).
#[test]
fn a_rebooting_node_is_never_never_ready() {
    let s = settings(vec![group("web", 0, 10)]);
    let rebooting = |n: &mut NodeView| {
        n.taints.push(TaintView {
            key: STARTUP_TAINT_KEY.into(),
            value: String::new(),
            effect: TaintEffect::NoSchedule,
        });
        n.ever_ready = true;
        n.ready = false;
        n.ready_transition = Some(at(59));
    };
    let repairs = |a: &[Action]| -> Vec<RepairReason> {
        a.iter()
            .filter_map(|a| match a {
                Action::Repair { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect()
    };
    let mut snap = Snapshot::default();
    for name in ["r1", "r2", "r3", "r4", "r5"] {
        member(&mut snap, name, "web");
    }
    rebooting(&mut snap.nodes[0]);
    assert_eq!(
        repairs(&decide(&snap, at(60), &s)),
        [],
        "an hour old, rebooting"
    );
    snap.nodes[0].not_ready_in_time = true;
    assert_eq!(
        repairs(&decide(&snap, at(60), &s)),
        [],
        "its agent gave up after a restart"
    );
    assert_eq!(
        repairs(&decide(&snap, at(79), &s)),
        [RepairReason::Unready],
        "NotReady for unready_delete_time: the NotReady rule"
    );

    // A reboot wave: four of five NotReady at once is the cluster guard's to hold.
    for n in &mut snap.nodes[1..4] {
        rebooting(n);
    }
    let a = decide(&snap, at(80), &s);
    assert_eq!(repairs(&a), [], "{a:?}");
    assert!(
        a.iter().any(|a| matches!(
            a,
            Action::GuardHolds {
                group: None,
                unready: 4,
                ..
            }
        )),
        "{a:?}"
    );
}

#[test]
fn repair_and_backoff() {
    let s = settings(vec![group("web", 0, 10)]);
    // A machine that never registered: deleted after max_provision_time, group backs off.
    let mut snap = Snapshot::default();
    snap.machines.push(machine("ghost", "web", t0()));
    assert!(
        decide(&snap, at(9), &s)
            .iter()
            .all(|a| !matches!(a, Action::Repair { .. }))
    );
    let a = decide(&snap, at(10), &s);
    assert!(
        a.contains(&Action::Repair {
            group: "web".into(),
            machine: "m-ghost".into(),
            node: None,
            reason: RepairReason::NeverRegistered
        }),
        "{a:?}"
    );
    assert!(
        a.contains(&Action::BackOff {
            group: "web".into(),
            failures: 1,
            until: at(15)
        }),
        "{a:?}"
    );
    // Backoff doubles and is capped.
    snap.backoff.insert(
        "web".into(),
        Backoff {
            failures: 3,
            last_failure: Some(at(0)),
            until: Some(at(5)),
        },
    );
    let a = decide(&snap, at(10), &s);
    assert!(
        a.contains(&Action::BackOff {
            group: "web".into(),
            failures: 4,
            until: at(40)
        }),
        "{a:?}"
    );
    snap.backoff.insert(
        "web".into(),
        Backoff {
            failures: 9,
            last_failure: Some(at(0)),
            until: Some(at(5)),
        },
    );
    let a = decide(&snap, at(10), &s);
    assert!(
        a.contains(&Action::BackOff {
            group: "web".into(),
            failures: 10,
            until: at(40)
        }),
        "{a:?}"
    );

    // While backing off, pending pods do not scale the group up.
    let mut snap = Snapshot::default();
    snap.backoff.insert(
        "web".into(),
        Backoff {
            failures: 1,
            last_failure: Some(t0()),
            until: Some(at(5)),
        },
    );
    snap.pods.push(pod("p", 500, 1));
    let a = decide(&snap, at(1), &s);
    assert!(scale_ups(&a).is_empty());
    assert!(no_scale_up(&a)[0].contains("backing off"), "{a:?}");
    assert_eq!(
        scale_ups(&decide(&snap, at(6), &s)).len(),
        1,
        "after the back-off"
    );

    // A node still booting after max_provision_time, or reported NotReadyInTime.
    let mut snap = Snapshot::default();
    let mut n = node("slow", Some("web"));
    n.taints.push(TaintView {
        key: STARTUP_TAINT_KEY.into(),
        value: String::new(),
        effect: TaintEffect::NoSchedule,
    });
    snap.nodes.push(n);
    snap.machines.push(machine("slow", "web", t0()));
    assert!(
        !decide(&snap, at(5), &s)
            .iter()
            .any(|a| matches!(a, Action::Repair { .. }))
    );
    assert!(decide(&snap, at(10), &s).iter().any(|a| matches!(
        a,
        Action::Repair {
            reason: RepairReason::NeverReady,
            ..
        }
    )));
    snap.nodes[0].not_ready_in_time = true;
    assert!(decide(&snap, at(5), &s).iter().any(|a| matches!(
        a,
        Action::Repair {
            reason: RepairReason::NeverReady,
            ..
        }
    )));

    // NotReady for unready_delete_time: replaced, without a back-off.
    let mut snap = Snapshot::default();
    member(&mut snap, "sick", "web");
    snap.nodes[0].ready = false;
    snap.nodes[0].ready_transition = Some(t0());
    assert!(
        !decide(&snap, at(19), &s)
            .iter()
            .any(|a| matches!(a, Action::Repair { .. }))
    );
    let a = decide(&snap, at(20), &s);
    assert!(a.iter().any(|a| matches!(
        a,
        Action::Repair {
            reason: RepairReason::Unready,
            ..
        }
    )));
    for protect in [
        |n: &mut NodeView| {
            n.labels.insert(
                "node-role.kubernetes.io/control-plane".into(),
                String::new(),
            );
        },
        |n: &mut NodeView| n.scale_down_disabled = true,
    ] {
        let mut protected = snap.clone();
        protect(&mut protected.nodes[0]);
        assert!(
            !decide(&protected, at(60), &s)
                .iter()
                .any(|a| matches!(a, Action::Repair { .. })),
            "control-plane and scale-down-disabled nodes are never deleted"
        );
    }
    assert!(!a.iter().any(|a| matches!(a, Action::BackOff { .. })));

    // A ready node created after the last failure clears the back-off.
    let mut snap = Snapshot::default();
    member(&mut snap, "good", "web");
    snap.nodes[0].created = Some(at(2));
    snap.backoff.insert(
        "web".into(),
        Backoff {
            failures: 2,
            last_failure: Some(at(1)),
            until: Some(at(30)),
        },
    );
    assert!(decide(&snap, at(3), &s).contains(&Action::ClearBackOff {
        group: "web".into()
    }));
}

#[test]
fn scale_down_in_progress_is_resumed() {
    let s = settings(vec![group("web", 0, 10)]);
    let mut snap = scale_down_snapshot();
    snap.nodes[1].unschedulable = true;
    snap.nodes[1].scale_down_in_progress = true;
    assert_eq!(scale_downs(&decide(&snap, t0(), &s)), ["b"]);
}

/// A scale-down is under way only while its cordon is nodeward's: a record `kubectl uncordon`
/// left behind, under a later `kubectl cordon`, is the administrator's cordon, not a scale-down
/// to finish by draining the node and deleting its machine.
#[test]
fn a_stale_scale_down_record_under_an_admin_cordon_is_no_scale_down() {
    use serde_json::json;
    let record = json!({"reason": format!("{} (unneeded)", crate::scaler::SCALE_DOWN_REASON),
                        "at": "2026-01-01T00:00:00Z"})
    .to_string();
    let node = |manager: &str| -> k8s_openapi::api::core::v1::Node {
        serde_json::from_value(json!({
            "metadata": {"name": "b", "annotations": {crate::names::CORDONED_BY: record},
                "managedFields": [{"manager": manager, "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:unschedulable": {}}}}]},
            "spec": {"unschedulable": true},
        }))
        .expect("node")
    };
    let in_progress = |m| crate::scaler::model::node_view(&node(m)).scale_down_in_progress;
    assert!(
        in_progress(crate::names::FIELD_MANAGER),
        "nodeward's own cordon"
    );
    assert!(!in_progress("kubectl-cordon"), "an administrator's cordon");
}

/// An operator who opts a node out while its scale-down is under way (a restart, a new leader,
/// a drain that failed and is retried) gets it back: the scale-down is cancelled, not resumed.
#[test]
fn a_scale_down_opted_out_since_is_cancelled_not_resumed() {
    let s = settings(vec![group("web", 0, 10)]);
    let mut snap = scale_down_snapshot();
    snap.nodes[1].unschedulable = true;
    snap.nodes[1].scale_down_in_progress = true;
    snap.nodes[1].scale_down_disabled = true;
    let a = decide(&snap, t0(), &s);
    assert!(scale_downs(&a).is_empty(), "{a:?}");
    assert!(
        a.contains(&Action::CancelScaleDown {
            group: "web".into(),
            node: "b".into(),
        }),
        "{a:?}"
    );
}

#[test]
fn a_node_left_behind_by_a_scale_down_is_deleted() {
    let s = settings(vec![group("web", 0, 10)]);
    let mut snap = scale_down_snapshot();
    snap.nodes[1].unschedulable = true;
    snap.nodes[1].scale_down_in_progress = true;
    snap.machines.retain(|m| m.hostname != "b");
    let a = decide(&snap, t0(), &s);
    assert!(
        a.contains(&Action::DeleteNode {
            group: "web".into(),
            node: "b".into(),
            reason: DeleteNodeReason::ScaledDown,
        }),
        "{a:?}"
    );
    // An admin's cordon on a node without a machine is left alone.
    snap.nodes[1].scale_down_in_progress = false;
    assert!(
        !decide(&snap, t0(), &s)
            .iter()
            .any(|a| matches!(a, Action::DeleteNode { .. }))
    );
}

#[test]
fn unneeded_annotation_name_is_stable() {
    // Renaming it would make every running scaler forget its countdowns on upgrade.
    assert_eq!(UNNEEDED_SINCE, "nodeward.io/unneeded-since");
}

fn budget(name: &str, app: Option<&str>, allowed: i32) -> BudgetView {
    BudgetView {
        namespace: "default".into(),
        name: name.into(),
        selector: app.map(|a| SelectorView {
            labels: BTreeMap::from([("app".to_string(), a.to_string())]),
            expressions: Vec::new(),
        }),
        disruptions_allowed: allowed,
    }
}

fn labelled(mut p: PodView, app: &str) -> PodView {
    p.labels.insert("app".into(), app.into());
    p
}

/// Nodes "a" and "b" each hold one light `app=api` pod and could both go; "c" and "d" are busy
/// (at the utilisation threshold) and have room for both.
fn budget_snapshot() -> Snapshot {
    let mut snap = Snapshot::default();
    for n in ["a", "b", "c", "d"] {
        member(&mut snap, n, "web");
    }
    snap.pods.push(labelled(on(pod("a1", 500, 1), "a"), "api"));
    snap.pods.push(labelled(on(pod("b1", 500, 1), "b"), "api"));
    snap.pods
        .push(labelled(on(pod("c1", 2000, 1), "c"), "other"));
    snap.pods
        .push(labelled(on(pod("d1", 2000, 1), "d"), "other"));
    snap
}

fn marked(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::MarkUnneeded { node, .. } => Some(node.clone()),
            _ => None,
        })
        .collect()
}

/// A node is unneeded only if every pod on it could leave now, with `disruptionsAllowed` spent
/// across the nodes chosen in the same pass.
#[test]
fn budgets_decide_which_nodes_can_go() {
    type Case = (
        &'static str,
        Box<dyn Fn(&mut Snapshot)>,
        &'static [&'static str],
    );
    let cases: Vec<Case> = vec![
        ("no budget", Box::new(|_| {}), &["a", "b"]),
        (
            "a budget that allows no disruption",
            Box::new(|s| s.budgets.push(budget("api", Some("api"), 0))),
            &[],
        ),
        (
            "one disruption is spent on the first node of the pass",
            Box::new(|s| s.budgets.push(budget("api", Some("api"), 1))),
            &["a"],
        ),
        (
            "two disruptions cover both",
            Box::new(|s| s.budgets.push(budget("api", Some("api"), 2))),
            &["a", "b"],
        ),
        (
            "a budget of another namespace",
            Box::new(|s| {
                let mut b = budget("api", Some("api"), 0);
                b.namespace = "other".into();
                s.budgets.push(b);
            }),
            &["a", "b"],
        ),
        (
            "a budget selecting other labels",
            Box::new(|s| s.budgets.push(budget("web", Some("web"), 0))),
            &["a", "b"],
        ),
        (
            "a budget without a selector selects nothing",
            Box::new(|s| s.budgets.push(budget("none", None, 0))),
            &["a", "b"],
        ),
        (
            "an empty selector selects the whole namespace",
            Box::new(|s| {
                let mut b = budget("all", None, 1);
                b.selector = Some(SelectorView::default());
                s.budgets.push(b);
            }),
            &["a"],
        ),
        (
            "matchExpressions",
            Box::new(|s| {
                let mut b = budget("expr", None, 0);
                b.selector = Some(SelectorView {
                    labels: BTreeMap::new(),
                    expressions: vec![req("app", "In", &["api", "x"])],
                });
                s.budgets.push(b);
            }),
            &[],
        ),
        (
            "a pod two budgets select cannot be evicted",
            Box::new(|s| {
                s.budgets.push(budget("api", Some("api"), 5));
                s.budgets.push(budget("api-too", Some("api"), 5));
            }),
            &[],
        ),
        (
            "a DaemonSet pod under a closed budget does not hold its node",
            Box::new(|s| {
                s.pods[0].fate = Fate::Skip(SkipReason::DaemonSet);
                s.budgets.push(budget("api", Some("api"), 0));
            }),
            &["a"],
        ),
        (
            "a second pod on the same node needs a second disruption",
            Box::new(|s| {
                // "b" (less used) goes first and takes one; "a" would need the other two.
                s.pods.push(labelled(on(pod("a2", 500, 1), "a"), "api"));
                s.budgets.push(budget("api", Some("api"), 2));
            }),
            &["b"],
        ),
    ];
    let s = settings(vec![group("web", 0, 10)]);
    for (what, f, want) in cases {
        let mut snap = budget_snapshot();
        f(&mut snap);
        let a = decide(&snap, t0(), &s);
        assert_eq!(marked(&a), want, "{what}: {a:?}");
    }
}

#[test]
fn a_budget_that_closed_stops_a_countdown() {
    let s = settings(vec![group("web", 0, 10)]);
    let mut snap = budget_snapshot();
    snap.nodes[0].unneeded_since = Some(at(-60));
    snap.budgets.push(budget("api", Some("api"), 0));
    let a = decide(&snap, t0(), &s);
    assert!(scale_downs(&a).is_empty(), "{a:?}");
    assert!(
        a.contains(&Action::ClearUnneeded { node: "a".into() }),
        "{a:?}"
    );
    snap.budgets[0].disruptions_allowed = 1;
    assert_eq!(scale_downs(&decide(&snap, t0(), &s)), ["a"]);
}

/// A node whose drain failed is not picked again until its pods or their budgets change.
#[test]
fn a_failed_scale_down_is_not_repeated_until_something_changed() {
    let s = settings(vec![group("web", 0, 10)]);
    let mut base = budget_snapshot();
    base.nodes[0].unneeded_since = Some(at(-60));
    base.budgets.push(budget("api", Some("api"), 2));
    assert_eq!(
        scale_downs(&decide(&base, t0(), &s)),
        ["a"],
        "the base case"
    );
    let on_a = |snap: &Snapshot| -> String {
        let pods: Vec<&PodView> = snap
            .pods
            .iter()
            .filter(|p| p.node.as_deref() == Some("a"))
            .collect();
        scale_down_fingerprint(&pods, &snap.budgets)
    };
    base.nodes[0].scale_down_failed = Some(on_a(&base));
    let a = decide(&base, t0(), &s);
    assert!(scale_downs(&a).is_empty(), "the same drain again: {a:?}");
    assert!(
        a.contains(&Action::ClearUnneeded { node: "a".into() }),
        "{a:?}"
    );
    type Case = (&'static str, Box<dyn Fn(&mut Snapshot)>, bool);
    let cases: Vec<Case> = vec![
        (
            "a pod came",
            Box::new(|s| s.pods.push(on(pod("a2", 100, 1), "a"))),
            true,
        ),
        (
            "a pod was replaced",
            Box::new(|s| s.pods[0].uid = "uid-a1-new".into()),
            true,
        ),
        (
            "the budget opened further",
            Box::new(|s| s.budgets[0].disruptions_allowed = 3),
            true,
        ),
        (
            "a budget of unrelated pods changed",
            Box::new(|s| s.budgets.push(budget("other", Some("other"), 1))),
            false,
        ),
        (
            "a DaemonSet pod came",
            Box::new(|s| {
                let mut ds = on(pod("ds", 100, 1), "a");
                ds.fate = Fate::Skip(SkipReason::DaemonSet);
                s.pods.push(ds);
            }),
            false,
        ),
        (
            "the same pods listed in another order",
            Box::new(|s| s.pods.reverse()),
            false,
        ),
    ];
    for (what, f, picked) in cases {
        let mut snap = base.clone();
        f(&mut snap);
        let got = scale_downs(&decide(&snap, t0(), &s));
        assert_eq!(got.contains(&"a".to_string()), picked, "{what}: {got:?}");
    }
}

/// The back-off rule the executor applies to refused creates is decide's: nothing for no
/// refusal, otherwise the failures add up and the wait doubles from `backoff_initial` (5 min)
/// up to `backoff_max` (30 min).
#[test]
fn refused_creates_back_off_by_decides_rule() {
    let s = settings(vec![group("web", 0, 10)]);
    let prev = |failures| Backoff {
        failures,
        last_failure: Some(at(-1)),
        until: Some(at(-1)),
    };
    let cases = [
        (None, 0, None),
        (Some(prev(3)), 0, None),
        (None, 1, Some((1, at(5)))),
        (None, 2, Some((2, at(10)))),
        (Some(prev(2)), 1, Some((3, at(20)))),
        (Some(prev(9)), 1, Some((10, at(30)))),
    ];
    for (before, refused, want) in cases {
        let got = back_off("web", before, refused, t0(), &s);
        let want = want.map(|(failures, until)| Action::BackOff {
            group: "web".into(),
            failures,
            until,
        });
        assert_eq!(got, want, "{before:?} + {refused}");
    }
}

/// Each phase on its own, from a plan an earlier phase might have left.
mod phases {
    use super::*;
    // The phase, not the test of the same name above.
    use crate::scaler::decide::min_and_standby;

    fn kinds(actions: &[Action]) -> Vec<&'static str> {
        actions
            .iter()
            .map(|a| match a {
                Action::ScaleUp { .. } => "ScaleUp",
                Action::NoScaleUp { .. } => "NoScaleUp",
                Action::MarkUnneeded { .. } => "MarkUnneeded",
                Action::ClearUnneeded { .. } => "ClearUnneeded",
                Action::ScaleDown { .. } => "ScaleDown",
                Action::Repair { .. } => "Repair",
                Action::BackOff { .. } => "BackOff",
                Action::DeleteNode { .. } => "DeleteNode",
                Action::CancelScaleDown { .. } => "CancelScaleDown",
                Action::ClearBackOff { .. } => "ClearBackOff",
                Action::GuardHolds { .. } => "GuardHolds",
                Action::ClusterShutdown { .. } => "ClusterShutdown",
                Action::StaleClusterShutdown { .. } => "StaleClusterShutdown",
            })
            .collect()
    }

    #[test]
    fn repair_shrinks_the_group_and_backs_it_off() {
        let s = settings(vec![group("web", 0, 10)]);
        let mut snap = Snapshot::default();
        member(&mut snap, "ok", "web");
        snap.machines.push(machine("ghost", "web", t0()));
        let cx = Context::new(&snap, at(10), &s);
        let mut plan = Plan::new(&cx);
        assert_eq!(plan.size, [2]);
        repair(&cx, &mut plan, None);
        assert_eq!(kinds(&plan.actions), ["Repair", "BackOff"]);
        assert_eq!(plan.size, [1], "the repaired machine no longer counts");
        assert!(plan.repaired.contains("ghost"));
        assert_eq!(plan.backing_off, [true]);
    }

    #[test]
    fn scale_up_honours_the_back_off_it_is_handed() {
        let s = settings(vec![group("web", 0, 10)]);
        let mut snap = Snapshot::default();
        snap.pods.push(pod("p", 1000, 1));
        let cx = Context::new(&snap, t0(), &s);
        let mut plan = Plan::new(&cx);
        scale_up(&cx, &mut plan);
        assert_eq!(kinds(&plan.actions), ["ScaleUp"]);
        assert_eq!(plan.planned, [1]);
        let mut plan = Plan::new(&cx);
        plan.backing_off[0] = true;
        scale_up(&cx, &mut plan);
        assert_eq!(kinds(&plan.actions), ["NoScaleUp"]);
        assert!(
            no_scale_up(&plan.actions)[0].contains("backing off"),
            "{:?}",
            plan.actions
        );
        assert_eq!(plan.planned, [0]);
    }

    #[test]
    fn scale_up_fills_the_bins_later_phases_use() {
        let s = settings(vec![group("web", 0, 10)]);
        let mut snap = Snapshot::default();
        member(&mut snap, "a", "web");
        snap.machines.push(machine("coming", "web", t0()));
        snap.pods.push(pod("p", 1000, 1));
        let cx = Context::new(&snap, t0(), &s);
        let mut plan = Plan::new(&cx);
        scale_up(&cx, &mut plan);
        assert!(plan.actions.is_empty(), "{:?}", plan.actions);
        let bins: Vec<(&str, bool)> = plan.bins.iter().map(|b| (b.name, b.claimed)).collect();
        assert_eq!(
            bins,
            [("a", true), ("", false)],
            "the node, then the machine"
        );
        assert_eq!(plan.bin_group, [Some(0), Some(0)]);
    }

    #[test]
    fn min_counts_what_scale_up_planned() {
        let s = settings(vec![group("web", 3, 10)]);
        let snap = Snapshot::default();
        let cx = Context::new(&snap, t0(), &s);
        let mut plan = Plan::new(&cx);
        plan.planned[0] = 2;
        min_and_standby(&cx, &mut plan);
        assert_eq!(
            scale_ups(&plan.actions),
            vec![("web".into(), 1, ScaleUpReason::BelowMin)]
        );
        assert_eq!(plan.planned, [3]);
        let mut plan = Plan::new(&cx);
        plan.backing_off[0] = true;
        min_and_standby(&cx, &mut plan);
        assert!(plan.actions.is_empty(), "no growth while backing off");
    }

    #[test]
    fn scale_down_waits_while_the_plan_grows() {
        let s = settings(vec![group("web", 0, 10)]);
        let mut snap = Snapshot::default();
        member(&mut snap, "idle", "web");
        snap.nodes[0].unneeded_since = Some(at(-60));
        let cx = Context::new(&snap, t0(), &s);
        let mut plan = Plan::new(&cx);
        scale_down::scale_down(&cx, &mut plan);
        assert_eq!(scale_downs(&plan.actions), ["idle"]);
        assert_eq!(plan.size, [0]);
        let mut plan = Plan::new(&cx);
        plan.planned[0] = 1;
        scale_down::scale_down(&cx, &mut plan);
        assert!(scale_downs(&plan.actions).is_empty(), "{:?}", plan.actions);
    }
}

/// `max_boots_per_pass` (the nodemanager's `MaxBootPerIteration`) caps the machines created in
/// one pass over all groups, in the order the scale-ups were decided (pending pods first, then
/// min, then standby); the next pass, seeing the machines created, asks for the rest.
#[test]
fn max_boots_per_pass_caps_scale_ups_across_groups() {
    let mut s = settings(vec![group("batch", 3, 10), group("web", 0, 10)]);
    let mut snap = Snapshot::default();
    for i in 0..4 {
        let mut p = pod(&format!("p{i}"), 3000, 1);
        p.node_selector
            .insert(NODE_GROUP_LABEL.into(), "web".into());
        snap.pods.push(p);
    }
    assert_eq!(
        scale_ups(&decide(&snap, t0(), &s)),
        vec![
            ("web".into(), 4, ScaleUpReason::PendingPods),
            ("batch".into(), 3, ScaleUpReason::BelowMin),
        ],
        "no cap by default"
    );
    s.max_boots_per_pass = Some(5);
    assert_eq!(
        scale_ups(&decide(&snap, t0(), &s)),
        vec![
            ("web".into(), 4, ScaleUpReason::PendingPods),
            ("batch".into(), 1, ScaleUpReason::BelowMin),
        ]
    );
    s.max_boots_per_pass = Some(2);
    let a = decide(&snap, t0(), &s);
    assert_eq!(
        scale_ups(&a),
        vec![("web".into(), 2, ScaleUpReason::PendingPods)],
        "a scale-up capped to nothing is dropped: {a:?}"
    );
    // The next pass sees the two machines registering and asks for the next two.
    snap.machines.push(machine("web-1", "web", t0()));
    snap.machines.push(machine("web-2", "web", t0()));
    assert_eq!(
        scale_ups(&decide(&snap, at(1), &s)),
        vec![("web".into(), 2, ScaleUpReason::PendingPods)]
    );
}

/// `scale_down_delay_after_add` holds every scale-down, cluster-wide as cluster-autoscaler's
/// flag does, until that long after the newest machine was created; unneeded times are still
/// counted meanwhile.
#[test]
fn no_scale_down_for_the_delay_after_the_last_scale_up() {
    let mut s = settings(vec![group("web", 0, 10), group("batch", 0, 10)]);
    let mut snap = scale_down_snapshot();
    snap.nodes[0].unneeded_since = Some(at(-60));
    for m in &mut snap.machines {
        m.created = at(-100);
    }
    // The newest machine, in another group: CA's delay is cluster-wide.
    snap.nodes.push(node("d", Some("batch")));
    snap.machines.push(machine("d", "batch", at(-3)));
    assert_eq!(
        scale_downs(&decide(&snap, t0(), &s)),
        ["a"],
        "off by default"
    );
    s.scale_down_delay_after_add = std::time::Duration::from_secs(600);
    let a = decide(&snap, t0(), &s);
    assert!(scale_downs(&a).is_empty(), "3 minutes after an add: {a:?}");
    assert!(
        marked(&a).contains(&"d".to_string()),
        "unneeded time still counted during the delay: {a:?}"
    );
    let a = decide(&snap, at(7), &s);
    assert_eq!(scale_downs(&a), ["a"], "10 minutes after the add: {a:?}");
}

/// `controller_node_labels` (the Cherry Servers autoscaler's controller node label) replaces
/// the built-in list of labels that mark hosts the scaler never touches.
#[test]
fn the_controller_node_labels_are_configurable() {
    let mut s = settings(vec![group("web", 0, 10)]);
    let mut snap = scale_down_snapshot();
    snap.nodes[0].unneeded_since = Some(at(-60));
    snap.nodes[0].labels.insert(
        "node-role.kubernetes.io/control-plane".into(),
        String::new(),
    );
    assert!(
        scale_downs(&decide(&snap, t0(), &s)).is_empty(),
        "the default list protects a control-plane host"
    );
    s.controller_node_labels = vec!["example.com/controller".into()];
    assert_eq!(
        scale_downs(&decide(&snap, t0(), &s)),
        ["a"],
        "a list given replaces the defaults"
    );
    snap.nodes[0]
        .labels
        .insert("example.com/controller".into(), "true".into());
    assert!(scale_downs(&decide(&snap, t0(), &s)).is_empty());
    // Nor repaired: a NotReady controller host stays.
    snap.nodes[0].ready = false;
    snap.nodes[0].ready_transition = Some(at(-600));
    let a = decide(&snap, t0(), &s);
    assert!(
        !a.iter().any(|a| matches!(a, Action::Repair { .. })),
        "{a:?}"
    );
}

/// Scale-down moves a node's pods only where the scheduler would put them: required pod
/// affinity and anti-affinity (the mover's own, and running pods' against it) and
/// `DoNotSchedule` spread hold after the move, counted without the mover on the node it leaves.
/// "a" is light (one 500m pod); "b" and "c" are busy but have 1.5 CPUs free each; "d", where
/// present, is full.
#[test]
fn scale_down_moves_pods_only_where_their_constraints_allow() {
    struct Case {
        name: &'static str,
        /// (node, zone, pods on it).
        nodes: Vec<(&'static str, &'static str, Vec<PodView>)>,
        marked: Vec<&'static str>,
    }
    let busy = |name: &str| pod(name, 2500, 1);
    let full = |name: &str| pod(name, 3900, 1);
    let db = |name: &str| anti(labelled(pod(name, 500, 1), "db"), "db", HOSTNAME);
    // A zone-spread replica on a (z1) and one on b (z2); c in z2 has room; `d` runs in z1.
    let spread_across_zones = |d: PodView| {
        let replica = |name: &str| zone_spread(labelled(pod(name, 500, 1), "s"), "s", 1);
        vec![
            ("a", "z1", vec![replica("s0")]),
            ("b", "z2", vec![busy("b1"), replica("s1")]),
            ("c", "z2", vec![busy("c1")]),
            ("d", "z1", vec![d]),
        ]
    };
    let cases = vec![
        Case {
            name: "no constraints: a's pod fits on b",
            nodes: vec![
                ("a", "z1", vec![labelled(pod("r0", 500, 1), "db")]),
                (
                    "b",
                    "z1",
                    vec![busy("b1"), labelled(pod("r1", 500, 1), "db")],
                ),
                (
                    "c",
                    "z1",
                    vec![busy("c1"), labelled(pod("r2", 500, 1), "db")],
                ),
            ],
            marked: vec!["a"],
        },
        Case {
            name: "hostname anti-affinity: b and c each hold a replica already",
            nodes: vec![
                ("a", "z1", vec![db("r0")]),
                ("b", "z1", vec![busy("b1"), db("r1")]),
                ("c", "z1", vec![busy("c1"), db("r2")]),
            ],
            marked: vec![],
        },
        Case {
            name: "hostname anti-affinity: c holds none, the replica moves there",
            nodes: vec![
                ("a", "z1", vec![db("r0")]),
                ("b", "z1", vec![busy("b1"), db("r1")]),
                ("c", "z1", vec![busy("c1")]),
            ],
            marked: vec!["a"],
        },
        Case {
            name: "running pods' anti-affinity keeps a's noisy pod off b and c",
            nodes: vec![
                ("a", "z1", vec![labelled(pod("n0", 500, 1), "noisy")]),
                ("b", "z1", vec![anti(busy("b1"), "noisy", HOSTNAME)]),
                ("c", "z1", vec![anti(busy("c1"), "noisy", HOSTNAME)]),
            ],
            marked: vec![],
        },
        Case {
            name: "zone affinity: the cache is in z1, where only the full d has room",
            nodes: vec![
                ("a", "z1", vec![near(pod("w0", 500, 1), "cache", ZONE)]),
                ("b", "z2", vec![busy("b1")]),
                ("c", "z2", vec![busy("c1")]),
                ("d", "z1", vec![labelled(full("cache"), "cache")]),
            ],
            marked: vec![],
        },
        Case {
            name: "zone spread: moving a's replica to z2 would make the skew 2",
            nodes: spread_across_zones(full("d1")),
            marked: vec![],
        },
        Case {
            name: "zone spread with room in its own zone: the replica moves to d",
            nodes: spread_across_zones(busy("d1")),
            marked: vec!["a"],
        },
    ];
    let s = settings(vec![group("web", 0, 10)]);
    for case in cases {
        let mut snap = Snapshot::default();
        for (name, zone, pods) in case.nodes {
            zoned_member(&mut snap, name, "web", zone);
            snap.pods.extend(pods.into_iter().map(|p| on(p, name)));
        }
        assert_eq!(
            marked(&decide(&snap, t0(), &s)),
            case.marked,
            "{}",
            case.name
        );
    }

    // Two light nodes, one place: the first one chosen takes it, so the second stays.
    let mut snap = Snapshot::default();
    for (name, pods) in [
        ("a", vec![db("r0")]),
        ("b", vec![busy("b1")]),
        ("c", vec![db("r2")]),
    ] {
        zoned_member(&mut snap, name, "web", "z1");
        snap.pods.extend(pods.into_iter().map(|p| on(p, name)));
    }
    assert_eq!(marked(&decide(&snap, t0(), &s)), ["a"]);
}

/// A group-labelled Node without a machine (deleted outside the scaler) counts as a member while
/// it may still come back; NotReady for `unready_delete_time`, its Node is deleted and it stops
/// counting, so it neither holds the group at `max` nor stays forever. Booting, protected and
/// scale-down nodes are left to their own rules.
#[test]
fn a_machineless_node_notready_for_the_unready_time_is_deleted() {
    let s = settings(vec![group("web", 0, 2)]);
    let mut snap = Snapshot::default();
    member(&mut snap, "a", "web");
    snap.nodes.push(node("ghost", Some("web")));
    snap.nodes[1].ready = false;
    snap.nodes[1].ready_transition = Some(t0());
    snap.pods.push(pod("p", 3900, 1));
    snap.pods.push(on(pod("busy", 3900, 1), "a"));
    let deleted = |a: &[Action]| {
        a.iter()
            .filter_map(|a| match a {
                Action::DeleteNode { node, reason, .. } => Some((node.clone(), *reason)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };

    let a = decide(&snap, at(19), &s);
    assert!(deleted(&a).is_empty(), "{a:?}");
    assert!(
        scale_ups(&a).is_empty(),
        "the ghost still counts: web is at max: {a:?}"
    );

    let a = decide(&snap, at(20), &s);
    assert_eq!(
        deleted(&a),
        [("ghost".to_string(), DeleteNodeReason::Unready)]
    );
    assert_eq!(
        scale_ups(&a),
        [("web".to_string(), 1, ScaleUpReason::PendingPods)],
        "its place is free again"
    );
    assert!(!a.iter().any(|a| matches!(a, Action::BackOff { .. })));

    for (what, change) in [
        (
            "booting",
            (|n: &mut NodeView| {
                n.taints.push(TaintView {
                    key: STARTUP_TAINT_KEY.into(),
                    value: String::new(),
                    effect: TaintEffect::NoSchedule,
                })
            }) as fn(&mut NodeView),
        ),
        ("scale-down-disabled", |n| n.scale_down_disabled = true),
        ("control-plane", |n| {
            n.labels.insert(
                "node-role.kubernetes.io/control-plane".into(),
                String::new(),
            );
        }),
        ("ready", |n| n.ready = true),
    ] {
        let mut kept = snap.clone();
        change(&mut kept.nodes[1]);
        assert!(
            deleted(&decide(&kept, at(60), &s)).is_empty(),
            "{what}: not deleted"
        );
    }
}

/// `n` members of `web`, the first `unready` of them NotReady since t0.
fn fleet(n: usize, unready: usize) -> Snapshot {
    let mut snap = Snapshot::default();
    for i in 0..n {
        member(&mut snap, &format!("n{i}"), "web");
        if i < unready {
            snap.nodes[i].ready = false;
            snap.nodes[i].ready_transition = Some(t0());
        }
    }
    snap
}

fn unready_repairs(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| {
            matches!(
                a,
                Action::Repair {
                    reason: RepairReason::Unready,
                    ..
                } | Action::DeleteNode { .. }
            )
        })
        .count()
}

/// A partition or an API server blip makes many nodes NotReady at once: the scaler must not
/// take them all for broken machines and delete them (cluster-autoscaler stops above 45% and
/// more than 3 NotReady; before the guard nodeward replaced every one).
#[test]
fn the_cluster_health_guard_holds_when_many_nodes_are_unready() {
    let s = settings(vec![group("web", 0, 10)]);
    let a = decide(&fleet(8, 6), at(60), &s);
    assert_eq!(unready_repairs(&a), 0, "{a:?}");
    assert!(
        a.contains(&Action::GuardHolds {
            group: None,
            unready: 6,
            total: 8,
            held: 6
        }),
        "the guard says why: {a:?}"
    );
    assert!(
        !a.iter().any(|a| matches!(a, Action::ScaleDown { .. })),
        "no scale-down while it holds: {a:?}"
    );
    // A labelled Node whose machine is gone is held back too.
    let mut snap = fleet(8, 6);
    snap.machines.remove(0);
    assert_eq!(unready_repairs(&decide(&snap, at(60), &s)), 0);

    // One of eight: a broken machine, replaced.
    let a = decide(&fleet(8, 1), at(60), &s);
    assert_eq!(unready_repairs(&a), 1, "{a:?}");
    assert!(!a.iter().any(|a| matches!(a, Action::GuardHolds { .. })));
    // Three of four: 75%, but no more than ok_unready_count: the cluster's guard lets them be
    // replaced (the group's own guard, below, would not: it is set aside here).
    let mut loose = s.clone();
    loose.max_unready_group_percent = 100;
    assert_eq!(unready_repairs(&decide(&fleet(4, 3), at(60), &loose)), 3);
}

/// Below the guard's threshold, a wave of NotReady nodes is worked off a few per pass.
#[test]
fn unready_repairs_per_pass_are_capped() {
    let mut s = settings(vec![group("web", 0, 30)]);
    // The group's own guard (25% > 20%) is set aside: this is about the per-pass cap.
    s.max_unready_group_percent = 100;
    // 5 of 20: 25%, under the guard's 45%.
    let a = decide(&fleet(20, 5), at(60), &s);
    assert_eq!(
        unready_repairs(&a),
        usize::try_from(s.max_unready_repairs_per_pass).expect("small")
    );
    assert!(!a.iter().any(|a| matches!(a, Action::GuardHolds { .. })));
}

#[test]
fn guard_thresholds() {
    let s = ScalerSettings::default();
    assert_eq!(unhealthy(&fleet(8, 6), &s), Some((6, 8)));
    assert_eq!(unhealthy(&fleet(8, 3), &s), None, "not more than 3");
    assert_eq!(
        unhealthy(&fleet(100, 45), &s),
        None,
        "45% is not more than 45%"
    );
    assert_eq!(unhealthy(&fleet(100, 46), &s), Some((46, 100)));
}

/// One table of pod kinds, judged by both users of the one predicate: the drain's plan
/// (`plan::decide`) and the scaler's choice of a node to scale down (`pod_view` → `decide`).
/// Whatever the drain would refuse, the scaler never picks the node for (a scale-down whose
/// drain then fails); the scaler may only be stricter, and only where the table says so.
#[test]
fn one_verdict_per_pod_kind_for_drain_and_scale_down() {
    use crate::drain::plan::{self, Decision, PlanOptions};
    use serde_json::json;
    // (kind, pod JSON fields merged over a ReplicaSet's pod, the drain's verdict, whether the
    // scaler takes the node the pod is on)
    let rs = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "1", "controller": true}]);
    let ds = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "2", "controller": true}]);
    let gone_ds = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gone", "uid": "3", "controller": true}]);
    let kruise = json!([{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "DaemonSet", "name": "k", "uid": "4", "controller": true}]);
    let empty_dir = json!([{"name": "scratch", "emptyDir": {}}]);
    let host_path = json!([{"name": "logs", "hostPath": {"path": "/var/log"}}]);
    let cases: Vec<(&str, serde_json::Value, &str, bool)> = vec![
        ("a ReplicaSet's pod", json!({}), "evict", true),
        (
            "a bare pod",
            json!({"metadata": {"ownerReferences": null}}),
            "refuse",
            false,
        ),
        (
            "a live DaemonSet's pod",
            json!({"metadata": {"ownerReferences": ds}}),
            "skip",
            true,
        ),
        (
            "an orphaned DaemonSet's pod",
            json!({"metadata": {"ownerReferences": gone_ds}}),
            "refuse",
            false,
        ),
        (
            "a foreign DaemonSet's pod",
            json!({"metadata": {"ownerReferences": kruise}}),
            "evict",
            true,
        ),
        (
            "a mirror pod",
            json!({"metadata": {"ownerReferences": null, "annotations": {"kubernetes.io/config.mirror": "x"}}}),
            "skip",
            true,
        ),
        (
            "a pod annotated drain: never",
            json!({"metadata": {"annotations": {"nodeward.io/drain": "never"}}}),
            "refuse",
            false,
        ),
        (
            "a pod with emptyDir",
            json!({"spec": {"volumes": empty_dir}}),
            "refuse",
            false,
        ),
        (
            "a pod with emptyDir, safe-to-evict true",
            json!({"metadata": {"annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}}, "spec": {"volumes": empty_dir}}),
            "refuse",
            false,
        ),
        (
            "a pod with hostPath (scaler only: cluster-autoscaler's local storage)",
            json!({"spec": {"volumes": host_path}}),
            "evict",
            false,
        ),
        (
            "a pod with hostPath, safe-to-evict true",
            json!({"metadata": {"annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}}, "spec": {"volumes": host_path}}),
            "evict",
            true,
        ),
        (
            "a pod annotated safe-to-evict false (scaler only)",
            json!({"metadata": {"annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}}}),
            "evict",
            false,
        ),
        (
            "a bare pod, safe-to-evict true",
            json!({"metadata": {"ownerReferences": null, "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}}}),
            "refuse",
            false,
        ),
        (
            "a terminating pod",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            "evict",
            true,
        ),
    ];
    let daemonsets = std::collections::HashSet::from([("default".to_string(), "ds".to_string())]);
    let opts = PlanOptions {
        force: false,
        delete_emptydir_data: false,
        waves: Vec::new(),
        surge: false,
    };
    let leave = crate::scaler::model::LeaveContext {
        rules: opts.rules(),
        daemonsets: Some(&daemonsets),
    };
    let s = settings(vec![group("web", 0, 10)]);
    for (kind, fields, drain_says, scaler_takes) in cases {
        let mut pod = json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "uid-p", "ownerReferences": rs},
            "spec": {"nodeName": "a", "containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
            "status": {"phase": "Running"}
        });
        merge(&mut pod, &fields);
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod).expect(kind);
        let exists = |ns: &str, n: &str| daemonsets.contains(&(ns.to_string(), n.to_string()));
        let verdict = match plan::decide(&pod, &opts, &exists) {
            Decision::Evict { .. } => "evict",
            Decision::Skip(_) => "skip",
            Decision::Refuse(_) => "refuse",
        };
        assert_eq!(verdict, drain_says, "the drain on {kind}");
        let mut snap = scale_down_snapshot();
        snap.nodes[0].unneeded_since = Some(at(-60));
        snap.pods[0] = crate::scaler::model::pod_view(&pod, &leave).expect(kind);
        let takes = scale_downs(&decide(&snap, t0(), &s)).contains(&"a".to_string());
        assert_eq!(takes, scaler_takes, "the scaler on the node of {kind}");
        assert!(
            !(takes && verdict == "refuse"),
            "{kind}: the scaler picks a node whose drain refuses the pod"
        );
    }
    // A budget that allows no disruption holds the node for the scaler, and makes the drain
    // wait (not refuse): the plan's verdict is the pod's own.
    let mut snap = scale_down_snapshot();
    snap.nodes[0].unneeded_since = Some(at(-60));
    snap.pods[0].labels.insert("app".into(), "api".into());
    snap.budgets.push(budget("api", Some("api"), 0));
    assert!(
        scale_downs(&decide(&snap, t0(), &s)).is_empty(),
        "a closed budget holds the node"
    );
}

/// Merges JSON `patch` into `target` (objects key by key; anything else replaced).
fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// A fault confined to one node group (a bad image or kubelet rollout in that pool, its rack's
/// switch) makes several of its nodes NotReady while the cluster looks healthy: the group's own
/// guard (Karpenter's node repair stops above 20% of a pool) holds that group's repairs and says
/// why; another group's single broken node is still replaced.
#[test]
fn a_group_guard_holds_the_repairs_of_a_group_mostly_unready() {
    let s = settings(vec![group("web", 0, 20), group("api", 0, 20)]);
    let mut snap = Snapshot::default();
    for i in 0..10 {
        member(&mut snap, &format!("web{i}"), "web");
        member(&mut snap, &format!("api{i}"), "api");
    }
    let mut unready = |name: &str| {
        let n = snap
            .nodes
            .iter_mut()
            .find(|n| n.name == name)
            .expect("node");
        n.ready = false;
        n.ready_transition = Some(t0());
    };
    for n in ["web0", "web1", "web2", "api0"] {
        unready(n);
    }
    // 4 of 20 NotReady: 20%, below the cluster's guard.
    assert_eq!(unhealthy(&snap, &s), None);
    let a = decide(&snap, at(60), &s);
    let repaired: Vec<&str> = a
        .iter()
        .filter_map(|a| match a {
            Action::Repair { node, .. } => node.as_deref(),
            _ => None,
        })
        .collect();
    assert_eq!(repaired, ["api0"], "{a:?}");
    assert!(
        a.contains(&Action::GuardHolds {
            group: Some("web".into()),
            unready: 3,
            total: 10,
            held: 3,
        }),
        "the group's guard says why: {a:?}"
    );
    // One NotReady node alone is a broken machine however small its group.
    let mut small = Snapshot::default();
    member(&mut small, "solo0", "web");
    member(&mut small, "solo1", "web");
    small.nodes[0].ready = false;
    small.nodes[0].ready_transition = Some(t0());
    assert_eq!(unready_repairs(&decide(&small, at(60), &s)), 1);
}

mod selector_properties {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
    use proptest::prelude::*;

    const KEYS: &[&str] = &["app", "tier", "k8s.io/zone"];
    const VALUES: &[&str] = &["web", "db", "", "3", "10"];
    /// meta/v1's four, node affinity's `Gt` and `Lt` (no label selector operator: the apiserver
    /// refuses them there) and one nobody knows.
    const OPERATORS: &[&str] = &["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Bogus"];

    fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
        prop::collection::btree_map(
            prop::sample::select(KEYS).prop_map(str::to_string),
            prop::sample::select(VALUES).prop_map(str::to_string),
            0..3,
        )
    }

    fn expression() -> impl Strategy<Value = LabelSelectorRequirement> {
        (
            prop::sample::select(KEYS),
            prop::sample::select(OPERATORS),
            prop::collection::vec(prop::sample::select(VALUES), 0..3),
        )
            .prop_map(|(k, op, vs)| LabelSelectorRequirement {
                key: k.into(),
                operator: op.into(),
                values: Some(vs.into_iter().map(str::to_string).collect()),
            })
    }

    /// Kubernetes' own words: every matchLabels pair equal; In: the key is there with one of
    /// the values; NotIn: absent or none of them; Exists; DoesNotExist; any other operator
    /// (`Gt` and `Lt` included, which `LabelSelectorAsSelector` refuses) selects nothing.
    fn reference(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
        let pairs = sel.match_labels.iter().flatten();
        let exprs = sel.match_expressions.iter().flatten();
        pairs.clone().all(|(k, v)| labels.get(k) == Some(v))
            && exprs.clone().all(|e| {
                let vs = e.values.clone().unwrap_or_default();
                let v = labels.get(&e.key);
                match e.operator.as_str() {
                    "In" => v.is_some_and(|v| vs.contains(v)),
                    "NotIn" => !v.is_some_and(|v| vs.contains(v)),
                    "Exists" => v.is_some(),
                    "DoesNotExist" => v.is_none(),
                    _ => false,
                }
            })
    }

    proptest! {
        /// The drain's budget matching and the scaler's agree with each other and with the
        /// reference on every selector and label set: a budget never covers a pod for one and
        /// not the other.
        #[test]
        fn drain_and_scaler_select_alike(
            match_labels in labels(),
            exprs in prop::collection::vec(expression(), 0..3),
            pod in labels(),
        ) {
            let sel = LabelSelector {
                match_labels: Some(match_labels),
                match_expressions: Some(exprs),
            };
            let want = reference(&sel, &pod);
            prop_assert_eq!(crate::drain::plan::selector_matches(&sel, &pod), want);
            prop_assert_eq!(SelectorView::from_selector(&sel).selects(&pod), want);
        }
    }
}

/// Whatever is pending and however full the groups are, a pass never plans a group past its
/// max: machines it has plus machines it asks for.
mod packing_properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn scale_up_never_exceeds_a_groups_max(
            maxes in prop::collection::vec(0u32..4, 1..3),
            members in prop::collection::vec(0usize..4, 1..3),
            pending in prop::collection::vec((100i64..5000, 1i64..20), 0..25),
        ) {
            let groups: Vec<_> = maxes
                .iter()
                .enumerate()
                .map(|(i, m)| group(&format!("g{i}"), 0, *m))
                .collect();
            let s = settings(groups);
            let mut snap = Snapshot::default();
            let mut size = vec![0u32; maxes.len()];
            for (gi, n) in members.iter().enumerate().take(maxes.len()) {
                for j in 0..(*n).min(maxes[gi] as usize) {
                    member(&mut snap, &format!("g{gi}-{j}"), &format!("g{gi}"));
                    size[gi] += 1;
                }
            }
            for (i, (cpu, mem)) in pending.iter().enumerate() {
                snap.pods.push(pod(&format!("p{i}"), *cpu, *mem));
            }
            let a = decide(&snap, t0(), &s);
            for (gi, max) in maxes.iter().enumerate() {
                let asked: u32 = a
                    .iter()
                    .filter_map(|a| match a {
                        Action::ScaleUp { group, count, .. } if *group == format!("g{gi}") => Some(*count),
                        _ => None,
                    })
                    .sum();
                prop_assert!(size[gi] + asked <= *max, "g{gi}: {} + {asked} > {max}: {a:?}", size[gi]);
            }
        }
    }
}

/// While a cluster shutdown is recorded the scaler holds still: pending pods (the controllers'
/// replacements), idle nodes, NotReady nodes (powered off) and nodes below min all wait for
/// `cluster start`; the same snapshots without the record act as usual.
#[test]
fn a_cluster_shutdown_pauses_every_decision() {
    let s = settings(vec![group("web", 5, 10)]);
    let mut idle = scale_down_snapshot();
    for n in &mut idle.nodes {
        n.unneeded_since = Some(at(-60));
    }
    let mut pending = Snapshot::default();
    pending.pods.push(pod("replacement", 500, 1));
    let cases = [
        ("pending pods", pending),
        ("idle nodes unneeded for an hour", idle),
        ("nodes NotReady for an hour", fleet(10, 1)),
        ("a group below its min", Snapshot::default()),
    ];
    let shutdown = crate::scaler::model::ClusterShutdownView {
        requested_by: "alice".into(),
        started_at: "2026-01-01T00:00:00Z".into(),
        live: true,
    };
    for (what, snap) in cases {
        let now = at(60);
        assert!(
            !decide(&snap, now, &s).is_empty(),
            "{what}: acts without the record"
        );
        let paused = Snapshot {
            cluster_shutdown: Some(shutdown.clone()),
            ..snap
        };
        assert_eq!(
            decide(&paused, now, &s),
            vec![Action::ClusterShutdown {
                requested_by: "alice".into(),
                started_at: "2026-01-01T00:00:00Z".into(),
            }],
            "{what}"
        );
        // Issue 58, item 3: a stale record (no node holds the shutdown's cordon any more) is
        // reported and not obeyed: the scaler does what it would without it.
        let stale = Snapshot {
            cluster_shutdown: Some(crate::scaler::model::ClusterShutdownView {
                live: false,
                ..shutdown.clone()
            }),
            ..paused
        };
        let acted = decide(&stale, now, &s);
        assert_eq!(
            acted.first(),
            Some(&Action::StaleClusterShutdown {
                requested_by: "alice".into(),
                started_at: "2026-01-01T00:00:00Z".into(),
            }),
            "{what}"
        );
        let without = Snapshot {
            cluster_shutdown: None,
            ..stale
        };
        assert_eq!(acted[1..], decide(&without, now, &s)[..], "{what}");
    }
}

/// The soak on the real control plane: an outage of 50 s made every node NotReady, the guard
/// held; as the kubelets came back one by one it let go with one node still NotReady, whose 50 s
/// were past `unready_delete_time`, and its machine was deleted. A node's NotReady time now
/// counts from the last pass a guard over it held, when that is later than its own transition.
#[test]
fn an_outages_last_straggler_gets_unready_delete_time_after_the_guard_lets_go() {
    let s = settings(vec![group("web", 0, 10)]);
    let snap = fleet(8, 1);
    assert_eq!(
        unready_repairs(&decide(&snap, at(60), &s)),
        1,
        "no guard held: repaired"
    );
    for key in ["", "web"] {
        let mut recent = snap.clone();
        recent.guard_held.insert(key.into(), at(50));
        assert_eq!(
            unready_repairs(&decide(&recent, at(60), &s)),
            0,
            "guard {key:?} held 10 minutes ago: waited for"
        );
        let mut machineless = recent.clone();
        machineless.machines.remove(0);
        assert_eq!(
            unready_repairs(&decide(&machineless, at(60), &s)),
            0,
            "guard {key:?}: a machineless Node too"
        );
        let mut old = snap.clone();
        old.guard_held.insert(key.into(), at(30));
        assert_eq!(
            unready_repairs(&decide(&old, at(60), &s)),
            1,
            "guard {key:?} held 30 minutes ago: repaired"
        );
    }
    // Another group's guard is not this one's.
    let mut other = snap.clone();
    other.guard_held.insert("db".into(), at(50));
    assert_eq!(unready_repairs(&decide(&other, at(60), &s)), 1);
}

#[test]
fn the_guards_memory_keeps_each_guards_last_hold() {
    let keep = std::time::Duration::from_secs(20 * 60);
    let before = BTreeMap::from([("db".to_string(), at(1)), ("old".to_string(), at(0))]);
    let held = |group: Option<&str>| Action::GuardHolds {
        group: group.map(str::to_string),
        unready: 2,
        total: 2,
        held: 2,
    };
    let after = remember_guards(&before, &[held(None), held(Some("web"))], at(20), keep);
    assert_eq!(
        after,
        BTreeMap::from([
            (String::new(), at(20)),
            ("db".to_string(), at(1)),
            ("web".to_string(), at(20)),
        ]),
        "each guard that held now; the others kept until unready_delete_time has passed"
    );
}
