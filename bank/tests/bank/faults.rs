//! The faults, each met through the demonstration header or a rate: what the caller sees
//! and what the bank did.

use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::on_both_stores;
use crate::support::{Bank, Db, body, key, raw_transfer};

/// `fail-before` is a 500 with nothing stored: the same key then executes afresh.
#[tokio::test]
async fn fail_before_does_nothing() {
    let bank = Bank::start(Db::Sqlite, &[]).await;
    let key = key();
    let failed = bank
        .transfer(&key, &body("acct-1", 5, ""), Some("fail-before"))
        .await;
    assert_eq!((failed.status, failed.problem()), (500, "internal-error"));
    assert_eq!(bank.get(&format!("/v1/transfers/{key}")).await.status, 404);
    let executed = bank.transfer(&key, &body("acct-1", 5, ""), None).await;
    assert_eq!(executed.status, 201);
    assert!(!executed.replayed());
}

/// `unavailable` is a 503 with `Retry-After` and nothing stored.
#[tokio::test]
async fn unavailable_says_when_to_retry_and_does_nothing() {
    let bank = Bank::start(Db::Sqlite, &["--retry-after", "3s"]).await;
    let key = key();
    let refused = bank
        .transfer(&key, &body("acct-1", 5, ""), Some("unavailable"))
        .await;
    assert_eq!((refused.status, refused.problem()), (503, "unavailable"));
    assert_eq!(refused.header("retry-after"), Some("3"));
    assert_eq!(bank.get(&format!("/v1/transfers/{key}")).await.status, 404);
    assert_eq!(
        bank.transfer(&key, &body("acct-1", 5, ""), None)
            .await
            .status,
        201
    );
}

/// `--throttle-first N`: the first N transfer requests are 429 `rate-limited` with
/// `Retry-After`, whatever they carry and with nothing stored; the next one executes.
#[tokio::test]
async fn the_first_requests_are_throttled_then_taken() {
    let bank = Bank::start(
        Db::Sqlite,
        &["--throttle-first", "2", "--retry-after", "3s"],
    )
    .await;
    let key = key();
    for _ in 0..2 {
        let throttled = bank
            .transfer(&key, &body("acct-1", 5, ""), Some("decline"))
            .await;
        assert_eq!(
            (throttled.status, throttled.problem()),
            (429, "rate-limited")
        );
        assert_eq!(throttled.header("retry-after"), Some("3"));
        assert_eq!(bank.get(&format!("/v1/transfers/{key}")).await.status, 404);
    }
    let executed = bank.transfer(&key, &body("acct-1", 5, ""), None).await;
    assert_eq!(executed.status, 201);
}

/// `decline` stores a final 422 `destination-closed` under the key: a retry gets the same
/// decline, GET shows it declined with its reason, and no money moved.
async fn a_decline_is_final_and_stored(db: Db) {
    let bank = Bank::start(db, &[]).await;
    let key = key();
    let declined = bank
        .transfer(&key, &body("acct-1", 5, ""), Some("decline"))
        .await;
    assert_eq!(
        (declined.status, declined.problem()),
        (422, "destination-closed")
    );
    assert!(!declined.replayed());
    let again = bank.transfer(&key, &body("acct-1", 5, ""), None).await;
    assert_eq!(again.status, 422);
    assert!(again.replayed());
    assert_eq!(again.body, declined.body);
    let found = bank.get(&format!("/v1/transfers/{key}")).await;
    assert_eq!(found.status, 200);
    assert_eq!(found.body["state"], "declined");
    assert_eq!(found.body["decline_reason"], "destination-closed");
    bank.assert_audit_clean("0 transfers executed, 0 in total")
        .await;
}
on_both_stores!(a_decline_is_final_and_stored);

/// `commit-then-drop` executes, then closes the connection without one byte of answer
/// (seen on a raw TCP stream); GET shows the transfer, and a retry replays it.
async fn commit_then_drop_executes_and_answers_nothing(db: Db) {
    let bank = Bank::start(db, &[]).await;
    let key = key();
    let received = bank
        .raw(&raw_transfer(
            &key,
            &body("acct-1", 42, "dropped"),
            "commit-then-drop",
        ))
        .await;
    assert!(
        received.is_empty(),
        "{}",
        String::from_utf8_lossy(&received)
    );
    let found = bank.get(&format!("/v1/transfers/{key}")).await;
    assert_eq!(found.status, 200);
    assert_eq!(found.body["state"], "executed");
    assert_eq!(found.body["amount"], 42);
    let retried = bank
        .transfer(&key, &body("acct-1", 42, "dropped"), None)
        .await;
    assert_eq!(retried.status, 201);
    assert!(retried.replayed());
    assert_eq!(retried.body, found.body);
    assert_eq!(bank.all_transfers().await.len(), 1);
}
on_both_stores!(commit_then_drop_executes_and_answers_nothing);

/// `commit-then-slow` executes at once but answers only after `--slow-for`: a caller with
/// a shorter timeout gives up, yet the transfer is there.
#[tokio::test]
async fn commit_then_slow_executes_before_a_late_answer() {
    let bank = Bank::start(Db::Sqlite, &["--slow-for", "20s"]).await;
    let key = key();
    let impatient = bank
        .http
        .post(bank.url("/v1/transfers"))
        .header("Idempotency-Key", &key)
        .header("Payonce-Bank-Fault", "commit-then-slow")
        .timeout(Duration::from_millis(500))
        .json(&body("acct-1", 9, "slow"))
        .send()
        .await;
    assert!(impatient.is_err_and(|error| error.is_timeout()));
    let found = bank.get(&format!("/v1/transfers/{key}")).await;
    assert_eq!(
        (found.status, &found.body["state"]),
        (200, &"executed".into())
    );
}

