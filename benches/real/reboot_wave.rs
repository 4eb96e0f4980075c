//! Issue 55's cost bench: what a fleet waiting for coordinated reboots costs the API server, and
//! what each reboot of the wave costs, counted from outside (the API server's audit log and its
//! `apiserver_response_sizes` metric).
//!
//! `WAVE_NODES` (default 50) kwok nodes, each with its own real `nodeward agent` under its own
//! node identity, `[reboot]` on at a `WAVE_PERIOD` (default 10 s) period, concurrency 2. Three
//! windows, each counted on its own:
//! 1. **idle**: the agents run, nothing asked (the agent's own cost: its Node watch, its
//!    condition writes);
//! 2. **waiting**: every node asks at once while a pod matching `blocking_pods_anywhere` holds
//!    them all (the slots are free, so every agent runs every check each period, as a fleet does
//!    while one alert fires);
//! 3. **the wave**: the pod goes; the nodes reboot two at a time until every one has. A "reboot"
//!    is the agent's `reboot_command` leaving a mark; the bench then does what a reboot does to
//!    the agent (kills it, gives it a new boot ID, removes the sentinel, starts it again).
//!
//! Printed: requests per agent per period in each window, by verb and resource; the full Node
//! and DaemonSet lists among them; requests and bytes served per reboot of the wave; and the
//! projection to 5,000 nodes at the default 1-minute period.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use super::Cp;

const POOL: &str = "nodeward-bench/pool";
const HOLD: &str = "nodeward-bench/hold";
const SLOT_NS: &str = "kube-system";
const CONCURRENCY: u32 = 2;
/// The period the projection is made for: `[reboot] period`'s default.
const DEFAULT_PERIOD: Duration = Duration::from_secs(60);
/// The fleet the projection is made for.
const FLEET: f64 = 5000.0;

/// One node: the files that outlive its agent (boot ID, sentinel, reboot mark) and the agent.
struct Machine {
    name: String,
    dir: tempfile::TempDir,
    agent: Option<Child>,
    boots: u32,
}

impl Machine {
    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn start(&mut self, kubeconfig: &Path, period: Duration) {
        let d = self.dir.path().display();
        // The agent's metrics off: fifty would contend for the one default address.
        let reboot = format!(
            r#"[reboot]
enabled = true
period = "{period}s"
concurrency = {CONCURRENCY}
settle_time = "2s"
drain_timeout = "60s"
sentinel = "{d}/reboot-required"
request_file = "{d}/reboot-requested"
reboot_command = ["touch", "{d}/rebooted"]
health_nodes = "{POOL}=wave"
blocking_pods_anywhere = "{HOLD}=wave"
"#,
            period = period.as_secs(),
        );
        let config = super::agent_config(
            self.dir.path(),
            &self.name,
            kubeconfig,
            "metrics_address = \"\"",
            &reboot,
        );
        std::fs::write(
            self.path("subnet.env"),
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\n",
        )
        .expect("flannel file");
        std::fs::write(self.path("boot_id"), format!("boot-{}\n", self.boots)).expect("boot id");
        let child = super::command(
            &["agent", "--config", &config.display().to_string()],
            self.dir.path(),
        )
        .env("NODEWARD_BOOT_ID_FILE", self.path("boot_id"))
        .spawn()
        .expect("spawn nodeward agent");
        self.agent = Some(child);
    }

    /// Fails the bench, with the agent's log, if its agent has exited.
    fn running(&mut self) {
        let exited = self.agent.as_mut().map(|a| a.try_wait());
        if let Some(Ok(Some(status))) = exited {
            let log = std::fs::read_to_string(self.path("log")).unwrap_or_default();
            panic!("{}'s agent exited ({status}):\n{log}", self.name);
        }
    }

    fn kill(&mut self) {
        if let Some(mut a) = self.agent.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
    }

    /// Writes the sentinel as unattended-upgrades does.
    fn ask(&self) {
        let tmp = self.path(".reboot-required");
        std::fs::write(&tmp, "*** System restart required ***\n").expect("sentinel");
        std::fs::rename(&tmp, self.path("reboot-required")).expect("sentinel");
    }

    /// If the agent asked for a reboot: kill it, a new boot, no sentinel, start it again.
    fn reboot_if_asked(&mut self, kubeconfig: &Path, period: Duration) -> bool {
        if !self.path("rebooted").exists() {
            return false;
        }
        self.kill();
        self.boots += 1;
        let _ = std::fs::remove_file(self.path("reboot-required"));
        std::fs::remove_file(self.path("rebooted")).expect("mark");
        self.start(kubeconfig, period);
        true
    }
}

/// The node identities' requests in one window of the audit log, from its byte `from`.
#[derive(Default)]
struct Requests {
    total: usize,
    /// By `verb resource`.
    by_kind: BTreeMap<String, usize>,
    /// Lists of every Node (no field selector naming one).
    node_lists: usize,
    daemonset_lists: usize,
}

fn audit_len(cp: &Cp) -> u64 {
    std::fs::metadata(cp.dir.join("audit.log")).map_or(0, |m| m.len())
}

