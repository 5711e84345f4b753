//! One function per row of the contract and per idempotency rule; `main.rs` runs each on
//! both backends.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    Backend, PATIENT_SPENDS, SHORT_LEASE_DEMO, SendForJson, TestApp, assert_invalid_request,
    assert_problem, read, spawn_app, spawn_app_with, text_of_type,
    the_next_holder_after_a_paused_one, thirty_withdrawals_of_100_from_1000,
};

fn new_account_body(name: &str, balance: i64, points: i64) -> Value {
    json!({ "name": name, "balance": balance, "points": points })
}

/// POST /v1/accounts answers 201 with the key, once; bad input is 4xx problem+json.
pub async fn accounts_open_with_a_key_shown_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let response = app
        .client
        .post(app.url("/v1/accounts"))
        .json(&new_account_body("Ada", 1500, 7))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        location,
        format!("/v1/accounts/{}", body["id"].as_str().unwrap())
    );
    assert_eq!(
        (
            body["name"].as_str(),
            body["balance"].as_i64(),
            body["points"].as_i64()
        ),
        (Some("Ada"), Some(1500), Some(7))
    );
    assert!(body["api_key"].as_str().unwrap().starts_with("po_"));
    assert!(body["created_at"].as_str().unwrap().ends_with('Z'));

    // Balance and points default to 0.
    let response = app
        .client
        .post(app.url("/v1/accounts"))
        .json(&json!({ "name": "Bob" }))
        .send()
        .await
        .unwrap();
    let (status, _, body) = read(response).await;
    assert_eq!(
        (status, body["balance"].as_i64(), body["points"].as_i64()),
        (StatusCode::CREATED, Some(0), Some(0))
    );

    for bad in [
        new_account_body("", 0, 0),
        new_account_body(&"x".repeat(101), 0, 0),
        new_account_body("neg", -1, 0),
        new_account_body("neg", 0, -1),
        json!({ "balance": 5 }),
        json!({ "name": "x", "extra": true }),
        json!({ "name": 5 }),
    ] {
        let response = app
            .client
            .post(app.url("/v1/accounts"))
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_invalid_request(response).await;
    }
    let name_of_100 = new_account_body(&"é".repeat(100), 0, 0);
    let response = app
        .client
        .post(app.url("/v1/accounts"))
        .json(&name_of_100)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);

    let response = app
        .client
        .post(app.url("/v1/accounts"))
        .header("content-type", "application/json")
        .body("{\"name\":")
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::BAD_REQUEST, "malformed-json").await;
    let response = app
        .client
        .post(app.url("/v1/accounts"))
        .header("content-type", "text/plain")
        .body("{\"name\":\"x\"}")
        .send()
        .await
        .unwrap();
    assert_problem(
        response,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported-media-type",
    )
    .await;
}

/// GET /v1/accounts/{id}: 401 without or with an unknown key, 403 with another account's,
/// 404 for what is not an account id, 200 with its own.
pub async fn account_reads_need_the_accounts_own_key(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(100, 3).await;
    let bob = app.create_account(0, 0).await;
    let url = app.url(&format!("/v1/accounts/{}", ada.id));

    let response = app.client.get(&url).send().await.unwrap();
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    let response = app
        .client
        .get(&url)
        .bearer_auth("po_unknown")
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    let response = app
        .client
        .get(&url)
        .header("authorization", format!("Basic {}", ada.key))
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    let response = app
        .client
        .get(&url)
        .bearer_auth(&bob.key)
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::FORBIDDEN, "forbidden").await;
    let response = app.get_as(&ada.key, "/v1/accounts/not-a-uuid").await;
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    // Without a key, nothing about the path is looked at.
    let response = app.get("/v1/accounts/not-a-uuid").await;
    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    let response = app.get_as(&ada.key, "/v1/tickets/not-a-uuid").await;
    assert_problem(response, StatusCode::NOT_FOUND, "ticket-not-found").await;

    let (status, _, body) = read(
        app.client
            .get(&url)
            .bearer_auth(&ada.key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["id"], ada.id.as_str());
    assert_eq!(
        (body["balance"].as_i64(), body["points"].as_i64()),
        (Some(100), Some(3))
    );
    assert!(body.get("api_key").is_none(), "the key is shown only once");
}

