//! PodDisruptionBudget status, computed as kube-controller-manager's disruption controller does.
//!
//! There are no workload controllers here, so the controller's "expected pods" (the sum of the
//! scale of every controller owning a matching pod) is taken to be the number of matching pods.
//! Everything else follows the controller: terminating pods and pods the eviction handler just
//! approved (`disruptedPods`, for up to two minutes) are not healthy, `disruptionsAllowed` is
//! `currentHealthy - desiredHealthy` floored at 0 (and 0 while no pod is expected), percentages
//! round up, and the `DisruptionAllowed` condition changes its transition time only on a flip.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use crate::selectors::LabelSelector;

/// How long an eviction-approved pod may stay undeleted before the controller stops treating it
/// as disrupted; the disruption controller's `DeletionTimeout` is two minutes.
pub const DELETION_TIMEOUT: chrono::TimeDelta = chrono::TimeDelta::minutes(2);

/// Formats a timestamp the way the apiserver serialises `metav1.Time` (RFC 3339, seconds, `Z`).
pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Parses a `metav1.Time`.
pub fn parse_timestamp(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// Whether a pod has condition `Ready` = `True` (`podutil.IsPodReady`).
pub fn is_pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Whether an object has `metadata.deletionTimestamp`.
pub fn is_terminating(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// The pods a PDB's selector covers, for the disruption controller: a missing selector covers
/// nothing, an empty one covers every pod of the namespace.
pub fn controller_selector(pdb: &Value) -> Option<LabelSelector> {
    pdb.pointer("/spec/selector")
        .and_then(LabelSelector::from_json)
}

/// The selector as the eviction handler reads it: missing or empty covers nothing.
pub fn eviction_selector(pdb: &Value) -> Option<LabelSelector> {
    controller_selector(pdb).filter(|s| !s.is_empty())
}

/// `intstr.GetScaledValueFromIntOrPercent`, rounding percentages up.
fn scaled(v: &Value, total: i64) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            if let Some(p) = s.strip_suffix('%') {
                let p: i64 = p.parse().ok()?;
                Some((p * total + 99) / 100)
            } else {
                s.parse().ok()
            }
        }
        _ => None,
    }
}

/// The numbers of a computed status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Numbers {
    /// `status.expectedPods`.
    pub expected: i64,
    /// `status.desiredHealthy`.
    pub desired: i64,
    /// `status.currentHealthy`.
    pub current: i64,
    /// `status.disruptionsAllowed`.
    pub allowed: i64,
}

/// Computes a PDB's status from the pods of its namespace (all of them; the selector is applied
/// here). Returns the new `status` object and its numbers.
pub fn compute_status(pdb: &Value, ns_pods: &[&Value], now: DateTime<Utc>) -> (Value, Numbers) {
    let pods: Vec<&Value> = match controller_selector(pdb) {
        Some(sel) => ns_pods.iter().copied().filter(|p| sel.matches(p)).collect(),
        None => Vec::new(),
    };
    let count = i64::try_from(pods.len()).unwrap_or(i64::MAX);
    let spec = &pdb["spec"];
    let (expected, desired) = if let Some(max_unavailable) = spec.get("maxUnavailable") {
        let mu = scaled(max_unavailable, count).unwrap_or(0);
        (count, (count - mu).max(0))
    } else if let Some(min_available) = spec.get("minAvailable") {
        (count, scaled(min_available, count).unwrap_or(0))
    } else {
        (0, 0)
    };

    let old_disrupted = pdb
        .pointer("/status/disruptedPods")
        .and_then(Value::as_object);
    let mut disrupted = Map::new();
    if let Some(old) = old_disrupted {
        for pod in &pods {
            if is_terminating(pod) {
                continue;
            }
            let name = pod
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if let Some(ts) = old.get(name) {
                let fresh = ts
                    .as_str()
                    .and_then(parse_timestamp)
                    .is_some_and(|t| t + DELETION_TIMEOUT > now);
                if fresh {
                    disrupted.insert(name.to_string(), ts.clone());
                }
            }
        }
    }
    let current = pods
        .iter()
        .filter(|p| {
            let name = p
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            !is_terminating(p) && !disrupted.contains_key(name) && is_pod_ready(p)
        })
        .count();
    let current = i64::try_from(current).unwrap_or(i64::MAX);
    let mut allowed = current - desired;
    if expected <= 0 || allowed <= 0 {
        allowed = 0;
    }
    let generation = pdb
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let mut status = json!({
        "observedGeneration": generation,
        "disruptionsAllowed": allowed,
        "currentHealthy": current,
        "desiredHealthy": desired,
        "expectedPods": expected,
    });
    if !disrupted.is_empty() {
        status["disruptedPods"] = Value::Object(disrupted);
    }
    let conditions = pdb
        .pointer("/status/conditions")
        .cloned()
        .unwrap_or_else(|| json!([]));
    status["conditions"] = allowed_condition(conditions, allowed, generation, now);
    (
        status,
        Numbers {
            expected,
            desired,
            current,
            allowed,
        },
    )
}

