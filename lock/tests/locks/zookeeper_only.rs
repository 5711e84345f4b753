//! What only a ZooKeeper server can show: tokens across a server restart and a wipe, a
//! session ended from outside, a vanished process's session timing out, a release the
//! server never answered, the cap on waiters across processes, and the requests a hand-off
//! costs. Private servers on other ports; the shared one (127.0.0.1:2181) is never
//! stopped.

use std::sync::Arc;
use std::time::Duration;

use lock::testing::{Proxy, ZooKeeperServer};
use lock::{FencingToken, LockOptions, LockService, ZooKeeperBackend};
use tokio::time::{Instant, sleep};

const SECOND: Duration = Duration::from_secs(1);

/// The shared ZooKeeper (`ZOOKEEPER_URL`, else 127.0.0.1:2181), under a root of the test's
/// own so tests running in parallel never meet.
pub fn shared_zookeeper() -> LockService {
    crate::shared_under_own_root("ZOOKEEPER_URL", "zk://127.0.0.1:2181", "ZooKeeper")
}

fn backend(server: &ZooKeeperServer, session_timeout: Duration) -> Arc<ZooKeeperBackend> {
    with_options(server, crate::patient_session(session_timeout))
}

fn with_options(server: &ZooKeeperServer, options: LockOptions) -> Arc<ZooKeeperBackend> {
    Arc::new(ZooKeeperBackend::open(&server.url("/t"), &options).unwrap())
}

/// A ZooKeeper of the test's own. Its "data loss" is a restart: ZooKeeper keeps its data
/// (and its zxids) across one. After it, a new client: the old session ended with the
/// server's restart, or will.
pub type PrivateZooKeeper = crate::PrivateStore<ZooKeeperServer>;

impl PrivateZooKeeper {
    pub fn start() -> Self {
        crate::PrivateStore::restarting(
            ZooKeeperServer::start().expect("a ZooKeeper server starts"),
            |server| LockService::from_arc(backend(server, 4 * SECOND)),
            |server| server.restart().expect("ZooKeeper restarts"),
        )
    }
}

/// Fencing tokens (zxids) strictly increase across a restart of the server, with no
/// `raise_fencing`: ZooKeeper keeps them with its data. (`raise_fencing` here lifts a
/// per-key base added to the zxid, kept in ZooKeeper too — for a protected store that has
/// seen higher tokens, from another lock service.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_increase_across_a_server_restart() {
    crate::suite::tokens_increase_across_a_server_restart(PrivateZooKeeper::start()).await;
}

/// The session ended from outside — the holder cut off from the server past its session
/// timeout, so the server expires the session — deletes the lock node: a waiter of
/// another process gets the lock with a larger token, the holder's `lost()` fires, and
/// its release touches nothing. (The holder's process itself keeps running and trying.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_fires_when_the_session_is_ended_from_outside() {
    let server = ZooKeeperServer::start().unwrap();
    let network = Proxy::start(server.port()).await.unwrap();
    let session_timeout = 4 * SECOND;
    let holder_backend = Arc::new(
        ZooKeeperBackend::open(
            &format!("zk://127.0.0.1:{}/t", &network.port()),
            &LockOptions {
                session: session_timeout,
                op_timeout: Some(5 * SECOND),
                ..LockOptions::default()
            },
        )
        .unwrap(),
    );
    let holder_locks = LockService::from_arc(holder_backend);
    let other = LockService::from_arc(backend(&server, session_timeout));
    let holder = holder_locks
        .try_acquire("k", SECOND)
        .await
        .unwrap()
        .unwrap();
    let waiter = crate::suite::waiter_behind_the_holder(&other, Duration::from_millis(200)).await;

    network.cut();
    let cut_at = Instant::now();
    let successor = waiter.await.unwrap().unwrap();
    // Not before the session timed out: until then the session, and the node, live.
    assert!(
        cut_at.elapsed() >= session_timeout.mul_f64(0.9),
        "{:?}",
        cut_at.elapsed()
    );
    network.heal();
    crate::holder_told_and_succeeded(holder, successor, 10 * SECOND, "the session ended").await;
}

