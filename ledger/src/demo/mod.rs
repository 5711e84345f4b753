//! **Demonstration only** (cargo feature `demo`): the unguarded read-check-write that the
//! classic lock recipes rely on, for payonce's lock services × faults demonstration — an
//! account read without any lock, an operation decided from that read, and the resulting
//! balance and points written as absolute values without any fencing check. A production
//! build has none of it, so it cannot write so.
//!
//! Refunds the same way: the payment read without any lock, the refund decided from that
//! read, and the payment's refunded total written as an absolute value — so two refunds
//! that read the same total both pass, and together give back more than was paid.
//!
//! This file: [`Ledger::read_unguarded`], [`Ledger::write_unguarded`] and the decision
//! between them; [`Ledger::read_payment_unguarded`] and [`Ledger::refund_unguarded`];
//! `unguarded.rs`: the statements, behind the store.

pub(crate) mod unguarded;

use crate::Ledger;
use crate::db_types::Timestamp;
use crate::error::{ApplyError, LedgerError};
use crate::holds::{HoldState, Payment};
use crate::lottery;
use crate::model::{
    AccountId, Applied, ApplyRequest, Operation, OperationResult, Refusal, Renderer, TicketId,
};
use unguarded::UnguardedWrite;

/// An account as an unguarded read saw it (see [`Ledger::read_unguarded`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnguardedRead {
    /// The balance then.
    pub balance: i64,
    /// The points then.
    pub points: i64,
    /// The account's recorded fencing token then (written on the entry unchanged).
    pub fencing_token: u64,
}

/// A payment as an unguarded read saw it (see [`Ledger::read_payment_unguarded`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnguardedPayment {
    /// What it paid (0 when it cannot be refunded).
    paid: i64,
    /// What its refunds added up to then.
    refunded: i64,
    /// Its recorded fencing token then (written on the refund's entry unchanged).
    fencing_token: i64,
    /// Why it cannot be refunded at all, if so: an order not paid, a hold not captured.
    refusal: Option<Refusal>,
}

/// The decision the application makes from a read, for the demonstration's
/// read-check-write: (result, debit, credit, points spent); `None` for holds and refunds,
/// which are not written so (refunds have their own read and write).
fn decide(operation: Operation, read: &UnguardedRead) -> Option<(OperationResult, i64, i64, i64)> {
    let (balance, points) = (read.balance, read.points);
    Some(match operation {
        Operation::Hold { .. }
        | Operation::Capture { .. }
        | Operation::Void { .. }
        | Operation::Refund { .. } => return None,
        // (The API runs order payments and payouts fenced only; the arm keeps the match
        // whole.)
        Operation::Withdrawal(amount)
        | Operation::OrderPayment { amount, .. }
        | Operation::Payout { amount, .. } => {
            let amount = amount.get();
            let result = if balance >= amount {
                OperationResult::Applied {
                    balance: balance - amount,
                    points,
                    credit: 0,
                    prize: None,
                }
            } else {
                OperationResult::Refused(Refusal::InsufficientFunds { balance })
            };
            (result, amount, 0, 0)
        }
        Operation::Deposit(amount) => {
            let amount = amount.get();
            let result = match balance.checked_add(amount) {
                Some(after) => OperationResult::Applied {
                    balance: after,
                    points,
                    credit: 0,
                    prize: None,
                },
                None => OperationResult::Refused(Refusal::BalanceLimit { balance }),
            };
            (result, 0, amount, 0)
        }
        Operation::LotteryDraw(spend) => {
            let spend = spend.get();
            let prize = lottery::draw();
            let credit = prize.credit_per_point.saturating_mul(spend);
            let result = if points < spend {
                OperationResult::Refused(Refusal::InsufficientPoints { points })
            } else {
                match balance.checked_add(credit) {
                    Some(after) => OperationResult::Applied {
                        balance: after,
                        points: points - spend,
                        credit,
                        prize: Some(prize),
                    },
                    None => OperationResult::Refused(Refusal::BalanceLimit { balance }),
                }
            };
            (result, 0, credit, spend)
        }
    })
}

