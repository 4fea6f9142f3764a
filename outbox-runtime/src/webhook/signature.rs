//! Signature checks of webhook requests: the [`SignatureVerifier`] trait and [`HmacSha256`], the
//! common "timestamp + signature header" scheme with a tolerance against replays.
//!
//! Secrets never appear in logs, errors or `Debug` output, and a failed check says what was
//! wrong with the request (a missing header, a stale timestamp, no matching signature), never
//! what the signature should have been.

use std::{
    fmt,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::util::text::hex;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName};

/// Why a request's signature was refused (answered `401`). The text is safe to send back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("signature check failed: {0}")]
pub struct SignatureError(pub String);

/// Checks that a request comes from the sender it claims to (answered `401` when not).
pub trait SignatureVerifier: Send + Sync + 'static {
    /// Check the request's headers and raw body; `now` is the receiving host's clock, for the
    /// replay tolerance.
    fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), SignatureError>;

    /// The headers the check reads: never kept with a stored message.
    fn header_names(&self) -> Vec<HeaderName> {
        Vec::new()
    }
}

/// A secret that never shows itself.
#[derive(Clone)]
struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// How a signature is written in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureEncoding {
    /// Lower- or upper-case hexadecimal.
    Hex,
    /// Standard base64 with padding.
    Base64,
}

#[derive(Debug, Clone)]
enum Layout {
    /// A timestamp header, and a signature header holding one or more `{prefix}{signature}`
    /// separated by spaces or commas (several during a secret rotation).
    Separate {
        timestamp: HeaderName,
        signature: HeaderName,
        prefix: String,
        encoding: SignatureEncoding,
    },
    /// One header `t={timestamp},v1={hex signature}[,v1=…]`.
    Combined { header: HeaderName },
}

/// HMAC-SHA256 over `"{timestamp}.{body}"`, with the timestamp (Unix seconds) in a header and
/// checked against a tolerance (default 5 minutes either way), so a captured request cannot be
/// replayed later.
///
/// Two header layouts:
/// - [`HmacSha256::new`]: `webhook-timestamp: 1767225600` and
///   `webhook-signature: v1=5257a8…` (header names, prefix and encoding configurable);
/// - [`HmacSha256::combined`]: one header `t=1767225600,v1=5257a8…`.
///
/// More than one secret may be accepted at once ([`also_accept`](Self::also_accept)), for
/// rotating them.
///
/// ```
/// # use outbox_runtime::webhook::{HmacSha256, SignatureVerifier};
/// # use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// let verifier = HmacSha256::new(b"whsec_test".to_vec());
/// let now = SystemTime::now();
/// let seconds = now.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
/// let headers = verifier.sign(seconds, br#"{"id":"evt_1"}"#);
/// assert!(verifier.verify(&headers, br#"{"id":"evt_1"}"#, now).is_ok());
/// assert!(verifier.verify(&headers, br#"{"id":"evt_2"}"#, now).is_err());
/// let later = now + Duration::from_secs(3600);
/// assert!(verifier.verify(&headers, br#"{"id":"evt_1"}"#, later).is_err());
/// ```
#[derive(Debug, Clone)]
pub struct HmacSha256 {
    secrets: Vec<Secret>,
    layout: Layout,
    tolerance: Duration,
}

type Hmac256 = Hmac<sha2::Sha256>;

/// Longest signature header read (a few signatures during a rotation).
const MAX_SIGNATURE_HEADER: usize = 1024;

