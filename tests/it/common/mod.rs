//! Shared test support: one fresh database per test on each backend, and a business table.
//!
//! A backend whose server is not running is skipped with a loud message, unless
//! `OUTBOX_REQUIRE_SERVICES=1`, which makes it a failure.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::time::Duration;

use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, EntityTrait,
    PaginatorTrait, QueryResult, Schema, Statement,
};

pub use outbox::store::Dialect;

pub mod carts;
pub mod http;
#[cfg(all(feature = "postgres", feature = "nats", feature = "redis"))]
pub mod netns;
pub mod own_server;
pub mod workload;

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    /// PostgreSQL through PgBouncer in transaction pooling mode (`scripts/pgbouncer`): the
    /// database is created on the server, and the test connects through the pooler.
    PgBouncer,
    MySql,
    SqliteFile,
    SqliteMemory,
}

impl Backend {
    /// PostgreSQL, directly or through the pooler.
    pub fn is_postgres(self) -> bool {
        matches!(self, Backend::Postgres | Backend::PgBouncer)
    }
}

pub fn services_required() -> bool {
    std::env::var("OUTBOX_REQUIRE_SERVICES").is_ok_and(|v| v == "1" || v == "true")
}

pub fn postgres_admin_url() -> String {
    std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// PgBouncer in transaction mode in front of the `postgres_admin_url` server.
pub fn pgbouncer_url() -> String {
    std::env::var("OUTBOX_TEST_PGBOUNCER_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:6432/test".into())
}

/// The URL of database `name` through PgBouncer.
pub fn through_pgbouncer(name: &str) -> String {
    with_database(&pgbouncer_url(), name)
}

pub fn mysql_admin_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

pub fn with_database(url: &str, db: &str) -> String {
    match url.rfind('/') {
        Some(i) => format!("{}/{db}", &url[..i]),
        None => format!("{url}/{db}"),
    }
}

/// A fresh database named after the test, migrated with the SDK's tables.
#[derive(Debug)]
pub struct TestDb {
    pub backend: Backend,
    pub name: String,
    pub url: String,
    pub db: DatabaseConnection,
}

impl TestDb {
    pub fn dialect(&self) -> Dialect {
        Dialect::of(&self.db)
    }

    /// Another pool on the same database (a second "process").
    pub async fn connect_again(&self) -> DatabaseConnection {
        let mut opts = ConnectOptions::new(self.url.clone());
        opts.sqlx_logging(false).max_connections(4);
        Database::connect(opts).await.expect("second connection")
    }
}

fn skip_or_fail(what: &str, err: impl std::fmt::Display) -> Option<TestDb> {
    if services_required() {
        panic!("{what} is required (OUTBOX_REQUIRE_SERVICES=1) but unavailable: {err}");
    }
    eprintln!("\n*** SKIPPED: {what} is not reachable ({err}); start it to run this test ***\n");
    None
}

/// A fresh namespace for a broker test: `t_<test>_<random>`.
pub fn fresh_namespace(test: &str) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("t_{test}_{}", &random[..10])
}

/// What `connect` returns within 15 s, or `None` (after a loud message) when `service` at
/// `address` cannot be reached; with `OUTBOX_REQUIRE_SERVICES=1` that is a failure instead.
pub async fn connect_or_skip<T, E: std::fmt::Display>(
    service: &str,
    address: &str,
    test: &str,
    connect: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    let error = match tokio::time::timeout(Duration::from_secs(15), connect).await {
        Ok(Ok(connected)) => return Some(connected),
        Ok(Err(err)) => err.to_string(),
        Err(_) => "connecting timed out".to_owned(),
    };
    if services_required() {
        panic!("{service} is required (OUTBOX_REQUIRE_SERVICES=1) but unavailable: {error}");
    }
    eprintln!(
        "\n*** SKIPPED {test}: {service} is not reachable at {address} ({error}); start it to run this test ***\n"
    );
    None
}

pub async fn connect(url: &str, max: u32) -> Result<DatabaseConnection, sea_orm::DbErr> {
    let mut opts = ConnectOptions::new(url.to_owned());
    opts.sqlx_logging(false)
        .max_connections(max)
        .connect_timeout(Duration::from_secs(5))
        .acquire_timeout(Duration::from_secs(60));
    Database::connect(opts).await
}

