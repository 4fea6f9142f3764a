//! The input model: the function as written ([`Function`], [`Input`]) and, once validated, what to
//! generate ([`Handler`]).

use super::attr::{self, Args};
use proc_macro2::{TokenStream, TokenTree};
use quote::{ToTokens, TokenStreamExt};
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Error, Ident, LitStr, Path, Signature, Type, Visibility};

/// A function item whose body is kept as tokens: a syntax error in the body is reported by the
/// compiler on the re-emitted function, never mistaken for a misplaced attribute.
pub(crate) struct Function {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    /// The `{ ... }` group.
    pub(crate) body: TokenTree,
}

impl Parse for Function {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig = input.parse()?;
        if !input.peek(syn::token::Brace) {
            return Err(input.error("expected the function's body `{ ... }`"));
        }
        let body = input.parse()?;
        Ok(Function {
            attrs,
            vis,
            sig,
            body,
        })
    }
}

impl ToTokens for Function {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.append_all(&self.attrs);
        self.vis.to_tokens(tokens);
        self.sig.to_tokens(tokens);
        self.body.to_tokens(tokens);
    }
}

/// `#[inbox_handler(...)]` as written, with the argument errors found while parsing.
pub(crate) struct Input<'a> {
    pub(crate) args: Args,
    pub(crate) function: &'a Function,
    /// Syntax errors in the arguments.
    pub(crate) errors: Vec<Error>,
}

impl<'a> Input<'a> {
    /// Parses the arguments; never fails, errors are kept in [`Input::errors`].
    pub(crate) fn new(args: TokenStream, function: &'a Function) -> Self {
        let mut errors = Vec::new();
        let args = attr::parse(args, &mut errors);
        Input {
            args,
            function,
            errors,
        }
    }
}

/// When the runtime runs the handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Inline,
    Stored,
}

/// What a handler of external messages takes: their source and type.
pub(crate) struct External {
    pub(crate) source: LitStr,
    pub(crate) message_type: LitStr,
}

/// A validated handler: everything code generation needs.
pub(crate) struct Handler<'a> {
    /// Path of the facade crate: `::outbox` unless `crate = "..."` says otherwise.
    pub(crate) krate: Path,
    pub(crate) consumer: LitStr,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) backoff_ms: Option<u64>,
    pub(crate) backoff_cap_ms: Option<u64>,
    pub(crate) ordering: Option<bool>,
    pub(crate) mode: Mode,
    /// For a handler of external messages, what it takes; its payload type then needs only
    /// `DeserializeOwned`.
    pub(crate) external: Option<External>,
    /// The function's name.
    pub(crate) ident: &'a Ident,
    /// The first parameter's type as written (`&InboxTransaction`).
    pub(crate) tx_ty: &'a Type,
    /// The second parameter's type as written (`Event<OrderPlaced>`).
    pub(crate) event_param_ty: &'a Type,
    /// The event type: `OrderPlaced` in `Event<OrderPlaced>`.
    pub(crate) event_ty: &'a Type,
    /// The return type as written (`Result<(), HandlerError>`).
    pub(crate) output: &'a Type,
}
