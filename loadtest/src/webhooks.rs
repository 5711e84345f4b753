//! The webhooks' part of the audit (when the run had a [`Receiver`](crate::receiver)):
//! what the receiver got, against the outcomes the run committed. Pure, like the rest of
//! the audit.
//!
//! The committed outcomes come from the final state: each entry of a withdrawal, a lottery
//! draw, an order payment, a hold's capture or a refund is one (`withdrawal.succeeded`,
//! `lottery.drawn`, `order.paid`, `hold.captured`, `refund.succeeded`); each withdrawal
//! whose stored outcome is a 402 — answered so, or read back so — one
//! `withdrawal.refused`; each void answered or stored 200 one `hold.voided`; each hold read
//! expired one `hold.expired` (under the ticket that placed it); each settled payout one
//! `payout.succeeded` or `payout.failed`. Then:
//! - every one of them was delivered (the receiver took it) at least once;
//! - nothing else came: no event for a request refused before it executed, or for a
//!   transaction that rolled back;
//! - every delivery's signature verified;
//! - repeats only under the same `webhook-id`, with the same body.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::history::{FinalState, History, PayoutStatus, SpendKind};
use crate::receiver::Receipt;
use crate::violation::{Violation, ViolationKind};

/// An event the run's outcomes call for: its ticket and type.
pub type Expected = (String, &'static str);

/// The events the committed outcomes of the run call for, each with its account.
pub fn expected_events(history: &History, state: &FinalState) -> BTreeMap<Expected, String> {
    let mut expected = BTreeMap::new();
    for (account, found) in &state.accounts {
        for entry in &found.entries {
            let kind = match entry.kind.as_str() {
                "withdrawal" => "withdrawal.succeeded",
                "lottery_draw" => "lottery.drawn",
                "order_payment" => "order.paid",
                "hold_capture" => "hold.captured",
                "refund" => "refund.succeeded",
                _ => continue,
            };
            if let Some(ticket) = &entry.ticket_id {
                expected.insert((ticket.clone(), kind), account.clone());
            }
        }
    }
    for spend in history
        .spends
        .iter()
        .filter(|spend| spend.kind == SpendKind::Withdrawal)
    {
        let answered_402 = spend.attempts.iter().any(|attempt| {
            attempt.status == Some(402)
                && attempt
                    .problem()
                    .is_some_and(|kind| kind.ends_with("insufficient-funds"))
        });
        let stored_402 = state
            .tickets
            .get(&spend.ticket)
            .is_some_and(|ticket| ticket.status == Some(402));
        if answered_402 || stored_402 {
            expected.insert(
                (spend.ticket.clone(), "withdrawal.refused"),
                spend.account.clone(),
            );
        }
    }
    // A void moves no money and writes no entry: its stored 200 is the outcome.
    for spend in history
        .spends
        .iter()
        .filter(|spend| spend.kind == SpendKind::Void)
    {
        let answered = spend
            .attempts
            .iter()
            .any(|attempt| attempt.status == Some(200));
        let stored = state
            .tickets
            .get(&spend.ticket)
            .is_some_and(|ticket| ticket.status == Some(200));
        if answered || stored {
            expected.insert((spend.ticket.clone(), "hold.voided"), spend.account.clone());
        }
    }
    // An expiry is the sweep's event, naming the ticket that placed the hold.
    for hold in state.holds.values().filter(|hold| hold.state == "expired") {
        expected.insert((hold.ticket.clone(), "hold.expired"), hold.account.clone());
    }
    for payout in state.payouts.values() {
        let kind = match payout.status {
            PayoutStatus::Succeeded => "payout.succeeded",
            PayoutStatus::Failed => "payout.failed",
            PayoutStatus::Pending => continue,
        };
        expected.insert((payout.ticket_id.clone(), kind), payout.account_id.clone());
    }
    expected
}

/// What the receiver got, counted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WebhookTally {
    /// Whether the run had a receiver.
    pub received: bool,
    /// Events the committed outcomes call for.
    pub expected: usize,
    /// Of those, delivered (the receiver took at least one delivery).
    pub delivered: usize,
    /// Requests the receiver got, every attempt included.
    pub requests: usize,
    /// Requests it answered other than 204 (500, 429, nothing): each one retried.
    pub refused_by_receiver: usize,
    /// Events it took more than once (same `webhook-id`): at-least-once at work.
    pub repeats: usize,
    /// From an event's commit to its first arrival, milliseconds: the median and the
    /// 99th percentile.
    pub first_arrival_p50_ms: Option<u64>,
    /// See above.
    pub first_arrival_p99_ms: Option<u64>,
}

