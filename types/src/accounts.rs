//! `POST /v1/accounts` and `GET /v1/accounts/{id}`.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::integral;

/// A request to open an account.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewAccountRequest {
    /// 1 to 100 characters, none of them NUL.
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 100,
            pattern = "^[^\\u0000]*$",
            example = "Ada"
        )
    )]
    pub name: String,
    /// Opening balance in minor units.
    #[serde(default, deserialize_with = "integral")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, default = 0))]
    pub balance: i64,
    /// Opening points.
    #[serde(default, deserialize_with = "integral")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, default = 0))]
    pub points: i64,
}

/// An account.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AccountView {
    /// Its id.
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// Money, in minor units.
    pub balance: i64,
    /// The balance less every hold that is held and not past its expiry, by the ledger's
    /// clock when read: what withdrawals, order payments, payouts and new holds may take.
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub available: i64,
    /// Points.
    pub points: i64,
    /// When it was opened (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: OffsetDateTime,
}

/// A new account, with its API key: shown this once, stored only as a hash.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedAccount {
    /// Its id.
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// Opening balance.
    pub balance: i64,
    /// Opening points.
    pub points: i64,
    /// Send as `Authorization: Bearer <api_key>`. Not retrievable later — but by
    /// repeating a create sent with an `Idempotency-Key`, within the retention.
    pub api_key: String,
    /// When it was opened (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: OffsetDateTime,
}

/// One line of an account's history.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EntryView {
    /// Increases in the order entries were written.
    pub id: i64,
    /// The ticket that wrote it; null for the opening entry and a payout's reversal.
    pub ticket_id: Option<Uuid>,
    /// `opening`, `deposit`, `withdrawal`, `lottery_draw`, `order_payment`, `payout` or
    /// `payout_reversal`.
    #[cfg_attr(feature = "openapi", schema(example = "withdrawal"))]
    pub kind: String,
    /// The order an `order_payment` paid; absent for every other kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_id: Option<Uuid>,
    /// The payout a `payout` or `payout_reversal` belongs to; absent for every other kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payout_id: Option<Uuid>,
    /// Signed change to the balance (negative for a withdrawal).
    pub amount: i64,
    /// Signed change to the points (negative for a draw).
    pub points: i64,
    /// The balance after this entry.
    pub balance_after: i64,
    /// The points after this entry.
    pub points_after: i64,
    /// When it was written (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: OffsetDateTime,
}

/// A page of entries, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EntriesPage {
    /// The entries.
    pub entries: Vec<EntryView>,
    /// Pass as `after` for the next page; null on the last page.
    pub next_after: Option<i64>,
}
