//! Parsing of `#[event(...)]` attributes, on the struct and on its fields.
//!
//! Parsing never stops at the first mistake (see [`crate::keys`]): every wrong key is reported at
//! once.

use crate::keys::{int_value, parse_items, set_once, string_value};
use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::{Attribute, Error, Ident, LitInt, LitStr, Token};

mod kw {
    syn::custom_keyword!(name);
    syn::custom_keyword!(aggregate);
    syn::custom_keyword!(version);
    syn::custom_keyword!(aggregate_id);
    syn::custom_keyword!(dedup_key);
    syn::custom_keyword!(aggregate_version);
}

/// The keys accepted on the struct, for "expected one of" messages.
const CONTAINER_KEYS: &str = "`name`, `aggregate`, `version`, `crate`";
/// The keys accepted on a field, for "expected one of" messages.
const FIELD_KEYS: &str = "`aggregate_id`, `dedup_key`, `aggregate_version`";

/// The struct's `#[event(...)]` keys as written, before validation.
#[derive(Default)]
pub(crate) struct Container {
    /// Whether the struct has at least one `#[event(...)]` attribute.
    pub(crate) present: bool,
    /// Whether parsing one of them failed (then "missing key" errors would only be noise).
    pub(crate) has_errors: bool,
    /// Whether the `crate` key itself was unusable (then even the fallback cannot name the crate).
    pub(crate) crate_failed: bool,
    pub(crate) name: Option<LitStr>,
    pub(crate) aggregate: Option<LitStr>,
    pub(crate) version: Option<LitInt>,
    pub(crate) krate: Option<LitStr>,
}

/// What a field marked with `#[event(...)]` stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    AggregateId,
    DedupKey,
    AggregateVersion,
}

impl Role {
    /// The key as written in `#[event(...)]`.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Role::AggregateId => "aggregate_id",
            Role::DedupKey => "dedup_key",
            Role::AggregateVersion => "aggregate_version",
        }
    }
}

/// One role key on a field, with the span of the keyword.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RoleAttr {
    pub(crate) role: Role,
    pub(crate) span: Span,
}

fn is_event(attr: &Attribute) -> bool {
    attr.path().is_ident("event")
}

/// Parses every `#[event(...)]` on the struct, pushing each mistake onto `errors`.
pub(crate) fn parse_container(attrs: &[Attribute], errors: &mut Vec<Error>) -> Container {
    let mut container = Container::default();
    for attr in attrs.iter().filter(|attr| is_event(attr)) {
        container.present = true;
        let before = errors.len();
        let list = match attr.meta.require_list() {
            Ok(list) => list,
            Err(_) => {
                errors.push(Error::new_spanned(
                    &attr.meta,
                    "expected #[event(name = \"...\", aggregate = \"...\")]",
                ));
                container.has_errors = true;
                continue;
            }
        };
        let parsed = list.parse_args_with(|input: ParseStream<'_>| {
            parse_items(input, errors, |input| {
                parse_container_item(input, &mut container)
            })
        });
        if let Err(error) = parsed {
            errors.push(error);
        }
        if errors.len() > before {
            container.has_errors = true;
        }
    }
    container
}

/// Parses every `#[event(...)]` on a field into its roles, pushing each mistake onto `errors`.
pub(crate) fn parse_field(attrs: &[Attribute], errors: &mut Vec<Error>) -> Vec<RoleAttr> {
    let mut roles = Vec::new();
    for attr in attrs.iter().filter(|attr| is_event(attr)) {
        match attr.meta.require_list() {
            Ok(list) => {
                let parsed = list.parse_args_with(|input: ParseStream<'_>| {
                    parse_items(input, errors, |input| parse_field_item(input, &mut roles))
                });
                if let Err(error) = parsed {
                    errors.push(error);
                }
            }
            Err(_) => errors.push(Error::new_spanned(
                &attr.meta,
                "expected #[event(aggregate_id)], #[event(dedup_key)] or #[event(aggregate_version)]",
            )),
        }
    }
    roles
}

fn parse_container_item(input: ParseStream<'_>, c: &mut Container) -> syn::Result<()> {
    if input.peek(kw::name) {
        let key = input.parse::<kw::name>()?;
        let lit = string_value(input, key.span, "name", "name = \"order.placed\"")?;
        set_once(&mut c.name, lit, key.span, "name")
    } else if input.peek(kw::aggregate) {
        let key = input.parse::<kw::aggregate>()?;
        let lit = string_value(input, key.span, "aggregate", "aggregate = \"order\"")?;
        set_once(&mut c.aggregate, lit, key.span, "aggregate")
    } else if input.peek(kw::version) {
        let key = input.parse::<kw::version>()?;
        let lit = int_value(input, key.span, "version", "version = 2")?;
        set_once(&mut c.version, lit, key.span, "version")
    } else if input.peek(Token![crate]) {
        let key = input.parse::<Token![crate]>()?;
        let lit = string_value(input, key.span, "crate", "crate = \"my_outbox\"")
            .inspect_err(|_| c.crate_failed = true)?;
        set_once(&mut c.krate, lit, key.span, "crate")
    } else {
        let key = input.call(Ident::parse_any).map_err(|_| {
            Error::new(
                input.span(),
                format!("expected a key; expected one of {CONTAINER_KEYS}"),
            )
        })?;
        let hint = match key.to_string().as_str() {
            "aggregate_id" | "dedup_key" | "aggregate_version" => {
                format!("; `{key}` goes on a field: #[event({key})]")
            }
            _ => String::new(),
        };
        Err(Error::new(
            key.span(),
            format!("unknown key `{key}`; expected one of {CONTAINER_KEYS}{hint}"),
        ))
    }
}

fn parse_field_item(input: ParseStream<'_>, roles: &mut Vec<RoleAttr>) -> syn::Result<()> {
    let (role, span) = if input.peek(kw::aggregate_id) {
        (Role::AggregateId, input.parse::<kw::aggregate_id>()?.span)
    } else if input.peek(kw::dedup_key) {
        (Role::DedupKey, input.parse::<kw::dedup_key>()?.span)
    } else if input.peek(kw::aggregate_version) {
        (
            Role::AggregateVersion,
            input.parse::<kw::aggregate_version>()?.span,
        )
    } else {
        let key = input.call(Ident::parse_any).map_err(|_| {
            Error::new(
                input.span(),
                format!("expected a key; expected one of {FIELD_KEYS}"),
            )
        })?;
        let hint = match key.to_string().as_str() {
            "name" | "aggregate" | "version" | "crate" => {
                format!("; `{key}` goes on the struct's #[event(...)]")
            }
            _ => String::new(),
        };
        return Err(Error::new(
            key.span(),
            format!("unknown key `{key}`; expected one of {FIELD_KEYS}{hint}"),
        ));
    };
    if !input.is_empty() && !input.peek(Token![,]) {
        let key = role.key();
        let message = if input.peek(Token![=]) || input.peek(syn::token::Paren) {
            format!("`{key}` takes no value: write #[event({key})]")
        } else {
            format!("expected `,` after `{key}`")
        };
        return Err(Error::new(span, message));
    }
    roles.push(RoleAttr { role, span });
    Ok(())
}
