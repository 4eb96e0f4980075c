//! Before a slot: kured's lock, the window, the slots, then the blockers, the fleet's health
//! and the drain's budgets, each read fresh; and waiting, said where it changed.

use super::*;

/// Taking a slot.
impl Coordinator {
    /// A reboot is asked for: check, in order, kured, the window, a free slot, then the
    /// blockers, health and budgets; take the slot when all agree, then drain and reboot.
    pub(super) async fn try_slot(&mut self, client: &kube::Client, q: Request) -> Duration {
        if let Err(w) = self.may_look(client).await {
            return self.waiting(client, w).await;
        }
        let (free, holders) = self.peek_slots().await;
        if free.is_empty() {
            return self.waiting(client, Wait::Slot(holders)).await;
        }
        if let Err(w) = self.may_take(client, &holders).await {
            return self.waiting(client, w).await;
        }
        for i in free {
            if self.slots[i].try_acquire().await {
                let slot = self.s.slot_names()[i].clone();
                return self.take(client, q, slot).await;
            }
        }
        let (_, holders) = self.peek_slots().await;
        self.waiting(client, Wait::Slot(holders)).await
    }

    /// Every check a new request meets but the free slot, for a reboot resumed with its slot
    /// (the agent restarted in the boot it took it in): the Node's record says only that the
    /// checks once allowed it.
    pub(super) async fn still_allowed(&self, client: &kube::Client) -> Result<(), Wait> {
        self.may_look(client).await?;
        let (_, holders) = self.peek_slots().await;
        self.may_take(client, &holders).await
    }

    /// kured's lock, then the window.
    async fn may_look(&self, client: &kube::Client) -> Result<(), Wait> {
        let kured = self.kured(client).await;
        decide::may_look_for_slot(&self.s, kured, Timestamp::now())
    }

    /// Blockers, health and budgets, `holders` being the other nodes that hold slots.
    async fn may_take(&self, client: &kube::Client, holders: &[String]) -> Result<(), Wait> {
        let before = self.before(client, holders).await;
        decide::may_take_slot(&self.s, &before)
    }

    /// The slots this node could take now (indices), and the other holders of live ones.
    async fn peek_slots(&self) -> (Vec<usize>, Vec<String>) {
        let mut free = Vec::new();
        let mut holders = Vec::new();
        for (i, e) in self.slots.iter().enumerate() {
            match e.peek().await {
                Some(Step::Create | Step::TakeOver | Step::Renew) => free.push(i),
                Some(Step::Follow { holder }) => holders.push(holder),
                None => holders.push("(unreadable)".into()),
            }
        }
        (free, holders)
    }

    /// kured's lock, when a DaemonSet carries it; `Err` when the DaemonSets cannot be listed.
    async fn kured(&self, client: &kube::Client) -> Result<Option<String>, String> {
        let ds: Api<DaemonSet> = Api::all(client.clone());
        let list = ds
            .list_metadata(&ListParams::default())
            .await
            .map_err(|e| format!("cannot list DaemonSets: {e}"))?;
        Ok(list.items.iter().find_map(|d| {
            let value = d.metadata.annotations.as_ref()?.get(KURED_LOCK)?;
            Some(format!(
                "DaemonSet {}/{}: {value}",
                d.metadata.namespace.as_deref().unwrap_or_default(),
                d.metadata.name.as_deref().unwrap_or_default()
            ))
        }))
    }

    /// Blockers, health and budgets, read fresh.
    async fn before(&self, client: &kube::Client, holders: &[String]) -> Before {
        let (pods, alerts, nodes, budgets) = tokio::join!(
            self.blocking_pods(client),
            self.alerts(),
            self.unavailable(client, holders),
            self.budgets(client),
        );
        let (unavailable, nodes) = nodes;
        let (budgets, unevictable) = budgets;
        Before {
            pods,
            alerts,
            unavailable,
            nodes,
            budgets,
            unevictable,
        }
    }

