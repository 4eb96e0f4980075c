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
//! The agent's state comes in two kinds of part:
//!
//! - what it *knows* (`Known`): the phase, the lock's state, the facts, the gates' verdict, the
//!   Node as last seen. Plain data: what to do is decided from it and the time by the pure
//!   [`state`] machine, [`crate::gate::evaluate`] and `Known`'s methods (`known.rs`).
//! - its *links* to the outside, each holding its handle and its retries: `ApiLink` (the client,
//!   or the kubeconfig awaited; `api.rs`), `LogindLink` (the bus and the lock's fd; `lock.rs`)
//!   and `Report` (systemd's STATUS=, the status file, the metrics).
//!
//! This file, `event_loop.rs` and `shutdown.rs` only gather facts into `Known` and act through
//! the links.

mod api;
mod backoff;
mod boot;
mod event_loop;
mod known;
mod lock;
pub mod metrics;
pub mod node;
mod shutdown;
pub mod state;
pub mod status;
mod streams;

use boot::*;
use streams::*;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
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
use crate::drain::access::{self, Access};
use crate::gate::watch::{self as gwatch};
use crate::gate::{Facts, GateSet, HttpFact, Verdict};
use crate::logind::{self, Logind, LogindEvent, ShutdownKind};
use crate::readiness;
use crate::store::Mirror;
use crate::systemd::notify;
use backoff::Backoff;
use state::{Action, Lock, LockEvent, Phase, PhaseEvent, View};
use status::{DrainSummary, ShutdownOutcome, Status};

/// How long each of the agent's Kubernetes requests may wait for its answer to begin. Its event
/// loop both makes requests (the readiness condition, the cordon) and answers logind; a request
/// under way when PrepareForShutdown arrives delays the drain by at most this. The agent's
/// requests are small (one Node, one eviction), so a third of the general deadline.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// How long the agent's loop may go on after SIGTERM or SIGINT before it is dropped where it
/// stands: the loop breaks at once unless a handler waits for the API server, and systemd's
/// shutdown must not wait for that ([`REQUEST_DEADLINE`], more than once in a reconcile).
pub const STOP_GRACE: Duration = Duration::from_secs(2);

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
/// The drain engine's budget when `left` remains before the lock must go: (its timeout, its
/// ending). The engine runs its loop for the timeout, then its ending (surge replicas given back,
/// the end Event and Draining condition); both, and the report's slack, fit in `left`.
/// A short deadline gives the ending a quarter of it: the give-back and the announcement are
/// cut short rather than the drain itself.
fn drain_budget(left: Duration) -> (Duration, Duration) {
    let ending = crate::drain::exec::ENDING.min(left / 4);
    let engine = left - ending;
    let timeout = if engine > DRAIN_REPORT_SLACK * 2 {
        engine - DRAIN_REPORT_SLACK
    } else {
        engine
    };
    (timeout, ending)
}

/// How long a cancelled shutdown's drain may take to stop and say so: its ending, at most
/// [`crate::drain::exec::ENDING`], and a second for a step in flight.
const CANCELLED_DRAIN_WAIT: Duration =
    crate::drain::exec::ENDING.saturating_add(Duration::from_secs(1));
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
type AccessFuture = Pin<Box<dyn Future<Output = Result<Access, String>> + Send>>;

/// How long the drain-access check may take, and how soon it is asked again after it failed or
/// found a permission missing (an operator applying the RBAC is seen within this).
const ACCESS_CHECK_TIMEOUT: Duration = Duration::from_secs(10);
const ACCESS_RECHECK: Duration = Duration::from_secs(30);