fn requests(cp: &Cp, from: u64) -> Requests {
    use std::io::{Read, Seek};
    // The window only: the log grows by every client's requests.
    let mut text = Vec::new();
    if let Ok(mut f) = std::fs::File::open(cp.dir.join("audit.log")) {
        f.seek(std::io::SeekFrom::Start(from))
            .expect("seek the audit log");
        f.read_to_end(&mut text).expect("read the audit log");
    }
    let mut out = Requests::default();
    for line in String::from_utf8_lossy(&text).lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let user = e["user"]["username"].as_str().unwrap_or_default();
        if e["stage"] != "ResponseComplete" || !user.starts_with("system:node:wave-") {
            continue;
        }
        let verb = e["verb"].as_str().unwrap_or_default();
        let resource = e["objectRef"]["resource"].as_str().unwrap_or_default();
        let uri = e["requestURI"].as_str().unwrap_or_default();
        out.total += 1;
        *out.by_kind.entry(format!("{verb} {resource}")).or_default() += 1;
        if verb == "list" && resource == "nodes" && !uri.contains("fieldSelector") {
            out.node_lists += 1;
        }
        if verb == "list" && resource == "daemonsets" {
            out.daemonset_lists += 1;
        }
    }
    out
}

/// The bytes the API server has served in GET and LIST responses since it started (the sum of
/// `apiserver_response_sizes`, every client's).
async fn served_bytes(admin: &kube::Client) -> f64 {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = admin.request_text(req).await.expect("apiserver /metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_response_sizes_sum"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn print_window(name: &str, r: &Requests, agents: usize, periods: f64) {
    let per = |n: usize| n as f64 / agents as f64 / periods;
    println!(
        "reboot wave: {name}: {:.1} requests per agent per period ({} in all, {agents} agents, {periods:.1} periods); full Node lists {:.2}, DaemonSet lists {:.2} per agent per period",
        per(r.total),
        r.total,
        per(r.node_lists),
        per(r.daemonset_lists)
    );
    let kinds: Vec<String> = r
        .by_kind
        .iter()
        .map(|(k, n)| format!("{k} {:.2}", per(*n)))
        .collect();
    println!(
        "reboot wave: {name}: per agent per period: {}",
        kinds.join(", ")
    );
}

async fn add_nodes(admin: &kube::Client, fleet: &[Machine]) {
    let api: Api<Node> = Api::all(admin.clone());
    for m in fleet {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": m.name, "labels": {"kubernetes.io/hostname": m.name, POOL: "wave"},
                "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}
        }))
        .expect("node");
        api.create(&PostParams::default(), &n).await.expect("node");
    }
}

/// The fleet's Nodes as a watch keeps them: the bench looks without asking the API server
/// again, so the bytes it counts are the agents'.
fn watch_fleet(admin: &kube::Client) -> (Store<Node>, nodeward::task::AbortOnDrop) {
    let (reader, writer) = reflector::store();
    let cfg = watcher::Config::default().labels(&format!("{POOL}=wave"));
    let stream = reflector(writer, watcher(Api::<Node>::all(admin.clone()), cfg))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    (reader, nodeward::task::AbortOnDrop(task))
}

/// The reboots done (the `RebootDone` condition seen on every node) and every slot free.
async fn wave_over(admin: &kube::Client, nodes: &Store<Node>, fleet: &[Machine]) -> bool {
    if fleet.iter().any(|m| m.boots == 0) {
        return false;
    }
    let done = |n: &Node| {
        nodeward::node_write::condition(n, nodeward::reboot::CONDITION_TYPE)
            .is_some_and(|c| c.reason.as_deref() == Some("RebootDone"))
    };
    let state = nodes.state();
    if state.len() < fleet.len() || !state.iter().all(|n| done(n)) {
        return false;
    }
    let slots: Api<ConfigMap> = Api::namespaced(admin.clone(), SLOT_NS);
    for i in 0..CONCURRENCY {
        if let Ok(Some(c)) = slots.get_opt(&format!("nodeward-reboot-{i}")).await
            && nodeward::reboot::slot::view(&c).holder.is_some()
        {
            return false;
        }
    }
    true
}

