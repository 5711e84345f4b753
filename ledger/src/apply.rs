//! The transaction that applies an operation under a ticket (see the crate docs): the
//! statements, what an operation would move ([`Planned`]), and its steps — through the
//! group commit first on PostgreSQL, else lock and judge the ticket, move under the fencing
//! check, write the entry and store the outcome; an order payment under its order's lock.

use serde_json::Value;
use sqlx::{Decode, Encode, Executor, FromRow, Type};

use crate::batch::{self, Batcher};
use crate::bells::JobKind;
use crate::db_types::{JsonText, Timestamp};
use crate::dialect::Dialect;
use crate::error::{ApplyError, LedgerError, ResultExt, commit_or_unknown};
use crate::events::announce_outcome;
use crate::lottery;
use crate::model::{
    AccountId, Amount, Applied, ApplyRequest, EntryKind, Judgement, Operation, OperationResult,
    OrderId, OutcomeKind, Refusal, Renderer, StoredResponse, Ticket, TicketId,
};
use crate::rows::{INSERT_ENTRY, OrderRow, TicketRow, token_to_sql};
use crate::sql_store::SqlStore;
use crate::stand_ins::{BALANCE_STAND_IN, POINTS_STAND_IN, substitutable};
use crate::webhooks::{EventId, EventType, event_of_outcome};

/// An order payment's entry: [`INSERT_ENTRY`]'s parameters ($5, points, is 0) and $10
/// the order.
const INSERT_ORDER_PAYMENT: &str = "
    INSERT INTO entries (account_id, ticket_id, kind, amount, points, balance_after,
                         points_after, fencing_token, created_at, order_id)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// Whether what is left after a debit of `$debit` still covers the account's holds — the
/// condition every debit's conditional update carries, so that no read comes before the
/// write: `available` = balance − the holds held and not expired, never negative.
///
/// First against `held`, on the row being updated: it counts a hold past its expiry until
/// the sweeper records it, so where it covers the debit the holds not expired do too, and
/// the spend pays one comparison. Only where it does not are the holds not expired at
/// `$now` (the database's clock, read in the transaction) added up, in the same statement
/// — a subquery evaluated only when reached. A debit of 0 (a deposit, a draw) checks
/// nothing: a credit cannot make available negative.
macro_rules! available_covers {
    ($debit:literal, $now:literal) => {
        concat!(
            "(",
            $debit,
            " = 0 OR balance - ",
            $debit,
            " >= held OR balance - ",
            $debit,
            " >= (SELECT coalesce(sum(h.amount), 0) FROM holds h
                  WHERE h.account_id = accounts.id AND h.state = 'held' AND h.expires_at > ",
            $now,
            "))"
        )
    };
}
pub(crate) use available_covers;

/// What the holds of account $1 not expired at $2 set aside.
pub(crate) const SET_ASIDE: &str = "
    SELECT CAST(coalesce(sum(amount), 0) AS BIGINT) FROM holds
    WHERE account_id = $1 AND state = 'held' AND expires_at > $2";

/// An order payment's move: the order's amount out of the account if the money available
/// covers it (`available_covers!`). No fencing token here — the lock the payer holds is
/// the order's, whose token is checked and recorded on the order; the balance is still
/// only ever changed by a conditional update, so payments and withdrawals of one account
/// cannot overdraw it between them. Parameters: $1 account, $2 amount, $3 now.
const MOVE_FOR_ORDER: &str = concat!(
    "UPDATE accounts SET balance = balance - $2
     WHERE id = $1 AND balance >= $2 AND ",
    available_covers!("$2", "$3"),
    " RETURNING balance, points"
);

/// Records an order payment attempt's token (checked newer by the caller, on the locked
/// row) and, when it paid, the paying ticket. Parameters: $1 order, $2 token, $3 paying
/// ticket or NULL, $4 when or NULL, $5 the order's account.
const RECORD_ORDER: &str = "
    UPDATE orders
    SET fencing_token = $2, paid_by_ticket = coalesce($3, paid_by_ticket),
        paid_at = coalesce($4, paid_at)
    WHERE id = $1 AND account_id = $5 AND fencing_token < $2";