/// How often logind's locks are listed for kubelet's (logind signals no change of them; kubelet
/// takes its lock when it starts, after the agent, and again on every restart).
const KUBELET_LOCK_RECHECK: Duration = Duration::from_secs(10);

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
    let metrics_address = settings.agent.metrics_address;
    let reboot = settings
        .reboot
        .enabled
        .then(|| (settings.clone(), client.clone(), kubeconfig.clone()));
    let mut agent = Agent::new(settings, node.clone(), client, kubeconfig);
    // On its own connection: a monitor can send nothing, and the agent's bus must.
    let (calls, called) = tokio::sync::watch::channel(None);
    let _monitor = crate::task::AbortOnDrop(tokio::spawn(logind::monitor::run(calls)));
    agent.logind.called = called;
    // Coordinated reboots run beside the agent's own loop, on their own client and passes: a
    // slow drain before a reboot never delays the answer to logind.
    let _reboot = reboot.map(|(settings, client, kubeconfig)| {
        let parts = crate::reboot::run::Parts {
            kubeconfig,
            client,
            metrics: agent.report.metrics.reboot.clone(),
            drain_metrics: agent.report.metrics.drain.clone(),
            gates_passing: agent.report.metrics.gates_passing.clone(),
            status_file: crate::reboot::status::path_beside(&settings.agent.status_file),
        };
        let coordinator = crate::reboot::run::Coordinator::new(&settings, node, parts);
        crate::task::AbortOnDrop(tokio::spawn(coordinator.run()))
    });
    // A metrics endpoint that cannot listen is logged; the agent's work goes on without it.
    let _metrics = match metrics_address {
        Some(addr) => match crate::metrics_http::serve(addr, agent.report.metrics.clone()).await {
            Ok((_, task)) => Some(crate::task::AbortOnDrop(task)),
            Err(e) => {
                error!(address = %addr, error = %e, "cannot serve metrics (agent.metrics_address)");
                None
            }
        },
        None => None,
    };
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

/// Logs a repeating condition once per distinct error instead of once per retry. Two watches
/// failing against one flaky connection alternate between errors ("SendRequest", "Canceled"):
/// remembering only the last one would log every retry again.
#[derive(Debug, Default)]
struct Quiet {
    seen: Vec<String>,
}

/// Distinct errors remembered until the next success; past this, the oldest is forgotten.
const QUIET_MEMORY: usize = 8;

impl Quiet {
    /// True when `text` was not logged since the last success (and remembers it).
    fn changed(&mut self, text: &str) -> bool {
        if self.seen.iter().any(|s| s == text) {
            return false;
        }
        if self.seen.len() == QUIET_MEMORY {
            self.seen.remove(0);
        }
        self.seen.push(text.to_string());
        true
    }
    /// Forgets the condition; true when there was one.
    fn clear(&mut self) -> bool {
        let had = !self.seen.is_empty();
        self.seen.clear();
        had
    }
}

/// The agent: its settings and Node, what it knows, and its links to the outside. The event
/// loop's handlers (`event_loop.rs`) put what the links deliver into `known`; the decisions are
/// read off `known` (`known.rs`, [`state::reconcile`]); acting on them goes through the links.
struct Agent {
    settings: Settings,
    /// The own Node's name.
    node: String,
    /// What the agent knows and decides on: plain data, no handle on anything outside.
    known: Known,
    /// The API server: the client, or the kubeconfig to wait for, and how its calls fare.
    api: ApiLink,
    /// logind: the bus connection and the lock's fd.
    logind: LogindLink,
    /// What the agent tells the operator: systemd's STATUS=, the status file, the metrics.
    report: Report,
}

