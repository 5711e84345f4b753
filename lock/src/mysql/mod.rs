//! What the two MySQL / MariaDB backends share: the database they make on first use and
//! its connections ([`Database`]), how a key is named in their tables, how a statement's
//! failure reads, and the one-time upgrade of an earlier version's tables.
//!
//! - `table.rs`: [`MySqlTableBackend`](table::MySqlTableBackend), a lock table polled.
//! - `row.rs`: [`MySqlRowBackend`](row::MySqlRowBackend), InnoDB row locks.

pub(crate) mod row;
pub(crate) mod table;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sqlx::MySqlPool;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use tokio::time::{Instant, timeout_at};

use crate::error::LockError;

/// The longest key (with its namespace) the table takes, in bytes.
pub(crate) const MAX_KEY: usize = 255;

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

/// A lock database: its pool, and what making it on first use needs.
pub(crate) struct Database {
    pub(crate) pool: MySqlPool,
    /// The server without a database, to create the database on first use.
    server: MySqlConnectOptions,
    /// The database's name.
    pub(crate) name: String,
    schema_made: AtomicBool,
    /// Serialises making the schema, so concurrent first uses make it once.
    making_schema: tokio::sync::Mutex<()>,
    /// Statements sent, for benchmarks and tests.
    pub(crate) requests: AtomicU64,
}

impl Database {
    /// The database a `mysql://…/<database>` URL names, connected lazily through a pool of
    /// at most `max_connections`, each found within `op_timeout`.
    pub(crate) fn open(
        url: &str,
        max_connections: u32,
        op_timeout: Duration,
    ) -> Result<Self, LockError> {
        let (connect, server, name) = split_database(url)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections)
            .min_connections(0)
            .acquire_timeout(op_timeout)
            .connect_lazy_with(connect);
        Ok(Self {
            pool,
            server,
            name,
            schema_made: AtomicBool::new(false),
            making_schema: tokio::sync::Mutex::new(()),
            requests: AtomicU64::new(0),
        })
    }

    /// Statements sent so far.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Counts a statement sent.
    pub(crate) fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Creates the database and runs `schema` once (its statements are idempotent), then
    /// gives `pruned_table` its `last_used` column if an earlier version made it without.
    pub(crate) async fn ensure_schema(
        &self,
        schema: &[&'static str],
        pruned_table: &str,
        op_timeout: Duration,
    ) -> Result<(), LockError> {
        if self.schema_made.load(Ordering::Acquire) {
            return Ok(());
        }
        let limit = Instant::now() + op_timeout;
        let _making = timeout_at(limit, self.making_schema.lock())
            .await
            .map_err(|_| too_slow())?;
        if self.schema_made.load(Ordering::Acquire) {
            return Ok(());
        }
        create_database(&self.server, &self.name, limit).await?;
        for statement in schema {
            self.count();
            let made = sqlx::query(*statement).execute(&self.pool);
            match timeout_at(Instant::now() + op_timeout, made).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => return Err(failed(&error)),
                Err(_) => return Err(too_slow()),
            }
        }
        self.count();
        add_last_used(&self.pool, pruned_table, op_timeout).await?;
        self.schema_made.store(true, Ordering::Release);
        Ok(())
    }

    /// Notes a statement's failure: a table gone (dropped by hand, a restore without it)
    /// is made again at the next use.
    pub(crate) fn failed(&self, error: &sqlx::Error) -> LockError {
        if error
            .as_database_error()
            .and_then(|error| error.code())
            .is_some_and(|code| code == "42S02")
        {
            self.schema_made.store(false, Ordering::Release);
        }
        failed(error)
    }
}

pub(crate) fn failed(error: &sqlx::Error) -> LockError {
    LockError::unavailable(format!("MySQL: {error}"))
}

pub(crate) fn too_slow() -> LockError {
    LockError::unavailable("MySQL did not answer in time")
}

/// Microseconds of a duration, as the statements take them.
pub(crate) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// The database a `mysql://…/<database>` URL names, and the options without it.
fn split_database(
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
async fn create_database(
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
async fn add_last_used(
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
