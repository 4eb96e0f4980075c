//! `cherry-emulator`: the parts of the Cherry Servers API v1 the scaler uses, served over HTTP on
//! 127.0.0.1 for tests — never shipped.
//!
//! Served: `GET /v1/projects/{id}/servers` (paged with `limit` and `offset`, the total in
//! `X-Total-Count`; a test can cap the page size below what the client asks for, as an API with a
//! maximum page does), `POST /v1/projects/{id}/servers` (the optional create fields of the Cherry
//! Servers autoscaler's `CreateServer` are type-checked and recorded), `GET|DELETE
//! /v1/servers/{id}`, `GET /v1/plans`. Requests need `Authorization: Bearer <token>`
//! (401 otherwise). Tests inject faults (status codes for the next N matching requests) and
//! latency, read the servers and their (decoded-on-demand) user data, and see a request log that
//! records whether a token was sent, never the token itself.

pub mod machines;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Errors starting the emulator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listener could not be bound.
    #[error("cannot listen on 127.0.0.1:0: {0}")]
    Bind(#[source] std::io::Error),
}

/// A plan the emulator offers.
#[derive(Debug, Clone)]
pub struct PlanSpec {
    /// Slug.
    pub slug: String,
    /// CPU cores.
    pub cores: i64,
    /// Memory in GB.
    pub memory_gb: i64,
}

/// Emulator settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// The bearer token requests must carry.
    pub token: String,
    /// The project id servers live in.
    pub project_id: u64,
    /// Plans served by `GET /v1/plans`.
    pub plans: Vec<PlanSpec>,
}

/// A fault: answer `status` to the next `count` requests matching `method` (any if `None`) and
/// whose path contains `path_contains`.
#[derive(Debug, Clone)]
pub struct Fault {
    /// HTTP method, e.g. `POST`.
    pub method: Option<String>,
    /// Substring of the path.
    pub path_contains: String,
    /// Status to answer.
    pub status: u16,
    /// How many requests; decremented as they are hit.
    pub count: u64,
}

/// One request as logged.
#[derive(Debug, Clone)]
pub struct Logged {
    /// Method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Status answered.
    pub status: u16,
    /// Whether the right bearer token was sent.
    pub authorized: bool,
}

#[derive(Debug, Default)]
struct State {
    servers: BTreeMap<u64, Value>,
    user_data: BTreeMap<u64, String>,
    next_id: u64,
    faults: Vec<Fault>,
    latency: Duration,
    log: Vec<Logged>,
    deleted: Vec<u64>,
    /// Create bodies as received, without `user_data` (see [`CherryEmulator::user_data`]).
    creates: Vec<Value>,
    /// Most servers one list page holds, whatever `limit` asks; `None`: as many as asked.
    max_page: Option<usize>,
    /// A server deleted (by someone else) right after the next list page is served.
    delete_after_page: Option<u64>,
}

struct Shared {
    opts: Options,
    state: Mutex<State>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a test bug; keep serving what is there.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running emulator; dropping it stops the server.
pub struct CherryEmulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: CancellationToken,
}

