//! `kube-emulator`: a Kubernetes API server emulator for nodeward's tests.
//!
//! Our machines have no cluster, so the drain engine, the node agent and the scaler are tested
//! against this emulator, and its fidelity is checked with the real `kubectl`. It serves the
//! REST API over plain HTTP with the semantics a client can observe: a global resourceVersion,
//! optimistic concurrency, watches with history, bookmarks and 410s, label and field selectors
//! (indexed by node for pods), the four patch formats, graceful pod deletion with a kubelet
//! stand-in, finalizers, and the Eviction API with PodDisruptionBudgets computed as the
//! disruption controller does. It has no scheduler, no workload controllers, no admission and
//! no authentication; see docs/src/emulator.md in the repository for the full list of what it
//! leaves out.
//!
//! ```no_run
//! # async fn demo() -> kube_emulator::Result<()> {
//! use kube_emulator::{Emulator, EmulatorOptions, PodSeed};
//! let emu = Emulator::start(EmulatorOptions { grace_scale: 0.001, ..Default::default() }).await?;
//! emu.seed_node("node-1")?;
//! emu.seed_pod(PodSeed::new("default", "web-1").node("node-1").owner("ReplicaSet", "web").ready(true))?;
//! println!("kubectl --kubeconfig {} get pods", emu.kubeconfig_path().display());
//! emu.shutdown().await;
//! # Ok(()) }
//! ```

mod admin;
pub mod control;
pub mod error;
mod kubelet;
pub mod managed;
pub mod patch;
pub mod pdb;
pub mod resources;
pub mod selectors;
mod server;
pub mod standin;
pub mod store;
mod table;
mod watch;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use control::{FaultRule, RequestCount, RequestRecord};
pub use error::{ApiError, Error, Result};
pub use store::{EvictionOutcome, EvictionRecord, PdbSnapshot};

use resources::{PODS, RESOURCES, ResId};
use server::{RefuseCmd, Shared};
use store::{DeleteOpts, Deleted, Filter, Store, StoreConfig};

/// Events kept per resource for watches resuming from a resourceVersion. kube-apiserver's watch
/// cache keeps a comparable window (sized by event rate, bounded in time); use
/// [`EmulatorHandle::compact_history`] to force 410s in a test.
pub const DEFAULT_HISTORY_WINDOW: usize = 10_000;

/// The apiserver sends a bookmark to each watch about once a minute.
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);

/// Events queued for one watcher before it is cut off as too slow (its stream then ends and
/// the client re-watches, as when the apiserver drops a slow watcher). Large enough that the
/// benchmark's 5,000 watchers never hit it in normal operation.
pub const DEFAULT_WATCH_BUFFER: usize = 65_536;

/// Request log entries kept (counters cover every request regardless).
pub const DEFAULT_REQUEST_LOG_CAPACITY: usize = 100_000;

/// The dummy bearer token written to the kubeconfig; any token is accepted.
pub const DUMMY_TOKEN: &str = "kube-emulator-token";

/// Name of the cluster, user and context in the kubeconfig.
const KUBECONFIG_NAME: &str = "kube-emulator";

/// Emulator settings.
#[derive(Debug, Clone)]
pub struct EmulatorOptions {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Multiplies pod grace periods before the kubelet stand-in removes pods (0.001 turns a
    /// 30 s grace into 30 ms).
    pub grace_scale: f64,
    /// Pods bound to a node become Running and Ready as soon as they are created or bound.
    pub auto_ready: bool,
    /// Events kept per resource for resuming watches.
    pub history_window: usize,
    /// How often watches with `allowWatchBookmarks` get a bookmark.
    pub bookmark_interval: Duration,
    /// Where to write the kubeconfig; a temporary directory owned by the handle if `None`.
    pub kubeconfig_path: Option<PathBuf>,
    /// Events queued per watcher before it is cut off.
    pub watch_buffer: usize,
    /// Request log entries kept.
    pub request_log_capacity: usize,
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            grace_scale: 1.0,
            auto_ready: false,
            history_window: DEFAULT_HISTORY_WINDOW,
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
            kubeconfig_path: None,
            watch_buffer: DEFAULT_WATCH_BUFFER,
            request_log_capacity: DEFAULT_REQUEST_LOG_CAPACITY,
        }
    }
}

