use std::path::Path;

use super::*;

const TOKEN: &str = "abcdef.0123456789abcdef";

const BASE: &str = r#"
cluster_name = "prod"
node_group = "web"
api_server_endpoint = "10.0.0.10:6443"
ca_cert_hashes = ["sha256:8c3d1e4f0a9b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d"]
kubernetes_version = "v1.31.2"
package_url = "https://dl.example.com/nodeward.{ext}"
"#;

fn token(t: &str) -> Option<TokenSource> {
    Some(TokenSource {
        origin: "--token-file /tmp/t".into(),
        token: Secret::new(t.to_string()),
    })
}

fn build(file: &str, sets: &[&str], tok: Option<TokenSource>) -> Result<Values> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Values::build(
        Inputs {
            file: Some((Path::new("values.toml"), file)),
            sets: &sets,
            token: tok,
        },
        "r4nd0m8x",
    )
}

#[test]
fn base_values_are_valid_and_derived_fields_are_filled() {
    let v = build(BASE, &[], token(TOKEN)).expect("valid");
    assert_eq!(v.hostname, "k8s-prod-web-r4nd0m8x");
    assert_eq!(v.bootstrap_token.id, "abcdef");
    assert_eq!(v.api_server_endpoint.url, "https://10.0.0.10:6443");
    assert_eq!(v.kubernetes_version.minor, 31);
    assert_eq!(
        v.node_labels.get(NODE_GROUP_LABEL).map(String::as_str),
        Some("web")
    );
    assert_eq!(
        v.package_url.deb.as_deref(),
        Some("https://dl.example.com/nodeward.deb")
    );
    assert!(
        !format!("{v:?}").contains("0123456789abcdef"),
        "Debug leaks the token"
    );
}

/// Every validator, through `--set`, with good and bad inputs.
#[test]
fn validators_accept_good_and_refuse_bad_values() {
    let good: &[&str] = &[
        "cluster_name=a",
        "node_group=gpu-0",
        "api_server_endpoint=api.example.com:6443",
        "api_server_endpoint=https://api.example.com",
        "api_server_endpoint=https://api.example.com:8443/",
        "api_server_endpoint=[fd00::1]:6443",
        "ca_cert_hashes=sha256:8C3D1E4F0A9B7C6D5E4F3A2B1C0D9E8F7A6B5C4D3E2F1A0B9C8D7E6F5A4B3C2D",
        "hostname=node-1.example.com",
        "hostname_pattern={{ node_group }}-{{ rand8 }}",
        "node_labels.example.com/x=y",
        "node_labels.node.kubernetes.io/instance-type=big",
        "node_labels.topology.kubernetes.io/zone=z1",
        "node_taints=dedicated=gpu:NoSchedule,spot:PreferNoSchedule",
        "kubernetes_version=1.30.0",
        "package_url=https://dl.example.com/nodeward_0.1.0_amd64.deb",
        "package_url=https://dl.example.com/nodeward-0.1.0.x86_64.rpm",
        "extra.anything=goes",
    ];
    for set in good {
        build(BASE, &[set], token(TOKEN)).unwrap_or_else(|e| panic!("{set}: {e}"));
    }
    let bad: &[(&str, &str, &str)] = &[
        ("cluster_name=Prod", "cluster_name", "lowercase letters"),
        ("node_group=web_1", "node_group", "lowercase letters"),
        (
            "api_server_endpoint=10.0.0.1",
            "api_server_endpoint",
            "host:port",
        ),
        (
            "api_server_endpoint=http://10.0.0.1:6443",
            "api_server_endpoint",
            "https URL",
        ),
        (
            "api_server_endpoint=10.0.0.1:99999",
            "api_server_endpoint",
            "host:port",
        ),
        (
            "ca_cert_hashes=sha1:abcd",
            "ca_cert_hashes",
            "sha256:<64 hex digits>",
        ),
        (
            "ca_cert_hashes=sha256:1234",
            "ca_cert_hashes",
            "sha256:<64 hex digits>",
        ),
        ("hostname=Node_1", "hostname", "RFC 1123"),
        (
            "hostname_pattern={{ cluster_name }}_{{ rand8 }}",
            "hostname",
            "RFC 1123",
        ),
        (
            "hostname_pattern={{ nope }}",
            "hostname_pattern",
            "does not render",
        ),
        (
            "node_labels.bad key=x",
            "node_labels.bad key",
            "DNS subdomain",
        ),
        (
            "node_labels.example.com/x=-bad",
            "node_labels.example.com/x",
            "at most 63",
        ),
        (
            "node_labels.node-role.kubernetes.io/worker=",
            "node_labels.node-role.kubernetes.io/worker",
            "kubelet may set",
        ),
        (
            "node_taints=dedicated=gpu",
            "node_taints",
            "key[=value]:Effect",
        ),
        ("node_taints=x:Never", "node_taints", "NoSchedule"),
        ("kubernetes_version=1.31", "kubernetes_version", "v1.31.2"),
        ("kubernetes_version=v2.0.0", "kubernetes_version", "v1.31.2"),
        (
            "package_url=http://dl.example.com/x.deb",
            "package_url",
            "https URL",
        ),
        (
            "package_url=https://dl.example.com/x.tar.gz",
            "package_url",
            ".deb or .rpm",
        ),
        // The URL reaches the node's bootstrap script: nothing in it may be shell syntax.
        (
            "package_url=https://dl.example.com/$(id).deb",
            "package_url",
            "https URL",
        ),
        (
            "package_url=https://dl.example.com/`id`.deb",
            "package_url",
            "https URL",
        ),
        (
            "package_url=https://dl.example.com/x\\y.deb",
            "package_url",
            "https URL",
        ),
    ];
    for (set, key, expected) in bad {
        let msg = build(BASE, &[set], token(TOKEN))
            .err()
            .unwrap_or_else(|| panic!("{set} should be refused"))
            .to_string();
        assert!(msg.contains(&format!("`{key}`")), "{set}: {msg}");
        assert!(msg.contains(expected), "{set}: {msg} lacks {expected:?}");
    }
}

