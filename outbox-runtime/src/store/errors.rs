//! What a database error means for the caller: try the same work again now, or later.

use sea_orm::DbErr;

/// The server's error code and message, when the error is one the database answered with.
fn answer(err: &DbErr) -> Option<(String, String)> {
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    if let DbErr::Exec(sea_orm::RuntimeErr::SqlxError(e))
    | DbErr::Query(sea_orm::RuntimeErr::SqlxError(e))
    | DbErr::Conn(sea_orm::RuntimeErr::SqlxError(e)) = err
        && let Some(db) = e.as_database_error()
    {
        return Some((
            db.code().map(|c| c.into_owned()).unwrap_or_default(),
            db.message().to_owned(),
        ));
    }
    let _ = err;
    None
}

/// Whether an error is worth retrying the same transaction for: a deadlock, a serialization
/// failure, a lock wait timeout or a busy SQLite database.
pub fn is_transient(err: &DbErr) -> bool {
    if let Some((code, message)) = answer(err) {
        return matches!(code.as_str(), "40001" | "40P01" | "5" | "6" | "517")
            || message.contains("Deadlock found")
            || message.contains("Lock wait timeout")
            || message.contains("database is locked");
    }
    let text = err.to_string();
    text.contains("Deadlock found")
        || text.contains("deadlock detected")
        || text.contains("database is locked")
}

/// Whether an error says a lock was not had within the statement's `lock_timeout`
/// (PostgreSQL `55P03`).
pub fn is_lock_timeout(err: &DbErr) -> bool {
    answer(err).map_or_else(
        || err.to_string().contains("lock timeout"),
        |(code, _)| code == "55P03",
    )
}

/// Whether an error says the role lacks a privilege the statement needs, such as owning the
/// table (PostgreSQL `42501`).
pub fn is_not_owner(err: &DbErr) -> bool {
    answer(err).map_or_else(
        || err.to_string().contains("must be owner"),
        |(code, _)| code == "42501",
    )
}

/// Whether an error says the database could not be reached or dropped the connection (the
/// server restarted, an administrator terminated the session, the pool could not connect):
/// trying again later can succeed without anything else changing.
pub fn is_connection_error(err: &DbErr) -> bool {
    if matches!(err, DbErr::ConnectionAcquire(_)) {
        return true;
    }
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    if let DbErr::Exec(sea_orm::RuntimeErr::SqlxError(e))
    | DbErr::Query(sea_orm::RuntimeErr::SqlxError(e))
    | DbErr::Conn(sea_orm::RuntimeErr::SqlxError(e)) = err
    {
        use sea_orm::sqlx::Error;
        return match &**e {
            Error::Io(_)
            | Error::Tls(_)
            | Error::Protocol(_)
            | Error::PoolTimedOut
            | Error::PoolClosed
            | Error::WorkerCrashed => true,
            Error::Database(db) => {
                let code = db.code();
                let code = code.as_deref().unwrap_or_default();
                // PostgreSQL: class 08 (connection exception), 57P01-57P03 (terminated by an
                // administrator, crash shutdown, cannot connect now). MySQL: 2006/2013 (server
                // gone away, lost connection), 1053 (server shutdown in progress).
                code.starts_with("08")
                    || matches!(code, "57P01" | "57P02" | "57P03" | "2006" | "2013" | "1053")
            }
            _ => false,
        };
    }
    matches!(err, DbErr::Conn(_))
}

/// Whether an error says a table does not exist (a migration was not applied).
pub fn is_missing_table(err: &DbErr) -> bool {
    let text = err.to_string();
    text.contains("no such table")
        || (text.contains("relation") && text.contains("does not exist"))
        || (text.contains("Table") && text.contains("doesn't exist"))
}
