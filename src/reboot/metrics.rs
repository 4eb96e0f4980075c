//! `nodeward_reboot_*`: the coordinated reboot's figures, on the agent's `/metrics`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A phase label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// `idle`, `waiting`, `draining`, `rebooting`, `settling`.
    pub phase: String,
}

/// A result label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `done`, `drain-failed`, `reboot-failed`, `abandoned`.
    pub result: String,
}

/// The figures.
#[derive(Debug, Default)]
pub struct RebootMetrics {
    /// 1 while a reboot is asked for (sentinel, command or `nodeward reboot`) and not done.
    pub requested: Gauge,
    /// When the pending request was first seen (Unix seconds; 0: none).
    pub requested_since: Gauge<f64, AtomicU64>,
    /// 1 for the phase the node is in.
    pub phase: Family<PhaseLabel, Gauge>,
    /// Reboots ended, by result.
    pub ended: Family<ResultLabel, Counter>,
    /// Seconds the last reboot took from slot taken to slot given back.
    pub last_duration_seconds: Gauge<f64, AtomicU64>,
}

/// The results a reboot ends with.
pub const RESULTS: [&str; 4] = ["done", "drain-failed", "reboot-failed", "abandoned"];

/// The phases, for [`RebootMetrics::set_phase`].
pub const PHASES: [&str; 5] = ["idle", "waiting", "draining", "rebooting", "settling"];

impl RebootMetrics {
    /// Registers under `nodeward_reboot_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("nodeward_reboot");
        r.register(
            "requested",
            "1 while a reboot is asked for on this node (sentinel file, sentinel command or nodeward reboot) and not yet done",
            m.requested.clone(),
        );
        r.register(
            "requested_since_seconds",
            "When the pending reboot request was first seen, as Unix time (0: none)",
            m.requested_since.clone(),
        );
        r.register(
            "phase",
            "1 for the coordinated reboot phase this node is in (idle, waiting, draining, rebooting, settling)",
            m.phase.clone(),
        );
        r.register(
            "ended",
            "Coordinated reboots ended, by result (done, drain-failed, reboot-failed, abandoned)",
            m.ended.clone(),
        );
        r.register(
            "last_duration_seconds",
            "Seconds the last coordinated reboot took, from taking its slot to giving it back",
            m.last_duration_seconds.clone(),
        );
        m.set_phase("idle");
        // Every result from 0, so the first reboot's increase() is seen (a done reboot is
        // counted by the agent that starts after it, in a new process).
        for result in RESULTS {
            let _ = m.ended.get_or_create(&ResultLabel {
                result: result.into(),
            });
        }
        m
    }

    /// Sets `phase` to 1 and every other to 0.
    pub fn set_phase(&self, phase: &str) {
        for p in PHASES {
            self.phase
                .get_or_create(&PhaseLabel { phase: p.into() })
                .set(i64::from(p == phase));
        }
    }

    /// Counts a reboot ended with `result`.
    pub fn ended(&self, result: &str) {
        self.ended
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }
}