impl HmacSha256 {
    /// Separate headers: `webhook-timestamp` (Unix seconds) and `webhook-signature`
    /// (`v1=` then the hex HMAC-SHA256 of `"{timestamp}.{body}"`).
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        HmacSha256 {
            secrets: vec![Secret(secret.into())],
            layout: Layout::Separate {
                timestamp: HeaderName::from_static("webhook-timestamp"),
                signature: HeaderName::from_static("webhook-signature"),
                prefix: "v1=".to_owned(),
                encoding: SignatureEncoding::Hex,
            },
            tolerance: Duration::from_secs(300),
        }
    }

    /// One header `header: t={timestamp},v1={hex signature}` (several `v1=` during a rotation).
    pub fn combined(secret: impl Into<Vec<u8>>, header: HeaderName) -> Self {
        HmacSha256 {
            layout: Layout::Combined { header },
            ..HmacSha256::new(secret)
        }
    }

    /// Also accept signatures made with `secret` (while rotating secrets).
    pub fn also_accept(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secrets.push(Secret(secret.into()));
        self
    }

    /// How far the request's timestamp may be from this host's clock (default 5 minutes).
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The timestamp header (separate layout).
    pub fn timestamp_header(mut self, name: HeaderName) -> Self {
        if let Layout::Separate { timestamp, .. } = &mut self.layout {
            *timestamp = name;
        }
        self
    }

    /// The signature header (separate layout).
    pub fn signature_header(mut self, name: HeaderName) -> Self {
        if let Layout::Separate { signature, .. } = &mut self.layout {
            *signature = name;
        }
        self
    }

    /// What comes before each signature (separate layout; default `v1=`, empty for none).
    pub fn signature_prefix(mut self, value: impl Into<String>) -> Self {
        if let Layout::Separate { prefix, .. } = &mut self.layout {
            *prefix = value.into();
        }
        self
    }

    /// How signatures are encoded (separate layout; default hex).
    pub fn encoding(mut self, value: SignatureEncoding) -> Self {
        if let Layout::Separate { encoding, .. } = &mut self.layout {
            *encoding = value;
        }
        self
    }

    /// The headers a sender sets for `body` at `timestamp` (Unix seconds), signed with the first
    /// secret: for senders, examples and tests.
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> HeaderMap {
        let mac = keyed(&self.secrets[0], &timestamp.to_string(), body)
            .finalize()
            .into_bytes();
        let mut headers = HeaderMap::new();
        match &self.layout {
            Layout::Separate {
                timestamp: timestamp_header,
                signature,
                prefix,
                encoding,
            } => {
                let encoded = match encoding {
                    SignatureEncoding::Hex => hex(&mac),
                    SignatureEncoding::Base64 => {
                        base64::engine::general_purpose::STANDARD.encode(mac)
                    }
                };
                headers.insert(
                    timestamp_header.clone(),
                    timestamp.to_string().parse().expect("digits"),
                );
                headers.insert(
                    signature.clone(),
                    format!("{prefix}{encoded}")
                        .parse()
                        .expect("a prefix of header characters"),
                );
            }
            Layout::Combined { header } => {
                headers.insert(
                    header.clone(),
                    format!("t={timestamp},v1={}", hex(&mac))
                        .parse()
                        .expect("ASCII"),
                );
            }
        }
        headers
    }

    /// The timestamp and the candidate signatures (decoded) of a request.
    fn read(&self, headers: &HeaderMap) -> Result<(String, Vec<Vec<u8>>), SignatureError> {
        let text = |name: &HeaderName| -> Result<&str, SignatureError> {
            let value = headers
                .get(name)
                .ok_or_else(|| SignatureError(format!("header `{name}` is missing")))?;
            if value.len() > MAX_SIGNATURE_HEADER {
                return Err(SignatureError(format!("header `{name}` is too long")));
            }
            value
                .to_str()
                .map_err(|_| SignatureError(format!("header `{name}` is not ASCII")))
        };
        match &self.layout {
            Layout::Separate {
                timestamp,
                signature,
                prefix,
                encoding,
            } => {
                let timestamp = text(timestamp)?.trim().to_owned();
                let signatures = text(signature)?
                    .split([' ', ','])
                    .filter_map(|part| part.trim().strip_prefix(prefix.as_str()))
                    .filter_map(|encoded| match encoding {
                        SignatureEncoding::Hex => unhex(encoded),
                        SignatureEncoding::Base64 => base64::engine::general_purpose::STANDARD
                            .decode(encoded)
                            .ok(),
                    })
                    .collect();
                Ok((timestamp, signatures))
            }
            Layout::Combined { header } => {
                let mut timestamp = None;
                let mut signatures = Vec::new();
                for part in text(header)?.split(',') {
                    match part.trim().split_once('=') {
                        Some(("t", value)) => timestamp = Some(value.to_owned()),
                        Some(("v1", value)) => signatures.extend(unhex(value)),
                        _ => {}
                    }
                }
                let timestamp = timestamp.ok_or_else(|| {
                    SignatureError(format!("header `{header}` has no timestamp `t=`"))
                })?;
                Ok((timestamp, signatures))
            }
        }
    }
}

impl SignatureVerifier for HmacSha256 {
    fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), SignatureError> {
        let (timestamp, signatures) = self.read(headers)?;
        let seconds: i64 = timestamp
            .parse()
            .map_err(|_| SignatureError("the timestamp is not a number of seconds".to_owned()))?;
        let now = match now.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
        };
        let tolerance = self.tolerance.as_secs();
        let away = seconds.abs_diff(now);
        if away > tolerance {
            return Err(SignatureError(format!(
                "the timestamp is {away} s away from this server's clock; at most {tolerance} s \
                 are accepted"
            )));
        }
        if signatures.is_empty() {
            return Err(SignatureError(
                "no signature in the expected format".to_owned(),
            ));
        }
        // The body is hashed once per secret; each candidate is compared in constant time.
        for secret in &self.secrets {
            let mac = keyed(secret, &timestamp, body);
            if signatures
                .iter()
                .any(|signature| mac.clone().verify_slice(signature).is_ok())
            {
                return Ok(());
            }
        }
        Err(SignatureError(
            "no signature matches the body and timestamp".to_owned(),
        ))
    }

    fn header_names(&self) -> Vec<HeaderName> {
        match &self.layout {
            Layout::Separate {
                timestamp,
                signature,
                ..
            } => vec![timestamp.clone(), signature.clone()],
            Layout::Combined { header } => vec![header.clone()],
        }
    }
}

