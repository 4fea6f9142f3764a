//! Receiving webhooks: turn an HTTP request into an [`ExternalInbox::receive`] call and an
//! answer, independent of any web framework (feature `webhook`; [`axum`] has the
//! ready handler, feature `axum`).
//!
//! A [`Webhook`] checks a request in this order and answers:
//!
//! | answer | when | stored |
//! |---|---|---|
//! | `413` | the body is larger than [`Webhook::max_body_bytes`] | nothing |
//! | `401` | the signature check fails (missing, wrong, or a timestamp outside the tolerance) | nothing |
//! | `400` | the body is not JSON, or the message id or type cannot be found in it | nothing |
//! | `200` `received` | recorded as new and committed | PENDING row |
//! | `200` `duplicate` | recognised: same id from this source, or the same business fact | nothing new |
//! | `200` `conflict` | same id from this source with different bytes | a DEAD copy for an operator |
//! | `503` | the database is unreachable or busy, or did not answer in time (`Retry-After`) | nothing |
//!
//! `200` is answered only after the commit. A body that is JSON but not what the handler expects
//! is stored and ends DEAD with its bytes when the worker cannot decode it, for an operator to
//! look at and replay. Error bodies never contain secrets or database details.

mod signature;

#[cfg(feature = "axum")]
pub mod axum;

use std::{sync::Arc, time::Duration};

use http::{HeaderMap, HeaderName, StatusCode};

pub use signature::{HmacSha256, SignatureEncoding, SignatureError, SignatureVerifier};

use crate::inbox::{ExternalInbox, IncomingMessage, Receipt, ReceiveError};

/// Where a value of the message is found in the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// A header's value.
    Header(HeaderName),
    /// A JSON pointer into the body (`/id`, `/data/object/id`); strings are taken as they are,
    /// numbers and booleans as written.
    Json(String),
}

impl Field {
    /// A JSON pointer into the body, e.g. `/data/object/id`.
    pub fn json(pointer: impl Into<String>) -> Self {
        Field::Json(pointer.into())
    }

    /// A header, e.g. `webhook-id`.
    pub fn header(name: &'static str) -> Self {
        Field::Header(HeaderName::from_static(name))
    }

    fn read(&self, headers: &HeaderMap, body: &serde_json::Value) -> Result<String, String> {
        match self {
            Field::Header(name) => headers
                .get(name)
                .ok_or_else(|| format!("header `{name}` is missing"))?
                .to_str()
                .map(str::to_owned)
                .map_err(|_| format!("header `{name}` is not text")),
            Field::Json(pointer) => match body.pointer(pointer) {
                None | Some(serde_json::Value::Null) => {
                    Err(format!("the body has no value at `{pointer}`"))
                }
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                    Ok(v.to_string())
                }
                Some(_) => Err(format!(
                    "the value at `{pointer}` is an object or an array, not a key"
                )),
            },
        }
    }
}

/// What to answer a request: status, a JSON body, and for `503` how soon to try again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookResponse {
    /// The status code.
    pub status: StatusCode,
    /// A JSON object: `{"status": …}` for a 200, `{"error": …}` otherwise.
    pub body: String,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
    /// What was done with the message, for a `200`.
    pub receipt: Option<Receipt>,
}

impl WebhookResponse {
    fn ok(receipt: Receipt, message_id: &str) -> Self {
        let status = match &receipt {
            Receipt::New => "received",
            Receipt::Duplicate { .. } | Receipt::SameBusinessFact { .. } => "duplicate",
            Receipt::Conflict { .. } => "conflict",
        };
        WebhookResponse {
            status: StatusCode::OK,
            body: serde_json::json!({ "status": status, "message_id": message_id }).to_string(),
            retry_after: None,
            receipt: Some(receipt),
        }
    }

    pub(crate) fn error(status: StatusCode, error: impl Into<String>) -> Self {
        WebhookResponse {
            status,
            body: serde_json::json!({ "error": error.into() }).to_string(),
            retry_after: (status == StatusCode::SERVICE_UNAVAILABLE).then_some(5),
            receipt: None,
        }
    }
}