/// Drop and create database `name` on a server, then connect to it. `Err` only when the server
/// is unreachable.
async fn fresh_server_db(
    admin_url: &str,
    drop: &str,
    name: &str,
) -> Result<(String, DatabaseConnection), sea_orm::DbErr> {
    let admin = connect(admin_url, 1).await?;
    admin.execute_unprepared(drop).await.unwrap();
    admin
        .execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    admin.close().await.ok();
    let url = with_database(admin_url, name);
    let db = connect(&url, 20).await.unwrap();
    Ok((url, db))
}

/// Database names handed out in this process: every test of the binary needs its own.
static DB_NAMES: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// The database of `test`, taken for it: each name may be asked for once per process.
fn database_name(test: &str) -> String {
    let name = format!("ob_{}", test.replace(['-', ':'], "_")).to_lowercase();
    assert!(name.len() <= 63, "test database name too long: {name}");
    assert!(
        DB_NAMES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.clone()),
        "test database name used by two tests: {name}"
    );
    name
}

/// A fresh, migrated database for `test` on `backend`, or `None` (skipped). Each name may be
/// asked for once per process: two tests on one database would see each other's rows.
pub async fn test_db(backend: Backend, test: &str) -> Option<TestDb> {
    let name = database_name(test);
    let (url, db) = match backend {
        Backend::Postgres => {
            let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            match fresh_server_db(&postgres_admin_url(), &drop, &name).await {
                Ok(pair) => pair,
                Err(e) => return skip_or_fail("PostgreSQL", e),
            }
        }
        Backend::PgBouncer => {
            let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            if let Err(e) = fresh_server_db(&postgres_admin_url(), &drop, &name).await {
                return skip_or_fail("PostgreSQL", e);
            }
            let url = through_pgbouncer(&name);
            match connect(&url, 20).await {
                Ok(db) => (url, db),
                Err(e) => return skip_or_fail("PgBouncer (scripts/pgbouncer start)", e),
            }
        }
        Backend::MySql => {
            let drop = format!("DROP DATABASE IF EXISTS {name}");
            match fresh_server_db(&mysql_admin_url(), &drop, &name).await {
                Ok(pair) => pair,
                Err(e) => return skip_or_fail("MariaDB/MySQL", e),
            }
        }
        Backend::SqliteFile => {
            let dir = std::env::temp_dir().join("outbox-tests");
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(format!("{name}.db"));
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            let url = format!("sqlite://{}?mode=rwc", path.display());
            let db = connect(&url, 1).await.unwrap();
            (url, db)
        }
        Backend::SqliteMemory => {
            let url = "sqlite::memory:".to_owned();
            let db = connect(&url, 1).await.unwrap();
            (url, db)
        }
    };
    outbox::migrate(&db).await.expect("migrations apply");
    create_business_tables(&db).await;
    Some(TestDb {
        backend,
        name,
        url,
        db,
    })
}

/// The PostgreSQL cluster with `wal_level = logical` (`scripts/pg-logical`), for the WAL relay.
pub fn postgres_logical_admin_url() -> String {
    std::env::var("OUTBOX_TEST_POSTGRES_LOGICAL_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5433/postgres".into())
}

/// A fresh, migrated database for `test` on the PostgreSQL cluster with `wal_level = logical`,
/// or `None` (skipped). Replication slots left in a database of that name by an earlier run are
/// dropped first (a database with a slot cannot be dropped).
pub async fn logical_test_db(test: &str) -> Option<TestDb> {
    let name = database_name(test);
    let admin_url = postgres_logical_admin_url();
    match connect(&admin_url, 1).await {
        Ok(admin) => {
            let slots = Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE database = $1 AND active_pid IS NOT NULL",
                [name.clone().into()],
            );
            admin.query_all_raw(slots).await.unwrap();
            let drop = Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE database = $1",
                [name.clone().into()],
            );
            // A terminated walsender lets go of its slot a moment later.
            for _ in 0..50 {
                if admin.query_all_raw(drop.clone()).await.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            admin.close().await.ok();
        }
        Err(e) => {
            return skip_or_fail(
                "PostgreSQL with wal_level = logical (scripts/pg-logical start)",
                e,
            );
        }
    }
    let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    let (url, db) = match fresh_server_db(&admin_url, &drop, &name).await {
        Ok(pair) => pair,
        Err(e) => return skip_or_fail("PostgreSQL with wal_level = logical", e),
    };
    outbox::migrate(&db).await.expect("migrations apply");
    create_business_tables(&db).await;
    Some(TestDb {
        backend: Backend::Postgres,
        name,
        url,
        db,
    })
}

