//! The real `nodeward` binary end to end: render with the shipped template and the real
//! `cloud-init schema` validator, config check, completions, man pages, and drain guards.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::cargo::CommandCargoExt;

const TOKEN: &str = "abcdef.0123456789abcdef";
const TOKEN_SECRET: &str = "0123456789abcdef";

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn nodeward(args: &[&str], env_token: Option<&str>) -> Run {
    let mut cmd = Command::cargo_bin("nodeward").expect("binary built");
    cmd.args(args)
        .env_remove("NODEWARD_BOOTSTRAP_TOKEN")
        .env_remove("RUST_LOG");
    if let Some(t) = env_token {
        cmd.env("NODEWARD_BOOTSTRAP_TOKEN", t);
    }
    let out = cmd.output().expect("run nodeward");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn token_file(dir: &Path, token: &str) -> PathBuf {
    let p = dir.join("token");
    std::fs::write(&p, token).expect("write token");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    p
}

fn render_args<'a>(template: &'a str, values: &'a str, token: &'a str) -> Vec<&'a str> {
    vec![
        "render",
        "--template",
        template,
        "--values",
        values,
        "--token-file",
        token,
    ]
}

fn owned(args: Vec<&str>) -> Vec<String> {
    args.into_iter().map(str::to_string).collect()
}

#[test]
fn example_renders_to_the_golden_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tok = token_file(dir.path(), TOKEN);
    let (t, v) = (
        repo("cloud-init/worker.yaml.tera"),
        repo("cloud-init/values.example.toml"),
    );
    let mut args = render_args(
        t.to_str().expect("utf8"),
        v.to_str().expect("utf8"),
        tok.to_str().expect("utf8"),
    );
    args.push("--check");
    let run = nodeward(&args, None);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let golden =
        std::fs::read_to_string(repo("tests/fixtures/worker.example.yaml")).expect("golden");
    assert_eq!(run.stdout, golden);
    assert!(
        !run.stderr.contains(TOKEN_SECRET),
        "token in logs: {}",
        run.stderr
    );
}

/// Every shipped template, rendered with the example values, passes the real cloud-init schema.
#[test]
fn shipped_templates_pass_cloud_init_schema() {
    let probe = Command::new("cloud-init").arg("--version").output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "cloud-init is not installed: `apt-get install cloud-init` (scripts/test does this)"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let tok = token_file(dir.path(), TOKEN);
    let values = repo("cloud-init/values.example.toml");
    let mut checked = 0;
    for entry in std::fs::read_dir(repo("cloud-init")).expect("cloud-init/") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().ends_with(".tera") {
            continue;
        }
        let out = dir.path().join("user-data");
        let mut args = render_args(
            path.to_str().expect("utf8"),
            values.to_str().expect("utf8"),
            tok.to_str().expect("utf8"),
        );
        args.extend(["--out", out.to_str().expect("utf8")]);
        let run = nodeward(&args, None);
        assert_eq!(run.code, 0, "{}: {}", path.display(), run.stderr);
        let schema = Command::new("cloud-init")
            .args(["schema", "--config-file"])
            .arg(&out)
            .output()
            .expect("run cloud-init schema");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&schema.stdout),
            String::from_utf8_lossy(&schema.stderr)
        );
        assert!(
            schema.status.success(),
            "{}: cloud-init schema: {text}",
            path.display()
        );
        assert!(
            text.contains("Valid cloud-config"),
            "{}: {text}",
            path.display()
        );
        checked += 1;
    }
    assert!(checked >= 1, "no templates found in cloud-init/");
}

#[test]
fn cloud_init_schema_catches_a_bad_document() {
    // Proves the schema check above can fail: a wrong type for a known key.
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "#cloud-config\nruncmd: 5\nwrite_files: nope\n").expect("write");
    let out = Command::new("cloud-init")
        .args(["schema", "--config-file"])
        .arg(&bad)
        .output()
        .expect("cloud-init is not installed: `apt-get install cloud-init`");
    assert!(
        !out.status.success(),
        "cloud-init schema accepted an invalid document"
    );
}

