//! Building the Kubernetes client every subcommand uses.
//!
//! kube retries HTTP 429 on its own by default; an eviction blocked by a PodDisruptionBudget
//! answers 429, and the drain engine must see that answer to wait on the budget's watch instead
//! of retrying blind, so the built-in retry is turned off here for every client.

use std::path::Path;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

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

/// A client for `kubeconfig`, or kube's inference (KUBECONFIG, ~/.kube/config, in-cluster)
/// when `None`, each request bounded by [`REQUEST_DEADLINE`].
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
    client_with_deadline(kubeconfig, REQUEST_DEADLINE).await
}

/// [`client`] with another deadline for the answer to begin.
pub async fn client_with_deadline(
    kubeconfig: Option<&Path>,
    deadline: Duration,
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
    Ok(kube::client::ClientBuilder::try_from(config)
        .map_err(Error::Build)?
        .with_layer(&tower::timeout::TimeoutLayer::new(deadline))
        .build())
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
        let client = client_with_deadline(Some(&kubeconfig), Duration::from_millis(500))
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
    }
}
