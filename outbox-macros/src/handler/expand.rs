//! Code generation for `#[inbox_handler]`.
//!
//! The user's function is emitted as written (tests call it directly). Next to it, one
//! `const _: () = { ... };` holds the wrapper the runtime calls, the compile-time checks and the
//! registration; everything reaches the runtime through `<crate>::__private01`, so shadowing
//! `Result`, `Box`, `Send`, ... in the user's module changes nothing.
//!
//! One mistake, one error: the wrapper and the registration's event names live in an inherent impl
//! that only exists when the event type implements `DomainEvent` and `DeserializeOwned`. When it
//! does not, path resolution falls back to a trait with the same items, and the only errors are
//! the two assertions, spanned to the event type.

use super::ast::{Function, Handler, Mode};
use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{GenericArgument, Ident, LitStr, PathArguments, Type};

/// The user's function, then the wrapper, the checks and the registration.
pub(crate) fn handler(function: &Function, handler: &Handler<'_>) -> TokenStream {
    let Handler {
        krate,
        consumer,
        max_attempts,
        backoff_ms,
        backoff_cap_ms,
        ordering,
        mode,
        external,
        ident,
        tx_ty,
        event_param_ty,
        event_ty,
        output,
    } = handler;
    let private = quote!(#krate::__private01);
    let function_name = LitStr::new(&ident.unraw().to_string(), ident.span());

    // Generated tokens that stand for a piece of the user's code are placed on it, so a failed
    // check points there; they keep the macro's hygiene, so lints see generated code.
    let event_at = at(event_ty.span());
    // A handler of external messages takes any `DeserializeOwned` payload; every other handler
    // one of our `DomainEvent`s.
    let assert_event = match external {
        Some(_) => quote_spanned! {event_at=>
            #[doc(hidden)]
            const _: fn() = __outbox_assert_deserialize_owned::<#event_ty>;
        },
        None => quote_spanned! {event_at=>
            #[doc(hidden)]
            const _: fn() = __outbox_assert_domain_event::<#event_ty>;
            #[doc(hidden)]
            const _: fn() = __outbox_assert_deserialize_owned::<#event_ty>;
        },
    };
    let (bound, event_type, schema_version, decode, source) = match external {
        Some(external) => {
            let message_type = &external.message_type;
            let source = &external.source;
            (
                quote!(#private::serde::de::DeserializeOwned),
                quote!(#message_type),
                quote!(0),
                quote!(decode_external),
                quote!(#private::Some(#source)),
            )
        }
        None => (
            quote!(#private::DomainEvent + #private::serde::de::DeserializeOwned),
            quote!(<#event_ty as #private::DomainEvent>::EVENT_TYPE),
            quote!(<#event_ty as #private::DomainEvent>::SCHEMA_VERSION),
            quote!(decode),
            quote!(#private::None),
        ),
    };
    // The wrapper's locals have `macro_rules!` hygiene: a handler named `event` or `tx` still
    // calls the handler.
    let local = |name: &str, span: Span| Ident::new(name, Span::mixed_site().located_at(span));
    let (tx, envelope, attempt) = (
        local("tx", Span::call_site()),
        local("envelope", Span::call_site()),
        local("attempt", Span::call_site()),
    );
    let event = local("event", Span::call_site());
    let error = local("error", Span::call_site());
    // Mismatched parameter types are reported on the arguments of this call: `String` in
    // `tx: &String`, `MyEvent` in `event: MyEvent<OrderPlaced>`.
    let tx_arg = local("tx", last_token(tx_ty));
    let event_arg = local("event", event_param_ty.span());
    let (ok_ty, error_ty) = result_types(output);
    let ok_unit = quote_spanned!(at(ok_ty.span())=> #private::Ok(()));
    // Naming the error type as written underlines exactly it in "the trait bound
    // `(): Into<HandlerError>` is not satisfied".
    let into_handler_error = match error_ty {
        Some(error_ty) => quote_spanned! {at(error_ty.span())=>
            <#error_ty as ::core::convert::Into<#private::HandlerError>>::into(#error)
        },
        None => quote_spanned! {at(output.span())=>
            ::core::convert::Into::<#private::HandlerError>::into(#error)
        },
    };
    // A future that is not `Send` fails this coercion to `HandlerFuture`: on the function's name.
    let name_at = at(ident.span());
    let private_at_name = respan(private.clone(), name_at);
    let boxed = quote_spanned! {name_at=>
        #private_at_name::Box::pin(async move {
            let #event = match <#private::Event<#event_ty>>::#decode(#envelope, #attempt) {
                #private::Ok(#event) => #event,
                #private::Err(#error) => return #private::Err(#error),
            };
            match #ident(#tx_arg, #event_arg).await {
                #ok_unit => #private::Ok(()),
                #private::Err(#error) => #private::Err(#into_handler_error),
            }
        })
    };

    let option = |value: Option<TokenStream>| match value {
        Some(value) => quote!(#private::Some(#value)),
        None => quote!(#private::None),
    };
    let max_attempts = option(max_attempts.map(|n| quote!(#n)));
    let backoff_ms = option(backoff_ms.map(|ms| quote!(#ms)));
    let backoff_cap_ms = option(backoff_cap_ms.map(|ms| quote!(#ms)));
    let ordering = option(ordering.map(|on| quote!(#on)));
    let mode = match mode {
        _ if external.is_some() => quote!(#private::HandlerMode::Stored),
        Mode::Inline => quote!(#private::HandlerMode::Inline),
        Mode::Stored => quote!(#private::HandlerMode::Stored),
    };
    let signature = |tx, envelope, attempt| {
        quote! {
            fn handle<'a>(
                #tx: &'a #private::InboxTransaction,
                #envelope: &'a #private::Envelope,
                #attempt: ::core::primitive::u32,
            ) -> #private::HandlerFuture<'a>
        }
    };
    let wrapper = signature(quote!(#tx), quote!(#envelope), quote!(#attempt));
    let unreachable = signature(quote!(_), quote!(_), quote!(_));

    quote! {
        #function

        const _: () = {
            #[doc(hidden)]
            fn __outbox_assert_domain_event<T: ?::core::marker::Sized + #private::DomainEvent>() {}
            #[doc(hidden)]
            fn __outbox_assert_deserialize_owned<T: #private::serde::de::DeserializeOwned>() {}
            #assert_event

            #[doc(hidden)]
            struct __OutboxHandler<T: ?::core::marker::Sized>(::core::marker::PhantomData<T>);

            #[automatically_derived]
            impl __OutboxHandler<#event_ty>
            where
                // Higher-ranked to work around trivial bounds being unstable: when the bound does
                // not hold, the impl is simply absent and `__OutboxUnregistered` stands in.
                for<'__outbox> #event_ty: #bound,
            {
                const EVENT_TYPE: &'static ::core::primitive::str = #event_type;
                const SCHEMA_VERSION: ::core::primitive::u32 = #schema_version;

                /// Decodes the payload and calls the handler.
                #wrapper {
                    #boxed
                }
            }

            #[doc(hidden)]
            trait __OutboxUnregistered {
                const EVENT_TYPE: &'static ::core::primitive::str = "";
                const SCHEMA_VERSION: ::core::primitive::u32 = 0;

                #unreachable {
                    ::core::unreachable!()
                }
            }

            #[automatically_derived]
            impl<T: ?::core::marker::Sized> __OutboxUnregistered for __OutboxHandler<T> {}

            #private::inventory::submit! {
                #private::HandlerRegistration {
                    consumer: #consumer,
                    event_type: __OutboxHandler::<#event_ty>::EVENT_TYPE,
                    schema_version: __OutboxHandler::<#event_ty>::SCHEMA_VERSION,
                    handler: __OutboxHandler::<#event_ty>::handle,
                    max_attempts: #max_attempts,
                    backoff_base_ms: #backoff_ms,
                    backoff_cap_ms: #backoff_cap_ms,
                    ordering: #ordering,
                    mode: #mode,
                    source: #source,
                    function: #function_name,
                    module_path: ::core::module_path!(),
                    file: ::core::file!(),
                    line: ::core::line!(),
                }
            }
        };
    }
}

/// The errors, then the item as written: nothing else refers to what the macro would have
/// generated, so nothing else can fail.
pub(crate) fn fallback(item: &impl ToTokens, error: syn::Error) -> TokenStream {
    let error = error.into_compile_error();
    quote!(#error #item)
}

/// The macro's hygiene at the location of `span`.
fn at(span: Span) -> Span {
    Span::call_site().located_at(span)
}

/// `T` and `E` of a return type written `Result<T, E>` (any path ending in two type arguments),
/// else the whole return type and no error type.
fn result_types(output: &Type) -> (&Type, Option<&Type>) {
    if let Type::Path(path) = output
        && let Some(last) = path.path.segments.last()
        && let PathArguments::AngleBracketed(args) = &last.arguments
        && let [GenericArgument::Type(ok), GenericArgument::Type(error)] =
            args.args.iter().collect::<Vec<_>>()[..]
    {
        return (ok, Some(error));
    }
    (output, None)
}

/// The span of the last token of `ty`.
fn last_token(ty: &Type) -> Span {
    ty.to_token_stream()
        .into_iter()
        .last()
        .map_or_else(|| ty.span(), |token| token.span())
}

/// `tokens`, every one placed at `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut respanned = Group::new(group.delimiter(), respan(group.stream(), span));
                respanned.set_span(span);
                token = TokenTree::Group(respanned);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::inbox_handler;
    use quote::quote;

    fn function() -> proc_macro2::TokenStream {
        quote! {
            pub async fn reserve_stock(
                tx: &InboxTransaction,
                event: Event<OrderPlaced>,
            ) -> Result<(), HandlerError> {
                Ok(())
            }
        }
    }

    #[test]
    fn reaches_the_runtime_through_the_crate_path() {
        let out = inbox_handler(
            quote!(
                consumer = "inventory",
                backoff = "1s",
                mode = "stored",
                crate = "renamed"
            ),
            function(),
        )
        .to_string();
        assert!(out.starts_with("pub async fn reserve_stock"), "{out}");
        assert!(
            out.contains("renamed :: __private01 :: inventory :: submit !"),
            "{out}"
        );
        assert!(out.contains("consumer : \"inventory\""), "{out}");
        assert!(
            out.contains("backoff_base_ms : renamed :: __private01 :: Some (1000u64)"),
            "{out}"
        );
        assert!(
            out.contains("backoff_cap_ms : renamed :: __private01 :: None"),
            "{out}"
        );
        assert!(
            out.contains("renamed :: __private01 :: HandlerMode :: Stored"),
            "{out}"
        );
        assert!(out.contains("function : \"reserve_stock\""), "{out}");
        assert!(!out.contains(":: outbox"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn invalid_input_gives_the_errors_and_the_function_unchanged() {
        let out = inbox_handler(quote!(consumer = ""), function()).to_string();
        assert!(out.contains("compile_error"), "{out}");
        assert!(out.contains("pub async fn reserve_stock"), "{out}");
        assert!(!out.contains("const _"), "{out}");
        assert!(!out.contains("submit"), "{out}");

        let out = inbox_handler(
            quote!(consumer = "a"),
            quote!(
                struct NotAFunction;
            ),
        )
        .to_string();
        assert!(out.contains("compile_error"), "{out}");
        assert!(out.contains("goes on an `async fn`"), "{out}");
        assert!(out.ends_with("struct NotAFunction ;"), "{out}");
    }
}
