//! Holds and refunds: `POST /v1/accounts/{id}/holds`, `GET /v1/holds/{hold_id}`,
//! `POST /v1/holds/{hold_id}/capture`, `…/void` and `…/refunds`, and
//! `POST /v1/orders/{order_id}/refunds`.
//!
//! Each is a spend: a ticket of the account, the spends' protocol (`spends.rs`), the outcome
//! — refusals included — stored under the ticket. A new hold runs under the account's lock;
//! a capture, a void and a hold's refunds under the hold's; an order's refunds under the
//! order's. A refund looks its payment up first (another account's is not found, before any
//! ticket is looked at); a capture and a void read nothing before the ledger's statement,
//! which finds the hold with the account or answers 404 `hold-not-found` (a placing and
//! its capture are each one round trip in the group commit). Two requests that race for one hold or one payment take turns on its lock, and
//! the ledger settles each on the latest row, by the database's clock: one capture, void or
//! expiry wins; refunds succeed exactly as far as the payment goes.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use ledger::holds::{Hold, HoldId, HoldLifetime, Payment, RefundId};
use ledger::{Operation, OrderId};

use crate::auth::{Caller, OwnAccount};
use crate::error::{ApiError, Problem};
use crate::extract::{HoldPath, IdempotencyKey, JsonBody, OrderPath};
use crate::render::{HoldPlaced, HoldRefunded, HoldResolved, HoldView, OrderRefunded, hold_view};
use crate::routes::responses::{
    BodyTooLarge, MalformedSpend, NoSuchTicket, NotJson, OthersAccount, TicketGone, Unauthenticated,
};
use crate::routes::spends::{amount, spend};
use crate::state::AppState;

pub use payonce_types::holds::{CaptureRequest, HoldRequest, RefundRequest, VoidRequest};

