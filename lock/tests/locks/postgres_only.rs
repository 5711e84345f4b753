//! What only a PostgreSQL server can show: a holder's connection ended from outside, the
//! server's own queue (one waiter per key per process in it), the statements a hand-off
//! costs, exclusion and order across processes, and the lock-delay after a holder's
//! connection ended. On the shared server (`DATABASE_URL`), each test under a namespace of
//! its own; nothing here stops it.

use std::sync::Arc;
use std::time::Duration;

use lock::{LockOptions, LockService, PostgresBackend, PostgresOptions};
use sqlx::PgPool;
use tokio::time::{Instant, sleep};

use crate::{patient_options, test_namespace};

const SECOND: Duration = Duration::from_secs(1);

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn backend(namespace: &str, options: LockOptions) -> Arc<PostgresBackend> {
    Arc::new(
        PostgresBackend::open(
            &database_url(),
            &LockOptions {
                namespace: namespace.to_owned(),
                ..options
            },
            PostgresOptions::default(),
        )
        .unwrap(),
    )
}

/// A patient service under `namespace`, as a process of its own would open it.
fn patient(namespace: &str) -> LockService {
    LockService::from_arc(backend(namespace, patient_options(namespace)))
}

/// The shared PostgreSQL, under a namespace of the test's own.
pub fn shared_postgres() -> LockService {
    lock::open(&database_url(), &patient_options(&test_namespace())).unwrap()
}

/// A connection of the test's own, to look and to act from outside.
async fn operator() -> PgPool {
    PgPool::connect(&database_url()).await.unwrap()
}

/// Ends the session holding `key` under `namespace`, as an operator (or a dead network)
/// would.
async fn terminate_holder(operator: &PgPool, namespace: &str, key: &str) {
    let terminated: bool = sqlx::query_scalar(
        "SELECT pg_terminate_backend(holder_pid) FROM payonce_lock_fences WHERE lock_key = $1",
    )
    .bind(format!("{namespace}:{key}"))
    .fetch_one(operator)
    .await
    .unwrap();
    assert!(terminated);
}

/// The counters of one namespace lost — as a database restored from a backup taken
/// before they were written would lose them.
pub fn counters_lost() -> crate::NamespaceLost {
    crate::NamespaceLost::patient_at(&database_url(), |namespace| {
        Box::pin(async move {
            sqlx::query("DELETE FROM payonce_lock_fences WHERE lock_key LIKE $1 || ':%'")
                .bind(&namespace)
                .execute(&operator().await)
                .await
                .unwrap();
        })
    })
}

/// Ending the holder's connection from outside releases its lock at once: the waiter of
/// another process gets it, the holder's `lost()` fires at its next heartbeat, and its
/// release touches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_fires_when_the_connection_is_terminated() {
    let namespace = test_namespace();
    let holders = patient(&namespace);
    let others = patient(&namespace);
    let holder = holders
        .try_acquire("k", 600 * Duration::from_millis(1))
        .await
        .unwrap()
        .unwrap();
    let waiter = crate::suite::spawn_acquire(&others, "k", SECOND, 10 * SECOND);
    sleep(Duration::from_millis(200)).await;
    let operator = operator().await;
    terminate_holder(&operator, &namespace, "k").await;
    let ended_at = Instant::now();
    let successor = waiter.await.unwrap().unwrap();
    assert!(
        ended_at.elapsed() < Duration::from_millis(500),
        "granted {:?} after the holder's connection ended",
        ended_at.elapsed()
    );
    crate::holder_told_and_succeeded(holder, successor, 2 * SECOND, "the connection ended").await;
}

/// 32 waiters on one key from one process: the server's queue holds one of them at a time
/// (the others wait their turn in the process), and each hand-off costs two statements —
/// the release and the next waiter's wait — however long the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_waiter_per_process_in_the_servers_queue() {
    let namespace = test_namespace();
    let counted = backend(&namespace, patient_options(&namespace));
    let locks = LockService::from_arc(counted.clone());
    let queued = || async {
        let operator = operator().await;
        assert_eq!(waiting_in_server(&operator, &namespace, "hot").await, 1);
    };
    let per_hand_off =
        crate::suite::requests_per_hand_off_of_32(&locks, || counted.requests(), queued).await;
    assert!(
        per_hand_off <= 2.5,
        "{per_hand_off:.2} statements per hand-off"
    );
}

/// Waiters in the server's queue on `namespace:key`, as `pg_locks` shows them.
async fn waiting_in_server(operator: &PgPool, namespace: &str, key: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks
         WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
           AND classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
           AND objid = (hashtextextended($1, 0) & 4294967295)::oid",
    )
    .bind(format!("{namespace}:{key}"))
    .fetch_one(operator)
    .await
    .unwrap()
}

