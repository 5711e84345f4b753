//! Payouts: `POST /v1/accounts/{id}/payouts` with a ticket — money leaving payonce for an
//! outside bank, exactly once.

use serde::{Deserialize, Serialize};
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
