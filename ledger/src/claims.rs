//! The outbox's claim, which every kind of job shares: payouts (`outbox.rs`) and webhook
//! deliveries (`events.rs`) are both claimed for a lease with it. Kept apart from either
//! kind's module so that neither depends on the other (the payouts' transactions write
//! events; the deliveries' steps claim jobs).

use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::{Encode, Executor, FromRow, Type};

use crate::bells::JobKind;
use crate::db_types::Timestamp;
use crate::dialect::Dialect;
use crate::error::LedgerError;
use crate::sql_store::SqlStore;

/// What a worker's claim came back with.
#[derive(Clone, Debug)]
pub struct Claimed<J> {
    /// The jobs claimed (none: nothing was due, or other workers took it first).
    pub jobs: Vec<J>,
    /// When nothing was due: how long until the first job not in flight is, by the
    /// database's clock; `None` when there is no such job.
    pub next_due_in: Option<Duration>,
}

impl<J> Claimed<J> {
    fn nothing(next_due_in: Option<Duration>) -> Self {
        Self {
            jobs: Vec::new(),
            next_due_in,
        }
    }

    /// How long an idle worker sleeps after this claim, at most `poll`: until the next
    /// job is due, if one is sooner.
    pub fn idle_wait(&self, poll: Duration) -> Duration {
        self.next_due_in.map_or(poll, |due| due.min(poll))
    }

    /// The jobs claimed, as the claim for them ran.
    pub(crate) fn of(jobs: Vec<J>) -> Self {
        Self {
            jobs,
            next_due_in: None,
        }
    }
}

/// What [`SqlStore::claim_due`] found: a claim, or nothing due (and when something is).
pub(crate) enum Looked<R> {
    Claim(Claim<R>),
    Nothing { next_due_in: Option<Duration> },
}

impl<R> Looked<R> {
    /// The claim; or, when nothing was claimed, the empty answer to return.
    pub(crate) fn claim<J>(self) -> Result<Claim<R>, Claimed<J>> {
        match self {
            Self::Claim(claim) => Ok(claim),
            Self::Nothing { next_due_in } => Err(Claimed::nothing(next_due_in)),
        }
    }
}

/// A claim as made by [`SqlStore::claim_due`], committed: the rows the claim returned, and
/// the leases' end. What the jobs need is read after it, outside its transaction: the
/// claim took the jobs, not what they name.
pub(crate) struct Claim<R> {
    pub rows: Vec<R>,
    pub lease_until: Timestamp,
}

/// The step every kind of outbox job is claimed with.
impl<D> SqlStore<D>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> i64: Encode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'r> (Timestamp, Option<Timestamp>): FromRow<'r, D::Row>,
{
    /// Claims up to `max` due jobs of `kind` for `worker` with `claim` (the dialect's
    /// claim statement for that kind: $1 the lease in microseconds, $2 worker, $3 at most),
    /// each for `lease` by the database's clock. Nothing, with when the next job is due,
    /// when none was due; nothing, with no time, when other claims took the due ones first.
    ///
    /// A worker whose last claim came back short looks first, on the read pool, so an idle
    /// worker never takes the writer. One whose last claim took all it asked for claims
    /// straight away: more is likely due, and the look walks the same index the claim
    /// does. Either way the claim is one statement on its own, timed by the clock it reads
    /// itself; a claim costs one round trip where it took six (a look, BEGIN, the clock,
    /// the claim, a read of what the jobs name, COMMIT).
    pub(crate) async fn claim_due<R>(
        &self,
        kind: JobKind,
        claim: &'static str,
        worker: &str,
        lease: Duration,
        max: i64,
    ) -> Result<Looked<R>, LedgerError>
    where
        for<'r> R: FromRow<'r, D::Row> + Send + Unpin,
        R: Leased,
    {
        let came_full = &self.claims_came_full[kind.index()];
        let looked = !came_full.load(Ordering::Relaxed);
        if looked {
            match self.look(kind).await? {
                Some(wait) if wait.is_zero() => {}
                next_due_in => return Ok(Looked::Nothing { next_due_in }),
            }
        }
        let lease_micros = i64::try_from(lease.as_micros()).unwrap_or(i64::MAX);
        // Run again on another connection when its own died under it: a claim whose
        // first try did commit leaves those jobs leased to no one who knows, until their
        // leases run out — delayed, never lost.
        let rows: Vec<R> = self
            .on_live_connection(|| {
                sqlx::query_as(claim)
                    .bind(lease_micros)
                    .bind(worker)
                    .bind(max)
                    .fetch_all(&self.writer)
            })
            .await?;
        came_full.store(
            i64::try_from(rows.len()).unwrap_or(i64::MAX) >= max,
            Ordering::Relaxed,
        );
        let Some(lease_until) = rows.first().map(Leased::lease_until) else {
            let next_due_in = if looked { None } else { self.look(kind).await? };
            return Ok(Looked::Nothing { next_due_in });
        };
        Ok(Looked::Claim(Claim { rows, lease_until }))
    }

    /// How long until the first job of `kind` not in flight is due, by the database's
    /// clock (zero: due now); `None` when there is no such job.
    async fn look(&self, kind: JobKind) -> Result<Option<Duration>, LedgerError> {
        let look = || async {
            let (now, first_due): (Timestamp, Option<Timestamp>) = sqlx::query_as(D::FIRST_FREE)
                .bind(kind.as_str())
                .fetch_one(&self.pool)
                .await?;
            // Due now: the difference is not positive, and waits nothing.
            Ok::<_, sqlx::Error>(
                first_due.map(|due_at| Duration::try_from(due_at.0 - now.0).unwrap_or_default()),
            )
        };
        Ok(self.on_live_connection(look).await?)
    }
}

/// A claimed job's row, which tells when its lease ends.
pub(crate) trait Leased {
    fn lease_until(&self) -> Timestamp;
}
