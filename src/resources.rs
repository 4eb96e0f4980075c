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
    parse_scaled(s, 3)
}

/// Parses a quantity into whole units, rounding up (`"1Ki"` → 1024, `"500m"` → 1).
pub fn parse_units(s: &str) -> Option<i64> {
    parse_scaled(s, 0)
}

/// `⌈quantity × 10^scale⌉`, exactly (decimal, as the API server's `inf.Dec`; `"1.1"` × 1000 is
/// 1100, not the 1101 of floating point), saturating at `i64::MAX` (`"8Ei"` of memory is more
/// than anything fits, not nothing). `None` for a malformed or negative quantity.
fn parse_scaled(s: &str, scale: i32) -> Option<i64> {
    let s = s.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(end);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return None;
    }
    let (ten, two) = suffix_exponents(suffix)?;
    // More than 38 significant digits is no quantity anyone wrote.
    let mantissa = int.bytes().chain(frac.bytes()).try_fold(0i128, |m, b| {
        m.checked_mul(10)?.checked_add(i128::from(b - b'0'))
    })?;
    if mantissa == 0 {
        // Zero times any power is zero, also one too large to compute (the fuzzer's "0E36").
        return Some(0);
    }
    let frac_len = i32::try_from(frac.len()).ok()?;
    let ten = ten.checked_add(scale)?.checked_sub(frac_len)?;
    let value = mantissa.checked_mul(2i128.checked_pow(two)?);
    let scaled = match (value, u32::try_from(ten)) {
        (None, _) => None,
        (Some(v), Ok(up)) => 10i128.checked_pow(up).and_then(|p| v.checked_mul(p)),
        (Some(v), Err(_)) => Some(match 10i128.checked_pow(ten.unsigned_abs()) {
            Some(p) => v / p + i128::from(v % p != 0),
            None => i128::from(v != 0),
        }),
    };
    Some(scaled.map_or(i64::MAX, |v| i64::try_from(v).unwrap_or(i64::MAX)))
}

