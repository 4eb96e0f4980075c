//! Readiness end to end: the agent reports `nodeward.io/Ready` with the node's identity, the
//! readiness controller removes the startup taint with its own. On kube-emulator and on the real
//! control plane (kube-apiserver with NodeRestriction), where the agent really is
//! `system:node:NAME` and the controller its ServiceAccount, with the shipped RBAC.

mod common;

use std::time::Duration;

use common::{Cluster, Proc, spawn_agent, spawn_controller, unique, wait_node, write_flannel};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodeward::readiness::{CONDITION_TYPE, STARTUP_TAINT_KEY, has_startup_taint};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(30);

fn startup_taint() -> serde_json::Value {
    json!([{"key": STARTUP_TAINT_KEY, "effect": "NoSchedule"}])
}

fn reports(n: &Node, status: &str) -> bool {
    nodeward::readiness::condition(n).is_some_and(|c| c.status == status)
}

fn controller(cluster: &Cluster, flags: &[&str]) -> Proc {
    let (ns, name) = common::CONTROLLER_SA;
    spawn_controller(&cluster.service_account_kubeconfig(ns, name), flags)
}

/// A new node registers with the startup taint; flannel comes up; the agent (node identity)
/// reports ready; the controller (its ServiceAccount) removes the taint; a pod lands there.
async fn agent_reports_controller_untaints(cluster: Cluster) {
    let node = unique("ready");
    let admin = cluster.admin().await;
    cluster.add_node(&node, &[], startup_taint()).await;
    let _controller = controller(&cluster, &[]);
    let agent = spawn_agent(&node, &cluster.node_kubeconfig(&node), "");

    let n = wait_node(
        &admin,
        &node,
        "condition False naming the flannel gate",
        LIMIT,
        |n| reports(n, "False"),
    )
    .await;
    let msg = nodeward::readiness::condition(&n)
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    assert!(msg.contains("subnet.env"), "{msg}");
    assert!(has_startup_taint(&n), "not ready yet: the taint stays");

    // A pod for this node only: held back by the taint while the node is not ready.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": node.clone()},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node.clone()},
                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .expect("pod");
    if cluster.is_real() {
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("pod");
    }

    let t0 = std::time::Instant::now();
    write_flannel(&agent);
    let n = wait_node(&admin, &node, "taint removed", LIMIT, |n| {
        !has_startup_taint(n)
    })
    .await;
    eprintln!("flannel file -> taint gone: {:?}", t0.elapsed());
    assert!(reports(&n, "True"), "{:?}", n.status);
    // Only nodeward's taint went: on the real control plane the node lifecycle controller's
    // node.kubernetes.io/not-ready may still be there until kwok's first heartbeat; theirs.
    let others: Vec<_> = n.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        others.iter().all(|t| t.key != STARTUP_TAINT_KEY),
        "{others:?}"
    );

    if cluster.is_real() {
        // The real scheduler binds it now, kwok runs it.
        let running = tokio::time::timeout(LIMIT, async {
            loop {
                let p = pods.get(&node).await.expect("pod");
                if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()) {
                    return p;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("the scheduler binds the pod to the ready node");
        assert_eq!(
            running.spec.and_then(|s| s.node_name).as_deref(),
            Some(node.as_str())
        );
        let _ = pods.delete(&node, &Default::default()).await;
    }
    cluster.remove_node(&node).await;
}

/// Continuous mode: flannel dies, the condition turns False, the controller puts the taint
/// back; flannel returns, it goes again.
async fn gate_failure_taints_again(cluster: Cluster) {
    let node = unique("flap");
    let admin = cluster.admin().await;
    cluster.add_node(&node, &[], startup_taint()).await;
    let _controller = controller(&cluster, &["--mode", "continuous"]);
    let agent = spawn_agent(&node, &cluster.node_kubeconfig(&node), "");
    write_flannel(&agent);
    wait_node(&admin, &node, "taint removed", LIMIT, |n| {
        !has_startup_taint(n)
    })
    .await;
    common::remove_flannel(&agent);
    let n = wait_node(&admin, &node, "taint back", LIMIT, has_startup_taint).await;
    assert!(reports(&n, "False"));
    write_flannel(&agent);
    wait_node(&admin, &node, "taint removed again", LIMIT, |n| {
        !has_startup_taint(n)
    })
    .await;
    cluster.remove_node(&node).await;
}

/// An agent restart (a package upgrade restarts it) is not a readiness change: while its watches
/// resync it reports nothing, so the controller never puts the taint back on a ready node.
async fn agent_restart_does_not_flap_the_taint(cluster: Cluster) {
    let node = unique("restart");
    let admin = cluster.admin().await;
    cluster.add_node(&node, &[], startup_taint()).await;
    let _controller = controller(&cluster, &["--mode", "continuous"]);
    let kc = cluster.node_kubeconfig(&node);
    let mut agent = spawn_agent(&node, &kc, "");
    write_flannel(&agent);
    wait_node(&admin, &node, "taint removed", LIMIT, |n| {
        !has_startup_taint(n)
    })
    .await;
    // flannel's pod on the node, Ready; the restarted agent gates on it too (a gate that is
    // "not known yet" until its pod watch has listed).
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let flannel_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("flannel-{node}"), "labels": {"app": format!("flannel-{node}")}},
        "spec": {"nodeName": node.clone(), "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &flannel_pod)
        .await
        .expect("pod");
    if let Some(emu) = cluster.emu() {
        emu.mark_pod_running_ready("default", &format!("flannel-{node}"))
            .expect("ready");
    }
    let t0 = std::time::Instant::now();
    while !pods
        .get(&format!("flannel-{node}"))
        .await
        .expect("pod")
        .status
        .and_then(|s| s.conditions)
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    {
        assert!(t0.elapsed() < LIMIT, "flannel pod never Ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    agent.stop();
    // The new agent sees the same flannel file.
    let flannel = agent.dir.path().join("subnet.env");
    let again = common::Proc::spawn(&["agent"], |dir| {
        let cfg = std::fs::read_to_string(agent.dir.path().join("config.toml"))
            .expect("config")
            .replace(
                &agent.dir.path().join("status.json").display().to_string(),
                &dir.join("status.json").display().to_string(),
            )
            .replace(
                "pod = []",
                &format!(
                    "pod = [{{ namespace = \"default\", selector = \"app=flannel-{node}\" }}]"
                ),
            );
        std::fs::write(dir.join("config.toml"), cfg).expect("config");
        vec![
            "--config".into(),
            dir.join("config.toml").display().to_string(),
        ]
    });
    assert!(flannel.exists());
    // Watch the Node for 3 s: the taint must never come back.
    let seen = tokio::time::timeout(
        Duration::from_secs(3),
        wait_node(
            &admin,
            &node,
            "taint back (must not happen)",
            LIMIT,
            has_startup_taint,
        ),
    )
    .await;
    assert!(
        seen.is_err(),
        "the restart put the startup taint back\n{}",
        again.log_text()
    );
    cluster.remove_node(&node).await;
}

/// Controller down: the node reports ready and stays tainted; the controller starts and catches
/// up at once (from its initial list, not from a new event).
async fn controller_down_then_catches_up(cluster: Cluster) {
    let node = unique("late");
    let admin = cluster.admin().await;
    cluster.add_node(&node, &[], startup_taint()).await;
    let agent = spawn_agent(&node, &cluster.node_kubeconfig(&node), "");
    write_flannel(&agent);
    let n = wait_node(&admin, &node, "condition True", LIMIT, |n| {
        reports(n, "True")
    })
    .await;
    assert!(
        has_startup_taint(&n),
        "no controller: nobody removes the taint"
    );
    let t0 = std::time::Instant::now();
    let _controller = controller(&cluster, &[]);
    wait_node(
        &admin,
        &node,
        "taint removed after the controller started",
        LIMIT,
        |n| !has_startup_taint(n),
    )
    .await;
    eprintln!(
        "a controller started after the node became ready untainted it {:?} after its start",
        t0.elapsed()
    );
    cluster.remove_node(&node).await;
}

/// Marks `node` as reporting ready (the agent's condition, written as the agent writes it).
async fn report_ready(admin: &kube::Client, node: &str) {
    let patch = json!({"status": {"conditions": [{"type": CONDITION_TYPE, "status": "True",
        "reason": "GatesPassed", "message": "test", "lastHeartbeatTime": jiff::Timestamp::now().to_string(),
        "lastTransitionTime": jiff::Timestamp::now().to_string()}]}});
    Api::<Node>::all(admin.clone())
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("condition");
}

/// A node that registered under nodeward 0.1 carries the startup taint's old key: once it
/// reports ready, the controller lifts that taint just the same.
async fn a_node_with_the_legacy_taint_key_is_untainted(cluster: Cluster) {
    let admin = cluster.admin().await;
    let _controller = controller(&cluster, &[]);
    let node = unique("legacy");
    let legacy =
        json!([{"key": nodeward::names::LEGACY_STARTUP_TAINT_KEY, "effect": "NoSchedule"}]);
    cluster.add_node(&node, &[], legacy).await;
    report_ready(&admin, &node).await;
    let n = wait_node(&admin, &node, "legacy taint lifted", LIMIT, |n| {
        !has_startup_taint(n)
    })
    .await;
    let keys: Vec<String> = n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert!(
        !keys
            .iter()
            .any(|k| nodeward::names::is_startup_taint_key(k)),
        "{keys:?}"
    );
    cluster.remove_node(&node).await;
}

/// Two replicas, both acting, no leader: each node is untainted by exactly one write (the other
/// replica's guarded write conflicts and its fresh read finds nothing to do).
async fn two_replicas_write_each_change_once(cluster: Cluster) {
    let admin = cluster.admin().await;
    let mut a = controller(&cluster, &[]);
    let mut b = controller(&cluster, &[]);
    let nodes: Vec<String> = (0..3).map(|_| unique("pair")).collect();
    for node in &nodes {
        cluster.add_node(node, &[], startup_taint()).await;
    }
    for node in &nodes {
        report_ready(&admin, node).await;
    }
    for node in &nodes {
        wait_node(&admin, node, "taint removed", LIMIT, |n| {
            !has_startup_taint(n)
        })
        .await;
    }
    // A replica logs its write once the API server has answered it, which can be after this
    // test saw the taint go: count from the logs of stopped replicas.
    tokio::task::block_in_place(|| {
        a.stop();
        b.stop();
    });
    let writes = |p: &Proc| p.log_text().matches("startup taint changed").count();
    let (wa, wb) = (writes(&a), writes(&b));
    assert_eq!(
        wa + wb,
        nodes.len(),
        "each node untainted exactly once\n--- a ---\n{}\n--- b ---\n{}",
        a.log_text(),
        b.log_text()
    );
    for node in &nodes {
        cluster.remove_node(node).await;
    }
}

/// A replica killed with SIGKILL (a crash, an OOM kill: nothing released) delays nothing: the
/// survivor untaints a node that reports ready right after as fast as ever, and once every
/// replica is dead, a new one untaints a node that became ready meanwhile as soon as it has
/// listed the nodes. With a leader, both waited out the dead leader's Lease (20.0 s measured).
async fn a_crashed_replica_delays_nothing(cluster: Cluster) {
    // Below the default Lease (15 s) that a leader-elected controller waited out after a crash:
    // the bound tells "waits for nothing" from "waits for a Lease", it is no speed target.
    const NO_LEASE_WAIT: Duration = Duration::from_secs(10);
    let admin = cluster.admin().await;
    let mut a = controller(&cluster, &[]);
    let mut b = controller(&cluster, &[]);
    tokio::task::block_in_place(|| {
        a.wait_for_log("nodes listed", LIMIT);
        b.wait_for_log("nodes listed", LIMIT);
        a.kill();
    });
    let first = unique("crash");
    cluster.add_node(&first, &[], startup_taint()).await;
    let t0 = std::time::Instant::now();
    report_ready(&admin, &first).await;
    wait_node(
        &admin,
        &first,
        "the survivor untaints",
        NO_LEASE_WAIT,
        |n| !has_startup_taint(n),
    )
    .await;
    let survivor = t0.elapsed();

    tokio::task::block_in_place(|| b.kill());
    let second = unique("crash");
    cluster.add_node(&second, &[], startup_taint()).await;
    report_ready(&admin, &second).await;
    let t1 = std::time::Instant::now();
    let _c = controller(&cluster, &[]);
    wait_node(
        &admin,
        &second,
        "a new replica catches up",
        NO_LEASE_WAIT,
        |n| !has_startup_taint(n),
    )
    .await;
    let restarted = t1.elapsed();
    eprintln!(
        "one of two replicas SIGKILLed: condition True -> taint gone in {survivor:?}; \
         both killed, a new replica started: start -> taint gone in {restarted:?}"
    );
    for node in [&first, &second] {
        cluster.remove_node(node).await;
    }
}

/// NodeRestriction is really enforced: the node identity alone may not change its own taints
/// (whatever RBAC grants), but may report its status and lift its own cordon.
async fn noderestriction_refuses_a_nodes_taint_change(cluster: Cluster) {
    let node = unique("restricted");
    cluster.add_node(&node, &[], startup_taint()).await;
    let as_node = common::client(&cluster.node_kubeconfig(&node)).await;
    let err = nodeward::readiness::set_startup_taint(&as_node, &node, false, None)
        .await
        .expect_err("NodeRestriction refuses a node its own taints");
    assert_eq!(err.code(), Some(403), "{err}");
    assert!(
        err.to_string().contains("not allowed to modify taints"),
        "{err}"
    );
    // The agent's cordon handling: the node identity may cordon and uncordon itself.
    nodeward::drain::cordon(&as_node, &node, "test", false)
        .await
        .expect("a node may cordon itself");
    nodeward::drain::uncordon(&as_node, &node, false, nodeward::drain::Lifter::Operator)
        .await
        .expect("and lift its own cordon");
    // ... and may not touch another node.
    let other = unique("other");
    cluster.add_node(&other, &[], json!([])).await;
    let err = nodeward::drain::cordon(&as_node, &other, "test", false)
        .await
        .expect_err("NodeRestriction confines a node to its own Node");
    assert!(
        err.to_string().contains("403") || err.to_string().contains("forbidden"),
        "{err}"
    );
    cluster.remove_node(&node).await;
    cluster.remove_node(&other).await;
}

/// kubelet rotates its client certificate behind `kubelet-client-current.pem` (a new file, the
/// symlink swapped), and `kubelet.conf` names that path. The agent's client read the file once:
/// once the loaded certificate was no longer accepted every request was 401 until a restart.
/// Here the agent starts on a certificate the API server refuses (as an expired one would be),
/// then the symlink is swapped to a valid one, as kubelet does: the agent must report with it,
/// without a restart (issue 41, defect 4).
async fn rotated_client_certificate_is_read(cluster: Cluster) {
    use base64::Engine;
    let node = unique("rotated");
    let admin = cluster.admin().await;
    cluster.add_node(&node, &[], startup_taint()).await;
    let issued: serde_norway::Value = serde_norway::from_str(
        &std::fs::read_to_string(cluster.node_kubeconfig(&node)).expect("node kubeconfig"),
    )
    .expect("yaml");
    let field = |path: &[&str]| -> String {
        let mut v = &issued;
        for p in path {
            v = match p.parse::<usize>() {
                Ok(i) => &v[i],
                Err(_) => &v[*p],
            };
        }
        v.as_str()
            .unwrap_or_else(|| panic!("{path:?} in the kubeconfig"))
            .to_string()
    };
    let b64 = |s: String| {
        base64::engine::general_purpose::STANDARD
            .decode(s.trim())
            .expect("base64")
    };
    let cert = b64(field(&["users", "0", "user", "client-certificate-data"]));
    let key = b64(field(&["users", "0", "user", "client-key-data"]));
    let server = field(&["clusters", "0", "cluster", "server"]);
    let ca = field(&["clusters", "0", "cluster", "certificate-authority-data"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path();
    std::fs::write(pki.join("valid.pem"), [cert, key].concat()).expect("write");
    // The refused one: same subject, signed by no CA the API server trusts.
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", &format!("/O=system:nodes/CN=system:node:{node}")])
        .arg("-keyout")
        .arg(pki.join("stale.key"))
        .arg("-out")
        .arg(pki.join("stale.crt"))
        .output()
        .expect("openssl (apt-get install openssl)");
    assert!(made.status.success(), "{made:?}");
    let stale = [
        std::fs::read(pki.join("stale.crt")).expect("crt"),
        std::fs::read(pki.join("stale.key")).expect("key"),
    ]
    .concat();
    std::fs::write(pki.join("stale.pem"), stale).expect("write");
    std::os::unix::fs::symlink("stale.pem", pki.join("current.pem")).expect("symlink");
    let kubeconfig = pki.join("kubelet.conf");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    client-certificate: {dir}/current.pem\n    client-key: {dir}/current.pem\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
            dir = pki.display()
        ),
    )
    .expect("kubeconfig");
    let agent = spawn_agent(&node, &kubeconfig, "");
    write_flannel(&agent);
    agent.wait_for_log("Unauthorized", LIMIT);
    let n: Node = Api::all(admin.clone()).get(&node).await.expect("node");
    assert!(
        nodeward::readiness::condition(&n).is_none(),
        "the refused certificate wrote a condition: {:?}",
        n.status
    );
    // kubelet's rotation: a new file, the symlink swapped in one rename.
    let t0 = std::time::Instant::now();
    std::os::unix::fs::symlink("valid.pem", pki.join("current.pem.tmp")).expect("symlink");
    std::fs::rename(pki.join("current.pem.tmp"), pki.join("current.pem")).expect("rename");
    wait_node(
        &admin,
        &node,
        "the agent reports with the rotated certificate",
        LIMIT,
        |n| reports(n, "True"),
    )
    .await;
    eprintln!(
        "certificate rotated -> condition written: {:?}",
        t0.elapsed()
    );
    drop(agent);
    cluster.remove_node(&node).await;
}

/// SIGTERM while the API server does not answer (frozen, or partitioned away): the controller
/// exits at once, its taint write in flight dropped (the write is guarded, and the next replica
/// or start repeats it). It awaited that write before it looked at the signal again: on a real
/// node, its pods outlived their SIGTERM and held a power-off past the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_is_prompt_while_the_api_server_does_not_answer() {
    let cluster = Cluster::emulator().await;
    let emu = cluster.emu().expect("emulator");
    let node = unique("frozen");
    cluster.add_node(&node, &[], startup_taint()).await;
    let mut c = controller(&cluster, &[]);
    tokio::task::block_in_place(|| c.wait_for_log("nodes listed", LIMIT));
    // "nodes listed" comes before the watch request (kube's watcher lists, then watches): a
    // latency set now could hold the watch itself, and the controller would never see the report
    // below (it failed so once, under load). A probe node it untaints proves the watch is up.
    let probe = unique("probe");
    cluster.add_node(&probe, &[], startup_taint()).await;
    emu.modify("nodes", None, &probe, |n| {
        n["status"]["conditions"] = json!([{"type": CONDITION_TYPE, "status": "True",
            "reason": "GatesPassed", "message": "test",
            "lastHeartbeatTime": jiff::Timestamp::now().to_string(),
            "lastTransitionTime": jiff::Timestamp::now().to_string()}]);
    })
    .expect("report the probe ready");
    let admin = cluster.admin().await;
    wait_node(
        &admin,
        &probe,
        "the controller untaints the probe",
        LIMIT,
        |n| !has_startup_taint(n),
    )
    .await;
    emu.set_latency(Duration::from_secs(600));
    // Written in the emulator's store, not through its (frozen) API: the watch delivers it.
    emu.modify("nodes", None, &node, |n| {
        n["status"]["conditions"] = json!([{"type": CONDITION_TYPE, "status": "True",
            "reason": "GatesPassed", "message": "test",
            "lastHeartbeatTime": jiff::Timestamp::now().to_string(),
            "lastTransitionTime": jiff::Timestamp::now().to_string()}]);
    })
    .expect("report ready");
    let t0 = std::time::Instant::now();
    while !emu
        .held_requests()
        .iter()
        .any(|(verb, resource)| verb == "patch" && resource == "nodes")
    {
        assert!(t0.elapsed() < LIMIT, "the controller never wrote the taint");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t0 = std::time::Instant::now();
    tokio::task::block_in_place(|| c.stop());
    let took = t0.elapsed();
    emu.set_latency(Duration::ZERO);
    let log = c.log_text();
    assert!(
        log.contains("readiness controller stopped"),
        "stopped on its own, not killed after {took:?}:\n{log}"
    );
    assert!(
        took < Duration::from_secs(2),
        "stopped {took:?} after SIGTERM"
    );
}

/// A Node no kwok plays, as its own kubelet registered it (Ready, boot ID `boot-1`): it can be
/// made to go off without a stand-in finishing its pods' deletions, which is the pod GC's part.
async fn add_bare_node(cluster: &Cluster, name: &str, labels: &[(&str, &str)]) {
    let admin = cluster.admin().await;
    let api: Api<Node> = Api::all(admin.clone());
    let mut n = json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}});
    for (k, v) in labels {
        n["metadata"]["labels"][*k] = json!(v);
    }
    let node: Node = serde_json::from_value(n).expect("node json");
    api.create(&PostParams::default(), &node)
        .await
        .expect("create node");
    let capacity = json!({"cpu": "32", "memory": "256Gi", "pods": "110"});
    kubelet_says(&admin, name, "True", "boot-1", Some(capacity)).await;
}

/// The Node `node` says `Ready` = `ready` since now, with boot ID `boot` (and `capacity`, when
/// given), written by `client`: what a kubelet reports (the node's identity), or the node
/// lifecycle controller once it stops reporting.
async fn kubelet_says(
    client: &kube::Client,
    node: &str,
    ready: &str,
    boot: &str,
    capacity: Option<serde_json::Value>,
) {
    let api: Api<Node> = Api::all(client.clone());
    let now = jiff::Timestamp::now().to_string();
    let mut status = json!({"status": {
        "nodeInfo": {"bootID": boot},
        "conditions": [{"type": "Ready", "status": ready, "reason": "Test",
            "message": "test", "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
    if let Some(c) = capacity {
        status["status"]["capacity"] = c.clone();
        status["status"]["allocatable"] = c;
    }
    api.patch_status(node, &PatchParams::default(), &Patch::Strategic(status))
        .await
        .expect("the node's status");
}

fn out_of_service(n: &Node) -> bool {
    nodeward::out_of_service::has_taint(n)
}

/// The agent's power-off record, written with `node`'s own identity (NodeRestriction lets it).
async fn announce_power_off(cluster: &Cluster, node: &str, boot: &str) {
    let as_node = common::client(&cluster.node_kubeconfig(node)).await;
    let record = nodeward::out_of_service::PowerOff {
        boot_id: boot.into(),
        at: jiff::Timestamp::now().to_string(),
        left_behind: Vec::new(),
        terminating: Vec::new(),
        tainted_at: None,
    };
    nodeward::out_of_service::announce(&as_node, node, &record)
        .await
        .expect("a node may record its power-off on its own Node");
}

/// A StatefulSet `name` of one replica on the nodes labelled `group=name`, under a budget that
/// never opens (minAvailable 1).
async fn stateful_set(admin: &kube::Client, name: &str) {
    let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": 1, "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"nodeSelector": {"group": name}, "terminationGracePeriodSeconds": 30,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}});
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}}});
    let pp = PatchParams::apply("test").force();
    let sts_api: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(admin.clone(), "default");
    sts_api
        .patch(name, &pp, &Patch::Apply(sts))
        .await
        .expect("sts");
    let pdb_api: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(admin.clone(), "default");
    pdb_api
        .patch(name, &pp, &Patch::Apply(pdb))
        .await
        .expect("pdb");
}

