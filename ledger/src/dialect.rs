//! What differs between the two databases: how a write transaction opens, the clock, the
//! statements that lock rows, and the reaper's statements — [`Dialect`], implemented for
//! PostgreSQL and SQLite. Everything else is one text for both (`$1`-style parameters
//! work in both).

use futures::future::BoxFuture;
use sqlx::{Database, Executor, IntoArguments};

use crate::batch::column;
use crate::events::{AnswerRow, RECORD_ANSWERS_AT_ONCE};
use crate::rows::{order_columns, ticket_columns};

/// A batch of answers being recorded in one statement: when done, each delivery recorded,
/// with its attempt.
pub(crate) type Recording<'e> = BoxFuture<'e, Result<Vec<(i64, i32)>, sqlx::Error>>;

/// What differs between the two databases.
/// Its arguments go into a query: said once here, where every generic statement needs it
/// (a bound on an associated type in the supertrait is implied wherever `D: Dialect` is).
pub(crate) trait Dialect: Database<Arguments: IntoArguments<Self>> {
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
    /// A hold, from its latest version, locked until the transaction ends — found only
    /// with the account it belongs to. Parameters: $1 hold, $2 its account.
    const LOCK_HOLD: &'static str;
    /// An account as the API shows it, `available` counted by the database's clock now.
    /// Parameter: $1 account.
    const READ_ACCOUNT: &'static str;
    /// Records up to $2 held holds past their expiry at $1 (the database's clock) as
    /// expired, earliest first; returns each with its account and amount.
    const EXPIRE_HOLDS: &'static str;
    /// One row when a held hold is past its expiry by the database's clock, none else: the
    /// sweeper's look before it takes a write transaction (one index probe of
    /// `holds_expiring` when nothing is due).
    const HOLDS_DUE: &'static str;
    /// The holds held: how many, and how many of them are past their expiry by the
    /// database's clock and not yet recorded expired (for the metrics).
    const HOLD_COUNTS: &'static str;
    /// The reaper's deletion of unused tickets (see `reap_statements!`). Parameters: $1
    /// cutoff, $2 batch.
    const DELETE_UNUSED: &'static str;
    /// The reaper's pruning of old outcomes (see `reap_statements!`). Parameters: $1
    /// cutoff, $2 now, $3 batch.
    const PRUNE_OUTCOMES: &'static str;
    /// The reaper's deletion of creation records (see `reap_statements!`). Parameters: $1
    /// cutoff, $2 batch.
    const DELETE_OLD_CREATIONS: &'static str;
    /// The reaper's deletion of webhook requests' records, as of creation records.
    const DELETE_OLD_REQUESTS: &'static str;
    /// Deletes up to $2 outbox jobs that finished before $1 (their attempts with them);
    /// returns their ids.
    const DELETE_FINISHED_JOBS: &'static str;
    /// Claims due payout jobs ([`claim_jobs`]): $1 the lease in microseconds, $2 worker, $3
    /// at most; returns the leases' end, and each one's id, payout, attempt and throttled
    /// claims.
    const CLAIM_JOBS: &'static str;
    /// Claims due webhook deliveries: $1 the lease in microseconds, $2 worker, $3 at most;
    /// returns the leases' end, and each one's id, event, endpoint and attempt.
    const CLAIM_DELIVERIES: &'static str;
    /// The row lock with which an outcome's transaction reads the subscriptions (`s`) it
    /// queues deliveries from (`events.rs`, `queue_deliveries`).
    ///
    /// Deleting an endpoint (or disabling it after a 410) removes its subscriptions, then
    /// ends its open deliveries. Read without a lock, a spend's transaction could queue a
    /// delivery from a subscription a delete removes right after, and commit after the
    /// delete had ended what it could see: a delivery to a deleted endpoint, open for its
    /// whole schedule. With the lock, a delete that comes later waits for the spend's
    /// commit and then ends what it queued (each statement of the delete reads anew); a
    /// delete that came first has removed the rows, which the locking read skips. `FOR KEY
    /// SHARE` is the weakest lock a delete conflicts with: spends of one account do not
    /// wait for one another. SQLite's single writer runs the two one after the other.
    const SUBSCRIPTIONS_LOCK: &'static str;
    /// A delivery's state and its endpoint's, for a retry by hand ([`delivery_state`]).
    const DELIVERY_STATE: &'static str;
    /// The look before a claim ([`first_free`]): $1 the kind; returns the clock and when
    /// the first job not in flight is due.
    const FIRST_FREE: &'static str;

