//! Group commit on PostgreSQL: spends that arrive together are applied together, in one
//! statement ([`APPLY_SPENDS`]) — one round trip and one commit for the lot — each keeping
//! its own outcome.
//!
//! [`Batcher`] keeps a few workers, each with a queue of its own; a spend queues for the
//! worker its account belongs to (by the account id's bits), so an account's spends are
//! only ever in one batch at a time and go in order, and two batches never wait for each
//! other's account rows. A worker takes whatever its queue holds, up to `max` spends, and
//! sends it in its turn ([`Turn`]: the workers take turns, so that each batch takes all
//! that queued while the last was out); spends arriving meanwhile wait for its next batch.
//! Nobody waits for more spends to come: under light load a batch is one spend sent at
//! once, and batches grow only while a batch is out, so a spend waits at most for the batch
//! ahead of it — and never long for one that is stuck. A batch may hold several spends of
//! one account — the statement applies them in fencing-token order, each on the balance
//! the one before it left — but one spend per ticket, and one per account and token;
//! another waits for the worker's next batch. [`Batches`] counts the sizes sent.
//!
//! A spend the statement did not write (a used, unknown or expired ticket, a refusal, a
//! stale token) comes back with its ticket and its account's token as found; `apply.rs`
//! answers from those or settles it on the transaction path. Nothing here judges a ticket.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::TryStreamExt;
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{FromRow, PgPool, Row};
use tokio::sync::{mpsc, oneshot};

use crate::bells::{Bells, JobKind};
use crate::error::{LedgerError, is_dead_connection};
use crate::model::{AccountId, TicketId};
use crate::rows::TicketRow;
use crate::stand_ins::{BALANCE_STAND_IN, POINTS_STAND_IN, filled};

/// The last common table expressions of a batch's statement: the events its written items
/// announce queued for delivery, as on the transaction path. It reads `written` (each
/// item's `ticket_id`, `account_id` and `event_type`: NULL for none) and `judged`
/// (`read_at`), and gives `deliveries_queued`.
macro_rules! queue_written_events {
    () => {
        "announced AS (
        -- An outcome's event is its ticket (its id, its stored outcome): no row of its own.
        SELECT w.ticket_id AS id, w.account_id, w.event_type AS type
        FROM written AS w WHERE w.event_type IS NOT NULL
    ), subscribed AS (
        -- Locked against a delete of the endpoint, as the transaction path's queue is
        -- (dialect.rs, `SUBSCRIPTIONS_LOCK`): a delete waits for this commit, then ends
        -- what it queued.
        SELECT s.account_id, s.event_type, s.endpoint_id FROM webhook_subscriptions AS s
        WHERE s.account_id IN (SELECT e.account_id FROM announced AS e)
        FOR KEY SHARE
    ), deliveries_queued AS (
        INSERT INTO outbox (kind, event_id, endpoint_id, event_type, due_at, created_at)
        SELECT 'webhook', e.id, s.endpoint_id, e.type, j.read_at, j.read_at
        FROM announced AS e
             JOIN subscribed AS s
                  ON s.account_id = e.account_id AND s.event_type IN (e.type, '*')
             CROSS JOIN judged AS j
        RETURNING 1
    )"
    };
}
pub(crate) use queue_written_events;

