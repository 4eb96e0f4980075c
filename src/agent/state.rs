//! The agent's state machine, and the pure decision of what to do about the Node.
//!
//! Two explicit enums: [`Phase`] (where the node is in its life) and [`Lock`] (the logind
//! inhibitor lock). Every transition names its event and checks where it starts from, so a
//! drained node can never be uncordoned by a late "gates passed", and a released lock is never
//! released twice. [`reconcile`] turns a snapshot into the actions that bring the Node in line.

use serde::{Deserialize, Serialize};

/// Where the node is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The agent started; its Node is not registered (or not listed) yet.
    Booting,
    /// The Node exists; not every gate passes, so it takes no new workload.
    Gated,
    /// Every gate passed (and reported so); nodeward's cordon is gone.
    Ready,
    /// logind announced a shutdown; the node is being drained (or cordoned).
    Draining,
    /// The drain finished or hit its deadline; the lock is released.
    Drained,
}

/// What moves a [`Phase`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseEvent {
    /// The own Node appeared.
    NodeSeen,
    /// Every gate passes (and the Node was made schedulable).
    GatesPassed,
    /// A gate stopped passing.
    GatesFailed,
    /// `PrepareForShutdown(true)`.
    ShutdownStarted,
    /// The shutdown drain ended.
    DrainEnded,
    /// `PrepareForShutdown(false)`: the shutdown was cancelled.
    ShutdownCancelled,
}

/// A transition that may not happen from where the machine is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {event:?} refused in state {from}")]
pub struct Refused {
    /// Which machine.
    pub what: &'static str,
    /// The state it was in.
    pub from: String,
    /// The event.
    pub event: String,
}

impl Phase {
    /// The phase after `event`, or [`Refused`].
    pub fn on(self, event: PhaseEvent) -> Result<Phase, Refused> {
        use Phase::*;
        use PhaseEvent::*;
        match (self, event) {
            (Booting, NodeSeen) => Ok(Gated),
            (Gated, GatesPassed) => Ok(Ready),
            (Ready, GatesFailed) => Ok(Gated),
            (Booting | Gated | Ready, ShutdownStarted) => Ok(Draining),
            (Draining, DrainEnded) => Ok(Drained),
            (Draining | Drained, ShutdownCancelled) => Ok(Gated),
            (from, event) => Err(Refused {
                what: "phase",
                from: format!("{from:?}"),
                event: format!("{event:?}"),
            }),
        }
    }

    /// Whether gate results act on the Node in this phase (not while shutting down).
    pub fn gates_act(self) -> bool {
        matches!(self, Phase::Booting | Phase::Gated | Phase::Ready)
    }

    /// What a SIGTERM in this phase means, for the journal. It never drains: only logind's
    /// announcement starts a shutdown drain.
    pub fn on_sigterm(self) -> &'static str {
        match self {
            Phase::Booting | Phase::Gated | Phase::Ready => {
                "SIGTERM: the service is stopping, not the machine (a restart, an upgrade, systemctl \
                 stop); releasing the lock without draining"
            }
            Phase::Draining => {
                "SIGTERM: stopped during the shutdown drain (logind's cap on the lock ran out, or \
                 the unit was stopped): the drain is cut short; pods still on the node stop with it"
            }
            Phase::Drained => "SIGTERM: the system is shutting down, after its drain",
        }
    }
}

/// The logind inhibitor lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lock {
    /// Not held (not taken yet, logind unreachable, or the agent is stopping).
    Unheld,
    /// Held: a shutdown waits for the agent.
    Held,
    /// Released for a shutdown in progress; taken again if it is cancelled.
    Released,
}

/// What moves a [`Lock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockEvent {
    /// A lock fd was obtained.
    Taken,
    /// A new fd replaced the held one (logind or the bus restarted).
    Replaced,
    /// Closed so the shutdown proceeds.
    ReleasedForShutdown,
    /// Closed because the agent stops.
    Dropped,
}