/// What the tests' handlers do: one `effect` row in the handler's transaction, under its
/// consumer's name.
pub async fn insert_effect(
    tx: &outbox::inbox::InboxTransaction,
    event_id: &str,
    cart: &str,
    seq: i64,
) -> Result<(), outbox::inbox::HandlerError> {
    use sea_orm::{ActiveModelTrait, NotSet, Set};
    effect::ActiveModel {
        id: NotSet,
        consumer: Set(tx.context().consumer.to_owned()),
        event_id: Set(event_id.to_owned()),
        cart: Set(cart.to_owned()),
        seq: Set(seq),
    }
    .insert(tx)
    .await?;
    Ok(())
}

/// The business table of the tests: orders, a SeaORM entity.
pub mod order {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "shop_order")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: i64,
        pub order_no: String,
        pub total_cents: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// What consumers' handlers write: one row per handled message.
pub mod effect {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "effect")]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub consumer: String,
        pub event_id: String,
        pub cart: String,
        pub seq: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub async fn create_business_tables(db: &DatabaseConnection) {
    let schema = Schema::new(db.get_database_backend());
    let stmt = schema.create_table_from_entity(order::Entity);
    db.execute(&stmt).await.expect("create shop_order");
    let stmt = schema.create_table_from_entity(effect::Entity);
    db.execute(&stmt).await.expect("create effect");
}

/// Every effect row, in insertion order.
pub async fn effects<C: ConnectionTrait>(db: &C) -> Vec<effect::Model> {
    use sea_orm::QueryOrder;
    effect::Entity::find()
        .order_by_asc(effect::Column::Id)
        .all(db)
        .await
        .unwrap()
}

/// One inbox row, as the tests read it.
#[derive(Clone, PartialEq, Eq)]
pub struct InboxRow {
    pub message_id: String,
    pub status: String,
    pub attempts: i64,
    pub locked_by: Option<String>,
    pub last_error: Option<String>,
    pub event_type: Option<String>,
    pub source: Option<String>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    pub payload: Vec<u8>,
}

/// The payload as (at most 160 characters of) text, so that a failing assertion reads.
impl std::fmt::Debug for InboxRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = String::from_utf8_lossy(&self.payload);
        let shown: String = text.chars().take(160).collect();
        f.debug_struct("InboxRow")
            .field("message_id", &self.message_id)
            .field("status", &self.status)
            .field("attempts", &self.attempts)
            .field("locked_by", &self.locked_by)
            .field("last_error", &self.last_error)
            .field("event_type", &self.event_type)
            .field("source", &self.source)
            .field("aggregate_type", &self.aggregate_type)
            .field("aggregate_id", &self.aggregate_id)
            .field(
                "payload",
                &format_args!("{} bytes: {shown:?}", self.payload.len()),
            )
            .finish()
    }
}

/// Inbox rows of a consumer, in arrival order.
pub async fn inbox_rows<C: ConnectionTrait>(db: &C, consumer: &str) -> Vec<InboxRow> {
    let backend = db.get_database_backend();
    let cast = if backend == DbBackend::MySql {
        "SIGNED"
    } else {
        "BIGINT"
    };
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(
            backend,
            if backend == DbBackend::Postgres {
                // Handled messages may have moved to `inbox_done` (ids are shared).
                "SELECT id, message_id, status, CAST(attempts AS BIGINT) AS attempts, locked_by, \
                 last_error, event_type, source, aggregate_type, aggregate_id, payload \
                 FROM inbox_event WHERE consumer = $1 UNION ALL \
                 SELECT id, message_id, status, CAST(attempts AS BIGINT), locked_by, NULL, \
                 event_type, source, aggregate_type, aggregate_id, payload \
                 FROM inbox_done WHERE consumer = $1 ORDER BY id"
                    .to_owned()
            } else {
                format!(
                    "SELECT message_id, status, CAST(attempts AS {cast}) AS attempts, locked_by, \
                     last_error, event_type, source, aggregate_type, aggregate_id, payload \
                     FROM inbox_event WHERE consumer = ? ORDER BY id"
                )
            },
            [consumer.into()],
        ))
        .await
        .unwrap();
    rows.iter()
        .map(|r| InboxRow {
            message_id: r.try_get("", "message_id").unwrap(),
            status: r.try_get("", "status").unwrap(),
            attempts: r.try_get("", "attempts").unwrap(),
            locked_by: r.try_get("", "locked_by").unwrap(),
            last_error: r.try_get("", "last_error").unwrap(),
            event_type: r.try_get("", "event_type").unwrap(),
            source: r.try_get("", "source").unwrap(),
            aggregate_type: r.try_get("", "aggregate_type").unwrap(),
            aggregate_id: r.try_get("", "aggregate_id").unwrap(),
            payload: r.try_get("", "payload").unwrap(),
        })
        .collect()
}

