//! Where machines come from, behind one small trait: the Cherry Servers API ([`cherry`]) or
//! any tooling that speaks JSON on stdin/stdout ([`exec`]).
//!
//! A provider only lists, creates and deletes. Group membership is the `k8s-nodepool` tag (the
//! cluster is the `k8s-cluster` tag), so listing is the whole truth about in-flight machines:
//! the scaler keeps nothing in memory that a restart would lose.

pub mod cherry;
pub mod exec;

use std::collections::BTreeMap;
use std::future::Future;

use crate::config::CherryGroupSettings;
use crate::resources::Resources;
use crate::scaler::model::MachineView;
use crate::secret::Secret;

/// Tag naming the cluster a machine belongs to.
pub const CLUSTER_TAG: &str = "k8s-cluster";
/// Tag naming the node group (pool) of a machine.
pub const POOL_TAG: &str = "k8s-nodepool";

/// Errors from a provider.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request could not be sent or timed out.
    #[error("{provider}: {action}: request failed: {message}")]
    Transport {
        /// `cherry` or `exec`.
        provider: &'static str,
        /// `list`, `create`, `delete`, `plans`.
        action: &'static str,
        /// What happened (never a credential).
        message: String,
    },
    /// The provider answered with an error status.
    #[error("{provider}: {action}: HTTP {status}: {message}")]
    Status {
        /// Provider.
        provider: &'static str,
        /// Action.
        action: &'static str,
        /// HTTP status.
        status: u16,
        /// The provider's error text, truncated.
        message: String,
    },
    /// The answer did not have the expected form.
    #[error("{provider}: {action}: unexpected answer: {message}")]
    Decode {
        /// Provider.
        provider: &'static str,
        /// Action.
        action: &'static str,
        /// What was wrong.
        message: String,
    },
    /// A command of the exec provider failed.
    #[error("exec provider: {action}: {command} {outcome}")]
    Command {
        /// Action.
        action: &'static str,
        /// argv[0].
        command: String,
        /// Exit status, timeout, or spawn error, with stderr (truncated, secrets removed).
        outcome: String,
    },
    /// The provider is not configured well enough to start.
    #[error("{provider}: {message}")]
    Config {
        /// Provider.
        provider: &'static str,
        /// What to fix.
        message: String,
    },
}

impl Error {
    /// Whether trying again later may succeed (network trouble, 5xx, 429, timeouts).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transport { .. } | Self::Command { .. } => true,
            Self::Status { status, .. } => *status >= 500 || *status == 429,
            Self::Decode { .. } | Self::Config { .. } => false,
        }
    }
}

/// `pub type Result` for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a new machine should be.
#[derive(Debug, Clone)]
pub struct CreateSpec {
    /// Node group.
    pub group: String,
    /// Hostname (and Node name).
    pub hostname: String,
    /// Plan.
    pub plan: String,
    /// Region.
    pub region: String,
    /// Image.
    pub image: String,
    /// SSH key ids.
    pub ssh_keys: Vec<String>,
    /// Rendered cloud-init; holds the bootstrap token.
    pub user_data: Secret<String>,
    /// Tags, including [`CLUSTER_TAG`] and [`POOL_TAG`].
    pub tags: BTreeMap<String, String>,
    /// The group's Cherry Servers create fields (other providers ignore them).
    pub cherry: CherryGroupSettings,
}

/// A cloud that lists, creates and deletes this cluster's machines.
pub trait Provider: Send + Sync {
    /// Machines tagged with this cluster (any group).
    fn list(&self) -> impl Future<Output = Result<Vec<MachineView>>> + Send;
    /// Creates one machine.
    fn create(&self, spec: &CreateSpec) -> impl Future<Output = Result<MachineView>> + Send;
    /// Deletes a machine; one already gone is not an error.
    fn delete(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// What a plan offers (CPU and memory), if the provider can tell.
    fn plan_capacity(&self, plan: &str) -> impl Future<Output = Result<Option<Resources>>> + Send;
}

/// The configured provider.
#[derive(Debug)]
pub enum AnyProvider {
    /// Cherry Servers.
    Cherry(cherry::Cherry),
    /// Commands.
    Exec(exec::Exec),
}

impl Provider for AnyProvider {
    async fn list(&self) -> Result<Vec<MachineView>> {
        match self {
            Self::Cherry(p) => p.list().await,
            Self::Exec(p) => p.list().await,
        }
    }

    async fn create(&self, spec: &CreateSpec) -> Result<MachineView> {
        match self {
            Self::Cherry(p) => p.create(spec).await,
            Self::Exec(p) => p.create(spec).await,
        }
    }

    async fn delete(&self, id: &str) -> Result<()> {
        match self {
            Self::Cherry(p) => p.delete(id).await,
            Self::Exec(p) => p.delete(id).await,
        }
    }

    async fn plan_capacity(&self, plan: &str) -> Result<Option<Resources>> {
        match self {
            Self::Cherry(p) => p.plan_capacity(plan).await,
            Self::Exec(p) => p.plan_capacity(plan).await,
        }
    }
}

/// Longest provider message kept in an error.
const MESSAGE_MAX: usize = 500;

/// Cuts a message to [`MESSAGE_MAX`] characters.
pub(crate) fn truncate(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(MESSAGE_MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}
