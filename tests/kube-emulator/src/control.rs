//! Test controls: injected faults and latency, and the request log with its counters.
//!
//! Faults are rules matched against each API request's verb and resource (`pods`,
//! `pods/eviction`, `nodes/status`, ...): a rule answers with its status code either for its
//! next `count` matching requests or at random with probability `rate`. The log records every
//! API request (not the `/emulator/` admin paths) with the verb the apiserver's audit log would
//! give it and the client's User-Agent, so a test can assert how much load an agent puts on
//! the API.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// An injected failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct FaultRule {
    /// Verb to fail (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`); `None` for all.
    #[serde(default)]
    pub verb: Option<String>,
    /// Resource to fail, with subresource (`pods`, `pods/eviction`); `None` for all.
    #[serde(default)]
    pub resource: Option<String>,
    /// Object name to fail (the pod of a `pods/eviction`); `None` for all.
    #[serde(default)]
    pub name: Option<String>,
    /// HTTP status to answer: 429, 500 or 503; 403 as kube-apiserver's `Forbidden` (the
    /// authorizer's, or with [`Self::denial`] an admission plugin's); others a bare Status.
    pub code: u16,
    /// For a 403: why, as an admission plugin says it after `<resource> "<name>" is forbidden: `
    /// (NodeRestriction, a ValidatingAdmissionPolicy). `None`: the authorizer's `User … cannot
    /// <verb> resource …`, as for credentials without the permission.
    #[serde(default)]
    pub denial: Option<String>,
    /// Fail this many matching requests, then stop.
    #[serde(default)]
    pub count: Option<u64>,
    /// Fail each matching request with this probability (0..=1).
    #[serde(default)]
    pub rate: Option<f64>,
    /// `Retry-After` seconds for a 429 (default 1, as API priority and fairness sends).
    #[serde(default)]
    pub retry_after_seconds: Option<u32>,
}

impl FaultRule {
    /// A rule failing the next `count` requests of `verb` on `resource` with `code`.
    pub fn count(verb: &str, resource: &str, code: u16, count: u64) -> Self {
        Self {
            verb: Some(verb.to_string()),
            resource: Some(resource.to_string()),
            code,
            count: Some(count),
            ..Self::default()
        }
    }

    /// A rule failing requests of `verb` on `resource` with probability `rate`.
    pub fn rate(verb: &str, resource: &str, code: u16, rate: f64) -> Self {
        Self {
            verb: Some(verb.to_string()),
            resource: Some(resource.to_string()),
            code,
            rate: Some(rate),
            ..Self::default()
        }
    }

    /// Only the request of `verb` on `resource` for the object `name` fails (with `denial`, for
    /// a 403).
    pub fn one(verb: &str, resource: &str, name: &str, code: u16, denial: Option<&str>) -> Self {
        Self {
            name: Some(name.to_string()),
            denial: denial.map(str::to_string),
            ..Self::rate(verb, resource, code, 1.0)
        }
    }

    fn error(&self, req: &Target<'_>) -> ApiError {
        match self.code {
            403 => {
                let why = self
                    .denial
                    .clone()
                    .unwrap_or_else(|| req.authorizer_denial());
                ApiError::forbidden_named(req.qualified, req.kind, req.group, req.name, &why)
            }
            429 => ApiError::too_many_requests(
                "Too many requests, please try again later.",
                Some(self.retry_after_seconds.unwrap_or(1)),
            ),
            500 => ApiError::internal("injected fault"),
            503 => ApiError::unavailable(
                "injected fault: the server is currently unable to handle the request",
            ),
            code => ApiError::bare(code, "injected fault"),
        }
    }
}

/// The request a fault rule is matched against.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// Kubernetes verb.
    pub verb: &'a str,
    /// Resource with subresource (`pods/eviction`).
    pub resource: &'a str,
    /// The main resource's plural (`pods`), as `details.kind`.
    pub kind: &'a str,
    /// Its API group.
    pub group: &'a str,
    /// Its qualified name (`pods`, `poddisruptionbudgets.policy`).
    pub qualified: &'a str,
    /// Namespace of the request path.
    pub namespace: Option<&'a str>,
    /// Object name of the request path.
    pub name: Option<&'a str>,
}

/// The user an injected authorizer 403 names.
const FAULT_USER: &str = "system:serviceaccount:kube-system:emulated";

impl Target<'_> {
    /// The authorizer's sentence (`responsewriters.forbiddenMessage`) for this request.
    fn authorizer_denial(&self) -> String {
        let (verb, resource, group) = (self.verb, self.resource, self.group);
        match self.namespace {
            Some(ns) => format!(
                "User \"{FAULT_USER}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" in the namespace \"{ns}\""
            ),
            None => format!(
                "User \"{FAULT_USER}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" at the cluster scope"
            ),
        }
    }
}

