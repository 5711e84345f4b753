//! What only MySQL / MariaDB can show: exclusion across processes through the lock table,
//! its expiry judged by the server's clock, the statements a hand-off costs; and for row
//! locks, the server's queue across processes, a holder's connection killed, a paused
//! holder's transaction ended by the server, and pruning that takes no other key's row.
//! On the shared server (`MYSQL_URL`, else root@127.0.0.1:3306, database
//! `payonce_locks`), each test under a namespace of its own — or, where it needs one, in
//! a database of its own, dropped after it; nothing here stops it.

use std::sync::Arc;
use std::time::Duration;

use lock::{
    LockOptions, LockService, MySqlRowBackend, MySqlRowOptions, MySqlTableBackend,
    MySqlTableOptions,
};
use sqlx::MySqlPool;
use tokio::time::{Instant, sleep, timeout};

use crate::{patient_options, test_namespace};

const SECOND: Duration = Duration::from_secs(1);

pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/payonce_locks".into())
}

/// The shared server's lock table, under a namespace of the test's own.
pub fn shared_mysql_table() -> LockService {
    lock::open(&mysql_url(), &patient_options(&test_namespace())).unwrap()
}

/// A connection of the test's own, to look and to act from outside.
pub async fn operator() -> MySqlPool {
    MySqlPool::connect(&mysql_url()).await.unwrap()
}

/// The rows of one namespace lost — as a database restored from a backup taken before
/// they were written would lose them.
pub fn table_rows_lost() -> crate::NamespaceLost {
    crate::NamespaceLost::patient_at(&mysql_url(), |namespace| {
        Box::pin(delete_namespace(&["payonce_locks"], namespace))
    })
}

/// Deletes the rows of `namespace` from `tables`, from outside.
async fn delete_namespace(tables: &'static [&'static str], namespace: String) {
    let operator = operator().await;
    for table in tables {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE lock_key LIKE CONCAT(?, ':%')"
        )))
        .bind(&namespace)
        .execute(&operator)
        .await
        .unwrap();
    }
}

/// Two processes on one key through the lock table: no two holders at once, no update
/// lost (the table has no queue across processes: who polls first after a release wins).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn table_exclusion_holds_across_processes() {
    crate::exclusion_across_two_processes(&mysql_url()).await;
}

/// A lease the server's clock says ran out is taken over by the next grant, in one
/// statement: the row is edited to expire now, as a holder that paused past its lease
/// would find it, and a waiter of another process gets it at its next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_row_is_taken_over_by_the_next_grant() {
    let namespace = test_namespace();
    let [holders, others] = crate::two_processes(&mysql_url(), &namespace);
    let mut holder = holders
        .try_acquire("k", 30 * SECOND)
        .await
        .unwrap()
        .unwrap();
    holder.stop_renewal().await;
    let waiter = crate::suite::spawn_acquire(&others, "k", SECOND, 10 * SECOND);
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    sqlx::query("UPDATE payonce_locks SET expires_at = NOW(6) WHERE lock_key = ?")
        .bind(format!("{namespace}:k"))
        .execute(&operator().await)
        .await
        .unwrap();
    let expired_at = Instant::now();
    let successor = waiter.await.unwrap().unwrap();
    assert!(
        expired_at.elapsed() < Duration::from_millis(300),
        "taken over {:?} after the lease ran out",
        expired_at.elapsed()
    );
    crate::successor_took_over(holder, successor).await;
}

/// 32 waiters on one key in one process: one polls at a time, and a release in the
/// process wakes it at once, so a hand-off costs about two statements (the release and
/// the next grant) however long the line, plus the polls of a waiter behind a holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hand_off_in_one_process_costs_about_two_statements() {
    let namespace = test_namespace();
    let counted = Arc::new(
        MySqlTableBackend::open(
            &mysql_url(),
            &patient_options(&namespace),
            MySqlTableOptions::default(),
        )
        .unwrap(),
    );
    let locks = LockService::from_arc(counted.clone());
    let per_hand_off =
        crate::suite::requests_per_hand_off_of_32(&locks, || counted.requests(), || async {}).await;
    assert!(
        per_hand_off <= 3.0,
        "{per_hand_off:.2} statements per hand-off"
    );
}

