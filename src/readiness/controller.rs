//! `nodeward controller`: the central readiness controller.
//!
//! One leader-elected replica watches every Node through a kube-runtime reflector and acts on
//! each change at once ([`super::decide`]): a node whose agent reports [`super::CONDITION_TYPE`]
//! `True` loses the startup taint; in [`Mode::Continuous`] one that reports `False` gets it back.
//! Nothing else about a Node is written. A replica that becomes leader first walks the whole store,
//! so nodes that became ready while no controller ran are caught up at once.
//!
//! It is a command of its own, not a mode of the scaler: every cluster whose nodes register with
//! the startup taint needs it, while the scaler is optional and needs a provider and its token.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::time::Instant;
use tracing::{info, warn};

use super::{Mode, TaintChange, decide, set_startup_taint};
use crate::lease::Elector;

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bootstrap-only or continuous.
    pub mode: Mode,
    /// Log what would change, change nothing.
    pub dry_run: bool,
    /// Namespace of the leader Lease.
    pub lease_namespace: String,
    /// Name of the leader Lease.
    pub lease_name: String,
    /// This replica's identity in the Lease.
    pub identity: String,
    /// How long a Lease lives without renewal.
    pub lease_duration: Duration,
}

/// The Lease the controller's replicas share (in `kube-system` by default).
pub const LEASE_NAME: &str = "nodeward-readiness-controller";

/// Runs until `shutdown` resolves; returns after giving the Lease up.
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
    let elector = Elector::new(
        client.clone(),
        &opts.lease_namespace,
        &opts.lease_name,
        &opts.identity,
        opts.lease_duration,
    );
    info!(mode = ?opts.mode, dry_run = opts.dry_run, identity = %opts.identity, "readiness controller starting");
    tokio::pin!(shutdown);
    let mut leader_until: Option<Instant> = None;
    let mut renew = tokio::time::interval(opts.lease_duration / 3);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut synced = false;
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = renew.tick() => {
                let was = leads(leader_until);
                leader_until = elector.try_acquire().await;
                if was && !leads(leader_until) {
                    warn!("lost leadership; not acting until it is back");
                }
                if !was && leads(leader_until) {
                    info!(identity = %opts.identity, "leader: reconciling every node");
                }
                // Every round, not only on becoming leader: a write that failed is retried here.
                if synced && leads(leader_until) {
                    catch_up(&client, &store, &opts, leader_until).await;
                }
            }
            ev = events.next() => match ev {
                Some(Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n))) => {
                    if synced && leads(leader_until) {
                        act(&client, &n, &opts, leader_until).await;
                    }
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    if !synced {
                        // Type=notify (nodeward-controller.service): up once it sees the nodes.
                        crate::systemd::notify(&[sd_notify::NotifyState::Ready]);
                    }
                    synced = true;
                    if leads(leader_until) {
                        catch_up(&client, &store, &opts, leader_until).await;
                    }
                }
                Some(Ok(watcher::Event::Delete(_) | watcher::Event::Init)) => {}
                Some(Err(e)) => warn!(error = %e, "node watch failed; retrying"),
                None => anyhow::bail!("the node watch ended"),
            },
        }
    }
    if leads(leader_until) {
        elector.release().await;
    }
    info!("readiness controller stopped");
    Ok(())
}

fn leads(until: Option<Instant>) -> bool {
    until.is_some_and(|t| Instant::now() < t)
}

async fn catch_up(
    client: &kube::Client,
    store: &Store<Node>,
    opts: &Options,
    leader_until: Option<Instant>,
) {
    let nodes: Vec<Arc<Node>> = store.state();
    for n in nodes {
        act(client, &n, opts, leader_until).await;
    }
}

async fn act(client: &kube::Client, n: &Node, opts: &Options, leader_until: Option<Instant>) {
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
    // Fenced: the Lease may have run out while the events queued.
    if !leads(leader_until) {
        return;
    }
    let add = change == TaintChange::Add;
    if add {
        warn!(node = name, condition = %message, "node reports not ready; putting the startup taint back");
    }
    if let Err(e) = set_startup_taint(client, name, add, Some(n.clone())).await {
        warn!(node = name, error = %e, "cannot change the startup taint");
    }
}
