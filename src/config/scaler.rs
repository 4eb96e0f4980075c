//! `[scaler]`, `[scaler.cherry]`, `[scaler.exec]` and `[[scaler.groups]]`: the central scaler's
//! settings. Kept in its own file so the agent's sections and the scaler's grow apart.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};

use super::types::{ConfigDuration, Positive};
use crate::resources::{self, Resources};
use crate::validate::{self, Taint};

/// Which cloud the scaler creates machines in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Cherry Servers REST API v1.
    Cherry,
    /// Commands speaking JSON on stdin/stdout (any cloud CLI or on-prem tooling).
    Exec,
}

/// How the scaler chooses among groups that could all take the pending pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expander {
    /// The group whose new nodes would be left with the least idle CPU and memory.
    LeastWaste,
    /// The group with the highest `priority`; ties go to least waste.
    Priority,
    /// A group chosen at random, seeded from the decision's input so a decision is repeatable.
    Random,
}

/// `[scaler]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalerSettings {
    /// Cluster name: the `k8s-cluster` provider tag and `cluster_name` in templates.
    pub cluster_name: String,
    /// Kubeconfig; `None` means kube's inference (in-cluster service account when deployed).
    pub kubeconfig: Option<PathBuf>,
    /// Which provider.
    pub provider: ProviderKind,
    /// Time between reconcile passes when no pod calls for one sooner.
    pub scan_interval: Duration,
    /// A pass comes this long after the last pod of a burst of newly unschedulable pods...
    pub batch_idle: Duration,
    /// ...and at most this long after the burst's first.
    pub batch_max: Duration,
    /// Group choice for scale-up.
    pub expander: Expander,
    /// Whether unneeded nodes are removed at all.
    pub scale_down_enabled: bool,
    /// A node whose requested CPU and memory are both below this share of allocatable may go.
    pub scale_down_utilization_threshold: f64,
    /// How long a node must stay unneeded before it is drained and deleted.
    pub scale_down_unneeded_time: Duration,
    /// No scale-down anywhere for this long after the newest machine was created
    /// (cluster-autoscaler's `--scale-down-delay-after-add`); zero turns it off.
    pub scale_down_delay_after_add: Duration,
    /// Machines created in one pass at most, over all groups; the rest wait for the next pass
    /// (the nodemanager's `MaxBootPerIteration`). `None`: no cap.
    pub max_boots_per_pass: Option<u32>,
    /// Nodes with any of these labels are control-plane hosts the scaler never removes nor
    /// repairs, whatever group label they carry (the Cherry Servers autoscaler's controller
    /// node label).
    pub controller_node_labels: Vec<String>,
    /// Empty nodes removed in one pass at most.
    pub max_empty_bulk_delete: u32,
    /// A machine whose Node has not registered and become ready by then is deleted.
    pub max_provision_time: Duration,
    /// A node NotReady for this long is replaced.
    pub unready_delete_time: Duration,
    /// The cluster-health guard (cluster-autoscaler's `--max-total-unready-percentage`): with
    /// more than [`Self::ok_unready_count`] nodes NotReady *and* more than this percentage of
    /// all nodes, the scaler takes it for a partition or an API server blip, not for broken
    /// machines: it replaces no NotReady node, deletes no Node and scales nothing down.
    pub max_unready_percent: u8,
    /// NotReady nodes the guard always tolerates (`--ok-total-unready-count`).
    pub ok_unready_count: u32,
    /// The guard per node group (Karpenter's node repair stops above 20% unhealthy in a pool):
    /// with more than one of a group's nodes NotReady *and* more than this percentage of them,
    /// none of that group's NotReady nodes is replaced.
    pub max_unready_group_percent: u8,
    /// NotReady nodes replaced (or Nodes without a machine deleted) per pass at most, whatever
    /// the guard says: a wave of failures is worked off slowly.
    pub max_unready_repairs_per_pass: u32,
    /// First back-off of a group after a failed machine; doubles per failure.
    pub backoff_initial: Duration,
    /// Longest back-off.
    pub backoff_max: Duration,
    /// Values file (the `nodeward render --values` format) every group's template is rendered
    /// with: api_server_endpoint, ca_cert_hashes, kubernetes_version, package_url, extra.
    pub values: PathBuf,
    /// Lifetime of each bootstrap token minted for a scale-up.
    pub token_ttl: Duration,
    /// `auth-extra-groups` of minted tokens.
    pub token_extra_groups: Vec<String>,
    /// Where `/metrics` is served; `None` turns the endpoint off.
    pub metrics_address: Option<SocketAddr>,
    /// Namespace of the leader-election Lease and the status ConfigMap.
    pub namespace: String,
    /// Name of the leader-election Lease.
    pub lease_name: String,
    /// How long a leader's Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// `[scaler.cherry]`.
    pub cherry: CherrySettings,
    /// `[scaler.exec]`.
    pub exec: ExecSettings,
    /// `[[scaler.groups]]`.
    pub groups: Vec<GroupSettings>,
}