/// GET /v1/accounts/{id}/entries: oldest first, paginated with `after` and `limit`.
pub async fn entries_list_oldest_first_a_page_at_a_time(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 0).await;
    for amount in 1..=4 {
        let ticket = app.ticket(&ada).await;
        assert_eq!(
            app.withdraw(&ada, &ticket, amount).await.status(),
            StatusCode::CREATED
        );
    }
    let url = app.url(&format!("/v1/accounts/{}/entries", ada.id));
    let first: Value = app
        .client
        .get(format!("{url}?limit=3"))
        .bearer_auth(&ada.key)
        .send_for_json()
        .await;
    let entries = first["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[0]["kind"], "opening");
    assert_eq!(entries[0]["ticket_id"], Value::Null);
    assert_eq!(entries[1]["kind"], "withdrawal");
    assert_eq!(
        (
            entries[1]["amount"].as_i64(),
            entries[1]["balance_after"].as_i64()
        ),
        (Some(-1), Some(999))
    );
    let after = first["next_after"].as_i64().unwrap();
    let rest: Value = app
        .client
        .get(format!("{url}?after={after}&limit=3"))
        .bearer_auth(&ada.key)
        .send_for_json()
        .await;
    let amounts: Vec<i64> = rest["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["amount"].as_i64().unwrap())
        .collect();
    assert_eq!(amounts, [-3, -4]);
    assert_eq!(rest["next_after"], Value::Null);

    for bad in ["?limit=0", "?limit=1001", "?limit=abc", "?after=x"] {
        let response = app
            .client
            .get(format!("{url}{bad}"))
            .bearer_auth(&ada.key)
            .send()
            .await
            .unwrap();
        assert_problem(response, StatusCode::BAD_REQUEST, "bad-request").await;
    }
    app.forbidden_to_another_account(&url).await;
}

/// Tickets: issued (201, Location), then completed with their stored response; readable
/// only with their account's key.
pub async fn tickets_show_their_state_and_stored_response(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 0).await;
    let bob = app.create_account(0, 0).await;
    let response = app
        .post_as(&ada.key, &format!("/v1/accounts/{}/tickets", ada.id))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let issued: Value = response.json().await.unwrap();
    let ticket = issued["ticket_id"].as_str().unwrap().to_owned();
    assert_eq!(location, format!("/v1/tickets/{ticket}"));
    assert_eq!(issued["account_id"], ada.id.as_str());
    assert!(issued["expires_at"].is_string());

    let url = app.url(&format!("/v1/tickets/{ticket}"));
    let (status, _, body) = read(
        app.client
            .get(&url)
            .bearer_auth(&ada.key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, body["state"].as_str()),
        (StatusCode::OK, Some("issued"))
    );
    assert!(body.get("response").is_none());

    let (_, _, spent) = read(app.withdraw(&ada, &ticket, 250).await).await;
    let (_, _, body) = read(
        app.client
            .get(&url)
            .bearer_auth(&ada.key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(body["state"], "completed");
    assert_eq!(body["response"]["status"], 201);
    assert_eq!(body["response"]["body"], spent);

    let response = app
        .client
        .get(&url)
        .bearer_auth(&bob.key)
        .send()
        .await
        .unwrap();
    // Another account's ticket is not found, as a spend with it is.
    assert_problem(response, StatusCode::NOT_FOUND, "ticket-not-found").await;
    let response = app.client.get(&url).send().await.unwrap();
    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    let unknown = app.url(&format!("/v1/tickets/{}", uuid::Uuid::new_v4()));
    let response = app
        .client
        .get(unknown)
        .bearer_auth(&ada.key)
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::NOT_FOUND, "ticket-not-found").await;
    let response = app
        .post_as(&bob.key, &format!("/v1/accounts/{}/tickets", ada.id))
        .await;
    assert_problem(response, StatusCode::FORBIDDEN, "forbidden").await;
}

/// Rule 1: no Idempotency-Key → 400; not a UUID → 400. A quoted key works.
pub async fn spend_without_or_with_a_malformed_idempotency_key_is_400(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 0).await;
    let url = app.url(&format!("/v1/accounts/{}/withdrawals", ada.id));
    let response = app
        .client
        .post(&url)
        .bearer_auth(&ada.key)
        .json(&json!({ "amount": 1 }))
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::BAD_REQUEST, "idempotency-key-missing").await;
    for bad in ["abc", "12345678", "\"not-a-uuid\""] {
        let response = app.withdraw(&ada, bad, 1).await;
        assert_problem(response, StatusCode::BAD_REQUEST, "idempotency-key-invalid").await;
    }
    // Authentication comes first.
    let response = app
        .client
        .post(&url)
        .json(&json!({ "amount": 1 }))
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthenticated").await;

    let ticket = app.ticket(&ada).await;
    let (status, replayed, _) = read(app.withdraw(&ada, &format!("\"{ticket}\""), 5).await).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    let (status, replayed, _) = read(app.withdraw(&ada, &ticket, 5).await).await;
    assert_eq!(
        (status, replayed),
        (StatusCode::CREATED, true),
        "bare and quoted forms are the same key"
    );
}

