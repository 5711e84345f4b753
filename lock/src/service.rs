//! The seam between callers and lock stores: [`LockBackend`] is what a store implements,
//! [`LockService`] is what callers hold.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::in_process::InProcessBackend;
use crate::redis_backend::{RedisBackend, RedisOptions};
use crate::token::{FencingToken, OwnerToken};
use crate::zookeeper::{ZooKeeperBackend, ZooKeeperOptions};

/// The shortest lease a backend accepts. The watchdog renews at a third of the TTL; below a
/// few milliseconds that is a busy loop, not a lease.
pub const MIN_TTL: Duration = Duration::from_millis(3);

/// The longest lease a backend accepts: a day. A lock held longer is a bug, and deadlines
/// computed from an unbounded TTL would overflow.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// One grant of a lock: what release and extend need, and what the holder shows to the
/// store it writes to (the fencing token).
#[derive(Clone, Debug)]
pub struct Lease {
    key: String,
    owner: OwnerToken,
    fencing: FencingToken,
    ttl: Duration,
    /// Local time no later than the moment the store granted the lease, so that
    /// `acquired_at + ttl` never overestimates how long we hold it.
    acquired_at: Instant,
}

impl Lease {
    /// Assembles a lease. Backends call this on a grant; tests use it to impersonate a
    /// holder (the store checks the owner token, not how the lease was made).
    pub fn new(
        key: impl Into<String>,
        owner: OwnerToken,
        fencing: FencingToken,
        ttl: Duration,
        acquired_at: Instant,
    ) -> Self {
        Self {
            key: key.into(),
            owner,
            fencing,
            ttl,
            acquired_at,
        }
    }

    /// The locked key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// This grant's owner token.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// This grant's fencing token.
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing
    }

    /// The lease length asked for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A local instant no later than the grant.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }
}

/// What a lease is bound to in a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sessions {
    /// Each grant has a TTL of its own, renewed by the guard's watchdog (Redis, in
    /// process): a holder that stops renewing loses the lock when its TTL runs out.
    PerGrant,
    /// Every grant of the process rides on one session (ZooKeeper) or lease (etcd) that
    /// the client keeps alive for the whole process: a lock is released when the session
    /// ends — closed, or `timeout` after the process stopped heartbeating — not when a
    /// grant's TTL runs out while the process lives.
    PerProcess {
        /// How long after the last heartbeat the store ends the session.
        timeout: Duration,
    },
    /// Every grant holds a connection of its own (PostgreSQL advisory locks): the lock is
    /// released when that connection ends — the holder's process ended, or the server or
    /// the network dropped it — never by a TTL while it lives.
    PerConnection,
}

/// A lock store. Every method is one atomic step on the store; waiting, when a method
/// waits, sleeps until woken (never polls faster than the holder's lease runs out).
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// Takes the lock if it is free and nobody is queued for it; never waits. `note` says
    /// what the holder will be doing (see [`holder_note`](Self::holder_note)); may be empty.
    async fn try_acquire(
        &self,
        key: &str,
        ttl: Duration,
        note: &str,
    ) -> Result<Option<Lease>, LockError>;

    /// Takes the lock, queueing behind earlier waiters until it is handed over or the
    /// deadline passes ([`LockError::TimedOut`]).
    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
        note: &str,
    ) -> Result<Lease, LockError>;

    /// The note of the lock's current holder, or `None` when it is free. Lets a waiter
    /// that gave up say what it was waiting behind.
    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError>;

    /// Deletes the lock if `lease` still holds it and hands it to the next waiter. Returns
    /// whether it was still held. Safe to repeat; never touches another holder's lock.
    async fn release(&self, lease: &Lease) -> Result<bool, LockError>;

    /// Restarts the lease's TTL if it is still held. Returns whether it was.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<bool, LockError>;

    /// Raises the key's fencing counter to at least `floor`, so the next grant carries a
    /// larger token. Returns the counter afterwards. Used when the store lost its data and
    /// the protected resource reports the highest token it has accepted.
    async fn raise_fencing(
        &self,
        key: &str,
        floor: FencingToken,
    ) -> Result<FencingToken, LockError>;

    /// Checks that the store answers.
    async fn ping(&self) -> Result<(), LockError>;

    /// Forgets the state of keys nobody has held or waited for in at least `idle_for`
    /// (their fencing counters included), so a store that has seen many keys — one per
    /// order — keeps only those in use lately. Returns how many keys it forgot. Safe:
    /// a forgotten counter starts again from the store's clock (see the crate docs), above
    /// every token handed out before, and the protected store refuses a token that is not
    /// newer anyway. A store whose per-key state expires by itself (a TTL, a container
    /// node) has nothing to do here and keeps the default.
    async fn prune_idle(&self, idle_for: Duration) -> Result<u64, LockError> {
        let _ = idle_for;
        Ok(0)
    }

    /// How coarsely the store times a lease out: a lock whose holder vanished is free
    /// again between its lease and this much later. Zero for stores that keep time to the
    /// millisecond; memcached counts whole seconds.
    fn expiry_granularity(&self) -> Duration {
        Duration::ZERO
    }

    /// What a lease is bound to here.
    fn sessions(&self) -> Sessions {
        Sessions::PerGrant
    }
}

