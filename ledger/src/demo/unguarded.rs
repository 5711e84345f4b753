//! The demonstration's statements (see `mod.rs`), behind the store as [`Unguarded`].

use async_trait::async_trait;
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{ColumnIndex, Decode, Encode, Executor, FromRow, Type};

use crate::db_types::Timestamp;
use crate::dialect::Dialect;
use crate::error::{ApplyError, LedgerError, ResultExt, commit_or_unknown};
use crate::events::announce_outcome;
use crate::model::{
    AccountId, Applied, ApplyRequest, OperationResult, Renderer, StoredResponse, TicketId,
};
use crate::rows::{INSERT_ENTRY, token_to_sql};
use crate::sql_store::SqlStore;
use crate::webhooks::EventId;

/// What the read-check-write of the demonstration decided, to be written as is.
pub(crate) struct UnguardedWrite<'a> {
    pub request: ApplyRequest<'a>,
    pub result: OperationResult,
    pub debit: i64,
    pub credit: i64,
    pub spend: i64,
}

/// The demonstration's writes, as the store offers them
/// ([`Store::unguarded`](crate::store::Store::unguarded)).
#[async_trait]
pub(crate) trait Unguarded: Send + Sync {
    /// An account's balance, points and token, read without a lock.
    async fn holdings(&self, id: AccountId) -> Result<Option<(i64, i64, i64)>, LedgerError>;
    /// Writes an outcome decided from an earlier unlocked read, with absolute values.
    /// `None`: another request completed the ticket first.
    async fn write(
        &self,
        write: &UnguardedWrite<'_>,
        render: &Renderer,
        now: Timestamp,
    ) -> Result<Option<Applied>, ApplyError>;
}

#[async_trait]
impl<D> Unguarded for SqlStore<D>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> i64: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> i32: Encode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> AccountId: Encode<'q, D> + Type<D>,
    for<'q> TicketId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Type<D>,
    for<'q> Json<&'q Value>: Encode<'q, D> + Type<D>,
    for<'q> EventId: Encode<'q, D> + Type<D>,
    for<'r> (i64, i64, i64): FromRow<'r, D::Row>,
    usize: ColumnIndex<D::Row>,
{
    async fn holdings(&self, id: AccountId) -> Result<Option<(i64, i64, i64)>, LedgerError> {
        let row: Option<(i64, i64, i64)> =
            sqlx::query_as("SELECT balance, points, fencing_token FROM accounts WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row)
    }

    async fn write(
        &self,
        write: &UnguardedWrite<'_>,
        render: &Renderer,
        now: Timestamp,
    ) -> Result<Option<Applied>, ApplyError> {
        let request = &write.request;
        let token = token_to_sql(request.fencing_token)?;
        let execution = request.execution(&write.result);
        let (outcome, body) = (execution.kind(), render(&execution));
        let status = outcome.status();
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
        // Unguarded as the write is, its outcome is announced like any other.
        let queued = announce_outcome(&mut tx, request, outcome, now).await?;
        commit_or_unknown(tx).await?;
        if queued {
            self.bells.ring(crate::bells::JobKind::Webhook);
        }
        Ok(Some(Applied {
            kind: outcome,
            response: StoredResponse { status, body },
            replayed: false,
        }))
    }
}
