//! The scaler end to end: kube-emulator for the API, cherry-emulator for the cloud, a machine
//! simulator that boots servers only with a valid bootstrap token, and a scheduler stand-in.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cherry_emulator::machines::{SimOptions, Simulator, schedule_once};
use cherry_emulator::{CherryEmulator, Fault};
use kube_emulator::{Emulator, EmulatorHandle, EmulatorOptions};
use nodeward::config::Settings;
use nodeward::scaler::provider::AnyProvider;
use nodeward::scaler::run::{RunOptions, Scaler};
use serde_json::{Value, json};

const API_TOKEN: &str = "cherry-e2e-token-9f8e7d";
const VALUES: &str = r#"
api_server_endpoint = "10.0.0.10:6443"
ca_cert_hashes = ["sha256:8c3d1e4f0a9b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d"]
kubernetes_version = "v1.31.2"
package_url = "https://downloads.example.com/nodeward/nodeward_0.1.0.{ext}"
"#;

struct Env {
    kube: Arc<EmulatorHandle>,
    cherry: Arc<CherryEmulator>,
    settings: Settings,
    _dir: tempfile::TempDir,
    _scheduler: tokio::task::JoinHandle<()>,
}

async fn env(tune: impl FnOnce(&mut Settings)) -> Env {
    let kube = Arc::new(
        Emulator::start(EmulatorOptions {
            grace_scale: 0.001,
            ..EmulatorOptions::default()
        })
        .await
        .expect("kube emulator"),
    );
    let cherry = common::cherry_emulator(API_TOKEN).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let values = dir.path().join("values.toml");
    std::fs::write(&values, VALUES).expect("values");
    let mut settings = Settings::default();
    let s = &mut settings.scaler;
    s.cluster_name = "e2e".into();
    s.values = values;
    s.cherry.api_url = cherry.url();
    s.cherry.project_id = Some(7);
    s.cherry.request_timeout = Duration::from_secs(2);
    s.scan_interval = Duration::from_millis(100);
    s.lease_duration = Duration::from_secs(1);
    s.metrics_address = None;
    s.scale_down_unneeded_time = Duration::from_secs(1);
    s.max_provision_time = Duration::from_secs(30);
    s.backoff_initial = Duration::from_secs(2);
    s.groups = vec![common::scaler_group("web", 5)];
    settings.drain.timeout = Duration::from_secs(10);
    tune(&mut settings);
    let k2 = kube.clone();
    let scheduler = tokio::spawn(async move {
        loop {
            schedule_once(&k2);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    Env {
        kube,
        cherry,
        settings,
        _dir: dir,
        _scheduler: scheduler,
    }
}

impl Env {
    async fn scaler(&self, identity: &str, dry_run: bool) -> Scaler<AnyProvider> {
        let client = nodeward::kube_client::client(Some(self.kube.kubeconfig_path()))
            .await
            .expect("client");
        let provider =
            nodeward::scaler::provider_from_settings(&self.settings.scaler, Some(API_TOKEN.into()))
                .expect("provider");
        Scaler::new(
            client,
            provider,
            &self.settings,
            RunOptions {
                dry_run,
                identity: identity.into(),
            },
        )
        .await
        .expect("scaler starts")
    }

    /// A scaler running until the sender fires (its graceful stop, as SIGTERM's), and its task.
    async fn run_until_stopped(
        &self,
        identity: &str,
    ) -> (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<nodeward::scaler::run::Result<()>>,
    ) {
        let s = self.scaler(identity, false).await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            s.run(async {
                let _ = stopped.await;
            })
            .await
        });
        (stop, task)
    }

    async fn spawn(&self, identity: &str) -> tokio::task::JoinHandle<()> {
        let s = self.scaler(identity, false).await;
        tokio::spawn(async move {
            s.run(std::future::pending()).await.expect("scaler runs");
        })
    }

    fn simulate(&self, opts: SimOptions) -> Simulator {
        Simulator::start(self.cherry.clone(), self.kube.clone(), opts)
    }

    fn pod(&self, name: &str, cpu: &str) {
        self.kube
            .create(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "labels": {"app": "load"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "load",
                        "uid": "0123", "controller": true}]},
                "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
            }))
            .expect("pod");
    }

    fn servers(&self) -> Vec<Value> {
        self.cherry.servers()
    }

    fn group_nodes(&self) -> Vec<String> {
        self.kube
            .list("nodes", None)
            .iter()
            .filter(|n| {
                n.pointer("/metadata/labels/nodeward.io~1node-group")
                    .is_some()
            })
            .filter_map(|n| {
                n.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .collect()
    }

    /// A cluster shutdown's record, stopping since `started_at`, that cordoned `node`: written
    /// as `nodeward cluster shutdown` writes it ([`Intent::to_data`]).
    fn cluster_shutdown_record(&self, started_at: &str, node: &str) {
        use nodeward::cluster::intent::{Intent, Phase};
        let intent = Intent {
            phase: Phase::Stopping,
            started_at: started_at.to_string(),
            requested_by: "an operator".to_string(),
            reason: "maintenance".to_string(),
            cordoned: [node.to_string()].into(),
        };
        self.kube
            .create(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": nodeward::names::CLUSTER_SHUTDOWN_CONFIGMAP,
                    "namespace": nodeward::names::CLUSTER_SHUTDOWN_NAMESPACE},
                "data": intent.to_data(),
            }))
            .expect("the cluster shutdown's record");
    }

    fn running_pods(&self) -> usize {
        self.kube
            .list("pods", Some("default"))
            .iter()
            .filter(|p| p.pointer("/spec/nodeName").is_some())
            .count()
    }

    fn event_reasons(&self, kind: &str) -> Vec<String> {
        self.kube
            .list("events.events.k8s.io", None)
            .iter()
            .filter(|e| e.pointer("/regarding/kind").and_then(Value::as_str) == Some(kind))
            .filter_map(|e| e.get("reason").and_then(Value::as_str).map(str::to_string))
            .collect()
    }
}

