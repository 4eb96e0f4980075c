//! The coordinated reboot's loop, a task of the agent: gather the facts, ask [`super::decide`],
//! act. Each pass reads what it needs fresh from the API server, so an agent restarted at any
//! point (a package upgrade, the reboot itself) goes on from the Node's record and the slots.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::decide::{self, BackStep, Before, Cordon, Next, Record, Request, Return, Wait};
use super::slot::Slot;
use super::status::RebootStatus;
use super::{KURED_LOCK, SLOT_PREFIX};
use crate::config::{DrainSettings, RebootSettings};
use crate::drain::exec::{DrainOptions, DrainReport};
use crate::drain::step::DrainOutcome;
use crate::lease::Step;
use crate::lifecycle::Moment;
use crate::reboot::metrics::RebootMetrics;

/// With a slot: draining and rebooting.
mod act;
/// After the reboot, and giving up.
mod back;
/// Before a slot: the checks, and waiting.
mod checks;
/// Writing what the coordinator says: the Node's record and conditions, Events, the status file.
mod say;

/// How long one request may take.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// How often a returning node is looked at: the next node waits on it.
const BACK_POLL: Duration = Duration::from_secs(2);
/// The sentinel command's time limit.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// What the coordinator needs from the agent.
pub struct Coordinator {
    s: RebootSettings,
    drain: DrainSettings,
    node: String,
    kubeconfig: Option<PathBuf>,
    client: Option<kube::Client>,
    slots: Vec<Slot>,
    boot_id: String,
    metrics: Arc<RebootMetrics>,
    /// The agent's drains' figures.
    drain_metrics: Arc<crate::drain::metrics::DrainMetrics>,
    /// 1 while every readiness gate passes, as this agent process (so this boot) judges them.
    gates_passing: prometheus_client::metrics::gauge::Gauge,
    status: super::status::Writer,
    http: reqwest::Client,
    /// When the request pending now was first seen.
    requested_since: Option<Timestamp>,
    /// When the returning node was first seen back.
    back_since: Option<Timestamp>,
    /// When this node took its slot (for the duration metric).
    took_at: Option<Timestamp>,
    /// When this process last renewed the slot of a returning node.
    renewed_at: Option<std::time::Instant>,
    /// `[conditions] lifecycle`: say the reboot in `MaintenancePlanned`/`MaintenanceInProgress`.
    lifecycle: bool,
}

/// The agent's parts the coordinator uses.
pub struct Parts {
    /// The kubeconfig (`None`: kube's inference).
    pub kubeconfig: Option<PathBuf>,
    /// A client built already, if any.
    pub client: Option<kube::Client>,
    /// Where the coordinator's figures go.
    pub metrics: Arc<RebootMetrics>,
    /// Where its drain's figures go.
    pub drain_metrics: Arc<crate::drain::metrics::DrainMetrics>,
    /// The agent's gates' verdict (1: all pass).
    pub gates_passing: prometheus_client::metrics::gauge::Gauge,
    /// Where the coordinator's status goes (`nodeward status` reads it).
    pub status_file: PathBuf,
}

impl Coordinator {
    /// A coordinator for `node`.
    pub fn new(settings: &crate::config::Settings, node: String, parts: Parts) -> Self {
        Self {
            s: settings.reboot.clone(),
            drain: settings.drain.clone(),
            lifecycle: settings.conditions.lifecycle,
            node,
            kubeconfig: parts.kubeconfig,
            client: parts.client,
            slots: Vec::new(),
            boot_id: super::boot_id().unwrap_or_default(),
            metrics: parts.metrics,
            drain_metrics: parts.drain_metrics,
            gates_passing: parts.gates_passing,
            status: super::status::Writer::new(parts.status_file),
            http: reqwest::Client::new(),
            requested_since: None,
            back_since: None,
            took_at: None,
            renewed_at: None,
        }
    }

    /// Runs until the agent stops: a pass, then a wait for the period, a request file changing,
    /// or the pass's own sooner time. Without this boot's ID it cannot tell a reboot from an
    /// agent restart, and does nothing but say so.
    pub async fn run(mut self) {
        if self.boot_id.is_empty() {
            let msg = "cannot read this boot's ID ($RUNTIME_DIRECTORY/boot-id, which nodeward.service copies, or /proc/sys/kernel/random/boot_id): coordinated reboots are off";
            tracing::error!("{msg}");
            self.show("idle", Some("NoBootID"), msg, None);
            return;
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        let paths = vec![self.s.sentinel.clone(), self.s.request_file.clone()];
        let mut files = match crate::gate::watch::FileWatcher::new(paths, tx) {
            Ok(w) => Some(w),
            Err(e) => {
                warn!(error = %e, "cannot watch the reboot sentinel; checking it every period");
                None
            }
        };
        info!(node = %self.node, boot_id = %self.boot_id, "coordinated reboots on");
        loop {
            let pause = self.pass().await;
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                Some(()) = rx.recv() => {
                    if let Some(w) = files.as_mut()
                        && let Err(e) = w.rearm()
                    {
                        warn!(error = %e, "cannot watch the reboot sentinel");
                    }
                }
            }
        }
    }

