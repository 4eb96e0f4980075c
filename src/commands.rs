//! One `run` function per subcommand, called from `main`; exit codes live here.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{
    Cli, Command, ConfigCommand, ControllerArgs, CordonArgs, DrainArgs, RenderArgs, ScalerArgs,
    UncordonArgs,
};
use crate::render::values::{Inputs, TokenSource};
use crate::secret::Secret;

/// Success.
pub const EXIT_OK: u8 = 0;
/// The operation failed (bad input, API error, ...).
pub const EXIT_FAILURE: u8 = 1;
/// Bad usage (clap uses the same code), or logging could not be set up.
pub const EXIT_USAGE: u8 = 2;
/// `drain`: the deadline passed with pods still on the node.
pub const EXIT_DEADLINE: u8 = 3;
/// `drain`: every evictable pod left, but some pods were refused (unmanaged, emptyDir,
/// annotated, or selected by several budgets) and are still there.
pub const EXIT_REFUSED: u8 = 4;
/// `drain`: every pod left the node, but `drain.on_deadline = delete` deleted some past their
/// PodDisruptionBudgets.
pub const EXIT_DELETED_PAST_BUDGETS: u8 = 5;
/// `drain`: pods are still on the node because their PodDisruptionBudgets cannot allow their
/// eviction (`drain.unsatisfiable_budgets = act` applied `on_deadline` to them early).
pub const EXIT_BUDGET_UNSATISFIABLE: u8 = 6;

/// Runs the parsed command line; returns the exit code.
pub fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Render(args) => render(&args),
        Command::Config(ConfigCommand::Check { output }) => {
            config_check(cli.config.as_deref(), output)
        }
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "nodeward", &mut std::io::stdout());
            Ok(EXIT_OK)
        }
        Command::Man { out_dir } => man(&out_dir),
        Command::Agent => agent(cli.config.as_deref()),
        Command::Drain(args) => block_on(drain(cli.config.as_deref(), args)),
        Command::Cordon(args) => block_on(cordon(cli.config.as_deref(), args)),
        Command::Uncordon(args) => block_on(uncordon(cli.config.as_deref(), args)),
        Command::Status { output } => block_on(status(cli.config.as_deref(), output)),
        Command::Reboot { cancel } => reboot(cli.config.as_deref(), cancel),
        Command::Scaler(args) => block_on(scaler(cli.config.as_deref(), args)),
        Command::Controller(args) => block_on(controller(args)),
        Command::Cluster(cmd) => block_on(cluster::run(cli.config.as_deref(), cmd)),
    }
}

/// The error chain on one line, skipping causes their parent's message already states.
pub fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn config_check(path: Option<&Path>, output: crate::cli::ConfigOutput) -> anyhow::Result<u8> {
    let sources = crate::config::load_sources(path)?;
    crate::config::parse(&sources)?;
    let effective = crate::config::effective::effective(&sources)?;
    match output {
        crate::cli::ConfigOutput::Json => {
            println!("{}", serde_json::to_string_pretty(&effective.to_json())?);
        }
        crate::cli::ConfigOutput::Toml => {
            if sources.is_empty() {
                eprintln!(
                    "no config files found (looked for {}); the defaults apply",
                    path.unwrap_or(Path::new(crate::config::DEFAULT_PATH))
                        .display()
                );
            }
            print!("{}", effective.to_toml());
            eprintln!("configuration is valid");
        }
    }
    Ok(EXIT_OK)
}

fn man(out_dir: &Path) -> anyhow::Result<u8> {
    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    clap_mangen::generate_to(Cli::command(), out_dir)
        .with_context(|| format!("cannot write man pages to {}", out_dir.display()))?;
    Ok(EXIT_OK)
}

/// Environment variable the bootstrap token may come from.
pub const TOKEN_ENV: &str = "NODEWARD_BOOTSTRAP_TOKEN";