/// Waits until the scalers have made `n` more passes (each pass lists the Nodes once; the pods
/// are also listed by the watch of pending pods), so that a test can say "nothing happened for n
/// passes" without sleeping for a guessed time.
async fn passes(env: &Env, n: u64) {
    let node_lists = || env.kube.count_requests("list", "nodes", "");
    let target = node_lists() + n;
    wait_for(
        &format!("{n} more scaler passes"),
        Duration::from_secs(30),
        || node_lists() >= target,
    )
    .await;
}

/// Whether pod `name` in `default` is marked Unschedulable (the test scheduler found no room).
fn unschedulable(env: &Env, name: &str) -> bool {
    env.kube
        .get("pods", Some("default"), name)
        .and_then(|p| p["status"]["conditions"].as_array().cloned())
        .is_some_and(|cs| cs.iter().any(|c| c["reason"] == "Unschedulable"))
}

async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pods_get_machines_then_idle_nodes_go() {
    let env = env(|_| {}).await;
    let sim = env.simulate(SimOptions::default());
    let scaler = env.spawn("replica-a").await;
    // 6 pods of 1.5 CPU on 4-CPU nodes: two per node, three nodes.
    for i in 0..6 {
        env.pod(&format!("load-{i}"), "1500m");
    }
    wait_for("all pods running", Duration::from_secs(20), || {
        env.running_pods() == 6
    })
    .await;
    assert_eq!(
        env.servers().len(),
        3,
        "first-fit-decreasing: 3 machines, no more"
    );
    assert_eq!(sim.report().booted.len(), 3);
    assert!(
        sim.report().refused.is_empty(),
        "every token valid: {:?}",
        sim.report().refused
    );
    for s in env.servers() {
        assert_eq!(s["tags"]["k8s-cluster"], "e2e");
        assert_eq!(s["tags"]["k8s-nodepool"], "web");
    }
    assert!(
        env.event_reasons("Pod")
            .iter()
            .any(|r| r == "TriggeredScaleUp")
    );
    let status = env
        .kube
        .get("configmaps", Some("kube-system"), "nodeward-scaler-status")
        .expect("status ConfigMap");
    assert!(
        status["data"]["status"]
            .as_str()
            .unwrap_or_default()
            .contains("web:"),
        "{status}"
    );

    // Load goes away: after the unneeded time every node is drained and deleted.
    for i in 0..6 {
        env.kube
            .delete_with_grace("pods", Some("default"), &format!("load-{i}"), Some(0))
            .expect("delete pod");
    }
    wait_for("machines deleted", Duration::from_secs(30), || {
        env.servers().is_empty()
    })
    .await;
    wait_for("nodes deleted", Duration::from_secs(10), || {
        env.group_nodes().is_empty()
    })
    .await;
    assert_eq!(env.cherry.deleted().len(), 3);
    assert!(env.event_reasons("Node").iter().any(|r| r == "ScaleDown"));
    scaler.abort();
}

/// Issue 57, item 4: a burst of pending pods calls for its own pass. With the periodic scan an
/// hour away, the pods get their machines within seconds of the scheduler finding no node for
/// them (`batch_idle`, 1 s, after the last); before, they waited for the scan. The first pass
/// comes when the replica takes the Lease: before, a replica that was not yet the leader at its
/// first turn waited a whole `scan_interval` (here an hour) for its first pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pods_call_for_a_pass_before_the_scan() {
    let env = env(|s| s.scaler.scan_interval = Duration::from_secs(3600)).await;
    let _sim = env.simulate(SimOptions::default());
    let scaler = env.spawn("replica-a").await;
    // The pass at start, with nothing pending; the next scan is an hour away.
    wait_for("the first pass", Duration::from_secs(10), || {
        last_pass(&env).is_some()
    })
    .await;
    let t0 = Instant::now();
    for i in 0..4 {
        env.pod(&format!("burst-{i}"), "1500m");
    }
    wait_for("machines for the burst", Duration::from_secs(10), || {
        env.servers().len() == 2
    })
    .await;
    println!(
        "4 pending pods: 2 machines created {:.1} s after the first pod, the scan an hour away",
        t0.elapsed().as_secs_f64()
    );
    wait_for("all pods running", Duration::from_secs(20), || {
        env.running_pods() == 4
    })
    .await;
    assert_eq!(env.servers().len(), 2, "one plan for the burst");
    scaler.abort();
}

/// The scaler's own clock at its last pass, from the status ConfigMap it writes every pass.
fn last_pass(env: &Env) -> Option<jiff::Timestamp> {
    let status = env
        .kube
        .get("configmaps", Some("kube-system"), "nodeward-scaler-status")?;
    status["data"]["status"]
        .as_str()?
        .lines()
        .find_map(|l| l.strip_prefix("time: "))?
        .trim_matches(['"', '\''])
        .parse()
        .ok()
}

