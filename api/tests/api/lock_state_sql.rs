//! The SQL lock stores (PostgreSQL advisory locks, the MySQL lock table, MySQL row locks)
//! prune the per-key state every order would otherwise leave behind; here, with the
//! service's own lock service and ledger, that pruning leaves fencing as it was.

use std::time::Duration;

use crate::helpers::{Backend, spawn_app};

/// A key pruned between two grants: the ledger accepts the token of the grant after the
/// pruning (its counter started again from the clock, above the last one it accepted)
/// and refuses that of a grant from before it which never wrote.
async fn the_ledger_accepts_the_next_token_after_pruning(backend: Backend) {
    let app = spawn_app(backend).await;
    let locks = app.state.locks();
    let ada = app.create_account(1000, 0).await;
    let key = format!("lock:account:{}", ada.id);
    let ttl = Duration::from_secs(2);
    let mut tickets = Vec::new();
    for _ in 0..3 {
        tickets.push(ledger::TicketId(app.ticket(&ada).await.parse().unwrap()));
    }

    // A write under the first grant: the ledger records its token.
    let mut first = locks.try_acquire(&key, ttl).await.unwrap().expect("free");
    let written = app
        .withdraw_under_token(&ada, tickets[0], 300, first.fencing_token().get())
        .await
        .unwrap();
    assert_eq!(written.response.status, 201);
    assert!(first.release().await.unwrap());
    // A holder that never wrote before its lease ended (released here: the connection's
    // and the transaction's leases end no other way without a real pause).
    let mut stale = locks.try_acquire(&key, ttl).await.unwrap().expect("free");
    assert!(stale.release().await.unwrap());

    tokio::time::sleep(Duration::from_millis(400)).await;
    let forgotten = locks.prune_idle(Duration::from_millis(300)).await.unwrap();
    assert!(forgotten >= 1, "{backend:?}: nothing pruned");

    let mut later = locks.try_acquire(&key, ttl).await.unwrap().expect("free");
    assert!(later.fencing_token() > stale.fencing_token());
    app.assert_later_grant_wins(
        &ada,
        (tickets[1], &later),
        (tickets[2], &stale),
        300,
        &format!("{backend:?}"),
    )
    .await;
    assert!(later.release().await.unwrap());
    assert_eq!(app.balance(&ada).await, (400, 0));
    app.assert_audit_clean().await;
}

/// On PostgreSQL advisory locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_advisory_locks_pruned_between_grants_keep_fencing() {
    the_ledger_accepts_the_next_token_after_pruning(Backend::PostgresLocks).await;
}

/// On the MySQL lock table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_lock_table_pruned_between_grants_keeps_fencing() {
    the_ledger_accepts_the_next_token_after_pruning(Backend::MySqlTable).await;
}

/// On MySQL row locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_row_locks_pruned_between_grants_keep_fencing() {
    the_ledger_accepts_the_next_token_after_pruning(Backend::MySqlRow).await;
}
