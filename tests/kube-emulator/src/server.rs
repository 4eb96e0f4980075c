//! HTTP: the accept loop (which can close and reopen its socket to refuse connections), request
//! routing onto the store, faults, latency and the request log.
//!
//! Routing follows the apiserver's path grammar (`/api/v1/namespaces/NS/pods/NAME/status`,
//! `/apis/GROUP/VERSION/...`, the legacy `/api/v1/watch/...` prefix) and its verb mapping (GET
//! on a collection is `list`, or `watch` with `?watch=true`; DELETE on one is
//! `deletecollection`; POST on `pods/NAME/eviction` is `create` of `pods/eviction`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER, USER_AGENT};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::control::{Faults, RequestLog, RequestRecord};
use crate::error::ApiError;
use crate::resources::{self, PODS, RESOURCES, ResId};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{DeleteOpts, Deleted, Filter, ListOut, PatchType, Store, WatchFrom};
use crate::{admin, table, watch};

/// Response body: a full buffer or a watch stream.
pub type Body = BoxBody<Bytes, Infallible>;

/// Watch length when the client sets no `timeoutSeconds`: the apiserver's
/// `--min-request-timeout` default (it randomises between one and two times this).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Listen backlog; thousands of watchers may connect at once in the benchmark.
const LISTEN_BACKLOG: u32 = 4096;

/// Attempts to rebind the port after refusing connections (another process may hold it).
const REBIND_ATTEMPTS: u32 = 50;

/// Pause between rebind attempts.
const REBIND_PAUSE: Duration = Duration::from_millis(20);

/// Server version reported at `/version`; kubectl warns beyond one minor version of skew, and
/// the two kubectls the tests use are 1.32 and 1.37.
pub const SERVER_MINOR: u32 = 34;

/// A request to refuse connections for a while.
#[derive(Debug)]
pub struct RefuseCmd {
    /// How long.
    pub duration: Duration,
    /// Told once the socket is closed.
    pub ack: oneshot::Sender<()>,
}

/// State shared by every connection.
pub struct Shared {
    /// Objects.
    pub store: Arc<Store>,
    /// Faults and latency.
    pub faults: Faults,
    /// Request log.
    pub log: RequestLog,
    /// Bound address.
    pub addr: SocketAddr,
    /// Cancelled to end every watch; replaced by a fresh token after.
    pub watch_close: Mutex<CancellationToken>,
    /// Parent of every watch token (the emulator's shutdown).
    pub shutdown: CancellationToken,
    /// Bookmark period of watches that allow them.
    pub bookmark_interval: Duration,
    /// Asks the accept loop to refuse connections.
    pub refuse_tx: mpsc::UnboundedSender<RefuseCmd>,
}

impl Shared {
    /// Ends every open watch.
    pub fn close_watches(&self) {
        let mut token = self
            .watch_close
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        token.cancel();
        *token = self.shutdown.child_token();
        self.store.drop_watchers();
    }

    fn watch_token(&self) -> CancellationToken {
        self.watch_close
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Binds a listening socket with `SO_REUSEADDR`, so the port can be reopened after refusing.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The accept loop.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut refuse_rx: mpsc::UnboundedReceiver<RefuseCmd>,
) {
    let shutdown = shared.shutdown.clone();
    let mut listener = Some(listener);
    let mut conns = shutdown.child_token();
    while let Some(l) = listener.as_ref() {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(cmd) = refuse_rx.recv() => {
                listener = None;
                conns.cancel();
                conns = shutdown.child_token();
                let _ = cmd.ack.send(());
                tracing::info!(duration = ?cmd.duration, "refusing connections");
                tokio::select! {
                    () = tokio::time::sleep(cmd.duration) => {}
                    () = shutdown.cancelled() => break,
                }
                for attempt in 0..REBIND_ATTEMPTS {
                    match bind(shared.addr) {
                        Ok(l) => {
                            listener = Some(l);
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, attempt, "cannot reopen the listening socket yet");
                            tokio::time::sleep(REBIND_PAUSE).await;
                        }
                    }
                }
                if listener.is_none() {
                    tracing::error!(addr = %shared.addr, "could not reopen the listening socket; the emulator stops serving");
                }
            }
            accepted = l.accept() => match accepted {
                Ok((stream, _)) => spawn_connection(stream, shared.clone(), conns.clone()),
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(REBIND_PAUSE).await;
                }
            }
        }
    }
}