/// A batch of spends, as parallel arrays, in one statement (one implicit transaction). For
/// every spend it does what the ledger's transaction does on its usual path: judges the
/// locked ticket by the database's clock, moves money and points under the fencing check
/// (a token newer than the account's), writes the entry, and stores the outcome under the
/// ticket. It writes only spends that go through; the others come back with their tickets
/// as found, so a refusal never rolls back a neighbour.
///
/// - **Locks, in one order.** Every writer of the ledger locks tickets before accounts,
///   each in id order (the transaction path locks one ticket, then one account), so
///   batches never deadlock with each other or with it. `judged` reads the clock only
///   once both lock scans are done (its counts need every row), and the moves need that
///   reading — so every lock is held before any spend is judged.
/// - **Only what it may write is locked**: tickets not used yet, and their accounts. A
///   used ticket is read, not locked, so a replay writes nothing and its commit waits for
///   no flush. A ticket another transaction uses while the statement waits for it drops
///   out of the lock scan; it comes back as the snapshot saw it (unused), not written,
///   and the transaction path judges it again. The accounts are named by an array of ids
///   (`= ANY (ARRAY (…))`) and sorted before they are locked. On a table of more than a
///   couple of thousand accounts the planner finds them by their primary key; on a
///   smaller one it scans the table (a few pages) once per batch, and a lookup by key,
///   one account at a time, measured no faster overall: about 5 % less time a spend on a
///   thousand accounts, about 7 % more on ten (docs/benchmarks.md, "Tried and not kept").
/// - **Several spends of one account** go in fencing-token order, each judged on the
///   balance and points the ones before it left (`usable`: running sums over the account's
///   spends whose ticket is usable and whose token is newer than the account's). Of
///   those, the ones before the first the account cannot afford are written (`affordable`);
///   that one and the ones after it are not, and settle on the transaction path, which
///   stores the refusal. The account is updated once, to what its last written spend left
///   and that spend's token; each entry carries the balance and points after its own spend.
///   A debit must leave at least the account's `held` (what its holds set aside, those
///   past their expiry and not yet swept included); where only the holds not expired
///   would allow it, the transaction path counts them and writes it.
///   The batcher sends one spend per ticket and per account and token; `judged` checks it
///   again and, were it not so, nothing is written (every spend then settles on the
///   transaction path).
/// - **Latest versions.** Accounts are read where they are locked (`FOR NO KEY UPDATE`
///   returns the latest committed version of a row another transaction changed since the
///   snapshot, READ COMMITTED), and the update checks that they are still so.
/// - **The body.** It arrives rendered with stand-in numbers where the balance and points
///   after go (see [`substitutable`](crate::stand_ins::substitutable)), replaced by the spend's own. A written spend's
///   body is not sent back: the client fills in its copy the same way ([`filled`]), from
///   the balance and points the statement returns — a third of the batch's answer less to
///   format, send and parse.
///
/// Parameters: $1 tickets, $2 accounts, $3 kinds, $4 debits, $5 credits, $6 points spent,
/// $7 fencing tokens, $8 fingerprints, $9 bodies, $10 and $11 the balance's and points'
/// stand-ins, $12 the statuses the spends are stored with if written, $13 the event each
/// announces if written (NULL: none; its `data` is built here as
/// [`outcome_data`](crate::webhooks::outcome_data) builds it, and it is queued for the
/// account's endpoints that want it, as on the transaction path). Returns, in the
/// order given, whether the spend was written; if it was, the balance and points after it
/// (`balance_after`, `points_after`); if not, its ticket's columns as found (NULL when
/// there is no such ticket); `read_at`; and the fencing token its account had recorded
/// when locked (`recorded_token`; NULL when the account was not locked: no such account,
/// or no unused ticket to spend on it).
const APPLY_SPENDS: &str = concat!(
    "
    WITH spends AS (
        SELECT *
        FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::bigint[],
                    $6::bigint[], $7::bigint[], $8::text[], $9::text[], $12::integer[],
                    $13::text[])
             WITH ORDINALITY AS s (ticket_id, account_id, kind, debit, credit, spent, token,
                                   fingerprint, body, status, event_type, slot)
    ), locked_tickets AS (
        SELECT t.id, t.account_id, t.expires_at FROM tickets AS t
        WHERE t.id = ANY ($1::uuid[]) AND t.completed_at IS NULL
        ORDER BY t.id FOR UPDATE
    ), locked_accounts AS (
        SELECT a.id, a.balance, a.points, a.fencing_token, a.held FROM accounts AS a
        WHERE a.id = ANY (ARRAY (SELECT s.account_id FROM spends AS s
                                 JOIN locked_tickets AS t ON t.id = s.ticket_id))
        ORDER BY a.id FOR NO KEY UPDATE
    ), judged AS (
        SELECT clock_timestamp() AS read_at,
               (SELECT count(DISTINCT ticket_id) = count(*)
                       AND count(DISTINCT (account_id, token)) = count(*) FROM spends)
                   AS distinct_spends
        FROM (SELECT count(*) FROM locked_tickets) AS tickets_locked,
             (SELECT count(*) FROM locked_accounts) AS accounts_locked
    ), usable AS (
        SELECT s.slot, s.account_id, s.token, s.debit, s.credit, s.spent,
               a.balance AS balance_found, a.points AS points_found,
               a.fencing_token AS token_found, a.held,
               a.balance + coalesce(sum(s.credit - s.debit) OVER earlier, 0) AS balance_before,
               a.points - coalesce(sum(s.spent) OVER earlier, 0) AS points_before
        FROM spends AS s
             JOIN locked_tickets AS t ON t.id = s.ticket_id
             JOIN locked_accounts AS a ON a.id = s.account_id
             CROSS JOIN judged AS j
        WHERE j.distinct_spends AND t.account_id = s.account_id AND t.expires_at > j.read_at
          AND s.token > a.fencing_token
        WINDOW earlier AS (PARTITION BY s.account_id ORDER BY s.token
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
    ), affordable AS (
        SELECT u.slot, u.account_id, u.token, u.balance_found, u.points_found, u.token_found,
               (u.balance_before - u.debit + u.credit)::bigint AS balance_after,
               (u.points_before - u.spent)::bigint AS points_after
        FROM (SELECT u.*,
                     bool_and(u.balance_before >= u.debit AND u.points_before >= u.spent
                              AND (u.debit = 0 OR u.balance_before - u.debit >= u.held)
                              AND u.balance_before - u.debit + u.credit
                                  <= 9223372036854775807)
                         OVER (PARTITION BY u.account_id ORDER BY u.token
                               ROWS UNBOUNDED PRECEDING) AS so_far
              FROM usable AS u) AS u
        WHERE u.so_far
    ), moved AS (
        UPDATE accounts AS a
        SET balance = last.balance_after, points = last.points_after,
            fencing_token = last.token
        FROM (SELECT DISTINCT ON (f.account_id) f.*
              FROM affordable AS f ORDER BY f.account_id, f.token DESC) AS last
        WHERE a.id = last.account_id AND a.balance = last.balance_found
          AND a.points = last.points_found AND a.fencing_token = last.token_found
        RETURNING a.id
    ), written AS (
        SELECT s.*, f.balance_after, f.points_after,
               replace(replace(s.body, $10, f.balance_after::text),
                       $11, f.points_after::text) AS body_after
        FROM affordable AS f JOIN moved AS m ON m.id = f.account_id JOIN spends AS s USING (slot)
    ), entries_written AS (
        INSERT INTO entries (account_id, ticket_id, kind, amount, points, balance_after,
                             points_after, fencing_token, created_at)
        SELECT w.account_id, w.ticket_id, w.kind, w.credit - w.debit, -w.spent, w.balance_after,
               w.points_after, w.token, j.read_at
        FROM written AS w CROSS JOIN judged AS j
        ORDER BY w.account_id, w.token
    ), completed AS (
        UPDATE tickets AS t
        SET operation = w.kind, fingerprint = w.fingerprint, response_status = w.status,
            response_body = w.body_after::json, completed_at = j.read_at
        FROM written AS w CROSS JOIN judged AS j
        WHERE t.id = w.ticket_id
        RETURNING t.id, w.balance_after, w.points_after
    ), ",
    queue_written_events!(),
    "
    SELECT c.id IS NOT NULL AS applied, c.balance_after, c.points_after,
           f.id, f.account_id, f.created_at, f.expires_at, f.operation, f.fingerprint,
           f.response_status, f.response_body, f.completed_at,
           j.read_at,
           la.fencing_token AS recorded_token,
           -- Computed once for the batch: whether to ring the webhook workers.
           EXISTS (SELECT FROM deliveries_queued) AS queued_deliveries
    FROM spends AS s
         LEFT JOIN completed AS c ON c.id = s.ticket_id
         -- Only a spend not written reads its ticket again, as the snapshot saw it.
         LEFT JOIN LATERAL (SELECT f.* FROM tickets AS f
                            WHERE f.id = s.ticket_id AND f.account_id = s.account_id
                              AND c.id IS NULL OFFSET 0) AS f ON true
         LEFT JOIN locked_accounts AS la ON la.id = s.account_id
         CROSS JOIN judged AS j
    ORDER BY s.slot"
);

