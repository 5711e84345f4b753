//! The router: every route, its OpenAPI description (from the same handlers, so the two
//! cannot drift apart), and the layers around them.

pub mod accounts;
pub mod holds;
pub mod orders;
pub mod payouts;
pub mod responses;
pub mod service;
pub mod spends;
pub mod tickets;
pub mod webhooks;

use std::collections::BTreeMap;
use std::time::Duration;

use axum::BoxError;
use axum::Router;
use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::http::{HeaderName, Request, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tower::ServiceBuilder;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, EXPLANATIONS, PROBLEM_JSON, Problem};
use crate::metrics;
use crate::state::AppState;

/// Bodies above this are refused with 413.
pub const BODY_LIMIT: usize = 16 * 1024;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "payonce",
        description = "An idempotent payment service: take a ticket, spend it once. \
                       Errors are RFC 9457 problem+json; see /problems/{name}."
    ),
    components(
        schemas(Problem),
        responses(
            responses::Unauthenticated,
            responses::OthersAccount,
            responses::NotAnAccount,
            responses::NoSuchTicket,
            responses::TicketGone,
            responses::BodyTooLarge,
            responses::NotJson,
            responses::MalformedSpend,
            responses::MalformedCreate,
        )
    ),
    modifiers(&BearerKey),
    tags(
        (name = "accounts", description = "Accounts, their keys and their ledger entries"),
        (name = "tickets", description = "Tickets: the idempotency keys of spends"),
        (name = "spends", description = "Withdrawals, deposits and lottery draws, each sent with a ticket"),
        (name = "orders", description = "Orders, each paid once whatever the ticket, and refunded never beyond what was paid: the lock is the order's"),
        (name = "holds", description = "Money set aside, then captured once, voided once or expired once; refunds of a capture never beyond it: the lock is the hold's"),
        (name = "payouts", description = "Money sent to an outside bank, exactly once: debited with a ticket, sent after the commit with one idempotency key for every attempt"),
        (name = "webhooks", description = "Events pushed to the account's endpoints: one per committed outcome, signed as the Standard Webhooks specification has it, retried until delivered"),
        (name = "service", description = "Health, readiness, metrics and documentation"),
    )
)]
struct ApiDoc;

/// The bearer schemes: `api_key`, which the account endpoints require, and
/// `operator_key`, which creating money requires where the instance has one.
struct BearerKey;

impl Modify for BearerKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
        components.add_security_scheme(
            "operator_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "PAYONCE_OPERATOR_KEY, on an instance that sets it: needed to open an account with a balance or points above zero, and for every deposit (instead of the account's key). Unset, neither needs it.",
                    ))
                    .build(),
            ),
        );
    }
}

/// What the server enforces on parameters that the handlers' annotations cannot say:
/// `Idempotency-Key` is a hyphenated UUID, bare or quoted; a problem's name is one of
/// those the server explains (taken from the same table the server answers from); a
/// payout's `Payonce-Bank-Fault` is one of the faults the bank crate knows (the list the
/// server parses it with) — and is no parameter at all of an instance whose bank takes no
/// faults, which refuses it. That
/// every operation that takes a key may answer 429: an unknown key spends the client's
/// allowance of bad keys (`crate::auth`). And what every answer of a kind carries: 409,
/// 429 and 503 say when to retry (`Retry-After`, as
/// [`crate::error::ApiError::retry_after`] sets it).
struct Enforced {
    /// Whether this instance's bank is the in-process demonstration, which takes a
    /// payout's fault.
    bank_takes_faults: bool,
}

