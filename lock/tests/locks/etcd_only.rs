//! What only an etcd server can show: tokens across a server restart and a wipe, a lease
//! kept alive past its TTL, a lease revoked from outside, a vanished process's lease running out, a waiter whose key
//! vanished, a release the server never answered, the cap on waiters across processes,
//! and the requests a hand-off costs. Private members on other ports; the shared one
//! (127.0.0.1:2379) is never stopped.

use std::sync::Arc;
use std::time::Duration;

use lock::testing::EtcdServer;
use lock::testing::etcd_operator::EtcdOperator;
use lock::{EtcdBackend, LockOptions, LockService};
use tokio::time::{Instant, sleep, timeout};

const SECOND: Duration = Duration::from_secs(1);

/// The shared etcd (`ETCD_URL`, else 127.0.0.1:2379), under a root of the test's own so
/// tests running in parallel never meet.
pub fn shared_etcd() -> LockService {
    crate::shared_under_own_root("ETCD_URL", "etcd://127.0.0.1:2379", "etcd")
}

fn backend(server: &EtcdServer, lease_ttl: Duration) -> Arc<EtcdBackend> {
    with_options(server, crate::patient_session(lease_ttl))
}

fn with_options(server: &EtcdServer, options: LockOptions) -> Arc<EtcdBackend> {
    Arc::new(EtcdBackend::open(&server.url("/t"), &options).unwrap())
}

/// An etcd member of the test's own. Its "data loss" is a restart: etcd keeps its data
/// (and its revision) across one.
pub type PrivateEtcd = crate::PrivateStore<EtcdServer>;

impl PrivateEtcd {
    pub fn start() -> Self {
        crate::PrivateStore::restarting(
            EtcdServer::start().expect("an etcd member starts"),
            |server| LockService::from_arc(backend(server, 4 * SECOND)),
            |server| server.restart().expect("etcd restarts"),
        )
    }
}

/// Fencing tokens (revisions) strictly increase across a restart of the member, with no
/// `raise_fencing`: etcd keeps its revision with its data. (`raise_fencing` here lifts a
/// per-key base added to the revision, kept in etcd too — for a protected store that has
/// seen higher tokens, from another lock service.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_increase_across_a_server_restart() {
    crate::suite::tokens_increase_across_a_server_restart(PrivateEtcd::start()).await;
}

/// Revoking the lease from outside (as an operator, or its expiry, would) deletes the lock
/// key: the holder's `lost()` fires, its release touches nothing, and a waiter of another
/// process gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_fires_when_the_lease_is_revoked_from_outside() {
    let server = EtcdServer::start().unwrap();
    let holder_backend = backend(&server, 4 * SECOND);
    let holder_locks = LockService::from_arc(holder_backend.clone());
    let other = LockService::from_arc(backend(&server, 4 * SECOND));
    let holder = holder_locks
        .try_acquire("k", SECOND)
        .await
        .unwrap()
        .unwrap();
    let waiter = crate::suite::spawn_acquire(&other, "k", SECOND, 10 * SECOND);
    sleep(Duration::from_millis(200)).await;

    let lease = holder_backend.lease_id().await.unwrap();
    let operator = EtcdOperator::connect(&server.endpoint()).unwrap();
    operator.revoke_lease(lease).await.unwrap();
    let revoked_at = Instant::now();

    timeout(2 * SECOND, holder.lost())
        .await
        .expect("lost() did not fire after the lease was revoked");
    let successor = waiter.await.unwrap().unwrap();
    assert!(revoked_at.elapsed() < 2 * SECOND);
    crate::successor_took_over(holder, successor).await;
}

