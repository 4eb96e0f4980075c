//! The drain engine against kube-emulator: real HTTP, real watches, real Eviction + PDB answers.

use std::sync::Arc;
use std::time::Duration;

use kube_emulator::{
    Emulator, EmulatorHandle, EmulatorOptions, EvictionOutcome, FaultRule, PodSeed,
};
use logind_harness::{LogindHarness, Options};
use nodeward::config::{OnDeadline, Settings, Wave};
use nodeward::drain::plan::RefuseReason;
use nodeward::drain::step::Refusal;
use nodeward::drain::{self, DrainOptions, DrainOutcome, Gone};
use serde_json::json;

const NODE: &str = "worker-1";

async fn emulator() -> Arc<EmulatorHandle> {
    let emu = Emulator::start(EmulatorOptions {
        // A 30 s grace period takes 30 ms.
        grace_scale: 0.001,
        ..EmulatorOptions::default()
    })
    .await
    .expect("emulator starts");
    emu.seed_node(NODE).expect("node");
    emu.seed_node("worker-2").expect("node");
    Arc::new(emu)
}

/// A live DaemonSet `kube-system/flannel` and its pod `flannel-x` on the node.
fn seed_flannel(emu: &EmulatorHandle) {
    emu.seed_daemonset("kube-system", "flannel")
        .expect("daemonset");
    emu.seed_pod(
        PodSeed::new("kube-system", "flannel-x")
            .node(NODE)
            .owner("DaemonSet", "flannel")
            .ready(true),
    )
    .expect("daemonset pod");
}

/// The emulator with `n` pods `web-0`… on the node.
async fn emulator_with_web(n: usize) -> Arc<EmulatorHandle> {
    let emu = emulator().await;
    for i in 0..n {
        emu.seed_pod(web(&format!("web-{i}"))).expect("pod");
    }
    emu
}

async fn client(emu: &EmulatorHandle) -> kube::Client {
    nodeward::kube_client::client(Some(emu.kubeconfig_path()))
        .await
        .expect("client")
}

fn options(timeout: Duration) -> DrainOptions {
    let mut o = DrainOptions::from_settings(&Settings::default().drain, "test");
    o.timeout = timeout;
    o
}

fn web(name: &str) -> PodSeed {
    PodSeed::new("default", name)
        .node(NODE)
        .label("app", "web")
        .owner("ReplicaSet", "web")
        .ready(true)
}

fn pdb(emu: &EmulatorHandle, name: &str, app: &str, spec: serde_json::Value) {
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": app}});
    emu.create(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default"}, "spec": spec
    }))
    .expect("pdb");
}

/// Opens the `web` budget: a replacement runs Ready on worker-2.
fn open_web_budget(emu: &EmulatorHandle) {
    emu.seed_pod(
        PodSeed::new("default", "web-new")
            .node("worker-2")
            .label("app", "web")
            .owner("ReplicaSet", "web")
            .ready(true),
    )
    .expect("replacement pod");
}

fn pods_on(emu: &EmulatorHandle, node: &str) -> Vec<String> {
    let mut names: Vec<String> = emu
        .list("pods", None)
        .into_iter()
        .filter(|p| p.pointer("/spec/nodeName").and_then(|v| v.as_str()) == Some(node))
        .filter_map(|p| {
            p.pointer("/metadata/name")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// Reasons of the events.k8s.io/v1 Events about nodes (kube's recorder puts them in `default`).
fn event_reasons(emu: &EmulatorHandle) -> Vec<String> {
    emu.list("events.events.k8s.io", Some("default"))
        .iter()
        .filter(|e| e.pointer("/regarding/kind").and_then(|k| k.as_str()) == Some("Node"))
        .filter_map(|e| e.get("reason").and_then(|r| r.as_str()).map(str::to_string))
        .collect()
}

#[tokio::test]
async fn skips_daemonset_mirror_and_finished_pods() {
    let emu = emulator().await;
    emu.seed_pod(web("web-1")).expect("pod");
    seed_flannel(&emu);
    emu.seed_pod(
        PodSeed::new("kube-system", "etcd-worker-1")
            .node(NODE)
            .mirror()
            .ready(true),
    )
    .expect("mirror");
    emu.seed_pod(
        PodSeed::new("default", "job-done")
            .node(NODE)
            .owner("Job", "j")
            .phase("Succeeded"),
    )
    .expect("done");
    let report = drain::drain(&client(&emu).await, NODE, &options(Duration::from_secs(10)))
        .await
        .expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    assert_eq!(report.evicted.len(), 1);
    assert_eq!(report.skipped.len(), 3, "{report}");
    assert_eq!(
        pods_on(&emu, NODE),
        ["etcd-worker-1", "flannel-x", "job-done"]
    );
    let node = emu.get("nodes", None, NODE).expect("node");
    assert_eq!(node.pointer("/spec/unschedulable"), Some(&json!(true)));
    assert!(
        node.pointer("/metadata/annotations/nodeward.io~1cordoned-by")
            .is_some()
    );
    let reasons = event_reasons(&emu);
    for r in ["Cordoned", "DrainStarted", "DrainSucceeded"] {
        assert!(
            reasons.iter().any(|x| x == r),
            "event {r} missing from {reasons:?}"
        );
    }
}

#[tokio::test]
async fn refuses_unmanaged_and_emptydir_pods_unless_allowed() {
    let emu = emulator().await;
    emu.seed_pod(PodSeed::new("default", "bare").node(NODE).ready(true))
        .expect("bare");
    emu.seed_pod(web("scratch").empty_dir()).expect("emptydir");
    emu.seed_pod(web("pinned").annotation("nodeward.io/drain", "never"))
        .expect("pinned");
    let c = client(&emu).await;
    let report = drain::drain(&c, NODE, &options(Duration::from_secs(10)))
        .await
        .expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Refused, "{report}");
    let mut refused: Vec<&str> = report
        .refused
        .iter()
        .map(|(p, _)| p.name.as_str())
        .collect();
    refused.sort();
    assert_eq!(refused, ["bare", "pinned", "scratch"]);
    assert!(
        report
            .refused
            .iter()
            .any(|(_, why)| *why == Refusal::Plan(RefuseReason::Unmanaged))
    );

    let mut o = options(Duration::from_secs(10));
    o.plan.force = true;
    o.plan.delete_emptydir_data = true;
    let report = drain::drain(&c, NODE, &o).await.expect("drain");
    assert_eq!(
        report.outcome,
        DrainOutcome::Refused,
        "the annotation still wins: {report}"
    );
    assert_eq!(pods_on(&emu, NODE), ["pinned"]);
}

/// An operator's drain keeps kubectl's default for emptyDir pods (refused unless asked); a drain
/// for a leaving node deletes their data by default (the shutdown stops them either way).
#[tokio::test]
async fn emptydir_pods_are_refused_by_default_except_when_the_node_leaves() {
    let emu = emulator().await;
    emu.seed_pod(web("scratch").empty_dir()).expect("emptydir");
    let c = client(&emu).await;
    let mut o = DrainOptions::from_settings(&Settings::default().drain, "operator");
    o.timeout = Duration::from_secs(10);
    let report = drain::drain(&c, NODE, &o).await.expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Refused, "{report}");
    assert_eq!(pods_on(&emu, NODE), ["scratch"]);

    let mut o = DrainOptions::for_leaving_node(&Settings::default().drain, "shutdown", true);
    o.timeout = Duration::from_secs(10);
    let report = drain::drain(&c, NODE, &o).await.expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    assert!(pods_on(&emu, NODE).is_empty());
}

/// A pod whose DaemonSet is gone has nothing to recreate it: refused without force (the drain
/// does not say "drained" with it still there), evicted with it, as kubectl drain does.
#[tokio::test]
async fn pods_of_a_missing_daemonset_are_refused_unless_forced() {
    let emu = emulator().await;
    seed_flannel(&emu);
    emu.seed_pod(
        PodSeed::new("kube-system", "orphan-x")
            .node(NODE)
            .owner("DaemonSet", "deleted")
            .ready(true),
    )
    .expect("orphan");
    let c = client(&emu).await;
    let report = drain::drain(&c, NODE, &options(Duration::from_secs(10)))
        .await
        .expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Refused, "{report}");
    assert_eq!(
        report.refused,
        [(
            report.refused[0].0.clone(),
            Refusal::Plan(RefuseReason::OrphanedDaemonSet)
        )]
    );
    assert_eq!(report.refused[0].0.name, "orphan-x");

    let mut o = options(Duration::from_secs(10));
    o.plan.force = true;
    let report = drain::drain(&c, NODE, &o).await.expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    assert_eq!(pods_on(&emu, NODE), ["flannel-x"]);
}

