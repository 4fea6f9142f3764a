// The generated code must not care what the user's module calls `Result`, `Option`, `u32`, ...,
// must work when the facade crate is renamed (`crate = "..."`), and must not trip common lints.
#![no_implicit_prelude]
#![forbid(unsafe_code)]
#![deny(missing_docs, unreachable_pub, rust_2018_idioms, unused_qualifications, warnings)]
//! Hygiene test.

extern crate outbox as renamed_outbox;
extern crate serde;
extern crate std;

/// A module that shadows everything the generated code could refer to.
pub mod shadowing {
    #![allow(dead_code, non_camel_case_types)]

    use ::serde::Serialize;

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
    struct u32;
    struct i64;
    struct str;
    mod core {}
    mod std {}
    mod serde {}
    mod inventory {}
    mod outbox {}
    mod __private {}

    /// An event derived among the shadowing items, through the renamed crate.
    #[derive(Serialize, renamed_outbox::DomainEvent)]
    #[event(name = "shadow.happened", aggregate = "shadow", version = 2, crate = "renamed_outbox")]
    pub struct ShadowHappened {
        #[event(aggregate_id)]
        pub(crate) id: ::std::primitive::u64,
        #[event(dedup_key)]
        pub(crate) key: ::std::option::Option<::std::string::String>,
        #[event(aggregate_version)]
        pub(crate) version: ::std::primitive::i64,
    }

    /// `r#type` style raw identifiers work too.
    #[derive(Serialize, renamed_outbox::DomainEvent)]
    #[event(name = "shadow.raw", aggregate = "shadow", crate = "::renamed_outbox")]
    pub struct r#Raw {
        #[event(aggregate_id)]
        pub(crate) r#type: &'static ::std::primitive::str,
    }
}

fn main() {
    use renamed_outbox::DomainEvent;
    use std::borrow::ToOwned;
    use std::option::Option::Some;

    let event = shadowing::ShadowHappened {
        id: 1,
        key: Some("k".to_owned()),
        version: 2,
    };
    std::assert_eq!(event.aggregate_id(), "1");
    std::assert_eq!(event.dedup_key(), Some("k".to_owned()));
    std::assert_eq!(event.aggregate_version(), Some(2));
    std::assert_eq!(<shadowing::ShadowHappened as DomainEvent>::SCHEMA_VERSION, 2);

    let raw = shadowing::Raw { r#type: "t" };
    std::assert_eq!(raw.aggregate_id(), "t");
    std::assert_eq!(<shadowing::Raw as DomainEvent>::EVENT_TYPE, "shadow.raw");
}
