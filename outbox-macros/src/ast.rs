//! The input model: what the user wrote ([`Input`]) and, once validated, what to generate
//! ([`Event`]).

use crate::attr::{self, Container, RoleAttr};
use syn::{
    Data, DataEnum, DataUnion, DeriveInput, Error, Fields, FieldsUnnamed, Generics, Ident, LitInt,
    LitStr, Path, Type,
};

/// A `#[derive(DomainEvent)]` input as written, with the attribute errors found while parsing.
pub(crate) struct Input<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) generics: &'a Generics,
    pub(crate) container: Container,
    pub(crate) shape: Shape<'a>,
    /// Syntax errors in the struct's `#[event(...)]` attributes.
    pub(crate) errors: Vec<Error>,
}

/// The kind of item the derive is on. Only [`Shape::Named`] can be an event.
pub(crate) enum Shape<'a> {
    Named(Vec<Field<'a>>),
    Tuple(&'a FieldsUnnamed),
    Unit,
    Enum(&'a DataEnum),
    Union(&'a DataUnion),
}

/// A named field of the struct.
pub(crate) struct Field<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) ty: &'a Type,
    pub(crate) roles: Vec<RoleAttr>,
    /// Syntax errors in the field's `#[event(...)]` attributes.
    pub(crate) errors: Vec<Error>,
}

impl<'a> Input<'a> {
    /// Parses the attributes of `node`; never fails, errors are kept in [`Input::errors`].
    pub(crate) fn from_syn(node: &'a DeriveInput) -> Self {
        let mut errors = Vec::new();
        let container = attr::parse_container(&node.attrs, &mut errors);
        let shape = match &node.data {
            Data::Struct(data) => match &data.fields {
                Fields::Named(fields) => {
                    Shape::Named(fields.named.iter().filter_map(Field::from_syn).collect())
                }
                Fields::Unnamed(fields) => Shape::Tuple(fields),
                Fields::Unit => Shape::Unit,
            },
            Data::Enum(data) => Shape::Enum(data),
            Data::Union(data) => Shape::Union(data),
        };
        Input {
            ident: &node.ident,
            generics: &node.generics,
            container,
            shape,
            errors,
        }
    }
}

impl<'a> Field<'a> {
    fn from_syn(field: &'a syn::Field) -> Option<Self> {
        let mut errors = Vec::new();
        let roles = attr::parse_field(&field.attrs, &mut errors);
        Some(Field {
            ident: field.ident.as_ref()?,
            ty: &field.ty,
            roles,
            errors,
        })
    }
}

/// A validated event: everything code generation needs.
pub(crate) struct Event<'a> {
    pub(crate) ident: &'a Ident,
    /// Path of the facade crate: `::outbox` unless `crate = "..."` says otherwise.
    pub(crate) krate: Path,
    pub(crate) name: LitStr,
    pub(crate) aggregate: LitStr,
    /// Unsuffixed, at least 1, fits a `u32`.
    pub(crate) version: LitInt,
    pub(crate) aggregate_id: &'a Field<'a>,
    pub(crate) dedup_key: Option<&'a Field<'a>>,
    pub(crate) aggregate_version: Option<&'a Field<'a>>,
}
