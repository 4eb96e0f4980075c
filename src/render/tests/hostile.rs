//! Hostile values land as data (issue 24, item 5): every value full of shell or YAML syntax is
//! refused with its key named, or it renders to user data of the same shape as a benign one
//! whose bootstrap script, run by `sh` with every command it calls stubbed, runs nothing of it.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

const TEMPLATE: &str = include_str!("../../../cloud-init/worker.yaml.tera");
const SCRIPT_PATH: &str = "/usr/local/sbin/nodeward-bootstrap";
const JOIN_CONFIG: &str = "/etc/nodeward/kubeadm-join.yaml";
/// Every command the bootstrap script may call that would touch the machine.
const STUBBED: &[&str] = &[
    "curl",
    "dpkg",
    "rpm",
    "systemctl",
    "kubeadm",
    "apt-get",
    "apt-mark",
    "gpg",
    "dnf",
];

/// Shell and YAML payloads; `M` is replaced by the marker file's path.
fn payloads(m: &str) -> Vec<String> {
    [
        "$(touch M)",
        "`touch M`",
        "';touch M;'",
        "\";touch M;\"",
        "x;touch M",
        "x|touch M",
        "x&&touch M",
        "${IFS}touch${IFS}M",
        "\ntouch M\n",
        "x\\';touch M;'",
        "\n- [sh, -c, \"touch M\"]\n",
        "\": x\nruncmd: [[touch, M]]\n#",
        "x\n      touch M",
        "{{ bootstrap_token }}",
        "x#\u{0}touch M",
        // Without whitespace, which most forms refuse anyway.
        ";>M",
        "|>M",
        "&>M",
        "'>M'",
        "(>M)",
        "{>M}",
        "%0a>M",
    ]
    .iter()
    .map(|p| p.replace('M', m))
    .collect()
}

/// Each key with the payload put where that key's form leaves room for it.
fn settings(payload: &str) -> Vec<String> {
    [
        format!("cluster_name={payload}"),
        format!("node_group={payload}"),
        format!("hostname={payload}"),
        format!("node_labels.team={payload}"),
        format!("node_labels.{payload}=x"),
        format!("node_taints=dedicated={payload}:NoSchedule"),
        format!("api_server_endpoint={payload}:6443"),
        format!("api_server_endpoint=https://{payload}"),
        format!("ca_cert_hashes=sha256:{payload}"),
        format!("kubernetes_version=1.37.{payload}"),
        format!("package_url=https://dl.example.com/{payload}.deb"),
        format!("package_url=https://dl.example.com/a.deb?q={payload}"),
        format!("package_url=https://dl.example.com/{payload}/nodeward.{{ext}}"),
    ]
    .into()
}

fn values_with(set: &str) -> std::result::Result<Values, String> {
    Values::build(
        values::Inputs {
            file: Some((
                Path::new("cloud-init/values.example.toml"),
                include_str!("../../../cloud-init/values.example.toml"),
            )),
            sets: &[set.to_string()],
            token: Some(values::TokenSource {
                origin: "test".into(),
                token: crate::secret::Secret::new(TOKEN.into()),
            }),
        },
        "r4nd0m8x",
    )
    .map_err(|e| e.to_string())
}

/// The parts of the user data a value must never change: its keys, the files written and the
/// commands cloud-init runs.
fn shape(doc: &serde_norway::Value) -> String {
    let keys: Vec<_> = doc
        .as_mapping()
        .map(|m| m.keys().filter_map(|k| k.as_str()).collect())
        .unwrap_or_default();
    let files: Vec<_> = doc["write_files"]
        .as_sequence()
        .map(|s| s.iter().filter_map(|f| f["path"].as_str()).collect())
        .unwrap_or_default();
    format!("{keys:?} {files:?} {:?}", doc["runcmd"])
}

