//! The pure half of a cluster shutdown: which pods stop in which wave, and which cordons
//! `cluster start` lifts. Every question about one pod is the drain's own ([`fate`],
//! [`priority`], [`wave_of`], [`volumes_node_local`], [`PodFacts::stateful`]), so a cluster
//! shutdown and a drain never disagree about a pod.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::config::Wave as Band;
use crate::drain::cordon;
use crate::drain::plan::{
    Fate, LeaveRules, PodFacts, PodRef, RefuseReason, SkipReason, fate, priority,
    volumes_node_local, wave_of,
};

/// What a pod keeps that its stop must not outrun: the order within a priority band.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Nothing beyond its node's own directories: stops first.
    Stateless,
    /// A StatefulSet's pod (its replacement takes its name): after the stateless ones, which may
    /// be its clients.
    Stateful,
    /// A volume whose teardown matters beyond the node (a claim, a CSI or network volume): last,
    /// so storage outlives the apps writing to it.
    Volumes,
}

impl Tier {
    /// A pod's tier.
    pub fn of(pod: &Pod) -> Self {
        if !volumes_node_local(pod) {
            Self::Volumes
        } else if PodFacts::of(pod).stateful() {
            Self::Stateful
        } else {
            Self::Stateless
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Stateless => "stateless",
            Self::Stateful => "stateful",
            Self::Volumes => "with volumes",
        })
    }
}

/// Where a wave comes: compared field by field, so lower bands, then tiers, then priorities go
/// first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WaveKey {
    /// The drain's priority band (`[[drain.waves]]`: system-critical pods last), an index.
    pub band: usize,
    /// Stateless, stateful, with volumes.
    pub tier: Tier,
    /// The pods' effective priority.
    pub priority: i32,
}

impl fmt::Display for WaveKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, priority {} (band {})",
            self.tier, self.priority, self.band
        )
    }
}

/// Pods that stop together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    /// Where it comes.
    pub key: WaveKey,
    /// Its pods, by namespace and name.
    pub pods: Vec<PodRef>,
}

/// Why a running pod is not stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// As a drain skips it (a DaemonSet's, a static pod's mirror, finished): it goes with its
    /// node.
    Skip(SkipReason),
    /// As a drain refuses it (no controller, emptyDir, annotated never): it keeps running until
    /// the power goes, and is there again when its node is back.
    Refuse(RefuseReason),
}

impl fmt::Display for Left {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Skip(r) => write!(f, "left alone: {r}"),
            Self::Refuse(r) => write!(f, "left running: {r}"),
        }
    }
}

/// The order a cluster's workloads stop in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShutdownPlan {
    /// The waves, first first.
    pub waves: Vec<Wave>,
    /// Pods on nodes that are not stopped, and why.
    pub left: Vec<(PodRef, Left)>,
    /// Pods bound to no node (the controllers' replacements, Pending while every node is
    /// cordoned): nothing runs, nothing to stop.
    pub unscheduled: usize,
}

/// Plans a cluster's stop from its pods: each pod on a node that a drain would evict stops in
/// the wave of its [`WaveKey`]; the rest are [`Left`]. `except` are pods (by UID) no longer
/// planned for (they did not stop in their wave's time). Pure.
pub fn plan<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    rules: LeaveRules,
    bands: &[Band],
    daemonset_exists: &dyn Fn(&str, &str) -> bool,
    except: &BTreeSet<String>,
) -> ShutdownPlan {
    let mut out = ShutdownPlan::default();
    let mut waves: BTreeMap<WaveKey, Vec<PodRef>> = BTreeMap::new();
    for pod in pods {
        let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if bound.is_none_or(str::is_empty) {
            out.unscheduled += 1;
            continue;
        }
        let r = PodRef::of(pod);
        if except.contains(&r.uid) {
            continue;
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        match fate(&PodFacts::of(pod), ns, rules, daemonset_exists) {
            Fate::Evict(_) => {
                let p = priority(pod);
                let key = WaveKey {
                    band: wave_of(p, bands),
                    tier: Tier::of(pod),
                    priority: p,
                };
                waves.entry(key).or_default().push(r);
            }
            Fate::Skip(why) => out.left.push((r, Left::Skip(why))),
            Fate::Refuse(why) => out.left.push((r, Left::Refuse(why))),
        }
    }
    out.waves = waves
        .into_iter()
        .map(|(key, mut pods)| {
            pods.sort();
            Wave { key, pods }
        })
        .collect();
    out.left.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// What the shutdown does next, given the plan of the pods there now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Stop this wave.
    Stop(Wave),
    /// These pods are planned where an earlier wave already was: replacements bound to a
    /// cordoned node (they tolerate the cordon). Waves only go forward, or stopping them would
    /// never end: they are reported and left.
    CameBack(Vec<PodRef>),
    /// Nothing left to stop.
    Done,
}

/// The step after the wave `last` (`None`: the first): the plan's first wave, if it comes after
/// `last`. Pure.
pub fn next(plan: ShutdownPlan, last: Option<WaveKey>) -> Next {
    match plan.waves.into_iter().next() {
        None => Next::Done,
        Some(w) if last.is_some_and(|k| w.key <= k) => Next::CameBack(w.pods),
        Some(w) => Next::Stop(w),
    }
}

/// What `cluster start` does to the nodes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StartPlan {
    /// Nodes whose cordon is nodeward's, for the shutdown: lift it.
    pub lift: Vec<String>,
    /// Nodes the shutdown cordoned whose cordon is someone else's now: theirs to lift.
    pub not_ours: Vec<String>,
    /// Nodes the shutdown cordoned that nodeward holds cordoned for another moment now (an
    /// operator's `nodeward cordon --reason`), with that reason: that moment's to lift.
    pub kept: Vec<(String, String)>,
}

/// Which cordons `cluster start` lifts: a node's cordon is lifted only while it is nodeward's
/// ([`cordon::nodeward_cordon`]) and its record gives the shutdown's reason (listed in the
/// intent, `recorded`, or cordoned just before the list was written); one the shutdown took over
/// is given back to its earlier reason by the uncordon. A listed node cordoned since for another
/// reason keeps it. Pure.
pub fn start_plan(nodes: &[Node], recorded: &BTreeSet<String>) -> StartPlan {
    let mut out = StartPlan::default();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let listed = recorded.contains(&name);
        match cordon::nodeward_cordon(node) {
            Some(r) if r.is_for(cordon::Lifter::Reason(super::CORDON_REASON)) => {
                out.lift.push(name);
            }
            Some(r) if listed => out.kept.push((name, r.reason)),
            None if listed && cordon::is_cordoned(node) => out.not_ours.push(name),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests;
