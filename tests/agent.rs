//! The node agent as a real process (`nodeward agent`) against kube-emulator, and — for the
//! shutdown path — the real systemd-logind on a private bus (logind-harness).
//!
//! Tests named `logind_*` need root and `apt-get install -y systemd dbus python3-dbusmock
//! util-linux`; without them they fail with the harness's message saying what to install.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube_emulator::{
    Emulator, EmulatorHandle, EmulatorOptions, EvictionOutcome, FaultRule, PodSeed,
};
use logind_harness::{LogindHarness, Mode, Options};
use nodeward::agent::status::{ShutdownOutcome, Status};
use nodeward::drain::cordon::CORDONED_BY;
use serde_json::json;

const NODE: &str = "worker-1";
const TAINT: &str = "readiness.k8s.io/nodeward";
/// Upper bound for anything that should happen "at once" (milliseconds normally); generous for
/// a loaded two-core machine compiling in parallel.
const SOON: Duration = Duration::from_secs(15);
/// logind's cap in the harness: the drain deadline is min(drain.timeout, cap - margin).
const CAP: Duration = Duration::from_secs(8);

async fn emulator() -> Arc<EmulatorHandle> {
    let emu = Emulator::start(EmulatorOptions {
        grace_scale: 0.001,
        ..EmulatorOptions::default()
    })
    .await
    .expect("emulator starts");
    Arc::new(emu)
}

/// A node as kubelet registers it on a nodeward machine: with the startup taint.
fn seed_tainted_node(emu: &EmulatorHandle) {
    let mut n = kube_emulator::node_json(NODE);
    n["spec"]["taints"] = json!([{"key": TAINT, "effect": "NoSchedule"}]);
    emu.create(n).expect("node");
}

fn seed_flannel(emu: &EmulatorHandle, ready: bool) {
    if emu.get("namespaces", None, "kube-flannel").is_none() {
        emu.create(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-flannel"}}),
        )
        .expect("namespace");
        emu.seed_daemonset("kube-flannel", "kube-flannel-ds")
            .expect("daemonset");
    }
    emu.seed_pod(
        PodSeed::new("kube-flannel", "kube-flannel-ds-abcde")
            .node(NODE)
            .label("app", "flannel")
            .owner("DaemonSet", "kube-flannel-ds")
            .ready(ready),
    )
    .expect("flannel pod");
}

fn seed_workload(emu: &EmulatorHandle, n: usize) {
    for i in 0..n {
        emu.seed_pod(
            PodSeed::new("default", &format!("web-{i}"))
                .node(NODE)
                .label("app", "web")
                .owner("ReplicaSet", "web")
                .grace(30)
                .ready(true),
        )
        .expect("pod");
    }
}

/// `nodeward agent` running as a child process with its own config and bus.
struct AgentProc {
    child: tokio::process::Child,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl AgentProc {
    fn flannel_file(&self) -> PathBuf {
        self.dir.path().join("run/flannel/subnet.env")
    }
    fn status_file(&self) -> PathBuf {
        self.dir.path().join("status.json")
    }
    fn config_file(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }
    fn pid(&self) -> i32 {
        self.child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .expect("agent running")
    }

    fn write_flannel(&self) {
        let path = self.flannel_file();
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        // Atomically, as flannel does.
        let tmp = path.with_extension("tmp");
        std::fs::write(
            &tmp,
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\n",
        )
        .expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
    }

    fn sigterm(&self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("kill");
    }

    async fn wait_exit(&mut self) -> std::process::ExitStatus {
        tokio::time::timeout(SOON, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("agent did not exit\n{}", self.log_text()))
            .expect("wait")
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the status file satisfies `pred` (re-reading on every inotify event).
    async fn wait_status(&self, what: &str, pred: impl Fn(&Status) -> bool) -> Status {
        let path = self.status_file();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let _w = nodeward::gate::watch::FileWatcher::new(vec![path.clone()], tx).expect("watch");
        let deadline = tokio::time::Instant::now() + SOON;
        loop {
            if let Ok(s) = nodeward::agent::status::read(&path)
                && pred(&s)
            {
                return s;
            }
            if tokio::time::timeout_at(deadline, rx.recv()).await.is_err() {
                let last = nodeward::agent::status::read(&path)
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                panic!(
                    "timed out waiting for status: {what}\nlast status:\n{last}\nagent log:\n{}",
                    self.log_text()
                );
            }
        }
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- agent log ---\n{}", self.log_text());
        }
    }
}

struct Setup<'a> {
    emu: &'a EmulatorHandle,
    bus: Option<&'a str>,
    dropin_dir: Option<&'a Path>,
    extra: &'a str,
}

fn spawn_agent(s: Setup<'_>) -> AgentProc {
    let dir = tempfile::tempdir().expect("tempdir");
    let flannel = dir.path().join("run/flannel/subnet.env");
    let dropin = s
        .dropin_dir
        .map_or_else(|| dir.path().join("logind.conf.d"), Path::to_path_buf)
        .join("90-nodeward.conf");
    let config = format!(
        r#"[node]
name = "{NODE}"
kubeconfig = "{kc}"
[agent]
status_file = "{status}"
# These tests drive the agent-untaints-itself path (an agent with its own identity); the
# default, the readiness controller, is tested in tests/readiness.rs.
startup_taint = "agent"
[drain]
timeout = "5s"
[shutdown]
safety_margin = "1s"
logind_dropin = "{dropin}"
[gates]
file = [{{ path = "{flannel}", contains = "FLANNEL_SUBNET=" }}]
{extra}
"#,
        kc = s.emu.kubeconfig_path().display(),
        status = dir.path().join("status.json").display(),
        dropin = dropin.display(),
        flannel = flannel.display(),
        extra = s.extra,
    );
    // `extra` may redefine a section: parse it as a drop-in instead, so keys merge.
    let (main, dropin_cfg) = match config.split_once("#DROPIN\n") {
        Some((a, b)) => (a.to_string(), Some(b.to_string())),
        None => (config, None),
    };
    std::fs::write(dir.path().join("config.toml"), main).expect("config");
    if let Some(d) = dropin_cfg {
        std::fs::create_dir(dir.path().join("config.d")).expect("mkdir");
        std::fs::write(dir.path().join("config.d/50-test.toml"), d).expect("dropin");
    }
    let log = dir.path().join("agent.log");
    let logf = std::fs::File::create(&log).expect("log");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodeward"));
    cmd.arg("agent")
        .arg("--config")
        .arg(dir.path().join("config.toml"))
        .env(
            "RUST_LOG",
            std::env::var("AGENT_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .stdout(std::process::Stdio::null())
        .stderr(logf)
        .kill_on_drop(true);
    match s.bus {
        Some(b) => cmd.env("DBUS_SYSTEM_BUS_ADDRESS", b),
        // No bus at all: the gate tests do not need logind.
        None => cmd.env(
            "DBUS_SYSTEM_BUS_ADDRESS",
            format!("unix:path={}", dir.path().join("no-bus.sock").display()),
        ),
    };
    let child = cmd.spawn().expect("spawn nodeward agent");
    AgentProc { child, dir, log }
}

async fn client(emu: &EmulatorHandle) -> kube::Client {
    nodeward::kube_client::client(Some(emu.kubeconfig_path()))
        .await
        .expect("client")
}

fn schedulable(n: &Node) -> bool {
    let spec = n.spec.as_ref();
    !spec.and_then(|s| s.unschedulable).unwrap_or(false)
        && !spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == TAINT))
}

fn has_taint(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == TAINT))
}

/// Waits (on a watch) until the Node satisfies `pred`.
async fn wait_node(emu: &EmulatorHandle, what: &str, pred: impl Fn(&Node) -> bool) -> Node {
    let api: kube::Api<Node> = kube::Api::all(client(emu).await);
    let cond = move |n: Option<&Node>| n.is_some_and(&pred);
    let found = tokio::time::timeout(SOON, kube::runtime::wait::await_condition(api, NODE, cond))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "timed out waiting for the node: {what}; node: {:?}",
                emu.get("nodes", None, NODE)
            )
        })
        .expect("watch");
    found.expect("node exists")
}

