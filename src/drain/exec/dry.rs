//! The dry run: the plan of a drain, from one list of the node's pods, with nothing changed.

use super::*;

/// Computes the plan a drain would follow, changing nothing.
pub async fn dry_run(client: &Client, node: &str, opts: &DrainOptions) -> Result<Plan> {
    dry_run_with_pods(client, node, opts)
        .await
        .map(|(plan, _)| plan)
}

/// [`dry_run`], with the node's pods it planned for.
pub async fn dry_run_with_pods(
    client: &Client,
    node: &str,
    opts: &DrainOptions,
) -> Result<(Plan, Vec<Pod>)> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.get(node).await.map_err(api_err(node, "get"))?;
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(api_err(node, "list pods of"))?;
    let daemonsets: Api<DaemonSet> = Api::all(client.clone());
    let daemonsets = daemonsets
        .list_metadata(&kube::api::ListParams::default())
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 403 => Error::Forbidden {
                verb: "list daemonsets",
                pod: None,
            },
            e => api_err(node, "list the daemonsets for")(e),
        })?;
    let present: BTreeSet<(&str, &str)> = daemonsets
        .items
        .iter()
        .map(|d| {
            let m = &d.metadata;
            (
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default(),
            )
        })
        .collect();
    let exists = |ns: &str, name: &str| present.contains(&(ns, name));
    let plan = Plan::new(&list.items, &opts.plan, &exists);
    Ok((plan, list.items))
}
