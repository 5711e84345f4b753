//! The SQL behind the ledger, written once for both databases.
//!
//! [`SqlStore`] is generic over the sqlx database; the statements are shared text
//! (`$1`-style parameters work in both) except where [`Dialect`] says otherwise. The
//! [`Store`] trait is the seam the [`Ledger`](crate::Ledger) handle holds.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::audit::{self, Rule, Violation};
use crate::batch::{self, Batcher, Batches};
use crate::creates::{CreationRow, NewCreation};
use crate::db_types::Timestamp;
use crate::error::{ApplyError, LedgerError, ResultExt, commit_or_unknown, is_dead_connection};
use crate::lottery;
use crate::model::{
    Account, AccountId, Amount, Applied, ApplyRequest, Entry, EntryKind, Judgement, Operation,
    OperationResult, Order, OrderId, Outcome, Refusal, Renderer, StoredResponse, Ticket, TicketId,
};

/// What differs between the two databases.
pub(crate) trait Dialect: Database {
    /// Opens a transaction that will write. SQLite takes the write lock up front, so two
    /// writers never deadlock upgrading from a read.
    const BEGIN_WRITE: &'static str;
    /// The database's clock, as the ticket statements read it.
    const CLOCK: &'static str;
    /// Reads a ticket, with the database's clock as `read_at`. Parameter: $1 ticket.
    const TICKET: &'static str;
    /// Issues a ticket, timed by the database's clock; a retry with the same id is a
    /// no-op (the ticket is then read back). Parameters: $1 ticket, $2 account, $3 TTL in
    /// microseconds. Returns the ticket's row as [`TICKET`](Self::TICKET) does.
    const ISSUE_TICKET: &'static str;
    /// Reads a ticket and locks it until the transaction ends (SQLite's write lock already
    /// covers the whole database), with the database's clock read after the lock was
    /// granted as `read_at`. Parameters: $1 ticket, $2 the account it must belong to
    /// (another account's ticket is none: the statement names the account, as one routed
    /// to the account's shard of a distributed database must).
    const LOCK_TICKET: &'static str;
    /// An account's balance, points and recorded fencing token, from its latest version,
    /// locked until the transaction ends. Parameter: $1 account.
    const LOCK_ACCOUNT: &'static str;
    /// An order's account, amount, recorded fencing token and paying ticket, from its
    /// latest version, locked until the transaction ends — found only with the account
    /// it belongs to. Parameters: $1 order, $2 its account.
    const LOCK_ORDER: &'static str;
    /// The reaper's deletion of unused tickets (see `reap_statements!`). Parameters: $1
    /// cutoff, $2 batch.
    const DELETE_UNUSED: &'static str;
    /// The reaper's pruning of old outcomes (see `reap_statements!`). Parameters: $1
    /// cutoff, $2 now, $3 batch.
    const PRUNE_OUTCOMES: &'static str;
    /// The reaper's deletion of creation records (see `reap_statements!`). Parameters: $1
    /// cutoff, $2 batch.
    const DELETE_OLD_CREATIONS: &'static str;
}

/// The reaper's statements, the same text for both databases but for the row-locking
/// clause of the subquery that picks the batch.
///
/// The outer WHERE repeats the subquery's conditions on purpose. On PostgreSQL, when the
/// outer statement finds a picked row changed by a transaction that committed after the
/// statement's snapshot (an `apply` that completed the ticket, another instance's reaper
/// that pruned it), it re-checks only the outer WHERE on the row's latest version, not the
/// subquery's: without the repetition it would delete a ticket that was just used (its
/// entry orphaned, its outcome lost) or prune an outcome twice. `FOR UPDATE SKIP LOCKED`
/// makes the subquery lock what it picks and pass over rows a transaction holds, so the
/// reaper never queues behind an `apply` and concurrent reapers split the work. SQLite
/// runs each statement under its single write lock, so nothing can change in between.
macro_rules! reap_statements {
    ($lock:literal) => {
        (
            concat!(
                "DELETE FROM tickets
                 WHERE id IN (
                     SELECT id FROM tickets
                     WHERE pruned_at IS NULL AND expires_at < $1 AND completed_at IS NULL
                     LIMIT $2 ",
                $lock,
                ")
                   AND pruned_at IS NULL AND expires_at < $1 AND completed_at IS NULL
                 RETURNING id"
            ),
            concat!(
                "UPDATE tickets SET response_body = NULL, pruned_at = $2
                 WHERE id IN (
                     SELECT id FROM tickets
                     WHERE pruned_at IS NULL AND expires_at < $1 AND completed_at IS NOT NULL
                     LIMIT $3 ",
                $lock,
                ")
                   AND pruned_at IS NULL AND expires_at < $1 AND completed_at IS NOT NULL
                 RETURNING id"
            ),
            concat!(
                "DELETE FROM creations
                 WHERE key_hash IN (
                     SELECT key_hash FROM creations WHERE created_at < $1 LIMIT $2 ",
                $lock,
                ")
                   AND created_at < $1
                 RETURNING key_hash"
            ),
        )
    };
}

const POSTGRES_REAP: (&str, &str, &str) = reap_statements!("FOR UPDATE SKIP LOCKED");
const SQLITE_REAP: (&str, &str, &str) = reap_statements!("");

/// The columns of a ticket row, as [`TicketRow`] reads them (but `read_at`).
macro_rules! ticket_columns {
    () => {
        "id, account_id, created_at, expires_at, operation, fingerprint, response_status,
         response_body, completed_at"
    };
}

/// The columns of an order, in [`OrderRow`]'s order.
macro_rules! order_columns {
    () => {
        "id, account_id, amount, description, fencing_token, paid_by_ticket, paid_at, created_at"
    };
}
/// PostgreSQL's clock. `clock_timestamp()`, not `now()`: `now()` is the transaction's
/// start, which may precede a wait for a row lock by seconds.
macro_rules! pg_clock {
    () => {
        "clock_timestamp()"
    };
}

/// SQLite's clock, in the microseconds since the epoch that [`Timestamp`] stores there.
/// (The embedded mode is one process, so this is that process's clock; what matters is
/// that it is read inside the transaction, after the write lock was granted.)
macro_rules! sqlite_clock {
    () => {
        "CAST(unixepoch('now', 'subsec') * 1000000 AS INTEGER)"
    };
}

impl Dialect for sqlx::Postgres {
    const BEGIN_WRITE: &'static str = "BEGIN";
    const CLOCK: &'static str = concat!("SELECT ", pg_clock!());
    const TICKET: &'static str = concat!(
        "SELECT ",
        ticket_columns!(),
        ", ",
        pg_clock!(),
        " AS read_at FROM tickets WHERE id = $1"
    );
    const ISSUE_TICKET: &'static str = concat!(
        "WITH clock AS (SELECT ",
        pg_clock!(),
        " AS at)
         INSERT INTO tickets (id, account_id, created_at, expires_at)
         SELECT $1, $2, at, at + $3::bigint * interval '1 microsecond' FROM clock
         ON CONFLICT (id) DO NOTHING
         RETURNING ",
        ticket_columns!(),
        ", created_at AS read_at"
    );
    const LOCK_TICKET: &'static str = concat!(
        "WITH ticket AS (SELECT ",
        ticket_columns!(),
        " FROM tickets WHERE id = $1 AND account_id = $2 FOR UPDATE)
         SELECT ticket.*, ",
        pg_clock!(),
        " AS read_at FROM ticket"
    );
    const LOCK_ACCOUNT: &'static str =
        "SELECT balance, points, fencing_token FROM accounts WHERE id = $1 FOR UPDATE";
    const LOCK_ORDER: &'static str = concat!(
        "SELECT ",
        order_columns!(),
        " FROM orders WHERE id = $1 AND account_id = $2 FOR UPDATE"
    );
    const DELETE_UNUSED: &'static str = POSTGRES_REAP.0;
    const PRUNE_OUTCOMES: &'static str = POSTGRES_REAP.1;
    const DELETE_OLD_CREATIONS: &'static str = POSTGRES_REAP.2;
}

