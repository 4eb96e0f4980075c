//! One child process of the harness: started in its own process group with a parent-death signal,
//! its output kept (last lines) and broadcast line by line, and always killed — group and all —
//! when dropped.

use std::collections::VecDeque;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::{Error, Result};

/// Lines of output kept per child for error messages: enough for logind's start-up and a few
/// operations, small enough to paste into a test failure.
const KEPT_LINES: usize = 200;

/// Lines buffered for live subscribers (e.g. `sighup_logind` waiting for "Config file reloaded.");
/// a subscriber that falls further behind skips lines rather than blocking the child's output.
const BROADCAST_CAPACITY: usize = 256;

/// How long `Drop` waits for a SIGKILLed child to be reaped before leaving it to tokio's orphan
/// reaper. SIGKILL is not catchable, so this is scheduling time only.
const DROP_REAP_WAIT: Duration = Duration::from_secs(2);

/// Poll interval while `Drop` waits for the reap; short because the wait is usually a few ms.
const DROP_REAP_POLL: Duration = Duration::from_millis(2);

pub(crate) struct ManagedChild {
    name: &'static str,
    child: Child,
    pid: i32,
    exited: Option<ExitStatus>,
    log: Arc<Mutex<VecDeque<String>>>,
    lines: broadcast::Sender<String>,
    readers: Vec<JoinHandle<()>>,
}

impl ManagedChild {
    /// Starts `cmd` in a new process group with `PR_SET_PDEATHSIG=SIGKILL`, stdin closed and
    /// stderr captured. If `take_stdout` is set, stdout is piped and handed back for the caller to
    /// read first (dbus-daemon's address); otherwise it is captured like stderr.
    pub(crate) fn spawn(
        name: &'static str,
        mut cmd: Command,
        take_stdout: bool,
    ) -> Result<(Self, Option<ChildStdout>)> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the
        // parent; it is the only thing run between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let program = cmd.as_std().get_program().to_owned();
        let mut child = cmd.spawn().map_err(|source| Error::Spawn {
            name,
            program: Path::new(&program).to_path_buf(),
            source,
        })?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .unwrap_or_default();
        let log = Arc::new(Mutex::new(VecDeque::with_capacity(KEPT_LINES)));
        let (lines, _) = broadcast::channel(BROADCAST_CAPACITY);
        let mut readers = Vec::new();
        if let Some(stderr) = child.stderr.take() {
            readers.push(tokio::spawn(pump(name, stderr, log.clone(), lines.clone())));
        }
        let stdout = child.stdout.take();
        let stdout = if take_stdout {
            stdout
        } else {
            if let Some(out) = stdout {
                readers.push(tokio::spawn(pump(name, out, log.clone(), lines.clone())));
            }
            None
        };
        tracing::debug!(child = name, pid, "started");
        Ok((
            ManagedChild {
                name,
                child,
                pid,
                exited: None,
                log,
                lines,
                readers,
            },
            stdout,
        ))
    }

    /// Keeps reading (and logging) a stream the caller took with `take_stdout`.
    pub(crate) fn adopt_output<R: AsyncRead + Unpin + Send + 'static>(&mut self, r: R) {
        self.readers.push(tokio::spawn(pump(
            self.name,
            r,
            self.log.clone(),
            self.lines.clone(),
        )));
    }

    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// A live feed of the child's output lines from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<String> {
        self.lines.subscribe()
    }

    /// The last lines the child wrote, oldest first.
    pub(crate) fn output_tail(&self) -> String {
        match self.log.lock() {
            Ok(log) => log.iter().cloned().collect::<Vec<_>>().join("\n"),
            Err(_) => String::new(),
        }
    }

    /// Waits for the child to exit (idempotent) and returns its status as text.
    pub(crate) async fn wait(&mut self) -> String {
        if let Some(s) = self.exited {
            return s.to_string();
        }
        match self.child.wait().await {
            Ok(s) => {
                self.exited = Some(s);
                s.to_string()
            }
            Err(e) => format!("wait failed: {e}"),
        }
    }

    /// An error saying the child exited, with its status and last output. Waits for the exit.
    pub(crate) async fn exited_error(&mut self) -> Error {
        let status = self.wait().await;
        // Let the output pumps drain what the child wrote just before it died.
        for r in &mut self.readers {
            let _ = tokio::time::timeout(Duration::from_millis(200), r).await;
        }
        Error::ChildExited {
            name: self.name,
            status,
            output: self.output_tail(),
        }
    }

    /// Sends `signal` to the child's pid only (not its group).
    pub(crate) fn signal(&self, signal: Signal) -> Result<()> {
        kill(Pid::from_raw(self.pid), signal).map_err(|source| Error::Signal {
            name: self.name,
            pid: self.pid,
            signal,
            source,
        })
    }

    /// SIGTERM to the process group, then SIGKILL if it has not exited within `grace`.
    pub(crate) async fn terminate(&mut self, grace: Duration) -> String {
        if self.exited.is_some() {
            return self.wait().await;
        }
        let _ = killpg(Pid::from_raw(self.pid), Signal::SIGTERM);
        if let Ok(status) = tokio::time::timeout(grace, self.wait()).await {
            let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
            return status;
        }
        tracing::warn!(
            child = self.name,
            pid = self.pid,
            ?grace,
            "did not exit on SIGTERM; killing"
        );
        let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
        self.wait().await
    }

    /// Synchronous last resort for `Drop`: SIGKILL the whole group and reap the leader.
    fn kill_now(&mut self) {
        if self.pid <= 0 {
            return;
        }
        let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
        if self.exited.is_some() {
            return;
        }
        let deadline = std::time::Instant::now() + DROP_REAP_WAIT;
        while std::time::Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(s)) => {
                    self.exited = Some(s);
                    return;
                }
                Ok(None) => std::thread::sleep(DROP_REAP_POLL),
                Err(_) => return,
            }
        }
    }
}

impl Drop for ManagedChild {
    fn drop(&mut self) {
        self.kill_now();
        for r in &self.readers {
            r.abort();
        }
    }
}

async fn pump<R: AsyncRead + Unpin>(
    name: &'static str,
    r: R,
    log: Arc<Mutex<VecDeque<String>>>,
    tx: broadcast::Sender<String>,
) {
    let mut lines = BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(child = name, "{line}");
        if let Ok(mut log) = log.lock() {
            if log.len() == KEPT_LINES {
                log.pop_front();
            }
            log.push_back(line.clone());
        }
        let _ = tx.send(line);
    }
}
