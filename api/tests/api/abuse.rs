//! The contract against clients that push at its edges: orders per account, a forged
//! client address, a flood of guessed keys, and who may create money.

use futures::{StreamExt, stream};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::helpers::{Backend, TestApp, assert_problem, read, spawn_app, spawn_app_with};

/// How many orders the account has, read from the test's PostgreSQL database.
async fn orders_of(app: &TestApp, account: &str) -> i64 {
    let pool = sqlx::PgPool::connect(app.shared.database.url())
        .await
        .unwrap();
    let count = sqlx::query_scalar("SELECT count(*) FROM orders WHERE account_id = $1")
        .bind(account.parse::<uuid::Uuid>().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    count
}

/// A burst of orders past `PAYONCE_ORDERS_PER_SECOND` is answered 429 `rate-limited`
/// with `Retry-After`, and the refused orders are not stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_past_the_accounts_rate_are_429_and_not_stored() {
    let app = spawn_app_with(Backend::Distributed, &["--orders-per-second", "3"]).await;
    let ada = app.create_account(1000, 0).await;
    let place = || {
        app.client
            .post(app.url(&format!("/v1/accounts/{}/orders", ada.id)))
            .bearer_auth(&ada.key)
            .json(&json!({ "amount": 10 }))
            .send()
    };
    let statuses: Vec<StatusCode> = futures::future::join_all((0..10).map(|_| place()))
        .await
        .into_iter()
        .map(|response| response.unwrap().status())
        .collect();
    let placed = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    let limited = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((placed, limited), (3, 7), "{statuses:?}");
    let response = place().await.unwrap();
    assert!(response.headers().contains_key("retry-after"));
    assert_problem(response, StatusCode::TOO_MANY_REQUESTS, "rate-limited").await;
    assert_eq!(orders_of(&app, &ada.id).await, 3);
}

/// Opens an account from `app`, saying (as a proxy would) that the client is `address`
/// in `header`; the answer's status.
async fn open_as(app: &TestApp, header: &str, address: &str) -> StatusCode {
    app.client
        .post(app.url("/v1/accounts"))
        .header(header, address)
        .json(&json!({ "name": "proxied" }))
        .send()
        .await
        .unwrap()
        .status()
}

/// `PAYONCE_CLIENT_IP_HEADER` from a peer that is not in `PAYONCE_TRUSTED_PROXIES` is
/// ignored: a client reaching the instance directly cannot name a new address for each
/// request and escape the per-address limit on opening accounts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_address_header_of_an_untrusted_peer_is_ignored() {
    let app = spawn_app_with(
        Backend::Embedded,
        &[
            "--accounts-per-minute",
            "2",
            "--client-ip-header",
            "x-real-ip",
            "--trusted-proxies",
            "192.0.2.0/24",
        ],
    )
    .await;
    assert_eq!(
        open_as(&app, "x-real-ip", "198.51.100.1").await,
        StatusCode::CREATED
    );
    assert_eq!(
        open_as(&app, "x-real-ip", "198.51.100.2").await,
        StatusCode::CREATED
    );
    // A third forged address: still the loopback client, over its allowance.
    let response = app
        .client
        .post(app.url("/v1/accounts"))
        .header("x-real-ip", "198.51.100.3")
        .json(&json!({ "name": "proxied" }))
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::TOO_MANY_REQUESTS, "rate-limited").await;
}

