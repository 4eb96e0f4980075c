//! The values a cloud-init template is rendered with: read from a TOML file, overridden by
//! `--set key=value`, the bootstrap token from a file or the environment, then validated into
//! typed [`Values`] before any template sees them. A value that would make a node fail to join
//! (a malformed token, an endpoint without a port, a label kubelet refuses) is caught here, on
//! the operator's screen, instead of in a machine's boot log.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;

use crate::names::NODE_GROUP_LABEL;
use crate::secret::Secret;
use crate::validate::{self, Taint};

/// Default hostname pattern, as in the Cherry Servers autoscaler the project grew from.
pub const DEFAULT_HOSTNAME_PATTERN: &str = "k8s-{{ cluster_name }}-{{ node_group }}-{{ rand8 }}";

/// Errors in values.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The values file could not be read.
    #[error("cannot read values file {}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The values file is not valid TOML or has a value of the wrong form.
    #[error(transparent)]
    File(#[from] crate::tomlfile::Error),
    /// A value (from the file, `--set` or the token source) is not of the expected form.
    #[error("{origin}: `{key}` {problem}: expected {expected}")]
    Invalid {
        /// Where the value came from (`values.toml`, `--set`, `--token-file /path`).
        origin: String,
        /// The key.
        key: String,
        /// What is wrong, including the value unless it is secret.
        problem: String,
        /// The expected form.
        expected: String,
    },
    /// A required value is missing.
    #[error("`{key}` is required: {hint}")]
    Missing {
        /// The key.
        key: &'static str,
        /// How to provide it.
        hint: &'static str,
    },
    /// A `--set` argument is malformed or names a key that cannot be set that way.
    #[error("--set {arg:?}: {reason}")]
    Set {
        /// The argument, with any value after `bootstrap_token=` removed.
        arg: String,
        /// Why it is refused.
        reason: String,
    },
}

/// `pub type Result` for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Parses a string into a checked value, naming the expected form on failure.
trait Checked: Sized {
    /// The expected form, for messages.
    const FORM: &'static str;
    /// Parses and validates.
    fn check(s: &str) -> Option<Self>;
}

/// A value that passed its [`Checked`] rule while being read from TOML.
#[derive(Debug, Clone)]
struct Parsed<T>(T);

impl<'de, T: Checked> Deserialize<'de> for Parsed<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        T::check(&s).map(Parsed).ok_or_else(|| {
            serde::de::Error::custom(format!("invalid value {s:?}: expected {}", T::FORM))
        })
    }
}

/// An RFC 1123 label: cluster and node group names end up in hostnames.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsLabel(pub String);

impl Checked for DnsLabel {
    const FORM: &'static str = validate::DNS_LABEL_FORM;
    fn check(s: &str) -> Option<Self> {
        validate::dns_label(s).ok().map(|()| Self(s.to_string()))
    }
}

/// The API server endpoint, accepted as `host:port` or `https://host[:port]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiEndpoint {
    /// `host:port`, the form `kubeadm join` expects.
    pub host_port: String,
    /// `https://host:port`.
    pub url: String,
}

static HOST: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*)$")
        .unwrap_or_else(|e| panic!("built-in regex: {e}"))
});

/// kube-apiserver's `--secure-port` default, used when an https URL names no port.
const HTTPS_PORT: u16 = 443;

impl Checked for ApiEndpoint {
    const FORM: &'static str =
        "host:port (e.g. 10.0.0.1:6443) or an https URL (e.g. https://api.example.com:6443)";
    fn check(s: &str) -> Option<Self> {
        let (rest, default_port) = match s.strip_prefix("https://") {
            Some(rest) => (rest.strip_suffix('/').unwrap_or(rest), Some(HTTPS_PORT)),
            None => (s, None),
        };
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(':') || h.starts_with('[') => (h, Some(p)),
            _ => (rest, None),
        };
        let port: u16 = match port {
            Some(p) => p.parse().ok().filter(|p| *p > 0)?,
            None => default_port?,
        };
        if !HOST.is_match(host) {
            return None;
        }
        Some(Self {
            host_port: format!("{host}:{port}"),
            url: format!("https://{host}:{port}"),
        })
    }
}

/// A kubeadm discovery CA hash: `sha256:` and 64 hex digits (lowercased).
#[derive(Debug, Clone, PartialEq)]
pub struct CaCertHash(pub String);

