//! The classic lock recipes that fail, kept so payonce can show *how* they fail (the
//! lock services × faults demonstration). **Never use these to protect anything.**
//!
//! - [`SetnxExpire`]: `SETNX` then `EXPIRE` as two commands, released with a bare `DEL`. A
//!   crash between the two commands leaves a lock that never expires; a holder that
//!   outlived its TTL deletes its successor's lock.
//! - [`GetSetTimestamp`]: the lock's value is its expiry time; a waiter that reads an
//!   expiry in the past takes the lock over with `GETSET`. It trusts that every client's
//!   clock agrees: one whose clock runs ahead steals live locks.
//!
//! Neither hands out fencing tokens, waits in line, or renews: waiters poll. The plain
//! `SET NX PX` lock without fencing is payonce's own [`RedisBackend`](crate::RedisBackend)
//! with its token ignored; [`Redlock`](crate::Redlock) is in `redlock.rs`.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use tokio::time::{Instant, sleep, timeout_at};

use crate::error::LockError;
use crate::token::OwnerToken;

/// How long a polling waiter sleeps between attempts.
const POLL: Duration = Duration::from_millis(5);

/// A lock held through one of the recipes.
#[derive(Debug, Clone)]
pub struct RecipeGuard {
    /// The store key.
    pub key: String,
    /// What the holder wrote (its token, or its expiry timestamp).
    pub value: String,
}

/// A lock recipe: acquire by polling until the deadline, release.
#[async_trait]
pub trait Recipe: Send + Sync + fmt::Debug + 'static {
    /// Takes the lock, polling until `deadline`. `clock_offset_ms` skews this client's
    /// wall clock (only the timestamp recipe reads one).
    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
        clock_offset_ms: i64,
    ) -> Result<RecipeGuard, LockError>;

    /// Releases the lock the way the recipe does.
    async fn release(&self, guard: &RecipeGuard, clock_offset_ms: i64) -> Result<(), LockError>;
}

fn timed_out(key: &str, started: Instant) -> LockError {
    LockError::TimedOut {
        key: key.to_owned(),
        waited: started.elapsed(),
    }
}

async fn query<T: redis::FromRedisValue>(
    connection: &ConnectionManager,
    command: &redis::Cmd,
    limit: Instant,
) -> Result<T, LockError> {
    let mut connection = connection.clone();
    let limit = limit.max(Instant::now() + Duration::from_millis(50));
    match timeout_at(limit, command.query_async(&mut connection)).await {
        Ok(result) => result.map_err(LockError::from),
        Err(_) => Err(LockError::unavailable("Redis did not answer in time")),
    }
}

fn connect(url: &str) -> Result<ConnectionManager, LockError> {
    let client = redis::Client::open(url)
        .map_err(|error| LockError::Invalid(format!("bad Redis URL: {error}")))?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(1)))
        .set_number_of_retries(1);
    ConnectionManager::new_lazy_with_config(client, config)
        .map_err(|error| LockError::Invalid(format!("Redis client: {error}")))
}

/// A Redis connection and the namespace the recipes' keys live under.
struct Store {
    connection: ConnectionManager,
    namespace: String,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Store {
    fn open(url: &str, namespace: &str) -> Result<Self, LockError> {
        Ok(Self {
            connection: connect(url)?,
            namespace: namespace.to_owned(),
        })
    }

    /// `<namespace>:<recipe>:<key>`.
    fn key(&self, recipe: &str, key: &str) -> String {
        format!("{}:{recipe}:{key}", self.namespace)
    }
}

/// `SETNX key token` then `EXPIRE key ttl`, two round trips; release is `DEL key`.
#[derive(Debug)]
pub struct SetnxExpire(Store);

impl SetnxExpire {
    /// The recipe on the Redis at `url`; keys are `<namespace>:setnx:<key>`.
    pub fn open(url: &str, namespace: &str) -> Result<Self, LockError> {
        Store::open(url, namespace).map(Self)
    }

