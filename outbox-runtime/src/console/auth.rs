//! Who may use the console: [`ConsoleAuth`], and the checks every request passes before a
//! handler runs.

use std::{fmt, sync::Arc};

use axum::{
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use sha2::{Digest, Sha256};

use super::api::ApiError;

/// The shortest bearer token accepted: shorter ones are guessable.
const MIN_TOKEN_CHARS: usize = 16;

/// The authenticated operator: the actor recorded in the audit table for every write.
///
/// With [`ConsoleAuth::extension`], the service's own layer (in front of the console's router)
/// puts it into the request's extensions once it has authenticated the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator(pub String);

/// How the console authenticates a request. No variant lets a request through without an
/// [`Operator`].
#[derive(Clone)]
pub struct ConsoleAuth {
    mode: Mode,
}

#[derive(Clone)]
enum Mode {
    /// `Authorization: Bearer <token>`; each token's SHA-256 and the operator it stands for.
    Tokens(Arc<Vec<([u8; 32], String)>>),
    /// An [`Operator`] in the request's extensions, put there by the service's own layer.
    Extension,
}

impl fmt::Debug for ConsoleAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.mode {
            // Never the tokens, not even hashed.
            Mode::Tokens(tokens) => f
                .debug_struct("ConsoleAuth::Bearer")
                .field(
                    "operators",
                    &tokens.iter().map(|(_, o)| o).collect::<Vec<_>>(),
                )
                .finish(),
            Mode::Extension => f.write_str("ConsoleAuth::Extension"),
        }
    }
}

/// A token the console refuses to be configured with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConsoleAuthError {
    /// The token is too short to be a secret.
    #[error(
        "the console token for `{operator}` has {chars} characters; use at least {MIN_TOKEN_CHARS} random ones (e.g. `openssl rand -hex 32`)"
    )]
    TokenTooShort {
        /// The operator it was for.
        operator: String,
        /// Its length.
        chars: usize,
    },
    /// The token holds characters an `Authorization` header cannot carry.
    #[error(
        "the console token for `{operator}` must be visible ASCII without spaces (it travels in an Authorization header)"
    )]
    TokenNotPrintable {
        /// The operator it was for.
        operator: String,
    },
    /// No operator name.
    #[error(
        "a console token needs an operator name: it is the actor of every action taken with it"
    )]
    NoOperator,
    /// No token at all.
    #[error("no console token configured")]
    NoTokens,
}

impl ConsoleAuth {
    /// One bearer token; requests carrying it act as `operator`.
    pub fn bearer(
        operator: impl Into<String>,
        token: impl AsRef<str>,
    ) -> Result<Self, ConsoleAuthError> {
        Self::bearer_tokens([(operator.into(), token.as_ref().to_owned())])
    }

    /// Several bearer tokens, one per operator.
    pub fn bearer_tokens<I, O, T>(tokens: I) -> Result<Self, ConsoleAuthError>
    where
        I: IntoIterator<Item = (O, T)>,
        O: Into<String>,
        T: AsRef<str>,
    {
        let mut list = Vec::new();
        for (operator, token) in tokens {
            let operator = operator.into();
            let token = token.as_ref();
            if operator.trim().is_empty() {
                return Err(ConsoleAuthError::NoOperator);
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ConsoleAuthError::TokenNotPrintable { operator });
            }
            let chars = token.chars().count();
            if chars < MIN_TOKEN_CHARS {
                return Err(ConsoleAuthError::TokenTooShort { operator, chars });
            }
            list.push((Sha256::digest(token.as_bytes()).into(), operator));
        }
        if list.is_empty() {
            return Err(ConsoleAuthError::NoTokens);
        }
        Ok(ConsoleAuth {
            mode: Mode::Tokens(Arc::new(list)),
        })
    }

    /// The service authenticates: its own tower layer, in front of the console's router, puts an
    /// [`Operator`] into each request's extensions. A request without one is answered 401.
    pub fn extension() -> Self {
        ConsoleAuth {
            mode: Mode::Extension,
        }
    }

    /// The operator a request authenticates as, if any.
    fn operator(&self, request: &Request) -> Option<Operator> {
        match &self.mode {
            Mode::Extension => request.extensions().get::<Operator>().cloned(),
            Mode::Tokens(tokens) => {
                let given = bearer(request.headers())?;
                let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
                // Every token is compared, each in constant time.
                let mut found = None;
                for (expected, operator) in tokens.iter() {
                    if same(&digest, expected) {
                        found = Some(Operator(operator.clone()));
                    }
                }
                found
            }
        }
    }
}

