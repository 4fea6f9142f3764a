//! `#[inbox_handler(...)]`: parse ([`attr`], [`ast`]) → validate ([`valid`]) → expand
//! ([`expand`]), like the derive. On invalid input the user's function is emitted unchanged next
//! to the errors, so one mistake gives one error.

mod ast;
mod attr;
mod expand;
mod valid;

use ast::{Function, Input};
use proc_macro2::TokenStream;
use syn::Error;

/// Expands `#[inbox_handler(args)] item`: the function, its wrapper and its registration, or the
/// errors and the function as written.
pub(crate) fn inbox_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    let function = match syn::parse2::<Function>(item.clone()) {
        Ok(function) => function,
        Err(error) => {
            let error = Error::new(
                error.span(),
                "#[inbox_handler] goes on an `async fn` handling one event type: \
                 `async fn reserve_stock(tx: &InboxTransaction, event: Event<OrderPlaced>) -> \
                 Result<(), HandlerError>`",
            );
            return expand::fallback(&item, error);
        }
    };
    match try_expand(args, &function) {
        Ok(expanded) => expanded,
        Err(error) => expand::fallback(&function, error),
    }
}

fn try_expand(args: TokenStream, function: &Function) -> syn::Result<TokenStream> {
    let input = Input::new(args, function);
    let handler = valid::validate(&input)?;
    Ok(expand::handler(function, &handler))
}
