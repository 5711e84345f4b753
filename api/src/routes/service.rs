//! The service's own endpoints: liveness, readiness, metrics, the OpenAPI document, the
//! problem explanations and the web page.

use std::sync::LazyLock;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, json};
use sha2::{Digest, Sha256};

use crate::error::{EXPLANATIONS, PROBLEM_JSON, Problem, problem, problem_with};
use crate::state::AppState;

pub use payonce_types::service::{Health, Readiness};

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "service", responses((status = 200, description = "Alive", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
    })
}

/// Ready to serve: the database and the lock store both answer (within 2 s each).
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "service",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "The database or the lock store does not answer", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn readyz(State(state): State<AppState>) -> Response {
    let (database, lock_store) = probe(&state).await;
    let describe = |check: &Result<(), String>| match check {
        Ok(()) => "ok".to_owned(),
        Err(_) => "unavailable".to_owned(),
    };
    if database.is_ok() && lock_store.is_ok() {
        return Json(Readiness {
            status: "ready".to_owned(),
            database: describe(&database),
            lock_store: describe(&lock_store),
        })
        .into_response();
    }
    // The causes go to the log, not to whoever polls readiness.
    tracing::warn!(?database, ?lock_store, "not ready");
    let mut extra = Map::new();
    extra.insert("database".into(), json!(describe(&database)));
    extra.insert("lock_store".into(), json!(describe(&lock_store)));
    let detail = "the database or the lock store does not answer";
    let body = problem_with(
        &problem(StatusCode::SERVICE_UNAVAILABLE, "not-ready", detail),
        extra,
    );
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON)),
            (header::RETRY_AFTER, HeaderValue::from(1)),
        ],
        Json(body),
    )
        .into_response()
}

/// How long a probe or a scrape's count waits for an answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// `asked`'s answer within [`ANSWER_WITHIN`], or why there is none.
async fn within<T, E: std::fmt::Display>(
    asked: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(ANSWER_WITHIN, asked).await {
        Ok(answer) => answer.map_err(|error| error.to_string()),
        Err(_) => Err("no answer within 2s".to_owned()),
    }
}

/// Whether the database and the lock store answer, each within 2 s: `Err` says why not.
/// Readiness answers from it, and each scrape of the metrics records it.
async fn probe(state: &AppState) -> (Result<(), String>, Result<(), String>) {
    tokio::join!(within(state.ledger().ping()), within(state.locks().ping()))
}

/// The pending payouts, the holds held and the undelivered webhook deliveries, counted for
/// a scrape: an instance nobody scrapes asks the database nothing. Each is counted on a
/// partial index of the open work, cheap however much is finished. Left as last counted when the
/// database cannot say.
async fn count_backlogs(state: &AppState) {
    if state.payouts().is_some() {
        match within(state.ledger().pending_payouts()).await {
            Ok((pending, oldest)) => state.metrics().pending_payouts(pending, age(oldest)),
            Err(error) => tracing::debug!(%error, "cannot count payouts"),
        }
    }
    match within(state.ledger().hold_counts()).await {
        Ok(counts) => state.metrics().hold_counts(counts),
        Err(error) => tracing::debug!(%error, "cannot count holds"),
    }
    if state.webhooks().is_some() {
        match within(state.ledger().webhook_backlog()).await {
            Ok(backlog) => state
                .metrics()
                .webhook_backlog(backlog.pending, age(backlog.oldest_pending)),
            Err(error) => tracing::debug!(%error, "cannot count webhook deliveries"),
        }
    }
}

/// How long ago `since` was; zero for none (nothing waiting).
fn age(since: Option<time::OffsetDateTime>) -> Duration {
    since.map_or(Duration::ZERO, |at| {
        (time::OffsetDateTime::now_utc() - at)
            .try_into()
            .unwrap_or_default()
    })
}