/// The token of an `Authorization: Bearer …` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Equal digests, without an early exit.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a write comes from another site, as far as the browser says: its `Sec-Fetch-Site`,
/// else its `Origin` against the `Host` it was sent to. Requests without either (a script, curl)
/// are not a browser's cross-site request.
fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        return !matches!(site, "same-origin" | "none");
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest.trim_end_matches('/'));
    match (origin_host, host) {
        (Some(o), Some(h)) => !o.eq_ignore_ascii_case(h),
        _ => true,
    }
}

/// `router` behind the console's checks: authentication on every route, the cross-site check
/// on writes.
pub(super) fn guard(router: axum::Router, auth: Arc<ConsoleAuth>) -> axum::Router {
    router.layer(middleware::from_fn_with_state(auth, check))
}

async fn check(State(auth): State<Arc<ConsoleAuth>>, mut request: Request, next: Next) -> Response {
    let Some(operator) = auth.operator(&request) else {
        let mut response = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication required: send `Authorization: Bearer <token>` with a console token",
        )
        .into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"outbox console\""),
        );
        return response;
    };
    let write = !matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if write && cross_site(request.headers()) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "cross-site request refused: the console takes writes from its own page only",
        )
        .into_response();
    }
    request.extensions_mut().insert(operator.clone());
    let mut response = next.run(request).await;
    // For the request log, which runs outside this layer.
    response.extensions_mut().insert(operator);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn refuses_short_and_unprintable_tokens() {
        assert!(matches!(
            ConsoleAuth::bearer("ops", "short"),
            Err(ConsoleAuthError::TokenTooShort { chars: 5, .. })
        ));
        assert!(matches!(
            ConsoleAuth::bearer("ops", "a token with spaces in it"),
            Err(ConsoleAuthError::TokenNotPrintable { .. })
        ));
        assert!(matches!(
            ConsoleAuth::bearer(" ", "0123456789abcdef"),
            Err(ConsoleAuthError::NoOperator)
        ));
        let auth = ConsoleAuth::bearer("ops", "0123456789abcdef").unwrap();
        assert!(!format!("{auth:?}").contains("0123456789abcdef"));
    }

    #[test]
    fn tells_cross_site_writes() {
        assert!(!cross_site(&headers(&[])));
        assert!(!cross_site(&headers(&[("sec-fetch-site", "same-origin")])));
        assert!(cross_site(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(cross_site(&headers(&[("sec-fetch-site", "same-site")])));
        assert!(!cross_site(&headers(&[
            ("origin", "http://127.0.0.1:8080"),
            ("host", "127.0.0.1:8080")
        ])));
        assert!(cross_site(&headers(&[
            ("origin", "https://evil.example"),
            ("host", "127.0.0.1:8080")
        ])));
        assert!(cross_site(&headers(&[("origin", "null"), ("host", "x")])));
    }

    #[test]
    fn reads_bearer_tokens() {
        assert_eq!(
            bearer(&headers(&[("authorization", "Bearer abc")])),
            Some("abc")
        );
        assert_eq!(
            bearer(&headers(&[("authorization", "bearer abc")])),
            Some("abc")
        );
        assert_eq!(bearer(&headers(&[("authorization", "Basic abc")])), None);
        assert_eq!(bearer(&headers(&[("authorization", "Bearer ")])), None);
    }
}
