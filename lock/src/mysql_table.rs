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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::MySqlPool;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::error::LockError;
use crate::service::{Lease, LockBackend, Sessions, check_floor, validate, validate_note};
use crate::token::{FencingToken, OwnerToken};
use crate::turns::Turns;

/// Settings for [`MySqlTableBackend`].
#[derive(Clone, Debug)]
pub struct MySqlTableOptions {
    /// Prefixes every key, so deployments sharing a table never meet.
    pub namespace: String,
    /// Upper bound on connecting and on any one statement.
    pub op_timeout: Duration,
    /// The most connections this process opens for locks.
    pub max_connections: u32,
    /// Chubby's lock-delay: the row's lease outlives the holder's by this much, so a holder
    /// that vanished keeps its key that much longer. Zero by default.
    pub lock_delay: Duration,
    /// The most waiters one key takes in this process; past it an acquire fails at once.
    pub max_waiters: usize,
}

impl Default for MySqlTableOptions {
    fn default() -> Self {
        Self {
            namespace: "payonce".to_owned(),
            op_timeout: Duration::from_secs(2),
            max_connections: 16,
            lock_delay: Duration::ZERO,
            max_waiters: crate::service::DEFAULT_MAX_WAITERS,
        }
    }
}

/// The longest key (with its namespace) the table takes, in bytes.
pub(crate) const MAX_KEY: usize = 255;

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

/// The most rows one pruning statement deletes: a short statement, whose row locks hold
/// up no grant for long.
pub(crate) const PRUNE_BATCH: u64 = 1000;

/// The most batches of one pruning pass (a million keys): a pass ends in bounded time
/// however much an earlier version left behind, and the next pass goes on.
pub(crate) const PRUNE_MAX_BATCHES: u32 = 1000;

/// Idle periods are cut to a century (as good as never): `INTERVAL` arithmetic past it
/// leaves the calendar.
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// How long the one-time upgrade of an earlier version's table may take: it builds an
/// index over every row that version left behind.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(60);

/// MariaDB's "duplicate column name" and "duplicate key name": another process upgraded
/// the table first.
const DUPLICATE_COLUMN: u16 = 1060;
const DUPLICATE_KEY_NAME: u16 = 1061;

/// Locks as rows of a MySQL / MariaDB table. See the module docs.
pub struct MySqlTableBackend {
    pool: MySqlPool,
    /// The server without a database, to create the database on first use.
    server: MySqlConnectOptions,
    database: String,
    options: MySqlTableOptions,
    schema_made: AtomicBool,
    making_schema: tokio::sync::Mutex<()>,
    turns: Turns,
    /// The grants held here, by owner: their keys, so extend and release find them.
    held: Mutex<HashMap<OwnerToken, String>>,
    /// Statements sent, for benchmarks and tests.
    requests: AtomicU64,
}

impl fmt::Debug for MySqlTableBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlTableBackend")
            .field("database", &self.database)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

pub(crate) fn failed(error: &sqlx::Error) -> LockError {
    LockError::unavailable(format!("MySQL: {error}"))
}

pub(crate) fn too_slow() -> LockError {
    LockError::unavailable("MySQL did not answer in time")
}

/// Microseconds of a duration, as the statements take them.
fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// The database a `mysql://…/<database>` URL names, and the options without it.
pub(crate) fn split_database(
    url: &str,
) -> Result<(MySqlConnectOptions, MySqlConnectOptions, String), LockError> {
    let options: MySqlConnectOptions = url
        .parse()
        .map_err(|error| LockError::Invalid(format!("bad MySQL URL: {error}")))?;
    let database = options
        .get_database()
        .filter(|database| !database.is_empty())
        .ok_or_else(|| LockError::Invalid("a MySQL lock URL names its database".to_owned()))?
        .to_owned();
    if !database
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(LockError::Invalid(format!(
            "the lock database's name is letters, digits and underscores: {database:?}"
        )));
    }
    let without = url
        .rsplit_once('/')
        .map_or(url, |(server, _)| server)
        .parse()
        .map_err(|error| LockError::Invalid(format!("bad MySQL URL: {error}")))?;
    Ok((options, without, database))
}