/// What an item of a batch — a spend, a hold's step — stores under its ticket when its
/// statement writes it (built by [`stored_in_batch`](crate::apply::stored_in_batch)).
#[derive(Debug)]
pub(crate) struct Stored {
    pub ticket_id: TicketId,
    pub account_id: AccountId,
    /// The operation's kind, as tickets store it.
    pub kind: &'static str,
    pub fingerprint: String,
    /// The success body, with the stand-ins (see
    /// [`substitutable`](crate::stand_ins::substitutable)).
    pub body: String,
    /// The status the success is stored with.
    pub status: u16,
    /// The event the success announces, if any.
    pub event: Option<&'static str>,
}

/// One spend as [`APPLY_SPENDS`] takes it.
#[derive(Debug)]
pub(crate) struct Spend {
    pub stored: Stored,
    pub debit: i64,
    pub credit: i64,
    pub points: i64,
    pub token: i64,
}

/// What [`APPLY_SPENDS`] did with one spend.
pub(crate) struct Done {
    /// The body stored with the spend, if the statement wrote it.
    pub written: Option<Value>,
    /// If it did not, the ticket's row as found; `None` if there is no such ticket.
    pub ticket: Option<TicketRow>,
    /// The fencing token the account had recorded before the batch: at or above the
    /// spend's, it is stale — the account's token only grows, so no path would take it.
    pub recorded_token: Option<i64>,
}

/// How a batch failed; every spend of it gets the same answer.
#[derive(Clone, Debug)]
pub(crate) enum Failed {
    /// The database refused the statement: nothing of the batch was written, and each
    /// spend is better settled on its own.
    Refused,
    /// Nothing was sent: no connection could be had, or the ledger is shutting down.
    Unavailable,
    /// It may have run: it was sent and no readable answer came back — none at all, a
    /// session the server ended (which it can do after the commit), or rows that could
    /// not be read (the error's text). Like a lost COMMIT answer on the transaction path,
    /// never "nothing was executed".
    Unknown(String),
}

