//! Exit codes.

use std::time::Duration;

use super::*;
use crate::drain::plan::PodRef;
use crate::drain::{DrainOutcome, DrainReport};

fn report(outcome: DrainOutcome, force_deleted: usize) -> DrainReport {
    let pod = PodRef {
        namespace: "default".into(),
        name: "web-0".into(),
        uid: "u".into(),
    };
    DrainReport {
        node: "worker-1".into(),
        outcome,
        evicted: Vec::new(),
        skipped: Vec::new(),
        refused: Vec::new(),
        left_behind: Vec::new(),
        force_deleted: vec![pod; force_deleted],
        unsatisfiable: Vec::new(),
        eviction_requests: 0,
        stopped: Vec::new(),
        elapsed: Duration::ZERO,
    }
}

/// Issue 41: a drain that deleted pods past their budgets exited 0, exactly like a clean one.
/// Pods still on the node (the deadline, a refusal) say more to a script than the deletions.
#[test]
fn each_end_of_a_drain_has_its_exit_code() {
    let cases = [
        (DrainOutcome::Drained, 0, 0),
        (DrainOutcome::Drained, 2, 5),
        (DrainOutcome::Refused, 0, 4),
        (DrainOutcome::Refused, 1, 4),
        (DrainOutcome::DeadlineExceeded, 0, 3),
        (DrainOutcome::DeadlineExceeded, 1, 3),
        (DrainOutcome::BudgetUnsatisfiable, 0, 6),
        (DrainOutcome::BudgetUnsatisfiable, 1, 6),
    ];
    for (outcome, deleted, code) in cases {
        assert_eq!(
            drain_exit_code(&report(outcome, deleted)),
            code,
            "{outcome:?} with {deleted} deleted past their budgets"
        );
    }
}
