//! The executor's half of a surge ([`super::surge`] decides): reads the pod's ReplicaSet and its
//! Deployment, scales the Deployment through its `scale` subresource with the resourceVersion it
//! read (a concurrent change wins, and no surge is made), reads its ready count while the drain
//! waits, and gives the replica back.
//!
//! RBAC (`packaging/kubernetes/rbac-agent-surge.yaml`, opt-in): `get` replicasets and
//! deployments, `get`/`patch` deployments/scale.

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

use super::plan::PodRef;
use super::surge::{self, Grow};

/// A Deployment given one more replica for a pod's eviction.
#[derive(Debug, Clone)]
pub struct Surged {
    /// The pod it stands in for.
    pub pod: PodRef,
    /// The Deployment's name (in the pod's namespace).
    pub deployment: String,
    /// The replica counts.
    pub grow: Grow,
}

/// How asking for a surge went.
#[derive(Debug)]
pub enum Started {
    /// The Deployment has its extra replica; wait for [`ready`].
    Surged(Surged),
    /// No surge: not needed, or not possible, or refused (in words for the log); the pod is
    /// evicted now, as without surge.
    Without(String),
}

fn deployments(client: &Client, pod: &PodRef) -> Api<Deployment> {
    Api::namespaced(client.clone(), &pod.namespace)
}

/// An API error in words, pointing a 403 at the RBAC that surge needs.
fn said(action: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "{action}: forbidden ({}); surge needs the rules of rbac-agent-surge.yaml",
            s.message
        ),
        kube::Error::Api(s) if s.code == 409 => {
            format!("{action}: the Deployment changed meanwhile ({})", s.message)
        }
        e => format!("{action}: {e}"),
    }
}

/// Asks the Deployment behind `replica_set` for one more replica, if [`surge::grow`] says it
/// needs one.
pub async fn start(client: &Client, pod: &PodRef, replica_set: &str, budget_open: bool) -> Started {
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &pod.namespace);
    let rs = match sets.get(replica_set).await {
        Ok(rs) => rs,
        Err(e) => return Started::Without(said(&format!("get replicaset {replica_set}"), &e)),
    };
    let Some(name) = surge::deployment_of(&rs) else {
        return Started::Without(format!(
            "ReplicaSet {replica_set} belongs to no Deployment: nothing to surge"
        ));
    };
    let api = deployments(client, pod);
    let d = match api.get(&name).await {
        Ok(d) => d,
        Err(e) => return Started::Without(said(&format!("get deployment {name}"), &e)),
    };
    let grow = match surge::grow(&d, budget_open) {
        Ok(g) => g,
        Err(why) => return Started::Without(format!("Deployment {name}: {why}")),
    };
    let patch = json!({
        "metadata": {"resourceVersion": d.metadata.resource_version},
        "spec": {"replicas": grow.to},
    });
    let params = PatchParams::default();
    if let Err(e) = api.patch_scale(&name, &params, &Patch::Merge(&patch)).await {
        return Started::Without(said(&format!("scale deployment {name}"), &e));
    }
    info!(pod = %pod, deployment = %name, from = grow.from, to = grow.to, "surge: asked the Deployment for a replacement before the eviction");
    Started::Surged(Surged {
        pod: pod.clone(),
        deployment: name,
        grow,
    })
}

/// Whether the surge's replacement is Ready.
pub async fn ready(client: &Client, s: &Surged) -> Result<bool, kube::Error> {
    let d = deployments(client, &s.pod).get(&s.deployment).await?;
    Ok(surge::replaced(&d, &s.grow))
}

/// Gives the extra replica back ([`surge::restore_to`]), retrying a conflict twice; logs how it
/// went.
pub async fn give_back(client: &Client, s: &Surged) {
    let api = deployments(client, &s.pod);
    let name = &s.deployment;
    for _ in 0..3 {
        let scale = match api.get_scale(name).await {
            Ok(scale) => scale,
            Err(e) => {
                warn!(pod = %s.pod, "surge: {}", said(&format!("get deployment {name}'s scale"), &e));
                return;
            }
        };
        let current = scale.spec.and_then(|s| s.replicas).unwrap_or_default();
        let Some(to) = surge::restore_to(current, &s.grow) else {
            warn!(pod = %s.pod, deployment = %name, replicas = current, set = s.grow.to, "surge: the replica count changed since the drain set it; left as it is");
            return;
        };
        let patch = json!({
            "metadata": {"resourceVersion": scale.metadata.resource_version},
            "spec": {"replicas": to},
        });
        match api
            .patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(pod = %s.pod, deployment = %name, replicas = to, "surge: replica given back");
                return;
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => {
                warn!(pod = %s.pod, "surge: {}", said(&format!("scale deployment {name} back to {to}"), &e));
                return;
            }
        }
    }
    warn!(pod = %s.pod, deployment = %name, "surge: the Deployment kept changing; its replica count was not given back");
}

