//! Locks as InnoDB row locks — the seeds' second database scheme: a row per key, locked
//! with `SELECT … FOR UPDATE` inside a transaction held open on a connection of its own
//! for as long as the lock is held.
//!
//! - **The transaction is the lease.** COMMIT releases the lock; a connection that dies
//!   (the holder's process, the network, the server) rolls its transaction back and frees
//!   it. MariaDB's `idle_transaction_timeout` is set to the lease (rounded up to whole
//!   seconds, plus one: the server's clock starts a moment before the holder's) on the
//!   holder's session: a holder that stops heartbeating — paused, cut off —
//!   has its transaction killed by the server then, so a paused holder does not keep the
//!   lock forever. `extend` is the heartbeat: one statement on the holder's connection.
//! - **Waiting is the server's own queue**: `FOR UPDATE WAIT`, ended by the server at
//!   the deadline (`max_statement_time`, to the millisecond), the caller closing the
//!   connection should no answer come just after. One waiter per key per process is in
//!   the server's queue; the others wait their turn in the process.
//! - **Fencing token**: a counter per key in `payonce_lock_fences`, bumped by an
//!   autocommitted statement on another connection once the row lock is granted. Not in
//!   the locked row itself: a bump inside the holder's transaction would be rolled back
//!   with it when the holder dies, and its successor would be handed the same token. Grants
//!   are serialised by the row lock, so the bumps are too — which holds only while the row
//!   lock lasts through the bump: a bump that came late (a pause, a wait for a pooled
//!   connection) may follow the server's end of our transaction and a successor's bump. So
//!   a statement on the holder's connection then confirms the transaction lives, and a
//!   grant whose transaction ended gets no lock. The counter starts from the server's clock
//!   in microseconds and `raise_fencing` lifts it.
//! - The lock's statements carry the key as a hexadecimal literal (never as text), so the
//!   transaction's opening and its wait go in one round trip.
//! - **Per-key state** is two rows: the locked row and the counter's. A key's counter is
//!   made (or marked used) just before its row, so the row never outlives it, and the
//!   counter's `last_used` (its last bump) dates both. `prune_idle` works through the
//!   namespace's counters idle for the period, in batches, each a transaction that locks
//!   the counters, then those keys' rows that nobody holds (`SKIP LOCKED`), and deletes
//!   those rows and the counters left without one: a held row (and its queue of waiters)
//!   keeps both; a waiter that arrives at a row being pruned waits for the batch to
//!   commit, finds no row and makes it again, its counter from the clock. Kept as well: a
//!   counter above the clock (raised past it) and, with a lock-delay, one whose last
//!   holder never released. A batch locks and deletes row by row, by primary key, never
//!   by a list the server might answer with a scan: a scan would take other keys' rows
//!   (see `per_key`). Needs `SKIP LOCKED`: MariaDB 10.6 or later.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures::TryStreamExt;
use sqlx::pool::PoolConnection;
use sqlx::types::time::PrimitiveDateTime;
use sqlx::{AssertSqlSafe, MySql, MySqlPool, Row};
use tokio::time::{Instant, timeout_at};

use super::{Database, PRUNE_BATCH, PRUNE_MAX_BATCHES, failed, idle_micros, lock_name, too_slow};
use crate::backend::{Ask, DEFAULT_OP_TIMEOUT, Lease, LockBackend, LockOptions, Sessions};
use crate::error::LockError;
use crate::slot::Slot;
use crate::token::{FencingToken, OwnerToken};
use crate::turns::Turns;

/// What only [`MySqlRowBackend`] is configured with (the rest is [`LockOptions`]).
#[derive(Clone, Debug)]
pub struct MySqlRowOptions {
    /// The most connections this process opens for locks: one per held lock, one per key
    /// being waited for, a few for the counters.
    pub max_connections: u32,
}

impl Default for MySqlRowOptions {
    fn default() -> Self {
        Self {
            max_connections: 64,
        }
    }
}

/// The rows locked, and the counters with their holders' notes. A counter's `last_used`
/// (its last bump or raise, or its row's making) is what pruning goes by; the locked rows
/// have no column of their own for it: an `ALTER TABLE` of theirs, on upgrading, would
/// wait for every lock held.
const SCHEMA: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS payonce_lock_rows (
        lock_key VARBINARY(255) NOT NULL PRIMARY KEY
    ) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS payonce_lock_fences (
        lock_key VARBINARY(255) NOT NULL PRIMARY KEY,
        fence BIGINT NOT NULL,
        note VARBINARY(256) NOT NULL DEFAULT '',
        released BOOLEAN NOT NULL DEFAULT TRUE,
        last_released BOOLEAN NOT NULL DEFAULT TRUE,
        last_used DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        KEY payonce_lock_fences_last_used (last_used)
    ) ENGINE=InnoDB",
];