fn spawn_connection(stream: TcpStream, shared: Arc<Shared>, token: CancellationToken) {
    let _ = stream.set_nodelay(true);
    tokio::spawn(async move {
        let svc = hyper::service::service_fn(move |req| {
            let shared = shared.clone();
            async move { Ok::<_, Infallible>(handle(shared, req).await) }
        });
        let conn =
            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
        tokio::select! {
            r = conn => if let Err(e) = r {
                tracing::debug!(error = %e, "connection ended with an error");
            },
            () = token.cancelled() => {}
        }
    });
}

/// A JSON response.
pub fn json_response(code: u16, body: &Value) -> Response<Body> {
    bytes_response(code, Bytes::from(body.to_string()))
}

/// A response with a JSON body already serialised.
pub fn bytes_response(code: u16, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(Full::new(body).boxed());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// The response for an API error.
pub fn error_response(e: &ApiError) -> Response<Body> {
    let mut resp = json_response(e.code, &e.status());
    if let Some(s) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&s.to_string())
    {
        resp.headers_mut().insert(RETRY_AFTER, v);
    }
    resp
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Version,
    Health,
    Api,
    Apis,
    Group(String),
    GroupVersion(String, String),
    /// `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`: the emulator has no
    /// authorization, so every review says allowed.
    AccessReview,
    Resource {
        res: ResId,
        ns: Option<String>,
        name: Option<String>,
        sub: Option<String>,
        legacy_watch: bool,
    },
    NotFound,
}

fn parse_route(path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "readyz" | "livez", ..] => Route::Health,
        ["api"] => Route::Api,
        ["api", "v1", rest @ ..] => resource_route("", "v1", rest),
        ["apis"] => Route::Apis,
        ["apis", g] => Route::Group((*g).to_string()),
        [
            "apis",
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
        ] => Route::AccessReview,
        ["apis", g, v, rest @ ..] => resource_route(g, v, rest),
        _ => Route::NotFound,
    }
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Route {
    if rest.is_empty() {
        return Route::GroupVersion(group.to_string(), version.to_string());
    }
    let (legacy_watch, rest) = match rest {
        ["watch", r @ ..] if !r.is_empty() => (true, r),
        r => (false, r),
    };
    let namespaced =
        |plural: &str| resources::find(group, version, plural).filter(|r| RESOURCES[*r].namespaced);
    let (res, ns, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..] if namespaced(plural).is_some() => {
            match namespaced(plural) {
                Some(r) => (r, Some((*ns).to_string()), tail),
                None => return Route::NotFound,
            }
        }
        [plural, tail @ ..] => match resources::find(group, version, plural) {
            Some(r) => (r, None, tail),
            None => return Route::NotFound,
        },
        [] => return Route::NotFound,
    };
    if RESOURCES[res].namespaced && ns.is_none() && !tail.is_empty() {
        return Route::NotFound;
    }
    let (name, sub) = match tail {
        [] => (None, None),
        [n] => (Some((*n).to_string()), None),
        [n, s] => (Some((*n).to_string()), Some((*s).to_string())),
        _ => return Route::NotFound,
    };
    if let Some(s) = &sub {
        let ok = (s == "status" && RESOURCES[res].has_status) || (s == "eviction" && res == PODS);
        if !ok {
            return Route::NotFound;
        }
    }
    Route::Resource {
        res,
        ns,
        name,
        sub,
        legacy_watch,
    }
}

/// Query parameters.
#[derive(Debug, Default)]
struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    fn parse(q: &str) -> Self {
        Self {
            pairs: form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        }
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }

    fn int(&self, k: &str) -> Result<Option<i64>, ApiError> {
        self.get(k)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid value for {k}: {v:?}")))
            })
            .transpose()
    }
}

