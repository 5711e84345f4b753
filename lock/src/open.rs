//! The one entry to the stores: [`open`] picks the backend a URL names and wraps it in a
//! [`LockService`] with the options every store takes; [`in_process`] is the same without
//! a URL. Callers that need a store's own settings (say a pool's size) open its backend
//! themselves and wrap it with [`LockService::from_arc`]. [`LockServiceKind`] names the
//! service a URL asks for and the cargo feature that builds it, so a binary built without
//! it refuses the URL by name instead of failing somewhere later.

use crate::backend::LockOptions;
use crate::error::LockError;
use crate::in_process::InProcessBackend;
use crate::service::LockService;

/// A lock service a URL can name, by its scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockServiceKind {
    /// `redis://`, `rediss://`: one server.
    Redis,
    /// `redis-cluster://host:port[,host:port…]`: a Redis Cluster.
    RedisCluster,
    /// `redis-sentinel://host:port[,host:port…]/<master>`: the master Redis Sentinel names.
    RedisSentinel,
    /// `zk://`.
    ZooKeeper,
    /// `etcd://`.
    Etcd,
    /// `postgres://`, `postgresql://`: advisory locks.
    Postgres,
    /// `mysql://`: a lock table.
    MySqlTable,
    /// `mysql-row://`: InnoDB row locks.
    MySqlRow,
    /// `memcache://`, `memcached://`.
    Memcached,
    /// `hazelcast://`: the CP Subsystem's FencedLock.
    Hazelcast,
}

impl LockServiceKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [Self; 10] = [
        Self::Redis,
        Self::RedisCluster,
        Self::RedisSentinel,
        Self::ZooKeeper,
        Self::Etcd,
        Self::Postgres,
        Self::MySqlTable,
        Self::MySqlRow,
        Self::Memcached,
        Self::Hazelcast,
    ];

    /// The schemes that name a lock service, as an error lists them.
    pub const SCHEMES: &'static str = "redis://, rediss://, redis-cluster://, redis-sentinel://, zk://, etcd://, postgres://, mysql://, mysql-row://, memcache:// or hazelcast://";

    /// The service `url` names by its scheme, whether or not this build has it; `None` for
    /// a scheme that names none.
    pub fn of_scheme(url: &str) -> Option<Self> {
        Some(match scheme(url) {
            "redis" | "rediss" => Self::Redis,
            "redis-cluster" => Self::RedisCluster,
            "redis-sentinel" => Self::RedisSentinel,
            "zk" => Self::ZooKeeper,
            "etcd" => Self::Etcd,
            "postgres" | "postgresql" => Self::Postgres,
            "mysql" => Self::MySqlTable,
            "mysql-row" => Self::MySqlRow,
            "memcache" | "memcached" => Self::Memcached,
            "hazelcast" => Self::Hazelcast,
            _ => return None,
        })
    }

    /// The service `url` names by its scheme, whether or not this build has it.
    pub fn of_url(url: &str) -> Result<Self, LockError> {
        Self::of_scheme(url).ok_or_else(|| {
            LockError::Invalid(format!(
                "a lock URL starts with {}, got {:?}",
                Self::SCHEMES,
                scheme(url)
            ))
        })
    }

    /// The service's name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            Self::Redis => "Redis",
            Self::RedisCluster => "Redis Cluster",
            Self::RedisSentinel => "Redis Sentinel",
            Self::ZooKeeper => "ZooKeeper",
            Self::Etcd => "etcd",
            Self::Postgres => "PostgreSQL",
            Self::MySqlTable => "MySQL (lock table)",
            Self::MySqlRow => "MySQL (row locks)",
            Self::Memcached => "memcached",
            Self::Hazelcast => "Hazelcast",
        }
    }

    /// The service's name as a metric label (`lock_service`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::RedisCluster => "redis_cluster",
            Self::RedisSentinel => "redis_sentinel",
            Self::ZooKeeper => "zookeeper",
            Self::Etcd => "etcd",
            Self::Postgres => "postgres",
            Self::MySqlTable => "mysql_table",
            Self::MySqlRow => "mysql_row",
            Self::Memcached => "memcached",
            Self::Hazelcast => "hazelcast",
        }
    }

    /// The cargo feature (of this crate, and of the same name in `api`) that builds it.
    pub fn feature(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::RedisCluster => "redis-cluster",
            Self::RedisSentinel => "redis-sentinel",
            Self::ZooKeeper => "zookeeper",
            Self::Etcd => "etcd",
            Self::Postgres => "postgres",
            Self::MySqlTable | Self::MySqlRow => "mysql",
            Self::Memcached => "memcached",
            Self::Hazelcast => "hazelcast",
        }
    }

    /// Whether this build has the service's client.
    pub fn is_built(self) -> bool {
        match self {
            Self::Redis => cfg!(feature = "redis"),
            Self::RedisCluster => cfg!(feature = "redis-cluster"),
            Self::RedisSentinel => cfg!(feature = "redis-sentinel"),
            Self::ZooKeeper => cfg!(feature = "zookeeper"),
            Self::Etcd => cfg!(feature = "etcd"),
            Self::Postgres => cfg!(feature = "postgres"),
            Self::MySqlTable | Self::MySqlRow => cfg!(feature = "mysql"),
            Self::Memcached => cfg!(feature = "memcached"),
            Self::Hazelcast => cfg!(feature = "hazelcast"),
        }
    }

    /// The service `url` names, or why this build cannot serve it: an unknown scheme, or
    /// a service built out — the error then names the feature to build with.
    pub fn built_for(url: &str) -> Result<Self, LockError> {
        let kind = Self::of_url(url)?;
        match kind.not_built() {
            None => Ok(kind),
            Some(why) => Err(LockError::Invalid(why)),
        }
    }

    /// Why this build cannot serve the service, naming the feature to build with; `None`
    /// when it can.
    pub fn not_built(self) -> Option<String> {
        (!self.is_built()).then(|| {
            format!(
                "this build has no {name} lock service: build with `--features {feature}` (or `--features all-locks`), e.g. `cargo build --release -p api --features {feature}`",
                name = self.name(),
                feature = self.feature()
            )
        })
    }
}

