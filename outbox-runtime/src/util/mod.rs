//! Pieces several layers use, below all of them: retry delays and text helpers.

pub(crate) mod backoff;
pub(crate) mod text;
