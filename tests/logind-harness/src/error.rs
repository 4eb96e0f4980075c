//! The harness's one error type. Every variant names what failed and, where a person can fix it,
//! how (which package to install, which child to look at).

use std::path::PathBuf;
use std::time::Duration;

use crate::Mode;

/// Result with the harness's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while starting, driving or stopping the harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A program the harness needs is not installed. The message names each missing piece and the
    /// exact `apt-get install` line that brings them.
    #[error(
        "logind-harness cannot start: {}; install with: apt-get install -y {} \
         (the harness needs the Debian packages: systemd dbus python3-dbusmock util-linux)",
        missing.join("; "),
        packages.join(" ")
    )]
    MissingPrerequisites {
        /// One line per missing program, saying what was looked for.
        missing: Vec<String>,
        /// The apt packages that provide the missing programs, deduplicated.
        packages: Vec<String>,
    },

    /// Real-logind mode needs root: `unshare --mount` and `mount --bind` need CAP_SYS_ADMIN, and
    /// logind only lets privileged callers power off without PolicyKit.
    #[error(
        "logind-harness needs root for Mode::Real (unshare --mount and mount need CAP_SYS_ADMIN; \
         logind allows PowerOff without PolicyKit only to privileged callers); effective uid is \
         {euid}. Run the tests as root or use Mode::DbusmockLogind"
    )]
    NotRoot {
        /// The effective uid the harness ran with.
        euid: u32,
    },

    /// A file or directory of the harness could not be created or written.
    #[error("cannot write {path}")]
    Write {
        /// The path that could not be written.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The harness's temporary directory could not be created, or its path is too long for a
    /// unix socket address.
    #[error("cannot create the harness directory: {reason}")]
    TempDir {
        /// What went wrong.
        reason: String,
        /// The I/O error, when there was one.
        #[source]
        source: Option<std::io::Error>,
    },

    /// A child process could not be started.
    #[error("cannot start {name} ({program})")]
    Spawn {
        /// The harness's name for the child (`dbus-daemon`, `systemd mock`, `systemd-logind`…).
        name: &'static str,
        /// The program that was executed.
        program: PathBuf,
        /// The I/O error from spawning.
        #[source]
        source: std::io::Error,
    },

    /// A child process exited while the harness was waiting for it to come up.
    #[error("{name} exited ({status}) before it was ready; its last output:\n{output}")]
    ChildExited {
        /// The harness's name for the child.
        name: &'static str,
        /// How it exited.
        status: String,
        /// The last lines it wrote to stdout/stderr.
        output: String,
    },

    /// Something the harness waits for did not happen in time.
    #[error(
        "timed out after {timeout:?} waiting for {what}{}",
        tail_suffix(output)
    )]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long the harness waited.
        timeout: Duration,
        /// The last output of the child concerned, if any.
        output: String,
    },

    /// A D-Bus call or subscription failed.
    #[error("D-Bus: {context}")]
    DBus {
        /// What the harness was doing.
        context: String,
        /// The zbus error (a D-Bus error reply carries logind's own message). Boxed: zbus's error
        /// is large and every `Result` of the harness would carry its size.
        #[source]
        source: Box<zbus::Error>,
    },

    /// logind came up but reports a different `InhibitDelayMaxUSec` than the harness configured,
    /// which means it did not read the harness's drop-in (the bind mount over `/etc/systemd`
    /// failed or logind reads its configuration from elsewhere).
    #[error(
        "logind reports InhibitDelayMaxUSec={actual:?} but the harness configured {expected:?}; \
         it did not read {dropin}"
    )]
    ConfigNotApplied {
        /// The value the harness wrote.
        expected: Duration,
        /// The value logind reports.
        actual: Duration,
        /// The drop-in file the harness wrote.
        dropin: PathBuf,
    },

    /// A signal could not be sent to a child.
    #[error("cannot send {signal} to {name} (pid {pid})")]
    Signal {
        /// The harness's name for the child.
        name: &'static str,
        /// The pid signalled.
        pid: i32,
        /// The signal.
        signal: nix::sys::signal::Signal,
        /// The errno.
        #[source]
        source: nix::Error,
    },

    /// The operation needs logind to be running, and it is not (after `kill_logind`).
    #[error("logind is not running (call restart_logind first)")]
    LogindNotRunning,

    /// The operation does not exist in this mode.
    #[error("{operation} is not available in {mode:?} mode: {why}")]
    Unsupported {
        /// The harness method called.
        operation: &'static str,
        /// The harness's mode.
        mode: Mode,
        /// Why not, and what to use instead.
        why: &'static str,
    },

    /// `cancel_shutdown` found nothing to cancel: no shutdown job was pending at the systemd mock
    /// and logind had no scheduled shutdown. logind 252 cannot cancel a `PowerOff` that is still
    /// waiting for delay locks; cancel once the job has started (`wait_for_unit_started`).
    #[error(
        "nothing to cancel: no shutdown job is pending and no shutdown is scheduled \
         (logind 252 cannot cancel a PowerOff that is still waiting for delay locks)"
    )]
    NothingToCancel,
}

fn tail_suffix(output: &str) -> String {
    if output.is_empty() {
        String::new()
    } else {
        format!("; last output:\n{output}")
    }
}

impl Error {
    pub(crate) fn dbus(context: impl Into<String>) -> impl FnOnce(zbus::Error) -> Error {
        let context = context.into();
        move |source| Error::DBus {
            context,
            source: Box::new(source),
        }
    }

    pub(crate) fn fdo(context: impl Into<String>) -> impl FnOnce(zbus::fdo::Error) -> Error {
        let context = context.into();
        move |source| Error::DBus {
            context,
            source: Box::new(source.into()),
        }
    }

    /// The D-Bus error name of a method-call failure (e.g.
    /// `org.freedesktop.login1.OperationInProgress`), if this is one.
    pub fn dbus_error_name(&self) -> Option<&str> {
        match self {
            Error::DBus { source, .. } => match source.as_ref() {
                zbus::Error::MethodError(name, _, _) => Some(name.as_str()),
                _ => None,
            },
            _ => None,
        }
    }
}
