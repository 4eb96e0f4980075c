//! The command line. Parsing only: each subcommand's work lives in its capability's module and
//! is called from `run`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Graceful life for Kubernetes nodes: bootstrap with cloud-init, take no workload until the
/// network is up, and give pods back through the Eviction API before the machine goes down.
#[derive(Debug, Parser)]
#[command(
    name = "nodeward",
    version,
    about,
    after_help = "Examples:\n  \
      nodeward render --template cloud-init/worker.yaml.tera --values cloud-init/values.example.toml --token-file token --check\n  \
      nodeward config check --config /etc/nodeward/config.toml\n  \
      nodeward completions bash > /usr/share/bash-completion/completions/nodeward\n  \
      nodeward man --out-dir /usr/share/man/man1"
)]
pub struct Cli {
    /// Main config file; drop-ins are read from config.d/ beside it.
    #[arg(long, global = true, env = "NODEWARD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Log level or filter directive (error, warn, info, debug, trace, or "nodeward=debug,kube=info"); overrides RUST_LOG.
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Render cloud-init user data from a tera template and validated values.
    #[command(after_help = "Examples:\n  \
        nodeward render --template cloud-init/worker.yaml.tera --values cloud-init/values.example.toml --token-file /root/token\n  \
        NODEWARD_BOOTSTRAP_TOKEN=$(cat token) nodeward render --template t.yaml.tera --values v.toml --set node_group=gpu --out user-data --check")]
    Render(RenderArgs),
    /// Run the node agent (readiness gate and drain on shutdown); what nodeward.service runs.
    Agent,
    /// Cordon this node (or NODE) and evict its pods, respecting PodDisruptionBudgets.
    Drain(DrainArgs),
    /// Mark NODE unschedulable, recording that nodeward did it.
    Cordon(CordonArgs),
    /// Make NODE schedulable again, if nodeward cordoned it.
    Uncordon(UncordonArgs),
    /// Run the central scaler: node groups grow for pending pods and shrink when idle.
    #[command(after_help = "Examples:\n  \
        nodeward scaler --config /etc/nodeward/config.toml\n  \
        nodeward scaler --nodes 1:10:web --nodes 0:4:gpu --dry-run --log-level debug")]
    Scaler(ScalerArgs),
    /// Run the readiness controller: remove the startup taint from nodes whose agent reports ready.
    #[command(after_help = "Examples:\n  \
        nodeward controller --kubeconfig /etc/nodeward/controller.kubeconfig\n  \
        nodeward controller --mode bootstrap --dry-run")]
    Controller(ControllerArgs),
    /// Show what the agent on this node sees, and what a drain of the node waits on.
    Status {
        /// `text` for people, `json` for scripts.
        #[arg(long, value_enum, default_value = "text")]
        output: StatusOutput,
    },
    /// Ask for a coordinated reboot of this node (`[reboot]` enabled): the agent reboots it when
    /// a slot, the window, the blockers, the cluster's health and the budgets allow.
    Reboot {
        /// Withdraw this command's request (a sentinel file still asks until removed).
        #[arg(long)]
        cancel: bool,
    },
    /// Stop the whole cluster for a planned power-down, or start it again.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Validate or show the configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print a shell completion script to stdout.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write man pages (nodeward.1 and one per subcommand) into a directory.
    Man {
        /// Where to write the pages.
        #[arg(long, value_name = "DIR")]
        out_dir: PathBuf,
    },
}

/// `nodeward config ...`
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Read the config file and its drop-ins, validate them, and print the effective
    /// configuration with where each value came from (default, the file, which drop-in).
    Check {
        /// `toml` (each value commented with its origin) or `json` (for scripts).
        #[arg(long, value_enum, default_value = "toml")]
        output: ConfigOutput,
    },
}

