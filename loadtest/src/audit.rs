//! The auditor: judges a run's [`History`] against the ledger's [`FinalState`], read
//! through the API afterwards. Pure: the tests feed it recorded histories with planted
//! faults.
//!
//! What it checks, per account and per ticket:
//! - the answers are declared ones: a ticket request answered 201 (with a `ticket_id`), or
//!   429 or 503 with a declared problem type; a spend answered 201, 402, 409, 422, 429 or
//!   503 with declared problem types — a payout also 503 `payouts-unavailable`: a target
//!   without a bank, a final answer that stored nothing;
//! - every request got an answer: without retries, a transport error (connection refused
//!   or reset, a timeout) is a violation, unless the run expected some ([`AuditOptions`]:
//!   the matrix's instance-kill cell kills an instance on purpose). With retries the client
//!   resent it, with the same ticket, and what is judged is the answer the request ended
//!   with — or, for a request left unresolved (every attempt transient or lost), what its
//!   ticket shows: counted in [`Unresolved`], not a violation;
//! - at most one attempt of a ticket executed (answered without `Idempotent-Replayed`),
//!   whichever logical request and whichever resend it was, and every definitive answer to
//!   the same request equals it (the replays, and the final answers of resent requests);
//! - a ticket read back (one without a definitive answer, or one whose requests were
//!   resent) stores the outcome the requests were answered with; one still issued was
//!   never answered definitively;
//! - a request with another amount under a used ticket got 422 `idempotency-key-reuse`;
//! - money: opening + deposits − withdrawals + prize credits, over the tickets that
//!   executed as the run saw them, equals the final balance; likewise points. A ticket
//!   executed twice, or a lost update, breaks this;
//! - every ticket that executed has exactly one entry, matching it; every other ticket
//!   none; no entry the run did not cause; the opening entry matches the opening;
//! - the entries chain: each entry's state before (its balance and points after, minus its
//!   own change) is the state the previous entry left. One that is not was decided on an
//!   older state and overwrote what was written since (a lost update);
//! - no balance or points ever below zero, in any entry or answer.
//!
//! - payouts: a failed one's money comes back once, and the bank executed each at most
//!   once — see [`payouts`](crate::payouts).
//! - holds and refunds: no hold resolved twice, none reading other than what executed, no
//!   refunds above their payment, available never negative — see `holds.rs`.
//!
//! It also counts, per account, the double spends ([`AccountTally::double_spends`]).

use std::collections::HashMap;

use serde::Serialize;
use serde_json::Value;

use crate::history::{
    AccountRecord, AccountState, Attempt, EntryRecord, FinalState, History, Role, SpendKind,
    SpendRecord, TicketAttempt, TicketState,
};
pub use crate::payouts::PayoutTally;
use crate::violation::Flag;
pub use crate::violation::{Violation, ViolationKind};
pub use crate::webhooks::WebhookTally;

const DECLARED_503: [&str; 5] = [
    "lock-lost",
    "lock-store-unavailable",
    "database-unavailable",
    "timeout",
    "outcome-unknown",
];
const DECLARED_409: [&str; 2] = ["request-in-progress", "account-busy"];
const DECLARED_429: [&str; 1] = ["rate-limited"];
const STORED_REFUSALS: [&str; 3] = ["insufficient-funds", "insufficient-points", "balance-limit"];

fn named(attempt: &Attempt, names: &[&str]) -> bool {
    attempt
        .problem()
        .is_some_and(|kind| names.iter().any(|name| kind.ends_with(name)))
}

/// An answer that settles the ticket's outcome of a spend of `kind`: it executed (201; 202
/// for a payout; 200 for a capture or a void), or a stored refusal.
pub fn is_definitive(kind: SpendKind, attempt: &Attempt) -> bool {
    match (kind, attempt.status) {
        (_, Some(status)) if status == kind.executed_status() => true,
        (_, Some(402)) => named(attempt, &STORED_REFUSALS),
        (SpendKind::Capture | SpendKind::Void, Some(409)) => named(attempt, &["hold-not-held"]),
        (SpendKind::Capture, Some(422)) => named(attempt, &["capture-exceeds-hold"]),
        (SpendKind::Refund, Some(409)) => named(
            attempt,
            &["refund-exceeds-payment", "order-not-paid", "hold-not-held"],
        ),
        (_, Some(409)) => named(attempt, &["order-already-paid"]),
        (_, Some(422)) => named(attempt, &["balance-limit"]),
        _ => false,
    }
}

