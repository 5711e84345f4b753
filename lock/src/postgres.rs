//! Locks as PostgreSQL advisory locks: a session-level `pg_advisory_lock` held on a
//! connection of its own for as long as the lock is held.
//!
//! - **The connection is the lease.** The server releases a session's advisory locks when
//!   the session ends — the holder's process died, or the server or the network dropped
//!   the connection — and never while it lives. So there is no TTL in the server: `extend`
//!   asks, on the holder's own connection, whether it still holds the lock (one round
//!   trip, the guard's heartbeat); a connection that broke answers false and `lost` fires.
//! - **Waiting is the server's own queue.** `acquire` blocks in `pg_advisory_lock`, with
//!   `lock_timeout` set (for that statement only) to what is left of the deadline; the
//!   server grants waiters in arrival order and wakes exactly the next one on release. A
//!   process sends at most one waiter per key to the server (the others wait their turn in
//!   the process, first come first served), so a key costs at most two connections per
//!   process: its holder's and its next waiter's.
//! - **Fencing token**: a counter per key in `payonce_lock_fences`, bumped in the same
//!   statement that takes the lock (the row is only written under the lock). Like Redis's,
//!   it starts from the server's clock in microseconds, so a counter lost with the table
//!   starts again above every token it handed out; `raise_fencing` lifts it.
//! - A connection whose lock state is unknown — an error after the lock may have been
//!   taken (session-level advisory locks ignore rollbacks), a call dropped mid-wait — is
//!   closed, never returned to the pool: the server then frees whatever it held, and
//!   `client_connection_check_interval` makes it notice within 100 ms even mid-wait.
//! - **Lock-delay** (when set): the row records whether its last holder released; a
//!   successor that finds it did not waits the delay before using the lock (holding it).
//! - The advisory lock's key is `hashtextextended(<namespace>:<key>, 0)`: two keys whose
//!   64-bit hashes collide share a lock (more exclusion, never less); their counters stay
//!   apart.
//! - **Per-key state** is the counter's row (the advisory lock itself lives in the
//!   server's memory only while held or waited for). `prune_idle` deletes, in batches, the
//!   namespace's rows last granted more than the idle period ago whose lock nobody holds
//!   or waits for (`pg_locks`), except a counter above the clock (raised past it) and,
//!   with a lock-delay, a row whose last holder never released. A pruned counter starts
//!   again from the clock, which has passed it. A table of an earlier version gains the
//!   `last_used` column and its index once, at start-up.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Row};
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::backend::{Ask, DEFAULT_OP_TIMEOUT, Lease, LockBackend, LockOptions, Sessions};
use crate::error::LockError;
use crate::slot::Slot;
use crate::token::{FencingToken, OwnerToken};
use crate::turns::Turns;

/// What only [`PostgresBackend`] is configured with (the rest is [`LockOptions`]; its
/// cap on waiters is this process's only: the server's queue holds one per process).
#[derive(Clone, Debug)]
pub struct PostgresOptions {
    /// The most connections this process opens for locks: one per held lock, one per key
    /// being waited for, a few for reads.
    pub max_connections: u32,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            max_connections: 64,
        }
    }
}

/// The table of fencing counters (and the holder's note, whether it released, and when
/// the key was last granted, for pruning), with the index a pruning pass walks.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS payonce_lock_fences (
    lock_key text PRIMARY KEY,
    fence bigint NOT NULL,
    note text NOT NULL DEFAULT '',
    holder_pid integer,
    released boolean NOT NULL DEFAULT true,
    last_released boolean NOT NULL DEFAULT true,
    last_used timestamptz NOT NULL DEFAULT now()
)";

/// Whether the table has what pruning needs (a table made by an earlier version has
/// neither): asked at start-up so that the upgrade's statements, which lock the table,
/// run only once.
const UPGRADED: &str = "SELECT EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name = 'payonce_lock_fences'
          AND column_name = 'last_used')
    AND to_regclass('payonce_lock_fences_last_used') IS NOT NULL";

/// Adds what pruning needs to a table of an earlier version. Its rows count as used at
/// the upgrade (their last use is unknown), so they are pruned one idle period later.
/// One transaction; two processes upgrading at once wait for each other (the second
/// finds the column there, or loses the race on the index's name: `23505`).
const UPGRADE: &str = "ALTER TABLE payonce_lock_fences
        ADD COLUMN IF NOT EXISTS last_used timestamptz NOT NULL DEFAULT now();
    CREATE INDEX IF NOT EXISTS payonce_lock_fences_last_used
        ON payonce_lock_fences (last_used)";

