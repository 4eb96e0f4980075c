//! The scaler's Prometheus metrics and its liveness (`/healthz`); [`crate::metrics_http`]
//! serves them.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tracing::warn;

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
    /// 1 while a recorded cluster shutdown is stale (no node holds its cordon): not obeyed.
    pub cluster_shutdown_stale: Gauge,
    /// Whether the scaler's loop makes progress (`/healthz`, systemd's watchdog).
    pub liveness: crate::metrics_http::Liveness,
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
            cluster_shutdown_stale: Gauge::default(),
            liveness: crate::metrics_http::Liveness::default(),
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
        registry.register(
            "cluster_shutdown_stale",
            "1 while a recorded cluster shutdown is stale (no node holds its cordon): not obeyed; nodeward cluster start removes it",
            m.cluster_shutdown_stale.clone(),
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

impl crate::metrics_http::Exposition for Metrics {
    fn metrics(&self) -> String {
        self.render()
    }

    fn unhealthy(&self) -> Option<String> {
        self.liveness.stalled().map(|d| {
            format!(
                "stalled: the scaler's loop last made progress {} s ago\n",
                d.as_secs()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::metrics_http::Exposition;

    #[test]
    fn healthz_says_503_once_the_loop_stalls() {
        let m = super::Metrics::default();
        assert_eq!(m.unhealthy(), None);
        m.liveness.set_stall_after(std::time::Duration::ZERO);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let why = m.unhealthy().expect("stalled");
        assert!(why.contains("the scaler's loop"), "{why}");
        m.liveness
            .set_stall_after(std::time::Duration::from_secs(60));
        m.liveness.beat();
        assert_eq!(m.unhealthy(), None);
    }

    #[test]
    fn the_scalers_metrics_are_named_for_it() {
        let m = super::Metrics::default();
        m.leader.set(1);
        assert!(m.metrics().contains("nodeward_scaler_leader 1"));
    }
}
