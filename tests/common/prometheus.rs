//! The real Prometheus server (built from its Go module by `scripts/lib.sh`'s `prometheus_cmd`,
//! found through `NODEWARD_PROMETHEUS`), started on a free loopback port with the rules a test
//! gives, its rules reloadable.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the tests find the server.
pub const PROMETHEUS_ENV: &str = "NODEWARD_PROMETHEUS";

/// One answer of the API is quick on loopback; this bounds a hung one.
pub const REQUEST: Duration = Duration::from_secs(5);

/// Prometheus starts (replays an empty TSDB, loads the rules) in a second or two; a loaded CI
/// machine gets ten times that.
const START: Duration = Duration::from_secs(30);

/// The real server, killed when dropped (a failed assertion included).
pub struct Prometheus {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
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
    /// Starts `bin` on a free loopback port with a fresh data directory and `rules` (a rule
    /// file's YAML), and waits until it says it is ready.
    pub async fn start(bin: &Path, rules: &str) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(dir.path().join("rules.yaml"), rules).expect("write rules.yaml");
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
            .arg("--web.enable-lifecycle")
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

    /// Replaces the rules and has the server reload them (`POST /-/reload`).
    pub async fn reload(&self, rules: &str) {
        std::fs::write(self._dir.path().join("rules.yaml"), rules).expect("write rules.yaml");
        let answer = reqwest::Client::new()
            .post(format!("{}/-/reload", self.base))
            .timeout(REQUEST)
            .send()
            .await
            .expect("POST /-/reload");
        assert!(
            answer.status().is_success(),
            "reload: {}\n{}",
            answer.status(),
            self.log()
        );
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(no log: {e})"))
    }
}

/// The server's binary, or a failure saying how to build it.
pub fn prometheus_bin() -> PathBuf {
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
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