    /// Records claimed deliveries' answers in one statement on `executor`, returning each
    /// delivery recorded with its attempt — where the database can say it in one
    /// ([`RECORD_ANSWERS_AT_ONCE`]: PostgreSQL). `None` where it cannot (SQLite, whose WITH
    /// holds no update): the caller records in a transaction of two statements.
    fn record_answers_at_once<'e, E>(
        _executor: E,
        _answers: &'e [AnswerRow<'e>],
    ) -> Option<Recording<'e>>
    where
        E: 'e + Executor<'e, Database = Self>,
    {
        None
    }
}

/// Delivery $1 of endpoint $2: when it was done and its lease, and when its endpoint was
/// disabled or deleted — the endpoint's row locked against a delete until the transaction
/// ends, so a delivery reopened by hand cannot outlive a delete that raced it (the delete
/// waits, then ends it; or came first, and the retry sees it).
macro_rules! delivery_state {
    ($lock:literal) => {
        concat!(
            "SELECT o.done_at, o.lease_until, ep.disabled_at, ep.deleted_at
             FROM outbox o JOIN webhook_endpoints ep ON ep.id = o.endpoint_id
             WHERE o.id = $1 AND o.endpoint_id = $2 AND o.kind = 'webhook' ",
            $lock
        )
    };
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
            // An outcome is its event too: kept while a delivery of it is (until the
            // deliveries' own retention lets them go).
            concat!(
                "UPDATE tickets SET response_body = NULL, pruned_at = $2
                 WHERE id IN (
                     SELECT id FROM tickets
                     WHERE pruned_at IS NULL AND expires_at < $1 AND completed_at IS NOT NULL
                       AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.event_id = tickets.id)
                     LIMIT $3 ",
                $lock,
                ")
                   AND pruned_at IS NULL AND expires_at < $1 AND completed_at IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.event_id = tickets.id)
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
            concat!(
                "DELETE FROM webhook_requests
                 WHERE key_hash IN (
                     SELECT key_hash FROM webhook_requests WHERE created_at < $1 LIMIT $2 ",
                $lock,
                ")
                   AND created_at < $1
                 RETURNING key_hash"
            ),
        )
    };
}