/// Entry point.
#[derive(Debug)]
pub struct Emulator;

impl Emulator {
    /// Starts serving; the emulator runs until the handle is shut down or dropped.
    pub async fn start(opts: EmulatorOptions) -> Result<EmulatorHandle> {
        let listener = server::bind(opts.listen).map_err(|source| Error::Bind {
            addr: opts.listen,
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: opts.listen,
            source,
        })?;
        let (kubelet_tx, kubelet_rx) = mpsc::unbounded_channel();
        let store = Arc::new(Store::new(
            StoreConfig {
                grace_scale: opts.grace_scale,
                auto_ready: opts.auto_ready,
                history_window: opts.history_window,
                watch_buffer: opts.watch_buffer,
            },
            kubelet_tx,
        ));
        let shutdown = CancellationToken::new();
        let (refuse_tx, refuse_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            store: store.clone(),
            faults: control::Faults::default(),
            log: control::RequestLog::new(opts.request_log_capacity),
            addr,
            watch_close: Mutex::new(shutdown.child_token()),
            shutdown: shutdown.clone(),
            bookmark_interval: opts.bookmark_interval,
            refuse_tx,
        });
        let (tempdir, kubeconfig) = match &opts.kubeconfig_path {
            Some(p) => (None, p.clone()),
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("kube-emulator-")
                    .tempdir()
                    .map_err(|source| Error::Kubeconfig {
                        path: std::env::temp_dir(),
                        source,
                    })?;
                let path = dir.path().join("kubeconfig");
                (Some(dir), path)
            }
        };
        write_kubeconfig(&kubeconfig, &format!("http://{addr}"))?;
        let server = tokio::spawn(server::serve(listener, shared.clone(), refuse_rx));
        let kubelet = tokio::spawn(kubelet::run(store, kubelet_rx, shutdown.clone()));
        tracing::info!(%addr, kubeconfig = %kubeconfig.display(), "kube-emulator serving");
        Ok(EmulatorHandle {
            shared,
            addr,
            kubeconfig,
            _tempdir: tempdir,
            shutdown,
            tasks: vec![server, kubelet],
        })
    }
}

/// Writes a kubeconfig pointing at `server` with a dummy token.
pub fn write_kubeconfig(path: &Path, server: &str) -> Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {n}\n  cluster:\n    server: {server}\ncontexts:\n- name: {n}\n  context:\n    cluster: {n}\n    user: {n}\n    namespace: default\ncurrent-context: {n}\npreferences: {{}}\nusers:\n- name: {n}\n  user:\n    token: {DUMMY_TOKEN}\n",
        n = KUBECONFIG_NAME
    );
    std::fs::write(path, text).map_err(|source| Error::Kubeconfig {
        path: path.to_path_buf(),
        source,
    })
}

/// A running emulator. Dropping it stops the server without waiting.
pub struct EmulatorHandle {
    shared: Arc<Shared>,
    addr: SocketAddr,
    kubeconfig: PathBuf,
    _tempdir: Option<tempfile::TempDir>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for EmulatorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatorHandle")
            .field("addr", &self.addr)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

fn resource(name: &str) -> Result<ResId> {
    resources::find_by_name(name).ok_or_else(|| Error::UnknownKind {
        api_version: String::new(),
        kind: name.to_string(),
    })
}

fn ns_of(res: ResId, ns: Option<&str>) -> String {
    if RESOURCES[res].namespaced {
        ns.unwrap_or("default").to_string()
    } else {
        String::new()
    }
}

impl EmulatorHandle {
    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The kubeconfig file (server, dummy token user, current context).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.current_rv()
    }

    fn store(&self) -> &Store {
        &self.shared.store
    }

