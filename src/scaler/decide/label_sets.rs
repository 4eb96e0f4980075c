//! The pods' distinct (namespace, labels) pairs, each given an id, so the topology counters
//! match a pair once rather than once per pod: the pods of one workload share both. At 150,000
//! running pods, reading and hashing every pod's namespace and labels in a pass of their own
//! was a quarter of `decide`; the ids are taken in the pass that already reads each pod for its
//! node, while its memory is at hand.

use std::collections::BTreeMap;

use super::FastMap;

/// A pod's namespace and labels.
pub(super) type LabelSet<'a> = (&'a str, &'a BTreeMap<String, String>);

/// Distinct label sets by id: see the module documentation.
#[derive(Default)]
pub(super) struct LabelSets<'a> {
    sets: Vec<LabelSet<'a>>,
    ids: FastMap<LabelSet<'a>, usize>,
}

impl<'a> LabelSets<'a> {
    /// The id of `set`, a new one when it was not seen before: ids count up from 0 in the order
    /// the sets are first seen.
    pub(super) fn id(&mut self, set: LabelSet<'a>) -> usize {
        let next = self.sets.len();
        *self.ids.entry(set).or_insert_with(|| {
            self.sets.push(set);
            next
        })
    }

    /// The sets, in id order.
    pub(super) fn sets(&self) -> &[LabelSet<'a>] {
        &self.sets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two pods get the same id exactly when their namespaces and labels are equal, and an id
    /// names the set it was given for.
    #[test]
    fn equal_sets_and_only_those_share_an_id() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let maps = [
            labels(&[]),
            labels(&[("app", "web")]),
            labels(&[("app", "web"), ("tier", "front")]),
            labels(&[("app", "db")]),
            // Equal to the second, but another map.
            labels(&[("app", "web")]),
        ];
        let pods: Vec<LabelSet<'_>> = ["default", "other", "default"]
            .iter()
            .flat_map(|ns| maps.iter().map(move |m| (*ns, m)))
            .collect();
        let mut index = LabelSets::default();
        let ids: Vec<usize> = pods.iter().map(|&p| index.id(p)).collect();
        for (a, pa) in pods.iter().enumerate() {
            assert_eq!(index.sets()[ids[a]], *pa);
            for (b, pb) in pods.iter().enumerate() {
                assert_eq!(ids[a] == ids[b], pa == pb, "{pa:?} {pb:?}");
            }
        }
        // Ids count up in first-seen order: 2 namespaces × 4 distinct maps.
        assert_eq!(index.sets().len(), 8);
        assert_eq!(&ids[..5], &[0, 1, 2, 3, 1]);
        assert_eq!(&ids[5..10], &[4, 5, 6, 7, 5]);
        assert_eq!(&ids[10..], &ids[..5]);
    }
}
