//! Readiness gates: a new or rebooted node takes no workload until its network is really up.
//!
//! kubelet reports a node Ready as soon as it runs, but pods scheduled before the CNI (flannel)
//! has written its subnet file and its pod is Ready fail to start or start without a network. So
//! nodes register with the startup taint and the agent lifts it (and its own cordon from before a
//! reboot) only when every configured gate passes. Whether the gates pass is decided by the pure
//! [`evaluate`] from observed [`Facts`]; the facts come from inotify and from watches on the own
//! Node and the own pods (`watch.rs`), never from polling — except the `http` gate, which has no
//! event to watch and is probed at a bounded interval.

pub mod selector;
pub mod watch;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use selector::Selector;

/// A regular expression from the config, compared by its text.
#[derive(Debug, Clone)]
pub struct Pattern(pub regex::Regex);

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

/// The API server's answers about what the drain needs ([`crate::drain::access::check`]), as the
/// readiness gate sees them. Defined here, not with the check, so that the gate (which the
/// configuration names) does not depend on the drain (which reads the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Every need is allowed.
    Granted,
    /// These needs (described) are denied.
    Denied(Vec<String>),
    /// The API server does not serve SelfSubjectAccessReview (404): cannot be checked, so not
    /// held against the node.
    Unverifiable,
}

/// `file`: the path exists (and its content matches `contains`, if given).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawFileGate")]
pub struct FileGate {
    /// The file; its parent directory is watched so a file created later or renamed into place
    /// is seen at once.
    pub path: PathBuf,
    /// A regex the content must match.
    pub contains: Option<Pattern>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFileGate {
    path: PathBuf,
    contains: Option<String>,
}

impl TryFrom<RawFileGate> for FileGate {
    type Error = String;
    fn try_from(r: RawFileGate) -> Result<Self, String> {
        if !r.path.is_absolute() {
            return Err(format!(
                "path {:?} must be absolute (e.g. \"/run/flannel/subnet.env\")",
                r.path
            ));
        }
        let contains = r
            .contains
            .map(|c| {
                regex::Regex::new(&c)
                    .map(Pattern)
                    .map_err(|e| format!("invalid regex {c:?} in `contains`: {e}"))
            })
            .transpose()?;
        Ok(Self {
            path: r.path,
            contains,
        })
    }
}

/// `pod`: a pod on this node in `namespace` matching `selector` is Ready.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawPodGate")]
pub struct PodGate {
    /// Namespace of the pod.
    pub namespace: String,
    /// Labels of the pod.
    pub selector: Selector,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPodGate {
    namespace: String,
    selector: String,
}

impl TryFrom<RawPodGate> for PodGate {
    type Error = String;
    fn try_from(r: RawPodGate) -> Result<Self, String> {
        crate::validate::dns_label(&r.namespace)
            .map_err(|form| format!("invalid namespace {:?}: expected {form}", r.namespace))?;
        Ok(Self {
            namespace: r.namespace,
            selector: Selector::parse(&r.selector)?,
        })
    }
}

/// What a node condition must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// The condition exists with this status.
    Is(String),
    /// The condition is absent or has another status.
    IsNot(String),
}

/// `node_condition`: the own Node's condition `type` has (or has not) a status.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawConditionGate")]
pub struct ConditionGate {
    /// Condition type (`Ready`, `NetworkUnavailable`).
    pub type_: String,
    /// The expected status.
    pub expect: Expect,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConditionGate {
    #[serde(rename = "type")]
    type_: String,
    status: Option<String>,
    not: Option<String>,
}

/// Statuses a condition can have.
const CONDITION_STATUSES: [&str; 3] = ["True", "False", "Unknown"];

impl TryFrom<RawConditionGate> for ConditionGate {
    type Error = String;
    fn try_from(r: RawConditionGate) -> Result<Self, String> {
        let check = |s: String| {
            if CONDITION_STATUSES.contains(&s.as_str()) {
                Ok(s)
            } else {
                Err(format!(
                    "invalid condition status {s:?}: expected \"True\", \"False\" or \"Unknown\""
                ))
            }
        };
        let expect = match (r.status, r.not) {
            (Some(s), None) => Expect::Is(check(s)?),
            (None, Some(s)) => Expect::IsNot(check(s)?),
            _ => {
                return Err(format!(
                    "condition {:?}: give exactly one of `status` (must be) or `not` (must not be)",
                    r.type_
                ));
            }
        };
        if r.type_.is_empty() {
            return Err("condition `type` is empty (e.g. \"Ready\")".into());
        }
        Ok(Self {
            type_: r.type_,
            expect,
        })
    }
}

/// `http`: a GET of `url` answers 2xx.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawHttpGate")]
pub struct HttpGate {
    /// An `http://` URL, typically a CNI health port on localhost.
    pub url: hyper::Uri,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttpGate {
    url: String,
}

impl TryFrom<RawHttpGate> for HttpGate {
    type Error = String;
    fn try_from(r: RawHttpGate) -> Result<Self, String> {
        let url: hyper::Uri = r
            .url
            .parse()
            .map_err(|e| format!("invalid url {:?}: {e}", r.url))?;
        if url.scheme_str() != Some("http") || url.host().is_none() {
            return Err(format!(
                "url {:?} must be http://HOST[:PORT]/PATH (health ports are plain HTTP on the node)",
                r.url
            ));
        }
        Ok(Self { url })
    }
}

/// One gate.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// A file exists (with matching content).
    File(FileGate),
    /// A pod on this node is Ready.
    Pod(PodGate),
    /// A Node condition holds.
    NodeCondition(ConditionGate),
    /// An HTTP endpoint answers 2xx.
    Http(HttpGate),
    /// The API server allows what the drain does (always on: see [`crate::drain::access`]).
    DrainAccess,
    /// kubelet's graceful node shutdown is off (always on). At `PrepareForShutdown` it kills
    /// pods by priority group without the Eviction API, budgets ignored, racing nodeward's drain,
    /// and it cannot be told to wait for another lock holder: a node where it is on cannot leave
    /// gracefully. Seen as kubelet's shutdown delay lock in logind.
    KubeletShutdownOff,
}

impl Gate {
    /// A short name for logs and `nodeward status`.
    pub fn name(&self) -> String {
        match self {
            Gate::File(f) => format!("file {}", f.path.display()),
            Gate::Pod(p) => format!("pod {}/{}", p.namespace, p.selector),
            Gate::NodeCondition(c) => match &c.expect {
                Expect::Is(s) => format!("node condition {}={s}", c.type_),
                Expect::IsNot(s) => format!("node condition {}!={s}", c.type_),
            },
            Gate::Http(h) => format!("http {}", h.url),
            Gate::DrainAccess => "drain access".into(),
            Gate::KubeletShutdownOff => "kubelet graceful shutdown off".into(),
        }
    }
}

/// What is known about a watched file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileFact {
    /// Not there.
    Missing,
    /// There, with this (possibly truncated) content.
    Present(String),
    /// There but unreadable.
    Unreadable(String),
}

/// What the own pods' watch shows about one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFact {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Condition Ready is True.
    pub ready: bool,
    /// Being deleted.
    pub terminating: bool,
}

