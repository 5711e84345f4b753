//! Webhook endpoints and their deliveries: `POST`/`GET /v1/accounts/{id}/webhook-endpoints`,
//! `DELETE /v1/accounts/{id}/webhook-endpoints/{endpoint_id}`,
//! `POST …/{endpoint_id}/rotate-secret`, `GET /v1/webhook-endpoints/{endpoint_id}/deliveries`,
//! `POST /v1/webhook-endpoints/{endpoint_id}/deliveries/{delivery_id}/retry`.
//!
//! An endpoint's secret is made here, shown once (at creation, and at each rotation for
//! the new one), and stored sealed (`crate::webhooks::sealing`). The URL passes the SSRF
//! guard before anything is stored.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ledger::requests::{KeptAnswer, Keyed, RequestKey};
use ledger::webhooks::{
    Attempt, Delivery, Endpoint, EndpointId, EventType, MAX_ENDPOINTS_PER_ACCOUNT, MAX_URL,
    NewEndpoint, RetryRefused, Subscription,
};
use ledger::{AccountId, StoredResponse};
use serde::Deserialize;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::auth::{Caller, OwnAccount};
use crate::error::{ApiError, Problem};
use crate::extract::{IdempotencyKey, JsonBody};
use crate::routes::responses::{
    BodyTooLarge, MalformedCreate, NotJson, OthersAccount, Unauthenticated,
};
use crate::routes::spends;
use crate::state::AppState;
use crate::webhooks::guard::Guard;
use crate::webhooks::{Webhooks, signing};

pub use payonce_types::webhooks::{
    AttemptView, DeliveriesPage, DeliveryView, EndpointList, EndpointRequest, EndpointView,
    EndpointWithSecret,
};

/// An endpoint as the contract shows it.
fn endpoint_view(endpoint: &Endpoint) -> EndpointView {
    EndpointView {
        id: endpoint.id.0,
        account_id: endpoint.account_id.0,
        url: endpoint.url.clone(),
        events: match &endpoint.subscription {
            Subscription::All => None,
            Subscription::Only(types) => Some(types.clone()),
        },
        status: if endpoint.disabled.is_some() {
            "disabled"
        } else {
            "enabled"
        }
        .to_owned(),
        disabled_reason: endpoint.disabled.as_ref().map(|(_, why)| why.clone()),
        previous_secret_expires_at: endpoint
            .previous_secret
            .as_ref()
            .map(|(_, until)| *until)
            .filter(|until| *until > OffsetDateTime::now_utc()),
        created_at: endpoint.created_at,
    }
}

/// The webhooks of this instance, or 503.
fn webhooks(state: &AppState) -> Result<&Webhooks, ApiError> {
    state
        .webhooks()
        .map(AsRef::as_ref)
        .ok_or(ApiError::WebhooksUnavailable)
}