pub async fn count_orders<C: ConnectionTrait>(db: &C) -> u64 {
    order::Entity::find().count(db).await.unwrap()
}

/// Events in the outbox: unfinished in `outbox_event`, sent in `outbox_sent`.
pub async fn count_events<C: ConnectionTrait>(db: &C) -> i64 {
    scalar_i64(db, "SELECT COUNT(*) AS n FROM outbox_event").await + sent_count(db).await
}

/// Put the sent events matching `condition` (SQL on `outbox_sent`) in a slot whose rows are
/// all older than `window` by the rotation's reckoning: the next retention pass empties it.
pub async fn age_sent<C: ConnectionTrait>(db: &C, condition: &str, window: Duration) {
    let (current, rotation) = outbox::store::rotation::now(db, "outbox_sent")
        .await
        .unwrap()
        .unwrap();
    let slot = rotation.expired(current, window)[0];
    db.execute_unprepared(&format!(
        "UPDATE outbox_sent SET slot = {slot} WHERE {condition}"
    ))
    .await
    .unwrap();
}

/// Move sent event `id` back into `outbox_event` as PENDING, created at `created_at` (a SQL
/// literal), as if it had never been sent.
pub async fn unsend<C: ConnectionTrait>(db: &C, id: i64, created_at: &str) {
    let columns = "id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, \
                   aggregate_version, dedup_key, payload, headers";
    db.execute_unprepared(&format!(
        "INSERT INTO outbox_event ({columns}, status, attempts, created_at) \
         SELECT {columns}, 'PENDING', 0, {created_at} FROM outbox_sent WHERE id = {id}"
    ))
    .await
    .unwrap();
    db.execute_unprepared(&format!("DELETE FROM outbox_sent WHERE id = {id}"))
        .await
        .unwrap();
}

pub async fn scalar_i64<C: ConnectionTrait>(db: &C, sql: &str) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            sql.to_owned(),
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

/// The outbox's error history (`outbox_failure`), oldest first, as "row N attempt A STATUS:
/// error": what a failed assertion about attempts names.
pub async fn outbox_failures<C: ConnectionTrait>(db: &C) -> Vec<String> {
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT row_id, attempt, status, error FROM outbox_failure \
             WHERE queue = 'outbox' ORDER BY id",
        ))
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            let row_id: i64 = r.try_get("", "row_id").unwrap();
            let attempt: i32 = r.try_get("", "attempt").unwrap();
            let status: String = r.try_get("", "status").unwrap();
            let error: String = r.try_get("", "error").unwrap();
            format!("row {row_id} attempt {attempt} {status}: {error}")
        })
        .collect()
}

/// One outbox row, decoded the same way on every backend.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: i64,
    pub event_id: uuid::Uuid,
    pub source: String,
    pub event_type: String,
    pub schema_version: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub aggregate_version: Option<i64>,
    pub dedup_key: Option<String>,
    pub payload: serde_json::Value,
    pub headers: serde_json::Value,
    pub status: String,
    pub attempts: i64,
    pub next_attempt_at: Option<chrono::DateTime<chrono::Utc>>,
    pub locked_by: Option<String>,
    pub claim_token: Option<uuid::Uuid>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub sent_at: Option<chrono::DateTime<chrono::Utc>>,
    pub last_error: Option<String>,
    pub failure_class: Option<String>,
}

pub async fn outbox_rows<C: ConnectionTrait>(db: &C) -> Vec<OutboxRow> {
    let d = Dialect::of(db);
    let sql = "SELECT id, event_id, source, event_type, CAST(schema_version AS BIGINT) AS schema_version, \
               aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, status, \
               CAST(attempts AS BIGINT) AS attempts, next_attempt_at, locked_by, claim_token, created_at, sent_at, last_error, \
               failure_class FROM outbox_event ORDER BY id";
    let sql = if d.backend() == DbBackend::MySql {
        sql.replace("AS BIGINT", "AS SIGNED")
    } else {
        sql.to_owned()
    };
    let rows = db
        .query_all_raw(Statement::from_string(d.backend(), sql))
        .await
        .unwrap();
    let mut all: Vec<OutboxRow> = rows.iter().map(|r| decode_row(&d, r)).collect();
    all.extend(sent_rows(db).await);
    all.sort_by_key(|r| r.id);
    all
}

