//! The thin executor: gather a snapshot from the API and the provider, call [`decide`], carry
//! out the actions, publish metrics, events and the status ConfigMap — as the Lease holder only.
//!
//! Nothing here is remembered between passes except which drains this process is running (so
//! a slow drain is not started twice); everything else is read back from the cluster and the
//! provider each pass, which is what lets a restarted or new leader carry on where the last one
//! stopped.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PostParams};
use kube::runtime::events::{EventType, Recorder};
use serde_json::json;
use tokio::time::Instant;
use tracing::{debug, error, info, instrument, warn};

use super::decide::{self, Action, GroupState, ScaleUpReason};
use super::metrics::{self, Metrics};
use super::model::{self, Backoff, SCALE_DOWN_FAILED, Snapshot, UNNEEDED_SINCE};
use super::provider::{self, CLUSTER_TAG, CreateSpec, POOL_TAG, Provider};
use super::{SCALE_DOWN_REASON, token};

/// The scale-down lifts only its own cordon when it gives a node back.
const SCALE_DOWN_LIFTER: crate::drain::Lifter<'static> =
    crate::drain::Lifter::Reason(SCALE_DOWN_REASON);
use crate::config::{GroupSettings, ScalerSettings, Settings};
use crate::drain::{DrainOptions, DrainOutcome, DrainReport};
use crate::lease::Elector;
use crate::render::values::{DEFAULT_HOSTNAME_PATTERN, Inputs, TokenSource, Values};
use crate::secret::Secret;

/// Name of the status ConfigMap.
pub const STATUS_CONFIGMAP: &str = "nodeward-scaler-status";
/// Machines created at once within one scale-up: enough to start 100 machines in seconds
/// without bursting a provider's rate limit.
const CREATE_CONCURRENCY: usize = 8;
/// Pod events per pass at most: 3,000 pending pods must not mean 3,000 event writes every 10 s.
const POD_EVENTS_PER_PASS: usize = 100;
/// Actions listed in the status ConfigMap.
const STATUS_ACTIONS: usize = 50;

/// Errors of the scaler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("cannot {action}: {source}")]
    Api {
        /// What was being done.
        action: &'static str,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The provider failed.
    #[error(transparent)]
    Provider(#[from] provider::Error),
    /// A bootstrap token could not be minted.
    #[error(transparent)]
    Token(#[from] token::Error),
    /// A values file or template could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A group's values do not validate.
    #[error("node group {group}: {source}")]
    Values {
        /// The group.
        group: String,
        /// Why.
        #[source]
        source: crate::render::values::Error,
    },
    /// A group's template does not render.
    #[error("node group {group}: {source}")]
    Render {
        /// The group.
        group: String,
        /// Why.
        #[source]
        source: crate::render::Error,
    },
    /// Another replica holds the Lease.
    #[error("another replica holds the Lease")]
    NotLeader,
    /// The metrics address could not be bound.
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        /// The address.
        addr: std::net::SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// `pub type Result` for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn api(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api { action, source }
}

/// How the scaler runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Decide and log, change nothing.
    pub dry_run: bool,
    /// This replica's Lease identity.
    pub identity: String,
}

/// A group's template, read once at start.
#[derive(Debug)]
struct GroupTemplate {
    name: String,
    text: String,
}

/// What a pass carries from one action to the next while it carries them out.
struct PassState<'a> {
    /// The pass's time, taken once its snapshot was read.
    now: Timestamp,
    /// When the pass began: where the pending-to-create latency starts.
    started: Instant,
    /// The groups' back-off as the actions leave it, for the status ConfigMap.
    backoff: BTreeMap<String, Backoff>,
    /// The snapshot's pods by key, for their Events.
    pods_by_key: BTreeMap<String, &'a model::PodView>,
    /// Pod Events sent so far, at most [`POD_EVENTS_PER_PASS`].
    pod_events: usize,
    /// How long after the pass began its first create request left, if one did.
    first_create: Option<Duration>,
}

impl PassState<'_> {
    /// Records that `group` backs off until `until` after `failures` failed machines.
    fn back_off(&mut self, group: &str, failures: u32, until: Timestamp) {
        self.backoff.insert(
            group.to_string(),
            Backoff {
                failures,
                last_failure: Some(self.now),
                until: Some(until),
            },
        );
    }
}

struct Inner<P> {
    client: kube::Client,
    provider: P,
    settings: ScalerSettings,
    drain: DrainOptions,
    values_path: PathBuf,
    values_text: String,
    templates: BTreeMap<String, GroupTemplate>,
    opts: RunOptions,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    draining: Mutex<HashSet<String>>,
    /// Bootstrap tokens minted for machines that have not joined yet.
    tokens: Mutex<token::Outstandings>,
    leader_until: Mutex<Option<Instant>>,
    elector: Elector,
}

/// The scaler.
pub struct Scaler<P> {
    inner: Arc<Inner<P>>,
}

impl<P> std::fmt::Debug for Scaler<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scaler")
            .field("identity", &self.inner.opts.identity)
            .finish_non_exhaustive()
    }
}