impl Lock {
    /// The lock state after `event`, or [`Refused`].
    pub fn on(self, event: LockEvent) -> Result<Lock, Refused> {
        use Lock::*;
        use LockEvent::*;
        match (self, event) {
            (Unheld | Released, Taken) => Ok(Held),
            (Held, Replaced) => Ok(Held),
            (Held, ReleasedForShutdown) => Ok(Released),
            (Held | Released, Dropped) => Ok(Unheld),
            (from, event) => Err(Refused {
                what: "lock",
                from: format!("{from:?}"),
                event: format!("{event:?}"),
            }),
        }
    }
}

/// Who cordoned the Node, as far as the agent's uncordon decision cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CordonView {
    /// Schedulable.
    NotCordoned,
    /// nodeward cordoned it before this boot (a shutdown drain before a reboot).
    OursBeforeBoot,
    /// nodeward cordoned it during this boot: the agent's own shutdown drain (if
    /// `by_this_agent`) or an operator's `nodeward drain`, which stays.
    OursThisBoot {
        /// This agent process did it for a shutdown that was then cancelled.
        by_this_agent: bool,
    },
    /// Someone else (an administrator) cordoned it; theirs to lift.
    Other,
}

/// What [`reconcile`] looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// Current phase.
    pub phase: Phase,
    /// The Node exists.
    pub node_exists: bool,
    /// Every gate passes.
    pub gates_pass: bool,
    /// The boot deadline passed with gates failing.
    pub overdue: bool,
    /// `NodeNotReadyInTime` was reported already.
    pub overdue_reported: bool,
    /// The Node has the startup taint.
    pub has_startup_taint: bool,
    /// Who cordoned it.
    pub cordon: CordonView,
    /// `agent.retaint_on_gate_failure`.
    pub retaint: bool,
    /// The Node's `nodeward.io/Ready` condition says what the gates say.
    pub condition_current: bool,
    /// No gate is "not known yet" (watches listed, files read): only then is the verdict
    /// worth reporting. A restarted agent must not report False while it resyncs, or the
    /// controller would taint a ready node for a moment.
    pub verdict_known: bool,
    /// `agent.startup_taint = "agent"`: the agent changes the startup taint itself (an identity
    /// NodeRestriction does not confine); otherwise the readiness controller does.
    pub untaint_self: bool,
}

/// One thing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Move the phase.
    Transition(PhaseEvent),
    /// Write the gates' verdict as the Node's `nodeward.io/Ready` condition.
    WriteCondition,
    /// Remove `readiness.k8s.io/nodeward:NoSchedule`.
    RemoveStartupTaint,
    /// Put it back.
    AddStartupTaint,
    /// Lift nodeward's cordon (never an administrator's).
    Uncordon,
    /// Record `NodeNotReadyInTime` on the Node and in the status.
    ReportNotReadyInTime,
}

/// The actions that bring the Node in line with the gates, in order.
pub fn reconcile(v: &View) -> Vec<Action> {
    let mut out = Vec::new();
    if !v.phase.gates_act() {
        return out;
    }
    let mut phase = v.phase;
    if phase == Phase::Booting && v.node_exists {
        out.push(Action::Transition(PhaseEvent::NodeSeen));
        phase = Phase::Gated;
    }
    if v.overdue && !v.overdue_reported && phase != Phase::Ready {
        out.push(Action::ReportNotReadyInTime);
    }
    if !v.node_exists {
        return out;
    }
    if !v.condition_current && (v.verdict_known || v.overdue) {
        out.push(Action::WriteCondition);
    }
    let tainted = v.untaint_self && v.has_startup_taint;
    match (phase, v.gates_pass) {
        (Phase::Gated, true) => {
            if tainted {
                out.push(Action::RemoveStartupTaint);
            }
            let ours = matches!(
                v.cordon,
                CordonView::OursBeforeBoot
                    | CordonView::OursThisBoot {
                        by_this_agent: true
                    }
            );
            if ours {
                out.push(Action::Uncordon);
            }
            out.push(Action::Transition(PhaseEvent::GatesPassed));
        }
        (Phase::Ready, true) if tainted => out.push(Action::RemoveStartupTaint),
        (Phase::Ready, false) => {
            if v.untaint_self && v.retaint && !v.has_startup_taint {
                out.push(Action::AddStartupTaint);
            }
            out.push(Action::Transition(PhaseEvent::GatesFailed));
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests;
