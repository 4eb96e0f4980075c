//! The soak: the agent and the scaler against the real control plane for `SOAK_SECONDS` (600 by
//! default) while faults come on a schedule, each cycle of 120 s:
//!
//! | at | fault |
//! |---|---|
//! | 0 s | kube-apiserver frozen (SIGSTOP) for 15 s |
//! | 25 s | etcd restarted (SIGTERM, then the same command again) |
//! | 40 s | logind restarted (the agent must take its lock again) |
//! | 55 s | every Node flaps NotReady: kwok (the kubelets) frozen, the Nodes' Ready set False, for 50 s, longer than the scaler's `unready_delete_time` |
//!
//! It asserts what must hold through all of it — no process exits (a panic), the agent's lock is
//! never missing outside the seconds after a logind restart, no machine is created twice or
//! deleted (the cluster-health guard holds while the Nodes are NotReady), RSS and open fds do not
//! grow past twice their warmed-up values — and prints the figures. `scripts/soak` runs it on a
//! fresh control plane; `scripts/test` runs one cycle.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Cluster, Proc, spawn_agent_with_logind, unique, write_flannel};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use logind_harness::{LogindHarness, Mode, Options};
use serde_json::json;

const API_TOKEN: &str = "cherry-soak-token-7e3a";
const CYCLE: Duration = Duration::from_secs(120);
const MACHINES: u32 = 4;

/// A process's resident memory (kB) and open file descriptors.
fn footprint(pid: u32) -> (u64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    (rss, fds)
}

/// Stops a control-plane component and starts the same command line again, as a supervisor
/// would; its new pid goes where `scripts/control-plane down` finds it.
fn restart(dir: &Path, component: &str) {
    let pidfile = dir.join(format!("{component}.pid"));
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    // NUL-terminated arguments, some of them empty (`--listen-metrics-urls ""`): only the
    // piece after the last NUL is no argument.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    let argv: Vec<String> = cmdline
        .strip_suffix(&[0])
        .unwrap_or(&cmdline)
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let env: Vec<(String, String)> = std::fs::read(format!("/proc/{pid}/environ"))
        .expect("environ")
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).expect("cwd");
    let target = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM);
    let t0 = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() && t0.elapsed() < Duration::from_secs(15) {
        // A zombie of ours counts as gone.
        if std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        }) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL);
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join(format!("{component}.log")))
        .expect("log");
    let child = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env_clear()
        .envs(env)
        .current_dir(cwd)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("restart {component}: {e}"));
    let new = child.id().to_string();
    // Reaped when it ends (scripts/control-plane down stops it; this is only its parent).
    let mut child = child;
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    std::fs::write(&pidfile, &new).expect("pid file");
    let mut pids = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
    pids.push_str(&new);
    pids.push('\n');
    std::fs::write(dir.join("pids"), pids).expect("pids");
}

/// Sets every listed Node's Ready condition to False (its kubelet frozen, nothing posts True).
async fn flap_not_ready(admin: &kube::Client, nodes: &[String]) {
    let api: Api<Node> = Api::all(admin.clone());
    for n in nodes {
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "False",
            "reason": "SoakFlap", "message": "the soak froze this node's kubelet",
            "lastTransitionTime": jiff::Timestamp::now().to_string(),
            "lastHeartbeatTime": jiff::Timestamp::now().to_string()}]}});
        let _ = api
            .patch_status(n, &PatchParams::default(), &Patch::Strategic(&patch))
            .await;
    }
}

fn ours(list: &[logind_harness::Inhibitor]) -> usize {
    list.iter()
        .filter(|i| i.who == "nodeward" && i.mode == "delay" && i.what.contains("shutdown"))
        .count()
}

