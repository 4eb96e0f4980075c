//! `nodeward::reboot::alerts` against the real Prometheus server, built from its Go module at the
//! version promtool is (scripts/lib.sh's `prometheus_cmd`): a coordinated reboot waits while an
//! alert fires, so what counts as firing is what that server's `GET /api/v1/alerts` says, not
//! what a hand-written answer says.
//!
//! `scripts/reboot-alerts-check` builds the server (cached by version) and runs this with
//! `NODEWARD_PROMETHEUS=/path/to/prometheus -- --ignored`; started without that variable the real
//! test fails and says so.

mod common;

use std::time::{Duration, Instant};

use common::prometheus::{Prometheus, REQUEST, free_port, prometheus_bin};
use nodeward::reboot::alerts::{blocking, firing};

/// With `interval: 1s` the first evaluation is within a second of the start.
const FIRST_EVALUATION: Duration = Duration::from_secs(15);

/// The rules: one alert always firing (twice, on two series, which name one alert), one that
/// never fires (its expression is empty) and one that stays pending (`for: 1h`), which the API
/// lists but which is not firing yet.
const RULES: &str = r#"
groups:
  - name: nodeward-reboot-alerts-test
    interval: 1s
    rules:
      - alert: AlwaysFiring
        expr: label_replace(vector(1), "instance", "a", "", "") or label_replace(vector(1), "instance", "b", "", "")
        for: 0s
      - alert: NeverFiring
        expr: vector(1) == 0
        for: 0s
      - alert: AlwaysPending
        expr: vector(1)
        for: 1h
"#;

#[tokio::test]
#[ignore = "needs the real Prometheus: scripts/reboot-alerts-check runs it with NODEWARD_PROMETHEUS"]
async fn the_real_prometheus_firing_alerts_are_read_and_ignored_ones_do_not_block() {
    let prometheus = Prometheus::start(&prometheus_bin(), RULES).await;
    let client = reqwest::Client::new();

    // Until the first evaluation the list is empty; then every rule has been evaluated once.
    let deadline = Instant::now() + FIRST_EVALUATION;
    let now_firing = loop {
        let now = firing(&client, &prometheus.base, REQUEST)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", prometheus.log()));
        if !now.is_empty() {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "no alert fired within {FIRST_EVALUATION:?}:\n{}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(now_firing, ["AlwaysFiring"]);

    // The pending alert is in the server's answer: `firing` leaves it out, not the server.
    let raw: serde_json::Value = client
        .get(format!("{}/api/v1/alerts", prometheus.base))
        .send()
        .await
        .expect("GET /api/v1/alerts")
        .json()
        .await
        .expect("alerts JSON");
    let states: Vec<(&str, &str)> = raw["data"]["alerts"]
        .as_array()
        .expect("data.alerts")
        .iter()
        .map(|a| {
            (
                a["labels"]["alertname"].as_str().unwrap_or_default(),
                a["state"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        states.contains(&("AlwaysPending", "pending")),
        "the server lists the pending alert: {raw}"
    );
    assert_eq!(
        states
            .iter()
            .filter(|s| **s == ("AlwaysFiring", "firing"))
            .count(),
        2,
        "two series fire under one name: {raw}"
    );

    let ignored = regex::Regex::new("^AlwaysFiring$").expect("regex");
    assert!(blocking(now_firing.clone(), Some(&ignored)).is_empty());
    assert_eq!(blocking(now_firing, None), ["AlwaysFiring"]);

    // A URL that is a server but not the API is an error naming the URL, not "nothing fires".
    let wrong = format!("{}/not-prometheus", prometheus.base);
    let err = firing(&client, &wrong, REQUEST)
        .await
        .expect_err("a 404 is an error");
    assert!(err.contains(&format!("{wrong}/api/v1/alerts")), "{err}");
}

#[tokio::test]
async fn an_unreachable_api_is_an_error_naming_its_url() {
    let base = format!("http://127.0.0.1:{}", free_port());
    let err = firing(&reqwest::Client::new(), &base, REQUEST)
        .await
        .expect_err("nothing listens there");
    assert!(err.contains(&format!("{base}/api/v1/alerts")), "{err}");
}
