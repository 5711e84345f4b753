//! What only a Redis server can show: commands counted on the server, data wiped, keys
//! changed behind the holder's back, and the server gone.

use std::sync::Arc;
use std::time::Duration;

use lock::testing::{RedisServer, free_port};
use lock::{LockError, LockOptions, LockService, RedisBackend};
use redis::AsyncCommands;
use tokio::time::{Instant, sleep, timeout};

use crate::{Store, redis_at};

const SECOND: Duration = Duration::from_secs(1);

/// A Redis of the test's own.
pub struct PrivateRedis {
    pub server: RedisServer,
    pub locks: LockService,
    /// The same backend as `locks`, for its client-side round-trip counter.
    pub backend: Arc<RedisBackend>,
}

impl PrivateRedis {
    pub fn start() -> Self {
        let server = RedisServer::start().expect("redis-server starts");
        let backend = Arc::new(instance(&server));
        let locks = LockService::from_arc(backend.clone());
        Self {
            server,
            locks,
            backend,
        }
    }

    pub async fn raw(&self) -> redis::aio::MultiplexedConnection {
        raw_at(&self.server.url()).await
    }

    /// Commands clients sent since the last `CONFIG RESETSTAT`, from INFO commandstats:
    /// script calls, script loads, SUBSCRIBE, PING. Redis also counts the commands a script
    /// runs inside itself; those are not round trips and are left out (as are the test's
    /// own INFO and CONFIG calls).
    pub async fn commands_since_reset(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.raw().await)
            .await
            .unwrap();
        info.lines()
            .filter_map(|line| line.strip_prefix("cmdstat_"))
            .filter_map(|line| {
                let (command, stats) = line.split_once(':')?;
                let client_sent = matches!(command, "evalsha" | "eval" | "subscribe" | "ping")
                    || command.starts_with("script|");
                let calls = stats.split_once("calls=")?.1.split(',').next()?;
                client_sent.then(|| calls.parse::<u64>().ok()).flatten()
            })
            .sum()
    }

    pub async fn reset_stats(&self) {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut self.raw().await)
            .await
            .unwrap();
    }
}

/// A connection of the test's own to the Redis at `url`, to look and to act from outside.
async fn raw_at(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A private server's client options: namespace `t`, 2 s an operation.
fn under_t() -> LockOptions {
    LockOptions {
        namespace: "t".into(),
        op_timeout: Some(Duration::from_secs(2)),
        ..LockOptions::default()
    }
}

/// One more client of `server`, as another payonce instance would be: its own connection
/// and its own wake-up channel.
fn instance(server: &RedisServer) -> RedisBackend {
    RedisBackend::open(&server.url(), &under_t()).unwrap()
}

impl Store for PrivateRedis {
    fn service(&self) -> LockService {
        self.locks.clone()
    }

    async fn lose_data(&mut self) -> LockService {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut self.raw().await)
            .await
            .unwrap();
        self.locks.clone()
    }
}

/// A raw DEL of the lock key fires `lost()` within one renewal period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_the_key_is_deleted_in_redis() {
    let redis = PrivateRedis::start();
    let ttl = Duration::from_millis(600);
    let guard = redis.locks.try_acquire("k", ttl).await.unwrap().unwrap();
    let _: () = redis.raw().await.del("t:lock:{k}").await.unwrap();
    timeout(ttl / 3 + Duration::from_millis(100), guard.lost())
        .await
        .expect("lost() did not fire within one renewal period");
}

/// A raw SET over the lock key (another writer) fires `lost()`, and the holder's release
/// leaves the other value in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_the_key_is_overwritten_in_redis() {
    let redis = PrivateRedis::start();
    let ttl = Duration::from_millis(600);
    let mut guard = redis.locks.try_acquire("k", ttl).await.unwrap().unwrap();
    let mut raw = redis.raw().await;
    let _: () = raw.set("t:lock:{k}", "someone-else").await.unwrap();
    timeout(ttl / 3 + Duration::from_millis(100), guard.lost())
        .await
        .expect("lost() did not fire within one renewal period");
    assert!(!guard.release().await.unwrap());
    let value: String = raw.get("t:lock:{k}").await.unwrap();
    assert_eq!(value, "someone-else");
}

