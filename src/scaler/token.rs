//! Bootstrap tokens minted per scale-up batch: a kubeadm-format token stored as the Secret
//! `kube-system/bootstrap-token-<id>` that kube-apiserver's bootstrap authenticator reads.
//!
//! A token lives at most an hour (`token_ttl`), so user data that leaks from a provider's
//! metadata service is useless soon after; each batch gets its own so one leak opens one batch.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret as KubeSecret;
use kube::api::{Api, ObjectMeta, PostParams};
use rand::Rng;

use crate::render::values::BootstrapToken;
use crate::secret::Secret;

/// Where kube-apiserver looks for bootstrap tokens.
pub const TOKEN_NAMESPACE: &str = "kube-system";
/// The Secret type of bootstrap tokens.
pub const TOKEN_TYPE: &str = "bootstrap.kubernetes.io/token";
/// Name prefix of bootstrap token Secrets.
pub const TOKEN_PREFIX: &str = "bootstrap-token-";
/// Ids are random; a clash with an existing token is retried this many times.
const MINT_ATTEMPTS: usize = 5;

/// Errors minting a token.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Secret could not be created.
    #[error("cannot create bootstrap token secret {TOKEN_NAMESPACE}/{TOKEN_PREFIX}{id}: {source}")]
    Create {
        /// Token id (public).
        id: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// A fresh random token.
pub fn generate(rng: &mut impl Rng) -> BootstrapToken {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut part = |n: usize| -> String {
        (0..n)
            .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
            .collect()
    };
    BootstrapToken {
        id: part(6),
        secret: Secret::new(part(16)),
    }
}

/// The Secret that makes `token` valid until `expires`.
pub fn secret_object(
    token: &BootstrapToken,
    expires: Timestamp,
    extra_groups: &[String],
    group: &str,
) -> KubeSecret {
    let mut data = BTreeMap::from([
        ("token-id".to_string(), token.id.clone()),
        ("token-secret".to_string(), token.secret.expose().clone()),
        ("expiration".to_string(), expires.to_string()),
        (
            "usage-bootstrap-authentication".to_string(),
            "true".to_string(),
        ),
        ("usage-bootstrap-signing".to_string(), "true".to_string()),
        (
            "description".to_string(),
            format!("nodeward scaler: scale-up of node group {group}"),
        ),
    ]);
    if !extra_groups.is_empty() {
        data.insert("auth-extra-groups".into(), extra_groups.join(","));
    }
    KubeSecret {
        metadata: ObjectMeta {
            name: Some(format!("{TOKEN_PREFIX}{}", token.id)),
            namespace: Some(TOKEN_NAMESPACE.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "nodeward-scaler".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some(TOKEN_TYPE.into()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..KubeSecret::default()
    }
}

/// Mints a token valid until `expires` and stores its Secret.
pub async fn mint(
    client: &kube::Client,
    expires: Timestamp,
    extra_groups: &[String],
    group: &str,
) -> Result<BootstrapToken, Error> {
    let api: Api<KubeSecret> = Api::namespaced(client.clone(), TOKEN_NAMESPACE);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let token = generate(&mut rand::rng());
        match api
            .create(
                &PostParams::default(),
                &secret_object(&token, expires, extra_groups, group),
            )
            .await
        {
            Ok(_) => return Ok(token),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < MINT_ATTEMPTS => continue,
            Err(source) => {
                return Err(Error::Create {
                    id: token.id,
                    source,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_have_kubeadm_form_and_a_complete_secret() {
        let t = generate(&mut rand::rng());
        let parsed = BootstrapToken::parse(&t.expose()).expect("kubeadm form");
        assert_eq!(parsed.id, t.id);
        let expires: Timestamp = "2026-01-01T01:00:00Z".parse().expect("time");
        let s = secret_object(
            &t,
            expires,
            &["system:bootstrappers:kubeadm:default-node-token".into()],
            "web",
        );
        assert_eq!(s.type_.as_deref(), Some(TOKEN_TYPE));
        assert_eq!(s.metadata.name, Some(format!("bootstrap-token-{}", t.id)));
        let data = s.data.expect("data");
        let get = |k: &str| String::from_utf8(data[k].0.clone()).expect("utf8");
        assert_eq!(get("token-id"), t.id);
        assert_eq!(&get("token-secret"), t.secret.expose());
        assert_eq!(get("expiration"), "2026-01-01T01:00:00Z");
        assert_eq!(get("usage-bootstrap-authentication"), "true");
        assert_eq!(get("usage-bootstrap-signing"), "true");
        assert_eq!(
            get("auth-extra-groups"),
            "system:bootstrappers:kubeadm:default-node-token"
        );
    }
}
