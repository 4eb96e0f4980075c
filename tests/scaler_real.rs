//! The scaler end to end on the real control plane: the real scheduler marks pods
//! Unschedulable; the scaler (its ServiceAccount, shipped RBAC) mints bootstrap tokens and
//! creates machines in the Cherry emulator; each "boots": its bootstrap token must authenticate
//! to the real kube-apiserver, then its Node registers as `system:node:NAME` with the group
//! label and the startup taint (kwok plays its kubelet) and a real `nodeward agent` runs for it;
//! the readiness controller lifts the taint; the scheduler binds the pods. Then the load shrinks
//! under a budget that allows no disruption (the scaler must leave both machines alone), the
//! budget opens to one (one machine is drained and deleted, its pod moved first), and the load
//! goes away (the other is deleted).
//!
//! And the packing's model of inter-pod constraints, held to the real scheduler and API server.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use cherry_emulator::CherryEmulator;
use cherry_emulator::machines::{find_bootstrap_token, node_labels};
use common::{Cluster, Proc, spawn_agent, unique, write_flannel};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use nodeward::config::Settings;
use nodeward::readiness::STARTUP_TAINT_KEY;
use serde_json::{Value, json};

const API_TOKEN: &str = "cherry-real-e2e-token-4c3b2a";
const LIMIT: Duration = Duration::from_secs(90);
/// The bootstrap values the scaler renders its machines' user data from.
const REAL_VALUES: &str = r#"api_server_endpoint = "10.0.2.100:6443"
ca_cert_hashes = ["sha256:8c3d1e4f0a9b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d"]
kubernetes_version = "v1.37.2"
package_url = "https://10.0.2.101/nodeward.{ext}"
"#;

/// The machines that booted: their agents run until the test ends.
#[derive(Default)]
struct Machines {
    booted: BTreeSet<u64>,
    agents: Vec<Proc>,
    token_users: Vec<String>,
}

/// One pass of the machine simulator: every new server boots as a real node would.
async fn boot_new_machines(cluster: &Cluster, cherry: &CherryEmulator, m: &mut Machines) {
    for s in cherry.servers() {
        let Some(id) = s.get("id").and_then(Value::as_u64) else {
            continue;
        };
        if m.booted.contains(&id) {
            continue;
        }
        m.booted.insert(id);
        let host = s["hostname"].as_str().unwrap_or_default().to_string();
        let user_data = cherry.user_data(id).unwrap_or_default();
        // kubeadm join authenticates with the bootstrap token first: so does this machine.
        let (tid, secret) =
            find_bootstrap_token(&user_data).expect("a bootstrap token in the user data");
        let who = whoami_with_token(cluster, &format!("{tid}.{secret}")).await;
        assert_eq!(
            who,
            format!("system:bootstrap:{tid}"),
            "the minted token authenticates"
        );
        m.token_users.push(who);
        // Then kubelet registers its Node with its own identity.
        let labels = node_labels(&user_data);
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": host, "labels": labels,
                "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {"taints": [{"key": STARTUP_TAINT_KEY, "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                       "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"}}
        }))
        .expect("node");
        let kc = cluster.node_kubeconfig(&host);
        let as_node = common::client(&kc).await;
        Api::<Node>::all(as_node)
            .create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("node {host} registers itself: {e}"));
        cherry.set_state(id, "active");
        let agent = spawn_agent(&host, &kc, "");
        write_flannel(&agent);
        m.agents.push(agent);
    }
}

/// `kubectl auth whoami` with a bearer token: a SelfSubjectReview.
async fn whoami_with_token(cluster: &Cluster, token: &str) -> String {
    let Cluster::Real { dir, .. } = cluster else {
        unreachable!("real only")
    };
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(dir.join("admin.kubeconfig")).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("config");
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    let client = kube::Client::try_from(config).expect("client");
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("the bootstrap token authenticates");
    review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default()
}

/// The settings both end-to-end scalers start from: this Cherry emulator, fast scans and a
/// short Lease, `group` alone.
fn scaler_settings(
    cherry: &CherryEmulator,
    values: &std::path::Path,
    group: nodeward::config::GroupSettings,
) -> Settings {
    std::fs::write(values, REAL_VALUES).expect("values");
    let mut settings = Settings::default();
    let s = &mut settings.scaler;
    s.cluster_name = "real".into();
    s.values = values.to_path_buf();
    s.cherry.api_url = cherry.url();
    s.cherry.project_id = Some(7);
    s.cherry.request_timeout = Duration::from_secs(2);
    s.scan_interval = Duration::from_millis(200);
    s.lease_duration = Duration::from_secs(2);
    s.metrics_address = None;
    s.groups = vec![group];
    settings
}

