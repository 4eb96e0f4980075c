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

/// Taking a slot.
impl Coordinator {
    /// A reboot is asked for: check, in order, kured, the window, a free slot, then the
    /// blockers, health and budgets; take the slot when all agree, then drain and reboot.
    async fn try_slot(&mut self, client: &kube::Client, q: Request) -> Duration {
        let now = Timestamp::now();
        let wait = match self.kured(client).await {
            Some(holder) => Some(Wait::Kured(holder)),
            None if !self.s.window.contains(now) => {
                Some(Wait::Window(self.s.window.next_open(now)))
            }
            None => None,
        };
        if let Some(w) = wait {
            return self.waiting(client, w).await;
        }
        let (free, holders) = self.peek_slots().await;
        if free.is_empty() {
            return self.waiting(client, Wait::Slot(holders)).await;
        }
        let before = self.before(client, &holders).await;
        if let Err(w) = decide::may_take_slot(&self.s, &before) {
            return self.waiting(client, w).await;
        }
        for i in free {
            if self.slots[i].try_acquire().await {
                let slot = self.s.slot_names()[i].clone();
                return self.take(client, q, slot).await;
            }
        }
        let (_, holders) = self.peek_slots().await;
        self.waiting(client, Wait::Slot(holders)).await
    }

    /// The slots this node could take now (indices), and the other holders of live ones.
    async fn peek_slots(&self) -> (Vec<usize>, Vec<String>) {
        let mut free = Vec::new();
        let mut holders = Vec::new();
        for (i, e) in self.slots.iter().enumerate() {
            match e.peek().await {
                Some(Step::Create | Step::TakeOver | Step::Renew) => free.push(i),
                Some(Step::Follow { holder }) => holders.push(holder),
                None => holders.push("(unreadable)".into()),
            }
        }
        (free, holders)
    }

