//! Validation: turns an [`Input`] into an [`Event`], reporting every mistake at once, each spanned
//! to the token the user must change.

use crate::ast::{Event, Field, Input, Shape};
use crate::attr::Role;
use crate::keys::{combine, crate_path};
use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Error, LitInt, LitStr, Path};

/// The longest event name the outbox stores.
const MAX_NAME_LEN: usize = 255;
/// The longest aggregate type the outbox stores.
const MAX_AGGREGATE_LEN: usize = 128;
const SUPPORTED: &str = "#[derive(DomainEvent)] supports structs with named fields";

/// Checks `input`, returning all its errors (parse errors included) combined into one.
pub(crate) fn validate<'a>(input: &'a Input<'a>) -> syn::Result<Event<'a>> {
    let mut errors = input.errors.clone();

    let header = check_container(input, &mut errors);
    check_generics(input, &mut errors);
    let roles = check_shape(input, &mut errors);

    match (header, roles) {
        (Some(header), Some(roles)) if errors.is_empty() => Ok(Event {
            ident: input.ident,
            krate: header.krate,
            name: header.name,
            aggregate: header.aggregate,
            version: header.version,
            aggregate_id: roles.aggregate_id,
            dedup_key: roles.dedup_key,
            aggregate_version: roles.aggregate_version,
        }),
        _ => Err(combine(errors)
            .unwrap_or_else(|| Error::new(input.ident.span(), "invalid #[derive(DomainEvent)]"))),
    }
}

struct Header {
    krate: Path,
    name: LitStr,
    aggregate: LitStr,
    version: LitInt,
}

fn check_container(input: &Input<'_>, errors: &mut Vec<Error>) -> Option<Header> {
    let container = &input.container;
    let ident = input.ident;
    if !container.present {
        errors.push(Error::new(
            ident.span(),
            format!(
                "missing #[event(...)] on `{ident}`: #[derive(DomainEvent)] needs the event's name \
                 and aggregate type, e.g. #[event(name = \"order.placed\", aggregate = \"order\")]"
            ),
        ));
        return None;
    }
    // After a syntax error in the attribute, "missing key" errors would only repeat it.
    let report_missing = !container.has_errors;

    let name = match &container.name {
        Some(lit) => check_name(lit, errors),
        None => {
            if report_missing {
                errors.push(Error::new(
                    ident.span(),
                    "missing `name` in #[event(...)]: add #[event(name = \"order.placed\", aggregate = \"order\")]",
                ));
            }
            None
        }
    };
    let aggregate = match &container.aggregate {
        Some(lit) => check_aggregate(lit, errors),
        None => {
            if report_missing {
                errors.push(Error::new(
                    ident.span(),
                    "missing `aggregate` in #[event(...)]: add #[event(name = \"order.placed\", aggregate = \"order\")]",
                ));
            }
            None
        }
    };
    let version = match &container.version {
        Some(lit) => check_version(lit, errors),
        None => Some(LitInt::new("1", Span::call_site())),
    };
    let krate = crate_path(container.krate.as_ref())
        .map_err(|e| errors.push(e))
        .ok();

    Some(Header {
        krate: krate?,
        name: name?,
        aggregate: aggregate?,
        version: version?,
    })
}

fn check_name(lit: &LitStr, errors: &mut Vec<Error>) -> Option<LitStr> {
    let value = lit.value();
    let len = value.chars().count();
    let error = if value.is_empty() {
        "event `name` must not be empty, e.g. `name = \"order.placed\"`".to_owned()
    } else if len > MAX_NAME_LEN {
        format!("event `name` is {len} characters long; the outbox stores at most {MAX_NAME_LEN}")
    } else if value.chars().any(char::is_whitespace) {
        format!(
            "event `name` must not contain whitespace: `{value}`; use dots, e.g. `order.placed`"
        )
    } else {
        return Some(lit.clone());
    };
    errors.push(Error::new(lit.span(), error));
    None
}

