//! The HTTP surface: the routes, each handler, and the problem+json answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Extension, FromRequestParts, Path, Query, State};
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::faults::{Fault, Faults};
use crate::model::{
    IdempotencyKey, Record, State as KeyState, StoredAnswer, TransferBody, TransferRequest,
    TransferView, rfc3339,
};
use crate::server::ConnectionKill;
use crate::store::{Execution, Store, StoreError, Verdict};

/// The header that carries a transfer's idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The header that marks a stored answer sent again.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// The demonstration header: names the one fault this request meets, whatever the
/// rates (only when the bank was started with `--demo-header`).
pub const FAULT_HEADER: &str = "payonce-bank-fault";
/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";
/// The largest request body.
pub const MAX_BODY: usize = 16 * 1024;
/// The most transfers one page of the list holds.
pub const MAX_PAGE: i64 = 1_000;
/// The problem name of a declined transfer.
pub const DESTINATION_CLOSED: &str = "destination-closed";

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) store: Store,
    pub(crate) faults: Faults,
    /// How long `commit-then-slow` holds its answer.
    pub(crate) slow_for: Duration,
    /// The `Retry-After` of `unavailable`, of a throttle (and of a database that does
    /// not answer).
    pub(crate) retry_after: Duration,
    /// How many more transfer requests are throttled (`--throttle-first`).
    pub(crate) throttles_left: AtomicU64,
    /// Whether [`FAULT_HEADER`] is heeded.
    pub(crate) demo_header: bool,
    /// Tells the accept loop to go down (the `down` fault); it sleeps its `down_for`.
    pub(crate) down: mpsc::Sender<()>,
}

/// The routes.
pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/transfers", post(create_transfer).get(list_transfers))
        .route("/v1/transfers/{key}", get(get_transfer))
        .route("/v1/transfers/{key}/close", post(close_key))
        .fallback(|| async {
            Problem::new(
                StatusCode::NOT_FOUND,
                "not-found",
                "Not found",
                "no such route",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(app)
}

/// An RFC 9457 problem: `type` is `/problems/<name>`.
#[derive(Debug)]
pub(crate) struct Problem {
    status: StatusCode,
    name: &'static str,
    title: &'static str,
    detail: String,
    retry_after: Option<Duration>,
}

#[derive(Serialize)]
struct ProblemBody<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
}

impl Problem {
    fn new(
        status: StatusCode,
        name: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            name,
            title,
            detail: detail.into(),
            retry_after: None,
        }
    }

    fn retry_after(self, after: Duration) -> Self {
        Self {
            retry_after: Some(after),
            ..self
        }
    }

    fn bad_request(name: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, name, "Bad request", detail)
    }

    fn invalid(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-request",
            "Invalid request",
            detail,
        )
    }

    fn rate_limited(retry_after: Duration) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            "Too many requests",
            "the bank is pacing its callers; nothing was done, retry after Retry-After",
        )
        .retry_after(retry_after)
    }

    fn unavailable(retry_after: Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Unavailable",
            "the bank cannot take requests now; nothing was done, retry later",
        )
        .retry_after(retry_after)
    }

    /// The store failed. Unlike the `unavailable` fault this cannot promise that nothing
    /// was done: a COMMIT whose answer was lost may have committed.
    fn from_store(error: &StoreError, retry_after: Duration) -> Self {
        tracing::error!(%error, "the store failed");
        Self {
            detail: "the bank's store failed; a transfer under this key may or may not have \
                     executed: send it again, or ask GET /v1/transfers/{key}"
                .into(),
            ..Self::unavailable(retry_after)
        }
    }

    /// The problem's JSON body.
    fn body(&self) -> String {
        let body = ProblemBody {
            kind: format!("/problems/{}", self.name),
            title: self.title,
            status: self.status.as_u16(),
            detail: &self.detail,
        };
        serde_json::to_string(&body).unwrap_or_default()
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON))],
            self.body(),
        )
            .into_response();
        if let Some(after) = self.retry_after {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(after.as_secs().max(1)));
        }
        response
    }
}