/// `pdbhelper.UpdateDisruptionAllowedCondition` + `meta.SetStatusCondition`.
pub fn allowed_condition(
    conditions: Value,
    allowed: i64,
    generation: i64,
    now: DateTime<Utc>,
) -> Value {
    let (status, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    let mut list = match conditions {
        Value::Array(a) => a,
        _ => Vec::new(),
    };
    let fresh = json!({
        "type": "DisruptionAllowed",
        "status": status,
        "reason": reason,
        "message": "",
        "observedGeneration": generation,
        "lastTransitionTime": timestamp(now),
    });
    match list.iter_mut().find(|c| c["type"] == "DisruptionAllowed") {
        Some(c) => {
            let keep_time = c["status"] == status;
            let last = c["lastTransitionTime"].clone();
            *c = fresh;
            if keep_time {
                c["lastTransitionTime"] = last;
            }
        }
        None => list.push(fresh),
    }
    Value::Array(list)
}

/// Reads the numbers back from a stored status.
pub fn numbers(pdb: &Value) -> Numbers {
    let get = |k: &str| {
        pdb.pointer(&format!("/status/{k}"))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    Numbers {
        expected: get("expectedPods"),
        desired: get("desiredHealthy"),
        current: get("currentHealthy"),
        allowed: get("disruptionsAllowed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool, terminating: bool) -> Value {
        let mut p = json!({
            "metadata": {"name": name, "labels": {"app": "a"}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        });
        if terminating {
            p["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        }
        p
    }

    fn pdb(spec_extra: Value) -> Value {
        let mut spec = json!({"selector": {"matchLabels": {"app": "a"}}});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), spec_extra.as_object()) {
            s.extend(e.clone());
        }
        json!({"metadata": {"name": "b", "generation": 2}, "spec": spec})
    }

    #[test]
    fn table() {
        let now = Utc::now();
        let pods = [
            pod("a", true, false),
            pod("b", true, false),
            pod("c", false, false),
            pod("d", true, true),
        ];
        let refs: Vec<&Value> = pods.iter().collect();
        // (spec, expected, desired, current, allowed)
        let cases = [
            (json!({"minAvailable": 1}), 4, 1, 2, 1),
            (json!({"minAvailable": 2}), 4, 2, 2, 0),
            (json!({"minAvailable": "50%"}), 4, 2, 2, 0),
            (json!({"minAvailable": "30%"}), 4, 2, 2, 0),
            (json!({"minAvailable": "20%"}), 4, 1, 2, 1),
            (json!({"maxUnavailable": 1}), 4, 3, 2, 0),
            (json!({"maxUnavailable": "30%"}), 4, 2, 2, 0),
            (json!({"maxUnavailable": "60%"}), 4, 1, 2, 1),
            (json!({"maxUnavailable": 10}), 4, 0, 2, 2),
        ];
        for (spec, e, d, c, a) in cases {
            let (status, n) = compute_status(&pdb(spec.clone()), &refs, now);
            assert_eq!(
                n,
                Numbers {
                    expected: e,
                    desired: d,
                    current: c,
                    allowed: a
                },
                "{spec}"
            );
            assert_eq!(status["observedGeneration"], 2);
            let cond = &status["conditions"][0];
            assert_eq!(cond["status"], if a > 0 { "True" } else { "False" });
        }
    }

    #[test]
    fn disrupted_pods_are_not_healthy_until_they_expire() {
        let now = Utc::now();
        let pods = [pod("a", true, false), pod("b", true, false)];
        let refs: Vec<&Value> = pods.iter().collect();
        let mut p = pdb(json!({"minAvailable": 1}));
        p["status"] = json!({"disruptedPods": {"a": timestamp(now)}});
        let (status, n) = compute_status(&p, &refs, now);
        assert_eq!(n.current, 1);
        assert_eq!(n.allowed, 0);
        assert!(status["disruptedPods"]["a"].is_string());
        let (status, n) = compute_status(&p, &refs, now + DELETION_TIMEOUT);
        assert_eq!(n.current, 2);
        assert!(status.get("disruptedPods").is_none());
    }

    #[test]
    fn selector_edge_cases() {
        let now = Utc::now();
        let pods = [pod("a", true, false)];
        let refs: Vec<&Value> = pods.iter().collect();
        let none = json!({"metadata": {"name": "x"}, "spec": {"minAvailable": 0}});
        assert_eq!(compute_status(&none, &refs, now).1.expected, 0);
        let all = json!({"metadata": {"name": "x"}, "spec": {"selector": {}, "minAvailable": 0}});
        assert_eq!(compute_status(&all, &refs, now).1.expected, 1);
        assert!(eviction_selector(&all).is_none());
    }

    #[test]
    fn transition_time_kept_without_flip() {
        let t0 = Utc::now() - chrono::TimeDelta::hours(1);
        let c = allowed_condition(json!([]), 1, 1, t0);
        let c2 = allowed_condition(c.clone(), 2, 1, Utc::now());
        assert_eq!(c[0]["lastTransitionTime"], c2[0]["lastTransitionTime"]);
        let c3 = allowed_condition(c2, 0, 1, Utc::now());
        assert_ne!(c[0]["lastTransitionTime"], c3[0]["lastTransitionTime"]);
    }
}
