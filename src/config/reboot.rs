//! `[reboot]`: coordinated reboots ([`crate::reboot`]). Off unless `enabled`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};

use crate::gate::Selector;
use crate::window::{self, Window};

/// Reboot slots are named this, then the slot's number.
pub const SLOT_PREFIX: &str = "nodeward-reboot-";

/// `[reboot]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RebootSettings {
    /// The agent coordinates this node's reboots at all.
    pub enabled: bool,
    /// A file whose existence asks for a reboot (unattended-upgrades writes it).
    pub sentinel: PathBuf,
    /// A command whose exit status 0 asks for a reboot, instead of the sentinel file.
    pub sentinel_command: Option<Vec<String>>,
    /// What `nodeward reboot` writes (and `--cancel` removes) to ask by hand.
    pub request_file: PathBuf,
    /// How often the conditions are checked again while a reboot is wanted.
    pub period: Duration,
    /// Nodes rebooting at once, cluster-wide: the number of slots.
    pub concurrency: u32,
    /// Where the slots (ConfigMaps) live.
    pub namespace: String,
    /// A slot whose holder stopped renewing frees itself after this long.
    pub lease_duration: Duration,
    /// When a reboot may start.
    pub window: Window,
    /// Pods on this node matching this selector hold the reboot.
    pub blocking_pods: Option<Selector>,
    /// Pods anywhere in the cluster matching this selector hold the reboot.
    pub blocking_pods_anywhere: Option<Selector>,
    /// A Prometheus-compatible API whose firing alerts hold the reboot.
    pub prometheus_url: Option<String>,
    /// Firing alerts whose name matches this are ignored.
    pub alerts_ignored: Option<AlertFilter>,
    /// Nodes that may be unavailable at once (NotReady, cordoned or rebooting), this one
    /// included; `None`: `concurrency`.
    pub max_unavailable: Option<Unavailable>,
    /// Which nodes the health gate counts (`None`: all).
    pub health_nodes: Option<Selector>,
    /// The reboot's drain deadline; a drain that does not finish by then does not reboot.
    pub drain_timeout: Duration,
    /// How long the node must stay back (gates passing, schedulable) before its slot goes to
    /// the next node.
    pub settle_time: Duration,
    /// The command that reboots; `None`: logind's `Reboot`.
    pub reboot_command: Option<Vec<String>>,
    /// How long the node may stay up once the reboot is asked for, the command (or logind's
    /// call) included: then `RebootFailed`, the reboot's cordon lifted and the slot released.
    pub reboot_timeout: Duration,
}

impl Default for RebootSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            // Where unattended-upgrades and update-notifier write it, as kured watches.
            sentinel: PathBuf::from("/var/run/reboot-required"),
            sentinel_command: None,
            request_file: PathBuf::from("/run/nodeward/reboot-requested"),
            // Conditions (window, alerts, the cluster's health) change in minutes.
            period: Duration::from_secs(60),
            concurrency: 1,
            namespace: "kube-system".into(),
            // Longer than a server's reboot (firmware included): a slot must not pass to the next
            // node while its holder is still coming back. A dead holder's frees itself after it.
            lease_duration: Duration::from_secs(600),
            window: Window::default(),
            blocking_pods: None,
            blocking_pods_anywhere: None,
            prometheus_url: None,
            alerts_ignored: None,
            max_unavailable: None,
            health_nodes: None,
            // No logind cap applies (the drain runs before the reboot is asked for), and a
            // budget's replacement may need a fresh node from the scaler.
            drain_timeout: Duration::from_secs(600),
            settle_time: Duration::from_secs(60),
            reboot_command: None,
            // A server's shutdown (every unit stopped, up to 90 s each) and firmware hand-off.
            reboot_timeout: Duration::from_secs(600),
        }
    }
}

impl RebootSettings {
    /// The most nodes that may be unavailable at once, this one included, of `total`.
    pub fn max_unavailable_of(&self, total: u32) -> u32 {
        match self.max_unavailable {
            None => self.concurrency,
            Some(Unavailable::Count(n)) => n,
            Some(Unavailable::Percent(p)) => {
                let n = u64::from(total) * u64::from(p) / 100;
                u32::try_from(n).unwrap_or(u32::MAX).max(1)
            }
        }
    }