/// How long the one-time upgrade of an earlier version's table may take: it builds an
/// index over every row that version left behind.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(60);

/// The server's clock in microseconds, where a counter starts.
macro_rules! clock_micros {
    () => {
        "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    };
}

/// The grant's bookkeeping, once the lock (in `locked`) is ours: bump the counter (from
/// the row's latest version, which `ON CONFLICT` reads even when it committed after this
/// statement began — as it does when we waited), note the holder, and say whether the
/// last holder released. Parameters: $1 key, $2 note.
macro_rules! record_grant {
    () => {
        concat!(
            "INSERT INTO payonce_lock_fences AS f
               (lock_key, fence, note, holder_pid, released, last_used)
             SELECT $1, ",
            clock_micros!(),
            ", $2, pg_backend_pid(), false, clock_timestamp() FROM locked WHERE locked.ours
             ON CONFLICT (lock_key) DO UPDATE
               SET fence = f.fence + 1, note = EXCLUDED.note, holder_pid = EXCLUDED.holder_pid,
                   last_released = f.released, released = false,
                   last_used = clock_timestamp()
             RETURNING fence, last_released"
        )
    };
}

/// Waits for the lock (`lock_timeout` for this statement only: $3, e.g. `250ms`), then
/// records the grant. One round trip.
const ACQUIRE: &str = concat!(
    "WITH timeout AS (SELECT set_config('lock_timeout', $3, true)),
          locked AS (SELECT pg_advisory_lock(hashtextextended($1, 0)) IS NOT NULL AS ours
                     FROM timeout)",
    record_grant!()
);

/// Takes the lock if it is free, and records the grant; no row when it is not. One round
/// trip.
const TRY_ACQUIRE: &str = concat!(
    "WITH locked AS (SELECT pg_try_advisory_lock(hashtextextended($1, 0)) AS ours)",
    record_grant!()
);

/// Whether this session holds the lock. Parameter: $1 key.
const HOLDS: &str = "SELECT EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid() AND objsubid = 1
      AND classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
      AND objid = (hashtextextended($1, 0) & 4294967295)::oid)";

const UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended($1, 0))";

/// With a lock-delay: mark the row released (its row lock held until the statement
/// commits, so a successor granted in between waits to read it), then unlock.
const UNLOCK_RELEASED: &str = "WITH marked AS (
    UPDATE payonce_lock_fences SET released = true WHERE lock_key = $1 RETURNING 1)
  SELECT pg_advisory_unlock(hashtextextended($1, 0)) FROM marked";

/// The holder's note, if a live session holds the lock. Parameter: $1 key.
const HOLDER_NOTE: &str = "SELECT f.note FROM payonce_lock_fences f
    JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.pid = f.holder_pid
      AND l.objsubid = 1
      AND l.classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
      AND l.objid = (hashtextextended($1, 0) & 4294967295)::oid
    WHERE f.lock_key = $1";

