//! The agent at a shutdown: applying the `[shutdown]` policy when logind announces one,
//! retrying only what trying again can fix, and releasing the lock when done.

use super::*;
use crate::out_of_service::{self, PowerOff};
use crate::systemd::{DRAIN_UNIT, Systemd};
use tracing::debug;

/// The power-off record's write may take this long past the drain's deadline (at most half the
/// safety margin, which is what remains of logind's cap): one small patch.
const ANNOUNCE_TIME: Duration = Duration::from_secs(2);

/// How long a shutdown logind did not name waits for the monitor's copy of the call that asked
/// for it: both leave the bus together, so milliseconds; a quarter second even on an emulated
/// CPU, taken from the drain only when no call was seen at all (a power button, no monitor).
const CALL_WAIT: Duration = Duration::from_millis(250);

/// How long the shutdown's drain waits for `GracefulNodeShutdownInProgress` to be written before
/// it starts (so that the Node says the shutdown before the drain): one patch, milliseconds; an
/// API server slower than this costs the drain no more.
const SAY_SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

impl Agent {
    /// What logind said at `at` (when the signal arrived).
    pub(super) async fn on_logind(&mut self, ev: LogindEvent, at: Instant) -> Option<DrainFuture> {
        match ev {
            LogindEvent::LogindVanished => {
                warn!(
                    "logind left the bus; its locks survive a restart, re-taking ours when it is back"
                );
                None
            }
            LogindEvent::LogindAppeared => {
                info!("logind is on the bus");
                if self.known.wants_lock() {
                    self.take_lock().await;
                }
                None
            }
            LogindEvent::PrepareForShutdown { start: true, kind } => {
                if !self.known.wants_lock() {
                    // The second of the two signals systemd 255+ sends for one shutdown.
                    return None;
                }
                let metadata = match (kind, &self.logind.conn) {
                    (Some(k), _) => Some(k),
                    (None, Some(l)) => Some(l.preparing_kind().await),
                    (None, None) => None,
                };
                let kind = self.shutdown_kind(metadata).await;
                self.start_shutdown(kind, at)
            }
            LogindEvent::PrepareForShutdown { start: false, .. } => {
                if self.known.wants_lock() {
                    return None;
                }
                info!(node = %self.node, "shutdown cancelled; taking the lock again");
                self.known
                    .phase_to(&self.node, PhaseEvent::ShutdownCancelled);
                self.known.shutdown_started = None;
                if let Some(stop) = self.report.drain_stop.take() {
                    // The drain ends through its ending steps; the loop keeps polling it.
                    stop.send_replace(true);
                }
                self.rearm_drain_unit();
                let said = self.say_lifecycle(crate::lifecycle::Moment::ShutdownCancelled);
                if tokio::time::timeout(SAY_SHUTDOWN_WAIT, said).await.is_err() {
                    debug!("the cancel was not said in GracefulNodeShutdownInProgress in time");
                }
                self.withdraw_power_off().await;
                if self.known.lock != Lock::Held {
                    self.take_lock().await;
                }
                self.reconcile().await;
                None
            }
        }
    }

    /// After a cancelled power-off: removes the record it left on the Node, so that a later
    /// NotReady of this boot cannot pass for that power-off (and the controller need not wait
    /// [`out_of_service::ANNOUNCED_WITHIN`] to call it stale). Bounded by [`ANNOUNCE_TIME`]
    /// twice; a record left behind is still cleared by the controller once it is stale.
    async fn withdraw_power_off(&mut self) {
        let record = self
            .logind
            .recorded
            .lock()
            .map(|mut r| r.take())
            .unwrap_or_default();
        let (Some(record), Some(client)) = (record, self.api.client.clone()) else {
            return;
        };
        withdraw_bounded(&client, &self.node, &record, ANNOUNCE_TIME * 2).await;
    }

