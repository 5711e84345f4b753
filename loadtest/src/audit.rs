//! The auditor: judges a run's [`History`] against the ledger's [`FinalState`], read
//! through the API afterwards. Pure: the tests feed it recorded histories with planted
//! faults.
//!
//! What it checks, per account and per ticket:
//! - the answers are declared ones (201, 402, 409, 422, 503 with declared problem types);
//! - at most one attempt of a ticket executed (answered without `Idempotent-Replayed`), and
//!   every definitive answer to the same request equals it (the replays);
//! - a request with another amount under a used ticket got 422 `idempotency-key-reuse`;
//! - money: opening + deposits − withdrawals + prize credits, over the tickets that
//!   executed as the run saw them, equals the final balance; likewise points. A ticket
//!   executed twice, or a lost update, breaks this;
//! - every ticket that executed has exactly one entry, matching it; every other ticket
//!   none; no entry the run did not cause; the opening entry matches the opening;
//! - no balance or points ever below zero, in any entry or answer.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::Value;

use crate::history::{Attempt, FinalState, History, Role, SpendKind, SpendRecord};

/// One broken expectation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which expectation.
    pub kind: ViolationKind,
    /// The account concerned.
    pub account: String,
    /// The ticket concerned, if one.
    pub ticket: Option<String>,
    /// The particulars.
    pub detail: String,
}

/// The expectations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ViolationKind {
    /// A status or problem type the contract does not declare for this request (a 500,
    /// an undeclared 503, a 404 for a valid ticket...).
    UndeclaredAnswer,
    /// More than one attempt of the same request executed.
    ExecutedTwice,
    /// A definitive answer that differs from the ticket's outcome.
    ReplayMismatch,
    /// A different request under a used ticket was not refused with 422.
    ReuseNotRefused,
    /// The final balance or points differ from what the executed tickets add up to.
    BalanceMismatch,
    /// A ticket that executed has no entry, more than one, or one that does not match it;
    /// or a ticket that did not execute has one.
    EntryMismatch,
    /// An entry for a ticket the run never sent.
    UnknownEntry,
    /// The opening entry does not match the opening balance and points.
    OpeningMismatch,
    /// A balance or points below zero.
    Negative,
    /// The account's entries do not add up to its balance or points.
    EntriesDoNotAddUp,
    /// The run has no final state for something it must judge.
    Missing,
}

const DECLARED_503: [&str; 4] = [
    "lock-lost",
    "lock-store-unavailable",
    "database-unavailable",
    "timeout",
];
const DECLARED_409: [&str; 2] = ["request-in-progress", "account-busy"];
const STORED_REFUSALS: [&str; 3] = ["insufficient-funds", "insufficient-points", "balance-limit"];

fn named(attempt: &Attempt, names: &[&str]) -> bool {
    attempt
        .problem()
        .is_some_and(|kind| names.iter().any(|name| kind.ends_with(name)))
}

/// An answer that settles the ticket's outcome: success, or a stored refusal.
fn is_definitive(attempt: &Attempt) -> bool {
    attempt.status == 201
        || (attempt.status == 402 && named(attempt, &STORED_REFUSALS))
        || (attempt.status == 422 && named(attempt, &["balance-limit"]))
}

/// An answer that says nothing happened (yet): wait, retry.
fn is_transient(attempt: &Attempt) -> bool {
    attempt.status == 0
        || (attempt.status == 409 && named(attempt, &DECLARED_409))
        || (attempt.status == 503 && named(attempt, &DECLARED_503))
}

/// What a ticket did, as far as money goes.
struct Outcome {
    status: u16,
    body: Value,
}

/// Audits a run. Empty means every expectation held.
pub fn audit(history: &History, state: &FinalState) -> Vec<Violation> {
    audit_with_accounts(history, state).0
}

/// What the executed tickets of one account add up to, beside what the ledger holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AccountTally {
    /// The account.
    pub account: String,
    /// Opening + deposits − withdrawals + prize credits, over the tickets that executed.
    /// Below zero: the service accepted more than the account ever had.
    pub expected_balance: i64,
    /// Opening points − points spent, likewise.
    pub expected_points: i64,
    /// The ledger's balance afterwards.
    pub final_balance: i64,
    /// The ledger's points afterwards.
    pub final_points: i64,
}

/// [`audit`], plus each account's tally.
pub fn audit_with_accounts(
    history: &History,
    state: &FinalState,
) -> (Vec<Violation>, Vec<AccountTally>) {
    let mut violations = Vec::new();
    let mut tallies = Vec::new();
    let mut by_account: HashMap<&str, Vec<&SpendRecord>> = HashMap::new();
    for spend in &history.spends {
        by_account
            .entry(spend.account.as_str())
            .or_default()
            .push(spend);
    }
    for account in &history.accounts {
        let spends = by_account.remove(account.id.as_str()).unwrap_or_default();
        if let Some(tally) = audit_account(account, &spends, state, &mut violations) {
            tallies.push(tally);
        }
    }
    for (account, spends) in by_account {
        for spend in spends {
            violations.push(Violation {
                kind: ViolationKind::Missing,
                account: account.to_owned(),
                ticket: Some(spend.ticket.clone()),
                detail: "a spend on an account the run did not open".into(),
            });
        }
    }
    (violations, tallies)
}

