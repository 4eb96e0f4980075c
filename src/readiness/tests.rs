use serde_json::json;

use super::*;
use crate::gate::{GateState, GateStatus};

fn node(condition: Option<&str>, tainted: bool) -> Node {
    let mut v = json!({"metadata": {"name": "n"}, "spec": {}, "status": {"conditions": [
        {"type": "Ready", "status": "True"}
    ]}});
    if let Some(s) = condition {
        v["status"]["conditions"]
            .as_array_mut()
            .expect("list")
            .push(json!({"type": CONDITION_TYPE, "status": s, "reason": REASON_PASSED, "message": "m"}));
    }
    if tainted {
        v["spec"]["taints"] = json!([
            {"key": "other", "effect": "NoSchedule"},
            {"key": STARTUP_TAINT_KEY, "effect": STARTUP_TAINT_EFFECT.as_str()}
        ]);
    }
    serde_json::from_value(v).expect("node")
}

#[test]
fn decisions_table() {
    use Mode::*;
    use TaintChange::*;
    let cases = [
        // condition, tainted, mode, expected
        (None, true, Continuous, None),
        (None, false, Continuous, None),
        (Some("True"), true, Bootstrap, Some(Remove)),
        (Some("True"), true, Continuous, Some(Remove)),
        (Some("True"), false, Continuous, None),
        (Some("False"), true, Continuous, None),
        (Some("False"), false, Continuous, Some(Add)),
        (Some("False"), false, Bootstrap, None),
        (Some("Unknown"), false, Continuous, None),
        (Some("Unknown"), true, Continuous, None),
    ];
    for (cond, tainted, mode, want) in cases {
        assert_eq!(
            decide(&node(cond, tainted), mode),
            want,
            "{cond:?} tainted={tainted} {mode:?}"
        );
    }
}

#[test]
fn a_node_being_deleted_is_left_alone() {
    let mut n = node(Some("True"), true);
    n.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::UNIX_EPOCH,
    ));
    assert_eq!(decide(&n, Mode::Continuous), None);
}

#[test]
fn another_taint_with_the_same_key_but_another_effect_is_not_ours() {
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n"},
        "spec": {"taints": [{"key": STARTUP_TAINT_KEY, "effect": "NoExecute"}]}}))
    .expect("node");
    assert!(!has_startup_taint(&n));
}

fn verdict(states: &[(&str, GateState)]) -> Verdict {
    let gates: Vec<GateStatus> = states
        .iter()
        .map(|(name, state)| GateStatus {
            gate: (*name).to_string(),
            state: *state,
            reason: format!("{name} reason"),
        })
        .collect();
    Verdict {
        all_pass: gates.iter().all(|g| g.state == GateState::Pass),
        gates,
        overdue: false,
    }
}

#[test]
fn the_condition_names_the_failing_gates() {
    let c = desired_condition(&verdict(&[
        ("file /run/flannel/subnet.env", GateState::Fail),
        ("pod kube-flannel/app=flannel", GateState::Pass),
    ]));
    assert!(!c.status);
    assert_eq!(c.reason, REASON_FAILING);
    assert_eq!(
        c.message,
        "failing: file /run/flannel/subnet.env (file /run/flannel/subnet.env reason)"
    );
    let ok = desired_condition(&verdict(&[("a", GateState::Pass), ("b", GateState::Pass)]));
    assert!(ok.status);
    assert_eq!(ok.reason, REASON_PASSED);
    assert_eq!(ok.message, "all 2 readiness gates pass");
}

#[test]
fn past_the_boot_deadline_the_reason_says_so_and_the_scaler_reads_it() {
    let mut v = verdict(&[("file f", GateState::Fail)]);
    v.overdue = true;
    let c = desired_condition(&v);
    assert_eq!(c.reason, REASON_NOT_READY_IN_TIME);
    let n: Node =
        serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {"conditions": [
            {"type": CONDITION_TYPE, "status": "False", "reason": c.reason, "message": c.message}
        ]}}))
        .expect("node");
    assert!(reports_not_ready_in_time(&n));
    let view = crate::scaler::model::node_view(&n);
    assert!(view.not_ready_in_time);
    assert!(!reports_not_ready_in_time(&node(Some("False"), true)));
}

#[test]
fn a_long_message_is_cut_on_a_character_boundary() {
    let name = "é".repeat(2000);
    let c = desired_condition(&verdict(&[(name.as_str(), GateState::Fail)]));
    assert!(c.message.len() <= MESSAGE_MAX, "{}", c.message.len());
}

#[test]
fn current_means_same_status_reason_and_message() {
    let want = Condition {
        status: true,
        reason: REASON_PASSED,
        message: "m".into(),
    };
    assert!(condition_is_current(&node(Some("True"), false), &want));
    assert!(!condition_is_current(&node(Some("False"), false), &want));
    assert!(!condition_is_current(&node(None, false), &want));
    let other = Condition {
        message: "other".into(),
        ..want
    };
    assert!(!condition_is_current(&node(Some("True"), false), &other));
}