/// Lifts the counter to at least $2. Parameters: $1 key, $2 floor.
const RAISE: &str = concat!(
    "INSERT INTO payonce_lock_fences AS f (lock_key, fence)
     VALUES ($1, GREATEST($2, ",
    clock_micros!(),
    "))
     ON CONFLICT (lock_key) DO UPDATE SET fence = GREATEST(f.fence, $2), last_used = now()
     RETURNING fence"
);

/// One pruning batch: deletes up to $2 rows of the namespace $3 (a prefix, `<ns>:`)
/// granted more than $1 µs ago whose advisory lock nobody holds or waits for. Also kept:
/// a counter above the clock (lifted by `raise_fencing` past it — forgotten, it would
/// start again below the floor), and, when $4 (a lock-delay is set), a row whose last
/// holder never released — it is what makes the successor wait the delay. Rows a grant
/// is writing are skipped (`SKIP LOCKED`); a grant that writes after the delete inserts
/// the row again from the clock, above the deleted counter. Reports the rows deleted.
/// (`now()`, not the clock, so that the index on `last_used` serves the range; the rows
/// found are deleted by their `ctid`, which our row locks keep still.)
const PRUNE: &str = concat!(
    "WITH busy AS (
         SELECT classid, objid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1),
     idle AS (
         SELECT f.ctid FROM payonce_lock_fences f
         WHERE f.last_used < now() - $1::bigint * interval '1 microsecond'
           AND starts_with(f.lock_key, $3)
           AND f.fence < ",
    clock_micros!(),
    "
           AND (f.released OR NOT $4)
           AND NOT EXISTS (
               SELECT 1 FROM busy
               WHERE busy.classid = ((hashtextextended(f.lock_key, 0) >> 32) & 4294967295)::oid
                 AND busy.objid = (hashtextextended(f.lock_key, 0) & 4294967295)::oid)
         ORDER BY f.last_used
         LIMIT $2
         FOR UPDATE SKIP LOCKED)
     DELETE FROM payonce_lock_fences WHERE ctid = ANY (ARRAY(SELECT ctid FROM idle))"
);

/// Longer idle periods prune what a century would (nothing of this world).
const MAX_IDLE: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The most rows one pruning statement deletes: a short transaction, whose row locks
/// hold up no grant for long.
const PRUNE_BATCH: i64 = 1000;

/// The most batches of one pruning pass (a million keys): a pass ends in bounded time
/// however much an earlier version left behind, and the next pass goes on.
const PRUNE_MAX_BATCHES: u32 = 1000;

/// SQLSTATE 55P03: `lock_timeout` ran out before the lock was granted.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// SQLSTATE 42P01: the table is gone (dropped by hand, a database restored without it).
const UNDEFINED_TABLE: &str = "42P01";

/// A lock this process holds: its connection, kept out of the pool.
struct Held {
    key: String,
    connection: Arc<tokio::sync::Mutex<Slot<Postgres>>>,
}

/// Locks as PostgreSQL advisory locks. See the module docs.
pub struct PostgresBackend {
    pool: PgPool,
    options: LockOptions,
    op_timeout: Duration,
    /// The table was made (once per process, and again if it disappears).
    schema_made: AtomicBool,
    /// Held while making it, so a crowd of first calls makes it once.
    making_schema: tokio::sync::Mutex<()>,
    /// Per key, the turn to send a waiter to the server: one at a time, in arrival order.
    turns: Turns,
    held: Mutex<HashMap<OwnerToken, Held>>,
    /// Statements sent, for benchmarks and tests.
    requests: AtomicU64,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Why a statement failed, in the terms of the lock.
fn failed(error: &sqlx::Error) -> LockError {
    LockError::unavailable(format!("PostgreSQL: {error}"))
}

fn sqlstate(error: &sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(|error| error.code())
        .map(|code| code.into_owned())
}

impl PostgresBackend {
    /// A backend for `url` (`postgres://…`). Connects lazily; must be used inside a Tokio
    /// runtime.
    pub fn open(url: &str, options: &LockOptions, own: PostgresOptions) -> Result<Self, LockError> {
        let op_timeout = options.op_timeout_or(DEFAULT_OP_TIMEOUT);
        let connect: PgConnectOptions = url
            .parse()
            .map_err(|error| LockError::Invalid(format!("bad PostgreSQL URL: {error}")))?;
        let pool = PgPoolOptions::new()
            .max_connections(own.max_connections.max(2))
            .min_connections(0)
            .acquire_timeout(op_timeout)
            .connect_lazy_with(
                connect
                    .application_name("payonce-lock")
                    // A waiter whose call was dropped closes its connection, but a server
                    // blocked in a lock wait does not read the socket: without this check
                    // the wait would stay in its queue (and take the lock for a moment
                    // when its turn came) until its lock_timeout. PostgreSQL 14 or later.
                    .options([("client_connection_check_interval", "100ms")]),
            );
        Ok(Self {
            pool,
            options: options.clone(),
            op_timeout,
            schema_made: AtomicBool::new(false),
            making_schema: tokio::sync::Mutex::new(()),
            turns: Turns::default(),
            held: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
        })
    }

    /// Statements sent so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn held(&self) -> MutexGuard<'_, HashMap<OwnerToken, Held>> {
        // Inserts and removes cannot leave the map inconsistent.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key as the table and the hash see it.
    fn name(&self, key: &str) -> String {
        format!("{}:{key}", self.options.namespace)
    }

    fn counted(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection from the pool, not past `deadline` nor the op timeout.
    async fn connection(
        &self,
        deadline: Option<Instant>,
    ) -> Result<PoolConnection<Postgres>, LockError> {
        let limit = Instant::now() + self.op_timeout;
        let limit = deadline.map_or(limit, |deadline| deadline.min(limit));
        match timeout_at(limit, self.pool.acquire()).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(error)) => Err(failed(&error)),
            Err(_) => Err(LockError::unavailable("PostgreSQL: no connection in time")),
        }
    }

    /// Creates the table once.
    async fn ensure_schema(&self) -> Result<(), LockError> {
        if self.schema_made.load(Ordering::Acquire) {
            return Ok(());
        }
        let _making = timeout_at(Instant::now() + self.op_timeout, self.making_schema.lock())
            .await
            .map_err(|_| LockError::unavailable("PostgreSQL: still creating the lock table"))?;
        if self.schema_made.load(Ordering::Acquire) {
            return Ok(());
        }
        self.counted();
        let created = sqlx::query(SCHEMA).execute(&self.pool);
        match timeout_at(Instant::now() + self.op_timeout, created).await {
            Ok(Ok(_)) => {}
            // Two processes creating it at once: one of them loses a race on the catalog,
            // and the table is there all the same.
            Ok(Err(error)) if sqlstate(&error).as_deref() == Some("23505") => {}
            Ok(Err(error)) => return Err(failed(&error)),
            Err(_) => return Err(LockError::unavailable("PostgreSQL did not answer in time")),
        }
        self.upgrade().await?;
        self.schema_made.store(true, Ordering::Release);
        Ok(())
    }

    /// Gives a table of an earlier version (or one just made) the column and index
    /// pruning needs, unless it has them.
    async fn upgrade(&self) -> Result<(), LockError> {
        self.counted();
        let asked = sqlx::query_scalar::<_, bool>(UPGRADED).fetch_one(&self.pool);
        match timeout_at(Instant::now() + self.op_timeout, asked).await {
            Ok(Ok(true)) => return Ok(()),
            Ok(Ok(false)) => {}
            Ok(Err(error)) => return Err(failed(&error)),
            Err(_) => return Err(LockError::unavailable("PostgreSQL did not answer in time")),
        }
        self.counted();
        let upgraded = sqlx::raw_sql(UPGRADE).execute(&self.pool);
        match timeout_at(Instant::now() + UPGRADE_TIMEOUT, upgraded).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) if sqlstate(&error).as_deref() == Some("23505") => Ok(()),
            Ok(Err(error)) => Err(failed(&error)),
            Err(_) => Err(LockError::unavailable(
                "PostgreSQL: the lock table's upgrade did not finish in time",
            )),
        }
    }

    /// Why a statement failed; one that says the table is gone makes the next call
    /// create it again.
    fn failed(&self, error: &sqlx::Error) -> LockError {
        if sqlstate(error).as_deref() == Some(UNDEFINED_TABLE) {
            self.schema_made.store(false, Ordering::Release);
        }
        failed(error)
    }

    /// A connection of the lock's own, not past the deadline.
    async fn take_connection(&self, ask: &Ask<'_>) -> Result<PoolConnection<Postgres>, LockError> {
        match self.connection(ask.deadline).await {
            Ok(connection) => Ok(connection),
            // Our turn came too late to get a connection: the wait timed out.
            Err(_)
                if ask
                    .deadline
                    .is_some_and(|deadline| Instant::now() >= deadline) =>
            {
                Err(ask.timed_out())
            }
            Err(error) => Err(error),
        }
    }

    /// Waits in the server's queue for the key's advisory lock (or only asks, without a
    /// deadline), bumping the fencing counter in the same statement: the token and
    /// whether the last holder released, or `None` when a try found it held.
    async fn lock_advisory(
        &self,
        taken: &mut Slot<Postgres>,
        name: &str,
        ask: &Ask<'_>,
    ) -> Result<Option<(i64, bool)>, LockError> {
        self.counted();
        let granted = match ask.deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ask.timed_out());
                }
                // At least 1 ms: a lock_timeout of 0 would mean no limit at all.
                let lock_timeout = format!("{}ms", left.as_millis().max(1));
                let statement = sqlx::query(ACQUIRE)
                    .bind(name)
                    .bind(ask.note)
                    .bind(lock_timeout)
                    .fetch_optional(&mut **taken.connection());
                // The server gives up at the deadline; this bounds a server gone silent.
                timeout_at(deadline + self.op_timeout, statement).await
            }
            None => {
                let statement = sqlx::query(TRY_ACQUIRE)
                    .bind(name)
                    .bind(ask.note)
                    .fetch_optional(&mut **taken.connection());
                timeout_at(Instant::now() + self.op_timeout, statement).await
            }
        }
        .map_err(|_| LockError::unavailable("PostgreSQL did not answer in time"))?;
        let row = match granted {
            Ok(Some(row)) => row,
            // Not taken: the connection holds nothing, back to the pool.
            Ok(None) => {
                drop(taken.0.take());
                return Ok(None);
            }
            Err(error) if sqlstate(&error).as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                drop(taken.0.take());
                return Err(ask.timed_out());
            }
            // `taken` closes the connection: the lock may have been granted.
            Err(error) => return Err(self.failed(&error)),
        };
        let fence: i64 = row.try_get("fence").map_err(|error| failed(&error))?;
        let last_released: bool = row
            .try_get("last_released")
            .map_err(|error| failed(&error))?;
        Ok(Some((fence, last_released)))
    }

    /// Lock-delay at a grant whose last holder never released: waits the delay out,
    /// holding the lock — unless that would pass the deadline, when the lock is handed on
    /// (`false`, at the deadline).
    async fn honour_lock_delay(&self, held: &Held, ask: &Ask<'_>) -> bool {
        if self.options.lock_delay.is_zero() {
            return true;
        }
        let until = Instant::now() + self.options.lock_delay;
        let usable = ask.deadline.is_some_and(|deadline| until <= deadline);
        if !usable {
            // Held, but not usable before the caller gives up: hand it on.
            let _ = self.unlock(held).await;
            if let Some(deadline) = ask.deadline {
                sleep_until(deadline).await;
            }
            return false;
        }
        tracing::info!(
            key = ask.key,
            delay = ?self.options.lock_delay,
            "the last holder never released: waiting out the lock-delay"
        );
        sleep_until(until).await;
        true
    }

    /// Gives the lock back on its own connection; the connection returns to the pool only
    /// if the server answered (else it is closed, which frees the lock all the same).
    /// Whether the lock was still held.
    async fn unlock(&self, held: &Held) -> Result<bool, LockError> {
        let mut slot = held.connection.lock().await;
        let Some(connection) = slot.take() else {
            return Ok(false);
        };
        // Closed unless the unlock is answered: a call dropped mid-way must not pool a
        // connection that may still hold the lock.
        let mut connection = Slot(Some(connection));
        let statement = if self.options.lock_delay.is_zero() {
            UNLOCK
        } else {
            UNLOCK_RELEASED
        };
        self.counted();
        let unlocked = sqlx::query_scalar::<_, bool>(statement)
            .bind(&held.key)
            .fetch_optional(&mut **connection.connection());
        match timeout_at(Instant::now() + self.op_timeout, unlocked).await {
            Ok(Ok(unlocked)) => {
                drop(connection.hand_on());
                Ok(unlocked.unwrap_or(false))
            }
            // `connection` closes it.
            Ok(Err(error)) => Err(failed(&error)),
            Err(_) => {
                drop(connection);
                Err(LockError::unavailable(
                    "PostgreSQL did not answer in time; the lock's connection is closed",
                ))
            }
        }
    }
}

