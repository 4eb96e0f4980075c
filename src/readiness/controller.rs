//! `nodeward controller`: the central readiness controller.
//!
//! Every replica watches every Node through a kube-runtime reflector and acts on each change at
//! once ([`super::decide`]): a node whose agent reports [`super::CONDITION_TYPE`] `True` loses the
//! startup taint; in [`Mode::Continuous`] one that reports `False` gets it back. Nothing else
//! about a Node is written. A replica walks its whole cache once its first list has arrived, so
//! nodes that became ready while no controller ran are caught up as soon as one starts.
//!
//! There is no leader. Each write is [`super::reconcile_startup_taint`]: decided from the Node it
//! is conditioned on (its resourceVersion) and decided again from a fresh read after a conflict.
//! So of replicas acting on one change exactly one writes, and a replica acting on an old event
//! finds nothing to do. What a leader would add is a wait: after a leader dies, a whole Lease
//! duration before anyone acts (measured at 20 s with a 15 s Lease when this had one). Without
//! it, a crashed replica costs nothing while another runs, and a restarted one acts once it has
//! listed the nodes. A crash stays visible where Deployments show it: restarts and ready
//! replicas.
//!
//! It is a command of its own, not a mode of the scaler: every cluster whose nodes register with
//! the startup taint needs it, while the scaler is optional and needs a provider and its token.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::Api;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{info, warn};

use super::{Mode, TaintChange, decide, reconcile_startup_taint};
use crate::out_of_service::{Heartbeats, NODE_LEASE_NAMESPACE};

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bootstrap-only or continuous.
    pub mode: Mode,
    /// Log what would change, change nothing.
    pub dry_run: bool,
    /// With `Some(after)`, the out-of-service taint goes on a node that announced a power-off, is
    /// NotReady, and whose heartbeat Lease this replica has seen unchanged for `after`
    /// ([`crate::out_of_service`]); `None`: off (the default).
    pub out_of_service: Option<Duration>,
    /// The out-of-service changes written.
    pub metrics: Arc<super::metrics::ControllerMetrics>,
}

/// How often the whole cache is walked again, so a write that failed (API server unavailable,
/// too many conflicts) is retried without waiting for the Node to change.
pub const RESYNC: Duration = Duration::from_secs(5);

/// Runs until `shutdown` resolves.
pub async fn run(
    client: kube::Client,
    opts: Options,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let (store, writer) = reflector::store();
    let mut events = watcher(nodes, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .boxed();
    let mut leases = heartbeat_watch(&client, &opts);
    let mut heartbeats = Heartbeats::default();
    let recorder = crate::events::recorder(&client, "nodeward-controller", None);
    info!(mode = ?opts.mode, dry_run = opts.dry_run, out_of_service_after = ?opts.out_of_service, "readiness controller starting");
    tokio::pin!(shutdown);
    let mut resync = tokio::time::interval(RESYNC);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut synced = false;
    loop {
        // /healthz: the loop turns (a resync every RESYNC once synced, a retry before).
        opts.metrics.liveness.beat();
        let work = tokio::select! {
            () = &mut shutdown => break,
            _ = resync.tick(), if synced => Work::CatchUp,
            ev = leases.next() => {
                heard(&mut heartbeats, ev)?;
                continue;
            }
            ev = events.next() => match ev {
                Some(Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n))) if synced => {
                    Work::Act(Box::new(n))
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    if !synced {
                        info!(nodes = store.state().len(), "nodes listed: reconciling every node");
                        // Type=notify (nodeward-controller.service): up once it sees the nodes.
                        crate::systemd::notify(&[sd_notify::NotifyState::Ready]);
                    }
                    synced = true;
                    opts.metrics.synced.set(1);
                    Work::CatchUp
                }
                Some(Ok(watcher::Event::Delete(n))) => {
                    heartbeats.forget(n.metadata.name.as_deref().unwrap_or_default());
                    continue;
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    warn!(error = %e, "node watch failed; retrying");
                    continue;
                }
                None => anyhow::bail!("the node watch ended"),
            },
        };
        let done = async {
            match work {
                Work::Act(n) => act(&client, &recorder, &n, &opts, &mut heartbeats).await,
                Work::CatchUp => catch_up(&client, &recorder, &store, &opts, &mut heartbeats).await,
            }
        };
        // The signal drops a write in flight: an API server that does not answer must not hold
        // the stop. Each write is guarded; the next replica or start repeats it.
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            () = done => {}
        }
    }
    info!("readiness controller stopped");
    Ok(())
}

/// The watch of the nodes' heartbeat Leases, only with the out-of-service taint (their only
/// reader); otherwise a stream that never yields.
fn heartbeat_watch(
    client: &kube::Client,
    opts: &Options,
) -> futures::stream::BoxStream<'static, Result<watcher::Event<Lease>, watcher::Error>> {
    match opts.out_of_service {
        Some(_) => watcher(
            Api::<Lease>::namespaced(client.clone(), NODE_LEASE_NAMESPACE),
            watcher::Config::default(),
        )
        .default_backoff()
        .boxed(),
        None => futures::stream::pending().boxed(),
    }
}

