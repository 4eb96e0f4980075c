use super::*;
use std::collections::BTreeMap;

fn src(path: &str, text: &str) -> Source {
    Source {
        path: PathBuf::from(path),
        text: text.to_string(),
    }
}

fn err(sources: &[Source]) -> String {
    match parse(sources) {
        Ok(s) => panic!("expected an error, got {s:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn no_files_means_defaults() {
    assert_eq!(parse(&[]).expect("defaults"), Settings::default());
    assert_eq!(
        parse(&[src("a.toml", "")]).expect("empty"),
        Settings::default()
    );
}

#[test]
fn shipped_example_documents_exactly_the_defaults() {
    let example = src(
        "packaging/config.toml",
        include_str!("../../packaging/config.toml"),
    );
    assert_eq!(
        parse(&[example]).expect("example parses"),
        Settings::default()
    );
}

#[test]
fn drop_ins_override_key_by_key() {
    let s = parse(&[
        src(
            "/etc/nodeward/config.toml",
            "[drain]\ntimeout = \"60s\"\nforce = true\n[node]\nname = \"worker-1\"\n",
        ),
        src(
            "/etc/nodeward/config.d/10-timeout.toml",
            "[drain]\ntimeout = \"2m\"\n",
        ),
    ])
    .expect("valid");
    assert_eq!(s.drain.timeout, Duration::from_secs(120));
    assert!(
        s.drain.force,
        "force from the main file survives the drop-in"
    );
    assert_eq!(s.node.name.as_deref(), Some("worker-1"));
    assert_eq!(s.drain.concurrency, Settings::default().drain.concurrency);
}

#[test]
fn arrays_are_replaced_whole() {
    let s = parse(&[
        src("a.toml", "[[drain.waves]]\nmin_priority = 0\nshare_of_deadline = 0.5\n[[drain.waves]]\nmin_priority = 10\nshare_of_deadline = 0.5\n"),
        src("b.toml", "[[drain.waves]]\nmin_priority = -5\nshare_of_deadline = 1.0\n"),
    ])
    .expect("valid");
    assert_eq!(
        s.drain.waves,
        vec![Wave {
            min_priority: -5,
            share_of_deadline: 1.0
        }]
    );
}

/// Every bad input names the file, the line, the key and the expected form.
#[test]
fn errors_name_file_line_key_and_form() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "[drain]\nforce = false\ntimeout = \"90x\"\n",
            "x.toml:3:11",
            &["drain.timeout", "\"90x\"", "\"90s\""],
        ),
        (
            "[drain]\ntimout = \"90s\"\n",
            "x.toml:2:1",
            &["unknown field `timout`", "timeout"],
        ),
        (
            "[drain]\non_deadline = \"explode\"\n",
            "x.toml:2:15",
            &["drain.on_deadline", "abandon", "delete", "wait"],
        ),
        (
            "[drain]\nconcurrency = 0\n",
            "x.toml:2:15",
            &["drain.concurrency", "from 1 to"],
        ),
        (
            "[drain]\nforce = \"yes\"\n",
            "x.toml:2:9",
            &["drain.force", "bool"],
        ),
        (
            "[node]\nname = \"Worker_1\"\n",
            "x.toml:2:8",
            &["node.name", "RFC 1123"],
        ),
        (
            "[[drain.waves]]\nmin_priority = 5\nshare_of_deadline = 0.6\n[[drain.waves]]\nmin_priority = 1\nshare_of_deadline = 0.3\n",
            "x.toml:",
            &["drain.waves", "ascending"],
        ),
        (
            "[[drain.waves]]\nmin_priority = 0\nshare_of_deadline = 0.8\n[[drain.waves]]\nmin_priority = 1\nshare_of_deadline = 0.3\n",
            "x.toml:",
            &["drain.waves", "more than 1"],
        ),
        ("[drain\n", "x.toml:1:", &[]),
        (
            "[gates]\nhttp_interval = \"0s\"\n",
            "x.toml:2:",
            &[
                "gates.http_interval",
                "\"0s\" is out of range",
                "from 100ms to 1h",
            ],
        ),
        (
            "[drain]\ntimeout = \"500000000years\"\n",
            "x.toml:2:",
            &["drain.timeout", "out of range", "from 1s to 7days"],
        ),
        (
            "[agent]\nboot_deadline = \"0s\"\n",
            "x.toml:2:",
            &["agent.boot_deadline", "from 1s to 7days"],
        ),
        (
            "[shutdown]\nsafety_margin = \"8days\"\n",
            "x.toml:2:",
            &["shutdown.safety_margin", "from 0s to 7days"],
        ),
    ];
    for (text, location, needles) in cases {
        let msg = err(&[src("ok.toml", ""), src("x.toml", text)]);
        assert!(msg.starts_with(location), "{text:?}: {msg}");
        for needle in *needles {
            assert!(msg.contains(needle), "{text:?}: {msg:?} lacks {needle:?}");
        }
    }
}

