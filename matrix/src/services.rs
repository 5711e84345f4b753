//! The lock services the matrix runs payonce on, each a private server (or three, for
//! Redlock) on free loopback ports that the matrix may restart and partition: never the
//! shared ones.

use std::collections::HashMap;
use std::time::Duration;

use ledger::testing::PrivatePostgres;
use lock::testing::{
    EtcdServer, HazelcastCluster, MariaDbServer, MemcachedServer, Proxy, RedisCluster,
    RedisSentinels, RedisServer, ZooKeeperServer,
};
use serde::Serialize;

use crate::MatrixError;

/// A lock service: a row of the matrix names the one its instances lock with. Its name
/// ([`Service::name`]) is the same in the JSON, on the command line and in the documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Service {
    /// No lock service at all (the no-lock row; its instances are the Redis ones).
    None,
    /// One Redis server: payonce's lock, and the classic recipes.
    Redis,
    /// Redlock over three independent Redis servers.
    Redlock,
    /// A Redis Cluster: three masters, each with a replica (payonce's lock only).
    RedisCluster,
    /// Redis Sentinel: one master, two replicas, three sentinels (payonce's lock only).
    RedisSentinel,
    /// A ZooKeeper server (sessions, ephemeral sequential nodes).
    ZooKeeper,
    /// An etcd member (leases, revisions).
    Etcd,
    /// A memcached server (add with expiry, a counter).
    Memcached,
    /// A MariaDB lock table (a lease row per key).
    Mysql,
    /// MariaDB row locks (`SELECT … FOR UPDATE` held in an open transaction).
    MysqlRow,
    /// PostgreSQL session-level advisory locks.
    Postgres,
    /// Hazelcast's CP Subsystem: a FencedLock per key, in a Raft group of three members.
    Hazelcast,
}

/// How long the matrix's Hazelcast cluster keeps a CP session past its last heartbeat (the
/// members' `session-time-to-live-seconds`): short, so a stall outlives it in seconds.
pub const HAZELCAST_SESSION_TTL: Duration = Duration::from_secs(2);

impl Serialize for Service {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl Service {
    /// Every service, in the table's order.
    pub const ALL: [Service; 12] = [
        Service::None,
        Service::Redis,
        Service::Redlock,
        Service::RedisCluster,
        Service::RedisSentinel,
        Service::ZooKeeper,
        Service::Etcd,
        Service::Memcached,
        Service::Mysql,
        Service::MysqlRow,
        Service::Postgres,
        Service::Hazelcast,
    ];

    /// Its name in the table and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Redis => "redis",
            Self::Redlock => "redlock",
            Self::RedisCluster => "redis-cluster",
            Self::RedisSentinel => "redis-sentinel",
            Self::ZooKeeper => "zookeeper",
            Self::Etcd => "etcd",
            Self::Memcached => "memcached",
            Self::Mysql => "mysql",
            Self::MysqlRow => "mysql-row",
            Self::Postgres => "postgres",
            Self::Hazelcast => "hazelcast",
        }
    }

    /// Parses a name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|service| service.name() == name)
    }

    /// The servers it runs on: the no-lock and Redlock rows share the Redis ones (the
    /// instances always have a lock service, and Redlock's nodes come beside Redis).
    pub fn servers(self) -> ServerKind {
        match self {
            Self::None | Self::Redis | Self::Redlock => ServerKind::Redis,
            Self::RedisCluster => ServerKind::RedisCluster,
            Self::RedisSentinel => ServerKind::RedisSentinel,
            Self::ZooKeeper => ServerKind::ZooKeeper,
            Self::Etcd => ServerKind::Etcd,
            Self::Memcached => ServerKind::Memcached,
            Self::Mysql | Self::MysqlRow => ServerKind::MariaDb,
            Self::Postgres => ServerKind::Postgres,
            Self::Hazelcast => ServerKind::Hazelcast,
        }
    }

    /// The longest a holder that stopped renewing keeps its lock when payonce's lease is
    /// `ttl`: what each service does with that lease. `None` for PostgreSQL: a session
    /// lock lasts as long as its connection, however long its holder sleeps.
    pub fn lease_bound(self, ttl: Duration) -> Option<Duration> {
        let whole_seconds = Duration::from_secs(ttl.as_secs_f64().ceil() as u64);
        match self {
            Self::None
            | Self::Redis
            | Self::Redlock
            | Self::RedisCluster
            | Self::RedisSentinel
            | Self::Mysql => Some(ttl),
            // The private server's shortest session: two ticks of 200 ms.
            Self::ZooKeeper => Some(ttl.max(Duration::from_millis(400))),
            // Leases of whole seconds, two at least.
            Self::Etcd => Some(whole_seconds.max(Duration::from_secs(2))),
            // Expiry in whole seconds, plus one for the clock's granularity.
            Self::Memcached => Some(whole_seconds + Duration::from_secs(1)),
            // The server's idle_transaction_timeout: the lease rounded up, plus one.
            Self::MysqlRow => Some(whole_seconds + Duration::from_secs(1)),
            // The cluster's session time to live, whatever payonce's lease, plus the
            // second between the group's looks for expired sessions.
            Self::Hazelcast => Some(HAZELCAST_SESSION_TTL + Duration::from_secs(1)),
            Self::Postgres => None,
        }
    }
}

