//! Per-file fragments: every key optional, merged key by key, then resolved against defaults.

use std::path::PathBuf;

use serde::Deserialize;

use super::Settings;
use super::types::{ConfigDuration, NodeName, OnDeadline, Positive, ShutdownPolicy, Waves};
use crate::gate::{ConditionGate, FileGate, HttpGate, PodGate};

/// Declares a fragment section whose fields are all `Option`, with a `merge` where the later
/// fragment's set fields win.
macro_rules! fragment {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub(crate) struct $name { $($(#[$fm])* pub(crate) $field: Option<$ty>,)* }

        impl $name {
            fn merge(&mut self, later: Self) {
                $(if later.$field.is_some() { self.$field = later.$field; })*
            }
        }
    };
}

/// A whole config file; sections merge key by key.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Fragment {
    /// `[node]`
    node: Option<NodeFragment>,
    /// `[drain]`
    drain: Option<DrainFragment>,
    /// `[agent]`
    agent: Option<AgentFragment>,
    /// `[gates]`
    gates: Option<GatesFragment>,
    /// `[shutdown]`
    shutdown: Option<ShutdownFragment>,
}

fragment!(
    /// `[agent]`
    AgentFragment {
        /// Status file.
        status_file: PathBuf,
        /// Boot deadline.
        boot_deadline: ConfigDuration,
        /// Re-taint when a gate fails after passing.
        retaint_on_gate_failure: bool,
    }
);

fragment!(
    /// `[gates]`
    GatesFragment {
        /// File gates.
        file: Vec<FileGate>,
        /// Pod gates.
        pod: Vec<PodGate>,
        /// Node condition gates.
        node_condition: Vec<ConditionGate>,
        /// HTTP gates.
        http: Vec<HttpGate>,
        /// HTTP probe interval.
        http_interval: ConfigDuration,
        /// HTTP probe timeout.
        http_timeout: ConfigDuration,
    }
);

fragment!(
    /// `[shutdown]`
    ShutdownFragment {
        /// Policy for power-off.
        on_poweroff: ShutdownPolicy,
        /// Policy for reboot.
        on_reboot: ShutdownPolicy,
        /// Policy when logind does not say which.
        on_unknown: ShutdownPolicy,
        /// Margin below logind's cap.
        safety_margin: ConfigDuration,
        /// Cap to configure.
        inhibit_delay_max: ConfigDuration,
        /// Drop-in path.
        logind_dropin: PathBuf,
    }
);

fragment!(
    /// `[node]`
    NodeFragment {
        /// Node name.
        name: NodeName,
        /// Kubeconfig path.
        kubeconfig: PathBuf,
    }
);

fragment!(
    /// `[drain]`
    DrainFragment {
        /// Deadline.
        timeout: ConfigDuration,
        /// Deadline policy.
        on_deadline: OnDeadline,
        /// Evict unmanaged pods.
        force: bool,
        /// Evict emptyDir pods.
        delete_emptydir_data: bool,
        /// Evictions in flight.
        concurrency: Positive,
        /// Exclude from load balancers while draining.
        exclude_from_load_balancers: bool,
        /// Priority waves.
        waves: Waves,
    }
);

impl Fragment {
    /// Merges a later fragment into this one, section by section.
    pub(crate) fn merge(&mut self, later: Fragment) {
        if let Some(b) = later.node {
            self.node.get_or_insert_default().merge(b);
        }
        if let Some(b) = later.drain {
            self.drain.get_or_insert_default().merge(b);
        }
        if let Some(b) = later.agent {
            self.agent.get_or_insert_default().merge(b);
        }
        if let Some(b) = later.gates {
            self.gates.get_or_insert_default().merge(b);
        }
        if let Some(b) = later.shutdown {
            self.shutdown.get_or_insert_default().merge(b);
        }
    }

    /// Fills every unset key from [`Settings::default`].
    pub(crate) fn into_settings(self) -> Settings {
        let d = Settings::default();
        let node = self.node.unwrap_or_default();
        let drain = self.drain.unwrap_or_default();
        let agent = self.agent.unwrap_or_default();
        let gates = self.gates.unwrap_or_default();
        let shutdown = self.shutdown.unwrap_or_default();
        Settings {
            node: super::NodeSettings {
                name: node.name.map(|n| n.0).or(d.node.name),
                kubeconfig: node.kubeconfig.or(d.node.kubeconfig),
            },
            drain: super::DrainSettings {
                timeout: drain.timeout.map_or(d.drain.timeout, |t| t.0),
                on_deadline: drain.on_deadline.unwrap_or(d.drain.on_deadline),
                force: drain.force.unwrap_or(d.drain.force),
                delete_emptydir_data: drain
                    .delete_emptydir_data
                    .unwrap_or(d.drain.delete_emptydir_data),
                concurrency: drain.concurrency.map_or(d.drain.concurrency, |c| c.0),
                exclude_from_load_balancers: drain
                    .exclude_from_load_balancers
                    .unwrap_or(d.drain.exclude_from_load_balancers),
                waves: drain.waves.map_or(d.drain.waves, |w| w.0),
            },
            agent: super::AgentSettings {
                status_file: agent.status_file.unwrap_or(d.agent.status_file),
                boot_deadline: agent.boot_deadline.map_or(d.agent.boot_deadline, |t| t.0),
                retaint_on_gate_failure: agent
                    .retaint_on_gate_failure
                    .unwrap_or(d.agent.retaint_on_gate_failure),
            },
            gates: super::GateSettings {
                file: gates.file.unwrap_or(d.gates.file),
                pod: gates.pod.unwrap_or(d.gates.pod),
                node_condition: gates.node_condition.unwrap_or(d.gates.node_condition),
                http: gates.http.unwrap_or(d.gates.http),
                http_interval: gates.http_interval.map_or(d.gates.http_interval, |t| t.0),
                http_timeout: gates.http_timeout.map_or(d.gates.http_timeout, |t| t.0),
            },
            shutdown: super::ShutdownSettings {
                on_poweroff: shutdown.on_poweroff.unwrap_or(d.shutdown.on_poweroff),
                on_reboot: shutdown.on_reboot.unwrap_or(d.shutdown.on_reboot),
                on_unknown: shutdown.on_unknown.unwrap_or(d.shutdown.on_unknown),
                safety_margin: shutdown
                    .safety_margin
                    .map_or(d.shutdown.safety_margin, |t| t.0),
                inhibit_delay_max: shutdown
                    .inhibit_delay_max
                    .map_or(d.shutdown.inhibit_delay_max, |t| t.0),
                logind_dropin: shutdown.logind_dropin.unwrap_or(d.shutdown.logind_dropin),
            },
        }
    }
}
