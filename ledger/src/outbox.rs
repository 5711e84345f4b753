//! Payouts in the database: the spend's transaction that debits the account and writes the
//! payout with its outbox job, and the outbox's three steps — claim due jobs for a lease,
//! settle a job with the bank's final word, postpone it to a later attempt.
//!
//! The outbox is a table of its own rather than a job-queue crate's: the job must be
//! written in the money's transaction (so a job exists exactly when its payout committed),
//! on PostgreSQL and on SQLite alike, and settled in one transaction with the payout's
//! status and, for a refusal, the reversal entry. A claim takes due jobs whose lease ran
//! out (`FOR UPDATE SKIP LOCKED` on PostgreSQL, so instances claim different jobs; on
//! SQLite through the single writer) and counts the attempt; a worker settles or
//! postpones a job only at the attempt it claimed, so a worker whose lease ran out while
//! it waited on the bank records nothing once another worker claimed the job again. Times
//! come from the database's clock, which every instance shares.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::Value;
use sqlx::types::Json;
use sqlx::{ColumnIndex, Decode, Encode, Executor, FromRow, Type};

use crate::bells::JobKind;
use crate::claims::{Claim, Claimed};
use crate::db_types::{Timestamp, from_row};
use crate::dialect::Dialect;
use crate::dialect::{placeholders, value_rows};
use crate::error::{ApplyError, LedgerError, ResultExt, commit_or_unknown};
use crate::events::{NewEvent, record_events};
use crate::model::{
    AccountId, Amount, Applied, ApplyRequest, EntryKind, OperationResult, OrderId, Renderer,
    TicketId,
};
use crate::payouts::{
    Destination, JobOutcome, Payout, PayoutCounts, PayoutId, PayoutJob, PayoutRenderer,
    PayoutStatus, Settlement,
};
use crate::rows::{OrderRow, TicketRow};
use crate::sql_store::SqlStore;
use crate::webhooks::{EventId, EventType, payout_data};

/// A payout's own columns, in `PayoutRow`'s order up to its attempts.
macro_rules! payout_fields {
    () => {
        "p.id, p.account_id, p.ticket_id, p.amount, p.destination, p.status,
         p.bank_transfer_id, p.failure_reason, p.created_at, p.settled_at"
    };
}

/// A payout with its job's attempts and last error, while it has a job.
macro_rules! payout_columns {
    () => {
        concat!(
            payout_fields!(),
            ",
             COALESCE(o.attempts, p.attempts) AS attempts, o.last_error
             FROM payouts p LEFT JOIN outbox o ON o.payout_id = p.id"
        )
    };
}

const PAYOUT: &str = concat!("SELECT ", payout_columns!(), " WHERE p.id = $1");

/// Up to $4 of account $1's payouts (of status $2 where given) after the payout $3 (none:
/// from the first), in the order of their debit entries' ids — the order in which they
/// committed, so a page never passes over a payout that commits after it was read.
///
/// Why that holds: a payout's transaction takes the amount from the account's row (which
/// locks the row until the commit) and only then writes the debit entry, whose id comes
/// from the entries' sequence. Of two payouts of one account, the one whose entry was
/// written second got the row after the first one's commit, and commits after it. So
/// once a page has shown a payout, every payout of the account with a smaller entry id
/// had committed already: a later page, after that id, misses none. `created_at` cannot
/// give this: it is the clock as the ticket was locked, before the wait for the account's
/// row, and a payout can commit after one that read the clock later (a clock that steps
/// back does the same) — keyset pages on it skipped such a payout for good. Across
/// accounts there is no such order (their rows lock apart): every account's payouts at
/// once are read in one statement instead ([`EVERY_PAYOUT`]).
const PAYOUTS: &str = concat!(
    "SELECT ",
    payout_columns!(),
    " JOIN entries d ON d.payout_id = p.id AND d.kind = 'payout'
     WHERE d.account_id = $1 AND ($2 IS NULL OR p.status = $2)
       AND ($3 IS NULL OR d.id > (SELECT id FROM entries WHERE payout_id = $3 AND kind = 'payout'))
     ORDER BY d.id
     LIMIT $4"
);

/// Every payout, in one statement: one snapshot of the table, which no payout that
/// commits meanwhile can slip through (as one could between two pages).
const EVERY_PAYOUT: &str = concat!("SELECT ", payout_columns!(), " ORDER BY p.created_at, p.id");

