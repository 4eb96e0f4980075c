//! The providers against their real counterparts: the Cherry Servers client against the API
//! emulator over HTTP, the exec provider against a real program speaking the JSON protocol.

use std::collections::BTreeMap;
use std::time::Duration;

use cherry_emulator::{CherryEmulator, Fault, Options, PlanSpec};
use nodeward::config::{CherryGroupSettings, CherrySettings, ExecSettings};
use nodeward::scaler::provider::cherry::Cherry;
use nodeward::scaler::provider::exec::Exec;
use nodeward::scaler::provider::{CLUSTER_TAG, CreateSpec, POOL_TAG, Provider};
use nodeward::secret::Secret;

const API_TOKEN: &str = "cherry-api-token-s3cr3t";
const USER_DATA: &str = "#cloud-config\n# token abcdef.0123456789abcdef\n";

async fn emulator() -> CherryEmulator {
    CherryEmulator::start(Options {
        token: API_TOKEN.into(),
        project_id: 7,
        plans: vec![PlanSpec {
            slug: "e5_1620v4".into(),
            cores: 8,
            memory_gb: 32,
        }],
    })
    .await
    .expect("cherry emulator")
}

/// The hostnames cluster "prod"'s Cherry provider lists, sorted.
async fn listed_hosts(emu: &CherryEmulator) -> Vec<String> {
    let c =
        Cherry::new(&cherry_settings(emu.url()), "prod", Some(API_TOKEN.into())).expect("client");
    let mut hosts: Vec<String> = c
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|m| m.hostname)
        .collect();
    hosts.sort();
    hosts
}

fn cherry_settings(url: String) -> CherrySettings {
    CherrySettings {
        api_url: url,
        project_id: Some(7),
        token_file: None,
        ca_file: None,
        request_timeout: Duration::from_secs(5),
    }
}

fn spec(group: &str, hostname: &str) -> CreateSpec {
    CreateSpec {
        group: group.into(),
        hostname: hostname.into(),
        plan: "e5_1620v4".into(),
        region: "eu_nord_1".into(),
        image: "ubuntu_24_04".into(),
        ssh_keys: vec!["12".into()],
        user_data: Secret::new(USER_DATA.into()),
        tags: BTreeMap::from([
            (CLUSTER_TAG.to_string(), "prod".to_string()),
            (POOL_TAG.to_string(), group.to_string()),
        ]),
        cherry: CherryGroupSettings::default(),
    }
}

#[tokio::test]
async fn cherry_create_list_delete_and_plans() {
    let emu = emulator().await;
    let other = emu.insert_server(
        "someone-elses",
        serde_json::json!({CLUSTER_TAG: "other", POOL_TAG: "web"}),
    );
    let c =
        Cherry::new(&cherry_settings(emu.url()), "prod", Some(API_TOKEN.into())).expect("client");
    let m = c
        .create(&spec("web", "k8s-prod-web-1"))
        .await
        .expect("create");
    assert_eq!(
        (m.group.as_str(), m.hostname.as_str()),
        ("web", "k8s-prod-web-1")
    );
    let id: u64 = m.id.parse().expect("numeric id");
    assert_eq!(
        emu.user_data(id).as_deref(),
        Some(USER_DATA),
        "user data arrives base64-decodable"
    );
    let leaving = emu.insert_server(
        "k8s-prod-web-leaving",
        serde_json::json!({CLUSTER_TAG: "prod", POOL_TAG: "web"}),
    );
    emu.set_state(leaving, "terminating");
    let listed = c.list().await.expect("list");
    assert_eq!(
        listed.len(),
        1,
        "only this cluster's tagged servers, not those terminating: {listed:?}"
    );
    c.delete(&m.id).await.expect("delete");
    c.delete(&m.id)
        .await
        .expect("deleting a gone server is fine");
    assert!(c.list().await.expect("list").is_empty());
    assert_eq!(emu.deleted(), vec![id], "server {other} untouched");
    let cap = c
        .plan_capacity("e5_1620v4")
        .await
        .expect("plans")
        .expect("plan known");
    assert_eq!((cap.cpu_milli, cap.memory), (8000, 32 << 30));
    assert!(emu.requests().iter().all(|r| r.authorized));
}

