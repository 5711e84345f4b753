//! The behaviour every lock backend must show. Each function is one test case; `main.rs`
//! runs them against each backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use lock::{FencingToken, Lease, LockError, LockService, OwnerToken, Sessions};
use tokio::sync::Mutex;
use tokio::time::{Instant, sleep, timeout};

use crate::Store;

fn after(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

fn key() -> String {
    format!("key-{:016x}", rand::random::<u64>())
}

const SECOND: Duration = Duration::from_secs(1);

/// A waiter on a task of its own: `locks.acquire(key, ttl, …)` with a deadline `within`
/// from now.
pub fn spawn_acquire(
    locks: &LockService,
    key: &str,
    ttl: Duration,
    within: Duration,
) -> tokio::task::JoinHandle<Result<lock::LockGuard, LockError>> {
    let (locks, key, deadline) = (locks.clone(), key.to_owned(), Instant::now() + within);
    tokio::spawn(async move { locks.acquire(&key, ttl, deadline).await })
}

/// 32 waiters on `hot` in one process, behind a holder: a second after they started,
/// `queued()` looks at them; then the holder releases, and each is served and releases.
/// Returns the requests `requests()` counts from that release on, per hand-off.
pub async fn requests_per_hand_off_of_32<F>(
    locks: &LockService,
    requests: impl Fn() -> u64,
    queued: impl FnOnce() -> F,
) -> f64
where
    F: std::future::Future<Output = ()>,
{
    let mut holder = locks
        .try_acquire("hot", 10 * SECOND)
        .await
        .unwrap()
        .unwrap();
    let waiters: Vec<_> = (0..32)
        .map(|_| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let mut guard = locks
                    .acquire("hot", 10 * SECOND, Instant::now() + 30 * SECOND)
                    .await
                    .unwrap();
                assert!(guard.release().await.unwrap());
            })
        })
        .collect();
    sleep(SECOND).await;
    queued().await;
    let before = requests();
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    (requests() - before) as f64 / 32.0
}

/// Looks every `every` until `look()` finds nothing kept (`None`); past `gone_by`, fails
/// with what it found (`Some`).
pub async fn until_gone<F>(gone_by: Instant, every: Duration, mut look: impl FnMut() -> F)
where
    F: std::future::Future<Output = Option<String>>,
{
    while let Some(kept) = look().await {
        assert!(Instant::now() < gone_by, "{kept}");
        sleep(every).await;
    }
}

/// A waiter of `other` on `k`, behind a holder: still waiting after `looked_after`.
pub async fn waiter_behind_the_holder(
    other: &LockService,
    looked_after: Duration,
) -> tokio::task::JoinHandle<Result<lock::LockGuard, LockError>> {
    let waiter = spawn_acquire(other, "k", SECOND, 30 * SECOND);
    sleep(looked_after).await;
    assert!(
        !waiter.is_finished(),
        "the waiter did not wait for the holder"
    );
    waiter
}

/// The successor of a vanished holder whose fence `fence()` read `holders_fence`: spawned
/// on `locks`, it takes `key` (the fence moves on; else "the successor never {took}"),
/// then waits out the lock-delay holding it — and is dropped there. Returns when.
pub async fn successor_dropped_during_the_delay<F, E>(
    locks: &LockService,
    fence: impl Fn() -> F,
    holders_fence: i64,
    took: &str,
) -> Instant
where
    F: std::future::Future<Output = Result<i64, E>>,
    E: std::fmt::Debug,
{
    let successor = spawn_acquire(locks, "k", 10 * SECOND, 30 * SECOND);
    let started = Instant::now();
    while fence().await.unwrap() == holders_fence {
        assert!(
            started.elapsed() < 10 * SECOND,
            "the successor never {took}"
        );
        sleep(Duration::from_millis(20)).await;
    }
    sleep(Duration::from_millis(200)).await;
    assert!(
        !successor.is_finished(),
        "the successor did not wait the delay"
    );
    successor.abort();
    Instant::now()
}

/// 32 tasks doing a read-modify-write that is not atomic on its own lose no update and
/// never overlap.
pub async fn mutual_exclusion_under_contention(locks: LockService) {
    read_modify_write_under(&[locks], 32, 20).await;
}

/// One read-modify-write of `counter` that is not atomic on its own, by a holder of the
/// lock: asserts that nobody else is `inside` meanwhile.
pub async fn read_modify_write_alone(inside: &AtomicUsize, counter: &AtomicU64) {
    assert_eq!(
        inside.fetch_add(1, Ordering::SeqCst),
        0,
        "two holders at once"
    );
    let seen = counter.load(Ordering::SeqCst);
    tokio::task::yield_now().await;
    counter.store(seen + 1, Ordering::SeqCst);
    inside.fetch_sub(1, Ordering::SeqCst);
}

/// `tasks` tasks, spread over `instances`, each doing `rounds` read-modify-writes of one
/// counter under one lock: asserts no two hold it at once and no update is lost.
pub async fn read_modify_write_under(instances: &[LockService], tasks: usize, rounds: u64) {
    let key = key();
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..tasks)
        .map(|task| {
            let locks = instances[task % instances.len()].clone();
            let (key, counter, inside) = (key.clone(), counter.clone(), inside.clone());
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let mut guard = locks
                        .acquire(&key, 5 * SECOND, after(30_000))
                        .await
                        .unwrap();
                    read_modify_write_alone(&inside, &counter).await;
                    assert!(guard.release().await.unwrap());
                }
            })
        })
        .collect();
    let spawned = tasks.len() as u64;
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), spawned * rounds);
}

/// A release with someone else's owner token returns false and the holder keeps the lock.
pub async fn release_by_non_owner_keeps_the_holder(locks: LockService) {
    let key = key();
    let mut holder = locks.try_acquire(&key, 5 * SECOND).await.unwrap().unwrap();
    let impostor = Lease::new(
        &key,
        OwnerToken::random(),
        holder.fencing_token(),
        5 * SECOND,
        Instant::now(),
    );
    assert!(!locks.backend().release(&impostor).await.unwrap());
    assert!(locks.try_acquire(&key, 5 * SECOND).await.unwrap().is_none());
    assert!(holder.release().await.unwrap());
}