/// `nodeward cluster ...`
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Record a whole-cluster shutdown, cordon every node, and stop the workloads in waves
    /// (lower priority first; stateless, then StatefulSets, then pods with volumes; DaemonSets
    /// and static pods left alone) by graceful deletion; ends with "safe to power off".
    #[command(after_help = "Examples:\n  \
        nodeward cluster shutdown --dry-run\n  \
        nodeward cluster shutdown --reason 'datacenter move' --kubeconfig ~/.kube/admin.conf\n\n\
        While the shutdown is recorded (ConfigMap kube-system/nodeward-cluster-shutdown), agents \
        drain without waiting on budgets and the scaler neither scales nor repairs. \
        `nodeward cluster start` undoes it.")]
    Shutdown(ClusterShutdownArgs),
    /// Lift the cordons `cluster shutdown` made (never anyone else's) and remove its record,
    /// so the controllers' Pending pods schedule again.
    #[command(after_help = "Examples:\n  \
        nodeward cluster start --kubeconfig ~/.kube/admin.conf")]
    Start(ClusterStartArgs),
}

/// `nodeward cluster shutdown` arguments.
#[derive(Debug, Args)]
pub struct ClusterShutdownArgs {
    /// Print the order (waves with their pods, what is left alone) and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Why, recorded with the shutdown.
    #[arg(long, value_name = "TEXT", default_value = "planned power-down")]
    pub reason: String,
    /// How long one wave waits for its pods to be gone before the next starts (its stragglers are
    /// reported), e.g. 90s or 5m.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub wave_timeout: String,
    /// Kubeconfig to use (default: KUBECONFIG / ~/.kube/config / in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// `nodeward cluster start` arguments.
#[derive(Debug, Args)]
pub struct ClusterStartArgs {
    /// Kubeconfig to use (default: KUBECONFIG / ~/.kube/config / in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// How `nodeward status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusOutput {
    /// Lines like `systemctl status`.
    Text,
    /// `{"agent": {...the status file...}, "agent_running": true, "draining": {...} | null,
    /// "node_error": null}`.
    Json,
}

/// How `nodeward config check` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ConfigOutput {
    /// TOML, each value followed by `# <origin>`.
    Toml,
    /// `{"files": [...], "config": {...}, "origins": {"drain.timeout": "default", ...}}`.
    Json,
}

/// `nodeward render` arguments.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The tera template.
    #[arg(long, value_name = "FILE")]
    pub template: PathBuf,
    /// TOML file with the values (cluster_name, node_group, api_server_endpoint, ...).
    #[arg(long, value_name = "FILE")]
    pub values: Option<PathBuf>,
    /// Override a value: key=value, node_labels.KEY=VALUE, extra.KEY=VALUE; lists comma-separated. Secrets are refused here.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// File holding the bootstrap token (else NODEWARD_BOOTSTRAP_TOKEN is read).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Write here atomically with mode 0600 instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Also check the output is user data cloud-init accepts (#cloud-config YAML, script or MIME multipart).
    #[arg(long)]
    pub check: bool,
}

/// `nodeward drain` arguments.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The node; defaults to node.name from the config, else this machine's hostname.
    pub node: Option<String>,
    /// Overall deadline, e.g. 90s or 5m (default: drain.timeout).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Print the plan (per pod: action, wave, reason) and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Evict pods that no controller manages, and pods whose DaemonSet is gone (default:
    /// drain.force); --force=false says no.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub force: Option<bool>,
    /// Evict pods with emptyDir volumes, deleting their data (default: drain.delete_emptydir_data,
    /// or drain.delete_emptydir_data_on_shutdown during a system shutdown); =false says no.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub delete_emptydir_data: Option<bool>,
    /// Surge before evict: ask a Deployment for a replacement, Ready elsewhere, before evicting
    /// its pod when the eviction would leave no ready replica (default: drain.surge; a pod asks
    /// for it itself with nodeward.io/drain: surge); =false says no.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub surge: Option<bool>,
    /// Kubeconfig to use (default: node.kubeconfig, else KUBECONFIG / ~/.kube/config / in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// `nodeward scaler` arguments.
#[derive(Debug, Args)]
pub struct ScalerArgs {
    /// Override a configured group's size limits, as cluster-autoscaler's --nodes: MIN:MAX:NAME (repeatable).
    #[arg(long = "nodes", value_name = "MIN:MAX:NAME")]
    pub nodes: Vec<String>,
    /// Decide and log every action, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Kubeconfig to use (default: scaler.kubeconfig, else KUBECONFIG / ~/.kube/config / in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Serve /metrics, /healthz and /readyz on this address instead of scaler.metrics_address
    /// (the Deployment's probes and Service use it).
    #[arg(long, value_name = "ADDR")]
    pub metrics_address: Option<std::net::SocketAddr>,
}