impl Failed {
    /// The ledger's error for one spend of the batch; `None` for [`Failed::Refused`].
    pub(crate) fn error(self) -> Option<LedgerError> {
        match self {
            Self::Refused => None,
            Self::Unavailable => Some(LedgerError::Unavailable(sqlx::Error::PoolTimedOut)),
            Self::Unknown(error) => Some(LedgerError::OutcomeUnknown(sqlx::Error::Protocol(error))),
        }
    }
}

/// An item a batcher sends: one of the many a statement applies at once — a spend here, a
/// hold's step in `hold_batch.rs`. The statement gives one row per item, in the order
/// given, with the columns [`done`] reads.
pub(crate) trait Batched: Sized + Send + Sync + 'static {
    /// The account it is of: an account's items always go to the same worker.
    fn account(&self) -> AccountId;

    /// The ticket it spends.
    fn ticket(&self) -> TicketId;

    /// The fencing token it carries: its place among the account's items of a batch (the
    /// statement applies them in this order), and what its write records.
    fn token(&self) -> i64;

    /// What no two items of one batch may share; an item sharing one waits for the next.
    fn claims(&self) -> impl Iterator<Item = Claim>;

    /// Sends `batch` once on `connection`, its statement bound to its columns, and reads the
    /// answer ([`read_answer`]).
    fn execute(
        batch: &[&Self],
        connection: &mut sqlx::PgConnection,
    ) -> impl Future<Output = (Vec<PgRow>, Option<sqlx::Error>)> + Send;

    /// The body the statement stored for the item, written, as `row` says it.
    fn written_body(&self, row: &PgRow) -> Result<String, sqlx::Error>;

    /// Of `items`, which an earlier try of their batch wrote: their tickets, with the
    /// outcome each stores.
    fn earlier_writes(
        connection: &mut sqlx::PgConnection,
        items: &[&Self],
    ) -> impl Future<Output = Result<Vec<EarlierWrite>, sqlx::Error>> + Send;
}

/// An item an earlier try of its batch wrote: its ticket, and the outcome the ticket stores.
pub(crate) type EarlierWrite = (TicketId, Option<Json<Value>>);

/// A thing an item of a batch uses that no other item of the batch may use too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Claim {
    Ticket(TicketId),
    /// An account's fencing token: one write per grant.
    Grant(AccountId, i64),
    /// The whole account (a hold's step: one per account and batch).
    Account(AccountId),
    Hold(uuid::Uuid),
}

struct Queued<T: Batched> {
    item: T,
    answer: oneshot::Sender<Result<Done, Failed>>,
    /// The span the item was sent from, which the batch's span links to.
    span: tracing::Span,
}

/// The group commit's workers and their queues (see the module docs).
#[derive(Debug)]
pub(crate) struct Batcher<T: Batched = Spend> {
    /// One queue per worker; an account's items always go to the same one.
    queues: Vec<mpsc::Sender<Queued<T>>>,
    sizes: Arc<Batches>,
}

/// How many batches of each size were sent: `by_size[n]` is the count of batches of `n`
/// spends.
#[derive(Debug)]
pub struct Batches {
    by_size: Vec<AtomicU64>,
}

impl Batches {
    /// Counts for batches of up to `max` items.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            by_size: (0..=max).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// `(size, batches of that size)` for every size sent at least once.
    pub fn counts(&self) -> Vec<(usize, u64)> {
        self.by_size
            .iter()
            .enumerate()
            .map(|(size, count)| (size, count.load(Ordering::Relaxed)))
            .filter(|&(_, count)| count > 0)
            .collect()
    }
}

/// How many spends one worker sends at most, and how many workers there are.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub max: usize,
    pub workers: usize,
    /// How often a batch is sent again after its connection failed (see [`send`]).
    pub tries: u32,
}

/// How long a worker waits for a batch out before it sends beside it: several times what
/// a batch takes on a busy database (1–3 ms here), so that only a batch that is stuck —
/// waiting for a row another transaction holds, say — lets another go out beside it.
const TURN_PATIENCE: Duration = Duration::from_millis(10);

/// The workers of one batcher take turns: a batch goes out while no other is out, so each
/// batch takes everything that queued meanwhile. Two batches out at once on a database
/// that is busy cost more than one batch of both: each statement has a fixed price
/// (PostgreSQL sets up its plan — some ninety nodes — checks, indexes and triggers, and
/// commits) that a larger batch shares among more spends. In `http_bench`, two workers
/// sending as they pleased made batches of 6 on average where one worker made 11, and
/// took more of PostgreSQL's CPU per spend. A worker does not wait for its turn when its
/// batch is full (the database then has more to do than one batch at a time can carry),
/// nor for a batch that has been out longer than [`TURN_PATIENCE`] (one that is stuck —
/// waiting on a row another transaction holds — holds back no other worker's accounts for
/// longer than that).
#[derive(Debug)]
struct Turn {
    out: tokio::sync::Semaphore,
    started: tokio::time::Instant,
    /// When the batch holding the turn went out, in microseconds since `started`.
    out_since: AtomicU64,
}

