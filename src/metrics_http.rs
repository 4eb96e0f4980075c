//! The small HTTP server behind every metrics endpoint nodeward has (the scaler's, the agent's):
//! `GET /metrics`, `GET /healthz` (the process's loop turns) and `GET /readyz` (it can do its
//! work: for the readiness controller, once it has listed the nodes).
//!
//! It is hyper's HTTP/1 connection handler (already in the binary for the kube client), one
//! request per connection, with a deadline on the request head and on the whole connection, so a
//! client that connects and sends nothing (or trickles) holds a task for seconds, not for ever;
//! accept errors back off instead of spinning.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tracing::{debug, info, warn};

/// What an endpoint answers.
pub trait Exposition: Send + Sync + 'static {
    /// The text exposition for `/metrics`.
    fn metrics(&self) -> String;
    /// Why `/healthz` answers 503, or `None` for 200.
    fn unhealthy(&self) -> Option<String> {
        None
    }
    /// Why `/readyz` answers 503, or `None` for 200. By default, ready while healthy.
    fn not_ready(&self) -> Option<String> {
        self.unhealthy()
    }
}

/// Whether a loop makes progress: it beats once per turn; `/healthz` answers 503 (and the
/// scaler's systemd watchdog goes unfed) once the last beat is older than `stall_after`.
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

/// The request head must arrive within this: a scraper sends it at once.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A whole connection ends after this, however it is used: rendering the metrics takes
/// milliseconds, and a scraper reads them at once.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

fn respond(exposition: &dyn Exposition, path: &str) -> Response<String> {
    let (status, body) = match path {
        "/metrics" => (StatusCode::OK, exposition.metrics()),
        "/healthz" => match exposition.unhealthy() {
            None => (StatusCode::OK, "ok\n".to_string()),
            Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        },
        "/readyz" => match exposition.not_ready() {
            None => (StatusCode::OK, "ok\n".to_string()),
            Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
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

/// Serves `/metrics` and `/healthz` on `addr` until the task is aborted; returns the bound
/// address.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<dyn Exposition>,
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
                    let resp = respond(metrics.as_ref(), req.uri().path());
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

    /// A fixed exposition: `leader 1`, healthy (and so ready) unless told otherwise.
    struct Fixed(Option<String>);

    impl super::Exposition for Fixed {
        fn metrics(&self) -> String {
            "leader 1\n".into()
        }
        fn unhealthy(&self) -> Option<String> {
            self.0.clone()
        }
    }

    #[test]
    fn healthz_says_503_with_the_reason() {
        assert_eq!(super::respond(&Fixed(None), "/healthz").status(), 200);
        let r = super::respond(&Fixed(Some("stalled\n".into())), "/healthz");
        assert_eq!(r.status(), 503);
        assert_eq!(r.body(), "stalled\n");
        assert_eq!(
            super::respond(&Fixed(Some("stalled\n".into())), "/readyz").status(),
            503,
            "not ready while unhealthy, by default"
        );
        assert_eq!(super::respond(&Fixed(None), "/readyz").status(), 200);
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
        let (addr, task) = serve("127.0.0.1:0".parse().expect("addr"), Arc::new(Fixed(None)))
            .await
            .expect("bind");
        let m = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(m.starts_with("HTTP/1.1 200 OK\r\n"), "{m}");
        assert!(m.contains("leader 1"), "{m}");
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
        let (addr, task) = serve("127.0.0.1:0".parse().expect("addr"), Arc::new(Fixed(None)))
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