/// maxUnavailable 1 over 5 replicas: at no moment do fewer than 4 stay healthy, and the drain
/// finishes as replacements come up elsewhere.
#[tokio::test]
async fn pdb_is_never_violated_and_drain_finishes_as_replicas_move() {
    let emu = emulator().await;
    for i in 0..5 {
        emu.seed_pod(web(&format!("web-{i}")).grace(30))
            .expect("pod");
    }
    pdb(&emu, "web", "web", json!({"maxUnavailable": 1}));
    let controller = kube_emulator::standin::replace_terminating(&emu, "default", NODE, "worker-2");
    let report = drain::drain(&client(&emu).await, NODE, &options(Duration::from_secs(20)))
        .await
        .expect("drain");
    controller.abort();
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    assert_eq!(report.evicted.len(), 5);
    assert!(pods_on(&emu, NODE).is_empty());
    let history = emu.pdb_history("default", "web");
    assert!(!history.is_empty());
    for s in &history {
        assert!(
            s.current_healthy >= s.desired_healthy
                || s.disruptions_allowed == 0 && s.current_healthy + 1 >= s.desired_healthy,
            "budget violated: {s:?}"
        );
        assert!(s.current_healthy >= 4, "fewer than 4 healthy at {s:?}");
    }
    let blocked = emu
        .evictions()
        .iter()
        .filter(|e| matches!(e.outcome, EvictionOutcome::Blocked { .. }))
        .count();
    assert!(
        blocked > 0,
        "the budget never pushed back: the test proves nothing"
    );
}

#[tokio::test]
async fn waves_go_in_priority_order() {
    let emu = emulator().await;
    for (name, prio) in [
        ("crit-a", 2_000_001_000),
        ("low-a", 0),
        ("mid-a", 1000),
        ("low-b", -5),
        ("crit-b", 2_000_000_000),
    ] {
        let mut seed = web(name).to_json();
        seed["spec"]["priority"] = json!(prio);
        seed["metadata"]["labels"] = json!({"app": name});
        emu.create(seed).expect("pod");
        emu.set_pod_ready("default", name, true).expect("ready");
    }
    let mut o = options(Duration::from_secs(10));
    o.plan.waves = vec![
        Wave {
            min_priority: i32::MIN,
            share_of_deadline: 0.4,
        },
        Wave {
            min_priority: 1000,
            share_of_deadline: 0.3,
        },
        Wave {
            min_priority: 2_000_000_000,
            share_of_deadline: 0.3,
        },
    ];
    let report = drain::drain(&client(&emu).await, NODE, &o)
        .await
        .expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    let order: Vec<String> = emu.evictions().iter().map(|e| e.pod.clone()).collect();
    let pos = |n: &str| {
        order
            .iter()
            .position(|x| x == n)
            .unwrap_or_else(|| panic!("{n} not evicted: {order:?}"))
    };
    assert!(pos("low-a").max(pos("low-b")) < pos("mid-a"), "{order:?}");
    assert!(pos("mid-a") < pos("crit-a").min(pos("crit-b")), "{order:?}");
}

/// What a real kubelet does with an evicted pod: it stops the containers and reports a terminal
/// phase at once, but removes the object only after unmounting the volumes, removing the cgroup
/// and its next status sync (20–26 s later on the real node under TCG). Here a finalizer holds
/// each pod for as long as the test likes, and `Failed` is written as the kubelet writes it.
fn kubelet_stopped(emu: &EmulatorHandle, name: &str) {
    emu.modify("pods", Some("default"), name, |p| {
        p["status"]["phase"] = json!("Failed");
    })
    .expect("pod's terminal phase");
}

fn release(emu: &EmulatorHandle, name: &str) {
    emu.modify("pods", Some("default"), name, |p| {
        p["metadata"]["finalizers"] = json!(null);
    })
    .expect("finalizer removed");
}

type DrainTask = tokio::task::JoinHandle<drain::exec::Result<drain::DrainReport>>;