/// How many of the fleet are cordoned now, as seen from outside.
fn cordoned(nodes: &Store<Node>) -> usize {
    nodes
        .state()
        .iter()
        .filter(|n| nodeward::drain::cordon::is_cordoned(n))
        .count()
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub async fn figures(cp: &Cp, admin: &kube::Client) {
    let count = usize::try_from(env_num("WAVE_NODES", 50)).expect("WAVE_NODES");
    // Each agent watches its files with inotify (the gates, the reboot sentinel): a fleet on one
    // machine needs more instances than the usual 128 a user may have.
    let limit = "/proc/sys/fs/inotify/max_user_instances";
    let instances: usize = std::fs::read_to_string(limit)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        instances >= count * 4 + 64,
        "{count} agents on one machine need more inotify instances than {limit} allows ({instances}): sysctl -w fs.inotify.max_user_instances={}",
        count * 4 + 64
    );
    let period = Duration::from_secs(env_num("WAVE_PERIOD", 10));
    let mut fleet: Vec<Machine> = (0..count)
        .map(|i| Machine {
            name: format!("wave-{i:03}"),
            dir: tempfile::tempdir().expect("dir"),
            agent: None,
            boots: 0,
        })
        .collect();
    add_nodes(admin, &fleet).await;
    let kubeconfigs: Vec<PathBuf> = fleet
        .iter()
        .map(|m| cp.kubeconfig(&["--node", &m.name], &format!("{}.kubeconfig", m.name)))
        .collect();
    for (m, kc) in fleet.iter_mut().zip(&kubeconfigs) {
        m.start(kc, period);
    }
    // Started, reported, settled: two periods.
    tokio::time::sleep(period * 2).await;
    for m in &mut fleet {
        m.running();
    }

    let window = period * 6;
    let periods = window.as_secs_f64() / period.as_secs_f64();
    let from = audit_len(cp);
    tokio::time::sleep(window).await;
    let idle = requests(cp, from);
    print_window("idle", &idle, count, periods);

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let blocker: Pod = serde_json::from_value(json!({
        "metadata": {"name": "wave-blocker", "labels": {HOLD: "wave"}},
        "spec": {"nodeSelector": {"nodeward-bench/nowhere": "x"},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &blocker)
        .await
        .expect("blocking pod");
    for m in &fleet {
        m.ask();
    }
    // Every agent has met the blocker once: a period.
    tokio::time::sleep(period).await;
    let from = audit_len(cp);
    tokio::time::sleep(window).await;
    let waiting = requests(cp, from);
    print_window(
        "waiting (a blocking pod holds every node)",
        &waiting,
        count,
        periods,
    );

    let (nodes, _watch) = watch_fleet(admin);
    nodes.wait_until_ready().await.expect("the fleet's watch");
    let (from, bytes0, t0) = (audit_len(cp), served_bytes(admin).await, Instant::now());
    pods.delete("wave-blocker", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the blocking pod");
    let mut most_cordoned = 0;
    let mut last_look = Instant::now();
    loop {
        for (m, kc) in fleet.iter_mut().zip(&kubeconfigs) {
            m.reboot_if_asked(kc, period);
        }
        if last_look.elapsed() >= Duration::from_secs(1) {
            last_look = Instant::now();
            for m in &mut fleet {
                m.running();
            }
            most_cordoned = most_cordoned.max(cordoned(&nodes));
            if wave_over(admin, &nodes, &fleet).await {
                break;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(40 * 60),
            "the wave did not end within 40 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = t0.elapsed();
    let wave = requests(cp, from);
    let bytes = served_bytes(admin).await - bytes0;
    let wave_periods = took.as_secs_f64() / period.as_secs_f64();
    print_window("the wave", &wave, count, wave_periods);
    println!(
        "reboot wave: {count} nodes rebooted, concurrency {CONCURRENCY}, in {:.0} s ({:.1} s per reboot); at most {most_cordoned} cordoned at once (sampled every second from a watch)",
        took.as_secs_f64(),
        took.as_secs_f64() / count as f64
    );
    println!(
        "reboot wave: per reboot: {:.0} requests from the node identities, {:.1} full Node lists, {:.2} MiB served (GET and LIST responses, every client)",
        wave.total as f64 / count as f64,
        wave.node_lists as f64 / count as f64,
        bytes / count as f64 / 1048576.0
    );
    project(&idle, &waiting, count, periods);
    for m in &mut fleet {
        m.kill();
    }
    cleanup(admin, &fleet).await;
}

/// The waiting fleet's cost at 5,000 nodes and the default period: each waiting agent makes
/// the same requests per period whatever the fleet's size, and each full Node list grows with it.
fn project(idle: &Requests, waiting: &Requests, agents: usize, periods: f64) {
    let per_period = |n: usize| n as f64 / agents as f64 / periods;
    let extra = per_period(waiting.total) - per_period(idle.total);
    let per_second = FLEET * per_period(waiting.total) / DEFAULT_PERIOD.as_secs_f64();
    let lists = FLEET * per_period(waiting.node_lists) / DEFAULT_PERIOD.as_secs_f64();
    println!(
        "reboot wave: a waiting node costs {:.1} requests per period more than an idle one ({:.0} per hour at the 1-minute default); 5,000 waiting nodes: {per_second:.0} requests a second, {lists:.0} of them lists of all 5,000 Nodes",
        extra,
        extra * 60.0
    );
}

async fn cleanup(admin: &kube::Client, fleet: &[Machine]) {
    let nodes: Api<Node> = Api::all(admin.clone());
    for m in fleet {
        let _ = nodes.delete(&m.name, &DeleteParams::default()).await;
    }
    let slots: Api<ConfigMap> = Api::namespaced(admin.clone(), SLOT_NS);
    for i in 0..CONCURRENCY {
        let _ = slots
            .delete(&format!("nodeward-reboot-{i}"), &DeleteParams::default())
            .await;
    }
}
