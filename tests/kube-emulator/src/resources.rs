//! The resources the emulator serves, and the discovery documents built from them.
//!
//! One static table drives routing, storage and discovery, so a resource is either served
//! everywhere (paths, watches, `kubectl api-resources`, kind mapping) or nowhere. The
//! discovery documents are the unaggregated forms (`APIVersions`, `APIGroupList`,
//! `APIResourceList`): client-go and kube-rs fall back to them when the server does not answer
//! with the aggregated `APIGroupDiscoveryList` type, exactly as they do against older clusters.

use serde_json::{Value, json};

/// Every verb a fully served resource answers, in the order kube-apiserver lists them.
const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Verbs of a `/status` subresource.
const STATUS_VERBS: &[&str] = &["get", "patch", "update"];

/// Index of a resource in [`RESOURCES`].
pub type ResId = usize;

/// A served resource type.
#[derive(Debug)]
pub struct ResourceDef {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Lower-case plural, the path segment.
    pub plural: &'static str,
    /// Lower-case singular name.
    pub singular: &'static str,
    /// Kind of one object.
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// kubectl short names.
    pub short_names: &'static [&'static str],
    /// Whether the resource has a `/status` subresource (the main resource then ignores status
    /// on update, and `/status` ignores everything but status).
    pub has_status: bool,
    /// Whether `metadata.generation` is kept and bumped on spec changes.
    pub tracks_generation: bool,
    /// Discovery categories (`kubectl get all`).
    pub categories: &'static [&'static str],
}

impl ResourceDef {
    /// `apiVersion` of objects of this resource.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Resource name qualified by group, as the apiserver writes it in messages
    /// (`pods`, `deployments.apps`).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Kind of a list of this resource.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

/// Position of namespaces in [`RESOURCES`].
pub const NAMESPACES: ResId = 0;
/// Position of nodes in [`RESOURCES`].
pub const NODES: ResId = 1;
/// Position of pods in [`RESOURCES`].
pub const PODS: ResId = 2;
/// Position of poddisruptionbudgets in [`RESOURCES`].
pub const PDBS: ResId = 9;

/// The served resources. The positions of namespaces, nodes, pods and PDBs are fixed by the
/// constants above.
pub static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        has_status: true,
        tracks_generation: false,
        categories: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        has_status: true,
        tracks_generation: false,
        categories: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short_names: &["po"],
        has_status: true,
        tracks_generation: true,
        categories: &["all"],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        short_names: &[],
        has_status: false,
        tracks_generation: false,
        categories: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        short_names: &["cm"],
        has_status: false,
        tracks_generation: false,
        categories: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        has_status: false,
        tracks_generation: false,
        categories: &[],
    },
    ResourceDef {
        group: "apps",
        version: "v1",
        plural: "daemonsets",
        singular: "daemonset",
        kind: "DaemonSet",
        namespaced: true,
        short_names: &["ds"],
        has_status: true,
        tracks_generation: true,
        categories: &["all"],
    },
    ResourceDef {
        group: "apps",
        version: "v1",
        plural: "replicasets",
        singular: "replicaset",
        kind: "ReplicaSet",
        namespaced: true,
        short_names: &["rs"],
        has_status: true,
        tracks_generation: true,
        categories: &["all"],
    },
    ResourceDef {
        group: "apps",
        version: "v1",
        plural: "deployments",
        singular: "deployment",
        kind: "Deployment",
        namespaced: true,
        short_names: &["deploy"],
        has_status: true,
        tracks_generation: true,
        categories: &["all"],
    },
    ResourceDef {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        kind: "PodDisruptionBudget",
        namespaced: true,
        short_names: &["pdb"],
        has_status: true,
        tracks_generation: true,
        categories: &[],
    },
    ResourceDef {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        short_names: &[],
        has_status: false,
        tracks_generation: false,
        categories: &[],
    },
    ResourceDef {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        has_status: false,
        tracks_generation: false,
        categories: &[],
    },
];

/// Finds a resource by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<ResId> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Finds a resource by plural name alone, preferring the core group (as kubectl does for
/// `events`). Used by the library helpers and the admin paths.
pub fn find_by_name(name: &str) -> Option<ResId> {
    let lower = name.to_ascii_lowercase();
    RESOURCES.iter().position(|r| {
        r.plural == lower
            || r.singular == lower
            || r.kind.eq_ignore_ascii_case(&lower)
            || r.short_names.contains(&lower.as_str())
            || r.qualified() == lower
    })
}

/// Finds a resource by `apiVersion` and `kind` of an object.
pub fn find_by_kind(api_version: &str, kind: &str) -> Option<ResId> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.kind == kind)
}

/// Group versions served, in discovery order: (group, version).
fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// `GET /api`.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ]
    })
}

/// `GET /apis`.
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = group_versions()
        .into_iter()
        .map(|(g, v)| group_json(g, v))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn group_json(group: &str, version: &str) -> Value {
    let gv = format!("{group}/{version}");
    json!({
        "name": group,
        "versions": [{"groupVersion": gv, "version": version}],
        "preferredVersion": {"groupVersion": gv, "version": version}
    })
}

/// `GET /apis/<group>`, if the group is served.
pub fn api_group(group: &str) -> Option<Value> {
    group_versions()
        .into_iter()
        .find(|(g, _)| *g == group)
        .map(|(g, v)| {
            let mut doc = group_json(g, v);
            if let Some(obj) = doc.as_object_mut() {
                obj.insert("kind".into(), json!("APIGroup"));
                obj.insert("apiVersion".into(), json!("v1"));
            }
            doc
        })
}

/// `GET /api/v1` or `GET /apis/<group>/<version>`, if served.
pub fn api_resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ALL_VERBS,
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        resources.push(entry);
        if r.plural == "pods" {
            // kubectl drain finds the eviction subresource and its group version here.
            resources.push(json!({
                "name": "pods/eviction",
                "singularName": "",
                "namespaced": true,
                "group": "policy",
                "version": "v1",
                "kind": "Eviction",
                "verbs": ["create"],
            }));
        }
        if r.has_status {
            resources.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": STATUS_VERBS,
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_positions_match_the_table() {
        assert_eq!(RESOURCES[NAMESPACES].plural, "namespaces");
        assert_eq!(RESOURCES[NODES].plural, "nodes");
        assert_eq!(RESOURCES[PODS].plural, "pods");
        assert_eq!(RESOURCES[PDBS].plural, "poddisruptionbudgets");
    }

    #[test]
    fn core_list_names_the_eviction_subresource() {
        let list = api_resource_list("", "v1").expect("core group");
        let eviction = list["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .find(|r| r["name"] == "pods/eviction")
            .expect("pods/eviction");
        assert_eq!(eviction["group"], "policy");
        assert_eq!(eviction["version"], "v1");
        assert_eq!(eviction["kind"], "Eviction");
    }

    #[test]
    fn lookups() {
        assert_eq!(find_by_name("po"), Some(PODS));
        assert_eq!(find_by_name("pdb"), Some(PDBS));
        assert_eq!(find_by_kind("policy/v1", "PodDisruptionBudget"), Some(PDBS));
        assert_eq!(find("apps", "v1", "deployments"), Some(8));
        assert_eq!(find_by_name("events"), Some(5));
    }
}
