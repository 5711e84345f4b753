//! `POST /v1/accounts/{id}/payouts`, `GET /v1/payouts/{payout_id}`, `GET /v1/payouts`,
//! `GET /v1/payouts/{payout_id}/bank`.
//!
//! A payout is a spend: sent with a ticket, under the account's lock, by the same
//! idempotency protocol (`spends.rs`). What it stores is 202 — the money left the account
//! and the payout is pending; the bank is called after the commit (`crate::payouts`), and
//! the payout's live status is read here — and what the bank holds for it, asked of the
//! bank.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use ledger::payouts::{Destination, Payout, PayoutId, PayoutStatus, bank_key};
use ledger::{Amount, Operation};
use serde::Deserialize;
use uuid::Uuid;

use crate::auth::{Caller, OwnAccount};
use crate::bank_fault;
use crate::error::{ApiError, Problem};
use crate::extract::{IdempotencyKey, JsonBody, PayoutPath};
use crate::render::{PayoutAccepted, payout_view};
use crate::routes::responses::{
    BodyTooLarge, NoSuchTicket, NotJson, OthersAccount, TicketGone, Unauthenticated,
};
use crate::routes::spends;
use crate::state::AppState;

pub use payonce_types::payouts::{
    BankTransfer, BankTransferState, PayoutAtBank, PayoutRequest, PayoutView, PayoutsPage,
};

