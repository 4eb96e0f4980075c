//! What a running drain waits on, in one line, decided purely from the schedule's pods, the
//! budgets and `now`: the Node's `nodeward.io/Draining` condition says it, so that
//! `kubectl describe node` answers "why is this node still draining?" without digging through
//! pods and budgets by hand.
//!
//! The condition is rewritten when what blocks the drain changes ([`Explanation::same_cause`]), at
//! most once per [`MIN_WRITE_GAP`], and otherwise every [`REFRESH`] so its timers stay near the
//! truth; a write never waits in the drain's loop.

use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::NodeCondition;
use tokio::time::Instant;

use super::plan::PodRef;
use super::step::{DrainOutcome, PodState, Tracked, later};

/// The Node condition a drain keeps: `True` while it runs, `False` with the outcome after.
pub const CONDITION_TYPE: &str = "nodeward.io/Draining";
/// At most one condition write per this gap (the API server and the Node's watchers pay for
/// each write).
pub const MIN_WRITE_GAP: Duration = Duration::from_secs(1);
/// Rewritten this often while nothing changes, so the message's timers stay close.
pub const REFRESH: Duration = Duration::from_secs(15);

/// What the drain waits on, most telling first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// A budget refused a pod's eviction and cannot allow it before the deadline
    /// ([`super::unsatisfiable`]); the drain waits on for it all the same (`on_deadline = wait`
    /// or `unsatisfiable_budgets = wait`).
    BudgetUnsatisfiable,
    /// A budget refused at least one pod's eviction: the drain waits for it to allow one.
    WaitingForBudget,
    /// A surge asked a Deployment for a replacement: the drain waits for it to be Ready.
    WaitingForReplacement,
    /// Evictions are being sent or answered.
    Evicting,
    /// The API server failed evictions; they are retried with back-off.
    WaitingForRetry,
    /// Every pod left was evicted; the drain waits for them to terminate.
    WaitingForTermination,
}

impl Reason {
    /// The condition's `reason`, in CamelCase as Kubernetes reasons are.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BudgetUnsatisfiable => "BudgetUnsatisfiable",
            Self::WaitingForBudget => "WaitingForBudget",
            Self::WaitingForReplacement => "WaitingForReplacement",
            Self::Evicting => "Evicting",
            Self::WaitingForRetry => "WaitingForRetry",
            Self::WaitingForTermination => "WaitingForTermination",
        }
    }
}

/// The pod that has waited longest for a budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocker {
    /// The pod.
    pub pod: PodRef,
    /// The budgets (`namespace/name`) that select it.
    pub budgets: Vec<String>,
    /// Disruptions the first of them allows now, when the drain's view of it knows.
    pub allowed: Option<i32>,
    /// How long the pod has been refused.
    pub waited: Duration,
    /// Why its budget cannot allow its eviction, when the drain can show it cannot.
    pub unsatisfiable: Option<String>,
}

/// A running drain, explained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// What it waits on.
    pub reason: Reason,
    /// Pods not gone yet (refused ones excluded: the drain does not wait for them).
    pub left: usize,
    /// Of those, how many are to be evicted or have an eviction in flight.
    pub evicting: usize,
    /// Of those, how many wait to retry after an API error.
    pub retrying: usize,
    /// Of those, how many were evicted and are terminating.
    pub terminating: usize,
    /// Of those, how many wait for their surge's replacement to be Ready.
    pub replacing: usize,
    /// Every pod a budget blocks, longest first.
    pub blocked_pods: Vec<Blocker>,
    /// Time to the deadline; `None` once it has passed.
    pub deadline_in: Option<Duration>,
}

/// Explains the drain at `now` from its tracked pods. `selecting(pod)` names the budgets
/// (`namespace/name`) that select a pod in the drain's view of them now, and `allowed(budget)`
/// is a budget's `disruptionsAllowed` there (`None` if unknown). The budgets are asked now, not
/// taken from the refusal: the first refusals can come back before the drain has listed them.
pub fn explain<'a>(
    pods: impl IntoIterator<Item = &'a Tracked>,
    now: Instant,
    deadline: Instant,
    selecting: &dyn Fn(&Tracked) -> Vec<String>,
    allowed: &dyn Fn(&str) -> Option<i32>,
) -> Explanation {
    let (mut left, mut evicting, mut retrying, mut terminating, mut replacing) = (0, 0, 0, 0, 0);
    let mut refused: Vec<(Instant, &Tracked, &[String])> = Vec::new();
    for t in pods {
        match &t.state {
            PodState::Gone | PodState::Refused(_) | PodState::GaveUp => continue,
            PodState::Pending | PodState::InFlight => evicting += 1,
            PodState::Backoff { .. } => retrying += 1,
            PodState::Leaving => terminating += 1,
            PodState::Surging { .. } => replacing += 1,
            PodState::Blocked { since, budgets } => refused.push((*since, t, budgets)),
        }
        left += 1;
    }
    let reason = if refused.iter().any(|(_, t, _)| t.unsatisfiable.is_some()) {
        Reason::BudgetUnsatisfiable
    } else if !refused.is_empty() {
        Reason::WaitingForBudget
    } else if replacing > 0 {
        Reason::WaitingForReplacement
    } else if evicting > 0 {
        Reason::Evicting
    } else if retrying > 0 {
        Reason::WaitingForRetry
    } else {
        Reason::WaitingForTermination
    };
    let blocked_pods = blockers(refused, now, selecting, allowed);
    Explanation {
        reason,
        left,
        evicting,
        retrying,
        terminating,
        replacing,
        blocked_pods,
        deadline_in: (now < deadline).then(|| deadline - now),
    }
}

