//! Resource amounts: Kubernetes quantities parsed into integers, and the arithmetic packing needs.
//!
//! CPU is kept in millicores and everything else in whole units (memory in bytes), as the
//! scheduler does; integers make "fits" exact and packing fast enough for 30,000 pods.

use std::collections::BTreeMap;

/// Expected form of a quantity.
pub const QUANTITY_FORM: &str =
    "a Kubernetes quantity such as \"500m\", \"2\", \"512Mi\", \"16Gi\" or \"1e3\"";

/// Parses a quantity into milli-units (`"500m"` → 500, `"2"` → 2000, `"1Ki"` → 1_024_000).
pub fn parse_milli(s: &str) -> Option<i64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() {
        return None;
    }
    let value: f64 = num.parse().ok()?;
    let factor: f64 = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    let milli = (value * factor * 1000.0).ceil();
    (milli.is_finite() && milli >= 0.0 && milli < i64::MAX as f64).then_some(milli as i64)
}

/// Parses a quantity into whole units, rounding up (`"1Ki"` → 1024, `"500m"` → 1).
pub fn parse_units(s: &str) -> Option<i64> {
    parse_milli(s).map(|m| (m + 999) / 1000)
}

/// Resources a pod requests or a node offers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Resources {
    /// CPU in millicores.
    pub cpu_milli: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Pod slots.
    pub pods: i64,
    /// Extended resources (`nvidia.com/gpu`, ...) and ephemeral-storage, in whole units.
    pub extended: BTreeMap<String, i64>,
}

impl Resources {
    /// Builds from a `name → quantity` map (`requests`, `allocatable`); unknown or malformed
    /// quantities count as zero (the apiserver has validated them already).
    pub fn from_quantities<'a>(items: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut r = Self::default();
        for (name, q) in items {
            match name {
                "cpu" => r.cpu_milli = parse_milli(q).unwrap_or(0),
                "memory" => r.memory = parse_units(q).unwrap_or(0),
                "pods" => r.pods = parse_units(q).unwrap_or(0),
                other => {
                    r.extended
                        .insert(other.to_string(), parse_units(q).unwrap_or(0));
                }
            }
        }
        r
    }

    /// Adds `other`.
    pub fn add(&mut self, other: &Self) {
        self.cpu_milli += other.cpu_milli;
        self.memory += other.memory;
        self.pods += other.pods;
        for (k, v) in &other.extended {
            *self.extended.entry(k.clone()).or_default() += v;
        }
    }

    /// Subtracts `other` (may go negative on an overcommitted node).
    pub fn sub(&mut self, other: &Self) {
        self.cpu_milli -= other.cpu_milli;
        self.memory -= other.memory;
        self.pods -= other.pods;
        for (k, v) in &other.extended {
            *self.extended.entry(k.clone()).or_default() -= v;
        }
    }

    /// Each dimension the larger of the two (a pod's init containers against its containers).
    pub fn max(&mut self, other: &Self) {
        self.cpu_milli = self.cpu_milli.max(other.cpu_milli);
        self.memory = self.memory.max(other.memory);
        self.pods = self.pods.max(other.pods);
        for (k, v) in &other.extended {
            let e = self.extended.entry(k.clone()).or_default();
            *e = (*e).max(*v);
        }
    }

    /// Whether `request` fits into `self` (free capacity).
    pub fn fits(&self, request: &Self) -> bool {
        request.cpu_milli <= self.cpu_milli
            && request.memory <= self.memory
            && request.pods <= self.pods
            && request
                .extended
                .iter()
                .all(|(k, v)| *v <= 0 || self.extended.get(k).is_some_and(|free| v <= free))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        let cases: &[(&str, Option<i64>)] = &[
            ("500m", Some(500)),
            ("2", Some(2000)),
            ("0.5", Some(500)),
            ("1Ki", Some(1_024_000)),
            ("1k", Some(1_000_000)),
            ("1e3", Some(1_000_000)),
            ("", None),
            ("Gi", None),
            ("5x", None),
        ];
        for (s, want) in cases {
            assert_eq!(parse_milli(s), *want, "{s}");
        }
        assert_eq!(parse_units("16Gi"), Some(16 * 1024 * 1024 * 1024));
        assert_eq!(parse_units("500m"), Some(1));
    }

    #[test]
    fn fit_checks_every_dimension() {
        let node = Resources::from_quantities([
            ("cpu", "4"),
            ("memory", "8Gi"),
            ("pods", "110"),
            ("nvidia.com/gpu", "1"),
        ]);
        let small = Resources::from_quantities([("cpu", "1"), ("memory", "1Gi"), ("pods", "1")]);
        assert!(node.fits(&small));
        let gpu2 = Resources::from_quantities([("pods", "1"), ("nvidia.com/gpu", "2")]);
        assert!(!node.fits(&gpu2));
        let big_mem = Resources::from_quantities([("memory", "9Gi")]);
        assert!(!node.fits(&big_mem));
        let other_ext = Resources::from_quantities([("example.com/fpga", "1")]);
        assert!(
            !node.fits(&other_ext),
            "a resource the node lacks does not fit"
        );
        let mut free = node.clone();
        free.sub(&small);
        assert_eq!(free.cpu_milli, 3000);
        free.add(&small);
        assert_eq!(free, node);
    }
}
