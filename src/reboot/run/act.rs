//! With a slot: record it, drain, reboot within `reboot_timeout`, the slot renewed all along.

use super::*;

/// Draining and rebooting.
impl Coordinator {
    pub(super) fn drain_options(&self) -> DrainOptions {
        let mut opts =
            DrainOptions::for_leaving_node(&self.drain, crate::reboot::CORDON_REASON, false);
        // Recorded as a shutdown cordon: the agent lifts it once the node is back, as after any
        // reboot it drained for.
        opts.shutdown = true;
        opts.timeout = self.s.drain_timeout;
        // A drain that cannot finish does not reboot: nothing is deleted past a budget.
        opts.on_deadline = crate::config::OnDeadline::Abandon;
        opts.metrics = Some(self.drain_metrics.clone());
        opts.lifecycle = self.lifecycle;
        opts
    }

    /// The slot is ours: record it on the Node, then drain and reboot.
    pub(super) async fn take(
        &mut self,
        client: &kube::Client,
        q: Request,
        slot: String,
    ) -> Duration {
        let now = Timestamp::now();
        self.took_at = Some(now);
        let record = Record {
            slot: slot.clone(),
            boot_id: self.boot_id.clone(),
            phase: "draining".into(),
            since: now.to_string(),
        };
        if let Err(e) = self.write_record(client, Some(&record)).await {
            self.failed(&e);
            self.release(&slot).await;
            return self.s.period;
        }
        let note = format!("took reboot slot {slot} (asked by {q}); draining");
        self.event(client, false, "RebootSlotTaken", note).await;
        self.drain_and_reboot(client, record).await
    }

    /// Taken in this boot before the agent restarted: go on if the slot is still ours and the
    /// checks a new request meets allow it now; otherwise give it back.
    pub(super) async fn resume(&mut self, client: &kube::Client, r: Record) -> Duration {
        let Some(e) = self.slot(&r.slot) else {
            self.give_back(client, &r, "its slot is no longer configured", "abandoned")
                .await;
            return self.s.period;
        };
        if !e.try_acquire().await {
            let why = "its slot was taken by another node meanwhile";
            self.give_back(client, &r, why, "abandoned").await;
            return self.s.period;
        }
        // A record says only that the checks once allowed it: they must allow it now.
        if let Err(w) = self.still_allowed(client).await {
            let why = format!(
                "the agent restarted and the checks no longer allow it ({}); it waits as a new request does",
                w.message()
            );
            self.give_back(client, &r, &why, "abandoned").await;
            return self.waiting(client, w).await;
        }
        if self.took_at.is_none() {
            self.took_at = r.since.parse().ok();
        }
        self.drain_and_reboot(client, r).await
    }

    async fn drain_and_reboot(&mut self, client: &kube::Client, mut r: Record) -> Duration {
        self.show(
            "draining",
            Some("Draining"),
            "draining for the reboot",
            Some(&r.slot),
        );
        let msg = format!("draining before the reboot (slot {})", r.slot);
        let underway = Moment::RebootUnderway {
            reason: "Draining",
            message: &msg,
        };
        self.condition(client, underway).await;
        let opts = self.drain_options();
        let drained = self
            .renewing(
                &r.slot,
                crate::drain::exec::drain(client, &self.node, &opts),
            )
            .await;
        let why = match drained {
            Ok(report) if report.outcome == DrainOutcome::Drained => None,
            Ok(report) => Some(unfinished(&report)),
            Err(e) => Some(format!("the drain failed: {e}")),
        };
        if let Some(why) = why {
            self.give_back(client, &r, &why, "drain-failed").await;
            return self.s.period;
        }
        if self.requested().await.is_none() {
            let why = "the reboot request was withdrawn while the node drained";
            self.give_back(client, &r, why, "abandoned").await;
            return self.s.period;
        }
        // The fence: renewals may have failed for the slot's whole duration while the node
        // drained, and another node taken it. Reboot only while it is still ours.
        if !self.still_holds(&r.slot).await {
            let why = format!(
                "its slot {} was taken by another node while it drained",
                r.slot
            );
            self.give_back(client, &r, &why, "drain-failed").await;
            return self.s.period;
        }
        r.phase = "rebooting".into();
        if let Err(e) = self.write_record(client, Some(&r)).await {
            self.failed(&e);
        }
        self.show(
            "rebooting",
            Some("Rebooting"),
            "drained; rebooting",
            Some(&r.slot),
        );
        let underway = Moment::RebootUnderway {
            reason: "Rebooting",
            message: "drained; rebooting",
        };
        self.condition(client, underway).await;
        let note = format!("drained; rebooting (slot {})", r.slot);
        info!(slot = %r.slot, "drained; rebooting");
        self.event(client, false, "Rebooting", note).await;
        let why = self.reboot_bounded(&r.slot).await;
        self.give_back(client, &r, &why, "reboot-failed").await;
        self.s.period
    }