/// An answer that says nothing is stored (yet): wait, resend with the same ticket. Not a
/// missing answer: that is judged apart ([`AuditOptions`]).
fn is_transient(attempt: &Attempt) -> bool {
    match attempt.status {
        Some(409) => named(attempt, &DECLARED_409),
        Some(429) => named(attempt, &DECLARED_429),
        Some(503) => named(attempt, &DECLARED_503),
        _ => false,
    }
}

/// A payout refused by a target started without a bank (503 `payouts-unavailable`). Not
/// transient — the target answers so until it is restarted with a bank, and the client
/// does not resend it — so the request ended with it, and is not left unresolved. Nothing
/// was stored by that target: the ticket is read back and its stored outcome decides, as
/// for a request without a definitive answer (issued: no entry may exist).
fn is_refused_for_want_of_a_bank(kind: SpendKind, attempt: &Attempt) -> bool {
    kind == SpendKind::Payout && attempt.payouts_unavailable()
}

/// What the run expected, beside the contract.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuditOptions {
    /// Requests may go unanswered: an instance was killed on purpose during the run (the
    /// matrix's instance-kill cell). Otherwise, without retries, a transport error is a
    /// violation — a server that crashes or hangs must not pass.
    pub unanswered_expected: bool,
    /// The clients resent what got no answer or a transient one, with the same ticket
    /// ([`RetryPolicy`](crate::retry::RetryPolicy)). An unanswered attempt is then not a
    /// violation by itself: the request's final answer is judged, or, if it never got a
    /// definitive one, its ticket as read back.
    pub retries: bool,
}

/// The HTTP status for a message; "no answer" for none.
fn status_text(status: Option<u16>) -> String {
    status.map_or_else(|| "no answer".to_owned(), |status| status.to_string())
}

/// What a ticket did, as far as money goes.
struct Outcome {
    status: u16,
    body: Value,
}

/// Audits a run that expected every request to be answered. Empty means every
/// expectation held.
pub fn audit(history: &History, state: &FinalState) -> Vec<Violation> {
    audit_with(history, state, &AuditOptions::default()).violations
}

/// What the audit found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Audit {
    /// Every broken expectation; empty means the run passed.
    pub violations: Vec<Violation>,
    /// Each account's tally.
    pub tallies: Vec<AccountTally>,
    /// The requests that ended without a definitive answer, and what their tickets show.
    pub unresolved: Unresolved,
    /// The payouts, and what the bank holds for them.
    pub payouts: PayoutTally,
    /// The webhooks the receiver got, when the run had one.
    pub webhooks: WebhookTally,
}

/// Requests that ended without a definitive answer: every attempt got no answer or a
/// transient one (409, 429, 503) — after all the resends the policy allowed. Not
/// violations: their tickets were read back, and what those show was audited like any
/// other outcome (an issued ticket has no entry; a completed one, its entry if 201). A
/// payout refused for want of a bank (503 `payouts-unavailable`) is not one: that answer
/// is final, though its ticket is judged the same way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Unresolved {
    /// Logical spend requests (an original, a duplicate...) whose final attempt got no
    /// answer or a transient one.
    pub requests: u64,
    /// Tickets none of whose requests got a definitive answer.
    pub tickets: u64,
    /// Of those tickets, the ones the read-back shows completed: an answer was lost, not
    /// the outcome (the rest show nothing executed).
    pub completed: u64,
}

