//! The status file: what the agent sees, written atomically whenever it changes, and read by
//! `nodeward status` (which adds live facts from logind and the API when they are reachable).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::state::{Lock, Phase};
use crate::gate::GateStatus;
use crate::logind::ShutdownKind;

/// Errors reading or writing the status file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be written.
    #[error(transparent)]
    Write(#[from] crate::fsutil::Error),
    /// The file could not be read (the agent is not running, or runs with another
    /// `agent.status_file`).
    #[error("cannot read the agent's status file {}: {source}; is nodeward.service running?", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a status the agent wrote.
    #[error("{} is not a nodeward status file: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
}

/// How the last shutdown drain went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainSummary {
    /// When it started (RFC 3339).
    pub started_at: String,
    /// The kind of shutdown.
    pub kind: ShutdownKind,
    /// What was done: drain, cordon or nothing.
    pub policy: crate::config::ShutdownPolicy,
    /// The deadline, in milliseconds.
    pub deadline_ms: u64,
    /// How it ended.
    pub outcome: ShutdownOutcome,
    /// Pods evicted (through their budgets).
    pub evicted: usize,
    /// Pods `drain.on_deadline = delete` deleted past their budgets (absent from files written
    /// before it was counted apart).
    #[serde(default)]
    pub deleted_past_budgets: Vec<String>,
    /// Pods still there at the end.
    pub left_behind: Vec<String>,
    /// Pods evicted or deleted whose containers stopped while their objects were still there:
    /// they stay Terminating once the kubelet is gone (absent from files written before they
    /// were counted).
    #[serde(default)]
    pub terminating: Vec<String>,
    /// Pods refused.
    pub refused: Vec<String>,
    /// Milliseconds from the signal to the lock's release.
    pub elapsed_ms: u64,
}

impl DrainSummary {
    /// A summary of `outcome` alone (no pods counted); the caller fills in the rest.
    pub fn of(outcome: ShutdownOutcome) -> Self {
        Self {
            started_at: String::new(),
            kind: ShutdownKind::Unknown,
            policy: crate::config::ShutdownPolicy::Drain,
            deadline_ms: 0,
            outcome,
            evicted: 0,
            deleted_past_budgets: Vec::new(),
            left_behind: Vec::new(),
            terminating: Vec::new(),
            refused: Vec::new(),
            elapsed_ms: 0,
        }
    }
}

/// How a shutdown's drain (or cordon) ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShutdownOutcome {
    /// Every evictable pod left.
    Drained,
    /// Every evictable pod left; some were refused and stayed.
    Refused,
    /// The deadline came first; the last error, when attempts failed.
    DeadlineExceeded(Option<String>),
    /// Pods stayed because their budgets cannot allow their eviction; the deadline policy
    /// applied to them early.
    BudgetUnsatisfiable,
    /// Cordoned only (policy `cordon`).
    Cordoned,
    /// Policy `nothing`.
    NothingToDo,
    /// The shutdown was cancelled while it drained: the drain stopped and said so on the Node.
    Cancelled,
    /// The Node does not exist (the machine goes down before it joined).
    NotRegistered,
    /// No kubeconfig yet (the machine goes down before `kubeadm join` wrote it).
    NoKubeconfig,
    /// An error that trying again would not change (a missing permission, say).
    Failed(String),
    /// The API server refused the agent's credentials (401): a client built from the files
    /// now may work, so the drain unit drains ([`crate::shutdown::AgentSays::Unauthorized`]).
    Unauthorized(String),
}

impl From<crate::drain::DrainOutcome> for ShutdownOutcome {
    fn from(o: crate::drain::DrainOutcome) -> Self {
        match o {
            crate::drain::DrainOutcome::Drained => Self::Drained,
            crate::drain::DrainOutcome::Refused => Self::Refused,
            crate::drain::DrainOutcome::DeadlineExceeded => Self::DeadlineExceeded(None),
            crate::drain::DrainOutcome::BudgetUnsatisfiable => Self::BudgetUnsatisfiable,
            crate::drain::DrainOutcome::Cancelled => Self::Cancelled,
        }
    }
}

