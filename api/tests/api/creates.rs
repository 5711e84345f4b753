//! Creates — accounts and orders — answered once: a create whose answer the database lost
//! answers what it created; a create sent with an `Idempotency-Key` answers its first
//! answer again; and every body must be a JSON object.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    Backend, TestAccount, TestApp, assert_invalid_request, assert_problem, read, spawn_app,
    spawn_app_with, spawn_behind_a_cutter,
};

/// The answer to the statement that commits an order (one statement, committed on its
/// own) is lost: the ledger sends it again on another connection, recognises the row the
/// first one wrote, and the client gets its 201 for the order that exists — not a 500
/// for the primary key the repeat ran into.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_answer_to_an_order_create_answers_the_order() {
    let (app, cutter) = spawn_behind_a_cutter().await;
    let ada = app.create_account(1000, 0).await;
    let description = format!("cut-{}", uuid::Uuid::new_v4().simple());

    cutter.arm_on(description.as_bytes(), 1);
    let (status, replayed, body) = read(
        app.client
            .post(app.url(&format!("/v1/accounts/{}/orders", ada.id)))
            .bearer_auth(&ada.key)
            .json(&json!({ "amount": 250, "description": description }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(cutter.cuts(), 1);
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{body}");
    assert_eq!(
        (&body["amount"], &body["description"]),
        (&json!(250), &json!(description))
    );
    let order = body["order_id"].as_str().unwrap();
    let (status, _, shown) = read(app.get_as(&ada.key, &format!("/v1/orders/{order}")).await).await;
    assert_eq!((status, shown), (StatusCode::OK, body));
    assert_eq!(app.count("orders").await, 1);
    app.assert_audit_clean().await;
}

/// The answer to the COMMIT that opens an account (the account and its opening entry) is
/// lost: the ledger runs the transaction again on another connection, finds the account
/// the first one committed, and the client gets its 201 with the key that works — not
/// `outcome-unknown` and a second try that opens a second account.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_commit_answer_to_an_account_create_answers_the_account() {
    let (app, cutter) = spawn_behind_a_cutter().await;

    cutter.arm();
    let (status, replayed, body) =
        read(open_account(&app, None, &json!({ "name": "Ada" })).await).await;
    assert_eq!(cutter.cuts(), 1);
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{body}");
    assert_eq!(app.count("accounts").await, 1);
    let account = created_account(&body);
    assert_eq!(app.balance(&account).await, (0, 0));
    app.assert_audit_clean().await;
}

/// Creates sent with an `Idempotency-Key` whose COMMIT answer is lost: the first request
/// answers 201 (not a replay: it is the original, asked again inside the ledger), and the
/// client's own resend replays that answer — one account, one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_commit_answer_to_a_keyed_create_answers_it_once() {
    let (app, cutter) = spawn_behind_a_cutter().await;
    let key = uuid::Uuid::new_v4().to_string();
    let request = json!({ "name": "Ada", "balance": 500 });

    cutter.arm();
    let (status, replayed, first) = read(open_account(&app, Some(&key), &request).await).await;
    assert_eq!(cutter.cuts(), 1);
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{first}");
    let (status, replayed, again) = read(open_account(&app, Some(&key), &request).await).await;
    assert_eq!(
        (status, replayed, &again),
        (StatusCode::CREATED, true, &first)
    );
    assert_eq!(app.count("accounts").await, 1);
    let ada = created_account(&first);
    assert_eq!(app.balance(&ada).await, (500, 0));

    let order = json!({ "amount": 250 });
    cutter.arm();
    let (status, replayed, placed) = read(place_order(&app, &ada, Some(&key), &order).await).await;
    assert_eq!(cutter.cuts(), 2);
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{placed}");
    let (status, replayed, again) = read(place_order(&app, &ada, Some(&key), &order).await).await;
    assert_eq!(
        (status, replayed, &again),
        (StatusCode::CREATED, true, &placed)
    );
    assert_eq!(app.count("orders").await, 1);
    app.assert_audit_clean().await;
}

