//! The demonstration: unsafe strategies reachable only by configuration or under
//! `--demo`, each taking its own path, and spending twice where it is known to.

use std::time::Duration;

use lock::testing::RedisServer;
use reqwest::StatusCode;

use crate::helpers::{
    Backend, SHORT_LEASE_DEMO, Shared, TestAccount, TestApp, assert_problem, read, spawn_app_with,
    spawn_config,
};

/// Eight concurrent withdrawals of the whole balance: how many were accepted.
async fn race(app: &TestApp, headers: &[(&str, &str)]) -> (usize, TestAccount) {
    let account = app.create_account(100, 0).await;
    let mut tickets = Vec::new();
    for _ in 0..8 {
        tickets.push(app.ticket(&account).await);
    }
    let answers = futures::future::join_all(
        tickets
            .iter()
            .map(|ticket| app.withdrawal(&account, ticket, 100, headers).send()),
    )
    .await;
    let accepted = answers
        .iter()
        .filter(|answer| {
            answer
                .as_ref()
                .is_ok_and(|answer| answer.status() == StatusCode::CREATED)
        })
        .count();
    (accepted, account)
}

/// Without `--demo`, `Payonce-Strategy` and `Payonce-Fault` are ignored: the spend is
/// fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn strategy_header_is_ignored_without_the_demo_flag() {
    let app = spawn_app_with(Backend::Embedded, &[]).await;
    let (accepted, account) = race(
        &app,
        &[
            ("payonce-strategy", "none"),
            ("payonce-fault", "slow=100ms"),
        ],
    )
    .await;
    assert_eq!(accepted, 1);
    assert_eq!(app.balance(&account).await, (0, 0));
    app.assert_audit_clean().await;
}

/// Without `--demo`, a requested pause is not injected either: a spend asking for a pause
/// far longer than its lock's lease answers 201 at once, not 503 lock-lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fault_header_is_ignored_without_the_demo_flag() {
    for backend in [Backend::Embedded, Backend::Distributed] {
        let app = spawn_app_with(backend, &["--lock-ttl", "300ms"]).await;
        let account = app.create_account(100, 0).await;
        let ticket = app.ticket(&account).await;
        let started = std::time::Instant::now();
        let response = app
            .withdrawal(&account, &ticket, 10, &[("payonce-fault", "pause=2s")])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED, "{backend:?}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{backend:?}: the pause was injected ({:?})",
            started.elapsed()
        );
        assert_eq!(app.balance(&account).await, (90, 0));
    }
}

/// `none`: read, check, write, with no lock — concurrent withdrawals of the whole balance
/// all succeed, and the ledger's audit sees the money spent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_lock_spends_the_same_money_several_times() {
    for backend in [Backend::Embedded, Backend::Distributed] {
        let app = spawn_app_with(backend, &["--demo"]).await;
        let (accepted, account) = race(
            &app,
            &[
                ("payonce-strategy", "none"),
                ("payonce-fault", "slow=150ms"),
            ],
        )
        .await;
        assert!(accepted > 1, "{backend:?}: only {accepted} accepted");
        assert_eq!(app.balance(&account).await, (0, 0));
        app.assert_audit_finds(ledger::Rule::BalanceMatchesEntries, &format!("{backend:?}"))
            .await;
    }
}

/// `unfenced` on Redis (a TTL lock, its fencing token ignored): a holder paused past its lease writes after its
/// successor, and the money is spent twice. The fenced counterpart is
/// `paused_lock_holder_cannot_commit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_lock_without_fencing_spends_twice_under_a_pause() {
    let app = spawn_app_with(Backend::Distributed, SHORT_LEASE_DEMO).await;
    let account = app.create_account(100, 0).await;
    let unfenced = ("payonce-strategy", "unfenced");
    let paused = app.ticket(&account).await;
    let first = app.spawn_withdrawal(
        &account,
        &paused,
        100,
        &[unfenced, ("payonce-fault", "pause=1s")],
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    let next = app.ticket(&account).await;
    let second = app
        .withdrawal(&account, &next, 100, &[unfenced])
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    assert_eq!(
        first.await.unwrap().status(),
        StatusCode::CREATED,
        "the paused holder wrote after its successor"
    );
    let violations = app.state.ledger().audit().await.unwrap();
    assert!(
        !violations.is_empty(),
        "100 spent twice, and the audit must see it"
    );
}

/// Every strategy serves a plain spend and its replay (Redlock over three private Redis
/// servers).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_strategy_serves_a_spend_and_its_replay() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let shared = Shared::new(Backend::Distributed).await;
    let urls = nodes
        .iter()
        .map(RedisServer::url)
        .collect::<Vec<_>>()
        .join(",");
    let app = spawn_config(
        shared.clone(),
        shared.config(&["--demo", "--redlock-urls", &urls]),
    )
    .await;
    let account = app.create_account(10_000, 0).await;
    for strategy in api::config::Strategy::ALL {
        let ticket = app.ticket(&account).await;
        let headers = [("payonce-strategy", strategy.name())];
        let send = || async {
            read(
                app.withdrawal(&account, &ticket, 10, &headers)
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        };
        let (status, replayed, first) = send().await;
        assert_eq!(
            (status, replayed),
            (StatusCode::CREATED, false),
            "{strategy:?}: {first}"
        );
        let (status, replayed, again) = send().await;
        assert_eq!(
            (status, replayed, again),
            (StatusCode::CREATED, true, first),
            "{strategy:?}"
        );
    }
    assert_eq!(app.balance(&account).await, (9_940, 0));
    app.assert_audit_clean().await;
}

