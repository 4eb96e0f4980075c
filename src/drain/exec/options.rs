//! What a drain is asked to do ([`DrainOptions`]) and the errors that stop it.

use super::*;

/// Errors that stop a drain, cordon or uncordon.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node does not exist.
    #[error("node {node} not found")]
    NodeNotFound {
        /// The node.
        node: String,
    },
    /// An API call failed.
    #[error("cannot {action} node {node}: {source}")]
    Api {
        /// The node.
        node: String,
        /// What was being done.
        action: &'static str,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The credentials lack a permission the drain needs.
    #[error(
        "permission denied: the credentials cannot {verb}{}; grant it (see packaging/kubernetes/rbac-agent.yaml)",
        pod.as_ref().map(|p| format!(" (pod {p})")).unwrap_or_default()
    )]
    Forbidden {
        /// The RBAC verb and resource.
        verb: &'static str,
        /// The pod it was tried on, if it was one pod's request.
        pod: Option<String>,
    },
    /// The node's pods could not be listed before the deadline: nothing is known to be drained.
    #[error(
        "could not list the pods of node {node} and the DaemonSets within {waited:?} ({last_error}); the node is cordoned but not known to be drained"
    )]
    PodsNotListed {
        /// The node.
        node: String,
        /// How long the drain tried.
        waited: Duration,
        /// The last watch error.
        last_error: String,
    },
    /// The API server did not answer before the deadline (a stopped or unreachable server
    /// accepts the connection and never replies; without this the drain would wait for the
    /// client's read timeout, minutes past its deadline).
    #[error(
        "cannot {action} node {node}: no answer from the API server within the drain deadline ({waited:?}); the node may not be cordoned"
    )]
    NoAnswer {
        /// The node.
        node: String,
        /// What was being done.
        action: &'static str,
        /// The deadline.
        waited: Duration,
    },
    /// Another writer kept changing the Node.
    #[error("node {node} kept changing under us ({attempts} conflicting writes); try again")]
    Conflict {
        /// The node.
        node: String,
        /// How many tries.
        attempts: usize,
    },
    /// Someone else cordoned the node and `--force` was not given.
    #[error("node {node} was cordoned by {}, not by nodeward; refusing to uncordon it (use --force to override)", who.as_deref().unwrap_or("someone else"))]
    CordonedByOther {
        /// The node.
        node: String,
        /// Who, if managedFields tell.
        who: Option<String>,
    },
}

impl Error {
    /// Whether the API server refused the client's credentials (401): a client built again
    /// from the kubeconfig's files may be accepted (kubelet rotated its certificate).
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, Self::Api { source: kube::Error::Api(s), .. } if s.code == 401)
    }

    /// Whether trying again can help: an unreachable or overloaded API server, a conflict, pods
    /// not listed yet. A missing node or permission, or a cordon that is not ours, stays so.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Api { source, .. } => match source {
                kube::Error::Api(s) => matches!(s.code, 409 | 429 | 500..=599),
                _ => true,
            },
            Self::PodsNotListed { .. } | Self::Conflict { .. } | Self::NoAnswer { .. } => true,
            Self::NodeNotFound { .. } | Self::Forbidden { .. } | Self::CordonedByOther { .. } => {
                false
            }
        }
    }
}