/// `POST /v1/accounts`, with `Idempotency-Key: <key>` when given.
pub async fn open_account(app: &TestApp, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut request = app.client.post(app.url("/v1/accounts")).json(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.send().await.unwrap()
}

/// `POST /v1/accounts/{id}/orders`, with `Idempotency-Key: <key>` when given.
pub async fn place_order(
    app: &TestApp,
    account: &TestAccount,
    key: Option<&str>,
    body: &Value,
) -> reqwest::Response {
    let mut request = app
        .client
        .post(app.url(&format!("/v1/accounts/{}/orders", account.id)))
        .bearer_auth(&account.key)
        .json(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.send().await.unwrap()
}

/// The account a create's answer shows.
fn created_account(body: &Value) -> TestAccount {
    TestAccount {
        id: body["id"].as_str().expect("id").to_owned(),
        key: body["api_key"].as_str().expect("api_key").to_owned(),
    }
}

// Each listed case on both backends.
on_backends!(
    creates;
    on_postgres_and_redis => Distributed,
    embedded => Embedded;
    [
        an_account_create_with_a_key_answers_once,
        an_order_create_with_a_key_answers_once,
        an_account_body_must_be_an_object,
        an_order_body_must_be_an_object,
        a_withdrawal_body_must_be_an_object,
        a_deposit_body_must_be_an_object,
        a_draw_body_must_be_an_object,
        a_payment_body_must_be_an_object,
    ]
);

/// `POST /v1/accounts` with an `Idempotency-Key`: the same key and body answer the first
/// answer again — the same account, the same API key — with `Idempotent-Replayed: true`;
/// another body under the key is 422 `idempotency-key-reuse`; a key that is not a UUID is
/// 400; a refused body stores nothing. Keys are the client address's: another address's
/// same key opens another account. Without a key every create opens an account.
async fn an_account_create_with_a_key_answers_once(backend: Backend) {
    let app = spawn_app_with(
        backend,
        &[
            "--client-ip-header",
            "x-real-ip",
            "--trusted-proxies",
            "127.0.0.1",
        ],
    )
    .await;
    let from = |address: &'static str, key: Option<&str>, body: &Value| {
        let mut request = app
            .client
            .post(app.url("/v1/accounts"))
            .header("x-real-ip", address)
            .json(body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send()
    };
    let key = uuid::Uuid::new_v4().to_string();
    let request = json!({ "name": "Ada", "balance": 1500, "points": 7 });

    // A refused body stores nothing: the key is still free afterwards.
    let refused = from("10.0.0.1", Some(&key), &json!({ "name": "" }))
        .await
        .unwrap();
    assert_invalid_request(refused).await;

    let first = from("10.0.0.1", Some(&key), &request).await.unwrap();
    let location = first.headers()["location"].clone();
    let (status, replayed, body) = read(first).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{body}");
    let ada = created_account(&body);
    assert_eq!(location, format!("/v1/accounts/{}", ada.id).as_str());

    // The same key and body — bare or quoted, the fields in another order, the defaults
    // spelled out or not: the first answer, API key included, which still works.
    for (sent, body_sent) in [
        (key.clone(), request.clone()),
        (format!("\"{key}\""), request.clone()),
        (
            key.clone(),
            json!({ "points": 7, "balance": 1500.0, "name": "Ada" }),
        ),
    ] {
        let again = from("10.0.0.1", Some(&sent), &body_sent).await.unwrap();
        assert_eq!(again.headers()["location"], location);
        let (status, replayed, again) = read(again).await;
        assert_eq!(
            (status, replayed, &again),
            (StatusCode::CREATED, true, &body)
        );
    }
    assert_eq!(app.balance(&ada).await, (1500, 7));

    // Another body under the key: refused, nothing opened.
    let reused = from(
        "10.0.0.1",
        Some(&key),
        &json!({ "name": "Ada", "balance": 1 }),
    )
    .await
    .unwrap();
    assert!(reused.headers().get("idempotent-replayed").is_none());
    assert_problem(
        reused,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reuse",
    )
    .await;

    // Keys that are not UUIDs, or two of them: 400, nothing opened.
    for bad in ["not-a-uuid", "12345", &key.replace('-', "")] {
        let response = from("10.0.0.1", Some(bad), &request).await.unwrap();
        assert_problem(response, StatusCode::BAD_REQUEST, "idempotency-key-invalid").await;
    }
    let twice = app
        .client
        .post(app.url("/v1/accounts"))
        .header("x-real-ip", "10.0.0.1")
        .header("idempotency-key", &key)
        .header("idempotency-key", uuid::Uuid::new_v4().to_string())
        .json(&request)
        .send()
        .await
        .unwrap();
    assert_problem(twice, StatusCode::BAD_REQUEST, "idempotency-key-invalid").await;
    assert_eq!(app.count("accounts").await, 1);

    // The key is the address's: from another address it opens another account.
    let (status, replayed, other) =
        read(from("10.0.0.2", Some(&key), &request).await.unwrap()).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{other}");
    assert_ne!(other["id"], body["id"]);
    assert_ne!(other["api_key"], body["api_key"]);

    // Without a key, every create opens an account.
    for _ in 0..2 {
        let (status, replayed, _) = read(from("10.0.0.1", None, &request).await.unwrap()).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, false));
    }
    assert_eq!(app.count("accounts").await, 4);
    app.assert_audit_clean().await;
}

