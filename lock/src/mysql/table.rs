//! Locks as rows of a MySQL / MariaDB table — the lock table of the seeds: one row per key
//! with its holder's owner token, the lease's expiry and a fencing counter.
//!
//! - **One statement grants**: an `INSERT … ON DUPLICATE KEY UPDATE` that takes the row
//!   if it is free or its lease ran out — judged by the database's clock, in the same
//!   statement, so there is no cleaner and no read-then-write — and bumps the counter.
//!   `LAST_INSERT_ID(expr)` carries the answer back in the statement's own reply: the new
//!   token when granted, or (offset by 2^62) the microseconds left on the holder's lease.
//! - **Release and extend** are `UPDATE`s conditioned on the owner token and an unexpired
//!   lease, so a holder never frees or extends another's lock.
//! - **Waiting is polling**: the store cannot notify. One waiter per key per process polls
//!   (the others wait their turn in the process); it backs off from 1 ms to 100 ms with
//!   jitter, never sleeps past the holder's lease, and a release in this process wakes it
//!   at once. Across processes, whoever polls first after a release wins: no arrival
//!   order there.
//! - **Fencing token**: the row's counter, starting from the server's clock in
//!   microseconds, so a counter lost with the table starts again above every token it
//!   handed out; `raise_fencing` lifts it.
//! - **Lock-delay**: the row's lease is kept `lock_delay` past the holder's, so a holder
//!   that vanished keeps the key that much longer; a release frees it at once.
//! - **Per-key state** is the row. `prune_idle` deletes, in batches, the namespace's rows
//!   that are free (released, or the lease and its lock-delay ran out) and were last
//!   granted, extended or released more than the idle period ago — but not a counter
//!   above the clock (raised past it). A poller keeps nothing in the row: its next poll
//!   makes it again, its counter from the clock, which has passed the deleted one. A
//!   table of an earlier version gains the `last_used` column and its index once, at
//!   start-up.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, timeout_at};

use super::{Database, PRUNE_BATCH, PRUNE_MAX_BATCHES, idle_micros, lock_name, micros, too_slow};
use crate::backend::{Ask, DEFAULT_OP_TIMEOUT, Lease, LockBackend, LockOptions, Sessions};
use crate::error::LockError;
use crate::token::{FencingToken, OwnerToken};
use crate::turns::{Poll, Turns};

/// What only [`MySqlTableBackend`] is configured with (the rest is [`LockOptions`]).
#[derive(Clone, Debug)]
pub struct MySqlTableOptions {
    /// The most connections this process opens for locks.
    pub max_connections: u32,
}

impl Default for MySqlTableOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
        }
    }
}

/// `last_used`: the row's last grant, extend, release or raise, for pruning.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS payonce_locks (
    lock_key VARBINARY(255) NOT NULL PRIMARY KEY,
    owner CHAR(32) NULL,
    expires_at DATETIME(6) NULL,
    fence BIGINT NOT NULL,
    note VARBINARY(256) NOT NULL DEFAULT '',
    last_used DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    KEY payonce_locks_last_used (last_used)
) ENGINE=InnoDB";

/// The server's clock in microseconds, where a counter starts.
macro_rules! clock_micros {
    () => {
        "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
    };
}

/// Added to the microseconds left on a holder's lease when the grant is refused, so the
/// answer cannot be mistaken for a token (tokens stay below 2^53).
const REFUSED: u64 = 1 << 62;

/// Takes the row if it is free or its lease ran out, in one statement. The assignments
/// run left to right, each seeing those before it: the condition is evaluated on the old
/// row until `owner` changes, and `expires_at` is set only if `owner` became ours.
/// `LAST_INSERT_ID(x)` makes `x` the statement's reported insert id: the token when
/// granted (inserted: the clock; updated: the counter plus one), else `REFUSED` plus the
/// holder's microseconds left. Parameters: key, owner, lease µs, note.
const GRANT: &str = concat!(
    "INSERT INTO payonce_locks (lock_key, owner, expires_at, fence, note)
     VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND, LAST_INSERT_ID(",
    clock_micros!(),
    "), ?)
     ON DUPLICATE KEY UPDATE
       note = IF(owner IS NULL OR expires_at <= NOW(6), VALUES(note), note),
       fence = IF(owner IS NULL OR expires_at <= NOW(6),
                  LAST_INSERT_ID(fence + 1),
                  fence + 0 * LAST_INSERT_ID(4611686018427387904
                      + GREATEST(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at), 0))),
       owner = IF(owner IS NULL OR expires_at <= NOW(6), VALUES(owner), owner),
       expires_at = IF(owner = VALUES(owner), VALUES(expires_at), expires_at),
       last_used = IF(owner = VALUES(owner), NOW(6), last_used)"
);

