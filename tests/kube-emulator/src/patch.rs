//! Patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch and
//! a simplified server-side apply.
//!
//! Strategic merge needs each list's patch strategy, which the apiserver reads from Go struct
//! tags. We keep the tags of the fields the served types have (containers by `name`, conditions
//! by `type`, finalizers as a set, ...) in [`list_strategy`]; every other list is replaced whole,
//! which is also what the apiserver does for lists without a strategy — notably
//! `Node.spec.taints`, so `kubectl taint` sends (and we apply) the whole taint list. The
//! directives kubectl sends (`$patch`, `$retainKeys`, `$setElementOrder/…`,
//! `$deleteFromPrimitiveList/…`) are honoured and never stored.

use serde_json::{Map, Value};

/// A patch that cannot be applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatchError {
    /// The patch body is not what its content type promises (a 400).
    #[error("{0}")]
    Malformed(String),
    /// The patch is well-formed but does not apply to the object (a 422).
    #[error("{0}")]
    Unprocessable(String),
}

/// How a list field merges in a strategic merge patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListStrategy {
    /// No patch strategy: the patch's list replaces the object's.
    Replace,
    /// `patchStrategy:"merge"` on a list of scalars: a set union.
    Set,
    /// `patchStrategy:"merge" patchMergeKey:"…"`: elements merge by that key.
    ByKey(&'static str),
}

/// The strategy of the list at `path` (field names from the root, list positions left out).
fn list_strategy(path: &[String]) -> ListStrategy {
    let Some(last) = path.last() else {
        return ListStrategy::Replace;
    };
    let parent = path.len().checked_sub(2).map(|i| path[i].as_str());
    match (parent, last.as_str()) {
        (Some("metadata"), "finalizers") => ListStrategy::Set,
        (Some("metadata"), "ownerReferences") => ListStrategy::ByKey("uid"),
        (Some("spec"), "containers" | "initContainers" | "ephemeralContainers") => {
            ListStrategy::ByKey("name")
        }
        (Some("spec"), "volumes" | "imagePullSecrets") => ListStrategy::ByKey("name"),
        (Some("spec"), "hostAliases") => ListStrategy::ByKey("ip"),
        (Some("spec"), "podCIDRs") => ListStrategy::Set,
        (Some("containers" | "initContainers" | "ephemeralContainers"), "ports") => {
            ListStrategy::ByKey("containerPort")
        }
        (Some("containers" | "initContainers" | "ephemeralContainers"), "env") => {
            ListStrategy::ByKey("name")
        }
        (Some("containers" | "initContainers" | "ephemeralContainers"), "volumeMounts") => {
            ListStrategy::ByKey("mountPath")
        }
        (Some("containers" | "initContainers" | "ephemeralContainers"), "volumeDevices") => {
            ListStrategy::ByKey("devicePath")
        }
        (Some("status"), "conditions" | "addresses") => ListStrategy::ByKey("type"),
        (Some("status"), "podIPs" | "hostIPs") => ListStrategy::ByKey("ip"),
        _ => ListStrategy::Replace,
    }
}

/// Applies an RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Applies an RFC 6902 JSON patch (an array of operations).
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops = patch
        .as_array()
        .ok_or_else(|| PatchError::Malformed("json patch must be an array of operations".into()))?;
    for op in ops {
        let name = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or_else(|| PatchError::Malformed(format!("operation has no \"op\": {op}")))?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| PatchError::Malformed(format!("operation has no \"path\": {op}")))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| PatchError::Malformed(format!("operation has no \"value\": {op}")))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| PatchError::Malformed(format!("operation has no \"from\": {op}")))
        };
        match name {
            "add" => pointer_add(target, path, value()?)?,
            "remove" => {
                pointer_remove(target, path)?;
            }
            "replace" => {
                pointer_remove(target, path)?;
                pointer_add(target, path, value()?)?;
            }
            "move" => {
                let v = pointer_remove(target, from()?)?;
                pointer_add(target, path, v)?;
            }
            "copy" => {
                let v = target
                    .pointer(from()?)
                    .cloned()
                    .ok_or_else(|| missing(from().unwrap_or_default()))?;
                pointer_add(target, path, v)?;
            }
            "test" => {
                let want = value()?;
                if target.pointer(path) != Some(&want) {
                    return Err(PatchError::Unprocessable(format!(
                        "testing value {path} failed: test failed"
                    )));
                }
            }
            other => {
                return Err(PatchError::Malformed(format!("Unexpected kind: {other}")));
            }
        }
    }
    Ok(())
}