/// Creates an endpoint: its events are sent there from now on, signed with the secret this
/// answer shows once.
#[utoipa::path(
    post,
    path = "/v1/accounts/{id}/webhook-endpoints",
    tag = "webhooks",
    params(
        ("id" = Uuid, Path, description = "The account"),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: a UUID of your choosing (bare or quoted) that makes the request happen once — the same key and request again answer the first answer, secret included and do nothing more; keys are per account, kept for PAYONCE_RETENTION"),
    ),
    security(("api_key" = [])),
    request_body = EndpointRequest,
    responses(
        (status = 201, description = "Created; `secret` is shown this once (and again to a replay under its Idempotency-Key, which carries `Idempotent-Replayed: true`)", body = EndpointWithSecret,
            headers(("Location" = String, description = "/v1/accounts/{id}/webhook-endpoints/{endpoint_id}")),
            links(
                ("ListDeliveries" = (operation_id = "list_deliveries", parameters(("endpoint_id" = "$response.body#/id")), description = "The endpoint's deliveries")),
                ("RotateSecret" = (operation_id = "rotate_secret", parameters(("id" = "$response.body#/account_id"), ("endpoint_id" = "$response.body#/id")), description = "Rotate its secret")),
                ("DeleteEndpoint" = (operation_id = "delete_endpoint", parameters(("id" = "$response.body#/account_id"), ("endpoint_id" = "$response.body#/id")), description = "Delete it")),
            )),
        (status = 400, response = MalformedCreate),
        (status = 401, response = Unauthenticated),
        (status = 403, response = OthersAccount),
        (status = 404, description = "No such account", body = Problem, content_type = "application/problem+json"),
        (status = 413, response = BodyTooLarge),
        (status = 415, response = NotJson),
        (status = 422, description = "A URL the guard refuses (`webhook-url-refused`), an unknown or empty event list (`invalid-request`), or the account has 16 endpoints (`webhook-endpoint-limit`); or the Idempotency-Key was used for another request (`idempotency-key-reuse`); nothing created", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable; nothing created", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_endpoint(
    State(state): State<AppState>,
    OwnAccount(account): OwnAccount,
    key: Option<IdempotencyKey>,
    JsonBody(request): JsonBody<EndpointRequest>,
) -> Result<Response, ApiError> {
    let webhooks = webhooks(&state)?;
    check_endpoint_request(&request)?;
    let url = allowed_url(webhooks.guard(), &request.url).await?;
    let fingerprint = spends::fingerprint(
        &format!("/v1/accounts/{account}/webhook-endpoints"),
        &request,
    );
    let id = EndpointId::random();
    let secret = signing::new_secret();
    let shown = signing::shown(&secret);
    let new = NewEndpoint {
        id,
        account_id: account,
        url: url.to_string(),
        subscription: Subscription::of(request.events),
        secret_sealed: webhooks.sealer().seal(id.0.as_bytes(), &secret),
    };
    let created = |endpoint: Endpoint| KeptAnswer {
        status: 201,
        body: view_value(&endpoint),
        secret: Some(shown.clone()),
    };
    let ledger = state.ledger();
    let answer = match key {
        None => ledger.create_endpoint(&new).await?.map(created),
        Some(IdempotencyKey(key)) => {
            let key = RequestKey {
                account,
                key: key.0,
                fingerprint: &fingerprint,
            };
            match ledger
                .create_endpoint_once(&new, &key, &view_value, &shown)
                .await?
            {
                Keyed::Ran(endpoint) => endpoint.map(created),
                Keyed::Replayed(kept) => return Ok(with_secret(kept, true)),
            }
        }
    };
    let answer = answer.ok_or(ApiError::WebhookEndpointLimit(MAX_ENDPOINTS_PER_ACCOUNT))?;
    Ok(with_secret(answer, false))
}

/// A creation's request within bounds: a URL of at most `MAX_URL` characters, and an event
/// list, when there is one, of one to every type.
fn check_endpoint_request(request: &EndpointRequest) -> Result<(), ApiError> {
    if request.url.chars().count() > MAX_URL {
        return Err(ApiError::WebhookUrlRefused(format!(
            "a URL has at most {MAX_URL} characters"
        )));
    }
    if request
        .events
        .as_ref()
        .is_some_and(|events| events.len() > EventType::ALL.len())
    {
        return Err(ApiError::InvalidRequest(format!(
            "events lists at most {} event types",
            EventType::ALL.len()
        )));
    }
    if request.events.as_ref().is_some_and(Vec::is_empty) {
        return Err(ApiError::InvalidRequest(
            "events lists at least one event type; omit it for every type".into(),
        ));
    }
    Ok(())
}

/// `text` as a URL the guard lets deliveries go to, in the form that is stored.
async fn allowed_url(guard: &Guard, text: &str) -> Result<url::Url, ApiError> {
    let url = guard.url(text).map_err(ApiError::WebhookUrlRefused)?;
    // What is stored is the parsed form, where a non-ASCII character may take up to twelve
    // (percent-encoded UTF-8, or a host's punycode): the bound holds for that form too.
    if url.as_str().len() > MAX_URL {
        return Err(ApiError::WebhookUrlRefused(format!(
            "a URL has at most {MAX_URL} characters once its non-ASCII characters are percent-encoded"
        )));
    }
    guard
        .resolves_somewhere_allowed(&url)
        .await
        .map_err(ApiError::WebhookUrlRefused)?;
    Ok(url)
}

/// An endpoint as its creation's or rotation's answer shows it, less the secret: what is
/// kept under an idempotency key.
fn view_value(endpoint: &Endpoint) -> serde_json::Value {
    serde_json::to_value(endpoint_view(endpoint)).unwrap_or_default()
}

/// The answer to a creation or a rotation: the endpoint with its secret, and where the
/// endpoint is (a creation's); `Idempotent-Replayed: true` on a replay.
fn with_secret(answer: KeptAnswer, replayed: bool) -> Response {
    let mut body = answer.body;
    if let (Some(fields), Some(secret)) = (body.as_object_mut(), answer.secret) {
        fields.insert("secret".to_owned(), serde_json::Value::String(secret));
    }
    let location = (answer.status == 201)
        .then(|| {
            let account = body.get("account_id")?.as_str()?;
            let endpoint = body.get("id")?.as_str()?;
            HeaderValue::from_str(&format!(
                "/v1/accounts/{account}/webhook-endpoints/{endpoint}"
            ))
            .ok()
        })
        .flatten();
    let mut response = spends::stored_response(
        StoredResponse {
            status: answer.status,
            body,
        },
        replayed,
    );
    if let Some(location) = location {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// Lists the account's endpoints, oldest first.
#[utoipa::path(
    get,
    path = "/v1/accounts/{id}/webhook-endpoints",
    tag = "webhooks",
    params(("id" = Uuid, Path, description = "The account")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The endpoints", body = EndpointList),
        (status = 401, response = Unauthenticated),
        (status = 403, response = OthersAccount),
        (status = 404, description = "No such account", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_endpoints(
    State(state): State<AppState>,
    OwnAccount(account): OwnAccount,
) -> Result<Json<EndpointList>, ApiError> {
    let endpoints = state.ledger().endpoints(account).await?;
    Ok(Json(EndpointList {
        endpoints: endpoints.iter().map(endpoint_view).collect(),
    }))
}

/// The account and the endpoint in the path, the account the caller's own: 404 for a path
/// that names none, 403 for another account's.
fn own_endpoint_path(
    caller: Caller,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(AccountId, EndpointId), ApiError> {
    let Path((account, endpoint)) =
        path.map_err(|_| ApiError::NotFound("no such account".into()))?;
    let account = Uuid::try_parse(&account)
        .map(AccountId)
        .map_err(|_| ApiError::NotFound("no such account".into()))?;
    caller.must_be(account)?;
    let endpoint = Uuid::try_parse(&endpoint)
        .map(EndpointId)
        .map_err(|_| ApiError::WebhookEndpointNotFound)?;
    Ok((account, endpoint))
}

/// Deletes an endpoint: it gets no more events, and its deliveries not yet made end
/// (`endpoint-deleted`).
#[utoipa::path(
    delete,
    path = "/v1/accounts/{id}/webhook-endpoints/{endpoint_id}",
    tag = "webhooks",
    params(
        ("id" = Uuid, Path, description = "The account"),
        ("endpoint_id" = Uuid, Path, description = "The endpoint"),
    ),
    security(("api_key" = [])),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, response = Unauthenticated),
        (status = 403, response = OthersAccount),
        (status = 404, description = "No such account or endpoint", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable; nothing changed", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn delete_endpoint(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let (account, endpoint) = own_endpoint_path(caller, path)?;
    if state.ledger().delete_endpoint(account, endpoint).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::WebhookEndpointNotFound)
    }
}

/// Starts a rotation of the endpoint's secret: the new one, shown in this answer, signs
/// from now on; the one before it signs too, beside it in `webhook-signature`, until
/// `previous_secret_expires_at` (`PAYONCE_WEBHOOK_ROTATION_WINDOW` from now) — time to
/// move the receiver to the new one without refusing a delivery.
#[utoipa::path(
    post,
    path = "/v1/accounts/{id}/webhook-endpoints/{endpoint_id}/rotate-secret",
    tag = "webhooks",
    params(
        ("id" = Uuid, Path, description = "The account"),
        ("endpoint_id" = Uuid, Path, description = "The endpoint"),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: a UUID of your choosing (bare or quoted) that makes the request happen once — the same key and request again answer the first answer (the same new secret): a rotation sent twice rotates once, and the secret before it keeps signing through its window and do nothing more; keys are per account, kept for PAYONCE_RETENTION"),
    ),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "Rotated; the new `secret` is shown this once (and again to a replay under its Idempotency-Key, which carries `Idempotent-Replayed: true`)", body = EndpointWithSecret),
        (status = 400, description = "A malformed or repeated Idempotency-Key (`idempotency-key-invalid`); nothing changed", body = Problem, content_type = "application/problem+json"),
        (status = 401, response = Unauthenticated),
        (status = 403, response = OthersAccount),
        (status = 404, description = "No such account or endpoint", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The Idempotency-Key was used for another request (`idempotency-key-reuse`); nothing changed", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable; nothing changed", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn rotate_secret(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<(String, String)>, PathRejection>,
    key: Option<IdempotencyKey>,
) -> Result<Response, ApiError> {
    let (account, endpoint) = own_endpoint_path(caller, path)?;
    let webhooks = webhooks(&state)?;
    let secret = signing::new_secret();
    let shown = signing::shown(&secret);
    let sealed = webhooks.sealer().seal(endpoint.0.as_bytes(), &secret);
    let window = webhooks.settings().rotation_window;
    let ledger = state.ledger();
    let rotated = match key {
        None => {
            ledger
                .rotate_endpoint_secret(account, endpoint, &sealed, window)
                .await?
        }
        Some(IdempotencyKey(key)) => {
            let fingerprint = spends::fingerprint(
                &format!("/v1/accounts/{account}/webhook-endpoints/{endpoint}/rotate-secret"),
                &(),
            );
            let key = RequestKey {
                account,
                key: key.0,
                fingerprint: &fingerprint,
            };
            match ledger
                .rotate_endpoint_secret_once(endpoint, &sealed, window, &key, &view_value, &shown)
                .await?
            {
                Keyed::Ran(rotated) => rotated,
                Keyed::Replayed(kept) => return Ok(with_secret(kept, true)),
            }
        }
    };
    let rotated = rotated.ok_or(ApiError::WebhookEndpointNotFound)?;
    Ok(with_secret(
        KeptAnswer {
            status: 200,
            body: view_value(&rotated),
            secret: Some(shown),
        },
        false,
    ))
}

/// A delivery attempt as the contract shows it.
fn attempt_view(attempt: &Attempt) -> AttemptView {
    AttemptView {
        attempt: attempt.attempt,
        recorded_at: attempt.recorded_at,
        duration_ms: u64::try_from(attempt.answer.duration.as_millis()).unwrap_or(u64::MAX),
        response_status: attempt.answer.status,
        error: attempt.answer.error.clone(),
        response_body: attempt.answer.body.clone(),
    }
}

/// A delivery as the contract shows it.
fn delivery_view(delivery: &Delivery) -> DeliveryView {
    DeliveryView {
        id: delivery.id,
        event_id: delivery.event.id.0,
        event_type: delivery.event.event_type,
        ticket_id: delivery.event.ticket_id.0,
        status: delivery.status.as_str().to_owned(),
        next_attempt_at: delivery.next_attempt_at,
        payload: serde_json::from_str(&delivery.event.payload()).unwrap_or(serde_json::Value::Null),
        attempts: delivery.attempts.iter().map(attempt_view).collect(),
        created_at: delivery.event.created_at,
    }
}

/// Listing deliveries.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveriesQuery {
    /// Deliveries older than this one (the `next_before` of the previous page).
    #[param(minimum = 1)]
    pub before: Option<i64>,
    /// Page size, 1 to 100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
}

/// The caller's endpoint `endpoint` (deleted or another account's: not found).
async fn own_endpoint(
    state: &AppState,
    caller: Caller,
    endpoint: Result<Path<String>, PathRejection>,
) -> Result<Endpoint, ApiError> {
    let Path(endpoint) = endpoint.map_err(|_| ApiError::WebhookEndpointNotFound)?;
    let id = Uuid::try_parse(&endpoint).map_err(|_| ApiError::WebhookEndpointNotFound)?;
    state
        .ledger()
        .endpoint(EndpointId(id))
        .await?
        .filter(|endpoint| endpoint.account_id == caller.0)
        .ok_or(ApiError::WebhookEndpointNotFound)
}

/// The endpoint's deliveries, newest first, each with its attempts and the receiver's
/// answers.
#[utoipa::path(
    get,
    path = "/v1/webhook-endpoints/{endpoint_id}/deliveries",
    tag = "webhooks",
    params(("endpoint_id" = Uuid, Path, description = "The endpoint"), DeliveriesQuery),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "A page of deliveries", body = DeliveriesPage),
        (status = 400, description = "Malformed query parameters", body = Problem, content_type = "application/problem+json"),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "No such endpoint, or another account's", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_deliveries(
    State(state): State<AppState>,
    caller: Caller,
    endpoint: Result<Path<String>, PathRejection>,
    query: Result<Query<DeliveriesQuery>, QueryRejection>,
) -> Result<Json<DeliveriesPage>, ApiError> {
    let endpoint = own_endpoint(&state, caller, endpoint).await?;
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be 1 to 100, got {limit}"
        )));
    }
    if query.before.is_some_and(|before| before < 1) {
        return Err(ApiError::BadRequest("before must be at least 1".into()));
    }
    let deliveries = state
        .ledger()
        .deliveries(endpoint.id, query.before, limit)
        .await?;
    let next_before = (deliveries.len() == limit as usize)
        .then(|| deliveries.last().map(|delivery| delivery.id))
        .flatten();
    Ok(Json(DeliveriesPage {
        deliveries: deliveries.iter().map(delivery_view).collect(),
        next_before,
    }))
}

