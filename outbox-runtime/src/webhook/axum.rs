//! The webhook receiver as an axum handler (feature `axum`).
//!
//! ```no_run
//! # use outbox_runtime::{inbox::ExternalInbox, webhook::{HmacSha256, Webhook}};
//! # async fn f(db: sea_orm::DatabaseConnection) -> std::io::Result<()> {
//! let webhook = Webhook::new(ExternalInbox::new(db), "billing", "payments", HmacSha256::new(b"secret".to_vec()));
//! let app = axum::Router::new().route("/webhooks/payments", outbox_runtime::webhook::axum::handler(webhook));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await
//! # }
//! ```

use axum::{
    body::Body,
    extract::State,
    http::{HeaderMap, HeaderValue, header},
    response::{IntoResponse, Response},
    routing::{MethodRouter, post},
};

use std::sync::Arc;

use super::{Webhook, WebhookResponse};

/// A `POST` route for `webhook`, to mount at any path of any router.
pub fn handler<S: Clone + Send + Sync + 'static>(webhook: Webhook) -> MethodRouter<S> {
    post(receive).with_state(Arc::new(webhook))
}

/// The handler itself, for routers whose state is an `Arc<Webhook>`: reads the body up to the
/// webhook's limit (refusing a larger one from its `Content-Length` before reading it), then
/// answers what [`Webhook::handle`] says, only after the message is committed.
pub async fn receive(
    State(webhook): State<Arc<Webhook>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let limit = webhook.body_limit();
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return respond(webhook.too_large(declared));
    }
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => bytes,
        Err(error) => {
            let over = std::error::Error::source(&error)
                .is_some_and(|e| e.is::<http_body_util::LengthLimitError>());
            if over {
                return respond(webhook.too_large(None));
            }
            return respond(WebhookResponse::error(
                axum::http::StatusCode::BAD_REQUEST,
                "the body could not be read",
            ));
        }
    };
    respond(webhook.handle(&headers, &bytes).await)
}

fn respond(answer: WebhookResponse) -> Response {
    let mut response = (
        answer.status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        answer.body,
    )
        .into_response();
    if let Some(seconds) = answer.retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}
