//! Validation: turns an [`Input`] into a [`Handler`], reporting every mistake at once, each spanned
//! to the token the user must change.
//!
//! The checks here are syntactic. What only the compiler knows (the event type implements
//! `DomainEvent`, the future is `Send`, the error converts into `HandlerError`) is checked by the
//! generated code, spanned to the same tokens (see [`super::expand`]).

use super::ast::{External, Handler, Input, Mode};
use crate::keys::{combine, crate_path};
use proc_macro2::Span;
use syn::punctuated::Punctuated;
use syn::{
    Error, FnArg, GenericArgument, LitInt, LitStr, PathArguments, ReturnType, Signature, Token,
    Type,
};

/// The longest consumer name the inbox stores (`inbox_event.consumer`).
const MAX_CONSUMER_LEN: usize = 128;
/// The longest source and message type the inbox stores.
const MAX_KEY_LEN: usize = 255;
const SIGNATURE: &str = "(tx: &InboxTransaction, event: Event<OrderPlaced>)";

/// Checks `input`, returning all its errors (parse errors included) combined into one.
pub(crate) fn validate<'a>(input: &'a Input<'a>) -> syn::Result<Handler<'a>> {
    let mut errors = input.errors.clone();
    let options = check_args(input, &mut errors);
    let signature = check_signature(&input.function.sig, &mut errors);
    match (options, signature) {
        (Some(options), Some(signature)) if errors.is_empty() => Ok(Handler {
            krate: options.krate,
            consumer: options.consumer,
            max_attempts: options.max_attempts,
            backoff_ms: options.backoff_ms,
            backoff_cap_ms: options.backoff_cap_ms,
            ordering: options.ordering,
            mode: options.mode,
            external: options.external,
            ident: &input.function.sig.ident,
            tx_ty: signature.tx_ty,
            event_param_ty: signature.event_param_ty,
            event_ty: signature.event_ty,
            output: signature.output,
        }),
        _ => Err(combine(errors).unwrap_or_else(|| {
            Error::new(input.function.sig.ident.span(), "invalid #[inbox_handler]")
        })),
    }
}

struct Options {
    krate: syn::Path,
    consumer: LitStr,
    max_attempts: Option<u32>,
    backoff_ms: Option<u64>,
    backoff_cap_ms: Option<u64>,
    ordering: Option<bool>,
    mode: Mode,
    external: Option<External>,
}

fn check_args(input: &Input<'_>, errors: &mut Vec<Error>) -> Option<Options> {
    let args = &input.args;
    let consumer = match &args.consumer {
        Some(lit) => check_consumer(lit, errors),
        None => {
            // After a syntax error in the arguments, "missing consumer" would only repeat it.
            if !args.has_errors {
                errors.push(Error::new(
                    Span::call_site(),
                    "missing `consumer`: write #[inbox_handler(consumer = \"inventory\")]; the \
                     consumer's name is stored with every message it handles",
                ));
            }
            None
        }
    };
    let max_attempts = args
        .max_attempts
        .as_ref()
        .map(|lit| check_max_attempts(lit, errors));
    let backoff = args
        .backoff
        .as_ref()
        .map(|lit| check_duration(lit, "backoff", errors));
    let backoff_cap = args
        .backoff_cap
        .as_ref()
        .map(|lit| check_duration(lit, "backoff_cap", errors));
    if let (Some(Some(base)), Some(Some(cap))) = (backoff, backoff_cap)
        && let (Some(base_lit), Some(cap_lit)) = (&args.backoff, &args.backoff_cap)
        && cap < base
    {
        errors.push(Error::new(
            cap_lit.span(),
            format!(
                "`backoff_cap` ({}) is shorter than `backoff` ({}): the cap is the longest \
                 delay between two attempts, the backoff the first one",
                cap_lit.value(),
                base_lit.value(),
            ),
        ));
    }
    let mode = match &args.mode {
        Some(lit) => check_mode(lit, errors),
        None => Some(Mode::Inline),
    };
    let external = check_external(args, errors);
    let krate = crate_path(args.krate.as_ref())
        .map_err(|error| errors.push(error))
        .ok();

    Some(Options {
        krate: krate?,
        consumer: consumer?,
        max_attempts: optional(max_attempts)?,
        backoff_ms: optional(backoff)?,
        backoff_cap_ms: optional(backoff_cap)?,
        ordering: args.ordering.as_ref().map(|lit| lit.value),
        mode: mode?,
        external: external?,
    })
}

