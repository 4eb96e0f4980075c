//! Server-side printing: `meta.k8s.io/v1` Tables for kubectl's human-readable output.
//!
//! kubectl asks for `application/json;as=Table;v=v1;g=meta.k8s.io` when it prints columns. The
//! columns here are the apiserver's main ones for nodes, pods and PDBs, and Name/Age for the
//! rest; each row carries the object's metadata as `PartialObjectMetadata`, which kubectl reads
//! for `--show-labels`, `-A` and `-o name`.

use chrono::Utc;
use serde_json::{Value, json};

use crate::pdb;
use crate::resources::ResourceDef;
use crate::store::{ListOut, Obj};

fn column(name: &str, kind: &str, format: &str, priority: u32) -> Value {
    json!({"name": name, "type": kind, "format": format, "description": "", "priority": priority})
}

fn columns(def: &ResourceDef) -> Vec<Value> {
    let name = column("Name", "string", "name", 0);
    let age = column("Age", "string", "", 0);
    match def.plural {
        "pods" => vec![
            name,
            column("Ready", "string", "", 0),
            column("Status", "string", "", 0),
            column("Restarts", "string", "", 0),
            age,
            column("IP", "string", "", 1),
            column("Node", "string", "", 1),
        ],
        "nodes" => vec![
            name,
            column("Status", "string", "", 0),
            column("Roles", "string", "", 0),
            age,
            column("Version", "string", "", 0),
        ],
        "poddisruptionbudgets" => vec![
            name,
            column("Min Available", "string", "", 0),
            column("Max Unavailable", "string", "", 0),
            column("Allowed Disruptions", "integer", "", 0),
            age,
        ],
        _ => vec![name, age],
    }
}

/// kubectl's `duration.HumanDuration`, roughly: `45s`, `12m`, `5h`, `3d`.
fn age(obj: &Value) -> String {
    let Some(created) = obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(pdb::parse_timestamp)
    else {
        return "<unknown>".into();
    };
    let secs = (Utc::now() - created).num_seconds().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 * 3 => format!("{}m", s / 60),
        s if s < 86400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => "N/A".into(),
    }
}

fn cells(def: &ResourceDef, obj: &Value) -> Vec<Value> {
    let name = json!(
        obj.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    );
    match def.plural {
        "pods" => {
            let containers = obj
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let ready = if pdb::is_pod_ready(obj) {
                containers
            } else {
                0
            };
            let status = if pdb::is_terminating(obj) {
                "Terminating".to_string()
            } else {
                obj.pointer("/status/phase")
                    .and_then(Value::as_str)
                    .unwrap_or("Pending")
                    .to_string()
            };
            let node = obj
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .unwrap_or("<none>");
            let ip = obj
                .pointer("/status/podIP")
                .and_then(Value::as_str)
                .unwrap_or("<none>");
            vec![
                name,
                json!(format!("{ready}/{containers}")),
                json!(status),
                json!("0"),
                json!(age(obj)),
                json!(ip),
                json!(node),
            ]
        }
        "nodes" => {
            let ready = obj
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["status"] == "True");
            let mut status = match ready {
                Some(true) => "Ready".to_string(),
                Some(false) => "NotReady".to_string(),
                None => "Unknown".to_string(),
            };
            if obj.pointer("/spec/unschedulable") == Some(&json!(true)) {
                status.push_str(",SchedulingDisabled");
            }
            let roles: Vec<&str> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|l| {
                    l.keys()
                        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                        .collect()
                })
                .unwrap_or_default();
            let roles = if roles.is_empty() {
                "<none>".to_string()
            } else {
                roles.join(",")
            };
            let version = obj
                .pointer("/status/nodeInfo/kubeletVersion")
                .and_then(Value::as_str)
                .unwrap_or_default();
            vec![
                name,
                json!(status),
                json!(roles),
                json!(age(obj)),
                json!(version),
            ]
        }
        "poddisruptionbudgets" => vec![
            name,
            json!(text(obj.pointer("/spec/minAvailable"))),
            json!(text(obj.pointer("/spec/maxUnavailable"))),
            json!(
                obj.pointer("/status/disruptionsAllowed")
                    .and_then(Value::as_i64)
                    .unwrap_or(0)
            ),
            json!(age(obj)),
        ],
        _ => vec![name, json!(age(obj))],
    }
}

fn row(def: &ResourceDef, obj: &Obj) -> Value {
    json!({
        "cells": cells(def, &obj.value),
        "object": {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.value.get("metadata").cloned().unwrap_or_else(|| json!({})),
        }
    })
}

/// A Table of a list.
pub fn list_table(def: &ResourceDef, out: &ListOut) -> Value {
    let mut meta = json!({"resourceVersion": out.rv.to_string()});
    if let Some(c) = &out.cont {
        meta["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns(def),
        "rows": out.items.iter().map(|o| row(def, o)).collect::<Vec<_>>(),
    })
}

/// A one-row Table of an object (get, and each event of a watch).
pub fn object_table(def: &ResourceDef, obj: &Obj) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": obj.rv.to_string()},
        "columnDefinitions": columns(def),
        "rows": [row(def, obj)],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{NODES, RESOURCES};
    use bytes::Bytes;

    #[test]
    fn node_row() {
        let v = json!({"metadata": {"name": "n1", "creationTimestamp": pdb::timestamp(Utc::now()),
                                    "labels": {"node-role.kubernetes.io/worker": ""}},
                       "spec": {"unschedulable": true},
                       "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let obj = Obj {
            bytes: Bytes::new(),
            value: v,
            rv: 3,
        };
        let t = object_table(&RESOURCES[NODES], &obj);
        assert_eq!(t["rows"][0]["cells"][1], "Ready,SchedulingDisabled");
        assert_eq!(t["rows"][0]["cells"][2], "worker");
        assert_eq!(t["rows"][0]["object"]["metadata"]["name"], "n1");
    }
}
