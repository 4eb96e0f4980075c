//! A machine simulator and a scheduler stand-in, so scaler tests see the whole life of a node
//! without clouds or kubelets.
//!
//! The simulator "boots" each server created in the [`CherryEmulator`]: it reads the server's
//! user data, finds the bootstrap token in it and checks it against a live, unexpired
//! `bootstrap-token-<id>` Secret in the kube-emulator — as kube-apiserver's bootstrap
//! authenticator would — and only then registers a Node with the labels from kubelet's
//! `node-labels` and the startup taint, which it removes after `ready_after` as the agent would.
//! The scheduler stand-in binds pending pods first-fit, and marks the rest
//! `PodScheduled=False/Unschedulable` as kube-scheduler does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube_emulator::EmulatorHandle;
use serde_json::{Value, json};

use crate::CherryEmulator;

/// The startup taint the agent removes.
pub const STARTUP_TAINT: &str = "readiness.k8s.io/nodeward";

/// How simulated machines behave.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// From server creation to Node registration.
    pub boot_after: Duration,
    /// From registration to the startup taint's removal.
    pub ready_after: Duration,
    /// Hostnames containing any of these never boot.
    pub never_boot: Vec<String>,
    /// Node allocatable CPU.
    pub cpu: String,
    /// Node allocatable memory.
    pub memory: String,
    /// How often the simulator looks.
    pub poll: Duration,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            boot_after: Duration::from_millis(200),
            ready_after: Duration::from_millis(200),
            never_boot: Vec::new(),
            cpu: "4".into(),
            memory: "16Gi".into(),
            poll: Duration::from_millis(50),
        }
    }
}

/// What the simulator saw.
#[derive(Debug, Default, Clone)]
pub struct SimReport {
    /// Hostnames that registered.
    pub booted: Vec<String>,
    /// Hostnames refused, with why (no token, unknown token, expired, wrong secret).
    pub refused: Vec<(String, String)>,
}