impl Turn {
    fn new() -> Self {
        Self {
            out: tokio::sync::Semaphore::new(1),
            started: tokio::time::Instant::now(),
            out_since: AtomicU64::new(0),
        }
    }

    /// Waits until this worker may send what `waiting` holds, adding to it what arrives on
    /// `queue` meanwhile (up to `max`). The permit, when there is one, is held while the
    /// batch is out; `None` is a batch sent beside another (full, or out of patience with
    /// it: once a batch has been out for longer than [`TURN_PATIENCE`], no one waits for it).
    async fn wait<'turn, T: Batched>(
        &'turn self,
        queue: &mut mpsc::Receiver<Queued<T>>,
        waiting: &mut Vec<Queued<T>>,
        max: usize,
    ) -> Option<tokio::sync::SemaphorePermit<'turn>> {
        if let Ok(permit) = self.out.try_acquire() {
            return Some(self.taken(permit));
        }
        let out_since = Duration::from_micros(self.out_since.load(Ordering::Relaxed));
        let out_of_patience = tokio::time::sleep_until(self.started + out_since + TURN_PATIENCE);
        tokio::pin!(out_of_patience);
        while waiting.len() < max {
            tokio::select! {
                permit = self.out.acquire() => return permit.ok().map(|permit| self.taken(permit)),
                () = &mut out_of_patience => return None,
                arrived = queue.recv() => match arrived {
                    Some(queued) => waiting.push(queued),
                    // The batcher is gone: what waits goes now.
                    None => return None,
                },
            }
        }
        None
    }

    fn taken<'turn>(
        &'turn self,
        permit: tokio::sync::SemaphorePermit<'turn>,
    ) -> tokio::sync::SemaphorePermit<'turn> {
        let since = self.started.elapsed().as_micros();
        self.out_since
            .store(u64::try_from(since).unwrap_or(u64::MAX), Ordering::Relaxed);
        permit
    }
}

impl<T: Batched> Batcher<T> {
    /// Starts the workers on the current runtime, counting the sizes they send in `sizes`
    /// (made for batches of at least `shape.max`). They stop when the batcher is dropped.
    pub(crate) fn start(
        pool: PgPool,
        bells: Arc<Bells>,
        shape: Shape,
        sizes: Arc<Batches>,
    ) -> Self {
        let max = shape.max.max(1);
        assert!(sizes.by_size.len() > max, "batch sizes counted up to {max}");
        let turn = Arc::new(Turn::new());
        let queues = (0..shape.workers.max(1))
            .map(|_| {
                let (queue, receiver) = mpsc::channel::<Queued<T>>(max * 4);
                tokio::spawn(work(
                    receiver,
                    pool.clone(),
                    Arc::clone(&bells),
                    Arc::clone(&sizes),
                    Arc::clone(&turn),
                    max,
                    shape.tries,
                ));
                queue
            })
            .collect();
        Self { queues, sizes }
    }

    /// Applies `item` in its worker's next batch.
    pub(crate) async fn apply(&self, item: T) -> Result<Done, Failed> {
        let (answer, answered) = oneshot::channel();
        // The account id's low bits pick the worker: an account always has the same one.
        let worker = (item.account().0.as_u64_pair().1 % self.queues.len() as u64) as usize;
        self.queues[worker]
            .send(Queued {
                item,
                answer,
                span: tracing::Span::current(),
            })
            .await
            .map_err(|_| Failed::Unavailable)?;
        // A worker that went away holding the spend may have sent it.
        answered.await.map_err(|_| {
            Failed::Unknown("the ledger shut down while the item was in a batch".into())
        })?
    }

    /// The sizes of the batches sent so far.
    pub(crate) fn sizes(&self) -> &Batches {
        &self.sizes
    }
}