/// The longest note a holder may attach.
pub const MAX_NOTE: usize = 256;

/// Rejects requests no backend can honour.
pub(crate) fn validate(key: &str, ttl: Duration) -> Result<(), LockError> {
    if key.is_empty() {
        return Err(LockError::Invalid("the lock key is empty".into()));
    }
    if ttl < MIN_TTL {
        return Err(LockError::Invalid(format!(
            "lock TTL {ttl:?} is below the minimum {MIN_TTL:?}"
        )));
    }
    if ttl > MAX_TTL {
        return Err(LockError::Invalid(format!(
            "lock TTL {ttl:?} is above the maximum {MAX_TTL:?}"
        )));
    }
    Ok(())
}

/// The largest fencing floor [`LockBackend::raise_fencing`] takes: 2^53 − 2^32. The Redis
/// scripts' numbers hold integers exactly up to 2^53; the gap leaves four billion grants
/// above the highest floor before tokens could round — far beyond any lock's lifetime.
pub const MAX_FENCING_FLOOR: u64 = (1 << 53) - (1 << 32);

/// Refuses floors that could not be kept exactly (rather than rounding them).
pub(crate) fn check_floor(floor: FencingToken) -> Result<(), LockError> {
    if floor.get() > MAX_FENCING_FLOOR {
        return Err(LockError::Invalid(format!(
            "fencing floor {floor} is above {MAX_FENCING_FLOOR} (2^53 - 2^32)"
        )));
    }
    Ok(())
}

pub(crate) fn validate_note(note: &str) -> Result<(), LockError> {
    if note.len() > MAX_NOTE {
        return Err(LockError::Invalid(format!(
            "a lock note is at most {MAX_NOTE} bytes, got {}",
            note.len()
        )));
    }
    Ok(())
}

/// How many waiters one key takes unless configured otherwise: far more than a lock
/// wait of a few seconds can serve at a few milliseconds per holder, far fewer than would
/// let one caller crowd the store.
pub const DEFAULT_MAX_WAITERS: usize = 64;

/// This process's acquires that are still waiting, per key.
#[derive(Debug)]
struct Waiting {
    max: usize,
    /// Never held across an await.
    per_key: Mutex<HashMap<String, usize>>,
}