/// Waits (on a watch) for an events.k8s.io Event about the Node with `reason`.
async fn wait_event(emu: &EmulatorHandle, reason: &str) -> k8s_openapi::api::events::v1::Event {
    let api: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(client(emu).await, "default");
    let stream = watcher(api, watcher::Config::default()).applied_objects();
    let mut stream = std::pin::pin!(stream);
    tokio::time::timeout(SOON, async {
        while let Some(ev) = stream.next().await {
            if let Ok(e) = ev
                && e.reason.as_deref() == Some(reason)
            {
                return e;
            }
        }
        panic!("event stream ended")
    })
    .await
    .unwrap_or_else(|_| panic!("no {reason} event"))
}

fn cordoned_by_us(n: &Node) -> bool {
    n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
        && n.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(CORDONED_BY))
}

fn pods_on_node(emu: &EmulatorHandle) -> Vec<String> {
    emu.list("pods", None)
        .into_iter()
        .filter(|p| p.pointer("/spec/nodeName").and_then(|v| v.as_str()) == Some(NODE))
        .filter_map(|p| {
            p.pointer("/metadata/name")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .collect()
}

async fn harness(cap: Duration) -> LogindHarness {
    match LogindHarness::start(Options {
        mode: Mode::Real,
        inhibit_delay_max: cap,
        ..Options::default()
    })
    .await
    {
        Ok(h) => h,
        Err(e) => panic!("cannot start the logind harness: {e}"),
    }
}

/// A node with `pods` workload pods and its agent on the logind harness (logind's cap `cap`,
/// `drain.timeout` `timeout`), once the agent holds its delay lock.
async fn holding_the_lock(
    cap: Duration,
    pods: usize,
    timeout: &str,
) -> (LogindHarness, Arc<EmulatorHandle>, AgentProc) {
    let h = harness(cap).await;
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    seed_workload(&emu, pods);
    let extra = format!("#DROPIN\n[drain]\ntimeout = \"{timeout}\"\n");
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: Some(h.dropin_dir()),
        extra: &extra,
    });
    h.wait_for_inhibitors(SOON, |l| ours(l) == 1)
        .await
        .expect("lock");
    (h, emu, agent)
}

/// An agent holding the lock (logind's `cap`, a 2 s drain deadline) whose write of its readiness
/// condition the API server holds: every gate but flannel's file passing, the emulator frozen
/// (accepts, never answers), then flannel's file written; returns once the patch is held (the
/// test fails if it is not within `limit`).
async fn writing_to_a_frozen_api_server(
    cap: Duration,
    limit: Duration,
) -> (LogindHarness, Arc<EmulatorHandle>, AgentProc) {
    let (h, emu, agent) = holding_the_lock(cap, 0, "2s").await;
    agent
        .wait_status("every gate but flannel's file passing", |s| {
            s.node_registered
                && s.phase == nodeward::agent::state::Phase::Gated
                && s.gates.iter().all(|g| {
                    g.gate.starts_with("file") || g.state == nodeward::gate::GateState::Pass
                })
        })
        .await;
    emu.set_latency(Duration::from_secs(600));
    // Gates pass: the agent writes its condition, and that request hangs.
    agent.write_flannel();
    let t0 = Instant::now();
    while !emu
        .held_requests()
        .iter()
        .any(|(verb, resource)| verb == "patch" && resource.starts_with("nodes"))
    {
        assert!(t0.elapsed() < limit, "the agent never wrote its condition");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (h, emu, agent)
}

fn ours(list: &[logind_harness::Inhibitor]) -> usize {
    list.iter()
        .filter(|i| i.who == "nodeward" && i.mode == "delay" && i.what.contains("shutdown"))
        .count()
}

// ---------------------------------------------------------------------------------------------
// Readiness gates
// ---------------------------------------------------------------------------------------------

/// The agent starts before kubeadm join registers the Node; once the Node exists and every gate
/// passes, the startup taint goes.
#[tokio::test]
async fn gates_pass_and_the_startup_taint_is_removed_on_a_node_registered_late() {
    let emu = emulator().await;
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: None,
        dropin_dir: None,
        extra: "",
    });
    agent
        .wait_status("pods listed, node not registered yet", |s| {
            !s.node_registered
                && s.gates
                    .iter()
                    .any(|g| g.reason == "node not registered yet")
                && s.gates
                    .iter()
                    .any(|g| g.reason == "no such pod on this node")
        })
        .await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    let st = agent
        .wait_status("node seen, file gate failing", |s| {
            s.node_registered
                && s.gates
                    .iter()
                    .any(|g| g.gate.starts_with("file") && g.reason == "missing")
        })
        .await;
    assert!(st.startup_taint, "{st}");
    let n = emu.get("nodes", None, NODE).expect("node");
    assert!(
        n.pointer("/spec/taints").is_some(),
        "no gate passed yet: taint stays"
    );
    agent.write_flannel();
    wait_node(&emu, "schedulable", schedulable).await;
    agent
        .wait_status("ready", |s| {
            s.waiting_for.contains("schedulable") || s.phase == nodeward::agent::state::Phase::Ready
        })
        .await;
}

/// The CPU seconds process `pid` has used (user and system), from `/proc/PID/stat` (clock ticks
/// of 1/100 s, as Linux reports them on every architecture the suite runs on).
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the command's closing parenthesis: state is the 1st, utime the 12th, stime
    // the 13th.
    let rest = stat.rsplit_once(')').expect("stat").1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    #[allow(clippy::cast_precision_loss)]
    let secs = ticks as f64 / 100.0;
    secs
}

/// Issue 58, item 6 (b): an agent with no system bus (a host whose D-Bus is down, the
/// real-control-plane suites) waits for it with a backoff and costs next to nothing meanwhile:
/// it once spun its event loop at about 100 % of a core. Over 30 s, well under a tenth of one.
#[tokio::test]
async fn an_agent_without_a_bus_costs_next_to_no_cpu() {
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: None,
        dropin_dir: None,
        extra: "",
    });
    agent.write_flannel();
    wait_node(&emu, "schedulable", schedulable).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (cpu0, t0) = (cpu_seconds(agent.pid()), Instant::now());
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (cpu, wall) = (cpu_seconds(agent.pid()) - cpu0, t0.elapsed().as_secs_f64());
    eprintln!("agent without a bus: {cpu:.2} CPU s over {wall:.1} s");
    assert!(
        cpu < wall / 10.0,
        "the agent used {cpu:.2} CPU seconds in {wall:.1} s without a bus:\n{}",
        agent.log_text()
    );
    let log = agent.log_text();
    let said = log.matches("system bus").count();
    assert!(
        said <= 3,
        "the missing bus is said once, not at every retry ({said} lines):\n{log}"
    );
}

/// An administrator's cordon is theirs: the taint goes, the cordon stays.
#[tokio::test]
async fn an_admin_cordon_is_kept() {
    let emu = emulator().await;
    seed_tainted_node(&emu);
    emu.modify("nodes", None, NODE, |n| {
        n["spec"]["unschedulable"] = json!(true)
    })
    .expect("admin cordon");
    seed_flannel(&emu, true);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: None,
        dropin_dir: None,
        extra: "",
    });
    agent.write_flannel();
    wait_node(&emu, "taint removed", |n| !has_taint(n)).await;
    let st = agent
        .wait_status("ready", |s| s.phase == nodeward::agent::state::Phase::Ready)
        .await;
    let n = emu.get("nodes", None, NODE).expect("node");
    assert_eq!(
        n.pointer("/spec/unschedulable"),
        Some(&json!(true)),
        "admin cordon lifted!"
    );
    assert!(st.cordoned_by.is_some(), "{st}");
}