fn sets_for(g: &GroupSettings, s: &ScalerSettings) -> Vec<String> {
    let mut sets = vec![
        format!("cluster_name={}", s.cluster_name),
        format!("node_group={}", g.name),
        format!(
            "hostname_pattern={}",
            g.hostname_pattern
                .as_deref()
                .unwrap_or(DEFAULT_HOSTNAME_PATTERN)
        ),
    ];
    sets.extend(g.labels.iter().map(|(k, v)| format!("node_labels.{k}={v}")));
    if !g.taints.is_empty() {
        sets.push(format!(
            "node_taints={}",
            g.taints
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    sets
}

/// Reads each group's template, fills its capacity from the provider's plans where the config
/// leaves it out, and renders it once with a throwaway token, so a broken one fails at start.
async fn load_templates(
    provider: &impl Provider,
    s: &mut ScalerSettings,
    values_path: &Path,
    values_text: &str,
) -> Result<BTreeMap<String, GroupTemplate>> {
    let mut templates = BTreeMap::new();
    let mut groups = std::mem::take(&mut s.groups);
    for g in &mut groups {
        let text = std::fs::read_to_string(&g.template).map_err(|source| Error::Read {
            path: g.template.clone(),
            source,
        })?;
        fill_capacity(provider, g).await;
        let template = GroupTemplate {
            name: g.template.display().to_string(),
            text,
        };
        let trial = token::generate(&mut rand::rng());
        let values = build_values(values_path, values_text, g, s, &trial)?;
        crate::render::render(&template.name, &template.text, &values).map_err(|source| {
            Error::Render {
                group: g.name.clone(),
                source,
            }
        })?;
        templates.insert(g.name.clone(), template);
    }
    s.groups = groups;
    Ok(templates)
}

/// Fills the cpu and memory the group's config leaves out from its plan's, as the provider
/// reports them; a group still without them cannot scale up from zero, which is logged.
async fn fill_capacity(provider: &impl Provider, g: &mut GroupSettings) {
    let r = &mut g.capacity.resources;
    if (r.cpu_milli == 0 || r.memory == 0) && !g.plan.is_empty() {
        match provider.plan_capacity(&g.plan).await {
            Ok(Some(plan)) => {
                if r.cpu_milli == 0 {
                    r.cpu_milli = plan.cpu_milli;
                }
                if r.memory == 0 {
                    r.memory = plan.memory;
                }
            }
            Ok(None) => {
                warn!(group = %g.name, plan = %g.plan, "the provider does not know the plan; set capacity in the group")
            }
            Err(e) => {
                warn!(group = %g.name, error = %e, "cannot read plans; set capacity in the group")
            }
        }
    }
    if g.capacity.resources.cpu_milli == 0 || g.capacity.resources.memory == 0 {
        warn!(group = %g.name, "no cpu/memory capacity known: the group cannot scale up from zero");
    }
}

impl<P: Provider + 'static> Scaler<P> {
    /// Reads the values file and every group's template, fills capacities from the provider's
    /// plans where the config leaves them out, and renders each group once with a throwaway
    /// token so a broken template stops the scaler at start, not at its first scale-up.
    pub async fn new(
        client: kube::Client,
        provider: P,
        settings: &Settings,
        opts: RunOptions,
    ) -> Result<Self> {
        let mut s = settings.scaler.clone();
        let values_path = s.values.clone();
        // Without groups there is nothing to render, and no values file is needed.
        let values_text = if s.groups.is_empty() {
            warn!("no [[scaler.groups]] configured: the scaler will only watch");
            String::new()
        } else {
            std::fs::read_to_string(&values_path).map_err(|source| Error::Read {
                path: values_path.clone(),
                source,
            })?
        };
        let templates = load_templates(&provider, &mut s, &values_path, &values_text).await?;
        // The machine is deleted after the drain: its pods' scratch data goes with it.
        let drain = DrainOptions::for_leaving_node(&settings.drain, SCALE_DOWN_REASON, false);
        let elector = Elector::new(
            client.clone(),
            &s.namespace,
            &s.lease_name,
            &opts.identity,
            s.lease_duration,
        );
        Ok(Self {
            inner: Arc::new(Inner {
                recorder: crate::events::recorder(
                    &client,
                    "nodeward-scaler",
                    Some(opts.identity.clone()),
                ),
                client,
                provider,
                settings: s,
                drain,
                values_path,
                values_text,
                templates,
                opts,
                metrics: Arc::new(Metrics::default()),
                draining: Mutex::new(HashSet::new()),
                tokens: Mutex::new(token::Outstandings::default()),
                leader_until: Mutex::new(None),
                elector,
            }),
        })
    }

    /// The metrics this scaler updates.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.inner.metrics.clone()
    }

    /// Runs until `shutdown` completes: leader election in its own task, a pass every
    /// `scan_interval` while leader, and the metrics endpoint if configured.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        let inner = self.inner.clone();
        let s = &inner.settings;
        let _metrics_task = match s.metrics_address {
            Some(addr) => Some(crate::task::AbortOnDrop(
                crate::metrics_http::serve(addr, inner.metrics.clone())
                    .await
                    .map_err(|source| Error::Metrics { addr, source })?
                    .1,
            )),
            None => None,
        };
        let renew_every = s.lease_duration / 3;
        let _election = {
            let inner = inner.clone();
            crate::task::AbortOnDrop(tokio::spawn(async move {
                loop {
                    let until = inner.elector.try_acquire().await;
                    inner.metrics.leader.set(i64::from(until.is_some()));
                    *lock(&inner.leader_until) = until;
                    tokio::time::sleep(renew_every).await;
                }
            }))
        };
        let liveness = &inner.metrics.liveness;
        liveness.set_stall_after(stall_after(s));
        liveness.beat();
        let _watchdog = sd_notify::watchdog_enabled().map(|period| {
            let inner = inner.clone();
            crate::task::AbortOnDrop(tokio::spawn(async move {
                feed_watchdog(&inner.metrics.liveness, period).await
            }))
        });
        let mut shutdown = std::pin::pin!(shutdown);
        info!(identity = %inner.opts.identity, dry_run = inner.opts.dry_run, groups = s.groups.len(), "scaler started");
        crate::systemd::notify(&[sd_notify::NotifyState::Ready]);
        loop {
            inner.metrics.liveness.beat();
            let next = Instant::now() + s.scan_interval;
            // The signal drops a pass in flight, as a crash would: its writes are fenced by the
            // Lease, and the next leader's pass starts from what the API server holds.
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = inner.clone().turn() => {}
            }
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = tokio::time::sleep_until(next) => {}
            }
        }
        crate::systemd::notify(&[sd_notify::NotifyState::Stopping]);
        drop(_election);
        if tokio::time::timeout(RELEASE_LIMIT, inner.elector.release())
            .await
            .is_err()
        {
            warn!(limit = ?RELEASE_LIMIT, "the API server did not answer the Lease's release; the next replica takes it when it expires");
        }
        info!("scaler stopped");
        Ok(())
    }

    /// One pass as the Lease holder: takes or renews the Lease first (so its deletes are fenced
    /// like every other pass's), and fails if another replica holds it.
    pub async fn pass_once(&self) -> Result<Vec<Action>> {
        let until = self.inner.elector.try_acquire().await;
        *lock(&self.inner.leader_until) = until;
        if until.is_none() {
            return Err(Error::NotLeader);
        }
        self.inner.clone().pass().await
    }
}

/// How long a stopping scaler waits to give its Lease back: an API server that does not answer
/// must not hold the stop (systemd's or the kubelet's SIGKILL would come first); the next
/// replica then takes the Lease once it expires.
pub const RELEASE_LIMIT: Duration = Duration::from_secs(2);

/// How long one turn of the loop may take before the scaler counts as stalled: two scan
/// intervals, plus twice the longest a provider call or a Kubernetes request may take (a pass
/// makes both), plus a minute.
pub(crate) fn stall_after(s: &ScalerSettings) -> Duration {
    let provider = s.cherry.request_timeout.max(s.exec.timeout);
    let call = provider.max(crate::kube_client::REQUEST_DEADLINE);
    s.scan_interval
        .saturating_mul(2)
        .saturating_add(call.saturating_mul(2))
        .saturating_add(Duration::from_secs(60))
}

/// When a token minted at `now` expires: `token_ttl` later (an hour if it cannot be represented).
pub(crate) fn token_expiry(s: &ScalerSettings, now: Timestamp) -> Timestamp {
    let ttl = jiff::SignedDuration::try_from(s.token_ttl)
        .unwrap_or(jiff::SignedDuration::from_secs(3600));
    now.checked_add(ttl).unwrap_or(now)
}

