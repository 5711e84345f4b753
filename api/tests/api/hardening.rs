//! The contract against unlucky clients and hostile ones: a commit whose answer is lost,
//! bursts, floods, abuse, slow clients, metric labels.

use std::time::Duration;

use futures::{StreamExt, stream};
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::helpers::{
    Backend, TestAccount, assert_problem, read, spawn_app, spawn_app_with, spawn_behind_a_cutter,
    text_of_type,
};

/// The connection to PostgreSQL dies after COMMIT was sent and before its answer came
/// back (here on the transaction path, which stores refusals): the client is told the
/// outcome is unknown (never "nothing was executed"), the ticket shows the spend
/// completed, and resending with the same ticket replays the stored 402 — so a client
/// that follows the answer never learns a different outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_commit_answer_is_outcome_unknown() {
    let (app, cutter) = spawn_behind_a_cutter().await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;

    cutter.arm();
    let response = app.withdraw(&ada, &ticket, 3000).await;
    let problem =
        assert_problem(response, StatusCode::SERVICE_UNAVAILABLE, "outcome-unknown").await;
    assert_eq!(cutter.cuts(), 1);
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains("same ticket")),
        "{problem}"
    );

    let shown = app.shown_ticket(&ada, &ticket).await;
    assert_eq!(shown["state"], "completed", "{shown}");
    let (status, replayed, body) = read(app.withdraw(&ada, &ticket, 3000).await).await;
    assert_eq!(
        (status, replayed),
        (StatusCode::PAYMENT_REQUIRED, true),
        "{body}"
    );
    assert_eq!(body, shown["response"]["body"]);
    assert_eq!(app.balance(&ada).await, (1000, 0));
    app.assert_audit_clean().await;
}

/// The answer to the one statement that spends a ticket is lost: the ledger sends it again
/// on another connection and learns what was stored, so the client gets its 201 — the
/// money moved once, not replayed — instead of an outcome it has to ask about.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_spend_answer_is_asked_again() {
    let (app, cutter) = spawn_behind_a_cutter().await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;

    let id: uuid::Uuid = ticket.parse().unwrap();
    cutter.arm_on(id.as_bytes(), 1);
    let (status, replayed, body) = read(app.withdraw(&ada, &ticket, 300).await).await;
    assert_eq!(cutter.cuts(), 1);
    // The first execution, though found by a second try: never answered as a replay.
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{body}");
    assert_eq!(body["balance"], 700, "{body}");
    assert_eq!(app.balance(&ada).await, (700, 0));
    app.assert_audit_clean().await;
}

/// 2,000 concurrent spends on one account (each with its own ticket) while another
/// account spends: the crowd is turned away cheaply — past the account's spend rate
/// (429), past the cap on its lock's waiters (409 at once) — the other account's spends
/// all succeed, every answer is one the contract declares, and the ledger is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_on_one_account_leaves_the_others_served() {
    let app = spawn_app_with(Backend::Distributed, &["--tickets-per-second", "0"]).await;
    let crowded = app.create_account(1_000_000, 0).await;
    let other = app.create_account(1_000_000, 0).await;
    let tickets: Vec<String> = stream::iter(0..2_000)
        .map(|_| app.ticket(&crowded))
        .buffer_unordered(64)
        .collect()
        .await;

    let (app_ref, crowded_ref) = (&app, &crowded);
    let flood = futures::future::join_all(
        tickets
            .iter()
            .map(|ticket| async move { app_ref.withdraw(crowded_ref, ticket, 1).await.status() }),
    );
    let others = async {
        let mut statuses = Vec::new();
        for _ in 0..20 {
            statuses.push(app.withdraw_with_a_new_ticket(&other, 1).await);
        }
        statuses
    };
    let (flood, others) = tokio::join!(flood, others);

    assert!(
        others.iter().all(|status| *status == StatusCode::CREATED),
        "the other account's spends: {others:?}"
    );
    let count = |wanted: StatusCode| flood.iter().filter(|&&status| status == wanted).count();
    let (created, busy, limited, shed) = (
        count(StatusCode::CREATED),
        count(StatusCode::CONFLICT),
        count(StatusCode::TOO_MANY_REQUESTS),
        count(StatusCode::SERVICE_UNAVAILABLE),
    );
    assert_eq!(
        created + busy + limited + shed,
        2_000,
        "undeclared answers in the flood: {flood:?}"
    );
    assert!(
        limited > 0 && created > 0,
        "{created} created, {limited} limited"
    );
    let spent = i64::try_from(created).unwrap();
    assert_eq!(app.balance(&crowded).await, (1_000_000 - spent, 0));
    assert_eq!(app.balance(&other).await, (1_000_000 - 20, 0));
    app.assert_audit_clean().await;
}

