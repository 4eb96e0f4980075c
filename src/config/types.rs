//! Value types of the config whose validation happens while deserializing, so a bad value is
//! reported with the file and line it was written on.

use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};

use crate::validate;

/// A duration written as a string (`"90s"`), not yet checked against its key's bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ConfigDuration(pub(crate) Duration);

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        validate::duration(&s)
            .map(ConfigDuration)
            .map_err(|form| de::Error::custom(format!("invalid duration {s:?}: expected {form}")))
    }
}

/// A week, the longest any wait or deadline in the config may be: longer is a typo, and
/// `Instant + duration` near `Duration::MAX` panics.
const WEEK_S: u64 = 7 * 24 * 3600;

/// A duration within `MIN_MS` milliseconds and `MAX_S` seconds, both inclusive: every duration
/// key has one of the aliases below, so none can be zero where zero panics a timer, or so large
/// that adding it to an instant overflows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BoundedDuration<const MIN_MS: u64, const MAX_S: u64>(pub(crate) Duration);

/// A probe or pass interval, or one request's timeout: from 100ms to 1h.
pub(crate) type Period = BoundedDuration<100, 3600>;
/// A margin or delay where zero means none: from 0s to 7 days.
pub(crate) type Wait = BoundedDuration<0, WEEK_S>;
/// A deadline: from 1s to 7 days.
pub(crate) type Deadline = BoundedDuration<1000, WEEK_S>;

impl<const MIN_MS: u64, const MAX_S: u64> BoundedDuration<MIN_MS, MAX_S> {
    /// Parses and range-checks `s`; the error says the expected form or the bounds.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let t = validate::duration(s)
            .map_err(|form| format!("invalid duration {s:?}: expected {form}"))?;
        let (min, max) = (Duration::from_millis(MIN_MS), Duration::from_secs(MAX_S));
        if (min..=max).contains(&t) {
            Ok(Self(t))
        } else {
            Err(format!(
                "duration {s:?} is out of range: expected from {} to {}",
                humantime::format_duration(min),
                humantime::format_duration(max)
            ))
        }
    }
}

impl<'de, const MIN_MS: u64, const MAX_S: u64> Deserialize<'de> for BoundedDuration<MIN_MS, MAX_S> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(&String::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// A Node name (RFC 1123 subdomain).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeName(pub(crate) String);

impl<'de> Deserialize<'de> for NodeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        validate::dns_subdomain(&s)
            .map(|()| NodeName(s.clone()))
            .map_err(|form| de::Error::custom(format!("invalid node name {s:?}: expected {form}")))
    }
}

/// What the drain engine does when its deadline nears with pods still on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDeadline {
    /// Stop, report the pods left, and let the shutdown proceed.
    Abandon,
    /// Delete the remaining pods with the time left as grace period, bypassing PDBs (loudly).
    Delete,
    /// Keep waiting past the deadline; only meaningful for the one-shot CLI.
    Wait,
}

impl OnDeadline {
    /// The value as the configuration spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Abandon => "abandon",
            Self::Delete => "delete",
            Self::Wait => "wait",
        }
    }
}

/// What the drain does with a pod whose budget refused its eviction and can be shown never to
/// allow it before the deadline ([`crate::drain::unsatisfiable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnsatisfiableBudgets {
    /// Apply the deadline policy (`on_deadline`) to it now: the same outcome, sooner.
    Act,
    /// Say so, and keep waiting until the deadline (an autoscaler the drain does not recognise
    /// may open the budget after all).
    Wait,
}

/// One priority wave: pods with `spec.priority >= min_priority` (and below the next wave's)
/// are evicted together, within `share_of_deadline` of the overall deadline.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wave {
    /// Lowest pod priority in this wave.
    pub min_priority: i32,
    /// Fraction of the drain deadline this wave may use, in (0, 1].
    pub share_of_deadline: f64,
}

/// `system-cluster-critical`'s priority value; pods at or above it leave last.
const SYSTEM_CLUSTER_CRITICAL: i32 = 2_000_000_000;

/// Default waves: ordinary workloads get most of the deadline, critical system pods (DNS,
/// network agents that are not DaemonSets) go last so the node keeps serving while the rest leave.
pub(crate) fn default_waves() -> Vec<Wave> {
    vec![
        Wave {
            min_priority: i32::MIN,
            share_of_deadline: 0.7,
        },
        Wave {
            min_priority: SYSTEM_CLUSTER_CRITICAL,
            share_of_deadline: 0.3,
        },
    ]
}

/// The wave list, validated as a whole: priorities strictly ascending, shares in (0, 1] summing to
/// at most 1.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Waves(pub(crate) Vec<Wave>);

/// Shares may add up to 1 within floating-point rounding of decimal literals.
const SHARE_SUM_TOLERANCE: f64 = 1e-9;

impl<'de> Deserialize<'de> for Waves {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let waves = Vec::<Wave>::deserialize(d)?;
        if waves.is_empty() {
            return Err(de::Error::custom(
                "at least one wave is needed, e.g. [{ min_priority = -2147483648, share_of_deadline = 1.0 }]",
            ));
        }
        for pair in waves.windows(2) {
            if pair[0].min_priority >= pair[1].min_priority {
                return Err(de::Error::custom(format!(
                    "waves must be listed by strictly ascending min_priority ({} then {})",
                    pair[0].min_priority, pair[1].min_priority
                )));
            }
        }
        for w in &waves {
            if !(w.share_of_deadline > 0.0 && w.share_of_deadline <= 1.0) {
                return Err(de::Error::custom(format!(
                    "share_of_deadline {} is out of range: expected a number in (0, 1]",
                    w.share_of_deadline
                )));
            }
        }
        let sum: f64 = waves.iter().map(|w| w.share_of_deadline).sum();
        if sum > 1.0 + SHARE_SUM_TOLERANCE {
            return Err(de::Error::custom(format!(
                "the waves' share_of_deadline values add up to {sum}, more than 1"
            )));
        }
        Ok(Waves(waves))
    }
}

/// A positive count (`concurrency`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Positive(pub(crate) u32);

impl<'de> Deserialize<'de> for Positive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)?;
        u32::try_from(n)
            .ok()
            .filter(|n| *n > 0)
            .map(Positive)
            .ok_or_else(|| {
                de::Error::custom(format!(
                    "{n} is out of range: expected a whole number from 1 to {}",
                    u32::MAX
                ))
            })
    }
}

/// Who removes the startup taint when the readiness gates pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TaintOwner {
    /// The readiness controller (`nodeward controller`), from the `nodeward.io/Ready` condition
    /// the agent reports. The only choice under the NodeRestriction admission plugin when the
    /// agent uses the kubelet's identity, which may not change its own Node's taints.
    Controller,
    /// The agent itself, besides reporting the condition: only for an agent with its own
    /// identity (not `system:node:NAME`) in a cluster without the controller.
    Agent,
}

/// What the agent does when logind announces a shutdown of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ShutdownPolicy {
    /// Cordon and evict every pod (within the deadline), then let the shutdown go on.
    Drain,
    /// Only cordon, so nothing new is scheduled; the pods die with the machine.
    Cordon,
    /// Do nothing; release the lock at once.
    Nothing,
}