/// What the sampler saw.
#[derive(Debug, Default)]
struct Seen {
    samples: u32,
    lock_missing: u32,
    lock_missing_after_restart: u32,
    guard_seen: bool,
    max_servers: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the soak: scripts/soak runs it on a fresh real control plane (scripts/test, one cycle)"]
async fn agent_and_scaler_survive_a_schedule_of_faults() {
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let cluster = Cluster::real();
    let Cluster::Real { dir, .. } = &cluster else {
        unreachable!("real only")
    };
    let dir = dir.clone();
    let admin = cluster.admin().await;
    let mut logind = LogindHarness::start(Options {
        mode: Mode::Real,
        inhibit_delay_max: Duration::from_secs(30),
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cannot start the logind harness: {e}"));

    // The agent's node, and the scaler's group of machines, all kwok nodes.
    let agent_node = unique("soak-agent");
    cluster.add_node(&agent_node, &[], json!([])).await;
    let mut agent: Proc = spawn_agent_with_logind(
        &agent_node,
        &cluster.node_kubeconfig(&agent_node),
        "",
        Some((logind.bus_address(), logind.dropin_dir())),
    );
    write_flannel(&agent);
    logind
        .wait_for_inhibitors(Duration::from_secs(30), |l| ours(l) == 1)
        .await
        .expect("the agent takes its lock");

    let group = unique("soak").replace('-', "");
    let cherry = common::cherry_emulator(API_TOKEN).await;
    let mut nodes = vec![agent_node.clone()];
    for i in 0..MACHINES {
        let host = format!("{group}-{i}");
        cherry.insert_server(&host, json!({"k8s-cluster": "soak", "k8s-nodepool": group}));
        cluster
            .add_node(
                &host,
                &[("nodeward.io/node-group", group.as_str())],
                json!([]),
            )
            .await;
        nodes.push(host);
    }
    let values = tempfile::NamedTempFile::new().expect("values");
    std::fs::write(
        values.path(),
        "api_server_endpoint = \"10.0.2.100:6443\"\nca_cert_hashes = [\"sha256:8c3d1e4f0a9b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d\"]\nkubernetes_version = \"v1.37.2\"\npackage_url = \"https://10.0.2.101/nodeward.{ext}\"\n",
    )
    .expect("values");
    let mut settings = nodeward::config::Settings::default();
    let s = &mut settings.scaler;
    s.cluster_name = "soak".into();
    s.values = values.path().to_path_buf();
    s.cherry.api_url = cherry.url();
    s.cherry.project_id = Some(7);
    s.cherry.request_timeout = Duration::from_secs(5);
    s.scan_interval = Duration::from_secs(1);
    s.lease_duration = Duration::from_secs(5);
    s.metrics_address = None;
    s.unready_delete_time = Duration::from_secs(20);
    s.max_provision_time = Duration::from_secs(120);
    let mut g = common::scaler_group(&group, MACHINES);
    g.min = MACHINES;
    s.groups = vec![g];
    let scaler = common::real_scaler(&cluster, &settings, API_TOKEN, "soak").await;
    let metrics = scaler.metrics();
    let scaler_task = tokio::spawn(async move {
        scaler
            .run(std::future::pending())
            .await
            .expect("the scaler runs");
    });

    let started = Instant::now();
    let me = std::process::id();
    let mut warm: Option<((u64, usize), (u64, usize))> = None;
    let mut seen = Seen::default();
    let mut faults: Vec<String> = Vec::new();
    let mut last_logind_restart: Option<Instant> = None;
    let mut paused = None;
    let mut kwok = None;
    let mut cycle = u64::MAX;
    let mut done = [false; 3];
    while started.elapsed() < Duration::from_secs(seconds) {
        let elapsed = started.elapsed();
        if elapsed.as_secs() / CYCLE.as_secs() != cycle {
            cycle = elapsed.as_secs() / CYCLE.as_secs();
            done = [false; 3];
            paused = Some(cluster.pause("kube-apiserver"));
            faults.push(format!(
                "{:>4} s kube-apiserver frozen for 15 s",
                elapsed.as_secs()
            ));
        }
        let at = elapsed.as_secs() % CYCLE.as_secs();
        let t0 = Instant::now();
        if at >= 15 {
            paused = None;
        }
        if at >= 25 && !done[0] {
            done[0] = true;
            restart(&dir, "etcd");
            faults.push(format!(
                "{:>4} s etcd restarted ({} ms)",
                elapsed.as_secs(),
                t0.elapsed().as_millis()
            ));
        }
        if at >= 40 && !done[1] {
            done[1] = true;
            logind.restart_logind().await.expect("restart logind");
            last_logind_restart = Some(Instant::now());
            faults.push(format!(
                "{:>4} s logind restarted ({} ms)",
                elapsed.as_secs(),
                t0.elapsed().as_millis()
            ));
        }
        if at >= 55 && !done[2] {
            done[2] = true;
            kwok = Some(cluster.pause("kwok"));
            flap_not_ready(&admin, &nodes).await;
            faults.push(format!(
                "{:>4} s every Node NotReady for 50 s ({} ms)",
                elapsed.as_secs(),
                t0.elapsed().as_millis()
            ));
        }
        if at >= 105 {
            kwok = None;
        }
        // Once a minute in, with everything started and warm: the baseline.
        if warm.is_none() && started.elapsed() > Duration::from_secs(20) {
            warm = Some((footprint(agent.pid()), footprint(me)));
        }
        assert!(agent.running(), "the agent exited:\n{}", agent.log_text());
        assert!(!scaler_task.is_finished(), "the scaler stopped");
        if let Ok(Ok(list)) =
            tokio::time::timeout(Duration::from_secs(2), logind.list_inhibitors()).await
        {
            seen.samples += 1;
            if ours(&list) != 1 {
                if last_logind_restart.is_some_and(|t| t.elapsed() < Duration::from_secs(10)) {
                    seen.lock_missing_after_restart += 1;
                } else {
                    seen.lock_missing += 1;
                }
            }
        }
        seen.guard_seen |= metrics.guard_holding.get() == 1;
        let servers = cherry.servers();
        seen.max_servers = seen.max_servers.max(servers.len());
        assert!(
            cherry.deleted().is_empty(),
            "the scaler deleted machines {:?} during the faults",
            cherry.deleted()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(paused);
    drop(kwok);
    let end = (footprint(agent.pid()), footprint(me));
    let ((agent0, me0), (agent1, me1)) = (warm.expect("warmed up"), end);
    eprintln!(
        "soak: {} s, {} cycles of faults:",
        seconds,
        seconds.div_ceil(CYCLE.as_secs())
    );
    for f in &faults {
        eprintln!("  {f}");
    }
    eprintln!(
        "soak figures: agent RSS {} → {} kB, fds {} → {}; scaler (test process) RSS {} → {} kB, fds {} → {}; lock checks {}, missing {} (+{} within 10 s of a logind restart); machines {} (max {}), deleted {}; guard held: {}",
        agent0.0,
        agent1.0,
        agent0.1,
        agent1.1,
        me0.0,
        me1.0,
        me0.1,
        me1.1,
        seen.samples,
        seen.lock_missing,
        seen.lock_missing_after_restart,
        cherry.servers().len(),
        seen.max_servers,
        cherry.deleted().len(),
        seen.guard_seen
    );
    assert_eq!(
        seen.lock_missing, 0,
        "the agent's lock was missing outside logind restarts"
    );
    assert_eq!(
        seen.max_servers, MACHINES as usize,
        "a machine was created twice"
    );
    assert!(
        seen.guard_seen,
        "the NotReady flaps never made the cluster-health guard hold"
    );
    assert!(
        agent1.0 < agent0.0 * 2 && agent1.1 < agent0.1 * 2 + 8,
        "the agent grew"
    );
    assert!(
        me1.1 < me0.1 * 2 + 16,
        "the scaler's process leaked file descriptors"
    );
    scaler_task.abort();
    agent.stop();
    logind.shutdown().await;
    for n in &nodes {
        cluster.remove_node(n).await;
    }
}