/// 16 waiters queued behind a holder for 2 s cost Redis a small constant number of
/// commands each, not a number that grows with the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_does_not_spin() {
    let redis = PrivateRedis::start();
    redis.locks.ping().await.unwrap();
    redis.reset_stats().await;
    let sent_before = redis.backend.round_trips();
    let mut holder = redis
        .locks
        .try_acquire("k", 10 * SECOND)
        .await
        .unwrap()
        .unwrap();
    let waiters: Vec<_> = (0..16)
        .map(|_| {
            let locks = redis.locks.clone();
            tokio::spawn(async move {
                let mut guard = locks
                    .acquire("k", 10 * SECOND, Instant::now() + 20 * SECOND)
                    .await
                    .unwrap();
                guard.release().await.unwrap();
            })
        })
        .collect();
    sleep(2 * SECOND).await;
    let during_wait = redis.commands_since_reset().await;
    // Per waiter: one acquire script; plus the holder's acquire, one SUBSCRIBE, and the
    // first-use SCRIPT LOAD / EVAL fallbacks.
    assert!(
        during_wait <= 16 + 10,
        "{during_wait} commands while 16 waiters waited 2 s"
    );
    // The server's count leaves out commands a script runs; the client's count of what it
    // sent (GET, PTTL, … included) must be as small.
    let sent = redis.backend.round_trips() - sent_before;
    assert!(
        sent <= 16 + 4,
        "the client sent {sent} commands while 16 waiters waited 2 s"
    );

    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let total = redis.commands_since_reset().await;
    // Each hand-off: the holder's release (which grants the next waiter), nothing else.
    assert!(
        total <= during_wait + 17 + 4,
        "{total} commands for 17 hand-offs"
    );
}

/// A hot key's hand-offs cost a small constant number of commands each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hand_offs_cost_a_constant_number_of_commands() {
    let redis = PrivateRedis::start();
    redis.locks.ping().await.unwrap();
    redis.reset_stats().await;
    const TASKS: u64 = 8;
    const ROUNDS: u64 = 50;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let locks = redis.locks.clone();
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let mut guard = locks
                        .acquire("hot", 10 * SECOND, Instant::now() + 30 * SECOND)
                        .await
                        .unwrap();
                    sleep(Duration::from_millis(1)).await;
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let commands = redis.commands_since_reset().await;
    let per_handoff = commands as f64 / (TASKS * ROUNDS) as f64;
    assert!(
        per_handoff <= 2.2,
        "{per_handoff:.2} commands per acquire+release"
    );
}

/// An acquire of `k` with a deadline 800 ms away fails `Unavailable`, within 900 ms.
async fn unavailable_by_the_deadline(locks: &LockService) {
    let started = Instant::now();
    let result = locks
        .acquire("k", SECOND, started + Duration::from_millis(800))
        .await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(took < Duration::from_millis(900), "took {took:?}");
}

/// With Redis unreachable, acquire fails with `Unavailable` within its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_is_unavailable_within_the_deadline() {
    let url = format!("redis://127.0.0.1:{}", free_port().unwrap());
    let locks = redis_at(&url);
    unavailable_by_the_deadline(&locks).await;

    let started = Instant::now();
    let result = locks.try_acquire("k", SECOND).await;
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(locks.ping().await.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

/// A Redis that does not answer at all (accepts the connection, never replies) is just as
/// unavailable: no hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_redis_is_unavailable_within_the_deadline() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    let _accepting = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let locks = redis_at(&url);
    unavailable_by_the_deadline(&locks).await;
}

/// A Redis that stops answering once the service is connected and subscribed (frozen
/// with SIGSTOP, connections open): acquire answers `Unavailable` by its deadline — not
/// late, and not `TimedOut`, which would read as "the lock is busy".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_is_unavailable_within_the_deadline() {
    let redis = PrivateRedis::start();
    let mut warm = redis
        .locks
        .acquire("k", SECOND, Instant::now() + 5 * SECOND)
        .await
        .unwrap();
    assert!(warm.release().await.unwrap());
    redis.server.pause().unwrap();

    unavailable_by_the_deadline(&redis.locks).await;

    // try_acquire has no deadline of its own: the op timeout (2 s here) bounds it.
    let started = Instant::now();
    let result = redis.locks.try_acquire("k", SECOND).await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(took < Duration::from_millis(2_500), "took {took:?}");
    redis.server.resume().unwrap();
}