/// One worker: sends what its queue holds, a batch at a time in its turn, until the
/// batcher is gone.
async fn work<T: Batched>(
    mut queue: mpsc::Receiver<Queued<T>>,
    pool: PgPool,
    bells: Arc<Bells>,
    sizes: Arc<Batches>,
    turn: Arc<Turn>,
    max: usize,
    tries: u32,
) {
    // Spends that could not go in the last batch (their ticket, or their account and
    // token, was in it already): they go first in the next.
    let mut waiting: Vec<Queued<T>> = Vec::with_capacity(max);
    loop {
        if waiting.is_empty() && queue.recv_many(&mut waiting, max).await == 0 {
            return; // the batcher is gone
        }
        let permit = turn.wait(&mut queue, &mut waiting, max).await;
        // Topped up with what is queued, never waiting.
        while waiting.len() < max {
            match queue.try_recv() {
                Ok(queued) => waiting.push(queued),
                Err(_) => break,
            }
        }
        let batch = take_batch(&mut waiting);
        sizes.by_size[batch.len()].fetch_add(1, Ordering::Relaxed);
        run(&pool, &bells, batch, tries).await;
        drop(permit);
    }
}

/// Takes out of `waiting` a batch of items that share no [`Claim`] — for spends, at most
/// one per ticket and per account and fencing token — in account and token order
/// (the order the statement applies an account's spends in, and the order a second spend
/// of a ticket waits in).
fn take_batch<T: Batched>(waiting: &mut Vec<Queued<T>>) -> Vec<Queued<T>> {
    waiting.sort_by_key(|queued| (queued.item.account().0, queued.item.token()));
    let mut claimed = HashSet::new();
    let (batch, rest) = std::mem::take(waiting).into_iter().partition(|queued| {
        // Every claim is recorded, taken or not (`&`, not `&&`): an item left for the next
        // batch keeps the ones after it that share its ticket waiting too, in order.
        queued
            .item
            .claims()
            .fold(true, |free, claim| claimed.insert(claim) & free)
    });
    *waiting = rest;
    batch
}

/// Sends one batch, hands each spend its answer, and rings the webhook workers when the
/// batch queued deliveries.
async fn run<T: Batched>(pool: &PgPool, bells: &Bells, batch: Vec<Queued<T>>, tries: u32) {
    use tracing::Instrument;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    // One statement for many spends of many requests: its span is a root of its own,
    // linked to each request's (a span has one parent, a batch many origins).
    let span = tracing::info_span!(parent: None, "ledger.batch", batch.size = batch.len());
    for queued in &batch {
        use opentelemetry::trace::TraceContextExt;
        let origin = queued.span.context();
        span.add_link(origin.span().span_context().clone());
    }
    let items: Vec<&T> = batch.iter().map(|queued| &queued.item).collect();
    let sent = send(pool, &items, tries).instrument(span).await;
    drop(items);
    match sent {
        Ok((done, queued_deliveries)) => {
            if queued_deliveries {
                bells.ring(JobKind::Webhook);
            }
            for (queued, done) in batch.into_iter().zip(done) {
                let _ = queued.answer.send(Ok(done));
            }
        }
        Err(failed) => {
            for queued in batch {
                let _ = queued.answer.send(Err(failed.clone()));
            }
        }
    }
}

/// Sends [`APPLY_SPENDS`] for `batch`. When the connection fails, the batch is sent again on
/// another, up to `tries` times in all: necessary, since a database restart leaves every
/// pooled connection dead, and safe, since a spend that did commit finds its ticket used
/// the second time. Such a spend is told apart from a replay by its entry: the one
/// written under its own fencing token (a grant's token is the account's only once) was
/// written by an earlier try of this batch, so it is answered as written, never as
/// replayed ([`own_earlier_writes`]). Only when no try got an answer after one may have
/// run is the outcome unknown.
///
/// A failed try may have run unless the server answered with a plain error: a broken
/// connection, and also a session the server ended (FATAL) — PostgreSQL ends sessions
/// after their commit too (a backend terminated while it waits for synchronous
/// replication, a fast shutdown between the commit and ReadyForQuery), and a FATAL that
/// was waiting on an idle pooled connection looks no different.
async fn send<T: Batched>(
    pool: &PgPool,
    batch: &[&T],
    tries: u32,
) -> Result<(Vec<Done>, bool), Failed> {
    let mut maybe_sent: Option<sqlx::Error> = None;
    for _ in 0..tries.max(1) {
        let mut connection = match pool.acquire().await {
            Ok(connection) => connection,
            // Nothing was sent this time: no connection could be had.
            Err(_) => {
                return Err(match maybe_sent {
                    Some(sent) => Failed::Unknown(sent.to_string()),
                    None => Failed::Unavailable,
                });
            }
        };
        let (rows, ended) = T::execute(batch, &mut connection).await;
        match ended {
            None => {
                return answered(&mut connection, batch, &rows, maybe_sent.is_some()).await;
            }
            // The server ended the session before the statement gave a single row (it
            // gives one per spend before it commits, and the server sends what it has in
            // order before it says FATAL): the statement never finished, so its implicit
            // transaction rolled back — a pooled connection the server had ended while it
            // sat idle, as after a restart.
            Some(error @ sqlx::Error::Database(_))
                if is_dead_connection(&error) && rows.is_empty() =>
            {
                tracing::debug!(%error, "a batch's session had been ended; sending it again");
            }
            // The connection broke, or the session was ended after rows came: it may have
            // run, and committed.
            Some(error) if is_dead_connection(&error) => {
                tracing::debug!(%error, "a batch's connection failed; sending it again");
                maybe_sent = Some(error);
            }
            // The server answered with an error: the statement, and so the batch, rolled
            // back.
            Some(error) => {
                tracing::warn!(%error, items = batch.len(), "a batch was refused; settling its items one by one");
                return Err(Failed::Refused);
            }
        }
    }
    Err(match maybe_sent {
        Some(sent) => Failed::Unknown(sent.to_string()),
        None => Failed::Unavailable,
    })
}

