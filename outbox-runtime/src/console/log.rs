//! What the console adds to every answer on its way out: the headers that keep the API's answers
//! private, and a line in the service's log.

use std::time::Instant;

use axum::{
    extract::Request,
    http::{HeaderValue, header},
    middleware::Next,
    response::Response,
};

use super::{Operator, api::Cause, set::Selected};

/// The longest path written to the log, in characters (a path is the client's text).
const MAX_LOGGED_PATH: usize = 200;

/// `Cache-Control: no-store` and `X-Content-Type-Options: nosniff` on an API answer: dead letters
/// and the audit trail are not for a browser's or a proxy's cache, and an answer is never read
/// as anything but its content type.
pub(super) async fn private_answer(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// One log line per request, written when it is answered.
pub(super) async fn request(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path: String = request.uri().path().chars().take(MAX_LOGGED_PATH).collect();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let elapsed_ms = (started.elapsed().as_secs_f64() * 10_000.0).round() / 10.0;
    let operator = response
        .extensions()
        .get::<Operator>()
        .map(|o| o.0.as_str());
    // Over a set: the database it worked on.
    let database = response
        .extensions()
        .get::<Selected>()
        .map(|d| d.0.as_str());
    if response.status().is_server_error() {
        let cause = response.extensions().get::<Cause>().map(|c| c.0.as_str());
        tracing::error!(
            %method, path, status, elapsed_ms, operator, database, cause,
            "console request failed"
        );
    } else {
        tracing::info!(
            %method, path, status, elapsed_ms, operator, database,
            "console request"
        );
    }
    response
}
