//! The two writes: the agent's record before a power-off, and the controller's taint.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch};
use serde_json::json;

use super::{Change, PowerOff, decide, is_taint};
use crate::names::{
    OUT_OF_SERVICE_TAINT_EFFECT, OUT_OF_SERVICE_TAINT_KEY, OUT_OF_SERVICE_TAINT_VALUE, POWER_OFF,
};
use crate::node_write::{self, NodeWrite};

/// Errors writing the Node: [`crate::node_write::NodeError`], shared with every Node writer.
pub use crate::node_write::NodeError as Error;

/// The agent, before it lets a power-off go on: writes `record` on its own Node (a merge patch
/// of one annotation, which NodeRestriction lets a node's identity make).
#[tracing::instrument(skip(client, record), err)]
pub async fn announce(client: &kube::Client, node: &str, record: &PowerOff) -> Result<(), Error> {
    let text = serde_json::to_string(record).unwrap_or_default();
    let patch = json!({"metadata": {"annotations": {POWER_OFF: text}}});
    Api::<Node>::all(client.clone())
        .patch(node, &node_write::patch_params(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Api {
            node: node.into(),
            action: "record the power-off on",
            source,
        })?;
    Ok(())
}

/// The agent, when logind cancels the power-off after `record` was written: removes it from its
/// own Node (guarded by the read resourceVersion) if it is still that record and the controller
/// has not tainted the node for it (a tainted record is the controller's to clear, with its
/// taint, once the node is Ready again). Returns whether it was removed.
#[tracing::instrument(skip(client, record), err)]
pub async fn withdraw(client: &kube::Client, node: &str, record: &PowerOff) -> Result<bool, Error> {
    let written = node_write::write_guarded(
        client,
        node,
        "withdraw the power-off record from",
        None,
        |n| {
            let removable = PowerOff::of(n).is_some_and(|on| {
                on.boot_id == record.boot_id && on.at == record.at && on.tainted_at.is_none()
            });
            Ok::<_, std::convert::Infallible>(if removable {
                NodeWrite::Patch(
                    json!({"metadata": {"annotations": {POWER_OFF: null}}}),
                    true,
                )
            } else {
                NodeWrite::Done(false)
            })
        },
    )
    .await;
    match written {
        Ok((_, removed)) => Ok(removed),
        Err(e) => Err(e.for_node(node)),
    }
}

/// The controller: decides about `node` ([`decide`]: NotReady and its heartbeat `silent` for
/// `after`) at every read, the first from `current` (its cache) and after a conflict from a
/// fresh one, and writes the change guarded by the read resourceVersion (the taint list is
/// replaced whole, so another writer's taint is never dropped). Returns the change written, if
/// any.
pub async fn reconcile(
    client: &kube::Client,
    node: &str,
    after: Duration,
    silent: Duration,
    current: Option<Node>,
) -> Result<Option<Change>, Error> {
    let written = node_write::write_guarded(client, node, "patch", current, |n| {
        let now = jiff::Timestamp::now();
        let Some(change) = decide(n, after, now, silent) else {
            return Ok::<_, std::convert::Infallible>(NodeWrite::Done(None));
        };
        Ok(NodeWrite::Patch(patch_for(n, change, now), Some(change)))
    })
    .await;
    match written {
        Ok((_, change)) => Ok(change),
        Err(e) => Err(e.for_node(node)),
    }
}

/// The merge patch that makes `change` on `n` at `now`.
pub(super) fn patch_for(n: &Node, change: Change, now: jiff::Timestamp) -> serde_json::Value {
    let mut taints: Vec<Taint> = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let list = |taints: Vec<Taint>| {
        if taints.is_empty() {
            serde_json::Value::Null
        } else {
            json!(taints)
        }
    };
    match change {
        Change::Taint => {
            taints.push(Taint {
                key: OUT_OF_SERVICE_TAINT_KEY.into(),
                value: Some(OUT_OF_SERVICE_TAINT_VALUE.into()),
                effect: OUT_OF_SERVICE_TAINT_EFFECT.to_string(),
                time_added: Some(Time(now)),
            });
            let record = PowerOff::of(n).map(|mut r| {
                r.tainted_at = Some(now.to_string());
                serde_json::to_string(&r).unwrap_or_default()
            });
            json!({"metadata": {"annotations": {POWER_OFF: record}},
                   "spec": {"taints": list(taints)}})
        }
        Change::Clear { untaint } => {
            let mut patch = json!({"metadata": {"annotations": {POWER_OFF: null}}});
            if untaint {
                taints.retain(|t| !is_taint(t));
                patch["spec"] = json!({"taints": list(taints)});
            }
            patch
        }
    }
}