fn verb_of(method: &Method, route: &Route, watch: bool) -> &'static str {
    match route {
        Route::Resource { name, sub, .. } => match (method, name.is_some()) {
            (&Method::GET, false) if watch => "watch",
            (&Method::GET, false) => "list",
            (&Method::GET, true) if watch => "watch",
            (&Method::GET, true) => "get",
            (&Method::POST, _) if sub.as_deref() == Some("eviction") => "create",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::PATCH, _) => "patch",
            (&Method::DELETE, false) => "deletecollection",
            (&Method::DELETE, true) => "delete",
            _ => "unknown",
        },
        Route::AccessReview => "create",
        _ => "get",
    }
}

async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    body.collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))
}

fn parse_object(body: &[u8], content_type: &str) -> Result<Value, ApiError> {
    // Protobuf or CBOR: kube-apiserver would decode them; the emulator answers 415 as a server
    // without that codec does, and client-go (kubectl's typed clients, which prefer protobuf)
    // retries in JSON. Found by the fidelity suite: `kubectl create namespace` got 400.
    if !(content_type.contains("json") || content_type.contains("yaml")) {
        return Err(ApiError::unsupported_body(content_type));
    }
    if content_type.contains("yaml") {
        serde_norway::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type JSON): {e}"
            ))
        })
    }
}

/// Handles one request.
pub async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path == "/emulator" || path.starts_with("/emulator/") {
        return admin::handle(&shared, req).await;
    }
    let method = req.method().clone();
    let query_str = req.uri().query().unwrap_or_default().to_string();
    let query = Query::parse(&query_str);
    let user_agent = req
        .headers()
        .get(USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let route = parse_route(&path);
    let watch = match &route {
        Route::Resource { legacy_watch, .. } => *legacy_watch || query.flag("watch"),
        _ => false,
    };
    let verb = verb_of(&method, &route, watch);
    let (resource, namespace, name) = match &route {
        Route::Resource {
            res, ns, name, sub, ..
        } => (
            match sub {
                Some(s) => format!("{}/{s}", RESOURCES[*res].plural),
                None => RESOURCES[*res].plural.to_string(),
            },
            ns.clone(),
            name.clone(),
        ),
        _ => (String::new(), None, None),
    };
    let def = match &route {
        Route::Resource { res, .. } => Some(&RESOURCES[*res]),
        _ => None,
    };
    let qualified = def.map(|d| d.qualified()).unwrap_or_default();
    let target = crate::control::Target {
        verb,
        resource: &resource,
        kind: def.map_or("", |d| d.plural),
        group: def.map_or("", |d| d.group),
        qualified: &qualified,
        namespace: namespace.as_deref(),
        name: name.as_deref(),
    };
    shared.faults.hold(verb, &resource).await;
    let resp = match shared.faults.check(&target) {
        Some(e) => error_response(&e),
        None => match dispatch(&shared, req, route, &query, watch).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        },
    };
    shared.log.record(RequestRecord {
        at: chrono::Utc::now(),
        method: method.to_string(),
        path,
        query: query_str,
        verb: verb.to_string(),
        resource,
        namespace,
        name,
        user_agent,
        code: resp.status().as_u16(),
    });
    resp
}

