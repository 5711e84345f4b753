//! Redlock over 3 and 5 private Redis servers (one stopped), and the classic recipes doing
//! what they are known for.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use lock::recipes::{GetSetTimestamp, Recipe, SetnxExpire};
use lock::testing::RedisServer;
use lock::{LockError, Redlock};
use tokio::time::{Instant, sleep};

fn servers(count: usize) -> Vec<RedisServer> {
    (0..count)
        .map(|_| RedisServer::start().expect("redis-server starts"))
        .collect()
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

fn after(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// Redlock's drift allowance: 0.01·TTL + 2 ms.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How many of these nodes hold `key` right now.
async fn holders(urls: &[String], key: &str) -> usize {
    let mut holding = 0;
    for url in urls {
        let mut node = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let exists: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut node)
            .await
            .unwrap();
        holding += usize::from(exists == 1);
    }
    holding
}

/// A node that accepts connections and never answers: every command to it costs Redlock
/// its full per-node timeout.
fn silent_node() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    (listener, url)
}

/// Tasks doing a non-atomic read-modify-write under Redlock lose no update.
async fn redlock_excludes(redlock: Arc<Redlock>) {
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (redlock, counter, inside) = (redlock.clone(), counter.clone(), inside.clone());
            tokio::spawn(async move {
                for _ in 0..10 {
                    let guard = redlock
                        .acquire("k", Duration::from_secs(5), after(20_000))
                        .await
                        .unwrap();
                    crate::suite::read_modify_write_alone(&inside, &counter).await;
                    redlock.release(&guard).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 80);
}

/// Redlock on 3 servers: mutual exclusion; the validity is TTL minus drift, counted from
/// the attempt (no later than the call, no earlier); release clears every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_on_three_servers() {
    let servers = servers(3);
    let redlock = Arc::new(Redlock::open(&urls(&servers), "t").unwrap());
    assert_eq!(redlock.quorum(), 2);
    let ttl = Duration::from_secs(1);
    let before = Instant::now();
    let guard = redlock.acquire("v", ttl, after(1_000)).await.unwrap();
    assert_eq!(guard.granted, 3);
    assert!(guard.valid_until <= Instant::now() + ttl - drift(ttl));
    assert!(
        guard.valid_until >= before + ttl - drift(ttl),
        "validity shorter than TTL − drift from the moment acquire was called"
    );
    assert_eq!(holders(&urls(&servers), &guard.key).await, 3);
    assert!(matches!(
        redlock.acquire("v", ttl, after(100)).await,
        Err(LockError::TimedOut { .. })
    ));
    redlock.release(&guard).await;
    assert_eq!(
        holders(&urls(&servers), &guard.key).await,
        0,
        "release must clear every node, not just a majority"
    );
    redlock_excludes(redlock).await;
}

/// A grant is refused when acquiring, plus the drift allowance, used up the TTL: with a
/// TTL no longer than the drift itself; and with a node that answers only after Redlock's
/// per-node timeout (50 ms), with a TTL of 50 ms — two nodes granted, a majority, but
/// nothing of the lease would be left. With a TTL of 1 s the same nodes grant it, and the
/// validity shows the time the slow node took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_a_grant_that_acquiring_used_up() {
    let servers = servers(2);
    let (_silent, silent) = silent_node();
    let mut nodes = urls(&servers);
    nodes.push(silent);

    let tiny = Duration::from_millis(2);
    assert!(drift(tiny) >= tiny);
    let redlock = Redlock::open(&nodes, "tiny").unwrap();
    let result = redlock.acquire("k", tiny, after(200)).await;
    assert!(
        matches!(result, Err(LockError::TimedOut { .. })),
        "{result:?}"
    );

    // One attempt only: it and the release after it each wait 50 ms for the silent node.
    let redlock = Redlock::open(&nodes, "slow").unwrap();
    let ttl = Duration::from_millis(50);
    let result = redlock.acquire("k", ttl, after(60)).await;
    assert!(
        matches!(result, Err(LockError::TimedOut { .. })),
        "a grant with elapsed + drift ≥ TTL was accepted: {result:?}"
    );

    let redlock = Redlock::open(&nodes, "slower").unwrap();
    let ttl = Duration::from_secs(1);
    let guard = redlock.acquire("k", ttl, after(1_000)).await.unwrap();
    assert_eq!(guard.granted, 2);
    assert!(
        guard.valid_until + Duration::from_millis(45) <= Instant::now() + ttl - drift(ttl),
        "the validity does not count the time acquiring took"
    );
    redlock.release(&guard).await;
    assert_eq!(holders(&urls(&servers), &guard.key).await, 0);
}