/// [`Unresolved`], counted from the history and the tickets read back.
fn unresolved(history: &History, state: &FinalState) -> Unresolved {
    let mut unresolved = Unresolved::default();
    for spend in &history.spends {
        unresolved.requests += spend
            .final_attempts()
            .filter(|last| last.status.is_none() || is_transient(last))
            .count() as u64;
        let settled = spend.attempts.iter().any(|attempt| {
            attempt.role != Role::ChangedDuplicate && is_definitive(spend.kind, attempt)
        });
        let mut last = spend.final_attempts().peekable();
        let refused = last.peek().is_some()
            && last.all(|last| is_refused_for_want_of_a_bank(spend.kind, last));
        if !settled && !refused {
            unresolved.tickets += 1;
            let stored = state.tickets.get(&spend.ticket);
            if stored.is_some_and(|stored| stored.state == "completed") {
                unresolved.completed += 1;
            }
        }
    }
    unresolved
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
    /// Operations that moved money or points twice, or were accepted beyond what was
    /// affordable. Counted from the ledger's own entries, in the order it wrote them:
    /// - each withdrawal or lottery draw whose effect a later write overwrote. A write
    ///   decided on an older state (its balance and points before are not what the
    ///   previous entry left) puts the account back to that state plus its own change, so
    ///   every entry written since is undone: a withdrawal's money left the account yet is
    ///   there again, to be spent a second time; a draw's points likewise. The older state
    ///   is found as the most recent earlier one equal to it (the count errs low when a
    ///   state repeats); when none matches, the stale write counts as one. Each spend is
    ///   counted once, however often it is overwritten. Overwritten deposits lose money
    ///   rather than spend it twice and are not counted (the audit still flags them);
    /// - each entry beyond the first for one ticket, when the ticket is a withdrawal or a
    ///   draw (a ticket executed twice).
    ///
    /// A spend accepted beyond what was affordable shows up as the first kind: the entries
    /// of a correct ledger never go below zero, so an accepted overdraft is a write that
    /// did not see what the previous one took.
    pub double_spends: u64,
}

/// [`audit`], with options, plus each account's tally.
pub fn audit_with(history: &History, state: &FinalState, options: &AuditOptions) -> Audit {
    let mut violations = Vec::new();
    let mut tallies = Vec::new();
    for attempt in &history.tickets {
        audit_ticket_request(attempt, options, &mut violations);
    }
    let mut by_account: HashMap<&str, Vec<&SpendRecord>> = HashMap::new();
    for spend in &history.spends {
        by_account
            .entry(spend.account.as_str())
            .or_default()
            .push(spend);
    }
    for account in &history.accounts {
        let spends = by_account.remove(account.id.as_str()).unwrap_or_default();
        if state.lost_accounts.contains(&account.id) {
            // Everything done on it went with it: one finding, not one per spend.
            violations.push(Violation {
                kind: ViolationKind::AcknowledgedOutcomeLost,
                account: account.id.clone(),
                ticket: None,
                detail: format!(
                    "the account was opened (201) and the ledger does not know it afterwards; \
                     {} spends on it lost with it",
                    spends.len()
                ),
            });
            continue;
        }
        if let Some(tally) = audit_account(account, &spends, state, options, &mut violations) {
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
    let payouts = crate::payouts::reconcile(state, &mut violations);
    let webhooks = match &state.webhooks {
        Some(receipts) => {
            let expected = crate::webhooks::expected_events(history, state);
            crate::webhooks::audit_webhooks(&expected, receipts, &mut violations)
        }
        None => WebhookTally::default(),
    };
    Audit {
        violations,
        tallies,
        unresolved: unresolved(history, state),
        payouts,
        webhooks,
    }
}

/// A ticket request must be answered 201 with a ticket, or 429 or 503 with a declared
/// type; without an answer, it must have been expected or resent.
fn audit_ticket_request(
    attempt: &TicketAttempt,
    options: &AuditOptions,
    violations: &mut Vec<Violation>,
) {
    let declared = |names: &[&str]| {
        attempt
            .problem()
            .is_some_and(|kind| names.iter().any(|name| kind.ends_with(name)))
    };
    let kind = match attempt.status {
        None if options.unanswered_expected || options.retries => return,
        None => ViolationKind::Unanswered,
        Some(201) if attempt.ticket.is_some() => return,
        Some(429) if declared(&DECLARED_429) => return,
        Some(503) if declared(&DECLARED_503) => return,
        _ => ViolationKind::UndeclaredAnswer,
    };
    violations.push(Violation {
        kind,
        account: attempt.account.clone(),
        ticket: attempt.ticket.clone(),
        detail: format!(
            "ticket request (attempt {}) to target {} {}{}",
            attempt.attempt,
            attempt.target,
            match attempt.status {
                Some(status) => format!("answered {status} {}", attempt.problem().unwrap_or("")),
                None => "got no answer".to_owned(),
            },
            attempt
                .error
                .as_deref()
                .map(|error| format!(" ({error})"))
                .unwrap_or_default()
        ),
    });
}

/// Audits one account: its spends' answers and outcomes, its payouts and orders, its
/// final state and entries; its tally, when its final state was read.
fn audit_account(
    account: &AccountRecord,
    spends: &[&SpendRecord],
    state: &FinalState,
    options: &AuditOptions,
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

    let mut expected = (account.opening_balance, account.opening_points);
    let Outcomes {
        executed,
        refused_as_paid,
    } = outcomes(spends, state, options, &mut expected, &mut flag);
    crate::payouts::audit_reversals(&executed, final_account, state, &mut expected, &mut flag);
    audit_orders(
        spends,
        &executed,
        &refused_as_paid,
        final_account,
        &mut flag,
    );
    crate::holds::audit_holds(account, spends, &executed, final_account, state, &mut flag);
    let (expected_balance, expected_points) = expected;
    audit_final(final_account, expected, &mut flag);
    audit_entries(account, spends, &executed, final_account, &mut flag);
    let double_spends = double_spends(account, final_account, &mut flag);
    Some(AccountTally {
        account: account.id.clone(),
        expected_balance,
        expected_points,
        final_balance: final_account.balance,
        final_points: final_account.points,
        double_spends,
    })
}

/// An account's spends by what they came to.
struct Outcomes<'a> {
    /// The tickets that executed, with their spend and answer.
    executed: HashMap<&'a str, (&'a SpendRecord, Value)>,
    /// The spends refused with 409 `order-already-paid`.
    refused_as_paid: Vec<&'a SpendRecord>,
}

