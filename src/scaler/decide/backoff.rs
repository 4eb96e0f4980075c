//! Back-off: the one rule for a group whose machines failed ([`back_off`]), and where it holds.

use super::*;

pub(super) fn elapsed(now: Timestamp, since: Timestamp) -> std::time::Duration {
    let d: SignedDuration = now.duration_since(since);
    d.try_into().unwrap_or_default()
}

/// The back-off after `failures` consecutive failed machines: `backoff_initial` doubled per
/// failure, capped at `backoff_max`.
pub fn backoff_for(failures: u32, s: &ScalerSettings) -> std::time::Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(31));
    s.backoff_initial.saturating_mul(factor).min(s.backoff_max)
}

/// The group's back-off after `failed` more failed machines at `now`, on top of `prev`; `None`
/// when nothing failed. The one place the rule lives: for machines [`decide`] repairs and for
/// creates the provider refused for good, which the executor reports back through it.
pub fn back_off(
    group: &str,
    prev: Option<Backoff>,
    failed: u32,
    now: Timestamp,
    s: &ScalerSettings,
) -> Option<Action> {
    if failed == 0 {
        return None;
    }
    let failures = prev.unwrap_or_default().failures.saturating_add(failed);
    let until = now
        .checked_add(
            SignedDuration::try_from(backoff_for(failures, s)).unwrap_or(SignedDuration::MAX),
        )
        .unwrap_or(Timestamp::MAX);
    Some(Action::BackOff {
        group: group.to_string(),
        failures,
        until,
    })
}

/// The back-off the failures cause, and the back-off a recovered group no longer needs.
pub(super) fn back_offs(cx: &Context<'_>, plan: &mut Plan<'_>, failures: &BTreeMap<&str, u32>) {
    let (snap, now, s) = (cx.snap, cx.now, cx.s);
    let groups = &cx.groups;
    let Plan {
        actions,
        backing_off,
        ..
    } = plan;
    for (group, n) in failures {
        if let Some(&gi) = groups.get(group) {
            backing_off[gi] = true;
        }
        actions.extend(back_off(
            group,
            snap.backoff.get(*group).copied(),
            *n,
            now,
            s,
        ));
    }
    for (group, b) in &snap.backoff {
        let Backoff {
            failures: f,
            last_failure,
            ..
        } = *b;
        if f == 0 || failures.contains_key(group.as_str()) {
            continue;
        }
        let recovered = snap.nodes.iter().any(|n| {
            n.group() == Some(group.as_str())
                && n.ready
                && !n.booting()
                && match (n.created, last_failure) {
                    (Some(c), Some(l)) => c > l,
                    _ => true,
                }
        });
        if recovered {
            actions.push(Action::ClearBackOff {
                group: group.clone(),
            });
        }
    }
}
