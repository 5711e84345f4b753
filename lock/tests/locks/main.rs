//! The lock contract, checked against real Redis, ZooKeeper, etcd and PostgreSQL servers
//! and against the in-process backend. The shared suite (`suite.rs`) runs on each;
//! `<store>_only.rs` cover what only that server can show (requests counted, data wiped or
//! kept across a restart, sessions ended, the server gone).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(feature = "demo")]
mod demonstration;
mod etcd_only;
mod hazelcast_only;
mod memcached_only;
mod mysql_only;
mod postgres_only;
mod redis_cluster_only;
mod redis_only;
mod redis_sentinel_only;
mod sql_pruning;
mod suite;
mod zookeeper_only;

use std::time::Duration;

use lock::{LockOptions, LockService};

/// A namespace of the test's own, so tests running in parallel never meet.
pub fn test_namespace() -> String {
    format!("test-{:016x}", rand::random::<u64>())
}

/// Options under `namespace`, patient: 5 s an operation, the servers sharing the machine
/// with the whole suite.
pub fn patient_options(namespace: &str) -> LockOptions {
    LockOptions {
        namespace: namespace.to_owned(),
        op_timeout: Some(5 * Duration::from_secs(1)),
        ..LockOptions::default()
    }
}

/// Options with `session` as the lease (or session) of a server of the test's own —
/// patient: such a server starts cold, beside the whole suite.
pub fn patient_session(session: Duration) -> LockOptions {
    LockOptions {
        session,
        op_timeout: Some(5 * Duration::from_secs(1)),
        ..LockOptions::default()
    }
}

/// The URL in the environment's `variable`, else `default`.
pub fn url_from_env(variable: &str, default: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| default.into())
}

/// The shared `what` server (at `variable`, else `default`), under a root of the test's
/// own so tests running in parallel never meet.
pub fn shared_under_own_root(variable: &str, default: &str, what: &str) -> LockService {
    let url = format!(
        "{}/payonce-tests/{:016x}",
        url_from_env(variable, default),
        rand::random::<u64>()
    );
    lock::open(&url, &LockOptions::default())
        .unwrap_or_else(|error| panic!("a valid {what} URL: {error:?}"))
}

/// Two processes' services on the store at `url`, under one `namespace`, patient.
pub fn two_processes(url: &str, namespace: &str) -> [LockService; 2] {
    [
        lock::open(url, &patient_options(namespace)).unwrap(),
        lock::open(url, &patient_options(namespace)).unwrap(),
    ]
}

/// The `holder`'s `lost()` fires `within` (else "lost() did not fire after {after}"),
/// and its successor's grant fenced it off ([`successor_took_over`]).
pub async fn holder_told_and_succeeded(
    holder: lock::LockGuard,
    successor: lock::LockGuard,
    within: Duration,
    after: &str,
) {
    tokio::time::timeout(within, holder.lost())
        .await
        .unwrap_or_else(|error| panic!("lost() did not fire after {after}: {error:?}"));
    successor_took_over(holder, successor).await;
}

/// Two processes on one key of the store at `url`: no two holders at once, no update
/// lost.
pub async fn exclusion_across_two_processes(url: &str) {
    suite::read_modify_write_under(&two_processes(url, &test_namespace()), 16, 10).await;
}

/// The successor's grant fenced the lost `holder` off: a larger token, the holder's
/// release touches nothing, the successor's releases its lock.
pub async fn successor_took_over(mut holder: lock::LockGuard, mut successor: lock::LockGuard) {
    assert!(successor.fencing_token() > holder.fencing_token());
    assert!(!holder.release().await.unwrap());
    assert!(successor.release().await.unwrap());
}

/// A server of the test's own, a service on it, and how the server loses its data
/// (`lose`) and the service goes on: opened again by `connect`, or the same service (as a
/// running process would go on, its client finding the server again) — with `settle`,
/// once it grants again.
pub struct PrivateStore<S> {
    pub server: S,
    pub locks: LockService,
    lose: fn(&mut S),
    connect: Option<fn(&S) -> LockService>,
    settle: bool,
}

