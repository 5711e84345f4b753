//! The spends — withdrawals, deposits, lottery draws — and the idempotency protocol they
//! share:
//!
//! 1. authenticate, apply the account's spend rate limit, read the `Idempotency-Key`,
//!    validate the body (errors here store nothing: the ticket stays usable);
//! 2. wait — at most `PAYONCE_LOCK_WAIT` in all — first for a duplicate of this request
//!    already executing in this instance (then replay its outcome), then for the
//!    account's lock, leaving the ticket id as the lock's note. A free lock is taken at
//!    once and the ticket is judged by the ledger under it (step 3). A held one is not
//!    waited for before the ticket is looked up: a used ticket replays its stored outcome
//!    (or 422 for a different request) without any lock, an unknown one is 404, an
//!    expired one 410. A duplicate running in another instance is queued behind too and
//!    then replays. Past the wait, 409 `request-in-progress` if the holder is executing
//!    this very ticket, else 409 `account-busy`; past the cap on an account's waiters,
//!    409 `account-busy` at once;
//! 3. apply in the ledger with the lock's fencing token: the ledger judges the ticket
//!    (replay, 422, 404, 410 as above) and stores the outcome under it in the same
//!    transaction as the money moves;
//! 4. release the lock and answer (a replay, which wrote nothing, answers first and lets
//!    the lock go behind it). A stale fencing token stores nothing; the lock's token
//!    counter is raised to what the ledger has seen (before the release, so the next
//!    holder's token is accepted). If we still held the lock, the counter had merely
//!    been behind (a lock store that lost its counters) and the spend runs once more with
//!    a fresh grant; if not, a newer holder wrote while we were paused: 503 `lock-lost`.
//!
//! The demonstration's unsafe strategies look the ticket up first and then run their own
//! read-check-write.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ledger::holds::Payment;
use ledger::{
    AccountId, Amount, ApplyError, ApplyRequest, Judgement, Operation, OutcomeKind, PointsToSpend,
    StoredResponse, TicketId,
};
use lock::{FencingToken, LockError, LockGuard};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::auth::DepositAccount;
use crate::auth::OwnAccount;
#[cfg(feature = "demo")]
use crate::demo::{self, Faults};
use crate::error::{ApiError, PROBLEM_JSON, Problem};
use crate::extract::{IdempotencyKey, JsonBody};
use crate::render::{Drawn, MoneyMoved, render};
use crate::routes::responses::{
    BodyTooLarge, MalformedSpend, NoSuchTicket, NotJson, OthersAccount, TicketGone, Unauthenticated,
};
use crate::state::AppState;

pub use payonce_types::spends::{DrawRequest, MoneyRequest};

