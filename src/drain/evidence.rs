//! The evidence a blocked budget's verdict reads ([`super::unsatisfiable`]), gathered only from
//! the first pod a budget blocks: the cluster's Pending pods and the Nodes (watched), what the
//! blocked pods' owners want (their scale subresource, read while a pod is blocked, at most every
//! [`OWNER_REFRESH`]), and whether an autoscaler is there (asked once).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ReplicationController};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use tokio::time::Instant;
use tracing::debug;

use super::unsatisfiable::{Autoscaler, Wanted};
use crate::store::Mirror;

/// How often the count of a blocked pod's owner is read again while the pod stays blocked.
pub(super) const OWNER_REFRESH: Duration = Duration::from_secs(5);

/// nodeward's scaler's Lease (its `lease_name` default), held while a replica runs.
pub const SCALER_LEASE: (&str, &str) = ("kube-system", "nodeward-scaler");
/// cluster-autoscaler's status ConfigMap (its `--status-config-map-name` default).
pub const CLUSTER_AUTOSCALER_STATUS: (&str, &str) = ("kube-system", "cluster-autoscaler-status");

/// One of the [`Evidence`] watches' events.
pub(super) enum Seen {
    Pending(Box<watcher::Result<watcher::Event<Pod>>>),
    Node(Box<watcher::Result<watcher::Event<Node>>>),
    /// An owner's `spec.replicas`, `None` when it could not be read.
    Scale(Owner, Option<i32>),
    Autoscaler(Autoscaler),
}

/// A pod's controller whose count the drain reads through its scale subresource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Owner {
    namespace: String,
    kind: OwnerKind,
    name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum OwnerKind {
    ReplicaSet,
    StatefulSet,
    ReplicationController,
}

impl Owner {
    /// The pod's controller, if it is of a kind whose scale the drain reads.
    pub(super) fn of(pod: &Pod) -> Option<Self> {
        let r = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))?;
        let kind = match (r.api_version.as_str(), r.kind.as_str()) {
            ("apps/v1", "ReplicaSet") => OwnerKind::ReplicaSet,
            ("apps/v1", "StatefulSet") => OwnerKind::StatefulSet,
            ("v1", "ReplicationController") => OwnerKind::ReplicationController,
            _ => return None,
        };
        Some(Self {
            namespace: pod.metadata.namespace.clone()?,
            kind,
            name: r.name.clone(),
        })
    }

    /// Its `spec.replicas`, read through the scale subresource; `None` when refused or failed.
    async fn replicas(&self, client: Client) -> Option<i32> {
        let (ns, name) = (self.namespace.as_str(), self.name.as_str());
        let scale = match self.kind {
            OwnerKind::ReplicaSet => {
                Api::<ReplicaSet>::namespaced(client, ns)
                    .get_scale(name)
                    .await
            }
            OwnerKind::StatefulSet => {
                Api::<StatefulSet>::namespaced(client, ns)
                    .get_scale(name)
                    .await
            }
            OwnerKind::ReplicationController => {
                Api::<ReplicationController>::namespaced(client, ns)
                    .get_scale(name)
                    .await
            }
        };
        match scale {
            Ok(s) => Some(s.spec.and_then(|s| s.replicas).unwrap_or_default()),
            Err(e) => {
                debug!(owner = ?self, error = %e, "cannot read the owner's replicas; its budget is not judged hopeless");
                None
            }
        }
    }
}

/// What is known of one owner's count.
struct Count {
    asked: Instant,
    replicas: Option<i32>,
}

/// What shows that a budget blocking a pod cannot open ([`super::unsatisfiable`]): the
/// cluster's Pending pods (its missing replicas, and whether the scheduler placed them) and the
/// Nodes (whether any other takes pods). Watched only from the first pod a budget blocks: most
/// drains never meet one. Evidence, not a precondition: a watch the drain may not make (an
/// operator's identity that cannot list Nodes) only means the drain waits, as before.
pub(super) struct Evidence<'a> {
    pub(super) events: SelectAll<BoxStream<'a, Seen>>,
    pub(super) pending: Mirror<Pod>,
    pub(super) nodes: Mirror<Node>,
    owners: BTreeMap<Owner, Count>,
    pub(super) autoscaler: Autoscaler,
    started: bool,
}

