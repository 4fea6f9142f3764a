//! Comma-separated `key = value` lists, shared by `#[event(...)]` and `#[inbox_handler(...)]`.
//!
//! Parsing never stops at the first mistake: [`parse_items`] records an error, skips to the next
//! `,` and goes on, so every wrong key is reported at once. Each error is spanned to the token the
//! user must change.

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::parse::ParseStream;
use syn::{Error, Lit, LitBool, LitInt, LitStr, Path, Token};

/// Runs `item` over a comma-separated list; on an error, records it and skips to the next comma.
pub(crate) fn parse_items(
    input: ParseStream<'_>,
    errors: &mut Vec<Error>,
    mut item: impl FnMut(ParseStream<'_>) -> syn::Result<()>,
) -> syn::Result<()> {
    while !input.is_empty() {
        if let Err(error) = item(input) {
            errors.push(error);
            skip_to_comma(input)?;
        }
        if input.is_empty() {
            break;
        }
        if !input.peek(Token![,]) {
            // A well-formed item was followed by something other than `,`.
            let rest = take_until_comma(input)?;
            errors.push(Error::new_spanned(rest, "expected `,` between keys"));
            continue;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(())
}

/// Records the first value of a key; a second one is an error on its key.
pub(crate) fn set_once<T>(
    slot: &mut Option<T>,
    value: T,
    key_span: Span,
    key: &str,
) -> syn::Result<()> {
    if slot.is_some() {
        return Err(Error::new(
            key_span,
            format!("`{key}` specified more than once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

/// The kind of literal a key takes, for "must be ..." messages.
#[derive(Clone, Copy)]
enum Kind {
    Str,
    Int,
    Bool,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Str => "a string literal",
            Kind::Int => "an integer literal",
            Kind::Bool => "`true` or `false`",
        }
    }
}

/// Parses `= <one literal>` after a key.
fn literal(
    input: ParseStream<'_>,
    key_span: Span,
    key: &str,
    example: &str,
    kind: Kind,
) -> syn::Result<Lit> {
    if !input.peek(Token![=]) {
        return Err(Error::new(
            key_span,
            format!("`{key}` needs a value: `{example}`"),
        ));
    }
    let eq = input.parse::<Token![=]>()?;
    let tokens = take_until_comma(input)?;
    if tokens.is_empty() {
        return Err(Error::new(
            eq.span,
            format!("expected a value after `{key} =`, e.g. `{example}`"),
        ));
    }
    let mut trees = tokens.clone().into_iter();
    if let (Some(first), Some(second)) = (trees.next(), trees.next()) {
        let first_is_literal = match &first {
            TokenTree::Literal(_) => true,
            TokenTree::Ident(ident) => ident == "true" || ident == "false",
            _ => false,
        };
        if first_is_literal {
            // `name = "a" aggregate = "b"`: a literal, then more instead of a comma.
            return Err(Error::new(
                second.span(),
                format!("expected `,` after `{key} = {first}`"),
            ));
        }
    }
    syn::parse2::<Lit>(tokens.clone()).map_err(|_| not_a(&tokens, key, example, kind))
}

fn not_a(tokens: &TokenStream, key: &str, example: &str, kind: Kind) -> Error {
    Error::new_spanned(
        tokens,
        format!("`{key}` must be {}, e.g. `{example}`", kind.describe()),
    )
}

/// Parses `= "..."` after a key.
pub(crate) fn string_value(
    input: ParseStream<'_>,
    key_span: Span,
    key: &str,
    example: &str,
) -> syn::Result<LitStr> {
    match literal(input, key_span, key, example, Kind::Str)? {
        Lit::Str(lit) => Ok(lit),
        other => Err(not_a(&quote::quote!(#other), key, example, Kind::Str)),
    }
}

/// Parses `= 123` after a key.
pub(crate) fn int_value(
    input: ParseStream<'_>,
    key_span: Span,
    key: &str,
    example: &str,
) -> syn::Result<LitInt> {
    match literal(input, key_span, key, example, Kind::Int)? {
        Lit::Int(lit) => Ok(lit),
        other => Err(not_a(&quote::quote!(#other), key, example, Kind::Int)),
    }
}

/// Parses `= true` or `= false` after a key.
pub(crate) fn bool_value(
    input: ParseStream<'_>,
    key_span: Span,
    key: &str,
    example: &str,
) -> syn::Result<LitBool> {
    match literal(input, key_span, key, example, Kind::Bool)? {
        Lit::Bool(lit) => Ok(lit),
        other => Err(not_a(&quote::quote!(#other), key, example, Kind::Bool)),
    }
}

/// Consumes and returns the tokens up to (not including) the next top-level `,`.
pub(crate) fn take_until_comma(input: ParseStream<'_>) -> syn::Result<TokenStream> {
    input.step(|cursor| {
        let mut rest = *cursor;
        let mut tokens = TokenStream::new();
        while let Some((tt, next)) = rest.token_tree() {
            if matches!(&tt, TokenTree::Punct(punct) if punct.as_char() == ',') {
                break;
            }
            tokens.extend([tt]);
            rest = next;
        }
        Ok((tokens, rest))
    })
}

fn skip_to_comma(input: ParseStream<'_>) -> syn::Result<()> {
    take_until_comma(input).map(drop)
}

/// The path of the facade crate: the `crate = "..."` value when given, `::outbox` otherwise.
pub(crate) fn crate_path(krate: Option<&LitStr>) -> syn::Result<Path> {
    match krate {
        Some(lit) => lit.parse::<Path>().map_err(|_| {
            Error::new(
                lit.span(),
                format!(
                    "`crate` must be a path, e.g. `crate = \"my_outbox\"`; `{}` is not one",
                    lit.value()
                ),
            )
        }),
        None => Ok(syn::parse_quote!(::outbox)),
    }
}

/// All of `errors` as one error (reported in order), or `None` when there are none.
pub(crate) fn combine(errors: Vec<Error>) -> Option<Error> {
    errors.into_iter().reduce(|mut all, error| {
        all.combine(error);
        all
    })
}