/// Sets money aside: `amount` counted against the account's available money until the
/// hold is captured, voided, or expires `expires_in` seconds from now (by the ledger's
/// clock). A hold moves no money. Refused with 402 when the money available does not
/// cover it (stored under the ticket).
#[utoipa::path(
    post,
    path = "/v1/accounts/{id}/holds",
    tag = "holds",
    params(
        ("id" = uuid::Uuid, Path, description = "The account"),
        ("Idempotency-Key" = String, Header, description = "A ticket id of this account (a UUID, bare or quoted)"),
    ),
    security(("api_key" = [])),
    request_body = HoldRequest,
    responses(
        (status = 201, description = "Held (a replay carries `Idempotent-Replayed: true`)", body = HoldPlaced, links(
            ("GetHold" = (operation_id = "get_hold", parameters(("hold_id" = "$response.body#/hold_id")), description = "Read the hold")),
            ("CaptureHold" = (operation_id = "capture_hold", parameters(("hold_id" = "$response.body#/hold_id")), description = "Capture it (with a ticket as Idempotency-Key)")),
        )),
        (status = 400, response = MalformedSpend),
        (status = 401, response = Unauthenticated),
        (status = 402, description = "The money available does not cover the hold (`insufficient-funds`, stored; replayed)", body = Problem, content_type = "application/problem+json"),
        (status = 403, response = OthersAccount),
        (status = 404, response = NoSuchTicket),
        (status = 409, description = "Request in progress, or account busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, response = TicketGone),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "Invalid amount or expires_in, or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many spends for this account; nothing stored — resend with the same ticket after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, lock lost, or the instance overloaded — nothing stored; or `outcome-unknown`. Resend with the same ticket either way", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn place_hold(
    State(state): State<AppState>,
    OwnAccount(account): OwnAccount,
    key: IdempotencyKey,
    headers: HeaderMap,
    JsonBody(request): JsonBody<HoldRequest>,
) -> Result<Response, ApiError> {
    let operation = Operation::Hold {
        hold: HoldId::random(),
        amount: amount(request.amount)?,
        expires_in: HoldLifetime::new(request.expires_in)
            .map_err(|invalid| ApiError::InvalidRequest(invalid.to_string()))?,
    };
    let path = format!("/v1/accounts/{account}/holds");
    spend(&state, account, key, operation, &path, &request, &headers).await
}

/// Reads a hold as it is now: a hold past its expiry, never captured or voided, is
/// `expired` whether or not the sweeper has recorded it yet.
#[utoipa::path(
    get,
    path = "/v1/holds/{hold_id}",
    tag = "holds",
    params(("hold_id" = uuid::Uuid, Path, description = "The hold")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The hold", body = HoldView),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "No such hold, or another account's (`hold-not-found`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_hold(
    State(state): State<AppState>,
    caller: Caller,
    HoldPath(hold): HoldPath,
) -> Result<Json<HoldView>, ApiError> {
    Ok(Json(hold_view(&own_hold(&state, caller, hold).await?)))
}

/// Captures a held hold: `amount` of it (the whole hold when the body names none) out of
/// the account, the rest released at once. At most once: a hold captured, voided or expired
/// is refused with 409 `hold-not-held`, an amount above the hold with 422
/// `capture-exceeds-hold` — both stored under the ticket.
#[utoipa::path(
    post,
    path = "/v1/holds/{hold_id}/capture",
    tag = "holds",
    params(
        ("hold_id" = uuid::Uuid, Path, description = "The hold"),
        ("Idempotency-Key" = String, Header, description = "A ticket id of the hold's account (a UUID, bare or quoted)"),
    ),
    security(("api_key" = [])),
    request_body(content = CaptureRequest, description = "Empty or `{}` (the whole hold), or `{\"amount\"}`"),
    responses(
        (status = 200, description = "Captured (a replay carries `Idempotent-Replayed: true`)", body = HoldResolved),
        (status = 400, response = MalformedSpend),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "No such hold or ticket for this account", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The hold is not held (`hold-not-held` with `state`, stored; replayed), or a request in progress, or the hold busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, response = TicketGone),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "An amount above the hold (`capture-exceeds-hold`, stored; replayed), an invalid amount, or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many spends for this account; nothing stored — resend with the same ticket after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, lock lost, or the instance overloaded — nothing stored; or `outcome-unknown`. Resend with the same ticket either way", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn capture_hold(
    State(state): State<AppState>,
    caller: Caller,
    HoldPath(hold): HoldPath,
    key: IdempotencyKey,
    headers: HeaderMap,
    JsonBody(request): JsonBody<CaptureRequest>,
) -> Result<Response, ApiError> {
    let captured = request.amount.map(amount).transpose()?;
    let operation = Operation::Capture {
        hold,
        amount: captured,
    };
    let path = format!("/v1/holds/{hold}/capture");
    spend(&state, caller.0, key, operation, &path, &request, &headers).await
}

/// Voids a held hold: all of it released. At most once: a hold captured, voided or
/// expired is refused with 409 `hold-not-held` (stored under the ticket).
#[utoipa::path(
    post,
    path = "/v1/holds/{hold_id}/void",
    tag = "holds",
    params(
        ("hold_id" = uuid::Uuid, Path, description = "The hold"),
        ("Idempotency-Key" = String, Header, description = "A ticket id of the hold's account (a UUID, bare or quoted)"),
    ),
    security(("api_key" = [])),
    request_body(content = VoidRequest, description = "Empty, or `{}`"),
    responses(
        (status = 200, description = "Voided (a replay carries `Idempotent-Replayed: true`)", body = HoldResolved),
        (status = 400, response = MalformedSpend),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "No such hold or ticket for this account", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The hold is not held (`hold-not-held` with `state`, stored; replayed), or a request in progress, or the hold busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, response = TicketGone),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "A body other than `{}`, or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many spends for this account; nothing stored — resend with the same ticket after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, lock lost, or the instance overloaded — nothing stored; or `outcome-unknown`. Resend with the same ticket either way", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn void_hold(
    State(state): State<AppState>,
    caller: Caller,
    HoldPath(hold): HoldPath,
    key: IdempotencyKey,
    headers: HeaderMap,
    JsonBody(request): JsonBody<VoidRequest>,
) -> Result<Response, ApiError> {
    let path = format!("/v1/holds/{hold}/void");
    spend(
        &state,
        caller.0,
        key,
        Operation::Void { hold },
        &path,
        &request,
        &headers,
    )
    .await
}

/// Refunds part or all of a captured hold's capture, back to its account; never more in
/// all than was captured — past that, 409 `refund-exceeds-payment` with what is still
/// `refundable`; a hold not captured, 409 `hold-not-held` (both stored under the ticket).
#[utoipa::path(
    post,
    path = "/v1/holds/{hold_id}/refunds",
    tag = "holds",
    params(
        ("hold_id" = uuid::Uuid, Path, description = "The hold"),
        ("Idempotency-Key" = String, Header, description = "A ticket id of the hold's account (a UUID, bare or quoted)"),
    ),
    security(("api_key" = [])),
    request_body = RefundRequest,
    responses(
        (status = 201, description = "Refunded (a replay carries `Idempotent-Replayed: true`)", body = HoldRefunded),
        (status = 400, response = MalformedSpend),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "No such hold or ticket for this account", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "More than is refundable (`refund-exceeds-payment` with `refundable`), or a hold not captured (`hold-not-held`) — stored; replayed — or a request in progress, or the hold busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, response = TicketGone),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "Invalid amount, or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many spends for this account; nothing stored — resend with the same ticket after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, lock lost, or the instance overloaded — nothing stored; or `outcome-unknown`. Resend with the same ticket either way", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn refund_hold(
    State(state): State<AppState>,
    caller: Caller,
    HoldPath(hold): HoldPath,
    key: IdempotencyKey,
    headers: HeaderMap,
    JsonBody(request): JsonBody<RefundRequest>,
) -> Result<Response, ApiError> {
    let refunded = amount(request.amount)?;
    let hold = own_hold(&state, caller, hold).await?.id;
    let operation = Operation::Refund {
        refund: RefundId::random(),
        payment: Payment::Hold(hold),
        amount: refunded,
    };
    let path = format!("/v1/holds/{hold}/refunds");
    spend(&state, caller.0, key, operation, &path, &request, &headers).await
}

/// Refunds part or all of a paid order, back to its account; never more in all than it
/// paid — past that, 409 `refund-exceeds-payment` with what is still `refundable`; an
/// order not paid, 409 `order-not-paid` (both stored under the ticket).
#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/refunds",
    tag = "orders",
    params(
        ("order_id" = uuid::Uuid, Path, description = "The order"),
        ("Idempotency-Key" = String, Header, description = "A ticket id of the order's account (a UUID, bare or quoted)"),
    ),
    security(("api_key" = [])),
    request_body = RefundRequest,
    responses(
        (status = 201, description = "Refunded (a replay carries `Idempotent-Replayed: true`)", body = OrderRefunded),
        (status = 400, response = MalformedSpend),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "No such order or ticket for this account", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "More than is refundable (`refund-exceeds-payment` with `refundable`), or an order not paid (`order-not-paid`) — stored; replayed — or a request in progress, or the order busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, response = TicketGone),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "Invalid amount, or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many spends for this account; nothing stored — resend with the same ticket after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, lock lost, or the instance overloaded — nothing stored; or `outcome-unknown`. Resend with the same ticket either way", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn refund_order(
    State(state): State<AppState>,
    caller: Caller,
    OrderPath(order): OrderPath,
    key: IdempotencyKey,
    headers: HeaderMap,
    JsonBody(request): JsonBody<RefundRequest>,
) -> Result<Response, ApiError> {
    let refunded = amount(request.amount)?;
    let order = own_order(&state, caller, order).await?;
    let operation = Operation::Refund {
        refund: RefundId::random(),
        payment: Payment::Order(order),
        amount: refunded,
    };
    let path = format!("/v1/orders/{order}/refunds");
    spend(&state, caller.0, key, operation, &path, &request, &headers).await
}

/// The caller's hold; another account's is not found, exactly as an unknown one.
async fn own_hold(state: &AppState, caller: Caller, hold: HoldId) -> Result<Hold, ApiError> {
    state
        .ledger()
        .hold(hold)
        .await?
        .filter(|hold| hold.account_id == caller.0)
        .ok_or(ApiError::HoldNotFound)
}

/// The caller's order's id; another account's is not found, exactly as an unknown one.
async fn own_order(state: &AppState, caller: Caller, order: OrderId) -> Result<OrderId, ApiError> {
    state
        .ledger()
        .order(order)
        .await?
        .filter(|found| found.account_id == caller.0)
        .map(|found| found.id)
        .ok_or(ApiError::OrderNotFound)
}