/// Judges each spend's answers and outcome, and adds the executed ones to `expected`.
fn outcomes<'a>(
    spends: &[&'a SpendRecord],
    state: &FinalState,
    options: &AuditOptions,
    expected: &mut (i64, i64),
    flag: &mut Flag<'_>,
) -> Outcomes<'a> {
    let mut executed: HashMap<&str, (&SpendRecord, Value)> = HashMap::new();
    let mut refused_as_paid: Vec<&SpendRecord> = Vec::new();
    for &spend in spends {
        audit_answers(spend, options, flag);
        let outcome = outcome(spend, state, flag);
        if outcome.as_ref().is_some_and(|outcome| {
            outcome.status == 409
                && outcome
                    .body
                    .get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|kind| kind.ends_with("order-already-paid"))
        }) {
            refused_as_paid.push(spend);
        }
        if let Some(outcome) =
            outcome.filter(|outcome| outcome.status == spend.kind.executed_status())
        {
            apply(spend, &outcome.body, expected, flag);
            executed.insert(spend.ticket.as_str(), (spend, outcome.body));
        }
    }
    Outcomes {
        executed,
        refused_as_paid,
    }
}

/// The account's final balance and points: what the executed tickets add up to, and not
/// below zero.
fn audit_final(final_account: &AccountState, expected: (i64, i64), flag: &mut Flag<'_>) {
    let (expected_balance, expected_points) = expected;
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
}