/// `[scaler.cherry]`.
#[derive(Debug, Clone, PartialEq)]
pub struct CherrySettings {
    /// API base URL, ending in `/`.
    pub api_url: String,
    /// The project the servers live in.
    pub project_id: Option<u64>,
    /// File holding the API token; else `CHERRY_AUTH_TOKEN` is read.
    pub token_file: Option<PathBuf>,
    /// PEM file of CA certificates trusted for the API, on top of the usual roots (an endpoint
    /// behind a private CA).
    pub ca_file: Option<PathBuf>,
    /// Per-request timeout.
    pub request_timeout: Duration,
}

/// `[scaler.exec]`: argv of each command (no shell).
#[derive(Debug, Clone, PartialEq)]
pub struct ExecSettings {
    /// Creates one machine.
    pub create: Vec<String>,
    /// Deletes one machine.
    pub delete: Vec<String>,
    /// Lists the cluster's machines.
    pub list: Vec<String>,
    /// A command still running after this is killed and counts as failed.
    pub timeout: Duration,
}

/// One node group.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSettings {
    /// Name: the `k8s-nodepool` tag and the `nodeward.io/node-group` label value.
    pub name: String,
    /// Fewest nodes.
    pub min: u32,
    /// Most nodes, counting machines still being created.
    pub max: u32,
    /// Empty ready nodes kept waiting for work.
    pub standby: u32,
    /// For the `priority` expander; higher wins.
    pub priority: i32,
    /// Provider plan (machine type).
    pub plan: String,
    /// Provider region.
    pub region: String,
    /// OS image.
    pub image: String,
    /// SSH key ids installed on new machines.
    pub ssh_keys: Vec<String>,
    /// Labels new nodes register with (the group label is always added).
    pub labels: BTreeMap<String, String>,
    /// Taints new nodes register with, besides the startup taint.
    pub taints: Vec<Taint>,
    /// The cloud-init tera template.
    pub template: PathBuf,
    /// Hostname pattern (tera, with cluster_name, node_group, rand8); the Node name.
    pub hostname_pattern: Option<String>,
    /// What one new node offers, used while the group has no node to copy it from.
    pub capacity: Capacity,
    /// Cherry Servers create fields; other providers ignore them.
    pub cherry: CherryGroupSettings,
}

/// The Cherry Servers create fields a group may set (the Cherry Servers cluster-autoscaler's
/// `CreateServer`); each is sent only when set, so the API's own defaults apply otherwise.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CherryGroupSettings {
    /// `os_partition_size`: the OS partition in GB (the autoscaler's `os-partition-size`).
    pub os_partition_size: Option<u32>,
    /// `spot_market`: create spot instances (sent as `1`, the API's integer flag).
    pub spot_market: bool,
    /// `ip_addresses`: ids of existing IP addresses to attach to each new server.
    pub ip_addresses: Vec<String>,
}