/// The pending payouts' count and the oldest one's creation, on the partial index of
/// pending payouts: cheap however many settled ones the table holds.
const PENDING: &str = "
    SELECT CAST(COUNT(*) AS BIGINT), MIN(created_at) FROM payouts WHERE status = 'pending'";

const COUNTS: &str = "
    SELECT status, CAST(COUNT(*) AS BIGINT), MIN(created_at) FROM payouts GROUP BY status";

/// Parameters: $1 id, $2 account, $3 ticket, $4 amount, $5 destination, $6 now.
const INSERT_PAYOUT: &str = "
    INSERT INTO payouts (id, account_id, ticket_id, amount, destination, status, created_at)
    VALUES ($1, $2, $3, $4, $5, 'pending', $6)";

/// A payout's debit or reversal: $1 account, $2 ticket (NULL for a reversal), $3 kind,
/// $4 amount (signed), $5 balance after, $6 points after, $7 fencing token, $8 now,
/// $9 the payout.
const INSERT_PAYOUT_ENTRY: &str = "
    INSERT INTO entries (account_id, ticket_id, kind, amount, points, balance_after,
                         points_after, fencing_token, created_at, payout_id)
    VALUES ($1, $2, $3, $4, 0, $5, $6, $7, $8, $9)";

/// Parameters: $1 the payout, $2 now (due at once).
const INSERT_JOB: &str = "
    INSERT INTO outbox (kind, payout_id, due_at, created_at) VALUES ('payout', $1, $2, $2)";

/// Ends `count` jobs, each only if it is still at the attempt given for it: parameters
/// (job, attempt) for each. Returns the jobs it ended.
///
/// A job is deleted, not marked done: a settled payout's row holds all that is kept of it
/// (its claims are copied there by [`settle_payouts`]), and a finished job left in the
/// outbox would stay in its indexes, for every claim to walk past, until vacuum. So a
/// payout's job that exists is open, and this and [`POSTPONE_JOB`] find it by key alone:
/// a `done_at IS NULL` here would let the planner reach it through the index of open work
/// and walk it (see `record_answers` in `events.rs`).
fn finish_jobs(count: usize) -> String {
    format!(
        "DELETE FROM outbox WHERE (id, attempts) IN (VALUES {}) RETURNING id",
        value_rows(1, count, 2)
    )
}

/// Puts job $1 at attempt $2 back, due at $3, with $4 what went wrong; $5 is 1 when the
/// bank asked to wait (a 429), else 0, added to the throttled claims.
const POSTPONE_JOB: &str = "
    UPDATE outbox SET due_at = $3, lease_until = NULL, leased_by = NULL, last_error = $4,
                      throttled = throttled + $5
    WHERE id = $1 AND attempts = $2
    RETURNING payout_id";

/// Settles `count` payouts at $1 (now); then for each: the payout, its status, the
/// transfer id, the reason and the claims its job took. Returns each payout with its
/// account and amount. Only a pending payout is settled: its job, just deleted at the
/// attempt that settles it, existed only while it was pending, and the
/// `payouts_settle_once` trigger refuses any change to a settled one.
///
/// A payout is found by its key alone. With `AND status = 'pending'` here, statistics
/// taken when nearly every payout was settled (a long history; a burst of new ones is not
/// analysed again) made the planner reach the row through the index of pending payouts,
/// walking every pending one for each settlement: with 200,000 settled, payouts went out
/// at 0.58 of the rate on an empty database.
fn settle_payouts(count: usize) -> String {
    format!(
        "UPDATE payouts SET status = v.column2, bank_transfer_id = v.column3,
                            failure_reason = v.column4, settled_at = $1, attempts = v.column5
         FROM (VALUES {}) AS v
         WHERE payouts.id = v.column1
         RETURNING payouts.id, payouts.account_id, payouts.amount",
        value_rows(2, count, 5)
    )
}

/// A reversal's credit: no lock and no fencing token — adding to a balance cannot make any
/// spend's conditional update wrong — and the entry carries the token the account has.
const CREDIT_BACK: &str = "
    UPDATE accounts SET balance = balance + $2 WHERE id = $1
    RETURNING balance, points, fencing_token";

from_row! {
    /// A claimed payout job's outbox columns.
    pub(crate) struct ClaimedJob {
        lease_until: Timestamp,
        id: i64,
        payout_id: PayoutId,
        attempts: i32,
        throttled: i32,
        last_error: Option<String>,
    }
}

impl crate::claims::Leased for ClaimedJob {
    fn lease_until(&self) -> Timestamp {
        self.lease_until
    }
}

