//! Per-file fragments: every key optional, merged key by key, then resolved against defaults.

use std::path::PathBuf;

use serde::Deserialize;

use super::Settings;
use super::types::{ConfigDuration, NodeName, OnDeadline, Positive, Waves};

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
}

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
    }

    /// Fills every unset key from [`Settings::default`].
    pub(crate) fn into_settings(self) -> Settings {
        let d = Settings::default();
        let node = self.node.unwrap_or_default();
        let drain = self.drain.unwrap_or_default();
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
        }
    }
}
