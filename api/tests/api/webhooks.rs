//! Webhooks against a real receiver (an HTTP server on a loopback port of the test's
//! own): each committed outcome's event arrives signed as the Standard Webhooks
//! specification has it — checked with its reference library, in Rust here and in Python
//! (`webhooks_reference`) — is retried on the schedule, honours `Retry-After`, stops at a
//! 410, survives a secret rotation; endpoints refuse URLs the SSRF guard refuses.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::response::IntoResponse;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    Backend, Shared, TestAccount, TestApp, assert_invalid_request, assert_problem, read,
    spawn_app_with, spawn_with,
};

/// One request the receiver got.
#[derive(Clone, Debug)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: String,
    pub at: Instant,
}

impl Received {
    pub fn id(&self) -> &str {
        self.headers["webhook-id"].to_str().unwrap()
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

#[derive(Default)]
struct Inbox {
    received: Vec<Received>,
    /// Answers to give, in order; once empty, 204.
    script: VecDeque<(u16, Option<u64>)>,
}

/// A receiver on a loopback port: records every request and answers as scripted.
#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    inbox: Arc<Mutex<Inbox>>,
}

async fn receive(
    State(inbox): State<Arc<Mutex<Inbox>>>,
    headers: HeaderMap,
    body: String,
) -> axum::response::Response {
    let mut inbox = inbox.lock().unwrap();
    inbox.received.push(Received {
        headers,
        body,
        at: Instant::now(),
    });
    let (status, retry_after) = inbox.script.pop_front().unwrap_or((204, None));
    let status = AxumStatus::from_u16(status).unwrap();
    match retry_after {
        Some(seconds) => (status, [("retry-after", seconds.to_string())], "busy").into_response(),
        None => (status, "thanks").into_response(),
    }
}

impl Receiver {
    pub async fn start() -> Self {
        let inbox = Arc::new(Mutex::new(Inbox::default()));
        let app = axum::Router::new()
            .route("/hooks", axum::routing::post(receive))
            .with_state(Arc::clone(&inbox));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, inbox }
    }

    /// The next answers, in order: a status and a `Retry-After`.
    pub fn answer(&self, answers: &[(u16, Option<u64>)]) {
        self.inbox
            .lock()
            .unwrap()
            .script
            .extend(answers.iter().copied());
    }

    pub fn received(&self) -> Vec<Received> {
        self.inbox.lock().unwrap().received.clone()
    }