/// One `[[scaler.groups]]` entry as written: what it leaves out comes from
/// `[scaler.group_defaults]`, then from the built-in defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GroupEntry {
    #[serde(deserialize_with = "dns_label")]
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) min: u32,
    pub(crate) max: u32,
    #[serde(default)]
    pub(crate) standby: u32,
    #[serde(default)]
    pub(crate) priority: i32,
    #[serde(default)]
    pub(crate) plan: Option<String>,
    #[serde(default)]
    pub(crate) region: Option<String>,
    #[serde(default)]
    pub(crate) image: Option<String>,
    #[serde(default)]
    pub(crate) ssh_keys: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) labels: Option<Labels>,
    #[serde(default)]
    pub(crate) taints: Option<Taints>,
    #[serde(default)]
    pub(crate) template: Option<PathBuf>,
    #[serde(default)]
    pub(crate) hostname_pattern: Option<String>,
    #[serde(default)]
    pub(crate) capacity: Option<Capacity>,
    #[serde(default)]
    pub(crate) os_partition_size: Option<Positive>,
    #[serde(default)]
    pub(crate) spot_market: Option<bool>,
    #[serde(default)]
    pub(crate) ip_addresses: Option<IpAddressIds>,
}

/// Where the worker template is installed by the package.
pub const DEFAULT_TEMPLATE: &str = "/etc/nodeward/worker.yaml.tera";

pub(crate) fn default_template() -> PathBuf {
    PathBuf::from(DEFAULT_TEMPLATE)
}

/// A group's capacity template, as quantities.
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    /// Parsed; `cpu`/`memory` left at 0 are filled from the provider's plan when it has one.
    pub resources: Resources,
}

/// kubelet's default `maxPods`.
const DEFAULT_MAX_PODS: i64 = 110;

impl Default for Capacity {
    fn default() -> Self {
        Self {
            resources: Resources {
                pods: DEFAULT_MAX_PODS,
                ..Resources::default()
            },
        }
    }
}

impl<'de> Deserialize<'de> for Capacity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = BTreeMap::<String, String>::deserialize(d)?;
        for (k, v) in &raw {
            if resources::parse_milli(v).is_none() {
                return Err(de::Error::custom(format!(
                    "capacity `{k}`: invalid quantity {v:?}: expected {}",
                    resources::QUANTITY_FORM
                )));
            }
        }
        let mut resources =
            Resources::from_quantities(raw.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if !raw.contains_key("pods") {
            resources.pods = DEFAULT_MAX_PODS;
        }
        Ok(Self { resources })
    }
}

fn dns_label<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    validate::dns_label(&s)
        .map(|()| s.clone())
        .map_err(|form| de::Error::custom(format!("invalid name {s:?}: expected {form}")))
}

/// Node labels, keys and values checked.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Labels(pub(crate) BTreeMap<String, String>);

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = BTreeMap::<String, String>::deserialize(d)?;
        for (k, v) in &m {
            validate::label_key(k)
                .map_err(|form| de::Error::custom(format!("label key {k:?}: expected {form}")))?;
            validate::label_value(v).map_err(|form| {
                de::Error::custom(format!("label {k} value {v:?}: expected {form}"))
            })?;
        }
        Ok(Labels(m))
    }
}

/// Node taints in `key[=value]:Effect` form.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Taints(pub(crate) Vec<Taint>);

impl<'de> Deserialize<'de> for Taints {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<String>::deserialize(d)?
            .into_iter()
            .map(|s| {
                s.parse::<Taint>()
                    .map_err(|form| de::Error::custom(format!("taint {s:?}: expected {form}")))
            })
            .collect::<Result<_, _>>()
            .map(Taints)
    }
}

/// Label keys (which labels mark a node the scaler must leave alone).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LabelKeys(pub(crate) Vec<String>);

impl<'de> Deserialize<'de> for LabelKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let keys = Vec::<String>::deserialize(d)?;
        for k in &keys {
            validate::label_key(k)
                .map_err(|form| de::Error::custom(format!("label key {k:?}: expected {form}")))?;
        }
        Ok(LabelKeys(keys))
    }
}

/// Cherry Servers IP address ids: non-empty, no whitespace (they go into a JSON body as-is).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct IpAddressIds(pub(crate) Vec<String>);

impl<'de> Deserialize<'de> for IpAddressIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ids = Vec::<String>::deserialize(d)?;
        if let Some(bad) = ids
            .iter()
            .find(|i| i.is_empty() || i.contains(char::is_whitespace))
        {
            return Err(de::Error::custom(format!(
                "invalid IP address id {bad:?}: expected the id of a Cherry Servers IP address, such as \"5a4ef4a1-6f2c-4b8c-9a3e-2f1d0c9b8a7e\""
            )));
        }
        Ok(IpAddressIds(ids))
    }
}

