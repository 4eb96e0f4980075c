//! `nodeward render`: cloud-init user data from a tera template and validated values.
//!
//! [`render`] is pure — template text and [`Values`] in, user data out — so the scaler calls the
//! same function for every machine it creates, and tests compare its output with golden files.
//! Values are validated before rendering (see [`values`]); template mistakes are reported with
//! the template's name, line and the offending variable. The bootstrap token is scrubbed from
//! every error message, whatever the template did with it.

pub mod values;

use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

pub use values::Values;

/// Errors from rendering or checking.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The template does not parse.
    #[error("{template}:{line}:{column}: template syntax error: {message}")]
    Syntax {
        /// Template name (its path).
        template: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What the parser expected.
        message: String,
    },
    /// The template uses a variable the values do not define.
    #[error("{template}:{}: undefined variable `{name}`: define it in the values (site-specific ones under [extra]) or guard it with `{{% if {name} is defined %}}`", line.map_or("?".to_string(), |l| l.to_string()))]
    Undefined {
        /// Template name.
        template: String,
        /// 1-based line of the first use, if found.
        line: Option<usize>,
        /// The variable.
        name: String,
    },
    /// Any other rendering failure (a filter on a wrong type, a failed include).
    #[error("{template}: cannot render: {message}")]
    Render {
        /// Template name.
        template: String,
        /// The error chain, with secrets removed.
        message: String,
    },
    /// The output is not user data cloud-init accepts.
    #[error("{template}: rendered output is not valid user data: {message}")]
    Check {
        /// Template name.
        template: String,
        /// What is wrong.
        message: String,
    },
}

/// `pub type Result` for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A taint as templates see it.
#[derive(Serialize)]
struct TemplateTaint<'a> {
    key: &'a str,
    value: Option<&'a str>,
    effect: String,
}

/// The variables templates see; documented in docs/src/bootstrap.md ("Values").
#[derive(Serialize)]
struct Context<'a> {
    cluster_name: &'a str,
    node_group: &'a str,
    api_server_endpoint: &'a str,
    api_server_url: &'a str,
    bootstrap_token: String,
    bootstrap_token_id: &'a str,
    bootstrap_token_secret: &'a str,
    ca_cert_hashes: Vec<&'a str>,
    hostname: &'a str,
    node_labels: &'a std::collections::BTreeMap<String, String>,
    /// `k=v,k2=v2` for kubelet's `--node-labels`.
    node_labels_csv: String,
    node_taints: Vec<TemplateTaint<'a>>,
    startup_taint: TemplateTaint<'a>,
    node_group_label: &'a str,
    kubernetes_version: &'a str,
    kubernetes_minor: u32,
    package_url_deb: Option<&'a str>,
    package_url_rpm: Option<&'a str>,
    extra: &'a toml::Table,
}

/// The `shell_quote` filter: a value as one POSIX shell word (`'it'\''s'`), for free-form
/// `extra` values in a script. A NUL cannot be in a shell word and is refused.
fn shell_quote(
    value: &tera::Value,
    _: &std::collections::HashMap<String, tera::Value>,
) -> tera::Result<tera::Value> {
    let s = match value {
        tera::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if s.contains('\0') {
        return Err(tera::Error::msg(
            "shell_quote: a NUL byte cannot be part of a shell word",
        ));
    }
    Ok(tera::Value::String(format!(
        "'{}'",
        s.replace('\'', "'\\''")
    )))
}

/// Renders `template` (named `name` in errors) with `values`.
pub fn render(name: &str, template: &str, values: &Values) -> Result<String> {
    let token = values.bootstrap_token.expose();
    let scrub = |s: String| {
        s.replace(&token, "***")
            .replace(values.bootstrap_token.secret.expose(), "***")
    };
    let mut tera = tera::Tera::default();
    tera.autoescape_on(vec![]);
    tera.register_filter("shell_quote", shell_quote);
    if let Err(e) = tera.add_raw_template(name, template) {
        return Err(syntax_error(name, &e, &scrub));
    }
    let ctx = Context {
        cluster_name: &values.cluster_name.0,
        node_group: &values.node_group.0,
        api_server_endpoint: &values.api_server_endpoint.host_port,
        api_server_url: &values.api_server_endpoint.url,
        bootstrap_token: token.clone(),
        bootstrap_token_id: &values.bootstrap_token.id,
        bootstrap_token_secret: values.bootstrap_token.secret.expose(),
        ca_cert_hashes: values.ca_cert_hashes.iter().map(|c| c.0.as_str()).collect(),
        hostname: &values.hostname,
        node_labels: &values.node_labels,
        node_labels_csv: values
            .node_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
        node_taints: values.node_taints.iter().map(template_taint).collect(),
        startup_taint: TemplateTaint {
            key: crate::names::STARTUP_TAINT_KEY,
            value: None,
            effect: crate::names::STARTUP_TAINT_EFFECT.to_string(),
        },
        node_group_label: crate::names::NODE_GROUP_LABEL,
        kubernetes_version: &values.kubernetes_version.full,
        kubernetes_minor: values.kubernetes_version.minor,
        package_url_deb: values.package_url.deb.as_deref(),
        package_url_rpm: values.package_url.rpm.as_deref(),
        extra: &values.extra,
    };
    let context = tera::Context::from_serialize(&ctx).map_err(|e| Error::Render {
        template: name.to_string(),
        message: scrub(error_chain(&e)),
    })?;
    let mut out = tera
        .render(name, &context)
        .map_err(|e| render_error(name, template, &e, &scrub))?;
    // tera drops the template's final newline; POSIX text files and YAML tools expect one.
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

fn template_taint(t: &crate::validate::Taint) -> TemplateTaint<'_> {
    TemplateTaint {
        key: &t.key,
        value: t.value.as_deref(),
        effect: t.effect.to_string(),
    }
}

/// The whole `source()` chain of an error, joined.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    parts.join(": ")
}