#[async_trait]
impl LockBackend for PostgresBackend {
    /// Takes the lock: waits in the server's queue until `deadline`, or not at all when
    /// `deadline` is `None` (then `Ok(None)` when it is held). The steps: the key's turn
    /// in this process, a connection of its own, the advisory lock (the server's queue of
    /// waiters) with the fencing token in the same statement, the lock-delay.
    async fn acquire(&self, ask: Ask<'_>) -> Result<Option<Lease>, LockError> {
        if ask.key.contains('\0') || ask.note.contains('\0') {
            return Err(LockError::Invalid(
                "PostgreSQL text cannot hold a NUL character".to_owned(),
            ));
        }
        self.ensure_schema().await?;
        let name = self.name(ask.key);
        // Our turn to wait in the server (in arrival order, in this process).
        let Some(_turn) = self
            .turns
            .wait(&name, ask.deadline)
            .await
            .map_err(|()| ask.timed_out())?
        else {
            // Someone of ours is waiting for it: it is held.
            return Ok(None);
        };
        // Closed unless handed on: an acquire that ends early (its call dropped mid-wait,
        // an error after the lock may have been taken) leaves its lock state unknown.
        let mut taken = Slot(Some(self.take_connection(&ask).await?));
        let Some((fence, last_released)) = self.lock_advisory(&mut taken, &name, &ask).await?
        else {
            return Ok(None);
        };
        // The lock has no expiry in the server: the lease the guard keeps starts now, with
        // the grant known, however long the wait was.
        let granted_at = Instant::now();
        let held = Held {
            key: name,
            connection: Arc::new(tokio::sync::Mutex::new(Slot(Some(taken.hand_on())))),
        };
        if !last_released && !self.honour_lock_delay(&held, &ask).await {
            return ask.not_granted();
        }
        let owner = OwnerToken::random();
        self.held().insert(owner, held);
        Ok(Some(Lease::new(
            ask.key,
            owner,
            FencingToken::new(fence.max(0).unsigned_abs()),
            ask.ttl,
            granted_at,
        )))
    }

    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        self.ensure_schema().await?;
        self.counted();
        let read = sqlx::query_scalar::<_, String>(HOLDER_NOTE)
            .bind(self.name(key))
            .fetch_optional(&self.pool);
        match timeout_at(Instant::now() + self.op_timeout, read).await {
            Ok(Ok(note)) => Ok(note),
            Ok(Err(error)) => Err(self.failed(&error)),
            Err(_) => Err(LockError::unavailable("PostgreSQL did not answer in time")),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(held) = self.held().remove(&lease.owner()) else {
            return Ok(false);
        };
        self.unlock(&held).await
    }

