//! What only a Redis Cluster can show: wake-ups that cross nodes (sharded pub/sub on the
//! lock's slot), a slot moved while locks are taken on it (MOVED and ASK followed), and a
//! master killed under held locks — its replica takes over, the locks and counters it had
//! not replicated are gone, and the fencing tokens still never go back.

use std::time::Duration;

use lock::testing::RedisCluster;
use lock::{FencingToken, LockError, LockOptions, LockService};
use tokio::time::{Instant, sleep};

const SECOND: Duration = Duration::from_secs(1);

/// The shared cluster (`scripts/services.sh` starts one on 127.0.0.1:7000-7005).
fn cluster_url() -> String {
    std::env::var("REDIS_CLUSTER_URL")
        .unwrap_or_else(|_| "redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002".into())
}

fn cluster_at(url: &str, namespace: &str) -> LockService {
    lock::open(
        url,
        &LockOptions {
            namespace: namespace.to_owned(),
            op_timeout: Some(Duration::from_secs(2)),
            ..LockOptions::default()
        },
    )
    .expect("a valid Redis Cluster URL")
}

/// The shared cluster, under a namespace of the test's own.
pub fn shared_cluster() -> LockService {
    cluster_at(&cluster_url(), &crate::test_namespace())
}

/// The shared cluster whose keys of one namespace are lost — what a failover to a replica
/// that had not replicated them loses (the failover test below loses them for real).
pub fn namespace_lost() -> crate::NamespaceLost {
    crate::NamespaceLost::new(
        |namespace| cluster_at(&cluster_url(), namespace),
        |namespace| {
            Box::pin(async move {
                for port in masters(&cluster_url()).await {
                    let mut node = node(port).await;
                    let keys: Vec<String> = redis::cmd("KEYS")
                        .arg(format!("{}:*", namespace))
                        .query_async(&mut node)
                        .await
                        .unwrap();
                    for key in keys {
                        let _: i64 = redis::cmd("DEL")
                            .arg(&key)
                            .query_async(&mut node)
                            .await
                            .unwrap();
                    }
                }
            })
        },
    )
}

async fn node(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The masters' ports, as the first node of `url` sees them.
async fn masters(url: &str) -> Vec<u16> {
    let first = url
        .trim_start_matches("redis-cluster://")
        .split(',')
        .next()
        .and_then(|address| address.rsplit(':').next())
        .and_then(|port| port.parse().ok())
        .unwrap();
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut node(first).await)
        .await
        .unwrap();
    nodes
        .lines()
        .filter(|line| {
            line.split_whitespace()
                .nth(2)
                .is_some_and(|flags| flags.contains("master"))
        })
        .filter_map(|line| {
            let address = line.split_whitespace().nth(1)?;
            address.split('@').next()?.rsplit(':').next()?.parse().ok()
        })
        .collect()
}

/// Keys whose slots lie on different masters of the shared cluster: a waiter on each is
/// woken by a release on another node than the others' — over the slot's sharded channel,
/// at once, not when the holder's 10 s lease would have run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wake_ups_reach_waiters_on_every_node() {
    let namespace = crate::test_namespace();
    let holders = cluster_at(&cluster_url(), &namespace);
    let waiters = cluster_at(&cluster_url(), &namespace);
    // Three keys that land on three different masters (slots 0-5460, 5461-10922, 10923-).
    let keys = ["k-a", "k-b", "k-c", "k-d", "k-e", "k-f", "k-g", "k-h"];
    let mut chosen: Vec<&str> = Vec::new();
    let mut thirds = Vec::new();
    for key in keys {
        let third = slot_third(&format!("{namespace}:lock:{{{key}}}"));
        if !thirds.contains(&third) {
            thirds.push(third);
            chosen.push(key);
        }
    }
    assert_eq!(
        chosen.len(),
        3,
        "no key per third of the slots among {keys:?}"
    );
    for key in chosen {
        woken_promptly(&holders, &waiters, key).await;
    }
}