/// `source` and `message_type`: both (a handler of external messages) or neither. `Some(None)`
/// for neither, `None` after an error.
fn check_external(args: &super::attr::Args, errors: &mut Vec<Error>) -> Option<Option<External>> {
    let text = |lit: &LitStr, key: &str, errors: &mut Vec<Error>| {
        let value = lit.value();
        if value.trim().is_empty() {
            errors.push(Error::new(lit.span(), format!("`{key}` is empty")));
            return false;
        }
        if value.chars().count() > MAX_KEY_LEN {
            errors.push(Error::new(
                lit.span(),
                format!(
                    "`{key}` is {} characters long; the inbox stores at most {MAX_KEY_LEN}",
                    value.chars().count()
                ),
            ));
            return false;
        }
        true
    };
    match (&args.source, &args.message_type) {
        (None, None) => Some(None),
        (Some(source), Some(message_type)) => {
            let ok = text(source, "source", errors) & text(message_type, "message_type", errors);
            if let Some(mode) = &args.mode {
                errors.push(Error::new(
                    mode.span(),
                    "`mode` does not apply to external messages: they are always recorded \
                     first and handled by the consumer's worker; remove `mode`",
                ));
                return None;
            }
            ok.then(|| {
                Some(External {
                    source: source.clone(),
                    message_type: message_type.clone(),
                })
            })
        }
        (Some(source), None) => {
            errors.push(Error::new(
                source.span(),
                "`source` needs `message_type`: a handler of external messages names both, e.g. \
                 `source = \"stripe\", message_type = \"payment_intent.succeeded\"`",
            ));
            None
        }
        (None, Some(message_type)) => {
            errors.push(Error::new(
                message_type.span(),
                "`message_type` needs `source`: a handler of external messages names both, \
                 e.g. `source = \"stripe\", message_type = \"payment_intent.succeeded\"`",
            ));
            None
        }
    }
}

/// An optional key's checked value: `Some(None)` when the key is absent, `None` when its value is
/// invalid (the error is already recorded).
fn optional<T>(checked: Option<Option<T>>) -> Option<Option<T>> {
    match checked {
        None => Some(None),
        Some(value) => value.map(Some),
    }
}

fn check_consumer(lit: &LitStr, errors: &mut Vec<Error>) -> Option<LitStr> {
    let value = lit.value();
    let len = value.chars().count();
    let error = if value.is_empty() {
        "`consumer` must not be empty, e.g. `consumer = \"inventory\"`".to_owned()
    } else if len > MAX_CONSUMER_LEN {
        format!("`consumer` is {len} characters long; the inbox stores at most {MAX_CONSUMER_LEN}")
    } else if value.chars().any(char::is_whitespace) {
        format!(
            "`consumer` must not contain whitespace: `{value}`; use `-` or `.`, e.g. \
             `billing-emails`"
        )
    } else {
        return Some(lit.clone());
    };
    errors.push(Error::new(lit.span(), error));
    None
}

fn check_max_attempts(lit: &LitInt, errors: &mut Vec<Error>) -> Option<u32> {
    let error = match lit.base10_parse::<u32>() {
        Ok(0) => "`max_attempts` must be at least 1: the first delivery is attempt 1, \
                  `max_attempts = 1` means no retry"
            .to_owned(),
        Ok(value) if matches!(lit.suffix(), "" | "u32") => return Some(value),
        Ok(_) => format!(
            "`max_attempts` is a u32: write `max_attempts = {}` without the `{}` suffix",
            lit.base10_digits(),
            lit.suffix()
        ),
        Err(_) => format!(
            "`max_attempts` must fit in a u32 (1 to {}), found `{}`",
            u32::MAX,
            lit.base10_digits()
        ),
    };
    errors.push(Error::new(lit.span(), error));
    None
}

