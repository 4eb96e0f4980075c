//! Label and field selectors, parsed from query strings and `LabelSelector` objects.
//!
//! The grammar is the apiserver's: labels take `=`, `==`, `!=`, `in`, `notin`, `key`, `!key`,
//! `>` and `<`; fields take `=`, `==` and `!=` on the field labels each resource supports
//! (an unsupported field is a 400, as in kube-apiserver). Field values are read from the object
//! itself; a missing string reads as `""` and a missing boolean as `"false"`, which is what
//! the apiserver's field-label conversion produces.

use serde_json::Value;

use crate::resources::{RESOURCES, ResId};

/// A selector that cannot be parsed, or names a field the resource does not support.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    /// The label selector does not parse.
    #[error("unable to parse requirement: {0}")]
    Label(String),
    /// The field selector does not parse.
    #[error("invalid selector: '{0}'; can't understand '{1}'")]
    Field(String, String),
    /// The field is not a field label of this resource.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelReq {
    /// `key in (values)`; `key=value` is `In` with one value.
    In(String, Vec<String>),
    /// `key notin (values)`; `key!=value` is `NotIn` with one value.
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
    /// `key>n`.
    Gt(String, i64),
    /// `key<n`.
    Lt(String, i64),
}

/// A conjunction of label requirements. Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    /// All must hold.
    pub reqs: Vec<LabelReq>,
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            reqs.push(parse_label_req(part)?);
        }
        Ok(Self { reqs })
    }

    /// Builds a selector from a `metav1.LabelSelector` JSON object (`matchLabels`,
    /// `matchExpressions`). `None` when the JSON is not a valid selector.
    pub fn from_json(sel: &Value) -> Option<Self> {
        let mut reqs = Vec::new();
        if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in ml {
                reqs.push(LabelReq::In(k.clone(), vec![v.as_str()?.to_string()]));
            }
        }
        if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e.get("key")?.as_str()?.to_string();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                let req = match e.get("operator")?.as_str()? {
                    "In" => LabelReq::In(key, values),
                    "NotIn" => LabelReq::NotIn(key, values),
                    "Exists" => LabelReq::Exists(key),
                    "DoesNotExist" => LabelReq::DoesNotExist(key),
                    _ => return None,
                };
                reqs.push(req);
            }
        }
        Some(Self { reqs })
    }

    /// Whether no requirement is set.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether an object's labels satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        if self.reqs.is_empty() {
            return true;
        }
        let labels = obj
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| match r {
            LabelReq::In(k, vs) => get(k).is_some_and(|v| vs.iter().any(|x| x == v)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|v| !vs.iter().any(|x| x == v)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::DoesNotExist(k) => get(k).is_none(),
            LabelReq::Gt(k, n) => get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            LabelReq::Lt(k, n) => get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        })
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

fn parse_label_req(part: &str) -> Result<LabelReq, SelectorError> {
    let err = || SelectorError::Label(part.to_string());
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        return valid_key(key)
            .then(|| LabelReq::DoesNotExist(key.into()))
            .ok_or_else(err);
    }
    for (op, is_in) in [(" notin ", false), (" in ", true)] {
        if let Some(idx) = part.find(op) {
            let key = part[..idx].trim();
            let rest = part[idx + op.len()..].trim();
            let inner = rest
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(err)?;
            let values: Vec<String> = inner
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            if !valid_key(key) {
                return Err(err());
            }
            return Ok(if is_in {
                LabelReq::In(key.into(), values)
            } else {
                LabelReq::NotIn(key.into(), values)
            });
        }
    }
    for (op, kind) in [("!=", 0), ("==", 1), ("=", 1), (">", 2), ("<", 3)] {
        if let Some(idx) = part.find(op) {
            let key = part[..idx].trim();
            let value = part[idx + op.len()..].trim();
            if !valid_key(key) {
                return Err(err());
            }
            return match kind {
                0 => Ok(LabelReq::NotIn(key.into(), vec![value.into()])),
                1 => Ok(LabelReq::In(key.into(), vec![value.into()])),
                2 => value
                    .parse()
                    .map(|n| LabelReq::Gt(key.into(), n))
                    .map_err(|_| err()),
                _ => value
                    .parse()
                    .map(|n| LabelReq::Lt(key.into(), n))
                    .map_err(|_| err()),
            };
        }
    }
    valid_key(part)
        .then(|| LabelReq::Exists(part.into()))
        .ok_or_else(err)
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