fn read_token(args: &RenderArgs) -> anyhow::Result<Option<TokenSource>> {
    if let Some(path) = &args.token_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read token file {}", path.display()))?;
        let mode = std::fs::metadata(path)
            .with_context(|| format!("cannot stat token file {}", path.display()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{:o}", mode & 0o777),
                "the token file is readable by other users; chmod 600 it"
            );
        }
        return Ok(Some(TokenSource {
            origin: format!("--token-file {}", path.display()),
            token: Secret::new(text),
        }));
    }
    Ok(std::env::var(TOKEN_ENV).ok().map(|t| TokenSource {
        origin: TOKEN_ENV.to_string(),
        token: Secret::new(t),
    }))
}

fn render(args: &RenderArgs) -> anyhow::Result<u8> {
    let template = std::fs::read_to_string(&args.template)
        .with_context(|| format!("cannot read template {}", args.template.display()))?;
    let values_text = match &args.values {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read values file {}", p.display()))?,
        ),
        None => None,
    };
    let inputs = Inputs {
        file: args.values.as_deref().zip(values_text.as_deref()),
        sets: &args.sets,
        token: read_token(args)?,
    };
    let values = crate::render::Values::build(inputs, &crate::render::values::rand8())?;
    let name = args.template.display().to_string();
    let output = crate::render::render(&name, &template, &values)?;
    if args.check {
        let kind = crate::render::check(&name, &output)?;
        tracing::info!(template = %name, ?kind, "rendered output checked");
    }
    match &args.out {
        Some(path) => {
            crate::fsutil::write_private_atomic(path, output.as_bytes())?;
            tracing::info!(path = %path.display(), hostname = %values.hostname, "user data written (mode 0600)");
        }
        None => std::io::stdout()
            .write_all(output.as_bytes())
            .context("cannot write to stdout")?,
    }
    Ok(EXIT_OK)
}

/// Runs an async subcommand on a runtime sized for a CLI: a couple of worker threads are plenty
/// for a few hundred concurrent requests.
fn block_on<F: std::future::Future<Output = anyhow::Result<u8>>>(f: F) -> anyhow::Result<u8> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(f)
}

/// The node a command acts on: the argument, else node.name, else the hostname.
fn node_name(arg: Option<&str>, settings: &crate::config::Settings) -> anyhow::Result<String> {
    arg.map(str::to_string)
        .or_else(|| settings.node.name.clone())
        .or_else(crate::events::hostname)
        .context("no node given, node.name is not set and the hostname cannot be read")
}

async fn client_for(
    arg: Option<&Path>,
    settings: &crate::config::Settings,
) -> anyhow::Result<kube::Client> {
    Ok(crate::kube_client::client(arg.or(settings.node.kubeconfig.as_deref())).await?)
}

/// While this file exists `nodeward drain` does nothing: the package's prerm creates it around
/// stopping nodeward-drain.service on removal, because removing the package is not a decision to
/// drain the node (the unit's ExecStop is `nodeward drain`).
pub const NO_DRAIN_MARKER: &str = "/run/nodeward/no-drain";
/// Overrides [`NO_DRAIN_MARKER`] (tests).
pub const NO_DRAIN_MARKER_ENV: &str = "NODEWARD_NO_DRAIN_MARKER";

/// As the drain unit's ExecStop at a system shutdown: the policy and the drain options for this
/// shutdown, or `None` when there is nothing to do (the agent handled it, it was cancelled, or
/// the policy says nothing).
fn shutdown_drain(
    action: crate::shutdown::UnitAction,
    settings: &crate::config::Settings,
    node: &str,
) -> Option<(crate::config::ShutdownPolicy, crate::drain::DrainOptions)> {
    let (kind, policy) = match action {
        crate::shutdown::UnitAction::AgentDone(outcome) => {
            let outcome = outcome.map_or_else(|| "unknown".into(), |o| o.to_string());
            tracing::info!(node, %outcome, "the agent already handled this shutdown; nothing to do");
            return None;
        }
        crate::shutdown::UnitAction::Cancelled => {
            tracing::info!(
                node,
                "the agent's shutdown was cancelled; nothing to do (the agent arms this unit again)"
            );
            return None;
        }
        crate::shutdown::UnitAction::Apply(kind, p) => {
            tracing::info!(node, ?kind, policy = ?p, "system shutdown: applying the [shutdown] policy");
            if p == crate::config::ShutdownPolicy::Nothing {
                return None;
            }
            (kind, p)
        }
    };
    let reason =
        format!("shutdown ({kind:?}; nodeward-drain.service stopped by the system)").to_lowercase();
    let mut opts = crate::drain::DrainOptions::for_leaving_node(&settings.drain, reason, true);
    opts.lifecycle = settings.conditions.lifecycle;
    Some((policy, opts))
}

