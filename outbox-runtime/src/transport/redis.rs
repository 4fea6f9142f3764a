//! Redis Streams transport (in progress).
