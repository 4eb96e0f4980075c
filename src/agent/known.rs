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
            userspace_since_boot: Duration::ZERO,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::{ConditionGate, Expect, Gate, GateState};
    use serde_json::json;

    const NODE: &str = "n1";

    /// What every agent decides: the drain's access and kubelet's lock, nothing known yet.
    fn known() -> Known {
        let gates = GateSet {
            gates: vec![Gate::DrainAccess, Gate::KubeletShutdownOff],
            boot_deadline: Duration::from_secs(60),
        };
        Known::new(gates, Instant::now())
    }

    /// The own Node at resourceVersion `rv`.
    fn node(rv: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": NODE, "resourceVersion": rv}}))
            .expect("node")
    }

    /// The resourceVersion of the Node as the agent acts on it.
    fn acted_on(k: &Known) -> Option<&str> {
        k.node_obj
            .as_ref()
            .and_then(|n| n.metadata.resource_version.as_deref())
    }

    /// Both gates answered: the drain's access as `access`, kubelet without a lock.
    fn answer(k: &mut Known, access: Access) {
        k.facts.drain_access = Some(access);
        k.facts.kubelet_shutdown_locks = Some(Vec::new());
        k.evaluate_gates(k.started);
    }

    #[test]
    fn the_line_says_what_the_agent_waits_for_in_each_phase() {
        let mut k = known();
        assert_eq!(
            k.waiting_for(NODE, None),
            "waiting for node n1 to register; waiting for logind to take the shutdown lock"
        );
        k.lock_to(LockEvent::Taken);
        assert_eq!(
            k.waiting_for(NODE, None),
            "waiting for node n1 to register; holding the shutdown lock"
        );

        assert!(k.phase_to(NODE, PhaseEvent::NodeSeen));
        answer(&mut k, Access::Denied(vec!["create pods/eviction".into()]));
        let gated = k.waiting_for(NODE, None);
        assert!(
            gated.starts_with("waiting for gates: drain access (the drain would be refused"),
            "{gated}"
        );
        assert!(gated.contains("cannot create pods/eviction"), "{gated}");
        assert!(
            !gated.contains("kubelet"),
            "a passing gate is not listed: {gated}"
        );
        assert!(gated.ends_with("; holding the shutdown lock"), "{gated}");

        answer(&mut k, Access::Granted);
        assert!(k.phase_to(NODE, PhaseEvent::GatesPassed));
        assert_eq!(
            k.waiting_for(NODE, None),
            "node schedulable; holding the shutdown lock"
        );
        let cordoned = json!({"metadata": {"name": NODE}, "spec": {"unschedulable": true}});
        k.wrote_node(serde_json::from_value(cordoned).expect("node"), false);
        assert_eq!(
            k.waiting_for(NODE, None),
            "gates pass; node cordoned by someone else; holding the shutdown lock"
        );

        // A shutdown is said as such, whatever keeps the agent from the API server.
        let blocked = Some("API server unreachable: connection refused".to_string());
        assert!(k.phase_to(NODE, PhaseEvent::ShutdownStarted));
        assert_eq!(
            k.waiting_for(NODE, blocked.clone()),
            "draining the node before shutdown"
        );
        k.lock_to(LockEvent::ReleasedForShutdown);
        assert!(k.phase_to(NODE, PhaseEvent::DrainEnded));
        assert_eq!(
            k.waiting_for(NODE, blocked),
            "drained; shutdown lock released, waiting for the shutdown"
        );
    }

    /// The line as the agent makes it: what keeps it from the API server comes before the
    /// phase's own words, until a shutdown.
    #[test]
    fn the_line_names_the_missing_kubeconfig_and_the_unreachable_api_server() {
        let mut k = known();
        let mut api = ApiLink::new(None, Some(PathBuf::from("/etc/kubernetes/kubelet.conf")));
        api.kubeconfig_state = Some(KubeconfigState::Missing);
        assert_eq!(
            k.waiting_for(NODE, api.blocked()),
            "waiting for /etc/kubernetes/kubelet.conf (kubeadm join writes it); waiting for logind to take the shutdown lock"
        );
        api.kubeconfig_state = Some(KubeconfigState::Unloadable("no users".into()));
        assert_eq!(
            k.waiting_for(NODE, api.blocked()),
            "cannot load /etc/kubernetes/kubelet.conf: no users; waiting for it to change; waiting for logind to take the shutdown lock"
        );

        api.kubeconfig_state = None;
        api.failed(NODE, "node watch", "connection refused");
        assert!(k.phase_to(NODE, PhaseEvent::NodeSeen));
        k.lock_to(LockEvent::Taken);
        assert_eq!(
            k.waiting_for(NODE, api.blocked()),
            "API server unreachable: connection refused; holding the shutdown lock"
        );
        api.answered(NODE);
        assert!(
            k.waiting_for(NODE, api.blocked())
                .starts_with("waiting for gates: "),
            "an answer ends the wait for the API server"
        );
    }

    #[test]
    fn the_lock_is_wanted_except_while_shutting_down() {
        let mut k = known();
        for (phase, wanted) in [
            (Phase::Booting, true),
            (Phase::Gated, true),
            (Phase::Ready, true),
            (Phase::Draining, false),
            (Phase::Drained, false),
        ] {
            k.phase = phase;
            assert_eq!(k.wants_lock(), wanted, "{phase:?}");
        }
    }

    #[test]
    fn replays_older_than_the_agents_own_write_are_ignored_until_its_echo() {
        let mut k = known();
        k.apply_node(NODE, watcher::Event::InitApply(node("1")));
        assert_eq!(
            acted_on(&k),
            None,
            "a relist changes nothing until it is done"
        );
        k.apply_node(NODE, watcher::Event::InitDone);
        assert_eq!(acted_on(&k), Some("1"));

        k.wrote_node(node("3"), true);
        assert_eq!(
            acted_on(&k),
            Some("3"),
            "the write's answer is acted on at once"
        );
        k.apply_node(NODE, watcher::Event::Apply(node("2")));
        assert_eq!(
            acted_on(&k),
            Some("3"),
            "the replay of 2 is older than the write"
        );
        k.apply_node(NODE, watcher::Event::Apply(node("3")));
        assert_eq!(k.node_echo_rv, None, "the echo arrived");
        k.apply_node(NODE, watcher::Event::Apply(node("4")));
        assert_eq!(
            acted_on(&k),
            Some("4"),
            "after the echo, the watch leads again"
        );

        // A write that changed nothing has no echo to wait for.
        k.wrote_node(node("4"), false);
        k.apply_node(NODE, watcher::Event::Apply(node("5")));
        assert_eq!(acted_on(&k), Some("5"));

        // A deletion is believed even while an echo is awaited.
        k.wrote_node(node("6"), true);
        k.apply_node(NODE, watcher::Event::Delete(node("6")));
        assert_eq!(acted_on(&k), None);
        assert_eq!(k.node_echo_rv, None);
    }

    #[test]
    fn ready_is_due_with_the_lock_and_the_watches_or_without_waiting_for_the_api() {
        let mut k = known();
        let t0 = k.started;
        assert!(!k.ready_due(true, t0), "never without the lock");
        k.lock_to(LockEvent::Taken);
        assert!(
            k.ready_due(true, t0),
            "an API server out of reach is not waited for"
        );
        assert!(
            !k.ready_due(false, t0),
            "a reachable one is, while its watches list"
        );
        let almost = t0 + READY_WITHOUT_API_AFTER - Duration::from_millis(1);
        assert!(!k.ready_due(false, almost));
        assert!(
            k.ready_due(false, t0 + READY_WITHOUT_API_AFTER),
            "but not for long"
        );
        k.node_watch.apply(&watcher::Event::InitDone);
        assert!(!k.ready_due(false, t0), "the pod watch has not listed yet");
        k.pods.apply(&watcher::Event::InitDone);
        assert!(k.ready_due(false, t0), "both watches up");
        k.notified_ready = true;
        assert!(
            !k.ready_due(true, t0 + READY_WITHOUT_API_AFTER),
            "said once"
        );
    }

    /// The gates are decided at the `now` given, on the Node's conditions only once its watch
    /// has listed.
    #[test]
    fn gates_are_decided_at_now_on_a_listed_node() {
        let gates = GateSet {
            gates: vec![Gate::NodeCondition(ConditionGate {
                type_: "Ready".into(),
                expect: Expect::Is("True".into()),
            })],
            boot_deadline: Duration::from_secs(60),
        };
        let t0 = Instant::now();
        let mut k = Known::new(gates, t0);
        let ready: Node = serde_json::from_value(json!({
            "metadata": {"name": NODE, "resourceVersion": "1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .expect("node");
        k.wrote_node(ready.clone(), false);
        k.evaluate_gates(t0);
        assert_eq!(
            k.verdict.gates[0].state,
            GateState::Unknown,
            "not listed yet"
        );
        assert!(!k.verdict.overdue);
        k.evaluate_gates(t0 + Duration::from_secs(60));
        assert!(k.verdict.overdue, "the boot deadline passed by `now`");

        k.apply_node(NODE, watcher::Event::InitApply(ready));
        k.apply_node(NODE, watcher::Event::InitDone);
        k.evaluate_gates(t0 + Duration::from_secs(60));
        assert!(k.verdict.all_pass, "{:?}", k.verdict);
        assert!(!k.verdict.overdue, "passing gates are never overdue");
    }

    #[test]
    fn the_view_carries_the_settings_and_whether_the_verdict_is_known() {
        let mut k = known();
        let mut settings = Settings::default().agent;
        settings.startup_taint = TaintOwner::Agent;
        settings.retaint_on_gate_failure = true;
        let v = k.view(&settings, None);
        assert!(v.untaint_self && v.retaint);
        assert!(!v.node_exists);
        assert!(!v.verdict_known, "no gate answered yet");
        answer(&mut k, Access::Granted);
        k.apply_node(NODE, watcher::Event::InitApply(node("1")));
        k.apply_node(NODE, watcher::Event::InitDone);
        settings.startup_taint = TaintOwner::Controller;
        settings.retaint_on_gate_failure = false;
        let v = k.view(&settings, None);
        assert!(!v.untaint_self && !v.retaint);
        assert!(v.node_exists && v.verdict_known && v.gates_pass);
        assert_eq!(v.cordon, state::CordonView::NotCordoned);
    }

    #[test]
    fn the_status_is_what_the_agent_knows() {
        let mut k = known();
        k.lock_to(LockEvent::Taken);
        k.lock_to(LockEvent::Replaced);
        k.lock_takes = 2;
        k.cap = Some(Duration::from_millis(1500));
        k.warnings = vec!["logind's cap is short".into()];
        k.facts.kubelet_shutdown_locks = Some(vec![42]);
        let s = k.status(7, NODE, "the line".into(), None);
        assert_eq!((s.pid, s.node.as_str()), (7, NODE));
        assert_eq!((s.lock, s.lock_takes), (Lock::Held, 2));
        assert_eq!(s.inhibit_delay_max_ms, Some(1500));
        assert_eq!(s.waiting_for, "the line");
        assert!(!s.node_registered && !s.ready);
        assert_eq!(s.gates.len(), 2);
        assert_eq!(s.warnings[0], "logind's cap is short");
        assert!(s.warnings[1].contains("(pid 42)"), "{:?}", s.warnings);
        assert_eq!(s.warnings.len(), 2);
    }
}
