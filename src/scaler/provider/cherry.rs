//! The Cherry Servers REST API v1: servers are listed, created and deleted in one project, and
//! group membership is the server's tags (`k8s-cluster`, `k8s-nodepool`), as in the Cherry
//! Servers cluster-autoscaler provider.
//!
//! The API token is a [`Secret`] read from a file or `CHERRY_AUTH_TOKEN`; it only ever leaves
//! its box as the `Authorization` header. Requests are logged with method, path, status and
//! time — never bodies, which carry user data with a bootstrap token.

use std::collections::BTreeMap;
use std::time::Instant;

use base64::Engine;
use serde::Deserialize;
use serde_json::json;
use tracing::{debug, instrument};

use super::{CLUSTER_TAG, CreateSpec, Error, POOL_TAG, Provider, Result, truncate};
use crate::config::CherrySettings;
use crate::resources::Resources;
use crate::scaler::model::MachineView;
use crate::secret::Secret;

/// Environment variable the token is read from without `token_file`; the name the Cherry
/// Servers cluster-autoscaler uses.
pub const TOKEN_ENV: &str = "CHERRY_AUTH_TOKEN";

const NAME: &str = "cherry";

/// Server states that mean the machine is on its way out and no longer a member.
const GONE_STATES: &[&str] = &["terminating", "deleting", "deleted"];

/// Servers asked for per list page. The API may answer with fewer (its own maximum), so the
/// next page starts where the servers received end, not at a multiple of this.
const PAGE_LIMIT: usize = 100;

/// Pages read in one listing at most: 1,000 pages of 100 is far beyond any project the scaler
/// serves, and an API that ignored `offset` must not keep a pass listing forever.
const MAX_PAGES: usize = 1000;

/// At most this many servers of a page are read again at the start of the next one (a quarter
/// of the page when pages are small). A server deleted while the pages are read shifts those
/// after it back by one; without the overlap one of them would fall between two pages, be
/// missing for a pass, and its group would look a machine short — a duplicate create. Ids are
/// deduplicated, so reading a few twice costs nothing.
const PAGE_OVERLAP: usize = 10;

/// The header with the number of servers in all pages.
const TOTAL_HEADER: &str = "x-total-count";

/// A Cherry Servers client for one project and cluster.
pub struct Cherry {
    http: reqwest::Client,
    base: String,
    project: u64,
    cluster: String,
    token: Secret<String>,
}

impl std::fmt::Debug for Cherry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cherry")
            .field("base", &self.base)
            .field("project", &self.project)
            .field("cluster", &self.cluster)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Deserialize)]
struct Server {
    id: serde_json::Value,
    #[serde(default)]
    hostname: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    tags: BTreeMap<String, String>,
    #[serde(default)]
    created_at: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Plan {
    #[serde(default)]
    slug: String,
    #[serde(default)]
    specs: Specs,
}

#[derive(Debug, Default, Deserialize)]
struct Specs {
    #[serde(default)]
    cpus: Cpus,
    #[serde(default)]
    memory: Memory,
}

#[derive(Debug, Default, Deserialize)]
struct Cpus {
    #[serde(default)]
    count: i64,
    #[serde(default)]
    cores: i64,
}

#[derive(Debug, Default, Deserialize)]
struct Memory {
    #[serde(default)]
    total: i64,
    #[serde(default)]
    unit: String,
}

/// The CA certificates in PEM file `path` (`scaler.cherry.ca_file`): at least one.
fn trusted(path: &std::path::Path) -> std::result::Result<Vec<reqwest::Certificate>, String> {
    let refused = |why: String| {
        format!(
            "scaler.cherry.ca_file {}: {why}; expected a PEM file of CA certificates",
            path.display()
        )
    };
    let pem = std::fs::read(path).map_err(|e| refused(e.to_string()))?;
    match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        Ok(_) => Err(refused("no certificate in it".into())),
        Err(e) => Err(refused(e.to_string())),
    }
}