/// After a reboot the Node comes back cordoned by nodeward (its record predates this boot): the
/// agent lifts it once the gates pass. The pod gate waits for flannel's pod to be Ready.
#[tokio::test]
async fn reboot_round_trip_uncordons_our_cordon_from_before_the_boot() {
    let emu = emulator().await;
    seed_tainted_node(&emu);
    let record = json!({"reason": "shutdown (reboot)", "at": "2020-01-01T00:00:00Z", "excluded_from_lb": true, "shutdown": true}).to_string();
    emu.modify("nodes", None, NODE, |n| {
        n["spec"]["unschedulable"] = json!(true);
        n["metadata"]["annotations"] = json!({CORDONED_BY: record});
        n["metadata"]["labels"]["node.kubernetes.io/exclude-from-external-load-balancers"] =
            json!("true");
        // As nodeward's write left it: its field manager owns spec.unschedulable.
        n["metadata"]["managedFields"] = json!([{
            "manager": "nodeward", "operation": "Update", "apiVersion": "v1",
            "time": "2020-01-01T00:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:unschedulable": {}}},
        }]);
    })
    .expect("cordoned before reboot");
    seed_flannel(&emu, false);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: None,
        dropin_dir: None,
        extra: "",
    });
    agent.write_flannel();
    agent
        .wait_status("only the pod gate fails", |s| {
            s.gates
                .iter()
                .filter(|g| g.state != nodeward::gate::GateState::Pass)
                .count()
                == 1
                && s.gates
                    .iter()
                    .any(|g| g.gate.starts_with("pod") && g.reason.contains("not Ready"))
        })
        .await;
    emu.set_pod_ready("kube-flannel", "kube-flannel-ds-abcde", true)
        .expect("ready");
    let n = wait_node(&emu, "schedulable", schedulable).await;
    let labels = n.metadata.labels.unwrap_or_default();
    assert!(
        !labels.contains_key("node.kubernetes.io/exclude-from-external-load-balancers"),
        "the LB exclusion nodeward added is removed with its cordon"
    );
    assert!(
        !n.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(CORDONED_BY)
    );
}

/// `kubectl uncordon` of nodeward's shutdown cordon leaves its record behind; a later
/// `kubectl cordon` (field manager `kubectl-cordon`) is the administrator's: the agent keeps it
/// when its gates pass, though the record predates the boot.
#[tokio::test]
async fn a_kubectl_cordon_over_a_stale_shutdown_record_is_kept() {
    let emu = emulator().await;
    seed_tainted_node(&emu);
    let record =
        json!({"reason": "shutdown (reboot)", "at": "2020-01-01T00:00:00Z", "shutdown": true})
            .to_string();
    emu.modify("nodes", None, NODE, |n| {
        n["metadata"]["annotations"] = json!({CORDONED_BY: record});
    })
    .expect("the record kubectl uncordon left");
    let kubectl_cordon = kube::api::PatchParams {
        field_manager: Some("kubectl-cordon".into()),
        ..kube::api::PatchParams::default()
    };
    kube::Api::<Node>::all(client(&emu).await)
        .patch(
            NODE,
            &kubectl_cordon,
            &kube::api::Patch::Strategic(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("kubectl cordon");
    seed_flannel(&emu, true);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: None,
        dropin_dir: None,
        extra: "",
    });
    agent.write_flannel();
    wait_node(&emu, "taint removed", |n| !has_taint(n)).await;
    let st = agent
        .wait_status("ready", |s| s.phase == nodeward::agent::state::Phase::Ready)
        .await;
    assert_eq!(
        emu_node(&emu).spec.and_then(|s| s.unschedulable),
        Some(true),
        "the administrator's cordon was lifted"
    );
    assert!(
        st.cordoned_by
            .as_deref()
            .is_some_and(|c| c.starts_with("kubectl-cordon")),
        "{st}"
    );
}

/// flannel dies after the node became schedulable: the startup taint comes back, and goes again
/// when flannel recovers.
#[tokio::test]
async fn flannel_dying_reapplies_the_taint() {
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: None,
        dropin_dir: None,
        extra: "",
    });
    agent.write_flannel();
    wait_node(&emu, "schedulable", schedulable).await;
    emu.set_pod_ready("kube-flannel", "kube-flannel-ds-abcde", false)
        .expect("flannel not ready");
    wait_node(&emu, "taint back", has_taint).await;
    std::fs::remove_file(agent.flannel_file()).expect("rm");
    emu.set_pod_ready("kube-flannel", "kube-flannel-ds-abcde", true)
        .expect("flannel ready");
    agent
        .wait_status("file gate failing", |s| {
            s.gates
                .iter()
                .any(|g| g.gate.starts_with("file") && g.reason == "missing")
                && s.startup_taint
        })
        .await;
    agent.write_flannel();
    wait_node(&emu, "schedulable again", schedulable).await;
}

/// Gates that never pass: NodeNotReadyInTime on the Node, and in `nodeward status`.
#[tokio::test]
async fn boot_deadline_reports_node_not_ready_in_time() {
    let emu = emulator().await;
    seed_tainted_node(&emu);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: None,
        dropin_dir: None,
        extra: "#DROPIN\n[agent]\nboot_deadline = \"1s\"\n",
    });
    let ev = wait_event(&emu, "NodeNotReadyInTime").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    let note = ev.note.unwrap_or_default();
    assert!(note.contains("file") && note.contains("missing"), "{note}");
    assert!(note.contains("pod kube-flannel/app=flannel"), "{note}");
    agent
        .wait_status("not ready in time", |s| s.not_ready_in_time)
        .await;
    // The emulator answers from this test's runtime: the command runs off it.
    let config = agent.config_file().to_path_buf();
    let status = move |output: &'static str| {
        let config = config.clone();
        async move {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
                .args(["status", "--output", output, "--config"])
                .arg(&config)
                .env("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent")
                .output()
                .await
                .expect("nodeward status");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    let text = status("text").await;
    assert!(text.contains("NOT READY IN TIME"), "{text}");
    assert!(text.contains("Fail    file"), "{text}");
    assert!(
        text.contains("drain:       none seen on this Node"),
        "{text}"
    );

    // A drain of the node (the agent's, an operator's, the scaler's) says what it waits on.
    emu.modify("nodes", None, NODE, |n| {
        let conditions = n["status"]["conditions"].as_array_mut().expect("conditions");
        conditions.push(json!({"type": "nodeward.io/Draining", "status": "True",
            "reason": "WaitingForBudget",
            "message": "1 pod left; default/web-0 blocked by PDB default/web (0 disruptions allowed) for 4 s; deadline in 50 s",
            "lastHeartbeatTime": jiff::Timestamp::now().to_string(),
            "lastTransitionTime": jiff::Timestamp::now().to_string()}));
    })
    .expect("draining");
    let text = status("text").await;
    assert!(
        text.contains("drain:       draining since ")
            && text.contains(
                ": WaitingForBudget: 1 pod left; default/web-0 blocked by PDB default/web"
            )
            && text.contains("at the deadline: abandon"),
        "{text}"
    );
    let doc: serde_json::Value = serde_json::from_str(&status("json").await).expect("json");
    assert_eq!(doc["draining"]["reason"], "WaitingForBudget", "{doc}");
    assert_eq!(doc["agent"]["not_ready_in_time"], true, "{doc}");
    assert_eq!(doc["agent_running"], true, "{doc}");
}

// ---------------------------------------------------------------------------------------------
// Shutdown, with the real logind
// ---------------------------------------------------------------------------------------------

/// The real logind, the emulator with the startup-tainted node, flannel and `pods` web pods
/// under a budget (`spec`, its selector added), and the agent on the bus holding its lock, the
/// node schedulable.
async fn web_under_budget(
    pods: usize,
    mut spec: serde_json::Value,
) -> (LogindHarness, Arc<EmulatorHandle>, AgentProc) {
    let h = harness(CAP).await;
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    seed_workload(&emu, pods);
    spec["selector"] = json!({"matchLabels": {"app": "web"}});
    emu.create(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "default"}, "spec": spec
    }))
    .expect("pdb");
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: Some(h.dropin_dir()),
        extra: "",
    });
    h.wait_for_inhibitors(SOON, |l| ours(l) == 1)
        .await
        .expect("lock taken");
    agent.write_flannel();
    wait_node(&emu, "schedulable", schedulable).await;
    (h, emu, agent)
}

