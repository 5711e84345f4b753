//! What only memcached can show: exclusion across processes through add and CAS, a lock
//! item deleted behind the holder's back, and the lock-delay, on the shared server
//! (`MEMCACHED_URL`, else 127.0.0.1:11211), each test under a namespace of its own; and
//! counters lost to a restart, on a private server.

use std::sync::Arc;
use std::time::Duration;

use lock::testing::MemcachedServer;
use lock::{LockBackend, LockOptions, LockService, MemcachedBackend, MemcachedOptions};
use tokio::time::{Instant, sleep};

use crate::{patient_options, test_namespace};

const SECOND: Duration = Duration::from_secs(1);

fn memcached_url() -> String {
    std::env::var("MEMCACHED_URL").unwrap_or_else(|_| "memcache://127.0.0.1:11211".into())
}

/// The shared memcached, under a namespace of the test's own.
pub fn shared_memcached() -> LockService {
    lock::open(&memcached_url(), &patient_options(&test_namespace())).unwrap()
}

/// Sends one command in memcached's text protocol, as an operator would, and returns the
/// first line of the answer.
async fn operator(command: &str) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let address = memcached_url().trim_start_matches("memcache://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(command.as_bytes()).await.unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).await.unwrap();
    line
}

/// A memcached of the test's own. Its data loss is a restart: memcached keeps nothing. The
/// same service goes on: its pooled connections to the old server are found closed and
/// replaced.
pub type PrivateMemcached = crate::PrivateStore<MemcachedServer>;

impl PrivateMemcached {
    pub fn start() -> Self {
        let server = MemcachedServer::start().expect("a memcached starts");
        let locks = lock::open(&server.url(), &patient_options("t")).unwrap();
        crate::PrivateStore::going_on(
            server,
            locks,
            |server| server.restart().expect("memcached restarts"),
            false,
        )
    }
}

/// Two processes on one key through memcached: no two holders at once, no update lost
/// (no queue across processes: who polls first after a release wins).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exclusion_holds_across_processes() {
    crate::exclusion_across_two_processes(&memcached_url()).await;
}

/// The lock's item deleted behind the holder's back (an eviction, a `flush_all`): a
/// waiter of another process takes it at its next poll, the holder's next extend fails its
/// CAS and `lost()` fires, and its release touches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_evicted_lock_is_taken_and_its_holder_told() {
    let namespace = test_namespace();
    let [holders, others] = crate::two_processes(&memcached_url(), &namespace);
    let holder = holders
        .try_acquire("k", Duration::from_millis(600))
        .await
        .unwrap()
        .unwrap();
    let waiter = crate::suite::spawn_acquire(&others, "k", SECOND, 10 * SECOND);
    sleep(Duration::from_millis(300)).await;
    let answer = operator(&format!("delete {namespace}:lock:k\r\n")).await;
    assert!(answer.starts_with("DELETED"), "{answer}");
    let evicted_at = Instant::now();
    let successor = waiter.await.unwrap().unwrap();
    // At a poll (100 ms apart at most, jittered), not at a lease's end: the holder kept
    // renewing, so nothing but the deletion freed the key. Loose: the suite shares two
    // cores with the JVMs.
    assert!(evicted_at.elapsed() < SECOND);
    crate::holder_told_and_succeeded(holder, successor, 2 * SECOND, "the item was deleted").await;
}

/// Chubby's lock-delay on memcached: a holder that vanished keeps its item for its lease
/// and the delay (in whole seconds, rounded up); a released lock is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_delay_keeps_a_vanished_holders_item() {
    let delay = Duration::from_millis(700);
    let locks = lock::open(
        &memcached_url(),
        &LockOptions {
            lock_delay: delay,
            ..patient_options(&test_namespace())
        },
    )
    .unwrap();
    crate::suite::lock_delay_keeps_an_abandoned_holders_key(&locks, delay).await;
}

