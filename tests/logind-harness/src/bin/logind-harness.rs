//! `logind-harness`: starts a private system bus with real systemd-logind (or dbusmock's logind)
//! and keeps it up until SIGINT or SIGTERM, for shell scripts and demos.
//!
//! Once ready it prints shell assignments on stdout (and, with `--env-file`, writes them to a file
//! atomically, so a script can wait for the file):
//!
//! ```text
//! DBUS_SYSTEM_BUS_ADDRESS=unix:path=/tmp/logind-harness-XXXX/bus.sock,guid=…
//! LOGIND_HARNESS_DROPIN_DIR=/tmp/logind-harness-XXXX/etc-systemd/logind.conf.d
//! LOGIND_HARNESS_LOGIND_PID=1234
//! LOGIND_HARNESS_DIR=/tmp/logind-harness-XXXX
//! LOGIND_HARNESS_PID=1230
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use logind_harness::{LogindHarness, Mode, Options};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum CliMode {
    /// The real /lib/systemd/systemd-logind in its own mount namespace (needs root).
    Real,
    /// python-dbusmock's logind template.
    Dbusmock,
}

/// Run systemd-logind on a private D-Bus system bus until SIGINT/SIGTERM.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Which logind to run.
    #[arg(long, value_enum, default_value = "real")]
    mode: CliMode,
    /// InhibitDelayMaxSec logind starts with, in seconds (fractions allowed).
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    inhibit_delay_max: f64,
    /// Also write the variables to this file, atomically, once everything is up.
    #[arg(long, value_name = "PATH")]
    env_file: Option<PathBuf>,
    /// Run logind with SYSTEMD_LOG_LEVEL=debug (its output goes to stderr with RUST_LOG=debug).
    #[arg(long)]
    debug: bool,
}

// One thread: the children's parent-death signal is tied to the thread that spawned them, and the
// main thread lives exactly as long as the process.
#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "logind_harness=info".into()),
        )
        .init();
    match run(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("logind-harness: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if !(cli.inhibit_delay_max.is_finite() && cli.inhibit_delay_max >= 0.0) {
        anyhow::bail!(
            "--inhibit-delay-max must be a non-negative number of seconds, got {}",
            cli.inhibit_delay_max
        );
    }
    let mut sigint = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("install SIGTERM handler")?;

    let harness = LogindHarness::start(Options {
        mode: match cli.mode {
            CliMode::Real => Mode::Real,
            CliMode::Dbusmock => Mode::DbusmockLogind,
        },
        inhibit_delay_max: Duration::from_secs_f64(cli.inhibit_delay_max),
        logind_debug: cli.debug,
        ..Options::default()
    })
    .await
    .context("start the harness")?;

    let vars = format!(
        "DBUS_SYSTEM_BUS_ADDRESS={}\nLOGIND_HARNESS_DROPIN_DIR={}\nLOGIND_HARNESS_LOGIND_PID={}\n\
         LOGIND_HARNESS_DIR={}\nLOGIND_HARNESS_PID={}\n",
        harness.bus_address(),
        harness.dropin_dir().display(),
        harness
            .logind_pid()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        harness.dir().display(),
        std::process::id(),
    );
    let mut out = std::io::stdout().lock();
    out.write_all(vars.as_bytes())
        .and_then(|()| out.flush())
        .context("write to stdout")?;
    drop(out);
    if let Some(path) = &cli.env_file {
        write_atomically(path, &vars)?;
    }

    tokio::select! {
        _ = sigint.recv() => tracing::info!("SIGINT: stopping"),
        _ = sigterm.recv() => tracing::info!("SIGTERM: stopping"),
    }
    harness.shutdown().await;
    if let Some(path) = &cli.env_file {
        // Best effort: the file describes a bus that no longer exists.
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

fn write_atomically(path: &Path, contents: &str) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("create a temporary file in {}", dir.display()))?;
    tmp.write_all(contents.as_bytes())
        .with_context(|| format!("write {}", tmp.path().display()))?;
    tmp.persist(path)
        .with_context(|| format!("rename into {}", path.display()))?;
    Ok(())
}