/// The whole shutdown path: lock listed with who "nodeward"; PowerOff → drain (PDB respected) →
/// lock released → logind starts poweroff.target; shutdown cancelled → lock taken again and our
/// cordon lifted.
#[tokio::test]
async fn logind_poweroff_drains_releases_the_lock_and_cancel_retakes_it() {
    let (h, emu, agent) = web_under_budget(6, json!({"maxUnavailable": 1})).await;
    emu.seed_node("worker-2").expect("node 2");
    let list = h
        .wait_for_inhibitors(SOON, |l| ours(l) == 1)
        .await
        .expect("lock taken");
    let lock = list.iter().find(|i| i.who == "nodeward").expect("ours");
    assert_eq!(lock.why, "draining Kubernetes node before shutdown");
    assert_eq!(lock.mode, "delay");

    // A stand-in ReplicaSet controller: replacements on worker-2 so the budget reopens.
    let controller = kube_emulator::standin::replace_terminating(&emu, "default", NODE, "worker-2");
    let t0 = Instant::now();
    h.power_off().await.expect("PowerOff");
    h.wait_for_unit_started("poweroff.target", SOON)
        .await
        .expect("logind proceeds once the lock is released");
    let took = t0.elapsed();
    controller.abort();
    assert!(
        took < CAP,
        "released by the agent, not logind's cap: {took:?}"
    );
    assert_eq!(
        pods_on_node(&emu),
        ["kube-flannel-ds-abcde"],
        "DaemonSet pod stays, the rest left"
    );
    let blocked = emu
        .evictions()
        .iter()
        .filter(|e| matches!(e.outcome, EvictionOutcome::Blocked { .. }))
        .count();
    assert!(
        blocked > 0,
        "the budget never pushed back; the test proves nothing"
    );
    let st = agent
        .wait_status("drained", |s| s.last_drain.is_some())
        .await;
    let d = st.last_drain.as_ref().expect("drain");
    assert_eq!(d.outcome, ShutdownOutcome::Drained, "{st}");
    assert_eq!(d.evicted, 6);
    assert_eq!(st.lock, nodeward::agent::state::Lock::Released);
    assert!(cordoned_by_us(&emu_node(&emu)));
    h.wait_for_inhibitors(SOON, |l| ours(l) == 0)
        .await
        .expect("our lock is gone from logind's list");
    // nodeward-drain.service was stopped while the agent drained (its ExecStop waits for the
    // agent's outcome), so systemd's shutdown does not wait for it between the lock's release
    // and kubelet's stop.
    assert_eq!(
        h.stopped_units().await.expect("StopUnit calls"),
        ["nodeward-drain.service"],
        "the agent did not take the drain unit off kubelet's path"
    );

    // systemctl cancel: logind sends PrepareForShutdown(false).
    h.cancel_shutdown().await.expect("cancel");
    h.wait_for_inhibitors(SOON, |l| ours(l) == 1)
        .await
        .expect("lock taken again after the cancel");
    h.wait_for_unit_started("nodeward-drain.service", SOON)
        .await
        .expect("the agent re-arms the drain unit it stopped");
    wait_node(
        &emu,
        "our shutdown cordon lifted after the cancel",
        schedulable,
    )
    .await;
    h.shutdown().await;
}

/// The power-off record the agent left on its Node, if any.
fn power_off_record(emu: &EmulatorHandle) -> Option<nodeward::out_of_service::PowerOff> {
    nodeward::out_of_service::PowerOff::of(&emu_node(emu))
}

/// Issue 43, item 3: the real logind here is systemd 252, whose `PrepareForShutdown` does not
/// say which shutdown it is. The agent's bus monitor sees the call that asked for it: a
/// `Reboot` applies `on_reboot` and records nothing on the Node; a `PowerOff` applies
/// `on_poweroff` and leaves the power-off record (this boot's ID, the pods) before the lock goes;
/// a cancel after that withdraws it.
#[tokio::test]
async fn logind_252_tells_a_power_off_from_a_reboot_by_the_call_and_records_the_power_off_until_cancelled()
 {
    let h = harness(CAP).await;
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    seed_workload(&emu, 2);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: Some(h.dropin_dir()),
        extra: "#DROPIN\n[drain]\ntimeout = \"3s\"\n[shutdown]\non_reboot = \"cordon\"\non_unknown = \"nothing\"\n",
    });
    h.wait_for_inhibitors(SOON, |l| ours(l) == 1)
        .await
        .expect("lock");
    let t0 = Instant::now();
    while !agent
        .log_text()
        .contains("watching the system bus for calls to logind")
    {
        assert!(t0.elapsed() < SOON, "no bus monitor:\n{}", agent.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    h.reboot().await.expect("Reboot");
    h.wait_for_unit_started("reboot.target", SOON)
        .await
        .expect("logind proceeds once the lock is released");
    let st = agent
        .wait_status("reboot handled", |s| s.last_drain.is_some())
        .await;
    let d = st.last_drain.as_ref().expect("drain");
    assert_eq!(d.kind, nodeward::logind::ShutdownKind::Reboot, "{st}");
    assert_eq!(d.policy, nodeward::config::ShutdownPolicy::Cordon, "{st}");
    assert_eq!(
        power_off_record(&emu),
        None,
        "a reboot records no power-off"
    );

    h.cancel_shutdown().await.expect("cancel");
    h.wait_for_inhibitors(SOON, |l| ours(l) == 1)
        .await
        .expect("lock taken again after the cancel");
    h.power_off().await.expect("PowerOff");
    h.wait_for_unit_started("poweroff.target", SOON)
        .await
        .expect("logind proceeds once the lock is released");
    let st = agent
        .wait_status("power-off handled", |s| {
            s.last_drain
                .as_ref()
                .is_some_and(|d| d.kind != nodeward::logind::ShutdownKind::Reboot)
        })
        .await;
    let d = st.last_drain.as_ref().expect("drain");
    assert_eq!(d.kind, nodeward::logind::ShutdownKind::PowerOff, "{st}");
    assert_eq!(d.policy, nodeward::config::ShutdownPolicy::Drain, "{st}");
    let record = power_off_record(&emu).expect("the power-off is recorded on the Node");
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    assert_eq!(record.boot_id, boot.trim());
    assert!(record.tainted_at.is_none());
    eprintln!("power-off record: {record:?}");

    // Issue 58, item 1: logind cancels the power-off after the record was written (the lock
    // is released by then): the node stays up, so the agent withdraws its record.
    h.cancel_shutdown().await.expect("cancel");
    let t0 = Instant::now();
    while power_off_record(&emu).is_some() {
        assert!(
            t0.elapsed() < SOON,
            "the cancelled power-off's record stays on the Node:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.shutdown().await;
}

/// A power-off cancelled while the drain waits on a budget leaves no power-off record: the node
/// stays up, and a record would let a later NotReady of this boot pass for the power-off.
#[tokio::test]
async fn logind_a_power_off_cancelled_during_its_drain_records_nothing() {
    let h = dbusmock_logind().await;
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    seed_workload(&emu, 2);
    emu.create(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}
    }))
    .expect("pdb");
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: None,
        extra: "#DROPIN\n[drain]\ntimeout = \"60s\"\n",
    });
    agent
        .wait_status("lock held", |s| {
            s.lock == nodeward::agent::state::Lock::Held
        })
        .await;
    agent.write_flannel();
    wait_node(&emu, "schedulable", schedulable).await;
    let conn = h.connection().await.expect("bus");
    let meta: std::collections::HashMap<&str, zbus::zvariant::Value<'_>> =
        [("type", zbus::zvariant::Value::from("power-off"))].into();
    conn.call_method(
        Some("org.freedesktop.login1"),
        "/org/freedesktop/login1",
        Some("org.freedesktop.DBus.Mock"),
        "EmitSignal",
        &(
            "org.freedesktop.login1.Manager",
            "PrepareForShutdownWithMetadata",
            "ba{sv}",
            vec![
                zbus::zvariant::Value::from(true),
                zbus::zvariant::Value::from(meta),
            ],
        ),
    )
    .await
    .expect("EmitSignal");
    agent
        .wait_status("the drain waits on the budget", |s| {
            s.draining.as_ref().is_some_and(|d| d.blocked.len() == 2)
        })
        .await;
    h.emit_prepare_for_shutdown(false).await.expect("cancel");
    wait_node(&emu, "our cordon lifted", schedulable).await;
    let t0 = Instant::now();
    while !agent.log_text().contains("the power-off was cancelled") {
        assert!(t0.elapsed() < SOON, "{}", agent.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        power_off_record(&emu),
        None,
        "a cancelled power-off is recorded"
    );
    h.shutdown().await;
}

