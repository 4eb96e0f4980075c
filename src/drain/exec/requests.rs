//! The requests a drain sends (evictions, deletions, surges) and what their answers do.

use super::*;

/// An eviction's answer as the schedule reads it: status code, cause and message.
pub(super) fn status_of(result: &std::result::Result<(), kube::Error>) -> (u16, Cause, String) {
    match result {
        Ok(()) => (201, Cause::None, String::new()),
        Err(kube::Error::Api(s)) => (
            s.code,
            Cause::of(
                s.details
                    .iter()
                    .flat_map(|d| d.causes.iter().map(|c| c.reason.as_str())),
            ),
            s.message.clone(),
        ),
        // No answer at all (connection refused, reset, timeout): as retryable as a 503.
        Err(e) => (503, Cause::None, e.to_string()),
    }
}

/// One log line per eviction answer, at the level it deserves.
pub(super) fn log_answer(pod: &PodRef, answer: &Answer, matching: &[String]) {
    let code = answer.code;
    match answer.outcome() {
        Outcome::Evicted | Outcome::Gone => debug!(pod = %pod, code, "eviction accepted"),
        Outcome::NamespaceTerminating => info!(
            pod = %pod,
            "its namespace is being deleted, which deletes the pod; waiting for it to go"
        ),
        Outcome::BudgetExhausted => debug!(pod = %pod, "blocked by a disruption budget"),
        Outcome::Retry => {
            debug!(pod = %pod, code, message = %answer.message, "eviction failed; retrying");
        }
        Outcome::MultipleBudgets => {
            warn!(pod = %pod, budgets = ?matching, "more than one PodDisruptionBudget selects the pod; the Eviction API cannot evict it");
        }
        Outcome::Forbidden => warn!(pod = %pod, "missing permission: create pods/eviction"),
        Outcome::Denied => {
            warn!(pod = %pod, message = %answer.message, "eviction denied for this pod; refused, the drain goes on");
        }
        Outcome::Rejected => {
            warn!(pod = %pod, code, message = %answer.message, "eviction rejected");
        }
    }
}

pub(super) fn uid_precondition(pod: &PodRef) -> kube::api::Preconditions {
    kube::api::Preconditions {
        uid: Some(pod.uid.clone()),
        resource_version: None,
    }
}