/// What an end-to-end scaler test starts with: the scaler's log in the test's output (it runs
/// in this process), the admin's client, a Cherry emulator and a scratch directory.
async fn scaler_test_start(
    cluster: &Cluster,
) -> (
    kube::Client,
    std::sync::Arc<CherryEmulator>,
    tempfile::TempDir,
) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info,kube=warn")
        .with_test_writer()
        .try_init();
    (
        cluster.admin().await,
        common::cherry_emulator(API_TOKEN).await,
        tempfile::tempdir().expect("tempdir"),
    )
}

/// Runs the scaler in this process until the sender is used (its log in the test's output).
fn run_scaler(
    scaler: nodeward::scaler::run::Scaler<nodeward::scaler::provider::AnyProvider>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        scaler
            .run(async {
                let _ = stop_rx.await;
            })
            .await
            .expect("scaler runs");
    });
    (stop_tx, task)
}

async fn scale_up_and_down(cluster: Cluster) {
    let (admin, cherry, dir) = scaler_test_start(&cluster).await;
    let group_name = unique("g").replace('-', "");
    let group = common::scaler_group(&group_name, 4);
    let mut settings = scaler_settings(&cherry, &dir.path().join("values.toml"), group);
    settings.scaler.scale_down_unneeded_time = Duration::from_secs(2);
    settings.scaler.max_provision_time = Duration::from_secs(60);
    settings.drain.timeout = Duration::from_secs(20);

    let namespace = settings.scaler.namespace.clone();
    let _controller = common::spawn_controller(
        &cluster.service_account_kubeconfig(common::CONTROLLER_SA.0, common::CONTROLLER_SA.1),
        &[],
    );
    let scaler = common::real_scaler(&cluster, &settings, API_TOKEN, "real-e2e").await;
    let (stop_tx, scaler_task) = run_scaler(scaler);

    // Load: 6 pods of 1 CPU for this group's nodes only: two 4-CPU machines.
    let ns = unique("load");
    common::create_namespace(&admin, &ns).await;
    common::create::<Deployment>(
        &admin,
        json!({
            "metadata": {"name": "load", "namespace": ns},
            "spec": {"replicas": 6, "selector": {"matchLabels": {"app": "load"}},
                "template": {"metadata": {"labels": {"app": "load"}}, "spec": {
                    "nodeSelector": {"nodeward.io/node-group": group_name},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}
        }),
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &ns);
    common::create::<PodDisruptionBudget>(
        &admin,
        json!({
            "metadata": {"name": "load", "namespace": ns},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "load"}}}
        }),
    )
    .await;

    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let mut machines = Machines::default();
    let t0 = Instant::now();
    let mut unschedulable_seen = false;
    loop {
        boot_new_machines(&cluster, &cherry, &mut machines).await;
        let list = pods.list(&ListParams::default()).await.expect("pods").items;
        unschedulable_seen |= list.iter().any(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter().any(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                    })
                })
        });
        let running = list
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running == 6 {
            break;
        }
        assert!(
            t0.elapsed() < LIMIT,
            "scale-up: {running}/6 running after {:?}; servers {:?}",
            t0.elapsed(),
            cherry.servers()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "pending -> 6 pods running on {} new machines: {:?}",
        machines.booted.len(),
        t0.elapsed()
    );
    assert!(
        unschedulable_seen,
        "the real scheduler marked the pods Unschedulable first"
    );
    assert_eq!(machines.booted.len(), 2, "two 4-CPU machines for 6 CPUs");

    let nodes: Api<Node> = Api::all(admin.clone());
    let group_selector = format!("nodeward.io/node-group={group_name}");
    let group_nodes = || async {
        nodes
            .list(&ListParams::default().labels(&group_selector))
            .await
            .expect("nodes")
            .items
    };
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), &ns);

    // Budgets. The load shrinks to two pods, one on each machine, under a budget that allows no
    // disruption: each machine is under-used and could take the other's pod, but neither pod may
    // leave, so the scaler must leave both machines alone (a budget-blind scaler cordons one,
    // its drain runs into the budget until the deadline, it uncordons, and again every
    // unneeded time). The machines are kept out of scale-down while the pods move.
    let t2 = Instant::now();
    for n in group_nodes().await {
        annotate(&nodes, &n, Some("true")).await;
    }
    patch_merge(&budgets, "load", json!({"spec": {"maxUnavailable": 0}})).await;
    scale(&deployments, 0).await;
    wait_pods(&pods, t2, "the load scaled to 0", |by_node| {
        by_node.is_empty()
    })
    .await;
    scale(&deployments, 2).await;
    // Two pods onto two empty 4-CPU nodes: the scheduler's least-allocated score spreads them.
    let placed = wait_pods(&pods, t2, "two pods running, one per machine", |by_node| {
        by_node.len() == 2 && by_node.values().all(|&n| n == 1)
    })
    .await;
    wait_budget(&budgets, t2, 0, 2).await;
    for n in group_nodes().await {
        annotate(&nodes, &n, None).await;
    }
    // Let the scaler see this for three unneeded times (its status says when each pass ran).
    let blocked_from = jiff::Timestamp::now();
    let watch_until = blocked_from + Duration::from_secs(6);
    loop {
        for n in group_nodes().await {
            let name = n.metadata.name.clone().unwrap_or_default();
            assert!(
                !n.spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
                "the scaler cordoned {name}, whose only pod no budget lets leave"
            );
            let annotations = n.metadata.annotations.unwrap_or_default();
            assert!(
                !annotations.contains_key(nodeward::names::UNNEEDED_SINCE),
                "the scaler counts {name} as unneeded although its pod cannot leave"
            );
        }
        assert!(
            cherry.deleted().is_empty(),
            "a machine was deleted: {:?}",
            cherry.deleted()
        );
        if status_time(&admin, &namespace)
            .await
            .is_some_and(|t| t > watch_until)
        {
            break;
        }
        assert!(
            t2.elapsed() < LIMIT,
            "the scaler's status did not advance past {watch_until}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("budget allows nothing -> both machines kept ({placed:?})");

    // The budget opens to one disruption: one machine goes; its pod moves to the other first.
    let t3 = Instant::now();
    patch_merge(&budgets, "load", json!({"spec": {"maxUnavailable": 1}})).await;
    loop {
        let left = group_nodes().await;
        let by_node = running_by_node(&pods).await;
        let running: usize = by_node.values().sum();
        assert!(
            running >= 1,
            "the budget was violated: no pod of the load running during the scale-down"
        );
        if left.len() == 1 && cherry.deleted().len() == 1 && running == 2 {
            break;
        }
        assert!(
            t3.elapsed() < LIMIT,
            "consolidation: nodes left {:?}, deleted {:?}, running {by_node:?}",
            left.iter()
                .map(|n| n.metadata.name.clone())
                .collect::<Vec<_>>(),
            cherry.deleted()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "budget allows one -> one machine drained and deleted: {:?}",
        t3.elapsed()
    );

    // Load goes away: the scaler drains and deletes the last machine.
    let t1 = Instant::now();
    deployments
        .delete("load", &Default::default())
        .await
        .expect("delete load");
    loop {
        let left: Vec<String> = group_nodes()
            .await
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        if left.is_empty() && cherry.deleted().len() == 2 {
            break;
        }
        assert!(
            t1.elapsed() < LIMIT,
            "scale-down: nodes left {left:?}, deleted servers {:?}",
            cherry.deleted()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("load gone -> machines deleted: {:?}", t1.elapsed());
    let _ = stop_tx.send(());
    let _ = scaler_task.await;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin)
        .delete(&ns, &Default::default())
        .await;
}

/// A node older than `max_provision_time` reboots: its flannel subnet file (tmpfs) is gone
/// until flannel is back, its agent reports `nodeward.io/Ready=False` and the shipped
/// controller (`--mode continuous`) puts the startup taint back. The scaler must not read that
/// as a node that never came up: its machine stays, and the node comes back (issue 41).
async fn rebooting_node_keeps_its_machine(cluster: Cluster) {
    let (admin, cherry, dir) = scaler_test_start(&cluster).await;
    let group_name = unique("rb").replace('-', "");
    let mut group = common::scaler_group(&group_name, 2);
    group.min = 1;
    let mut settings = scaler_settings(&cherry, &dir.path().join("values.toml"), group);
    settings.scaler.scale_down_enabled = false;
    settings.scaler.max_provision_time = Duration::from_secs(3);
    let namespace = settings.scaler.namespace.clone();
    let _controller = common::spawn_controller(
        &cluster.service_account_kubeconfig(common::CONTROLLER_SA.0, common::CONTROLLER_SA.1),
        &["--mode", "continuous"],
    );
    let scaler = common::real_scaler(&cluster, &settings, API_TOKEN, "real-reboot").await;
    let (stop_tx, scaler_task) = run_scaler(scaler);
    let nodes: Api<Node> = Api::all(admin.clone());
    let tainted = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == STARTUP_TAINT_KEY))
    };
    // The group's minimum: one machine boots, becomes ready, its taint is lifted.
    let mut machines = Machines::default();
    let t0 = Instant::now();
    let host = loop {
        boot_new_machines(&cluster, &cherry, &mut machines).await;
        let listed = nodes
            .list(&ListParams::default().labels(&format!("nodeward.io/node-group={group_name}")))
            .await
            .expect("nodes")
            .items;
        if let [n] = listed.as_slice()
            && !tainted(n)
        {
            break n.metadata.name.clone().unwrap_or_default();
        }
        assert!(
            t0.elapsed() < LIMIT,
            "the minimum's node never became ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Older than max_provision_time, it "reboots": flannel's subnet file is gone.
    tokio::time::sleep(Duration::from_secs(4)).await;
    common::remove_flannel(&machines.agents[0]);
    let t1 = Instant::now();
    loop {
        let n = nodes.get(&host).await.expect("node");
        if tainted(&n) {
            break;
        }
        assert!(
            t1.elapsed() < LIMIT,
            "the controller never put the startup taint back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Ten scans and more with the taint back: the machine stays.
    let watch_until = jiff::Timestamp::now() + Duration::from_secs(3);
    while status_time(&admin, &namespace)
        .await
        .is_none_or(|t| t <= watch_until)
    {
        assert!(
            cherry.deleted().is_empty(),
            "the scaler deleted the rebooting node's machine: {:?}",
            cherry.deleted()
        );
        assert!(t1.elapsed() < LIMIT, "the scaler's status did not advance");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        cherry.deleted().is_empty(),
        "deleted: {:?}",
        cherry.deleted()
    );
    // Flannel is back: so is the node.
    common::write_flannel(&machines.agents[0]);
    let t2 = Instant::now();
    while tainted(&nodes.get(&host).await.expect("node")) {
        assert!(t2.elapsed() < LIMIT, "the node never became ready again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        cherry.deleted().is_empty(),
        "deleted: {:?}",
        cherry.deleted()
    );
    let _ = stop_tx.send(());
    let _ = scaler_task.await;
    let _ = nodes.delete(&host, &Default::default()).await;
}

/// Sets or removes the annotation that keeps a node out of scale-down.
async fn annotate(nodes: &Api<Node>, node: &Node, value: Option<&str>) {
    let name = node.metadata.name.clone().unwrap_or_default();
    let patch = json!({"metadata": {"annotations": {nodeward::names::SCALE_DOWN_DISABLED: value}}});
    nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("annotate {name}: {e}"));
}

async fn patch_merge<K>(api: &Api<K>, name: &str, patch: Value)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch {name}: {e}"));
}

async fn scale(deployments: &Api<Deployment>, replicas: i32) {
    patch_merge(deployments, "load", json!({"spec": {"replicas": replicas}})).await;
}

/// Running pods per node (pods not deleting).
async fn running_by_node(pods: &Api<Pod>) -> BTreeMap<String, usize> {
    let mut by_node = BTreeMap::new();
    for p in pods.list(&ListParams::default()).await.expect("pods").items {
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if running && p.metadata.deletion_timestamp.is_none() {
            let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
            *by_node.entry(node).or_default() += 1;
        }
    }
    by_node
}

/// Waits until the pods (all of them: none pending or deleting) satisfy `done`.
async fn wait_pods(
    pods: &Api<Pod>,
    since: Instant,
    what: &str,
    done: impl Fn(&BTreeMap<String, usize>) -> bool,
) -> BTreeMap<String, usize> {
    loop {
        let all = pods
            .list(&ListParams::default())
            .await
            .expect("pods")
            .items
            .len();
        let by_node = running_by_node(pods).await;
        if by_node.values().sum::<usize>() == all && done(&by_node) {
            return by_node;
        }
        assert!(
            since.elapsed() < LIMIT,
            "{what}: pods by node {by_node:?}, {all} in all"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the disruption controller has counted the budget.
async fn wait_budget(
    budgets: &Api<PodDisruptionBudget>,
    since: Instant,
    allowed: i32,
    healthy: i32,
) {
    loop {
        let b = budgets.get("load").await.expect("budget");
        let generation = b.metadata.generation;
        let st = b.status.unwrap_or_default();
        if st.observed_generation == generation
            && st.disruptions_allowed == allowed
            && st.current_healthy == healthy
        {
            return;
        }
        assert!(since.elapsed() < LIMIT, "budget status {st:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// When the scaler's last pass ran, from its status ConfigMap.
async fn status_time(admin: &kube::Client, namespace: &str) -> Option<jiff::Timestamp> {
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(admin.clone(), namespace)
        .get_opt(nodeward::scaler::run::STATUS_CONFIGMAP)
        .await
        .expect("status ConfigMap")?;
    let text = cm.data?.remove("status")?;
    let doc: serde_norway::Value = serde_norway::from_str(&text).ok()?;
    doc.get("time")?.as_str()?.parse().ok()
}

/// The model behind the scaler's packing, held to the real scheduler: a pod's required affinity
/// terms count together. A zone with room and one pod for each of two terms does not take the
/// pod; a zone with one pod matching both does, once it has a node with room (what the scaler
/// creates for it: `decide`'s "two affinity terms" case).
async fn affinity_terms_count_together(cluster: Cluster) {
    let admin = cluster.admin().await;
    let ns = unique("aff");
    common::create_namespace(&admin, &ns).await;
    let (z1, z2) = (unique("zone"), unique("zone"));
    let (db, back) = (unique("db"), unique("back"));
    let zone = "topology.kubernetes.io/zone";
    let roomy = unique("roomy");
    let full = unique("full");
    cluster.add_node(&roomy, &[(zone, &z1)], json!([])).await;
    let no_room = json!([{"key": "full", "value": "true", "effect": "NoSchedule"}]);
    cluster.add_node(&full, &[(zone, &z2)], no_room).await;
    let bound = |name: &str, node: &str, labels: Value| {
        json!({"metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
    };
    for pod in [
        bound("db-only", &roomy, json!({"app": db})),
        bound("back-only", &roomy, json!({"tier": back})),
        bound("both", &full, json!({"app": db, "tier": back})),
    ] {
        common::create::<Pod>(&admin, pod).await;
    }
    let term = |key: &str, value: &str| json!({"labelSelector": {"matchLabels": {key: value}}, "topologyKey": zone});
    common::create::<Pod>(
        &admin,
        json!({"metadata": {"name": "client", "namespace": ns},
            "spec": {"terminationGracePeriodSeconds": 0,
                "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    [term("app", &db), term("tier", &back)]}},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let p = pod_until(&pods, "client", "found unschedulable", unschedulable).await;
    assert_eq!(
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        None,
        "one pod per term in {z1} satisfied the scheduler"
    );
    // The scale-up `decide` plans: a node in the zone of the pod matching both terms.
    let grown = unique("grown");
    cluster.add_node(&grown, &[(zone, &z2)], json!([])).await;
    let p = pod_until(&pods, "client", "bound", |p| node_of(p).is_some()).await;
    assert_eq!(
        p.spec.and_then(|s| s.node_name).as_deref(),
        Some(grown.as_str()),
        "the pod matching both terms is in {z2}"
    );
    let _ = pods
        .delete_collection(&Default::default(), &ListParams::default())
        .await;
    for node in [&roomy, &full, &grown] {
        cluster.remove_node(node).await;
    }
}

/// The pod `name` once `check` holds (the test fails after [`LIMIT`]).
async fn pod_until(pods: &Api<Pod>, name: &str, what: &str, check: fn(&Pod) -> bool) -> Pod {
    let until = Instant::now() + LIMIT;
    loop {
        let p = pods.get(name).await.expect("get pod");
        if check(&p) {
            return p;
        }
        assert!(
            Instant::now() < until,
            "{name} not {what} after {LIMIT:?}: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The scheduler tried the pod and found no node for it, as the scaler reads it.
fn unschedulable(p: &Pod) -> bool {
    nodeward::scaler::model::pod_view(p, &Default::default()).is_some_and(|v| v.unschedulable)
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// `nodeTaintsPolicy: Honor`, held to the real scheduler: a zone whose only node has a taint
/// the pod does not tolerate is no domain of its spread; under the default `Ignore` it is one,
/// at 0, and the same pod is unschedulable (`decide`'s "nodeTaintsPolicy Honor" case).
async fn spread_honours_taints(cluster: Cluster) {
    let admin = cluster.admin().await;
    let ns = unique("honor");
    common::create_namespace(&admin, &ns).await;
    let zone = "topology.kubernetes.io/zone";
    let (z1, z2) = (unique("zone"), unique("zone"));
    let app = unique("web");
    let (roomy, tainted) = (unique("roomy"), unique("tainted"));
    cluster.add_node(&roomy, &[(zone, &z1)], json!([])).await;
    let dedicated = json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]);
    cluster.add_node(&tainted, &[(zone, &z2)], dedicated).await;
    let web = |name: &str, node: Option<&str>, policy: &str| {
        json!({"metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": zone,
                    "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": policy,
                    "labelSelector": {"matchLabels": {"app": app}}}],
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
    };
    common::create::<Pod>(&admin, web("web-0", Some(&roomy), "Honor")).await;
    common::create::<Pod>(&admin, web("honours", None, "Honor")).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let p = pod_until(&pods, "honours", "bound", |p| node_of(p).is_some()).await;
    assert_eq!(node_of(&p), Some(roomy.as_str()), "{z2} is no domain");
    common::create::<Pod>(&admin, web("ignores", None, "Ignore")).await;
    let p = pod_until(&pods, "ignores", "found unschedulable", unschedulable).await;
    assert_eq!(node_of(&p), None, "{z2} is a domain at 0 under Ignore");
    let _ = pods
        .delete_collection(&Default::default(), &ListParams::default())
        .await;
    for node in [&roomy, &tainted] {
        cluster.remove_node(node).await;
    }
}

/// A zone spread over groups in three zones, on an empty cluster, held to the real scheduler:
/// `decide` plans two nodes in each zone the groups offer (they are the spread's domains before
/// any node is there), the nodes register as the scaler's do, with the startup taint, and count
/// as domains while tainted (`nodeTaintsPolicy: Ignore`); once their taints are lifted the
/// scheduler places the 30 pods 10/10/10. Before, `decide` planned every node in one zone.
async fn zone_spread_over_offered_zones(cluster: Cluster, min_domains: Option<u32>) {
    let admin = cluster.admin().await;
    let ns = unique("zones");
    common::create_namespace(&admin, &ns).await;
    let (zone, pool_key) = ("topology.kubernetes.io/zone", "nodeward.test/pool");
    let (pool, app) = (unique("pool"), unique("web"));
    let zones: Vec<String> = (0..3).map(|_| unique("zone")).collect();
    let mut spread = json!({"maxSkew": 1, "topologyKey": zone, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": app}}});
    if let Some(m) = min_domains {
        spread["minDomains"] = json!(m);
    }
    for i in 0..30 {
        common::create::<Pod>(
            &admin,
            json!({"metadata": {"name": format!("web-{i}"), "namespace": ns, "labels": {"app": app}},
                "spec": {"terminationGracePeriodSeconds": 0, "nodeSelector": {pool_key: pool},
                    "topologySpreadConstraints": [spread],
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "6"}}}]}}),
        )
        .await;
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let pending = pods_until(&pods, "unschedulable", unschedulable).await;
    // The scaler's view of the cluster, and its plan for three groups, one per zone, whose
    // nodes are as large as the nodes below (32 CPUs: five of these pods each).
    let nodes: Api<Node> = Api::all(admin.clone());
    let listed = nodes
        .list(&ListParams::default())
        .await
        .expect("list nodes");
    let snap = nodeward::scaler::model::Snapshot {
        nodes: listed
            .items
            .iter()
            .map(nodeward::scaler::model::node_view)
            .collect(),
        pods: pending
            .iter()
            .filter_map(|p| nodeward::scaler::model::pod_view(p, &Default::default()))
            .collect(),
        ..Default::default()
    };
    let mut s = Settings::default().scaler;
    s.groups = zones
        .iter()
        .enumerate()
        .map(|(i, z)| {
            let mut g = common::scaler_group(&format!("zone{i}"), 10);
            g.labels.insert(zone.into(), z.clone());
            g.labels.insert(pool_key.into(), pool.clone());
            g.capacity.resources.cpu_milli = 32_000;
            g.capacity.resources.memory = 256 << 30;
            g
        })
        .collect();
    let mut planned: BTreeMap<String, u32> = BTreeMap::new();
    for a in nodeward::scaler::decide::decide(&snap, jiff::Timestamp::now(), &s) {
        if let nodeward::scaler::decide::Action::ScaleUp { group, count, .. } = a {
            *planned.entry(group).or_default() += count;
        }
    }
    let want: BTreeMap<String, u32> = (0..3).map(|i| (format!("zone{i}"), 2)).collect();
    assert_eq!(planned, want, "two nodes in each zone the groups offer");
    // The planned nodes register tainted, as the scaler's machines do, then become ready.
    let startup = json!([{"key": STARTUP_TAINT_KEY, "effect": "NoSchedule"}]);
    let mut added = Vec::new();
    for (i, z) in zones.iter().enumerate() {
        for _ in 0..planned[&format!("zone{i}")] {
            let name = unique("zoned");
            cluster
                .add_node(&name, &[(zone, z), (pool_key, &pool)], startup.clone())
                .await;
            added.push((name, z.clone()));
        }
    }
    for (name, _) in &added {
        patch_merge(&nodes, name, json!({"spec": {"taints": null}})).await;
    }
    let bound = pods_until(&pods, "bound", |p| node_of(p).is_some()).await;
    let zone_of: BTreeMap<&str, &str> = added
        .iter()
        .map(|(n, z)| (n.as_str(), z.as_str()))
        .collect();
    let mut per_zone: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &bound {
        *per_zone
            .entry(
                node_of(p)
                    .and_then(|n| zone_of.get(n).copied())
                    .unwrap_or("elsewhere"),
            )
            .or_default() += 1;
    }
    let even: BTreeMap<&str, usize> = zones.iter().map(|z| (z.as_str(), 10)).collect();
    assert_eq!(
        per_zone, even,
        "the scheduler spreads the pods over the planned zones"
    );
    let _ = pods
        .delete_collection(&Default::default(), &ListParams::default())
        .await;
    for (name, _) in &added {
        cluster.remove_node(name).await;
    }
}

async fn zone_spread_without_min_domains(cluster: Cluster) {
    zone_spread_over_offered_zones(cluster, None).await;
}

async fn zone_spread_with_min_domains(cluster: Cluster) {
    zone_spread_over_offered_zones(cluster, Some(3)).await;
}

/// Every pod of `pods` once `check` holds for each (the test fails after [`LIMIT`]).
async fn pods_until(pods: &Api<Pod>, what: &str, check: fn(&Pod) -> bool) -> Vec<Pod> {
    let until = Instant::now() + LIMIT;
    loop {
        let list = pods.list(&ListParams::default()).await.expect("list pods");
        let not = list.items.iter().filter(|p| !check(p)).count();
        if not == 0 && !list.items.is_empty() {
            return list.items;
        }
        assert!(
            Instant::now() < until,
            "{not} of {} pods not {what} after {LIMIT:?}",
            list.items.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// kube-apiserver merges `matchLabelKeys` into a spread's and an affinity term's selector at
/// creation; the scaler's view of the stored pod has each merged requirement once.
async fn match_label_keys_arrive_merged(cluster: Cluster) {
    let admin = cluster.admin().await;
    let ns = unique("mlk");
    common::create_namespace(&admin, &ns).await;
    let selector = json!({"matchLabels": {"app": "web"}});
    let pod: Pod = common::create(
        &admin,
        json!({"metadata": {"name": "p", "namespace": ns,
                "labels": {"app": "web", "pod-template-hash": "abc"}},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                "nodeSelector": {"no-such-node": "true"},
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname",
                     "matchLabelKeys": ["pod-template-hash"]}]}},
                "topologySpreadConstraints": [{"maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": selector,
                    "matchLabelKeys": ["pod-template-hash"]}]}}),
    )
    .await;
    let stored = serde_json::to_value(&pod).expect("pod json");
    let hash = json!({"key": "pod-template-hash", "operator": "In", "values": ["abc"]});
    for path in [
        "/spec/topologySpreadConstraints/0/labelSelector/matchExpressions",
        "/spec/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution/0/labelSelector/matchExpressions",
    ] {
        assert_eq!(
            stored.pointer(path),
            Some(&json!([hash])),
            "{path}: {stored}"
        );
    }
    let view = nodeward::scaler::model::pod_view(&pod, &Default::default()).expect("view");
    let c = view.constraints.expect("constraints");
    for selector in [&c.spread[0].selector, &c.anti_affinity[0].selector] {
        let expressions = &selector.as_ref().expect("selector").expressions;
        assert_eq!(expressions.len(), 1, "{expressions:?}");
        assert_eq!(expressions[0].key, "pod-template-hash");
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let _ = pods.delete("p", &Default::default()).await;
}

/// The scaler's identity, as shipped in rbac-scaler.yaml, may create bootstrap tokens labelled as
/// its own and delete the ones it minted, and nothing more with Secrets: it cannot create another
/// Secret, read one (every Secret in
/// kube-system holds a credential), list them, or delete another (a delete returns the object:
/// the admission policy refuses it, even for a bootstrap token someone else made); nor replace a
/// Node whole. Tried for real, as the ServiceAccount, against the real authorizer and admission.
async fn scaler_identity_is_least_privilege(cluster: Cluster) {
    use k8s_openapi::api::core::v1::Secret;
    let admin = cluster.admin().await;
    let scaler =
        common::client(&cluster.service_account_kubeconfig("kube-system", "nodeward-scaler")).await;
    let victim: Secret = serde_json::from_value(json!({
        "metadata": {"name": unique("victim"), "namespace": "kube-system"},
        "stringData": {"password": "hunter2"}
    }))
    .expect("secret");
    let victim = Api::<Secret>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &victim)
        .await
        .expect("admin creates a secret");
    let victim_name = victim.metadata.name.clone().expect("name");
    let secrets: Api<Secret> = Api::namespaced(scaler.clone(), "kube-system");
    let forbidden = |what: &str, r: Result<(), kube::Error>| match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("the scaler may {what}: {other:?}"),
    };
    forbidden("read a Secret", secrets.get(&victim_name).await.map(drop));
    forbidden(
        "list Secrets",
        secrets.list(&ListParams::default()).await.map(drop),
    );
    forbidden(
        "delete a Secret",
        secrets
            .delete(&victim_name, &Default::default())
            .await
            .map(drop),
    );
    // Create: only a bootstrap token labelled as the scaler's. Not a plain Secret (a credential
    // planted in kube-system), nor an unlabelled token (one it could not clean up).
    let planted: Secret = serde_json::from_value(json!({
        "metadata": {"name": unique("planted"), "namespace": "kube-system",
            "labels": {"app.kubernetes.io/managed-by": "nodeward-scaler"}},
        "stringData": {"password": "hunter2"}
    }))
    .expect("secret");
    forbidden(
        "create a Secret other than a bootstrap token",
        secrets
            .create(&PostParams::default(), &planted)
            .await
            .map(drop),
    );
    let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_mins(5);
    let unlabelled = nodeward::scaler::token::generate(&mut rand::rng());
    let mut unlabelled = nodeward::scaler::token::secret_object(&unlabelled, expires, &[], "g");
    unlabelled.metadata.labels = None;
    forbidden(
        "create a bootstrap token without its label",
        secrets
            .create(&PostParams::default(), &unlabelled)
            .await
            .map(drop),
    );
    // A bootstrap token of someone else's (kubeadm's, an operator's): not the scaler's to delete.
    let foreign = nodeward::scaler::token::generate(&mut rand::rng());
    let mut foreign_secret = nodeward::scaler::token::secret_object(&foreign, expires, &[], "g");
    foreign_secret.metadata.labels = None;
    let foreign_name = foreign_secret.metadata.name.clone().expect("name");
    Api::<Secret>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &foreign_secret)
        .await
        .expect("admin creates a bootstrap token");
    forbidden(
        "delete a bootstrap token it did not mint",
        nodeward::scaler::token::delete(&scaler, &foreign.id).await,
    );
    // What it needs: minting a token, and deleting it once its node joined.
    let token = nodeward::scaler::token::mint(&scaler, expires, &[], "g")
        .await
        .expect("the scaler mints a token");
    nodeward::scaler::token::delete(&scaler, &token.id)
        .await
        .expect("the scaler deletes its own token");
    let gone = Api::<Secret>::namespaced(admin.clone(), "kube-system")
        .get_opt(&format!("bootstrap-token-{}", token.id))
        .await
        .expect("admin reads");
    assert!(gone.is_none(), "the token is still there: {gone:?}");
    let nodes: Api<Node> = Api::all(scaler.clone());
    let node_name = unique("least-privilege");
    let some: Node =
        serde_json::from_value(json!({"metadata": {"name": node_name}})).expect("node");
    let admin_nodes: Api<Node> = Api::all(admin.clone());
    let some = admin_nodes
        .create(&PostParams::default(), &some)
        .await
        .expect("admin creates a Node");
    forbidden(
        "replace a Node",
        nodes
            .replace(&node_name, &PostParams::default(), &some)
            .await
            .map(drop),
    );
    let _ = admin_nodes.delete(&node_name, &Default::default()).await;
    let admin_secrets: Api<Secret> = Api::namespaced(admin, "kube-system");
    let _ = admin_secrets
        .delete(&victim_name, &Default::default())
        .await;
    let _ = admin_secrets
        .delete(&foreign_name, &Default::default())
        .await;
}

real_only! {
    the_scaler_identity_is_least_privilege => super::scaler_identity_is_least_privilege;
    pending_pods_bring_machines_that_join_become_ready_and_leave => super::scale_up_and_down;
    a_rebooting_node_older_than_max_provision_time_keeps_its_machine => super::rebooting_node_keeps_its_machine;
    match_label_keys_arrive_merged_into_the_selectors => super::match_label_keys_arrive_merged;
    the_scheduler_counts_a_pods_affinity_terms_together => super::affinity_terms_count_together;
    a_spread_honouring_taints_leaves_a_repelling_zone_out => super::spread_honours_taints;
    a_zone_spread_goes_to_every_zone_the_groups_offer => super::zone_spread_without_min_domains;
    a_zone_spread_with_min_domains_meets_them_in_the_zones_offered => super::zone_spread_with_min_domains;
}