/// What the agent knows: the facts gathered so far and what it made of them. Plain data, with
/// no handle on the API server, the bus or a file, so every decision on it is a function of it
/// and `now` ([`Known::view`], [`Known::waiting_for`], [`Known::ready_due`], ...).
struct Known {
    /// The gates to decide and the boot deadline, from the settings.
    gates: GateSet,
    /// Where the node is in its life.
    phase: Phase,
    /// The shutdown delay lock, as its state machine has it (its fd is
    /// [`LogindLink::lock_fd`]).
    lock: Lock,
    /// How many times the lock was taken: more than once after logind or the bus restarted.
    lock_takes: u32,
    /// logind's cap on a delay lock as last read: a shutdown drain's deadline is cut to fit it.
    cap: Option<Duration>,
    /// What the gates are decided on: files, the Node's conditions, pods, probes, the drain's
    /// access, kubelet's locks.
    facts: Facts,
    /// The gates' verdict on `facts` at the last evaluation.
    verdict: Verdict,
    /// The own Node as the agent acts on it: the watch's copy, or the agent's own last write
    /// until the watch echoes it.
    node_obj: Option<Node>,
    /// The watch's copy of the own Node, and whether it has listed.
    node_watch: Mirror<Node>,
    /// The resourceVersion of the agent's own last write until the watch delivers it; what the
    /// watch delivers before it is older than `node_obj`.
    node_echo_rv: Option<String>,
    /// The pods on this node, for the pod gates.
    pods: Mirror<Pod>,
    /// When the agent started: the boot deadline and the wait for READY count from here.
    started: Instant,
    /// `NodeNotReadyInTime` was reported: it is said once per run.
    overdue_reported: bool,
    /// Where on `CLOCK_BOOTTIME` this userspace started (zero until systemd says, and where
    /// it cannot): after a soft-reboot, later than the kernel's boot ([`boot_time`]).
    userspace_since_boot: Duration,
    /// This agent's own write cordoned the Node for a shutdown: if the shutdown is cancelled, a
    /// cordon to lift once the gates pass. Not so when the shutdown found the Node cordoned
    /// already (an operator's `nodeward drain` or `nodeward cordon`, a scale-down): that cordon
    /// stays.
    own_cordon: bool,
    /// The shutdown under way, for its drain's summary.
    shutdown_started: Option<ShutdownStart>,
    /// How the last shutdown drain went.
    last_drain: Option<DrainSummary>,
    /// What an operator should fix about logind's cap, as last read.
    warnings: Vec<String>,
    /// READY=1 was sent to systemd.
    notified_ready: bool,
}

/// A shutdown as logind announced it and the agent decided it, for its drain's summary.
struct ShutdownStart {
    /// When it was announced (the time to the lock's release counts from here)...
    at: Instant,
    /// ... and the same on the wall clock, for the status.
    at_wall: jiff::Timestamp,
    /// Power-off, reboot, ...
    kind: ShutdownKind,
    /// What `[shutdown]` says to do for that kind.
    policy: ShutdownPolicy,
    /// How long the drain may take (logind's cap less the safety margin, at most
    /// `drain.timeout`).
    deadline: Duration,
}

/// The agent's link to the API server: the client once there is one, and what its calls met,
/// kept to retry with backoff, to log each distinct error once, and to say what the agent waits
/// for.
struct ApiLink {
    /// `None` until the kubeconfig loads.
    client: Option<kube::Client>,
    /// The kubeconfig to wait for while `client` is `None`, and to build the client from again
    /// when its credentials change.
    kubeconfig: Option<PathBuf>,
    /// The files the client was built from and their fingerprint then
    /// ([`crate::kube_client::credential_files`]): a rotated client certificate changes it.
    credentials: Option<(Vec<PathBuf>, u64)>,
    /// Why the kubeconfig gave no client yet (`None` before the first try and once it did):
    /// logged when it changes, not at every try.
    kubeconfig_state: Option<KubeconfigState>,
    /// When to try an unloadable kubeconfig again without an inotify event.
    kubeconfig_retry_at: Option<Instant>,
    /// The wait before that try: [`KUBECONFIG_RETRY_MIN`], doubling up to
    /// [`KUBECONFIG_RETRY_MAX`].
    kubeconfig_backoff: Backoff,
    /// The last error from the API server (watch or write), until an answer comes.
    error: Option<String>,
    /// The watch errors logged since the last answer.
    error_log: Quiet,
    /// The write errors logged since the last reconcile that wrote all it had to.
    write_log: Quiet,
    /// When to reconcile again without an event: after a failed write, or at once when
    /// kubelet's locks changed outside the loop's handlers.
    reconcile_retry_at: Option<Instant>,
    /// The wait after a failed write: [`RECONCILE_RETRY`], doubling up to
    /// [`RECONCILE_RETRY_MAX`].
    reconcile_backoff: Backoff,
}