/// The embedded mode under a burst: 1,000 concurrent withdrawals on 1,000 accounts all
/// get their answer — 201, or 402 where the balance is short — and none 503: writes queue
/// for the one writer instead of failing on SQLite's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_embedded_burst_is_worked_off_not_refused() {
    let app = spawn_app(Backend::Embedded).await;
    let app_ref = &app;
    let accounts: Vec<(TestAccount, String)> = stream::iter(0..1_000)
        .map(|i| async move {
            let account = app_ref
                .create_account(if i % 2 == 0 { 100 } else { 50 }, 0)
                .await;
            let ticket = app_ref.ticket(&account).await;
            (account, ticket)
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let statuses = futures::future::join_all(accounts.iter().map(|(account, ticket)| async move {
        app_ref.withdraw(account, ticket, 80).await.status()
    }))
    .await;
    let created = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::PAYMENT_REQUIRED)
        .count();
    assert_eq!(
        (created, refused),
        (500, 500),
        "other answers: {:?}",
        statuses
            .iter()
            .filter(|s| !matches!(**s, StatusCode::CREATED | StatusCode::PAYMENT_REQUIRED))
            .collect::<Vec<_>>()
    );
    app.assert_audit_clean().await;
}

/// Past `PAYONCE_MAX_IN_FLIGHT`, a request is refused at once with 503 `overloaded` and
/// `Retry-After`, and served again once the instance has room.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_in_flight_cap_requests_are_shed_at_once() {
    let app = spawn_app_with(Backend::Distributed, &["--max-in-flight", "4", "--demo"]).await;
    let mut slow = Vec::new();
    for _ in 0..4 {
        let account = app.create_account(100, 0).await;
        let ticket = app.ticket(&account).await;
        slow.push(app.spawn_withdrawal(&account, &ticket, 1, &[("payonce-fault", "slow=1s")]));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = Instant::now();
    let response = app.get("/healthz").await;
    assert!(asked.elapsed() < Duration::from_millis(500));
    assert_problem(response, StatusCode::SERVICE_UNAVAILABLE, "overloaded").await;
    for request in slow {
        assert_eq!(request.await.unwrap().status(), StatusCode::CREATED);
    }
    let response = app.get("/healthz").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        app.metric("http_server_request_duration_seconds_count")
            .await
            >= 1.0
    );
}