/// Bad input of each kind: non-zero exit, a message naming the problem, and never the secret.
#[test]
fn bad_inputs_fail_with_a_named_problem_and_no_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good_tok = token_file(dir.path(), TOKEN);
    let bad_tok = dir.path().join("bad-token");
    std::fs::write(&bad_tok, "ABCDEF.0123456789abcdef").expect("write");
    let values = repo("cloud-init/values.example.toml");
    let template = repo("cloud-init/worker.yaml.tera");
    let bad_ca = dir.path().join("bad-ca.toml");
    std::fs::write(
        &bad_ca,
        std::fs::read_to_string(&values)
            .expect("values")
            .replace("sha256:8c3d", "sha256:zz3d"),
    )
    .expect("write");
    let undefined = dir.path().join("undefined.tera");
    std::fs::write(
        &undefined,
        "#cloud-config\nhostname: {{ hostname }}\nfoo: {{ extra.rack }}\n",
    )
    .expect("write");
    let syntax = dir.path().join("syntax.tera");
    std::fs::write(&syntax, "#cloud-config\n\nhostname: {{ hostname }\n").expect("write");

    let s = |p: &Path| p.to_str().expect("utf8").to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            owned(render_args(&s(&template), &s(&values), &s(&bad_tok))),
            "[a-z0-9]{6}.[a-z0-9]{16}",
        ),
        (
            owned(render_args(&s(&template), &s(&bad_ca), &s(&good_tok))),
            "sha256:<64 hex digits>",
        ),
        (
            owned(render_args(&s(&undefined), &s(&values), &s(&good_tok))),
            "undefined.tera:3: undefined variable `extra.rack`",
        ),
        (
            owned(render_args(&s(&syntax), &s(&values), &s(&good_tok))),
            "syntax.tera:3:",
        ),
        (
            owned(vec![
                "render",
                "--template",
                &s(&template),
                "--values",
                &s(&values),
                "--set",
                &format!("bootstrap_token={TOKEN}"),
            ]),
            "--token-file",
        ),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = nodeward(&args, None);
        assert_ne!(run.code, 0, "{args:?} succeeded");
        assert!(
            run.stderr.contains(needle),
            "{args:?}: stderr {:?} lacks {needle:?}",
            run.stderr
        );
        for out in [&run.stdout, &run.stderr] {
            assert!(
                !out.contains(TOKEN_SECRET),
                "secret leaked for {args:?}: {out}"
            );
        }
    }
}

#[test]
fn token_from_environment() {
    let (t, v) = (
        repo("cloud-init/worker.yaml.tera"),
        repo("cloud-init/values.example.toml"),
    );
    let args = [
        "render",
        "--template",
        t.to_str().expect("utf8"),
        "--values",
        v.to_str().expect("utf8"),
    ];
    let run = nodeward(&args, Some(TOKEN));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains(&format!("token: \"{TOKEN}\"")));
    let run = nodeward(&args, None);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr.contains("NODEWARD_BOOTSTRAP_TOKEN"),
        "{}",
        run.stderr
    );
}

#[test]
fn out_is_0600_and_untouched_when_rendering_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tok = token_file(dir.path(), TOKEN);
    let out = dir.path().join("user-data");
    let (t, v) = (
        repo("cloud-init/worker.yaml.tera"),
        repo("cloud-init/values.example.toml"),
    );
    let mut args = render_args(
        t.to_str().expect("utf8"),
        v.to_str().expect("utf8"),
        tok.to_str().expect("utf8"),
    );
    args.extend(["--out", out.to_str().expect("utf8")]);
    let run = nodeward(&args, None);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.is_empty(), "--out must not also print");
    let mode = std::fs::metadata(&out).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let first = std::fs::read_to_string(&out).expect("read");
    assert!(first.starts_with("#cloud-config"));

    let broken = dir.path().join("broken.tera");
    std::fs::write(&broken, "#cloud-config\n{{ nope }}\n").expect("write");
    let mut args = render_args(
        broken.to_str().expect("utf8"),
        v.to_str().expect("utf8"),
        tok.to_str().expect("utf8"),
    );
    args.extend(["--out", out.to_str().expect("utf8")]);
    let run = nodeward(&args, None);
    assert_ne!(run.code, 0);
    assert_eq!(
        std::fs::read_to_string(&out).expect("read"),
        first,
        "failed render changed --out"
    );
    let entries = std::fs::read_dir(dir.path()).expect("readdir").count();
    assert_eq!(entries, 3, "a temporary file was left behind");
}

#[test]
fn config_check_names_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("config.toml");
    std::fs::copy(repo("packaging/config.toml"), &cfg).expect("copy");
    let run = nodeward(
        &["config", "check", "--config", cfg.to_str().expect("utf8")],
        None,
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    std::fs::create_dir(dir.path().join("config.d")).expect("mkdir");
    std::fs::write(
        dir.path().join("config.d/10-x.toml"),
        "[drain]\n\ntimeout = \"soon\"\n",
    )
    .expect("write");
    let run = nodeward(
        &["config", "check", "--config", cfg.to_str().expect("utf8")],
        None,
    );
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("10-x.toml:3:11: key `drain.timeout`"),
        "{}",
        run.stderr
    );
}

/// `config check` shows the effective configuration as TOML with each value's origin (never Rust
/// Debug), and as JSON for scripts.
#[test]
fn config_check_shows_each_value_and_its_origin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, "[drain]\nforce = true\n").expect("write");
    std::fs::create_dir(dir.path().join("config.d")).expect("mkdir");
    let dropin = dir.path().join("config.d/10-x.toml");
    std::fs::write(&dropin, "[drain]\ntimeout = \"2m\"\n").expect("write");
    let args = ["config", "check", "--config", cfg.to_str().expect("utf8")];
    let run = nodeward(&args, None);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!run.stdout.contains("Settings {"), "{}", run.stdout);
    for line in [
        format!("timeout = \"2m\"  # {}", dropin.display()),
        format!("force = true  # {}", cfg.display()),
        "on_deadline = \"abandon\"  # default".to_string(),
    ] {
        assert!(run.stdout.contains(&line), "{line:?} in\n{}", run.stdout);
    }
    let mut json_args = args.to_vec();
    json_args.extend(["--output", "json"]);
    let run = nodeward(&json_args, None);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON");
    assert_eq!(v["config"]["drain"]["timeout"], "2m");
    assert_eq!(
        v["origins"]["drain.timeout"],
        dropin.display().to_string().as_str()
    );
    assert_eq!(v["origins"]["agent.boot_deadline"], "default");
}

