//! Drain benchmark: nodeward against `kubectl drain` on the same emulator, in the same run.
//!
//! Prints, per scenario, the median of several runs for each tool and their ratio:
//! 1. 110 pods with grace period 0 on one node (kubelet's default pod limit);
//! 2. one pod blocked by a PodDisruptionBudget that opens after a delay: how long after the
//!    budget opens the pod is evicted (kubectl retries a 429 every 5 s).
//!
//! Run: `cargo bench --bench drain` (KUBECTL=/path/to/kubectl picks the kubectl; default
//! `kubectl` on PATH). Figures, not assertions: timing depends on the machine.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_emulator::{Emulator, EmulatorHandle, EmulatorOptions, EvictionOutcome, PodSeed};
use serde_json::json;

const PODS: usize = 110;
const RUNS: usize = 3;
/// When the budget opens after the drain started.
const BUDGET_OPENS_AFTER: Duration = Duration::from_millis(1500);

fn kubectl() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_string())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn seed_node(emu: &EmulatorHandle, node: &str, pods: usize) {
    emu.seed_node(node).expect("node");
    for i in 0..pods {
        emu.seed_pod(
            PodSeed::new("default", &format!("{node}-p{i}"))
                .node(node)
                .label("app", node)
                .owner("ReplicaSet", node)
                .grace(0)
                .ready(true),
        )
        .expect("pod");
    }
}

fn run_nodeward(emu: &EmulatorHandle, node: &str) -> Duration {
    let t = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .args(["drain", node, "--timeout", "120s", "--kubeconfig"])
        .arg(emu.kubeconfig_path())
        .env("RUST_LOG", "warn")
        .env("NODEWARD_CONFIG", "/nonexistent/nodeward-bench.toml")
        .env_remove("NODEWARD_CONFIG")
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run nodeward");
    let d = t.elapsed();
    assert!(status.success(), "nodeward drain failed: {status}");
    d
}

fn run_kubectl(emu: &EmulatorHandle, node: &str) -> Duration {
    let t = Instant::now();
    let out = Command::new(kubectl())
        .args([
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=120s",
            "--kubeconfig",
        ])
        .arg(emu.kubeconfig_path())
        .output()
        .expect("run kubectl: install it (scripts/test installs a pinned one) or set KUBECTL");
    let d = t.elapsed();
    assert!(
        out.status.success(),
        "kubectl drain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    d
}

fn pods_left(emu: &EmulatorHandle, node: &str) -> usize {
    emu.list("pods", Some("default"))
        .iter()
        .filter(|p| p.pointer("/spec/nodeName").and_then(|v| v.as_str()) == Some(node))
        .count()
}

/// Seeds one pod under `minAvailable: 1`, starts `drain`, opens the budget after a delay by
/// bringing up a replacement elsewhere, and returns how long after the opening the pod was
/// evicted (from the emulator's own eviction log).
fn budget_latency(
    emu: &Arc<EmulatorHandle>,
    node: &str,
    drain: impl FnOnce(&EmulatorHandle, &str) -> Duration,
) -> Duration {
    seed_node(emu, node, 1);
    emu.create(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": node, "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": node}}}
    }))
    .expect("pdb");
    let emu2 = Arc::clone(emu);
    let node2 = node.to_string();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(BUDGET_OPENS_AFTER);
        let opened = chrono::Utc::now();
        emu2.seed_pod(
            PodSeed::new("default", &format!("{node2}-replacement"))
                .node("elsewhere")
                .label("app", &node2)
                .owner("ReplicaSet", &node2)
                .ready(true),
        )
        .expect("replacement");
        opened
    });
    drain(emu, node);
    let opened = opener.join().expect("opener");
    let evicted = emu
        .evictions()
        .into_iter()
        .find(|e| {
            e.pod == format!("{node}-p0") && matches!(e.outcome, EvictionOutcome::Evicted { .. })
        })
        .expect("pod was evicted");
    (evicted.at - opened).to_std().unwrap_or_default()
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let emu = Arc::new(
        rt.block_on(Emulator::start(EmulatorOptions {
            grace_scale: 0.0,
            ..EmulatorOptions::default()
        }))
        .expect("emulator"),
    );
    emu.seed_node("elsewhere").expect("node");
    let version = Command::new(kubectl())
        .args(["version", "--client"])
        .output();
    let version = version
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e}; install kubectl or set KUBECTL",
                kubectl()
            )
        });
    println!(
        "drain benchmark: {PODS} pods, grace 0, median of {RUNS} runs; kubectl = {} ({version})",
        kubectl()
    );

    let (mut nw, mut kc) = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        let node = format!("nw-{run}");
        seed_node(&emu, &node, PODS);
        nw.push(run_nodeward(&emu, &node));
        assert_eq!(pods_left(&emu, &node), 0, "nodeward left pods");
        let node = format!("kc-{run}");
        seed_node(&emu, &node, PODS);
        kc.push(run_kubectl(&emu, &node));
        assert_eq!(pods_left(&emu, &node), 0, "kubectl left pods");
    }
    let (nw, kc) = (median(nw), median(kc));
    println!(
        "110 pods:            nodeward {:>8.1} ms   kubectl drain {:>8.1} ms   ratio {:>6.1}x",
        nw.as_secs_f64() * 1e3,
        kc.as_secs_f64() * 1e3,
        kc.as_secs_f64() / nw.as_secs_f64()
    );

    let (mut nw, mut kc) = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        nw.push(budget_latency(&emu, &format!("pdb-nw-{run}"), run_nodeward));
        kc.push(budget_latency(&emu, &format!("pdb-kc-{run}"), run_kubectl));
    }
    let (nw, kc) = (median(nw), median(kc));
    println!(
        "PDB opens after {} ms: evicted {:>8.1} ms after opening (nodeward) vs {:>8.1} ms (kubectl drain)   ratio {:>6.1}x",
        BUDGET_OPENS_AFTER.as_millis(),
        nw.as_secs_f64() * 1e3,
        kc.as_secs_f64() * 1e3,
        kc.as_secs_f64() / nw.as_secs_f64().max(1e-6)
    );
}