/// Rule 2: an unknown ticket, or another account's, is 404; an expired one is 410.
pub async fn unknown_foreign_or_expired_tickets_are_refused(backend: Backend) {
    let app = spawn_app_with(backend, &["--ticket-ttl", "300ms"]).await;
    let ada = app.create_account(1000, 0).await;
    let bob = app.create_account(1000, 0).await;
    let response = app
        .withdraw(&ada, &uuid::Uuid::new_v4().to_string(), 1)
        .await;
    assert_problem(response, StatusCode::NOT_FOUND, "ticket-not-found").await;
    let bobs = app.ticket(&bob).await;
    let response = app.withdraw(&ada, &bobs, 1).await;
    assert_problem(response, StatusCode::NOT_FOUND, "ticket-not-found").await;
    let expiring = app.ticket(&ada).await;
    tokio::time::sleep(Duration::from_millis(450)).await;
    let response = app.withdraw(&ada, &expiring, 1).await;
    assert_problem(response, StatusCode::GONE, "ticket-expired").await;
    let body = app.shown_ticket(&ada, &expiring).await;
    assert_eq!(body["state"], "expired");
    assert_eq!(app.balance(&ada).await, (1000, 0));
    assert_eq!(app.balance(&bob).await, (1000, 0));
}

/// Rules 3 and 4: the first request executes (201, no replay header); repeats return the
/// same status and body with `Idempotent-Replayed: true`; deposits alike.
pub async fn first_request_executes_and_repeats_replay_it(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;
    let (status, replayed, original) = read(app.withdraw(&ada, &ticket, 300).await).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    assert_eq!(
        original,
        json!({ "ticket_id": ticket, "account_id": ada.id, "amount": 300, "balance": 700 })
    );
    for _ in 0..3 {
        let (status, replayed, body) = read(app.withdraw(&ada, &ticket, 300).await).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, true));
        assert_eq!(body, original);
    }
    let deposit_ticket = app.ticket(&ada).await;
    let (status, _, body) = read(
        app.spend(&ada, "deposits", &deposit_ticket, json!({ "amount": 50 }))
            .await,
    )
    .await;
    assert_eq!(
        (status, body["balance"].as_i64(), body["amount"].as_i64()),
        (StatusCode::CREATED, Some(750), Some(50))
    );
    let (status, replayed, again) = read(
        app.spend(&ada, "deposits", &deposit_ticket, json!({ "amount": 50 }))
            .await,
    )
    .await;
    assert_eq!((status, replayed, again), (StatusCode::CREATED, true, body));
    assert_eq!(app.balance(&ada).await, (750, 0));
    app.assert_audit_clean().await;
}

/// Rule 3: insufficient funds is a stored 402, replayed, and stays failed even after the
/// money arrives.
pub async fn refusals_are_stored_and_a_failed_ticket_stays_failed(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(50, 0).await;
    let ticket = app.ticket(&ada).await;
    let response = app.withdraw(&ada, &ticket, 100).await;
    assert!(
        response.headers().get("idempotent-replayed").is_none(),
        "an original carries no replay header"
    );
    let original =
        assert_problem(response, StatusCode::PAYMENT_REQUIRED, "insufficient-funds").await;
    assert_eq!(
        (original["balance"].as_i64(), original["amount"].as_i64()),
        (Some(50), Some(100))
    );
    assert_eq!(original["ticket_id"], ticket.as_str());

    let top_up = app.ticket(&ada).await;
    assert_eq!(
        app.spend(&ada, "deposits", &top_up, json!({ "amount": 500 }))
            .await
            .status(),
        StatusCode::CREATED
    );
    let response = app.withdraw(&ada, &ticket, 100).await;
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    let replay = assert_problem(response, StatusCode::PAYMENT_REQUIRED, "insufficient-funds").await;
    assert_eq!(replay, original);
    assert_eq!(app.balance(&ada).await, (550, 0));
    app.assert_audit_clean().await;
}