/// Every attempt of a spend got an answer the contract declares for it (a changed
/// duplicate: 422 `idempotency-key-reuse`, or a transient one). An attempt without an
/// answer is a violation only when nothing resent it and the run did not expect it.
fn audit_answers(spend: &SpendRecord, options: &AuditOptions, flag: &mut Flag<'_>) {
    let ticket = Some(spend.ticket.as_str());
    for attempt in &spend.attempts {
        let Some(status) = attempt.status else {
            if !options.unanswered_expected && !options.retries {
                flag(
                    ViolationKind::Unanswered,
                    ticket,
                    format!(
                        "{:?} attempt {} to target {} got no answer: {}",
                        attempt.role,
                        attempt.attempt,
                        attempt.target,
                        attempt.error.as_deref().unwrap_or("(no error recorded)")
                    ),
                );
            }
            continue;
        };
        let declared = match attempt.role {
            Role::ChangedDuplicate => {
                (status == 422 && named(attempt, &["idempotency-key-reuse"]))
                    || is_transient(attempt)
            }
            _ => {
                is_definitive(spend.kind, attempt)
                    || is_transient(attempt)
                    || is_refused_for_want_of_a_bank(spend.kind, attempt)
            }
        };
        if !declared {
            let what = match attempt.role {
                Role::ChangedDuplicate => ViolationKind::ReuseNotRefused,
                // A resend of an acknowledged request refused as if it never was (404
                // ticket-not-found): the ledger lost the ticket with its outcome.
                Role::Recheck if status == 404 => ViolationKind::AcknowledgedOutcomeLost,
                _ => ViolationKind::UndeclaredAnswer,
            };
            flag(
                what,
                ticket,
                format!(
                    "{:?} attempt {} to target {} answered {status} {}",
                    attempt.role,
                    attempt.attempt,
                    attempt.target,
                    attempt.problem().unwrap_or("")
                ),
            );
        }
    }
}

/// The ticket's outcome. From the definitive answers to the same request, whichever
/// attempt of whichever logical request got them: at most one of them executed (no
/// `Idempotent-Replayed`), all are equal, and, when the ticket was read back, its stored
/// outcome equals them. Without a definitive answer (every attempt transient or lost), the
/// stored outcome read back decides; a ticket still issued has none.
fn outcome(spend: &SpendRecord, state: &FinalState, flag: &mut Flag<'_>) -> Option<Outcome> {
    let ticket = Some(spend.ticket.as_str());
    let same_request = definitive_answers(spend, flag);
    let stored = state.tickets.get(&spend.ticket);
    let Some(reference) = same_request
        .iter()
        .find(|attempt| !attempt.replayed)
        .or(same_request.first())
    else {
        return stored_outcome(stored, ticket, flag);
    };
    for other in &same_request {
        if other.status != reference.status || other.body != reference.body {
            flag(
                ViolationKind::ReplayMismatch,
                ticket,
                format!(
                    "{} {} differs from {} {}",
                    status_text(other.status),
                    compact(other.body.as_ref()),
                    status_text(reference.status),
                    compact(reference.body.as_ref())
                ),
            );
        }
    }
    if let Some(stored) = stored {
        audit_stored(stored, reference, ticket, flag);
    }
    let status = reference.status?;
    reference.body.clone().map(|body| Outcome { status, body })
}

/// The definitive answers to the spend's own request (not its changed duplicate's), less
/// the rechecks that executed again; flags those, and more than one execution by the load.
fn definitive_answers<'a>(spend: &'a SpendRecord, flag: &mut Flag<'_>) -> Vec<&'a Attempt> {
    let ticket = Some(spend.ticket.as_str());
    let mut same_request: Vec<&Attempt> = spend
        .attempts
        .iter()
        .filter(|attempt| {
            attempt.role != Role::ChangedDuplicate && is_definitive(spend.kind, attempt)
        })
        .collect();
    // The load's own attempts are judged for executing twice; the rechecks after it apart,
    // as executions of an outcome already given.
    let originals = same_request
        .iter()
        .filter(|attempt| attempt.role != Role::Recheck && !attempt.replayed)
        .count();
    if originals > 1 {
        flag(
            ViolationKind::ExecutedTwice,
            ticket,
            format!("{originals} attempts executed (answered without Idempotent-Replayed)"),
        );
    }
    // A recheck that executed instead of replaying an outcome the load had been given.
    let acknowledged = same_request
        .iter()
        .any(|attempt| attempt.role != Role::Recheck);
    let executed_again =
        |attempt: &Attempt| attempt.role == Role::Recheck && !attempt.replayed && acknowledged;
    for again in same_request
        .iter()
        .filter(|attempt| executed_again(attempt))
    {
        flag(
            ViolationKind::ExecutedAgain,
            ticket,
            format!(
                "resent after the run, it executed again ({} {}) instead of replaying the outcome given",
                status_text(again.status),
                compact(again.body.as_ref())
            ),
        );
    }
    same_request.retain(|attempt| !executed_again(attempt));
    same_request
}

