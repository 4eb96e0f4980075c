//! Surge before evict (opt-in): for a Deployment's pod whose eviction would leave the service
//! with no ready replica, or that its budget would refuse, the drain first asks the Deployment
//! for one more replica, waits until it is Ready elsewhere (the node is cordoned), evicts the
//! pod, then gives the replica back — so the service never drops to zero.
//!
//! Pure: which pods may surge, whether one needs to, when its replacement is ready and what to
//! write back. `exec.rs` reads and scales the Deployment (through its `scale` subresource).
//!
//! Never for a StatefulSet's pod: its replacement has the same name and identity (and volume
//! claims), so it cannot start until this pod is gone, and a temporary extra replica would be a
//! new ordinal with a volume of its own, not a stand-in for this one.

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;

use crate::names::DRAIN_ANNOTATION;

/// [`DRAIN_ANNOTATION`]'s value that asks for a surge before the pod's eviction.
pub const SURGE: &str = "surge";

/// Whether the drain asks for a replacement before evicting a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wish {
    /// No: evict it as any other.
    No,
    /// Yes, through its controller, this `apps/v1` ReplicaSet (and the Deployment that owns it).
    Through(String),
    /// The pod asks for a surge its owner cannot give; evicted as any other, and said once.
    Cannot(String),
}

/// The surge wish of `pod`: annotated [`SURGE`], or every Deployment's pod when the node's
/// configuration says `drain.surge = true`.
pub fn wish(pod: &Pod, surge_all: bool) -> Wish {
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DRAIN_ANNOTATION))
        .is_some_and(|v| v == SURGE);
    if !annotated && !surge_all {
        return Wish::No;
    }
    let controller = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true));
    let name = || {
        format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        )
    };
    match controller {
        Some(c) if c.kind == "ReplicaSet" && c.api_version == "apps/v1" => {
            Wish::Through(c.name.clone())
        }
        _ if !annotated => Wish::No,
        Some(c) if c.kind == "StatefulSet" => Wish::Cannot(format!(
            "{}: {DRAIN_ANNOTATION}={SURGE} is never done for a StatefulSet's pod (its \
             replacement has the same name and cannot start until this pod is gone); evicted \
             without a surge",
            name()
        )),
        Some(c) => Wish::Cannot(format!(
            "{}: {DRAIN_ANNOTATION}={SURGE} needs a Deployment's pod, this one's controller \
             is {} {}; evicted without a surge",
            name(),
            c.kind,
            c.name
        )),
        None => Wish::Cannot(format!(
            "{}: {DRAIN_ANNOTATION}={SURGE} needs a Deployment's pod, this one has no \
             controller; evicted without a surge",
            name()
        )),
    }
}

/// The Deployment (`apps/v1`) that controls a ReplicaSet, if one does.
pub fn deployment_of(rs: &ReplicaSet) -> Option<String> {
    rs.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| {
            r.controller == Some(true) && r.kind == "Deployment" && r.api_version == "apps/v1"
        })
        .map(|r| r.name.clone())
}

/// One more replica asked of a Deployment, and what the drain waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grow {
    /// `spec.replicas` before.
    pub from: i32,
    /// `spec.replicas` the drain set.
    pub to: i32,
    /// `status.readyReplicas` that means the replacement is Ready.
    pub ready_target: i32,
}

/// Whether the Deployment needs a surge before one of its pods is evicted: it does when fewer
/// than two of its replicas are ready (the eviction would leave none), or when the pod's budget
/// allows no disruption now (the eviction would be refused until a replacement exists). Err: why
/// not, in words for the log.
pub fn grow(d: &Deployment, budget_open: bool) -> Result<Grow, String> {
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = d
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    if ready >= 2 && budget_open {
        return Err(format!(
            "{ready} replicas ready and its budget allows a disruption: no surge needed"
        ));
    }
    Ok(Grow {
        from: replicas,
        to: replicas.saturating_add(1),
        ready_target: ready.saturating_add(1),
    })
}

/// Whether the replacement `g` asked for is Ready (the Deployment counts one more ready replica
/// than when the surge began).
pub fn replaced(d: &Deployment, g: &Grow) -> bool {
    d.status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
        >= g.ready_target
}

/// What to write back when the surge ends: `g.from`, unless someone else changed the replica
/// count since the drain set it (then theirs stands, and `None`).
pub fn restore_to(current_replicas: i32, g: &Grow) -> Option<i32> {
    (current_replicas == g.to).then_some(g.from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(annotation: Option<&str>, kind: Option<&str>) -> Pod {
        let mut p = json!({"metadata": {"name": "web-1", "namespace": "ns"}});
        if let Some(a) = annotation {
            p["metadata"]["annotations"] = json!({ DRAIN_ANNOTATION: a });
        }
        if let Some(k) = kind {
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": k,
                "name": "web-7f9c", "uid": "u", "controller": true}]);
        }
        serde_json::from_value(p).expect("pod")
    }

    fn deployment(replicas: i32, ready: i32) -> Deployment {
        serde_json::from_value(json!({"metadata": {"name": "web"},
            "spec": {"replicas": replicas, "selector": {}, "template": {}},
            "status": {"readyReplicas": ready}}))
        .expect("deployment")
    }

    #[test]
    fn who_surges() {
        let rs = Wish::Through("web-7f9c".into());
        assert_eq!(wish(&pod(Some(SURGE), Some("ReplicaSet")), false), rs);
        assert_eq!(wish(&pod(None, Some("ReplicaSet")), true), rs);
        assert_eq!(wish(&pod(None, Some("ReplicaSet")), false), Wish::No);
        assert_eq!(
            wish(&pod(Some("never"), Some("ReplicaSet")), false),
            Wish::No
        );
        // Configured for the node: pods that cannot surge are evicted as always, silently.
        assert_eq!(wish(&pod(None, Some("StatefulSet")), true), Wish::No);
        assert_eq!(wish(&pod(None, None), true), Wish::No);
        // Asked for by the pod: said, naming the pod and why.
        let Wish::Cannot(note) = wish(&pod(Some(SURGE), Some("StatefulSet")), false) else {
            panic!("a StatefulSet's pod never surges");
        };
        assert!(
            note.contains("ns/web-1") && note.contains("StatefulSet"),
            "{note}"
        );
        let Wish::Cannot(note) = wish(&pod(Some(SURGE), None), true) else {
            panic!("a bare pod cannot surge");
        };
        assert!(note.contains("no controller"), "{note}");
    }

    #[test]
    fn when_a_surge_is_needed() {
        let one = Grow {
            from: 1,
            to: 2,
            ready_target: 2,
        };
        assert_eq!(grow(&deployment(1, 1), true), Ok(one));
        // Two ready, but the budget allows nothing: the eviction would wait for a replacement.
        assert_eq!(
            grow(&deployment(2, 2), false),
            Ok(Grow {
                from: 2,
                to: 3,
                ready_target: 3
            })
        );
        assert!(grow(&deployment(3, 2), true).is_err());
        // The pod on the node is not ready: any one ready replacement will do.
        assert_eq!(grow(&deployment(1, 0), true).map(|g| g.ready_target), Ok(1));
        assert!(!replaced(&deployment(2, 1), &one));
        assert!(replaced(&deployment(2, 2), &one));
        assert_eq!(restore_to(2, &one), Some(1));
        assert_eq!(restore_to(5, &one), None, "someone else's count stands");
    }
}