#[tokio::test]
async fn cherry_errors_are_classified() {
    let emu = emulator().await;
    let c =
        Cherry::new(&cherry_settings(emu.url()), "prod", Some(API_TOKEN.into())).expect("client");
    emu.add_fault(Fault {
        method: Some("POST".into()),
        path_contains: "/servers".into(),
        status: 500,
        count: 1,
    });
    let e = c.create(&spec("web", "h1")).await.expect_err("500");
    assert!(e.is_retryable(), "{e}");
    assert!(c.create(&spec("web", "h1")).await.is_ok(), "fault used up");
    // A refused create (quota, bad plan) is for good: decide backs the group off for it.
    emu.add_fault(Fault {
        method: Some("POST".into()),
        path_contains: "/servers".into(),
        status: 422,
        count: 1,
    });
    let e = c.create(&spec("web", "h2")).await.expect_err("422");
    assert!(!e.is_retryable() && e.to_string().contains("422"), "{e}");

    let wrong = Cherry::new(
        &cherry_settings(emu.url()),
        "prod",
        Some("zz-bogus-token".into()),
    )
    .expect("client");
    let e = wrong.list().await.expect_err("401");
    assert!(!e.is_retryable() && e.to_string().contains("401"), "{e}");
    assert!(
        !e.to_string().contains("zz-bogus-token"),
        "the token is not in the error: {e}"
    );

    let mut slow = cherry_settings(emu.url());
    slow.request_timeout = Duration::from_millis(200);
    emu.set_latency(Duration::from_secs(2));
    let c = Cherry::new(&slow, "prod", Some(API_TOKEN.into())).expect("client");
    let e = c.list().await.expect_err("timeout");
    assert!(e.is_retryable(), "{e}");
    assert!(!e.to_string().contains(API_TOKEN));
}

/// The Cherry Servers autoscaler's optional create fields go out with the API's names and types
/// (`os_partition_size` int GB, `spot_market` int flag, `ip_addresses` id strings) when a group
/// sets them, and not at all when it does not.
#[tokio::test]
async fn cherry_sends_the_optional_create_fields_only_when_set() {
    let emu = emulator().await;
    let c =
        Cherry::new(&cherry_settings(emu.url()), "prod", Some(API_TOKEN.into())).expect("client");
    c.create(&spec("web", "plain")).await.expect("create");
    let mut tuned = spec("web", "tuned");
    tuned.cherry = CherryGroupSettings {
        os_partition_size: Some(60),
        spot_market: true,
        ip_addresses: vec!["5a4ef4a1-6f2c-4b8c-9a3e-2f1d0c9b8a7e".into()],
    };
    c.create(&tuned)
        .await
        .expect("create with the optional fields");
    let sent = emu.create_requests();
    assert_eq!(sent.len(), 2, "{sent:?}");
    for key in ["os_partition_size", "spot_market", "ip_addresses"] {
        assert!(sent[0].get(key).is_none(), "{key} sent unset: {}", sent[0]);
    }
    assert_eq!(sent[1]["os_partition_size"], 60, "{}", sent[1]);
    assert_eq!(sent[1]["spot_market"], 1, "{}", sent[1]);
    assert_eq!(
        sent[1]["ip_addresses"],
        serde_json::json!(["5a4ef4a1-6f2c-4b8c-9a3e-2f1d0c9b8a7e"]),
        "{}",
        sent[1]
    );
    let spot: Vec<bool> = emu
        .servers()
        .iter()
        .map(|s| s["spot_instance"].as_bool().unwrap_or(false))
        .collect();
    assert_eq!(spot, vec![false, true]);
}

