use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "ui.order", aggregate = "order", version = 1)]
struct OrderV1 {
    #[event(aggregate_id)]
    id: String,
}

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "ui.order", aggregate = "order", version = 2)]
struct OrderV2 {
    #[event(aggregate_id)]
    id: String,
}

#[upcaster]
async fn not_plain(old: OrderV1) -> OrderV2 {
    OrderV2 { id: old.id }
}

#[upcaster]
fn two_arguments(old: OrderV1, extra: u32) -> OrderV2 {
    let _ = extra;
    OrderV2 { id: old.id }
}

#[upcaster(event = "ui.order")]
fn json_without_from(payload: serde_json::Value) -> serde_json::Value {
    payload
}

#[upcaster(from = 0, colour = "red")]
fn bad_keys(payload: serde_json::Value) -> serde_json::Value {
    payload
}

fn main() {}
