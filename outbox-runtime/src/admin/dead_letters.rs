//! Listing and reading dead letters.

use sea_orm::DatabaseConnection;

use super::{AdminError, DeadLetter, DeadLetterDetail, DeadLetterFilter, Source, Target, db_error};
use crate::store::admin as sql;

/// A page of a listing: at most `limit` items after skipping `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    /// Items per page (1 to 1,000). Default 50.
    pub limit: u32,
    /// Items skipped.
    pub offset: u64,
}

impl Default for Page {
    fn default() -> Self {
        Page {
            limit: 50,
            offset: 0,
        }
    }
}

impl Page {
    /// The largest page.
    pub const MAX_LIMIT: u32 = 1_000;

    /// Page `number` (from 1) of pages of `limit` items.
    pub fn number(number: u64, limit: u32) -> Self {
        let limit = limit.clamp(1, Self::MAX_LIMIT);
        Page {
            limit,
            offset: number.saturating_sub(1).saturating_mul(u64::from(limit)),
        }
    }
}

/// Dead outbox events and inbox messages matching `filter`, newest first (by `created_at` /
/// `received_at`, then id), one page of them.
pub async fn dead_letters(
    db: &DatabaseConnection,
    filter: &DeadLetterFilter,
    page: Page,
) -> Result<Vec<DeadLetter>, AdminError> {
    let limit = u64::from(page.limit.clamp(1, Page::MAX_LIMIT));
    let want = page.offset.saturating_add(limit);
    let mut all = Vec::new();
    for source in filter.sources()? {
        all.extend(
            sql::dead_letters(db, source, filter, want)
                .await
                .map_err(db_error("listing dead letters"))?,
        );
    }
    all.sort_by(|a, b| {
        b.arrived_at
            .cmp(&a.arrived_at)
            .then(a.target.source.cmp(&b.target.source))
            .then(b.target.id.cmp(&a.target.id))
    });
    Ok(all
        .into_iter()
        .skip(usize::try_from(page.offset).unwrap_or(usize::MAX))
        .take(usize::try_from(limit).unwrap_or(usize::MAX))
        .collect())
}

/// One outbox or inbox row in full, whatever its status.
pub async fn dead_letter(
    db: &DatabaseConnection,
    which: Target,
) -> Result<DeadLetterDetail, AdminError> {
    let found = match which.source {
        Source::Outbox => sql::outbox_detail(db, which.id).await,
        Source::Inbox => sql::inbox_detail(db, which.id).await,
    }
    .map_err(db_error("reading a row"))?;
    let mut detail = found.ok_or_else(|| AdminError::NotFound(which.to_string()))?;
    if let Some(headers) = &mut detail.headers {
        mask_secrets(headers);
    }
    Ok(detail)
}

/// What replaces the value of a header that may hold a credential.
const MASKED: &str = "***";

/// Whether a header of this name may hold a credential or a signature: its value is shown as
/// [`MASKED`].
fn secret_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    crate::util::text::CREDENTIAL_HEADERS.contains(&name.as_str())
        || [
            "signature",
            "secret",
            "token",
            "password",
            "api-key",
            "apikey",
            "credential",
        ]
        .iter()
        .any(|part| name.contains(part))
}

/// Mask the values of the headers that may hold a credential or a signature, at any depth.
fn mask_secrets(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (name, value) in map.iter_mut() {
                if secret_header(name) && !value.is_object() {
                    *value = serde_json::Value::String(MASKED.to_owned());
                } else {
                    mask_secrets(value);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(mask_secrets),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_credentials_and_signatures() {
        let mut headers = serde_json::json!({
            "content-type": "application/json",
            "X-Hub-Signature-256": "sha256=abc",
            "stripe-signature": "t=1,v1=abc",
            "authorization": "Bearer abc",
            "x-api-key": "abc",
            "user": {"session-token": "abc", "tenant": "acme"},
        });
        mask_secrets(&mut headers);
        assert_eq!(
            headers,
            serde_json::json!({
                "content-type": "application/json",
                "X-Hub-Signature-256": MASKED,
                "stripe-signature": MASKED,
                "authorization": MASKED,
                "x-api-key": MASKED,
                "user": {"session-token": MASKED, "tenant": "acme"},
            })
        );
    }
}
