//! Figures on the real control plane (scripts/control-plane), side by side in one run:
//! 1. drain of 110 pods with grace 0: `nodeward drain` as the node's own identity vs
//!    `kubectl drain` as an operator vs a bare evictor (the floor: one list, one watch, every
//!    eviction at once, nothing else), and the API requests each made (from the audit log);
//! 2. a PodDisruptionBudget opens: how long until the blocked pod is evicted, both tools;
//! 3. flannel file → node schedulable: the agent (node identity) reports, the readiness
//!    controller (its ServiceAccount) untaints; median and p99 over 50 trials, beside the same
//!    figure for the agent-untaints-itself path on kube-emulator;
//! 4. one drain's metrics over time, as the agent serves them: 30 pods under a budget of
//!    maxUnavailable 3, the drain's metrics behind the agent's HTTP server scraped every 50 ms;
//!    the scrape time (this is a release build), and a plot of pods left, evictions and time to
//!    the deadline drawn into `NODEWARD_BENCH_PLOT` (default `target/drain-metrics.svg`).
//! 5. only when asked for (`NODEWARD_BENCH_ONLY=reboot-wave`, about 10 minutes): what a fleet
//!    of real agents waiting for coordinated reboots, then rebooting two at a time, costs the API
//!    server ([`reboot_wave`]).
//!
//! Run: `scripts/control-plane up DIR`, apply the shipped RBAC (scripts/test does both), then
//! `NODEWARD_CONTROL_PLANE=DIR KUBECTL=… cargo bench --bench real` (`NODEWARD_BENCH_ONLY=drain`,
//! `gates` or `metrics` for one part). Figures, not assertions.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

const PODS: i32 = 110;
const RUNS: usize = 3;
const TRIALS: usize = 50;
const BUDGET_OPENS_AFTER: Duration = Duration::from_millis(1500);
const STARTUP_TAINT: &str = "readiness.k8s.io/nodeward";
const PLOT_PODS: i32 = 30;
const SCRAPE_EVERY: Duration = Duration::from_millis(50);

#[path = "real/plot.rs"]
mod plot;
#[path = "real/reboot_wave.rs"]
mod reboot_wave;

struct Cp {
    dir: PathBuf,
    scratch: tempfile::TempDir,
}

impl Cp {
    fn kubeconfig(&self, args: &[&str], file: &str) -> PathBuf {
        let out = Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/control-plane"
        ))
        .arg("kubeconfig")
        .arg(&self.dir)
        .args(args)
        .output()
        .expect("scripts/control-plane kubeconfig");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let p = self.scratch.path().join(file);
        std::fs::write(&p, out.stdout).expect("write");
        p
    }
    fn audit_count(&self, user: &str) -> usize {
        let needle = format!("\"username\":\"{user}\"");
        std::fs::read_to_string(self.dir.join("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&needle) && l.contains("\"stage\":\"ResponseComplete\""))
            .count()
    }
}

async fn client(kc: &Path) -> kube::Client {
    nodeward::kube_client::client(Some(kc))
        .await
        .expect("client")
}

fn kubectl() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into())
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p99(v: &mut [Duration]) -> Duration {
    v.sort();
    v[(v.len() * 99).div_ceil(100).saturating_sub(1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn add_node(admin: &kube::Client, name: &str, taints: Value) {
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
            "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": taints},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "120"},
                   "capacity": {"cpu": "64", "memory": "256Gi", "pods": "120"},
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}
    }))
    .expect("node");
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &n)
        .await
        .expect("node");
}

async fn namespace(admin: &kube::Client, ns: &str) {
    let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns");
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &n)
        .await
        .expect("namespace");
}

/// A ReplicaSet of `n` grace-0 pods pinned to `node`, and waits until all run there.
async fn workload(admin: &kube::Client, ns: &str, node: &str, n: i32) {
    workload_on(admin, ns, json!({"kubernetes.io/hostname": node}), n).await;
}