#[test]
fn file_values_are_validated_with_file_and_line() {
    let text = BASE.replace("\"10.0.0.10:6443\"", "\"nope\"");
    let msg = build(&text, &[], token(TOKEN))
        .expect_err("bad")
        .to_string();
    assert!(
        msg.starts_with("values.toml:4:23: key `api_server_endpoint`"),
        "{msg}"
    );
    assert!(msg.contains("host:port"), "{msg}");
    let msg = build(&format!("{BASE}\nnode_grup = \"x\"\n"), &[], token(TOKEN))
        .expect_err("unknown key")
        .to_string();
    assert!(msg.contains("unknown field `node_grup`"), "{msg}");
}

#[test]
fn bad_tokens_are_refused_without_echoing_them() {
    for t in [
        "abcdef0123456789abcdef",
        "ABCDEF.0123456789abcdef",
        "abcde.0123456789abcdefg",
        "abcdef.0123456789abcde!",
    ] {
        let msg = build(BASE, &[], token(t))
            .expect_err("bad token")
            .to_string();
        assert!(msg.contains("[a-z0-9]{6}.[a-z0-9]{16}"), "{msg}");
        assert!(msg.contains("--token-file /tmp/t"), "{msg}");
        assert!(!msg.contains("0123456789"), "token leaked: {msg}");
    }
    let ok = build(BASE, &[], token(&format!("{TOKEN}\n"))).expect("trailing newline ok");
    assert_eq!(ok.bootstrap_token.expose(), TOKEN);
}

#[test]
fn secrets_are_refused_on_the_command_line_and_in_values_files() {
    let msg = build(BASE, &[&format!("bootstrap_token={TOKEN}")], token(TOKEN))
        .expect_err("refused")
        .to_string();
    assert!(msg.contains("--token-file"), "{msg}");
    assert!(!msg.contains("0123456789abcdef"), "{msg}");
    let msg = build(
        &format!("bootstrap_token = \"{TOKEN}\"\n{BASE}"),
        &[],
        token(TOKEN),
    )
    .expect_err("refused")
    .to_string();
    assert!(msg.contains("must not be in a values file"), "{msg}");
    assert!(!msg.contains("0123456789abcdef"), "{msg}");
}

#[test]
fn missing_values_say_how_to_provide_them() {
    let msg = build(BASE, &[], None).expect_err("no token").to_string();
    assert!(msg.contains("NODEWARD_BOOTSTRAP_TOKEN"), "{msg}");
    let msg = build("cluster_name = \"a\"", &[], token(TOKEN))
        .expect_err("missing")
        .to_string();
    assert!(msg.contains("`node_group` is required"), "{msg}");
    let text = BASE.replace("ca_cert_hashes", "# ca_cert_hashes");
    let msg = build(&text, &[], token(TOKEN))
        .expect_err("no ca")
        .to_string();
    assert!(msg.contains("`ca_cert_hashes` is required"), "{msg}");
}

#[test]
fn set_overrides_file_and_hostname_conflicts_are_refused() {
    let v = build(BASE, &["node_group=gpu", "hostname=n1"], token(TOKEN)).expect("valid");
    assert_eq!(v.node_group.0, "gpu");
    assert_eq!(v.hostname, "n1");
    let msg = build(
        BASE,
        &["hostname=n1", "hostname_pattern=x-{{ rand8 }}"],
        token(TOKEN),
    )
    .expect_err("both")
    .to_string();
    assert!(msg.contains("`hostname_pattern` are both set"), "{msg}");
    let msg = build(BASE, &["nonsense"], token(TOKEN))
        .expect_err("no =")
        .to_string();
    assert!(msg.contains("key=value"), "{msg}");
    let msg = build(BASE, &["colour=blue"], token(TOKEN))
        .expect_err("unknown")
        .to_string();
    assert!(msg.contains("unknown key"), "{msg}");
}

#[test]
fn rand8_is_eight_label_characters() {
    for _ in 0..100 {
        let r = rand8();
        assert_eq!(r.len(), 8);
        assert!(
            r.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
            "{r}"
        );
    }
}
