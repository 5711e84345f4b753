//! `POST /v1/accounts/{id}/orders`, `GET /v1/orders/{order_id}`,
//! `POST /v1/orders/{order_id}/payments`.
//!
//! A ticket stops a retry from paying twice; it cannot stop two different requests —
//! two tabs, two taps on "pay", two services — from paying one order. So a payment runs
//! the spends' protocol (`spends.rs`) under the **order's** lock, and the ledger checks
//! the order's fencing token and that it is still open in the transaction that pays it:
//! the first ticket pays, every other gets 409 `order-already-paid`, stored under it.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use ledger::{Amount, NewOrder, Operation, Order, OrderId, StoredResponse};
use serde_json::Value;

use crate::auth::Caller;
use crate::error::{ApiError, Problem};
use crate::extract::{AccountPath, IdempotencyKey, JsonBody, OrderPath};
use crate::render::OrderPaid;
use crate::routes::responses::{
    BodyTooLarge, MalformedCreate, MalformedSpend, NotAnAccount, NotJson, OthersAccount,
    TicketGone, Unauthenticated,
};
use crate::routes::spends;
use crate::state::AppState;

pub use payonce_types::orders::{OrderRequest, OrderState, OrderView, PaymentRequest};

/// An order as the contract shows it.
fn order_view(order: Order) -> OrderView {
    OrderView {
        order_id: order.id.0,
        account_id: order.account_id.0,
        amount: order.amount.get(),
        description: order.description,
        state: if order.paid_by_ticket.is_some() {
            OrderState::Paid
        } else {
            OrderState::Open
        },
        paid_by_ticket: order.paid_by_ticket.map(|ticket| ticket.0),
        paid_at: order.paid_at,
        created_at: order.created_at,
    }
}

/// Places an order for the account to pay once.
///
/// With an `Idempotency-Key` (a UUID of the client's choosing), the order is placed once:
/// the same key and body again, within `PAYONCE_RETENTION`, answer the first answer (as it
/// was then: `open`) with `Idempotent-Replayed: true`. Keys are the account's: another
/// account's same UUID is another key.
#[utoipa::path(
    post,
    path = "/v1/accounts/{id}/orders",
    tag = "orders",
    params(
        ("id" = Uuid, Path, description = "The account"),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: a UUID of your choosing (bare or quoted) that makes the create happen once — the same key and body again answer the first answer; keys are per account, kept for PAYONCE_RETENTION"),
    ),
    security(("api_key" = [])),
    request_body = OrderRequest,
    responses(
        (status = 201, description = "Placed (a replay of a create with an Idempotency-Key carries `Idempotent-Replayed: true`)", body = OrderView, links(
            ("PayOrder" = (operation_id = "pay_order", parameters(("order_id" = "$response.body#/order_id")), description = "Pay the order (with a ticket as Idempotency-Key)")),
            ("GetOrder" = (operation_id = "get_order", parameters(("order_id" = "$response.body#/order_id")), description = "Read the order back")),
        )),
        (status = 400, response = MalformedCreate),
        (status = 401, response = Unauthenticated),
        (status = 403, response = OthersAccount),
        (status = 404, response = NotAnAccount),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "An amount outside 1..=10^12, a description over 200 characters, or a body that is not an object (`invalid-request`: nothing stored); or the Idempotency-Key was used with another body (`idempotency-key-reuse`)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many orders for this account; nothing stored — retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable, or the instance is overloaded", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_order(
    State(state): State<AppState>,
    caller: Caller,
    AccountPath(account): AccountPath,
    key: Option<IdempotencyKey>,
    JsonBody(request): JsonBody<OrderRequest>,
) -> Result<Response, ApiError> {
    caller.must_be(account)?;
    if let Err(limited) = state.limits().place_order(account) {
        state.metrics().rate_limited();
        return Err(limited);
    }
    let amount = Amount::new(request.amount)
        .map_err(|invalid| ApiError::InvalidRequest(invalid.to_string()))?;
    let new = NewOrder::new(amount, request.description.as_str())
        .map_err(|invalid| ApiError::InvalidRequest(invalid.to_string()))?;
    let ledger = state.ledger();
    let (id, answer, replayed) = match key {
        None => {
            let order = ledger.create_order(account, &new).await?;
            let answer = StoredResponse {
                status: 201,
                body: placed_body(&order),
            };
            (order.id, answer, false)
        }
        Some(IdempotencyKey(key)) => {
            let path = format!("/v1/accounts/{account}/orders");
            let fingerprint = spends::fingerprint(&path, &request);
            let created = ledger
                .create_order_once(account, &new, key.0, &fingerprint, &placed_body)
                .await?;
            (created.id, created.response, created.replayed)
        }
    };
    let mut response = spends::stored_response(answer, replayed);
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/orders/{id}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// A new order's answer, as stored.
fn placed_body(order: &Order) -> Value {
    serde_json::to_value(order_view(order.clone())).unwrap_or_default()
}

/// Reads an order: open, or paid and by which ticket.
#[utoipa::path(
    get,
    path = "/v1/orders/{order_id}",
    tag = "orders",
    params(("order_id" = Uuid, Path, description = "The order")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The order", body = OrderView),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "No such order, or another account's", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_order(
    State(state): State<AppState>,
    caller: Caller,
    OrderPath(order): OrderPath,
) -> Result<Json<OrderView>, ApiError> {
    Ok(Json(order_view(own_order(&state, caller, order).await?)))
}

/// Pays the order, once: its amount out of its account. Sent with a ticket of that
/// account; the first ticket to pay it pays it, every other is refused with 409
/// `order-already-paid` (stored under that ticket). The same ticket again replays.
#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/payments",
    tag = "orders",
    params(
        ("order_id" = Uuid, Path, description = "The order"),
        ("Idempotency-Key" = String, Header, description = "A ticket id of the order's account (a UUID, bare or quoted)"),
    ),
    security(("api_key" = [])),
    request_body(content = PaymentRequest, description = "Empty, or `{}`"),
    responses(
        (status = 201, description = "Paid (a replay carries `Idempotent-Replayed: true`)", body = OrderPaid),
        (status = 400, response = MalformedSpend),
        (status = 401, response = Unauthenticated),
        (status = 402, description = "Insufficient funds (stored; replayed); the order stays open", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order or ticket for this account", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The order was paid already by another ticket (`order-already-paid`, stored; replayed), or a request in progress, or the order busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, response = TicketGone),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "A body other than `{}`, or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many spends for this account; nothing stored — resend with the same ticket after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, lock lost, or the instance overloaded — nothing stored; or `outcome-unknown` — the money may have moved. Resend with the same ticket either way", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn pay_order(
    State(state): State<AppState>,
    caller: Caller,
    OrderPath(order): OrderPath,
    key: IdempotencyKey,
    headers: HeaderMap,
    JsonBody(request): JsonBody<PaymentRequest>,
) -> Result<Response, ApiError> {
    let order = own_order(&state, caller, order).await?;
    let operation = Operation::OrderPayment {
        order: order.id,
        amount: order.amount,
    };
    let path = format!("/v1/orders/{}/payments", order.id);
    spends::spend(
        &state,
        order.account_id,
        key,
        operation,
        &path,
        &request,
        &headers,
    )
    .await
}

/// The caller's order; another account's is not found, exactly as an unknown one.
async fn own_order(state: &AppState, caller: Caller, order: OrderId) -> Result<Order, ApiError> {
    state
        .ledger()
        .order(order)
        .await?
        .filter(|order| order.account_id == caller.0)
        .ok_or(ApiError::OrderNotFound)
}
