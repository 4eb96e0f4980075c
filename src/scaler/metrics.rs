//! Prometheus metrics and the small HTTP server that serves them (`GET /metrics`, `GET /healthz`).
//!
//! The server is hyper's HTTP/1 connection handler (already in the binary for the kube client),
//! one request per connection, with a deadline on the request head and on the whole connection,
//! so a client that connects and sends nothing (or trickles) holds a task for seconds, not for
//! ever.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
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
    /// 1 while the cluster-health guard holds repairs and scale-down back.
    pub guard_holding: Gauge,
    /// Whether the scaler's loop makes progress (`/healthz`, systemd's watchdog).
    pub liveness: Liveness,
}

/// Whether the scaler's loop makes progress: the loop beats once per turn; `/healthz` answers
/// 503 and the systemd watchdog goes unfed once the last beat is older than `stall_after`.
#[derive(Debug)]
pub struct Liveness {
    last_beat: std::sync::Mutex<std::time::Instant>,
    stall_after: std::sync::Mutex<Duration>,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            last_beat: std::sync::Mutex::new(std::time::Instant::now()),
            stall_after: std::sync::Mutex::new(Duration::from_secs(300)),
        }
    }
}

impl Liveness {
    /// The loop made progress now.
    pub fn beat(&self) {
        *lock(&self.last_beat) = std::time::Instant::now();
    }

    /// How long a turn of the loop may take before it counts as stalled.
    pub fn set_stall_after(&self, d: Duration) {
        *lock(&self.stall_after) = d;
    }

    /// How long since the last beat, if that is longer than allowed.
    pub fn stalled(&self) -> Option<Duration> {
        let since = lock(&self.last_beat).elapsed();
        (since > *lock(&self.stall_after)).then_some(since)
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
            guard_holding: Gauge::default(),
            liveness: Liveness::default(),
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
        registry.register(
            "guard_holding",
            "1 while too many nodes are NotReady for the scaler to replace any or scale down",
            m.guard_holding.clone(),
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

/// The request head must arrive within this: a scraper sends it at once.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A whole connection ends after this, however it is used: rendering the metrics takes
/// milliseconds, and a scraper reads them at once.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

fn respond(metrics: &Metrics, path: &str) -> Response<String> {
    let (status, body) = match path {
        "/metrics" => (StatusCode::OK, metrics.render()),
        "/healthz" => match metrics.liveness.stalled() {
            None => (StatusCode::OK, "ok\n".to_string()),
            Some(d) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "stalled: the scaler's loop last made progress {} s ago\n",
                    d.as_secs()
                ),
            ),
        },
        _ => (StatusCode::NOT_FOUND, "not found\n".to_string()),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

/// The wait after a failed `accept`: 10 ms, doubling to 1 s, back to 10 ms after a success.
#[derive(Debug, Default)]
struct AcceptBackoff {
    failures: u32,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    fn next(&mut self) -> Duration {
        let wait = Self::FIRST
            .saturating_mul(1 << self.failures.min(16))
            .min(Self::MAX);
        self.failures = self.failures.saturating_add(1);
        wait
    }

    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Serves `/metrics` on `addr` until the task is dropped; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    info!(address = %bound, "serving metrics");
    let task = tokio::spawn(async move {
        let mut backoff = AcceptBackoff::default();
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(pair) => {
                    backoff.reset();
                    pair
                }
                Err(e) => {
                    // Out of file descriptors, say: retrying at once would spin a core.
                    let wait = backoff.next();
                    warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "cannot accept a metrics connection");
                    tokio::time::sleep(wait).await;
                    continue;
                }
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let resp = respond(&metrics, req.uri().path());
                    debug!(%peer, path = req.uri().path(), status = %resp.status(), "metrics request");
                    std::future::ready(Ok::<_, Infallible>(resp))
                });
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service);
                match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => debug!(%peer, error = %e, "metrics connection ended"),
                    Err(_) => debug!(%peer, "metrics connection timed out"),
                }
            });
        }
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn healthz_says_503_once_the_loop_stalls() {
        let m = super::Metrics::default();
        assert_eq!(super::respond(&m, "/healthz").status(), 200);
        m.liveness
            .set_stall_after(std::time::Duration::from_secs(60));
        *super::lock(&m.liveness.last_beat) = std::time::Instant::now()
            .checked_sub(std::time::Duration::from_secs(61))
            .expect("a minute of uptime");
        let r = super::respond(&m, "/healthz");
        assert_eq!(r.status(), 503);
        assert!(r.body().contains("stalled"), "{}", r.body());
        m.liveness.beat();
        assert_eq!(super::respond(&m, "/healthz").status(), 200);
    }

    #[test]
    fn accept_errors_back_off_and_recover() {
        let mut b = super::AcceptBackoff::default();
        let waits: Vec<u64> = (0..10).map(|_| b.next().as_millis() as u64).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        for _ in 0..100 {
            b.next();
        }
        assert_eq!(
            b.next(),
            super::AcceptBackoff::MAX,
            "no overflow after many"
        );
        b.reset();
        assert_eq!(b.next(), super::AcceptBackoff::FIRST);
    }

    use super::*;

    async fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        c.write_all(request).await.expect("send");
        let mut buf = Vec::new();
        c.read_to_end(&mut buf).await.expect("read");
        String::from_utf8_lossy(&buf).into_owned()
    }

    #[tokio::test]
    async fn serves_metrics_health_and_404() {
        let metrics = Arc::new(Metrics::default());
        metrics.leader.set(1);
        let (addr, task) = serve("127.0.0.1:0".parse().expect("addr"), metrics)
            .await
            .expect("bind");
        let m = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(m.starts_with("HTTP/1.1 200 OK\r\n"), "{m}");
        assert!(m.contains("nodeward_scaler_leader 1"), "{m}");
        assert!(m.contains("text/plain; version=0.0.4"), "{m}");
        let h = get(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(
            h.starts_with("HTTP/1.1 200 OK\r\n") && h.ends_with("ok\n"),
            "{h}"
        );
        let n = get(addr, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(n.starts_with("HTTP/1.1 404 Not Found\r\n"), "{n}");
        task.abort();
    }

    /// A client that connects and sends nothing is cut off after the head timeout (the raw
    /// server this replaced waited for it for ever).
    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_cut_off() {
        let (addr, task) = serve(
            "127.0.0.1:0".parse().expect("addr"),
            Arc::new(Metrics::default()),
        )
        .await
        .expect("bind");
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let started = tokio::time::Instant::now();
        let mut buf = Vec::new();
        let closed = tokio::time::timeout(CONNECTION_TIMEOUT * 2, c.read_to_end(&mut buf)).await;
        assert!(closed.is_ok(), "the server still holds a silent connection");
        let waited = started.elapsed();
        assert!(
            (HEADER_READ_TIMEOUT..CONNECTION_TIMEOUT).contains(&waited),
            "cut off after {waited:?}"
        );
        task.abort();
    }
}