    async fn extend(&self, lease: &Lease, _ttl: Duration) -> Result<bool, LockError> {
        let (key, connection) = {
            let held = self.held();
            let Some(held) = held.get(&lease.owner()) else {
                return Ok(false);
            };
            (held.key.clone(), held.connection.clone())
        };
        let mut slot = connection.lock().await;
        let Some(open) = slot.as_mut() else {
            return Ok(false);
        };
        self.counted();
        let asked = sqlx::query_scalar::<_, bool>(HOLDS)
            .bind(&key)
            .fetch_one(&mut **open);
        match timeout_at(Instant::now() + self.op_timeout, asked).await {
            Ok(Ok(holds)) => Ok(holds),
            // The connection broke: whatever it held, the server frees with it, and we can
            // never use it again. Lost, for sure.
            Ok(Err(sqlx::Error::Io(_) | sqlx::Error::Protocol(_))) => {
                if let Some(connection) = slot.take() {
                    drop(connection.detach());
                }
                Ok(false)
            }
            Ok(Err(error)) => Err(failed(&error)),
            Err(_) => Err(LockError::unavailable("PostgreSQL did not answer in time")),
        }
    }

    async fn raise_fencing(
        &self,
        key: &str,
        floor: FencingToken,
    ) -> Result<FencingToken, LockError> {
        self.ensure_schema().await?;
        self.counted();
        let floor = i64::try_from(floor.get()).unwrap_or(i64::MAX);
        let raised = sqlx::query_scalar::<_, i64>(RAISE)
            .bind(self.name(key))
            .bind(floor)
            .fetch_one(&self.pool);
        match timeout_at(Instant::now() + self.op_timeout, raised).await {
            Ok(Ok(fence)) => Ok(FencingToken::new(fence.max(0).unsigned_abs())),
            Ok(Err(error)) => Err(self.failed(&error)),
            Err(_) => Err(LockError::unavailable("PostgreSQL did not answer in time")),
        }
    }