impl std::fmt::Display for ShutdownOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Drained => crate::drain::DrainOutcome::Drained.fmt(f),
            Self::Refused => crate::drain::DrainOutcome::Refused.fmt(f),
            Self::DeadlineExceeded(None) => crate::drain::DrainOutcome::DeadlineExceeded.fmt(f),
            Self::DeadlineExceeded(Some(e)) => write!(f, "deadline exceeded; last error: {e}"),
            Self::BudgetUnsatisfiable => crate::drain::DrainOutcome::BudgetUnsatisfiable.fmt(f),
            Self::Cancelled => f.write_str("stopped: the shutdown was cancelled"),
            Self::Cordoned => f.write_str("cordoned"),
            Self::NothingToDo => f.write_str("nothing to do (policy)"),
            Self::NotRegistered => f.write_str("nothing to drain: the node is not registered"),
            Self::NoKubeconfig => {
                f.write_str("nothing to drain: no kubeconfig yet (the node has not joined)")
            }
            Self::Failed(e) => write!(f, "failed: {e}"),
            Self::Unauthorized(e) => write!(
                f,
                "failed: the API server refused the agent's credentials ({e}); the drain unit drains"
            ),
        }
    }
}

/// Everything `nodeward status` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The agent's pid.
    pub pid: u32,
    /// The Node.
    pub node: String,
    /// Phase.
    pub phase: Phase,
    /// The inhibitor lock.
    pub lock: Lock,
    /// How many times the agent has taken the lock (more than once after logind or the bus
    /// restarted, or a shutdown was cancelled).
    pub lock_takes: u32,
    /// logind's `InhibitDelayMaxUSec`, in milliseconds, when known.
    pub inhibit_delay_max_ms: Option<u64>,
    /// What the agent waits for, as in systemd's STATUS=.
    pub waiting_for: String,
    /// The agent has told systemd READY=1 (it holds the lock; the API server may still be out
    /// of reach).
    #[serde(default)]
    pub ready: bool,
    /// The Node is registered.
    pub node_registered: bool,
    /// Per gate.
    pub gates: Vec<GateStatus>,
    /// The boot deadline passed with gates failing (NodeNotReadyInTime).
    pub not_ready_in_time: bool,
    /// The Node carries the startup taint.
    pub startup_taint: bool,
    /// Who cordoned the Node, if it is cordoned.
    pub cordoned_by: Option<String>,
    /// The last shutdown drain.
    pub last_drain: Option<DrainSummary>,
    /// The shutdown drain running now: what it waits on, every pod a budget blocks.
    #[serde(default)]
    pub draining: Option<crate::drain::explain::Progress>,
    /// Things an operator should fix (cap too short, kubelet holds a lock).
    pub warnings: Vec<String>,
}

/// Milliseconds as seconds with one decimal, as the status prints them.
fn ms(v: u64) -> String {
    format!("{:.1}s", v as f64 / 1000.0)
}

/// Writes `status` to `path` atomically.
pub fn write(path: &Path, status: &Status) -> Result<(), Error> {
    let json = serde_json::to_vec_pretty(status).unwrap_or_default();
    if let Some(dir) = path.parent() {
        // The directory is under /run (tmpfs) and gone after a reboot; creating it is part of
        // writing the file. A failure shows in the write below.
        let _ = std::fs::create_dir_all(dir);
    }
    crate::fsutil::write_private_atomic(path, &json)?;
    Ok(())
}

/// The status file and what it holds: a status is written when it differs from the last one
/// *written*, so one that failed (a full /run, a read-only remount) is tried again next time
/// instead of being counted as written.
#[derive(Debug)]
pub struct StatusFile {
    path: std::path::PathBuf,
    last_written: Option<Status>,
}

impl StatusFile {
    /// The status file at `path`, nothing written yet.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            last_written: None,
        }
    }

    /// Writes `status` unless the file already holds it; `Ok(true)` when it wrote.
    pub fn publish(&mut self, status: Status) -> Result<bool, Error> {
        if self.last_written.as_ref() == Some(&status) {
            return Ok(false);
        }
        write(&self.path, &status)?;
        self.last_written = Some(status);
        Ok(true)
    }
}

