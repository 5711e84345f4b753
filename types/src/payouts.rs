//! Payouts: `POST /v1/accounts/{id}/payouts` with a ticket — money leaving payonce for an
//! outside bank, exactly once.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::integral;

/// A payout to send.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PayoutRequest {
    /// Minor units, 1 to 10^12.
    #[serde(deserialize_with = "integral")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 1_000_000_000_000_i64, example = 500)
    )]
    pub amount: i64,
    /// The account at the bank: 1 to 64 of `A-Z a-z 0-9 . _ : -`.
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 64,
            pattern = "^[A-Za-z0-9._:-]{1,64}$",
            example = "DE89370400440532013000"
        )
    )]
    pub destination: String,
}

/// A payout accepted: the money left the account; the bank has not been asked yet. Its
/// live status is at `GET /v1/payouts/{payout_id}` (the answer's `Location`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PayoutAccepted {
    /// The payout.
    pub payout_id: Uuid,
    /// The ticket spent.
    pub ticket_id: Uuid,
    /// The account.
    pub account_id: Uuid,
    /// The amount sent, in minor units.
    pub amount: i64,
    /// The account at the bank.
    pub destination: String,
    /// The balance after.
    pub balance: i64,
    /// Always `pending` here: the status when it was accepted.
    #[cfg_attr(feature = "openapi", schema(example = "pending"))]
    pub status: String,
}

/// A payout and where it stands.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PayoutView {
    /// Its id.
    pub payout_id: Uuid,
    /// The account it was sent from.
    pub account_id: Uuid,
    /// The ticket it was sent with.
    pub ticket_id: Uuid,
    /// The amount, in minor units.
    pub amount: i64,
    /// The account at the bank.
    pub destination: String,
    /// `pending` (the money left the account; the bank has not said yet), `succeeded` (the
    /// bank made the transfer) or `failed` (the bank refused for good; the money came
    /// back).
    #[cfg_attr(feature = "openapi", schema(example = "succeeded"))]
    pub status: String,
    /// The `Idempotency-Key` every call to the bank for this payout carries.
    pub bank_key: String,
    /// The bank's id of the transfer, once succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bank_transfer_id: Option<String>,
    /// Why it failed, once failed, in payonce's words: the bank's final refusal (`the bank
    /// refused: destination-closed`, with the bank's own code when it gives one), or the
    /// key closed at the bank with nothing made (`not made (the bank did not answer within
    /// the timeout); the key is closed at the bank`). Never the bank's address.
    #[cfg_attr(
        feature = "openapi",
        schema(example = "the bank refused: destination-closed")
    )]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// How many times the bank was called for it (or is being called), throttled calls
    /// (429) included.
    pub attempts: u32,
    /// What went wrong the last time, while it is pending, in payonce's words (`cannot
    /// connect to the bank`, `the bank did not answer within the timeout`, `the bank
    /// answered 503 (unavailable)`, `the bank answered 429 (rate-limited)`). Never the
    /// bank's address.
    #[cfg_attr(
        feature = "openapi",
        schema(example = "the bank did not answer within the timeout")
    )]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the money left the account (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: OffsetDateTime,
    /// When the bank's word was recorded (RFC 3339).
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, format = DateTime)
    )]
    pub settled_at: Option<OffsetDateTime>,
}

/// A page of payouts, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PayoutsPage {
    /// The payouts.
    pub payouts: Vec<PayoutView>,
    /// Pass as `after` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<Uuid>,
}

/// What the bank holds for a payout, in the bank's own words
/// (`GET /v1/payouts/{payout_id}/bank`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PayoutAtBank {
    /// The payout.
    pub payout_id: Uuid,
    /// The `Idempotency-Key` every call to the bank for this payout carries.
    pub bank_key: String,
    /// How many of `transfers` the bank executed: 1 once the payout's money left; more
    /// would mean it left more than once (what a fresh key per attempt does).
    pub executed: usize,
    /// Every transfer the bank holds with this payout's id as its reference, under
    /// whichever key, in the bank's order of commits: none while the bank has not made it,
    /// then one, under `bank_key` — `executed`, or `declined` for a refusal.
    pub transfers: Vec<BankTransfer>,
}

/// A transfer, as the bank shows it (`GET /v1/transfers/{key}`, and its list).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BankTransfer {
    /// Position in the bank's order of commits.
    pub id: i64,
    /// The caller's key.
    pub idempotency_key: String,
    /// `executed` or `declined`.
    pub state: BankTransferState,
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

/// What the bank did under a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BankTransferState {
    /// The money moved.
    Executed,
    /// The bank refused the transfer for good; nothing moved, and a repeat gets the same
    /// refusal.
    Declined,
    /// The key was closed with no transfer: nothing moved, and nothing ever will under it.
    Closed,
}
