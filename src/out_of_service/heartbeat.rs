//! What the controller itself has seen of each node's heartbeat: the witness that a machine is
//! off, timed by the controller's own monotonic clock.
//!
//! A kubelet renews its Lease in `kube-node-lease` every ten seconds (a quarter of its
//! 40 s duration) for as long as it runs. A node whose Lease has not changed, as this controller
//! saw it, for `--out-of-service-after` has no kubelet, whatever its `Ready` condition's
//! timestamps say (they are written by the kubelet or the node lifecycle controller, on their
//! clocks). Nothing here compares another machine's time with ours: a renewal is any change of
//! the Lease's `renewTime` or resourceVersion, and the silence counts from the moment this
//! replica saw the last one, or saw the power-off record first, whichever is later (a kubelet
//! that died before the record says nothing of the containers the power-off still stops). A
//! replica that never saw a node's Lease change counts from its own first list of the Leases.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use tokio::time::Instant;

use super::PowerOff;
use crate::lease::{Observed, observe};

/// The namespace of the kubelets' heartbeat Leases (one per node, named after it).
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// A node's heartbeat Lease as far as its renewals go; both `None` once the Lease is gone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Beat {
    renewed: Option<String>,
    version: Option<String>,
}

impl Beat {
    fn of(lease: &Lease) -> Self {
        Self {
            renewed: lease
                .spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.to_string()),
            version: lease.metadata.resource_version.clone(),
        }
    }
}

/// The power-off record as far as telling one from the next goes: its boot and time.
type RecordKey = (String, String);

/// Per node: when this replica saw its Lease change last and its power-off record first.
#[derive(Debug, Default)]
pub struct Heartbeats {
    /// When the Lease watch first listed: `None` until then, and nothing counts as silent.
    listed: Option<Instant>,
    leases: HashMap<String, Observed<Beat>>,
    records: HashMap<String, Observed<RecordKey>>,
}

impl Heartbeats {
    /// Takes in one event of the watch on [`NODE_LEASE_NAMESPACE`], seen at `now`.
    pub fn seen(&mut self, event: &watcher::Event<Lease>, now: Instant) {
        match event {
            watcher::Event::Init => {}
            watcher::Event::InitApply(l) | watcher::Event::Apply(l) => {
                self.beat(l.metadata.name.as_deref(), Beat::of(l), now);
            }
            // A Lease deleted while its node stays is a change too: the silence starts now.
            watcher::Event::Delete(l) => {
                self.beat(l.metadata.name.as_deref(), Beat::default(), now)
            }
            watcher::Event::InitDone => {
                self.listed.get_or_insert(now);
            }
        }
    }

    fn beat(&mut self, node: Option<&str>, beat: Beat, now: Instant) {
        let Some(node) = node else { return };
        let seen = observe(self.leases.remove(node), &beat, now);
        self.leases.insert(node.to_string(), seen);
    }

    /// The Node `node` is gone: nothing more to remember of it.
    pub fn forget(&mut self, node: &str) {
        self.leases.remove(node);
        self.records.remove(node);
    }

    /// How long `node` has had no heartbeat since its power-off record, as this replica saw it
    /// at `now`: zero for a node without a record and before the Leases were listed.
    pub fn silent_for(&mut self, node: &Node, now: Instant) -> Duration {
        let Some(name) = node.metadata.name.as_deref() else {
            return Duration::ZERO;
        };
        let Some(record) = PowerOff::of(node) else {
            self.records.remove(name);
            return Duration::ZERO;
        };
        let first_seen = observe(self.records.remove(name), &(record.boot_id, record.at), now);
        let record_at = first_seen.at;
        self.records.insert(name.to_string(), first_seen);
        let Some(listed) = self.listed else {
            return Duration::ZERO;
        };
        let lease_at = self.leases.get(name).map_or(listed, |o| o.at);
        now.saturating_duration_since(lease_at.max(record_at))
    }
}