/// Whether leases here are a session — the process's (ZooKeeper, etcd) or the grant's
/// connection (PostgreSQL): then a grant does not expire by its TTL while the process
/// lives, and the cases about a TTL running out in a live process cannot happen — they
/// are shown per backend instead, with the session ended from outside
/// (`zookeeper_only.rs`, `etcd_only.rs`, `postgres_only.rs`).
fn leases_are_sessions(locks: &LockService) -> bool {
    !matches!(locks.backend().sessions(), Sessions::PerGrant)
}

/// Whether tokens come from a counter the store keeps per key (counting by one from the
/// clock), rather than from the store's own change numbers (ZooKeeper's zxids, etcd's
/// revisions).
fn tokens_are_counted(locks: &LockService) -> bool {
    !matches!(locks.backend().sessions(), Sessions::PerProcess { .. })
}

/// A holder whose lease expired cannot release its successor's lock.
pub async fn release_after_expiry_keeps_the_new_holder(locks: LockService) {
    if leases_are_sessions(&locks) {
        // A grant outlives its TTL while its session lives: see `leases_are_sessions`.
        return;
    }
    let key = key();
    let first = locks
        .try_acquire(&key, Duration::from_millis(100))
        .await
        .unwrap()
        .unwrap();
    let stale = first.lease().clone();
    first.abandon().await;
    let coarse = locks.backend().expiry_granularity();
    let mut second = locks
        .acquire(&key, 5 * SECOND, after(2_000) + 2 * coarse)
        .await
        .unwrap();
    assert!(!locks.backend().release(&stale).await.unwrap());
    assert!(locks.try_acquire(&key, 5 * SECOND).await.unwrap().is_none());
    assert!(second.release().await.unwrap());
}

/// Releasing twice is harmless: the second call reports the lock was not held.
pub async fn release_twice_is_safe(locks: LockService) {
    let key = key();
    let mut guard = locks.try_acquire(&key, 5 * SECOND).await.unwrap().unwrap();
    let lease = guard.lease().clone();
    assert!(guard.release().await.unwrap());
    assert!(!guard.release().await.unwrap());
    assert!(!locks.backend().release(&lease).await.unwrap());
    let mut next = locks.try_acquire(&key, 5 * SECOND).await.unwrap().unwrap();
    assert!(
        !locks.backend().release(&lease).await.unwrap(),
        "old lease released the new holder"
    );
    assert!(next.release().await.unwrap());
}

/// A holder that vanishes — its process gone, the guard never released, its watchdog
/// dead with it — is succeeded once its TTL runs out.
pub async fn vanished_holder_is_succeeded_after_its_ttl(locks: LockService) {
    if leases_are_sessions(&locks) {
        // The vanishing "process" here shares this test's session, which lives on: see
        // `leases_are_sessions`.
        return;
    }
    let key = key();
    let ttl = Duration::from_millis(300);
    // Connect from this runtime: the connection must outlive the one that dies.
    locks.ping().await.unwrap();
    let granted_by = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::task::spawn_blocking(move || {
            // A runtime of its own stands for the process that crashes: dropping it kills
            // every task it ran, the guard's watchdog among them.
            let process = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let granted_by = process.block_on(async {
                let guard = locks.try_acquire(&key, ttl).await.unwrap().unwrap();
                let granted_by = guard.lease().acquired_at() + ttl;
                std::mem::forget(guard);
                granted_by
            });
            drop(process);
            granted_by
        })
        .await
        .unwrap()
    };
    // A store that counts whole seconds frees it up to two of them later.
    let coarse = locks.backend().expiry_granularity();
    let mut successor = locks
        .acquire(&key, 5 * SECOND, after(3_000) + 2 * coarse)
        .await
        .unwrap();
    let now = Instant::now();
    assert!(
        now >= granted_by - Duration::from_millis(20),
        "taken before the TTL ran out"
    );
    assert!(
        now <= granted_by + Duration::from_millis(250) + 2 * coarse,
        "took {:?} past the TTL",
        now - granted_by
    );
    assert!(successor.release().await.unwrap());
}

/// A waiter handed the lock after waiting longer than its own TTL still gets a whole
/// lease: its watchdog does not count the wait against it and give the lock up at once.
pub async fn hand_off_after_a_long_wait_keeps_a_full_lease(locks: LockService) {
    let key = key();
    let ttl = Duration::from_millis(300);
    let mut holder = locks.try_acquire(&key, 10 * SECOND).await.unwrap().unwrap();
    let waiter = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::spawn(async move { locks.acquire(&key, ttl, after(5_000)).await.unwrap() })
    };
    sleep(SECOND).await;
    assert!(holder.release().await.unwrap());
    let mut guard = waiter.await.unwrap();
    sleep(ttl + ttl / 2).await;
    assert!(!guard.is_lost(), "the watchdog gave up a lease it holds");
    assert!(
        locks.try_acquire(&key, SECOND).await.unwrap().is_none(),
        "the lock was not renewed"
    );
    assert!(guard.release().await.unwrap());
}

/// Dropping a guard stops its renewal and frees the lock well before the TTL.
pub async fn dropped_guard_releases_promptly(locks: LockService) {
    let key = key();
    let guard = locks.try_acquire(&key, 10 * SECOND).await.unwrap().unwrap();
    drop(guard);
    let started = Instant::now();
    let mut next = locks.acquire(&key, 5 * SECOND, after(2_000)).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(500));
    assert!(next.release().await.unwrap());
}

/// While the guard lives, the watchdog keeps the lock well past its TTL.
pub async fn watchdog_keeps_the_lock_past_three_ttls(locks: LockService) {
    let key = key();
    // Renewed every third of it: at 150 ms a renewal held up 100 ms by a loaded machine's
    // scheduler let a Redis Cluster lease run out in a CI run, which is what a TTL that
    // short means there, not what this test examines.
    let ttl = Duration::from_millis(600);
    let mut guard = locks.try_acquire(&key, ttl).await.unwrap().unwrap();
    for _ in 0..8 {
        sleep(ttl / 2).await;
        assert!(
            locks.try_acquire(&key, ttl).await.unwrap().is_none(),
            "lock was lost"
        );
    }
    assert!(!guard.is_lost());
    assert!(guard.release().await.unwrap(), "held past 3 TTLs");
}