    /// Creates an object from its JSON (kind and apiVersion pick the resource; the namespace
    /// defaults to `default`). Unlike a create through the API, a given status is kept, so
    /// seeds can start Running and Ready. Returns the stored object.
    pub fn create(&self, obj: Value) -> Result<Value> {
        let res = Self::resource_of(&obj)?;
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_string);
        let ns = Some(ns_of(res, ns.as_deref())).filter(|n| !n.is_empty());
        let created = self.store().seed(res, ns.as_deref(), obj)?;
        Ok(created.value.clone())
    }

    fn resource_of(obj: &Value) -> Result<ResId> {
        let api_version = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("v1");
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
        resources::find_by_kind(api_version, kind).ok_or_else(|| Error::UnknownKind {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        })
    }

    /// Creates every object of a (multi-document) YAML stream; `List` documents contribute
    /// their items, and an object that already exists is replaced.
    pub fn apply_yaml(&self, yaml: &str) -> Result<Vec<Value>> {
        use serde::Deserialize;
        let mut out = Vec::new();
        for (index, doc) in serde_norway::Deserializer::from_str(yaml).enumerate() {
            let v = Value::deserialize(doc).map_err(|source| Error::Yaml { index, source })?;
            let items = match v {
                Value::Null => continue,
                Value::Object(ref m)
                    if m.get("kind")
                        .and_then(Value::as_str)
                        .is_some_and(|k| k.ends_with("List")) =>
                {
                    m.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                }
                other => vec![other],
            };
            for item in items {
                out.push(self.create_or_replace(item)?);
            }
        }
        Ok(out)
    }

    fn create_or_replace(&self, obj: Value) -> Result<Value> {
        match self.create(obj.clone()) {
            Err(Error::Api(e)) if e.reason == "AlreadyExists" => {
                let res = Self::resource_of(&obj)?;
                let ns = ns_of(
                    res,
                    obj.pointer("/metadata/namespace").and_then(Value::as_str),
                );
                let name = obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let mut body = obj;
                if let Some(m) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                Ok(self
                    .store()
                    .update(res, &ns, &name, body, false, None, false)?
                    .value
                    .clone())
            }
            other => other,
        }
    }

    /// Gets an object by resource name (`pods`, `po`, `Pod`, `deployments.apps`).
    pub fn get(&self, resource: &str, ns: Option<&str>, name: &str) -> Option<Value> {
        let res = resources::find_by_name(resource)?;
        self.store()
            .get(res, &ns_of(res, ns), name)
            .ok()
            .map(|o| o.value.clone())
    }

    /// Lists objects of a resource, in one namespace or all.
    pub fn list(&self, resource: &str, ns: Option<&str>) -> Vec<Value> {
        let Some(res) = resources::find_by_name(resource) else {
            return Vec::new();
        };
        let filter = Filter {
            namespace: ns.filter(|_| RESOURCES[res].namespaced).map(str::to_string),
            ..Filter::default()
        };
        self.store()
            .list(res, &filter, None, None)
            .map(|l| l.items.iter().map(|o| o.value.clone()).collect())
            .unwrap_or_default()
    }

    /// Changes an object in place (status included) and stores it as an update.
    pub fn modify(
        &self,
        resource: &str,
        ns: Option<&str>,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Result<Value> {
        let res = resource_of_name(resource)?;
        Ok(self
            .store()
            .modify(res, &ns_of(res, ns), name, f)?
            .value
            .clone())
    }

    /// Deletes an object as `kubectl delete` would (default grace). Returns the object if it
    /// remains (terminating or held by finalizers).
    pub fn delete(&self, resource: &str, ns: Option<&str>, name: &str) -> Result<Option<Value>> {
        self.delete_with_grace(resource, ns, name, None)
    }

    /// Deletes with an explicit grace period.
    pub fn delete_with_grace(
        &self,
        resource: &str,
        ns: Option<&str>,
        name: &str,
        grace_seconds: Option<i64>,
    ) -> Result<Option<Value>> {
        let res = resource_of_name(resource)?;
        let opts = DeleteOpts {
            grace: grace_seconds,
            ..DeleteOpts::default()
        };
        Ok(
            match self.store().delete(res, &ns_of(res, ns), name, &opts)? {
                Deleted::Gone(_) => None,
                Deleted::Pending(o) => Some(o.value.clone()),
            },
        )
    }

    /// Creates a Ready node with the usual labels, capacity and kubelet version.
    pub fn seed_node(&self, name: &str) -> Result<Value> {
        self.create(node_json(name))
    }

    /// Creates an `apps/v1` DaemonSet selecting `app=<name>` (a stored object: the emulator runs
    /// no controller, so it creates no pods).
    pub fn seed_daemonset(&self, ns: &str, name: &str) -> Result<Value> {
        self.create(serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": name, "image": name}]}
                }
            }
        }))
    }

    /// Creates a pod.
    pub fn seed_pod(&self, pod: PodSeed) -> Result<Value> {
        let ready = pod.ready;
        let (ns, name) = (pod.namespace.clone(), pod.name.clone());
        let created = self.create(pod.to_json())?;
        if ready {
            return self.set_pod_ready(&ns, &name, true);
        }
        Ok(created)
    }

    /// Sets a pod's Ready (and ContainersReady) condition; `true` also makes it Running.
    pub fn set_pod_ready(&self, ns: &str, name: &str, ready: bool) -> Result<Value> {
        Ok(self
            .store()
            .modify(PODS, ns, name, |p| store::set_ready_status(p, ready))?
            .value
            .clone())
    }

    /// Marks a pod Running and Ready.
    pub fn mark_pod_running_ready(&self, ns: &str, name: &str) -> Result<Value> {
        self.set_pod_ready(ns, name, true)
    }

    /// Every status snapshot of a PodDisruptionBudget, oldest first.
    pub fn pdb_history(&self, ns: &str, name: &str) -> Vec<PdbSnapshot> {
        self.store().pdb_history(ns, name)
    }

    /// Every eviction request answered so far.
    pub fn evictions(&self) -> Vec<EvictionRecord> {
        self.store().evictions()
    }

    /// The kept request log entries, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.log.entries()
    }

    /// Request counters by verb, resource and user agent.
    pub fn request_counts(&self) -> Vec<RequestCount> {
        self.shared.log.counts()
    }

    /// Requests of a verb and resource from user agents starting with `ua_prefix`.
    pub fn count_requests(&self, verb: &str, resource: &str, ua_prefix: &str) -> u64 {
        self.shared
            .log
            .counts()
            .iter()
            .filter(|c| {
                c.verb == verb && c.resource == resource && c.user_agent.starts_with(ua_prefix)
            })
            .map(|c| c.count)
            .sum()
    }

    /// Forgets the request log and counters.
    pub fn clear_requests(&self) {
        self.shared.log.clear();
    }

    /// Adds a fault rule; returns its id.
    pub fn add_fault(&self, rule: FaultRule) -> u64 {
        self.shared.faults.add(rule)
    }

    /// Removes a fault rule.
    pub fn remove_fault(&self, id: u64) {
        self.shared.faults.remove(id);
    }

    /// Removes every fault rule and the added latency.
    pub fn clear_faults(&self) {
        self.shared.faults.clear();
    }

    /// Delays every API request.
    pub fn set_latency(&self, d: Duration) {
        self.shared.faults.set_latency(d);
    }

    /// The requests the added latency holds now, as (verb, resource), e.g. `("list", "pods")`.
    pub fn held_requests(&self) -> Vec<(String, String)> {
        self.shared.faults.held()
    }

    /// Ends every open watch (clients see the stream end and re-watch).
    pub fn close_watches(&self) {
        self.shared.close_watches();
    }

    /// Closes the listening socket and every connection, and reopens the same port after `d`.
    /// Returns once the socket is closed.
    pub async fn refuse_connections(&self, d: Duration) {
        let (ack, done) = oneshot::channel();
        if self
            .shared
            .refuse_tx
            .send(RefuseCmd { duration: d, ack })
            .is_ok()
        {
            let _ = done.await;
        }
    }

    /// Drops all watch history and continue tokens: resuming from any older resourceVersion now
    /// answers 410 Gone (as after an etcd compaction).
    pub fn compact_history(&self) {
        self.shared.store.compact();
    }

    /// Stops serving and waits for the server tasks to end.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for EmulatorHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn resource_of_name(name: &str) -> Result<ResId> {
    resource(name)
}