impl Checked for CaCertHash {
    const FORM: &'static str =
        "sha256:<64 hex digits> (`kubeadm token create --print-join-command` prints it)";
    fn check(s: &str) -> Option<Self> {
        let hex = s.strip_prefix("sha256:")?;
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| Self(format!("sha256:{}", hex.to_ascii_lowercase())))
    }
}

/// A Kubernetes release, `v1.31.2` or `1.31.2`.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeVersion {
    /// Minor version (31 in v1.31.2), for choosing kubeadm API versions and package repositories.
    pub minor: u32,
    /// Canonical form with the `v`.
    pub full: String,
}

impl Checked for KubeVersion {
    const FORM: &'static str = "a Kubernetes release such as v1.31.2";
    fn check(s: &str) -> Option<Self> {
        let digits = s.strip_prefix('v').unwrap_or(s);
        let mut parts = digits.split('.');
        let (major, minor, patch) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || major != "1" || patch.parse::<u32>().is_err() {
            return None;
        }
        Some(Self {
            minor: minor.parse().ok()?,
            full: format!("v{digits}"),
        })
    }
}

/// Where a node downloads the nodeward package.
#[derive(Debug, Clone, PartialEq)]
pub struct PackageUrl {
    /// URL of the .deb, if the URL offers one.
    pub deb: Option<String>,
    /// URL of the .rpm, if the URL offers one.
    pub rpm: Option<String>,
}

/// Placeholder in `package_url` replaced by `deb` or `rpm`.
const EXT_PLACEHOLDER: &str = "{ext}";

impl Checked for PackageUrl {
    const FORM: &'static str = "an https URL ending in .deb or .rpm, or containing {ext} where the node puts deb or rpm (e.g. https://dl.example.com/nodeward_0.1.0.{ext}), without whitespace, quotes, $, ` or \\ (percent-encode them)";
    fn check(s: &str) -> Option<Self> {
        let rest = s.strip_prefix("https://")?;
        // The URL reaches the node's bootstrap script, quoted: nothing in it may be shell syntax.
        if rest.is_empty()
            || s.chars().any(|c| {
                c.is_whitespace() || c.is_control() || matches!(c, '\'' | '"' | '$' | '`' | '\\')
            })
        {
            return None;
        }
        if s.contains(EXT_PLACEHOLDER) {
            Some(Self {
                deb: Some(s.replace(EXT_PLACEHOLDER, "deb")),
                rpm: Some(s.replace(EXT_PLACEHOLDER, "rpm")),
            })
        } else if s.ends_with(".deb") {
            Some(Self {
                deb: Some(s.to_string()),
                rpm: None,
            })
        } else if s.ends_with(".rpm") {
            Some(Self {
                deb: None,
                rpm: Some(s.to_string()),
            })
        } else {
            None
        }
    }
}

impl Checked for Taint {
    const FORM: &'static str = validate::TAINT_FORM;
    fn check(s: &str) -> Option<Self> {
        s.parse().ok()
    }
}

/// A kubeadm bootstrap token, `[a-z0-9]{6}.[a-z0-9]{16}`.
#[derive(Clone, PartialEq)]
pub struct BootstrapToken {
    /// The public id, also the name suffix of its Secret.
    pub id: String,
    /// The secret half.
    pub secret: Secret<String>,
}

impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BootstrapToken({}.***)", self.id)
    }
}

/// Expected form of a bootstrap token.
pub const TOKEN_FORM: &str = "[a-z0-9]{6}.[a-z0-9]{16}, as printed by `kubeadm token create`";

impl BootstrapToken {
    /// Parses a token; the error never contains it.
    pub fn parse(s: &str) -> Option<Self> {
        let (id, secret) = s.split_once('.')?;
        let ok = |p: &str, n: usize| {
            p.len() == n
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        };
        (ok(id, 6) && ok(secret, 16)).then(|| Self {
            id: id.to_string(),
            secret: Secret::new(secret.to_string()),
        })
    }

    /// The whole token, for writing into the rendered output only.
    pub fn expose(&self) -> String {
        format!("{}.{}", self.id, self.secret.expose())
    }
}

