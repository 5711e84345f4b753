//! Traces, end to end: the real `payonce` binary, in the distributed mode, exports its
//! spans over OTLP/HTTP to a receiver in this test, which decodes the protobuf export as a
//! collector would. One withdrawal, sent with a W3C `traceparent`, arrives as a trace of
//! the caller's: the request's span the child of the caller's, the lock wait and the
//! ledger's apply children of the request, the group commit's batch linked to it — with
//! the ticket and account as attributes and no key anywhere. Its JSON log lines carry the
//! same trace id, and the webhook its outcome sends carries a `traceparent` of the
//! delivery attempt's span.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Backend, SendForJson, Shared};

/// The spans a receiver was sent.
type Received = Arc<Mutex<Vec<Span>>>;

/// An OTLP/HTTP receiver on a loopback port: `POST /v1/traces` with a protobuf
/// `ExportTraceServiceRequest`, answered with an empty export response.
async fn receiver() -> (String, Received) {
    let received = Received::default();
    let kept = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let kept = kept.clone();
            async move {
                let export = ExportTraceServiceRequest::decode(body).expect("an OTLP export");
                let spans = export
                    .resource_spans
                    .into_iter()
                    .flat_map(|resource| resource.scope_spans)
                    .flat_map(|scope| scope.spans);
                kept.lock().unwrap().extend(spans);
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}"), received)
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|attribute| attribute.key == key)
        .and_then(|attribute| attribute.value.as_ref()?.value.as_ref())
        .map(|value| match value {
            AnyValue::StringValue(text) => text.clone(),
            AnyValue::IntValue(number) => number.to_string(),
            AnyValue::BoolValue(flag) => flag.to_string(),
            other => format!("{other:?}"),
        })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Kills the child on drop, so a failing test leaves no server behind.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A webhook receiver on a loopback port that keeps the `traceparent` of each delivery.