/// Chubby's lock-delay on the lock table: a holder that vanished keeps its row for its
/// lease and the delay; a released lock is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn table_lock_delay_keeps_a_vanished_holders_row() {
    let delay = Duration::from_millis(700);
    let locks = lock::open(
        &mysql_url(),
        &LockOptions {
            lock_delay: delay,
            ..patient_options(&test_namespace())
        },
    )
    .unwrap();
    crate::suite::lock_delay_keeps_an_abandoned_holders_key(&locks, delay).await;
}

fn row_url() -> String {
    mysql_url().replacen("mysql://", "mysql-row://", 1)
}

/// The shared server's row locks, under a namespace of the test's own.
pub fn shared_mysql_row() -> LockService {
    lock::open(&row_url(), &patient_options(&test_namespace())).unwrap()
}

/// The counters of one namespace lost, as [`table_rows_lost`] loses the table's rows.
pub fn row_counters_lost() -> crate::NamespaceLost {
    crate::NamespaceLost::patient_at(&row_url(), |namespace| {
        Box::pin(delete_namespace(
            &["payonce_lock_fences", "payonce_lock_rows"],
            namespace,
        ))
    })
}

/// Two processes on one key through row locks: no two holders at once, no update lost,
/// and waiters served in the order they started waiting (the server's lock queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn row_exclusion_and_arrival_order_hold_across_processes() {
    let instances = crate::two_processes(&row_url(), &test_namespace());
    crate::suite::read_modify_write_under(&instances, 16, 10).await;
    crate::suite::served_in_arrival_order(&instances, 8).await;
}

/// Killing the holder's connection (as an operator, or a dead network, would) rolls its
/// transaction back: a waiter of another process gets the lock at once, the holder's
/// `lost()` fires at its next heartbeat, and its release touches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_fires_when_the_holders_connection_is_killed() {
    let namespace = test_namespace();
    let [holders, others] = crate::two_processes(&row_url(), &namespace);
    let holder = holders
        .try_acquire("k", Duration::from_millis(600))
        .await
        .unwrap()
        .unwrap();
    let waiter = crate::suite::spawn_acquire(&others, "k", SECOND, 10 * SECOND);
    sleep(Duration::from_millis(300)).await;
    let operator = operator().await;
    // The holder's session: the one blocking the waiter whose statement names our key.
    let key_hex: String = format!("{namespace}:k")
        .bytes()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let holder_id: u64 = sqlx::query_scalar(
        "SELECT blocking.trx_mysql_thread_id
         FROM information_schema.INNODB_LOCK_WAITS waits
         JOIN information_schema.INNODB_TRX blocking ON blocking.trx_id = waits.blocking_trx_id
         JOIN information_schema.INNODB_TRX waiting ON waiting.trx_id = waits.requesting_trx_id
         WHERE waiting.trx_query LIKE CONCAT('%', ?, '%')",
    )
    .bind(key_hex)
    .fetch_one(&operator)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("KILL {holder_id}")))
        .execute(&operator)
        .await
        .unwrap();
    let killed_at = Instant::now();
    let successor = waiter.await.unwrap().unwrap();
    assert!(
        killed_at.elapsed() < Duration::from_millis(500),
        "granted {:?} after the holder's connection was killed",
        killed_at.elapsed()
    );
    crate::holder_told_and_succeeded(holder, successor, 2 * SECOND, "the connection was killed")
        .await;
}

/// Statements of other sessions waiting for the row of `namespace:key`, as the server's
/// process list shows them.
async fn row_waiters_in_server(operator: &MySqlPool, namespace: &str, key: &str) -> i64 {
    let key_hex: String = format!("{namespace}:{key}")
        .bytes()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST
         WHERE ID <> CONNECTION_ID() AND INFO LIKE CONCAT('%', ?, '%FOR UPDATE WAIT%')",
    )
    .bind(key_hex)
    .fetch_one(operator)
    .await
    .unwrap()
}

/// A waiter whose call is dropped mid-wait leaves the server's queue within moments, not
/// when its wait would have timed out: its connection's thread is killed, since a server
/// blocked in a lock wait does not notice a closed socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_row_waiter_leaves_the_servers_queue() {
    let namespace = test_namespace();
    let locks = lock::open(&row_url(), &patient_options(&namespace)).unwrap();
    let operator = operator().await;
    crate::suite::a_dropped_waiter_leaves_the_servers_queue(&locks, || {
        row_waiters_in_server(&operator, &namespace, "k")
    })
    .await;
}

