//! The ledger's errors, and the one place database errors are classified.

use sqlx::error::DatabaseError;

use crate::model::InvalidInput;

/// A failure of the ledger itself (not a refusal of the operation: those are outcomes).
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The database cannot be reached, or is shutting down, or ran out of connections.
    /// Nothing was written; retrying later is safe.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A constraint the ledger relies on fired: a bug or a hand-made change, never a
    /// client error.
    #[error("constraint `{constraint}` violated")]
    Constraint {
        /// The constraint's name (as in the migrations).
        constraint: &'static str,
        /// The database's report.
        #[source]
        source: sqlx::Error,
    },
    /// Any other database error.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// The database may or may not have committed: the commit was sent and the connection
    /// failed before its answer came back. Money may have moved. Asking again — the same
    /// ticket replays a committed outcome, and executes at most once otherwise — is the
    /// only way to learn which.
    #[error("outcome unknown: the commit was sent but its answer was lost: {0}")]
    OutcomeUnknown(#[source] sqlx::Error),
    /// Applying the migrations failed.
    #[error("migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Refused input.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// A create's idempotency key was used already, by a different request (another
    /// body): nothing was created.
    #[error("the idempotency key was used for a different request")]
    CreateKeyReused,
    /// A row the ledger cannot read back (an unknown entry kind, a token out of range).
    #[error("unreadable row: {0}")]
    Corrupt(String),
}

impl From<sqlx::Error> for LedgerError {
    fn from(error: sqlx::Error) -> Self {
        if is_unavailable(&error) {
            Self::Unavailable(error)
        } else {
            Self::Database(error)
        }
    }
}

/// Errors that mean "the database is not there right now", as opposed to "this request is
/// wrong": the API answers 503 and the client may retry.
fn is_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            // A FATAL error ends the session: the server refused or dropped the connection
            // (not accepting connections, too many clients, shutting down, failed auth).
            let fatal = db
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some_and(|pg| {
                    matches!(
                        pg.severity(),
                        sqlx::postgres::PgSeverity::Fatal | sqlx::postgres::PgSeverity::Panic
                    )
                });
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                // sqlx reports SQLite's extended result code.
                return db
                    .code()
                    .and_then(|code| code.parse().ok())
                    .is_some_and(sqlite_unavailable);
            }
            fatal
                || db.code().is_some_and(|code| {
                    // PostgreSQL: connection exceptions (08), insufficient resources (53),
                    // operator intervention such as shutdown (57), serialization failure
                    // and deadlock (40001, 40P01), and a write refused as read-only
                    // (25006): the server is a standby — a primary just demoted, or a
                    // replica the proxy still routed to — and a failover is under way.
                    code.starts_with("08")
                        || code.starts_with("53")
                        || code.starts_with("57")
                        || matches!(code.as_ref(), "40001" | "40P01" | "25006")
                })
        }
        _ => false,
    }
}

/// Whether `error` means the connection itself is dead — it was cut (a database restart,
/// a proxy, a network failure) or the server ended the session (a FATAL error) — rather
/// than that the server refused the statement or could not be reached at all. A statement
/// that failed this way on a connection taken from the pool may be tried again on another
/// connection if repeating it is harmless.
pub(crate) fn is_dead_connection(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .is_some_and(|pg| {
                matches!(
                    pg.severity(),
                    sqlx::postgres::PgSeverity::Fatal | sqlx::postgres::PgSeverity::Panic
                ) || pg.code().starts_with("08")
            }),
        _ => false,
    }
}

impl LedgerError {
    /// Whether the connection died under the operation (see [`is_dead_connection`]): a
    /// write that recognises its own earlier commit may then be run again on another one.
    pub(crate) fn connection_died(&self) -> bool {
        match self {
            Self::Unavailable(error) | Self::Database(error) | Self::OutcomeUnknown(error) => {
                is_dead_connection(error)
            }
            Self::Constraint { source, .. } => is_dead_connection(source),
            _ => false,
        }
    }
}

