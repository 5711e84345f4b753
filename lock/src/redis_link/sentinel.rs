//! The master a set of Redis Sentinels names (feature `redis-sentinel`): the lock talks to
//! one server, the current master. A round trip that fails (the master died, or came back
//! as a replica and refuses writes) marks the link stale, and the next one asks the
//! sentinels again and, if they name another master, connects to it (the old connection
//! is dropped; its subscription is made again).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Client, ProtocolVersion};

use super::{Link, manager_config};
use crate::error::LockError;
use crate::open::host_urls;

/// The link to the master the sentinels of `url` name
/// (`redis-sentinel://[user:password@]host:port[,host:port…]/<master name>`), asked with
/// RESP3 and the URL's credentials, if any, for the master. Connects on first use.
/// `subscribed` is cleared when the master changes.
pub(super) fn link(
    url: &str,
    op_timeout: Duration,
    on_push: impl redis::aio::AsyncPushSender + Clone,
    subscribed: Arc<AtomicBool>,
) -> Result<Link, LockError> {
    let SentinelUrl {
        sentinels,
        master_name,
        credentials,
    } = sentinel_parts(url).map_err(LockError::Invalid)?;
    let mut master = redis::RedisConnectionInfo::default().set_protocol(ProtocolVersion::RESP3);
    if let Some((user, password)) = credentials {
        if !user.is_empty() {
            master = master.set_username(user);
        }
        master = master.set_password(password);
    }
    let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(master);
    let client = SentinelClient::build(
        sentinels,
        master_name,
        Some(node),
        SentinelServerType::Master,
    )
    .map_err(|error| LockError::Invalid(format!("bad Redis Sentinel URL: {error}")))?;
    let connect: Connect = Box::new(move |master| {
        ConnectionManager::new_lazy_with_config(master, manager_config(op_timeout, on_push.clone()))
    });
    Ok(Link::Sentinel(Arc::new(SentinelLink::new(
        client, connect, subscribed,
    ))))
}

/// Builds the connection manager for a master the sentinels named.
type Connect = Box<dyn Fn(Client) -> redis::RedisResult<ConnectionManager> + Send + Sync>;

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
    fn new(sentinels: SentinelClient, connect: Connect, subscribed: Arc<AtomicBool>) -> Self {
        Self {
            sentinels: tokio::sync::Mutex::new(sentinels),
            current: Mutex::new(None),
            stale: AtomicBool::new(false),
            connect,
            subscribed,
        }
    }

    pub(super) fn current(&self) -> Option<ConnectionManager> {
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
    pub(super) async fn discover(&self) -> redis::RedisResult<ConnectionManager> {
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

    /// A round trip failed: the master may have changed, so the next one asks first.
    pub(super) fn failed(&self) {
        self.stale.store(true, Ordering::Release);
    }
}

/// What a `redis-sentinel://` URL names.
#[derive(Debug, PartialEq, Eq)]
struct SentinelUrl {
    /// The sentinels, as `redis://` URLs.
    sentinels: Vec<String>,
    /// The name they know the master by.
    master_name: String,
    /// The master's user name (may be empty) and password, if the URL carries them.
    credentials: Option<(String, String)>,
}

/// The sentinels and the master's name from
/// `redis-sentinel://[user:password@]host:port[,host:port…]/<master name>`.
fn sentinel_parts(url: &str) -> Result<SentinelUrl, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
