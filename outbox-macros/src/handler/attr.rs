//! Parsing of the `#[inbox_handler(...)]` arguments.
//!
//! Like `#[event(...)]`, parsing goes on after a mistake (see [`crate::keys`]), so every wrong key
//! is reported at once; values are only checked later, in [`super::valid`].

use crate::keys::{bool_value, int_value, parse_items, set_once, string_value};
use proc_macro2::TokenStream;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Error, Ident, LitBool, LitInt, LitStr, Token};

mod kw {
    syn::custom_keyword!(consumer);
    syn::custom_keyword!(max_attempts);
    syn::custom_keyword!(backoff);
    syn::custom_keyword!(backoff_cap);
    syn::custom_keyword!(ordering);
    syn::custom_keyword!(mode);
    syn::custom_keyword!(source);
    syn::custom_keyword!(message_type);
}

/// The keys `#[inbox_handler(...)]` accepts, for "expected one of" messages.
const KEYS: &str = "`consumer`, `max_attempts`, `backoff`, `backoff_cap`, `ordering`, `mode`, \
                    `source`, `message_type`, `crate`";

/// The arguments as written, before validation.
#[derive(Default)]
pub(crate) struct Args {
    /// Whether parsing failed somewhere (then "missing key" errors would only be noise).
    pub(crate) has_errors: bool,
    pub(crate) consumer: Option<LitStr>,
    pub(crate) max_attempts: Option<LitInt>,
    pub(crate) backoff: Option<LitStr>,
    pub(crate) backoff_cap: Option<LitStr>,
    pub(crate) ordering: Option<LitBool>,
    pub(crate) mode: Option<LitStr>,
    /// The source of external messages this handler takes.
    pub(crate) source: Option<LitStr>,
    /// The type of external messages this handler takes.
    pub(crate) message_type: Option<LitStr>,
    pub(crate) krate: Option<LitStr>,
}

/// Parses the attribute's arguments, pushing each mistake onto `errors`.
pub(crate) fn parse(tokens: TokenStream, errors: &mut Vec<Error>) -> Args {
    let mut args = Args::default();
    let before = errors.len();
    let parser =
        |input: ParseStream<'_>| parse_items(input, errors, |input| item(input, &mut args));
    if let Err(error) = parser.parse2(tokens) {
        errors.push(error);
    }
    args.has_errors = errors.len() > before;
    args
}

