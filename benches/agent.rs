//! Agent benchmark: the figures issue 5 asks for, printed, never asserted.
//!
//! 1. gate → schedulable: from the flannel subnet file appearing (renamed into place, as flannel
//!    writes it) to the Node being schedulable in the emulator (taint gone), seen through a watch;
//! 2. idle footprint: the agent's RSS from /proc after it settled, and the API requests it makes
//!    per minute while idle, from the emulator's counters;
//! 3. shutdown: PowerOff (real logind, private bus) to logind starting poweroff.target, with 110
//!    pods of grace 0 on the node, against a bare in-process drain of the same pods.
//!
//! Run: `cargo bench --bench agent` (root and `apt-get install -y systemd dbus python3-dbusmock
//! util-linux` for the logind harness). IDLE_SECONDS (default 30) sets the idle window.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube_emulator::{Emulator, EmulatorHandle, EmulatorOptions, PodSeed};
use logind_harness::{LogindHarness, Mode, Options};
use serde_json::json;

const NODE: &str = "worker-1";
const TAINT: &str = "readiness.k8s.io/nodeward";
const GATE_RUNS: usize = 21;
const SHUTDOWN_RUNS: usize = 3;
const PODS: usize = 110;
const SOON: Duration = Duration::from_secs(30);

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

async fn emulator() -> Arc<EmulatorHandle> {
    let emu = Emulator::start(EmulatorOptions {
        grace_scale: 0.001,
        ..EmulatorOptions::default()
    })
    .await
    .expect("emulator");
    let mut n = kube_emulator::node_json(NODE);
    n["spec"]["taints"] = json!([{"key": TAINT, "effect": "NoSchedule"}]);
    emu.create(n).expect("node");
    emu.create(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-flannel"}}),
    )
    .expect("ns");
    emu.seed_daemonset("kube-flannel", "kube-flannel-ds")
        .expect("daemonset");
    emu.seed_pod(
        PodSeed::new("kube-flannel", "kube-flannel-ds-x")
            .node(NODE)
            .label("app", "flannel")
            .owner("DaemonSet", "kube-flannel-ds")
            .ready(true),
    )
    .expect("flannel");
    Arc::new(emu)
}

struct Agent {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    flannel: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(emu: &EmulatorHandle, h: &LogindHarness, drain_timeout: &str) -> Agent {
    let dir = tempfile::tempdir().expect("tempdir");
    let flannel = dir.path().join("run/flannel/subnet.env");
    let config = format!(
        "[node]\nname = \"{NODE}\"\nkubeconfig = \"{}\"\n[agent]\nstatus_file = \"{}\"\nstartup_taint = \"agent\"\n\
         [drain]\ntimeout = \"{drain_timeout}\"\n[shutdown]\nsafety_margin = \"1s\"\nlogind_dropin = \"{}\"\n\
         [gates]\nfile = [{{ path = \"{}\", contains = \"FLANNEL_SUBNET=\" }}]\n",
        emu.kubeconfig_path().display(),
        dir.path().join("status.json").display(),
        h.dropin_dir().join("90-nodeward.conf").display(),
        flannel.display()
    );
    std::fs::write(dir.path().join("config.toml"), config).expect("config");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .arg("agent")
        .arg("--config")
        .arg(dir.path().join("config.toml"))
        .env("RUST_LOG", "warn")
        .env("DBUS_SYSTEM_BUS_ADDRESS", h.bus_address())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        // Warnings and errors only: they belong in the benchmark's output.
        .spawn()
        .expect("spawn agent");
    Agent {
        child,
        _dir: dir,
        flannel,
    }
}

fn write_flannel(path: &std::path::Path) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, "FLANNEL_SUBNET=10.244.1.1/24\n").expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

fn schedulable(n: &Node) -> bool {
    let spec = n.spec.as_ref();
    !spec.and_then(|s| s.unschedulable).unwrap_or(false)
        && !spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == TAINT))
}

/// A node watch that reports each change of "schedulable".
async fn node_watch(emu: &EmulatorHandle) -> futures::stream::BoxStream<'static, bool> {
    let client = nodeward::kube_client::client(Some(emu.kubeconfig_path()))
        .await
        .expect("client");
    let api: kube::Api<Node> = kube::Api::all(client);
    watcher(
        api,
        watcher::Config::default().fields(&format!("metadata.name={NODE}")),
    )
    .applied_objects()
    .filter_map(|n| async move { n.ok().map(|n| schedulable(&n)) })
    .boxed()
}

async fn until(stream: &mut futures::stream::BoxStream<'static, bool>, want: bool) {
    tokio::time::timeout(SOON, async {
        while let Some(s) = stream.next().await {
            if s == want {
                return;
            }
        }
        panic!("watch ended");
    })
    .await
    .expect("node reached the state in time");
}

