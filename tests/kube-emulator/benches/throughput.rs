//! List and watch throughput of the emulator at nodeward's target scale: 5,000 nodes, 150,000
//! pods, 5,000 watchers. Prints figures; asserts nothing about time.
//!
//! Run: `cargo bench -p kube-emulator --bench throughput` (release build). Sizes can be changed
//! with `BENCH_NODES`, `BENCH_PODS_PER_NODE`, `BENCH_WATCHERS` and `BENCH_EVENTS`.
//!
//! The clients are plain HTTP/1.1 over TCP in the same process (one connection per watcher, as
//! each node agent has), so the figures include the loopback transfer and both ends share the
//! machine's cores.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kube_emulator::{Emulator, EmulatorOptions, node_json};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Nodes at nodeward's target cluster size.
const DEFAULT_NODES: usize = 5_000;
/// 150,000 pods over 5,000 nodes.
const DEFAULT_PODS_PER_NODE: usize = 30;
/// One watcher per node agent.
const DEFAULT_WATCHERS: usize = 5_000;
/// Node changes fanned out to every watcher.
const DEFAULT_EVENTS: usize = 100;
/// Rounds of one pod change per node for the node-indexed pod watches.
const POD_ROUNDS: usize = 10;
/// Requests timed for the one-node list.
const NODE_LISTS: usize = 200;
/// Connections opened at once while starting watchers (below the listen backlog).
const CONNECT_BATCH: usize = 500;
/// Give up on a phase after this long.
const PHASE_LIMIT: Duration = Duration::from_secs(120);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

fn pod(node: &str, i: usize) -> Value {
    let ts = "2025-01-01T00:00:00Z";
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{node}-pod-{i:02}"),
            "namespace": format!("ns-{}", i % 10),
            "labels": {"app": format!("app-{}", i % 10)},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("app-{}", i % 10),
                                 "uid": "00000000-0000-4000-a000-000000000000", "controller": true}]
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ts}]}
    })
}

/// Sends a GET on a kept-alive connection and reads the whole (Content-Length) response.
async fn get(conn: &mut BufReader<TcpStream>, path: &str) -> (u16, Vec<u8>) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: bench\r\nUser-Agent: throughput-bench\r\n\r\n");
    conn.get_mut()
        .write_all(req.as_bytes())
        .await
        .expect("request written");
    let mut line = String::new();
    conn.read_line(&mut line).await.expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut len = 0usize;
    loop {
        line.clear();
        conn.read_line(&mut line).await.expect("header");
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; len];
    conn.read_exact(&mut body).await.expect("body");
    (status, body)
}

async fn connect(addr: std::net::SocketAddr) -> BufReader<TcpStream> {
    let s = TcpStream::connect(addr).await.expect("connects");
    s.set_nodelay(true).expect("nodelay");
    BufReader::with_capacity(1 << 20, s)
}

