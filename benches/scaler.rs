//! Scaler benchmark: decision time at 1,000 nodes, 30,000 running pods and 3,000 pending pods, and
//! at 5,000 nodes, 150,000 running pods and 10,000 pending pods, across 10 node groups; and
//! pending-to-create latency at the smaller size.
//!
//! A tenth of the pending pods each have hostname anti-affinity (workloads of 10 replicas), zone
//! spread (`maxSkew: 1`, `DoNotSchedule`) and zone affinity to a running workload; a tenth are
//! kept off the nodes of the running pods that carry anti-affinity against them (every 50th).
//! Nodes and groups are spread over 3 zones.
//!
//! Prints figures, asserts nothing about time (it depends on the machine):
//! 1. `decide` alone on an in-memory snapshot (median of several runs), at both sizes with busy
//!    nodes (none a scale-down candidate), and at the larger size with light ones (a third of the
//!    nodes candidates, 30 pods each for scale-down's simulation to move), and light at 15,000
//!    nodes and 450,000 running pods;
//! 2. one full pass against kube-emulator and cherry-emulator over HTTP: listing, deciding,
//!    minting tokens, rendering cloud-init and creating machines; the time from the pass's start
//!    to the first server existing at the provider is the pending-to-create latency. Only at
//!    1,000 nodes: seeding the emulators with 150,000 pods over HTTP would take minutes.
//!
//! Run: `cargo bench --bench scaler` (`SCALER_BENCH_DECIDE_ONLY=1` skips the HTTP part). cluster-autoscaler's published scalability target at this
//! size is 60 s from pending pod to scale-up decision.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cherry_emulator::{CherryEmulator, Options, PlanSpec};
use kube_emulator::{Emulator, EmulatorOptions};
use nodeward::config::{Capacity, GroupSettings, Settings};
use nodeward::drain::plan::{EvictRule, Fate};
use nodeward::resources::Resources;
use nodeward::scaler::model::{
    MachineView, Namespaces, NodeView, PodConstraints, PodTermView, PodView, SelectorView,
    Snapshot, SpreadView,
};
use nodeward::scaler::run::{RunOptions, Scaler};
use serde_json::json;

/// The HTTP pass runs at this size only.
const NODES: usize = 1_000;
const RUNNING: usize = 30_000;
const PENDING: usize = 3_000;
/// `decide` alone runs at each of these sizes: (nodes, running pods, pending pods).
const SIZES: [(usize, usize, usize); 2] = [(NODES, RUNNING, PENDING), (5_000, 150_000, 10_000)];
/// The largest case, light (scale-down's simulation, the costliest phase): 15,000 nodes and
/// 450,000 running pods.
const LARGE: (usize, usize, usize) = (15_000, 450_000, 10_000);
const GROUPS: usize = 10;
const RUNS: usize = 7;
const GROUP_LABEL: &str = "nodeward.io/node-group";
const HOSTNAME: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";
/// Groups (and their nodes) spread over this many zones.
const ZONES: usize = 3;

/// `max` leaves each group room for 300 more nodes than its share of `nodes`, more than the
/// pending pods need at either size.
fn group(i: usize, nodes: usize) -> GroupSettings {
    GroupSettings {
        name: format!("pool-{i}"),
        min: 0,
        max: (nodes / GROUPS + 300) as u32,
        standby: 0,
        priority: 0,
        plan: "e5_1620v4".into(),
        region: "eu_nord_1".into(),
        image: "ubuntu_24_04".into(),
        ssh_keys: Vec::new(),
        labels: BTreeMap::from([(ZONE.to_string(), format!("zone-{}", i % ZONES))]),
        taints: Vec::new(),
        template: concat!(env!("CARGO_MANIFEST_DIR"), "/cloud-init/worker.yaml.tera").into(),
        hostname_pattern: None,
        capacity: Capacity {
            resources: Resources {
                cpu_milli: 4000,
                memory: 16 << 30,
                pods: 110,
                ..Resources::default()
            },
        },
        cherry: Default::default(),
    }
}

fn node_name(i: usize) -> String {
    format!("pool-{}-node-{i:04}", i % GROUPS)
}

/// Busy: running pods use 3.6 of 4 CPUs per node, so no node is a scale-down candidate.
const BUSY_CPU: i64 = 120;
/// Light: running pods use 0.9 of 4 CPUs per node; the nodes the pending pods do not claim (a
/// third of them at 5,000 nodes) are all scale-down candidates, each with 30 pods to move.
const LIGHT_CPU: i64 = 30;

