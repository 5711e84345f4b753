//! The spends — withdrawals, deposits, lottery draws — and the idempotency protocol they
//! share:
//!
//! 1. authenticate, read the `Idempotency-Key`, validate the body (errors here store
//!    nothing: the ticket stays usable);
//! 2. look the ticket up: a used one replays its stored outcome (or 422 for a different
//!    request) without taking any lock; an unknown one is 404, an expired one 410;
//! 3. take the account's lock, leaving the ticket id as the lock's note, waiting at most
//!    `PAYONCE_LOCK_WAIT`: a duplicate of a request still executing queues behind it and
//!    then replays; past the wait, 409 `request-in-progress` if the lock holder is
//!    executing this very ticket, else 409 `account-busy`;
//! 4. apply in the ledger with the lock's fencing token; the ledger stores the outcome
//!    under the ticket in the same transaction as the money moves;
//! 5. release the lock and answer. A stale fencing token stores nothing; the lock's token
//!    counter is raised to what the ledger has seen (before the release, so the next
//!    holder's token is accepted). If we still held the lock, the counter had merely
//!    been lost (a lock store that restarted empty) and the spend runs once more with a
//!    fresh grant; if not, a newer holder wrote while we were paused: 503 `lock-lost`.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ledger::{
    AccountId, Amount, ApplyError, ApplyRequest, Judgement, Operation, PointsToSpend,
    StoredResponse, TicketId,
};
use lock::{FencingToken, LockError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::config::Strategy;
use crate::demo::{self, Faults};
use crate::error::{ApiError, PROBLEM_JSON, Problem};
use crate::extract::{IdempotencyKey, JsonBody, OwnAccount};
use crate::render::{Drawn, MoneyMoved, render};
use crate::state::AppState;

/// A withdrawal or a deposit.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoneyRequest {
    /// Minor units, 1 to 10^12.
    #[schema(minimum = 1, maximum = 1_000_000_000_000_i64, example = 250)]
    pub amount: i64,
}

fn one() -> i64 {
    1
}

/// A lottery draw.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DrawRequest {
    /// Points to spend, 1 to 10^12.
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 1_000_000_000_000_i64, default = 1)]
    pub points: i64,
}

