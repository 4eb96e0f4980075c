//! `nodeward::reboot::alerts` against the real Prometheus server, built from its Go module at the
//! version promtool is (scripts/lib.sh's `prometheus_cmd`): a coordinated reboot waits while an
//! alert fires, so what counts as firing is what that server's `GET /api/v1/alerts` says, not
//! what a hand-written answer says.
//!
//! `scripts/reboot-alerts-check` builds the server (cached by version) and runs this with
//! `NODEWARD_PROMETHEUS=/path/to/prometheus -- --ignored`; started without that variable the real
//! test fails and says so.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nodeward::reboot::alerts::{blocking, firing};

const PROMETHEUS_ENV: &str = "NODEWARD_PROMETHEUS";

/// One answer of the API is quick on loopback; this bounds a hung one.
const REQUEST: Duration = Duration::from_secs(5);

/// Prometheus starts (replays an empty TSDB, loads the rules) in a second or two; a loaded CI
/// machine gets ten times that.
const START: Duration = Duration::from_secs(30);

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

/// The real server, killed when dropped (a failed assertion included).
struct Prometheus {
    child: Child,
    base: String,
    log: PathBuf,
    // Dropped after the kill: the data directory and the log live here.
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts `bin` on a free loopback port with a fresh data directory and [`RULES`], and waits
    /// until it says it is ready.
    async fn start(bin: &Path) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write rules.yaml");
        std::fs::write(
            dir.path().join("prometheus.yml"),
            "global:\n  evaluation_interval: 1s\nrule_files:\n  - rules.yaml\n",
        )
        .expect("write prometheus.yml");
        let port = free_port();
        let log = dir.path().join("prometheus.log");
        let out = std::fs::File::create(&log).expect("create prometheus.log");
        let err = out.try_clone().expect("prometheus.log");
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut p = Prometheus {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
            _dir: dir,
        };
        let client = reqwest::Client::new();
        let ready = format!("{}/-/ready", p.base);
        let deadline = Instant::now() + START;
        loop {
            if let Some(status) = p.child.try_wait().expect("wait for prometheus") {
                panic!(
                    "prometheus exited ({status}) before it was ready:\n{}",
                    p.log()
                );
            }
            let answer = client.get(&ready).timeout(REQUEST).send().await;
            if answer.is_ok_and(|a| a.status().is_success()) {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready at {ready} after {START:?}:\n{}",
                p.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(no log: {e})"))
    }
}

fn prometheus_bin() -> PathBuf {
    let bin = std::env::var_os(PROMETHEUS_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "this test needs the real Prometheus server: run scripts/reboot-alerts-check (it \
                 builds github.com/prometheus/prometheus/cmd/prometheus from the Go module, needs \
                 Go 1.26+) or set {PROMETHEUS_ENV}=/path/to/prometheus"
            )
        });
    assert!(
        bin.is_file(),
        "{PROMETHEUS_ENV}={}: no such file; run scripts/reboot-alerts-check, which builds it",
        bin.display()
    );
    bin
}

/// A loopback port nothing listens on (the OS's pick, let go again).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[tokio::test]
#[ignore = "needs the real Prometheus: scripts/reboot-alerts-check runs it with NODEWARD_PROMETHEUS"]
async fn the_real_prometheus_firing_alerts_are_read_and_ignored_ones_do_not_block() {
    let prometheus = Prometheus::start(&prometheus_bin()).await;
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