/// A holder that stops heartbeating (paused, its renewal stopped) has its transaction
/// killed by the server once it was idle for the lease (`idle_transaction_timeout`, whole
/// seconds): the lock passes on then, with a larger token, and the holder's late release
/// frees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_holder_loses_the_row_after_its_lease() {
    let namespace = test_namespace();
    let [holders, others] = crate::two_processes(&row_url(), &namespace);
    let mut holder = holders.try_acquire("k", SECOND).await.unwrap().unwrap();
    holder.stop_renewal().await;
    let paused_at = Instant::now();
    let successor = others
        .acquire("k", SECOND, Instant::now() + 10 * SECOND)
        .await
        .unwrap();
    let waited = paused_at.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "taken after {waited:?}"
    );
    assert!(waited < 4 * SECOND, "taken only after {waited:?}");
    crate::successor_took_over(holder, successor).await;
}

/// Chubby's lock-delay on row locks: a holder whose transaction the server ended (it
/// stopped heartbeating: killed when idle for its lease) leaves its row marked unreleased,
/// and its successor holds the lock but waits the delay before using it; a released lock
/// goes on at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn row_lock_delay_holds_a_vanished_holders_row() {
    let delay = Duration::from_millis(700);
    let delayed = LockOptions {
        lock_delay: delay,
        ..patient_options(&test_namespace())
    };
    let locks = lock::open(&row_url(), &delayed).unwrap();
    let holder = locks.clone();
    crate::suite::lock_delay_keeps_a_vanished_holders_key(
        &locks,
        &locks,
        delay,
        |key| async move {
            let mut guard = holder.try_acquire(&key, SECOND).await.unwrap().unwrap();
            // Paused: no heartbeat, so the server ends its transaction once it was idle
            // for the lease rounded up, plus a second.
            guard.stop_renewal().await;
            std::mem::forget(guard);
            2 * SECOND
        },
    )
    .await;
}

/// A grant dropped while it waits out the lock-delay — the row locked, its transaction
/// open — closes its connection: the row is free again at once, not held by a connection
/// gone back to the pool with its transaction open until the server's idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grant_dropped_during_the_lock_delay_frees_the_row() {
    let namespace = test_namespace();
    let delayed = LockOptions {
        lock_delay: 5 * SECOND,
        ..patient_options(&namespace)
    };
    let locks = lock::open(&row_url(), &delayed).unwrap();
    let operator = operator().await;
    let row = format!("{namespace}:k");
    let fence = || {
        sqlx::query_scalar::<_, i64>("SELECT fence FROM payonce_lock_fences WHERE lock_key = ?")
            .bind(&row)
            .fetch_one(&operator)
    };
    // A holder that vanishes without releasing: paused, its transaction ended by the
    // server two seconds later.
    let mut holder = locks.try_acquire("k", SECOND).await.unwrap().unwrap();
    holder.stop_renewal().await;
    std::mem::forget(holder);
    let holders_fence = fence().await.unwrap();

    // Its successor gets the row, bumps the counter, then waits out the delay holding
    // the row; it is dropped then.
    let dropped_at = crate::suite::successor_dropped_during_the_delay(
        &locks,
        fence,
        holders_fence,
        "got the row",
    )
    .await;
    loop {
        let mut probe = operator.begin().await.unwrap();
        let free =
            sqlx::query("SELECT 1 FROM payonce_lock_rows WHERE lock_key = ? FOR UPDATE NOWAIT")
                .bind(&row)
                .fetch_optional(&mut *probe)
                .await
                .is_ok();
        probe.rollback().await.unwrap();
        if free {
            break;
        }
        assert!(
            dropped_at.elapsed() < 3 * SECOND,
            "the dropped grant's row stayed locked"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// Both MySQL backends make their database on first use — a ping included, which is what
/// an instance's start-up and readiness ask first: on a server without the database, the
/// ping answers, and the database is there afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ping_on_a_server_without_the_database_makes_it() {
    let mut url = url::Url::parse(&mysql_url()).unwrap();
    for scheme in ["mysql", "mysql-row"] {
        let database = format!("payonce_ping_{:08x}", rand::random::<u32>());
        url.set_path(&format!("/{database}"));
        let named = url
            .as_str()
            .replacen("mysql://", &format!("{scheme}://"), 1);
        // The lock table and row locks take the same options.
        let locks = lock::open(&named, &patient_options(&test_namespace())).unwrap();
        let pinged = locks.ping().await;
        let operator = operator().await;
        let made: Option<String> = sqlx::query_scalar(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name = ?",
        )
        .bind(&database)
        .fetch_optional(&operator)
        .await
        .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS `{database}`"
        )))
        .execute(&operator)
        .await
        .unwrap();
        pinged.unwrap_or_else(|error| panic!("{scheme}: {error}"));
        assert_eq!(made.as_deref(), Some(database.as_str()), "{scheme}");
    }
}

