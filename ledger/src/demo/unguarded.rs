//! The demonstration's statements (see `mod.rs`), behind the store as [`Unguarded`].

use async_trait::async_trait;
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{ColumnIndex, Decode, Encode, Executor, FromRow, Type};

use super::UnguardedPayment;
use crate::db_types::{JsonText, Timestamp};
use crate::dialect::Dialect;
use crate::error::{ApplyError, LedgerError, ResultExt, commit_or_unknown};
use crate::events::announce_outcome;
use crate::holding::HoldRow;
use crate::holds::{HoldId, Payment, Refund, RefundId};
use crate::model::{
    AccountId, Amount, Applied, ApplyRequest, OperationResult, OrderId, Renderer, StoredResponse,
    TicketId,
};
use crate::rows::{INSERT_ENTRY, OrderRow, TicketRow, token_to_sql};
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
    /// A payment of `account`'s as it is now, read without a lock: what it paid (`None`:
    /// an order not paid, a hold not captured), what its refunds add up to, its token.
    /// `None`: no such payment of the account's.
    async fn payment(
        &self,
        account: AccountId,
        payment: Payment,
    ) -> Result<Option<(Option<i64>, i64, i64)>, LedgerError>;
    /// A refund decided from an earlier unlocked read of its payment, the payment's
    /// refunded total written as an absolute value. `None`: another request completed the
    /// ticket first.
    async fn refund(
        &self,
        request: &ApplyRequest<'_>,
        refund: RefundId,
        payment: Payment,
        amount: Amount,
        read: &UnguardedPayment,
        render: &Renderer,
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
    for<'q> AccountId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> TicketId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Json<&'q Value>: Encode<'q, D> + Type<D>,
    for<'q> EventId: Encode<'q, D> + Type<D>,
    for<'r> (i64, i64, i64): FromRow<'r, D::Row>,
    usize: ColumnIndex<D::Row>,
    for<'q> JsonText<'q>: Encode<'q, D> + Type<D>,
    for<'r> TicketRow: FromRow<'r, D::Row>,
    for<'r> OrderRow: FromRow<'r, D::Row>,
    for<'q> OrderId: Encode<'q, D> + Type<D>,
    for<'q> Option<TicketId>: Encode<'q, D>,
    for<'q> Option<Timestamp>: Encode<'q, D>,
    for<'r> (i64, i64): FromRow<'r, D::Row>,
    for<'r> (i64,): FromRow<'r, D::Row>,
    for<'q> HoldId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> RefundId: Encode<'q, D> + Type<D>,
    for<'q> Option<OrderId>: Encode<'q, D>,
    for<'q> Option<HoldId>: Encode<'q, D>,
    for<'q> uuid::Uuid: Encode<'q, D> + Type<D>,
    for<'r> HoldRow: FromRow<'r, D::Row>,
    for<'q> Option<i64>: Encode<'q, D>,
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
        let completed: Option<TicketId> = sqlx::query_scalar::<D, TicketId>(
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

    async fn payment(
        &self,
        account: AccountId,
        payment: Payment,
    ) -> Result<Option<(Option<i64>, i64, i64)>, LedgerError> {
        // What it paid, or -1: an order not paid, a hold not captured (a captured hold,
        // and only one, has a captured amount).
        let (statement, id) = match payment {
            Payment::Order(order) => (
                "SELECT CASE WHEN paid_by_ticket IS NULL THEN -1 ELSE amount END,
                        refunded_amount, fencing_token
                 FROM orders WHERE id = $1 AND account_id = $2",
                order.0,
            ),
            Payment::Hold(hold) => (
                "SELECT coalesce(captured_amount, -1), refunded_amount, fencing_token
                 FROM holds WHERE id = $1 AND account_id = $2",
                hold.0,
            ),
        };
        let row: Option<(i64, i64, i64)> = sqlx::query_as(statement)
            .bind(id)
            .bind(account)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|(paid, refunded, token)| ((paid >= 0).then_some(paid), refunded, token)))
    }

    async fn refund(
        &self,
        request: &ApplyRequest<'_>,
        refund: RefundId,
        payment: Payment,
        amount: Amount,
        read: &UnguardedPayment,
        render: &Renderer,
    ) -> Result<Option<Applied>, ApplyError> {
        let mut tx = self.begin_write().await?;
        // The ticket is judged as every spend's is: the flaw on display is the payment's.
        let now = match Self::lock_and_judge(&mut tx, request).await? {
            Ok(now) => now,
            Err(answer) => return answer.map(Some),
        };
        // The payment's row before the account's, as every other writer of both takes
        // them (the other way round, two such writers could wait for each other): a row
        // lock for the write, not a guard on the read, which was made before and is what
        // the refund is decided on.
        match payment {
            Payment::Order(order) => {
                let _: Option<OrderRow> = sqlx::query_as(D::LOCK_ORDER)
                    .bind(order)
                    .bind(request.account_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            }
            Payment::Hold(hold) => {
                let _: Option<HoldRow> = sqlx::query_as(D::LOCK_HOLD)
                    .bind(hold)
                    .bind(request.account_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            }
        }
        let credited = Self::credit_refund(
            &mut tx,
            request,
            amount,
            read.refusal,
            read.paid - read.refunded,
        )
        .await?;
        let result = match credited {
            Err(refusal) => OperationResult::Refused(refusal),
            Ok((balance, points)) => {
                // The flaw on display: the total computed from a read that may be stale,
                // written over whatever refunds came since. (Only where it does not go
                // down: the database refuses a refunded total that does, and a lock that
                // was lost is what this write met — nothing is written.)
                let total = read.refunded + amount.get();
                let (statement, id) = match payment {
                    Payment::Order(order) => (
                        "UPDATE orders SET refunded_amount = $2
                         WHERE id = $1 AND refunded_amount <= $2 RETURNING refunded_amount",
                        order.0,
                    ),
                    Payment::Hold(hold) => (
                        "UPDATE holds SET refunded_amount = $2
                         WHERE id = $1 AND refunded_amount <= $2 RETURNING refunded_amount",
                        hold.0,
                    ),
                };
                let written: Option<(i64,)> = sqlx::query_as(statement)
                    .bind(id)
                    .bind(total)
                    .fetch_optional(&mut *tx)
                    .await
                    .or_constraint()?;
                if written.is_none() {
                    return Err(ApplyError::Overtaken);
                }
                let refund = Refund {
                    id: refund,
                    account_id: request.account_id,
                    ticket_id: request.ticket_id,
                    payment,
                    amount,
                    created_at: now.0,
                };
                Self::write_refund(&mut tx, &refund, balance, points, read.fencing_token).await?;
                OperationResult::Refunded {
                    refund,
                    refunded_total: total,
                    refundable: read.paid - total,
                    balance,
                }
            }
        };
        self.conclude(tx, request, &result, now, render)
            .await
            .map(Some)
    }
}