    /// The kind of the shutdown just announced ([`logind::monitor::decide_kind`]). Where logind
    /// does not name it, the call that asked for it does: the monitor's copy of that call and
    /// logind's signal come on two connections, so a signal read first waits up to
    /// [`CALL_WAIT`] for the call.
    async fn shutdown_kind(&mut self, metadata: Option<ShutdownKind>) -> ShutdownKind {
        let decide = |c: &Option<logind::monitor::Called>| {
            logind::monitor::decide_kind(metadata, c.as_ref(), jiff::Timestamp::now())
        };
        let mut kind = decide(&self.logind.called.borrow_and_update());
        if kind == ShutdownKind::Unknown {
            let called = &mut self.logind.called;
            if let Ok(Ok(())) = tokio::time::timeout(CALL_WAIT, called.changed()).await {
                kind = decide(&called.borrow_and_update());
            }
        }
        let called = self.logind.called.borrow().clone();
        info!(?metadata, ?called, ?kind, "shutdown kind decided");
        kind
    }

    /// Starts the shutdown logind announced at `announced`, from which its deadline runs.
    pub(super) fn start_shutdown(
        &mut self,
        kind: ShutdownKind,
        announced: Instant,
    ) -> Option<DrainFuture> {
        let s = self.settings.clone();
        let policy = logind::policy_for(kind, &s.shutdown);
        let cap = self.known.cap.unwrap_or(s.drain.timeout);
        let deadline = logind::drain_deadline(cap, s.shutdown.safety_margin, s.drain.timeout);
        info!(node = %self.node, ?kind, ?policy, ?deadline, "shutdown announced");
        if !self.known.phase_to(&self.node, PhaseEvent::ShutdownStarted) {
            return None;
        }
        self.known.shutdown_started = Some(ShutdownStart {
            at: announced,
            at_wall: jiff::Timestamp::now()
                .checked_sub(announced.elapsed())
                .unwrap_or_else(|_| jiff::Timestamp::now()),
            kind,
            policy,
            deadline,
        });
        let reason = format!("shutdown ({kind:?})").to_lowercase();
        let Some(client) = self.api.client.clone() else {
            return Some(Box::pin(
                async move { outcome(ShutdownOutcome::NoKubeconfig) },
            ));
        };
        let node = self.node.clone();
        let exclude_lb = s.drain.exclude_from_load_balancers;
        let cordoned = self.logind.cordoned.clone();
        let (opts, cancelled) = self.shutdown_drain_options(&s.drain, &reason);
        let until = announced + deadline;
        let by = until + ANNOUNCE_TIME.min(s.shutdown.safety_margin / 2);
        let record = (kind == ShutdownKind::PowerOff).then(|| Recording {
            client: client.clone(),
            node: node.clone(),
            by,
            cancelled,
            recorded: self.logind.recorded.clone(),
        });
        let say = self.say_lifecycle(crate::lifecycle::Moment::ShutdownPreparing {
            kind: &format!("{kind:?}"),
        });
        let drain: DrainFuture = match policy {
            ShutdownPolicy::Nothing => {
                Box::pin(async move { outcome(ShutdownOutcome::NothingToDo) })
            }
            ShutdownPolicy::Cordon => Box::pin(async move {
                retry_until(&node, until, "cordon", |_| {
                    crate::drain::cordon_for_shutdown(&client, &node, &reason, exclude_lb)
                })
                .await
                .map_or_else(outcome, |o| {
                    if o == crate::drain::CordonOutcome::Cordoned {
                        cordoned.store(true, Ordering::Relaxed);
                    }
                    outcome(ShutdownOutcome::Cordoned)
                })
            }),
            ShutdownPolicy::Drain => Box::pin(drain_leaving(client, node, until, opts)),
        };
        let drain: DrainFuture = Box::pin(async move {
            if tokio::time::timeout(SAY_SHUTDOWN_WAIT, say).await.is_err() {
                debug!(
                    "GracefulNodeShutdownInProgress not written in {SAY_SHUTDOWN_WAIT:?}; draining without it"
                );
            }
            drain.await
        });
        Some(match record {
            Some(r) => with_record(drain, r),
            None => drain,
        })
    }