/// Whether the process `pid` (an agent's, from its status file) still runs.
pub fn alive(pid: u32) -> bool {
    if pid == 0 {
        // kill(0) would ask about this process group.
        return false;
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
    // EPERM: it runs, as someone this process may not signal.
    !matches!(
        nix::sys::signal::kill(pid, None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// How long each live check of `nodeward status` may take.
const LIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// What `nodeward status` adds to the file: whether the agent still runs, and what logind and
/// the API server say now (each within [`LIVE_TIMEOUT`]; `client` is the error text when no
/// client could be built).
pub async fn live(
    st: &Status,
    client: Result<kube::Client, String>,
    on_deadline: crate::config::OnDeadline,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if !alive(st.pid) {
        let _ = writeln!(
            out,
            "agent:         pid {} is not running; the file is stale",
            st.pid
        );
    }
    out.push_str("live:\n");
    let logind = async {
        let l = crate::logind::Logind::connect().await?;
        let cap = l.inhibit_delay_max().await?;
        let list = l.list_inhibitors().await?;
        Ok::<_, crate::logind::Error>((cap, list))
    };
    let _ = match tokio::time::timeout(LIVE_TIMEOUT, logind).await {
        Ok(Ok((cap, list))) => {
            let ours = crate::logind::own_locks(&list, st.pid).len();
            let mut line = format!(
                "  logind:      InhibitDelayMaxSec {cap:?}; {ours} shutdown delay lock(s) held by the agent\n"
            );
            for k in crate::logind::kubelet_locks(&list) {
                let _ = writeln!(
                    line,
                    "  WARNING:     kubelet holds a delay lock (pid {}); set shutdownGracePeriod: 0s",
                    k.pid
                );
            }
            write!(out, "{line}")
        }
        Ok(Err(e)) => writeln!(out, "  logind:      unreachable: {e}"),
        Err(_) => writeln!(out, "  logind:      no answer within {LIVE_TIMEOUT:?}"),
    };
    out.push_str(&node_lines(st, client, on_deadline).await);
    out
}

/// `live`'s lines on the Node: who cordoned it, its startup taint, a recorded cluster shutdown,
/// and its drain as the Draining condition says.
async fn node_lines(
    st: &Status,
    client: Result<kube::Client, String>,
    on_deadline: crate::config::OnDeadline,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let intent_client = client.as_ref().ok().cloned();
    let node = async {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client?);
        nodes.get(&st.node).await.map_err(|e| e.to_string())
    };
    let _ = match tokio::time::timeout(LIVE_TIMEOUT, node).await {
        Ok(Ok(n)) => {
            if let Some(c) = intent_client {
                out.push_str(&cluster_shutdown_line(&c, &n).await);
            }
            let _ = writeln!(
                out,
                "  node:        cordoned by {}; startup taint {}",
                super::node::cordon_owner(&n).unwrap_or_else(|| "nobody".into()),
                if crate::readiness::has_startup_taint(&n) {
                    "present"
                } else {
                    "absent"
                }
            );
            let lifecycle = crate::lifecycle::summary(&n);
            if !lifecycle.is_empty() {
                let _ = writeln!(out, "  lifecycle:   {}", lifecycle.join(", "));
            }
            match crate::drain::explain::condition(&n) {
                Some(c) => {
                    let _ = writeln!(
                        out,
                        "  drain:       {}",
                        crate::drain::explain::describe(c, jiff::Timestamp::now())
                    );
                    if c.status == "True" {
                        writeln!(
                            out,
                            "               at the deadline: {} (drain.on_deadline, this node's config: the agent's and the unit's drains)",
                            on_deadline_words(on_deadline)
                        )
                    } else {
                        Ok(())
                    }
                }
                None => writeln!(out, "  drain:       none seen on this Node"),
            }
        }
        Ok(Err(e)) => writeln!(out, "  node:        unreachable: {e}"),
        Err(_) => writeln!(out, "  node:        no answer within {LIVE_TIMEOUT:?}"),
    };
    out
}

/// A line on a recorded cluster shutdown, if one is: live (this node holds its cordon: a
/// shutdown drain here waits on no budget) or stale (not obeyed). Nothing when none is recorded
/// or the question is not answered in time.
async fn cluster_shutdown_line(
    client: &kube::Client,
    node: &k8s_openapi::api::core::v1::Node,
) -> String {
    let recorded = tokio::time::timeout(LIVE_TIMEOUT, crate::cluster::intent_exists(client)).await;
    if recorded != Ok(true) {
        return String::new();
    }
    if crate::cluster::intent::is_live([node]) {
        "  cluster:     shutdown recorded and live (this node holds its cordon): a shutdown drain here waits on no budget\n".into()
    } else {
        "  cluster:     shutdown recorded but stale here (this node does not hold its cordon): not obeyed; `nodeward cluster start` removes the record\n".into()
    }
}

/// `nodeward status --output json`: the status file, whether its agent still runs, and the
/// Node's `nodeward.io/Draining` condition as the API server has it now (or why not).
pub async fn live_json(st: &Status, client: Result<kube::Client, String>) -> serde_json::Value {
    let node = async {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client?);
        nodes.get(&st.node).await.map_err(|e| e.to_string())
    };
    let (draining, node_error) = match tokio::time::timeout(LIVE_TIMEOUT, node).await {
        Ok(Ok(n)) => (crate::drain::explain::condition(&n).cloned(), None),
        Ok(Err(e)) => (None, Some(e)),
        Err(_) => (None, Some(format!("no answer within {LIVE_TIMEOUT:?}"))),
    };
    serde_json::json!({
        "agent": st,
        "agent_running": alive(st.pid),
        "draining": draining,
        "node_error": node_error,
    })
}

/// What `drain.on_deadline` does, in words.
fn on_deadline_words(o: crate::config::OnDeadline) -> &'static str {
    match o {
        crate::config::OnDeadline::Abandon => "abandon: the pods left stay, the shutdown proceeds",
        crate::config::OnDeadline::Delete => "delete: the pods left are deleted past their budgets",
        crate::config::OnDeadline::Wait => "wait: the drain goes on",
    }
}

/// Reads the status file.
pub fn read(path: &Path) -> Result<Status, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| Error::Parse {
        path: path.to_path_buf(),
        source,
    })
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "node:          {} (agent pid {})", self.node, self.pid)?;
        writeln!(f, "phase:         {:?}", self.phase)?;
        writeln!(f, "waiting for:   {}", self.waiting_for)?;
        writeln!(
            f,
            "systemd:       {}",
            if self.ready {
                "READY sent"
            } else {
                "not ready yet (no shutdown lock)"
            }
        )?;
        writeln!(
            f,
            "shutdown lock: {:?}, taken {} time(s) (logind InhibitDelayMaxSec: {})",
            self.lock,
            self.lock_takes,
            self.inhibit_delay_max_ms.map_or("unknown".into(), ms)
        )?;
        writeln!(
            f,
            "node:          {}{}",
            if self.node_registered {
                "registered"
            } else {
                "not registered yet"
            },
            if self.startup_taint {
                ", startup taint present"
            } else {
                ""
            }
        )?;
        writeln!(
            f,
            "cordoned by:   {}",
            self.cordoned_by.as_deref().unwrap_or("not cordoned")
        )?;
        writeln!(f, "gates:")?;
        for g in &self.gates {
            writeln!(
                f,
                "  {:<7} {}: {}",
                format!("{:?}", g.state),
                g.gate,
                g.reason
            )?;
        }
        if self.not_ready_in_time {
            writeln!(
                f,
                "NOT READY IN TIME: the gates did not pass within agent.boot_deadline"
            )?;
        }
        self.fmt_drains(f)
    }
}