/// The API pages its server list: the client follows every page, even when the server's
/// page is smaller than the limit the client asked for.
#[tokio::test]
async fn cherry_list_follows_every_page() {
    let emu = emulator().await;
    emu.set_max_page(2);
    for i in 0..5 {
        emu.insert_server(
            &format!("prod-{i}"),
            serde_json::json!({CLUSTER_TAG: "prod", POOL_TAG: "web"}),
        );
        emu.insert_server(
            &format!("other-{i}"),
            serde_json::json!({CLUSTER_TAG: "other", POOL_TAG: "web"}),
        );
    }
    let hosts = listed_hosts(&emu).await;
    assert_eq!(
        hosts,
        (0..5).map(|i| format!("prod-{i}")).collect::<Vec<_>>(),
        "every page read"
    );
    let gets = emu
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/servers"))
        .count();
    assert!(gets >= 5, "10 servers in pages of 2: {gets} list requests");
}

/// A server deleted while the pages are read shifts the later ones back by one: the pages
/// overlap, so none of those falls between two pages (a machine missing for a pass would make
/// its group look short and get a duplicate).
#[tokio::test]
async fn cherry_list_misses_nothing_when_a_server_goes_between_pages() {
    let emu = emulator().await;
    emu.set_max_page(4);
    let ids: Vec<u64> = (0..12)
        .map(|i| {
            emu.insert_server(
                &format!("prod-{i:02}"),
                serde_json::json!({CLUSTER_TAG: "prod", POOL_TAG: "web"}),
            )
        })
        .collect();
    emu.delete_after_next_page(ids[1]);
    let hosts = listed_hosts(&emu).await;
    // prod-01 was on the first page when it was read; prod-04 moved to where prod-03 was.
    let want: Vec<String> = (0..12).map(|i| format!("prod-{i:02}")).collect();
    assert_eq!(hosts, want);
}

#[test]
fn cherry_needs_project_and_token() {
    let mut s = cherry_settings("http://127.0.0.1:1/v1/".into());
    let e = Cherry::new(&s, "prod", None).expect_err("no token");
    assert!(e.to_string().contains("CHERRY_AUTH_TOKEN"), "{e}");
    s.project_id = None;
    let e = Cherry::new(&s, "prod", Some("t".into())).expect_err("no project");
    assert!(e.to_string().contains("project_id"), "{e}");
}

/// A fake cloud CLI: keeps machines in a JSON file and records its argv, environment and stdin.
const FAKE_CLOUD: &str = r#"
import json, os, sys, datetime
state_path, log_dir = sys.argv[1], sys.argv[2]
action = os.environ.get("NODEWARD_ACTION", "")
data = sys.stdin.read()
with open(os.path.join(log_dir, "argv"), "a") as f: f.write(" ".join(sys.argv) + "\n")
with open(os.path.join(log_dir, "env"), "a") as f: f.write("\n".join(k + "=" + v for k, v in os.environ.items()) + "\n")
with open(os.path.join(log_dir, "stdin-" + action), "w") as f: f.write(data)
req = json.loads(data)
machines = json.load(open(state_path)) if os.path.exists(state_path) else []
if action == "list":
    print(json.dumps([m for m in machines if m["cluster"] == req["cluster"]]))
elif action == "create":
    if req["group"] == "broken":
        sys.stderr.write("quota exceeded for " + req["user_data"][:10] + "\n"); sys.exit(3)
    m = {"id": "vm-%d" % (len(machines) + 1), "hostname": req["hostname"], "group": req["group"],
         "cluster": req["cluster"], "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    machines.append(m); json.dump(machines, open(state_path, "w")); print(json.dumps(m))
elif action == "delete":
    json.dump([m for m in machines if m["id"] != req["id"]], open(state_path, "w"))
"#;

fn python() -> String {
    let ok = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "this test needs python3 for its fake cloud CLI: apt-get install python3"
    );
    "python3".into()
}