from_row! {
    /// A payout as read, with its job's attempts and last error.
    pub(crate) struct PayoutRow {
        id: PayoutId,
        account_id: AccountId,
        ticket_id: TicketId,
        amount: i64,
        destination: String,
        status: String,
        bank_transfer_id: Option<String>,
        failure_reason: Option<String>,
        created_at: Timestamp,
        settled_at: Option<Timestamp>,
        attempts: i32,
        last_error: Option<String>,
    }
}

impl TryFrom<PayoutRow> for Payout {
    type Error = LedgerError;

    fn try_from(row: PayoutRow) -> Result<Self, LedgerError> {
        let corrupt = |what: &str| LedgerError::Corrupt(format!("payout {}: {what}", row.id));
        Ok(Self {
            id: row.id,
            account_id: row.account_id,
            ticket_id: row.ticket_id,
            amount: Amount::new(row.amount).map_err(|_| corrupt("amount"))?,
            status: PayoutStatus::parse(&row.status).ok_or_else(|| corrupt("status"))?,
            attempts: u32::try_from(row.attempts).map_err(|_| corrupt("attempts"))?,
            destination: row.destination,
            bank_transfer_id: row.bank_transfer_id,
            failure_reason: row.failure_reason,
            created_at: row.created_at.0,
            settled_at: row.settled_at.map(|at| at.0),
            last_error: row.last_error,
        })
    }
}

