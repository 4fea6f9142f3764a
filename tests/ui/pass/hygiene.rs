// The generated code must not care what the user's module calls `Result`, `Option`, `u32`, ...,
// must work when the facade crate is renamed (`crate = "..."`) and without the prelude, and must
// not trip the lints a careful workspace turns on.
#![forbid(unsafe_code)]
#![deny(missing_docs, unreachable_pub, rust_2018_idioms, unused_qualifications, warnings)]
//! Hygiene test.

extern crate outbox as renamed_outbox;

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
    mod __private01 {}

    /// An event derived among the shadowing items, through the renamed crate.
    #[derive(Serialize, renamed_outbox::DomainEvent)]
    #[event(name = "shadow.happened", aggregate = "shadow", version = 2, crate = "renamed_outbox")]
    pub struct ShadowHappened {
        #[event(aggregate_id)]
        pub(crate) id: ::core::primitive::u64,
        #[event(dedup_key)]
        pub(crate) key: ::core::option::Option<::std::string::String>,
        #[event(aggregate_version)]
        pub(crate) version: ::core::primitive::i64,
    }
}

/// Without any prelude, through an absolute crate path; a raw identifier as the type's name.
#[no_implicit_prelude]
pub mod no_prelude {
    /// An event whose type name is a raw identifier.
    #[derive(::serde::Serialize, ::renamed_outbox::DomainEvent)]
    #[event(name = "shadow.raw", aggregate = "shadow", crate = "::renamed_outbox")]
    pub struct r#Raw {
        #[event(aggregate_id)]
        pub(crate) r#type: &'static ::core::primitive::str,
    }
}

fn main() {
    use renamed_outbox::DomainEvent;

    let event = shadowing::ShadowHappened {
        id: 1,
        key: Some("k".to_owned()),
        version: 2,
    };
    assert_eq!(event.aggregate_id(), "1");
    assert_eq!(event.dedup_key(), Some("k".to_owned()));
    assert_eq!(event.aggregate_version(), Some(2));
    assert_eq!(<shadowing::ShadowHappened as DomainEvent>::SCHEMA_VERSION, 2);

    let raw = no_prelude::Raw { r#type: "t" };
    assert_eq!(raw.aggregate_id(), "t");
    assert_eq!(<no_prelude::Raw as DomainEvent>::EVENT_TYPE, "shadow.raw");
    let registration = renamed_outbox::__private01::inventory::iter::<renamed_outbox::registry::EventRegistration>
        .into_iter()
        .find(|registration| registration.event_type == "shadow.raw")
        .expect("registered");
    assert_eq!(registration.rust_type, "Raw");
}