    /// One pass; returns how soon the next one is due.
    async fn pass(&mut self) -> Duration {
        let requested = self.requested().await;
        self.note_request(requested);
        let Some(client) = self.client().await else {
            return self.s.period;
        };
        let nodes: Api<Node> = Api::all(client.clone());
        let me = match nodes.get_opt(&self.node).await {
            Ok(Some(n)) => n,
            Ok(None) => return self.s.period,
            Err(e) => {
                self.failed(&e);
                return self.s.period;
            }
        };
        match decide::next(requested, decide::record(&me), &self.boot_id) {
            Next::Idle => {
                if self.status.phase() == Some("waiting") {
                    // The request was withdrawn while it waited: the condition says so.
                    self.condition(&client, Moment::RebootWithdrawn).await;
                }
                self.show("idle", None, "no reboot asked for", None);
                self.s.period
            }
            Next::Try(q) => self.try_slot(&client, q).await,
            Next::Resume(r) => self.resume(&client, r).await,
            Next::Abandon(r) => {
                self.give_back(&client, &r, "the reboot request was withdrawn", "abandoned")
                    .await;
                self.s.period
            }
            Next::Back(r) => self.back(&client, &me, r).await,
        }
    }

    /// Whether a reboot is asked for, and by whom.
    async fn requested(&self) -> Option<Request> {
        if self.s.request_file.exists() {
            return Some(Request::Manual);
        }
        match &self.s.sentinel_command {
            Some(argv) => sentinel_command(argv).await.then_some(Request::Command),
            None => self.s.sentinel.exists().then_some(Request::Sentinel),
        }
    }

    fn note_request(&mut self, requested: Option<Request>) {
        match (requested, self.requested_since) {
            (Some(q), None) => {
                let now = Timestamp::now();
                info!(by = %q, "a reboot is asked for");
                self.requested_since = Some(now);
                self.metrics.requested.set(1);
                self.metrics
                    .requested_since
                    .set(now.as_millisecond() as f64 / 1000.0);
            }
            (None, Some(_)) => {
                self.requested_since = None;
                self.metrics.requested.set(0);
                self.metrics.requested_since.set(0.0);
            }
            _ => {}
        }
    }

    /// The client, built from the kubeconfig the first time it loads.
    async fn client(&mut self) -> Option<kube::Client> {
        if self.client.is_none() {
            let path = self.kubeconfig.as_deref();
            match crate::kube_client::client_with_deadline(path, REQUEST_DEADLINE, None).await {
                Ok(c) => self.client = Some(c),
                Err(e) => {
                    self.show("idle", None, &format!("no API access yet: {e}"), None);
                    return None;
                }
            }
        }
        let client = self.client.clone()?;
        if self.slots.is_empty() {
            self.slots = self
                .s
                .slot_names()
                .iter()
                .map(|name| {
                    Slot::new(
                        client.clone(),
                        &self.s.namespace,
                        name,
                        &self.node,
                        self.s.lease_duration,
                    )
                })
                .collect();
        }
        Some(client)
    }

    /// An API error: a refused credential builds the client again on the next pass (kubelet
    /// rotated its certificate).
    fn failed(&mut self, e: &kube::Error) {
        warn!(error = %e, "coordinated reboot: the API server did not answer");
        if matches!(e, kube::Error::Api(s) if s.code == 401) {
            self.client = None;
            self.slots.clear();
        }
    }
}

/// Runs the sentinel command: exit status 0 asks for a reboot. One that cannot run, or runs too
/// long, asks for nothing (and says so).
async fn sentinel_command(argv: &[String]) -> bool {
    let Some((program, args)) = argv.split_first() else {
        return false;
    };
    let status = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .status();
    match tokio::time::timeout(COMMAND_TIMEOUT, status).await {
        Ok(Ok(s)) => s.success(),
        Ok(Err(e)) => {
            warn!(command = %program, error = %e, "cannot run the reboot sentinel command");
            false
        }
        Err(_) => {
            warn!(command = %program, "the reboot sentinel command ran over 30s");
            false
        }
    }
}