/// Makes a key's row (once: a row that is there already is left alone), its counter
/// first (from the clock) or, when there is one, marks the counter used now. In that
/// order, so a key's row never outlives its counter: a row is pruned with its counter
/// (see `prune_batch`), and one made here cannot be pruned before it is locked, as its
/// counter was just used. Autocommitted statements, in one round trip.
fn make_row(key_literal: &str) -> String {
    format!(
        "INSERT INTO payonce_lock_fences (lock_key, fence)
           VALUES ({key_literal}, CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED))
           ON DUPLICATE KEY UPDATE last_used = NOW(6);
         INSERT IGNORE INTO payonce_lock_rows (lock_key) VALUES ({key_literal})"
    )
}

/// Bumps the counter once the row lock is ours, notes the holder, and (for the lock-delay)
/// keeps whether the last holder released, marking this one unreleased; the new token is
/// the reported insert id. Parameters: key, note, note.
const BUMP: &str = "INSERT INTO payonce_lock_fences (lock_key, fence, note, released)
    VALUES (?, LAST_INSERT_ID(CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)), ?, FALSE)
    ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1), note = ?,
        last_released = released, released = FALSE, last_used = NOW(6)";

/// Whether the holder before this one released (lock-delay only). Parameter: key.
const LAST_RELEASED: &str = "SELECT last_released FROM payonce_lock_fences WHERE lock_key = ?";

/// Lifts the counter to at least the floor; reports it. Parameters: key, floor, floor.
const RAISE: &str = "INSERT INTO payonce_lock_fences (lock_key, fence)
    VALUES (?, LAST_INSERT_ID(GREATEST(?, CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED))))
    ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(GREATEST(fence, ?)), last_used = NOW(6)";

/// A pruning batch's candidates: up to N counters of a namespace last used more than an
/// idle period ago, past a cursor (last use, key), locked — those a bump or a raise is
/// writing are skipped. Kept: a counter above the clock (lifted by `raise_fencing` past
/// it — forgotten, it would start again below the floor), and, with a lock-delay, one
/// whose last holder never released (it is what makes the successor wait). Parameters:
/// idle µs, the prefix's length in bytes, the prefix (`<ns>:`), whether there is no
/// lock-delay, the cursor's last use (NULL: from the start) twice and key, N.
const IDLE_COUNTERS: &str = "SELECT lock_key, last_used FROM payonce_lock_fences
    WHERE last_used < NOW(6) - INTERVAL ? MICROSECOND
      AND LEFT(lock_key, ?) = ?
      AND fence < CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)
      AND (released OR ?)
      AND (? IS NULL OR last_used > ? OR (last_used = ? AND lock_key > ?))
    ORDER BY last_used, lock_key
    LIMIT ?
    FOR UPDATE SKIP LOCKED";

/// MariaDB's "lock wait timeout exceeded" (also what `NOWAIT` answers).
const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// MariaDB's "query execution was interrupted (max_statement_time exceeded)".
const STATEMENT_TIMEOUT: u16 = 1969;
/// How long past a waiter's deadline the caller still listens for the server to answer
/// that the wait ended (then it closes the connection instead).
const DEADLINE_GRACE: Duration = Duration::from_millis(100);

/// A lock this process holds: its connection, inside the open transaction.
struct Held {
    key: String,
    connection: Arc<tokio::sync::Mutex<Slot<MySql>>>,
}

/// What a lock-delay check at a grant found.
enum Usable {
    /// The last holder released: the lock is usable now.
    AtOnce,
    /// Usable after the delay, with the lease running from this heartbeat's sending.
    After(Instant),
    /// The delay would pass the deadline: the lock was handed on.
    HandedOn,
}

/// Locks as InnoDB row locks. See the module docs.
pub struct MySqlRowBackend {
    /// Its statements (round trips) counted for benchmarks and tests.
    database: Database,
    options: LockOptions,
    op_timeout: Duration,
    turns: Turns,
    held: Mutex<HashMap<OwnerToken, Held>>,
}