fn missing(path: &str) -> PatchError {
    PatchError::Unprocessable(format!(
        "the server rejected our request due to an error in our request: doc is missing path: \"{path}\": missing value"
    ))
}

fn split_pointer(path: &str) -> Result<(String, String), PatchError> {
    if path.is_empty() {
        return Err(PatchError::Unprocessable(
            "cannot operate on the whole document".into(),
        ));
    }
    let idx = path
        .rfind('/')
        .ok_or_else(|| PatchError::Malformed(format!("invalid JSON pointer {path:?}")))?;
    let last = path[idx + 1..].replace("~1", "/").replace("~0", "~");
    Ok((path[..idx].to_string(), last))
}

fn pointer_add(target: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    let (parent, last) = split_pointer(path)?;
    let container = target.pointer_mut(&parent).ok_or_else(|| missing(path))?;
    match container {
        Value::Object(m) => {
            m.insert(last, value);
            Ok(())
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(value);
                return Ok(());
            }
            let i: usize = last.parse().map_err(|_| missing(path))?;
            if i > a.len() {
                return Err(missing(path));
            }
            a.insert(i, value);
            Ok(())
        }
        _ => Err(missing(path)),
    }
}

fn pointer_remove(target: &mut Value, path: &str) -> Result<Value, PatchError> {
    let (parent, last) = split_pointer(path)?;
    let container = target.pointer_mut(&parent).ok_or_else(|| missing(path))?;
    match container {
        Value::Object(m) => m.remove(&last).ok_or_else(|| missing(path)),
        Value::Array(a) => {
            let i: usize = last.parse().map_err(|_| missing(path))?;
            if i >= a.len() {
                return Err(missing(path));
            }
            Ok(a.remove(i))
        }
        _ => Err(missing(path)),
    }
}

/// Applies a strategic merge patch.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Object(p) = patch else {
        return Err(PatchError::Malformed(
            "strategic merge patch must be a JSON object".into(),
        ));
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        let mut path = Vec::new();
        if smp_map(t, p, &mut path)? == MapOutcome::Delete {
            t.clear();
        }
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
enum MapOutcome {
    Keep,
    Delete,
}

fn is_directive(k: &str) -> bool {
    k.starts_with('$')
}

/// A copy of a patch fragment without directives, for inserting where nothing merges.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !is_directive(k))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|e| e.get("$patch").is_none())
                .map(strip_directives)
                .collect(),
        ),
        other => other.clone(),
    }
}

