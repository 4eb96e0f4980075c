//! Entry points for the fuzz targets under `fuzz/` (`scripts/fuzz` runs them with cargo fuzz),
//! shared with `tests/fuzz_corpora.rs`, which replays every committed corpus file through the
//! same functions on stable Rust. Each takes arbitrary bytes, must never panic, and checks the
//! invariant its input owes the rest of nodeward.

use std::path::Path;
use std::time::Duration;

use crate::render::values::{Inputs, TokenSource, Values};
use crate::secret::Secret;

/// The names of the targets, as directories under `fuzz/corpus/`.
pub const TARGETS: &[&str] = &[
    "config",
    "render_values",
    "template",
    "quantity",
    "selector",
    "taint",
    "cherry_response",
    "exec_output",
    "drain_timeout",
];

/// Runs target `name` on `data`; `false` for an unknown name.
pub fn run(name: &str, data: &[u8]) -> bool {
    let f: fn(&[u8]) = match name {
        "config" => config,
        "render_values" => render_values,
        "template" => template,
        "quantity" => quantity,
        "selector" => selector,
        "taint" => taint,
        "cherry_response" => cherry_response,
        "exec_output" => exec_output,
        "drain_timeout" => drain_timeout,
        _ => return false,
    };
    f(data);
    true
}

const TOKEN_ID: &str = "abcdef";
const TOKEN_SECRET: &str = "0123456789abcdef";

fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

fn token() -> TokenSource {
    TokenSource {
        origin: "fuzz".into(),
        token: Secret::new(format!("{TOKEN_ID}.{TOKEN_SECRET}")),
    }
}

/// A config file: loads or is refused with a message naming the file.
pub fn config(data: &[u8]) {
    let source = crate::config::Source {
        path: "fuzz.toml".into(),
        text: text(data),
    };
    match crate::config::parse(&[source]) {
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(msg.contains("fuzz.toml"), "the error names no file: {msg}");
        }
        Ok(settings) => exercise(&settings),
    }
}

/// What the binary computes from its configuration, run once with `settings`: the scaler's
/// decision, back-off, stall limit and token expiry; the drain's schedule from start past its
/// deadline; the logind cap the agent asks for. A configuration that passes `config check`
/// (parses) must not panic any of it.
pub fn exercise(settings: &crate::config::Settings) {
    use crate::drain::step::{Limits, Schedule, Tracked};
    use crate::scaler::decide;
    let now = jiff::Timestamp::now();
    let s = &settings.scaler;
    let _ = decide::decide(&crate::scaler::model::Snapshot::default(), now, s);
    for failures in [0, 1, 2, 10, 64, u32::MAX] {
        let _ = decide::backoff_for(failures, s);
    }
    let _ = crate::scaler::run::stall_after(s);
    let _ = crate::scaler::run::token_expiry(s, now);
    let cap = crate::logind::wanted_cap(&settings.shutdown, settings.drain.timeout);
    let _ = crate::logind::dropin_text(cap);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "p",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                "uid": "r", "controller": true}]},
        "spec": {"containers": [{"name": "c"}], "priority": 2_000_000_000},
        "status": {"phase": "Running"}
    }))
    .unwrap_or_default();
    for shutdown in [false, true] {
        let opts = crate::drain::DrainOptions::for_leaving_node(&settings.drain, "fuzz", shutdown);
        let started = tokio::time::Instant::now();
        let limits = Limits {
            concurrency: opts.concurrency,
            timeout: opts.timeout,
            on_deadline: opts.on_deadline,
            unsatisfiable: opts.unsatisfiable,
        };
        let mut schedule = Schedule::new(limits, opts.plan.clone(), started);
        schedule.track(&pod, &|_, _| false);
        for at in [
            Duration::ZERO,
            opts.timeout / 2,
            opts.timeout,
            opts.timeout * 2,
        ] {
            let _ = schedule.step(started + at, &|_: &Tracked| false);
        }
    }
}

/// A values file: refused, or its values render the shipped template into user data that
/// passes the check (validated values always make valid cloud-init).
pub fn render_values(data: &[u8]) {
    let text = text(data);
    let Ok(values) = Values::build(
        Inputs {
            file: Some((Path::new("fuzz.toml"), &text)),
            sets: &[],
            token: Some(token()),
        },
        "r4nd0m8x",
    ) else {
        return;
    };
    let out = crate::render::render(
        "worker.yaml.tera",
        include_str!("../cloud-init/worker.yaml.tera"),
        &values,
    )
    .unwrap_or_else(|e| panic!("valid values do not render: {e}"));
    crate::render::check("worker.yaml.tera", &out)
        .unwrap_or_else(|e| panic!("valid values render invalid user data: {e}"));
}