/// The agent's link to logind on the system bus: the connection and the lock's fd (the lock's
/// state is the pure [`state::Lock`] machine's), and the retries that bring both back within
/// about a second of logind or the bus returning.
struct LogindLink {
    /// `None` while the bus is out of reach.
    conn: Option<Logind>,
    /// The shutdown delay lock; closing it lets a shutdown go on.
    lock_fd: Option<OwnedFd>,
    /// When to reconnect to the bus (without `conn`) or to take the lock again.
    retry_at: Option<Instant>,
    /// The wait before that: [`LOGIND_RETRY_MIN`], doubling up to [`LOGIND_RETRY_MAX`].
    backoff: Backoff,
    /// logind's cap was raised once already: a raise that did not take is reported, not tried
    /// again at every lock take.
    cap_fix_tried: bool,
    /// The system bus could not be reached, and that was said: said once, not at every retry.
    bus_missing: bool,
    /// Stops nodeward-drain.service (systemd, on the same bus) during a shutdown drain; true
    /// when it stopped an armed unit (which a cancelled shutdown then starts again).
    drain_unit: Option<tokio::task::JoinHandle<bool>>,
    /// Set by a shutdown's cordon or drain the moment its own write cordons the Node
    /// ([`crate::drain::CordonOutcome::Cordoned`]), so it is known even when a cancelled shutdown
    /// drops the drain before its report; [`Agent::reconcile`] moves it into
    /// [`Known::own_cordon`].
    cordoned: std::sync::Arc<AtomicBool>,
    /// The power-off record the shutdown wrote on the Node, once written: withdrawn if logind
    /// cancels the power-off ([`crate::out_of_service::withdraw`]).
    recorded: std::sync::Arc<std::sync::Mutex<Option<crate::out_of_service::PowerOff>>>,
    /// The last call to logind asking for a shutdown, as the bus monitor
    /// ([`logind::monitor`]) saw it: the kind of a shutdown systemd 252 does not name.
    called: tokio::sync::watch::Receiver<Option<logind::monitor::Called>>,
}

/// What the agent tells the operator: systemd's STATUS= line, the status file `nodeward status`
/// reads, and the metrics. The line and the file are written only when they change.
struct Report {
    /// The status file and what it holds.
    status_file: status::StatusFile,
    /// The STATUS= line sent to systemd last.
    last_status_line: String,
    /// The lock's, the gates' and the drains' metrics, shared with the `/metrics` endpoint.
    metrics: std::sync::Arc<metrics::AgentMetrics>,
    /// What the running shutdown drain waits on, as it says it (for the status file).
    drain_progress: Option<tokio::sync::watch::Receiver<Option<crate::drain::explain::Progress>>>,
    /// Stops the running shutdown drain (its [`crate::drain::DrainOptions::stop`]) when the
    /// shutdown is cancelled.
    drain_stop: Option<tokio::sync::watch::Sender<bool>>,
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
        Self {
            report: Report {
                status_file: status::StatusFile::new(&settings.agent.status_file),
                last_status_line: String::new(),
                metrics: std::sync::Arc::default(),
                drain_progress: None,
                drain_stop: None,
            },
            settings,
            node,
            api: ApiLink::new(client, kubeconfig),
            logind: LogindLink {
                conn: None,
                lock_fd: None,
                retry_at: None,
                backoff: Backoff::new(LOGIND_RETRY_MIN, LOGIND_RETRY_MAX),
                cap_fix_tried: false,
                bus_missing: false,
                drain_unit: None,
                cordoned: std::sync::Arc::default(),
                recorded: std::sync::Arc::default(),
                called: tokio::sync::watch::channel(None).1,
            },
            known: Known::new(gates, Instant::now()),
        }
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