/// Lottery draws spend points (one by default, with an empty body), may credit money, and
/// replay the same prize; too few points is a stored 402.
pub async fn lottery_draws_spend_points_and_replay_the_same_prize(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(0, 5).await;
    let ticket = app.ticket(&ada).await;
    let (status, replayed, drawn) = read(
        app.spend(&ada, "lottery-draws", &ticket, json!({ "points": 3 }))
            .await,
    )
    .await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    assert_eq!(
        (drawn["points"].as_i64(), drawn["points_after"].as_i64()),
        (Some(3), Some(2))
    );
    let prize = drawn["prize"].as_str().unwrap();
    assert!(
        ["nothing", "bronze", "silver", "gold"].contains(&prize),
        "{drawn}"
    );
    let credit = drawn["credit"].as_i64().unwrap();
    assert_eq!(drawn["balance"].as_i64(), Some(credit));
    for _ in 0..3 {
        let (status, replayed, body) = read(
            app.spend(&ada, "lottery-draws", &ticket, json!({ "points": 3 }))
                .await,
        )
        .await;
        assert_eq!(
            (status, replayed, body),
            (StatusCode::CREATED, true, drawn.clone())
        );
    }

    // No body at all: one point.
    let one = app.ticket(&ada).await;
    let response = app
        .client
        .post(app.url(&format!("/v1/accounts/{}/lottery-draws", ada.id)))
        .bearer_auth(&ada.key)
        .header("idempotency-key", &one)
        .send()
        .await
        .unwrap();
    let (status, _, body) = read(response).await;
    assert_eq!(
        (
            status,
            body["points"].as_i64(),
            body["points_after"].as_i64()
        ),
        (StatusCode::CREATED, Some(1), Some(1))
    );

    let short = app.ticket(&ada).await;
    let response = app
        .spend(&ada, "lottery-draws", &short, json!({ "points": 2 }))
        .await;
    let refused = assert_problem(
        response,
        StatusCode::PAYMENT_REQUIRED,
        "insufficient-points",
    )
    .await;
    assert_eq!(refused["points"].as_i64(), Some(1));
    let response = app
        .spend(&ada, "lottery-draws", &short, json!({ "points": 2 }))
        .await;
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    assert_problem(
        response,
        StatusCode::PAYMENT_REQUIRED,
        "insufficient-points",
    )
    .await;
    for bad in [
        json!({ "points": 0 }),
        json!({ "points": -1 }),
        json!({ "points": "1" }),
    ] {
        let ticket = app.ticket(&ada).await;
        let response = app.spend(&ada, "lottery-draws", &ticket, bad).await;
        assert_invalid_request(response).await;
    }
    app.assert_audit_clean().await;
}

/// Rule 5: another amount or another endpoint under a used ticket is 422 and executes
/// nothing.
pub async fn a_different_request_under_a_used_ticket_is_422(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;
    assert_eq!(
        app.withdraw(&ada, &ticket, 100).await.status(),
        StatusCode::CREATED
    );
    let response = app.withdraw(&ada, &ticket, 101).await;
    assert_problem(
        response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reuse",
    )
    .await;
    let response = app
        .spend(&ada, "deposits", &ticket, json!({ "amount": 100 }))
        .await;
    assert_problem(
        response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reuse",
    )
    .await;
    let response = app.spend(&ada, "lottery-draws", &ticket, json!({})).await;
    assert_problem(
        response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reuse",
    )
    .await;
    assert_eq!(app.balance(&ada).await, (900, 0));
    app.assert_audit_clean().await;
}

/// Rule 7: validation errors (400, 413, 415, 422) store nothing; the ticket stays usable.
pub async fn validation_errors_store_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;
    let url = app.url(&format!("/v1/accounts/{}/withdrawals", ada.id));
    for amount in [
        json!(0),
        json!(-5),
        json!(1_000_000_000_001_i64),
        json!(9_223_372_036_854_775_808_u64),
        json!("10"),
        json!(1.5),
        json!(1e30),
        json!(null),
        json!([1]),
    ] {
        let response = app
            .spend(&ada, "withdrawals", &ticket, json!({ "amount": amount }))
            .await;
        assert_invalid_request(response).await;
    }
    for body in [json!({}), json!({ "amount": 5, "memo": "x" })] {
        let response = app.spend(&ada, "withdrawals", &ticket, body).await;
        assert_invalid_request(response).await;
    }
    let send = |content_type: &'static str, body: String| {
        app.client
            .post(&url)
            .bearer_auth(&ada.key)
            .header("idempotency-key", &ticket)
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    assert_problem(
        send("application/json", "{\"amount\":".into())
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST,
        "malformed-json",
    )
    .await;
    assert_problem(
        send("text/plain", "{\"amount\":5}".into()).await.unwrap(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported-media-type",
    )
    .await;
    let huge = format!("{{\"amount\":5,\"pad\":\"{}\"}}", "x".repeat(17 * 1024));
    assert_problem(
        send("application/json", huge).await.unwrap(),
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload-too-large",
    )
    .await;
    // The body limit answered before the router: counted all the same.
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.lines().any(
            |line| line.starts_with("http_server_request_duration_seconds_count{")
                && line.contains("http_response_status_code=\"413\"")
        ),
        "{metrics}"
    );

    let body = app.shown_ticket(&ada, &ticket).await;
    assert_eq!(body["state"], "issued");
    let (status, replayed, body) = read(app.withdraw(&ada, &ticket, 5).await).await;
    assert_eq!(
        (status, replayed, body["balance"].as_i64()),
        (StatusCode::CREATED, false, Some(995))
    );
    // An integral number is an integer (JSON Schema says so, and so does the OpenAPI
    // document): the same request, replayed.
    let (status, replayed, again) = read(
        app.spend(&ada, "withdrawals", &ticket, json!({ "amount": 5.0 }))
            .await,
    )
    .await;
    assert_eq!((status, replayed, again), (StatusCode::CREATED, true, body));
}

