//! What the lock service keeps per key when every order is a key of its own: the state of
//! a key nobody uses any more goes — Redis expires it, the in-process table is pruned by
//! the reaper — and the ledger's fencing check still refuses a holder from before it went.

use std::sync::Arc;
use std::time::Duration;

use api::config::Mode;
use api::state::{AppState, Settings};
use ledger::{Ledger, LedgerOptions};
use lock::testing::RedisServer;
use lock::{InProcessBackend, LockService};
use reqwest::StatusCode;
use serde_json::json;
use tokio::time::{Instant, sleep};

use crate::helpers::{Backend, Shared, TestApp, read, spawn_config, spawn_state};

/// Orders paid by the bounded-state tests, one lock key each. 10,000 took 50–60 s per test
/// in a debug build on the shared two-core machine (most of it the ledger's three writes
/// per order); the lock crate's tests lock 10,000 fresh keys on every backend instead.
const ORDERS: usize = 2_000;

/// Rate limits off: thousands of orders from a few accounts are not a flood to turn away
/// here.
const NO_RATE_LIMITS: [&str; 6] = [
    "--accounts-per-minute",
    "0",
    "--tickets-per-second",
    "0",
    "--spends-per-second",
    "0",
];

/// The embedded mode, with a handle on its lock table to count it.
async fn embedded(extra: &[&str]) -> (TestApp, Arc<InProcessBackend>) {
    let shared = Shared::new(Backend::Embedded).await;
    let config = shared.config(extra);
    config.validate().unwrap();
    let Mode::Embedded { sqlite_path } = config.mode().unwrap() else {
        panic!("not the embedded mode");
    };
    let ledger = Ledger::open_sqlite(&sqlite_path, &LedgerOptions::default())
        .await
        .unwrap();
    let table = Arc::new(InProcessBackend::new());
    let locks = LockService::from_arc(table.clone());
    let state = AppState::new(ledger, locks, Settings::from_config(&config));
    (spawn_state(shared, state, &config).await, table)
}

/// The distributed mode on a Redis of the test's own: every key in it is the lock
/// service's.
async fn on_private_redis(extra: &[&str]) -> (TestApp, RedisServer) {
    let redis = RedisServer::start().unwrap();
    let shared = Shared::new(Backend::Distributed).await;
    let mut config = shared.config(extra);
    config.redis_url = Some(redis.url());
    (spawn_config(shared, config).await, redis)
}

async fn raw(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A holder granted an account's lock pauses past its lease and past the key's idle
/// time; meanwhile the lock service forgets the key (`forget`, which checks that it
/// did). A holder granted since gets a token above the paused one's — the forgotten
/// counter started again from the clock — and above the token of the spend the ledger
/// recorded before: the ledger takes the new holder's write and refuses the paused
/// holder's.
async fn paused_holder_is_refused_once_its_key_was_forgotten<F, Fut>(
    app: &TestApp,
    idle: Duration,
    forget: F,
) where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let ada = app.create_account(1000, 0).await;
    assert_eq!(
        app.withdraw_with_a_new_ticket(&ada, 100).await,
        StatusCode::CREATED
    );
    let locks = app.state.locks();
    let key = format!("lock:account:{}", ada.id);
    let paused_ticket = ledger::TicketId(app.ticket(&ada).await.parse().unwrap());
    let later_ticket = ledger::TicketId(app.ticket(&ada).await.parse().unwrap());

    let ttl = Duration::from_millis(300);
    let mut paused = locks.try_acquire(&key, ttl).await.unwrap().expect("free");
    paused.stop_renewal().await;
    sleep(ttl + idle).await;
    forget(key.clone()).await;

    let mut later = locks
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the paused holder's lease ran out");
    assert!(later.fencing_token() > paused.fencing_token());
    app.assert_later_grant_wins(
        &ada,
        (later_ticket, &later),
        (paused_ticket, &paused),
        600,
        "a key forgotten meanwhile",
    )
    .await;
    later.release().await.unwrap();
    assert_eq!(app.balance(&ada).await, (300, 0));
    app.assert_audit_clean().await;
}

/// Embedded: a holder paused past its lease and the idle time, whose key the lock table
/// pruned meanwhile, is refused by the ledger after the holder granted since.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_paused_holder_is_refused_once_its_key_was_pruned() {
    let (app, table) = embedded(&[]).await;
    let idle = Duration::from_millis(300);
    let locks = app.state.locks().clone();
    paused_holder_is_refused_once_its_key_was_forgotten(&app, idle, |_| async move {
        assert_eq!(locks.prune_idle(idle).await.unwrap(), 1);
        assert_eq!(table.key_count(), 0);
    })
    .await;
}

