//! `nodeward_controller_*`: the readiness controller's figures, on its `--metrics-address`, with
//! its `/healthz` (the loop turns: it walks every node each [`super::controller::RESYNC`]) and
//! `/readyz` (it has listed the nodes).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::warn;

/// A change label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChangeLabel {
    /// `taint`, `untaint` or `clear` ([`crate::out_of_service::Change`]'s Display).
    pub change: String,
}

/// The controller's metrics.
#[derive(Debug)]
pub struct ControllerMetrics {
    registry: Registry,
    /// Out-of-service changes written, by change.
    pub out_of_service: Family<ChangeLabel, Counter>,
    /// Startup-taint changes written, by change (`remove`, `add`).
    pub startup_taint: Family<ChangeLabel, Counter>,
    /// 1 once the nodes are listed (and the cache walked).
    pub synced: Gauge,
    /// Whether the loop turns.
    pub liveness: crate::metrics_http::Liveness,
}

/// How long the controller's loop may go without a turn before `/healthz` says 503: it turns at
/// every Node change and every resync once synced, and at every watch retry before.
pub const STALL_AFTER: std::time::Duration = std::time::Duration::from_secs(120);

impl Default for ControllerMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let out_of_service = Family::<ChangeLabel, Counter>::default();
        let startup_taint = Family::<ChangeLabel, Counter>::default();
        let synced = Gauge::default();
        let sub = registry.sub_registry_with_prefix("nodeward_controller");
        sub.register(
            "startup_taint_changes",
            "Startup-taint changes written, by change (remove: the node's agent reports it ready; add: it reports it not ready, continuous mode)",
            startup_taint.clone(),
        );
        sub.register(
            "synced",
            "1 once this replica has listed the nodes and acts on them",
            synced.clone(),
        );
        sub.register(
            "out_of_service_changes",
            "Out-of-service changes written to nodes announced as powered off, by change (taint: the taint added; untaint: the taint and the record removed; clear: the record removed, no taint of nodeward's there)",
            out_of_service.clone(),
        );
        let liveness = crate::metrics_http::Liveness::default();
        liveness.set_stall_after(STALL_AFTER);
        Self {
            registry,
            out_of_service,
            startup_taint,
            synced,
            liveness,
        }
    }
}

impl ControllerMetrics {
    /// One startup-taint change written.
    pub fn taint_changed(&self, change: super::TaintChange) {
        let change = match change {
            super::TaintChange::Remove => "remove",
            super::TaintChange::Add => "add",
        };
        self.startup_taint
            .get_or_create(&ChangeLabel {
                change: change.to_string(),
            })
            .inc();
    }

    /// One out-of-service change written.
    pub fn changed(&self, change: crate::out_of_service::Change) {
        self.out_of_service
            .get_or_create(&ChangeLabel {
                change: change.to_string(),
            })
            .inc();
    }
}

impl crate::metrics_http::Exposition for ControllerMetrics {
    fn metrics(&self) -> String {
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            warn!(error = %e, "cannot encode metrics");
        }
        out
    }

    fn unhealthy(&self) -> Option<String> {
        self.liveness.stalled().map(|d| {
            format!(
                "stalled: the readiness controller's loop last turned {} s ago\n",
                d.as_secs()
            )
        })
    }

    fn not_ready(&self) -> Option<String> {
        if let Some(why) = self.unhealthy() {
            return Some(why);
        }
        (self.synced.get() == 0).then(|| "the nodes are not listed yet\n".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics_http::Exposition;

    #[test]
    fn the_out_of_service_counter_is_exposed_under_its_documented_name() {
        let m = ControllerMetrics::default();
        m.changed(crate::out_of_service::Change::Taint);
        let text = m.metrics();
        assert!(
            text.contains("nodeward_controller_out_of_service_changes_total{change=\"taint\"} 1"),
            "{text}"
        );
        m.taint_changed(crate::readiness::TaintChange::Remove);
        let text = m.metrics();
        assert!(
            text.contains("nodeward_controller_startup_taint_changes_total{change=\"remove\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn ready_once_synced_healthy_while_the_loop_turns() {
        let m = ControllerMetrics::default();
        assert_eq!(m.unhealthy(), None);
        let why = m
            .not_ready()
            .expect("not ready before the nodes are listed");
        assert!(why.contains("not listed"), "{why}");
        m.synced.set(1);
        assert_eq!(m.not_ready(), None);
        m.liveness.set_stall_after(std::time::Duration::ZERO);
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(m.unhealthy().is_some_and(|w| w.contains("stalled")));
        assert!(m.not_ready().is_some(), "not ready while stalled");
    }
}
