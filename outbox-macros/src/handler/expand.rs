//! Code generation for `#[inbox_handler]`.
//!
//! The user's function is emitted as written (tests call it directly). Next to it, one
//! `const _: () = { ... };` holds the wrapper the runtime calls, the compile-time checks and the
//! registration; everything reaches the runtime through `<crate>::__private`, so shadowing
//! `Result`, `Box`, `Send`, ... in the user's module changes nothing.
//!
//! One mistake, one error: the wrapper and the registration's event names live in an inherent impl
//! that only exists when the event type implements `DomainEvent` and `DeserializeOwned`. When it
//! does not, path resolution falls back to a trait with the same items, and the only errors are
//! the two assertions, spanned to the event type.

use super::ast::{Function, Handler, Mode};
use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{GenericArgument, LitStr, PathArguments, Type};

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
        ident,
        tx_ty,
        event_param_ty,
        event_ty,
        output,
    } = handler;
    let private = quote!(#krate::__private);
    let function_name = LitStr::new(&ident.unraw().to_string(), ident.span());

    // Generated tokens that stand for a piece of the user's code are placed on it, so a failed
    // check points there; they keep the macro's hygiene, so lints see generated code.
    let event_at = at(event_ty.span());
    let assert_event = quote_spanned! {event_at=>
        #[doc(hidden)]
        const _: fn() = __outbox_assert_domain_event::<#event_ty>;
        #[doc(hidden)]
        const _: fn() = __outbox_assert_deserialize_owned::<#event_ty>;
    };
    // Mismatched parameter types are reported on the arguments of this call.
    let tx_arg = quote_spanned!(at(tx_ty.span())=> tx);
    let event_arg = quote_spanned!(at(event_param_ty.span())=> event);
    let error_at = at(error_type(output).span());
    let ok_unit = quote_spanned!(at(output.span())=> #private::Ok(()));
    let into_handler_error = quote_spanned! {error_at=>
        ::core::convert::Into::<#private::HandlerError>::into(error)
    };
    // A future that is not `Send` fails this coercion to `HandlerFuture`: on the function's name.
    let boxed = quote_spanned! {at(ident.span())=>
        #private::Box::pin(async move {
            let event = match <#private::Event<#event_ty>>::decode(envelope, attempt) {
                #private::Ok(event) => event,
                #private::Err(error) => return #private::Err(error),
            };
            match #ident(#tx_arg, #event_arg).await {
                #ok_unit => #private::Ok(()),
                #private::Err(error) => #private::Err(#into_handler_error),
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
    let wrapper = signature(quote!(tx), quote!(envelope), quote!(attempt));
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
                for<'__outbox> #event_ty: #private::DomainEvent
                    + #private::serde::de::DeserializeOwned,
            {
                const EVENT_TYPE: &'static ::core::primitive::str =
                    <#event_ty as #private::DomainEvent>::EVENT_TYPE;
                const SCHEMA_VERSION: ::core::primitive::u32 =
                    <#event_ty as #private::DomainEvent>::SCHEMA_VERSION;

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

/// `E` in a return type written `Result<(), E>`, else the whole return type.
fn error_type(output: &Type) -> &Type {
    if let Type::Path(path) = output
        && let Some(last) = path.path.segments.last()
        && let PathArguments::AngleBracketed(args) = &last.arguments
        && let Some(GenericArgument::Type(error)) = args.args.iter().nth(1)
        && args.args.len() == 2
    {
        return error;
    }
    output
}
