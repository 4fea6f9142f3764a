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
    found.ok_or_else(|| AdminError::NotFound(which.to_string()))
}
