//! Coordinated reboots on the real control plane: agents with their own node identities
//! (`system:node:NAME`, NodeRestriction, the shipped RBAC and admission policies), kwok playing
//! the kubelets. A "reboot" is the agent's `reboot_command` leaving a mark; the test then does
//! what a reboot does to the agent: kills it without a goodbye, gives the machine a new boot ID
//! (`NODEWARD_BOOT_ID_FILE`), removes the sentinel (it lives on tmpfs) and starts it again.
//! The firing alert comes from the real Prometheus server (`NODEWARD_PROMETHEUS`, which
//! `scripts/test` builds from its Go module).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::prometheus::{Prometheus, prometheus_bin};
use common::{Cluster, Proc, spawn_agent_with_env, unique, write_flannel};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

const SLOT_NS: &str = "kube-system";

/// One node of the fleet: where its "machine" keeps what survives the agent (the boot ID, the
/// sentinel, the reboot mark), and its agent.
struct Machine {
    name: String,
    disk: tempfile::TempDir,
    agent: Option<Proc>,
    reboots: u32,
    toml: String,
}

impl Machine {
    fn boot_id(&self) -> PathBuf {
        self.disk.path().join("boot_id")
    }
    fn sentinel(&self) -> PathBuf {
        self.disk.path().join("reboot-required")
    }
    fn mark(&self) -> PathBuf {
        self.disk.path().join("rebooted")
    }

    /// A machine for `name` whose agent has `[reboot]` on with `extra` keys.
    fn new(name: &str, extra: &str) -> Self {
        let disk = tempfile::tempdir().expect("tempdir");
        let d = disk.path();
        std::fs::write(d.join("boot_id"), "boot-0\n").expect("boot id");
        let toml = format!(
            r#"metrics_address = ""
[reboot]
enabled = true
period = "1s"
settle_time = "2s"
drain_timeout = "60s"
sentinel = "{sentinel}"
request_file = "{request}"
{command}
{extra}
"#,
            command = if extra.contains("reboot_command") {
                String::new()
            } else {
                format!(
                    "reboot_command = [\"touch\", \"{}\"]",
                    d.join("rebooted").display()
                )
            },
            sentinel = d.join("reboot-required").display(),
            request = d.join("reboot-requested").display(),
        );
        Self {
            name: name.to_string(),
            disk,
            agent: None,
            reboots: 0,
            toml,
        }
    }

    fn start(&mut self, cluster: &Cluster) {
        let boot = self.boot_id().display().to_string();
        let agent = spawn_agent_with_env(
            &self.name,
            &cluster.node_kubeconfig(&self.name),
            &self.toml,
            None,
            &[("NODEWARD_BOOT_ID_FILE", &boot)],
        );
        write_flannel(&agent);
        self.agent = Some(agent);
    }

    /// Writes the sentinel as unattended-upgrades does (its text, then a rename).
    fn ask(&self) {
        let tmp = self.disk.path().join(".reboot-required.tmp");
        std::fs::write(&tmp, "*** System restart required ***\n").expect("sentinel");
        std::fs::rename(&tmp, self.sentinel()).expect("sentinel");
    }

    /// If the agent asked for a reboot: do to it what a reboot does, and start it again.
    fn reboot_if_asked(&mut self, cluster: &Cluster) -> bool {
        if !self.mark().exists() {
            return false;
        }
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
        self.reboots += 1;
        std::fs::write(self.boot_id(), format!("boot-{}\n", self.reboots)).expect("boot id");
        let _ = std::fs::remove_file(self.sentinel());
        std::fs::remove_file(self.mark()).expect("mark");
        self.start(cluster);
        true
    }

    fn log(&self) -> String {
        self.agent.as_ref().map(Proc::log_text).unwrap_or_default()
    }
}

/// The slots' holders.
async fn holders(admin: &kube::Client, n: u32) -> Vec<Option<String>> {
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), SLOT_NS);
    let mut out = Vec::new();
    for i in 0..n {
        let c = api
            .get_opt(&format!("nodeward-reboot-{i}"))
            .await
            .expect("get slot");
        out.push(c.and_then(|c| nodeward::reboot::slot::view(&c).holder));
    }
    out
}

/// Deletes the slots, so each scenario starts with free ones.
async fn free_slots(admin: &kube::Client) {
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), SLOT_NS);
    for i in 0..16 {
        let _ = api
            .delete(&format!("nodeward-reboot-{i}"), &DeleteParams::default())
            .await;
    }
}