/// Takes money out of the account.
#[utoipa::path(
    post,
    path = "/v1/accounts/{id}/withdrawals",
    tag = "spends",
    params(
        ("id" = uuid::Uuid, Path, description = "The account"),
        ("Idempotency-Key" = String, Header, description = "A ticket id of this account (a UUID, bare or quoted)"),
    ),
    security(("api_key" = [])),
    request_body = MoneyRequest,
    responses(
        (status = 201, description = "Withdrawn (a replay carries `Idempotent-Replayed: true`)", body = MoneyMoved, links(("GetTicket" = (operation_id = "get_ticket", parameters(("ticket_id" = "$response.body#/ticket_id")), description = "What the ticket remembers: this answer")))),
        (status = 400, response = MalformedSpend),
        (status = 401, response = Unauthenticated),
        (status = 402, description = "Insufficient funds (stored; replayed)", body = Problem, content_type = "application/problem+json"),
        (status = 403, response = OthersAccount),
        (status = 404, response = NoSuchTicket),
        (status = 409, description = "Request in progress, or account busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, response = TicketGone),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "Invalid amount, or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many spends for this account; nothing stored — resend with the same ticket after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, lock lost, or the instance overloaded — nothing stored; or `outcome-unknown` — the money may have moved. Resend with the same ticket either way", body = Problem, content_type = "application/problem+json"),
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

/// Puts money into the account: sent with the account's key — or, when the instance has
/// an operator key (PAYONCE_OPERATOR_KEY), with that key alone.
#[utoipa::path(
    post,
    path = "/v1/accounts/{id}/deposits",
    tag = "spends",
    params(
        ("id" = uuid::Uuid, Path, description = "The account"),
        ("Idempotency-Key" = String, Header, description = "A ticket id of this account (a UUID, bare or quoted)"),
    ),
    security(("api_key" = []), ("operator_key" = [])),
    request_body = MoneyRequest,
    responses(
        (status = 201, description = "Deposited (a replay carries `Idempotent-Replayed: true`)", body = MoneyMoved, links(("GetTicket" = (operation_id = "get_ticket", parameters(("ticket_id" = "$response.body#/ticket_id")), description = "What the ticket remembers: this answer")))),
        (status = 400, response = MalformedSpend),
        (status = 401, response = Unauthenticated),
        (status = 403, description = "The key is another account's; or, with PAYONCE_OPERATOR_KEY set, any account's key (`operator-key-required`: nothing stored, the ticket stays usable)", body = Problem, content_type = "application/problem+json"),
        (status = 404, response = NoSuchTicket),
        (status = 409, description = "Request in progress, or account busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, response = TicketGone),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "Invalid amount, a balance that would overflow (stored), or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many spends for this account; nothing stored — resend with the same ticket after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, lock lost, or the instance overloaded — nothing stored; or `outcome-unknown` — the money may have moved. Resend with the same ticket either way", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn deposit(
    State(state): State<AppState>,
    DepositAccount(account): DepositAccount,
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
    ),
    security(("api_key" = [])),
    request_body(content = DrawRequest, description = "May be empty: one point"),
    responses(
        (status = 201, description = "Drawn (a replay carries `Idempotent-Replayed: true`)", body = Drawn, links(("GetTicket" = (operation_id = "get_ticket", parameters(("ticket_id" = "$response.body#/ticket_id")), description = "What the ticket remembers: this answer")))),
        (status = 400, response = MalformedSpend),
        (status = 401, response = Unauthenticated),
        (status = 402, description = "Insufficient points (stored; replayed)", body = Problem, content_type = "application/problem+json"),
        (status = 403, response = OthersAccount),
        (status = 404, response = NoSuchTicket),
        (status = 409, description = "Request in progress, or account busy", body = Problem, content_type = "application/problem+json"),
        (status = 410, response = TicketGone),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "Invalid points, a balance that would overflow (stored), or the ticket was used for a different request", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many spends for this account; nothing stored — resend with the same ticket after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database or lock store unavailable, lock lost, or the instance overloaded — nothing stored; or `outcome-unknown` — the points may have been spent. Resend with the same ticket either way", body = Problem, content_type = "application/problem+json"),
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

pub(crate) fn amount(value: i64) -> Result<Amount, ApiError> {
    Amount::new(value).map_err(|invalid| ApiError::InvalidRequest(invalid.to_string()))
}

/// Identifies a request: method, path and canonical body (the validated request,
/// serialised with its defaults filled in, so `{}` and `{"points":1}` are the same draw).
/// Creates sent with an `Idempotency-Key` are identified the same way.
pub(crate) fn fingerprint(path: &str, request: &impl Serialize) -> String {
    let body = serde_json::to_string(request).unwrap_or_default();
    hex::encode(Sha256::digest(format!("POST {path}\n{body}")))
}

/// One spend, as the protocol (see the module docs) handles it.
struct Spend<'a> {
    state: &'a AppState,
    account: AccountId,
    ticket_id: TicketId,
    operation: Operation,
    fingerprint: String,
    /// The lock it runs under: its order's for an order payment or refund (an order is
    /// paid once, whatever account lock or ticket a payment comes with), its hold's for a
    /// capture, a void or a hold's refund, else its account's.
    lock_key: String,
    /// The faults the request asks for (the demonstration, under `PAYONCE_DEMO`).
    #[cfg(feature = "demo")]
    faults: Faults,
}

/// The idempotency protocol (see the module docs).
pub(crate) async fn spend(
    state: &AppState,
    account: AccountId,
    key: IdempotencyKey,
    operation: Operation,
    path: &str,
    request: &impl Serialize,
    // Only the demonstration reads a spend's headers.
    #[cfg_attr(not(feature = "demo"), expect(unused_variables))] headers: &HeaderMap,
) -> Result<Response, ApiError> {
    if let Err(limited) = state.limits().spend(account) {
        state.metrics().rate_limited();
        return Err(limited);
    }
    let lock_key = match operation {
        Operation::OrderPayment { order, .. }
        | Operation::Refund {
            payment: Payment::Order(order),
            ..
        } => format!("lock:order:{order}"),
        Operation::Capture { hold, .. }
        | Operation::Void { hold }
        | Operation::Refund {
            payment: Payment::Hold(hold),
            ..
        } => format!("lock:hold:{hold}"),
        _ => format!("lock:account:{account}"),
    };
    let settings = state.settings();
    // The request's span carries the ticket and the account (ids, never a secret).
    let span = tracing::Span::current();
    span.record("ticket_id", key.0.to_string().as_str());
    span.record("account_id", account.to_string().as_str());
    let spend = Spend {
        state,
        account,
        ticket_id: key.0,
        operation,
        fingerprint: fingerprint(path, request),
        lock_key,
        #[cfg(feature = "demo")]
        faults: Faults::requested(settings.demo, headers)?,
    };
    #[cfg(feature = "demo")]
    if let Some(strategy) =
        demo::unsafe_strategy(settings.strategy, settings.demo, operation, headers)?
    {
        return spend.unguarded(strategy).await;
    }
    // Everything from here waits at most the lock wait: for a duplicate running in this
    // instance, then for the account's lock.
    let deadline = Instant::now() + settings.lock_wait;
    let Some(boarded) = state.flights().board(spend.ticket_id, deadline).await else {
        // A duplicate of this request is still executing in this instance.
        return spend
            .replay_without_lock()
            .await?
            .ok_or(ApiError::RequestInProgress);
    };
    if boarded.duplicate()
        && let Some(replay) = spend.replay_without_lock().await?
    {
        return Ok(replay);
    }
    spend.fenced(deadline).await
}

/// What asking for the account's lock came to.
enum Locked {
    /// The lock is ours.
    Held(LockGuard),
    /// The answer without the lock: the ticket's stored outcome, found while the lock was
    /// held by another; or waiting gave up (past the deadline, or past the cap on
    /// waiters).
    Answered(Result<Response, ApiError>),
}

impl Spend<'_> {
    /// The demonstration's unsafe strategies: the ticket looked up first, then their own
    /// read-check-write.
    #[cfg(feature = "demo")]
    async fn unguarded(&self, strategy: crate::config::Strategy) -> Result<Response, ApiError> {
        if let Some(replay) = self.replay_without_lock().await? {
            return Ok(replay);
        }
        let settings = self.state.settings();
        let parts = demo::Parts {
            ledger: self.state.ledger(),
            locks: self.state.locks(),
            recipes: self.state.recipes(),
            lock_ttl: settings.lock_ttl,
            lock_wait: settings.lock_wait,
        };
        let written = demo::spend_unguarded(
            parts,
            strategy,
            &self.lock_key,
            self.account,
            self.ticket_id,
            self.operation,
            &self.fingerprint,
            self.faults,
        )
        .await?;
        match written {
            Some(applied) => {
                self.state.metrics().executed();
                Ok(outcome_response(applied.kind, applied.response, false))
            }
            // Another request completed the ticket first: answer with its outcome.
            None => self
                .replay_without_lock()
                .await?
                .ok_or(ApiError::RequestInProgress),
        }
    }

    /// Steps 2 to 4: under the account's lock, apply with its fencing token.
    ///
    /// A second round only when the ledger refused our token although we still held the
    /// lock: the lock store handed out a token below one the ledger accepted earlier (its
    /// counters were lost and the clock it restarts them from stepped back). Nothing was
    /// written; the counter is raised above the ledger's before we release, so the next
    /// grant is accepted.
    async fn fenced(&self, deadline: Instant) -> Result<Response, ApiError> {
        let lock_key = self.lock_key.as_str();
        let mut retried = false;
        loop {
            let mut guard = match self.lock(lock_key, deadline).await? {
                Locked::Held(guard) => guard,
                Locked::Answered(answer) => return answer,
            };
            #[cfg(feature = "demo")]
            self.faults
                .strike(&mut guard, self.ticket_id, !retried)
                .await;
            if guard.is_lost() {
                self.state.metrics().lock_lost();
                let _ = guard.release().await;
                return Err(ApiError::LockLost);
            }
            let applied = match self.apply(lock_key, &guard).await {
                Ok(applied) if applied.replayed => {
                    // Nothing was written, so the answer need not wait for the release:
                    // dropping the guard gives the lock back in the background.
                    drop(guard);
                    self.state.metrics().replayed();
                    return Ok(outcome_response(applied.kind, applied.response, true));
                }
                applied => applied,
            };
            let still_held = match guard.release().await {
                Ok(held) => held,
                Err(error) => {
                    tracing::warn!(%error, key = lock_key, "release failed; the lease will expire");
                    false
                }
            };
            return match applied {
                Ok(applied) => {
                    self.state.metrics().executed();
                    Ok(outcome_response(applied.kind, applied.response, false))
                }
                Err(ApplyError::StaleToken { .. }) if still_held && !retried => {
                    // We held the lock all along, so no newer holder wrote: the token was
                    // low, not late. Try once more with a fresh grant.
                    retried = true;
                    continue;
                }
                Err(ApplyError::StaleToken { .. }) => {
                    // A paused holder woke up after its lease ran out and a newer holder
                    // wrote.
                    self.state.metrics().lock_lost();
                    Err(ApiError::LockLost)
                }
                Err(error) => Err(error.into()),
            };
        }
    }

    /// Step 2: the account's lock, leaving the ticket id as the lock's note — at once if
    /// it is free, else after looking the ticket up (a used one is answered without it).
    /// Traced as `lock.wait`, with the key and the fencing token granted.
    #[tracing::instrument(
        name = "lock.wait",
        skip_all,
        fields(lock.key = lock_key, lock.fencing_token = tracing::field::Empty)
    )]
    async fn lock(&self, lock_key: &str, deadline: Instant) -> Result<Locked, ApiError> {
        let settings = self.state.settings();
        let note = self.ticket_id.to_string();
        let asked = Instant::now();
        let free = self
            .state
            .locks()
            .try_acquire_noted(lock_key, settings.lock_ttl, &note)
            .await?;
        if let Some(guard) = free {
            self.state.metrics().lock_granted(asked.elapsed(), false);
            tracing::Span::current().record("lock.fencing_token", guard.fencing_token().get());
            return Ok(Locked::Held(guard));
        }
        if let Some(replay) = self.replay_without_lock().await? {
            return Ok(Locked::Answered(Ok(replay)));
        }
        let acquired = self
            .state
            .locks()
            .acquire_noted(lock_key, settings.lock_ttl, deadline, &note)
            .await;
        match &acquired {
            // Not free a moment ago: a holder handed it on.
            Ok(_) => self.state.metrics().lock_granted(asked.elapsed(), true),
            Err(_) => self.state.metrics().lock_not_granted(asked.elapsed()),
        }
        match acquired {
            Ok(guard) => {
                tracing::Span::current().record("lock.fencing_token", guard.fencing_token().get());
                Ok(Locked::Held(guard))
            }
            Err(LockError::TimedOut { .. }) => {
                self.state.metrics().lock_timed_out();
                Ok(Locked::Answered(self.gave_up_waiting(lock_key).await))
            }
            Err(LockError::QueueFull { .. }) => {
                // Turned away at once: no lookups, so a crowd costs as little as it can.
                self.state.metrics().lock_queue_full();
                Ok(Locked::Answered(Err(ApiError::AccountBusy)))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Step 3: the ledger's transaction, with the lock's fencing token. A stale token
    /// stores nothing; the lock's counter is then raised to what the ledger has seen —
    /// before the release, so the waiter we hand the lock to gets a token above it.
    async fn apply(
        &self,
        lock_key: &str,
        guard: &LockGuard,
    ) -> Result<ledger::Applied, ApplyError> {
        let started = Instant::now();
        let applied = self
            .state
            .ledger()
            .apply(
                ApplyRequest {
                    ticket_id: self.ticket_id,
                    account_id: self.account,
                    operation: self.operation,
                    fingerprint: &self.fingerprint,
                    fencing_token: guard.fencing_token().get(),
                },
                &render,
            )
            .await;
        self.state.metrics().committed(started.elapsed());
        if let Err(ApplyError::StaleToken {
            presented,
            recorded,
        }) = &applied
        {
            self.state.metrics().stale_token();
            tracing::warn!(ticket_id = %self.ticket_id, presented, recorded, "ledger refused a stale fencing token");
            if let Err(error) = self
                .state
                .locks()
                .raise_fencing(lock_key, FencingToken::new(*recorded))
                .await
            {
                tracing::warn!(%error, "could not raise the fencing counter");
            }
        }
        applied
    }

    /// A used ticket answers from its stored outcome, no lock needed. `None` means the
    /// ticket is usable and the request must execute.
    async fn replay_without_lock(&self) -> Result<Option<Response>, ApiError> {
        replay_without_lock(self.state, self.ticket_id, self.account, &self.fingerprint).await
    }

    /// Past the lock wait: the original of this very request finished meanwhile (replay —
    /// looked at first, since it may have run in another instance), or it is still
    /// running (409 request-in-progress), or the account is busy with others (409
    /// account-busy).
    async fn gave_up_waiting(&self, lock_key: &str) -> Result<Response, ApiError> {
        if let Some(replay) = self.replay_without_lock().await? {
            return Ok(replay);
        }
        let holder = self
            .state
            .locks()
            .holder_note(lock_key)
            .await
            .ok()
            .flatten();
        if holder.as_deref() == Some(self.ticket_id.to_string().as_str()) {
            Err(ApiError::RequestInProgress)
        } else {
            Err(ApiError::AccountBusy)
        }
    }
}

/// A used ticket answers from its stored outcome, no lock needed. `None` means the ticket
/// is usable and the request must execute.
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
            match ticket.outcome.as_ref().and_then(ledger::Outcome::kind) {
                Some(kind) => Ok(Some(outcome_response(kind, response.clone(), true))),
                // What is stored is the answer, whatever its kind: it is sent as it was
                // stored (without a kind there is no Location to add), and the oddity is
                // left for the audit to name.
                None => {
                    tracing::warn!(%ticket_id, status = response.status, "stored outcome of no known kind");
                    Ok(Some(stored_response(response.clone(), true)))
                }
            }
        }
        Judgement::Reused => Err(ApiError::IdempotencyKeyReuse),
        Judgement::Pruned => Err(ApiError::OutcomePruned),
        Judgement::Expired => Err(ApiError::TicketExpired),
    }
}

/// A spend's stored outcome, of `kind`, as sent: as [`stored_response`], and an accepted
/// payout says where to watch it — `Location`, its payout, named in the stored body.
pub(crate) fn outcome_response(
    kind: OutcomeKind,
    response: StoredResponse,
    replayed: bool,
) -> Response {
    let location = (kind == OutcomeKind::PayoutAccepted)
        .then(|| {
            response
                .body
                .get("payout_id")
                .and_then(serde_json::Value::as_str)
        })
        .flatten()
        .and_then(|payout| HeaderValue::from_str(&format!("/v1/payouts/{payout}")).ok());
    respond(response, location, replayed)
}

/// A stored response as sent: its status and body, JSON for successes and problem+json
/// for refusals, and `Idempotent-Replayed: true` on repeats only.
pub(crate) fn stored_response(response: StoredResponse, replayed: bool) -> Response {
    respond(response, None, replayed)
}

/// A stored response as sent, with `location` (a header sent before the replay's, as the
/// answers have always had them).
fn respond(response: StoredResponse, location: Option<HeaderValue>, replayed: bool) -> Response {
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
    if let Some(location) = location {
        answer.headers_mut().insert(header::LOCATION, location);
    }
    if replayed {
        answer
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    answer
}
