//! First-fit in O(log n): a segment tree over places (nodes, in their packing order) keeping the
//! largest free CPU, memory and pod slots below each branch, so a search skips every run of
//! places that cannot take a pod instead of testing them one by one. At 5,000 nodes and 10,000
//! pending pods the linear scan was most of scale-up's time. The tree only prunes on those three
//! dimensions; the caller still tests the exact fit (extended resources) and the rest.

use crate::resources::Resources;

/// What [`FirstFit::first_where`] does with a place the tree offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Probe {
    /// Take it: the search ends with this place.
    Take,
    /// It does not do: look further.
    Skip,
    /// No later place will do either: the search ends without one.
    Stop,
}

/// Largest free CPU, memory and pods per branch, the three side by side so a step of a search
/// reads one cache line; leaves past `len` hold `i64::MIN`.
#[derive(Debug, Clone, Default)]
pub(super) struct FirstFit {
    /// Leaves (a power of two, or 0).
    width: usize,
    len: usize,
    /// `[cpu, memory, pods]` per tree node, the root at 1.
    room: Vec<[i64; 3]>,
}

/// What a place has, or a pod needs, as the tree compares it.
fn key(r: &Resources) -> [i64; 3] {
    [r.cpu_milli, r.memory, r.pods]
}

/// Whether `room` holds `need` in all three.
fn holds(room: &[i64; 3], need: &[i64; 3]) -> bool {
    room[0] >= need[0] && room[1] >= need[1] && room[2] >= need[2]
}

impl FirstFit {
    /// Appends a place.
    pub(super) fn push(&mut self, free: &Resources) {
        if self.len == self.width {
            let width = (self.width * 2).max(1);
            let mut grown = Self {
                width,
                len: self.len,
                room: vec![[i64::MIN; 3]; 2 * width],
            };
            grown.room[width..width + self.len]
                .copy_from_slice(&self.room[self.width..self.width + self.len]);
            for i in (1..width).rev() {
                grown.pull(i);
            }
            *self = grown;
        }
        self.len += 1;
        self.set(self.len - 1, free);
    }

    /// Place `i` now has `free`.
    pub(super) fn set(&mut self, i: usize, free: &Resources) {
        self.put(i, key(free));
    }

    /// Place `i` takes nothing more, whatever it has free, until [`set`](Self::set) again.
    pub(super) fn close(&mut self, i: usize) {
        self.put(i, [i64::MIN; 3]);
    }

    /// Leaf `i` holds `room`; the branches above it follow.
    fn put(&mut self, i: usize, room: [i64; 3]) {
        let mut at = self.width + i;
        self.room[at] = room;
        while at > 1 {
            at /= 2;
            self.pull(at);
        }
    }

    fn pull(&mut self, i: usize) {
        let (l, r) = (self.room[2 * i], self.room[2 * i + 1]);
        self.room[i] = [l[0].max(r[0]), l[1].max(r[1]), l[2].max(r[2])];
    }

    /// The first place at or after `from` whose free CPU, memory and pods may take `need`.
    pub(super) fn first(&self, from: usize, need: &Resources) -> Option<usize> {
        if from >= self.len {
            return None;
        }
        let need = key(need);
        if from > 0 {
            return self.after(from, &need);
        }
        // From the first place on: down the leftmost branch that may hold `need`, one step a
        // level. A branch passed over on the left holds no such place, so a leaf reached this way
        // is the first. The three maxima of a branch may come from different places, though:
        // where neither child holds all three, the search backtracks as from any other place.
        if !holds(&self.room[1], &need) {
            return None;
        }
        let mut at = 1;
        while at < self.width {
            let left = 2 * at;
            if holds(&self.room[left], &need) {
                at = left;
            } else if holds(&self.room[left + 1], &need) {
                at = left + 1;
            } else {
                return self.descend(1, 0, self.width, 0, &need);
            }
        }
        Some(at - self.width)
    }

    /// Whether some place has as much free CPU as `need`, some as much memory and some as many
    /// pod slots. When not, [`first`](Self::first) finds no place for `need`, nor for any
    /// request at least as large in all three.
    pub(super) fn may_take(&self, need: &Resources) -> bool {
        self.len > 0 && holds(&self.room[1], &key(need))
    }

    /// The first place that may take `need` (as far as the tree knows) and that `probe`
    /// takes, in place order; `probe` may skip a place or end the search.
    pub(super) fn first_where(
        &self,
        need: &Resources,
        mut probe: impl FnMut(usize) -> Probe,
    ) -> Option<usize> {
        let mut from = 0;
        while let Some(i) = self.first(from, need) {
            match probe(i) {
                Probe::Take => return Some(i),
                Probe::Skip => from = i + 1,
                Probe::Stop => return None,
            }
        }
        None
    }

