//! The few writes the agent makes to its own Node: the startup taint, and Events.

use k8s_openapi::api::core::v1::{Node, ObjectReference, Taint};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::{debug, info};

use super::state::CordonView;
use crate::drain::cordon;
use crate::render::values::STARTUP_TAINT_KEY;

/// The startup taint's effect: new pods stay away, running ones (DaemonSets) stay.
pub const STARTUP_TAINT_EFFECT: &str = "NoSchedule";
/// Conflicting writes to the Node retried this many times (kubelet updates it too).
const PATCH_ATTEMPTS: usize = 5;
/// Field manager for the agent's writes.
const FIELD_MANAGER: &str = "nodeward-agent";

/// Errors writing the Node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
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
    #[error("node {node} kept changing under us ({PATCH_ATTEMPTS} conflicting writes)")]
    Conflict {
        /// The node.
        node: String,
    },
}

/// Whether the Node carries the startup taint.
pub fn has_startup_taint(n: &Node) -> bool {
    taints(n).iter().any(is_startup_taint)
}

fn taints(n: &Node) -> Vec<Taint> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

fn is_startup_taint(t: &Taint) -> bool {
    t.key == STARTUP_TAINT_KEY && t.effect == STARTUP_TAINT_EFFECT
}

/// Who cordoned `n`, relative to the boot at `boot_time` and this agent's own shutdown cordon.
pub fn cordon_view(n: &Node, boot_time: Option<jiff::Timestamp>, own_cordon: bool) -> CordonView {
    if !cordon::is_cordoned(n) {
        return CordonView::NotCordoned;
    }
    let Some(rec) = cordon::record(n) else {
        return CordonView::Other;
    };
    let at: Option<jiff::Timestamp> = rec.at.parse().ok();
    match (at, boot_time) {
        // Only a cordon made for a shutdown is lifted after the reboot; an operator's drain
        // before a reboot stays until they lift it.
        (Some(at), Some(boot)) if at < boot && rec.shutdown => CordonView::OursBeforeBoot,
        _ => CordonView::OursThisBoot {
            by_this_agent: own_cordon,
        },
    }
}

/// Who cordoned `n`, in words, for `nodeward status`.
pub fn cordon_owner(n: &Node) -> Option<String> {
    if !cordon::is_cordoned(n) {
        return None;
    }
    Some(match cordon::record(n) {
        Some(r) => format!("nodeward ({}, at {})", r.reason, r.at),
        None => cordon::cordoned_by_manager(n).unwrap_or_else(|| "someone else".into()),
    })
}

/// Adds (`add`) or removes the startup taint; returns the Node as it now is and whether this
/// call wrote it (`false`: there was nothing to change, the Node is as read).
#[tracing::instrument(skip(client), err)]
pub async fn set_startup_taint(
    client: &kube::Client,
    node: &str,
    add: bool,
) -> Result<(Node, bool), Error> {
    let api: Api<Node> = Api::all(client.clone());
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    for _ in 0..PATCH_ATTEMPTS {
        let current = api.get(node).await.map_err(|source| Error::Api {
            node: node.into(),
            action: "get",
            source,
        })?;
        let mut list = taints(&current);
        let present = list.iter().any(is_startup_taint);
        if present == add {
            return Ok((current, false));
        }
        if add {
            list.push(Taint {
                key: STARTUP_TAINT_KEY.into(),
                effect: STARTUP_TAINT_EFFECT.into(),
                ..Taint::default()
            });
        } else {
            list.retain(|t| !is_startup_taint(t));
        }
        // A merge patch replaces the list whole; the resourceVersion makes it fail with 409
        // instead of dropping a taint someone else added in between.
        let patch = json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "spec": {"taints": if list.is_empty() { serde_json::Value::Null } else { json!(list) }},
        });
        match api.patch(node, &params, &Patch::Merge(&patch)).await {
            Ok(n) => {
                info!(
                    node,
                    taint = STARTUP_TAINT_KEY,
                    added = add,
                    "startup taint changed"
                );
                return Ok((n, true));
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                debug!(
                    node,
                    "conflict while changing the startup taint; re-reading"
                );
            }
            Err(source) => {
                return Err(Error::Api {
                    node: node.into(),
                    action: "patch taints of",
                    source,
                });
            }
        }
    }
    Err(Error::Conflict { node: node.into() })
}

/// Publishes an Event about the Node (best effort: a failure is logged).
pub async fn event(client: &kube::Client, node: &str, warning: bool, reason: &str, note: String) {
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        ..ObjectReference::default()
    };
    let type_ = if warning {
        EventType::Warning
    } else {
        EventType::Normal
    };
    let recorder = crate::events::recorder(client, "nodeward", None);
    crate::events::publish(&recorder, &reference, type_, reason, "Gate", note).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(unschedulable: bool, at: Option<&str>, taint: bool) -> Node {
        let mut v = json!({"metadata": {"name": "n"}, "spec": {"unschedulable": unschedulable}});
        if let Some(at) = at {
            let rec = json!({"reason": "shutdown", "at": at, "shutdown": true}).to_string();
            v["metadata"]["annotations"] = json!({cordon::CORDONED_BY: rec});
        }
        if taint {
            v["spec"]["taints"] = json!([{"key": STARTUP_TAINT_KEY, "effect": "NoSchedule"}]);
        }
        serde_json::from_value(v).expect("node")
    }

    #[test]
    fn cordon_views() {
        let boot: jiff::Timestamp = "2026-06-01T00:00:00Z".parse().expect("ts");
        let before = Some("2026-05-31T23:59:00Z");
        let after = Some("2026-06-01T00:05:00Z");
        let cases = [
            (node(false, before, false), false, CordonView::NotCordoned),
            (node(true, None, false), false, CordonView::Other),
            (node(true, before, false), false, CordonView::OursBeforeBoot),
            (
                node(true, after, false),
                false,
                CordonView::OursThisBoot {
                    by_this_agent: false,
                },
            ),
            (
                node(true, after, false),
                true,
                CordonView::OursThisBoot {
                    by_this_agent: true,
                },
            ),
            (
                node(true, Some("yesterday"), false),
                false,
                CordonView::OursThisBoot {
                    by_this_agent: false,
                },
            ),
        ];
        for (n, own, want) in cases {
            assert_eq!(cordon_view(&n, Some(boot), own), want, "{n:?}");
        }
        let mut operator = node(true, before, false);
        operator.metadata.annotations = Some(
            [(
                cordon::CORDONED_BY.to_string(),
                json!({"reason": "nodeward drain", "at": before}).to_string(),
            )]
            .into(),
        );
        assert_eq!(
            cordon_view(&operator, Some(boot), false),
            CordonView::OursThisBoot {
                by_this_agent: false
            },
            "an operator's drain before a reboot is not lifted after it"
        );
        assert_eq!(
            cordon_view(&node(true, before, false), None, false),
            CordonView::OursThisBoot {
                by_this_agent: false
            },
            "unknown boot time: never assume the cordon is from before it"
        );
    }

    #[test]
    fn startup_taint_is_recognised() {
        assert!(has_startup_taint(&node(false, None, true)));
        assert!(!has_startup_taint(&node(false, None, false)));
        assert!(
            cordon_owner(&node(true, before_boot(), false))
                .is_some_and(|o| o.starts_with("nodeward"))
        );
        assert_eq!(cordon_owner(&node(false, None, false)), None);
    }

    fn before_boot() -> Option<&'static str> {
        Some("2026-05-31T23:59:00Z")
    }
}
