//! The inbox takes messages from outside (webhooks, other systems' messages): two dedup layers
//! beside the old key, added without touching existing rows.
//!
//! - `origin`: who assigned `message_id`. Empty for messages of this SDK's producers (their ids
//!   are UUIDv7, unique on their own), the sender's `source` for a received external message.
//!   Existing rows get the empty default, so nothing is rewritten.
//! - `biz_key`: the business key of an external message (e.g. `payment pi_123 succeeded`).
//! - `headers`: the request headers kept with an external message (JSON object).
//! - unique `(consumer, origin, message_id)`: the physical redelivery key, so two senders that
//!   both use `evt_1` do not collide;
//! - unique `(consumer, event_type, biz_key)`: the same business fact under two message ids is
//!   recorded once. Rows without a business key (every message of this SDK's producers) are
//!   never equal; on PostgreSQL and SQLite the index leaves them out (a partial index), so they
//!   cost it nothing.
//!
//! The old unique `(consumer, message_id)` stays until `outbox_0007`: processes of the previous
//! release, which name it in their `ON CONFLICT`, keep working while this one rolls out.

use crate::{Down, Script, Transaction};

pub(crate) const MIGRATION: Script = Script {
    name: "outbox_0006_inbox_external_keys",
    postgres: POSTGRES_UP,
    mysql: MYSQL_UP,
    sqlite: SQLITE_UP,
    down: Down::Each(POSTGRES_DOWN, MYSQL_DOWN, POSTGRES_DOWN),
    transaction: Transaction::Backend,
};

const POSTGRES_UP: &[&str] = &[
    "ALTER TABLE inbox_event ADD COLUMN origin VARCHAR(255) NOT NULL DEFAULT ''",
    "ALTER TABLE inbox_event ADD COLUMN biz_key VARCHAR(255) NULL",
    "ALTER TABLE inbox_event ADD COLUMN headers TEXT NULL",
    "CREATE UNIQUE INDEX inbox_event_message_key ON inbox_event (consumer, origin, message_id)",
    "CREATE UNIQUE INDEX inbox_event_business_key ON inbox_event (consumer, event_type, biz_key) WHERE biz_key IS NOT NULL",
];

const MYSQL_UP: &[&str] = &["ALTER TABLE inbox_event \
     ADD COLUMN origin VARCHAR(255) NOT NULL DEFAULT '', \
     ADD COLUMN biz_key VARCHAR(255) NULL, \
     ADD COLUMN headers TEXT NULL, \
     ADD UNIQUE KEY inbox_event_message_key (consumer, origin, message_id), \
     ADD UNIQUE KEY inbox_event_business_key (consumer, event_type, biz_key)"];

const SQLITE_UP: &[&str] = &[
    "ALTER TABLE inbox_event ADD COLUMN origin TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE inbox_event ADD COLUMN biz_key TEXT NULL",
    "ALTER TABLE inbox_event ADD COLUMN headers TEXT NULL",
    "CREATE UNIQUE INDEX inbox_event_message_key ON inbox_event (consumer, origin, message_id)",
    "CREATE UNIQUE INDEX inbox_event_business_key ON inbox_event (consumer, event_type, biz_key) WHERE biz_key IS NOT NULL",
];

// Undone only while every message id is unique per consumer again (`outbox_0007` undone first).
const POSTGRES_DOWN: &[&str] = &[
    "DROP INDEX inbox_event_business_key",
    "DROP INDEX inbox_event_message_key",
    "ALTER TABLE inbox_event DROP COLUMN headers",
    "ALTER TABLE inbox_event DROP COLUMN biz_key",
    "ALTER TABLE inbox_event DROP COLUMN origin",
];

const MYSQL_DOWN: &[&str] = &["ALTER TABLE inbox_event \
     DROP INDEX inbox_event_business_key, \
     DROP INDEX inbox_event_message_key, \
     DROP COLUMN headers, \
     DROP COLUMN biz_key, \
     DROP COLUMN origin"];
