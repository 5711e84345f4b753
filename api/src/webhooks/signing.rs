//! Signatures as the Standard Webhooks specification (v1) has them: the secret is
//! `whsec_` and the base64 of its bytes; a delivery carries `webhook-id`,
//! `webhook-timestamp` (Unix seconds) and `webhook-signature`, a space-separated list of
//! `v1,` and the base64 of HMAC-SHA256 over `{id}.{timestamp}.{body}` under each secret
//! that signs — one, or two during a rotation.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The prefix of a secret as shown.
pub const SECRET_PREFIX: &str = "whsec_";

/// Random bytes in a new secret (the specification asks for 24 to 64).
pub const SECRET_BYTES: usize = 32;

/// A fresh secret's bytes.
pub fn new_secret() -> [u8; SECRET_BYTES] {
    rand::random()
}

/// A secret as shown to its owner: `whsec_` and its base64.
pub fn shown(secret: &[u8]) -> String {
    format!("{SECRET_PREFIX}{}", STANDARD.encode(secret))
}

/// The secret's bytes from its shown form (with or without the prefix).
pub fn parse_secret(shown: &str) -> Option<Vec<u8>> {
    STANDARD
        .decode(shown.strip_prefix(SECRET_PREFIX).unwrap_or(shown))
        .ok()
}

/// One signature: `v1,` and the base64 of HMAC-SHA256 of `{id}.{timestamp}.{body}`.
pub fn signature(secret: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return String::new();
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// The `webhook-signature` header: a signature under each secret, space-separated.
pub fn signature_header<'a>(
    secrets: impl IntoIterator<Item = &'a [u8]>,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    secrets
        .into_iter()
        .map(|secret| signature(secret, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's own example: secret, id, timestamp and body, and the signature
    /// it gives for them.
    #[test]
    fn the_specifications_example_signs_as_published() {
        let secret = parse_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signature(&secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn secrets_show_with_their_prefix_and_read_back() {
        let secret = new_secret();
        let text = shown(&secret);
        assert!(text.starts_with("whsec_"));
        assert_eq!(parse_secret(&text).unwrap(), secret);
        assert_ne!(new_secret(), secret);
    }

    #[test]
    fn a_rotation_signs_under_both_secrets() {
        let header = signature_header([&b"old"[..], &b"new"[..]], "evt", 1, b"{}");
        let parts: Vec<_> = header.split(' ').collect();
        assert_eq!(
            parts,
            [
                signature(b"old", "evt", 1, b"{}"),
                signature(b"new", "evt", 1, b"{}")
            ]
        );
    }
}
