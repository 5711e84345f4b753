//! [`Store`]: the seam the [`Ledger`](crate::Ledger) handle holds — the ledger's storage
//! operations, one atomic step each — and its one implementation, [`SqlStore`], written
//! once for both databases: the reads and the simple writes here, each longer step in its
//! own room (`apply.rs`, `inserts.rs`, `audit.rs`, `reaper.rs`).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{ColumnIndex, Decode, Encode, Executor, FromRow, Type};
use time::OffsetDateTime;

use crate::audit::{Audit, Violation};
use crate::batch::{Batcher, Batches};
use crate::claims::Claimed;
use crate::creates::{CreationRow, NewCreation};
use crate::db_types::Timestamp;
#[cfg(feature = "demo")]
use crate::demo::unguarded::Unguarded;
use crate::dialect::Dialect;
use crate::error::{ApplyError, LedgerError, ResultExt};
use crate::events::{
    AttemptRow, ClaimedRow, DeliveryRow, DeliveryStateRow, EndpointRow, EventRow, Keeping,
};
use crate::holds::HoldRenderer;
use crate::inserts::{INSERT_ORDER, recognise_order};
use crate::model::{
    Account, AccountId, Applied, ApplyRequest, Entry, Operation, Order, OrderId, Renderer, Ticket,
    TicketId,
};
use crate::outbox::{ClaimedJob, PayoutRow};
use crate::payouts::{
    JobOutcome, Payout, PayoutCounts, PayoutId, PayoutJob, PayoutRenderer, PayoutStatus,
};
use crate::reaper;
use crate::requests::RequestRow;
use crate::rows::{AccountRow, EntryRow, OrderRow, TicketRow, order_columns, token_to_sql};
use crate::sql_store::SqlStore;
use crate::webhooks::{
    AttemptAnswer, Delivery, DeliveryJob, DeliveryOutcome, Endpoint, EndpointId, EventId,
    NewEndpoint, RetryRefused, WebhookBacklog,
};

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
    async fn payout(&self, id: PayoutId) -> Result<Option<Payout>, LedgerError>;
    /// A hold as of the database's clock.
    async fn hold(
        &self,
        id: crate::holds::HoldId,
    ) -> Result<Option<crate::holds::Hold>, LedgerError>;
    /// Records up to `batch` held holds past their expiry as expired, each with its event
    /// (`render` shows the hold); the holds expired.
    async fn expire_holds(
        &self,
        batch: i64,
        render: &HoldRenderer,
    ) -> Result<Vec<crate::holds::Hold>, LedgerError>;
    /// The holds held, and those past their expiry not yet recorded.
    async fn hold_counts(&self) -> Result<crate::holds::HoldCounts, LedgerError>;
    /// Up to `limit` of `account`'s payouts after `after`, in `status` where given, in the
    /// order they committed.
    async fn payouts(
        &self,
        account: AccountId,
        status: Option<PayoutStatus>,
        after: Option<PayoutId>,
        limit: i64,
    ) -> Result<Vec<Payout>, LedgerError>;
    /// Every payout, as of one instant.
    async fn every_payout(&self) -> Result<Vec<Payout>, LedgerError>;
    async fn payout_counts(&self) -> Result<PayoutCounts, LedgerError>;
    /// How many payouts are pending, and since when the oldest (cheap: the partial index).
    async fn pending_payouts(&self) -> Result<(u64, Option<OffsetDateTime>), LedgerError>;
    /// Claims up to `max` due payout jobs for `worker`, each for `lease` (`outbox.rs`).
    async fn claim_payouts(
        &self,
        worker: &str,
        lease: Duration,
        max: i64,
    ) -> Result<Claimed<PayoutJob>, LedgerError>;
    /// Records what came of claimed jobs, in one transaction; `false` for each that was
    /// claimed again or settled meanwhile.
    async fn record_payouts(
        &self,
        outcomes: &[(&PayoutJob, &JobOutcome)],
        render: &PayoutRenderer,
    ) -> Result<Vec<bool>, LedgerError>;
    /// Creates an endpoint unless its account has `max` already (`None`).
    async fn create_endpoint(
        &self,
        new: &NewEndpoint,
        max: usize,
        keeping: Option<&Keeping<'_>>,
    ) -> Result<Result<Option<Endpoint>, RequestRow>, LedgerError>;
    /// A live endpoint.
    async fn endpoint(&self, id: EndpointId) -> Result<Option<Endpoint>, LedgerError>;
    /// An account's live endpoints, oldest first.
    async fn endpoints(&self, account: AccountId) -> Result<Vec<Endpoint>, LedgerError>;
    /// Starts a rotation of an endpoint's secret (`events.rs`).
    async fn rotate_endpoint_secret(
        &self,
        account: AccountId,
        id: EndpointId,
        sealed: &[u8],
        window: Duration,
        keeping: Option<&Keeping<'_>>,
    ) -> Result<Result<Option<Endpoint>, RequestRow>, LedgerError>;
    async fn delete_endpoint(
        &self,
        account: AccountId,
        id: EndpointId,
    ) -> Result<bool, LedgerError>;
    /// Claims up to `max` due deliveries for `worker`, each for `lease`.
    async fn claim_deliveries(
        &self,
        worker: &str,
        lease: Duration,
        max: i64,
    ) -> Result<Claimed<DeliveryJob>, LedgerError>;
    /// Records claimed deliveries' attempts and outcomes, in one transaction.
    async fn record_deliveries(
        &self,
        outcomes: &[(&DeliveryJob, &AttemptAnswer, &DeliveryOutcome)],
    ) -> Result<Vec<bool>, LedgerError>;
    /// Gives claimed deliveries back unsent, due `after` from now, their attempts uncounted.
    async fn hand_back_deliveries(
        &self,
        jobs: &[&DeliveryJob],
        after: Duration,
    ) -> Result<(), LedgerError>;
    /// An endpoint's deliveries, newest first.
    async fn deliveries(
        &self,
        endpoint: EndpointId,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<Delivery>, LedgerError>;
    /// Sends a delivery again now.
    async fn retry_delivery(
        &self,
        endpoint: EndpointId,
        delivery: i64,
        keeping: Option<&Keeping<'_>>,
    ) -> Result<Result<Result<(), RetryRefused>, RequestRow>, LedgerError>;
    async fn webhook_backlog(&self) -> Result<WebhookBacklog, LedgerError>;
    /// The sealing key stored under `name`, `fresh` stored first if there is none.
    async fn sealing_key(&self, name: &str, fresh: &[u8]) -> Result<Vec<u8>, LedgerError>;
    /// Deletes unused tickets and prunes the outcomes of used ones, both expired more
    /// than `retention` ago by the database's clock (the clock that judges expiry, so a
    /// ticket is never reaped while a spend could still find it unexpired); at most
    /// `batch` of each; and deletes creation records made more than `retention` ago (by
    /// the creating instance's clock), at most `batch`. Returns how many of each.
    async fn reap(&self, retention: Duration, batch: i64) -> Result<(u64, u64, u64), LedgerError>;
    /// Deletes at most `batch` outbox jobs that finished more than `retention` ago by the
    /// database's clock, with their attempts. Returns how many.
    async fn reap_finished_jobs(&self, retention: Duration, batch: i64)
    -> Result<u64, LedgerError>;
    async fn ping(&self) -> Result<(), LedgerError>;
    async fn close(&self);
    /// The group commit's batch sizes, where there is one.
    fn batches(&self) -> Option<&Batches>;
    #[cfg(feature = "demo")]
    /// Demonstration only: the unguarded read and write (`demo/`).
    fn unguarded(&self) -> &dyn Unguarded;
}

