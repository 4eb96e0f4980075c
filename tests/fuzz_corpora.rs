//! Replays every committed fuzz corpus file (`fuzz/corpus/<target>/`, and any crash a run left in
//! `fuzz/artifacts/<target>/`) through the same entry points the fuzz targets call, so CI checks
//! them on stable Rust where no nightly toolchain or cargo-fuzz is installed.

use std::path::Path;

#[test]
fn every_corpus_file_replays_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for target in nodeward::fuzzing::TARGETS {
        let mut files = 0;
        for dir in ["corpus", "artifacts"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("dir entry").path();
                let data = std::fs::read(&path).expect("corpus file");
                let ran = std::panic::catch_unwind(|| nodeward::fuzzing::run(target, &data));
                assert!(
                    ran.as_ref().is_ok_and(|known| *known),
                    "{target}: {} panicked (or the target is unknown)",
                    path.display()
                );
                files += 1;
            }
        }
        assert!(
            files > 0,
            "no corpus for fuzz target {target} under fuzz/corpus/"
        );
        replayed += files;
    }
    eprintln!("replayed {replayed} corpus files");
}

/// A configuration at the edge of every bound passes the check and runs: everything the binary
/// computes from it (`nodeward::fuzzing::exercise`) at the largest and the smallest values each
/// key accepts. The fuzz target does the same for every configuration it finds that parses.
#[test]
fn a_configuration_at_every_bound_runs() {
    let edges = [
        (
            "largest",
            "168h",
            "1h",
            "168h",
            u32::MAX,
            "100",
            "2147483647s",
            "1h",
        ),
        ("smallest", "1s", "100ms", "0s", 1, "0", "1s", "1s"),
    ];
    for (name, deadline, period, wait, count, percent, lease, ttl) in edges {
        let text = format!(
            r#"
[agent]
boot_deadline = "{deadline}"
[gates]
http_interval = "{period}"
http_timeout = "{period}"
[shutdown]
safety_margin = "{wait}"
inhibit_delay_max = "{deadline}"
[drain]
timeout = "{deadline}"
concurrency = {count}
on_deadline = "delete"
[scaler]
scan_interval = "{period}"
scale_down_unneeded_time = "{wait}"
scale_down_delay_after_add = "{wait}"
max_provision_time = "{deadline}"
unready_delete_time = "{deadline}"
backoff_initial = "{period}"
backoff_max = "{deadline}"
max_unready_percent = {percent}
ok_unready_count = {count}
max_unready_group_percent = {percent}
max_unready_repairs_per_pass = {count}
lease_duration = "{lease}"
token_ttl = "{ttl}"
[scaler.cherry]
request_timeout = "{period}"
[scaler.exec]
timeout = "{period}"
[[scaler.groups]]
name = "web"
min = 0
max = {count}
"#
        );
        let settings = nodeward::config::parse(&[nodeward::config::Source {
            path: format!("{name}.toml").into(),
            text,
        }])
        .unwrap_or_else(|e| panic!("the {name} configuration is valid: {e:#}"));
        nodeward::fuzzing::exercise(&settings);
    }
}
