//! The bank's domain: an [`IdempotencyKey`], a validated [`TransferRequest`], a [`Record`]
//! of what the bank did under a key, and the [`StoredAnswer`] a repeat gets back.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest amount one transfer may move, in minor units (payonce's own bound).
pub const MAX_AMOUNT: i64 = 1_000_000_000_000;
/// The longest destination, in characters.
pub const MAX_DESTINATION: usize = 200;
/// The longest reference, in characters.
pub const MAX_REFERENCE: usize = 200;
/// The longest idempotency key, in bytes.
pub const MAX_KEY: usize = 255;

/// Why an input was refused; the `detail` of its problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidInput(pub String);

/// The key a caller names a transfer by: 1 to 255 visible ASCII characters (no spaces,
/// no control characters). Sent bare, or as a quoted structured-field string (`"…"`,
/// the IETF draft's form), which names the same key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Parses a key as the header or a path carries it.
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        let bare = raw
            .strip_prefix('"')
            .and_then(|inner| inner.strip_suffix('"'))
            .filter(|inner| !inner.contains(['"', '\\']))
            .unwrap_or(raw);
        if bare.is_empty() || bare.len() > MAX_KEY {
            return Err(InvalidInput(format!(
                "an idempotency key has 1 to {MAX_KEY} characters"
            )));
        }
        if !bare.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(InvalidInput(
                "an idempotency key has only visible ASCII characters (no spaces)".into(),
            ));
        }
        Ok(Self(bare.to_owned()))
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A transfer's body as it arrives, before validation.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferBody {
    /// Where the money goes (an account at the bank).
    pub destination: String,
    /// Minor units.
    pub amount: i64,
    /// The caller's reference, shown on the transfer.
    pub reference: String,
}

/// A valid transfer: destination 1..=200 characters, amount 1..=10¹², reference up to 200
/// characters (may be empty).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TransferRequest {
    destination: String,
    amount: i64,
    reference: String,
}

impl TransferRequest {
    /// Validates a body.
    pub fn parse(body: TransferBody) -> Result<Self, InvalidInput> {
        let destination_chars = body.destination.chars().count();
        if body.destination.trim().is_empty() || destination_chars > MAX_DESTINATION {
            return Err(InvalidInput(format!(
                "destination is 1 to {MAX_DESTINATION} characters, not blank"
            )));
        }
        if !(1..=MAX_AMOUNT).contains(&body.amount) {
            return Err(InvalidInput(format!(
                "amount is a whole number of minor units from 1 to {MAX_AMOUNT}"
            )));
        }
        if body.reference.chars().count() > MAX_REFERENCE {
            return Err(InvalidInput(format!(
                "reference is at most {MAX_REFERENCE} characters"
            )));
        }
        if body
            .destination
            .chars()
            .chain(body.reference.chars())
            .any(char::is_control)
        {
            return Err(InvalidInput(
                "destination and reference hold no control characters".into(),
            ));
        }
        Ok(Self {
            destination: body.destination,
            amount: body.amount,
            reference: body.reference,
        })
    }

    /// Where the money goes.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// Minor units, 1..=[`MAX_AMOUNT`].
    pub fn amount(&self) -> i64 {
        self.amount
    }

    /// The caller's reference.
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// sha256 of the request's canonical JSON (fields in declaration order): the same
    /// transfer sent twice has one fingerprint, any other body another.
    pub fn fingerprint(&self) -> String {
        // Serializing a struct of strings and an integer cannot fail.
        let canonical = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(&canonical))
    }
}

/// What the bank did under a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// The money moved.
    Executed,
    /// The bank refused the transfer for good (see [`Record::decline_reason`]); nothing
    /// moved, and a repeat gets the same refusal.
    Declined,
    /// The key was closed with no transfer: nothing moved, and nothing ever will under it.
    Closed,
}

impl State {
    /// As the database stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Declined => "declined",
            Self::Closed => "closed",
        }
    }

    /// From the database's text.
    pub fn from_db(text: &str) -> Option<Self> {
        match text {
            "executed" => Some(Self::Executed),
            "declined" => Some(Self::Declined),
            "closed" => Some(Self::Closed),
            _ => None,
        }
    }
}

