//! `kube-emulator`: serve the emulated Kubernetes API until SIGINT or SIGTERM, so `kubectl
//! --kubeconfig FILE` works against it from a shell.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kube_emulator::{Emulator, EmulatorOptions};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Kubernetes API server emulator for tests (plain HTTP, no auth)"
)]
struct Cli {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Write a kubeconfig for the emulator here.
    #[arg(long)]
    kubeconfig_out: PathBuf,
    /// Multiply pod grace periods by this before the kubelet stand-in removes pods.
    #[arg(long, default_value_t = 1.0)]
    grace_scale: f64,
    /// Objects to create at start (multi-document YAML; may be repeated).
    #[arg(long)]
    seed: Vec<PathBuf>,
    /// Pods bound to a node become Running and Ready at once.
    #[arg(long)]
    auto_ready: bool,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 60)]
    bookmark_seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let emu = Emulator::start(EmulatorOptions {
        listen: cli.listen,
        grace_scale: cli.grace_scale,
        auto_ready: cli.auto_ready,
        bookmark_interval: Duration::from_secs(cli.bookmark_seconds.max(1)),
        kubeconfig_path: Some(cli.kubeconfig_out.clone()),
        ..EmulatorOptions::default()
    })
    .await
    .context("starting the emulator")?;
    for path in &cli.seed {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading seed file {}", path.display()))?;
        let created = emu
            .apply_yaml(&text)
            .with_context(|| format!("seeding from {}", path.display()))?;
        tracing::info!(file = %path.display(), objects = created.len(), "seeded");
    }
    println!("{}", emu.url());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    emu.shutdown().await;
    Ok(())
}
