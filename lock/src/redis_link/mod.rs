//! The Redis the lock talks to: one server, a Redis Cluster (`cluster.rs`, feature
//! `redis-cluster`), or the master a set of Redis Sentinels names (`sentinel.rs`, feature
//! `redis-sentinel`). All carry the scripts' commands and this process's wake-up
//! subscriptions over RESP3 multiplexed connections; [`Connection`] is either kind as a
//! `redis` connection, so the scripts run the same way on all.
//!
//! In a cluster wake-ups use sharded pub/sub: a waiter's channel hashes to its lock's slot
//! ([`slot_tag`]), so the release script can `SPUBLISH` to it from the same node, and the
//! count `SPUBLISH` answers is exact (a plain `PUBLISH` in a cluster reaches every node but
//! counts only the receivers on the node it ran on).

#[cfg(feature = "redis-cluster")]
mod cluster;
#[cfg(feature = "redis-sentinel")]
mod sentinel;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "redis-cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, IntoConnectionInfo, Pipeline, ProtocolVersion, RedisFuture, Value};

use crate::error::LockError;
use crate::open::LockServiceKind;

/// Hash slots in a Redis Cluster.
const SLOTS: u16 = 16384;

/// Where the lock's commands go.
#[derive(Clone)]
pub(crate) enum Link {
    /// One server. The connection manager reconnects on failure and resubscribes.
    Server(ConnectionManager),
    /// A cluster, connected on first use.
    #[cfg(feature = "redis-cluster")]
    Cluster(Arc<cluster::ClusterLink>),
    /// The master Redis Sentinel names, found again after a failover.
    #[cfg(feature = "redis-sentinel")]
    Sentinel(Arc<sentinel::SentinelLink>),
}

impl Link {
    /// The link `url` names — `redis://` (or `rediss://`) one server, `redis-cluster://`,
    /// `redis-sentinel://` — if this build has it. Connects lazily. Pushes (wake-ups, and
    /// the news of a dropped connection) go to `on_push`; behind Sentinel, `subscribed` is
    /// cleared when the master changes.
    #[cfg_attr(not(feature = "redis-sentinel"), allow(unused_variables))]
    pub(crate) fn open(
        url: &str,
        op_timeout: Duration,
        on_push: impl redis::aio::AsyncPushSender + Clone,
        subscribed: &Arc<AtomicBool>,
    ) -> Result<Self, LockError> {
        match LockServiceKind::built_for(url)? {
            #[cfg(feature = "redis-cluster")]
            LockServiceKind::RedisCluster => cluster::link(url, op_timeout, on_push),
            #[cfg(feature = "redis-sentinel")]
            LockServiceKind::RedisSentinel => {
                sentinel::link(url, op_timeout, on_push, Arc::clone(subscribed))
            }
            _ => Ok(Self::Server(server_connection(url, op_timeout, on_push)?)),
        }
    }

    /// A connection to send on: the shared one, connected first if it is a cluster's.
    pub(crate) async fn connect(&self) -> redis::RedisResult<Connection> {
        match self {
            Self::Server(manager) => Ok(Connection::Server(manager.clone())),
            #[cfg(feature = "redis-cluster")]
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(cluster) => Ok(Connection::Cluster(cluster.connection().await?)),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(sentinel) => match sentinel.current() {
                Some(connection) => Ok(Connection::Server(connection)),
                None => Ok(Connection::Server(sentinel.discover().await?)),
            },
        }
    }

    /// A round trip through this link failed: behind Sentinel, the master may have
    /// changed, so the next round trip asks the sentinels first.
    pub(crate) fn failed(&self) {
        #[cfg(feature = "redis-sentinel")]
        if let Self::Sentinel(sentinel) = self {
            sentinel.failed();
        }
    }

    /// Whether wake-ups use sharded channels, one per slot (a cluster), or one plain
    /// channel per process (one server).
    pub(crate) fn sharded(&self) -> bool {
        #[cfg(feature = "redis-cluster")]
        return matches!(self, Self::Cluster(_));
        #[cfg(not(feature = "redis-cluster"))]
        false
    }
}