#[async_trait]
impl<D> Store for SqlStore<D>
where
    D: Dialect,
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
    for<'q> crate::db_types::JsonText<'q>: Encode<'q, D> + Type<D>,
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
    for<'r> RequestRow: FromRow<'r, D::Row>,
    for<'q> uuid::Uuid: Encode<'q, D> + Type<D>,
    for<'r> (String, Vec<u8>, Timestamp): FromRow<'r, D::Row>,
    for<'q> Option<&'q str>: Encode<'q, D>,
    for<'q> PayoutId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Option<PayoutId>: Encode<'q, D>,
    for<'q> crate::holds::HoldId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> crate::holds::RefundId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Option<crate::holds::HoldId>: Encode<'q, D>,
    for<'q> Option<Timestamp>: Decode<'q, D>,
    for<'r> PayoutRow: FromRow<'r, D::Row>,
    for<'r> (i64, i64, i64): FromRow<'r, D::Row>,
    for<'r> ClaimedJob: FromRow<'r, D::Row>,
    for<'r> (AccountId, i64): FromRow<'r, D::Row>,
    for<'r> (String, i64, Timestamp): FromRow<'r, D::Row>,
    for<'r> (PayoutId,): FromRow<'r, D::Row>,
    for<'r> (Timestamp,): FromRow<'r, D::Row>,
    for<'r> (i64,): FromRow<'r, D::Row>,
    for<'r> (i64, Option<Timestamp>): FromRow<'r, D::Row>,
    for<'q> EventId: Encode<'q, D> + Type<D>,
    for<'q> EndpointId: Encode<'q, D> + Type<D>,
    for<'q> Option<i32>: Encode<'q, D>,
    for<'q> Option<i64>: Encode<'q, D>,
    for<'r> EndpointRow: FromRow<'r, D::Row>,
    for<'r> EventRow: FromRow<'r, D::Row>,
    for<'r> ClaimedRow: FromRow<'r, D::Row>,
    for<'r> DeliveryRow: FromRow<'r, D::Row>,
    for<'r> AttemptRow: FromRow<'r, D::Row>,
    for<'r> DeliveryStateRow: FromRow<'r, D::Row>,
    for<'r> (EndpointId,): FromRow<'r, D::Row>,
    for<'r> (Vec<u8>,): FromRow<'r, D::Row>,
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
            sqlx::query_as::<_, AccountRow>(D::READ_ACCOUNT)
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
        match self.on_live_connection(insert).await.or_constraint()? {
            Some(row) => Ticket::try_from(row),
            None => self.ticket(id).await?.ok_or_else(|| {
                LedgerError::Corrupt(format!("ticket {id} was issued but cannot be read"))
            }),
        }
    }

    async fn ticket(&self, id: TicketId) -> Result<Option<Ticket>, LedgerError> {
        let query = || {
            sqlx::query_as::<_, TicketRow>(D::TICKET)
                .bind(id)
                .fetch_optional(&self.pool)
        };
        self.on_live_connection(query)
            .await?
            .map(Ticket::try_from)
            .transpose()
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
                        fencing_token, created_at, order_id, payout_id
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
        // A payout runs on a transaction path of its own: it writes the payout and its job
        // with the debit (`outbox.rs`).
        if let Operation::Payout {
            payout,
            amount,
            destination,
        } = request.operation
        {
            let token = token_to_sql(request.fencing_token)?;
            return self
                .pay_out_in_transaction(request, payout, amount, destination, token, render)
                .await;
        }
        // Holds run under the hold's lock or, placed, the account's; refunds under the
        // payment's (`holding.rs`).
        match request.operation {
            Operation::Hold {
                hold,
                amount,
                expires_in,
            } => {
                let token = token_to_sql(request.fencing_token)?;
                return self
                    .place_hold(request, hold, amount, expires_in, token, render)
                    .await;
            }
            Operation::Capture { hold, amount } => {
                let token = token_to_sql(request.fencing_token)?;
                return self
                    .resolve_hold(request, hold, Some(amount), token, render)
                    .await;
            }
            Operation::Void { hold } => {
                let token = token_to_sql(request.fencing_token)?;
                return self.resolve_hold(request, hold, None, token, render).await;
            }
            Operation::Refund {
                refund,
                payment,
                amount,
            } => {
                let token = token_to_sql(request.fencing_token)?;
                return self
                    .refund(request, refund, payment, amount, token, render)
                    .await;
            }
            _ => {}
        }
        self.apply_operation(request, render).await
    }

    async fn payout(&self, id: PayoutId) -> Result<Option<Payout>, LedgerError> {
        self.find_payout(id).await
    }

    async fn hold(
        &self,
        id: crate::holds::HoldId,
    ) -> Result<Option<crate::holds::Hold>, LedgerError> {
        self.find_hold(id).await
    }

    async fn expire_holds(
        &self,
        batch: i64,
        render: &HoldRenderer,
    ) -> Result<Vec<crate::holds::Hold>, LedgerError> {
        SqlStore::expire_holds(self, batch, render).await
    }

    async fn hold_counts(&self) -> Result<crate::holds::HoldCounts, LedgerError> {
        self.count_holds().await
    }

    async fn payouts(
        &self,
        account: AccountId,
        status: Option<PayoutStatus>,
        after: Option<PayoutId>,
        limit: i64,
    ) -> Result<Vec<Payout>, LedgerError> {
        self.list_payouts(account, status, after, limit).await
    }

    async fn every_payout(&self) -> Result<Vec<Payout>, LedgerError> {
        self.read_every_payout().await
    }

    async fn payout_counts(&self) -> Result<PayoutCounts, LedgerError> {
        self.count_payouts().await
    }

    async fn pending_payouts(&self) -> Result<(u64, Option<OffsetDateTime>), LedgerError> {
        self.count_pending().await
    }

    async fn claim_payouts(
        &self,
        worker: &str,
        lease: Duration,
        max: i64,
    ) -> Result<Claimed<PayoutJob>, LedgerError> {
        self.claim_jobs(worker, lease, max).await
    }

    async fn record_payouts(
        &self,
        outcomes: &[(&PayoutJob, &JobOutcome)],
        render: &PayoutRenderer,
    ) -> Result<Vec<bool>, LedgerError> {
        self.record_jobs(outcomes, render).await
    }

    async fn create_endpoint(
        &self,
        new: &NewEndpoint,
        max: usize,
        keeping: Option<&Keeping<'_>>,
    ) -> Result<Result<Option<Endpoint>, RequestRow>, LedgerError> {
        self.insert_endpoint(new, max, keeping).await
    }

    async fn endpoint(&self, id: EndpointId) -> Result<Option<Endpoint>, LedgerError> {
        self.find_endpoint(id).await
    }

    async fn endpoints(&self, account: AccountId) -> Result<Vec<Endpoint>, LedgerError> {
        self.list_endpoints(account).await
    }

    async fn rotate_endpoint_secret(
        &self,
        account: AccountId,
        id: EndpointId,
        sealed: &[u8],
        window: Duration,
        keeping: Option<&Keeping<'_>>,
    ) -> Result<Result<Option<Endpoint>, RequestRow>, LedgerError> {
        SqlStore::rotate_endpoint_secret(self, account, id, sealed, window, keeping).await
    }

    async fn delete_endpoint(
        &self,
        account: AccountId,
        id: EndpointId,
    ) -> Result<bool, LedgerError> {
        SqlStore::delete_endpoint(self, account, id).await
    }

    async fn claim_deliveries(
        &self,
        worker: &str,
        lease: Duration,
        max: i64,
    ) -> Result<Claimed<DeliveryJob>, LedgerError> {
        SqlStore::claim_deliveries(self, worker, lease, max).await
    }

    async fn record_deliveries(
        &self,
        outcomes: &[(&DeliveryJob, &AttemptAnswer, &DeliveryOutcome)],
    ) -> Result<Vec<bool>, LedgerError> {
        SqlStore::record_deliveries(self, outcomes).await
    }

    async fn hand_back_deliveries(
        &self,
        jobs: &[&DeliveryJob],
        after: Duration,
    ) -> Result<(), LedgerError> {
        SqlStore::hand_back_deliveries(self, jobs, after).await
    }

    async fn deliveries(
        &self,
        endpoint: EndpointId,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<Delivery>, LedgerError> {
        self.list_deliveries(endpoint, before, limit).await
    }

    async fn retry_delivery(
        &self,
        endpoint: EndpointId,
        delivery: i64,
        keeping: Option<&Keeping<'_>>,
    ) -> Result<Result<Result<(), RetryRefused>, RequestRow>, LedgerError> {
        self.reopen_delivery(endpoint, delivery, keeping).await
    }

    async fn webhook_backlog(&self) -> Result<WebhookBacklog, LedgerError> {
        SqlStore::webhook_backlog(self).await
    }

    async fn sealing_key(&self, name: &str, fresh: &[u8]) -> Result<Vec<u8>, LedgerError> {
        SqlStore::sealing_key(self, name, fresh).await
    }

    async fn audit(&self) -> Result<Vec<Violation>, LedgerError> {
        Audit::of(&self.pool).run().await
    }

    async fn reap(&self, retention: Duration, batch: i64) -> Result<(u64, u64, u64), LedgerError> {
        reaper::reap(&self.pool, &self.writer, retention, batch).await
    }

    async fn reap_finished_jobs(
        &self,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        reaper::reap_finished_jobs(&self.pool, &self.writer, retention, batch).await
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
    fn unguarded(&self) -> &dyn Unguarded {
        self
    }
}