    async fn blocking_pods(&self, client: &kube::Client) -> Vec<String> {
        let pods: Api<Pod> = Api::all(client.clone());
        let mut out = Vec::new();
        let scopes = [
            (self.s.blocking_pods.as_ref(), Some(self.node.as_str())),
            (self.s.blocking_pods_anywhere.as_ref(), None),
        ];
        for (selector, on) in scopes {
            let Some(selector) = selector else { continue };
            let mut lp = ListParams::default().labels(&selector.to_string());
            if let Some(node) = on {
                lp = lp.fields(&format!("spec.nodeName={node}"));
            }
            match pods.list(&lp).await {
                Ok(l) => out.extend(l.items.iter().filter(|p| running(p)).map(|p| {
                    let m = &p.metadata;
                    let ns = m.namespace.as_deref().unwrap_or_default();
                    let name = m.name.as_deref().unwrap_or_default();
                    match on {
                        Some(_) => format!("{ns}/{name} on this node"),
                        None => format!("{ns}/{name}"),
                    }
                })),
                Err(e) => out.push(format!("cannot list pods {}: {e}", selector)),
            }
        }
        out
    }

    async fn alerts(&self) -> Result<Vec<String>, String> {
        let Some(url) = &self.s.prometheus_url else {
            return Ok(Vec::new());
        };
        let firing = crate::reboot::alerts::firing(&self.http, url, REQUEST_DEADLINE).await?;
        let ignored = self.s.alerts_ignored.as_ref().map(|f| &f.0);
        Ok(crate::reboot::alerts::blocking(firing, ignored))
    }

    /// The other nodes that are unavailable, and how many nodes there are.
    async fn unavailable(
        &self,
        client: &kube::Client,
        holders: &[String],
    ) -> (Result<Vec<String>, String>, u32) {
        let nodes: Api<Node> = Api::all(client.clone());
        let mut lp = ListParams::default();
        if let Some(sel) = &self.s.health_nodes {
            lp = lp.labels(&sel.to_string());
        }
        match nodes.list(&lp).await {
            Ok(l) => {
                let out = l
                    .items
                    .iter()
                    .filter(|n| n.metadata.name.as_deref() != Some(self.node.as_str()))
                    .filter_map(|n| {
                        let why = decide::unavailable(n, holders)?;
                        Some(format!(
                            "{} ({why})",
                            n.metadata.name.as_deref().unwrap_or_default()
                        ))
                    })
                    .collect();
                (Ok(out), u32::try_from(l.items.len()).unwrap_or(u32::MAX))
            }
            Err(e) => (Err(format!("cannot list nodes: {e}")), 0),
        }
    }

    /// What the drain would meet now: the budgets it would exceed, and the pods it may not
    /// evict.
    async fn budgets(&self, client: &kube::Client) -> (Vec<String>, Vec<String>) {
        let opts = self.drain_options();
        let planned = crate::drain::exec::dry_run_with_pods(client, &self.node, &opts).await;
        let (plan, pods) = match planned {
            Ok(x) => x,
            Err(e) => return (vec![format!("cannot plan the drain: {e}")], Vec::new()),
        };
        let unevictable = plan
            .refused()
            .map(|(p, why)| format!("{}/{} ({why})", p.namespace, p.name))
            .collect();
        let pdbs: Api<PodDisruptionBudget> = Api::all(client.clone());
        let budgets = match pdbs.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => {
                return (
                    vec![format!("cannot list PodDisruptionBudgets: {e}")],
                    unevictable,
                );
            }
        };
        let by_uid: std::collections::HashMap<&str, &Pod> = pods
            .iter()
            .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
            .collect();
        let leaving: Vec<&Pod> = plan
            .evictions()
            .filter_map(|(r, _)| by_uid.get(r.uid.as_str()).copied())
            .collect();
        (
            crate::drain::plan::budgets_short(&leaving, &budgets),
            unevictable,
        )
    }

    /// Waits with `w`: says so where it changed, and comes back after the period.
    pub(super) async fn waiting(&mut self, client: &kube::Client, w: Wait) -> Duration {
        let changed = self.status.reason() != Some(w.reason());
        self.show("waiting", Some(w.reason()), &w.message(), None);
        if changed {
            info!(reason = w.reason(), "reboot waits: {}", w.message());
            let message = w.message();
            let waiting = Moment::RebootWaiting {
                reason: w.reason(),
                message: &message,
            };
            self.condition(client, waiting).await;
            self.event(client, false, w.reason(), w.message()).await;
        }
        self.s.period
    }
}

/// Whether a pod is still there to count (not Succeeded or Failed).
fn running(p: &Pod) -> bool {
    !matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}