/// A ReplicaSet of `n` grace-0 pods with `node_selector`, and waits until all run.
async fn workload_on(admin: &kube::Client, ns: &str, node_selector: Value, n: i32) {
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "w", "namespace": ns},
        "spec": {"replicas": n, "selector": {"matchLabels": {"app": "w"}},
            "template": {"metadata": {"labels": {"app": "w"}}, "spec": {
                "nodeSelector": node_selector,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}
    }))
    .expect("rs");
    Api::<ReplicaSet>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &rs)
        .await
        .expect("rs");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let t0 = Instant::now();
    loop {
        let running = pods
            .list(&ListParams::default())
            .await
            .expect("pods")
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running == usize::try_from(n).expect("n") {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{running}/{n} running"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes the run's namespace and node. (The workload is pinned to its node, so during a drain
/// the ReplicaSet's replacements stay Pending: both tools wait for the same thing, the evicted
/// pods gone.)
async fn cleanup(admin: &kube::Client, ns: &str, node: &str) {
    let _ = Api::<Namespace>::all(admin.clone())
        .delete(ns, &DeleteParams::default())
        .await;
    let _ = Api::<Node>::all(admin.clone())
        .delete(node, &DeleteParams::default())
        .await;
}

fn run_nodeward(kc: &Path, node: &str) -> Duration {
    let t = Instant::now();
    let st = Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .args(["drain", node, "--timeout", "120s", "--kubeconfig"])
        .arg(kc)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .status()
        .expect("nodeward");
    assert!(st.success(), "nodeward drain failed");
    t.elapsed()
}

fn run_kubectl(kc: &Path, node: &str) -> Duration {
    let t = Instant::now();
    let out = Command::new(kubectl())
        .args([
            "drain",
            node,
            "--ignore-daemonsets",
            "--force",
            "--grace-period=-1",
            "--timeout=120s",
        ])
        .arg(format!("--kubeconfig={}", kc.display()))
        .output()
        .expect("kubectl: set KUBECTL (tests/kube-emulator/install-kubectl.sh installs it)");
    assert!(
        out.status.success(),
        "kubectl drain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    t.elapsed()
}

/// The floor a drain can reach: in this process, a fresh client (TLS included, as the two tools
/// pay it), kube-runtime's watcher on the node's pods (one list, one watch; it lists again if the
/// API server drops the watch, as it does to watchers that fall behind a burst), every eviction
/// at once, and the wait for every pod's deletion. Nothing else: no cordon, no budgets, no
/// retries, no deadline.
async fn run_bare(kc: &Path, ns: &str, node: &str) -> Duration {
    use std::collections::BTreeSet;
    let t = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client(kc).await, ns);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = watcher(pods.clone(), config).boxed();
    let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
    // Applies one event to the pods left; `Some` once a listing is complete.
    let mut listing = BTreeSet::new();
    let mut step = |left: &mut Option<BTreeSet<String>>, event: watcher::Event<Pod>| match event {
        watcher::Event::Init => {
            listing.clear();
            None
        }
        watcher::Event::InitApply(p) => {
            listing.insert(name(&p));
            None
        }
        watcher::Event::InitDone => {
            let listed = std::mem::take(&mut listing);
            *left = match left {
                // The first listing: the pods to evict.
                None => listed,
                // A listing after a dropped watch: those of them still there.
                Some(left) => left.intersection(&listed).cloned().collect(),
            }
            .into();
            Some(())
        }
        watcher::Event::Delete(p) => {
            if let Some(left) = left {
                left.remove(&name(&p));
            }
            None
        }
        // The node is not cordoned (nothing else, as said): the ReplicaSet's replacements land
        // on it again and are no concern of this drain.
        watcher::Event::Apply(_) => None,
    };
    let mut left: Option<BTreeSet<String>> = None;
    loop {
        let event = events
            .next()
            .await
            .expect("the watcher runs")
            .expect("list the node's pods");
        if step(&mut left, event).is_some() {
            break;
        }
    }
    let names: Vec<String> = left.iter().flatten().cloned().collect();
    let params = kube::api::EvictParams::default();
    let evict_all = async {
        let evictions = names.iter().map(|n| pods.evict(n, &params));
        for r in futures::future::join_all(evictions).await {
            r.expect("eviction");
        }
    };
    // The watch is read while the evictions go out.
    let all_gone = async {
        while left.as_ref().is_some_and(|l| !l.is_empty()) {
            let event = events.next().await.expect("the watcher runs");
            // A dropped watch is an error the watcher recovers from by listing again.
            if let Ok(event) = event {
                step(&mut left, event);
            }
        }
    };
    tokio::join!(evict_all, all_gone);
    t.elapsed()
}

/// Time from the budget opening to the blocked pod's eviction.
async fn budget_latency(
    admin: &kube::Client,
    ns: &str,
    node: &str,
    drain: impl FnOnce() -> Duration + Send + 'static,
) -> Duration {
    workload(admin, ns, node, 1).await;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "w", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "w"}}}
    }))
    .expect("pdb");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), ns);
    pdbs.create(&PostParams::default(), &pdb)
        .await
        .expect("pdb");
    // Let the disruption controller publish the closed budget first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let victim = pods.list(&ListParams::default()).await.expect("pods").items[0]
        .metadata
        .name
        .clone()
        .expect("name");
    let handle = tokio::task::spawn_blocking(drain);
    tokio::time::sleep(BUDGET_OPENS_AFTER).await;
    let opened = Instant::now();
    pdbs.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minAvailable": 0}})),
    )
    .await
    .expect("open");
    loop {
        let p = pods.get_opt(&victim).await.expect("get");
        if p.is_none_or(|p| p.metadata.deletion_timestamp.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let d = opened.elapsed();
    let _ = handle.await;
    d
}

async fn drain_figures(cp: &Cp, admin: &kube::Client) {
    let operator = cp.kubeconfig(
        &["--user", "bench-operator", "--group", "system:masters"],
        "operator",
    );
    let bare_kc = cp.kubeconfig(
        &["--user", "bench-bare", "--group", "system:masters"],
        "bare",
    );
    // Per tool: the drain times and the last run's API requests.
    let mut figures: std::collections::BTreeMap<&str, (Vec<Duration>, usize)> = Default::default();
    for run in 0..RUNS {
        for tool in ["nodeward", "kubectl", "bare"] {
            let node = format!("bench-{tool}-{run}-{}", std::process::id());
            let ns = node.clone();
            add_node(admin, &node, json!([])).await;
            namespace(admin, &ns).await;
            workload(admin, &ns, &node, PODS).await;
            let (user, kcfg) = match tool {
                "nodeward" => (
                    format!("system:node:{node}"),
                    cp.kubeconfig(&["--node", &node], &node),
                ),
                "kubectl" => ("bench-operator".to_string(), operator.clone()),
                _ => ("bench-bare".to_string(), bare_kc.clone()),
            };
            let before = cp.audit_count(&user);
            let took = match tool {
                "nodeward" => run_nodeward(&kcfg, &node),
                "kubectl" => run_kubectl(&kcfg, &node),
                _ => run_bare(&kcfg, &ns, &node).await,
            };
            tokio::time::sleep(Duration::from_millis(300)).await;
            let f = figures.entry(tool).or_default();
            f.0.push(took);
            f.1 = cp.audit_count(&user) - before;
            cleanup(admin, &ns, &node).await;
        }
    }
    let mut figure = |tool: &str| {
        let f = figures.get_mut(tool).expect("every tool ran");
        (median(&mut f.0), f.1)
    };
    let ((n, nw_req), (k, kc_req), (b, bare_req)) =
        (figure("nodeward"), figure("kubectl"), figure("bare"));
    println!(
        "real: 110 pods, grace 0:  nodeward {:>8.1} ms (system:node identity)   kubectl drain {:>8.1} ms   ratio {:>5.1}x",
        ms(n),
        ms(k),
        ms(k) / ms(n)
    );
    println!(
        "real: 110 pods, grace 0:  bare evictor (watcher, 110 evictions at once) {:>8.1} ms   nodeward / bare {:>5.2}x   kubectl drain / bare {:>5.1}x",
        ms(b),
        ms(n) / ms(b),
        ms(k) / ms(b)
    );
    println!(
        "real: API requests per drain (audit log): nodeward {nw_req}   kubectl drain {kc_req}   bare evictor {bare_req} (N = {PODS})"
    );

    let mut nw = Vec::new();
    let mut kc = Vec::new();
    for run in 0..RUNS {
        for tool in ["nodeward", "kubectl"] {
            let node = format!("pdb-{tool}-{run}-{}", std::process::id());
            add_node(admin, &node, json!([])).await;
            namespace(admin, &node).await;
            let d = if tool == "nodeward" {
                let kcfg = cp.kubeconfig(&["--node", &node], &node);
                let n2 = node.clone();
                budget_latency(admin, &node, &node, move || run_nodeward(&kcfg, &n2)).await
            } else {
                let op = operator.clone();
                let n2 = node.clone();
                budget_latency(admin, &node, &node, move || run_kubectl(&op, &n2)).await
            };
            if tool == "nodeward" {
                nw.push(d)
            } else {
                kc.push(d)
            }
            cleanup(admin, &node, &node).await;
        }
    }
    let (n, k) = (median(&mut nw), median(&mut kc));
    println!(
        "real: PDB opens -> pod evicted:  nodeward {:>8.1} ms   kubectl drain {:>8.1} ms   ratio {:>5.1}x",
        ms(n),
        ms(k),
        ms(k) / ms(n)
    );
}

/// Spawns `nodeward ARGS` with its log in `dir`.
fn spawn(args: &[&str], dir: &Path) -> std::process::Child {
    command(args, dir).spawn().expect("spawn nodeward")
}

/// `nodeward ARGS` with no logind (a socket nobody serves), no systemd, its stderr in
/// `dir/log`.
fn command(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nodeward"));
    c.args(args)
        .env("RUST_LOG", "warn")
        .env(
            "DBUS_SYSTEM_BUS_ADDRESS",
            format!("unix:path={}", dir.join("none.sock").display()),
        )
        .env_remove("NOTIFY_SOCKET")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("log")).expect("log"));
    c
}