/// Runs the rendered bootstrap script with stubs first on `PATH`; returns what they were called
/// with.
fn run_script(doc: &serde_norway::Value, dir: &Path) -> String {
    let script = doc["write_files"]
        .as_sequence()
        .and_then(|s| s.iter().find(|f| f["path"].as_str() == Some(SCRIPT_PATH)))
        .and_then(|f| f["content"].as_str())
        .expect("the user data writes the bootstrap script");
    let join_config = dir.join("kubeadm-join.yaml");
    let script = script.replace(JOIN_CONFIG, &join_config.display().to_string());
    let stubs = dir.join("bin");
    let log = dir.join("calls.log");
    std::fs::create_dir_all(&stubs).expect("stub dir");
    for name in STUBBED {
        let stub = stubs.join(name);
        std::fs::write(
            &stub,
            format!(
                "#!/bin/sh\nprintf '%s' '{name}' >> '{log}'\nfor a; do printf ' <%s>' \"$a\" >> '{log}'; done\necho >> '{log}'\n",
                log = log.display()
            ),
        )
        .expect("write stub");
        let mut perm = std::fs::metadata(&stub).expect("stub").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
        std::fs::set_permissions(&stub, perm).expect("chmod stub");
    }
    let path = format!("{}:/usr/bin:/bin", stubs.display());
    let out = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .env_clear()
        .env("PATH", path)
        .current_dir(dir)
        .output()
        .expect("sh runs (install dash or bash)");
    assert!(
        out.status.success(),
        "the bootstrap script failed with stubbed commands: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&log).unwrap_or_default()
}

#[test]
fn hostile_values_are_refused_or_land_as_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mark: PathBuf = dir.path().join("pwned");
    let benign = render(
        "w",
        TEMPLATE,
        &values_with("node_group=web").expect("benign"),
    )
    .expect("benign renders");
    let benign: serde_norway::Value = serde_norway::from_str(&benign).expect("benign parses");
    let mut refused = 0;
    let mut rendered = 0;
    for payload in payloads(&mark.display().to_string()) {
        for set in settings(&payload) {
            let key = set.split(['=', '.']).next().unwrap_or_default().to_string();
            let values = match values_with(&set) {
                Err(msg) => {
                    assert!(msg.contains(&key), "{set:?}: the error names no key: {msg}");
                    refused += 1;
                    continue;
                }
                Ok(v) => v,
            };
            let out = render("w", TEMPLATE, &values).expect("valid values render");
            check("w", &out).unwrap_or_else(|e| panic!("{set:?}: {e}"));
            let doc: serde_norway::Value = serde_norway::from_str(&out).expect("checked");
            assert_eq!(
                shape(&doc),
                shape(&benign),
                "{set:?} changed the user data's shape"
            );
            let case = tempfile::tempdir().expect("tempdir");
            let calls = run_script(&doc, case.path());
            assert!(!mark.exists(), "{set:?} ran a command: {calls}");
            if let Some(url) = values.package_url.deb.as_deref() {
                assert!(
                    calls.contains(&format!("<{url}>")),
                    "{set:?}: curl was not given the URL as one argument: {calls}"
                );
            }
            rendered += 1;
        }
    }
    assert!(
        refused > 0 && rendered > 0,
        "{refused} refused, {rendered} rendered"
    );
}

