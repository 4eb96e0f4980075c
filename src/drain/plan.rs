//! The pure half of a drain: which pods go, in which wave, and what an eviction answer means.
//!
//! Nothing here talks to the API or reads the clock. `exec.rs` feeds it pods, budgets and answers
//! and acts on what it decides, so every rule below is covered by table tests.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Volume};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::config::Wave;

pub use crate::names::{DRAIN_ANNOTATION, DRAIN_TIMEOUT_ANNOTATION};
/// Annotation kubelet sets on mirror pods of static pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Priority of `system-cluster-critical`; `system-node-critical` is 2000001000.
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Identity of a pod in plans and reports.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, used as an eviction precondition so a same-named replacement is never evicted.
    pub uid: String,
}

impl PodRef {
    /// Reads the identity of a pod.
    pub fn of(pod: &Pod) -> Self {
        Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        }
    }

    /// A reference to the pod, for an Event about it.
    pub fn object_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: Some(self.uid.clone()),
            ..Default::default()
        }
    }

    /// Pods of namespace `default` named (and UID'd) `names`, for tests of reports.
    #[cfg(test)]
    pub(crate) fn defaults(names: &[&str]) -> Vec<Self> {
        names
            .iter()
            .map(|n| Self {
                namespace: "default".into(),
                name: (*n).into(),
                uid: (*n).into(),
            })
            .collect()
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a pod is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// Managed by an `apps/v1` DaemonSet that exists: it would be recreated on this node at once,
    /// and it tolerates the cordon; its controller removes it when the node goes.
    DaemonSet,
    /// A mirror of a static pod: the API cannot delete it; kubelet owns it.
    Mirror,
    /// Already Succeeded or Failed: nothing runs.
    Finished,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::DaemonSet => "managed by a DaemonSet (apps/v1) that exists",
            Self::Mirror => "mirror pod of a static pod",
            Self::Finished => "already finished",
        })
    }
}

/// Why a pod is refused (left on the node and reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseReason {
    /// No controller would recreate it elsewhere (override: `--force` / `drain.force`).
    Unmanaged,
    /// Uses emptyDir; its data would be lost (override: `--delete-emptydir-data`).
    EmptyDir,
    /// Annotated `nodeward.io/drain: never` by its owner (no override).
    Annotated,
    /// Its controller is an `apps/v1` DaemonSet that no longer exists: nothing recreates it
    /// (override: `--force` / `drain.force`, as kubectl drain).
    OrphanedDaemonSet,
}

impl fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unmanaged => {
                "not managed by a controller, so nothing would recreate it (use --force or drain.force)"
            }
            Self::EmptyDir => {
                "uses emptyDir, whose data would be lost (use --delete-emptydir-data or drain.delete_emptydir_data)"
            }
            Self::Annotated => "annotated nodeward.io/drain=never by its owner",
            Self::OrphanedDaemonSet => {
                "its DaemonSet no longer exists, so nothing would recreate it (use --force or drain.force)"
            }
        })
    }
}

/// Why a pod's owner lets it be evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// A controller that recreates it elsewhere (whether or not that controller still exists:
    /// kubectl drain does not look it up either).
    Controller,
    /// A controller of kind `DaemonSet` outside `apps/v1` (an OpenKruise-style daemon set):
    /// nodeward cannot know that it tolerates the cordon or recreates the pod here, so the pod is
    /// evicted as any controller's, as kubectl drain ≥ 1.34 does.
    ForeignDaemonSet,
    /// No controller; evicted because of `--force` / `drain.force`.
    Forced,
    /// Its `apps/v1` DaemonSet is gone; evicted because of `--force` / `drain.force`.
    OrphanForced,
}

/// Which rules let a pod be evicted, for `--dry-run` and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictRule {
    /// What its owner allows.
    pub owner: Owner,
    /// It has emptyDir volumes, whose data the eviction deletes (allowed by
    /// `--delete-emptydir-data`, `drain.delete_emptydir_data` or, for a node that is leaving,
    /// `drain.delete_emptydir_data_on_shutdown`).
    pub deletes_emptydir_data: bool,
}

impl EvictRule {
    /// A controller's pod without emptyDir volumes: the ordinary case.
    pub const PLAIN: Self = Self {
        owner: Owner::Controller,
        deletes_emptydir_data: false,
    };
}

