//! After the reboot: wait until the node is back, lift the reboot's cordon, settle, give the
//! slot; and giving a reboot up.

use super::*;

/// Coming back, and giving back.
impl Coordinator {
    /// The node rebooted: wait until it is back, lift the reboot's cordon, settle, give the
    /// slot to the next node.
    pub(super) async fn back(&mut self, client: &kube::Client, me: &Node, r: Record) -> Duration {
        let due = self
            .renewed_at
            .is_none_or(|t| t.elapsed() >= self.s.lease_duration / 3);
        // Still ours (not taken over while the machine was down): renew it.
        if due && self.still_holds(&r.slot).await {
            self.renewed_at = Some(std::time::Instant::now());
        }
        let now = Timestamp::now();
        // The gates as this agent process judges them: the Node's nodeward.io/Ready may still say
        // True from before the reboot, until the new agent writes it.
        let gates_pass = self.gates_passing.get() == 1;
        let step = decide::back(
            returning(me, gates_pass),
            self.back_since,
            self.s.settle_time,
            now,
        );
        match step {
            BackStep::Wait(what) => {
                self.back_since = None;
                let msg = format!("rebooted; waiting for {what}");
                self.settling(client, &r, &msg).await;
            }
            BackStep::Uncordon => self.lift_cordon(client, "back").await,
            BackStep::Settle { since, until } => {
                self.back_since = Some(since);
                let msg = format!("back; the slot goes to the next node at {until}");
                self.settling(client, &r, &msg).await;
            }
            BackStep::Release => {
                self.done(client, &r).await;
                return self.s.period;
            }
        }
        BACK_POLL.min(self.s.period)
    }

    async fn settling(&mut self, client: &kube::Client, r: &Record, msg: &str) {
        let changed = self.status.phase() != Some("settling");
        self.show("settling", Some("Settling"), msg, Some(&r.slot));
        if changed {
            let underway = Moment::RebootUnderway {
                reason: "Settling",
                message: msg,
            };
            self.condition(client, underway).await;
            self.event(client, false, "RebootSettling", msg.to_string())
                .await;
        }
    }

    /// The reboot is over: give the slot, withdraw `nodeward reboot`'s request.
    async fn done(&mut self, client: &kube::Client, r: &Record) {
        if let Err(e) = std::fs::remove_file(&self.s.request_file)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(error = %e, file = %self.s.request_file.display(), "cannot remove the reboot request");
        }
        let took = self.took_at.take().or_else(|| r.since.parse().ok());
        if let Some(t) = took {
            let secs = Timestamp::now().duration_since(t).as_secs_f64();
            self.metrics.last_duration_seconds.set(secs);
        }
        self.back_since = None;
        self.end(
            client,
            r,
            "rebooted and back; slot given to the next node",
            "done",
        )
        .await;
    }

    /// Lifts the reboot's own cordon, never another's (an operator's `nodeward cordon`, a
    /// cluster shutdown's, a scale-down's: kept, and said).
    async fn lift_cordon(&self, client: &kube::Client, when: &str) {
        let by = crate::drain::Lifter::Reason(crate::reboot::CORDON_REASON);
        match crate::drain::exec::uncordon(client, &self.node, false, by).await {
            Ok(crate::drain::UncordonOutcome::Kept { reason }) => {
                info!(cordon = %reason, "{when}: the node is cordoned by another of nodeward's moments; its cordon stays");
            }
            Ok(outcome) => info!(?outcome, "{when}: the reboot's cordon lifted"),
            Err(crate::drain::exec::Error::CordonedByOther { who, .. }) => {
                info!(by = ?who, "{when}: cordoned by someone else; their cordon stays");
            }
            Err(e) => warn!(error = %e, "{when}: cannot lift the reboot's cordon"),
        }
    }

    /// Gives up the reboot: lift the cordon (the reboot's only), give the slot back, say why.
    pub(super) async fn give_back(
        &mut self,
        client: &kube::Client,
        r: &Record,
        why: &str,
        result: &str,
    ) {
        self.lift_cordon(client, "reboot given up").await;
        let msg = if result == "abandoned" {
            format!("not rebooting: {why}")
        } else {
            format!("not rebooting: {why}; trying again next period")
        };
        self.end(client, r, &msg, result).await;
    }

    /// Ends the reboot with `result`: record cleared, slot given back, said everywhere.
    /// `abandoned` (the request went away) is no failure; a failed drain or reboot is.
    async fn end(&mut self, client: &kube::Client, r: &Record, msg: &str, result: &str) {
        if let Err(e) = self.write_record(client, None).await {
            self.failed(&e);
        }
        self.release(&r.slot).await;
        self.renewed_at = None;
        self.metrics.ended(result);
        let (reason, warning) = match result {
            "done" => ("RebootDone", false),
            "abandoned" => ("RebootAbandoned", false),
            _ => ("RebootFailed", true),
        };
        info!(slot = %r.slot, result, "{msg}");
        let over = Moment::RebootOver {
            reason,
            message: msg,
        };
        self.condition(client, over).await;
        self.event(client, warning, reason, msg.to_string()).await;
        self.show("idle", Some(reason), msg, None);
    }
}

/// The returning node, as [`decide::back`] reads it, with the gates' verdict of this boot.
fn returning(n: &Node, gates_pass: bool) -> Return {
    let is_true = |t: &str| crate::node_write::condition(n, t).is_some_and(|c| c.status == "True");
    let cordon = if !crate::drain::cordon::is_cordoned(n) {
        Cordon::None
    } else if crate::drain::cordon::nodeward_cordon(n)
        .is_some_and(|r| r.is_for(crate::drain::Lifter::Reason(crate::reboot::CORDON_REASON)))
    {
        Cordon::Ours
    } else {
        Cordon::Other
    };
    Return {
        kubelet_ready: is_true("Ready"),
        gates_pass,
        startup_taint: crate::readiness::has_startup_taint(n),
        cordon,
    }
}
