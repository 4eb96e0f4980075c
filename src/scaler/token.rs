//! Bootstrap tokens minted per scale-up batch: a kubeadm-format token stored as the Secret
//! `kube-system/bootstrap-token-<id>` that kube-apiserver's bootstrap authenticator reads.
//!
//! Each machine gets a token of its own, living at most an hour (`token_ttl`), so user data that
//! leaks from a provider's metadata service opens one machine's join, and only until the token
//! is gone: the scaler deletes it as soon as the machine's Node has registered (the kubelet holds
//! its own certificate by then), or at once when the provider refused the machine. A token whose
//! replica restarted before that expires, and kube-controller-manager's token cleaner deletes it.

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

/// The label every token the scaler mints carries; the admission policy in rbac-scaler.yaml lets
/// the scaler delete only Secrets of [`TOKEN_TYPE`] with it.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "nodeward-scaler");

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
                MANAGED_BY.0.to_string(),
                MANAGED_BY.1.to_string(),
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

/// Deletes the token `id`; one already gone counts as deleted.
pub async fn delete(client: &kube::Client, id: &str) -> Result<(), kube::Error> {
    let api: Api<KubeSecret> = Api::namespaced(client.clone(), TOKEN_NAMESPACE);
    match api
        .delete(&format!("{TOKEN_PREFIX}{id}"), &Default::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// A token this replica minted whose machine has not joined yet.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outstanding {
    id: String,
    expires: Timestamp,
}

/// Which machine each outstanding token is for, by the hostname its Node will register under.
#[derive(Debug, Default)]
pub struct Outstandings {
    by_host: BTreeMap<String, Outstanding>,
}

impl Outstandings {
    /// Remembers that `id` was minted for the machine `host`, valid until `expires`.
    pub fn minted(&mut self, host: &str, id: &str, expires: Timestamp) {
        self.by_host.insert(
            host.to_string(),
            Outstanding {
                id: id.to_string(),
                expires,
            },
        );
    }

    /// The token of `host`, forgotten: its machine will never join (the provider refused it).
    pub fn abandon(&mut self, host: &str) -> Option<String> {
        self.by_host.remove(host).map(|o| o.id)
    }

    /// The tokens no longer needed at `now`, forgotten: those whose machine's Node has
    /// registered (`registered(host)`). Expired ones are forgotten without a delete: the token
    /// cleaner deletes them, and the API server no longer accepts them.
    pub fn joined(&mut self, registered: impl Fn(&str) -> bool, now: Timestamp) -> Vec<String> {
        let mut done = Vec::new();
        self.by_host.retain(|host, o| {
            if registered(host) {
                done.push(o.id.clone());
                false
            } else {
                o.expires > now
            }
        });
        done
    }

    /// Tokens still waiting for their machine.
    pub fn len(&self) -> usize {
        self.by_host.len()
    }

    /// No token waits.
    pub fn is_empty(&self) -> bool {
        self.by_host.is_empty()
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

    #[test]
    fn a_token_goes_once_its_node_registers_and_is_forgotten_once_expired() {
        let t = |s: &str| -> Timestamp { s.parse().expect("time") };
        let mut o = Outstandings::default();
        o.minted("web-a", "aaaaaa", t("2026-01-01T01:00:00Z"));
        o.minted("web-b", "bbbbbb", t("2026-01-01T01:00:00Z"));
        o.minted("web-c", "cccccc", t("2026-01-01T00:30:00Z"));
        assert!(o.joined(|_| false, t("2026-01-01T00:10:00Z")).is_empty());
        assert_eq!(o.len(), 3);
        assert_eq!(
            o.joined(|h| h == "web-a", t("2026-01-01T00:20:00Z")),
            vec!["aaaaaa".to_string()]
        );
        assert_eq!(o.abandon("web-b"), Some("bbbbbb".into()));
        assert_eq!(o.abandon("web-b"), None);
        // web-c's token expired: nothing to delete, nothing kept.
        assert!(o.joined(|_| false, t("2026-01-01T00:30:00Z")).is_empty());
        assert!(o.is_empty());
    }
}
