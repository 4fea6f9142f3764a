//! The integration tests: one binary, one module per area, sharing the support code in
//! `common`. Every test works on a database, stream, queue or key of its own, so the tests run
//! in parallel in this one process.
//!
//! What is global to a process is handled here: handlers registered with `#[inbox_handler]`
//! are linked in from every module, so each runtime names the consumers it runs
//! (`Runtime::builder(..).consumers([..])`), and consumer names are unique across modules; a
//! test that records metrics or traces does it into a recorder or subscriber of its own, set on
//! the threads of a tokio runtime of its own. Two tests stay separate binaries: `tests/chaos.rs`
//! (kills and restarts processes) and `tests/failpoints.rs` (arms process-wide failpoints).
//!
//! Run one area with e.g. `cargo test --all-features --test it -- relay::`.

#[macro_use]
mod common;

mod admin;
mod bad_input;
mod book;
#[cfg(feature = "catalogue")]
mod catalogue;
#[cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod claim_floor;
mod claim_window;
#[cfg(feature = "cli")]
mod cli;
#[cfg(all(feature = "cli", feature = "postgres", feature = "mysql"))]
mod cli_set;
mod compact;
mod conformance;
#[cfg(feature = "console")]
mod console;
#[cfg(all(feature = "console", feature = "postgres", feature = "mysql"))]
mod console_set;
mod dashboards;
mod delayed;
#[cfg(all(feature = "postgres-wal", feature = "nats"))]
mod failover;
#[cfg(feature = "testing")]
mod failure_groups;
mod fast_path;
#[cfg(all(feature = "postgres", feature = "mysql", feature = "kafka"))]
mod fleet;
mod fleet_budget;
#[cfg(feature = "postgres-wal")]
mod fleet_wal;
mod golden_sql;
#[cfg(feature = "axum")]
mod health;
mod inbox;
#[cfg(feature = "nats")]
mod inbox_nats;
mod inbox_rotation;
mod janitor;
#[cfg(feature = "testing")]
mod kit;
mod metrics;
mod migrations;
#[cfg(all(feature = "opentelemetry", feature = "nats"))]
mod otel;
#[cfg(all(
    feature = "postgres",
    feature = "nats",
    feature = "rabbitmq",
    feature = "redis"
))]
mod outages;
mod outbox_transaction;
#[cfg(all(feature = "postgres", feature = "nats", feature = "redis"))]
mod partitions;
#[cfg(all(
    feature = "postgres",
    feature = "nats",
    feature = "sqlite",
    feature = "cli"
))]
mod pause;
mod pooler;
#[cfg(all(feature = "postgres", feature = "kafka"))]
mod rebalance;
mod relay;
#[cfg(feature = "nats")]
mod relay_nats;
mod sent_rotation;
mod state_machine;
mod transport;
mod ui;
mod upcast;
#[cfg(feature = "postgres")]
mod wakeup;
#[cfg(feature = "postgres-wal")]
mod wal;
mod webhooks;