impl fmt::Display for EvictRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.owner {
            Owner::Controller => "managed by a controller",
            Owner::ForeignDaemonSet => {
                "owner is a DaemonSet outside apps/v1, evicted as any controller's pod"
            }
            Owner::Forced => "no controller, evicted because of --force",
            Owner::OrphanForced => "its DaemonSet is gone, evicted because of --force",
        })?;
        if self.deletes_emptydir_data {
            f.write_str("; its emptyDir data is deleted (delete-emptydir-data)")?;
        }
        Ok(())
    }
}

/// What happens to one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Evict in this wave (index into the configured waves).
    Evict {
        /// Wave index.
        wave: usize,
        /// The rules that allowed it.
        rule: EvictRule,
    },
    /// Leave it.
    Skip(SkipReason),
    /// Leave it and report it.
    Refuse(RefuseReason),
}

/// Inputs to the plan that come from config or flags.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// Evict unmanaged pods.
    pub force: bool,
    /// Evict emptyDir pods.
    pub delete_emptydir_data: bool,
    /// Priority waves, ascending `min_priority`.
    pub waves: Vec<Wave>,
    /// Surge every Deployment's pod before its eviction ([`super::surge`]; a pod asks for it
    /// itself with `nodeward.io/drain: surge`).
    pub surge: bool,
}

impl PlanOptions {
    /// The overrides [`fate`] reads.
    pub fn rules(&self) -> LeaveRules {
        LeaveRules {
            force: self.force,
            delete_emptydir_data: self.delete_emptydir_data,
        }
    }
}

/// The longest `nodeward.io/drain-timeout` honoured: a week, the longest deadline any drain has
/// (`drain.timeout` and `--timeout` stop there), inside which a pod's own wait ends, so a longer
/// one could never apply; and far below what overflows an `Instant` it is added to.
pub const MAX_BUDGET_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long the drain waits for the pod's budget before its deadline policy applies to the pod
/// ([`DRAIN_TIMEOUT_ANNOTATION`]), from 0 s to [`MAX_BUDGET_WAIT`]. A value that is not a
/// duration, or is out of that range, is an error naming the pod, the annotation and what is
/// expected: the drain ignores it (the pod waits for its budget until the node's deadline, as one
/// without the annotation) and says so.
pub fn budget_wait(pod: &Pod) -> Result<Option<Duration>, String> {
    let Some(v) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DRAIN_TIMEOUT_ANNOTATION))
    else {
        return Ok(None);
    };
    let said = |why: String| {
        format!(
            "pod {}: annotation {DRAIN_TIMEOUT_ANNOTATION}={v:?} {why}; ignored: the pod waits \
             for its budget until the node's deadline",
            PodRef::of(pod)
        )
    };
    let wait = humantime::parse_duration(v.trim()).map_err(|e| {
        said(format!(
            "is not a duration ({e}); expected a form such as \"90s\" or \"5m\""
        ))
    })?;
    if wait > MAX_BUDGET_WAIT {
        return Err(said(format!(
            "is out of range: expected from 0s to {} (no drain's deadline is longer)",
            humantime::format_duration(MAX_BUDGET_WAIT)
        )));
    }
    Ok(Some(wait))
}

/// The effective priority: `spec.priority`, or for the two system classes their value when the
/// admission plugin that fills it in did not run.
pub fn priority(pod: &Pod) -> i32 {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.priority).unwrap_or_else(|| {
        match spec.and_then(|s| s.priority_class_name.as_deref()) {
            Some("system-node-critical") => SYSTEM_CRITICAL_PRIORITY + 1000,
            Some("system-cluster-critical") => SYSTEM_CRITICAL_PRIORITY,
            _ => 0,
        }
    })
}

/// The wave a priority falls in: the last wave whose `min_priority` it reaches (the first wave
/// also takes anything below its minimum).
pub fn wave_of(priority: i32, waves: &[Wave]) -> usize {
    waves
        .iter()
        .rposition(|w| priority >= w.min_priority)
        .unwrap_or(0)
}

/// `apiVersion` of the only DaemonSets whose pods are skipped.
const DAEMONSET_API_VERSION: &str = "apps/v1";

/// The facts about a pod that decide what happens to it when its node goes, read once from the
/// Pod: the drain plans from them, and the scaler's scale-down reads the same facts (kept in its
/// snapshot) through the same [`fate`], so the two can never disagree about a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PodFacts {
    /// Annotated [`DRAIN_ANNOTATION`]`: never`.
    pub drain_never: bool,
    /// A static pod's mirror ([`MIRROR_ANNOTATION`]).
    pub mirror: bool,
    /// Succeeded or Failed.
    pub finished: bool,
    /// Its controller owner, if any.
    pub controller: Option<ControllerRef>,
    /// Has an emptyDir volume.
    pub empty_dir: bool,
}

