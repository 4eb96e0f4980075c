//! What the coordinator says: its record and conditions on the Node (Kubernetes' maintenance
//! conditions with its own, [`crate::lifecycle`]), its Events, its status file and phase metric.

use super::*;

/// Writing what the coordinator says.
impl Coordinator {
    pub(super) async fn write_record(
        &self,
        client: &kube::Client,
        r: Option<&Record>,
    ) -> kube::Result<()> {
        let value = r.map(serde_json::to_string).transpose().unwrap_or_default();
        let patch = serde_json::json!({"metadata": {"annotations": {decide::RECORD: value}}});
        Api::<Node>::all(client.clone())
            .patch(
                &self.node,
                &crate::node_write::patch_params(),
                &Patch::Merge(&patch),
            )
            .await
            .map(drop)
    }

    /// The `nodeward.io/Reboot` condition of `m` (True while the reboot is under way) and, with
    /// `[conditions] lifecycle`, Kubernetes' maintenance conditions, in one write that keeps each
    /// one's `lastTransitionTime` while its status does not flip.
    pub(super) async fn condition(&self, client: &kube::Client, m: Moment<'_>) {
        let mut wants = vec![crate::reboot::condition_of(&m)];
        wants.extend(crate::lifecycle::wants(&m));
        let written =
            crate::lifecycle::write(client, &self.node, None, &wants, self.lifecycle).await;
        if let Err(e) = written {
            warn!(error = %e, "cannot write the nodeward.io/Reboot condition");
        }
    }

    pub(super) async fn event(
        &self,
        client: &kube::Client,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        crate::events::node_event(client, &self.node, warning, reason, "Reboot", note).await;
    }

    /// The status file and the phase metric.
    pub(super) fn show(
        &mut self,
        phase: &str,
        reason: Option<&str>,
        message: &str,
        slot: Option<&str>,
    ) {
        self.metrics.set_phase(phase);
        self.status.publish(RebootStatus {
            phase: phase.into(),
            reason: reason.map(str::to_string),
            message: message.into(),
            slot: slot.map(str::to_string),
            requested_since: self.requested_since.map(|t| t.to_string()),
            window: self.s.window.describe(),
            concurrency: self.s.concurrency,
        });
    }
}