/// The keep-alive stream keeps the process's lease, and its locks, alive: a lock held for
/// three lease TTLs is neither lost nor taken, and its release finds its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_keep_alive_holds_a_lock_past_three_lease_ttls() {
    let server = EtcdServer::start().unwrap();
    let lease_ttl = 2 * SECOND;
    let locks = LockService::from_arc(backend(&server, lease_ttl));
    let mut holder = locks.try_acquire("k", SECOND).await.unwrap().unwrap();
    let lost = timeout(3 * lease_ttl, holder.lost()).await;
    assert!(lost.is_err(), "lost while its process kept the lease alive");
    assert!(locks.try_acquire("k", SECOND).await.unwrap().is_none());
    assert!(holder.release().await.unwrap());
}

/// A holder whose process vanishes — its keep-alives stop — keeps the lock until its lease
/// runs out, then its successor gets it: the lease TTL is the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vanished_process_is_succeeded_after_its_lease_runs_out() {
    let server = EtcdServer::start().unwrap();
    let successors = LockService::from_arc(backend(&server, 4 * SECOND));
    crate::suite::a_vanished_process_is_succeeded_after_its_session(
        server.url("/t"),
        2 * SECOND,
        &successors,
        "the lease could run out",
    )
    .await;
}

/// A hot key with 32 waiters: each hand-off costs a constant number of requests (the
/// release, the next waiter's look at the holder, its watch on its own key) and wakes
/// exactly one waiter — had a release woken the whole queue, each waiter would have looked
/// again, some 30 requests per hand-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hand_off_costs_constant_requests_and_wakes_one_waiter() {
    let server = EtcdServer::start().unwrap();
    let counted = backend(&server, 4 * SECOND);
    let locks = LockService::from_arc(counted.clone());
    // Queued first: 32 × (create and look, find the predecessor, watch it); then counted.
    crate::suite::a_hand_off_costs_at_most(&locks, || counted.requests(), 3.5).await;
}

/// Chubby's lock-delay on etcd: a holder whose lease ended without a release (revoked from
/// outside, as an expiry would) leaves a marker, and its successor holds the lock but waits
/// the delay before using it; a released lock goes on at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_delay_holds_a_vanished_holders_key() {
    let server = EtcdServer::start().unwrap();
    let delay = Duration::from_millis(700);
    let delayed = |server: &EtcdServer| {
        Arc::new(
            EtcdBackend::open(
                &server.url("/t"),
                &LockOptions {
                    session: 4 * SECOND,
                    op_timeout: Some(5 * SECOND),
                    lock_delay: delay,
                    ..LockOptions::default()
                },
            )
            .unwrap(),
        )
    };
    let holder_backend = delayed(&server);
    let holders = LockService::from_arc(holder_backend.clone());
    let others = LockService::from_arc(delayed(&server));
    let endpoint = server.endpoint();
    crate::suite::lock_delay_after_an_ended_session(&holders, &others, delay, |_| async move {
        let lease = holder_backend.lease_id().await.unwrap();
        let operator = EtcdOperator::connect(&endpoint).unwrap();
        operator.revoke_lease(lease).await.unwrap();
    })
    .await;
}

impl crate::suite::Restart for EtcdServer {
    fn stop(&mut self) {
        EtcdServer::stop(self);
    }

    fn restart(&mut self) -> std::io::Result<()> {
        EtcdServer::restart(self)
    }
}

/// An etcd member of the test's own whose data loss is real: its data directory deleted,
/// every key, lease and revision with it. The same service goes on across the wipe, as a
/// running process would (its lease is gone).
pub fn wiped(started: PrivateEtcd) -> crate::PrivateStore<EtcdServer> {
    crate::PrivateStore::going_on(
        started.server,
        started.locks,
        |server| server.wipe().expect("etcd restarts empty"),
        true,
    )
}

/// After a wipe the revisions start over, below tokens already handed out — a protected
/// store refuses those grants until `raise_fencing` lifts the key's base above the highest
/// token it accepted; then the next grant is above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencing_catches_up_after_a_wipe() {
    crate::suite::fencing_survives_data_loss_with_catch_up(wiped(PrivateEtcd::start())).await;
}