/// `commit-then-slow` does answer in the end: the stored answer, after `--slow-for`.
#[tokio::test]
async fn commit_then_slow_answers_after_its_delay() {
    let bank = Bank::start(Db::Sqlite, &["--slow-for", "1s"]).await;
    let started = Instant::now();
    let answer = bank
        .transfer(&key(), &body("acct-1", 9, "slow"), Some("commit-then-slow"))
        .await;
    assert_eq!(answer.status, 201);
    assert!(started.elapsed() >= Duration::from_secs(1));
}

/// `down` closes the request's connection without an answer, refuses new connections for
/// `--down-for`, then listens again on the same address; the request did nothing.
#[tokio::test]
async fn down_refuses_connections_for_a_while() {
    let bank = Bank::start(Db::Sqlite, &["--down-for", "2s"]).await;
    let key = key();
    let received = bank
        .raw(&raw_transfer(&key, &body("acct-1", 5, ""), "down"))
        .await;
    assert!(
        received.is_empty(),
        "{}",
        String::from_utf8_lossy(&received)
    );
    let refused = TcpStream::connect(bank.addr).await;
    assert_eq!(
        refused.map(|_| ()).map_err(|error| error.kind()),
        Err(std::io::ErrorKind::ConnectionRefused)
    );
    let deadline = Instant::now() + crate::support::PATIENCE;
    loop {
        if let Ok(answer) = bank.http.get(bank.url("/healthz")).send().await {
            assert_eq!(answer.status(), 200);
            break;
        }
        assert!(Instant::now() < deadline, "the bank did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(bank.get(&format!("/v1/transfers/{key}")).await.status, 404);
}

/// A rate of 1 strikes every request without any header.
#[tokio::test]
async fn a_rate_strikes_without_the_header() {
    let bank = Bank::start(Db::Sqlite, &["--fault-unavailable", "1"]).await;
    for _ in 0..5 {
        let refused = bank.transfer(&key(), &body("acct-1", 5, ""), None).await;
        assert_eq!(refused.status, 503);
    }
    assert!(bank.all_transfers().await.is_empty());
}

/// Rates are drawn per request: at 0.5 `fail-before` and a fixed seed, some of forty
/// requests fail and some execute, and exactly the executed ones are stored.
#[tokio::test]
async fn rates_mix_faults_and_executions() {
    let bank = Bank::start(Db::Sqlite, &["--fault-fail-before", "0.5", "--seed", "28"]).await;
    let mut executed = 0;
    let mut failed = 0;
    for _ in 0..40 {
        match bank
            .transfer(&key(), &body("acct-1", 5, ""), None)
            .await
            .status
        {
            201 => executed += 1,
            500 => failed += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert!(
        executed > 0 && failed > 0,
        "{executed} executed, {failed} failed"
    );
    assert_eq!(bank.all_transfers().await.len(), executed);
}

/// Without `--demo-header` the bank ignores the header, as a real bank would.
#[tokio::test]
async fn the_header_needs_the_flag() {
    let store = crate::support::Store::fresh(Db::Sqlite).await;
    let mut command = tokio::process::Command::new(crate::support::BIN);
    command
        .args(["--addr", "127.0.0.1:0", "--database-url", &store.url])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("start the bank");
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(
        &mut tokio::io::BufReader::new(child.stdout.take().expect("stdout")),
        &mut line,
    )
    .await
    .expect("its address");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .expect("listening on ADDR");
    let answer = reqwest::Client::new()
        .post(format!("http://{addr}/v1/transfers"))
        .header("Idempotency-Key", key())
        .header("Payonce-Bank-Fault", "commit-then-drop")
        .json(&body("acct-1", 5, ""))
        .send()
        .await
        .expect("an answer");
    assert_eq!(answer.status(), 201);
}

/// Rates that add up past 1 are refused at start-up.
#[tokio::test]
async fn rates_past_one_are_refused() {
    let store = crate::support::Store::fresh(Db::Sqlite).await;
    let output = tokio::process::Command::new(crate::support::BIN)
        .args(["--addr", "127.0.0.1:0", "--database-url", &store.url])
        .args(["--fault-decline", "0.6", "--fault-unavailable", "0.5"])
        .output()
        .await
        .expect("run the bank");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("add up to"));
}

/// A store that fails is a 503 `unavailable` with `Retry-After`, never a 500 or a hang;
/// `/healthz` says so too.
#[tokio::test]
async fn a_failing_store_is_unavailable() {
    let bank = Bank::start(Db::Postgres, &[]).await;
    assert_eq!(
        bank.transfer(&key(), &body("acct-1", 5, ""), None)
            .await
            .status,
        201
    );
    bank.store.drop_database().await;
    let refused = bank.transfer(&key(), &body("acct-1", 5, ""), None).await;
    assert_eq!((refused.status, refused.problem()), (503, "unavailable"));
    assert!(refused.headers.contains_key("retry-after"));
    assert_eq!(bank.get("/healthz").await.status, 503);
}
