//! The effective configuration as `nodeward config check` shows it: every key with its value and
//! where that value came from (the default, the main file, which drop-in), as TOML an operator
//! can read or paste, or as JSON for scripts — what `systemd-analyze cat-config` and
//! `kubectl config view` give for theirs.
//!
//! The defaults are the shipped `packaging/config.toml`, which a test holds to
//! [`Settings::default`](super::Settings::default); the files are laid over them the way the
//! loader merges them (the sections and `scaler.cherry`, `scaler.exec`, `scaler.group_defaults`
//! key by key, every other value whole). A test holds the printed TOML to the loaded settings, so
//! the two merges cannot drift apart unnoticed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use toml::{Table, Value};

use super::{Result, Source};

/// The shipped example: every key at its default.
const DEFAULTS: &str = include_str!("../../packaging/config.toml");

/// Tables the loader merges key by key (see `fragment.rs`); any other value a file sets replaces
/// the earlier one whole.
const MERGED_TABLES: &[&str] = &[
    "node",
    "drain",
    "agent",
    "gates",
    "shutdown",
    "reboot",
    "conditions",
    "scaler",
    "scaler.cherry",
    "scaler.exec",
    "scaler.group_defaults",
];

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Nothing set it.
    Default,
    /// This file set it last.
    File(PathBuf),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// The merged configuration and each key's origin.
#[derive(Debug)]
pub struct Effective {
    /// The files read, in order.
    pub files: Vec<PathBuf>,
    tree: Table,
    /// Dotted key → the file that set it; keys absent here are defaults.
    set_by: BTreeMap<String, PathBuf>,
}

/// Lays `sources` over the defaults. The sources must already have passed [`super::parse`].
pub fn effective(sources: &[Source]) -> Result<Effective> {
    let defaults = Source {
        path: PathBuf::from("packaging/config.toml"),
        text: DEFAULTS.to_string(),
    };
    let mut tree: Table = crate::tomlfile::parse(&defaults.path, &defaults.text)?;
    let mut set_by = BTreeMap::new();
    for s in sources {
        let table: Table = crate::tomlfile::parse(&s.path, &s.text)?;
        overlay(&mut tree, table, "", &s.path, &mut set_by);
    }
    Ok(Effective {
        files: sources.iter().map(|s| s.path.clone()).collect(),
        tree,
        set_by,
    })
}

fn overlay(
    base: &mut Table,
    later: Table,
    prefix: &str,
    file: &std::path::Path,
    set_by: &mut BTreeMap<String, PathBuf>,
) {
    for (key, value) in later {
        let path = join(prefix, &key);
        match (base.get_mut(&key), value) {
            (Some(Value::Table(b)), Value::Table(l)) if MERGED_TABLES.contains(&path.as_str()) => {
                overlay(b, l, &path, file, set_by);
            }
            (_, value) => {
                let inner = format!("{path}.");
                set_by.retain(|k, _| !k.starts_with(&inner));
                set_by.insert(path, file.to_path_buf());
                base.insert(key, value);
            }
        }
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

impl Effective {
    /// Where the value at `path` (dotted) came from.
    pub fn origin(&self, path: &str) -> Origin {
        self.set_by
            .get(path)
            .map_or(Origin::Default, |p| Origin::File(p.clone()))
    }

    /// TOML, each value followed by a comment naming its origin.
    pub fn to_toml(&self) -> String {
        let mut out = String::from("# nodeward's effective configuration: ");
        if self.files.is_empty() {
            out.push_str("no files, defaults only\n");
        } else {
            let files: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
            let _ = writeln!(out, "defaults, then {}", files.join(", then "));
        }
        self.write_table(&mut out, &self.tree, "");
        out
    }

    fn write_table(&self, out: &mut String, table: &Table, prefix: &str) {
        let (sections, values): (Vec<_>, Vec<_>) = table.iter().partition(|(k, v)| {
            matches!(v, Value::Table(_)) && MERGED_TABLES.contains(&join(prefix, k).as_str())
        });
        if !prefix.is_empty() {
            let _ = writeln!(out, "\n[{prefix}]");
        }
        for (key, value) in values {
            let path = join(prefix, key);
            let _ = writeln!(
                out,
                "{} = {}  # {}",
                toml_key(key),
                inline(value),
                self.origin(&path)
            );
        }
        for (key, value) in sections {
            if let Value::Table(t) = value {
                self.write_table(out, t, &join(prefix, key));
            }
        }
    }

    /// `{"files": [...], "config": {...}, "origins": {"drain.timeout": "default", ...}}`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut origins = serde_json::Map::new();
        self.collect_origins(&self.tree, "", &mut origins);
        serde_json::json!({
            "files": self.files,
            "config": self.tree,
            "origins": origins,
        })
    }

    fn collect_origins(
        &self,
        table: &Table,
        prefix: &str,
        origins: &mut serde_json::Map<String, serde_json::Value>,
    ) {
        for (key, value) in table {
            let path = join(prefix, key);
            match value {
                Value::Table(t) if MERGED_TABLES.contains(&path.as_str()) => {
                    self.collect_origins(t, &path, origins);
                }
                _ => {
                    let origin = self.origin(&path).to_string();
                    origins.insert(path, serde_json::Value::String(origin));
                }
            }
        }
    }
}

/// A key, bare when TOML allows it.
fn toml_key(key: &str) -> String {
    if !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        key.to_string()
    } else {
        Value::String(key.to_string()).to_string()
    }
}