/// Drains NODE in a task, once every pod in `names` is being deleted (evicted by it).
async fn drain_until_evicted(emu: &EmulatorHandle, o: DrainOptions, names: &[&str]) -> DrainTask {
    let c = client(emu).await;
    let run = tokio::spawn(async move { drain::drain(&c, NODE, &o).await });
    let terminating = |n: &&str| {
        emu.get("pods", Some("default"), n)
            .is_some_and(|p| p.pointer("/metadata/deletionTimestamp").is_some())
    };
    let evicted_by = tokio::time::Instant::now() + Duration::from_secs(10);
    while !names.iter().all(terminating) {
        assert!(
            tokio::time::Instant::now() < evicted_by,
            "pods never evicted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    run
}

/// Asserts the drain is still running half a second later.
async fn still_draining(run: &mut DrainTask, why: &str) {
    let early = tokio::time::timeout(Duration::from_millis(500), run).await;
    assert!(early.is_err(), "{why}: {early:?}");
}

/// The drain's report, which must come within `limit`; `why` says what it would have waited for.
async fn drained_within(run: DrainTask, limit: Duration, why: &str) -> drain::DrainReport {
    let report = tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| panic!("{why}"))
        .expect("drain task")
        .expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    report
}

/// A pod whose containers its kubelet stopped has left the node: the drain (and with it logind's
/// lock at shutdown) does not wait for the kubelet's bookkeeping after that. It does wait, as
/// kubectl drain does, for a StatefulSet's pod (its replacement needs the name) and for a pod
/// with a volume claim (its volume is unmounted before it can be detached and used elsewhere).
#[tokio::test]
async fn a_pod_its_kubelet_stopped_has_left_even_before_its_object_goes() {
    const HOLD: &str = "nodeward.io/test-hold";
    let emu = emulator().await;
    emu.seed_pod(web("web-0").finalizer(HOLD)).expect("pod");
    emu.seed_pod(
        PodSeed::new("default", "db-0")
            .node(NODE)
            .owner("StatefulSet", "db")
            .finalizer(HOLD),
    )
    .expect("pod");
    emu.seed_pod(web("data-0").finalizer(HOLD)).expect("pod");
    emu.modify("pods", Some("default"), "data-0", |p| {
        p["spec"]["volumes"] =
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data-0"}}]);
    })
    .expect("claim");
    let names = ["web-0", "db-0", "data-0"];
    let mut o = options(Duration::from_secs(20));
    o.gone = Gone::Stopped(None);
    let mut run = drain_until_evicted(&emu, o, &names).await;
    for n in names {
        kubelet_stopped(&emu, n);
    }
    still_draining(
        &mut run,
        "the drain ended while a StatefulSet's pod and a claim's pod were still there",
    )
    .await;
    release(&emu, "db-0");
    release(&emu, "data-0");
    let report = drained_within(
        run,
        Duration::from_secs(5),
        "the drain waited for web-0's object, which only its kubelet's bookkeeping holds",
    )
    .await;
    assert_eq!(report.evicted.len(), 3, "{report}");
    assert_eq!(
        pods_on(&emu, NODE),
        ["web-0"],
        "web-0 held by its finalizer"
    );
    // The report says which objects outlive the drain, and why.
    let stopped: Vec<String> = report.stopped.iter().map(|p| p.name.clone()).collect();
    assert_eq!(stopped, ["web-0"], "{report}");
    assert!(
        report
            .to_string()
            .contains("stopped, its object still there: default/web-0"),
        "{report}"
    );
    let notes: Vec<String> = emu
        .list("events.events.k8s.io", Some("default"))
        .iter()
        .filter(|e| e.get("reason").and_then(|r| r.as_str()) == Some("DrainSucceeded"))
        .filter_map(|e| e.get("note").and_then(|n| n.as_str()).map(str::to_string))
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("1 stopped, their objects Terminating until the kubelet is back")),
        "{notes:?}"
    );
    release(&emu, "web-0");
}

/// An operator's drain of a node whose kubelet keeps running waits for the objects, as kubectl
/// drain does: the kubelet removes them seconds after the terminal phase, and whoever runs
/// `kubectl get pods` after the drain returned expects the node empty. (`systemctl stop
/// nodeward-drain` outside a shutdown once returned with 8 real pods still Terminating.)
#[tokio::test]
async fn an_operators_drain_waits_for_the_objects_its_kubelet_still_removes() {
    let emu = emulator().await;
    emu.seed_pod(web("web-0").finalizer("nodeward.io/test-hold"))
        .expect("pod");
    let mut run = drain_until_evicted(&emu, options(Duration::from_secs(20)), &["web-0"]).await;
    kubelet_stopped(&emu, "web-0");
    still_draining(
        &mut run,
        "the drain ended while web-0's object, which its running kubelet removes, was there",
    )
    .await;
    release(&emu, "web-0");
    let report = drained_within(run, Duration::from_secs(5), "web-0's object went").await;
    assert_eq!(report.evicted.len(), 1, "{report}");
    assert!(pods_on(&emu, NODE).is_empty(), "{:?}", pods_on(&emu, NODE));
    assert!(report.stopped.is_empty(), "{report}");
}