/// Unknown strategies and malformed faults are 400; strategies that need Redis are 400 in
/// the embedded mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_demonstration_headers_are_400() {
    let app = spawn_app_with(Backend::Embedded, &["--demo"]).await;
    let account = app.create_account(100, 0).await;
    let ticket = app.ticket(&account).await;
    for headers in [
        [("payonce-strategy", "optimistic")],
        [("payonce-fault", "pause")],
        [("payonce-fault", "explode=1s")],
        [("payonce-strategy", "redlock")],
        [("payonce-strategy", "setnx-expire")],
    ] {
        let response = app
            .withdrawal(&account, &ticket, 1, &headers)
            .send()
            .await
            .unwrap();
        assert_problem(response, StatusCode::BAD_REQUEST, "bad-request").await;
    }
    let plain = app
        .withdrawal(&account, &ticket, 1, &[])
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), StatusCode::CREATED);
}

/// An unsafe strategy that needs Redis cannot be the instance's strategy in the embedded
/// mode, and Redlock needs three nodes.
#[tokio::test]
async fn unsafe_strategies_refuse_to_start_without_what_they_need() {
    let shared = Shared::new(Backend::Embedded).await;
    let error = api::state::AppState::connect(&shared.config(&["--lock-strategy", "getset"]))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("needs Redis"), "{error}");
    let shared = Shared::new(Backend::Distributed).await;
    let error = api::state::AppState::connect(&shared.config(&["--lock-strategy", "redlock"]))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("PAYONCE_REDLOCK_URLS"),
        "{error}"
    );
}

/// A demonstration spend of `path` with `headers`: status and body.
async fn demo_spend(
    app: &TestApp,
    account: &TestAccount,
    path: &str,
    body: serde_json::Value,
    headers: &[(&str, &str)],
) -> (StatusCode, serde_json::Value) {
    let mut request = app
        .client
        .post(app.url(path))
        .bearer_auth(&account.key)
        .header("idempotency-key", app.ticket(account).await)
        .json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let (status, _, body) = read(request.send().await.unwrap()).await;
    (status, body)
}

/// `none` on refunds: two refunds of 60 on an order of 100, each reading the order before
/// the other writes (a slow call-out between read and write), both pass — 120 given back
/// on a payment of 100 — and the ledger's audit finds refunds past the payment. Fenced,
/// the same two give one 201 and one 409 (`holds::two_refunds_at_once_one_fits`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_lock_refunds_more_than_was_paid() {
    for backend in [Backend::Embedded, Backend::Distributed] {
        let app = spawn_app_with(backend, &["--demo"]).await;
        let ada = app.create_account(1000, 0).await;
        let (status, order) = demo_spend(
            &app,
            &ada,
            &format!("/v1/accounts/{}/orders", ada.id),
            serde_json::json!({ "amount": 100 }),
            &[],
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{order}");
        let order = order["order_id"].as_str().unwrap().to_owned();
        let (status, paid) = demo_spend(
            &app,
            &ada,
            &format!("/v1/orders/{order}/payments"),
            serde_json::json!({}),
            &[],
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{paid}");
        let path = format!("/v1/orders/{order}/refunds");
        let unguarded = [
            ("payonce-strategy", "none"),
            ("payonce-fault", "slow=300ms"),
        ];
        let refund = || {
            demo_spend(
                &app,
                &ada,
                &path,
                serde_json::json!({ "amount": 60 }),
                &unguarded,
            )
        };
        let (first, second) = tokio::join!(refund(), refund());
        assert_eq!(
            (first.0, second.0),
            (StatusCode::CREATED, StatusCode::CREATED),
            "{backend:?}: {first:?} {second:?}"
        );
        assert_eq!(app.balance(&ada).await, (1020, 0), "{backend:?}");
        app.assert_audit_finds(ledger::Rule::RefundsWithinPayment, &format!("{backend:?}"))
            .await;
    }
}

/// Placing, capturing and voiding holds run fenced whatever the strategy asked for (as
/// order payments and payouts do): a capture and a void of one hold sent together under
/// `none` settle to one, and the ledger's audit is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn holds_run_fenced_under_any_strategy() {
    let app = spawn_app_with(Backend::Distributed, &["--demo"]).await;
    let ada = app.create_account(1000, 0).await;
    let unguarded = [
        ("payonce-strategy", "none"),
        ("payonce-fault", "slow=100ms"),
    ];
    let (status, hold) = demo_spend(
        &app,
        &ada,
        &format!("/v1/accounts/{}/holds", ada.id),
        serde_json::json!({ "amount": 100 }),
        &unguarded,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{hold}");
    let hold = hold["hold_id"].as_str().unwrap().to_owned();
    let (capture_path, void_path) = (
        format!("/v1/holds/{hold}/capture"),
        format!("/v1/holds/{hold}/void"),
    );
    let (capture, void) = tokio::join!(
        demo_spend(&app, &ada, &capture_path, serde_json::json!({}), &unguarded),
        demo_spend(&app, &ada, &void_path, serde_json::json!({}), &unguarded),
    );
    let mut statuses = [capture.0, void.0];
    statuses.sort();
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::CONFLICT],
        "{capture:?} {void:?}"
    );
    app.assert_audit_clean().await;
}
