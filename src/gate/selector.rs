//! Equality-based label selectors (`app=flannel,tier!=test,k8s-app`), the subset a readiness
//! gate needs to name "the flannel pod on this node". Matched locally against the pods the
//! agent already watches, so a gate costs no extra API request.

use std::collections::BTreeMap;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    /// `key=value` or `key==value`.
    Equals(String, String),
    /// `key!=value` (also matches pods without the key, as in Kubernetes).
    NotEquals(String, String),
    /// `key`: the label is present.
    Exists(String),
    /// `!key`: the label is absent.
    Absent(String),
}

/// A parsed label selector; every requirement must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    text: String,
    requirements: Vec<Requirement>,
}

/// The accepted form, for error messages.
pub const FORM: &str = "comma-separated key=value, key!=value, key or !key (e.g. \"app=flannel\")";

impl Selector {
    /// Parses `text`; errors name the accepted form.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in text.split(',').map(str::trim) {
            if part.is_empty() {
                return Err(format!("empty requirement in {text:?}: expected {FORM}"));
            }
            let req = if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(key(k, text)?, value(v, text)?)
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Requirement::Equals(key(k, text)?, value(v, text)?)
            } else if let Some(k) = part.strip_prefix('!') {
                Requirement::Absent(key(k, text)?)
            } else {
                Requirement::Exists(key(part, text)?)
            };
            requirements.push(req);
        }
        Ok(Self {
            text: text.to_string(),
            requirements,
        })
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::Absent(k) => !labels.contains_key(k),
        })
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn key(k: &str, text: &str) -> Result<String, String> {
    let k = k.trim();
    crate::validate::label_key(k)
        .map(|()| k.to_string())
        .map_err(|form| format!("invalid label key {k:?} in {text:?}: expected {form}"))
}

fn value(v: &str, text: &str) -> Result<String, String> {
    let v = v.trim();
    crate::validate::label_value(v)
        .map(|()| v.to_string())
        .map_err(|form| format!("invalid label value {v:?} in {text:?}: expected {form}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn matching() {
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], bool);
        let cases: &[Case<'_>] = &[
            ("app=flannel", &[("app", "flannel")], true),
            ("app==flannel", &[("app", "flannel")], true),
            ("app=flannel", &[("app", "calico")], false),
            ("app=flannel", &[], false),
            ("app=flannel,tier=node", &[("app", "flannel")], false),
            (
                "app=flannel,tier=node",
                &[("app", "flannel"), ("tier", "node")],
                true,
            ),
            ("app!=flannel", &[], true),
            ("app!=flannel", &[("app", "flannel")], false),
            ("k8s-app", &[("k8s-app", "x")], true),
            ("k8s-app", &[], false),
            ("!canary", &[("canary", "1")], false),
            ("!canary", &[], true),
        ];
        for (sel, l, want) in cases {
            let s = Selector::parse(sel).expect(sel);
            assert_eq!(s.matches(&labels(l)), *want, "{sel} on {l:?}");
        }
    }

    #[test]
    fn bad_selectors_name_the_form() {
        for bad in ["", "app=,", "a b=c", "app=fl annel"] {
            let e = Selector::parse(bad).expect_err(bad);
            assert!(e.contains("expected"), "{bad}: {e}");
        }
    }
}