#[test]
fn load_reads_main_file_and_sorted_drop_ins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let main = dir.path().join("config.toml");
    std::fs::write(&main, "[drain]\ntimeout = \"30s\"\n").expect("write");
    std::fs::create_dir(dir.path().join("config.d")).expect("mkdir");
    std::fs::write(
        dir.path().join("config.d/20-b.toml"),
        "[drain]\ntimeout = \"3m\"\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("config.d/10-a.toml"),
        "[drain]\ntimeout = \"2m\"\n",
    )
    .expect("write");
    std::fs::write(dir.path().join("config.d/README"), "not toml").expect("write");
    let (settings, files) = load(Some(&main)).expect("load");
    assert_eq!(settings.drain.timeout, Duration::from_secs(180));
    assert_eq!(files.len(), 3);
    assert!(files[1].ends_with("10-a.toml"));
}

#[test]
fn explicit_missing_file_is_an_error() {
    let msg = load(Some(Path::new("/nonexistent/nodeward.toml")))
        .expect_err("missing")
        .to_string();
    assert!(msg.contains("/nonexistent/nodeward.toml"), "{msg}");
}

#[test]
fn scaler_groups_and_nested_tables() {
    let s = parse(&[
        src(
            "a.toml",
            r#"
[scaler]
cluster_name = "prod"
expander = "priority"
[scaler.cherry]
project_id = 42
[[scaler.groups]]
name = "web"
min = 1
max = 5
labels = { "example.com/tier" = "frontend" }
taints = ["dedicated=web:NoSchedule"]
capacity = { cpu = "8", memory = "32Gi" }
"#,
        ),
        src("b.toml", "[scaler.cherry]\nrequest_timeout = \"5s\"\n"),
    ])
    .expect("valid");
    assert_eq!(s.scaler.cluster_name, "prod");
    assert_eq!(s.scaler.expander, Expander::Priority);
    assert_eq!(
        s.scaler.cherry.project_id,
        Some(42),
        "kept across the drop-in"
    );
    assert_eq!(s.scaler.cherry.request_timeout, Duration::from_secs(5));
    let g = &s.scaler.groups[0];
    assert_eq!((g.name.as_str(), g.min, g.max), ("web", 1, 5));
    assert_eq!(g.capacity.resources.cpu_milli, 8000);
    assert_eq!(g.capacity.resources.pods, 110, "kubelet's default max pods");
    assert_eq!(g.taints[0].to_string(), "dedicated=web:NoSchedule");
    let bare = parse(&[src(
        "c.toml",
        "[[scaler.groups]]\nname = \"gpu\"\nmax = 1\n",
    )])
    .expect("valid");
    assert_eq!(
        bare.scaler.groups[0].capacity.resources.pods, 110,
        "a group without a capacity table still has pod slots"
    );
}

