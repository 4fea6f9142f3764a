// The code `#[inbox_handler]` generates must not care what the user's module calls `Result`,
// `Option`, `Box`, `Send`, ..., must work when the facade crate is renamed (`crate = "..."`) and
// without the prelude, and must not trip the lints a careful workspace turns on.
#![forbid(unsafe_code)]
#![deny(
    missing_docs,
    unreachable_pub,
    rust_2018_idioms,
    unused_qualifications,
    warnings
)]
//! Hygiene test.

extern crate outbox as renamed;

/// The event, outside the shadowing module: serde's own derive expects the prelude's names.
pub mod events {
    use serde::{Deserialize, Serialize};

    /// An event derived through the renamed crate.
    #[derive(Serialize, Deserialize, renamed::DomainEvent)]
    #[event(name = "shadow.happened", aggregate = "shadow", crate = "renamed")]
    pub struct ShadowHappened {
        #[event(aggregate_id)]
        pub(crate) id: i64,
    }
}

/// A module that shadows everything the generated code could refer to.
pub mod shadowing {
    #![allow(dead_code, non_camel_case_types)]

    use crate::events::ShadowHappened;

    struct Result;
    struct Option;
    struct Box;
    struct String;
    struct ToString;
    struct Some;
    struct None;
    struct Ok;
    struct Err;
    struct Send;
    struct Sync;
    struct Sized;
    struct Future;
    struct Pin;
    struct PhantomData;
    struct Into;
    struct From;
    struct u32;
    struct u64;
    struct str;
    struct Event;
    struct Envelope;
    struct HandlerError;
    struct InboxTransaction;
    struct HandlerFuture;
    mod core {}
    mod std {}
    mod serde {}
    mod inventory {}
    mod outbox {}
    mod __private01 {}

    /// A handler written among the shadowing items, through the renamed crate.
    #[renamed::inbox_handler(consumer = "shadow", max_attempts = 2, crate = "renamed")]
    pub(crate) async fn on_shadow(
        _tx: &renamed::inbox::InboxTransaction,
        event: renamed::inbox::Event<ShadowHappened>,
    ) -> ::core::result::Result<(), renamed::inbox::HandlerError> {
        let _ = event.id;
        ::core::result::Result::Ok(())
    }
}

/// Without any prelude, through an absolute crate path; a raw identifier as the handler's name.
#[no_implicit_prelude]
pub mod no_prelude {
    /// A handler whose name is a raw identifier.
    #[::renamed::inbox_handler(consumer = "raw", crate = "::renamed")]
    pub(crate) async fn r#match(
        _tx: &::renamed::inbox::InboxTransaction,
        _event: ::renamed::inbox::Event<crate::events::ShadowHappened>,
    ) -> ::core::result::Result<(), ::renamed::inbox::HandlerError> {
        ::core::result::Result::Ok(())
    }
}

/// Handlers named like the wrapper's locals still get called.
pub mod names {
    use crate::events::ShadowHappened;
    use renamed::inbox::{Event, HandlerError, InboxTransaction};
    use renamed::inbox_handler;

    /// Named like the decoded event.
    #[inbox_handler(consumer = "names-event", crate = "renamed")]
    pub(crate) async fn event(
        tx: &InboxTransaction,
        event: Event<ShadowHappened>,
    ) -> Result<(), HandlerError> {
        let _ = (tx, event.id);
        Ok(())
    }

    /// Named like the transaction.
    #[inbox_handler(consumer = "names-tx", crate = "renamed")]
    pub(crate) async fn tx(
        envelope: &InboxTransaction,
        attempt: Event<ShadowHappened>,
    ) -> Result<(), HandlerError> {
        let _ = (envelope, attempt);
        Ok(())
    }

    /// Named like the error.
    #[inbox_handler(consumer = "names-error", crate = "renamed")]
    pub(crate) async fn error(
        _tx: &InboxTransaction,
        error: Event<ShadowHappened>,
    ) -> Result<(), HandlerError> {
        Err(HandlerError::retry(error.id))
    }
}

fn main() {
    let find = |consumer: &str| {
        renamed::__private01::inventory::iter::<renamed::inbox::HandlerRegistration>
            .into_iter()
            .find(|registration| registration.consumer == consumer)
            .expect("registered")
    };
    let shadow = find("shadow");
    assert_eq!(shadow.event_type, "shadow.happened");
    assert_eq!(shadow.max_attempts, Some(2));
    assert_eq!(shadow.function, "on_shadow");
    let raw = find("raw");
    assert_eq!(raw.event_type, "shadow.happened");
    assert_eq!(raw.function, "match");
    assert_eq!(raw.module_path, concat!(module_path!(), "::no_prelude"));
    for (consumer, function) in [
        ("names-event", "event"),
        ("names-tx", "tx"),
        ("names-error", "error"),
    ] {
        assert_eq!(find(consumer).function, function);
    }
}
