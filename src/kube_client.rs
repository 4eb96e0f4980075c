//! Building the Kubernetes client every subcommand uses.
//!
//! kube retries HTTP 429 on its own by default; an eviction blocked by a PodDisruptionBudget
//! answers 429, and the drain engine must see that answer to wait on the budget's watch instead
//! of retrying blind, so the built-in retry is turned off here for every client.

use std::path::Path;

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

/// A client for `kubeconfig`, or kube's inference (KUBECONFIG, ~/.kube/config, in-cluster)
/// when `None`.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
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
    kube::Client::try_from(config).map_err(Error::Build)
}