/// Sends systemd `WATCHDOG=1` every half `period` while the loop makes progress, so a scaler
/// whose loop or runtime hangs is killed and restarted (`WatchdogSec=`, `Restart=on-failure`).
async fn feed_watchdog(liveness: &crate::metrics_http::Liveness, period: Duration) {
    let mut tick = tokio::time::interval(period / 2);
    let mut said = false;
    loop {
        tick.tick().await;
        match liveness.stalled() {
            None => {
                crate::systemd::notify(&[sd_notify::NotifyState::Watchdog]);
                said = false;
            }
            Some(d) if !said => {
                error!(
                    since_s = d.as_secs(),
                    "the scaler's loop stalled: no longer feeding systemd's watchdog"
                );
                said = true;
            }
            Some(_) => {}
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn build_values(
    path: &std::path::Path,
    text: &str,
    g: &GroupSettings,
    s: &ScalerSettings,
    token: &crate::render::values::BootstrapToken,
) -> Result<Values> {
    let sets = sets_for(g, s);
    Values::build(
        Inputs {
            file: Some((path, text)),
            sets: &sets,
            token: Some(TokenSource {
                origin: "minted bootstrap token".into(),
                token: Secret::new(token.expose()),
            }),
        },
        &crate::render::values::rand8(),
    )
    .map_err(|source| Error::Values {
        group: g.name.clone(),
        source,
    })
}

fn pod_ref(p: &model::PodView) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(p.name.clone()),
        namespace: Some(p.namespace.clone()),
        uid: Some(p.uid.clone()),
        ..ObjectReference::default()
    }
}

/// The cluster shutdown's intent ConfigMap.
fn intent_ref() -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: Some(crate::names::CLUSTER_SHUTDOWN_CONFIGMAP.into()),
        namespace: Some(crate::names::CLUSTER_SHUTDOWN_NAMESPACE.into()),
        ..ObjectReference::default()
    }
}

fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.to_string()),
        ..ObjectReference::default()
    }
}