/// Sends money out to an account at the bank: it leaves the balance at once, in the
/// ticket's transaction, and the bank is called after — with one idempotency key for
/// every attempt, so the bank moves it at most once. The answer (202, stored under the
/// ticket and replayed) says where to watch the payout: `Location`.
///
/// In the embedded mode, whose bank is a demonstration in the same process,
/// `Payonce-Bank-Fault` asks that bank to play a fault on the payout's first attempt
/// (`commit-then-drop`: it makes the transfer, then drops the answer; the retry, under
/// the same key, gets the stored answer). An instance paying out to `PAYONCE_BANK_URL`
/// refuses the header.
#[utoipa::path(
    post,
    path = "/v1/accounts/{id}/payouts",
    tag = "payouts",
    params(
        ("id" = Uuid, Path, description = "The account"),
        ("Idempotency-Key" = String, Header, description = "A ticket id of this account (a UUID, bare or quoted)"),
        ("Payonce-Bank-Fault" = Option<String>, Header, description = "The embedded mode only: a fault its demonstration bank plays on this payout's first attempt (the retries, under the same key, go without). Sent to an instance paying out to PAYONCE_BANK_URL: 422 `bank-fault-refused`. A replay (the same ticket) adds no fault: the payout it answers was sent already"),
    ),
    security(("api_key" = [])),
    request_body = PayoutRequest,
    responses(
        (status = 202, description = "Accepted: the money left the account and the payout is pending (a replay carries `Idempotent-Replayed: true`); `Location` is the payout", body = PayoutAccepted,
            headers(("Location" = String, description = "/v1/payouts/{payout_id}")),
            links(
                ("GetPayout" = (operation_id = "get_payout", parameters(("payout_id" = "$response.body#/payout_id")), description = "The payout, as it goes on")),
                ("GetPayoutAtBank" = (operation_id = "get_payout_at_bank", parameters(("payout_id" = "$response.body#/payout_id")), description = "What the bank holds for the payout")),
            )),
        (status = 400, description = "No or a malformed `Idempotency-Key`, a body that is not JSON, or a `Payonce-Bank-Fault` that names no fault (`bank-fault-unknown`) — nothing stored", body = Problem, content_type = "application/problem+json"),
        (status = 401, response = Unauthenticated),
        (status = 402, description = "Insufficient funds (stored; replayed); nothing was sent", body = Problem, content_type = "application/problem+json"),
        (status = 403, response = OthersAccount),
        (status = 404, response = NoSuchTicket),
        (status = 409, description = "Request in progress, or account busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, response = TicketGone),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "An amount outside 1..=10^12 or a malformed destination (`invalid-request`: nothing stored), `Payonce-Bank-Fault` sent to an instance whose bank is at PAYONCE_BANK_URL (`bank-fault-refused`: nothing stored), or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many spends for this account; nothing stored — resend with the same ticket after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, lock lost, or the instance overloaded — nothing stored; or `outcome-unknown` — the money may have left: resend with the same ticket either way. Or no bank on this instance (`payouts-unavailable`): its configuration, which a resend does not change — nothing stored, the ticket still usable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn send_payout(
    State(state): State<AppState>,
    OwnAccount(account): OwnAccount,
    key: IdempotencyKey,
    headers: HeaderMap,
    JsonBody(request): JsonBody<PayoutRequest>,
) -> Result<Response, ApiError> {
    let amount = Amount::new(request.amount)
        .map_err(|invalid| ApiError::InvalidRequest(invalid.to_string()))?;
    let destination = Destination::new(&request.destination)
        .map_err(|invalid| ApiError::InvalidRequest(invalid.to_string()))?;
    let fault = bank_fault::requested(&headers)?;
    let Some(payouts) = state.payouts() else {
        return Err(ApiError::PayoutsUnavailable);
    };
    let payout = PayoutId::random();
    // Remembered before the transaction: a worker may claim the payout as it commits.
    let remembered = match fault {
        None => None,
        Some(fault) => {
            let faults = payouts
                .first_attempt_faults()
                .ok_or(ApiError::BankFaultRefused)?;
            Some(faults.remember(payout, fault))
        }
    };
    let operation = Operation::Payout {
        payout,
        amount,
        destination,
    };
    let path = format!("/v1/accounts/{account}/payouts");
    let answer = spends::spend(&state, account, key, operation, &path, &request, &headers).await?;
    // The fault is kept only for the payout this request made, which the answer names. A
    // replay names the payout sent before, whose first attempt is its own business: this
    // request's fault, under an id nothing was made with, is forgotten as the guard drops.
    let made_here = format!("/v1/payouts/{payout}");
    let names_ours = answer
        .headers()
        .get(header::LOCATION)
        .is_some_and(|location| location.as_bytes() == made_here.as_bytes());
    if let Some(remembered) = remembered.filter(|_| names_ours) {
        remembered.keep();
    }
    Ok(answer)
}

/// Reads a payout: where it stands, the bank's word once it came, and the attempts.
#[utoipa::path(
    get,
    path = "/v1/payouts/{payout_id}",
    tag = "payouts",
    params(("payout_id" = Uuid, Path, description = "The payout")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The payout", body = PayoutView),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "No such payout, or another account's", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_payout(
    State(state): State<AppState>,
    caller: Caller,
    PayoutPath(payout): PayoutPath,
) -> Result<Json<PayoutView>, ApiError> {
    Ok(Json(payout_view(
        own_payout(&state, &caller, payout).await?,
    )))
}

/// The caller's payout; another account's is not found, as one that does not exist.
async fn own_payout(
    state: &AppState,
    caller: &Caller,
    payout: PayoutId,
) -> Result<Payout, ApiError> {
    state
        .ledger()
        .payout(payout)
        .await?
        .filter(|payout| payout.account_id == caller.0)
        .ok_or(ApiError::PayoutNotFound)
}

/// A transfer the bank showed, as the contract shows it.
fn bank_transfer(transfer: bank::TransferView) -> BankTransfer {
    BankTransfer {
        id: transfer.id,
        idempotency_key: transfer.idempotency_key,
        state: match transfer.state {
            bank::State::Executed => BankTransferState::Executed,
            bank::State::Declined => BankTransferState::Declined,
            bank::State::Closed => BankTransferState::Closed,
        },
        destination: transfer.destination,
        amount: transfer.amount,
        reference: transfer.reference,
        decline_reason: transfer.decline_reason,
        created_at: transfer.created_at,
    }
}

/// Asks the bank what it holds for a payout: its transfers with the payout's id as their
/// reference, under whichever key — how to see that money left once, under the one key,
/// however many attempts it took.
#[utoipa::path(
    get,
    path = "/v1/payouts/{payout_id}/bank",
    tag = "payouts",
    params(("payout_id" = Uuid, Path, description = "The payout")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The bank's transfers for the payout", body = PayoutAtBank),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "No such payout, or another account's", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The bank did not answer (`bank-unavailable`), the database is unavailable, or this instance has no bank (`payouts-unavailable`); nothing changed", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_payout_at_bank(
    State(state): State<AppState>,
    caller: Caller,
    PayoutPath(payout): PayoutPath,
) -> Result<Json<PayoutAtBank>, ApiError> {
    let payout = own_payout(&state, &caller, payout).await?;
    let payouts = state.payouts().ok_or(ApiError::PayoutsUnavailable)?;
    let transfers = payouts
        .transfers_at_bank(payout.id)
        .await
        .map_err(ApiError::BankUnavailable)?;
    let executed = transfers
        .iter()
        .filter(|transfer| transfer.state == bank::State::Executed)
        .count();
    Ok(Json(PayoutAtBank {
        payout_id: payout.id.0,
        bank_key: bank_key(payout.id),
        executed,
        transfers: transfers.into_iter().map(bank_transfer).collect(),
    }))
}

/// Listing payouts.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PayoutsQuery {
    /// Only payouts in this status: `pending`, `succeeded` or `failed`.
    #[param(pattern = "^(pending|succeeded|failed)$")]
    pub status: Option<String>,
    /// Payouts after this one (the `next_after` of the previous page).
    pub after: Option<Uuid>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// The caller's payouts, oldest first — `?status=pending` for those still waiting for the
/// bank's word. Oldest is first debited: pages follow the order in which the payouts
/// committed, so following `next_after` never passes over a payout that commits after a
/// page was read (one that commits late shows on a later page, not never).
#[utoipa::path(
    get,
    path = "/v1/payouts",
    tag = "payouts",
    params(PayoutsQuery),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "A page of payouts", body = PayoutsPage),
        (status = 400, description = "Malformed query parameters", body = Problem, content_type = "application/problem+json"),
        (status = 401, response = Unauthenticated),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_payouts(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<PayoutsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<PayoutsPage>, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let status = query
        .status
        .as_deref()
        .map(|name| {
            PayoutStatus::parse(name).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "status must be pending, succeeded or failed, got {name:?}"
                ))
            })
        })
        .transpose()?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be 1 to 1000, got {limit}"
        )));
    }
    let payouts = state
        .ledger()
        .payouts(caller.0, status, query.after.map(PayoutId), limit)
        .await?;
    let next_after = (payouts.len() == limit as usize)
        .then(|| payouts.last().map(|payout| payout.id.0))
        .flatten();
    Ok(Json(PayoutsPage {
        payouts: payouts.into_iter().map(payout_view).collect(),
        next_after,
    }))
}