/// A running simulator; dropping it stops it.
#[derive(Debug)]
pub struct Simulator {
    report: Arc<Mutex<SimReport>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Simulator {
    /// Starts watching the Cherry emulator's servers.
    pub fn start(cherry: Arc<CherryEmulator>, kube: Arc<EmulatorHandle>, opts: SimOptions) -> Self {
        let report = Arc::new(Mutex::new(SimReport::default()));
        let r2 = report.clone();
        let task = tokio::spawn(async move {
            let mut first_seen: HashMap<u64, Instant> = HashMap::new();
            let mut done: HashSet<u64> = HashSet::new();
            let mut registered: HashMap<String, Instant> = HashMap::new();
            loop {
                for s in cherry.servers() {
                    let Some(id) = s.get("id").and_then(Value::as_u64) else {
                        continue;
                    };
                    if done.contains(&id) {
                        continue;
                    }
                    let seen = *first_seen.entry(id).or_insert_with(Instant::now);
                    let host = s
                        .get("hostname")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    if opts.never_boot.iter().any(|p| host.contains(p.as_str())) {
                        done.insert(id);
                        continue;
                    }
                    if seen.elapsed() < opts.boot_after {
                        continue;
                    }
                    done.insert(id);
                    let user_data = cherry.user_data(id).unwrap_or_default();
                    if let Err(why) = check_token(&kube, &user_data) {
                        lock(&r2).refused.push((host, why));
                        continue;
                    }
                    let labels = node_labels(&user_data);
                    if kube.create(node(&host, &labels, &opts)).is_ok() {
                        cherry.set_state(id, "active");
                        registered.insert(host.clone(), Instant::now());
                        lock(&r2).booted.push(host);
                    }
                }
                registered.retain(|host, at| {
                    if at.elapsed() < opts.ready_after {
                        return true;
                    }
                    let _ = kube.modify("nodes", None, host, |n| {
                        if let Some(t) = n.pointer_mut("/spec/taints").and_then(Value::as_array_mut)
                        {
                            t.retain(|t| {
                                t.get("key").and_then(Value::as_str) != Some(STARTUP_TAINT)
                            });
                        }
                    });
                    false
                });
                tokio::time::sleep(opts.poll).await;
            }
        });
        Self { report, task }
    }

    /// What happened so far.
    pub fn report(&self) -> SimReport {
        lock(&self.report).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The bootstrap token (`[a-z0-9]{6}.[a-z0-9]{16}`) in rendered user data, as (id, secret).
pub fn find_bootstrap_token(user_data: &str) -> Option<(String, String)> {
    let bytes = user_data.as_bytes();
    let is_tok = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (0..bytes.len().saturating_sub(22)).find_map(|i| {
        let w = &bytes[i..i + 23];
        let boundary_ok = i == 0 || !is_tok(&bytes[i - 1]);
        let end_ok = bytes.get(i + 23).is_none_or(|b| !is_tok(b));
        (boundary_ok
            && end_ok
            && w[6] == b'.'
            && w[..6].iter().all(is_tok)
            && w[7..].iter().all(is_tok))
        .then(|| {
            (
                user_data[i..i + 6].to_string(),
                user_data[i + 7..i + 23].to_string(),
            )
        })
    })
}

/// Finds the bootstrap token in the user data and checks it as the apiserver would.
fn check_token(kube: &EmulatorHandle, user_data: &str) -> Result<(), String> {
    let Some((id, secret)) = find_bootstrap_token(user_data) else {
        return Err("no bootstrap token in the user data".into());
    };
    let obj = kube
        .get(
            "secrets",
            Some("kube-system"),
            &format!("bootstrap-token-{id}"),
        )
        .ok_or_else(|| format!("no Secret for token id {id}"))?;
    if obj.get("type").and_then(Value::as_str) != Some("bootstrap.kubernetes.io/token") {
        return Err("the Secret is not a bootstrap token".into());
    }
    let field = |k: &str| {
        obj.pointer(&format!("/data/{k}"))
            .and_then(Value::as_str)
            .and_then(crate::decode_base64)
            .unwrap_or_default()
    };
    if field("token-secret") != secret {
        return Err("the token secret does not match".into());
    }
    if field("usage-bootstrap-authentication") != "true" {
        return Err("the token is not usable for authentication".into());
    }
    let expires: jiff::Timestamp = field("expiration")
        .parse()
        .map_err(|_| "no valid expiration".to_string())?;
    if expires <= jiff::Timestamp::now() {
        return Err("the token has expired".into());
    }
    Ok(())
}

/// Labels from kubelet's `node-labels` argument in the rendered kubeadm configuration: either
/// `node-labels: "k=v,..."` (v1beta3) or `- name: node-labels` / `value: "k=v,..."` (v1beta4).
pub fn node_labels(user_data: &str) -> BTreeMap<String, String> {
    let lines: Vec<&str> = user_data.lines().map(str::trim).collect();
    let quoted = |l: &str, prefix: &str| {
        l.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix('"'))
            .map(str::to_string)
    };
    lines
        .iter()
        .enumerate()
        .find_map(|(i, l)| {
            quoted(l, "node-labels: \"").or_else(|| {
                (*l == "- name: node-labels")
                    .then(|| lines.get(i + 1).and_then(|next| quoted(next, "value: \"")))
                    .flatten()
            })
        })
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn node(name: &str, labels: &BTreeMap<String, String>, opts: &SimOptions) -> Value {
    let mut n = kube_emulator::node_json(name);
    if let Some(m) = n
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        for (k, v) in labels {
            m.insert(k.clone(), json!(v));
        }
    }
    n["spec"]["taints"] = json!([{"key": STARTUP_TAINT, "effect": "NoSchedule"}]);
    let res = json!({"cpu": opts.cpu, "memory": opts.memory, "pods": "110"});
    n["status"]["capacity"] = res.clone();
    n["status"]["allocatable"] = res;
    n
}

/// A quantity in milli-units (enough of the grammar for test pods: m, Ki, Mi, Gi, plain).
fn milli(q: &str) -> i64 {
    let (num, mul) = if let Some(n) = q.strip_suffix('m') {
        (n, 1.0)
    } else if let Some(n) = q.strip_suffix("Ki") {
        (n, 1024.0 * 1000.0)
    } else if let Some(n) = q.strip_suffix("Mi") {
        (n, 1024.0 * 1024.0 * 1000.0)
    } else if let Some(n) = q.strip_suffix("Gi") {
        (n, 1024.0 * 1024.0 * 1024.0 * 1000.0)
    } else {
        (q, 1000.0)
    };
    (num.parse::<f64>().unwrap_or(0.0) * mul) as i64
}

fn requests(pod: &Value) -> (i64, i64) {
    let mut cpu = 0;
    let mut mem = 0;
    for c in pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let r = |k: &str| {
            c.pointer(&format!("/resources/requests/{k}"))
                .and_then(Value::as_str)
                .map_or(0, milli)
        };
        cpu += r("cpu");
        mem += r("memory");
    }
    (cpu, mem)
}

/// One scheduling round: binds every unbound pod that fits a Ready, untainted, schedulable node
/// (first fit, by node name) and marks the others Unschedulable. Returns how many were bound.
pub fn schedule_once(kube: &EmulatorHandle) -> usize {
    let nodes = kube.list("nodes", None);
    let pods = kube.list("pods", None);
    let mut free: BTreeMap<String, (i64, i64, i64)> = BTreeMap::new();
    for n in &nodes {
        let ready = n
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        let tainted = n
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty());
        let cordoned = n
            .pointer("/spec/unschedulable")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if !ready || tainted || cordoned {
            continue;
        }
        let a = |k: &str| {
            n.pointer(&format!("/status/allocatable/{k}"))
                .and_then(Value::as_str)
                .map_or(0, milli)
        };
        let name = n
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        free.insert(name, (a("cpu"), a("memory"), a("pods") / 1000));
    }
    for p in &pods {
        if p.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        if let Some(n) = p.pointer("/spec/nodeName").and_then(Value::as_str)
            && let Some(f) = free.get_mut(n)
        {
            let (c, m) = requests(p);
            f.0 -= c;
            f.1 -= m;
            f.2 -= 1;
        }
    }
    let mut bound = 0;
    for p in &pods {
        if p.pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some()
            || p.pointer("/metadata/deletionTimestamp").is_some()
        {
            continue;
        }
        let ns = p
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let name = p
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let (c, m) = requests(p);
        let target = free
            .iter_mut()
            .find(|(_, f)| f.0 >= c && f.1 >= m && f.2 >= 1);
        // A pod deleted between the list and here is simply skipped.
        let _ = match target {
            Some((node, f)) => {
                f.0 -= c;
                f.1 -= m;
                f.2 -= 1;
                let node = node.clone();
                bound += 1;
                kube.modify("pods", Some(&ns), &name, |p| {
                    p["spec"]["nodeName"] = json!(node);
                    p["status"] = json!({"phase": "Running", "conditions": [
                        {"type": "PodScheduled", "status": "True"},
                        {"type": "Ready", "status": "True"}]});
                })
            }
            None => kube.modify("pods", Some(&ns), &name, |p| {
                p["status"] = json!({"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": "0/N nodes are available"}]});
            }),
        };
    }
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_from_user_data() {
        for ud in [
            "x\n          node-labels: \"a=b,nodeward.io/node-group=web\"\n",
            "x\n  - name: node-labels\n    value: \"a=b,nodeward.io/node-group=web\"\n",
        ] {
            let l = node_labels(ud);
            assert_eq!(
                l.get("nodeward.io/node-group").map(String::as_str),
                Some("web"),
                "{ud}"
            );
        }
        assert_eq!(milli("500m"), 500);
        assert_eq!(milli("1Gi"), 1024 * 1024 * 1024 * 1000);
    }
}
