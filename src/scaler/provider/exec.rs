//! The `exec` provider: three configured commands (list, create, delete) speaking JSON, so any
//! cloud CLI or on-prem tooling can supply machines.
//!
//! Protocol (also in docs/src/scaler.md, "Providers"): each command gets one JSON object on
//! stdin and answers on stdout; exit status 0 means success, anything else fails with stderr as
//! the message.
//! - list: `{"action":"list","cluster":C}` → `[{"id","hostname","group","created_at"}, ...]`
//!   (the cluster's machines; `created_at` RFC 3339);
//! - create: `{"action":"create","cluster","group","hostname","plan","region","image",
//!   "ssh_keys":[..],"tags":{..},"user_data":BASE64}` → `{"id", "created_at"?, ...}`;
//! - delete: `{"action":"delete","cluster","id"}` → exit 0, also when the machine is gone.
//!
//! The user data holds a bootstrap token, so it travels only on stdin: never in argv (readable
//! by every user in /proc) nor in the environment (inherited by every child, shown by `ps e`).

use std::process::Stdio;

use base64::Engine;
use serde::Deserialize;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tracing::{debug, instrument};

use super::{CLUSTER_TAG, CreateSpec, Error, Provider, Result, truncate};
use crate::config::ExecSettings;
use crate::resources::Resources;
use crate::scaler::model::MachineView;

/// One machine as a command reports it.
#[derive(Debug, Deserialize)]
struct Reported {
    id: String,
    #[serde(default)]
    hostname: Option<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    created_at: Option<String>,
}

/// The exec provider.
#[derive(Debug)]
pub struct Exec {
    settings: ExecSettings,
    cluster: String,
}

impl Exec {
    /// From `[scaler.exec]`; every command must be set.
    pub fn new(settings: &ExecSettings, cluster: &str) -> Result<Self> {
        for (key, argv) in [
            ("create", &settings.create),
            ("delete", &settings.delete),
            ("list", &settings.list),
        ] {
            if argv.is_empty() {
                return Err(Error::Config {
                    provider: "exec",
                    message: format!("scaler.exec.{key} is not set: give the command as an array"),
                });
            }
        }
        Ok(Self {
            settings: settings.clone(),
            cluster: cluster.to_string(),
        })
    }

    async fn run(
        &self,
        action: &'static str,
        argv: &[String],
        input: serde_json::Value,
    ) -> Result<String> {
        let command = argv.first().cloned().unwrap_or_default();
        let fail = |outcome: String| Error::Command {
            action,
            command: command.clone(),
            outcome: scrub(&outcome),
        };
        let mut child = tokio::process::Command::new(&command)
            .args(&argv[1..])
            .env("NODEWARD_ACTION", action)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            // Its own process group, so that a timeout kills what it started too (a cloud CLI's
            // helper still creating a machine nobody waits for).
            .process_group(0)
            .spawn()
            .map_err(|e| fail(format!("cannot be started: {e}")))?;
        let group = child.id().and_then(|p| i32::try_from(p).ok());
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| fail("has no stdin".into()))?;
        let bytes = serde_json::to_vec(&input).map_err(|e| fail(format!("input: {e}")))?;
        let started = std::time::Instant::now();
        let output = tokio::time::timeout(self.settings.timeout, async move {
            stdin.write_all(&bytes).await?;
            drop(stdin);
            child.wait_with_output().await
        })
        .await
        .map_err(|_| {
            if let Some(pgid) = group {
                // The leader was dropped and killed with the future; this takes the rest.
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pgid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            fail(format!(
                "did not finish within {} and was killed with its process group",
                humantime::format_duration(self.settings.timeout)
            ))
        })?
        .map_err(|e| fail(format!("failed: {e}")))?;
        debug!(action, command = %command, status = %output.status, elapsed_ms = started.elapsed().as_millis() as u64, "exec provider command");
        if !output.status.success() {
            return Err(fail(format!(
                "exited with {}: {}",
                output.status,
                truncate(&String::from_utf8_lossy(&output.stderr))
            )));
        }
        String::from_utf8(output.stdout).map_err(|_| fail("wrote output that is not UTF-8".into()))
    }
}

