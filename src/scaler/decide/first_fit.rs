//! First-fit in O(log n): a segment tree over places (nodes, in their packing order) keeping the
//! largest free CPU, memory and pod slots below each branch, so a search skips every run of
//! places that cannot take a pod instead of testing them one by one. At 5,000 nodes and 10,000
//! pending pods the linear scan was most of scale-up's time. The tree only prunes on those three
//! dimensions; the caller still tests the exact fit (extended resources) and the rest.

use crate::scaler::resources::Resources;

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

/// Largest free CPU, memory and pods per branch; leaves past `len` hold `i64::MIN`.
#[derive(Debug, Clone, Default)]
pub(super) struct FirstFit {
    /// Leaves (a power of two, or 0).
    width: usize,
    len: usize,
    cpu: Vec<i64>,
    memory: Vec<i64>,
    pods: Vec<i64>,
}

impl FirstFit {
    /// Appends a place.
    pub(super) fn push(&mut self, free: &Resources) {
        if self.len == self.width {
            let width = (self.width * 2).max(1);
            let mut grown = Self {
                width,
                len: 0,
                cpu: vec![i64::MIN; 2 * width],
                memory: vec![i64::MIN; 2 * width],
                pods: vec![i64::MIN; 2 * width],
            };
            for i in 0..self.len {
                let leaf = self.width + i;
                grown.cpu[width + i] = self.cpu[leaf];
                grown.memory[width + i] = self.memory[leaf];
                grown.pods[width + i] = self.pods[leaf];
            }
            grown.len = self.len;
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
        let mut at = self.width + i;
        self.cpu[at] = free.cpu_milli;
        self.memory[at] = free.memory;
        self.pods[at] = free.pods;
        while at > 1 {
            at /= 2;
            self.pull(at);
        }
    }

    fn pull(&mut self, i: usize) {
        self.cpu[i] = self.cpu[2 * i].max(self.cpu[2 * i + 1]);
        self.memory[i] = self.memory[2 * i].max(self.memory[2 * i + 1]);
        self.pods[i] = self.pods[2 * i].max(self.pods[2 * i + 1]);
    }

    /// The first place at or after `from` whose free CPU, memory and pods may take `need`.
    pub(super) fn first(&self, from: usize, need: &Resources) -> Option<usize> {
        if from >= self.len {
            return None;
        }
        self.descend(1, 0, self.width, from, need)
    }

    /// Whether some place has as much free CPU as `need`, some as much memory and some as many
    /// pod slots. When not, [`first`](Self::first) finds no place for `need`, nor for any
    /// request at least as large in all three.
    pub(super) fn may_take(&self, need: &Resources) -> bool {
        self.len > 0
            && self.cpu[1] >= need.cpu_milli
            && self.memory[1] >= need.memory
            && self.pods[1] >= need.pods
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

    fn descend(
        &self,
        at: usize,
        lo: usize,
        hi: usize,
        from: usize,
        need: &Resources,
    ) -> Option<usize> {
        if hi <= from
            || self.cpu[at] < need.cpu_milli
            || self.memory[at] < need.memory
            || self.pods[at] < need.pods
        {
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
}