/// A site's free-form `extra` values reach a user's template through `json_encode` (YAML) and
/// `shell_quote` (shell): whatever they hold comes out as the same string, and nothing runs.
#[test]
fn extra_values_quoted_by_filters_land_as_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mark = dir.path().join("pwned");
    let template = "#cloud-config\nsite: {{ extra.site | json_encode }}\nruncmd:\n  - [sh, -c, {{ extra.script | json_encode }}]\n";
    for payload in payloads(&mark.display().to_string()) {
        if payload.contains('\0') {
            continue;
        }
        let mut values = values_with("node_group=web").expect("benign");
        let script = format!("printf '%s' {}", render_filter(&payload));
        values.extra.insert("site".into(), payload.clone().into());
        values.extra.insert("script".into(), script.clone().into());
        let out = render("w", template, &values).unwrap_or_else(|e| panic!("{payload:?}: {e}"));
        let doc: serde_norway::Value = serde_norway::from_str(&out).expect("valid YAML");
        assert_eq!(doc["site"].as_str(), Some(payload.as_str()), "{out}");
        let cmd = doc["runcmd"][0][2].as_str().expect("the command");
        assert_eq!(cmd, script);
        let run = Command::new("sh")
            .args(["-c", cmd])
            .output()
            .expect("sh runs");
        assert_eq!(String::from_utf8_lossy(&run.stdout), payload);
        assert!(!mark.exists(), "{payload:?} ran a command");
    }
    let mut values = values_with("node_group=web").expect("benign");
    values.extra.insert("x".into(), "a\0b".into());
    let msg = render("w", "{{ extra.x | shell_quote }}", &values)
        .expect_err("NUL refused")
        .to_string();
    assert!(msg.contains("NUL"), "{msg}");
}

/// `shell_quote` applied through a one-line template.
fn render_filter(s: &str) -> String {
    let mut values = values_with("node_group=web").expect("benign");
    values.extra.insert("v".into(), s.into());
    let out = render("f", "{{ extra.v | shell_quote }}", &values).expect("quotes");
    out.strip_suffix('\n').unwrap_or(&out).to_string()
}

/// The bootstrap script, run by `sh` with the machine's commands stubbed, leaves the token
/// nowhere: the JoinConfiguration is deleted and cloud-init's copies of the user data (text and
/// the pickled datasource) have the token overwritten in place, each file keeping its size.
#[test]
fn the_bootstrap_script_scrubs_the_token_from_cloud_inits_copies() {
    let values = values_with("node_group=web").expect("benign");
    let out = render("w", TEMPLATE, &values).expect("renders");
    let doc: serde_norway::Value = serde_norway::from_str(&out).expect("valid YAML");
    let dir = tempfile::tempdir().expect("tempdir");
    let cloud = dir.path().join("var-lib-cloud");
    let instance = cloud.join("instances/i-1");
    std::fs::create_dir_all(&instance).expect("cloud dirs");
    std::fs::write(instance.join("user-data.txt"), &out).expect("user-data.txt");
    let mut pickle = b"\x80\x04\x95userdata_raw\x94".to_vec();
    pickle.extend_from_slice(out.as_bytes());
    pickle.extend_from_slice(b"\x00\x94.");
    std::fs::write(instance.join("obj.pkl"), &pickle).expect("obj.pkl");
    let join_config = dir.path().join("kubeadm-join.yaml");
    let join = doc["write_files"]
        .as_sequence()
        .and_then(|s| s.iter().find(|f| f["path"].as_str() == Some(JOIN_CONFIG)))
        .and_then(|f| f["content"].as_str())
        .expect("the JoinConfiguration");
    std::fs::write(&join_config, join).expect("join config");
    // The script as cloud-init would run it, its paths moved into the scratch directory.
    let mut doc = doc.clone();
    let script = doc["write_files"]
        .as_sequence_mut()
        .and_then(|s| {
            s.iter_mut()
                .find(|f| f["path"].as_str() == Some(SCRIPT_PATH))
        })
        .expect("the script");
    let text = script["content"]
        .as_str()
        .expect("content")
        .replace("/var/lib/cloud", &cloud.display().to_string());
    script["content"] = text.into();
    let _calls = run_script(&doc, dir.path());
    assert!(
        !join_config.exists(),
        "the JoinConfiguration outlived the script"
    );
    for (file, size) in [("user-data.txt", out.len()), ("obj.pkl", pickle.len())] {
        let bytes = std::fs::read(instance.join(file)).expect(file);
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(TOKEN), "the token is still in {file}");
        assert!(
            !text.contains("0123456789abcdef"),
            "its secret half is still in {file}"
        );
        assert!(
            text.contains("xxxxxx.xxxxxxxxxxxxxxxx"),
            "{file} was not overwritten in place"
        );
        assert_eq!(bytes.len(), size, "{file} changed size");
    }
}
