use super::*;

#[test]
fn phase_transitions() {
    use Phase::*;
    use PhaseEvent::*;
    let all_phases = [Booting, Gated, Ready, Draining, Drained];
    let all_events = [
        NodeSeen,
        GatesPassed,
        GatesFailed,
        ShutdownStarted,
        DrainEnded,
        ShutdownCancelled,
    ];
    let allowed = [
        (Booting, NodeSeen, Gated),
        (Gated, GatesPassed, Ready),
        (Ready, GatesFailed, Gated),
        (Booting, ShutdownStarted, Draining),
        (Gated, ShutdownStarted, Draining),
        (Ready, ShutdownStarted, Draining),
        (Draining, DrainEnded, Drained),
        (Draining, ShutdownCancelled, Gated),
        (Drained, ShutdownCancelled, Gated),
    ];
    for from in all_phases {
        for ev in all_events {
            let want = allowed
                .iter()
                .find(|(f, e, _)| *f == from && *e == ev)
                .map(|(_, _, to)| *to);
            match (from.on(ev), want) {
                (Ok(to), Some(w)) => assert_eq!(to, w, "{from:?} --{ev:?}"),
                (Err(r), None) => {
                    assert_eq!(r.from, format!("{from:?}"));
                    assert!(r.to_string().contains("refused"), "{r}");
                }
                (got, want) => panic!("{from:?} --{ev:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}

/// The refusals that protect a node: nothing uncordons or re-gates a node that is shutting down,
/// and a second shutdown signal (plain and with metadata) does not start a second drain.
#[test]
fn refused_transitions_that_matter() {
    assert!(Phase::Drained.on(PhaseEvent::GatesPassed).is_err());
    assert!(Phase::Draining.on(PhaseEvent::GatesFailed).is_err());
    assert!(Phase::Draining.on(PhaseEvent::ShutdownStarted).is_err());
    assert!(Phase::Drained.on(PhaseEvent::ShutdownStarted).is_err());
    assert!(Phase::Booting.on(PhaseEvent::GatesPassed).is_err());
    assert!(Phase::Ready.on(PhaseEvent::DrainEnded).is_err());
}

#[test]
fn lock_transitions() {
    use Lock::*;
    use LockEvent::*;
    let cases = [
        (Unheld, Taken, Some(Held)),
        (Released, Taken, Some(Held)),
        (Held, Taken, None),
        (Held, Replaced, Some(Held)),
        (Unheld, Replaced, None),
        (Released, Replaced, None),
        (Held, ReleasedForShutdown, Some(Released)),
        (Released, ReleasedForShutdown, None),
        (Unheld, ReleasedForShutdown, None),
        (Held, Dropped, Some(Unheld)),
        (Released, Dropped, Some(Unheld)),
        (Unheld, Dropped, None),
    ];
    for (from, ev, want) in cases {
        assert_eq!(from.on(ev).ok(), want, "{from:?} --{ev:?}");
    }
}

fn view(phase: Phase) -> View {
    View {
        phase,
        node_exists: true,
        gates_pass: false,
        overdue: false,
        overdue_reported: false,
        has_startup_taint: true,
        cordon: CordonView::NotCordoned,
        retaint: true,
        condition_current: true,
        verdict_known: true,
        untaint_self: true,
    }
}

/// The default deployment: the readiness controller owns the taint.
fn reporting(phase: Phase) -> View {
    View {
        untaint_self: false,
        ..view(phase)
    }
}

#[test]
fn reconcile_table() {
    use Action::*;
    use PhaseEvent::*;
    let cases: Vec<(&str, View, Vec<Action>)> = vec![
        (
            "node not registered yet: wait",
            View {
                node_exists: false,
                ..view(Phase::Booting)
            },
            vec![],
        ),
        (
            "node appears, gates failing",
            view(Phase::Booting),
            vec![Transition(NodeSeen)],
        ),
        (
            "node appears with gates already passing",
            View {
                gates_pass: true,
                ..view(Phase::Booting)
            },
            vec![
                Transition(NodeSeen),
                RemoveStartupTaint,
                Transition(GatesPassed),
            ],
        ),
        (
            "after a reboot: our cordon from before the boot is lifted",
            View {
                gates_pass: true,
                cordon: CordonView::OursBeforeBoot,
                ..view(Phase::Gated)
            },
            vec![RemoveStartupTaint, Uncordon, Transition(GatesPassed)],
        ),
        (
            "an administrator's cordon stays",
            View {
                gates_pass: true,
                cordon: CordonView::Other,
                ..view(Phase::Gated)
            },
            vec![RemoveStartupTaint, Transition(GatesPassed)],
        ),
        (
            "an operator's `nodeward drain` this boot stays",
            View {
                gates_pass: true,
                has_startup_taint: false,
                cordon: CordonView::OursThisBoot {
                    by_this_agent: false,
                },
                ..view(Phase::Gated)
            },
            vec![Transition(GatesPassed)],
        ),
        (
            "a cancelled shutdown's cordon is lifted",
            View {
                gates_pass: true,
                has_startup_taint: false,
                cordon: CordonView::OursThisBoot {
                    by_this_agent: true,
                },
                ..view(Phase::Gated)
            },
            vec![Uncordon, Transition(GatesPassed)],
        ),
        (
            "flannel dies: taint back",
            View {
                has_startup_taint: false,
                ..view(Phase::Ready)
            },
            vec![AddStartupTaint, Transition(GatesFailed)],
        ),
        (
            "flannel dies, retaint off",
            View {
                has_startup_taint: false,
                retaint: false,
                ..view(Phase::Ready)
            },
            vec![Transition(GatesFailed)],
        ),
        (
            "ready and nothing to do",
            View {
                gates_pass: true,
                has_startup_taint: false,
                ..view(Phase::Ready)
            },
            vec![],
        ),
        (
            "ready, re-registered node got the taint again",
            View {
                gates_pass: true,
                ..view(Phase::Ready)
            },
            vec![RemoveStartupTaint],
        ),
        (
            "overdue: reported once",
            View {
                overdue: true,
                ..view(Phase::Gated)
            },
            vec![ReportNotReadyInTime],
        ),
        (
            "overdue already reported",
            View {
                overdue: true,
                overdue_reported: true,
                ..view(Phase::Gated)
            },
            vec![],
        ),
        (
            "overdue without a Node at all",
            View {
                overdue: true,
                node_exists: false,
                ..view(Phase::Booting)
            },
            vec![ReportNotReadyInTime],
        ),
        (
            "draining: gates do not act",
            View {
                gates_pass: true,
                cordon: CordonView::OursBeforeBoot,
                ..view(Phase::Draining)
            },
            vec![],
        ),
        (
            "drained: gates do not act",
            View {
                gates_pass: true,
                cordon: CordonView::OursThisBoot {
                    by_this_agent: true,
                },
                ..view(Phase::Drained)
            },
            vec![],
        ),
        (
            "controller mode: gates pass, the condition is written, the taint is left to the controller",
            View {
                gates_pass: true,
                condition_current: false,
                ..reporting(Phase::Gated)
            },
            vec![WriteCondition, Transition(GatesPassed)],
        ),
        (
            "controller mode: a gate fails, the condition is written, no taint change",
            View {
                has_startup_taint: false,
                condition_current: false,
                ..reporting(Phase::Ready)
            },
            vec![WriteCondition, Transition(GatesFailed)],
        ),
        (
            "controller mode: our cordon from before the boot is still lifted by the agent",
            View {
                gates_pass: true,
                cordon: CordonView::OursBeforeBoot,
                ..reporting(Phase::Gated)
            },
            vec![Uncordon, Transition(GatesPassed)],
        ),
        (
            "the condition is written as soon as the node appears",
            View {
                condition_current: false,
                ..reporting(Phase::Booting)
            },
            vec![Transition(NodeSeen), WriteCondition],
        ),
        (
            "a gate not known yet (a restarted agent resyncing): nothing reported",
            View {
                condition_current: false,
                verdict_known: false,
                ..reporting(Phase::Gated)
            },
            vec![],
        ),
        (
            "past the boot deadline the verdict is reported even with gates unknown",
            View {
                condition_current: false,
                verdict_known: false,
                overdue: true,
                overdue_reported: true,
                ..reporting(Phase::Gated)
            },
            vec![WriteCondition],
        ),
        (
            "a stale condition is not rewritten while draining",
            View {
                condition_current: false,
                ..reporting(Phase::Draining)
            },
            vec![],
        ),
    ];
    for (name, v, want) in cases {
        assert_eq!(reconcile(&v), want, "{name}");
    }
}

/// SIGTERM never drains, and the journal says what it meant where it came: a service stop
/// before a shutdown, the system's stop after the shutdown drain (a real node logged "not a
/// shutdown" there), or the drain cut short.
#[test]
fn sigterm_says_what_it_means_in_each_phase() {
    use Phase::*;
    for phase in [Booting, Gated, Ready] {
        assert!(
            phase.on_sigterm().contains("not the machine"),
            "{phase:?}: {}",
            phase.on_sigterm()
        );
    }
    assert!(Drained.on_sigterm().contains("after its drain"));
    assert!(Draining.on_sigterm().contains("cut short"));
    assert!(Drained.on_sigterm().starts_with("SIGTERM: the system"));
    for phase in [Booting, Gated, Ready, Draining, Drained] {
        assert!(phase.on_sigterm().starts_with("SIGTERM: "), "{phase:?}");
    }
}