fn item(input: ParseStream<'_>, args: &mut Args) -> syn::Result<()> {
    if input.peek(kw::consumer) {
        let key = input.parse::<kw::consumer>()?;
        let lit = string_value(input, key.span, "consumer", "consumer = \"inventory\"")?;
        set_once(&mut args.consumer, lit, key.span, "consumer")
    } else if input.peek(kw::max_attempts) {
        let key = input.parse::<kw::max_attempts>()?;
        let lit = int_value(input, key.span, "max_attempts", "max_attempts = 5")?;
        set_once(&mut args.max_attempts, lit, key.span, "max_attempts")
    } else if input.peek(kw::backoff) {
        let key = input.parse::<kw::backoff>()?;
        let lit = string_value(input, key.span, "backoff", "backoff = \"500ms\"")?;
        set_once(&mut args.backoff, lit, key.span, "backoff")
    } else if input.peek(kw::backoff_cap) {
        let key = input.parse::<kw::backoff_cap>()?;
        let lit = string_value(input, key.span, "backoff_cap", "backoff_cap = \"5m\"")?;
        set_once(&mut args.backoff_cap, lit, key.span, "backoff_cap")
    } else if input.peek(kw::ordering) {
        let key = input.parse::<kw::ordering>()?;
        let lit = bool_value(input, key.span, "ordering", "ordering = false")?;
        set_once(&mut args.ordering, lit, key.span, "ordering")
    } else if input.peek(kw::mode) {
        let key = input.parse::<kw::mode>()?;
        let lit = string_value(input, key.span, "mode", "mode = \"stored\"")?;
        set_once(&mut args.mode, lit, key.span, "mode")
    } else if input.peek(kw::source) {
        let key = input.parse::<kw::source>()?;
        let lit = string_value(input, key.span, "source", "source = \"stripe\"")?;
        set_once(&mut args.source, lit, key.span, "source")
    } else if input.peek(kw::message_type) {
        let key = input.parse::<kw::message_type>()?;
        let lit = string_value(
            input,
            key.span,
            "message_type",
            "message_type = \"payment_intent.succeeded\"",
        )?;
        set_once(&mut args.message_type, lit, key.span, "message_type")
    } else if input.peek(Token![crate]) {
        let key = input.parse::<Token![crate]>()?;
        let lit = string_value(input, key.span, "crate", "crate = \"my_outbox\"")?;
        set_once(&mut args.krate, lit, key.span, "crate")
    } else if input.peek(LitStr) {
        let lit = input.parse::<LitStr>()?;
        Err(Error::new(
            lit.span(),
            format!(
                "name the key: `consumer = {}`",
                quote::ToTokens::to_token_stream(&lit)
            ),
        ))
    } else {
        let key = input.call(Ident::parse_any).map_err(|_| {
            Error::new(
                input.span(),
                format!("expected a key; expected one of {KEYS}"),
            )
        })?;
        let hint = match key.to_string().as_str() {
            "name" | "group" | "queue" | "consumer_name" => "; did you mean `consumer`?",
            "retries" | "max_retries" | "attempts" | "max_attempt" => {
                "; did you mean `max_attempts`?"
            }
            "backoff_base" | "base" | "delay" | "retry_delay" => "; did you mean `backoff`?",
            "max_backoff" | "backoff_max" | "cap" => "; did you mean `backoff_cap`?",
            "ordered" | "order" => "; did you mean `ordering`?",
            "sender" | "origin" | "from" => "; did you mean `source`?",
            "type" | "event_type" | "kind" => "; did you mean `message_type`?",
            _ => "",
        };
        Err(Error::new(
            key.span(),
            format!("unknown key `{key}`; expected one of {KEYS}{hint}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse_errors(tokens: TokenStream) -> (Args, Vec<String>) {
        let mut errors = Vec::new();
        let args = parse(tokens, &mut errors);
        (args, errors.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn parses_every_key() {
        let (args, errors) = parse_errors(quote! {
            consumer = "inventory", max_attempts = 5, backoff = "500ms", backoff_cap = "5m",
            ordering = false, mode = "stored", crate = "renamed",
        });
        assert_eq!(errors, Vec::<String>::new());
        assert!(!args.has_errors);
        assert_eq!(
            args.consumer.map(|l| l.value()).as_deref(),
            Some("inventory")
        );
        assert_eq!(
            args.max_attempts.map(|l| l.to_string()).as_deref(),
            Some("5")
        );
        assert_eq!(args.backoff.map(|l| l.value()).as_deref(), Some("500ms"));
        assert_eq!(args.backoff_cap.map(|l| l.value()).as_deref(), Some("5m"));
        assert_eq!(args.ordering.map(|l| l.value), Some(false));
        assert_eq!(args.mode.map(|l| l.value()).as_deref(), Some("stored"));
        assert_eq!(args.krate.map(|l| l.value()).as_deref(), Some("renamed"));
    }

    #[test]
    fn empty_arguments_are_no_error_here() {
        let (args, errors) = parse_errors(TokenStream::new());
        assert!(errors.is_empty() && !args.has_errors && args.consumer.is_none());
    }

    #[test]
    fn reports_every_mistake_and_keeps_going() {
        let (args, errors) = parse_errors(quote! {
            consumer = "a", consumer = "b", retries = 3, max_attempts = "3", ordering = "yes",
            mode = stored, backoff, backoff_cap =, topic = "x", mode = "inline"
        });
        assert!(args.has_errors);
        assert_eq!(args.consumer.map(|l| l.value()).as_deref(), Some("a"));
        assert_eq!(args.mode.map(|l| l.value()).as_deref(), Some("inline"));
        assert_eq!(
            errors,
            [
                "`consumer` specified more than once",
                "unknown key `retries`; expected one of `consumer`, `max_attempts`, `backoff`, \
                 `backoff_cap`, `ordering`, `mode`, `source`, `message_type`, `crate`; did you \
                 mean `max_attempts`?",
                "`max_attempts` must be an integer literal, e.g. `max_attempts = 5`",
                "`ordering` must be `true` or `false`, e.g. `ordering = false`",
                "`mode` must be a string literal, e.g. `mode = \"stored\"`",
                "`backoff` needs a value: `backoff = \"500ms\"`",
                "expected a value after `backoff_cap =`, e.g. `backoff_cap = \"5m\"`",
                "unknown key `topic`; expected one of `consumer`, `max_attempts`, `backoff`, \
                 `backoff_cap`, `ordering`, `mode`, `source`, `message_type`, `crate`",
            ]
        );
    }

    #[test]
    fn missing_commas_and_bare_strings() {
        let (_, errors) = parse_errors(quote!(consumer = "a" max_attempts = 2));
        assert_eq!(errors, ["expected `,` after `consumer = \"a\"`"]);
        let (_, errors) = parse_errors(quote!(ordering = true mode = "inline"));
        assert_eq!(errors, ["expected `,` after `ordering = true`"]);
        let (_, errors) = parse_errors(quote!("inventory"));
        assert_eq!(errors, ["name the key: `consumer = \"inventory\"`"]);
        let (_, errors) = parse_errors(quote!(= "x"));
        assert_eq!(
            errors,
            [
                "expected a key; expected one of `consumer`, `max_attempts`, `backoff`, \
                 `backoff_cap`, `ordering`, `mode`, `source`, `message_type`, `crate`"
            ]
        );
    }
}