/// The operation as one conditional update: it moves the money and points and records the
/// fencing token only if the token is newer than any the account accepted, the balance
/// covers the debit, the points cover the spend, and the credit cannot overflow.
/// Concurrent updates of one account serialise on its row and each re-checks the
/// condition, so there is no read-then-write race even without the lock. Written so that
/// no sub-expression can overflow: amounts are at most 10^12 and credits 10^14.
///
/// Newer, not "at least as new": a grant's token is used for one write, so an equal token
/// is a second holder carrying the same number — after the lock store lost its counters
/// and handed a number out again — and the later of the two must not write.
///
/// A debit is also held to the money available (`available_covers!`, $6 now).
const MOVE: &str = concat!(
    "UPDATE accounts
     SET balance = balance - $2 + $3, points = points - $4, fencing_token = $5
     WHERE id = $1 AND fencing_token < $5 AND balance >= $2 AND points >= $4
       AND balance - $2 <= 9223372036854775807 - $3 AND ",
    available_covers!("$2", "$6"),
    " RETURNING balance, points"
);

/// A business refusal records the token like any write: a later grant's write must still
/// be newer. Parameters: $1 account, $2 token (checked newer by the caller, on the locked
/// row).
pub(crate) const RECORD_TOKEN: &str = "
    UPDATE accounts SET fencing_token = $2 WHERE id = $1 AND fencing_token < $2";

/// Stores a ticket's outcome. Parameters: $1 ticket, $2 operation, $3 fingerprint,
/// $4 status, $5 body, $6 when, $7 the ticket's account (already known to own it: named so
/// that the statement reaches one account's rows, as a ledger partitioned by account needs).
const COMPLETE_TICKET: &str = "
    UPDATE tickets
    SET operation = $2, fingerprint = $3, response_status = $4, response_body = $5,
        completed_at = $6
    WHERE id = $1 AND account_id = $7";

/// How many minor units one lottery draw credits, given the prize and the points spent.
fn prize_credit(prize: &lottery::Prize, points: i64) -> i64 {
    prize.credit_per_point.saturating_mul(points)
}

/// What an operation would move, worked out before the transaction.
pub(crate) struct Planned {
    debit: i64,
    credit: i64,
    spend: i64,
    prize: Option<&'static lottery::Prize>,
}

impl Planned {
    pub(crate) fn of(operation: Operation) -> Self {
        match operation {
            Operation::Withdrawal(amount) => Self {
                debit: amount.get(),
                credit: 0,
                spend: 0,
                prize: None,
            },
            Operation::Deposit(amount) => Self {
                debit: 0,
                credit: amount.get(),
                spend: 0,
                prize: None,
            },
            // Holds and refunds run on paths of their own (`holding.rs`), never planned
            // here; what they would ask of the account, for completeness.
            Operation::Hold { amount, .. } => Self {
                debit: amount.get(),
                credit: 0,
                spend: 0,
                prize: None,
            },
            Operation::Capture { .. } | Operation::Void { .. } => Self {
                debit: 0,
                credit: 0,
                spend: 0,
                prize: None,
            },
            Operation::Refund { amount, .. } => Self {
                debit: 0,
                credit: amount.get(),
                spend: 0,
                prize: None,
            },
            Operation::OrderPayment { amount, .. } | Operation::Payout { amount, .. } => Self {
                debit: amount.get(),
                credit: 0,
                spend: 0,
                prize: None,
            },
            // Drawn before we know the ticket is usable; a replay simply discards it.
            Operation::LotteryDraw(points) => {
                let prize = lottery::draw();
                Self {
                    debit: 0,
                    credit: prize_credit(prize, points.get()),
                    spend: points.get(),
                    prize: Some(prize),
                }
            }
        }
    }

    /// The outcome once the move happened, leaving `balance` and `points`.
    fn applied(&self, balance: i64, points: i64) -> OperationResult {
        OperationResult::Applied {
            balance,
            points,
            credit: self.credit,
            prize: self.prize,
        }
    }

    /// Why an account holding `balance` and `points`, `set_aside` of the balance by its
    /// holds, cannot take this operation, if it cannot.
    fn refusal(&self, balance: i64, set_aside: i64, points: i64) -> Option<Refusal> {
        if self.debit > 0 && balance - set_aside < self.debit {
            Some(Refusal::InsufficientFunds { balance })
        } else if points < self.spend {
            Some(Refusal::InsufficientPoints { points })
        } else if balance - self.debit > i64::MAX - self.credit {
            Some(Refusal::BalanceLimit { balance })
        } else {
            None
        }
    }
}

