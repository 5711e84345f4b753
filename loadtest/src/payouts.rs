//! The payouts' part of the audit: money that leaves for the bank. Pure, like the rest of
//! the audit.
//!
//! A payout's spend is judged like a withdrawal (its ticket, its answers — 202 where a
//! withdrawal's is 201 —, one `payout` entry). What is particular comes after the answer:
//! - per account ([`audit_reversals`]): a payout the bank refused for good (`failed`) gives
//!   its money back in exactly one `payout_reversal` entry of its amount; any other payout
//!   has none, and no reversal names a payout the account did not send;
//! - against the bank ([`reconcile`], when the run was given it): each payout is executed
//!   at the bank at most once — by every transfer whose reference is the payout, whatever
//!   its key —, a `succeeded` one exactly once with its amount, a `failed` one never.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::Value;

use crate::history::{
    AccountState, FinalState, PayoutState, PayoutStatus, SpendKind, SpendRecord, TransferState,
};
use crate::violation::{Flag, Violation, ViolationKind};

/// The run's payouts as they ended, and what the bank holds for them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PayoutTally {
    /// Payouts of the run's accounts.
    pub payouts: usize,
    /// Of those, `succeeded`.
    pub succeeded: usize,
    /// `failed`: the bank refused, the money came back.
    pub failed: usize,
    /// Still `pending` when the run stopped waiting.
    pub pending: usize,
    /// The most calls to the bank one payout took.
    pub most_attempts: u32,
    /// Whether the bank's transfers were read (the run was given the bank).
    pub bank_read: bool,
    /// Transfers the bank executed for the run's payouts.
    pub executed_at_bank: usize,
    /// Executions beyond the first of one payout: money paid out twice.
    pub executed_twice: usize,
    /// `succeeded` payouts the bank has no executed transfer of that amount for.
    pub missing_at_bank: usize,
    /// `failed` payouts — their money given back — that the bank executed all the same.
    pub reversed_but_executed: usize,
}

/// Checks the account's `payout_reversal` entries against its executed payouts (ticket
/// → the spend and its answer), and adds the money of each failed one back to `expected`.
pub(crate) fn audit_reversals(
    executed: &HashMap<&str, (&SpendRecord, Value)>,
    account: &AccountState,
    state: &FinalState,
    expected: &mut (i64, i64),
    flag: &mut Flag<'_>,
) {
    let mut reversals: HashMap<&str, Vec<i64>> = HashMap::new();
    for entry in account
        .entries
        .iter()
        .filter(|entry| entry.kind == "payout_reversal")
    {
        reversals
            .entry(entry.payout_id.as_deref().unwrap_or_default())
            .or_default()
            .push(entry.amount);
    }
    for (ticket, (spend, body)) in executed {
        if spend.kind != SpendKind::Payout {
            continue;
        }
        let Some(payout) = body.get("payout_id").and_then(Value::as_str) else {
            flag(
                ViolationKind::Missing,
                Some(ticket),
                "a payout accepted without a payout_id".into(),
            );
            continue;
        };
        let found = reversals.remove(payout).unwrap_or_default();
        let Some(read) = state.payouts.get(payout) else {
            flag(
                ViolationKind::Missing,
                Some(ticket),
                format!("payout {payout} was not read back"),
            );
            continue;
        };
        let failed = read.status == PayoutStatus::Failed;
        if failed {
            expected.0 += spend.amount;
        }
        let due: &[i64] = if failed { &[spend.amount] } else { &[] };
        if found != due {
            flag(
                ViolationKind::EntryMismatch,
                Some(ticket),
                format!(
                    "payout {payout} is {:?} and has reversals {found:?}, expected {due:?}",
                    read.status
                ),
            );
        }
    }
    for (payout, found) in reversals {
        flag(
            ViolationKind::UnknownEntry,
            None,
            format!(
                "{} reversals for payout {payout:?}, which no executed payout of the run names",
                found.len()
            ),
        );
    }
}

/// Tallies the payouts read back and, when the bank's transfers were read, reconciles
/// them: the findings are violations.
pub(crate) fn reconcile(state: &FinalState, violations: &mut Vec<Violation>) -> PayoutTally {
    let mut tally = PayoutTally {
        payouts: state.payouts.len(),
        bank_read: state.bank.is_some(),
        ..PayoutTally::default()
    };
    let mut executed: HashMap<&str, Vec<i64>> = HashMap::new();
    for transfer in state.bank.iter().flatten() {
        if transfer.state == TransferState::Executed {
            tally.executed_at_bank += 1;
            executed
                .entry(transfer.reference.as_str())
                .or_default()
                .push(transfer.amount);
        }
    }
    let mut flag = |kind, payout: &PayoutState, detail: String| {
        violations.push(Violation {
            kind,
            account: payout.account_id.clone(),
            ticket: Some(payout.ticket_id.clone()),
            detail: format!("payout {}: {detail}", payout.payout_id),
        });
    };
    for payout in state.payouts.values() {
        tally.most_attempts = tally.most_attempts.max(payout.attempts);
        match payout.status {
            PayoutStatus::Succeeded => tally.succeeded += 1,
            PayoutStatus::Failed => tally.failed += 1,
            PayoutStatus::Pending => tally.pending += 1,
        }
        if !tally.bank_read {
            continue;
        }
        let at_bank = executed
            .get(payout.payout_id.as_str())
            .map_or(&[][..], Vec::as_slice);
        if at_bank.len() > 1 {
            tally.executed_twice += at_bank.len() - 1;
            flag(
                ViolationKind::PaidTwice,
                payout,
                format!("the bank executed {} transfers for it", at_bank.len()),
            );
        }
        match payout.status {
            PayoutStatus::Succeeded if !at_bank.contains(&payout.amount) => {
                tally.missing_at_bank += 1;
                flag(
                    ViolationKind::MissingAtBank,
                    payout,
                    format!(
                        "succeeded for {}, the bank executed {at_bank:?}",
                        payout.amount
                    ),
                );
            }
            PayoutStatus::Failed if !at_bank.is_empty() => {
                tally.reversed_but_executed += 1;
                flag(
                    ViolationKind::ReversedButExecuted,
                    payout,
                    format!("failed and its money given back, yet the bank executed {at_bank:?}"),
                );
            }
            _ => {}
        }
    }
    tally
}
