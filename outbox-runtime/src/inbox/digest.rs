//! The 64-bit digest of message bytes in derived message ids (a conflicting delivery's
//! `{id}#conflict-{digest}`, an undecodable message's `undecodable-{digest}`) and in lane routing:
//! FNV-1a of the bytes, the same on every platform.

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0100_0000_01b3;

fn fnv1a(state: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(state, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

/// FNV-1a (64-bit) of `bytes`.
pub(crate) fn digest(bytes: &[u8]) -> u64 {
    fnv1a(OFFSET_BASIS, bytes)
}

/// The digest earlier versions wrote into derived message ids: FNV-1a of the length as eight
/// little-endian bytes (what a 64-bit little-endian host hashed first), then the bytes. Read
/// only, so that a redelivery of a message recorded under such an id is still recognised.
pub(super) fn legacy_digest(bytes: &[u8]) -> u64 {
    let length = (bytes.len() as u64).to_le_bytes();
    fnv1a(fnv1a(OFFSET_BASIS, &length), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_fnv1a_of_the_bytes() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(digest(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(digest(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(digest(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn legacy_digest_matches_hashing_the_slice() {
        use std::hash::{Hash, Hasher};
        struct Fnv(u64);
        impl Hasher for Fnv {
            fn finish(&self) -> u64 {
                self.0
            }
            fn write(&mut self, bytes: &[u8]) {
                self.0 = fnv1a(self.0, bytes);
            }
        }
        for body in [&b""[..], b"a", b"{\"id\":\"x\"}", &[0xff; 300]] {
            let mut hasher = Fnv(OFFSET_BASIS);
            body.hash(&mut hasher);
            if cfg!(all(target_pointer_width = "64", target_endian = "little")) {
                assert_eq!(legacy_digest(body), hasher.finish());
            }
            assert_ne!(legacy_digest(body), digest(body));
        }
    }
}