/// The steps of [`Store::apply`](crate::store::Store::apply), each one round trip or two.
impl<D> SqlStore<D>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> i64: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> i32: Encode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> AccountId: Encode<'q, D> + Type<D>,
    for<'q> TicketId: Encode<'q, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Type<D>,
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
{
    /// [`Store::apply`](crate::store::Store::apply): an order payment on the transaction
    /// path; any other spend through the group commit first where there is one, else (or
    /// when the batch leaves it to the transaction path) in one transaction.
    pub(crate) async fn apply_operation(
        &self,
        request: &ApplyRequest<'_>,
        render: &Renderer,
    ) -> Result<Applied, ApplyError> {
        let token = token_to_sql(request.fencing_token)?;
        if let Operation::OrderPayment { order, amount } = request.operation {
            return self
                .pay_order_in_transaction(request, order, amount, token, render)
                .await;
        }
        let planned = Planned::of(request.operation);
        if let Some(batcher) = &self.batcher
            && let Some(answer) =
                Self::apply_in_batch(batcher, request, &planned, token, render).await
        {
            return answer;
        }
        self.apply_in_transaction(request, &planned, token, render)
            .await
    }

    /// The usual path on PostgreSQL: the spend goes into the next batch (`batch.rs`), one
    /// round trip for the ticket's judgement, the move, the entry and the outcome. `None`
    /// when the transaction path must settle it: a refusal (the batch wrote nothing for
    /// it; the transaction path stores it), a batch the database refused, or a renderer
    /// whose success body the database cannot fill in.
    async fn apply_in_batch(
        batcher: &Batcher,
        request: &ApplyRequest<'_>,
        planned: &Planned,
        token: i64,
        render: &Renderer,
    ) -> Option<Result<Applied, ApplyError>> {
        let stand_in = OperationResult::Applied {
            balance: BALANCE_STAND_IN,
            points: POINTS_STAND_IN,
            credit: planned.credit,
            prize: planned.prize,
        };
        let (stored, kind) = stored_in_batch(request, &stand_in, render)?;
        let spend = batch::Spend {
            stored,
            debit: planned.debit,
            credit: planned.credit,
            points: planned.spend,
            token,
        };
        answer_from_batch(batcher.apply(spend).await, request, kind, token)
    }

    /// The transaction path: every step its own statement, in one transaction. Every early
    /// return drops the transaction, which rolls it back: nothing is written unless the
    /// whole operation and its outcome are.
    async fn apply_in_transaction(
        &self,
        request: &ApplyRequest<'_>,
        planned: &Planned,
        token: i64,
        render: &Renderer,
    ) -> Result<Applied, ApplyError> {
        let mut tx = self.begin_write().await?;
        // 1-2. Lock the ticket and judge it.
        let now = match Self::lock_and_judge(&mut tx, request).await? {
            Ok(now) => now,
            Err(answer) => return answer,
        };
        // 3. Move money and points under the fencing check.
        let result = Self::move_or_refuse(&mut tx, request, planned, token, now).await?;
        // 4. The entry (only when something moved) and the outcome, in this transaction.
        Self::record_entry(&mut tx, request, planned, &result, token, now).await?;
        self.conclude(tx, request, &result, now, render).await
    }

    /// Steps 1 and 2 of every transaction that spends a ticket: lock the ticket, so
    /// concurrent uses of it queue here until we commit, and read the database's clock
    /// once the lock is ours; then judge it — a used one replays its stored outcome or
    /// refuses a different request, an expired one is refused. The clock's reading if the
    /// ticket is usable, else the answer.
    pub(crate) async fn lock_and_judge(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
    ) -> Result<Result<Timestamp, Result<Applied, ApplyError>>, ApplyError> {
        let row: Option<TicketRow> = sqlx::query_as(D::LOCK_TICKET)
            .bind(request.ticket_id)
            .bind(request.account_id)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(judged(row, request).map(|ticket| Timestamp(ticket.read_at)))
    }

    /// An order payment, on the transaction path (both databases): the ticket locked and
    /// judged as for every spend; then the order locked, its fencing token checked and
    /// recorded (the payer holds the order's lock, not the account's); an order already
    /// paid refused with 409, stored; else the amount taken from the account by a
    /// conditional update (402, stored, when the balance does not cover it — the order
    /// stays open); and on success the entry, carrying the order, and the order marked
    /// paid by this ticket. All in one transaction, with the outcome.
    async fn pay_order_in_transaction(
        &self,
        request: &ApplyRequest<'_>,
        order_id: OrderId,
        amount: Amount,
        token: i64,
        render: &Renderer,
    ) -> Result<Applied, ApplyError> {
        let mut tx = self.begin_write().await?;
        let now = match Self::lock_and_judge(&mut tx, request).await? {
            Ok(now) => now,
            Err(answer) => return answer,
        };
        let order = Self::lock_order(&mut tx, request, order_id, amount, token).await?;
        let result = match order.paid_by_ticket {
            Some(paid_by) => OperationResult::Refused(Refusal::OrderAlreadyPaid { paid_by }),
            None => Self::take_for_order(&mut tx, request, amount, now).await?,
        };
        Self::record_order_payment(&mut tx, request, order_id, amount, token, &result, now).await?;
        self.conclude(tx, request, &result, now, render).await
    }

    /// An order payment's order, locked: found with its account and of the amount the
    /// request names (else [`ApplyError::UnknownOrder`]), and its recorded token older than
    /// `token` (else stale).
    async fn lock_order(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        order_id: OrderId,
        amount: Amount,
        token: i64,
    ) -> Result<OrderRow, ApplyError> {
        let order: OrderRow = sqlx::query_as(D::LOCK_ORDER)
            .bind(order_id)
            .bind(request.account_id)
            .fetch_optional(&mut **tx)
            .await?
            .filter(|order: &OrderRow| order.amount == amount.get())
            .ok_or(ApplyError::UnknownOrder)?;
        if order.fencing_token >= token {
            return Err(stale(request, order.fencing_token));
        }
        // What the payment goes on to do records `token` on the order: only ever over an
        // older one.
        debug_assert!(
            token > order.fencing_token,
            "order {order_id}: token {token} recorded over {}",
            order.fencing_token
        );
        Ok(order)
    }

    /// An open order's amount taken from the account by a conditional update, or refused
    /// (402) with the balance whose available part did not cover it.
    async fn take_for_order(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        amount: Amount,
        now: Timestamp,
    ) -> Result<OperationResult, ApplyError> {
        let moved: Option<(i64, i64)> = sqlx::query_as(MOVE_FOR_ORDER)
            .bind(request.account_id)
            .bind(amount.get())
            .bind(now)
            .fetch_optional(&mut **tx)
            .await
            .or_constraint()?;
        Ok(match moved {
            Some((balance, points)) => OperationResult::Applied {
                balance,
                points,
                credit: 0,
                prize: None,
            },
            None => {
                let (balance, _, _): (i64, i64, i64) = sqlx::query_as(D::LOCK_ACCOUNT)
                    .bind(request.account_id)
                    .fetch_one(&mut **tx)
                    .await?;
                OperationResult::Refused(Refusal::InsufficientFunds { balance })
            }
        })
    }

    /// The order's token recorded and, when `result` paid it, the order marked paid by this
    /// ticket and the payment's entry, carrying the order.
    async fn record_order_payment(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        order_id: OrderId,
        amount: Amount,
        token: i64,
        result: &OperationResult,
        now: Timestamp,
    ) -> Result<(), ApplyError> {
        let paid = matches!(result, OperationResult::Applied { .. });
        sqlx::query(RECORD_ORDER)
            .bind(order_id)
            .bind(token)
            .bind(paid.then_some(request.ticket_id))
            .bind(paid.then_some(now))
            .bind(request.account_id)
            .execute(&mut **tx)
            .await
            .or_constraint()?;
        if let OperationResult::Applied {
            balance, points, ..
        } = *result
        {
            sqlx::query(INSERT_ORDER_PAYMENT)
                .bind(request.account_id)
                .bind(request.ticket_id)
                .bind(EntryKind::OrderPayment.as_str())
                .bind(-amount.get())
                .bind(0_i64)
                .bind(balance)
                .bind(points)
                .bind(token)
                .bind(now)
                .bind(order_id)
                .execute(&mut **tx)
                .await
                .or_constraint()?;
        }
        Ok(())
    }

    /// Step 3 of a spend on the transaction path: money and points moved under the
    /// fencing check, in one conditional update; if it was refused, why, found on the
    /// account's latest version.
    pub(crate) async fn move_or_refuse(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        planned: &Planned,
        token: i64,
        now: Timestamp,
    ) -> Result<OperationResult, ApplyError> {
        Ok(
            match Self::try_move(tx, request, planned, token, now).await? {
                Some((balance, points)) => planned.applied(balance, points),
                None => Self::settle_refused(tx, request, planned, token, now).await?,
            },
        )
    }

    /// Step 3: the conditional move.
    async fn try_move(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        planned: &Planned,
        token: i64,
        now: Timestamp,
    ) -> Result<Option<(i64, i64)>, ApplyError> {
        Ok(sqlx::query_as::<_, (i64, i64)>(MOVE)
            .bind(request.account_id)
            .bind(planned.debit)
            .bind(planned.credit)
            .bind(planned.spend)
            .bind(token)
            .bind(now)
            .fetch_optional(&mut **tx)
            .await
            .or_constraint()?)
    }

    /// Step 3 after a refused move: a stale token (nothing may be written), or a business
    /// refusal, which is recorded with the token like any other outcome. Judged on the
    /// account's latest version, locked: if that version affords the operation after all
    /// — another writer committed in between, which only overlapping lock holders allow —
    /// the move is made now, since this transaction holds the row and the conditions
    /// cannot change again.
    async fn settle_refused(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        planned: &Planned,
        token: i64,
        now: Timestamp,
    ) -> Result<OperationResult, ApplyError> {
        let (balance, points, recorded): (i64, i64, i64) = sqlx::query_as(D::LOCK_ACCOUNT)
            .bind(request.account_id)
            .fetch_one(&mut **tx)
            .await?;
        // What the holds set aside now: a debit is judged by the money available.
        let set_aside = if planned.debit > 0 {
            Self::set_aside(tx, request.account_id, now).await?
        } else {
            0
        };
        if recorded >= token {
            return Err(stale(request, recorded));
        }
        // Whatever follows records `token` on the account — with the refusal, or by the
        // move: only ever over an older one.
        debug_assert!(
            token > recorded,
            "account {}: token {token} recorded over {recorded}",
            request.account_id
        );
        match planned.refusal(balance, set_aside, points) {
            Some(refusal) => {
                sqlx::query(RECORD_TOKEN)
                    .bind(request.account_id)
                    .bind(token)
                    .execute(&mut **tx)
                    .await
                    .or_constraint()?;
                Ok(OperationResult::Refused(refusal))
            }
            None => match Self::try_move(tx, request, planned, token, now).await? {
                Some((balance, points)) => Ok(planned.applied(balance, points)),
                None => Err(ApplyError::Ledger(LedgerError::Corrupt(format!(
                    "account {}: a move its locked row affords was refused",
                    request.account_id
                )))),
            },
        }
    }

    /// What the holds of `account` not expired at `now` set aside ([`SET_ASIDE`]).
    pub(crate) async fn set_aside(
        tx: &mut sqlx::Transaction<'static, D>,
        account: AccountId,
        now: Timestamp,
    ) -> Result<i64, LedgerError> {
        let (set_aside,): (i64,) = sqlx::query_as(SET_ASIDE)
            .bind(account)
            .bind(now)
            .fetch_one(&mut **tx)
            .await?;
        Ok(set_aside)
    }

    /// Step 4, first half: the entry, only when something moved.
    async fn record_entry(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        planned: &Planned,
        result: &OperationResult,
        token: i64,
        now: Timestamp,
    ) -> Result<(), ApplyError> {
        if let OperationResult::Applied {
            balance, points, ..
        } = *result
        {
            sqlx::query(INSERT_ENTRY)
                .bind(request.account_id)
                .bind(request.ticket_id)
                .bind(request.operation.kind().as_str())
                .bind(planned.credit - planned.debit)
                .bind(-planned.spend)
                .bind(balance)
                .bind(points)
                .bind(token)
                .bind(now)
                .execute(&mut **tx)
                .await
                .or_constraint()?;
        }
        Ok(())
    }

    /// The last step of every transaction that spends a ticket: the outcome rendered and
    /// stored under the ticket with its kind's status, its event written, the transaction
    /// committed, and the webhook workers rung if the event queued deliveries.
    pub(crate) async fn conclude(
        &self,
        mut tx: sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        result: &OperationResult,
        now: Timestamp,
        render: &Renderer,
    ) -> Result<Applied, ApplyError> {
        let execution = request.execution(result);
        let (kind, body) = (execution.kind(), render(&execution));
        let (operation, status) = (request.operation.kind().as_str(), kind.status());
        Self::complete_ticket(&mut tx, request, operation, status, &body, now).await?;
        let queued = announce_outcome(&mut tx, request, kind, now).await?;
        commit_or_unknown(tx).await?;
        if queued {
            self.bells.ring(JobKind::Webhook);
        }
        Ok(Applied {
            kind,
            response: StoredResponse { status, body },
            replayed: false,
        })
    }

    /// Stores the outcome under the ticket. Parameters as in [`COMPLETE_TICKET`].
    pub(crate) async fn complete_ticket(
        tx: &mut sqlx::Transaction<'static, D>,
        request: &ApplyRequest<'_>,
        kind: &str,
        status: u16,
        body: &Value,
        now: Timestamp,
    ) -> Result<(), LedgerError> {
        let body = body.to_string();
        sqlx::query(COMPLETE_TICKET)
            .bind(request.ticket_id)
            .bind(kind)
            .bind(request.fingerprint)
            .bind(i32::from(status))
            .bind(JsonText(&body))
            .bind(now)
            .bind(request.account_id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

/// What `request` stores under its ticket if the group commit writes it, for the outcome
/// `stand_in` (with stand-ins for what the statement fills in), and that outcome's kind;
/// `None` when the body cannot be filled in by the database.
pub(crate) fn stored_in_batch(
    request: &ApplyRequest<'_>,
    stand_in: &OperationResult,
    render: &Renderer,
) -> Option<(batch::Stored, OutcomeKind)> {
    let kind = OutcomeKind::of(&request.operation, stand_in);
    let stored = batch::Stored {
        ticket_id: request.ticket_id,
        account_id: request.account_id,
        kind: request.operation.kind().as_str(),
        fingerprint: request.fingerprint.to_owned(),
        body: substitutable(&render(&request.execution(stand_in)))?,
        status: kind.status(),
        event: event_of_outcome(request.operation.kind(), kind).map(EventType::as_str),
    };
    Some((stored, kind))
}

/// What a group commit (`batch.rs`, `hold_batch.rs`) answered for `request`, sent with
/// `token` to come to `kind` if written: the written outcome; a used ticket's answer; a
/// stale token, refused as the transaction path would; the batch's failure. `None` when
/// the transaction path must settle it: a refusal (the batch wrote nothing for it; the
/// transaction path stores it), or a batch the database refused.
pub(crate) fn answer_from_batch(
    done: Result<batch::Done, batch::Failed>,
    request: &ApplyRequest<'_>,
    kind: OutcomeKind,
    token: i64,
) -> Option<Result<Applied, ApplyError>> {
    let done = match done {
        Ok(done) => done,
        Err(failed) => return failed.error().map(|error| Err(error.into())),
    };
    if let Some(body) = done.written {
        return Some(Ok(Applied {
            kind,
            response: StoredResponse {
                status: kind.status(),
                body,
            },
            replayed: false,
        }));
    }
    if let Err(answer) = judged(done.ticket, request) {
        return Some(answer);
    }
    match done.recorded_token {
        Some(recorded) if recorded >= token => Some(Err(stale(request, recorded))),
        _ => None,
    }
}

/// The refusal of `request`'s token, which the `recorded` one — of the account, or of the
/// order or hold whose lock the spend ran under — already passed.
pub(crate) fn stale(request: &ApplyRequest<'_>, recorded: i64) -> ApplyError {
    ApplyError::StaleToken {
        presented: request.fencing_token,
        recorded: recorded.max(0).unsigned_abs(),
    }
}

/// The one judgement of a ticket before anything moves ([`Ticket::judge`]), as `apply`
/// answers it: the ticket if it is usable, else the answer — its stored outcome replayed,
/// or why it cannot run. Another account's ticket is, to this account, no ticket at all.
fn judged(
    row: Option<TicketRow>,
    request: &ApplyRequest<'_>,
) -> Result<Ticket, Result<Applied, ApplyError>> {
    let ticket = match row {
        Some(row) if row.account_id == request.account_id => {
            Ticket::try_from(row).map_err(|error| Err(error.into()))?
        }
        _ => return Err(Err(ApplyError::UnknownTicket)),
    };
    let refusal = match ticket.judge(request.fingerprint) {
        Judgement::Usable => return Ok(ticket),
        Judgement::Replay(response) => {
            let kind = ticket.outcome.as_ref().and_then(|outcome| outcome.kind());
            let Some(kind) = kind else {
                return Err(Err(ApplyError::Ledger(LedgerError::Corrupt(format!(
                    "ticket {}: stored status {} is no outcome of its operation",
                    ticket.id, response.status
                )))));
            };
            return Err(Ok(Applied {
                kind,
                response: response.clone(),
                replayed: true,
            }));
        }
        Judgement::Reused => ApplyError::FingerprintMismatch,
        Judgement::Pruned => ApplyError::OutcomePruned,
        Judgement::Expired => ApplyError::TicketExpired,
    };
    Err(Err(refusal))
}
