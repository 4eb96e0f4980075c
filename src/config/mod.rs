//! Configuration: `/etc/nodeward/config.toml` plus `config.d/*.toml` drop-ins.
//!
//! Every file is parsed on its own into a *fragment* whose fields are all optional, so a type or
//! format error is reported with the file, line, column and key where it was written. Fragments are
//! then merged in order (main file, then drop-ins sorted by name; later wins per key, arrays are
//! replaced whole) and turned once into typed [`Settings`], with the defaults from one place
//! ([`Settings::default`], mirrored by the shipped `packaging/config.toml`). The parser takes
//! `&str`, so tests never touch the filesystem or the environment.

mod fragment;
mod scaler;
mod types;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use scaler::{
    Capacity, CherrySettings, ExecSettings, Expander, GroupSettings, ProviderKind, ScalerSettings,
};
pub use types::{OnDeadline, Wave};

/// Where the agent looks when neither `--config` nor `NODEWARD_CONFIG` is given.
pub const DEFAULT_PATH: &str = "/etc/nodeward/config.toml";

/// Errors from loading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config file or drop-in directory could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A file is not valid TOML, has an unknown key, or a value of the wrong form.
    #[error(transparent)]
    Invalid(#[from] crate::tomlfile::Error),
}

/// `pub type Result` for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One config file's text and where it came from.
#[derive(Debug, Clone)]
pub struct Source {
    /// The path, used in error messages.
    pub path: PathBuf,
    /// The TOML text.
    pub text: String,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// This node's identity and API access.
    pub node: NodeSettings,
    /// How drains behave.
    pub drain: DrainSettings,
    /// The central scaler.
    pub scaler: ScalerSettings,
}

/// `[node]`: which node this agent speaks for and how it reaches the API server.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeSettings {
    /// The Node name; `None` means the machine's hostname.
    pub name: Option<String>,
    /// Kubeconfig to use; `None` means kube's usual inference (`KUBECONFIG`, `~/.kube/config`,
    /// in-cluster service account).
    pub kubeconfig: Option<PathBuf>,
}

/// `[drain]`: the drain engine's policy.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainSettings {
    /// Overall deadline for one drain.
    pub timeout: Duration,
    /// What to do with pods still there when the deadline nears.
    pub on_deadline: OnDeadline,
    /// Evict pods no controller manages (they are not recreated anywhere).
    pub force: bool,
    /// Evict pods with emptyDir volumes (their data is lost).
    pub delete_emptydir_data: bool,
    /// Evictions in flight at once.
    pub concurrency: u32,
    /// Label the node `node.kubernetes.io/exclude-from-external-load-balancers` while draining.
    pub exclude_from_load_balancers: bool,
    /// Priority waves, lowest `min_priority` first.
    pub waves: Vec<Wave>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            node: NodeSettings::default(),
            drain: DrainSettings {
                // The drain budget logind's InhibitDelayMaxSec is raised to cover (120 s in the
                // shipped drop-in), less a margin for cordon and lock release.
                timeout: Duration::from_secs(90),
                on_deadline: OnDeadline::Abandon,
                force: false,
                // A node that is shutting down loses its emptyDir data anyway; refusing would only
                // mean the pod is killed by the shutdown instead of evicted through its budget.
                delete_emptydir_data: true,
                // Enough to evict a full node (kubelet's default max is 110 pods) in a few round
                // trips without bursting hundreds of requests at the API server at once.
                concurrency: 32,
                exclude_from_load_balancers: true,
                waves: types::default_waves(),
            },
            scaler: ScalerSettings::default(),
        }
    }
}

/// Parses and merges config sources in order (later wins), then applies defaults.
pub fn parse(sources: &[Source]) -> Result<Settings> {
    let mut merged = fragment::Fragment::default();
    for source in sources {
        merged.merge(crate::tomlfile::parse(&source.path, &source.text)?);
    }
    Ok(merged.into_settings())
}

/// Reads the main config file and its `config.d/*.toml` drop-ins.
///
/// `explicit` is the path from `--config`/`NODEWARD_CONFIG`; it must exist. Without it the default
/// path is used and may be absent (the defaults then apply). Drop-ins live in `config.d/` beside
/// the main file and are read in lexical order.
pub fn load(explicit: Option<&Path>) -> Result<(Settings, Vec<PathBuf>)> {
    let main = explicit.unwrap_or(Path::new(DEFAULT_PATH));
    let mut sources = Vec::new();
    match std::fs::read_to_string(main) {
        Ok(text) => sources.push(Source {
            path: main.to_path_buf(),
            text,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => {}
        Err(source) => {
            return Err(Error::Read {
                path: main.to_path_buf(),
                source,
            });
        }
    }
    let dropin_dir = main.parent().unwrap_or(Path::new(".")).join("config.d");
    match std::fs::read_dir(&dropin_dir) {
        Ok(entries) => {
            let mut paths = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|source| Error::Read {
                    path: dropin_dir.clone(),
                    source,
                })?;
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "toml") {
                    paths.push(path);
                }
            }
            paths.sort();
            for path in paths {
                let text = std::fs::read_to_string(&path).map_err(|source| Error::Read {
                    path: path.clone(),
                    source,
                })?;
                sources.push(Source { path, text });
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(Error::Read {
                path: dropin_dir,
                source,
            });
        }
    }
    let settings = parse(&sources)?;
    Ok((settings, sources.into_iter().map(|s| s.path).collect()))
}

#[cfg(test)]
mod tests;