/// Redis: a holder paused past its lease and `PAYONCE_LOCK_IDLE`, whose key's fencing
/// counter Redis expired meanwhile, is refused by the ledger after the holder granted
/// since.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_paused_holder_is_refused_once_its_keys_counter_expired() {
    let (app, redis) = on_private_redis(&["--lock-ttl", "300ms", "--lock-idle", "300ms"]).await;
    let mut raw = raw(&redis).await;
    let namespace = app.shared.namespace.clone();
    paused_holder_is_refused_once_its_key_was_forgotten(
        &app,
        Duration::from_millis(300),
        |key| async move {
            let fence = format!("{namespace}:fence:{{{key}}}");
            let gone_by = Instant::now() + Duration::from_secs(5);
            loop {
                let kept: i64 = redis::cmd("EXISTS")
                    .arg(&fence)
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                if kept == 0 {
                    break;
                }
                assert!(
                    Instant::now() < gone_by,
                    "the fencing counter never expired"
                );
                sleep(Duration::from_millis(50)).await;
            }
        },
    )
    .await;
}

/// Pays `count` orders, each new, through the API: 32 clients, each with an account of
/// its own, each order placed, given a ticket of its own and paid. Returns how long it
/// took.
async fn pay_fresh_orders(app: &TestApp, count: usize) -> Duration {
    const CLIENTS: usize = 32;
    let started = Instant::now();
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let orders = (client..count).step_by(CLIENTS).count();
        let account = app.create_account(i64::try_from(orders).unwrap(), 0).await;
        let (http, base) = (app.client.clone(), app.address.clone());
        clients.push(tokio::spawn(async move {
            let post = |path: String| http.post(format!("{base}{path}")).bearer_auth(&account.key);
            for _ in 0..orders {
                let placed = post(format!("/v1/accounts/{}/orders", account.id))
                    .json(&json!({ "amount": 1 }))
                    .send()
                    .await
                    .unwrap();
                let (status, _, order) = read(placed).await;
                assert_eq!(status, StatusCode::CREATED, "{order}");
                let issued = post(format!("/v1/accounts/{}/tickets", account.id))
                    .send()
                    .await
                    .unwrap();
                let (status, _, ticket) = read(issued).await;
                assert_eq!(status, StatusCode::CREATED, "{ticket}");
                let paid = post(format!(
                    "/v1/orders/{}/payments",
                    order["order_id"].as_str().unwrap()
                ))
                .header("idempotency-key", ticket["ticket_id"].as_str().unwrap())
                .send()
                .await
                .unwrap();
                let (status, _, payment) = read(paid).await;
                assert_eq!(status, StatusCode::CREATED, "{payment}");
            }
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
    started.elapsed()
}

/// Embedded: paying 2,000 orders — a lock key each — leaves the lock table empty once the
/// reaper has pruned them. Bound: the table holds the keys in use plus those used within
/// the last `PAYONCE_LOCK_IDLE` and one `PAYONCE_REAP_INTERVAL` (here 1 s + 200 ms) —
/// none once that has passed since the last payment (an entry per order, kept for as
/// long as the process lives, without pruning).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_lock_table_stays_bounded_over_many_orders() {
    let mut flags = vec![
        "--lock-ttl",
        "1s",
        "--lock-idle",
        "1s",
        "--reap-interval",
        "200ms",
    ];
    flags.extend(NO_RATE_LIMITS);
    let (app, table) = embedded(&flags).await;
    let took = pay_fresh_orders(&app, ORDERS).await;
    let right_after = table.key_count();
    let pruned_by = Instant::now() + Duration::from_secs(10);
    while table.key_count() > 0 {
        assert!(
            Instant::now() < pruned_by,
            "{} keys kept",
            table.key_count()
        );
        sleep(Duration::from_millis(100)).await;
    }
    eprintln!("{ORDERS} orders paid in {took:?}; {right_after} keys in the table right after");
}

/// Redis: paying 2,000 orders — a lock key each — leaves Redis empty once their idle time
/// has passed. Bound: every key the lock service writes expires within `PAYONCE_LOCK_TTL`
/// + `PAYONCE_LOCK_IDLE` (here 1 s + 1 s) of its last use, so `DBSIZE` is at most the
/// keys used in that window — 0 once it has passed since the last payment (a fencing
/// counter per order, kept forever, without the expiry).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_keys_stay_bounded_over_many_orders() {
    let mut flags = vec!["--lock-ttl", "1s", "--lock-idle", "1s"];
    flags.extend(NO_RATE_LIMITS);
    let (app, redis) = on_private_redis(&flags).await;
    let took = pay_fresh_orders(&app, ORDERS).await;
    let mut raw = raw(&redis).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    let mut ttls = redis::pipe();
    for key in &keys {
        ttls.cmd("PTTL").arg(key);
    }
    let ttls: Vec<i64> = ttls.query_async(&mut raw).await.unwrap();
    let lasting: Vec<_> = keys
        .iter()
        .zip(&ttls)
        .filter(|(_, ttl)| **ttl == -1 || **ttl > 2_000)
        .collect();
    assert!(
        lasting.is_empty(),
        "{} of {} keys outlive a lease and the idle time, such as {:?}",
        lasting.len(),
        keys.len(),
        &lasting[..lasting.len().min(3)]
    );
    let expired_by = Instant::now() + Duration::from_secs(10);
    loop {
        let size: i64 = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
        if size == 0 {
            break;
        }
        assert!(Instant::now() < expired_by, "{size} keys kept");
        sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "{ORDERS} orders paid in {took:?}; {} keys in Redis right after",
        keys.len()
    );
}