/// The StatefulSet's pod `NAME-0` once `pred` holds for it (`None`: absent).
async fn wait_pod(
    admin: &kube::Client,
    name: &str,
    what: &str,
    limit: Duration,
    pred: impl Fn(Option<&Pod>) -> bool,
) -> Option<Pod> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let t0 = std::time::Instant::now();
    loop {
        let p = pods.get_opt(&format!("{name}-0")).await.expect("get pod");
        if pred(p.as_ref()) {
            return p;
        }
        assert!(
            t0.elapsed() < limit,
            "{what}: not within {limit:?}; pod: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Who deleted pod `name` in `default`, in order, from the real API server's audit log.
fn deleted_by(name: &str) -> Vec<String> {
    let dir = std::env::var_os(common::CONTROL_PLANE_ENV).expect("a real control plane");
    let text =
        std::fs::read_to_string(std::path::Path::new(&dir).join("audit.log")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            let r = &e["objectRef"];
            e["verb"] == "delete"
                && e["stage"] == "ResponseComplete"
                && r["resource"] == "pods"
                && r["namespace"] == "default"
                && r["name"] == name
                && r["subresource"].is_null()
        })
        .filter_map(|e| e["user"]["username"].as_str().map(String::from))
        .collect()
}

fn bound_to(p: Option<&Pod>, node: &str) -> bool {
    p.and_then(|p| p.spec.as_ref()?.node_name.as_deref()) == Some(node)
}

fn running_on(p: Option<&Pod>, node: &str) -> bool {
    bound_to(p, node) && p.and_then(|p| p.status.as_ref()?.phase.as_deref()) == Some("Running")
}

/// Issue 43, item 3, on the real control plane: a node that announced a power-off and went
/// NotReady gets the out-of-service taint after `--out-of-service-after`; the
/// controller-manager's taint eviction and pod GC then delete its StatefulSet pod (left behind
/// under a budget that never opens) and the StatefulSet's replacement runs on another node. A
/// node that went NotReady without announcing one, and one that announced but stays Ready, get
/// nothing; a new boot ID removes the taint and the record.
async fn a_powered_off_node_is_taken_out_of_service(cluster: Cluster) {
    let admin = cluster.admin().await;
    let group = unique("oos");
    let (off, spare, quiet, up) = (
        format!("{group}-off"),
        format!("{group}-spare"),
        format!("{group}-quiet"),
        format!("{group}-up"),
    );
    add_bare_node(&cluster, &off, &[("group", &group)]).await;
    let unschedulable = json!([{"key": "test/not-yet", "effect": "NoSchedule"}]);
    cluster
        .add_node(&spare, &[("group", &group)], unschedulable)
        .await;
    add_bare_node(&cluster, &quiet, &[]).await;
    cluster.add_node(&up, &[], json!([])).await;
    stateful_set(&admin, &group).await;
    let first = wait_pod(&admin, &group, "the pod bound to the node", LIMIT, |p| {
        bound_to(p, &off)
    })
    .await
    .expect("pod");
    let nodes: Api<Node> = Api::all(admin.clone());
    let untaint = json!({"spec": {"taints": null}});
    nodes
        .patch(&spare, &PatchParams::default(), &Patch::Merge(&untaint))
        .await
        .expect("the spare node open");

    announce_power_off(&cluster, &off, "boot-1").await;
    let up_boot = nodes
        .get(&up)
        .await
        .expect("node")
        .status
        .and_then(|s| s.node_info);
    let up_boot = up_boot.map(|i| i.boot_id).unwrap_or_default();
    announce_power_off(&cluster, &up, &up_boot).await;
    kubelet_says(&admin, &off, "False", "boot-1", None).await;
    kubelet_says(&admin, &quiet, "False", "boot-1", None).await;
    let t_down = std::time::Instant::now();
    let _controller = controller(
        &cluster,
        &["--out-of-service", "--out-of-service-after", "5s"],
    );

    wait_node(
        &admin,
        &off,
        "the out-of-service taint",
        LIMIT,
        out_of_service,
    )
    .await;
    let tainted = t_down.elapsed();
    let uid = first.metadata.uid.clone();
    let limit = Duration::from_secs(120);
    wait_pod(&admin, &group, "the old pod deleted", limit, |p| {
        p.is_none_or(|p| p.metadata.uid != uid)
    })
    .await;
    let deleted = t_down.elapsed();
    wait_pod(
        &admin,
        &group,
        "the replacement runs on the spare node",
        limit,
        |p| running_on(p, &spare),
    )
    .await;
    let replaced = t_down.elapsed();
    eprintln!(
        "NotReady -> out-of-service taint {tainted:?} (after 5s), -> pod deleted {deleted:?}, -> replacement Running on {spare} {replaced:?}"
    );
    // Deleted by the controller-manager's taint eviction, then force-deleted by its pod GC
    // (no kubelet finishes a deletion on a node that is off).
    let by = deleted_by(&format!("{group}-0"));
    let gc = "system:serviceaccount:kube-system:pod-garbage-collector";
    assert!(
        by.iter().any(|u| u == gc),
        "the pod GC did not delete it: {by:?}"
    );
    for (n, why) in [(&quiet, "announced nothing"), (&up, "still Ready")] {
        let node = nodes.get(n).await.expect("node");
        assert!(!out_of_service(&node), "{n} {why}, yet tainted");
    }

    kubelet_says(&admin, &off, "False", "boot-2", None).await;
    let back = wait_node(
        &admin,
        &off,
        "the taint gone after a new boot",
        LIMIT,
        |n| !out_of_service(n),
    )
    .await;
    assert_eq!(nodeward::out_of_service::PowerOff::of(&back), None);
    let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(admin.clone(), "default");
    let _ = sts.delete(&group, &Default::default()).await;
    for n in [&off, &spare, &quiet, &up] {
        cluster.remove_node(n).await;
    }
}

/// Renews `node`'s heartbeat Lease in kube-node-lease with its own identity every second, as a
/// kubelet does (every ten), until the task is aborted; the other half holds when the last
/// renewal was answered.
async fn heartbeat(
    cluster: &Cluster,
    node: &str,
) -> (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<std::time::Instant>>,
) {
    use k8s_openapi::api::coordination::v1::Lease;
    let as_node = common::client(&cluster.node_kubeconfig(node)).await;
    let leases: Api<Lease> = Api::namespaced(as_node, "kube-node-lease");
    let name = node.to_string();
    let holder = name.clone();
    let lease = move |now: jiff::Timestamp| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": holder, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 40,
                "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}})
    };
    let first: Lease = serde_json::from_value(lease(jiff::Timestamp::now())).expect("lease");
    leases
        .create(&PostParams::default(), &first)
        .await
        .expect("a node may create its own heartbeat Lease");
    let last = std::sync::Arc::new(std::sync::Mutex::new(std::time::Instant::now()));
    let renewed = last.clone();
    let task = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let renew = lease(jiff::Timestamp::now());
            let pp = PatchParams::default();
            match leases.patch(&name, &pp, &Patch::Merge(&renew)).await {
                Ok(_) => *renewed.lock().expect("lock") = std::time::Instant::now(),
                Err(e) => eprintln!("heartbeat of {name}: {e}"),
            }
        }
    });
    (task, last)
}

