//! Text helpers shared by the store and the transports.

/// `s` cut to at most `max_chars` characters (not bytes), for columns of a bounded width.
pub(crate) fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => s[..i].to_owned(),
        None => s.to_owned(),
    }
}
