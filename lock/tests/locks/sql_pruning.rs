//! What pruning idle keys must do on the SQL stores (PostgreSQL advisory locks, the MySQL
//! lock table, MySQL row locks), whose per-key rows nothing else ever deletes: forget the
//! keys nobody used for the idle period, keep those a holder or a waiter needs, and leave
//! tokens growing. `postgres_only.rs` and `mysql_only.rs` run these on each store.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use lock::LockService;
use tokio::time::{Instant, sleep};

const SECOND: Duration = Duration::from_secs(1);

/// The idle period the tests prune with, and what they wait for a key to be idle.
const IDLE: Duration = Duration::from_millis(300);

/// A store's per-key tables, seen from outside.
#[allow(async_fn_in_trait)]
pub trait Tables {
    /// For each of the backend's per-key tables, its rows for `key` under the test's
    /// namespace, or for the whole namespace when `key` is `None`.
    async fn rows(&self, key: Option<&str>) -> Vec<i64>;
}

/// A key locked a few times, released and then pruned has no row left; its next grant
/// carries a token above every earlier one, and the last earlier lease can neither extend
/// nor release the new holder's lock.
pub async fn a_pruned_keys_tokens_still_grow(locks: LockService, tables: impl Tables) {
    let mut earlier = Vec::new();
    let mut last_lease = None;
    for _ in 0..3 {
        let mut guard = locks.try_acquire("k", SECOND).await.unwrap().unwrap();
        earlier.push(guard.fencing_token());
        last_lease = Some(guard.lease().clone());
        assert!(guard.release().await.unwrap());
    }
    let stale = last_lease.unwrap();
    assert!(tables.rows(Some("k")).await.iter().all(|rows| *rows == 1));

    sleep(IDLE + Duration::from_millis(100)).await;
    let forgotten = locks.prune_idle(IDLE).await.unwrap();
    assert_eq!(forgotten, 1, "keys forgotten");
    assert!(
        tables.rows(Some("k")).await.iter().all(|rows| *rows == 0),
        "the pruned key's rows: {:?}",
        tables.rows(Some("k")).await
    );

    let mut next = locks.try_acquire("k", SECOND).await.unwrap().unwrap();
    let highest = earlier.iter().max().copied().unwrap();
    assert!(
        next.fencing_token() > highest,
        "after pruning {} <= {highest} (earlier {earlier:?})",
        next.fencing_token()
    );
    let backend = locks.backend();
    assert!(!backend.extend(&stale, SECOND).await.unwrap());
    assert!(!backend.release(&stale).await.unwrap());
    assert!(backend.extend(next.lease(), SECOND).await.unwrap());
    assert!(next.release().await.unwrap());
}

/// A pruning pass with the shortest idle period forgets a released key but keeps the rows
/// of a key that is held, with a waiter of another process queued behind the holder: the
/// holder still holds and releases, and the waiter is then served with a larger token.
pub async fn pruning_keeps_what_holders_and_waiters_need(
    locks: LockService,
    others: LockService,
    tables: impl Tables,
) {
    let mut idle = locks.try_acquire("idle", SECOND).await.unwrap().unwrap();
    assert!(idle.release().await.unwrap());
    let mut holder = locks.try_acquire("held", SECOND).await.unwrap().unwrap();
    let waiter = tokio::spawn(async move {
        others
            .acquire("held", SECOND, Instant::now() + 20 * SECOND)
            .await
    });
    sleep(IDLE + Duration::from_millis(100)).await;
    assert!(!waiter.is_finished());

    let forgotten = locks.prune_idle(IDLE).await.unwrap();
    assert_eq!(forgotten, 1, "keys forgotten");
    assert!(
        tables
            .rows(Some("idle"))
            .await
            .iter()
            .all(|rows| *rows == 0)
    );
    let held_rows = tables.rows(Some("held")).await;
    assert!(
        held_rows.iter().all(|rows| *rows == 1),
        "the held key's rows: {held_rows:?}"
    );

    assert!(
        locks
            .backend()
            .extend(holder.lease(), SECOND)
            .await
            .unwrap()
    );
    sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the waiter got past the holder");
    assert!(!holder.is_lost());
    assert!(holder.release().await.unwrap());
    let mut successor = waiter.await.unwrap().unwrap();
    assert!(successor.fencing_token() > holder.fencing_token());
    assert!(successor.release().await.unwrap());
}