/// The result of the last probe of an http gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpFact {
    /// Answered with this status.
    Status(u16),
    /// No answer.
    Failed(String),
}

/// Everything observed that gates depend on.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// Files by path; absent until first read.
    pub files: BTreeMap<PathBuf, FileFact>,
    /// The own Node's conditions (type → status); `None` while the Node does not exist (or its
    /// watch has not listed yet).
    pub node_conditions: Option<BTreeMap<String, String>>,
    /// The own pods; `None` until the pod watch has listed.
    pub pods: Option<Vec<PodFact>>,
    /// Probe results by URL; absent until first probed.
    pub http: BTreeMap<String, HttpFact>,
    /// What the API server said of the drain's needs; `None` until it answered.
    pub drain_access: Option<Access>,
    /// The pids of kubelet's shutdown delay locks in logind; `None` until listed (empty without
    /// logind: the agent's own lock is then missing too, which it reports on its own).
    pub kubelet_shutdown_locks: Option<Vec<u32>>,
}

/// A gate's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GateState {
    /// It holds.
    Pass,
    /// It does not hold.
    Fail,
    /// Not known yet (watch not synced, node not registered, not probed yet).
    Unknown,
}

/// One gate's state and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateStatus {
    /// [`Gate::name`].
    pub gate: String,
    /// Its state.
    pub state: GateState,
    /// Why, in words.
    pub reason: String,
}

/// The verdict over all gates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Per gate, in config order.
    pub gates: Vec<GateStatus>,
    /// Every gate passes.
    pub all_pass: bool,
    /// The boot deadline has passed without all gates passing.
    pub overdue: bool,
}

impl Verdict {
    /// Names and reasons of the gates that do not pass, for logs and events.
    pub fn failing(&self) -> Vec<String> {
        self.gates
            .iter()
            .filter(|g| g.state != GateState::Pass)
            .map(|g| format!("{} ({})", g.gate, g.reason))
            .collect()
    }
}

/// The gates and how long they may take after boot.
#[derive(Debug, Clone, PartialEq)]
pub struct GateSet {
    /// All must pass.
    pub gates: Vec<Gate>,
    /// Time from the agent's start after which failing gates are reported as overdue.
    pub boot_deadline: Duration,
}

