//! On PostgreSQL, the outbox's steps on a database whose statistics were taken before the
//! open work came — a long history of finished jobs, analysed; then a burst of new ones,
//! which autoanalyze does not look at again for a while. There the planner believes the
//! indexes of open work (`outbox_due`, `payouts_pending`) hold next to nothing, and any
//! statement whose conditions let it use them walks all the open work for each row it
//! touches. It happened three times (a claim's update, a delivery's recording, a payout's
//! settlement), each shown only by a benchmark. These tests pin it by what PostgreSQL
//! counts, not by time: the index entries read while the ledger claims and finishes a
//! hundred jobs: the blocks of those indexes they touch.

use std::time::Duration;

use ledger::Ledger;
use ledger::payouts::Settlement;
use ledger::testing::TestDatabase;
use ledger::webhooks::{AttemptAnswer, DeliveryOutcome};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use crate::holds::{capture, place, spend};
use crate::postgres_races::connect;
use crate::suite::{account, open};

const LEASE: Duration = Duration::from_secs(30);
/// Finished work in the history, and open work queued after the statistics were taken.
const HISTORY: i64 = 20_000;
const OPEN: i64 = 20_000;
/// Jobs the ledger claims and finishes, 25 a claim.
const WORKED: u32 = 100;
/// The most index blocks the claims and the finishes of [`WORKED`] jobs may touch. Done
/// right they touch about 230 of the open-work index (the claims' walks, and the entries
/// their updates add) and 4 of the pending payouts'; walking the open work once per job
/// touched 10,301 and 1,803 when this was written.
const FEW: i64 = 1_000;

/// Blocks of index `index` touched so far, once the sessions of this database that `left`
/// says have ended (a session's counts are published as it ends).
async fn blocks_touched(
    monitor: &mut PgConnection,
    index: &str,
    left: &str,
    pid: Option<i32>,
) -> i64 {
    for _ in 0..500 {
        let waiting: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid() AND {left}"
        )))
        .bind(pid)
        .fetch_one(&mut *monitor)
        .await
        .unwrap();
        if waiting == 0 {
            sqlx::query("SELECT pg_stat_clear_snapshot()")
                .execute(&mut *monitor)
                .await
                .unwrap();
            return sqlx::query_scalar(
                "SELECT idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes
                 WHERE indexrelname = $1",
            )
            .bind(index)
            .fetch_one(&mut *monitor)
            .await
            .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("sessions of the database did not end within 10 s");
}

/// What the setup session, `pid`, left in `indexes` (once it ended), and what the
/// ledger's sessions added (once they all ended, after `work`).
async fn touched_by<F: Future<Output = ()>>(
    database: &TestDatabase,
    pid: i32,
    indexes: &[&str],
    work: F,
) -> Vec<i64> {
    let mut monitor = connect(database).await;
    let mut before = Vec::new();
    for index in indexes {
        before.push(blocks_touched(&mut monitor, index, "pid = $1", Some(pid)).await);
    }
    work.await;
    let mut added = Vec::new();
    for (index, before) in indexes.iter().zip(before) {
        let after = blocks_touched(&mut monitor, index, "$1::int IS NULL", None).await;
        added.push(after - before);
    }
    added
}