    /// The first place at or after `from` that may take `need`, found from leaf `from` rather
    /// than from the root: up while on a right child, over to the right sibling, and down the
    /// first sibling that may hold `need` (a branch whose three maxima come from different places
    /// may hold no such place, and is then passed over like the others). A search that skips
    /// place after place (a pod whose anti-affinity refuses the first thousand bins) takes a step
    /// or two per skip this way, where a walk from the root took two per level.
    fn after(&self, from: usize, need: &[i64; 3]) -> Option<usize> {
        let mut at = self.width + from;
        if holds(&self.room[at], need) {
            return Some(from);
        }
        loop {
            while at % 2 == 1 {
                if at == 1 {
                    return None;
                }
                at /= 2;
            }
            at += 1;
            if holds(&self.room[at], need) {
                // `at` spans `width >> depth` leaves, `depth` being its level below the root.
                let depth = usize::BITS - 1 - at.leading_zeros();
                let span = self.width >> depth;
                let lo = at * span - self.width;
                if let Some(i) = self.descend(at, lo, lo + span, lo, need) {
                    return Some(i);
                }
            }
        }
    }

    fn descend(
        &self,
        at: usize,
        lo: usize,
        hi: usize,
        from: usize,
        need: &[i64; 3],
    ) -> Option<usize> {
        if hi <= from || !holds(&self.room[at], need) {
            return None;
        }
        if hi - lo == 1 {
            return Some(lo);
        }
        let mid = (lo + hi) / 2;
        self.descend(2 * at, lo, mid, from, need)
            .or_else(|| self.descend(2 * at + 1, mid, hi, from, need))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(cpu_milli: i64) -> Resources {
        Resources {
            cpu_milli,
            memory: 1,
            pods: 1,
            ..Resources::default()
        }
    }

    #[test]
    fn finds_the_first_place_with_room_at_or_after_from() {
        let mut t = FirstFit::default();
        for cpu in [100, 500, 300, 900] {
            t.push(&r(cpu));
        }
        assert_eq!(t.first(0, &r(200)), Some(1));
        assert_eq!(t.first(2, &r(200)), Some(2));
        assert_eq!(t.first(0, &r(600)), Some(3));
        assert_eq!(t.first(0, &r(1000)), None);
        t.set(1, &r(0));
        assert_eq!(t.first(0, &r(200)), Some(2));
        t.push(&r(2000));
        assert_eq!(t.first(0, &r(1000)), Some(4));
        assert_eq!(t.first(5, &r(1)), None);
        assert_eq!(FirstFit::default().first(0, &r(1)), None);
    }

    /// `may_take` answers what the largest free CPU, memory and pods over the places answer,
    /// and when it says no, `first` finds nothing.
    #[test]
    fn may_take_is_the_largest_free_room_per_resource() {
        let place = |cpu_milli, memory, pods| Resources {
            cpu_milli,
            memory,
            pods,
            ..Resources::default()
        };
        let mut t = FirstFit::default();
        let mut places = Vec::new();
        let needs = [
            place(0, 0, 0),
            place(300, 2, 1),
            place(500, 1, 1),
            place(100, 9, 1),
            place(100, 1, 4),
            place(900, 9, 9),
        ];
        let check = |t: &FirstFit, places: &[Resources]| {
            for need in &needs {
                let want = places.iter().any(|p| p.cpu_milli >= need.cpu_milli)
                    && places.iter().any(|p| p.memory >= need.memory)
                    && places.iter().any(|p| p.pods >= need.pods);
                assert_eq!(t.may_take(need), want, "{need:?} in {places:?}");
                if !want {
                    assert_eq!(t.first(0, need), None);
                }
            }
        };
        check(&t, &places);
        for p in [place(400, 1, 3), place(200, 8, 1), place(600, 2, 2)] {
            t.push(&p);
            places.push(p);
            check(&t, &places);
        }
        for (i, p) in [
            (2, place(0, 0, 0)),
            (0, place(100, 1, 1)),
            (1, place(50, 9, 5)),
        ] {
            t.set(i, &p);
            places[i] = p;
            check(&t, &places);
        }
    }

    /// A closed place is never offered, even for a request of nothing, until it is set again.
    #[test]
    fn a_closed_place_is_not_offered_until_set_again() {
        let mut t = FirstFit::default();
        for cpu in [900, 500, 900] {
            t.push(&r(cpu));
        }
        t.close(0);
        assert_eq!(t.first(0, &r(100)), Some(1));
        assert_eq!(t.first(0, &r(600)), Some(2));
        t.close(2);
        assert_eq!(t.first(0, &r(600)), None);
        assert!(!t.may_take(&r(600)));
        assert_eq!(t.first(0, &r(0)), Some(1));
        t.set(0, &r(900));
        assert_eq!(t.first(0, &r(600)), Some(0));
    }

    /// No single place holds all three of a request while each branch's maxima do, together:
    /// the search passes them and finds the first place that does.
    #[test]
    fn first_passes_branches_whose_maxima_come_from_different_places() {
        let place = |cpu_milli, memory| Resources {
            cpu_milli,
            memory,
            pods: 1,
            ..Resources::default()
        };
        let mut t = FirstFit::default();
        for (cpu, memory) in [(900, 1), (100, 9), (900, 2), (200, 9), (600, 6), (900, 9)] {
            t.push(&place(cpu, memory));
        }
        assert_eq!(t.first(0, &place(500, 5)), Some(4));
        assert_eq!(t.first(0, &place(800, 8)), Some(5));
        assert_eq!(t.first(0, &place(950, 1)), None);
        t.set(5, &place(0, 0));
        t.set(4, &place(500, 4));
        assert_eq!(t.first(0, &place(500, 5)), None);
        assert_eq!(t.first(0, &place(100, 9)), Some(1));
    }

    #[test]
    fn first_where_skips_and_stops_as_the_probe_says() {
        let mut t = FirstFit::default();
        for cpu in [100, 500, 300, 900] {
            t.push(&r(cpu));
        }
        let mut seen = Vec::new();
        let skip_odd = t.first_where(&r(200), |i| {
            seen.push(i);
            if i % 2 == 1 { Probe::Skip } else { Probe::Take }
        });
        // Place 0 is too small for the tree; 1 is skipped, 2 taken.
        assert_eq!((skip_odd, seen), (Some(2), vec![1, 2]));
        assert_eq!(t.first_where(&r(200), |_| Probe::Skip), None);
        assert_eq!(
            t.first_where(&r(200), |i| if i < 3 { Probe::Skip } else { Probe::Take }),
            Some(3)
        );
        assert_eq!(t.first_where(&r(200), |_| Probe::Stop), None);
        assert_eq!(t.first_where(&r(1000), |_| Probe::Take), None);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn res([cpu_milli, memory, pods]: [i64; 3]) -> Resources {
            Resources {
                cpu_milli,
                memory,
                pods,
                ..Resources::default()
            }
        }

        /// An update to the places: set place `i` (mod len) free to `room`, or close it.
        #[derive(Debug, Clone)]
        enum Change {
            Set(usize, [i64; 3]),
            Close(usize),
        }

        fn room() -> impl Strategy<Value = [i64; 3]> {
            [0i64..8, 0i64..8, 0i64..4]
        }

        fn change() -> impl Strategy<Value = Change> {
            prop_oneof![
                (any::<usize>(), room()).prop_map(|(i, r)| Change::Set(i, r)),
                any::<usize>().prop_map(Change::Close),
            ]
        }

        proptest! {
            /// After any pushes, sets and closes, `first` answers as a linear scan does: the
            /// first open place at or after `from` whose CPU, memory and pods all hold the need,
            /// so packing never puts a pod where it does not fit, nor passes over one where it does.
            #[test]
            fn first_is_the_first_that_fits(
                places in prop::collection::vec(room(), 0..40),
                changes in prop::collection::vec(change(), 0..20),
                need in room(),
                from in 0usize..45,
            ) {
                let mut tree = FirstFit::default();
                let mut reference: Vec<Option<[i64; 3]>> = Vec::new();
                for p in &places {
                    tree.push(&res(*p));
                    reference.push(Some(*p));
                }
                for c in &changes {
                    if reference.is_empty() {
                        break;
                    }
                    match c {
                        Change::Set(i, r) => {
                            let i = i % reference.len();
                            tree.set(i, &res(*r));
                            reference[i] = Some(*r);
                        }
                        Change::Close(i) => {
                            let i = i % reference.len();
                            tree.close(i);
                            reference[i] = None;
                        }
                    }
                }
                let want = reference
                    .iter()
                    .enumerate()
                    .skip(from)
                    .find(|(_, r)| r.is_some_and(|r| holds(&r, &need)))
                    .map(|(i, _)| i);
                prop_assert_eq!(tree.first(from, &res(need)), want);
                if let Some(i) = want {
                    prop_assert!(reference[i].is_some_and(|r| holds(&r, &need)));
                }
            }
        }
    }
}