/// Label namespaces kubelet may set on its own Node (NodeRestriction admission refuses others
/// under kubernetes.io / k8s.io, and kubelet refuses to start with them in `--node-labels`).
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// Well-known kubernetes.io labels kubelet may set.
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// Checks a node label key against the apiserver's form and kubelet's restrictions.
fn node_label_key(key: &str) -> Result<(), String> {
    validate::label_key(key).map_err(str::to_string)?;
    if let Some((prefix, _)) = key.split_once('/') {
        let restricted = ["kubernetes.io", "k8s.io"]
            .iter()
            .any(|d| prefix == *d || prefix.ends_with(&format!(".{d}")));
        let allowed = KUBELET_LABELS.contains(&key)
            || KUBELET_LABEL_NAMESPACES
                .iter()
                .any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")));
        if restricted && !allowed {
            return Err(format!(
                "a label kubelet may set on itself: under kubernetes.io or k8s.io only the {} namespaces and the well-known labels ({}) are allowed; set roles such as node-role.kubernetes.io/* from the control plane instead",
                KUBELET_LABEL_NAMESPACES.join(", "),
                KUBELET_LABELS.join(", ")
            ));
        }
    }
    Ok(())
}

/// The values file, every key optional so `--set` can fill what it lacks.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawValues {
    cluster_name: Option<Parsed<DnsLabel>>,
    node_group: Option<Parsed<DnsLabel>>,
    api_server_endpoint: Option<Parsed<ApiEndpoint>>,
    /// Present only to refuse it with a clear message.
    bootstrap_token: Option<toml::Value>,
    ca_cert_hashes: Option<Vec<Parsed<CaCertHash>>>,
    hostname: Option<String>,
    hostname_pattern: Option<String>,
    node_labels: Option<BTreeMap<String, String>>,
    node_taints: Option<Vec<Parsed<Taint>>>,
    kubernetes_version: Option<Parsed<KubeVersion>>,
    package_url: Option<Parsed<PackageUrl>>,
    extra: Option<toml::Table>,
}

/// Validated values, ready for rendering.
#[derive(Debug, Clone)]
pub struct Values {
    /// Cluster name.
    pub cluster_name: DnsLabel,
    /// Node group.
    pub node_group: DnsLabel,
    /// API server.
    pub api_server_endpoint: ApiEndpoint,
    /// Bootstrap token.
    pub bootstrap_token: BootstrapToken,
    /// CA public key hashes the join verifies (at least one).
    pub ca_cert_hashes: Vec<CaCertHash>,
    /// The node's hostname (and Node name).
    pub hostname: String,
    /// Labels, always including [`NODE_GROUP_LABEL`].
    pub node_labels: BTreeMap<String, String>,
    /// Taints besides the startup taint.
    pub node_taints: Vec<Taint>,
    /// Kubernetes version.
    pub kubernetes_version: KubeVersion,
    /// nodeward package location.
    pub package_url: PackageUrl,
    /// Site-specific variables.
    pub extra: toml::Table,
}

/// Where the bootstrap token came from, for messages (never the token itself).
#[derive(Debug, Clone)]
pub struct TokenSource {
    /// `--token-file /path` or `NODEWARD_BOOTSTRAP_TOKEN`.
    pub origin: String,
    /// The raw text.
    pub token: Secret<String>,
}

/// Inputs to [`Values::build`], each optional.
#[derive(Debug, Default)]
pub struct Inputs<'a> {
    /// The values file path and text.
    pub file: Option<(&'a Path, &'a str)>,
    /// `--set key=value` arguments, in order.
    pub sets: &'a [String],
    /// The bootstrap token.
    pub token: Option<TokenSource>,
}