impl<P: Provider + 'static> Inner<P> {
    fn is_leader(&self) -> bool {
        // Stop acting a tenth of the Lease before it runs out: others may take it only after.
        let margin = self.settings.lease_duration / 10;
        lock(&self.leader_until).is_some_and(|u| u > Instant::now() + margin)
    }

    /// The cluster-health guard's Warning Event, on the status ConfigMap (the scaler's own
    /// object: the guard is about the cluster, not one Node).
    async fn guard_event(&self, note: String) {
        let status = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            namespace: Some(self.settings.namespace.clone()),
            name: Some(STATUS_CONFIGMAP.into()),
            ..ObjectReference::default()
        };
        self.event(
            &status,
            EventType::Warning,
            "ClusterUnhealthy",
            "Repair",
            note,
        )
        .await;
    }

    async fn event(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        crate::events::publish(&self.recorder, reference, type_, reason, action, note).await;
    }

    #[instrument(skip(self), err)]
    async fn gather(&self) -> Result<Snapshot> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let pods: Api<Pod> = Api::all(self.client.clone());
        let status: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        let budgets: Api<PodDisruptionBudget> = Api::all(self.client.clone());
        let all = ListParams::default();
        let live = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let (nodes, pods, status, budgets, machines, daemonsets, cluster_shutdown) = tokio::join!(
            nodes.list(&all),
            pods.list(&live),
            status.get_opt(STATUS_CONFIGMAP),
            budgets.list(&all),
            self.provider.list(),
            self.daemonsets(),
            crate::cluster::read_intent(&self.client),
        );
        let cluster_shutdown = match cluster_shutdown {
            // A scaler whose RBAC predates cluster shutdowns acts as it did.
            Err(kube::Error::Api(s)) if s.code == 403 => {
                warn!(
                    "cannot read ConfigMap kube-system/nodeward-cluster-shutdown (needs get on it: apply packaging/kubernetes/rbac-scaler.yaml); a cluster shutdown would not pause this scaler"
                );
                None
            }
            other => other.map_err(api("read ConfigMap kube-system/nodeward-cluster-shutdown"))?,
        };
        let daemonsets = daemonsets?;
        let nodes = nodes.map_err(api("list nodes"))?;
        let cluster_shutdown = cluster_shutdown.map(|i| model::ClusterShutdownView {
            requested_by: i.requested_by,
            started_at: i.started_at,
            live: crate::cluster::intent::is_live(&nodes.items),
        });
        let pods = pods.map_err(api("list pods"))?;
        let status = status.map_err(api("read the status ConfigMap"))?;
        let budgets = budgets.map_err(api("list poddisruptionbudgets"))?;
        let machines = machines?;
        let backoff = status
            .and_then(|cm| cm.data)
            .and_then(|d| d.get("backoff").cloned())
            .and_then(|b| serde_json::from_str(&b).ok())
            .unwrap_or_default();
        Ok(Snapshot {
            nodes: nodes.items.iter().map(model::node_view).collect(),
            pods: pods
                .items
                .iter()
                .filter_map(|p| model::pod_view(p, &self.leave_context(&daemonsets)))
                .collect(),
            machines,
            backoff,
            budgets: budgets.items.iter().map(model::budget_view).collect(),
            cluster_shutdown,
        })
    }

    /// The DaemonSets (`apps/v1`) that exist, by namespace and name: whether a DaemonSet's pod
    /// stays with its node or keeps the drain from completing, as the drain's own watch says.
    async fn daemonsets(&self) -> Result<HashSet<(String, String)>> {
        let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::all(self.client.clone());
        let list = daemonsets
            .list_metadata(&ListParams::default())
            .await
            .map_err(api("list daemonsets"))?;
        Ok(list
            .items
            .into_iter()
            .map(|d| {
                (
                    d.metadata.namespace.unwrap_or_default(),
                    d.metadata.name.unwrap_or_default(),
                )
            })
            .collect())
    }

    /// What leaves with a node, judged as this scaler's scale-down drain will judge it.
    fn leave_context<'a>(
        &self,
        daemonsets: &'a HashSet<(String, String)>,
    ) -> model::LeaveContext<'a> {
        model::LeaveContext {
            rules: self.drain.plan.rules(),
            daemonsets: Some(daemonsets),
        }
    }

    /// The node's pods and budgets as they are now, reduced to
    /// [`decide::scale_down_fingerprint`].
    async fn fingerprint(&self, node: &str) -> Result<String> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let budgets: Api<PodDisruptionBudget> = Api::all(self.client.clone());
        let on_node = ListParams::default().fields(&format!(
            "spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed"
        ));
        let all = ListParams::default();
        let (pods, budgets, daemonsets) =
            tokio::join!(pods.list(&on_node), budgets.list(&all), self.daemonsets());
        let daemonsets = daemonsets?;
        let pods: Vec<model::PodView> = pods
            .map_err(api("list the node's pods"))?
            .items
            .iter()
            .filter_map(|p| model::pod_view(p, &self.leave_context(&daemonsets)))
            .collect();
        let budgets: Vec<model::BudgetView> = budgets
            .map_err(api("list poddisruptionbudgets"))?
            .items
            .iter()
            .map(model::budget_view)
            .collect();
        Ok(decide::scale_down_fingerprint(
            &pods.iter().collect::<Vec<_>>(),
            &budgets,
        ))
    }

    /// One turn of the loop: a pass if this replica leads, a failed one logged.
    async fn turn(self: Arc<Self>) {
        if !self.is_leader() {
            debug!("not the leader; waiting");
            return;
        }
        if let Err(e) = self.pass().await {
            error!(error = %e, "pass failed; retrying next pass");
        }
    }

    /// One pass: gather a snapshot, decide, publish the figures and log the decisions; then,
    /// unless a dry run, carry the actions out while still leader and write the status.
    async fn pass(self: Arc<Self>) -> Result<Vec<Action>> {
        let started = Instant::now();
        let snap = self.gather().await?;
        let now = Timestamp::now();
        self.delete_joined_tokens(&snap, now).await;
        let decided = Instant::now();
        let actions = decide::decide(&snap, now, &self.settings);
        self.metrics
            .decision_seconds
            .observe(decided.elapsed().as_secs_f64());
        let states = decide::group_states(&snap, now, &self.settings);
        let pending = snap.pods.iter().filter(|p| p.unschedulable).count();
        self.export(&states, pending, &actions);
        for a in &actions {
            log_action(a, self.opts.dry_run);
        }
        if self.opts.dry_run {
            return Ok(actions);
        }
        let mut run = PassState {
            now,
            started,
            backoff: snap.backoff.clone(),
            pods_by_key: snap.pods.iter().map(|p| (p.key(), p)).collect(),
            pod_events: 0,
            first_create: None,
        };
        for a in &actions {
            if !self.is_leader() {
                warn!("lost the Lease mid-pass; stopping");
                break;
            }
            self.carry_out(a, &mut run).await;
        }
        if let Some(d) = run.first_create {
            self.metrics
                .pending_to_create_seconds
                .observe(d.as_secs_f64());
        }
        self.write_status(now, &states, &run.backoff, pending, &actions)
            .await;
        Ok(actions)
    }

    /// Carries out one of the pass's actions: a machine or Node deleted, machines created, a
    /// Node annotated or drained, an Event sent, or the back-off changed for the status.
    async fn carry_out(self: &Arc<Self>, a: &Action, run: &mut PassState<'_>) {
        match a {
            Action::Repair {
                group,
                machine,
                node,
                reason,
            } => {
                self.repair(group, machine, node.as_deref(), *reason).await;
            }
            Action::BackOff {
                group,
                failures,
                until,
            } => run.back_off(group, *failures, *until),
            Action::ClearBackOff { group } => {
                run.backoff.remove(group);
            }
            Action::GuardHolds {
                group,
                unready,
                total,
                held,
            } => {
                self.guard_event(guard_note(group.as_deref(), *unready, *total, *held))
                    .await
            }
            Action::DeleteNode {
                group,
                node,
                reason,
            } => {
                if self.fenced(group, &format!("delete Node {node}")).await {
                    info!(group, node, %reason, "deleting a Node whose machine is gone");
                    self.delete_node(node).await;
                }
            }
            Action::MarkUnneeded { node, since } => {
                self.annotate(node, Some(since.to_string())).await
            }
            Action::ClearUnneeded { node } => self.annotate(node, None).await,
            Action::ScaleUp {
                group,
                count,
                reason,
                pods,
            } => {
                self.scale_up_and_tell(group, *count, *reason, pods, run)
                    .await
            }
            Action::NoScaleUp { pod, reason } => {
                let note = reason.clone();
                self.pod_event(run, pod, "NotTriggerScaleUp", note).await;
            }
            Action::CancelScaleDown { group, node } => {
                // A drain under way checks the opt-out itself before its delete.
                if !lock(&self.draining).contains(node) {
                    self.cancel_scale_down(group, node).await;
                }
            }
            Action::ScaleDown {
                group,
                node,
                machine,
                ..
            } => self.start_scale_down(group, node, machine),
            // Logged with the pass's decisions; nothing to carry out.
            Action::ClusterShutdown { .. } => {}
            // Logged too, and said where `kubectl get events -n kube-system` shows it (the
            // recorder folds the passes' repeats into one series).
            Action::StaleClusterShutdown {
                requested_by,
                started_at,
            } => self.say_stale_intent(requested_by, started_at).await,
        }
    }

    /// A Warning Event on the cluster shutdown's ConfigMap: its record is stale, not obeyed.
    async fn say_stale_intent(&self, requested_by: &str, started_at: &str) {
        let note = format!(
            "the cluster shutdown recorded by {requested_by} at {started_at} is stale: no node holds its cordon any more; not obeyed (the scaler acts, shutdown drains wait on budgets); `nodeward cluster start` removes the record"
        );
        let reason = "ClusterShutdownStale";
        self.event(&intent_ref(), EventType::Warning, reason, "Ignore", note)
            .await;
    }

    /// Scales the group up, then tells the pods that triggered it with an Event each, within
    /// the pass's budget of pod Events.
    async fn scale_up_and_tell(
        &self,
        group: &str,
        count: u32,
        reason: ScaleUpReason,
        pods: &[String],
        run: &mut PassState<'_>,
    ) {
        let created = self.scale_up(group, count, run).await;
        let note = format!("pod triggered scale-up: node group {group} +{created} ({reason:?})");
        for key in pods {
            if !self
                .pod_event(run, key, "TriggeredScaleUp", note.clone())
                .await
            {
                break;
            }
        }
        if reason != ScaleUpReason::PendingPods {
            debug!(group, count, ?reason, "scale-up without pods");
        }
    }

    /// Starts the node's scale-down in a task of its own, unless this process already runs
    /// it: a drain can outlast many passes.
    fn start_scale_down(self: &Arc<Self>, group: &str, node: &str, machine: &str) {
        let fresh = lock(&self.draining).insert(node.to_string());
        if fresh {
            let me = self.clone();
            let (group, node, machine) = (group.to_string(), node.to_string(), machine.to_string());
            tokio::spawn(async move { me.scale_down(&group, &node, &machine).await });
        }
    }

    async fn annotate(&self, node: &str, value: Option<String>) {
        let annotations = json!({UNNEEDED_SINCE: value});
        self.write_annotations(node, annotations, "the unneeded-since annotation")
            .await;
    }

    /// Merges `annotations` (`null` removes one) into the Node's; a failure is logged.
    async fn write_annotations(&self, node: &str, annotations: serde_json::Value, what: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"metadata": {"annotations": annotations}});
        if let Err(e) = nodes
            .patch(
                node,
                &crate::node_write::patch_params(),
                &Patch::Merge(&patch),
            )
            .await
        {
            warn!(node, error = %e, "cannot update {what}");
        }
    }

    /// Deletes `machine` at the provider if this replica still leads ([`Self::fenced`]);
    /// `None` when it does not.
    async fn delete_machine(&self, group: &str, machine: &str) -> Option<provider::Result<()>> {
        if !self
            .fenced(group, &format!("delete machine {machine}"))
            .await
        {
            return None;
        }
        Some(self.provider.delete(machine).await)
    }

    /// Whether this replica may do an irreversible act now ([`Elector::confirm`]): create or
    /// delete a machine, mint a token, delete a Node. A refusal is logged with what was not
    /// done and counted as failure kind `fenced`.
    async fn fenced(&self, group: &str, act: &str) -> bool {
        match self.elector.confirm().await {
            Ok(()) => true,
            Err(e) => {
                self.metrics
                    .failures
                    .get_or_create(&metrics::failure(group, "fenced"))
                    .inc();
                warn!(group, act, error = %e, "not acting: leadership is not confirmed");
                false
            }
        }
    }

    async fn delete_node(&self, node: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        match nodes.delete(node, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => warn!(node, error = %e, "cannot delete the Node"),
        }
    }

    async fn repair(
        &self,
        group: &str,
        machine: &str,
        node: Option<&str>,
        reason: decide::RepairReason,
    ) {
        warn!(group, machine, node, %reason, "deleting a broken machine");
        if let Some(n) = node {
            self.event(
                &node_ref(n),
                EventType::Warning,
                "DeletingBrokenMachine",
                "Repair",
                format!("nodeward scaler deletes machine {machine}: {reason}"),
            )
            .await;
        }
        let Some(deleted) = self.delete_machine(group, machine).await else {
            return;
        };
        match deleted {
            Ok(()) => {
                if let Some(n) = node {
                    self.delete_node(n).await;
                }
            }
            Err(e) => {
                self.metrics
                    .failures
                    .get_or_create(&metrics::failure(group, "repair"))
                    .inc();
                warn!(group, machine, error = %e, "cannot delete the broken machine; retrying next pass");
            }
        }
    }

    /// Creates `count` machines of `group`, each with a bootstrap token of its own, and
    /// returns how many the provider accepted; refused creates back the group off.
    async fn scale_up(&self, group: &str, count: u32, run: &mut PassState<'_>) -> u32 {
        let (now, started) = (run.now, run.started);
        let Some(g) = self.settings.groups.iter().find(|g| g.name == group) else {
            return 0;
        };
        let Some(template) = self.templates.get(group) else {
            return 0;
        };
        let expires = token_expiry(&self.settings, now);
        // Once per batch: its tokens and machines are one act.
        if !self
            .fenced(group, &format!("create {count} machine(s)"))
            .await
        {
            return 0;
        }
        info!(group, count, "scaling up");
        let first_sent = Mutex::new(None::<Duration>);
        let results: Vec<
            std::result::Result<(String, provider::Result<model::MachineView>), Error>,
        > = futures::stream::iter(std::iter::repeat_n((), count as usize))
            .map(|()| {
                let first_sent = &first_sent;
                async move {
                    // Each machine is one act: a replica that lost the Lease while the batch
                    // ran mints no token and creates no machine (the batch was fenced once).
                    if !self.is_leader() {
                        return Err(Error::NotLeader);
                    }
                    // Minted and rendered just before its create, so the first request
                    // leaves after one mint and one render rather than the whole batch's.
                    let spec = self.prepare(g, template, expires).await?;
                    lock(first_sent).get_or_insert_with(|| started.elapsed());
                    let host = spec.hostname.clone();
                    Ok((host, self.provider.create(&spec).await))
                }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect()
            .await;
        if let Some(d) = *lock(&first_sent) {
            run.first_create.get_or_insert(d);
        }
        let (created, refused_hosts) = self.tally(group, results);
        // A machine the provider refused never joins: its token goes now. One whose create
        // failed otherwise (a timeout) may exist after all, so its token stays until it joins.
        let abandoned: Vec<String> = {
            let mut tokens = lock(&self.tokens);
            refused_hosts
                .iter()
                .filter_map(|h| tokens.abandon(h))
                .collect()
        };
        self.delete_tokens(&abandoned, "its machine was refused")
            .await;
        // Refused creates (4xx such as quota) count as failed machines: decide's rule says how
        // long the group waits.
        if let Some(Action::BackOff {
            failures, until, ..
        }) = decide::back_off(
            group,
            run.backoff.get(group).copied(),
            u32::try_from(refused_hosts.len()).unwrap_or(u32::MAX),
            now,
            &self.settings,
        ) {
            run.back_off(group, failures, until);
        }
        created
    }

    /// One machine's create request: a bootstrap token of its own (one leaked user-data blob
    /// joins one machine), and the group's template rendered with it.
    async fn prepare(
        &self,
        g: &GroupSettings,
        template: &GroupTemplate,
        expires: Timestamp,
    ) -> Result<CreateSpec> {
        let group = g.name.as_str();
        let token = token::mint(
            &self.client,
            expires,
            &self.settings.token_extra_groups,
            group,
        )
        .await?;
        let rendered = build_values(
            &self.values_path,
            &self.values_text,
            g,
            &self.settings,
            &token,
        )
        .and_then(|values| {
            let user_data = crate::render::render(&template.name, &template.text, &values)
                .map_err(|source| Error::Render {
                    group: group.to_string(),
                    source,
                })?;
            Ok((values, user_data))
        });
        let (values, user_data) = match rendered {
            Ok(r) => r,
            Err(e) => {
                self.delete_tokens(
                    std::slice::from_ref(&token.id),
                    "its user data did not render",
                )
                .await;
                return Err(e);
            }
        };
        lock(&self.tokens).minted(&values.hostname, &token.id, expires);
        info!(group, hostname = %values.hostname, token_id = %token.id, "machine prepared");
        Ok(CreateSpec {
            group: group.to_string(),
            hostname: values.hostname.clone(),
            plan: g.plan.clone(),
            region: g.region.clone(),
            image: g.image.clone(),
            ssh_keys: g.ssh_keys.clone(),
            user_data: Secret::new(user_data),
            tags: BTreeMap::from([
                (CLUSTER_TAG.to_string(), self.settings.cluster_name.clone()),
                (POOL_TAG.to_string(), group.to_string()),
            ]),
            cherry: g.cherry.clone(),
        })
    }

    /// A Normal `ScaleUp` Event on the pending pod `key`, within the pass's budget of pod
    /// Events ([`POD_EVENTS_PER_PASS`]); false once the budget is spent.
    async fn pod_event(
        &self,
        run: &mut PassState<'_>,
        key: &str,
        reason: &str,
        note: String,
    ) -> bool {
        if run.pod_events >= POD_EVENTS_PER_PASS {
            return false;
        }
        if let Some(p) = run.pods_by_key.get(key) {
            run.pod_events += 1;
            self.event(&pod_ref(p), EventType::Normal, reason, "ScaleUp", note)
                .await;
        }
        true
    }

    /// The pass's figures: pending pods, each group's size, whether the guard holds.
    fn export(
        &self,
        states: &BTreeMap<String, decide::GroupState>,
        pending: usize,
        actions: &[Action],
    ) {
        self.metrics
            .pending_pods
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
        for (g, st) in states {
            self.metrics
                .group_size
                .get_or_create(&metrics::group(g))
                .set(i64::from(st.size));
        }
        let holding = actions
            .iter()
            .any(|a| matches!(a, Action::GuardHolds { .. }));
        self.metrics.guard_holding.set(i64::from(holding));
        let stale = actions
            .iter()
            .any(|a| matches!(a, Action::StaleClusterShutdown { .. }));
        self.metrics.cluster_shutdown_stale.set(i64::from(stale));
    }

    /// Deletes the bootstrap tokens of machines whose Node has registered: the kubelet has its
    /// own certificate by then, and a token that leaked from user data opens nothing more.
    async fn delete_joined_tokens(&self, snap: &Snapshot, now: Timestamp) {
        if lock(&self.tokens).is_empty() {
            return;
        }
        let nodes: HashSet<&str> = snap.nodes.iter().map(|n| n.name.as_str()).collect();
        let joined = lock(&self.tokens).joined(|host| nodes.contains(host), now);
        self.delete_tokens(&joined, "its node joined").await;
    }

    /// Deletes bootstrap tokens by id; a failure is logged and left to the token's expiry.
    async fn delete_tokens(&self, ids: &[String], why: &str) {
        for id in ids {
            match token::delete(&self.client, id).await {
                Ok(()) => info!(token_id = %id, why, "bootstrap token deleted"),
                Err(e) => {
                    warn!(token_id = %id, why, error = %e, "cannot delete a bootstrap token; it expires on its own")
                }
            }
        }
    }

    /// Counts and reports a batch's outcomes: how many were created, and the hostnames of the
    /// machines the provider refused for good.
    fn tally(
        &self,
        group: &str,
        results: Vec<std::result::Result<(String, provider::Result<model::MachineView>), Error>>,
    ) -> (u32, Vec<String>) {
        let (mut created, mut refused) = (0, Vec::new());
        for result in results {
            let (host, r) = match result {
                Ok(pair) => pair,
                Err(Error::NotLeader) => {
                    warn!(
                        group,
                        "lost the Lease mid-batch; the rest of it is not created"
                    );
                    continue;
                }
                Err(e) => {
                    let kind = if matches!(e, Error::Token(_)) {
                        "token"
                    } else {
                        "render"
                    };
                    self.metrics
                        .failures
                        .get_or_create(&metrics::failure(group, kind))
                        .inc();
                    error!(group, error = %e, "cannot prepare a machine; it is not created");
                    continue;
                }
            };
            match r {
                Ok(m) => {
                    created += 1;
                    self.metrics
                        .scale_ups
                        .get_or_create(&metrics::group(group))
                        .inc();
                    info!(group, machine = %m.id, hostname = %m.hostname, "machine created");
                }
                Err(e) => {
                    self.metrics
                        .failures
                        .get_or_create(&metrics::failure(group, "create"))
                        .inc();
                    warn!(group, hostname = %host, error = %e, retryable = e.is_retryable(), "cannot create a machine");
                    if !e.is_retryable() {
                        refused.push(host);
                    }
                }
            }
        }
        (created, refused)
    }

    async fn scale_down(&self, group: &str, node: &str, machine: &str) {
        info!(group, node, machine, "scale-down: draining");
        self.event(
            &node_ref(node),
            EventType::Normal,
            "ScaleDown",
            "ScaleDown",
            format!("node unneeded: nodeward scaler drains it and deletes machine {machine} of group {group}"),
        )
        .await;
        let result = crate::drain::drain(&self.client, node, &self.drain).await;
        match result {
            Ok(r) if r.outcome == DrainOutcome::Drained => {
                self.delete_drained(group, node, machine, r.evicted.len())
                    .await;
            }
            Ok(r) => self.give_back(group, node, &r).await,
            Err(e) => {
                self.metrics
                    .failures
                    .get_or_create(&metrics::failure(group, "drain"))
                    .inc();
                warn!(group, node, error = %e, "scale-down: drain failed; the next pass retries");
            }
        }
        lock(&self.draining).remove(node);
    }

    /// Deletes a drained node's machine, then its Node; not if the node was opted out since
    /// (its scale-down is cancelled), cannot be re-read, or this replica no longer leads.
    async fn delete_drained(&self, group: &str, node: &str, machine: &str, evicted: usize) {
        match self.opted_out(node).await {
            Ok(false) => {}
            Ok(true) => {
                self.cancel_scale_down(group, node).await;
                return;
            }
            Err(e) => {
                warn!(group, node, error = %e, "scale-down: cannot re-read the Node before deleting its machine; the next pass retries");
                return;
            }
        }
        // Not the leader any more: the node stays cordoned with nodeward's scale-down record,
        // and the leader finishes the scale-down.
        let Some(deleted) = self.delete_machine(group, machine).await else {
            return;
        };
        match deleted {
            Ok(()) => {
                self.delete_node(node).await;
                self.metrics
                    .scale_downs
                    .get_or_create(&metrics::group(group))
                    .inc();
                info!(
                    group,
                    node, machine, evicted, "scale-down: machine and Node deleted"
                );
            }
            Err(e) => {
                self.metrics
                    .failures
                    .get_or_create(&metrics::failure(group, "delete"))
                    .inc();
                warn!(group, node, machine, error = %e, "scale-down: cannot delete the machine; the next pass retries");
            }
        }
    }

    /// Gives back a node whose drain did not complete: uncordoned, its unneeded record
    /// cleared, and what it held recorded so decide does not pick it for the same failure.
    async fn give_back(&self, group: &str, node: &str, r: &DrainReport) {
        self.metrics
            .failures
            .get_or_create(&metrics::failure(group, "drain"))
            .inc();
        warn!(group, node, outcome = ?r.outcome, left_behind = r.left_behind.len(), refused = r.refused.len(), "scale-down: drain incomplete; giving the node back");
        self.event(
            &node_ref(node),
            EventType::Warning,
            "ScaleDownFailed",
            "ScaleDown",
            format!("drain ended {:?}; node uncordoned", r.outcome),
        )
        .await;
        if let Err(e) = crate::drain::uncordon(&self.client, node, false, SCALE_DOWN_LIFTER).await {
            warn!(node, error = %e, "cannot uncordon after a failed scale-down");
        }
        // Remember what the node held, so decide does not pick it again for the same
        // drain to fail the same way.
        let failed = match self.fingerprint(node).await {
            Ok(f) => Some(f),
            Err(e) => {
                warn!(node, error = %e, "cannot record the failed scale-down; the node may be picked again");
                None
            }
        };
        let annotations = json!({UNNEEDED_SINCE: None::<String>, SCALE_DOWN_FAILED: failed});
        self.write_annotations(node, annotations, "the record of the failed scale-down")
            .await;
    }

    /// Whether the Node was opted out of scale-down (`nodeward.io/scale-down-disabled`) since
    /// the snapshot its scale-down was decided on.
    async fn opted_out(&self, node: &str) -> kube::Result<bool> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let n = nodes.get(node).await?;
        Ok(n.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(model::SCALE_DOWN_DISABLED))
            .is_some_and(|v| v == "true"))
    }

    /// Gives back a node opted out during its scale-down: nodeward's cordon lifted (never an
    /// administrator's), its unneeded record cleared, an Event saying so.
    async fn cancel_scale_down(&self, group: &str, node: &str) {
        info!(
            group,
            node, "scale-down cancelled: the node was opted out since it began"
        );
        if let Err(e) = crate::drain::uncordon(&self.client, node, false, SCALE_DOWN_LIFTER).await {
            warn!(node, error = %e, "cannot uncordon the opted-out node; the next pass retries");
            return;
        }
        self.annotate(node, None).await;
        self.event(
            &node_ref(node),
            EventType::Normal,
            "ScaleDownCancelled",
            "ScaleDown",
            format!(
                "{} is set: nodeward scaler stopped scaling this node down and uncordoned it",
                model::SCALE_DOWN_DISABLED
            ),
        )
        .await;
    }

    /// Writes the pass's status and the groups' back-off to the status ConfigMap, where
    /// readers and the next pass (this leader's or another's) find them.
    async fn write_status(
        &self,
        now: Timestamp,
        states: &BTreeMap<String, GroupState>,
        backoff: &BTreeMap<String, Backoff>,
        pending: usize,
        actions: &[Action],
    ) {
        let doc = self.status_doc(now, states, backoff, pending, actions);
        let text = match serde_norway::to_string(&doc) {
            Ok(t) => t,
            Err(e) => {
                warn!(error = %e, "cannot write the status as YAML");
                return;
            }
        };
        let data = json!({
            "status": text,
            "backoff": serde_json::to_string(backoff).unwrap_or_default(),
        });
        self.put_status(data).await;
    }

    /// The pass as the status shows it: leader, guard, pending pods, each configured group's
    /// size, bounds and back-off, and the actions worth listing.
    fn status_doc<'a>(
        &'a self,
        now: Timestamp,
        states: &BTreeMap<String, GroupState>,
        backoff: &BTreeMap<String, Backoff>,
        pending: usize,
        actions: &'a [Action],
    ) -> StatusDoc<'a> {
        StatusDoc {
            time: now.to_string(),
            leader: &self.opts.identity,
            guard: actions.iter().find_map(|a| match a {
                Action::GuardHolds {
                    group,
                    unready,
                    total,
                    held,
                } => Some(guard_note(group.as_deref(), *unready, *total, *held)),
                _ => None,
            }),
            pending_unschedulable_pods: pending,
            groups: self
                .settings
                .groups
                .iter()
                .map(|g| {
                    let st = states.get(&g.name).cloned().unwrap_or_default();
                    let status = GroupStatus {
                        size: st.size,
                        ready: st.ready,
                        booting: st.booting,
                        registering: st.registering,
                        min: g.min,
                        max: g.max,
                        backoff_until: backoff
                            .get(&g.name)
                            .and_then(|b| b.until)
                            .map(|u| u.to_string()),
                    };
                    (g.name.as_str(), status)
                })
                .collect(),
            last_actions: actions
                .iter()
                .filter(|a| !matches!(a, Action::NoScaleUp { .. }))
                .take(STATUS_ACTIONS)
                .collect(),
        }
    }

    /// Merges `data` into the status ConfigMap, creating it if it is not there yet; a failure
    /// is logged and the next pass writes again.
    async fn put_status(&self, data: serde_json::Value) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        let patch = json!({"data": data});
        match api
            .patch(
                STATUS_CONFIGMAP,
                &crate::node_write::patch_params(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {
                let cm: ConfigMap = match serde_json::from_value(json!({
                    "metadata": {"name": STATUS_CONFIGMAP, "namespace": self.settings.namespace},
                    "data": data,
                })) {
                    Ok(cm) => cm,
                    Err(e) => {
                        warn!(error = %e, "cannot build the status ConfigMap");
                        return;
                    }
                };
                if let Err(e) = api.create(&PostParams::default(), &cm).await {
                    warn!(error = %e, "cannot create the status ConfigMap");
                }
            }
            Err(e) => warn!(error = %e, "cannot write the status ConfigMap"),
        }
    }
}

