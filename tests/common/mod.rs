//! Where integration tests get their API server: kube-emulator (fast, fault injection) or the
//! real control plane of `scripts/control-plane` (kube-apiserver with Node,RBAC authorization and
//! NodeRestriction, the controller-manager, the scheduler, kwok as the kubelets).
//!
//! A scenario written against [`Cluster`] runs on both; [`both_backends!`] makes one test per
//! backend. The real one is `#[ignore]`d (it needs a running control plane) and run by
//! `scripts/test` with `NODEWARD_CONTROL_PLANE=DIR -- --ignored`; started without that variable it
//! fails and says how to start one. On the real control plane each component runs with the
//! identity it has in a cluster: the agent as `system:node:NAME`, the readiness controller and the
//! scaler as their ServiceAccounts, with the shipped RBAC (`packaging/kubernetes/`), which
//! `scripts/test` applies as a user would.

#![allow(dead_code)] // Each test binary uses its own part of this module.

pub mod prometheus;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube_emulator::{Emulator, EmulatorHandle, EmulatorOptions};
use serde_json::{Value, json};

/// The environment variable naming a running control plane's directory.
pub const CONTROL_PLANE_ENV: &str = "NODEWARD_CONTROL_PLANE";

/// The ServiceAccount of the readiness controller (`packaging/kubernetes/readiness-controller.yaml`).
pub const CONTROLLER_SA: (&str, &str) = ("kube-system", "nodeward-readiness-controller");

/// One API server for a test.
pub enum Cluster {
    /// kube-emulator, started for this test; every identity is the same unauthenticated one.
    Emulator(Arc<EmulatorHandle>),
    /// The shared real control plane; a test isolates itself by unique node names.
    Real {
        /// `scripts/control-plane up DIR`'s DIR.
        dir: PathBuf,
        /// Kubeconfigs made for this test.
        scratch: tempfile::TempDir,
    },
}

impl Cluster {
    /// A fresh kube-emulator (pods bound to a node become Running and Ready at once).
    pub async fn emulator() -> Self {
        let emu = Emulator::start(EmulatorOptions {
            grace_scale: 0.001,
            auto_ready: true,
            ..EmulatorOptions::default()
        })
        .await
        .expect("kube-emulator starts");
        Cluster::Emulator(Arc::new(emu))
    }

    /// The running real control plane named by `NODEWARD_CONTROL_PLANE`.
    pub fn real() -> Self {
        let dir = std::env::var_os(CONTROL_PLANE_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                panic!(
                    "this test needs a real control plane: run `scripts/control-plane up DIR` \
                 (it builds kube-apiserver & co. from Go modules; see docs/src/control-plane.md) \
                 and set {CONTROL_PLANE_ENV}=DIR"
                )
            });
        assert!(
            dir.join("admin.kubeconfig").exists(),
            "{CONTROL_PLANE_ENV}={} has no admin.kubeconfig: is the control plane up?",
            dir.display()
        );
        Cluster::Real {
            dir,
            scratch: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// Stops a component of the real control plane (`kube-controller-manager`, …) with SIGSTOP
    /// until the returned guard is dropped: a controller that has not acted yet, for as long as
    /// a test needs.
    pub fn pause(&self, component: &str) -> Paused {
        let Cluster::Real { dir, .. } = self else {
            panic!("only the real control plane has components to pause");
        };
        let file = dir.join(format!("{component}.pid"));
        let pid: i32 = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let pid = nix::unistd::Pid::from_raw(pid);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)
            .unwrap_or_else(|e| panic!("SIGSTOP {component}: {e}"));
        Paused(pid)
    }

    /// Whether this is the real control plane.
    pub fn is_real(&self) -> bool {
        matches!(self, Cluster::Real { .. })
    }

    /// The emulator, for emulator-only checks.
    pub fn emu(&self) -> Option<&EmulatorHandle> {
        match self {
            Cluster::Emulator(e) => Some(e),
            Cluster::Real { .. } => None,
        }
    }

