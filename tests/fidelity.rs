//! kube-emulator held to kube-apiserver: the same scripted scenarios on both, and what a client
//! sees — status codes, `reason`, `details.causes`, eviction answers, budget status, selectors,
//! finalizers, `kubectl create namespace` — compared line by line. A difference fails the test;
//! a difference the emulator keeps on purpose is listed in `KNOWN_GAPS` with its reason (and in
//! tests/kube-emulator/README.md; the suite is described in docs/src/control-plane.md).
//!
//! Needs the real control plane (`NODEWARD_CONTROL_PLANE`, see tests/common).

mod common;

use std::time::Duration;

use common::{Cluster, unique};
use kube::api::Api;
use serde_json::{Value, json};

/// What a client observed, one line per step.
type Transcript = Vec<String>;

/// Differences kept on purpose: (step prefix, why it is acceptable).
const KNOWN_GAPS: &[(&str, &str)] = &[(
    "kubectl create namespace",
    "kubectl's typed create commands send protobuf; the emulator decodes JSON and YAML only and \
     answers 415 UnsupportedMediaType (it used to answer a misleading 400). Every client nodeward \
     and its tests use (kube-rs, kubectl apply/create -f) sends JSON.",
)];

/// One raw request; the line records status code, `reason` and the `details.causes` reasons.
async fn call(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(
            "content-type",
            if method == "PATCH" {
                "application/merge-patch+json"
            } else {
                "application/json"
            },
        )
        .body(
            body.map(|b| serde_json::to_vec(&b).expect("json"))
                .unwrap_or_default(),
        )
        .expect("request");
    let resp = client
        .send(req.map(kube::client::Body::from))
        .await
        .expect("send");
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn line(step: &str, code: u16, v: &Value) -> String {
    let mut causes: Vec<String> = v
        .pointer("/details/causes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("reason").and_then(Value::as_str).map(str::to_string))
        .collect();
    causes.sort();
    let reason = if v.get("kind").and_then(Value::as_str) == Some("Status") {
        v.get("reason").and_then(Value::as_str).unwrap_or("")
    } else {
        ""
    };
    format!("{step}: {code} {reason} {causes:?}")
}

async fn step(
    t: &mut Transcript,
    client: &kube::Client,
    step: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Value {
    let (code, v) = call(client, method, path, body).await;
    t.push(line(step, code, &v));
    if code >= 400 {
        eprintln!("{step}: {v}");
    }
    v
}

fn pod(ns: &str, name: &str, node: &str, app: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
}

fn pdb(ns: &str, name: &str, app: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": app}});
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn eviction(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}})
}

/// Waits until `pods` of `ns` are Ready and every budget in `ns` reports status for its current
/// generation with as many healthy pods as Ready pods its selector (`matchLabels`) selects (the
/// real disruption controller and kwok act asynchronously, and the controller recomputes on
/// pod changes after the budget's own).
async fn settle(t: &mut Transcript, client: &kube::Client, ns: &str, pods: &[&str]) {
    let t0 = std::time::Instant::now();
    loop {
        let (_, budgets) = call(
            client,
            "GET",
            &format!("/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"),
            None,
        )
        .await;
        let (_, all) = call(
            client,
            "GET",
            &format!("/api/v1/namespaces/{ns}/pods"),
            None,
        )
        .await;
        let all: Vec<&Value> = all["items"].as_array().into_iter().flatten().collect();
        let is_ready = |p: &Value| {
            p.pointer("/metadata/deletionTimestamp").is_none()
                && p.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
        };
        let ready = all
            .iter()
            .filter(|p| pods.contains(&p["metadata"]["name"].as_str().unwrap_or("")) && is_ready(p))
            .count();
        let budgets_done = budgets["items"].as_array().into_iter().flatten().all(|b| {
            let labels = b
                .pointer("/spec/selector/matchLabels")
                .and_then(Value::as_object);
            let healthy = all
                .iter()
                .filter(|p| {
                    is_ready(p)
                        && labels.is_some_and(|m| {
                            m.iter().all(|(k, v)| p["metadata"]["labels"][k] == *v)
                        })
                })
                .count();
            b.pointer("/status/observedGeneration") == b.pointer("/metadata/generation")
                && b.pointer("/status/currentHealthy").and_then(Value::as_u64)
                    == Some(healthy as u64)
        });
        if budgets_done && ready == pods.len() {
            t.push(format!("settled: {} pods Ready", pods.len()));
            return;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            t.push(format!(
                "settled: NO ({ready} of {} pods Ready)",
                pods.len()
            ));
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The scenario, on one backend. `node` exists and runs pods bound to it.
async fn scenario(cluster: &Cluster, node: &str, ns: &str) -> Transcript {
    let c = cluster.admin().await;
    let mut t = Transcript::new();
    // Namespaces, as `kubectl create namespace` does it, and twice.
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    for attempt in ["create namespace", "create namespace again"] {
        let out = std::process::Command::new(&kubectl)
            .args(["--kubeconfig"])
            .arg(cluster.admin_kubeconfig())
            .args(["create", "namespace", ns])
            .output()
            .unwrap_or_else(|e| panic!("run {kubectl} (set KUBECTL; tests/kube-emulator/install-kubectl.sh installs it): {e}"));
        let err = String::from_utf8_lossy(&out.stderr);
        let what = if err.contains("AlreadyExists") || err.contains("already exists") {
            "already exists"
        } else {
            err.trim()
        };
        t.push(format!(
            "kubectl {attempt}: exit {:?} {what}",
            out.status.code()
        ));
    }
    let out = std::process::Command::new(&kubectl)
        .args(["--kubeconfig"])
        .arg(cluster.admin_kubeconfig())
        .args(["apply", "--validate=false", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().expect("stdin").write_all(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
                    .to_string()
                    .as_bytes(),
            )?;
            child.wait_with_output()
        })
        .expect("kubectl apply");
    t.push(format!(
        "kubectl apply namespace: exit {:?}",
        out.status.code()
    ));
    let (_, nsobj) = call(&c, "GET", &format!("/api/v1/namespaces/{ns}"), None).await;
    t.push(format!(
        "namespace phase: {}",
        nsobj.pointer("/status/phase").unwrap_or(&Value::Null)
    ));

    // Errors a client meets.
    step(
        &mut t,
        &c,
        "get missing pod",
        "GET",
        &format!("/api/v1/namespaces/{ns}/pods/nope"),
        None,
    )
    .await;
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    for i in 0..3 {
        step(
            &mut t,
            &c,
            &format!("create web-{i}"),
            "POST",
            &pods,
            Some(pod(ns, &format!("web-{i}"), node, "web")),
        )
        .await;
    }
    step(
        &mut t,
        &c,
        "create duplicate",
        "POST",
        &pods,
        Some(pod(ns, "web-0", node, "web")),
    )
    .await;
    step(&mut t, &c, "create invalid (no containers)", "POST", &pods,
        Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"}, "spec": {"containers": []}}))).await;
    step(&mut t, &c, "update with a stale resourceVersion", "PUT", &format!("{pods}/web-0"),
        Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0", "namespace": ns, "resourceVersion": "1"},
                    "spec": pod(ns, "web-0", node, "web")["spec"]}))).await;

    // Selectors.
    let (_, l) = call(
        &c,
        "GET",
        &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}&labelSelector=app%3Dweb"),
        None,
    )
    .await;
    let mut names: Vec<&str> = l["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.pointer("/metadata/name").and_then(Value::as_str))
        .collect();
    names.sort_unstable();
    t.push(format!("pods by node and label: {names:?}"));
    step(
        &mut t,
        &c,
        "unsupported field selector",
        "GET",
        "/api/v1/pods?fieldSelector=spec.nope%3Dx",
        None,
    )
    .await;

    // Budgets and the Eviction API.
    let pdbs = format!("/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets");
    step(
        &mut t,
        &c,
        "create budget minAvailable 3",
        "POST",
        &pdbs,
        Some(pdb(ns, "web", "web", json!({"minAvailable": 3}))),
    )
    .await;
    settle(&mut t, &c, ns, &["web-0", "web-1", "web-2"]).await;
    let (_, b) = call(&c, "GET", &format!("{pdbs}/web"), None).await;
    t.push(format!(
        "budget status: healthy {} desired {} allowed {} expected {}",
        b.pointer("/status/currentHealthy").unwrap_or(&Value::Null),
        b.pointer("/status/desiredHealthy").unwrap_or(&Value::Null),
        b.pointer("/status/disruptionsAllowed")
            .unwrap_or(&Value::Null),
        b.pointer("/status/expectedPods").unwrap_or(&Value::Null)
    ));
    step(
        &mut t,
        &c,
        "evict under a closed budget",
        "POST",
        &format!("{pods}/web-0/eviction"),
        Some(eviction(ns, "web-0")),
    )
    .await;
    step(
        &mut t,
        &c,
        "relax budget to minAvailable 2",
        "PATCH",
        &format!("{pdbs}/web"),
        Some(json!({"spec": {"minAvailable": 2}})),
    )
    .await;
    settle(&mut t, &c, ns, &["web-0", "web-1", "web-2"]).await;
    step(
        &mut t,
        &c,
        "evict under an open budget",
        "POST",
        &format!("{pods}/web-0/eviction"),
        Some(eviction(ns, "web-0")),
    )
    .await;
    step(
        &mut t,
        &c,
        "evict a missing pod",
        "POST",
        &format!("{pods}/nope/eviction"),
        Some(eviction(ns, "nope")),
    )
    .await;
    // Two budgets on one pod.
    step(
        &mut t,
        &c,
        "create second budget",
        "POST",
        &pdbs,
        Some(pdb(ns, "web-too", "web", json!({"maxUnavailable": 1}))),
    )
    .await;
    settle(&mut t, &c, ns, &["web-1", "web-2"]).await;
    step(
        &mut t,
        &c,
        "evict a pod under two budgets",
        "POST",
        &format!("{pods}/web-1/eviction"),
        Some(eviction(ns, "web-1")),
    )
    .await;
    step(
        &mut t,
        &c,
        "delete second budget",
        "DELETE",
        &format!("{pdbs}/web-too"),
        None,
    )
    .await;

    // Finalizers and graceful deletion, on an object no kubelet touches.
    let cms = format!("/api/v1/namespaces/{ns}/configmaps");
    step(&mut t, &c, "create configmap with finalizer", "POST", &cms,
        Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "held", "finalizers": ["nodeward.io/test"]}}))).await;
    let v = step(
        &mut t,
        &c,
        "delete it",
        "DELETE",
        &format!("{cms}/held"),
        None,
    )
    .await;
    t.push(format!(
        "after delete: deletionTimestamp set {}",
        v.pointer("/metadata/deletionTimestamp").is_some()
    ));
    step(
        &mut t,
        &c,
        "get it while finalizing",
        "GET",
        &format!("{cms}/held"),
        None,
    )
    .await;
    step(
        &mut t,
        &c,
        "remove finalizer",
        "PATCH",
        &format!("{cms}/held"),
        Some(json!({"metadata": {"finalizers": null}})),
    )
    .await;
    step(
        &mut t,
        &c,
        "get it after",
        "GET",
        &format!("{cms}/held"),
        None,
    )
    .await;
    t
}