/// Commits, telling a refused commit (nothing was written) from one whose answer was lost
/// (it may have been written: [`LedgerError::OutcomeUnknown`]). Only a plain error from
/// the database — the server answered, and rolled back — is a definite refusal; a cut
/// connection, a session the server ended, or a SQLite I/O error leaves it open.
#[tracing::instrument(name = "ledger.commit", skip_all)]
pub(crate) async fn commit_or_unknown<D: sqlx::Database>(
    tx: sqlx::Transaction<'static, D>,
) -> Result<(), LedgerError> {
    tx.commit().await.map_err(|error| {
        let refused = match &error {
            sqlx::Error::Database(db) => {
                if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                    pg.severity() == sqlx::postgres::PgSeverity::Error
                } else {
                    // SQLite: an I/O error (10) while committing leaves the file's state
                    // to recovery; anything else (busy, full, constraint) rolled back.
                    db.code()
                        .and_then(|code| code.parse::<i32>().ok())
                        .is_none_or(|code| code & 0xff != 10)
                }
            }
            _ => false,
        };
        if refused {
            LedgerError::from(error)
        } else {
            LedgerError::OutcomeUnknown(error)
        }
    })
}

/// Whether a SQLite result code means "the database is not usable right now": busy (5),
/// locked (6), I/O error (10), disk full (13), cannot open (14). `code` may be an
/// extended result code (SQLITE_BUSY_SNAPSHOT 517, SQLITE_IOERR_FSYNC 1034, …), whose low
/// byte is the primary code.
fn sqlite_unavailable(code: i32) -> bool {
    matches!(code & 0xff, 5 | 6 | 10 | 13 | 14)
}

/// Why `apply` did not run the operation.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// No such ticket, or it was issued to another account.
    #[error("unknown ticket")]
    UnknownTicket,
    /// The ticket expired before it was used.
    #[error("the ticket expired unused")]
    TicketExpired,
    /// The ticket was used for a different request (other amount, other operation).
    #[error("the ticket was used for a different request")]
    FingerprintMismatch,
    /// The ticket was used, but its stored response is past retention.
    #[error("the ticket was used and its outcome is no longer retained")]
    OutcomePruned,
    /// The fencing token is older than one the account already accepted: a newer lock
    /// holder has written. Nothing was written.
    #[error("stale fencing token {presented}: the account has accepted {recorded}")]
    StaleToken {
        /// The token the caller presented.
        presented: u64,
        /// The highest token the account has accepted.
        recorded: u64,
    },
    /// No such order, or another account's, or not of the amount presented. Nothing was
    /// stored; the ticket stays usable.
    #[error("unknown order")]
    UnknownOrder,
    /// No such hold, or another account's. Nothing was stored; the ticket stays usable.
    #[error("unknown hold")]
    UnknownHold,
    /// Demonstration only: an unguarded write found its row changed since its read past
    /// what it would write (a refunded total only grows), and wrote nothing — the lock it
    /// ran under was lost meanwhile.
    #[error("the row changed past the unguarded read: nothing written")]
    Overtaken,
    /// The ledger failed.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl From<sqlx::Error> for ApplyError {
    fn from(error: sqlx::Error) -> Self {
        Self::Ledger(error.into())
    }
}

/// Constraint names that errors are matched against (as named in the migrations).
pub(crate) mod constraint {
    pub const ENTRY_PER_TICKET: &str = "entries_ticket_id_key";
    pub const API_KEY_HASH: &str = "accounts_api_key_hash_key";
    pub const BALANCE_NON_NEGATIVE: &str = "accounts_balance_non_negative";
    pub const POINTS_NON_NEGATIVE: &str = "accounts_points_non_negative";

    pub const ALL: [&str; 4] = [
        ENTRY_PER_TICKET,
        API_KEY_HASH,
        BALANCE_NON_NEGATIVE,
        POINTS_NON_NEGATIVE,
    ];
}