/// An operator's `nodeward drain` cordoned the node before the shutdown; the agent's shutdown
/// drain finds that cordon (it cordons nothing itself), so a cancelled shutdown leaves it: only
/// a cordon the agent's own write made is the agent's to lift.
#[tokio::test]
async fn logind_a_cancelled_shutdown_keeps_the_operators_cordon() {
    let (h, emu, agent) = holding_the_lock(CAP, 0, "5s").await;
    agent.write_flannel();
    wait_node(&emu, "schedulable", schedulable).await;
    operators_drain(&agent).await;
    h.power_off().await.expect("PowerOff");
    h.wait_for_unit_started("poweroff.target", SOON)
        .await
        .expect("logind proceeds once the lock is released");
    agent
        .wait_status("drained", |s| s.last_drain.is_some())
        .await;
    h.cancel_shutdown().await.expect("cancel");
    agent
        .wait_status("lock taken again, gates passed", |s| {
            s.lock == nodeward::agent::state::Lock::Held
                && s.phase == nodeward::agent::state::Phase::Ready
        })
        .await;
    assert!(
        cordoned_by_us(&emu_node(&emu)),
        "the operator's drain was lifted by the agent"
    );
    h.shutdown().await;
}

/// A shutdown drain that a budget blocks says so in the status file, every blocked pod with its
/// budget and how long it has waited, and `nodeward status` prints them; gone once it ends.
#[tokio::test]
async fn logind_a_blocked_drain_lists_every_blocked_pod_in_the_status() {
    let (h, _emu, agent) = web_under_budget(3, json!({"minAvailable": 3})).await;
    h.power_off().await.expect("PowerOff");
    let st = agent
        .wait_status("the drain lists its 3 blocked pods", |s| {
            s.draining.as_ref().is_some_and(|d| d.blocked.len() == 3)
        })
        .await;
    let d = st.draining.as_ref().expect("draining");
    assert_eq!(d.reason, "WaitingForBudget", "{st}");
    assert!(d.deadline_at.is_some(), "{st}");
    let text = st.to_string();
    for pod in ["default/web-0", "default/web-1", "default/web-2"] {
        assert!(
            text.contains(&format!("  blocked:     {pod} by PDB default/web")),
            "{pod} missing:\n{text}"
        );
    }
    // The same from the command, off the emulator's runtime.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .args(["status", "--config"])
        .arg(agent.config_file())
        .env("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent")
        .output()
        .await
        .expect("nodeward status");
    let printed = String::from_utf8_lossy(&out.stdout);
    eprintln!("{printed}");
    assert!(
        printed.contains("draining now:  WaitingForBudget: 3 pods left")
            && printed.contains("  blocked:     default/web-2 by PDB default/web"),
        "{printed}"
    );
    h.wait_for_unit_started("poweroff.target", SOON)
        .await
        .expect("the drain ends at its deadline and the lock goes");
    let st = agent
        .wait_status("drain over", |s| s.last_drain.is_some())
        .await;
    assert!(st.draining.is_none(), "{st}");
    h.shutdown().await;
}

fn emu_node(emu: &EmulatorHandle) -> Node {
    serde_json::from_value(emu.get("nodes", None, NODE).expect("node")).expect("node json")
}

/// logind crashes and comes back: it keeps the old lock (in /run/systemd/inhibit), the agent
/// takes a new one and closes the old, so exactly one of ours remains — and it works.
#[tokio::test]
async fn logind_restart_retakes_the_lock_and_keeps_only_one() {
    let mut h = harness(CAP).await;
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: Some(h.dropin_dir()),
        extra: "",
    });
    agent.wait_status("lock held", |s| s.lock_takes == 1).await;
    h.kill_logind_with(logind_harness::Signal::SIGKILL)
        .await
        .expect("kill logind");
    h.restart_logind().await.expect("restart logind");
    let t0 = Instant::now();
    agent
        .wait_status("lock taken again", |s| s.lock_takes == 2)
        .await;
    let retake = t0.elapsed();
    let list = h
        .wait_for_inhibitors(SOON, |l| ours(l) == 1)
        .await
        .expect("exactly one lock of ours");
    assert_eq!(ours(&list), 1, "{list:?}");
    assert!(
        retake < Duration::from_secs(3),
        "re-taken within about a second: {retake:?}"
    );

    // The re-taken lock really holds a shutdown and is released by the drain.
    let t0 = Instant::now();
    h.power_off().await.expect("PowerOff");
    h.wait_for_unit_started("poweroff.target", SOON)
        .await
        .expect("poweroff");
    assert!(
        t0.elapsed() < CAP,
        "released by the agent: {:?}",
        t0.elapsed()
    );
    h.wait_for_inhibitors(SOON, |l| ours(l) == 0)
        .await
        .expect("no lock of ours left");
    h.shutdown().await;
}

/// Every eviction fails (the API answers 503): the lock is still released by the deadline
/// (cap − margin), the node stays cordoned and annotated, nothing hangs.
#[tokio::test]
async fn logind_api_failing_during_shutdown_releases_the_lock_by_the_deadline() {
    let h = harness(Duration::from_secs(4)).await;
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    seed_workload(&emu, 3);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: Some(h.dropin_dir()),
        // cap 4 s less margin 1 s: the deadline is the drain's 3 s, the engine's 2.25 s (a
        // quarter kept for its ending). Not less: the agent first stops nodeward-drain.service,
        // which took 1.2 s once on a loaded CI machine, and the engine must still list the pods.
        extra: "#DROPIN\n[drain]\ntimeout = \"3s\"\n",
    });
    h.wait_for_inhibitors(SOON, |l| ours(l) == 1)
        .await
        .expect("lock");
    emu.add_fault(FaultRule::rate("create", "pods/eviction", 503, 1.0));
    let t0 = Instant::now();
    h.power_off().await.expect("PowerOff");
    h.wait_for_inhibitors(SOON, |l| ours(l) == 0)
        .await
        .expect("lock released");
    let released = t0.elapsed();
    assert!(
        released < Duration::from_secs(4),
        "released before logind's cap: {released:?}"
    );
    // The engine's deadline is the agent's (3 s) less the ending's reserve (a quarter of it), so
    // its ending fits before the lock goes.
    assert!(
        released >= Duration::from_millis(2000),
        "released at the engine's deadline, not before: {released:?}"
    );
    h.wait_for_unit_started("poweroff.target", SOON)
        .await
        .expect("poweroff");
    let st = agent
        .wait_status("drain recorded", |s| s.last_drain.is_some())
        .await;
    let d = st.last_drain.as_ref().expect("drain");
    assert_eq!(d.outcome, ShutdownOutcome::DeadlineExceeded(None), "{st}");
    assert_eq!(d.left_behind.len(), 3, "{st}");
    assert!(cordoned_by_us(&emu_node(&emu)), "cordoned and annotated");
    h.shutdown().await;
}

/// A drain error that trying again cannot fix (here the credentials may not evict) ends the
/// shutdown drain at once, reported as a failure, instead of being retried until the deadline
/// while the machine waits.
#[tokio::test]
async fn logind_a_permanent_drain_error_is_not_retried() {
    let (h, emu, agent) = holding_the_lock(Duration::from_secs(40), 3, "30s").await;
    emu.add_fault(FaultRule::rate("create", "pods/eviction", 403, 1.0));
    h.power_off().await.expect("PowerOff");
    let st = agent
        .wait_status("drain recorded", |s| s.last_drain.is_some())
        .await;
    let d = st.last_drain.as_ref().expect("drain");
    assert!(
        matches!(&d.outcome, ShutdownOutcome::Failed(e) if e.contains("create pods/eviction")),
        "{st}\n{}",
        agent.log_text()
    );
    assert!(
        !agent.log_text().contains("retrying until the deadline"),
        "{}",
        agent.log_text()
    );
    h.wait_for_unit_started("poweroff.target", SOON)
        .await
        .expect("the lock goes at once");
    h.shutdown().await;
}