    /// A cluster-admin kubeconfig.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        match self {
            Cluster::Emulator(e) => e.kubeconfig_path().to_path_buf(),
            Cluster::Real { dir, .. } => dir.join("admin.kubeconfig"),
        }
    }

    /// A client with cluster-admin rights.
    pub async fn admin(&self) -> kube::Client {
        client(&self.admin_kubeconfig()).await
    }

    /// A kubeconfig for the node identity `system:node:NAME` (group `system:nodes`).
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        self.identity_kubeconfig(&["--node", node], &format!("node-{node}"))
    }

    /// A kubeconfig for a ServiceAccount, as a client certificate with its user name and groups
    /// (RBAC matches a ServiceAccount subject by that user name).
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let ns_group = format!("system:serviceaccounts:{namespace}");
        self.identity_kubeconfig(
            &[
                "--user",
                &user,
                "--group",
                "system:serviceaccounts",
                "--group",
                &ns_group,
            ],
            &format!("sa-{namespace}-{name}"),
        )
    }

    /// A kubeconfig for any user name and groups.
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> PathBuf {
        let mut args = vec!["--user", user];
        for g in groups {
            args.extend(["--group", g]);
        }
        self.identity_kubeconfig(&args, &format!("user-{user}"))
    }

    fn identity_kubeconfig(&self, args: &[&str], file: &str) -> PathBuf {
        match self {
            Cluster::Emulator(e) => e.kubeconfig_path().to_path_buf(),
            Cluster::Real { dir, scratch } => {
                let out = std::process::Command::new(repo().join("scripts/control-plane"))
                    .arg("kubeconfig")
                    .arg(dir)
                    .args(args)
                    .output()
                    .expect("run scripts/control-plane kubeconfig");
                assert!(
                    out.status.success(),
                    "scripts/control-plane kubeconfig {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let path = scratch.path().join(file.replace(':', "_"));
                std::fs::write(&path, out.stdout).expect("write kubeconfig");
                path
            }
        }
    }

    /// Registers a Node as its kubelet would (Ready, with allocatable capacity), with `taints`.
    /// On the real control plane kwok plays its kubelet: heartbeats, and pods bound to it run.
    pub async fn add_node(&self, name: &str, labels: &[(&str, &str)], taints: Value) -> Node {
        let mut n = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64"},
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {"taints": taints},
            "status": {
                "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "kubelet is posting ready status"}],
            },
        });
        for (k, v) in labels {
            n["metadata"]["labels"][*k] = json!(v);
        }
        match self {
            Cluster::Emulator(e) => {
                e.create(n).expect("create node");
                serde_json::from_value(e.get("nodes", None, name).expect("node"))
                    .expect("node json")
            }
            Cluster::Real { .. } => {
                let api: Api<Node> = Api::all(self.admin().await);
                let node: Node = serde_json::from_value(n).expect("node json");
                api.create(&PostParams::default(), &node)
                    .await
                    .expect("create node")
            }
        }
    }

    /// Deletes a Node (real control plane: the test's nodes do not outlive it).
    pub async fn remove_node(&self, name: &str) {
        if self.is_real() {
            let api: Api<Node> = Api::all(self.admin().await);
            let _ = api.delete(name, &Default::default()).await;
        }
    }
}

/// A finished command's exit code, stdout and stderr, for assertion messages.
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A node name no other test uses.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A client from a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> kube::Client {
    nodeward::kube_client::client(Some(kubeconfig))
        .await
        .expect("client")
}

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Waits on a watch of Node `name` until `pred` holds; returns the Node then (or panics after
/// `limit`, naming `what`). Event-driven: no polling.
pub async fn wait_node(
    client: &kube::Client,
    name: &str,
    what: &str,
    limit: Duration,
    pred: impl Fn(&Node) -> bool,
) -> Node {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: Api<Node> = Api::all(client.clone());
    let mut last = None;
    let stream = watcher(
        api,
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .applied_objects();
    let found = tokio::time::timeout(limit, async {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if let Ok(n) = ev {
                if pred(&n) {
                    return Some(n);
                }
                last = Some(n);
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(n)) => n,
        _ => panic!(
            "timed out after {limit:?} waiting for node {name}: {what}\nlast seen: {}",
            serde_json::to_string_pretty(&last).unwrap_or_default()
        ),
    }
}

/// One test per backend: `mod emulator { fn NAME }` and `mod real { fn NAME }` (ignored unless
/// run with `--ignored` and a control plane), both calling `scenario(Cluster)`.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident => $scenario:path;)+) => {
        mod emulator {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $scenario($crate::common::Cluster::emulator().await).await;
                }
            )+
        }
        mod real {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs a real control plane: scripts/test runs it with NODEWARD_CONTROL_PLANE"]
                async fn $name() {
                    $scenario($crate::common::Cluster::real()).await;
                }
            )+
        }
    };
}

/// Tests that only mean something against the real control plane (admission, authorization).
#[macro_export]
macro_rules! real_only {
    ($($name:ident => $scenario:path;)+) => {
        mod real_only {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs a real control plane: scripts/test runs it with NODEWARD_CONTROL_PLANE"]
                async fn $name() {
                    $scenario($crate::common::Cluster::real()).await;
                }
            )+
        }
    };
}

