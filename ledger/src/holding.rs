//! The transactions of holds and refunds (the model is `holds.rs`): placing a hold under
//! the account's lock, capturing or voiding one under its own, the sweeper's expiries,
//! reading one back as of the database's clock; and refunds of a paid order or a captured
//! hold, under the lock of the payment, never above what it paid.
//!
//! Each spend here is a ticket's, as every spend is: the ticket locked and judged first, the
//! outcome — refusals included — stored under it in the same transaction
//! (`apply.rs`, `conclude`). A hold moves no money: placing one adds its amount to the
//! account's `held`, in a conditional update that checks the money available as every debit
//! does; a capture takes the captured amount out and releases the whole hold from `held`,
//! with one entry; a void and an expiry release it. Which of a capture, a void and an expiry
//! wins is settled twice: by the hold's lock, and by the database on its own — the update
//! that resolves a hold finds it only while it is held and not expired by the clock it
//! writes (`holds_resolve_once`, `holds_resolved_in_time` in migration 0015).

use std::collections::BTreeMap;

use sqlx::{Decode, Encode, Executor, FromRow, Type};

use crate::apply::{RECORD_TOKEN, answer_from_batch, available_covers, stale, stored_in_batch};
use crate::batch::Batcher;
use crate::bells::JobKind;
use crate::db_types::{JsonText, Timestamp, from_row};
use crate::dialect::Dialect;
use crate::error::{ApplyError, LedgerError, ResultExt, commit_or_unknown};
use crate::events::{NewEvent, record_events};
use crate::hold_batch::HoldStep;
use crate::holds::{
    Hold, HoldCounts, HoldId, HoldLifetime, HoldRenderer, HoldState, Payment, Refund, RefundId,
};
use crate::model::{
    AccountId, Amount, Applied, ApplyRequest, OperationResult, OrderId, Refusal, Renderer, TicketId,
};
use crate::rows::{OrderRow, TicketRow};
use crate::sql_store::SqlStore;
use crate::stand_ins::{
    AVAILABLE_STAND_IN, BALANCE_STAND_IN, EXPIRY_STAND_IN, HOLD_AMOUNT_STAND_IN, NOW_STAND_IN,
    PLACED_AT_STAND_IN, PLACED_BY_STAND_IN,
};
use crate::webhooks::{EventId, EventType, hold_data};

/// A hold's placing: its amount added to the account's `held` if the money available
/// covers it, under the fencing check of the account's lock. Parameters: $1 account,
/// $2 amount, $3 token, $4 now. Returns the balance.
const PLACE: &str = concat!(
    "UPDATE accounts SET held = held + $2, fencing_token = $3
     WHERE id = $1 AND fencing_token < $3 AND ",
    available_covers!("$2", "$4"),
    " RETURNING balance"
);

/// Parameters: $1 hold, $2 account, $3 ticket, $4 amount, $5 expires at, $6 now.
const INSERT_HOLD: &str = "
    INSERT INTO holds (id, account_id, ticket_id, amount, expires_at, created_at)
    VALUES ($1, $2, $3, $4, $5, $6)";

/// Resolves hold $1 as $2 (captured with $3, or voided with NULL) at $4 by ticket $5 under
/// token $6 — only while it is held, not expired at $4, and the token is newer than any its
/// lock gave before. Exactly one row, or the hold was not the caller's to resolve.
const RESOLVE: &str = "
    UPDATE holds
    SET state = $2, captured_amount = $3, resolved_at = $4, resolved_by_ticket = $5,
        fencing_token = $6
    WHERE id = $1 AND state = 'held' AND expires_at > $4 AND fencing_token < $6
    RETURNING id";

/// A refused capture or void records the token like any write. Parameters: $1 hold,
/// $2 token.
const RECORD_HOLD_TOKEN: &str = "
    UPDATE holds SET fencing_token = $2 WHERE id = $1 AND fencing_token < $2";