impl Modify for Enforced {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let key = ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(crate::extract::IDEMPOTENCY_KEY_PATTERN))
            .build();
        let names = ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(EXPLANATIONS.iter().map(|(name, _, _)| *name)))
            .build();
        let faults = ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(crate::bank_fault::names()))
            .build();
        let retry_after = HeaderBuilder::new()
            .schema(Some(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(1))
                    .build(),
            ))
            .description(Some("Seconds to wait before retrying."))
            .build();
        for (path, item) in openapi.paths.paths.iter_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for operation in operations.into_iter().flatten() {
                if operation
                    .security
                    .as_ref()
                    .is_some_and(|alternatives| !alternatives.is_empty())
                {
                    bad_keys_may_be_limited(&mut operation.responses.responses);
                }
                for (status, response) in &mut operation.responses.responses {
                    if let ("409" | "429" | "503", RefOr::T(response)) = (status.as_str(), response)
                    {
                        response
                            .headers
                            .insert("Retry-After".to_owned(), retry_after.clone().into());
                    }
                }
                if !self.bank_takes_faults
                    && let Some(parameters) = &mut operation.parameters
                {
                    parameters.retain(|parameter| {
                        !matches!(parameter, RefOr::T(parameter) if parameter.name == "Payonce-Bank-Fault")
                    });
                }
                let parameters = operation.parameters.iter_mut().flatten();
                for parameter in parameters.filter_map(|parameter| match parameter {
                    RefOr::T(parameter) => Some(parameter),
                    RefOr::Ref(_) => None,
                }) {
                    if parameter.name == "Idempotency-Key" {
                        parameter.schema = Some(Schema::Object(key.clone()).into());
                    } else if parameter.name == "Payonce-Bank-Fault" {
                        parameter.schema = Some(Schema::Object(faults.clone()).into());
                    } else if path == "/problems/{name}" && parameter.name == "name" {
                        parameter.schema = Some(Schema::Object(names.clone()).into());
                    }
                }
            }
        }
    }
}

/// Says in an operation's 429 answer that too many bad keys from the client get it too:
/// appended to the operation's own 429, or a 429 of its own where it has none.
fn bad_keys_may_be_limited(responses: &mut BTreeMap<String, RefOr<utoipa::openapi::Response>>) {
    const ALSO: &str = "or unknown or wrong keys from this client address past PAYONCE_BAD_KEYS_PER_MINUTE, refused before the key is looked up; nothing stored";
    const ALONE: &str = "Unknown or wrong keys from this client address past PAYONCE_BAD_KEYS_PER_MINUTE, refused before the key is looked up; nothing stored — retry after `Retry-After` seconds";
    match responses.get_mut("429") {
        Some(RefOr::T(limited)) => {
            limited.description = format!("{} — {ALSO}", limited.description);
        }
        Some(RefOr::Ref(_)) => {}
        None => {
            let problem = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build();
            let limited = ResponseBuilder::new()
                .description(ALONE)
                .content(PROBLEM_JSON, problem)
                .build();
            responses.insert("429".to_owned(), RefOr::T(limited));
        }
    }
}

/// The routes and their OpenAPI document — for an instance whose bank takes a payout's
/// demonstration fault or not (`crate::bank_fault`), and that hosts the demonstration's
/// webhook inbox or not (the embedded mode): an instance without one neither serves nor
/// documents its route.
pub fn routes(
    bank_takes_faults: bool,
    hosts_inbox: bool,
) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let mut routes = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(accounts::create_account))
        .routes(routes!(accounts::get_account))
        .routes(routes!(accounts::list_entries))
        .routes(routes!(tickets::issue_ticket))
        .routes(routes!(tickets::get_ticket))
        .routes(routes!(spends::withdraw))
        .routes(routes!(spends::deposit))
        .routes(routes!(spends::draw))
        .routes(routes!(orders::create_order))
        .routes(routes!(orders::get_order))
        .routes(routes!(orders::pay_order))
        .routes(routes!(holds::refund_order))
        .routes(routes!(holds::place_hold))
        .routes(routes!(holds::get_hold))
        .routes(routes!(holds::capture_hold))
        .routes(routes!(holds::void_hold))
        .routes(routes!(holds::refund_hold))
        .routes(routes!(payouts::send_payout))
        .routes(routes!(payouts::get_payout))
        .routes(routes!(payouts::get_payout_at_bank))
        .routes(routes!(payouts::list_payouts))
        .routes(routes!(webhooks::create_endpoint, webhooks::list_endpoints))
        .routes(routes!(webhooks::delete_endpoint))
        .routes(routes!(webhooks::rotate_secret))
        .routes(routes!(webhooks::list_deliveries))
        .routes(routes!(webhooks::retry_delivery))
        .routes(routes!(service::healthz))
        .routes(routes!(service::readyz))
        .routes(routes!(service::metrics))
        .routes(routes!(service::explain_problem))
        .routes(routes!(service::index));
    if hosts_inbox {
        routes = routes.routes(routes!(webhooks::get_inbox));
    }
    let (router, mut openapi) = routes.split_for_parts();
    // After the routes are in: the document's modifiers run before there are any paths.
    Enforced { bank_takes_faults }.modify(&mut openapi);
    #[cfg(feature = "demo")]
    crate::demo::document(&mut openapi);
    (router, openapi)
}