    /// The write of `moment`'s lifecycle conditions on this Node (nothing with `[conditions]
    /// lifecycle = false` or no client), as a future the caller bounds; a failure is logged.
    pub(super) fn say_lifecycle(
        &self,
        moment: crate::lifecycle::Moment<'_>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let wants = crate::lifecycle::wants(&moment);
        let client = self
            .api
            .client
            .clone()
            .filter(|_| self.settings.conditions.lifecycle);
        let (node, current) = (self.node.clone(), self.known.node_obj.clone());
        async move {
            let Some(client) = client else { return };
            match crate::lifecycle::write(&client, &node, current, &wants, true).await {
                Ok(_) => debug!(node, "lifecycle conditions written"),
                Err(e) => warn!(node, error = %e, "cannot write the lifecycle conditions"),
            }
        }
    }

    /// The shutdown drain's options: the `[drain]` settings for a leaving node, wired to the
    /// agent's metrics, status (the drain's progress, its stop) and cordon flag; with a receiver
    /// that turns `true` when the shutdown is cancelled.
    fn shutdown_drain_options(
        &mut self,
        drain: &crate::config::DrainSettings,
        reason: &str,
    ) -> (
        crate::drain::DrainOptions,
        tokio::sync::watch::Receiver<bool>,
    ) {
        let mut opts = crate::drain::DrainOptions::for_leaving_node(drain, reason, true);
        opts.lifecycle = self.settings.conditions.lifecycle;
        opts.metrics = Some(self.report.metrics.drain.clone());
        opts.cordoned = Some(self.logind.cordoned.clone());
        let (progress, watching) = tokio::sync::watch::channel(None);
        opts.progress = Some(std::sync::Arc::new(progress));
        self.report.drain_progress = Some(watching);
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let cancelled = stopping.clone();
        opts.stop = Some(stopping);
        self.report.drain_stop = Some(stop);
        (opts, cancelled)
    }

    /// Stops nodeward-drain.service (when armed) as the shutdown drain starts. Its ExecStop then
    /// waits for this drain's outcome (or takes over if the agent dies) while the drain runs,
    /// instead of running after the lock's release: kubelet is ordered before the unit, so
    /// systemd's shutdown would otherwise stop kubelet only once that ExecStop (a process start
    /// and questions to systemd, seconds on a slow machine) had found nothing to do.
    pub(super) fn stop_drain_unit(&mut self) {
        let Some(conn) = self.logind.conn.as_ref().map(|l| l.connection().clone()) else {
            return;
        };
        self.logind.drain_unit = Some(tokio::spawn(async move {
            let stop = async {
                let sd = Systemd::on(&conn).await?;
                if sd.active_state(DRAIN_UNIT).await? != "active" {
                    return Ok(false);
                }
                sd.stop_unit(DRAIN_UNIT).await.map(|()| true)
            };
            match tokio::time::timeout(crate::systemd::TIMEOUT * 2, stop).await {
                Ok(Ok(stopped)) => {
                    if stopped {
                        info!("stopped {DRAIN_UNIT}: it waits for this drain's outcome");
                    }
                    stopped
                }
                Ok(Err(e)) => {
                    warn!(error = %e, "cannot stop {DRAIN_UNIT}; systemd stops it after the lock's release");
                    false
                }
                Err(_) => {
                    warn!(
                        "systemd did not answer in time; it stops {DRAIN_UNIT} after the lock's release"
                    );
                    false
                }
            }
        }));
    }