/// Redlock on 5 servers with one stopped still holds a majority (4 of 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_on_five_servers_with_one_stopped() {
    let mut servers = servers(5);
    servers[2].stop();
    let redlock = Arc::new(Redlock::open(&urls(&servers), "t").unwrap());
    assert_eq!(redlock.quorum(), 3);
    let live: Vec<String> = servers
        .iter()
        .enumerate()
        .filter(|(index, _)| *index != 2)
        .map(|(_, server)| server.url())
        .collect();
    let ttl = Duration::from_secs(5);
    let before = Instant::now();
    let guard = redlock.acquire("k", ttl, after(2_000)).await.unwrap();
    assert_eq!(guard.granted, 4);
    assert!(guard.valid_until >= before + ttl - drift(ttl));
    assert!(guard.valid_until <= Instant::now() + ttl - drift(ttl));
    assert_eq!(holders(&live, &guard.key).await, 4);
    redlock.release(&guard).await;
    assert_eq!(
        holders(&live, &guard.key).await,
        0,
        "release must clear every live node, not just a majority"
    );
    redlock_excludes(redlock).await;
}

/// Redlock on 3 servers with one stopped works; with two stopped it cannot, and says the
/// store is unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_needs_a_majority() {
    let mut servers = servers(3);
    servers[0].stop();
    let redlock = Redlock::open(&urls(&servers), "t").unwrap();
    let guard = redlock
        .acquire("k", Duration::from_secs(5), after(2_000))
        .await
        .unwrap();
    assert_eq!(guard.granted, 2);
    redlock.release(&guard).await;
    assert_eq!(holders(&urls(&servers)[1..], &guard.key).await, 0);
    servers[1].stop();
    let started = Instant::now();
    let result = redlock
        .acquire("k", Duration::from_secs(5), after(500))
        .await;
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        Redlock::open(&urls(&servers)[..2], "t").is_err(),
        "fewer than 3 nodes is refused"
    );
}

/// Redlock hands out no fencing token: a holder that paused past its validity still
/// believes it holds the lock while another client does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_cannot_stop_a_paused_holder() {
    let servers = servers(3);
    let redlock = Redlock::open(&urls(&servers), "t").unwrap();
    let paused = redlock
        .acquire("k", Duration::from_millis(200), after(1_000))
        .await
        .unwrap();
    sleep(Duration::from_millis(300)).await;
    let next = redlock
        .acquire("k", Duration::from_secs(5), after(1_000))
        .await
        .unwrap();
    // Both guards exist; nothing the paused one carries tells a store it is stale.
    assert!(paused.valid_until < Instant::now());
    assert!(next.valid_until > Instant::now());
    redlock.release(&next).await;
}

/// SETNX + EXPIRE excludes while nothing goes wrong, and its bare DEL releases a
/// successor's lock after the holder outlived its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setnx_expire_deletes_its_successors_lock() {
    let server = RedisServer::start().unwrap();
    let recipe = SetnxExpire::open(&server.url(), "t").unwrap();
    let first = recipe
        .acquire("k", Duration::from_secs(1), after(500), 0)
        .await
        .unwrap();
    assert!(matches!(
        recipe
            .acquire("k", Duration::from_secs(1), after(50), 0)
            .await,
        Err(LockError::TimedOut { .. })
    ));
    sleep(Duration::from_millis(1100)).await;
    let second = recipe
        .acquire("k", Duration::from_secs(5), after(500), 0)
        .await
        .unwrap();
    recipe.release(&first, 0).await.unwrap();
    // The successor still thinks it holds the lock, but a third client gets it at once.
    let third = recipe
        .acquire("k", Duration::from_secs(5), after(100), 0)
        .await;
    assert!(
        third.is_ok(),
        "the stale holder's DEL freed the successor's lock"
    );
    recipe.release(&second, 0).await.unwrap();
}

/// SETNX + EXPIRE: a holder that crashes between the two commands leaves a lock without an
/// expiry, and nobody takes it again — not after the TTL, not ever — until it is deleted by
/// hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setnx_expire_crash_between_commands_leaves_a_lock_forever() {
    let server = RedisServer::start().unwrap();
    let recipe = SetnxExpire::open(&server.url(), "t").unwrap();
    assert!(recipe.setnx_then_crash("k", after(500)).await.unwrap());
    let ttl = Duration::from_secs(1);
    let started = Instant::now();
    let next = recipe.acquire("k", ttl, after(2_500), 0).await;
    assert!(matches!(next, Err(LockError::TimedOut { .. })), "{next:?}");
    assert!(started.elapsed() > 2 * ttl, "gave up before two TTLs");
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let remaining: i64 = redis::cmd("PTTL")
        .arg("t:setnx:k")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(remaining, -1, "the crashed holder's lock has no expiry");
}

/// The timestamp lock trusts clocks: a client whose clock runs ahead takes over a live
/// lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getset_lock_is_stolen_by_a_clock_that_runs_ahead() {
    let server = RedisServer::start().unwrap();
    let recipe = GetSetTimestamp::open(&server.url(), "t").unwrap();
    let holder = recipe
        .acquire("k", Duration::from_secs(10), after(500), 0)
        .await
        .unwrap();
    assert!(matches!(
        recipe
            .acquire("k", Duration::from_secs(10), after(50), 0)
            .await,
        Err(LockError::TimedOut { .. })
    ));
    let ahead = 60_000;
    let thief = recipe
        .acquire("k", Duration::from_secs(10), after(500), ahead)
        .await;
    assert!(
        thief.is_ok(),
        "a clock a minute ahead stole a lock with 10 s to go"
    );
    recipe.release(&holder, 0).await.unwrap();
}