/// Rule 6: a duplicate that arrives while the original executes waits for it, then replays.
pub async fn duplicate_of_a_running_request_waits_and_replays(backend: Backend) {
    let app = spawn_app_with(backend, &["--demo", "--lock-wait", "5s"]).await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;
    let slow = app.spawn_withdrawal(&ada, &ticket, 100, &[("payonce-fault", "pause=700ms")]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, replayed, duplicate) = read(app.withdraw(&ada, &ticket, 100).await).await;
    let (original_status, original_replayed, original) = read(slow.await.unwrap()).await;
    assert_eq!(
        (original_status, original_replayed),
        (StatusCode::CREATED, false)
    );
    assert_eq!(
        (status, replayed),
        (StatusCode::CREATED, true),
        "the duplicate waited and replayed"
    );
    assert_eq!(duplicate, original);
    assert_eq!(app.balance(&ada).await, (900, 0));
}

/// Rule 6, past the bound: 409 request-in-progress with Retry-After; later it replays.
pub async fn duplicate_past_the_wait_is_409_request_in_progress(backend: Backend) {
    let app = spawn_app_with(backend, &["--demo", "--lock-wait", "200ms"]).await;
    let ada = app.create_account(1000, 0).await;
    // The duplicate must come while the first holds the lock. On a loaded machine it can
    // arrive after the first's pause is over — and is then a replay, rightly: that try
    // did not set up the race, and another ticket tries again.
    let mut tries = 0_u32;
    let (ticket, slow) = loop {
        tries += 1;
        let ticket = app.ticket(&ada).await;
        let taken = app.metric("payonce_lock_wait_seconds_count").await;
        let slow = app.spawn_withdrawal(&ada, &ticket, 100, &[("payonce-fault", "pause=1200ms")]);
        app.until_locks_taken(taken + 1.0).await;
        let response = app.withdraw(&ada, &ticket, 100).await;
        if slow.is_finished() && response.status() == StatusCode::CREATED && tries < 5 {
            slow.await.unwrap();
            continue;
        }
        assert_problem(response, StatusCode::CONFLICT, "request-in-progress").await;
        break (ticket, slow);
    };
    let (status, _, original) = read(slow.await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, replayed, body) = read(app.withdraw(&ada, &ticket, 100).await).await;
    assert_eq!(
        (status, replayed, body),
        (StatusCode::CREATED, true, original)
    );
}

/// Rule 9: a spend that waits too long for a busy account is 409 account-busy, executes
/// nothing, and its ticket stays usable.
pub async fn busy_account_is_409_account_busy(backend: Backend) {
    let app = spawn_app_with(backend, &["--demo", "--lock-wait", "200ms"]).await;
    let ada = app.create_account(1000, 0).await;
    let (first, second) = (app.ticket(&ada).await, app.ticket(&ada).await);
    let slow = app.spawn_withdrawal(&ada, &first, 100, &[("payonce-fault", "pause=1s")]);
    app.until_locks_taken(1.0).await;
    let response = app.withdraw(&ada, &second, 100).await;
    assert_problem(response, StatusCode::CONFLICT, "account-busy").await;
    assert_eq!(slow.await.unwrap().status(), StatusCode::CREATED);
    let (status, replayed, _) = read(app.withdraw(&ada, &second, 100).await).await;
    assert_eq!(
        (status, replayed),
        (StatusCode::CREATED, false),
        "the ticket was still usable"
    );
    assert_eq!(app.balance(&ada).await, (800, 0));
    assert!(app.metric("payonce_lock_timeouts_total").await >= 1.0);
}