fn snapshot(nodes: usize, running: usize, pending: usize, running_cpu: i64) -> Snapshot {
    let t0: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
    let mut snap = Snapshot::default();
    for i in 0..nodes {
        let name = node_name(i);
        snap.nodes.push(NodeView {
            name: name.clone(),
            labels: BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.clone()),
                (GROUP_LABEL.to_string(), format!("pool-{}", i % GROUPS)),
                (ZONE.to_string(), format!("zone-{}", (i % GROUPS) % ZONES)),
            ]),
            taints: Vec::new(),
            unschedulable: false,
            scale_down_in_progress: false,
            ready: true,
            ready_transition: Some(t0),
            allocatable: Resources {
                cpu_milli: 4000,
                memory: 16 << 30,
                pods: 110,
                ..Resources::default()
            },
            created: Some(t0),
            unneeded_since: None,
            scale_down_disabled: false,
            not_ready_in_time: false,
            ever_ready: false,
            scale_down_failed: None,
        });
        snap.machines.push(MachineView {
            id: format!("{i}"),
            hostname: name,
            group: format!("pool-{}", i % GROUPS),
            created: t0,
        });
    }
    let pod = |name: String, node: Option<String>, cpu: i64, selector: Option<String>| PodView {
        namespace: "default".into(),
        uid: name.clone(),
        labels: BTreeMap::new(),
        name,
        unschedulable: node.is_none(),
        node,
        requests: Resources {
            cpu_milli: cpu,
            memory: 256 << 20,
            pods: 1,
            ..Resources::default()
        },
        node_selector: selector
            .map(|g| BTreeMap::from([(GROUP_LABEL.to_string(), g)]))
            .unwrap_or_default(),
        affinity_terms: Vec::new(),
        tolerations: Vec::new(),
        constraints: None,
        fate: Fate::Evict(EvictRule::PLAIN),
        safe_to_evict: None,
        host_path: false,
    };
    for i in 0..running {
        let mut p = pod(
            format!("run-{i}"),
            Some(node_name(i % nodes)),
            running_cpu,
            None,
        );
        p.labels = app(format!("w{}", i % 50));
        if i % 50 == 0 {
            // Keeps pods labelled `app=noisy` off its node.
            p.constraints = Some(Box::new(PodConstraints {
                anti_affinity: vec![term("noisy", HOSTNAME)],
                ..PodConstraints::default()
            }));
        }
        snap.pods.push(p);
    }
    for i in 0..pending {
        let selector = (i % 2 == 0).then(|| format!("pool-{}", i % GROUPS));
        let mut p = pod(format!("pending-{i}"), None, 1000, selector);
        let workload = format!("{}-{}", i % 10, i / 100);
        let c = match i % 10 {
            // Workloads of 10 replicas, one per node.
            1 => PodConstraints {
                anti_affinity: vec![term(&workload, HOSTNAME)],
                ..PodConstraints::default()
            },
            // Workloads of 10 replicas spread over the zones (odd: not pinned to a group).
            5 => PodConstraints {
                spread: vec![SpreadView {
                    max_skew: 1,
                    topology_key: ZONE.into(),
                    selector: term(&workload, ZONE).selector,
                    min_domains: 1,
                    ignore_node_affinity: false,
                    honor_taints: false,
                }],
                ..PodConstraints::default()
            },
            // Wants to share a zone with a running workload.
            3 => PodConstraints {
                affinity: vec![term(&format!("w{}", i % 50), ZONE)],
                ..PodConstraints::default()
            },
            _ => PodConstraints::default(),
        };
        p.labels = app(if i % 10 == 4 {
            "noisy".into()
        } else {
            workload
        });
        if c != PodConstraints::default() {
            p.constraints = Some(Box::new(c));
        }
        snap.pods.push(p);
    }
    snap
}

fn app(name: String) -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_string(), name)])
}