    /// Asks the API server whether it allows what the drain does (bounded by
    /// [`ACCESS_CHECK_TIMEOUT`]).
    fn check_access(&self, client: &kube::Client) -> AccessFuture {
        let (client, node) = (client.clone(), self.node.clone());
        Box::pin(async move {
            match tokio::time::timeout(ACCESS_CHECK_TIMEOUT, access::check(&client, &node)).await {
                Ok(Ok(a)) => Ok(a),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {ACCESS_CHECK_TIMEOUT:?}")),
            }
        })
    }

    /// Records the drain-access answer; true when it should be asked again (no answer, or a
    /// permission missing).
    fn access_answered(&mut self, answer: Result<Access, String>) -> bool {
        match answer {
            Ok(a) => {
                if self.known.facts.drain_access.as_ref() != Some(&a) {
                    match &a {
                        Access::Granted => info!(node = %self.node, "drain access granted"),
                        Access::Unverifiable => {
                            warn!(node = %self.node, "drain access not verifiable: the API server serves no SelfSubjectAccessReview")
                        }
                        Access::Denied(what) => {
                            error!(node = %self.node, denied = %what.join(", "), "the drain would be refused: apply packaging/kubernetes/rbac-agent.yaml; the node stays gated until it is")
                        }
                    }
                }
                let again = matches!(a, Access::Denied(_));
                self.known.facts.drain_access = Some(a);
                again
            }
            Err(e) => {
                warn!(node = %self.node, error = %e, "cannot check drain access; retrying");
                true
            }
        }
    }

    /// Re-evaluates the gates and acts on the Node; stops at the first failed write and tries
    /// again after [`RECONCILE_RETRY`].
    async fn reconcile(&mut self) {
        if self.logind.cordoned.swap(false, Ordering::Relaxed) {
            self.known.own_cordon = true;
        }
        self.known.evaluate_gates(Instant::now());
        let Some(client) = self.api.client.clone() else {
            return;
        };
        if !self.known.node_watch.synced() {
            return;
        }
        // The boot's wall-clock time is computed each time: a clock set after the agent started
        // (NTP's first step) moves it.
        let view = self.known.view(
            &self.settings.agent,
            boot_time(self.known.userspace_since_boot),
        );
        for action in state::reconcile(&view) {
            if let Err((what, error)) = self.act(&client, action).await {
                self.api.write_failed(&self.node, what, &error);
                return;
            }
        }
        if let Err(e) = self.settle_lifecycle(&client).await {
            self.api
                .write_failed(&self.node, "cannot clear the lifecycle conditions", &e);
            return;
        }
        self.api.writes_succeeded(&self.node);
    }