/// An agent's config in `dir` for `node`: flannel's file as its gate, `agent_keys` in its
/// `[agent]` table, and `tables` appended.
fn agent_config(dir: &Path, node: &str, kc: &Path, agent_keys: &str, tables: &str) -> PathBuf {
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[node]\nname = \"{node}\"\nkubeconfig = \"{}\"\n[agent]\nstatus_file = \"{}\"\n{agent_keys}\n\
             [shutdown]\nlogind_dropin = \"{}\"\n[gates]\nfile = [{{ path = \"{}\", contains = \"FLANNEL_SUBNET=\" }}]\npod = []\n{tables}",
            kc.display(),
            dir.join("status.json").display(),
            dir.join("90.conf").display(),
            dir.join("subnet.env").display()
        ),
    )
    .expect("config");
    cfg
}

/// One trial: a tainted node, its agent running and reporting False; flannel's file appears;
/// the time until a watch sees the taint gone.
async fn gate_trial(admin: &kube::Client, node: &str, kc: &Path, untaint: &str) -> Duration {
    let dir = tempfile::tempdir().expect("dir");
    let taint = format!("startup_taint = \"{untaint}\"");
    let cfg = agent_config(dir.path(), node, kc, &taint, "");
    let mut agent = spawn(
        &["agent", "--config", cfg.to_str().expect("utf8")],
        dir.path(),
    );
    let api: Api<Node> = Api::all(admin.clone());
    let stream = watcher(
        api,
        watcher::Config::default().fields(&format!("metadata.name={node}")),
    )
    .applied_objects()
    .boxed();
    let mut stream = stream;
    let tainted = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == STARTUP_TAINT))
    };
    let reported = |n: &Node| nodeward::readiness::condition(n).is_some();
    // Wait until the agent is watching (its first condition, or for the agent path its first
    // status file), then write the file.
    loop {
        match tokio::time::timeout(Duration::from_secs(30), stream.next()).await {
            Ok(Some(Ok(n))) if reported(&n) && tainted(&n) => break,
            Ok(Some(_)) => {}
            _ => panic!("agent never reported on {node}"),
        }
    }
    let tmp = dir.path().join(".s");
    std::fs::write(&tmp, "FLANNEL_SUBNET=10.244.1.1/24\n").expect("write");
    let t0 = Instant::now();
    std::fs::rename(&tmp, dir.path().join("subnet.env")).expect("rename");
    loop {
        match tokio::time::timeout(Duration::from_secs(30), stream.next()).await {
            Ok(Some(Ok(n))) if !tainted(&n) => break,
            Ok(Some(_)) => {}
            _ => panic!("taint never removed from {node}"),
        }
    }
    let d = t0.elapsed();
    let _ = agent.kill();
    let _ = agent.wait();
    d
}

