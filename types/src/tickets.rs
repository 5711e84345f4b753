//! `POST /v1/accounts/{id}/tickets` and `GET /v1/tickets/{ticket_id}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

/// A fresh ticket: send its id as the `Idempotency-Key` of one spend.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TicketIssued {
    /// The ticket's id.
    pub ticket_id: Uuid,
    /// The account it may be spent on.
    pub account_id: Uuid,
    /// After this it can no longer be used (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub expires_at: OffsetDateTime,
}

/// A stored response.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoredResponseView {
    /// Its HTTP status.
    pub status: u16,
    /// Its JSON body.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub body: Value,
}

/// Where a ticket stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum TicketState {
    /// Not used yet, and still usable.
    Issued,
    /// Used: its response is stored.
    Completed,
    /// Not used before it expired: it never will be.
    Expired,
}

/// A ticket and, once used, the response stored under it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TicketView {
    /// The ticket's id.
    pub ticket_id: Uuid,
    /// The account it belongs to.
    pub account_id: Uuid,
    /// `issued`, `completed` or `expired`.
    #[cfg_attr(feature = "openapi", schema(example = "completed"))]
    pub state: TicketState,
    /// The stored response, once used (absent once past retention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<StoredResponseView>,
    /// When it was issued (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: OffsetDateTime,
    /// When it stops being usable (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub expires_at: OffsetDateTime,
}