/// The answer stored with a transfer and replayed to every repeat of its request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredAnswer {
    /// The HTTP status (201 executed, 422 declined).
    pub status: u16,
    /// The JSON body, as sent the first time.
    pub body: String,
}

/// One key's row: a transfer executed or declined, or a key closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Position in the bank's order of commits (the list pages by it).
    pub id: i64,
    /// The key the caller named it by.
    pub idempotency_key: String,
    /// What the bank did.
    pub state: State,
    /// The request (none for a closed key).
    pub request: Option<TransferRequest>,
    /// sha256 of the request (none for a closed key).
    pub fingerprint: Option<String>,
    /// Why it was declined (declined transfers only), a problem name.
    pub decline_reason: Option<String>,
    /// The answer a repeat gets (none for a closed key).
    pub answer: Option<StoredAnswer>,
    /// When the bank wrote it, microseconds since the Unix epoch.
    pub created_at_micros: i64,
}

/// A transfer, as the bank shows it (`GET /v1/transfers/{key}`, and its list).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferView {
    /// Position in the bank's order of commits.
    pub id: i64,
    /// The caller's key.
    pub idempotency_key: String,
    /// `executed` or `declined`.
    pub state: State,
    /// Where the money went (or would have).
    pub destination: String,
    /// Minor units.
    pub amount: i64,
    /// The caller's reference.
    pub reference: String,
    /// Why it was declined (`destination-closed`), declined transfers only.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub decline_reason: Option<String>,
    /// RFC 3339, UTC.
    pub created_at: String,
}

impl Record {
    /// The transfer's view, or none for a closed key.
    pub fn view(&self) -> Option<TransferView> {
        let request = self.request.as_ref()?;
        Some(TransferView {
            id: self.id,
            idempotency_key: self.idempotency_key.clone(),
            state: self.state,
            destination: request.destination.clone(),
            amount: request.amount,
            reference: request.reference.clone(),
            decline_reason: self.decline_reason.clone(),
            created_at: rfc3339(self.created_at_micros),
        })
    }
}

/// Microseconds since the epoch as RFC 3339 (UTC).
pub fn rfc3339(micros: i64) -> String {
    let nanos = i128::from(micros) * 1_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|at| {
            at.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// Now, in microseconds since the Unix epoch.
pub fn now_micros() -> i64 {
    let nanos = time::OffsetDateTime::now_utc().unix_timestamp_nanos();
    i64::try_from(nanos / 1_000).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key is visible ASCII, 1..=255 bytes; the quoted form names the same key.
    #[test]
    fn keys_are_bounded_and_quotes_name_the_same_key() {
        assert_eq!(
            IdempotencyKey::parse("\"payout-1\"").ok(),
            IdempotencyKey::parse("payout-1").ok()
        );
        assert!(IdempotencyKey::parse("").is_err());
        assert!(IdempotencyKey::parse("a b").is_err());
        assert!(IdempotencyKey::parse("é").is_err());
        assert!(IdempotencyKey::parse(&"k".repeat(MAX_KEY)).is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(MAX_KEY + 1)).is_err());
    }

    /// Two bodies have one fingerprint exactly when they are the same transfer.
    #[test]
    fn fingerprints_tell_bodies_apart() {
        let parse = |destination: &str, amount, reference: &str| {
            TransferRequest::parse(TransferBody {
                destination: destination.into(),
                amount,
                reference: reference.into(),
            })
        };
        let one = parse("acct-1", 500, "r").map(|r| r.fingerprint());
        assert_eq!(one, parse("acct-1", 500, "r").map(|r| r.fingerprint()));
        assert_ne!(one, parse("acct-1", 501, "r").map(|r| r.fingerprint()));
        assert_ne!(one, parse("acct-2", 500, "r").map(|r| r.fingerprint()));
        assert_ne!(one, parse("acct-1", 500, "s").map(|r| r.fingerprint()));
        assert!(parse(" ", 1, "").is_err());
        assert!(parse("a", 0, "").is_err());
        assert!(parse("a", MAX_AMOUNT + 1, "").is_err());
        assert!(parse("a", 1, &"r".repeat(MAX_REFERENCE + 1)).is_err());
    }
}