/// The group list, validated as a whole.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Groups(pub(crate) Vec<GroupEntry>);

impl<'de> Deserialize<'de> for Groups {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let groups = Vec::<GroupEntry>::deserialize(d)?;
        let mut seen = BTreeSet::new();
        for g in &groups {
            if !seen.insert(g.name.as_str()) {
                return Err(de::Error::custom(format!(
                    "group {:?} is defined twice: names must be unique",
                    g.name
                )));
            }
            if g.min > g.max {
                return Err(de::Error::custom(format!(
                    "group {:?}: min {} is above max {}: expected min <= max",
                    g.name, g.min, g.max
                )));
            }
            if g.standby > g.max {
                return Err(de::Error::custom(format!(
                    "group {:?}: standby {} is above max {}: expected standby <= max",
                    g.name, g.standby, g.max
                )));
            }
        }
        Ok(Groups(groups))
    }
}

/// A Lease duration: `leaseDurationSeconds` is whole seconds, so a whole number of seconds from
/// 1 s (0 s would make every replica leader at once, and panicked the renewal timer; "1500ms"
/// was silently written as 1 s while the holder counted 1.5 s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LeaseDuration(pub(crate) Duration);

impl<'de> Deserialize<'de> for LeaseDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ConfigDuration(t) = ConfigDuration::deserialize(d)?;
        let whole = t.subsec_nanos() == 0;
        if t.as_secs() >= 1 && whole && i32::try_from(t.as_secs()).is_ok() {
            Ok(LeaseDuration(t))
        } else {
            Err(de::Error::custom(format!(
                "lease duration {} is out of range: expected a whole number of seconds from 1s (a Lease holds whole seconds), such as \"15s\"",
                humantime::format_duration(t)
            )))
        }
    }
}

/// A percentage in [0, 100].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Percent(pub(crate) u8);

impl<'de> Deserialize<'de> for Percent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        u8::try_from(v)
            .ok()
            .filter(|v| *v <= 100)
            .map(Percent)
            .ok_or_else(|| {
                de::Error::custom(format!(
                    "{v} is out of range: expected a whole number from 0 to 100"
                ))
            })
    }
}

/// A share in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Share(pub(crate) f64);

impl<'de> Deserialize<'de> for Share {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if (0.0..=1.0).contains(&v) {
            Ok(Share(v))
        } else {
            Err(de::Error::custom(format!(
                "{v} is out of range: expected a number from 0 to 1"
            )))
        }
    }
}

/// kube-apiserver refuses nothing longer, but a bootstrap token is a join credential: the issue
/// caps its lifetime at an hour so a leaked user-data blob is useless soon after.
pub(crate) const MAX_TOKEN_TTL: Duration = Duration::from_secs(3600);

/// A token lifetime, at most an hour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TokenTtl(pub(crate) Duration);

impl<'de> Deserialize<'de> for TokenTtl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ConfigDuration(t) = ConfigDuration::deserialize(d)?;
        if t.is_zero() || t > MAX_TOKEN_TTL {
            return Err(de::Error::custom(format!(
                "token lifetime {} is out of range: expected more than 0s and at most 1h",
                humantime::format_duration(t)
            )));
        }
        Ok(TokenTtl(t))
    }
}

/// `host:port` to listen on, or `""` for off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ListenAddr(pub(crate) Option<SocketAddr>);

impl<'de> Deserialize<'de> for ListenAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() {
            return Ok(ListenAddr(None));
        }
        s.parse().map(|a| ListenAddr(Some(a))).map_err(|_| {
            de::Error::custom(format!(
                "invalid address {s:?}: expected ip:port such as \"127.0.0.1:8085\", or \"\" for off"
            ))
        })
    }
}

/// A non-empty argv.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Argv(pub(crate) Vec<String>);

impl<'de> Deserialize<'de> for Argv {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<String>::deserialize(d)?;
        if v.first().is_none_or(String::is_empty) {
            return Err(de::Error::custom(
                "expected a command as an array: [\"/usr/local/bin/my-cloud\", \"create\"]",
            ));
        }
        Ok(Argv(v))
    }
}

/// A DNS label value (cluster name).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Label(pub(crate) String);

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        dns_label(d).map(Label)
    }
}

