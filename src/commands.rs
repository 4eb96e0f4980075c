//! One `run` function per subcommand, called from `main`; exit codes live here.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{Cli, Command, ConfigCommand, RenderArgs};
use crate::render::values::{Inputs, TokenSource};
use crate::secret::Secret;

/// Success.
pub const EXIT_OK: u8 = 0;
/// The operation failed (bad input, API error, ...).
pub const EXIT_FAILURE: u8 = 1;
/// Bad usage, or a subcommand this build does not provide yet.
pub const EXIT_USAGE: u8 = 2;

/// A subcommand whose issue has not landed; it does nothing rather than pretend.
#[derive(Debug, thiserror::Error)]
#[error("`nodeward {0}` is not available yet in this build")]
pub struct NotAvailable(&'static str);

/// Runs the parsed command line; returns the exit code.
pub fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Render(args) => render(&args),
        Command::Config(ConfigCommand::Check) => config_check(cli.config.as_deref()),
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "nodeward", &mut std::io::stdout());
            Ok(EXIT_OK)
        }
        Command::Man { out_dir } => man(&out_dir),
        Command::Agent => Err(NotAvailable("agent").into()),
        Command::Drain(_) => Err(NotAvailable("drain").into()),
        Command::Cordon(_) => Err(NotAvailable("cordon").into()),
        Command::Uncordon(_) => Err(NotAvailable("uncordon").into()),
        Command::Scaler => Err(NotAvailable("scaler").into()),
        Command::Status => Err(NotAvailable("status").into()),
    }
}

/// The exit code for an error.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<NotAvailable>().is_some() {
        EXIT_USAGE
    } else {
        EXIT_FAILURE
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

fn config_check(path: Option<&Path>) -> anyhow::Result<u8> {
    let (settings, files) = crate::config::load(path)?;
    if files.is_empty() {
        println!(
            "no config files found (looked for {}); the defaults apply",
            path.unwrap_or(Path::new(crate::config::DEFAULT_PATH))
                .display()
        );
    }
    for f in &files {
        println!("read {}", f.display());
    }
    println!("configuration is valid: {settings:#?}");
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
