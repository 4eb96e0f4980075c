//! The agent's event loop in phases: what it waits on ([`Sources`], set up by
//! [`Agent::sources`]), one `select!` over them (`Agent::serve`, which [`Agent::main`] drops
//! when a stop signal finds it held), and one handler per kind of event. Each handler puts what
//! it got into what the agent knows (`Agent::known`) and may reconcile; the loop publishes the
//! status after every event.

use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tracing::{info, warn};

use super::{
    ACCESS_RECHECK, AccessFuture, Agent, CANCELLED_DRAIN_WAIT, DrainFuture, Error, FAR_FUTURE,
    KUBELET_LOCK_RECHECK, Phase, ProbeFuture, READY_WITHOUT_API_AFTER, STOP_GRACE, WatchStream,
    changed_or_pending, next_or_pending, notify, sleep_until_opt,
};
use crate::drain::explain::Progress;
use crate::gate::watch::{self as gwatch, FileWatcher, HttpClient};
use crate::logind::Heard;

/// Everything the agent's loop waits on besides the timers it keeps in its own state.
pub(super) struct Sources {
    sigterm: Signal,
    sigint: Signal,
    /// The gate files (inotify) and their wake-ups.
    files: FileWatcher,
    file_rx: UnboundedReceiver<()>,
    /// The kubeconfig, watched like a gate file until it loads, then with the credential files
    /// the client was built from (kubelet rotates its client certificate).
    kc_files: Option<FileWatcher>,
    kc_tx: UnboundedSender<()>,
    kc_rx: UnboundedReceiver<()>,
    access_check: Option<AccessFuture>,
    access_retry_at: Option<Instant>,
    node_events: Option<WatchStream<Node>>,
    pod_events: Option<WatchStream<Pod>>,
    logind_events: Option<BoxStream<'static, Heard>>,
    http_client: HttpClient,
    http_tick: Interval,
    probe: Option<ProbeFuture>,
    kubelet_lock_tick: Interval,
    watchdog: Option<std::time::Duration>,
    watchdog_tick: Interval,
    drain: Option<DrainFuture>,
    /// The shutdown the drain is for was cancelled: it is stopping, and is dropped if it has not
    /// stopped by then.
    drain_cancelled_by: Option<Instant>,
    /// The running drain's word on what it waits on: the status file follows it.
    progress: Option<tokio::sync::watch::Receiver<Option<Progress>>>,
    /// When the agent tells systemd READY even without an answer from the API server.
    ready_anyway_at: Instant,
    /// When the readiness gates are overdue (the boot deadline).
    boot_deadline_at: Instant,
}

fn delayed_interval(period: std::time::Duration) -> Interval {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick
}

fn signal_stream(kind: SignalKind, name: &'static str) -> Result<Signal, Error> {
    signal(kind).map_err(|source| Error::Signal {
        signal: name,
        source,
    })
}

/// Whether a watch failed because the API server refused the client's credentials.
fn unauthorized(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 401,
        watcher::Error::WatchError(s) => s.code == 401,
        _ => false,
    }
}

