//! Validators for the names and forms Kubernetes and kubeadm accept, shared by the config loader
//! and the renderer so one definition decides what "valid" means everywhere.
//!
//! Each validator returns `Err(expected)` with a sentence describing the expected form; callers
//! add the file, line or key. The rules are the apiserver's (RFC 1123 names, qualified label keys,
//! label values, taint effects), so a value that passes here is not refused later by kubelet or
//! kubeadm on a machine that is already booting.

use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

use regex::Regex;

/// Builds a regex from a literal pattern; an invalid literal is a programming error caught by
/// every test run, so it is reported by panic (never triggered by input).
fn re(pattern: &str) -> Regex {
    match Regex::new(pattern) {
        Ok(r) => r,
        Err(e) => panic!("invalid built-in regex {pattern}: {e}"),
    }
}

static DNS_LABEL: LazyLock<Regex> = LazyLock::new(|| re(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"));
static LABEL_NAME: LazyLock<Regex> =
    LazyLock::new(|| re(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"));

/// RFC 1123 label: what a hostname part, node group or cluster name may be.
pub const DNS_LABEL_FORM: &str = "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters";

/// RFC 1123 subdomain: what a Node name may be.
pub const DNS_SUBDOMAIN_FORM: &str =
    "dot-separated RFC 1123 labels (lowercase letters, digits and '-'), at most 253 characters";

/// Checks an RFC 1123 label (at most 63 characters: the DNS limit kubelet also applies).
pub fn dns_label(s: &str) -> Result<(), &'static str> {
    if s.len() <= 63 && DNS_LABEL.is_match(s) {
        Ok(())
    } else {
        Err(DNS_LABEL_FORM)
    }
}

/// Checks an RFC 1123 subdomain (at most 253 characters, the apiserver's limit for names).
pub fn dns_subdomain(s: &str) -> Result<(), &'static str> {
    if !s.is_empty() && s.len() <= 253 && s.split('.').all(|l| dns_label(l).is_ok()) {
        Ok(())
    } else {
        Err(DNS_SUBDOMAIN_FORM)
    }
}

/// Expected form of a label or annotation key.
pub const LABEL_KEY_FORM: &str = "an optional DNS subdomain prefix and '/', then a name of at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit";

/// Checks a qualified label key (`prefix/name` or `name`), as the apiserver does.
pub fn label_key(s: &str) -> Result<(), &'static str> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let prefix_ok = prefix.is_none_or(|p| dns_subdomain(p).is_ok());
    if prefix_ok && name.len() <= 63 && LABEL_NAME.is_match(name) {
        Ok(())
    } else {
        Err(LABEL_KEY_FORM)
    }
}

/// Expected form of a label value.
pub const LABEL_VALUE_FORM: &str = "empty, or at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit";

/// Checks a label value.
pub fn label_value(s: &str) -> Result<(), &'static str> {
    if s.is_empty() || (s.len() <= 63 && LABEL_NAME.is_match(s)) {
        Ok(())
    } else {
        Err(LABEL_VALUE_FORM)
    }
}

/// The effect of a taint, as in `core/v1 Taint.effect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum TaintEffect {
    /// New pods that do not tolerate the taint are not scheduled.
    NoSchedule,
    /// The scheduler tries to avoid the node.
    PreferNoSchedule,
    /// Running pods that do not tolerate the taint are evicted.
    NoExecute,
}

impl TaintEffect {
    /// The API's word for it (`NoSchedule`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }

    /// Reads the API's word; `None` for any other (the apiserver accepts these three only).
    pub fn parse(s: &str) -> Option<Self> {
        [Self::NoSchedule, Self::PreferNoSchedule, Self::NoExecute]
            .into_iter()
            .find(|e| e.as_str() == s)
    }
}

impl fmt::Display for TaintEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node taint written as `key[=value]:Effect`, the form kubelet's `--register-with-taints` and
/// `kubectl taint` use.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Taint {
    /// The taint key (a qualified label key).
    pub key: String,
    /// The optional value (a label value).
    pub value: Option<String>,
    /// The effect.
    pub effect: TaintEffect,
}

/// Expected form of a taint.
pub const TAINT_FORM: &str =
    "key[=value]:Effect with Effect one of NoSchedule, PreferNoSchedule, NoExecute";

