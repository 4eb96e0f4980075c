//! Label selectors and node selector requirements: the operator parsed once, where the API object
//! is read, and one matcher for every part of nodeward that asks "does this select these labels".
//!
//! The drain asks it of a budget (which pods it covers), the scaler of budgets, pod affinity,
//! topology spread and required node affinity. They used to match operator strings each in its
//! own way and disagreed on `Gt` in a label selector; one enum and one `match` make them agree by
//! construction.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelectorRequirement;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// The operator of a selector requirement.
///
/// An operator nodeward does not know ([`Self::Unknown`]) selects nothing, whatever the labels:
/// the apiserver refuses such a selector, so one can only come from a newer API than this
/// version knows, and selecting nothing is what kube's own conversion
/// (`LabelSelectorAsSelector`, `NodeSelectorRequirementsAsSelector`) makes of it: an error, and
/// the object matches no selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelectorOperator {
    /// The label is there with one of the values.
    In,
    /// The label is absent or has none of the values.
    NotIn,
    /// The label is there.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label is an integer greater than the one value (node selectors only).
    Gt,
    /// The label is an integer less than the one value (node selectors only).
    Lt,
    /// Any other operator: selects nothing.
    Unknown,
}

impl SelectorOperator {
    /// A label selector's operator (`meta/v1 LabelSelectorRequirement`): `In`, `NotIn`, `Exists`
    /// or `DoesNotExist`. `Gt` and `Lt` are node selector operators and [`Self::Unknown`] here,
    /// as `LabelSelectorAsSelector` refuses them.
    pub fn of_label_selector(op: &str) -> Self {
        match Self::of_node_selector(op) {
            Self::Gt | Self::Lt => Self::Unknown,
            known => known,
        }
    }

    /// A node selector's operator (`core/v1 NodeSelectorRequirement`): the label selector's
    /// four, `Gt` and `Lt`.
    pub fn of_node_selector(op: &str) -> Self {
        match op {
            "In" => Self::In,
            "NotIn" => Self::NotIn,
            "Exists" => Self::Exists,
            "DoesNotExist" => Self::DoesNotExist,
            "Gt" => Self::Gt,
            "Lt" => Self::Lt,
            _ => Self::Unknown,
        }
    }

    /// Whether a requirement with this operator and `values` selects an object whose label is
    /// `value` (`None`: it has no such label). `Gt` and `Lt` compare the label and the first
    /// value as integers; either not an integer selects nothing.
    #[inline]
    pub fn selects(self, values: &[String], value: Option<&str>) -> bool {
        let int = |s: &str| s.parse::<i64>().ok();
        let bound = || values.first().and_then(|x| int(x));
        match self {
            Self::In => value.is_some_and(|v| values.iter().any(|x| x == v)),
            Self::NotIn => value.is_none_or(|v| !values.iter().any(|x| x == v)),
            Self::Exists => value.is_some(),
            Self::DoesNotExist => value.is_none(),
            Self::Gt => matches!((value.and_then(int), bound()), (Some(v), Some(x)) if v > x),
            Self::Lt => matches!((value.and_then(int), bound()), (Some(v), Some(x)) if v < x),
            Self::Unknown => false,
        }
    }
}

/// One requirement of a label selector's `matchExpressions`, or of a node selector term's
/// `matchExpressions` or `matchFields`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    /// Label key (or `metadata.name` for a field requirement).
    pub key: String,
    /// The operator, parsed.
    pub operator: SelectorOperator,
    /// Values.
    pub values: Vec<String>,
    /// A `matchFields` requirement (on the node's name).
    pub field: bool,
}

impl Requirement {
    /// Converts a label selector's requirement.
    pub fn of_label_selector(r: &LabelSelectorRequirement) -> Self {
        Self {
            key: r.key.clone(),
            operator: SelectorOperator::of_label_selector(&r.operator),
            values: r.values.clone().unwrap_or_default(),
            field: false,
        }
    }

    /// Converts a node selector's requirement: of `matchFields` when `field`, else of
    /// `matchExpressions`.
    pub fn of_node_selector(r: &NodeSelectorRequirement, field: bool) -> Self {
        Self {
            key: r.key.clone(),
            operator: SelectorOperator::of_node_selector(&r.operator),
            values: r.values.clone().unwrap_or_default(),
            field,
        }
    }

    /// Whether it selects an object with these labels and this name (for a field requirement,
    /// whose only field is `metadata.name`; an empty name is none).
    #[inline]
    pub fn selects(&self, labels: &BTreeMap<String, String>, name: &str) -> bool {
        let value = if self.field {
            (self.key == "metadata.name" && !name.is_empty()).then_some(name)
        } else {
            labels.get(&self.key).map(String::as_str)
        };
        self.operator.selects(&self.values, value)
    }
}