    /// Waits (at most 20 s) until `count` requests came.
    pub async fn until(&self, count: usize) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let received = self.received();
            if received.len() >= count {
                return received;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {count} deliveries came: {received:#?}",
                received.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// An instance that may deliver to loopback, with `extra` flags.
async fn spawn(backend: Backend, extra: &[&str]) -> TestApp {
    let mut flags = vec!["--webhook-allow-private"];
    flags.extend_from_slice(extra);
    spawn_app_with(backend, &flags).await
}

/// Creates an endpoint; its id and secret.
pub async fn create_endpoint(
    app: &TestApp,
    account: &TestAccount,
    url: &str,
    events: Option<&[&str]>,
) -> (String, String) {
    let mut body = json!({ "url": url });
    if let Some(events) = events {
        body["events"] = json!(events);
    }
    let response = app
        .client
        .post(app.url(&format!("/v1/accounts/{}/webhook-endpoints", account.id)))
        .bearer_auth(&account.key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let (status, _, body) = read(response).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    (
        body["id"].as_str().unwrap().to_owned(),
        body["secret"].as_str().unwrap().to_owned(),
    )
}

/// The account's endpoints, as `GET /v1/accounts/{id}/webhook-endpoints` lists them.
async fn endpoints(app: &TestApp, account: &TestAccount) -> Value {
    app.get_json(
        &account.key,
        &format!("/v1/accounts/{}/webhook-endpoints", account.id),
    )
    .await
}

/// Rotates the endpoint's secret; the answer.
async fn rotate(app: &TestApp, account: &TestAccount, endpoint: &str) -> reqwest::Response {
    app.client
        .post(app.url(&format!(
            "/v1/accounts/{}/webhook-endpoints/{endpoint}/rotate-secret",
            account.id
        )))
        .bearer_auth(&account.key)
        .send()
        .await
        .unwrap()
}

/// Sends a delivery again by hand; the answer.
async fn retry_by_hand(
    app: &TestApp,
    account: &TestAccount,
    endpoint: &str,
    delivery: impl std::fmt::Display,
) -> reqwest::Response {
    app.client
        .post(app.url(&format!(
            "/v1/webhook-endpoints/{endpoint}/deliveries/{delivery}/retry"
        )))
        .bearer_auth(&account.key)
        .send()
        .await
        .unwrap()
}

async fn deliveries(app: &TestApp, account: &TestAccount, endpoint: &str) -> Vec<Value> {
    let response = app
        .get_as(
            &account.key,
            &format!("/v1/webhook-endpoints/{endpoint}/deliveries"),
        )
        .await;
    let (status, _, body) = read(response).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["deliveries"].as_array().unwrap().clone()
}

/// Waits until every delivery of `endpoint` is in `status`.
async fn until_all(
    app: &TestApp,
    account: &TestAccount,
    endpoint: &str,
    status: &str,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = deliveries(app, account, endpoint).await;
        if !listed.is_empty() && listed.iter().all(|d| d["status"] == status) {
            return listed;
        }
        assert!(Instant::now() < deadline, "not all {status}: {listed:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn verify(secret: &str, received: &Received) -> Result<(), standardwebhooks::WebhookError> {
    standardwebhooks::Webhook::new(secret)?.verify(received.body.as_bytes(), &received.headers)
}

/// Every committed outcome arrives once, signed so that the specification's reference
/// library accepts it, carrying the outcome as the ticket stores it; a replay and a
/// refusal before execution send nothing; an endpoint gets only the types it asked for.
pub async fn committed_outcomes_arrive_signed_and_replays_send_nothing(backend: Backend) {
    let app = spawn(backend, &[]).await;
    let receiver = Receiver::start().await;
    let account = app.create_account(1000, 0).await;
    let (endpoint, secret) = create_endpoint(&app, &account, &receiver.url, None).await;
    let refusals = Receiver::start().await;
    create_endpoint(&app, &account, &refusals.url, Some(&["withdrawal.refused"])).await;

    let ticket = app.ticket(&account).await;
    let (status, _, executed) = read(app.withdraw(&account, &ticket, 300).await).await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, replayed, _) = read(app.withdraw(&account, &ticket, 300).await).await;
    assert!(replayed);
    let refused_ticket = app.ticket(&account).await;
    let (status, _, refused) = read(app.withdraw(&account, &refused_ticket, 5000).await).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    // Refused before execution (422: malformed): nothing committed, nothing sent.
    let unused = app.ticket(&account).await;
    let response = app.withdraw(&account, &unused, -5).await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);

    let got = receiver.until(2).await;
    refusals.until(1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got_all = receiver.received();
    assert_eq!(got_all.len(), 2, "{got_all:#?}");
    assert_eq!(refusals.received().len(), 1);
    for received in &got {
        verify(&secret, received).expect("the reference library accepts the signature");
        assert!(
            received.headers["webhook-signature"]
                .to_str()
                .unwrap()
                .starts_with("v1,")
        );
        assert_eq!(received.headers["content-type"], "application/json");
        let event = received.json();
        let (kind, ticket_id, stored) = if event["type"] == "withdrawal.succeeded" {
            ("withdrawal.succeeded", &ticket, &executed)
        } else {
            ("withdrawal.refused", &refused_ticket, &refused)
        };
        assert_eq!(event["type"], kind);
        assert_eq!(event["data"]["account_id"], account.id.as_str());
        assert_eq!(event["data"]["ticket_id"], ticket_id.as_str());
        assert_eq!(event["data"]["outcome"]["body"], *stored);
        assert!(event["timestamp"].is_string());
    }
    let kinds: Vec<String> = got
        .iter()
        .map(|r| r.json()["type"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        kinds.contains(&"withdrawal.succeeded".to_owned())
            && kinds.contains(&"withdrawal.refused".to_owned())
    );
    assert_eq!(refusals.received()[0].json()["type"], "withdrawal.refused");
    assert_eq!(
        refusals.received()[0].id(),
        got.iter()
            .find(|r| r.json()["type"] == "withdrawal.refused")
            .unwrap()
            .id(),
        "one event, one webhook-id, for every endpoint"
    );

    let listed = until_all(&app, &account, &endpoint, "delivered").await;
    assert_eq!(listed.len(), 2);
    for delivery in &listed {
        assert_eq!(delivery["attempts"].as_array().unwrap().len(), 1);
        assert_eq!(delivery["attempts"][0]["response_status"], 204);
        assert!(
            got.iter()
                .any(|r| r.id() == delivery["event_id"].as_str().unwrap())
        );
    }
    app.assert_audit_clean().await;
}

/// A receiver that fails is sent the same event again — the same `webhook-id` — on the
/// schedule, until it runs out (exhausted); sent again by hand, it is delivered.
pub async fn failures_retry_on_the_schedule_then_exhaust_and_a_retry_by_hand_delivers(
    backend: Backend,
) {
    let app = spawn(backend, &["--webhook-retry-schedule", "100ms,200ms"]).await;
    let receiver = Receiver::start().await;
    receiver.answer(&[(500, None), (400, None), (500, None)]);
    let account = app.create_account(1000, 0).await;
    let (endpoint, secret) = create_endpoint(&app, &account, &receiver.url, None).await;
    assert_eq!(
        app.withdraw_with_a_new_ticket(&account, 10).await,
        StatusCode::CREATED
    );

    let got = receiver.until(3).await;
    assert!(
        got.iter()
            .all(|r| r.id() == got[0].id() && r.body == got[0].body)
    );
    assert!(got.iter().all(|r| verify(&secret, r).is_ok()));
    assert!(got[1].at - got[0].at >= Duration::from_millis(100));
    assert!(got[2].at - got[1].at >= Duration::from_millis(200));
    let listed = until_all(&app, &account, &endpoint, "exhausted").await;
    let statuses: Vec<&Value> = listed[0]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["response_status"])
        .collect();
    assert_eq!(statuses, [&json!(500), &json!(400), &json!(500)]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        receiver.received().len(),
        3,
        "no attempt after the schedule ran out"
    );

    let delivery = listed[0]["id"].as_i64().unwrap();
    let retry = retry_by_hand(&app, &account, &endpoint, delivery).await;
    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    let got = receiver.until(4).await;
    assert_eq!(got[3].id(), got[0].id());
    let listed = until_all(&app, &account, &endpoint, "delivered").await;
    assert_eq!(listed[0]["attempts"].as_array().unwrap().len(), 4);

    let missing = retry_by_hand(&app, &account, &endpoint, 999_999).await;
    assert_problem(missing, StatusCode::NOT_FOUND, "delivery-not-found").await;
    let other = app.create_account(0, 0).await;
    let foreign = app
        .get_as(
            &other.key,
            &format!("/v1/webhook-endpoints/{endpoint}/deliveries"),
        )
        .await;
    assert_problem(foreign, StatusCode::NOT_FOUND, "webhook-endpoint-not-found").await;
}

/// A 503 with `Retry-After` waits as long as the receiver asked; a 410 disables the
/// endpoint: nothing more is sent to it, and nothing of it is sent again by hand.
pub async fn retry_after_is_honoured_and_gone_disables_the_endpoint(backend: Backend) {
    let app = spawn(backend, &["--webhook-retry-schedule", "50ms,50ms,50ms"]).await;
    let receiver = Receiver::start().await;
    receiver.answer(&[(503, Some(1)), (410, None)]);
    let account = app.create_account(1000, 0).await;
    let (endpoint, _) = create_endpoint(&app, &account, &receiver.url, None).await;
    assert_eq!(
        app.withdraw_with_a_new_ticket(&account, 10).await,
        StatusCode::CREATED
    );

    let got = receiver.until(2).await;
    assert!(
        got[1].at - got[0].at >= Duration::from_millis(900),
        "Retry-After: 1 waited {:?}",
        got[1].at - got[0].at
    );
    let listed = until_all(&app, &account, &endpoint, "endpoint-disabled").await;
    let endpoints = endpoints(&app, &account).await;
    assert_eq!(
        endpoints["endpoints"][0]["status"], "disabled",
        "{endpoints}"
    );
    assert!(endpoints["endpoints"][0]["disabled_reason"].is_string());

    assert_eq!(
        app.withdraw_with_a_new_ticket(&account, 10).await,
        StatusCode::CREATED
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received().len(), 2, "nothing after the 410");
    let delivery = listed[0]["id"].as_i64().unwrap();
    let retry = retry_by_hand(&app, &account, &endpoint, delivery).await;
    assert_problem(retry, StatusCode::CONFLICT, "webhook-endpoint-disabled").await;
}

/// After a rotation both secrets sign, side by side in `webhook-signature`, until the
/// window ends; then the new one alone. A receiver holding either verifies meanwhile.
pub async fn a_rotation_signs_with_both_secrets_until_its_window_ends(backend: Backend) {
    let app = spawn(backend, &["--webhook-rotation-window", "2s"]).await;
    let receiver = Receiver::start().await;
    let account = app.create_account(1000, 0).await;
    let (endpoint, old) = create_endpoint(&app, &account, &receiver.url, None).await;
    let (status, _, rotated) = read(rotate(&app, &account, &endpoint).await).await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    let new = rotated["secret"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    assert!(
        rotated["previous_secret_expires_at"].is_string(),
        "{rotated}"
    );

    assert_eq!(
        app.withdraw_with_a_new_ticket(&account, 10).await,
        StatusCode::CREATED
    );
    let during = receiver.until(1).await.remove(0);
    let signatures = during.headers["webhook-signature"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(signatures.split(' ').count(), 2, "{signatures}");
    verify(&old, &during).expect("the old secret verifies during the window");
    verify(&new, &during).expect("the new secret verifies during the window");

    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(
        app.withdraw_with_a_new_ticket(&account, 10).await,
        StatusCode::CREATED
    );
    let after = receiver.until(2).await.remove(1);
    assert_eq!(
        after.headers["webhook-signature"]
            .to_str()
            .unwrap()
            .split(' ')
            .count(),
        1
    );
    verify(&new, &after).expect("the new secret verifies after the window");
    assert!(
        verify(&old, &after).is_err(),
        "the old secret no longer signs"
    );
}

/// The reference library refuses what it should: a tampered body, an old timestamp, a
/// wrong secret.
pub async fn tampered_bodies_old_timestamps_and_wrong_secrets_fail_verification(backend: Backend) {
    let app = spawn(backend, &[]).await;
    let receiver = Receiver::start().await;
    let account = app.create_account(1000, 0).await;
    let (_, secret) = create_endpoint(&app, &account, &receiver.url, None).await;
    assert_eq!(
        app.withdraw_with_a_new_ticket(&account, 10).await,
        StatusCode::CREATED
    );
    let got = receiver.until(1).await.remove(0);
    verify(&secret, &got).expect("as sent, it verifies");

    let mut tampered = got.clone();
    tampered.body = tampered.body.replacen("withdrawal", "withdrawaL", 1);
    assert!(verify(&secret, &tampered).is_err(), "a tampered body");

    // The same signature scheme over a timestamp ten minutes old: refused as a replay.
    let mut old = got.clone();
    let then = time::OffsetDateTime::now_utc().unix_timestamp() - 600;
    let bytes = api::webhooks::signing::parse_secret(&secret).unwrap();
    let signature = api::webhooks::signing::signature(&bytes, got.id(), then, got.body.as_bytes());
    old.headers
        .insert("webhook-timestamp", then.to_string().parse().unwrap());
    old.headers
        .insert("webhook-signature", signature.parse().unwrap());
    assert!(verify(&secret, &old).is_err(), "an old timestamp");

    let (_, other_secret) = create_endpoint(&app, &account, &receiver.url, None).await;
    assert!(verify(&other_secret, &got).is_err(), "another secret");
}

/// Endpoints refuse what the guard refuses and bad event lists, are bounded per account,
/// belong to their account, and are deleted.
pub async fn endpoints_refuse_bad_urls_and_belong_to_their_account(backend: Backend) {
    // No PAYONCE_WEBHOOK_ALLOW_PRIVATE: loopback is refused.
    let app = spawn_app_with(backend, &[]).await;
    let account = app.create_account(0, 0).await;
    let url = app.url(&format!("/v1/accounts/{}/webhook-endpoints", account.id));
    let post = |body: Value| {
        app.client
            .post(&url)
            .bearer_auth(&account.key)
            .json(&body)
            .send()
    };
    for refused in [
        "http://127.0.0.1:9/hooks",
        "http://localhost:9/hooks",
        "http://10.0.0.1/hooks",
        "http://[::1]/hooks",
        "http://169.254.169.254/latest/meta-data",
        "ftp://example.com/",
        "https://user:pw@example.com/",
        "not a url",
    ] {
        let response = post(json!({ "url": refused })).await.unwrap();
        assert_problem(
            response,
            StatusCode::UNPROCESSABLE_ENTITY,
            "webhook-url-refused",
        )
        .await;
    }
    // Under 1024 characters as sent, over it once its non-ASCII characters are
    // percent-encoded as stored: refused, not a 500, nothing written.
    let long = format!("https://93.184.216.34/{}", "é".repeat(1000));
    assert!(long.chars().count() <= 1024);
    let response = post(json!({ "url": long })).await.unwrap();
    let problem = assert_problem(
        response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "webhook-url-refused",
    )
    .await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("percent-encoded"),
        "{problem}"
    );
    for bad in [
        json!({ "url": "https://example.com/", "events": [] }),
        json!({ "url": "https://example.com/", "events": ["withdrawal.lost"] }),
        json!({ "url": "https://example.com/", "extra": 1 }),
        json!({ "events": ["order.paid"] }),
    ] {
        let response = post(bad.clone()).await.unwrap();
        assert_invalid_request(response).await;
    }
    let listed = endpoints(&app, &account).await;
    assert_eq!(listed["endpoints"], json!([]), "nothing was created");

    // A public address (never contacted here: nothing is sent to it).
    let mut made = Vec::new();
    for _ in 0..16 {
        let response =
            post(json!({ "url": "https://93.184.216.34/hooks", "events": ["order.paid"] }))
                .await
                .unwrap();
        let (status, _, body) = read(response).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert!(body["secret"].as_str().unwrap().starts_with("whsec_"));
        assert_eq!(body["events"], json!(["order.paid"]));
        made.push(body["id"].as_str().unwrap().to_owned());
    }
    let response = post(json!({ "url": "https://93.184.216.34/hooks" }))
        .await
        .unwrap();
    assert_problem(
        response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "webhook-endpoint-limit",
    )
    .await;
    let listed = endpoints(&app, &account).await;
    assert_eq!(listed["endpoints"].as_array().unwrap().len(), 16);
    assert!(
        listed["endpoints"][0].get("secret").is_none(),
        "a secret is shown once"
    );

    let other = app.forbidden_to_another_account(&url).await;
    let delete = |key: &str, endpoint: &str| {
        app.client
            .delete(format!("{url}/{endpoint}"))
            .bearer_auth(key)
            .send()
    };
    assert_problem(
        delete(&other.key, &made[0]).await.unwrap(),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert_eq!(
        delete(&account.key, &made[0]).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_problem(
        delete(&account.key, &made[0]).await.unwrap(),
        StatusCode::NOT_FOUND,
        "webhook-endpoint-not-found",
    )
    .await;
    assert_problem(
        delete(&account.key, "not-a-uuid").await.unwrap(),
        StatusCode::NOT_FOUND,
        "webhook-endpoint-not-found",
    )
    .await;
    let response = post(json!({ "url": "https://93.184.216.34/hooks" }))
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::CREATED,
        "room again after a delete"
    );
}

/// A receiver that answers with a body PostgreSQL's TEXT cannot hold (`200 ok` and a NUL
/// byte) has its delivery recorded as delivered, once — and another account's delivery,
/// recorded beside it, too: no answer stalls anyone's webhooks.
pub async fn an_answer_with_a_nul_byte_is_recorded_and_stalls_nothing(backend: Backend) {
    let app = spawn(backend, &["--webhook-retry-schedule", "100ms,100ms,100ms"]).await;
    let strange = RawReceiver::start(|| async { (AxumStatus::OK, b"200 ok\0".to_vec()) }).await;
    let plain = Receiver::start().await;
    let first = app.create_account(1000, 0).await;
    let second = app.create_account(1000, 0).await;
    let (strange_endpoint, _) = create_endpoint(&app, &first, &strange.url, None).await;
    let (plain_endpoint, _) = create_endpoint(&app, &second, &plain.url, None).await;
    for _ in 0..3 {
        for account in [&first, &second] {
            assert_eq!(
                app.withdraw_with_a_new_ticket(account, 10).await,
                StatusCode::CREATED
            );
        }
    }
    let listed = until_all(&app, &first, &strange_endpoint, "delivered").await;
    assert_eq!(listed.len(), 3);
    for delivery in &listed {
        let attempts = delivery["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{delivery:#}");
        assert_eq!(attempts[0]["response_body"], "200 ok\u{FFFD}");
    }
    assert_eq!(
        until_all(&app, &second, &plain_endpoint, "delivered")
            .await
            .len(),
        3
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(strange.count(), 3, "each delivered once, none sent again");
    assert_eq!(plain.received().len(), 3);
    app.assert_audit_clean().await;
}

/// A receiver that answers `503 Retry-After: 0` (a balancer through a deploy) waits the
/// schedule's steps anyway: its delivery is not exhausted within a moment.
pub async fn a_short_retry_after_waits_the_schedule(backend: Backend) {
    let app = spawn(backend, &["--webhook-retry-schedule", "300ms,300ms"]).await;
    let receiver = Receiver::start().await;
    receiver.answer(&[(503, Some(0)), (503, Some(0))]);
    let account = app.create_account(1000, 0).await;
    let (endpoint, _) = create_endpoint(&app, &account, &receiver.url, None).await;
    assert_eq!(
        app.withdraw_with_a_new_ticket(&account, 10).await,
        StatusCode::CREATED
    );
    let got = receiver.until(3).await;
    for pair in got.windows(2) {
        assert!(
            pair[1].at - pair[0].at >= Duration::from_millis(300),
            "Retry-After: 0 cut the schedule's wait to {:?}",
            pair[1].at - pair[0].at
        );
    }
    until_all(&app, &account, &endpoint, "delivered").await;
}

/// An endpoint that never answers holds at most `PAYONCE_WEBHOOK_PER_ENDPOINT` of the
/// instance's delivery slots: another account's event is delivered while every attempt
/// to the silent one is still waiting for its answer, not after their timeouts.
pub async fn a_silent_endpoint_holds_back_no_other_accounts_events(backend: Backend) {
    let app = spawn(
        backend,
        &[
            "--webhook-concurrency",
            "4",
            "--webhook-per-endpoint",
            "2",
            "--webhook-timeout",
            "10s",
            "--webhook-lease",
            "30s",
        ],
    )
    .await;
    let silent = RawReceiver::start(|| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        (AxumStatus::OK, Vec::new())
    })
    .await;
    let plain = Receiver::start().await;
    let quiet = app.create_account(1000, 0).await;
    let other = app.create_account(1000, 0).await;
    let (silent_endpoint, _) = create_endpoint(&app, &quiet, &silent.url, None).await;
    create_endpoint(&app, &other, &plain.url, None).await;
    for _ in 0..6 {
        assert_eq!(
            app.withdraw_with_a_new_ticket(&quiet, 10).await,
            StatusCode::CREATED
        );
    }
    // Both of the silent endpoint's places are taken before the other account spends.
    let deadline = Instant::now() + Duration::from_secs(5);
    while silent.count() < 2 {
        assert!(
            Instant::now() < deadline,
            "the silent endpoint was not called"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        app.withdraw_with_a_new_ticket(&other, 10).await,
        StatusCode::CREATED
    );
    plain.until(1).await;
    // Delivered while the silent endpoint's attempts still wait for their answers (the
    // first of them ends only at its 10 s timeout, and would be recorded then).
    let listed = deliveries(&app, &quiet, &silent_endpoint).await;
    assert!(
        listed
            .iter()
            .all(|d| d["attempts"].as_array().unwrap().is_empty()),
        "the other account's event waited for the silent endpoint's timeouts: {listed:#?}"
    );
    assert_eq!(silent.count(), 2, "at most two in flight to one endpoint");
}

/// After `PAYONCE_WEBHOOK_KEY` changed, an endpoint's secret sealed under the old key no
/// longer opens; a rotation gives it one that does, and its deliveries go out at once,
/// signed by the new secret alone — the previous one, sealed under the old key, is left
/// out, not a reason to sign nothing for the rotation window.
pub async fn after_a_change_of_sealing_key_a_rotation_signs_again(backend: Backend) {
    let old_key = "00".repeat(32);
    let new_key = "11".repeat(32);
    let shared = Shared::new(backend).await;
    let receiver = Receiver::start().await;
    let before = spawn_with(
        Arc::clone(&shared),
        &["--webhook-allow-private", "--webhook-key", &old_key],
    )
    .await;
    let account = before.create_account(1000, 0).await;
    let (endpoint, _) = create_endpoint(&before, &account, &receiver.url, None).await;
    before.stop().await;

    let app = spawn_with(
        shared,
        &["--webhook-allow-private", "--webhook-key", &new_key],
    )
    .await;
    let (status, _, rotated) = read(rotate(&app, &account, &endpoint).await).await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    let secret = rotated["secret"].as_str().unwrap().to_owned();
    assert_eq!(
        app.withdraw_with_a_new_ticket(&account, 10).await,
        StatusCode::CREATED
    );
    let got = receiver.until(1).await.remove(0);
    assert_eq!(
        got.headers["webhook-signature"]
            .to_str()
            .unwrap()
            .split(' ')
            .count(),
        1
    );
    verify(&secret, &got).expect("the new secret verifies");
    until_all(&app, &account, &endpoint, "delivered").await;
}

/// An endpoint's creation, its secret's rotation and a delivery's retry by hand take an
/// `Idempotency-Key`: the same request again gets the first answer — the same secret —
/// with `Idempotent-Replayed: true`, and does nothing more: one endpoint, one rotation
/// (the first secret still signs through the window, as after one rotation), one more
/// attempt. Another request under a used key is 422 and does nothing.
pub async fn webhook_posts_with_a_key_happen_once(backend: Backend) {
    let app = spawn(backend, &[]).await;
    let receiver = Receiver::start().await;
    let account = app.create_account(1000, 0).await;
    let post = |path: String, key: &str, body: Option<Value>| {
        let request = app
            .client
            .post(app.url(&path))
            .bearer_auth(&account.key)
            .header("idempotency-key", key);
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        request.send()
    };
    let endpoints_path = format!("/v1/accounts/{}/webhook-endpoints", account.id);
    let create_key = uuid::Uuid::new_v4().to_string();
    let body = json!({ "url": receiver.url });
    let first = post(endpoints_path.clone(), &create_key, Some(body.clone()))
        .await
        .unwrap();
    let location = first.headers()["location"].clone();
    let (status, replayed, created) = read(first).await;
    assert_eq!(
        (status, replayed),
        (StatusCode::CREATED, false),
        "{created}"
    );
    let again = post(endpoints_path.clone(), &create_key, Some(body.clone()))
        .await
        .unwrap();
    assert_eq!(again.headers()["location"], location);
    let (status, replayed, repeated) = read(again).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(repeated, created, "the same endpoint, the same secret");
    let other = post(
        endpoints_path.clone(),
        &create_key,
        Some(json!({ "url": receiver.url, "events": ["order.paid"] })),
    )
    .await
    .unwrap();
    assert_problem(
        other,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reuse",
    )
    .await;
    let listed = endpoints(&app, &account).await;
    assert_eq!(listed["endpoints"].as_array().unwrap().len(), 1, "{listed}");
    let endpoint = created["id"].as_str().unwrap().to_owned();
    let first_secret = created["secret"].as_str().unwrap().to_owned();

    let rotate_path = format!("{endpoints_path}/{endpoint}/rotate-secret");
    let rotate_key = uuid::Uuid::new_v4().to_string();
    let (status, replayed, rotated) =
        read(post(rotate_path.clone(), &rotate_key, None).await.unwrap()).await;
    assert_eq!((status, replayed), (StatusCode::OK, false), "{rotated}");
    let (status, replayed, rotated_again) =
        read(post(rotate_path.clone(), &rotate_key, None).await.unwrap()).await;
    assert_eq!((status, replayed), (StatusCode::OK, true));
    assert_eq!(rotated_again, rotated, "the same new secret");
    let new_secret = rotated["secret"].as_str().unwrap().to_owned();
    assert_eq!(
        app.withdraw_with_a_new_ticket(&account, 10).await,
        StatusCode::CREATED
    );
    let got = receiver.until(1).await.remove(0);
    verify(&first_secret, &got).expect("rotated once: the first secret still signs");
    verify(&new_secret, &got).expect("the new secret signs");

    let listed = until_all(&app, &account, &endpoint, "delivered").await;
    let delivery = listed[0]["id"].as_i64().unwrap();
    let retry_path = format!("/v1/webhook-endpoints/{endpoint}/deliveries/{delivery}/retry");
    let retry_key = uuid::Uuid::new_v4().to_string();
    let first = post(retry_path.clone(), &retry_key, None).await.unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    receiver.until(2).await;
    until_all(&app, &account, &endpoint, "delivered").await;
    let again = post(retry_path.clone(), &retry_key, None).await.unwrap();
    assert_eq!(again.status(), StatusCode::ACCEPTED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received().len(), 2, "the repeat sent nothing more");
    let reused = post(rotate_path, &retry_key, None).await.unwrap();
    assert_problem(
        reused,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reuse",
    )
    .await;
    let malformed = post(retry_path, "not-a-uuid", None).await.unwrap();
    assert_problem(
        malformed,
        StatusCode::BAD_REQUEST,
        "idempotency-key-invalid",
    )
    .await;
}

/// A receiver of raw answers: each request is answered by `answer`, and counted.
pub struct RawReceiver {
    pub url: String,
    count: Arc<std::sync::atomic::AtomicUsize>,
}

impl RawReceiver {
    pub async fn start<F, Fut>(answer: F) -> Self
    where
        F: Fn() -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = (AxumStatus, Vec<u8>)> + Send + 'static,
    {
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&count);
        let app = axum::Router::new().route(
            "/hooks",
            axum::routing::post(move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let answer = answer.clone();
                async move { answer().await.into_response() }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, count }
    }

    pub fn count(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// payonce's signatures verify with the specification's reference library for Python
/// (the `standardwebhooks` package from PyPI, in the virtual environment `scripts/test.sh`
/// makes), during a rotation too; and it refuses a tampered body, an old timestamp and a
/// wrong secret.
pub async fn the_python_reference_library_verifies_and_refuses_as_it_should(backend: Backend) {
    let python = reference_python();
    let app = spawn(backend, &[]).await;
    let receiver = Receiver::start().await;
    let account = app.create_account(1000, 0).await;
    let (endpoint, old) = create_endpoint(&app, &account, &receiver.url, None).await;
    assert_eq!(
        app.withdraw_with_a_new_ticket(&account, 10).await,
        StatusCode::CREATED
    );
    let rotated: Value = rotate(&app, &account, &endpoint)
        .await
        .json()
        .await
        .unwrap();
    let new = rotated["secret"].as_str().unwrap().to_owned();
    assert_eq!(
        app.withdraw_with_a_new_ticket(&account, 20).await,
        StatusCode::CREATED
    );
    let got = receiver.until(2).await;
    let (_, stranger) = create_endpoint(&app, &account, &receiver.url, None).await;

    let header = |r: &Received, name: &str| r.headers[name].to_str().unwrap().to_owned();
    let before = got
        .iter()
        .find(|r| r.json()["data"]["outcome"]["body"]["amount"] == 10)
        .unwrap();
    let during = got
        .iter()
        .find(|r| r.json()["data"]["outcome"]["body"]["amount"] == 20)
        .unwrap();
    let case = |name: &str, secret: &str, r: &Received, expect: bool, change: Value| {
        let mut case = json!({
            "name": name,
            "secret": secret,
            "expect": expect,
            "received": {
                "id": header(r, "webhook-id"),
                "timestamp": header(r, "webhook-timestamp"),
                "signature": header(r, "webhook-signature"),
                "body": r.body,
            },
        });
        if let Value::Object(change) = change {
            case.as_object_mut().unwrap().extend(change);
        }
        case
    };
    let cases = vec![
        case("plain", &old, before, true, Value::Null),
        case("rotation, old secret", &old, during, true, Value::Null),
        case("rotation, new secret", &new, during, true, Value::Null),
        case("wrong secret", &stranger, before, false, Value::Null),
        case(
            "tampered body",
            &old,
            before,
            false,
            json!({"tamper": true}),
        ),
        case("old timestamp", &old, before, false, json!({"age": 600})),
    ];
    let input = serde_json::to_string(&cases).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/webhook_reference.py");
    let output = tokio::process::Command::new(&python)
        .arg(script)
        .env("CASES", input)
        .output()
        .await
        .expect("the reference script runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count(),
        cases.len(),
        "{stdout}"
    );
}

/// The Python of the virtual environment that holds the reference library.
fn reference_python() -> std::path::PathBuf {
    let python =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/webhooks-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: scripts/test.sh makes it (python3 -m venv, pip install standardwebhooks)",
        python.display()
    );
    python
}
