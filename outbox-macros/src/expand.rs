//! Code generation for `#[derive(DomainEvent)]`.
//!
//! Everything generated lives in one `const _: () = { ... };` and reaches the runtime only through
//! `<crate>::__private01`, so the user's crate needs no direct dependency on `serde`, `inventory`, ...
//! and shadowing `Option`, `String`, `u32`, ... in the user's module changes nothing.

use crate::ast::{Event, Input};
use crate::{fallback, valid};
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::{DeriveInput, LitStr};

/// Expands the derive: the impl and the registration, or the errors and a stub impl.
pub(crate) fn derive(node: &DeriveInput) -> TokenStream {
    match try_expand(node) {
        Ok(expanded) => expanded,
        // Still implement the trait, so code using the type as an event reports nothing more.
        Err(error) => fallback::expand(node, error),
    }
}

fn try_expand(node: &DeriveInput) -> syn::Result<TokenStream> {
    let input = Input::from_syn(node);
    let event = valid::validate(&input)?;
    Ok(impl_domain_event(&event))
}

fn impl_domain_event(event: &Event<'_>) -> TokenStream {
    let Event {
        ident,
        krate,
        name,
        aggregate,
        version,
        aggregate_id,
        dedup_key,
        aggregate_version,
    } = event;
    let private = quote!(#krate::__private01);
    let rust_type = LitStr::new(&ident.unraw().to_string(), ident.span());

    // Spanned on the struct's name: "the trait bound `OrderPlaced: Serialize` is not satisfied"
    // points at the type the user must derive `Serialize` on. It is the only error for a type
    // that is not `Serialize` (see the `where` clause of the impl).
    let assert_serialize = quote_spanned! {ident.span()=>
        #[doc(hidden)]
        const _: fn() = __assert_serialize::<#ident>;
    };

    // Each call names the field's type as written (`<Type as Trait>::method`), so a type that does
    // not implement the trait is reported on that type, the token the user must change.
    let aggregate_id_body = {
        let (field, ty) = (aggregate_id.ident, aggregate_id.ty);
        quote!(<#ty as #private::ToString>::to_string(&self.#field))
    };
    let dedup_key_fn = dedup_key.map(|key| {
        let (field, ty) = (key.ident, key.ty);
        quote! {
            fn dedup_key(&self) -> #private::Option<#private::String> {
                <#ty as #private::DedupKeyValue>::to_dedup_key(&self.#field)
            }
        }
    });
    let aggregate_version_fn = aggregate_version.map(|version| {
        let (field, ty) = (version.ident, version.ty);
        quote! {
            fn aggregate_version(&self) -> #private::Option<::core::primitive::i64> {
                <#ty as #private::AggregateVersionValue>::to_aggregate_version(&self.#field)
            }
        }
    });

    quote! {
        const _: () = {
            #[doc(hidden)]
            fn __assert_serialize<T: ?::core::marker::Sized + #private::serde::Serialize>() {}
            #assert_serialize

            #[automatically_derived]
            impl #private::DomainEvent for #ident
            where
                // Without this bound, a type that is not `Serialize` would get a second error
                // (the supertrait's) besides `__assert_serialize`'s. Higher-ranked to work around
                // trivial bounds being unstable.
                for<'__workaround> #ident: #private::serde::Serialize,
            {
                const EVENT_TYPE: &'static ::core::primitive::str = #name;
                const AGGREGATE_TYPE: &'static ::core::primitive::str = #aggregate;
                const SCHEMA_VERSION: ::core::primitive::u32 = #version;

                fn aggregate_id(&self) -> #private::String {
                    #aggregate_id_body
                }

                #dedup_key_fn
                #aggregate_version_fn
            }

            // The type's JSON Schema when it implements `schemars::JsonSchema` and the runtime's
            // feature `catalogue` is on (the by-value impl); otherwise none (the by-reference
            // impl). Method resolution picks, so no bound is placed on the user's type.
            #[doc(hidden)]
            fn __outbox_schema() -> #private::Option<#private::serde_json::Value> {
                #[allow(unused_imports)]
                use #private::{ViaJsonSchema as _, WithoutSchema as _};
                (&#private::SchemaProbe::<#ident>::new()).outbox_schema()
            }

            #private::inventory::submit! {
                #private::EventRegistration {
                    event_type: #name,
                    aggregate_type: #aggregate,
                    schema_version: #version,
                    rust_type: #rust_type,
                    module_path: ::core::module_path!(),
                    file: ::core::file!(),
                    line: ::core::line!(),
                    schema: __outbox_schema,
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(node: &DeriveInput) -> String {
        derive(node).to_string()
    }

    #[test]
    fn reaches_the_runtime_through_the_crate_path() {
        let node: DeriveInput = syn::parse_quote! {
            #[event(name = "order.placed", aggregate = "order", crate = "renamed")]
            struct OrderPlaced { #[event(aggregate_id)] id: u64, #[event(dedup_key)] key: String }
        };
        let out = expand(&node);
        assert!(
            out.contains("impl renamed :: __private01 :: DomainEvent for OrderPlaced"),
            "{out}"
        );
        assert!(
            out.contains("renamed :: __private01 :: inventory :: submit !"),
            "{out}"
        );
        assert!(out.contains("fn dedup_key"), "{out}");
        assert!(!out.contains("fn aggregate_version"), "{out}");
        assert!(!out.contains(":: outbox"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn invalid_input_gives_errors_and_a_stub() {
        let node: DeriveInput = syn::parse_quote! {
            #[event(aggregate = "order")]
            struct OrderPlaced { #[event(aggregate_id)] id: u64 }
        };
        let out = expand(&node);
        assert!(out.contains("compile_error"), "{out}");
        assert!(
            out.contains(":: outbox :: __private01 :: DomainEvent for OrderPlaced"),
            "{out}"
        );
        assert!(!out.contains("submit"), "{out}");
    }
}
