//! The agent's side of the API server: the kubeconfig it waits for, and how its calls fare —
//! retried with backoff, each distinct error logged once until an answer comes.

use super::*;

impl ApiLink {
    /// With `client` already built, or waiting for `kubeconfig` to give one.
    pub(super) fn new(client: Option<kube::Client>, kubeconfig: Option<PathBuf>) -> Self {
        Self {
            client,
            kubeconfig,
            credentials: None,
            kubeconfig_state: None,
            kubeconfig_retry_at: None,
            kubeconfig_backoff: Backoff::new(KUBECONFIG_RETRY_MIN, KUBECONFIG_RETRY_MAX),
            error: None,
            error_log: Quiet::default(),
            write_log: Quiet::default(),
            reconcile_retry_at: None,
            reconcile_backoff: Backoff::new(RECONCILE_RETRY, RECONCILE_RETRY_MAX),
        }
    }

    /// Tries to build the client from the kubeconfig (its failed requests counted in `errors`);
    /// logs only what changed.
    pub(super) async fn load_kubeconfig(&mut self, errors: &crate::kube_client::ApiErrors) {
        let Some(path) = self.kubeconfig.clone() else {
            return;
        };
        let state = if path.exists() {
            // Read before the client is built: a rotation while it is built changes the
            // fingerprint, and the next file event builds it again.
            let files = crate::kube_client::credential_files(&path);
            let fingerprint = crate::kube_client::fingerprint(&files);
            match crate::kube_client::client_with_deadline(
                Some(&path),
                REQUEST_DEADLINE,
                Some(errors),
            )
            .await
            {
                Ok(c) => {
                    info!(kubeconfig = %path.display(), "kubeconfig loaded; watching the Node");
                    self.client = Some(c);
                    self.credentials = Some((files, fingerprint));
                    self.kubeconfig_state = None;
                    self.kubeconfig_retry_at = None;
                    return;
                }
                Err(e) => {
                    self.kubeconfig_retry_at =
                        Some(Instant::now() + self.kubeconfig_backoff.failed());
                    KubeconfigState::Unloadable(e.to_string())
                }
            }
        } else {
            self.kubeconfig_retry_at = None;
            KubeconfigState::Missing
        };
        if self.kubeconfig_state.as_ref() != Some(&state) {
            match &state {
                KubeconfigState::Missing => {
                    info!(kubeconfig = %path.display(), "waiting for the kubeconfig (kubeadm join writes it)");
                }
                KubeconfigState::Unloadable(e) => {
                    warn!(kubeconfig = %path.display(), error = %e, "cannot load the kubeconfig; waiting for it to change");
                }
            }
            self.kubeconfig_state = Some(state);
        }
    }

    /// The files to watch for a new kubeconfig or new credentials: those the client was built
    /// from, else the kubeconfig alone; none without a kubeconfig (a client given whole).
    pub(super) fn credential_files(&self) -> Vec<PathBuf> {
        match (&self.credentials, &self.kubeconfig) {
            (Some((files, _)), _) => files.clone(),
            (None, Some(path)) => vec![path.clone()],
            (None, None) => Vec::new(),
        }
    }

    /// Whether the client must be built again: none yet, or the files it was built from hold
    /// something else now (kubelet rotated its client certificate).
    pub(super) fn credentials_changed(&self) -> bool {
        match &self.credentials {
            Some((files, fingerprint)) => crate::kube_client::fingerprint(files) != *fingerprint,
            None => true,
        }
    }

    /// The API server refused the client's credentials (401): build the client again from the
    /// files, after the kubeconfig backoff (a certificate that expired before kubelet rotated
    /// it works again as soon as the new one is read; one that nothing renews is tried at most
    /// every [`KUBECONFIG_RETRY_MAX`]).
    pub(super) fn unauthorized(&mut self) {
        if self.kubeconfig.is_none() || self.kubeconfig_retry_at.is_some() {
            return;
        }
        let wait = self.kubeconfig_backoff.failed();
        warn!(retry_in = ?wait, "the API server refused the client's credentials (401); building the client again from the kubeconfig");
        self.kubeconfig_retry_at = Some(Instant::now() + wait);
    }

