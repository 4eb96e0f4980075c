//! A wrapper for values that must never reach a log line, an error message or a panic.
//!
//! Bootstrap tokens and provider credentials travel through the program as `Secret<String>`;
//! the only way to the inner value is the deliberately loud [`Secret::expose`], so a reviewer can
//! grep for every place a secret leaves its box.

use std::fmt;

/// A value whose `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    /// Wraps a value.
    pub fn new(value: T) -> Self {
        Self(value)
    }

    /// The inner value. Call it only where the secret is written to its destination.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_hide_the_value() {
        let s = Secret::new("abcdef.0123456789abcdef".to_string());
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(format!("{:?}", Some(&s)), "Some(***)");
        assert_eq!(s.expose(), "abcdef.0123456789abcdef");
    }
}