/// Deleting the lock behind the holder's back fires `lost()` within one renewal period.
pub async fn lost_fires_when_the_lock_is_deleted_behind_its_back(locks: LockService) {
    let key = key();
    let ttl = Duration::from_millis(600);
    let period = ttl / 3;
    let guard = locks.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert!(
        locks
            .backend()
            .release(&guard.lease().clone())
            .await
            .unwrap()
    );
    let deleted_at = Instant::now();
    timeout(period + Duration::from_millis(100), guard.lost())
        .await
        .expect("lost() did not fire within one renewal period");
    assert!(deleted_at.elapsed() <= period + Duration::from_millis(100));
    assert!(guard.is_lost());
}

/// A lock taken over by another holder fires `lost()`, and the old guard's release leaves
/// the new holder alone.
pub async fn lost_fires_when_the_lock_is_taken_over(locks: LockService) {
    let key = key();
    let ttl = Duration::from_millis(600);
    let mut old = locks.try_acquire(&key, ttl).await.unwrap().unwrap();
    locks.backend().release(&old.lease().clone()).await.unwrap();
    let mut new = locks.try_acquire(&key, 10 * SECOND).await.unwrap().unwrap();
    timeout(ttl / 3 + Duration::from_millis(100), old.lost())
        .await
        .expect("lost() did not fire within one renewal period");
    assert!(new.fencing_token() > old.fencing_token());
    assert!(!old.release().await.unwrap());
    assert!(new.release().await.unwrap());
}

/// Fencing tokens strictly increase across 1,000 hand-offs between competing tasks.
pub async fn fencing_tokens_increase_over_1000_handoffs(locks: LockService) {
    let key = key();
    let seen = Arc::new(Mutex::new(Vec::with_capacity(1000)));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (locks, key, seen) = (locks.clone(), key.clone(), seen.clone());
            tokio::spawn(async move {
                for _ in 0..125 {
                    let mut guard = locks
                        .acquire(&key, 5 * SECOND, after(60_000))
                        .await
                        .unwrap();
                    seen.lock().await.push(guard.fencing_token());
                    assert!(guard.release().await.unwrap());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let seen = seen.lock().await;
    assert_eq!(seen.len(), 1000);
    assert!(
        seen.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens went backwards or repeated"
    );
}

/// Waiters that start waiting in a known order acquire in that order.
pub async fn waiters_acquire_in_arrival_order(locks: LockService) {
    served_in_arrival_order(&[locks], 8).await;
}

/// How long each waiter of [`served_in_arrival_order`] holds the lock once served.
const HELD_IN_LINE: Duration = Duration::from_millis(50);

/// `waiters` waiters, spread over `instances`, queue one after another behind a holder:
/// asserts they acquire in the order they started waiting.
pub async fn served_in_arrival_order(instances: &[LockService], waiters: usize) {
    let key = key();
    // An instance's first wait sets up what its backend waits with (Redis subscribes to
    // its wake-ups), so that wait's first request is not yet the one that queues it: each
    // waits once here, before the order is measured.
    for locks in instances {
        let mut first = locks
            .acquire(&key, 10 * SECOND, after(20_000))
            .await
            .unwrap();
        assert!(first.release().await.unwrap());
    }
    let mut holder = instances[0]
        .try_acquire(&key, 10 * SECOND)
        .await
        .unwrap()
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..waiters {
        let locks = instances[i % instances.len()].clone();
        let (key, order) = (key.clone(), order.clone());
        let mut acquiring =
            Box::pin(async move { locks.acquire(&key, 10 * SECOND, after(20_000)).await });
        // Waiter i is first polled here, so its request to be queued (its first, after the
        // warm-up above) leaves before the next waiter exists. Polled first by a spawned
        // task, a worker thread the machine preempted for longer than the gap below let
        // the next waiter's request pass it: a CI run saw [0, 2, 1, …], and a waiter made
        // to block its worker for 60 ms did it every time; with this it no longer does.
        let first = futures::poll!(acquiring.as_mut());
        assert!(first.is_pending(), "waiter {i} got a held lock at once");
        tasks.push(tokio::spawn(async move {
            let mut guard = acquiring.await.unwrap();
            order.lock().await.push(i);
            // Held a while: where a process sends one waiter per key to the server at a
            // time (PostgreSQL, MySQL), its next waiter reaches the server only once its
            // predecessor released, and must get there before the other process's holder
            // releases in turn. Held 5 ms, a loaded machine's scheduling let the later
            // waiter of the other process pass it: a CI run saw [0, 1, 3, 2, 5, 4, …].
            sleep(HELD_IN_LINE).await;
            assert!(guard.release().await.unwrap());
        }));
        // Long enough for waiter i to be queued before i + 1 starts.
        sleep(Duration::from_millis(40)).await;
    }
    assert!(holder.release().await.unwrap());
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().await, (0..waiters).collect::<Vec<_>>());
}

/// `try_acquire` answers at once, and does not jump the queue when the lock comes free.
pub async fn try_acquire_never_waits_and_never_barges(locks: LockService) {
    let key = key();
    let mut holder = locks.try_acquire(&key, 10 * SECOND).await.unwrap().unwrap();
    let started = Instant::now();
    assert!(locks.try_acquire(&key, SECOND).await.unwrap().is_none());
    assert!(started.elapsed() < Duration::from_millis(200));

    let waiter = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::spawn(async move {
            locks
                .acquire(&key, 10 * SECOND, after(5_000))
                .await
                .unwrap()
        })
    };
    sleep(Duration::from_millis(50)).await;
    assert!(holder.release().await.unwrap());
    // The lock went to the queued waiter, not to whoever asks next.
    assert!(locks.try_acquire(&key, SECOND).await.unwrap().is_none());
    let mut waiter = waiter.await.unwrap();
    assert!(waiter.fencing_token() > holder.fencing_token());
    assert!(waiter.release().await.unwrap());
}

/// A waiter gives up at its deadline with `TimedOut`, and leaves no trace in the queue.
pub async fn acquire_times_out_at_its_deadline(locks: LockService) {
    let key = key();
    let mut holder = locks.try_acquire(&key, 10 * SECOND).await.unwrap().unwrap();
    let started = Instant::now();
    let result = locks.acquire(&key, SECOND, after(200)).await;
    let waited = started.elapsed();
    assert!(
        matches!(result, Err(LockError::TimedOut { .. })),
        "{result:?}"
    );
    assert!(
        waited >= Duration::from_millis(190),
        "gave up early: {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(600),
        "gave up late: {waited:?}"
    );
    assert!(holder.release().await.unwrap());
    // Nobody is left in line: the lock is free for the next caller at once.
    let mut next = locks
        .try_acquire(&key, SECOND)
        .await
        .unwrap()
        .expect("lock not free");
    assert!(next.release().await.unwrap());
}

/// A waiter whose call is abandoned (its future dropped, as when a client disconnects)
/// leaves the queue: the next release goes straight to the waiter behind it.
pub async fn abandoned_wait_does_not_block_the_queue(locks: LockService) {
    let key = key();
    let ttl = Duration::from_secs(2);
    let mut holder = locks.try_acquire(&key, ttl).await.unwrap().unwrap();
    let abandoned = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::spawn(async move { locks.acquire(&key, ttl, after(10_000)).await })
    };
    sleep(Duration::from_millis(30)).await;
    let patient = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::spawn(async move { locks.acquire(&key, ttl, after(10_000)).await.unwrap() })
    };
    sleep(Duration::from_millis(30)).await;
    abandoned.abort();
    sleep(Duration::from_millis(30)).await;
    let released_at = Instant::now();
    assert!(holder.release().await.unwrap());
    let mut patient = patient.await.unwrap();
    assert!(
        released_at.elapsed() < Duration::from_millis(300),
        "the queue stalled for {:?} behind an abandoned waiter",
        released_at.elapsed()
    );
    assert!(patient.release().await.unwrap());
}

