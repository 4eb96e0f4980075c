//! A watched set of objects kept the way kube-runtime's reflector keeps it, for event loops that
//! select over several watches and need the objects in hand (the drain, the agent).
//!
//! [`Mirror`] is kube-runtime's store `Writer`, fed one watcher event at a time (a relist
//! replaces the whole set, so objects deleted while the watch was down disappear too), plus
//! whether the first list has arrived: until then, an empty set means "not known yet", not
//! "nothing there".

use std::hash::Hash;
use std::sync::Arc;

use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::watcher;

/// A live copy of watched objects.
pub struct Mirror<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    writer: Writer<K>,
    reader: Store<K>,
    synced: bool,
}

impl<K> Default for Mirror<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    fn default() -> Self {
        let writer = Writer::default();
        Self {
            reader: writer.as_reader(),
            writer,
            synced: false,
        }
    }
}

impl<K> Mirror<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    /// Applies one watcher event.
    pub fn apply(&mut self, event: &watcher::Event<K>) {
        self.writer.apply_watcher_event(event);
        if matches!(event, watcher::Event::InitDone) {
            self.synced = true;
        }
    }

    /// A watch failed, perhaps in the middle of a relist: what that relist delivered so far is
    /// dropped, so the next one starts clean (for streams that filter out `Init`).
    pub fn abandon_relist(&mut self) {
        self.writer.apply_watcher_event(&watcher::Event::Init);
    }

    /// The first list has arrived.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Every object.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.reader.state()
    }

    /// The object `name` in `namespace` (`None` for cluster-scoped kinds).
    pub fn get(&self, name: &str, namespace: Option<&str>) -> Option<Arc<K>> {
        let mut key = ObjectRef::new(name);
        if let Some(ns) = namespace {
            key = key.within(ns);
        }
        self.reader.get(&key)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;

    fn pod(name: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"}})).expect("pod")
    }

    #[test]
    fn a_relist_replaces_the_set_and_marks_it_synced() {
        let mut m = Mirror::<Pod>::default();
        m.apply(&watcher::Event::Apply(pod("a")));
        assert!(
            !m.synced(),
            "an event before the first list does not make it synced"
        );
        m.apply(&watcher::Event::Init);
        m.apply(&watcher::Event::InitApply(pod("b")));
        assert!(
            m.get("b", Some("ns")).is_none(),
            "a relist shows when it is done"
        );
        m.apply(&watcher::Event::InitDone);
        assert!(m.synced());
        assert!(
            m.get("a", Some("ns")).is_none(),
            "deleted while the watch was down"
        );
        assert!(m.get("b", Some("ns")).is_some());
        m.apply(&watcher::Event::Delete(pod("b")));
        assert!(m.state().is_empty());
    }
}