/// Starts a watch and counts its events (lines) into `counter` until the stream ends.
async fn watcher(addr: std::net::SocketAddr, path: String, counter: Arc<AtomicU64>) {
    let mut s = TcpStream::connect(addr).await.expect("connects");
    let req = format!("GET {path} HTTP/1.1\r\nHost: bench\r\nUser-Agent: throughput-bench\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("request written");
    let mut buf = vec![0u8; 64 * 1024];
    let mut headers_done = false;
    let mut window = [0u8; 4];
    let mut prev = 0u8;
    loop {
        let n = match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut events = 0;
        for &b in &buf[..n] {
            if !headers_done {
                window.rotate_left(1);
                window[3] = b;
                headers_done = &window == b"\r\n\r\n";
                prev = b;
                continue;
            }
            // Event lines end in a bare '\n'; chunk framing always uses "\r\n", and JSON text
            // never holds a raw newline.
            if b == b'\n' && prev != b'\r' {
                events += 1;
            }
            prev = b;
        }
        if events > 0 {
            counter.fetch_add(events, Ordering::Relaxed);
        }
    }
}

async fn wait_until(what: &str, total: &[Arc<AtomicU64>], want_each: u64) -> Duration {
    let start = Instant::now();
    loop {
        if total.iter().all(|c| c.load(Ordering::Relaxed) >= want_each) {
            return start.elapsed();
        }
        if start.elapsed() > PHASE_LIMIT {
            let got: u64 = total.iter().map(|c| c.load(Ordering::Relaxed)).sum();
            panic!(
                "{what}: only {got} of {} events after {PHASE_LIMIT:?}",
                want_each * total.len() as u64
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn start_watchers(
    addr: std::net::SocketAddr,
    paths: Vec<String>,
) -> (Vec<Arc<AtomicU64>>, Vec<tokio::task::JoinHandle<()>>) {
    let mut counters = Vec::new();
    let mut tasks = Vec::new();
    for batch in paths.chunks(CONNECT_BATCH) {
        let mut batch_counters = Vec::new();
        for p in batch {
            let c = Arc::new(AtomicU64::new(0));
            tasks.push(tokio::spawn(watcher(addr, p.clone(), c.clone())));
            batch_counters.push(c);
        }
        // Each watch replays one event from history once registered: wait for it, so the
        // batch is connected before the next one starts.
        wait_until("watch start", &batch_counters, 1).await;
        counters.extend(batch_counters);
    }
    (counters, tasks)
}

fn rate(n: f64, d: Duration) -> String {
    format!("{:.0}/s", n / d.as_secs_f64())
}

async fn run() {
    let nodes = env_usize("BENCH_NODES", DEFAULT_NODES);
    let per_node = env_usize("BENCH_PODS_PER_NODE", DEFAULT_PODS_PER_NODE);
    let watchers = env_usize("BENCH_WATCHERS", DEFAULT_WATCHERS).min(nodes);
    let events = env_usize("BENCH_EVENTS", DEFAULT_EVENTS);
    let pods = nodes * per_node;
    println!("kube-emulator throughput: {nodes} nodes, {pods} pods, {watchers} watchers");

    let emu = Emulator::start(EmulatorOptions {
        request_log_capacity: 10_000,
        ..EmulatorOptions::default()
    })
    .await
    .expect("emulator starts");
    let addr = emu.addr();

    // Namespaces for the pods.
    for i in 0..10 {
        emu.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("ns-{i}")}}))
            .expect("namespace");
    }
    let t = Instant::now();
    for n in 0..nodes {
        emu.create(node_json(&node_name(n))).expect("node");
    }
    let node_time = t.elapsed();
    let t = Instant::now();
    for n in 0..nodes {
        let name = node_name(n);
        for i in 0..per_node {
            emu.create(pod(&name, i)).expect("pod");
        }
    }
    let pod_time = t.elapsed();
    println!(
        "seed: {nodes} nodes in {:.2?} ({}), {pods} pods in {:.2?} ({})",
        node_time,
        rate(nodes as f64, node_time),
        pod_time,
        rate(pods as f64, pod_time)
    );

    let mut conn = connect(addr).await;
    let mut best = Duration::MAX;
    let mut size = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let (status, body) = get(&mut conn, "/api/v1/pods").await;
        let d = t.elapsed();
        assert_eq!(status, 200);
        size = body.len();
        best = best.min(d);
    }
    println!(
        "list all pods (/api/v1/pods): best of 3 {:.2?}, {:.1} MiB, {} items/s",
        best,
        size as f64 / (1024.0 * 1024.0),
        rate(pods as f64, best).trim_end_matches("/s")
    );

    let t = Instant::now();
    let mut token: Option<String> = None;
    let mut pages = 0;
    let mut items = 0;
    loop {
        let path = match &token {
            Some(c) => format!("/api/v1/pods?limit=500&continue={c}"),
            None => "/api/v1/pods?limit=500".to_string(),
        };
        let (status, body) = get(&mut conn, &path).await;
        assert_eq!(status, 200);
        let v: Value = serde_json::from_slice(&body).expect("json");
        items += v["items"].as_array().map_or(0, Vec::len);
        pages += 1;
        token = v["metadata"]["continue"].as_str().map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    let paged = t.elapsed();
    assert_eq!(items, pods);
    println!(
        "list all pods in pages of 500: {pages} pages in {paged:.2?} (client parses each page)"
    );

    let mut total = Duration::ZERO;
    let mut worst = Duration::ZERO;
    for i in 0..NODE_LISTS {
        let node = node_name((i * 7919) % nodes);
        let s = Instant::now();
        let (status, body) = get(
            &mut conn,
            &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
        )
        .await;
        let took = s.elapsed();
        total += took;
        worst = worst.max(took);
        assert_eq!(status, 200);
        let v: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["items"].as_array().map(Vec::len), Some(per_node));
    }
    println!(
        "list one node's pods (fieldSelector=spec.nodeName): {NODE_LISTS} lists, mean {:.2?}, worst {:.2?}",
        total / NODE_LISTS as u32,
        worst
    );
    drop(conn);

    // Fan-out A: every watcher watches all nodes; each node change goes to all of them.
    // Each watcher starts just before this node change, so it replays exactly one event.
    emu.modify("nodes", None, &node_name(0), |n| {
        n["metadata"]["labels"]["bench"] = json!("0")
    })
    .expect("node change");
    let rv = emu.resource_version();
    let paths = vec![format!("/api/v1/nodes?watch=1&resourceVersion={}", rv - 1); watchers];
    let t = Instant::now();
    let (counters, tasks) = start_watchers(addr, paths).await;
    println!(
        "watch: {watchers} node watchers connected in {:.2?}",
        t.elapsed()
    );
    let t = Instant::now();
    for e in 0..events {
        let node = node_name(e % nodes);
        emu.modify("nodes", None, &node, |n| {
            n["metadata"]["labels"]["bench"] = json!(format!("{}", e + 1))
        })
        .expect("node change");
    }
    let produced = t.elapsed();
    let d = wait_until("node fan-out", &counters, 1 + events as u64).await + produced;
    let delivered = (watchers * events) as f64;
    println!(
        "watch fan-out (all nodes): {events} node events x {watchers} watchers = {delivered:.0} deliveries in {d:.2?}: {} delivered",
        rate(delivered, d)
    );
    for t in tasks {
        t.abort();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Fan-out B: each watcher watches its own node's pods (the agent's watch); the node index
    // routes each pod change to one watcher.
    let mut paths = Vec::new();
    for n in 0..watchers {
        // No resourceVersion: each watch starts with one synthetic ADDED per pod of its node.
        paths.push(format!(
            "/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3D{}",
            node_name(n)
        ));
    }
    let t = Instant::now();
    let (counters, tasks) = start_watchers(addr, paths).await;
    wait_until("initial pods", &counters, per_node as u64).await;
    println!(
        "watch: {watchers} per-node pod watchers connected (with {per_node} initial ADDED each) in {:.2?}",
        t.elapsed()
    );
    let t = Instant::now();
    for round in 0..POD_ROUNDS {
        for n in 0..watchers {
            let node = node_name(n);
            let i = round % per_node;
            emu.modify(
                "pods",
                Some(&format!("ns-{}", i % 10)),
                &format!("{node}-pod-{i:02}"),
                |p| {
                    p["metadata"]["annotations"] = json!({"bench": round.to_string()});
                },
            )
            .expect("pod change");
        }
    }
    let produced = t.elapsed();
    let d = wait_until("pod fan-out", &counters, (per_node + POD_ROUNDS) as u64).await + produced;
    let delivered = (watchers * POD_ROUNDS) as f64;
    println!(
        "watch (node-indexed pods): {delivered:.0} pod changes, each to its node's watcher, in {d:.2?}: {} delivered (writes alone {produced:.2?})",
        rate(delivered, d)
    );
    for t in tasks {
        t.abort();
    }
    emu.shutdown().await;
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it, and
    // a debug build of the full benchmark has no place in a test run.
    if !std::env::args().any(|a| a == "--bench") {
        println!("throughput: run with `cargo bench -p kube-emulator --bench throughput`; skipped");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let t = Instant::now();
    runtime.block_on(run());
    println!("total {:.2?}", t.elapsed());
}
