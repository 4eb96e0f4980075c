//! The I/O half of a cluster shutdown: record the intent, cordon every node, delete each wave's
//! pods and wait on a watch for them to go; and `cluster start`, which undoes the cordons.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PostParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tracing::{info, warn};

use super::intent::{Intent, Phase};
use super::plan::{self, ShutdownPlan, Wave};
use crate::config::Wave as Band;
use crate::drain::plan::{LeaveRules, PodRef};
use crate::drain::{CordonOutcome, UncordonOutcome};
use crate::names::{CLUSTER_SHUTDOWN_CONFIGMAP as NAME, CLUSTER_SHUTDOWN_NAMESPACE as NS};

/// Errors that stop `cluster shutdown` or `cluster start`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("cannot {action}: {source}")]
    Api {
        /// What was being done.
        action: &'static str,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A node's cordon or uncordon failed.
    #[error(transparent)]
    Node(#[from] crate::drain::exec::Error),
    /// The intent was created and removed by others while this run recorded it.
    #[error(
        "another `nodeward cluster shutdown` or `cluster start` changed the intent at the same time; run again"
    )]
    Raced,
    /// The pod watch ended before its first list.
    #[error("the cluster's pods could not be listed: {0}")]
    NotListed(String),
}

/// `pub type Result` for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn api(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api { action, source }
}

/// How a cluster shutdown runs.
#[derive(Debug, Clone)]
pub struct ShutdownOptions {
    /// Print the order and change nothing.
    pub dry_run: bool,
    /// Why, recorded in the intent.
    pub reason: String,
    /// How long a wave waits for its pods to be gone before the next starts (and its stragglers
    /// are reported).
    pub wave_timeout: Duration,
    /// The drain's overrides: which pods a drain would evict ([`crate::drain::plan::fate`]).
    pub rules: LeaveRules,
    /// The drain's priority bands (`[[drain.waves]]`).
    pub bands: Vec<Band>,
    /// Requests in flight at once (cordons, deletions).
    pub concurrency: usize,
    /// Say `MaintenanceInProgress` on each node cordoned (`[conditions] lifecycle`).
    pub lifecycle: bool,
}

/// How a cluster shutdown ended.
#[derive(Debug, Clone, Default)]
pub struct ShutdownReport {
    /// Waves stopped.
    pub waves: usize,
    /// Pods stopped (gone).
    pub stopped: usize,
    /// Pods that did not go within their wave's time, or whose deletion was refused.
    pub not_stopped: Vec<PodRef>,
    /// From the intent's record to the last wave's end.
    pub elapsed: Duration,
}

/// The intent, if a cluster shutdown is recorded: what agents and the scaler ask.
pub async fn read_intent(client: &kube::Client) -> kube::Result<Option<Intent>> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    Ok(cms.get_opt(NAME).await?.map(|cm| {
        let (intent, problems) = Intent::from_data(&cm.data.unwrap_or_default());
        for p in problems {
            warn!(configmap = NAME, problem = %p, "the cluster shutdown's record is hand-edited");
        }
        intent
    }))
}

/// Whether a cluster shutdown is recorded; an error (no answer, no permission) says no, with a
/// warning naming the permission: a drain that cannot tell waits on budgets, as it always did.
pub async fn intent_exists(client: &kube::Client) -> bool {
    match read_intent(client).await {
        Ok(found) => found.is_some(),
        Err(e) => {
            warn!(error = %e, "cannot read ConfigMap {NS}/{NAME} (needs get on it: see packaging/kubernetes/rbac-agent.yaml); taking it as no cluster shutdown");
            false
        }
    }
}