/// The blocked pods, longest-blocked first, each with the budgets that select it in the drain's
/// view of them now (the refusal's, while that view knows none).
fn blockers(
    mut refused: Vec<(Instant, &Tracked, &[String])>,
    now: Instant,
    selecting: &dyn Fn(&Tracked) -> Vec<String>,
    allowed: &dyn Fn(&str) -> Option<i32>,
) -> Vec<Blocker> {
    refused.sort_by(|a, b| (a.0, &a.1.pod).cmp(&(b.0, &b.1.pod)));
    refused
        .into_iter()
        .map(|(since, t, refused_by)| {
            let now_selecting = selecting(t);
            let budgets = if now_selecting.is_empty() {
                refused_by.to_vec()
            } else {
                now_selecting
            };
            Blocker {
                pod: t.pod.clone(),
                allowed: budgets.first().and_then(|b| allowed(b)),
                budgets,
                waited: now.saturating_duration_since(since),
                unsatisfiable: t.unsatisfiable.as_ref().map(ToString::to_string),
            }
        })
        .collect()
}

/// A running drain as the agent's status file keeps it (`nodeward status`): what it waits on,
/// every pod a budget blocks and since when, and the deadline — wall-clock times, so that a
/// reader later can say how long.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Progress {
    /// The condition's reason.
    pub reason: String,
    /// The condition's message.
    pub message: String,
    /// Every pod a budget blocks, longest first.
    pub blocked: Vec<BlockedPod>,
    /// When the deadline falls (RFC 3339); `None` once it has passed.
    pub deadline_at: Option<String>,
}

/// One blocked pod in [`Progress`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlockedPod {
    /// `namespace/name`.
    pub pod: String,
    /// The budgets (`namespace/name`) that select it.
    pub budgets: Vec<String>,
    /// Disruptions the first of them allows, when known.
    pub allowed: Option<i32>,
    /// Since when a budget has refused it (RFC 3339).
    pub since: String,
    /// Why its budget cannot allow its eviction, when the drain can show it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsatisfiable: Option<String>,
}

impl Progress {
    /// `e` at the wall-clock time `wall_now`.
    pub fn of(e: &Explanation, wall_now: jiff::Timestamp) -> Self {
        // `wall_now` moved by `d` (back when `ago`), to the second, as RFC 3339.
        let shifted = |d: Duration, ago: bool| {
            let d = jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::ZERO);
            let t = if ago {
                wall_now.checked_sub(d)
            } else {
                wall_now.checked_add(d)
            };
            let t = t.unwrap_or(wall_now);
            t.round(jiff::Unit::Second).unwrap_or(t).to_string()
        };
        Self {
            reason: e.reason.as_str().to_string(),
            message: e.to_string(),
            blocked: e
                .blocked_pods
                .iter()
                .map(|b| BlockedPod {
                    pod: b.pod.to_string(),
                    budgets: b.budgets.clone(),
                    allowed: b.allowed,
                    since: shifted(b.waited, true),
                    unsatisfiable: b.unsatisfiable.clone(),
                })
                .collect(),
            deadline_at: e.deadline_in.map(|d| shifted(d, false)),
        }
    }

    /// The blocked pods in words at `now`, one line each: `ns/pod by PDB ns/b (0 disruptions
    /// allowed) for 42 s`.
    pub fn blocked_lines(&self, now: jiff::Timestamp) -> Vec<String> {
        self.blocked
            .iter()
            .map(|b| {
                let budgets = if b.budgets.is_empty() {
                    "a PodDisruptionBudget".to_string()
                } else {
                    format!("PDB {}", b.budgets.join(", "))
                };
                let allows = b.allowed.map_or_else(String::new, allows);
                let waited = b
                    .since
                    .parse::<jiff::Timestamp>()
                    .ok()
                    .map_or_else(String::new, |t| {
                        format!(" for {} s", (now.as_second() - t.as_second()).max(0))
                    });
                let hopeless = b
                    .unsatisfiable
                    .as_ref()
                    .map_or_else(String::new, |why| format!("; cannot open: {why}"));
                format!("{} by {budgets}{allows}{waited}{hopeless}", b.pod)
            })
            .collect()
    }
}

