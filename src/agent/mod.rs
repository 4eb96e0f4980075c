//! `nodeward agent`: the node-local service that closes both ends of a node's life.
//!
//! At the start of it, the node takes no workload until its network is really up: the agent
//! watches the readiness gates ([`crate::gate`]), reports them as the Node condition
//! `nodeward.io/Ready` (the readiness controller, [`crate::readiness`], then removes the startup
//! taint), and once all pass lifts a cordon nodeward left before a reboot — never an
//! administrator's. At the end of it, the
//! node gives its pods back before kubelet stops: the agent holds a logind delay inhibitor lock,
//! drains on `PrepareForShutdown(true)` within a deadline derived from logind's cap, and closes
//! the lock's fd so the shutdown proceeds. SIGTERM is *not* a shutdown (a package upgrade restarts
//! the service): the agent closes its lock and exits without draining; `nodeward-drain.service`
//! (`ExecStop=nodeward drain`) is the unit whose stop drains.
//!
//! The agent starts before the node has joined: cloud-init starts it, then runs `kubeadm join`,
//! which writes the kubeconfig. So a missing kubeconfig is waited for (inotify on its directory,
//! or the deepest ancestor that exists), a missing Node is waited for (the Node watch), and an
//! unreachable API server is retried with backoff; none of them keeps the agent from taking
//! logind's lock and telling systemd READY, because a machine that shuts down before it joined
//! has nothing to drain, and `systemctl start` must not hang on the network.
//!
//! One task owns all state and reacts to events — watches on the own Node and pods, inotify,
//! logind's signals and bus name, Unix signals — so nothing polls and nothing needs a lock.
//! What to do is decided by the pure [`state`] machine and [`crate::gate::evaluate`]; this file
//! only gathers facts and acts.

pub mod node;
pub mod state;
pub mod status;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use tokio::time::Instant;
use tracing::{error, info, warn};
use zbus::zvariant::OwnedFd;

use crate::config::{Settings, ShutdownPolicy, TaintOwner};
use crate::gate::watch::{self as gwatch, FileWatcher};
use crate::gate::{Facts, GateSet, HttpFact, Verdict};
use crate::logind::{self, Logind, LogindEvent, ShutdownKind};
use crate::readiness;
use crate::store::Mirror;
use state::{Action, Lock, LockEvent, Phase, PhaseEvent, View};
use status::{DrainSummary, ShutdownOutcome, Status};

/// First wait before reconnecting to the bus or retrying the lock; doubles up to
/// [`LOGIND_RETRY_MAX`]. The bus being gone has no event to wait for, and the lock must be back
/// within about a second of logind or the bus returning.
const LOGIND_RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest wait between reconnection attempts: keeps "lock back within about a second".
const LOGIND_RETRY_MAX: Duration = Duration::from_secs(1);
/// After a failed write to the Node (API down), reconcile again this soon even without an event;
/// doubles on every further failure up to [`RECONCILE_RETRY_MAX`].
const RECONCILE_RETRY: Duration = Duration::from_secs(2);
/// Longest wait between retries of a failing write: the watches still deliver every change at
/// once, so this only bounds how long a transient error can delay a write.
const RECONCILE_RETRY_MAX: Duration = Duration::from_secs(30);
/// With the lock held, READY is sent once the watches have synced, or after this long without
/// them: `systemctl start` (and a package upgrade's restart) must not wait on the API server,
/// while a reachable one usually answers well within it, so READY still means "watches up" then.
const READY_WITHOUT_API_AFTER: Duration = Duration::from_secs(5);
/// A kubeconfig that exists but does not load is tried again this soon even without an inotify
/// event, doubling up to [`KUBECONFIG_RETRY_MAX`]: what it names (a client certificate kubelet is
/// still writing) may live in a directory the agent does not watch.
const KUBECONFIG_RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest wait between such retries.
const KUBECONFIG_RETRY_MAX: Duration = Duration::from_secs(30);
/// The drain engine's own deadline ends this much before the lock's, so its report (pods left
/// behind, the DrainTimedOut Event) is in hand before the lock must go.
const DRAIN_REPORT_SLACK: Duration = Duration::from_millis(250);
/// A failed drain attempt during a shutdown (API unreachable) is retried after this, until the
/// deadline: the API may come back while logind still waits.
const DRAIN_RETRY: Duration = Duration::from_millis(500);
/// After SIGHUP, logind reloads on its next event-loop turn and announces nothing (the property
/// is declared constant), so the cap is re-read up to this many times...
const CAP_REREAD_ATTEMPTS: u32 = 20;
/// ... this far apart (one second in all).
const CAP_REREAD_INTERVAL: Duration = Duration::from_millis(50);

/// Stands in for "never" where an instant is needed (about 30 years).
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// logind's process name (`/proc/PID/comm`).
const LOGIND_COMM: &str = "systemd-logind";

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// inotify could not watch the gate files.
    #[error(transparent)]
    Files(#[from] gwatch::Error),
    /// A Unix signal handler could not be installed.
    #[error("cannot install the {signal} handler: {source}")]
    Signal {
        /// Which signal.
        signal: &'static str,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

type WatchStream<K> = BoxStream<'static, watcher::Result<watcher::Event<K>>>;
type DrainFuture = Pin<Box<dyn Future<Output = DrainSummary> + Send>>;
type ProbeFuture = Pin<Box<dyn Future<Output = Vec<(String, HttpFact)>> + Send>>;

/// How the agent reaches the API server.
#[derive(Clone)]
pub enum ApiAccess {
    /// A client built already (kube's inference: in-cluster, `~/.kube/config`).
    Client(kube::Client),
    /// A kubeconfig file that may not exist yet (`kubeadm join` writes it after the agent
    /// started): the agent waits for it.
    Kubeconfig(PathBuf),
}

impl std::fmt::Debug for ApiAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Client(_) => f.write_str("Client"),
            Self::Kubeconfig(p) => f.debug_tuple("Kubeconfig").field(p).finish(),
        }
    }
}