/// Acquires cut short — a deadline already past, deadlines that end mid-request, calls
/// dropped mid-request — leave nothing in line: whatever a store did for them is undone,
/// and the lock is free for the next caller within moments.
pub async fn cut_short_acquires_leave_nothing_behind(locks: LockService) {
    let key = key();
    let past = Instant::now()
        .checked_sub(Duration::from_millis(1))
        .unwrap();
    let result = locks.acquire(&key, SECOND, past).await;
    assert!(
        matches!(result, Err(LockError::TimedOut { .. })),
        "{result:?}"
    );
    for round in 0..40_u64 {
        let cut = Duration::from_micros(round * 75);
        let acquired = if round % 2 == 0 {
            locks.acquire(&key, SECOND, Instant::now() + cut).await
        } else {
            match timeout(cut, locks.acquire(&key, SECOND, after(5_000))).await {
                Ok(acquired) => acquired,
                Err(_) => continue,
            }
        };
        match acquired {
            Ok(mut guard) => {
                guard.release().await.unwrap();
            }
            Err(LockError::TimedOut { .. } | LockError::Unavailable { .. }) => {}
            Err(error) => panic!("{error:?}"),
        }
    }
    let started = Instant::now();
    let mut next = locks
        .acquire(&key, SECOND, after(3_000))
        .await
        .expect("an acquire cut short left the lock taken");
    assert!(
        started.elapsed() < 2 * SECOND,
        "the lock was free only after {:?}",
        started.elapsed()
    );
    assert!(next.release().await.unwrap());
}

/// A floor far above any clock reading in microseconds (until the 2090s): counters start
/// from the clock, so only a floor above it shows what raising does.
const ABOVE_THE_CLOCK: u64 = 4_000_000_000_000_000;

/// Fencing tokens past 4·10^15 stay above a raised floor, through a grant and through a
/// hand-off; floors above `MAX_FENCING_FLOOR` (2^53 − 2^32) are refused rather than
/// rounded. (Where the counter counts by one, every digit is shown kept: the tokens are
/// the floor plus one and plus two.)
pub async fn large_fencing_tokens_stay_exact(locks: LockService) {
    let key = key();
    let floor = ABOVE_THE_CLOCK + 123_456_789;
    locks
        .raise_fencing(&key, FencingToken::new(floor))
        .await
        .unwrap();
    let mut first = locks.try_acquire(&key, SECOND).await.unwrap().unwrap();
    assert!(first.fencing_token().get() > floor);
    let waiter = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::spawn(async move { locks.acquire(&key, SECOND, after(5_000)).await.unwrap() })
    };
    sleep(Duration::from_millis(50)).await;
    assert!(first.release().await.unwrap());
    let mut second = waiter.await.unwrap();
    assert!(second.fencing_token() > first.fencing_token());
    if tokens_are_counted(&locks) {
        assert_eq!(first.fencing_token().get(), floor + 1);
        assert_eq!(second.fencing_token().get(), floor + 2);
    }
    assert!(second.release().await.unwrap());
    assert!(matches!(
        locks
            .raise_fencing(&key, FencingToken::new(lock::MAX_FENCING_FLOOR + 1))
            .await,
        Err(LockError::Invalid(_))
    ));
}

/// `raise_fencing` lifts the counter and never lowers it: what it answers is never below
/// the floor nor below an earlier answer, and the next grant carries a token above it.
/// (A counter that never granted starts from the clock, so a low floor leaves it there —
/// where the store keeps a counter; ZooKeeper's and etcd's tokens are their own zxids and
/// revisions plus a raised base.)
pub async fn raise_fencing_never_lowers(locks: LockService) {
    let key = key();
    let fresh = locks
        .raise_fencing(&key, FencingToken::new(7))
        .await
        .unwrap()
        .get();
    assert!(fresh >= 7);
    if tokens_are_counted(&locks) {
        assert!(
            fresh > 1_700_000_000_000_000,
            "{fresh} is not a clock reading"
        );
    }
    let raised = locks
        .raise_fencing(&key, FencingToken::new(ABOVE_THE_CLOCK))
        .await
        .unwrap()
        .get();
    assert!(raised >= ABOVE_THE_CLOCK);
    let again = locks
        .raise_fencing(&key, FencingToken::new(7))
        .await
        .unwrap()
        .get();
    assert!(again >= raised, "lowered from {raised} to {again}");
    let mut guard = locks.try_acquire(&key, SECOND).await.unwrap().unwrap();
    assert!(guard.fencing_token().get() > again);
    if tokens_are_counted(&locks) {
        assert_eq!(guard.fencing_token().get(), ABOVE_THE_CLOCK + 1);
    }
    guard.release().await.unwrap();
}