/// On the node it drains, a drain sees a container stop in the cgroup tree: the kubelet says it
/// only once the runtime has also stopped the sandbox and torn its network down (25–35 s later
/// on the real node under TCG). Here the tree is a copy, as the systemd cgroup driver lays it out.
#[tokio::test]
async fn on_its_node_a_drain_sees_containers_stop_in_the_cgroup_tree() {
    const APP: &str = "9ad8318eb47c5ee006d884452b3ee2f7231cb32cc26a22164c633c1f808eb0d6";
    let emu = emulator().await;
    emu.seed_pod(web("web-0").finalizer("nodeward.io/test-hold"))
        .expect("pod");
    let pod = emu
        .modify("pods", Some("default"), "web-0", |p| {
            p["status"]["qosClass"] = json!("BestEffort");
            p["status"]["containerStatuses"] = json!([{"name": "app", "image": "i", "imageID": "",
                "ready": true, "restartCount": 0, "containerID": format!("containerd://{APP}")}]);
        })
        .expect("status");
    let uid = pod["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .replace('-', "_");
    let root = tempfile::tempdir().expect("tempdir");
    let scope = root
        .path()
        .join("kubepods.slice/kubepods-besteffort.slice")
        .join(format!("kubepods-besteffort-pod{uid}.slice"))
        .join(format!("cri-containerd-{APP}.scope"));
    std::fs::create_dir_all(&scope).expect("scope");
    std::fs::write(scope.join("cgroup.events"), "populated 1\nfrozen 0\n").expect("events");
    let mut o = options(Duration::from_secs(20));
    o.gone = Gone::Stopped(Some(drain::cgroups::Cgroups::at(root.path())));
    let mut run = drain_until_evicted(&emu, o, &["web-0"]).await;
    still_draining(&mut run, "ended while the container ran").await;
    // systemd removes a container's scope when its last process exits.
    std::fs::remove_dir_all(&scope).expect("scope gone");
    // Looked for every 200 ms; 2 s leaves room for a loaded machine, and none for waiting on
    // the next watch event, which may never come.
    let report = drained_within(
        run,
        Duration::from_secs(2),
        "the drain did not see the container stop",
    )
    .await;
    assert_eq!(report.evicted.len(), 1, "{report}");
    let left = emu
        .get("pods", Some("default"), "web-0")
        .expect("still there");
    assert_eq!(
        left.pointer("/status/phase"),
        Some(&json!("Running")),
        "the kubelet had not said a thing"
    );
    release(&emu, "web-0");
}

#[tokio::test]
async fn deadline_abandon_reports_what_is_left() {
    let emu = emulator().await;
    emu.seed_pod(web("web-0")).expect("pod");
    pdb(&emu, "web", "web", json!({"minAvailable": "100%"}));
    let mut o = options(Duration::from_millis(800));
    o.on_deadline = OnDeadline::Abandon;
    let report = drain::drain(&client(&emu).await, NODE, &o)
        .await
        .expect("drain");
    assert_eq!(report.outcome, DrainOutcome::DeadlineExceeded);
    assert_eq!(report.left_behind.len(), 1);
    assert!(
        report.elapsed < Duration::from_secs(3),
        "abandon must not hang: {:?}",
        report.elapsed
    );
    assert_eq!(pods_on(&emu, NODE), ["web-0"]);
    assert!(
        event_reasons(&emu).iter().any(|r| r == "DrainTimedOut"),
        "DrainTimedOut event missing"
    );
}

/// A drain told to stop (its shutdown cancelled) ends at once as cancelled, through its ending:
/// an Event and the Node's `nodeward.io/Draining` turned False saying it was cancelled.
#[tokio::test]
async fn a_stopped_drain_ends_cancelled_and_says_so() {
    let emu = emulator().await;
    emu.seed_pod(web("web-0")).expect("pod");
    pdb(&emu, "web", "web", json!({"minAvailable": "100%"}));
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut o = options(Duration::from_secs(60));
    o.stop = Some(stopping);
    let c = client(&emu).await;
    let run = tokio::spawn(async move { drain::drain(&c, NODE, &o).await });
    let blocked_by = tokio::time::Instant::now() + Duration::from_secs(10);
    while !emu
        .evictions()
        .iter()
        .any(|e| matches!(e.outcome, EvictionOutcome::Blocked { .. }))
    {
        assert!(tokio::time::Instant::now() < blocked_by, "never blocked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.send_replace(true);
    let report = tokio::time::timeout(Duration::from_secs(3), run)
        .await
        .expect("stops at once")
        .expect("drain task")
        .expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Cancelled, "{report}");
    assert_eq!(pods_on(&emu, NODE), ["web-0"]);
    assert!(
        event_reasons(&emu).iter().any(|r| r == "DrainCancelled"),
        "DrainCancelled event missing"
    );
    let node = emu.get("nodes", None, NODE).expect("node");
    let draining = node
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type") == Some(&json!("nodeward.io/Draining")))
        })
        .cloned();
    assert_eq!(
        draining.as_ref().map(|c| (&c["status"], &c["reason"])),
        Some((&json!("False"), &json!("DrainCancelled"))),
        "{draining:?}"
    );
}

#[tokio::test]
async fn deadline_delete_removes_pods_past_their_budget() {
    let emu = emulator().await;
    emu.seed_pod(web("web-0")).expect("pod");
    pdb(&emu, "web", "web", json!({"minAvailable": "100%"}));
    let mut o = options(Duration::from_secs(2));
    o.on_deadline = OnDeadline::Delete;
    let report = drain::drain(&client(&emu).await, NODE, &o)
        .await
        .expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    assert_eq!(report.force_deleted.len(), 1);
    assert!(report.evicted.is_empty(), "deleted, not evicted: {report}");
    assert!(pods_on(&emu, NODE).is_empty());
    let ended = emu
        .list("events.events.k8s.io", Some("default"))
        .into_iter()
        .find(|e| e.get("reason").and_then(|r| r.as_str()) == Some("DrainSucceeded"))
        .expect("DrainSucceeded event");
    assert_eq!(ended["type"], "Warning", "{ended}");
    let note = ended["note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("0 pods evicted, 1 deleted past their budgets in "),
        "{note}"
    );
}

/// A deadline inside the fallback's 1 s margin (the agent's retry after an API outage, a short
/// InhibitDelayMaxSec): the pod is still tried with an eviction first, and the fallback's
/// deletion leaves it at least a second of grace, never the 0 s of a forced removal.
#[tokio::test]
async fn deadline_delete_under_a_second_evicts_first_and_never_forces() {
    // Real-time grace periods, so the deletion's grace can be read on the terminating pod.
    let emu = Emulator::start(EmulatorOptions {
        grace_scale: 1.0,
        ..EmulatorOptions::default()
    })
    .await
    .expect("emulator starts");
    emu.seed_node(NODE).expect("node");
    emu.seed_pod(web("web-0")).expect("pod");
    pdb(&emu, "web", "web", json!({"minAvailable": "100%"}));
    let mut o = options(Duration::from_millis(500));
    o.on_deadline = OnDeadline::Delete;
    let report = drain::drain(&client(&emu).await, NODE, &o)
        .await
        .expect("drain");
    assert!(
        emu.evictions().iter().any(|e| e.pod == "web-0"),
        "deleted without an eviction tried: {report}"
    );
    assert_eq!(report.force_deleted.len(), 1, "{report}");
    let pod = emu
        .get("pods", Some("default"), "web-0")
        .expect("the pod is terminating, not removed at once");
    assert_eq!(
        pod.pointer("/metadata/deletionGracePeriodSeconds"),
        Some(&json!(1)),
        "{pod}"
    );
}

#[tokio::test]
async fn deadline_wait_keeps_going_until_the_budget_opens() {
    let emu = emulator().await;
    emu.seed_pod(web("web-0")).expect("pod");
    pdb(&emu, "web", "web", json!({"minAvailable": 1}));
    let mut o = options(Duration::from_millis(300));
    o.on_deadline = OnDeadline::Wait;
    let emu2 = emu.clone();
    let past_deadline = tokio::time::Instant::now() + o.timeout * 2;
    let opener = tokio::spawn(async move {
        // Open the budget only once the drain has been refused and its deadline has passed.
        while !emu2
            .evictions()
            .iter()
            .any(|e| matches!(e.outcome, EvictionOutcome::Blocked { .. }))
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep_until(past_deadline).await;
        open_web_budget(&emu2);
    });
    let report = drain::drain(&client(&emu).await, NODE, &o)
        .await
        .expect("drain");
    opener.await.expect("opener");
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    assert!(
        report.elapsed > o.timeout,
        "went on past its deadline: {report}"
    );
}

