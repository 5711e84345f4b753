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

/// Whether a job of kind $2 is due at $1 whose lease ran out (or never was): read before a
/// claim, so idle workers never take the writer.
const ANY_DUE: &str = "
    SELECT id FROM outbox
    WHERE kind = $2 AND done_at IS NULL AND due_at <= $1 AND (lease_until IS NULL OR lease_until <= $1)
    LIMIT 1";

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
    for<'r> (i64,): FromRow<'r, D::Row>,
{
    /// Claims up to `max` due jobs of `kind` for `worker` with `claim` (the dialect's
    /// claim statement for that kind: $1 now, $2 lease until, $3 worker, $4 at most), each
    /// for `lease` by the database's clock — after a look on the read pool, so an idle
    /// worker never takes the writer. `None` when nothing was due or claimed.
    pub(crate) async fn claim_due<R>(
        &self,
        kind: &str,
        claim: &'static str,
        worker: &str,
        lease: Duration,
        max: i64,
    ) -> Result<Option<Claim<D, R>>, LedgerError>
    where
        for<'r> R: FromRow<'r, D::Row> + Send + Unpin,
    {
        let look = || async {
            let mut connection = self.pool.acquire().await?;
            let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *connection).await?;
            let due: Option<(i64,)> = sqlx::query_as(ANY_DUE)
                .bind(now)
                .bind(kind)
                .fetch_optional(&mut *connection)
                .await?;
            Ok::<_, sqlx::Error>(due.is_some())
        };
        if !self.on_live_connection(look).await? {
            return Ok(None);
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
            return Ok(None);
        }
        Ok(Some(Claim {
            tx,
            rows,
            lease_until,
        }))
    }
}