impl FromStr for Taint {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kv, effect) = s.rsplit_once(':').ok_or(TAINT_FORM)?;
        let effect = TaintEffect::parse(effect).ok_or(TAINT_FORM)?;
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (kv, None),
        };
        label_key(key).map_err(|_| TAINT_FORM)?;
        if let Some(v) = value {
            label_value(v).map_err(|_| TAINT_FORM)?;
        }
        Ok(Self {
            key: key.to_string(),
            value: value.map(str::to_string),
            effect,
        })
    }
}

impl fmt::Display for Taint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={}:{}", self.key, v, self.effect),
            None => write!(f, "{}:{}", self.key, self.effect),
        }
    }
}

/// Expected form of a duration.
pub const DURATION_FORM: &str = "a duration such as \"500ms\", \"90s\", \"10m\" or \"1h30m\"";

/// Parses a human duration (`"90s"`, `"10m"`, `"1h30m"`).
pub fn duration(s: &str) -> Result<std::time::Duration, &'static str> {
    humantime::parse_duration(s.trim()).map_err(|_| DURATION_FORM)
}

/// Expected form of a provider API's base URL.
pub const API_URL_FORM: &str = "an https URL such as \"https://api.cherryservers.com/v1/\" (plain http only to this machine's loopback, for a local emulator: the API token must not cross a network in the clear)";

/// Checks a provider API's base URL: https, or http to a loopback address.
pub fn api_url(s: &str) -> Result<(), &'static str> {
    let url = reqwest::Url::parse(s).map_err(|_| API_URL_FORM)?;
    let host = url.host_str().unwrap_or("");
    let loopback = host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let ok = match url.scheme() {
        "https" => !host.is_empty(),
        "http" => loopback,
        _ => false,
    };
    if ok && !s.contains(char::is_whitespace) {
        Ok(())
    } else {
        Err(API_URL_FORM)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        let good = ["a", "k8s-prod-web-0a1b2c3d", "0", &"a".repeat(63)];
        let bad = ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)];
        for s in good {
            assert!(dns_label(s).is_ok(), "{s} should be a label");
        }
        for s in bad {
            assert!(dns_label(s).is_err(), "{s} should not be a label");
        }
    }

    #[test]
    fn dns_subdomains() {
        for s in ["node-1", "node-1.example.com", "a.b.c"] {
            assert!(dns_subdomain(s).is_ok(), "{s}");
        }
        for s in ["", ".a", "a..b", "Node", "a_b.c", &"a.".repeat(127)] {
            assert!(dns_subdomain(s).is_err(), "{s}");
        }
    }

    #[test]
    fn label_keys_and_values() {
        for k in [
            "app",
            "nodeward.io/node-group",
            "node-role.kubernetes.io/worker",
            "A_b.c",
        ] {
            assert!(label_key(k).is_ok(), "{k}");
        }
        for k in [
            "",
            "/x",
            "x/",
            "Bad_Prefix/x",
            "a/b/c",
            "-x",
            &"x".repeat(64),
        ] {
            assert!(label_key(k).is_err(), "{k}");
        }
        for v in ["", "v1", "a.b-c_d"] {
            assert!(label_value(v).is_ok(), "{v}");
        }
        for v in ["-a", "a b", "a/b", &"v".repeat(64)] {
            assert!(label_value(v).is_err(), "{v}");
        }
    }

    #[test]
    fn taints() {
        let t: Taint = "readiness.k8s.io/nodeward:NoSchedule"
            .parse()
            .expect("taint");
        assert_eq!(t.key, "readiness.k8s.io/nodeward");
        assert_eq!(t.value, None);
        assert_eq!(t.effect, TaintEffect::NoSchedule);
        let t: Taint = "dedicated=gpu:NoExecute".parse().expect("taint");
        assert_eq!(t.to_string(), "dedicated=gpu:NoExecute");
        for bad in [
            "dedicated",
            "dedicated=gpu",
            "x:Sometimes",
            ":NoSchedule",
            "a=b c:NoSchedule",
        ] {
            assert_eq!(bad.parse::<Taint>(), Err(TAINT_FORM), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(duration("90s"), Ok(std::time::Duration::from_secs(90)));
        assert_eq!(duration("10m"), Ok(std::time::Duration::from_secs(600)));
        assert_eq!(duration("1h30m"), Ok(std::time::Duration::from_secs(5400)));
        assert_eq!(duration("500ms"), Ok(std::time::Duration::from_millis(500)));
        for bad in ["", "90", "ten minutes", "-1s"] {
            assert_eq!(duration(bad), Err(DURATION_FORM), "{bad}");
        }
    }
}
