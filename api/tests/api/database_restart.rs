//! PostgreSQL restarting under load, on a private server (never the shared one).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ledger::testing::PrivatePostgres;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::helpers::{Backend, Shared, TestAccount, TestApp, spawn_config};

/// One answer a client got.
#[derive(Debug, Clone)]
struct Answer {
    sent_at: Instant,
    /// `None`: no answer at all.
    status: Option<StatusCode>,
    problem: Option<String>,
}

/// A spend as the client saw it in the end.
#[derive(Debug)]
struct Settled {
    account: usize,
    ticket: String,
    amount: i64,
    status: StatusCode,
}

async fn answer(sent_at: Instant, sent: reqwest::Result<reqwest::Response>) -> (Answer, Value) {
    match sent {
        Ok(response) => {
            let status = response.status();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            let problem = body["type"].as_str().map(str::to_owned);
            (
                Answer {
                    sent_at,
                    status: Some(status),
                    problem,
                },
                body,
            )
        }
        Err(_) => (
            Answer {
                sent_at,
                status: None,
                problem: None,
            },
            Value::Null,
        ),
    }
}

/// Whether a client should send the same request again: no answer, 409 or 503.
fn transient(answer: &Answer) -> bool {
    matches!(
        answer.status,
        None | Some(StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE)
    )
}