/// 100 concurrent requests with one ticket: one execution, 99 replays identical to it,
/// each with the replay header.
pub async fn hundred_concurrent_copies_execute_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(10_000, 0).await;
    let ticket = app.ticket(&ada).await;
    let results = futures::future::join_all(
        (0..100).map(|_| async { read(app.withdraw(&ada, &ticket, 100).await).await }),
    )
    .await;
    let originals: Vec<_> = results
        .iter()
        .filter(|(_, replayed, _)| !replayed)
        .collect();
    assert_eq!(originals.len(), 1, "exactly one execution");
    let (status, _, original) = originals[0];
    assert_eq!(*status, StatusCode::CREATED);
    for (status, _, body) in &results {
        assert_eq!((status, body), (&StatusCode::CREATED, original));
    }
    assert_eq!(app.balance(&ada).await, (9_900, 0));
    assert_eq!(app.metric("payonce_executions_total").await, 1.0);
    assert_eq!(app.metric("payonce_replays_total").await, 99.0);
    app.assert_audit_clean().await;
}

/// Concurrent withdrawals with distinct tickets that together exceed the balance: exactly
/// the affordable number succeed, the rest are stored 402s.
pub async fn concurrent_distinct_tickets_spend_exactly_the_balance(backend: Backend) {
    let app = spawn_app_with(backend, PATIENT_SPENDS).await;
    let ada = thirty_withdrawals_of_100_from_1000(&[&app]).await;
    assert_eq!(app.balance(&ada).await, (0, 0));
    app.assert_audit_clean().await;
}

/// A holder paused past its lease inside the critical section cannot commit: the next
/// holder's write stands, the paused request gets 503 lock-lost, nothing is spent twice.
pub async fn paused_lock_holder_cannot_commit(backend: Backend) {
    let app = spawn_app_with(backend, SHORT_LEASE_DEMO).await;
    let (ada, paused_ticket, (status, _, body)) =
        the_next_holder_after_a_paused_one(&app, &app).await;
    assert_eq!(
        (status, body["balance"].as_i64()),
        (StatusCode::CREATED, Some(300)),
        "the next holder took over after the lease ran out"
    );

    assert_eq!(app.balance(&ada).await, (300, 0));
    let ticket = app.shown_ticket(&ada, &paused_ticket).await;
    assert_eq!(
        ticket["state"], "issued",
        "the paused request stored nothing"
    );
    assert!(app.metric("payonce_stale_fencing_tokens_total").await >= 1.0);
    assert!(app.metric("payonce_locks_lost_total").await >= 1.0);
    // Retried with the same ticket, it executes once — and finds the money gone.
    let response = app.withdraw(&ada, &paused_ticket, 700).await;
    assert_problem(response, StatusCode::PAYMENT_REQUIRED, "insufficient-funds").await;
    assert_eq!(app.balance(&ada).await, (300, 0));
    app.assert_audit_clean().await;
}

/// /healthz, /readyz, /metrics, /openapi.json, /problems/{name} and / answer.
pub async fn service_endpoints_answer(backend: Backend) {
    let app = spawn_app(backend).await;
    let (status, _, body) = read(app.get("/healthz").await).await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "status": "ok" })));
    let (status, _, body) = read(app.get("/readyz").await).await;
    assert_eq!(
        (
            status,
            body["database"].as_str(),
            body["lock_store"].as_str()
        ),
        (StatusCode::OK, Some("ok"), Some("ok"))
    );
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("http_server_request_duration_seconds_count{"),
        "{metrics}"
    );
    assert!(metrics.contains("payonce_lock_wait_seconds"), "{metrics}");
    let page = text_of_type(app.get("/").await, "text/html").await;
    assert!(page.contains("payonce"));
    let spec = app.openapi().await;
    assert!(
        spec["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        spec["openapi"]
    );
    let explanation = app.get("/problems/insufficient-funds").await;
    assert_eq!(explanation.status(), StatusCode::OK);
    assert!(explanation.text().await.unwrap().contains("402"));
    let response = app.get("/problems/no-such-problem").await;
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    let instance = app.get("/healthz").await;
    assert!(instance.headers().contains_key("payonce-instance"));
    assert!(instance.headers().contains_key("x-request-id"));
}

/// Unknown routes are 404 and wrong methods 405, both as problem+json.
pub async fn unknown_routes_and_methods_are_problems(backend: Backend) {
    let app = spawn_app(backend).await;
    let response = app.get("/v1/nothing-here").await;
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    let response = app
        .client
        .delete(app.url("/v1/accounts"))
        .send()
        .await
        .unwrap();
    assert!(response.headers().contains_key("allow"));
    assert_problem(
        response,
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
    )
    .await;
}