/// A resolution's release and a capture's debit: $2 out of account $1 (0 for a void or an
/// expiry), and the hold's amount $3 out of what it holds aside. Returns the balance and
/// points after.
const RELEASE: &str = "
    UPDATE accounts SET balance = balance - $2, held = held - $3 WHERE id = $1
    RETURNING balance, points";

/// A capture's entry: $1 account, $2 ticket, $3 amount (negative), $4 balance after,
/// $5 points after, $6 the hold's token, $7 now, $8 the hold.
const INSERT_CAPTURE_ENTRY: &str = "
    INSERT INTO entries (account_id, ticket_id, kind, amount, points, balance_after,
                         points_after, fencing_token, created_at, hold_id)
    VALUES ($1, $2, 'hold_capture', $3, 0, $4, $5, $6, $7, $8)";

/// A refund's credit: $2 back to account $1, unless the balance would pass its limit.
/// Returns the balance and points after.
const CREDIT: &str = "
    UPDATE accounts SET balance = balance + $2
    WHERE id = $1 AND balance <= 9223372036854775807 - $2
    RETURNING balance, points";

/// Adds $2 to order $1's refunds under token $3, only within what it paid. Returns the
/// total.
const REFUND_ORDER: &str = "
    UPDATE orders SET refunded_amount = refunded_amount + $2, fencing_token = $3
    WHERE id = $1 AND paid_by_ticket IS NOT NULL AND refunded_amount + $2 <= amount
      AND fencing_token < $3
    RETURNING refunded_amount";

/// Adds $2 to hold $1's refunds under token $3, only within what it captured. Returns the
/// total.
const REFUND_HOLD: &str = "
    UPDATE holds SET refunded_amount = refunded_amount + $2, fencing_token = $3
    WHERE id = $1 AND state = 'captured' AND refunded_amount + $2 <= captured_amount
      AND fencing_token < $3
    RETURNING refunded_amount";

/// A refused refund of an order records the token like any write. Parameters: $1 order,
/// $2 token.
const RECORD_ORDER_TOKEN: &str = "
    UPDATE orders SET fencing_token = $2 WHERE id = $1 AND fencing_token < $2";