/// What stands before `://` in `url` (empty when nothing does).
fn scheme(url: &str) -> &str {
    url.split_once("://").map_or("", |(scheme, _)| scheme)
}

/// The lock service `url` names, by its scheme, with at most `options.max_waiters` waiters
/// per key in this process:
/// - `redis://` or `rediss://` (one server; cargo feature `redis`),
///   `redis-cluster://host:port[,host:port…]` (any nodes of a cluster; `redis-cluster`),
///   `redis-sentinel://host:port[,host:port…]/<master name>` (the sentinels;
///   `redis-sentinel`): `RedisBackend`;
/// - `zk://host:port[,host:port…][/root]`: `ZooKeeperBackend` (feature `zookeeper`);
/// - `etcd://host:port[,host:port…][/root]`: `EtcdBackend` (feature `etcd`);
/// - `postgres://` or `postgresql://`: `PostgresBackend`, advisory locks (feature
///   `postgres`);
/// - `mysql://…/<database>`: `MySqlTableBackend`, a lock table, and
///   `mysql-row://…/<database>`: `MySqlRowBackend`, InnoDB row locks (feature `mysql`);
/// - `memcache://host:port` or `memcached://`: `MemcachedBackend` (feature `memcached`);
/// - `hazelcast://host:port[,host:port…][/<cp-group>][?cluster=<name>]`:
///   `HazelcastBackend`, the CP Subsystem's FencedLock (feature `hazelcast`).
///
/// A service this build was made without is refused ([`LockError::Invalid`], naming the
/// feature). Connects lazily, so a store that is down at start-up shows up as
/// [`LockError::Unavailable`] on use rather than as a failure to start. Must be called
/// inside a Tokio runtime.
// A build with no lock service at all has only the refusal arm below.
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "zookeeper",
        feature = "etcd",
        feature = "postgres",
        feature = "mysql",
        feature = "memcached",
        feature = "hazelcast"
    )),
    allow(unreachable_code)
)]
pub fn open(url: &str, options: &LockOptions) -> Result<LockService, LockError> {
    let locks: LockService = match LockServiceKind::built_for(url)? {
        // One backend for the three: it reads the topology from the URL.
        #[cfg(feature = "redis")]
        LockServiceKind::Redis | LockServiceKind::RedisCluster | LockServiceKind::RedisSentinel => {
            LockService::new(crate::redis_backend::RedisBackend::open(url, options)?)
        }
        #[cfg(feature = "zookeeper")]
        LockServiceKind::ZooKeeper => {
            LockService::new(crate::zookeeper::ZooKeeperBackend::open(url, options)?)
        }
        #[cfg(feature = "etcd")]
        LockServiceKind::Etcd => etcd(url, options)?,
        #[cfg(feature = "postgres")]
        LockServiceKind::Postgres => LockService::new(crate::postgres::PostgresBackend::open(
            url,
            options,
            crate::postgres::PostgresOptions::default(),
        )?),
        #[cfg(feature = "mysql")]
        LockServiceKind::MySqlTable => {
            LockService::new(crate::mysql::table::MySqlTableBackend::open(
                url,
                options,
                crate::mysql::table::MySqlTableOptions::default(),
            )?)
        }
        #[cfg(feature = "mysql")]
        LockServiceKind::MySqlRow => LockService::new(crate::mysql::row::MySqlRowBackend::open(
            url,
            options,
            crate::mysql::row::MySqlRowOptions::default(),
        )?),
        #[cfg(feature = "memcached")]
        LockServiceKind::Memcached => LockService::new(crate::memcached::MemcachedBackend::open(
            url,
            options,
            crate::memcached::MemcachedOptions::default(),
        )?),
        #[cfg(feature = "hazelcast")]
        LockServiceKind::Hazelcast => {
            LockService::new(crate::hazelcast::HazelcastBackend::open(url, options)?)
        }
        // `built_for` refused every kind this build has no arm for.
        #[allow(unreachable_patterns)]
        kind => unreachable!("{kind:?} passed built_for without being built"),
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
#[cfg(feature = "etcd")]
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

/// The servers a URL lists as `host:port[,host:port…]`, each as `prefix` (a scheme, and
/// any credentials) followed by the host; empty entries are skipped.
pub(crate) fn host_urls(hosts: &str, prefix: &str) -> Vec<String> {
    hosts
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| format!("{prefix}{host}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_names_its_service_and_feature() {
        for (url, kind, feature) in [
            ("redis://127.0.0.1:6379", LockServiceKind::Redis, "redis"),
            ("rediss://h:6380", LockServiceKind::Redis, "redis"),
            (
                "redis-cluster://h:7000,h:7001",
                LockServiceKind::RedisCluster,
                "redis-cluster",
            ),
            (
                "redis-sentinel://h:26379/m",
                LockServiceKind::RedisSentinel,
                "redis-sentinel",
            ),
            (
                "zk://h:2181/payonce",
                LockServiceKind::ZooKeeper,
                "zookeeper",
            ),
            ("etcd://h:2379", LockServiceKind::Etcd, "etcd"),
            ("postgres://u@h/db", LockServiceKind::Postgres, "postgres"),
            ("postgresql://u@h/db", LockServiceKind::Postgres, "postgres"),
            ("mysql://u@h/db", LockServiceKind::MySqlTable, "mysql"),
            ("mysql-row://u@h/db", LockServiceKind::MySqlRow, "mysql"),
            (
                "memcache://h:11211",
                LockServiceKind::Memcached,
                "memcached",
            ),
            (
                "memcached://h:11211",
                LockServiceKind::Memcached,
                "memcached",
            ),
            (
                "hazelcast://h:5701",
                LockServiceKind::Hazelcast,
                "hazelcast",
            ),
        ] {
            let found = LockServiceKind::of_url(url).expect(url);
            assert_eq!((found, found.feature()), (kind, feature), "{url}");
        }
        assert!(matches!(
            LockServiceKind::of_url("consul://h:8500"),
            Err(LockError::Invalid(message)) if message.contains("\"consul\"")
        ));
    }

    #[test]
    fn a_service_built_out_is_refused_naming_its_feature() {
        for kind in LockServiceKind::ALL {
            let url = match kind {
                LockServiceKind::Redis => "redis://127.0.0.1:1",
                LockServiceKind::RedisCluster => "redis-cluster://127.0.0.1:1",
                LockServiceKind::RedisSentinel => "redis-sentinel://127.0.0.1:1/m",
                LockServiceKind::ZooKeeper => "zk://127.0.0.1:1",
                LockServiceKind::Etcd => "etcd://127.0.0.1:1",
                LockServiceKind::Postgres => "postgres://u@127.0.0.1:1/db",
                LockServiceKind::MySqlTable => "mysql://u@127.0.0.1:1/db",
                LockServiceKind::MySqlRow => "mysql-row://u@127.0.0.1:1/db",
                LockServiceKind::Memcached => "memcache://127.0.0.1:1",
                LockServiceKind::Hazelcast => "hazelcast://127.0.0.1:1",
            };
            match LockServiceKind::built_for(url) {
                Ok(found) => assert!(found.is_built() && found == kind, "{url}"),
                Err(LockError::Invalid(message)) => {
                    assert!(!kind.is_built(), "{url}: {message}");
                    assert!(
                        message.contains(&format!("--features {}", kind.feature())),
                        "{message}"
                    );
                }
                Err(other) => panic!("{url}: {other}"),
            }
        }
    }
}