async fn harness(cap: Duration) -> LogindHarness {
    LogindHarness::start(Options {
        mode: Mode::Real,
        inhibit_delay_max: cap,
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cannot start the logind harness: {e}"))
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

async fn gate_and_idle() {
    let h = harness(Duration::from_secs(120)).await;
    let emu = emulator().await;
    let mut watch = node_watch(&emu).await;
    let agent = spawn(&emu, &h, "90s");
    let mut figures = Vec::new();
    for _ in 0..GATE_RUNS {
        // Flannel gone: the agent puts the taint back; then the file appears again.
        let _ = std::fs::remove_file(&agent.flannel);
        until(&mut watch, false).await;
        let t0 = Instant::now();
        write_flannel(&agent.flannel);
        until(&mut watch, true).await;
        figures.push(t0.elapsed());
    }
    let mut sorted = figures.clone();
    sorted.sort();
    println!(
        "gate -> schedulable ({GATE_RUNS} runs): median {}, min {}, max {}  (target < 100 ms median)",
        ms(median(figures)),
        ms(sorted[0]),
        ms(sorted[sorted.len() - 1])
    );

    let idle: u64 = std::env::var("IDLE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    emu.clear_requests();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(idle)).await;
    let window = t0.elapsed();
    let counts = emu.request_counts();
    let total: u64 = counts.iter().map(|c| c.count).sum();
    let per_min = total as f64 * 60.0 / window.as_secs_f64();
    let rss = rss_kib(agent.child.id());
    println!("idle RSS: {:.1} MiB (target < 15 MiB)", rss as f64 / 1024.0);
    println!(
        "idle API requests: {total} in {:.0} s = {per_min:.2}/min (target: watch renewals only)",
        window.as_secs_f64()
    );
    for c in counts.iter().filter(|c| c.count > 0) {
        println!(
            "  {} {} ({}): {}",
            c.verb, c.resource, c.user_agent, c.count
        );
    }
    drop(agent);
    h.shutdown().await;
}

async fn shutdown_overhead() {
    let mut agent_figures = Vec::new();
    let mut bare_figures = Vec::new();
    for _ in 0..SHUTDOWN_RUNS {
        // The same 110 pods, drained by the engine alone.
        let emu = emulator().await;
        seed_pods(&emu);
        let client = nodeward::kube_client::client(Some(emu.kubeconfig_path()))
            .await
            .expect("client");
        let opts = nodeward::drain::DrainOptions::from_settings(
            &nodeward::config::Settings::default().drain,
            "bench",
        );
        let t0 = Instant::now();
        let r = nodeward::drain::drain(&client, NODE, &opts)
            .await
            .expect("drain");
        bare_figures.push(t0.elapsed());
        assert_eq!(r.evicted.len(), PODS, "{r}");

        let h = harness(Duration::from_secs(120)).await;
        let emu = emulator().await;
        seed_pods(&emu);
        let mut watch = node_watch(&emu).await;
        let agent = spawn(&emu, &h, "90s");
        write_flannel(&agent.flannel);
        until(&mut watch, true).await;
        h.wait_for_inhibitors(SOON, |l| l.iter().any(|i| i.who == "nodeward"))
            .await
            .expect("lock");
        let t0 = Instant::now();
        h.power_off().await.expect("PowerOff");
        h.wait_for_unit_started("poweroff.target", SOON)
            .await
            .expect("poweroff");
        agent_figures.push(t0.elapsed());
        let left = emu
            .list("pods", Some("default"))
            .iter()
            .filter(|p| p.pointer("/spec/nodeName").and_then(|v| v.as_str()) == Some(NODE))
            .count();
        assert_eq!(left, 0, "every pod left before the lock was released");
        drop(agent);
        h.shutdown().await;
    }
    let a = median(agent_figures);
    let b = median(bare_figures);
    println!(
        "PowerOff -> poweroff.target, {PODS} pods grace 0 ({SHUTDOWN_RUNS} runs): median {}; bare drain of the same pods: {}; overhead {} (target < 300 ms)",
        ms(a),
        ms(b),
        ms(a.saturating_sub(b))
    );
}

fn seed_pods(emu: &EmulatorHandle) {
    for i in 0..PODS {
        emu.seed_pod(
            PodSeed::new("default", &format!("p{i}"))
                .node(NODE)
                .label("app", "web")
                .owner("ReplicaSet", "web")
                .grace(0)
                .ready(true),
        )
        .expect("pod");
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    gate_and_idle().await;
    shutdown_overhead().await;
}
