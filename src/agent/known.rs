//! What the agent knows, and the pure decisions on it: the [`View`] the state machine reads, the
//! gates' verdict, whether READY is due, and the status line and file. Each takes the time and
//! whatever else comes from outside (the Node's name, the settings, the API server's situation)
//! as arguments, so it is a function of a snapshot and `now` that a test can call without a bus,
//! an API server or a clock.

use super::*;

impl Known {
    /// Nothing known yet at `started` but the gates to decide (all not known yet).
    pub(super) fn new(gates: GateSet, started: Instant) -> Self {
        let verdict = crate::gate::evaluate(
            &Facts::default(),
            &gates,
            started.into_std(),
            started.into_std(),
        );
        Self {
            gates,
            phase: Phase::Booting,
            lock: Lock::Unheld,
            lock_takes: 0,
            cap: None,
            facts: Facts::default(),
            verdict,
            node_obj: None,
            node_watch: Mirror::default(),
            node_echo_rv: None,
            pods: Mirror::default(),
            started,
            overdue_reported: false,
            own_cordon: false,
            shutdown_started: None,
            last_drain: None,
            warnings: Vec::new(),
            notified_ready: false,
        }
    }

    /// Takes in an event of the watch on the Node `node`.
    pub(super) fn apply_node(&mut self, node: &str, ev: watcher::Event<Node>) {
        self.node_watch.apply(&ev);
        match &ev {
            watcher::Event::Apply(n) => {
                // Until the echo of the agent's own last write arrives, the watch only replays
                // versions older than the one the agent already holds.
                if let Some(rv) = &self.node_echo_rv
                    && n.metadata.resource_version.as_ref() != Some(rv)
                {
                    return;
                }
            }
            watcher::Event::Delete(_) | watcher::Event::InitDone => {}
            // A relist in progress changes nothing until it is done.
            watcher::Event::Init | watcher::Event::InitApply(_) => return,
        }
        self.node_echo_rv = None;
        self.node_obj = self
            .node_watch
            .get(node, None)
            .map(std::sync::Arc::unwrap_or_clone);
    }

    /// The agent wrote the Node and holds the API server's answer `n`, fresher than the watch's
    /// copy. With `echo` (the write changed something), the watch will deliver `n`'s version
    /// too; until it does, what it delivers is older and ignored.
    pub(super) fn wrote_node(&mut self, n: Node, echo: bool) {
        if echo {
            self.node_echo_rv = n.metadata.resource_version.clone();
        }
        self.node_obj = Some(n);
    }

    /// The lock is wanted unless a shutdown is under way.
    pub(super) fn wants_lock(&self) -> bool {
        !matches!(self.phase, Phase::Draining | Phase::Drained)
    }

    /// Moves the phase of `node` on `ev`; false (and logged) when the machine refuses it.
    pub(super) fn phase_to(&mut self, node: &str, ev: PhaseEvent) -> bool {
        match self.phase.on(ev) {
            Ok(p) => {
                info!(node = %node, from = ?self.phase, to = ?p, event = ?ev, "phase");
                self.phase = p;
                true
            }
            Err(r) => {
                warn!(node = %node, refused = %r, "transition refused");
                false
            }
        }
    }

    /// Moves the lock's state on `ev`; a refused move is logged and changes nothing.
    pub(super) fn lock_to(&mut self, ev: LockEvent) {
        match self.lock.on(ev) {
            Ok(l) => self.lock = l,
            Err(r) => warn!(refused = %r, "lock transition refused"),
        }
    }

    /// What [`state::reconcile`] decides on, under `settings`, with this boot's start on the
    /// wall clock `boot` (for whose cordon it is).
    pub(super) fn view(
        &self,
        settings: &crate::config::AgentSettings,
        boot: Option<jiff::Timestamp>,
    ) -> View {
        let n = self.node_obj.as_ref();
        View {
            phase: self.phase,
            node_exists: n.is_some(),
            gates_pass: self.verdict.all_pass,
            overdue: self.verdict.overdue,
            overdue_reported: self.overdue_reported,
            has_startup_taint: n.is_some_and(readiness::has_startup_taint),
            cordon: n.map_or(state::CordonView::NotCordoned, |n| {
                node::cordon_view(n, boot, self.own_cordon)
            }),
            retaint: settings.retaint_on_gate_failure,
            condition_current: n.is_some_and(|n| {
                readiness::condition_is_current(n, &readiness::desired_condition(&self.verdict))
            }),
            verdict_known: self
                .verdict
                .gates
                .iter()
                .all(|g| g.state != crate::gate::GateState::Unknown),
            untaint_self: settings.startup_taint == TaintOwner::Agent,
        }
    }