/// Prometheus metrics: OpenMetrics text for a scraper that asks for it, the classic
/// Prometheus text format otherwise. Each scrape first asks the database and the lock
/// store whether they answer (`payonce_dependency_up`), as readiness does, and counts the
/// payouts and deliveries waiting.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "service",
    responses((status = 200, description = "The classic Prometheus text format, or OpenMetrics text when the Accept header asks for application/openmetrics-text", content(
        (String = "text/plain"),
        (String = "application/openmetrics-text"),
    )))
)]
pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let (database, lock_store) = probe(&state).await;
    state.metrics().dependency("database", database.is_ok());
    state.metrics().dependency("lock_store", lock_store.is_ok());
    if let Some(batches) = state.ledger().batches() {
        state.metrics().batch_sizes(batches.counts());
    }
    if database.is_ok() {
        count_backlogs(&state).await;
    }
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("application/openmetrics-text"));
    if openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            state.metrics().render(),
        )
            .into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            state.metrics().render_prometheus(),
        )
            .into_response()
    }
}

/// What a problem type means: the `type` URI of every error body points here.
#[utoipa::path(
    get,
    path = "/problems/{name}",
    tag = "service",
    params(("name" = String, Path, description = "The problem's name")),
    responses(
        (status = 200, description = "Its explanation", body = String, content_type = "text/plain"),
        (status = 404, description = "No such problem", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn explain_problem(Path(name): Path<String>) -> Response {
    match EXPLANATIONS.iter().find(|(known, _, _)| *known == name) {
        Some((name, status, text)) => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("{name} ({status})\n\n{text}\n"),
        )
            .into_response(),
        None => {
            crate::error::ApiError::NotFound(format!("no problem named {name:?}")).into_response()
        }
    }
}

/// The web page: open an account, spend with tickets, replay, burst and race, and watch
/// the ledger. One self-contained HTML file compiled into the binary.
const PAGE: &str = include_str!("../../web/index.html");

/// The page's `Content-Security-Policy`: its own inline stylesheet and script, allowed by
/// their SHA-256 hashes (computed once, from the embedded HTML, so they cannot drift from
/// it), requests to this origin only, and nothing else — no outside network, no frames, no
/// form posts, no `<base>`.
static PAGE_POLICY: LazyLock<HeaderValue> = LazyLock::new(|| {
    let policy = format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src data:; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        inline_hashes(PAGE, "script").join(" "),
        inline_hashes(PAGE, "style").join(" "),
    );
    HeaderValue::from_str(&policy).unwrap_or_else(|error| {
        tracing::error!(%error, "the web page's policy is not a header value");
        HeaderValue::from_static("default-src 'none'")
    })
});

/// The CSP source expressions (`'sha256-…'`) of every inline `<tag>…</tag>` block in `html`.
fn inline_hashes(html: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}"), format!("</{tag}>"));
    let mut hashes = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(tag_end) = after.find('>') else {
            break;
        };
        let attributes = &after[..tag_end];
        let content = &after[tag_end + 1..];
        let Some(end) = content.find(&close) else {
            break;
        };
        // `<tag>` or `<tag attributes>`, not `<tagger>`; a script with `src` is not inline.
        let whole_tag = attributes.is_empty() || attributes.starts_with(char::is_whitespace);
        if whole_tag && !attributes.contains("src=") {
            let digest = Sha256::digest(&content.as_bytes()[..end]);
            hashes.push(format!("'sha256-{}'", STANDARD.encode(digest)));
        }
        rest = &content[end + close.len()..];
    }
    hashes
}

/// The web page, with a content security policy that allows only its own inline style and
/// script and requests to this origin.
#[utoipa::path(
    get,
    path = "/",
    tag = "service",
    responses((status = 200, description = "The web page", body = String, content_type = "text/html"))
)]
pub async fn index() -> Response {
    (
        [
            (header::CONTENT_SECURITY_POLICY, PAGE_POLICY.clone()),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
        ],
        Html(PAGE),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_hashes_each_inline_block() {
        let html = "<style>a{}</style><script src=\"x.js\"></script><script>go()</script><scripts>";
        assert_eq!(inline_hashes(html, "style").len(), 1);
        assert_eq!(
            inline_hashes(html, "script"),
            [format!(
                "'sha256-{}'",
                STANDARD.encode(Sha256::digest(b"go()"))
            )]
        );
        let policy = PAGE_POLICY.to_str().unwrap();
        assert_eq!(policy.matches("'sha256-").count(), 2, "{policy}");
    }
}