/// Runs the agent for `node` until SIGTERM or SIGINT.
pub async fn run(settings: Settings, node: String, api: ApiAccess) -> Result<(), Error> {
    let (client, kubeconfig) = match api {
        ApiAccess::Client(c) => (Some(c), None),
        ApiAccess::Kubeconfig(p) => (None, Some(p)),
    };
    let mut agent = Agent::new(settings, node, client, kubeconfig);
    agent.main().await
}

/// Why there is no client yet.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KubeconfigState {
    /// The file does not exist (yet).
    Missing,
    /// It exists but cannot be loaded (half written, wrong format): waiting for it to change.
    Unloadable(String),
}

/// Logs a repeating condition once per change instead of once per retry.
#[derive(Debug, Default)]
struct Quiet {
    last: Option<String>,
}

impl Quiet {
    /// True when `text` differs from what was logged last (and remembers it).
    fn changed(&mut self, text: &str) -> bool {
        if self.last.as_deref() == Some(text) {
            return false;
        }
        self.last = Some(text.to_string());
        true
    }
    /// Forgets the condition; true when there was one.
    fn clear(&mut self) -> bool {
        self.last.take().is_some()
    }
}

struct Agent {
    settings: Settings,
    node: String,
    client: Option<kube::Client>,
    /// The kubeconfig to wait for while `client` is `None`.
    kubeconfig: Option<PathBuf>,
    kubeconfig_state: Option<KubeconfigState>,
    kubeconfig_retry_at: Option<Instant>,
    kubeconfig_backoff: Duration,
    /// The last error from the API server (watch or write), until an answer comes.
    api_error: Option<String>,
    api_log: Quiet,
    write_log: Quiet,
    reconcile_backoff: Duration,
    gates: GateSet,
    phase: Phase,
    lock: Lock,
    lock_fd: Option<OwnedFd>,
    lock_takes: u32,
    logind: Option<Logind>,
    cap: Option<Duration>,
    cap_fix_tried: bool,
    facts: Facts,
    verdict: Verdict,
    /// The own Node as the agent acts on it: the watch's copy, or the agent's own last write
    /// until the watch echoes it.
    node_obj: Option<Node>,
    node_watch: Mirror<Node>,
    node_echo_rv: Option<String>,
    pods: Mirror<Pod>,
    started: Instant,
    boot_time: Option<jiff::Timestamp>,
    overdue_reported: bool,
    own_cordon: bool,
    reconcile_retry_at: Option<Instant>,
    logind_retry_at: Option<Instant>,
    logind_backoff: Duration,
    shutdown_started: Option<(
        Instant,
        jiff::Timestamp,
        ShutdownKind,
        ShutdownPolicy,
        Duration,
    )>,
    last_drain: Option<DrainSummary>,
    warnings: Vec<String>,
    notified_ready: bool,
    last_status_line: String,
    last_written: Option<Status>,
}

impl Agent {
    fn new(
        settings: Settings,
        node: String,
        client: Option<kube::Client>,
        kubeconfig: Option<PathBuf>,
    ) -> Self {
        let gates = GateSet {
            gates: settings.gates.gates(),
            boot_deadline: settings.agent.boot_deadline,
        };
        let started = Instant::now();
        let verdict = crate::gate::evaluate(
            &Facts::default(),
            &gates,
            started.into_std(),
            started.into_std(),
        );
        Self {
            settings,
            node,
            client,
            kubeconfig,
            kubeconfig_state: None,
            kubeconfig_retry_at: None,
            kubeconfig_backoff: KUBECONFIG_RETRY_MIN,
            api_error: None,
            api_log: Quiet::default(),
            write_log: Quiet::default(),
            reconcile_backoff: RECONCILE_RETRY,
            gates,
            phase: Phase::Booting,
            lock: Lock::Unheld,
            lock_fd: None,
            lock_takes: 0,
            logind: None,
            cap: None,
            cap_fix_tried: false,
            facts: Facts::default(),
            verdict,
            node_obj: None,
            node_watch: Mirror::default(),
            node_echo_rv: None,
            pods: Mirror::default(),
            started,
            boot_time: boot_time(),
            overdue_reported: false,
            own_cordon: false,
            reconcile_retry_at: None,
            logind_retry_at: None,
            logind_backoff: LOGIND_RETRY_MIN,
            shutdown_started: None,
            last_drain: None,
            warnings: Vec::new(),
            notified_ready: false,
            last_status_line: String::new(),
            last_written: None,
        }
    }

    async fn main(&mut self) -> Result<(), Error> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut sigterm = signal(SignalKind::terminate()).map_err(|source| Error::Signal {
            signal: "SIGTERM",
            source,
        })?;
        let mut sigint = signal(SignalKind::interrupt()).map_err(|source| Error::Signal {
            signal: "SIGINT",
            source,
        })?;
        info!(node = %self.node, gates = self.gates.gates.len(), "agent starting");

        // Gate files: inotify first, then the first read, so nothing written in between is lost.
        let (file_tx, mut file_rx) = tokio::sync::mpsc::unbounded_channel();
        let paths: Vec<_> = self
            .settings
            .gates
            .file
            .iter()
            .map(|f| f.path.clone())
            .collect();
        let mut files = FileWatcher::new(paths, file_tx)?;
        self.facts.files = files.read_all();