impl Dialect for sqlx::Sqlite {
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";
    const CLOCK: &'static str = concat!("SELECT ", sqlite_clock!());
    const TICKET: &'static str = concat!(
        "SELECT ",
        ticket_columns!(),
        ", ",
        sqlite_clock!(),
        " AS read_at FROM tickets WHERE id = $1"
    );
    // `WHERE true` tells SQLite's parser that ON CONFLICT belongs to the INSERT.
    const ISSUE_TICKET: &'static str = concat!(
        "INSERT INTO tickets (id, account_id, created_at, expires_at)
         SELECT $1, $2, at, at + $3 FROM (SELECT ",
        sqlite_clock!(),
        " AS at) WHERE true
         ON CONFLICT (id) DO NOTHING
         RETURNING ",
        ticket_columns!(),
        ", created_at AS read_at"
    );
    const LOCK_TICKET: &'static str = concat!(
        "SELECT ",
        ticket_columns!(),
        ", ",
        sqlite_clock!(),
        " AS read_at FROM tickets WHERE id = $1 AND account_id = $2"
    );
    // The transaction's write lock covers the whole database.
    const LOCK_ACCOUNT: &'static str =
        "SELECT balance, points, fencing_token FROM accounts WHERE id = $1";
    const LOCK_ORDER: &'static str = concat!(
        "SELECT ",
        order_columns!(),
        " FROM orders WHERE id = $1 AND account_id = $2"
    );
    const DELETE_UNUSED: &'static str = SQLITE_REAP.0;
    const PRUNE_OUTCOMES: &'static str = SQLITE_REAP.1;
    const DELETE_OLD_CREATIONS: &'static str = SQLITE_REAP.2;
}

/// The storage operations of the ledger, one atomic step each.
#[async_trait]
pub(crate) trait Store: Send + Sync + fmt::Debug + 'static {
    /// Opens `account` (chosen whole beforehand, its id included) with its opening entry
    /// and, for a create sent with an idempotency key, its creation record, in one
    /// transaction. `Some`: the key had a record already, which is returned instead
    /// (nothing was written).
    async fn create_account(
        &self,
        account: &Account,
        key_hash: Vec<u8>,
        creation: Option<&NewCreation<'_>>,
    ) -> Result<Option<CreationRow>, LedgerError>;
    async fn authenticate(&self, key_hash: Vec<u8>) -> Result<Option<AccountId>, LedgerError>;
    async fn account(&self, id: AccountId) -> Result<Option<Account>, LedgerError>;
    async fn fencing_token(&self, id: AccountId) -> Result<Option<u64>, LedgerError>;
    /// Issues a ticket usable for `ttl`, timed by the database's clock.
    async fn issue_ticket(
        &self,
        account_id: AccountId,
        ttl: Duration,
    ) -> Result<Ticket, LedgerError>;
    async fn ticket(&self, id: TicketId) -> Result<Option<Ticket>, LedgerError>;
    /// Places `order` (chosen whole beforehand) and, with an idempotency key, its creation
    /// record; `Some` as for [`create_account`](Self::create_account).
    async fn create_order(
        &self,
        order: &Order,
        creation: Option<&NewCreation<'_>>,
    ) -> Result<Option<CreationRow>, LedgerError>;
    async fn order(&self, id: OrderId) -> Result<Option<Order>, LedgerError>;
    async fn entries(
        &self,
        account_id: AccountId,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Entry>, LedgerError>;
    async fn apply(
        &self,
        request: &ApplyRequest<'_>,
        render: &Renderer,
    ) -> Result<Applied, ApplyError>;
    async fn audit(&self) -> Result<Vec<Violation>, LedgerError>;
    /// Deletes unused tickets and prunes the outcomes of used ones, both expired more
    /// than `retention` ago by the database's clock (the clock that judges expiry, so a
    /// ticket is never reaped while a spend could still find it unexpired); at most
    /// `batch` of each; and deletes creation records made more than `retention` ago (by
    /// the creating instance's clock), at most `batch`. Returns how many of each.
    async fn reap(&self, retention: Duration, batch: i64) -> Result<(u64, u64, u64), LedgerError>;
    async fn ping(&self) -> Result<(), LedgerError>;
    async fn close(&self);
    /// The group commit's batch sizes, where there is one.
    fn batches(&self) -> Option<&Batches>;
    #[cfg(feature = "demo")]
    /// Demonstration only: an account's balance, points and token, read without a lock.
    async fn holdings(&self, id: AccountId) -> Result<Option<(i64, i64, i64)>, LedgerError>;
    #[cfg(feature = "demo")]
    /// Demonstration only: writes an outcome decided from an earlier unlocked read, with
    /// absolute values. `None`: another request completed the ticket first.
    async fn write_unguarded(
        &self,
        write: &UnguardedWrite<'_>,
        render: &Renderer,
        now: Timestamp,
    ) -> Result<Option<Applied>, ApplyError>;
}

#[cfg(feature = "demo")]
/// What the read-check-write of the demonstration decided, to be written as is.
pub(crate) struct UnguardedWrite<'a> {
    pub request: ApplyRequest<'a>,
    pub result: OperationResult,
    pub debit: i64,
    pub credit: i64,
    pub spend: i64,
}

/// The ledger's tables in one database.
pub(crate) struct SqlStore<D: Database> {
    /// Reads, and on PostgreSQL writes too.
    pool: Pool<D>,
    /// Write transactions. On SQLite a pool of one connection: writes queue here, in the
    /// process, in arrival order, instead of contending for SQLite's file lock and
    /// polling on SQLITE_BUSY — under a burst that polling starves some writers until
    /// they fail. On PostgreSQL the same pool as reads: row locks serialise its writers.
    writer: Pool<D>,
    /// How often an operation is tried on a fresh connection when the pooled one turns
    /// out to be dead. A database restart kills every pooled connection at once, so this
    /// is one more than the pool holds: the last try always opens a new connection.
    connection_tries: u32,
    /// PostgreSQL's group commit (`batch.rs`): spends go through it first.
    batcher: Option<Batcher>,
}

impl<D: Database> SqlStore<D> {
    /// A store on `pool`, writing through `writer` (see the field).
    pub(crate) fn new(pool: Pool<D>, writer: Pool<D>) -> Self {
        let connection_tries = pool
            .options()
            .get_max_connections()
            .max(writer.options().get_max_connections())
            + 1;
        Self {
            pool,
            writer,
            connection_tries,
            batcher: None,
        }
    }

    /// Spends go through `batcher` first.
    pub(crate) fn with_batcher(self, batcher: Batcher) -> Self {
        Self {
            batcher: Some(batcher),
            ..self
        }
    }

    /// Runs `operation`, again on another connection each time it fails because its
    /// connection was dead — never because the database refused it, and never when the
    /// pool could not produce a connection at all (the database is down: the caller
    /// answers 503). Only for operations that are safe to repeat: reads, idempotent
    /// writes, and BEGIN. (A dead connection is dropped by the pool when it is returned:
    /// the pool pings every connection it takes back.)
    async fn on_live_connection<T, F, Fut>(&self, mut operation: F) -> Result<T, sqlx::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let mut tries = self.connection_tries;
        loop {
            match operation().await {
                Err(error) if tries > 1 && is_dead_connection(&error) => {
                    tries -= 1;
                    tracing::debug!(%error, "a pooled connection was dead; trying another");
                }
                other => return other,
            }
        }
    }

    /// Opens a write transaction on a live connection.
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, D>, sqlx::Error>
    where
        D: Dialect,
    {
        self.on_live_connection(|| self.writer.begin_with(D::BEGIN_WRITE))
            .await
    }

    /// Runs `write` — a whole write that recognises what an earlier attempt of its own
    /// committed — again on another connection each time its connection dies under it,
    /// its COMMIT's answer included (as [`on_live_connection`](Self::on_live_connection)
    /// does for single statements). A commit whose every try lost its answer stays
    /// [`LedgerError::OutcomeUnknown`].
    async fn again_if_cut<T, F, Fut>(&self, mut write: F) -> Result<T, LedgerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, LedgerError>>,
    {
        let mut tries = self.connection_tries;
        loop {
            match write().await {
                Err(error) if tries > 1 && error.connection_died() => {
                    tries -= 1;
                    tracing::debug!(%error, "a write's connection died; writing again on another");
                }
                other => return other,
            }
        }
    }
}