async fn gate_figures(cp: &Cp, admin: &kube::Client) {
    let sa = cp.kubeconfig(
        &[
            "--user",
            "system:serviceaccount:kube-system:nodeward-readiness-controller",
            "--group",
            "system:serviceaccounts",
        ],
        "controller",
    );
    let cdir = tempfile::tempdir().expect("dir");
    let mut controller = spawn(
        &["controller", "--kubeconfig", sa.to_str().expect("utf8")],
        cdir.path(),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut real = Vec::new();
    for i in 0..TRIALS {
        let node = format!("gate-{i}-{}", std::process::id());
        add_node(
            admin,
            &node,
            json!([{"key": STARTUP_TAINT, "effect": "NoSchedule"}]),
        )
        .await;
        let kc = cp.kubeconfig(&["--node", &node], &node);
        real.push(gate_trial(admin, &node, &kc, "controller").await);
        let _ = Api::<Node>::all(admin.clone())
            .delete(&node, &DeleteParams::default())
            .await;
    }
    let _ = controller.kill();
    let _ = controller.wait();

    // The same on kube-emulator, the agent untainting itself (no admission there).
    let emu = kube_emulator::Emulator::start(kube_emulator::EmulatorOptions::default())
        .await
        .expect("emulator");
    let eadmin = client(emu.kubeconfig_path()).await;
    let mut emulated = Vec::new();
    for i in 0..TRIALS {
        let node = format!("gate-{i}");
        add_node(
            &eadmin,
            &node,
            json!([{"key": STARTUP_TAINT, "effect": "NoSchedule"}]),
        )
        .await;
        emulated.push(gate_trial(&eadmin, &node, emu.kubeconfig_path(), "agent").await);
    }
    println!(
        "real: flannel file -> schedulable (agent reports, controller untaints): median {:>6.1} ms  p99 {:>6.1} ms  ({TRIALS} trials)",
        ms(median(&mut real)),
        ms(p99(&mut real))
    );
    println!(
        "emulator: flannel file -> schedulable (agent untaints itself):         median {:>6.1} ms  p99 {:>6.1} ms  ({TRIALS} trials)",
        ms(median(&mut emulated)),
        ms(p99(&mut emulated))
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(dir) = std::env::var_os("NODEWARD_CONTROL_PLANE").map(PathBuf::from) else {
        eprintln!(
            "benches/real needs a running control plane: scripts/control-plane up DIR, apply \
             packaging/kubernetes/{{rbac-agent,readiness-controller}}.yaml, then \
             NODEWARD_CONTROL_PLANE=DIR cargo bench --bench real"
        );
        std::process::exit(2);
    };
    let cp = Cp {
        dir,
        scratch: tempfile::tempdir().expect("tempdir"),
    };
    let admin = client(&cp.dir.join("admin.kubeconfig")).await;
    // NODEWARD_BENCH_ONLY=drain|gates|metrics|reboot-wave runs one part; the reboot wave runs
    // only when asked for.
    let only = std::env::var("NODEWARD_BENCH_ONLY").ok();
    if only.as_deref() == Some("reboot-wave") {
        reboot_wave::figures(&cp, &admin).await;
        return;
    }
    let run = |part: &str| only.as_deref().is_none_or(|o| o == part);
    if run("drain") {
        drain_figures(&cp, &admin).await;
    }
    if run("gates") {
        gate_figures(&cp, &admin).await;
    }
    if run("metrics") {
        metrics_figures(&cp, &admin).await;
    }
}

/// `GET /metrics` from `addr`, and how long it took (connect to last byte).
async fn scrape(addr: std::net::SocketAddr) -> (String, Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t = Instant::now();
    let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("send");
    let mut buf = Vec::new();
    c.read_to_end(&mut buf).await.expect("read");
    (String::from_utf8_lossy(&buf).into_owned(), t.elapsed())
}

/// The value of the sample `name` (with its labels, exactly as exposed) in a scrape, 0 if absent.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Two nodes in one pool, `PLOT_PODS` pods of a ReplicaSet on the first (the spare cordoned while
/// they are placed), a budget of maxUnavailable 3; replacements go to the spare.
async fn plot_workload(admin: &kube::Client, ns: &str, node: &str, spare: &str) {
    for n in [node, spare] {
        add_node(admin, n, json!([])).await;
        Api::<Node>::all(admin.clone())
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"bench/pool": ns}},
                    "spec": {"unschedulable": n == spare}})),
            )
            .await
            .expect("label node");
    }
    namespace(admin, ns).await;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "w", "namespace": ns},
        "spec": {"maxUnavailable": 3, "selector": {"matchLabels": {"app": "w"}}}
    }))
    .expect("pdb");
    Api::<PodDisruptionBudget>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &pdb)
        .await
        .expect("pdb");
    workload_on(admin, ns, json!({"bench/pool": ns}), PLOT_PODS).await;
    Api::<Node>::all(admin.clone())
        .patch(
            spare,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": false}})),
        )
        .await
        .expect("uncordon spare");
}