        // The kubeconfig: watched (like a gate file) until it loads.
        let (kc_tx, mut kc_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut kc_files = match (&self.client, &self.kubeconfig) {
            (None, Some(path)) => Some(FileWatcher::new(vec![path.clone()], kc_tx)?),
            _ => None,
        };
        if self.client.is_none() {
            self.load_kubeconfig().await;
        }
        let (mut node_events, mut pod_events) = match &self.client {
            Some(c) => {
                kc_files = None;
                let (n, p) = self.watches(c);
                (Some(n), Some(p))
            }
            None => (None, None),
        };

        let mut logind_events = self.connect_logind().await;
        let ready_anyway_at = self.started + READY_WITHOUT_API_AFTER;

        let http_client = gwatch::http_client();
        let mut http_tick = tokio::time::interval(self.settings.gates.http_interval);
        http_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let probing = !self.settings.gates.http.is_empty();
        let mut probe: Option<ProbeFuture> = None;

        let watchdog = sd_notify::watchdog_enabled();
        let mut watchdog_tick = tokio::time::interval(watchdog.map_or(Duration::MAX, |d| d / 2));

        let mut drain: Option<DrainFuture> = None;
        // A deadline too far to represent (a config of years) is as good as none.
        let boot_deadline_at = self
            .started
            .checked_add(self.settings.agent.boot_deadline)
            .unwrap_or_else(|| self.started + FAR_FUTURE);
        self.publish();

        loop {
            let reconcile_at = self.reconcile_retry_at;
            let logind_at = self.logind_retry_at;
            let watch_deadline = !self.overdue_reported && self.phase.gates_act();
            let ready_pending = !self.notified_ready;
            tokio::select! {
                _ = sigterm.recv() => { info!("SIGTERM: the service is stopping (not a shutdown); releasing the lock without draining"); break; }
                _ = sigint.recv() => { info!("SIGINT: stopping; releasing the lock without draining"); break; }
                Some(()) = file_rx.recv() => {
                    while file_rx.try_recv().is_ok() {}
                    files.rearm()?;
                    self.facts.files = files.read_all();
                    self.reconcile().await;
                }
                Some(()) = kc_rx.recv(), if kc_files.is_some() => {
                    while kc_rx.try_recv().is_ok() {}
                    if let Some(w) = kc_files.as_mut() {
                        w.rearm()?;
                    }
                    self.kubeconfig_backoff = KUBECONFIG_RETRY_MIN;
                    self.load_kubeconfig().await;
                    if let Some(c) = self.client.clone() {
                        kc_files = None;
                        let (n, p) = self.watches(&c);
                        node_events = Some(n);
                        pod_events = Some(p);
                    }
                }
                _ = sleep_until_opt(self.kubeconfig_retry_at), if kc_files.is_some() => {
                    self.load_kubeconfig().await;
                    if let Some(c) = self.client.clone() {
                        kc_files = None;
                        let (n, p) = self.watches(&c);
                        node_events = Some(n);
                        pod_events = Some(p);
                    }
                }
                Some(ev) = next_or_pending(&mut node_events) => {
                    match ev {
                        Ok(ev) => {
                            self.api_answered();
                            self.apply_node(ev);
                        }
                        Err(e) => {
                            self.node_watch.abandon_relist();
                            self.api_failed("node watch", &e.to_string());
                        }
                    }
                    self.reconcile().await;
                }
                Some(ev) = next_or_pending(&mut pod_events) => {
                    match ev {
                        Ok(ev) => {
                            self.api_answered();
                            self.pods.apply(&ev);
                        }
                        Err(e) => {
                            self.pods.abandon_relist();
                            self.api_failed("pod watch", &e.to_string());
                        }
                    }
                    self.reconcile().await;
                }
                ev = next_or_pending(&mut logind_events) => match ev {
                    Some(ev) => {
                        if let Some(d) = self.on_logind(ev).await {
                            drain = Some(d);
                        }
                        if matches!(self.phase, Phase::Gated | Phase::Ready) && drain.is_some() {
                            // A cancelled shutdown: stop draining.
                            drain = None;
                        }
                    }
                    None => {
                        warn!("lost the D-Bus connection; reconnecting");
                        self.logind = None;
                        logind_events = None;
                        self.logind_retry_at = Some(Instant::now() + self.logind_backoff);
                    }
                },
                summary = async { match drain.as_mut() { Some(d) => d.await, None => std::future::pending().await } } => {
                    drain = None;
                    self.drain_ended(summary);
                }
                results = async { match probe.as_mut() { Some(p) => p.await, None => std::future::pending().await } } => {
                    probe = None;
                    self.facts.http = results.into_iter().collect();
                    self.reconcile().await;
                }
                _ = http_tick.tick(), if probing && probe.is_none() => {
                    let client = http_client.clone();
                    let timeout = self.settings.gates.http_timeout;
                    let urls: Vec<hyper::Uri> = self.settings.gates.http.iter().map(|h| h.url.clone()).collect();
                    probe = Some(Box::pin(async move {
                        let mut out = Vec::new();
                        for u in urls {
                            let fact = gwatch::probe(&client, &u, timeout).await;
                            out.push((u.to_string(), fact));
                        }
                        out
                    }));
                }
                _ = sleep_until_opt(reconcile_at) => {
                    self.reconcile_retry_at = None;
                    self.reconcile().await;
                }
                _ = sleep_until_opt(logind_at) => {
                    self.logind_retry_at = None;
                    if self.logind.is_none() {
                        logind_events = self.connect_logind().await;
                    } else if self.wants_lock() && self.lock != Lock::Held {
                        self.take_lock().await;
                    }
                }
                _ = tokio::time::sleep_until(boot_deadline_at), if watch_deadline => {
                    self.reconcile().await;
                }
                _ = watchdog_tick.tick(), if watchdog.is_some() => notify(&[sd_notify::NotifyState::Watchdog]),
                // Only to wake up publish(), which decides READY.
                _ = tokio::time::sleep_until(ready_anyway_at), if ready_pending => {}
            }
            self.publish();
        }
        notify(&[sd_notify::NotifyState::Stopping]);
        if self.lock_fd.take().is_some() {
            self.lock_to(LockEvent::Dropped);
        }
        self.publish();
        info!(node = %self.node, "agent stopped; lock closed");
        Ok(())
    }

