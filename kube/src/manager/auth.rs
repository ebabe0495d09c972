//! Who may read `/metrics`: what controller-runtime's `WithAuthenticationAndAuthorization`
//! filter checks, asked of the API server.
//!
//! The caller's bearer token is sent in a `TokenReview`; the user it names
//! is then checked with a `SubjectAccessReview` for `get` on the
//! non-resource URL `/metrics` (the rule a Prometheus ClusterRole grants:
//! `nonResourceURLs: ["/metrics"], verbs: ["get"]`). No token, or one the
//! API server does not accept, is answered 401; a user without the right,
//! 403. Answers are cached per token for [`CACHE_FOR`], so a scrape every
//! few seconds costs two API requests a minute, not two a scrape.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube_client::api::PostParams;
use kube_client::{Api, Client};
use parking_lot::Mutex;
use tokio::time::Instant;

/// How long an answer for a token is reused.
pub const CACHE_FOR: Duration = Duration::from_secs(10);

/// The answer for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// May read.
    Allowed,
    /// No token, or not a valid one (401).
    Unauthenticated(String),
    /// A valid user without the right (403).
    Forbidden(String),
    /// The API server could not be asked (503, not cached).
    Unavailable(String),
}

/// Checks bearer tokens against the API server, caching the answers.
pub(crate) struct Authorizer {
    client: Client,
    cache: Mutex<HashMap<String, (Instant, Verdict)>>,
}

impl Authorizer {
    pub(crate) fn new(client: Client) -> Self {
        Authorizer {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The verdict for a request whose `Authorization` header is `header`.
    pub(crate) async fn check(&self, header: Option<&str>) -> Verdict {
        let Some(token) = header
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
        else {
            return Verdict::Unauthenticated("a bearer token is required".into());
        };
        let now = Instant::now();
        if let Some((at, verdict)) = self.cache.lock().get(token)
            && now.duration_since(*at) < CACHE_FOR
        {
            return verdict.clone();
        }
        let verdict = self.ask(token).await;
        if !matches!(verdict, Verdict::Unavailable(_)) {
            let mut cache = self.cache.lock();
            // Old answers go when the cache is looked at, so it stays as
            // small as the set of tokens seen within `CACHE_FOR`.
            cache.retain(|_, (at, _)| now.duration_since(*at) < CACHE_FOR);
            cache.insert(token.to_owned(), (now, verdict.clone()));
        }
        verdict
    }

    async fn ask(&self, token: &str) -> Verdict {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let reviewed = match Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(reviewed) => reviewed,
            Err(error) => return Verdict::Unavailable(format!("TokenReview failed: {error}")),
        };
        let status = reviewed.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => {
                return Verdict::Unauthenticated(
                    status
                        .error
                        .unwrap_or_else(|| "the token was not accepted".into()),
                );
            }
        };
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        match Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
        {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => Verdict::Allowed,
            Ok(_) => Verdict::Forbidden(format!(
                "{} may not get /metrics",
                user.username.as_deref().unwrap_or("the user")
            )),
            Err(error) => Verdict::Unavailable(format!("SubjectAccessReview failed: {error}")),
        }
    }
}