fn check_duration(lit: &LitStr, key: &str, errors: &mut Vec<Error>) -> Option<u64> {
    match parse_duration_ms(&lit.value()) {
        Ok(0) => {
            errors.push(Error::new(
                lit.span(),
                format!("`{key}` must be at least 1ms, found `{}`", lit.value()),
            ));
            None
        }
        Ok(ms) => Some(ms),
        Err(why) => {
            errors.push(Error::new(lit.span(), format!("invalid `{key}`: {why}")));
            None
        }
    }
}

/// Parses a duration written as an integer and a unit (`ms`, `s`, `m`, `h`) into milliseconds.
///
/// The error says what is wrong, for "invalid `backoff`: ..." messages.
pub(crate) fn parse_duration_ms(text: &str) -> Result<u64, String> {
    const UNITS: &str = "`ms`, `s`, `m` or `h`";
    if text.trim().is_empty() {
        return Err(format!(
            "expected a duration, an integer followed by {UNITS}, e.g. \"500ms\""
        ));
    }
    let digits = text.len() - text.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(format!(
            "`{text}` is not a duration: write an integer followed by {UNITS}, e.g. \"500ms\""
        ));
    }
    if let Some(fraction) = unit.strip_prefix('.')
        && fraction.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!(
            "`{text}` has a fraction: write an integer of a smaller unit, e.g. \"1500ms\" \
             instead of \"1.5s\""
        ));
    }
    let factor: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            let written = unit.trim();
            return Err(match unit_named(written) {
                Some(unit) => format!("write \"{number}{unit}\" instead of `{text}`"),
                None if written.is_empty() => format!(
                    "`{text}` has no unit: write {number} followed by {UNITS}, e.g. \
                     \"{number}ms\""
                ),
                None => format!(
                    "unknown unit `{written}` in `{text}`; expected {UNITS}, e.g. \"{number}s\""
                ),
            });
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("`{text}` is too long"))
}

/// The unit meant by a unit written another way (`sec`, `Minutes`, ...).
fn unit_named(written: &str) -> Option<&'static str> {
    Some(match written.to_ascii_lowercase().as_str() {
        "ms" | "msec" | "msecs" | "milli" | "millis" | "millisecond" | "milliseconds" => "ms",
        "s" | "sec" | "secs" | "second" | "seconds" => "s",
        "m" | "min" | "mins" | "minute" | "minutes" => "m",
        "h" | "hr" | "hrs" | "hour" | "hours" => "h",
        _ => return None,
    })
}

fn check_mode(lit: &LitStr, errors: &mut Vec<Error>) -> Option<Mode> {
    match lit.value().as_str() {
        "inline" => Some(Mode::Inline),
        "stored" => Some(Mode::Stored),
        other => {
            errors.push(Error::new(
                lit.span(),
                format!(
                    "unknown mode `{other}`; expected \"inline\" (handle on delivery, the \
                     default) or \"stored\" (store and acknowledge first, handle later)"
                ),
            ));
            None
        }
    }
}

struct Parts<'a> {
    tx_ty: &'a Type,
    event_param_ty: &'a Type,
    event_ty: &'a Type,
    output: &'a Type,
}