impl<S> PrivateStore<S> {
    /// Data loss a `restart` — the server keeps its data (and the source of its tokens)
    /// across one, which is the point: tokens need no catching up — after which `connect`
    /// opens the service again.
    pub fn restarting(server: S, connect: fn(&S) -> LockService, restart: fn(&mut S)) -> Self {
        let locks = connect(&server);
        Self {
            server,
            locks,
            lose: restart,
            connect: Some(connect),
            settle: false,
        }
    }

    /// Data `lose`s for real, `locks` going on across the loss; with `settle`, the loss is
    /// over once it grants again.
    pub fn going_on(server: S, locks: LockService, lose: fn(&mut S), settle: bool) -> Self {
        Self {
            server,
            locks,
            lose,
            connect: None,
            settle,
        }
    }
}

impl<S> std::fmt::Debug for PrivateStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateStore")
            .field("locks", &self.locks)
            .field("settle", &self.settle)
            .finish_non_exhaustive()
    }
}

impl<S> Store for PrivateStore<S> {
    fn service(&self) -> LockService {
        self.locks.clone()
    }

    async fn lose_data(&mut self) -> LockService {
        (self.lose)(&mut self.server);
        if let Some(connect) = self.connect {
            self.locks = connect(&self.server);
        }
        if self.settle {
            zookeeper_only::wait_until_granting(&self.locks).await;
        }
        self.locks.clone()
    }
}

/// The shared Redis (CI starts one on 6379), under a namespace of the test's own so tests
/// running in parallel never meet.
pub fn shared_redis() -> LockService {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    redis_at(&url)
}

pub fn redis_at(url: &str) -> LockService {
    lock::open(
        url,
        &LockOptions {
            namespace: test_namespace(),
            op_timeout: Some(Duration::from_secs(2)),
            ..LockOptions::default()
        },
    )
    .expect("a valid Redis URL")
}

/// The first grant of `key` once its server answers again — while a replica takes over
/// from a killed master, the lock is unavailable or (a lease the master had not lost)
/// held — or `None` if none came `within`. Any other error fails the test.
pub async fn first_grant_within(
    locks: &LockService,
    key: &str,
    within: Duration,
) -> Option<lock::LockGuard> {
    const SECOND: Duration = Duration::from_secs(1);
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        match locks
            .acquire(key, SECOND, tokio::time::Instant::now() + SECOND)
            .await
        {
            Ok(guard) => return Some(guard),
            Err(lock::LockError::Unavailable { .. } | lock::LockError::TimedOut { .. }) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("during the failover: {error}"),
        }
    }
    None
}

/// The first grant after a failover carries a token above every one `replicated` before
/// it; released then, with `held`, the grant the failover may have lost.
pub async fn after_the_failover(
    mut first_after: lock::LockGuard,
    replicated: lock::FencingToken,
    held: lock::LockGuard,
) {
    assert!(
        first_after.fencing_token() > replicated,
        "{:?} after the failover, {replicated:?} replicated before it",
        first_after.fencing_token()
    );
    first_after.release().await.unwrap();
    drop(held);
}