/// ` (N disruptions allowed)`, as the condition and the status say a budget's allowance.
fn allows(a: i32) -> String {
    format!(" ({a} disruption{} allowed)", if a == 1 { "" } else { "s" })
}

impl Explanation {
    /// How many pods a budget refused.
    pub fn blocked(&self) -> usize {
        self.blocked_pods.len()
    }

    /// The longest-blocked pod, when a budget blocks any.
    pub fn blocker(&self) -> Option<&Blocker> {
        self.blocked_pods.first()
    }

    /// Whether `other` says the same but for its timers: the reason, the counts, the blocking
    /// pod and its budget's allowance. When not, the condition is rewritten at once.
    pub fn same_cause(&self, other: &Self) -> bool {
        fn blocker(e: &Explanation) -> Option<(&PodRef, Option<i32>)> {
            e.blocker().map(|b| (&b.pod, b.allowed))
        }
        self.reason == other.reason
            && self.left == other.left
            && self.blocked() == other.blocked()
            && self.replacing == other.replacing
            && blocker(self) == blocker(other)
            && self.deadline_in.is_some() == other.deadline_in.is_some()
    }
}

/// Whole seconds, as people read them on a condition.
fn secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_millis() >= 500)
}

impl fmt::Display for Explanation {
    /// e.g. `3 pods left; default/web-7f9c blocked by PDB default/web (0 disruptions allowed)
    /// for 42 s, 2 pods blocked in all; deadline in 78 s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        write!(f, "{} pod{} left", self.left, plural(self.left))?;
        if let Some(b) = self.blocker() {
            if b.budgets.is_empty() {
                write!(f, "; {} blocked by a PodDisruptionBudget", b.pod)?;
            } else {
                write!(f, "; {} blocked by PDB {}", b.pod, b.budgets.join(", "))?;
            }
            if let Some(a) = b.allowed {
                f.write_str(&allows(a))?;
            }
            write!(f, " for {} s", secs(b.waited))?;
            if self.blocked() > 1 {
                write!(f, ", {} pods blocked in all", self.blocked())?;
            }
        }
        if let Some((b, why)) = self
            .blocked_pods
            .iter()
            .find_map(|b| Some((b, b.unsatisfiable.as_ref()?)))
        {
            write!(f, "; budget unsatisfiable for {}: {why}", b.pod)?;
        }
        if self.replacing > 0 {
            write!(
                f,
                "; {} pod{} waiting for a replacement to be Ready elsewhere (surge)",
                self.replacing,
                plural(self.replacing)
            )?;
        }
        match self.deadline_in {
            Some(d) => write!(f, "; deadline in {} s", secs(d)),
            None => f.write_str("; deadline passed, still waiting"),
        }
    }
}

/// The Node's [`CONDITION_TYPE`] condition, if a drain ever wrote one.
pub fn condition(node: &k8s_openapi::api::core::v1::Node) -> Option<&NodeCondition> {
    crate::node_write::condition(node, CONDITION_TYPE)
}

/// The condition in words for `nodeward status` at `now`: a running drain with what it waits
/// on and how fresh that is (the message's timers are rewritten every [`REFRESH`] at most), or
/// how the last one ended and when.
pub fn describe(c: &NodeCondition, now: jiff::Timestamp) -> String {
    let at = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.map(|t| t.0.to_string()).unwrap_or_else(|| "?".into())
    };
    let age = c
        .last_heartbeat_time
        .as_ref()
        .and_then(|t| (now.as_second() - t.0.as_second()).try_into().ok())
        .map_or_else(String::new, |s: u64| format!(" (said {s} s ago)"));
    let reason = c.reason.as_deref().unwrap_or("?");
    let message = c.message.as_deref().unwrap_or_default();
    if c.status == "True" {
        format!(
            "draining since {}: {reason}: {message}{age}",
            at(c.last_transition_time.as_ref())
        )
    } else {
        format!(
            "not draining; the last drain ended {}: {reason}: {message}",
            at(c.last_transition_time.as_ref())
        )
    }
}

/// The condition's `reason` once the drain is over.
pub fn outcome_reason(outcome: DrainOutcome) -> &'static str {
    match outcome {
        DrainOutcome::Drained => "Drained",
        DrainOutcome::Refused => "DrainedExceptRefused",
        DrainOutcome::DeadlineExceeded => "DeadlineExceeded",
        DrainOutcome::BudgetUnsatisfiable => "BudgetUnsatisfiable",
        DrainOutcome::Cancelled => "DrainCancelled",
    }
}

/// The earliest time to write the condition, given the last write (`None`: now): when the key
/// changed, [`MIN_WRITE_GAP`] after the last write; else [`REFRESH`] after it.
pub fn write_at(last: Option<Instant>, changed: bool) -> Option<Instant> {
    match last {
        None => None,
        Some(at) if changed => Some(later(at, MIN_WRITE_GAP)),
        Some(at) => Some(later(at, REFRESH)),
    }
}

#[cfg(test)]
mod tests;