/// A provider API's base URL ([`crate::validate::api_url`]), with the trailing slash joins rely on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BaseUrl(pub(crate) String);

impl<'de> Deserialize<'de> for BaseUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        crate::validate::api_url(&s)
            .map_err(|form| de::Error::custom(format!("invalid URL {s:?}: expected {form}")))?;
        Ok(BaseUrl(if s.ends_with('/') { s } else { format!("{s}/") }))
    }
}

impl Default for ScalerSettings {
    fn default() -> Self {
        Self {
            cluster_name: "kubernetes".into(),
            kubeconfig: None,
            provider: ProviderKind::Cherry,
            // cluster-autoscaler's default scan interval: fast enough that a pending pod waits
            // seconds, slow enough that listing 30,000 pods stays a small load on the apiserver.
            scan_interval: Duration::from_secs(10),
            // Karpenter's batcher: a pass for a burst of pending pods once none came for 1 s,
            // and at most 10 s after the first, so a Deployment's replicas meet one plan.
            batch_idle: Duration::from_secs(1),
            batch_max: Duration::from_secs(10),
            expander: Expander::LeastWaste,
            scale_down_enabled: true,
            // cluster-autoscaler's default --scale-down-utilization-threshold.
            scale_down_utilization_threshold: 0.5,
            // cluster-autoscaler's default --scale-down-unneeded-time: long enough that a
            // lull between batch jobs does not cost a machine's boot time.
            scale_down_unneeded_time: Duration::from_secs(600),
            // Off: cluster-autoscaler's default is 10m, but nodeward's scale_down_unneeded_time
            // already keeps a node for 10 minutes after it became unneeded, new or not, and
            // turning it on by default would change when existing setups scale down.
            scale_down_delay_after_add: Duration::ZERO,
            // No cap: a burst of pending pods gets all its machines in one pass, as before the
            // setting existed; the nodemanager's figure is 10.
            max_boots_per_pass: None,
            controller_node_labels: crate::names::PROTECTED_ROLE_LABELS
                .iter()
                .map(|l| (*l).to_string())
                .collect(),
            // cluster-autoscaler's default --max-empty-bulk-delete.
            max_empty_bulk_delete: 10,
            // The flight-controller document's figure: a machine that has not registered in
            // 10 minutes will not.
            max_provision_time: Duration::from_secs(600),
            // cluster-autoscaler's default --scale-down-unready-time.
            unready_delete_time: Duration::from_secs(1200),
            // cluster-autoscaler's defaults.
            max_unready_percent: 45,
            ok_unready_count: 3,
            // Karpenter's node repair threshold per NodePool.
            max_unready_group_percent: 20,
            max_unready_repairs_per_pass: 3,
            // cluster-autoscaler's initial node-group back-off.
            backoff_initial: Duration::from_secs(300),
            // cluster-autoscaler's maximum node-group back-off.
            backoff_max: Duration::from_secs(1800),
            values: PathBuf::from("/etc/nodeward/scaler-values.toml"),
            // The cap: long enough for a slow bare-metal boot, short enough to limit a leak.
            // max_provision_time's default: a token outlives no boot (see the fragment's resolve).
            token_ttl: Duration::from_secs(600),
            token_extra_groups: vec!["system:bootstrappers:kubeadm:default-node-token".into()],
            // cluster-autoscaler's metrics port.
            metrics_address: Some(SocketAddr::from(([127, 0, 0, 1], 8085))),
            namespace: "kube-system".into(),
            lease_name: "nodeward-scaler".into(),
            // client-go leader election's default lease duration.
            lease_duration: Duration::from_secs(15),
            cherry: CherrySettings {
                api_url: "https://api.cherryservers.com/v1/".into(),
                project_id: None,
                token_file: None,
                ca_file: None,
                // A create answers within seconds; a minute covers a slow API without hanging
                // a pass forever.
                request_timeout: Duration::from_secs(60),
            },
            exec: ExecSettings {
                create: Vec::new(),
                delete: Vec::new(),
                list: Vec::new(),
                // Cloud CLIs that wait for a machine to be accepted take tens of seconds.
                timeout: Duration::from_secs(300),
            },
            groups: Vec::new(),
        }
    }
}
