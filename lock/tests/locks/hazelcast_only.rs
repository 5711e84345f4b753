//! What only Hazelcast's CP Subsystem can show: a session the group ended behind a
//! cut-off holder, a vanished process succeeded after its session's time to live (and the
//! lock-delay after it), a process that shuts down freeing its locks at once, one member
//! of three killed and started again, a cluster nobody answers for, and the requests a
//! hand-off costs. Private clusters for the faults; the shared one (5701-5703) is never
//! stopped.

use std::sync::Arc;
use std::time::Duration;

use lock::testing::{HazelcastCluster, Proxy};
use lock::{HazelcastBackend, LockError, LockOptions, LockService, Sessions};
use tokio::time::{Instant, timeout};

const SECOND: Duration = Duration::from_secs(1);

/// The shared cluster (`HAZELCAST_URL`, else the three members `scripts/services.sh`
/// starts on 5701-5703), under a namespace of the test's own.
pub fn shared_hazelcast() -> LockService {
    LockService::from_arc(open(&shared_url(), &own_namespace()))
}

fn shared_url() -> String {
    std::env::var("HAZELCAST_URL")
        .unwrap_or_else(|_| "hazelcast://127.0.0.1:5701,127.0.0.1:5702,127.0.0.1:5703".to_owned())
}

/// Options with a namespace of the test's own, and patient: the members share two cores
/// with the whole suite.
fn own_namespace() -> LockOptions {
    crate::patient_options(&crate::test_namespace())
}

fn open(url: &str, options: &LockOptions) -> Arc<HazelcastBackend> {
    Arc::new(HazelcastBackend::open(url, options).expect("a valid Hazelcast URL"))
}

/// A cluster of the test's own. Its data loss is real: every member killed and started
/// again, and Community Edition keeps no CP state across that. The same service goes on
/// (its client finds a new cluster and starts over).
pub type PrivateCluster = crate::PrivateStore<HazelcastCluster>;

impl PrivateCluster {
    pub fn start() -> Self {
        let cluster = HazelcastCluster::start(4 * SECOND).expect("a Hazelcast cluster starts");
        let locks = LockService::from_arc(open(&cluster.url(), &own_namespace()));
        crate::PrivateStore::going_on(
            cluster,
            locks,
            |cluster| cluster.wipe().expect("the cluster starts again"),
            true,
        )
    }
}

/// How long the group keeps a session of `locks` past its last heartbeat.
fn session_ttl(locks: &LockService) -> Duration {
    match locks.backend().sessions() {
        Sessions::PerProcess { timeout } => timeout,
        other => panic!("a Hazelcast lease is its process's session, not {other:?}"),
    }
}

/// Takes `key` in a process of its own that then vanishes: its runtime is dropped, its
/// connection closed without a goodbye, its CP session left to run out. Returns how long
/// the group still counts the session (its time to live).
async fn vanish_holding(url: String, options: LockOptions, key: String) -> Duration {
    tokio::task::spawn_blocking(move || {
        let process = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ttl = process.block_on(async {
            let locks = LockService::from_arc(open(&url, &options));
            let guard = locks.try_acquire(&key, SECOND).await.unwrap().unwrap();
            let ttl = session_ttl(&locks);
            // Neither the grant nor the session is let go: a process that died.
            std::mem::forget(guard);
            std::mem::forget(locks);
            ttl
        });
        process.shutdown_background();
        ttl
    })
    .await
    .unwrap()
}

/// A holder whose process vanishes keeps the lock until its CP session's time to live
/// (the members' `session-time-to-live-seconds`: 10 s on the shared cluster) runs out;
/// then the group frees it and its successor, waiting meanwhile, gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vanished_process_is_succeeded_after_its_session_ttl() {
    let options = own_namespace();
    let successor_locks = LockService::from_arc(open(&shared_url(), &options));
    let ttl = vanish_holding(shared_url(), options, "k".to_owned()).await;
    let vanished_at = Instant::now();
    let mut successor = successor_locks
        .acquire("k", SECOND, Instant::now() + ttl * 3)
        .await
        .unwrap();
    let waited = vanished_at.elapsed();
    assert!(
        waited >= ttl.mul_f64(0.9),
        "taken after {waited:?}, before the session's {ttl:?} could run out"
    );
    assert!(waited < ttl * 2, "took {waited:?}");
    successor.release().await.unwrap();
}

/// Chubby's lock-delay on Hazelcast: a holder that vanished leaves its record uncleared,
/// and its successor holds the lock but waits the delay before using it; a released lock
/// goes on at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_delay_holds_a_vanished_holders_key() {
    let delay = Duration::from_millis(700);
    let options = LockOptions {
        lock_delay: delay,
        ..own_namespace()
    };
    let others = LockService::from_arc(open(&shared_url(), &options));
    crate::suite::lock_delay_keeps_a_vanished_holders_key(&others, &others, delay, |key| {
        vanish_holding(shared_url(), options.clone(), key)
    })
    .await;
}