#[derive(Debug, Default)]
struct FaultState {
    rules: Vec<(u64, FaultRule)>,
    next_id: u64,
    latency: Duration,
    /// Requests the latency holds now: (id, verb, resource).
    held: Vec<(u64, String, String)>,
}

/// Counts a request in [`Faults::held`] until it is dropped (answered, or its client gone).
struct Held<'a> {
    faults: &'a Faults,
    id: u64,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.faults.lock().held.retain(|(i, _, _)| *i != self.id);
    }
}

/// The fault rules and added latency.
#[derive(Debug, Default)]
pub struct Faults {
    state: Mutex<FaultState>,
}

impl Faults {
    fn lock(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a rule; returns its id.
    pub fn add(&self, rule: FaultRule) -> u64 {
        let mut st = self.lock();
        st.next_id += 1;
        let id = st.next_id;
        st.rules.push((id, rule));
        id
    }

    /// Removes one rule.
    pub fn remove(&self, id: u64) {
        self.lock().rules.retain(|(i, _)| *i != id);
    }

    /// Removes every rule and the latency.
    pub fn clear(&self) {
        let mut st = self.lock();
        st.rules.clear();
        st.latency = Duration::ZERO;
    }

    /// The active rules with their ids.
    pub fn rules(&self) -> Vec<(u64, FaultRule)> {
        self.lock().rules.clone()
    }

    /// Delays every API request by `d`.
    pub fn set_latency(&self, d: Duration) {
        self.lock().latency = d;
    }

    /// Current added latency.
    pub fn latency(&self) -> Duration {
        self.lock().latency
    }

    /// Holds a request for the added latency (if any), counted in [`Self::held`] meanwhile.
    pub async fn hold(&self, verb: &str, resource: &str) {
        let (latency, id) = {
            let mut st = self.lock();
            if st.latency.is_zero() {
                return;
            }
            st.next_id += 1;
            let id = st.next_id;
            st.held.push((id, verb.to_string(), resource.to_string()));
            (st.latency, id)
        };
        let _held = Held { faults: self, id };
        tokio::time::sleep(latency).await;
    }

    /// The requests the added latency holds now, as (verb, resource): a test waits for one to be
    /// in flight instead of sleeping for a guessed time.
    pub fn held(&self) -> Vec<(String, String)> {
        self.lock()
            .held
            .iter()
            .map(|(_, v, r)| (v.clone(), r.clone()))
            .collect()
    }

    /// The failure to answer for a request, if a rule fires.
    pub fn check(&self, req: &Target<'_>) -> Option<ApiError> {
        let mut st = self.lock();
        let mut fired = None;
        for (id, rule) in &mut st.rules {
            if rule.verb.as_deref().is_some_and(|v| v != req.verb)
                || rule.resource.as_deref().is_some_and(|r| r != req.resource)
                || rule.name.as_deref().is_some_and(|n| Some(n) != req.name)
            {
                continue;
            }
            if let Some(n) = rule.count.as_mut() {
                if *n == 0 {
                    continue;
                }
                *n -= 1;
                fired = Some((*id, rule.error(req)));
                break;
            }
            if let Some(rate) = rule.rate
                && rand::random::<f64>() < rate
            {
                fired = Some((*id, rule.error(req)));
                break;
            }
        }
        st.rules.retain(|(_, r)| r.count != Some(0));
        fired.map(|(_, e)| e)
    }
}

/// One API request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRecord {
    /// When it arrived.
    pub at: DateTime<Utc>,
    /// HTTP method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Query string.
    pub query: String,
    /// Kubernetes verb (`get`, `list`, `watch`, ...); discovery reads are `get`.
    pub verb: String,
    /// Resource with subresource (`pods`, `pods/eviction`); empty for discovery.
    pub resource: String,
    /// Namespace of the request path.
    pub namespace: Option<String>,
    /// Object name of the request path.
    pub name: Option<String>,
    /// `User-Agent` header.
    pub user_agent: String,
    /// HTTP status answered (200 for a watch that started).
    pub code: u16,
}

/// Count of requests per verb, resource and user agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestCount {
    /// Verb.
    pub verb: String,
    /// Resource.
    pub resource: String,
    /// User agent.
    pub user_agent: String,
    /// Requests.
    pub count: u64,
}

#[derive(Debug, Default)]
struct LogState {
    entries: VecDeque<RequestRecord>,
    counts: BTreeMap<(String, String, String), u64>,
}