#[tokio::test]
async fn survives_api_errors_and_a_dropped_watch() {
    let emu = emulator().await;
    for i in 0..20 {
        emu.seed_pod(web(&format!("web-{i}")).grace(30))
            .expect("pod");
    }
    emu.add_fault(FaultRule::count("create", "pods/eviction", 500, 5));
    emu.add_fault(FaultRule::count("create", "pods/eviction", 503, 3));
    let emu2 = emu.clone();
    let dropper = tokio::spawn(async move {
        // Drop the watches in the middle of the drain: once the first evictions are in.
        while emu2.evictions().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        emu2.close_watches();
    });
    let report = drain::drain(&client(&emu).await, NODE, &options(Duration::from_secs(20)))
        .await
        .expect("drain");
    dropper.await.expect("dropper");
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    assert_eq!(report.evicted.len(), 20);
    assert!(
        report.eviction_requests >= 28,
        "faults were not hit: {}",
        report.eviction_requests
    );
    assert!(pods_on(&emu, NODE).is_empty());
}

#[tokio::test]
async fn forbidden_names_the_permission() {
    let emu = emulator().await;
    emu.seed_pod(web("web-0")).expect("pod");
    emu.add_fault(FaultRule::count("create", "pods/eviction", 403, 1));
    let err = drain::drain(&client(&emu).await, NODE, &options(Duration::from_secs(5)))
        .await
        .expect_err("forbidden");
    assert!(err.to_string().contains("create pods/eviction"), "{err}");
}

/// Issue 41: a ValidatingAdmissionPolicy refused one pod's eviction (403, reason Forbidden) and
/// the drain ended with an error, the pods of later waves never evicted. A 403 that is not the
/// authorizer's concerns one pod: it is refused, named with its cause, and the others go.
#[tokio::test]
async fn an_admission_denial_refuses_one_pod_and_the_others_go() {
    let emu = emulator().await;
    for (name, prio) in [("db-0", 0), ("web-0", 0), ("crit-0", 2_000_000_000)] {
        let mut seed = web(name).to_json();
        seed["spec"]["priority"] = json!(prio);
        emu.create(seed).expect("pod");
        emu.set_pod_ready("default", name, true).expect("ready");
    }
    let denial = "ValidatingAdmissionPolicy 'keep-db' with binding 'keep-db' denied request: \
                  the primary database is never evicted";
    emu.add_fault(FaultRule::one(
        "create",
        "pods/eviction",
        "db-0",
        403,
        Some(denial),
    ));
    let mut o = options(Duration::from_secs(10));
    o.plan.waves = vec![
        Wave {
            min_priority: i32::MIN,
            share_of_deadline: 0.7,
        },
        Wave {
            min_priority: 2_000_000_000,
            share_of_deadline: 0.3,
        },
    ];
    let report = drain::drain(&client(&emu).await, NODE, &o)
        .await
        .expect("one pod's denial does not stop the drain");
    assert_eq!(report.outcome, DrainOutcome::Refused, "{report}");
    assert_eq!(pods_on(&emu, NODE), ["db-0"], "{report}");
    let [(pod, why)] = report.refused.as_slice() else {
        panic!("one pod refused: {report}");
    };
    assert_eq!(pod.name, "db-0");
    assert!(
        matches!(why, Refusal::Denied { message } if message.contains(denial)),
        "{why}"
    );
    assert!(report.to_string().contains("keep-db"), "{report}");
}

#[tokio::test]
async fn multiple_budgets_are_refused_not_retried() {
    let emu = emulator().await;
    emu.seed_pod(web("web-0")).expect("pod");
    pdb(&emu, "a", "web", json!({"maxUnavailable": 1}));
    pdb(&emu, "b", "web", json!({"maxUnavailable": 1}));
    let report = drain::drain(&client(&emu).await, NODE, &options(Duration::from_secs(5)))
        .await
        .expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Refused, "{report}");
    assert!(
        matches!(&report.refused[0].1, Refusal::MultipleBudgets(b) if b.len() == 2),
        "{report}"
    );
}

#[tokio::test]
async fn admin_cordon_is_never_undone() {
    let emu = emulator().await;
    let c = client(&emu).await;
    emu.modify("nodes", None, NODE, |n| {
        n["spec"]["unschedulable"] = json!(true)
    })
    .expect("admin cordon");
    let report = drain::drain(&c, NODE, &options(Duration::from_secs(5)))
        .await
        .expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Drained);
    let node = emu.get("nodes", None, NODE).expect("node");
    assert!(
        node.pointer("/metadata/annotations/nodeward.io~1cordoned-by")
            .is_none(),
        "claimed an admin's cordon"
    );
    let err = drain::uncordon(&c, NODE, false, nodeward::drain::Lifter::Operator)
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("not by nodeward"), "{err}");
    assert_eq!(
        emu.get("nodes", None, NODE)
            .and_then(|n| n.pointer("/spec/unschedulable").cloned()),
        Some(json!(true))
    );
    assert_eq!(
        drain::uncordon(&c, NODE, true, nodeward::drain::Lifter::Operator)
            .await
            .expect("forced"),
        drain::UncordonOutcome::Uncordoned
    );
}

#[tokio::test]
async fn own_cordon_is_undone_with_its_label() {
    let emu = emulator().await;
    let c = client(&emu).await;
    assert_eq!(
        drain::cordon(&c, NODE, "test", true).await.expect("cordon"),
        drain::CordonOutcome::Cordoned
    );
    assert_eq!(
        drain::cordon(&c, NODE, "test", true).await.expect("again"),
        drain::CordonOutcome::AlreadyOurs
    );
    let node = emu.get("nodes", None, NODE).expect("node");
    assert_eq!(
        node.pointer("/metadata/labels/node.kubernetes.io~1exclude-from-external-load-balancers"),
        Some(&json!("true"))
    );
    assert_eq!(
        drain::uncordon(&c, NODE, false, nodeward::drain::Lifter::Operator)
            .await
            .expect("uncordon"),
        drain::UncordonOutcome::Uncordoned
    );
    let node = emu.get("nodes", None, NODE).expect("node");
    assert_ne!(node.pointer("/spec/unschedulable"), Some(&json!(true)));
    assert!(
        node.pointer("/metadata/labels/node.kubernetes.io~1exclude-from-external-load-balancers")
            .is_none()
    );
    assert!(
        node.pointer("/metadata/annotations/nodeward.io~1cordoned-by")
            .is_none()
    );
}