    /// The slots' names.
    pub fn slot_names(&self) -> Vec<String> {
        (0..self.concurrency)
            .map(|i| format!("{SLOT_PREFIX}{i}"))
            .collect()
    }
}

/// Firing alerts to ignore, by name (a regular expression, matched anywhere in the name unless
/// anchored), as kured's `--alert-filter-regexp`.
#[derive(Debug, Clone)]
pub struct AlertFilter(pub regex::Regex);

impl PartialEq for AlertFilter {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl<'de> Deserialize<'de> for AlertFilter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        regex::Regex::new(&s).map(AlertFilter).map_err(|e| {
            de::Error::custom(format!(
                "invalid regular expression {s:?} ({e}): expected one such as \"^(Watchdog|InfoInhibitor)$\""
            ))
        })
    }
}

/// A count of nodes (`2`) or a share of them (`"10%"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// That many nodes.
    Count(u32),
    /// That percentage of all nodes (at least one).
    Percent(u8),
}

impl<'de> Deserialize<'de> for Unavailable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(i64),
            S(String),
        }
        const FORM: &str = "a number of nodes from 1 (such as 2) or a percentage from 1% to 100% (such as \"10%\")";
        match Raw::deserialize(d)? {
            Raw::N(n) => u32::try_from(n)
                .ok()
                .filter(|n| *n >= 1)
                .map(Unavailable::Count)
                .ok_or_else(|| de::Error::custom(format!("{n} is out of range: expected {FORM}"))),
            Raw::S(s) => s
                .strip_suffix('%')
                .and_then(|p| p.trim().parse::<u8>().ok())
                .filter(|p| (1..=100).contains(p))
                .map(Unavailable::Percent)
                .ok_or_else(|| de::Error::custom(format!("invalid value {s:?}: expected {FORM}"))),
        }
    }
}

/// Weekdays.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Days(pub(crate) Vec<jiff::civil::Weekday>);

impl<'de> Deserialize<'de> for Days {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|s| window::parse_day(s))
            .collect::<Result<_, _>>()
            .map(Days)
            .map_err(de::Error::custom)
    }
}

/// A time of day, `HH:MM`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TimeOfDay(pub(crate) jiff::civil::Time);

impl<'de> Deserialize<'de> for TimeOfDay {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        window::parse_time(&String::deserialize(d)?)
            .map(TimeOfDay)
            .map_err(de::Error::custom)
    }
}

/// An IANA time zone, looked up when the config is read.
#[derive(Debug, Clone)]
pub(crate) struct Zone(pub(crate) String, pub(crate) jiff::tz::TimeZone);

impl<'de> Deserialize<'de> for Zone {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        window::parse_zone(&s)
            .map(|z| Zone(s, z))
            .map_err(de::Error::custom)
    }
}

/// A label selector.
#[derive(Debug, Clone)]
pub(crate) struct SelectorText(pub(crate) Selector);

impl<'de> Deserialize<'de> for SelectorText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Selector::parse(&String::deserialize(d)?)
            .map(SelectorText)
            .map_err(de::Error::custom)
    }
}

/// An http or https URL.
#[derive(Debug, Clone)]
pub(crate) struct HttpUrl(pub(crate) String);

impl<'de> Deserialize<'de> for HttpUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match reqwest::Url::parse(&s) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
                Ok(HttpUrl(s.trim_end_matches('/').to_string()))
            }
            _ => Err(de::Error::custom(format!(
                "invalid URL {s:?}: expected an http or https URL such as \"http://prometheus.monitoring:9090\""
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_unavailable_defaults_to_concurrency_and_a_share_is_at_least_one_node() {
        let mut s = RebootSettings {
            concurrency: 2,
            ..RebootSettings::default()
        };
        assert_eq!(s.max_unavailable_of(50), 2);
        s.max_unavailable = Some(Unavailable::Percent(10));
        assert_eq!(s.max_unavailable_of(50), 5);
        assert_eq!(s.max_unavailable_of(3), 1);
        s.max_unavailable = Some(Unavailable::Count(3));
        assert_eq!(s.max_unavailable_of(50), 3);
        assert_eq!(s.slot_names(), ["nodeward-reboot-0", "nodeward-reboot-1"]);
    }
}
