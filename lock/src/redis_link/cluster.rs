//! A Redis Cluster (feature `redis-cluster`). Every script touches the keys of one lock,
//! which share a hash slot (their names carry the lock key as a hash tag), so a script
//! runs on the slot's master; the cluster client follows MOVED and ASK redirections and
//! refreshes its slot map after a failover or a resharding.

use std::sync::Arc;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use tokio::sync::OnceCell;

use super::Link;
use crate::error::LockError;
use crate::open::host_urls;

pub(crate) struct ClusterLink {
    client: ClusterClient,
    connection: OnceCell<ClusterConnection>,
}

impl ClusterLink {
    /// The shared connection, made on first use: the client connects to every master it
    /// needs, so a cluster that is down at start-up is a 503 later, not a refusal to start.
    pub(super) async fn connection(&self) -> redis::RedisResult<ClusterConnection> {
        let connection = self
            .connection
            .get_or_try_init(|| self.client.get_async_connection())
            .await?;
        Ok(connection.clone())
    }
}

/// The link to the cluster `url` names (`redis-cluster://[user:password@]host:port[,…]`,
/// any of its nodes).
pub(super) fn link(
    url: &str,
    op_timeout: Duration,
    push: impl redis::aio::AsyncPushSender,
) -> Result<Link, LockError> {
    let nodes = cluster_nodes(url).map_err(LockError::Invalid)?;
    let client = cluster_client(&nodes, op_timeout, push)
        .map_err(|error| LockError::Invalid(format!("bad Redis Cluster URL: {error}")))?;
    Ok(Link::Cluster(Arc::new(ClusterLink {
        client,
        connection: OnceCell::new(),
    })))
}

/// The cluster's nodes from `redis-cluster://[user:password@]host:port[,host:port…]`, as
/// `redis://` URLs the cluster client starts from (it finds the rest of the cluster from
/// any one of them).
fn cluster_nodes(url: &str) -> Result<Vec<String>, String> {
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

/// The cluster client for `nodes`: RESP3 (pub/sub pushes share the connections with the
/// commands), every connect and answer bounded by `op_timeout`.
fn cluster_client(
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

#[cfg(test)]
mod tests {
    use super::*;

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
