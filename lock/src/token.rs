//! The two numbers a lock grant carries.

use std::fmt;

/// Identifies one grant of a lock. Release and extend compare it, so a holder whose lease
/// expired (and was granted to someone else) can never touch the new holder's lock.
///
/// 128 random bits: two grants sharing one is not a practical concern.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// A fresh random token.
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// The raw bits.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Fixed-width lowercase hex (32 characters), the form stored in Redis.
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }

    /// Parses the 32-character hex form.
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 32 {
            return None;
        }
        u128::from_str_radix(hex, 16).ok().map(Self)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({:032x})", self.0)
    }
}

/// A number handed out with every grant of a lock, strictly increasing per lock key across
/// all holders. Whoever stores the lock's results remembers the highest token it accepted
/// and refuses an older one: that is what keeps a holder that paused past its lease from
/// writing after its successor.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value, as stored next to the data the lock protects.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_token_hex_round_trips_at_fixed_width() {
        for token in [
            OwnerToken(0),
            OwnerToken(1),
            OwnerToken(u128::MAX),
            OwnerToken::random(),
        ] {
            let hex = token.to_hex();
            assert_eq!(hex.len(), 32);
            assert_eq!(OwnerToken::from_hex(&hex), Some(token));
        }
        assert_eq!(OwnerToken::from_hex("abc"), None);
        assert_eq!(OwnerToken::from_hex(&"g".repeat(32)), None);
    }
}