fn audit_account(
    account: &crate::history::AccountRecord,
    spends: &[&SpendRecord],
    state: &FinalState,
    violations: &mut Vec<Violation>,
) -> Option<AccountTally> {
    let mut flag = |kind, ticket: Option<&str>, detail: String| {
        violations.push(Violation {
            kind,
            account: account.id.clone(),
            ticket: ticket.map(str::to_owned),
            detail,
        });
    };
    let Some(final_account) = state.accounts.get(&account.id) else {
        flag(
            ViolationKind::Missing,
            None,
            "the account's final state was not read".into(),
        );
        return None;
    };

    let mut expected_balance = account.opening_balance;
    let mut expected_points = account.opening_points;
    let mut executed: HashMap<&str, (&SpendRecord, Value)> = HashMap::new();

    for spend in spends {
        let ticket = Some(spend.ticket.as_str());
        for attempt in &spend.attempts {
            let declared = match attempt.role {
                Role::ChangedDuplicate => {
                    (attempt.status == 422 && named(attempt, &["idempotency-key-reuse"]))
                        || is_transient(attempt)
                }
                _ => is_definitive(attempt) || is_transient(attempt),
            };
            if !declared {
                let what = if attempt.role == Role::ChangedDuplicate {
                    ViolationKind::ReuseNotRefused
                } else {
                    ViolationKind::UndeclaredAnswer
                };
                flag(
                    what,
                    ticket,
                    format!(
                        "{:?} attempt to target {} answered {} {}",
                        attempt.role,
                        attempt.target,
                        attempt.status,
                        attempt.problem().unwrap_or("")
                    ),
                );
            }
        }

        let same_request: Vec<&Attempt> = spend
            .attempts
            .iter()
            .filter(|attempt| attempt.role != Role::ChangedDuplicate && is_definitive(attempt))
            .collect();
        let originals = same_request
            .iter()
            .filter(|attempt| !attempt.replayed)
            .count();
        if originals > 1 {
            flag(
                ViolationKind::ExecutedTwice,
                ticket,
                format!("{originals} attempts executed (answered without Idempotent-Replayed)"),
            );
        }
        let outcome = match same_request
            .iter()
            .find(|attempt| !attempt.replayed)
            .or(same_request.first())
        {
            Some(reference) => {
                for other in &same_request {
                    if other.status != reference.status || other.body != reference.body {
                        flag(
                            ViolationKind::ReplayMismatch,
                            ticket,
                            format!(
                                "{} {} differs from {} {}",
                                other.status,
                                compact(other.body.as_ref()),
                                reference.status,
                                compact(reference.body.as_ref())
                            ),
                        );
                    }
                }
                reference.body.clone().map(|body| Outcome {
                    status: reference.status,
                    body,
                })
            }
            // No definitive answer reached the run: the ledger's stored state decides.
            None => match state.tickets.get(&spend.ticket) {
                Some(stored) => match (stored.status, &stored.body) {
                    (Some(status), Some(body)) => Some(Outcome {
                        status,
                        body: body.clone(),
                    }),
                    _ => None,
                },
                None => {
                    flag(
                        ViolationKind::Missing,
                        ticket,
                        "no definitive answer and the ticket's state was not read".into(),
                    );
                    None
                }
            },
        };

        if let Some(outcome) = outcome.filter(|outcome| outcome.status == 201) {
            let body = &outcome.body;
            let number = |name: &str| body.get(name).and_then(Value::as_i64);
            match spend.kind {
                SpendKind::Withdrawal | SpendKind::Deposit => {
                    if number("amount") != Some(spend.amount) {
                        flag(
                            ViolationKind::ReplayMismatch,
                            ticket,
                            format!(
                                "201 for {} but the body says {}",
                                spend.amount,
                                compact(Some(body))
                            ),
                        );
                    }
                    if spend.kind == SpendKind::Withdrawal {
                        expected_balance -= spend.amount;
                    } else {
                        expected_balance += spend.amount;
                    }
                }
                SpendKind::LotteryDraw => {
                    if number("points") != Some(spend.amount) {
                        flag(
                            ViolationKind::ReplayMismatch,
                            ticket,
                            format!(
                                "draw of {} but the body says {}",
                                spend.amount,
                                compact(Some(body))
                            ),
                        );
                    }
                    expected_points -= spend.amount;
                    expected_balance += number("credit").unwrap_or(0);
                }
            }
            for field in ["balance", "points_after"] {
                if number(field).is_some_and(|value| value < 0) {
                    flag(
                        ViolationKind::Negative,
                        ticket,
                        format!("{field} below zero in {}", compact(Some(body))),
                    );
                }
            }
            executed.insert(spend.ticket.as_str(), (spend, outcome.body));
        }
    }

    if expected_balance != final_account.balance || expected_points != final_account.points {
        flag(
            ViolationKind::BalanceMismatch,
            None,
            format!(
                "the executed tickets add up to balance {expected_balance} and points {expected_points}, \
                 the ledger holds {} and {}",
                final_account.balance, final_account.points
            ),
        );
    }
    if final_account.balance < 0 || final_account.points < 0 {
        flag(
            ViolationKind::Negative,
            None,
            "the final balance or points are below zero".into(),
        );
    }

    audit_entries(account, spends, &executed, final_account, &mut flag);
    Some(AccountTally {
        account: account.id.clone(),
        expected_balance,
        expected_points,
        final_balance: final_account.balance,
        final_points: final_account.points,
    })
}