/// Parameters: key, owner.
const RELEASE: &str = "UPDATE payonce_locks SET owner = NULL, expires_at = NULL,
        last_used = NOW(6)
    WHERE lock_key = ? AND owner = ? AND expires_at > NOW(6)";

/// Parameters: lease µs, key, owner.
const EXTEND: &str = "UPDATE payonce_locks
    SET expires_at = NOW(6) + INTERVAL ? MICROSECOND, last_used = NOW(6)
    WHERE lock_key = ? AND owner = ? AND expires_at > NOW(6)";

/// Parameter: key.
const HOLDER_NOTE: &str = "SELECT note FROM payonce_locks
    WHERE lock_key = ? AND owner IS NOT NULL AND expires_at > NOW(6)";

/// Lifts the counter to at least the floor; reports the counter. Parameters: key, floor,
/// floor.
const RAISE: &str = concat!(
    "INSERT INTO payonce_locks (lock_key, fence) VALUES (?, LAST_INSERT_ID(GREATEST(?, ",
    clock_micros!(),
    ")))
     ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(GREATEST(fence, ?)), last_used = NOW(6)"
);

/// One pruning batch: deletes up to N rows of a namespace that are free (released, or
/// their lease — with its lock-delay — ran out) and were last used more than an idle
/// period ago. A counter above the clock (lifted by `raise_fencing` past it) is kept:
/// forgotten, it would start again below the floor. Pollers keep nothing in the row: a
/// poll after the delete inserts it again, its counter from the clock, above the deleted
/// one. Parameters: idle µs, the prefix's length in bytes, the prefix (`<ns>:`), N.
const PRUNE: &str = concat!(
    "DELETE FROM payonce_locks
     WHERE last_used < NOW(6) - INTERVAL ? MICROSECOND
       AND LEFT(lock_key, ?) = ?
       AND (owner IS NULL OR expires_at <= NOW(6))
       AND fence < ",
    clock_micros!(),
    "
     ORDER BY last_used
     LIMIT ?"
);

/// Locks as rows of a MySQL / MariaDB table. See the module docs.
pub struct MySqlTableBackend {
    database: Database,
    options: LockOptions,
    op_timeout: Duration,
    turns: Turns,
    /// The grants held here, by owner: their keys, so extend and release find them.
    held: Mutex<HashMap<OwnerToken, String>>,
}