/// Creates `database` on the server if it is not there.
pub(crate) async fn create_database(
    server: &MySqlConnectOptions,
    database: &str,
    limit: Instant,
) -> Result<(), LockError> {
    use sqlx::Connection;
    let created = async {
        let mut connection = sqlx::MySqlConnection::connect_with(server).await?;
        // `database` is letters, digits and underscores (see `split_database`).
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE IF NOT EXISTS `{database}`"
        )))
        .execute(&mut connection)
        .await?;
        connection.close().await
    };
    match timeout_at(limit, created).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(failed(&error)),
        Err(_) => Err(too_slow()),
    }
}

/// Gives `table`, made by an earlier version without it, the `last_used` column pruning
/// needs, with its index (`<table>_last_used`). Asked first, so the `ALTER TABLE` (which
/// waits for the table's open transactions) runs once, not at every start. Existing rows
/// count as used at the upgrade: their last use is unknown, so they are pruned one idle
/// period later.
pub(crate) async fn add_last_used(
    pool: &MySqlPool,
    table: &str,
    op_timeout: Duration,
) -> Result<(), LockError> {
    let asked = sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM information_schema.COLUMNS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'last_used'",
    )
    .bind(table)
    .fetch_one(pool);
    match timeout_at(Instant::now() + op_timeout, asked).await {
        Ok(Ok(0)) => {}
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(error)) => return Err(failed(&error)),
        Err(_) => return Err(too_slow()),
    }
    // `table` is one of the backends' own names, never input.
    let alter = sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {table}
         ADD COLUMN last_used DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
         ADD KEY {table}_last_used (last_used)"
    )))
    .execute(pool);
    match timeout_at(Instant::now() + UPGRADE_TIMEOUT, alter).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error))
            if error
                .as_database_error()
                .and_then(|error| error.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
                .is_some_and(|error| {
                    matches!(error.number(), DUPLICATE_COLUMN | DUPLICATE_KEY_NAME)
                }) =>
        {
            Ok(())
        }
        Ok(Err(error)) => Err(failed(&error)),
        Err(_) => Err(LockError::unavailable(
            "MySQL: the lock table's upgrade did not finish in time",
        )),
    }
}

/// An idle period in microseconds, as the pruning statements take it.
pub(crate) fn idle_micros(idle_for: Duration) -> i64 {
    micros(idle_for.min(MAX_IDLE))
}

/// A key's row name: `<namespace>:<key>`, within the table's key column (both MySQL
/// backends).
pub(crate) fn lock_name(namespace: &str, key: &str) -> Result<String, LockError> {
    let name = format!("{namespace}:{key}");
    if name.len() > MAX_KEY {
        return Err(LockError::Invalid(format!(
            "a MySQL lock key is at most {MAX_KEY} bytes with its namespace"
        )));
    }
    Ok(name)
}

impl MySqlTableBackend {
    /// A backend for `url` (`mysql://user[:password]@host[:port]/<database>`; the database
    /// and its table are created on first use). Connects lazily; must be used inside a
    /// Tokio runtime.
    pub fn open(url: &str, options: MySqlTableOptions) -> Result<Self, LockError> {
        let (connect, server, database) = split_database(url)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .min_connections(0)
            .acquire_timeout(options.op_timeout)
            .connect_lazy_with(connect);
        Ok(Self {
            pool,
            server,
            database,
            options,
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
        self.requests.fetch_add(1, Ordering::Relaxed);
        match timeout_at(Instant::now() + self.options.op_timeout, statement).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => {
                // 1146: the table is gone (dropped by hand, a restore without it).
                if error
                    .as_database_error()
                    .and_then(|error| error.code())
                    .is_some_and(|code| code == "42S02")
                {
                    self.schema_made.store(false, Ordering::Release);
                }
                Err(failed(&error))
            }
            Err(_) => Err(too_slow()),
        }
    }

    /// Creates the database and the table once.
    async fn ensure_schema(&self) -> Result<(), LockError> {
        if self.schema_made.load(Ordering::Acquire) {
            return Ok(());
        }
        let limit = Instant::now() + self.options.op_timeout;
        let _making = timeout_at(limit, self.making_schema.lock())
            .await
            .map_err(|_| too_slow())?;
        if self.schema_made.load(Ordering::Acquire) {
            return Ok(());
        }
        create_database(&self.server, &self.database, limit).await?;
        self.run(sqlx::query(SCHEMA).execute(&self.pool)).await?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        add_last_used(&self.pool, "payonce_locks", self.options.op_timeout).await?;
        self.schema_made.store(true, Ordering::Release);
        Ok(())
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
                    .execute(&self.pool),
            )
            .await?;
        let id = answer.last_insert_id();
        Ok(if id >= REFUSED {
            Err(Duration::from_micros(id - REFUSED))
        } else {
            Ok(id)
        })
    }