#[tokio::test]
async fn exec_provider_speaks_json_and_keeps_user_data_off_argv_and_env() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("cloud.py");
    std::fs::write(&script, FAKE_CLOUD).expect("script");
    let state = dir.path().join("state.json");
    let argv = |action: &str| {
        vec![
            python(),
            script.display().to_string(),
            state.display().to_string(),
            dir.path().display().to_string(),
            action.to_string(),
        ]
    };
    let settings = ExecSettings {
        create: argv("create"),
        delete: argv("delete"),
        list: argv("list"),
        timeout: Duration::from_secs(20),
    };
    let p = Exec::new(&settings, "prod").expect("exec provider");
    let m = p
        .create(&spec("web", "k8s-prod-web-1"))
        .await
        .expect("create");
    assert_eq!((m.id.as_str(), m.group.as_str()), ("vm-1", "web"));
    assert_eq!(p.list().await.expect("list").len(), 1);
    p.delete("vm-1").await.expect("delete");
    assert!(p.list().await.expect("list").is_empty());
    let e = p.create(&spec("broken", "h")).await.expect_err("exit 3");
    assert!(e.to_string().contains("quota exceeded"), "{e}");

    let stdin: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("stdin-create")).expect("stdin"),
    )
    .expect("json");
    let b64 = stdin["user_data"].as_str().expect("user_data");
    assert!(!b64.is_empty());
    for file in ["argv", "env"] {
        let text = std::fs::read_to_string(dir.path().join(file)).expect("log");
        assert!(
            !text.contains("abcdef.0123456789abcdef"),
            "bootstrap token in {file}"
        );
        assert!(!text.contains(b64), "user data in {file}");
    }
}

#[tokio::test]
async fn exec_provider_times_out() {
    let settings = ExecSettings {
        create: vec!["sleep".into(), "5".into()],
        delete: vec!["true".into()],
        list: vec!["sleep".into(), "5".into()],
        timeout: Duration::from_millis(200),
    };
    let p = Exec::new(&settings, "prod").expect("exec provider");
    let started = std::time::Instant::now();
    let e = p.list().await.expect_err("timeout");
    assert!(e.to_string().contains("did not finish"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// One server with a malformed `created_at` (someone else's, or an API glitch) does not fail
/// the whole listing, which would stop every scale decision: it is listed, as just seen.
#[tokio::test]
async fn cherry_list_survives_one_bad_created_at() {
    let emu = emulator().await;
    let tags = |h: &str| serde_json::json!({CLUSTER_TAG: "prod", POOL_TAG: "web", "h": h});
    emu.insert_server("k8s-prod-web-good", tags("good"));
    let bad = emu.insert_server("k8s-prod-web-bad", tags("bad"));
    emu.set_server_field(bad, "created_at", serde_json::json!("last tuesday"));
    let before = jiff::Timestamp::now();
    let c =
        Cherry::new(&cherry_settings(emu.url()), "prod", Some(API_TOKEN.into())).expect("client");
    let listed = c.list().await.expect("one bad created_at fails nothing");
    assert_eq!(listed.len(), 2, "{listed:?}");
    let bad = listed
        .iter()
        .find(|m| m.hostname == "k8s-prod-web-bad")
        .expect("the bad one is still counted (not created twice)");
    assert!(
        bad.created >= before,
        "an unreadable creation time counts as now, so the machine is never judged too old on a guess"
    );
}

/// A body larger than any honest answer is cut off with an error instead of read into memory
/// until the process dies.
#[tokio::test]
async fn cherry_refuses_an_endless_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut head = [0u8; 4096];
        let _ = s.read(&mut head).await;
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n[")
            .await;
        let chunk = "{\"id\":1,\"hostname\":\"x\"},".repeat(4096);
        while s.write_all(chunk.as_bytes()).await.is_ok() {
            counter.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
        }
    });
    let mut settings = cherry_settings(url);
    settings.request_timeout = Duration::from_secs(60);
    let c = Cherry::new(&settings, "prod", Some(API_TOKEN.into())).expect("client");
    let e = tokio::time::timeout(Duration::from_secs(30), c.list())
        .await
        .expect("the listing gives up instead of reading for ever")
        .expect_err("too large");
    assert!(e.to_string().contains("larger than"), "{e}");
    let read = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        read < 64 << 20,
        "{read} bytes were sent before the client stopped"
    );
}

