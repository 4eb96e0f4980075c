//! Field ownership in `metadata.managedFields`, kept for the one field whose owner a client
//! here reads: a Node's `spec.unschedulable` (nodeward's cordon is nodeward's only while its
//! field manager owns that field). kube-apiserver tracks every field of every object; for an
//! update it makes the writer's manager the owner of each field the write changed, taking it
//! from the others, and a field the write removed has no owner left. The emulator does the same
//! for this field on updates and patches (not on create, nor for server-side apply's
//! conflicts).

use serde_json::{Value, json};

/// The field manager of a write that names none: the User-Agent's product (what precedes the
/// first `/`), as kube-apiserver derives it.
pub fn manager_from_user_agent(user_agent: &str) -> &str {
    user_agent.split('/').next().unwrap_or_default()
}

/// Records in `new`'s managedFields that `manager` (none: an unnamed writer) changed a Node's
/// `spec.unschedulable` from what `old` had, at `now` (RFC 3339). A write that changed
/// managedFields itself keeps what it wrote; one that left them out keeps the old ones.
pub fn track_unschedulable(old: &Value, new: &mut Value, manager: Option<&str>, now: &str) {
    let before = old.pointer("/metadata/managedFields");
    match new.pointer("/metadata/managedFields") {
        Some(written) if Some(written) != before => return,
        Some(_) => {}
        None => {
            if let (Some(b), Some(meta)) = (before, new["metadata"].as_object_mut()) {
                meta.insert("managedFields".into(), b.clone());
            }
        }
    }
    let field = new.pointer("/spec/unschedulable").cloned();
    if old.pointer("/spec/unschedulable") == field.as_ref() {
        return;
    }
    let Some(meta) = new["metadata"].as_object_mut() else {
        return;
    };
    let mut entries = match meta.remove("managedFields") {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    };
    entries.iter_mut().for_each(disown);
    entries.retain(|e| e["fieldsV1"].as_object().is_some_and(|f| !f.is_empty()));
    if let (Some(_), Some(m)) = (field, manager.filter(|m| !m.is_empty())) {
        own(&mut entries, m, now);
    }
    if !entries.is_empty() {
        meta.insert("managedFields".into(), Value::Array(entries));
    }
}

/// Takes `spec.unschedulable` from one managedFields entry.
fn disown(entry: &mut Value) {
    let Some(spec) = entry
        .pointer_mut("/fieldsV1/f:spec")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    spec.remove("f:unschedulable");
    if spec.is_empty()
        && let Some(f) = entry["fieldsV1"].as_object_mut()
    {
        f.remove("f:spec");
    }
}

/// Gives `spec.unschedulable` to `manager`'s update entry, made if it has none.
fn own(entries: &mut Vec<Value>, manager: &str, now: &str) {
    let i = entries
        .iter()
        .position(|e| {
            e["manager"] == manager && e["operation"] == "Update" && e.get("subresource").is_none()
        })
        .unwrap_or_else(|| {
            entries.push(
                json!({"manager": manager, "operation": "Update", "apiVersion": "v1",
                                "fieldsType": "FieldsV1", "fieldsV1": {}}),
            );
            entries.len() - 1
        });
    let Some(e) = entries.get_mut(i).and_then(Value::as_object_mut) else {
        return;
    };
    e.insert("time".into(), json!(now));
    let spec = e
        .get_mut("fieldsV1")
        .and_then(Value::as_object_mut)
        .map(|f| f.entry("f:spec").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut);
    if let Some(spec) = spec {
        spec.insert("f:unschedulable".into(), json!({}));
    }
}