/// A connection of a [`Link`], for sending commands and scripts.
#[derive(Clone)]
pub(crate) enum Connection {
    Server(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(ClusterConnection),
}

impl Connection {
    /// Subscribes this process to `channel`: a plain channel on one server, a sharded one
    /// (routed to the master of its slot) in a cluster. Both connections resubscribe by
    /// themselves after a reconnect or a failover.
    pub(crate) async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Self::Server(manager) => manager.subscribe(channel).await,
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(cluster) => cluster.ssubscribe(channel).await,
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(manager) => manager.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(cluster) => cluster.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(manager) => manager.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(cluster) => cluster.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(manager) => manager.get_db(),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(cluster) => cluster.get_db(),
        }
    }
}

/// The connection manager for the one server at `url` (`redis://host:port/db`): RESP3, so
/// one multiplexed connection carries pub/sub pushes next to commands; connects lazily.
fn server_connection(
    url: &str,
    op_timeout: Duration,
    on_push: impl redis::aio::AsyncPushSender,
) -> Result<ConnectionManager, LockError> {
    let info = url
        .into_connection_info()
        .map_err(|error| LockError::Invalid(format!("bad Redis URL: {error}")))?;
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let client = Client::open(info.set_redis_settings(settings))
        .map_err(|error| LockError::Invalid(format!("bad Redis URL: {error}")))?;
    ConnectionManager::new_lazy_with_config(client, manager_config(op_timeout, on_push))
        .map_err(|error| LockError::Invalid(format!("Redis client: {error}")))
}

/// How a connection manager to one server connects, answers, reconnects and hands pub/sub
/// pushes on.
fn manager_config(
    op_timeout: Duration,
    on_push: impl redis::aio::AsyncPushSender,
) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(op_timeout))
        .set_response_timeout(Some(op_timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(op_timeout)
        .set_push_sender(on_push)
        .set_automatic_resubscription()
}

/// The hash slot of `key`, by Redis Cluster's rule: CRC16 of the hash tag (what stands
/// between the first `{` and the next `}`, if that is not empty), else of the whole key.
pub(crate) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&byte| byte == b'{')
        .and_then(|open| {
            let after = &bytes[open + 1..];
            let close = after.iter().position(|&byte| byte == b'}')?;
            (close > 0).then(|| &after[..close])
        })
        .unwrap_or(bytes);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % SLOTS
}

/// A short hash tag that hashes to `slot`: a waiter's wake-up channel carries the tag of
/// its lock's slot, so the script that hands it the lock can publish to it.
pub(crate) fn slot_tag(wanted: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        // Numbers in turn until every slot has one: about 170,000 CRCs, a few ms, once.
        let mut tags = vec![String::new(); usize::from(SLOTS)];
        let mut missing = usize::from(SLOTS);
        let mut candidate = 0_u32;
        while missing > 0 {
            let tag = candidate.to_string();
            let found = &mut tags[usize::from(slot(&tag))];
            if found.is_empty() {
                *found = tag;
                missing -= 1;
            }
            candidate += 1;
        }
        tags
    });
    &tags[usize::from(wanted % SLOTS)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_redis_cluster_hash_tags() {
        // Values `CLUSTER KEYSLOT` answers.
        assert_eq!(slot("k1"), 12706);
        assert_eq!(slot("ns:lock:{k1}"), 12706);
        assert_eq!(slot("ns:wake:{k1}:abc"), 12706);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{}foo"), slot("{}foo"));
        assert_ne!(
            slot("{}foo"),
            slot("foo"),
            "an empty tag hashes the whole key"
        );
    }

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        for wanted in [0, 1, 12706, SLOTS - 1] {
            assert_eq!(slot(slot_tag(wanted)), wanted);
            assert_eq!(
                slot(&format!("ns:wake:{{{}}}:abc", slot_tag(wanted))),
                wanted
            );
        }
    }
}