/// The Node [`EmulatorHandle::seed_node`] creates.
pub fn node_json(name: &str) -> Value {
    let ts = pdb::timestamp(chrono::Utc::now());
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            }
        },
        "spec": {},
        "status": {
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": ts, "lastTransitionTime": ts}
            ],
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": format!("v1.{}.0", server::SERVER_MINOR),
                         "operatingSystem": "linux", "architecture": "amd64"}
        }
    })
}

/// A pod to seed, built step by step.
#[derive(Debug, Clone, Default)]
pub struct PodSeed {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Controller owner: (kind, name).
    pub owner: Option<(String, String)>,
    /// Make it Running and Ready after creating it.
    pub ready: bool,
    /// `spec.terminationGracePeriodSeconds`.
    pub grace: Option<i64>,
    /// Give it an emptyDir volume.
    pub empty_dir: bool,
    /// `status.phase`.
    pub phase: Option<String>,
    /// `metadata.finalizers`.
    pub finalizers: Vec<String>,
}

impl PodSeed {
    /// A pod with one container and nothing else.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            ..Self::default()
        }
    }

    /// Binds it to a node.
    pub fn node(mut self, node: &str) -> Self {
        self.node = Some(node.to_string());
        self
    }

    /// Adds a label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.to_string(), v.to_string());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.annotations.insert(k.to_string(), v.to_string());
        self
    }

    /// Sets the controller owner (`ReplicaSet`, `DaemonSet`, `StatefulSet`, `Job`, `Node`, ...).
    pub fn owner(mut self, kind: &str, name: &str) -> Self {
        self.owner = Some((kind.to_string(), name.to_string()));
        self
    }

    /// Makes it a mirror pod (static pod shown by the kubelet), owned by its node.
    pub fn mirror(mut self) -> Self {
        self.annotations.insert(
            "kubernetes.io/config.mirror".into(),
            "0123456789abcdef0123456789abcdef".into(),
        );
        if let Some(n) = self.node.clone() {
            self.owner = Some(("Node".into(), n));
        }
        self
    }

    /// Gives it an emptyDir volume.
    pub fn empty_dir(mut self) -> Self {
        self.empty_dir = true;
        self
    }

    /// Makes it Running and Ready (or not) once created.
    pub fn ready(mut self, ready: bool) -> Self {
        self.ready = ready;
        self
    }

    /// Sets `terminationGracePeriodSeconds`.
    pub fn grace(mut self, seconds: i64) -> Self {
        self.grace = Some(seconds);
        self
    }

    /// Sets `status.phase`.
    pub fn phase(mut self, phase: &str) -> Self {
        self.phase = Some(phase.to_string());
        self
    }

    /// Adds a finalizer.
    pub fn finalizer(mut self, f: &str) -> Self {
        self.finalizers.push(f.to_string());
        self
    }

    /// The Pod JSON.
    pub fn to_json(&self) -> Value {
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
        });
        if !self.labels.is_empty() {
            pod["metadata"]["labels"] = json!(self.labels);
        }
        if !self.annotations.is_empty() {
            pod["metadata"]["annotations"] = json!(self.annotations);
        }
        if !self.finalizers.is_empty() {
            pod["metadata"]["finalizers"] = json!(self.finalizers);
        }
        if let Some((kind, name)) = &self.owner {
            let api_version = match kind.as_str() {
                "Node" => "v1",
                "Job" => "batch/v1",
                _ => "apps/v1",
            };
            pod["metadata"]["ownerReferences"] = json!([{
                "apiVersion": api_version, "kind": kind, "name": name,
                "uid": format!("{:032x}", rand::random::<u128>()),
                "controller": true, "blockOwnerDeletion": true
            }]);
        }
        if let Some(n) = &self.node {
            pod["spec"]["nodeName"] = json!(n);
        }
        if let Some(g) = self.grace {
            pod["spec"]["terminationGracePeriodSeconds"] = json!(g);
        }
        if self.empty_dir {
            pod["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
            pod["spec"]["containers"][0]["volumeMounts"] =
                json!([{"name": "scratch", "mountPath": "/scratch"}]);
        }
        if let Some(p) = &self.phase {
            pod["status"] = json!({"phase": p});
        }
        pod
    }
}