    /// Takes the lock, polling until `deadline`, or trying once when `deadline` is `None`.
    async fn take(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Option<Instant>,
        note: &str,
    ) -> Result<Option<Lease>, LockError> {
        validate(key, ttl)?;
        validate_note(note)?;
        let name = self.name(key)?;
        let started = Instant::now();
        let timed_out = || LockError::TimedOut {
            key: key.to_owned(),
            waited: started.elapsed(),
        };
        self.ensure_schema().await?;
        let Some((turn, _turn)) = self
            .turns
            .wait(&name, deadline)
            .await
            .map_err(|()| timed_out())?
        else {
            // Someone of ours is polling for it: it is held.
            return Ok(None);
        };
        let owner = OwnerToken::random();
        let mut pause = Duration::from_millis(1);
        loop {
            let asked_at = Instant::now();
            match self.grant(&name, owner, ttl, note).await? {
                Ok(token) => {
                    self.held().insert(owner, name);
                    return Ok(Some(Lease::new(
                        key,
                        owner,
                        FencingToken::new(token),
                        ttl,
                        asked_at,
                    )));
                }
                Err(left) => {
                    let Some(deadline) = deadline else {
                        return Ok(None);
                    };
                    // Backing off, jittered so pollers of several processes spread out,
                    // and never past the holder's lease nor the deadline.
                    let jittered = pause.mul_f64(rand::random_range(0.5..1.5));
                    let wake = (Instant::now() + jittered.min(left)).min(deadline);
                    tokio::select! {
                        () = sleep_until(wake) => {}
                        () = turn.next_release() => {}
                    }
                    if Instant::now() >= deadline {
                        return Err(timed_out());
                    }
                    pause = (pause * 2).min(MAX_POLL);
                }
            }
        }
    }
}

/// The longest pause between two polls of one waiter.
const MAX_POLL: Duration = Duration::from_millis(100);

#[async_trait]
impl LockBackend for MySqlTableBackend {
    async fn try_acquire(
        &self,
        key: &str,
        ttl: Duration,
        note: &str,
    ) -> Result<Option<Lease>, LockError> {
        self.take(key, ttl, None, note).await
    }

    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
        note: &str,
    ) -> Result<Lease, LockError> {
        match self.take(key, ttl, Some(deadline), note).await? {
            Some(lease) => Ok(lease),
            None => Err(LockError::TimedOut {
                key: key.to_owned(),
                waited: Duration::ZERO,
            }),
        }
    }

    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        let name = self.name(key)?;
        self.ensure_schema().await?;
        let note: Option<Vec<u8>> = self
            .run(
                sqlx::query_scalar(HOLDER_NOTE)
                    .bind(name)
                    .fetch_optional(&self.pool),
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
                    .execute(&self.pool),
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
        validate(lease.key(), ttl)?;
        let Some(name) = self.held().get(&lease.owner()).cloned() else {
            return Ok(false);
        };
        let extended = self
            .run(
                sqlx::query(EXTEND)
                    .bind(self.kept(ttl))
                    .bind(&name)
                    .bind(lease.owner().to_hex())
                    .execute(&self.pool),
            )
            .await?;
        Ok(extended.rows_affected() > 0)
    }

    async fn raise_fencing(
        &self,
        key: &str,
        floor: FencingToken,
    ) -> Result<FencingToken, LockError> {
        check_floor(floor)?;
        let name = self.name(key)?;
        self.ensure_schema().await?;
        let floor = i64::try_from(floor.get()).unwrap_or(i64::MAX);
        let raised = self
            .run(
                sqlx::query(RAISE)
                    .bind(name)
                    .bind(floor)
                    .bind(floor)
                    .execute(&self.pool),
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
                        .execute(&self.pool),
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
        self.run(sqlx::query("SELECT 1").execute(&self.pool))
            .await?;
        Ok(())
    }

    fn sessions(&self) -> Sessions {
        Sessions::PerGrant
    }
}
