//! Building the Kubernetes client every subcommand uses.
//!
//! kube retries HTTP 429 on its own by default; an eviction blocked by a PodDisruptionBudget
//! answers 429, and the drain engine must see that answer to wait on the budget's watch instead
//! of retrying blind, so the built-in retry is turned off here for every client.

use std::path::Path;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// Errors building a client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig file could not be read or parsed.
    #[error("cannot load kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No configuration could be inferred.
    #[error(
        "no Kubernetes configuration found (KUBECONFIG, ~/.kube/config, in-cluster): {0}; pass --kubeconfig or set node.kubeconfig"
    )]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built from the configuration.
    #[error("cannot build a Kubernetes client: {0}")]
    Build(#[source] kube::Error),
}

/// How long any request may wait for the API server's answer to begin (its status line and
/// headers). A frozen API server that accepts connections and never answers otherwise holds a
/// call for kube's default read timeout (295 s): a scaler leader's pass, an agent's reconcile
/// in the loop that must answer logind. A watch is bounded the same way: the API server sends
/// its headers as soon as the watch starts, and the events stream after them, unbounded.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(30);

/// How many objects [`list_paged`] asks for at a time: kubectl's default `--chunk-size`.
pub const LIST_PAGE: u32 = 500;

/// Lists `api`'s objects matching `params` a page of [`LIST_PAGE`] at a time, each page turned
/// by `view` into what the caller keeps before the next page is asked for. A list's peak memory
/// is then one page of whole objects (their `managedFields`, annotations and status included),
/// not every one of them at once: for a scaler reading a cluster's Pods each pass, that was
/// most of its resident size. The pages are one consistent snapshot (the API server's continue
/// token); a token that expired mid-list is an error like any other, and the caller's next
/// pass lists again.
pub async fn list_paged<K, V>(
    api: &kube::Api<K>,
    params: &kube::api::ListParams,
    mut view: impl FnMut(&K) -> Option<V>,
) -> kube::Result<Vec<V>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut page_params = params.clone().limit(LIST_PAGE);
    loop {
        let page = api.list(&page_params).await?;
        out.extend(page.items.iter().filter_map(&mut view));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => page_params = page_params.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// A client for `kubeconfig`, or kube's inference (KUBECONFIG, ~/.kube/config, in-cluster)
/// when `None`, each request bounded by [`REQUEST_DEADLINE`].
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
    client_with_deadline(kubeconfig, REQUEST_DEADLINE, None).await
}

/// [`client`] with another deadline for the answer to begin, counting its failed requests in
/// `errors` when given.
pub async fn client_with_deadline(
    kubeconfig: Option<&Path>,
    deadline: Duration,
    errors: Option<&ApiErrors>,
) -> Result<kube::Client, Error> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
                path: path.to_path_buf(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| Error::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                })?
        }
        None => kube::Config::infer().await.map_err(Error::Infer)?,
    };
    config.default_retry = false;
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(Error::Build)?
        .with_layer(&tower::timeout::TimeoutLayer::new(deadline));
    // Outside the deadline, so that a request it ends counts as one with no answer.
    Ok(match errors {
        Some(errors) => builder.with_layer(&CountErrors(errors.clone())).build(),
        None => builder.build(),
    })
}

/// The files a client built from the kubeconfig at `path` reads: the kubeconfig itself and the
/// client certificate and key its current context names by path (kubelet's `kubelet.conf`
/// names `kubelet-client-current.pem`, which kubelet rotates). kube reads them only when the
/// client is built, so a client must be built again when one of them changes. A kubeconfig
/// that does not parse names just itself.
pub fn credential_files(path: &Path) -> Vec<std::path::PathBuf> {
    let mut files = vec![path.to_path_buf()];
    let Ok(kc) = Kubeconfig::read_from(path) else {
        return files;
    };
    let user = kc
        .current_context
        .as_deref()
        .and_then(|name| kc.contexts.iter().find(|c| c.name == name))
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.as_deref());
    let auth = user
        .and_then(|u| kc.auth_infos.iter().find(|a| a.name == u))
        .and_then(|a| a.auth_info.as_ref());
    let base = path.parent().unwrap_or_else(|| Path::new("/"));
    for named in auth
        .into_iter()
        .flat_map(|a| [&a.client_certificate, &a.client_key])
        .flatten()
    {
        let file = base.join(named);
        if !files.contains(&file) {
            files.push(file);
        }
    }
    files
}

