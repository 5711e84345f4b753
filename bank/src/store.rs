//! [`Store`]: the bank's tables on SQLite or PostgreSQL. The statements are one text for
//! both databases; [`on_pool!`] writes each operation once and runs it on whichever pool
//! the store holds.

use std::borrow::Cow;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::SqlStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use crate::model::{IdempotencyKey, Record, State, StoredAnswer, TransferRequest, now_micros};

/// The bank's migrations record themselves in a table of their own, so the bank can share
/// a database with payonce's ledger (whose migrations use sqlx's default table) without
/// either taking the other's history for its own.
const MIGRATIONS_TABLE: &str = "_bank_migrations";

/// The migrations, embedded: `(version, description, SQL)`, named as sqlx names a
/// directory's files (`0002_reference.sql`: 2, "reference"). Listed here rather than read
/// by `sqlx::migrate!`, whose proc-macro crate compiles sqlx and its drivers a second time
/// for the compiler's host; a test holds the lists to the directories.
const POSTGRES_MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "bank",
        include_str!("../migrations/postgres/0001_bank.sql"),
    ),
    (
        2,
        "reference",
        include_str!("../migrations/postgres/0002_reference.sql"),
    ),
];
const SQLITE_MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "bank",
        include_str!("../migrations/sqlite/0001_bank.sql"),
    ),
    (
        2,
        "reference",
        include_str!("../migrations/sqlite/0002_reference.sql"),
    ),
];

fn migrator(files: &'static [(i64, &'static str, &'static str)]) -> Migrator {
    let mut migrator = Migrator::with_migrations(
        files
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    Cow::Borrowed(description),
                    MigrationType::Simple,
                    SqlStr::from_static(sql),
                    sql.starts_with("-- no-transaction"),
                )
            })
            .collect(),
    );
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// A database error, as the store reports it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or could not be reached.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Opening: the migrations failed.
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A row the bank wrote does not read back as one (tampered with by hand).
    #[error("a row of bank_transfers is malformed: {0}")]
    Malformed(String),
}

/// The bank's tables.
#[derive(Clone, Debug)]
pub(crate) enum Store {
    /// One connection: SQLite writes one transaction at a time anyway, and queueing in
    /// the process (in arrival order) beats polling SQLite's file lock.
    Sqlite(SqlitePool),
    /// Row locks serialise the writers; see `bank_totals` in the migration.
    Postgres(PgPool),
}

/// Runs `$body` with `$pool` bound to the store's pool, whichever database it is.
macro_rules! on_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match $store {
            Store::Sqlite($pool) => $body,
            Store::Postgres($pool) => $body,
        }
    };
}

/// The row a first request under `key` writes, as it is before the insert gives it its id
/// (0 until then) and `render` its answer.
fn fresh_record(
    key: &IdempotencyKey,
    state: State,
    request: &TransferRequest,
    fingerprint: &str,
    reason: Option<&str>,
    created_at: i64,
) -> Record {
    Record {
        id: 0,
        idempotency_key: key.as_str().to_owned(),
        state,
        request: Some(request.clone()),
        fingerprint: Some(fingerprint.to_owned()),
        decline_reason: reason.map(str::to_owned),
        answer: None,
        created_at_micros: created_at,
    }
}

/// [`Store::execute`]'s statements, in the order it runs them.
const ADD_TO_TOTALS: &str =
    "UPDATE bank_totals SET total = total + $1, transfers = transfers + $2 WHERE id = 1";