/// After a restart — the same database, a lock store that has forgotten its fencing
/// counters (the embedded mode's in-process locks always do; for Redis, a fresh namespace
/// stands for a restart without persistence) — every account is spendable at once: the
/// counters start again from the clock, above every token handed out before, so the
/// ledger refuses none.
pub async fn spends_after_a_restart_succeed_at_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 0).await;
    for _ in 0..3 {
        assert_eq!(
            app.withdraw_with_a_new_ticket(&ada, 10).await,
            StatusCode::CREATED
        );
    }
    let shared = Arc::clone(&app.shared);
    app.stop().await;

    let mut config = shared.config(&[]);
    config.redis_namespace = format!("{}-restarted", shared.namespace);
    let app = crate::helpers::spawn_config(shared, config).await;
    let ticket = app.ticket(&ada).await;
    let (status, replayed, body) = read(app.withdraw(&ada, &ticket, 10).await).await;
    assert_eq!(
        (status, replayed, body["balance"].as_i64()),
        (StatusCode::CREATED, false, Some(960)),
        "{body}"
    );
    assert_eq!(app.metric("payonce_stale_fencing_tokens_total").await, 0.0);
    assert_eq!(app.metric("payonce_locks_lost_total").await, 0.0);
    assert_eq!(
        app.withdraw_with_a_new_ticket(&ada, 10).await,
        StatusCode::CREATED
    );
    app.assert_audit_clean().await;
}

/// Shutting down lets a request in flight finish.
pub async fn graceful_shutdown_finishes_in_flight_requests(backend: Backend) {
    let app: TestApp = spawn_app_with(backend, &["--demo"]).await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;
    let in_flight = app.spawn_withdrawal(&ada, &ticket, 100, &[("payonce-fault", "pause=500ms")]);
    app.until_locks_taken(1.0).await;
    let ledger = app.state.ledger().clone();
    // Stopping drops the app's hold on its database; the embedded one is a temporary file.
    let _database = Arc::clone(&app.shared);
    app.stop().await;
    assert_eq!(in_flight.await.unwrap().status(), StatusCode::CREATED);
    let account = ledger
        .account(ledger::AccountId(ada.id.parse().unwrap()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(account.balance, 900);
}

/// Places an order of `amount` for `account` and returns its id.
async fn place_order(app: &TestApp, account: &crate::helpers::TestAccount, amount: i64) -> String {
    let response = app
        .client
        .post(app.url(&format!("/v1/accounts/{}/orders", account.id)))
        .bearer_auth(&account.key)
        .json(&json!({ "amount": amount, "description": "order #1" }))
        .send()
        .await
        .expect("request");
    let (status, _, body) = read(response).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        (&body["amount"], &body["state"], &body["description"]),
        (&json!(amount), &json!("open"), &json!("order #1"))
    );
    body["order_id"].as_str().expect("order_id").to_owned()
}

fn pay(
    app: &TestApp,
    account: &crate::helpers::TestAccount,
    order: &str,
    ticket: &str,
) -> reqwest::RequestBuilder {
    app.client
        .post(app.url(&format!("/v1/orders/{order}/payments")))
        .bearer_auth(&account.key)
        .header("idempotency-key", ticket)
}

/// Orders: an order is paid once whatever the ticket — the first ticket's 201 replays,
/// another ticket gets 409 order-already-paid (stored, replayed), the order shows who paid
/// it, the entries show the payment with its order, and a ticket used for a withdrawal
/// cannot pay an order.
pub async fn an_order_is_paid_exactly_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 0).await;
    let order = place_order(&app, &ada, 300).await;
    let (first, second) = (app.ticket(&ada).await, app.ticket(&ada).await);

    let (status, replayed, paid) =
        read(pay(&app, &ada, &order, &first).send().await.unwrap()).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{paid}");
    assert_eq!(
        (
            &paid["order_id"],
            &paid["ticket_id"],
            &paid["amount"],
            &paid["balance"],
            &paid["state"]
        ),
        (
            &json!(order),
            &json!(first),
            &json!(300),
            &json!(700),
            &json!("paid")
        )
    );
    let again = pay(&app, &ada, &order, &first)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(read(again).await, (StatusCode::CREATED, true, paid.clone()));

    let refused = pay(&app, &ada, &order, &second).send().await.unwrap();
    let problem = assert_problem(refused, StatusCode::CONFLICT, "order-already-paid").await;
    assert_eq!(problem["paid_by_ticket"], json!(first));
    let (status, replayed, _) = read(pay(&app, &ada, &order, &second).send().await.unwrap()).await;
    assert_eq!((status, replayed), (StatusCode::CONFLICT, true));

    let read_back = app.get_as(&ada.key, &format!("/v1/orders/{order}")).await;
    let (status, _, view) = read(read_back).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&view["state"], &view["paid_by_ticket"]),
        (&json!("paid"), &json!(first))
    );
    assert_eq!(app.balance(&ada).await, (700, 0));

    let entries = app
        .get_as(&ada.key, &format!("/v1/accounts/{}/entries", ada.id))
        .await;
    let (_, _, page) = read(entries).await;
    let payments: Vec<&Value> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|entry| entry["kind"] == "order_payment")
        .collect();
    assert_eq!(payments.len(), 1, "{page}");
    assert_eq!(
        (&payments[0]["order_id"], &payments[0]["amount"]),
        (&json!(order), &json!(-300))
    );

    // A ticket spent on a withdrawal cannot pay an order (rule 2: another request).
    let withdrawn = app.ticket(&ada).await;
    assert_eq!(
        app.withdraw(&ada, &withdrawn, 10).await.status(),
        StatusCode::CREATED
    );
    let other_order = place_order(&app, &ada, 5).await;
    let reused = pay(&app, &ada, &other_order, &withdrawn)
        .send()
        .await
        .unwrap();
    assert_problem(
        reused,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reuse",
    )
    .await;
    app.assert_audit_clean().await;
}

