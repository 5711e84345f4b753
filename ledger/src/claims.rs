//! The outbox's claim, which every kind of job shares: payouts (`outbox.rs`) and webhook
//! deliveries (`events.rs`) are both claimed for a lease with it. Kept apart from either
//! kind's module so that neither depends on the other (the payouts' transactions write
//! events; the deliveries' steps claim jobs).

use std::time::Duration;

use sqlx::{Encode, Executor, FromRow, Type};

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
pub(crate) enum Looked<D: sqlx::Database, R> {
    Claim(Claim<D, R>),
    Nothing { next_due_in: Option<Duration> },
}

impl<D: sqlx::Database, R> Looked<D, R> {
    /// The claim; or, when nothing was claimed, the empty answer to return.
    pub(crate) fn claim<J>(self) -> Result<Claim<D, R>, Claimed<J>> {
        match self {
            Self::Claim(claim) => Ok(claim),
            Self::Nothing { next_due_in } => Err(Claimed::nothing(next_due_in)),
        }
    }
}

/// A claim as made by [`SqlStore::claim_due`]: the write transaction it ran in (to read
/// what the jobs need, then commit), the rows the claim returned, and the leases' end.
pub(crate) struct Claim<D: sqlx::Database, R> {
    pub tx: sqlx::Transaction<'static, D>,
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
    for<'q> Timestamp: Encode<'q, D> + Type<D>,
    for<'r> (Timestamp,): FromRow<'r, D::Row>,
    for<'r> (Timestamp, Option<Timestamp>): FromRow<'r, D::Row>,
{
    /// Claims up to `max` due jobs of `kind` for `worker` with `claim` (the dialect's
    /// claim statement for that kind: $1 now, $2 lease until, $3 worker, $4 at most), each
    /// for `lease` by the database's clock — after a look on the read pool, so an idle
    /// worker never takes the writer. Nothing, with when the next job is due, when none
    /// was due; nothing, with no time, when other claims took the due ones first.
    pub(crate) async fn claim_due<R>(
        &self,
        kind: &str,
        claim: &'static str,
        worker: &str,
        lease: Duration,
        max: i64,
    ) -> Result<Looked<D, R>, LedgerError>
    where
        for<'r> R: FromRow<'r, D::Row> + Send + Unpin,
    {
        let look = || async {
            let (now, first_due): (Timestamp, Option<Timestamp>) = sqlx::query_as(D::FIRST_FREE)
                .bind(kind)
                .fetch_one(&self.pool)
                .await?;
            // Due now: the difference is not positive, and waits nothing.
            Ok::<_, sqlx::Error>(
                first_due.map(|due_at| Duration::try_from(due_at.0 - now.0).unwrap_or_default()),
            )
        };
        match self.on_live_connection(look).await? {
            Some(wait) if wait.is_zero() => {}
            next_due_in => return Ok(Looked::Nothing { next_due_in }),
        }
        let mut tx = self.begin_write().await?;
        let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *tx).await?;
        let lease_until = Timestamp(now.0 + lease);
        let rows: Vec<R> = sqlx::query_as(claim)
            .bind(now)
            .bind(lease_until)
            .bind(worker)
            .bind(max)
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(Looked::Nothing { next_due_in: None });
        }
        Ok(Looked::Claim(Claim {
            tx,
            rows,
            lease_until,
        }))
    }
}
