//! Checking and placing: whether a place allows a pod, its counts bumped or lifted, and the journal
//! a trial expansion is rolled back with.

use super::*;

/// The counters of one list that may select a pod, found from the pod's labels rather than by
/// trying each: at the bench's larger size (200 counters, 1,000 distinct pending label sets)
/// trying every counter on every label set was 5–8% of `decide`. A counter whose selector
/// requires a label value (`matchLabels`) is listed under its first such pair and tried only on
/// pods with that label (a counter of several terms: its first term's); one without (expressions only) is tried on every pod; one without a
/// selector selects none.
pub(super) struct ByLabel<'c> {
    pub(super) required: HashMap<(&'c str, &'c str), Vec<usize>>,
    pub(super) others: Vec<usize>,
}

impl<'c> ByLabel<'c> {
    pub(super) fn new(list: &'c [Counter]) -> Self {
        let mut required: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
        let mut others = Vec::new();
        for (i, c) in list.iter().enumerate() {
            // A pod the first term does not select is selected by none.
            let Some(sel) = c.matcher.terms.first().and_then(|t| t.selector.as_ref()) else {
                continue;
            };
            match sel.labels.iter().next() {
                Some((k, v)) => required
                    .entry((k.as_str(), v.as_str()))
                    .or_default()
                    .push(i),
                None => others.push(i),
            }
        }
        Self { required, others }
    }

    /// The counters of `list` (the list this was built from) that select the pods of `set`,
    /// ascending.
    pub(super) fn selecting(&self, list: &[Counter], set: LabelSet<'_>) -> Vec<usize> {
        let mut out: Vec<usize> = self.others.clone();
        if !self.required.is_empty() {
            for (k, v) in set.1 {
                if let Some(l) = self.required.get(&(k.as_str(), v.as_str())) {
                    out.extend_from_slice(l);
                }
            }
        }
        out.retain(|&i| list[i].matcher.selects(set));
        out.sort_unstable();
        out
    }
}

pub(super) fn bump(c: &mut Counter, d: u32) {
    let i = d as usize;
    if c.counts.len() <= i {
        c.counts.resize(i + 1, 0);
    }
    c.counts[i] += 1;
    c.total += 1;
}

pub(super) fn set_flag(flags: &mut Vec<bool>, d: u32, v: bool) {
    let i = d as usize;
    if flags.len() <= i {
        flags.resize(i + 1, false);
    }
    flags[i] = v;
}

impl Topology {
    /// The hostname domain the next new node gets, without taking it.
    pub(in crate::scaler::decide) fn peek_host(&self) -> u32 {
        self.next[0]
    }

    /// Takes a fresh hostname domain for a new node.
    pub(in crate::scaler::decide) fn take_host(&mut self) -> u32 {
        self.next[0] += 1;
        self.next[0] - 1
    }

    pub(super) fn domain(&self, key: usize, place: Place) -> Option<u32> {
        match place {
            Place::Bin(i) => self.bin_domains.get(i)?.get(key).copied().flatten(),
            Place::New { host, .. } if key == 0 => Some(host),
            Place::New { group, .. } => self.group_domains.get(group)?.get(key).copied().flatten(),
        }
    }

    /// The spreads to which a pod placed at `place` may add the place's domain: see
    /// [`fresh_spreads`](Self::fresh_spreads). `None` for a bin past the index.
    pub(super) fn fresh_mut(&mut self, place: Place) -> Option<&mut Vec<usize>> {
        match place {
            Place::Bin(i) => self.bin_fresh.get_mut(i),
            Place::New { group, .. } => self.group_fresh.get_mut(group),
        }
    }

    /// Whether pending pod `qi` has a spread or a pod affinity: what other pods' placements may
    /// open to it after it was kept off a place (an anti-affinity only ever closes places).
    pub(in crate::scaler::decide) fn may_open_later(&self, qi: usize) -> bool {
        self.needs_of(qi)
            .is_some_and(|n| !n.spread.is_empty() || !n.affinity.is_empty())
    }

    /// Pending pod `qi`'s constraints; `None`: it has none.
    fn needs_of(&self, qi: usize) -> Option<&Needs> {
        self.pending
            .get(qi)
            .and_then(|p| self.needs.get(p.needs as usize))
    }