/// The outcome of a ticket no request got a definitive answer for: the one stored, as read
/// back; none while it is still issued.
fn stored_outcome(
    stored: Option<&TicketState>,
    ticket: Option<&str>,
    flag: &mut Flag<'_>,
) -> Option<Outcome> {
    match stored {
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
    }
}

/// The ticket as read back against the answer its requests got: completed, storing that
/// answer.
fn audit_stored(
    stored: &TicketState,
    reference: &Attempt,
    ticket: Option<&str>,
    flag: &mut Flag<'_>,
) {
    if stored.state != "completed" {
        flag(
            ViolationKind::AcknowledgedOutcomeLost,
            ticket,
            format!(
                "answered {} {}, the ticket is {} and stores nothing",
                status_text(reference.status),
                compact(reference.body.as_ref()),
                stored.state
            ),
        );
    } else if (stored.status, &stored.body) != (reference.status, &reference.body) {
        flag(
            ViolationKind::StoredOutcomeMismatch,
            ticket,
            format!(
                "the ticket is {} and stores {} {}, the requests were answered {} {}",
                stored.state,
                status_text(stored.status),
                compact(stored.body.as_ref()),
                status_text(reference.status),
                compact(reference.body.as_ref())
            ),
        );
    }
}

/// Adds an executed spend to the expected balance and points, checking that its answer
/// is for this spend and leaves nothing below zero.
fn apply(spend: &SpendRecord, body: &Value, expected: &mut (i64, i64), flag: &mut Flag<'_>) {
    let ticket = Some(spend.ticket.as_str());
    let number = |name: &str| body.get(name).and_then(Value::as_i64);
    let (field, what) = match spend.kind {
        SpendKind::Withdrawal | SpendKind::Deposit => ("amount", "201 for"),
        SpendKind::Payout => ("amount", "payout of"),
        SpendKind::OrderPayment => ("amount", "payment of an order of"),
        SpendKind::LotteryDraw => ("points", "draw of"),
        SpendKind::Hold => ("amount", "hold of"),
        SpendKind::Capture => ("captured_amount", "capture of"),
        SpendKind::Refund => ("amount", "refund of"),
        SpendKind::Void => ("", ""),
    };
    if spend.kind != SpendKind::Void && number(field) != Some(spend.amount) {
        flag(
            ViolationKind::ReplayMismatch,
            ticket,
            format!(
                "{what} {} but the body says {}",
                spend.amount,
                compact(Some(body))
            ),
        );
    }
    match spend.kind {
        SpendKind::Withdrawal
        | SpendKind::OrderPayment
        | SpendKind::Payout
        | SpendKind::Capture => {
            expected.0 -= spend.amount;
        }
        SpendKind::Deposit | SpendKind::Refund => expected.0 += spend.amount,
        SpendKind::LotteryDraw => {
            expected.1 -= spend.amount;
            expected.0 += number("credit").unwrap_or(0);
        }
        // Money set aside, or released: none moved.
        SpendKind::Hold | SpendKind::Void => {}
    }
    for field in ["balance", "available", "points_after"] {
        if number(field).is_some_and(|value| value < 0) {
            flag(
                ViolationKind::Negative,
                ticket,
                format!("{field} below zero in {}", compact(Some(body))),
            );
        }
    }
}

/// Whether an entry's kind is a spend (money or points leave the account).
fn is_spend(entry: &EntryRecord) -> bool {
    matches!(
        entry.kind.as_str(),
        "withdrawal" | "lottery_draw" | "order_payment" | "payout" | "hold_capture"
    )
}

