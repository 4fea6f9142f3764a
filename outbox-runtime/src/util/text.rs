//! Text helpers shared by the store, the transports and the registries.

/// `s` cut to at most `max_chars` characters (not bytes), for columns of a bounded width.
pub(crate) fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => s[..i].to_owned(),
        None => s.to_owned(),
    }
}

/// `bytes` as lowercase hexadecimal digits, two per byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// `crate::module::item`: an item the macros registered, by its module path.
pub(crate) fn item_path(module_path: &str, item: &str) -> String {
    format!("{module_path}::{item}")
}

/// `path/to/file.rs:12 (crate::module::item)`: where the macros registered an item, for
/// messages.
pub(crate) fn location(file: &str, line: u32, module_path: &str, item: &str) -> String {
    format!("{file}:{line} ({})", item_path(module_path, item))
}

/// The headers that carry a caller's credentials: a webhook never keeps them, and an operator is
/// shown them masked.
pub(crate) const CREDENTIAL_HEADERS: [&str; 4] = [
    "authorization",
    "cookie",
    "proxy-authorization",
    "set-cookie",
];
