//! The evidence a blocked budget's verdict reads ([`super::unsatisfiable`]), watched only from the
//! first pod a budget blocks: the cluster's Pending pods and the Nodes.

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use tracing::debug;

use crate::store::Mirror;

/// One of the [`Evidence`] watches' events.
pub(super) enum Seen {
    Pending(Box<watcher::Result<watcher::Event<Pod>>>),
    Node(Box<watcher::Result<watcher::Event<Node>>>),
}

/// What shows that a budget blocking a pod cannot open ([`super::unsatisfiable`]): the
/// cluster's Pending pods (its missing replicas, and whether the scheduler placed them) and the
/// Nodes (whether any other takes pods). Watched only from the first pod a budget blocks: most
/// drains never meet one. Evidence, not a precondition: a watch the drain may not make (an
/// operator's identity that cannot list Nodes) only means the drain waits, as before.
pub(super) struct Evidence<'a> {
    pub(super) events: BoxStream<'a, Seen>,
    pub(super) pending: Mirror<Pod>,
    pub(super) nodes: Mirror<Node>,
    started: bool,
}

impl Evidence<'_> {
    pub(super) fn idle() -> Self {
        Self {
            events: futures::stream::pending().boxed(),
            pending: Mirror::default(),
            nodes: Mirror::default(),
            started: false,
        }
    }

    pub(super) fn start(&mut self, client: &Client) {
        if self.started {
            return;
        }
        self.started = true;
        let pending = watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields("status.phase=Pending"),
        )
        .default_backoff()
        .map(|e| Seen::Pending(Box::new(e)));
        let nodes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .map(|e| Seen::Node(Box::new(e)));
        self.events = futures::stream::select(pending, nodes).boxed();
    }

    pub(super) fn apply(&mut self, seen: Seen, node: &str) {
        let error = match seen {
            Seen::Pending(ev) => match *ev {
                Ok(ev) => return self.pending.apply(&ev),
                Err(e) => e,
            },
            Seen::Node(ev) => match *ev {
                Ok(ev) => return self.nodes.apply(&ev),
                Err(e) => e,
            },
        };
        debug!(node, error = %error, "cannot watch what shows a budget cannot open; the drain waits for budgets as before");
    }
}