/// The payout steps.
impl<D> SqlStore<D>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> i64: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> i32: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> String: Decode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> Option<&'q str>: Encode<'q, D>,
    for<'q> AccountId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Option<AccountId>: Encode<'q, D>,
    for<'q> TicketId: Encode<'q, D> + Type<D>,
    for<'q> Option<TicketId>: Encode<'q, D>,
    for<'q> PayoutId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Option<PayoutId>: Encode<'q, D>,
    for<'q> Timestamp: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Option<Timestamp>: Decode<'q, D>,
    for<'q> Json<&'q Value>: Encode<'q, D> + Type<D>,
    for<'q> crate::db_types::JsonText<'q>: Encode<'q, D> + Type<D>,
    usize: ColumnIndex<D::Row>,
    for<'r> TicketRow: FromRow<'r, D::Row>,
    for<'r> PayoutRow: FromRow<'r, D::Row>,
    for<'r> (i64, i64): FromRow<'r, D::Row>,
    for<'r> (i64, i64, i64): FromRow<'r, D::Row>,
    for<'r> ClaimedJob: FromRow<'r, D::Row>,
    for<'r> (AccountId, i64): FromRow<'r, D::Row>,
    for<'r> (String, i64, Timestamp): FromRow<'r, D::Row>,
    for<'r> (PayoutId,): FromRow<'r, D::Row>,
    for<'r> (Timestamp,): FromRow<'r, D::Row>,
    for<'r> (i64,): FromRow<'r, D::Row>,
    for<'r> (i64, Option<Timestamp>): FromRow<'r, D::Row>,
    for<'r> OrderRow: FromRow<'r, D::Row>,
    for<'q> OrderId: Encode<'q, D> + Type<D>,
    for<'q> Option<Timestamp>: Encode<'q, D>,
    for<'q> EventId: Encode<'q, D> + Type<D>,
{
    /// A payout on the transaction path (both databases): the ticket locked and judged as
    /// for every spend; the amount taken under the fencing check (402, stored, when the
    /// balance does not cover it); and on success, in the same transaction, the payout
    /// (pending), its debit entry and its outbox job, with the outcome stored as 202.
    pub(crate) async fn pay_out_in_transaction(
        &self,
        request: &ApplyRequest<'_>,
        payout: PayoutId,
        amount: Amount,
        destination: Destination,
        token: i64,
        render: &Renderer,
    ) -> Result<Applied, ApplyError> {
        let mut tx = self.begin_write().await?;
        let now = match Self::lock_and_judge(&mut tx, request).await? {
            Ok(now) => now,
            Err(answer) => return answer,
        };
        let planned = crate::apply::Planned::of(request.operation);
        let result = Self::move_or_refuse(&mut tx, request, &planned, token, now).await?;
        if let OperationResult::Applied {
            balance, points, ..
        } = result
        {
            let debit = Debit {
                payout,
                amount,
                destination,
                balance,
                points,
                token,
            };
            Self::record_payout(&mut tx, request, &debit, now).await?;
        }
        let applied = self.conclude(tx, request, &result, now, render).await?;
        if matches!(result, OperationResult::Applied { .. }) {
            self.bells.ring(JobKind::Payout);
        }
        Ok(applied)
    }

    /// The payout, its debit entry and its job.
    async fn record_payout(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        debit: &Debit,
        now: Timestamp,
    ) -> Result<(), ApplyError> {
        sqlx::query(INSERT_PAYOUT)
            .bind(debit.payout)
            .bind(request.account_id)
            .bind(request.ticket_id)
            .bind(debit.amount.get())
            .bind(debit.destination.as_str())
            .bind(now)
            .execute(&mut **tx)
            .await
            .or_constraint()?;
        sqlx::query(INSERT_PAYOUT_ENTRY)
            .bind(request.account_id)
            .bind(Some(request.ticket_id))
            .bind(EntryKind::Payout.as_str())
            .bind(-debit.amount.get())
            .bind(debit.balance)
            .bind(debit.points)
            .bind(debit.token)
            .bind(now)
            .bind(debit.payout)
            .execute(&mut **tx)
            .await
            .or_constraint()?;
        sqlx::query(INSERT_JOB)
            .bind(debit.payout)
            .bind(now)
            .execute(&mut **tx)
            .await
            .or_constraint()?;
        Ok(())
    }

    /// A payout by id.
    pub(crate) async fn find_payout(&self, id: PayoutId) -> Result<Option<Payout>, LedgerError> {
        let query = || {
            sqlx::query_as::<_, PayoutRow>(PAYOUT)
                .bind(id)
                .fetch_optional(&self.pool)
        };
        self.on_live_connection(query)
            .await?
            .map(Payout::try_from)
            .transpose()
    }

    /// Up to `limit` of `account`'s payouts after `after`, in `status` where given, in the
    /// order they committed ([`PAYOUTS`]).
    pub(crate) async fn list_payouts(
        &self,
        account: AccountId,
        status: Option<PayoutStatus>,
        after: Option<PayoutId>,
        limit: i64,
    ) -> Result<Vec<Payout>, LedgerError> {
        let query = || {
            sqlx::query_as::<_, PayoutRow>(PAYOUTS)
                .bind(account)
                .bind(status.map(PayoutStatus::as_str))
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
        };
        self.on_live_connection(query)
            .await?
            .into_iter()
            .map(Payout::try_from)
            .collect()
    }

    /// Every payout, as of one instant ([`EVERY_PAYOUT`]).
    pub(crate) async fn read_every_payout(&self) -> Result<Vec<Payout>, LedgerError> {
        let query = || sqlx::query_as::<_, PayoutRow>(EVERY_PAYOUT).fetch_all(&self.pool);
        self.on_live_connection(query)
            .await?
            .into_iter()
            .map(Payout::try_from)
            .collect()
    }

    /// How many payouts are pending, and since when the oldest.
    pub(crate) async fn count_pending(
        &self,
    ) -> Result<(u64, Option<time::OffsetDateTime>), LedgerError> {
        let query = || sqlx::query_as::<_, (i64, Option<Timestamp>)>(PENDING).fetch_one(&self.pool);
        let (count, oldest) = self.on_live_connection(query).await?;
        Ok((
            u64::try_from(count).unwrap_or_default(),
            oldest.map(|at| at.0),
        ))
    }

    /// How many payouts stand in each status, and since when the oldest pending one.
    pub(crate) async fn count_payouts(&self) -> Result<PayoutCounts, LedgerError> {
        let query = || sqlx::query_as::<_, (String, i64, Timestamp)>(COUNTS).fetch_all(&self.pool);
        let mut counts = PayoutCounts::default();
        for (status, count, oldest) in self.on_live_connection(query).await? {
            let count = u64::try_from(count).unwrap_or_default();
            match PayoutStatus::parse(&status) {
                Some(PayoutStatus::Pending) => {
                    counts.pending = count;
                    counts.oldest_pending = Some(oldest.0);
                }
                Some(PayoutStatus::Succeeded) => counts.succeeded = count,
                Some(PayoutStatus::Failed) => counts.failed = count,
                None => {
                    return Err(LedgerError::Corrupt(format!("payout status {status:?}")));
                }
            }
        }
        Ok(counts)
    }

    /// Claims up to `max` due jobs for `worker`, each for `lease` by the database's clock.
    pub(crate) async fn claim_jobs(
        &self,
        worker: &str,
        lease: Duration,
        max: i64,
    ) -> Result<Claimed<PayoutJob>, LedgerError> {
        let Claim {
            rows: claimed,
            lease_until,
        } = match self
            .claim_due::<ClaimedJob>(JobKind::Payout, D::CLAIM_JOBS, worker, lease, max)
            .await?
            .claim()
        {
            Ok(claim) => claim,
            Err(nothing) => return Ok(nothing),
        };
        // The claimed payouts in one statement, `… WHERE p.id IN ($1, …, $n)`, with their
        // jobs' attempts and last errors as the claim returned them. Joined to the outbox
        // instead, a claim of a few, planned while the queue was short, read every job
        // queued through a hash join, and kept that plan as the queue grew.
        let select = format!(
            "SELECT {}, p.attempts, CAST(NULL AS TEXT) AS last_error
             FROM payouts p WHERE p.id IN ({})",
            payout_fields!(),
            placeholders(1, claimed.len())
        );
        let mut query = sqlx::query_as::<_, PayoutRow>(sqlx::AssertSqlSafe(select));
        for job in &claimed {
            query = query.bind(job.payout_id);
        }
        let mut payouts: HashMap<PayoutId, Payout> = HashMap::new();
        for row in query.fetch_all(&self.pool).await? {
            let payout = Payout::try_from(row)?;
            payouts.insert(payout.id, payout);
        }
        claimed
            .into_iter()
            .map(|job| {
                let missing = || {
                    LedgerError::Corrupt(format!(
                        "outbox job {}: payout {} is missing",
                        job.id, job.payout_id
                    ))
                };
                let mut payout = payouts.remove(&job.payout_id).ok_or_else(missing)?;
                let attempt = u32::try_from(job.attempts).unwrap_or_default();
                payout.attempts = attempt;
                payout.last_error = job.last_error;
                Ok(PayoutJob {
                    job_id: job.id,
                    payout,
                    attempt,
                    throttled: u32::try_from(job.throttled).unwrap_or_default(),
                    claimed_at: lease_until.0 - lease,
                    lease_until: lease_until.0,
                })
            })
            .collect::<Result<_, _>>()
            .map(Claimed::of)
    }

    /// Records what came of each claimed job, in one transaction: the bank's final word
    /// (the payout settled and, for a refusal, the amount credited back with a reversal
    /// entry, with the job's end) or another attempt later. Each only if its job is still
    /// at the attempt it was claimed at: `false` in its place when it was claimed again or
    /// settled meanwhile (nothing written for it). One commit for a worker's batch.
    pub(crate) async fn record_jobs(
        &self,
        outcomes: &[(&PayoutJob, &JobOutcome)],
        render: &PayoutRenderer,
    ) -> Result<Vec<bool>, LedgerError> {
        let mut tx = self.begin_write().await?;
        let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *tx).await?;
        let settled: Vec<(&PayoutJob, &Settlement)> = outcomes
            .iter()
            .filter_map(|(job, outcome)| match outcome {
                JobOutcome::Settled(settlement) => Some((*job, settlement)),
                JobOutcome::Postponed { .. } => None,
            })
            .collect();
        let (finished, queued) = Self::settle_all(&mut tx, &settled, now, render).await?;
        let mut recorded = Vec::with_capacity(outcomes.len());
        for (job, outcome) in outcomes {
            recorded.push(match outcome {
                JobOutcome::Settled(_) => finished.contains(&job.job_id),
                JobOutcome::Postponed {
                    after,
                    error,
                    throttled,
                } => {
                    let postponed: Option<(PayoutId,)> = sqlx::query_as(POSTPONE_JOB)
                        .bind(job.job_id)
                        .bind(i32::try_from(job.attempt).unwrap_or(i32::MAX))
                        .bind(Timestamp(now.0 + *after))
                        .bind(error.as_str())
                        .bind(i32::from(*throttled))
                        .fetch_optional(&mut *tx)
                        .await?;
                    postponed.is_some()
                }
            });
        }
        commit_or_unknown(tx).await?;
        // The settlements' events queued deliveries.
        if queued {
            self.bells.ring(JobKind::Webhook);
        }
        // A later attempt was scheduled: this process's workers, asleep, learn when.
        if outcomes
            .iter()
            .any(|(_, outcome)| matches!(outcome, JobOutcome::Postponed { .. }))
        {
            self.bells.wake_here(JobKind::Payout);
        }
        Ok(recorded)
    }

    /// The settlements of `settled` jobs, inside `tx`, in a few statements whatever their
    /// number: the jobs still at the attempts they were claimed at deleted, their payouts
    /// settled, each refusal's money credited back, each settlement's event written and
    /// queued. Returns the jobs it settled, and whether the events queued deliveries.
    ///
    /// One statement per step rather than one per payout: a worker settles its whole
    /// claim (up to 32) at once, and the statements and round trips per payout were most
    /// of what the dispatch added to the bank's own work on shared cores.
    async fn settle_all(
        tx: &mut sqlx::Transaction<'static, D>,
        settled: &[(&PayoutJob, &Settlement)],
        now: Timestamp,
        render: &PayoutRenderer,
    ) -> Result<(HashSet<i64>, bool), LedgerError> {
        if settled.is_empty() {
            return Ok((HashSet::new(), false));
        }
        let attempt = |job: &PayoutJob| i32::try_from(job.attempt).unwrap_or(i32::MAX);
        let finish = finish_jobs(settled.len());
        let mut query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(finish));
        for (job, _) in settled {
            query = query.bind(job.job_id).bind(attempt(job));
        }
        let finished: HashSet<i64> = query.fetch_all(&mut **tx).await?.into_iter().collect();
        let settling: Vec<(&PayoutJob, PayoutStatus, Option<&str>, Option<&str>)> = settled
            .iter()
            .filter(|(job, _)| finished.contains(&job.job_id))
            .map(|(job, settlement)| match settlement {
                Settlement::Succeeded { transfer_id } => (
                    *job,
                    PayoutStatus::Succeeded,
                    Some(transfer_id.as_str()),
                    None,
                ),
                Settlement::Failed { reason } => {
                    (*job, PayoutStatus::Failed, None, Some(reason.as_str()))
                }
            })
            .collect();
        if settling.is_empty() {
            return Ok((finished, false));
        }
        let settle = settle_payouts(settling.len());
        let mut query =
            sqlx::query_as::<_, (PayoutId, AccountId, i64)>(sqlx::AssertSqlSafe(settle)).bind(now);
        for (job, status, transfer_id, reason) in &settling {
            query = query
                .bind(job.payout.id)
                .bind(status.as_str())
                .bind(*transfer_id)
                .bind(*reason)
                .bind(attempt(job));
        }
        let moved: HashMap<PayoutId, (AccountId, i64)> = query
            .fetch_all(&mut **tx)
            .await?
            .into_iter()
            .map(|(payout, account, amount)| (payout, (account, amount)))
            .collect();
        let mut events = Vec::with_capacity(settling.len());
        for (job, status, transfer_id, reason) in settling {
            let Some(&(account, amount)) = moved.get(&job.payout.id) else {
                return Err(LedgerError::Corrupt(format!(
                    "payout {}: its job was open but the payout is not",
                    job.payout.id
                )));
            };
            if status == PayoutStatus::Failed {
                Self::reverse(tx, account, amount, job.payout.id, now).await?;
            }
            // The settlement's event, in its transaction: the payout as it now stands.
            let settled = Payout {
                status,
                bank_transfer_id: transfer_id.map(str::to_owned),
                failure_reason: reason.map(str::to_owned),
                attempts: job.attempt,
                last_error: None,
                settled_at: Some(now.0),
                ..job.payout.clone()
            };
            events.push(NewEvent {
                account,
                ticket: job.payout.ticket_id,
                kind: match status {
                    PayoutStatus::Failed => EventType::PayoutFailed,
                    _ => EventType::PayoutSucceeded,
                },
                data: payout_data(account, job.payout.ticket_id, &render(&settled).to_string()),
            });
        }
        let queued = record_events(tx, &events, now).await?;
        Ok((finished, queued))
    }

    /// A failed payout's money back on `account`: the credit and its reversal entry.
    async fn reverse(
        tx: &mut sqlx::Transaction<'static, D>,
        account: AccountId,
        amount: i64,
        payout: PayoutId,
        now: Timestamp,
    ) -> Result<(), LedgerError> {
        let (balance, points, token): (i64, i64, i64) = sqlx::query_as(CREDIT_BACK)
            .bind(account)
            .bind(amount)
            .fetch_one(&mut **tx)
            .await?;
        sqlx::query(INSERT_PAYOUT_ENTRY)
            .bind(account)
            .bind(None::<TicketId>)
            .bind(EntryKind::PayoutReversal.as_str())
            .bind(amount)
            .bind(balance)
            .bind(points)
            .bind(token)
            .bind(now)
            .bind(payout)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

/// What a successful payout writes besides its ticket's outcome.
struct Debit {
    payout: PayoutId,
    amount: Amount,
    destination: Destination,
    balance: i64,
    points: i64,
    token: i64,
}