/// The status ConfigMap's `status` key, as YAML.
#[derive(Debug, serde::Serialize)]
struct StatusDoc<'a> {
    time: String,
    leader: &'a str,
    /// Set while the cluster-health guard holds: what it holds back and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    guard: Option<String>,
    pending_unschedulable_pods: usize,
    groups: BTreeMap<&'a str, GroupStatus>,
    /// The pass's actions but [`Action::NoScaleUp`], at most [`STATUS_ACTIONS`], each in the
    /// shape [`Action`] documents.
    last_actions: Vec<&'a Action>,
}

/// One group in [`StatusDoc`].
#[derive(Debug, serde::Serialize)]
struct GroupStatus {
    size: u32,
    ready: u32,
    booting: u32,
    registering: u32,
    min: u32,
    max: u32,
    backoff_until: Option<String>,
}

/// One line for the guard's status, Event and log.
fn guard_note(group: Option<&str>, unready: u32, total: u32, held: u32) -> String {
    match group {
        None => format!(
            "{unready} of {total} nodes NotReady, more than the cluster-health guard tolerates \
             (max_unready_percent, ok_unready_count): taken for a partition or an API server \
             outage, not broken machines; {held} repairs held back, no scale-down until fewer \
             are NotReady"
        ),
        Some(g) => format!(
            "{unready} of node group {g}'s {total} nodes NotReady, more than its guard tolerates \
             (max_unready_group_percent): taken for a fault of the group, not broken machines; \
             {held} of its repairs held back until fewer are NotReady"
        ),
    }
}

