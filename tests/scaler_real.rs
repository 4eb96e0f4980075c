//! The scaler end to end on the real control plane: the real scheduler marks pods
//! Unschedulable; the scaler (its ServiceAccount, shipped RBAC) mints bootstrap tokens and
//! creates machines in the Cherry emulator; each "boots": its bootstrap token must authenticate
//! to the real kube-apiserver, then its Node registers as `system:node:NAME` with the group
//! label and the startup taint (kwok plays its kubelet) and a real `nodeward agent` runs for it;
//! the readiness controller lifts the taint; the scheduler binds the pods. Then the load goes
//! away and the scaler drains (budgets respected) and deletes the machines.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cherry_emulator::CherryEmulator;
use cherry_emulator::machines::{find_bootstrap_token, node_labels};
use common::{Cluster, Proc, spawn_agent, unique, write_flannel};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, PostParams};
use nodeward::config::Settings;
use nodeward::readiness::STARTUP_TAINT_KEY;
use serde_json::{Value, json};

const API_TOKEN: &str = "cherry-real-e2e-token-4c3b2a";
const LIMIT: Duration = Duration::from_secs(90);

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

async fn scale_up_and_down(cluster: Cluster) {
    // The scaler runs in this process: its log goes to the test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info,kube=warn")
        .with_test_writer()
        .try_init();
    let admin = cluster.admin().await;
    let cherry = common::cherry_emulator(API_TOKEN).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let values = dir.path().join("values.toml");
    std::fs::write(
        &values,
        r#"api_server_endpoint = "10.0.2.100:6443"
ca_cert_hashes = ["sha256:8c3d1e4f0a9b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d"]
kubernetes_version = "v1.37.2"
package_url = "https://10.0.2.101/nodeward.{ext}"
"#,
    )
    .expect("values");
    let group_name = unique("g").replace('-', "");
    let mut settings = Settings::default();
    let s = &mut settings.scaler;
    s.cluster_name = "real".into();
    s.values = values;
    s.cherry.api_url = cherry.url();
    s.cherry.project_id = Some(7);
    s.cherry.request_timeout = Duration::from_secs(2);
    s.scan_interval = Duration::from_millis(200);
    s.lease_duration = Duration::from_secs(2);
    s.metrics_address = None;
    s.scale_down_unneeded_time = Duration::from_secs(2);
    s.max_provision_time = Duration::from_secs(60);
    s.groups = vec![common::scaler_group(&group_name, 4)];
    settings.drain.timeout = Duration::from_secs(20);

    let _controller = common::spawn_controller(
        &cluster.service_account_kubeconfig(common::CONTROLLER_SA.0, common::CONTROLLER_SA.1),
        &[],
    );
    let scaler_client =
        common::client(&cluster.service_account_kubeconfig("kube-system", "nodeward-scaler")).await;
    let provider =
        nodeward::scaler::provider_from_settings(&settings.scaler, Some(API_TOKEN.into()))
            .expect("provider");
    let scaler = nodeward::scaler::run::Scaler::new(
        scaler_client,
        provider,
        &settings,
        nodeward::scaler::run::RunOptions {
            dry_run: false,
            identity: "real-e2e".into(),
        },
    )
    .await
    .expect("scaler starts");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let scaler_task = tokio::spawn(async move {
        scaler
            .run(async {
                let _ = stop_rx.await;
            })
            .await
            .expect("scaler runs");
    });

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

    // Load goes away: the scaler drains and deletes both machines.
    let t1 = Instant::now();
    deployments
        .delete("load", &Default::default())
        .await
        .expect("delete load");
    let nodes: Api<Node> = Api::all(admin.clone());
    loop {
        let left: Vec<String> = nodes
            .list(&ListParams::default().labels(&format!("nodeward.io/node-group={group_name}")))
            .await
            .expect("nodes")
            .items
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

real_only! {
    pending_pods_bring_machines_that_join_become_ready_and_leave => super::scale_up_and_down;
}