/// The powers of ten and two a quantity's suffix stands for (`"Ki"` → 2^10, `"M"` → 10^6,
/// `"e3"` → 10^3), or `None` for a suffix Kubernetes does not know.
fn suffix_exponents(suffix: &str) -> Option<(i32, u32)> {
    let decimal = |t: i32| Some((t, 0));
    let binary = |b: u32| Some((0, b));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        e => {
            let exp = e.strip_prefix(['e', 'E'])?;
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            // Beyond ±10^400 every quantity saturates or rounds up to one unit anyway.
            exp.parse::<i32>()
                .ok()
                .map(|t| t.clamp(-400, 400))
                .and_then(decimal)
        }
    }
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

    /// Adds `other`, saturating: amounts near `i64::MAX` (an `"8Ei"` allocatable) stay huge
    /// instead of wrapping negative in a release build or panicking in a debug one.
    pub fn add(&mut self, other: &Self) {
        self.combine(other, i64::saturating_add);
    }

    /// Subtracts `other` (may go negative on an overcommitted node), saturating as `add`.
    pub fn sub(&mut self, other: &Self) {
        self.combine(other, i64::saturating_sub);
    }

    fn combine(&mut self, other: &Self, op: fn(i64, i64) -> i64) {
        self.cpu_milli = op(self.cpu_milli, other.cpu_milli);
        self.memory = op(self.memory, other.memory);
        self.pods = op(self.pods, other.pods);
        for (k, v) in &other.extended {
            let e = self.extended.entry(k.clone()).or_default();
            *e = op(*e, *v);
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
            && (request.extended.is_empty()
                || request
                    .extended
                    .iter()
                    .all(|(k, v)| *v <= 0 || self.extended.get(k).is_some_and(|free| v <= free)))
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
            ("-1", None),
            ("1.2.3", None),
            ("1e", None),
            // Exact, as the API server's decimal: not 1101 from 1.1 × 1000.0 in floating point.
            ("1.1", Some(1100)),
            ("0.0005", Some(1)),
            ("100n", Some(1)),
            ("+2.5", Some(2500)),
            ("1E3", Some(1_000_000)),
            ("1e-3", Some(1)),
            // Exa, binary exa and huge exponents saturate instead of counting as nothing.
            ("1E", Some(i64::MAX)),
            ("1Ei", Some(i64::MAX)),
            ("1e400", Some(i64::MAX)),
            ("1e-400", Some(1)),
            // Found by the fuzzer: zero stays zero however large its exponent.
            ("0E36", Some(0)),
            ("0e400", Some(0)),
        ];
        for (s, want) in cases {
            assert_eq!(parse_milli(s), *want, "{s}");
        }
        assert_eq!(parse_units("16Gi"), Some(16 * 1024 * 1024 * 1024));
        assert_eq!(parse_units("500m"), Some(1));
        assert_eq!(parse_units("2E"), Some(2_000_000_000_000_000_000));
        assert_eq!(parse_units("4Ei"), Some(1 << 62));
        assert_eq!(parse_units("16Ei"), Some(i64::MAX));
    }

    #[test]
    fn arithmetic_saturates() {
        let huge = Resources::from_quantities([("memory", "7Ei"), ("example.com/x", "7E")]);
        let mut sum = huge.clone();
        sum.add(&huge);
        assert_eq!(sum.memory, i64::MAX, "8Ei + 8Ei must not wrap negative");
        assert_eq!(sum.extended["example.com/x"], i64::MAX);
        assert!(sum.fits(&huge));
        let mut debt = Resources::default();
        debt.sub(&sum);
        debt.sub(&sum);
        assert_eq!(debt.memory, i64::MIN, "saturates at the bottom too");
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

    mod properties {
        use super::*;
        use proptest::prelude::*;

        const SUFFIXES: &[(&str, i128)] = &[
            ("", 1),
            ("k", 1_000),
            ("M", 1_000_000),
            ("G", 1_000_000_000),
            ("T", 1_000_000_000_000),
            ("P", 1_000_000_000_000_000),
            ("E", 1_000_000_000_000_000_000),
            ("Ki", 1 << 10),
            ("Mi", 1 << 20),
            ("Gi", 1 << 30),
            ("Ti", 1 << 40),
            ("Pi", 1 << 50),
            ("Ei", 1 << 60),
            ("e0", 1),
            ("e2", 100),
            ("e9", 1_000_000_000),
        ];

        fn saturated(v: i128) -> i64 {
            i64::try_from(v).unwrap_or(i64::MAX)
        }

        proptest! {
            /// Every whole quantity with every suffix parses to exactly its value, saturated.
            #[test]
            fn whole_quantities_parse_exactly(n in 0u32..2_000_000, i in 0..SUFFIXES.len()) {
                let (suffix, factor) = SUFFIXES[i];
                let q = format!("{n}{suffix}");
                prop_assert_eq!(parse_units(&q), Some(saturated(i128::from(n) * factor)), "{}", q);
                prop_assert_eq!(
                    parse_milli(&q),
                    Some(saturated(i128::from(n) * factor * 1000)),
                    "{}",
                    q
                );
            }

            /// Decimal fractions are exact in milli-units, and round up below them.
            #[test]
            fn decimals_are_exact(whole in 0u32..1_000_000, milli in 0u32..1000, extra in 0u32..10) {
                let q = format!("{whole}.{milli:03}");
                let exact = i64::from(whole) * 1000 + i64::from(milli);
                prop_assert_eq!(parse_milli(&q), Some(exact), "{}", q);
                let finer = format!("{q}{extra}");
                prop_assert_eq!(parse_milli(&finer), Some(exact + i64::from(extra != 0)), "{}", finer);
            }

            /// No input panics the parser, and whatever it accepts is not negative.
            #[test]
            fn parsing_never_panics(q in "[+-]?[0-9.]{0,45}(|[numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]{0,12})") {
                prop_assert!(parse_milli(&q).is_none_or(|v| v >= 0), "{}", q);
                prop_assert!(parse_units(&q).is_none_or(|v| v >= 0), "{}", q);
            }

            /// Any string at all: no panic.
            #[test]
            fn arbitrary_strings_never_panic(q in any::<String>()) {
                let _ = parse_milli(&q);
            }

            /// Adding then subtracting gives back what was there, and neither ever panics.
            #[test]
            fn add_then_sub_is_identity(a in any::<[i64; 3]>(), b in any::<[i64; 3]>()) {
                let r = |v: [i64; 3]| Resources {
                    cpu_milli: v[0] >> 2,
                    memory: v[1] >> 2,
                    pods: v[2] >> 2,
                    extended: [("x".to_string(), v[0] >> 2)].into(),
                };
                let mut sum = r(a);
                sum.add(&r(b));
                sum.sub(&r(b));
                prop_assert_eq!(sum, r(a));
                let mut extreme = r(a);
                for _ in 0..5 {
                    extreme.add(&Resources { cpu_milli: i64::MAX, ..r(b) });
                    extreme.sub(&Resources { memory: i64::MAX, ..r(b) });
                }
            }
        }
    }
}
