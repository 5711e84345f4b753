//! Holds and refunds: `POST /v1/accounts/{id}/holds`, `GET /v1/holds/{hold_id}`,
//! `POST /v1/holds/{hold_id}/capture` and `…/void`, and refunds of a paid order
//! (`POST /v1/orders/{order_id}/refunds`) or of a captured hold
//! (`POST /v1/holds/{hold_id}/refunds`) — each sent with a ticket.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::integral;

/// The longest a hold lasts, seconds: seven days (and what a hold gets when it names
/// none).
pub const MAX_HOLD_SECONDS: i64 = 604_800;

fn longest() -> i64 {
    MAX_HOLD_SECONDS
}

/// A hold to place.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    /// Minor units to set aside, 1 to 10^12, at most what is available.
    #[serde(deserialize_with = "integral")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 1_000_000_000_000_i64, example = 6000)
    )]
    pub amount: i64,
    /// Seconds until the hold expires unless captured or voided, 1 to 604800 (seven days,
    /// the default), by the ledger's clock.
    #[serde(default = "longest", deserialize_with = "integral")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 604_800, default = 604_800, example = 3600)
    )]
    pub expires_in: i64,
}

/// A capture's body: empty, `{}` (the whole hold), or `{"amount"}` (part of it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CaptureRequest {
    /// Minor units to take, 1 to 10^12, at most the hold (none: the whole hold).
    #[serde(
        default,
        deserialize_with = "crate::integral::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 1_000_000_000_000_i64, example = 4500)
    )]
    pub amount: Option<i64>,
}

/// A void's body: empty, or `{}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct VoidRequest {}

/// A refund to make.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    /// Minor units to give back, 1 to 10^12, at most what is still refundable.
    #[serde(deserialize_with = "integral")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 1_000_000_000_000_i64, example = 1500)
    )]
    pub amount: i64,
}

/// Where a hold is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum HoldState {
    /// Set aside: counted against the money available.
    Held,
    /// Captured, all or part; the rest released.
    Captured,
    /// Released by a void.
    Voided,
    /// Released by the clock: past its expiry, swept or not.
    Expired,
}

/// A hold just placed.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HoldPlaced {
    /// The hold's id.
    pub hold_id: Uuid,
    /// The account whose money it sets aside.
    pub account_id: Uuid,
    /// The ticket spent.
    pub ticket_id: Uuid,
    /// Minor units set aside.
    pub amount: i64,
    /// Always `held`.
    pub state: HoldState,
    /// When it expires unless captured or voided before (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub expires_at: OffsetDateTime,
    /// The balance: a hold moves no money.
    pub balance: i64,
    /// The balance less the holds held and not expired, this one included.
    pub available: i64,
}

/// A hold as it is now.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HoldView {
    /// The hold's id.
    pub hold_id: Uuid,
    /// The account whose money it sets aside.
    pub account_id: Uuid,
    /// Minor units it sets aside (or did).
    pub amount: i64,
    /// Where it is; past its expiry and never captured or voided, `expired`.
    pub state: HoldState,
    /// What its capture took, once captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured_amount: Option<i64>,
    /// What its refunds gave back.
    pub refunded_amount: i64,
    /// When it expires, or expired (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub expires_at: OffsetDateTime,
    /// When it was placed (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: OffsetDateTime,
    /// When it was captured, voided or expired (RFC 3339), once it was.
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, format = DateTime)
    )]
    pub resolved_at: Option<OffsetDateTime>,
    /// The ticket that captured or voided it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_by_ticket: Option<Uuid>,
}

/// A hold just captured or voided: the hold, and the account's balance and available money
/// after.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HoldResolved {
    /// The hold as it is now.
    #[serde(flatten)]
    pub hold: HoldView,
    /// The balance after (less the captured amount, for a capture).
    pub balance: i64,
    /// The balance less the holds held and not expired, after.
    pub available: i64,
}

/// A refund of an order, made.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OrderRefunded {
    /// The refund's id.
    pub refund_id: Uuid,
    /// The order refunded.
    pub order_id: Uuid,
    /// The ticket spent.
    pub ticket_id: Uuid,
    /// The account the money went back to.
    pub account_id: Uuid,
    /// Minor units given back.
    pub amount: i64,
    /// What the order's refunds add up to, this one included.
    pub refunded_total: i64,
    /// What is still refundable of the order.
    pub refundable: i64,
    /// The balance after.
    pub balance: i64,
}

/// A refund of a captured hold, made.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HoldRefunded {
    /// The refund's id.
    pub refund_id: Uuid,
    /// The hold refunded.
    pub hold_id: Uuid,
    /// The ticket spent.
    pub ticket_id: Uuid,
    /// The account the money went back to.
    pub account_id: Uuid,
    /// Minor units given back.
    pub amount: i64,
    /// What the hold's refunds add up to, this one included.
    pub refunded_total: i64,
    /// What is still refundable of the capture.
    pub refundable: i64,
    /// The balance after.
    pub balance: i64,
}