fn check_aggregate(lit: &LitStr, errors: &mut Vec<Error>) -> Option<LitStr> {
    let value = lit.value();
    let len = value.chars().count();
    let error = if value.trim().is_empty() {
        "`aggregate` must not be empty, e.g. `aggregate = \"order\"`".to_owned()
    } else if len > MAX_AGGREGATE_LEN {
        format!(
            "`aggregate` is {len} characters long; the outbox stores at most {MAX_AGGREGATE_LEN}"
        )
    } else {
        return Some(lit.clone());
    };
    errors.push(Error::new(lit.span(), error));
    None
}

fn check_version(lit: &LitInt, errors: &mut Vec<Error>) -> Option<LitInt> {
    let error = match lit.base10_parse::<u32>() {
        Ok(0) => "`version` starts at 1: the first schema of an event is `version = 1`".to_owned(),
        Ok(version) if matches!(lit.suffix(), "" | "u32") => {
            return Some(LitInt::new(&version.to_string(), lit.span()));
        }
        Ok(_) => format!(
            "`version` is a u32: write `version = {}` without the `{}` suffix",
            lit.base10_digits(),
            lit.suffix()
        ),
        Err(_) => format!(
            "`version` must fit in a u32 (1 to {}), found `{}`",
            u32::MAX,
            lit.base10_digits()
        ),
    };
    errors.push(Error::new(lit.span(), error));
    None
}

fn check_generics(input: &Input<'_>, errors: &mut Vec<Error>) {
    if !input.generics.params.is_empty() {
        errors.push(Error::new_spanned(
            input.generics,
            "generic event types are not supported: an event name must map to exactly one Rust type",
        ));
    }
}

struct Roles<'a> {
    aggregate_id: &'a Field<'a>,
    dedup_key: Option<&'a Field<'a>>,
    aggregate_version: Option<&'a Field<'a>>,
}

fn check_shape<'a>(input: &'a Input<'a>, errors: &mut Vec<Error>) -> Option<Roles<'a>> {
    let (span, why) = match &input.shape {
        Shape::Named(fields) => return check_fields(input, fields, errors),
        Shape::Tuple(fields) => (
            fields.paren_token.span.join(),
            "not tuple structs: name the fields so one can be marked #[event(aggregate_id)]",
        ),
        Shape::Unit => (
            input.ident.span(),
            "not unit structs: add the event's fields, one of them marked #[event(aggregate_id)]",
        ),
        Shape::Enum(data) => (
            data.enum_token.span(),
            "not enums: derive it on one struct per event type",
        ),
        Shape::Union(data) => (data.union_token.span(), "not unions"),
    };
    errors.push(Error::new(span, format!("{SUPPORTED}, {why}")));
    None
}

