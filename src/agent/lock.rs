//! The agent's side of logind: connecting to it, taking (and re-taking) the shutdown delay lock,
//! and making sure logind's cap leaves the drain its time. The lock's life is decided by the pure
//! [`super::state::Lock`] machine; this file performs it.

use super::*;

impl Agent {
    pub(super) async fn connect_logind(&mut self) -> Option<BoxStream<'static, logind::Heard>> {
        let conn = match Logind::connect().await {
            Ok(c) => c,
            Err(e) => {
                if self.logind.bus_missing {
                    tracing::debug!(error = %e, retry_in = ?self.logind.backoff.wait(), "still no system bus");
                } else {
                    warn!(error = %e, retry_in = ?self.logind.backoff.wait(), "cannot reach the system bus; trying again quietly until it is there");
                    self.logind.bus_missing = true;
                }
                self.logind.schedule_retry();
                return None;
            }
        };
        if std::mem::take(&mut self.logind.bus_missing) {
            info!("the system bus is there again");
        }
        // Subscribe before taking the lock, so a shutdown announced in between is seen.
        let events = match conn.events().await {
            Ok(ev) => ev,
            Err(e) => {
                warn!(error = %e, "cannot subscribe to logind's signals");
                self.logind.schedule_retry();
                return None;
            }
        };
        self.read_userspace_start(conn.connection()).await;
        self.logind.conn = Some(conn);
        self.logind.backoff.reset();
        if self.known.wants_lock() {
            self.take_lock().await;
        }
        Some(events)
    }

    /// Reads when this userspace started from systemd, on the bus logind is on: after a
    /// soft-reboot the kernel's boot is no longer this boot's start. Where systemd does not
    /// answer (no systemd on the bus, as in the logind harness), the kernel's boot stands.
    async fn read_userspace_start(&mut self, conn: &zbus::Connection) {
        let read = async {
            crate::systemd::Systemd::on(conn)
                .await?
                .userspace_start_monotonic()
                .await
        };
        match tokio::time::timeout(crate::systemd::TIMEOUT, read).await {
            Ok(Ok(start)) => {
                if let Some(d) = userspace_since_boot(start) {
                    self.known.userspace_since_boot = d;
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "systemd does not say when userspace started; the kernel's boot is this boot's start")
            }
            Err(_) => tracing::debug!(
                "systemd did not say in time when userspace started; the kernel's boot is this boot's start"
            ),
        }
    }

    /// Lists kubelet's shutdown delay locks into the facts (none without logind); true when they
    /// changed. A failed listing keeps what was known.
    pub(super) async fn list_kubelet_locks(&mut self) -> bool {
        let pids: Vec<u32> = match &self.logind.conn {
            None => Vec::new(),
            Some(l) => {
                match tokio::time::timeout(Duration::from_secs(2), l.list_inhibitors()).await {
                    Ok(Ok(list)) => logind::kubelet_locks(&list).iter().map(|i| i.pid).collect(),
                    Ok(Err(e)) => {
                        warn!(error = %e, "cannot list logind's inhibitors");
                        return false;
                    }
                    Err(_) => {
                        warn!("logind did not list its inhibitors within 2 s");
                        return false;
                    }
                }
            }
        };
        if self.known.facts.kubelet_shutdown_locks.as_ref() == Some(&pids) {
            return false;
        }
        if !pids.is_empty() {
            error!(node = %self.node, kubelet_pids = ?pids, "kubelet's graceful node shutdown is on: it would kill pods without evictions at power-off; the node stays gated until shutdownGracePeriod is 0s");
        }
        self.known.facts.kubelet_shutdown_locks = Some(pids);
        true
    }

    /// Takes a new lock; an already held one is closed only after the new one is in hand, so
    /// there is never a moment without a lock and never two left behind (logind keeps locks
    /// across its own restart).
    pub(super) async fn take_lock(&mut self) {
        let Some(l) = self.logind.conn.clone() else {
            return;
        };
        match l.take_lock().await {
            Ok(fd) => {
                let ev = if self.known.lock == Lock::Held {
                    LockEvent::Replaced
                } else {
                    LockEvent::Taken
                };
                drop(self.logind.lock_fd.replace(fd));
                self.known.lock_to(ev);
                self.known.lock_takes += 1;
                self.logind.backoff.reset();
                info!(who = logind::WHO, event = ?ev, "shutdown delay lock held");
                self.check_logind(&l).await;
                // kubelet's locks as of now too (the timer follows later ones); the gates are
                // re-decided on the loop's next turn.
                if self.list_kubelet_locks().await {
                    self.api.reconcile_retry_at = Some(Instant::now());
                }
            }
            Err(e) if e.is_logind_absent() => {
                warn!(error = %e, "logind is not on the bus; waiting for it to appear");
            }
            Err(e) if e.is_operation_in_progress() => {
                // logind refuses new delay locks while a shutdown job is pending; it may still
                // be cancelled, so keep trying.
                warn!(error = %e, retry_in = ?self.logind.backoff.wait(), "a shutdown is in progress; logind refuses new locks until it is cancelled");
                self.logind.schedule_retry();
            }
            Err(e) => {
                warn!(error = %e, retry_in = ?self.logind.backoff.wait(), "cannot take the shutdown delay lock");
                self.logind.schedule_retry();
            }
        }
    }

    /// Reads logind's cap (raising it once if too short). kubelet's locks are
    /// [`Self::list_kubelet_locks`]'s.
    pub(super) async fn check_logind(&mut self, l: &Logind) {
        let s = &self.settings;
        let (timeout, margin) = (s.drain.timeout, s.shutdown.safety_margin);
        let mut warnings = Vec::new();
        match l.inhibit_delay_max().await {
            Ok(cap) => {
                self.known.cap = Some(cap);
                if logind::cap_too_short(cap, timeout, margin) && !self.logind.cap_fix_tried {
                    self.logind.cap_fix_tried = true;
                    self.known.cap = Some(self.raise_cap(l, cap).await);
                }
            }
            Err(e) => warn!(error = %e, "cannot read logind's InhibitDelayMaxUSec"),
        }
        if let Some(cap) = self.known.cap
            && logind::cap_too_short(cap, timeout, margin)
        {
            let w = format!(
                "logind's InhibitDelayMaxSec is {cap:?}, below drain.timeout {timeout:?} + shutdown.safety_margin {margin:?}: shutdown drains get only {:?}",
                logind::drain_deadline(cap, margin, timeout)
            );
            error!(cap = ?cap, "{w}");
            warnings.push(w);
        }
        self.known.warnings = warnings;
    }

    /// Writes the drop-in, SIGHUPs logind and re-reads the cap; returns the cap seen last.
    pub(super) async fn raise_cap(&self, l: &Logind, cap: Duration) -> Duration {
        let s = &self.settings.shutdown;
        let want = logind::wanted_cap(s, self.settings.drain.timeout);
        let path = &s.logind_dropin;
        warn!(cap = ?cap, want = ?want, dropin = %path.display(), "logind's InhibitDelayMaxSec is too short for the drain; raising it");
        if let Some(dir) = path.parent()
            && !dir.exists()
        {
            // Like /etc/systemd itself: logind.conf.d holds no secrets, and 0755 is what every
            // tool expects (the unit's UMask=0077 would make it 0700).
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir);
            let _ =
                std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755));
        }
        if let Err(e) =
            crate::fsutil::write_private_atomic(path, logind::dropin_text(want).as_bytes())
        {
            error!(error = %e, "cannot write the logind drop-in");
            return cap;
        }
        // logind reads its config as root; 0644 like every other file in logind.conf.d.
        let _ = std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o644));
        let pid = match l.logind_pid().await {
            Ok(p) => p,
            Err(e) => {
                error!(error = %e, "cannot find logind's pid to make it reload");
                return cap;
            }
        };
        let Ok(pid_i) = i32::try_from(pid) else {
            return cap;
        };
        // SIGHUP makes logind reload but kills most other programs: signal only a process that
        // is logind, whatever owns its bus name.
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != LOGIND_COMM {
            error!(pid, comm = %comm.trim(), "the owner of org.freedesktop.login1 is not systemd-logind; not sending SIGHUP");
            return cap;
        }
        if let Err(e) = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid_i),
            nix::sys::signal::Signal::SIGHUP,
        ) {
            error!(pid, error = %e, "cannot send SIGHUP to logind");
            return cap;
        }
        let mut seen = cap;
        for _ in 0..CAP_REREAD_ATTEMPTS {
            tokio::time::sleep(CAP_REREAD_INTERVAL).await;
            if let Ok(c) = l.inhibit_delay_max().await {
                seen = c;
                if c >= want {
                    info!(cap = ?c, "logind's InhibitDelayMaxSec raised");
                    break;
                }
            }
        }
        seen
    }
}

impl LogindLink {
    /// Tries again after the backoff, which doubles for the next failure.
    pub(super) fn schedule_retry(&mut self) {
        self.retry_at = Some(Instant::now() + self.backoff.failed());
    }

    /// The bus connection is gone: reconnect after the backoff as it stands.
    pub(super) fn lost(&mut self) {
        self.conn = None;
        self.retry_at = Some(Instant::now() + self.backoff.wait());
    }
}