    /// kured's lock, when a DaemonSet carries it.
    async fn kured(&self, client: &kube::Client) -> Option<String> {
        let ds: Api<DaemonSet> = Api::all(client.clone());
        let list = match ds.list_metadata(&ListParams::default()).await {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "cannot list DaemonSets to look for kured's lock");
                return None;
            }
        };
        list.items.iter().find_map(|d| {
            let value = d.metadata.annotations.as_ref()?.get(KURED_LOCK)?;
            Some(format!(
                "DaemonSet {}/{}: {value}",
                d.metadata.namespace.as_deref().unwrap_or_default(),
                d.metadata.name.as_deref().unwrap_or_default()
            ))
        })
    }

    /// Blockers, health and budgets, read fresh.
    async fn before(&self, client: &kube::Client, holders: &[String]) -> Before {
        let (pods, alerts, nodes, budgets) = tokio::join!(
            self.blocking_pods(client),
            self.alerts(),
            self.unavailable(client, holders),
            self.budgets(client),
        );
        let (unavailable, nodes) = nodes;
        let (budgets, unevictable) = budgets;
        Before {
            pods,
            alerts,
            unavailable,
            nodes,
            budgets,
            unevictable,
        }
    }

    async fn blocking_pods(&self, client: &kube::Client) -> Vec<String> {
        let pods: Api<Pod> = Api::all(client.clone());
        let mut out = Vec::new();
        let scopes = [
            (self.s.blocking_pods.as_ref(), Some(self.node.as_str())),
            (self.s.blocking_pods_anywhere.as_ref(), None),
        ];
        for (selector, on) in scopes {
            let Some(selector) = selector else { continue };
            let mut lp = ListParams::default().labels(&selector.to_string());
            if let Some(node) = on {
                lp = lp.fields(&format!("spec.nodeName={node}"));
            }
            match pods.list(&lp).await {
                Ok(l) => out.extend(l.items.iter().filter(|p| running(p)).map(|p| {
                    let m = &p.metadata;
                    let ns = m.namespace.as_deref().unwrap_or_default();
                    let name = m.name.as_deref().unwrap_or_default();
                    match on {
                        Some(_) => format!("{ns}/{name} on this node"),
                        None => format!("{ns}/{name}"),
                    }
                })),
                Err(e) => out.push(format!("cannot list pods {}: {e}", selector)),
            }
        }
        out
    }

    async fn alerts(&self) -> Result<Vec<String>, String> {
        let Some(url) = &self.s.prometheus_url else {
            return Ok(Vec::new());
        };
        let firing = super::alerts::firing(&self.http, url, REQUEST_DEADLINE).await?;
        let ignored = self.s.alerts_ignored.as_ref().map(|f| &f.0);
        Ok(super::alerts::blocking(firing, ignored))
    }

    /// The other nodes that are unavailable, and how many nodes there are.
    async fn unavailable(&self, client: &kube::Client, holders: &[String]) -> (Vec<String>, u32) {
        let nodes: Api<Node> = Api::all(client.clone());
        let mut lp = ListParams::default();
        if let Some(sel) = &self.s.health_nodes {
            lp = lp.labels(&sel.to_string());
        }
        match nodes.list(&lp).await {
            Ok(l) => {
                let out = l
                    .items
                    .iter()
                    .filter(|n| n.metadata.name.as_deref() != Some(self.node.as_str()))
                    .filter_map(|n| {
                        let why = decide::unavailable(n, holders)?;
                        Some(format!(
                            "{} ({why})",
                            n.metadata.name.as_deref().unwrap_or_default()
                        ))
                    })
                    .collect();
                (out, u32::try_from(l.items.len()).unwrap_or(u32::MAX))
            }
            // Unknown health is not good health.
            Err(e) => (vec![format!("cannot list nodes: {e}")], 0),
        }
    }

    /// What the drain would meet now: the budgets it would exceed, and the pods it may not
    /// evict.
    async fn budgets(&self, client: &kube::Client) -> (Vec<String>, Vec<String>) {
        let opts = self.drain_options();
        let planned = crate::drain::exec::dry_run_with_pods(client, &self.node, &opts).await;
        let (plan, pods) = match planned {
            Ok(x) => x,
            Err(e) => return (vec![format!("cannot plan the drain: {e}")], Vec::new()),
        };
        let unevictable = plan
            .refused()
            .map(|(p, why)| format!("{}/{} ({why})", p.namespace, p.name))
            .collect();
        let pdbs: Api<PodDisruptionBudget> = Api::all(client.clone());
        let budgets = match pdbs.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => {
                return (
                    vec![format!("cannot list PodDisruptionBudgets: {e}")],
                    unevictable,
                );
            }
        };
        let by_uid: std::collections::HashMap<&str, &Pod> = pods
            .iter()
            .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
            .collect();
        let leaving: Vec<&Pod> = plan
            .evictions()
            .filter_map(|(r, _)| by_uid.get(r.uid.as_str()).copied())
            .collect();
        (
            crate::drain::plan::budgets_short(&leaving, &budgets),
            unevictable,
        )
    }

    /// Waits with `w`: says so where it changed, and comes back after the period.
    async fn waiting(&mut self, client: &kube::Client, w: Wait) -> Duration {
        let changed = self.status.reason() != Some(w.reason());
        self.show("waiting", Some(w.reason()), &w.message(), None);
        if changed {
            info!(reason = w.reason(), "reboot waits: {}", w.message());
            let message = w.message();
            let waiting = Moment::RebootWaiting {
                reason: w.reason(),
                message: &message,
            };
            self.condition(client, waiting).await;
            self.event(client, false, w.reason(), w.message()).await;
        }
        self.s.period
    }
}