    /// Clears the lifecycle conditions of a moment that is over ([`crate::lifecycle::settle`]):
    /// a shutdown of an earlier boot, a drain whose node is schedulable again.
    async fn settle_lifecycle(&mut self, client: &kube::Client) -> Result<(), String> {
        let (Some(n), Some(booted_at)) = (
            self.known.node_obj.clone(),
            boot_time(self.known.userspace_since_boot),
        ) else {
            return Ok(());
        };
        let agent = crate::lifecycle::Agent {
            shutting_down: self.known.shutdown_started.is_some(),
            booted_at,
        };
        if !self.settings.conditions.lifecycle || crate::lifecycle::settle(&n, agent).is_empty() {
            return Ok(());
        }
        let decide = |n: &Node| crate::lifecycle::settle(n, agent);
        match crate::lifecycle::write_deciding(client, &self.node, Some(n), decide, true).await {
            Ok(Some(n)) => {
                info!(node = %self.node, "the lifecycle conditions of a moment that is over cleared");
                self.known.wrote_node(n, true);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Does one of the state machine's actions; on failure, what failed and why.
    async fn act(
        &mut self,
        client: &kube::Client,
        action: Action,
    ) -> Result<(), (&'static str, String)> {
        match action {
            Action::Transition(ev) => {
                if self.known.phase_to(&self.node, ev) {
                    Ok(())
                } else {
                    Err(("a transition was refused", String::new()))
                }
            }
            Action::WriteCondition => {
                let want = readiness::desired_condition(&self.known.verdict);
                let n = readiness::write_condition(
                    client,
                    &self.node,
                    self.known.node_obj.as_ref(),
                    &want,
                )
                .await
                .map_err(|e| ("cannot report readiness", e.to_string()))?;
                self.known.wrote_node(n, true);
                Ok(())
            }
            Action::RemoveStartupTaint | Action::AddStartupTaint => {
                let add = action == Action::AddStartupTaint;
                if add {
                    warn!(node = %self.node, failing = ?self.known.verdict.failing(), "a gate failed; putting the startup taint back");
                }
                let (n, written) = readiness::set_startup_taint(client, &self.node, add, None)
                    .await
                    .map_err(|e| ("cannot change the startup taint", e.to_string()))?;
                // Fresher than the watch, which may still deliver older versions.
                self.known.wrote_node(n, written);
                Ok(())
            }
            Action::Uncordon => match crate::drain::uncordon(
                client,
                &self.node,
                false,
                crate::drain::Lifter::Shutdown,
            )
            .await
            {
                Ok(crate::drain::UncordonOutcome::Kept { reason }) => {
                    info!(node = %self.node, cordon = %reason, "gates pass: nodeward's cordon is another moment's, not a shutdown's; it stays");
                    self.known.own_cordon = false;
                    Ok(())
                }
                Ok(o) => {
                    info!(node = %self.node, outcome = ?o, "gates pass: nodeward's cordon lifted");
                    self.known.own_cordon = false;
                    Ok(())
                }
                Err(crate::drain::exec::Error::CordonedByOther { who, .. }) => {
                    info!(node = %self.node, by = ?who, "cordoned by someone else; leaving it");
                    Ok(())
                }
                Err(e) => Err(("cannot uncordon", e.to_string())),
            },
            Action::ReportNotReadyInTime => {
                self.report_not_ready_in_time(client).await;
                Ok(())
            }
        }
    }

    /// The gates did not pass within the boot deadline: said once, in the journal and as an
    /// Event on the Node.
    async fn report_not_ready_in_time(&mut self, client: &kube::Client) {
        let failing = self.known.verdict.failing().join("; ");
        error!(node = %self.node, boot_deadline = ?self.settings.agent.boot_deadline, failing = %failing, "NodeNotReadyInTime: the readiness gates did not pass in time");
        node::event(
            client,
            &self.node,
            true,
            "NodeNotReadyInTime",
            format!(
                "readiness gates not passing {:?} after the agent started: {failing}",
                self.settings.agent.boot_deadline
            ),
        )
        .await;
        self.known.overdue_reported = true;
    }

    /// What the agent waits for, as systemd's STATUS= says it.
    fn waiting_for(&self) -> String {
        self.known.waiting_for(&self.node, self.api.blocked())
    }

    /// Sends READY/STATUS to systemd and rewrites the status file when something changed.
    fn publish(&mut self) {
        let now = Instant::now();
        if self.known.ready_due(self.api.out_of_reach(), now) {
            self.known.notified_ready = true;
            if self.known.watches_up() {
                info!(node = %self.node, "lock held and watches up; ready");
            } else {
                info!(node = %self.node, status = %self.waiting_for(), "lock held; ready without the API server");
            }
            notify(&[sd_notify::NotifyState::Ready]);
        }
        let status = self.known.status(
            std::process::id(),
            &self.node,
            self.waiting_for(),
            self.report.draining(),
        );
        let since_start = now.saturating_duration_since(self.known.started);
        self.report
            .publish(status, self.known.verdict.all_pass, since_start);
    }
}

impl Report {
    /// What the running shutdown drain waits on now, if one runs.
    fn draining(&self) -> Option<crate::drain::explain::Progress> {
        self.drain_progress
            .as_ref()
            .and_then(|p| p.borrow().clone())
    }

    /// Sends `status`'s line to systemd as STATUS= and rewrites the status file, each when it
    /// changed; the metrics follow the lock and the gates (`gates_pass`, `since_start` after the
    /// agent started).
    fn publish(&mut self, status: Status, gates_pass: bool, since_start: Duration) {
        if status.waiting_for != self.last_status_line {
            notify(&[sd_notify::NotifyState::Status(&status.waiting_for)]);
            self.last_status_line.clone_from(&status.waiting_for);
        }
        self.export(&status, gates_pass, since_start);
        if let Err(e) = self.status_file.publish(status) {
            warn!(error = %e, "cannot write the status file; trying again at the next event");
        }
    }

    /// The lock and the gates as metrics (the drain's are the drain's own).
    fn export(&self, status: &Status, gates_pass: bool, since_start: Duration) {
        let m = &self.metrics;
        m.lock_held.set(i64::from(status.lock == Lock::Held));
        m.gates_passing.set(i64::from(gates_pass));
        if gates_pass {
            m.gates_passed(since_start);
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// A soft-reboot keeps the kernel (so `CLOCK_BOOTTIME` goes on counting) but starts
    /// userspace anew: the shutdown cordon the agent made just before it is from before this
    /// boot, and is lifted once the gates pass (issue 41, defect 7).
    #[test]
    fn after_a_soft_reboot_the_shutdown_cordon_is_from_before_this_boot() {
        use crate::agent::state::CordonView;
        let now: jiff::Timestamp = "2026-06-01T12:00:00Z".parse().expect("ts");
        let kernel_up = Duration::from_secs(5 * 24 * 3600);
        // Userspace started again 60 s ago; the agent cordoned 90 s ago, for the soft-reboot.
        let userspace = kernel_up - Duration::from_secs(60);
        let cordoned = (now - jiff::SignedDuration::from_secs(90)).to_string();
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "annotations": {crate::drain::cordon::CORDONED_BY:
                serde_json::json!({"reason": "shutdown", "at": cordoned, "shutdown": true}).to_string()},
                "managedFields": [{"manager": crate::names::FIELD_MANAGER, "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:unschedulable": {}}}}]},
            "spec": {"unschedulable": true}
        }))
        .expect("node");
        let boot = super::this_boot(now, kernel_up, userspace);
        assert_eq!(boot, Some(now - jiff::SignedDuration::from_secs(60)));
        assert_eq!(
            super::node::cordon_view(&node, boot, false),
            CordonView::OursBeforeBoot
        );
        // The kernel's boot alone (what systemd does not say) reads it as this boot's.
        assert_ne!(
            super::node::cordon_view(
                &node,
                super::this_boot(now, kernel_up, Duration::ZERO),
                false
            ),
            CordonView::OursBeforeBoot
        );
        assert!(
            super::userspace_since_boot(Duration::from_secs(1))
                .is_some_and(|d| d >= Duration::from_secs(1))
        );
    }

    /// Issue 41, defect 9: the engine's ending (surges given back, the Node told how the drain
    /// ended) must fit before the lock goes, not be cut by the agent's hard timeout.
    #[test]
    fn drain_budget_leaves_the_ending_room_before_the_lock_goes() {
        let ms = Duration::from_millis;
        for left in [
            ms(0),
            ms(400),
            ms(1_000),
            ms(5_000),
            ms(60_000),
            ms(600_000),
        ] {
            let (timeout, ending) = super::drain_budget(left);
            assert!(
                timeout + ending <= left,
                "{left:?}: {timeout:?} + {ending:?}"
            );
            if left >= ms(1_000) {
                let asked = crate::drain::exec::ENDING;
                assert!(ending >= asked.min(left / 8), "{left:?}: ending {ending:?}");
                assert!(timeout >= left / 2, "{left:?}: timeout {timeout:?}");
            }
        }
        // A long deadline gives the ending everything it asks for, and no more.
        assert_eq!(
            super::drain_budget(ms(600_000)).1,
            crate::drain::exec::ENDING
        );
    }

    #[test]
    fn boot_time_is_in_the_past_and_agrees_with_proc_stat() {
        let boot = super::boot_time(std::time::Duration::ZERO).expect("CLOCK_BOOTTIME");
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