fn audit_entries(
    account: &crate::history::AccountRecord,
    spends: &[&SpendRecord],
    executed: &HashMap<&str, (&SpendRecord, Value)>,
    final_account: &crate::history::AccountState,
    flag: &mut impl FnMut(ViolationKind, Option<&str>, String),
) {
    let entries = &final_account.entries;
    match entries.first() {
        Some(first) if first.kind == "opening" => {
            if (first.amount, first.points) != (account.opening_balance, account.opening_points) {
                flag(
                    ViolationKind::OpeningMismatch,
                    None,
                    format!(
                        "opened with {} and {} points, the opening entry says {} and {}",
                        account.opening_balance, account.opening_points, first.amount, first.points
                    ),
                );
            }
        }
        _ => flag(
            ViolationKind::OpeningMismatch,
            None,
            "the first entry is not the opening".into(),
        ),
    }

    let (sum_amount, sum_points) = entries.iter().fold((0_i64, 0_i64), |(a, p), entry| {
        (a + entry.amount, p + entry.points)
    });
    if (sum_amount, sum_points) != (final_account.balance, final_account.points) {
        flag(
            ViolationKind::EntriesDoNotAddUp,
            None,
            format!(
                "entries sum to {sum_amount} and {sum_points} points, the account holds {} and {}",
                final_account.balance, final_account.points
            ),
        );
    }
    for entry in entries {
        if entry.balance_after < 0 || entry.points_after < 0 {
            flag(
                ViolationKind::Negative,
                entry.ticket_id.as_deref(),
                format!(
                    "entry {} leaves balance {} and points {}",
                    entry.id, entry.balance_after, entry.points_after
                ),
            );
        }
    }

    let mut by_ticket: HashMap<&str, Vec<&crate::history::EntryRecord>> = HashMap::new();
    for entry in entries {
        if let Some(ticket) = entry.ticket_id.as_deref() {
            by_ticket.entry(ticket).or_default().push(entry);
        }
    }
    for spend in spends {
        let ticket = spend.ticket.as_str();
        let found = by_ticket.remove(ticket).unwrap_or_default();
        match executed.get(ticket) {
            Some((spend, body)) => {
                if found.len() != 1 {
                    flag(
                        ViolationKind::EntryMismatch,
                        Some(ticket),
                        format!("executed once, {} entries", found.len()),
                    );
                    continue;
                }
                let entry = found[0];
                let (amount, points) = match spend.kind {
                    SpendKind::Withdrawal => (-spend.amount, 0),
                    SpendKind::Deposit => (spend.amount, 0),
                    SpendKind::LotteryDraw => (
                        body.get("credit").and_then(Value::as_i64).unwrap_or(0),
                        -spend.amount,
                    ),
                };
                if entry.kind != spend.kind.entry_kind()
                    || (entry.amount, entry.points) != (amount, points)
                {
                    flag(
                        ViolationKind::EntryMismatch,
                        Some(ticket),
                        format!(
                            "expected a {} entry of {amount} and {points} points, found {} of {} and {}",
                            spend.kind.entry_kind(),
                            entry.kind,
                            entry.amount,
                            entry.points
                        ),
                    );
                }
            }
            None if !found.is_empty() => flag(
                ViolationKind::EntryMismatch,
                Some(ticket),
                format!("did not execute, yet has {} entries", found.len()),
            ),
            None => {}
        }
    }
    for (ticket, found) in by_ticket {
        flag(
            ViolationKind::UnknownEntry,
            Some(ticket),
            format!("{} entries for a ticket this run never sent", found.len()),
        );
    }
}

fn compact(body: Option<&Value>) -> String {
    body.map_or_else(|| "(no body)".to_owned(), Value::to_string)
}