/// `, N deleted past their budgets (pods)`, or nothing when none was.
fn past_budgets(deleted: &[String]) -> String {
    if deleted.is_empty() {
        return String::new();
    }
    format!(
        ", {} deleted past their budgets ({})",
        deleted.len(),
        deleted.join(", ")
    )
}

impl Status {
    /// The last drain, the one running now with every pod a budget blocks, and the warnings.
    fn fmt_drains(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.last_drain {
            None => writeln!(f, "last drain:    none since the agent started")?,
            Some(d) => writeln!(
                f,
                "last drain:    {} at {} ({:?}, policy {:?}, deadline {}): {} evicted{}, {} left behind, lock released after {}",
                d.outcome,
                d.started_at,
                d.kind,
                d.policy,
                ms(d.deadline_ms),
                d.evicted,
                past_budgets(&d.deleted_past_budgets),
                d.left_behind.len(),
                ms(d.elapsed_ms)
            )?,
        }
        if let Some(d) = &self.draining {
            writeln!(f, "draining now:  {}: {}", d.reason, d.message)?;
            for line in d.blocked_lines(jiff::Timestamp::now()) {
                writeln!(f, "  blocked:     {line}")?;
            }
        }
        for w in &self.warnings {
            writeln!(f, "WARNING:       {w}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::GateState;

    /// A status that could not be written is written at the next try, even unchanged.
    #[test]
    fn a_failed_write_is_tried_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let blocker = dir.path().join("run");
        // A file where the directory should be: the write fails.
        std::fs::write(&blocker, "").expect("blocker");
        let path = blocker.join("status.json");
        let mut file = StatusFile::new(&path);
        let s = sample();
        file.publish(s.clone())
            .expect_err("cannot write under a file");
        std::fs::remove_file(&blocker).expect("unblock");
        assert!(file.publish(s.clone()).expect("writes now"), "tried again");
        assert_eq!(read(&path).expect("read"), s);
        assert!(!file.publish(s).expect("unchanged"), "not rewritten");
    }

    fn sample() -> Status {
        Status {
            pid: 42,
            node: "worker-1".into(),
            phase: Phase::Gated,
            lock: Lock::Held,
            lock_takes: 1,
            inhibit_delay_max_ms: Some(120_000),
            waiting_for: "gates".into(),
            ready: true,
            node_registered: true,
            gates: vec![GateStatus {
                gate: "file /run/flannel/subnet.env".into(),
                state: GateState::Fail,
                reason: "missing".into(),
            }],
            not_ready_in_time: true,
            startup_taint: true,
            cordoned_by: None,
            last_drain: None,
            draining: None,
            warnings: vec!["kubelet holds a delay lock".into()],
        }
    }

    #[test]
    fn round_trip_and_display() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/status.json");
        let s = sample();
        write(&path, &s).expect("write");
        assert_eq!(read(&path).expect("read"), s);
        let text = s.to_string();
        for needle in [
            "Held",
            "120.0s",
            "Fail    file /run/flannel/subnet.env: missing",
            "NOT READY IN TIME",
            "WARNING:       kubelet",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
        }
        let e = read(&dir.path().join("none.json")).expect_err("missing");
        assert!(e.to_string().contains("nodeward.service"), "{e}");
    }

    /// Issue 41: the last drain's summary counted the pods deleted past their budgets as evicted.
    #[test]
    fn the_last_drain_counts_deletions_past_budgets_apart() {
        let pod = |name: &str| crate::drain::plan::PodRef {
            namespace: "default".into(),
            name: name.into(),
            uid: name.into(),
        };
        let report = crate::drain::DrainReport {
            node: "worker-1".into(),
            outcome: crate::drain::DrainOutcome::Drained,
            evicted: vec![pod("a")],
            skipped: Vec::new(),
            refused: Vec::new(),
            left_behind: Vec::new(),
            force_deleted: vec![pod("b")],
            unsatisfiable: Vec::new(),
            eviction_requests: 2,
            stopped: Vec::new(),
            elapsed: std::time::Duration::from_secs(1),
        };
        let mut s = sample();
        s.last_drain = Some(super::super::shutdown::report_summary(&report));
        let text = s.to_string();
        assert!(
            text.contains(": 1 evicted, 1 deleted past their budgets (default/b), 0 left behind"),
            "{text}"
        );
    }
}