#[test]
fn scaler_errors_name_the_key_and_form() {
    let cases: &[(&str, &[&str])] = &[
        (
            "[[scaler.groups]]\nname = \"web\"\nmin = 3\nmax = 2\n",
            &["a.toml:1", "scaler.groups", "min 3 is above max 2"],
        ),
        (
            "[[scaler.groups]]\nname = \"web\"\nmax = 2\n[[scaler.groups]]\nname = \"web\"\nmax = 2\n",
            &["defined twice"],
        ),
        (
            "[[scaler.groups]]\nname = \"Web\"\nmax = 2\n",
            &["scaler.groups", "invalid name \"Web\""],
        ),
        (
            "[[scaler.groups]]\nname = \"web\"\nmax = 2\ncapacity = { cpu = \"lots\" }\n",
            &["invalid quantity \"lots\""],
        ),
        (
            "[scaler]\ntoken_ttl = \"2h\"\n",
            &["a.toml:2", "scaler.token_ttl", "at most 1h"],
        ),
        (
            "[scaler]\nlease_duration = \"0s\"\n",
            &[
                "a.toml:2",
                "scaler.lease_duration",
                "whole number of seconds from 1s",
            ],
        ),
        (
            "[scaler]\nlease_duration = \"1500ms\"\n",
            &["scaler.lease_duration", "whole number of seconds"],
        ),
        (
            "[scaler]\nscan_interval = \"0s\"\n",
            &["a.toml:2", "scaler.scan_interval", "from 100ms to 1h"],
        ),
        (
            "[scaler.exec]\ntimeout = \"0ms\"\n",
            &["scaler.exec.timeout", "from 100ms to 1h"],
        ),
        (
            "[scaler]\nunready_delete_time = \"30000years\"\n",
            &["scaler.unready_delete_time", "from 1s to 7days"],
        ),
        (
            "[scaler]\nmax_unready_percent = 120\n",
            &["scaler.max_unready_percent", "from 0 to 100"],
        ),
        (
            "[scaler]\nexpander = \"best\"\n",
            &["scaler.expander", "least-waste"],
        ),
        (
            "[scaler]\nscale_down_utilization_threshold = 1.5\n",
            &["scaler.scale_down_utilization_threshold", "from 0 to 1"],
        ),
        (
            "[scaler.exec]\ncreate = []\n",
            &["scaler.exec.create", "as an array"],
        ),
        (
            "[scaler]\nmetrics_address = \"8085\"\n",
            &["scaler.metrics_address", "ip:port"],
        ),
        (
            "[scaler.group_defaults]\nplan = \"e5\"\nmax = 3\n",
            &["a.toml:3:1", "scaler.group_defaults", "unknown field `max`"],
        ),
        (
            "[scaler.group_defaults]\nlabels = { \"bad key\" = \"x\" }\n",
            &[
                "a.toml:2",
                "scaler.group_defaults.labels",
                "label key \"bad key\"",
            ],
        ),
        (
            "[scaler.group_defaults]\nos_partition_size = 0\n",
            &[
                "a.toml:2",
                "scaler.group_defaults.os_partition_size",
                "from 1",
            ],
        ),
        (
            "[[scaler.groups]]\nname = \"web\"\nmax = 2\nspot_market = \"yes\"\n",
            &["a.toml:4", "spot_market", "bool"],
        ),
        (
            "[[scaler.groups]]\nname = \"web\"\nmax = 2\nip_addresses = [\"\"]\n",
            &["a.toml:4", "ip_addresses", "invalid IP address id"],
        ),
        (
            "[scaler]\ncontroller_node_labels = [\"node role\"]\n",
            &[
                "a.toml:2",
                "scaler.controller_node_labels",
                "label key \"node role\"",
            ],
        ),
        (
            "[scaler]\nmax_boots_per_pass = 0\n",
            &["a.toml:2", "scaler.max_boots_per_pass", "from 1"],
        ),
        (
            "[scaler]\nscale_down_delay_after_add = \"soon\"\n",
            &["a.toml:2", "scaler.scale_down_delay_after_add", "\"soon\""],
        ),
    ];
    for (text, wants) in cases {
        let e = err(&[src("a.toml", text)]);
        for w in *wants {
            assert!(e.contains(w), "{text:?}: {e:?} lacks {w:?}");
        }
    }
}

