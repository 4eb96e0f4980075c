//! Kubernetes Events, the one place nodeward tells a cluster's users what it did to a node or a
//! pod (`kubectl describe node` shows them). Publishing is best effort: an Event that cannot be
//! written is logged and never fails the drain, gate or scale-up that wanted to report it.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::warn;

/// The API refuses Event notes over 1 kB.
pub const NOTE_MAX: usize = 1000;

/// A recorder reporting as `controller` from this host (or `instance`, when given).
pub fn recorder(client: &kube::Client, controller: &str, instance: Option<String>) -> Recorder {
    let reporter = Reporter {
        controller: controller.into(),
        instance: instance.or_else(hostname),
    };
    Recorder::new(client.clone(), reporter)
}

/// This machine's hostname, the reporter instance of its Events.
pub fn hostname() -> Option<String> {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
}

/// `note` cut to [`NOTE_MAX`] bytes on a character boundary.
pub fn fit_note(mut note: String) -> String {
    truncate_at_char(&mut note, NOTE_MAX);
    note
}

/// Cuts `s` to at most `max` bytes, on a character boundary.
pub fn truncate_at_char(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

/// Publishes one Event about `reference`; failures are logged, not returned.
pub async fn publish(
    recorder: &Recorder,
    reference: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(fit_note(note)),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, reference).await {
        warn!(reason, object = ?reference.name, error = %e, "cannot publish event");
    }
}

/// [`publish`] in a task of its own, for callers that must not wait on the API server (a drain).
pub fn publish_detached(
    recorder: &Recorder,
    reference: ObjectReference,
    type_: EventType,
    reason: &'static str,
    action: &'static str,
    note: String,
) {
    let recorder = recorder.clone();
    tokio::spawn(async move {
        publish(&recorder, &reference, type_, reason, action, note).await;
    });
}

/// Publishes one Event about Node `node` from nodeward on this host: `action` is what nodeward
/// was doing (`Gate`, `Reboot`), `warning` its type.
pub async fn node_event(
    client: &kube::Client,
    node: &str,
    warning: bool,
    reason: &str,
    action: &str,
    note: String,
) {
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        ..ObjectReference::default()
    };
    let type_ = if warning {
        EventType::Warning
    } else {
        EventType::Normal
    };
    publish(
        &recorder(client, "nodeward", None),
        &reference,
        type_,
        reason,
        action,
        note,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_on_a_character_boundary() {
        assert_eq!(fit_note("short".into()), "short");
        let long = "é".repeat(NOTE_MAX);
        let cut = fit_note(long);
        assert!(cut.len() <= NOTE_MAX && cut.len() >= NOTE_MAX - 1);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