/// Which private servers a service needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    /// One Redis for the locks and recipes, three for Redlock.
    Redis,
    /// A Redis Cluster of six nodes.
    RedisCluster,
    /// A master, two replicas and three sentinels.
    RedisSentinel,
    /// One ZooKeeper.
    ZooKeeper,
    /// One etcd member.
    Etcd,
    /// One memcached.
    Memcached,
    /// One MariaDB.
    MariaDb,
    /// One PostgreSQL.
    Postgres,
    /// Three Hazelcast members forming the CP Subsystem.
    Hazelcast,
}

enum Running {
    Redis {
        redis: RedisServer,
        redlock: Vec<RedisServer>,
    },
    RedisCluster(RedisCluster),
    RedisSentinel(RedisSentinels),
    ZooKeeper(ZooKeeperServer),
    Etcd(EtcdServer),
    Memcached(MemcachedServer),
    MariaDb(MariaDbServer),
    Postgres(PrivatePostgres),
    Hazelcast(HazelcastCluster),
}

/// The private servers of one [`ServerKind`], each behind a [`Proxy`] for the instance
/// the `partition` fault cuts off. Stopped when dropped.
pub struct Servers {
    kind: ServerKind,
    running: Running,
    proxies: HashMap<u16, Proxy>,
}

impl std::fmt::Debug for Servers {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Servers")
            .field("kind", &self.kind)
            .field("ports", &self.ports())
            .finish()
    }
}

fn setup(what: &str) -> impl FnOnce(std::io::Error) -> MatrixError + '_ {
    move |error| MatrixError::Setup(format!("{what}: {error}"))
}