/// Three services on one Redis, as three payonce instances are (each its own connection
/// and wake-up channel): no two hold the lock at once, and waiters spread across them are
/// served in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exclusion_and_arrival_order_hold_across_instances() {
    let redis = PrivateRedis::start();
    let instances: Vec<LockService> = (0..3)
        .map(|_| LockService::new(instance(&redis.server)))
        .collect();

    crate::suite::served_in_arrival_order(&instances, 9).await;
    crate::suite::read_modify_write_under(&instances, 24, 10).await;
}

/// After Redis restarts (empty), the same service reconnects, and the holder of a lock
/// that was forgotten learns it lost it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_a_restart_and_reports_the_lost_lock() {
    let mut redis = PrivateRedis::start();
    let ttl = Duration::from_millis(600);
    let guard = redis.locks.try_acquire("k", ttl).await.unwrap().unwrap();
    redis.server.restart().unwrap();
    timeout(ttl + SECOND, guard.lost())
        .await
        .expect("lost() fired");
    let deadline = Instant::now() + 5 * SECOND;
    let mut next = loop {
        match redis.locks.acquire("k", ttl, deadline).await {
            Ok(guard) => break guard,
            Err(LockError::Unavailable { .. }) if Instant::now() < deadline => {
                sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("no reconnect: {error}"),
        }
    };
    assert!(next.release().await.unwrap());
}