async fn dispatch(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    route: Route,
    query: &Query,
    watch: bool,
) -> Result<Response<Body>, ApiError> {
    let method = req.method().clone();
    if !matches!(route, Route::Resource { .. } | Route::AccessReview) && method != Method::GET {
        return Err(ApiError::method_not_allowed(method.as_str()));
    }
    match route {
        Route::Version => Ok(json_response(
            200,
            &json!({
                "major": "1",
                "minor": SERVER_MINOR.to_string(),
                "emulationMajor": "1",
                "emulationMinor": SERVER_MINOR.to_string(),
                "minCompatibilityMajor": "1",
                "minCompatibilityMinor": (SERVER_MINOR - 1).to_string(),
                "gitVersion": format!("v1.{SERVER_MINOR}.0-kube-emulator"),
                "gitCommit": "0000000000000000000000000000000000000000",
                "gitTreeState": "clean",
                "buildDate": "2025-01-01T00:00:00Z",
                "goVersion": "go1.24.0",
                "compiler": "gc",
                "platform": "linux/amd64"
            }),
        )),
        Route::Health => Ok(bytes_response(200, Bytes::from_static(b"ok"))),
        Route::Api => Ok(json_response(
            200,
            &resources::api_versions(&shared.addr.to_string()),
        )),
        Route::Apis => Ok(json_response(200, &resources::api_group_list())),
        Route::Group(g) => resources::api_group(&g)
            .map(|v| json_response(200, &v))
            .ok_or_else(ApiError::path_not_found),
        Route::GroupVersion(g, v) => resources::api_resource_list(&g, &v)
            .map(|v| json_response(200, &v))
            .ok_or_else(ApiError::path_not_found),
        Route::NotFound => Err(ApiError::path_not_found()),
        Route::AccessReview => {
            if method != Method::POST {
                return Err(ApiError::method_not_allowed(method.as_str()));
            }
            let body = read_body(req.into_body()).await?;
            let mut review: Value = serde_json::from_slice(&body).map_err(|e| {
                ApiError::bad_request(format!("invalid SelfSubjectAccessReview: {e}"))
            })?;
            review["status"] =
                json!({"allowed": true, "reason": "kube-emulator authorizes every request"});
            Ok(json_response(201, &review))
        }
        Route::Resource {
            res, ns, name, sub, ..
        } => resource_request(shared, req, res, ns, name, sub, query, watch).await,
    }
}

fn filter_from(res: ResId, ns: Option<String>, query: &Query) -> Result<Filter, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or_default(), res)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(Filter {
        namespace: ns,
        labels,
        fields,
    })
}

fn list_response(res: ResId, out: &ListOut, accept_table: bool) -> Response<Body> {
    let def = &RESOURCES[res];
    if accept_table {
        return json_response(200, &table::list_table(def, out));
    }
    let mut meta = json!({"resourceVersion": out.rv.to_string()});
    if let Some(c) = &out.cont {
        meta["continue"] = json!(c);
    }
    if let Some(r) = out.remaining {
        meta["remainingItemCount"] = json!(r);
    }
    let head = json!({"kind": def.list_kind(), "apiVersion": def.api_version(), "metadata": meta})
        .to_string();
    let total: usize = out.items.iter().map(|o| o.bytes.len() + 1).sum();
    let mut body = Vec::with_capacity(head.len() + total + 16);
    // `head` ends with '}': reopen it to append the items.
    body.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    body.extend_from_slice(b",\"items\":[");
    for (i, o) in out.items.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&o.bytes);
    }
    body.extend_from_slice(b"]}");
    bytes_response(200, Bytes::from(body))
}