/// A node whose pods a PodDisruptionBudget keeps is not drained (before, the scaler drained it,
/// the drain timed out against the budget, the node was uncordoned, and so on every unneeded
/// time); once the budget allows one disruption, exactly one node goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_keeps_its_pods_node_until_it_allows_the_move() {
    let env = env(|_| {}).await;
    let _sim = env.simulate(SimOptions::default());
    let scaler = env.spawn("replica-a").await;
    for i in 0..4 {
        env.pod(&format!("load-{i}"), "1500m");
    }
    wait_for("all pods running", Duration::from_secs(20), || {
        env.running_pods() == 4
    })
    .await;
    assert_eq!(env.servers().len(), 2, "two pods per node");
    env.kube
        .create(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "load", "namespace": "default"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "load"}}}
        }))
        .expect("budget");
    // One pod leaves each node: both nodes are now a quarter used and one could take the
    // other's pod, but the budget (two left, two must stay) allows no eviction.
    let mut seen = std::collections::BTreeSet::new();
    for p in env.kube.list("pods", Some("default")) {
        let node = p["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if seen.insert(node) {
            let name = p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            env.kube
                .delete_with_grace("pods", Some("default"), &name, Some(0))
                .expect("delete pod");
        }
    }
    assert_eq!(env.running_pods(), 2);
    // Long enough for a mark and the 1 s unneeded time, then a few more passes.
    let after = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(4);
    wait_for(
        "passes past the unneeded time",
        Duration::from_secs(20),
        || last_pass(&env).is_some_and(|t| t > after),
    )
    .await;
    assert!(
        !env.event_reasons("Node").iter().any(|r| r == "ScaleDown"),
        "no drain against a closed budget: {:?}",
        env.event_reasons("Node")
    );
    for n in env.kube.list("nodes", None) {
        assert_ne!(n["spec"]["unschedulable"], true, "never cordoned: {n}");
    }
    assert_eq!(env.servers().len(), 2);
    // The budget opens for one pod: one node is drained and deleted, the other stays.
    env.kube
        .modify(
            "poddisruptionbudgets.policy",
            Some("default"),
            "load",
            |b| {
                b["spec"]["minAvailable"] = json!(1);
            },
        )
        .expect("budget opens");
    wait_for("one machine deleted", Duration::from_secs(30), || {
        env.servers().len() == 1 && env.group_nodes().len() == 1
    })
    .await;
    assert!(
        !env.event_reasons("Node")
            .iter()
            .any(|r| r == "ScaleDownFailed"),
        "{:?}",
        env.event_reasons("Node")
    );
    scaler.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_that_never_boots_is_deleted_and_the_group_backs_off() {
    let env = env(|s| {
        s.scaler.max_provision_time = Duration::from_secs(1);
        s.scaler.backoff_initial = Duration::from_secs(3);
    })
    .await;
    let _sim = env.simulate(SimOptions {
        never_boot: vec!["web".into()],
        ..SimOptions::default()
    });
    let scaler = env.spawn("replica-a").await;
    env.pod("stuck", "500m");
    wait_for("the stuck machine deleted", Duration::from_secs(10), || {
        env.cherry.deleted().len() == 1
    })
    .await;
    // The status ConfigMap is written at the end of the pass that deleted the machine, a moment
    // after the provider saw the delete.
    let backoff = || {
        env.kube
            .get("configmaps", Some("kube-system"), "nodeward-scaler-status")
            .and_then(|c| c["data"]["backoff"].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    wait_for("the back-off recorded", Duration::from_secs(5), || {
        backoff().contains("\"failures\":1")
    })
    .await;
    // During the back-off (3 s; a pass every 100 ms) nothing new is created.
    let created_before = env.servers().len() + env.cherry.deleted().len();
    passes(&env, 3).await;
    assert_eq!(
        env.servers().len() + env.cherry.deleted().len(),
        created_before,
        "no create while backing off"
    );
    // After it, the group tries again.
    wait_for("a second attempt", Duration::from_secs(10), || {
        env.servers().len() + env.cherry.deleted().len() > created_before
    })
    .await;
    scaler.abort();
}

/// Servers the provider already shows on their way out (`terminating`, `deleting`) are not
/// members: the scaler never deletes them again, and they hold no place in the group, so a
/// group below `min` gets exactly the machine it lacks — once, not again on every pass while the
/// old server lingers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_on_their_way_out_are_neither_deleted_again_nor_members() {
    let env = env(|s| s.scaler.groups[0].min = 1).await;
    let tags = json!({"k8s-cluster": "e2e", "k8s-nodepool": "web"});
    let going = [
        env.cherry.insert_server("k8s-e2e-web-going0", tags.clone()),
        env.cherry.insert_server("k8s-e2e-web-going1", tags),
    ];
    env.cherry.set_state(going[0], "terminating");
    env.cherry.set_state(going[1], "deleting");
    let _sim = env.simulate(SimOptions::default());
    let scaler = env.spawn("replica-a").await;
    wait_for("the min machine's node", Duration::from_secs(20), || {
        env.group_nodes().len() == 1
    })
    .await;
    // Many passes later: still the one machine, nothing deleted.
    passes(&env, 15).await;
    assert_eq!(
        env.servers().len(),
        3,
        "the two leaving servers plus exactly one new: {:?}",
        env.servers()
    );
    assert!(
        env.cherry.deleted().is_empty(),
        "no DELETE for servers already leaving: {:?}",
        env.cherry.deleted()
    );
    scaler.abort();
}

/// A create the provider refuses for good (4xx, e.g. quota) puts the group into back-off by
/// decide's rule; after it, the group tries again and the pod runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_create_backs_the_group_off() {
    let env = env(|s| s.scaler.backoff_initial = Duration::from_secs(2)).await;
    let _sim = env.simulate(SimOptions::default());
    env.cherry.add_fault(Fault {
        method: Some("POST".into()),
        path_contains: "/servers".into(),
        status: 422,
        count: 1,
    });
    let scaler = env.spawn("replica-a").await;
    env.pod("load-0", "500m");
    let backoff = || {
        env.kube
            .get("configmaps", Some("kube-system"), "nodeward-scaler-status")
            .and_then(|c| c["data"]["backoff"].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    wait_for("the back-off recorded", Duration::from_secs(10), || {
        backoff().contains("\"failures\":1")
    })
    .await;
    assert!(env.servers().is_empty(), "the refused create made nothing");
    wait_for(
        "the pod running after the back-off",
        Duration::from_secs(20),
        || env.running_pods() == 1,
    )
    .await;
    assert_eq!(env.servers().len(), 1);
    scaler.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_errors_and_timeouts_create_no_duplicates() {
    let env = env(|_| {}).await;
    let _sim = env.simulate(SimOptions::default());
    env.cherry.add_fault(Fault {
        method: Some("POST".into()),
        path_contains: "/servers".into(),
        status: 500,
        count: 3,
    });
    env.cherry.add_fault(Fault {
        method: Some("GET".into()),
        path_contains: "/servers".into(),
        status: 503,
        count: 2,
    });
    let scaler = env.spawn("replica-a").await;
    for i in 0..4 {
        env.pod(&format!("load-{i}"), "1500m");
    }
    wait_for("pods running despite 500s", Duration::from_secs(20), || {
        env.running_pods() == 4
    })
    .await;
    assert_eq!(env.servers().len(), 2, "exactly the machines needed");
    // Slow API: requests time out; nothing is created twice when it recovers.
    env.cherry.set_latency(Duration::from_secs(3));
    for i in 4..6 {
        env.pod(&format!("load-{i}"), "1500m");
    }
    // Two passes against it: each request gives up after request_timeout (2 s).
    passes(&env, 2).await;
    env.cherry.set_latency(Duration::ZERO);
    wait_for(
        "pods running after the slow spell",
        Duration::from_secs(20),
        || env.running_pods() == 6,
    )
    .await;
    passes(&env, 5).await;
    assert_eq!(
        env.servers().len(),
        3,
        "a create that timed out but happened is not repeated"
    );
    scaler.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_scale_up_creates_no_duplicates() {
    let env = env(|_| {}).await;
    let _sim = env.simulate(SimOptions {
        boot_after: Duration::from_secs(3),
        ..SimOptions::default()
    });
    let first = env.spawn("replica-a").await;
    for i in 0..4 {
        env.pod(&format!("load-{i}"), "3")
    }
    wait_for("machines created", Duration::from_secs(10), || {
        env.servers().len() == 4
    })
    .await;
    first.abort();
    let second = env.spawn("replica-b").await;
    wait_for("the new replica leads", Duration::from_secs(10), || {
        env.kube
            .get("leases", Some("kube-system"), "nodeward-scaler")
            .is_some_and(|l| l["spec"]["holderIdentity"] == "replica-b")
    })
    .await;
    passes(&env, 5).await;
    assert_eq!(
        env.servers().len(),
        4,
        "several passes later: still 4 machines"
    );
    wait_for("pods running", Duration::from_secs(20), || {
        env.running_pods() == 4
    })
    .await;
    assert_eq!(
        env.servers().len(),
        4,
        "the new replica resumed the in-flight machines"
    );
    second.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_never_both_act() {
    let env = env(|_| {}).await;
    let _sim = env.simulate(SimOptions::default());
    let a = env.scaler("replica-a", false).await;
    let b = env.scaler("replica-b", false).await;
    let (ma, mb) = (a.metrics(), b.metrics());
    let ta = tokio::spawn(async move { a.run(std::future::pending()).await.expect("a") });
    let tb = tokio::spawn(async move { b.run(std::future::pending()).await.expect("b") });
    for i in 0..6 {
        env.pod(&format!("load-{i}"), "1500m");
    }
    wait_for("pods running", Duration::from_secs(20), || {
        env.running_pods() == 6
    })
    .await;
    assert_eq!(env.servers().len(), 3, "two replicas, one set of machines");
    let leaders = [ma.render(), mb.render()]
        .iter()
        .filter(|m| m.lines().any(|l| l == "nodeward_scaler_leader 1"))
        .count();
    assert_eq!(leaders, 1, "exactly one leader");
    let lease = env
        .kube
        .get("leases", Some("kube-system"), "nodeward-scaler")
        .expect("lease");
    let holder = lease["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The leader dies; the other takes over after the Lease expires and acts.
    if holder == "replica-a" {
        ta.abort();
    } else {
        tb.abort();
    }
    for i in 6..8 {
        env.pod(&format!("load-{i}"), "1500m");
    }
    wait_for(
        "the follower took over and scaled up",
        Duration::from_secs(20),
        || env.running_pods() == 8,
    )
    .await;
    let lease = env
        .kube
        .get("leases", Some("kube-system"), "nodeward-scaler")
        .expect("lease");
    assert_ne!(
        lease["spec"]["holderIdentity"].as_str().unwrap_or_default(),
        holder
    );
    assert_eq!(env.servers().len(), 4);
    ta.abort();
    tb.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_changes_nothing() {
    let env = env(|_| {}).await;
    let s = env.scaler("dry", true).await;
    env.pod("load-0", "1");
    wait_for("load-0 unschedulable", Duration::from_secs(10), || {
        unschedulable(&env, "load-0")
    })
    .await;
    let actions = s.pass_once().await.expect("pass");
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, nodeward::scaler::Action::ScaleUp { .. })),
        "the decision is made: {actions:?}"
    );
    assert!(env.servers().is_empty(), "but nothing is created");
    assert!(
        env.kube.list("secrets", Some("kube-system")).is_empty(),
        "and no token minted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_is_held_by_one_identity_at_a_time() {
    use nodeward::lease::Elector;
    let env = env(|_| {}).await;
    let client = nodeward::kube_client::client(Some(env.kube.kubeconfig_path()))
        .await
        .expect("client");
    let d = Duration::from_secs(1);
    let a = Elector::new(client.clone(), "kube-system", "l", "a", d);
    let b = Elector::new(client, "kube-system", "l", "b", d);
    let (ra, rb) = tokio::join!(a.try_acquire(), b.try_acquire());
    assert_eq!(
        u8::from(ra.is_some()) + u8::from(rb.is_some()),
        1,
        "one wins the create race"
    );
    let (winner, loser) = if ra.is_some() { (&a, &b) } else { (&b, &a) };
    for _ in 0..3 {
        assert!(winner.try_acquire().await.is_some(), "the holder renews");
        assert!(
            loser.try_acquire().await.is_none(),
            "the other follows a live Lease"
        );
    }
    // Real time must pass here: the Lease's expiry (1 s) on the API server's clock is what is
    // tested.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(
        loser.try_acquire().await.is_some(),
        "after expiry the other takes over"
    );
    assert!(
        winner.try_acquire().await.is_none(),
        "and the old holder follows"
    );
    // The fence: only the holder, and only while the Lease is as its own last write left it.
    loser.confirm().await.expect("the new holder may act");
    assert!(matches!(
        winner.confirm().await,
        Err(nodeward::lease::FenceError::NotLeader)
    ));
    env.kube
        .modify("leases", Some("kube-system"), "l", |l| {
            l["spec"]["holderIdentity"] = json!("c");
        })
        .expect("lease taken");
    assert!(matches!(
        loser.confirm().await,
        Err(nodeward::lease::FenceError::Superseded { holder: Some(h) }) if h == "c"
    ));
}

/// The holder's deletes are fenced by the Lease itself, not by its local deadline: once another
/// identity has written the Lease, a leader that still believes it leads (its next renewal is
/// far off) drains but does not delete the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_lease_was_taken_deletes_no_machine() {
    let env = env(|s| {
        // Renewals every 20 s: the test runs between two of them.
        s.scaler.lease_duration = Duration::from_secs(60);
    })
    .await;
    let _sim = env.simulate(SimOptions::default());
    let scaler = env.scaler("replica-a", false).await;
    let metrics = scaler.metrics();
    let task = tokio::spawn(async move {
        scaler
            .run(std::future::pending())
            .await
            .expect("scaler runs");
    });
    env.pod("load-0", "1500m");
    wait_for("pod running", Duration::from_secs(20), || {
        env.running_pods() == 1
    })
    .await;
    assert_eq!(env.servers().len(), 1);
    // Another replica takes the Lease (as one whose clock says replica-a's renewal expired).
    take_lease(&env);
    env.kube
        .delete_with_grace("pods", Some("default"), "load-0", Some(0))
        .expect("delete pod");
    let fenced = || fenced_count(&metrics);
    wait_for(
        "the scale-down to reach its delete",
        Duration::from_secs(20),
        || fenced() > 0 || !env.cherry.deleted().is_empty(),
    )
    .await;
    assert!(
        env.cherry.deleted().is_empty(),
        "a replica that lost the Lease deleted {:?}",
        env.cherry.deleted()
    );
    assert_eq!(env.servers().len(), 1, "the machine is still there");
    task.abort();
}

/// Creates are fenced like deletes: a replica that still believes it leads (its next renewal is
/// far off) after another identity wrote the Lease mints no bootstrap token and creates no
/// machine, however many pods wait. Before the fence, it created one: two leaders, two machines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_lease_was_taken_creates_no_machine() {
    let env = env(|s| {
        s.scaler.lease_duration = Duration::from_secs(60);
    })
    .await;
    let scaler = env.scaler("replica-a", false).await;
    let metrics = scaler.metrics();
    let task = tokio::spawn(async move {
        scaler
            .run(std::future::pending())
            .await
            .expect("scaler runs");
    });
    wait_for("replica-a to lead", Duration::from_secs(20), || {
        env.kube
            .get("leases", Some("kube-system"), "nodeward-scaler")
            .and_then(|l| l.pointer("/spec/holderIdentity").cloned())
            == Some(json!("replica-a"))
    })
    .await;
    take_lease(&env);
    env.pod("load-0", "1500m");
    let fenced = || fenced_count(&metrics);
    wait_for(
        "the scale-up to reach its create",
        Duration::from_secs(20),
        || fenced() > 0 || !env.servers().is_empty(),
    )
    .await;
    assert!(
        env.servers().is_empty(),
        "a replica that lost the Lease created {:?}",
        env.servers()
    );
    let tokens: Vec<_> = env
        .kube
        .list("secrets", Some("kube-system"))
        .into_iter()
        .filter(|s| s["type"] == json!("bootstrap.kubernetes.io/token"))
        .collect();
    assert!(tokens.is_empty(), "it minted {} token(s)", tokens.len());
    task.abort();
}

/// The real binary at trace level: neither the provider token nor any bootstrap token (nor its
/// secret half) appears in anything it logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_the_logs() {
    let env = env(|_| {}).await;
    let _sim = env.simulate(SimOptions::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("cherry-token");
    std::fs::write(&token_file, API_TOKEN).expect("token file");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[scaler]
cluster_name = "e2e"
scan_interval = "100ms"
lease_duration = "1s"
metrics_address = "127.0.0.1:0"
values = "{values}"
[scaler.cherry]
api_url = "{url}"
project_id = 7
token_file = "{token}"
[[scaler.groups]]
name = "web"
max = 3
plan = "e5_1620v4"
region = "eu_nord_1"
image = "ubuntu_24_04"
template = "{template}"
"#,
            values = env.settings.scaler.values.display(),
            url = env.cherry.url(),
            token = token_file.display(),
            template = concat!(env!("CARGO_MANIFEST_DIR"), "/cloud-init/worker.yaml.tera"),
        ),
    )
    .expect("config");
    let log = dir.path().join("stderr");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .arg("--config")
        .arg(&config)
        .args(["--log-level", "trace", "scaler", "--kubeconfig"])
        .arg(env.kube.kubeconfig_path())
        .env_remove("JOURNAL_STREAM")
        .env_remove("NODEWARD_CONFIG")
        .env_remove("CHERRY_AUTH_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start nodeward scaler");
    env.pod("load-0", "1500m");
    env.pod("load-1", "3");
    let started = Instant::now();
    while env.running_pods() < 2 && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).expect("log");
    let tail: String = text
        .lines()
        .filter(|l| !l.contains("TRACE"))
        .rev()
        .take(30)
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        env.running_pods(),
        2,
        "pods did not run; log (last lines, reversed):\n{tail}"
    );
    assert!(
        text.contains("machine created"),
        "the log was captured: {}",
        &text[..text.len().min(2000)]
    );
    assert!(
        !text.contains(API_TOKEN),
        "the provider token is in the log"
    );
    // The machines' tokens, from their user data: the scaler deletes each Secret once its
    // machine has joined.
    let tokens: Vec<String> = env
        .servers()
        .iter()
        .filter_map(|s| {
            let data = env.cherry.user_data(s["id"].as_u64()?)?;
            cherry_emulator::machines::find_bootstrap_token(&data).map(|(_, secret)| secret)
        })
        .collect();
    assert!(!tokens.is_empty(), "tokens were minted");
    for secret in tokens {
        assert!(
            !text.contains(&secret),
            "a bootstrap token secret is in the log"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let env = env(|s| s.scaler.metrics_address = Some(([127, 0, 0, 1], port).into())).await;
    let _sim = env.simulate(SimOptions::default());
    let scaler = env.spawn("replica-a").await;
    env.pod("load-0", "1");
    wait_for("pod running", Duration::from_secs(20), || {
        env.running_pods() == 1
    })
    .await;
    let get = |path: &'static str| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    };
    let wants = [
        "nodeward_scaler_pending_pods 0",
        "nodeward_scaler_group_nodes{group=\"web\"} 1",
        "nodeward_scaler_scale_ups_total{group=\"web\"} 1",
        "nodeward_scaler_decision_seconds_count",
        "nodeward_scaler_leader 1",
    ];
    // The gauges follow the pass after the pod ran; give it a few passes.
    let started = Instant::now();
    let mut body = get("/metrics").await;
    while !wants.iter().all(|w| body.contains(w)) && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        body = get("/metrics").await;
    }
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    for want in wants {
        assert!(body.contains(want), "{want} missing from:\n{body}");
    }
    assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
    scaler.abort();
}

