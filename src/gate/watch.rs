//! The I/O half of the gates: reading watched files, re-arming inotify as directories appear,
//! probing http gates, and turning watched Kubernetes objects into [`Facts`](super::Facts).
//!
//! inotify watches a directory, not a path that does not exist yet: `/run/flannel` appears only
//! when flannel starts. So each file gate watches the deepest ancestor that exists, and every
//! event re-arms the watches one level deeper when a directory has appeared. Watching the
//! directory (never the file) also sees a file replaced by rename, which is how flannel and most
//! tools write atomically.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use notify::Watcher;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::{FileFact, HttpFact, PodFact};

/// Content read from a gate file; subnet files are a few hundred bytes, and a regex over more
/// than this would only slow the agent down.
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// Errors setting up inotify.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// inotify could not be initialised (no more instances: `fs.inotify.max_user_instances`).
    #[error("cannot start inotify: {0}")]
    Init(#[source] notify::Error),
    /// A directory could not be watched (no more watches: `fs.inotify.max_user_watches`).
    #[error("cannot watch {}: {source}", dir.display())]
    Watch {
        /// The directory.
        dir: PathBuf,
        /// What inotify said.
        #[source]
        source: notify::Error,
    },
}

/// Watches the directories of the file gates; every change in one sends `()` on the channel.
pub struct FileWatcher {
    watcher: notify::RecommendedWatcher,
    paths: Vec<PathBuf>,
    watched: BTreeSet<PathBuf>,
}

impl std::fmt::Debug for FileWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWatcher")
            .field("paths", &self.paths)
            .field("watched", &self.watched)
            .finish_non_exhaustive()
    }
}

impl FileWatcher {
    /// Starts watching for `paths`; changes are announced on `tx`. Only changes to those paths
    /// or to a directory on the way to one are: a watched directory also holds other files (the
    /// agent's own status files beside a reboot request), whose writes must not wake anyone.
    pub fn new(paths: Vec<PathBuf>, tx: mpsc::UnboundedSender<()>) -> Result<Self, Error> {
        let wanted = paths.clone();
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            match res {
                // Opening, reading and closing a file changes nothing, and the agent's own reads
                // would otherwise feed back into endless re-reads.
                Ok(ev) if matches!(ev.kind, notify::EventKind::Access(_)) => return,
                Ok(ev) if !concerns(&ev, &wanted) => return,
                Ok(ev) => debug!(kind = ?ev.kind, paths = ?ev.paths, "file event"),
                Err(e) => warn!(error = %e, "inotify error; re-reading the gate files"),
            }
            // The receiver going away means the agent is stopping.
            let _ = tx.send(());
        })
        .map_err(Error::Init)?;
        let mut w = Self {
            watcher,
            paths,
            watched: BTreeSet::new(),
        };
        w.rearm()?;
        Ok(w)
    }

    /// Watches, for each path, its parent directory or else its deepest existing ancestor, and
    /// stops watching directories no longer needed. Call after every event, then read the files:
    /// a file created between the event and the new watch is then still seen.
    pub fn rearm(&mut self) -> Result<(), Error> {
        // Repeat until nothing changes: a directory created after `wanted` was computed but
        // before its parent's watch was added raised no event, so look again once the new
        // watches are in place.
        loop {
            let wanted: BTreeSet<PathBuf> =
                self.paths.iter().filter_map(|p| watch_dir(p)).collect();
            if wanted == self.watched {
                return Ok(());
            }
            for dir in self.watched.difference(&wanted) {
                // The directory may be gone already, which removed the watch with it.
                let _ = self.watcher.unwatch(dir);
            }
            for dir in wanted.difference(&self.watched) {
                self.watcher
                    .watch(dir, notify::RecursiveMode::NonRecursive)
                    .map_err(|source| Error::Watch {
                        dir: dir.clone(),
                        source,
                    })?;
                debug!(dir = %dir.display(), "watching");
            }
            self.watched = wanted;
        }
    }

    /// The current facts of every watched file.
    pub fn read_all(&self) -> BTreeMap<PathBuf, FileFact> {
        self.paths.iter().map(|p| (p.clone(), read(p))).collect()
    }
}

/// Whether `ev` may change one of `paths`: it names one of them or a directory on the way to
/// one (created, renamed, removed), or it names nothing (the kernel's queue overflowed: anything
/// may have changed).
fn concerns(ev: &notify::Event, paths: &[PathBuf]) -> bool {
    ev.paths.is_empty()
        || ev
            .paths
            .iter()
            .any(|p| paths.iter().any(|w| w.starts_with(p)))
}

/// The directory to watch for `path`: its parent if it exists, else the deepest existing
/// ancestor.
fn watch_dir(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .skip(1)
        .find(|a| a.is_dir())
        .map(Path::to_path_buf)
}