/// Forwards a loopback port to `upstream`, delaying every reply by `delay`: a slow Redis.
async fn slow_proxy(upstream: u16, delay: Duration) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(("127.0.0.1", upstream))
                .await
                .unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
            });
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buffer = vec![0u8; 64 * 1024];
                while let Ok(read) = server_read.read(&mut buffer).await {
                    if read == 0 {
                        break;
                    }
                    sleep(delay).await;
                    if client_write.write_all(&buffer[..read]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// An acquire whose answer comes back after its deadline — the script did run and grant
/// the lock — answers by its deadline (Redis did not answer in time: unavailable) and
/// undoes the grant in the background: no lock is left that nobody holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_after_the_deadline_leaves_no_ghost_holder() {
    let redis = PrivateRedis::start();
    let port = slow_proxy(redis.server.port(), Duration::from_millis(100)).await;
    let locks = lock::open(&format!("redis://127.0.0.1:{port}"), &under_t()).unwrap();
    // Subscribe (and load the scripts) first, with time to spare.
    let mut warm = locks
        .acquire("k", 10 * SECOND, Instant::now() + 5 * SECOND)
        .await
        .unwrap();
    warm.release().await.unwrap();

    let result = locks
        .acquire("k", 10 * SECOND, Instant::now() + Duration::from_millis(30))
        .await;
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    let mut raw = redis.raw().await;
    let undone_by = Instant::now() + 2 * SECOND;
    loop {
        let held: Option<String> = raw.get("t:lock:{k}").await.unwrap();
        if held.is_none() {
            break;
        }
        assert!(
            Instant::now() < undone_by,
            "the grant that arrived too late was not undone"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// A backend on `server` whose queues take up to `max_waiters`, in this process too.
fn crowd_instance(server: &RedisServer, max_waiters: usize) -> LockService {
    LockService::from_arc(Arc::new(
        RedisBackend::open(
            &server.url(),
            &LockOptions {
                namespace: "t".into(),
                op_timeout: Some(Duration::from_secs(2)),
                max_waiters,
                ..LockOptions::default()
            },
        )
        .unwrap(),
    ))
    .with_max_waiters(max_waiters)
}

/// The server's cap on waiters holds across processes: two instances that would each
/// queue 10 waiters on one key get 8 queued between them, and the rest are turned away at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_waiter_cap_holds_across_processes() {
    let redis = PrivateRedis::start();
    let instances = [
        crowd_instance(&redis.server, 8).with_max_waiters(64),
        crowd_instance(&redis.server, 8).with_max_waiters(64),
    ];
    let mut holder = instances[0]
        .try_acquire("k", 10 * SECOND)
        .await
        .unwrap()
        .unwrap();
    let crowd: Vec<_> = (0..20)
        .map(|i| {
            let locks = instances[i % 2].clone();
            tokio::spawn(async move {
                // Released at once, so the queue moves on whatever order the test reads
                // the answers in.
                let mut guard = locks
                    .acquire("k", 10 * SECOND, Instant::now() + 5 * SECOND)
                    .await?;
                guard.release().await
            })
        })
        .collect();
    sleep(Duration::from_millis(300)).await;
    let queued: u64 = redis.raw().await.zcard("t:waiting:{k}").await.unwrap();
    assert_eq!(queued, 8);
    holder.release().await.unwrap();
    let mut served = 0;
    let mut turned_away = 0;
    for waiter in crowd {
        match waiter.await.unwrap() {
            Ok(held) => {
                assert!(held);
                served += 1;
            }
            Err(LockError::QueueFull { .. }) => turned_away += 1,
            Err(error) => panic!("{error:?}"),
        }
    }
    assert_eq!((served, turned_away), (8, 12));
}

/// 5,000 waiters on one key from five processes, all giving up at their deadlines, cost
/// the server little: leaving the queue is O(log n), so the server's time per script
/// stays small and another process's key is granted at once throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crowd_of_waiters_giving_up_is_cheap() {
    let redis = PrivateRedis::start();
    let crowd: Vec<_> = (0..5)
        .map(|_| crowd_instance(&redis.server, 10_000))
        .collect();
    for locks in &crowd {
        locks.ping().await.unwrap();
    }
    let mut holder = crowd[0]
        .try_acquire("hot", 30 * SECOND)
        .await
        .unwrap()
        .unwrap();
    redis.reset_stats().await;
    // Arriving over a second, each waiting half a second: thousands queued at a time,
    // and giving up as steadily as they came.
    let arrivals = {
        let crowd = crowd.clone();
        tokio::spawn(async move {
            let mut waiters = Vec::new();
            for i in 0..5_000 {
                let locks = crowd[i % 5].clone();
                waiters.push(tokio::spawn(async move {
                    let gave_up = locks
                        .acquire("hot", SECOND, Instant::now() + Duration::from_millis(500))
                        .await;
                    assert!(
                        matches!(gave_up, Err(LockError::TimedOut { .. })),
                        "{gave_up:?}"
                    );
                }));
                if i % 5 == 4 {
                    sleep(Duration::from_millis(1)).await;
                }
            }
            waiters
        })
    };
    // Another process's key, meanwhile: granted at once, every time.
    crate::suite::granted_at_once(&redis.locks, "cold", 400).await;
    for waiter in arrivals.await.unwrap() {
        waiter.await.unwrap();
    }
    holder.release().await.unwrap();
    // The background cancels have run by now; give stragglers a moment.
    sleep(Duration::from_millis(500)).await;
    let mut raw = redis.raw().await;
    let left: u64 = raw.zcard("t:waiting:{hot}").await.unwrap();
    assert_eq!(left, 0, "waiters left in the queue");
    let (calls, usec) = script_stats(&redis).await;
    assert!(
        calls >= 10_000,
        "{calls} scripts for 5,000 waits and cancels"
    );
    let per_call = usec as f64 / calls as f64;
    assert!(
        per_call < 100.0,
        "{per_call:.0} µs of server time per script call"
    );
}

/// Script calls since the last reset and the server time they took, in µs.
async fn script_stats(redis: &PrivateRedis) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut redis.raw().await)
        .await
        .unwrap();
    let field = |stats: &str, name: &str| -> u64 {
        stats
            .split(',')
            .find_map(|pair| pair.strip_prefix(name))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0)
    };
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_evalsha:"))
        .map(|stats| (field(stats, "calls="), field(stats, "usec=")))
        .fold((0, 0), |(calls, usec), (c, u)| (calls + c, usec + u))
}