impl Values {
    /// Reads, overrides and validates. `rand8` fills `{{ rand8 }}` in the hostname pattern; the
    /// caller supplies it so this function stays deterministic.
    pub fn build(inputs: Inputs<'_>, rand8: &str) -> Result<Self> {
        let (raw, file_origin) = raw_values(inputs.file, inputs.sets)?;
        let bootstrap_token = bootstrap_token(inputs.token)?;
        let cluster_name = raw.cluster_name.ok_or(Error::Missing {
            key: "cluster_name",
            hint: "set it in the values file or with --set cluster_name=NAME",
        })?;
        let node_group = raw.node_group.ok_or(Error::Missing {
            key: "node_group",
            hint: "set it in the values file or with --set node_group=NAME",
        })?;
        let api = raw.api_server_endpoint.ok_or(Error::Missing {
            key: "api_server_endpoint",
            hint: "set it to host:port or an https URL of the API server",
        })?;
        let ca = raw.ca_cert_hashes.unwrap_or_default();
        if ca.is_empty() {
            return Err(Error::Missing {
                key: "ca_cert_hashes",
                hint: "give at least one sha256:<hex> hash so the join verifies the control plane (kubeadm token create --print-join-command prints it)",
            });
        }
        let kubernetes_version = raw.kubernetes_version.ok_or(Error::Missing {
            key: "kubernetes_version",
            hint: "set it to the cluster's release, e.g. v1.31.2",
        })?;
        let package_url = raw.package_url.ok_or(Error::Missing {
            key: "package_url",
            hint: "set it to the https URL of the nodeward .deb/.rpm (may contain {ext})",
        })?;
        let names = (cluster_name.0.0.as_str(), node_group.0.0.as_str());
        let hostname = hostname(
            raw.hostname,
            raw.hostname_pattern,
            names,
            rand8,
            &file_origin,
        )?;
        let node_labels = node_labels(raw.node_labels, &node_group.0.0, &file_origin)?;
        Ok(Self {
            cluster_name: cluster_name.0,
            node_group: node_group.0,
            api_server_endpoint: api.0,
            bootstrap_token,
            ca_cert_hashes: ca.into_iter().map(|c| c.0).collect(),
            hostname,
            node_labels,
            node_taints: raw
                .node_taints
                .unwrap_or_default()
                .into_iter()
                .map(|t| t.0)
                .collect(),
            kubernetes_version: kubernetes_version.0,
            package_url: package_url.0,
            extra: raw.extra.unwrap_or_default(),
        })
    }
}

/// The values file (parsed; it may not hold the token) with the `--set` overrides applied, and
/// the origin its errors name.
fn raw_values(file: Option<(&Path, &str)>, sets: &[String]) -> Result<(RawValues, String)> {
    let (mut raw, file_origin) = match file {
        Some((path, text)) => (
            crate::tomlfile::parse::<RawValues>(path, text)?,
            path.display().to_string(),
        ),
        None => (RawValues::default(), "values".to_string()),
    };
    if raw.bootstrap_token.is_some() {
        return Err(Error::Invalid {
            origin: file_origin,
            key: "bootstrap_token".into(),
            problem: "must not be in a values file (values files get shared and committed)".into(),
            expected: "the token in its own 0600 file passed with --token-file, or in NODEWARD_BOOTSTRAP_TOKEN".into(),
        });
    }
    for arg in sets {
        apply_set(&mut raw, arg)?;
    }
    Ok((raw, file_origin))
}

/// The token from its file or the environment, parsed; a malformed one is refused unshown.
fn bootstrap_token(source: Option<TokenSource>) -> Result<BootstrapToken> {
    let source = source.ok_or(Error::Missing {
        key: "bootstrap_token",
        hint: "pass --token-file FILE (mode 0600) or set NODEWARD_BOOTSTRAP_TOKEN",
    })?;
    BootstrapToken::parse(source.token.expose().trim()).ok_or_else(|| Error::Invalid {
        origin: source.origin.clone(),
        key: "bootstrap_token".into(),
        problem: "is malformed (value not shown)".into(),
        expected: TOKEN_FORM.into(),
    })
}

/// The node's name: `hostname`, or `hostname_pattern` (default [`DEFAULT_HOSTNAME_PATTERN`])
/// expanded for (cluster, group); never both; a valid node name either way.
fn hostname(
    hostname: Option<String>,
    pattern: Option<String>,
    (cluster, group): (&str, &str),
    rand8: &str,
    origin: &str,
) -> Result<String> {
    let hostname = match (hostname, pattern) {
        (Some(_), Some(_)) => {
            return Err(Error::Invalid {
                origin: origin.to_string(),
                key: "hostname".into(),
                problem: "and `hostname_pattern` are both set".into(),
                expected: "one of them".into(),
            });
        }
        (Some(h), None) => h,
        (None, pattern) => expand_hostname_pattern(
            pattern.as_deref().unwrap_or(DEFAULT_HOSTNAME_PATTERN),
            cluster,
            group,
            rand8,
        )?,
    };
    validate::dns_subdomain(&hostname).map_err(|form| Error::Invalid {
        origin: origin.to_string(),
        key: "hostname".into(),
        problem: format!("{hostname:?} is not a valid node name"),
        expected: form.into(),
    })?;
    Ok(hostname)
}

