//! Procedural macros of the outbox SDK.
//!
//! Do not depend on this crate directly: use the `outbox` crate, which re-exports
//! [`macro@DomainEvent`], [`macro@inbox_handler`] and everything their generated code needs
//! (through the hidden `outbox::__private01` module), so your crate needs no extra dependencies.
//!
//! Layout of the derive: `attr` parses `#[event(...)]`, `ast` is the input model, `valid` checks
//! it and collects every error, `expand` generates the impl, and `fallback` emits a stub impl next
//! to the errors so one mistake gives one error. `handler` holds the same steps for
//! `#[inbox_handler]`; `keys` is the `key = value` parsing both share.

mod ast;
mod attr;
mod expand;
mod fallback;
mod handler;
mod keys;
mod upcaster;
mod valid;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

/// Implements `outbox::DomainEvent` for a struct and registers the event type at compile time.
///
/// ```ignore
/// use outbox::DomainEvent;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Serialize, Deserialize, DomainEvent)]
/// #[event(name = "order.placed", aggregate = "order", version = 1)]
/// pub struct OrderPlaced {
///     #[event(aggregate_id)]
///     pub order_id: i64,
///     #[event(dedup_key)]
///     pub request_id: Option<String>,
///     #[event(aggregate_version)]
///     pub version: u64,
///     pub order_no: String,
/// }
/// ```
///
/// # On the struct: `#[event(...)]`
///
/// - `name = "order.placed"` (required): the event type stored in the outbox and sent as the
///   CloudEvents `type`. Non-empty, at most 255 characters, no whitespace. Never derived from the
///   Rust type's name, so renaming a type or module cannot break consumers.
/// - `aggregate = "order"` (required): the kind of aggregate the event belongs to, at most 128
///   characters.
/// - `version = 2` (optional, default `1`): the payload's schema version, at least 1.
/// - `crate = "my_outbox"` (optional, default `::outbox`): the path of the `outbox` crate when it
///   is renamed in `Cargo.toml` or re-exported by another crate.
///
/// # On the fields
///
/// - `#[event(aggregate_id)]` (exactly one field): the aggregate's id, any type implementing
///   `ToString`. Events of one aggregate are published in the order they were enqueued.
/// - `#[event(dedup_key)]` (at most one field): a producer-side idempotency key: `String`, `&str`,
///   integers, `Uuid`, or an `Option` of those (`None` means no key).
/// - `#[event(aggregate_version)]` (at most one field): the aggregate's version after this event,
///   an integer or an `Option` of one.
///
/// The struct must have named fields, no generic parameters, and implement `serde::Serialize`.
///
/// The derive also submits an `outbox::registry::EventRegistration` (names, Rust type, source location) to
/// the compile-time event catalogue. A registration counts only when the crate holding the derive
/// is linked into the final binary.
#[proc_macro_derive(DomainEvent, attributes(event))]
pub fn derive_domain_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive(&input).into()
}

