//! What a drain needs the API server to allow, and asking it before the drain is needed.
//!
//! A drain refused for want of a permission is found out at the worst moment: on a real node
//! without the agent's RBAC (packaging/kubernetes/rbac-agent.yaml), the first drain ever run was
//! the one at power-off; its PodDisruptionBudget list came back 403, the lock was released and
//! systemd stopped every container at once. So the agent asks at startup, with one
//! SelfSubjectAccessReview per need (any authenticated user may), and reports a missing one as a
//! failing readiness gate: the node takes no workload whose leave would not be graceful.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

/// One thing the drain does through the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// The verb.
    pub verb: &'static str,
    /// The API group ("" for core).
    pub group: &'static str,
    /// The resource.
    pub resource: &'static str,
    /// The subresource, or "".
    pub subresource: &'static str,
    /// Asked about the own Node by name (nodes are cluster-scoped; the rest across namespaces).
    pub own_node: bool,
}

impl Need {
    /// `list poddisruptionbudgets.policy`, `create pods/eviction`, `patch nodes/NAME`.
    pub fn describe(&self, node: &str) -> String {
        let mut what = self.resource.to_string();
        if !self.group.is_empty() {
            what = format!("{what}.{}", self.group);
        }
        if !self.subresource.is_empty() {
            what = format!("{what}/{}", self.subresource);
        }
        if self.own_node {
            what = format!("{what} {node}");
        }
        format!("{} {what}", self.verb)
    }
}

const fn need(verb: &'static str, group: &'static str, resource: &'static str) -> Need {
    Need {
        verb,
        group,
        resource,
        subresource: "",
        own_node: false,
    }
}

/// Everything the drain engine (`exec.rs`) calls: cordon, list and watch the node's pods, evict,
/// list and watch budgets and DaemonSets. The same list as rbac-agent.yaml's drain rules, whose
/// test (`each_rule_of_the_shipped_agent_rbac_is_needed`) removes each and sees the drain fail.
pub const DRAIN_NEEDS: &[Need] = &[
    Need {
        own_node: true,
        ..need("patch", "", "nodes")
    },
    need("list", "", "pods"),
    need("watch", "", "pods"),
    Need {
        subresource: "eviction",
        ..need("create", "", "pods")
    },
    need("list", "policy", "poddisruptionbudgets"),
    need("watch", "policy", "poddisruptionbudgets"),
    need("list", "apps", "daemonsets"),
    need("watch", "apps", "daemonsets"),
];

pub use crate::gate::Access;

/// Asks the API server about every need, as the client's identity. An error other than 404 is
/// returned for the caller to retry; a 404 means the API is not served ([`Access::Unverifiable`]).
pub async fn check(client: &kube::Client, node: &str) -> Result<Access, kube::Error> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut denied = Vec::new();
    for n in DRAIN_NEEDS {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(n.verb.into()),
                    group: Some(n.group.into()),
                    resource: Some(n.resource.into()),
                    subresource: (!n.subresource.is_empty()).then(|| n.subresource.into()),
                    name: n.own_node.then(|| node.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &review).await {
            Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => denied.push(n.describe(node)),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Access::Unverifiable),
            Err(e) => return Err(e),
        }
    }
    Ok(if denied.is_empty() {
        Access::Granted
    } else {
        Access::Denied(denied)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_read_as_kubectl_auth_can_i_would_name_them() {
        let shown: Vec<String> = DRAIN_NEEDS.iter().map(|n| n.describe("n1")).collect();
        assert_eq!(
            shown,
            [
                "patch nodes n1",
                "list pods",
                "watch pods",
                "create pods/eviction",
                "list poddisruptionbudgets.policy",
                "watch poddisruptionbudgets.policy",
                "list daemonsets.apps",
                "watch daemonsets.apps",
            ]
        );
    }
}
