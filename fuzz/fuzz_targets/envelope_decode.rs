//! Arbitrary bytes into `Envelope::from_json`: never panics, and whatever decodes round-trips.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../check.rs"]
mod check;

fuzz_target!(|data: &[u8]| check::check(data));