/// The `cordon` shutdown policy: the shutdown cordon alone, bounded by the drain's deadline.
async fn cordon_only(
    client: &kube::Client,
    node: &str,
    opts: &crate::drain::DrainOptions,
) -> anyhow::Result<u8> {
    let reason = &opts.reason;
    let exclude_lb = opts.exclude_from_load_balancers;
    let cordon = crate::drain::cordon_for_shutdown(client, node, reason, exclude_lb);
    let Ok(done) = tokio::time::timeout(opts.timeout, cordon).await else {
        eprintln!(
            "nodeward: cannot cordon node {node}: no answer from the API server within the drain deadline ({:?})",
            opts.timeout
        );
        return Ok(EXIT_DEADLINE);
    };
    done?;
    println!("node {node}: cordoned ({reason})");
    Ok(EXIT_OK)
}

/// The operator's word beats either default (the `[drain]` settings, or the agent's policy in a
/// shutdown): `--timeout`, `--force`, `--delete-emptydir-data`, `--surge`.
fn operators_word(
    opts: &mut crate::drain::DrainOptions,
    args: &DrainArgs,
    timeout: Option<std::time::Duration>,
) {
    if let Some(t) = timeout {
        opts.timeout = t;
    }
    if let Some(force) = args.force {
        opts.plan.force = force;
    }
    if let Some(delete) = args.delete_emptydir_data {
        opts.plan.delete_emptydir_data = delete;
    }
    if let Some(surge) = args.surge {
        opts.plan.surge = surge;
    }
}

async fn drain(config: Option<&Path>, args: DrainArgs) -> anyhow::Result<u8> {
    let marker = std::env::var_os(NO_DRAIN_MARKER_ENV).map_or_else(
        || std::path::PathBuf::from(NO_DRAIN_MARKER),
        std::path::PathBuf::from,
    );
    if marker.exists() {
        tracing::warn!(marker = %marker.display(), "not draining: the marker is present (the package is being removed)");
        return Ok(EXIT_OK);
    }
    let (settings, _) = crate::config::load(config)?;
    let node = node_name(args.node.as_deref(), &settings)?;
    let timeout = args
        .timeout
        .as_deref()
        .map(|t| {
            crate::config::Deadline::parse(t)
                .map(|d| d.0)
                .map_err(|e| anyhow::anyhow!("--timeout: {e}"))
        })
        .transpose()?;
    let mut opts = crate::drain::DrainOptions::from_settings(&settings.drain, "nodeward drain");
    opts.lifecycle = settings.conditions.lifecycle;
    // As nodeward-drain.service's ExecStop, systemd kills this at the unit's TimeoutStopSec=, and
    // the questions below (the agent's status, systemd's job queue, up to `systemd::TIMEOUT`)
    // come before the drain: ask for this drain's bound before any of them. On a real node under
    // an emulated CPU they outlasted a 3 s TimeoutStopSec=, and the stop was killed undrained.
    if !args.dry_run
        && let Some(budget) =
            crate::shutdown::stop_budget(timeout.unwrap_or(opts.timeout), opts.on_deadline)
    {
        crate::systemd::extend_stop_timeout(budget);
    }
    // As nodeward-drain.service's ExecStop during a system shutdown: the agent's policy, and
    // nothing the agent already did (see crate::shutdown). The cordon is a shutdown cordon that
    // the agent lifts after the reboot; an operator's drain stays.
    let mut policy = crate::config::ShutdownPolicy::Drain;
    let unit = if args.dry_run {
        None
    } else {
        crate::shutdown::for_this_shutdown(&settings).await
    };
    if let Some(action) = unit {
        let Some((p, o)) = shutdown_drain(action, &settings, &node) else {
            return Ok(EXIT_OK);
        };
        policy = p;
        opts = o;
    }
    operators_word(&mut opts, &args, timeout);
    // As nodeward-drain.service's ExecStop, systemd would kill this at the unit's
    // TimeoutStopSec=, however drain.timeout is set: ask for this drain's own deadline instead.
    if !args.dry_run
        && let Some(budget) = crate::shutdown::stop_budget(opts.timeout, opts.on_deadline)
    {
        crate::systemd::extend_stop_timeout(budget);
    }
    let client = client_for(args.kubeconfig.as_deref(), &settings).await?;
    if args.dry_run {
        let plan = crate::drain::dry_run(&client, &node, &opts).await?;
        print_plan(&node, &opts.plan, &plan);
        return Ok(EXIT_OK);
    }
    if policy == crate::config::ShutdownPolicy::Cordon {
        return cordon_only(&client, &node, &opts).await;
    }
    let report = match crate::drain::drain(&client, &node, &opts).await {
        Ok(report) => report,
        // The deadline passed before the API server answered at all: a deadline, as exit code.
        Err(e @ crate::drain::exec::Error::NoAnswer { .. }) => {
            eprintln!("nodeward: {e}");
            return Ok(EXIT_DEADLINE);
        }
        Err(e) => return Err(e.into()),
    };
    print!("{report}");
    Ok(drain_exit_code(&report))
}