    /// Whether no node of group `group` may take pending pod `qi`, as far as inter-pod
    /// constraints go, judged by a new node of the group alone. A new node is as open as any
    /// node of its group to a pod without a required pod affinity: it holds no pod for an
    /// anti-affinity to avoid nor a count a hostname spread could find too high, and its other
    /// domains (zone, region) are the group's. A pod with an affinity (a node holding its
    /// company may take it where an empty one may not) is never judged closed here.
    pub(in crate::scaler::decide) fn closed_to_group(&mut self, qi: usize, group: usize) -> bool {
        let affine = self.needs_of(qi).is_some_and(|n| !n.affinity.is_empty());
        let host = self.peek_host();
        !affine && !self.allows(qi, Place::New { group, host })
    }

    /// Whether pending pod `qi` may go to `place` as far as inter-pod constraints go.
    pub(in crate::scaler::decide) fn allows(&mut self, qi: usize, place: Place) -> bool {
        const NOTHING: &Needs = &Needs {
            affinity: Vec::new(),
            self_affine: false,
            anti: Vec::new(),
            spread: Vec::new(),
            carries: Vec::new(),
        };
        let Some(&pending) = self.pending.get(qi) else {
            return true;
        };
        let needs = self.needs.get(pending.needs as usize).unwrap_or(NOTHING);
        let hit_by: &[usize] = self
            .matched
            .get(pending.set as usize)
            .map_or(&[], |m| &m.hit_by);
        if needs.affinity.is_empty()
            && needs.anti.is_empty()
            && needs.spread.is_empty()
            && hit_by.is_empty()
        {
            return true;
        }
        let exists = needs.affinity.iter().all(|&ci| {
            let c = &self.counters[ci];
            self.domain(c.key, place).is_some_and(|d| c.at(d) > 0)
        });
        if !exists {
            // The first of a series with affinity to itself may go anywhere with the keys.
            let first = needs.self_affine
                && needs.affinity.iter().all(|&ci| {
                    let c = &self.counters[ci];
                    c.total == 0 && self.domain(c.key, place).is_some()
                });
            if !first {
                return false;
            }
        }
        let clear = |list: &[Counter], ci: usize| {
            let c = &list[ci];
            self.domain(c.key, place).is_none_or(|d| c.at(d) == 0)
        };
        if !needs.anti.iter().all(|&ci| clear(&self.counters, ci))
            || !hit_by.iter().all(|&ci| clear(&self.carriers, ci))
        {
            return false;
        }
        for k in 0..needs.spread.len() {
            let (si, max_skew, self_match) = self.needs[pending.needs as usize].spread[k];
            let ci = self.spreads[si].counter;
            let Some(d) = self.domain(self.counters[ci].key, place) else {
                return false;
            };
            let count = self.counters[ci].at(d);
            let min = self.min(si);
            let s = &self.spreads[si];
            let listed = s.eligible.get(d as usize).copied().unwrap_or(false);
            let (min, domains) = if listed {
                (min, s.domains.len())
            } else {
                (
                    Some(min.map_or(count, |m| m.min(count))),
                    s.domains.len() + 1,
                )
            };
            let min = if (domains as u32) < s.min_domains {
                0
            } else {
                min.unwrap_or(count)
            };
            if i64::from(count) + i64::from(self_match) - i64::from(min) > i64::from(max_skew) {
                return false;
            }
        }
        true
    }

    /// The minimum count over a spread's eligible domains (`None`: it has none).
    pub(super) fn min(&mut self, si: usize) -> Option<u32> {
        let s = &self.spreads[si];
        if s.min.is_none() && !s.domains.is_empty() {
            let c = &self.counters[s.counter];
            let m = s.domains.iter().map(|&d| c.at(d)).min();
            self.spreads[si].min = m;
        }
        self.spreads[si].min
    }

    /// Records pending pod `qi` at `place`.
    pub(in crate::scaler::decide) fn place(&mut self, qi: usize, place: Place) {
        // Taken out and put back, so placing does not allocate.
        let Some((counted_by, carries)) = self.take_lists(qi) else {
            return;
        };
        let fresh = self
            .fresh_mut(place)
            .map(std::mem::take)
            .unwrap_or_default();
        // A node that is not there yet becomes a domain of the spreads it is eligible for.
        for &si in &fresh {
            let s = &self.spreads[si];
            let key = self.counters[s.counter].key;
            let Some(d) = self.domain(key, place) else {
                continue;
            };
            if s.eligible.get(d as usize).copied().unwrap_or(false) {
                continue;
            }
            let count = self.counters[s.counter].at(d);
            let s = &mut self.spreads[si];
            set_flag(&mut s.eligible, d, true);
            s.domains.push(d);
            s.min = s.min.map(|m| m.min(count));
            self.journal.push(Undo::Eligible { spread: si });
        }
        for &ci in &counted_by {
            let Some(d) = self.domain(self.counters[ci].key, place) else {
                continue;
            };
            let before = self.counters[ci].at(d);
            bump(&mut self.counters[ci], d);
            for &si in &self.spreads_of[ci] {
                let s = &mut self.spreads[si];
                if s.min == Some(before) && s.eligible.get(d as usize).copied().unwrap_or(false) {
                    s.min = None;
                }
            }
            self.journal.push(Undo::Count {
                carrier: false,
                counter: ci,
                d,
                up: true,
            });
        }
        for &ci in &carries {
            let Some(d) = self.domain(self.carriers[ci].key, place) else {
                continue;
            };
            self.count(true, ci, d, true);
            self.journal.push(Undo::Count {
                carrier: true,
                counter: ci,
                d,
                up: true,
            });
        }
        self.put_lists(qi, counted_by, carries);
        if let Some(list) = self.fresh_mut(place) {
            *list = fresh;
        }
    }

