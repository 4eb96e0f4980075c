//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas of the scaler or of the
//! readiness controller never both act.
//!
//! [`step`] decides purely from the Lease and `now`; [`Elector`] writes with the Lease's
//! resourceVersion, so of two replicas racing for an expired Lease exactly one write succeeds
//! (the other gets 409 Conflict and stays a follower). A holder that stops renewing loses the
//! Lease only after `leaseDurationSeconds`, and a leader stops acting as soon as its own renewal
//! is overdue — before anyone else may take over.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// What to do with the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// No Lease exists: create it, holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Nobody holds it, or the holder let it expire: take it over.
    TakeOver,
    /// Someone else holds a live Lease.
    Follow {
        /// The holder.
        holder: String,
    },
}

/// The parts of a Lease the decision needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseView {
    /// `spec.holderIdentity`.
    pub holder: Option<String>,
    /// `spec.renewTime`.
    pub renewed: Option<Timestamp>,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: Option<i32>,
}

/// Decides the next step for `me` at `now`.
pub fn step(lease: Option<&LeaseView>, me: &str, now: Timestamp) -> Step {
    let Some(l) = lease else { return Step::Create };
    match l.holder.as_deref() {
        Some(h) if h == me => Step::Renew,
        None | Some("") => Step::TakeOver,
        Some(h) => {
            let expired = match (l.renewed, l.duration_seconds) {
                (Some(r), Some(d)) => r
                    .checked_add(jiff::SignedDuration::from_secs(i64::from(d)))
                    .is_ok_and(|until| until < now),
                // A Lease without a renew time or duration can never be proven live.
                _ => true,
            };
            if expired {
                Step::TakeOver
            } else {
                Step::Follow {
                    holder: h.to_string(),
                }
            }
        }
    }
}

fn view(l: &Lease) -> LeaseView {
    let spec = l.spec.clone().unwrap_or_default();
    LeaseView {
        holder: spec.holder_identity,
        renewed: spec.renew_time.map(|t| t.0),
        duration_seconds: spec.lease_duration_seconds,
    }
}

fn micro(now: Timestamp) -> Option<MicroTime> {
    Some(MicroTime(now))
}

/// Runs the election for one identity.
#[derive(Debug)]
pub struct Elector {
    api: Api<Lease>,
    name: String,
    me: String,
    duration: Duration,
}

impl Elector {
    /// An elector for Lease `namespace/name`.
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
        }
    }

    /// One round: returns until when we may act as leader (`None`: we are not leader). The
    /// deadline is measured from before the write, so it is never later than what others see.
    pub async fn try_acquire(&self) -> Option<Instant> {
        let started = Instant::now();
        let now = Timestamp::now();
        let current = match self.api.get_opt(&self.name).await {
            Ok(l) => l,
            Err(e) => {
                warn!(lease = %self.name, error = %e, "cannot read the leader Lease");
                return None;
            }
        };
        let secs = i32::try_from(self.duration.as_secs())
            .unwrap_or(i32::MAX)
            .max(1);
        let decision = step(current.as_ref().map(view).as_ref(), &self.me, now);
        let result = match (&decision, current) {
            (Step::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.me.clone()),
                        lease_duration_seconds: Some(secs),
                        acquire_time: micro(now),
                        renew_time: micro(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api
                    .create(&PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
            (Step::Renew | Step::TakeOver, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_default();
                if decision == Step::TakeOver {
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                    spec.acquire_time = micro(now);
                    spec.holder_identity = Some(self.me.clone());
                }
                spec.renew_time = micro(now);
                spec.lease_duration_seconds = Some(secs);
                // replace carries metadata.resourceVersion: a concurrent writer makes it 409.
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
            (Step::Follow { holder }, _) => {
                debug!(lease = %self.name, holder = %holder, "following");
                return None;
            }
            (_, None) => return None,
        };
        match result {
            Ok(()) => {
                if decision == Step::TakeOver || decision == Step::Create {
                    info!(lease = %self.name, identity = %self.me, "became leader");
                }
                Some(started + self.duration)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                debug!(lease = %self.name, "lost the Lease race");
                None
            }
            Err(e) => {
                warn!(lease = %self.name, error = %e, "cannot write the leader Lease");
                None
            }
        }
    }
}

impl Elector {
    /// Gives the Lease up if we hold it (on shutdown), so a successor need not wait for it to
    /// expire. A failure only means the successor waits; it is logged, not returned.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_default();
        if spec.holder_identity.as_deref() != Some(self.me.as_str()) {
            return;
        }
        spec.holder_identity = None;
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!(lease = %self.name, identity = %self.me, "released the leader Lease"),
            Err(e) => warn!(lease = %self.name, error = %e, "cannot release the leader Lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps() {
        let now: Timestamp = "2026-01-01T00:00:30Z".parse().expect("time");
        let lease = |holder: Option<&str>, renewed: &str, d: i32| LeaseView {
            holder: holder.map(str::to_string),
            renewed: renewed.parse().ok(),
            duration_seconds: Some(d),
        };
        let cases = [
            (None, Step::Create),
            (
                Some(lease(Some("me"), "2026-01-01T00:00:00Z", 15)),
                Step::Renew,
            ),
            (
                Some(lease(None, "2026-01-01T00:00:29Z", 15)),
                Step::TakeOver,
            ),
            (
                Some(lease(Some("other"), "2026-01-01T00:00:20Z", 15)),
                Step::Follow {
                    holder: "other".into(),
                },
            ),
            (
                Some(lease(Some("other"), "2026-01-01T00:00:10Z", 15)),
                Step::TakeOver,
            ),
            (
                Some(lease(Some("other"), "2026-01-01T00:00:15Z", 15)),
                Step::Follow {
                    holder: "other".into(),
                },
            ),
        ];
        for (l, want) in cases {
            assert_eq!(step(l.as_ref(), "me", now), want, "{l:?}");
        }
    }
}
