//! Streaming a watch: initial ADDED events, history replay, live events with selector
//! transitions, bookmarks and the request timeout.
//!
//! Each watch runs as one task that writes newline-delimited JSON into the response body.
//! Selectors are applied here, off the store lock, the way the apiserver's cacher does it per
//! watcher: an object that stops matching is sent as DELETED (its previous state at the new
//! resourceVersion), one that starts matching as ADDED. Events already waiting are written
//! together in one chunk, so a busy watch costs one write per batch rather than per event.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::resources::ResourceDef;
use crate::store::{Event, EventType, Filter, Obj, Store, WatchStart, event_line};

/// Flush a batch once it holds this many bytes; bounds the memory of one chunk while keeping
/// writes large.
const MAX_CHUNK_BYTES: usize = 256 * 1024;

/// Events taken from the queue per batch before writing.
const MAX_BATCH_EVENTS: usize = 1024;

/// Chunks buffered between the watch task and the connection; small, so a slow reader pushes
/// back on its own watch only.
pub const OUT_CHUNKS: usize = 8;

/// Settings of one watch.
#[derive(Debug, Clone)]
pub struct WatchParams {
    /// The resource.
    pub def: &'static ResourceDef,
    /// Selector filter.
    pub filter: Filter,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: end the initial events with the `k8s.io/initial-events-end`
    /// bookmark.
    pub initial_events_end: bool,
    /// How long the watch lasts.
    pub timeout: Duration,
    /// How often a bookmark is sent.
    pub bookmark_interval: Duration,
    /// Send objects as one-row Tables (kubectl's human-readable `get --watch`).
    pub table: bool,
}

/// A BOOKMARK event line.
pub fn bookmark_line(def: &ResourceDef, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": def.kind, "apiVersion": def.api_version(), "metadata": meta});
    event_line("BOOKMARK", obj.to_string().as_bytes())
}

/// An ERROR event line carrying a Status.
pub fn error_line(status: &Value) -> Bytes {
    event_line("ERROR", status.to_string().as_bytes())
}

/// What a filtered event turns into.
enum Emit<'a> {
    /// The event as it is.
    Same(&'a Event),
    /// The object, sent as ADDED (it started matching).
    Added(&'a Obj),
    /// The previous state at the event's version, sent as DELETED (it stopped matching).
    Deleted(Obj),
}

/// What to send for an event under a filter, if anything.
fn filtered<'a>(filter: &Filter, ev: &'a Event) -> Option<Emit<'a>> {
    let now = filter.matches(&ev.obj.value);
    match ev.kind {
        EventType::Added | EventType::Deleted => now.then_some(Emit::Same(ev)),
        EventType::Modified => {
            let before = ev.old.as_ref().is_some_and(|o| filter.matches(&o.value));
            match (before, now) {
                (true, true) => Some(Emit::Same(ev)),
                (false, true) => Some(Emit::Added(&ev.obj)),
                (true, false) => {
                    let old = ev.old.as_ref()?;
                    let mut v = old.value.clone();
                    v["metadata"]["resourceVersion"] = json!(ev.rv.to_string());
                    let bytes = Bytes::from(v.to_string());
                    Some(Emit::Deleted(Obj {
                        value: v,
                        bytes,
                        rv: ev.rv,
                    }))
                }
                (false, false) => None,
            }
        }
    }
}

/// The watch line for an emitted event, as a Table row when `table` is set.
fn render(emit: &Emit<'_>, table: Option<&ResourceDef>) -> Bytes {
    let (kind, obj) = match emit {
        Emit::Same(ev) => {
            if table.is_none() {
                return ev.line();
            }
            (ev.kind.as_str(), ev.obj.as_ref())
        }
        Emit::Added(obj) => ("ADDED", *obj),
        Emit::Deleted(obj) => ("DELETED", obj),
    };
    match table {
        Some(def) => event_line(
            kind,
            crate::table::object_table(def, obj).to_string().as_bytes(),
        ),
        None => event_line(kind, &obj.bytes),
    }
}

