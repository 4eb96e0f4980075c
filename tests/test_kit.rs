//! The test kit's own scripts, as a user runs them: `scripts/control-plane node` registers what
//! its header promises and says what is wrong with what it refuses (never a silent exit 1).

mod common;

use std::process::Output;

use common::{Cluster, unique};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

fn control_plane(cluster: &Cluster, args: &[&str]) -> Output {
    let Cluster::Real { dir, .. } = cluster else {
        panic!("the kit's scripts run against the real control plane");
    };
    std::process::Command::new(common::repo().join("scripts/control-plane"))
        .arg(args[0])
        .arg(dir)
        .args(&args[1..])
        .output()
        .expect("run scripts/control-plane")
}

/// Every form of `--taint k[=v]:Effect` the header documents is registered as written.
async fn node_takes_every_documented_taint_form(cluster: Cluster) {
    let name = unique("kit");
    let out = control_plane(
        &cluster,
        &[
            "node",
            &name,
            "--label",
            "pool=a",
            "--taint",
            "example.com/bare:NoSchedule",
            "--taint",
            "example.com/valued=v1:NoExecute",
            "--taint",
            "example.com/empty=:PreferNoSchedule",
        ],
    );
    assert!(out.status.success(), "{}", common::output_text(&out));
    let node = Api::<Node>::all(cluster.admin().await)
        .get(&name)
        .await
        .expect("the node is registered");
    let taints: Vec<(String, Option<String>, String)> = node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        // The node lifecycle controller's own (not-ready until kwok reports the node Ready) come
        // and go as it races kwok; only the kit's are the question here.
        .filter(|t| !t.key.starts_with("node.kubernetes.io/"))
        .map(|t| (t.key, t.value.filter(|v| !v.is_empty()), t.effect))
        .collect();
    assert_eq!(
        taints,
        [
            ("example.com/bare".into(), None, "NoSchedule".into()),
            (
                "example.com/valued".into(),
                Some("v1".into()),
                "NoExecute".into()
            ),
            ("example.com/empty".into(), None, "PreferNoSchedule".into()),
        ]
    );
    assert_eq!(
        node.metadata.labels.unwrap_or_default().get("pool"),
        Some(&"a".to_string())
    );
    cluster.remove_node(&name).await;
}

/// What the kit refuses, it names, with the expected form.
async fn node_says_what_is_wrong(cluster: Cluster) {
    let name = unique("kit");
    for (args, expected) in [
        (vec!["--taint", "example.com/x"], "expected k[=v]:Effect"),
        (
            vec!["--taint", "example.com/x:Sometimes"],
            "is not NoSchedule",
        ),
        (vec!["--taint", "=v:NoSchedule"], "empty key"),
        (vec!["--taint"], "expected k[=v]:Effect"),
        (vec!["--label", "novalue"], "expected k=v"),
        (vec!["--colour", "blue"], "unknown argument --colour"),
    ] {
        let mut all = vec!["node", name.as_str()];
        all.extend(&args);
        let out = control_plane(&cluster, &all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{args:?} must fail\n{}",
            common::output_text(&out)
        );
        assert!(
            stderr.contains(expected),
            "{args:?}: the error says {expected:?}\n{}",
            common::output_text(&out)
        );
    }
    let gone = Api::<Node>::all(cluster.admin().await)
        .get_opt(&name)
        .await
        .expect("get node");
    assert!(gone.is_none(), "nothing registered from a refused command");
}

real_only! {
    control_plane_node_takes_every_documented_taint_form => super::node_takes_every_documented_taint_form;
    control_plane_node_says_what_is_wrong => super::node_says_what_is_wrong;
}
