//! Orders: `POST /v1/accounts/{id}/orders`, `GET /v1/orders/{order_id}`, and
//! `POST /v1/orders/{order_id}/payments` with a ticket — an order is paid once.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::integral;

/// An order to place.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct OrderRequest {
    /// Minor units, 1 to 10^12 (an integral number such as `250.0` counts).
    #[serde(deserialize_with = "integral")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 1_000_000_000_000_i64, example = 2500)
    )]
    pub amount: i64,
    /// What it is for: up to 200 characters (none: empty).
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 200, pattern = "^[^\\u0000]*$", example = "order #1017")
    )]
    pub description: String,
}

/// A payment's body: empty, or `{}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PaymentRequest {}

/// Where an order stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum OrderState {
    /// Placed, not paid yet.
    Open,
    /// Paid, once and for good.
    Paid,
}

/// An order.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OrderView {
    /// The order's id.
    pub order_id: Uuid,
    /// The account that pays it.
    pub account_id: Uuid,
    /// Minor units.
    pub amount: i64,
    /// What it is for.
    pub description: String,
    /// `open` until a payment goes through, then `paid`.
    #[cfg_attr(feature = "openapi", schema(example = "open"))]
    pub state: OrderState,
    /// The ticket that paid it, once paid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid_by_ticket: Option<Uuid>,
    /// When it was paid (RFC 3339), once paid.
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, format = DateTime)
    )]
    pub paid_at: Option<OffsetDateTime>,
    /// When it was placed (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: OffsetDateTime,
}

/// An order payment that went through.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OrderPaid {
    /// The order paid.
    pub order_id: Uuid,
    /// The ticket spent.
    pub ticket_id: Uuid,
    /// The account.
    pub account_id: Uuid,
    /// The order's amount, withdrawn, in minor units.
    pub amount: i64,
    /// The balance after.
    pub balance: i64,
    /// Always `paid`.
    #[cfg_attr(feature = "openapi", schema(example = "paid"))]
    pub state: String,
}