/// Only the current holder can extend a lease.
pub async fn extend_only_by_the_holder(locks: LockService) {
    let key = key();
    let mut guard = locks.try_acquire(&key, SECOND).await.unwrap().unwrap();
    let impostor = Lease::new(
        &key,
        OwnerToken::random(),
        FencingToken::new(0),
        SECOND,
        Instant::now(),
    );
    assert!(!locks.backend().extend(&impostor, SECOND).await.unwrap());
    assert!(locks.backend().extend(guard.lease(), SECOND).await.unwrap());
    assert!(guard.release().await.unwrap());
    assert!(!locks.backend().extend(guard.lease(), SECOND).await.unwrap());
}

/// Requests no store can honour are refused up front.
pub async fn rejects_empty_key_and_tiny_ttl(locks: LockService) {
    assert!(matches!(
        locks.try_acquire("", SECOND).await,
        Err(LockError::Invalid(_))
    ));
    assert!(matches!(
        locks
            .acquire(&key(), Duration::from_millis(1), after(100))
            .await,
        Err(LockError::Invalid(_))
    ));
}

/// After the store loses everything, feeding back the highest token the protected store
/// accepted keeps the next token above it.
pub async fn fencing_survives_data_loss_with_catch_up(mut store: impl Store) {
    let key = key();
    let locks = store.service();
    let mut highest = FencingToken::new(0);
    for _ in 0..5 {
        let mut guard = locks.try_acquire(&key, SECOND).await.unwrap().unwrap();
        highest = highest.max(guard.fencing_token());
        guard.release().await.unwrap();
    }
    let locks = store.lose_data().await;
    locks.raise_fencing(&key, highest).await.unwrap();
    let mut guard = locks.try_acquire(&key, SECOND).await.unwrap().unwrap();
    assert!(
        guard.fencing_token() > highest,
        "{:?} <= {highest:?}",
        guard.fencing_token()
    );
    guard.release().await.unwrap();
}

/// The holder's note is readable by anyone, moves with a hand-off to the next waiter, and
/// is gone once the lock is free.
pub async fn holder_note_follows_the_holder(locks: LockService) {
    let key = key();
    assert_eq!(locks.holder_note(&key).await.unwrap(), None);
    let mut first = locks
        .acquire_noted(&key, 10 * SECOND, after(1_000), "first: ticket 1")
        .await
        .unwrap();
    assert_eq!(
        locks.holder_note(&key).await.unwrap().as_deref(),
        Some("first: ticket 1")
    );
    let waiter = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::spawn(async move {
            locks
                .acquire_noted(&key, 10 * SECOND, after(5_000), "second|with:separators")
                .await
                .unwrap()
        })
    };
    sleep(Duration::from_millis(50)).await;
    assert!(first.release().await.unwrap());
    let mut second = waiter.await.unwrap();
    assert_eq!(
        locks.holder_note(&key).await.unwrap().as_deref(),
        Some("second|with:separators")
    );
    assert!(second.release().await.unwrap());
    assert_eq!(locks.holder_note(&key).await.unwrap(), None);
    let too_long = "x".repeat(lock::MAX_NOTE + 1);
    assert!(matches!(
        locks
            .acquire_noted(&key, SECOND, after(100), &too_long)
            .await,
        Err(LockError::Invalid(_))
    ));
}

/// After the store loses its counters, no grant repeats a token handed out before — with
/// no help from the protected store, and also after a raise to a floor below what was
/// handed out (the protected store only knows what was written, not what was granted).
pub async fn tokens_never_repeat_after_data_loss(mut store: impl Store) {
    let key = key();
    let locks = store.service();
    let mut before = Vec::new();
    for _ in 0..5 {
        let mut guard = locks.try_acquire(&key, SECOND).await.unwrap().unwrap();
        before.push(guard.fencing_token());
        guard.release().await.unwrap();
    }
    // A holder that was granted a token before the loss and never wrote with it.
    let unwritten = *before.last().unwrap();
    let locks = store.lose_data().await;
    let mut after_loss = Vec::new();
    for round in 0..5 {
        if round == 2 {
            // What the protected store accepted: an older token than the unwritten one.
            locks.raise_fencing(&key, before[2]).await.unwrap();
        }
        let mut guard = locks.try_acquire(&key, SECOND).await.unwrap().unwrap();
        after_loss.push(guard.fencing_token());
        guard.release().await.unwrap();
    }
    assert!(
        after_loss.iter().all(|token| *token > unwritten),
        "tokens after the loss {after_loss:?} repeat or undercut those before {before:?}"
    );
    assert!(after_loss.windows(2).all(|pair| pair[0] < pair[1]));
}

/// Past the cap on waiters, an acquire is turned away at once ([`LockError::QueueFull`])
/// and queues nothing; those within it are served in turn.
pub async fn a_crowd_beyond_the_cap_is_turned_away_at_once(locks: LockService) {
    let locks = locks.with_max_waiters(8);
    let key = key();
    let holder = locks.try_acquire(&key, 10 * SECOND).await.unwrap().unwrap();
    let served = Served {
        within_ms: 5_000,
        released_checked: false,
        turned_away_within: Duration::from_millis(250),
    };
    crowd_meets_a_cap_of_8(&[locks], holder, &key, served, Duration::from_millis(300)).await;
}

/// How a crowd's waiters go: each one's deadline, whether a served one's release must
/// say it released, and how soon one is turned away.
#[derive(Clone, Copy)]
struct Served {
    within_ms: u64,
    released_checked: bool,
    turned_away_within: Duration,
}

