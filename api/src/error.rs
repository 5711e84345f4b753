//! Every error the API answers, in one place, as RFC 9457 `application/problem+json`.
//!
//! A problem's `type` is `/problems/<name>`, a path this service also serves, with the
//! explanation from [`EXPLANATIONS`]. 5xx answers never show their cause to the
//! client; it is logged instead.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ledger::{ApplyError, LedgerError};
use lock::LockError;
use serde::Serialize;
use serde_json::{Map, Value};

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document: what every error body looks like. Stored refusals
/// (402, and 422 `balance-limit`) add `ticket_id`, `account_id` and the numbers involved.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// `/problems/<name>`: identifies the kind of problem; serves its explanation.
    #[serde(rename = "type")]
    #[schema(example = "/problems/insufficient-funds")]
    pub kind: String,
    /// Short, the same for every occurrence of the kind.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What happened this time.
    pub detail: String,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("a spend needs an Idempotency-Key header carrying a ticket id")]
    IdempotencyKeyMissing,
    #[error(
        "the Idempotency-Key is not a UUID (bare or as a quoted string): a ticket id for a spend, a key of your choosing for a create"
    )]
    IdempotencyKeyInvalid,
    #[error("send exactly one Idempotency-Key header")]
    IdempotencyKeyRepeated,
    #[error("{0}")]
    MalformedJson(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or unknown API key: send `Authorization: Bearer <api_key>`")]
    Unauthenticated,
    #[error("this API key belongs to another account")]
    Forbidden,
    #[error(
        "creating money — an opening balance or points above zero, a deposit — needs the operator key on this instance: send `Authorization: Bearer <operator key>`"
    )]
    OperatorKeyRequired,
    #[error("{0}")]
    NotFound(String),
    #[error("no such ticket for this account")]
    TicketNotFound,
    #[error("no such order for this account")]
    OrderNotFound,
    #[error("no such payout for this account")]
    PayoutNotFound,
    #[error("no such hold for this account")]
    HoldNotFound,
    #[error("this method is not allowed here")]
    MethodNotAllowed,
    #[error("the original request with this ticket is still executing; retry shortly")]
    RequestInProgress,
    #[error("the account is busy with other requests; retry shortly")]
    AccountBusy,
    #[error("too many requests; retry after {retry_after} s")]
    RateLimited {
        /// Seconds until a retry will be let through.
        retry_after: u64,
    },
    #[error("the ticket expired unused; take a new one")]
    TicketExpired,
    #[error("the ticket was used, and its stored outcome is past retention")]
    OutcomePruned,
    #[error("the request body is larger than 16 KiB")]
    PayloadTooLarge,
    #[error("send the body as `Content-Type: application/json`")]
    UnsupportedMediaType,
    #[error("{0}")]
    InvalidRequest(String),
    #[error("this ticket was already used for a different request; nothing was executed")]
    IdempotencyKeyReuse,
    #[error(
        "this Idempotency-Key was already used for another request (another body or another endpoint); nothing was done"
    )]
    CreateKeyReuse,
    #[error(
        "the account lock was lost before the write; nothing was stored, retry with the same ticket"
    )]
    LockLost,
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    #[error("lock store unavailable: {0}")]
    LockStoreUnavailable(String),
    #[error("database unavailable: {0}")]
    DatabaseUnavailable(String),
    #[error(
        "payouts are not set up on this instance: set PAYONCE_BANK_URL (every instance the same bank); nothing was stored, the ticket is still usable"
    )]
    PayoutsUnavailable,
    #[error("{0}")]
    BankFaultUnknown(String),
    #[error(
        "Payonce-Bank-Fault is for the demonstration bank of the embedded mode; this instance pays out to the bank at PAYONCE_BANK_URL, which is never asked to fail. Nothing was stored, the ticket is still usable: send the payout without the header"
    )]
    BankFaultRefused,
    #[error("the bank did not answer: {0}")]
    BankUnavailable(String),
    #[error("the webhook URL is refused: {0}")]
    WebhookUrlRefused(String),
    #[error("the account has as many webhook endpoints as it may ({0}); delete one first")]
    WebhookEndpointLimit(usize),
    #[error("no such webhook endpoint (or another account's)")]
    WebhookEndpointNotFound,
    #[error("no such delivery of this endpoint")]
    DeliveryNotFound,
    #[error("the delivery is being sent right now; ask again once its attempt is over")]
    DeliveryInFlight,
    #[error(
        "the endpoint no longer gets events: its receiver answered 410 Gone; create a new endpoint"
    )]
    WebhookEndpointDisabled,
    #[error("webhooks are not set up on this instance")]
    WebhooksUnavailable,
    #[error("this instance is working on as many requests as it takes; retry shortly")]
    Overloaded,
    #[error("the request took longer than the server allows")]
    Timeout,
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// The status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::IdempotencyKeyMissing
            | Self::IdempotencyKeyInvalid
            | Self::IdempotencyKeyRepeated
            | Self::MalformedJson(_)
            | Self::BadRequest(_)
            | Self::BankFaultUnknown(_) => StatusCode::BAD_REQUEST,
            Self::WebhookEndpointNotFound | Self::DeliveryNotFound => StatusCode::NOT_FOUND,
            Self::DeliveryInFlight | Self::WebhookEndpointDisabled => StatusCode::CONFLICT,
            Self::WebhookUrlRefused(_) | Self::WebhookEndpointLimit(_) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::Forbidden | Self::OperatorKeyRequired => StatusCode::FORBIDDEN,
            Self::NotFound(_)
            | Self::TicketNotFound
            | Self::OrderNotFound
            | Self::PayoutNotFound
            | Self::HoldNotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::RequestInProgress | Self::AccountBusy => StatusCode::CONFLICT,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::TicketExpired | Self::OutcomePruned => StatusCode::GONE,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::InvalidRequest(_)
            | Self::IdempotencyKeyReuse
            | Self::CreateKeyReuse
            | Self::BankFaultRefused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::LockLost
            | Self::OutcomeUnknown(_)
            | Self::LockStoreUnavailable(_)
            | Self::DatabaseUnavailable(_)
            | Self::PayoutsUnavailable
            | Self::BankUnavailable(_)
            | Self::WebhooksUnavailable
            | Self::Overloaded
            | Self::Timeout => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The problem's name: the last segment of its `type`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::IdempotencyKeyMissing => "idempotency-key-missing",
            Self::IdempotencyKeyInvalid | Self::IdempotencyKeyRepeated => "idempotency-key-invalid",
            Self::MalformedJson(_) => "malformed-json",
            Self::BadRequest(_) => "bad-request",
            Self::Unauthenticated => "unauthenticated",
            Self::Forbidden => "forbidden",
            Self::OperatorKeyRequired => "operator-key-required",
            Self::NotFound(_) => "not-found",
            Self::TicketNotFound => "ticket-not-found",
            Self::OrderNotFound => "order-not-found",
            Self::PayoutNotFound => "payout-not-found",
            Self::HoldNotFound => "hold-not-found",
            Self::MethodNotAllowed => "method-not-allowed",
            Self::RequestInProgress => "request-in-progress",
            Self::AccountBusy => "account-busy",
            Self::RateLimited { .. } => "rate-limited",
            Self::TicketExpired => "ticket-expired",
            Self::OutcomePruned => "outcome-expired",
            Self::PayloadTooLarge => "payload-too-large",
            Self::UnsupportedMediaType => "unsupported-media-type",
            Self::InvalidRequest(_) => "invalid-request",
            Self::IdempotencyKeyReuse | Self::CreateKeyReuse => "idempotency-key-reuse",
            Self::LockLost => "lock-lost",
            Self::OutcomeUnknown(_) => "outcome-unknown",
            Self::LockStoreUnavailable(_) => "lock-store-unavailable",
            Self::DatabaseUnavailable(_) => "database-unavailable",
            Self::PayoutsUnavailable => "payouts-unavailable",
            Self::BankFaultUnknown(_) => "bank-fault-unknown",
            Self::BankFaultRefused => "bank-fault-refused",
            Self::BankUnavailable(_) => "bank-unavailable",
            Self::WebhookUrlRefused(_) => "webhook-url-refused",
            Self::WebhookEndpointLimit(_) => "webhook-endpoint-limit",
            Self::WebhookEndpointNotFound => "webhook-endpoint-not-found",
            Self::DeliveryNotFound => "delivery-not-found",
            Self::DeliveryInFlight => "delivery-in-flight",
            Self::WebhookEndpointDisabled => "webhook-endpoint-disabled",
            Self::WebhooksUnavailable => "webhooks-unavailable",
            Self::Overloaded => "overloaded",
            Self::Timeout => "timeout",
            Self::Internal(_) => "internal-error",
        }
    }

    /// Seconds after which a retry may succeed, for the `Retry-After` header.
    pub fn retry_after(&self) -> Option<u64> {
        if let Self::RateLimited { retry_after } = self {
            return Some(*retry_after);
        }
        // A disabled endpoint stays disabled: nothing to wait for.
        if let Self::WebhookEndpointDisabled = self {
            return None;
        }
        match self.status() {
            StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE => Some(1),
            _ => None,
        }
    }

    /// The detail shown to the client: the message, except for 5xx, whose causes are
    /// internal and only logged.
    fn public_detail(&self) -> String {
        match self {
            Self::LockStoreUnavailable(_) => {
                "the lock store is unavailable; nothing was executed, retry with the same ticket"
                    .into()
            }
            Self::OutcomeUnknown(_) => {
                "the connection to the database failed after this spend was sent to it, so the money may have moved; resend the same request with the same ticket to learn the outcome (it executes at most once)"
                    .into()
            }
            Self::DatabaseUnavailable(_) => {
                "the database is unavailable; nothing was executed, retry with the same ticket"
                    .into()
            }
            Self::BankUnavailable(_) => {
                "the bank did not answer, or not as its contract says; nothing changed — ask again shortly"
                    .into()
            }
            Self::Internal(_) => "an internal error occurred; it has been logged".into(),
            other => other.to_string(),
        }
    }

    /// The problem document.
    pub fn problem(&self) -> Problem {
        problem(self.status(), self.name(), &self.public_detail())
    }
}

