//! Webhook endpoints and their deliveries: `/v1/accounts/{id}/webhook-endpoints`,
//! `/v1/webhook-endpoints/{endpoint_id}/deliveries`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

/// What happened, as an event names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum EventType {
    /// A withdrawal executed (201).
    #[serde(rename = "withdrawal.succeeded")]
    WithdrawalSucceeded,
    /// A withdrawal refused for want of money (402, stored).
    #[serde(rename = "withdrawal.refused")]
    WithdrawalRefused,
    /// A lottery draw executed (201).
    #[serde(rename = "lottery.drawn")]
    LotteryDrawn,
    /// An order paid (201).
    #[serde(rename = "order.paid")]
    OrderPaid,
    /// The bank made a payout's transfer.
    #[serde(rename = "payout.succeeded")]
    PayoutSucceeded,
    /// The bank refused a payout for good; its money came back.
    #[serde(rename = "payout.failed")]
    PayoutFailed,
    /// A hold captured (200): its captured amount out of the account, the rest released.
    #[serde(rename = "hold.captured")]
    HoldCaptured,
    /// A hold voided (200): all of it released.
    #[serde(rename = "hold.voided")]
    HoldVoided,
    /// A hold expired, recorded by a sweeper: all of it released.
    #[serde(rename = "hold.expired")]
    HoldExpired,
    /// A refund of a paid order or a captured hold (201): money back on the account.
    #[serde(rename = "refund.succeeded")]
    RefundSucceeded,
}

impl EventType {
    /// Every type, in the catalogue's order.
    pub const ALL: [Self; 10] = [
        Self::WithdrawalSucceeded,
        Self::WithdrawalRefused,
        Self::LotteryDrawn,
        Self::OrderPaid,
        Self::PayoutSucceeded,
        Self::PayoutFailed,
        Self::HoldCaptured,
        Self::HoldVoided,
        Self::HoldExpired,
        Self::RefundSucceeded,
    ];

    /// The name events carry (`withdrawal.succeeded`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WithdrawalSucceeded => "withdrawal.succeeded",
            Self::WithdrawalRefused => "withdrawal.refused",
            Self::LotteryDrawn => "lottery.drawn",
            Self::OrderPaid => "order.paid",
            Self::PayoutSucceeded => "payout.succeeded",
            Self::PayoutFailed => "payout.failed",
            Self::HoldCaptured => "hold.captured",
            Self::HoldVoided => "hold.voided",
            Self::HoldExpired => "hold.expired",
            Self::RefundSucceeded => "refund.succeeded",
        }
    }

    /// The type `name` names.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An endpoint to create.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EndpointRequest {
    /// Where events are sent: an `http` or `https` URL of at most 1024 characters — as
    /// sent, and as stored, its non-ASCII characters percent-encoded — with no user
    /// name, password or fragment, whose host is not (and does not resolve only to) a
    /// loopback, private, link-local or metadata address, unless the operator allows
    /// private ones (`PAYONCE_WEBHOOK_ALLOW_PRIVATE`). Refused: 422 `webhook-url-refused`.
    #[cfg_attr(
        feature = "openapi",
        schema(
            max_length = 1024,
            pattern = r"^[Hh][Tt][Tt][Pp][Ss]?://[^@/?#\s]+([/?][^#\s]*)?$",
            example = "https://example.com/payonce-events"
        )
    )]
    pub url: String,
    /// The event types it wants; omitted, every type (those added later too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 10))]
    pub events: Option<Vec<EventType>>,
}

/// An endpoint, as listed (its secret is never shown again).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EndpointView {
    /// Its id.
    pub id: Uuid,
    /// The account whose events it gets.
    pub account_id: Uuid,
    /// Where they are sent.
    pub url: String,
    /// The event types it gets; absent: every type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<EventType>>,
    /// `enabled`, or `disabled` once its receiver answered 410 Gone.
    #[cfg_attr(feature = "openapi", schema(example = "enabled"))]
    pub status: String,
    /// Why it was disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<String>,
    /// During a rotation: until when the secret before it signs too (RFC 3339).
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, format = DateTime)
    )]
    pub previous_secret_expires_at: Option<OffsetDateTime>,
    /// When it was made (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: OffsetDateTime,
}

/// An endpoint as created or rotated: with the secret that signs for it, shown this once.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EndpointWithSecret {
    /// The endpoint.
    #[serde(flatten)]
    pub endpoint: EndpointView,
    /// The signing secret: `whsec_` and the base64 of 32 random bytes. Keep it: it is not
    /// shown again.
    #[cfg_attr(
        feature = "openapi",
        schema(example = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwMfKQ9r8GKYq=")
    )]
    pub secret: String,
}

/// An account's endpoints.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EndpointList {
    /// Oldest first.
    pub endpoints: Vec<EndpointView>,
}

/// One attempt to deliver, and the receiver's answer.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptView {
    /// 1 for the first.
    pub attempt: u32,
    /// When its answer was recorded (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub recorded_at: OffsetDateTime,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// The receiver's status; absent when no answer came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_status: Option<u16>,
    /// What went wrong; absent for a 2xx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The start of the receiver's answer (at most 1 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_body: Option<String>,
}

/// A delivery of one event to the endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryView {
    /// Its id.
    pub id: i64,
    /// The event's id: the `webhook-id` header of every attempt.
    pub event_id: Uuid,
    /// The event's type.
    pub event_type: EventType,
    /// The ticket of the request the event came of.
    pub ticket_id: Uuid,
    /// `pending`, `delivered`, `exhausted` (every scheduled attempt failed),
    /// `endpoint-disabled` or `endpoint-deleted`.
    #[cfg_attr(feature = "openapi", schema(example = "delivered"))]
    pub status: String,
    /// When the next attempt is due, while pending (RFC 3339).
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, format = DateTime)
    )]
    pub next_attempt_at: Option<OffsetDateTime>,
    /// The body every attempt sends: `{"type", "timestamp", "data"}`.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub payload: Value,
    /// Every attempt, first first.
    pub attempts: Vec<AttemptView>,
    /// When the event committed (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: OffsetDateTime,
}

/// A page of deliveries, newest first.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveriesPage {
    /// The deliveries.
    pub deliveries: Vec<DeliveryView>,
    /// Pass as `before` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<i64>,
}

/// The demonstration inbox of an account: where to point an endpoint, and what came
/// (`GET /v1/accounts/{id}/webhook-inbox`, the embedded mode only).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InboxView {
    /// The URL to give an endpoint. Add `?first=503` (any status from 400 to 599) to have
    /// the first delivery of each event answered so, and see it sent again.
    pub url: String,
    /// What this account's endpoints delivered there, oldest first (the last 50).
    pub received: Vec<InboxEntry>,
}

/// One request the inbox received.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InboxEntry {
    /// `webhook-id`.
    pub webhook_id: String,
    /// `webhook-timestamp`.
    pub webhook_timestamp: String,
    /// `webhook-signature`.
    pub webhook_signature: String,
    /// The body, as it came.
    pub body: String,
    /// What the inbox answered.
    pub answered: u16,
    /// When it came (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub received_at: OffsetDateTime,
}