/// The events moved to `outbox_sent`, as [`OutboxRow`]s (SENT, with what a sent row keeps).
pub async fn sent_rows<C: ConnectionTrait>(db: &C) -> Vec<OutboxRow> {
    let d = Dialect::of(db);
    let int = if d.backend() == DbBackend::MySql {
        "SIGNED"
    } else {
        "BIGINT"
    };
    let sql = format!(
        "SELECT id, event_id, source, event_type, CAST(schema_version AS {int}) AS schema_version, \
         aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, \
         CAST(attempts AS {int}) AS attempts, locked_by, claim_token, created_at, sent_at \
         FROM outbox_sent ORDER BY id"
    );
    let rows = db
        .query_all_raw(Statement::from_string(d.backend(), sql))
        .await
        .unwrap();
    rows.iter()
        .map(|r| OutboxRow {
            id: r.try_get("", "id").unwrap(),
            event_id: d.get_uuid(r, "event_id").unwrap(),
            source: r.try_get("", "source").unwrap(),
            event_type: r.try_get("", "event_type").unwrap(),
            schema_version: r.try_get("", "schema_version").unwrap(),
            aggregate_type: r.try_get("", "aggregate_type").unwrap(),
            aggregate_id: r.try_get("", "aggregate_id").unwrap(),
            aggregate_version: r.try_get("", "aggregate_version").unwrap(),
            dedup_key: r.try_get("", "dedup_key").unwrap(),
            payload: serde_json::from_str(&d.get_json_text(r, "payload").unwrap()).unwrap(),
            headers: serde_json::from_str(&d.get_json_text(r, "headers").unwrap()).unwrap(),
            status: "SENT".to_owned(),
            attempts: r.try_get("", "attempts").unwrap(),
            next_attempt_at: None,
            locked_by: r.try_get("", "locked_by").unwrap(),
            claim_token: d.get_opt_uuid(r, "claim_token").unwrap(),
            created_at: d.get_timestamp(r, "created_at").unwrap(),
            sent_at: d.get_opt_timestamp(r, "sent_at").unwrap(),
            last_error: None,
            failure_class: None,
        })
        .collect()
}

fn decode_row(d: &Dialect, r: &QueryResult) -> OutboxRow {
    OutboxRow {
        id: r.try_get("", "id").unwrap(),
        event_id: d.get_uuid(r, "event_id").unwrap(),
        source: r.try_get("", "source").unwrap(),
        event_type: r.try_get("", "event_type").unwrap(),
        schema_version: r.try_get("", "schema_version").unwrap(),
        aggregate_type: r.try_get("", "aggregate_type").unwrap(),
        aggregate_id: r.try_get("", "aggregate_id").unwrap(),
        aggregate_version: r.try_get("", "aggregate_version").unwrap(),
        dedup_key: r.try_get("", "dedup_key").unwrap(),
        payload: serde_json::from_str(&d.get_json_text(r, "payload").unwrap()).unwrap(),
        headers: serde_json::from_str(&d.get_json_text(r, "headers").unwrap()).unwrap(),
        status: r.try_get("", "status").unwrap(),
        attempts: r.try_get("", "attempts").unwrap(),
        next_attempt_at: d.get_opt_timestamp(r, "next_attempt_at").unwrap(),
        locked_by: r.try_get("", "locked_by").unwrap(),
        claim_token: d.get_opt_uuid(r, "claim_token").unwrap(),
        created_at: d.get_timestamp(r, "created_at").unwrap(),
        sent_at: d.get_opt_timestamp(r, "sent_at").unwrap(),
        last_error: r.try_get("", "last_error").unwrap(),
        failure_class: r.try_get("", "failure_class").unwrap(),
    }
}

/// The database name of a `backend_tests!` test: its module path below the crate (e.g.
/// `relay_lost_confirm` for `it::relay::lost_confirm`) and the backend's tag, so tests of the
/// same name in two modules get two databases.
pub fn backend_test_name(module_path: &str, tag: &str) -> String {
    let below_crate: Vec<&str> = module_path.split("::").skip(1).collect();
    format!("{}_{tag}", below_crate.join("_"))
}