/// HMAC-SHA256 under `secret` of `"{timestamp}.{body}"`, not finalized.
fn keyed(secret: &Secret, timestamp: &str, body: &[u8]) -> Hmac256 {
    let mut mac = Hmac256::new_from_slice(&secret.0).expect("HMAC takes a key of any length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn a_signed_request_passes_and_any_change_fails() {
        let verifier = HmacSha256::new(b"s3cret".to_vec());
        let headers = verifier.sign(1_000_000, b"{\"a\":1}");
        assert_eq!(
            verifier.verify(&headers, b"{\"a\":1}", at(1_000_010)),
            Ok(())
        );
        assert_eq!(
            verifier.verify(&headers, b"{\"a\":2}", at(1_000_010)),
            Err(SignatureError(
                "no signature matches the body and timestamp".into()
            ))
        );
        let other = HmacSha256::new(b"other".to_vec());
        assert!(other.verify(&headers, b"{\"a\":1}", at(1_000_010)).is_err());
    }

    #[test]
    fn a_known_vector() {
        // HMAC-SHA256 of `1767225600.{"id":"evt_1"}` under `whsec`, computed with Python's hmac.
        let verifier = HmacSha256::new(b"whsec".to_vec());
        let body = br#"{"id":"evt_1"}"#;
        let headers = verifier.sign(1_767_225_600, body);
        assert_eq!(
            headers["webhook-signature"],
            "v1=bc5fc0c85a403f8db4e0bf59acc29c2e6c2ae54ab5ab59d324246c9ca5bd3380"
        );
        assert_eq!(headers["webhook-timestamp"], "1767225600");
    }

    #[test]
    fn the_timestamp_must_be_within_the_tolerance() {
        let verifier = HmacSha256::new(b"k".to_vec()).tolerance(Duration::from_secs(60));
        let headers = verifier.sign(1_000_000, b"{}");
        assert!(verifier.verify(&headers, b"{}", at(1_000_060)).is_ok());
        assert!(verifier.verify(&headers, b"{}", at(999_940)).is_ok());
        let stale = verifier.verify(&headers, b"{}", at(1_000_061)).unwrap_err();
        assert!(stale.0.contains("61 s away"), "{stale}");
        assert!(verifier.verify(&headers, b"{}", at(999_939)).is_err());
    }

    #[test]
    fn missing_and_malformed_headers_are_named() {
        let verifier = HmacSha256::new(b"k".to_vec());
        let error = verifier
            .verify(&HeaderMap::new(), b"{}", at(0))
            .unwrap_err();
        assert_eq!(error.0, "header `webhook-timestamp` is missing");
        let mut headers = verifier.sign(0, b"{}");
        headers.insert("webhook-signature", "sha256=00".parse().unwrap());
        assert_eq!(
            verifier.verify(&headers, b"{}", at(0)).unwrap_err().0,
            "no signature in the expected format"
        );
        headers.insert("webhook-timestamp", "yesterday".parse().unwrap());
        assert!(
            verifier
                .verify(&headers, b"{}", at(0))
                .unwrap_err()
                .0
                .contains("not a number")
        );
    }

    #[test]
    fn rotation_layouts_and_encodings() {
        let old = HmacSha256::new(b"old".to_vec());
        let rotated = HmacSha256::new(b"new".to_vec()).also_accept(b"old".to_vec());
        assert!(rotated.verify(&old.sign(5, b"x"), b"x", at(5)).is_ok());

        let combined = HmacSha256::combined(b"k".to_vec(), HeaderName::from_static("x-sig"));
        let headers = combined.sign(7, b"body");
        assert!(headers["x-sig"].to_str().unwrap().starts_with("t=7,v1="));
        assert!(combined.verify(&headers, b"body", at(7)).is_ok());
        assert!(combined.verify(&headers, b"bodY", at(7)).is_err());

        let base64 = HmacSha256::new(b"k".to_vec())
            .signature_prefix("")
            .encoding(SignatureEncoding::Base64)
            .signature_header(HeaderName::from_static("x-signature"))
            .timestamp_header(HeaderName::from_static("x-timestamp"));
        let headers = base64.sign(9, b"b");
        assert!(headers.contains_key("x-signature") && headers.contains_key("x-timestamp"));
        assert!(base64.verify(&headers, b"b", at(9)).is_ok());
    }

    #[test]
    fn secrets_never_show() {
        let verifier = HmacSha256::new(b"super-secret-value".to_vec());
        let shown = format!("{verifier:?}");
        assert!(!shown.contains("super-secret-value"), "{shown}");
        let headers = verifier.sign(0, b"x");
        let error = verifier.verify(&headers, b"y", at(0)).unwrap_err();
        assert!(!error.to_string().contains("super-secret-value"));
        assert!(!error.to_string().contains(&hex(b"super-secret-value")));
    }
}