fn check_signature<'a>(sig: &'a Signature, errors: &mut Vec<Error>) -> Option<Parts<'a>> {
    let before = errors.len();
    if let Some(constness) = &sig.constness {
        errors.push(Error::new(
            constness.span,
            "an inbox handler cannot be `const`",
        ));
    }
    if let Some(unsafety) = &sig.unsafety {
        errors.push(Error::new(
            unsafety.span,
            "an inbox handler cannot be `unsafe`: the runtime calls it like any safe function",
        ));
    }
    if let Some(abi) = &sig.abi {
        errors.push(Error::new_spanned(
            abi,
            "an inbox handler cannot have an `extern` ABI",
        ));
    }
    if sig.asyncness.is_none() {
        errors.push(Error::new(
            sig.fn_token.span,
            format!(
                "an inbox handler must be an `async fn`: write `async fn {}{SIGNATURE} -> \
                 Result<(), HandlerError>`",
                sig.ident
            ),
        ));
    }
    let generic = "an inbox handler cannot be generic: the runtime calls one function per \
                   consumer and event type; write one handler per event type";
    if !sig.generics.params.is_empty() {
        errors.push(Error::new_spanned(&sig.generics, generic));
    } else if let Some(where_clause) = &sig.generics.where_clause {
        errors.push(Error::new_spanned(where_clause, generic));
    }
    let params = check_params(sig, errors);
    let output = match &sig.output {
        ReturnType::Type(_, ty) => Some(&**ty),
        ReturnType::Default => {
            errors.push(Error::new(
                sig.paren_token.span.close(),
                "an inbox handler returns its outcome: add `-> Result<(), HandlerError>`",
            ));
            None
        }
    };
    let (tx_ty, event_param_ty, event_ty) = params?;
    if errors.len() > before {
        return None;
    }
    Some(Parts {
        tx_ty,
        event_param_ty,
        event_ty,
        output: output?,
    })
}

/// The transaction's type, the event parameter's type and the event type.
fn check_params<'a>(
    sig: &'a Signature,
    errors: &mut Vec<Error>,
) -> Option<(&'a Type, &'a Type, &'a Type)> {
    let inputs: &Punctuated<FnArg, Token![,]> = &sig.inputs;
    if let Some(receiver) = inputs.iter().find_map(|arg| match arg {
        FnArg::Receiver(receiver) => Some(receiver),
        FnArg::Typed(_) => None,
    }) {
        errors.push(Error::new_spanned(
            receiver,
            format!(
                "an inbox handler is a free function, not a method: remove `self` and move the \
                 function out of the `impl`: `async fn {}{SIGNATURE}`",
                sig.ident
            ),
        ));
        return None;
    }
    let types: Vec<&Type> = inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Typed(pat) => Some(&*pat.ty),
            FnArg::Receiver(_) => None,
        })
        .collect();
    let [tx_ty, event_param_ty, rest @ ..] = types.as_slice() else {
        let found = match types.len() {
            0 => "none".to_owned(),
            n => n.to_string(),
        };
        errors.push(Error::new(
            sig.paren_token.span.join(),
            format!(
                "an inbox handler takes two parameters, the transaction and the event: \
                 `{SIGNATURE}`; found {found}"
            ),
        ));
        return None;
    };
    if !rest.is_empty() {
        // Spanned from the third parameter to the last: the ones to remove.
        let extra: Vec<&FnArg> = inputs.iter().skip(2).collect();
        errors.push(Error::new_spanned(
            quote::quote!(#(#extra),*),
            format!(
                "an inbox handler takes two parameters, the transaction and the event: \
                 `{SIGNATURE}`; found {}",
                types.len()
            ),
        ));
    }

    if event_type(tx_ty).is_some() && reference(event_param_ty) {
        errors.push(Error::new(
            sig.paren_token.span.join(),
            format!("the transaction comes first, then the event: `{SIGNATURE}`"),
        ));
        return None;
    }
    let tx_ok = check_tx(tx_ty, errors);
    let event_ty = match event_type(event_param_ty) {
        Some(Ok(ty)) => Some(ty),
        Some(Err(error)) => {
            errors.push(error);
            None
        }
        None => {
            let hint = if reference(event_param_ty) {
                "; take the event by value"
            } else {
                ""
            };
            errors.push(Error::new_spanned(
                event_param_ty,
                format!(
                    "the second parameter is the event: `event: Event<OrderPlaced>`, where \
                     `OrderPlaced` derives `DomainEvent`{hint}"
                ),
            ));
            None
        }
    };
    (tx_ok && rest.is_empty()).then_some((*tx_ty, *event_param_ty, event_ty?))
}