impl Cherry {
    /// A client from `[scaler.cherry]`; the token comes from `token_file` or [`TOKEN_ENV`]
    /// (passed in, so tests need not touch the environment).
    pub fn new(s: &CherrySettings, cluster: &str, env_token: Option<String>) -> Result<Self> {
        let config = |message: String| Error::Config {
            provider: NAME,
            message,
        };
        crate::validate::api_url(&s.api_url).map_err(|form| {
            config(format!(
                "scaler.cherry.api_url {:?} is refused: expected {form}",
                s.api_url
            ))
        })?;
        let project = s.project_id.ok_or_else(|| {
            config("scaler.cherry.project_id is not set: give the Cherry Servers project id".into())
        })?;
        let token = match &s.token_file {
            Some(path) => {
                use std::os::unix::fs::PermissionsExt;
                if let Ok(meta) = std::fs::metadata(path)
                    && meta.permissions().mode() & 0o077 != 0
                {
                    tracing::warn!(
                        path = %path.display(),
                        mode = format!("{:o}", meta.permissions().mode() & 0o777),
                        "the Cherry Servers token file is readable by other users; chmod 600 it"
                    );
                }
                std::fs::read_to_string(path)
                    .map_err(|e| config(format!("cannot read token file {}: {e}", path.display())))?
            }
            None => env_token.ok_or_else(|| {
                config(format!(
                    "no API token: set scaler.cherry.token_file or the {TOKEN_ENV} environment variable"
                ))
            })?,
        };
        let token = token.trim().to_string();
        if token.is_empty() {
            return Err(config("the API token is empty".into()));
        }
        let mut http = reqwest::Client::builder()
            .timeout(s.request_timeout)
            .user_agent(concat!("nodeward-scaler/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &s.ca_file {
            for cert in trusted(path).map_err(config)? {
                http = http.add_root_certificate(cert);
            }
        }
        let http = http
            .build()
            .map_err(|e| config(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: s.api_url.clone(),
            project,
            cluster: cluster.to_string(),
            token: Secret::new(token),
        })
    }

    async fn send(
        &self,
        action: &'static str,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<String> {
        self.request(action, method, path, body)
            .await
            .map(|(text, _)| text)
    }

    /// Sends a request; the answer's text and its `X-Total-Count`, if it has one.
    async fn request(
        &self,
        action: &'static str,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(String, Option<usize>)> {
        let url = format!("{}{}", self.base, path);
        let started = Instant::now();
        let mut req = self
            .http
            .request(method.clone(), &url)
            .bearer_auth(self.token.expose());
        if let Some(b) = &body {
            req = req.json(b);
        }
        let transport = |e: reqwest::Error| Error::Transport {
            provider: NAME,
            action,
            // reqwest's message names the URL, never headers or bodies.
            message: crate::render::error_chain(&e),
        };
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let total = resp
            .headers()
            .get(TOTAL_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let text = read_body(resp, action).await?;
        debug!(%method, path, status = status.as_u16(), elapsed_ms = started.elapsed().as_millis() as u64, "cherry request");
        if !status.is_success() {
            return Err(Error::Status {
                provider: NAME,
                action,
                status: status.as_u16(),
                message: truncate(&text),
            });
        }
        Ok((text, total))
    }
}

/// The most an answer may hold: a full page of servers is a few hundred kilobytes.
const MAX_BODY: usize = 8 << 20;

/// Reads an answer's body as text, refusing one larger than [`MAX_BODY`] as soon as it is.
async fn read_body(mut resp: reqwest::Response, action: &'static str) -> Result<String> {
    let mut body = Vec::new();
    loop {
        let chunk = resp.chunk().await.map_err(|e| Error::Transport {
            provider: NAME,
            action,
            message: crate::render::error_chain(&e),
        })?;
        let Some(chunk) = chunk else { break };
        if body.len() + chunk.len() > MAX_BODY {
            return Err(Error::Decode {
                provider: NAME,
                action,
                message: format!("the answer is larger than {} MiB", MAX_BODY >> 20),
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// A server as a machine of `cluster`'s node groups, or `None` for one of another cluster, of
/// no group, or on its way out.
fn machine(cluster: &str, s: Server, action: &'static str) -> Option<MachineView> {
    if s.tags.get(CLUSTER_TAG).map(String::as_str) != Some(cluster)
        || GONE_STATES.contains(&s.state.as_str())
    {
        return None;
    }
    let group = s.tags.get(POOL_TAG).cloned()?;
    let id = server_id(&s.id);
    // One unreadable creation time must not fail the whole listing (no scale decision at
    // all), nor drop the machine from it (a duplicate create). It counts as now: a machine
    // that never registers is then never deleted on a guessed age, only reported.
    let created = match s.created_at.as_deref().and_then(|c| c.parse().ok()) {
        Some(t) => t,
        None => {
            tracing::warn!(server = %id, action, created_at = ?s.created_at, "the server has no valid created_at: counting it as created now");
            jiff::Timestamp::now()
        }
    };
    Some(MachineView {
        id,
        hostname: s.hostname,
        group,
        created,
    })
}

/// One page of `GET /projects/{id}/servers`: each server's id, and the machine it is when it
/// belongs to `cluster`'s node groups. Whatever the text, an error and never a panic (fuzzed).
pub fn decode_page(cluster: &str, text: &str) -> Result<Vec<(String, Option<MachineView>)>> {
    let servers: Vec<Server> = decode("list", text)?;
    Ok(servers
        .into_iter()
        .map(|s| (server_id(&s.id), machine(cluster, s, "list")))
        .collect())
}

/// A server id as a string (the API gives numbers; strings are kept as they are).
fn server_id(id: &serde_json::Value) -> String {
    match id {
        serde_json::Value::String(v) => v.clone(),
        other => other.to_string(),
    }
}

/// Where the next list page starts after one that began at `offset` and brought `received`
/// servers, `new` of them not seen before, with `total` servers in all as the API counts them now;
/// `None` when the listing is complete. It is complete when this page reached that total, or when
/// a page is empty or only repeats servers already seen (an API that ignores paging sends
/// everything every time). Counting the ids seen instead would stop early after a delete: the
/// deleted server was seen but no longer counts in the total. The next page overlaps this one by
/// up to [`PAGE_OVERLAP`] servers.
fn next_offset(offset: usize, received: usize, new: usize, total: Option<usize>) -> Option<usize> {
    let end = offset + received;
    if new == 0 || total.is_some_and(|t| end >= t) {
        return None;
    }
    Some(end - (received / 4).min(PAGE_OVERLAP))
}

fn decode<T: serde::de::DeserializeOwned>(action: &'static str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::Decode {
        provider: NAME,
        action,
        message: e.to_string(),
    })
}

impl Provider for Cherry {
    #[instrument(skip(self), err)]
    async fn list(&self) -> Result<Vec<MachineView>> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut offset = 0;
        for _ in 0..MAX_PAGES {
            let (text, total) = self
                .request(
                    "list",
                    reqwest::Method::GET,
                    &format!(
                        "projects/{}/servers?limit={PAGE_LIMIT}&offset={offset}",
                        self.project
                    ),
                    None,
                )
                .await?;
            let page = decode_page(&self.cluster, &text)?;
            let received = page.len();
            let mut new = 0;
            for (id, m) in page {
                if !seen.insert(id) {
                    continue;
                }
                new += 1;
                out.extend(m);
            }
            match next_offset(offset, received, new, total) {
                Some(next) => offset = next,
                None => return Ok(out),
            }
        }
        Err(Error::Decode {
            provider: NAME,
            action: "list",
            message: format!("the server list did not end after {MAX_PAGES} pages"),
        })
    }

    #[instrument(skip(self, spec), fields(group = %spec.group, hostname = %spec.hostname), err)]
    async fn create(&self, spec: &CreateSpec) -> Result<MachineView> {
        let ssh_keys: Vec<serde_json::Value> = spec
            .ssh_keys
            .iter()
            .map(|k| k.parse::<i64>().map_or_else(|_| json!(k), |n| json!(n)))
            .collect();
        let mut body = json!({
            "plan": spec.plan,
            "image": spec.image,
            "region": spec.region,
            "hostname": spec.hostname,
            "ssh_keys": ssh_keys,
            "user_data": base64::engine::general_purpose::STANDARD.encode(spec.user_data.expose()),
            "tags": spec.tags,
        });
        // The optional fields only when the group sets them, with the API's types (the Cherry
        // Servers autoscaler's `CreateServer`: ints for the partition size and the spot flag).
        let extra = &spec.cherry;
        if let Some(size) = extra.os_partition_size {
            body["os_partition_size"] = json!(size);
        }
        if extra.spot_market {
            body["spot_market"] = json!(1);
        }
        if !extra.ip_addresses.is_empty() {
            body["ip_addresses"] = json!(extra.ip_addresses);
        }
        let text = self
            .send(
                "create",
                reqwest::Method::POST,
                &format!("projects/{}/servers", self.project),
                Some(body),
            )
            .await?;
        let server: Server = decode("create", &text)?;
        machine(&self.cluster, server, "create").ok_or_else(|| Error::Decode {
            provider: NAME,
            action: "create",
            message: "the created server lacks this cluster's tags".into(),
        })
    }

    #[instrument(skip(self), err)]
    async fn delete(&self, id: &str) -> Result<()> {
        match self
            .send(
                "delete",
                reqwest::Method::DELETE,
                &format!("servers/{id}"),
                None,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(Error::Status { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    #[instrument(skip(self), err)]
    async fn plan_capacity(&self, plan: &str) -> Result<Option<Resources>> {
        let text = self
            .send("plans", reqwest::Method::GET, "plans", None)
            .await?;
        let plans: Vec<Plan> = decode("plans", &text)?;
        Ok(plans.into_iter().find(|p| p.slug == plan).map(|p| {
            let cores = if p.specs.cpus.cores > 0 {
                p.specs.cpus.cores
            } else {
                p.specs.cpus.count
            };
            let unit: i64 = match p.specs.memory.unit.as_str() {
                "MB" => 1 << 20,
                "TB" => 1 << 40,
                _ => 1 << 30,
            };
            Resources {
                cpu_milli: cores * 1000,
                memory: p.specs.memory.total * unit,
                ..Resources::default()
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::next_offset;

    #[test]
    fn a_listing_pages_on_with_overlap_until_the_total_or_nothing_new() {
        // A full page of 100 of 250: the next starts 10 back.
        assert_eq!(next_offset(0, 100, 100, Some(250)), Some(90));
        // Small pages overlap by a quarter.
        assert_eq!(next_offset(0, 4, 4, Some(12)), Some(3));
        // The page reached the total: done.
        assert_eq!(next_offset(200, 50, 40, Some(250)), None);
        // Nothing new (an API that ignores paging), or an empty page: done.
        assert_eq!(next_offset(0, 100, 0, None), None);
        assert_eq!(next_offset(90, 0, 0, None), None);
        // No total header: on while pages bring new servers.
        assert_eq!(next_offset(0, 2, 2, None), Some(2));
    }
}
