//! A node's index by name, looked up once per pod: at 150,000 pods the SipHash of every pod's
//! `spec.nodeName` was a fifth of `decide`. Names are looked up in a direct-mapped table first,
//! its slot chosen by a cheap multiplicative hash of the name; a slot holds one node index, and a
//! hit counts only when that node's name equals the one looked up. Anything else — an empty
//! slot, another name in it, a name no node has — goes to the SipHash map. The cheap hash is not
//! DoS-resistant and need not be: names that collide on purpose only send their lookups to the
//! map, one failed comparison later, and nothing is ever probed past its slot.
//!
//! The comparison reads the table's own copy of the names, laid end to end in one buffer (about
//! 12 bytes a node: 180 KB at 15,000 nodes, cache-resident), not each Node's name where it was
//! allocated: that was a cache miss per pod, and the largest single cost of the pass over 450,000
//! pods.

use std::collections::HashMap;

/// Table slots per node: a quarter of the slots taken leaves about one name in fourteen sharing
/// a slot, whose lookups then take the map.
const SLOTS_PER_NODE: usize = 4;

/// No node in this slot.
const EMPTY: u32 = u32::MAX;

/// Node indices by name: see the module documentation.
pub(super) struct NodeIndex<'a> {
    /// Every name, end to end; node `i`'s is `arena[ends[i - 1]..ends[i]]` (from 0 for the first).
    arena: String,
    ends: Vec<usize>,
    by_name: HashMap<&'a str, usize>,
    /// Per slot, the index of the last node whose name hashes to it, or [`EMPTY`].
    slots: Vec<u32>,
    /// `64 - log2(slots.len())`: the hash's top bits pick the slot.
    shift: u32,
}

impl<'a> NodeIndex<'a> {
    /// Indexes `names` by position. A name listed twice gets its last position, as in a map
    /// collected from them.
    pub(super) fn new(names: impl IntoIterator<Item = &'a str>) -> Self {
        let names: Vec<&str> = names.into_iter().collect();
        let by_name: HashMap<&str, usize> =
            names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let mut arena = String::with_capacity(names.iter().map(|n| n.len()).sum());
        let ends = names
            .iter()
            .map(|n| {
                arena.push_str(n);
                arena.len()
            })
            .collect();
        let len = (names.len() * SLOTS_PER_NODE).next_power_of_two().max(2);
        let shift = 64 - len.trailing_zeros();
        let mut slots = vec![EMPTY; len];
        for (i, n) in names.iter().enumerate() {
            // A later node with the same slot replaces an earlier one, so a slot holds the last
            // position of its name, as `by_name` does.
            if let Ok(i) = u32::try_from(i)
                && i != EMPTY
            {
                slots[slot(n, shift)] = i;
            }
        }
        Self {
            arena,
            ends,
            by_name,
            slots,
            shift,
        }
    }

    /// The position of the node named `name`.
    pub(super) fn get(&self, name: &str) -> Option<usize> {
        let i = self.slots[slot(name, self.shift)];
        if i != EMPTY && self.name(i as usize) == Some(name) {
            return Some(i as usize);
        }
        self.by_name.get(name).copied()
    }

    /// Node `i`'s name, from the arena.
    fn name(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.arena.get(start..end)
    }
}

/// The table slot of `name`: its bytes eight at a time, each step a multiply by a 64-bit odd
/// constant (the golden ratio's), the top bits taken.
fn slot(name: &str, shift: u32) -> usize {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let bytes = name.as_bytes();
    let mut h = (bytes.len() as u64).wrapping_mul(K);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(word))
            .rotate_left(29)
            .wrapping_mul(K);
    }
    let rest = chunks.remainder();
    let mut word = [0u8; 8];
    word[..rest.len()].copy_from_slice(rest);
    h = (h ^ u64::from_le_bytes(word)).wrapping_mul(K);
    (h >> shift) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every lookup answers what the map collected from the names answers: for names present,
    /// listed twice, absent, empty, and names forced into one slot.
    #[test]
    fn answers_what_a_map_of_the_names_answers() {
        let mut names: Vec<String> = (0..3000)
            .map(|i| format!("pool-{}-node-{i:04}", i % 7))
            .collect();
        names.extend(["dup".to_string(), String::new(), "dup".to_string()]);
        names.push("ip-10-0-1-23.eu-west-1.compute.internal".into());
        let index = NodeIndex::new(names.iter().map(String::as_str));
        let map: HashMap<&str, usize> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i))
            .collect();
        let mut queries: Vec<String> = names.clone();
        queries.extend((0..500).map(|i| format!("pool-{}-node-{i:04}x", i % 7)));
        queries.extend(["absent".into(), "pool-0-node-000".into()]);
        for q in &queries {
            assert_eq!(index.get(q), map.get(q.as_str()).copied(), "{q:?}");
        }
        assert_eq!(index.get("dup"), Some(3002));

        // A table of two slots: most names share one, and every lookup still finds its node.
        let few: Vec<String> = (0..40).map(|i| format!("n{i}")).collect();
        let mut index = NodeIndex::new(few.iter().map(String::as_str));
        index.slots.truncate(2);
        index.shift = 63;
        for (i, n) in few.iter().enumerate() {
            assert_eq!(index.get(n), Some(i), "{n}");
        }
        assert_eq!(index.get("n40"), None);
    }
}