#[tokio::test]
async fn rerun_after_an_interrupted_drain_finishes_the_job() {
    let emu = emulator_with_web(3).await;
    pdb(&emu, "web", "web", json!({"minAvailable": 3}));
    let c = client(&emu).await;
    let interrupted = tokio::time::timeout(
        Duration::from_millis(300),
        drain::drain(&c, NODE, &options(Duration::from_secs(30))),
    )
    .await;
    assert!(
        interrupted.is_err(),
        "the blocked drain should still be running"
    );
    emu.delete("poddisruptionbudgets", Some("default"), "web")
        .expect("open the budget");
    let report = drain::drain(&c, NODE, &options(Duration::from_secs(10)))
        .await
        .expect("rerun");
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    let again = drain::drain(&c, NODE, &options(Duration::from_secs(10)))
        .await
        .expect("third run");
    assert_eq!(again.outcome, DrainOutcome::Drained);
    assert_eq!(again.eviction_requests, 0);
    assert!(
        again.elapsed < Duration::from_millis(500),
        "{:?}",
        again.elapsed
    );
}

#[tokio::test]
async fn a_shutdown_drain_records_its_cordon_as_a_shutdown_cordon() {
    let emu = emulator().await;
    let c = client(&emu).await;
    let record = |node: &str| -> serde_json::Value {
        let n = emu.get("nodes", None, node).expect("node");
        let raw = n
            .pointer("/metadata/annotations/nodeward.io~1cordoned-by")
            .and_then(|v| v.as_str())
            .expect("record");
        serde_json::from_str(raw).expect("json record")
    };
    drain::drain(&c, NODE, &options(Duration::from_secs(5)))
        .await
        .expect("operator drain");
    assert_eq!(
        record(NODE)["shutdown"],
        json!(false),
        "an operator's drain"
    );
    let mut o = options(Duration::from_secs(5));
    o.shutdown = true;
    drain::drain(&c, "worker-2", &o)
        .await
        .expect("shutdown drain");
    assert_eq!(record("worker-2")["shutdown"], json!(true));
}

/// A drain that never saw the node's pods is not "drained": with the pod list failing until the
/// deadline, the drain fails and says so (it used to report "drained: 0 evicted", exit 0).
#[tokio::test]
async fn pods_never_listed_is_a_failure_not_drained() {
    let emu = emulator().await;
    emu.seed_pod(web("web-1")).expect("pod");
    emu.add_fault(FaultRule::count("list", "pods", 500, 1_000_000));
    let err = drain::drain(&client(&emu).await, NODE, &options(Duration::from_secs(2)))
        .await
        .expect_err("not drained");
    assert!(err.to_string().contains("could not list the pods"), "{err}");
    assert_eq!(pods_on(&emu, NODE), ["web-1"]);
}

/// A failing budget list does not hold back evictions (the Eviction API enforces budgets).
#[tokio::test]
async fn a_failing_budget_list_does_not_block_evictions() {
    let emu = emulator().await;
    emu.seed_pod(web("web-1")).expect("pod");
    emu.add_fault(FaultRule::count(
        "list",
        "poddisruptionbudgets",
        500,
        1_000_000,
    ));
    let report = drain::drain(&client(&emu).await, NODE, &options(Duration::from_secs(5)))
        .await
        .expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    assert_eq!(report.evicted.len(), 1, "{report}");
}

/// A drain with nothing to evict (the agent drained first; the drain unit's ExecStop runs at the
/// same shutdown) publishes no empty DrainStarted/DrainSucceeded pair.
#[tokio::test]
async fn nothing_to_evict_publishes_no_empty_events() {
    let emu = emulator().await;
    seed_flannel(&emu);
    let report = drain::drain(&client(&emu).await, NODE, &options(Duration::from_secs(5)))
        .await
        .expect("drain");
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    let reasons = event_reasons(&emu);
    assert!(
        !reasons
            .iter()
            .any(|r| r == "DrainStarted" || r == "DrainSucceeded"),
        "{reasons:?}"
    );
}

/// The real logind on a private bus with its systemd mock (python-dbusmock), which the drain
/// unit asks whether the machine is shutting down.
async fn systemd_bus() -> LogindHarness {
    LogindHarness::start(Options::default())
        .await
        .unwrap_or_else(|e| {
            panic!("cannot start the logind harness (its systemd mock answers the drain unit): {e}")
        })
}

/// Runs `nodeward drain` as nodeward-drain.service's ExecStop while systemd shuts the machine
/// down: the harness's systemd mock answers `SystemState` with "stopping" and lists `target`
/// being started, as PID 1 does on the system bus during a shutdown.
async fn unit_stop(
    emu: &EmulatorHandle,
    bus: &LogindHarness,
    dir: &std::path::Path,
    target: &str,
    toml: &str,
) -> String {
    bus.systemd_stopping_for(target)
        .await
        .expect("systemd mock: stopping");
    let out = unit_exec_stop(emu, bus, dir, toml)
        .output()
        .await
        .expect("run nodeward drain");
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    text
}

/// `nodeward drain` as the drain unit's ExecStop, with the agent's status file in `dir` and the
/// harness's bus as the system bus (async: the emulator serves from this test's runtime).
fn unit_exec_stop(
    emu: &EmulatorHandle,
    bus: &LogindHarness,
    dir: &std::path::Path,
    toml: &str,
) -> tokio::process::Command {
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstatus_file = \"{}\"\n{toml}",
            dir.join("status.json").display()
        ),
    )
    .expect("config");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodeward"));
    cmd.args(["drain", NODE, "--config"])
        .arg(&config)
        .arg("--kubeconfig")
        .arg(emu.kubeconfig_path())
        .env("DBUS_SYSTEM_BUS_ADDRESS", bus.bus_address())
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Waits up to `within` for a spawned `nodeward drain` to end, which it must do successfully;
/// its exit code and output.
async fn succeeded(stop: tokio::process::Child, within: Duration) -> String {
    let out = tokio::time::timeout(within, stop.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("nodeward drain still running after {within:?}"))
        .expect("nodeward drain");
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    text
}

/// What the unit logs once it has found the agent draining for this shutdown.
const WAITS_FOR_THE_AGENT: &str = "the agent drains for this shutdown; waiting for its outcome";

/// A spawned `nodeward drain` whose log (stderr) goes to a file, to be read while it runs.
struct Logged {
    child: tokio::process::Child,
    log: std::path::PathBuf,
}