/// A grant whose fencing bump is held up past its lease (here: waiting for a pool
/// connection) gets no lock: the server ended its transaction meanwhile and a successor
/// took the row with a smaller token, so handing out the larger one would put a stale
/// holder ahead of its successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grant_whose_bump_outlived_its_row_lock_fails() {
    let namespace = test_namespace();
    let stalled = LockService::new(
        MySqlRowBackend::open(
            &row_url(),
            &patient_options(&namespace),
            MySqlRowOptions { max_connections: 2 },
        )
        .unwrap(),
    );
    let others = lock::open(&row_url(), &patient_options(&namespace)).unwrap();
    // K2's row exists, so the stalled grant needs no connection to make it.
    let mut first = others.try_acquire("k2", SECOND).await.unwrap().unwrap();
    let first_token = first.fencing_token();
    assert!(first.release().await.unwrap());

    // One connection holds K1; K2's grant locks its row on the other, and its bump then
    // waits for a connection that only K1's release gives back.
    let mut k1 = stalled.try_acquire("k1", SECOND).await.unwrap().unwrap();
    let stalled_grant = crate::suite::spawn_acquire(&stalled, "k2", SECOND, 20 * SECOND);
    // Past the row's idle limit (the lease rounded up, plus a second): the server ended
    // the stalled grant's transaction, and another process takes the row.
    sleep(Duration::from_millis(2500)).await;
    assert!(!stalled_grant.is_finished());
    let mut successor = others
        .acquire("k2", SECOND, Instant::now() + 5 * SECOND)
        .await
        .unwrap();
    assert!(successor.fencing_token() > first_token);

    assert!(k1.release().await.unwrap());
    match stalled_grant.await.unwrap() {
        Ok(stale) => panic!(
            "the stale grant got token {} after its successor's {}",
            stale.fencing_token(),
            successor.fencing_token()
        ),
        Err(error) => assert!(
            matches!(error, lock::LockError::Unavailable { .. }),
            "{error}"
        ),
    }
    assert!(successor.release().await.unwrap());
}

/// The namespace's rows in each of `tables`, seen from outside.
struct Rows {
    namespace: String,
    tables: &'static [&'static str],
}

impl crate::sql_pruning::Tables for Rows {
    async fn rows(&self, key: Option<&str>) -> Vec<i64> {
        let operator = operator().await;
        let mut counts = Vec::new();
        for table in self.tables {
            let rows = match key {
                Some(key) => sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT COUNT(*) FROM {table} WHERE lock_key = ?"
                )))
                .bind(format!("{}:{key}", self.namespace)),
                None => sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT COUNT(*) FROM {table} WHERE lock_key LIKE CONCAT(?, ':%')"
                )))
                .bind(self.namespace.clone()),
            };
            counts.push(rows.fetch_one(&operator).await.unwrap());
        }
        counts
    }
}

const LOCK_TABLE: &[&str] = &["payonce_locks"];
const ROW_TABLES: &[&str] = &["payonce_lock_rows", "payonce_lock_fences"];

/// `N` processes' services on `url` under a namespace of the test's own, and that
/// namespace's rows in `tables`.
fn pruned_at<const N: usize>(
    url: &str,
    tables: &'static [&'static str],
) -> ([LockService; N], Rows) {
    let namespace = test_namespace();
    let processes = std::array::from_fn(|_| lock::open(url, &patient_options(&namespace)).unwrap());
    (processes, Rows { namespace, tables })
}