/// `nodeward controller` arguments.
#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// `continuous`: also put the startup taint back when a node's condition turns False;
    /// `bootstrap`: only ever remove it.
    #[arg(long, value_enum, default_value = "continuous")]
    pub mode: crate::readiness::Mode,
    /// Log what would change, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Kubeconfig to use (default: KUBECONFIG / ~/.kube/config / in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Add node.kubernetes.io/out-of-service=nodeshutdown:NoExecute to a node whose agent
    /// recorded a power-off once it is NotReady and its heartbeat Lease (kube-node-lease) has
    /// not changed for --out-of-service-after, as this controller saw it (its pods are then
    /// deleted and their volumes detached); remove it when the node boots again. Off by default.
    #[arg(long)]
    pub out_of_service: bool,
    /// How long a node that announced a power-off must be NotReady with no heartbeat before the
    /// taint (the taint lands up to 5 s later: the controller's recheck).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::validate::duration)]
    pub out_of_service_after: std::time::Duration,
    /// Serve Prometheus metrics (/metrics) and /healthz on this address (off by default).
    #[arg(long, value_name = "ADDR")]
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Accepted and ignored: the controller no longer elects a leader (kept so that manifests
    /// written for 0.1 keep starting).
    #[arg(long, value_name = "NS", hide = true)]
    pub lease_namespace: Option<String>,
    /// Accepted and ignored, as --lease-namespace.
    #[arg(long, value_name = "DURATION", hide = true)]
    pub lease_duration: Option<String>,
}

/// `nodeward cordon` arguments.
#[derive(Debug, Args)]
pub struct CordonArgs {
    /// The node.
    pub node: String,
    /// Why, recorded in the nodeward.io/cordoned-by annotation.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Kubeconfig to use.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// `nodeward uncordon` arguments.
#[derive(Debug, Args)]
pub struct UncordonArgs {
    /// The node.
    pub node: String,
    /// Uncordon even if someone else cordoned it.
    #[arg(long)]
    pub force: bool,
    /// Kubeconfig to use.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    /// The Deployment's probes depend on the scaler listening where its command says.
    #[test]
    fn the_scaler_takes_a_metrics_address_and_refuses_a_bad_one() {
        let parse = |addr: &str| {
            Cli::try_parse_from(["nodeward", "scaler", "--metrics-address", addr]).map(|cli| {
                match cli.command {
                    Command::Scaler(s) => s.metrics_address,
                    other => panic!("not scaler: {other:?}"),
                }
            })
        };
        assert_eq!(
            parse("0.0.0.0:8085").expect("parses"),
            Some(std::net::SocketAddr::from(([0, 0, 0, 0], 8085)))
        );
        let err = parse("8085")
            .expect_err("a port alone is refused")
            .to_string();
        assert!(err.contains("--metrics-address"), "{err}");
    }

    /// kubectl drain's boolean flags: bare means yes, `=false` says no, absent leaves the config's.
    #[test]
    fn drain_flags_can_say_yes_or_no() {
        let parse = |args: &[&str]| {
            let cli =
                Cli::try_parse_from(["nodeward", "drain"].iter().chain(args)).expect("parses");
            match cli.command {
                Command::Drain(d) => (d.node, d.force, d.delete_emptydir_data),
                other => panic!("not drain: {other:?}"),
            }
        };
        assert_eq!(parse(&["n1"]), (Some("n1".into()), None, None));
        assert_eq!(
            parse(&["--force", "n1", "--delete-emptydir-data"]),
            (Some("n1".into()), Some(true), Some(true))
        );
        assert_eq!(
            parse(&["n1", "--delete-emptydir-data=false", "--force=false"]),
            (Some("n1".into()), Some(false), Some(false))
        );
        assert!(Cli::try_parse_from(["nodeward", "drain", "--force=maybe"]).is_err());
    }
}