/// Takes one event of [`heartbeat_watch`] into `heartbeats`; its end is an error.
fn heard(
    heartbeats: &mut Heartbeats,
    ev: Option<Result<watcher::Event<Lease>, watcher::Error>>,
) -> anyhow::Result<()> {
    match ev {
        Some(Ok(ev)) => heartbeats.seen(&ev, tokio::time::Instant::now()),
        Some(Err(e)) => warn!(error = %e, "node Lease watch failed; retrying"),
        None => anyhow::bail!("the node Lease watch ended"),
    }
    Ok(())
}

/// What the loop does next, once it has picked it.
enum Work {
    /// Reconcile one node that changed.
    Act(Box<Node>),
    /// Reconcile every node (after a list, and every [`RESYNC`]).
    CatchUp,
}

async fn catch_up(
    client: &kube::Client,
    recorder: &Recorder,
    store: &Store<Node>,
    opts: &Options,
    heartbeats: &mut Heartbeats,
) {
    let nodes: Vec<Arc<Node>> = store.state();
    for n in nodes {
        act(client, recorder, &n, opts, heartbeats).await;
    }
}

async fn act(
    client: &kube::Client,
    recorder: &Recorder,
    n: &Node,
    opts: &Options,
    heartbeats: &mut Heartbeats,
) {
    startup_taint(client, n, opts).await;
    if let Some(after) = opts.out_of_service {
        let silent = heartbeats.silent_for(n, tokio::time::Instant::now());
        out_of_service(client, recorder, n, (after, silent), opts).await;
    }
}

/// The out-of-service taint of `n` ([`crate::out_of_service::decide`]) when it must be NotReady
/// and silent for `after` and has been `silent`, with an Event on the Node and the metric for
/// every change written.
async fn out_of_service(
    client: &kube::Client,
    recorder: &Recorder,
    n: &Node,
    (after, silent): (Duration, Duration),
    opts: &Options,
) {
    use crate::out_of_service::{Change, PowerOff, decide, reconcile};
    let Some(change) = decide(n, after, jiff::Timestamp::now(), silent) else {
        return;
    };
    let name = n.metadata.name.as_deref().unwrap_or_default();
    if opts.dry_run {
        info!(node = name, %change, "dry run: would change the out-of-service taint");
        return;
    }
    let change = match reconcile(client, name, after, silent, Some(n.clone())).await {
        Ok(Some(c)) => c,
        Ok(None) => return,
        Err(e) => {
            warn!(node = name, error = %e, "cannot change the out-of-service taint");
            return;
        }
    };
    opts.metrics.changed(change);
    let record = PowerOff::of(n);
    let left = record
        .as_ref()
        .map_or(0, |r| r.left_behind.len() + r.terminating.len());
    let (reason, note) = match change {
        Change::Taint => ("OutOfServiceTainted", format!("announced a power-off, NotReady, and no heartbeat (its Lease in {NODE_LEASE_NAMESPACE} unchanged) for {silent:?}, at least {after:?}: {OUT_OF_SERVICE} added, so its {left} pods left behind or terminating are deleted and their volumes detached")),
        Change::Clear { untaint: true } => ("OutOfServiceUntainted", format!("back (a new boot, or Ready again): {OUT_OF_SERVICE} and the power-off record removed")),
        Change::Clear { untaint: false } => ("PowerOffRecordCleared", "back (a new boot, or Ready again) before any out-of-service taint of nodeward's: the power-off record removed".to_string()),
    };
    info!(node = name, %change, reason, "out-of-service changed");
    crate::events::publish(
        recorder,
        &node_ref(name),
        EventType::Normal,
        reason,
        "OutOfService",
        note,
    )
    .await;
}

/// The out-of-service taint, as Events name it.
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute";

fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

/// The startup taint of `n` ([`decide`]).
async fn startup_taint(client: &kube::Client, n: &Node, opts: &Options) {
    let Some(change) = decide(n, opts.mode) else {
        return;
    };
    let name = n.metadata.name.as_deref().unwrap_or_default();
    let message = super::condition(n)
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    if opts.dry_run {
        info!(node = name, change = ?change, condition = %message, "dry run: would change the startup taint");
        return;
    }
    match reconcile_startup_taint(client, name, opts.mode, Some(n.clone())).await {
        Ok(Some(TaintChange::Add)) => {
            opts.metrics.taint_changed(TaintChange::Add);
            warn!(node = name, condition = %message, "node reports not ready; put the startup taint back");
        }
        Ok(Some(TaintChange::Remove)) => opts.metrics.taint_changed(TaintChange::Remove),
        Ok(None) => {}
        Err(e) => warn!(node = name, error = %e, "cannot change the startup taint"),
    }
}
