//! `nodeward cluster shutdown` and `nodeward cluster start`: the operator's side of a planned
//! power-down (see [`crate::cluster`]).

use std::path::Path;

use crate::cli::{ClusterCommand, ClusterShutdownArgs, ClusterStartArgs};

use super::{EXIT_DEADLINE, EXIT_FAILURE, EXIT_OK};

/// Runs `nodeward cluster ...`.
pub(super) async fn run(config: Option<&Path>, cmd: ClusterCommand) -> anyhow::Result<u8> {
    match cmd {
        ClusterCommand::Shutdown(args) => shutdown(config, args).await,
        ClusterCommand::Start(args) => start(args).await,
    }
}

async fn shutdown(config: Option<&Path>, args: ClusterShutdownArgs) -> anyhow::Result<u8> {
    let (settings, _) = crate::config::load(config)?;
    let wave_timeout = crate::config::Deadline::parse(&args.wave_timeout)
        .map(|d| d.0)
        .map_err(|e| anyhow::anyhow!("--wave-timeout: {e}"))?;
    let drain = &settings.drain;
    let opts = crate::cluster::ShutdownOptions {
        dry_run: args.dry_run,
        reason: args.reason,
        wave_timeout,
        // The rules of a node that is leaving: its scratch data goes with the power.
        rules: crate::drain::plan::LeaveRules {
            force: drain.force,
            delete_emptydir_data: drain.delete_emptydir_data_on_shutdown,
        },
        bands: drain.waves.clone(),
        concurrency: usize::try_from(drain.concurrency).unwrap_or(usize::MAX),
        lifecycle: settings.conditions.lifecycle,
    };
    let client = crate::kube_client::client(args.kubeconfig.as_deref()).await?;
    let mut say = |line: &str| println!("{line}");
    let report = crate::cluster::shutdown(&client, &opts, &mut say).await?;
    if opts.dry_run {
        return Ok(EXIT_OK);
    }
    let secs = report.elapsed.as_secs_f64();
    if report.not_stopped.is_empty() {
        println!(
            "{} pods stopped in {} waves in {secs:.1} s; safe to power off",
            report.stopped, report.waves
        );
        return Ok(EXIT_OK);
    }
    println!(
        "{} pods stopped in {} waves in {secs:.1} s; {} did not stop (above): powering off now stops them without their grace",
        report.stopped,
        report.waves,
        report.not_stopped.len()
    );
    Ok(EXIT_DEADLINE)
}

async fn start(args: ClusterStartArgs) -> anyhow::Result<u8> {
    let client = crate::kube_client::client(args.kubeconfig.as_deref()).await?;
    let report = crate::cluster::start(&client, CONCURRENCY).await?;
    if !report.had_intent {
        println!("no cluster shutdown was recorded; lifting any cordon a shutdown left");
    }
    for n in &report.uncordoned {
        println!("node {n}: uncordoned");
    }
    for n in &report.not_ours {
        println!("node {n}: cordoned by someone else since the shutdown; left cordoned");
    }
    for (n, reason) in &report.given_back {
        println!(
            "node {n}: cordoned before the shutdown by nodeward ({reason}); given back to it, still cordoned"
        );
    }
    for (n, reason) in &report.kept {
        println!(
            "node {n}: cordoned by nodeward for another reason since the shutdown ({reason}); left cordoned"
        );
    }
    for (n, why) in &report.failed {
        eprintln!("node {n}: could not be uncordoned: {why}");
    }
    println!(
        "cluster started: {} nodes uncordoned, the shutdown's record removed; the controllers' Pending pods schedule now",
        report.uncordoned.len()
    );
    if report.failed.is_empty() {
        Ok(EXIT_OK)
    } else {
        eprintln!(
            "{} nodes are still cordoned by the shutdown: `nodeward uncordon NODE` each (the record is removed)",
            report.failed.len()
        );
        Ok(EXIT_FAILURE)
    }
}

/// Uncordons in flight at once: a Node write each, as many as a drain's default evictions.
const CONCURRENCY: usize = 16;
