//! A spend whose session the server ends after its commit (the group commit's path): the
//! client is never told "nothing was executed", and a first execution never carries
//! `Idempotent-Replayed`.

use std::sync::Arc;
use std::time::Duration;

use ledger::testing::PrivatePostgres;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{
    Backend, Shared, TestAccount, TestApp, assert_problem, read, spawn_behind_a_cutter,
    spawn_config,
};

/// An instance behind a cutter, an account with 1000, and a ticket of it whose spend's
/// batch the cutter answers with FATAL after its commit, `tries` times.
async fn a_spend_cut_after_its_commit(
    tries: usize,
) -> (TestApp, ledger::testing::CommitCutter, TestAccount, String) {
    let (app, cutter) = spawn_behind_a_cutter().await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;
    let id: uuid::Uuid = ticket.parse().unwrap();
    cutter.arm_fatal_on(id.as_bytes(), tries);
    (app, cutter, ada, ticket)
}

/// The server answers the statement that spends a ticket with FATAL after it committed:
/// the batch is sent again, finds the spend written under its own fencing token, and
/// answers the first execution as one — 201, not replayed — with the money moved once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fatal_after_the_commit_is_answered_as_the_first_execution() {
    let (app, cutter, ada, ticket) = a_spend_cut_after_its_commit(1).await;
    let (status, replayed, body) = read(app.withdraw(&ada, &ticket, 300).await).await;
    assert_eq!(cutter.cuts(), 1);
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{body}");
    assert_eq!(body["balance"], 700, "{body}");

    let (status, replayed, again) = read(app.withdraw(&ada, &ticket, 300).await).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true), "{again}");
    assert_eq!(again, body);
    assert_eq!(app.balance(&ada).await, (700, 0));
    app.assert_audit_clean().await;
}

/// Every try of the batch is answered with FATAL after its commit: the client is told the
/// outcome is unknown (never `database-unavailable`, "nothing was executed"); the ticket
/// shows the spend completed, and resending with the same ticket replays the stored 201.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fatal_on_every_try_is_outcome_unknown() {
    let (app, cutter, ada, ticket) = a_spend_cut_after_its_commit(1000).await;
    let response = app.withdraw(&ada, &ticket, 300).await;
    assert_problem(response, StatusCode::SERVICE_UNAVAILABLE, "outcome-unknown").await;
    assert!(cutter.cuts() >= 1);
    let id: uuid::Uuid = ticket.parse().unwrap();
    cutter.arm_on(id.as_bytes(), 0);

    let shown = app.shown_ticket(&ada, &ticket).await;
    assert_eq!(shown["state"], "completed", "{shown}");
    let (status, replayed, body) = read(app.withdraw(&ada, &ticket, 300).await).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true), "{body}");
    assert_eq!(body, shown["response"]["body"]);
    assert_eq!(app.balance(&ada).await, (700, 0));
    app.assert_audit_clean().await;
}

/// Runs `alter_system` on the server at `url` and reloads its configuration, returning once
/// the server has reloaded it — and so has told every backend to, which each does before
/// its next statement — with the connection it used.
async fn reconfigure(url: &str, alter_system: &str) -> sqlx::PgConnection {
    use sqlx::Connection;
    let mut control = sqlx::PgConnection::connect(url).await.unwrap();
    let loaded_at = "SELECT pg_conf_load_time()::text";
    let before: String = sqlx::query_scalar(loaded_at)
        .fetch_one(&mut control)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(alter_system))
        .execute(&mut control)
        .await
        .unwrap();
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&mut control)
        .await
        .unwrap();
    // A new session starts with the server's last load time.
    for _ in 0..500 {
        let mut fresh = sqlx::PgConnection::connect(url).await.unwrap();
        let now: String = sqlx::query_scalar(loaded_at)
            .fetch_one(&mut fresh)
            .await
            .unwrap();
        if now != before {
            return control;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the server did not reload its configuration");
}

/// How a withdrawal waiting for a synchronous standby that never comes is ended.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// `pg_terminate_backend` on the waiting backend; the server stays up.
    Terminated,
    /// `pg_ctl stop -m fast`; the server comes back afterwards.
    FastShutdown,
}

