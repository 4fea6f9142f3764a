//! The console's web page: one HTML document with its style and script inline, compiled into
//! the binary (no CDN, works offline), served with a Content-Security-Policy that allows exactly
//! that style and that script (by their SHA-256) and requests to the page's own origin.
//!
//! The page holds no data and no configuration: it asks for a token, keeps it in the tab's
//! `sessionStorage`, and reads everything from the API with it. Everything it shows from the
//! database is set as text (`textContent`), never as markup.

use std::sync::OnceLock;

use axum::{
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
    routing::get,
};
use base64::Engine;
use sha2::{Digest, Sha256};

const TEMPLATE: &str = include_str!("page/console.html");
const STYLE: &str = include_str!("page/console.css");
const SCRIPT: &str = include_str!("page/console.js");

struct Page {
    html: String,
    policy: HeaderValue,
}

fn sha256(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(text.as_bytes()))
}

fn page() -> &'static Page {
    static PAGE: OnceLock<Page> = OnceLock::new();
    PAGE.get_or_init(|| {
        let html = TEMPLATE
            .replace("/*STYLE*/", STYLE)
            .replace("/*SCRIPT*/", SCRIPT);
        let policy = format!(
            "default-src 'none'; style-src 'sha256-{}'; script-src 'sha256-{}'; \
             connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'",
            sha256(STYLE),
            sha256(SCRIPT)
        );
        Page {
            html,
            policy: HeaderValue::from_str(&policy).expect("a header value"),
        }
    })
}

async fn index() -> Response {
    let page = page();
    let mut response = (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        page.html.clone(),
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, page.policy.clone());
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `GET /`: the page.
pub(super) fn routes() -> axum::Router {
    axum::Router::new().route("/", get(index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_carries_its_style_and_script_and_the_policy_allows_exactly_them() {
        let page = page();
        assert!(page.html.contains(STYLE) && page.html.contains(SCRIPT));
        assert!(!page.html.contains("/*STYLE*/") && !page.html.contains("/*SCRIPT*/"));
        let policy = page.policy.to_str().unwrap();
        assert!(policy.contains(&format!("'sha256-{}'", sha256(SCRIPT))));
        assert!(!policy.contains("unsafe-inline"));
        // The script builds every element from data with textContent.
        assert!(!SCRIPT.contains("innerHTML"));
    }
}