/// The reaper's deletion of finished outbox jobs (see `reap_statements!`), with the lock
/// its pick takes. A delivery sent again by hand meanwhile is open again: the outer WHERE
/// leaves it.
macro_rules! delete_finished_jobs {
    ($lock:literal) => {
        concat!(
            "DELETE FROM outbox
             WHERE id IN (
                 SELECT id FROM outbox WHERE done_at < $1 LIMIT $2 ",
            $lock,
            ")
               AND done_at < $1
             RETURNING id"
        )
    };
}

/// Claims up to $3 due jobs of one kind whose lease ran out (or never was) by the
/// database's clock (`$clock`, read once): leased to $2 for $1 microseconds (`$lease_until`
/// says how the dialect adds them), the attempt counted. Returns the leases' end, then what
/// `$returning` names. (Each dialect's `CLAIM_JOBS` and `CLAIM_DELIVERIES`, with its row
/// lock, and how the update finds the rows picked.) The clock is read in the statement, so
/// a claim needs no look before it for the time.
///
/// The pick is a materialized CTE, evaluated once. Written as `WHERE id IN (SELECT … LIMIT
/// $3 FOR UPDATE SKIP LOCKED)`, PostgreSQL may plan the subquery as the inner side of a
/// semi-join and run it again for each row — and each run, skipping what the last one
/// locked, picks other rows: a claim of 32 took 140 in one measured case, and a worker that
/// sends no more than it asked for leaves the rest leased until their leases end.
///
/// The update finds the rows picked by their key alone, on PostgreSQL as an array
/// (`id = ANY (ARRAY(…))`): the pick locked them, so nothing can have changed them, and a
/// condition on `done_at` there would let the planner reach them through the index of open
/// jobs instead. It did, once the statistics were taken with few jobs open — a database
/// with a long history of finished ones is not analysed again for a burst of new ones —
/// and it then walked every open job for each one picked: with 3,000 open, a claim took
/// 48 ms instead of 2.6, and deliveries ran at a third of their rate.
macro_rules! claim_jobs {
    ($kind:literal, $returning:literal, $clock:expr, $lease_until:literal, $lock:literal, $picked:literal) => {
        concat!(
            "WITH clock AS (SELECT ",
            $clock,
            " AS now),
             picked AS MATERIALIZED (
                 SELECT id FROM outbox
                 WHERE kind = '",
            $kind,
            "' AND done_at IS NULL AND due_at <= (SELECT now FROM clock)
                   AND (lease_until IS NULL OR lease_until <= (SELECT now FROM clock))
                 ORDER BY kind, due_at, id
                 LIMIT $3 ",
            $lock,
            ")
             UPDATE outbox SET attempts = attempts + 1, lease_until = ",
            $lease_until,
            ", leased_by = $2
             WHERE ",
            $picked,
            " RETURNING lease_until, ",
            $returning
        )
    };
}

/// The look before a claim of kind $1: the database's clock, and when the first job of the
/// kind in the claim's order whose lease ran out (or never was) is due — NULL when there
/// is none. Read before a claim, so idle workers never take the writer; a worker that
/// finds it in the future sleeps until then. It walks the claim's index from its head
/// past the jobs in flight only: a job whose lease runs out later (its worker died) is
/// found by a later look. One statement: the clock is read in it.
macro_rules! first_free {
    ($clock:expr) => {
        concat!(
            "WITH clock AS (SELECT ",
            $clock,
            " AS now)
             SELECT clock.now,
                    (SELECT due_at FROM outbox
                     WHERE kind = $1 AND done_at IS NULL
                       AND (lease_until IS NULL OR lease_until <= clock.now)
                     ORDER BY kind, due_at, id
                     LIMIT 1) AS first_due
             FROM clock"
        )
    };
}

/// The reaper's statements, in the order of [`Dialect`]'s constants.
type ReapStatements = (&'static str, &'static str, &'static str, &'static str);
const POSTGRES_REAP: ReapStatements = reap_statements!("FOR UPDATE SKIP LOCKED");
const SQLITE_REAP: ReapStatements = reap_statements!("");

/// PostgreSQL's clock. `clock_timestamp()`, not `now()`: `now()` is the transaction's
/// start, which may precede a wait for a row lock by seconds.
macro_rules! pg_clock {
    () => {
        "clock_timestamp()"
    };
}

/// SQLite's clock, in the microseconds since the epoch that [`Timestamp`](crate::db_types::Timestamp) stores there.
/// (The embedded mode is one process, so this is that process's clock; what matters is
/// that it is read inside the transaction, after the write lock was granted.)
macro_rules! sqlite_clock {
    () => {
        "CAST(unixepoch('now', 'subsec') * 1000000 AS INTEGER)"
    };
}

/// [`Dialect::READ_ACCOUNT`], with the dialect's clock.
macro_rules! read_account {
    ($clock:expr) => {
        concat!(
            "SELECT a.id, a.name, a.balance, a.points, a.created_at,
                    a.balance - CAST(coalesce((SELECT sum(h.amount) FROM holds h
                                               WHERE h.account_id = a.id AND h.state = 'held'
                                                 AND h.expires_at > ",
            $clock,
            "), 0) AS BIGINT) AS available
             FROM accounts a WHERE a.id = $1"
        )
    };
}

/// The columns of a hold, in `HoldRow`'s order (`holding.rs`).
macro_rules! hold_columns {
    () => {
        "id, account_id, ticket_id, amount, state, captured_amount, refunded_amount,
         fencing_token, expires_at, created_at, resolved_at, resolved_by_ticket"
    };
}
pub(crate) use hold_columns;

/// [`Dialect::EXPIRE_HOLDS`], with the lock the picking takes (`$lock`).
macro_rules! expire_holds {
    ($lock:literal) => {
        concat!(
            "UPDATE holds SET state = 'expired', resolved_at = $1
             WHERE id IN (SELECT id FROM holds
                          WHERE state = 'held' AND expires_at <= $1
                          ORDER BY expires_at LIMIT $2 ",
            $lock,
            ") AND state = 'held'
             RETURNING ",
            hold_columns!()
        )
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
    const LOCK_HOLD: &'static str = concat!(
        "SELECT ",
        hold_columns!(),
        " FROM holds WHERE id = $1 AND account_id = $2 FOR UPDATE"
    );
    // Sweepers on several instances take different holds; a hold a capture or a void
    // holds is skipped, and found resolved or still due on a later sweep.
    const EXPIRE_HOLDS: &'static str = expire_holds!("FOR UPDATE SKIP LOCKED");
    const HOLDS_DUE: &'static str = concat!(
        "SELECT 1 FROM holds WHERE state = 'held' AND expires_at <= ",
        pg_clock!(),
        " LIMIT 1"
    );
    const HOLD_COUNTS: &'static str = concat!(
        "SELECT CAST(COUNT(*) AS BIGINT),
                CAST(COALESCE(SUM(CASE WHEN expires_at <= ",
        pg_clock!(),
        " THEN 1 ELSE 0 END), 0) AS BIGINT)
         FROM holds WHERE state = 'held'"
    );
    const READ_ACCOUNT: &'static str = read_account!(pg_clock!());
    const DELETE_UNUSED: &'static str = POSTGRES_REAP.0;
    const PRUNE_OUTCOMES: &'static str = POSTGRES_REAP.1;
    const DELETE_OLD_CREATIONS: &'static str = POSTGRES_REAP.2;
    const DELETE_OLD_REQUESTS: &'static str = POSTGRES_REAP.3;
    // The attempts go with their deliveries in the same statement: no foreign key
    // cascades to them (migration 0018).
    const DELETE_FINISHED_JOBS: &'static str = concat!(
        "WITH gone AS (",
        delete_finished_jobs!("FOR UPDATE SKIP LOCKED"),
        "), attempts AS (
             DELETE FROM webhook_attempts WHERE job_id IN (SELECT id FROM gone)
         )
         SELECT id FROM gone"
    );
    // Instances claim different jobs: a job another claim holds is skipped, not waited for.
    const CLAIM_JOBS: &'static str = claim_jobs!(
        "payout",
        "id, payout_id, attempts, throttled, last_error",
        pg_clock!(),
        "(SELECT now FROM clock) + $1 * interval '1 microsecond'",
        "FOR UPDATE SKIP LOCKED",
        "id = ANY (ARRAY(SELECT id FROM picked))"
    );
    const CLAIM_DELIVERIES: &'static str = claim_jobs!(
        "webhook",
        "id, event_id, event_type, endpoint_id, attempts",
        pg_clock!(),
        "(SELECT now FROM clock) + $1 * interval '1 microsecond'",
        "FOR UPDATE SKIP LOCKED",
        "id = ANY (ARRAY(SELECT id FROM picked))"
    );
    const SUBSCRIPTIONS_LOCK: &'static str = "FOR KEY SHARE OF s";
    // A delete sets `deleted_at`, an update that `FOR SHARE` conflicts with.
    const DELIVERY_STATE: &'static str = delivery_state!("FOR SHARE OF ep");
    const FIRST_FREE: &'static str = first_free!(pg_clock!());

    fn record_answers_at_once<'e, E>(
        executor: E,
        answers: &'e [AnswerRow<'e>],
    ) -> Option<Recording<'e>>
    where
        E: 'e + Executor<'e, Database = Self>,
    {
        // `column` takes the items by reference, as a batch holds them.
        let answers: Vec<&'e AnswerRow<'e>> = answers.iter().collect();
        let query = sqlx::query_as(RECORD_ANSWERS_AT_ONCE)
            .bind(column(&answers, |a| a.job_id))
            .bind(column(&answers, |a| a.attempt))
            .bind(column(&answers, |a| a.outcome))
            .bind(column(&answers, |a| {
                a.retry_after
                    .map(|after| i64::try_from(after.as_micros()).unwrap_or(i64::MAX))
            }))
            .bind(column(&answers, |a| a.error))
            .bind(column(&answers, |a| a.duration_ms))
            .bind(column(&answers, |a| a.status))
            .bind(column(&answers, |a| a.body));
        Some(Box::pin(query.fetch_all(executor)))
    }
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
    const LOCK_HOLD: &'static str = concat!(
        "SELECT ",
        hold_columns!(),
        " FROM holds WHERE id = $1 AND account_id = $2"
    );
    const EXPIRE_HOLDS: &'static str = expire_holds!("");
    const HOLDS_DUE: &'static str = concat!(
        "SELECT 1 FROM holds WHERE state = 'held' AND expires_at <= ",
        sqlite_clock!(),
        " LIMIT 1"
    );
    const HOLD_COUNTS: &'static str = concat!(
        "SELECT CAST(COUNT(*) AS BIGINT),
                CAST(COALESCE(SUM(CASE WHEN expires_at <= ",
        sqlite_clock!(),
        " THEN 1 ELSE 0 END), 0) AS BIGINT)
         FROM holds WHERE state = 'held'"
    );
    const READ_ACCOUNT: &'static str = read_account!(sqlite_clock!());
    const DELETE_UNUSED: &'static str = SQLITE_REAP.0;
    const PRUNE_OUTCOMES: &'static str = SQLITE_REAP.1;
    const DELETE_OLD_CREATIONS: &'static str = SQLITE_REAP.2;
    const DELETE_OLD_REQUESTS: &'static str = SQLITE_REAP.3;
    // The attempts go with their deliveries by the foreign key's cascade.
    const DELETE_FINISHED_JOBS: &'static str = delete_finished_jobs!("");
    // One writer: claims never overlap.
    const CLAIM_JOBS: &'static str = claim_jobs!(
        "payout",
        "id, payout_id, attempts, throttled, last_error",
        sqlite_clock!(),
        "(SELECT now FROM clock) + $1",
        "",
        "id IN (SELECT id FROM picked)"
    );
    const CLAIM_DELIVERIES: &'static str = claim_jobs!(
        "webhook",
        "id, event_id, event_type, endpoint_id, attempts",
        sqlite_clock!(),
        "(SELECT now FROM clock) + $1",
        "",
        "id IN (SELECT id FROM picked)"
    );
    const SUBSCRIPTIONS_LOCK: &'static str = "";
    const DELIVERY_STATE: &'static str = delivery_state!("");
    const FIRST_FREE: &'static str = first_free!(sqlite_clock!());
}

/// `… IN ($first, …)` for `count` parameters.
pub(crate) fn placeholders(first: usize, count: usize) -> String {
    (first..first + count)
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `VALUES ($first, …), (…)`'s rows: `count` rows of `width` parameters each, numbered on
/// from `first`. (Both databases name the columns of such a list `column1`, `column2`, ….)
pub(crate) fn value_rows(first: usize, count: usize, width: usize) -> String {
    (0..count)
        .map(|row| format!("({})", placeholders(first + row * width, width)))
        .collect::<Vec<_>>()
        .join(", ")
}
