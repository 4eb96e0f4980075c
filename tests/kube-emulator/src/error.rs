//! Errors: [`ApiError`] is what the HTTP API answers (a `Status` body shaped like
//! kube-apiserver's), [`Error`] is what the library API returns.

use serde_json::{Value, json};

use crate::resources::ResourceDef;

/// An API failure, rendered as a `metav1.Status` with the apiserver's reason and message.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code (also `Status.code`).
    pub code: u16,
    /// `Status.reason`; empty for the few answers the apiserver gives without one.
    pub reason: &'static str,
    /// `Status.message`.
    pub message: String,
    /// `Status.details`, when the apiserver sends them.
    pub details: Option<Value>,
    /// `Retry-After` header and `details.retryAfterSeconds`.
    pub retry_after: Option<u32>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

fn details(res: &ResourceDef, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": res.plural});
    if !res.group.is_empty() {
        d["group"] = json!(res.group);
    }
    d
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// 404 `pods "x" not found`.
    pub fn not_found(res: &ResourceDef, name: &str) -> Self {
        Self {
            details: Some(details(res, name)),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", res.qualified()),
            )
        }
    }

    /// 404 for a path that names nothing the server serves.
    pub fn path_not_found() -> Self {
        Self {
            details: Some(json!({})),
            ..Self::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        }
    }

    /// 409 `pods "x" already exists`.
    pub fn already_exists(res: &ResourceDef, name: &str) -> Self {
        Self {
            details: Some(details(res, name)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", res.qualified()),
            )
        }
    }

    /// 409 `Operation cannot be fulfilled on pods "x": <why>`.
    pub fn conflict(res: &ResourceDef, name: &str, why: &str) -> Self {
        Self {
            details: Some(details(res, name)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {why}",
                    res.qualified()
                ),
            )
        }
    }

    /// The conflict of a stale `metadata.resourceVersion`.
    pub fn stale(res: &ResourceDef, name: &str) -> Self {
        Self::conflict(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 `Pod "x" is invalid: field: message`.
    pub fn invalid(
        res: &ResourceDef,
        name: &str,
        field: &str,
        cause_reason: &str,
        message: &str,
    ) -> Self {
        let mut d = json!({
            "name": name,
            "kind": res.kind,
            "causes": [{"reason": cause_reason, "message": message, "field": field}],
        });
        if !res.group.is_empty() {
            d["group"] = json!(res.group);
        }
        Self {
            details: Some(d),
            ..Self::new(
                422,
                "Invalid",
                format!("{} \"{name}\" is invalid: {field}: {message}", res.kind),
            )
        }
    }

    /// 422 with a plain message (a patch that does not apply).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(method: &str) -> Self {
        Self {
            details: Some(json!({})),
            ..Self::new(
                405,
                "MethodNotAllowed",
                format!(
                    "the server does not allow this method on the requested resource ({method})"
                ),
            )
        }
    }

    /// 415 UnsupportedMediaType for an object body in a format the emulator does not decode.
    pub fn unsupported_body(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {content_type:?})"
            ),
        )
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    /// 429 TooManyRequests.
    pub fn too_many_requests(message: impl Into<String>, retry_after: Option<u32>) -> Self {
        let mut d = json!({});
        if let Some(s) = retry_after {
            d["retryAfterSeconds"] = json!(s);
        }
        Self {
            details: Some(d),
            retry_after,
            ..Self::new(429, "TooManyRequests", message)
        }
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            details: Some(json!({"causes": [{"message": message.clone()}]})),
            ..Self::new(
                500,
                "InternalError",
                format!("Internal error occurred: {message}"),
            )
        }
    }

    /// 503 ServiceUnavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// 410 Expired, the apiserver's answer to a too old resourceVersion or continue token.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 403 Forbidden as `apierrors.NewForbidden` renders it, for a resource given by parts
    /// (an injected fault's).
    pub fn forbidden_named(
        qualified: &str,
        kind: &str,
        group: &str,
        name: Option<&str>,
        why: &str,
    ) -> Self {
        let mut d = json!({"kind": kind});
        if !group.is_empty() {
            d["group"] = json!(group);
        }
        let message = match name {
            Some(n) => {
                d["name"] = json!(n);
                format!("{qualified} \"{n}\" is forbidden: {why}")
            }
            None => format!("{qualified} is forbidden: {why}"),
        };
        Self {
            details: Some(d),
            ..Self::new(403, "Forbidden", message)
        }
    }

    /// 403 Forbidden.
    pub fn forbidden(res: &ResourceDef, name: &str, why: &str) -> Self {
        Self {
            details: Some(details(res, name)),
            ..Self::new(
                403,
                "Forbidden",
                format!("{} \"{name}\" is forbidden: {why}", res.qualified()),
            )
        }
    }

    /// A `Status` with a code and message but no reason (the eviction handler's 500 for a pod
    /// with several budgets).
    pub fn bare(code: u16, message: impl Into<String>) -> Self {
        Self::new(code, "", message)
    }

    /// Adds a cause to `details.causes`.
    pub fn with_cause(mut self, reason: &str, message: &str) -> Self {
        let d = self.details.get_or_insert_with(|| json!({}));
        let cause = json!({"reason": reason, "message": message});
        match d.get_mut("causes").and_then(Value::as_array_mut) {
            Some(c) => c.push(cause),
            None => d["causes"] = json!([cause]),
        }
        self
    }

    /// The `Status` body.
    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            s["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// Errors of the library API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// Address asked for.
        addr: std::net::SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig file could not be written.
    #[error("cannot write kubeconfig {path}")]
    Kubeconfig {
        /// Where.
        path: std::path::PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A seed file could not be read.
    #[error("cannot read seed file {path}")]
    SeedRead {
        /// Where.
        path: std::path::PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A YAML document does not parse.
    #[error("YAML document {index} does not parse")]
    Yaml {
        /// Position of the document in the stream, from 0.
        index: usize,
        /// Cause.
        #[source]
        source: serde_norway::Error,
    },
    /// An object names no served kind.
    #[error("{api_version}/{kind} is not a kind the emulator serves")]
    UnknownKind {
        /// `apiVersion` of the object.
        api_version: String,
        /// `kind` of the object.
        kind: String,
    },
    /// The emulated API refused the operation.
    #[error("API error: {0}")]
    Api(#[from] ApiError),
}

/// Library result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{PDBS, PODS, RESOURCES};

    #[test]
    fn shapes_match_the_apiserver() {
        let e = ApiError::not_found(&RESOURCES[PODS], "web");
        assert_eq!(
            e.status(),
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": "pods \"web\" not found", "reason": "NotFound",
                   "details": {"name": "web", "kind": "pods"}, "code": 404})
        );
        let e = ApiError::stale(&RESOURCES[PDBS], "b");
        assert_eq!(e.status()["details"]["group"], "policy");
        assert_eq!(
            e.message,
            "Operation cannot be fulfilled on poddisruptionbudgets.policy \"b\": the object has been modified; please apply your changes to the latest version and try again"
        );
        let e = ApiError::bare(500, "x");
        assert!(e.status().get("reason").is_none());
    }
}