/// `drain`'s exit code for how the drain ended. Pods still on the node (the deadline, a refusal)
/// come first: with [`EXIT_DELETED_PAST_BUDGETS`] or [`EXIT_OK`] a script knows the node is empty.
pub fn drain_exit_code(report: &crate::drain::DrainReport) -> u8 {
    match report.outcome {
        crate::drain::DrainOutcome::Drained if !report.force_deleted.is_empty() => {
            EXIT_DELETED_PAST_BUDGETS
        }
        crate::drain::DrainOutcome::Drained => EXIT_OK,
        crate::drain::DrainOutcome::Refused => EXIT_REFUSED,
        crate::drain::DrainOutcome::BudgetUnsatisfiable => EXIT_BUDGET_UNSATISFIABLE,
        // `nodeward drain` gives its drain no stop signal: it never ends cancelled.
        crate::drain::DrainOutcome::DeadlineExceeded | crate::drain::DrainOutcome::Cancelled => {
            EXIT_DEADLINE
        }
    }
}

fn print_plan(node: &str, opts: &crate::drain::plan::PlanOptions, plan: &crate::drain::plan::Plan) {
    use crate::drain::plan::Decision;
    println!("plan for node {node} (dry run: nothing changed)");
    println!(
        "force={} delete-emptydir-data={}",
        opts.force, opts.delete_emptydir_data
    );
    println!("{:<8} {:<5} {:<50} RULE", "ACTION", "WAVE", "POD");
    for p in &plan.pods {
        let (action, wave, reason) = match p.decision {
            Decision::Evict { wave, rule } => (
                "evict",
                wave.to_string(),
                format!("{rule}; priority {}", p.priority),
            ),
            Decision::Skip(why) => ("skip", "-".to_string(), why.to_string()),
            Decision::Refuse(why) => ("refuse", "-".to_string(), why.to_string()),
        };
        println!("{action:<8} {wave:<5} {:<50} {reason}", p.pod.to_string());
    }
}

async fn cordon(config: Option<&Path>, args: CordonArgs) -> anyhow::Result<u8> {
    let (settings, _) = crate::config::load(config)?;
    let client = client_for(args.kubeconfig.as_deref(), &settings).await?;
    let reason = args.reason.as_deref().unwrap_or("nodeward cordon");
    let outcome = crate::drain::cordon(&client, &args.node, reason, false).await?;
    match outcome {
        crate::drain::CordonOutcome::Cordoned => println!("node/{} cordoned", args.node),
        crate::drain::CordonOutcome::AlreadyOurs => {
            println!("node/{} already cordoned by nodeward", args.node)
        }
        crate::drain::CordonOutcome::AlreadyByOther => println!(
            "node/{} already cordoned by someone else; nodeward will not uncordon it",
            args.node
        ),
        crate::drain::CordonOutcome::TakenOver { from } => {
            println!(
                "node/{} cordoned by nodeward ({from}); now {reason}",
                args.node
            )
        }
    }
    Ok(EXIT_OK)
}