/// How many fresh keys [`state_stays_bounded_by_the_keys_in_use`] locks.
pub const FRESH_KEYS: usize = 10_000;

/// How many keys it locks within the idle period before its pruning pass.
pub const RECENT_KEYS: usize = 10;

/// The idle period of [`state_stays_bounded_by_the_keys_in_use`]: long enough for the
/// recent keys and the pass on a quiet machine; a longer pass is allowed for. MySQL's row
/// locks make the slowest pass — they lock and delete row by row (`per_key` in
/// `lock/src/mysql/row.rs`) — seen taking up to 7 s for the fresh keys on a loaded
/// two-core machine, 13 s on a busier one.
const BOUNDED_IDLE: Duration = Duration::from_secs(8);

/// [`FRESH_KEYS`] fresh keys (as orders make them: each locked once), each locked and
/// released, then — once they are idle — [`RECENT_KEYS`] more and one pruning pass: every
/// per-key table keeps at most one row per key used within the idle period, here exactly
/// [`RECENT_KEYS`], not one per key ever locked.
pub async fn state_stays_bounded_by_the_keys_in_use(locks: LockService, tables: impl Tables) {
    let started = Instant::now();
    let granted: usize = futures::stream::iter(0..FRESH_KEYS)
        .map(|order| {
            let locks = locks.clone();
            async move {
                let key = format!("order:{order}");
                let mut guard = locks
                    .acquire(&key, 5 * SECOND, Instant::now() + 30 * SECOND)
                    .await
                    .unwrap();
                assert!(guard.release().await.unwrap());
            }
        })
        .buffer_unordered(32)
        .count()
        .await;
    assert_eq!(granted, FRESH_KEYS);
    let locked_in = started.elapsed();
    let before: Vec<i64> = tables.rows(None).await;
    assert!(
        before.iter().all(|rows| *rows == FRESH_KEYS as i64),
        "rows before pruning: {before:?}"
    );

    sleep(BOUNDED_IDLE + Duration::from_millis(500)).await;
    let recent_from = Instant::now();
    let mut recent = BTreeSet::new();
    for order in 0..RECENT_KEYS {
        let key = format!("recent:{order}");
        let mut guard = locks.try_acquire(&key, SECOND).await.unwrap().unwrap();
        assert!(guard.release().await.unwrap());
        recent.insert(key);
    }
    let pass = Instant::now();
    let forgotten = locks.prune_idle(BOUNDED_IDLE).await.unwrap();
    let pruned_in = pass.elapsed();
    let after = tables.rows(None).await;
    eprintln!(
        "{FRESH_KEYS} keys locked and released in {locked_in:?}; one pass forgot \
         {forgotten} in {pruned_in:?}; rows per table after it: {after:?}"
    );
    assert!(
        after.iter().all(|rows| *rows <= RECENT_KEYS as i64),
        "rows per table after pruning: {after:?}"
    );
    // Each batch judges idleness by the database's clock when it runs: a pass that
    // outlasts the idle period (a loaded machine) may rightly forget a recent key too,
    // which has by then been idle that long. Only a pass that ended within the idle
    // period of the recent keys' use must have kept every one of them.
    if recent_from.elapsed() < BOUNDED_IDLE {
        assert_eq!(forgotten, FRESH_KEYS as u64);
        for key in &recent {
            assert!(tables.rows(Some(key)).await.iter().all(|rows| *rows == 1));
        }
    } else {
        eprintln!("the pass outlasted the idle period: the recent keys were idle long enough");
        assert!(
            (FRESH_KEYS as u64..=(FRESH_KEYS + RECENT_KEYS) as u64).contains(&forgotten),
            "forgot {forgotten}"
        );
    }
}