/// A release the server never answered (it was down) is not forgotten: the lease's cleaner
/// deletes the key once the server is back, so another process gets the lock then — not
/// when the holder's lease ends, which for a live process is never.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_the_server_missed_is_retried() {
    let mut server = EtcdServer::start().unwrap();
    let holders = LockService::from_arc(with_options(
        &server,
        crate::suite::impatient_with_a_long_session(),
    ));
    let others = LockService::from_arc(backend(&server, 4 * SECOND));
    crate::suite::a_release_the_server_missed_is_retried(&mut server, &holders, &others).await;
}

/// The cap on waiters is checked against etcd's queue, so it holds across processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_waiter_cap_holds_across_processes() {
    let server = EtcdServer::start().unwrap();
    let capped = || LockService::from_arc(with_options(&server, crate::suite::capped_at_8()));
    crate::suite::the_waiter_cap_holds_across([capped(), capped()]).await;
}

/// A waiter whose own key is deleted from outside (as an operator might) gives up as
/// soon as it next looks at the line — it neither waits on nor spins.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_whose_key_vanished_gives_up() {
    let server = EtcdServer::start().unwrap();
    let locks = LockService::from_arc(backend(&server, 4 * SECOND));
    let mut holder = locks.try_acquire("k", 10 * SECOND).await.unwrap().unwrap();
    let waiter = crate::suite::spawn_acquire(&locks, "k", SECOND, 10 * SECOND);
    sleep(Duration::from_millis(300)).await;
    let operator = EtcdOperator::connect(&server.endpoint()).unwrap();
    let line = operator.keys_under("/t/locks/k/w/").await.unwrap();
    assert_eq!(line.len(), 2);
    assert!(operator.delete(&line[1]).await.unwrap());
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let result = timeout(2 * SECOND, waiter)
        .await
        .expect("the waiter went on waiting")
        .unwrap();
    assert!(
        matches!(result, Err(lock::LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(released_at.elapsed() < SECOND);
}

/// The shared etcd under a root of the test's own, and an operator of it for counting
/// the keys under that root.
fn shared_with_root(root: &str) -> (LockService, EtcdOperator) {
    let base = std::env::var("ETCD_URL").unwrap_or_else(|_| "etcd://127.0.0.1:2379".into());
    let locks =
        lock::open(&format!("{base}{root}"), &LockOptions::default()).expect("a valid etcd URL");
    let endpoint = format!("http://{}", base.trim_start_matches("etcd://"));
    (locks, EtcdOperator::connect(&endpoint).unwrap())
}

fn test_root() -> String {
    format!("/payonce-tests/{:016x}", rand::random::<u64>())
}

/// etcd keeps no state for a key nobody holds or waits for — a waiter's key lives from
/// its create to its release, on the process's lease — so there is nothing to prune: the
/// key locked again gets a larger token, and a lease from before can neither extend nor
/// release the new lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_released_key_leaves_nothing_and_fencing_stays_whole() {
    let root = test_root();
    let (locks, operator) = shared_with_root(&root);
    let root = &root;
    crate::suite::forgotten_key_keeps_fencing(&locks, move |key| async move {
        let under = format!("{root}/locks/{key}/");
        assert_eq!(operator.count_under(&under).await.unwrap(), 0);
    })
    .await;
}

/// 10,000 keys locked once each leave no key behind under the test's root. Bound: the
/// keys under the root are at most one per waiter and holder at the moment (plus a
/// fencing base per key raised, a lock-delay marker per holder that vanished, and a
/// minute-long tombstone per create that was never answered) — here 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn state_of_10_000_keys_locked_once_is_nothing() {
    let root = test_root();
    let (locks, operator) = shared_with_root(&root);
    let took = crate::suite::lock_fresh_keys(&locks, 10_000).await;
    eprintln!("10,000 keys locked in {took:?}");
    let under = format!("{root}/");
    assert_eq!(operator.count_under(&under).await.unwrap(), 0);
}