/// Headers never kept with a message, whatever [`Webhook::keep_header`] asked for.
const NEVER_KEPT: [&str; 4] = crate::util::text::CREDENTIAL_HEADERS;

/// A webhook endpoint: one consumer, one source. See the module docs for what it answers.
///
/// ```no_run
/// # use outbox_runtime::{inbox::ExternalInbox, webhook::{Field, HmacSha256, Webhook}};
/// # fn f(db: sea_orm::DatabaseConnection) {
/// let webhook = Webhook::new(
///     ExternalInbox::new(db),
///     "billing",
///     "payments-provider",
///     HmacSha256::new(std::env::var("WEBHOOK_SECRET").unwrap()),
/// )
/// .message_id(Field::json("/id"))
/// .message_type(Field::json("/type"))
/// .business_key(Field::json("/data/payment_id"))
/// .ordering_key(Field::json("/data/customer_id"));
/// # }
/// ```
#[derive(Clone)]
pub struct Webhook {
    inbox: ExternalInbox,
    consumer: String,
    source: String,
    verifier: Option<Arc<dyn SignatureVerifier>>,
    message_id: Field,
    message_type: Field,
    business_key: Option<Field>,
    ordering_key: Option<Field>,
    keep_headers: Vec<HeaderName>,
    max_body_bytes: usize,
    database_timeout: Duration,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("consumer", &self.consumer)
            .field("source", &self.source)
            .field("signed", &self.verifier.is_some())
            .field("message_id", &self.message_id)
            .field("message_type", &self.message_type)
            .field("business_key", &self.business_key)
            .field("ordering_key", &self.ordering_key)
            .field("max_body_bytes", &self.max_body_bytes)
            .finish_non_exhaustive()
    }
}

impl Webhook {
    /// An endpoint recording messages of `source` for `consumer`, each request checked by
    /// `verifier`. By default the message id is the body's `/id` and its type the body's
    /// `/type`, with no business or ordering key, bodies up to 256 KiB, and `content-type` kept.
    pub fn new(
        inbox: ExternalInbox,
        consumer: impl Into<String>,
        source: impl Into<String>,
        verifier: impl SignatureVerifier,
    ) -> Self {
        Webhook {
            verifier: Some(Arc::new(verifier)),
            ..Webhook::unsigned(inbox, consumer, source)
        }
    }

    /// An endpoint that checks no signature: only behind an authentication of your own (a
    /// `tower` layer, mutual TLS, a private network).
    pub fn unsigned(
        inbox: ExternalInbox,
        consumer: impl Into<String>,
        source: impl Into<String>,
    ) -> Self {
        Webhook {
            inbox,
            consumer: consumer.into(),
            source: source.into(),
            verifier: None,
            message_id: Field::json("/id"),
            message_type: Field::json("/type"),
            business_key: None,
            ordering_key: None,
            keep_headers: vec![http::header::CONTENT_TYPE],
            max_body_bytes: 256 * 1024,
            database_timeout: Duration::from_secs(10),
        }
    }

    /// Where the message id is.
    pub fn message_id(mut self, field: Field) -> Self {
        self.message_id = field;
        self
    }

    /// Where the message type is.
    pub fn message_type(mut self, field: Field) -> Self {
        self.message_type = field;
        self
    }

    /// Where the business key is (the same business fact under two message ids is recorded
    /// once). A request without it is refused with `400`.
    pub fn business_key(mut self, field: Field) -> Self {
        self.business_key = Some(field);
        self
    }

    /// Where the ordering key is (messages with the same key are handled in arrival order). A
    /// request without it is refused with `400`.
    pub fn ordering_key(mut self, field: Field) -> Self {
        self.ordering_key = Some(field);
        self
    }

    /// Keep this header with each message (handlers see it in `EventMeta::headers`).
    /// Credentials (`authorization`, cookies) and the signature's headers are never kept.
    pub fn keep_header(mut self, name: HeaderName) -> Self {
        let signature_header = self
            .verifier
            .as_ref()
            .is_some_and(|v| v.header_names().contains(&name));
        if !NEVER_KEPT.contains(&name.as_str()) && !signature_header {
            self.keep_headers.push(name);
        }
        self
    }