/// A pod's controller owner reference, reduced to what [`fate`] reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ControllerRef {
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `name`.
    pub name: String,
}

impl PodFacts {
    /// Whether a StatefulSet owns the pod: its replacement takes the same name (and its claims).
    pub fn stateful(&self) -> bool {
        self.controller
            .as_ref()
            .is_some_and(|c| c.kind == "StatefulSet")
    }

    /// Reads the facts from a Pod.
    pub fn of(pod: &Pod) -> Self {
        let annotations = pod.metadata.annotations.as_ref();
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        Self {
            drain_never: annotations
                .and_then(|a| a.get(DRAIN_ANNOTATION))
                .is_some_and(|v| v == "never"),
            mirror: annotations.is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)),
            finished: matches!(phase, Some("Succeeded" | "Failed")),
            controller: pod
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|r| r.controller == Some(true))
                .map(|r| ControllerRef {
                    api_version: r.api_version.clone(),
                    kind: r.kind.clone(),
                    name: r.name.clone(),
                }),
            empty_dir: pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .is_some_and(|vols| vols.iter().any(|v| v.empty_dir.is_some())),
        }
    }
}

/// Whether a pod on its way out has left its node for everything a drain waits for, though its
/// object is still there. Three things must hold:
/// - it is being deleted, and its containers have stopped for good: its kubelet said so (a
///   terminal phase, which a kubelet ≥ 1.27 writes once it has stopped the containers and the
///   sandbox), or the node itself says so (`containers_running` is `Some(false)`: no container of
///   it has a process; see [`super::cgroups`]). What the kubelet does after that (unmount the
///   volumes, remove the pod's cgroup, remove the object at its next status sync) matters to
///   nobody off the node, except:
/// - no StatefulSet owns it: its replacement takes the same name, so it waits for the object;
/// - every volume is of a kind whose teardown stays on the node ([`node_local`]): a claim's or a
///   CSI volume's unmount must finish before the volume is detached and used elsewhere.
///
/// Otherwise the drain waits for the object's removal, as kubectl drain always does.
pub fn left_node(pod: &Pod, containers_running: Option<bool>) -> bool {
    let facts = PodFacts::of(pod);
    let stopped = pod.metadata.deletion_timestamp.is_some()
        && (facts.finished || containers_running == Some(false));
    stopped && !facts.stateful() && volumes_node_local(pod)
}

/// The one answer to "does this pod have volumes whose teardown matters beyond its node" (a
/// claim, a CSI or network volume): every volume is [`node_local`] or it has none. The drain
/// waits for such a pod's object ([`left_node`]); a cluster shutdown stops such pods last.
pub fn volumes_node_local(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_none_or(|vols| vols.iter().all(node_local))
}

/// Volume kinds whose teardown matters to nobody beyond the node: what the API or another node
/// serves into the pod (ConfigMaps, Secrets, projected tokens, the downward API, an image), and
/// the node's own directories (emptyDir, hostPath).
fn node_local(v: &Volume) -> bool {
    v.config_map.is_some()
        || v.secret.is_some()
        || v.projected.is_some()
        || v.downward_api.is_some()
        || v.empty_dir.is_some()
        || v.host_path.is_some()
        || v.image.is_some()
}

/// The two overrides that change a pod's [`fate`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaveRules {
    /// Evict pods no controller recreates (`--force`, `drain.force`).
    pub force: bool,
    /// Evict pods with emptyDir volumes (`--delete-emptydir-data`, …).
    pub delete_emptydir_data: bool,
}

/// What happens to a pod when its node goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// It is evicted (and recreated elsewhere by its owner, if it has one).
    Evict(EvictRule),
    /// It stays, and goes with the node.
    Skip(SkipReason),
    /// It stays, and keeps the drain from completing.
    Refuse(RefuseReason),
}