impl fmt::Debug for MySqlTableBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlTableBackend")
            .field("database", &self.database.name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl MySqlTableBackend {
    /// A backend for `url` (`mysql://user[:password]@host[:port]/<database>`; the database
    /// and its table are created on first use). Connects lazily; must be used inside a
    /// Tokio runtime.
    pub fn open(
        url: &str,
        options: &LockOptions,
        own: MySqlTableOptions,
    ) -> Result<Self, LockError> {
        let op_timeout = options.op_timeout_or(DEFAULT_OP_TIMEOUT);
        Ok(Self {
            database: Database::open(url, own.max_connections.max(1), op_timeout)?,
            options: options.clone(),
            op_timeout,
            turns: Turns::default(),
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Statements sent so far.
    pub fn requests(&self) -> u64 {
        self.database.requests()
    }

    fn held(&self) -> MutexGuard<'_, HashMap<OwnerToken, String>> {
        // Inserts and removes cannot leave the map inconsistent.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn name(&self, key: &str) -> Result<String, LockError> {
        lock_name(&self.options.namespace, key)
    }

    /// The lease the row keeps: the holder's, plus the lock-delay.
    fn kept(&self, ttl: Duration) -> i64 {
        micros(ttl.saturating_add(self.options.lock_delay))
    }

    /// Runs one statement, bounded by the op timeout, counted.
    async fn run<T>(
        &self,
        statement: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, LockError> {
        self.database.count();
        match timeout_at(Instant::now() + self.op_timeout, statement).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => Err(self.database.failed(&error)),
            Err(_) => Err(too_slow()),
        }
    }

    /// Creates the database and the table once.
    async fn ensure_schema(&self) -> Result<(), LockError> {
        self.database
            .ensure_schema(&[SCHEMA], "payonce_locks", self.op_timeout)
            .await
    }

    /// One attempt: the token if granted, else how long the holder's lease has left.
    async fn grant(
        &self,
        name: &str,
        owner: OwnerToken,
        ttl: Duration,
        note: &str,
    ) -> Result<Result<u64, Duration>, LockError> {
        let answer = self
            .run(
                sqlx::query(GRANT)
                    .bind(name)
                    .bind(owner.to_hex())
                    .bind(self.kept(ttl))
                    .bind(note)
                    .execute(&self.database.pool),
            )
            .await?;
        let id = answer.last_insert_id();
        Ok(if id >= REFUSED {
            Err(Duration::from_micros(id - REFUSED))
        } else {
            Ok(id)
        })
    }
}

#[async_trait]
impl LockBackend for MySqlTableBackend {
    /// Takes the lock: waits for the key's turn in this process, then polls the table
    /// until a grant (or once, without a deadline).
    async fn acquire(&self, ask: Ask<'_>) -> Result<Option<Lease>, LockError> {
        let name = self.name(ask.key)?;
        self.ensure_schema().await?;
        let Some((turn, _turn)) = self
            .turns
            .wait(&name, ask.deadline)
            .await
            .map_err(|()| ask.timed_out())?
        else {
            // Someone of ours is polling for it: it is held.
            return Ok(None);
        };
        let owner = OwnerToken::random();
        let name_ref = &name;
        let granted = turn
            .poll(&ask, move || async move {
                let asked_at = Instant::now();
                Ok(
                    match self.grant(name_ref, owner, ask.ttl, ask.note).await? {
                        Ok(token) => Poll::Granted((token, asked_at)),
                        Err(left) => Poll::Held { left: Some(left) },
                    },
                )
            })
            .await?;
        let Some((token, asked_at)) = granted else {
            return Ok(None);
        };
        self.held().insert(owner, name);
        Ok(Some(Lease::new(
            ask.key,
            owner,
            FencingToken::new(token),
            ask.ttl,
            asked_at,
        )))
    }

    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        let name = self.name(key)?;
        self.ensure_schema().await?;
        let note: Option<Vec<u8>> = self
            .run(
                sqlx::query_scalar(HOLDER_NOTE)
                    .bind(name)
                    .fetch_optional(&self.database.pool),
            )
            .await?;
        Ok(note.map(|note| String::from_utf8_lossy(&note).into_owned()))
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(name) = self.held().remove(&lease.owner()) else {
            return Ok(false);
        };
        let released = self
            .run(
                sqlx::query(RELEASE)
                    .bind(&name)
                    .bind(lease.owner().to_hex())
                    .execute(&self.database.pool),
            )
            .await;
        // The waiter whose turn it is (if any) polls again now, not at its next pause.
        self.turns.of(&name).released();
        match released {
            Ok(answer) => Ok(answer.rows_affected() > 0),
            Err(error) => {
                // Not known released: keep it, so a retry can still release it.
                self.held().insert(lease.owner(), name);
                Err(error)
            }
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<bool, LockError> {
        let Some(name) = self.held().get(&lease.owner()).cloned() else {
            return Ok(false);
        };
        let extended = self
            .run(
                sqlx::query(EXTEND)
                    .bind(self.kept(ttl))
                    .bind(&name)
                    .bind(lease.owner().to_hex())
                    .execute(&self.database.pool),
            )
            .await?;
        Ok(extended.rows_affected() > 0)
    }

    async fn raise_fencing(
        &self,
        key: &str,
        floor: FencingToken,
    ) -> Result<FencingToken, LockError> {
        let name = self.name(key)?;
        self.ensure_schema().await?;
        let floor = i64::try_from(floor.get()).unwrap_or(i64::MAX);
        let raised = self
            .run(
                sqlx::query(RAISE)
                    .bind(name)
                    .bind(floor)
                    .bind(floor)
                    .execute(&self.database.pool),
            )
            .await?;
        Ok(FencingToken::new(raised.last_insert_id()))
    }

    async fn prune_idle(&self, idle_for: Duration) -> Result<u64, LockError> {
        self.ensure_schema().await?;
        let prefix = self.name("")?;
        let mut forgotten = 0;
        for _ in 0..PRUNE_MAX_BATCHES {
            let deleted = self
                .run(
                    sqlx::query(PRUNE)
                        .bind(idle_micros(idle_for))
                        .bind(prefix.len() as u64)
                        .bind(&prefix)
                        .bind(PRUNE_BATCH)
                        .execute(&self.database.pool),
                )
                .await?
                .rows_affected();
            forgotten += deleted;
            if deleted < PRUNE_BATCH {
                break;
            }
        }
        Ok(forgotten)
    }

    async fn ping(&self) -> Result<(), LockError> {
        // The database is made on first use, and a ping may be the first: without it the
        // pool's connections (which name the database) could never be opened.
        self.ensure_schema().await?;
        self.run(sqlx::query("SELECT 1").execute(&self.database.pool))
            .await?;
        Ok(())
    }

    fn sessions(&self) -> Sessions {
        Sessions::PerGrant
    }
}