/// The API server is unreachable for the whole shutdown: the drain cannot even start, the lock
/// is still released by the deadline.
#[tokio::test]
async fn logind_api_unreachable_during_shutdown_releases_the_lock_by_the_deadline() {
    let (h, emu, agent) = holding_the_lock(Duration::from_secs(4), 0, "2s").await;
    emu.refuse_connections(Duration::from_secs(30)).await;
    let t0 = Instant::now();
    h.power_off().await.expect("PowerOff");
    h.wait_for_inhibitors(SOON, |l| ours(l) == 0)
        .await
        .expect("lock released");
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "released before logind's cap: {:?}",
        t0.elapsed()
    );
    let st = agent
        .wait_status("drain recorded", |s| s.last_drain.is_some())
        .await;
    let d = st.last_drain.as_ref().expect("drain");
    assert!(
        matches!(&d.outcome, ShutdownOutcome::DeadlineExceeded(Some(e)) if e.contains("cannot get node")),
        "the failure is reported: {st}"
    );
    h.shutdown().await;
}

/// The API server freezes (accepts, never answers) while the agent is writing its readiness
/// condition from the loop that also answers logind. At PrepareForShutdown that write must not
/// hold the answer: the lock goes by the drain deadline plus one request's deadline, not at
/// logind's cap (kube's default read timeout would have held it for 295 s).
#[tokio::test]
async fn logind_a_frozen_api_server_does_not_hold_the_shutdown_answer() {
    let cap = Duration::from_secs(60);
    let (h, emu, agent) = writing_to_a_frozen_api_server(cap, cap).await;
    let t0 = Instant::now();
    h.power_off().await.expect("PowerOff");
    h.wait_for_inhibitors(cap, |l| ours(l) == 0)
        .await
        .expect("lock released");
    let released = t0.elapsed();
    let bound = Duration::from_secs(2) + nodeward::agent::REQUEST_DEADLINE + Duration::from_secs(3);
    assert!(
        released < bound,
        "released {released:?} after PrepareForShutdown, past the drain deadline plus one request deadline ({bound:?})\n{}",
        agent.log_text()
    );
    emu.set_latency(Duration::ZERO);
    h.shutdown().await;
}

/// The API server freezes while the agent writes to it; SIGTERM (systemd stopping the unit, at
/// a shutdown after the drain, or for an upgrade) must not wait behind that write. It waited
/// for the request's deadline, and a write's retries after it: a shutdown with the API server
/// unreachable took 26 s more than its drain, until systemd's TimeoutStopSec= killed the agent.
#[tokio::test]
async fn logind_sigterm_is_not_held_by_a_frozen_api_server() {
    let (h, emu, mut agent) = writing_to_a_frozen_api_server(CAP, SOON).await;
    let t0 = Instant::now();
    agent.sigterm();
    let status = agent.wait_exit().await;
    let exited = t0.elapsed();
    assert!(status.success(), "exit 0 on SIGTERM: {status}");
    let bound = nodeward::agent::STOP_GRACE + Duration::from_secs(2);
    assert!(
        exited < bound,
        "exited {exited:?} after SIGTERM with a write held by the API server: more than its grace ({bound:?})\n{}",
        agent.log_text()
    );
    h.wait_for_inhibitors(SOON, |l| ours(l) == 0)
        .await
        .expect("lock closed");
    emu.set_latency(Duration::ZERO);
    h.shutdown().await;
}

/// SIGTERM means "the service is stopping" (a package upgrade), not a shutdown: the lock is
/// closed, the process exits 0, and nothing is drained or cordoned.
#[tokio::test]
async fn logind_sigterm_releases_the_lock_without_draining() {
    let h = harness(CAP).await;
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    seed_workload(&emu, 3);
    let mut agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: Some(h.dropin_dir()),
        extra: "",
    });
    agent.write_flannel();
    wait_node(&emu, "schedulable", schedulable).await;
    h.wait_for_inhibitors(SOON, |l| ours(l) == 1)
        .await
        .expect("lock");
    agent.sigterm();
    let status = agent.wait_exit().await;
    assert!(status.success(), "exit 0 on SIGTERM: {status}");
    h.wait_for_inhibitors(SOON, |l| ours(l) == 0)
        .await
        .expect("lock closed");
    assert!(emu.evictions().is_empty(), "SIGTERM must not drain");
    assert!(schedulable(&emu_node(&emu)), "SIGTERM must not cordon");
    assert_eq!(pods_on_node(&emu).len(), 4);
    h.shutdown().await;
}

/// A short cap is raised with the drop-in and a SIGHUP; kubelet's own delay lock is warned about.
#[tokio::test]
async fn logind_short_cap_is_raised_and_kubelet_lock_is_warned_about() {
    let h = harness(Duration::from_secs(1)).await;
    let _kubelet = h
        .inhibit(
            "shutdown",
            "kubelet",
            "Kubelet needs time to handle node shutdown",
            "delay",
        )
        .await
        .expect("kubelet's lock");
    let emu = emulator().await;
    seed_tainted_node(&emu);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: Some(h.dropin_dir()),
        extra: "#DROPIN\n[shutdown]\ninhibit_delay_max = \"30s\"\n",
    });
    let st = agent
        .wait_status("cap raised", |s| s.inhibit_delay_max_ms == Some(30_000))
        .await;
    assert_eq!(
        h.inhibit_delay_max().await.expect("cap"),
        Duration::from_secs(30)
    );
    let dropin = std::fs::read_to_string(h.dropin_dir().join("90-nodeward.conf")).expect("dropin");
    assert!(dropin.contains("InhibitDelayMaxSec=30"), "{dropin}");
    assert!(
        st.warnings
            .iter()
            .any(|w| w.contains("kubelet") && w.contains("shutdownGracePeriod")),
        "{st}"
    );
    h.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// The operator's drain
// ---------------------------------------------------------------------------------------------

/// `nodeward drain` — nodeward-drain.service's ExecStop — drains while the agent runs, and the
/// agent leaves that cordon alone (it was made this boot, by the operator).
#[tokio::test]
async fn execstop_drain_drains_and_the_agent_keeps_the_cordon() {
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    seed_workload(&emu, 4);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: None,
        dropin_dir: None,
        extra: "",
    });
    agent.write_flannel();
    wait_node(&emu, "schedulable", schedulable).await;
    operators_drain(&agent).await;
    assert_eq!(pods_on_node(&emu), ["kube-flannel-ds-abcde"]);
    agent
        .wait_status("agent sees the operator's cordon", |s| {
            s.cordoned_by
                .as_deref()
                .is_some_and(|c| c.starts_with("nodeward"))
        })
        .await;
    // Make the gates flap: the agent must still not lift the operator's drain.
    std::fs::remove_file(agent.flannel_file()).expect("rm");
    agent.wait_status("gate failing", |s| s.startup_taint).await;
    agent.write_flannel();
    wait_node(&emu, "taint gone again", |n| !has_taint(n)).await;
    agent
        .wait_status("ready again", |s| {
            s.phase == nodeward::agent::state::Phase::Ready
        })
        .await;
    assert!(
        cordoned_by_us(&emu_node(&emu)),
        "the operator's drain stays cordoned"
    );
}