fn smp_map(
    orig: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &mut Vec<String>,
) -> Result<MapOutcome, PatchError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("delete") => return Ok(MapOutcome::Delete),
        Some("replace") => {
            if let Value::Object(m) = strip_directives(&Value::Object(patch.clone())) {
                *orig = m;
            }
            return Ok(MapOutcome::Keep);
        }
        Some("merge") | None => {}
        Some(other) => {
            return Err(PatchError::Malformed(format!(
                "Unknown patch type: {other}"
            )));
        }
    }
    let mut orders: Vec<(String, Vec<Value>)> = Vec::new();
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$setElementOrder/") {
            if let Value::Array(order) = v {
                orders.push((field.to_string(), order.clone()));
            }
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(gone)) = (orig.get_mut(field), v) {
                list.retain(|e| !gone.contains(e));
            }
            continue;
        }
        if is_directive(k) {
            continue;
        }
        path.push(k.clone());
        match v {
            Value::Null => {
                orig.remove(k);
            }
            Value::Object(pm) => {
                let remove = match orig.get_mut(k) {
                    Some(Value::Object(om)) => smp_map(om, pm, path)? == MapOutcome::Delete,
                    _ => {
                        if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                            true
                        } else {
                            orig.insert(k.clone(), strip_directives(v));
                            false
                        }
                    }
                };
                if remove {
                    orig.remove(k);
                }
            }
            Value::Array(pa) => {
                let merged = smp_list(orig.get(k), pa, path)?;
                orig.insert(k.clone(), merged);
            }
            scalar => {
                orig.insert(k.clone(), scalar.clone());
            }
        }
        path.pop();
    }
    if let Some(Value::Array(retain)) = patch.get("$retainKeys") {
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        orig.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (field, order) in orders {
        path.push(field.clone());
        let strategy = list_strategy(path);
        path.pop();
        if let (Some(Value::Array(list)), ListStrategy::ByKey(key)) =
            (orig.get_mut(&field), strategy)
        {
            let pos = |e: &Value| {
                order
                    .iter()
                    .position(|o| o.get(key).is_some() && o.get(key) == e.get(key))
                    .unwrap_or(usize::MAX)
            };
            list.sort_by_key(pos);
        } else if let (Some(Value::Array(list)), ListStrategy::Set) =
            (orig.get_mut(&field), strategy)
        {
            list.sort_by_key(|e| order.iter().position(|o| o == e).unwrap_or(usize::MAX));
        }
    }
    Ok(MapOutcome::Keep)
}

fn smp_list(
    orig: Option<&Value>,
    patch: &[Value],
    path: &mut Vec<String>,
) -> Result<Value, PatchError> {
    let strategy = list_strategy(path);
    let replace_all = patch
        .iter()
        .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace"));
    let orig_list = match orig {
        Some(Value::Array(a)) if !replace_all => a.clone(),
        _ => Vec::new(),
    };
    match strategy {
        ListStrategy::Replace => Ok(strip_directives(&Value::Array(patch.to_vec()))),
        ListStrategy::Set => {
            let mut out = orig_list;
            for e in patch {
                if e.is_object() {
                    continue;
                }
                if !out.contains(e) {
                    out.push(e.clone());
                }
            }
            Ok(Value::Array(out))
        }
        ListStrategy::ByKey(key) => {
            let mut out = orig_list;
            for e in patch {
                let Value::Object(pe) = e else {
                    return Err(PatchError::Malformed(format!(
                        "list element of {} is not an object",
                        path.join(".")
                    )));
                };
                let directive = pe.get("$patch").and_then(Value::as_str);
                if directive == Some("replace") {
                    continue;
                }
                let Some(kv) = pe.get(key) else {
                    return Err(PatchError::Malformed(format!(
                        "map: {e} does not contain declared merge key: {key}"
                    )));
                };
                let pos = out.iter().position(|o| o.get(key) == Some(kv));
                if directive == Some("delete") {
                    out.retain(|o| o.get(key) != Some(kv));
                    continue;
                }
                match pos {
                    Some(i) => {
                        if let Value::Object(om) = &mut out[i] {
                            smp_map(om, pe, path)?;
                        }
                    }
                    None => out.push(strip_directives(e)),
                }
            }
            Ok(Value::Array(out))
        }
    }
}