/// `GET /healthz`: 200 when the database answers, else 503.
async fn healthz(State(app): State<Arc<App>>) -> Response {
    match app.store.ping().await {
        Ok(()) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({"status": "ok"})),
        )
            .into_response(),
        Err(error) => Problem::from_store(&error, app.retry_after).into_response(),
    }
}

/// `POST /v1/transfers`: executes the transfer once per key (see the crate's docs).
async fn create_transfer(
    State(app): State<Arc<App>>,
    Extension(kill): Extension<ConnectionKill>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    // A throttle comes before anything else, as a rate limiter in front of a bank's API
    // would: whatever the request, nothing is done.
    let throttled = app
        .throttles_left
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            left.checked_sub(1)
        })
        .is_ok();
    if throttled {
        return Problem::rate_limited(app.retry_after).into_response();
    }
    let (key, request, fault) = match admit(&app, &headers, body) {
        Ok(admitted) => admitted,
        Err(problem) => return problem.into_response(),
    };
    if let Some(fault) = fault {
        tracing::info!(fault = fault.name(), key = key.as_str(), "fault");
    }
    match fault {
        Some(Fault::FailBefore) => {
            return Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal-error",
                "Internal error",
                "the bank failed before doing anything; nothing was done",
            )
            .into_response();
        }
        Some(Fault::Unavailable) => return Problem::unavailable(app.retry_after).into_response(),
        Some(Fault::Down) => {
            // The accept loop closes the listener first and then every connection, this
            // one with them: the caller sees its connection end without an answer and
            // then finds nothing listening.
            let _ = app.down.try_send(());
            return std::future::pending().await;
        }
        _ => {}
    }
    let verdict = if fault == Some(Fault::Decline) {
        Verdict::Decline(DESTINATION_CLOSED)
    } else {
        Verdict::Execute
    };
    let answer = match execute(&app, &key, &request, verdict).await {
        Ok(Execution::Fresh(record)) => stored(record.answer.as_ref(), false),
        Ok(Execution::Existing(record)) => repeat(&record, &request),
        Err(error) => Problem::from_store(&error, app.retry_after).into_response(),
    };
    match fault {
        Some(Fault::CommitThenDrop) => {
            kill.drop_connection();
            std::future::pending().await
        }
        Some(Fault::CommitThenSlow) => {
            tokio::time::sleep(app.slow_for).await;
            answer
        }
        _ => answer,
    }
}

/// Looks for the key first — a repeat then answers without the write transaction, which
/// on PostgreSQL would queue behind every other transfer for the grand total's lock —
/// and executes only a key not seen yet.
async fn execute(
    app: &App,
    key: &IdempotencyKey,
    request: &TransferRequest,
    verdict: Verdict<'_>,
) -> Result<Execution, StoreError> {
    if let Some(existing) = app.store.find(key).await? {
        return Ok(Execution::Existing(existing));
    }
    app.store.execute(key, request, verdict, render).await
}

/// Validates a create's key and body and picks its fault — all before anything is done.
fn admit(
    app: &App,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(IdempotencyKey, TransferRequest, Option<Fault>), Problem> {
    let key = idempotency_key(headers)?;
    if !is_json(headers) {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            "the body is JSON: Content-Type: application/json",
        ));
    }
    let request = transfer_request(body)?;
    let fault = demanded_fault(app, headers)?.or_else(|| app.faults.draw());
    Ok((key, request, fault))
}

/// The request's one `Idempotency-Key`, valid.
fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, Problem> {
    let mut keys = headers.get_all(IDEMPOTENCY_KEY).iter();
    match (keys.next(), keys.next()) {
        (None, _) => Err(Problem::bad_request(
            "idempotency-key-missing",
            "a transfer needs an Idempotency-Key header",
        )),
        (Some(_), Some(_)) => Err(Problem::bad_request(
            "invalid-idempotency-key",
            "the Idempotency-Key header was sent more than once",
        )),
        (Some(value), None) => value
            .to_str()
            .map_err(|_| Problem::bad_request("invalid-idempotency-key", "the key is not ASCII"))
            .and_then(|raw| {
                IdempotencyKey::parse(raw)
                    .map_err(|invalid| Problem::bad_request("invalid-idempotency-key", invalid.0))
            }),
    }
}