impl Drain<'_> {
    /// Takes a pod into the drain; what its annotations get wrong is logged and said on the pod.
    pub(super) fn track(
        &self,
        schedule: &mut Schedule,
        pod: &Pod,
        daemonsets: &Mirror<PartialObjectMeta<DaemonSet>>,
    ) {
        schedule.track(pod, &daemonset_in(daemonsets));
        for note in schedule.take_notes() {
            warn!(node = self.node, "{note}");
            crate::events::publish_detached(
                &self.recorder,
                pod.object_ref(&()),
                EventType::Warning,
                "BadDrainAnnotation",
                "Drain",
                note,
            );
        }
    }

    /// Starts what the schedule asked for; answers come back through `inflight`.
    pub(super) fn perform(
        &self,
        command: Command,
        inflight: &mut FuturesUnordered<Request>,
        surges: &mut Surges,
    ) {
        match command {
            Command::Surge {
                pod,
                replica_set,
                budget_open,
            } => {
                let client = self.client.clone();
                inflight.push(
                    async move {
                        let started =
                            surging::start(&client, &pod, &replica_set, budget_open).await;
                        (pod, Reply::Surge(started))
                    }
                    .boxed(),
                );
            }
            Command::SurgeGaveUp(pod) => {
                warn!(pod = %pod, "surge: the replacement is not Ready after half the time left; evicting without it");
                surges.end(self.client, &pod.uid);
            }
            Command::Evict(pod) => {
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
                inflight.push(
                    async move {
                        let params = EvictParams {
                            delete_options: Some(DeleteParams {
                                preconditions: Some(uid_precondition(&pod)),
                                ..DeleteParams::default()
                            }),
                            post_options: PostParams::default(),
                        };
                        let result = api.evict(&pod.name, &params).await.map(|_| ());
                        (pod, Reply::Evict(result))
                    }
                    .boxed(),
                );
            }
            Command::Delete { pod, grace_seconds } => {
                error!(pod = %pod, grace_seconds, "deadline near: deleting pod past its disruption budget (drain.on_deadline = delete)");
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
                inflight.push(
                    async move {
                        let params = DeleteParams {
                            grace_period_seconds: Some(grace_seconds),
                            preconditions: Some(uid_precondition(&pod)),
                            ..DeleteParams::default()
                        };
                        let result = api.delete(&pod.name, &params).await.map(|_| ());
                        (pod, Reply::Delete(result))
                    }
                    .boxed(),
                );
            }
            Command::WaveEnded { wave, settled } => {
                if settled {
                    debug!(node = self.node, wave, "wave done; next wave");
                } else {
                    warn!(
                        node = self.node,
                        wave,
                        "wave used up its share of the deadline; starting the next one while its pods keep leaving"
                    );
                }
            }
            Command::WaitingPastDeadline => warn!(
                node = self.node,
                "deadline passed; on_deadline = wait, so the drain goes on"
            ),
            Command::Unsatisfiable { pod, why, acting } => self.unsatisfiable(&pod, &why, acting),
        }
    }

    /// A pod's budget cannot allow its eviction: said in the log, an Event on the pod and the
    /// metrics, with what the drain does about it (the drain's end Event on the Node names them
    /// all).
    pub(super) fn unsatisfiable(
        &self,
        pod: &PodRef,
        why: &crate::drain::unsatisfiable::Why,
        acting: bool,
    ) {
        let now = if acting {
            format!(
                "drain.on_deadline = {} applies to it now",
                self.opts.on_deadline.as_str()
            )
        } else {
            "the drain waits for it until its deadline".to_string()
        };
        warn!(node = self.node, pod = %pod, "BudgetUnsatisfiable: {why}; {now}");
        if let Some(m) = &self.opts.metrics {
            m.unsatisfiable(acting);
        }
        crate::events::publish_detached(
            &self.recorder,
            pod.object_ref(),
            EventType::Warning,
            "BudgetUnsatisfiable",
            "Drain",
            format!("eviction from node {}: {why}; {now}", self.node),
        );
    }

    /// Reads the ready count of the surges waiting for their replacement, every
    /// [`surging::CHECK_EVERY`]; returns when to look next.
    pub(super) fn check_surges(
        &self,
        now: Instant,
        surges: &mut Surges,
        inflight: &mut FuturesUnordered<Request>,
    ) -> Option<Instant> {
        let (due, next) = surges.due(now);
        for s in due {
            let client = self.client.clone();
            inflight.push(
                async move {
                    let ready = surging::ready(&client, &s).await;
                    (s.pod, Reply::SurgeReady(ready))
                }
                .boxed(),
            );
        }
        next
    }

    /// A surge's answer: started (wait for the replacement), or not (evict now); a read of its
    /// ready count.
    pub(super) fn surge_answered(
        &self,
        schedule: &mut Schedule,
        surges: &mut Surges,
        pod: &PodRef,
        reply: Reply,
    ) {
        match reply {
            Reply::Surge(surging::Started::Surged(s)) => {
                surges.started(s);
            }
            Reply::Surge(surging::Started::Without(why)) => {
                info!(pod = %pod, "surge: none: {why}; evicting as usual");
                schedule.replaced(&pod.uid);
            }
            Reply::SurgeReady(Ok(ready)) => {
                surges.checked(&pod.uid, ready);
                if ready {
                    info!(pod = %pod, "surge: the replacement is Ready; evicting");
                    schedule.replaced(&pod.uid);
                }
            }
            Reply::SurgeReady(Err(e)) => {
                debug!(pod = %pod, error = %e, "surge: cannot read the Deployment; trying again");
                surges.checked(&pod.uid, false);
            }
            Reply::Evict(_) | Reply::Delete(_) => {}
        }
    }

    /// Feeds an answer back to the schedule, logging what it means.
    pub(super) fn answered(
        &self,
        schedule: &mut Schedule,
        budgets: &Mirror<PodDisruptionBudget>,
        pod: &PodRef,
        reply: Reply,
        narrator: Option<&mut Narrator>,
        surges: &mut Surges,
    ) -> Result<()> {
        let result = match reply {
            Reply::Surge(_) | Reply::SurgeReady(_) => {
                self.surge_answered(schedule, surges, pod, reply);
                return Ok(());
            }
            Reply::Delete(result) => {
                let deleted = match result {
                    Ok(()) => Deleted::Accepted,
                    Err(kube::Error::Api(s)) if s.code == 404 => Deleted::Gone,
                    Err(e) => {
                        warn!(pod = %pod, error = %e, "cannot delete pod");
                        Deleted::Failed
                    }
                };
                schedule.delete_answered(&pod.uid, deleted);
                return Ok(());
            }
            Reply::Evict(result) => result,
        };
        let (code, cause, message) = status_of(&result);
        let labels = schedule
            .get(&pod.uid)
            .map(|t| t.labels.clone())
            .unwrap_or_default();
        let all = budgets.state();
        let matching: Vec<String> =
            plan::budgets_for(&pod.namespace, &labels, all.iter().map(AsRef::as_ref))
                .into_iter()
                .map(plan::budget_key)
                .collect();
        if let Some(m) = &self.opts.metrics {
            m.answered(code);
        }
        let answer = Answer {
            code,
            cause,
            matching_budgets: matching.len(),
            message,
        };
        log_answer(pod, &answer, &matching);
        if answer.outcome() == Outcome::BudgetExhausted
            && let Some(n) = narrator
        {
            let allowed = matching.first().and_then(|b| allowed_in(&all, b));
            n.blocked(pod, &matching, allowed);
        }
        let verdict = schedule.evict_answered(&pod.uid, &answer, matching, Instant::now());
        if schedule
            .get(&pod.uid)
            .is_some_and(|t| t.state == PodState::Gone)
        {
            // Gone already (a 404): its surge's replica goes back. An accepted eviction keeps
            // the replica out until the watch sees the pod deleted ([`Surges`]).
            surges.end(self.client, &pod.uid);
        }
        match verdict {
            Verdict::Continue => Ok(()),
            Verdict::Forbidden => Err(Error::Forbidden {
                verb: "create pods/eviction",
                pod: Some(pod.to_string()),
            }),
        }
    }
}