    /// Starts nodeward-drain.service again after a cancelled shutdown, if the drain stopped it.
    fn rearm_drain_unit(&mut self) {
        let (Some(stopping), Some(conn)) = (
            self.logind.drain_unit.take(),
            self.logind.conn.as_ref().map(|l| l.connection().clone()),
        ) else {
            return;
        };
        tokio::spawn(async move {
            if !matches!(stopping.await, Ok(true)) {
                return;
            }
            let start = async { Systemd::on(&conn).await?.start_unit(DRAIN_UNIT).await };
            match tokio::time::timeout(crate::systemd::TIMEOUT, start).await {
                Ok(Ok(())) => info!("shutdown cancelled: {DRAIN_UNIT} armed again"),
                Ok(Err(e)) => {
                    warn!(error = %e, "cannot start {DRAIN_UNIT} again: `systemctl start {DRAIN_UNIT}` arms it")
                }
                Err(_) => {
                    warn!("systemd did not answer in time: `systemctl start {DRAIN_UNIT}` arms it")
                }
            }
        });
    }

    pub(super) fn drain_ended(&mut self, mut summary: DrainSummary) {
        if let Some(s) = self.known.shutdown_started.take() {
            summary.started_at = s.at_wall.to_string();
            summary.kind = s.kind;
            summary.policy = s.policy;
            summary.deadline_ms = millis(s.deadline);
            summary.elapsed_ms = millis(s.at.elapsed());
        }
        info!(
            node = %self.node,
            outcome = %summary.outcome,
            evicted = summary.evicted,
            deleted_past_budgets = summary.deleted_past_budgets.len(),
            left_behind = summary.left_behind.len(),
            elapsed_ms = summary.elapsed_ms,
            "shutdown drain ended; releasing the lock"
        );
        self.known.phase_to(&self.node, PhaseEvent::DrainEnded);
        self.known.last_drain = Some(summary);
        (self.report.drain_progress, self.report.drain_stop) = (None, None);
        if self.known.lock == Lock::Held {
            self.known.lock_to(LockEvent::ReleasedForShutdown);
        }
        // The status file says "drained" before logind may go on: nodeward-drain.service, stopped
        // next, reads it to do nothing for a shutdown the agent already handled.
        self.publish();
        // Closing the fd is what lets logind go on.
        drop(self.logind.lock_fd.take());
    }

    /// The drain of a cancelled shutdown has stopped (`None`: not within
    /// [`CANCELLED_DRAIN_WAIT`], dropped): the lock stays, and the Node is reconciled again, now
    /// that the drain no longer cordons it.
    pub(super) async fn cancelled_drain_ended(&mut self, summary: Option<DrainSummary>) {
        match &summary {
            Some(s) => {
                info!(node = %self.node, outcome = %s.outcome, evicted = s.evicted, "the cancelled shutdown's drain stopped")
            }
            None => {
                warn!(node = %self.node, "the cancelled shutdown's drain did not stop in {CANCELLED_DRAIN_WAIT:?}; dropped, its Draining condition may stay")
            }
        }
        if summary.is_some() {
            self.known.last_drain = summary;
        }
        self.report.drain_progress = None;
        self.reconcile().await;
    }
}

/// The longest the shutdown drain asks whether a cluster shutdown is recorded: one GET, which an
/// API server answers in milliseconds; one that does not answer costs the drain no more.
const INTENT_LIMIT: Duration = Duration::from_secs(1);

/// Whether a live cluster shutdown is recorded (`nodeward cluster shutdown`) for `node`: the
/// intent exists and the node holds the shutdown's cordon ([`crate::cluster::intent::is_live`]).
/// Asked once as the shutdown drain starts, for at most [`INTENT_LIMIT`] and `share` (a tenth
/// of the drain's time: a short deadline is not spent on the question). No answer is a no, and
/// so is a stale intent (no cordon of its own left here: an interrupted shutdown, uncordoned
/// by hand): the drain waits on budgets, as it always did.
async fn cluster_shutdown_recorded(client: &kube::Client, node: &str, share: Duration) -> bool {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let asked = async { tokio::join!(crate::cluster::intent_exists(client), nodes.get_opt(node)) };
    match tokio::time::timeout(INTENT_LIMIT.min(share), asked).await {
        Ok((true, Ok(Some(me)))) if crate::cluster::intent::is_live([&me]) => true,
        Ok((true, Ok(_))) => {
            warn!(
                node,
                "a cluster shutdown is recorded but this node does not hold its cordon (stale, or this node joined after it): not obeyed; the drain waits on budgets"
            );
            false
        }
        Ok((true, Err(e))) => {
            warn!(node, error = %e, "a cluster shutdown is recorded but this Node cannot be read to judge it: not obeyed; the drain waits on budgets");
            false
        }
        _ => false,
    }
}

