use std::path::Path;

use super::values::{Inputs, TokenSource};
use super::*;
use crate::secret::Secret;

const TOKEN: &str = "abcdef.0123456789abcdef";

fn example_values() -> Values {
    Values::build(
        Inputs {
            file: Some((
                Path::new("cloud-init/values.example.toml"),
                include_str!("../../cloud-init/values.example.toml"),
            )),
            sets: &[],
            token: Some(TokenSource {
                origin: "test".into(),
                token: Secret::new(TOKEN.into()),
            }),
        },
        "r4nd0m8x",
    )
    .expect("example values are valid")
}

#[test]
fn renders_token_parts_and_is_deterministic() {
    let v = example_values();
    let t = "{{ bootstrap_token_id }}/{{ bootstrap_token_secret }}/{{ bootstrap_token }}";
    let out = render("t", t, &v).expect("renders");
    assert_eq!(out, format!("abcdef/0123456789abcdef/{TOKEN}\n"));
    assert_eq!(render("t", t, &v).expect("again"), out);
}

#[test]
fn syntax_errors_name_template_line_and_column() {
    let t = "#cloud-config\nhostname: {{ hostname }}\nruncmd: {% if %}\n";
    let e = render("worker.yaml.tera", t, &example_values()).expect_err("syntax");
    let msg = e.to_string();
    assert!(matches!(e, Error::Syntax { line: 3, .. }), "{msg}");
    assert!(msg.starts_with("worker.yaml.tera:3:"), "{msg}");
    assert!(msg.contains("expected"), "{msg}");
}

#[test]
fn undefined_variables_name_template_line_and_variable() {
    let t = "#cloud-config\n# {{ cluster_name }}\n\nfoo: {{ extra.site_id }}\n";
    let msg = render("w.tera", t, &example_values())
        .expect_err("undefined")
        .to_string();
    assert!(
        msg.starts_with("w.tera:4: undefined variable `extra.site_id`"),
        "{msg}"
    );
    let t = "{% for x in nodes %}{{ x }}{% endfor %}";
    let msg = render("w.tera", t, &example_values())
        .expect_err("undefined")
        .to_string();
    assert!(
        msg.contains("w.tera:1: undefined variable `nodes`"),
        "{msg}"
    );
}

#[test]
fn render_errors_never_contain_the_token() {
    // A template that feeds the token to a filter that fails on it.
    let t = "{{ bootstrap_token | round }}";
    let msg = render("w.tera", t, &example_values())
        .expect_err("filter fails")
        .to_string();
    assert!(!msg.contains("0123456789abcdef"), "{msg}");
    let t = "{% set x = bootstrap_token %}{{ x | date }}";
    let msg = render("w.tera", t, &example_values())
        .expect_err("filter fails")
        .to_string();
    assert!(!msg.contains("0123456789abcdef"), "{msg}");
}

#[test]
fn shipped_example_matches_golden_file() {
    let out = render(
        "cloud-init/worker.yaml.tera",
        include_str!("../../cloud-init/worker.yaml.tera"),
        &example_values(),
    )
    .expect("renders");
    let golden = include_str!("../../tests/fixtures/worker.example.yaml");
    assert_eq!(
        out, golden,
        "rendered example differs from tests/fixtures/worker.example.yaml; if the change is intended, regenerate it with scripts/regenerate-golden"
    );
    assert_eq!(check("w", &out).expect("valid"), UserDataKind::CloudConfig);
}

#[test]
fn older_kubernetes_gets_kubeadm_v1beta3() {
    let mut v = example_values();
    v.kubernetes_version.minor = 30;
    let out = render("w", include_str!("../../cloud-init/worker.yaml.tera"), &v).expect("renders");
    assert!(out.contains("kubeadm.k8s.io/v1beta3"));
    assert!(out.contains("node-labels: \""));
    check("w", &out).expect("still valid YAML");
}

#[test]
fn check_classifies_and_refuses() {
    assert_eq!(
        check("t", "#cloud-config\na: 1\n").expect("ok"),
        UserDataKind::CloudConfig
    );
    assert_eq!(
        check("t", "#!/bin/sh\necho hi\n").expect("ok"),
        UserDataKind::Script
    );
    assert_eq!(
        check("t", "Content-Type: multipart/mixed; boundary=x\n").expect("ok"),
        UserDataKind::Multipart
    );
    let msg = check("t", "a: 1\n").expect_err("no header").to_string();
    assert!(msg.contains("#cloud-config"), "{msg}");
    let msg = check("t", "#cloud-config\na: [1\n")
        .expect_err("bad yaml")
        .to_string();
    assert!(msg.contains("YAML does not parse at line"), "{msg}");
    let msg = check("t", "#cloud-config\n- a\n")
        .expect_err("list")
        .to_string();
    assert!(msg.contains("mapping"), "{msg}");
}
mod hostile;