const INSERT_TRANSFER: &str = "INSERT INTO bank_transfers
                     (idempotency_key, state, destination, amount, reference, fingerprint,
                      decline_reason, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (idempotency_key) DO NOTHING
                 RETURNING id";
const ADD_TO_DESTINATION: &str = "INSERT INTO bank_destinations (destination, total, transfers)
                             VALUES ($1, $2, 1)
                             ON CONFLICT (destination) DO UPDATE
                             SET total = bank_destinations.total + excluded.total,
                                 transfers = bank_destinations.transfers + 1";
const STORE_ANSWER: &str =
    "UPDATE bank_transfers SET answer_status = $1, answer_body = $2 WHERE id = $3";

/// What [`Store::execute`] did.
#[derive(Debug)]
pub(crate) enum Execution {
    /// The key was new: this request executed (or was declined) and its answer is stored.
    Fresh(Record),
    /// The key was taken already: its row, untouched.
    Existing(Record),
}

/// What the first request under a new key does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Verdict<'a> {
    /// Move the money.
    Execute,
    /// Refuse for good, with this problem name.
    Decline(&'a str),
}

/// One row of `bank_transfers` as the driver reads it (see [`Record`]).
type Row = (
    i64,
    String,
    String,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i32>,
    Option<String>,
    i64,
);

/// The columns of [`Row`], in its order.
macro_rules! columns {
    () => {
        "id, idempotency_key, state, destination, amount, reference, fingerprint, \
         decline_reason, answer_status, answer_body, created_at"
    };
}

fn record(row: Row) -> Result<Record, StoreError> {
    let (id, key, state, destination, amount, reference, fingerprint, reason, status, body, at) =
        row;
    let malformed = || StoreError::Malformed(format!("key {key:?}"));
    let state = State::from_db(&state).ok_or_else(malformed)?;
    let request = match (destination, amount, reference) {
        (Some(destination), Some(amount), Some(reference)) => Some(
            TransferRequest::parse(crate::model::TransferBody {
                destination,
                amount,
                reference,
            })
            .map_err(|_| malformed())?,
        ),
        _ => None,
    };
    let answer = match (status, body) {
        (Some(status), Some(body)) => Some(StoredAnswer {
            status: u16::try_from(status).map_err(|_| malformed())?,
            body,
        }),
        _ => None,
    };
    Ok(Record {
        id,
        idempotency_key: key,
        state,
        request,
        fingerprint,
        decline_reason: reason,
        answer,
        created_at_micros: at,
    })
}

impl Store {
    /// Opens `url` (`sqlite:path` or `postgres://…`) and applies the migrations. A SQLite
    /// file (and its directory) is created when `create` is set.
    pub(crate) async fn open(url: &str, create: bool) -> Result<Self, StoreError> {
        let store = if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(create)
                .journal_mode(SqliteJournalMode::Wal)
                // Another process (the audit, a test) may hold the file a moment.
                .busy_timeout(Duration::from_secs(5));
            if create
                && let Some(parent) = options.get_filename().parent()
                && parent != Path::new("")
            {
                std::fs::create_dir_all(parent).map_err(sqlx::Error::Io)?;
            }
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(options)
                .await?;
            Self::Sqlite(pool)
        } else {
            let pool = PgPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(5))
                .connect(url)
                .await?;
            Self::Postgres(pool)
        };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            Self::Sqlite(pool) => migrator(SQLITE_MIGRATIONS).run(pool).await?,
            Self::Postgres(pool) => migrator(POSTGRES_MIGRATIONS).run(pool).await?,
        }
        Ok(())
    }

    /// Whether the database answers.
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        on_pool!(self, pool => sqlx::query("SELECT 1").execute(pool).await.map(|_| ()))?;
        Ok(())
    }

    /// The row under `key`, if any.
    pub(crate) async fn find(&self, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        const SQL: &str = concat!(
            "SELECT ",
            columns!(),
            " FROM bank_transfers WHERE idempotency_key = $1"
        );
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(SQL).bind(key.as_str()).fetch_optional(pool).await
        })?;
        row.map(record).transpose()
    }

    /// The first request under `key` runs `verdict` in one transaction: the row under the
    /// UNIQUE key, with the answer `render` makes of it and the request's fingerprint,
    /// and (when it executes) the amount added to the destination's and the grand total.
    /// When the key is taken already — by an earlier request, a concurrent one, or a
    /// close — nothing is written and the existing row is returned.
    pub(crate) async fn execute(
        &self,
        key: &IdempotencyKey,
        request: &TransferRequest,
        verdict: Verdict<'_>,
        render: impl FnOnce(&Record) -> StoredAnswer,
    ) -> Result<Execution, StoreError> {
        let (state, reason, moved, counted) = match verdict {
            Verdict::Execute => (State::Executed, None, request.amount(), 1_i64),
            Verdict::Decline(reason) => (State::Declined, Some(reason), 0, 0),
        };
        let created_at = now_micros();
        let fingerprint = request.fingerprint();
        let mut record = fresh_record(key, state, request, &fingerprint, reason, created_at);
        let inserted: Option<Record> = on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            // The grand total's row lock first, before the insert takes its id: ids are
            // then handed out in commit order (see the migration).
            sqlx::query(ADD_TO_TOTALS)
                .bind(moved)
                .bind(counted)
                .execute(&mut *tx)
                .await?;
            let id: Option<(i64,)> = sqlx::query_as(INSERT_TRANSFER)
                .bind(key.as_str())
                .bind(state.as_str())
                .bind(request.destination())
                .bind(request.amount())
                .bind(request.reference())
                .bind(&fingerprint)
                .bind(reason)
                .bind(created_at)
                .fetch_optional(&mut *tx)
                .await?;
            match id {
                None => {
                    tx.rollback().await?;
                    None
                }
                Some((id,)) => {
                    if state == State::Executed {
                        sqlx::query(ADD_TO_DESTINATION)
                            .bind(request.destination())
                            .bind(request.amount())
                            .execute(&mut *tx)
                            .await?;
                    }
                    record.id = id;
                    let answer = render(&record);
                    sqlx::query(STORE_ANSWER)
                        .bind(i32::from(answer.status))
                        .bind(&answer.body)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    record.answer = Some(answer);
                    Some(record)
                }
            }
        });
        match inserted {
            Some(record) => Ok(Execution::Fresh(record)),
            None => Ok(Execution::Existing(self.conflicting(key).await?)),
        }
    }

    /// The row that holds `key`, after an insert under it did nothing.
    async fn conflicting(&self, key: &IdempotencyKey) -> Result<Record, StoreError> {
        // ON CONFLICT DO NOTHING skipped the insert only because a committed row holds the
        // key, so this read finds it.
        self.find(key).await?.ok_or_else(|| {
            StoreError::Malformed(format!("key {:?} conflicted but is gone", key.as_str()))
        })
    }

    /// Closes `key` when no transfer holds it: the row under the UNIQUE key is written as
    /// closed, so a create that comes later (or concurrently) finds the key taken and
    /// executes nothing. Returns the key's row — the closed one, or the transfer that was
    /// there first.
    pub(crate) async fn close(&self, key: &IdempotencyKey) -> Result<Record, StoreError> {
        let created_at = now_micros();
        on_pool!(self, pool => {
            sqlx::query(
                "INSERT INTO bank_transfers (idempotency_key, state, created_at)
                 VALUES ($1, 'closed', $2)
                 ON CONFLICT (idempotency_key) DO NOTHING",
            )
            .bind(key.as_str())
            .bind(created_at)
            .execute(pool)
            .await
            .map(|_| ())
        })?;
        self.find(key).await?.ok_or_else(|| {
            StoreError::Malformed(format!("key {:?} was closed but is gone", key.as_str()))
        })
    }

    /// Transfers (executed and declined; closed keys are no transfers) with an id above
    /// `after`, in id order, at most `limit` — all, or only those with `reference`.
    pub(crate) async fn list(
        &self,
        after: i64,
        limit: i64,
        reference: Option<&str>,
    ) -> Result<Vec<Record>, StoreError> {
        const ALL: &str = concat!(
            "SELECT ",
            columns!(),
            " FROM bank_transfers WHERE id > $1 AND state <> 'closed' ORDER BY id LIMIT $2"
        );
        // On the reference's index (migration 0002): a payment's few transfers, not a
        // scan of every transfer.
        const BY_REFERENCE: &str = concat!(
            "SELECT ",
            columns!(),
            " FROM bank_transfers WHERE reference = $1 AND id > $2 AND state <> 'closed' \
             ORDER BY id LIMIT $3"
        );
        let rows: Vec<Row> = on_pool!(self, pool => match reference {
            None => sqlx::query_as(ALL).bind(after).bind(limit).fetch_all(pool).await,
            Some(reference) => {
                sqlx::query_as(BY_REFERENCE)
                    .bind(reference)
                    .bind(after)
                    .bind(limit)
                    .fetch_all(pool)
                    .await
            }
        })?;
        rows.into_iter().map(record).collect()
    }

    /// Runs a read-only query of (text, integer, integer) rows — the audit's shape.
    pub(crate) async fn triples(
        &self,
        sql: &'static str,
    ) -> Result<Vec<(String, i64, i64)>, StoreError> {
        Ok(on_pool!(self, pool => sqlx::query_as(sql).fetch_all(pool).await)?)
    }

    /// Closes the pool.
    pub(crate) async fn close_pool(&self) {
        on_pool!(self, pool => pool.close().await);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded lists are what sqlx reads from the directories, checksums included (a
    /// database migrated by either keeps its history).
    #[tokio::test]
    async fn the_embedded_migrations_are_the_directories() {
        let versions = |migrator: &Migrator| {
            let read = migrator.iter();
            read.map(|m| {
                let description = m.description.to_string();
                (m.version, description, m.checksum.to_vec(), m.no_tx)
            })
            .collect::<Vec<_>>()
        };
        for (files, directory) in [
            (POSTGRES_MIGRATIONS, "migrations/postgres"),
            (SQLITE_MIGRATIONS, "migrations/sqlite"),
        ] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(directory);
            let read = Migrator::new(path.as_path())
                .await
                .expect("the directory reads");
            assert_eq!(versions(&migrator(files)), versions(&read), "{directory}");
        }
    }
}
