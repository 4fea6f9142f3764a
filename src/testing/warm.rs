//! Migrated PostgreSQL schemas kept ready for the next `TestDb::postgres`: migrating a schema
//! takes a few hundred statements (the rotating tables' partitions), so the kit migrates the next
//! ones in the background and a test takes a ready one by renaming it (one statement). Ready
//! schemas outlive the test process, so the next `cargo test` starts with them.
//!
//! Names: `outbox_warming_{migrations}_{secs}_{pid}_{n}` while being migrated, renamed to
//! `outbox_ready_{migrations}_…` once done, and to the test's own `outbox_test_…` when taken;
//! `{migrations}` is a digest of the migrations' names, so a schema migrated by another release
//! is never taken (and is dropped).

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::sea_orm::{
    ConnectOptions, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement,
};

/// Ready (or warming) schemas the kit keeps per database.
const KEEP_READY: usize = 4;
/// A schema still warming after this was abandoned (its process ended mid-way).
const WARMING_ABANDONED_AFTER: Duration = Duration::from_secs(600);

const READY: &str = "outbox_ready_";
const WARMING: &str = "outbox_warming_";

/// A digest of the migrations' names (FNV-1a, 32 bits, hex).
pub(super) fn migrations_digest() -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for migration in crate::migrations() {
        for byte in migration.name().bytes().chain([0]) {
            hash ^= u32::from(byte);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    }
    format!("{hash:08x}")
}

/// `{prefix}{migrations}_{secs}_{pid}_{n}`.
fn name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}{}_{}_{}_{}",
        migrations_digest(),
        now_secs(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// The digest and the creation time (seconds) a ready or warming name carries.
fn parts<'a>(name: &'a str, prefix: &str) -> Option<(&'a str, u64)> {
    let mut rest = name.strip_prefix(prefix)?.split('_');
    let digest = rest.next()?;
    let secs = rest.next()?.parse().ok()?;
    Some((digest, secs))
}

async fn schemas(admin: &DatabaseConnection, prefix: &str) -> Result<Vec<String>, DbErr> {
    let rows = admin
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1) ORDER BY nspname",
            [prefix.into()],
        ))
        .await?;
    rows.iter().map(|r| r.try_get("", "nspname")).collect()
}

/// Drop what cannot be used: ready schemas of other migrations, abandoned warming ones.
pub(super) async fn sweep(admin: &DatabaseConnection) -> Result<(), DbErr> {
    let digest = migrations_digest();
    let now = now_secs();
    for prefix in [READY, WARMING] {
        for schema in schemas(admin, prefix).await? {
            let unusable = match parts(&schema, prefix) {
                Some((d, _)) if d != digest => true,
                Some((_, secs)) => {
                    prefix == WARMING
                        && now.saturating_sub(secs) > WARMING_ABANDONED_AFTER.as_secs()
                }
                None => false,
            };
            if unusable {
                let drop = format!("DROP SCHEMA IF EXISTS {} CASCADE", super::quoted(&schema));
                admin.execute_unprepared(&drop).await.ok();
            }
        }
    }
    Ok(())
}

/// Take a ready schema under the name `to`: `true` when one was taken. Another process may take
/// the same one first; the rename then fails and the next is tried.
pub(super) async fn take(admin: &DatabaseConnection, to: &str) -> Result<bool, DbErr> {
    let ready = format!("{READY}{}_", migrations_digest());
    for schema in schemas(admin, &ready).await? {
        let rename = format!(
            "ALTER SCHEMA {} RENAME TO {}",
            super::quoted(&schema),
            super::quoted(to)
        );
        if admin.execute_unprepared(&rename).await.is_ok() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A pool on schema `schema` of the database at `url`.
pub(super) async fn pool(url: &str, schema: &str, max: u32) -> Result<DatabaseConnection, DbErr> {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(max)
        .sqlx_logging(false)
        .set_schema_search_path(schema.to_owned());
    crate::sea_orm::Database::connect(options).await
}

/// Migrate one more schema in the background, on a thread of its own (a test's runtime ends with
/// the test), unless enough are ready or warming.
pub(super) fn replenish(url: &str) {
    let url = url.to_owned();
    let spawned = std::thread::Builder::new()
        .name("outbox-testing-warm".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            if let Err(e) = runtime.block_on(warm_one(&url)) {
                tracing::debug!(error = %e, "outbox::testing could not prepare a schema");
            }
        });
    drop(spawned);
}

async fn warm_one(url: &str) -> Result<(), DbErr> {
    let admin = super::connect(super::admin_options(url)).await?;
    let digest = migrations_digest();
    let waiting = schemas(&admin, &format!("{READY}{digest}_")).await?.len()
        + schemas(&admin, &format!("{WARMING}{digest}_")).await?.len();
    if waiting >= KEEP_READY {
        return Ok(());
    }
    let warming = name(WARMING);
    admin
        .execute_unprepared(&format!("CREATE SCHEMA {}", super::quoted(&warming)))
        .await?;
    let db = pool(url, &warming, 1).await?;
    crate::migrate(&db).await?;
    db.close().await.ok();
    let ready = warming.replacen(WARMING, READY, 1);
    admin
        .execute_unprepared(&format!(
            "ALTER SCHEMA {} RENAME TO {}",
            super::quoted(&warming),
            super::quoted(&ready)
        ))
        .await?;
    admin.close().await.ok();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_migrations_and_the_time() {
        let ready = name(READY);
        let (digest, secs) = parts(&ready, READY).unwrap();
        assert_eq!(digest, migrations_digest());
        assert!(now_secs() - secs < 60);
        assert_eq!(parts("outbox_ready_x", READY), None);
        assert_eq!(parts("orders", READY), None);
    }
}