impl fmt::Debug for MySqlRowBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlRowBackend")
            .field("database", &self.database.name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A connection taken for an acquire: closed when dropped unless handed on, because an
/// acquire that ends early — its call dropped mid-wait, an error after the row may have
/// been locked — leaves its transaction's state unknown. (A closed connection's
/// transaction is rolled back by the server, and its lock freed.)
///
/// A server blocked in a lock wait does not read the socket, so closing it alone would
/// leave the wait in the row's queue until its own timeout — and let it take the lock for
/// a moment when its turn came. So the connection's thread, once known, is also killed
/// from another connection.
struct Taken {
    connection: Slot<MySql>,
    /// The server's id of the connection's thread (`CONNECTION_ID()`); 0 until known.
    thread: Arc<AtomicU64>,
    pool: MySqlPool,
    op_timeout: Duration,
}

impl Taken {
    fn new(connection: PoolConnection<MySql>, pool: &MySqlPool, op_timeout: Duration) -> Self {
        Self {
            connection: Slot(Some(connection)),
            thread: Arc::new(AtomicU64::new(0)),
            pool: pool.clone(),
            op_timeout,
        }
    }

    fn connection(&mut self) -> &mut PoolConnection<MySql> {
        self.connection.connection()
    }

    fn hand_on(mut self) -> PoolConnection<MySql> {
        self.connection
            .take()
            .expect("a taken connection is handed on once")
    }

    /// Nothing is locked and no transaction is open: the connection goes back to the pool.
    fn back_to_the_pool(&mut self) {
        drop(self.connection.take());
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        // Still here: the slot closes it once this returns; its thread is killed too.
        if self.connection.is_none() {
            return;
        }
        let thread = self.thread.load(Ordering::Relaxed);
        if thread == 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, op_timeout) = (self.pool.clone(), self.op_timeout);
        runtime.spawn(async move {
            // Best effort: should the kill fail, the wait still ends at its own timeout,
            // and a grant to a closed connection is rolled back as its answer fails.
            let kill = sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {thread}")));
            let _ = tokio::time::timeout(op_timeout, kill.execute(&pool)).await;
        });
    }
}

/// A key's bytes as a MySQL hexadecimal literal: safe to write into a statement.
fn hex_literal(name: impl AsRef<[u8]>) -> String {
    let name = name.as_ref();
    let mut literal = String::with_capacity(3 + 2 * name.len());
    literal.push_str("X'");
    for byte in name {
        literal.push_str(&format!("{byte:02x}"));
    }
    literal.push('\'');
    literal
}

/// Keys as a list of literals, for `IN (…)` in a read that locks nothing (see
/// [`per_key`]).
fn hex_list<'a>(keys: impl IntoIterator<Item = &'a Vec<u8>>) -> String {
    keys.into_iter()
        .map(hex_literal)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `statement` for each key (given the key's literal), to be sent in one round trip.
/// Pruning reaches each row it locks or deletes by the whole primary key, one lookup per
/// statement, never through `IN (…)`: for a list the optimizer may scan the table
/// instead — it does when the list is most of a small table, as on a new server — and a
/// locking scan locks the row of every key it passes and waits for each held one;
/// granted it at its holder's release, it keeps it until the batch commits (READ
/// COMMITTED lets go only of the rows it did not wait for). The key just released is then
/// held by the batch: a `try_acquire` finds it taken, a waiter waits, and the batch
/// itself waits, up to the server's lock wait timeout, for the next held row it passes.
fn per_key<'a>(
    keys: impl IntoIterator<Item = &'a Vec<u8>>,
    statement: impl Fn(&str) -> String,
) -> String {
    keys.into_iter()
        .map(|key| statement(&hex_literal(key)))
        .collect::<Vec<_>>()
        .join(";\n")
}

/// The server ended a lock wait: `NOWAIT`/`WAIT` ran out, or `max_statement_time` did.
fn is_wait_ended(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|error| matches!(error.number(), LOCK_WAIT_TIMEOUT | STATEMENT_TIMEOUT))
}

/// The statement that opens the transaction and waits for the key's row (its literal).
/// With a deadline, the server ends the wait itself when it comes (`max_statement_time`,
/// to the millisecond; `WAIT` counts only whole seconds), so an expired waiter leaves the
/// server's queue at once and its connection goes back to the pool; the caller stops
/// listening a moment later, should the server not answer. `None` once the deadline
/// passed.
fn lock_statement(key_literal: &str, ask: &Ask<'_>) -> Option<String> {
    // The server's own lease on the holder: a transaction idle this long is killed. A
    // second more than the lease, rounded up: the server's clock starts as the lock
    // statement ends, a moment before the holder hears of it and starts its own.
    let idle = ask.ttl.as_secs_f64().ceil().max(1.0) + 1.0;
    match ask.deadline {
        Some(deadline) => {
            let left = deadline.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| {
                format!(
                    "SELECT CONNECTION_ID();
                     SET SESSION idle_transaction_timeout = {idle};
                     START TRANSACTION;
                     SET STATEMENT max_statement_time = {:.3} FOR
                     SELECT 1 FROM payonce_lock_rows WHERE lock_key = {key_literal}
                     FOR UPDATE WAIT {}",
                    left.as_secs_f64().max(0.001),
                    left.as_secs_f64().ceil().max(1.0)
                )
            })
        }
        None => Some(format!(
            "SELECT CONNECTION_ID();
             SET SESSION idle_transaction_timeout = {idle};
             START TRANSACTION;
             SELECT 1 FROM payonce_lock_rows WHERE lock_key = {key_literal}
             FOR UPDATE NOWAIT"
        )),
    }
}