/// Checks the receipts against the expected events; the tally.
pub fn audit_webhooks(
    expected: &BTreeMap<Expected, String>,
    receipts: &[Receipt],
    violations: &mut Vec<Violation>,
) -> WebhookTally {
    let mut tally = WebhookTally {
        received: true,
        expected: expected.len(),
        requests: receipts.len(),
        ..WebhookTally::default()
    };
    let seen = by_event(receipts, &mut tally, violations);
    let mut lags = judge_seen(&seen, expected, &mut tally, violations);
    judge_expected(expected, &seen, &mut tally, violations);
    lags.sort_unstable();
    let quantile =
        |q: f64| (!lags.is_empty()).then(|| lags[((lags.len() - 1) as f64 * q).round() as usize]);
    tally.first_arrival_p50_ms = quantile(0.5);
    tally.first_arrival_p99_ms = quantile(0.99);
    tally
}

/// One event as the receiver got it: its ids and bodies, whether taken, the first
/// arrival's lag.
struct Seen<'a> {
    ids: HashSet<&'a str>,
    bodies: HashMap<&'a str, u64>,
    taken: usize,
    first_lag: Option<u64>,
    account: &'a str,
}

/// A finding about the webhooks of one ticket (none when `ticket` is empty).
fn flag(
    violations: &mut Vec<Violation>,
    kind: ViolationKind,
    account: &str,
    ticket: &str,
    detail: String,
) {
    violations.push(Violation {
        kind,
        account: account.to_owned(),
        ticket: (!ticket.is_empty()).then(|| ticket.to_owned()),
        detail,
    });
}

/// The receipts gathered by event (ticket and type), each delivery's signature and body
/// checked on the way.
fn by_event<'a>(
    receipts: &'a [Receipt],
    tally: &mut WebhookTally,
    violations: &mut Vec<Violation>,
) -> HashMap<(&'a str, &'a str), Seen<'a>> {
    let mut seen: HashMap<(&str, &str), Seen<'_>> = HashMap::new();
    for receipt in receipts {
        if !receipt.taken() {
            tally.refused_by_receiver += 1;
        }
        if !receipt.verified {
            flag(
                violations,
                ViolationKind::BadSignature,
                &receipt.account,
                &receipt.ticket_id,
                format!(
                    "delivery {} of {} did not verify with the endpoint's secret",
                    receipt.webhook_id, receipt.event_type
                ),
            );
        }
        let event = seen
            .entry((receipt.ticket_id.as_str(), receipt.event_type.as_str()))
            .or_insert_with(|| Seen {
                ids: HashSet::new(),
                bodies: HashMap::new(),
                taken: 0,
                first_lag: receipt.lag_ms,
                account: &receipt.account,
            });
        event.ids.insert(&receipt.webhook_id);
        match event.bodies.get(receipt.webhook_id.as_str()) {
            Some(body) if *body != receipt.body_hash => flag(
                violations,
                ViolationKind::EventChanged,
                &receipt.account,
                &receipt.ticket_id,
                format!(
                    "{} came with another body under the same webhook-id",
                    receipt.webhook_id
                ),
            ),
            _ => {
                event.bodies.insert(&receipt.webhook_id, receipt.body_hash);
            }
        }
        if receipt.taken() {
            event.taken += 1;
        }
    }
    seen
}

/// Judges each event that came: one `webhook-id`, and an outcome the run committed; the
/// repeats counted. The first arrivals' lags.
fn judge_seen(
    seen: &HashMap<(&str, &str), Seen<'_>>,
    expected: &BTreeMap<Expected, String>,
    tally: &mut WebhookTally,
    violations: &mut Vec<Violation>,
) -> Vec<u64> {
    let mut lags = Vec::new();
    for ((ticket, kind), event) in seen {
        if event.ids.len() > 1 {
            flag(
                violations,
                ViolationKind::EventIdsDiffer,
                event.account,
                ticket,
                format!("{kind} came under {} webhook-ids", event.ids.len()),
            );
        }
        if event.taken > 1 {
            tally.repeats += event.taken - 1;
        }
        if !expected.keys().any(|(t, k)| t == ticket && k == kind) {
            flag(
                violations,
                ViolationKind::EventUnexpected,
                event.account,
                ticket,
                format!("{kind} for an outcome the run did not commit"),
            );
        }
        lags.extend(event.first_lag);
    }
    lags
}

/// Judges each expected event: the receiver took it at least once.
fn judge_expected(
    expected: &BTreeMap<Expected, String>,
    seen: &HashMap<(&str, &str), Seen<'_>>,
    tally: &mut WebhookTally,
    violations: &mut Vec<Violation>,
) {
    for ((ticket, kind), account) in expected {
        let detail = match seen.get(&(ticket.as_str(), *kind)) {
            Some(event) if event.taken > 0 => {
                tally.delivered += 1;
                continue;
            }
            Some(_) => format!("{kind} came but the receiver never took it"),
            None => format!("{kind} never came"),
        };
        flag(
            violations,
            ViolationKind::EventMissing,
            account,
            ticket,
            detail,
        );
    }
}