/// Two different requests pay one order at once, with distinct tickets: one 201, the
/// others 409; the money moves once. An order the balance does not cover is 402, stored,
/// and stays open; another account cannot see or pay it.
pub async fn concurrent_payments_of_one_order_pay_it_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 0).await;
    let order = place_order(&app, &ada, 400).await;
    let mut tickets = Vec::new();
    for _ in 0..5 {
        tickets.push(app.ticket(&ada).await);
    }
    let answers =
        futures::future::join_all(tickets.iter().map(|ticket| async {
            read(pay(&app, &ada, &order, ticket).send().await.unwrap()).await
        }))
        .await;
    let mut statuses: Vec<u16> = answers
        .iter()
        .map(|(status, _, _)| status.as_u16())
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 409, 409, 409, 409], "{answers:#?}");
    assert_eq!(app.balance(&ada).await, (600, 0));

    let dear = place_order(&app, &ada, 5000).await;
    let ticket = app.ticket(&ada).await;
    let short = pay(&app, &ada, &dear, &ticket).send().await.unwrap();
    let problem = assert_problem(short, StatusCode::PAYMENT_REQUIRED, "insufficient-funds").await;
    assert_eq!(problem["order_id"], json!(dear));
    let view = app.get_as(&ada.key, &format!("/v1/orders/{dear}")).await;
    assert_eq!(read(view).await.2["state"], json!("open"));

    let eve = app.create_account(1000, 0).await;
    let eves_ticket = app.ticket(&eve).await;
    let theirs = pay(&app, &eve, &order, &eves_ticket).send().await.unwrap();
    assert_problem(theirs, StatusCode::NOT_FOUND, "order-not-found").await;
    let peek = app.get_as(&eve.key, &format!("/v1/orders/{order}")).await;
    assert_problem(peek, StatusCode::NOT_FOUND, "order-not-found").await;
    app.assert_audit_clean().await;
}

/// Placing an order: bad input is a 4xx problem, nothing placed.
pub async fn orders_refuse_bad_input(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 0).await;
    for body in [
        json!({ "amount": 0 }),
        json!({ "amount": 1_000_000_000_001_i64 }),
        json!({ "amount": 5, "description": "x".repeat(201) }),
        json!({ "amount": 5, "description": "a\u{0}b" }),
        json!({ "amount": 5, "colour": "red" }),
    ] {
        let response = app
            .client
            .post(app.url(&format!("/v1/accounts/{}/orders", ada.id)))
            .bearer_auth(&ada.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_invalid_request(response).await;
    }
    let order = place_order(&app, &ada, 5).await;
    let ticket = app.ticket(&ada).await;
    let with_a_body = pay(&app, &ada, &order, &ticket)
        .json(&json!({ "amount": 1 }))
        .send()
        .await
        .unwrap();
    assert_invalid_request(with_a_body).await;
    let nobody = pay(&app, &ada, "not-an-order", &ticket)
        .send()
        .await
        .unwrap();
    assert_problem(nobody, StatusCode::NOT_FOUND, "order-not-found").await;
    // The ticket is still usable.
    let paid = pay(&app, &ada, &order, &ticket).send().await.unwrap();
    assert_eq!(paid.status(), StatusCode::CREATED);
}