fn reboot_condition(n: &Node) -> Option<(String, String)> {
    let c = nodeward::node_write::condition(n, nodeward::reboot::CONDITION_TYPE)?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

/// Whether nodeward's cordon for a reboot is on `n`.
fn cordoned_for_reboot(n: &Node) -> bool {
    nodeward::drain::cordon::is_cordoned(n)
        && nodeward::drain::cordon::nodeward_cordon(n).is_some_and(|r| r.reason == "reboot")
}

/// What the test sees from outside, on watches of the fleet's Nodes and its budget.
#[derive(Debug, Default)]
struct Seen {
    /// Nodes cordoned for a reboot now.
    cordoned: BTreeSet<String>,
    /// The most at once.
    most_cordoned: usize,
    /// When each node was first cordoned for a reboot, and last uncordoned (since start).
    phases: BTreeMap<String, (Option<Duration>, Option<Duration>)>,
    /// Budget status seen with fewer healthy pods than desired.
    violations: Vec<String>,
    /// Nodes seen with each condition reason.
    reasons: BTreeMap<String, BTreeSet<String>>,
}

fn observe(admin: &kube::Client, pool: &str, ns: Option<&str>) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let t0 = Instant::now();
    let nodes: Api<Node> = Api::all(admin.clone());
    let cfg = watcher::Config::default().labels(&format!("nodeward-test/pool={pool}"));
    let s = seen.clone();
    tokio::spawn(async move {
        let stream = watcher(nodes, cfg).applied_objects();
        futures::pin_mut!(stream);
        while let Some(Ok(n)) = stream.next().await {
            let name = n.metadata.name.clone().unwrap_or_default();
            let mut s = s.lock().expect("seen");
            if let Some((_, reason)) = reboot_condition(&n) {
                s.reasons.entry(reason).or_default().insert(name.clone());
            }
            let entry = s.phases.entry(name.clone()).or_default();
            if cordoned_for_reboot(&n) {
                entry.0.get_or_insert(t0.elapsed());
                s.cordoned.insert(name);
            } else if s.cordoned.remove(&name) {
                s.phases.entry(name).or_default().1 = Some(t0.elapsed());
            }
            s.most_cordoned = s.most_cordoned.max(s.cordoned.len());
        }
    });
    if let Some(ns) = ns {
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), ns);
        let s = seen.clone();
        tokio::spawn(async move {
            let stream = watcher(pdbs, watcher::Config::default()).applied_objects();
            futures::pin_mut!(stream);
            while let Some(Ok(b)) = stream.next().await {
                let Some(st) = b.status else { continue };
                if st.current_healthy < st.desired_healthy {
                    s.lock().expect("seen").violations.push(format!(
                        "{} healthy of {} desired",
                        st.current_healthy, st.desired_healthy
                    ));
                }
            }
        });
    }
    seen
}

