//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas of the scaler or of the
//! readiness controller never both act.
//!
//! [`step`] decides purely from the Lease, our own observation of it and `now`; [`Elector`]
//! writes with the Lease's resourceVersion, so of two replicas racing for an expired Lease
//! exactly one write succeeds (the other gets 409 Conflict and stays a follower). A holder that
//! stops renewing loses the Lease only after `leaseDurationSeconds`, and a leader stops acting as
//! soon as its own renewal is overdue — before anyone else may take over.
//!
//! Expiry is judged as client-go's leader election judges it: by *our own* monotonic clock since
//! we last saw the Lease record change (holder, renew time, transitions, duration), never by
//! comparing the holder's `renewTime` with our wall clock. A holder whose clock runs behind ours
//! therefore keeps its Lease as long as it keeps renewing, and one whose clock runs ahead cannot
//! keep it by writing future times: only a change we observe counts.
//!
//! Before an irreversible act (deleting a machine) the holder calls [`Elector::confirm`]: it
//! re-reads the Lease and proceeds only if it still names us *and* its resourceVersion is the one
//! our own last write produced, so a Lease taken over (or merely touched) by anyone else since
//! fences the act off even while our local deadline has not run out.
//!
//! Why not a crate: kube-lease-manager 0.13 and kube-leader-election 0.44 (the two kept ones
//! when this was written) both judge expiry by comparing the holder's `renewTime` with the local
//! clock, the skew this module avoids, and neither offers the resourceVersion fence; the latter
//! also needs kube 4.

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
    /// `spec.leaseTransitions`.
    pub transitions: Option<i32>,
}

/// [`step`] on `lease` as read at `now`, with `observed` moved on ([`observe`]; forgotten when
/// there is no Lease): what a reader of a Lease record does on each read.
pub fn step_observed(
    observed: &mut Option<Observed>,
    lease: Option<&LeaseView>,
    me: &str,
    now: Instant,
) -> Step {
    let at = match lease {
        Some(l) => {
            let o = observe(observed.take(), l, now);
            let at = o.at;
            *observed = Some(o);
            at
        }
        None => {
            *observed = None;
            now
        }
    };
    step(lease, me, at, now)
}

/// When we last saw a record change, by our own clock: a Lease's [`LeaseView`] here and for the
/// reboot slots, a node's heartbeat for the out-of-service taint ([`crate::out_of_service`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed<T = LeaseView> {
    /// The record as we last read it.
    pub record: T,
    /// When we first read it in that form.
    pub at: Instant,
}

/// The observation after reading `current` at `now`: the clock restarts only when the record
/// differs from the one observed before (or there was none).
pub fn observe<T: PartialEq + Clone>(
    prev: Option<Observed<T>>,
    current: &T,
    now: Instant,
) -> Observed<T> {
    match prev {
        Some(p) if p.record == *current => p,
        _ => Observed {
            record: current.clone(),
            at: now,
        },
    }
}