#[test]
fn nodes_flag_must_name_a_configured_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[[scaler.groups]]\nname = \"web\"\nmax = 3\n").expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .arg("--config")
        .arg(&config)
        .args(["scaler", "--nodes", "1:2:gpu"])
        .env_remove("NODEWARD_CONFIG")
        .output()
        .expect("run nodeward");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--nodes \"1:2:gpu\"") && err.contains("configured: web"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_agent_reports_not_ready_in_time_is_replaced() {
    let env = env(|s| s.scaler.max_provision_time = Duration::from_secs(60)).await;
    let sim = env.simulate(SimOptions {
        // The agent never removes the startup taint on these machines.
        ready_after: Duration::from_secs(3600),
        ..SimOptions::default()
    });
    let scaler = env.spawn("replica-a").await;
    env.pod("load-0", "1");
    wait_for("a node registered", Duration::from_secs(10), || {
        !sim.report().booted.is_empty()
    })
    .await;
    let node = sim.report().booted[0].clone();
    // Any node identity may create Events, about any Node: an Event naming this node (as another,
    // compromised node could write it) must not get its machine deleted.
    env.kube
        .create(json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": format!("{node}.not-ready"), "namespace": "default"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "nodeward", "reportingInstance": node,
            "action": "Gate", "reason": "NodeNotReadyInTime", "type": "Warning",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
            "note": "readiness gates did not pass within the deadline"
        }))
        .expect("event");
    let status = || {
        env.kube
            .get("configmaps", Some("kube-system"), "nodeward-scaler-status")
            .map(|c| c["data"]["status"].to_string())
            .unwrap_or_default()
    };
    for pass in 0..3 {
        let before = status();
        wait_for(
            &format!("scaler pass {pass} after the Event"),
            Duration::from_secs(10),
            || status() != before,
        )
        .await;
    }
    assert!(
        env.cherry.deleted().is_empty(),
        "an Event alone deleted a machine"
    );
    // What the node's own agent writes, through nodes/status (NodeRestriction confines a node
    // to its own): the condition with reason NotReadyInTime.
    let now = jiff::Timestamp::now().to_string();
    env.kube
        .modify("nodes", None, &node, |n| {
            let conditions = &mut n["status"]["conditions"];
            if !conditions.is_array() {
                *conditions = json!([]);
            }
            if let Some(list) = conditions.as_array_mut() {
                list.push(json!({"type": "nodeward.io/Ready", "status": "False",
                    "reason": "NotReadyInTime", "message": "failing: file /run/flannel/subnet.env",
                    "lastHeartbeatTime": now, "lastTransitionTime": now}));
            }
        })
        .expect("condition");
    wait_for(
        "the machine deleted long before max_provision_time",
        Duration::from_secs(10),
        || env.cherry.deleted().len() == 1,
    )
    .await;
    wait_for("its Node deleted", Duration::from_secs(10), || {
        env.kube.get("nodes", None, &node).is_none()
    })
    .await;
    scaler.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_releases_the_lease() {
    let env = env(|_| {}).await;
    let (stop, task) = env.run_until_stopped("replica-a").await;
    let holder = || {
        env.kube
            .get("leases", Some("kube-system"), "nodeward-scaler")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
    };
    wait_for("leader", Duration::from_secs(10), || {
        holder().as_deref() == Some("replica-a")
    })
    .await;
    let _ = stop.send(());
    task.await.expect("joins").expect("clean stop");
    assert_eq!(
        holder(),
        None,
        "the Lease is free for the next replica at once"
    );
}