/// A waiter whose process died while queued — its connection closed, its wake-up channel
/// unheard, no cancel sent — is skipped at the hand-off: the next waiter gets the lock at
/// once, instead of after the dead waiter's whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_whose_process_died_is_skipped() {
    let redis = PrivateRedis::start();
    let mut holder = redis
        .locks
        .try_acquire("k", 10 * SECOND)
        .await
        .unwrap()
        .unwrap();
    let url = redis.server.url();
    std::thread::spawn(move || {
        // Another process: its own runtime, connection and channel. It queues a waiter
        // with a 10 s lease and a 30 s deadline, then vanishes: the runtime is torn down
        // with the wait in progress, so its clean-up never runs.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let doomed = LockService::from_arc(Arc::new(
                RedisBackend::open(
                    &url,
                    &LockOptions {
                        namespace: "t".into(),
                        ..LockOptions::default()
                    },
                )
                .unwrap(),
            ));
            tokio::spawn(async move {
                let _never = doomed
                    .acquire("k", 10 * SECOND, Instant::now() + 30 * SECOND)
                    .await;
            });
            sleep(Duration::from_millis(300)).await;
        });
        runtime.shutdown_background();
    })
    .join()
    .unwrap();
    let mut raw = redis.raw().await;
    let queued: u64 = raw.zcard("t:waiting:{k}").await.unwrap();
    assert_eq!(queued, 1, "the dead waiter is still queued");
    let live = {
        let locks = redis.locks.clone();
        tokio::spawn(async move {
            locks
                .acquire("k", 10 * SECOND, Instant::now() + 20 * SECOND)
                .await
                .unwrap()
        })
    };
    sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    assert!(holder.release().await.unwrap());
    let mut guard = live.await.unwrap();
    assert!(
        released_at.elapsed() < Duration::from_secs(1),
        "the live waiter waited {:?} behind a dead one",
        released_at.elapsed()
    );
    guard.release().await.unwrap();
}

/// Chubby's lock-delay on Redis: a holder that vanished keeps its key for its lease and
/// the delay; a released lock is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_delay_keeps_a_vanished_holders_key() {
    let redis = PrivateRedis::start();
    let locks = lock::open(
        &redis.server.url(),
        &LockOptions {
            namespace: "t".into(),
            lock_delay: Duration::from_millis(700),
            ..LockOptions::default()
        },
    )
    .unwrap();
    crate::suite::lock_delay_keeps_an_abandoned_holders_key(&locks, Duration::from_millis(700))
        .await;
}

/// A key's fencing counter expires its idle time after the last lease ends, and with it
/// the last of the key's state: the key locked again gets a token above every earlier
/// one, a lease from before can neither extend nor release the new lock, and a key held
/// (and waited for) all the while keeps its counter through its renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_keys_counter_expires_and_fencing_stays_whole() {
    let server = RedisServer::start().unwrap();
    let idle = Duration::from_millis(200);
    let locks = lock::open(&server.url(), &LockOptions { idle, ..under_t() }).unwrap();
    let url = server.url();
    crate::suite::forgotten_key_keeps_fencing(&locks, |key| async move {
        let raw = raw_at(&url).await;
        let gone_by = Instant::now() + 5 * SECOND;
        crate::suite::until_gone(gone_by, Duration::from_millis(50), || {
            let (mut raw, key) = (raw.clone(), key.clone());
            async move {
                let left: Vec<String> = raw.keys(format!("t:*{{{key}}}")).await.unwrap();
                (!left.is_empty()).then(|| format!("still kept: {left:?}"))
            }
        })
        .await;
    })
    .await;
}

/// 10,000 keys locked once each leave nothing in Redis once their idle time has passed.
/// Bound: every key the lock writes expires within a lease and the idle time (here
/// 1 s + 1 s) of its last use, so `DBSIZE` is at most the keys used in that window — 0
/// once it has passed (10,000 fencing counters, kept forever, without the expiry).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn state_of_10_000_keys_locked_once_expires() {
    let server = RedisServer::start().unwrap();
    let locks = lock::open(
        &server.url(),
        &LockOptions {
            idle: SECOND,
            ..under_t()
        },
    )
    .unwrap();
    let took = crate::suite::lock_fresh_keys(&locks, 10_000).await;
    let mut raw = raw_at(&server.url()).await;
    let keys: Vec<String> = raw.keys("*").await.unwrap();
    let mut ttls = redis::pipe();
    for key in &keys {
        ttls.cmd("PTTL").arg(key);
    }
    let ttls: Vec<i64> = ttls.query_async(&mut raw).await.unwrap();
    let lasting = ttls
        .iter()
        .filter(|ttl| **ttl == -1 || **ttl > 2_000)
        .count();
    assert_eq!(lasting, 0, "of {} keys", keys.len());
    let expired_by = Instant::now() + 10 * SECOND;
    crate::suite::until_gone(expired_by, Duration::from_millis(100), || {
        let mut raw = raw.clone();
        async move {
            let size: i64 = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
            (size != 0).then(|| format!("{size} keys kept"))
        }
    })
    .await;
    eprintln!(
        "10,000 keys locked in {took:?}; {} keys right after",
        keys.len()
    );
}
