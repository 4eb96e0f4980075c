//! Prometheus metrics and the tiny HTTP server that serves them (`GET /metrics`, `GET /healthz`).
//!
//! The server reads one request line per connection and answers with `Connection: close`: a
//! scraper every 15 s needs nothing more, and it keeps a web framework out of the binary.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, info, warn};

/// Label set: `[("group", name)]` or `[("group", name), ("kind", what)]`.
pub type Labels = Vec<(String, String)>;

/// The scaler's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Pods pending with reason Unschedulable at the last pass.
    pub pending_pods: Gauge,
    /// Members per group (machines, plus labelled nodes without one).
    pub group_size: Family<Labels, Gauge>,
    /// Machines created.
    pub scale_ups: Family<Labels, Counter>,
    /// Nodes removed by scale-down.
    pub scale_downs: Family<Labels, Counter>,
    /// Failures by group and kind (create, drain, delete, repair, fenced).
    pub failures: Family<Labels, Counter>,
    /// Time decide took.
    pub decision_seconds: Histogram,
    /// Time from a pass's start (pods listed) to its first machine creation request.
    pub pending_to_create_seconds: Histogram,
    /// 1 while this replica holds the Lease.
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("nodeward_scaler");
        let m = Self {
            pending_pods: Gauge::default(),
            group_size: Family::default(),
            scale_ups: Family::default(),
            scale_downs: Family::default(),
            failures: Family::default(),
            // 100 µs to ~13 s: decisions are milliseconds; anything near seconds is news.
            decision_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            pending_to_create_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            leader: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "pending_pods",
            "Unschedulable pending pods",
            m.pending_pods.clone(),
        );
        registry.register(
            "group_nodes",
            "Members of each node group",
            m.group_size.clone(),
        );
        registry.register("scale_ups", "Machines created", m.scale_ups.clone());
        registry.register(
            "scale_downs",
            "Nodes removed by scale-down",
            m.scale_downs.clone(),
        );
        registry.register(
            "failures",
            "Failed operations by group and kind",
            m.failures.clone(),
        );
        registry.register(
            "decision_seconds",
            "Time the decision took",
            m.decision_seconds.clone(),
        );
        registry.register(
            "pending_to_create_seconds",
            "Time from listing pending pods to the first create request of the pass",
            m.pending_to_create_seconds.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the Lease",
            m.leader.clone(),
        );
        Self { registry, ..m }
    }
}

/// `[("group", g)]`.
pub fn group(g: &str) -> Labels {
    vec![("group".into(), g.into())]
}

/// `[("group", g), ("kind", kind)]`.
pub fn failure(g: &str, kind: &str) -> Labels {
    vec![("group".into(), g.into()), ("kind".into(), kind.into())]
}

impl Metrics {
    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            warn!(error = %e, "cannot encode metrics");
        }
        out
    }
}

/// Longest request head read.
const REQUEST_MAX: usize = 8192;

/// Serves `/metrics` on `addr` until the task is dropped; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    info!(address = %bound, "serving metrics");
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, peer)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; REQUEST_MAX];
                let mut len = 0;
                while len < REQUEST_MAX {
                    match stream.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => len += n,
                    }
                    if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let head = String::from_utf8_lossy(&buf[..len]);
                let path = head.split_whitespace().nth(1).unwrap_or("");
                let (status, body) = match path {
                    "/metrics" => ("200 OK", metrics.render()),
                    "/healthz" => ("200 OK", "ok\n".to_string()),
                    _ => ("404 Not Found", "not found\n".to_string()),
                };
                debug!(%peer, path, status, "metrics request");
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(resp.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok((bound, task))
}