/// The request log: the latest entries and counters over all requests.
#[derive(Debug)]
pub struct RequestLog {
    state: Mutex<LogState>,
    capacity: usize,
}

impl RequestLog {
    /// A log keeping at most `capacity` entries (counters are unbounded).
    pub fn new(capacity: usize) -> Self {
        Self {
            state: Mutex::new(LogState::default()),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a request.
    pub fn record(&self, r: RequestRecord) {
        let mut st = self.lock();
        *st.counts
            .entry((r.verb.clone(), r.resource.clone(), r.user_agent.clone()))
            .or_default() += 1;
        if self.capacity > 0 {
            if st.entries.len() >= self.capacity {
                st.entries.pop_front();
            }
            st.entries.push_back(r);
        }
    }

    /// The kept entries, oldest first.
    pub fn entries(&self) -> Vec<RequestRecord> {
        self.lock().entries.iter().cloned().collect()
    }

    /// Counters, sorted by verb, resource and user agent.
    pub fn counts(&self) -> Vec<RequestCount> {
        self.lock()
            .counts
            .iter()
            .map(|((verb, resource, user_agent), count)| RequestCount {
                verb: verb.clone(),
                resource: resource.clone(),
                user_agent: user_agent.clone(),
                count: *count,
            })
            .collect()
    }

    /// Forgets everything.
    pub fn clear(&self) {
        let mut st = self.lock();
        st.entries.clear();
        st.counts.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(verb: &'a str, resource: &'a str, name: Option<&'a str>) -> Target<'a> {
        let kind = resource.split('/').next().unwrap_or(resource);
        Target {
            verb,
            resource,
            kind,
            group: "",
            qualified: kind,
            namespace: Some("default"),
            name,
        }
    }

    #[test]
    fn count_rules_fire_then_vanish() {
        let f = Faults::default();
        f.add(FaultRule::count("create", "pods/eviction", 429, 2));
        let evict = req("create", "pods/eviction", Some("web-0"));
        assert!(f.check(&req("get", "pods", None)).is_none());
        assert_eq!(f.check(&evict).map(|e| e.code), Some(429));
        assert_eq!(f.check(&evict).map(|e| e.retry_after), Some(Some(1)));
        assert!(f.check(&evict).is_none());
        assert!(f.rules().is_empty());
        f.add(FaultRule::rate("list", "nodes", 503, 1.0));
        assert_eq!(
            f.check(&req("list", "nodes", None)).map(|e| e.code),
            Some(503)
        );
        f.add(FaultRule {
            code: 500,
            count: Some(1),
            ..FaultRule::default()
        });
        f.clear();
        assert!(f.check(&req("get", "x", None)).is_none());
    }

    /// A 403 reads as kube-apiserver's: the authorizer's sentence, or an admission plugin's
    /// denial of one object.
    #[test]
    fn forbidden_faults_say_who_refused() {
        let f = Faults::default();
        f.add(FaultRule::count("create", "pods/eviction", 403, 1));
        let e = f
            .check(&req("create", "pods/eviction", Some("web-0")))
            .expect("fires");
        assert_eq!((e.code, e.reason), (403, "Forbidden"));
        assert_eq!(
            e.message,
            r#"pods "web-0" is forbidden: User "system:serviceaccount:kube-system:emulated" cannot create resource "pods/eviction" in API group "" in the namespace "default""#
        );
        let denial = "node worker-1 can only evict pods with spec.nodeName set to itself";
        f.add(FaultRule::one(
            "create",
            "pods/eviction",
            "db-0",
            403,
            Some(denial),
        ));
        assert!(
            f.check(&req("create", "pods/eviction", Some("web-0")))
                .is_none()
        );
        let e = f
            .check(&req("create", "pods/eviction", Some("db-0")))
            .expect("fires");
        assert_eq!(e.message, format!(r#"pods "db-0" is forbidden: {denial}"#));
    }

    #[test]
    fn log_caps_entries_but_counts_all() {
        let log = RequestLog::new(1);
        for verb in ["get", "get", "list"] {
            log.record(RequestRecord {
                at: Utc::now(),
                method: "GET".into(),
                path: "/".into(),
                query: String::new(),
                verb: verb.into(),
                resource: "pods".into(),
                namespace: None,
                name: None,
                user_agent: "ua".into(),
                code: 200,
            });
        }
        assert_eq!(log.entries().len(), 1);
        let counts = log.counts();
        assert_eq!(counts.len(), 2);
        assert_eq!(counts[0].count, 2);
    }
}