impl MySqlRowBackend {
    /// A backend for `url` (`mysql-row://user[:password]@host[:port]/<database>`, or
    /// `mysql://…`; the database and its tables are created on first use). Connects
    /// lazily; must be used inside a Tokio runtime.
    pub fn open(url: &str, options: &LockOptions, own: MySqlRowOptions) -> Result<Self, LockError> {
        let url = match url.strip_prefix("mysql-row://") {
            Some(rest) => format!("mysql://{rest}"),
            None => url.to_owned(),
        };
        let op_timeout = options.op_timeout_or(DEFAULT_OP_TIMEOUT);
        Ok(Self {
            database: Database::open(&url, own.max_connections.max(2), op_timeout)?,
            options: options.clone(),
            op_timeout,
            turns: Turns::default(),
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Statements (round trips) sent so far.
    pub fn requests(&self) -> u64 {
        self.database.requests()
    }

    fn held(&self) -> MutexGuard<'_, HashMap<OwnerToken, Held>> {
        // Inserts and removes cannot leave the map inconsistent.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn name(&self, key: &str) -> Result<String, LockError> {
        lock_name(&self.options.namespace, key)
    }

    /// Runs one statement, bounded by `limit` (or the op timeout), counted.
    async fn run<T>(
        &self,
        limit: Option<Instant>,
        statement: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, sqlx::Error> {
        self.database.count();
        let limit = limit.unwrap_or_else(|| Instant::now() + self.op_timeout);
        match timeout_at(limit, statement).await {
            Ok(answer) => answer,
            Err(_) => Err(sqlx::Error::PoolTimedOut),
        }
    }

    fn failed(&self, error: &sqlx::Error) -> LockError {
        if matches!(error, sqlx::Error::PoolTimedOut) {
            return too_slow();
        }
        self.database.failed(error)
    }

    async fn ensure_schema(&self) -> Result<(), LockError> {
        self.database
            .ensure_schema(&SCHEMA, "payonce_lock_fences", self.op_timeout)
            .await
    }

    /// A connection from the pool, not past `deadline` nor the op timeout.
    async fn connection(
        &self,
        deadline: Option<Instant>,
    ) -> Result<PoolConnection<MySql>, LockError> {
        let limit = Instant::now() + self.op_timeout;
        let limit = deadline.map_or(limit, |deadline| deadline.min(limit));
        match timeout_at(limit, self.database.pool.acquire()).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(error)) => Err(failed(&error)),
            Err(_) => Err(LockError::unavailable("MySQL: no connection in time")),
        }
    }

    /// A connection of the lock's own, not past the deadline.
    async fn take_connection(&self, ask: &Ask<'_>) -> Result<Taken, LockError> {
        let connection = match self.connection(ask.deadline).await {
            Ok(connection) => connection,
            Err(_)
                if ask
                    .deadline
                    .is_some_and(|deadline| Instant::now() >= deadline) =>
            {
                return Err(ask.timed_out());
            }
            Err(error) => return Err(error),
        };
        Ok(Taken::new(connection, &self.database.pool, self.op_timeout))
    }

    /// Waits in the row's queue until the server locks it for us (making the key's row
    /// first if it has none): when it did, or `None` when the wait ended without the lock
    /// (held, for a try; the deadline, for a waiter).
    async fn lock_row(
        &self,
        taken: &mut Taken,
        name: &str,
        ask: &Ask<'_>,
    ) -> Result<Option<Instant>, LockError> {
        let key_literal = hex_literal(name);
        let limit = ask.deadline.map(|deadline| deadline + DEADLINE_GRACE);
        let mut made_row = false;
        loop {
            let Some(lock) = lock_statement(&key_literal, ask) else {
                return Err(ask.timed_out());
            };
            let thread = taken.thread.clone();
            let locked = self
                .run(limit, async {
                    // The thread's id comes back at once, before the wait.
                    let mut rows =
                        sqlx::raw_sql(AssertSqlSafe(lock)).fetch(&mut **taken.connection());
                    if let Some(row) = rows.try_next().await? {
                        thread.store(row.try_get::<u64, _>(0)?, Ordering::Relaxed);
                    }
                    rows.try_next().await
                })
                .await;
            match locked {
                Ok(Some(_)) => return Ok(Some(Instant::now())),
                // No row for the key yet: make it, and lock it.
                Ok(None) if !made_row => {
                    made_row = true;
                    self.roll_back(taken).await?;
                    let make = make_row(&key_literal);
                    self.run(
                        None,
                        sqlx::raw_sql(AssertSqlSafe(make)).execute(&self.database.pool),
                    )
                    .await
                    .map_err(|error| self.failed(&error))?;
                }
                Ok(None) => {
                    return Err(LockError::unavailable(
                        "MySQL: the lock's row vanished as it was made",
                    ));
                }
                Err(error) if is_wait_ended(&error) => {
                    // Nothing locked; the transaction is still open: roll it back, and
                    // the connection can go back to the pool.
                    if self.roll_back(taken).await.is_ok() {
                        taken.back_to_the_pool();
                    }
                    return Ok(None);
                }
                // Our own deadline, hit mid-wait: `taken` closes the connection.
                Err(sqlx::Error::PoolTimedOut) if ask.deadline.is_some() => {
                    return Err(ask.timed_out());
                }
                Err(error) => return Err(self.failed(&error)),
            }
        }
    }

    /// Rolls back the transaction a lock statement opened without locking anything.
    async fn roll_back(&self, taken: &mut Taken) -> Result<(), LockError> {
        self.run(
            None,
            sqlx::raw_sql("ROLLBACK").execute(&mut **taken.connection()),
        )
        .await
        .map(drop)
        .map_err(|error| self.failed(&error))
    }

    /// The row is ours: bumps the key's counter on another connection, committed at
    /// once, and confirms that the row is ours still. Returns the held lock and its token.
    async fn draw_token(
        &self,
        taken: Taken,
        name: String,
        note: &str,
    ) -> Result<(Held, u64), LockError> {
        let bumped = self
            .run(
                None,
                sqlx::query(BUMP)
                    .bind(&name)
                    .bind(note)
                    .bind(note)
                    .execute(&self.database.pool),
            )
            .await
            .map_err(|error| self.failed(&error))?;
        let held = Held {
            key: name,
            connection: Arc::new(tokio::sync::Mutex::new(Slot(Some(taken.hand_on())))),
        };
        // The row must still be ours now that the counter moved. The bump runs on another
        // connection and may come late — the process paused, or no pooled connection was
        // free — and if the server ended our transaction meanwhile (idle past the lease),
        // a successor may have locked the row and drawn a smaller token than ours. So one
        // statement on the holder's connection confirms the transaction lives: the server
        // ends a transaction only by closing its connection (we send no COMMIT or ROLLBACK
        // in between), so if it answers, we held the row without a break from the lock
        // through the bump, and every other grant's bump came before our lock or comes
        // after our release; if not, our token goes to nobody (a gap in the counter, never
        // a reversal). As memcached's grant confirms its item after the increment.
        if !self.heartbeat(&held).await? {
            return Err(LockError::unavailable(
                "MySQL: the row's transaction ended before its fencing token was drawn",
            ));
        }
        Ok((held, bumped.last_insert_id()))
    }

    /// Lock-delay at a grant: if the last holder never released, waits the delay holding
    /// the lock, its transaction kept alive by a heartbeat every third of the lease —
    /// unless the wait would pass `deadline`, when the lock is handed on.
    async fn usable(
        &self,
        held: &Held,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Usable, LockError> {
        let released: Option<bool> = self
            .run(
                None,
                sqlx::query_scalar(LAST_RELEASED)
                    .bind(&held.key)
                    .fetch_optional(&self.database.pool),
            )
            .await
            .map_err(|error| self.failed(&error))?;
        if released.unwrap_or(true) {
            return Ok(Usable::AtOnce);
        }
        let until = Instant::now() + self.options.lock_delay;
        if deadline.is_some_and(|deadline| until > deadline) {
            self.commit(held, false).await?;
            if let Some(deadline) = deadline {
                tokio::time::sleep_until(deadline).await;
            }
            return Ok(Usable::HandedOn);
        }
        tracing::info!(
            key = held.key,
            delay = ?self.options.lock_delay,
            "the last holder never released: waiting out the lock-delay"
        );
        loop {
            tokio::time::sleep_until(until.min(Instant::now() + ttl / 3)).await;
            let sent_at = Instant::now();
            if !self.heartbeat(held).await? {
                return Err(LockError::unavailable(
                    "MySQL: the connection holding the row broke during the lock-delay",
                ));
            }
            if sent_at >= until {
                return Ok(Usable::After(sent_at));
            }
        }
    }

    /// One statement in the holder's transaction, which restarts the server's idle clock:
    /// whether the transaction is alive (a broken connection is closed).
    async fn heartbeat(&self, held: &Held) -> Result<bool, LockError> {
        let mut slot = held.connection.lock().await;
        let Some(open) = slot.as_mut() else {
            return Ok(false);
        };
        match self
            .run(None, sqlx::raw_sql("SELECT 1").execute(&mut **open))
            .await
        {
            Ok(_) => Ok(true),
            Err(sqlx::Error::PoolTimedOut) => Err(too_slow()),
            Err(_) => {
                if let Some(connection) = slot.take() {
                    drop(connection.detach());
                }
                Ok(false)
            }
        }
    }

    /// Ends the holder's transaction, freeing the row; with a lock-delay and `released`,
    /// marks the release inside that same transaction — so a holder whose transaction
    /// died marks nothing. Whether the lock was still ours.
    async fn commit(&self, held: &Held, released: bool) -> Result<bool, LockError> {
        let mut slot = held.connection.lock().await;
        let Some(mut connection) = slot.take() else {
            return Ok(false);
        };
        let commit = if released && !self.options.lock_delay.is_zero() {
            format!(
                "UPDATE payonce_lock_fences SET released = TRUE WHERE lock_key = {}; COMMIT",
                hex_literal(&held.key)
            )
        } else {
            "COMMIT".to_owned()
        };
        match self
            .run(
                None,
                sqlx::raw_sql(AssertSqlSafe(commit)).execute(&mut *connection),
            )
            .await
        {
            Ok(_) => Ok(true),
            // The connection is gone (killed idle, the network, the server): so is its
            // transaction, and the lock with it. Not ours to release any more.
            Err(sqlx::Error::Io(_) | sqlx::Error::Protocol(_)) => {
                drop(connection.detach());
                Ok(false)
            }
            Err(error) => {
                drop(connection.detach());
                Err(self.failed(&error))
            }
        }
    }

    /// One pruning batch, in a transaction of its own: locks up to [`PRUNE_BATCH`] idle
    /// counters past `cursor` (and moves it past them), then the rows of those keys that
    /// nobody holds (`SKIP LOCKED`: a held row is locked by its holder's transaction),
    /// deletes those rows, and deletes the counters of the keys left without a row. A held
    /// key keeps both. Waiters wait only on a held row; one that comes to a row this
    /// batch locked waits for its commit, finds no row, and makes it again with its
    /// counter from the clock — above the deleted one, which was below the clock. The
    /// batch never waits for a lock nor takes another key's row ([`per_key`]), so it
    /// holds up a grant of its keys for no longer than its own statements, and no other
    /// grant at all. Reads in READ COMMITTED: the rows' check sees the holders' rows, with
    /// no gap locks to hold up rows being made. The candidates it found, and the keys it
    /// forgot.
    async fn prune_batch(
        &self,
        idle_for: Duration,
        prefix: &str,
        cursor: &mut Option<(PrimitiveDateTime, Vec<u8>)>,
    ) -> Result<(u64, u64), LockError> {
        // Closed unless the batch commits: its transaction is then rolled back.
        let mut slot = Slot(Some(self.connection(None).await?));
        let start = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";
        self.run(None, sqlx::raw_sql(start).execute(&mut **slot.connection()))
            .await
            .map_err(|error| self.failed(&error))?;
        let candidates = self
            .idle_counters(&mut slot, idle_for, prefix, cursor.clone())
            .await?;
        let forgotten = match candidates.last() {
            None => {
                self.finish_batch(&mut slot, "COMMIT".to_owned()).await?;
                0
            }
            Some((last_key, last_used)) => {
                *cursor = Some((*last_used, last_key.clone()));
                self.delete_unheld(&mut slot, &candidates).await?
            }
        };
        drop(slot.hand_on());
        Ok((candidates.len() as u64, forgotten))
    }

    /// Locks up to [`PRUNE_BATCH`] of the namespace's counters idle for `idle_for`, past
    /// `cursor`, in the order pruning walks them (last use, then key).
    async fn idle_counters(
        &self,
        slot: &mut Slot<MySql>,
        idle_for: Duration,
        prefix: &str,
        cursor: Option<(PrimitiveDateTime, Vec<u8>)>,
    ) -> Result<Vec<(Vec<u8>, PrimitiveDateTime)>, LockError> {
        let (after_used, after_key) = cursor.unzip();
        self.run(
            None,
            sqlx::query_as(IDLE_COUNTERS)
                .bind(idle_micros(idle_for))
                .bind(prefix.len() as u64)
                .bind(prefix)
                .bind(self.options.lock_delay.is_zero())
                .bind(after_used)
                .bind(after_used)
                .bind(after_used)
                .bind(after_key)
                .bind(PRUNE_BATCH)
                .fetch_all(&mut **slot.connection()),
        )
        .await
        .map_err(|error| self.failed(&error))
    }

    /// Deletes the candidates' rows that nobody holds, then the counters of the keys left
    /// without a row, and commits; it locks and deletes key by key ([`per_key`]), so it
    /// touches no other key's row. How many keys it forgot.
    async fn delete_unheld(
        &self,
        slot: &mut Slot<MySql>,
        candidates: &[(Vec<u8>, PrimitiveDateTime)],
    ) -> Result<u64, LockError> {
        let keys = || candidates.iter().map(|(key, _)| key);
        let free = self
            .keys(
                slot,
                per_key(keys(), |key| {
                    format!(
                        "SELECT lock_key FROM payonce_lock_rows WHERE lock_key = {key}
                         FOR UPDATE SKIP LOCKED"
                    )
                }),
            )
            .await?;
        if !free.is_empty() {
            let delete = per_key(&free, |key| {
                format!("DELETE FROM payonce_lock_rows WHERE lock_key = {key}")
            });
            self.run(
                None,
                sqlx::raw_sql(AssertSqlSafe(delete)).execute(&mut **slot.connection()),
            )
            .await
            .map_err(|error| self.failed(&error))?;
        }
        // What is left of those rows is held (or was made since, for a grant to come). A
        // plain read, which locks nothing however the optimizer reads the list.
        let kept: std::collections::HashSet<Vec<u8>> = self
            .keys(
                slot,
                format!(
                    "SELECT lock_key FROM payonce_lock_rows WHERE lock_key IN ({})",
                    hex_list(keys())
                ),
            )
            .await?
            .into_iter()
            .collect();
        let forgotten: Vec<&Vec<u8>> = candidates
            .iter()
            .map(|(key, _)| key)
            .filter(|key| !kept.contains(*key))
            .collect();
        let finish = if forgotten.is_empty() {
            "COMMIT".to_owned()
        } else {
            let delete = per_key(forgotten.iter().copied(), |key| {
                format!("DELETE FROM payonce_lock_fences WHERE lock_key = {key}")
            });
            format!("{delete}; COMMIT")
        };
        self.finish_batch(slot, finish).await?;
        Ok(forgotten.len() as u64)
    }

    /// Runs a batch's last statements, which commit it.
    async fn finish_batch(&self, slot: &mut Slot<MySql>, finish: String) -> Result<(), LockError> {
        self.run(
            None,
            sqlx::raw_sql(AssertSqlSafe(finish)).execute(&mut **slot.connection()),
        )
        .await
        .map(drop)
        .map_err(|error| self.failed(&error))
    }

    /// The keys a statement of `prune_batch` answers.
    async fn keys(
        &self,
        slot: &mut Slot<MySql>,
        statement: String,
    ) -> Result<Vec<Vec<u8>>, LockError> {
        let rows = self
            .run(
                None,
                sqlx::raw_sql(AssertSqlSafe(statement)).fetch_all(&mut **slot.connection()),
            )
            .await
            .map_err(|error| self.failed(&error))?;
        rows.iter()
            .map(|row| row.try_get::<Vec<u8>, _>(0))
            .collect::<Result<_, _>>()
            .map_err(|error| failed(&error))
    }

    /// Whether a row lock on `name` is held by anyone: a shared-lock probe that does not
    /// wait, rolled back at once.
    async fn is_locked(&self, name: &str) -> Result<bool, LockError> {
        let mut taken = Taken::new(
            self.connection(None).await?,
            &self.database.pool,
            self.op_timeout,
        );
        let probe = format!(
            "START TRANSACTION;
             SELECT 1 FROM payonce_lock_rows WHERE lock_key = {} LOCK IN SHARE MODE NOWAIT",
            hex_literal(name)
        );
        let probed = self
            .run(
                None,
                sqlx::raw_sql(AssertSqlSafe(probe)).fetch_optional(&mut **taken.connection()),
            )
            .await;
        let locked = match probed {
            Ok(_) => false,
            Err(error) if is_wait_ended(&error) => true,
            Err(error) => return Err(self.failed(&error)),
        };
        self.run(
            None,
            sqlx::raw_sql("ROLLBACK").execute(&mut **taken.connection()),
        )
        .await
        .map_err(|error| self.failed(&error))?;
        drop(taken.hand_on());
        Ok(locked)
    }
}

#[async_trait]
impl LockBackend for MySqlRowBackend {
    /// Takes the lock: waits in the server's queue until `deadline`, or not at all when
    /// `deadline` is `None` (then `Ok(None)` when it is held). The steps: the key's turn
    /// in this process, a connection of its own, the row's lock (the server's queue of
    /// waiters), the fencing token, the lock-delay.
    async fn acquire(&self, ask: Ask<'_>) -> Result<Option<Lease>, LockError> {
        let name = self.name(ask.key)?;
        self.ensure_schema().await?;
        let Some(_turn) = self
            .turns
            .wait(&name, ask.deadline)
            .await
            .map_err(|()| ask.timed_out())?
        else {
            return Ok(None);
        };
        let mut taken = self.take_connection(&ask).await?;
        let Some(locked_at) = self.lock_row(&mut taken, &name, &ask).await? else {
            return ask.not_granted();
        };
        let (held, token) = self.draw_token(taken, name, ask.note).await?;
        // The lease runs from when the server locked the row (its idle clock started
        // then), or from the last heartbeat of a lock-delay wait.
        let granted_at = if self.options.lock_delay.is_zero() {
            locked_at
        } else {
            match self.usable(&held, ask.ttl, ask.deadline).await? {
                Usable::AtOnce => locked_at,
                Usable::After(heartbeat) => heartbeat,
                Usable::HandedOn => return ask.not_granted(),
            }
        };
        let owner = OwnerToken::random();
        self.held().insert(owner, held);
        Ok(Some(Lease::new(
            ask.key,
            owner,
            FencingToken::new(token),
            ask.ttl,
            granted_at,
        )))
    }

    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        let name = self.name(key)?;
        self.ensure_schema().await?;
        if !self.is_locked(&name).await? {
            return Ok(None);
        }
        let note: Option<Vec<u8>> = self
            .run(
                None,
                sqlx::query_scalar("SELECT note FROM payonce_lock_fences WHERE lock_key = ?")
                    .bind(&name)
                    .fetch_optional(&self.database.pool),
            )
            .await
            .map_err(|error| self.failed(&error))?;
        Ok(note.map(|note| String::from_utf8_lossy(&note).into_owned()))
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(held) = self.held().remove(&lease.owner()) else {
            return Ok(false);
        };
        self.commit(&held, true).await
    }

    async fn extend(&self, lease: &Lease, _ttl: Duration) -> Result<bool, LockError> {
        let connection = {
            let held = self.held();
            let Some(held) = held.get(&lease.owner()) else {
                return Ok(false);
            };
            Held {
                key: held.key.clone(),
                connection: held.connection.clone(),
            }
        };
        // Alive, inside its transaction: the row is still locked by it.
        self.heartbeat(&connection).await
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
                None,
                sqlx::query(RAISE)
                    .bind(name)
                    .bind(floor)
                    .bind(floor)
                    .execute(&self.database.pool),
            )
            .await
            .map_err(|error| self.failed(&error))?;
        Ok(FencingToken::new(raised.last_insert_id()))
    }

    async fn prune_idle(&self, idle_for: Duration) -> Result<u64, LockError> {
        self.ensure_schema().await?;
        let prefix = self.name("")?;
        // Past the keys already looked at, so a batch never meets again the counters of
        // keys held for longer than `idle_for`, which it keeps.
        let mut cursor = None;
        let mut forgotten = 0;
        for _ in 0..PRUNE_MAX_BATCHES {
            let (candidates, pruned) = self.prune_batch(idle_for, &prefix, &mut cursor).await?;
            forgotten += pruned;
            if candidates < PRUNE_BATCH {
                break;
            }
        }
        Ok(forgotten)
    }

    async fn ping(&self) -> Result<(), LockError> {
        // The database is made on first use, and a ping may be the first: without it the
        // pool's connections (which name the database) could never be opened.
        self.ensure_schema().await?;
        self.run(None, sqlx::query("SELECT 1").execute(&self.database.pool))
            .await
            .map_err(|error| self.failed(&error))?;
        Ok(())
    }

    fn sessions(&self) -> Sessions {
        Sessions::PerConnection
    }
}
