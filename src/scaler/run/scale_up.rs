//! Scale-up: the machines created for pending pods, their user data and bootstrap tokens, and the
//! pods told.

use super::*;

pub(super) fn sets_for(g: &GroupSettings, s: &ScalerSettings) -> Vec<String> {
    let mut sets = vec![
        format!("cluster_name={}", s.cluster_name),
        format!("node_group={}", g.name),
        format!(
            "hostname_pattern={}",
            g.hostname_pattern
                .as_deref()
                .unwrap_or(DEFAULT_HOSTNAME_PATTERN)
        ),
    ];
    sets.extend(g.labels.iter().map(|(k, v)| format!("node_labels.{k}={v}")));
    if !g.taints.is_empty() {
        sets.push(format!(
            "node_taints={}",
            g.taints
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    sets
}

/// Reads each group's template, fills its capacity from the provider's plans where the config
/// leaves it out, and renders it once with a throwaway token, so a broken one fails at start.
pub(super) async fn load_templates(
    provider: &impl Provider,
    s: &mut ScalerSettings,
    values_path: &Path,
    values_text: &str,
) -> Result<BTreeMap<String, GroupTemplate>> {
    let mut templates = BTreeMap::new();
    let mut groups = std::mem::take(&mut s.groups);
    for g in &mut groups {
        let text = std::fs::read_to_string(&g.template).map_err(|source| Error::Read {
            path: g.template.clone(),
            source,
        })?;
        fill_capacity(provider, g).await;
        let template = GroupTemplate {
            name: g.template.display().to_string(),
            text,
        };
        let trial = token::generate(&mut rand::rng());
        let values = build_values(values_path, values_text, g, s, &trial)?;
        crate::render::render(&template.name, &template.text, &values).map_err(|source| {
            Error::Render {
                group: g.name.clone(),
                source,
            }
        })?;
        templates.insert(g.name.clone(), template);
    }
    s.groups = groups;
    Ok(templates)
}

/// Fills the cpu and memory the group's config leaves out from its plan's, as the provider
/// reports them; a group still without them cannot scale up from zero, which is logged.
pub(super) async fn fill_capacity(provider: &impl Provider, g: &mut GroupSettings) {
    let r = &mut g.capacity.resources;
    if (r.cpu_milli == 0 || r.memory == 0) && !g.plan.is_empty() {
        match provider.plan_capacity(&g.plan).await {
            Ok(Some(plan)) => {
                if r.cpu_milli == 0 {
                    r.cpu_milli = plan.cpu_milli;
                }
                if r.memory == 0 {
                    r.memory = plan.memory;
                }
            }
            Ok(None) => {
                warn!(group = %g.name, plan = %g.plan, "the provider does not know the plan; set capacity in the group")
            }
            Err(e) => {
                warn!(group = %g.name, error = %e, "cannot read plans; set capacity in the group")
            }
        }
    }
    if g.capacity.resources.cpu_milli == 0 || g.capacity.resources.memory == 0 {
        warn!(group = %g.name, "no cpu/memory capacity known: the group cannot scale up from zero");
    }
}

pub(super) fn build_values(
    path: &std::path::Path,
    text: &str,
    g: &GroupSettings,
    s: &ScalerSettings,
    token: &crate::render::values::BootstrapToken,
) -> Result<Values> {
    let sets = sets_for(g, s);
    Values::build(
        Inputs {
            file: Some((path, text)),
            sets: &sets,
            token: Some(TokenSource {
                origin: "minted bootstrap token".into(),
                token: Secret::new(token.expose()),
            }),
        },
        &crate::render::values::rand8(),
    )
    .map_err(|source| Error::Values {
        group: g.name.clone(),
        source,
    })
}

pub(super) fn pod_ref(p: &model::PodView) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(p.name.clone()),
        namespace: Some(p.namespace.clone()),
        uid: Some(p.uid.clone()),
        ..ObjectReference::default()
    }
}

/// One of the pass's scale-ups, as decided.
pub(super) struct ScaleUpAsked<'a> {
    pub(super) group: &'a str,
    pub(super) count: u32,
    pub(super) reason: ScaleUpReason,
    pub(super) pods: &'a [String],
}

/// A group's machines to create in this pass, fenced once.
struct Batch<'a> {
    g: &'a GroupSettings,
    template: &'a GroupTemplate,
    count: u32,
}

/// One create's outcome: the hostname and the provider's answer, or why it was not sent.
type Created = std::result::Result<(String, provider::Result<model::MachineView>), Error>;

/// The order the creates leave in: the groups in turn, one machine each (`counts` [2, 1, 3]
/// gives groups 0, 1, 2, 0, 2, 2), so that every group's first machines are among the first
/// created. kube-scheduler counts as a spread's domains only the zones whose nodes exist: a
/// zone whose machines were created after another zone's whole batch would find the spread's
/// pods already placed in the zones that registered first.
pub(super) fn interleave(counts: &[u32]) -> Vec<usize> {
    let most = counts.iter().copied().max().unwrap_or(0);
    (0..most)
        .flat_map(|round| {
            counts
                .iter()
                .enumerate()
                .filter(move |&(_, &c)| round < c)
                .map(|(i, _)| i)
        })
        .collect()
}