#[test]
fn completions_and_man_pages_are_generated() {
    let run = nodeward(&["completions", "bash"], None);
    assert_eq!(run.code, 0);
    assert!(
        run.stdout.contains("complete -F"),
        "bash completion script expected"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let run = nodeward(
        &["man", "--out-dir", dir.path().to_str().expect("utf8")],
        None,
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let page = std::fs::read_to_string(dir.path().join("nodeward.1")).expect("nodeward.1");
    assert!(page.contains(".TH nodeward"), "not a man page");
    assert!(dir.path().join("nodeward-render.1").exists());
}

#[test]
fn drain_does_nothing_while_the_no_drain_marker_exists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("no-drain");
    // A kubeconfig that points nowhere: if the drain ran, it would fail to read it.
    let drain = || {
        Command::cargo_bin("nodeward")
            .expect("binary")
            .args(["drain", "node-x", "--kubeconfig", "/nonexistent/kubeconfig"])
            .env("NODEWARD_NO_DRAIN_MARKER", &marker)
            .output()
            .expect("run")
    };
    std::fs::write(&marker, "").expect("marker");
    let out = drain();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("not draining"));
    std::fs::remove_file(&marker).expect("rm");
    let out = drain();
    assert_eq!(
        out.status.code(),
        Some(1),
        "without the marker the drain runs (and fails here)"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/kubeconfig"));
}

#[test]
fn drain_ends_by_its_deadline_when_the_api_server_never_answers() {
    // An API server that accepts connections and never answers (a frozen or overloaded one: the
    // kernel completes the handshake, nobody reads). `nodeward drain` must give up at its
    // deadline instead of waiting on its first request (nodeward-drain.service's ExecStop at a
    // shutdown would otherwise hold it until systemd kills the unit).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    kube_emulator::write_kubeconfig(&kubeconfig, &format!("http://127.0.0.1:{port}"))
        .expect("kubeconfig");
    let kubeconfig = kubeconfig.to_str().expect("utf-8 path");
    let started = std::time::Instant::now();
    let mut child = Command::cargo_bin("nodeward")
        .expect("binary")
        .args([
            "drain",
            "node-x",
            "--kubeconfig",
            kubeconfig,
            "--timeout",
            "2s",
        ])
        .env("NODEWARD_NO_DRAIN_MARKER", dir.path().join("absent"))
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if started.elapsed() > std::time::Duration::from_secs(30) {
            child.kill().ok();
            panic!(
                "nodeward drain --timeout 2s still runs after 30 s against an API server that never answers"
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let took = started.elapsed();
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        status.code(),
        Some(3),
        "exit 3 (deadline); stderr: {stderr}"
    );
    assert!(stderr.contains("deadline"), "{stderr}");
    assert!(
        took < std::time::Duration::from_secs(10),
        "took {took:?} for a 2 s deadline"
    );
    drop(listener);
}

/// `nodeward reboot` writes the request file the agent watches, `--cancel` removes it and says
/// when the sentinel still asks; with `[reboot]` off it refuses and says how to turn it on.
#[test]
fn reboot_asks_and_cancel_withdraws() {
    let dir = tempfile::tempdir().expect("tempdir");
    let request = dir.path().join("run/reboot-requested");
    let sentinel = dir.path().join("reboot-required");
    let config = dir.path().join("config.toml");
    let write = |enabled: bool| {
        std::fs::write(
            &config,
            format!(
                "[reboot]\nenabled = {enabled}\nrequest_file = \"{}\"\nsentinel = \"{}\"\n",
                request.display(),
                sentinel.display()
            ),
        )
        .expect("config")
    };
    let cfg = config.display().to_string();
    write(false);
    let off = nodeward(&["--config", &cfg, "reboot"], None);
    assert_eq!(off.code, 1, "{off:?}");
    assert!(
        off.stderr.contains("enabled = true in [reboot]"),
        "{}",
        off.stderr
    );
    assert!(!request.exists());

    write(true);
    let ask = nodeward(&["--config", &cfg, "reboot"], None);
    assert_eq!(ask.code, 0, "{ask:?}");
    assert!(request.exists(), "the request file is written");
    std::fs::write(&sentinel, "*** System restart required ***\n").expect("sentinel");
    let cancel = nodeward(&["--config", &cfg, "reboot", "--cancel"], None);
    assert_eq!(cancel.code, 0, "{cancel:?}");
    assert!(!request.exists(), "the request file is removed");
    assert!(
        cancel.stdout.contains("still asks for a reboot"),
        "{}",
        cancel.stdout
    );
}
