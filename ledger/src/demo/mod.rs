//! **Demonstration only** (cargo feature `demo`): the unguarded read-check-write that the
//! classic lock recipes rely on, for payonce's lock services × faults demonstration — an
//! account read without any lock, an operation decided from that read, and the resulting
//! balance and points written as absolute values without any fencing check. A production
//! build has none of it, so it cannot write so.
//!
//! This file: [`Ledger::read_unguarded`], [`Ledger::write_unguarded`] and the decision
//! between them; `unguarded.rs`: the statements, behind the store.

pub(crate) mod unguarded;

use crate::Ledger;
use crate::db_types::Timestamp;
use crate::error::{ApplyError, LedgerError};
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

/// The decision the application makes from a read, for the demonstration's
/// read-check-write: (result, debit, credit, points spent); `None` for holds and refunds,
/// which the demonstration does not write unguarded.
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
}