impl Evidence<'_> {
    pub(super) fn idle() -> Self {
        let mut events = SelectAll::new();
        // Never empty, so that it never ends: it only waits until the drain starts gathering.
        events.push(futures::stream::pending().boxed());
        Self {
            events,
            pending: Mirror::default(),
            nodes: Mirror::default(),
            owners: BTreeMap::new(),
            autoscaler: Autoscaler::Unknown,
            started: false,
        }
    }

    pub(super) fn start(&mut self, client: &Client) {
        if self.started {
            return;
        }
        self.started = true;
        let pending = watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields("status.phase=Pending"),
        )
        .default_backoff()
        .map(|e| Seen::Pending(Box::new(e)));
        let nodes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .map(|e| Seen::Node(Box::new(e)));
        self.events.push(pending.boxed());
        self.events.push(nodes.boxed());
        let asked = autoscaler(client.clone()).map(Seen::Autoscaler);
        self.events.push(asked.into_stream().boxed());
    }

    /// Reads the count of `owner` (a blocked pod's) unless it was read within [`OWNER_REFRESH`].
    pub(super) fn ask(&mut self, owner: Owner, client: &Client, now: Instant) {
        if self
            .owners
            .get(&owner)
            .is_some_and(|c| now < c.asked + OWNER_REFRESH)
        {
            return;
        }
        let replicas = match self.owners.get(&owner) {
            Some(c) => c.replicas,
            None => None,
        };
        self.owners.insert(
            owner.clone(),
            Count {
                asked: now,
                replicas,
            },
        );
        let client = client.clone();
        let read = async move {
            let n = owner.replicas(client).await;
            Seen::Scale(owner, n)
        };
        self.events.push(read.into_stream().boxed());
    }

    /// What the owner of `pod` wants, as last read.
    pub(super) fn wanted(&self, pod: &Pod) -> Wanted {
        let Some(owner) = Owner::of(pod) else {
            return Wanted::NoOwner;
        };
        match self.owners.get(&owner).and_then(|c| c.replicas) {
            Some(n) => Wanted::Replicas(n),
            None => Wanted::Unknown,
        }
    }

    pub(super) fn apply(&mut self, seen: Seen, node: &str) {
        let error = match seen {
            Seen::Pending(ev) => match *ev {
                Ok(ev) => return self.pending.apply(&ev),
                Err(e) => e,
            },
            Seen::Node(ev) => match *ev {
                Ok(ev) => return self.nodes.apply(&ev),
                Err(e) => e,
            },
            Seen::Scale(owner, replicas) => {
                if let Some(c) = self.owners.get_mut(&owner) {
                    c.replicas = replicas;
                }
                return;
            }
            Seen::Autoscaler(a) => {
                debug!(node, autoscaler = ?a, "whether an autoscaler may add a node");
                self.autoscaler = a;
                return;
            }
        };
        debug!(node, error = %error, "cannot watch what shows a budget cannot open; the drain waits for budgets as before");
    }
}