/// Generates one `#[tokio::test]` per shared-suite case for a backend.
macro_rules! shared_suite {
    ($backend:ident, $make:expr, $make_after_data_loss:expr) => {
        mod $backend {
            use super::*;

            shared_suite!(@cases $make;
                mutual_exclusion_under_contention,
                release_by_non_owner_keeps_the_holder,
                release_after_expiry_keeps_the_new_holder,
                release_twice_is_safe,
                vanished_holder_is_succeeded_after_its_ttl,
                hand_off_after_a_long_wait_keeps_a_full_lease,
                dropped_guard_releases_promptly,
                watchdog_keeps_the_lock_past_three_ttls,
                lost_fires_when_the_lock_is_deleted_behind_its_back,
                lost_fires_when_the_lock_is_taken_over,
                fencing_tokens_increase_over_1000_handoffs,
                waiters_acquire_in_arrival_order,
                try_acquire_never_waits_and_never_barges,
                acquire_times_out_at_its_deadline,
                cut_short_acquires_leave_nothing_behind,
                abandoned_wait_does_not_block_the_queue,
                raise_fencing_never_lowers,
                large_fencing_tokens_stay_exact,
                extend_only_by_the_holder,
                holder_note_follows_the_holder,
                rejects_empty_key_and_tiny_ttl,
                a_crowd_beyond_the_cap_is_turned_away_at_once,
                a_flood_on_one_key_leaves_other_keys_fast,
                a_holder_reenters_without_waiting
            );

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn fencing_survives_data_loss_with_catch_up() {
                suite::fencing_survives_data_loss_with_catch_up(($make_after_data_loss)()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn tokens_never_repeat_after_data_loss() {
                suite::tokens_never_repeat_after_data_loss(($make_after_data_loss)()).await;
            }
        }
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                suite::$case(($make)()).await;
            }
        )*
    };
}

shared_suite!(redis, shared_redis, redis_only::PrivateRedis::start);
shared_suite!(
    redis_cluster,
    redis_cluster_only::shared_cluster,
    redis_cluster_only::namespace_lost
);
shared_suite!(in_process, LockService::in_process, InProcessStore::default);
shared_suite!(
    zookeeper,
    zookeeper_only::shared_zookeeper,
    zookeeper_only::PrivateZooKeeper::start
);
shared_suite!(etcd, etcd_only::shared_etcd, etcd_only::PrivateEtcd::start);
shared_suite!(
    hazelcast,
    hazelcast_only::shared_hazelcast,
    hazelcast_only::PrivateCluster::start
);
shared_suite!(
    memcached,
    memcached_only::shared_memcached,
    memcached_only::PrivateMemcached::start
);
shared_suite!(
    mysql_table,
    mysql_only::shared_mysql_table,
    mysql_only::table_rows_lost
);
shared_suite!(
    mysql_row,
    mysql_only::shared_mysql_row,
    mysql_only::row_counters_lost
);
shared_suite!(
    postgres,
    postgres_only::shared_postgres,
    postgres_only::counters_lost
);

/// A lock store whose data can be lost, as a restart without persistence loses it.
#[allow(async_fn_in_trait)]
pub trait Store {
    fn service(&self) -> LockService;
    /// Loses every lock and counter; returns the service to use afterwards.
    async fn lose_data(&mut self) -> LockService;
}

/// A shared store whose data under a namespace of the test's own is lost: `lose` deletes
/// it, given the namespace — as a database restored from a backup taken before it was
/// written, or a failover to a replica that had not replicated it, would lose it. The same
/// service goes on across the loss.
pub struct NamespaceLost {
    namespace: String,
    locks: LockService,
    lose: fn(String) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl std::fmt::Debug for NamespaceLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceLost")
            .field("namespace", &self.namespace)
            .field("locks", &self.locks)
            .finish_non_exhaustive()
    }
}

impl NamespaceLost {
    /// A service opened by `open` under a fresh namespace, whose data `lose` deletes.
    pub fn new(
        open: impl FnOnce(&str) -> LockService,
        lose: fn(String) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    ) -> Self {
        let namespace = test_namespace();
        let locks = open(&namespace);
        Self {
            namespace,
            locks,
            lose,
        }
    }
}

impl NamespaceLost {
    /// A patient service on the store at `url` under a fresh namespace, whose data `lose`
    /// deletes.
    pub fn patient_at(
        url: &str,
        lose: fn(String) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    ) -> Self {
        Self::new(
            |namespace| lock::open(url, &patient_options(namespace)).unwrap(),
            lose,
        )
    }
}

impl Store for NamespaceLost {
    fn service(&self) -> LockService {
        self.locks.clone()
    }