/// `POST /v1/accounts/{id}/orders` with an `Idempotency-Key`: the same key and body answer
/// the first answer again (as it was: `open`, even once the order is paid), with
/// `Idempotent-Replayed: true`; another body is 422 `idempotency-key-reuse`; a key that
/// is not a UUID is 400. Keys are the account's: another account's same key places its
/// own order.
async fn an_order_create_with_a_key_answers_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 0).await;
    let bob = app.create_account(1000, 0).await;
    let key = uuid::Uuid::new_v4().to_string();
    let request = json!({ "amount": 250, "description": "order #7" });

    let refused = place_order(&app, &ada, Some(&key), &json!({ "amount": 0 })).await;
    assert_invalid_request(refused).await;

    let first = place_order(&app, &ada, Some(&key), &request).await;
    let location = first.headers()["location"].clone();
    let (status, replayed, placed) = read(first).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{placed}");
    let order = placed["order_id"].as_str().unwrap().to_owned();
    assert_eq!(location, format!("/v1/orders/{order}").as_str());

    let ticket = app.ticket(&ada).await;
    let paid = app
        .client
        .post(app.url(&format!("/v1/orders/{order}/payments")))
        .bearer_auth(&ada.key)
        .header("idempotency-key", &ticket)
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), StatusCode::CREATED);

    let again = place_order(&app, &ada, Some(&format!("\"{key}\"")), &request).await;
    assert_eq!(again.headers()["location"], location);
    let (status, replayed, again) = read(again).await;
    assert_eq!(
        (status, replayed, &again),
        (StatusCode::CREATED, true, &placed)
    );
    assert_eq!(again["state"], "open");

    let reused = place_order(
        &app,
        &ada,
        Some(&key),
        &json!({ "amount": 251, "description": "order #7" }),
    )
    .await;
    assert_problem(
        reused,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reuse",
    )
    .await;
    let bad = place_order(&app, &ada, Some("order-7"), &request).await;
    assert_problem(bad, StatusCode::BAD_REQUEST, "idempotency-key-invalid").await;
    assert_eq!(app.count("orders").await, 1);

    // Bob's key is his own, even when it is the same UUID.
    let (status, replayed, his) = read(place_order(&app, &bob, Some(&key), &request).await).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{his}");
    assert_ne!(his["order_id"], placed["order_id"]);
    // Without a key, every create places an order.
    for _ in 0..2 {
        let (status, replayed, _) = read(place_order(&app, &ada, None, &request).await).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, false));
    }
    assert_eq!(app.count("orders").await, 4);
    app.assert_audit_clean().await;
}

/// An endpoint that takes a JSON body.
#[derive(Clone, Copy, Debug)]
enum Endpoint {
    Accounts,
    Orders,
    Withdrawals,
    Deposits,
    LotteryDraws,
    Payments,
}

/// Opening an account refuses a body that is not an object (`["¨"]` opened an account
/// named "¨"): 422, no account.
async fn an_account_body_must_be_an_object(backend: Backend) {
    a_body_must_be_an_object(backend, Endpoint::Accounts).await;
}