/// The API token goes only over TLS: a plain-http URL is refused unless it is this machine's
/// loopback (where the tests' emulator listens).
#[test]
fn cherry_refuses_plain_http_off_loopback() {
    for url in ["http://api.cherryservers.com/v1/", "http://10.0.0.1/"] {
        let e = Cherry::new(&cherry_settings(url.into()), "prod", Some(API_TOKEN.into()))
            .expect_err("plain http");
        assert!(e.to_string().contains("https"), "{url}: {e}");
    }
    for url in [
        "http://127.0.0.1:8080/",
        "http://[::1]:80/",
        "http://localhost:1/",
    ] {
        Cherry::new(&cherry_settings(url.into()), "prod", Some(API_TOKEN.into()))
            .unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

/// Runs `openssl ARGS` in `dir`, failing loudly without it.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A provider API behind a private CA (a proxy, an on-premises endpoint, this project's VM
/// scenarios): `ca_file` makes the client trust it; without it the TLS handshake fails, and no
/// token is sent in the clear either way. The emulator sits behind socat terminating TLS with a
/// certificate for 127.0.0.1 signed by a CA made here.
#[tokio::test]
async fn cherry_trusts_the_ca_in_ca_file() {
    let emu = emulator().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    openssl(
        d,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    );
    openssl(
        d,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "api.key",
            "-out",
            "api.csr",
        ],
    );
    std::fs::write(d.join("ext"), "subjectAltName=IP:127.0.0.1\n").expect("ext");
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "api.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "ext",
            "-out",
            "api.pem",
        ],
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let upstream = emu.url();
    let upstream = upstream
        .trim_start_matches("http://")
        .trim_end_matches("/v1/");
    let mut socat = std::process::Command::new("socat")
        .arg(format!(
            "OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,verify=0,cert={},key={}",
            d.join("api.pem").display(),
            d.join("api.key").display()
        ))
        .arg(format!("TCP:{upstream}"))
        .spawn()
        .expect("socat (apt-get install socat)");
    let t0 = std::time::Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "socat never listened on {port}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut s = cherry_settings(format!("https://127.0.0.1:{port}/v1/"));
    let c = Cherry::new(&s, "prod", Some(API_TOKEN.into())).expect("client");
    let e = c
        .list()
        .await
        .expect_err("a private CA is not trusted by default");
    s.ca_file = Some(d.join("ca.pem"));
    let c = Cherry::new(&s, "prod", Some(API_TOKEN.into())).expect("client");
    let listed = c.list().await;
    let _ = socat.kill();
    let _ = socat.wait();
    assert!(listed.is_ok(), "with ca_file: {listed:?} (without: {e})");
    s.ca_file = Some(d.join("api.key"));
    let e = Cherry::new(&s, "prod", Some(API_TOKEN.into())).expect_err("not a certificate");
    assert!(e.to_string().contains("ca_file"), "{e}");
}

/// A create or list command that leaves a child behind (a cloud CLI's helper, `sh -c 'x &'`) has
/// the child killed with it at the timeout: the whole process group goes, not only its leader.
#[tokio::test]
async fn exec_provider_timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("child.pid");
    let settings = ExecSettings {
        create: vec!["true".into()],
        delete: vec!["true".into()],
        list: vec![
            "sh".into(),
            "-c".into(),
            format!("sleep 300 & echo $! > {}; wait", pidfile.display()),
        ],
        timeout: Duration::from_millis(500),
    };
    let p = Exec::new(&settings, "prod").expect("exec provider");
    let e = p.list().await.expect_err("timeout");
    assert!(e.to_string().contains("did not finish"), "{e}");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("the command started its child")
        .trim()
        .parse()
        .expect("pid");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    while alive(pid) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !alive(pid),
        "the command's child {pid} outlived the timeout"
    );
}