/// The whole application: routes, `/openapi.json`, `/`, and the layers.
pub fn app(state: AppState, request_timeout: Duration) -> Router {
    let bank_takes_faults = state
        .payouts()
        .is_some_and(|payouts| payouts.first_attempt_faults().is_some());
    let hosts_inbox = state
        .webhooks()
        .is_some_and(|webhooks| webhooks.inbox().is_some());
    let (routes, openapi) = routes(bank_takes_faults, hosts_inbox);
    let openapi = openapi.to_pretty_json().unwrap_or_else(|error| {
        tracing::error!(%error, "cannot render the OpenAPI document");
        "{}".to_owned()
    });
    let instance = state.settings().instance.clone();
    let max_in_flight = state.settings().max_in_flight;
    let track = middleware::from_fn_with_state(state.shared_metrics(), metrics::track);
    routes
        .route(
            "/openapi.json",
            get(move || async move { ([(header::CONTENT_TYPE, "application/json")], openapi) }),
        )
        .fallback(|| async { ApiError::NotFound("no such resource".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(middleware::from_fn(metrics::label_route))
        .with_state(state)
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
                .layer(
                    TraceLayer::new_for_http()
                        .make_span_with(request_span)
                        .on_response(|response: &Response, _: Duration, span: &tracing::Span| {
                            span.record("http.response.status_code", response.status().as_u16());
                        }),
                )
                .layer(PropagateRequestIdLayer::x_request_id())
                .layer(SetResponseHeaderLayer::overriding(
                    HeaderName::from_static("payonce-instance"),
                    instance,
                ))
                .layer(middleware::map_response(problems_for_bare_errors))
                .layer(track)
                // Past the in-flight cap a request is refused at once (503 overloaded)
                // rather than queued: a queue would only add latency to a backlog.
                .layer(HandleErrorLayer::new(|_: BoxError| async {
                    ApiError::Overloaded
                }))
                .layer(LoadShedLayer::new())
                .layer(GlobalConcurrencyLimitLayer::new(max_in_flight))
                .layer(CatchPanicLayer::new())
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::SERVICE_UNAVAILABLE,
                    request_timeout,
                ))
                .layer(RequestBodyLimitLayer::new(BODY_LIMIT)),
        )
}

/// A request's span, by OpenTelemetry's conventions for an HTTP server span: named by
/// its method until the router names its route (`metrics::label_route` records
/// `http.route`), the child of the `traceparent` the request carries if any. The path,
/// never the query or a header: nothing secret goes into a span.
fn request_span(request: &Request<Body>) -> tracing::Span {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|id| id.to_str().ok())
        .unwrap_or_default();
    let method = request.method().as_str();
    let span = tracing::info_span!(
        "request",
        otel.name = method,
        otel.kind = "server",
        http.request.method = method,
        url.path = request.uri().path(),
        http.route = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        request_id = id,
        ticket_id = tracing::field::Empty,
        account_id = tracing::field::Empty,
    );
    let _ = span.set_parent(crate::telemetry::incoming_context(request.headers()));
    span
}

/// Layers answer some errors themselves (413 from the body limit, 503 from the timeout,
/// 500 from a caught panic) with plain bodies; give them the API's problem+json form.
async fn problems_for_bare_errors<B>(response: axum::http::Response<B>) -> Response
where
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let response = response.map(Body::new);
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let error = match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge,
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::REQUEST_TIMEOUT => ApiError::Timeout,
        StatusCode::NOT_FOUND => ApiError::NotFound("no such resource".into()),
        StatusCode::METHOD_NOT_ALLOWED => ApiError::MethodNotAllowed,
        StatusCode::INTERNAL_SERVER_ERROR => ApiError::Internal("a handler panicked".into()),
        other => {
            let mut answer =
                ApiError::BadRequest(other.canonical_reason().unwrap_or("error").to_owned())
                    .into_response();
            *answer.status_mut() = other;
            return answer;
        }
    };
    let mut answer = error.into_response();
    if let Some(allow) = response.headers().get(header::ALLOW) {
        answer.headers_mut().insert(header::ALLOW, allow.clone());
    }
    answer
}
