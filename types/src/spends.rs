//! Withdrawals, deposits and lottery draws: `POST /v1/accounts/{id}/withdrawals`,
//! `/deposits` and `/lottery-draws`, each sent with a ticket as its `Idempotency-Key`.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::integral;

/// A withdrawal or a deposit.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MoneyRequest {
    /// Minor units, 1 to 10^12 (an integral number such as `250.0` counts).
    #[serde(deserialize_with = "integral")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 1_000_000_000_000_i64, example = 250)
    )]
    pub amount: i64,
}

fn one() -> i64 {
    1
}

/// A lottery draw.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DrawRequest {
    /// Points to spend, 1 to 10^12.
    #[serde(default = "one", deserialize_with = "integral")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 1_000_000_000_000_i64, default = 1)
    )]
    pub points: i64,
}

/// A withdrawal or deposit that went through.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MoneyMoved {
    /// The ticket spent.
    pub ticket_id: Uuid,
    /// The account.
    pub account_id: Uuid,
    /// The amount withdrawn or deposited, in minor units.
    pub amount: i64,
    /// The balance after.
    pub balance: i64,
}

/// A lottery draw that went through.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Drawn {
    /// The ticket spent.
    pub ticket_id: Uuid,
    /// The account.
    pub account_id: Uuid,
    /// The prize drawn: `nothing`, `bronze`, `silver` or `gold`.
    pub prize: String,
    /// Money the prize credited, in minor units (≥ 0).
    pub credit: i64,
    /// Points spent on the draw.
    pub points: i64,
    /// Points left after the draw.
    pub points_after: i64,
    /// The balance after the credit.
    pub balance: i64,
}
