//! Against a real cluster: run with `NODEWARD_E2E_KUBECONFIG=/path/to/kubeconfig cargo test
//! --test e2e -- --ignored`. Read-only: nothing in the cluster is changed.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

#[tokio::test]
#[ignore = "needs NODEWARD_E2E_KUBECONFIG"]
async fn dry_run_plans_every_node_of_a_real_cluster() {
    let path = std::env::var("NODEWARD_E2E_KUBECONFIG")
        .expect("set NODEWARD_E2E_KUBECONFIG to a kubeconfig of a real cluster");
    let client = nodeward::kube_client::client(Some(std::path::Path::new(&path)))
        .await
        .expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes
        .list(&ListParams::default())
        .await
        .expect("list nodes");
    assert!(!list.items.is_empty(), "the cluster has no nodes");
    let opts = nodeward::drain::DrainOptions::from_settings(
        &nodeward::config::Settings::default().drain,
        "e2e dry run",
    );
    for node in &list.items {
        let name = node.metadata.name.as_deref().expect("node name");
        let plan = nodeward::drain::dry_run(&client, name, &opts)
            .await
            .expect("dry run");
        // Every pod on the node appears in the plan exactly once.
        let mut uids: Vec<&str> = plan.pods.iter().map(|p| p.pod.uid.as_str()).collect();
        let n = uids.len();
        uids.sort();
        uids.dedup();
        assert_eq!(uids.len(), n, "node {name}: a pod is planned twice");
    }
}