/// The constraint a database error names. PostgreSQL reports it; SQLite writes it into the
/// message ("CHECK constraint failed: <name>", or for UNIQUE the columns).
fn violated_constraint(error: &dyn DatabaseError) -> Option<&'static str> {
    let reported = error.constraint().map(str::to_owned).or_else(|| {
        let message = error.message();
        if let Some(name) = message.strip_prefix("CHECK constraint failed: ") {
            return Some(name.to_owned());
        }
        match message.strip_prefix("UNIQUE constraint failed: ")? {
            "entries.ticket_id" => Some(constraint::ENTRY_PER_TICKET.to_owned()),
            "accounts.api_key_hash" => Some(constraint::API_KEY_HASH.to_owned()),
            _ => None,
        }
    })?;
    constraint::ALL.into_iter().find(|name| *name == reported)
}

/// Turns constraint violations into [`LedgerError::Constraint`], so callers match on a
/// typed error instead of a message.
pub(crate) trait ResultExt<T> {
    fn or_constraint(self) -> Result<T, LedgerError>;
}

impl<T> ResultExt<T> for Result<T, sqlx::Error> {
    fn or_constraint(self) -> Result<T, LedgerError> {
        self.map_err(|error| {
            let named = match &error {
                sqlx::Error::Database(db) => violated_constraint(db.as_ref()),
                _ => None,
            };
            match named {
                Some(constraint) => LedgerError::Constraint {
                    constraint,
                    source: error,
                },
                None => error.into(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn sqlite_outages_are_classified_by_their_primary_code() {
        for code in [
            5,    // SQLITE_BUSY
            517,  // SQLITE_BUSY_SNAPSHOT
            261,  // SQLITE_BUSY_RECOVERY
            773,  // SQLITE_BUSY_TIMEOUT
            6,    // SQLITE_LOCKED
            262,  // SQLITE_LOCKED_SHAREDCACHE
            10,   // SQLITE_IOERR
            266,  // SQLITE_IOERR_READ
            778,  // SQLITE_IOERR_WRITE
            1034, // SQLITE_IOERR_FSYNC
            3338, // SQLITE_IOERR_ACCESS
            13,   // SQLITE_FULL
            14,   // SQLITE_CANTOPEN
            270,  // SQLITE_CANTOPEN_NOTEMPDIR
        ] {
            assert!(sqlite_unavailable(code), "{code} is an outage");
        }
        for code in [
            1,    // SQLITE_ERROR
            19,   // SQLITE_CONSTRAINT
            275,  // SQLITE_CONSTRAINT_CHECK
            1555, // SQLITE_CONSTRAINT_PRIMARYKEY
            2067, // SQLITE_CONSTRAINT_UNIQUE
            1811, // SQLITE_CONSTRAINT_TRIGGER
            11,   // SQLITE_CORRUPT
            8,    // SQLITE_READONLY
        ] {
            assert!(!sqlite_unavailable(code), "{code} is not an outage");
        }
    }

    /// A real extended code from SQLite, through sqlx: a write in a WAL read transaction
    /// whose snapshot another connection has moved past fails with SQLITE_BUSY_SNAPSHOT
    /// (517) at once, and that is an outage (retry later), not an internal error.
    #[tokio::test]
    async fn sqlite_busy_snapshot_is_unavailable() {
        use sqlx::Connection;
        use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode};

        let path = std::env::temp_dir().join(format!(
            "payonce-busy-snapshot-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        let mut reader = SqliteConnection::connect_with(&options).await.unwrap();
        let mut writer = SqliteConnection::connect_with(&options).await.unwrap();
        sqlx::raw_sql("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1)")
            .execute(&mut writer)
            .await
            .unwrap();

        sqlx::raw_sql("BEGIN").execute(&mut reader).await.unwrap();
        sqlx::query("SELECT x FROM t")
            .fetch_all(&mut reader)
            .await
            .unwrap();
        sqlx::query("UPDATE t SET x = 2")
            .execute(&mut writer)
            .await
            .unwrap();
        let error = sqlx::query("UPDATE t SET x = 3")
            .execute(&mut reader)
            .await
            .unwrap_err();

        let code = match &error {
            sqlx::Error::Database(db) => db.code().map(|code| code.into_owned()),
            _ => None,
        };
        assert_eq!(code.as_deref(), Some("517"), "{error:?}");
        assert!(
            matches!(LedgerError::from(error), LedgerError::Unavailable(_)),
            "SQLITE_BUSY_SNAPSHOT must be unavailable"
        );
        drop((reader, writer));
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
}