/// A private PostgreSQL whose commits wait for a synchronous standby named in
/// `synchronous_standby_names` that never connects; a withdrawal's commit is recorded
/// locally and waits; then its backend is ended as `ending` says. PostgreSQL reports
/// "the transaction has already committed locally" and ends the session. The client
/// gets either the first execution's 201 (the batch, sent again, found its own write) or
/// `outcome-unknown` (the server was gone) — never "nothing was executed" nor a replay —
/// and once the server is back the ticket reads `completed` and a resend replays the 201.
async fn a_commit_waiting_for_a_standby_is_ended(ending: Ending) -> (StatusCode, Value) {
    let postgres = Arc::new(PrivatePostgres::start().expect("a private PostgreSQL"));
    let shared = Shared::new(Backend::Distributed).await;
    let mut config = shared.config(&[]);
    config.database_url = Some(postgres.url());
    let app = spawn_config(shared, config).await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;

    let mut control = reconfigure(
        &postgres.url(),
        "ALTER SYSTEM SET synchronous_standby_names = 'standby_that_never_connects'",
    )
    .await;

    let withdrawal = {
        let (client, url, key, ticket) = (
            app.client.clone(),
            app.url(&format!("/v1/accounts/{}/withdrawals", ada.id)),
            ada.key.clone(),
            ticket.clone(),
        );
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(key)
                .header("Idempotency-Key", ticket)
                .json(&serde_json::json!({"amount": 300}))
                .send()
                .await
        })
    };
    // The withdrawal's backend waits for the standby: its commit is recorded locally.
    let waiting = async {
        loop {
            let pid: Option<i32> = sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' LIMIT 1",
            )
            .fetch_optional(&mut control)
            .await
            .unwrap();
            if let Some(pid) = pid {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let pid = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the withdrawal's commit waits for the standby");

    match ending {
        Ending::Terminated => {
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&mut control)
                .await
                .unwrap();
        }
        Ending::FastShutdown => {
            drop(control);
            let stopping = postgres.clone();
            tokio::task::spawn_blocking(move || stopping.stop().expect("PostgreSQL stops"))
                .await
                .unwrap();
        }
    }
    let response = withdrawal.await.unwrap().expect("an answer");
    let (status, replayed, body) = read(response).await;
    assert!(!replayed, "a first execution answered as a replay: {body}");
    assert!(
        status == StatusCode::CREATED
            || (status == StatusCode::SERVICE_UNAVAILABLE
                && body["type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("/outcome-unknown"))),
        "{status}: {body}"
    );

    if let Ending::FastShutdown = ending {
        let starting = postgres.clone();
        tokio::task::spawn_blocking(move || starting.start_again().expect("PostgreSQL starts"))
            .await
            .unwrap();
    }
    reconfigure(
        &postgres.url(),
        "ALTER SYSTEM RESET synchronous_standby_names",
    )
    .await;

    let shown = app.shown_ticket(&ada, &ticket).await;
    assert_eq!(shown["state"], "completed", "{shown}");
    let (again, replayed, stored) = read(app.withdraw(&ada, &ticket, 300).await).await;
    assert_eq!((again, replayed), (StatusCode::CREATED, true), "{stored}");
    assert_eq!(stored, shown["response"]["body"]);
    if status == StatusCode::CREATED {
        assert_eq!(body, stored);
    }
    assert_eq!(app.balance(&ada).await, (700, 0));
    app.assert_audit_clean().await;
    (status, body)
}

/// The waiting backend terminated while the server stays up: the batch, sent again on
/// another connection, finds the spend it wrote and answers 201 as a first execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_terminated_commit_waiting_for_a_standby_is_the_first_execution() {
    let (status, body) = a_commit_waiting_for_a_standby_is_ended(Ending::Terminated).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// The server shut down fast while the commit waited: no try can ask again, so the
/// client is told the outcome is unknown; after the restart the resend replays the 201.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fast_shutdown_during_a_commit_waiting_for_a_standby_is_outcome_unknown() {
    let (status, body) = a_commit_waiting_for_a_standby_is_ended(Ending::FastShutdown).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
}
