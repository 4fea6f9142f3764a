//! The short transactions the SDK's own statements run in.

use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, TransactionTrait};

use super::Dialect;

/// Begin a short claim or write-back transaction, with the dialect's settings for it (read
/// committed; immediate on SQLite, so claims serialize; on PostgreSQL without waiting for the WAL
/// flush, since a lost claim or mark only causes a republish that deduplication absorbs).
pub async fn begin_work(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    let dialect = Dialect::of(db);
    let txn = db.begin_with_options(dialect.work_transaction()).await?;
    if let Some(session) = dialect.work_session() {
        txn.execute_unprepared(session).await?;
    }
    Ok(txn)
}

/// Begin a short admin transaction (read committed; immediate on SQLite, so that what a guard
/// read is what the update sees).
pub async fn begin_admin(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    db.begin_with_options(Dialect::of(db).admin_transaction())
        .await
}
