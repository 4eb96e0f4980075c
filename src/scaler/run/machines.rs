//! Machines deleted at the provider (fenced by the Lease), their Nodes, and repair of machines that
//! never registered.

use super::*;

impl<P: Provider + 'static> Inner<P> {
    /// Deletes `machine` at the provider if this replica still leads ([`Self::fenced`]);
    /// `None` when it does not.
    pub(super) async fn delete_machine(
        &self,
        group: &str,
        machine: &str,
    ) -> Option<provider::Result<()>> {
        if !self
            .fenced(group, &format!("delete machine {machine}"))
            .await
        {
            return None;
        }
        Some(self.provider.delete(machine).await)
    }

    /// Whether this replica may do an irreversible act now ([`Elector::confirm`]): create or
    /// delete a machine, mint a token, delete a Node. A refusal is logged with what was not
    /// done and counted as failure kind `fenced`.
    pub(super) async fn fenced(&self, group: &str, act: &str) -> bool {
        match self.elector.confirm().await {
            Ok(()) => true,
            Err(e) => {
                self.metrics
                    .failures
                    .get_or_create(&metrics::failure(group, "fenced"))
                    .inc();
                warn!(group, act, error = %e, "not acting: leadership is not confirmed");
                false
            }
        }
    }

    pub(super) async fn delete_node(&self, node: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        match nodes.delete(node, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => warn!(node, error = %e, "cannot delete the Node"),
        }
    }

    pub(super) async fn repair(
        &self,
        group: &str,
        machine: &str,
        node: Option<&str>,
        reason: decide::RepairReason,
    ) {
        warn!(group, machine, node, %reason, "deleting a broken machine");
        if let Some(n) = node {
            self.event(
                &node_ref(n),
                EventType::Warning,
                "DeletingBrokenMachine",
                "Repair",
                format!("nodeward scaler deletes machine {machine}: {reason}"),
            )
            .await;
        }
        let Some(deleted) = self.delete_machine(group, machine).await else {
            return;
        };
        match deleted {
            Ok(()) => {
                if let Some(n) = node {
                    self.delete_node(n).await;
                }
            }
            Err(e) => {
                self.metrics
                    .failures
                    .get_or_create(&metrics::failure(group, "repair"))
                    .inc();
                warn!(group, machine, error = %e, "cannot delete the broken machine; retrying next pass");
            }
        }
    }
}