/// Whether a pod is still there to count (not Succeeded or Failed).
fn running(p: &Pod) -> bool {
    !matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Draining and rebooting.
impl Coordinator {
    fn drain_options(&self) -> DrainOptions {
        let mut opts = DrainOptions::for_leaving_node(&self.drain, super::CORDON_REASON, false);
        // Recorded as a shutdown cordon: the agent lifts it once the node is back, as after any
        // reboot it drained for.
        opts.shutdown = true;
        opts.timeout = self.s.drain_timeout;
        // A drain that cannot finish does not reboot: nothing is deleted past a budget.
        opts.on_deadline = crate::config::OnDeadline::Abandon;
        opts.metrics = Some(self.drain_metrics.clone());
        opts.lifecycle = self.lifecycle;
        opts
    }

    /// The slot is ours: record it on the Node, then drain and reboot.
    async fn take(&mut self, client: &kube::Client, q: Request, slot: String) -> Duration {
        let now = Timestamp::now();
        self.took_at = Some(now);
        let record = Record {
            slot: slot.clone(),
            boot_id: self.boot_id.clone(),
            phase: "draining".into(),
            since: now.to_string(),
        };
        if let Err(e) = self.write_record(client, Some(&record)).await {
            self.failed(&e);
            self.release(&slot).await;
            return self.s.period;
        }
        let note = format!("took reboot slot {slot} (asked by {q}); draining");
        self.event(client, false, "RebootSlotTaken", note).await;
        self.drain_and_reboot(client, record).await
    }

    /// Taken in this boot before the agent restarted: go on if the slot is still ours.
    async fn resume(&mut self, client: &kube::Client, r: Record) -> Duration {
        let Some(e) = self.slot(&r.slot) else {
            self.give_back(client, &r, "its slot is no longer configured", "abandoned")
                .await;
            return self.s.period;
        };
        if !e.try_acquire().await {
            let why = "its slot was taken by another node meanwhile";
            self.give_back(client, &r, why, "abandoned").await;
            return self.s.period;
        }
        if self.took_at.is_none() {
            self.took_at = r.since.parse().ok();
        }
        self.drain_and_reboot(client, r).await
    }

    async fn drain_and_reboot(&mut self, client: &kube::Client, mut r: Record) -> Duration {
        self.show(
            "draining",
            Some("Draining"),
            "draining for the reboot",
            Some(&r.slot),
        );
        let msg = format!("draining before the reboot (slot {})", r.slot);
        let underway = Moment::RebootUnderway {
            reason: "Draining",
            message: &msg,
        };
        self.condition(client, underway).await;
        let opts = self.drain_options();
        let drained = self
            .renewing(
                &r.slot,
                crate::drain::exec::drain(client, &self.node, &opts),
            )
            .await;
        let why = match drained {
            Ok(report) if report.outcome == DrainOutcome::Drained => None,
            Ok(report) => Some(unfinished(&report)),
            Err(e) => Some(format!("the drain failed: {e}")),
        };
        if let Some(why) = why {
            self.give_back(client, &r, &why, "drain-failed").await;
            return self.s.period;
        }
        if self.requested().await.is_none() {
            let why = "the reboot request was withdrawn while the node drained";
            self.give_back(client, &r, why, "abandoned").await;
            return self.s.period;
        }
        // The fence: renewals may have failed for the slot's whole duration while the node
        // drained, and another node taken it. Reboot only while it is still ours.
        if !self.still_holds(&r.slot).await {
            let why = format!(
                "its slot {} was taken by another node while it drained",
                r.slot
            );
            self.give_back(client, &r, &why, "drain-failed").await;
            return self.s.period;
        }
        r.phase = "rebooting".into();
        if let Err(e) = self.write_record(client, Some(&r)).await {
            self.failed(&e);
        }
        self.show(
            "rebooting",
            Some("Rebooting"),
            "drained; rebooting",
            Some(&r.slot),
        );
        let underway = Moment::RebootUnderway {
            reason: "Rebooting",
            message: "drained; rebooting",
        };
        self.condition(client, underway).await;
        let note = format!("drained; rebooting (slot {})", r.slot);
        info!(slot = %r.slot, "drained; rebooting");
        self.event(client, false, "Rebooting", note).await;
        let why = self.reboot_bounded(&r.slot).await;
        self.give_back(client, &r, &why, "reboot-failed").await;
        self.s.period
    }

    /// Asks for the reboot and waits for the machine to go down, renewing `slot` all along,
    /// for at most `reboot_timeout` (the ask included: a command or a logind call that hangs
    /// is dropped, the command killed). Returns why the node is still up.
    async fn reboot_bounded(&self, slot: &str) -> String {
        let limit = self.s.reboot_timeout;
        let going = async {
            self.reboot().await?;
            // The machine goes down now; the slot is renewed until it does.
            std::future::pending::<Result<(), String>>().await
        };
        match self
            .renewing(slot, tokio::time::timeout(limit, going))
            .await
        {
            Ok(Err(e)) => e,
            Ok(Ok(())) | Err(_) => {
                format!(
                    "the reboot was asked for {limit:?} ago and has not happened (reboot_timeout)"
                )
            }
        }
    }

    /// Asks for the reboot: the configured command, or logind.
    async fn reboot(&self) -> Result<(), String> {
        if let Some((program, args)) = self.s.reboot_command.as_ref().and_then(|a| a.split_first())
        {
            let status = tokio::process::Command::new(program)
                .args(args)
                .stdin(std::process::Stdio::null())
                // Past reboot_timeout the future is dropped: the command goes with it.
                .kill_on_drop(true)
                .status()
                .await
                .map_err(|e| format!("cannot run the reboot command {program}: {e}"))?;
            return if status.success() {
                Ok(())
            } else {
                Err(format!("the reboot command {program} failed: {status}"))
            };
        }
        let logind = crate::logind::Logind::connect()
            .await
            .map_err(|e| format!("cannot reach logind to reboot: {e}"))?;
        logind
            .reboot()
            .await
            .map_err(|e| format!("logind refused to reboot: {e}"))
    }

    /// Runs `work`, renewing the slot `slot` every third of its duration meanwhile.
    async fn renewing<T>(&self, slot: &str, work: impl std::future::Future<Output = T>) -> T {
        let Some(e) = self.slot(slot) else {
            return work.await;
        };
        let mut tick = tokio::time::interval(self.s.lease_duration / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return out,
                _ = tick.tick() => {
                    if !e.try_acquire().await {
                        warn!(slot, "cannot renew the reboot slot");
                    }
                }
            }
        }
    }

    fn slot(&self, slot: &str) -> Option<&Slot> {
        let i = slot.strip_prefix(SLOT_PREFIX)?.parse::<usize>().ok()?;
        self.slots.get(i)
    }

    /// Renews `slot` if this node still holds it; `false` when it does not (or cannot tell).
    async fn still_holds(&self, slot: &str) -> bool {
        match self.slot(slot) {
            Some(e) => e.peek().await == Some(Step::Renew) && e.try_acquire().await,
            None => false,
        }
    }

    async fn release(&self, slot: &str) {
        if let Some(e) = self.slot(slot) {
            e.release().await;
        }
    }
}