impl Batched for Spend {
    fn account(&self) -> AccountId {
        self.stored.account_id
    }

    fn ticket(&self) -> TicketId {
        self.stored.ticket_id
    }

    fn token(&self) -> i64 {
        self.token
    }

    fn claims(&self) -> impl Iterator<Item = Claim> {
        [
            Claim::Grant(self.stored.account_id, self.token),
            Claim::Ticket(self.stored.ticket_id),
        ]
        .into_iter()
    }

    async fn execute(
        batch: &[&Self],
        connection: &mut sqlx::PgConnection,
    ) -> (Vec<PgRow>, Option<sqlx::Error>) {
        let query = sqlx::query(APPLY_SPENDS)
            .bind(column(batch, |spend| spend.stored.ticket_id.0))
            .bind(column(batch, |spend| spend.stored.account_id.0))
            .bind(column(batch, |spend| spend.stored.kind))
            .bind(column(batch, |spend| spend.debit))
            .bind(column(batch, |spend| spend.credit))
            .bind(column(batch, |spend| spend.points))
            .bind(column(batch, |spend| spend.token))
            .bind(column(batch, |spend| spend.stored.fingerprint.as_str()))
            .bind(column(batch, |spend| spend.stored.body.as_str()))
            .bind(BALANCE_STAND_IN.to_string())
            .bind(POINTS_STAND_IN.to_string())
            .bind(column(batch, |spend| i32::from(spend.stored.status)))
            .bind(column(batch, |spend| spend.stored.event));
        read_answer(query, batch.len(), connection).await
    }

    fn written_body(&self, row: &PgRow) -> Result<String, sqlx::Error> {
        Ok(filled(
            &self.stored.body,
            row.try_get("balance_after")?,
            row.try_get("points_after")?,
        ))
    }

    /// Those with an entry of their own: of the spend's account, under its fencing token
    /// (a grant's token is the account's only once).
    async fn earlier_writes(
        connection: &mut sqlx::PgConnection,
        items: &[&Self],
    ) -> Result<Vec<EarlierWrite>, sqlx::Error> {
        let tickets = column(items, |spend| spend.stored.ticket_id.0);
        let entries: Vec<(TicketId, AccountId, i64, Option<Json<Value>>)> = sqlx::query_as(
            "SELECT e.ticket_id, e.account_id, e.fencing_token, t.response_body
             FROM entries AS e JOIN tickets AS t ON t.id = e.ticket_id
             WHERE e.ticket_id = ANY ($1)",
        )
        .bind(&tickets)
        .fetch_all(connection)
        .await?;
        Ok(entries
            .into_iter()
            .filter(|(ticket, account, token, _)| {
                items.iter().any(|spend| {
                    spend.stored.ticket_id == *ticket
                        && spend.stored.account_id == *account
                        && spend.token == *token
                })
            })
            .map(|(ticket, _, _, body)| (ticket, body))
            .collect())
    }
}

/// One column of a batch's items, as its statement takes it: an array.
pub(crate) fn column<'a, I, T>(batch: &[&'a I], field: impl Fn(&'a I) -> T) -> Vec<T> {
    batch.iter().map(|item| field(item)).collect()
}

/// Sends `query` (a batch's statement, bound) on `connection`: the rows that came back, read
/// one by one to know whether any came before an error, and the error that ended the answer
/// if one did.
pub(crate) async fn read_answer<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    items: usize,
    connection: &mut sqlx::PgConnection,
) -> (Vec<PgRow>, Option<sqlx::Error>) {
    let mut answer = query.fetch(connection);
    let mut rows = Vec::with_capacity(items);
    let ended = loop {
        match answer.try_next().await {
            Ok(Some(row)) => rows.push(row),
            Ok(None) => break None,
            Err(error) => break Some(error),
        }
    };
    (rows, ended)
}

