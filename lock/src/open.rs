//! The one entry to the stores: [`open`] picks the backend a URL names and wraps it in a
//! [`LockService`] with the options every store takes; [`in_process`] is the same without
//! a URL. Callers that need a store's own settings (say a pool's size) open its backend
//! themselves and wrap it with [`LockService::from_arc`].

use crate::backend::LockOptions;
use crate::error::LockError;
use crate::hazelcast::HazelcastBackend;
use crate::in_process::InProcessBackend;
use crate::memcached::{MemcachedBackend, MemcachedOptions};
use crate::mysql::row::{MySqlRowBackend, MySqlRowOptions};
use crate::mysql::table::{MySqlTableBackend, MySqlTableOptions};
use crate::postgres::{PostgresBackend, PostgresOptions};
use crate::redis_backend::RedisBackend;
use crate::service::LockService;
use crate::zookeeper::ZooKeeperBackend;

/// The lock service `url` names, by its scheme, with at most `options.max_waiters` waiters
/// per key in this process:
/// - `redis://` or `rediss://` (one server), `redis-cluster://host:port[,host:port…]`
///   (any nodes of a cluster), `redis-sentinel://host:port[,host:port…]/<master name>`
///   (the sentinels): [`RedisBackend`];
/// - `zk://host:port[,host:port…][/root]`: [`ZooKeeperBackend`];
/// - `etcd://host:port[,host:port…][/root]`: `EtcdBackend` (cargo feature `etcd`);
/// - `postgres://` or `postgresql://`: [`PostgresBackend`] (advisory locks);
/// - `mysql://…/<database>`: [`MySqlTableBackend`] (a lock table);
/// - `mysql-row://…/<database>`: [`MySqlRowBackend`] (InnoDB row locks);
/// - `memcache://host:port` or `memcached://`: [`MemcachedBackend`];
/// - `hazelcast://host:port[,host:port…][/<cp-group>][?cluster=<name>]`:
///   [`HazelcastBackend`] (the CP Subsystem's FencedLock).
///
/// Connects lazily, so a store that is down at start-up shows up as
/// [`LockError::Unavailable`] on use rather than as a failure to start. Must be called
/// inside a Tokio runtime.
pub fn open(url: &str, options: &LockOptions) -> Result<LockService, LockError> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    let locks = match scheme {
        Some("redis" | "rediss" | "redis-cluster" | "redis-sentinel") => {
            LockService::new(RedisBackend::open(url, options)?)
        }
        Some("zk") => LockService::new(ZooKeeperBackend::open(url, options)?),
        Some("etcd") => etcd(url, options)?,
        Some("postgres" | "postgresql") => LockService::new(PostgresBackend::open(
            url,
            options,
            PostgresOptions::default(),
        )?),
        Some("mysql") => LockService::new(MySqlTableBackend::open(
            url,
            options,
            MySqlTableOptions::default(),
        )?),
        Some("mysql-row") => LockService::new(MySqlRowBackend::open(
            url,
            options,
            MySqlRowOptions::default(),
        )?),
        Some("memcache" | "memcached") => LockService::new(MemcachedBackend::open(
            url,
            options,
            MemcachedOptions::default(),
        )?),
        Some("hazelcast") => LockService::new(HazelcastBackend::open(url, options)?),
        _ => {
            return Err(LockError::Invalid(format!(
                "a lock URL starts with redis://, rediss://, redis-cluster://, redis-sentinel://, zk://, etcd://, postgres://, mysql://, mysql-row://, memcache:// or hazelcast://, got {:?}",
                url.split_once("://").map_or("", |(scheme, _)| scheme)
            )));
        }
    };
    Ok(locks.with_max_waiters(options.max_waiters))
}

/// Locks that live in this process only (the embedded mode: one instance), with the
/// options that mean something there: the lock-delay and the cap on waiters per key.
pub fn in_process(options: &LockOptions) -> LockService {
    LockService::new(InProcessBackend::new().with_lock_delay(options.lock_delay))
        .with_max_waiters(options.max_waiters)
}

/// etcd's lease is whole seconds, two at least: the session asked for, rounded up to that.
fn etcd(url: &str, options: &LockOptions) -> Result<LockService, LockError> {
    use std::time::Duration;
    let session = Duration::from_secs(options.session.as_secs_f64().ceil() as u64)
        .max(Duration::from_secs(2));
    let options = LockOptions {
        session,
        ..options.clone()
    };
    Ok(LockService::new(crate::etcd::EtcdBackend::open(
        url, &options,
    )?))
}
