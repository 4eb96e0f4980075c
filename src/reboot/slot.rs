//! A reboot slot: a ConfigMap `nodeward-reboot-N` that a node holds in its own name, with a
//! Lease's fields in its data (`holderIdentity`, `renewTime`, `leaseDurationSeconds`,
//! `acquireTime`, `leaseTransitions`) and a Lease's rules: [`crate::lease::step`] decides, and a
//! silent holder's expiry is judged by our own clock since the record last changed
//! ([`crate::lease::observe`]); every write carries the resourceVersion read, so of two nodes
//! racing for one free slot exactly one wins.
//!
//! Why not a `coordination.k8s.io` Lease: the NodeRestriction admission plugin lets a kubelet
//! identity (`system:node:NAME`, the agent's by default) write no Lease but its own heartbeat in
//! `kube-node-lease` ("can only access leases in the kube-node-lease system namespace", from
//! kube-apiserver in `tests/reboot_real.rs`). ConfigMaps it leaves to RBAC, and the shipped
//! ValidatingAdmissionPolicy confines a node to slots in its own name.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::lease::{LeaseView, Observed, Step, step_observed};

const HOLDER: &str = "holderIdentity";
const RENEWED: &str = "renewTime";
const DURATION: &str = "leaseDurationSeconds";
const ACQUIRED: &str = "acquireTime";
const TRANSITIONS: &str = "leaseTransitions";

/// The Lease fields of a slot's data.
pub fn view(cm: &ConfigMap) -> LeaseView {
    let data = cm.data.clone().unwrap_or_default();
    LeaseView {
        holder: data.get(HOLDER).filter(|h| !h.is_empty()).cloned(),
        renewed: data.get(RENEWED).and_then(|t| t.parse().ok()),
        duration_seconds: data.get(DURATION).and_then(|d| d.parse().ok()),
        transitions: data.get(TRANSITIONS).and_then(|t| t.parse().ok()),
    }
}

/// One slot, as this node sees it.
#[derive(Debug)]
pub struct Slot {
    api: Api<ConfigMap>,
    name: String,
    me: String,
    duration: Duration,
    observed: tokio::sync::Mutex<Option<Observed>>,
}

impl Slot {
    /// Slot `name` in `namespace`, for node `me`, held for `duration` per renewal.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        me: &str,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            me: me.to_string(),
            duration,
            observed: tokio::sync::Mutex::new(None),
        }
    }

    /// The slot's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads the slot and what taking it would mean now; `None`: it cannot be read.
    async fn read(&self) -> Option<(Option<ConfigMap>, Step)> {
        let current = match self.api.get_opt(&self.name).await {
            Ok(c) => c,
            Err(e) => {
                warn!(slot = %self.name, error = %e, "cannot read the reboot slot");
                return None;
            }
        };
        let now = Instant::now();
        let mut observed = self.observed.lock().await;
        let record = current.as_ref().map(view);
        let s = step_observed(&mut observed, record.as_ref(), &self.me, now);
        Some((current, s))
    }

    /// What [`Slot::try_acquire`] would do now, writing nothing.
    pub async fn peek(&self) -> Option<Step> {
        self.read().await.map(|(_, s)| s)
    }

    /// Takes the slot (free, or its holder's record unchanged for its duration) or renews it
    /// when ours; `true` when this node holds it now.
    pub async fn try_acquire(&self) -> bool {
        let Some((current, s)) = self.read().await else {
            return false;
        };
        let now = Timestamp::now().to_string();
        let secs = self.duration.as_secs().max(1).to_string();
        let written = match (&s, current) {
            (Step::Create, _) => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    data: Some(BTreeMap::from([
                        (HOLDER.into(), self.me.clone()),
                        (RENEWED.into(), now.clone()),
                        (ACQUIRED.into(), now),
                        (DURATION.into(), secs),
                        (TRANSITIONS.into(), "0".into()),
                    ])),
                    ..ConfigMap::default()
                };
                self.api.create(&PostParams::default(), &cm).await
            }
            (Step::Renew | Step::TakeOver, Some(mut cm)) => {
                let data = cm.data.get_or_insert_default();
                if s == Step::TakeOver {
                    let t: i64 = data
                        .get(TRANSITIONS)
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(0);
                    data.insert(TRANSITIONS.into(), (t + 1).to_string());
                    data.insert(ACQUIRED.into(), now.clone());
                    data.insert(HOLDER.into(), self.me.clone());
                }
                data.insert(RENEWED.into(), now);
                data.insert(DURATION.into(), secs);
                self.api
                    .replace(&self.name, &PostParams::default(), &cm)
                    .await
            }
            _ => return false,
        };
        match written {
            Ok(_) => {
                if s != Step::Renew {
                    info!(slot = %self.name, node = %self.me, "took the reboot slot");
                }
                true
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                debug!(slot = %self.name, "another node took the slot first");
                false
            }
            Err(e) => {
                warn!(slot = %self.name, error = %e, "cannot write the reboot slot");
                false
            }
        }
    }

    /// Gives the slot back (holder cleared), if this node holds it.
    pub async fn release(&self) {
        let Ok(Some(mut cm)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let data = cm.data.get_or_insert_default();
        if data.get(HOLDER) != Some(&self.me) {
            return;
        }
        data.insert(HOLDER.into(), String::new());
        match self
            .api
            .replace(&self.name, &PostParams::default(), &cm)
            .await
        {
            Ok(_) => info!(slot = %self.name, node = %self.me, "gave the reboot slot back"),
            Err(e) => warn!(slot = %self.name, error = %e, "cannot give the reboot slot back"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::step;

    #[test]
    fn a_slots_data_reads_as_a_lease() {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nodeward-reboot-0"},
            "data": {"holderIdentity": "n1", "renewTime": "2026-11-28T08:00:00Z",
                     "leaseDurationSeconds": "600", "leaseTransitions": "3"}
        }))
        .unwrap();
        let v = view(&cm);
        assert_eq!(v.holder.as_deref(), Some("n1"));
        assert_eq!(v.duration_seconds, Some(600));
        assert_eq!(v.transitions, Some(3));
        let released: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nodeward-reboot-0"}, "data": {"holderIdentity": ""}
        }))
        .unwrap();
        assert_eq!(
            view(&released).holder,
            None,
            "an empty holder is a free slot"
        );
        assert_eq!(
            step(Some(&view(&released)), "n2", Instant::now(), Instant::now()),
            Step::TakeOver
        );
    }
}