/// One field requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldReq {
    /// Field label, e.g. `spec.nodeName`.
    pub field: String,
    /// Value compared against.
    pub value: String,
    /// `true` for `=`/`==`, `false` for `!=`.
    pub equal: bool,
}

/// A conjunction of field requirements. Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// All must hold.
    pub reqs: Vec<FieldReq>,
}

/// Field labels beyond `metadata.name` and `metadata.namespace`, per resource plural.
fn extra_fields(plural: &str) -> &'static [&'static str] {
    match plural {
        "pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "nodes" => &["spec.unschedulable"],
        "namespaces" => &["status.phase"],
        "secrets" => &["type"],
        "events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
        ],
        _ => &[],
    }
}

/// Boolean fields, which read as `"false"` when absent.
const BOOL_FIELDS: &[&str] = &["spec.unschedulable", "spec.hostNetwork"];

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter for a resource.
    pub fn parse(text: &str, res: ResId) -> Result<Self, SelectorError> {
        let plural = RESOURCES[res].plural;
        let mut reqs = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (field, value, equal) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, true)
            } else {
                return Err(SelectorError::Field(text.to_string(), part.to_string()));
            };
            let field = field.trim();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !extra_fields(plural).contains(&field)
            {
                return Err(SelectorError::UnsupportedField(field.to_string()));
            }
            reqs.push(FieldReq {
                field: field.to_string(),
                value: unescape(value.trim()),
                equal,
            });
        }
        Ok(Self { reqs })
    }

    /// Whether no requirement is set.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// The value of an equality requirement on `field`, if there is one (used to pick an index).
    pub fn equality(&self, field: &str) -> Option<&str> {
        self.reqs
            .iter()
            .find(|r| r.equal && r.field == field)
            .map(|r| r.value.as_str())
    }

    /// Whether an object satisfies every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs
            .iter()
            .all(|r| (field_value(obj, &r.field) == r.value) == r.equal)
    }
}

/// Reads a field label from an object.
pub fn field_value(obj: &Value, field: &str) -> String {
    if field == "source" {
        // core/v1 events: `source` is `source.component`.
        return obj
            .pointer("/source/component")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
    }
    let found = field.split('.').try_fold(obj, |v, part| v.get(part));
    match found {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => String::new(),
        None if BOOL_FIELDS.contains(&field) => "false".to_string(),
        None => String::new(),
    }
}

fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{NODES, PODS};
    use serde_json::json;

    fn pod() -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web", "tier": "2"}},
               "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})
    }

    #[test]
    fn label_grammar() {
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web,db)", true),
            ("app notin (web)", false),
            ("app", true),
            ("!app", false),
            ("missing", false),
            ("!missing", true),
            ("missing!=x", true),
            ("app=web,tier>1", true),
            ("tier<2", false),
            ("app in (db), tier", false),
            ("", true),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).expect(sel);
            assert_eq!(s.matches(&pod()), want, "{sel}");
        }
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("=x").is_err());
    }

    #[test]
    fn label_selector_json() {
        let s = LabelSelector::from_json(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["2", "3"]}]
        }))
        .expect("valid");
        assert!(s.matches(&pod()));
        assert!(
            LabelSelector::from_json(&json!({}))
                .expect("empty")
                .is_empty()
        );
    }

    #[test]
    fn field_grammar() {
        let s = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed", PODS).expect("ok");
        assert!(s.matches(&pod()));
        assert_eq!(s.equality("spec.nodeName"), Some("n1"));
        let s = FieldSelector::parse("metadata.name==q", PODS).expect("ok");
        assert!(!s.matches(&pod()));
        assert_eq!(
            FieldSelector::parse("spec.foo=1", PODS),
            Err(SelectorError::UnsupportedField("spec.foo".into()))
        );
        let s = FieldSelector::parse("spec.unschedulable=false", NODES).expect("ok");
        assert!(s.matches(&json!({"metadata": {"name": "n"}})));
        assert!(!s.matches(&json!({"spec": {"unschedulable": true}})));
    }
}
