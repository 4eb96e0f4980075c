//! Every guarded write nodeward makes to a Node: read it, decide, patch with the read
//! resourceVersion as a precondition, and on a conflict (someone else wrote the Node in between)
//! read and decide again — so a concurrent change such as an admin's cordon or another
//! controller's taint is never overwritten. One field manager for all of them.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::debug;

use crate::names::FIELD_MANAGER;
/// Conflicting writes retried this many times (kubelet and controllers write Nodes too).
pub const ATTEMPTS: usize = 5;

/// Patch parameters carrying nodeward's field manager.
pub fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

/// One Node condition as nodeward writes it.
#[derive(Debug, Clone, Copy)]
pub struct ConditionPatch<'a> {
    /// `type`, e.g. `nodeward.io/Ready`.
    pub type_: &'a str,
    /// `True` or `False`.
    pub status: bool,
    /// CamelCase reason.
    pub reason: &'a str,
    /// One line for people.
    pub message: &'a str,
    /// RFC 3339: when `status` last flipped.
    pub last_transition: &'a str,
}

/// The Node's condition of type `type_`, if it has one.
pub fn condition<'a>(
    node: &'a Node,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// `True` or `False`, as conditions spell it.
pub fn status_word(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Writes one condition through `nodes/status`: a strategic merge keyed by `type`, so kubelet's
/// conditions and nodeward's others are untouched (NodeRestriction lets a node write its own).
pub async fn write_condition(
    client: &kube::Client,
    node: &str,
    c: &ConditionPatch<'_>,
) -> Result<Node, kube::Error> {
    let patch = json!({"status": {"conditions": [{
        "type": c.type_,
        "status": status_word(c.status),
        "reason": c.reason,
        "message": c.message,
        "lastHeartbeatTime": jiff::Timestamp::now().to_string(),
        "lastTransitionTime": c.last_transition,
    }]}});
    Api::<Node>::all(client.clone())
        .patch_status(node, &patch_params(), &Patch::Strategic(&patch))
        .await
}

/// What a guarded write decided after reading the Node.
pub enum NodeWrite<T> {
    /// Nothing to write: the answer is already known.
    Done(T),
    /// Apply this JSON merge patch, then answer `T`.
    Patch(serde_json::Value, T),
}

/// Why a guarded write failed.
#[derive(Debug)]
pub enum WriteError<E> {
    /// Reading or patching the Node failed.
    Api {
        /// `get` or the caller's action.
        action: &'static str,
        /// The client's error.
        source: kube::Error,
    },
    /// Every attempt conflicted with another writer.
    Conflict,
    /// The decision itself refused.
    Refused(E),
}

impl WriteError<std::convert::Infallible> {
    /// The error of a write whose decision never refuses, as [`NodeError`] says it of `node`.
    pub fn for_node(self, node: &str) -> NodeError {
        match self {
            Self::Api { action, source } => NodeError::Api {
                node: node.into(),
                action,
                source,
            },
            Self::Conflict => NodeError::Conflict { node: node.into() },
            Self::Refused(never) => match never {},
        }
    }
}

/// Reads `node` (or starts from `current`, a fresh copy the caller holds), lets `decide` choose,
/// and applies its merge patch guarded by the read resourceVersion, up to [`ATTEMPTS`] times.
/// Returns the Node as it now is and the decision's answer.
pub async fn write_guarded<T, E>(
    client: &kube::Client,
    node: &str,
    action: &'static str,
    current: Option<Node>,
    decide: impl Fn(&Node) -> Result<NodeWrite<T>, E>,
) -> Result<(Node, T), WriteError<E>> {
    guarded(client, node, action, current, Target::Node, decide).await
}

/// [`write_guarded`] for the Node's `status` subresource: `decide`'s patch is a strategic merge
/// (conditions merge by `type`; a JSON merge patch would replace the whole list).
pub async fn write_status_guarded<T, E>(
    client: &kube::Client,
    node: &str,
    action: &'static str,
    current: Option<Node>,
    decide: impl Fn(&Node) -> Result<NodeWrite<T>, E>,
) -> Result<(Node, T), WriteError<E>> {
    guarded(client, node, action, current, Target::Status, decide).await
}

/// Which part of the Node a guarded write patches.
#[derive(Clone, Copy)]
enum Target {
    /// The Node itself, by JSON merge patch.
    Node,
    /// `nodes/status`, by strategic merge patch.
    Status,
}

/// The loop of [`write_guarded`] and [`write_status_guarded`].
async fn guarded<T, E>(
    client: &kube::Client,
    node: &str,
    action: &'static str,
    current: Option<Node>,
    target: Target,
    decide: impl Fn(&Node) -> Result<NodeWrite<T>, E>,
) -> Result<(Node, T), WriteError<E>> {
    let api: Api<Node> = Api::all(client.clone());
    let mut current = current;
    for _ in 0..ATTEMPTS {
        let n = match current.take() {
            Some(n) => n,
            None => api.get(node).await.map_err(|source| WriteError::Api {
                action: "get",
                source,
            })?,
        };
        let (mut patch, answer) = match decide(&n).map_err(WriteError::Refused)? {
            NodeWrite::Done(answer) => return Ok((n, answer)),
            NodeWrite::Patch(patch, answer) => (patch, answer),
        };
        patch["metadata"]["resourceVersion"] = json!(n.metadata.resource_version);
        let written = match target {
            Target::Node => {
                api.patch(node, &patch_params(), &Patch::Merge(&patch))
                    .await
            }
            Target::Status => {
                api.patch_status(node, &patch_params(), &Patch::Strategic(&patch))
                    .await
            }
        };
        match written {
            Ok(written) => return Ok((written, answer)),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                debug!(node, action, "conflict; re-reading the node");
            }
            Err(source) => return Err(WriteError::Api { action, source }),
        }
    }
    Err(WriteError::Conflict)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `?&` the real API server's audit log shows on nodeward's Node patches
    /// (`/api/v1/nodes/NAME?&fieldManager=nodeward`) is kube-core's, not a URL nodeward builds:
    /// `Request::patch` starts its query with `form_urlencoded::Serializer::new("…/NAME?")`, which
    /// counts the `?` as a pair already written. The API server ignores the empty pair. nodeward
    /// builds no request URL by hand; when kube-core drops the `&`, this fails and can go.
    #[test]
    fn the_stray_ampersand_in_patch_urls_is_kube_cores() {
        let request = kube::core::Request::new("/api/v1/nodes")
            .patch(
                "worker-1",
                &patch_params(),
                &Patch::Merge(serde_json::json!({})),
            )
            .expect("request");
        assert_eq!(
            request.uri().to_string(),
            "/api/v1/nodes/worker-1?&fieldManager=nodeward"
        );
    }
}

/// Errors writing a Node, as the readiness gate and the out-of-service record say them.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The API call failed.
    #[error("cannot {action} node {node}: {source}")]
    Api {
        /// The node.
        node: String,
        /// What was being done.
        action: &'static str,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Another writer kept changing the Node.
    #[error("node {node} kept changing under us ({ATTEMPTS} conflicting writes)")]
    Conflict {
        /// The node.
        node: String,
    },
}

impl NodeError {
    /// The HTTP status the API answered, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Api {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            Self::Api { .. } | Self::Conflict { .. } => None,
        }
    }
}