/// systemd 255+ says which kind of shutdown it is (`PrepareForShutdownWithMetadata`); logind 252
/// cannot, so dbusmock's logind plays it: a reboot with `on_reboot = "cordon"` only cordons,
/// evicts nothing, and releases the lock.
#[tokio::test]
async fn logind_metadata_reboot_applies_the_reboot_policy() {
    let h = match LogindHarness::start(Options {
        mode: Mode::DbusmockLogind,
        ..Options::default()
    })
    .await
    {
        Ok(h) => h,
        Err(e) => panic!("cannot start the logind harness: {e}"),
    };
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    seed_workload(&emu, 2);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: None,
        // dbusmock's cap is 5 s: a 2 s drain fits, so the agent leaves logind's config alone.
        extra: "#DROPIN\n[drain]\ntimeout = \"2s\"\n[shutdown]\non_reboot = \"cordon\"\non_poweroff = \"drain\"\non_unknown = \"drain\"\n",
    });
    agent
        .wait_status("lock held", |s| {
            s.lock == nodeward::agent::state::Lock::Held
        })
        .await;
    let conn = h.connection().await.expect("bus");
    let meta: std::collections::HashMap<&str, zbus::zvariant::Value<'_>> =
        [("type", zbus::zvariant::Value::from("reboot"))].into();
    conn.call_method(
        Some("org.freedesktop.login1"),
        "/org/freedesktop/login1",
        Some("org.freedesktop.DBus.Mock"),
        "EmitSignal",
        &(
            "org.freedesktop.login1.Manager",
            "PrepareForShutdownWithMetadata",
            "ba{sv}",
            vec![
                zbus::zvariant::Value::from(true),
                zbus::zvariant::Value::from(meta),
            ],
        ),
    )
    .await
    .expect("EmitSignal");
    let st = agent
        .wait_status("shutdown handled", |s| s.last_drain.is_some())
        .await;
    let d = st.last_drain.as_ref().expect("drain");
    assert_eq!(d.kind, nodeward::logind::ShutdownKind::Reboot, "{st}");
    assert_eq!(d.policy, nodeward::config::ShutdownPolicy::Cordon, "{st}");
    assert_eq!(d.outcome, ShutdownOutcome::Cordoned, "{st}");
    assert_eq!(st.lock, nodeward::agent::state::Lock::Released);
    assert!(cordoned_by_us(&emu_node(&emu)));
    assert!(emu.evictions().is_empty(), "the reboot policy only cordons");
    h.shutdown().await;
}

/// Idle, the agent sends nothing but its watches' renewals: no gets, no patches, no lists.
#[tokio::test]
async fn idle_agent_sends_no_requests() {
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: None,
        dropin_dir: None,
        extra: "",
    });
    agent.write_flannel();
    wait_node(&emu, "schedulable", schedulable).await;
    agent
        .wait_status("ready", |s| s.phase == nodeward::agent::state::Phase::Ready)
        .await;
    emu.clear_requests();
    // Measuring an absence takes a window; nothing to await here.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts = emu.request_counts();
    let busy: Vec<_> = counts
        .iter()
        .filter(|c| c.count > 0 && c.verb != "watch")
        .collect();
    assert!(
        busy.is_empty(),
        "idle requests: {busy:?}\n{}",
        agent.log_text()
    );
}

/// A machine that goes down before kubeadm join registered its Node has nothing to drain: the
/// lock goes at once instead of at the deadline.
#[tokio::test]
async fn logind_shutdown_before_the_node_registered_releases_at_once() {
    let h = match LogindHarness::start(Options {
        mode: Mode::DbusmockLogind,
        ..Options::default()
    })
    .await
    {
        Ok(h) => h,
        Err(e) => panic!("cannot start the logind harness: {e}"),
    };
    let emu = emulator().await;
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: None,
        extra: "#DROPIN\n[drain]\ntimeout = \"4s\"\n",
    });
    agent
        .wait_status("lock held, node not registered", |s| {
            s.lock == nodeward::agent::state::Lock::Held
                && s.gates
                    .iter()
                    .any(|g| g.reason == "node not registered yet")
        })
        .await;
    let t0 = Instant::now();
    h.emit_prepare_for_shutdown(true).await.expect("signal");
    let st = agent
        .wait_status("shutdown handled", |s| s.last_drain.is_some())
        .await;
    assert_eq!(
        st.last_drain.as_ref().map(|d| &d.outcome),
        Some(&ShutdownOutcome::NotRegistered),
        "{st}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "released at once: {:?}",
        t0.elapsed()
    );
    assert_eq!(st.lock, nodeward::agent::state::Lock::Released);
    h.shutdown().await;
}

/// A health endpoint that answers 200 or 503, as told.
async fn health_server(healthy: Arc<std::sync::atomic::AtomicBool>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let healthy = healthy.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                // One request per connection is enough for the probe; answer and close.
                let _ = sock.read(&mut buf).await;
                let status = if healthy.load(std::sync::atomic::Ordering::SeqCst) {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let _ = sock
                    .write_all(
                        format!(
                            "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    format!("http://{addr}/health")
}

/// An http gate (a CNI health port): 2xx passes, 503 puts the taint back.
#[tokio::test]
async fn http_gate_follows_the_health_endpoint() {
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let url = health_server(healthy.clone()).await;
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: None,
        dropin_dir: None,
        extra: &format!(
            "#DROPIN\n[gates]\nhttp_interval = \"100ms\"\nhttp = [{{ url = \"{url}\" }}]\n"
        ),
    });
    agent.write_flannel();
    wait_node(&emu, "schedulable", schedulable).await;
    healthy.store(false, std::sync::atomic::Ordering::SeqCst);
    wait_node(&emu, "taint back after a 503", has_taint).await;
    let st = agent
        .wait_status("http gate failing", |s| {
            s.gates
                .iter()
                .any(|g| g.gate.starts_with("http") && g.reason.contains("503"))
        })
        .await;
    assert!(st.startup_taint, "{st}");
    healthy.store(true, std::sync::atomic::Ordering::SeqCst);
    wait_node(&emu, "schedulable again", schedulable).await;
}

// ---------------------------------------------------------------------------------------------
// Before the node joined: no kubeconfig yet, API server out of reach (issue 11)
// ---------------------------------------------------------------------------------------------

async fn dbusmock_logind() -> LogindHarness {
    match LogindHarness::start(Options {
        mode: Mode::DbusmockLogind,
        ..Options::default()
    })
    .await
    {
        Ok(h) => h,
        Err(e) => panic!("cannot start the logind harness: {e}"),
    }
}

/// The emulator's kubeconfig with its server replaced by `server`.
fn kubeconfig_with_server(emu: &EmulatorHandle, server: &str) -> String {
    let text = std::fs::read_to_string(emu.kubeconfig_path()).expect("emulator kubeconfig");
    text.lines()
        .map(|l| match l.split_once("server:") {
            Some((indent, _)) => format!("{indent}server: {server}"),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// cloud-init starts the agent before `kubeadm join` writes kubelet.conf (and before
/// /etc/kubernetes exists): the agent keeps running, holds the lock, is READY, says what it waits
/// for, and picks the kubeconfig up through inotify the moment it appears.
#[tokio::test]
async fn logind_agent_waits_for_its_kubeconfig_holding_the_lock() {
    let h = dbusmock_logind().await;
    let emu = emulator().await;
    let later = tempfile::tempdir().expect("tempdir");
    let kubeconfig = later.path().join("etc/kubernetes/kubelet.conf");
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: None,
        extra: &format!(
            "#DROPIN\n[node]\nkubeconfig = \"{}\"\n",
            kubeconfig.display()
        ),
    });
    let st = agent
        .wait_status("lock held and ready without a kubeconfig", |s| {
            s.lock == nodeward::agent::state::Lock::Held && s.ready
        })
        .await;
    assert!(
        st.waiting_for
            .contains(&format!("waiting for {}", kubeconfig.display()))
            && st.waiting_for.contains("holding the shutdown lock"),
        "{st}"
    );
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    // As kubeadm does: the directory first, then the file, written whole.
    let dir = kubeconfig.parent().expect("parent");
    std::fs::create_dir_all(dir).expect("mkdir");
    let tmp = dir.join(".kubelet.conf.tmp");
    std::fs::copy(emu.kubeconfig_path(), &tmp).expect("copy");
    std::fs::rename(&tmp, &kubeconfig).expect("rename");
    let st = agent
        .wait_status("node seen through the new kubeconfig", |s| {
            s.node_registered
        })
        .await;
    assert!(!st.waiting_for.contains("kubelet.conf"), "{st}");
    agent.write_flannel();
    wait_node(&emu, "schedulable", schedulable).await;
    let log = agent.log_text();
    assert_eq!(
        log.matches("waiting for the kubeconfig").count(),
        1,
        "one line for the wait, not one per retry:\n{log}"
    );
    h.shutdown().await;
}

/// A shutdown before the node joined has nothing to drain: the lock goes at once.
#[tokio::test]
async fn logind_shutdown_without_a_kubeconfig_releases_at_once() {
    let h = dbusmock_logind().await;
    let emu = emulator().await;
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: None,
        extra: "#DROPIN\n[node]\nkubeconfig = \"/nonexistent/nodeward-test/kubelet.conf\"\n",
    });
    agent
        .wait_status("lock held", |s| {
            s.lock == nodeward::agent::state::Lock::Held
        })
        .await;
    let t0 = Instant::now();
    h.emit_prepare_for_shutdown(true).await.expect("signal");
    let st = agent
        .wait_status("shutdown handled", |s| s.last_drain.is_some())
        .await;
    assert!(
        st.last_drain
            .as_ref()
            .is_some_and(|d| d.outcome == ShutdownOutcome::NoKubeconfig),
        "{st}"
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(st.lock, nodeward::agent::state::Lock::Released);
    h.shutdown().await;
}

/// With the API server out of reach the agent still takes the lock and sends READY (so
/// `systemctl restart` and an upgrade's try-restart do not hang), says so in its STATUS, and
/// logs the failure once, not once per retry.
#[tokio::test]
async fn logind_api_unreachable_at_start_ready_with_the_lock_and_quiet() {
    let h = dbusmock_logind().await;
    let emu = emulator().await;
    // An "API server" that accepts each connection and closes it at once, counting them.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let port = listener.local_addr().expect("addr").port();
    let (tried, mut attempts) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            drop(conn);
            let _ = tried.send(());
        }
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubelet.conf");
    std::fs::write(
        &kubeconfig,
        kubeconfig_with_server(&emu, &format!("http://127.0.0.1:{port}")),
    )
    .expect("kubeconfig");
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: None,
        extra: &format!(
            "#DROPIN\n[node]\nkubeconfig = \"{}\"\n",
            kubeconfig.display()
        ),
    });
    let t0 = Instant::now();
    let st = agent
        .wait_status("ready, API server unreachable", |s| {
            s.ready && s.waiting_for.starts_with("API server unreachable")
        })
        .await;
    assert_eq!(st.lock, nodeward::agent::state::Lock::Held, "{st}");
    assert!(
        st.waiting_for.ends_with("; holding the shutdown lock"),
        "{st}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "READY took {:?}",
        t0.elapsed()
    );
    // The watches keep retrying; the log does not grow with them.
    let until = tokio::time::Instant::now() + SOON;
    for n in 0..8 {
        tokio::time::timeout_at(until, attempts.recv())
            .await
            .unwrap_or_else(|_| panic!("only {n} connection attempts; the agent stopped retrying"));
    }
    let log = agent.log_text();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("failed; retrying"))
        .filter_map(|l| l.split(" error=").nth(1))
        .collect();
    let distinct: std::collections::BTreeSet<&str> = errors.iter().copied().collect();
    assert!(
        !errors.is_empty() && errors.len() == distinct.len(),
        "{} retry lines for 8 attempts, {} distinct errors (each logged once expected):\n{log}",
        errors.len(),
        distinct.len()
    );
    h.shutdown().await;
}