/// memcached's CAS counter starts over after a restart, so the item of the next holder
/// can carry the very CAS value the last holder's grant was given (on a fresh server a
/// grant's writes number the same every time). The old holder's release and extend still
/// touch nothing of the new holder's: they act only on an item that holds their own value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_from_before_a_restart_never_touches_the_next_holders_lock() {
    let mut server = MemcachedServer::start().expect("a memcached starts");
    let backend = Arc::new(
        MemcachedBackend::open(
            &server.url(),
            &patient_options("t"),
            MemcachedOptions::default(),
        )
        .unwrap(),
    );
    let before = LockService::from_arc(backend.clone());
    let mut old = before.try_acquire("k", 30 * SECOND).await.unwrap().unwrap();
    server.restart().expect("memcached restarts");
    let after = lock::open(&server.url(), &patient_options("t")).unwrap();
    let mut new = after
        .try_acquire("k", 30 * SECOND)
        .await
        .unwrap()
        .expect("the restart freed the lock");

    assert!(!backend.extend(old.lease(), 30 * SECOND).await.unwrap());
    assert!(!old.release().await.unwrap());
    assert!(
        after.try_acquire("k", SECOND).await.unwrap().is_none(),
        "the old holder freed the new holder's lock"
    );
    assert!(new.release().await.unwrap());
}

/// The items of memcached at `address` that are still alive (`lru_crawler metadump all`
/// skips expired ones), by key.
async fn live_items(address: &str) -> Vec<String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"lru_crawler metadump all\r\n")
        .await
        .unwrap();
    let mut lines = BufReader::new(stream).lines();
    let mut keys = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        if line == "END" {
            break;
        }
        // A crawler still busy with an earlier dump answers BUSY: nothing to count yet.
        assert!(line.starts_with("key="), "{line}");
        keys.extend(
            line.split(' ')
                .next()
                .map(|key| key["key=".len()..].to_owned()),
        );
    }
    keys
}

/// A key's counter expires (in whole seconds) its idle time after the last lease ends,
/// and with it the key's last item: the key locked again gets a token above every
/// earlier one, a lease from before can neither extend nor release the new lock, and a
/// key held all the while keeps its counter through its renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_keys_counter_expires_and_fencing_stays_whole() {
    let namespace = test_namespace();
    let locks = lock::open(
        &memcached_url(),
        &LockOptions {
            idle: SECOND,
            ..patient_options(&namespace)
        },
    )
    .unwrap();
    crate::suite::forgotten_key_keeps_fencing(&locks, |key| async move {
        let gone_by = Instant::now() + 10 * SECOND;
        for item in ["fence", "lock"] {
            crate::suite::until_gone(gone_by, Duration::from_millis(100), || async {
                let answer = operator(&format!("mg {namespace}:{item}:{key} v\r\n")).await;
                (!answer.starts_with("EN")).then(|| format!("{item} still kept: {answer}"))
            })
            .await;
        }
    })
    .await;
}

/// 10,000 keys locked once each leave nothing behind once their counters' idle time has
/// passed: the private server's live items fall from 10,000 (one counter per key) to 0.
/// Bound: every counter lives its lease + the idle time (1 s + 1 s, whole seconds plus
/// one: 3 s) past its key's last grant, so at most the keys granted in the last 3 s are
/// kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn state_of_10_000_keys_locked_once_expires() {
    let server = MemcachedServer::start().expect("a memcached starts");
    let address = server.url().trim_start_matches("memcache://").to_owned();
    let locks = LockService::new(
        MemcachedBackend::open(
            &server.url(),
            &LockOptions {
                idle: SECOND,
                ..patient_options("t")
            },
            MemcachedOptions {
                max_connections: 32,
            },
        )
        .unwrap(),
    );
    let took = crate::suite::lock_fresh_keys(&locks, 10_000).await;
    let kept = live_items(&address).await.len();
    eprintln!("10,000 keys locked in {took:?}; {kept} items alive right after");
    assert!(kept > 0 && kept <= 10_000, "{kept} items");
    sleep(4 * SECOND).await;
    let kept = live_items(&address).await;
    assert!(
        kept.is_empty(),
        "{} items kept: {:?}",
        kept.len(),
        &kept[..kept.len().min(5)]
    );
}