impl<D: Database> fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("database", &D::NAME)
            .field("connections", &self.pool.size())
            .finish()
    }
}

#[derive(FromRow)]
pub(crate) struct OrderRow {
    id: OrderId,
    account_id: AccountId,
    amount: i64,
    description: String,
    fencing_token: i64,
    paid_by_ticket: Option<TicketId>,
    paid_at: Option<Timestamp>,
    created_at: Timestamp,
}

impl TryFrom<OrderRow> for Order {
    type Error = LedgerError;

    fn try_from(row: OrderRow) -> Result<Self, LedgerError> {
        Ok(Self {
            id: row.id,
            account_id: row.account_id,
            amount: Amount::new(row.amount).map_err(|_| {
                LedgerError::Corrupt(format!("order {}: amount {}", row.id, row.amount))
            })?,
            description: row.description,
            paid_by_ticket: row.paid_by_ticket,
            paid_at: row.paid_at.map(|at| at.0),
            created_at: row.created_at.0,
        })
    }
}

#[derive(FromRow)]
struct AccountRow {
    id: AccountId,
    name: String,
    balance: i64,
    points: i64,
    created_at: Timestamp,
}

impl From<AccountRow> for Account {
    fn from(row: AccountRow) -> Self {
        Self {
            id: row.id,
            name: row.name,
            balance: row.balance,
            points: row.points,
            created_at: row.created_at.0,
        }
    }
}

#[derive(FromRow)]
pub(crate) struct TicketRow {
    id: TicketId,
    account_id: AccountId,
    created_at: Timestamp,
    expires_at: Timestamp,
    operation: Option<String>,
    fingerprint: Option<String>,
    response_status: Option<i32>,
    response_body: Option<Json<Value>>,
    completed_at: Option<Timestamp>,
    /// The database's clock when the row was read.
    read_at: Timestamp,
}

impl TryFrom<TicketRow> for Ticket {
    type Error = LedgerError;

    fn try_from(row: TicketRow) -> Result<Self, LedgerError> {
        let outcome = match (
            row.operation,
            row.fingerprint,
            row.response_status,
            row.completed_at,
        ) {
            (Some(operation), Some(fingerprint), Some(status), Some(completed_at)) => {
                let operation = EntryKind::parse(&operation).ok_or_else(|| {
                    LedgerError::Corrupt(format!("ticket {}: operation {operation:?}", row.id))
                })?;
                let status = u16::try_from(status).map_err(|_| {
                    LedgerError::Corrupt(format!("ticket {}: status {status}", row.id))
                })?;
                Some(Outcome {
                    operation,
                    fingerprint,
                    response: row
                        .response_body
                        .map(|Json(body)| StoredResponse { status, body }),
                    completed_at: completed_at.0,
                })
            }
            (None, None, None, None) => None,
            _ => {
                return Err(LedgerError::Corrupt(format!(
                    "ticket {}: partial outcome",
                    row.id
                )));
            }
        };
        Ok(Self {
            id: row.id,
            account_id: row.account_id,
            created_at: row.created_at.0,
            expires_at: row.expires_at.0,
            outcome,
            read_at: row.read_at.0,
        })
    }
}

#[derive(FromRow)]
struct EntryRow {
    id: i64,
    account_id: AccountId,
    ticket_id: Option<TicketId>,
    kind: String,
    amount: i64,
    points: i64,
    balance_after: i64,
    points_after: i64,
    fencing_token: i64,
    created_at: Timestamp,
    order_id: Option<OrderId>,
}

impl TryFrom<EntryRow> for Entry {
    type Error = LedgerError;

    fn try_from(row: EntryRow) -> Result<Self, LedgerError> {
        Ok(Self {
            id: row.id,
            account_id: row.account_id,
            ticket_id: row.ticket_id,
            kind: EntryKind::parse(&row.kind).ok_or_else(|| {
                LedgerError::Corrupt(format!("entry {}: kind {:?}", row.id, row.kind))
            })?,
            amount: row.amount,
            points: row.points,
            balance_after: row.balance_after,
            points_after: row.points_after,
            fencing_token: u64::try_from(row.fencing_token).map_err(|_| {
                LedgerError::Corrupt(format!("entry {}: token {}", row.id, row.fencing_token))
            })?,
            created_at: row.created_at.0,
            order_id: row.order_id,
        })
    }
}

