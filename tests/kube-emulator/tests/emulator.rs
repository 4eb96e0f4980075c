//! The emulator over raw HTTP: semantics kubectl and kube-rs exercise less directly, the test
//! controls (admin paths, faults, refused connections), the binary, and shutdown.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kube_emulator::{Emulator, EmulatorHandle, EmulatorOptions, PodSeed};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Bound on any wait here.
const WAIT: Duration = Duration::from_secs(10);

struct Reply {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

async fn http(addr: SocketAddr, method: &str, path: &str, content_type: &str, body: &str) -> Reply {
    let mut s = TcpStream::connect(addr).await.expect("connects");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nUser-Agent: emulator-test/1.0\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("written");
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut raw))
        .await
        .expect("answer in time")
        .expect("read");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("headers end");
    let headers = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = headers
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    Reply {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

async fn get(addr: SocketAddr, path: &str) -> Reply {
    http(addr, "GET", path, "application/json", "").await
}

/// Reads a watch stream's events (de-chunked lines) until `n` arrived or the stream ends.
async fn watch_events(addr: SocketAddr, path: &str, n: usize) -> Vec<Value> {
    let s = TcpStream::connect(addr).await.expect("connects");
    let mut s = BufReader::new(s);
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    s.get_mut()
        .write_all(req.as_bytes())
        .await
        .expect("written");
    let mut out = Vec::new();
    let read = async {
        let mut line = String::new();
        loop {
            line.clear();
            if s.read_line(&mut line).await.unwrap_or(0) == 0 {
                break;
            }
            let t = line.trim();
            if t.starts_with('{') {
                for part in t.split('\n') {
                    if let Ok(v) = serde_json::from_str::<Value>(part) {
                        out.push(v);
                    }
                }
                if out.len() >= n {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(WAIT, read).await;
    out
}

async fn start(opts: EmulatorOptions) -> EmulatorHandle {
    Emulator::start(opts).await.expect("starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_documents() {
    let emu = start(EmulatorOptions::default()).await;
    let a = emu.addr();
    let v = get(a, "/version").await.json();
    assert_eq!(v["major"], "1");
    let api = get(a, "/api").await.json();
    assert_eq!(api["versions"], json!(["v1"]));
    let apis = get(a, "/apis").await.json();
    let groups: Vec<&str> = apis["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    assert_eq!(
        groups,
        ["apps", "policy", "coordination.k8s.io", "events.k8s.io"]
    );
    let core = get(a, "/api/v1").await.json();
    let names: Vec<&str> = core["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for n in [
        "pods",
        "pods/status",
        "pods/eviction",
        "nodes",
        "nodes/status",
        "namespaces",
        "events",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    let policy = get(a, "/apis/policy/v1").await.json();
    assert_eq!(policy["resources"][0]["shortNames"], json!(["pdb"]));
    assert_eq!(
        policy["resources"][1]["name"],
        "poddisruptionbudgets/status"
    );
    assert_eq!(get(a, "/openapi/v2").await.status, 404);
    assert_eq!(get(a, "/apis/nope/v1").await.status, 404);
    let nf = get(a, "/api/v1/namespaces/default/pods/x").await;
    assert_eq!(nf.status, 404);
    assert_eq!(nf.json()["details"], json!({"name": "x", "kind": "pods"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_semantics_over_http() {
    let emu = start(EmulatorOptions::default()).await;
    let a = emu.addr();
    emu.seed_pod(PodSeed::new("default", "a").label("app", "x"))
        .expect("pod");
    let rv = emu.resource_version();
    emu.seed_pod(PodSeed::new("default", "b").label("app", "x"))
        .expect("pod");

    // From a version: only later events; timeoutSeconds ends the stream.
    let started = Instant::now();
    let ev = watch_events(
        a,
        &format!(
            "/api/v1/namespaces/default/pods?watch=true&resourceVersion={rv}&timeoutSeconds=1"
        ),
        99,
    )
    .await;
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0]["type"], "ADDED");
    assert_eq!(ev[0]["object"]["metadata"]["name"], "b");
    assert!(started.elapsed() >= Duration::from_millis(900));

    // Without a version: synthetic ADDED for current objects; with sendInitialEvents, the
    // initial-events-end bookmark after them.
    let ev = watch_events(
        a,
        "/api/v1/pods?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&labelSelector=app%3Dx",
        3,
    )
    .await;
    assert_eq!(ev.len(), 3);
    assert_eq!(
        (ev[0]["type"].as_str(), ev[1]["type"].as_str()),
        (Some("ADDED"), Some("ADDED"))
    );
    assert_eq!(ev[2]["type"], "BOOKMARK");
    assert_eq!(
        ev[2]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // Too old: an ERROR event carrying a 410 Status.
    emu.compact_history();
    let ev = watch_events(a, "/api/v1/pods?watch=1&resourceVersion=2", 1).await;
    assert_eq!(ev[0]["type"], "ERROR");
    assert_eq!(ev[0]["object"]["code"], 410);
    assert_eq!(ev[0]["object"]["reason"], "Expired");

    // PDB status changes are watch events too.
    emu.create(
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                      "metadata": {"name": "b", "namespace": "default"},
                      "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "x"}}}}),
    )
    .expect("pdb");
    let rv = emu.resource_version();
    let e2 = tokio::spawn({
        let path = format!(
            "/apis/policy/v1/namespaces/default/poddisruptionbudgets?watch=1&resourceVersion={rv}"
        );
        async move { watch_events(a, &path, 2).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    emu.set_pod_ready("default", "a", true).expect("ready");
    emu.set_pod_ready("default", "b", true).expect("ready");
    let ev = e2.await.expect("watch");
    assert_eq!(ev.len(), 2);
    assert!(ev.iter().all(|e| e["type"] == "MODIFIED"));
    assert_eq!(ev[1]["object"]["status"]["disruptionsAllowed"], 1);
    assert_eq!(
        ev[1]["object"]["status"]["conditions"][0]["reason"],
        "SufficientPods"
    );
    let history = emu.pdb_history("default", "b");
    assert_eq!(
        history
            .iter()
            .map(|h| h.current_healthy)
            .collect::<Vec<_>>(),
        [0, 1, 2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_follow_the_apiserver() {
    let emu = start(EmulatorOptions::default()).await;
    let a = emu.addr();
    let dep = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                     "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}}}});
    let r = http(
        a,
        "POST",
        "/apis/apps/v1/namespaces/default/deployments",
        "application/json",
        &dep.to_string(),
    )
    .await;
    assert_eq!(r.status, 201);
    let created = r.json();
    assert_eq!(created["metadata"]["generation"], 1);

    // Labels do not bump generation; spec does. Status on the main resource is ignored.
    let r = http(
        a,
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/d",
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"x":"y"}},"status":{"replicas":9}}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["metadata"]["generation"], 1);
    assert!(r.json().get("status").is_none());
    let r = http(
        a,
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/d",
        "application/merge-patch+json",
        r#"{"spec":{"replicas":3}}"#,
    )
    .await;
    assert_eq!(r.json()["metadata"]["generation"], 2);
    let r = http(
        a,
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/d/status",
        "application/merge-patch+json",
        r#"{"spec":{"replicas":7},"status":{"replicas":3}}"#,
    )
    .await;
    assert_eq!(r.json()["status"]["replicas"], 3);
    assert_eq!(r.json()["spec"]["replicas"], 3);

    // A no-op write keeps the resourceVersion.
    let before = r.json()["metadata"]["resourceVersion"].clone();
    let r = http(
        a,
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/d",
        "application/merge-patch+json",
        "{}",
    )
    .await;
    assert_eq!(r.json()["metadata"]["resourceVersion"], before);

    // Server-side apply creates, then merges; fieldManager is required.
    let cfg = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  labels: {a: b}\ndata:\n  k: v\n";
    let r = http(
        a,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/applied",
        "application/apply-patch+yaml",
        cfg,
    )
    .await;
    assert_eq!(r.status, 422);
    let r = http(
        a,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/applied?fieldManager=t",
        "application/apply-patch+yaml",
        cfg,
    )
    .await;
    assert_eq!(r.status, 201);
    let r = http(
        a,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/applied?fieldManager=t&force=true",
        "application/apply-patch+yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  labels: {c: d}\n",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["metadata"]["labels"], json!({"a": "b", "c": "d"}));

    // Delete preconditions.
    let uid = r.json()["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    let r = http(
        a,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/applied",
        "application/json",
        r#"{"preconditions":{"uid":"not-it"}}"#,
    )
    .await;
    assert_eq!(r.status, 409);
    assert!(
        r.json()["message"]
            .as_str()
            .expect("message")
            .contains("Precondition failed: UID in precondition: not-it")
    );
    let r = http(
        a,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/applied",
        "application/json",
        &json!({"preconditions": {"uid": uid}}).to_string(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "Success");
    assert_eq!(r.json()["details"]["uid"], uid.as_str());

    // Unsupported patch type, bad selectors, wrong methods.
    let r = http(
        a,
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/d",
        "text/plain",
        "{}",
    )
    .await;
    assert_eq!(r.status, 415);
    assert_eq!(
        get(a, "/api/v1/pods?fieldSelector=spec.bogus%3D1")
            .await
            .status,
        400
    );
    assert_eq!(
        get(a, "/api/v1/pods?labelSelector=a%20in%20b").await.status,
        400
    );
    assert_eq!(
        http(a, "POST", "/api/v1/pods", "application/json", "{}")
            .await
            .status,
        405
    );

    // A pod's status is the server's on create.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "g-"},
                     "spec": {"containers": [{"name": "c", "image": "i"}]},
                     "status": {"phase": "Running"}});
    let r = http(
        a,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        &pod.to_string(),
    )
    .await;
    assert_eq!(r.status, 201);
    let created = r.json();
    assert_eq!(
        created["status"],
        json!({"phase": "Pending", "qosClass": "BestEffort"})
    );
    assert!(
        created["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("g-") && n.len() == 7)
    );
    assert_eq!(created["spec"]["terminationGracePeriodSeconds"], 30);
    let name = created["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    emu.delete("pods", Some("default"), &name)
        .expect("unbound pods go at once");

    // deletecollection by label.
    for i in 0..3 {
        emu.seed_pod(
            PodSeed::new("default", &format!("p{i}"))
                .label("batch", if i < 2 { "yes" } else { "no" }),
        )
        .expect("pod");
    }
    let r = http(
        a,
        "DELETE",
        "/api/v1/namespaces/default/pods?labelSelector=batch%3Dyes",
        "application/json",
        "",
    )
    .await;
    assert_eq!(r.json()["items"].as_array().map(Vec::len), Some(2));
    assert_eq!(emu.list("pods", Some("default")).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_paths_and_faults() {
    let emu = start(EmulatorOptions::default()).await;
    let a = emu.addr();
    emu.seed_pod(PodSeed::new("default", "p").node("n1"))
        .expect("pod");
    let r = http(
        a,
        "PUT",
        "/emulator/pods/default/p/ready",
        "application/json",
        r#"{"ready":true}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"]["phase"], "Running");

    let r = http(
        a,
        "POST",
        "/emulator/faults",
        "application/json",
        r#"{"verb":"list","resource":"nodes","code":429,"count":1,"retryAfterSeconds":2}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    let r = get(a, "/api/v1/nodes").await;
    assert_eq!(r.status, 429);
    assert!(
        r.headers.to_ascii_lowercase().contains("retry-after: 2"),
        "{}",
        r.headers
    );
    assert_eq!(r.json()["reason"], "TooManyRequests");
    assert_eq!(get(a, "/api/v1/nodes").await.status, 200);

    http(
        a,
        "PUT",
        "/emulator/latency",
        "application/json",
        r#"{"millis":150}"#,
    )
    .await;
    let t = Instant::now();
    get(a, "/api/v1/nodes").await;
    assert!(t.elapsed() >= Duration::from_millis(150));
    http(a, "DELETE", "/emulator/faults", "application/json", "").await;

    let counts = get(a, "/emulator/requests").await.json();
    let lists = counts["counts"]
        .as_array()
        .expect("counts")
        .iter()
        .find(|c| c["verb"] == "list" && c["resource"] == "nodes")
        .expect("list nodes counted")
        .clone();
    assert_eq!(lists["count"], 3);
    assert_eq!(lists["userAgent"], "emulator-test/1.0");
    assert_eq!(emu.count_requests("list", "nodes", "emulator-test"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_connections_then_reopening_the_same_port() {
    let emu = start(EmulatorOptions::default()).await;
    let a = emu.addr();
    assert_eq!(get(a, "/healthz").await.status, 200);
    let watch = tokio::spawn(async move { watch_events(a, "/api/v1/pods?watch=1", 99).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    emu.refuse_connections(Duration::from_millis(500)).await;
    let refused = TcpStream::connect(a).await;
    assert!(refused.is_err(), "connection should be refused");
    // The open watch was cut as well.
    tokio::time::timeout(WAIT, watch)
        .await
        .expect("watch ended")
        .expect("joined");
    let t = Instant::now();
    loop {
        if TcpStream::connect(a).await.is_ok() {
            break;
        }
        assert!(t.elapsed() < WAIT, "port never reopened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get(a, "/healthz").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_with_open_watches_does_not_hang() {
    let emu = start(EmulatorOptions::default()).await;
    let a = emu.addr();
    let watch = tokio::spawn(async move { watch_events(a, "/api/v1/pods?watch=1", 99).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    drop(emu);
    tokio::time::timeout(WAIT, watch)
        .await
        .expect("watch ended")
        .expect("joined");
    assert!(t.elapsed() < Duration::from_secs(2));
    // Not "connecting to its port fails": the tests of this binary run in parallel, each with
    // emulators on ephemeral ports, and the kernel may hand the freed port to the next one (seen
    // under load). The watch ending promptly is what shows the server stopped.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_serves_seeds_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seed = dir.path().join("seed.yaml");
    std::fs::write(
        &seed,
        "apiVersion: v1\nkind: Node\nmetadata: {name: seeded}\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: c, namespace: default}\n",
    )
    .expect("seed");
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-emulator"))
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .arg("--seed")
        .arg(&seed)
        .args(["--grace-scale", "0.01"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("binary starts");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut url = String::new();
    tokio::time::timeout(WAIT, out.read_line(&mut url))
        .await
        .expect("URL printed")
        .expect("read");
    let url = url.trim();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let config = std::fs::read_to_string(&kubeconfig).expect("kubeconfig written");
    assert!(config.contains(&format!("server: {url}")));
    assert!(config.contains("current-context: kube-emulator"));
    let addr: SocketAddr = url.trim_start_matches("http://").parse().expect("address");
    let nodes = get(addr, "/api/v1/nodes").await.json();
    assert_eq!(nodes["items"][0]["metadata"]["name"], "seeded");
    assert_eq!(
        get(addr, "/api/v1/namespaces/default/configmaps/c")
            .await
            .status,
        200
    );

    let pid = child.id().expect("pid").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("exits after SIGTERM")
        .expect("waited");
    assert!(status.success(), "{status:?}");
}
