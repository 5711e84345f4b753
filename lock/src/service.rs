//! What callers hold: [`LockService`], a handle on one store ([`LockBackend`]) that
//! validates every request once, caps this process's waiters per key, and wraps each grant
//! in a [`LockGuard`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{
    Ask, DEFAULT_MAX_WAITERS, Lease, LockBackend, check_floor, validate, validate_note,
};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::in_process::InProcessBackend;
use crate::token::FencingToken;

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
    /// counters, say [`RedisBackend::round_trips`](crate::RedisBackend::round_trips)).
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
            waiting: Arc::new(Waiting::new(max)),
            ..self
        }
    }

    /// Locks that live in this process only (the embedded mode: one instance).
    pub fn in_process() -> Self {
        Self::new(InProcessBackend::new())
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
        let timed_out = || LockError::TimedOut {
            key: key.to_owned(),
            waited: Duration::ZERO,
        };
        validate(key, ttl)?;
        validate_note(note)?;
        if Instant::now() >= deadline {
            return Err(timed_out());
        }
        let place = self.waiting.enter(key)?;
        let lease = self
            .backend
            .acquire(Ask::new(key, ttl, Some(deadline), note))
            .await?;
        drop(place);
        lease.map(|lease| self.guard(lease)).ok_or_else(timed_out)
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
        let lease = self.backend.acquire(Ask::new(key, ttl, None, note)).await?;
        Ok(lease.map(|lease| self.guard(lease)))
    }

    fn guard(&self, lease: Lease) -> LockGuard {
        LockGuard::start(lease, Arc::clone(&self.backend))
    }

    /// See [`LockBackend::holder_note`].
    pub async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        self.backend.holder_note(key).await
    }

    /// See [`LockBackend::raise_fencing`]; a floor above
    /// [`MAX_FENCING_FLOOR`](crate::MAX_FENCING_FLOOR) is refused.
    pub async fn raise_fencing(
        &self,
        key: &str,
        floor: FencingToken,
    ) -> Result<FencingToken, LockError> {
        check_floor(floor)?;
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