    /// The Node and pod watches, with kube's backoff between failed attempts. `Init` (emitted
    /// before every list attempt, answered or not) is dropped before the backoff: it is an `Ok`,
    /// which resets the backoff, so an unreachable API server would be retried about once a
    /// second forever. Without it, a relist starts with its first `InitApply`, and
    /// an error drops a relist it cut short.
    fn watches(&self, client: &kube::Client) -> (WatchStream<Node>, WatchStream<Pod>) {
        (
            own_watch(client, &format!("metadata.name={}", self.node)),
            own_watch(client, &format!("spec.nodeName={}", self.node)),
        )
    }

    /// Tries to build the client from the kubeconfig; logs only what changed.
    async fn load_kubeconfig(&mut self) {
        let Some(path) = self.kubeconfig.clone() else {
            return;
        };
        let state = if path.exists() {
            match crate::kube_client::client(Some(&path)).await {
                Ok(c) => {
                    info!(kubeconfig = %path.display(), "kubeconfig loaded; watching the Node");
                    self.client = Some(c);
                    self.kubeconfig_state = None;
                    self.kubeconfig_retry_at = None;
                    return;
                }
                Err(e) => {
                    self.kubeconfig_retry_at = Some(Instant::now() + self.kubeconfig_backoff);
                    self.kubeconfig_backoff =
                        (self.kubeconfig_backoff * 2).min(KUBECONFIG_RETRY_MAX);
                    KubeconfigState::Unloadable(e.to_string())
                }
            }
        } else {
            self.kubeconfig_retry_at = None;
            KubeconfigState::Missing
        };
        if self.kubeconfig_state.as_ref() != Some(&state) {
            match &state {
                KubeconfigState::Missing => {
                    info!(kubeconfig = %path.display(), "waiting for the kubeconfig (kubeadm join writes it)");
                }
                KubeconfigState::Unloadable(e) => {
                    warn!(kubeconfig = %path.display(), error = %e, "cannot load the kubeconfig; waiting for it to change");
                }
            }
            self.kubeconfig_state = Some(state);
        }
    }

    /// A watch failed: remembered for STATUS, logged when it differs from the last failure.
    fn api_failed(&mut self, what: &str, error: &str) {
        if self.api_log.changed(error) {
            warn!(node = %self.node, error = %error, "{what} failed; retrying with backoff (logged again only when the error changes)");
        }
        self.api_error = Some(error.to_string());
    }

    /// An answer from the API server.
    fn api_answered(&mut self) {
        self.api_error = None;
        if self.api_log.clear() {
            info!(node = %self.node, "API server answering again");
        }
    }

    /// A write to the Node failed: retry later, with backoff, logging only a changed error.
    fn write_failed(&mut self, what: &str, error: &str) {
        if self.write_log.changed(error) {
            warn!(node = %self.node, error = %error, retry_in = ?self.reconcile_backoff, "{what}; retrying with backoff (logged again only when the error changes)");
        }
        self.reconcile_retry_at = Some(Instant::now() + self.reconcile_backoff);
        self.reconcile_backoff = (self.reconcile_backoff * 2).min(RECONCILE_RETRY_MAX);
    }

    fn apply_node(&mut self, ev: watcher::Event<Node>) {
        self.node_watch.apply(&ev);
        match &ev {
            watcher::Event::Apply(n) => {
                // Until the echo of the agent's own last write arrives, the watch only replays
                // versions older than the one the agent already holds.
                if let Some(rv) = &self.node_echo_rv
                    && n.metadata.resource_version.as_ref() != Some(rv)
                {
                    return;
                }
            }
            watcher::Event::Delete(_) | watcher::Event::InitDone => {}
            // A relist in progress changes nothing until it is done.
            watcher::Event::Init | watcher::Event::InitApply(_) => return,
        }
        self.node_echo_rv = None;
        self.node_obj = self
            .node_watch
            .get(&self.node, None)
            .map(std::sync::Arc::unwrap_or_clone);
    }

    /// The lock is wanted unless a shutdown is under way.
    fn wants_lock(&self) -> bool {
        !matches!(self.phase, Phase::Draining | Phase::Drained)
    }

    fn phase_to(&mut self, ev: PhaseEvent) -> bool {
        match self.phase.on(ev) {
            Ok(p) => {
                info!(node = %self.node, from = ?self.phase, to = ?p, event = ?ev, "phase");
                self.phase = p;
                true
            }
            Err(r) => {
                warn!(node = %self.node, refused = %r, "transition refused");
                false
            }
        }
    }

    fn lock_to(&mut self, ev: LockEvent) {
        match self.lock.on(ev) {
            Ok(l) => self.lock = l,
            Err(r) => warn!(refused = %r, "lock transition refused"),
        }
    }

