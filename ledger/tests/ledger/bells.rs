//! The bells on PostgreSQL: a commit that queues outbox work wakes the idle workers of
//! every instance on the database — each instance a ledger handle of its own here, as
//! each has its own pool — and only for the kind of work it queued.

use std::time::Duration;

use ledger::testing::TestDatabase;
use ledger::{JobKind, Ledger};
use sqlx::PgConnection;

use crate::postgres_races::connect;
use crate::suite::{account, apply, open, withdrawal};

const HOUR: Duration = Duration::from_secs(3600);

/// Long enough for a notification on a loaded machine; a bell that never comes fails.
const HEARD_WITHIN: Duration = Duration::from_secs(10);

/// Long enough that a bell rung by mistake would have come.
const SILENCE: Duration = Duration::from_millis(500);

/// `ledger` listening: its listener's session has run LISTEN. (The first wait starts the
/// listener; a notification sent before it listens is never heard.)
async fn listening(ledger: &Ledger, monitor: &mut PgConnection) {
    let _ = tokio::time::timeout(Duration::from_millis(1), ledger.rung(JobKind::Payout)).await;
    for _ in 0..500 {
        let listeners: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND query LIKE 'LISTEN%'",
        )
        .fetch_one(&mut *monitor)
        .await
        .unwrap();
        if listeners > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the ledger never listened");
}

/// Whether `kind`'s bell rings at `ledger` within `within`.
async fn rings(ledger: &Ledger, kind: JobKind, within: Duration) -> bool {
    tokio::time::timeout(within, ledger.rung(kind))
        .await
        .is_ok()
}

/// A payout accepted at one instance wakes the payout workers of another, and not its
/// webhook dispatcher (the account has no endpoint: nothing was queued for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payout_accepted_on_one_instance_wakes_the_payout_workers_of_another() {
    let database = TestDatabase::postgres().await.unwrap();
    let (here, there) = (open(&database).await, open(&database).await);
    let mut monitor = connect(&database).await;
    listening(&there, &mut monitor).await;
    assert!(
        !rings(&there, JobKind::Payout, SILENCE).await,
        "rung before anything was queued"
    );
    let account_id = account(&here, 1000, 0).await;
    let ticket = here.issue_ticket(account_id, HOUR).await.unwrap().id;
    let operation = ledger::Operation::Payout {
        payout: ledger::payouts::PayoutId::random(),
        amount: ledger::Amount::new(100).unwrap(),
        destination: ledger::payouts::Destination::new("acct-1").unwrap(),
    };
    let waiting = {
        let there = there.clone();
        tokio::spawn(async move { rings(&there, JobKind::Payout, HEARD_WITHIN).await })
    };
    let applied = apply(&here, account_id, ticket, operation, "p", 1)
        .await
        .unwrap();
    assert_eq!(applied.response.status, 202);
    assert!(waiting.await.unwrap(), "the other instance was never woken");
    assert!(!rings(&there, JobKind::Webhook, SILENCE).await);
}

/// A spend through the group commit wakes the other instances' webhook dispatchers when it
/// queued a delivery, and not when its account has no endpoint to queue one for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spend_rings_the_webhook_workers_only_when_it_queued_deliveries() {
    let database = TestDatabase::postgres().await.unwrap();
    let (here, there) = (open(&database).await, open(&database).await);
    let mut monitor = connect(&database).await;
    listening(&there, &mut monitor).await;
    let account_id = account(&here, 1000, 0).await;

    let ticket = here.issue_ticket(account_id, HOUR).await.unwrap().id;
    apply(&here, account_id, ticket, withdrawal(10), "w10", 1)
        .await
        .unwrap();
    assert!(
        !rings(&there, JobKind::Webhook, SILENCE).await,
        "rung for a spend that queued nothing"
    );

    crate::webhooks::endpoint(&here, account_id, None).await;
    let waiting = {
        let there = there.clone();
        tokio::spawn(async move { rings(&there, JobKind::Webhook, HEARD_WITHIN).await })
    };
    let ticket = here.issue_ticket(account_id, HOUR).await.unwrap().id;
    let applied = apply(&here, account_id, ticket, withdrawal(10), "w10", 2)
        .await
        .unwrap();
    assert_eq!(applied.response.status, 201);
    assert!(waiting.await.unwrap(), "the other instance was never woken");
}

/// A listener whose connection is cut cannot know what was sent meanwhile: once it
/// listens again it wakes every kind of worker, which then look for themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listener_cut_off_wakes_every_worker_once_it_listens_again() {
    let database = TestDatabase::postgres().await.unwrap();
    let there = open(&database).await;
    let mut monitor = connect(&database).await;
    listening(&there, &mut monitor).await;
    let waiting = {
        let there = there.clone();
        tokio::spawn(async move {
            (
                rings(&there, JobKind::Payout, HEARD_WITHIN).await,
                rings(&there, JobKind::Webhook, HEARD_WITHIN).await,
            )
        })
    };
    let cut: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND query LIKE 'LISTEN%') AS cut",
    )
    .fetch_one(&mut monitor)
    .await
    .unwrap();
    assert_eq!(cut, 1);
    assert_eq!(waiting.await.unwrap(), (true, true));
    listening(&there, &mut monitor).await;
}