/// [`AccountTally::double_spends`]; flags each stale write.
fn double_spends(
    account: &AccountRecord,
    final_account: &AccountState,
    flag: &mut impl FnMut(ViolationKind, Option<&str>, String),
) -> u64 {
    let mut entries: Vec<&EntryRecord> = final_account.entries.iter().collect();
    entries.sort_by_key(|entry| entry.id);
    let (start, rest) = match entries.split_first() {
        Some((first, rest)) if first.kind == "opening" => {
            ((first.balance_after, first.points_after), rest)
        }
        _ => (
            (account.opening_balance, account.opening_points),
            entries.as_slice(),
        ),
    };
    // states[k]: balance and points after the k-th entry (0: the opening);
    // spend[k], undone[k]: whether that entry is a spend, and was overwritten already.
    let mut states = vec![start];
    let mut spend = vec![false];
    let mut undone = vec![false];
    let mut count = 0_u64;
    for entry in rest {
        let before = (
            entry.balance_after - entry.amount,
            entry.points_after - entry.points,
        );
        let last = states.len() - 1;
        if before != states[last] {
            let overwritten = match states.iter().rposition(|state| *state == before) {
                Some(found) => {
                    let mut spends = 0;
                    for index in found + 1..=last {
                        if spend[index] && !undone[index] {
                            spends += 1;
                        }
                        undone[index] = true;
                    }
                    count += spends;
                    format!(
                        "{} entries written since, {spends} of them spends",
                        last - found
                    )
                }
                None => {
                    count += 1;
                    "an unknown number of entries".to_owned()
                }
            };
            flag(
                ViolationKind::StaleWrite,
                entry.ticket_id.as_deref(),
                format!(
                    "entry {} was decided on balance {} and points {}, but the previous entry \
                     left {} and {}: it overwrote {overwritten}",
                    entry.id, before.0, before.1, states[last].0, states[last].1
                ),
            );
        }
        states.push((entry.balance_after, entry.points_after));
        spend.push(is_spend(entry));
        undone.push(false);
    }
    count + repeated_spend_entries(rest)
}

/// The spend entries beyond the first of each ticket: each one a ticket executed again.
fn repeated_spend_entries(entries: &[&EntryRecord]) -> u64 {
    let mut per_ticket: HashMap<&str, u64> = HashMap::new();
    for entry in entries.iter().filter(|entry| is_spend(entry)) {
        if let Some(ticket) = entry.ticket_id.as_deref() {
            *per_ticket.entry(ticket).or_default() += 1;
        }
    }
    per_ticket.values().map(|n| n - 1).sum::<u64>()
}