    async fn connect_logind(&mut self) -> Option<BoxStream<'static, LogindEvent>> {
        let conn = match Logind::connect().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, retry_in = ?self.logind_backoff, "cannot reach the system bus");
                self.schedule_logind_retry();
                return None;
            }
        };
        // Subscribe before taking the lock, so a shutdown announced in between is seen.
        let events = match conn.events().await {
            Ok(ev) => ev,
            Err(e) => {
                warn!(error = %e, "cannot subscribe to logind's signals");
                self.schedule_logind_retry();
                return None;
            }
        };
        self.logind = Some(conn);
        self.logind_backoff = LOGIND_RETRY_MIN;
        if self.wants_lock() {
            self.take_lock().await;
        }
        Some(events)
    }

    fn schedule_logind_retry(&mut self) {
        self.logind_retry_at = Some(Instant::now() + self.logind_backoff);
        self.logind_backoff = (self.logind_backoff * 2).min(LOGIND_RETRY_MAX);
    }

    /// Takes a new lock; an already held one is closed only after the new one is in hand, so
    /// there is never a moment without a lock and never two left behind (logind keeps locks
    /// across its own restart).
    async fn take_lock(&mut self) {
        let Some(l) = self.logind.clone() else {
            return;
        };
        match l.take_lock().await {
            Ok(fd) => {
                let ev = if self.lock == Lock::Held {
                    LockEvent::Replaced
                } else {
                    LockEvent::Taken
                };
                drop(self.lock_fd.replace(fd));
                self.lock_to(ev);
                self.lock_takes += 1;
                self.logind_backoff = LOGIND_RETRY_MIN;
                info!(who = logind::WHO, event = ?ev, "shutdown delay lock held");
                self.check_logind(&l).await;
            }
            Err(e) if e.is_logind_absent() => {
                warn!(error = %e, "logind is not on the bus; waiting for it to appear");
            }
            Err(e) if e.is_operation_in_progress() => {
                // logind refuses new delay locks while a shutdown job is pending; it may still
                // be cancelled, so keep trying.
                warn!(error = %e, retry_in = ?self.logind_backoff, "a shutdown is in progress; logind refuses new locks until it is cancelled");
                self.schedule_logind_retry();
            }
            Err(e) => {
                warn!(error = %e, retry_in = ?self.logind_backoff, "cannot take the shutdown delay lock");
                self.schedule_logind_retry();
            }
        }
    }

    /// Reads logind's cap (raising it once if too short) and warns about kubelet's locks.
    async fn check_logind(&mut self, l: &Logind) {
        let s = &self.settings;
        let (timeout, margin) = (s.drain.timeout, s.shutdown.safety_margin);
        let mut warnings = Vec::new();
        match l.inhibit_delay_max().await {
            Ok(cap) => {
                self.cap = Some(cap);
                if logind::cap_too_short(cap, timeout, margin) && !self.cap_fix_tried {
                    self.cap_fix_tried = true;
                    self.cap = Some(self.raise_cap(l, cap).await);
                }
            }
            Err(e) => warn!(error = %e, "cannot read logind's InhibitDelayMaxUSec"),
        }
        if let Some(cap) = self.cap
            && logind::cap_too_short(cap, timeout, margin)
        {
            let w = format!(
                "logind's InhibitDelayMaxSec is {cap:?}, below drain.timeout {timeout:?} + shutdown.safety_margin {margin:?}: shutdown drains get only {:?}",
                logind::drain_deadline(cap, margin, timeout)
            );
            error!(cap = ?cap, "{w}");
            warnings.push(w);
        }
        match l.list_inhibitors().await {
            Ok(list) => {
                for k in logind::kubelet_locks(&list) {
                    let w = format!(
                        "kubelet holds a shutdown delay lock (who {:?}, pid {}): its graceful node shutdown kills pods without the Eviction API and races with nodeward's drain; set shutdownGracePeriod: 0s in the kubelet config",
                        k.who, k.pid
                    );
                    warn!(pid = k.pid, "{w}");
                    warnings.push(w);
                }
            }
            Err(e) => warn!(error = %e, "cannot list logind's inhibitors"),
        }
        self.warnings = warnings;
    }

    /// Writes the drop-in, SIGHUPs logind and re-reads the cap; returns the cap seen last.
    async fn raise_cap(&self, l: &Logind, cap: Duration) -> Duration {
        let s = &self.settings.shutdown;
        let want = logind::wanted_cap(s, self.settings.drain.timeout);
        let path = &s.logind_dropin;
        warn!(cap = ?cap, want = ?want, dropin = %path.display(), "logind's InhibitDelayMaxSec is too short for the drain; raising it");
        if let Some(dir) = path.parent()
            && !dir.exists()
        {
            // Like /etc/systemd itself: logind.conf.d holds no secrets, and 0755 is what every
            // tool expects (the unit's UMask=0077 would make it 0700).
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir);
            let _ =
                std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755));
        }
        if let Err(e) =
            crate::fsutil::write_private_atomic(path, logind::dropin_text(want).as_bytes())
        {
            error!(error = %e, "cannot write the logind drop-in");
            return cap;
        }
        // logind reads its config as root; 0644 like every other file in logind.conf.d.
        let _ = std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o644));
        let pid = match l.logind_pid().await {
            Ok(p) => p,
            Err(e) => {
                error!(error = %e, "cannot find logind's pid to make it reload");
                return cap;
            }
        };
        let Ok(pid_i) = i32::try_from(pid) else {
            return cap;
        };
        // SIGHUP makes logind reload but kills most other programs: signal only a process that
        // is logind, whatever owns its bus name.
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != LOGIND_COMM {
            error!(pid, comm = %comm.trim(), "the owner of org.freedesktop.login1 is not systemd-logind; not sending SIGHUP");
            return cap;
        }
        if let Err(e) = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid_i),
            nix::sys::signal::Signal::SIGHUP,
        ) {
            error!(pid, error = %e, "cannot send SIGHUP to logind");
            return cap;
        }
        let mut seen = cap;
        for _ in 0..CAP_REREAD_ATTEMPTS {
            tokio::time::sleep(CAP_REREAD_INTERVAL).await;
            if let Ok(c) = l.inhibit_delay_max().await {
                seen = c;
                if c >= want {
                    info!(cap = ?c, "logind's InhibitDelayMaxSec raised");
                    break;
                }
            }
        }
        seen
    }

    async fn on_logind(&mut self, ev: LogindEvent) -> Option<DrainFuture> {
        match ev {
            LogindEvent::LogindVanished => {
                warn!(
                    "logind left the bus; its locks survive a restart, re-taking ours when it is back"
                );
                None
            }
            LogindEvent::LogindAppeared => {
                info!("logind is on the bus");
                if self.wants_lock() {
                    self.take_lock().await;
                }
                None
            }
            LogindEvent::PrepareForShutdown { start: true, kind } => {
                if !self.wants_lock() {
                    // The second of the two signals systemd 255+ sends for one shutdown.
                    return None;
                }
                let kind = match (kind, &self.logind) {
                    (Some(k), _) => k,
                    (None, Some(l)) => l.preparing_kind().await,
                    (None, None) => ShutdownKind::Unknown,
                };
                self.start_shutdown(kind)
            }
            LogindEvent::PrepareForShutdown { start: false, .. } => {
                if self.wants_lock() {
                    return None;
                }
                info!(node = %self.node, "shutdown cancelled; taking the lock again");
                self.phase_to(PhaseEvent::ShutdownCancelled);
                self.shutdown_started = None;
                if self.lock != Lock::Held {
                    self.take_lock().await;
                }
                self.reconcile().await;
                None
            }
        }
    }

    fn start_shutdown(&mut self, kind: ShutdownKind) -> Option<DrainFuture> {
        let s = self.settings.clone();
        let policy = logind::policy_for(kind, &s.shutdown);
        let cap = self.cap.unwrap_or(s.drain.timeout);
        let deadline = logind::drain_deadline(cap, s.shutdown.safety_margin, s.drain.timeout);
        info!(node = %self.node, ?kind, ?policy, ?deadline, "shutdown announced");
        if !self.phase_to(PhaseEvent::ShutdownStarted) {
            return None;
        }
        self.own_cordon = policy != ShutdownPolicy::Nothing;
        let now = Instant::now();
        self.shutdown_started = Some((now, jiff::Timestamp::now(), kind, policy, deadline));
        let reason = format!("shutdown ({kind:?})").to_lowercase();
        let Some(client) = self.client.clone() else {
            return Some(Box::pin(
                async move { outcome(ShutdownOutcome::NoKubeconfig) },
            ));
        };
        let node = self.node.clone();
        let exclude_lb = s.drain.exclude_from_load_balancers;
        let mut opts = crate::drain::DrainOptions::from_settings(&s.drain, reason.clone());
        opts.shutdown = true;
        let until = now + deadline;
        Some(match policy {
            ShutdownPolicy::Nothing => {
                Box::pin(async move { outcome(ShutdownOutcome::NothingToDo) })
            }
            ShutdownPolicy::Cordon => Box::pin(async move {
                retry_until(&node, until, "cordon", |_| {
                    crate::drain::cordon_for_shutdown(&client, &node, &reason, exclude_lb)
                })
                .await
                .map_or_else(outcome, |_| outcome(ShutdownOutcome::Cordoned))
            }),
            ShutdownPolicy::Drain => Box::pin(async move {
                retry_until(&node, until, "drain", |left| {
                    let mut o = opts.clone();
                    o.timeout = if left > DRAIN_REPORT_SLACK * 2 {
                        left - DRAIN_REPORT_SLACK
                    } else {
                        left
                    };
                    let client = client.clone();
                    let node = node.clone();
                    async move { crate::drain::drain(&client, &node, &o).await }
                })
                .await
                .map_or_else(outcome, |r| report_summary(&r))
            }),
        })
    }

    fn drain_ended(&mut self, mut summary: DrainSummary) {
        // Closing the fd is what lets logind go on.
        drop(self.lock_fd.take());
        if self.lock == Lock::Held {
            self.lock_to(LockEvent::ReleasedForShutdown);
        }
        if let Some((t0, at, kind, policy, deadline)) = self.shutdown_started.take() {
            summary.started_at = at.to_string();
            summary.kind = kind;
            summary.policy = policy;
            summary.deadline_ms = millis(deadline);
            summary.elapsed_ms = millis(t0.elapsed());
        }
        info!(
            node = %self.node,
            outcome = %summary.outcome,
            evicted = summary.evicted,
            left_behind = summary.left_behind.len(),
            elapsed_ms = summary.elapsed_ms,
            "shutdown drain ended; lock released"
        );
        self.phase_to(PhaseEvent::DrainEnded);
        self.last_drain = Some(summary);
    }

    fn view(&self) -> View {
        let n = self.node_obj.as_ref();
        View {
            phase: self.phase,
            node_exists: n.is_some(),
            gates_pass: self.verdict.all_pass,
            overdue: self.verdict.overdue,
            overdue_reported: self.overdue_reported,
            has_startup_taint: n.is_some_and(readiness::has_startup_taint),
            cordon: n.map_or(state::CordonView::NotCordoned, |n| {
                node::cordon_view(n, self.boot_time, self.own_cordon)
            }),
            retaint: self.settings.agent.retaint_on_gate_failure,
            condition_current: n.is_some_and(|n| {
                readiness::condition_is_current(n, &readiness::desired_condition(&self.verdict))
            }),
            verdict_known: self
                .verdict
                .gates
                .iter()
                .all(|g| g.state != crate::gate::GateState::Unknown),
            untaint_self: self.settings.agent.startup_taint == TaintOwner::Agent,
        }
    }

    /// Re-evaluates the gates and acts on the Node; stops at the first failed write and tries
    /// again after [`RECONCILE_RETRY`].
    async fn reconcile(&mut self) {
        self.facts.node_conditions = if self.node_watch.synced() {
            self.node_obj.as_ref().map(gwatch::node_conditions)
        } else {
            None
        };
        self.facts.pods = self.pods.synced().then(|| {
            self.pods
                .state()
                .iter()
                .map(|p| gwatch::pod_fact(p))
                .collect()
        });
        let now = Instant::now();
        let verdict = crate::gate::evaluate(
            &self.facts,
            &self.gates,
            self.started.into_std(),
            now.into_std(),
        );
        if verdict.gates != self.verdict.gates {
            for g in &verdict.gates {
                tracing::debug!(gate = %g.gate, state = ?g.state, reason = %g.reason, "gate");
            }
        }
        self.verdict = verdict;
        let Some(client) = self.client.clone() else {
            return;
        };
        if !self.node_watch.synced() {
            return;
        }
        for action in state::reconcile(&self.view()) {
            let mut failed: Option<(&str, String)> = None;
            let ok = match action {
                Action::Transition(ev) => self.phase_to(ev),
                Action::WriteCondition => {
                    let want = readiness::desired_condition(&self.verdict);
                    match readiness::write_condition(
                        &client,
                        &self.node,
                        self.node_obj.as_ref(),
                        &want,
                    )
                    .await
                    {
                        Ok(n) => {
                            self.node_echo_rv = n.metadata.resource_version.clone();
                            self.node_obj = Some(n);
                            true
                        }
                        Err(e) => {
                            failed = Some(("cannot report readiness", e.to_string()));
                            false
                        }
                    }
                }
                Action::RemoveStartupTaint | Action::AddStartupTaint => {
                    let add = action == Action::AddStartupTaint;
                    if add {
                        warn!(node = %self.node, failing = ?self.verdict.failing(), "a gate failed; putting the startup taint back");
                    }
                    match readiness::set_startup_taint(&client, &self.node, add, None).await {
                        Ok((n, written)) => {
                            // Fresher than the watch, which may still deliver older versions.
                            if written {
                                self.node_echo_rv = n.metadata.resource_version.clone();
                            }
                            self.node_obj = Some(n);
                            true
                        }
                        Err(e) => {
                            failed = Some(("cannot change the startup taint", e.to_string()));
                            false
                        }
                    }
                }
                Action::Uncordon => {
                    match crate::drain::uncordon(&client, &self.node, false).await {
                        Ok(o) => {
                            info!(node = %self.node, outcome = ?o, "gates pass: nodeward's cordon lifted");
                            self.own_cordon = false;
                            true
                        }
                        Err(crate::drain::exec::Error::CordonedByOther { who, .. }) => {
                            info!(node = %self.node, by = ?who, "cordoned by someone else; leaving it");
                            true
                        }
                        Err(e) => {
                            failed = Some(("cannot uncordon", e.to_string()));
                            false
                        }
                    }
                }
                Action::ReportNotReadyInTime => {
                    let failing = self.verdict.failing().join("; ");
                    error!(node = %self.node, boot_deadline = ?self.settings.agent.boot_deadline, failing = %failing, "NodeNotReadyInTime: the readiness gates did not pass in time");
                    node::event(
                        &client,
                        &self.node,
                        true,
                        "NodeNotReadyInTime",
                        format!(
                            "readiness gates not passing {:?} after the agent started: {failing}",
                            self.settings.agent.boot_deadline
                        ),
                    )
                    .await;
                    self.overdue_reported = true;
                    true
                }
            };
            if !ok {
                let (what, error) = failed.unwrap_or(("a transition was refused", String::new()));
                self.write_failed(what, &error);
                return;
            }
        }
        self.reconcile_backoff = RECONCILE_RETRY;
        if self.write_log.clear() {
            info!(node = %self.node, "writes to the Node succeed again");
        }
    }

    fn waiting_for(&self) -> String {
        let lock = if self.lock == Lock::Held {
            "holding the shutdown lock"
        } else {
            "waiting for logind to take the shutdown lock"
        };
        let kubeconfig = self
            .kubeconfig
            .as_deref()
            .map_or_else(|| "the kubeconfig".into(), |p| p.display().to_string());
        match self.phase {
            Phase::Draining => return "draining the node before shutdown".into(),
            Phase::Drained => {
                return "drained; shutdown lock released, waiting for the shutdown".into();
            }
            _ => {}
        }
        let what = match (&self.kubeconfig_state, &self.api_error) {
            (Some(KubeconfigState::Missing), _) => {
                format!("waiting for {kubeconfig} (kubeadm join writes it)")
            }
            (Some(KubeconfigState::Unloadable(e)), _) => {
                format!("cannot load {kubeconfig}: {e}; waiting for it to change")
            }
            (None, Some(e)) => format!("API server unreachable: {e}"),
            (None, None) => match self.phase {
                Phase::Booting => format!("waiting for node {} to register", self.node),
                Phase::Gated => {
                    format!("waiting for gates: {}", self.verdict.failing().join("; "))
                }
                _ => match self.node_obj.as_ref().and_then(node::cordon_owner) {
                    Some(who) => format!("gates pass; node cordoned by {who}"),
                    None => "node schedulable".into(),
                },
            },
        };
        format!("{what}; {lock}")
    }

    /// Sends READY/STATUS to systemd and rewrites the status file when something changed.
    fn publish(&mut self) {
        let watches_up = self.node_watch.synced() && self.pods.synced();
        if !self.notified_ready
            && self.lock == Lock::Held
            && (watches_up
                || self.client.is_none()
                || self.api_error.is_some()
                || self.started.elapsed() >= READY_WITHOUT_API_AFTER)
        {
            self.notified_ready = true;
            if watches_up {
                info!(node = %self.node, "lock held and watches up; ready");
            } else {
                info!(node = %self.node, status = %self.waiting_for(), "lock held; ready without the API server");
            }
            notify(&[sd_notify::NotifyState::Ready]);
        }
        let line = self.waiting_for();
        if line != self.last_status_line {
            notify(&[sd_notify::NotifyState::Status(&line)]);
            self.last_status_line = line.clone();
        }
        let n = self.node_obj.as_ref();
        let status = Status {
            pid: std::process::id(),
            node: self.node.clone(),
            phase: self.phase,
            lock: self.lock,
            lock_takes: self.lock_takes,
            inhibit_delay_max_ms: self.cap.map(millis),
            waiting_for: line,
            ready: self.notified_ready,
            node_registered: n.is_some(),
            gates: self.verdict.gates.clone(),
            not_ready_in_time: self.overdue_reported,
            startup_taint: n.is_some_and(readiness::has_startup_taint),
            cordoned_by: n.and_then(node::cordon_owner),
            last_drain: self.last_drain.clone(),
            warnings: self.warnings.clone(),
        };
        if self.last_written.as_ref() != Some(&status) {
            if let Err(e) = status::write(&self.settings.agent.status_file, &status) {
                warn!(error = %e, "cannot write the status file");
            }
            self.last_written = Some(status);
        }
    }
}