/// A `nodeward` child process (agent or controller) with its log; stopped with SIGTERM (so it
/// releases its lock or Lease as in production) when dropped.
pub struct Proc {
    child: std::process::Child,
    /// Its stderr.
    pub log: PathBuf,
    /// Scratch directory: config, status file, gate files.
    pub dir: tempfile::TempDir,
}

impl Proc {
    /// Starts `nodeward ARGS…` with `RUST_LOG=info`, logging to a file in its own directory,
    /// with no system bus.
    pub fn spawn(args: &[&str], setup: impl FnOnce(&Path) -> Vec<String>) -> Self {
        Self::spawn_on_bus(args, None, setup)
    }

    /// [`Proc::spawn`] with `DBUS_SYSTEM_BUS_ADDRESS=bus` (logind-harness's private bus).
    pub fn spawn_on_bus(
        args: &[&str],
        bus: Option<&str>,
        setup: impl FnOnce(&Path) -> Vec<String>,
    ) -> Self {
        Self::spawn_with_env(args, bus, &[], setup)
    }

    /// [`Proc::spawn_on_bus`] with extra environment variables.
    pub fn spawn_with_env(
        args: &[&str],
        bus: Option<&str>,
        env: &[(&str, &str)],
        setup: impl FnOnce(&Path) -> Vec<String>,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let extra = setup(dir.path());
        let log = dir.path().join("log");
        let logf = std::fs::File::create(&log).expect("log");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
            .args(args)
            .args(extra)
            .env("RUST_LOG", "info,kube=warn")
            .env(
                "DBUS_SYSTEM_BUS_ADDRESS",
                bus.map_or_else(
                    || format!("unix:path={}", dir.path().join("no-bus.sock").display()),
                    str::to_string,
                ),
            )
            .envs(env.iter().copied())
            .env_remove("NOTIFY_SOCKET")
            .env_remove("JOURNAL_STREAM")
            .stdout(std::process::Stdio::null())
            .stderr(logf)
            .spawn()
            .expect("spawn nodeward");
        Proc { child, log, dir }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it still runs (`false` once it exited, for whatever reason).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What it logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, as a crash or an OOM kill: no goodbye.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (polling its log, at most `limit`) until the process has logged `line`.
    pub fn wait_for_log(&self, line: &str, limit: Duration) {
        let t0 = std::time::Instant::now();
        while !self.log_text().contains(line) {
            assert!(
                t0.elapsed() < limit,
                "{line:?} not logged within {limit:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits up to 5 s for it to exit (SIGKILL after that).
    pub fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            for _ in 0..50 {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.log.display(), self.log_text());
        }
    }
}

/// `nodeward agent` for `node` with the given kubeconfig, gated on a flannel file in its
/// directory (plus the default node-condition gates); no logind (gates only).
pub fn spawn_agent(node: &str, kubeconfig: &Path, extra_toml: &str) -> Proc {
    spawn_agent_with_logind(node, kubeconfig, extra_toml, None)
}

/// [`spawn_agent`] on logind-harness's bus, writing its logind drop-in where the harness reads
/// it: `logind` is (bus address, drop-in directory).
pub fn spawn_agent_with_logind(
    node: &str,
    kubeconfig: &Path,
    extra_toml: &str,
    logind: Option<(&str, &Path)>,
) -> Proc {
    spawn_agent_with_env(node, kubeconfig, extra_toml, logind, &[])
}

/// [`spawn_agent_with_logind`] with extra environment variables.
pub fn spawn_agent_with_env(
    node: &str,
    kubeconfig: &Path,
    extra_toml: &str,
    logind: Option<(&str, &Path)>,
    env: &[(&str, &str)],
) -> Proc {
    let node = node.to_string();
    let kubeconfig = kubeconfig.to_path_buf();
    let extra_toml = extra_toml.to_string();
    let dropin_dir = logind.map(|(_, d)| d.to_path_buf());
    Proc::spawn_with_env(&["agent"], logind.map(|(b, _)| b), env, move |dir| {
        let dropin = dropin_dir.unwrap_or_else(|| dir.to_path_buf());
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                r#"[node]
name = "{node}"
kubeconfig = "{kc}"
[agent]
status_file = "{status}"
{extra_toml}
[shutdown]
logind_dropin = "{dropin}"
[gates]
file = [{{ path = "{flannel}", contains = "FLANNEL_SUBNET=" }}]
pod = []
"#,
                kc = kubeconfig.display(),
                status = dir.join("status.json").display(),
                dropin = dropin.join("90-nodeward.conf").display(),
                flannel = dir.join("subnet.env").display(),
            ),
        )
        .expect("config");
        vec!["--config".into(), config.display().to_string()]
    })
}