impl std::fmt::Debug for CherryEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CherryEmulator")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for CherryEmulator {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl CherryEmulator {
    /// Starts serving on 127.0.0.1 on a free port.
    pub async fn start(opts: Options) -> Result<Self, Error> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(Error::Bind)?;
        let addr = listener.local_addr().map_err(Error::Bind)?;
        let shared = Arc::new(Shared {
            opts,
            state: Mutex::new(State {
                next_id: 1000,
                ..State::default()
            }),
        });
        let stop = CancellationToken::new();
        let (s2, stop2) = (shared.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let conn = tokio::select! {
                    () = stop2.cancelled() => break,
                    c = listener.accept() => c,
                };
                let Ok((stream, _)) = conn else { continue };
                let s3 = s2.clone();
                let stop3 = stop2.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let s4 = s3.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(&s4, req).await) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
                    tokio::select! {
                        () = stop3.cancelled() => {}
                        _ = conn => {}
                    }
                });
            }
        });
        Ok(Self { shared, addr, stop })
    }

    /// The API base URL, `http://127.0.0.1:PORT/v1/`.
    pub fn url(&self) -> String {
        format!("http://{}/v1/", self.addr)
    }

    /// Every server that exists, as the API shows it.
    pub fn servers(&self) -> Vec<Value> {
        self.shared.state().servers.values().cloned().collect()
    }

    /// The user data a server was created with, base64-decoded.
    pub fn user_data(&self, id: u64) -> Option<String> {
        self.shared.state().user_data.get(&id).cloned()
    }

    /// The bodies of the accepted creates, in order, without `user_data`.
    pub fn create_requests(&self) -> Vec<Value> {
        self.shared.state().creates.clone()
    }

    /// Caps list pages at `n` servers (the client must follow the pages to see them all).
    pub fn set_max_page(&self, n: usize) {
        self.shared.state().max_page = Some(n.max(1));
    }

    /// Deletes server `id` right after the next list page is served, as a delete racing a
    /// paged listing does.
    pub fn delete_after_next_page(&self, id: u64) {
        self.shared.state().delete_after_page = Some(id);
    }

    /// Ids of servers deleted through the API, in order.
    pub fn deleted(&self) -> Vec<u64> {
        self.shared.state().deleted.clone()
    }

    /// Sets a server's state (`pending` → `active`, as a real boot does).
    pub fn set_state(&self, id: u64, state: &str) {
        if let Some(s) = self.shared.state().servers.get_mut(&id) {
            s["state"] = json!(state);
        }
    }

    /// Adds a server directly (a machine someone else created).
    pub fn insert_server(&self, hostname: &str, tags: Value) -> u64 {
        let mut st = self.shared.state();
        st.next_id += 1;
        let id = st.next_id;
        st.servers.insert(
            id,
            server_json(id, hostname, "e5_1620v4", "eu_nord_1", "ubuntu_24_04", tags),
        );
        id
    }

    /// Overwrites one field of a server as the API reports it (a malformed `created_at`).
    pub fn set_server_field(&self, id: u64, key: &str, value: Value) {
        if let Some(s) = self.shared.state().servers.get_mut(&id) {
            s[key] = value;
        }
    }

    /// Adds a fault rule.
    pub fn add_fault(&self, fault: Fault) {
        self.shared.state().faults.push(fault);
    }

    /// Delays every response.
    pub fn set_latency(&self, d: Duration) {
        self.shared.state().latency = d;
    }

    /// The request log.
    pub fn requests(&self) -> Vec<Logged> {
        self.shared.state().log.clone()
    }
}

fn server_json(
    id: u64,
    hostname: &str,
    plan: &str,
    region: &str,
    image: &str,
    tags: Value,
) -> Value {
    json!({
        "id": id,
        "href": format!("/servers/{id}"),
        "hostname": hostname,
        "name": hostname,
        "image": image,
        "state": "pending",
        "plan": {"slug": plan},
        "region": {"slug": region},
        "tags": tags,
        "created_at": jiff::Timestamp::now().to_string(),
    })
}

fn reply(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// The optional `CreateServer` fields, checked against the types of the Cherry Servers
/// autoscaler's API types: `os_partition_size` a positive int (GB), `spot_market` the int `0` or
/// `1`, `ip_addresses` an array of IP address id strings.
fn check_create_fields(req: &Value) -> Result<(), &'static str> {
    if let Some(v) = req.get("os_partition_size")
        && v.as_u64().is_none_or(|n| n == 0)
    {
        return Err("os_partition_size must be a positive integer (GB)");
    }
    if let Some(v) = req.get("spot_market")
        && !matches!(v.as_u64(), Some(0 | 1))
    {
        return Err("spot_market must be the integer 0 or 1");
    }
    if let Some(v) = req.get("ip_addresses")
        && !v
            .as_array()
            .is_some_and(|a| a.iter().all(|i| i.as_str().is_some_and(|s| !s.is_empty())))
    {
        return Err("ip_addresses must be an array of IP address ids");
    }
    Ok(())
}

/// A query parameter as a number.
fn query_number(query: &str, key: &str) -> Option<usize> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
}

fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    reply(
        status,
        &json!({"code": status.as_u16(), "message": message}),
    )
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let authorized = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {}", shared.opts.token));
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let latency = shared.state().latency;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let resp = route(shared, &method, &path, &query, authorized, &body);
    shared.state().log.push(Logged {
        method: method.to_string(),
        path,
        status: resp.status().as_u16(),
        authorized,
    });
    resp
}