fn log_action(a: &Action, dry_run: bool) {
    match a {
        Action::ClusterShutdown { .. } | Action::StaleClusterShutdown { .. } => {
            log_cluster_shutdown(a, dry_run);
        }
        Action::GuardHolds {
            group,
            unready,
            total,
            held,
        } => warn!(
            dry_run,
            "{}",
            guard_note(group.as_deref(), *unready, *total, *held)
        ),
        Action::ScaleUp {
            group,
            count,
            reason,
            pods,
        } => {
            info!(dry_run, group, count, reason = ?reason, pods = pods.len(), "decision: scale up");
        }
        Action::NoScaleUp { pod, reason } => {
            debug!(dry_run, pod, reason, "decision: no scale-up for pod")
        }
        Action::MarkUnneeded { node, since } => {
            info!(dry_run, node, %since, "decision: node unneeded")
        }
        Action::ClearUnneeded { node } => info!(dry_run, node, "decision: node needed again"),
        Action::ScaleDown {
            group,
            node,
            machine,
            empty,
        } => {
            info!(dry_run, group, node, machine, empty, "decision: scale down");
        }
        Action::Repair {
            group,
            machine,
            node,
            reason,
        } => {
            warn!(dry_run, group, machine, node, %reason, "decision: delete broken machine");
        }
        Action::BackOff {
            group,
            failures,
            until,
        } => {
            warn!(dry_run, group, failures, %until, "decision: group backs off");
        }
        Action::ClearBackOff { group } => info!(dry_run, group, "decision: back-off cleared"),
        Action::CancelScaleDown { group, node } => {
            info!(
                dry_run,
                group, node, "decision: cancel the scale-down of an opted-out node"
            )
        }
        Action::DeleteNode {
            group,
            node,
            reason,
        } => {
            info!(dry_run, group, node, %reason, "decision: delete a Node whose machine is gone")
        }
    }
}

