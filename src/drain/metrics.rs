//! What a drain exports to Prometheus, when whoever runs it (the agent) gives it somewhere to:
//! how long drains take by outcome, evictions by the API server's answer, the pods a running
//! drain still waits for by what they wait on, and the time to its deadline. Names follow
//! kube-state-metrics' and Karpenter's conventions (`_total` counters, `_seconds` units).

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::explain::Explanation;
use super::step::DrainOutcome;

/// One label.
pub type Label = Vec<(String, String)>;

/// What each `waiting_on` value of `nodeward_drain_pods_left` means.
pub const WAITING_ON: [&str; 5] = ["budget", "eviction", "retry", "termination", "replacement"];

/// What each `fate` value of `nodeward_drain_pods_total` means: evicted through its budgets,
/// deleted past them by `drain.on_deadline = delete`, refused, still there when the drain ended.
pub const FATES: [&str; 4] = ["evicted", "deleted_past_budget", "refused", "left_behind"];

/// A drain's metrics, registered once per process and shared by its drains.
#[derive(Debug)]
pub struct DrainMetrics {
    /// 1 while a drain runs.
    pub in_progress: Gauge,
    /// Drains by outcome (`drained`, `refused`, `deadline_exceeded`), in seconds.
    pub duration_seconds: Family<Label, Histogram>,
    /// Eviction answers by HTTP status code (`201`, `429`, `500`, ...).
    pub evictions: Family<Label, Counter>,
    /// Pods the running drain still waits for, by what they wait on ([`WAITING_ON`]).
    pub pods_left: Family<Label, Gauge>,
    /// Pods of the drains that ended, by what became of them ([`FATES`]).
    pub pods: Family<Label, Counter>,
    /// Seconds to the running drain's deadline (0 when none runs or it has passed).
    pub deadline_seconds: Gauge<f64, AtomicU64>,
    /// Pods whose budget was shown unable to allow their eviction, by what the drain did
    /// (`acted`: the deadline policy at once; `waited`: on until the deadline).
    pub budget_unsatisfiable: Family<Label, Counter>,
}

fn label(key: &str, value: &str) -> Label {
    vec![(key.to_string(), value.to_string())]
}

impl DrainMetrics {
    /// Registers the drain's metrics in `registry` (prefix `nodeward_drain_`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            in_progress: Gauge::default(),
            duration_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.25, 2.0, 12))
            }),
            evictions: Family::default(),
            pods_left: Family::default(),
            pods: Family::default(),
            deadline_seconds: Gauge::default(),
            budget_unsatisfiable: Family::default(),
        };
        let sub = registry.sub_registry_with_prefix("nodeward_drain");
        sub.register("in_progress", "1 while a drain runs", m.in_progress.clone());
        sub.register(
            "duration_seconds",
            "How long drains took, by outcome",
            m.duration_seconds.clone(),
        );
        sub.register(
            "evictions",
            "Eviction requests answered, by HTTP status code (429: a budget refused)",
            m.evictions.clone(),
        );
        sub.register(
            "pods_left",
            "Pods the running drain still waits for, by what they wait on (budget, eviction, retry, termination)",
            m.pods_left.clone(),
        );
        sub.register(
            "pods",
            "Pods of the drains that ended, by fate (evicted, deleted_past_budget, refused, left_behind)",
            m.pods.clone(),
        );
        sub.register(
            "budget_unsatisfiable",
            "Pods whose budget cannot allow their eviction before the deadline, by what the drain did (acted, waited)",
            m.budget_unsatisfiable.clone(),
        );
        sub.register(
            "deadline_seconds",
            "Seconds to the running drain's deadline",
            m.deadline_seconds.clone(),
        );
        m
    }

    /// A drain started: `in_progress` is 1 until the returned guard is dropped (the drain
    /// ended, however: an error included), and the running drain's gauges go back to 0 then.
    pub fn started(&self) -> Running<'_> {
        self.in_progress.set(1);
        Running(self)
    }

    /// An eviction was answered with `code`.
    pub fn answered(&self, code: u16) {
        self.evictions
            .get_or_create(&label("code", &code.to_string()))
            .inc();
    }

    /// What the running drain waits on now.
    pub fn waiting(&self, e: &Explanation) {
        let counts = [
            e.blocked(),
            e.evicting,
            e.retrying,
            e.terminating,
            e.replacing,
        ];
        for (on, n) in WAITING_ON.iter().zip(counts) {
            self.pods_left
                .get_or_create(&label("waiting_on", on))
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.deadline_seconds
            .set(e.deadline_in.map_or(0.0, |d| d.as_secs_f64()));
    }

    /// A pod's budget was shown unable to allow its eviction; `acted`: the deadline policy was
    /// applied to it at once.
    pub fn unsatisfiable(&self, acted: bool) {
        let what = if acted { "acted" } else { "waited" };
        self.budget_unsatisfiable
            .get_or_create(&label("action", what))
            .inc();
    }

    /// The drain ended with `outcome` after `seconds`.
    pub fn ended(&self, outcome: DrainOutcome, seconds: f64) {
        let outcome = match outcome {
            DrainOutcome::Drained => "drained",
            DrainOutcome::Refused => "refused",
            DrainOutcome::DeadlineExceeded => "deadline_exceeded",
            DrainOutcome::BudgetUnsatisfiable => "budget_unsatisfiable",
            DrainOutcome::Cancelled => "cancelled",
        };
        self.duration_seconds
            .get_or_create(&label("outcome", outcome))
            .observe(seconds);
    }

    /// The pods of a drain that ended, counted by fate: a pod deleted past its budget never
    /// counts as evicted.
    pub fn pods_ended(&self, report: &super::DrainReport) {
        let counts = [
            report.evicted.len(),
            report.force_deleted.len(),
            report.refused.len(),
            report.left_behind.len(),
        ];
        for (fate, n) in FATES.iter().zip(counts) {
            self.pods
                .get_or_create(&label("fate", fate))
                .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
        }
    }
}

/// A running drain's hold on the gauges; see [`DrainMetrics::started`].
#[derive(Debug)]
pub struct Running<'a>(&'a DrainMetrics);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        for on in WAITING_ON {
            self.0
                .pods_left
                .get_or_create(&label("waiting_on", on))
                .set(0);
        }
        self.0.deadline_seconds.set(0.0);
        self.0.in_progress.set(0);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::encoding::text::encode;

    use super::*;
    use crate::drain::DrainReport;
    use crate::drain::plan::PodRef;

    /// Issue 41: nothing told the pods deleted past their budgets from the evicted ones.
    #[test]
    fn pods_are_counted_by_what_became_of_them() {
        let mut registry = Registry::default();
        let m = DrainMetrics::register(&mut registry);
        let pods = PodRef::defaults;
        m.pods_ended(&DrainReport {
            node: "worker-1".into(),
            outcome: DrainOutcome::DeadlineExceeded,
            evicted: pods(&["a", "b"]),
            skipped: Vec::new(),
            refused: Vec::new(),
            left_behind: pods(&["d"]),
            force_deleted: pods(&["c", "d"]),
            unsatisfiable: Vec::new(),
            eviction_requests: 2,
            stopped: Vec::new(),
            elapsed: Duration::from_secs(1),
        });
        let mut text = String::new();
        encode(&mut text, &registry).expect("encode");
        for line in [
            r#"nodeward_drain_pods_total{fate="evicted"} 2"#,
            r#"nodeward_drain_pods_total{fate="deleted_past_budget"} 2"#,
            r#"nodeward_drain_pods_total{fate="refused"} 0"#,
            r#"nodeward_drain_pods_total{fate="left_behind"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }
}