/// Instantiate `async fn(TestDb)` tests for every backend: `backend_tests!(name => body_fn);`
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident => $body:path;)+) => {$(
        mod $name {
            use super::*;

            async fn run(backend: $crate::common::Backend, tag: &str) {
                let test = $crate::common::backend_test_name(module_path!(), tag);
                if let Some(db) = $crate::common::test_db(backend, &test).await {
                    $body(db).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                run($crate::common::Backend::Postgres, "pg").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn pgbouncer() {
                run($crate::common::Backend::PgBouncer, "pb").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                run($crate::common::Backend::MySql, "my").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite_file() {
                run($crate::common::Backend::SqliteFile, "lf").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite_memory() {
                run($crate::common::Backend::SqliteMemory, "lm").await;
            }
        }
    )+};
}

/// Status counts of the outbox, e.g. `[("PENDING", 3), ("SENT", 7)]`: the events in
/// `outbox_event` by status, and those moved to `outbox_sent` as SENT.
pub async fn status_counts<C: ConnectionTrait>(db: &C) -> std::collections::BTreeMap<String, i64> {
    let mut counts = table_status_counts(db, "outbox_event").await;
    let sent = sent_count(db).await;
    if sent > 0 {
        *counts.entry("SENT".to_owned()).or_default() += sent;
    }
    counts
}

/// How many events `outbox_sent` holds.
pub async fn sent_count<C: ConnectionTrait>(db: &C) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT COUNT(*) AS n FROM outbox_sent".to_owned(),
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap()
}

/// Rows per status of `table` (`outbox_event` or `inbox_event`).
pub async fn table_status_counts<C: ConnectionTrait>(
    db: &C,
    table: &str,
) -> std::collections::BTreeMap<String, i64> {
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            // The inbox's handled messages may be in `inbox_done` (PostgreSQL).
            format!(
                "SELECT status, COUNT(*) AS n FROM {} GROUP BY status",
                if table == "inbox_event" {
                    inbox_source(db.get_database_backend())
                } else {
                    table
                }
            ),
        ))
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            (
                r.try_get::<String>("", "status").unwrap(),
                r.try_get::<i64>("", "n").unwrap(),
            )
        })
        .collect()
}

/// Run `future` to completion on a tokio runtime of its own (two worker threads, as the other
/// tests have), after calling `on_thread` on each of the runtime's threads and on this one: the
/// way to give a test something thread-local (a metrics recorder, a tracing subscriber) that
/// the runtime's tasks see and the other tests of the process do not. `on_thread` must keep
/// what it sets for the thread's life (e.g. by forgetting the guard).
pub fn on_own_runtime<Fut: std::future::Future>(
    on_thread: impl Fn() + Send + Sync + 'static,
    future: Fut,
) -> Fut::Output {
    let on_thread = std::sync::Arc::new(on_thread);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start({
            let on_thread = on_thread.clone();
            move || on_thread()
        })
        .build()
        .unwrap();
    on_thread();
    runtime.block_on(future)
}

/// Poll `check` every 20 ms until it holds or `timeout` passes; returns whether it held.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two subscriptions sharing a consumer name got `got_1` and `got_2`, a third under another name
/// got `audited`, of the message ids `all`: the shared name split the messages between its two
/// subscribers (each exactly once, both got some), and the other name got all of them in order.
pub fn assert_shared_and_fanned_out(
    got_1: &[String],
    got_2: &[String],
    audited: &[String],
    all: &[String],
) {
    use std::collections::HashSet;
    let set_1: HashSet<&String> = got_1.iter().collect();
    let set_2: HashSet<&String> = got_2.iter().collect();
    assert_eq!(set_1.len(), got_1.len(), "duplicate delivery to worker 1");
    assert_eq!(set_2.len(), got_2.len(), "duplicate delivery to worker 2");
    assert!(set_1.is_disjoint(&set_2), "a message reached both workers");
    assert_eq!(got_1.len() + got_2.len(), all.len());
    assert_eq!(
        set_1.union(&set_2).copied().collect::<HashSet<_>>(),
        all.iter().collect::<HashSet<_>>()
    );
    assert!(
        !got_1.is_empty() && !got_2.is_empty(),
        "the two workers did not share: {} and {}",
        got_1.len(),
        got_2.len()
    );
    assert_eq!(
        audited, all,
        "another consumer name gets everything, in publish order"
    );
}

/// Every inbox row as one source to select from (`FROM {inbox_source}`): `inbox_event`, and on
/// PostgreSQL the handled messages in `inbox_done` too (with no due time, lease or error).
pub fn inbox_source(backend: DbBackend) -> &'static str {
    if backend == DbBackend::Postgres {
        "(SELECT id, consumer, message_id, origin, biz_key, status, attempts, last_error, \
         next_attempt_at, processed_at, received_at, headers, payload, locked_by, locked_until, \
         claim_token, event_type, source, aggregate_type, aggregate_id FROM inbox_event \
         UNION ALL SELECT id, consumer, message_id, origin, biz_key, status, attempts, NULL, \
         NULL, processed_at, received_at, headers, payload, locked_by, NULL, claim_token, \
         event_type, source, aggregate_type, aggregate_id FROM inbox_done) inbox"
    } else {
        "inbox_event"
    }
}