/// Parameters: $1 refund, $2 account, $3 ticket, $4 order or NULL, $5 hold or NULL,
/// $6 amount, $7 now.
const INSERT_REFUND: &str = "
    INSERT INTO refunds (id, account_id, ticket_id, order_id, hold_id, amount, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// A refund's entry: $1 account, $2 ticket, $3 amount, $4 balance after, $5 points after,
/// $6 the order's or hold's token, $7 now, $8 the refund.
const INSERT_REFUND_ENTRY: &str = "
    INSERT INTO entries (account_id, ticket_id, kind, amount, points, balance_after,
                         points_after, fencing_token, created_at, refund_id)
    VALUES ($1, $2, 'refund', $3, 0, $4, $5, $6, $7, $8)";

/// Parameters: $1 hold.
const HOLD: &str = concat!(
    "SELECT ",
    crate::dialect::hold_columns!(),
    " FROM holds WHERE id = $1"
);

from_row! {
    /// A hold as stored.
    pub(crate) struct HoldRow {
        id: HoldId,
        account_id: AccountId,
        ticket_id: TicketId,
        amount: i64,
        state: String,
        captured_amount: Option<i64>,
        refunded_amount: i64,
        fencing_token: i64,
        expires_at: Timestamp,
        created_at: Timestamp,
        resolved_at: Option<Timestamp>,
        resolved_by_ticket: Option<TicketId>,
    }
}

impl HoldRow {
    /// The hold as of `now` by the database's clock: one still held but past its expiry is
    /// expired, resolved at its expiry, whether or not the sweeper has recorded it yet.
    fn read_at(self, now: Timestamp) -> Result<Hold, LedgerError> {
        let corrupt = |what: &str| LedgerError::Corrupt(format!("hold {}: {what}", self.id));
        let stored = HoldState::parse(&self.state).ok_or_else(|| corrupt("state"))?;
        let (state, resolved_at) = match stored {
            HoldState::Held if self.expires_at.0 <= now.0 => {
                (HoldState::Expired, Some(self.expires_at.0))
            }
            state => (state, self.resolved_at.map(|at| at.0)),
        };
        Ok(Hold {
            id: self.id,
            account_id: self.account_id,
            ticket_id: self.ticket_id,
            amount: Amount::new(self.amount).map_err(|_| corrupt("amount"))?,
            state,
            captured_amount: self.captured_amount,
            refunded_amount: self.refunded_amount,
            expires_at: self.expires_at.0,
            created_at: self.created_at.0,
            resolved_at,
            resolved_by_ticket: self.resolved_by_ticket,
        })
    }
}

/// The holds' steps.
impl<D> SqlStore<D>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> i64: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> i32: Encode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> AccountId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> TicketId: Encode<'q, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> JsonText<'q>: Encode<'q, D> + Type<D>,
    for<'r> TicketRow: FromRow<'r, D::Row>,
    for<'r> OrderRow: FromRow<'r, D::Row>,
    for<'q> OrderId: Encode<'q, D> + Type<D>,
    for<'q> Option<TicketId>: Encode<'q, D>,
    for<'q> Option<Timestamp>: Encode<'q, D>,
    for<'r> (i64, i64): FromRow<'r, D::Row>,
    for<'r> (i64, i64, i64): FromRow<'r, D::Row>,
    usize: sqlx::ColumnIndex<D::Row>,
    for<'q> EventId: Encode<'q, D> + Type<D>,
    for<'q> Option<i64>: Encode<'q, D>,
    for<'q> HoldId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> RefundId: Encode<'q, D> + Type<D>,
    for<'q> uuid::Uuid: Encode<'q, D> + Type<D>,
    for<'q> Option<OrderId>: Encode<'q, D>,
    for<'q> Option<HoldId>: Encode<'q, D>,
    for<'r> HoldRow: FromRow<'r, D::Row>,
{
    /// A hold placed under the account's lock (fenced by its token): the ticket judged,
    /// the amount added to `held` if the money available covers it (else 402, stored),
    /// the hold written, expiring `expires_in` after the database's clock read now.
    /// Through the group commit first where there is one (`hold_batch.rs`).
    pub(crate) async fn place_hold(
        &self,
        request: &ApplyRequest<'_>,
        hold: HoldId,
        amount: Amount,
        expires_in: HoldLifetime,
        token: i64,
        render: &Renderer,
    ) -> Result<Applied, ApplyError> {
        if let Some(batcher) = &self.hold_batcher {
            let placed = placed_hold(hold, request, amount, EXPIRY_STAND_IN, NOW_STAND_IN);
            let lifetime = i64::try_from(expires_in.duration().as_secs()).unwrap_or(i64::MAX);
            let step = (hold, amount.get(), lifetime);
            if let Some(answer) = in_batch(batcher, request, placed, step, token, render).await {
                return answer;
            }
        }
        let mut tx = self.begin_write().await?;
        let now = match Self::lock_and_judge(&mut tx, request).await? {
            Ok(now) => now,
            Err(answer) => return answer,
        };
        let placed = match Self::try_place(&mut tx, request, amount, token, now).await? {
            Some(balance) => Ok(balance),
            None => {
                let (balance, _, recorded): (i64, i64, i64) = sqlx::query_as(D::LOCK_ACCOUNT)
                    .bind(request.account_id)
                    .fetch_one(&mut *tx)
                    .await?;
                if recorded >= token {
                    return Err(stale(request, recorded));
                }
                let set_aside = Self::set_aside(&mut tx, request.account_id, now).await?;
                if balance - set_aside >= amount.get() {
                    // A capture or a void of another hold committed in between (they run
                    // under their hold's lock, not the account's) and released money: the
                    // account's row is ours now, and a release only adds to what is
                    // available.
                    let again = Self::try_place(&mut tx, request, amount, token, now).await?;
                    Ok(again.ok_or_else(|| {
                        ApplyError::Ledger(LedgerError::Corrupt(format!(
                            "account {}: a hold its locked row affords was refused",
                            request.account_id
                        )))
                    })?)
                } else {
                    // A refused placing records the token like any write.
                    sqlx::query(RECORD_TOKEN)
                        .bind(request.account_id)
                        .bind(token)
                        .execute(&mut *tx)
                        .await
                        .or_constraint()?;
                    Err(Refusal::InsufficientFunds { balance })
                }
            }
        };
        let result = match placed {
            Ok(balance) => {
                let expires_at = Timestamp(now.0 + expires_in.duration());
                sqlx::query(INSERT_HOLD)
                    .bind(hold)
                    .bind(request.account_id)
                    .bind(request.ticket_id)
                    .bind(amount.get())
                    .bind(expires_at)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .or_constraint()?;
                let set_aside = Self::set_aside(&mut tx, request.account_id, now).await?;
                OperationResult::HoldChanged {
                    hold: placed_hold(hold, request, amount, expires_at.0, now.0),
                    balance,
                    available: balance - set_aside,
                }
            }
            Err(refusal) => OperationResult::Refused(refusal),
        };
        self.conclude(tx, request, &result, now, render).await
    }

    /// [`PLACE`]: the balance after, or `None` where the money available (or the token)
    /// does not allow it.
    async fn try_place(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        amount: Amount,
        token: i64,
        now: Timestamp,
    ) -> Result<Option<i64>, ApplyError> {
        let placed: Option<(i64,)> = sqlx::query_as(PLACE)
            .bind(request.account_id)
            .bind(amount.get())
            .bind(token)
            .bind(now)
            .fetch_optional(&mut **tx)
            .await
            .or_constraint()?;
        Ok(placed.map(|(balance,)| balance))
    }

    /// A hold captured (`captured` is `Some`: that amount, or the whole hold when it is
    /// `Some(None)`) or voided (`None`), under the hold's lock (fenced by its token): the
    /// ticket judged; the hold locked, found with the account (else
    /// [`ApplyError::UnknownHold`]); one not held by the database's clock read after its
    /// lock is refused 409, and a capture above the hold 422, both stored; else the hold
    /// resolved, released from `held`, and for a capture the amount taken out with its
    /// entry. Through the group commit first where there is one (`hold_batch.rs`).
    pub(crate) async fn resolve_hold(
        &self,
        request: &ApplyRequest<'_>,
        hold_id: HoldId,
        captured: Option<Option<Amount>>,
        token: i64,
        render: &Renderer,
    ) -> Result<Applied, ApplyError> {
        if let Some(batcher) = &self.hold_batcher {
            // What only the hold's row knows of it, the statement fills in.
            let capture =
                captured.map(|amount| amount.unwrap_or(Amount::stand_in(HOLD_AMOUNT_STAND_IN)));
            let resolved = Hold {
                id: hold_id,
                account_id: request.account_id,
                ticket_id: TicketId(PLACED_BY_STAND_IN),
                amount: Amount::stand_in(HOLD_AMOUNT_STAND_IN),
                state: match capture {
                    Some(_) => HoldState::Captured,
                    None => HoldState::Voided,
                },
                captured_amount: capture.map(Amount::get),
                refunded_amount: 0,
                expires_at: EXPIRY_STAND_IN,
                created_at: PLACED_AT_STAND_IN,
                resolved_at: Some(NOW_STAND_IN),
                resolved_by_ticket: Some(request.ticket_id),
            };
            // 0: the whole hold, or nothing for a void.
            let taken = captured.flatten().map_or(0, Amount::get);
            let step = (hold_id, taken, 0);
            if let Some(answer) = in_batch(batcher, request, resolved, step, token, render).await {
                return answer;
            }
        }
        let mut tx = self.begin_write().await?;
        if let Err(answer) = Self::lock_and_judge(&mut tx, request).await? {
            return answer;
        }
        let row: HoldRow = sqlx::query_as(D::LOCK_HOLD)
            .bind(hold_id)
            .bind(request.account_id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(ApplyError::UnknownHold)?;
        if row.fencing_token >= token {
            return Err(stale(request, row.fencing_token));
        }
        // The account's row, then the clock. A spend of the account that counted this
        // hold expired — by a clock read past its expiry — and took the money it set
        // aside has committed by now, so the clock read next is past the expiry too and
        // the hold is expired: a capture never takes money a spend already took. (Read
        // before the account's row, a clock short of the expiry let a capture commit after
        // such a spend, and the account's available went below zero.)
        let _: (i64, i64, i64) = sqlx::query_as(D::LOCK_ACCOUNT)
            .bind(request.account_id)
            .fetch_one(&mut *tx)
            .await?;
        // The clock once the hold is ours: a request that waited for the lock past the
        // expiry finds the hold expired.
        let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *tx).await?;
        let hold = row.read_at(now)?;
        let capture = captured.map(|amount| amount.unwrap_or(hold.amount));
        let refusal = if hold.state != HoldState::Held {
            Some(Refusal::HoldNotHeld { state: hold.state })
        } else {
            capture
                .filter(|capture| capture.get() > hold.amount.get())
                .map(|_| Refusal::CaptureExceedsHold {
                    held: hold.amount.get(),
                })
        };
        let result = match refusal {
            Some(refusal) => {
                sqlx::query(RECORD_HOLD_TOKEN)
                    .bind(hold_id)
                    .bind(token)
                    .execute(&mut *tx)
                    .await
                    .or_constraint()?;
                OperationResult::Refused(refusal)
            }
            None => {
                let (state, taken) = match capture {
                    Some(amount) => (HoldState::Captured, amount.get()),
                    None => (HoldState::Voided, 0),
                };
                Self::resolve(&mut tx, request, &hold, state, taken, token, now).await?
            }
        };
        self.conclude(tx, request, &result, now, render).await
    }

    /// The resolving writes of a held hold: its row, the release (and a capture's debit
    /// of `taken`), a capture's entry; the outcome.
    async fn resolve(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        hold: &Hold,
        state: HoldState,
        taken: i64,
        token: i64,
        now: Timestamp,
    ) -> Result<OperationResult, ApplyError> {
        let captured = (state == HoldState::Captured).then_some(taken);
        let resolved: Option<(HoldId,)> = sqlx::query_as(RESOLVE)
            .bind(hold.id)
            .bind(state.as_str())
            .bind(captured)
            .bind(now)
            .bind(request.ticket_id)
            .bind(token)
            .fetch_optional(&mut **tx)
            .await
            .or_constraint()?;
        if resolved.is_none() {
            return Err(ApplyError::Ledger(LedgerError::Corrupt(format!(
                "hold {}: held and ours when locked, not when resolved",
                hold.id
            ))));
        }
        let (balance, points): (i64, i64) = sqlx::query_as(RELEASE)
            .bind(request.account_id)
            .bind(taken)
            .bind(hold.amount.get())
            .fetch_one(&mut **tx)
            .await
            .or_constraint()?;
        if let Some(captured) = captured {
            sqlx::query(INSERT_CAPTURE_ENTRY)
                .bind(request.account_id)
                .bind(request.ticket_id)
                .bind(-captured)
                .bind(balance)
                .bind(points)
                .bind(token)
                .bind(now)
                .bind(hold.id)
                .execute(&mut **tx)
                .await
                .or_constraint()?;
        }
        let set_aside = Self::set_aside(tx, request.account_id, now).await?;
        Ok(OperationResult::HoldChanged {
            hold: Hold {
                state,
                captured_amount: captured,
                resolved_at: Some(now.0),
                resolved_by_ticket: Some(request.ticket_id),
                ..*hold
            },
            balance,
            available: balance - set_aside,
        })
    }

    /// A refund of `payment` — under the order's lock for an order, the hold's for a hold
    /// (fenced by that lock's token, recorded on the order or the hold): the ticket judged;
    /// the payment locked, found with the account (else [`ApplyError::UnknownOrder`] or
    /// [`ApplyError::UnknownHold`]); refused 409, stored, when the order is not paid, the
    /// hold not captured, or the amount above what is still refundable; else the money
    /// back on the account with its entry, the refund written, and the payment's refunded
    /// total raised — which the database holds within what it paid on its own.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn refund(
        &self,
        request: &ApplyRequest<'_>,
        refund_id: RefundId,
        payment: Payment,
        amount: Amount,
        token: i64,
        render: &Renderer,
    ) -> Result<Applied, ApplyError> {
        let mut tx = self.begin_write().await?;
        let now = match Self::lock_and_judge(&mut tx, request).await? {
            Ok(now) => now,
            Err(answer) => return answer,
        };
        let (recorded, paid, refunded, refusal) = match payment {
            Payment::Order(order) => {
                let row: OrderRow = sqlx::query_as(D::LOCK_ORDER)
                    .bind(order)
                    .bind(request.account_id)
                    .fetch_optional(&mut *tx)
                    .await?
                    .ok_or(ApplyError::UnknownOrder)?;
                // The locked row says what the order paid and what its refunds add up to.
                let (paid, refusal) = match row.paid_by_ticket {
                    Some(_) => (row.amount, None),
                    None => (0, Some(Refusal::OrderNotPaid)),
                };
                (row.fencing_token, paid, row.refunded_amount, refusal)
            }
            Payment::Hold(hold) => {
                let row: HoldRow = sqlx::query_as(D::LOCK_HOLD)
                    .bind(hold)
                    .bind(request.account_id)
                    .fetch_optional(&mut *tx)
                    .await?
                    .ok_or(ApplyError::UnknownHold)?;
                let recorded = row.fencing_token;
                let hold = row.read_at(now)?;
                let refusal = (hold.state != HoldState::Captured)
                    .then_some(Refusal::HoldNotHeld { state: hold.state });
                let paid = hold.captured_amount.unwrap_or(0);
                (recorded, paid, hold.refunded_amount, refusal)
            }
        };
        if recorded >= token {
            return Err(stale(request, recorded));
        }
        let credited =
            Self::credit_refund(&mut tx, request, amount, refusal, paid - refunded).await?;
        let result = match credited {
            Ok((balance, points)) => {
                let total = Self::raise_refunded(&mut tx, payment, amount, token).await?;
                let refund = Refund {
                    id: refund_id,
                    account_id: request.account_id,
                    ticket_id: request.ticket_id,
                    payment,
                    amount,
                    created_at: now.0,
                };
                Self::write_refund(&mut tx, &refund, balance, points, token).await?;
                OperationResult::Refunded {
                    refund,
                    refunded_total: total,
                    refundable: paid - total,
                    balance,
                }
            }
            Err(refusal) => {
                let (record, id) = match payment {
                    Payment::Order(order) => (RECORD_ORDER_TOKEN, order.0),
                    Payment::Hold(hold) => (RECORD_HOLD_TOKEN, hold.0),
                };
                sqlx::query(record)
                    .bind(id)
                    .bind(token)
                    .execute(&mut *tx)
                    .await
                    .or_constraint()?;
                OperationResult::Refused(refusal)
            }
        };
        self.conclude(tx, request, &result, now, render).await
    }

    /// A refund's credit: `amount` back on the account — unless `refusal` stands, the
    /// amount is above what is still `refundable`, or the balance would pass its limit.
    /// The balance and points after, or why not.
    pub(crate) async fn credit_refund(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        amount: Amount,
        refusal: Option<Refusal>,
        refundable: i64,
    ) -> Result<Result<(i64, i64), Refusal>, ApplyError> {
        let refusal = refusal.or_else(|| {
            (amount.get() > refundable).then_some(Refusal::RefundExceedsPayment { refundable })
        });
        if let Some(refusal) = refusal {
            return Ok(Err(refusal));
        }
        let credited: Option<(i64, i64)> = sqlx::query_as(CREDIT)
            .bind(request.account_id)
            .bind(amount.get())
            .fetch_optional(&mut **tx)
            .await
            .or_constraint()?;
        if let Some(credited) = credited {
            return Ok(Ok(credited));
        }
        let (balance, _, _): (i64, i64, i64) = sqlx::query_as(D::LOCK_ACCOUNT)
            .bind(request.account_id)
            .fetch_one(&mut **tx)
            .await?;
        Ok(Err(Refusal::BalanceLimit { balance }))
    }

    /// The payment's refunded total raised by `amount` under `token`: the new total.
    async fn raise_refunded(
        tx: &mut sqlx::Transaction<'static, D>,
        payment: Payment,
        amount: Amount,
        token: i64,
    ) -> Result<i64, ApplyError> {
        let (statement, id) = match payment {
            Payment::Order(order) => (REFUND_ORDER, order.0),
            Payment::Hold(hold) => (REFUND_HOLD, hold.0),
        };
        let total: Option<(i64,)> = sqlx::query_as(statement)
            .bind(id)
            .bind(amount.get())
            .bind(token)
            .fetch_optional(&mut **tx)
            .await
            .or_constraint()?;
        total.map(|(total,)| total).ok_or_else(|| {
            ApplyError::Ledger(LedgerError::Corrupt(format!(
                "{payment:?}: refundable and ours when locked, not when refunded"
            )))
        })
    }

    /// A refund's row and its entry.
    pub(crate) async fn write_refund(
        tx: &mut sqlx::Transaction<'static, D>,
        refund: &Refund,
        balance: i64,
        points: i64,
        token: i64,
    ) -> Result<(), ApplyError> {
        let (order, hold) = match refund.payment {
            Payment::Order(order) => (Some(order), None),
            Payment::Hold(hold) => (None, Some(hold)),
        };
        let now = Timestamp(refund.created_at);
        sqlx::query(INSERT_REFUND)
            .bind(refund.id)
            .bind(refund.account_id)
            .bind(refund.ticket_id)
            .bind(order)
            .bind(hold)
            .bind(refund.amount.get())
            .bind(now)
            .execute(&mut **tx)
            .await
            .or_constraint()?;
        sqlx::query(INSERT_REFUND_ENTRY)
            .bind(refund.account_id)
            .bind(refund.ticket_id)
            .bind(refund.amount.get())
            .bind(balance)
            .bind(points)
            .bind(token)
            .bind(now)
            .bind(refund.id)
            .execute(&mut **tx)
            .await
            .or_constraint()?;
        Ok(())
    }

    /// Records up to `batch` held holds past their expiry as expired, by the database's
    /// clock, in one transaction: each released from its account's `held`, and its
    /// `hold.expired` event written (`render` shows the hold as the API does). The holds
    /// expired.
    pub(crate) async fn expire_holds(
        &self,
        batch: i64,
        render: &HoldRenderer,
    ) -> Result<Vec<Hold>, LedgerError> {
        // A look first, outside any transaction: a sweep mostly finds nothing due, and then
        // takes no write transaction (SQLite's would hold up every writer).
        let due = self
            .on_live_connection(|| async {
                let mut connection = self.pool.acquire().await?;
                sqlx::query(D::HOLDS_DUE)
                    .fetch_optional(&mut *connection)
                    .await
            })
            .await?;
        if due.is_none() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin_write().await?;
        let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *tx).await?;
        let expired: Vec<Hold> = sqlx::query_as::<_, HoldRow>(D::EXPIRE_HOLDS)
            .bind(now)
            .bind(batch)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .map(|row| row.read_at(now))
            .collect::<Result<_, _>>()?;
        if expired.is_empty() {
            // Another sweeper, or a capture, came first: nothing written.
            tx.rollback().await?;
            return Ok(expired);
        }
        let mut released: BTreeMap<AccountId, i64> = BTreeMap::new();
        for hold in &expired {
            *released.entry(hold.account_id).or_default() += hold.amount.get();
        }
        // In account order, as every writer locks accounts.
        for (account, amount) in released {
            sqlx::query(RELEASE)
                .bind(account)
                .bind(0_i64)
                .bind(amount)
                .execute(&mut *tx)
                .await?;
        }
        let events: Vec<NewEvent> = expired
            .iter()
            .map(|hold| NewEvent {
                account: hold.account_id,
                ticket: hold.ticket_id,
                kind: EventType::HoldExpired,
                data: hold_data(hold.account_id, hold.ticket_id, &render(hold).to_string()),
            })
            .collect();
        let queued = record_events(&mut tx, &events, now).await?;
        commit_or_unknown(tx).await?;
        if queued {
            self.bells.ring(JobKind::Webhook);
        }
        Ok(expired)
    }

    /// The holds held, and those of them past their expiry (`Dialect::HOLD_COUNTS`).
    pub(crate) async fn count_holds(&self) -> Result<HoldCounts, LedgerError> {
        let (held, overdue): (i64, i64) = self
            .on_live_connection(|| async {
                let mut connection = self.pool.acquire().await?;
                sqlx::query_as(D::HOLD_COUNTS)
                    .fetch_one(&mut *connection)
                    .await
            })
            .await?;
        Ok(HoldCounts {
            held: (held - overdue).max(0).unsigned_abs(),
            overdue: overdue.max(0).unsigned_abs(),
        })
    }

    /// Hold `id` as of the database's clock now, if there is one.
    pub(crate) async fn find_hold(&self, id: HoldId) -> Result<Option<Hold>, LedgerError> {
        let query = || async {
            let mut connection = self.pool.acquire().await?;
            let row: Option<HoldRow> = sqlx::query_as(HOLD)
                .bind(id)
                .fetch_optional(&mut *connection)
                .await?;
            let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *connection).await?;
            Ok::<_, sqlx::Error>((row, now))
        };
        let (row, now) = self.on_live_connection(query).await?;
        row.map(|row| row.read_at(now)).transpose()
    }
}