/// A label selector (`matchLabels` and `matchExpressions`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct SelectorView {
    /// `matchLabels`.
    pub labels: BTreeMap<String, String>,
    /// `matchExpressions` (never `field`).
    pub expressions: Vec<Requirement>,
}

impl SelectorView {
    /// Converts a `LabelSelector`.
    pub fn from_selector(s: &LabelSelector) -> Self {
        Self {
            labels: s.match_labels.clone().unwrap_or_default(),
            expressions: s
                .match_expressions
                .iter()
                .flatten()
                .map(Requirement::of_label_selector)
                .collect(),
        }
    }

    /// Whether it selects an object with these labels: every `matchLabels` pair equal and every
    /// expression met (a field requirement, which no label selector has, never is).
    #[inline]
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self
                .expressions
                .iter()
                .all(|r| !r.field && r.selects(labels, ""))
    }
}

/// Whether a `LabelSelector` selects these labels, read where it stands: the verdict of
/// `SelectorView::from_selector(s).selects(labels)` (the same operators, parsed the same way)
/// without copying the selector, for a caller that asks once per pod and budget, as the drain
/// does at every step.
pub fn label_selector_selects(s: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    s.match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
        && s.match_expressions.iter().flatten().all(|e| {
            SelectorOperator::of_label_selector(&e.operator).selects(
                e.values.as_deref().unwrap_or_default(),
                labels.get(&e.key).map(String::as_str),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verdicts of every operator, over an object with the label (`n=10`) and one without,
    /// as each user reads its selectors: the drain's budgets and the scaler's label selectors
    /// (where `Gt` and `Lt` are no operators), and required node affinity (where they are).
    #[test]
    fn every_operator() {
        /// Operator, values, label selector's verdicts with and without the label, node
        /// affinity's.
        type Case = (&'static str, &'static [&'static str], [bool; 2], [bool; 2]);
        let cases: &[Case] = &[
            ("In", &["10", "3"], [true, false], [true, false]),
            ("In", &[], [false, false], [false, false]),
            ("NotIn", &["3"], [true, true], [true, true]),
            ("NotIn", &["10"], [false, true], [false, true]),
            ("Exists", &[], [true, false], [true, false]),
            ("DoesNotExist", &[], [false, true], [false, true]),
            ("Gt", &["3"], [false, false], [true, false]),
            ("Gt", &["10"], [false, false], [false, false]),
            ("Gt", &[], [false, false], [false, false]),
            ("Lt", &["30"], [false, false], [true, false]),
            ("Lt", &["x"], [false, false], [false, false]),
            ("in", &["10"], [false, false], [false, false]),
            ("Bogus", &["10"], [false, false], [false, false]),
            ("", &[], [false, false], [false, false]),
        ];
        let with = BTreeMap::from([("n".to_string(), "10".to_string())]);
        let without = BTreeMap::new();
        for &(op, values, label, node) in cases {
            let values: Option<Vec<String>> = Some(values.iter().map(|v| v.to_string()).collect());
            let sel = LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "n".into(),
                    operator: op.into(),
                    values: values.clone(),
                }]),
            };
            let affinity = Requirement::of_node_selector(
                &NodeSelectorRequirement {
                    key: "n".into(),
                    operator: op.into(),
                    values,
                },
                false,
            );
            let view = SelectorView::from_selector(&sel);
            let drain = |l| crate::drain::plan::selector_matches(&sel, l);
            assert_eq!([drain(&with), drain(&without)], label, "drain: {op}");
            assert_eq!(
                [view.selects(&with), view.selects(&without)],
                label,
                "scaler: {op}"
            );
            let aff = |l| affinity.selects(l, "node");
            assert_eq!([aff(&with), aff(&without)], node, "node affinity: {op}");
        }
    }

    /// A field requirement reads the name, not a label; a label selector never has one that
    /// selects.
    #[test]
    fn field_requirements() {
        let r = Requirement {
            key: "metadata.name".into(),
            operator: SelectorOperator::In,
            values: vec!["n1".into()],
            field: true,
        };
        let labels = BTreeMap::from([("metadata.name".to_string(), "n1".to_string())]);
        assert!(r.selects(&BTreeMap::new(), "n1"));
        assert!(!r.selects(&labels, "n2"));
        assert!(!r.selects(&labels, ""));
        let sel = SelectorView {
            labels: BTreeMap::new(),
            expressions: vec![r],
        };
        assert!(!sel.selects(&labels));
    }
}