    /// What a holder that crashes between the recipe's two commands leaves behind: the
    /// `SETNX` ran, the `EXPIRE` never did. Returns whether the `SETNX` took the key. For
    /// demonstrations: it shows the lock that never expires.
    pub async fn setnx_then_crash(&self, key: &str, deadline: Instant) -> Result<bool, LockError> {
        let set: i64 = query(
            &self.0.connection,
            redis::cmd("SETNX")
                .arg(self.0.key("setnx", key))
                .arg(OwnerToken::random().to_hex()),
            deadline,
        )
        .await?;
        Ok(set == 1)
    }
}

#[async_trait]
impl Recipe for SetnxExpire {
    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
        _clock_offset_ms: i64,
    ) -> Result<RecipeGuard, LockError> {
        let started = Instant::now();
        let store_key = self.0.key("setnx", key);
        let token = OwnerToken::random().to_hex();
        loop {
            let set: i64 = query(
                &self.0.connection,
                redis::cmd("SETNX").arg(&store_key).arg(&token),
                deadline,
            )
            .await?;
            if set == 1 {
                // The gap this recipe is known for: crash here and the key never expires.
                let seconds = ttl.as_secs().max(1);
                let _: i64 = query(
                    &self.0.connection,
                    redis::cmd("EXPIRE").arg(&store_key).arg(seconds),
                    deadline,
                )
                .await?;
                return Ok(RecipeGuard {
                    key: store_key,
                    value: token,
                });
            }
            if Instant::now() + POLL >= deadline {
                return Err(timed_out(key, started));
            }
            sleep(POLL).await;
        }
    }

    async fn release(&self, guard: &RecipeGuard, _clock_offset_ms: i64) -> Result<(), LockError> {
        // Deletes whatever is there, the successor's lock included.
        let _: i64 = query(
            &self.0.connection,
            redis::cmd("DEL").arg(&guard.key),
            Instant::now() + Duration::from_secs(1),
        )
        .await?;
        Ok(())
    }
}

/// The timestamp lock: the value is the holder's expiry (ms since the epoch, by the
/// holder's clock); an expired-looking lock is taken over with `GETSET`.
#[derive(Debug)]
pub struct GetSetTimestamp(Store);

impl GetSetTimestamp {
    /// The recipe on the Redis at `url`; keys are `<namespace>:getset:<key>`.
    pub fn open(url: &str, namespace: &str) -> Result<Self, LockError> {
        Store::open(url, namespace).map(Self)
    }
}

/// This client's idea of the time, in ms since the epoch, skewed by `offset_ms`.
fn wall_clock_ms(offset_ms: i64) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        });
    now.saturating_add(offset_ms)
}

#[async_trait]
impl Recipe for GetSetTimestamp {
    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
        clock_offset_ms: i64,
    ) -> Result<RecipeGuard, LockError> {
        let started = Instant::now();
        let store_key = self.0.key("getset", key);
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        loop {
            let now = wall_clock_ms(clock_offset_ms);
            let expires = (now + ttl_ms + 1).to_string();
            let set: i64 = query(
                &self.0.connection,
                redis::cmd("SETNX").arg(&store_key).arg(&expires),
                deadline,
            )
            .await?;
            if set == 1 {
                return Ok(RecipeGuard {
                    key: store_key,
                    value: expires,
                });
            }
            let current: Option<i64> = query(
                &self.0.connection,
                redis::cmd("GET").arg(&store_key),
                deadline,
            )
            .await?;
            if current.is_some_and(|current| current < now) {
                // Looks expired by our clock: take it over, unless someone beat us to it.
                let previous: Option<i64> = query(
                    &self.0.connection,
                    redis::cmd("GETSET").arg(&store_key).arg(&expires),
                    deadline,
                )
                .await?;
                if previous.is_none_or(|previous| previous < now) {
                    return Ok(RecipeGuard {
                        key: store_key,
                        value: expires,
                    });
                }
            }
            if Instant::now() + POLL >= deadline {
                return Err(timed_out(key, started));
            }
            sleep(POLL).await;
        }
    }

    async fn release(&self, guard: &RecipeGuard, clock_offset_ms: i64) -> Result<(), LockError> {
        // The recipe: delete only if our own expiry has not passed (by our clock).
        let expires: i64 = guard.value.parse().unwrap_or(0);
        if wall_clock_ms(clock_offset_ms) < expires {
            let _: i64 = query(
                &self.0.connection,
                redis::cmd("DEL").arg(&guard.key),
                Instant::now() + Duration::from_secs(1),
            )
            .await?;
        }
        Ok(())
    }
}
