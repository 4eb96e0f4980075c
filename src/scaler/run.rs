//! The thin executor: gather a snapshot from the API and the provider, call [`decide`], carry
//! out the actions, publish metrics, events and the status ConfigMap — as the Lease holder only.
//!
//! Nothing here is remembered between passes except which drains this process is running (so
//! a slow drain is not started twice); everything else is read back from the cluster and the
//! provider each pass, which is what lets a restarted or new leader carry on where the last one
//! stopped.
//!
//! Read `run.rs` first (the Lease, the pass, [`Inner::carry_out`]), then the file that answers:
//! - `gather.rs` — the snapshot the pass decides from (API server and provider);
//! - `scale_up.rs` — machines created for pending pods: templates, user data, tokens, Events;
//! - `scale_down.rs` — an idle node cordoned, drained and deleted, or given back;
//! - `machines.rs` — deletes at the provider, fenced by the Lease, and repair;
//! - `report.rs` — the log, Events, metrics and the status ConfigMap.

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

mod gather;
mod machines;
mod pending;
mod report;
mod scale_down;
mod scale_up;

use report::*;
use scale_up::*;

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
    /// Told when this replica takes the Lease: its first pass as leader comes then, not at the
    /// next scan.
    became_leader: tokio::sync::Notify,
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
        let mut drain = DrainOptions::for_leaving_node(&settings.drain, SCALE_DOWN_REASON, false);
        drain.lifecycle = settings.conditions.lifecycle;
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
                became_leader: tokio::sync::Notify::new(),
                elector,
            }),
        })
    }

    /// The metrics this scaler updates.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.inner.metrics.clone()
    }

    /// Runs until `shutdown` completes: leader election in its own task, a pass every
    /// `scan_interval` while leader or sooner when a burst of pods is pending
    /// ([`pending::Pending`]), and the metrics endpoint if configured.
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
                    let was = std::mem::replace(&mut *lock(&inner.leader_until), until);
                    if was.is_none() && until.is_some() {
                        inner.became_leader.notify_one();
                    }
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
        let mut pending = pending::Pending::watch(inner.client.clone());
        info!(identity = %inner.opts.identity, dry_run = inner.opts.dry_run, groups = s.groups.len(), "scaler started");
        crate::systemd::notify(&[sd_notify::NotifyState::Ready]);
        loop {
            inner.metrics.liveness.beat();
            let next = Instant::now() + s.scan_interval;
            pending.clear();
            // The signal drops a pass in flight, as a crash would: its writes are fenced by the
            // Lease, and the next leader's pass starts from what the API server holds.
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = inner.clone().turn() => {}
            }
            // The next pass: at the scan, when a burst of pending pods is over, or as soon as
            // this replica becomes the leader.
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = inner.became_leader.notified() => {}
                () = tokio::time::sleep_until(next) => {}
                () = pending.burst(s.batch_idle, s.batch_max) => {}
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

/// The scale-up `a` asks for, if it is one.
fn scale_up_asked(a: &Action) -> Option<ScaleUpAsked<'_>> {
    match a {
        Action::ScaleUp {
            group,
            count,
            reason,
            pods,
        } => Some(ScaleUpAsked {
            group,
            count: *count,
            reason: *reason,
            pods,
        }),
        _ => None,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<P: Provider + 'static> Inner<P> {
    fn is_leader(&self) -> bool {
        // Stop acting a tenth of the Lease before it runs out: others may take it only after.
        let margin = self.settings.lease_duration / 10;
        lock(&self.leader_until).is_some_and(|u| u > Instant::now() + margin)
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
        // The scale-ups go together, where the first of them stands among the actions: one
        // stream of creates that takes the groups in turn.
        let asked: Vec<ScaleUpAsked> = actions.iter().filter_map(scale_up_asked).collect();
        let mut scaled_up = false;
        for a in &actions {
            if !self.is_leader() {
                warn!("lost the Lease mid-pass; stopping");
                break;
            }
            if scale_up_asked(a).is_some() {
                if !std::mem::replace(&mut scaled_up, true) {
                    self.scale_up_all(&asked, &mut run).await;
                }
                continue;
            }
            self.carry_out(a, &mut run).await;
        }
        if let Some(d) = run.first_create {
            self.metrics
                .pending_to_create_seconds
                .observe(d.as_secs_f64());
        }
        let guards = decide::remember_guards(
            &snap.guard_held,
            &actions,
            now,
            self.settings.unready_delete_time,
        );
        self.write_status(now, &states, &run.backoff, &guards, pending, &actions)
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
            // Carried out together, by the pass ([`Inner::scale_up_all`]).
            Action::ScaleUp { .. } => {}
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The creates take the groups in turn, so no group's batch waits behind another's.
    #[test]
    fn the_creates_take_the_groups_in_turn() {
        assert_eq!(interleave(&[2, 1, 3]), [0, 1, 2, 0, 2, 2]);
        assert_eq!(interleave(&[0, 2]), [1, 1]);
        assert_eq!(
            interleave(&[70, 10, 10]).iter().take(6).collect::<Vec<_>>(),
            [&0, &1, &2, &0, &1, &2]
        );
        assert!(interleave(&[]).is_empty());
    }

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