fn check_fields<'a>(
    input: &Input<'_>,
    fields: &'a [Field<'a>],
    errors: &mut Vec<Error>,
) -> Option<Roles<'a>> {
    let mut aggregate_id: Option<&Field<'_>> = None;
    let mut dedup_key: Option<&Field<'_>> = None;
    let mut aggregate_version: Option<&Field<'_>> = None;

    for field in fields {
        errors.extend(field.errors.iter().cloned());
        let mut first_role: Option<Role> = None;
        for attr in &field.roles {
            if let Some(first) = first_role {
                let key = attr.role.key();
                let message = if first == attr.role {
                    format!("`{key}` specified more than once")
                } else {
                    format!(
                        "a field has at most one role: `{}` is already #[event({})]; \
                         remove #[event({key})] or move it to another field",
                        field.ident,
                        first.key()
                    )
                };
                errors.push(Error::new(attr.span, message));
                continue;
            }
            first_role = Some(attr.role);
            let slot = match attr.role {
                Role::AggregateId => &mut aggregate_id,
                Role::DedupKey => &mut dedup_key,
                Role::AggregateVersion => &mut aggregate_version,
            };
            match slot {
                Some(first) => errors.push(Error::new(
                    attr.span,
                    format!(
                        "only one field can be #[event({key})]; `{first}` already is",
                        key = attr.role.key(),
                        first = first.ident,
                    ),
                )),
                None => *slot = Some(field),
            }
        }
    }

    let Some(aggregate_id) = aggregate_id else {
        // A field attribute that failed to parse was most likely meant to be this one.
        if fields.iter().all(|field| field.errors.is_empty()) {
            errors.push(Error::new(
                input.ident.span(),
                format!(
                    "`{}` has no aggregate id: mark the field holding the aggregate id with \
                     #[event(aggregate_id)]",
                    input.ident
                ),
            ));
        }
        return None;
    };
    Some(Roles {
        aggregate_id,
        dedup_key,
        aggregate_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::DeriveInput;

    /// The messages of every error `validate` reports for `node`, in order.
    fn errors(node: &DeriveInput) -> Vec<String> {
        let input = Input::from_syn(node);
        match validate(&input) {
            Ok(_) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn accepts_a_complete_event() {
        let node: DeriveInput = syn::parse_quote! {
            #[event(name = "order.placed", aggregate = "order", version = 3, crate = "my_outbox")]
            struct OrderPlaced {
                #[event(aggregate_id)]
                order_id: i64,
                #[event(dedup_key)]
                request_id: Option<String>,
                #[event(aggregate_version)]
                version: u64,
                order_no: String,
            }
        };
        let input = Input::from_syn(&node);
        let event = validate(&input).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(event.name.value(), "order.placed");
        assert_eq!(event.aggregate.value(), "order");
        assert_eq!(event.version.base10_digits(), "3");
        assert!(event.krate.is_ident("my_outbox"));
        assert_eq!(event.aggregate_id.ident, "order_id");
        assert_eq!(
            event.dedup_key.map(|f| f.ident.to_string()).as_deref(),
            Some("request_id")
        );
        assert_eq!(
            event
                .aggregate_version
                .map(|f| f.ident.to_string())
                .as_deref(),
            Some("version")
        );
    }

    #[test]
    fn defaults_version_and_crate() {
        let node: DeriveInput = syn::parse_quote! {
            #[event(name = "a.b", aggregate = "a")]
            struct E { #[event(aggregate_id)] id: u64 }
        };
        let input = Input::from_syn(&node);
        let event = validate(&input).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(event.version.base10_digits(), "1");
        let krate = &event.krate;
        assert_eq!(quote::quote!(#krate).to_string(), ":: outbox");
        assert!(event.dedup_key.is_none() && event.aggregate_version.is_none());
    }

    #[test]
    fn keys_may_be_split_over_several_attributes() {
        let node: DeriveInput = syn::parse_quote! {
            #[event(name = "a.b")]
            #[event(aggregate = "a")]
            struct E { #[event(aggregate_id)] id: u64 }
        };
        assert_eq!(errors(&node), Vec::<String>::new());
    }

    #[test]
    fn reports_every_error_at_once() {
        let node: DeriveInput = syn::parse_quote! {
            #[event(name = "", aggregate = "order", version = 0, topic = "x")]
            struct E {
                #[event(aggregate_id)] a: u64,
                #[event(aggregate_id)] b: u64,
                #[event(dedup_key, aggregate_version)] c: u64,
            }
        };
        assert_eq!(
            errors(&node),
            [
                "unknown key `topic`; expected one of `name`, `aggregate`, `version`, `crate`",
                "event `name` must not be empty, e.g. `name = \"order.placed\"`",
                "`version` starts at 1: the first schema of an event is `version = 1`",
                "only one field can be #[event(aggregate_id)]; `a` already is",
                "a field has at most one role: `c` is already #[event(dedup_key)]; \
                 remove #[event(aggregate_version)] or move it to another field",
            ]
        );
    }

    #[test]
    fn missing_keys_are_named() {
        let node: DeriveInput = syn::parse_quote! {
            #[event(version = 2)]
            struct E { id: u64 }
        };
        assert_eq!(
            errors(&node),
            [
                "missing `name` in #[event(...)]: add #[event(name = \"order.placed\", aggregate = \"order\")]",
                "missing `aggregate` in #[event(...)]: add #[event(name = \"order.placed\", aggregate = \"order\")]",
                "`E` has no aggregate id: mark the field holding the aggregate id with #[event(aggregate_id)]",
            ]
        );
    }

    #[test]
    fn missing_attribute() {
        let node: DeriveInput = syn::parse_quote! {
            struct E { #[event(aggregate_id)] id: u64 }
        };
        let errors = errors(&node);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("missing #[event(...)] on `E`"),
            "{errors:?}"
        );
    }

    #[test]
    fn repeated_and_malformed_keys() {
        let node: DeriveInput = syn::parse_quote! {
            #[event(name = "a", name = "b", aggregate = order, version = "2", crate = "not a path")]
            struct E { #[event(aggregate_id = true)] id: u64, #[event(name)] other: u64 }
        };
        assert_eq!(
            errors(&node),
            [
                "`name` specified more than once",
                "`aggregate` must be a string literal, e.g. `aggregate = \"order\"`",
                "`version` must be an integer literal, e.g. `version = 2`",
                "`crate` must be a path, e.g. `crate = \"my_outbox\"`; `not a path` is not one",
                "`aggregate_id` takes no value: write #[event(aggregate_id)]",
                "unknown key `name`; expected one of `aggregate_id`, `dedup_key`, `aggregate_version`; \
                 `name` goes on the struct's #[event(...)]",
            ]
        );
    }

    #[test]
    fn missing_commas_and_bare_attributes() {
        let node: DeriveInput = syn::parse_quote! {
            #[event(name = "a.b" aggregate = "a")]
            struct E { #[event(aggregate_id dedup_key)] id: u64, #[event] other: u64 }
        };
        assert_eq!(
            errors(&node),
            [
                "expected `,` after `name = \"a.b\"`",
                "expected `,` after `aggregate_id`",
                "expected #[event(aggregate_id)], #[event(dedup_key)] or #[event(aggregate_version)]",
            ]
        );
        let node: DeriveInput = syn::parse_quote! {
            #[event]
            struct E { #[event(aggregate_id)] id: u64 }
        };
        assert_eq!(
            errors(&node),
            ["expected #[event(name = \"...\", aggregate = \"...\")]"]
        );
    }

    #[test]
    fn limits_on_names() {
        let long = "x".repeat(256);
        let node: DeriveInput = syn::parse_quote! {
            #[event(name = #long, aggregate = " ")]
            struct E { #[event(aggregate_id)] id: u64 }
        };
        assert_eq!(
            errors(&node),
            [
                "event `name` is 256 characters long; the outbox stores at most 255",
                "`aggregate` must not be empty, e.g. `aggregate = \"order\"`",
            ]
        );
        let node: DeriveInput = syn::parse_quote! {
            #[event(name = "order placed", aggregate = "order", version = 4294967296)]
            struct E { #[event(aggregate_id)] id: u64 }
        };
        assert_eq!(
            errors(&node),
            [
                "event `name` must not contain whitespace: `order placed`; use dots, e.g. `order.placed`",
                "`version` must fit in a u32 (1 to 4294967295), found `4294967296`",
            ]
        );
    }

    #[test]
    fn rejects_unsupported_shapes() {
        let cases: [DeriveInput; 5] = [
            syn::parse_quote!(
                #[event(name = "a", aggregate = "a")]
                enum E {
                    A,
                }
            ),
            syn::parse_quote!(
                #[event(name = "a", aggregate = "a")]
                struct E(u64);
            ),
            syn::parse_quote!(
                #[event(name = "a", aggregate = "a")]
                struct E;
            ),
            syn::parse_quote!(#[event(name = "a", aggregate = "a")] union E { a: u64 }),
            syn::parse_quote!(
                #[event(name = "a", aggregate = "a")]
                struct E<T> {
                    #[event(aggregate_id)]
                    a: T,
                }
            ),
        ];
        let messages: Vec<Vec<String>> = cases.iter().map(errors).collect();
        for message in &messages[..4] {
            assert_eq!(message.len(), 1, "{message:?}");
            assert!(message[0].starts_with(SUPPORTED), "{message:?}");
        }
        assert_eq!(
            messages[4],
            [
                "generic event types are not supported: an event name must map to exactly one Rust type"
            ]
        );
    }

    #[test]
    fn a_broken_field_attribute_hides_the_missing_aggregate_id() {
        let node: DeriveInput = syn::parse_quote! {
            #[event(name = "a", aggregate = "a")]
            struct E { #[event(agregate_id)] id: u64 }
        };
        assert_eq!(
            errors(&node),
            [
                "unknown key `agregate_id`; expected one of `aggregate_id`, `dedup_key`, `aggregate_version`"
            ]
        );
    }
}