/// SIGTERM while the API server does not answer (frozen, or partitioned away): the scaler stops
/// within seconds, not after its requests' deadlines. A pass in flight is dropped as a crash
/// would drop it (its writes are fenced by the Lease), and the Lease's release is bounded: the
/// next replica takes the Lease when it expires. On a real node, a scaler pod that outlived its
/// SIGTERM this way held a power-off 31 s past the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_is_prompt_while_the_api_server_does_not_answer() {
    let env = env(|_| {}).await;
    let (stop, task) = env.run_until_stopped("replica-a").await;
    passes(&env, 2).await;
    env.kube.set_latency(Duration::from_secs(600));
    // The pass's requests, not the election's (which reads and writes only the Lease).
    wait_for(
        "a pass stuck on the API server",
        Duration::from_secs(10),
        || {
            env.kube
                .held_requests()
                .iter()
                .any(|(_, resource)| resource != "leases")
        },
    )
    .await;
    let t0 = Instant::now();
    let _ = stop.send(());
    let ended = tokio::time::timeout(Duration::from_secs(60), task).await;
    let took = t0.elapsed();
    env.kube.set_latency(Duration::ZERO);
    let bound = nodeward::scaler::run::RELEASE_LIMIT + Duration::from_secs(2);
    assert!(
        took < bound,
        "stopped {took:?} after the signal (bound {bound:?}); ended: {ended:?}"
    );
    ended
        .expect("stopped")
        .expect("joins")
        .expect("a clean stop");
}

