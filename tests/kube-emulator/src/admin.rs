//! The admin paths under `/emulator/`, for tests that drive the emulator from outside the
//! process (shell scripts, the `kube-emulator` binary):
//!
//! | method | path | body / answer |
//! |---|---|---|
//! | GET, DELETE | `/emulator/requests` | `{"entries": [...], "counts": [...]}` / reset |
//! | GET, POST, DELETE | `/emulator/faults` | list / add a [`FaultRule`] (answers `{"id": N}`) / clear all |
//! | DELETE | `/emulator/faults/ID` | remove one rule |
//! | PUT | `/emulator/latency` | `{"millis": N}` added to every API request |
//! | POST | `/emulator/close-watches` | end every open watch |
//! | POST | `/emulator/refuse-connections` | `{"millis": N}`: close the socket, reopen after |
//! | POST | `/emulator/compact` | drop watch history: older resourceVersions get 410 |
//! | PUT | `/emulator/pods/NS/NAME/ready` | `{"ready": bool}` |
//! | GET | `/emulator/pdbs/NS/NAME/history` | status snapshots of a budget |
//! | GET | `/emulator/evictions` | every eviction and its outcome |

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde_json::{Value, json};

use crate::control::FaultRule;
use crate::error::ApiError;
use crate::resources::PODS;
use crate::server::{Body, RefuseCmd, Shared, error_response, json_response};
use crate::store::set_ready_status;

/// Lets the admin answer reach the client before the socket closes.
const REFUSE_DELAY: Duration = Duration::from_millis(50);

/// Handles an admin request.
pub async fn handle(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    match route(shared, req).await {
        Ok(v) => json_response(200, &v),
        Err(e) => error_response(&e),
    }
}

async fn body_json(req: Request<Incoming>) -> Result<Value, ApiError> {
    let bytes = req
        .into_body()
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("cannot read body: {e}")))?
        .to_bytes();
    if bytes.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("body is not JSON: {e}")))
}

fn millis(v: &Value) -> Result<Duration, ApiError> {
    v.get("millis")
        .and_then(Value::as_u64)
        .map(Duration::from_millis)
        .ok_or_else(|| ApiError::bad_request("expected {\"millis\": N}"))
}

async fn route(shared: &Arc<Shared>, req: Request<Incoming>) -> Result<Value, ApiError> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).skip(1).collect();
    match (&method, segs.as_slice()) {
        (&Method::GET, ["requests"]) => Ok(json!({
            "entries": shared.log.entries(),
            "counts": shared.log.counts(),
        })),
        (&Method::DELETE, ["requests"]) => {
            shared.log.clear();
            Ok(json!({}))
        }
        (&Method::GET, ["faults"]) => Ok(json!(
            shared
                .faults
                .rules()
                .into_iter()
                .map(|(id, r)| json!({"id": id, "rule": r}))
                .collect::<Vec<_>>()
        )),
        (&Method::POST, ["faults"]) => {
            let rule: FaultRule = serde_json::from_value(body_json(req).await?)
                .map_err(|e| ApiError::bad_request(format!("not a fault rule: {e}")))?;
            Ok(json!({"id": shared.faults.add(rule)}))
        }
        (&Method::DELETE, ["faults"]) => {
            shared.faults.clear();
            Ok(json!({}))
        }
        (&Method::DELETE, ["faults", id]) => {
            let id = id
                .parse()
                .map_err(|_| ApiError::bad_request("fault id is a number"))?;
            shared.faults.remove(id);
            Ok(json!({}))
        }
        (&Method::PUT | &Method::POST, ["latency"]) => {
            shared.faults.set_latency(millis(&body_json(req).await?)?);
            Ok(json!({}))
        }
        (&Method::POST, ["close-watches"]) => {
            shared.close_watches();
            Ok(json!({}))
        }
        (&Method::POST, ["refuse-connections"]) => {
            let duration = millis(&body_json(req).await?)?;
            let tx = shared.refuse_tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(REFUSE_DELAY).await;
                let (ack, _) = tokio::sync::oneshot::channel();
                let _ = tx.send(RefuseCmd { duration, ack });
            });
            Ok(json!({}))
        }
        (&Method::POST, ["compact"]) => {
            shared.store.compact();
            Ok(json!({"resourceVersion": shared.store.current_rv().to_string()}))
        }
        (&Method::PUT | &Method::POST, ["pods", ns, name, "ready"]) => {
            let ready = body_json(req)
                .await?
                .get("ready")
                .and_then(Value::as_bool)
                .ok_or_else(|| ApiError::bad_request("expected {\"ready\": bool}"))?;
            let obj = shared
                .store
                .modify(PODS, ns, name, |p| set_ready_status(p, ready))?;
            Ok(obj.value.clone())
        }
        (&Method::GET, ["pdbs", ns, name, "history"]) => {
            Ok(json!(shared.store.pdb_history(ns, name)))
        }
        (&Method::GET, ["evictions"]) => Ok(json!(shared.store.evictions())),
        _ => Err(ApiError::path_not_found()),
    }
}