    /// What keeps the agent from the API server, as its status line says it: the kubeconfig
    /// missing or not loading, or the last error until an answer comes; `None` when nothing
    /// does. A kubeconfig problem comes first: without a client there are no calls to fail.
    pub(super) fn blocked(&self) -> Option<String> {
        let kubeconfig = || {
            self.kubeconfig
                .as_deref()
                .map_or_else(|| "the kubeconfig".into(), |p| p.display().to_string())
        };
        match (&self.kubeconfig_state, &self.error) {
            (Some(KubeconfigState::Missing), _) => Some(format!(
                "waiting for {} (kubeadm join writes it)",
                kubeconfig()
            )),
            (Some(KubeconfigState::Unloadable(e)), _) => Some(format!(
                "cannot load {}: {e}; waiting for it to change",
                kubeconfig()
            )),
            (None, Some(e)) => Some(format!("API server unreachable: {e}")),
            (None, None) => None,
        }
    }

    /// No call reaches the API server now: there is no client yet, or the last call failed.
    pub(super) fn out_of_reach(&self) -> bool {
        self.client.is_none() || self.error.is_some()
    }

    /// A watch of `node`'s objects failed: remembered for STATUS, logged when it differs from
    /// the failures before.
    pub(super) fn failed(&mut self, node: &str, what: &str, error: &str) {
        if self.error_log.changed(error) {
            warn!(node = %node, error = %error, "{what} failed; retrying with backoff (each distinct error logged once until the API answers)");
        }
        self.error = Some(error.to_string());
    }

    /// An answer from the API server.
    pub(super) fn answered(&mut self, node: &str) {
        self.error = None;
        self.kubeconfig_backoff.reset();
        if self.error_log.clear() {
            info!(node = %node, "API server answering again");
        }
    }

    /// A write to the Node failed: retry later, with backoff, logging only a changed error.
    pub(super) fn write_failed(&mut self, node: &str, what: &str, error: &str) {
        if self.write_log.changed(error) {
            warn!(node = %node, error = %error, retry_in = ?self.reconcile_backoff.wait(), "{what}; retrying with backoff (each distinct error logged once until the API answers)");
        }
        self.reconcile_retry_at = Some(Instant::now() + self.reconcile_backoff.failed());
    }

    /// Every write a reconcile had to make succeeded: the backoff starts over.
    pub(super) fn writes_succeeded(&mut self, node: &str) {
        self.reconcile_backoff.reset();
        if self.write_log.clear() {
            info!(node = %node, "writes to the Node succeed again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfig_problem_comes_before_the_last_error() {
        let mut api = ApiLink::new(None, None);
        assert_eq!(api.blocked(), None, "nothing tried yet");
        assert!(api.out_of_reach(), "no client yet");
        api.failed("n1", "node watch", "connection refused");
        api.kubeconfig_state = Some(KubeconfigState::Missing);
        assert_eq!(
            api.blocked().as_deref(),
            Some("waiting for the kubeconfig (kubeadm join writes it)")
        );
        api.kubeconfig_state = None;
        assert_eq!(
            api.blocked().as_deref(),
            Some("API server unreachable: connection refused")
        );
        api.answered("n1");
        assert_eq!(api.blocked(), None);
    }

    #[test]
    fn a_failed_write_backs_off_until_writes_succeed() {
        let mut api = ApiLink::new(None, None);
        let before = Instant::now();
        api.write_failed("n1", "cannot report readiness", "503");
        let first = api.reconcile_retry_at.expect("a retry");
        assert!(first >= before + RECONCILE_RETRY);
        assert_eq!(api.reconcile_backoff.wait(), RECONCILE_RETRY * 2);
        for _ in 0..10 {
            api.write_failed("n1", "cannot report readiness", "503");
        }
        assert_eq!(api.reconcile_backoff.wait(), RECONCILE_RETRY_MAX);
        api.writes_succeeded("n1");
        assert_eq!(api.reconcile_backoff.wait(), RECONCILE_RETRY);
    }
}
