//! The property the `envelope_decode` fuzz target checks, shared with the stable-toolchain test
//! that replays the committed corpus (`outbox-runtime/tests/envelope_corpus.rs`).

use outbox_runtime::Envelope;

/// Decoding arbitrary bytes never panics; an envelope that decodes re-encodes to JSON that
/// decodes to an equal envelope, and that encoding is stable.
pub(crate) fn check(data: &[u8]) {
    let envelope = match Envelope::from_json(data) {
        Ok(envelope) => envelope,
        Err(error) => {
            // The error message is what an operator reads: building it must not panic either.
            let _ = error.to_string();
            return;
        }
    };
    let encoded = envelope.to_json();
    let again = match Envelope::from_json(&encoded) {
        Ok(again) => again,
        Err(error) => panic!(
            "a decoded envelope re-encodes to JSON that does not decode ({error}):\n  input:   {}\n  encoded: {}",
            String::from_utf8_lossy(data),
            String::from_utf8_lossy(&encoded)
        ),
    };
    assert!(
        again == envelope,
        "decode(encode(decode(input))) differs from decode(input):\n  input:   {}\n  encoded: {}\n  first:  {envelope:?}\n  second: {again:?}",
        String::from_utf8_lossy(data),
        String::from_utf8_lossy(&encoded)
    );
    assert_eq!(
        again.to_json(),
        encoded,
        "encoding a decoded envelope is not stable"
    );
}
