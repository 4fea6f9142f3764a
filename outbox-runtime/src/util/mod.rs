//! Pieces several layers use, below all of them: retry delays, text helpers, the instance name.

pub(crate) mod backoff;
pub(crate) mod text;

/// A name for this process's loops in `locked_by` columns: `host-pid-random`.
pub(crate) fn instance_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "outbox".to_owned());
    format!("{host}-{}-{:04x}", std::process::id(), fastrand::u16(..))
}

/// One chained setter per setting of a settings struct whose fields are crate-private: each
/// `name: Type` becomes `pub fn name(mut self, name: Type) -> Self`, carrying the docs written
/// above it (`Type` may be `impl Into<…>`: the value is converted into the field's type).
macro_rules! setters {
    ($ty:ident { $( $(#[$doc:meta])* $name:ident: $arg:ty ),* $(,)? }) => {
        impl $ty {
            $(
                $(#[$doc])*
                #[allow(clippy::useless_conversion)]
                pub fn $name(mut self, $name: $arg) -> Self {
                    self.$name = $name.into();
                    self
                }
            )*
        }
    };
}
pub(crate) use setters;