/// How often the drain reads a surged Deployment's ready count while it waits.
pub const CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

#[derive(Debug)]
struct Entry {
    surged: Surged,
    checking: bool,
    replaced: bool,
}

/// One drain's surges: those waiting for their replacement, and the replicas being given back
/// (each in a task of its own, so a drain that ends still gives them back).
#[derive(Debug, Default)]
pub struct Surges {
    live: std::collections::HashMap<String, Entry>,
    next_check: Option<tokio::time::Instant>,
    giving_back: Vec<tokio::task::JoinHandle<()>>,
}

impl Surges {
    /// A surge began for the pod.
    pub fn started(&mut self, surged: Surged) {
        let uid = surged.pod.uid.clone();
        let entry = Entry {
            surged,
            checking: false,
            replaced: false,
        };
        self.live.insert(uid, entry);
    }

    /// The surges whose ready count is due to be read at `now` (each marked as being read until
    /// [`Self::checked`]), and when to look next.
    pub fn due(
        &mut self,
        now: tokio::time::Instant,
    ) -> (Vec<Surged>, Option<tokio::time::Instant>) {
        let waiting = |e: &Entry| !e.replaced;
        if !self.live.values().any(waiting) {
            self.next_check = None;
            return (Vec::new(), None);
        }
        let at = *self.next_check.get_or_insert(now);
        if now < at {
            return (Vec::new(), Some(at));
        }
        self.next_check = Some(super::step::later(now, CHECK_EVERY));
        let due = self
            .live
            .values_mut()
            .filter(|e| waiting(e) && !e.checking)
            .map(|e| {
                e.checking = true;
                e.surged.clone()
            })
            .collect();
        (due, self.next_check)
    }

    /// A read of the pod's surge came back: whether its replacement is Ready now.
    pub fn checked(&mut self, uid: &str, replaced: bool) {
        if let Some(e) = self.live.get_mut(uid) {
            e.checking = false;
            e.replaced |= replaced;
        }
    }

    /// The pod's surge is over (the pod is gone, or the drain stopped waiting for its
    /// replacement): the Deployment's replica goes back, in a task of its own.
    ///
    /// Not at the eviction: until the ReplicaSet controller has seen the evicted pod
    /// terminating, it still counts it, and a scale-down then removes the newest Ready pod,
    /// which is the replacement. Once the pod is deleted, the controller has long seen it
    /// terminating and started another pod for the replica the drain still holds out; the
    /// scale-down removes that one (or the replacement, with the other one Ready).
    pub fn end(&mut self, client: &Client, uid: &str) {
        if let Some(e) = self.live.remove(uid) {
            let client = client.clone();
            self.giving_back.push(tokio::spawn(async move {
                give_back(&client, &e.surged).await;
            }));
        }
    }

    /// A relist of the node's pods: the surges of the pods it lacks are over ([`Self::end`]).
    pub fn end_all_but(&mut self, client: &Client, present: &std::collections::BTreeSet<String>) {
        self.end_unless(client, |uid| present.contains(uid));
    }

    /// Ends every surge but those of the pods `keep` names ([`Self::end`]).
    fn end_unless(&mut self, client: &Client, keep: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self.live.keys().filter(|uid| !keep(uid)).cloned().collect();
        for uid in gone {
            self.end(client, &uid);
        }
    }

    /// The drain is over: every replica still out goes back; waits for them, up to `limit`.
    pub async fn finish(mut self, client: &Client, limit: std::time::Duration) {
        self.end_unless(client, |_| false);
        let all = futures::future::join_all(self.giving_back);
        if tokio::time::timeout(limit, all).await.is_err() {
            warn!("surge: giving replicas back took longer than {limit:?}; some may be left");
        }
    }
}