fn outcome(outcome: ShutdownOutcome) -> DrainSummary {
    DrainSummary {
        started_at: String::new(),
        kind: ShutdownKind::Unknown,
        policy: ShutdownPolicy::Drain,
        deadline_ms: 0,
        outcome,
        evicted: 0,
        left_behind: Vec::new(),
        refused: Vec::new(),
        elapsed_ms: 0,
    }
}

fn report_summary(r: &crate::drain::DrainReport) -> DrainSummary {
    DrainSummary {
        evicted: r.evicted.len(),
        left_behind: r.left_behind.iter().map(ToString::to_string).collect(),
        refused: r.refused.iter().map(|(p, _)| p.to_string()).collect(),
        ..outcome(r.outcome.into())
    }
}

/// Runs `attempt` (given the time left) until it succeeds or `until`, retrying only errors that
/// trying again can fix ([`crate::drain::exec::Error::is_retryable`]) every [`DRAIN_RETRY`]. A
/// node that does not exist is [`ShutdownOutcome::NotRegistered`], not a failure.
async fn retry_until<T, F, Fut>(
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
            Ok(Err(e)) => {
                warn!(node, error = %e, "{what} failed; trying again would not help");
                return Err(ShutdownOutcome::Failed(e.to_string()));
            }
            Err(_) => return Err(ShutdownOutcome::DeadlineExceeded(last_error)),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Sends a notification to systemd; a failure is logged, never fatal (and without
/// `NOTIFY_SOCKET` it does nothing).
fn notify(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        warn!(error = %e, "cannot notify systemd");
    }
}

/// Keeps every watch item but `Init` (see [`Agent::watches`]).
/// A cluster-wide watch of `K` narrowed by `fields`, without `Init` (see `Agent::watches`), with
/// kube's backoff.
fn own_watch<K>(client: &kube::Client, fields: &str) -> WatchStream<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    watcher(
        Api::<K>::all(client.clone()),
        watcher::Config::default().fields(fields),
    )
    .filter(not_init)
    .default_backoff()
    .boxed()
}

