//! Redlock: one lock over N independent Redis servers, held when a majority granted it.
//!
//! Acquire sets `SET key token NX PX ttl` on every node (each bounded by a short timeout),
//! and holds the lock if at least N/2+1 nodes granted it and time is left:
//! validity = TTL − elapsed − drift, drift = 0.01·TTL + 2 ms. Otherwise it releases on
//! every node and retries after a random delay until the deadline. Release is a
//! compare-and-delete on every node.
//!
//! What it promises: while the validity lasts, and while clocks run at about the same rate
//! and processes do not pause, no other client holds a majority. What it does not: it
//! hands out no fencing token, so a holder that paused past its validity cannot be told
//! apart from the current one by whatever it writes to. payonce's demonstration shows that
//! case.

use std::fmt;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionManager;
use tokio::time::{Instant, sleep, timeout};

use crate::error::LockError;
use crate::token::OwnerToken;

const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// A lock held on a majority of nodes.
#[derive(Debug, Clone)]
pub struct RedlockGuard {
    /// The key on every node.
    pub key: String,
    /// The owner token written on every node.
    pub token: String,
    /// How many nodes granted it.
    pub granted: usize,
    /// When the lock stops being safe to rely on, by the holder's monotonic clock.
    pub valid_until: Instant,
}

/// Redlock over independent Redis servers.
pub struct Redlock {
    nodes: Vec<ConnectionManager>,
    namespace: String,
    release: Script,
    /// Bound on one node's answer: a dead node must not eat the validity.
    node_timeout: Duration,
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("nodes", &self.nodes.len())
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Redlock {
    /// Redlock over these nodes (at least 3, independent servers); keys are
    /// `<namespace>:redlock:<key>`. Connects lazily.
    pub fn open(urls: &[String], namespace: &str) -> Result<Self, LockError> {
        if urls.len() < 3 {
            return Err(LockError::Invalid(format!(
                "Redlock needs at least 3 nodes, got {}",
                urls.len()
            )));
        }
        let nodes = urls
            .iter()
            .map(|url| {
                let client = redis::Client::open(url.as_str())
                    .map_err(|error| LockError::Invalid(format!("bad Redis URL {url}: {error}")))?;
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_millis(200)))
                    .set_response_timeout(Some(Duration::from_millis(200)))
                    .set_number_of_retries(0);
                ConnectionManager::new_lazy_with_config(client, config)
                    .map_err(|error| LockError::Invalid(format!("Redis client: {error}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            nodes,
            namespace: namespace.to_owned(),
            release: Script::new(RELEASE),
            node_timeout: Duration::from_millis(50),
        })
    }

    /// The majority: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Takes the lock on a majority, retrying until `deadline`.
    pub async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<RedlockGuard, LockError> {
        let started = Instant::now();
        let store_key = format!("{}:redlock:{key}", self.namespace);
        let token = OwnerToken::random().to_hex();
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let drift = ttl / 100 + Duration::from_millis(2);
        let mut reachable = false;
        loop {
            let attempt = Instant::now();
            let grants = futures::future::join_all(self.nodes.iter().map(|node| {
                let mut node = node.clone();
                let command = redis::cmd("SET")
                    .arg(&store_key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(&ttl_ms)
                    .to_owned();
                let limit = self.node_timeout;
                async move {
                    match timeout(limit, command.query_async::<Option<String>>(&mut node)).await {
                        Ok(Ok(answer)) => Some(answer.is_some()),
                        _ => None,
                    }
                }
            }))
            .await;
            reachable |= grants.iter().filter(|grant| grant.is_some()).count() >= self.quorum();
            let granted = grants.iter().filter(|grant| **grant == Some(true)).count();
            let elapsed = attempt.elapsed();
            if granted >= self.quorum() && ttl > elapsed + drift {
                return Ok(RedlockGuard {
                    key: store_key,
                    token,
                    granted,
                    valid_until: attempt + ttl - drift,
                });
            }
            let guard = RedlockGuard {
                key: store_key.clone(),
                token: token.clone(),
                granted,
                valid_until: attempt,
            };
            self.release(&guard).await;
            let pause = Duration::from_millis(rand::random_range(5..25));
            if Instant::now() + pause >= deadline {
                return Err(if reachable {
                    LockError::TimedOut {
                        key: key.to_owned(),
                        waited: started.elapsed(),
                    }
                } else {
                    LockError::unavailable(format!(
                        "fewer than {} of {} Redlock nodes answer",
                        self.quorum(),
                        self.nodes.len()
                    ))
                });
            }
            sleep(pause).await;
        }
    }

    /// Compare-and-delete on every node; nodes that do not answer are skipped.
    pub async fn release(&self, guard: &RedlockGuard) {
        futures::future::join_all(self.nodes.iter().map(|node| {
            let mut node = node.clone();
            let mut invocation = self.release.prepare_invoke();
            invocation.key(&guard.key).arg(&guard.token);
            let limit = self.node_timeout;
            async move {
                let _ = timeout(limit, invocation.invoke_async::<i64>(&mut node)).await;
            }
        }))
        .await;
    }
}