/// A required term selecting `app=<name>` in the default namespace.
fn term(name: &str, key: &str) -> PodTermView {
    PodTermView {
        namespaces: Namespaces::Only(vec!["default".into()]),
        selector: Some(SelectorView {
            labels: app(name.to_string()),
            expressions: Vec::new(),
        }),
        topology_key: key.into(),
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn settings(nodes: usize) -> Settings {
    let mut s = Settings::default();
    s.scaler.groups = (0..GROUPS).map(|i| group(i, nodes)).collect();
    s
}

/// `decide` on `snap` `runs` times: each run's time and the last run's actions.
fn time_decide(
    snap: &Snapshot,
    s: &Settings,
    runs: usize,
) -> (Vec<Duration>, Vec<nodeward::scaler::Action>) {
    let now: jiff::Timestamp = "2026-01-01T00:05:00Z".parse().expect("time");
    let mut times = Vec::new();
    let mut actions = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        actions = nodeward::scaler::decide(snap, now, &s.scaler);
        times.push(t.elapsed());
    }
    (times, actions)
}

/// The machines the actions create, over all groups.
fn planned_machines(actions: &[nodeward::scaler::Action]) -> u32 {
    actions
        .iter()
        .map(|a| match a {
            nodeward::scaler::Action::ScaleUp { count, .. } => *count,
            _ => 0,
        })
        .sum()
}

fn bench_decide(nodes: usize, running: usize, pending: usize, running_cpu: i64) {
    let snap = snapshot(nodes, running, pending, running_cpu);
    let (times, actions) = time_decide(&snap, &settings(nodes), RUNS);
    let machines = planned_machines(&actions);
    let unneeded = actions
        .iter()
        .filter(|a| matches!(a, nodeward::scaler::Action::MarkUnneeded { .. }))
        .count();
    let refused: Vec<&String> = actions
        .iter()
        .filter_map(|a| match a {
            nodeward::scaler::Action::NoScaleUp { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    println!(
        "decide: {nodes} {} nodes, {running} running pods, {pending} pending pods, {GROUPS} groups: median {:.1} ms over {RUNS} runs (min {:.1} ms, max {:.1} ms); {machines} machines planned, {} pods left without a scale-up, {unneeded} nodes found unneeded",
        if running_cpu == LIGHT_CPU {
            "light"
        } else {
            "busy"
        },
        median(times.clone()).as_secs_f64() * 1e3,
        times
            .iter()
            .min()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3,
        times
            .iter()
            .max()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3,
        refused.len(),
    );
    if let Some(reason) = refused.first() {
        println!("  first pod left without a scale-up: {reason}");
    }
}

/// Karpenter's scheduling benchmark mix (its `makeDiversePods`, written anew): a fifth each of
/// plain pods, zone spread and hostname spread (`maxSkew: 1` over a random `my-label`), zone
/// self-affinity (a random `my-affinity`) and hostname anti-affinity to one another (`app=nginx`),
/// requests drawn from its CPU and memory lists; an empty cluster and the peers bench's node shapes
/// (4 and 8 CPUs, 16 and 32 GiB, 110 pods, in 3 zones: 6 groups).
const MIX_SIZES: [usize; 2] = [5_000, 20_000];
const MIX_CPU_MILLI: [i64; 5] = [100, 250, 500, 1000, 1500];
const MIX_MEMORY_MIB: [i64; 6] = [100, 256, 512, 1024, 2048, 4096];
const MIX_VALUES: [&str; 7] = ["a", "b", "c", "d", "e", "f", "g"];

fn mix_settings() -> Settings {
    let mut s = Settings::default();
    s.scaler.groups = [(4, 16i64), (8, 32)]
        .iter()
        .flat_map(|&(cpu, gib)| {
            (0..ZONES).map(move |z| {
                let mut g = group(z, 0);
                g.name = format!("nw-{cpu}x-zone-{z}");
                g.max = 100_000;
                g.labels = BTreeMap::from([(ZONE.to_string(), format!("zone-{z}"))]);
                g.capacity.resources = Resources {
                    cpu_milli: cpu * 1000 - 100,
                    memory: (gib << 30) - (10 << 20),
                    pods: 110,
                    ..Resources::default()
                };
                g
            })
        })
        .collect();
    s
}

fn label(key: &str, value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(key.to_string(), value.to_string())])
}

fn mix_term(labels: BTreeMap<String, String>, key: &str) -> PodTermView {
    PodTermView {
        namespaces: Namespaces::Only(vec!["default".into()]),
        selector: Some(SelectorView {
            labels,
            expressions: Vec::new(),
        }),
        topology_key: key.into(),
    }
}

fn mix_snapshot(pods: usize) -> Snapshot {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(45);
    let mut snap = Snapshot::default();
    let fifth = pods / 5;
    for i in 0..pods {
        let mut pick = |values: &[&'static str]| values[rng.random_range(0..values.len())];
        let value = pick(&MIX_VALUES);
        let other = pick(&MIX_VALUES);
        let (labels, constraints) = match (i / fifth.max(1)).min(5) {
            1 | 2 => {
                let key = if i / fifth == 1 { ZONE } else { HOSTNAME };
                let spread = SpreadView {
                    max_skew: 1,
                    topology_key: key.into(),
                    selector: mix_term(label("my-label", other), key).selector,
                    min_domains: 1,
                    ignore_node_affinity: false,
                    honor_taints: false,
                };
                let c = PodConstraints {
                    spread: vec![spread],
                    ..PodConstraints::default()
                };
                (label("my-label", value), Some(c))
            }
            3 => {
                let labels = label("my-affinity", value);
                let c = PodConstraints {
                    affinity: vec![mix_term(labels.clone(), ZONE)],
                    ..PodConstraints::default()
                };
                (labels, Some(c))
            }
            4 => {
                let labels = label("app", "nginx");
                let c = PodConstraints {
                    anti_affinity: vec![mix_term(labels.clone(), HOSTNAME)],
                    ..PodConstraints::default()
                };
                (labels, Some(c))
            }
            // The first fifth, and the remainder, are plain.
            _ => (label("my-label", value), None),
        };
        let cpu = MIX_CPU_MILLI[rng.random_range(0..MIX_CPU_MILLI.len())];
        let memory = MIX_MEMORY_MIB[rng.random_range(0..MIX_MEMORY_MIB.len())];
        snap.pods.push(PodView {
            namespace: "default".into(),
            uid: format!("mix-{i}"),
            name: format!("mix-{i}"),
            labels,
            unschedulable: true,
            node: None,
            requests: Resources {
                cpu_milli: cpu,
                memory: memory << 20,
                pods: 1,
                ..Resources::default()
            },
            node_selector: BTreeMap::new(),
            affinity_terms: Vec::new(),
            tolerations: Vec::new(),
            constraints: constraints.map(Box::new),
            fate: Fate::Evict(EvictRule::PLAIN),
            safe_to_evict: None,
            host_path: false,
        });
    }
    snap
}

/// `decide` on Karpenter's benchmark mix from an empty cluster: pods per second, as Karpenter's
/// `BenchmarkScheduling5000`/`20000` print them (`scripts/peers-karpenter bench` runs those).
fn bench_mix(pods: usize) {
    let s = mix_settings();
    let runs = if pods > 5_000 { 3 } else { RUNS };
    let (times, actions) = time_decide(&mix_snapshot(pods), &s, runs);
    let machines = planned_machines(&actions);
    let left = actions
        .iter()
        .filter(|a| matches!(a, nodeward::scaler::Action::NoScaleUp { .. }))
        .count();
    let median = median(times);
    println!(
        "decide on Karpenter's benchmark mix: {pods} pending pods, empty cluster, {} groups: median {:.1} ms over {runs} runs = {:.0} pods/sec; {machines} machines planned ({:.1} pods per node), {left} pods left without a scale-up",
        s.scaler.groups.len(),
        median.as_secs_f64() * 1e3,
        pods as f64 / median.as_secs_f64(),
        pods as f64 / f64::from(machines.max(1)),
    );
}

async fn bench_pass() {
    let kube = Arc::new(
        Emulator::start(EmulatorOptions::default())
            .await
            .expect("kube emulator"),
    );
    let cherry = Arc::new(
        CherryEmulator::start(Options {
            token: "bench-token".into(),
            project_id: 1,
            plans: vec![PlanSpec {
                slug: "e5_1620v4".into(),
                cores: 4,
                memory_gb: 16,
            }],
        })
        .await
        .expect("cherry emulator"),
    );
    let seed = Instant::now();
    for i in 0..NODES {
        let name = node_name(i);
        let mut n = kube_emulator::node_json(&name);
        n["metadata"]["labels"][GROUP_LABEL] = json!(format!("pool-{}", i % GROUPS));
        kube.create(n).expect("node");
        cherry.insert_server(
            &name,
            json!({"k8s-cluster": "bench", "k8s-nodepool": format!("pool-{}", i % GROUPS)}),
        );
    }
    let pod = |name: String, node: Option<String>, cpu: &str, selector: Option<String>| {
        let mut p = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "1", "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "pause",
                "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}]},
        });
        match node {
            Some(n) => {
                p["spec"]["nodeName"] = json!(n);
                p["status"] = json!({"phase": "Running"});
            }
            None => {
                p["status"] = json!({"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]});
            }
        }
        if let Some(g) = selector {
            p["spec"]["nodeSelector"] = json!({GROUP_LABEL: g});
        }
        p
    };
    for i in 0..RUNNING {
        kube.create(pod(
            format!("run-{i}"),
            Some(node_name(i % NODES)),
            "120m",
            None,
        ))
        .expect("pod");
    }
    for i in 0..PENDING {
        let selector = (i % 2 == 0).then(|| format!("pool-{}", i % GROUPS));
        kube.create(pod(format!("pending-{i}"), None, "1", selector))
            .expect("pod");
    }
    println!(
        "seeded the emulators in {:.1} s",
        seed.elapsed().as_secs_f64()
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let values = dir.path().join("values.toml");
    std::fs::write(
        &values,
        "api_server_endpoint = \"10.0.0.10:6443\"\nca_cert_hashes = [\"sha256:8c3d1e4f0a9b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d\"]\nkubernetes_version = \"v1.31.2\"\npackage_url = \"https://downloads.example.com/nodeward/nodeward_0.1.0.{ext}\"\n",
    )
    .expect("values");
    let mut s = settings(NODES);
    s.scaler.cluster_name = "bench".into();
    s.scaler.values = values;
    s.scaler.cherry.api_url = cherry.url();
    s.scaler.cherry.project_id = Some(1);
    s.scaler.metrics_address = None;
    let client = nodeward::kube_client::client(Some(kube.kubeconfig_path()))
        .await
        .expect("client");
    let provider = nodeward::scaler::provider_from_settings(&s.scaler, Some("bench-token".into()))
        .expect("provider");
    let scaler = Scaler::new(
        client,
        provider,
        &s,
        RunOptions {
            dry_run: false,
            identity: "bench".into(),
        },
    )
    .await
    .expect("scaler");

    let list_started = Instant::now();
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(
        nodeward::kube_client::client(Some(kube.kubeconfig_path()))
            .await
            .expect("client"),
    );
    let n = pods
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .len();
    println!(
        "listing {n} pods over HTTP alone: {:.0} ms",
        list_started.elapsed().as_secs_f64() * 1e3
    );
    let before = cherry.servers().len();
    let started = Instant::now();
    let watcher = {
        let cherry = cherry.clone();
        tokio::spawn(async move {
            loop {
                if cherry.servers().len() > before {
                    return started.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let actions = scaler.pass_once().await.expect("pass");
    let pass = started.elapsed();
    let first = watcher.await.expect("watcher");
    let created = cherry.servers().len() - before;
    let planned: u32 = actions
        .iter()
        .map(|a| match a {
            nodeward::scaler::Action::ScaleUp { count, .. } => *count,
            _ => 0,
        })
        .sum();
    let metrics = scaler.metrics().render();
    let decision = metrics
        .lines()
        .find(|l| l.starts_with("nodeward_scaler_decision_seconds_sum"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_default();
    println!(
        "one pass over HTTP (list 1,000 nodes + 33,000 pods + 1,000 machines, decide, mint, render, create): pending-to-first-create {:.0} ms; decide {:.1} ms; whole pass {:.1} s; {created} of {planned} planned machines created",
        first.as_secs_f64() * 1e3,
        decision * 1e3,
        pass.as_secs_f64()
    );
    println!("reference: cluster-autoscaler's published target at this size is 60 s");
}

fn main() {
    if std::env::var_os("SCALER_BENCH_MIX_ONLY").is_some() {
        MIX_SIZES.into_iter().for_each(bench_mix);
        return;
    }
    for (nodes, running, pending) in SIZES {
        bench_decide(nodes, running, pending, BUSY_CPU);
    }
    // Scale-down's simulation at the larger size: most nodes light, a third of them candidates.
    let (nodes, running, pending) = SIZES[1];
    bench_decide(nodes, running, pending, LIGHT_CPU);
    let (nodes, running, pending) = LARGE;
    bench_decide(nodes, running, pending, LIGHT_CPU);
    MIX_SIZES.into_iter().for_each(bench_mix);
    if std::env::var_os("SCALER_BENCH_DECIDE_ONLY").is_some() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench_pass());
}