/// Which third of the 16,384 slots a key's slot is in (the shared cluster's masters hold
/// one third each).
fn slot_third(key: &str) -> u16 {
    // CLUSTER KEYSLOT, asked of the cluster itself rather than computed again here.
    let output = std::process::Command::new("redis-cli")
        .args(["-p", "7000", "CLUSTER", "KEYSLOT", key])
        .output()
        .unwrap();
    let slot: u16 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    slot / 5462
}

/// A slot moved to another master while locks on it are taken and released: the client
/// follows the cluster (MOVED, ASK, TRYAGAIN) and no acquire or release fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_moved_under_load_is_followed() {
    let cluster =
        std::sync::Arc::new(RedisCluster::start().expect("a private Redis Cluster starts"));
    let locks = cluster_at(&cluster.url(), "moving");
    let key = "busy";
    let from = cluster
        .master_of(&format!("moving:lock:{{{key}}}"))
        .unwrap();
    let to = cluster
        .masters()
        .unwrap()
        .into_iter()
        .find(|&port| port != from)
        .unwrap();
    let stop = Instant::now() + 6 * SECOND;
    let load = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let mut pairs = 0_u64;
            let mut last = FencingToken::new(0);
            while Instant::now() < stop {
                let mut guard = locks
                    .acquire(key, SECOND, Instant::now() + 5 * SECOND)
                    .await?;
                assert!(guard.fencing_token() > last);
                last = guard.fencing_token();
                guard.release().await?;
                pairs += 1;
            }
            Ok::<u64, LockError>(pairs)
        })
    };
    sleep(Duration::from_millis(500)).await;
    let moved_slot = lock::testing::slot_of(&format!("moving:lock:{{{key}}}"));
    let mover = std::sync::Arc::clone(&cluster);
    tokio::task::spawn_blocking(move || mover.move_slot(moved_slot, from, to))
        .await
        .unwrap()
        .unwrap();
    let pairs = load
        .await
        .unwrap()
        .expect("no acquire or release failed while the slot moved");
    assert!(pairs > 100, "only {pairs} pairs in 6 s");
    assert_eq!(
        cluster
            .master_of(&format!("moving:lock:{{{key}}}"))
            .unwrap(),
        to
    );
}