/// Runs a watch, writing chunks to `out` until the timeout, a close, or the client leaves.
pub async fn run(
    store: Arc<Store>,
    start: WatchStart,
    params: WatchParams,
    close: CancellationToken,
    out: mpsc::Sender<Bytes>,
) {
    let WatchStart {
        initial,
        history,
        mut rx,
        start_rv,
    } = start;
    let deadline = tokio::time::sleep(params.timeout);
    tokio::pin!(deadline);
    let mut buf = BytesMut::new();
    let send = |buf: &mut BytesMut| {
        let chunk = buf.split().freeze();
        let out = out.clone();
        async move { chunk.is_empty() || out.send(chunk).await.is_ok() }
    };
    let initial: Vec<Arc<Obj>> = initial;
    let table = params.table.then_some(params.def);
    for obj in &initial {
        buf.extend_from_slice(&render(&Emit::Added(obj), table));
        if buf.len() >= MAX_CHUNK_BYTES && !send(&mut buf).await {
            return;
        }
    }
    drop(initial);
    for ev in &history {
        if let Some(emit) = filtered(&params.filter, ev) {
            buf.extend_from_slice(&render(&emit, table));
        }
        if buf.len() >= MAX_CHUNK_BYTES && !send(&mut buf).await {
            return;
        }
    }
    if params.initial_events_end {
        buf.extend_from_slice(&bookmark_line(params.def, start_rv, true));
    }
    if !send(&mut buf).await {
        return;
    }
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + params.bookmark_interval,
        params.bookmark_interval,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = close.cancelled() => break,
            () = &mut deadline => break,
            () = out.closed() => break,
            ev = rx.recv() => {
                let Some(ev) = ev else { break };
                let mut n = 0;
                let mut next = Some(ev);
                while let Some(ev) = next.take() {
                    if let Some(emit) = filtered(&params.filter, &ev) {
                        buf.extend_from_slice(&render(&emit, table));
                    }
                    n += 1;
                    if n < MAX_BATCH_EVENTS && buf.len() < MAX_CHUNK_BYTES {
                        next = rx.try_recv().ok();
                    }
                }
                if !send(&mut buf).await {
                    break;
                }
            }
            _ = tick.tick(), if params.bookmarks => {
                // Read the version first: if the queue is then empty, every event up to it has
                // been delivered, so resuming from it loses nothing.
                let rv = store.current_rv();
                if rx.is_empty() {
                    buf.extend_from_slice(&bookmark_line(params.def, rv, false));
                    if !send(&mut buf).await {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{PODS, RESOURCES};
    use crate::selectors::LabelSelector;

    #[test]
    fn bookmark_shape() {
        let line = bookmark_line(&RESOURCES[PODS], 7, true);
        let v: Value = serde_json::from_slice(&line).expect("json");
        assert_eq!(v["type"], "BOOKMARK");
        assert_eq!(v["object"]["metadata"]["resourceVersion"], "7");
        assert_eq!(
            v["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
        assert_eq!(v["object"]["kind"], "Pod");
    }

    #[test]
    fn selector_transitions() {
        let filter = Filter {
            labels: LabelSelector::parse("app=a").expect("sel"),
            ..Filter::default()
        };
        let mk = |labels: Value, rv: u64| {
            let v = json!({"metadata": {"name": "p", "labels": labels, "resourceVersion": rv.to_string()}});
            let bytes = Bytes::from(v.to_string());
            Arc::new(Obj {
                value: v,
                bytes,
                rv,
            })
        };
        let ev =
            |old: Arc<Obj>, new: Arc<Obj>| Event::for_test(EventType::Modified, new, Some(old));
        let parse = |e: Emit<'_>| serde_json::from_slice::<Value>(&render(&e, None)).expect("json");
        let e1 = ev(mk(json!({"app": "a"}), 1), mk(json!({"app": "b"}), 2));
        let out = filtered(&filter, &e1).map(parse).expect("sent");
        assert_eq!(out["type"], "DELETED");
        assert_eq!(out["object"]["metadata"]["labels"]["app"], "a");
        assert_eq!(out["object"]["metadata"]["resourceVersion"], "2");
        let e2 = ev(mk(json!({"app": "b"}), 1), mk(json!({"app": "a"}), 2));
        let out = filtered(&filter, &e2).map(parse).expect("sent");
        assert_eq!(out["type"], "ADDED");
        assert!(filtered(&filter, &ev(mk(json!({}), 1), mk(json!({}), 2))).is_none());
    }
}