/// The value of an optional future, or never when there is none.
async fn future_or_pending<F: std::future::Future + Unpin>(f: &mut Option<F>) -> F::Output {
    match f.as_mut() {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

impl Agent {
    /// Sets up what the loop waits on. Gate files: inotify first, then the first read, so nothing
    /// written in between is lost; the kubeconfig: watched until it loads.
    async fn sources(&mut self) -> Result<Sources, Error> {
        let (sigterm, sigint) = (
            signal_stream(SignalKind::terminate(), "SIGTERM")?,
            signal_stream(SignalKind::interrupt(), "SIGINT")?,
        );
        let (file_tx, file_rx) = unbounded_channel();
        let paths = self.settings.gates.file.iter().map(|f| f.path.clone());
        let files = FileWatcher::new(paths.collect(), file_tx)?;
        self.known.facts.files = files.read_all();
        let (kc_tx, kc_rx) = unbounded_channel();
        let kc_files = match (&self.api.client, &self.api.kubeconfig) {
            (None, Some(path)) => Some(FileWatcher::new(vec![path.clone()], kc_tx.clone())?),
            _ => None,
        };
        if self.api.client.is_none() {
            self.api
                .load_kubeconfig(&self.report.metrics.api_errors)
                .await;
        }
        let watchdog = sd_notify::watchdog_enabled();
        let mut src = Sources {
            sigterm,
            sigint,
            files,
            file_rx,
            kc_files,
            kc_tx,
            kc_rx,
            access_check: None,
            access_retry_at: None,
            node_events: None,
            pod_events: None,
            logind_events: self.connect_logind().await,
            http_client: gwatch::http_client(),
            http_tick: delayed_interval(self.settings.gates.http_interval),
            probe: None,
            kubelet_lock_tick: delayed_interval(KUBELET_LOCK_RECHECK),
            watchdog,
            watchdog_tick: tokio::time::interval(
                watchdog.map_or(std::time::Duration::MAX, |d| d / 2),
            ),
            drain: None,
            drain_cancelled_by: None,
            progress: None,
            ready_anyway_at: self.known.started + READY_WITHOUT_API_AFTER,
            // A deadline too far to represent (a config of years) is as good as none.
            boot_deadline_at: self
                .known
                .started
                .checked_add(self.settings.agent.boot_deadline)
                .unwrap_or_else(|| self.known.started + FAR_FUTURE),
        };
        self.connect_api(&mut src);
        Ok(src)
    }

    /// Runs until SIGTERM or SIGINT (neither is a shutdown: the lock is closed without a
    /// drain); a shutdown's drain runs inside the loop, as one of its futures. A handler the
    /// API server holds (a write to a frozen one waits up to its request deadline, and a
    /// reconcile makes several) does not hold the stop: [`STOP_GRACE`] after the signal the
    /// loop is dropped where it stands.
    pub(super) async fn main(&mut self) -> Result<(), Error> {
        let (mut term, mut int) = (
            signal_stream(SignalKind::terminate(), "SIGTERM")?,
            signal_stream(SignalKind::interrupt(), "SIGINT")?,
        );
        let held = async {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tokio::time::sleep(STOP_GRACE).await;
        };
        let served = tokio::select! {
            served = self.serve() => Some(served),
            () = held => None,
        };
        match served {
            Some(served) => served?,
            None => warn!(
                grace = ?STOP_GRACE,
                "stopping: a call to the API server was still under way after the signal; dropped unanswered"
            ),
        }
        self.stopped();
        Ok(())
    }

    /// The loop of [`Agent::main`], until the stop signal breaks it.
    async fn serve(&mut self) -> Result<(), Error> {
        info!(node = %self.node, gates = self.known.gates.gates.len(), "agent starting");
        let mut src = self.sources().await?;
        let probing = !self.settings.gates.http.is_empty();
        self.publish();
        loop {
            let (reconcile_at, logind_at) = (self.api.reconcile_retry_at, self.logind.retry_at);
            let watch_deadline = !self.known.overdue_reported && self.known.phase.gates_act();
            // A wake-up for publish() at the moment READY stops waiting for the API server:
            // only while that moment is ahead (a lock never taken, with no bus, would
            // otherwise wake the loop at once, forever).
            let ready_wake = (!self.known.notified_ready)
                .then_some(src.ready_anyway_at)
                .filter(|at| *at > Instant::now());
            tokio::select! {
                // In this order, before anything that may call the API server: logind's
                // announcement of a shutdown is never kept waiting behind a retry of a
                // reconcile that a frozen API server holds (each call bounded by
                // REQUEST_DEADLINE), as a random pick among ready branches could.
                biased;
                _ = src.sigterm.recv() => { info!(phase = ?self.known.phase, "{}", self.known.phase.on_sigterm()); break; }
                _ = src.sigint.recv() => { info!("SIGINT: stopping; releasing the lock without draining"); break; }
                ev = next_or_pending(&mut src.logind_events) => self.on_logind_event(ev, &mut src).await,
                Some(()) = src.file_rx.recv() => self.on_gate_files(&mut src).await?,
                Some(()) = src.kc_rx.recv(), if src.kc_files.is_some() => self.on_kubeconfig_written(&mut src).await?,
                _ = sleep_until_opt(self.api.kubeconfig_retry_at), if self.api.kubeconfig.is_some() => {
                    self.api.load_kubeconfig(&self.report.metrics.api_errors).await;
                    self.connect_api(&mut src);
                }
                Some(ev) = next_or_pending(&mut src.node_events) => self.on_node_event(ev).await,
                Some(ev) = next_or_pending(&mut src.pod_events) => self.on_pod_event(ev).await,
                summary = future_or_pending(&mut src.drain) => {
                    (src.drain, src.progress) = (None, None);
                    match src.drain_cancelled_by.take() {
                        Some(_) => self.cancelled_drain_ended(Some(summary)).await,
                        None => self.drain_ended(summary),
                    }
                }
                _ = sleep_until_opt(src.drain_cancelled_by) => {
                    (src.drain, src.progress, src.drain_cancelled_by) = (None, None, None);
                    self.cancelled_drain_ended(None).await;
                }
                Ok(()) = changed_or_pending(&mut src.progress) => {}
                answer = future_or_pending(&mut src.access_check) => {
                    src.access_check = None;
                    src.access_retry_at = self.access_answered(answer).then(|| Instant::now() + ACCESS_RECHECK);
                    self.reconcile().await;
                }
                _ = sleep_until_opt(src.access_retry_at), if src.access_check.is_none() => {
                    src.access_retry_at = None;
                    src.access_check = self.api.client.as_ref().map(|c| self.check_access(c));
                }
                results = future_or_pending(&mut src.probe) => {
                    src.probe = None;
                    self.known.facts.http = results.into_iter().collect();
                    self.reconcile().await;
                }
                _ = src.http_tick.tick(), if probing && src.probe.is_none() => src.probe = Some(self.probe_http(&src.http_client)),
                _ = src.kubelet_lock_tick.tick() => if self.list_kubelet_locks().await { self.reconcile().await },
                _ = sleep_until_opt(reconcile_at) => {
                    self.api.reconcile_retry_at = None;
                    self.reconcile().await;
                }
                _ = sleep_until_opt(logind_at) => self.on_logind_retry(&mut src).await,
                _ = tokio::time::sleep_until(src.boot_deadline_at), if watch_deadline => self.reconcile().await,
                _ = src.watchdog_tick.tick(), if src.watchdog.is_some() => notify(&[sd_notify::NotifyState::Watchdog]),
                // Only to wake up publish(), which decides READY.
                _ = sleep_until_opt(ready_wake) => {}
            }
            self.publish();
        }
        Ok(())
    }

    /// Once there is a client (a new one after its credentials changed): the drain-access
    /// check and the watches of the own Node and pods, and the watch of the files it was built
    /// from in place of the kubeconfig's.
    fn connect_api(&mut self, src: &mut Sources) {
        let Some(c) = self.api.client.clone() else {
            return;
        };
        let files = self.api.credential_files();
        src.kc_files = match FileWatcher::new(files, src.kc_tx.clone()) {
            Ok(w) => Some(w),
            Err(e) => {
                warn!(error = %e, "cannot watch the kubeconfig's credential files; a rotated certificate is read after the API server refuses the old one");
                None
            }
        };
        src.access_check = Some(self.check_access(&c));
        let (nodes, pods) = self.watches(&c);
        (src.node_events, src.pod_events) = (Some(nodes), Some(pods));
    }

    /// A logind signal (a shutdown starts or is cancelled), or the bus gone (`None`).
    async fn on_logind_event(&mut self, ev: Option<Heard>, src: &mut Sources) {
        let Some(ev) = ev else {
            warn!("lost the D-Bus connection; reconnecting");
            self.logind.lost();
            src.logind_events = None;
            return;
        };
        if let Some(d) = self.on_logind(ev.event, ev.at).await {
            (src.drain, src.drain_cancelled_by) = (Some(d), None);
            src.progress.clone_from(&self.report.drain_progress);
            // The drain unit's ExecStop waits for the outcome in the status file, which must
            // say "draining" before the unit is stopped.
            self.publish();
            self.stop_drain_unit();
        }
        if matches!(self.known.phase, Phase::Gated | Phase::Ready)
            && src.drain.is_some()
            && src.drain_cancelled_by.is_none()
        {
            // A cancelled shutdown: its drain was told to stop, and ends through its ending
            // steps (the Node told, surge replicas given back), bounded.
            src.drain_cancelled_by = Some(Instant::now() + CANCELLED_DRAIN_WAIT);
        }
    }

    /// Time to reconnect to the bus, or to take the lock again.
    async fn on_logind_retry(&mut self, src: &mut Sources) {
        self.logind.retry_at = None;
        if self.logind.conn.is_none() {
            src.logind_events = self.connect_logind().await;
        } else if self.known.wants_lock() && self.known.lock != super::Lock::Held {
            self.take_lock().await;
        }
    }

    async fn on_gate_files(&mut self, src: &mut Sources) -> Result<(), Error> {
        while src.file_rx.try_recv().is_ok() {}
        src.files.rearm()?;
        self.known.facts.files = src.files.read_all();
        self.reconcile().await;
        Ok(())
    }

    /// The kubeconfig's directory, or its credentials', changed: when there is no client yet
    /// or they hold something new, build it now, with the backoff reset.
    async fn on_kubeconfig_written(&mut self, src: &mut Sources) -> Result<(), Error> {
        while src.kc_rx.try_recv().is_ok() {}
        if let Some(w) = src.kc_files.as_mut() {
            w.rearm()?;
        }
        if self.api.client.is_some() && !self.api.credentials_changed() {
            return Ok(());
        }
        if self.api.client.is_some() {
            info!(node = %self.node, "the kubeconfig or its client certificate changed; building the client again");
        }
        self.api.kubeconfig_backoff.reset();
        self.api
            .load_kubeconfig(&self.report.metrics.api_errors)
            .await;
        self.connect_api(src);
        Ok(())
    }

    async fn on_node_event(&mut self, ev: watcher::Result<watcher::Event<Node>>) {
        match ev {
            Ok(ev) => {
                self.api.answered(&self.node);
                self.known.apply_node(&self.node, ev);
            }
            Err(e) => {
                self.known.node_watch.abandon_relist();
                self.api.failed(&self.node, "node watch", &e.to_string());
                if unauthorized(&e) {
                    self.api.unauthorized();
                }
            }
        }
        self.reconcile().await;
    }

    async fn on_pod_event(&mut self, ev: watcher::Result<watcher::Event<Pod>>) {
        match ev {
            Ok(ev) => {
                self.api.answered(&self.node);
                self.known.pods.apply(&ev);
            }
            Err(e) => {
                self.known.pods.abandon_relist();
                self.api.failed(&self.node, "pod watch", &e.to_string());
                if unauthorized(&e) {
                    self.api.unauthorized();
                }
            }
        }
        self.reconcile().await;
    }

    /// One round of the HTTP gates' probes, one after the other.
    fn probe_http(&self, client: &HttpClient) -> ProbeFuture {
        let client = client.clone();
        let timeout = self.settings.gates.http_timeout;
        let urls: Vec<hyper::Uri> = self
            .settings
            .gates
            .http
            .iter()
            .map(|h| h.url.clone())
            .collect();
        Box::pin(async move {
            let mut out = Vec::new();
            for u in urls {
                let fact = gwatch::probe(&client, &u, timeout).await;
                out.push((u.to_string(), fact));
            }
            out
        })
    }

    /// The loop is over: tell systemd, close the lock (without a drain) and say so.
    fn stopped(&mut self) {
        notify(&[sd_notify::NotifyState::Stopping]);
        if self.logind.lock_fd.take().is_some() {
            self.known.lock_to(super::LockEvent::Dropped);
        }
        self.publish();
        info!(node = %self.node, "agent stopped; lock closed");
    }
}
