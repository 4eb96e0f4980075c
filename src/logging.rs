//! Logging setup, done once in `main`.
//!
//! Under systemd (`JOURNAL_STREAM` set) events go to journald with their structured fields, so
//! `journalctl -u nodeward -o verbose` shows `NODE=`, `POD=` and friends; anywhere else they go
//! to stderr in a human format. The level comes from `--log-level`, else `RUST_LOG`, else `info`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Errors from [`init`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The level or filter directive is not understood.
    #[error(
        "invalid log level {directive:?}: expected error, warn, info, debug, trace or a RUST_LOG directive such as \"nodeward=debug,kube=info\""
    )]
    Filter {
        /// What was given.
        directive: String,
        /// The parser's complaint.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was already installed.
    #[error("logging was already initialised")]
    AlreadySet(#[source] tracing_subscriber::util::TryInitError),
}

/// Installs the global subscriber.
pub fn init(level: Option<&str>) -> Result<(), Error> {
    let directive = level
        .map(str::to_string)
        .or_else(|| std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "info".to_string());
    let filter = EnvFilter::try_new(&directive).map_err(|source| Error::Filter {
        directive: directive.clone(),
        source,
    })?;
    let journald = std::env::var_os("JOURNAL_STREAM")
        .is_some()
        .then(tracing_journald::layer)
        .and_then(Result::ok);
    let registry = tracing_subscriber::registry().with(filter);
    match journald {
        Some(layer) => registry
            // Fields as docs/src/operations.md documents them (`NODE=`, `GATE=`, `OUTCOME=`),
            // not the layer's default `F_NODE=`.
            .with(
                layer
                    .with_syslog_identifier("nodeward".to_string())
                    .with_field_prefix(None),
            )
            .try_init(),
        None => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_target(false),
            )
            .try_init(),
    }
    .map_err(Error::AlreadySet)
}