/// 20 waiters on `key` from `instances` in turn, behind `holder` — released `holding`
/// later — where a key's queue is capped at 8: 8 are served in turn, the 12 others turned
/// away at once.
async fn crowd_meets_a_cap_of_8(
    instances: &[LockService],
    mut holder: lock::LockGuard,
    key: &str,
    served: Served,
    holding: Duration,
) {
    let started = Instant::now();
    let crowd: Vec<_> = (0..20)
        .map(|i| {
            let (locks, key) = (instances[i % instances.len()].clone(), key.to_owned());
            tokio::spawn(async move {
                let acquired = locks
                    .acquire(&key, 10 * SECOND, after(served.within_ms))
                    .await;
                let answered_in = started.elapsed();
                match acquired {
                    Ok(mut guard) => {
                        let released = guard.release().await.unwrap();
                        if served.released_checked {
                            assert!(released);
                        }
                        Ok(())
                    }
                    Err(LockError::QueueFull { max_waiters, .. }) => {
                        assert_eq!(max_waiters, 8);
                        Err(answered_in)
                    }
                    Err(error) => panic!("{error:?}"),
                }
            })
        })
        .collect();
    sleep(holding).await;
    assert!(holder.release().await.unwrap());
    let mut turned_away = Vec::new();
    let mut served_count = 0;
    for waiter in crowd {
        match waiter.await.unwrap() {
            Ok(()) => served_count += 1,
            Err(answered_in) => turned_away.push(answered_in),
        }
    }
    assert_eq!((served_count, turned_away.len()), (8, 12));
    assert!(
        turned_away
            .iter()
            .all(|answered_in| *answered_in < served.turned_away_within),
        "turned away only after {turned_away:?}"
    );
}

/// 5,000 concurrent acquires on one key do not stand in the others' way: while they all
/// wait, another key is granted at once, released and granted again, 200 times.
pub async fn a_flood_on_one_key_leaves_other_keys_fast(locks: LockService) {
    let (hot, cold) = (key(), key());
    let mut holder = locks.try_acquire(&hot, 10 * SECOND).await.unwrap().unwrap();
    let flood: Vec<_> = (0..5_000)
        .map(|_| {
            let (locks, hot) = (locks.clone(), hot.clone());
            tokio::spawn(async move {
                match locks.acquire(&hot, SECOND, after(1_000)).await {
                    Ok(mut guard) => {
                        let _ = guard.release().await;
                    }
                    Err(LockError::QueueFull { .. } | LockError::TimedOut { .. }) => {}
                    Err(error) => panic!("{error:?}"),
                }
            })
        })
        .collect();
    // While every waiter of the hot key is still queued (its holder keeps it), the other
    // key is taken and given back again and again without waiting: `try_acquire` never
    // queues, so each grant shows the store answered and nothing of the flood stood in
    // its way. (How fast is the benchmark's business, not a test's.)
    granted_at_once(&locks, &cold, 200).await;
    assert!(
        holder.release().await.unwrap(),
        "the hot key was held throughout"
    );
    for waiter in flood {
        waiter.await.unwrap();
    }
}

/// `key`, free, granted without waiting and given back, `rounds` times over.
pub async fn granted_at_once(locks: &LockService, key: &str, rounds: usize) {
    for round in 0..rounds {
        let mut guard = locks
            .try_acquire(key, SECOND)
            .await
            .unwrap_or_else(|error| panic!("round {round}: {error:?}"))
            .unwrap_or_else(|| panic!("round {round}: the free key was not granted"));
        assert!(guard.release().await.unwrap(), "round {round}");
        sleep(Duration::from_millis(2)).await;
    }
}

/// A holder re-enters its lock at once — the same fencing token, one more hold — though
/// another waiter is queued; the lock is freed only when every hold was given back
/// (released or dropped), and the waiter then gets it. A released guard cannot re-enter.
pub async fn a_holder_reenters_without_waiting(locks: LockService) {
    let key = key();
    let mut outer = locks.try_acquire(&key, 5 * SECOND).await.unwrap().unwrap();
    let waiter = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::spawn(async move { locks.acquire(&key, 5 * SECOND, after(10_000)).await })
    };
    sleep(Duration::from_millis(50)).await;
    let mut inner = outer.reenter().expect("a held guard re-enters");
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    assert_eq!((outer.holds(), inner.holds()), (2, 2));
    assert!(inner.release().await.unwrap(), "the grant is still ours");
    assert_eq!(outer.holds(), 1);
    sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "freed while a hold was left");
    assert!(outer.release().await.unwrap());
    assert!(outer.reenter().is_none());
    let mut next = waiter.await.unwrap().unwrap();
    assert!(next.fencing_token() > outer.fencing_token());
    assert!(next.release().await.unwrap());

    // Holds dropped in any order: the last one frees the lock.
    let outer = locks.try_acquire(&key, 5 * SECOND).await.unwrap().unwrap();
    let inner = outer.reenter().unwrap();
    drop(outer);
    sleep(Duration::from_millis(100)).await;
    assert!(locks.try_acquire(&key, SECOND).await.unwrap().is_none());
    drop(inner);
    let mut free = locks.acquire(&key, SECOND, after(2_000)).await.unwrap();
    assert!(free.release().await.unwrap());
}

/// Chubby's lock-delay, given `holders` and `others` (the same service for stores whose
/// leases are per grant; two sessions where the lease is the session): a released lock goes
/// to the next waiter at once; a holder that vanishes — `vanish` takes the key and
/// vanishes, and says how long the store still counts its lease from then — keeps its key
/// for that long and then the delay.
pub async fn lock_delay_keeps_a_vanished_holders_key<F, Fut>(
    holders: &LockService,
    others: &LockService,
    delay: Duration,
    vanish: F,
) where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    let key = key();
    let ttl = Duration::from_millis(300);
    let mut first = holders.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert!(first.release().await.unwrap());
    let released_at = Instant::now();
    let mut next = others.acquire(&key, ttl, after(5_000)).await.unwrap();
    assert!(
        released_at.elapsed() < delay / 2,
        "a released lock waited {:?}",
        released_at.elapsed()
    );
    assert!(next.release().await.unwrap());

    let lease_left = vanish(key.clone()).await;
    let vanished_at = Instant::now();
    let mut successor = others
        .acquire(&key, 5 * SECOND, after(20_000))
        .await
        .unwrap();
    let waited = vanished_at.elapsed();
    assert!(
        waited + Duration::from_millis(50) >= lease_left + delay,
        "taken {waited:?} after a holder vanished, before its lease ({lease_left:?}) and the delay ({delay:?})"
    );
    assert!(
        waited < lease_left + delay + 3 * SECOND,
        "taken only after {waited:?}"
    );
    assert!(successor.release().await.unwrap());
}