/// A Deployment of `replicas` pods on the pool's nodes, behind a budget of `min_available`;
/// returns once they are all Ready.
async fn workload(admin: &kube::Client, ns: &str, replicas: i32, min_available: i32) {
    common::create_namespace(admin, ns).await;
    common::create::<Deployment>(
        admin,
        json!({
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                    "nodeSelector": {"nodeward-test/pool": ns},
                    "terminationGracePeriodSeconds": 0,
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": {"app": "web"}}}],
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}
        }),
    )
    .await;
    common::create::<PodDisruptionBudget>(
        admin,
        json!({
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "web"}}}
        }),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let n = usize::try_from(replicas).expect("replicas");
    let t0 = Instant::now();
    loop {
        let list = pods.list(&Default::default()).await.expect("pods");
        let ready = list
            .items
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready == n {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{ready} of {n} pods Ready after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), ns);
    loop {
        let b = budgets.get("web").await.expect("pdb");
        if b.status.is_some_and(|s| s.current_healthy == replicas) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the budget never counted the pods"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn teardown(cluster: &Cluster, admin: &kube::Client, ns: &str, fleet: &mut [Machine]) {
    for m in fleet.iter_mut() {
        if let Some(mut a) = m.agent.take() {
            a.stop();
        }
        cluster.remove_node(&m.name).await;
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    let _ = namespaces.delete(ns, &Default::default()).await;
    free_slots(admin).await;
}

/// The machine `NS-SUFFIX` on a node of pool `ns`, with `extra` reboot keys, its agent started
/// and asking for a reboot.
async fn asking(cluster: &Cluster, ns: &str, suffix: &str, extra: &str) -> Machine {
    let mut m = Machine::new(&format!("{ns}-{suffix}"), extra);
    cluster
        .add_node(&m.name, &[("nodeward-test/pool", ns)], json!([]))
        .await;
    m.start(cluster);
    m.ask();
    m
}

/// Waits until `m`'s agent has got to its reboot (its command asked for): at most 30 s.
async fn wait_until_rebooting(m: &Machine) {
    let t0 = Instant::now();
    while !m.log().contains("drained; rebooting") {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never got to its reboot:\n{}",
            m.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Eight nodes all asking for a reboot, `concurrency = 2`: a pod matching the blocking selector
/// holds every one of them; once it is gone, never more than two are cordoned for a reboot at
/// once, the budget is never below its minimum, every node reboots exactly once, and the fleet
/// ends schedulable with every slot free and no record left.
async fn a_fleet_reboots_two_at_a_time_within_its_budget(cluster: Cluster) {
    let admin = cluster.admin().await;
    free_slots(&admin).await;
    let ns = unique("fleet");
    let blocker = unique("blocker");
    let extra = format!(
        "concurrency = 2\nlease_duration = \"20s\"\nhealth_nodes = \"nodeward-test/pool={ns}\"\nblocking_pods_anywhere = \"nodeward-test/reboot-blocker={blocker}\""
    );
    let mut fleet: Vec<Machine> = (0..8)
        .map(|i| Machine::new(&format!("{ns}-n{i}"), &extra))
        .collect();
    for m in &fleet {
        cluster
            .add_node(&m.name, &[("nodeward-test/pool", &ns)], json!([]))
            .await;
    }
    workload(&admin, &ns, 16, 12).await;
    let seen = observe(&admin, &ns, Some(&ns));
    // The blocking pod: anywhere in the cluster (it need not run: it exists and has not ended).
    common::create::<Pod>(
        &admin,
        json!({"metadata": {"name": "backup", "namespace": ns,
                            "labels": {"nodeward-test/reboot-blocker": blocker}},
               "spec": {"nodeSelector": {"nodeward-test/nowhere": "x"},
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}),
    )
    .await;
    for m in &mut fleet {
        m.start(&cluster);
        m.ask();
    }
    let t0 = Instant::now();
    wait_until(
        "every node reports BlockedByPods",
        Duration::from_secs(60),
        &fleet,
        || {
            seen.lock()
                .expect("seen")
                .reasons
                .get("BlockedByPods")
                .map_or(0, BTreeSet::len)
                == 8
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        holders(&admin, 2).await,
        [None, None],
        "the blocking pod holds every slot"
    );
    assert_eq!(
        seen.lock().expect("seen").most_cordoned,
        0,
        "nothing cordoned while blocked"
    );
    let blocked_for = t0.elapsed();
    Api::<Pod>::namespaced(admin.clone(), &ns)
        .delete("backup", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the blocking pod");

    let wave = Instant::now();
    let limit = Duration::from_secs(300);
    loop {
        for m in &mut fleet {
            m.reboot_if_asked(&cluster);
        }
        let all_once = fleet.iter().all(|m| m.reboots >= 1);
        if all_once && fleet_at_rest(&admin, &fleet).await {
            break;
        }
        assert!(
            wave.elapsed() < limit,
            "the wave did not end within {limit:?}; reboots {:?}\n{}",
            fleet
                .iter()
                .map(|m| (&m.name, m.reboots))
                .collect::<Vec<_>>(),
            fleet
                .iter()
                .map(|m| format!("--- {}\n{}", m.name, m.log()))
                .collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let total = wave.elapsed();
    {
        let s = seen.lock().expect("seen");
        println!(
            "reboot wave: 8 nodes, concurrency 2: blocked by a pod for {:.1}s, then every node rebooted in {:.1}s; at most {} cordoned at once; {} budget violations",
            blocked_for.as_secs_f64(),
            total.as_secs_f64(),
            s.most_cordoned,
            s.violations.len()
        );
        for (node, (from, to)) in &s.phases {
            let f =
                |d: &Option<Duration>| d.map_or("-".into(), |d| format!("{:.1}s", d.as_secs_f64()));
            println!("  {node}: cordoned at {}, uncordoned at {}", f(from), f(to));
        }
        assert!(
            s.most_cordoned <= 2,
            "{} nodes cordoned for a reboot at once",
            s.most_cordoned
        );
        assert!(
            s.most_cordoned >= 1,
            "the observer saw no reboot cordon at all"
        );
        assert!(
            s.violations.is_empty(),
            "budget below its minimum: {:?}",
            s.violations
        );
        for m in &fleet {
            assert_eq!(m.reboots, 1, "{} rebooted {} times", m.name, m.reboots);
        }
    }
    maintenance_over(&admin, &fleet).await;
    teardown(&cluster, &admin, &ns, &mut fleet).await;
}

/// Each node says its maintenance is over in Kubernetes' words (issue 56): the reboot's
/// `MaintenancePlanned` and `MaintenanceInProgress` both `False`, `RebootDone`.
async fn maintenance_over(admin: &kube::Client, fleet: &[Machine]) {
    use nodeward::lifecycle::{MAINTENANCE_IN_PROGRESS, MAINTENANCE_PLANNED};
    let nodes: Api<Node> = Api::all(admin.clone());
    for m in fleet {
        let n = nodes.get(&m.name).await.expect("node");
        let said = |t: &str| {
            nodeward::node_write::condition(&n, t)
                .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
        };
        let done = Some(("False".to_string(), "RebootDone".to_string()));
        assert_eq!(said(MAINTENANCE_PLANNED), done, "{}", m.name);
        assert_eq!(said(MAINTENANCE_IN_PROGRESS), done, "{}", m.name);
    }
}

/// Every node schedulable, without a reboot record, and every slot free.
async fn fleet_at_rest(admin: &kube::Client, fleet: &[Machine]) -> bool {
    let nodes: Api<Node> = Api::all(admin.clone());
    for m in fleet {
        let n = nodes.get(&m.name).await.expect("node");
        let record = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(nodeward::reboot::decide::RECORD))
            .is_some_and(|v| !v.is_empty());
        if record || nodeward::drain::cordon::is_cordoned(&n) {
            return false;
        }
    }
    holders(admin, 2).await.iter().all(Option::is_none)
}

async fn wait_until(
    what: &str,
    limit: Duration,
    fleet: &[Machine],
    mut done: impl FnMut() -> bool,
) {
    let t0 = Instant::now();
    while !done() {
        assert!(
            t0.elapsed() < limit,
            "{what}: not within {limit:?}\n{}",
            fleet
                .iter()
                .map(|m| format!("--- {}\n{}", m.name, m.log()))
                .collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A holder killed with `kill -9` while it holds its slot (its reboot command never returns):
/// the other node takes the slot once the Lease has expired, not before, and within a few
/// periods after.
async fn a_dead_holders_slot_frees_itself_when_its_lease_expires(cluster: Cluster) {
    let admin = cluster.admin().await;
    free_slots(&admin).await;
    let ns = unique("dead");
    let lease = Duration::from_secs(6);
    // max_unavailable 2: the dead holder stays cordoned, and may.
    let extra = format!(
        "lease_duration = \"6s\"\nmax_unavailable = 2\nhealth_nodes = \"nodeward-test/pool={ns}\""
    );
    // a's reboot never comes: its command hangs, as a machine stuck in its firmware.
    let hang = format!("{extra}\nreboot_command = [\"sleep\", \"3600\"]");
    let mut a = Machine::new(&format!("{ns}-a"), &hang);
    let mut b = Machine::new(&format!("{ns}-b"), &extra);
    for m in [&a, &b] {
        cluster
            .add_node(&m.name, &[("nodeward-test/pool", &ns)], json!([]))
            .await;
    }
    a.start(&cluster);
    a.ask();
    let t0 = Instant::now();
    loop {
        if holders(&admin, 1).await[0].as_deref() == Some(a.name.as_str())
            && a.log().contains("drained; rebooting")
        {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "a never took the slot:\n{}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.start(&cluster);
    b.ask();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        holders(&admin, 1).await[0].as_deref(),
        Some(a.name.as_str()),
        "a still holds it"
    );
    a.agent.as_mut().expect("agent").kill();
    let killed = Instant::now();
    let slots: Api<ConfigMap> = Api::namespaced(admin.clone(), SLOT_NS);
    let stamp = |c: &ConfigMap, key: &str| -> jiff::Timestamp {
        let data = c.data.clone().unwrap_or_default();
        data.get(key)
            .and_then(|t| t.parse().ok())
            .expect("slot time")
    };
    // a is dead: its last renewal is final.
    let renewed = stamp(
        &slots.get("nodeward-reboot-0").await.expect("slot"),
        "renewTime",
    );
    loop {
        if holders(&admin, 1).await[0].as_deref() == Some(b.name.as_str()) {
            break;
        }
        assert!(
            killed.elapsed() < lease * 3,
            "b did not take the dead holder's slot within {:?}:\n{}",
            lease * 3,
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let taken = stamp(
        &slots.get("nodeward-reboot-0").await.expect("slot"),
        "acquireTime",
    );
    let after = Duration::try_from(taken.duration_since(renewed)).expect("taken after renewal");
    println!(
        "dead holder: its slot taken by the next node {:.1}s after its last renewal, {:.1}s after kill -9 (duration {}s, renewed every {}s, period 1s)",
        after.as_secs_f64(),
        killed.elapsed().as_secs_f64(),
        lease.as_secs(),
        lease.as_secs() / 3
    );
    // Never before the duration has passed unrenewed.
    assert!(
        after >= lease,
        "taken {after:?} after the last renewal, before {lease:?}"
    );
    // At most: the waiter's first read after the renewal (a pass, 1 s, more under load), the
    // duration, and its next pass: a few periods past the duration, never another duration.
    assert!(
        after <= lease + Duration::from_secs(5),
        "taken {after:?} after the last renewal: the slot stayed held past its duration"
    );
    teardown(&cluster, &admin, &ns, &mut [a, b]).await;
}

/// One node asking for a reboot while something holds it: waits until its condition says
/// `reason` (returning the message), checks it took no slot and did not reboot meanwhile, runs
/// `release`, then waits until it reboots.
async fn held_then_released<F: std::future::Future<Output = ()>>(
    cluster: &Cluster,
    admin: &kube::Client,
    m: &mut Machine,
    reason: &str,
    release: impl FnOnce() -> F,
) -> String {
    let nodes: Api<Node> = Api::all(admin.clone());
    let t0 = Instant::now();
    let message = loop {
        let n = nodes.get(&m.name).await.expect("node");
        if reboot_condition(&n).is_some_and(|(_, r)| r == reason) {
            break nodeward::node_write::condition(&n, nodeward::reboot::CONDITION_TYPE)
                .and_then(|c| c.message.clone())
                .unwrap_or_default();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no {reason}:\n{}",
            m.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(holders(admin, 1).await, [None], "no slot while {reason}");
    assert!(!m.mark().exists(), "no reboot while {reason}");
    release().await;
    let t1 = Instant::now();
    while !m.reboot_if_asked(cluster) {
        assert!(
            t1.elapsed() < Duration::from_secs(30),
            "no reboot once {reason} was over:\n{}",
            m.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    message
}

/// kured's lock annotation on a DaemonSet holds nodeward's reboots (the two must never reboot
/// nodes together): the node says KuredPresent and takes no slot; once kured's lock is gone, it
/// reboots.
async fn kureds_lock_holds_the_reboot(cluster: Cluster) {
    let admin = cluster.admin().await;
    free_slots(&admin).await;
    let ns = unique("kured");
    common::create_namespace(&admin, &ns).await;
    let lock = nodeward::reboot::KURED_LOCK;
    common::create::<k8s_openapi::api::apps::v1::DaemonSet>(
        &admin,
        json!({
            "metadata": {"name": "kured", "namespace": ns,
                         "annotations": {lock: "{\"nodeID\":\"some-node\",\"created\":\"2026-11-28T08:00:00Z\",\"TTL\":0}"}},
            "spec": {"selector": {"matchLabels": {"name": "kured"}},
                "template": {"metadata": {"labels": {"name": "kured"}}, "spec": {
                    "nodeSelector": {"nodeward-test/nowhere": "x"},
                    "containers": [{"name": "kured", "image": "registry.k8s.io/pause:3.10"}]}}}
        }),
    )
    .await;
    let extra = format!("health_nodes = \"nodeward-test/pool={ns}\"");
    let mut m = asking(&cluster, &ns, "n", &extra).await;
    let ds: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(admin.clone(), &ns);
    let message = held_then_released(&cluster, &admin, &mut m, "KuredPresent", || async {
        ds.patch(
            "kured",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {lock: null}}})),
        )
        .await
        .expect("remove kured's lock");
    })
    .await;
    assert!(message.contains("some-node"), "{message}");
    teardown(&cluster, &admin, &ns, &mut [m]).await;
}

/// A firing alert from the real Prometheus holds the reboot (BlockedByAlerts, no slot); once
/// its rule no longer fires (the rules reloaded), the node reboots.
async fn a_firing_alert_holds_the_reboot(cluster: Cluster) {
    let firing = "groups:\n  - name: t\n    interval: 1s\n    rules:\n      - alert: DiskFull\n        expr: vector(1)\n";
    let quiet = "groups:\n  - name: t\n    interval: 1s\n    rules:\n      - alert: DiskFull\n        expr: vector(1) == 0\n";
    let prometheus = Prometheus::start(&prometheus_bin(), firing).await;
    // Ready is before the rule's first evaluation: the alert must fire before the node asks.
    let http = reqwest::Client::new();
    let t0 = Instant::now();
    while nodeward::reboot::alerts::firing(&http, &prometheus.base, Duration::from_secs(5))
        .await
        .unwrap_or_default()
        .is_empty()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the alert never fired:\n{}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let admin = cluster.admin().await;
    free_slots(&admin).await;
    let ns = unique("alert");
    let extra = format!(
        "health_nodes = \"nodeward-test/pool={ns}\"\nprometheus_url = \"{}\"",
        prometheus.base
    );
    let mut m = asking(&cluster, &ns, "n", &extra).await;
    let message = held_then_released(&cluster, &admin, &mut m, "BlockedByAlerts", || {
        prometheus.reload(quiet)
    })
    .await;
    assert!(message.contains("DiskFull"), "{message}");
    teardown(&cluster, &admin, &ns, &mut [m]).await;
}

/// The shipped RBAC and policy: a node identity writes only reboot slots, and a slot only in
/// its own name (take, renew, release its own); it may not delete one. And the finding that made
/// slots ConfigMaps: NodeRestriction refuses a kubelet identity any Lease but its heartbeat.
async fn a_node_writes_only_its_own_reboot_slot(cluster: Cluster) {
    let admin = cluster.admin().await;
    free_slots(&admin).await;
    let (a, b) = (unique("slot-a"), unique("slot-b"));
    for n in [&a, &b] {
        cluster.add_node(n, &[], json!([])).await;
    }
    let client_a = common::client(&cluster.node_kubeconfig(&a)).await;
    let as_a: Api<ConfigMap> = Api::namespaced(client_a.clone(), SLOT_NS);
    let as_b: Api<ConfigMap> =
        Api::namespaced(common::client(&cluster.node_kubeconfig(&b)).await, SLOT_NS);
    let slot = |name: &str, holder: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "data": {"holderIdentity": holder, "leaseDurationSeconds": "30"}
        }))
        .expect("slot")
    };
    let pp = PostParams::default();
    let refused = |r: kube::Result<ConfigMap>, what: &str| match r {
        Err(kube::Error::Api(s)) if s.code == 403 => s.message,
        other => panic!("{what}: expected 403, got {other:?}"),
    };
    // The finding: a Lease is refused whatever RBAC says.
    let lease: k8s_openapi::api::coordination::v1::Lease = serde_json::from_value(json!({
        "metadata": {"name": "nodeward-reboot-0"}, "spec": {"holderIdentity": a}
    }))
    .expect("lease");
    match Api::namespaced(client_a, SLOT_NS).create(&pp, &lease).await {
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("kube-node-lease") => {}
        other => panic!(
            "a kubelet identity writing a Lease: expected NodeRestriction's 403, got {other:?}"
        ),
    }
    // Take a slot in its own name: allowed.
    let mut held = as_a
        .create(&pp, &slot("nodeward-reboot-0", &a))
        .await
        .expect("a takes slot 0");
    // In another's name: refused by the policy.
    let m = refused(
        as_a.create(&pp, &slot("nodeward-reboot-1", &b)).await,
        "a takes slot 1 for b",
    );
    assert!(m.contains("only in its own name"), "{m}");
    // Any other ConfigMap in kube-system: refused (kubeadm-config, say).
    let m = refused(
        as_a.create(&pp, &slot("kubeadm-config-x", &a)).await,
        "a writes another ConfigMap",
    );
    assert!(m.contains("only reboot slots"), "{m}");
    // Renew: allowed.
    held.data
        .get_or_insert_default()
        .insert("renewTime".into(), "2026-11-28T09:00:00Z".into());
    held = as_a
        .replace("nodeward-reboot-0", &pp, &held)
        .await
        .expect("a renews");
    // b may not release a's slot for it...
    let mut release = held.clone();
    release
        .data
        .get_or_insert_default()
        .insert("holderIdentity".into(), String::new());
    let m = refused(
        as_b.replace("nodeward-reboot-0", &pp, &release).await,
        "b releases a's slot",
    );
    assert!(m.contains("release only its own"), "{m}");
    // ...nor delete it (no RBAC verb).
    match as_b
        .delete("nodeward-reboot-0", &DeleteParams::default())
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("b deletes a's slot: expected 403, got {other:?}"),
    }
    // a releases its own: allowed.
    as_a.replace("nodeward-reboot-0", &pp, &release)
        .await
        .expect("a releases");
    for n in [&a, &b] {
        cluster.remove_node(n).await;
    }
    free_slots(&admin).await;
}

/// Issue 58, item 4: a reboot command that hangs (`sleep 3600`) is bounded by
/// `reboot_timeout`: the slot is renewed all the while (never a gap as long as its duration),
/// then the reboot ends in `RebootFailed`, the reboot's cordon is lifted and the slot released.
/// Before, the slot went unrenewed for as long as the command ran (662 s seen), with no
/// `RebootFailed` and the node left cordoned.
async fn a_hanging_reboot_command_ends_in_reboot_failed(cluster: Cluster) {
    let admin = cluster.admin().await;
    free_slots(&admin).await;
    let ns = unique("hang");
    let extra = format!(
        "lease_duration = \"6s\"\nreboot_timeout = \"10s\"\nhealth_nodes = \"nodeward-test/pool={ns}\"\nreboot_command = [\"sleep\", \"3600\"]"
    );
    let a = asking(&cluster, &ns, "a", &extra).await;
    wait_until_rebooting(&a).await;
    let asked = Instant::now();
    let slots: Api<ConfigMap> = Api::namespaced(admin.clone(), SLOT_NS);
    let nodes: Api<Node> = Api::all(admin.clone());
    let (mut last_renewal, mut renewed_at) = (None, Instant::now());
    let mut longest_gap = Duration::ZERO;
    let failed = loop {
        let n = nodes.get(&a.name).await.expect("node");
        if reboot_condition(&n).is_some_and(|(_, reason)| reason == "RebootFailed") {
            break n;
        }
        let slot = slots.get_opt("nodeward-reboot-0").await.expect("slot");
        let renewal = slot
            .and_then(|c| c.data)
            .and_then(|d| d.get("renewTime").cloned());
        if renewal.is_some() && renewal != last_renewal {
            longest_gap = longest_gap.max(renewed_at.elapsed());
            (last_renewal, renewed_at) = (renewal, Instant::now());
        }
        assert!(
            asked.elapsed() < Duration::from_secs(40),
            "no RebootFailed {:?} after the reboot was asked for:\n{}",
            asked.elapsed(),
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let ended = asked.elapsed();
    println!(
        "hanging reboot command: RebootFailed {:.1}s after it started (reboot_timeout 10s); longest gap between slot renewals {:.1}s (duration 6s)",
        ended.as_secs_f64(),
        longest_gap.as_secs_f64()
    );
    assert!(
        longest_gap < Duration::from_secs(6),
        "the slot went {longest_gap:?} unrenewed while the reboot command ran"
    );
    assert!(
        !cordoned_for_reboot(&failed),
        "the reboot's cordon stays after RebootFailed"
    );
    let log = a.log();
    assert!(
        log.contains("not rebooting: the reboot was asked for 10s ago and has not happened"),
        "the slot was not given back as a failed reboot:\n{log}"
    );
    teardown(&cluster, &admin, &ns, &mut [a]).await;
}

/// Issue 58, item 2: an operator's `nodeward cordon --reason disk` made while a reboot
/// settles is not the reboot's to lift: the reboot finishes (`RebootDone`, the slot released)
/// and the operator's cordon stays. Before, the settling reboot lifted any cordon of nodeward's
/// (0.1 s after it was made, seen from outside).
async fn a_settling_reboot_keeps_an_operators_cordon(cluster: Cluster) {
    let admin = cluster.admin().await;
    free_slots(&admin).await;
    let ns = unique("settle");
    let extra = format!("health_nodes = \"nodeward-test/pool={ns}\"");
    let mut m = asking(&cluster, &ns, "a", &extra).await;
    let t0 = Instant::now();
    while !m.reboot_if_asked(&cluster) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no reboot:\n{}",
            m.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let nodes: Api<Node> = Api::all(admin.clone());
    loop {
        let n = nodes.get(&m.name).await.expect("node");
        let settling = reboot_condition(&n).is_some_and(|(_, r)| r == "Settling");
        if settling && !nodeward::drain::cordon::is_cordoned(&n) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "never settling, uncordoned:\n{}",
            m.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nodeward::drain::cordon(&admin, &m.name, "disk", false)
        .await
        .expect("the operator's nodeward cordon");
    loop {
        let n = nodes.get(&m.name).await.expect("node");
        if reboot_condition(&n).is_some_and(|(_, r)| r == "RebootDone") {
            break;
        }
        let cordon = nodeward::drain::cordon::nodeward_cordon(&n);
        assert_eq!(
            cordon.as_ref().map(|r| r.reason.as_str()),
            Some("disk"),
            "the operator's cordon was lifted while the reboot settled:\n{}",
            m.log()
        );
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no RebootDone:\n{}",
            m.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let n = nodes.get(&m.name).await.expect("node");
    let cordon = nodeward::drain::cordon::nodeward_cordon(&n).map(|r| r.reason);
    assert_eq!(
        cordon.as_deref(),
        Some("disk"),
        "the operator's cordon stays after RebootDone"
    );
    assert_eq!(holders(&admin, 1).await, [None], "the slot released");
    teardown(&cluster, &admin, &ns, &mut [m]).await;
}

/// Issue 55, "unknown is not healthy": an agent restarted in the boot it took its slot in (its
/// reboot command hung, then the agent was killed) goes on only under the checks a new request
/// meets. A blocking pod that appeared meanwhile gives the slot back, lifts the reboot's cordon
/// and waits `BlockedByPods`. Before, the record alone resumed the reboot: drained and rebooting
/// again past the blocker.
async fn a_resumed_reboot_meets_the_checks_again(cluster: Cluster) {
    let admin = cluster.admin().await;
    free_slots(&admin).await;
    let ns = unique("resume");
    common::create_namespace(&admin, &ns).await;
    let extra = format!(
        "health_nodes = \"nodeward-test/pool={ns}\"\nblocking_pods_anywhere = \"nodeward-test/hold={ns}\"\nreboot_command = [\"sleep\", \"3600\"]"
    );
    let mut m = asking(&cluster, &ns, "a", &extra).await;
    wait_until_rebooting(&m).await;
    m.agent.as_mut().expect("agent").kill();
    assert_eq!(holders(&admin, 1).await, [Some(m.name.clone())]);
    common::create::<Pod>(
        &admin,
        json!({
            "metadata": {"name": "backup", "namespace": ns, "labels": {"nodeward-test/hold": ns}},
            "spec": {"nodeSelector": {"nodeward-test/nowhere": "x"},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
        }),
    )
    .await;
    m.start(&cluster);
    let nodes: Api<Node> = Api::all(admin.clone());
    let restarted = Instant::now();
    loop {
        let n = nodes.get(&m.name).await.expect("node");
        if reboot_condition(&n).is_some_and(|(_, r)| r == "BlockedByPods") {
            assert!(
                !cordoned_for_reboot(&n),
                "the reboot's cordon stays while the node waits"
            );
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(20),
            "the restarted agent did not meet the blocking pod: {:?}\n{}",
            reboot_condition(&n),
            m.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(holders(&admin, 1).await, [None], "the slot given back");
    let log = m.log();
    assert!(
        !log.contains("drained; rebooting"),
        "the restarted agent rebooted past the blocker:\n{log}"
    );
    teardown(&cluster, &admin, &ns, &mut [m]).await;
}

real_only! {
    a_firing_alert_holds_the_reboot => super::a_firing_alert_holds_the_reboot;
    kureds_lock_holds_the_reboot => super::kureds_lock_holds_the_reboot;
    a_node_writes_only_its_own_reboot_slot => super::a_node_writes_only_its_own_reboot_slot;
    a_fleet_reboots_two_at_a_time_within_its_budget => super::a_fleet_reboots_two_at_a_time_within_its_budget;
    a_dead_holders_slot_frees_itself_when_its_lease_expires => super::a_dead_holders_slot_frees_itself_when_its_lease_expires;
    a_hanging_reboot_command_ends_in_reboot_failed => super::a_hanging_reboot_command_ends_in_reboot_failed;
    a_settling_reboot_keeps_an_operators_cordon => super::a_settling_reboot_keeps_an_operators_cordon;
    a_resumed_reboot_meets_the_checks_again => super::a_resumed_reboot_meets_the_checks_again;
}
