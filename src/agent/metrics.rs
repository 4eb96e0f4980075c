//! The agent's Prometheus metrics, served on `agent.metrics_address` (loopback by default): its
//! shutdown lock, its readiness gates, and every drain it runs ([`DrainMetrics`]).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::warn;

use crate::drain::metrics::DrainMetrics;

/// The agent's metrics.
#[derive(Debug)]
pub struct AgentMetrics {
    registry: Registry,
    /// 1 while the agent holds logind's shutdown delay lock.
    pub lock_held: Gauge,
    /// 1 while every readiness gate passes.
    pub gates_passing: Gauge,
    /// Seconds from the agent's start until its gates first passed (0 until they do).
    pub gates_wait_seconds: Gauge<f64, AtomicU64>,
    passed: std::sync::atomic::AtomicBool,
    /// The drains the agent runs.
    pub drain: Arc<DrainMetrics>,
    /// Its failed requests to the API server, by verb and code (its client counts them).
    pub api_errors: crate::kube_client::ApiErrors,
    /// Its coordinated reboots.
    pub reboot: Arc<crate::reboot::metrics::RebootMetrics>,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let drain = Arc::new(DrainMetrics::register(&mut registry));
        let reboot = Arc::new(crate::reboot::metrics::RebootMetrics::register(
            &mut registry,
        ));
        let (lock_held, gates_passing, gates_wait_seconds) =
            (Gauge::default(), Gauge::default(), Gauge::default());
        let agent = registry.sub_registry_with_prefix("nodeward_agent");
        agent.register(
            "shutdown_lock_held",
            "1 while the agent holds logind's shutdown delay lock (0: a shutdown would not wait for a drain)",
            lock_held.clone(),
        );
        agent.register(
            "readiness_gates_passing",
            "1 while every readiness gate passes",
            gates_passing.clone(),
        );
        agent.register(
            "readiness_gates_wait_seconds",
            "Seconds from the agent's start until its readiness gates first passed (0 until they do)",
            gates_wait_seconds.clone(),
        );
        let api_errors = crate::kube_client::ApiErrors::default();
        agent.register(
            "api_errors",
            "Requests to the API server that failed, by verb (get, list, watch, create, patch, update, delete) and code (the HTTP status of an answer >= 400, or none: no answer)",
            api_errors.clone(),
        );
        Self {
            registry,
            api_errors,
            lock_held,
            gates_passing,
            gates_wait_seconds,
            passed: std::sync::atomic::AtomicBool::new(false),
            drain,
            reboot,
        }
    }
}

impl AgentMetrics {
    /// The gates pass, `since_start` after the agent started: the first time sets
    /// `gates_wait_seconds`.
    pub fn gates_passed(&self, since_start: std::time::Duration) {
        if !self.passed.swap(true, std::sync::atomic::Ordering::Relaxed) {
            self.gates_wait_seconds.set(since_start.as_secs_f64());
        }
    }
}

impl crate::metrics_http::Exposition for AgentMetrics {
    fn metrics(&self) -> String {
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            warn!(error = %e, "cannot encode metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics_http::Exposition;

    #[test]
    fn every_metric_is_exposed_under_its_documented_name() {
        let m = AgentMetrics::default();
        m.lock_held.set(1);
        m.drain.answered(429);
        m.api_errors
            .get_or_create(&vec![
                ("verb".into(), "patch".into()),
                ("code".into(), "503".into()),
            ])
            .inc();
        let _running = m.drain.started();
        let text = m.metrics();
        for name in [
            "nodeward_agent_shutdown_lock_held 1",
            "nodeward_agent_readiness_gates_passing 0",
            "nodeward_agent_readiness_gates_wait_seconds 0",
            "nodeward_drain_in_progress 1",
            "nodeward_drain_evictions_total{code=\"429\"} 1",
            "nodeward_drain_deadline_seconds 0",
            "nodeward_agent_api_errors_total{verb=\"patch\",code=\"503\"} 1",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }
}
