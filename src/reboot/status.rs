//! What the coordinator says for `nodeward status`: a small JSON file beside the agent's status
//! file (`reboot.json`), written when it changes.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::warn;

/// The coordinator's state, as `nodeward status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebootStatus {
    /// `idle`, `waiting`, `draining`, `rebooting` or `settling`.
    pub phase: String,
    /// The `nodeward.io/Reboot` condition's reason, if any.
    pub reason: Option<String>,
    /// Why, in words.
    pub message: String,
    /// The slot held, if any.
    pub slot: Option<String>,
    /// When the pending request was first seen.
    pub requested_since: Option<String>,
    /// The maintenance window.
    pub window: String,
    /// Slots in the cluster.
    pub concurrency: u32,
}

/// The file's path for the agent's status file `status_file`.
pub fn path_beside(status_file: &Path) -> PathBuf {
    status_file.with_file_name("reboot.json")
}

/// Reads it (`None`: coordinated reboots off, or the agent has not written it yet).
pub fn read(path: &Path) -> Option<RebootStatus> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Writes the status when it changed.
#[derive(Debug)]
pub struct Writer {
    path: PathBuf,
    last: Option<RebootStatus>,
}

impl Writer {
    /// A writer to `path`.
    pub fn new(path: PathBuf) -> Self {
        Self { path, last: None }
    }

    /// The phase last published.
    pub fn phase(&self) -> Option<&str> {
        self.last.as_ref().map(|s| s.phase.as_str())
    }

    /// The reason last published.
    pub fn reason(&self) -> Option<&str> {
        self.last.as_ref().and_then(|s| s.reason.as_deref())
    }

    /// Writes `status` unless the file holds it already (a failed write is tried again).
    pub fn publish(&mut self, status: RebootStatus) {
        if self.last.as_ref() == Some(&status) {
            return;
        }
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let json = serde_json::to_vec_pretty(&status).unwrap_or_default();
        match crate::fsutil::write_private_atomic(&self.path, &json) {
            Ok(()) => self.last = Some(status),
            Err(e) => warn!(error = %e, "cannot write the reboot status"),
        }
    }
}

/// Lines for `nodeward status`.
pub fn lines(s: &RebootStatus) -> Vec<String> {
    let mut out = vec![format!(
        "reboot: {}{} — {}",
        s.phase,
        s.reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default(),
        s.message
    )];
    if let Some(slot) = &s.slot {
        out.push(format!("  slot: {slot}"));
    }
    if let Some(since) = &s.requested_since {
        out.push(format!("  asked for since: {since}"));
    }
    out.push(format!("  window: {}; slots: {}", s.window, s.concurrency));
    out
}

/// One slot as `nodeward status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SlotHolder {
    /// The slot's name.
    pub slot: String,
    /// Its holder; `None`: free.
    pub holder: Option<String>,
    /// When the holder last renewed it.
    pub renewed: Option<String>,
}

/// Who holds each slot.
pub async fn slots(client: &kube::Client, s: &crate::config::RebootSettings) -> Vec<SlotHolder> {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), &s.namespace);
    let mut out = Vec::new();
    for name in s.slot_names() {
        let view = api
            .get_opt(&name)
            .await
            .ok()
            .flatten()
            .map(|c| super::slot::view(&c));
        let holder = view.as_ref().and_then(|v| v.holder.clone());
        let renewed = view.and_then(|v| v.renewed).map(|t| t.to_string());
        out.push(SlotHolder {
            slot: name,
            holder,
            renewed,
        });
    }
    out
}

/// The reboot part of `nodeward status`'s text.
pub fn text(st: Option<&RebootStatus>, slots: Option<&[SlotHolder]>) -> String {
    let mut out = match st {
        Some(s) => lines(s),
        None => vec!["reboot: enabled; the agent has not reported yet".to_string()],
    };
    for s in slots.unwrap_or_default() {
        out.push(match &s.holder {
            Some(h) => format!(
                "  {}: held by {h} (renewed {})",
                s.slot,
                s.renewed.as_deref().unwrap_or("never")
            ),
            None => format!("  {}: free", s.slot),
        });
    }
    let mut text = out.join("\n");
    text.push('\n');
    text
}