/// A holder whose process vanishes — its connection gone without a goodbye — keeps the
/// lock until its session times out, then its successor gets it: the session timeout is
/// the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vanished_process_is_succeeded_after_its_session_timeout() {
    let server = ZooKeeperServer::start().unwrap();
    let successors = LockService::from_arc(backend(&server, 4 * SECOND));
    crate::suite::a_vanished_process_is_succeeded_after_its_session(
        server.url("/t"),
        2 * SECOND,
        &successors,
        "the session could time out",
    )
    .await;
}

/// A hot key with 32 waiters: each hand-off costs a constant number of requests (the
/// release, the next waiter's look at the queue, its watch on its own node) and wakes
/// exactly one waiter — had a release woken the whole queue, each waiter would have
/// looked at the queue again, some 30 requests per hand-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hand_off_costs_constant_requests_and_wakes_one_waiter() {
    let server = ZooKeeperServer::start().unwrap();
    let counted = backend(&server, 4 * SECOND);
    let locks = LockService::from_arc(counted.clone());
    // Queued first: 32 × (create, look, watch the predecessor); then counted.
    crate::suite::a_hand_off_costs_at_most(&locks, || counted.requests(), 3.5).await;
}

/// Chubby's lock-delay on ZooKeeper: a holder whose process vanished (its connection gone,
/// its session left to time out) leaves a marker, and its successor holds the lock but
/// waits the delay before using it; a released lock goes on at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_delay_holds_a_vanished_holders_key() {
    let server = ZooKeeperServer::start().unwrap();
    let delay = Duration::from_millis(700);
    let session_timeout = SECOND;
    let delayed = move |url: &str, session_timeout: Duration| {
        LockService::from_arc(Arc::new(
            ZooKeeperBackend::open(
                url,
                &LockOptions {
                    session: session_timeout,
                    op_timeout: Some(5 * SECOND),
                    lock_delay: delay,
                    ..LockOptions::default()
                },
            )
            .unwrap(),
        ))
    };
    let url = server.url("/t");
    let others = delayed(&url, 4 * SECOND);
    crate::suite::lock_delay_keeps_a_vanished_holders_key(&others, &others, delay, |key| {
        let url = url.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                // A process of its own: dropping its runtime closes its connection
                // without closing its session, which times out on the server.
                let process = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                process.block_on(async {
                    let locks = delayed(&url, session_timeout);
                    let guard = locks.try_acquire(&key, SECOND).await.unwrap().unwrap();
                    std::mem::forget(guard);
                });
                process.shutdown_background();
            })
            .await
            .unwrap();
            session_timeout
        }
    })
    .await;
}

impl crate::suite::Restart for ZooKeeperServer {
    fn stop(&mut self) {
        ZooKeeperServer::stop(self);
    }

    fn restart(&mut self) -> std::io::Result<()> {
        ZooKeeperServer::restart(self)
    }
}

/// A ZooKeeper of the test's own whose data loss is real: its data directory deleted, every
/// node and zxid with it. The same service goes on across the wipe, as a running process
/// would (its session is gone; the parents it remembers are too).
pub fn wiped(started: PrivateZooKeeper) -> crate::PrivateStore<ZooKeeperServer> {
    crate::PrivateStore::going_on(
        started.server,
        started.locks,
        |server| server.wipe().expect("ZooKeeper restarts empty"),
        true,
    )
}