/// Under systemd (`Type=notify`, `WatchdogSec=`): the scaler says READY=1 once it runs, then
/// WATCHDOG=1 from its loop while that loop makes progress. Without READY=1, `systemctl start
/// nodeward-scaler` waited for it until the start timed out, and restarted it for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scaler_tells_systemd_it_is_ready_and_alive() {
    let env = env(|_| {}).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("cherry-token");
    std::fs::write(&token_file, API_TOKEN).expect("token file");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[scaler]\ncluster_name = \"e2e\"\nscan_interval = \"100ms\"\nmetrics_address = \"\"\nvalues = \"{values}\"\n[scaler.cherry]\napi_url = \"{url}\"\nproject_id = 7\ntoken_file = \"{token}\"\n[[scaler.groups]]\nname = \"web\"\nmax = 3\nplan = \"e5_1620v4\"\nregion = \"eu_nord_1\"\nimage = \"ubuntu_24_04\"\ntemplate = \"{template}\"\n",
            template = concat!(env!("CARGO_MANIFEST_DIR"), "/cloud-init/worker.yaml.tera"),
            values = env.settings.scaler.values.display(),
            url = env.cherry.url(),
            token = token_file.display(),
        ),
    )
    .expect("config");
    let socket_path = dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).expect("notify socket");
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .arg("--config")
        .arg(&config)
        .args(["scaler", "--kubeconfig"])
        .arg(env.kube.kubeconfig_path())
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "1000000")
        .env_remove("WATCHDOG_PID")
        .env_remove("JOURNAL_STREAM")
        .env_remove("NODEWARD_CONFIG")
        .env_remove("CHERRY_AUTH_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("stderr")).expect("log"))
        .spawn()
        .expect("start nodeward scaler");
    let mut said = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let mut buf = [0u8; 4096];
        if let Ok(n) = socket.recv(&mut buf) {
            said.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        let watchdogs = said.iter().filter(|m| m.contains("WATCHDOG=1")).count();
        if said.iter().any(|m| m.contains("READY=1")) && watchdogs >= 3 {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default();
    assert!(
        said.iter().any(|m| m.contains("READY=1")),
        "no READY=1: {said:?}\n{log}"
    );
    assert!(
        said.iter().filter(|m| m.contains("WATCHDOG=1")).count() >= 3,
        "no steady WATCHDOG=1 (WatchdogSec=1s): {said:?}"
    );
}

/// Every machine gets a bootstrap token of its own: a user-data blob leaked from one machine (a
/// metadata service, a console log) joins that machine's name and nothing else. Before, one
/// token served a whole batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_machine_has_a_bootstrap_token_of_its_own() {
    let env = env(|_| {}).await;
    let task = env.spawn("replica-a").await;
    // Groups offer 4 cores: three pods of 3 cores need three machines, made in one pass.
    env.pod("load-0", "3");
    env.pod("load-1", "3");
    env.pod("load-2", "3");
    wait_for("three machines", Duration::from_secs(20), || {
        env.servers().len() >= 3
    })
    .await;
    task.abort();
    let tokens: std::collections::BTreeSet<String> = env
        .servers()
        .iter()
        .map(|s| {
            let id = s["id"].as_u64().expect("id");
            let data = env.cherry.user_data(id).expect("user data");
            cherry_emulator::machines::find_bootstrap_token(&data)
                .map(|(id, secret)| format!("{id}.{secret}"))
                .expect("a token in the user data")
        })
        .collect();
    assert_eq!(
        tokens.len(),
        env.servers().len(),
        "tokens shared: {tokens:?}"
    );
    let secrets = env
        .kube
        .list("secrets", Some("kube-system"))
        .into_iter()
        .filter(|s| s["type"] == json!("bootstrap.kubernetes.io/token"))
        .count();
    assert_eq!(secrets, tokens.len(), "one token Secret per machine");
}

/// A machine's bootstrap token is deleted once its Node has registered: a token that leaked from
/// the machine's user data opens nothing after the join.
#[tokio::test]
async fn a_token_is_deleted_once_its_node_registers() {
    let env = env(|_| {}).await;
    let _sim = env.simulate(SimOptions {
        boot_after: Duration::from_secs(2),
        ..SimOptions::default()
    });
    let tokens = || {
        env.kube
            .list("secrets", Some("kube-system"))
            .into_iter()
            .filter(|s| s["type"] == json!("bootstrap.kubernetes.io/token"))
            .count()
    };
    let task = env.spawn("replica-a").await;
    env.pod("load-0", "3");
    wait_for(
        "a token while the machine boots",
        Duration::from_secs(20),
        || tokens() == 1 && env.group_nodes().is_empty(),
    )
    .await;
    wait_for("the Node registered", Duration::from_secs(20), || {
        !env.group_nodes().is_empty()
    })
    .await;
    wait_for("the token deleted", Duration::from_secs(10), || {
        tokens() == 0
    })
    .await;
    assert_eq!(env.servers().len(), 1);
    task.abort();
}

/// Another identity writes the scaler's Lease, as one whose clock says the holder's expired.
fn take_lease(env: &Env) {
    env.kube
        .modify("leases", Some("kube-system"), "nodeward-scaler", |l| {
            l["spec"]["holderIdentity"] = json!("replica-b");
            l["spec"]["leaseTransitions"] = json!(1);
        })
        .expect("lease taken");
}

/// Acts of group `web` refused because leadership was not confirmed.
fn fenced_count(metrics: &nodeward::scaler::metrics::Metrics) -> u64 {
    metrics
        .failures
        .get_or_create(&nodeward::scaler::metrics::failure("web", "fenced"))
        .get()
}

/// Issue 58, item 3: a cluster shutdown recorded but stale (no node holds its cordon: an
/// interrupted shutdown, uncordoned by hand) freezes nothing: the pending pod gets its machine,
/// and the scaler says the record is stale with a Warning Event on the ConfigMap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_cluster_shutdown_freezes_nothing_and_is_said() {
    let env = env(|_| {}).await;
    env.cluster_shutdown_record("2026-12-05T12:00:00Z", "gone-node");
    let _sim = env.simulate(SimOptions::default());
    let scaler = env.spawn("replica-a").await;
    env.pod("after-the-shutdown", "500m");
    wait_for("the pod running", Duration::from_secs(20), || {
        env.running_pods() == 1
    })
    .await;
    wait_for("the stale record said", Duration::from_secs(10), || {
        env.event_reasons("ConfigMap")
            .iter()
            .any(|r| r == "ClusterShutdownStale")
    })
    .await;
    scaler.abort();
}