    /// The gates' verdict at `now` from the facts (the Node and pod facts only from synced
    /// watches).
    pub(super) fn evaluate_gates(&mut self, now: Instant) {
        self.facts.node_conditions = if self.node_watch.synced() {
            self.node_obj.as_ref().map(gwatch::node_conditions)
        } else {
            None
        };
        self.facts.pods = self.pods.synced().then(|| {
            self.pods
                .state()
                .iter()
                .map(|p| gwatch::pod_fact(p))
                .collect()
        });
        let verdict = crate::gate::evaluate(
            &self.facts,
            &self.gates,
            self.started.into_std(),
            now.into_std(),
        );
        if verdict.gates != self.verdict.gates {
            for g in &verdict.gates {
                tracing::debug!(gate = %g.gate, state = ?g.state, reason = %g.reason, "gate");
            }
        }
        self.verdict = verdict;
    }

    /// Both watches (the Node's and the pods') have listed.
    pub(super) fn watches_up(&self) -> bool {
        self.node_watch.synced() && self.pods.synced()
    }

    /// Whether to tell systemd READY at `now`: not told yet, the lock held, and the watches up
    /// — or not waited for: the API server is out of reach (`api_out`: no client, or its last
    /// call failed), or [`READY_WITHOUT_API_AFTER`] has passed since the start.
    pub(super) fn ready_due(&self, api_out: bool, now: Instant) -> bool {
        !self.notified_ready
            && self.lock == Lock::Held
            && (self.watches_up()
                || api_out
                || now.saturating_duration_since(self.started) >= READY_WITHOUT_API_AFTER)
    }

    /// What the agent for `node` waits for, as systemd's STATUS= says it; `api_blocked` is what
    /// keeps it from the API server, if anything ([`ApiLink::blocked`]).
    pub(super) fn waiting_for(&self, node: &str, api_blocked: Option<String>) -> String {
        match self.phase {
            Phase::Draining => return "draining the node before shutdown".into(),
            Phase::Drained => {
                return "drained; shutdown lock released, waiting for the shutdown".into();
            }
            _ => {}
        }
        let lock = if self.lock == Lock::Held {
            "holding the shutdown lock"
        } else {
            "waiting for logind to take the shutdown lock"
        };
        let what = api_blocked.unwrap_or_else(|| match self.phase {
            Phase::Booting => format!("waiting for node {node} to register"),
            Phase::Gated => {
                format!("waiting for gates: {}", self.verdict.failing().join("; "))
            }
            _ => match self.node_obj.as_ref().and_then(node::cordon_owner) {
                Some(who) => format!("gates pass; node cordoned by {who}"),
                None => "node schedulable".into(),
            },
        });
        format!("{what}; {lock}")
    }

    /// The status file's content for the agent `pid` of `node`, whose STATUS= is `line`, with
    /// the running drain's word on what it waits on.
    pub(super) fn status(
        &self,
        pid: u32,
        node: &str,
        line: String,
        draining: Option<crate::drain::explain::Progress>,
    ) -> Status {
        let n = self.node_obj.as_ref();
        Status {
            pid,
            node: node.to_string(),
            phase: self.phase,
            lock: self.lock,
            lock_takes: self.lock_takes,
            inhibit_delay_max_ms: self.cap.map(millis),
            waiting_for: line,
            ready: self.notified_ready,
            node_registered: n.is_some(),
            gates: self.verdict.gates.clone(),
            not_ready_in_time: self.overdue_reported,
            startup_taint: n.is_some_and(readiness::has_startup_taint),
            cordoned_by: n.and_then(node::cordon_owner),
            last_drain: self.last_drain.clone(),
            draining,
            warnings: self.warnings_now(),
        }
    }

    /// What an operator should fix: logind's cap as last read, and kubelet's locks as last listed.
    pub(super) fn warnings_now(&self) -> Vec<String> {
        let kubelet = self.facts.kubelet_shutdown_locks.iter().flatten().map(|pid| {
            format!(
                "kubelet holds a shutdown delay lock (pid {pid}): its graceful node shutdown kills pods without the Eviction API and races with nodeward's drain; set shutdownGracePeriod: 0s in the kubelet config"
            )
        });
        self.warnings.iter().cloned().chain(kubelet).collect()
    }
}
