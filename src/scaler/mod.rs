//! `nodeward scaler`: node groups that grow for pending pods and shrink when idle, safely.
//!
//! The scaler keeps no state of its own. Every pass rebuilds the world from the provider's
//! machines (tagged `k8s-cluster`/`k8s-nodepool`), the Nodes (label `nodeward.io/node-group`,
//! annotation `nodeward.io/unneeded-since`) and the status ConfigMap (per-group back-off), so a
//! restart — or a new leader — resumes in-flight creations and countdowns instead of repeating
//! them. [`decide`] is pure (snapshot and `now` in, actions out) and carries the safety rules;
//! the executor only carries the actions out.

pub mod decide;
pub mod metrics;
pub mod model;
pub mod provider;
pub mod run;
pub mod token;

pub use decide::{Action, decide};

/// The cordon reason a scale-down records; a node cordoned with it is a scale-down in progress.
pub const SCALE_DOWN_REASON: &str = "nodeward scaler: scale-down";

/// A `--nodes MIN:MAX:NAME` argument that is malformed or names no configured group.
#[derive(Debug, thiserror::Error)]
#[error("--nodes {spec:?}: {problem}")]
pub struct NodesFlagError {
    /// The argument.
    pub spec: String,
    /// What is wrong.
    pub problem: String,
}

/// Applies `--nodes MIN:MAX:NAME` to a configured group, as cluster-autoscaler's flag does.
pub fn apply_nodes_flag(
    s: &mut crate::config::ScalerSettings,
    spec: &str,
) -> Result<(), NodesFlagError> {
    let fail = |problem: String| NodesFlagError {
        spec: spec.to_string(),
        problem,
    };
    let mut parts = spec.splitn(3, ':');
    let (Some(min), Some(max), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(fail("expected MIN:MAX:NAME, e.g. 1:10:web".into()));
    };
    let min: u32 = min
        .parse()
        .map_err(|_| fail(format!("MIN {min:?} is not a whole number")))?;
    let max: u32 = max
        .parse()
        .map_err(|_| fail(format!("MAX {max:?} is not a whole number")))?;
    if min > max {
        return Err(fail(format!("MIN {min} is above MAX {max}")));
    }
    let known: Vec<String> = s.groups.iter().map(|g| g.name.clone()).collect();
    let g = s.groups.iter_mut().find(|g| g.name == name).ok_or_else(|| {
        fail(format!(
            "no [[scaler.groups]] named {name:?} (configured: {}); a group needs its provider settings in the config",
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        ))
    })?;
    g.min = min;
    g.max = max;
    Ok(())
}

/// The provider `[scaler]` selects. `env_token` is `CHERRY_AUTH_TOKEN`'s value, if set.
pub fn provider_from_settings(
    s: &crate::config::ScalerSettings,
    env_token: Option<String>,
) -> provider::Result<provider::AnyProvider> {
    Ok(match s.provider {
        crate::config::ProviderKind::Cherry => provider::AnyProvider::Cherry(
            provider::cherry::Cherry::new(&s.cherry, &s.cluster_name, env_token)?,
        ),
        crate::config::ProviderKind::Exec => {
            provider::AnyProvider::Exec(provider::exec::Exec::new(&s.exec, &s.cluster_name)?)
        }
    })
}

/// This replica's Lease identity: the hostname (the pod name in a Deployment) and a random
/// suffix, so a restarted process never mistakes its predecessor's Lease for its own.
pub fn identity() -> String {
    let host = crate::events::hostname().unwrap_or_else(|| "nodeward-scaler".into());
    format!("{host}_{}", crate::render::values::rand8())
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_flag() {
        let mut s = crate::config::parse(&[crate::config::Source {
            path: "a.toml".into(),
            text: "[[scaler.groups]]\nname = \"web\"\nmax = 3\n".into(),
        }])
        .expect("config")
        .scaler;
        apply_nodes_flag(&mut s, "2:10:web").expect("applies");
        assert_eq!((s.groups[0].min, s.groups[0].max), (2, 10));
        for (bad, want) in [
            ("2:10", "MIN:MAX:NAME"),
            ("x:10:web", "not a whole number"),
            ("5:1:web", "above MAX"),
            ("1:2:gpu", "configured: web"),
        ] {
            let e = apply_nodes_flag(&mut s, bad).expect_err(bad).to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }
}