const INSERT_ENTRY: &str = "
    INSERT INTO entries (account_id, ticket_id, kind, amount, points, balance_after,
                         points_after, fencing_token, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// An order payment's entry: [`INSERT_ENTRY`]'s parameters ($5, points, is 0) and $10
/// the order.
const INSERT_ORDER_PAYMENT: &str = "
    INSERT INTO entries (account_id, ticket_id, kind, amount, points, balance_after,
                         points_after, fencing_token, created_at, order_id)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// An order payment's move: the order's amount out of the account if the balance covers
/// it. No fencing token here — the lock the payer holds is the order's, whose token is
/// checked and recorded on the order; the balance is still only ever changed by a
/// conditional update, so payments and withdrawals of one account cannot overdraw it
/// between them. Parameters: $1 account, $2 amount.
const MOVE_FOR_ORDER: &str = "
    UPDATE accounts SET balance = balance - $2
    WHERE id = $1 AND balance >= $2
    RETURNING balance, points";

/// Records an order payment attempt's token (checked newer by the caller, on the locked
/// row) and, when it paid, the paying ticket. Parameters: $1 order, $2 token, $3 paying
/// ticket or NULL, $4 when or NULL, $5 the order's account.
const RECORD_ORDER: &str = "
    UPDATE orders
    SET fencing_token = $2, paid_by_ticket = coalesce($3, paid_by_ticket),
        paid_at = coalesce($4, paid_at)
    WHERE id = $1 AND account_id = $5 AND fencing_token < $2";

/// The operation as one conditional update: it moves the money and points and records the
/// fencing token only if the token is newer than any the account accepted, the balance
/// covers the debit, the points cover the spend, and the credit cannot overflow.
/// Concurrent updates of one account serialise on its row and each re-checks the
/// condition, so there is no read-then-write race even without the lock. Written so that
/// no sub-expression can overflow: amounts are at most 10^12 and credits 10^14.
///
/// Newer, not "at least as new": a grant's token is used for one write, so an equal token
/// is a second holder carrying the same number — after the lock store lost its counters
/// and handed a number out again — and the later of the two must not write.
const MOVE: &str = "
    UPDATE accounts
    SET balance = balance - $2 + $3, points = points - $4, fencing_token = $5
    WHERE id = $1 AND fencing_token < $5 AND balance >= $2 AND points >= $4
      AND balance - $2 <= 9223372036854775807 - $3
    RETURNING balance, points";

/// A business refusal records the token like any write: a later grant's write must still
/// be newer. Parameters: $1 account, $2 token (checked newer by the caller, on the locked
/// row).
const RECORD_TOKEN: &str = "
    UPDATE accounts SET fencing_token = $2 WHERE id = $1 AND fencing_token < $2";

/// Stores a ticket's outcome. Parameters: $1 ticket, $2 operation, $3 fingerprint,
/// $4 status, $5 body, $6 when, $7 the ticket's account (already known to own it: named so
/// that the statement reaches one account's rows, as a ledger partitioned by account needs).
const COMPLETE_TICKET: &str = "
    UPDATE tickets
    SET operation = $2, fingerprint = $3, response_status = $4, response_body = $5,
        completed_at = $6
    WHERE id = $1 AND account_id = $7";

/// Opens an account, unless its id is taken (by an earlier attempt of the same create,
/// whose commit answer was lost). Parameters: $1 id, $2 name, $3 balance, $4 points, $5
/// API key hash, $6 when. Returns the id if it inserted.
const INSERT_ACCOUNT: &str = "
    INSERT INTO accounts (id, name, balance, points, api_key_hash, fencing_token, created_at)
    VALUES ($1, $2, $3, $4, $5, 0, $6)
    ON CONFLICT (id) DO NOTHING
    RETURNING id";

/// Places an order, unless its id is taken (as for [`INSERT_ACCOUNT`]). Parameters: $1
/// id, $2 account, $3 amount, $4 description, $5 when. Returns the order if it inserted.
const INSERT_ORDER: &str = concat!(
    "INSERT INTO orders (id, account_id, amount, description, fencing_token, created_at)
     VALUES ($1, $2, $3, $4, 0, $5)
     ON CONFLICT (id) DO NOTHING
     RETURNING ",
    order_columns!()
);

/// Claims a create's idempotency key with its record, unless the key has one. (On
/// PostgreSQL a record another transaction is writing makes this wait for it.)
/// Parameters: $1 key hash, $2 fingerprint, $3 the account created or NULL, $4 the order
/// created or NULL, $5 status, $6 body, $7 sealed API key or NULL, $8 when. Returns the
/// key hash if it claimed the key.
const CLAIM_CREATION: &str = "
    INSERT INTO creations (key_hash, fingerprint, created_account, created_order,
                           response_status, response_body, sealed_api_key, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
    ON CONFLICT (key_hash) DO NOTHING
    RETURNING key_hash";

/// A creation record, as [`CreationRow`] reads it. Parameter: $1 key hash.
const CREATION: &str = "
    SELECT fingerprint, created_account, created_order, response_status, response_body,
           sealed_api_key
    FROM creations WHERE key_hash = $1";

/// How many minor units one lottery draw credits, given the prize and the points spent.
fn prize_credit(prize: &lottery::Prize, points: i64) -> i64 {
    prize.credit_per_point.saturating_mul(points)
}

fn token_to_sql(token: u64) -> Result<i64, LedgerError> {
    i64::try_from(token)
        .map_err(|_| LedgerError::Corrupt(format!("fencing token {token} exceeds 2^63")))
}

#[async_trait]
impl<D> Store for SqlStore<D>
where
    D: Dialect,
    D::Arguments: IntoArguments<D>,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> Option<TicketId>: Encode<'q, D>,
    for<'q> i64: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> i32: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> String: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> Vec<u8>: Encode<'q, D> + Type<D>,
    for<'q> AccountId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> TicketId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Json<Value>: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Json<&'q Value>: Encode<'q, D> + Type<D>,
    for<'q> &'q str: ColumnIndex<D::Row>,
    usize: ColumnIndex<D::Row>,
    for<'r> AccountRow: FromRow<'r, D::Row>,
    for<'r> TicketRow: FromRow<'r, D::Row>,
    for<'r> EntryRow: FromRow<'r, D::Row>,
    for<'r> OrderRow: FromRow<'r, D::Row>,
    for<'q> OrderId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Option<Timestamp>: Encode<'q, D>,
    for<'r> (i64, i64): FromRow<'r, D::Row>,
    for<'q> Option<AccountId>: Encode<'q, D>,
    for<'q> Option<OrderId>: Encode<'q, D>,
    for<'q> Option<Vec<u8>>: Encode<'q, D>,
    for<'q> Vec<u8>: Decode<'q, D>,
    for<'r> CreationRow: FromRow<'r, D::Row>,
    for<'r> (String, Vec<u8>, Timestamp): FromRow<'r, D::Row>,
{
    async fn create_account(
        &self,
        account: &Account,
        key_hash: Vec<u8>,
        creation: Option<&NewCreation<'_>>,
    ) -> Result<Option<CreationRow>, LedgerError> {
        // The account's id is chosen before: a repeat after a commit that did land finds
        // what it wrote and answers that.
        self.again_if_cut(|| self.try_create_account(account, &key_hash, creation))
            .await
    }

    async fn authenticate(&self, key_hash: Vec<u8>) -> Result<Option<AccountId>, LedgerError> {
        let query = || {
            sqlx::query_scalar("SELECT id FROM accounts WHERE api_key_hash = $1")
                .bind(key_hash.clone())
                .fetch_optional(&self.pool)
        };
        Ok(self.on_live_connection(query).await?)
    }

    async fn account(&self, id: AccountId) -> Result<Option<Account>, LedgerError> {
        let query = || {
            sqlx::query_as::<_, AccountRow>(
                "SELECT id, name, balance, points, created_at FROM accounts WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(&self.pool)
        };
        Ok(self.on_live_connection(query).await?.map(Account::from))
    }

    async fn fencing_token(&self, id: AccountId) -> Result<Option<u64>, LedgerError> {
        let query = || {
            sqlx::query_scalar::<_, i64>("SELECT fencing_token FROM accounts WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
        };
        let token = self.on_live_connection(query).await?;
        Ok(token.map(|token| token.max(0).unsigned_abs()))
    }

    async fn issue_ticket(
        &self,
        account_id: AccountId,
        ttl: Duration,
    ) -> Result<Ticket, LedgerError> {
        let id = TicketId::random();
        let ttl_micros = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
        // Safe to repeat on a dead connection: the id is ours, so a repeat of an insert
        // that did land inserts nothing, and the ticket is read back.
        let insert = || {
            sqlx::query_as::<_, TicketRow>(D::ISSUE_TICKET)
                .bind(id)
                .bind(account_id)
                .bind(ttl_micros)
                .fetch_optional(&self.writer)
        };
        let row = match self.on_live_connection(insert).await.or_constraint()? {
            Some(row) => row,
            None => self.ticket_row(id).await?.ok_or_else(|| {
                LedgerError::Corrupt(format!("ticket {id} was issued but cannot be read"))
            })?,
        };
        Ticket::try_from(row)
    }

    async fn ticket(&self, id: TicketId) -> Result<Option<Ticket>, LedgerError> {
        self.ticket_row(id).await?.map(Ticket::try_from).transpose()
    }

    async fn create_order(
        &self,
        order: &Order,
        creation: Option<&NewCreation<'_>>,
    ) -> Result<Option<CreationRow>, LedgerError> {
        if let Some(creation) = creation {
            return self
                .again_if_cut(|| self.try_create_order(order, creation))
                .await;
        }
        // One statement, committed on its own, through the writer. Safe to repeat on a
        // dead connection: the id is ours, so a repeat of an insert that did land inserts
        // nothing, and the order is read back.
        let insert = || {
            sqlx::query_as::<_, OrderRow>(INSERT_ORDER)
                .bind(order.id)
                .bind(order.account_id)
                .bind(order.amount.get())
                .bind(order.description.as_str())
                .bind(Timestamp(order.created_at))
                .fetch_optional(&self.writer)
        };
        if self
            .on_live_connection(insert)
            .await
            .or_constraint()?
            .is_none()
        {
            let found = self.order(order.id).await?;
            recognise_order(order, found)?;
        }
        Ok(None)
    }

    async fn order(&self, id: OrderId) -> Result<Option<Order>, LedgerError> {
        let query = || {
            sqlx::query_as::<_, OrderRow>(concat!(
                "SELECT ",
                order_columns!(),
                " FROM orders WHERE id = $1"
            ))
            .bind(id)
            .fetch_optional(&self.pool)
        };
        self.on_live_connection(query)
            .await?
            .map(Order::try_from)
            .transpose()
    }

    async fn entries(
        &self,
        account_id: AccountId,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Entry>, LedgerError> {
        let query = || {
            sqlx::query_as::<_, EntryRow>(
                "SELECT id, account_id, ticket_id, kind, amount, points, balance_after, points_after,
                        fencing_token, created_at, order_id
                 FROM entries WHERE account_id = $1 AND id > $2
                 ORDER BY id LIMIT $3",
            )
            .bind(account_id)
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
        };
        let rows = self.on_live_connection(query).await?;
        rows.into_iter().map(Entry::try_from).collect()
    }

    async fn apply(
        &self,
        request: &ApplyRequest<'_>,
        render: &Renderer,
    ) -> Result<Applied, ApplyError> {
        let token = token_to_sql(request.fencing_token)?;
        if let Operation::OrderPayment { order, amount } = request.operation {
            return self
                .pay_order_in_transaction(request, order, amount, token, render)
                .await;
        }
        let planned = Planned::of(request.operation);
        if let Some(batcher) = &self.batcher
            && let Some(answer) =
                Self::apply_in_batch(batcher, request, &planned, token, render).await
        {
            return answer;
        }
        self.apply_in_transaction(request, &planned, token, render)
            .await
    }

    async fn audit(&self) -> Result<Vec<Violation>, LedgerError> {
        let pool = &self.pool;
        let mut found = Vec::new();
        let mut report = |rule, account_id, ticket_id, detail: String| {
            found.push(Violation {
                rule,
                account_id,
                ticket_id,
                detail,
            });
        };

        let rows: Vec<(AccountId, i64, i64)> =
            sqlx::query_as(audit::NEGATIVE).fetch_all(pool).await?;
        for (account, balance, points) in rows {
            report(
                Rule::NonNegative,
                Some(account),
                None,
                format!("balance {balance}, points {points}"),
            );
        }

        let rows: Vec<(AccountId, i64, i64, i64, i64)> =
            sqlx::query_as(audit::SUMS).fetch_all(pool).await?;
        for (account, balance, points, sum_amount, sum_points) in rows {
            report(
                Rule::BalanceMatchesEntries,
                Some(account),
                None,
                format!(
                    "balance {balance} but entries sum to {sum_amount}; points {points} but entries sum to {sum_points}"
                ),
            );
        }

        type Running = (
            i64,
            AccountId,
            Option<TicketId>,
            i64,
            i64,
            i64,
            i64,
            i64,
            Option<i64>,
        );
        let rows: Vec<Running> = sqlx::query_as(audit::RUNNING).fetch_all(pool).await?;
        for (
            entry,
            account,
            ticket,
            balance_after,
            points_after,
            running_balance,
            running_points,
            token,
            previous,
        ) in rows
        {
            if balance_after != running_balance || points_after != running_points {
                report(
                    Rule::RunningTotals,
                    Some(account),
                    ticket,
                    format!(
                        "entry {entry}: balance_after {balance_after} (running sum {running_balance}), points_after {points_after} (running sum {running_points})"
                    ),
                );
            }
            if let Some(previous) = previous.filter(|previous| token < *previous) {
                report(
                    Rule::FencingTokenOnlyGrows,
                    Some(account),
                    ticket,
                    format!("entry {entry}: fencing token {token} after {previous}"),
                );
            }
        }

        let rows: Vec<(TicketId, AccountId, i64)> = sqlx::query_as(audit::DUPLICATE_ENTRIES)
            .fetch_all(pool)
            .await?;
        for (ticket, account, count) in rows {
            report(
                Rule::OneEntryPerTicket,
                Some(account),
                Some(ticket),
                format!("{count} entries"),
            );
        }

        type Pair = (
            TicketId,
            AccountId,
            Option<i32>,
            Option<String>,
            Option<i64>,
            Option<AccountId>,
            Option<String>,
        );
        let rows: Vec<Pair> = sqlx::query_as(audit::OUTCOME_VS_ENTRY)
            .fetch_all(pool)
            .await?;
        for (ticket, account, status, operation, entry, entry_account, entry_kind) in rows {
            let detail = match entry {
                None => format!("stored status {status:?} but no entry"),
                Some(entry) => format!(
                    "stored status {status:?} for {operation:?}, but entry {entry} is {entry_kind:?} on account {entry_account:?}"
                ),
            };
            report(
                Rule::OutcomeMatchesEntry,
                Some(account),
                Some(ticket),
                detail,
            );
        }

        let rows: Vec<(i64, AccountId, TicketId)> = sqlx::query_as(audit::ORPHAN_ENTRIES)
            .fetch_all(pool)
            .await?;
        for (entry, account, ticket) in rows {
            report(
                Rule::EntryHasTicket,
                Some(account),
                Some(ticket),
                format!("entry {entry} names a ticket that does not exist"),
            );
        }

        let rows: Vec<(AccountId, i64, i64)> = sqlx::query_as(audit::ACCOUNT_TOKENS)
            .fetch_all(pool)
            .await?;
        for (account, recorded, highest) in rows {
            report(
                Rule::FencingTokenOnlyGrows,
                Some(account),
                None,
                format!("account records token {recorded} but an entry carries {highest}"),
            );
        }

        let rows: Vec<(AccountId, i64)> =
            sqlx::query_as(audit::OPENING_COUNT).fetch_all(pool).await?;
        for (account, count) in rows {
            report(
                Rule::OpeningEntry,
                Some(account),
                None,
                format!("{count} opening entries"),
            );
        }
        let rows: Vec<(i64, AccountId)> =
            sqlx::query_as(audit::OPENING_FIRST).fetch_all(pool).await?;
        for (entry, account) in rows {
            report(
                Rule::OpeningEntry,
                Some(account),
                None,
                format!("opening entry {entry} is not the account's first"),
            );
        }

        let rows: Vec<(i64, AccountId, Option<TicketId>, String, i64, i64)> =
            sqlx::query_as(audit::SIGNS).fetch_all(pool).await?;
        for (entry, account, ticket, kind, amount, points) in rows {
            report(
                Rule::EntrySigns,
                Some(account),
                ticket,
                format!("entry {entry}: {kind} with amount {amount}, points {points}"),
            );
        }

        type Paid = (
            OrderId,
            AccountId,
            Option<TicketId>,
            Option<TicketId>,
            i64,
            Option<i64>,
            i64,
        );
        let rows: Vec<Paid> = sqlx::query_as(audit::ORDERS).fetch_all(pool).await?;
        for (order, account, ticket, paid_by, amount, entry_amount, payments) in rows {
            let state = paid_by.map_or("open".to_owned(), |paid_by| format!("paid by {paid_by}"));
            report(
                Rule::OrderPaidOnce,
                Some(account),
                ticket.or(paid_by),
                format!(
                    "order {order} of {amount}, {state}: {payments} payment entries (this one's amount {entry_amount:?})"
                ),
            );
        }

        Ok(found)
    }

    async fn reap(&self, retention: Duration, batch: i64) -> Result<(u64, u64, u64), LedgerError> {
        let now: Timestamp = sqlx::query_scalar(D::CLOCK).fetch_one(&self.pool).await?;
        let cutoff = before(now, retention);
        // RETURNING counts the rows the same way in both databases.
        let deleted: Vec<TicketId> = sqlx::query_scalar(D::DELETE_UNUSED)
            .bind(cutoff)
            .bind(batch)
            .fetch_all(&self.writer)
            .await?;
        let pruned: Vec<TicketId> = sqlx::query_scalar(D::PRUNE_OUTCOMES)
            .bind(cutoff)
            .bind(now)
            .bind(batch)
            .fetch_all(&self.writer)
            .await?;
        let expired: Vec<Vec<u8>> = sqlx::query_scalar(D::DELETE_OLD_CREATIONS)
            .bind(cutoff)
            .bind(batch)
            .fetch_all(&self.writer)
            .await?;
        Ok((
            deleted.len() as u64,
            pruned.len() as u64,
            expired.len() as u64,
        ))
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        let ping = || sqlx::query("SELECT 1").execute(&self.pool);
        self.on_live_connection(ping).await?;
        Ok(())
    }

    fn batches(&self) -> Option<&Batches> {
        self.batcher.as_ref().map(Batcher::sizes)
    }

    async fn close(&self) {
        self.pool.close().await;
        self.writer.close().await;
    }

    #[cfg(feature = "demo")]
    async fn holdings(&self, id: AccountId) -> Result<Option<(i64, i64, i64)>, LedgerError> {
        let row: Option<(i64, i64, i64)> =
            sqlx::query_as("SELECT balance, points, fencing_token FROM accounts WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row)
    }

    #[cfg(feature = "demo")]
    async fn write_unguarded(
        &self,
        write: &UnguardedWrite<'_>,
        render: &Renderer,
        now: Timestamp,
    ) -> Result<Option<Applied>, ApplyError> {
        let request = &write.request;
        let token = token_to_sql(request.fencing_token)?;
        let status = write.result.status();
        let body = render(&request.execution(&write.result));
        let kind = request.operation.kind().as_str();
        let mut tx = self.begin_write().await?;
        if let OperationResult::Applied {
            balance, points, ..
        } = write.result
        {
            // The flaw on display: absolute values computed from a read that may be stale.
            sqlx::query("UPDATE accounts SET balance = $2, points = $3 WHERE id = $1")
                .bind(request.account_id)
                .bind(balance)
                .bind(points)
                .execute(&mut *tx)
                .await
                .or_constraint()?;
            let inserted = sqlx::query(INSERT_ENTRY)
                .bind(request.account_id)
                .bind(request.ticket_id)
                .bind(kind)
                .bind(write.credit - write.debit)
                .bind(-write.spend)
                .bind(balance)
                .bind(points)
                .bind(token)
                .bind(now)
                .execute(&mut *tx)
                .await
                .or_constraint();
            match inserted {
                Err(LedgerError::Constraint {
                    constraint: crate::error::constraint::ENTRY_PER_TICKET,
                    ..
                }) => return Ok(None),
                other => {
                    other?;
                }
            }
        }
        let completed: Option<TicketId> = sqlx::query_scalar(
            "UPDATE tickets
             SET operation = $2, fingerprint = $3, response_status = $4, response_body = $5,
                 completed_at = $6
             WHERE id = $1 AND completed_at IS NULL
             RETURNING id",
        )
        .bind(request.ticket_id)
        .bind(kind)
        .bind(request.fingerprint)
        .bind(i32::from(status))
        .bind(Json(&body))
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        if completed.is_none() {
            return Ok(None);
        }
        commit_or_unknown(tx).await?;
        Ok(Some(Applied {
            response: StoredResponse { status, body },
            replayed: false,
        }))
    }
}

/// What an operation would move, worked out before the transaction.
struct Planned {
    debit: i64,
    credit: i64,
    spend: i64,
    prize: Option<&'static lottery::Prize>,
}

impl Planned {
    fn of(operation: Operation) -> Self {
        match operation {
            Operation::Withdrawal(amount) => Self {
                debit: amount.get(),
                credit: 0,
                spend: 0,
                prize: None,
            },
            Operation::Deposit(amount) => Self {
                debit: 0,
                credit: amount.get(),
                spend: 0,
                prize: None,
            },
            Operation::OrderPayment { amount, .. } => Self {
                debit: amount.get(),
                credit: 0,
                spend: 0,
                prize: None,
            },
            // Drawn before we know the ticket is usable; a replay simply discards it.
            Operation::LotteryDraw(points) => {
                let prize = lottery::draw();
                Self {
                    debit: 0,
                    credit: prize_credit(prize, points.get()),
                    spend: points.get(),
                    prize: Some(prize),
                }
            }
        }
    }

    /// The outcome once the move happened, leaving `balance` and `points`.
    fn applied(&self, balance: i64, points: i64) -> OperationResult {
        OperationResult::Applied {
            balance,
            points,
            credit: self.credit,
            prize: self.prize,
        }
    }

    /// Why an account holding `balance` and `points` cannot take this operation, if it
    /// cannot.
    fn refusal(&self, balance: i64, points: i64) -> Option<Refusal> {
        if balance < self.debit {
            Some(Refusal::InsufficientFunds { balance })
        } else if points < self.spend {
            Some(Refusal::InsufficientPoints { points })
        } else if balance - self.debit > i64::MAX - self.credit {
            Some(Refusal::BalanceLimit { balance })
        } else {
            None
        }
    }
}

/// The steps of [`Store::apply`], each one round trip or two.
impl<D> SqlStore<D>
where
    D: Dialect,
    D::Arguments: IntoArguments<D>,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> i64: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> i32: Encode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> AccountId: Encode<'q, D> + Type<D>,
    for<'q> TicketId: Encode<'q, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Type<D>,
    for<'q> Json<&'q Value>: Encode<'q, D> + Type<D>,
    for<'r> TicketRow: FromRow<'r, D::Row>,
    for<'r> OrderRow: FromRow<'r, D::Row>,
    for<'q> OrderId: Encode<'q, D> + Type<D>,
    for<'q> Option<TicketId>: Encode<'q, D>,
    for<'q> Option<Timestamp>: Encode<'q, D>,
    for<'r> (i64, i64): FromRow<'r, D::Row>,
    for<'r> (i64, i64, i64): FromRow<'r, D::Row>,
{
    /// A ticket's row, read on a live connection.
    async fn ticket_row(&self, id: TicketId) -> Result<Option<TicketRow>, LedgerError> {
        let query = || {
            sqlx::query_as::<_, TicketRow>(D::TICKET)
                .bind(id)
                .fetch_optional(&self.pool)
        };
        Ok(self.on_live_connection(query).await?)
    }

    /// The usual path on PostgreSQL: the spend goes into the next batch (`batch.rs`), one
    /// round trip for the ticket's judgement, the move, the entry and the outcome. `None`
    /// when the transaction path must settle it: a refusal (the batch wrote nothing for
    /// it; the transaction path stores it), a batch the database refused, or a renderer
    /// whose success body the database cannot fill in.
    async fn apply_in_batch(
        batcher: &Batcher,
        request: &ApplyRequest<'_>,
        planned: &Planned,
        token: i64,
        render: &Renderer,
    ) -> Option<Result<Applied, ApplyError>> {
        let stand_in = OperationResult::Applied {
            balance: batch::BALANCE_STAND_IN,
            points: batch::POINTS_STAND_IN,
            credit: planned.credit,
            prize: planned.prize,
        };
        let body = batch::substitutable(&render(&request.execution(&stand_in)))?;
        let spend = batch::Spend {
            ticket_id: request.ticket_id,
            account_id: request.account_id,
            kind: request.operation.kind().as_str(),
            debit: planned.debit,
            credit: planned.credit,
            points: planned.spend,
            token,
            fingerprint: request.fingerprint.to_owned(),
            body,
            status: stand_in.status(),
        };
        let done = match batcher.apply(spend).await {
            Ok(done) => done,
            Err(failed) => return failed.error().map(|error| Err(error.into())),
        };
        if let Some(body) = done.written {
            return Some(Ok(Applied {
                response: StoredResponse {
                    status: stand_in.status(),
                    body,
                },
                replayed: false,
            }));
        }
        // Not written: a used ticket's answer; a stale token, refused as the transaction
        // path would; else a refusal, stored by the transaction path.
        if let Err(answer) = judged(done.ticket, request) {
            return Some(answer);
        }
        match done.recorded_token {
            Some(recorded) if recorded >= token => Some(Err(stale(request, recorded))),
            _ => None,
        }
    }

    /// The transaction path: every step its own statement, in one transaction. Every early
    /// return drops the transaction, which rolls it back: nothing is written unless the
    /// whole operation and its outcome are.
    async fn apply_in_transaction(
        &self,
        request: &ApplyRequest<'_>,
        planned: &Planned,
        token: i64,
        render: &Renderer,
    ) -> Result<Applied, ApplyError> {
        let mut tx = self.begin_write().await?;
        // 1-2. Lock the ticket and judge it.
        let now = match Self::lock_and_judge(&mut tx, request).await? {
            Ok(now) => now,
            Err(answer) => return answer,
        };
        // 3. Move money and points under the fencing check, in one conditional update;
        //    if it was refused, find out why on the account's latest version.
        let result = match Self::try_move(&mut tx, request, planned, token).await? {
            Some((balance, points)) => planned.applied(balance, points),
            None => Self::settle_refused(&mut tx, request, planned, token).await?,
        };
        // 4. The entry (only when something moved) and the outcome, in this transaction.
        let response = Self::record(&mut tx, request, planned, &result, token, now, render).await?;
        commit_or_unknown(tx).await?;
        Ok(Applied {
            response,
            replayed: false,
        })
    }

    /// Steps 1 and 2 of every transaction that spends a ticket: lock the ticket, so
    /// concurrent uses of it queue here until we commit, and read the database's clock
    /// once the lock is ours; then judge it — a used one replays its stored outcome or
    /// refuses a different request, an expired one is refused. The clock's reading if the
    /// ticket is usable, else the answer.
    async fn lock_and_judge(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
    ) -> Result<Result<Timestamp, Result<Applied, ApplyError>>, ApplyError> {
        let row: Option<TicketRow> = sqlx::query_as(D::LOCK_TICKET)
            .bind(request.ticket_id)
            .bind(request.account_id)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(judged(row, request).map(|ticket| Timestamp(ticket.read_at)))
    }

    /// An order payment, on the transaction path (both databases): the ticket locked and
    /// judged as for every spend; then the order locked, its fencing token checked and
    /// recorded (the payer holds the order's lock, not the account's); an order already
    /// paid refused with 409, stored; else the amount taken from the account by a
    /// conditional update (402, stored, when the balance does not cover it — the order
    /// stays open); and on success the entry, carrying the order, and the order marked
    /// paid by this ticket. All in one transaction, with the outcome.
    async fn pay_order_in_transaction(
        &self,
        request: &ApplyRequest<'_>,
        order_id: OrderId,
        amount: Amount,
        token: i64,
        render: &Renderer,
    ) -> Result<Applied, ApplyError> {
        let mut tx = self.begin_write().await?;
        let now = match Self::lock_and_judge(&mut tx, request).await? {
            Ok(now) => now,
            Err(answer) => return answer,
        };
        let order: OrderRow = sqlx::query_as(D::LOCK_ORDER)
            .bind(order_id)
            .bind(request.account_id)
            .fetch_optional(&mut *tx)
            .await?
            .filter(|order: &OrderRow| order.amount == amount.get())
            .ok_or(ApplyError::UnknownOrder)?;
        if order.fencing_token >= token {
            return Err(stale(request, order.fencing_token));
        }
        let result = match order.paid_by_ticket {
            Some(paid_by) => OperationResult::Refused(Refusal::OrderAlreadyPaid { paid_by }),
            None => {
                let moved: Option<(i64, i64)> = sqlx::query_as(MOVE_FOR_ORDER)
                    .bind(request.account_id)
                    .bind(amount.get())
                    .fetch_optional(&mut *tx)
                    .await
                    .or_constraint()?;
                match moved {
                    Some((balance, points)) => OperationResult::Applied {
                        balance,
                        points,
                        credit: 0,
                        prize: None,
                    },
                    None => {
                        let (balance, _, _): (i64, i64, i64) = sqlx::query_as(D::LOCK_ACCOUNT)
                            .bind(request.account_id)
                            .fetch_one(&mut *tx)
                            .await?;
                        OperationResult::Refused(Refusal::InsufficientFunds { balance })
                    }
                }
            }
        };
        let paid = matches!(result, OperationResult::Applied { .. });
        sqlx::query(RECORD_ORDER)
            .bind(order_id)
            .bind(token)
            .bind(paid.then_some(request.ticket_id))
            .bind(paid.then_some(now))
            .bind(request.account_id)
            .execute(&mut *tx)
            .await
            .or_constraint()?;
        let status = result.status();
        let body = render(&request.execution(&result));
        let kind = EntryKind::OrderPayment.as_str();
        if let OperationResult::Applied {
            balance, points, ..
        } = result
        {
            sqlx::query(INSERT_ORDER_PAYMENT)
                .bind(request.account_id)
                .bind(request.ticket_id)
                .bind(kind)
                .bind(-amount.get())
                .bind(0_i64)
                .bind(balance)
                .bind(points)
                .bind(token)
                .bind(now)
                .bind(order_id)
                .execute(&mut *tx)
                .await
                .or_constraint()?;
        }
        Self::complete_ticket(&mut tx, request, kind, status, &body, now).await?;
        commit_or_unknown(tx).await?;
        Ok(Applied {
            response: StoredResponse { status, body },
            replayed: false,
        })
    }

    /// Step 3: the conditional move.
    async fn try_move(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        planned: &Planned,
        token: i64,
    ) -> Result<Option<(i64, i64)>, ApplyError> {
        Ok(sqlx::query_as::<_, (i64, i64)>(MOVE)
            .bind(request.account_id)
            .bind(planned.debit)
            .bind(planned.credit)
            .bind(planned.spend)
            .bind(token)
            .fetch_optional(&mut **tx)
            .await
            .or_constraint()?)
    }

    /// Step 3 after a refused move: a stale token (nothing may be written), or a business
    /// refusal, which is recorded with the token like any other outcome. Judged on the
    /// account's latest version, locked: if that version affords the operation after all
    /// — another writer committed in between, which only overlapping lock holders allow —
    /// the move is made now, since this transaction holds the row and the conditions
    /// cannot change again.
    async fn settle_refused(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        planned: &Planned,
        token: i64,
    ) -> Result<OperationResult, ApplyError> {
        let (balance, points, recorded): (i64, i64, i64) = sqlx::query_as(D::LOCK_ACCOUNT)
            .bind(request.account_id)
            .fetch_one(&mut **tx)
            .await?;
        if recorded >= token {
            return Err(stale(request, recorded));
        }
        match planned.refusal(balance, points) {
            Some(refusal) => {
                sqlx::query(RECORD_TOKEN)
                    .bind(request.account_id)
                    .bind(token)
                    .execute(&mut **tx)
                    .await
                    .or_constraint()?;
                Ok(OperationResult::Refused(refusal))
            }
            None => match Self::try_move(tx, request, planned, token).await? {
                Some((balance, points)) => Ok(planned.applied(balance, points)),
                None => Err(ApplyError::Ledger(LedgerError::Corrupt(format!(
                    "account {}: a move its locked row affords was refused",
                    request.account_id
                )))),
            },
        }
    }

    /// Step 4: the entry (only when something moved) and the outcome under the ticket.
    async fn record(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        planned: &Planned,
        result: &OperationResult,
        token: i64,
        now: Timestamp,
        render: &Renderer,
    ) -> Result<StoredResponse, ApplyError> {
        let status = result.status();
        let body = render(&request.execution(result));
        let kind = request.operation.kind().as_str();
        if let OperationResult::Applied {
            balance, points, ..
        } = *result
        {
            sqlx::query(INSERT_ENTRY)
                .bind(request.account_id)
                .bind(request.ticket_id)
                .bind(kind)
                .bind(planned.credit - planned.debit)
                .bind(-planned.spend)
                .bind(balance)
                .bind(points)
                .bind(token)
                .bind(now)
                .execute(&mut **tx)
                .await
                .or_constraint()?;
        }
        Self::complete_ticket(tx, request, kind, status, &body, now).await?;
        Ok(StoredResponse { status, body })
    }

    /// Stores the outcome under the ticket. Parameters as in [`COMPLETE_TICKET`].
    async fn complete_ticket(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        kind: &str,
        status: u16,
        body: &Value,
        now: Timestamp,
    ) -> Result<(), LedgerError> {
        sqlx::query(COMPLETE_TICKET)
            .bind(request.ticket_id)
            .bind(kind)
            .bind(request.fingerprint)
            .bind(i32::from(status))
            .bind(Json(body))
            .bind(now)
            .bind(request.account_id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

/// The refusal of `request`'s token, which the account's `recorded` one already passed.
fn stale(request: &ApplyRequest<'_>, recorded: i64) -> ApplyError {
    ApplyError::StaleToken {
        presented: request.fencing_token,
        recorded: recorded.max(0).unsigned_abs(),
    }
}

/// The one judgement of a ticket before anything moves ([`Ticket::judge`]), as `apply`
/// answers it: the ticket if it is usable, else the answer — its stored outcome replayed,
/// or why it cannot run. Another account's ticket is, to this account, no ticket at all.
fn judged(
    row: Option<TicketRow>,
    request: &ApplyRequest<'_>,
) -> Result<Ticket, Result<Applied, ApplyError>> {
    let ticket = match row {
        Some(row) if row.account_id == request.account_id => {
            Ticket::try_from(row).map_err(|error| Err(error.into()))?
        }
        _ => return Err(Err(ApplyError::UnknownTicket)),
    };
    let refusal = match ticket.judge(request.fingerprint) {
        Judgement::Usable => return Ok(ticket),
        Judgement::Replay(response) => {
            return Err(Ok(Applied {
                response: response.clone(),
                replayed: true,
            }));
        }
        Judgement::Reused => ApplyError::FingerprintMismatch,
        Judgement::Pruned => ApplyError::OutcomePruned,
        Judgement::Expired => ApplyError::TicketExpired,
    };
    Err(Err(refusal))
}

/// How long the retention keeps something, as a timestamp offset that cannot overflow.
pub(crate) fn before(now: Timestamp, age: Duration) -> Timestamp {
    let age = time::Duration::try_from(age).unwrap_or(time::Duration::MAX);
    Timestamp(
        now.0
            .checked_sub(age)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
    )
}

/// The steps of the creates: each a transaction that recognises what an earlier attempt of
/// its own committed, so that [`SqlStore::again_if_cut`] may run it again.
impl<D> SqlStore<D>
where
    D: Dialect,
    D::Arguments: IntoArguments<D>,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> i64: Encode<'q, D> + Type<D>,
    for<'q> i32: Encode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> Vec<u8>: Encode<'q, D> + Decode<'q, D> + Type<D>,
    usize: ColumnIndex<D::Row>,
    for<'q> AccountId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> OrderId: Encode<'q, D> + Type<D>,
    TicketId: Type<D>,
    for<'q> Option<TicketId>: Encode<'q, D>,
    for<'q> Option<AccountId>: Encode<'q, D>,
    for<'q> Option<OrderId>: Encode<'q, D>,
    for<'q> Option<Vec<u8>>: Encode<'q, D>,
    for<'q> Timestamp: Encode<'q, D> + Type<D>,
    for<'q> Json<&'q Value>: Encode<'q, D> + Type<D>,
    for<'r> OrderRow: FromRow<'r, D::Row>,
    for<'r> CreationRow: FromRow<'r, D::Row>,
    for<'r> (String, Vec<u8>, Timestamp): FromRow<'r, D::Row>,
{
    /// One attempt of [`Store::create_account`].
    async fn try_create_account(
        &self,
        account: &Account,
        key_hash: &[u8],
        creation: Option<&NewCreation<'_>>,
    ) -> Result<Option<CreationRow>, LedgerError> {
        let now = Timestamp(account.created_at);
        let mut tx = self.begin_write().await?;
        if let Some(creation) = creation
            && let Some(found) = Self::claim(&mut tx, creation, Some(account.id), None, now).await?
        {
            return Ok(Some(found));
        }
        let inserted: Option<AccountId> = sqlx::query_scalar(INSERT_ACCOUNT)
            .bind(account.id)
            .bind(account.name.as_str())
            .bind(account.balance)
            .bind(account.points)
            .bind(key_hash.to_vec())
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .or_constraint()?;
        if inserted.is_none() {
            // An earlier attempt committed it (and its record, which the claim would have
            // found): nothing more to write.
            let found: Option<(String, Vec<u8>, Timestamp)> =
                sqlx::query_as("SELECT name, api_key_hash, created_at FROM accounts WHERE id = $1")
                    .bind(account.id)
                    .fetch_optional(&mut *tx)
                    .await?;
            return match found {
                Some((name, hash, created_at))
                    if name == account.name && hash == key_hash && created_at == now =>
                {
                    Ok(None)
                }
                _ => Err(LedgerError::Corrupt(format!(
                    "account {}: the id is another account's",
                    account.id
                ))),
            };
        }
        sqlx::query(INSERT_ENTRY)
            .bind(account.id)
            .bind(None::<TicketId>)
            .bind(EntryKind::Opening.as_str())
            .bind(account.balance)
            .bind(account.points)
            .bind(account.balance)
            .bind(account.points)
            .bind(0_i64)
            .bind(now)
            .execute(&mut *tx)
            .await
            .or_constraint()?;
        commit_or_unknown(tx).await?;
        Ok(None)
    }

    /// One attempt of [`Store::create_order`] with an idempotency key.
    async fn try_create_order(
        &self,
        order: &Order,
        creation: &NewCreation<'_>,
    ) -> Result<Option<CreationRow>, LedgerError> {
        let now = Timestamp(order.created_at);
        let mut tx = self.begin_write().await?;
        if let Some(found) = Self::claim(&mut tx, creation, None, Some(order.id), now).await? {
            return Ok(Some(found));
        }
        let inserted: Option<OrderRow> = sqlx::query_as(INSERT_ORDER)
            .bind(order.id)
            .bind(order.account_id)
            .bind(order.amount.get())
            .bind(order.description.as_str())
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .or_constraint()?;
        if inserted.is_none() {
            // Our key was free, so no attempt of ours committed: the id is another's.
            return Err(LedgerError::Corrupt(format!(
                "order {}: the id is another order's",
                order.id
            )));
        }
        commit_or_unknown(tx).await?;
        Ok(None)
    }

    /// Claims `creation`'s key for what it announces (`account` or `order`): `None` once
    /// claimed, or the record that held the key already — written by a transaction that
    /// committed (on PostgreSQL one still open is waited for). A record reaped between
    /// the claim and the read is claimed again.
    async fn claim(
        tx: &mut sqlx::Transaction<'static, D>,
        creation: &NewCreation<'_>,
        account: Option<AccountId>,
        order: Option<OrderId>,
        now: Timestamp,
    ) -> Result<Option<CreationRow>, LedgerError> {
        for _ in 0..2 {
            let claimed: Option<Vec<u8>> = sqlx::query_scalar(CLAIM_CREATION)
                .bind(creation.key_hash.clone())
                .bind(creation.fingerprint)
                .bind(account)
                .bind(order)
                .bind(i32::from(creation.response.status))
                .bind(Json(&creation.response.body))
                .bind(creation.sealed_api_key.clone())
                .bind(now)
                .fetch_optional(&mut **tx)
                .await
                .or_constraint()?;
            if claimed.is_some() {
                return Ok(None);
            }
            let found: Option<CreationRow> = sqlx::query_as(CREATION)
                .bind(creation.key_hash.clone())
                .fetch_optional(&mut **tx)
                .await?;
            if found.is_some() {
                return Ok(found);
            }
        }
        Err(LedgerError::Corrupt(
            "a creation record came and went twice while it was claimed".to_owned(),
        ))
    }
}

/// An order read back after its insert found the id taken: ours, written by an earlier
/// attempt whose answer was lost, if it is the same order; else the id is another's.
fn recognise_order(order: &Order, found: Option<Order>) -> Result<(), LedgerError> {
    match found {
        Some(found)
            if found.account_id == order.account_id
                && found.amount == order.amount
                && found.description == order.description
                && found.created_at == order.created_at =>
        {
            Ok(())
        }
        _ => Err(LedgerError::Corrupt(format!(
            "order {}: the id is another order's",
            order.id
        ))),
    }
}