impl Waiting {
    fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            per_key: Mutex::new(HashMap::new()),
        }
    }

    /// A place among `key`'s waiters, or [`LockError::QueueFull`] when they are all taken.
    fn enter(self: &Arc<Self>, key: &str) -> Result<WaitingPlace, LockError> {
        let mut per_key = self.lock();
        let count = per_key.entry(key.to_owned()).or_default();
        if *count >= self.max {
            return Err(LockError::QueueFull {
                key: key.to_owned(),
                max_waiters: self.max,
            });
        }
        *count += 1;
        Ok(WaitingPlace {
            waiting: Arc::clone(self),
            key: key.to_owned(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        // Increments and decrements cannot leave the map inconsistent.
        self.per_key
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Gives its place back however the acquire call ends.
struct WaitingPlace {
    waiting: Arc<Waiting>,
    key: String,
}

impl Drop for WaitingPlace {
    fn drop(&mut self) {
        let mut per_key = self.waiting.lock();
        if let Some(count) = per_key.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                per_key.remove(&self.key);
            }
        }
    }
}

/// A handle on a lock store; clones share it. Hands out [`LockGuard`]s, which renew their
/// lease while they live.
#[derive(Clone, Debug)]
pub struct LockService {
    backend: Arc<dyn LockBackend>,
    /// Caps this process's waiters per key before any round trip: a crowd on one key
    /// (thousands of concurrent requests on one account) is turned away here at no cost
    /// to the store, while the store's own cap (Redis) holds across processes.
    waiting: Arc<Waiting>,
}

impl LockService {
    /// Wraps any backend, with at most [`DEFAULT_MAX_WAITERS`] waiters per key.
    pub fn new(backend: impl LockBackend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// Wraps a backend the caller keeps a handle on too (to read a backend's own
    /// counters, say [`RedisBackend::round_trips`]).
    pub fn from_arc(backend: Arc<dyn LockBackend>) -> Self {
        Self {
            backend,
            waiting: Arc::new(Waiting::new(DEFAULT_MAX_WAITERS)),
        }
    }

    /// Caps this process's waiters per key at `max` (at least 1); past it, acquires fail
    /// at once with [`LockError::QueueFull`].
    pub fn with_max_waiters(self, max: usize) -> Self {
        Self {
            backend: self.backend,
            waiting: Arc::new(Waiting::new(max)),
        }
    }

    /// Locks that live in this process only (the embedded mode: one instance).
    pub fn in_process() -> Self {
        Self::new(InProcessBackend::new())
    }

    /// Locks in the Redis at `url`, with its cap on waiters per key in this process too.
    /// Connects lazily, so a Redis that is down at start-up shows up as
    /// [`LockError::Unavailable`] on use rather than as a failure to start. Must be called
    /// inside a Tokio runtime.
    pub fn redis(url: &str, options: RedisOptions) -> Result<Self, LockError> {
        let max_waiters = options.max_waiters;
        Ok(Self::new(RedisBackend::open(url, options)?).with_max_waiters(max_waiters))
    }

    /// Locks in the memcached at `url` (`memcache://host:port`), with its cap on waiters
    /// per key in this process. Connects lazily.
    pub fn memcached(
        url: &str,
        options: crate::memcached::MemcachedOptions,
    ) -> Result<Self, LockError> {
        let max_waiters = options.max_waiters;
        Ok(
            Self::new(crate::memcached::MemcachedBackend::open(url, options)?)
                .with_max_waiters(max_waiters),
        )
    }

    /// Locks as rows of a table in the MySQL / MariaDB database at `url`
    /// (`mysql://…/<database>`), with its cap on waiters per key in this process.
    /// Connects lazily.
    pub fn mysql_table(
        url: &str,
        options: crate::mysql_table::MySqlTableOptions,
    ) -> Result<Self, LockError> {
        let max_waiters = options.max_waiters;
        Ok(
            Self::new(crate::mysql_table::MySqlTableBackend::open(url, options)?)
                .with_max_waiters(max_waiters),
        )
    }

    /// Locks as InnoDB row locks in the MySQL / MariaDB database at `url`
    /// (`mysql-row://…/<database>`), with its cap on waiters per key in this process.
    /// Connects lazily.
    pub fn mysql_row(
        url: &str,
        options: crate::mysql_row::MySqlRowOptions,
    ) -> Result<Self, LockError> {
        let max_waiters = options.max_waiters;
        Ok(
            Self::new(crate::mysql_row::MySqlRowBackend::open(url, options)?)
                .with_max_waiters(max_waiters),
        )
    }

    /// Locks as advisory locks in the PostgreSQL at `url` (`postgres://…`), with its cap
    /// on waiters per key in this process. Connects lazily.
    pub fn postgres(
        url: &str,
        options: crate::postgres::PostgresOptions,
    ) -> Result<Self, LockError> {
        let max_waiters = options.max_waiters;
        Ok(
            Self::new(crate::postgres::PostgresBackend::open(url, options)?)
                .with_max_waiters(max_waiters),
        )
    }

    /// Locks in the ZooKeeper ensemble at `url` (`zk://host:port[,host:port…][/root]`),
    /// with its cap on waiters per key in this process too. Connects lazily.
    pub fn zookeeper(url: &str, options: ZooKeeperOptions) -> Result<Self, LockError> {
        let max_waiters = options.max_waiters;
        Ok(Self::new(ZooKeeperBackend::open(url, options)?).with_max_waiters(max_waiters))
    }

    /// Locks in the etcd cluster at `url` (`etcd://host:port[,host:port…][/root]`), with
    /// its cap on waiters per key in this process too. Connects lazily.
    pub fn etcd(url: &str, options: crate::etcd::EtcdOptions) -> Result<Self, LockError> {
        let max_waiters = options.max_waiters;
        Ok(Self::new(crate::etcd::EtcdBackend::open(url, options)?).with_max_waiters(max_waiters))
    }

    /// The backend, for callers that manage leases themselves.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// Takes the lock on `key`, waiting in line until `deadline`. The guard renews the
    /// lease every `ttl / 3` until released or dropped. A deadline already past is a
    /// caller that gave up: [`LockError::TimedOut`] at once, nothing asked of the store.
    pub async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<LockGuard, LockError> {
        self.acquire_noted(key, ttl, deadline, "").await
    }

    /// [`acquire`](Self::acquire), leaving a note that others can read with
    /// [`holder_note`](Self::holder_note) while we hold the lock.
    pub async fn acquire_noted(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
        note: &str,
    ) -> Result<LockGuard, LockError> {
        validate(key, ttl)?;
        validate_note(note)?;
        if Instant::now() >= deadline {
            return Err(LockError::TimedOut {
                key: key.to_owned(),
                waited: Duration::ZERO,
            });
        }
        let place = self.waiting.enter(key)?;
        let lease = self.backend.acquire(key, ttl, deadline, note).await?;
        drop(place);
        Ok(LockGuard::start(lease, Arc::clone(&self.backend)))
    }

    /// Takes the lock on `key` only if that needs no waiting.
    pub async fn try_acquire(
        &self,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<LockGuard>, LockError> {
        self.try_acquire_noted(key, ttl, "").await
    }

    /// [`try_acquire`](Self::try_acquire), leaving a note as
    /// [`acquire_noted`](Self::acquire_noted) does.
    pub async fn try_acquire_noted(
        &self,
        key: &str,
        ttl: Duration,
        note: &str,
    ) -> Result<Option<LockGuard>, LockError> {
        validate(key, ttl)?;
        validate_note(note)?;
        let lease = self.backend.try_acquire(key, ttl, note).await?;
        Ok(lease.map(|lease| LockGuard::start(lease, Arc::clone(&self.backend))))
    }

    /// See [`LockBackend::holder_note`].
    pub async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        self.backend.holder_note(key).await
    }

    /// See [`LockBackend::raise_fencing`].
    pub async fn raise_fencing(
        &self,
        key: &str,
        floor: FencingToken,
    ) -> Result<FencingToken, LockError> {
        self.backend.raise_fencing(key, floor).await
    }

    /// See [`LockBackend::ping`].
    pub async fn ping(&self) -> Result<(), LockError> {
        self.backend.ping().await
    }

    /// See [`LockBackend::prune_idle`].
    pub async fn prune_idle(&self, idle_for: Duration) -> Result<u64, LockError> {
        self.backend.prune_idle(idle_for).await
    }
}
