//! The Redis the lock talks to: one server, a Redis Cluster, or the master a set of Redis
//! Sentinels names. All carry the scripts' commands and this process's wake-up
//! subscriptions over RESP3 multiplexed connections; [`Connection`] is either kind as a
//! `redis` connection, so the scripts run the same way on all.
//!
//! Behind Sentinel the lock talks to one server, the current master; a round trip that
//! fails (the master died, or came back as a replica and refuses writes) marks the link
//! stale, and the next one asks the sentinels again and, if they name another master,
//! connects to it (the old connection is dropped; its subscription is made again).
//!
//! In a cluster every script touches the keys of one lock, which share a hash slot (their
//! names carry the lock key as a hash tag), so a script runs on the slot's master; the
//! cluster client follows MOVED and ASK redirections and refreshes its slot map after a
//! failover or a resharding. Wake-ups use sharded pub/sub: a waiter's channel hashes to
//! its lock's slot ([`slot_tag`]), so the release script can `SPUBLISH` to it from the
//! same node, and the count `SPUBLISH` answers is exact (a plain `PUBLISH` in a cluster
//! reaches every node but counts only the receivers on the node it ran on).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{Client, Cmd, Pipeline, RedisFuture, Value};
use tokio::sync::OnceCell;

use crate::open::host_urls;

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
    /// The master Redis Sentinel names, found again after a failover.
    Sentinel(Arc<SentinelLink>),
}

pub(crate) struct ClusterLink {
    pub(crate) client: ClusterClient,
    pub(crate) connection: OnceCell<ClusterConnection>,
}

/// Builds the connection manager for a master the sentinels named.
pub(crate) type Connect =
    Box<dyn Fn(Client) -> redis::RedisResult<ConnectionManager> + Send + Sync>;

pub(crate) struct SentinelLink {
    /// Asks the sentinels; one question at a time.
    sentinels: tokio::sync::Mutex<SentinelClient>,
    /// The master found last, and the connection to it.
    current: Mutex<Option<(String, ConnectionManager)>>,
    /// Set when a round trip failed: the next connect asks the sentinels again.
    stale: AtomicBool,
    connect: Connect,
    /// Cleared when the master changes: the new connection is subscribed to nothing yet.
    subscribed: Arc<AtomicBool>,
}

impl SentinelLink {
    pub(crate) fn new(
        sentinels: SentinelClient,
        connect: Connect,
        subscribed: Arc<AtomicBool>,
    ) -> Self {
        Self {
            sentinels: tokio::sync::Mutex::new(sentinels),
            current: Mutex::new(None),
            stale: AtomicBool::new(false),
            connect,
            subscribed,
        }
    }

    fn current(&self) -> Option<ConnectionManager> {
        if self.stale.load(Ordering::Acquire) {
            return None;
        }
        let current = self
            .current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        current.as_ref().map(|(_, connection)| connection.clone())
    }

    /// The master the sentinels name now: the same connection if it has not changed, a
    /// new one if it has.
    async fn discover(&self) -> redis::RedisResult<ConnectionManager> {
        let mut sentinels = self.sentinels.lock().await;
        // Another caller may have asked while this one waited for its turn.
        if let Some(connection) = self.current() {
            return Ok(connection);
        }
        let master = sentinels.async_get_client().await?;
        let address = master.get_connection_info().addr().to_string();
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let connection = match current.as_ref() {
            Some((known, connection)) if *known == address => connection.clone(),
            _ => {
                let connection = (self.connect)(master)?;
                if current.is_some() {
                    tracing::warn!(master = %address, "Redis Sentinel named a new master");
                }
                *current = Some((address, connection.clone()));
                self.subscribed.store(false, Ordering::Release);
                connection
            }
        };
        self.stale.store(false, Ordering::Release);
        Ok(connection)
    }
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
            Self::Sentinel(sentinel) => match sentinel.current() {
                Some(connection) => Ok(Connection::Server(connection)),
                None => Ok(Connection::Server(sentinel.discover().await?)),
            },
        }
    }

    /// A round trip through this link failed: behind Sentinel, the master may have
    /// changed, so the next round trip asks the sentinels first.
    pub(crate) fn failed(&self) {
        if let Self::Sentinel(sentinel) = self {
            sentinel.stale.store(true, Ordering::Release);
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
    let nodes = host_urls(hosts, &format!("redis://{credentials}"));
    if nodes.is_empty() {
        return Err(format!("{url:?} names no cluster node"));
    }
    Ok(nodes)
}

/// What a `redis-sentinel://` URL names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// The sentinels, as `redis://` URLs.
    pub sentinels: Vec<String>,
    /// The name they know the master by.
    pub master_name: String,
    /// The master's user name (may be empty) and password, if the URL carries them.
    pub credentials: Option<(String, String)>,
}

/// The sentinels and the master's name from
/// `redis-sentinel://[user:password@]host:port[,host:port…]/<master name>`.
pub(crate) fn sentinel_parts(url: &str) -> Result<SentinelUrl, String> {
    let rest = url
        .strip_prefix("redis-sentinel://")
        .ok_or_else(|| format!("{url:?} is not a redis-sentinel:// URL"))?;
    let (hosts, name) = rest
        .split_once('/')
        .filter(|(_, name)| !name.is_empty() && !name.contains('/'))
        .ok_or_else(|| format!("{url:?} names no master: redis-sentinel://host:port[,…]/<name>"))?;
    let (credentials, hosts) = match hosts.rsplit_once('@') {
        Some((credentials, hosts)) => {
            let (user, password) = credentials.split_once(':').unwrap_or(("", credentials));
            (Some((user.to_owned(), password.to_owned())), hosts)
        }
        None => (None, hosts),
    };
    let sentinels = host_urls(hosts, "redis://");
    if sentinels.is_empty() {
        return Err(format!("{url:?} names no sentinel"));
    }
    Ok(SentinelUrl {
        sentinels,
        master_name: name.to_owned(),
        credentials,
    })
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
    fn sentinel_urls_name_their_sentinels_and_master() {
        let parts =
            sentinel_parts("redis-sentinel://127.0.0.1:26379,127.0.0.1:26380/payonce").unwrap();
        assert_eq!(
            parts.sentinels,
            ["redis://127.0.0.1:26379", "redis://127.0.0.1:26380"]
        );
        assert_eq!(parts.master_name, "payonce");
        assert_eq!(parts.credentials, None);
        let parts = sentinel_parts("redis-sentinel://app:secret@10.0.0.1:26379/main").unwrap();
        assert_eq!(parts.credentials, Some(("app".into(), "secret".into())));
        assert!(sentinel_parts("redis-sentinel://127.0.0.1:26379").is_err());
        assert!(sentinel_parts("redis-sentinel://127.0.0.1:26379/").is_err());
        assert!(sentinel_parts("redis-sentinel:///payonce").is_err());
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