/// A value on one line: arrays and tables inline.
fn inline(value: &Value) -> String {
    match value {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(inline).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Table(t) => {
            let pairs: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{} = {}", toml_key(k), inline(v)))
                .collect();
            format!("{{ {} }}", pairs.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(path: &str, text: &str) -> Source {
        Source {
            path: PathBuf::from(path),
            text: text.to_string(),
        }
    }

    fn sources() -> Vec<Source> {
        vec![
            src(
                "/etc/nodeward/config.toml",
                "[drain]\ntimeout = \"60s\"\nforce = true\n[node]\nname = \"worker-1\"\n\
                 [[drain.waves]]\nmin_priority = 0\nshare_of_deadline = 1.0\n\
                 [scaler.cherry]\nrequest_timeout = \"5s\"\n",
            ),
            src(
                "/etc/nodeward/config.d/10-timeout.toml",
                "[drain]\ntimeout = \"2m\"\n",
            ),
        ]
    }

    /// The printed TOML is the configuration the loader built, whatever the files did.
    #[test]
    fn printed_toml_parses_to_the_loaded_settings() {
        for sources in [vec![], sources()] {
            let loaded = super::super::parse(&sources).expect("valid");
            let printed = effective(&sources).expect("effective").to_toml();
            let reparsed =
                super::super::parse(&[src("printed", &printed)]).expect("printed parses");
            assert_eq!(reparsed, loaded, "{printed}");
        }
    }

    #[test]
    fn each_value_names_where_it_came_from() {
        let e = effective(&sources()).expect("effective");
        let dropin = Origin::File("/etc/nodeward/config.d/10-timeout.toml".into());
        let main = Origin::File("/etc/nodeward/config.toml".into());
        assert_eq!(e.origin("drain.timeout"), dropin);
        assert_eq!(e.origin("drain.force"), main);
        assert_eq!(e.origin("drain.waves"), main, "arrays are replaced whole");
        assert_eq!(e.origin("node.name"), main);
        assert_eq!(e.origin("scaler.cherry.request_timeout"), main);
        assert_eq!(e.origin("scaler.cherry.api_url"), Origin::Default);
        assert_eq!(e.origin("drain.concurrency"), Origin::Default);
        let text = e.to_toml();
        assert!(
            text.contains("timeout = \"2m\"  # /etc/nodeward/config.d/10-timeout.toml"),
            "{text}"
        );
        assert!(text.contains("concurrency = 32  # default"), "{text}");
        let json = e.to_json();
        assert_eq!(json["config"]["drain"]["timeout"], "2m");
        assert_eq!(
            json["origins"]["drain.timeout"],
            "/etc/nodeward/config.d/10-timeout.toml"
        );
        assert_eq!(json["origins"]["drain.concurrency"], "default");
        assert_eq!(json["files"][1], "/etc/nodeward/config.d/10-timeout.toml");
    }

    /// A drop-in that turns coordinated reboots on sets that key alone: the rest of `[reboot]`
    /// stays the defaults, shown as such, as the loader merges it.
    #[test]
    fn a_reboot_drop_in_is_merged_key_by_key() {
        let sources = [src(
            "/etc/nodeward/config.d/60-reboot.toml",
            "[reboot]\nenabled = true\nconcurrency = 2\n",
        )];
        let e = effective(&sources).expect("effective");
        let dropin = Origin::File("/etc/nodeward/config.d/60-reboot.toml".into());
        assert_eq!(e.origin("reboot.enabled"), dropin);
        assert_eq!(e.origin("reboot.period"), Origin::Default);
        let text = e.to_toml();
        assert!(text.contains("\n[reboot]\n"), "{text}");
        assert!(text.contains("period = \"1m\"  # default"), "{text}");
        assert!(
            text.contains("enabled = true  # /etc/nodeward/config.d/60-reboot.toml"),
            "{text}"
        );
        let loaded = super::super::parse(&sources).expect("valid");
        let reparsed = super::super::parse(&[src("printed", &text)]).expect("printed parses");
        assert_eq!(reparsed, loaded, "{text}");
    }
}
