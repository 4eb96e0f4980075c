//! Configuration: `/etc/nodeward/config.toml` plus `config.d/*.toml` drop-ins.
//!
//! Every file is parsed on its own into a *fragment* whose fields are all optional, so a type or
//! format error is reported with the file, line, column and key where it was written. Fragments are
//! then merged in order (main file, then drop-ins sorted by name; later wins per key, arrays are
//! replaced whole) and turned once into typed [`Settings`], with the defaults from one place
//! ([`Settings::default`], mirrored by the shipped `packaging/config.toml`). The parser takes
//! `&str`, so tests never touch the filesystem or the environment.

pub mod effective;
mod fragment;
mod reboot;
mod scaler;
mod types;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use reboot::{AlertFilter, RebootSettings, SLOT_PREFIX, Unavailable};
pub use scaler::{
    Capacity, CherryGroupSettings, CherrySettings, ExecSettings, Expander, GroupSettings,
    ProviderKind, ScalerSettings,
};
pub(crate) use types::Deadline;
pub use types::{OnDeadline, ShutdownPolicy, TaintOwner, UnsatisfiableBudgets, Wave};

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
    /// The node agent.
    pub agent: AgentSettings,
    /// Readiness gates the agent waits for before the node takes workload.
    pub gates: GateSettings,
    /// What the agent does when the machine shuts down.
    pub shutdown: ShutdownSettings,
    /// The central scaler.
    pub scaler: ScalerSettings,
    /// Coordinated reboots.
    pub reboot: RebootSettings,
    /// Which Node conditions nodeward writes besides its own.
    pub conditions: ConditionsSettings,
}

/// `[conditions]`: the Node conditions nodeward writes besides its own `nodeward.io/*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConditionsSettings {
    /// Kubernetes 1.37's lifecycle conditions (`DrainInProgress`, `Drained`,
    /// `GracefulNodeShutdownInProgress`, `MaintenancePlanned`, `MaintenanceInProgress`;
    /// [`crate::lifecycle`]). `false` for a cluster where another tool owns them.
    pub lifecycle: bool,
}

/// `[agent]`: the node agent's own behaviour.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSettings {
    /// Where the agent writes what it sees, for `nodeward status` (atomically).
    pub status_file: PathBuf,
    /// If the gates have not all passed this long after the agent started, its condition's
    /// reason becomes `NotReadyInTime` (the scaler replaces the machine on it) and it records a
    /// `NodeNotReadyInTime` Event for people.
    pub boot_deadline: Duration,
    /// Put the startup taint back when a gate fails after the node became schedulable (only
    /// with `startup_taint = "agent"`; the controller has its own `--mode`).
    pub retaint_on_gate_failure: bool,
    /// Who removes the startup taint.
    pub startup_taint: TaintOwner,
    /// Where the agent serves `/metrics` (its drains, its lock, its gates); `None`: nowhere.
    /// Loopback by default: the endpoint has no authentication.
    pub metrics_address: Option<std::net::SocketAddr>,
}

/// `[gates]`: every gate listed must pass.
#[derive(Debug, Clone, PartialEq)]
pub struct GateSettings {
    /// Files that must exist (with matching content).
    pub file: Vec<crate::gate::FileGate>,
    /// Pods on this node that must be Ready.
    pub pod: Vec<crate::gate::PodGate>,
    /// Node conditions that must hold.
    pub node_condition: Vec<crate::gate::ConditionGate>,
    /// HTTP endpoints that must answer 2xx.
    pub http: Vec<crate::gate::HttpGate>,
    /// How often http gates are probed.
    pub http_interval: Duration,
    /// How long one probe may take.
    pub http_timeout: Duration,
}

impl GateSettings {
    /// All gates in one list: files, pods, node conditions, http.
    pub fn gates(&self) -> Vec<crate::gate::Gate> {
        use crate::gate::Gate;
        let files = self.file.iter().cloned().map(Gate::File);
        let pods = self.pod.iter().cloned().map(Gate::Pod);
        let conds = self.node_condition.iter().cloned().map(Gate::NodeCondition);
        let http = self.http.iter().cloned().map(Gate::Http);
        // Not configurable: a node whose drain the API server would refuse, or whose kubelet
        // kills its pods at shutdown on its own, cannot leave gracefully, whatever else is up.
        let access = [Gate::DrainAccess, Gate::KubeletShutdownOff];
        files
            .chain(pods)
            .chain(conds)
            .chain(http)
            .chain(access)
            .collect()
    }
}

