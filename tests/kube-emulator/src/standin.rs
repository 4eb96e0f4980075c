//! Stand-ins for controllers the emulator does not run, for tests that need their effect.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::task::JoinHandle;

use crate::{EmulatorHandle, PodSeed};

/// How often the stand-in looks at the pods: fast enough that a budget reopens within a few
/// milliseconds of a pod starting to terminate, as a real ReplicaSet controller's would.
const REPLACER_PERIOD: Duration = Duration::from_millis(5);

/// A stand-in ReplicaSet controller: every pod in `namespace` on `from_node` that starts
/// terminating gets a Ready replacement `<name>-r` on `to_node`, with the same labels and
/// controller owner, so the PodDisruptionBudgets that select it can reopen. Abort the handle to
/// stop it.
pub fn replace_terminating(
    emu: &Arc<EmulatorHandle>,
    namespace: &str,
    from_node: &str,
    to_node: &str,
) -> JoinHandle<()> {
    let (emu, ns, from, to) = (
        Arc::clone(emu),
        namespace.to_string(),
        from_node.to_string(),
        to_node.to_string(),
    );
    tokio::spawn(async move {
        let mut replaced = HashSet::new();
        loop {
            for p in emu.list("pods", Some(&ns)) {
                let str_at = |ptr: &str| p.pointer(ptr).and_then(Value::as_str).unwrap_or_default();
                let name = str_at("/metadata/name").to_string();
                let terminating = p.pointer("/metadata/deletionTimestamp").is_some();
                if !terminating
                    || str_at("/spec/nodeName") != from
                    || !replaced.insert(name.clone())
                {
                    continue;
                }
                let mut seed = PodSeed::new(&ns, &format!("{name}-r"))
                    .node(&to)
                    .ready(true);
                if let Some(labels) = p.pointer("/metadata/labels").and_then(Value::as_object) {
                    for (k, v) in labels {
                        seed = seed.label(k, v.as_str().unwrap_or_default());
                    }
                }
                let owner = p
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .and_then(|refs| refs.iter().find(|r| r["controller"] == Value::Bool(true)));
                if let Some(o) = owner {
                    seed = seed.owner(
                        o["kind"].as_str().unwrap_or_default(),
                        o["name"].as_str().unwrap_or_default(),
                    );
                }
                // A failed create (namespace gone at teardown) only means no replacement.
                let _ = emu.seed_pod(seed);
            }
            tokio::time::sleep(REPLACER_PERIOD).await;
        }
    })
}