/// Rate limits answer 429 `rate-limited` with `Retry-After` and store nothing: accounts
/// per client address (behind a proxy, the address the proxy names), tickets and spends
/// per account. A spend refused by the limit runs with the same ticket later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rate_limits_refuse_with_retry_after_and_store_nothing() {
    let app = spawn_app_with(
        Backend::Embedded,
        &[
            "--accounts-per-minute",
            "3",
            "--tickets-per-second",
            "2",
            "--spends-per-second",
            "2",
            "--client-ip-header",
            "x-real-ip",
            "--trusted-proxies",
            "127.0.0.1",
        ],
    )
    .await;
    let mut accounts = Vec::new();
    for _ in 0..3 {
        accounts.push(app.create_account(1000, 0).await);
    }
    let open = |address: Option<&'static str>| {
        let mut request = app
            .client
            .post(app.url("/v1/accounts"))
            .json(&json!({ "name": "limited" }));
        if let Some(address) = address {
            request = request.header("x-real-ip", address);
        }
        request.send()
    };
    let response = open(None).await.unwrap();
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_problem(response, StatusCode::TOO_MANY_REQUESTS, "rate-limited").await;
    // Another client behind the proxy has its own allowance.
    assert_eq!(
        open(Some("192.0.2.7")).await.unwrap().status(),
        StatusCode::CREATED
    );

    let ada = &accounts[0];
    let first = app.ticket(ada).await;
    let second = app.ticket(ada).await;
    let response = app
        .post_as(&ada.key, &format!("/v1/accounts/{}/tickets", ada.id))
        .await;
    assert_problem(response, StatusCode::TOO_MANY_REQUESTS, "rate-limited").await;

    assert_eq!(
        app.withdraw(ada, &first, 10).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        app.withdraw(ada, &first, 10).await.status(),
        StatusCode::CREATED
    );
    let response = app.withdraw(ada, &second, 10).await;
    assert_problem(response, StatusCode::TOO_MANY_REQUESTS, "rate-limited").await;
    let shown = app.shown_ticket(ada, &second).await;
    assert_eq!(shown["state"], "issued", "{shown}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (status, replayed, _) = read(app.withdraw(ada, &second, 10).await).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    assert_eq!(app.balance(ada).await, (980, 0));
    assert!(app.metric("payonce_rate_limited_total").await >= 3.0);
}

