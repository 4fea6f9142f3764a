//! Procedural macros of the outbox SDK.
//!
//! Do not depend on this crate directly: use the `outbox` crate, which re-exports
//! [`macro@DomainEvent`] and everything its generated code needs (through the hidden
//! `outbox::__private` module), so your crate needs no extra dependencies.
//!
//! Layout: `attr` parses `#[event(...)]`, `ast` is the input model, `valid` checks it and
//! collects every error, `expand` generates the impl, and `fallback` emits a stub impl next to
//! the errors so one mistake gives one error.

mod ast;
mod attr;
mod expand;
mod fallback;
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
/// The derive also submits an `outbox::EventRegistration` (names, Rust type, source location) to
/// the compile-time event catalogue. A registration counts only when the crate holding the derive
/// is linked into the final binary.
#[proc_macro_derive(DomainEvent, attributes(event))]
pub fn derive_domain_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive(&input).into()
}