/// From a trusted proxy the header names the client: each client its own allowance. In
/// an `X-Forwarded-For` list the address counted is the last one no trusted proxy wrote
/// — an address the client put in front of its own changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_address_header_of_a_trusted_proxy_names_the_client() {
    let app = spawn_app_with(
        Backend::Embedded,
        &[
            "--accounts-per-minute",
            "2",
            "--client-ip-header",
            "x-forwarded-for",
            "--trusted-proxies",
            "127.0.0.0/8, ::1",
        ],
    )
    .await;
    let xff = "x-forwarded-for";
    assert_eq!(
        open_as(&app, xff, "198.51.100.1").await,
        StatusCode::CREATED
    );
    assert_eq!(
        open_as(&app, xff, "198.51.100.1").await,
        StatusCode::CREATED
    );
    assert_eq!(
        open_as(&app, xff, "198.51.100.1").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another client behind the proxy has its own allowance.
    assert_eq!(
        open_as(&app, xff, "198.51.100.2").await,
        StatusCode::CREATED
    );
    // The first client again, with a forged address in front: still the first client.
    assert_eq!(
        open_as(&app, xff, "203.0.113.50, 198.51.100.1").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The second client through two trusted proxies: still the second client, which
    // has one account left.
    assert_eq!(
        open_as(&app, xff, "198.51.100.2, 127.0.0.9").await,
        StatusCode::CREATED
    );
    assert_eq!(
        open_as(&app, xff, "198.51.100.2").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A flood of guessed keys from one address: after `PAYONCE_BAD_KEYS_PER_MINUTE` of them
/// the answers are 429 `rate-limited`, given before the key is looked up — the database
/// saw only the burst's look-ups. A key the instance knows is still served to that
/// address, and a request without a key costs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_wrong_keys_is_429_after_a_burst_of_look_ups() {
    const BURST: u64 = 5;
    let app = spawn_app_with(
        Backend::Distributed,
        &["--bad-keys-per-minute", &BURST.to_string()],
    )
    .await;
    let ada = app.create_account(100, 0).await;
    let path = format!("/v1/accounts/{}", ada.id);
    let started = Instant::now();
    let statuses: Vec<StatusCode> = stream::iter(0..200)
        .map(|i| {
            app.client
                .get(app.url(&path))
                .bearer_auth(format!("po_guess{i}"))
                .send()
        })
        .buffer_unordered(50)
        .map(|response| response.unwrap().status())
        .collect()
        .await;
    // One look-up comes back to the address every 60 s / BURST.
    let refilled = started.elapsed().as_secs() * BURST / 60;
    let count = |wanted| statuses.iter().filter(|s| **s == wanted).count() as u64;
    let (unknown, limited) = (
        count(StatusCode::UNAUTHORIZED),
        count(StatusCode::TOO_MANY_REQUESTS),
    );
    assert_eq!(unknown + limited, 200, "{statuses:?}");
    assert!(
        (BURST..=BURST + refilled).contains(&unknown),
        "{unknown} keys looked up"
    );
    assert_eq!(
        app.metric("payonce_key_lookups_total").await,
        unknown as f64
    );

    let guess = app.get_as("po_one_more_guess", &path).await;
    let retry_after: u64 = guess.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_problem(guess, StatusCode::TOO_MANY_REQUESTS, "rate-limited").await;
    let no_key = app.get(&path).await;
    assert_problem(no_key, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    assert_eq!(app.balance(&ada).await, (100, 0));
    assert_eq!(
        app.metric("payonce_key_lookups_total").await,
        unknown as f64
    );
}

const OPERATOR_KEY: &str = "operator-test-key-0123456789";

/// Opens an account with `balance` and `points`, with `key` as the bearer if any.
async fn open(app: &TestApp, balance: i64, points: i64, key: Option<&str>) -> (StatusCode, Value) {
    let mut request = app
        .client
        .post(app.url("/v1/accounts"))
        .json(&json!({ "name": "Ada", "balance": balance, "points": points }));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let (status, _, body) = read(request.send().await.unwrap()).await;
    (status, body)
}

/// Deposits `amount` into `account` with `ticket`, with `key` as the bearer.
async fn deposit(
    app: &TestApp,
    account: &str,
    ticket: &str,
    key: &str,
    amount: i64,
) -> reqwest::Response {
    app.client
        .post(app.url(&format!("/v1/accounts/{account}/deposits")))
        .bearer_auth(key)
        .header("idempotency-key", ticket)
        .json(&json!({ "amount": amount }))
        .send()
        .await
        .unwrap()
}

/// Without `PAYONCE_OPERATOR_KEY` (the demonstration default) anyone opens an account with
/// money and points, and an account deposits into itself with its own key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_an_operator_key_anyone_creates_money() {
    let app = spawn_app(Backend::Embedded).await;
    let (status, opened) = open(&app, 500, 7, None).await;
    assert_eq!(status, StatusCode::CREATED, "{opened}");
    let (id, key) = (
        opened["id"].as_str().unwrap().to_owned(),
        opened["api_key"].as_str().unwrap().to_owned(),
    );
    let account = crate::helpers::TestAccount {
        id: id.clone(),
        key: key.clone(),
    };
    let ticket = app.ticket(&account).await;
    let (status, _, body) = read(deposit(&app, &id, &ticket, &key, 50).await).await;
    assert_eq!(
        (status, &body["balance"]),
        (StatusCode::CREATED, &json!(550)),
        "{body}"
    );
}

/// With `PAYONCE_OPERATOR_KEY` set, an opening balance or points above zero and every
/// deposit need the operator key: without it 403 `operator-key-required` and nothing
/// stored (the ticket stays usable), a wrong key 401, with it 201. An account without
/// money still opens without any key, and the account's own key still withdraws.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_an_operator_key_only_the_operator_creates_money() {
    let app = spawn_app_with(Backend::Distributed, &["--operator-key", OPERATOR_KEY]).await;

    for (balance, points) in [(100, 0), (0, 3)] {
        let (status, body) = open(&app, balance, points, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(
            body["type"]
                .as_str()
                .unwrap()
                .ends_with("/operator-key-required"),
            "{body}"
        );
    }
    let (status, body) = open(&app, 100, 0, Some("not-the-operator-key-at-all")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, body) = open(&app, 0, 0, None).await;
    assert_eq!(
        (status, &body["balance"]),
        (StatusCode::CREATED, &json!(0)),
        "{body}"
    );
    let (status, funded) = open(&app, 100, 3, Some(OPERATOR_KEY)).await;
    assert_eq!(
        (status, &funded["balance"], &funded["points"]),
        (StatusCode::CREATED, &json!(100), &json!(3)),
        "{funded}"
    );
    let ada = crate::helpers::TestAccount {
        id: funded["id"].as_str().unwrap().to_owned(),
        key: funded["api_key"].as_str().unwrap().to_owned(),
    };

    let ticket = app.ticket(&ada).await;
    let refused = deposit(&app, &ada.id, &ticket, &ada.key, 50).await;
    let problem = assert_problem(refused, StatusCode::FORBIDDEN, "operator-key-required").await;
    assert!(
        problem["detail"].as_str().unwrap().contains("operator key"),
        "{problem}"
    );
    let wrong = deposit(&app, &ada.id, &ticket, "not-the-operator-key-at-all", 50).await;
    assert_problem(wrong, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    let shown = app.shown_ticket(&ada, &ticket).await;
    assert_eq!(shown["state"], "issued", "{shown}");
    assert_eq!(app.balance(&ada).await, (100, 3));

    let (status, replayed, body) =
        read(deposit(&app, &ada.id, &ticket, OPERATOR_KEY, 50).await).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{body}");
    assert_eq!(body["balance"], 150, "{body}");
    let (status, replayed, _) = read(deposit(&app, &ada.id, &ticket, OPERATOR_KEY, 50).await).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(
        app.withdraw_with_a_new_ticket(&ada, 30).await,
        StatusCode::CREATED
    );
    assert_eq!(app.balance(&ada).await, (120, 3));
    // Two accounts: the funded one and the one opened empty; nothing else was stored.
    let pool = sqlx::PgPool::connect(app.shared.database.url())
        .await
        .unwrap();
    let accounts: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert_eq!(accounts, 2);
    app.assert_audit_clean().await;
}

/// The document says who may create money and what a bad key costs: opening an account
/// takes no key or the operator's, a deposit the account's or the operator's, and every
/// operation that takes a key documents the 429 a client's bad keys can bring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_names_the_operator_key_and_the_bad_key_limit() {
    let app = spawn_app(Backend::Embedded).await;
    let spec = app.openapi().await;
    let schemes = &spec["components"]["securitySchemes"];
    assert_eq!(schemes["operator_key"]["scheme"], "bearer", "{schemes}");
    assert_eq!(
        spec["paths"]["/v1/accounts"]["post"]["security"],
        json!([{}, { "operator_key": [] }])
    );
    assert_eq!(
        spec["paths"]["/v1/accounts/{id}/deposits"]["post"]["security"],
        json!([{ "api_key": [] }, { "operator_key": [] }])
    );
    let mut keyed = 0;
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            if operation["security"].is_null() {
                continue;
            }
            keyed += 1;
            let limited = &operation["responses"]["429"];
            assert!(
                limited["description"]
                    .as_str()
                    .is_some_and(|text| text.contains("PAYONCE_BAD_KEYS_PER_MINUTE")),
                "{method} {path}: {limited}"
            );
            assert_eq!(
                limited["content"]["application/problem+json"]["schema"]["$ref"],
                "#/components/schemas/Problem",
                "{method} {path}"
            );
        }
    }
    assert_eq!(keyed, 28);
}