fn route(
    shared: &Shared,
    method: &Method,
    path: &str,
    query: &str,
    authorized: bool,
    body: &[u8],
) -> Response<Full<Bytes>> {
    if !authorized {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    }
    let mut st = shared.state();
    if let Some(f) = st.faults.iter_mut().find(|f| {
        f.count > 0
            && f.method.as_deref().is_none_or(|m| m == method.as_str())
            && path.contains(&f.path_contains)
    }) {
        f.count -= 1;
        let status = StatusCode::from_u16(f.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error(status, "injected fault");
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, parts.as_slice()) {
        (&Method::GET, ["v1", "plans"]) => {
            let plans: Vec<Value> = shared
                .opts
                .plans
                .iter()
                .map(|p| {
                    json!({"slug": p.slug, "name": p.slug,
                           "specs": {"cpus": {"count": 1, "cores": p.cores},
                                     "memory": {"total": p.memory_gb, "unit": "GB"}}})
                })
                .collect();
            reply(StatusCode::OK, &json!(plans))
        }
        (&Method::GET, ["v1", "projects", project, "servers"]) => {
            if *project != shared.opts.project_id.to_string() {
                return error(StatusCode::NOT_FOUND, "project not found");
            }
            let total = st.servers.len();
            let offset = query_number(query, "offset").unwrap_or(0);
            let limit = query_number(query, "limit").unwrap_or(total);
            let limit = st.max_page.map_or(limit, |m| limit.min(m));
            let page: Vec<&Value> = st.servers.values().skip(offset).take(limit).collect();
            let mut r = reply(StatusCode::OK, &json!(page));
            if let Some(id) = st.delete_after_page.take() {
                st.servers.remove(&id);
            }
            r.headers_mut()
                .insert("X-Total-Count", hyper::header::HeaderValue::from(total));
            r
        }
        (&Method::POST, ["v1", "projects", project, "servers"]) => {
            if *project != shared.opts.project_id.to_string() {
                return error(StatusCode::NOT_FOUND, "project not found");
            }
            let Ok(req) = serde_json::from_slice::<Value>(body) else {
                return error(StatusCode::BAD_REQUEST, "body is not JSON");
            };
            let s = |k: &str| {
                req.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let (hostname, plan, region, image) =
                (s("hostname"), s("plan"), s("region"), s("image"));
            if hostname.is_empty() || plan.is_empty() || region.is_empty() {
                return error(
                    StatusCode::BAD_REQUEST,
                    "hostname, plan and region are required",
                );
            }
            if let Err(message) = check_create_fields(&req) {
                return error(StatusCode::BAD_REQUEST, message);
            }
            let user_data = match req.get("user_data").and_then(Value::as_str) {
                Some(b64) => match decode_base64(b64) {
                    Some(text) => text,
                    None => return error(StatusCode::BAD_REQUEST, "user_data is not valid base64"),
                },
                None => String::new(),
            };
            st.next_id += 1;
            let id = st.next_id;
            let mut server = server_json(
                id,
                &hostname,
                &plan,
                &region,
                &image,
                req.get("tags").cloned().unwrap_or(json!({})),
            );
            server["spot_instance"] =
                json!(req.get("spot_market").and_then(Value::as_u64) == Some(1));
            st.servers.insert(id, server.clone());
            st.user_data.insert(id, user_data);
            let mut recorded = req;
            if let Some(o) = recorded.as_object_mut() {
                o.remove("user_data");
            }
            st.creates.push(recorded);
            reply(StatusCode::CREATED, &server)
        }
        (&Method::GET, ["v1", "servers", id]) => {
            match id.parse::<u64>().ok().and_then(|i| st.servers.get(&i)) {
                Some(s) => reply(StatusCode::OK, s),
                None => error(StatusCode::NOT_FOUND, "server not found"),
            }
        }
        (&Method::DELETE, ["v1", "servers", id]) => {
            let Some(id) = id.parse::<u64>().ok() else {
                return error(StatusCode::NOT_FOUND, "server not found");
            };
            if st.servers.remove(&id).is_some() {
                st.user_data.remove(&id);
                st.deleted.push(id);
                Response::builder()
                    .status(StatusCode::NO_CONTENT)
                    .body(Full::new(Bytes::new()))
                    .unwrap_or_else(|_| error(StatusCode::NO_CONTENT, ""))
            } else {
                error(StatusCode::NOT_FOUND, "server not found")
            }
        }
        _ => error(StatusCode::NOT_FOUND, "no such endpoint in the emulator"),
    }
}

/// Standard base64 with padding, as the API expects for user_data (also decodes Secret data).
pub fn decode_base64(s: &str) -> Option<String> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut buf, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|c| !c.is_ascii_whitespace()) {
        if c == b'=' {
            break;
        }
        let v = ALPHABET.iter().position(|a| *a == c)? as u32;
        buf = (buf << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
            buf &= (1 << bits) - 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::decode_base64;

    #[test]
    fn base64_round_trip() {
        assert_eq!(
            decode_base64("aGVsbG8gd29ybGQ=").as_deref(),
            Some("hello world")
        );
        assert_eq!(decode_base64("YQ==").as_deref(), Some("a"));
        assert_eq!(decode_base64("!!"), None);
    }
}