/// The problem document for a status, a name and a detail.
pub fn problem(status: StatusCode, name: &str, detail: &str) -> Problem {
    Problem {
        kind: format!("/problems/{name}"),
        title: title(name),
        status: status.as_u16(),
        detail: detail.to_owned(),
    }
}

/// The title of each problem name: the name in words.
fn title(name: &str) -> String {
    let words = name.replace('-', " ");
    let mut chars = words.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// The body of a problem with extra members (stored refusals carry their numbers).
pub fn problem_with(problem: &Problem, extra: Map<String, Value>) -> Value {
    let mut body = serde_json::to_value(problem)
        .ok()
        .and_then(|value| value.as_object().cloned())
        .unwrap_or_default();
    body.extend(extra);
    Value::Object(body)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            if status == StatusCode::INTERNAL_SERVER_ERROR {
                tracing::error!(error = %self, "request failed");
            } else {
                tracing::warn!(error = %self, "request refused: service unavailable");
            }
        }
        let mut response = (status, Json(self.problem())).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if matches!(self, Self::Unauthenticated) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<LedgerError> for ApiError {
    fn from(error: LedgerError) -> Self {
        match error {
            LedgerError::Unavailable(cause) => Self::DatabaseUnavailable(cause.to_string()),
            LedgerError::OutcomeUnknown(cause) => Self::OutcomeUnknown(cause.to_string()),
            LedgerError::Invalid(invalid) => Self::InvalidRequest(invalid.to_string()),
            LedgerError::CreateKeyReused => Self::CreateKeyReuse,
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<LockError> for ApiError {
    fn from(error: LockError) -> Self {
        match error {
            LockError::TimedOut { .. } | LockError::QueueFull { .. } => Self::AccountBusy,
            LockError::Unavailable { reason } => Self::LockStoreUnavailable(reason),
            LockError::Lost { .. } => Self::LockLost,
            LockError::Invalid(reason) => Self::Internal(reason),
        }
    }
}

impl From<ApplyError> for ApiError {
    fn from(error: ApplyError) -> Self {
        match error {
            ApplyError::UnknownTicket => Self::TicketNotFound,
            ApplyError::UnknownOrder => Self::OrderNotFound,
            ApplyError::UnknownHold => Self::HoldNotFound,
            ApplyError::TicketExpired => Self::TicketExpired,
            ApplyError::FingerprintMismatch => Self::IdempotencyKeyReuse,
            ApplyError::OutcomePruned => Self::OutcomePruned,
            ApplyError::StaleToken { .. } | ApplyError::Overtaken => Self::LockLost,
            ApplyError::Ledger(error) => error.into(),
        }
    }
}

/// Every problem name, its status and what it means: served at `/problems/<name>` and
/// listed in the error table of docs/api.md.
pub const EXPLANATIONS: &[(&str, u16, &str)] = &[
    (
        "idempotency-key-missing",
        400,
        "A spend was sent without an `Idempotency-Key` header. Take a ticket (POST /v1/accounts/{id}/tickets) and send its id as the key.",
    ),
    (
        "idempotency-key-invalid",
        400,
        "The `Idempotency-Key` is not a UUID (bare, or as a quoted structured-field string), or the header was sent more than once. Nothing was executed or created.",
    ),
    (
        "malformed-json",
        400,
        "The body is not valid JSON. Nothing was stored; the ticket is still usable.",
    ),
    ("bad-request", 400, "A query parameter is malformed."),
    (
        "bank-fault-unknown",
        400,
        "A payout's `Payonce-Bank-Fault` header names no fault the demonstration bank plays (fail-before, commit-then-drop, commit-then-slow, decline, unavailable, down), or came twice. Nothing was stored; the ticket is still usable.",
    ),
    (
        "unauthenticated",
        401,
        "No API key, or an unknown one. Send `Authorization: Bearer <api_key>` with the key shown when the account was created.",
    ),
    (
        "forbidden",
        403,
        "The API key is valid but belongs to another account.",
    ),
    (
        "operator-key-required",
        403,
        "This instance has an operator key (PAYONCE_OPERATOR_KEY): opening an account with a balance or points above zero, and every deposit, need `Authorization: Bearer <operator key>`; an account's own key is not enough. Nothing was stored; the ticket is still usable.",
    ),
    ("not-found", 404, "No such resource."),
    (
        "ticket-not-found",
        404,
        "The ticket does not exist, or was issued to another account.",
    ),
    (
        "order-not-found",
        404,
        "The order does not exist, or was placed by another account.",
    ),
    (
        "payout-not-found",
        404,
        "The payout does not exist, or was sent from another account.",
    ),
    (
        "hold-not-found",
        404,
        "The hold does not exist, or sets aside another account's money.",
    ),
    (
        "webhook-endpoint-not-found",
        404,
        "The webhook endpoint does not exist, was deleted, or belongs to another account.",
    ),
    (
        "delivery-not-found",
        404,
        "The endpoint has no delivery with this id.",
    ),
    (
        "delivery-in-flight",
        409,
        "A worker is sending this delivery right now. Ask again after `Retry-After` seconds, once its attempt is over.",
    ),
    (
        "webhook-endpoint-disabled",
        409,
        "The endpoint's receiver answered 410 Gone, so the endpoint was disabled and gets no more events; nothing of it is sent again. Create a new endpoint.",
    ),
    (
        "method-not-allowed",
        405,
        "The resource exists but not with this method.",
    ),
    (
        "request-in-progress",
        409,
        "The original request with this ticket is still executing. Retry after `Retry-After` seconds to get its outcome.",
    ),
    (
        "account-busy",
        409,
        "Other requests held the account's lock longer than this request may wait, or as many requests as an account may queue were already waiting (PAYONCE_LOCK_MAX_WAITERS). Nothing was executed; retry with the same ticket.",
    ),
    (
        "hold-not-held",
        409,
        "The hold is not held: it was captured, voided, or expired (by the ledger's clock, swept or not) — `state` says which. Stored under the ticket you sent and replayed; nothing moved.",
    ),
    (
        "refund-exceeds-payment",
        409,
        "The refund asks for more than is still refundable of the payment — `refundable` says how much is. Stored under the ticket you sent and replayed; nothing moved. A payment's refunds never add up to more than it paid.",
    ),
    (
        "order-not-paid",
        409,
        "The order is not paid: there is nothing to refund. Stored under the ticket you sent and replayed; nothing moved.",
    ),
    (
        "order-already-paid",
        409,
        "The order was paid already, by the ticket in `paid_by_ticket`. This refusal is stored under the ticket you sent and replayed; nothing moved. An order is paid once, whatever the ticket.",
    ),
    (
        "capture-exceeds-hold",
        422,
        "The capture asks for more than the hold sets aside — `held` says how much it does. Stored under the ticket you sent and replayed; nothing moved.",
    ),
    (
        "rate-limited",
        429,
        "Too many requests: accounts opened or unknown keys sent per client address, or tickets, orders or spends per account, over the configured rate. Nothing was stored; retry after `Retry-After` seconds (with the same ticket, for a spend).",
    ),
    (
        "insufficient-funds",
        402,
        "The balance did not cover the withdrawal. This outcome is stored under the ticket and replayed; take a new ticket to try again.",
    ),
    (
        "insufficient-points",
        402,
        "The points did not cover the draw. Stored and replayed like any outcome.",
    ),
    (
        "ticket-expired",
        410,
        "The ticket expired before it was used. Take a new one.",
    ),
    (
        "outcome-expired",
        410,
        "The ticket was used, but its stored outcome is past retention. It will never execute again.",
    ),
    (
        "payload-too-large",
        413,
        "The body is over 16 KiB. Nothing was stored; the ticket is still usable.",
    ),
    (
        "unsupported-media-type",
        415,
        "Send JSON bodies with `Content-Type: application/json`. Nothing was stored.",
    ),
    (
        "invalid-request",
        422,
        "The body is JSON but not a valid request (an amount outside 1..=10^12, a missing field, an unknown field). Nothing was stored; the ticket is still usable.",
    ),
    (
        "bank-fault-refused",
        422,
        "A payout carried `Payonce-Bank-Fault`, but this instance pays out to the bank at PAYONCE_BANK_URL: only the demonstration bank of the embedded mode is ever asked to fail. Nothing was stored; the ticket is still usable — send the payout without the header.",
    ),
    (
        "webhook-url-refused",
        422,
        "The webhook URL cannot be used: not http or https, a user name or password in it, a fragment, or a host that is (or resolves only to) a loopback, private, link-local or metadata address — refused unless the operator set PAYONCE_WEBHOOK_ALLOW_PRIVATE. Nothing was created.",
    ),
    (
        "webhook-endpoint-limit",
        422,
        "The account has as many webhook endpoints as it may (16). Delete one first. Nothing was created.",
    ),
    (
        "balance-limit",
        422,
        "The deposit or prize would overflow the balance. Stored and replayed like any outcome.",
    ),
    (
        "idempotency-key-reuse",
        422,
        "The ticket was already used for a different request (another amount or another endpoint), or a create's (or a webhook request's) `Idempotency-Key` was already used for another request. Nothing was executed, created or changed.",
    ),
    (
        "lock-lost",
        503,
        "The account lock was lost (or a newer lock holder had written) before this request could commit. Nothing was stored; retry with the same ticket.",
    ),
    (
        "outcome-unknown",
        503,
        "The connection to the database failed after the spend was sent to it, so it may have completed: money may have moved. Do not take a new ticket: resend the same request with the same ticket. A completed spend replays its stored outcome; an unfinished one executes — at most once either way. `GET /v1/tickets/{id}` shows it too.",
    ),
    (
        "lock-store-unavailable",
        503,
        "The lock service (Redis, ZooKeeper or etcd) cannot be reached. Nothing was executed; retry with the same ticket.",
    ),
    (
        "database-unavailable",
        503,
        "The database cannot be reached. Nothing was executed; retry with the same ticket.",
    ),
    (
        "payouts-unavailable",
        503,
        "This instance has no bank to send payouts to (a distributed instance without PAYONCE_BANK_URL). Nothing was stored; the ticket is still usable.",
    ),
    (
        "bank-unavailable",
        503,
        "Asked what it holds for a payout, the bank did not answer in time, or not as its contract says. Nothing changed; ask again after `Retry-After` seconds.",
    ),
    (
        "webhooks-unavailable",
        503,
        "This instance was started without webhooks. Nothing changed; ask another instance.",
    ),
    (
        "overloaded",
        503,
        "The instance is working on as many requests as it takes (PAYONCE_MAX_IN_FLIGHT). Nothing was executed; retry after `Retry-After` seconds, with the same ticket for a spend.",
    ),
    (
        "timeout",
        503,
        "The request took longer than the server allows, and its outcome is unknown: a spend may have completed just before the answer was cut off. Send the same request with the same ticket to learn it — a completed spend replays, an unfinished one executes, at most once either way.",
    ),
    ("internal-error", 500, "A bug. It has been logged."),
    (
        "not-ready",
        503,
        "From /readyz: the database or the lock store does not answer.",
    ),
];