impl Ledger {
    /// **Demonstration only** — the first half of the read-check-write that the classic
    /// lock recipes rely on (payonce's lock services × faults demonstration): the account as
    /// it is now, read without any lock. The `fenced` strategy never calls this.
    pub async fn read_unguarded(
        &self,
        account_id: AccountId,
    ) -> Result<UnguardedRead, LedgerError> {
        let (balance, points, token) = self
            .store
            .unguarded()
            .holdings(account_id)
            .await?
            .ok_or_else(|| LedgerError::Corrupt(format!("account {account_id} vanished")))?;
        Ok(UnguardedRead {
            balance,
            points,
            fencing_token: token.max(0).unsigned_abs(),
        })
    }

    /// **Demonstration only** — the second half: decides the operation from `read` (which
    /// may be stale by now) and writes the resulting balance and points as absolute values,
    /// with the entry and the outcome, without any fencing check. Two requests that read
    /// the same balance both succeed and the second write erases the first: the double
    /// spend the demonstration exists to show. `None` means another request completed the
    /// ticket first (the caller replays it).
    pub async fn write_unguarded(
        &self,
        ticket_id: TicketId,
        account_id: AccountId,
        operation: Operation,
        fingerprint: &str,
        read: &UnguardedRead,
        render: &Renderer,
    ) -> Result<Option<Applied>, ApplyError> {
        let (result, debit, credit, spend) = decide(operation, read).ok_or_else(|| {
            LedgerError::Corrupt(format!(
                "{} is not written unguarded",
                operation.kind().as_str()
            ))
        })?;
        let write = UnguardedWrite {
            request: ApplyRequest {
                ticket_id,
                account_id,
                operation,
                fingerprint,
                fencing_token: read.fencing_token,
            },
            result,
            debit,
            credit,
            spend,
        };
        self.store
            .unguarded()
            .write(&write, render, Timestamp::now())
            .await
    }

    /// **Demonstration only** — the first half of an unguarded refund: `payment` of
    /// `account_id` as it is now, read without any lock. The `fenced` strategy never calls
    /// this.
    pub async fn read_payment_unguarded(
        &self,
        account_id: AccountId,
        payment: Payment,
    ) -> Result<UnguardedPayment, ApplyError> {
        let unknown = match payment {
            Payment::Order(_) => ApplyError::UnknownOrder,
            Payment::Hold(_) => ApplyError::UnknownHold,
        };
        let (paid, refunded, fencing_token) = self
            .store
            .unguarded()
            .payment(account_id, payment)
            .await?
            .ok_or(unknown)?;
        let refusal = match (paid, payment) {
            (Some(_), _) => None,
            (None, Payment::Order(_)) => Some(Refusal::OrderNotPaid),
            (None, Payment::Hold(hold)) => {
                // Held, voided or expired: which, as the API shows it.
                let state = self
                    .store
                    .hold(hold)
                    .await?
                    .map_or(HoldState::Held, |hold| hold.state);
                Some(Refusal::HoldNotHeld { state })
            }
        };
        Ok(UnguardedPayment {
            paid: paid.unwrap_or(0),
            refunded,
            fencing_token,
            refusal,
        })
    }

    /// **Demonstration only** — the second half: decides the refund (`operation`) from
    /// `read` (which may be stale by now), credits the account, and writes the payment's
    /// refunded total as the read's plus this refund — over any refund that came between.
    /// Two refunds that read the same total both pass, and give back more than was paid:
    /// what the demonstration exists to show. `None` means another request completed the
    /// ticket first (the caller replays it); [`ApplyError::Overtaken`], that a refund
    /// since raised the total above what this one would write (nothing written).
    pub async fn refund_unguarded(
        &self,
        ticket_id: TicketId,
        account_id: AccountId,
        operation: Operation,
        fingerprint: &str,
        read: &UnguardedPayment,
        render: &Renderer,
    ) -> Result<Option<Applied>, ApplyError> {
        let Operation::Refund {
            refund,
            payment,
            amount,
        } = operation
        else {
            return Err(LedgerError::Corrupt(format!(
                "{} is not a refund",
                operation.kind().as_str()
            ))
            .into());
        };
        let request = ApplyRequest {
            ticket_id,
            account_id,
            operation,
            fingerprint,
            fencing_token: read.fencing_token.max(0).unsigned_abs(),
        };
        self.store
            .unguarded()
            .refund(&request, refund, payment, amount, read, render)
            .await
    }
}