/// Declares an inbox handler: an `async fn` the runtime calls once per delivered event of one
/// type, inside the transaction that records the delivery in the inbox.
///
/// ```ignore
/// use outbox::prelude::*;
///
/// #[inbox_handler(consumer = "inventory", max_attempts = 5, backoff = "500ms")]
/// async fn reserve_stock(
///     tx: &InboxTransaction,
///     event: Event<OrderPlaced>,
/// ) -> Result<(), HandlerError> {
///     // Any SeaORM call with `tx`; `tx.enqueue(&StockReserved { .. })?` commits a follow-up
///     // event with the consumption.
///     stock::reserve(tx, event.order_id).await?;
///     Ok(())
/// }
/// ```
///
/// The handler's database writes commit together with the inbox record of the message, so they
/// happen once per `(consumer, event id)`, through redeliveries, crashes and concurrent consumers.
/// Returning an error rolls them back; the message is retried with backoff, or moved to DEAD at
/// once by `HandlerError::permanent`.
///
/// # Arguments
///
/// - `consumer = "inventory"` (required): the consumer's name, stored with every message it
///   handles. Non-empty, at most 128 characters, no whitespace. Never derived from the function's
///   name or module, so renaming them cannot make messages look new. Handlers of one event under
///   different consumers each get every event; a consumer has at most one handler per event type
///   and schema version (the runtime refuses to start on a duplicate and names both locations).
/// - `max_attempts = 5` (optional, at least 1): attempts before the message goes DEAD.
/// - `backoff = "500ms"` (optional): the delay before the first retry; it doubles after each
///   failure, plus jitter.
/// - `backoff_cap = "5m"` (optional, at least `backoff`): the longest delay between two attempts.
///   Durations are an integer and a unit: `ms`, `s`, `m` or `h`.
/// - `ordering = false` (optional): whether events of one aggregate are handled in order.
/// - `mode = "stored"` (optional, default `"inline"`): `"inline"` handles the event on delivery
///   and acknowledges the broker after the commit; `"stored"` records it and acknowledges first,
///   then handles it in the background (webhooks, slow handlers).
/// - `crate = "my_outbox"` (optional, default `::outbox`): the path of the `outbox` crate when it
///   is renamed in `Cargo.toml` or re-exported by another crate.
///
/// Options not given use the runtime's configuration.
///
/// # The function
///
/// An `async fn` (not a method, not generic) taking the transaction by reference
/// (`&InboxTransaction`) and the event by value (`Event<T>`, where `T` derives `DomainEvent` and
/// implements `serde::Deserialize`), returning `Result<(), E>` where `E` converts into
/// `HandlerError` (any `std::error::Error + Send + Sync + 'static` does). Its future must be
/// `Send`: do not hold an `Rc` or a `std::sync::MutexGuard` across an `.await`. Each of these is
/// checked at compile time, and reported on the token to change.
///
/// The function stays as written, so tests can call it directly. The attribute adds a wrapper that
/// decodes the payload and calls it, and submits an `outbox::inbox::HandlerRegistration` (consumer, event
/// type and schema version, options, source location) that the runtime finds at start-up. A
/// registration counts only when the crate holding the handler is linked into the final binary.
#[proc_macro_attribute]
pub fn inbox_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    handler::inbox_handler(args.into(), item.into()).into()
}

/// Declares an upcaster: how the payload of one version of an event becomes the next version's.
///
/// ```ignore
/// use outbox::prelude::*;
///
/// // From the old struct to the new one (both derive `DomainEvent`, same event type, versions
/// // N and N + 1):
/// #[upcaster]
/// fn order_placed_v1_to_v2(old: OrderPlacedV1) -> OrderPlacedV2 {
///     OrderPlacedV2 { order_id: old.order_id, currency: "EUR".into() }
/// }
///
/// // Or on the JSON, for a version whose struct is gone; a `Result` for steps that can fail:
/// #[upcaster(event = "order.placed", from = 2)]
/// fn order_placed_v2_to_v3(
///     mut payload: serde_json::Value,
/// ) -> Result<serde_json::Value, String> {
///     payload["total_cents"] = payload["total"].as_f64().map(|t| (t * 100.0).round()).into();
///     Ok(payload)
/// }
/// ```
///
/// A consumer whose handler takes version 3 then handles versions 1 and 2 as well, upcast through
/// the chain right before the handler runs; `event.meta().received_schema_version` says what
/// arrived. An upcaster that fails (its `Err`, or a payload it cannot read) leaves the message
/// DEAD with the error. The runtime refuses to start on two upcasters for one step, one that does
/// not take exactly one step, or a gap in a chain below a version a consumer handles.
///
/// # Arguments
///
/// - none: the function takes the old struct and returns the new one (or a `Result` of it,
///   whose error is `Display`);
/// - `event = "order.placed", from = 2`: the function takes and returns `serde_json::Value` (or a
///   `Result` of it), reading version `from` and writing `from + 1`;
/// - `crate = "my_outbox"` (optional, default `::outbox`): the path of the `outbox` crate.
///
/// The function stays as written; the attribute adds a wrapper and submits an
/// `outbox::upcast::UpcasterRegistration` that the runtime finds at start-up.
#[proc_macro_attribute]
pub fn upcaster(args: TokenStream, item: TokenStream) -> TokenStream {
    upcaster::upcaster(args.into(), item.into()).into()
}