/// A master killed with SIGKILL under a held lock. Until its replica takes over, the locks
/// of its slots answer "unavailable" (a 503 upstream) — never a grant — and the other
/// masters' keys keep working; then the promoted replica serves them. What the replica had
/// replicated survives (tokens never fall below those), and what it had not (the last
/// grant, perhaps) is lost: a token may then come again, which the protected store refuses
/// as not newer, and `raise_fencing` lifts the counter past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_master_fails_over_and_tokens_never_go_back() {
    let mut cluster = RedisCluster::start().expect("a private Redis Cluster starts");
    let locks = cluster_at(&cluster.url(), "failover");
    let key = "account";
    let master = cluster.master_of("failover:lock:{account}").unwrap();
    let elsewhere = [
        "other-a", "other-b", "other-c", "other-d", "other-e", "other-f",
    ]
    .into_iter()
    .find(|other| {
        cluster
            .master_of(&format!("failover:lock:{{{other}}}"))
            .unwrap()
            != master
    })
    .unwrap();
    let mut replicated = FencingToken::new(0);
    for _ in 0..5 {
        let mut guard = locks.try_acquire(key, SECOND).await.unwrap().unwrap();
        replicated = replicated.max(guard.fencing_token());
        guard.release().await.unwrap();
    }
    // Waits before the failover, on this key and on another of the same master in another
    // slot: this process subscribes to two slots' wake-up channels on the master about to
    // die (one node's channels in two slots, which a resubscription must not send as one
    // SSUBSCRIBE).
    let neighbour = [
        "n-a", "n-b", "n-c", "n-d", "n-e", "n-f", "n-g", "n-h", "n-i", "n-j",
    ]
    .into_iter()
    .find(|other| {
        let lock_key = format!("failover:lock:{{{other}}}");
        cluster.master_of(&lock_key).unwrap() == master
            && lock::testing::slot_of(&lock_key)
                != lock::testing::slot_of("failover:lock:{account}")
    })
    .unwrap();
    replicated = replicated.max(woken_promptly(&locks, &locks, key).await);
    woken_promptly(&locks, &locks, neighbour).await;
    cluster.wait_replicated(master, 5 * SECOND).unwrap();
    let held = locks.try_acquire(key, 2 * SECOND).await.unwrap().unwrap();
    let unreplicated = held.fencing_token();
    cluster.kill(master);
    let killed_at = Instant::now();

    // Another master's keys are not held up.
    let mut other = locks.try_acquire(elsewhere, SECOND).await.unwrap().unwrap();
    other.release().await.unwrap();

    // The killed master's keys: unavailable or held, never granted, until the failover.
    let first_after = crate::first_grant_within(&locks, key, 30 * SECOND)
        .await
        .expect("the replica took over within 30 s");
    let degraded = killed_at.elapsed();
    println!("failover: the killed master's locks were unavailable for {degraded:?}");
    crate::after_the_failover(first_after, replicated, held).await;

    // Waiters on the slot are woken at once again: the subscription follows the slot to
    // the promoted replica.
    woken_promptly(&locks, &locks, key).await;
    woken_promptly(&locks, &locks, neighbour).await;

    // The protected store reports the highest token it accepted; the counter goes past it.
    locks.raise_fencing(key, unreplicated).await.unwrap();
    let mut next = locks.try_acquire(key, SECOND).await.unwrap().unwrap();
    assert!(next.fencing_token() > unreplicated);
    next.release().await.unwrap();
}

/// A holder on `key` (through `holders`) and a waiter queued behind it (through
/// `waiters`): the release wakes the waiter at once, not when the holder's 10 s lease would
/// have run out, and its token is the newer. Returns the waiter's token.
async fn woken_promptly(
    holders: &LockService,
    waiters: &LockService,
    key: &'static str,
) -> FencingToken {
    let mut held = holders
        .try_acquire(key, 10 * SECOND)
        .await
        .unwrap()
        .unwrap();
    let waiter = crate::suite::spawn_acquire(waiters, key, SECOND, 8 * SECOND);
    // Until the waiter has queued.
    sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let mut next = waiter.await.unwrap().unwrap();
    let waited = released_at.elapsed();
    assert!(
        waited < SECOND,
        "{key}: the waiter woke {waited:?} after the release"
    );
    assert!(next.fencing_token() > held.fencing_token());
    let token = next.fencing_token();
    next.release().await.unwrap();
    token
}

/// In a cluster too (the same scripts, on the key's master), an idle key's counter
/// expires and fencing stays whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_keys_counter_expires_and_fencing_stays_whole() {
    let namespace = crate::test_namespace();
    let locks = lock::open(
        &cluster_url(),
        &LockOptions {
            namespace: namespace.clone(),
            op_timeout: Some(Duration::from_secs(2)),
            idle: Duration::from_millis(200),
            ..LockOptions::default()
        },
    )
    .unwrap();
    crate::suite::forgotten_key_keeps_fencing(&locks, |key| async move {
        let gone_by = Instant::now() + 5 * SECOND;
        crate::suite::until_gone(gone_by, Duration::from_millis(50), || async {
            let mut left = Vec::new();
            for port in masters(&cluster_url()).await {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{namespace}:*{{{key}}}"))
                    .query_async(&mut node(port).await)
                    .await
                    .unwrap();
                left.extend(keys);
            }
            (!left.is_empty()).then(|| format!("still kept: {left:?}"))
        })
        .await;
    })
    .await;
}