async fn uncordon(config: Option<&Path>, args: UncordonArgs) -> anyhow::Result<u8> {
    let (settings, _) = crate::config::load(config)?;
    let client = client_for(args.kubeconfig.as_deref(), &settings).await?;
    let by = crate::drain::Lifter::Operator;
    match crate::drain::uncordon(&client, &args.node, args.force, by).await? {
        crate::drain::UncordonOutcome::Uncordoned => println!("node/{} uncordoned", args.node),
        crate::drain::UncordonOutcome::NotCordoned => {
            println!("node/{} was not cordoned", args.node)
        }
        // An operator lifts any of nodeward's cordons: neither comes back for them.
        crate::drain::UncordonOutcome::Kept { reason }
        | crate::drain::UncordonOutcome::GivenBack { reason } => {
            println!("node/{} still cordoned by nodeward ({reason})", args.node)
        }
    }
    Ok(EXIT_OK)
}

/// `nodeward agent`: one thread is plenty for a handful of watches and a drain's evictions, and
/// keeps the resident agent small.
fn agent(config: Option<&Path>) -> anyhow::Result<u8> {
    let (settings, _) = crate::config::load(config)?;
    let node = node_name(None, &settings)?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(async {
            let api = match agent_kubeconfig(&settings) {
                // A file that kubeadm join may not have written yet: the agent waits for it.
                Some(path) => crate::agent::ApiAccess::Kubeconfig(path),
                None => crate::agent::ApiAccess::Client(client_for(None, &settings).await?),
            };
            crate::agent::run(settings, node, api).await?;
            Ok(EXIT_OK)
        })
}

/// The agent's kubeconfig file: `[node] kubeconfig`, else `KUBECONFIG` when it names one file
/// (the unit sets it to kubelet.conf); `None` leaves it to kube's inference (in-cluster,
/// `~/.kube/config`).
fn agent_kubeconfig(settings: &crate::config::Settings) -> Option<std::path::PathBuf> {
    if let Some(p) = &settings.node.kubeconfig {
        return Some(p.clone());
    }
    let env = std::env::var_os("KUBECONFIG")?;
    let mut paths = std::env::split_paths(&env).filter(|p| !p.as_os_str().is_empty());
    match (paths.next(), paths.next()) {
        (Some(one), None) => Some(one),
        _ => None,
    }
}

async fn status(config: Option<&Path>, output: crate::cli::StatusOutput) -> anyhow::Result<u8> {
    let (settings, _) = crate::config::load(config)?;
    let st = crate::agent::status::read(&settings.agent.status_file)?;
    let client = client_for(None, &settings).await.map_err(|e| describe(&e));
    let reboot = settings.reboot.enabled.then(|| {
        let path = crate::reboot::status::path_beside(&settings.agent.status_file);
        crate::reboot::status::read(&path)
    });
    let slots = match (&reboot, &client) {
        (Some(_), Ok(c)) => Some(crate::reboot::status::slots(c, &settings.reboot).await),
        _ => None,
    };
    match output {
        crate::cli::StatusOutput::Text => {
            print!("{st}");
            if let Some(r) = &reboot {
                print!(
                    "{}",
                    crate::reboot::status::text(r.as_ref(), slots.as_deref())
                );
            }
            let live = crate::agent::status::live(&st, client, settings.drain.on_deadline).await;
            print!("{live}");
        }
        crate::cli::StatusOutput::Json => {
            let mut doc = crate::agent::status::live_json(&st, client).await;
            if let Some(r) = reboot {
                doc["reboot"] = serde_json::json!({"status": r, "slots": slots});
            }
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
    }
    Ok(EXIT_OK)
}

/// `nodeward reboot [--cancel]`: writes (or removes) the request file the agent watches.
fn reboot(config: Option<&Path>, cancel: bool) -> anyhow::Result<u8> {
    let (settings, _) = crate::config::load(config)?;
    let s = &settings.reboot;
    if !s.enabled {
        anyhow::bail!(
            "coordinated reboots are off on this node: set enabled = true in [reboot] (/etc/nodeward/config.toml or a config.d drop-in), see docs/src/reboot.md"
        );
    }
    let file = &s.request_file;
    if cancel {
        match std::fs::remove_file(file) {
            Ok(()) => println!("withdrew the reboot request ({})", file.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                println!("no reboot request of nodeward reboot's to withdraw");
            }
            Err(e) => anyhow::bail!("cannot remove {}: {e}", file.display()),
        }
        if s.sentinel_command.is_none() && s.sentinel.exists() {
            println!(
                "{} still asks for a reboot; remove it to withdraw that request too",
                s.sentinel.display()
            );
        }
        return Ok(EXIT_OK);
    }
    let text = format!("asked by nodeward reboot at {}\n", jiff::Timestamp::now());
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    }
    crate::fsutil::write_private_atomic(file, text.as_bytes())?;
    println!(
        "reboot asked for ({}); the agent reboots this node when its slot, window, blockers, the cluster's health and the budgets allow: see nodeward status",
        file.display()
    );
    Ok(EXIT_OK)
}

