//! `POST /v1/accounts`, `GET /v1/accounts/{id}`, `GET /v1/accounts/{id}/entries`.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use ledger::{Account, Entry, NewAccount, StoredResponse};
use serde::Deserialize;
use serde_json::Value;

use crate::auth::Caller;
use crate::auth::{self, Bearer};
use crate::error::{ApiError, Problem};
use crate::extract::{AccountPath, ClientAddress, IdempotencyKey, JsonBody};
use crate::routes::responses::{
    BodyTooLarge, MalformedCreate, NotAnAccount, NotJson, OthersAccount, Unauthenticated,
};
use crate::routes::spends::{fingerprint, stored_response};
use crate::state::AppState;

pub use payonce_types::accounts::{
    AccountView, CreatedAccount, EntriesPage, EntryView, NewAccountRequest,
};

/// An account as the contract shows it.
fn account_view(account: Account) -> AccountView {
    AccountView {
        id: account.id.0,
        name: account.name,
        balance: account.balance,
        available: account.available,
        points: account.points,
        created_at: account.created_at,
    }
}

/// Opens an account; its opening balance and points are its first ledger entry. With an
/// operator key set on the instance, a balance or points above zero need it.
///
/// With an `Idempotency-Key` (a UUID of the client's choosing), the account is opened
/// once: the same key and body again, within `PAYONCE_RETENTION`, answer the first
/// answer — the same account, the same API key — with `Idempotent-Replayed: true`.
/// Keys are the client address's (as the rate limit sees it): the same UUID from another
/// address is another key. The API key is kept for that only sealed with the
/// idempotency key, never in clear: choose keys nobody can guess (random UUIDs).
#[utoipa::path(
    post,
    path = "/v1/accounts",
    tag = "accounts",
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: a UUID of your choosing (bare or quoted) that makes the create happen once — the same key and body again answer the first answer, API key included; keys are per client address, kept for PAYONCE_RETENTION"),
    ),
    request_body = NewAccountRequest,
    security((), ("operator_key" = [])),
    responses(
        (status = 201, description = "Opened (a replay of a create with an Idempotency-Key carries `Idempotent-Replayed: true`)", body = CreatedAccount, links(
            ("TakeTicket" = (operation_id = "issue_ticket", parameters(("id" = "$response.body#/id")), description = "Take a ticket for the new account (authenticated with its api_key)")),
            ("GetAccount" = (operation_id = "get_account", parameters(("id" = "$response.body#/id")), description = "Read the new account back (authenticated with its api_key)")),
        )),
        (status = 400, response = MalformedCreate),
        (status = 401, description = "A key that is not the operator key (only with PAYONCE_OPERATOR_KEY set, and a balance or points above zero)", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A balance or points above zero without the operator key (only with PAYONCE_OPERATOR_KEY set): `operator-key-required`", body = Problem, content_type = "application/problem+json"),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "Invalid name, balance or points, or a body that is not an object (`invalid-request`: nothing stored); or the Idempotency-Key was used with another body (`idempotency-key-reuse`)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many accounts opened from this address; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable, or the instance is overloaded", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_account(
    State(state): State<AppState>,
    ClientAddress(client): ClientAddress,
    key: Option<IdempotencyKey>,
    sent: Bearer,
    JsonBody(request): JsonBody<NewAccountRequest>,
) -> Result<Response, ApiError> {
    if let Err(limited) = state.limits().open_account(client) {
        state.metrics().rate_limited();
        return Err(limited);
    }
    if request.balance > 0 || request.points > 0 {
        auth::may_create_money(&state, client, &sent)?;
    }
    let new = NewAccount::new(request.name.as_str(), request.balance, request.points)
        .map_err(|invalid| ApiError::InvalidRequest(invalid.to_string()))?;
    let ledger = state.ledger();
    let (id, mut answer, api_key, replayed) = match key {
        None => {
            let (account, api_key) = ledger.create_account(&new).await?;
            let answer = StoredResponse {
                status: 201,
                body: opened_body(&account),
            };
            (account.id, answer, api_key, false)
        }
        Some(IdempotencyKey(key)) => {
            let fingerprint = fingerprint("/v1/accounts", &request);
            let (created, api_key) = ledger
                .create_account_once(&new, client, key.0, &fingerprint, &opened_body)
                .await?;
            (created.id, created.response, api_key, created.replayed)
        }
    };
    // The ledger keeps the answer without the key (see `create_account_once`).
    if let Value::Object(fields) = &mut answer.body {
        fields.insert("api_key".to_owned(), Value::String(api_key));
    }
    let mut response = stored_response(answer, replayed);
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/accounts/{id}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// A new account's answer as it is stored: [`CreatedAccount`] but its API key (and
/// without `available`, which the contract gives a read of the account: a new account has
/// no holds).
fn opened_body(account: &Account) -> Value {
    let mut body = serde_json::to_value(account_view(account.clone())).unwrap_or_default();
    if let Value::Object(fields) = &mut body {
        fields.remove("available");
    }
    body
}

/// Reads an account.
#[utoipa::path(
    get,
    path = "/v1/accounts/{id}",
    tag = "accounts",
    params(("id" = Uuid, Path, description = "The account")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The account", body = AccountView),
        (status = 401, response = Unauthenticated),
        (status = 403, response = OthersAccount),
        (status = 404, response = NotAnAccount),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_account(
    State(state): State<AppState>,
    caller: Caller,
    AccountPath(account): AccountPath,
) -> Result<Json<AccountView>, ApiError> {
    caller.must_be(account)?;
    let account = state
        .ledger()
        .account(account)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such account".into()))?;
    Ok(Json(account_view(account)))
}

/// Paging through entries.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EntriesQuery {
    /// Return entries with ids above this (the `next_after` of the previous page).
    pub after: Option<i64>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// An entry as the contract shows it.
fn entry_view(entry: Entry) -> EntryView {
    EntryView {
        id: entry.id,
        ticket_id: entry.ticket_id.map(|ticket| ticket.0),
        kind: entry.kind.as_str().to_owned(),
        order_id: entry.order_id.map(|order| order.0),
        payout_id: entry.payout_id.map(|payout| payout.0),
        amount: entry.amount,
        points: entry.points,
        balance_after: entry.balance_after,
        points_after: entry.points_after,
        created_at: entry.created_at,
    }
}

/// Lists an account's ledger entries, oldest first, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/accounts/{id}/entries",
    tag = "accounts",
    params(("id" = Uuid, Path, description = "The account"), EntriesQuery),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "A page of entries", body = EntriesPage),
        (status = 400, description = "Malformed paging parameters", body = Problem, content_type = "application/problem+json"),
        (status = 401, response = Unauthenticated),
        (status = 403, response = OthersAccount),
        (status = 404, response = NotAnAccount),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_entries(
    State(state): State<AppState>,
    caller: Caller,
    AccountPath(account): AccountPath,
    query: Result<Query<EntriesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EntriesPage>, ApiError> {
    caller.must_be(account)?;
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be 1 to 1000, got {limit}"
        )));
    }
    let entries = state.ledger().entries(account, query.after, limit).await?;
    let next_after = (entries.len() == limit as usize)
        .then(|| entries.last().map(|entry| entry.id))
        .flatten();
    Ok(Json(EntriesPage {
        entries: entries.into_iter().map(entry_view).collect(),
        next_after,
    }))
}
