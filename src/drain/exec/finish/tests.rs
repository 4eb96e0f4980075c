//! What a drain says when it ends, from its report alone.

use std::time::Duration;

use kube::runtime::events::EventType;

use super::*;

fn pods(names: &[&str]) -> Vec<PodRef> {
    PodRef::defaults(names)
}

fn report(outcome: DrainOutcome, evicted: &[&str], deleted: &[&str], left: &[&str]) -> DrainReport {
    DrainReport {
        node: "worker-1".into(),
        outcome,
        evicted: pods(evicted),
        skipped: Vec::new(),
        refused: Vec::new(),
        left_behind: pods(left),
        force_deleted: pods(deleted),
        unsatisfiable: Vec::new(),
        eviction_requests: evicted.len(),
        stopped: Vec::new(),
        elapsed: Duration::from_secs(1),
    }
}

/// Issue 41: the DrainSucceeded Event counted the pods deleted past their budgets as evicted,
/// and a refused pod's Event and condition did not say why.
#[test]
fn the_end_of_a_drain_counts_deletions_apart_and_names_each_refusal() {
    let denied = Refusal::Denied {
        message:
            r#"pods "db" is forbidden: ValidatingAdmissionPolicy 'keep-db' denied request: no"#
                .into(),
    };
    let mut refused = report(DrainOutcome::Refused, &["a"], &[], &[]);
    refused.refused = vec![(pods(&["db"])[0].clone(), denied)];
    let cases = [
        (
            report(DrainOutcome::Drained, &["a", "b"], &[], &[]),
            EventType::Normal,
            "DrainSucceeded",
            "2 pods evicted in 1.0s",
        ),
        (
            report(DrainOutcome::Drained, &["a"], &["b"], &[]),
            EventType::Warning,
            "DrainSucceeded",
            "1 pods evicted, 1 deleted past their budgets in 1.0s (deleted: default/b)",
        ),
        (
            refused,
            EventType::Normal,
            "DrainSucceeded",
            "1 pods evicted in 1.0s; refused: default/db (eviction denied (403): pods \"db\" is \
             forbidden: ValidatingAdmissionPolicy 'keep-db' denied request: no)",
        ),
        (
            report(DrainOutcome::DeadlineExceeded, &["a"], &["b", "c"], &["c"]),
            EventType::Warning,
            "DrainTimedOut",
            "1 pods left after 10s: default/c; 1 pods evicted, 2 deleted past their budgets \
             (deleted: default/b, default/c)",
        ),
    ];
    for (r, type_, reason, note) in cases {
        assert_eq!(
            ending(&r, Duration::from_secs(10)),
            (type_, reason, note.to_string()),
            "{r}"
        );
    }
}
