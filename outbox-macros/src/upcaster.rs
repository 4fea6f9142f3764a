//! `#[upcaster]`: parse the arguments and the function, check them, and generate the wrapper and
//! the registration. Every mistake is reported on the token to change.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{
    Error, Expr, ExprLit, FnArg, GenericArgument, ItemFn, Lit, LitInt, LitStr, MetaNameValue, Path,
    PathArguments, ReturnType, Token, Type, parse::Parser, punctuated::Punctuated,
};

/// What the arguments say.
#[derive(Default)]
struct Args {
    /// `event = "order.placed"`: the JSON form's event type.
    event: Option<LitStr>,
    /// `from = 1`: the JSON form's version read.
    from: Option<LitInt>,
    /// `crate = "my_outbox"`.
    krate: Option<Path>,
}

fn parse_args(args: TokenStream, errors: &mut Vec<Error>) -> Args {
    let mut out = Args::default();
    let items = match Punctuated::<MetaNameValue, Token![,]>::parse_terminated.parse2(args) {
        Ok(items) => items,
        Err(e) => {
            errors.push(e);
            return out;
        }
    };
    for item in items {
        let key = item.path.to_token_stream().to_string();
        let lit = match &item.value {
            Expr::Lit(ExprLit { lit, .. }) => Some(lit.clone()),
            _ => None,
        };
        match (key.as_str(), lit) {
            ("event", Some(Lit::Str(s))) if !s.value().trim().is_empty() => out.event = Some(s),
            ("event", _) => errors.push(Error::new_spanned(
                &item.value,
                "`event` is the event type as a string literal, e.g. `event = \"order.placed\"`",
            )),
            ("from", Some(Lit::Int(n))) if n.base10_parse::<u32>().is_ok_and(|v| v >= 1) => {
                out.from = Some(n)
            }
            ("from", _) => errors.push(Error::new_spanned(
                &item.value,
                "`from` is the version the upcaster reads, an integer of at least 1",
            )),
            ("crate", Some(Lit::Str(s))) => match s.parse::<Path>() {
                Ok(path) => out.krate = Some(path),
                Err(_) => errors.push(Error::new_spanned(&s, "`crate` must be a path")),
            },
            ("crate", _) => errors.push(Error::new_spanned(
                &item.value,
                "`crate` is a path as a string literal, e.g. `crate = \"my_outbox\"`",
            )),
            _ => errors.push(Error::new_spanned(
                &item.path,
                format!("unknown key `{key}`: expected `event`, `from` or `crate`"),
            )),
        }
    }
    match (&out.event, &out.from) {
        (Some(event), None) => errors.push(Error::new_spanned(
            event,
            "`event` needs `from`: the version this JSON upcaster reads",
        )),
        (None, Some(from)) => errors.push(Error::new_spanned(
            from,
            "`from` needs `event`: the event type this JSON upcaster reads",
        )),
        _ => {}
    }
    out
}

/// `Result<T, E>` gives `(T, true)`; any other type `(ty, false)`.
fn output_of(ty: &Type) -> (Type, bool) {
    if let Type::Path(path) = ty
        && let Some(last) = path.path.segments.last()
        && last.ident == "Result"
        && let PathArguments::AngleBracketed(args) = &last.arguments
        && let Some(GenericArgument::Type(ok)) = args.args.first()
    {
        return (ok.clone(), true);
    }
    (ty.clone(), false)
}

pub(crate) fn upcaster(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Vec::new();
    let args = parse_args(args, &mut errors);
    let function: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            return Error::new(
                Span::call_site(),
                "#[upcaster] goes on a function: `fn v1_to_v2(old: OrderPlacedV1) -> OrderPlacedV2`",
            )
            .to_compile_error();
        }
    };
    let sig = &function.sig;
    if let Some(asyncness) = &sig.asyncness {
        errors.push(Error::new_spanned(
            asyncness,
            "an upcaster is a plain function: remove `async`",
        ));
    }
    if !sig.generics.params.is_empty() {
        errors.push(Error::new_spanned(
            &sig.generics,
            "an upcaster cannot be generic",
        ));
    }
    let input = match sig.inputs.iter().collect::<Vec<_>>().as_slice() {
        [FnArg::Typed(arg)] => Some((*arg.ty).clone()),
        _ => {
            errors.push(Error::new_spanned(
                &sig.inputs,
                "an upcaster takes one argument: the payload of the version it reads",
            ));
            None
        }
    };
    let output = match &sig.output {
        ReturnType::Type(_, ty) => Some(output_of(ty)),
        ReturnType::Default => {
            errors.push(Error::new_spanned(
                &sig.ident,
                "an upcaster returns the payload of the next version (or a `Result` of it)",
            ));
            None
        }
    };
    if !errors.is_empty() {
        let errors = errors.iter().map(Error::to_compile_error);
        return quote!(#item #(#errors)*);
    }
    let (Some(input), Some((new, fallible))) = (input, output) else {
        unreachable!("reported above");
    };

    let krate = args
        .krate
        .map_or_else(|| quote!(::outbox), |p| p.to_token_stream());
    let private = quote!(#krate::__private01);
    let name = &sig.ident;
    let name_text = name.to_string();
    let called = if fallible {
        quote!(#name(old).map_err(|e| #private::ToString::to_string(&e))?)
    } else {
        quote!(#name(old))
    };
    let (read, step) = match (&args.event, &args.from) {
        (Some(event), Some(from)) => (
            quote!(let old = payload;),
            quote! {
                event_type: #event,
                from_version: #from,
                to_event_type: #event,
                to_version: #from + 1,
            },
        ),
        _ => (
            quote! {
                let old: #input = #private::serde_json::from_value(payload).map_err(|e| {
                    #private::format!(
                        "cannot read the payload as `{}`: {}",
                        ::core::stringify!(#input),
                        e
                    )
                })?;
            },
            quote! {
                event_type: <#input as #private::DomainEvent>::EVENT_TYPE,
                from_version: <#input as #private::DomainEvent>::SCHEMA_VERSION,
                to_event_type: <#new as #private::DomainEvent>::EVENT_TYPE,
                to_version: <#new as #private::DomainEvent>::SCHEMA_VERSION,
            },
        ),
    };
    quote! {
        #function

        const _: () = {
            fn __outbox_upcast(
                payload: #private::serde_json::Value,
            ) -> #private::Result<#private::serde_json::Value, #private::String> {
                #read
                let new: #new = #called;
                #private::serde_json::to_value(&new).map_err(|e| {
                    #private::format!("cannot write the upcast payload: {}", e)
                })
            }

            #private::inventory::submit! {
                #private::UpcasterRegistration {
                    #step
                    upcast: __outbox_upcast,
                    function: #name_text,
                    module_path: ::core::module_path!(),
                    file: ::core::file!(),
                    line: ::core::line!(),
                }
            }
        };
    }
}