/// A template, rendered with the example values: whatever it does, an error never carries the
/// bootstrap token.
pub fn template(data: &[u8]) {
    let Ok(values) = Values::build(
        Inputs {
            file: Some((
                Path::new("values.example.toml"),
                include_str!("../cloud-init/values.example.toml"),
            )),
            sets: &[],
            token: Some(token()),
        },
        "r4nd0m8x",
    ) else {
        panic!("the example values are valid");
    };
    if let Err(e) = crate::render::render("fuzz.tera", &text(data), &values) {
        let msg = e.to_string();
        assert!(!msg.contains(TOKEN_SECRET), "the token in an error: {msg}");
    }
}

/// A quantity: parsed to a non-negative amount or refused; whole units never below milli-units
/// over a thousand.
pub fn quantity(data: &[u8]) {
    let q = text(data);
    let milli = crate::resources::parse_milli(&q);
    let units = crate::resources::parse_units(&q);
    assert_eq!(milli.is_some(), units.is_some(), "{q:?}");
    if let (Some(m), Some(u)) = (milli, units) {
        assert!(m >= 0 && u >= 0, "{q:?}");
        assert!(u >= m / 1000, "{q:?}: {u} units for {m} milli-units");
    }
}

/// A label selector: parsed or refused with the accepted form; a parsed one matches labels
/// without panicking.
pub fn selector(data: &[u8]) {
    let s = text(data);
    match crate::gate::selector::Selector::parse(&s) {
        Ok(sel) => {
            let labels = [("app".to_string(), "flannel".to_string())].into();
            let _ = sel.matches(&labels);
            let _ = sel.matches(&Default::default());
        }
        Err(e) => assert!(e.contains("expected"), "{e}"),
    }
}

/// A taint (`key[=value]:Effect`): parsed or refused.
pub fn taint(data: &[u8]) {
    let _ = text(data).parse::<crate::validate::Taint>();
}

/// A page of the Cherry Servers API's server list: decoded or refused, never a panic; every
/// machine it yields is of the cluster asked about and has a hostname-bearing id.
pub fn cherry_response(data: &[u8]) {
    if let Ok(page) = crate::scaler::provider::cherry::decode_page("prod", &text(data)) {
        for (id, m) in page {
            if let Some(m) = m {
                assert_eq!(m.id, id);
            }
        }
    }
}

/// An exec provider's `list` output: decoded or refused with an error naming the provider.
pub fn exec_output(data: &[u8]) {
    if let Err(e) = crate::scaler::provider::exec::decode_list(&text(data)) {
        assert!(e.to_string().contains("exec"), "{e}");
    }
}

/// A pod's `nodeward.io/drain-timeout` annotation, as any tenant may write it: read as a wait
/// within [`MAX_BUDGET_WAIT`](crate::drain::plan::MAX_BUDGET_WAIT) or refused naming the pod and
/// the annotation; then a drain of the pod, whose budget refuses every eviction, stepped from its
/// start to past its deadline under each deadline policy, never panics.
pub fn drain_timeout(data: &[u8]) {
    use crate::config::OnDeadline;
    use crate::drain::plan::{self, Answer, Cause, DRAIN_TIMEOUT_ANNOTATION, PlanOptions};
    use crate::drain::step::{Limits, Schedule, Tracked, later};
    let value = text(data);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "fuzz", "uid": "p",
            "annotations": {DRAIN_TIMEOUT_ANNOTATION: value},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                "uid": "r", "controller": true}]},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Running"}
    }))
    .unwrap_or_default();
    match plan::budget_wait(&pod) {
        Ok(wait) => assert!(
            wait.is_some_and(|w| w <= plan::MAX_BUDGET_WAIT),
            "{value:?} read as {wait:?}"
        ),
        Err(e) => assert!(
            e.contains("fuzz/p") && e.contains(DRAIN_TIMEOUT_ANNOTATION),
            "the error names no pod or annotation: {e}"
        ),
    }
    let refused = Answer {
        code: 429,
        cause: Cause::DisruptionBudget,
        matching_budgets: 1,
        message: String::new(),
    };
    let timeout = Duration::from_secs(90);
    let plan = PlanOptions {
        force: false,
        delete_emptydir_data: false,
        waves: crate::config::Settings::default().drain.waves,
        surge: false,
    };
    for on_deadline in [OnDeadline::Abandon, OnDeadline::Delete, OnDeadline::Wait] {
        let limits = Limits {
            concurrency: 1,
            timeout,
            on_deadline,
            unsatisfiable: crate::config::UnsatisfiableBudgets::Act,
        };
        let started = tokio::time::Instant::now();
        let mut schedule = Schedule::new(limits, plan.clone(), started);
        schedule.track(&pod, &|_, _| false);
        let _ = schedule.take_notes();
        for at in [
            Duration::ZERO,
            Duration::from_secs(1),
            timeout / 2,
            timeout,
            timeout * 2,
        ] {
            let now = later(started, at);
            let _ = schedule.step(now, &|_: &Tracked| false);
            let _ = schedule.evict_answered("p", &refused, vec!["fuzz/pdb".into()], now);
        }
    }
}