async fn emulator_matches_kube_apiserver(real: Cluster) {
    let emu = Cluster::emulator().await;
    let node = unique("fidelity");
    real.add_node(&node, &[], json!([])).await;
    emu.add_node(&node, &[], json!([])).await;
    let ns = unique("fidelity");
    let want = scenario(&real, &node, &ns).await;
    let got = scenario(&emu, &node, &ns).await;
    let mut diffs = Vec::new();
    eprintln!("kube-emulator transcript:\n  {}", got.join("\n  "));
    for (w, g) in want.iter().zip(&got) {
        if w != g && !KNOWN_GAPS.iter().any(|(p, _)| w.starts_with(p)) {
            diffs.push(format!("  kube-apiserver: {w}\n  kube-emulator:  {g}"));
        }
    }
    eprintln!("kube-apiserver transcript:\n  {}", want.join("\n  "));
    assert_eq!(
        want.len(),
        got.len(),
        "transcripts differ in length:\n{want:#?}\n{got:#?}"
    );
    assert!(
        diffs.is_empty(),
        "kube-emulator differs from kube-apiserver:\n{}",
        diffs.join("\n")
    );
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(real.admin().await)
        .delete(&ns, &Default::default())
        .await;
    real.remove_node(&node).await;
}

real_only! {
    kube_emulator_answers_as_kube_apiserver_does => super::emulator_matches_kube_apiserver;
}
