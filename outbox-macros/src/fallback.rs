//! What to generate when the input is invalid: the errors, plus a stub `impl DomainEvent` so code
//! that uses the type as an event reports nothing more. One mistake, one error.

use crate::{attr, keys};
use proc_macro2::TokenStream;
use quote::quote;
use syn::DeriveInput;

/// The compile errors of `error`, followed by a stub impl when the crate path is usable.
pub(crate) fn expand(node: &DeriveInput, error: syn::Error) -> TokenStream {
    let error = error.into_compile_error();

    // Without a usable crate path a stub would only add an "unresolved path" error.
    let mut ignored = Vec::new();
    let container = attr::parse_container(&node.attrs, &mut ignored);
    let krate = if container.crate_failed {
        None
    } else {
        keys::crate_path(container.krate.as_ref()).ok()
    };
    let Some(krate) = krate else {
        return error;
    };

    let private = quote!(#krate::__private01);
    let ident = &node.ident;
    let (impl_generics, ty_generics, where_clause) = node.generics.split_for_impl();
    let predicates = where_clause
        .into_iter()
        .flat_map(|clause| &clause.predicates);

    quote! {
        #error

        const _: () = {
            #[automatically_derived]
            impl #impl_generics #private::DomainEvent for #ident #ty_generics
            where
                #(#predicates,)*
                // The higher-ranked bound works around trivial bounds being unstable: the stub
                // must not add a "not Serialize / not Send / not 'static" error of its own.
                for<'__workaround> #ident #ty_generics: #private::serde::Serialize
                    + ::core::marker::Send
                    + ::core::marker::Sync
                    + 'static,
            {
                const EVENT_TYPE: &'static ::core::primitive::str = "";
                const AGGREGATE_TYPE: &'static ::core::primitive::str = "";
                const SCHEMA_VERSION: ::core::primitive::u32 = 0;

                fn aggregate_id(&self) -> #private::String {
                    ::core::unreachable!()
                }
            }
        };
    }
}