/// A process that goes cleanly — its backend dropped — closes its CP session, which frees
/// its locks at once instead of a session's time to live later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backend_dropped_closes_its_session_and_frees_its_locks() {
    use lock::{Ask, LockBackend};
    let options = own_namespace();
    let leaving = open(&shared_url(), &options);
    let staying = LockService::from_arc(open(&shared_url(), &options));
    // A grant without a guard: nothing but the session's close can free it.
    let _lease = leaving
        .acquire(Ask::new("k", SECOND, None, ""))
        .await
        .unwrap()
        .unwrap();
    let ttl = session_ttl(&LockService::from_arc(leaving.clone()));
    assert!(staying.try_acquire("k", SECOND).await.unwrap().is_none());
    drop(leaving);
    let dropped_at = Instant::now();
    let mut next = staying
        .acquire("k", SECOND, Instant::now() + ttl * 2)
        .await
        .unwrap();
    assert!(
        dropped_at.elapsed() < ttl / 2,
        "freed only after {:?}, as by the session's time to live",
        dropped_at.elapsed()
    );
    next.release().await.unwrap();
}

/// A holder cut off from the cluster past its session's time to live: the group ends the
/// session and frees its lock, a waiter of another process gets it with a larger token,
/// the holder's `lost()` fires, and its release touches nothing once the network heals.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_fires_when_the_group_ends_a_cut_off_holders_session() {
    let cluster = HazelcastCluster::start(3 * SECOND).unwrap();
    let network = Proxy::start(cluster.port(0)).await.unwrap();
    let options = own_namespace();
    let holder_locks = LockService::from_arc(open(&cluster.url_of(&[network.port()]), &options));
    let other = LockService::from_arc(open(&cluster.url(), &options));
    let mut holder = holder_locks
        .try_acquire("k", SECOND)
        .await
        .unwrap()
        .unwrap();
    let ttl = session_ttl(&holder_locks);
    assert_eq!(
        ttl,
        cluster.session_ttl(),
        "the group's time to live, granted"
    );
    let waiter = crate::suite::waiter_behind_the_holder(&other, Duration::from_millis(300)).await;

    network.cut();
    let cut_at = Instant::now();
    let mut successor = waiter.await.unwrap().unwrap();
    // Not before the session could run out: until then it, and its lock, live.
    assert!(
        cut_at.elapsed() >= ttl.mul_f64(0.6),
        "taken {:?} after the cut",
        cut_at.elapsed()
    );
    timeout(10 * SECOND, holder.lost())
        .await
        .expect("lost() did not fire after the session ended");
    network.heal();
    assert!(successor.fencing_token() > holder.fencing_token());
    assert!(!holder.release().await.unwrap());
    assert!(
        other.try_acquire("k", SECOND).await.unwrap().is_none(),
        "the healed holder's release freed its successor's lock"
    );
    assert!(successor.release().await.unwrap());
}

/// One member of three killed: the CP group goes on with the other two (a majority), so
/// locks are granted again — with larger tokens — once a new Raft leader is elected if
/// the dead one led; the member started again joins the cluster as a new member, and
/// locks go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_member_of_three_killed_and_started_again_the_locks_go_on() {
    let mut cluster = HazelcastCluster::start(4 * SECOND).unwrap();
    let locks = LockService::from_arc(open(&cluster.url(), &own_namespace()));
    let mut last = {
        let mut guard = locks.try_acquire("k", SECOND).await.unwrap().unwrap();
        let token = guard.fencing_token();
        guard.release().await.unwrap();
        token
    };
    for fault in ["killed", "started again"] {
        if fault == "killed" {
            cluster.kill(0);
        } else {
            cluster.restart(0).unwrap();
        }
        let mut guard = crate::first_grant_within(&locks, "k", 60 * SECOND)
            .await
            .unwrap_or_else(|| panic!("no grant within a minute of a member {fault}"));
        assert!(guard.fencing_token() > last, "{fault}: token went back");
        last = guard.fencing_token();
        guard.release().await.unwrap();
    }
}

/// A cluster nobody answers for: every call is `Unavailable` within the op timeout, and
/// the next one fails fast rather than queueing behind connects that cannot succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_cluster_is_unavailable_at_once() {
    let nowhere = format!(
        "hazelcast://127.0.0.1:{},127.0.0.1:{}",
        lock::testing::free_port().unwrap(),
        lock::testing::free_port().unwrap()
    );
    let locks = LockService::from_arc(open(
        &nowhere,
        &LockOptions {
            op_timeout: Some(SECOND),
            ..LockOptions::default()
        },
    ));
    for _ in 0..3 {
        let started = Instant::now();
        let acquired = locks
            .acquire("k", SECOND, Instant::now() + 10 * SECOND)
            .await;
        assert!(
            matches!(acquired, Err(LockError::Unavailable { .. })),
            "{acquired:?}"
        );
        assert!(started.elapsed() < 3 * SECOND, "{:?}", started.elapsed());
    }
    assert!(matches!(
        locks.backend().ping().await,
        Err(LockError::Unavailable { .. })
    ));
}

/// A hot key with 32 waiters queued on the group: each hand-off costs a constant number of
/// requests — the holder's unlock, the waiter's answer to its one `tryLock` (already
/// sent), its read of the epoch — however long the queue; nobody polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hand_off_costs_constant_requests() {
    let counted = open(&shared_url(), &own_namespace());
    let locks = LockService::from_arc(counted.clone());
    let (per_hand_off, took) =
        crate::suite::requests_per_hand_off(&locks, || counted.requests(), 32).await;
    // The session's heartbeats (one a second) went out meanwhile too.
    let per_hand_off = per_hand_off - (took.as_secs() + 1) as f64 / 32.0;
    assert!(
        per_hand_off <= 2.1,
        "{per_hand_off:.2} requests per hand-off"
    );
}