/// A waiter whose call is dropped mid-wait leaves the server's queue within moments, not
/// at its deadline: the server notices the closed connection though it is blocked in
/// the lock wait, so the wait never takes the lock when its turn comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_waiter_leaves_the_servers_queue() {
    let namespace = test_namespace();
    let locks = patient(&namespace);
    let operator = operator().await;
    crate::suite::a_dropped_waiter_leaves_the_servers_queue(&locks, || {
        waiting_in_server(&operator, &namespace, "k")
    })
    .await;
}

/// Two processes on one key: no two holders at once, no update lost, and waiters served
/// in the order they started waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exclusion_and_arrival_order_hold_across_processes() {
    let namespace = test_namespace();
    let instances = [patient(&namespace), patient(&namespace)];
    crate::suite::read_modify_write_under(&instances, 16, 10).await;
    crate::suite::served_in_arrival_order(&instances, 8).await;
}

/// Chubby's lock-delay on PostgreSQL: a holder whose connection ended without a release
/// (terminated from outside) leaves its row marked unreleased, and its successor holds
/// the lock but waits the delay before using it; a released lock goes on at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_delay_holds_a_vanished_holders_key() {
    let namespace = test_namespace();
    let delay = Duration::from_millis(700);
    let delayed = LockOptions {
        lock_delay: delay,
        ..patient_options(&namespace)
    };
    let holders = LockService::from_arc(backend(&namespace, delayed.clone()));
    let others = LockService::from_arc(backend(&namespace, delayed));
    crate::suite::lock_delay_after_an_ended_session(&holders, &others, delay, |key| async move {
        terminate_holder(&operator().await, &namespace, &key).await;
    })
    .await;
}

/// A grant dropped while it waits out the lock-delay — the advisory lock taken on its
/// connection — closes that connection: the lock is free again at once, not held by a
/// connection gone back to the pool, where its next user would hold it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grant_dropped_during_the_lock_delay_frees_the_lock() {
    let namespace = test_namespace();
    let delayed = LockOptions {
        lock_delay: 5 * SECOND,
        ..patient_options(&namespace)
    };
    let locks = LockService::from_arc(backend(&namespace, delayed));
    let operator = operator().await;
    // A holder that vanishes: its connection ended from outside.
    let holder = locks.try_acquire("k", SECOND).await.unwrap().unwrap();
    terminate_holder(&operator, &namespace, "k").await;
    std::mem::forget(holder);
    let fence = || {
        sqlx::query_scalar::<_, i64>("SELECT fence FROM payonce_lock_fences WHERE lock_key = $1")
            .bind(format!("{namespace}:k"))
            .fetch_one(&operator)
    };
    let holders_fence = fence().await.unwrap();

    // Its successor takes the lock, then waits out the delay holding it; dropped then.
    let dropped_at = crate::suite::successor_dropped_during_the_delay(
        &locks,
        fence,
        holders_fence,
        "took the lock",
    )
    .await;
    // Free for another process at once (no lock-delay there: it released nothing).
    let other = patient(&namespace);
    loop {
        if let Some(mut guard) = other.try_acquire("k", SECOND).await.unwrap() {
            assert!(guard.release().await.unwrap());
            break;
        }
        assert!(
            dropped_at.elapsed() < 3 * SECOND,
            "the dropped grant's lock stayed taken"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// The namespace's rows in the counters' table, seen from outside.
struct Counters {
    namespace: String,
}

impl crate::sql_pruning::Tables for Counters {
    async fn rows(&self, key: Option<&str>) -> Vec<i64> {
        let operator = operator().await;
        let rows = match key {
            Some(key) => {
                sqlx::query_scalar("SELECT count(*) FROM payonce_lock_fences WHERE lock_key = $1")
                    .bind(format!("{}:{key}", self.namespace))
                    .fetch_one(&operator)
                    .await
            }
            None => {
                sqlx::query_scalar(
                    "SELECT count(*) FROM payonce_lock_fences WHERE starts_with(lock_key, $1)",
                )
                .bind(format!("{}:", self.namespace))
                .fetch_one(&operator)
                .await
            }
        };
        vec![rows.unwrap()]
    }
}

/// Pruning forgets an idle key's counter, and its next token is still larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pruned_keys_tokens_still_grow() {
    let namespace = test_namespace();
    let locks = patient(&namespace);
    crate::sql_pruning::a_pruned_keys_tokens_still_grow(locks, Counters { namespace }).await;
}

/// Pruning keeps the counter of a key held, and waited for, longer than the idle period.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pruning_keeps_what_holders_and_waiters_need() {
    let namespace = test_namespace();
    let locks = patient(&namespace);
    let others = patient(&namespace);
    crate::sql_pruning::pruning_keeps_what_holders_and_waiters_need(
        locks,
        others,
        Counters { namespace },
    )
    .await;
}

/// Ten thousand keys locked once each leave no counter behind after a pruning pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn state_stays_bounded_by_the_keys_in_use() {
    let namespace = test_namespace();
    let locks = patient(&namespace);
    crate::sql_pruning::state_stays_bounded_by_the_keys_in_use(locks, Counters { namespace }).await;
}