/// The one answer to "what happens to this pod when its node goes", for the drain's plan and the
/// scaler's choice of nodes alike. Checked in the order kubectl drain uses, with nodeward's
/// annotation first because an owner's explicit wish beats every flag.
/// `daemonset_exists(namespace, name)` answers from a cache of DaemonSets (never one request per
/// pod).
pub fn fate(
    facts: &PodFacts,
    namespace: &str,
    rules: LeaveRules,
    daemonset_exists: &dyn Fn(&str, &str) -> bool,
) -> Fate {
    if facts.drain_never {
        return Fate::Refuse(RefuseReason::Annotated);
    }
    if facts.mirror {
        return Fate::Skip(SkipReason::Mirror);
    }
    if facts.finished {
        return Fate::Skip(SkipReason::Finished);
    }
    let owner = match owner_verdict(facts, namespace, rules.force, daemonset_exists) {
        Ok(owner) => owner,
        Err(fate) => return fate,
    };
    if facts.empty_dir && !rules.delete_emptydir_data {
        return Fate::Refuse(RefuseReason::EmptyDir);
    }
    Fate::Evict(EvictRule {
        owner,
        deletes_emptydir_data: facts.empty_dir,
    })
}

/// Decides one pod of a drain: its [`fate`], and for an eviction the wave its priority puts it in.
pub fn decide(
    pod: &Pod,
    opts: &PlanOptions,
    daemonset_exists: &dyn Fn(&str, &str) -> bool,
) -> Decision {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    match fate(
        &PodFacts::of(pod),
        namespace,
        opts.rules(),
        daemonset_exists,
    ) {
        Fate::Evict(rule) => Decision::Evict {
            wave: wave_of(priority(pod), &opts.waves),
            rule,
        },
        Fate::Skip(reason) => Decision::Skip(reason),
        Fate::Refuse(reason) => Decision::Refuse(reason),
    }
}

/// What a running pod's controller says: evictable as whose, or a fate that ends the question
/// (skipped as a live DaemonSet's, refused as nobody's).
fn owner_verdict(
    facts: &PodFacts,
    namespace: &str,
    force: bool,
    daemonset_exists: &dyn Fn(&str, &str) -> bool,
) -> Result<Owner, Fate> {
    let Some(c) = &facts.controller else {
        return if force {
            Ok(Owner::Forced)
        } else {
            Err(Fate::Refuse(RefuseReason::Unmanaged))
        };
    };
    if c.kind != "DaemonSet" {
        return Ok(Owner::Controller);
    }
    if c.api_version != DAEMONSET_API_VERSION {
        return Ok(Owner::ForeignDaemonSet);
    }
    match (daemonset_exists(namespace, &c.name), force) {
        (true, _) => Err(Fate::Skip(SkipReason::DaemonSet)),
        (false, true) => Ok(Owner::OrphanForced),
        (false, false) => Err(Fate::Refuse(RefuseReason::OrphanedDaemonSet)),
    }
}

/// One pod's line in a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PodPlan {
    /// The pod.
    pub pod: PodRef,
    /// Its effective priority.
    pub priority: i32,
    /// What happens to it.
    pub decision: Decision,
}

/// A whole node's plan, ordered by wave, then namespace and name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Every pod on the node.
    pub pods: Vec<PodPlan>,
}

impl Plan {
    /// Plans every pod (`daemonset_exists` as for [`decide`]).
    pub fn new<'a>(
        pods: impl IntoIterator<Item = &'a Pod>,
        opts: &PlanOptions,
        daemonset_exists: &dyn Fn(&str, &str) -> bool,
    ) -> Self {
        let mut pods: Vec<PodPlan> = pods
            .into_iter()
            .map(|p| PodPlan {
                pod: PodRef::of(p),
                priority: priority(p),
                decision: decide(p, opts, daemonset_exists),
            })
            .collect();
        let order = |d: &Decision| match d {
            Decision::Evict { wave, .. } => (0, *wave),
            Decision::Refuse(_) => (1, 0),
            Decision::Skip(_) => (2, 0),
        };
        pods.sort_by(|a, b| {
            order(&a.decision)
                .cmp(&order(&b.decision))
                .then_with(|| a.pod.cmp(&b.pod))
        });
        Self { pods }
    }

    /// Pods to evict, with their wave.
    pub fn evictions(&self) -> impl Iterator<Item = (&PodRef, usize)> {
        self.pods.iter().filter_map(|p| match p.decision {
            Decision::Evict { wave, .. } => Some((&p.pod, wave)),
            _ => None,
        })
    }

    /// Refused pods and why.
    pub fn refused(&self) -> impl Iterator<Item = (&PodRef, RefuseReason)> {
        self.pods.iter().filter_map(|p| match p.decision {
            Decision::Refuse(r) => Some((&p.pod, r)),
            _ => None,
        })
    }
}