/// Move the handled messages `condition` selects in `inbox_done` (PostgreSQL) into a slot that
/// retention may empty with a window of `window`, processed at `processed_at` (a SQL
/// expression).
pub async fn age_done<C: ConnectionTrait>(
    db: &C,
    condition: &str,
    window: Duration,
    processed_at: &str,
) {
    let (current, rotation) = outbox::store::rotation::now(db, "inbox_done")
        .await
        .unwrap()
        .unwrap();
    let slot = rotation.expired(current, window)[0];
    db.execute_unprepared(&format!(
        "UPDATE inbox_done SET slot = {slot}, processed_at = {processed_at} WHERE {condition}"
    ))
    .await
    .unwrap();
}

/// Switch the inbox's rotation off (PostgreSQL), as on a database whose inbox held messages
/// when `outbox_0014` ran: handled messages stay in `inbox_event` and leave row by row.
pub async fn inbox_rotation_off<C: ConnectionTrait>(db: &C) {
    if db.get_database_backend() == DbBackend::Postgres {
        db.execute_unprepared(
            "DELETE FROM outbox_rotation WHERE table_name IN ('inbox_done', 'inbox_key')",
        )
        .await
        .unwrap();
    }
}

/// Move inbox rows of `consumer` (one message, or all) back to `at`: the SDK stamps
/// `received_at` and `processed_at` with the database's clock, so a test that needs old rows
/// dates them back afterwards.
pub async fn backdate_inbox<C: ConnectionTrait>(
    db: &C,
    consumer: &str,
    message_id: Option<&str>,
    at: chrono::DateTime<chrono::Utc>,
) {
    let dialect = Dialect::of(db);
    let backend = db.get_database_backend();
    let mut sql = String::from(
        "UPDATE inbox_event SET received_at = ?, \
         processed_at = CASE WHEN processed_at IS NULL THEN NULL ELSE ? END WHERE consumer = ?",
    );
    let mut values = vec![
        dialect.timestamp(at),
        dialect.timestamp(at),
        consumer.to_owned().into(),
    ];
    if let Some(id) = message_id {
        sql.push_str(" AND message_id = ?");
        values.push(id.to_owned().into());
    }
    if backend == DbBackend::Postgres {
        let mut n = 0;
        sql = sql
            .split('?')
            .enumerate()
            .map(|(i, part)| {
                if i == 0 {
                    part.to_owned()
                } else {
                    n += 1;
                    format!("${n}{part}")
                }
            })
            .collect();
    }
    db.execute_raw(Statement::from_sql_and_values(backend, sql, values))
        .await
        .expect("dating inbox rows back");
    if backend == DbBackend::Postgres {
        // Handled messages in `inbox_done` go to the slot of their new time too.
        let mut sql = String::from(
            "UPDATE inbox_done SET received_at = $1, processed_at = $1, slot = \
             (SELECT (CAST(floor(extract(epoch FROM CAST($1 AS TIMESTAMPTZ))) AS BIGINT) \
             / r.slot_seconds) % r.slots FROM outbox_rotation r \
             WHERE r.table_name = 'inbox_done') WHERE consumer = $2",
        );
        let mut values = vec![dialect.timestamp(at), consumer.to_owned().into()];
        if let Some(id) = message_id {
            sql.push_str(" AND message_id = $3");
            values.push(id.to_owned().into());
        }
        db.execute_raw(Statement::from_sql_and_values(backend, sql, values))
            .await
            .expect("dating handled inbox rows back");
    }
}

/// Where Debian's libfaketime (package `faketime`, which `.ci/run` installs) is, if installed.
pub fn find_libfaketime() -> Option<std::path::PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ]
    .iter()
    .map(|dir| std::path::Path::new(dir).join("faketime/libfaketimeMT.so.1"))
    .find(|path| path.exists())
}

/// Run `command` with its wall clock shifted by `skew` (libfaketime's syntax: `+60s`, `-30s`,
/// `+2d`) and its monotonic clock untouched, as a process on a host whose clock is off. The
/// library is preloaded into the process itself: the `faketime` command would run it as a child
/// of its own, out of reach of the signals a test sends.
pub fn skew_wall_clock(command: &mut std::process::Command, skew: &str) {
    let library = find_libfaketime().expect("libfaketime (Debian's package faketime)");
    command
        .env("LD_PRELOAD", library)
        .env("FAKETIME", skew)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
}