pub(super) fn outcome(outcome: ShutdownOutcome) -> DrainSummary {
    DrainSummary::of(outcome)
}

pub(super) fn report_summary(r: &crate::drain::DrainReport) -> DrainSummary {
    DrainSummary {
        evicted: r.evicted.len(),
        deleted_past_budgets: r.force_deleted.iter().map(ToString::to_string).collect(),
        left_behind: r.left_behind.iter().map(ToString::to_string).collect(),
        terminating: terminating(r),
        refused: r.refused.iter().map(|(p, _)| p.to_string()).collect(),
        ..outcome(r.outcome.into())
    }
}

/// The pods of `r` whose objects stay Terminating once the kubelet is gone: those whose
/// containers had stopped and those deleted past their budgets, each once.
fn terminating(r: &crate::drain::DrainReport) -> Vec<String> {
    let mut pods: Vec<String> = r
        .stopped
        .iter()
        .chain(&r.force_deleted)
        .map(ToString::to_string)
        .collect();
    pods.sort();
    pods.dedup();
    pods
}

/// Where and by when a power-off's record is written.
struct Recording {
    client: kube::Client,
    node: String,
    /// Written by then (within logind's cap), or not at all.
    by: Instant,
    /// True once the shutdown was cancelled: then there is nothing to record.
    cancelled: tokio::sync::watch::Receiver<bool>,
    /// Where the record goes once written, for its withdrawal if the shutdown is cancelled.
    recorded: std::sync::Arc<std::sync::Mutex<Option<PowerOff>>>,
}

/// At a power-off, `drain` followed by the [`PowerOff`] record on the Node, written by `r.by`
/// before the future ends and the lock goes. Not for a shutdown cancelled meanwhile (the node
/// stays up), and not without a boot ID (the controller could not tell the next boot from this).
fn with_record(drain: DrainFuture, r: Recording) -> DrainFuture {
    let Recording {
        client,
        node,
        by,
        cancelled,
        recorded,
    } = r;
    Box::pin(async move {
        let summary = drain.await;
        if *cancelled.borrow() {
            info!(
                node,
                "the power-off was cancelled: nothing recorded on the Node"
            );
            return summary;
        }
        let Some(boot_id) = crate::reboot::boot_id() else {
            warn!(
                node,
                "cannot read this boot's ID; the power-off is not recorded on the Node (no out-of-service taint)"
            );
            return summary;
        };
        let record = PowerOff {
            boot_id,
            at: jiff::Timestamp::now().to_string(),
            left_behind: summary.left_behind.clone(),
            terminating: summary.terminating.clone(),
            tainted_at: None,
        };
        match tokio::time::timeout_at(by, out_of_service::announce(&client, &node, &record)).await {
            Ok(Ok(())) => {
                info!(
                    node,
                    left_behind = record.left_behind.len(),
                    terminating = record.terminating.len(),
                    annotation = crate::names::POWER_OFF,
                    "power-off recorded on the Node"
                );
                if *cancelled.borrow() {
                    // Cancelled while the record was on its way: the cancel found nothing to
                    // withdraw, so withdraw it here.
                    withdraw_bounded(&client, &node, &record, ANNOUNCE_TIME).await;
                } else if let Ok(mut r) = recorded.lock() {
                    *r = Some(record);
                }
            }
            Ok(Err(e)) => warn!(node, error = %e, "cannot record the power-off on the Node"),
            Err(_) => warn!(
                node,
                "the power-off's record was not written in time; releasing the lock"
            ),
        }
        summary
    })
}