/// Name of the provider token among systemd credentials (`LoadCredential=scaler-token:…`).
const SCALER_CREDENTIAL: &str = "scaler-token";

async fn scaler(config: Option<&Path>, args: ScalerArgs) -> anyhow::Result<u8> {
    let (mut settings, _) = crate::config::load(config)?;
    for spec in &args.nodes {
        crate::scaler::apply_nodes_flag(&mut settings.scaler, spec)?;
    }
    if let Some(addr) = args.metrics_address {
        settings.scaler.metrics_address = Some(addr);
    }
    // systemd's LoadCredential= (nodeward-scaler.service) and the Deployment's Secret mount both
    // put the provider token in $CREDENTIALS_DIRECTORY/scaler-token.
    if settings.scaler.cherry.token_file.is_none()
        && let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY")
    {
        let path = Path::new(&dir).join(SCALER_CREDENTIAL);
        if path.exists() {
            settings.scaler.cherry.token_file = Some(path);
        }
    }
    let client = crate::kube_client::client(
        args.kubeconfig
            .as_deref()
            .or(settings.scaler.kubeconfig.as_deref()),
    )
    .await?;
    let provider = crate::scaler::provider_from_settings(
        &settings.scaler,
        std::env::var(crate::scaler::provider::cherry::TOKEN_ENV).ok(),
    )?;
    let opts = crate::scaler::run::RunOptions {
        dry_run: args.dry_run,
        identity: crate::scaler::identity(),
    };
    let scaler = crate::scaler::run::Scaler::new(client, provider, &settings, opts).await?;
    scaler.run(crate::scaler::shutdown_signal()).await?;
    Ok(EXIT_OK)
}

async fn controller(args: ControllerArgs) -> anyhow::Result<u8> {
    let client = crate::kube_client::client(args.kubeconfig.as_deref()).await?;
    if args.lease_namespace.is_some() || args.lease_duration.is_some() {
        tracing::warn!(
            "--lease-namespace and --lease-duration are ignored: every replica of the controller acts, with guarded writes, and none waits for a Lease (remove them; see docs/src/readiness.md)"
        );
    }
    let metrics = std::sync::Arc::new(crate::readiness::metrics::ControllerMetrics::default());
    let _metrics = match args.metrics_address {
        Some(addr) => Some(crate::task::AbortOnDrop(
            crate::metrics_http::serve(addr, metrics.clone())
                .await
                .with_context(|| format!("cannot serve metrics on {addr}"))?
                .1,
        )),
        None => None,
    };
    let opts = crate::readiness::controller::Options {
        mode: args.mode,
        dry_run: args.dry_run,
        out_of_service: args.out_of_service.then_some(args.out_of_service_after),
        metrics,
    };
    crate::readiness::controller::run(client, opts, crate::scaler::shutdown_signal()).await?;
    Ok(EXIT_OK)
}

mod cluster;
#[cfg(test)]
mod tests;
