//! The kubelet stand-in: removes a gracefully deleted pod when its (scaled) grace period ends.
//!
//! A real kubelet stops the containers, reports the final status and then deletes the pod with
//! grace 0; here only the last step happens, at `deletionTimestamp` (with the grace period
//! multiplied by the emulator's grace scale, so a 30 s grace can last 30 ms in a test). A pod
//! that still has finalizers then stays, with `deletionGracePeriodSeconds: 0`, until they are
//! removed — as with the apiserver.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::store::{Key, KubeletJob, Store};

/// Runs until `shutdown`.
pub async fn run(
    store: Arc<Store>,
    mut jobs: mpsc::UnboundedReceiver<KubeletJob>,
    shutdown: CancellationToken,
) {
    let mut seq = 0u64;
    let mut due: BinaryHeap<Reverse<(tokio::time::Instant, u64, Key, String)>> = BinaryHeap::new();
    loop {
        let next = due.peek().map(|Reverse((at, ..))| *at);
        tokio::select! {
            () = shutdown.cancelled() => return,
            job = jobs.recv() => match job {
                Some(job) => {
                    seq += 1;
                    due.push(Reverse((job.deadline, seq, job.key, job.uid)));
                }
                None => return,
            },
            () = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                let now = tokio::time::Instant::now();
                while due.peek().is_some_and(|Reverse((at, ..))| *at <= now) {
                    if let Some(Reverse((_, _, key, uid))) = due.pop() {
                        store.kubelet_finish(&key, &uid);
                    }
                }
            }
        }
    }
}
