//! Endpoint secrets at rest: sealed with ChaCha20-Poly1305 under a 32-byte key that is
//! `PAYONCE_WEBHOOK_KEY` when set — kept outside the database, so a copy of the database
//! alone signs nothing — and otherwise a key made once and kept in the database's
//! `sealing_keys` table (shared by every instance on that database; it keeps the secrets
//! out of plain sight in dumps and logs, not from a reader of the whole database). The
//! endpoint's id is the associated data: a sealed secret moved to another endpoint's row
//! does not open.
//!
//! Layout: version (1) · key id (4: the first bytes of the key's SHA-256, so a secret
//! sealed under another key is named as such) · nonce (12, random) · ciphertext and tag.

use chacha20poly1305::aead::Aead;
use chacha20poly1305::aead::Payload;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit, Nonce};
use sha2::{Digest, Sha256};

const VERSION: u8 = 1;
const KEY_ID: usize = 4;
const NONCE: usize = 12;

/// Why a sealed secret does not open.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    /// Sealed under another key: `PAYONCE_WEBHOOK_KEY` changed since.
    #[error("the secret was sealed under another key (PAYONCE_WEBHOOK_KEY changed?)")]
    OtherKey,
    /// Not something this sealed, or altered.
    #[error("the sealed secret is damaged")]
    Damaged,
}

/// Seals and opens endpoint secrets under one key.
pub struct Sealer {
    cipher: ChaCha20Poly1305,
    key_id: [u8; KEY_ID],
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("key_id", &hex::encode(self.key_id))
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// A sealer under `key`, which must be 32 bytes.
    pub fn new(key: &[u8]) -> Result<Self, String> {
        let cipher = ChaCha20Poly1305::new_from_slice(key)
            .map_err(|_| format!("a sealing key has 32 bytes, not {}", key.len()))?;
        let digest = Sha256::digest(key);
        let mut key_id = [0; KEY_ID];
        key_id.copy_from_slice(&digest[..KEY_ID]);
        Ok(Self { cipher, key_id })
    }

    /// `secret`, sealed for the endpoint `owner` (its id's bytes).
    pub fn seal(&self, owner: &[u8], secret: &[u8]) -> Vec<u8> {
        let nonce_bytes: [u8; NONCE] = rand::random();
        let nonce = Nonce::from(nonce_bytes);
        // Encryption fails only for messages of gigabytes.
        let sealed = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: secret,
                    aad: owner,
                },
            )
            .unwrap_or_default();
        let mut out = Vec::with_capacity(1 + KEY_ID + NONCE + sealed.len());
        out.push(VERSION);
        out.extend_from_slice(&self.key_id);
        out.extend_from_slice(&nonce_bytes);
        out.extend_from_slice(&sealed);
        out
    }

    /// The secret `sealed` holds for `owner`.
    pub fn open(&self, owner: &[u8], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        let header = 1 + KEY_ID + NONCE;
        if sealed.len() < header || sealed[0] != VERSION {
            return Err(SealError::Damaged);
        }
        if sealed[1..=KEY_ID] != self.key_id {
            return Err(SealError::OtherKey);
        }
        let nonce = Nonce::try_from(&sealed[1 + KEY_ID..header]).map_err(|_| SealError::Damaged)?;
        self.cipher
            .decrypt(
                &nonce,
                Payload {
                    msg: &sealed[header..],
                    aad: owner,
                },
            )
            .map_err(|_| SealError::Damaged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_with_its_key_and_for_its_owner() {
        let sealer = Sealer::new(&[1; 32]).unwrap();
        let sealed = sealer.seal(b"endpoint-a", b"the secret");
        assert!(!sealed.windows(10).any(|w| w == b"the secret"));
        assert_eq!(sealer.open(b"endpoint-a", &sealed).unwrap(), b"the secret");
        assert_ne!(
            sealer.seal(b"endpoint-a", b"the secret"),
            sealed,
            "fresh nonce"
        );
        assert_eq!(sealer.open(b"endpoint-b", &sealed), Err(SealError::Damaged));
        let other = Sealer::new(&[2; 32]).unwrap();
        assert_eq!(other.open(b"endpoint-a", &sealed), Err(SealError::OtherKey));
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(
            sealer.open(b"endpoint-a", &altered),
            Err(SealError::Damaged)
        );
        assert_eq!(
            sealer.open(b"endpoint-a", &sealed[..10]),
            Err(SealError::Damaged)
        );
        assert!(Sealer::new(&[1; 16]).is_err());
    }
}