/// When each wave's share of the deadline ends, as offsets from the drain's start. Shares
/// accumulate, so time a wave does not use passes to the next; the last wave always ends at the
/// overall deadline.
pub fn wave_deadlines(total: Duration, waves: &[Wave]) -> Vec<Duration> {
    let mut acc = 0.0;
    let mut out: Vec<Duration> = waves
        .iter()
        .map(|w| {
            acc += w.share_of_deadline;
            total.mul_f64(acc.min(1.0))
        })
        .collect();
    if let Some(last) = out.last_mut() {
        *last = total;
    }
    out
}

/// How long before the deadline the `delete` fallback starts, leaving that time as the pods'
/// grace period: a tenth of the deadline, at least 1 s and at most 15 s (enough for most pods'
/// SIGTERM handlers, small enough not to cut short a normal eviction).
pub fn fallback_margin(total: Duration) -> Duration {
    (total / 10).clamp(Duration::from_secs(1), Duration::from_secs(15))
}

/// The least grace period the `delete` fallback gives a pod, in seconds: the API server takes
/// `gracePeriodSeconds: 0` as an immediate forced removal (the object goes before the containers
/// are stopped), which a drain never asks for.
pub const MIN_FALLBACK_GRACE_SECONDS: u32 = 1;

/// The grace period of a `delete` fallback's deletion with `left` until the deadline, in the
/// whole seconds the API takes: rounded up, so a pod never gets less than the time left, and at
/// least [`MIN_FALLBACK_GRACE_SECONDS`], so a deletion near (or past) the deadline may outlast it
/// by up to that second.
pub fn fallback_grace(left: Duration) -> u32 {
    let whole = left
        .as_secs()
        .saturating_add(u64::from(left.subsec_nanos() > 0));
    u32::try_from(whole)
        .unwrap_or(u32::MAX)
        .max(MIN_FALLBACK_GRACE_SECONDS)
}

/// Whether a label selector selects a set of labels: the scaler's matcher
/// ([`crate::selector::SelectorView::selects`]), so the two never disagree on which pods a budget
/// covers. An empty selector selects everything, as in policy/v1.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    crate::selector::label_selector_selects(selector, labels)
}

/// The budgets in `namespace` that select a pod with `labels`.
pub fn budgets_for<'a>(
    namespace: &str,
    labels: &BTreeMap<String, String>,
    budgets: impl IntoIterator<Item = &'a PodDisruptionBudget>,
) -> Vec<&'a PodDisruptionBudget> {
    budgets
        .into_iter()
        .filter(|b| b.metadata.namespace.as_deref() == Some(namespace))
        .filter(|b| {
            b.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|sel| selector_matches(sel, labels))
        })
        .collect()
}

/// `namespace/name` of a budget: how the drain names one in its state, logs and Events.
pub fn budget_key(b: &PodDisruptionBudget) -> String {
    format!(
        "{}/{}",
        b.metadata.namespace.as_deref().unwrap_or_default(),
        b.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The budgets that hold a drain of `pods` back now: each budget selecting some of them that
/// allows no disruption at the moment, as "namespace/name allows 0 disruptions now, the drain
/// needs M". Empty: the drain can start evicting under every budget it meets (a coordinated
/// reboot takes its slot only then). A budget allowing fewer than the drain needs is not here:
/// the drain evicts as its replacements become ready, as any drain does; one allowing none now
/// (its pods' replacements not ready yet, another node's drain under way, `minAvailable` equal to
/// the replicas) would keep the drain waiting from its first eviction.
pub fn budgets_short(pods: &[&Pod], budgets: &[PodDisruptionBudget]) -> Vec<String> {
    let mut need: BTreeMap<(String, String), (i32, i32)> = BTreeMap::new();
    for pod in pods {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        for b in budgets_for(ns, &labels, budgets) {
            let key = (ns.to_string(), b.metadata.name.clone().unwrap_or_default());
            let allowed = b.status.as_ref().map_or(0, |s| s.disruptions_allowed);
            need.entry(key).or_insert((allowed, 0)).1 += 1;
        }
    }
    need.into_iter()
        .filter(|(_, (allowed, _))| *allowed < 1)
        .map(|((ns, name), (allowed, needed))| {
            format!("{ns}/{name} allows {allowed} disruptions now, the drain needs {needed}")
        })
        .collect()
}

/// The structured cause a refusal carried (`details.causes[].reason`), never its message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cause {
    /// None that matters to a drain.
    #[default]
    None,
    /// `DisruptionBudget`: how the apiserver marks a 429 that a budget caused, as opposed to
    /// API Priority and Fairness throttling.
    DisruptionBudget,
    /// `NamespaceTerminating`: the NamespaceLifecycle admission plugin refuses every create,
    /// evictions included, in a namespace being deleted.
    NamespaceTerminating,
}

impl Cause {
    /// From the reasons of a Status's `details.causes`.
    pub fn of<'a>(reasons: impl IntoIterator<Item = &'a str>) -> Self {
        let mut cause = Self::None;
        for r in reasons {
            match r {
                "DisruptionBudget" => cause = Self::DisruptionBudget,
                "NamespaceTerminating" => cause = Self::NamespaceTerminating,
                _ => {}
            }
        }
        cause
    }
}