impl Servers {
    /// Starts them and their proxies. Blocking (a ZooKeeper takes seconds), on this
    /// runtime thread: the matrix runs on a multi-threaded runtime, whose other threads
    /// carry the load's clients, which are tasks of their own.
    pub async fn start(kind: ServerKind) -> Result<Self, MatrixError> {
        let running = tokio::task::block_in_place(|| -> Result<Running, MatrixError> {
            Ok(match kind {
                ServerKind::Redis => Running::Redis {
                    redis: RedisServer::start().map_err(setup("redis-server"))?,
                    redlock: (0..3)
                        .map(|_| RedisServer::start().map_err(setup("redis-server")))
                        .collect::<Result<_, _>>()?,
                },
                ServerKind::RedisCluster => {
                    Running::RedisCluster(RedisCluster::start().map_err(setup("Redis Cluster"))?)
                }
                ServerKind::RedisSentinel => Running::RedisSentinel(
                    RedisSentinels::start().map_err(setup("Redis Sentinel"))?,
                ),
                ServerKind::ZooKeeper => {
                    Running::ZooKeeper(ZooKeeperServer::start().map_err(setup("ZooKeeper"))?)
                }
                ServerKind::Etcd => Running::Etcd(EtcdServer::start().map_err(setup("etcd"))?),
                ServerKind::Memcached => {
                    Running::Memcached(MemcachedServer::start().map_err(setup("memcached"))?)
                }
                ServerKind::MariaDb => {
                    Running::MariaDb(MariaDbServer::start().map_err(setup("MariaDB"))?)
                }
                ServerKind::Postgres => {
                    Running::Postgres(PrivatePostgres::start().map_err(setup("PostgreSQL"))?)
                }
                ServerKind::Hazelcast => Running::Hazelcast(
                    HazelcastCluster::start(HAZELCAST_SESSION_TTL).map_err(setup("Hazelcast"))?,
                ),
            })
        })?;
        let mut servers = Self {
            kind,
            running,
            proxies: HashMap::new(),
        };
        for port in servers.ports() {
            let proxy = Proxy::start(port).await.map_err(setup("proxy"))?;
            servers.proxies.insert(port, proxy);
        }
        Ok(servers)
    }

    /// Which servers these are.
    pub fn kind(&self) -> ServerKind {
        self.kind
    }

    fn ports(&self) -> Vec<u16> {
        match &self.running {
            Running::Redis { redis, redlock } => std::iter::once(redis.port())
                .chain(redlock.iter().map(RedisServer::port))
                .collect(),
            // No proxy: a cluster's nodes and the sentinels tell clients the addresses to
            // use, which a proxy in front of one would not change (`partition` does not
            // apply).
            Running::RedisCluster(_) | Running::RedisSentinel(_) => Vec::new(),
            Running::ZooKeeper(server) => vec![server.port()],
            Running::Etcd(server) => vec![server.port()],
            Running::Memcached(server) => vec![server.port()],
            Running::MariaDb(server) => vec![server.port()],
            Running::Postgres(server) => vec![server.port()],
            // Every member: the partition cuts the instance off from all three.
            Running::Hazelcast(cluster) => (0..3).map(|member| cluster.port(member)).collect(),
        }
    }

    /// The environment an instance locking with `service` gets: `PAYONCE_LOCK_URL` (and
    /// `PAYONCE_REDLOCK_URLS` beside Redis), through the proxies when `proxied`.
    pub fn environment(&self, service: Service, proxied: bool) -> Vec<(String, String)> {
        let port = |port: u16| {
            if proxied {
                self.proxies.get(&port).map_or(port, Proxy::port)
            } else {
                port
            }
        };
        let url = match (&self.running, service) {
            (Running::Redis { redis, .. }, _) => {
                format!("redis://127.0.0.1:{}", port(redis.port()))
            }
            (Running::RedisCluster(cluster), _) => cluster.url(),
            (Running::RedisSentinel(sentinels), _) => sentinels.url(),
            (Running::ZooKeeper(server), _) => {
                format!("zk://127.0.0.1:{}/payonce-matrix", port(server.port()))
            }
            (Running::Etcd(server), _) => {
                format!("etcd://127.0.0.1:{}/payonce-matrix", port(server.port()))
            }
            (Running::Memcached(server), _) => {
                format!("memcache://127.0.0.1:{}", port(server.port()))
            }
            (Running::MariaDb(server), Service::MysqlRow) => format!(
                "mysql-row://root@127.0.0.1:{}/payonce_locks",
                port(server.port())
            ),
            (Running::MariaDb(server), _) => format!(
                "mysql://root@127.0.0.1:{}/payonce_locks",
                port(server.port())
            ),
            (Running::Postgres(server), _) => format!(
                "postgres://postgres@127.0.0.1:{}/postgres",
                port(server.port())
            ),
            (Running::Hazelcast(cluster), _) => {
                let members: Vec<u16> = (0..3).map(|member| port(cluster.port(member))).collect();
                cluster.url_of(&members)
            }
        };
        let mut environment = vec![("PAYONCE_LOCK_URL".to_owned(), url)];
        if let Running::Redis { redlock, .. } = &self.running {
            let nodes: Vec<String> = redlock
                .iter()
                .map(|node| format!("redis://127.0.0.1:{}", port(node.port())))
                .collect();
            environment.push(("PAYONCE_REDLOCK_URLS".to_owned(), nodes.join(",")));
        }
        environment
    }