/// For a test binary without libtest's harness (`harness = false`) that holds the one test
/// `name`: answers `--list`, and says whether the command line's filters select it.
pub fn harness_selects(name: &str) -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("{name}: test");
        return false;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
        println!("running 0 tests (filtered out)");
        return false;
    }
    true
}

/// Handler failures injected by the tests, keyed by a name unique to the test (a cart, a
/// customer): how many of the next attempts fail.
static FAILURES: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<String, u32>>> =
    std::sync::LazyLock::new(Default::default);

/// Make the next `n` attempts for `key` fail.
pub fn fail_times(key: &str, n: u32) {
    FAILURES.lock().unwrap().insert(key.to_owned(), n);
}

/// Whether this attempt for `key` fails (counting it down).
pub fn should_fail(key: &str) -> bool {
    match FAILURES.lock().unwrap().get_mut(key) {
        Some(n) if *n > 0 => {
            *n -= 1;
            true
        }
        _ => false,
    }
}

/// A runtime over `db` that runs only the workers of `consumers` (no relay, no transport),
/// polling every 50 ms: what stores messages for them is the test's.
pub async fn worker_runtime<const N: usize>(
    db: &DatabaseConnection,
    consumers: [&str; N],
) -> outbox::runtime::Runtime {
    outbox::runtime::Runtime::builder(db.clone())
        .consumers(consumers)
        .without_relay()
        .inbox_config(
            outbox::inbox::InboxConfig::default().poll_interval(Duration::from_millis(50)),
        )
        .start()
        .await
        .unwrap()
}

/// A tool a test needs is not installed: a failure with `OUTBOX_REQUIRE_SERVICES=1`, else a
/// loud skip.
pub fn missing_tool<T>(test: &str, what: &str) -> Option<T> {
    if services_required() {
        panic!("{test} needs {what} (OUTBOX_REQUIRE_SERVICES=1); .ci/run installs it");
    }
    eprintln!("\n*** SKIPPED: {test} needs {what}; .ci/run installs it ***\n");
    None
}

/// The relay of the tests that need it quick: polls every 50 ms, retries after 20 ms doubling to
/// 200 ms, and gives an event up only after 1,000 attempts.
pub fn quick_relay() -> outbox::relay::RelayConfig {
    outbox::relay::RelayConfig::default()
        .poll_interval(Duration::from_millis(50))
        .backoff(
            outbox::relay::Backoff::default()
                .base(Duration::from_millis(20))
                .cap(Duration::from_millis(200))
                .jitter(0.2),
        )
        .max_attempts(1_000)
}

/// The inbox of the tests that need it quick: workers poll every 50 ms, retries after 10 ms
/// doubling to 50 ms.
pub fn quick_inbox() -> outbox::inbox::InboxConfig {
    outbox::inbox::InboxConfig::default()
        .poll_interval(Duration::from_millis(50))
        .backoff(
            outbox::relay::Backoff::default()
                .base(Duration::from_millis(10))
                .cap(Duration::from_millis(50))
                .jitter(0.1),
        )
}

/// An instance `pod-a` of a fleet (no relay, no consumer) over the one database `name`, returned
/// once it owns it: for tests that need an owned database beside an unowned one.
pub async fn fleet_owning(
    control: &DatabaseConnection,
    source: &str,
    name: &str,
    db: &DatabaseConnection,
) -> outbox::fleet::Fleet {
    let fleet = outbox::runtime::Runtime::builder(control.clone())
        .source(source)
        .instance_id("pod-a")
        .without_relay()
        .consumers(Vec::<String>::new())
        .metrics_interval(None)
        .databases(vec![outbox::fleet::FleetDatabase::new(name, db.clone())])
        .heartbeat(Duration::from_millis(200))
        .lease(Duration::from_secs(2))
        .start()
        .await
        .unwrap();
    let owned = eventually(Duration::from_secs(30), || async {
        fleet.owned() == [name]
    })
    .await;
    assert!(owned, "{name} never owned");
    fleet
}

/// Stop child processes as an orchestrator would: SIGTERM to each, up to `grace` for them all to
/// exit, then SIGKILL for any still running.
pub fn terminate(children: Vec<std::process::Child>, grace: Duration) {
    for child in &children {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
    }
    let deadline = std::time::Instant::now() + grace;
    for mut child in children {
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
