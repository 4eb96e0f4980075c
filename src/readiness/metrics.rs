//! `nodeward_controller_*`: the readiness controller's figures, on its `--metrics-address`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let out_of_service = Family::<ChangeLabel, Counter>::default();
        registry.sub_registry_with_prefix("nodeward_controller").register(
            "out_of_service_changes",
            "Out-of-service changes written to nodes announced as powered off, by change (taint: the taint added; untaint: the taint and the record removed; clear: the record removed, no taint of nodeward's there)",
            out_of_service.clone(),
        );
        Self {
            registry,
            out_of_service,
        }
    }
}

impl ControllerMetrics {
    /// One change written.
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
    }
}