/// `[scaler.group_defaults]` fills what a group leaves out (merged key by key across drop-ins,
/// labels added key by key), a group's own keys win, and `pool_label` adds the Cherry Servers
/// autoscaler's `pool=<group>` label unless the group sets `pool` itself.
#[test]
fn group_defaults_fill_what_groups_leave_out() {
    let s = parse(&[
        src(
            "a.toml",
            r#"
[scaler]
pool_label = true
max_boots_per_pass = 10
scale_down_delay_after_add = "10m"
controller_node_labels = ["node-role.kubernetes.io/master"]
[scaler.group_defaults]
plan = "e5_1620v4"
region = "eu_nord_1"
image = "ubuntu_24_04"
ssh_keys = ["12"]
labels = { "example.com/team" = "core", "example.com/tier" = "any" }
taints = ["dedicated=shared:NoSchedule"]
capacity = { cpu = "8", memory = "32Gi" }
os_partition_size = 60
[[scaler.groups]]
name = "web"
max = 5
labels = { "example.com/tier" = "frontend" }
[[scaler.groups]]
name = "gpu"
max = 2
plan = "gpu_a100"
taints = []
spot_market = true
ip_addresses = ["5a4ef4a1-6f2c-4b8c-9a3e-2f1d0c9b8a7e"]
labels = { pool = "accelerators" }
"#,
        ),
        src(
            "b.toml",
            "[scaler.group_defaults]\nregion = \"us_chicago_1\"\n",
        ),
    ])
    .expect("valid");
    let sc = &s.scaler;
    assert_eq!(sc.max_boots_per_pass, Some(10));
    assert_eq!(sc.scale_down_delay_after_add, Duration::from_secs(600));
    assert_eq!(
        sc.controller_node_labels,
        ["node-role.kubernetes.io/master"]
    );
    let (web, gpu) = (&sc.groups[0], &sc.groups[1]);
    assert_eq!(
        (web.plan.as_str(), web.region.as_str(), web.image.as_str()),
        ("e5_1620v4", "us_chicago_1", "ubuntu_24_04"),
        "defaults, the region from the drop-in"
    );
    assert_eq!(web.ssh_keys, ["12"]);
    assert_eq!(
        web.labels,
        BTreeMap::from([
            ("example.com/team".to_string(), "core".to_string()),
            ("example.com/tier".to_string(), "frontend".to_string()),
            ("pool".to_string(), "web".to_string()),
        ])
    );
    assert_eq!(web.taints[0].to_string(), "dedicated=shared:NoSchedule");
    assert_eq!(web.capacity.resources.cpu_milli, 8000);
    assert_eq!(web.template, Path::new(super::scaler::DEFAULT_TEMPLATE));
    assert_eq!(web.cherry.os_partition_size, Some(60));
    assert!(!web.cherry.spot_market);
    assert_eq!(gpu.plan, "gpu_a100");
    assert!(gpu.taints.is_empty(), "an empty list overrides the default");
    assert_eq!(
        gpu.labels["pool"], "accelerators",
        "the group's own pool label wins"
    );
    assert!(gpu.cherry.spot_market);
    assert_eq!(
        gpu.cherry.ip_addresses,
        ["5a4ef4a1-6f2c-4b8c-9a3e-2f1d0c9b8a7e"]
    );
    let plain = parse(&[src(
        "c.toml",
        "[[scaler.groups]]\nname = \"web\"\nmax = 1\n",
    )])
    .expect("valid");
    assert!(
        plain.scaler.groups[0].labels.is_empty(),
        "no pool label unless asked for"
    );
}

/// The scaler ConfigMap shipped in packaging/kubernetes/ holds a config the real parser accepts,
/// and values the real renderer accepts with the shipped template.
#[test]
fn shipped_scaler_configmap_is_valid() {
    let yaml = include_str!("../../packaging/kubernetes/scaler.yaml");
    let docs: Vec<serde_norway::Value> = serde_norway::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("yaml document"))
        .collect();
    let data = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .map(|d| &d["data"])
        .expect("a ConfigMap");
    let config = data["config.toml"].as_str().expect("config.toml");
    let s = parse(&[src("scaler.yaml:config.toml", config)]).expect("config parses");
    assert_eq!(s.scaler.groups.len(), 1);
    assert_eq!(s.scaler.groups[0].name, "workers");
    let values = data["scaler-values.toml"]
        .as_str()
        .expect("scaler-values.toml");
    let template = data["worker.yaml.tera"].as_str().expect("worker.yaml.tera");
    assert_eq!(
        template,
        include_str!("../../cloud-init/worker.yaml.tera"),
        "the ConfigMap carries the shipped template"
    );
    let sets = [
        "cluster_name=prod".to_string(),
        "node_group=workers".to_string(),
    ];
    let v = crate::render::Values::build(
        crate::render::values::Inputs {
            file: Some((Path::new("scaler-values.toml"), values)),
            sets: &sets,
            token: Some(crate::render::values::TokenSource {
                origin: "test".into(),
                token: crate::secret::Secret::new("abcdef.0123456789abcdef".into()),
            }),
        },
        "r4nd0m8x",
    )
    .expect("values valid");
    let out = crate::render::render("worker.yaml.tera", template, &v).expect("renders");
    crate::render::check("worker.yaml.tera", &out).expect("valid user data");
}

/// A bootstrap token is only needed until its machine registers, and a machine not registered
/// after `max_provision_time` is deleted: unless set, a token lives that long (at most 1 h),
/// not an hour after its machine is gone.
#[test]
fn token_ttl_defaults_to_the_provision_time() {
    let ttl = |text: &str| {
        parse(&[src("a.toml", text)])
            .expect("valid")
            .scaler
            .token_ttl
    };
    assert_eq!(ttl(""), Duration::from_secs(600));
    assert_eq!(
        ttl("[scaler]\nmax_provision_time = \"15m\"\n"),
        Duration::from_secs(900)
    );
    assert_eq!(
        ttl("[scaler]\nmax_provision_time = \"3h\"\n"),
        Duration::from_secs(3600)
    );
    assert_eq!(
        ttl("[scaler]\nmax_provision_time = \"15m\"\ntoken_ttl = \"40m\"\n"),
        Duration::from_secs(2400),
        "set, it is what it says"
    );
}