/// `pub type Result` for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a drain behaves.
#[derive(Debug, Clone)]
pub struct DrainOptions {
    /// Which pods go and in which waves.
    pub plan: PlanOptions,
    /// Evictions in flight at once.
    pub concurrency: usize,
    /// Overall deadline.
    pub timeout: Duration,
    /// What happens when the deadline nears.
    pub on_deadline: OnDeadline,
    /// Whether a pod whose budget cannot allow its eviction gets `on_deadline` at once.
    pub unsatisfiable: UnsatisfiableBudgets,
    /// Add the load-balancer exclusion label while draining.
    pub exclude_from_load_balancers: bool,
    /// Why, recorded in the cordon annotation and events.
    pub reason: String,
    /// Where the drain's figures go (the agent's `/metrics`), if anywhere.
    pub metrics: Option<std::sync::Arc<crate::drain::metrics::DrainMetrics>>,
    /// The machine is shutting down: the cordon is recorded as a shutdown cordon, which the
    /// agent lifts when the node comes back (see [`cordon::lift_after_shutdown`]).
    pub shutdown: bool,
    /// Where what the drain waits on goes, each time the Node's condition is written (the
    /// agent's status file), if anywhere.
    pub progress: Option<crate::drain::narrate::Progress>,
    /// When an evicted pod counts as gone.
    pub gone: Gone,
    /// Set the moment this drain's own write cordons the node ([`CordonOutcome::Cordoned`], not
    /// a cordon it found), for a caller that may drop the drain before its report (the agent,
    /// when a shutdown is cancelled), if any.
    pub cordoned: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// How long the drain's end may take once its loop is over (deadline, stop, every pod
    /// gone): surge replicas given back, the end Event, the last `nodeward.io/Draining` write.
    /// The drain may run this long past `timeout`.
    pub ending: Duration,
    /// `true` stops the drain: it ends [`DrainOutcome::Cancelled`], through the same ending.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// The whole cluster is being shut down (`nodeward cluster shutdown` recorded its intent,
    /// [`crate::names::CLUSTER_SHUTDOWN_CONFIGMAP`]): every node is cordoned and going down, so
    /// a budget that refuses an eviction cannot open before this node goes, and the drain need
    /// not wait on it. Set by the agent's shutdown drain when the intent exists as it starts;
    /// `false` for every other drain.
    pub cluster_shutdown: bool,
    /// Say the drain in Kubernetes' lifecycle conditions too (`DrainInProgress`, `Drained`;
    /// `[conditions] lifecycle`, [`crate::lifecycle`]).
    pub lifecycle: bool,
}

/// When an evicted pod counts as gone from its node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Gone {
    /// When its object is deleted, as kubectl drain waits: the node's kubelet keeps running and
    /// removes it seconds after the containers stop, and whoever runs `kubectl get pods` after the
    /// drain expects the node empty.
    #[default]
    Object,
    /// When its containers have stopped ([`plan::left_node`]): the kubelet stops with the machine
    /// and removes the objects when it is back, or they go with the Node. With the node's cgroup
    /// hierarchy when the drain runs on the node it drains: a pod whose containers have no
    /// process left there has stopped before its kubelet has said so.
    Stopped(Option<Cgroups>),
}

impl DrainOptions {
    /// Options for a node that is leaving (a system shutdown, the scaler removing the machine):
    /// the `[drain]` settings with `delete_emptydir_data_on_shutdown`, and the cordon recorded as
    /// a shutdown cordon when `shutdown`.
    pub fn for_leaving_node(
        s: &crate::config::DrainSettings,
        reason: impl Into<String>,
        shutdown: bool,
    ) -> Self {
        let mut opts = Self::from_settings(s, reason);
        opts.plan.delete_emptydir_data = s.delete_emptydir_data_on_shutdown;
        opts.shutdown = shutdown;
        // A shutdown drain runs on the machine that shuts down, whose kubelet stops with it.
        if shutdown {
            opts.gone = Gone::Stopped(Some(Cgroups::system()));
        }
        opts
    }

    /// Options for an operator's drain of a node that stays, from the `[drain]` settings.
    pub fn from_settings(s: &crate::config::DrainSettings, reason: impl Into<String>) -> Self {
        Self {
            plan: PlanOptions {
                force: s.force,
                delete_emptydir_data: s.delete_emptydir_data,
                waves: s.waves.clone(),
                surge: s.surge,
            },
            concurrency: usize::try_from(s.concurrency).unwrap_or(usize::MAX),
            timeout: s.timeout,
            on_deadline: s.on_deadline,
            unsatisfiable: s.unsatisfiable_budgets,
            exclude_from_load_balancers: s.exclude_from_load_balancers,
            reason: reason.into(),
            metrics: None,
            shutdown: false,
            progress: None,
            gone: Gone::Object,
            cordoned: None,
            ending: ENDING,
            stop: None,
            cluster_shutdown: false,
            // The config's default; callers set `[conditions] lifecycle`.
            lifecycle: true,
        }
    }
}
