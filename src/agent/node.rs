//! How the agent reads nodeward's cordon on its own Node, and its Events about it. (Its
//! readiness condition and the startup taint are [`crate::readiness`]'s.)

use k8s_openapi::api::core::v1::Node;

use super::state::CordonView;
use crate::drain::cordon;

/// Who cordoned `n`, relative to the boot at `boot_time` and this agent's own shutdown cordon.
pub fn cordon_view(n: &Node, boot_time: Option<jiff::Timestamp>, own_cordon: bool) -> CordonView {
    if !cordon::is_cordoned(n) {
        return CordonView::NotCordoned;
    }
    let Some(rec) = cordon::nodeward_cordon(n) else {
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
    Some(match cordon::nodeward_cordon(n) {
        Some(r) => format!("nodeward ({}, at {})", r.reason, r.at),
        None => cordon::cordoned_by_manager(n).unwrap_or_else(|| "someone else".into()),
    })
}

/// Publishes an Event about the Node (best effort: a failure is logged).
pub async fn event(client: &kube::Client, node: &str, warning: bool, reason: &str, note: String) {
    crate::events::node_event(client, node, warning, reason, "Gate", note).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readiness::{STARTUP_TAINT_EFFECT, STARTUP_TAINT_KEY, has_startup_taint};
    use serde_json::json;

    fn node(unschedulable: bool, at: Option<&str>, taint: bool) -> Node {
        let mut v = json!({"metadata": {"name": "n"}, "spec": {"unschedulable": unschedulable}});
        if let Some(at) = at {
            let rec = json!({"reason": "shutdown", "at": at, "shutdown": true}).to_string();
            v["metadata"]["annotations"] = json!({cordon::CORDONED_BY: rec});
            // nodeward's own cordon: its write set spec.unschedulable.
            v["metadata"]["managedFields"] = json!([{
                "manager": crate::names::FIELD_MANAGER, "operation": "Update",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:unschedulable": {}}},
            }]);
        }
        if taint {
            v["spec"]["taints"] =
                json!([{"key": STARTUP_TAINT_KEY, "effect": STARTUP_TAINT_EFFECT.as_str()}]);
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

    /// `kubectl uncordon` leaves nodeward's shutdown record behind; a later `kubectl cordon` is
    /// the administrator's: not lifted after the reboot, and `nodeward status` names them.
    #[test]
    fn a_stale_record_under_an_admin_cordon_is_theirs() {
        let boot: jiff::Timestamp = "2026-06-01T00:00:00Z".parse().expect("ts");
        let mut n = node(true, before_boot(), false);
        n.metadata.managed_fields = serde_json::from_value(json!([
            {"manager": "kubectl-cordon", "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:unschedulable": {}}}}
        ]))
        .expect("managedFields");
        assert_eq!(cordon_view(&n, Some(boot), true), CordonView::Other);
        assert_eq!(cordon_owner(&n).as_deref(), Some("kubectl-cordon"));
    }

    fn before_boot() -> Option<&'static str> {
        Some("2026-05-31T23:59:00Z")
    }
}