    /// Asks for the reboot and waits for the machine to go down, renewing `slot` all along,
    /// for at most `reboot_timeout` (the ask included: a command or a logind call that hangs
    /// is dropped, the command killed). Returns why the node is still up.
    async fn reboot_bounded(&self, slot: &str) -> String {
        let limit = self.s.reboot_timeout;
        let going = async {
            self.reboot().await?;
            // The machine goes down now; the slot is renewed until it does.
            std::future::pending::<Result<(), String>>().await
        };
        match self
            .renewing(slot, tokio::time::timeout(limit, going))
            .await
        {
            Ok(Err(e)) => e,
            Ok(Ok(())) | Err(_) => {
                format!(
                    "the reboot was asked for {limit:?} ago and has not happened (reboot_timeout)"
                )
            }
        }
    }

    /// Asks for the reboot: the configured command, or logind.
    async fn reboot(&self) -> Result<(), String> {
        if let Some((program, args)) = self.s.reboot_command.as_ref().and_then(|a| a.split_first())
        {
            let status = tokio::process::Command::new(program)
                .args(args)
                .stdin(std::process::Stdio::null())
                // Past reboot_timeout the future is dropped: the command goes with it.
                .kill_on_drop(true)
                .status()
                .await
                .map_err(|e| format!("cannot run the reboot command {program}: {e}"))?;
            return if status.success() {
                Ok(())
            } else {
                Err(format!("the reboot command {program} failed: {status}"))
            };
        }
        let logind = crate::logind::Logind::connect()
            .await
            .map_err(|e| format!("cannot reach logind to reboot: {e}"))?;
        logind
            .reboot()
            .await
            .map_err(|e| format!("logind refused to reboot: {e}"))
    }

    /// Runs `work`, renewing the slot `slot` every third of its duration meanwhile.
    async fn renewing<T>(&self, slot: &str, work: impl std::future::Future<Output = T>) -> T {
        let Some(e) = self.slot(slot) else {
            return work.await;
        };
        let mut tick = tokio::time::interval(self.s.lease_duration / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return out,
                _ = tick.tick() => {
                    if !e.try_acquire().await {
                        warn!(slot, "cannot renew the reboot slot");
                    }
                }
            }
        }
    }

    fn slot(&self, slot: &str) -> Option<&Slot> {
        let i = slot.strip_prefix(SLOT_PREFIX)?.parse::<usize>().ok()?;
        self.slots.get(i)
    }

    /// Renews `slot` if this node still holds it; `false` when it does not (or cannot tell).
    pub(super) async fn still_holds(&self, slot: &str) -> bool {
        match self.slot(slot) {
            Some(e) => e.peek().await == Some(Step::Renew) && e.try_acquire().await,
            None => false,
        }
    }

    pub(super) async fn release(&self, slot: &str) {
        if let Some(e) = self.slot(slot) {
            e.release().await;
        }
    }
}

/// Why a drain that ended did not drain the node.
fn unfinished(report: &DrainReport) -> String {
    let names = |v: &[crate::drain::plan::PodRef]| {
        v.iter()
            .take(5)
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match report.outcome {
        DrainOutcome::DeadlineExceeded => format!(
            "the drain did not finish within its deadline: {} pods left ({})",
            report.left_behind.len(),
            names(&report.left_behind)
        ),
        DrainOutcome::BudgetUnsatisfiable => match report.unsatisfiable.first() {
            Some((pod, why)) => format!(
                "{} pods stay: their budgets cannot allow their eviction ({pod}: {why})",
                report.unsatisfiable.len()
            ),
            None => format!("the drain ended {}", report.outcome),
        },
        DrainOutcome::Refused => {
            let refused: Vec<_> = report.refused.iter().map(|(p, _)| p.clone()).collect();
            format!(
                "the drain left {} pods it may not evict ({}); a reboot would kill them",
                refused.len(),
                names(&refused)
            )
        }
        other => format!("the drain ended {other}"),
    }
}