/// The operator's name as the API server knows it (a SelfSubjectReview, which every
/// authenticated identity may make), else the local user.
async fn whoami(client: &kube::Client) -> String {
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    let asked = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await;
    asked
        .ok()
        .and_then(|r| r.status?.user_info?.username)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Records the intent (phase stopping), or finds the one a previous run recorded (it resumes).
async fn record_intent(client: &kube::Client, reason: &str) -> Result<(Intent, bool)> {
    if let Some(found) = read_intent(client).await.map_err(api("read the intent"))? {
        return Ok((found, true));
    }
    let intent = Intent {
        phase: Phase::Stopping,
        started_at: jiff::Timestamp::now().to_string(),
        requested_by: whoami(client).await,
        reason: reason.to_string(),
        cordoned: BTreeSet::new(),
    };
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(NAME.into()),
            namespace: Some(NS.into()),
            labels: Some([("app.kubernetes.io/name".into(), "nodeward".into())].into()),
            ..Default::default()
        },
        data: Some(intent.to_data()),
        ..Default::default()
    };
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let pp = PostParams {
        field_manager: Some(crate::names::FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match cms.create(&pp, &cm).await {
        Ok(_) => Ok((intent, false)),
        // Another run recorded it between the read and the create: resume that one.
        Err(kube::Error::Api(s)) if s.code == 409 => read_intent(client)
            .await
            .map_err(api("read the intent"))?
            .map(|found| (found, true))
            .ok_or(Error::Raced),
        Err(e) => Err(api(
            "record the intent (create ConfigMap kube-system/nodeward-cluster-shutdown)",
        )(e)),
    }
}

/// Writes the intent's data over the recorded one.
async fn write_intent(client: &kube::Client, intent: &Intent) -> Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let patch = json!({"data": intent.to_data()});
    cms.patch(
        NAME,
        &crate::node_write::patch_params(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(api("update the intent"))?;
    Ok(())
}

/// The cluster's pods, kept by a watch, and a counter that moves at every event.
struct PodWatch {
    store: Store<Pod>,
    events: tokio::sync::watch::Receiver<u64>,
    _task: crate::task::AbortOnDrop,
}

impl PodWatch {
    /// Starts the watch and waits for its first list.
    async fn start(client: &kube::Client) -> Result<Self> {
        let (store, writer) = reflector::store();
        let (tx, events) = tokio::sync::watch::channel(0u64);
        let stream = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .reflect(writer);
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                if let Err(e) = ev {
                    warn!(error = %e, "the pod watch failed; it starts again");
                }
                tx.send_modify(|n| *n += 1);
            }
        });
        let watch = Self {
            store,
            events,
            _task: crate::task::AbortOnDrop(task),
        };
        tokio::time::timeout(LIST_LIMIT, watch.store.wait_until_ready())
            .await
            .map_err(|_| Error::NotListed(format!("no list within {LIST_LIMIT:?}")))?
            .map_err(|e| Error::NotListed(e.to_string()))?;
        Ok(watch)
    }

    /// Whether the pod is still there (the same object: a StatefulSet's replacement has its name).
    fn holds(&self, p: &PodRef) -> bool {
        let key = ObjectRef::new(&p.name).within(&p.namespace);
        self.store
            .get(&key)
            .is_some_and(|pod| pod.metadata.uid.as_deref() == Some(p.uid.as_str()))
    }

    /// Waits until none of `pods` is there, or `until`; returns those still there.
    async fn wait_gone(&mut self, pods: &[PodRef], until: Instant) -> Vec<PodRef> {
        loop {
            let left: Vec<PodRef> = pods.iter().filter(|p| self.holds(p)).cloned().collect();
            if left.is_empty() {
                return left;
            }
            let wait = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(wait, self.events.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return left,
            }
        }
    }
}

/// How long the first list of the cluster's pods may take.
const LIST_LIMIT: Duration = Duration::from_secs(60);

/// The DaemonSets (`apps/v1`) that exist, by namespace and name, as the drain asks.
async fn daemonsets(client: &kube::Client) -> Result<BTreeSet<(String, String)>> {
    let daemonsets: Api<DaemonSet> = Api::all(client.clone());
    let list = daemonsets
        .list_metadata(&ListParams::default())
        .await
        .map_err(api("list daemonsets"))?;
    Ok(list
        .items
        .into_iter()
        .map(|d| {
            let m = d.metadata;
            (m.namespace.unwrap_or_default(), m.name.unwrap_or_default())
        })
        .collect())
}

/// The plan of the pods the watch holds now.
fn plan_now(
    watch: &PodWatch,
    opts: &ShutdownOptions,
    ds: &BTreeSet<(String, String)>,
    except: &BTreeSet<String>,
) -> ShutdownPlan {
    let pods = watch.store.state();
    let exists = |ns: &str, name: &str| ds.contains(&(ns.to_string(), name.to_string()));
    plan::plan(
        pods.iter().map(Arc::as_ref),
        opts.rules,
        &opts.bands,
        &exists,
        except,
    )
}

