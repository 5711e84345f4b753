//! The seam between the lock and its stores: [`LockBackend`] is what a store implements,
//! one atomic step per method in terms of [`Lease`]s; [`LockOptions`] is what every store
//! is configured with; the limits every request is validated against live here too, and
//! are checked once, by [`LockService`](crate::LockService), before a store sees them.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::LockError;
use crate::token::{FencingToken, OwnerToken};

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
    /// Takes the lock on the [`Ask`]'s key. With a `deadline`, queues behind earlier
    /// waiters until the lock is handed over or the deadline passes
    /// ([`LockError::TimedOut`], or `Ok(None)` from a store that did not measure the
    /// wait); with none, takes it only if it is free and nobody is queued for it, never
    /// waiting (`Ok(None)` otherwise). The ask's `note` says what the holder will be doing
    /// (see [`holder_note`](Self::holder_note)); may be empty.
    ///
    /// The caller ([`LockService`](crate::LockService)) has validated the request: the key
    /// is not empty, the TTL within [`MIN_TTL`]..=[`MAX_TTL`], the note at most
    /// [`MAX_NOTE`] bytes, and a deadline still ahead.
    async fn acquire(&self, ask: Ask<'_>) -> Result<Option<Lease>, LockError>;

    /// The note of the lock's current holder, or `None` when it is free. Lets a waiter
    /// that gave up say what it was waiting behind.
    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError>;

    /// Deletes the lock if `lease` still holds it and hands it to the next waiter. Returns
    /// whether it was still held. Safe to repeat; never touches another holder's lock.
    async fn release(&self, lease: &Lease) -> Result<bool, LockError>;

    /// Restarts the lease's TTL if it is still held. Returns whether it was. `ttl` is the
    /// lease's own, checked at the grant.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<bool, LockError>;

    /// Raises the key's fencing counter to at least `floor`, so the next grant carries a
    /// larger token. Returns the counter afterwards. Used when the store lost its data and
    /// the protected resource reports the highest token it has accepted. The caller has
    /// checked the floor (at most [`MAX_FENCING_FLOOR`]).
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

/// Refuses notes longer than [`MAX_NOTE`].
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

/// How long a store's one request (connecting, a statement, a round trip) may take unless
/// configured otherwise; Redis, which answers from memory, has its own (1 s).
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);

/// What every lock store is configured with (the settings only one store has are that
/// store's own: [`MemcachedOptions`](crate::MemcachedOptions) and the like).
#[derive(Clone, Debug)]
pub struct LockOptions {
    /// Prefixes every key, so deployments sharing a store never meet. (ZooKeeper and etcd
    /// take a root path in their URL instead; in process there is nothing to share.)
    pub namespace: String,
    /// Upper bound on connecting and on any one request that does not wait for a lock:
    /// an unreachable store becomes [`LockError::Unavailable`] within this time instead of
    /// a hang. `None`: the store's own default — 1 s for Redis, [`DEFAULT_OP_TIMEOUT`]
    /// for the others.
    pub op_timeout: Option<Duration>,
    /// The most waiters one key takes in this process — past it an acquire fails at once
    /// with [`LockError::QueueFull`], before any round trip — and, on the stores that queue
    /// waiters themselves (Redis, ZooKeeper, etcd), across every process sharing the store.
    pub max_waiters: usize,
    /// Chubby's lock-delay: when a holder vanishes without releasing, nobody uses its key
    /// until this much past its lease (or session) too; a released lock is free at once.
    /// Zero by default. Each store's module says how it keeps it.
    pub lock_delay: Duration,
    /// How long a key's fencing counter outlives its last lease (or a raise) on the stores
    /// that expire it themselves (Redis; memcached in whole seconds, at most 30 days), so
    /// keys locked once — one per order — leave nothing behind for longer (payonce's
    /// `PAYONCE_LOCK_IDLE`). A counter forgotten starts again from the clock (see the
    /// crate docs). An hour by default. The other stores forget idle keys when asked
    /// ([`LockBackend::prune_idle`]).
    pub idle: Duration,
    /// How long after this process stops heartbeating its locks are released, on the
    /// stores whose leases are the process's ([`Sessions::PerProcess`]): ZooKeeper's
    /// session timeout (which the server clamps between 2 and 20 ticks by default) and
    /// etcd's lease TTL (whole seconds, at least 2; `lock::open` rounds up to
    /// that). Ten seconds by default.
    pub session: Duration,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            namespace: "payonce".to_owned(),
            op_timeout: None,
            max_waiters: DEFAULT_MAX_WAITERS,
            lock_delay: Duration::ZERO,
            idle: Duration::from_secs(60 * 60),
            session: Duration::from_secs(10),
        }
    }
}

impl LockOptions {
    /// The op timeout, or `default` (the store's own) when none is set.
    pub fn op_timeout_or(&self, default: Duration) -> Duration {
        self.op_timeout.unwrap_or(default)
    }
}

/// One acquire as a store sees it: what was asked, and since when — what
/// [`LockBackend::acquire`] takes. The steps of a store's acquire (join the line, check the
/// cap, grant, wait for the one ahead) share it rather than five arguments each.
#[derive(Clone, Copy, Debug)]
pub struct Ask<'a> {
    /// The key, as the caller named it (a store adds its namespace).
    pub key: &'a str,
    /// The lease a grant carries.
    pub ttl: Duration,
    /// `None`: take the lock only if that needs no waiting.
    pub deadline: Option<Instant>,
    /// What the holder will be doing.
    pub note: &'a str,
    /// When the call began, for how long a wait that timed out waited.
    pub started: Instant,
}

impl<'a> Ask<'a> {
    /// An acquire of `key` for a lease of `ttl`, beginning now: waiting in line until
    /// `deadline`, or with none only if that needs no waiting; `note` says what the holder
    /// will be doing (may be empty). The request must be one
    /// [`LockService`](crate::LockService) accepts (see [`LockBackend::acquire`]).
    pub fn new(key: &'a str, ttl: Duration, deadline: Option<Instant>, note: &'a str) -> Self {
        debug_assert!(
            validate(key, ttl).is_ok() && validate_note(note).is_ok(),
            "a store was asked for what LockService refuses: key {key:?}, ttl {ttl:?}"
        );
        Self {
            key,
            ttl,
            deadline,
            note,
            started: Instant::now(),
        }
    }

    /// The wait ran out.
    pub(crate) fn timed_out(&self) -> LockError {
        LockError::TimedOut {
            key: self.key.to_owned(),
            waited: self.started.elapsed(),
        }
    }

    /// The lock did not come to us: nothing for a try, a wait that timed out for a
    /// waiter.
    pub(crate) fn not_granted(&self) -> Result<Option<Lease>, LockError> {
        match self.deadline {
            None => Ok(None),
            Some(_) => Err(self.timed_out()),
        }
    }

    /// The key's line already holds `max_waiters`.
    pub(crate) fn queue_full(&self, max_waiters: usize) -> LockError {
        LockError::QueueFull {
            key: self.key.to_owned(),
            max_waiters,
        }
    }
}
