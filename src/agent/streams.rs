//! Small pieces the event loop selects on: its own watches, and futures that wait forever when
//! there is nothing to wait for.

use super::*;

/// A cluster-wide watch of `K` narrowed by `fields`, without `Init` (see `Agent::watches`), with
/// kube's backoff.
pub(super) fn own_watch<K>(client: &kube::Client, fields: &str) -> WatchStream<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    watcher(
        Api::<K>::all(client.clone()),
        watcher::Config::default().fields(fields),
    )
    .filter(not_init)
    .default_backoff()
    .boxed()
}

pub(super) fn not_init<K>(ev: &watcher::Result<watcher::Event<K>>) -> std::future::Ready<bool> {
    std::future::ready(!matches!(ev, Ok(watcher::Event::Init)))
}

/// The next change of a watched value, or never when there is none to watch.
pub(super) async fn changed_or_pending<T>(
    rx: &mut Option<tokio::sync::watch::Receiver<T>>,
) -> Result<(), tokio::sync::watch::error::RecvError> {
    match rx.as_mut() {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
    }
}

pub(super) async fn next_or_pending<T>(s: &mut Option<BoxStream<'static, T>>) -> Option<T> {
    match s {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

pub(super) async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