/// A live cluster shutdown (a node still holds the shutdown's cordon, read from the paged Node
/// list) pauses the scaler: a pending pod gets no machine while it lasts. Once the cordon is
/// lifted the record is stale, and the same pod gets its machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_cluster_shutdown_pauses_scale_up_until_its_cordon_is_gone() {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams};
    let env = env(|_| {}).await;
    env.kube.seed_node("stopped-node").expect("node");
    let client = nodeward::kube_client::client(Some(env.kube.kubeconfig_path()))
        .await
        .expect("client");
    let nodes: Api<Node> = Api::all(client);
    let as_nodeward = PatchParams {
        field_manager: Some(nodeward::names::FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    let record = json!({"reason": nodeward::cluster::CORDON_REASON, "at": "2026-12-06T01:00:00Z"});
    nodes
        .patch(
            "stopped-node",
            &as_nodeward,
            &Patch::Merge(json!({
                "metadata": {"annotations": {nodeward::names::CORDONED_BY: record.to_string()}},
                "spec": {"unschedulable": true},
            })),
        )
        .await
        .expect("cordon as a cluster shutdown");
    env.cluster_shutdown_record("2026-12-06T01:00:00Z", "stopped-node");
    let _sim = env.simulate(SimOptions::default());
    let scaler = env.spawn("replica-a").await;
    env.pod("during-the-shutdown", "500m");
    // Forty passes at the test's 100 ms scan.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        env.servers().is_empty(),
        "no machine while the shutdown is live: {:?}",
        env.servers()
    );
    nodes
        .patch(
            "stopped-node",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": null}})),
        )
        .await
        .expect("uncordon by hand");
    wait_for("the pod running", Duration::from_secs(20), || {
        env.running_pods() == 1
    })
    .await;
    scaler.abort();
}