/// Retries a lock on a key of its own until the service grants it: the first calls after
/// a store came back may meet a session or lease that ended with it.
pub async fn wait_until_granting(locks: &LockService) {
    let started = Instant::now();
    loop {
        match locks.try_acquire("warm-up", SECOND).await {
            Ok(Some(mut guard)) => {
                guard.release().await.unwrap();
                return;
            }
            Ok(None) => panic!("nobody else holds the warm-up lock"),
            Err(error) => {
                assert!(
                    started.elapsed() < 30 * SECOND,
                    "not granting after 30 s: {error}"
                );
                sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// After a wipe the zxids start over, below tokens already handed out — a protected store
/// refuses those grants until `raise_fencing` lifts the key's base above the highest token
/// it accepted; then the next grant is above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencing_catches_up_after_a_wipe() {
    crate::suite::fencing_survives_data_loss_with_catch_up(wiped(PrivateZooKeeper::start())).await;
}

/// A release the server never answered (it was down) is not forgotten: the session's
/// cleaner deletes the node once the server is back, so another process gets the lock
/// then — not when the holder's session ends, which for a live process is never.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_the_server_missed_is_retried() {
    let mut server = ZooKeeperServer::start().unwrap();
    let holders = LockService::from_arc(with_options(
        &server,
        crate::suite::impatient_with_a_long_session(),
    ));
    let others = LockService::from_arc(backend(&server, 4 * SECOND));
    crate::suite::a_release_the_server_missed_is_retried(&mut server, &holders, &others).await;
}

/// The cap on waiters is kept in ZooKeeper's queue, so it holds across processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_waiter_cap_holds_across_processes() {
    let server = ZooKeeperServer::start().unwrap();
    let capped = || LockService::from_arc(with_options(&server, crate::suite::capped_at_8()));
    crate::suite::the_waiter_cap_holds_across([capped(), capped()]).await;
}

/// The shared ZooKeeper under a root of the test's own, and a plain client of it for
/// looking at the tree.
async fn shared_with_root(root: &str) -> (LockService, zookeeper_client::Client) {
    let base = std::env::var("ZOOKEEPER_URL").unwrap_or_else(|_| "zk://127.0.0.1:2181".into());
    let locks = lock::open(&format!("{base}{root}"), &LockOptions::default())
        .expect("a valid ZooKeeper URL");
    let hosts = base.trim_start_matches("zk://").to_owned();
    let client = zookeeper_client::Client::connect(&hosts).await.unwrap();
    (locks, client)
}

fn test_root() -> String {
    format!("/payonce-tests/{:016x}", rand::random::<u64>())
}

/// Pruning deletes a key's parent node once it stayed empty for the idle time between
/// two passes — the key locked again gets a larger token, a lease from before can
/// neither extend nor release the new lock — and keeps the parents of a key held and
/// waited for, and of a key whose fencing base was raised.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pruning_deletes_idle_parents_and_fencing_stays_whole() {
    let root = test_root();
    let (locks, client) = shared_with_root(&root).await;
    let mut raised = locks.try_acquire("raised", SECOND).await.unwrap().unwrap();
    raised.release().await.unwrap();
    locks
        .raise_fencing("raised", FencingToken::new(1 << 40))
        .await
        .unwrap();
    let idle = Duration::from_millis(300);
    let (service, client, root) = (&locks, &client, &root);
    crate::suite::forgotten_key_keeps_fencing(&locks, move |key| async move {
        let (locks, parent) = (service, format!("{root}/locks/{key}"));
        assert!(client.check_stat(&parent).await.unwrap().is_some());
        assert_eq!(
            locks.prune_idle(idle).await.unwrap(),
            0,
            "the first pass only takes note"
        );
        sleep(idle).await;
        assert_eq!(locks.prune_idle(idle).await.unwrap(), 1);
        assert!(client.check_stat(&parent).await.unwrap().is_none());
        let kept = client
            .list_children(&format!("{root}/locks"))
            .await
            .unwrap();
        assert_eq!(
            kept.len(),
            2,
            "the busy and the raised key are kept: {kept:?}"
        );
    })
    .await;
    let mut again = locks.try_acquire("raised", SECOND).await.unwrap().unwrap();
    assert!(again.fencing_token() > FencingToken::new(1 << 40));
    again.release().await.unwrap();
}

/// 10,000 keys locked once each leave one parent node each (10,000 znodes under the
/// test's root); two pruning passes the idle time apart delete them all. Bound: the
/// znodes under the root are at most the keys used within the last two reaping passes,
/// plus `<root>/locks` itself — here 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn state_of_10_000_keys_locked_once_is_pruned() {
    let root = test_root();
    let (locks, client) = shared_with_root(&root).await;
    let took = crate::suite::lock_fresh_keys(&locks, 10_000).await;
    let before = client.count_descendants_number(&root).await.unwrap();
    assert_eq!(before, 10_001, "a parent per key, under <root>/locks");
    let idle = Duration::from_millis(100);
    let pruning = Instant::now();
    locks.prune_idle(idle).await.unwrap();
    sleep(idle).await;
    let pruned = locks.prune_idle(idle).await.unwrap();
    let pruning = pruning.elapsed();
    let after = client.count_descendants_number(&root).await.unwrap();
    eprintln!("10,000 keys locked in {took:?}, pruned in {pruning:?}");
    assert_eq!((pruned, after), (10_000, 1));
}
