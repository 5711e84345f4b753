//! API keys: shown once at account creation, stored only as a hash.

use sha2::{Digest, Sha256};

/// The prefix every key carries, so a leaked key is recognisable in logs and scanners.
const PREFIX: &str = "po_";

/// A fresh key: the prefix and 32 random bytes in hex.
pub(crate) fn generate() -> String {
    format!("{PREFIX}{}", hex::encode(rand::random::<[u8; 32]>()))
}

/// What the database stores and looks keys up by. A fast hash is enough: the key has 256
/// bits of entropy, so there is nothing to brute-force.
pub(crate) fn hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}