/// Issue 58, item 1, on the real control plane: a node that recorded a power-off and whose own
/// kubelet (its identity) reports Ready=False, but whose heartbeat Lease is still renewed, is a
/// machine still running: it is never tainted out of service, however long it stays NotReady.
/// Once the renewals stop, the taint comes, and never sooner than `--out-of-service-after`
/// after the last one.
async fn a_node_still_renewing_its_lease_is_not_taken_out_of_service(cluster: Cluster) {
    let admin = cluster.admin().await;
    let node = unique("alive");
    add_bare_node(&cluster, &node, &[]).await;
    let (beating, last_renewal) = heartbeat(&cluster, &node).await;
    announce_power_off(&cluster, &node, "boot-1").await;
    // Ready=False from the node's own identity: a kubelet that reports a CNI or runtime fault.
    let as_node = common::client(&cluster.node_kubeconfig(&node)).await;
    kubelet_says(&as_node, &node, "False", "boot-1", None).await;
    let after = Duration::from_secs(4);
    let _controller = controller(
        &cluster,
        &["--out-of-service", "--out-of-service-after", "4s"],
    );
    let nodes: Api<Node> = Api::all(admin.clone());
    let t0 = std::time::Instant::now();
    while t0.elapsed() < after * 3 {
        let n = nodes.get(&node).await.expect("node");
        assert!(
            !out_of_service(&n),
            "tainted out of service {:?} after the controller started, while its Lease was still renewed",
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    beating.abort();
    let _ = beating.await;
    let stopped = *last_renewal.lock().expect("lock");
    wait_node(
        &admin,
        &node,
        "the out-of-service taint once the heartbeat stopped",
        LIMIT,
        out_of_service,
    )
    .await;
    let took = stopped.elapsed();
    eprintln!(
        "last renewal -> out-of-service taint {took:?} (after {after:?}, plus up to the controller's 5 s recheck)"
    );
    assert!(
        took >= after,
        "tainted {took:?} after the last renewal, before --out-of-service-after ({after:?})"
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(admin.clone(), "kube-node-lease");
    let _ = leases.delete(&node, &Default::default()).await;
    cluster.remove_node(&node).await;
}

both_backends! {
    agent_reports_and_the_controller_untaints => super::agent_reports_controller_untaints;
    continuous_mode_puts_the_taint_back => super::gate_failure_taints_again;
    a_controller_that_was_down_catches_up => super::controller_down_then_catches_up;
    two_replicas_write_each_change_once => super::two_replicas_write_each_change_once;
    a_crashed_replica_delays_nothing => super::a_crashed_replica_delays_nothing;
    a_node_with_the_legacy_taint_key_is_untainted => super::a_node_with_the_legacy_taint_key_is_untainted;
    an_agent_restart_does_not_flap_the_taint => super::agent_restart_does_not_flap_the_taint;
}

real_only! {
    noderestriction_refuses_the_node_identity_its_taints => super::noderestriction_refuses_a_nodes_taint_change;
    a_rotated_client_certificate_is_read_without_a_restart => super::rotated_client_certificate_is_read;
    a_powered_off_node_is_taken_out_of_service => super::a_powered_off_node_is_taken_out_of_service;
    a_node_still_renewing_its_lease_is_not_taken_out_of_service => super::a_node_still_renewing_its_lease_is_not_taken_out_of_service;
}