/// Decides the next step for `me` at `now` (our monotonic clock), given when we observed the
/// Lease's current record first.
pub fn step(lease: Option<&LeaseView>, me: &str, observed_at: Instant, now: Instant) -> Step {
    let Some(l) = lease else { return Step::Create };
    match l.holder.as_deref() {
        Some(h) if h == me => Step::Renew,
        None | Some("") => Step::TakeOver,
        Some(h) => {
            let expired = match l.duration_seconds {
                Some(d) if d > 0 => {
                    let d = Duration::from_secs(u64::from(d.unsigned_abs()));
                    observed_at.checked_add(d).is_none_or(|until| until <= now)
                }
                // A Lease without a duration can never be proven live.
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

/// Why [`Elector::confirm`] refused: the act must not happen.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// We are not the leader (never were, or lost it at the last renewal).
    #[error("this replica does not hold the Lease")]
    NotLeader,
    /// Our own deadline is about to pass: others may take the Lease soon.
    #[error("this replica's hold on the Lease is about to expire")]
    Expiring,
    /// The Lease changed since our last write: someone else wrote it.
    #[error("the Lease changed since this replica last renewed it (holder now {holder:?})")]
    Superseded {
        /// The holder the Lease names now.
        holder: Option<String>,
    },
    /// The Lease is gone.
    #[error("the Lease no longer exists")]
    Gone,
    /// The Lease could not be read.
    #[error("cannot read the Lease: {0}")]
    Read(#[source] kube::Error),
}

fn view(l: &Lease) -> LeaseView {
    let spec = l.spec.clone().unwrap_or_default();
    LeaseView {
        holder: spec.holder_identity,
        renewed: spec.renew_time.map(|t| t.0),
        duration_seconds: spec.lease_duration_seconds,
        transitions: spec.lease_transitions,
    }
}

fn micro(now: Timestamp) -> Option<MicroTime> {
    Some(MicroTime(now))
}

/// What an [`Elector`] remembers between rounds.
#[derive(Debug, Default)]
struct State {
    /// Our observation of the Lease record (for expiry).
    observed: Option<Observed>,
    /// The resourceVersion our last successful write produced, while we hold the Lease.
    written: Option<String>,
    /// Until when we may act, while we hold the Lease.
    until: Option<Instant>,
}

/// Runs the election for one identity.
#[derive(Debug)]
pub struct Elector {
    api: Api<Lease>,
    name: String,
    me: String,
    duration: Duration,
    /// Held across each round's read and write, so a renewal and a [`Elector::confirm`] never
    /// interleave.
    state: tokio::sync::Mutex<State>,
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
            state: tokio::sync::Mutex::new(State::default()),
        }
    }

    /// One round: returns until when we may act as leader (`None`: we are not leader). The
    /// deadline is measured from before the write, so it is never later than what others see.
    pub async fn try_acquire(&self) -> Option<Instant> {
        let mut state = self.state.lock().await;
        let until = self.round(&mut state).await;
        state.until = until;
        if until.is_none() {
            state.written = None;
        }
        until
    }

    async fn round(&self, state: &mut State) -> Option<Instant> {
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
        let read_at = Instant::now();
        let record = current.as_ref().map(view);
        let decision = step_observed(&mut state.observed, record.as_ref(), &self.me, read_at);
        let result = self.write(&decision, current, now, secs).await?;
        match result {
            Ok(written) => {
                if decision == Step::TakeOver || decision == Step::Create {
                    info!(lease = %self.name, identity = %self.me, "became leader");
                }
                state.written = written.metadata.resource_version;
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

    /// The write a step asks for: a new Lease, or ours renewed or taken over (guarded by the
    /// resourceVersion read); `None` when the step writes nothing.
    async fn write(
        &self,
        decision: &Step,
        current: Option<Lease>,
        now: Timestamp,
        secs: i32,
    ) -> Option<kube::Result<Lease>> {
        match (decision, current) {
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
                Some(self.api.create(&PostParams::default(), &lease).await)
            }
            (Step::Renew | Step::TakeOver, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_default();
                if *decision == Step::TakeOver {
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                    spec.acquire_time = micro(now);
                    spec.holder_identity = Some(self.me.clone());
                }
                spec.renew_time = micro(now);
                spec.lease_duration_seconds = Some(secs);
                // replace carries metadata.resourceVersion: a concurrent writer makes it 409.
                Some(
                    self.api
                        .replace(&self.name, &PostParams::default(), &lease)
                        .await,
                )
            }
            (Step::Follow { holder }, _) => {
                debug!(lease = %self.name, holder = %holder, "following");
                None
            }
            (_, None) => None,
        }
    }

    /// Fences an irreversible act: `Ok` only if we hold the Lease with more than a tenth of its
    /// duration left by our own clock, and the Lease as it is now still names us with the
    /// resourceVersion of our own last write. Call it immediately before the act.
    pub async fn confirm(&self) -> Result<(), FenceError> {
        let state = self.state.lock().await;
        let until = state.until.ok_or(FenceError::NotLeader)?;
        if until <= Instant::now() + self.duration / 10 {
            return Err(FenceError::Expiring);
        }
        let lease = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(FenceError::Read)?
            .ok_or(FenceError::Gone)?;
        let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
        let current = lease.metadata.resource_version.is_some()
            && lease.metadata.resource_version == state.written;
        if holder.as_deref() == Some(self.me.as_str()) && current {
            Ok(())
        } else {
            Err(FenceError::Superseded { holder })
        }
    }
}

impl Elector {
    /// Gives the Lease up if we hold it (on shutdown), so a successor need not wait for it to
    /// expire. A failure only means the successor waits; it is logged, not returned.
    pub async fn release(&self) {
        let mut state = self.state.lock().await;
        state.until = None;
        state.written = None;
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

    fn lease(holder: Option<&str>, renewed: &str, d: i32) -> LeaseView {
        LeaseView {
            holder: holder.map(str::to_string),
            renewed: renewed.parse().ok(),
            duration_seconds: Some(d),
            transitions: Some(0),
        }
    }

    #[test]
    fn steps() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // (lease, seconds since we first saw its current record, want)
        let cases = [
            (None, 0, Step::Create),
            (
                Some(lease(Some("me"), "2026-01-01T00:00:00Z", 15)),
                60,
                Step::Renew,
            ),
            (
                Some(lease(None, "2026-01-01T00:00:29Z", 15)),
                0,
                Step::TakeOver,
            ),
            (
                Some(lease(Some("other"), "2026-01-01T00:00:20Z", 15)),
                10,
                Step::Follow {
                    holder: "other".into(),
                },
            ),
            (
                Some(lease(Some("other"), "2026-01-01T00:00:20Z", 15)),
                15,
                Step::TakeOver,
            ),
            (
                Some(LeaseView {
                    duration_seconds: None,
                    ..lease(Some("other"), "2026-01-01T00:00:20Z", 15)
                }),
                0,
                Step::TakeOver,
            ),
        ];
        for (l, since, want) in cases {
            assert_eq!(step(l.as_ref(), "me", t0, t0 + s(since)), want, "{l:?}");
        }
    }

    /// The holder's clock does not matter, only whether its record changes under our eyes.
    #[test]
    fn expiry_is_judged_by_our_own_observation_not_the_holders_clock() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // A holder whose clock runs an hour behind ours, renewing every 5 s: under the old rule
        // (renewTime + duration < our wall clock) it looked expired at every read and two
        // replicas acted at once. Its record changes at each read, so it stays live.
        let mut obs = None;
        for (i, renewed) in [
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:05Z",
            "2026-01-01T00:00:10Z",
        ]
        .into_iter()
        .enumerate()
        {
            let now = t0 + s(5 * i as u64);
            let l = lease(Some("behind"), renewed, 15);
            let o = observe(obs.take(), &l, now);
            assert_eq!(o.at, now, "a changed record restarts the clock");
            assert_eq!(
                step(Some(&l), "me", o.at, now + s(14)),
                Step::Follow {
                    holder: "behind".into()
                },
                "renewed at {renewed}"
            );
            obs = Some(o);
        }
        // A holder whose clock runs an hour ahead and then dies: its renewTime stays in our
        // future, which the old rule took as live for an hour. Unchanged for the Lease's
        // duration by our clock, it is expired.
        let ahead = lease(Some("ahead"), "2099-01-01T00:00:00Z", 15);
        let first = observe(None, &ahead, t0);
        let later = observe(Some(first.clone()), &ahead, t0 + s(10));
        assert_eq!(later.at, t0, "an unchanged record keeps the first sight");
        assert_eq!(
            step(Some(&ahead), "me", later.at, t0 + s(14)),
            Step::Follow {
                holder: "ahead".into()
            }
        );
        assert_eq!(
            step(Some(&ahead), "me", later.at, t0 + s(15)),
            Step::TakeOver
        );
        // A takeover by a third replica (holder and transitions change) restarts the clock.
        let taken = LeaseView {
            holder: Some("third".into()),
            transitions: Some(1),
            ..ahead
        };
        let o = observe(Some(later), &taken, t0 + s(15));
        assert_eq!(o.at, t0 + s(15));
        assert_eq!(
            step(Some(&taken), "me", o.at, t0 + s(16)),
            Step::Follow {
                holder: "third".into()
            }
        );
    }
}