fn not_init<K>(ev: &watcher::Result<watcher::Event<K>>) -> std::future::Ready<bool> {
    std::future::ready(!matches!(ev, Ok(watcher::Event::Init)))
}

async fn next_or_pending<T>(s: &mut Option<BoxStream<'static, T>>) -> Option<T> {
    match s {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// This boot's start: the wall clock now minus the time since boot (`CLOCK_BOOTTIME`, which
/// counts suspended time too). A syscall rather than /proc/stat, which the hardened unit hides
/// (`ProcSubset=pid`).
fn boot_time() -> Option<jiff::Timestamp> {
    use nix::time::{ClockId, clock_gettime};
    let since_boot = clock_gettime(ClockId::CLOCK_BOOTTIME).ok()?;
    let up = jiff::SignedDuration::new(
        since_boot.tv_sec(),
        i32::try_from(since_boot.tv_nsec()).ok()?,
    );
    jiff::Timestamp::now().checked_sub(up).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn boot_time_is_in_the_past_and_agrees_with_proc_stat() {
        let boot = super::boot_time().expect("CLOCK_BOOTTIME");
        assert!(boot < jiff::Timestamp::now());
        let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
        let btime: i64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
            .expect("btime");
        assert!(
            (boot.as_second() - btime).abs() <= 2,
            "{boot} vs btime {btime}"
        );
    }
}