    /// Restarts every server, as a crash would: Redis (without persistence) and memcached
    /// come back empty; ZooKeeper, etcd, MariaDB and PostgreSQL keep what they had
    /// committed, and lose every session, connection and lock held through one. Of
    /// Hazelcast's three members one is killed and started again: the CP group goes on
    /// with the two left (a majority), and the restarted member joins as a new member —
    /// without CP persistence it is never the CP member it was. Blocking,
    /// as [`start`](Self::start) is: the load's clients go on on the other threads.
    pub async fn restart(&mut self) -> Result<(), MatrixError> {
        tokio::task::block_in_place(|| match &mut self.running {
            Running::Redis { redis, redlock } => {
                redis.restart()?;
                redlock.iter_mut().try_for_each(RedisServer::restart)
            }
            Running::RedisCluster(_) | Running::RedisSentinel(_) => Err(std::io::Error::other(
                "a replicated Redis's crash is a failover: see store-failover",
            )),
            Running::ZooKeeper(server) => server.restart(),
            Running::Etcd(server) => server.restart(),
            Running::Memcached(server) => server.restart(),
            Running::MariaDb(server) => server.restart(),
            Running::Postgres(server) => server.crash_and_restart(),
            Running::Hazelcast(cluster) => cluster.restart(0),
        })
        .map_err(setup("restarting the lock service"))
    }

    /// Whether these servers can lose a master to a replica (`store-failover`).
    pub fn fail_over_applies(kind: ServerKind) -> bool {
        matches!(kind, ServerKind::RedisCluster | ServerKind::RedisSentinel)
    }

    /// Kills a master with SIGKILL (what it had not replicated is lost), waits until its
    /// replica has taken over, then starts the killed node again, which rejoins as a
    /// replica. Returns how long the killed master's slots (behind Sentinel: the master)
    /// went unserved. Blocking, as
    /// [`start`](Self::start) is.
    pub async fn fail_over(&mut self) -> Result<Duration, MatrixError> {
        tokio::task::block_in_place(|| match &mut self.running {
            Running::RedisCluster(cluster) => {
                let victim =
                    cluster.masters()?.into_iter().next().ok_or_else(|| {
                        std::io::Error::other("the cluster has no master to kill")
                    })?;
                let unserved = cluster.fail_over(victim, Duration::from_secs(30))?;
                cluster.restart(victim)?;
                cluster.wait_until_healthy(Duration::from_secs(30))?;
                Ok(unserved)
            }
            Running::RedisSentinel(sentinels) => {
                let unserved = sentinels.fail_over(Duration::from_secs(30))?;
                sentinels.restart_killed(Duration::from_secs(30))?;
                Ok(unserved)
            }
            _ => Err(std::io::Error::other(
                "only a Redis Cluster or Redis Sentinel fails over here",
            )),
        })
        .map_err(setup("failing the lock service over"))
    }

    /// Cuts the proxied instance off from every server (see [`Proxy::cut`]).
    pub fn partition(&self) {
        self.proxies.values().for_each(Proxy::cut);
    }

    /// Ends the partition.
    pub fn heal(&self) {
        self.proxies.values().for_each(Proxy::heal);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The JSON names a service as the command line and the documents do (`zookeeper`,
    /// never serde's `zoo-keeper`), and every name parses back.
    #[test]
    fn a_service_has_one_name_everywhere() {
        for service in Service::ALL {
            assert_eq!(serde_json::to_value(service).unwrap(), service.name());
            assert_eq!(Service::parse(service.name()), Some(service));
        }
    }
}