/// Chubby's lock-delay where the holder vanishes by abandoning its guard, as a crashed
/// process leaves its lease to run out: the key stays held for the lease (300 ms after the
/// grant) and the delay; a released lock is free at once.
pub async fn lock_delay_keeps_an_abandoned_holders_key(locks: &LockService, delay: Duration) {
    let holder = locks.clone();
    lock_delay_keeps_a_vanished_holders_key(locks, locks, delay, |key| async move {
        let guard = holder
            .try_acquire(&key, Duration::from_millis(300))
            .await
            .unwrap()
            .unwrap();
        guard.abandon().await;
        // Its lease runs out 300 ms after the grant.
        Duration::from_millis(300)
    })
    .await;
}

/// Chubby's lock-delay where the holder's session ends from outside while it holds the
/// key (`end` ends it, given the key): its drop after that is no release, so its successor
/// waits the delay from then.
pub async fn lock_delay_after_an_ended_session<F, Fut>(
    holders: &LockService,
    others: &LockService,
    delay: Duration,
    end: F,
) where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let holder = holders.clone();
    lock_delay_keeps_a_vanished_holders_key(holders, others, delay, |key| async move {
        let guard = holder.try_acquire(&key, SECOND).await.unwrap().unwrap();
        end(key).await;
        // Alive, and releasing after its session ended: that is not a release.
        drop(guard);
        Duration::ZERO
    })
    .await;
}

/// Two services on one store whose backends cap a key's queue at 8 in the store (their
/// caps in process are looser): 20 waiters from both get 8 queued between them, served in
/// turn, and 12 turned away at once.
pub async fn the_waiter_cap_holds_across(instances: [LockService; 2]) {
    let instances = instances.map(|locks| locks.with_max_waiters(64));
    let key = key();
    let holder = instances[0]
        .try_acquire(&key, 10 * SECOND)
        .await
        .unwrap()
        .unwrap();
    let served = Served {
        within_ms: 10_000,
        released_checked: true,
        turned_away_within: SECOND,
    };
    crowd_meets_a_cap_of_8(&instances, holder, &key, served, SECOND).await;
}

/// For stores whose waiters wait in the server's own queue: a waiter whose call is dropped
/// mid-wait leaves that queue within moments (`in_server` counts the waiters there on key
/// `k`), not when its wait would have timed out — so it never takes the lock when its turn
/// comes.
pub async fn a_dropped_waiter_leaves_the_servers_queue<F, Fut>(locks: &LockService, in_server: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = i64>,
{
    let mut holder = locks.try_acquire("k", 10 * SECOND).await.unwrap().unwrap();
    let dropped = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire("k", SECOND, after(30_000)).await })
    };
    let joined = Instant::now();
    while in_server().await == 0 {
        assert!(
            joined.elapsed() < 5 * SECOND,
            "the waiter never reached the server"
        );
        sleep(Duration::from_millis(10)).await;
    }
    dropped.abort();
    let dropped_at = Instant::now();
    while in_server().await > 0 {
        assert!(
            dropped_at.elapsed() < 2 * SECOND,
            "a dropped waiter stayed in the server's queue"
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert!(holder.release().await.unwrap());
}

/// A key's state forgotten once nobody holds or waits for it — pruned, or expired by the
/// store — leaves fencing whole: the next grant's token is above every earlier one, and
/// a lease from before (released, or run out while its holder paused) can neither extend
/// nor release the new holder's lock. A key held and waited for all the while keeps its
/// state: its next token follows on. `forget(key)` makes the store forget `key` —
/// waiting out its idle time, pruning — and checks that it did.
pub async fn forgotten_key_keeps_fencing<F, Fut>(locks: &LockService, forget: F)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (idle_key, busy_key) = (key(), key());
    let mut earlier = Vec::new();
    for _ in 0..3 {
        let mut guard = locks.try_acquire(&idle_key, SECOND).await.unwrap().unwrap();
        earlier.push(guard.fencing_token());
        assert!(guard.release().await.unwrap());
    }
    let ttl = Duration::from_millis(300);
    let mut last = locks.try_acquire(&idle_key, ttl).await.unwrap().unwrap();
    earlier.push(last.fencing_token());
    let stale = last.lease().clone();
    if leases_are_sessions(locks) {
        // A lease that is a session does not run out while this process lives.
        assert!(last.release().await.unwrap());
    } else {
        last.abandon().await;
        sleep(ttl + 2 * locks.backend().expiry_granularity()).await;
    }

    let mut busy = locks.try_acquire(&busy_key, ttl).await.unwrap().unwrap();
    let waiter = {
        let (locks, busy_key) = (locks.clone(), busy_key.clone());
        tokio::spawn(async move { locks.acquire(&busy_key, SECOND, after(60_000)).await })
    };
    sleep(Duration::from_millis(100)).await;

    forget(idle_key.clone()).await;

    let mut again = locks
        .try_acquire(&idle_key, 5 * SECOND)
        .await
        .unwrap()
        .expect("free once forgotten");
    let highest = earlier.iter().max().copied().unwrap();
    assert!(
        again.fencing_token() > highest,
        "token {} after {highest}",
        again.fencing_token()
    );
    assert!(
        !locks.backend().extend(&stale, 5 * SECOND).await.unwrap(),
        "a lease from before extended the new holder's lock"
    );
    assert!(
        !locks.backend().release(&stale).await.unwrap(),
        "a lease from before released the new holder's lock"
    );
    assert!(
        locks
            .try_acquire(&idle_key, SECOND)
            .await
            .unwrap()
            .is_none(),
        "the new holder lost its lock"
    );
    assert!(again.release().await.unwrap());

    assert!(!busy.is_lost(), "the busy key's holder lost its lock");
    let held = busy.fencing_token();
    assert!(busy.release().await.unwrap());
    let mut next = waiter.await.unwrap().expect("the waiter is served");
    if tokens_are_counted(locks) {
        assert_eq!(
            next.fencing_token().get(),
            held.get() + 1,
            "the busy key's counter was forgotten"
        );
    } else {
        assert!(next.fencing_token() > held);
    }
    assert!(next.release().await.unwrap());
}