/// A machine as a command reported it; `fallback` fills what a create's answer leaves out.
fn machine(
    r: Reported,
    action: &'static str,
    fallback: Option<&CreateSpec>,
) -> Result<MachineView> {
    let decode = |message: String| Error::Decode {
        provider: "exec",
        action,
        message,
    };
    let created = match (&r.created_at, fallback) {
        (Some(c), _) => c.parse().map_err(|_| {
            decode(format!(
                "machine {}: created_at {c:?} is not RFC 3339",
                r.id
            ))
        })?,
        (None, Some(_)) => jiff::Timestamp::now(),
        (None, None) => return Err(decode(format!("machine {} has no created_at", r.id))),
    };
    let hostname = r
        .hostname
        .or_else(|| fallback.map(|s| s.hostname.clone()))
        .ok_or_else(|| decode(format!("machine {} has no hostname", r.id)))?;
    let group = r
        .group
        .or_else(|| fallback.map(|s| s.group.clone()))
        .ok_or_else(|| decode(format!("machine {} has no group", r.id)))?;
    Ok(MachineView {
        id: r.id,
        hostname,
        group,
        created,
    })
}

/// A `list` command's output: the cluster's machines. Whatever the text, an error and never a
/// panic (fuzzed).
pub fn decode_list(out: &str) -> Result<Vec<MachineView>> {
    let reported: Vec<Reported> = serde_json::from_str(out).map_err(|e| Error::Decode {
        provider: "exec",
        action: "list",
        message: e.to_string(),
    })?;
    reported
        .into_iter()
        .map(|r| machine(r, "list", None))
        .collect()
}

/// Removes anything shaped like a bootstrap token from command output before it is logged.
fn scrub(s: &str) -> String {
    static TOKEN: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"[a-z0-9]{6}\.[a-z0-9]{16}")
            .unwrap_or_else(|e| panic!("built-in regex: {e}"))
    });
    TOKEN.replace_all(s, "***").into_owned()
}

impl Provider for Exec {
    #[instrument(skip(self), err)]
    async fn list(&self) -> Result<Vec<MachineView>> {
        let out = self
            .run(
                "list",
                &self.settings.list,
                json!({"action": "list", "cluster": self.cluster}),
            )
            .await?;
        decode_list(&out)
    }

    #[instrument(skip(self, spec), fields(group = %spec.group, hostname = %spec.hostname), err)]
    async fn create(&self, spec: &CreateSpec) -> Result<MachineView> {
        let mut tags = spec.tags.clone();
        tags.insert(CLUSTER_TAG.into(), self.cluster.clone());
        let input = json!({
            "action": "create",
            "cluster": self.cluster,
            "group": spec.group,
            "hostname": spec.hostname,
            "plan": spec.plan,
            "region": spec.region,
            "image": spec.image,
            "ssh_keys": spec.ssh_keys,
            "tags": tags,
            "user_data": base64::engine::general_purpose::STANDARD.encode(spec.user_data.expose()),
        });
        let out = self.run("create", &self.settings.create, input).await?;
        let r: Reported = serde_json::from_str(&out).map_err(|e| Error::Decode {
            provider: "exec",
            action: "create",
            message: e.to_string(),
        })?;
        machine(r, "create", Some(spec))
    }

    #[instrument(skip(self), err)]
    async fn delete(&self, id: &str) -> Result<()> {
        self.run(
            "delete",
            &self.settings.delete,
            json!({"action": "delete", "cluster": self.cluster, "id": id}),
        )
        .await
        .map(|_| ())
    }

    async fn plan_capacity(&self, _plan: &str) -> Result<Option<Resources>> {
        // Commands describe machines, not plans: groups give their capacity in the config.
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_removes_tokens() {
        assert_eq!(
            scrub("bad token abcdef.0123456789abcdef here"),
            "bad token *** here"
        );
    }
}