/// Sends a delivery again now, by hand: one more attempt, whether it was delivered, ran
/// out of attempts or waits for a later one. The same event, the same `webhook-id`.
#[utoipa::path(
    post,
    path = "/v1/webhook-endpoints/{endpoint_id}/deliveries/{delivery_id}/retry",
    tag = "webhooks",
    params(
        ("endpoint_id" = Uuid, Path, description = "The endpoint"),
        ("delivery_id" = i64, Path, description = "The delivery", minimum = 1),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: a UUID of your choosing (bare or quoted) that makes the request happen once — the same key and request again answer the first answer and do nothing more; keys are per account, kept for PAYONCE_RETENTION"),
    ),
    security(("api_key" = [])),
    responses(
        (status = 202, description = "Queued: the next attempt is due now (a replay under its Idempotency-Key carries `Idempotent-Replayed: true` and queues nothing more)"),
        (status = 400, description = "A malformed or repeated Idempotency-Key (`idempotency-key-invalid`); nothing changed", body = Problem, content_type = "application/problem+json"),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "No such endpoint (or another account's), or no such delivery of it", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A worker is sending it right now (`delivery-in-flight`; retry after `Retry-After`), or the endpoint was disabled by a 410 (`webhook-endpoint-disabled`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The Idempotency-Key was used for another request (`idempotency-key-reuse`); nothing changed", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable; nothing changed", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn retry_delivery(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<(String, String)>, PathRejection>,
    key: Option<IdempotencyKey>,
) -> Result<Response, ApiError> {
    let Path((endpoint, delivery)) = path.map_err(|_| ApiError::WebhookEndpointNotFound)?;
    let endpoint = own_endpoint(&state, caller, Ok(Path(endpoint))).await?;
    let delivery: i64 = delivery
        .parse()
        .ok()
        .filter(|id| *id > 0)
        .ok_or(ApiError::DeliveryNotFound)?;
    let ledger = state.ledger();
    let retried = match key {
        None => ledger.retry_delivery(endpoint.id, delivery).await?,
        Some(IdempotencyKey(key)) => {
            let fingerprint = spends::fingerprint(
                &format!(
                    "/v1/webhook-endpoints/{}/deliveries/{delivery}/retry",
                    endpoint.id
                ),
                &(),
            );
            let key = RequestKey {
                account: endpoint.account_id,
                key: key.0,
                fingerprint: &fingerprint,
            };
            match ledger
                .retry_delivery_once(endpoint.id, delivery, &key)
                .await?
            {
                Keyed::Ran(retried) => retried,
                // The same answer as the first, with no body, and nothing sent again.
                Keyed::Replayed(_) => {
                    return Ok((
                        StatusCode::ACCEPTED,
                        [("idempotent-replayed", HeaderValue::from_static("true"))],
                    )
                        .into_response());
                }
            }
        }
    };
    match retried {
        Ok(()) => Ok(StatusCode::ACCEPTED.into_response()),
        Err(RetryRefused::NotFound) => Err(ApiError::DeliveryNotFound),
        Err(RetryRefused::InFlight) => Err(ApiError::DeliveryInFlight),
        Err(RetryRefused::EndpointDisabled) => Err(ApiError::WebhookEndpointDisabled),
    }
}

pub use payonce_types::webhooks::InboxView;

/// The embedded mode's demonstration inbox: a webhook receiver payonce hosts on a loopback
/// port of its own, so events can be seen arriving with nothing else running. The
/// requests come as payonce sent them — headers and body — for the account's own check of
/// their signatures with its secret. Only an instance in the embedded mode has one and
/// serves (and documents) this route.
#[utoipa::path(
    get,
    path = "/v1/accounts/{id}/webhook-inbox",
    tag = "webhooks",
    params(("id" = Uuid, Path, description = "The account")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The inbox's URL for the account, and what came", body = InboxView),
        (status = 401, response = Unauthenticated),
        (status = 403, response = OthersAccount),
        (status = 404, description = "No such account", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_inbox(
    State(state): State<AppState>,
    OwnAccount(account): OwnAccount,
) -> Result<Json<InboxView>, ApiError> {
    // Served only where there is one (`routes`).
    let inbox = state
        .webhooks()
        .and_then(|webhooks| webhooks.inbox())
        .ok_or_else(|| ApiError::NotFound("no such route".into()))?;
    let account = account.to_string();
    Ok(Json(InboxView {
        url: inbox.url_for(&account),
        received: inbox.received(&account),
    }))
}