/// Locks and releases `count` keys never locked before, 32 at a time, as a stream of
/// orders does; returns how long it took.
pub async fn lock_fresh_keys(locks: &LockService, count: usize) -> Duration {
    const TASKS: usize = 32;
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let locks = locks.clone();
            tokio::spawn(async move {
                for _ in (task..count).step_by(TASKS) {
                    let mut guard = locks.acquire(&key(), SECOND, after(30_000)).await.unwrap();
                    assert!(guard.release().await.unwrap());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    started.elapsed()
}

/// A hot key with `waiters` queued behind its holder: the requests `requests` counts from
/// the holder's release until every waiter was served, per hand-off, and how long the
/// hand-offs took. Each waiter holds the lock once and releases it.
pub async fn requests_per_hand_off(
    locks: &LockService,
    requests: impl Fn() -> u64,
    waiters: usize,
) -> (f64, Duration) {
    let key = key();
    let mut holder = locks.try_acquire(&key, 10 * SECOND).await.unwrap().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let queued: Vec<_> = (0..waiters)
        .map(|_| {
            let (locks, key, served) = (locks.clone(), key.clone(), served.clone());
            tokio::spawn(async move {
                let mut guard = locks
                    .acquire(&key, 10 * SECOND, after(60_000))
                    .await
                    .unwrap();
                served.fetch_add(1, Ordering::SeqCst);
                guard.release().await.unwrap();
            })
        })
        .collect();
    // Everyone queued before the first hand-off.
    sleep(SECOND).await;
    let before = requests();
    let started = Instant::now();
    holder.release().await.unwrap();
    for waiter in queued {
        waiter.await.unwrap();
    }
    assert_eq!(served.load(Ordering::SeqCst), waiters);
    (
        (requests() - before) as f64 / waiters as f64,
        started.elapsed(),
    )
}

/// A test server of the lock service's own that stops and starts again on its port, its
/// data kept.
pub trait Restart {
    fn stop(&mut self);
    fn restart(&mut self) -> std::io::Result<()>;
}

/// Fencing tokens strictly increase across the store's data loss when that loss is a
/// restart that keeps the data (a consensus store's own counter), with no `raise_fencing`.
pub async fn tokens_increase_across_a_server_restart(mut store: impl Store) {
    let locks = store.service();
    let mut before = FencingToken::new(0);
    for _ in 0..3 {
        let mut guard = locks.try_acquire("k", SECOND).await.unwrap().unwrap();
        assert!(guard.fencing_token() > before);
        before = guard.fencing_token();
        guard.release().await.unwrap();
    }
    let locks = store.lose_data().await;
    let mut guard = locks.acquire("k", SECOND, after(10_000)).await.unwrap();
    assert!(
        guard.fencing_token() > before,
        "{:?} after {before:?}",
        guard.fencing_token()
    );
    guard.release().await.unwrap();
}

/// A holder whose process vanishes keeps the lock until its session (`session`: the
/// session timeout or lease TTL) runs out, then its successor through `successors` gets
/// it. A runtime of its own stands for the process: dropping it stops its keep-alives and
/// closes its connection without closing its session. `runs_out` names the end in the
/// failure message.
pub async fn a_vanished_process_is_succeeded_after_its_session(
    url: String,
    session: Duration,
    successors: &LockService,
    runs_out: &str,
) {
    let granted_at = tokio::task::spawn_blocking(move || {
        let process = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let granted_at = process.block_on(async {
            let locks = lock::open(
                &url,
                &lock::LockOptions {
                    session,
                    ..lock::LockOptions::default()
                },
            )
            .unwrap();
            let guard = locks.try_acquire("k", SECOND).await.unwrap().unwrap();
            std::mem::forget(guard);
            Instant::now()
        });
        process.shutdown_background();
        granted_at
    })
    .await
    .unwrap();
    let mut successor = successors
        .acquire("k", SECOND, after(15_000))
        .await
        .unwrap();
    let waited = granted_at.elapsed();
    assert!(
        waited >= session - Duration::from_millis(300),
        "taken after {waited:?}, before {runs_out}"
    );
    assert!(waited < session * 3, "took {waited:?}");
    successor.release().await.unwrap();
}

/// A hot key with 32 waiters: each hand-off costs at most `most` requests (counted by
/// `requests`) and wakes exactly one waiter — had a release woken the whole queue, each
/// waiter would have looked again, some 30 requests per hand-off.
pub async fn a_hand_off_costs_at_most(locks: &LockService, requests: impl Fn() -> u64, most: f64) {
    let (per_hand_off, _) = requests_per_hand_off(locks, requests, 32).await;
    assert!(
        per_hand_off <= most,
        "{per_hand_off:.2} requests per hand-off"
    );
}

/// A release the server never answered (it was down) is not forgotten: the session's
/// cleaner deletes the key once the server is back, so another process (`others`) gets
/// the lock then — not when the holder's session ends, which for a live process is never.
/// `holders` give up on a request after a second.
pub async fn a_release_the_server_missed_is_retried(
    server: &mut impl Restart,
    holders: &LockService,
    others: &LockService,
) {
    let mut holder = holders
        .try_acquire("k", 10 * SECOND)
        .await
        .unwrap()
        .unwrap();
    server.stop();
    let released = holder.release().await;
    assert!(released.is_err(), "{released:?}");
    server.restart().unwrap();
    let back_at = Instant::now();
    let mut next = others
        .acquire("k", SECOND, after(15_000))
        .await
        .expect("the missed release was never retried");
    assert!(back_at.elapsed() < 15 * SECOND);
    assert!(next.fencing_token() > holder.fencing_token());
    next.release().await.unwrap();
}

/// The options of an instance whose cap on waiters is kept in the lock service: 8, with a
/// patient timeout for a server of the test's own.
pub fn capped_at_8() -> lock::LockOptions {
    lock::LockOptions {
        op_timeout: Some(5 * SECOND),
        max_waiters: 8,
        ..lock::LockOptions::default()
    }
}

/// The options of a process whose requests the server may miss: a long session, and a
/// request given up after a second.
pub fn impatient_with_a_long_session() -> lock::LockOptions {
    lock::LockOptions {
        session: 30 * SECOND,
        op_timeout: Some(SECOND),
        ..lock::LockOptions::default()
    }
}