/// What the API said to one eviction, reduced to what a drain needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status code (200/201 for success).
    pub code: u16,
    /// The structured cause.
    pub cause: Cause,
    /// How many budgets select the pod, from nodeward's own view of them.
    pub matching_budgets: usize,
    /// The API's message: for reports, and for a 403 the one place that says who refused
    /// ([`authorizer_denied`]).
    pub message: String,
}

/// The meaning of an eviction answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 200/201: the pod is being deleted.
    Evicted,
    /// 404: the pod is already gone.
    Gone,
    /// 403 with the cause `NamespaceTerminating`: no eviction can succeed in a namespace being
    /// deleted, and the namespace controller deletes the pod anyway: wait for it to go (kubectl
    /// drain also waits rather than fail).
    NamespaceTerminating,
    /// 429 from a budget: wait for its `disruptionsAllowed` to rise.
    BudgetExhausted,
    /// 500 while more than one budget selects the pod: the Eviction API cannot evict it.
    MultipleBudgets,
    /// 403 from the authorizer: the credentials lack `create` on `pods/eviction`, for this pod
    /// and every other.
    Forbidden,
    /// Any other 403: an admission webhook or ValidatingAdmissionPolicy denied this pod's
    /// eviction, NodeRestriction refused a pod bound to another node, or the Eviction API's own
    /// budget checks refused it (a budget whose `disruptionsAllowed` is negative, too many
    /// evictions not confirmed yet). It concerns this pod: refused, and the drain goes on.
    Denied,
    /// 429 not caused by a budget (API server throttling), 409, or 5xx: try again after a backoff.
    Retry,
    /// Any other 4xx: the request is wrong and will stay wrong.
    Rejected,
}

impl Answer {
    /// Classifies the answer by status code and structured cause; a 403's message says only
    /// whether the authorizer refused ([`authorizer_denied`]).
    pub fn outcome(&self) -> Outcome {
        match self.code {
            200 | 201 => Outcome::Evicted,
            404 => Outcome::Gone,
            403 if self.cause == Cause::NamespaceTerminating => Outcome::NamespaceTerminating,
            429 if self.cause == Cause::DisruptionBudget => Outcome::BudgetExhausted,
            500 if self.matching_budgets > 1 => Outcome::MultipleBudgets,
            403 if authorizer_denied(&self.message) => Outcome::Forbidden,
            403 => Outcome::Denied,
            409 | 429 | 500..=599 => Outcome::Retry,
            _ => Outcome::Rejected,
        }
    }
}

/// Whether a 403's message is the authorizer's: the identity lacks the permission, whichever
/// pod it asks for. Nothing structured tells it apart: the authorizer and the admission plugins
/// (NodeRestriction, ValidatingAdmissionPolicy) all answer through `apierrors.NewForbidden`,
/// with reason `Forbidden`, `details.kind` `pods` and no cause reason, and a webhook's 403 says
/// whatever the webhook says. The authorizer's sentence has kept one form since Kubernetes 1.11
/// (`responsewriters.forbiddenMessage`): `User "<name>" cannot <verb> resource "<resource>" …`,
/// after NewForbidden's `<resource> "<name>" is forbidden: `. A denial is an authorizer's only
/// when its sentence starts so: the pods' names cannot hold `forbidden: ` (DNS names), and an
/// admission message starts with its plugin's own words. A 403 nodeward cannot place is a pod's,
/// so a drain never stops for one pod.
pub fn authorizer_denied(message: &str) -> bool {
    let why = message
        .split_once("forbidden: ")
        .map_or(message, |(_, why)| why);
    why.starts_with("User \"") && why.contains("\" cannot ")
}

#[cfg(test)]
mod tests;