/// A fingerprint of what `files` hold now (a missing file counts as empty): changed when a
/// certificate was rotated, whether written in place or swapped behind a symlink.
pub fn fingerprint(files: &[std::path::PathBuf]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in files {
        f.hash(&mut h);
        std::fs::read(f).unwrap_or_default().hash(&mut h);
    }
    h.finish()
}

/// Failed requests to the API server by `verb` and `code` (the HTTP status of an answer of 400
/// or more, or `none` when no answer came: refused, reset, past the deadline). A counter family,
/// as the agent exports it (`nodeward_agent_api_errors_total`).
pub type ApiErrors = Family<Vec<(String, String)>, Counter>;

/// The Kubernetes verb of a request, as the API server's audit log names it: `watch`, `list` or
/// `get` for a GET (a watch asks `watch=true`; a list names a collection, a get one object),
/// `create`, `update`, `patch`, `delete`.
pub fn verb(method: &http::Method, uri: &http::Uri) -> &'static str {
    match *method {
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        http::Method::GET => {
            if uri
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
            {
                return "watch";
            }
            let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
            // /api/v1/… or /apis/GROUP/VERSION/…, then an optional namespaces/NS/.
            let rest = match segments.first() {
                Some(&"api") => segments.get(2..),
                Some(&"apis") => segments.get(3..),
                _ => None,
            }
            .unwrap_or_default();
            let rest = match rest {
                ["namespaces", _, resource, more @ ..] => (resource, more.len()),
                [resource, more @ ..] => (resource, more.len()),
                [] => return "get",
            };
            if rest.1 == 0 { "list" } else { "get" }
        }
        _ => "other",
    }
}

/// A layer counting each failed request in [`ApiErrors`].
#[derive(Clone)]
struct CountErrors(ApiErrors);

impl<S> tower::Layer<S> for CountErrors {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Counted {
            inner,
            errors: self.0.clone(),
        }
    }
}

/// A service whose failed requests are counted.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    errors: ApiErrors,
}

