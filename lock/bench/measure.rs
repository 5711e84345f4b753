//! Lock throughput, shared by the lock bench (`lock/examples/bench.rs`) and the lock
//! services' cost table (`api/examples/lock_costs.rs`), each of which includes this file:
//! C tasks each take a lock on a random one of K keys, hold it H, release it, and go
//! again, for S seconds; and each lock service opened with a count of the requests it
//! sends.

#![allow(dead_code)] // Each includer uses its part.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use lock::{LockOptions, LockService};
use tokio::time::Instant;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One measurement.
pub struct Run {
    /// Pairs completed (the requests-per-pair figures divide by this).
    pub pairs: u64,
    pub pairs_per_sec: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    /// Mean time a holder actually held the lock (sleep overshoot included).
    pub mean_hold_us: f64,
}

/// The load.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    pub clients: usize,
    pub keys: u64,
    pub hold: Duration,
    pub seconds: f64,
}

/// From `load.clients` tasks for `load.seconds`: `acquire(key)` a lock on a random key
/// (timed: the acquire latency), hold it `load.hold`, `release` it, and go again.
pub async fn pairs<G, A, AF, R, RF>(load: Load, acquire: A, release: R) -> Result<Run, BoxError>
where
    G: Send + 'static,
    A: Fn(String) -> AF + Clone + Send + Sync + 'static,
    AF: Future<Output = Result<G, BoxError>> + Send,
    R: Fn(G) -> RF + Clone + Send + Sync + 'static,
    RF: Future<Output = Result<(), BoxError>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let held_us = Arc::new(AtomicU64::new(0));
    let prefix = format!("bench-{:08x}", rand::random::<u32>());
    let started = Instant::now();
    let tasks: Vec<_> = (0..load.clients)
        .map(|_| {
            let (acquire, release, stop, count, held_us, prefix) = (
                acquire.clone(),
                release.clone(),
                stop.clone(),
                count.clone(),
                held_us.clone(),
                prefix.clone(),
            );
            tokio::spawn(async move {
                let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("{prefix}:{}", rand::random_range(0..load.keys));
                    let asked = Instant::now();
                    let guard = acquire(key).await?;
                    let got = Instant::now();
                    latency.saturating_record((got - asked).as_micros().max(1) as u64);
                    hold_for(load.hold).await?;
                    held_us.fetch_add(got.elapsed().as_micros() as u64, Ordering::Relaxed);
                    release(guard).await?;
                    count.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, BoxError>(latency)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(load.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for task in tasks {
        latency.add(task.await??)?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let count = count.load(Ordering::Relaxed);
    Ok(Run {
        pairs: count,
        pairs_per_sec: count as f64 / elapsed,
        p50_us: latency.value_at_quantile(0.5),
        p99_us: latency.value_at_quantile(0.99),
        mean_hold_us: held_us.load(Ordering::Relaxed) as f64 / count.max(1) as f64,
    })
}

/// A deadline far enough away that a measured acquire waits as long as it must.
pub fn patient() -> (Duration, Instant) {
    (
        Duration::from_secs(30),
        Instant::now() + Duration::from_secs(30),
    )
}

/// [`pairs`] on payonce's lock service.
pub async fn measure(locks: &LockService, load: Load) -> Result<Run, BoxError> {
    let locks = locks.clone();
    pairs(
        load,
        move |key| {
            let locks = locks.clone();
            async move {
                let (ttl, deadline) = patient();
                Ok(locks.acquire(&key, ttl, deadline).await?)
            }
        },
        |mut guard: lock::LockGuard| async move {
            guard.release().await?;
            Ok(())
        },
    )
    .await
}

/// Holds for `hold` and not much longer: Tokio's timer rounds up to whole milliseconds
/// (doubling a 1 ms hold) and a thread sleep overshoots by tens of µs, so sleep most of it
/// and spin the rest, off the runtime's threads. The bench measures the lock, not the
/// timer.
pub async fn hold_for(hold: Duration) -> Result<(), BoxError> {
    if hold.is_zero() {
        return Ok(());
    }
    tokio::task::spawn_blocking(move || {
        let until = std::time::Instant::now() + hold;
        std::thread::sleep(hold.saturating_sub(Duration::from_micros(200)));
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
    })
    .await?;
    Ok(())
}

/// Declares [`Urls`]: a field a lock service, each with its option, environment variable
/// and default URL.
macro_rules! urls {
    ($($(#[doc = $doc:tt])* $field:ident: $long:tt, $env:tt, $default:tt;)*) => {
        /// Where each lock service is: the benchmarks' command-line options (and environment).
        #[derive(clap::Args, Debug)]
        pub struct Urls {
            $(
                $(#[doc = $doc])*
                #[arg(long = $long, env = $env, default_value = $default)]
                pub $field: String,
            )*
        }
    };
}

urls! {
    redis: "redis-url", "REDIS_URL",
        "redis://127.0.0.1:6379";
    /// The Redis Cluster `scripts/services.sh` runs.
    redis_cluster: "redis-cluster-url", "REDIS_CLUSTER_URL",
        "redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002";
    zookeeper: "zookeeper-url", "ZOOKEEPER_URL",
        "zk://127.0.0.1:2181";
    etcd: "etcd-url", "ETCD_URL",
        "etcd://127.0.0.1:2379";
    /// PostgreSQL: advisory locks, and the cost table's ledger.
    postgres: "database-url", "DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/postgres";
    mysql: "mysql-url", "MYSQL_URL",
        "mysql://root@127.0.0.1:3306/payonce_locks";
    memcached: "memcached-url", "MEMCACHED_URL",
        "memcache://127.0.0.1:11211";
    /// The three Hazelcast members `scripts/services.sh` runs.
    hazelcast: "hazelcast-url", "HAZELCAST_URL",
        "hazelcast://127.0.0.1:5701,127.0.0.1:5702,127.0.0.1:5703";
}

/// A lock service and what counts its requests.
pub struct Counted {
    pub name: &'static str,
    pub locks: LockService,
    pub requests: Box<dyn Fn() -> u64 + Send + Sync>,
}

/// `backend` as service `name`, with its own count of the requests it sent.
fn counting<B: lock::LockBackend + 'static>(
    name: &'static str,
    backend: B,
    requests: fn(&B) -> u64,
) -> Counted {
    let backend = Arc::new(backend);
    let counter = backend.clone();
    Counted {
        name,
        locks: LockService::from_arc(backend),
        requests: Box::new(move || requests(&counter)),
    }
}

/// Opens the service `name` names (`redis`, `redis-cluster`, `zookeeper`, `etcd`,
/// `postgres`, `mysql`, `mysql-row`, `memcached`, `hazelcast`), with a root or namespace of
/// the run's own.
pub fn counted(name: &str, urls: &Urls) -> Result<Counted, BoxError> {
    let run = format!("bench-{:08x}", rand::random::<u32>());
    let options = LockOptions {
        namespace: run.clone(),
        ..LockOptions::default()
    };
    // ZooKeeper and etcd: a root of the run's own.
    let rooted = |base: &str| format!("{base}/payonce-bench/{run}");
    Ok(match name {
        // One backend type for both: the URL's scheme picks one server or the cluster.
        "redis" | "redis-cluster" => {
            let (name, url) = if name == "redis" {
                ("redis", &urls.redis)
            } else {
                ("redis-cluster", &urls.redis_cluster)
            };
            counting(
                name,
                lock::RedisBackend::open(url, &options)?,
                lock::RedisBackend::round_trips,
            )
        }
        "zookeeper" => counting(
            "zookeeper",
            lock::ZooKeeperBackend::open(&rooted(&urls.zookeeper), &LockOptions::default())?,
            lock::ZooKeeperBackend::requests,
        ),
        "etcd" => counting(
            "etcd",
            lock::EtcdBackend::open(&rooted(&urls.etcd), &LockOptions::default())?,
            lock::EtcdBackend::requests,
        ),
        "postgres" => counting(
            "postgres",
            lock::PostgresBackend::open(&urls.postgres, &options, Default::default())?,
            lock::PostgresBackend::requests,
        ),
        "mysql" => counting(
            "mysql",
            lock::MySqlTableBackend::open(
                &urls.mysql,
                &options,
                lock::MySqlTableOptions {
                    max_connections: 32,
                },
            )?,
            lock::MySqlTableBackend::requests,
        ),
        "memcached" => counting(
            "memcached",
            lock::MemcachedBackend::open(
                &urls.memcached,
                &options,
                lock::MemcachedOptions {
                    max_connections: 32,
                },
            )?,
            lock::MemcachedBackend::requests,
        ),
        "mysql-row" => counting(
            "mysql-row",
            lock::MySqlRowBackend::open(&urls.mysql, &options, lock::MySqlRowOptions::default())?,
            lock::MySqlRowBackend::requests,
        ),
        "hazelcast" => counting(
            "hazelcast",
            lock::HazelcastBackend::open(&urls.hazelcast, &options)?,
            lock::HazelcastBackend::requests,
        ),
        other => return Err(format!("no backend {other:?} in this build").into()),
    })
}

/// How many times the Redis server at `url` has run the `commands` (lower case, as `INFO
/// commandstats` names them: `set`, `evalsha`, …), summed.
pub async fn command_calls(url: &str, commands: &[&str]) -> Result<u64, BoxError> {
    let mut connection = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            if !commands.contains(&name) {
                return None;
            }
            stats
                .split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum())
}

/// The median (the upper one of an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