/// Writes the flannel subnet file an agent from [`spawn_agent`] waits for (atomically).
pub fn write_flannel(agent: &Proc) {
    let tmp = agent.dir.path().join(".subnet.tmp");
    std::fs::write(
        &tmp,
        "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\n",
    )
    .expect("write");
    std::fs::rename(&tmp, agent.dir.path().join("subnet.env")).expect("rename");
}

/// Removes it (flannel died).
pub fn remove_flannel(agent: &Proc) {
    std::fs::remove_file(agent.dir.path().join("subnet.env")).expect("remove");
}

/// `nodeward controller` with `kubeconfig` and extra flags.
pub fn spawn_controller(kubeconfig: &Path, flags: &[&str]) -> Proc {
    let mut args = vec!["controller"];
    args.extend_from_slice(flags);
    let kubeconfig = kubeconfig.display().to_string();
    Proc::spawn(&args, move |_| vec!["--kubeconfig".into(), kubeconfig])
}

/// Creates a namespaced object from its JSON (its `metadata.namespace` says where).
pub async fn create<K>(client: &kube::Client, obj: Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
    K::DynamicType: Default,
{
    let ns = obj["metadata"]["namespace"]
        .as_str()
        .expect("metadata.namespace")
        .to_string();
    let typed: K = serde_json::from_value(obj).expect("object json");
    Api::<K>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &typed)
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", K::kind(&K::DynamicType::default())))
}

/// Creates a namespace.
pub async fn create_namespace(client: &kube::Client, name: &str) {
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace json");
    Api::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
}

/// A scaler node group of 4-CPU, 16 GiB machines (the Cherry emulator's plan `e5_1620v4`).
pub fn scaler_group(name: &str, max: u32) -> nodeward::config::GroupSettings {
    let mut capacity = nodeward::config::Capacity::default();
    capacity.resources.cpu_milli = 4000;
    capacity.resources.memory = 16 << 30;
    capacity.resources.pods = 110;
    nodeward::config::GroupSettings {
        name: name.into(),
        min: 0,
        max,
        standby: 0,
        priority: 0,
        plan: "e5_1620v4".into(),
        region: "eu_nord_1".into(),
        image: "ubuntu_24_04".into(),
        ssh_keys: vec!["1".into()],
        labels: Default::default(),
        taints: Vec::new(),
        template: concat!(env!("CARGO_MANIFEST_DIR"), "/cloud-init/worker.yaml.tera").into(),
        hostname_pattern: None,
        capacity,
        cherry: Default::default(),
    }
}

/// The Cherry Servers emulator with project 7 and the one plan [`scaler_group`] describes.
pub async fn cherry_emulator(token: &str) -> Arc<cherry_emulator::CherryEmulator> {
    Arc::new(
        cherry_emulator::CherryEmulator::start(cherry_emulator::Options {
            token: token.into(),
            project_id: 7,
            plans: vec![cherry_emulator::PlanSpec {
                slug: "e5_1620v4".into(),
                cores: 4,
                memory_gb: 16,
            }],
        })
        .await
        .expect("cherry emulator"),
    )
}

/// A paused control-plane component; dropping it lets the component go on (SIGCONT).
pub struct Paused(nix::unistd::Pid);

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// The scaler as its ServiceAccount (`kube-system/nodeward-scaler`, the shipped RBAC) on the
/// real control plane, with `settings` and the Cherry Servers token `cherry_token`.
pub async fn real_scaler(
    cluster: &Cluster,
    settings: &nodeward::config::Settings,
    cherry_token: &str,
    identity: &str,
) -> nodeward::scaler::run::Scaler<nodeward::scaler::provider::AnyProvider> {
    let client =
        client(&cluster.service_account_kubeconfig("kube-system", "nodeward-scaler")).await;
    let provider =
        nodeward::scaler::provider_from_settings(&settings.scaler, Some(cherry_token.into()))
            .expect("provider");
    nodeward::scaler::run::Scaler::new(
        client,
        provider,
        settings,
        nodeward::scaler::run::RunOptions {
            dry_run: false,
            identity: identity.into(),
        },
    )
    .await
    .expect("scaler starts")
}