/// Every Node.
async fn nodes(client: &kube::Client) -> Result<Vec<Node>> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes
        .list(&ListParams::default())
        .await
        .map_err(api("list nodes"))?
        .items)
}

/// Cordons every node at once as nodeward's; returns the nodes the shutdown holds cordoned:
/// those this run cordoned, those a resumed run had, and those nodeward had cordoned for
/// another reason, whose cordon the shutdown takes over (so nothing lifts it before `cluster
/// start`, which gives it back). A node someone else cordoned keeps their cordon, and `say`
/// names it.
async fn cordon_all(
    client: &kube::Client,
    names: &[String],
    concurrency: usize,
    say: &mut dyn FnMut(&str),
) -> Result<BTreeSet<String>> {
    let outcomes: Vec<(String, CordonOutcome)> = futures::stream::iter(names.iter().cloned())
        .map(|n| async move {
            let o = crate::drain::cordon_taking_over(client, &n, super::CORDON_REASON).await?;
            Ok::<_, Error>((n, o))
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await?;
    let mut mine = BTreeSet::new();
    for (node, outcome) in outcomes {
        match outcome {
            CordonOutcome::Cordoned => {
                mine.insert(node);
            }
            // Cordoned for the shutdown already (a resumed run).
            CordonOutcome::AlreadyOurs => {
                mine.insert(node);
            }
            CordonOutcome::TakenOver { from } => {
                say(&format!(
                    "node {node}: nodeward's cordon ({from}) taken over by the shutdown; `cluster start` gives it back to {from}"
                ));
                mine.insert(node);
            }
            CordonOutcome::AlreadyByOther => say(&format!(
                "node {node}: cordoned by someone else; their cordon stays theirs"
            )),
        }
    }
    Ok(mine)
}

/// Writes the lifecycle conditions `decide` wants on each of `nodes`, `concurrency` at a time; a
/// node that cannot be written is said, not a reason to stop (the cordons are what matter).
async fn say_on_nodes(
    client: &kube::Client,
    nodes: &BTreeSet<String>,
    decide: impl Fn(&Node) -> Vec<crate::lifecycle::Want> + Clone,
    concurrency: usize,
    say: &mut dyn FnMut(&str),
) {
    let failed: Vec<(String, crate::node_write::NodeError)> =
        futures::stream::iter(nodes.iter().cloned())
            .map(|n| {
                let decide = decide.clone();
                async move {
                    let written = crate::lifecycle::write_deciding(client, &n, None, decide, true);
                    written.await.err().map(|e| (n, e))
                }
            })
            .buffer_unordered(concurrency.max(1))
            .filter_map(std::future::ready)
            .collect()
            .await;
    for (n, e) in failed {
        say(&format!(
            "node {n}: its MaintenanceInProgress condition not written ({e}; needs patch on nodes/status)"
        ));
    }
}

/// Deletes one pod gracefully (its own grace period), only if it is still that pod (UID).
/// Gone already (404) or replaced (409) is fine; any other refusal is returned.
async fn delete_pod(client: &kube::Client, p: &PodRef) -> Option<String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &p.namespace);
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(p.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&p.name, &dp).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Stops one wave: deletes its pods, then waits for them to be gone (or the wave's time).
/// Returns the pods still there and those whose deletion was refused.
async fn stop_wave(
    client: &kube::Client,
    watch: &mut PodWatch,
    wave: &Wave,
    opts: &ShutdownOptions,
    say: &mut dyn FnMut(&str),
) -> Vec<PodRef> {
    let until = Instant::now() + opts.wave_timeout;
    let refused: Vec<(PodRef, String)> = futures::stream::iter(wave.pods.iter())
        .map(|p| async move { delete_pod(client, p).await.map(|e| (p.clone(), e)) })
        .buffer_unordered(opts.concurrency.max(1))
        .filter_map(futures::future::ready)
        .collect()
        .await;
    for (p, e) in &refused {
        say(&format!("  {p}: deletion refused: {e}"));
    }
    let sent: Vec<PodRef> = wave
        .pods
        .iter()
        .filter(|p| !refused.iter().any(|(r, _)| r == *p))
        .cloned()
        .collect();
    let mut left = watch.wait_gone(&sent, until).await;
    for p in &left {
        say(&format!(
            "  {p}: still there after {:?}; going on without it",
            opts.wave_timeout
        ));
    }
    left.extend(refused.into_iter().map(|(p, _)| p));
    left
}

/// Prints the plan: the waves with their pods, then what is left alone.
fn print_plan(plan: &ShutdownPlan, say: &mut dyn FnMut(&str)) {
    for (i, w) in plan.waves.iter().enumerate() {
        say(&format!(
            "wave {}: {} ({} pods)",
            i + 1,
            w.key,
            w.pods.len()
        ));
        for p in &w.pods {
            say(&format!("  {p}"));
        }
    }
    for (p, why) in &plan.left {
        say(&format!("not stopped: {p}: {why}"));
    }
}

/// `nodeward cluster shutdown`: records the intent, cordons every node, stops the workloads
/// wave by wave; with `dry_run`, prints the order and changes nothing.
pub async fn shutdown(
    client: &kube::Client,
    opts: &ShutdownOptions,
    say: &mut dyn FnMut(&str),
) -> Result<ShutdownReport> {
    let started = Instant::now();
    let mut watch = PodWatch::start(client).await?;
    let ds = daemonsets(client).await?;
    let names: Vec<String> = nodes(client)
        .await?
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    if opts.dry_run {
        say(&format!(
            "cluster shutdown (dry run: nothing changed): {} nodes to cordon",
            names.len()
        ));
        print_plan(&plan_now(&watch, opts, &ds, &BTreeSet::new()), say);
        return Ok(ShutdownReport::default());
    }
    let (mut intent, resumed) = record_intent(client, &opts.reason).await?;
    say(&format!(
        "cluster shutdown {} (requested by {}, at {}): ConfigMap {NS}/{NAME}",
        if resumed { "resumed" } else { "recorded" },
        intent.requested_by,
        intent.started_at
    ));
    if resumed && intent.reason != opts.reason {
        say(&format!(
            "the resumed shutdown keeps its recorded reason {:?}; --reason {:?} is not recorded",
            intent.reason, opts.reason
        ));
    }
    let mine = cordon_all(client, &names, opts.concurrency, say).await?;
    say(&format!("cordoned {} of {} nodes", mine.len(), names.len()));
    if opts.lifecycle {
        let maintenance = crate::lifecycle::wants(&crate::lifecycle::Moment::ClusterShutdown);
        say_on_nodes(
            client,
            &mine,
            |_| maintenance.clone(),
            opts.concurrency,
            say,
        )
        .await;
    }
    intent.cordoned.extend(mine);
    write_intent(client, &intent).await?;
    let mut report = stop_waves(client, &mut watch, opts, &ds, say).await;
    intent.phase = Phase::Stopped;
    write_intent(client, &intent).await?;
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Stops the waves, planning each from the pods there now (a pod that appeared is planned too;
/// one that did not go in its wave's time is not planned again).
async fn stop_waves(
    client: &kube::Client,
    watch: &mut PodWatch,
    opts: &ShutdownOptions,
    ds: &BTreeSet<(String, String)>,
    say: &mut dyn FnMut(&str),
) -> ShutdownReport {
    let mut report = ShutdownReport::default();
    let mut except = BTreeSet::new();
    let first = plan_now(watch, opts, ds, &except);
    say(&format!(
        "{} waves planned, {} pods to stop; {} left alone",
        first.waves.len(),
        first.waves.iter().map(|w| w.pods.len()).sum::<usize>(),
        first.left.len()
    ));
    let mut last = None;
    loop {
        let wave = match plan::next(plan_now(watch, opts, ds, &except), last) {
            plan::Next::Done => break,
            plan::Next::CameBack(pods) => {
                for p in &pods {
                    say(&format!(
                        "  {p}: bound to a cordoned node after its wave (it tolerates the cordon); left running"
                    ));
                }
                except.extend(pods.iter().map(|p| p.uid.clone()));
                report.not_stopped.extend(pods);
                continue;
            }
            plan::Next::Stop(wave) => wave,
        };
        except.extend(wave.pods.iter().map(|p| p.uid.clone()));
        last = Some(wave.key);
        report.waves += 1;
        let t = Instant::now();
        say(&format!(
            "wave {}: {}: stopping {} pods",
            report.waves,
            wave.key,
            wave.pods.len()
        ));
        let left = stop_wave(client, watch, &wave, opts, say).await;
        let stopped = wave.pods.len() - left.len();
        info!(
            wave = report.waves,
            stopped,
            left = left.len(),
            "wave ended"
        );
        say(&format!(
            "wave {}: {stopped} stopped in {:.1} s",
            report.waves,
            t.elapsed().as_secs_f64()
        ));
        report.stopped += stopped;
        report.not_stopped.extend(left);
    }
    report
}

/// How `cluster start` ended.
#[derive(Debug, Clone, Default)]
pub struct StartReport {
    /// Nodes uncordoned.
    pub uncordoned: Vec<String>,
    /// Nodes the shutdown cordoned that someone else holds cordoned now (left so).
    pub not_ours: Vec<String>,
    /// Nodes whose cordon the shutdown had taken over, given back to their earlier reason
    /// (still cordoned), with that reason.
    pub given_back: Vec<(String, String)>,
    /// Nodes the shutdown cordoned that nodeward holds cordoned for another moment now, with
    /// its reason (left so).
    pub kept: Vec<(String, String)>,
    /// Nodes whose cordon could not be lifted, with why (a node deleted meanwhile, an API
    /// error): the intent is removed all the same.
    pub failed: Vec<(String, String)>,
    /// Whether an intent was recorded.
    pub had_intent: bool,
}

/// What one uncordon of `cluster start` did.
enum Lifted {
    Uncordoned(String),
    GivenBack(String, String),
    Kept(String, String),
    NotOurs(String),
    Failed(String, String),
    Nothing,
}

/// `nodeward cluster start`: lifts the cordons the shutdown made (never anyone else's, nor
/// nodeward's for another moment; one it took over goes back to its earlier reason), then
/// always removes the intent, so the Pending replacements schedule and the scaler acts again;
/// a node it could not uncordon is reported, not a reason to stop.
pub async fn start(client: &kube::Client, concurrency: usize) -> Result<StartReport> {
    let intent = read_intent(client).await.map_err(api("read the intent"))?;
    let recorded = intent
        .as_ref()
        .map(|i| i.cordoned.clone())
        .unwrap_or_default();
    let todo = plan::start_plan(&nodes(client).await?, &recorded);
    let by = crate::drain::Lifter::Reason(super::CORDON_REASON);
    let lifted: Vec<Lifted> = futures::stream::iter(todo.lift.iter().cloned())
        .map(|n| async move {
            match crate::drain::uncordon(client, &n, false, by).await {
                Ok(UncordonOutcome::Uncordoned) => Lifted::Uncordoned(n),
                Ok(UncordonOutcome::GivenBack { reason }) => Lifted::GivenBack(n, reason),
                Ok(UncordonOutcome::Kept { reason }) => Lifted::Kept(n, reason),
                Ok(UncordonOutcome::NotCordoned) => Lifted::Nothing,
                // Someone cordoned it since the snapshot: theirs now.
                Err(crate::drain::exec::Error::CordonedByOther { .. }) => Lifted::NotOurs(n),
                Err(crate::drain::exec::Error::NodeNotFound { .. }) => Lifted::Nothing,
                Err(e) => Lifted::Failed(n, e.to_string()),
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    // What the shutdown said on its nodes (whatever `[conditions] lifecycle` said then: only a
    // MaintenanceInProgress the shutdown wrote is cleared).
    let mut quiet = |line: &str| warn!("{line}");
    let over = crate::lifecycle::cluster_started;
    say_on_nodes(client, &recorded, over, concurrency, &mut quiet).await;
    let mut report = StartReport {
        not_ours: todo.not_ours,
        kept: todo.kept,
        had_intent: intent.is_some(),
        ..StartReport::default()
    };
    for l in lifted {
        match l {
            Lifted::Uncordoned(n) => report.uncordoned.push(n),
            Lifted::GivenBack(n, r) => report.given_back.push((n, r)),
            Lifted::Kept(n, r) => report.kept.push((n, r)),
            Lifted::NotOurs(n) => report.not_ours.push(n),
            Lifted::Failed(n, e) => report.failed.push((n, e)),
            Lifted::Nothing => {}
        }
    }
    if intent.is_some() {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
        match cms.delete(NAME, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api("remove the intent")(e)),
        }
    }
    report.uncordoned.sort();
    report.given_back.sort();
    report.kept.sort();
    report.not_ours.sort();
    report.failed.sort();
    Ok(report)
}