impl<S, B, R> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let verb = verb(req.method(), req.uri());
        let errors = self.errors.clone();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let result = answer.await;
            let code = match &result {
                Ok(r) if r.status().as_u16() < 400 => None,
                Ok(r) => Some(r.status().as_str().to_string()),
                Err(_) => Some("none".to_string()),
            };
            if let Some(code) = code {
                let labels = vec![
                    ("verb".to_string(), verb.to_string()),
                    ("code".to_string(), code),
                ];
                errors.get_or_create(&labels).inc();
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request to an API server that accepts and never answers fails at the deadline.
    #[tokio::test]
    async fn a_silent_api_server_fails_the_request_at_the_deadline() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // Accepts, keeps the connections, never answers.
        let _hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        kube_emulator::write_kubeconfig(&kubeconfig, &format!("http://127.0.0.1:{port}"))
            .expect("kubeconfig");
        let errors = ApiErrors::default();
        let client =
            client_with_deadline(Some(&kubeconfig), Duration::from_millis(500), Some(&errors))
                .await
                .expect("client");
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(20), nodes.get("x"))
            .await
            .expect("the request ends by its deadline, not by kube's 295 s read timeout");
        assert!(answer.is_err());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let labels = vec![
            ("verb".to_string(), "get".to_string()),
            ("code".to_string(), "none".to_string()),
        ];
        assert_eq!(
            errors.get_or_create(&labels).get(),
            1,
            "counted as a get with no answer"
        );
    }

    /// A list larger than a page comes in pages of `LIST_PAGE`, each turned into views before
    /// the next is asked for, and nothing is lost or repeated between them.
    #[tokio::test]
    async fn a_paged_list_reads_every_object_once_a_page_at_a_time() {
        let emu = kube_emulator::Emulator::start(kube_emulator::EmulatorOptions::default())
            .await
            .expect("emulator");
        let total = 2 * LIST_PAGE as usize + 3;
        for i in 0..total {
            emu.create(serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"namespace": "default", "name": format!("cm-{i:04}")},
            }))
            .expect("create");
        }
        let client = client(Some(emu.kubeconfig_path())).await.expect("client");
        let maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(client, "default");
        emu.clear_requests();
        // The view keeps the even ones: what it returns is what the list keeps.
        let names = list_paged(&maps, &kube::api::ListParams::default(), |cm| {
            let name = cm.metadata.name.clone()?;
            let n: usize = name.strip_prefix("cm-")?.parse().ok()?;
            n.is_multiple_of(2).then_some(n)
        })
        .await
        .expect("list");
        assert_eq!(names, (0..total).step_by(2).collect::<Vec<_>>());
        let lists: Vec<String> = emu
            .requests()
            .into_iter()
            .filter(|r| r.verb == "list")
            .map(|r| r.query)
            .collect();
        assert_eq!(lists.len(), 3, "three pages: {lists:?}");
        assert!(
            lists
                .iter()
                .all(|q| q.contains(&format!("limit={LIST_PAGE}"))),
            "{lists:?}"
        );
        assert!(
            lists[1..].iter().all(|q| q.contains("continue=")),
            "{lists:?}"
        );
    }

    /// Answers of 400 and more are counted by verb and code; successes are not.
    #[tokio::test]
    async fn failed_answers_are_counted_by_verb_and_code() {
        let emu = kube_emulator::Emulator::start(kube_emulator::EmulatorOptions::default())
            .await
            .expect("emulator");
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        kube_emulator::write_kubeconfig(&kubeconfig, &emu.url()).expect("kubeconfig");
        let errors = ApiErrors::default();
        let client = client_with_deadline(Some(&kubeconfig), REQUEST_DEADLINE, Some(&errors))
            .await
            .expect("client");
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
        assert!(nodes.get("missing").await.is_err());
        nodes.list(&Default::default()).await.expect("list");
        let count = |verb: &str, code: &str| {
            errors
                .get_or_create(&vec![
                    ("verb".to_string(), verb.to_string()),
                    ("code".to_string(), code.to_string()),
                ])
                .get()
        };
        assert_eq!(count("get", "404"), 1);
        assert_eq!(count("list", "200"), 0);
    }

    #[test]
    fn verbs_as_the_audit_log_names_them() {
        let cases = [
            ("GET", "/api/v1/nodes", "list"),
            ("GET", "/api/v1/nodes/n1", "get"),
            (
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=spec.nodeName%3Dn1",
                "list",
            ),
            (
                "GET",
                "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=5",
                "watch",
            ),
            ("GET", "/api/v1/namespaces/ns", "get"),
            (
                "GET",
                "/apis/apps/v1/namespaces/ns/deployments/web/scale",
                "get",
            ),
            ("GET", "/apis/policy/v1/poddisruptionbudgets", "list"),
            ("POST", "/api/v1/namespaces/ns/pods/p/eviction", "create"),
            ("PATCH", "/api/v1/nodes/n1/status", "patch"),
            (
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
                "update",
            ),
            ("DELETE", "/api/v1/namespaces/ns/pods/p", "delete"),
        ];
        for (method, uri, want) in cases {
            let m: http::Method = method.parse().expect("method");
            let u: http::Uri = uri.parse().expect("uri");
            assert_eq!(verb(&m, &u), want, "{method} {uri}");
        }
    }
}