/// A client that sends its request head one byte at a time, slower than
/// `PAYONCE_HEADER_READ_TIMEOUT` allows, is disconnected within the timeout; so is one
/// that leaves its keep-alive connection idle. While slow clients hold every connection
/// `PAYONCE_MAX_CONNECTIONS` allows, a new client waits and is served once the timeout
/// frees a connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_clients_are_cut_off_by_the_header_timeout() {
    let app = spawn_app_with(
        Backend::Embedded,
        &["--header-read-timeout", "1s", "--max-connections", "2"],
    )
    .await;
    let address = app.address.trim_start_matches("http://").to_owned();

    // One byte every 300 ms: the head never completes.
    let dripping = {
        let address = address.clone();
        tokio::spawn(async move {
            let mut socket = TcpStream::connect(&address).await.unwrap();
            let connected = Instant::now();
            for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" {
                if socket.write_all(&[*byte]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
                if closed(&mut socket).await {
                    break;
                }
            }
            connected.elapsed()
        })
    };
    // A keep-alive connection left idle after one request.
    let idle = {
        let address = address.clone();
        tokio::spawn(async move {
            let mut socket = TcpStream::connect(&address).await.unwrap();
            socket
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut answer = [0_u8; 1024];
            let read = socket.read(&mut answer).await.unwrap();
            assert!(answer[..read].starts_with(b"HTTP/1.1 200"));
            let answered = Instant::now();
            while !closed(&mut socket).await {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            answered.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Both connections are taken: this client waits until the timeout frees one.
    let asked = Instant::now();
    let response = reqwest::Client::new()
        .get(app.url("/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let waited = asked.elapsed();
    assert!(
        waited > Duration::from_millis(500) && waited < Duration::from_secs(3),
        "served after {waited:?}"
    );
    let dripped_for = dripping.await.unwrap();
    assert!(
        dripped_for < Duration::from_millis(2_500),
        "the dripping client kept its connection for {dripped_for:?}"
    );
    let idled_for = idle.await.unwrap();
    assert!(
        idled_for < Duration::from_millis(2_500),
        "the idle connection stayed open for {idled_for:?}"
    );
}

/// Whether the server has closed `socket` (reads end of stream or fails at once).
async fn closed(socket: &mut TcpStream) -> bool {
    let mut byte = [0_u8; 1];
    match tokio::time::timeout(Duration::from_millis(1), socket.read(&mut byte)).await {
        Ok(Ok(0) | Err(_)) => true,
        Ok(Ok(_)) | Err(_) => false,
    }
}

/// `/metrics` passes `promtool check metrics` in the classic text format (every counter
/// described by its `_total` series), speaks OpenMetrics to a scraper that asks for it,
/// and labels invented methods `other` instead of minting a series per method.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_pass_promtool_and_invented_methods_share_a_label() {
    let app = spawn_app(Backend::Embedded).await;
    let ada = app.create_account(100, 0).await;
    assert_eq!(
        app.withdraw_with_a_new_ticket(&ada, 1).await,
        StatusCode::CREATED
    );
    for i in 0..20 {
        let method = reqwest::Method::from_bytes(format!("M{i}").as_bytes()).unwrap();
        let response = app
            .client
            .request(method, app.url("/healthz"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
    let response = app.get("/metrics").await;
    let text = text_of_type(response, "text/plain; version=0.0.4").await;
    assert!(!text.contains("http_request_method=\"M0\""), "{text}");
    assert!(text.contains("http_request_method=\"_OTHER\""), "{text}");

    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/services.sh installs it)");
    std::io::Write::write_all(&mut promtool.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let checked = promtool.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(
        checked.status.success() && said.trim().is_empty(),
        "promtool check metrics: {said}"
    );

    let response = app
        .client
        .get(app.url("/metrics"))
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .unwrap();
    let text = text_of_type(response, "application/openmetrics-text").await;
    assert!(text.ends_with("# EOF\n"));
}

/// 100 concurrent copies of one request on one instance: one execution, 99 replays — and
/// the account's lock was asked for once: the copies waited for the original inside the
/// instance, not in the lock's queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_wait_for_the_original_inside_the_instance() {
    let app = spawn_app(Backend::Distributed).await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;
    let (app_ref, ada_ref, ticket_ref) = (&app, &ada, &ticket);
    let answers = futures::future::join_all(
        (0..100)
            .map(|_| async move { read(app_ref.withdraw(ada_ref, ticket_ref, 10).await).await }),
    )
    .await;
    assert_eq!(
        answers.iter().filter(|(_, replayed, _)| !replayed).count(),
        1
    );
    assert!(
        answers
            .iter()
            .all(|(status, _, _)| *status == StatusCode::CREATED)
    );
    assert_eq!(app.metric("payonce_lock_wait_seconds_count").await, 1.0);
    assert!(app.state.flights().is_empty());
    assert_eq!(app.balance(&ada).await, (990, 0));
}

/// Two `Idempotency-Key` headers are refused (which would be meant?); an empty body sent
/// as JSON on a draw is one point, as with no body at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn small_contract_edges() {
    let app = spawn_app(Backend::Embedded).await;
    let ada = app.create_account(0, 5).await;
    let (one, two) = (app.ticket(&ada).await, app.ticket(&ada).await);
    let response = app
        .client
        .post(app.url(&format!("/v1/accounts/{}/lottery-draws", ada.id)))
        .bearer_auth(&ada.key)
        .header("idempotency-key", &one)
        .header("idempotency-key", &two)
        .json(&json!({ "points": 1 }))
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::BAD_REQUEST, "idempotency-key-invalid").await;
    let response = app
        .client
        .post(app.url(&format!("/v1/accounts/{}/lottery-draws", ada.id)))
        .bearer_auth(&ada.key)
        .header("idempotency-key", &one)
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    let (status, _, drawn) = read(response).await;
    assert_eq!(status, StatusCode::CREATED, "{drawn}");
    assert_eq!(
        (drawn["points"].as_i64(), drawn["points_after"].as_i64()),
        (Some(1), Some(4))
    );
}