/// Takes money out of the account.
#[utoipa::path(
    post,
    path = "/v1/accounts/{id}/withdrawals",
    tag = "spends",
    params(
        ("id" = uuid::Uuid, Path, description = "The account"),
        ("Idempotency-Key" = String, Header, description = "A ticket id of this account (a UUID, bare or quoted)"),
        ("Payonce-Strategy" = Option<String>, Header, description = "Demonstration mode (PAYONCE_DEMO) only: fenced, none, setnx-expire, getset, redis or redlock"),
        ("Payonce-Fault" = Option<String>, Header, description = "Demonstration mode (PAYONCE_DEMO) only: pause=<duration>, slow=<duration>, clock-offset=[-]<duration>, comma-separated"),
    ),
    security(("api_key" = [])),
    request_body = MoneyRequest,
    responses(
        (status = 201, description = "Withdrawn (a replay carries `Idempotent-Replayed: true`)", body = MoneyMoved),
        (status = 400, description = "No or malformed Idempotency-Key, or malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown key", body = Problem, content_type = "application/problem+json"),
        (status = 402, description = "Insufficient funds (stored; replayed)", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key is another account's", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such ticket for this account", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Request in progress, or account busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "Ticket expired unused, or outcome past retention", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 16 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid amount, or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, or lock lost; nothing stored", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn withdraw(
    State(state): State<AppState>,
    OwnAccount(account): OwnAccount,
    key: IdempotencyKey,
    headers: HeaderMap,
    JsonBody(request): JsonBody<MoneyRequest>,
) -> Result<Response, ApiError> {
    let operation = Operation::Withdrawal(amount(request.amount)?);
    let path = format!("/v1/accounts/{account}/withdrawals");
    spend(&state, account, key, operation, &path, &request, &headers).await
}

/// Puts money into the account.
#[utoipa::path(
    post,
    path = "/v1/accounts/{id}/deposits",
    tag = "spends",
    params(
        ("id" = uuid::Uuid, Path, description = "The account"),
        ("Idempotency-Key" = String, Header, description = "A ticket id of this account (a UUID, bare or quoted)"),
        ("Payonce-Strategy" = Option<String>, Header, description = "Demonstration mode (PAYONCE_DEMO) only: fenced, none, setnx-expire, getset, redis or redlock"),
        ("Payonce-Fault" = Option<String>, Header, description = "Demonstration mode (PAYONCE_DEMO) only: pause=<duration>, slow=<duration>, clock-offset=[-]<duration>, comma-separated"),
    ),
    security(("api_key" = [])),
    request_body = MoneyRequest,
    responses(
        (status = 201, description = "Deposited (a replay carries `Idempotent-Replayed: true`)", body = MoneyMoved),
        (status = 400, description = "No or malformed Idempotency-Key, or malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key is another account's", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such ticket for this account", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Request in progress, or account busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "Ticket expired unused, or outcome past retention", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 16 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid amount, a balance that would overflow (stored), or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, or lock lost; nothing stored", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn deposit(
    State(state): State<AppState>,
    OwnAccount(account): OwnAccount,
    key: IdempotencyKey,
    headers: HeaderMap,
    JsonBody(request): JsonBody<MoneyRequest>,
) -> Result<Response, ApiError> {
    let operation = Operation::Deposit(amount(request.amount)?);
    let path = format!("/v1/accounts/{account}/deposits");
    spend(&state, account, key, operation, &path, &request, &headers).await
}

/// Spends points on a draw from the prize table; the prize may credit money. A replay
/// shows the same prize.
#[utoipa::path(
    post,
    path = "/v1/accounts/{id}/lottery-draws",
    tag = "spends",
    params(
        ("id" = uuid::Uuid, Path, description = "The account"),
        ("Idempotency-Key" = String, Header, description = "A ticket id of this account (a UUID, bare or quoted)"),
        ("Payonce-Strategy" = Option<String>, Header, description = "Demonstration mode (PAYONCE_DEMO) only: fenced, none, setnx-expire, getset, redis or redlock"),
        ("Payonce-Fault" = Option<String>, Header, description = "Demonstration mode (PAYONCE_DEMO) only: pause=<duration>, slow=<duration>, clock-offset=[-]<duration>, comma-separated"),
    ),
    security(("api_key" = [])),
    request_body(content = DrawRequest, description = "May be empty: one point"),
    responses(
        (status = 201, description = "Drawn (a replay carries `Idempotent-Replayed: true`)", body = Drawn),
        (status = 400, description = "No or malformed Idempotency-Key, or malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown key", body = Problem, content_type = "application/problem+json"),
        (status = 402, description = "Insufficient points (stored; replayed)", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key is another account's", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such ticket for this account", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Request in progress, or account busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "Ticket expired unused, or outcome past retention", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 16 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid points, a balance that would overflow (stored), or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, or lock lost; nothing stored", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn draw(
    State(state): State<AppState>,
    OwnAccount(account): OwnAccount,
    key: IdempotencyKey,
    headers: HeaderMap,
    JsonBody(request): JsonBody<DrawRequest>,
) -> Result<Response, ApiError> {
    let points = PointsToSpend::new(request.points)
        .map_err(|invalid| ApiError::InvalidRequest(invalid.to_string()))?;
    let path = format!("/v1/accounts/{account}/lottery-draws");
    spend(
        &state,
        account,
        key,
        Operation::LotteryDraw(points),
        &path,
        &request,
        &headers,
    )
    .await
}

fn amount(value: i64) -> Result<Amount, ApiError> {
    Amount::new(value).map_err(|invalid| ApiError::InvalidRequest(invalid.to_string()))
}

/// Identifies a request: method, path and canonical body (the validated request,
/// serialised with its defaults filled in, so `{}` and `{"points":1}` are the same draw).
fn fingerprint(path: &str, request: &impl Serialize) -> String {
    let body = serde_json::to_string(request).unwrap_or_default();
    hex::encode(Sha256::digest(format!("POST {path}\n{body}")))
}

/// The idempotency protocol (see the module docs).
async fn spend(
    state: &AppState,
    account: AccountId,
    key: IdempotencyKey,
    operation: Operation,
    path: &str,
    request: &impl Serialize,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let ticket_id = key.0;
    let fingerprint = fingerprint(path, request);
    let settings = state.settings();
    let strategy = demo::strategy(state, headers)?;
    let faults = Faults::requested(settings.demo, headers)?;

    if let Some(replay) = replay_without_lock(state, ticket_id, account, &fingerprint).await? {
        return Ok(replay);
    }
    if strategy != Strategy::Fenced {
        let written = demo::spend_unguarded(
            state,
            strategy,
            account,
            ticket_id,
            operation,
            &fingerprint,
            faults,
        )
        .await?;
        return match written {
            Some(applied) => {
                state.metrics().executed();
                Ok(stored_response(applied.response, false))
            }
            // Another request completed the ticket first: answer with its outcome.
            None => replay_without_lock(state, ticket_id, account, &fingerprint)
                .await?
                .ok_or(ApiError::RequestInProgress),
        };
    }

    let lock_key = format!("lock:account:{account}");
    let note = ticket_id.to_string();
    // A second round only when the ledger refused our token although we still held the
    // lock: the lock store handed out a token below one the ledger accepted earlier (its
    // counters were lost — a Redis restart without persistence, or the embedded mode's
    // in-process locks after a restart). Nothing was written; the counter is raised above
    // the ledger's before we release, so the next grant is accepted.
    let mut faults = faults;
    let mut retried = false;
    loop {
        let asked = Instant::now();
        let acquired = state
            .locks()
            .acquire_noted(
                &lock_key,
                settings.lock_ttl,
                asked + settings.lock_wait,
                &note,
            )
            .await;
        state.metrics().waited_for_lock(asked.elapsed());
        let mut guard = match acquired {
            Ok(guard) => guard,
            Err(LockError::TimedOut { .. }) => {
                state.metrics().lock_timed_out();
                return gave_up_waiting(state, &lock_key, ticket_id, account, &fingerprint).await;
            }
            Err(error) => return Err(error.into()),
        };

        if let Some(pause) = faults.pause.take() {
            // What a stop-the-world pause does: nothing runs, renewal included.
            tracing::warn!(%ticket_id, ?pause, "fault injection: pausing inside the critical section");
            guard.stop_renewal().await;
            tokio::time::sleep(pause).await;
        }
        if let Some(slow) = faults.slow {
            // A slow call-out: the watchdog keeps renewing meanwhile.
            tokio::time::sleep(slow).await;
        }
        if guard.is_lost() {
            state.metrics().lock_lost();
            let _ = guard.release().await;
            return Err(ApiError::LockLost);
        }

        let applied = state
            .ledger()
            .apply(
                ApplyRequest {
                    ticket_id,
                    account_id: account,
                    operation,
                    fingerprint: &fingerprint,
                    fencing_token: guard.fencing_token().get(),
                },
                &render,
            )
            .await;
        if let Err(ApplyError::StaleToken {
            presented,
            recorded,
        }) = &applied
        {
            state.metrics().stale_token();
            tracing::warn!(%ticket_id, presented, recorded, "ledger refused a stale fencing token");
            // Before releasing: the waiter we hand the lock to gets its token from the
            // raised counter.
            if let Err(error) = state
                .locks()
                .raise_fencing(&lock_key, FencingToken::new(*recorded))
                .await
            {
                tracing::warn!(%error, "could not raise the fencing counter");
            }
        }
        let still_held = match guard.release().await {
            Ok(held) => held,
            Err(error) => {
                tracing::warn!(%error, key = lock_key, "release failed; the lease will expire");
                false
            }
        };

        return match applied {
            Ok(applied) => {
                if applied.replayed {
                    state.metrics().replayed();
                } else {
                    state.metrics().executed();
                }
                Ok(stored_response(applied.response, applied.replayed))
            }
            Err(ApplyError::StaleToken { .. }) if still_held && !retried => {
                // We held the lock all along, so no newer holder wrote: the token was low,
                // not late. Try once more with a fresh grant.
                retried = true;
                continue;
            }
            Err(ApplyError::StaleToken { .. }) => {
                // A paused holder woke up after its lease ran out and a newer holder wrote.
                state.metrics().lock_lost();
                Err(ApiError::LockLost)
            }
            Err(error) => Err(error.into()),
        };
    }
}

/// Step 2: a used ticket answers from its stored outcome, no lock needed. `None` means the
/// ticket is usable and the request must execute.
async fn replay_without_lock(
    state: &AppState,
    ticket_id: TicketId,
    account: AccountId,
    fingerprint: &str,
) -> Result<Option<Response>, ApiError> {
    let ticket = state
        .ledger()
        .ticket(ticket_id)
        .await?
        .filter(|ticket| ticket.account_id == account)
        .ok_or(ApiError::TicketNotFound)?;
    // The ledger judges the same way again inside its transaction, with the ticket
    // locked; judged here, a used ticket is answered without any lock.
    match ticket.judge(fingerprint) {
        Judgement::Usable => Ok(None),
        Judgement::Replay(response) => {
            state.metrics().replayed();
            Ok(Some(stored_response(response.clone(), true)))
        }
        Judgement::Reused => Err(ApiError::IdempotencyKeyReuse),
        Judgement::Pruned => Err(ApiError::OutcomePruned),
        Judgement::Expired => Err(ApiError::TicketExpired),
    }
}

/// Past the lock wait: the original of this very request finished meanwhile (replay —
/// looked at first, since duplicates queue behind each other and the one holding the lock
/// may be a duplicate too), or it is still running (409 request-in-progress), or the
/// account is busy with others (409 account-busy).
async fn gave_up_waiting(
    state: &AppState,
    lock_key: &str,
    ticket_id: TicketId,
    account: AccountId,
    fingerprint: &str,
) -> Result<Response, ApiError> {
    if let Some(replay) = replay_without_lock(state, ticket_id, account, fingerprint).await? {
        return Ok(replay);
    }
    let holder = state.locks().holder_note(lock_key).await.ok().flatten();
    if holder.as_deref() == Some(ticket_id.to_string().as_str()) {
        Err(ApiError::RequestInProgress)
    } else {
        Err(ApiError::AccountBusy)
    }
}

/// A stored response as sent: its status and body, JSON for successes and problem+json
/// for refusals, and `Idempotent-Replayed: true` on repeats only.
fn stored_response(response: StoredResponse, replayed: bool) -> Response {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = if status.is_success() {
        "application/json"
    } else {
        PROBLEM_JSON
    };
    let mut answer = (
        status,
        [(header::CONTENT_TYPE, content_type)],
        Json(response.body),
    )
        .into_response();
    if replayed {
        answer
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    answer
}