/// What the statement's whole answer, `rows`, says of each item of `batch` — after an
/// earlier try that may have run (`maybe_sent`), with the items that try wrote found
/// ([`own_earlier_writes`]) — and whether it queued webhook deliveries. The statement ran:
/// an answer that cannot be read may hide written items, so it is unknown.
async fn answered<T: Batched>(
    connection: &mut sqlx::PgConnection,
    batch: &[&T],
    rows: &[PgRow],
    maybe_sent: bool,
) -> Result<(Vec<Done>, bool), Failed> {
    let unreadable = |error: LedgerError| Failed::Unknown(error.to_string());
    let queued_deliveries = match rows.first() {
        Some(row) => row
            .try_get("queued_deliveries")
            .map_err(|error| unreadable(error.into()))?,
        None => false,
    };
    let mut done = rows
        .iter()
        .zip(batch)
        .map(|(row, item)| done(row, *item))
        .collect::<Result<Vec<_>, _>>()
        .map_err(unreadable)?;
    if maybe_sent {
        own_earlier_writes(connection, batch, &mut done)
            .await
            .map_err(unreadable)?;
    }
    Ok((done, queued_deliveries))
}

/// Finds, among the items of `batch` that the last try did not write, those an earlier try
/// wrote ([`Batched::earlier_writes`]), and answers them as written, with the outcome their
/// ticket stores.
async fn own_earlier_writes<T: Batched>(
    connection: &mut sqlx::PgConnection,
    batch: &[&T],
    done: &mut [Done],
) -> Result<(), LedgerError> {
    let not_written: Vec<&T> = batch
        .iter()
        .zip(done.iter())
        .filter(|(_, done)| done.written.is_none())
        .map(|(item, _)| *item)
        .collect();
    if not_written.is_empty() {
        return Ok(());
    }
    let written = T::earlier_writes(connection, &not_written).await?;
    for (item, done) in batch.iter().zip(done.iter_mut()) {
        // None of its own: another request's outcome, a replay, judged as one.
        let Some((_, stored)) = written.iter().find(|(ticket, _)| *ticket == item.ticket()) else {
            continue;
        };
        let Json(body) = stored.clone().ok_or_else(|| {
            LedgerError::Corrupt(format!(
                "ticket {}: written by this batch but holds no outcome",
                item.ticket()
            ))
        })?;
        done.written = Some(body);
    }
    Ok(())
}

/// What the statement's answer `row` says of `item`.
fn done<T: Batched>(row: &PgRow, item: &T) -> Result<Done, LedgerError> {
    let written = if row.try_get("applied")? {
        let body = item.written_body(row)?;
        Some(serde_json::from_str(&body).map_err(|error| {
            LedgerError::Corrupt(format!(
                "ticket {}: the body written: {error}",
                item.ticket()
            ))
        })?)
    } else {
        None
    };
    let id: Option<TicketId> = row.try_get("id")?;
    let ticket = match id {
        Some(_) => Some(TicketRow::from_row(row)?),
        None => None,
    };
    let recorded_token: Option<i64> = row.try_get("recorded_token")?;
    // A written item recorded its token: the statement writes one only over an older
    // token, never an equal or a newer one.
    debug_assert!(
        written.is_none() || recorded_token.is_some_and(|recorded| recorded < item.token()),
        "ticket {}: written with token {} over {recorded_token:?}",
        item.ticket(),
        item.token()
    );
    Ok(Done {
        written,
        ticket,
        recorded_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(account: AccountId, ticket: TicketId, token: i64) -> Queued<Spend> {
        Queued {
            item: Spend {
                stored: Stored {
                    ticket_id: ticket,
                    account_id: account,
                    kind: "withdrawal",
                    fingerprint: String::new(),
                    body: String::new(),
                    status: 201,
                    event: None,
                },
                debit: 1,
                credit: 0,
                points: 0,
                token,
            },
            answer: oneshot::channel().0,
            span: tracing::Span::none(),
        }
    }

    #[test]
    fn a_batch_takes_an_accounts_spends_in_token_order_and_one_per_ticket_and_grant() {
        let account = |n| AccountId(uuid::Uuid::from_u128(n));
        let (a, b, c) = (account(1), account(2), account(3));
        let shared_ticket = TicketId::random();
        let mut waiting = vec![
            queued(a, TicketId::random(), 5),
            queued(a, TicketId::random(), 3),
            queued(a, TicketId::random(), 3),
            queued(b, shared_ticket, 1),
            queued(c, shared_ticket, 2),
        ];
        let batch = take_batch(&mut waiting);
        let tokens = |queued: &[Queued<Spend>]| {
            queued
                .iter()
                .map(|queued| queued.item.token)
                .collect::<Vec<_>>()
        };
        // In account order, and by token within an account.
        assert_eq!(tokens(&batch), [3, 5, 1]);
        assert_eq!(tokens(&waiting), [3, 2]);
        let next = take_batch(&mut waiting);
        assert_eq!(tokens(&next), [3, 2]);
        assert!(waiting.is_empty());
    }
}