/// A client that keeps spending on `account` until `stop`, resending each request with
/// the same ticket until it gets a definitive answer, as real clients do.
async fn client(
    app: Arc<TestApp>,
    account: (usize, TestAccount),
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
) -> Vec<Settled> {
    let (index, account) = account;
    let mut settled = Vec::new();
    let mut round = 0_i64;
    while !stop.load(Ordering::SeqCst) {
        round += 1;
        let ticket = loop {
            let sent_at = Instant::now();
            let sent = app
                .client
                .post(app.url(&format!("/v1/accounts/{}/tickets", account.id)))
                .bearer_auth(&account.key)
                .send()
                .await;
            let (got, body) = answer(sent_at, sent).await;
            answers.lock().await.push(got.clone());
            if got.status == Some(StatusCode::CREATED) {
                break body["ticket_id"].as_str().unwrap().to_owned();
            }
            assert!(transient(&got), "a ticket request got {got:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let amount = 1 + round % 5;
        let status = loop {
            let sent_at = Instant::now();
            let sent = app
                .client
                .post(app.url(&format!("/v1/accounts/{}/withdrawals", account.id)))
                .bearer_auth(&account.key)
                .header("idempotency-key", &ticket)
                .json(&serde_json::json!({ "amount": amount }))
                .send()
                .await;
            let (got, _) = answer(sent_at, sent).await;
            answers.lock().await.push(got.clone());
            if !transient(&got) {
                break got.status.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        settled.push(Settled {
            account: index,
            ticket,
            amount,
            status,
        });
    }
    settled
}

/// Runs one client per account until `outage` has completed and `after` more has passed;
/// returns what they settled, every answer they got, and when the outage ended.
async fn load_around(
    app: &Arc<TestApp>,
    accounts: &[(usize, TestAccount)],
    before: Duration,
    outage: impl Future<Output = ()>,
    after: Duration,
) -> (Vec<Settled>, Vec<Answer>, Instant, Instant) {
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = accounts
        .iter()
        .cloned()
        .map(|account| tokio::spawn(client(app.clone(), account, stop.clone(), answers.clone())))
        .collect();
    tokio::time::sleep(before).await;
    let down_at = Instant::now();
    outage.await;
    let up_at = Instant::now();
    tokio::time::sleep(after).await;
    stop.store(true, Ordering::SeqCst);
    let mut settled = Vec::new();
    for client in clients {
        settled.extend(client.await.unwrap());
    }
    let answers = answers.lock().await.clone();
    (settled, answers, down_at, up_at)
}

/// Every answer is one the contract declares for a database outage.
fn assert_declared(answers: &[Answer]) {
    for answer in answers {
        let declared = match answer.status {
            Some(StatusCode::CREATED | StatusCode::PAYMENT_REQUIRED) => true,
            Some(StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE) => {
                answer.problem.as_deref().is_some_and(|problem| {
                    [
                        "/problems/database-unavailable",
                        "/problems/outcome-unknown",
                        "/problems/account-busy",
                        "/problems/request-in-progress",
                        "/problems/lock-lost",
                        "/problems/timeout",
                    ]
                    .contains(&problem)
                })
            }
            _ => false,
        };
        assert!(declared, "an undeclared answer: {answer:?}");
    }
}

/// Nothing sent at or after `up_at` got a 503, and something succeeded.
fn assert_back_at_once(answers: &[Answer], up_at: Instant, what: &str) {
    let after: Vec<&Answer> = answers
        .iter()
        .filter(|answer| answer.sent_at >= up_at)
        .collect();
    let failed: Vec<&&Answer> = after
        .iter()
        .filter(|answer| answer.status == Some(StatusCode::SERVICE_UNAVAILABLE))
        .collect();
    assert!(
        failed.is_empty(),
        "{what}: {} of {} requests sent after the database was back got 503: {failed:?}",
        failed.len(),
        after.len()
    );
    assert!(
        after
            .iter()
            .any(|answer| answer.status == Some(StatusCode::CREATED)),
        "{what}: nothing succeeded after the restart"
    );
}

/// PostgreSQL restarts — once while the service is quiet, once under load (a private
/// server; never the shared one): no money is lost or spent twice (the ledger's audit,
/// and each account's balance against the spends its client saw succeed), every answer is
/// one the contract declares, and the service is back as soon as the database is — no
/// request sent after the database came back is answered 503, though every pooled
/// connection died with the restart: a dead connection is replaced, and the statement
/// that found it dead runs on the new one (only statements that are safe to repeat:
/// reads, BEGIN, an idempotent insert).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_restart_loses_nothing_and_service_resumes_at_once() {
    let postgres = Arc::new(PrivatePostgres::start().expect("a private PostgreSQL"));
    let shared = Shared::new(Backend::Distributed).await;
    let mut config = shared.config(&[]);
    config.database_url = Some(postgres.url());
    let app = Arc::new(spawn_config(shared, config).await);
    let mut accounts = Vec::new();
    for index in 0..16 {
        accounts.push((index, app.create_account(100_000, 0).await));
    }
    let restart = |pause: Duration| {
        let postgres = postgres.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                postgres.stop().expect("PostgreSQL stops");
                std::thread::sleep(pause);
                postgres.start_again().expect("PostgreSQL starts again");
            })
            .await
            .unwrap();
        }
    };

    // 1. A quiet restart: the pool is full of connections (16 clients used it), all idle
    //    and all dead when the load comes back.
    let (mut settled, _, _, _) = load_around(
        &app,
        &accounts,
        Duration::from_millis(500),
        std::future::ready(()),
        Duration::ZERO,
    )
    .await;
    restart(Duration::from_millis(200)).await;
    let up_at = Instant::now();
    let (quiet, answers, _, _) = load_around(
        &app,
        &accounts,
        Duration::ZERO,
        std::future::ready(()),
        Duration::from_secs(1),
    )
    .await;
    assert_declared(&answers);
    assert_back_at_once(&answers, up_at, "after a quiet restart");
    settled.extend(quiet);

    // 2. A restart under load, down for four seconds: longer than a request waits for a
    //    connection (3 s), so the outage is answered (503), not only waited out.
    let (loaded, answers, down_at, up_at) = load_around(
        &app,
        &accounts,
        Duration::from_secs(1),
        restart(Duration::from_secs(4)),
        Duration::from_secs(2),
    )
    .await;
    assert!(
        answers
            .iter()
            .any(|answer| answer.sent_at >= down_at && answer.sent_at < up_at && transient(answer)),
        "no request noticed the database being down"
    );
    assert_declared(&answers);
    assert_back_at_once(&answers, up_at, "after a restart under load");
    settled.extend(loaded);

    // Nothing lost, nothing twice: each balance is what its client saw succeed, every
    // ticket remembers its success, and the ledger's own audit is clean.
    for (index, account) in &accounts {
        let spent: i64 = settled
            .iter()
            .filter(|spend| spend.account == *index && spend.status == StatusCode::CREATED)
            .map(|spend| spend.amount)
            .sum();
        assert_eq!(
            app.balance(account).await,
            (100_000 - spent, 0),
            "account {index}"
        );
    }
    for spend in &settled {
        assert_eq!(spend.status, StatusCode::CREATED, "{spend:?}");
        let account = &accounts[spend.account].1;
        let shown: Value = app
            .get_json(&account.key, &format!("/v1/tickets/{}", spend.ticket))
            .await;
        assert_eq!(shown["state"], "completed", "{shown}");
        assert_eq!(shown["response"]["status"], 201, "{shown}");
    }
    app.assert_audit_clean().await;
}