/// Hold `id`, just placed by `request` for `amount`, expiring at `expires_at`, placed at
/// `created_at`.
fn placed_hold(
    id: HoldId,
    request: &ApplyRequest<'_>,
    amount: Amount,
    expires_at: time::OffsetDateTime,
    created_at: time::OffsetDateTime,
) -> Hold {
    Hold {
        id,
        account_id: request.account_id,
        ticket_id: request.ticket_id,
        amount,
        state: HoldState::Held,
        captured_amount: None,
        refunded_amount: 0,
        expires_at,
        created_at,
        resolved_at: None,
        resolved_by_ticket: None,
    }
}

/// A hold's step through the group commit (`hold_batch.rs`): `shown` is the hold as its
/// outcome shows it, with stand-ins for what the statement fills in; `step` the hold's id,
/// the amount the step takes or sets aside, and a placing's lifetime in seconds. `None`
/// when the transaction path must settle it (see
/// [`answer_from_batch`](crate::apply::answer_from_batch)), or the body cannot be filled
/// in by the database.
async fn in_batch(
    batcher: &Batcher<HoldStep>,
    request: &ApplyRequest<'_>,
    shown: Hold,
    (hold, amount, lifetime): (HoldId, i64, i64),
    token: i64,
    render: &Renderer,
) -> Option<Result<Applied, ApplyError>> {
    let stand_in = OperationResult::HoldChanged {
        hold: shown,
        balance: BALANCE_STAND_IN,
        available: AVAILABLE_STAND_IN,
    };
    let (stored, kind) = stored_in_batch(request, &stand_in, render)?;
    let step = HoldStep {
        stored,
        hold_id: hold.0,
        amount,
        lifetime,
        token,
    };
    answer_from_batch(batcher.apply(step).await, request, kind, token)
}