/// Reads one gate file.
pub fn read(path: &Path) -> FileFact {
    match std::fs::File::open(path) {
        Ok(f) => {
            let mut buf = Vec::new();
            match f.take(MAX_FILE_BYTES).read_to_end(&mut buf) {
                Ok(_) => FileFact::Present(String::from_utf8_lossy(&buf).into_owned()),
                Err(e) => FileFact::Unreadable(e.to_string()),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => FileFact::Missing,
        Err(e) => FileFact::Unreadable(e.to_string()),
    }
}

/// The http client for probes: plain HTTP/1, one connection per probe host kept alive.
pub type HttpClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Empty<bytes::Bytes>,
>;

/// A client for [`probe`].
pub fn http_client() -> HttpClient {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// GETs `url` within `timeout`.
pub async fn probe(client: &HttpClient, url: &hyper::Uri, timeout: Duration) -> HttpFact {
    match tokio::time::timeout(timeout, client.get(url.clone())).await {
        Ok(Ok(resp)) => HttpFact::Status(resp.status().as_u16()),
        Ok(Err(e)) => HttpFact::Failed(format!("no answer: {e}")),
        Err(_) => HttpFact::Failed(format!("no answer within {timeout:?}")),
    }
}

/// A watched pod as a gate fact.
pub fn pod_fact(p: &Pod) -> PodFact {
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    PodFact {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        labels: p.metadata.labels.clone().unwrap_or_default(),
        ready,
        terminating: p.metadata.deletion_timestamp.is_some(),
    }
}

/// The Node's conditions, type → status.
pub fn node_conditions(n: &Node) -> BTreeMap<String, String> {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file created in a directory that did not exist when watching began is seen: the
    /// ancestor's event re-arms the watch one level down.
    #[tokio::test]
    async fn sees_a_file_in_a_directory_created_later() {
        let root = tempfile::tempdir().expect("tempdir");
        let path = root.path().join("flannel/subnet.env");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut w = FileWatcher::new(vec![path.clone()], tx).expect("watch");
        assert_eq!(read(&path), FileFact::Missing);
        std::fs::create_dir(root.path().join("flannel")).expect("mkdir");
        rx.recv().await.expect("event for the new directory");
        w.rearm().expect("rearm");
        assert!(w.watched.contains(&root.path().join("flannel")));
        // Written atomically, as flannel does: a temp file renamed into place.
        let tmp = root.path().join("flannel/.subnet.tmp");
        std::fs::write(&tmp, "FLANNEL_SUBNET=10.244.1.1/24\n").expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        loop {
            rx.recv().await.expect("event");
            w.rearm().expect("rearm");
            if let FileFact::Present(c) = read(&path) {
                assert!(c.contains("FLANNEL_SUBNET="));
                break;
            }
        }
        assert_eq!(w.read_all().len(), 1);
        // Reading the file (as the agent does after every event) must not announce a change.
        while rx.try_recv().is_ok() {}
        // Ten reads: were access events not filtered, they alone would queue 20 (open and
        // close-nowrite each), far above the allowance below for stragglers of the rename.
        for _ in 0..10 {
            assert!(matches!(read(&path), FileFact::Present(_)));
        }
        // A write after the reads is the next thing the channel carries: sync with it.
        std::fs::write(&path, "FLANNEL_SUBNET=10.244.1.1/24\n").expect("write");
        rx.recv().await.expect("event for the write");
        let mut extra = 0;
        while rx.try_recv().is_ok() {
            extra += 1;
        }
        assert!(extra <= 5, "reads produced {extra} events");
    }

    /// Issue 58, item 6 (a): a file written beside a watched one (the agent's own
    /// `reboot.json` beside the reboot request in /run/nodeward) wakes nothing; the watched
    /// file itself does.
    #[tokio::test]
    async fn a_file_beside_a_watched_one_wakes_nothing() {
        let root = tempfile::tempdir().expect("tempdir");
        let request = root.path().join("reboot-request");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _w = FileWatcher::new(vec![request.clone()], tx).expect("watch");
        for i in 0..5 {
            let status = root.path().join("reboot.json");
            let tmp = root.path().join(".reboot.json.tmp");
            std::fs::write(&tmp, format!("{{\"n\": {i}}}")).expect("write");
            std::fs::rename(&tmp, &status).expect("rename");
        }
        let woke = tokio::time::timeout(std::time::Duration::from_millis(500), rx.recv()).await;
        assert!(
            woke.is_err(),
            "a write beside the watched file woke the watcher"
        );
        std::fs::write(&request, "operator\n").expect("write");
        tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
            .await
            .expect("the request's own write is seen")
            .expect("event");
    }
}