impl Logged {
    fn spawn(cmd: &mut tokio::process::Command, log: std::path::PathBuf) -> Self {
        let file = std::fs::File::create(&log).expect("log file");
        let child = cmd.stderr(file).spawn().expect("run nodeward drain");
        Self { child, log }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to 30 s for it to log `line`.
    async fn logged(&self, line: &str) {
        let t0 = std::time::Instant::now();
        while !self.text().contains(line) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{line:?} not logged:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// [`succeeded`], with the log.
    async fn succeeded(self, within: Duration) -> String {
        let log = self.log.clone();
        let out = succeeded(self.child, within).await;
        let text = std::fs::read_to_string(log).unwrap_or_default();
        format!("{out}\nlog:\n{text}")
    }
}

/// The stand-in `agent` drains for this shutdown (its status file in `dir` says so) and dies
/// while `stop` waits for it: the unit must take the drain over and empty the node. Its output.
async fn takes_over_from_a_dying_agent(
    emu: &EmulatorHandle,
    dir: &std::path::Path,
    mut agent: std::process::Child,
    stop: &mut tokio::process::Command,
) -> String {
    write_agent_status(dir, agent.id(), "draining", &[]);
    let stop = Logged::spawn(stop, dir.join("unit.log"));
    stop.logged(WAITS_FOR_THE_AGENT).await;
    agent.kill().expect("kill the stand-in agent");
    agent.wait().expect("reap the stand-in agent");
    let text = stop.succeeded(Duration::from_secs(30)).await;
    assert!(pods_on(emu, NODE).is_empty(), "the unit drained\n{text}");
    text
}

fn output_text(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The agent's status file in `dir`, as the agent with `pid` writes it in `phase`; a drained
/// agent gave up at its deadline with every pod left.
fn write_agent_status(dir: &std::path::Path, pid: u32, phase: &str, pods: &[&str]) {
    let last_drain = (phase == "drained").then(|| {
        json!({"started_at": "2026-11-23T10:00:00Z", "kind": "poweroff", "policy": "drain",
            "deadline_ms": 25000, "outcome": {"deadline_exceeded": null}, "evicted": 0,
            "left_behind": pods.iter().map(|p| format!("default/{p}")).collect::<Vec<_>>(),
            "refused": [], "elapsed_ms": 25000})
    });
    let status = json!({
        "pid": pid, "node": NODE, "phase": phase, "lock": "released", "lock_takes": 1,
        "inhibit_delay_max_ms": 30000, "waiting_for": "", "ready": true, "node_registered": true,
        "gates": [], "not_ready_in_time": false, "startup_taint": false, "cordoned_by": null,
        "warnings": [], "last_drain": last_drain
    });
    // Written whole and renamed into place, as the agent does.
    let tmp = dir.join("status.json.tmp");
    std::fs::write(&tmp, status.to_string()).expect("status");
    std::fs::rename(&tmp, dir.join("status.json")).expect("status rename");
}

fn cordoned(emu: &EmulatorHandle) -> bool {
    emu.get("nodes", None, NODE)
        .is_some_and(|n| n["spec"]["unschedulable"] == json!(true))
}

/// The drain unit applies `[shutdown]` as the agent does: a reboot under `on_reboot = "cordon"`
/// cordons and evicts nothing; `on_poweroff = "nothing"` leaves the node alone.
#[tokio::test]
async fn the_drain_unit_applies_the_shutdown_policy() {
    let emu = emulator_with_web(3).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let bus = systemd_bus().await;
    let policy = "[shutdown]\non_reboot = \"cordon\"\non_poweroff = \"nothing\"\n";
    let out = unit_stop(&emu, &bus, dir.path(), "poweroff.target", policy).await;
    assert!(!cordoned(&emu), "policy nothing\n{out}");
    let out = unit_stop(&emu, &bus, dir.path(), "reboot.target", policy).await;
    assert!(cordoned(&emu), "policy cordon\n{out}");
    assert_eq!(pods_on(&emu, NODE).len(), 3, "nothing evicted\n{out}");
    let out = unit_stop(&emu, &bus, dir.path(), "reboot.target", "").await;
    assert!(pods_on(&emu, NODE).is_empty(), "the default drains\n{out}");
    bus.shutdown().await;
}

/// After the agent's own shutdown drain (here: it gave up at its deadline with pods left), the
/// drain unit does not start a second full drain, cordons nothing and writes no Events.
#[tokio::test]
async fn the_drain_unit_does_nothing_after_the_agents_drain() {
    let emu = emulator_with_web(2).await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_agent_status(dir.path(), 1, "drained", &["web-0", "web-1"]);
    let bus = systemd_bus().await;
    let out = unit_stop(&emu, &bus, dir.path(), "poweroff.target", "").await;
    assert!(out.contains("already handled this shutdown"), "{out}");
    assert_eq!(pods_on(&emu, NODE).len(), 2, "no second drain\n{out}");
    assert!(!cordoned(&emu), "{out}");
    assert!(event_reasons(&emu).is_empty(), "{:?}", event_reasons(&emu));
    bus.shutdown().await;
}

/// The agent stops the drain unit as soon as logind announces a shutdown, while systemd is still
/// "running" (it only starts stopping units once the agent releases its lock). The unit's
/// ExecStop then waits for the agent's outcome instead of draining as an operator's stop would:
/// - the agent says "drained": nothing to do, no second drain, no Events;
/// - the shutdown is cancelled (the agent is back to "ready"): nothing to do either;
/// - the agent dies while draining: the unit applies the `[shutdown]` policy itself.
#[tokio::test]
async fn the_drain_unit_stopped_while_the_agent_drains_waits_for_its_outcome() {
    let emu = emulator_with_web(2).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let bus = systemd_bus().await;
    let agent = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .expect("a process standing in for the agent");

    for (then, says) in [("drained", "already handled"), ("ready", "cancelled")] {
        write_agent_status(dir.path(), agent.id(), "draining", &[]);
        let stop = Logged::spawn(
            &mut unit_exec_stop(&emu, &bus, dir.path(), ""),
            dir.path().join(format!("unit-{then}.log")),
        );
        // It waits, having neither asked systemd nor cordoned (as an operator's stop would).
        stop.logged(WAITS_FOR_THE_AGENT).await;
        assert!(
            !cordoned(&emu),
            "the unit drained while the agent was draining"
        );
        write_agent_status(dir.path(), agent.id(), then, &["web-0", "web-1"]);
        let text = stop.succeeded(Duration::from_secs(15)).await;
        assert!(text.contains(says), "agent {then}: {text}");
        assert_eq!(
            pods_on(&emu, NODE).len(),
            2,
            "agent {then}: no drain\n{text}"
        );
        assert!(!cordoned(&emu), "agent {then}: {text}");
        assert!(event_reasons(&emu).is_empty(), "{:?}", event_reasons(&emu));
    }

    // The agent dies mid-drain: the unit takes over with the policy for this shutdown.
    bus.systemd_stopping_for("poweroff.target")
        .await
        .expect("systemd mock: stopping");
    let text = takes_over_from_a_dying_agent(
        &emu,
        dir.path(),
        agent,
        &mut unit_exec_stop(&emu, &bus, dir.path(), ""),
    )
    .await;
    let reason = emu
        .get("nodes", None, NODE)
        .and_then(|n| {
            n.pointer("/metadata/annotations/nodeward.io~1cordoned-by")
                .cloned()
        })
        .and_then(|a| a.as_str().map(str::to_string))
        .unwrap_or_default();
    assert!(
        reason.contains("shutdown (poweroff; nodeward-drain.service stopped by the system)"),
        "cordoned as a shutdown: {reason}\n{text}"
    );
    bus.shutdown().await;
}

/// As the drain unit's ExecStop, `nodeward drain` asks systemd (its `NOTIFY_SOCKET`) for the time
/// its own bound needs, so a drain.timeout beyond the unit's `TimeoutStopSec=` is not cut off
/// mid-drain: its own deadline + 30 s before it asks anything (a slow start and systemd's
/// answers outlasted a short `TimeoutStopSec=` on a real node), drain.timeout + 30 s while the
/// agent drains, its own deadline + 30 s when it drains; nothing for `on_deadline = "wait"`,
/// which has no end to announce.
#[tokio::test]
async fn the_drain_unit_asks_systemd_for_the_time_its_deadline_needs() {
    let emu = emulator_with_web(1).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let bus = systemd_bus().await;
    let socket_path = dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).expect("notify socket");
    socket.set_nonblocking(true).expect("nonblocking");
    let received = || {
        let mut messages = Vec::new();
        let mut buf = [0u8; 512];
        while let Ok(n) = socket.recv(&mut buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).trim_end().to_string());
        }
        messages
    };
    bus.systemd_stopping_for("poweroff.target")
        .await
        .expect("systemd mock: stopping");
    let agent = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .expect("a process standing in for the agent");