/// Whether the body is declared JSON (`application/json`, or `application/…+json`).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|media| {
            let media = media.trim().to_ascii_lowercase();
            media == "application/json"
                || (media.starts_with("application/") && media.ends_with("+json"))
        })
        .unwrap_or(false)
}

/// The transfer the body asks for.
fn transfer_request(body: Result<Bytes, BytesRejection>) -> Result<TransferRequest, Problem> {
    let body = body.map_err(|rejection| {
        Problem::new(
            rejection.status(),
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                "body-too-large"
            } else {
                "malformed-request"
            },
            "Bad body",
            rejection.body_text(),
        )
    })?;
    let body: TransferBody = serde_json::from_slice(&body).map_err(|error| {
        if error.is_data() {
            Problem::invalid(error.to_string())
        } else {
            Problem::bad_request(
                "malformed-request",
                format!("the body is not JSON: {error}"),
            )
        }
    })?;
    TransferRequest::parse(body).map_err(|invalid| Problem::invalid(invalid.0))
}

/// The fault the request's demonstration header names, when the bank honours the header.
fn demanded_fault(app: &App, headers: &HeaderMap) -> Result<Option<Fault>, Problem> {
    match headers.get(FAULT_HEADER) {
        Some(value) if app.demo_header => value
            .to_str()
            .ok()
            .and_then(|name| name.trim().parse::<Fault>().ok())
            .map(Some)
            .ok_or_else(|| {
                Problem::bad_request(
                    "unknown-fault",
                    format!(
                        "{FAULT_HEADER} names one of: {}",
                        Fault::ALL.map(Fault::name).join(", ")
                    ),
                )
            }),
        _ => Ok(None),
    }
}

/// The answer stored with a new transfer: 201 with the transfer, or the decline's 422.
fn render(record: &Record) -> StoredAnswer {
    match (record.state, record.view()) {
        (KeyState::Executed, Some(view)) => StoredAnswer {
            status: StatusCode::CREATED.as_u16(),
            body: serde_json::to_string(&view).unwrap_or_default(),
        },
        _ => {
            let problem = Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                DESTINATION_CLOSED,
                "Destination closed",
                "the destination account is closed; this transfer will not execute",
            );
            StoredAnswer {
                status: problem.status.as_u16(),
                body: problem.body(),
            }
        }
    }
}

/// A stored answer as a response, marked as a replay or not.
fn stored(answer: Option<&StoredAnswer>, replayed: bool) -> Response {
    let Some(answer) = answer else {
        tracing::error!("a transfer has no stored answer");
        return Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal-error",
            "Internal error",
            "the transfer's answer is missing",
        )
        .into_response();
    };
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let media = if status.is_success() {
        "application/json"
    } else {
        PROBLEM_JSON
    };
    let mut response = (
        status,
        [(CONTENT_TYPE, HeaderValue::from_static(media))],
        answer.body.clone(),
    )
        .into_response();
    if replayed {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// A request under a key taken already: refused when the key is closed or holds another
/// body, else the stored answer again.
fn repeat(record: &Record, request: &TransferRequest) -> Response {
    if record.state == KeyState::Closed {
        return key_closed().into_response();
    }
    if record.fingerprint.as_deref() != Some(request.fingerprint().as_str()) {
        return Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reuse",
            "Idempotency key reused",
            "this key was used for another transfer; nothing was done",
        )
        .into_response();
    }
    stored(record.answer.as_ref(), true)
}

fn key_closed() -> Problem {
    Problem::new(
        StatusCode::CONFLICT,
        "idempotency-key-closed",
        "Idempotency key closed",
        "this key was closed with no transfer; nothing was done and nothing will be under it",
    )
}

/// The idempotency key a transfer's path names (`/v1/transfers/{key}`); a path without a
/// valid one is refused with 400 `invalid-idempotency-key`.
struct KeyInPath(IdempotencyKey);

