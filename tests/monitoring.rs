//! The shipped monitoring (packaging/monitoring: Prometheus alert rules, a Grafana dashboard)
//! names only metrics the binaries export, and the book's monitoring chapter
//! (docs/src/monitoring.md) documents every metric the agent exports. (`promtool check rules` and
//! `promtool test rules` check the rules themselves, in scripts/test.)

use std::collections::BTreeSet;

use nodeward::metrics_http::Exposition;

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Metric families in a text exposition (`# TYPE name kind`).
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Every `nodeward_…` name in `text`.
fn named(text: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"nodeward_[a-z_]+").expect("regex");
    re.find_iter(text).map(|m| m.as_str().to_string()).collect()
}

/// The agent's metrics with a series in every family (an empty family is not exposed).
fn agent() -> nodeward::agent::metrics::AgentMetrics {
    let agent = nodeward::agent::metrics::AgentMetrics::default();
    agent.drain.answered(201);
    agent
        .drain
        .ended(nodeward::drain::DrainOutcome::Drained, 1.0);
    agent.drain.pods_ended(&nodeward::drain::DrainReport {
        node: "n".into(),
        outcome: nodeward::drain::DrainOutcome::Drained,
        evicted: Vec::new(),
        skipped: Vec::new(),
        refused: Vec::new(),
        left_behind: Vec::new(),
        force_deleted: Vec::new(),
        unsatisfiable: Vec::new(),
        eviction_requests: 0,
        stopped: Vec::new(),
        elapsed: std::time::Duration::ZERO,
    });
    // A drain that ended leaves its gauges at 0, each `waiting_on` included.
    drop(agent.drain.started());
    // A counter family has no series until its first reboot ends.
    agent.reboot.ended("done");
    agent
}

fn exported() -> BTreeSet<String> {
    use nodeward::scaler::metrics::{failure, group};
    let scaler = nodeward::scaler::metrics::Metrics::default();
    scaler.group_size.get_or_create(&group("g")).set(1);
    scaler.scale_ups.get_or_create(&group("g")).inc();
    scaler.scale_downs.get_or_create(&group("g")).inc();
    scaler.failures.get_or_create(&failure("g", "create")).inc();
    let mut all = families(&agent().metrics());
    all.extend(families(&scaler.metrics()));
    all
}

/// Metrics of other exporters the dashboard may name, each with the exporter that has it:
/// kube-state-metrics exports every Node condition (a powered-off node's too, which its own
/// agent cannot), the source of "nodes by lifecycle condition".
const THIRD_PARTY: &[(&str, &str)] = &[("kube_node_status_condition", "kube-state-metrics")];

fn is_exported(name: &str, exported: &BTreeSet<String>) -> bool {
    THIRD_PARTY.iter().any(|(m, _)| *m == name)
        || exported.iter().any(|f| {
            name == f
                || ["_total", "_bucket", "_count", "_sum"]
                    .iter()
                    .any(|s| name == format!("{f}{s}"))
        })
}

#[test]
fn alerts_and_dashboard_name_only_exported_metrics() {
    let exported = exported();
    let rules: serde_json::Value =
        serde_norway::from_str(&repo_file("packaging/monitoring/alerts.yaml"))
            .expect("alerts.yaml is YAML");
    let exprs: Vec<String> = rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| r["expr"].as_str().expect("expr").to_string())
        .collect();
    assert!(exprs.len() >= 5, "{exprs:?}");
    let dashboard: serde_json::Value =
        serde_json::from_str(&repo_file("packaging/monitoring/dashboard.json"))
            .expect("dashboard.json is JSON");
    let targets: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("expr").to_string())
        .collect();
    assert!(targets.len() >= 8, "{targets:?}");
    for (file, exprs) in [("alerts.yaml", &exprs), ("dashboard.json", &targets)] {
        for e in exprs {
            for name in named(e) {
                assert!(
                    is_exported(&name, &exported),
                    "{file}: {name} (in `{e}`) is not a metric nodeward exports; exported: {exported:?}"
                );
            }
        }
    }
}

#[test]
fn the_monitoring_chapter_documents_every_metric_the_agent_exports() {
    let readme = repo_file("docs/src/monitoring.md");
    let agent = agent();
    for family in families(&agent.metrics()) {
        assert!(
            readme.contains(&format!("`{family}")),
            "docs/src/monitoring.md does not document {family}"
        );
    }
}