    /// Takes pod `qi`'s counts off `place`, where it runs now, before it is placed elsewhere: a
    /// pod a scale-down would move is counted at its new place only.
    pub(in crate::scaler::decide) fn lift(&mut self, qi: usize, place: Place) {
        let Some((counted_by, carries)) = self.take_lists(qi) else {
            return;
        };
        for (carrier, list) in [(false, &counted_by), (true, &carries)] {
            for &ci in list {
                let c = if carrier {
                    &self.carriers[ci]
                } else {
                    &self.counters[ci]
                };
                let Some(d) = self.domain(c.key, place).filter(|&d| c.at(d) > 0) else {
                    continue;
                };
                self.count(carrier, ci, d, false);
                self.journal.push(Undo::Count {
                    carrier,
                    counter: ci,
                    d,
                    up: false,
                });
            }
        }
        self.put_lists(qi, counted_by, carries);
    }

    /// Pending pod `qi`'s counters that count it and carriers it carries, taken out of the index
    /// (so the index can change while they are read) until [`put_lists`](Self::put_lists).
    /// `None` past the pending pods.
    pub(super) fn take_lists(&mut self, qi: usize) -> Option<(Vec<usize>, Vec<usize>)> {
        let p = *self.pending.get(qi)?;
        let counted_by = self
            .matched
            .get_mut(p.set as usize)
            .map(|m| std::mem::take(&mut m.counted_by))
            .unwrap_or_default();
        let carries = self
            .needs
            .get_mut(p.needs as usize)
            .map(|n| std::mem::take(&mut n.carries))
            .unwrap_or_default();
        Some((counted_by, carries))
    }

    /// Puts back what [`take_lists`](Self::take_lists) took.
    pub(super) fn put_lists(&mut self, qi: usize, counted_by: Vec<usize>, carries: Vec<usize>) {
        let Some(p) = self.pending.get(qi).copied() else {
            return;
        };
        if let Some(m) = self.matched.get_mut(p.set as usize) {
            m.counted_by = counted_by;
        }
        if let Some(n) = self.needs.get_mut(p.needs as usize) {
            n.carries = carries;
        }
    }

    /// Counts one pod more (`up`) or less in counter `ci` (of the carriers, `carrier`) at
    /// domain `d`; the minimum of the spreads over it is recomputed when next asked.
    pub(super) fn count(&mut self, carrier: bool, ci: usize, d: u32, up: bool) {
        let c = if carrier {
            &mut self.carriers[ci]
        } else {
            for &si in &self.spreads_of[ci] {
                self.spreads[si].min = None;
            }
            &mut self.counters[ci]
        };
        if up {
            bump(c, d);
        } else if let Some(n) = c.counts.get_mut(d as usize) {
            *n = n.saturating_sub(1);
            c.total = c.total.saturating_sub(1);
        }
    }

    /// Where [`rollback`](Self::rollback) returns to.
    pub(in crate::scaler::decide) fn mark(&self) -> Mark {
        Mark {
            journal: self.journal.len(),
            next_host: self.next[0],
        }
    }

    /// Undoes every placement since `mark`.
    pub(in crate::scaler::decide) fn rollback(&mut self, mark: &Mark) {
        while self.journal.len() > mark.journal {
            match self.journal.pop() {
                Some(Undo::Count {
                    carrier,
                    counter,
                    d,
                    up,
                }) => self.count(carrier, counter, d, !up),
                Some(Undo::Eligible { spread }) => {
                    let s = &mut self.spreads[spread];
                    if let Some(d) = s.domains.pop() {
                        set_flag(&mut s.eligible, d, false);
                    }
                    s.min = None;
                }
                None => break,
            }
        }
        self.next[0] = mark.next_host;
    }
}