/// 4: one drain's metrics over time; see the module's documentation.
async fn metrics_figures(cp: &Cp, admin: &kube::Client) {
    let node = format!("plot-{}", std::process::id());
    let spare = format!("plot-spare-{}", std::process::id());
    plot_workload(admin, &node, &node, &spare).await;
    let agent = std::sync::Arc::new(nodeward::agent::metrics::AgentMetrics::default());
    let (addr, server) =
        nodeward::metrics_http::serve("127.0.0.1:0".parse().expect("addr"), agent.clone())
            .await
            .expect("serve metrics");
    let kcfg = cp.kubeconfig(&["--node", &node], &node);
    let client = nodeward::kube_client::client_with_deadline(
        Some(&kcfg),
        nodeward::kube_client::REQUEST_DEADLINE,
        Some(&agent.api_errors),
    )
    .await
    .expect("client");
    let mut opts = nodeward::drain::DrainOptions::from_settings(
        &nodeward::config::Settings::default().drain,
        "bench",
    );
    opts.timeout = Duration::from_secs(60);
    opts.metrics = Some(agent.drain.clone());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let t0 = Instant::now();
    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
            let (text, took) = scrape(addr).await;
            samples.push((t0.elapsed().as_secs_f64(), text, took));
            tokio::time::sleep(SCRAPE_EVERY).await;
        }
        samples
    });
    let report = nodeward::drain::drain(&client, &node, &opts)
        .await
        .expect("drain");
    tokio::time::sleep(2 * SCRAPE_EVERY).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let samples = sampler.await.expect("sampler");
    server.abort();
    let mut took: Vec<Duration> = samples.iter().map(|s| s.2).collect();
    println!(
        "real: agent /metrics scrape during a drain (release build, loopback, {} scrapes): median {:.3} ms   p99 {:.3} ms   (target 1 ms)",
        took.len(),
        ms(median(&mut took)),
        ms(p99(&mut took))
    );
    let series = |name: &str, colour: &'static str, metric: &str| plot::Series {
        name: name.to_string(),
        colour,
        points: samples
            .iter()
            .map(|(t, text, _)| (*t, sample(text, metric)))
            .collect(),
    };
    let waiting = |on: &str| format!("nodeward_drain_pods_left{{waiting_on=\"{on}\"}}");
    let panels = [
        plot::Panel {
            title: "pods left, by what they wait on (nodeward_drain_pods_left)",
            series: vec![
                series("eviction", "#1f77b4", &waiting("eviction")),
                series("budget", "#d62728", &waiting("budget")),
                series("termination", "#7f7f7f", &waiting("termination")),
            ],
        },
        plot::Panel {
            title: "evictions answered, by code (nodeward_drain_evictions_total)",
            series: vec![
                series(
                    "201 evicted",
                    "#2ca02c",
                    "nodeward_drain_evictions_total{code=\"201\"}",
                ),
                series(
                    "429 budget",
                    "#d62728",
                    "nodeward_drain_evictions_total{code=\"429\"}",
                ),
            ],
        },
        plot::Panel {
            title: "seconds to the deadline (nodeward_drain_deadline_seconds)",
            series: vec![series(
                "deadline",
                "#9467bd",
                "nodeward_drain_deadline_seconds",
            )],
        },
    ];
    let title = format!(
        "One drain on the real control plane: {PLOT_PODS} pods, budget maxUnavailable 3, {:.1} s, scraped every {} ms",
        report.elapsed.as_secs_f64(),
        SCRAPE_EVERY.as_millis()
    );
    let out = std::env::var_os("NODEWARD_BENCH_PLOT").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/target/drain-metrics.svg"
            ))
        },
        PathBuf::from,
    );
    std::fs::write(&out, plot::svg(&title, &panels)).expect("write the plot");
    let last = &samples.last().expect("a scrape").1;
    println!(
        "real: plotted one drain of {PLOT_PODS} pods ({} evicted in {:.1} s; evictions answered 201: {}, 429: {}) into {}",
        report.evicted.len(),
        report.elapsed.as_secs_f64(),
        sample(last, "nodeward_drain_evictions_total{code=\"201\"}"),
        sample(last, "nodeward_drain_evictions_total{code=\"429\"}"),
        out.display()
    );
    cleanup(admin, &node, &node).await;
    let _ = Api::<Node>::all(admin.clone())
        .delete(&spare, &DeleteParams::default())
        .await;
}