/// An account's entries against what the run did: the opening entry, the sums, no
/// negative balance, and one matching entry for each executed spend and none for any other.
fn audit_entries(
    account: &AccountRecord,
    spends: &[&SpendRecord],
    executed: &HashMap<&str, (&SpendRecord, Value)>,
    final_account: &AccountState,
    flag: &mut impl FnMut(ViolationKind, Option<&str>, String),
) {
    let entries = &final_account.entries;
    opening_matches(account, entries, flag);
    entries_add_up(final_account, flag);
    none_negative(entries, flag);
    let mut by_ticket: HashMap<&str, Vec<&EntryRecord>> = HashMap::new();
    for entry in entries {
        if let Some(ticket) = entry.ticket_id.as_deref() {
            by_ticket.entry(ticket).or_default().push(entry);
        }
    }
    for spend in spends {
        let ticket = spend.ticket.as_str();
        let found = by_ticket.remove(ticket).unwrap_or_default();
        match executed.get(ticket) {
            Some((spend, body)) => one_matching_entry(ticket, spend, body, &found, flag),
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

/// The first entry is the opening, with the money and points the account was opened with.
fn opening_matches(
    account: &AccountRecord,
    entries: &[EntryRecord],
    flag: &mut impl FnMut(ViolationKind, Option<&str>, String),
) {
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
}

/// The entries sum to what the account holds.
fn entries_add_up(
    final_account: &AccountState,
    flag: &mut impl FnMut(ViolationKind, Option<&str>, String),
) {
    let (sum_amount, sum_points) = final_account
        .entries
        .iter()
        .fold((0_i64, 0_i64), |(a, p), entry| {
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
}

/// No entry leaves the balance or the points below zero.
fn none_negative(
    entries: &[EntryRecord],
    flag: &mut impl FnMut(ViolationKind, Option<&str>, String),
) {
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
}

/// An executed spend has exactly one entry, of its kind, amount, points and order (a
/// draw's credit as its answer said).
fn one_matching_entry(
    ticket: &str,
    spend: &SpendRecord,
    body: &Value,
    found: &[&EntryRecord],
    flag: &mut impl FnMut(ViolationKind, Option<&str>, String),
) {
    let Some(kind) = spend.kind.entry_kind() else {
        // A hold, a void: money set aside or released, no entry.
        if !found.is_empty() {
            flag(
                ViolationKind::EntryMismatch,
                Some(ticket),
                format!("moves no money, yet has {} entries", found.len()),
            );
        }
        return;
    };
    let [entry] = found else {
        flag(
            ViolationKind::EntryMismatch,
            Some(ticket),
            format!("executed once, {} entries", found.len()),
        );
        return;
    };
    let (amount, points) = match spend.kind {
        SpendKind::Withdrawal
        | SpendKind::OrderPayment
        | SpendKind::Payout
        | SpendKind::Capture => (-spend.amount, 0),
        SpendKind::Deposit | SpendKind::Refund => (spend.amount, 0),
        SpendKind::LotteryDraw => (
            body.get("credit").and_then(Value::as_i64).unwrap_or(0),
            -spend.amount,
        ),
        SpendKind::Hold | SpendKind::Void => (0, 0),
    };
    let payout = body.get("payout_id").and_then(Value::as_str);
    // An order refund's entry names no order: the refund is its own row.
    let order = spend
        .order
        .as_ref()
        .filter(|_| spend.kind != SpendKind::Refund);
    if entry.kind != kind
        || (entry.amount, entry.points) != (amount, points)
        || entry.order_id.as_ref() != order
        || entry.payout_id.as_deref() != payout.filter(|_| spend.kind == SpendKind::Payout)
    {
        flag(
            ViolationKind::EntryMismatch,
            Some(ticket),
            format!(
                "expected a {kind} entry of {amount} and {points} points, found {} of {} and {}",
                entry.kind, entry.amount, entry.points
            ),
        );
    }
}

/// Each order the account's spends paid: at most one ticket was answered 201 and at most
/// one payment entry carries the order, by that ticket; a ticket refused as
/// `order-already-paid` found the order paid.
fn audit_orders(
    spends: &[&SpendRecord],
    executed: &HashMap<&str, (&SpendRecord, Value)>,
    refused_as_paid: &[&SpendRecord],
    final_account: &AccountState,
    flag: &mut impl FnMut(ViolationKind, Option<&str>, String),
) {
    let mut orders: Vec<&str> = spends
        .iter()
        .filter_map(|spend| spend.order.as_deref())
        .collect();
    orders.sort_unstable();
    orders.dedup();
    for order in orders {
        let paid: Vec<&str> = spends
            .iter()
            .filter(|spend| {
                spend.kind == SpendKind::OrderPayment && spend.order.as_deref() == Some(order)
            })
            .map(|spend| spend.ticket.as_str())
            .filter(|ticket| executed.contains_key(ticket))
            .collect();
        let payments: Vec<&EntryRecord> = final_account
            .entries
            .iter()
            .filter(|entry| entry.order_id.as_deref() == Some(order))
            .collect();
        if paid.len() > 1 || payments.len() > 1 {
            flag(
                ViolationKind::OrderPaidTwice,
                paid.first().copied(),
                format!(
                    "order {order}: {} tickets answered 201 ({}), {} payment entries",
                    paid.len(),
                    paid.join(", "),
                    payments.len()
                ),
            );
        } else if let ([ticket], [entry]) = (paid.as_slice(), payments.as_slice())
            && entry.ticket_id.as_deref() != Some(*ticket)
        {
            flag(
                ViolationKind::OrderMismatch,
                Some(ticket),
                format!(
                    "order {order}: answered 201 for this ticket, paid by {:?}",
                    entry.ticket_id
                ),
            );
        }
        for spend in refused_as_paid
            .iter()
            .filter(|spend| spend.order.as_deref() == Some(order))
        {
            if payments.is_empty() {
                flag(
                    ViolationKind::OrderMismatch,
                    Some(&spend.ticket),
                    format!("order {order}: refused as paid already, yet it has no payment"),
                );
            }
        }
    }
}

fn compact(body: Option<&Value>) -> String {
    body.map_or_else(|| "(no body)".to_owned(), Value::to_string)
}