/// Placing an order refuses a body that is not an object: 422, no order.
async fn an_order_body_must_be_an_object(backend: Backend) {
    a_body_must_be_an_object(backend, Endpoint::Orders).await;
}

/// A withdrawal refuses a body that is not an object: 422, the ticket stays usable.
async fn a_withdrawal_body_must_be_an_object(backend: Backend) {
    a_body_must_be_an_object(backend, Endpoint::Withdrawals).await;
}

/// A deposit refuses a body that is not an object: 422, the ticket stays usable.
async fn a_deposit_body_must_be_an_object(backend: Backend) {
    a_body_must_be_an_object(backend, Endpoint::Deposits).await;
}

/// A lottery draw refuses a body that is not an object (an empty one is still one point):
/// 422, the ticket stays usable.
async fn a_draw_body_must_be_an_object(backend: Backend) {
    a_body_must_be_an_object(backend, Endpoint::LotteryDraws).await;
}

/// An order payment refuses a body that is not an object (none, or `{}`, pays): 422, the
/// ticket stays usable.
async fn a_payment_body_must_be_an_object(backend: Backend) {
    a_body_must_be_an_object(backend, Endpoint::Payments).await;
}

/// Every body whose schema is an object refuses any other JSON value — an array (which
/// serde would otherwise read as the struct's fields in order), a string, a number, a
/// boolean, null — with 422 `invalid-request`; nothing is created or moved, and the
/// ticket stays usable: the request then goes through with a body the endpoint takes.
async fn a_body_must_be_an_object(backend: Backend, endpoint: Endpoint) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 5).await;
    let order = read(place_order(&app, &ada, None, &json!({ "amount": 100 })).await)
        .await
        .2["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let ticket = app.ticket(&ada).await;
    let (path, with_ticket, valid) = match endpoint {
        Endpoint::Accounts => ("/v1/accounts".to_owned(), false, json!({ "name": "¨" })),
        Endpoint::Orders => (
            format!("/v1/accounts/{}/orders", ada.id),
            false,
            json!({ "amount": 300 }),
        ),
        Endpoint::Withdrawals => (
            format!("/v1/accounts/{}/withdrawals", ada.id),
            true,
            json!({ "amount": 300 }),
        ),
        Endpoint::Deposits => (
            format!("/v1/accounts/{}/deposits", ada.id),
            true,
            json!({ "amount": 300 }),
        ),
        Endpoint::LotteryDraws => (
            format!("/v1/accounts/{}/lottery-draws", ada.id),
            true,
            json!({ "points": 2 }),
        ),
        Endpoint::Payments => (format!("/v1/orders/{order}/payments"), true, json!({})),
    };
    let post = |body: String| {
        let mut request = app
            .client
            .post(app.url(&path))
            .bearer_auth(&ada.key)
            .header("content-type", "application/json")
            .body(body);
        if with_ticket {
            request = request.header("idempotency-key", &ticket);
        }
        request.send()
    };
    for body in [
        r#"["¨"]"#,
        "[300]",
        " \n[300, \"x\"]",
        "[]",
        r#""Ada""#,
        "300",
        "true",
        "null",
    ] {
        let response = post(body.to_owned()).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{endpoint:?} with {body}"
        );
        assert_invalid_request(response).await;
    }
    // Malformed JSON stays 400, whatever it begins with.
    let malformed = post(r#"["Ada""#.to_owned()).await.unwrap();
    assert_problem(malformed, StatusCode::BAD_REQUEST, "malformed-json").await;

    assert_eq!(
        (app.count("accounts").await, app.count("orders").await),
        (1, 1)
    );
    assert_eq!(app.balance(&ada).await, (1000, 5));
    let shown = app.shown_ticket(&ada, &ticket).await;
    assert_eq!(shown["state"], "issued", "{shown}");
    let (status, replayed, body) = read(post(valid.to_string()).await.unwrap()).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{body}");
    if let Endpoint::LotteryDraws = endpoint {
        assert_eq!(app.balance(&ada).await.1, 3);
    }
    app.assert_audit_clean().await;
}