/// packaging/kubernetes/node-readiness-rule.yaml held to what node-readiness-controller (NRC)
/// was found to require and do when run for real (v0.5.0-14 against nodeward's control plane;
/// docs/src/readiness.md): its API refuses a rule without a `nodeSelector` and one whose taint key
/// is not `readiness.k8s.io/<name>` (name: 1-63 characters, alphanumeric at both ends, `-_.`
/// inside); it lifts the taint when every listed condition has its `requiredStatus` and keeps
/// it (adding it if missing) otherwise, a missing condition included. The rule must select every
/// node `nodeward render` bootstraps and map exactly our condition to exactly our startup taint.
#[test]
fn the_shipped_node_readiness_rule_is_one_nrc_accepts_for_our_nodes() {
    let rule: serde_json::Value = serde_norway::from_str(include_str!(
        "../../packaging/kubernetes/node-readiness-rule.yaml"
    ))
    .expect("yaml");
    assert_eq!(rule["kind"], "NodeReadinessRule");
    let key = rule["spec"]["taint"]["key"].as_str().expect("taint key");
    assert_eq!(key, STARTUP_TAINT_KEY);
    let name = key
        .strip_prefix("readiness.k8s.io/")
        .expect("NRC owns only taint keys under readiness.k8s.io/");
    let inner_ok = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    assert!(
        (1..=63).contains(&name.len())
            && name.chars().all(inner_ok)
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric()),
        "NRC's taint name rule: {name}"
    );
    assert_eq!(
        rule["spec"]["taint"]["effect"],
        STARTUP_TAINT_EFFECT.as_str()
    );
    let mode = rule["spec"]["enforcementMode"].as_str().expect("mode");
    assert!(["bootstrap-only", "continuous"].contains(&mode), "{mode}");

    // The selector NRC requires selects every node nodeward bootstraps (each carries the group
    // label) and nothing else by accident.
    let selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
        serde_json::from_value(rule["spec"]["nodeSelector"].clone())
            .expect("NRC refuses a rule without a nodeSelector");
    assert!(
        selector.match_labels.is_some() || selector.match_expressions.is_some(),
        "an empty selector"
    );
    let bootstrapped = [(
        crate::names::NODE_GROUP_LABEL.to_string(),
        "web".to_string(),
    )]
    .into_iter()
    .collect();
    assert!(crate::drain::plan::selector_matches(
        &selector,
        &bootstrapped
    ));
    assert!(!crate::drain::plan::selector_matches(
        &selector,
        &std::collections::BTreeMap::new()
    ));

    let conditions = rule["spec"]["conditions"].as_array().expect("conditions");
    let satisfied = |n: &Node| {
        conditions.iter().all(|c| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|x| c["type"] == x.type_.as_str()))
                .is_some_and(|x| c["requiredStatus"] == x.status.as_str())
        })
    };
    // What the agent writes for all gates passing, and for one failing.
    let mut ready = node(None, true);
    let pass = desired_condition(&verdict(&[("g", GateState::Pass)]));
    ready
        .status
        .get_or_insert_default()
        .conditions
        .get_or_insert_default()
        .push(NodeCondition {
            type_: CONDITION_TYPE.into(),
            status: if pass.status { "True" } else { "False" }.into(),
            reason: Some(pass.reason.into()),
            message: Some(pass.message),
            ..NodeCondition::default()
        });
    assert!(satisfied(&ready), "rule satisfied: the taint goes");
    assert_eq!(decide(&ready, Mode::Continuous), Some(TaintChange::Remove));
    assert!(
        !satisfied(&node(Some("False"), true)),
        "False: the taint stays"
    );
    assert!(!satisfied(&node(None, true)), "no report: the taint stays");
}

/// A node that registered under 0.1 carries the legacy key: it is still the startup taint.
#[test]
fn the_legacy_startup_taint_key_is_still_ours() {
    let mut n = node(Some("True"), false);
    n.spec.get_or_insert_default().taints = Some(vec![Taint {
        key: crate::names::LEGACY_STARTUP_TAINT_KEY.into(),
        effect: STARTUP_TAINT_EFFECT.to_string(),
        ..Taint::default()
    }]);
    assert!(has_startup_taint(&n));
    assert_eq!(decide(&n, Mode::Continuous), Some(TaintChange::Remove));
}

#[test]
fn a_taint_put_back_tells_the_scaler_the_node_was_ready_before() {
    // As kubelet registers it: no timeAdded, a first boot.
    let registered = node(Some("False"), true);
    let view = crate::scaler::model::node_view(&registered);
    assert!(view.booting() && !view.ever_ready && view.first_boot());
    // As the controller or the agent puts it back: stamped.
    let mut back = node(Some("False"), true);
    if let Some(t) = back
        .spec
        .as_mut()
        .and_then(|s| s.taints.as_mut())
        .and_then(|ts| ts.iter_mut().find(|t| t.key == STARTUP_TAINT_KEY))
    {
        t.time_added = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().expect("time"),
        ));
    }
    let view = crate::scaler::model::node_view(&back);
    assert!(view.booting() && view.ever_ready && !view.first_boot());
    // Another taint's timeAdded says nothing.
    let mut other = node(Some("False"), true);
    if let Some(t) = other
        .spec
        .as_mut()
        .and_then(|s| s.taints.as_mut())
        .and_then(|ts| ts.iter_mut().find(|t| t.key == "other"))
    {
        t.time_added = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().expect("time"),
        ));
    }
    assert!(crate::scaler::model::node_view(&other).first_boot());
}