/// Whether an autoscaler is there that could add a node for a pod no node takes: nodeward's
/// scaler holding its Lease ([`SCALER_LEASE`]), cluster-autoscaler's status ConfigMap
/// ([`CLUSTER_AUTOSCALER_STATUS`]), or any Karpenter NodePool. One yes is enough; a question
/// refused or failed leaves a doubt where no other says yes.
async fn autoscaler(client: Client) -> Autoscaler {
    let (lease_ns, lease) = SCALER_LEASE;
    let scaler = Api::<Lease>::namespaced(client.clone(), lease_ns)
        .get_opt(lease)
        .await
        .map(|l| l.is_some_and(|l| scaler_holds(&l, jiff::Timestamp::now())));
    let (cm_ns, cm) = CLUSTER_AUTOSCALER_STATUS;
    let cluster_autoscaler = Api::<ConfigMap>::namespaced(client.clone(), cm_ns)
        .get_metadata_opt(cm)
        .await
        .map(|c| c.is_some());
    let pools = ApiResource {
        group: "karpenter.sh".into(),
        version: "v1".into(),
        api_version: "karpenter.sh/v1".into(),
        kind: "NodePool".into(),
        plural: "nodepools".into(),
    };
    let karpenter = match Api::<DynamicObject>::all_with(client, &pools)
        .list_metadata(&ListParams::default().limit(1))
        .await
    {
        Ok(l) => Ok(!l.items.is_empty()),
        // No NodePool kind served: Karpenter is not installed.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    };
    let answers = [scaler, cluster_autoscaler, karpenter];
    if answers.iter().any(|a| matches!(a, Ok(true))) {
        Autoscaler::Present
    } else if answers.iter().all(Result::is_ok) {
        Autoscaler::Absent
    } else {
        for e in answers.iter().filter_map(|a| a.as_ref().err()) {
            debug!(error = %e, "cannot tell whether an autoscaler is there; unplaceable replacements are not judged hopeless");
        }
        Autoscaler::Unknown
    }
}

/// Whether nodeward's scaler holds its Lease at `now`: a holder, renewed within its duration
/// (a scaler that stopped cleanly gives the Lease up; one that died lets it lapse).
fn scaler_holds(lease: &Lease, now: jiff::Timestamp) -> bool {
    let Some(spec) = lease.spec.as_ref() else {
        return false;
    };
    let held = spec
        .holder_identity
        .as_deref()
        .is_some_and(|h| !h.is_empty());
    let until = spec.renew_time.as_ref().and_then(|t| {
        t.0.checked_add(jiff::SignedDuration::from_secs(i64::from(
            spec.lease_duration_seconds.unwrap_or(0),
        )))
        .ok()
    });
    held && until.is_some_and(|u| now < u)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn lease(holder: Option<&str>, renewed: &str, seconds: i32) -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": "nodeward-scaler", "namespace": "kube-system"},
            "spec": {"holderIdentity": holder, "renewTime": renewed,
                "leaseDurationSeconds": seconds}
        }))
        .expect("valid lease")
    }

    #[test]
    fn the_scaler_is_there_while_it_holds_its_lease() {
        let now: jiff::Timestamp = "2026-12-05T12:00:00Z".parse().expect("time");
        let cases = [
            (
                "held, renewed 5 s ago",
                lease(Some("a"), "2026-12-05T11:59:55.000000Z", 15),
                true,
            ),
            (
                "held, lapsed",
                lease(Some("a"), "2026-12-05T11:59:40.000000Z", 15),
                false,
            ),
            (
                "given up",
                lease(None, "2026-12-05T11:59:55.000000Z", 15),
                false,
            ),
            (
                "given up (empty)",
                lease(Some(""), "2026-12-05T11:59:55.000000Z", 15),
                false,
            ),
        ];
        for (case, l, there) in cases {
            assert_eq!(scaler_holds(&l, now), there, "{case}");
        }
    }

    fn pod(owner: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "ownerReferences": owner}
        }))
        .expect("valid pod")
    }

    #[test]
    fn the_owners_read_are_the_scalable_controllers() {
        let of = |api: &str, kind: &str, controller: bool| {
            Owner::of(&pod(
                json!([{"apiVersion": api, "kind": kind, "name": "o", "uid": "u",
                "controller": controller}]),
            ))
            .map(|o| o.kind)
        };
        assert_eq!(
            of("apps/v1", "ReplicaSet", true),
            Some(OwnerKind::ReplicaSet)
        );
        assert_eq!(
            of("apps/v1", "StatefulSet", true),
            Some(OwnerKind::StatefulSet)
        );
        assert_eq!(
            of("v1", "ReplicationController", true),
            Some(OwnerKind::ReplicationController)
        );
        assert_eq!(
            of("apps/v1", "ReplicaSet", false),
            None,
            "not its controller"
        );
        assert_eq!(of("batch/v1", "Job", true), None, "no scale read");
        assert_eq!(Owner::of(&pod(json!(null))), None, "a bare pod");
    }
}
