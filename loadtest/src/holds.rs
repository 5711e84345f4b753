//! The holds' and refunds' part of the audit: what the run did to each hold and each paid
//! order, against the holds read back after the run. Pure, like the rest of the audit.
//!
//! Per hold the run placed (its placing ticket executed):
//! - it was resolved at most once: at most one of its captures and voids executed, and none
//!   if it reads `held` or `expired` — a capture that won against the expiry left it
//!   `captured`, a capture after it was refused;
//! - it reads what executed: `captured` with the one capture's amount, `voided` after the
//!   one void;
//! - its refunds that executed add up to its `refunded_amount`, and never above what was
//!   captured.
//!
//! Per order the run refunded: its refunds that executed add up to no more than it paid,
//! and only an order paid was refunded.
//!
//! Per account: the money available, as read after the run, is not below zero and is the
//! balance less the holds that read `held`.

use std::collections::HashMap;

use serde_json::Value;

use crate::history::{AccountRecord, AccountState, FinalState, SpendKind, SpendRecord};
use crate::violation::{Flag, ViolationKind};

/// Audits the account's holds and refunds; `executed` are its tickets that executed, with
/// their answers.
pub(crate) fn audit_holds(
    account: &AccountRecord,
    spends: &[&SpendRecord],
    executed: &HashMap<&str, (&SpendRecord, Value)>,
    final_account: &AccountState,
    state: &FinalState,
    flag: &mut Flag<'_>,
) {
    let ran = |kind: SpendKind, on: &dyn Fn(&SpendRecord) -> bool| -> Vec<&SpendRecord> {
        spends
            .iter()
            .copied()
            .filter(|spend| {
                spend.kind == kind && on(spend) && executed.contains_key(spend.ticket.as_str())
            })
            .collect()
    };
    let mut held = 0;
    for (hold_id, hold) in state
        .holds
        .iter()
        .filter(|(_, hold)| hold.account == account.id)
    {
        let of_hold = |spend: &SpendRecord| spend.hold.as_deref() == Some(hold_id.as_str());
        let captures = ran(SpendKind::Capture, &of_hold);
        let voids = ran(SpendKind::Void, &of_hold);
        let refunds = ran(SpendKind::Refund, &of_hold);
        let ticket = Some(hold.ticket.as_str());
        let resolutions = captures.len() + voids.len();
        let settled = match hold.state.as_str() {
            "captured" => captures.len() == 1 && voids.is_empty(),
            "voided" => voids.len() == 1 && captures.is_empty(),
            "held" | "expired" => resolutions == 0,
            _ => false,
        };
        if !settled {
            flag(
                if resolutions > 1 || hold.state == "expired" {
                    ViolationKind::HoldResolvedTwice
                } else {
                    ViolationKind::HoldMismatch
                },
                ticket,
                format!(
                    "hold {hold_id} reads {}, after {} captures and {} voids executed",
                    hold.state,
                    captures.len(),
                    voids.len()
                ),
            );
        }
        if let [capture] = captures.as_slice()
            && hold.captured_amount != Some(capture.amount)
        {
            flag(
                ViolationKind::HoldMismatch,
                Some(&capture.ticket),
                format!(
                    "hold {hold_id} captured {} by this ticket, reads captured {:?}",
                    capture.amount, hold.captured_amount
                ),
            );
        }
        let refunded: i64 = refunds.iter().map(|refund| refund.amount).sum();
        if refunded > hold.captured_amount.unwrap_or(0) {
            flag(
                ViolationKind::RefundedTooMuch,
                ticket,
                format!(
                    "hold {hold_id}: refunds of {refunded} executed, {:?} was captured",
                    hold.captured_amount
                ),
            );
        }
        if refunded != hold.refunded_amount {
            flag(
                ViolationKind::HoldMismatch,
                ticket,
                format!(
                    "hold {hold_id}: refunds of {refunded} executed, it reads {} refunded",
                    hold.refunded_amount
                ),
            );
        }
        if hold.state == "held" {
            held += hold.amount;
        }
    }
    audit_order_refunds(spends, executed, flag);
    if let Some(available) = final_account.available
        && (available < 0 || available != final_account.balance - held)
    {
        flag(
            ViolationKind::AvailableMismatch,
            None,
            format!(
                "available {available}, balance {} and {held} held",
                final_account.balance
            ),
        );
    }
}

/// Each order the account refunded: what its executed refunds add up to is no more than
/// its executed payment paid, and nothing was refunded of an order never paid.
fn audit_order_refunds(
    spends: &[&SpendRecord],
    executed: &HashMap<&str, (&SpendRecord, Value)>,
    flag: &mut Flag<'_>,
) {
    let mut refunded: HashMap<&str, (i64, &str)> = HashMap::new();
    for spend in spends.iter().filter(|spend| {
        spend.kind == SpendKind::Refund && executed.contains_key(spend.ticket.as_str())
    }) {
        if let Some(order) = spend.order.as_deref() {
            let total = refunded.entry(order).or_insert((0, spend.ticket.as_str()));
            total.0 += spend.amount;
        }
    }
    for (order, (total, ticket)) in refunded {
        let paid: i64 = spends
            .iter()
            .filter(|spend| {
                spend.kind == SpendKind::OrderPayment
                    && spend.order.as_deref() == Some(order)
                    && executed.contains_key(spend.ticket.as_str())
            })
            .map(|spend| spend.amount)
            .max()
            .unwrap_or(0);
        if total > paid {
            flag(
                ViolationKind::RefundedTooMuch,
                Some(ticket),
                format!("order {order}: refunds of {total} executed, it paid {paid}"),
            );
        }
    }
}