/// A ledger on a fresh database whose tables autovacuum leaves alone (so nothing analyses
/// them behind the test's back), with one account; and a connection to set it up.
async fn fresh() -> (TestDatabase, Ledger, ledger::AccountId, PgConnection) {
    let database = TestDatabase::postgres().await.unwrap();
    let ledger = open(&database).await;
    let account_id = account(&ledger, 1_000_000, 0).await;
    let mut setup = connect(&database).await;
    sqlx::raw_sql(
        "ALTER TABLE outbox SET (autovacuum_enabled = false);
         ALTER TABLE payouts SET (autovacuum_enabled = false);
         ALTER TABLE tickets SET (autovacuum_enabled = false);",
    )
    .execute(&mut setup)
    .await
    .unwrap();
    (database, ledger, account_id, setup)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_recorded_without_walking_the_open_work() {
    let (database, ledger, account_id, mut setup) = fresh().await;
    let endpoint = crate::webhooks::endpoint(&ledger, account_id, None).await;
    // `$3` withdrawals of the account, each its own event, with a delivery to the endpoint:
    // delivered a day ago when `$4`, else due now.
    let announce = "
        WITH written AS (
            INSERT INTO tickets (id, account_id, created_at, expires_at, operation, fingerprint,
                                 response_status, response_body, completed_at)
            SELECT gen_random_uuid(), $1, now(), now() + interval '1 day', 'withdrawal', 'w',
                   201, '{\"amount\":1}', now()
            FROM generate_series(1, $3)
            RETURNING id
        )
        INSERT INTO outbox (kind, event_id, endpoint_id, event_type, due_at, created_at,
                            done_at, outcome, attempts)
        SELECT 'webhook', id, $2, 'withdrawal.succeeded', now(), now(),
               CASE WHEN $4 THEN now() - interval '1 day' END,
               CASE WHEN $4 THEN 'delivered' END, CASE WHEN $4 THEN 1 ELSE 0 END
        FROM written";
    for (count, delivered) in [(HISTORY, true), (OPEN, false)] {
        sqlx::query(announce)
            .bind(account_id)
            .bind(endpoint)
            .bind(count)
            .bind(delivered)
            .execute(&mut setup)
            .await
            .unwrap();
        if delivered {
            sqlx::query("ANALYZE outbox, tickets")
                .execute(&mut setup)
                .await
                .unwrap();
        }
    }
    let setup_pid = setup_pid(setup).await;

    let answer = AttemptAnswer {
        duration: Duration::from_millis(2),
        status: Some(204),
        error: None,
        body: None,
    };
    let work = async {
        let mut worked = 0;
        while worked < WORKED {
            let jobs = ledger.claim_deliveries("w", LEASE, 25).await.unwrap();
            assert!(!jobs.is_empty());
            let outcomes: Vec<_> = jobs
                .iter()
                .map(|job| (job, &answer, &DeliveryOutcome::Delivered))
                .collect();
            let recorded = ledger.record_deliveries(&outcomes).await.unwrap();
            assert!(recorded.iter().all(|recorded| *recorded));
            worked += u32::try_from(jobs.len()).unwrap();
        }
        ledger.close().await;
    };
    let touched = touched_by(&database, setup_pid, &["outbox_due"], work).await;
    assert!(
        touched[0] < FEW,
        "{WORKED} deliveries claimed and recorded touched {} blocks of the open-work index",
        touched[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payouts_are_settled_without_walking_the_pending_ones() {
    let (database, ledger, account_id, mut setup) = fresh().await;
    // `$2` payouts of the account, each with its completed ticket: succeeded a day ago
    // when `$3`, else pending with a job due now.
    let pay_out = "
        WITH written AS (
            INSERT INTO tickets (id, account_id, created_at, expires_at, operation, fingerprint,
                                 response_status, response_body, completed_at)
            SELECT gen_random_uuid(), $1, now(), now() + interval '1 day', 'payout', 'p',
                   202, '{}', now()
            FROM generate_series(1, $2)
            RETURNING id
        ), paid AS (
            INSERT INTO payouts (id, account_id, ticket_id, amount, destination, status,
                                 bank_transfer_id, created_at, settled_at, attempts)
            SELECT gen_random_uuid(), $1, id, 1, 'acct-1',
                   CASE WHEN $3 THEN 'succeeded' ELSE 'pending' END,
                   CASE WHEN $3 THEN 'transfer-' || id END, now(),
                   CASE WHEN $3 THEN now() END, CASE WHEN $3 THEN 1 ELSE 0 END
            FROM written
            RETURNING id
        )
        INSERT INTO outbox (kind, payout_id, due_at, created_at)
        SELECT 'payout', id, now(), now() FROM paid WHERE NOT $3";
    for (count, settled) in [(HISTORY, true), (OPEN, false)] {
        sqlx::query(pay_out)
            .bind(account_id)
            .bind(count)
            .bind(settled)
            .execute(&mut setup)
            .await
            .unwrap();
        if settled {
            sqlx::query("ANALYZE outbox, payouts, tickets")
                .execute(&mut setup)
                .await
                .unwrap();
        }
    }
    let setup_pid = setup_pid(setup).await;

    let render = |payout: &ledger::payouts::Payout| serde_json::json!({ "payout_id": payout.id.0 });
    let work = async {
        let mut worked = 0;
        while worked < WORKED {
            let jobs = ledger.claim_payouts("w", LEASE, 25).await.unwrap();
            assert!(!jobs.is_empty());
            for job in &jobs {
                let settled = Settlement::Succeeded {
                    transfer_id: format!("t-{}", job.payout.id.0),
                };
                assert!(ledger.settle_payout(job, &settled, &render).await.unwrap());
            }
            worked += u32::try_from(jobs.len()).unwrap();
        }
        ledger.close().await;
    };
    let touched = touched_by(
        &database,
        setup_pid,
        &["outbox_due", "payouts_pending"],
        work,
    )
    .await;
    assert!(
        touched.iter().all(|blocks| *blocks < FEW),
        "{WORKED} payouts claimed and settled touched {} blocks of the open-work index and {} \
         of the pending payouts'",
        touched[0],
        touched[1]
    );
}

/// Hold steps on an account with many holds held — authorizations outstanding by the
/// thousand — on a database analysed when none was held. Each step asks whether a hold of
/// its account is past its expiry and not yet recorded so: done right, a range of an
/// index by account and expiry, empty here. Through an index of the account's held holds
/// alone, each step walked all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_steps_look_only_at_their_own_accounts_holds() {
    let (database, ledger, account_id, mut setup) = fresh().await;
    sqlx::raw_sql("ALTER TABLE holds SET (autovacuum_enabled = false)")
        .execute(&mut setup)
        .await
        .unwrap();
    // `$2` holds of 1 on account `$1`, each placed by a ticket of its own: expired a day
    // ago when `$3`, else held for a day (and counted in the account's `held`).
    let place_many = "
        WITH placed AS (
            INSERT INTO tickets (id, account_id, created_at, expires_at, operation,
                                 fingerprint, response_status, response_body, completed_at)
            SELECT gen_random_uuid(), $1, now(), now() + interval '1 day', 'hold', 'h', 201,
                   '{}', now()
            FROM generate_series(1, $2)
            RETURNING id
        ), held AS (
            INSERT INTO holds (id, account_id, ticket_id, amount, state, expires_at,
                               created_at, resolved_at)
            SELECT gen_random_uuid(), $1, id, 1, CASE WHEN $3 THEN 'expired' ELSE 'held' END,
                   now() + CASE WHEN $3 THEN interval '-1 day' ELSE interval '1 day' END,
                   now() - interval '2 days', CASE WHEN $3 THEN now() - interval '1 day' END
            FROM placed
        )
        UPDATE accounts SET held = held + CASE WHEN $3 THEN 0 ELSE $2 END WHERE id = $1";
    for (count, expired) in [(HISTORY, true), (OPEN, false)] {
        sqlx::query(place_many)
            .bind(account_id)
            .bind(count)
            .bind(expired)
            .execute(&mut setup)
            .await
            .unwrap();
        if expired {
            sqlx::query("ANALYZE holds, tickets")
                .execute(&mut setup)
                .await
                .unwrap();
        }
    }
    let setup_pid = setup_pid(setup).await;

    let work = async {
        for pair in 1..=u64::from(WORKED) {
            let (hold, placing) = place(1, 3600);
            let placed = spend(&ledger, account_id, placing, pair).await;
            assert_eq!(placed.response.status, 201, "{}", placed.response.body);
            let captured = spend(&ledger, account_id, capture(hold, None), pair).await;
            assert_eq!(captured.response.status, 200, "{}", captured.response.body);
        }
        ledger.close().await;
    };
    let touched = touched_by(
        &database,
        setup_pid,
        &["holds_expiring", "holds_held"],
        work,
    )
    .await;
    assert!(
        touched.iter().all(|blocks| *blocks < FEW),
        "{WORKED} holds placed and captured beside {OPEN} held touched {} blocks of the index \
         of holds by expiry and {} of the index of an account's holds",
        touched[0],
        touched[1]
    );
}

/// Ends the setup session; its process id, to wait for its counts.
async fn setup_pid(mut setup: PgConnection) -> i32 {
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut setup)
        .await
        .unwrap();
    setup.close().await.unwrap();
    pid
}