/// The node's labels, each key and value checked, plus the group label.
fn node_labels(
    labels: Option<BTreeMap<String, String>>,
    group: &str,
    origin: &str,
) -> Result<BTreeMap<String, String>> {
    let mut labels = labels.unwrap_or_default();
    for (k, v) in &labels {
        node_label_key(k).map_err(|expected| Error::Invalid {
            origin: origin.to_string(),
            key: format!("node_labels.{k}"),
            problem: "has an invalid key".into(),
            expected,
        })?;
        validate::label_value(v).map_err(|form| Error::Invalid {
            origin: origin.to_string(),
            key: format!("node_labels.{k}"),
            problem: format!("value {v:?} is invalid"),
            expected: form.into(),
        })?;
    }
    labels.insert(NODE_GROUP_LABEL.to_string(), group.to_string());
    Ok(labels)
}

/// Parses one `--set` value with its rule, naming the key on failure.
fn parse_set<T: Checked>(key: &str, value: &str) -> Result<Parsed<T>> {
    T::check(value).map(Parsed).ok_or_else(|| Error::Invalid {
        origin: "--set".into(),
        key: key.into(),
        problem: format!("value {value:?} is invalid"),
        expected: T::FORM.into(),
    })
}

/// Comma-separated list for `--set`.
fn parse_set_list<T: Checked>(key: &str, value: &str) -> Result<Vec<Parsed<T>>> {
    value
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| parse_set(key, s.trim()))
        .collect()
}

/// Applies one `--set key=value`.
fn apply_set(raw: &mut RawValues, arg: &str) -> Result<()> {
    let Some((key, value)) = arg.split_once('=') else {
        return Err(Error::Set {
            arg: arg.to_string(),
            reason: "expected key=value".into(),
        });
    };
    match key {
        "bootstrap_token" | "bootstrap_token_id" | "bootstrap_token_secret" => {
            return Err(Error::Set {
                arg: format!("{key}=***"),
                reason: "secrets on the command line end up in shell history and in /proc/*/cmdline, readable by every user; use --token-file FILE or NODEWARD_BOOTSTRAP_TOKEN".into(),
            });
        }
        "cluster_name" => raw.cluster_name = Some(parse_set(key, value)?),
        "node_group" => raw.node_group = Some(parse_set(key, value)?),
        "api_server_endpoint" => raw.api_server_endpoint = Some(parse_set(key, value)?),
        "ca_cert_hashes" => raw.ca_cert_hashes = Some(parse_set_list(key, value)?),
        "hostname" => raw.hostname = Some(value.to_string()),
        "hostname_pattern" => raw.hostname_pattern = Some(value.to_string()),
        "node_taints" => raw.node_taints = Some(parse_set_list(key, value)?),
        "kubernetes_version" => raw.kubernetes_version = Some(parse_set(key, value)?),
        "package_url" => raw.package_url = Some(parse_set(key, value)?),
        _ => {
            if let Some(label) = key.strip_prefix("node_labels.") {
                raw.node_labels
                    .get_or_insert_default()
                    .insert(label.to_string(), value.to_string());
            } else if let Some(name) = key.strip_prefix("extra.") {
                raw.extra
                    .get_or_insert_default()
                    .insert(name.to_string(), toml::Value::String(value.to_string()));
            } else {
                return Err(Error::Set {
                    arg: arg.to_string(),
                    reason: "unknown key: expected one of cluster_name, node_group, api_server_endpoint, ca_cert_hashes, hostname, hostname_pattern, node_labels.KEY, node_taints, kubernetes_version, package_url, extra.KEY".into(),
                });
            }
        }
    }
    Ok(())
}

/// Renders the hostname pattern, which may use `cluster_name`, `node_group` and `rand8`.
fn expand_hostname_pattern(
    pattern: &str,
    cluster_name: &str,
    node_group: &str,
    rand8: &str,
) -> Result<String> {
    let mut ctx = tera::Context::new();
    ctx.insert("cluster_name", cluster_name);
    ctx.insert("node_group", node_group);
    ctx.insert("rand8", rand8);
    tera::Tera::one_off(pattern, &ctx, false)
        .map(|s| s.trim().to_string())
        .map_err(|e| Error::Invalid {
            origin: "values".into(),
            key: "hostname_pattern".into(),
            problem: format!("{pattern:?} does not render ({})", super::error_chain(&e)),
            expected: "a tera template using {{ cluster_name }}, {{ node_group }} and {{ rand8 }}"
                .into(),
        })
}

/// Eight random characters from `[a-z0-9]` for hostname patterns.
pub fn rand8() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..8)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

#[cfg(test)]
mod tests;
