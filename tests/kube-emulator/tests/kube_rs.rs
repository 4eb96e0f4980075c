//! kube-rs against the emulator: the client behaviours nodeward relies on — watches that resume
//! after the server drops them, relisting after 410, chunked lists, optimistic concurrency and
//! how eviction answers (201/429/500) surface through kube's error type.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config};
use kube_emulator::{Emulator, EmulatorHandle, EmulatorOptions, FaultRule, PodSeed};
use serde_json::json;

/// Generous bound on any single wait in these tests; they normally take milliseconds.
const WAIT: Duration = Duration::from_secs(10);

async fn start(opts: EmulatorOptions) -> EmulatorHandle {
    Emulator::start(opts).await.expect("emulator starts")
}

/// A client from the emulator's kubeconfig, with kube's default retry on or off.
async fn client(emu: &EmulatorHandle, default_retry: bool) -> Client {
    let kubeconfig = Kubeconfig::read_from(emu.kubeconfig_path()).expect("kubeconfig reads");
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig is valid");
    config.default_retry = default_retry;
    Client::try_from(config).expect("client builds")
}

fn api_error(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn next<S, T>(stream: &mut S) -> T
where
    S: futures::Stream<Item = Result<T, watcher::Error>> + Unpin,
{
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("an event within the wait")
        .expect("stream continues")
        .expect("no watcher error")
}

fn pod_name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_resumes_after_watches_are_closed() {
    let emu = start(EmulatorOptions::default()).await;
    for i in 0..3 {
        emu.seed_pod(PodSeed::new("default", &format!("p{i}")))
            .expect("seeded");
    }
    let pods: Api<Pod> = Api::namespaced(client(&emu, false).await, "default");
    let mut stream = watcher::watcher(pods, watcher::Config::default()).boxed();
    assert!(matches!(next(&mut stream).await, Event::Init));
    let mut initial = Vec::new();
    loop {
        match next(&mut stream).await {
            Event::InitApply(p) => initial.push(pod_name(&p)),
            Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, ["p0", "p1", "p2"]);

    emu.seed_pod(PodSeed::new("default", "p3")).expect("seeded");
    assert!(matches!(next(&mut stream).await, Event::Apply(p) if pod_name(&p) == "p3"));

    emu.close_watches();
    emu.seed_pod(PodSeed::new("default", "p4")).expect("seeded");
    // The watcher re-watches from the last resourceVersion it saw and gets p4 from history,
    // without listing again.
    assert!(matches!(next(&mut stream).await, Event::Apply(p) if pod_name(&p) == "p4"));
    assert!(emu.count_requests("watch", "pods", "") >= 2);
    assert_eq!(emu.count_requests("list", "pods", ""), 1);
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_relists_after_410() {
    let emu = start(EmulatorOptions::default()).await;
    emu.seed_pod(PodSeed::new("default", "watched").label("app", "w"))
        .expect("seeded");
    let client = client(&emu, false).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let config = watcher::Config::default().labels("app=w");
    let mut stream = watcher::watcher(pods.clone(), config).boxed();
    while !matches!(next(&mut stream).await, Event::InitDone) {}

    // Move the resourceVersion on without the watcher seeing it, then drop history.
    for i in 0..5 {
        emu.seed_pod(PodSeed::new("default", &format!("other{i}")))
            .expect("seeded");
    }
    emu.compact_history();
    emu.close_watches();
    // kube-runtime surfaces the 410 once, then relists.
    let gone = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("an item")
        .expect("stream continues");
    match gone {
        Err(watcher::Error::WatchError(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected the 410 watch error, got {other:?}"),
    }
    assert!(matches!(next(&mut stream).await, Event::Init));
    assert!(matches!(next(&mut stream).await, Event::InitApply(p) if pod_name(&p) == "watched"));
    assert!(matches!(next(&mut stream).await, Event::InitDone));
    assert_eq!(emu.count_requests("list", "pods", ""), 2);

    // The raw watch shows the apiserver's ERROR event.
    let mut raw = pods
        .watch(&WatchParams::default(), "1")
        .await
        .expect("watch starts")
        .boxed();
    let first = tokio::time::timeout(WAIT, raw.try_next())
        .await
        .expect("an event")
        .expect("decodes")
        .expect("one event");
    match first {
        WatchEvent::Error(status) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
            assert!(
                status.message.starts_with("too old resource version: 1 ("),
                "{}",
                status.message
            );
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_lists() {
    let emu = start(EmulatorOptions::default()).await;
    for i in 0..25 {
        emu.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": format!("cm{i:02}"), "namespace": "default"},
                          "data": {"i": i.to_string()}}))
            .expect("created");
    }
    let cms: Api<ConfigMap> = Api::namespaced(client(&emu, false).await, "default");
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    let mut versions = Vec::new();
    let mut remaining = Vec::new();
    loop {
        let mut lp = ListParams::default().limit(10);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = cms.list(&lp).await.expect("page lists");
        names.extend(
            page.items
                .iter()
                .map(|c| c.metadata.name.clone().unwrap_or_default()),
        );
        versions.push(page.metadata.resource_version.clone());
        remaining.push(page.metadata.remaining_item_count);
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    assert_eq!(names.len(), 25);
    assert_eq!(names.first().map(String::as_str), Some("cm00"));
    assert_eq!(names.last().map(String::as_str), Some("cm24"));
    assert!(versions.windows(2).all(|w| w[0] == w[1]), "{versions:?}");
    assert_eq!(remaining, [Some(15), Some(5), None]);

    // A continue token from before a compaction is refused with 410.
    let page = cms
        .list(&ListParams::default().limit(10))
        .await
        .expect("lists");
    emu.create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}}))
        .expect("created");
    emu.compact_history();
    let token = page.metadata.continue_.expect("a continue token");
    let err = cms
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .expect_err("expired");
    let status = api_error(err);
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_resource_versions_conflict() {
    let emu = start(EmulatorOptions::default()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&emu, false).await, "default");
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "c"}, "data": {"k": "1"}
    }))
    .expect("configmap");
    let created = cms
        .create(&PostParams::default(), &cm)
        .await
        .expect("created");
    let dup = api_error(
        cms.create(&PostParams::default(), &cm)
            .await
            .expect_err("exists"),
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(dup.message, "configmaps \"c\" already exists");

    let mut first = created.clone();
    first.data = Some([("k".to_string(), "2".to_string())].into());
    let replaced = cms
        .replace("c", &PostParams::default(), &first)
        .await
        .expect("replaced");
    assert_ne!(
        replaced.metadata.resource_version,
        created.metadata.resource_version
    );

    // `first` still carries the old resourceVersion.
    let stale = api_error(
        cms.replace("c", &PostParams::default(), &first)
            .await
            .expect_err("stale"),
    );
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        stale.message,
        "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; please apply your changes to the latest version and try again"
    );

    let patch = json!({"metadata": {"resourceVersion": created.metadata.resource_version}, "data": {"k": "3"}});
    let stale = api_error(
        cms.patch("c", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect_err("stale patch"),
    );
    assert_eq!(stale.code, 409);

    let missing = api_error(cms.get("nope").await.expect_err("missing"));
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_answers_are_classified() {
    let emu = start(EmulatorOptions {
        grace_scale: 0.001,
        ..EmulatorOptions::default()
    })
    .await;
    for n in ["n1", "n2"] {
        emu.seed_node(n).expect("node");
    }
    for (name, node) in [("db-1", "n1"), ("db-2", "n1"), ("db-3", "n2")] {
        emu.seed_pod(
            PodSeed::new("default", name)
                .node(node)
                .label("app", "db")
                .owner("ReplicaSet", "db")
                .ready(true),
        )
        .expect("pod");
    }
    emu.create(
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                      "metadata": {"name": "db", "namespace": "default"},
                      "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "db"}}}}),
    )
    .expect("pdb");
    let client = client(&emu, false).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let status = pdbs.get("db").await.expect("pdb").status.expect("status");
    assert_eq!(
        (
            status.current_healthy,
            status.desired_healthy,
            status.disruptions_allowed
        ),
        (3, 2, 1)
    );

    let ok = pods
        .evict("db-1", &EvictParams::default())
        .await
        .expect("201");
    assert!(ok.is_success());
    let blocked = api_error(
        pods.evict("db-2", &EvictParams::default())
            .await
            .expect_err("429"),
    );
    assert_eq!(
        (blocked.code, blocked.reason.as_str()),
        (429, "TooManyRequests")
    );
    assert_eq!(
        blocked.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    let cause = blocked
        .details
        .as_ref()
        .and_then(|d| d.causes.first())
        .expect("a cause");
    assert_eq!(cause.reason, "DisruptionBudget");
    assert_eq!(
        cause.message,
        "The disruption budget db needs 2 healthy pods and has 2 currently"
    );

    emu.create(
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                      "metadata": {"name": "db-too", "namespace": "default"},
                      "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "db"}}}}),
    )
    .expect("second pdb");
    let two = api_error(
        pods.evict("db-2", &EvictParams::default())
            .await
            .expect_err("500"),
    );
    assert_eq!(two.code, 500);
    assert_eq!(
        two.message,
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    );
    let missing = api_error(
        pods.evict("nope", &EvictParams::default())
            .await
            .expect_err("404"),
    );
    assert_eq!(missing.code, 404);

    // The evicted pod goes once its (scaled) grace period ends.
    tokio::time::timeout(WAIT, async {
        while pods.get_opt("db-1").await.expect("get").is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("db-1 removed");

    for snap in emu.pdb_history("default", "db") {
        assert!(
            snap.current_healthy >= snap.desired_healthy,
            "budget violated: {snap:?}"
        );
    }
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_retry_rides_over_injected_503() {
    let emu = start(EmulatorOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(client(&emu, true).await, "default");
    emu.add_fault(FaultRule::count("list", "pods", 503, 2));
    let list = pods
        .list(&ListParams::default())
        .await
        .expect("retried to success");
    assert!(list.items.is_empty());
    assert_eq!(emu.count_requests("list", "pods", ""), 3);

    let no_retry: Api<Pod> = Api::namespaced(client(&emu, false).await, "default");
    emu.add_fault(FaultRule::count("get", "pods", 500, 1));
    let e = api_error(no_retry.get("x").await.expect_err("injected"));
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_scoped_watch_sees_selector_transitions_and_bookmarks() {
    let emu = start(EmulatorOptions {
        bookmark_interval: Duration::from_millis(100),
        ..EmulatorOptions::default()
    })
    .await;
    emu.seed_pod(PodSeed::new("default", "mover").node("n1"))
        .expect("pod");
    let pods: Api<Pod> = Api::all(client(&emu, false).await);
    // Bookmarks are on by default in kube's WatchParams.
    let wp = WatchParams::default().fields("spec.nodeName=n1");
    let rv = emu.resource_version().to_string();
    let mut stream = pods.watch(&wp, &rv).await.expect("watch").boxed();
    let mut next_event = async || {
        tokio::time::timeout(WAIT, stream.try_next())
            .await
            .expect("an event")
            .expect("decodes")
            .expect("stream open")
    };
    emu.modify("pods", Some("default"), "mover", |p| {
        p["spec"]["nodeName"] = json!("n2")
    })
    .expect("moved");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match next_event().await {
            WatchEvent::Deleted(p) => {
                assert_eq!(p.spec.and_then(|s| s.node_name).as_deref(), Some("n1"));
                seen.push("DELETED");
                emu.modify("pods", Some("default"), "mover", |p| {
                    p["spec"]["nodeName"] = json!("n1");
                })
                .expect("moved back");
            }
            WatchEvent::Added(p) => {
                assert_eq!(p.spec.and_then(|s| s.node_name).as_deref(), Some("n1"));
                seen.push("ADDED");
            }
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["DELETED", "ADDED"]);
    loop {
        if let WatchEvent::Bookmark(b) = next_event().await {
            assert_eq!(
                b.metadata.resource_version,
                emu.resource_version().to_string()
            );
            break;
        }
    }

    // Graceful deletion through kube: the object comes back with a deletionTimestamp.
    let ns: Api<Pod> = Api::namespaced(client(&emu, false).await, "default");
    let deleted = ns
        .delete("mover", &DeleteParams::default())
        .await
        .expect("deleted");
    let pod = deleted.left().expect("a pod still terminating");
    assert!(pod.metadata.deletion_timestamp.is_some());
    assert_eq!(pod.metadata.deletion_grace_period_seconds, Some(30));
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_watcher_gets_initial_events_end() {
    let emu = start(EmulatorOptions::default()).await;
    for i in 0..3 {
        emu.seed_pod(PodSeed::new("default", &format!("s{i}")))
            .expect("seeded");
    }
    let pods: Api<Pod> = Api::namespaced(client(&emu, false).await, "default");
    let config = watcher::Config::default().streaming_lists();
    let mut stream = watcher::watcher(pods, config).boxed();
    assert!(matches!(next(&mut stream).await, Event::Init));
    let mut n = 0;
    while let Event::InitApply(_) = next(&mut stream).await {
        n += 1;
    }
    assert_eq!(n, 3);
    assert_eq!(emu.count_requests("list", "pods", ""), 0);
    emu.shutdown().await;
}

/// The owner of a Node's `spec.unschedulable` is in managedFields, as kube-apiserver keeps it
/// for an update: whoever last changed the field owns it (`fieldManager`, else the
/// User-Agent's product), and removing it leaves no owner. nodeward reads it to tell its own
/// cordon from a `kubectl cordon` over its stale record.
#[tokio::test]
async fn managed_fields_follow_the_owner_of_unschedulable() {
    use k8s_openapi::api::core::v1::Node;
    let emu = start(EmulatorOptions::default()).await;
    emu.seed_node("n").expect("node");
    let nodes: Api<Node> = Api::all(client(&emu, false).await);
    let owners = |n: &Node| -> Vec<String> {
        n.metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|e| {
                e.fields_v1
                    .as_ref()
                    .and_then(|f| f.0.pointer("/f:spec/f:unschedulable"))
                    .is_some()
            })
            .filter_map(|e| e.manager.clone())
            .collect()
    };
    let set = |manager: &str, v: serde_json::Value| {
        let pp = PatchParams {
            field_manager: Some(manager.into()),
            ..PatchParams::default()
        };
        let nodes = nodes.clone();
        async move {
            nodes
                .patch(
                    "n",
                    &pp,
                    &Patch::Strategic(json!({"spec": {"unschedulable": v}})),
                )
                .await
                .expect("patch")
        }
    };
    let n = set("nodeward", json!(true)).await;
    assert_eq!(owners(&n), ["nodeward"]);
    let entry = n
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .find(|e| e.manager.as_deref() == Some("nodeward"))
        .expect("entry");
    assert_eq!(entry.operation.as_deref(), Some("Update"));
    assert!(entry.time.is_some());
    assert_eq!(
        owners(&set("kubectl-cordon", json!(true)).await),
        ["nodeward"],
        "unchanged: ownership stays"
    );
    assert!(
        owners(&set("kubectl-cordon", json!(null)).await).is_empty(),
        "removed: no owner"
    );
    assert_eq!(
        owners(&set("kubectl-cordon", json!(true)).await),
        ["kubectl-cordon"]
    );
    let other = nodes
        .patch(
            "n",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect("label");
    assert_eq!(
        owners(&other),
        ["kubectl-cordon"],
        "a write of another field moves nothing"
    );
}