    // The agent drains, then dies: the unit waits, then drains with a shorter --timeout.
    let mut stop = unit_exec_stop(&emu, &bus, dir.path(), "[drain]\ntimeout = \"200s\"\n");
    stop.args(["--timeout", "100s"])
        .env("NOTIFY_SOCKET", &socket_path);
    let text = takes_over_from_a_dying_agent(&emu, dir.path(), agent, &mut stop).await;
    assert_eq!(
        received(),
        [
            // First, before a question to the agent's status or to systemd: its own bound.
            "EXTEND_TIMEOUT_USEC=130000000",
            "EXTEND_TIMEOUT_USEC=230000000",
            "EXTEND_TIMEOUT_USEC=130000000"
        ],
        "{text}"
    );

    // No agent, on_deadline = "wait": the unit drains and asks for nothing.
    std::fs::remove_file(dir.path().join("status.json")).expect("remove the status file");
    let toml = "[drain]\ntimeout = \"200s\"\non_deadline = \"wait\"\n";
    let stop = unit_exec_stop(&emu, &bus, dir.path(), toml)
        .env("NOTIFY_SOCKET", &socket_path)
        .spawn()
        .expect("run nodeward drain");
    let text = succeeded(stop, Duration::from_secs(30)).await;
    assert!(text.contains("applying the [shutdown] policy"), "{text}");
    assert_eq!(received(), Vec::<String>::new(), "{text}");
    bus.shutdown().await;
}

/// An API server that accepts connections and never answers (stopped, or a black hole on the
/// way): the drain still ends by its deadline, saying what it could not do, instead of waiting
/// minutes for the client's read timeout while a shutdown waits for it.
#[tokio::test]
async fn an_api_server_that_never_answers_ends_the_drain_by_its_deadline() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let addr = listener.local_addr().expect("addr");
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            open.push(conn);
        }
    });
    let config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
    let client = kube::Client::try_from(config).expect("client");
    let opts = options(Duration::from_secs(1));
    let drain = drain::drain(&client, NODE, &opts);
    let result = tokio::time::timeout(Duration::from_secs(20), drain)
        .await
        .expect("the drain returned instead of hanging");
    let err = result.expect_err("nothing was drained");
    assert!(
        matches!(err, drain::exec::Error::NoAnswer { action: "get", .. }),
        "{err}"
    );
    assert!(err.is_retryable());
    held.abort();
}

/// A pod refused by its budget before the drain had listed the budgets (their list failed at
/// first) is still retried the moment the budget opens — not only at the 5 s ceiling.
#[tokio::test]
async fn a_budget_listed_late_still_wakes_its_blocked_pod() {
    let emu = emulator().await;
    emu.seed_pod(web("web-0")).expect("pod");
    pdb(&emu, "web", "web", json!({"minAvailable": 1}));
    emu.add_fault(FaultRule::count("list", "poddisruptionbudgets", 500, 1));
    let emu2 = emu.clone();
    let opener = tokio::spawn(async move {
        let blocked = |e: &kube_emulator::EvictionRecord| {
            matches!(e.outcome, EvictionOutcome::Blocked { .. })
        };
        let lists = |emu: &EmulatorHandle| {
            emu.requests()
                .iter()
                .filter(|r| r.verb == "list" && r.resource == "poddisruptionbudgets")
                .count()
        };
        // Refused while the budgets were not listed; open once their list went through.
        while !emu2.evictions().iter().any(blocked) || lists(&emu2) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let opened = chrono::Utc::now();
        open_web_budget(&emu2);
        opened
    });
    let report = drain::drain(&client(&emu).await, NODE, &options(Duration::from_secs(20)))
        .await
        .expect("drain");
    let opened = opener.await.expect("opener");
    assert_eq!(report.outcome, DrainOutcome::Drained, "{report}");
    let evicted = emu
        .evictions()
        .into_iter()
        .find(|e| matches!(e.outcome, EvictionOutcome::Evicted { .. }))
        .expect("evicted");
    let after = (evicted.at - opened).to_std().unwrap_or_default();
    assert!(
        after < drain::step::BUDGET_RETRY_CEILING / 2,
        "evicted {after:?} after the budget opened: woken by the budget, not the ceiling"
    );
}