fn accepts_table(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

fn content_type(req: &Request<Incoming>) -> String {
    req.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// The field manager of an update: `fieldManager`, else what kube-apiserver derives from the
/// User-Agent.
fn update_manager(req: &Request<Incoming>, query: &Query) -> String {
    match query.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(m) => m.to_string(),
        None => {
            let agent = req
                .headers()
                .get(USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            crate::managed::manager_from_user_agent(agent).to_string()
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn resource_request(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    res: ResId,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    query: &Query,
    watch: bool,
) -> Result<Response<Body>, ApiError> {
    let def = &RESOURCES[res];
    let store = &shared.store;
    let method = req.method().clone();
    let dry_run = query.get("dryRun").is_some_and(|v| !v.is_empty());
    let table = accepts_table(&req);
    let status_only = sub.as_deref() == Some("status");
    let manager = update_manager(&req, query);
    if def.namespaced && ns.is_none() && !matches!(method, Method::GET | Method::DELETE) {
        return Err(ApiError::method_not_allowed(method.as_str()));
    }
    let ns_key = ns.clone().unwrap_or_default();
    match (method, name) {
        (Method::GET, None) if watch => start_watch(shared, res, ns, query, table),
        (Method::GET, Some(n)) if watch => {
            let mut q = Query {
                pairs: query.pairs.clone(),
            };
            let sel = match q.get("fieldSelector") {
                Some(s) if !s.is_empty() => format!("{s},metadata.name={n}"),
                _ => format!("metadata.name={n}"),
            };
            q.pairs.retain(|(k, _)| k != "fieldSelector");
            q.pairs.push(("fieldSelector".into(), sel));
            start_watch(shared, res, ns, &q, table)
        }
        (Method::GET, None) => {
            let filter = filter_from(res, ns, query)?;
            let limit = query.int("limit")?.and_then(|l| usize::try_from(l).ok());
            let out = store.list(res, &filter, limit, query.get("continue"))?;
            Ok(list_response(res, &out, table))
        }
        (Method::GET, Some(n)) => {
            let obj = store.get(res, &ns_key, &n)?;
            if table {
                return Ok(json_response(200, &table::object_table(def, &obj)));
            }
            Ok(bytes_response(200, obj.bytes.clone()))
        }
        (Method::POST, None) => {
            let ct = content_type(&req);
            let body = read_body(req.into_body()).await?;
            let obj = parse_object(&body, &ct)?;
            let created = store.create(res, ns.as_deref(), obj, dry_run)?;
            Ok(bytes_response(201, created.bytes.clone()))
        }
        (Method::POST, Some(n)) if sub.as_deref() == Some("eviction") => {
            let ct = content_type(&req);
            let body = read_body(req.into_body()).await?;
            let eviction = parse_object(&body, &ct)?;
            store.evict(&ns_key, &n, &eviction)?;
            Ok(json_response(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        (Method::PUT, Some(n)) => {
            let ct = content_type(&req);
            let body = read_body(req.into_body()).await?;
            let obj = parse_object(&body, &ct)?;
            let updated =
                store.update(res, &ns_key, &n, obj, status_only, Some(&manager), dry_run)?;
            Ok(bytes_response(200, updated.bytes.clone()))
        }
        (Method::PATCH, Some(n)) => {
            let kind = match content_type(&req).as_str() {
                "application/merge-patch+json" => PatchType::Merge,
                "application/json-patch+json" => PatchType::Json,
                "application/strategic-merge-patch+json" => PatchType::Strategic,
                "application/apply-patch+yaml" | "application/apply-patch+cbor" => PatchType::Apply,
                other => return Err(ApiError::unsupported_media_type(other)),
            };
            let body = read_body(req.into_body()).await?;
            let (obj, created) = store.patch(
                res,
                &ns_key,
                &n,
                kind,
                &body,
                status_only,
                // Server-side apply requires a named manager; an update defaults to one.
                if kind == PatchType::Apply {
                    query.get("fieldManager")
                } else {
                    Some(&manager)
                },
                dry_run,
            )?;
            Ok(bytes_response(
                if created { 201 } else { 200 },
                obj.bytes.clone(),
            ))
        }
        (Method::DELETE, Some(n)) if sub.is_none() => {
            let mut opts = delete_opts(query, dry_run)?;
            let body = read_body(req.into_body()).await?;
            if !body.is_empty() {
                let v: Value = serde_json::from_slice(&body)
                    .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
                opts.merge_body(&v);
            }
            match store.delete(res, &ns_key, &n, &opts)? {
                Deleted::Pending(o) => Ok(bytes_response(200, o.bytes.clone())),
                Deleted::Gone(o) if res == PODS => Ok(bytes_response(200, o.bytes.clone())),
                Deleted::Gone(o) => {
                    let mut details = json!({"name": n, "kind": def.plural});
                    if !def.group.is_empty() {
                        details["group"] = json!(def.group);
                    }
                    if let Some(uid) = o.value.pointer("/metadata/uid") {
                        details["uid"] = uid.clone();
                    }
                    Ok(json_response(
                        200,
                        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
                    ))
                }
            }
        }
        (Method::DELETE, None) => {
            let mut opts = delete_opts(query, dry_run)?;
            let body = read_body(req.into_body()).await?;
            if !body.is_empty()
                && let Ok(v) = serde_json::from_slice::<Value>(&body)
            {
                opts.merge_body(&v);
            }
            let filter = filter_from(res, ns, query)?;
            let items = store.delete_collection(res, &filter, &opts)?;
            let out = ListOut {
                items,
                rv: store.current_rv(),
                cont: None,
                remaining: None,
            };
            Ok(list_response(res, &out, false))
        }
        (m, _) => Err(ApiError::method_not_allowed(m.as_str())),
    }
}

fn delete_opts(query: &Query, dry_run: bool) -> Result<DeleteOpts, ApiError> {
    Ok(DeleteOpts {
        grace: query.int("gracePeriodSeconds")?,
        uid: None,
        rv: None,
        dry_run,
    })
}

fn start_watch(
    shared: &Arc<Shared>,
    res: ResId,
    ns: Option<String>,
    query: &Query,
    accept_table: bool,
) -> Result<Response<Body>, ApiError> {
    let filter = filter_from(res, ns, query)?;
    let from = match query.get("resourceVersion") {
        None | Some("" | "0") => WatchFrom::Now,
        Some(v) => WatchFrom::After(
            v.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {v:?}")))?,
        ),
    };
    let send_initial = query.get("sendInitialEvents").map(|v| v == "true");
    let timeout = query
        .int("timeoutSeconds")?
        .filter(|t| *t > 0)
        .map_or(DEFAULT_WATCH_TIMEOUT, |t| {
            Duration::from_secs(t.unsigned_abs())
        });
    let (tx, rx) = mpsc::channel::<Bytes>(watch::OUT_CHUNKS);
    match shared.store.watch(res, &filter, from, send_initial) {
        Err(too_old) => {
            let line = watch::error_line(&too_old.0.status());
            let _ = tx.try_send(line);
            drop(tx);
        }
        Ok(start) => {
            let params = watch::WatchParams {
                def: &RESOURCES[res],
                filter,
                bookmarks: query.flag("allowWatchBookmarks"),
                initial_events_end: send_initial == Some(true),
                timeout,
                bookmark_interval: shared.bookmark_interval,
                table: accept_table,
            };
            let close = shared.watch_token();
            tokio::spawn(watch::run(shared.store.clone(), start, params, close, tx));
        }
    }
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(Frame::data(chunk)), rx))
    });
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{NAMESPACES, NODES, PDBS};

    /// (resource, namespace, name, subresource) of a route.
    type Parts = (ResId, Option<String>, Option<String>, Option<String>);

    fn res(route: &Route) -> Option<Parts> {
        match route {
            Route::Resource {
                res, ns, name, sub, ..
            } => Some((*res, ns.clone(), name.clone(), sub.clone())),
            _ => None,
        }
    }

    #[test]
    fn routes() {
        let s = |x: &str| Some(x.to_string());
        assert_eq!(
            parse_route("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"),
            Route::AccessReview
        );
        assert_eq!(
            res(&parse_route("/api/v1/pods")),
            Some((PODS, None, None, None))
        );
        assert_eq!(
            res(&parse_route("/api/v1/namespaces/default/pods/p/eviction")),
            Some((PODS, s("default"), s("p"), s("eviction")))
        );
        assert_eq!(
            res(&parse_route("/api/v1/namespaces/default")),
            Some((NAMESPACES, None, s("default"), None))
        );
        assert_eq!(
            res(&parse_route("/api/v1/namespaces/default/status")),
            Some((NAMESPACES, None, s("default"), s("status")))
        );
        assert_eq!(
            res(&parse_route("/api/v1/nodes/n1/status")),
            Some((NODES, None, s("n1"), s("status")))
        );
        assert_eq!(
            res(&parse_route(
                "/apis/policy/v1/namespaces/x/poddisruptionbudgets/b/status"
            )),
            Some((PDBS, s("x"), s("b"), s("status")))
        );
        assert_eq!(parse_route("/api/v1/pods/p"), Route::NotFound);
        assert_eq!(
            parse_route("/api/v1/namespaces/x/secrets/s/status"),
            Route::NotFound
        );
        assert_eq!(
            parse_route("/apis/apps/v1"),
            Route::GroupVersion("apps".into(), "v1".into())
        );
        assert!(matches!(
            parse_route("/api/v1/watch/namespaces/x/pods"),
            Route::Resource {
                legacy_watch: true,
                ..
            }
        ));
        assert_eq!(parse_route("/openapi/v2"), Route::NotFound);
    }
}
