//! The pass a burst of pending pods calls for, as Karpenter's batcher does. A watch on the pods
//! no node holds (`spec.nodeName=`) says when the scheduler first finds no node for one (the
//! pods a scale-up is for, [`model::unschedulable`]); the pass comes `batch_idle` after the last
//! pod of a burst, and at most `batch_max` after its first, so that one pass sees the whole
//! burst. `scan_interval` stays the fallback: a watch that fails costs nothing but speed.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

use super::model;

/// The newly unschedulable pods, as they come.
pub(super) struct Pending {
    rx: mpsc::UnboundedReceiver<()>,
    _watch: crate::task::AbortOnDrop,
}

impl Pending {
    /// Watches the unbound pods with `client`.
    pub(super) fn watch(client: kube::Client) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let pods: Api<Pod> = Api::all(client);
            let cfg = watcher::Config::default().fields("spec.nodeName=");
            let events = watcher(pods, cfg).default_backoff();
            let mut news = News::default();
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(e) => {
                        if news.saw(e) && tx.send(()).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, "the watch of pending pods failed; passes come every scan_interval until it is back")
                    }
                }
            }
        });
        Self {
            rx,
            _watch: crate::task::AbortOnDrop(task),
        }
    }

    /// Forgets the pods seen so far: the pass about to start reads them all.
    pub(super) fn clear(&mut self) {
        while self.rx.try_recv().is_ok() {}
    }

    /// Resolves once a burst is over: `idle` after its last pod, or `max` after its first.
    /// Never without a pod (nor once the watch's task is gone).
    pub(super) async fn burst(&mut self, idle: Duration, max: Duration) {
        if self.rx.recv().await.is_none() {
            return std::future::pending().await;
        }
        let end = Instant::now() + max;
        loop {
            let quiet = (Instant::now() + idle).min(end);
            match tokio::time::timeout_at(quiet, self.rx.recv()).await {
                Ok(Some(())) => {}
                Ok(None) | Err(_) => return,
            }
        }
    }
}

/// The unschedulable pods seen, by UID, so that each counts once: the scheduler rewrites a
/// pending pod's condition each time it tries it again.
#[derive(Default)]
struct News {
    seen: HashSet<String>,
    /// While the watch lists again: what was seen before, so that only new pods count.
    before: Option<HashSet<String>>,
}

impl News {
    /// Takes in one event; `true` when it brings a pod newly unschedulable.
    fn saw(&mut self, event: watcher::Event<Pod>) -> bool {
        match event {
            watcher::Event::Init => {
                self.before = Some(std::mem::take(&mut self.seen));
                false
            }
            watcher::Event::InitDone => {
                self.before = None;
                false
            }
            watcher::Event::InitApply(p) | watcher::Event::Apply(p) => {
                let Some(uid) = p.metadata.uid.clone() else {
                    return false;
                };
                if !model::unschedulable(&p) {
                    return false;
                }
                let known = self.before.as_ref().is_some_and(|b| b.contains(&uid));
                self.seen.insert(uid) && !known
            }
            watcher::Event::Delete(p) => {
                if let Some(uid) = &p.metadata.uid {
                    self.seen.remove(uid);
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, unschedulable: bool) -> Pod {
        let status = if unschedulable { "False" } else { "True" };
        serde_json::from_value(json!({
            "metadata": {"name": uid, "uid": uid},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": status, "reason": "Unschedulable"}]}
        }))
        .expect("pod")
    }

    /// A pod counts once, when the scheduler first finds no node for it; again only after it
    /// left the watch's view (bound or deleted); a re-list counts only the pods it had not seen.
    #[test]
    fn each_unschedulable_pod_counts_once() {
        use watcher::Event::*;
        let mut n = News::default();
        assert!(
            !n.saw(Apply(pod("a", false))),
            "not yet tried by the scheduler"
        );
        assert!(n.saw(Apply(pod("a", true))));
        assert!(
            !n.saw(Apply(pod("a", true))),
            "the scheduler tried it again"
        );
        assert!(n.saw(Apply(pod("b", true))));
        assert!(!n.saw(Delete(pod("a", true))));
        assert!(n.saw(Apply(pod("a", true))), "back in view after it left");
        assert!(!n.saw(Init));
        assert!(!n.saw(InitApply(pod("a", true))), "seen before the re-list");
        assert!(n.saw(InitApply(pod("c", true))), "new in the re-list");
        assert!(!n.saw(InitDone));
        // b was gone by the re-list: forgotten, and new when it comes back.
        assert!(n.saw(Apply(pod("b", true))));
    }

    /// A burst ends `idle` after its last pod, or `max` after its first.
    #[tokio::test(start_paused = true)]
    async fn a_burst_ends_when_quiet_or_at_its_cap() {
        let (tx, rx) = mpsc::unbounded_channel();
        let watch = crate::task::AbortOnDrop(tokio::spawn(async {}));
        let mut p = Pending { rx, _watch: watch };
        let (idle, max) = (Duration::from_secs(1), Duration::from_secs(10));
        // Three pods 0.5 s apart: over 1 s after the third.
        let t0 = Instant::now();
        let feed = {
            let tx = tx.clone();
            tokio::spawn(async move {
                for _ in 0..3 {
                    tx.send(()).expect("send");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            })
        };
        p.burst(idle, max).await;
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
        feed.await.expect("feed");
        // A pod every 0.5 s without end: over at the cap.
        let t1 = Instant::now();
        let _feed = crate::task::AbortOnDrop(tokio::spawn(async move {
            loop {
                if tx.send(()).is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }));
        p.burst(idle, max).await;
        assert_eq!(t1.elapsed(), Duration::from_secs(10));
        // What came during the pass is forgotten.
        p.clear();
        assert!(p.rx.try_recv().is_err());
    }
}