/// An operator's `nodeward drain` with the agent's config, which must succeed.
async fn operators_drain(agent: &AgentProc) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .arg("drain")
        .arg("--config")
        .arg(agent.config_file())
        .output()
        .await
        .expect("nodeward drain");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The Node's `nodeward.io/Draining` condition: (status, reason).
fn draining_condition(n: &Node) -> Option<(String, String)> {
    let conditions = n.status.as_ref()?.conditions.as_ref()?;
    let c = conditions
        .iter()
        .find(|c| c.type_ == "nodeward.io/Draining")?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

/// A shutdown cancelled while its drain waits on a budget: the drain is stopped, not dropped,
/// so its ending runs — the Node's `nodeward.io/Draining` turns False saying it was cancelled,
/// the status file no longer says "draining now", and the cordon goes.
#[tokio::test]
async fn logind_a_cancelled_shutdown_ends_its_drain_on_the_node() {
    let h = dbusmock_logind().await;
    let emu = emulator().await;
    seed_tainted_node(&emu);
    seed_flannel(&emu, true);
    seed_workload(&emu, 3);
    emu.create(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "web"}}}
    }))
    .expect("pdb");
    let agent = spawn_agent(Setup {
        emu: &emu,
        bus: Some(h.bus_address()),
        dropin_dir: None,
        extra: "#DROPIN\n[drain]\ntimeout = \"60s\"\n",
    });
    agent
        .wait_status("lock held", |s| {
            s.lock == nodeward::agent::state::Lock::Held
        })
        .await;
    agent.write_flannel();
    wait_node(&emu, "schedulable", schedulable).await;
    h.emit_prepare_for_shutdown(true).await.expect("signal");
    agent
        .wait_status("the drain waits on the budget", |s| {
            s.draining.as_ref().is_some_and(|d| d.blocked.len() == 3)
        })
        .await;
    wait_node(&emu, "Draining True", |n| {
        draining_condition(n).is_some_and(|(s, _)| s == "True")
    })
    .await;
    h.emit_prepare_for_shutdown(false).await.expect("cancel");
    let n = wait_node(&emu, "Draining False", |n| {
        draining_condition(n).is_some_and(|(s, _)| s == "False")
    })
    .await;
    assert_eq!(
        draining_condition(&n).map(|(_, r)| r).as_deref(),
        Some("DrainCancelled")
    );
    let st = agent
        .wait_status("not draining", |s| s.draining.is_none())
        .await;
    assert_eq!(st.lock, nodeward::agent::state::Lock::Held, "{st}");
    wait_node(&emu, "our cordon lifted", schedulable).await;
    h.shutdown().await;
}

/// While `nodeward cluster shutdown`'s intent is recorded and live, the agent's shutdown drain
/// knows it (read once as the drain starts) and says so; without the record it does not, and
/// (issue 58, item 3) a stale record — its node does not hold the shutdown's cordon (an
/// interrupted shutdown, uncordoned by hand) — is said and not obeyed.
#[tokio::test]
async fn logind_a_shutdown_drain_reads_the_cluster_shutdowns_intent() {
    for (recorded, held) in [(false, false), (true, true), (true, false)] {
        let h = dbusmock_logind().await;
        let emu = emulator().await;
        seed_tainted_node(&emu);
        seed_flannel(&emu, true);
        seed_workload(&emu, 1);
        if recorded {
            emu.create(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": nodeward::names::CLUSTER_SHUTDOWN_CONFIGMAP,
                             "namespace": nodeward::names::CLUSTER_SHUTDOWN_NAMESPACE},
                "data": {"phase": "stopped", "cordoned": format!("[\"{NODE}\"]")}
            }))
            .expect("intent");
        }
        let agent = spawn_agent(Setup {
            emu: &emu,
            bus: Some(h.bus_address()),
            dropin_dir: None,
            extra: "#DROPIN\n[drain]\ntimeout = \"60s\"\n",
        });
        agent
            .wait_status("lock held", |s| {
                s.lock == nodeward::agent::state::Lock::Held
            })
            .await;
        agent.write_flannel();
        wait_node(&emu, "schedulable", schedulable).await;
        if held {
            let c = client(&emu).await;
            nodeward::drain::cordon(&c, NODE, nodeward::cluster::CORDON_REASON, false)
                .await
                .expect("the shutdown's cordon");
        }
        h.emit_prepare_for_shutdown(true).await.expect("signal");
        let st = agent
            .wait_status("the drain ended", |s| s.last_drain.is_some())
            .await;
        let log = agent.log_text();
        let said = log.contains("a cluster shutdown is recorded: the drain waits on no budget");
        assert_eq!(said, recorded && held, "{st}\n{log}");
        let stale =
            log.contains("a cluster shutdown is recorded but this node does not hold its cordon");
        assert_eq!(stale, recorded && !held, "{st}\n{log}");
        h.shutdown().await;
    }
}