/// `[shutdown]`: the inhibitor lock and what a shutdown does to the node.
#[derive(Debug, Clone, PartialEq)]
pub struct ShutdownSettings {
    /// Policy when the machine powers off (or halts).
    pub on_poweroff: ShutdownPolicy,
    /// Policy when it reboots.
    pub on_reboot: ShutdownPolicy,
    /// Policy when logind does not say which (systemd before 255 sends only
    /// `PrepareForShutdown`, without the type).
    pub on_unknown: ShutdownPolicy,
    /// The shutdown drain's deadline is logind's `InhibitDelayMaxUSec` minus this (and at most
    /// `drain.timeout`), so the lock is released before logind gives up on it.
    pub safety_margin: Duration,
    /// What `InhibitDelayMaxSec` the agent configures when logind's is below
    /// `drain.timeout + safety_margin`.
    pub inhibit_delay_max: Duration,
    /// The logind drop-in the agent writes for that.
    pub logind_dropin: PathBuf,
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
    /// Whether a pod whose budget cannot allow its eviction gets the deadline policy at once.
    pub unsatisfiable_budgets: UnsatisfiableBudgets,
    /// Evict pods no controller manages (they are not recreated anywhere).
    pub force: bool,
    /// Evict pods with emptyDir volumes (their data is lost) in an operator's drain of a node
    /// that stays: `nodeward drain`, `systemctl stop nodeward-drain` outside a shutdown.
    pub delete_emptydir_data: bool,
    /// The same for a node that is leaving: a system shutdown or reboot, or the scaler removing
    /// the machine.
    pub delete_emptydir_data_on_shutdown: bool,
    /// Evictions in flight at once.
    pub concurrency: u32,
    /// Label the node `node.kubernetes.io/exclude-from-external-load-balancers` while draining.
    pub exclude_from_load_balancers: bool,
    /// Priority waves, lowest `min_priority` first.
    pub waves: Vec<Wave>,
    /// Surge before evict: ask a Deployment for a replacement and wait until it is Ready
    /// elsewhere before evicting its pod, when the eviction would leave no ready replica or its
    /// budget allows none (a pod opts in itself with `nodeward.io/drain: surge`).
    pub surge: bool,
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
                // Waiting for a budget that cannot open only spends the deadline: the pod meets
                // the same policy either way, and the shutdown goes on sooner.
                unsatisfiable_budgets: UnsatisfiableBudgets::Act,
                force: false,
                // An operator's drain of a node that stays up: kubectl drain's default. The pod's
                // scratch data would be lost without anyone having asked.
                delete_emptydir_data: false,
                // A leaving node stops the pod either way, and its scratch data with it (a
                // removed machine's disk, a memory-backed volume at any shutdown; after a reboot
                // only if the pod was not replaced meanwhile): refusing would only mean the pod
                // is killed by the shutdown instead of evicted through its budget and started
                // elsewhere at once.
                delete_emptydir_data_on_shutdown: true,
                // Enough to evict a full node (kubelet's default max is 110 pods) in a few round
                // trips without bursting hundreds of requests at the API server at once.
                concurrency: 32,
                exclude_from_load_balancers: true,
                waves: types::default_waves(),
                // Opt-in: it changes other objects than the node's own (a Deployment's replica
                // count), and needs the extra RBAC of rbac-agent-surge.yaml.
                surge: false,
            },
            agent: AgentSettings {
                // tmpfs: the status describes this boot only.
                status_file: PathBuf::from("/run/nodeward/status.json"),
                // kubeadm join, image pulls and flannel's start take a minute or two on a healthy
                // machine; ten minutes means something is wrong with this one.
                boot_deadline: Duration::from_secs(600),
                retaint_on_gate_failure: true,
                startup_taint: TaintOwner::Controller,
                metrics_address: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 8084))),
            },
            gates: default_gates(),
            shutdown: ShutdownSettings {
                on_poweroff: ShutdownPolicy::Drain,
                on_reboot: ShutdownPolicy::Drain,
                on_unknown: ShutdownPolicy::Drain,
                // Covers releasing the lock and logind's 250 ms timer slack with room to spare.
                safety_margin: Duration::from_secs(5),
                // drain.timeout (90 s) plus margin, rounded up: what the shipped drop-in sets.
                inhibit_delay_max: Duration::from_secs(120),
                logind_dropin: PathBuf::from("/etc/systemd/logind.conf.d/90-nodeward.conf"),
            },
            scaler: ScalerSettings::default(),
            reboot: RebootSettings::default(),
            // The words the ecosystem reads for a leaving node; nodeward leaves any of them that
            // another writer set alone, so on is safe beside another tool.
            conditions: ConditionsSettings { lifecycle: true },
        }
    }
}

/// flannel's defaults: its subnet file with a subnet in it, its DaemonSet pod Ready, and the
/// node Ready without a network problem.
fn default_gates() -> GateSettings {
    let parse = |t: &str| toml::from_str::<GateSettings0>(t);
    #[derive(serde::Deserialize)]
    struct GateSettings0 {
        file: Vec<crate::gate::FileGate>,
        pod: Vec<crate::gate::PodGate>,
        node_condition: Vec<crate::gate::ConditionGate>,
    }
    // Static text checked by the unit tests; the same literal forms as packaging/config.toml.
    let g = parse(DEFAULT_GATES).unwrap_or_else(|e| panic!("built-in gates: {e}"));
    GateSettings {
        file: g.file,
        pod: g.pod,
        node_condition: g.node_condition,
        http: Vec::new(),
        // A CNI health endpoint is cheap; every 5 s keeps a flapping CNI from going unseen long.
        http_interval: Duration::from_secs(5),
        // Localhost answers in milliseconds; a hung endpoint counts as failing.
        http_timeout: Duration::from_secs(2),
    }
}

/// The default gates, in config syntax.
const DEFAULT_GATES: &str = r#"
[[file]]
path = "/run/flannel/subnet.env"
contains = "FLANNEL_SUBNET="
[[pod]]
namespace = "kube-flannel"
selector = "app=flannel"
[[node_condition]]
type = "Ready"
status = "True"
[[node_condition]]
type = "NetworkUnavailable"
not = "True"
"#;

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
    let sources = load_sources(explicit)?;
    let settings = parse(&sources)?;
    Ok((settings, sources.into_iter().map(|s| s.path).collect()))
}

/// The main config file and its drop-ins as read, in the order they apply (see [`load`]).
pub fn load_sources(explicit: Option<&Path>) -> Result<Vec<Source>> {
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
    Ok(sources)
}

#[cfg(test)]
mod tests;