fn ungroup(mut ty: &Type) -> &Type {
    while let Type::Group(group) = ty {
        ty = &group.elem;
    }
    ty
}

fn reference(ty: &Type) -> bool {
    matches!(ungroup(ty), Type::Reference(_))
}

fn check_tx(ty: &Type, errors: &mut Vec<Error>) -> bool {
    match ungroup(ty) {
        Type::Reference(reference) => match &reference.mutability {
            None => true,
            Some(mutability) => {
                errors.push(Error::new(
                    mutability.span,
                    "the transaction is borrowed shared: write `tx: &InboxTransaction`, \
                     without `mut`",
                ));
                false
            }
        },
        other => {
            errors.push(Error::new_spanned(
                other,
                "the first parameter is the transaction, by reference: `tx: &InboxTransaction`; \
                 the runtime commits it after the handler returns",
            ));
            false
        }
    }
}

/// `Some(Ok(T))` for `Event<T>` (any path ending in `Event`), `Some(Err(..))` for an `Event<..>`
/// without exactly one usable type argument, `None` for anything else.
fn event_type(ty: &Type) -> Option<syn::Result<&Type>> {
    let Type::Path(path) = ungroup(ty) else {
        return None;
    };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last()?;
    if last.ident != "Event" {
        return None;
    }
    let usage = "write the event type as `Event<OrderPlaced>`, where `OrderPlaced` derives \
                 `DomainEvent`";
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return Some(Err(Error::new_spanned(
            ty,
            format!("`Event` needs the event type: {usage}"),
        )));
    };
    let mut types = args.args.iter().filter_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    });
    let (Some(event), None, 1) = (types.next(), types.next(), args.args.len()) else {
        return Some(Err(Error::new_spanned(
            args,
            format!("`Event` takes exactly one type: {usage}"),
        )));
    };
    match ungroup(event) {
        Type::ImplTrait(_) | Type::Infer(_) | Type::TraitObject(_) => {
            Some(Err(Error::new_spanned(
                event,
                "the event type must be a concrete type that derives `DomainEvent`, e.g. \
             `Event<OrderPlaced>`",
            )))
        }
        _ => Some(Ok(event)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::ast::Function;
    use proc_macro2::TokenStream;
    use quote::quote;

    /// The messages of every error `validate` reports.
    fn errors(args: TokenStream, function: TokenStream) -> Vec<String> {
        let function: Function = syn::parse2(function).expect("a function");
        let input = Input::new(args, &function);
        match validate(&input) {
            Ok(_) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    fn handler_fn() -> TokenStream {
        quote! {
            async fn reserve(tx: &InboxTransaction, event: Event<OrderPlaced>) -> Result<(), HandlerError> {
                Ok(())
            }
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("2s"), Ok(2_000));
        assert_eq!(parse_duration_ms("5m"), Ok(300_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_duration_ms("0ms"), Ok(0));
        assert_eq!(parse_duration_ms("007s"), Ok(7_000));
        assert_eq!(parse_duration_ms("18446744073709551615ms"), Ok(u64::MAX));
        let error = |text: &str| parse_duration_ms(text).unwrap_err();
        assert_eq!(
            error(""),
            "expected a duration, an integer followed by `ms`, `s`, `m` or `h`, e.g. \"500ms\""
        );
        assert_eq!(
            error("500"),
            "`500` has no unit: write 500 followed by `ms`, `s`, `m` or `h`, e.g. \"500ms\""
        );
        assert_eq!(error("5sec"), "write \"5s\" instead of `5sec`");
        assert_eq!(
            error("5 fortnights"),
            "unknown unit `fortnights` in `5 fortnights`; expected `ms`, `s`, `m` or `h`, e.g. \"5s\""
        );
        assert_eq!(error("5 s"), "write \"5s\" instead of `5 s`");
        assert_eq!(error("5 seconds"), "write \"5s\" instead of `5 seconds`");
        assert_eq!(error("10min"), "write \"10m\" instead of `10min`");
        assert_eq!(error("2Hours"), "write \"2h\" instead of `2Hours`");
        assert_eq!(error("250MS"), "write \"250ms\" instead of `250MS`");
        assert_eq!(
            error("250 "),
            "`250 ` has no unit: write 250 followed by `ms`, `s`, `m` or `h`, e.g. \"250ms\""
        );
        assert_eq!(
            error("1.5s"),
            "`1.5s` has a fraction: write an integer of a smaller unit, e.g. \"1500ms\" instead \
             of \"1.5s\""
        );
        for text in ["ms", "-5s", "+5s", " 5s", "five seconds"] {
            assert!(
                error(text).contains("is not a duration"),
                "{text}: {}",
                error(text)
            );
        }
        assert_eq!(
            error("5d"),
            "unknown unit `d` in `5d`; expected `ms`, `s`, `m` or `h`, e.g. \"5s\""
        );
        assert_eq!(
            error("18446744073709551616ms"),
            "`18446744073709551616ms` is too long"
        );
        assert_eq!(
            error("5124095576030432h"),
            "`5124095576030432h` is too long"
        );
    }

    #[test]
    fn accepts_a_complete_handler() {
        let function: Function = syn::parse2(handler_fn()).unwrap();
        let input = Input::new(
            quote! {
                consumer = "inventory", max_attempts = 5, backoff = "500ms", backoff_cap = "5m",
                ordering = false, mode = "stored", crate = "renamed"
            },
            &function,
        );
        let handler = validate(&input).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(handler.consumer.value(), "inventory");
        assert_eq!(handler.max_attempts, Some(5));
        assert_eq!(handler.backoff_ms, Some(500));
        assert_eq!(handler.backoff_cap_ms, Some(300_000));
        assert_eq!(handler.ordering, Some(false));
        assert_eq!(handler.mode, Mode::Stored);
        assert!(handler.krate.is_ident("renamed"));
        assert_eq!(handler.ident, "reserve");
        let (tx, event) = (handler.tx_ty, handler.event_ty);
        assert_eq!(quote!(#tx).to_string(), "& InboxTransaction");
        assert_eq!(quote!(#event).to_string(), "OrderPlaced");
    }

    #[test]
    fn defaults() {
        let function: Function = syn::parse2(quote! {
            pub(crate) async fn reserve(
                _: &'_ outbox::inbox::InboxTransaction,
                outbox::inbox::Event { payload, .. }: outbox::inbox::Event<crate::events::OrderPlaced>,
            ) -> outbox::HandlerResult {}
        })
        .unwrap();
        let input = Input::new(quote!(consumer = "a.b-c_d"), &function);
        let handler = validate(&input).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(handler.max_attempts, None);
        assert_eq!(handler.backoff_ms, None);
        assert_eq!(handler.backoff_cap_ms, None);
        assert_eq!(handler.ordering, None);
        assert_eq!(handler.mode, Mode::Inline);
        let (krate, event) = (&handler.krate, handler.event_ty);
        assert_eq!(quote!(#krate).to_string(), ":: outbox");
        assert_eq!(quote!(#event).to_string(), "crate :: events :: OrderPlaced");
    }

    #[test]
    fn argument_values() {
        let long = "c".repeat(129);
        assert_eq!(
            errors(
                quote! {
                    consumer = "", max_attempts = 0, backoff = "5", backoff_cap = "1.5s",
                    mode = "async"
                },
                handler_fn()
            ),
            [
                "`consumer` must not be empty, e.g. `consumer = \"inventory\"`",
                "`max_attempts` must be at least 1: the first delivery is attempt 1, \
                 `max_attempts = 1` means no retry",
                "invalid `backoff`: `5` has no unit: write 5 followed by `ms`, `s`, `m` or `h`, \
                 e.g. \"5ms\"",
                "invalid `backoff_cap`: `1.5s` has a fraction: write an integer of a smaller \
                 unit, e.g. \"1500ms\" instead of \"1.5s\"",
                "unknown mode `async`; expected \"inline\" (handle on delivery, the default) or \
                 \"stored\" (store and acknowledge first, handle later)",
            ]
        );
        assert_eq!(
            errors(
                quote!(consumer = #long, max_attempts = 4294967296, backoff = "0s"),
                handler_fn()
            ),
            [
                "`consumer` is 129 characters long; the inbox stores at most 128",
                "`max_attempts` must fit in a u32 (1 to 4294967295), found `4294967296`",
                "`backoff` must be at least 1ms, found `0s`",
            ]
        );
        assert_eq!(
            errors(
                quote!(consumer = "my consumer", max_attempts = 3u8, crate = "a b"),
                handler_fn()
            ),
            [
                "`consumer` must not contain whitespace: `my consumer`; use `-` or `.`, e.g. \
                 `billing-emails`",
                "`max_attempts` is a u32: write `max_attempts = 3` without the `u8` suffix",
                "`crate` must be a path, e.g. `crate = \"my_outbox\"`; `a b` is not one",
            ]
        );
        let long = "c".repeat(128);
        assert_eq!(
            errors(quote!(consumer = #long), handler_fn()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn backoff_cap_is_not_below_backoff() {
        assert_eq!(
            errors(
                quote!(consumer = "a", backoff = "2s", backoff_cap = "1999ms"),
                handler_fn()
            ),
            [
                "`backoff_cap` (1999ms) is shorter than `backoff` (2s): the cap is the longest \
                 delay between two attempts, the backoff the first one"
            ]
        );
        assert_eq!(
            errors(
                quote!(consumer = "a", backoff = "2s", backoff_cap = "2000ms"),
                handler_fn()
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            errors(quote!(consumer = "a", backoff_cap = "1ms"), handler_fn()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn missing_consumer_unless_the_arguments_are_broken() {
        assert_eq!(
            errors(TokenStream::new(), handler_fn()),
            [
                "missing `consumer`: write #[inbox_handler(consumer = \"inventory\")]; the \
                 consumer's name is stored with every message it handles"
            ]
        );
        assert_eq!(
            errors(quote!(consumr = "a"), handler_fn()),
            [
                "unknown key `consumr`; expected one of `consumer`, `max_attempts`, `backoff`, \
                 `backoff_cap`, `ordering`, `mode`, `source`, `message_type`, `crate`"
            ]
        );
    }

    #[test]
    fn signatures() {
        let args = || quote!(consumer = "a");
        let check = |function: TokenStream| errors(args(), function);
        assert_eq!(
            check(quote!(
                fn h(tx: &T, e: Event<E>) -> R {}
            )),
            [
                "an inbox handler must be an `async fn`: write `async fn h(tx: &InboxTransaction, \
              event: Event<OrderPlaced>) -> Result<(), HandlerError>`"
            ]
        );
        let two = "an inbox handler takes two parameters, the transaction and the event: \
                   `(tx: &InboxTransaction, event: Event<OrderPlaced>)`; found";
        assert_eq!(
            check(quote!(
                async fn h() -> R {}
            )),
            [format!("{two} none")]
        );
        assert_eq!(
            check(quote!(
                async fn h(e: Event<E>) -> R {}
            )),
            [format!("{two} 1")]
        );
        assert_eq!(
            check(quote!(
                async fn h(tx: &T, e: Event<E>, x: u8, y: u8) -> R {}
            )),
            [format!("{two} 4")]
        );
        assert_eq!(
            check(quote!(
                async fn h(tx: T, e: Event<E>) -> R {}
            )),
            [
                "the first parameter is the transaction, by reference: `tx: &InboxTransaction`; \
              the runtime commits it after the handler returns"
            ]
        );
        assert_eq!(
            check(quote!(
                async fn h(tx: &mut T, e: Event<E>) -> R {}
            )),
            ["the transaction is borrowed shared: write `tx: &InboxTransaction`, without `mut`"]
        );
        assert_eq!(
            check(quote!(
                async fn h(e: Event<E>, tx: &T) -> R {}
            )),
            [
                "the transaction comes first, then the event: `(tx: &InboxTransaction, event: \
              Event<OrderPlaced>)`"
            ]
        );
        let second = "the second parameter is the event: `event: Event<OrderPlaced>`, where \
                      `OrderPlaced` derives `DomainEvent`";
        assert_eq!(
            check(quote!(
                async fn h(tx: &T, e: E) -> R {}
            )),
            [second]
        );
        assert_eq!(
            check(quote!(
                async fn h(tx: &T, e: &Event<E>) -> R {}
            )),
            [format!("{second}; take the event by value")]
        );
        assert_eq!(
            check(quote!(
                async fn h(tx: &T, e: Event) -> R {}
            )),
            [
                "`Event` needs the event type: write the event type as `Event<OrderPlaced>`, \
              where `OrderPlaced` derives `DomainEvent`"
            ]
        );
        assert_eq!(
            check(quote!(
                async fn h(tx: &T, e: Event<'a, E>) -> R {}
            )),
            [
                "`Event` takes exactly one type: write the event type as `Event<OrderPlaced>`, \
              where `OrderPlaced` derives `DomainEvent`"
            ]
        );
        assert_eq!(
            check(quote!(
                async fn h(tx: &T, e: Event<impl DomainEvent>) -> R {}
            )),
            [
                "the event type must be a concrete type that derives `DomainEvent`, e.g. \
              `Event<OrderPlaced>`"
            ]
        );
        assert_eq!(
            check(quote!(
                async fn h(tx: &T, e: Event<E>) {}
            )),
            ["an inbox handler returns its outcome: add `-> Result<(), HandlerError>`"]
        );
        let generic = "an inbox handler cannot be generic: the runtime calls one function per \
                       consumer and event type; write one handler per event type";
        assert_eq!(
            check(quote!(
                async fn h<T>(tx: &T, e: Event<E>) -> R {}
            )),
            [generic]
        );
        assert_eq!(
            check(quote!(
                async fn h(tx: &T, e: Event<E>) -> R
                where
                    E: Send,
                {
                }
            )),
            [generic]
        );
        assert_eq!(
            check(quote!(
                async fn h(&self, tx: &T, e: Event<E>) -> R {}
            )),
            [
                "an inbox handler is a free function, not a method: remove `self` and move the \
              function out of the `impl`: `async fn h(tx: &InboxTransaction, event: \
              Event<OrderPlaced>)`"
            ]
        );
        assert_eq!(
            check(quote!(
                async unsafe extern "C" fn h(tx: &T, e: Event<E>) -> R {}
            )),
            [
                "an inbox handler cannot be `unsafe`: the runtime calls it like any safe function",
                "an inbox handler cannot have an `extern` ABI",
            ]
        );
    }

    #[test]
    fn argument_and_signature_errors_are_reported_together() {
        assert_eq!(
            errors(
                quote!(consumer = ""),
                quote!(
                    fn h(tx: &T) -> R {}
                )
            ),
            [
                "`consumer` must not be empty, e.g. `consumer = \"inventory\"`",
                "an inbox handler must be an `async fn`: write `async fn h(tx: &InboxTransaction, \
                 event: Event<OrderPlaced>) -> Result<(), HandlerError>`",
                "an inbox handler takes two parameters, the transaction and the event: `(tx: \
                 &InboxTransaction, event: Event<OrderPlaced>)`; found 1",
            ]
        );
    }
}