async fn webhook_receiver() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        post(move |headers: axum::http::HeaderMap| {
            let kept = kept.clone();
            async move {
                let parent = headers
                    .get("traceparent")
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or("none")
                    .to_owned();
                kept.lock().unwrap().push(parent);
                StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}/hook"), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_withdrawal_is_one_trace_across_the_caller_and_payonce() {
    let (endpoint, received) = receiver().await;
    let (hook, deliveries) = webhook_receiver().await;
    let shared = Shared::new(Backend::Distributed).await;
    let port = lock::testing::free_port().unwrap();
    let logs = tempfile::NamedTempFile::new().unwrap();
    let _server = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_payonce"))
            .env("PAYONCE_ADDR", format!("127.0.0.1:{port}"))
            .env("DATABASE_URL", shared.database.url())
            .env("REDIS_URL", &shared.redis_url)
            .env("PAYONCE_REDIS_NAMESPACE", &shared.namespace)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            // Send batches often: the test waits for them.
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env("PAYONCE_LOG_FORMAT", "json")
            .env("RUST_LOG", "info,tower_http=debug")
            .env("PAYONCE_WEBHOOK_ALLOW_PRIVATE", "true")
            .env("PAYONCE_WEBHOOK_ALLOWED_NETWORKS", "127.0.0.0/8")
            .stdout(std::process::Stdio::null())
            .stderr(logs.reopen().unwrap())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let mut up = false;
    for _ in 0..300 {
        if client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_ok_and(|response| response.status() == StatusCode::OK)
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "payonce did not start");

    let account: Value = client
        .post(format!("{base}/v1/accounts"))
        .json(&json!({ "name": "traced", "balance": 100, "points": 0 }))
        .send_for_json()
        .await;
    let (id, key) = (
        account["id"].as_str().unwrap().to_owned(),
        account["api_key"].as_str().unwrap().to_owned(),
    );
    let ticket: Value = client
        .post(format!("{base}/v1/accounts/{id}/tickets"))
        .bearer_auth(&key)
        .send_for_json()
        .await;
    let ticket = ticket["ticket_id"].as_str().unwrap().to_owned();
    let subscribed = client
        .post(format!("{base}/v1/accounts/{id}/webhook-endpoints"))
        .bearer_auth(&key)
        .json(&json!({ "url": hook }))
        .send()
        .await
        .unwrap();
    assert_eq!(subscribed.status(), StatusCode::CREATED);
    // The caller's trace and span, as a client that traces sends them.
    let trace_id = format!("{:032x}", rand::random::<u128>() | 1);
    let caller_span = format!("{:016x}", rand::random::<u64>() | 1);
    let withdrawn = client
        .post(format!("{base}/v1/accounts/{id}/withdrawals"))
        .bearer_auth(&key)
        .header("idempotency-key", &ticket)
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .json(&json!({ "amount": 30 }))
        .send()
        .await
        .unwrap();
    assert_eq!(withdrawn.status(), StatusCode::CREATED);

    // The request's, the lock wait's, the apply's and the commit's spans, and the batch's.
    let mut ours = Vec::new();
    for _ in 0..100 {
        ours = received
            .lock()
            .unwrap()
            .iter()
            .filter(|span| hex(&span.trace_id) == trace_id)
            .cloned()
            .collect();
        let batch_seen = received.lock().unwrap().iter().any(|span| {
            span.name == "ledger.batch"
                && span
                    .links
                    .iter()
                    .any(|link| hex(&link.trace_id) == trace_id)
        });
        if ours.iter().any(|span| span.name.starts_with("POST "))
            && ours.iter().any(|span| span.name == "ledger.apply")
            && batch_seen
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let named = |name: &str| {
        ours.iter()
            .find(|span| span.name == name)
            .unwrap_or_else(|| panic!("no {name} span in {:#?}", ours))
            .clone()
    };
    let request = named("POST /v1/accounts/{id}/withdrawals");
    assert_eq!(
        hex(&request.parent_span_id),
        caller_span,
        "the caller's span is the parent"
    );
    assert_eq!(
        attribute(&request, "http.route").as_deref(),
        Some("/v1/accounts/{id}/withdrawals")
    );
    assert_eq!(
        attribute(&request, "http.response.status_code").as_deref(),
        Some("201")
    );
    assert_eq!(
        attribute(&request, "ticket_id").as_deref(),
        Some(ticket.as_str())
    );
    assert_eq!(
        attribute(&request, "account_id").as_deref(),
        Some(id.as_str())
    );
    let lock_wait = named("lock.wait");
    assert_eq!(
        lock_wait.parent_span_id, request.span_id,
        "lock.wait under the request"
    );
    assert_eq!(
        attribute(&lock_wait, "lock.key").as_deref(),
        Some(format!("lock:account:{id}").as_str())
    );
    let token = attribute(&lock_wait, "lock.fencing_token").expect("the token granted");
    let apply = named("ledger.apply");
    assert_eq!(
        apply.parent_span_id, request.span_id,
        "ledger.apply under the request"
    );
    assert_eq!(attribute(&apply, "fencing_token"), Some(token));
    let batch = received
        .lock()
        .unwrap()
        .iter()
        .find(|span| {
            span.name == "ledger.batch"
                && span
                    .links
                    .iter()
                    .any(|link| hex(&link.trace_id) == trace_id && link.span_id == apply.span_id)
        })
        .cloned()
        .expect("the group commit's batch, linked to the apply");
    assert!(
        batch.parent_span_id.is_empty(),
        "a batch is a root of its own"
    );
    assert!(attribute(&batch, "batch.size").is_some());
    // Nothing secret in any span.
    for span in received.lock().unwrap().iter() {
        for attribute in &span.attributes {
            let value = format!("{:?}", attribute.value);
            assert!(!value.contains(&key), "{} carries the API key", span.name);
        }
    }
    // The JSON log lines of the request carry its trace id.
    let lines = std::fs::read_to_string(logs.path()).unwrap();
    let traced: Vec<Value> = lines
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["trace_id"] == trace_id.as_str())
        .collect();
    assert!(!traced.is_empty(), "no log line of the trace in:\n{lines}");
    assert!(
        traced
            .iter()
            .all(|line| line["span_id"].as_str().is_some_and(|id| id.len() == 16))
    );
    // The withdrawal's webhook went out with the W3C trace context of its attempt's span.
    let mut parent = None;
    for _ in 0..100 {
        parent = deliveries.lock().unwrap().first().cloned();
        let attempt_seen = received
            .lock()
            .unwrap()
            .iter()
            .any(|span| span.name == "webhook.attempt");
        if parent.is_some() && attempt_seen {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let parent = parent.expect("the webhook was delivered");
    let parts: Vec<&str> = parent.split('-').collect();
    assert_eq!(parts.len(), 4, "a traceparent, not {parent:?}");
    let attempt = received
        .lock()
        .unwrap()
        .iter()
        .find(|span| span.name == "webhook.attempt")
        .cloned()
        .expect("the delivery attempt's span");
    assert_eq!(
        (parts[1], parts[2]),
        (
            hex(&attempt.trace_id).as_str(),
            hex(&attempt.span_id).as_str()
        ),
        "the receiver can continue the attempt's trace"
    );
}