    /// Largest body accepted, in bytes (default 256 KiB); larger is answered `413`.
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// The largest body accepted, in bytes.
    pub fn body_limit(&self) -> usize {
        self.max_body_bytes
    }

    /// How long recording may take before the request is answered `503` (default 10 s).
    pub fn database_timeout(mut self, timeout: Duration) -> Self {
        self.database_timeout = timeout;
        self
    }

    /// The answer to a request whose body was larger than the limit.
    pub fn too_large(&self, bytes: Option<u64>) -> WebhookResponse {
        let size = bytes.map_or_else(|| "larger".to_owned(), |n| format!("{n} bytes"));
        WebhookResponse::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the body is {size}; this endpoint accepts at most {} bytes",
                self.max_body_bytes
            ),
        )
    }

    /// Check and record one request (see the module docs); answer with what this returns, and
    /// only once it returned.
    pub async fn handle(&self, headers: &HeaderMap, body: &[u8]) -> WebhookResponse {
        if body.len() > self.max_body_bytes {
            return self.too_large(Some(body.len() as u64));
        }
        if let Some(verifier) = &self.verifier
            && let Err(error) = verifier.verify(headers, body, std::time::SystemTime::now())
        {
            tracing::warn!(consumer = %self.consumer, source = %self.source, %error, "webhook refused");
            return WebhookResponse::error(StatusCode::UNAUTHORIZED, error.to_string());
        }
        let message = match self.message(headers, body) {
            Ok(message) => message,
            Err(error) => {
                tracing::warn!(consumer = %self.consumer, source = %self.source, %error, "unreadable webhook refused");
                return WebhookResponse::error(StatusCode::BAD_REQUEST, error);
            }
        };
        let received =
            tokio::time::timeout(self.database_timeout, self.inbox.receive(&message)).await;
        match received {
            Ok(Ok(receipt)) => {
                failpoint!(
                    crate::failpoints::WEBHOOK_AFTER_COMMIT,
                    WebhookResponse::error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "failpoint outbox::webhook::after_commit fired: the receiver stopped \
                         after the commit, before answering"
                    )
                );
                WebhookResponse::ok(receipt, &message.message_id)
            }
            Ok(Err(ReceiveError::Invalid(error))) => {
                WebhookResponse::error(StatusCode::BAD_REQUEST, error)
            }
            Ok(Err(error)) => {
                tracing::error!(consumer = %self.consumer, source = %self.source, message_id = %message.message_id, %error, "webhook not recorded; answered 503");
                let reason = match error {
                    ReceiveError::OldKey { .. } => error.to_string(),
                    _ => "the inbox could not record the message; try again later".to_owned(),
                };
                WebhookResponse::error(StatusCode::SERVICE_UNAVAILABLE, reason)
            }
            Err(_) => {
                tracing::error!(consumer = %self.consumer, source = %self.source, message_id = %message.message_id, timeout = ?self.database_timeout, "webhook not recorded in time; answered 503");
                WebhookResponse::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the inbox did not answer in time; try again later",
                )
            }
        }
    }

    /// The message a request carries, or why it cannot be read.
    fn message(&self, headers: &HeaderMap, body: &[u8]) -> Result<IncomingMessage, String> {
        let json: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
        let read = |what: &str, field: &Field| {
            field
                .read(headers, &json)
                .map_err(|e| format!("no {what}: {e}"))
        };
        let mut message = IncomingMessage::new(
            self.consumer.clone(),
            self.source.clone(),
            read("message id", &self.message_id)?,
            read("message type", &self.message_type)?,
            body.to_vec(),
        );
        if let Some(field) = &self.business_key {
            message.business_key = Some(read("business key", field)?);
        }
        if let Some(field) = &self.ordering_key {
            message.ordering_key = Some(read("ordering key", field)?);
        }
        for name in &self.keep_headers {
            if let Some(value) = headers.get(name).and_then(|v| v.to_str().ok()) {
                message = message.header(name.as_str(), value);
            }
        }
        message.validate().map_err(|e| e.to_string())?;
        Ok(message)
    }
}