/// Why a drain that ended did not drain the node.
fn unfinished(report: &DrainReport) -> String {
    let names = |v: &[crate::drain::plan::PodRef]| {
        v.iter()
            .take(5)
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match report.outcome {
        DrainOutcome::DeadlineExceeded => format!(
            "the drain did not finish within its deadline: {} pods left ({})",
            report.left_behind.len(),
            names(&report.left_behind)
        ),
        DrainOutcome::BudgetUnsatisfiable => match report.unsatisfiable.first() {
            Some((pod, why)) => format!(
                "{} pods stay: their budgets cannot allow their eviction ({pod}: {why})",
                report.unsatisfiable.len()
            ),
            None => format!("the drain ended {}", report.outcome),
        },
        DrainOutcome::Refused => {
            let refused: Vec<_> = report.refused.iter().map(|(p, _)| p.clone()).collect();
            format!(
                "the drain left {} pods it may not evict ({}); a reboot would kill them",
                refused.len(),
                names(&refused)
            )
        }
        other => format!("the drain ended {other}"),
    }
}

/// Coming back, and giving back.
impl Coordinator {
    /// The node rebooted: wait until it is back, lift the reboot's cordon, settle, give the
    /// slot to the next node.
    async fn back(&mut self, client: &kube::Client, me: &Node, r: Record) -> Duration {
        let due = self
            .renewed_at
            .is_none_or(|t| t.elapsed() >= self.s.lease_duration / 3);
        // Still ours (not taken over while the machine was down): renew it.
        if due && self.still_holds(&r.slot).await {
            self.renewed_at = Some(std::time::Instant::now());
        }
        let now = Timestamp::now();
        // The gates as this agent process judges them: the Node's nodeward.io/Ready may still say
        // True from before the reboot, until the new agent writes it.
        let gates_pass = self.gates_passing.get() == 1;
        let step = decide::back(
            returning(me, gates_pass),
            self.back_since,
            self.s.settle_time,
            now,
        );
        match step {
            BackStep::Wait(what) => {
                self.back_since = None;
                let msg = format!("rebooted; waiting for {what}");
                self.settling(client, &r, &msg).await;
            }
            BackStep::Uncordon => self.lift_cordon(client, "back").await,
            BackStep::Settle { since, until } => {
                self.back_since = Some(since);
                let msg = format!("back; the slot goes to the next node at {until}");
                self.settling(client, &r, &msg).await;
            }
            BackStep::Release => {
                self.done(client, &r).await;
                return self.s.period;
            }
        }
        BACK_POLL.min(self.s.period)
    }

    async fn settling(&mut self, client: &kube::Client, r: &Record, msg: &str) {
        let changed = self.status.phase() != Some("settling");
        self.show("settling", Some("Settling"), msg, Some(&r.slot));
        if changed {
            let underway = Moment::RebootUnderway {
                reason: "Settling",
                message: msg,
            };
            self.condition(client, underway).await;
            self.event(client, false, "RebootSettling", msg.to_string())
                .await;
        }
    }

    /// The reboot is over: give the slot, withdraw `nodeward reboot`'s request.
    async fn done(&mut self, client: &kube::Client, r: &Record) {
        if let Err(e) = std::fs::remove_file(&self.s.request_file)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(error = %e, file = %self.s.request_file.display(), "cannot remove the reboot request");
        }
        let took = self.took_at.take().or_else(|| r.since.parse().ok());
        if let Some(t) = took {
            let secs = Timestamp::now().duration_since(t).as_secs_f64();
            self.metrics.last_duration_seconds.set(secs);
        }
        self.back_since = None;
        self.end(
            client,
            r,
            "rebooted and back; slot given to the next node",
            "done",
        )
        .await;
    }

    /// Lifts the reboot's own cordon, never another's (an operator's `nodeward cordon`, a
    /// cluster shutdown's, a scale-down's: kept, and said).
    async fn lift_cordon(&self, client: &kube::Client, when: &str) {
        let by = crate::drain::Lifter::Reason(super::CORDON_REASON);
        match crate::drain::exec::uncordon(client, &self.node, false, by).await {
            Ok(crate::drain::UncordonOutcome::Kept { reason }) => {
                info!(cordon = %reason, "{when}: the node is cordoned by another of nodeward's moments; its cordon stays");
            }
            Ok(outcome) => info!(?outcome, "{when}: the reboot's cordon lifted"),
            Err(crate::drain::exec::Error::CordonedByOther { who, .. }) => {
                info!(by = ?who, "{when}: cordoned by someone else; their cordon stays");
            }
            Err(e) => warn!(error = %e, "{when}: cannot lift the reboot's cordon"),
        }
    }

    /// Gives up the reboot: lift the cordon (the reboot's only), give the slot back, say why.
    async fn give_back(&mut self, client: &kube::Client, r: &Record, why: &str, result: &str) {
        self.lift_cordon(client, "reboot given up").await;
        let msg = if result == "abandoned" {
            format!("not rebooting: {why}")
        } else {
            format!("not rebooting: {why}; trying again next period")
        };
        self.end(client, r, &msg, result).await;
    }

    /// Ends the reboot with `result`: record cleared, slot given back, said everywhere.
    /// `abandoned` (the request went away) is no failure; a failed drain or reboot is.
    async fn end(&mut self, client: &kube::Client, r: &Record, msg: &str, result: &str) {
        if let Err(e) = self.write_record(client, None).await {
            self.failed(&e);
        }
        self.release(&r.slot).await;
        self.renewed_at = None;
        self.metrics.ended(result);
        let (reason, warning) = match result {
            "done" => ("RebootDone", false),
            "abandoned" => ("RebootAbandoned", false),
            _ => ("RebootFailed", true),
        };
        info!(slot = %r.slot, result, "{msg}");
        let over = Moment::RebootOver {
            reason,
            message: msg,
        };
        self.condition(client, over).await;
        self.event(client, warning, reason, msg.to_string()).await;
        self.show("idle", Some(reason), msg, None);
    }
}

/// The returning node, as [`decide::back`] reads it, with the gates' verdict of this boot.
fn returning(n: &Node, gates_pass: bool) -> Return {
    let is_true = |t: &str| crate::node_write::condition(n, t).is_some_and(|c| c.status == "True");
    let cordon = if !crate::drain::cordon::is_cordoned(n) {
        Cordon::None
    } else if crate::drain::cordon::nodeward_cordon(n)
        .is_some_and(|r| r.is_for(crate::drain::Lifter::Reason(super::CORDON_REASON)))
    {
        Cordon::Ours
    } else {
        Cordon::Other
    };
    Return {
        kubelet_ready: is_true("Ready"),
        gates_pass,
        startup_taint: crate::readiness::has_startup_taint(n),
        cordon,
    }
}