impl<P: Provider + 'static> Inner<P> {
    /// The pass's scale-ups together: each group fenced once, every machine's create in one
    /// stream that takes the groups in turn ([`interleave`]), [`CREATE_CONCURRENCY`] at a
    /// time; then each group's outcomes settled and the pods that triggered it told, within the
    /// pass's budget of pod Events.
    pub(super) async fn scale_up_all(&self, asked: &[ScaleUpAsked<'_>], run: &mut PassState<'_>) {
        let expires = token_expiry(&self.settings, run.now);
        // The groups that may grow now, by their place in `asked`.
        let mut batches: Vec<(usize, Batch)> = Vec::with_capacity(asked.len());
        for (i, a) in asked.iter().enumerate() {
            if let Some(b) = self.batch(a.group, a.count).await {
                batches.push((i, b));
            }
        }
        let counts: Vec<u32> = batches.iter().map(|(_, b)| b.count).collect();
        let started = run.started;
        let first_sent = Mutex::new(None::<Duration>);
        // Each outcome with its batch's place in `batches`.
        let results: Vec<(usize, Created)> = futures::stream::iter(interleave(&counts))
            .map(|j| {
                let ((_, b), first_sent) = (&batches[j], &first_sent);
                async move {
                    // Each machine is one act: a replica that lost the Lease while the batch
                    // ran mints no token and creates no machine (the batch was fenced once).
                    if !self.is_leader() {
                        return (j, Err(Error::NotLeader));
                    }
                    // Minted and rendered just before its create, so the first request
                    // leaves after one mint and one render rather than the whole batch's.
                    let spec = match self.prepare(b.g, b.template, expires).await {
                        Ok(spec) => spec,
                        Err(e) => return (j, Err(e)),
                    };
                    lock(first_sent).get_or_insert_with(|| started.elapsed());
                    let host = spec.hostname.clone();
                    (j, Ok((host, self.provider.create(&spec).await)))
                }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect()
            .await;
        if let Some(d) = *lock(&first_sent) {
            run.first_create.get_or_insert(d);
        }
        let mut per_batch: Vec<Vec<Created>> = batches.iter().map(|_| Vec::new()).collect();
        for (j, r) in results {
            per_batch[j].push(r);
        }
        // A group that was not fenced in (not the leader, unknown) created nothing.
        let mut created = vec![0; asked.len()];
        for ((i, _), results) in batches.iter().zip(per_batch) {
            created[*i] = self.settle(asked[*i].group, results, run).await;
        }
        for (a, n) in asked.iter().zip(created) {
            self.tell(a, n, run).await;
        }
    }

    /// `count` machines of `group` to create, fenced once for the batch (its tokens and
    /// machines are one act); `None` for an unknown group or a replica that is not the leader.
    async fn batch(&self, group: &str, count: u32) -> Option<Batch<'_>> {
        let g = self.settings.groups.iter().find(|g| g.name == group)?;
        let template = self.templates.get(group)?;
        if !self
            .fenced(group, &format!("create {count} machine(s)"))
            .await
        {
            return None;
        }
        info!(group, count, "scaling up");
        Some(Batch { g, template, count })
    }

    /// A group's batch done: how many the provider accepted. The tokens of machines it refused
    /// go now; refused creates back the group off.
    async fn settle(&self, group: &str, results: Vec<Created>, run: &mut PassState<'_>) -> u32 {
        let (created, refused_hosts) = self.tally(group, results);
        // A machine the provider refused never joins: its token goes now. One whose create
        // failed otherwise (a timeout) may exist after all, so its token stays until it joins.
        let abandoned: Vec<String> = {
            let mut tokens = lock(&self.tokens);
            refused_hosts
                .iter()
                .filter_map(|h| tokens.abandon(h))
                .collect()
        };
        self.delete_tokens(&abandoned, "its machine was refused")
            .await;
        // Refused creates (4xx such as quota) count as failed machines: decide's rule says how
        // long the group waits.
        if let Some(Action::BackOff {
            failures, until, ..
        }) = decide::back_off(
            group,
            run.backoff.get(group).copied(),
            u32::try_from(refused_hosts.len()).unwrap_or(u32::MAX),
            run.now,
            &self.settings,
        ) {
            run.back_off(group, failures, until);
        }
        created
    }

    /// Tells the pods that triggered a scale-up what became of it, with an Event each, within
    /// the pass's budget of pod Events.
    async fn tell(&self, a: &ScaleUpAsked<'_>, created: u32, run: &mut PassState<'_>) {
        let (group, reason) = (a.group, a.reason);
        let note = format!("pod triggered scale-up: node group {group} +{created} ({reason:?})");
        for key in a.pods {
            if !self
                .pod_event(run, key, "TriggeredScaleUp", note.clone())
                .await
            {
                break;
            }
        }
        if reason != ScaleUpReason::PendingPods {
            debug!(group, count = a.count, ?reason, "scale-up without pods");
        }
    }

    /// One machine's create request: a bootstrap token of its own (one leaked user-data blob
    /// joins one machine), and the group's template rendered with it.
    pub(super) async fn prepare(
        &self,
        g: &GroupSettings,
        template: &GroupTemplate,
        expires: Timestamp,
    ) -> Result<CreateSpec> {
        let group = g.name.as_str();
        let token = token::mint(
            &self.client,
            expires,
            &self.settings.token_extra_groups,
            group,
        )
        .await?;
        let rendered = build_values(
            &self.values_path,
            &self.values_text,
            g,
            &self.settings,
            &token,
        )
        .and_then(|values| {
            let user_data = crate::render::render(&template.name, &template.text, &values)
                .map_err(|source| Error::Render {
                    group: group.to_string(),
                    source,
                })?;
            Ok((values, user_data))
        });
        let (values, user_data) = match rendered {
            Ok(r) => r,
            Err(e) => {
                self.delete_tokens(
                    std::slice::from_ref(&token.id),
                    "its user data did not render",
                )
                .await;
                return Err(e);
            }
        };
        lock(&self.tokens).minted(&values.hostname, &token.id, expires);
        info!(group, hostname = %values.hostname, token_id = %token.id, "machine prepared");
        Ok(CreateSpec {
            group: group.to_string(),
            hostname: values.hostname.clone(),
            plan: g.plan.clone(),
            region: g.region.clone(),
            image: g.image.clone(),
            ssh_keys: g.ssh_keys.clone(),
            user_data: Secret::new(user_data),
            tags: BTreeMap::from([
                (CLUSTER_TAG.to_string(), self.settings.cluster_name.clone()),
                (POOL_TAG.to_string(), group.to_string()),
            ]),
            cherry: g.cherry.clone(),
        })
    }

    /// A Normal `ScaleUp` Event on the pending pod `key`, within the pass's budget of pod
    /// Events ([`POD_EVENTS_PER_PASS`]); false once the budget is spent.
    pub(super) async fn pod_event(
        &self,
        run: &mut PassState<'_>,
        key: &str,
        reason: &str,
        note: String,
    ) -> bool {
        if run.pod_events >= POD_EVENTS_PER_PASS {
            return false;
        }
        if let Some(p) = run.pods_by_key.get(key) {
            run.pod_events += 1;
            self.event(&pod_ref(p), EventType::Normal, reason, "ScaleUp", note)
                .await;
        }
        true
    }

    /// Counts and reports a batch's outcomes: how many were created, and the hostnames of the
    /// machines the provider refused for good.
    pub(super) fn tally(
        &self,
        group: &str,
        results: Vec<std::result::Result<(String, provider::Result<model::MachineView>), Error>>,
    ) -> (u32, Vec<String>) {
        let (mut created, mut refused) = (0, Vec::new());
        for result in results {
            let (host, r) = match result {
                Ok(pair) => pair,
                Err(Error::NotLeader) => {
                    warn!(
                        group,
                        "lost the Lease mid-batch; the rest of it is not created"
                    );
                    continue;
                }
                Err(e) => {
                    let kind = if matches!(e, Error::Token(_)) {
                        "token"
                    } else {
                        "render"
                    };
                    self.metrics
                        .failures
                        .get_or_create(&metrics::failure(group, kind))
                        .inc();
                    error!(group, error = %e, "cannot prepare a machine; it is not created");
                    continue;
                }
            };
            match r {
                Ok(m) => {
                    created += 1;
                    self.metrics
                        .scale_ups
                        .get_or_create(&metrics::group(group))
                        .inc();
                    info!(group, machine = %m.id, hostname = %m.hostname, "machine created");
                }
                Err(e) => {
                    self.metrics
                        .failures
                        .get_or_create(&metrics::failure(group, "create"))
                        .inc();
                    warn!(group, hostname = %host, error = %e, retryable = e.is_retryable(), "cannot create a machine");
                    if !e.is_retryable() {
                        refused.push(host);
                    }
                }
            }
        }
        (created, refused)
    }

    /// Deletes the bootstrap tokens of machines whose Node has registered: the kubelet has its
    /// own certificate by then, and a token that leaked from user data opens nothing more.
    pub(super) async fn delete_joined_tokens(&self, snap: &Snapshot, now: Timestamp) {
        if lock(&self.tokens).is_empty() {
            return;
        }
        let nodes: HashSet<&str> = snap.nodes.iter().map(|n| n.name.as_str()).collect();
        let joined = lock(&self.tokens).joined(|host| nodes.contains(host), now);
        self.delete_tokens(&joined, "its node joined").await;
    }

    /// Deletes bootstrap tokens by id; a failure is logged and left to the token's expiry.
    pub(super) async fn delete_tokens(&self, ids: &[String], why: &str) {
        for id in ids {
            match token::delete(&self.client, id).await {
                Ok(()) => info!(token_id = %id, why, "bootstrap token deleted"),
                Err(e) => {
                    warn!(token_id = %id, why, error = %e, "cannot delete a bootstrap token; it expires on its own")
                }
            }
        }
    }
}