static PEST_POSITION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"-->\s*(\d+):(\d+)").unwrap_or_else(|e| panic!("built-in regex: {e}"))
});
static PEST_EXPECTED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?m)^\s*=\s*(.+)$").unwrap_or_else(|e| panic!("built-in regex: {e}"))
});
static UNDEFINED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"Variable `([^`]+)` not found").unwrap_or_else(|e| panic!("built-in regex: {e}"))
});

fn syntax_error(name: &str, e: &tera::Error, scrub: &dyn Fn(String) -> String) -> Error {
    let chain = error_chain(e);
    let (line, column) = PEST_POSITION.captures(&chain).map_or((1, 1), |c| {
        (c[1].parse().unwrap_or(1), c[2].parse().unwrap_or(1))
    });
    let message = PEST_EXPECTED
        .captures(&chain)
        .map_or_else(|| chain.clone(), |c| c[1].trim().to_string());
    Error::Syntax {
        template: name.to_string(),
        line,
        column,
        message: scrub(message),
    }
}

fn render_error(
    name: &str,
    template: &str,
    e: &tera::Error,
    scrub: &dyn Fn(String) -> String,
) -> Error {
    let chain = error_chain(e);
    if let Some(c) = UNDEFINED.captures(&chain) {
        let var = c[1].to_string();
        return Error::Undefined {
            template: name.to_string(),
            line: first_use(template, &var),
            name: var,
        };
    }
    Error::Render {
        template: name.to_string(),
        message: scrub(chain),
    }
}

/// Line of the first use of `var` inside a `{{ }}` or `{% %}` tag. tera 1 reports undefined
/// variables without a position, so the template is searched for the name as a whole word.
fn first_use(template: &str, var: &str) -> Option<usize> {
    let word = Regex::new(&format!(
        r"(^|[^A-Za-z0-9_.]){}($|[^A-Za-z0-9_])",
        regex::escape(var)
    ))
    .ok()?;
    let tag = Regex::new(r"(?s)\{\{.*?\}\}|\{%.*?%\}").ok()?;
    tag.find_iter(template)
        .find(|m| word.is_match(m.as_str()))
        .map(|m| template[..m.start()].matches('\n').count() + 1)
}

/// What kind of user data a rendered template is, from its first line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserDataKind {
    /// `#cloud-config` YAML.
    CloudConfig,
    /// A `#!` script cloud-init runs.
    Script,
    /// A MIME multipart archive of several parts.
    Multipart,
}

/// `--check`: the output must declare its kind on the first line, and `#cloud-config` must be a
/// YAML mapping.
pub fn check(name: &str, output: &str) -> Result<UserDataKind> {
    let fail = |message: String| Error::Check {
        template: name.to_string(),
        message,
    };
    let first = output.lines().next().unwrap_or("").trim_end();
    if first == "#cloud-config" {
        let doc: serde_norway::Value = serde_norway::from_str(output).map_err(|e| {
            let at = e.location().map_or(String::new(), |l| {
                format!(" at line {}, column {}", l.line(), l.column())
            });
            fail(format!("YAML does not parse{at}: {e}"))
        })?;
        if !doc.is_mapping() {
            return Err(fail(
                "a #cloud-config document must be a YAML mapping".into(),
            ));
        }
        Ok(UserDataKind::CloudConfig)
    } else if first.starts_with("#!") {
        Ok(UserDataKind::Script)
    } else if first
        .to_ascii_lowercase()
        .starts_with("content-type: multipart/")
    {
        Ok(UserDataKind::Multipart)
    } else {
        Err(fail(format!(
            "the first line is {first:?}: expected #cloud-config, a #! script line, or a MIME multipart Content-Type header"
        )))
    }
}

#[cfg(test)]
mod tests;
