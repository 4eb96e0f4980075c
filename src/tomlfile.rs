//! Parsing a TOML file into a typed value, with errors that say where: file, line, column and
//! the dotted key, plus the parser's or validator's message (which states the expected form).
//! Shared by the config loader and `nodeward render --values`.

use std::path::PathBuf;

use serde::de::DeserializeOwned;

/// A TOML file that did not parse or did not validate.
#[derive(Debug, thiserror::Error)]
#[error("{path}:{line}:{column}: {}{message}", key.as_deref().map(|k| format!("key `{k}`: ")).unwrap_or_default(), path = path.display())]
pub struct Error {
    /// The file.
    pub path: PathBuf,
    /// 1-based line of the offending key or value.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// Dotted key path, when known (`drain.timeout`).
    pub key: Option<String>,
    /// What is wrong, and the expected form.
    pub message: String,
}

/// Deserializes `text` (read from `path`) into `T`.
pub fn parse<T: DeserializeOwned>(path: &std::path::Path, text: &str) -> Result<T, Error> {
    let invalid = |err: toml::de::Error, key: Option<String>| {
        let (line, column) = err.span().map_or((1, 1), |span| line_col(text, span.start));
        Error {
            path: path.to_path_buf(),
            line,
            column,
            key: key.filter(|k| !k.is_empty() && k != "."),
            message: err.message().trim_end().to_string(),
        }
    };
    let de = toml::Deserializer::parse(text).map_err(|e| invalid(e, None))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        invalid(e.into_inner(), Some(key))
    })
}

/// 1-based line and column of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rfind('\n').map_or(before.chars().count(), |nl| {
        before[nl + 1..].chars().count()
    }) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::line_col;

    #[test]
    fn line_and_column() {
        let t = "a = 1\nbb = 2\n";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 6), (2, 1));
        assert_eq!(line_col(t, 11), (2, 6));
        assert_eq!(line_col(t, 999), (3, 1));
    }
}