/// Withdraws the cancelled power-off's `record` from `node` ([`out_of_service::withdraw`])
/// within `limit`, and says how it went: the one way both the cancel and a record written
/// after it take it back.
async fn withdraw_bounded(client: &kube::Client, node: &str, record: &PowerOff, limit: Duration) {
    match tokio::time::timeout(limit, out_of_service::withdraw(client, node, record)).await {
        Ok(Ok(true)) => info!(
            node,
            "the power-off was cancelled: its record withdrawn from the Node"
        ),
        Ok(Ok(false)) => info!(
            node,
            "the power-off was cancelled: its record is gone or the controller's now (tainted); left as it is"
        ),
        Ok(Err(e)) => {
            warn!(node, error = %e, "cannot withdraw the cancelled power-off's record; the controller clears it once stale")
        }
        Err(_) => warn!(
            node,
            "the cancelled power-off's record was not withdrawn in time; the controller clears it once stale"
        ),
    }
}

/// Runs `attempt` (given the time left) until it succeeds or `until`, retrying only errors that
/// trying again can fix ([`crate::drain::exec::Error::is_retryable`]) every [`DRAIN_RETRY`]. A
/// node that does not exist is [`ShutdownOutcome::NotRegistered`], not a failure.
pub(super) async fn retry_until<T, F, Fut>(
    node: &str,
    until: Instant,
    what: &str,
    mut attempt: F,
) -> Result<T, ShutdownOutcome>
where
    F: FnMut(Duration) -> Fut,
    Fut: std::future::Future<Output = crate::drain::exec::Result<T>>,
{
    let mut last_error = None;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, attempt(left)).await {
            Ok(Ok(t)) => return Ok(t),
            Ok(Err(crate::drain::exec::Error::NodeNotFound { .. })) => {
                return Err(ShutdownOutcome::NotRegistered);
            }
            Ok(Err(e)) if e.is_retryable() && Instant::now() + DRAIN_RETRY < until => {
                warn!(node, error = %e, "{what} failed; retrying until the deadline");
                last_error = Some(e.to_string());
                tokio::time::sleep(DRAIN_RETRY).await;
            }
            Ok(Err(e)) if e.is_retryable() => {
                return Err(ShutdownOutcome::DeadlineExceeded(Some(e.to_string())));
            }
            Ok(Err(e)) if e.is_unauthorized() => {
                warn!(node, error = %e, "{what} failed: the API server refused the agent's credentials; the drain unit drains with a client of its own");
                return Err(ShutdownOutcome::Unauthorized(e.to_string()));
            }
            Ok(Err(e)) => {
                warn!(node, error = %e, "{what} failed; trying again would not help");
                return Err(ShutdownOutcome::Failed(e.to_string()));
            }
            Err(_) => return Err(ShutdownOutcome::DeadlineExceeded(last_error)),
        }
    }
}

/// The shutdown drain of `node` until `until`, retried while time is left: without budget waits
/// when a cluster shutdown is recorded (asked for at most a tenth of the time left).
async fn drain_leaving(
    client: kube::Client,
    node: String,
    until: Instant,
    mut opts: crate::drain::DrainOptions,
) -> DrainSummary {
    let left = until.saturating_duration_since(Instant::now());
    opts.cluster_shutdown = cluster_shutdown_recorded(&client, &node, left / 10).await;
    if opts.cluster_shutdown {
        info!(node = %node, "a cluster shutdown is recorded: the drain waits on no budget");
    }
    retry_until(&node, until, "drain", |left| {
        let mut o = opts.clone();
        (o.timeout, o.ending) = drain_budget(left);
        let client = client.clone();
        let node = node.clone();
        async move { crate::drain::drain(&client, &node, &o).await }
    })
    .await
    .map_or_else(outcome, |r| report_summary(&r))
}