/// Decides every gate from `facts`; `booting_since` is when the agent started waiting.
pub fn evaluate(facts: &Facts, set: &GateSet, booting_since: Instant, now: Instant) -> Verdict {
    let gates: Vec<GateStatus> = set
        .gates
        .iter()
        .map(|g| {
            let (state, reason) = decide(facts, g);
            GateStatus {
                gate: g.name(),
                state,
                reason,
            }
        })
        .collect();
    let all_pass = gates.iter().all(|g| g.state == GateState::Pass);
    let overdue = !all_pass && now.saturating_duration_since(booting_since) >= set.boot_deadline;
    Verdict {
        gates,
        all_pass,
        overdue,
    }
}

fn decide(facts: &Facts, gate: &Gate) -> (GateState, String) {
    use GateState::{Fail, Pass, Unknown};
    match gate {
        Gate::File(f) => match facts.files.get(&f.path) {
            None => (Unknown, "not read yet".into()),
            Some(FileFact::Missing) => (Fail, "missing".into()),
            Some(FileFact::Unreadable(e)) => (Fail, format!("unreadable: {e}")),
            Some(FileFact::Present(content)) => match &f.contains {
                Some(p) if !p.0.is_match(content) => {
                    (Fail, format!("content does not match {:?}", p.0.as_str()))
                }
                Some(p) => (Pass, format!("present, matches {:?}", p.0.as_str())),
                None => (Pass, "present".into()),
            },
        },
        Gate::Pod(p) => match &facts.pods {
            None => (Unknown, "pods on this node not listed yet".into()),
            Some(pods) => {
                let matching: Vec<&PodFact> = pods
                    .iter()
                    .filter(|x| x.namespace == p.namespace && p.selector.matches(&x.labels))
                    .collect();
                if let Some(ready) = matching.iter().find(|x| x.ready && !x.terminating) {
                    (Pass, format!("{}/{} is Ready", ready.namespace, ready.name))
                } else if let Some(first) = matching.first() {
                    (
                        Fail,
                        format!("{}/{} is not Ready", first.namespace, first.name),
                    )
                } else {
                    (Fail, "no such pod on this node".into())
                }
            }
        },
        Gate::NodeCondition(c) => match &facts.node_conditions {
            None => (Unknown, "node not registered yet".into()),
            Some(conds) => {
                let actual = conds.get(&c.type_);
                let shown = actual.map_or("absent", String::as_str);
                let ok = match &c.expect {
                    Expect::Is(s) => actual == Some(s),
                    Expect::IsNot(s) => actual != Some(s),
                };
                (
                    if ok { Pass } else { Fail },
                    format!("{} is {shown}", c.type_),
                )
            }
        },
        Gate::Http(h) => match facts.http.get(&h.url.to_string()) {
            None => (Unknown, "not probed yet".into()),
            Some(HttpFact::Status(code)) if (200..300).contains(code) => {
                (Pass, format!("answered {code}"))
            }
            Some(HttpFact::Status(code)) => (Fail, format!("answered {code}")),
            Some(HttpFact::Failed(e)) => (Fail, e.clone()),
        },
        Gate::DrainAccess => decide_drain_access(facts.drain_access.as_ref()),
        Gate::KubeletShutdownOff => decide_kubelet_lock(facts.kubelet_shutdown_locks.as_deref()),
    }
}

fn decide_drain_access(access: Option<&Access>) -> (GateState, String) {
    use GateState::{Fail, Pass, Unknown};
    match access {
        None => (Unknown, "not checked yet".into()),
        Some(Access::Granted) => (Pass, "granted".into()),
        Some(Access::Unverifiable) => (
            Pass,
            "not verifiable: the API server serves no SelfSubjectAccessReview".into(),
        ),
        Some(Access::Denied(what)) => (
            Fail,
            format!(
                "the drain would be refused: cannot {}; apply packaging/kubernetes/rbac-agent.yaml",
                what.join(", ")
            ),
        ),
    }
}

fn decide_kubelet_lock(pids: Option<&[u32]>) -> (GateState, String) {
    use GateState::{Fail, Pass, Unknown};
    match pids {
        None => (Unknown, "logind's locks not listed yet".into()),
        Some([]) => (Pass, "kubelet holds no shutdown delay lock".into()),
        Some(pids) => (
            Fail,
            format!(
                "kubelet (pid {}) holds a shutdown delay lock: its graceful node shutdown kills pods without evictions at power-off; set shutdownGracePeriod: 0s and shutdownGracePeriodCriticalPods: 0s in its config",
                pids.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
    }
}

#[cfg(test)]
mod tests;
