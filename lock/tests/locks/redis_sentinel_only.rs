//! Redis Sentinel: the lock on the master the sentinels name (one master, two replicas,
//! three sentinels of the test's own). The shared suite's cases of waiting, hand-off and
//! fencing hold through it; when the master is killed with SIGKILL, the sentinels promote
//! a replica, the lock asks them again after its first failed round trip and goes on on
//! the new master — without what the old one had not replicated, which fencing and
//! `raise_fencing` carry.

use std::time::Duration;

use lock::testing::RedisSentinels;
use lock::{FencingToken, LockOptions, LockService};
use tokio::time::Instant;

use crate::suite;

const SECOND: Duration = Duration::from_secs(1);

fn locks_on(sentinels: &RedisSentinels) -> LockService {
    lock::open(
        &sentinels.url(),
        &LockOptions {
            namespace: format!("test-{:016x}", rand::random::<u64>()),
            op_timeout: Some(SECOND),
            ..LockOptions::default()
        },
    )
    .expect("a valid Redis Sentinel URL")
}

/// The shared suite's cases of contention, order, hand-off and fencing, on one setup.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lock_contract_holds_through_sentinel() {
    let sentinels = RedisSentinels::start().expect("Redis Sentinel starts");
    suite::mutual_exclusion_under_contention(locks_on(&sentinels)).await;
    suite::waiters_acquire_in_arrival_order(locks_on(&sentinels)).await;
    suite::fencing_tokens_increase_over_1000_handoffs(locks_on(&sentinels)).await;
    suite::try_acquire_never_waits_and_never_barges(locks_on(&sentinels)).await;
    suite::abandoned_wait_does_not_block_the_queue(locks_on(&sentinels)).await;
    suite::raise_fencing_never_lowers(locks_on(&sentinels)).await;
    suite::holder_note_follows_the_holder(locks_on(&sentinels)).await;
    suite::watchdog_keeps_the_lock_past_three_ttls(locks_on(&sentinels)).await;
}

/// The master killed under a held lock: until the sentinels promote a replica, locks
/// answer "unavailable" (a 503 upstream), never a grant; then they work on the new
/// master, with tokens above every replicated one, and `raise_fencing` lifts the counter
/// past the grant the failover may have lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_master_is_replaced_and_tokens_never_go_back() {
    let mut sentinels = RedisSentinels::start().expect("Redis Sentinel starts");
    let locks = locks_on(&sentinels);
    let key = "account";
    let old_master = sentinels.master().unwrap();
    let mut replicated = FencingToken::new(0);
    for _ in 0..5 {
        let mut guard = locks.try_acquire(key, SECOND).await.unwrap().unwrap();
        replicated = replicated.max(guard.fencing_token());
        guard.release().await.unwrap();
    }
    sentinels.wait_replicated(5 * SECOND).unwrap();
    let held = locks.try_acquire(key, 2 * SECOND).await.unwrap().unwrap();
    let unreplicated = held.fencing_token();

    let killed_at = Instant::now();
    let promoted = tokio::task::spawn_blocking(move || {
        let elapsed = sentinels.fail_over(Duration::from_secs(30));
        (sentinels, elapsed)
    });
    let first_after = crate::first_grant_within(&locks, key, 40 * SECOND).await;
    let (mut sentinels, promoted_after) = promoted.await.unwrap();
    let promoted_after = promoted_after.unwrap();
    let first_after = first_after.expect("the lock worked again within 40 s");
    println!(
        "sentinel failover: replica promoted {promoted_after:?} after the kill; the lock \
         answered again after {:?}",
        killed_at.elapsed()
    );
    assert_ne!(sentinels.master().unwrap(), old_master);
    crate::after_the_failover(first_after, replicated, held).await;
    locks.raise_fencing(key, unreplicated).await.unwrap();
    let mut next = locks.try_acquire(key, SECOND).await.unwrap().unwrap();
    assert!(next.fencing_token() > unreplicated);
    next.release().await.unwrap();

    // The old master comes back empty and the sentinels make it a replica: the lock stays
    // on the new master.
    let _sentinels = tokio::task::spawn_blocking(move || {
        sentinels.restart_killed(Duration::from_secs(60))?;
        Ok::<_, std::io::Error>(sentinels)
    })
    .await
    .unwrap()
    .unwrap();
    let mut again = locks.try_acquire(key, SECOND).await.unwrap().unwrap();
    assert!(again.fencing_token() > next.fencing_token());
    again.release().await.unwrap();
}