/// [`log_action`] for a recorded cluster shutdown, obeyed or stale.
fn log_cluster_shutdown(a: &Action, dry_run: bool) {
    let (requested_by, started_at, what) = match a {
        Action::ClusterShutdown {
            requested_by,
            started_at,
        } => (
            requested_by,
            started_at,
            "a cluster shutdown is recorded: no scale-up, scale-down or repair until `nodeward cluster start`",
        ),
        Action::StaleClusterShutdown {
            requested_by,
            started_at,
        } => (
            requested_by,
            started_at,
            "a cluster shutdown is recorded but stale: no node holds its cordon any more (lifted by hand after an interrupted shutdown?); not obeyed: `nodeward cluster start` removes the record",
        ),
        _ => return,
    };
    warn!(dry_run, requested_by, started_at, "{what}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pool_label = true` reaches the kubelet: the user data rendered for a new node of group
    /// `web` with the shipped template registers it with `pool=web`, the label the Cherry
    /// Servers autoscaler's users select in their affinities.
    #[test]
    fn pool_label_is_in_the_rendered_user_data() {
        let config = crate::config::parse(&[crate::config::Source {
            path: "a.toml".into(),
            text: "[scaler]\npool_label = true\n[[scaler.groups]]\nname = \"web\"\nmax = 3\n"
                .into(),
        }])
        .expect("config");
        let s = &config.scaler;
        let values = r#"
api_server_endpoint = "10.0.0.10:6443"
ca_cert_hashes = ["sha256:8c3d1e4f0a9b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d"]
kubernetes_version = "v1.31.2"
package_url = "https://downloads.example.com/nodeward/nodeward_0.1.0.{ext}"
"#;
        let token = token::generate(&mut rand::rng());
        let v = build_values(
            std::path::Path::new("values.toml"),
            values,
            &s.groups[0],
            s,
            &token,
        )
        .expect("values");
        let out = crate::render::render(
            "worker.yaml.tera",
            include_str!("../../cloud-init/worker.yaml.tera"),
            &v,
        )
        .expect("renders");
        // kubeadm v1beta4 (1.31+): `- name: node-labels` and the value on the next line.
        let at = out.find("node-labels").expect("a node-labels argument");
        let labels = out[at..].lines().take(2).collect::<Vec<_>>().join(" ");
        assert!(labels.contains("pool=web"), "{labels}");
        assert!(labels.contains("nodeward.io/node-group=web"), "{labels}");
    }

    /// The status is YAML a reader can parse whatever the identity or the actions contain (the
    /// format!-built text broke on a `: ` or a `#` in them).
    #[test]
    fn status_is_yaml_that_parses_back() {
        let clear = Action::ClearUnneeded {
            node: "n: #1".into(),
        };
        let doc = StatusDoc {
            time: "2026-01-01T00:00:00Z".into(),
            leader: "pod-1: #odd 'identity'",
            guard: Some("6 of 8 nodes NotReady: held".into()),
            pending_unschedulable_pods: 3,
            groups: BTreeMap::from([(
                "web",
                GroupStatus {
                    size: 2,
                    ready: 1,
                    booting: 1,
                    registering: 0,
                    min: 0,
                    max: 5,
                    backoff_until: None,
                },
            )]),
            last_actions: vec![&clear],
        };
        let text = serde_norway::to_string(&doc).expect("serialises");
        let back: serde_json::Value = serde_norway::from_str(&text).expect("parses back");
        assert_eq!(back["leader"], "pod-1: #odd 'identity'", "{text}");
        assert_eq!(back["pending_unschedulable_pods"], 3);
        assert_eq!(back["groups"]["web"]["size"], 2);
        assert_eq!(
            back["groups"]["web"]["backoff_until"],
            serde_json::Value::Null
        );
        assert_eq!(
            back["last_actions"][0],
            json!({"action": "clear-unneeded", "node": "n: #1"}),
            "{text}"
        );
    }

    /// Every action as `last_actions` shows it: an object whose `action` names the kind in
    /// kebab-case, with the action's fields beside it (the shape docs/src/scaler.md documents).
    #[test]
    fn every_action_as_the_status_shows_it() {
        use crate::scaler::decide::{DeleteNodeReason, RepairReason, ScaleUpReason};
        let at: Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let cases = [
            (
                Action::ScaleUp {
                    group: "web".into(),
                    count: 2,
                    reason: ScaleUpReason::PendingPods,
                    pods: vec!["ns/p".into()],
                },
                json!({"action": "scale-up", "group": "web", "count": 2,
                    "reason": "pending-pods", "pods": ["ns/p"]}),
            ),
            (
                Action::NoScaleUp {
                    pod: "ns/p".into(),
                    reason: "no group".into(),
                },
                json!({"action": "no-scale-up", "pod": "ns/p", "reason": "no group"}),
            ),
            (
                Action::MarkUnneeded {
                    node: "n1".into(),
                    since: at,
                },
                json!({"action": "mark-unneeded", "node": "n1", "since": "2026-01-01T00:00:00Z"}),
            ),
            (
                Action::ClearUnneeded { node: "n1".into() },
                json!({"action": "clear-unneeded", "node": "n1"}),
            ),
            (
                Action::ScaleDown {
                    group: "web".into(),
                    node: "n1".into(),
                    machine: "m1".into(),
                    empty: true,
                },
                json!({"action": "scale-down", "group": "web", "node": "n1", "machine": "m1",
                    "empty": true}),
            ),
            (
                Action::Repair {
                    group: "web".into(),
                    machine: "m1".into(),
                    node: None,
                    reason: RepairReason::NeverRegistered,
                },
                json!({"action": "repair", "group": "web", "machine": "m1", "node": null,
                    "reason": "never-registered"}),
            ),
            (
                Action::BackOff {
                    group: "web".into(),
                    failures: 3,
                    until: at,
                },
                json!({"action": "back-off", "group": "web", "failures": 3,
                    "until": "2026-01-01T00:00:00Z"}),
            ),
            (
                Action::DeleteNode {
                    group: "web".into(),
                    node: "n1".into(),
                    reason: DeleteNodeReason::ScaledDown,
                },
                json!({"action": "delete-node", "group": "web", "node": "n1",
                    "reason": "scaled-down"}),
            ),
            (
                Action::CancelScaleDown {
                    group: "web".into(),
                    node: "n1".into(),
                },
                json!({"action": "cancel-scale-down", "group": "web", "node": "n1"}),
            ),
            (
                Action::ClearBackOff {
                    group: "web".into(),
                },
                json!({"action": "clear-back-off", "group": "web"}),
            ),
            (
                Action::GuardHolds {
                    group: None,
                    unready: 6,
                    total: 8,
                    held: 2,
                },
                json!({"action": "guard-holds", "group": null, "unready": 6, "total": 8,
                    "held": 2}),
            ),
            (
                Action::ClusterShutdown {
                    requested_by: "alice".into(),
                    started_at: "2026-01-01T00:00:00Z".into(),
                },
                json!({"action": "cluster-shutdown", "requested_by": "alice",
                    "started_at": "2026-01-01T00:00:00Z"}),
            ),
        ];
        for (action, want) in cases {
            assert_eq!(serde_json::to_value(&action).expect("json"), want);
        }
    }
}
