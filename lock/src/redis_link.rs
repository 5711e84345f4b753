//! The Redis the lock talks to: one server, or a Redis Cluster. Both carry the scripts'
//! commands and this process's wake-up subscriptions over RESP3 multiplexed connections;
//! [`Connection`] is either one as a `redis` connection, so the scripts run the same way
//! on both.
//!
//! In a cluster every script touches the keys of one lock, which share a hash slot (their
//! names carry the lock key as a hash tag), so a script runs on the slot's master; the
//! cluster client follows MOVED and ASK redirections and refreshes its slot map after a
//! failover or a resharding. Wake-ups use sharded pub/sub: a waiter's channel hashes to
//! its lock's slot ([`slot_tag`]), so the release script can `SPUBLISH` to it from the
//! same node, and the count `SPUBLISH` answers is exact (a plain `PUBLISH` in a cluster
//! reaches every node but counts only the receivers on the node it ran on).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tokio::sync::OnceCell;

/// Hash slots in a Redis Cluster.
const SLOTS: u16 = 16384;

/// Where the lock's commands go.
#[derive(Clone)]
pub(crate) enum Link {
    /// One server. The connection manager reconnects on failure and resubscribes.
    Server(ConnectionManager),
    /// A cluster. Its client connects to every master it needs, so the connection is made
    /// on first use (a lock store that is down at start-up is a 503 later, not a refusal
    /// to start), then shared.
    Cluster(Arc<ClusterLink>),
}

pub(crate) struct ClusterLink {
    pub(crate) client: ClusterClient,
    pub(crate) connection: OnceCell<ClusterConnection>,
}

impl Link {
    /// A connection to send on: the shared one, connected first if it is a cluster's.
    pub(crate) async fn connect(&self) -> redis::RedisResult<Connection> {
        match self {
            Self::Server(manager) => Ok(Connection::Server(manager.clone())),
            Self::Cluster(cluster) => {
                let connection = cluster
                    .connection
                    .get_or_try_init(|| cluster.client.get_async_connection())
                    .await?;
                Ok(Connection::Cluster(connection.clone()))
            }
        }
    }

    /// Whether wake-ups use sharded channels, one per slot (a cluster), or one plain
    /// channel per process (one server).
    pub(crate) fn sharded(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }
}

/// A connection of a [`Link`], for sending commands and scripts.
#[derive(Clone)]
pub(crate) enum Connection {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    /// Subscribes this process to `channel`: a plain channel on one server, a sharded one
    /// (routed to the master of its slot) in a cluster. Both connections resubscribe by
    /// themselves after a reconnect or a failover.
    pub(crate) async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Self::Server(manager) => manager.subscribe(channel).await,
            Self::Cluster(cluster) => cluster.ssubscribe(channel).await,
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(manager) => manager.req_packed_command(cmd),
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
            Self::Cluster(cluster) => cluster.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(manager) => manager.get_db(),
            Self::Cluster(cluster) => cluster.get_db(),
        }
    }
}

/// The cluster's nodes from `redis-cluster://[user:password@]host:port[,host:port…]`, as
/// `redis://` URLs the cluster client starts from (it finds the rest of the cluster from
/// any one of them).
pub(crate) fn cluster_nodes(url: &str) -> Result<Vec<String>, String> {
    let rest = url
        .strip_prefix("redis-cluster://")
        .ok_or_else(|| format!("{url:?} is not a redis-cluster:// URL"))?;
    let (credentials, hosts) = match rest.rsplit_once('@') {
        Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
        None => (String::new(), rest),
    };
    let hosts = hosts.trim_end_matches('/');
    if hosts.contains('/') {
        return Err("a Redis Cluster has one database: no /<db> in a redis-cluster:// URL".into());
    }
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| format!("redis://{credentials}{host}"))
        .collect();
    if nodes.is_empty() {
        return Err(format!("{url:?} names no cluster node"));
    }
    Ok(nodes)
}

/// The cluster client for `nodes`: RESP3 (pub/sub pushes share the connections with the
/// commands), every connect and answer bounded by `op_timeout`.
pub(crate) fn cluster_client(
    nodes: &[String],
    op_timeout: Duration,
    push: impl redis::aio::AsyncPushSender,
) -> redis::RedisResult<ClusterClient> {
    ClusterClient::builder(nodes.iter().map(String::as_str))
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(push)
        .connection_timeout(op_timeout)
        .response_timeout(op_timeout)
        .build()
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

    #[test]
    fn cluster_urls_name_their_nodes() {
        assert_eq!(
            cluster_nodes("redis-cluster://127.0.0.1:7000,127.0.0.1:7001").unwrap(),
            ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]
        );
        assert_eq!(
            cluster_nodes("redis-cluster://:secret@10.0.0.1:7000/").unwrap(),
            ["redis://:secret@10.0.0.1:7000"]
        );
        assert!(cluster_nodes("redis-cluster://127.0.0.1:7000/3").is_err());
        assert!(cluster_nodes("redis-cluster://").is_err());
        assert!(cluster_nodes("redis://127.0.0.1:7000").is_err());
    }
}
