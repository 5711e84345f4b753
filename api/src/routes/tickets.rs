//! `POST /v1/accounts/{id}/tickets`, `GET /v1/tickets/{ticket_id}`.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::auth::Caller;
use crate::error::{ApiError, Problem};
use crate::extract::{AccountPath, TicketPath};
use crate::routes::responses::{NotAnAccount, OthersAccount, Unauthenticated};
use crate::state::AppState;

pub use payonce_types::tickets::{StoredResponseView, TicketIssued, TicketState, TicketView};

/// Issues a ticket to the account.
#[utoipa::path(
    post,
    path = "/v1/accounts/{id}/tickets",
    tag = "tickets",
    params(("id" = Uuid, Path, description = "The account")),
    security(("api_key" = [])),
    responses(
        (status = 201, description = "Issued", body = TicketIssued, links(
            ("Withdraw" = (operation_id = "withdraw", parameters(("id" = "$request.path.id"), ("header.Idempotency-Key" = "$response.body#/ticket_id")), description = "Spend the ticket on a withdrawal")),
            ("Deposit" = (operation_id = "deposit", parameters(("id" = "$request.path.id"), ("header.Idempotency-Key" = "$response.body#/ticket_id")), description = "Spend the ticket on a deposit")),
            ("Draw" = (operation_id = "draw", parameters(("id" = "$request.path.id"), ("header.Idempotency-Key" = "$response.body#/ticket_id")), description = "Spend the ticket on a lottery draw")),
            ("PayOut" = (operation_id = "send_payout", parameters(("id" = "$request.path.id"), ("header.Idempotency-Key" = "$response.body#/ticket_id")), description = "Spend the ticket on a payout to the bank")),
            ("GetTicket" = (operation_id = "get_ticket", parameters(("ticket_id" = "$response.body#/ticket_id")), description = "Read the ticket back")),
        )),
        (status = 401, response = Unauthenticated),
        (status = 403, response = OthersAccount),
        (status = 404, response = NotAnAccount),
        (status = 429, description = "Too many tickets for this account; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable, or the instance is overloaded", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn issue_ticket(
    State(state): State<AppState>,
    caller: Caller,
    AccountPath(account): AccountPath,
) -> Result<Response, ApiError> {
    caller.must_be(account)?;
    if let Err(limited) = state.limits().take_ticket(account) {
        state.metrics().rate_limited();
        return Err(limited);
    }
    let ticket = state
        .ledger()
        .issue_ticket(account, state.settings().ticket_ttl)
        .await?;
    let location = format!("/v1/tickets/{}", ticket.id);
    let body = TicketIssued {
        ticket_id: ticket.id.0,
        account_id: ticket.account_id.0,
        expires_at: ticket.expires_at,
    };
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(body),
    )
        .into_response())
}

/// Reads a ticket: whether it is still usable, and what it answered if it was used.
#[utoipa::path(
    get,
    path = "/v1/tickets/{ticket_id}",
    tag = "tickets",
    params(("ticket_id" = Uuid, Path, description = "The ticket")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The ticket", body = TicketView),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "No such ticket, or another account's", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_ticket(
    State(state): State<AppState>,
    caller: Caller,
    TicketPath(ticket): TicketPath,
) -> Result<Json<TicketView>, ApiError> {
    // Another account's ticket is not found, exactly as a spend with it is: a key learns
    // nothing about tickets that are not its account's.
    let ticket = state
        .ledger()
        .ticket(ticket)
        .await?
        .filter(|ticket| ticket.account_id == caller.0)
        .ok_or(ApiError::TicketNotFound)?;
    let ticket_state = match ticket.state() {
        ledger::TicketState::Issued => TicketState::Issued,
        ledger::TicketState::Completed => TicketState::Completed,
        ledger::TicketState::Expired => TicketState::Expired,
    };
    let response = ticket
        .outcome
        .and_then(|outcome| outcome.response)
        .map(|response| StoredResponseView {
            status: response.status,
            body: response.body,
        });
    Ok(Json(TicketView {
        ticket_id: ticket.id.0,
        account_id: ticket.account_id.0,
        state: ticket_state,
        response,
        created_at: ticket.created_at,
        expires_at: ticket.expires_at,
    }))
}