    async fn prune_idle(&self, idle_for: Duration) -> Result<u64, LockError> {
        self.ensure_schema().await?;
        // A century at most: PostgreSQL's intervals end short of i64::MAX microseconds.
        let idle_micros = i64::try_from(idle_for.min(MAX_IDLE).as_micros()).unwrap_or(i64::MAX);
        let prefix = self.name("");
        let mut forgotten = 0;
        for _ in 0..PRUNE_MAX_BATCHES {
            self.counted();
            let pruned = sqlx::query(PRUNE)
                .bind(idle_micros)
                .bind(PRUNE_BATCH)
                .bind(&prefix)
                .bind(!self.options.lock_delay.is_zero())
                .execute(&self.pool);
            let deleted = match timeout_at(Instant::now() + self.op_timeout, pruned).await {
                Ok(Ok(done)) => done.rows_affected(),
                Ok(Err(error)) => return Err(self.failed(&error)),
                Err(_) => return Err(LockError::unavailable("PostgreSQL did not answer in time")),
            };
            forgotten += deleted;
            if deleted < PRUNE_BATCH.unsigned_abs() {
                break;
            }
        }
        Ok(forgotten)
    }

    async fn ping(&self) -> Result<(), LockError> {
        self.counted();
        let pinged = sqlx::query("SELECT 1").execute(&self.pool);
        match timeout_at(Instant::now() + self.op_timeout, pinged).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(failed(&error)),
            Err(_) => Err(LockError::unavailable("PostgreSQL did not answer in time")),
        }
    }

    fn sessions(&self) -> Sessions {
        Sessions::PerConnection
    }
}