/// Applies a server-side apply configuration, simplified: maps merge, keyed lists merge by
/// their keys, other lists and scalars are set. Field ownership is not tracked, so a field
/// dropped from a later apply is not removed.
pub fn apply_merge(target: &mut Value, config: &Value) -> Result<(), PatchError> {
    strategic_merge_patch(target, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_deletes_with_null() {
        let mut v = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": 1}});
        merge_patch(
            &mut v,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": null}),
        );
        assert_eq!(v, json!({"metadata": {"labels": {"b": "2", "c": "3"}}}));
    }

    #[test]
    fn json_patch_ops() {
        let mut v = json!({"a": [1, 2], "b": {"c": 1}});
        json_patch(
            &mut v,
            &json!([
                {"op": "add", "path": "/a/-", "value": 3},
                {"op": "replace", "path": "/b/c", "value": 2},
                {"op": "add", "path": "/b/d~1e", "value": true},
                {"op": "remove", "path": "/a/0"},
                {"op": "test", "path": "/b/c", "value": 2},
                {"op": "copy", "from": "/b/c", "path": "/f"},
                {"op": "move", "from": "/f", "path": "/g"}
            ]),
        )
        .expect("applies");
        assert_eq!(v, json!({"a": [2, 3], "b": {"c": 2, "d/e": true}, "g": 2}));
        assert!(matches!(
            json_patch(&mut v, &json!([{"op": "remove", "path": "/zz"}])),
            Err(PatchError::Unprocessable(_))
        ));
        assert!(matches!(
            json_patch(&mut v, &json!({"op": "remove"})),
            Err(PatchError::Malformed(_))
        ));
    }

    #[test]
    fn smp_taints_replace_and_unschedulable() {
        let mut node = json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}});
        strategic_merge_patch(
            &mut node,
            &json!({"spec": {"unschedulable": true, "taints": [{"key": "b", "effect": "NoExecute"}]}}),
        )
        .expect("applies");
        assert_eq!(
            node,
            json!({"spec": {"unschedulable": true, "taints": [{"key": "b", "effect": "NoExecute"}]}})
        );
        strategic_merge_patch(
            &mut node,
            &json!({"spec": {"unschedulable": null, "taints": null}}),
        )
        .expect("applies");
        assert_eq!(node, json!({"spec": {}}));
    }

    #[test]
    fn smp_keyed_lists_and_directives() {
        let mut pod = json!({
            "metadata": {"finalizers": ["a"], "labels": {"x": "1"}},
            "spec": {"containers": [{"name": "c1", "image": "i1"}, {"name": "c2", "image": "i2"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}
        });
        strategic_merge_patch(
            &mut pod,
            &json!({
                "metadata": {"finalizers": ["b"], "labels": {"x": null, "y": "2"}},
                "spec": {
                    "$setElementOrder/containers": [{"name": "c2"}, {"name": "c1"}, {"name": "c3"}],
                    "containers": [{"name": "c1", "image": "j1"}, {"name": "c3", "image": "i3"}]
                },
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}
            }),
        )
        .expect("applies");
        assert_eq!(
            pod["metadata"],
            json!({"finalizers": ["a", "b"], "labels": {"y": "2"}})
        );
        assert_eq!(
            pod["spec"]["containers"],
            json!([{"name": "c2", "image": "i2"}, {"name": "c1", "image": "j1"}, {"name": "c3", "image": "i3"}])
        );
        assert_eq!(pod["status"]["conditions"][0]["status"], "True");

        strategic_merge_patch(
            &mut pod,
            &json!({
                "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]},
                "spec": {"containers": [{"name": "c2", "$patch": "delete"}]}
            }),
        )
        .expect("applies");
        assert_eq!(pod["metadata"]["finalizers"], json!(["b"]));
        assert_eq!(pod["spec"]["containers"].as_array().map(Vec::len), Some(2));

        strategic_merge_patch(
            &mut pod,
            &json!({"spec": {"$retainKeys": ["containers"], "containers": [{"name": "c1", "image": "k"}]}}),
        )
        .expect("applies");
        assert_eq!(pod["spec"].as_object().map(Map::len), Some(1));

        strategic_merge_patch(&mut pod, &json!({"status": {"$patch": "delete"}})).expect("applies");
        assert!(pod.get("status").is_none());
    }
}
