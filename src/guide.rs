//! The guide's code examples as doctests: each chapter of `book/src` is the documentation of an
//! empty module here, so `cargo test --doc --all-features -p outbox` compiles every Rust block of
//! the book, and runs those that need no server. Compiled only for doctests (`cfg(doctest)`).

#[doc = include_str!("../book/src/introduction.md")]
mod introduction {}

#[doc = include_str!("../book/src/getting-started.md")]
mod getting_started {}

#[doc = include_str!("../book/src/producing.md")]
mod producing {}

#[doc = include_str!("../book/src/consuming.md")]
mod consuming {}

#[doc = include_str!("../book/src/webhooks.md")]
mod webhooks {}

#[doc = include_str!("../book/src/transports.md")]
mod transports {}

#[doc = include_str!("../book/src/relay.md")]
mod relay {}

#[doc = include_str!("../book/src/wal-relay.md")]
mod wal_relay {}

#[doc = include_str!("../book/src/operating.md")]
mod operating {}

#[doc = include_str!("../book/src/many-databases.md")]
mod many_databases {}

#[doc = include_str!("../book/src/topologies.md")]
mod topologies {}

#[doc = include_str!("../book/src/console.md")]
mod console {}

#[doc = include_str!("../book/src/retention.md")]
mod retention {}

#[doc = include_str!("../book/src/evolving.md")]
mod evolving {}

#[doc = include_str!("../book/src/testing.md")]
mod testing {}

#[doc = include_str!("../book/src/deploying.md")]
mod deploying {}

#[doc = include_str!("../book/src/upgrades.md")]
mod upgrades {}

#[doc = include_str!("../book/src/reference.md")]
mod reference {}

#[doc = include_str!("../book/src/wire.md")]
mod wire {}

#[doc = include_str!("../book/src/derive.md")]
mod derive {}

#[doc = include_str!("../book/src/tables.md")]
mod tables {}