/// Pruning forgets an idle key's row in the lock table, and its next token is still
/// larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn table_a_pruned_keys_tokens_still_grow() {
    let ([locks], tables) = pruned_at(&mysql_url(), LOCK_TABLE);
    crate::sql_pruning::a_pruned_keys_tokens_still_grow(locks, tables).await;
}

/// Pruning keeps the lock table's row of a key held, and polled for, longer than the
/// idle period.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn table_pruning_keeps_what_holders_and_waiters_need() {
    let ([locks, others], tables) = pruned_at(&mysql_url(), LOCK_TABLE);
    crate::sql_pruning::pruning_keeps_what_holders_and_waiters_need(locks, others, tables).await;
}

/// Ten thousand keys locked once each leave no row of the lock table behind after a
/// pruning pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn table_state_stays_bounded_by_the_keys_in_use() {
    let ([locks], tables) = pruned_at(&mysql_url(), LOCK_TABLE);
    crate::sql_pruning::state_stays_bounded_by_the_keys_in_use(locks, tables).await;
}

/// Pruning forgets an idle key's locked row and counter, and its next token is still
/// larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn row_a_pruned_keys_tokens_still_grow() {
    let ([locks], tables) = pruned_at(&row_url(), ROW_TABLES);
    crate::sql_pruning::a_pruned_keys_tokens_still_grow(locks, tables).await;
}

/// Pruning keeps the row and counter of a key held longer than the idle period, with a
/// waiter of another process in the row's queue: neither sees the row vanish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn row_pruning_keeps_what_holders_and_waiters_need() {
    let ([locks, others], tables) = pruned_at(&row_url(), ROW_TABLES);
    crate::sql_pruning::pruning_keeps_what_holders_and_waiters_need(locks, others, tables).await;
}

/// Ten thousand keys locked once each leave no locked row nor counter behind after a
/// pruning pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn row_state_stays_bounded_by_the_keys_in_use() {
    let ([locks], tables) = pruned_at(&row_url(), ROW_TABLES);
    crate::sql_pruning::state_stays_bounded_by_the_keys_in_use(locks, tables).await;
}

/// A pruning pass locks no row of a key it does not prune: another namespace's key, held
/// while the pass runs, is free the moment its holder releases it, and the pass ends
/// without waiting for the keys still held. In a database of the test's own, where the
/// pruned keys are most of the table: the optimizer then scans the table for a list of
/// keys, and a scan would queue on each held row it met, be granted it at its holder's
/// release and keep it until the batch commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn row_pruning_locks_no_other_keys_row() {
    let idle = Duration::from_millis(300);
    let mut url = url::Url::parse(&row_url()).unwrap();
    let database = format!("payonce_prune_{:08x}", rand::random::<u32>());
    url.set_path(&format!("/{database}"));
    let pruned = lock::open(url.as_str(), &patient_options(&test_namespace())).unwrap();
    let others = lock::open(url.as_str(), &patient_options(&test_namespace())).unwrap();
    for key in 0..50 {
        let mut guard = pruned
            .try_acquire(&format!("k{key}"), SECOND)
            .await
            .unwrap()
            .unwrap();
        assert!(guard.release().await.unwrap());
    }
    let mut first = others.try_acquire("a", 10 * SECOND).await.unwrap().unwrap();
    let mut second = others.try_acquire("b", 10 * SECOND).await.unwrap().unwrap();
    sleep(idle + Duration::from_millis(100)).await;

    let pass = {
        let pruned = pruned.clone();
        tokio::spawn(async move { pruned.prune_idle(idle).await })
    };
    sleep(Duration::from_millis(300)).await;
    assert!(first.release().await.unwrap());
    let retaken = others.try_acquire("a", SECOND).await.unwrap();
    let free_at_once = retaken.is_some();
    if let Some(mut retaken) = retaken {
        assert!(retaken.release().await.unwrap());
    }
    let ended = timeout(5 * SECOND, pass).await;
    assert!(second.release().await.unwrap());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS `{database}`"
    )))
    .execute(&operator().await)
    .await
    .unwrap();

    assert!(
        free_at_once,
        "a key released during the pass was found held: the pass took its row"
    );
    let forgotten = ended
        .expect("the pass waited for a row it does not prune")
        .unwrap()
        .unwrap();
    assert_eq!(forgotten, 50);
}