    async fn lose_data(&mut self) -> LockService {
        (self.lose)(self.namespace.clone()).await;
        self.locks.clone()
    }
}

/// The in-process store loses its data the only way it can: the process restarts.
#[derive(Debug)]
pub struct InProcessStore(LockService);

impl Default for InProcessStore {
    fn default() -> Self {
        Self(LockService::in_process())
    }
}

impl Store for InProcessStore {
    fn service(&self) -> LockService {
        self.0.clone()
    }

    async fn lose_data(&mut self) -> LockService {
        self.0 = LockService::in_process();
        self.0.clone()
    }
}

/// Chubby's lock-delay in process: a holder that vanished keeps its key for its lease and
/// the delay; a released lock is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_process_lock_delay_keeps_a_vanished_holders_key() {
    let locks =
        LockService::new(lock::InProcessBackend::new().with_lock_delay(Duration::from_millis(700)));
    suite::lock_delay_keeps_an_abandoned_holders_key(&locks, Duration::from_millis(700)).await;
}

/// In process, pruning forgets a key nobody has held or waited for in the idle time —
/// fencing stays whole — and keeps the key that is held and waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_process_pruned_key_keeps_fencing() {
    let backend = std::sync::Arc::new(lock::InProcessBackend::new());
    let locks = LockService::from_arc(backend.clone());
    let idle = Duration::from_millis(200);
    suite::forgotten_key_keeps_fencing(&locks, |_| async {
        assert_eq!(
            locks.prune_idle(idle).await.unwrap(),
            0,
            "pruned a key used less than the idle time ago"
        );
        tokio::time::sleep(idle).await;
        assert_eq!(locks.prune_idle(idle).await.unwrap(), 1);
        assert_eq!(backend.key_count(), 1, "the busy key is kept");
    })
    .await;
}

/// 10,000 keys locked once each leave 10,000 entries in the in-process table; a pruning
/// pass the idle time later forgets them all. Bound: the table holds the keys held or
/// waited for, plus those used within the idle time before the last pass — here 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_process_state_of_10_000_keys_locked_once_is_pruned() {
    let backend = std::sync::Arc::new(lock::InProcessBackend::new());
    let locks = LockService::from_arc(backend.clone());
    let took = suite::lock_fresh_keys(&locks, 10_000).await;
    assert_eq!(backend.key_count(), 10_000);
    let idle = Duration::from_millis(100);
    tokio::time::sleep(idle).await;
    assert_eq!(locks.prune_idle(idle).await.unwrap(), 10_000);
    assert_eq!(backend.key_count(), 0);
    eprintln!("10,000 keys locked in {took:?}");
}

/// `lock::open` refuses a URL whose scheme names no lock store, at once and without
/// connecting; `lock::in_process` keeps the options' cap on waiters per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn open_refuses_an_unknown_scheme_and_in_process_keeps_the_cap() {
    for url in [
        "http://127.0.0.1:6379",
        "127.0.0.1:6379",
        "zookeeper://127.0.0.1:2181",
    ] {
        assert!(
            matches!(
                lock::open(url, &LockOptions::default()),
                Err(lock::LockError::Invalid(_))
            ),
            "{url} was taken for a lock store"
        );
    }
    let locks = lock::in_process(&LockOptions {
        max_waiters: 1,
        ..LockOptions::default()
    });
    let mut holder = locks
        .try_acquire("k", 10 * Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    let waiter = suite::spawn_acquire(&locks, "k", Duration::from_secs(1), Duration::from_secs(5));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let crowded = locks
        .acquire(
            "k",
            Duration::from_secs(1),
            tokio::time::Instant::now() + Duration::from_secs(5),
        )
        .await;
    assert!(matches!(
        crowded,
        Err(lock::LockError::QueueFull { max_waiters: 1, .. })
    ));
    assert!(holder.release().await.unwrap());
    waiter.await.unwrap().unwrap().release().await.unwrap();
}