impl<S: Send + Sync> FromRequestParts<S> for KeyInPath {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| {
                Problem::bad_request("invalid-idempotency-key", rejection.body_text())
            })?;
        IdempotencyKey::parse(&raw)
            .map(Self)
            .map_err(|invalid| Problem::bad_request("invalid-idempotency-key", invalid.0))
    }
}

/// `GET /v1/transfers/{key}`: the transfer under the key, or 404 — `transfer-not-found`
/// (none yet) or `idempotency-key-closed` (none, and none ever will be).
async fn get_transfer(State(app): State<Arc<App>>, KeyInPath(key): KeyInPath) -> Response {
    match app.store.find(&key).await {
        Ok(Some(record)) => match record.view() {
            Some(view) => axum::Json(view).into_response(),
            None => Problem {
                status: StatusCode::NOT_FOUND,
                ..key_closed()
            }
            .into_response(),
        },
        Ok(None) => Problem::new(
            StatusCode::NOT_FOUND,
            "transfer-not-found",
            "Transfer not found",
            "no transfer under this key (yet: the key is not closed)",
        )
        .into_response(),
        Err(error) => Problem::from_store(&error, app.retry_after).into_response(),
    }
}

/// A closed key, as the close answers it.
#[derive(Debug, Serialize, Deserialize)]
pub struct ClosedKey {
    /// The key.
    pub idempotency_key: String,
    /// Always `closed`.
    pub state: KeyState,
    /// RFC 3339, UTC: when it was closed.
    pub closed_at: String,
}

/// `POST /v1/transfers/{key}/close`: 200 with the closed key, or with the transfer that
/// holds the key already. Idempotent.
async fn close_key(State(app): State<Arc<App>>, KeyInPath(key): KeyInPath) -> Response {
    match app.store.close(&key).await {
        Ok(record) => match record.view() {
            Some(view) => axum::Json(view).into_response(),
            None => axum::Json(ClosedKey {
                idempotency_key: record.idempotency_key,
                state: KeyState::Closed,
                closed_at: rfc3339(record.created_at_micros),
            })
            .into_response(),
        },
        Err(error) => Problem::from_store(&error, app.retry_after).into_response(),
    }
}

/// The list's query.
#[derive(Debug, Deserialize)]
struct ListQuery {
    #[serde(default)]
    after: i64,
    #[serde(default = "default_page")]
    limit: i64,
    /// Only the transfers whose reference is this (a caller's view of one payment of its
    /// own, under whatever keys it was sent).
    reference: Option<String>,
}

fn default_page() -> i64 {
    100
}

/// One page of the list.
#[derive(Debug, Serialize, Deserialize)]
pub struct TransferPage {
    /// Transfers with ids above `after`, in id order.
    pub transfers: Vec<TransferView>,
    /// The `after` of the next page; none when this page was the last one (for now).
    pub next_after: Option<i64>,
}

/// `GET /v1/transfers?after=<id>&limit=<n>[&reference=<text>]`: transfers (executed and
/// declined) in the order they committed — all of them, or those with that reference.
async fn list_transfers(
    State(app): State<Arc<App>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(rejection) => {
            return Problem::bad_request("malformed-request", rejection.body_text())
                .into_response();
        }
    };
    if query.after < 0 || !(1..=MAX_PAGE).contains(&query.limit) {
        return Problem::invalid(format!("after is 0 or more; limit is 1 to {MAX_PAGE}"))
            .into_response();
    }
    let listed = app
        .store
        .list(query.after, query.limit, query.reference.as_deref())
        .await;
    match listed {
        Ok(records) => {
            let transfers: Vec<TransferView> = records.iter().filter_map(Record::view).collect();
            let full = i64::try_from(records.len()).unwrap_or(i64::MAX) == query.limit;
            let next_after = records.last().map(|record| record.id).filter(|_| full);
            axum::Json(TransferPage {
                transfers,
                next_after,
            })
            .into_response()
        }
        Err(error) => Problem::from_store(&error, app.retry_after).into_response(),
    }
}
