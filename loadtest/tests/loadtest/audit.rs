//! Recorded histories, clean and with planted faults, through the auditor.

use loadtest::audit::{AuditOptions, Unresolved, Violation, ViolationKind, audit, audit_with};
use loadtest::history::{
    AccountRecord, AccountState, Attempt, EntryRecord, FinalState, History, Role, SpendKind,
    SpendRecord, TicketAttempt, TicketState,
};
use serde_json::{Value, json};

const ACCOUNT: &str = "a1";

fn attempt(role: Role, status: u16, replayed: bool, body: Value) -> Attempt {
    Attempt {
        role,
        attempt: 1,
        target: 0,
        amount: 0,
        status: Some(status),
        replayed,
        body: Some(body),
        sent_at_ms: 0,
        latency_us: 1000,
        error: None,
        retry_after: None,
    }
}

fn problem(status: u16, name: &str) -> Value {
    json!({ "type": format!("/problems/{name}"), "title": name, "status": status, "detail": name })
}

pub(crate) fn entry(
    id: i64,
    ticket: Option<&str>,
    kind: &str,
    amount: i64,
    points: i64,
    balance_after: i64,
    points_after: i64,
) -> EntryRecord {
    EntryRecord {
        id,
        ticket_id: ticket.map(str::to_owned),
        kind: kind.into(),
        amount,
        points,
        balance_after,
        points_after,
        order_id: None,
        payout_id: None,
    }
}

/// A run's history on the one account, opened with 100 and `opening_points`: `tickets`,
/// the ticket requests, and `spends`.
pub(crate) fn history_of(
    opening_points: i64,
    tickets: Vec<TicketAttempt>,
    spends: Vec<SpendRecord>,
) -> History {
    History {
        targets: vec!["http://127.0.0.1:1".into()],
        accounts: vec![AccountRecord {
            id: ACCOUNT.into(),
            key: "k".into(),
            opening_balance: 100,
            opening_points,
        }],
        tickets,
        spends,
    }
}

/// The ledger's final state with the one account: `balance`, `points` and `entries`.
pub(crate) fn state_of(balance: i64, points: i64, entries: Vec<EntryRecord>) -> FinalState {
    let mut state = FinalState::default();
    state.accounts.insert(
        ACCOUNT.into(),
        AccountState {
            balance,
            points,
            available: None,
            entries,
        },
    );
    state
}

/// Opened with 100 and 3 points: a withdrawal of 30 (executed, then replayed twice, one
/// duplicate with another amount refused), a refused withdrawal of 500 (replayed), a draw
/// of 2 points crediting 10, a deposit of 5 whose only answer was a 503 but which the
/// ledger shows as executed, and a withdrawal that never executed (409 then 503).
fn clean() -> (History, FinalState) {
    let moved = json!({ "ticket_id": "t1", "account_id": ACCOUNT, "amount": 30, "balance": 70 });
    let broke = problem(402, "insufficient-funds");
    let drawn = json!({ "ticket_id": "t3", "account_id": ACCOUNT, "prize": "bronze", "credit": 10, "points": 2, "points_after": 1, "balance": 80 });
    let deposited = json!({ "ticket_id": "t4", "account_id": ACCOUNT, "amount": 5, "balance": 85 });
    let history = history_of(
        3,
        ["t1", "t2", "t3", "t4", "t5"]
            .into_iter()
            .map(|ticket| ticket_request(Some(201), Some(ticket), None))
            .collect(),
        vec![
            SpendRecord {
                ticket: "t1".into(),
                account: ACCOUNT.into(),
                kind: SpendKind::Withdrawal,
                amount: 30,
                order: None,
                hold: None,
                expires_in: None,
                attempts: vec![
                    attempt(Role::Original, 201, false, moved.clone()),
                    attempt(Role::ConcurrentDuplicate, 201, true, moved.clone()),
                    attempt(Role::LateDuplicate, 201, true, moved),
                    attempt(
                        Role::ChangedDuplicate,
                        422,
                        false,
                        problem(422, "idempotency-key-reuse"),
                    ),
                ],
            },
            SpendRecord {
                ticket: "t2".into(),
                account: ACCOUNT.into(),
                kind: SpendKind::Withdrawal,
                amount: 500,
                order: None,
                hold: None,
                expires_in: None,
                attempts: vec![
                    attempt(Role::Original, 402, false, broke.clone()),
                    attempt(Role::LateDuplicate, 402, true, broke),
                ],
            },
            SpendRecord {
                ticket: "t3".into(),
                account: ACCOUNT.into(),
                kind: SpendKind::LotteryDraw,
                amount: 2,
                order: None,
                hold: None,
                expires_in: None,
                attempts: vec![attempt(Role::Original, 201, false, drawn)],
            },
            SpendRecord {
                ticket: "t4".into(),
                account: ACCOUNT.into(),
                kind: SpendKind::Deposit,
                amount: 5,
                order: None,
                hold: None,
                expires_in: None,
                attempts: vec![attempt(Role::Original, 503, false, problem(503, "timeout"))],
            },
            SpendRecord {
                ticket: "t5".into(),
                account: ACCOUNT.into(),
                kind: SpendKind::Withdrawal,
                amount: 1,
                order: None,
                hold: None,
                expires_in: None,
                attempts: vec![
                    attempt(Role::Original, 409, false, problem(409, "account-busy")),
                    attempt(
                        Role::ConcurrentDuplicate,
                        503,
                        false,
                        problem(503, "lock-lost"),
                    ),
                ],
            },
        ],
    );
    let mut state = state_of(
        85,
        1,
        vec![
            entry(1, None, "opening", 100, 3, 100, 3),
            entry(2, Some("t1"), "withdrawal", -30, 0, 70, 3),
            entry(3, Some("t3"), "lottery_draw", 10, -2, 80, 1),
            entry(4, Some("t4"), "deposit", 5, 0, 85, 1),
        ],
    );
    state.tickets.insert(
        "t4".into(),
        TicketState {
            state: "completed".into(),
            status: Some(201),
            body: Some(deposited),
        },
    );
    state.tickets.insert(
        "t5".into(),
        TicketState {
            state: "issued".into(),
            status: None,
            body: None,
        },
    );
    (history, state)
}

fn ticket_request(status: Option<u16>, ticket: Option<&str>, body: Option<Value>) -> TicketAttempt {
    TicketAttempt {
        account: ACCOUNT.into(),
        attempt: 1,
        target: 0,
        status,
        ticket: ticket.map(str::to_owned),
        body,
        sent_at_ms: 0,
        latency_us: 1000,
        error: status.is_none().then(|| "connection refused".to_owned()),
        retry_after: None,
    }
}

fn unanswered(role: Role) -> Attempt {
    Attempt {
        role,
        attempt: 1,
        target: 0,
        amount: 1,
        status: None,
        replayed: false,
        body: None,
        sent_at_ms: 0,
        latency_us: 1000,
        error: Some("connection reset by peer".into()),
        retry_after: None,
    }
}

pub(crate) fn kinds(history: &History, state: &FinalState) -> Vec<ViolationKind> {
    audit(history, state)
        .into_iter()
        .map(|violation| violation.kind)
        .collect()
}

/// Plants `entries` in the account's ledger in `state`, and sets its balance to `balance`
/// if given.
pub(crate) fn plant(state: &mut FinalState, balance: Option<i64>, entries: Vec<EntryRecord>) {
    let account = state.accounts.get_mut(ACCOUNT).unwrap();
    account.entries.extend(entries);
    if let Some(balance) = balance {
        account.balance = balance;
    }
}

/// Every kind in `expected` is among the `found` ones.
pub(crate) fn assert_flagged(found: Vec<ViolationKind>, expected: &[ViolationKind]) {
    for kind in expected {
        assert!(found.contains(kind), "{kind:?} not in {found:?}");
    }
}

/// The stale-write violations among `violations`.
fn stale_writes(violations: &[Violation]) -> Vec<&Violation> {
    violations
        .iter()
        .filter(|violation| violation.kind == ViolationKind::StaleWrite)
        .collect()
}

/// A consistent history passes, and counts no double spend. Its requests that ended on a
/// transient answer (t4's 503, t5's 409 and 503) are counted unresolved, with their two
/// tickets: t4's completed, t5's still issued.
#[test]
fn a_clean_history_passes() {
    let (history, state) = clean();
    assert_eq!(audit(&history, &state), vec![]);
    let audited = audit_with(&history, &state, &AuditOptions::default());
    assert_eq!(audited.tallies.len(), 1);
    assert_eq!(audited.tallies[0].double_spends, 0);
    assert_eq!(
        audited.unresolved,
        Unresolved {
            requests: 3,
            tickets: 2,
            completed: 1
        }
    );
}

/// A withdrawal executed twice — a second entry and the money gone — is flagged, and
/// counted as one double spend.
#[test]
fn a_planted_double_spend_is_flagged() {
    let (history, mut state) = clean();
    plant(
        &mut state,
        Some(55),
        vec![entry(5, Some("t1"), "withdrawal", -30, 0, 55, 1)],
    );
    assert_flagged(
        kinds(&history, &state),
        &[ViolationKind::EntryMismatch, ViolationKind::BalanceMismatch],
    );
    let audited = audit_with(&history, &state, &AuditOptions::default());
    assert_eq!(audited.tallies[0].double_spends, 1);
}

/// Lost updates: three withdrawals read the opening balance of 100 at once; the first two
/// are written in turn (90, then 70), and the third, decided on the 100 it read, writes 70
/// over them. Its entry is flagged as a stale write, and the two withdrawals it undid —
/// whose money left but is back in the balance — count as two double spends, not as
/// however many violations the audit raises.
#[test]
fn lost_updates_count_each_overwritten_spend() {
    let withdrawal = |ticket: &str, amount: i64, balance: i64| {
        let body = json!({ "ticket_id": ticket, "account_id": ACCOUNT, "amount": amount, "balance": balance });
        SpendRecord {
            ticket: ticket.into(),
            account: ACCOUNT.into(),
            kind: SpendKind::Withdrawal,
            amount,
            order: None,
            hold: None,
            expires_in: None,
            attempts: vec![attempt(Role::Original, 201, false, body)],
        }
    };
    let history = history_of(
        0,
        ["t1", "t2", "t3", "t4"]
            .into_iter()
            .map(|ticket| ticket_request(Some(201), Some(ticket), None))
            .collect(),
        vec![
            withdrawal("t1", 10, 90),
            withdrawal("t2", 20, 70),
            withdrawal("t3", 30, 70),
            // Decided on the 70 that t3 left: not a stale write.
            withdrawal("t4", 5, 65),
        ],
    );
    let state = state_of(
        65,
        0,
        vec![
            entry(1, None, "opening", 100, 0, 100, 0),
            entry(2, Some("t1"), "withdrawal", -10, 0, 90, 0),
            entry(3, Some("t2"), "withdrawal", -20, 0, 70, 0),
            entry(4, Some("t3"), "withdrawal", -30, 0, 70, 0),
            entry(5, Some("t4"), "withdrawal", -5, 0, 65, 0),
        ],
    );
    let audited = audit_with(&history, &state, &AuditOptions::default());
    let stale = stale_writes(&audited.violations);
    assert_eq!(stale.len(), 1, "{:#?}", audited.violations);
    assert_eq!(stale[0].ticket.as_deref(), Some("t3"));
    let tally = &audited.tallies[0];
    assert_eq!(tally.double_spends, 2, "{tally:?}");
    // 100 − 65 accepted, the ledger still holds 65: 30 units spent without being deducted.
    assert_eq!((tally.expected_balance, tally.final_balance), (35, 65));
}

/// A lost update of points: a draw of 2 that read the account after t1 (balance 70, 3
/// points) is written last, over t3's draw and t4's deposit. t3's points are back, to be
/// spent again: one double spend (the overwritten deposit lost money, it spent none).
#[test]
fn lost_points_count_too() {
    let (mut history, mut state) = clean();
    let drawn = json!({ "ticket_id": "t6", "account_id": ACCOUNT, "prize": "nothing", "credit": 0, "points": 2, "balance": 70 });
    history.spends.push(SpendRecord {
        ticket: "t6".into(),
        account: ACCOUNT.into(),
        kind: SpendKind::LotteryDraw,
        amount: 2,
        order: None,
        hold: None,
        expires_in: None,
        attempts: vec![attempt(Role::Original, 201, false, drawn)],
    });
    history
        .tickets
        .push(ticket_request(Some(201), Some("t6"), None));
    let account = state.accounts.get_mut(ACCOUNT).unwrap();
    account
        .entries
        .push(entry(5, Some("t6"), "lottery_draw", 0, -2, 70, 1));
    account.balance = 70;
    account.points = 1;
    let audited = audit_with(&history, &state, &AuditOptions::default());
    let stale = stale_writes(&audited.violations);
    assert_eq!(stale.len(), 1, "{:#?}", audited.violations);
    assert_eq!(audited.tallies[0].double_spends, 1);
}

/// A spend that got no answer at all — a server that crashed or hung — is flagged, unless
/// the run killed an instance on purpose and said so.
#[test]
fn an_unanswered_spend_is_flagged() {
    let (mut history, state) = clean();
    history.spends[4]
        .attempts
        .push(unanswered(Role::LateDuplicate));
    assert!(kinds(&history, &state).contains(&ViolationKind::Unanswered));
    let (mut history, state) = clean();
    history.spends[1]
        .attempts
        .push(unanswered(Role::ChangedDuplicate));
    assert!(kinds(&history, &state).contains(&ViolationKind::Unanswered));

    let expected = AuditOptions {
        unanswered_expected: true,
        ..AuditOptions::default()
    };
    let (mut history, state) = clean();
    history.spends[4]
        .attempts
        .push(unanswered(Role::LateDuplicate));
    assert_eq!(audit_with(&history, &state, &expected).violations, vec![]);
}

/// Ticket requests are audited too: a 201 with a ticket and a declared 503 pass; a 500, a
/// 404, a 201 without a ticket, or no answer at all are flagged.
#[test]
fn ticket_requests_are_audited() {
    let with = |request: TicketAttempt, options: AuditOptions| {
        let (mut history, state) = clean();
        history.tickets.push(request);
        audit_with(&history, &state, &options)
            .violations
            .into_iter()
            .map(|violation| violation.kind)
            .collect::<Vec<_>>()
    };
    let strict = AuditOptions::default();
    let declared = ticket_request(Some(503), None, Some(problem(503, "database-unavailable")));
    assert_eq!(with(declared, strict), vec![]);
    for undeclared in [
        ticket_request(Some(500), None, Some(problem(500, "internal-error"))),
        ticket_request(Some(503), None, Some(problem(503, "mystery"))),
        ticket_request(Some(404), None, Some(problem(404, "not-found"))),
        ticket_request(Some(201), None, Some(json!({}))),
    ] {
        assert_eq!(
            with(undeclared.clone(), strict),
            vec![ViolationKind::UndeclaredAnswer],
            "{undeclared:?}"
        );
    }
    assert_eq!(
        with(ticket_request(None, None, None), strict),
        vec![ViolationKind::Unanswered]
    );
    assert_eq!(
        with(
            ticket_request(None, None, None),
            AuditOptions {
                unanswered_expected: true,
                ..AuditOptions::default()
            }
        ),
        vec![]
    );
}

/// Money that left without any entry (a lost write, a double spend the ledger did not
/// record) is flagged by the balance alone.
#[test]
fn money_missing_without_an_entry_is_flagged() {
    let (history, mut state) = clean();
    state.accounts.get_mut(ACCOUNT).unwrap().balance = 55;
    assert_flagged(kinds(&history, &state), &[ViolationKind::BalanceMismatch]);
}

/// A replay whose body differs from the original is flagged.
#[test]
fn a_planted_replay_mismatch_is_flagged() {
    let (mut history, state) = clean();
    history.spends[0].attempts[2].body =
        Some(json!({ "ticket_id": "t1", "account_id": ACCOUNT, "amount": 30, "balance": 40 }));
    assert!(kinds(&history, &state).contains(&ViolationKind::ReplayMismatch));
}

/// Two attempts that both say they executed are flagged.
#[test]
fn two_executions_of_one_ticket_are_flagged() {
    let (mut history, state) = clean();
    history.spends[0].attempts[1].replayed = false;
    assert!(kinds(&history, &state).contains(&ViolationKind::ExecutedTwice));
}

/// A changed request under a used ticket that was executed instead of refused is flagged.
#[test]
fn a_reuse_that_was_not_refused_is_flagged() {
    let (mut history, state) = clean();
    history.spends[0].attempts[3] =
        attempt(Role::ChangedDuplicate, 201, false, json!({ "amount": 31 }));
    assert!(kinds(&history, &state).contains(&ViolationKind::ReuseNotRefused));
}

/// A 500, or a 503 of an undeclared kind, is flagged.
#[test]
fn undeclared_answers_are_flagged() {
    let (mut history, state) = clean();
    history.spends[4].attempts[0] =
        attempt(Role::Original, 500, false, problem(500, "internal-error"));
    assert!(kinds(&history, &state).contains(&ViolationKind::UndeclaredAnswer));
    let (mut history, state) = clean();
    history.spends[4].attempts[1] = attempt(
        Role::ConcurrentDuplicate,
        503,
        false,
        problem(503, "mystery"),
    );
    assert!(kinds(&history, &state).contains(&ViolationKind::UndeclaredAnswer));
}

/// An entry for a ticket that never executed, or one the run never sent, is flagged.
#[test]
fn stray_entries_are_flagged() {
    let (history, mut state) = clean();
    plant(
        &mut state,
        None,
        vec![
            entry(5, Some("t5"), "withdrawal", -1, 0, 84, 1),
            entry(6, Some("nobody"), "deposit", 1, 0, 85, 1),
        ],
    );
    assert_flagged(
        kinds(&history, &state),
        &[ViolationKind::EntryMismatch, ViolationKind::UnknownEntry],
    );
}

/// A balance below zero anywhere is flagged.
#[test]
fn negative_balances_are_flagged() {
    let (history, mut state) = clean();
    state.accounts.get_mut(ACCOUNT).unwrap().entries[1].balance_after = -1;
    assert!(kinds(&history, &state).contains(&ViolationKind::Negative));
}

/// The audit of a run whose clients resend.
const RETRIES: AuditOptions = AuditOptions {
    unanswered_expected: false,
    retries: true,
};

/// `attempt` as the `number`-th send of its request.
fn nth(number: u32, mut attempt: Attempt) -> Attempt {
    attempt.attempt = number;
    attempt
}

fn ticket_state(state: &str, status: Option<u16>, body: Option<Value>) -> TicketState {
    TicketState {
        state: state.into(),
        status,
        body,
    }
}

/// The clean history, with t2's original resent after it got no answer: its second send
/// was answered 402, which the ticket, read back, stores.
fn resent_after_no_answer() -> (History, FinalState) {
    let (mut history, mut state) = clean();
    let broke = problem(402, "insufficient-funds");
    history.spends[1].attempts = vec![
        unanswered(Role::Original),
        nth(2, attempt(Role::Original, 402, false, broke.clone())),
        attempt(Role::LateDuplicate, 402, true, broke.clone()),
    ];
    state.tickets.insert(
        "t2".into(),
        ticket_state("completed", Some(402), Some(broke)),
    );
    (history, state)
}

/// A request resent after it got no answer passes when the clients retry — the answer it
/// ended with is judged — and is flagged as unanswered when they do not.
#[test]
fn a_request_resent_after_no_answer_passes_with_retries() {
    let (history, state) = resent_after_no_answer();
    assert_eq!(audit_with(&history, &state, &RETRIES).violations, vec![]);
    assert_eq!(
        kinds(&history, &state),
        vec![ViolationKind::Unanswered],
        "without retries"
    );
}

/// A resend that executed again — answered 201 without `Idempotent-Replayed` beside the
/// original's 201 — is flagged, whichever attempt it was.
#[test]
fn a_resend_that_executed_again_is_flagged() {
    let (mut history, state) = clean();
    let moved = history.spends[0].attempts[0].body.clone().unwrap();
    history.spends[0].attempts[1] = attempt(
        Role::ConcurrentDuplicate,
        409,
        false,
        problem(409, "request-in-progress"),
    );
    history.spends[0].attempts.insert(
        2,
        nth(2, attempt(Role::ConcurrentDuplicate, 201, false, moved)),
    );
    let found = audit_with(&history, &state, &RETRIES).violations;
    assert!(
        found
            .iter()
            .any(|violation| violation.kind == ViolationKind::ExecutedTwice),
        "{found:#?}"
    );
}

/// A ticket that executed on a send whose answer was lost and again on the resend has two
/// entries and the money gone twice: flagged, and counted as a double spend.
#[test]
fn a_ticket_executed_by_a_lost_send_and_its_resend_is_flagged() {
    let (mut history, mut state) = clean();
    let moved = history.spends[0].attempts[0].body.clone().unwrap();
    history.spends[0].attempts[0] = unanswered(Role::Original);
    history.spends[0].attempts.insert(
        1,
        nth(2, attempt(Role::Original, 201, false, moved.clone())),
    );
    state.tickets.insert(
        "t1".into(),
        ticket_state("completed", Some(201), Some(moved)),
    );
    plant(
        &mut state,
        Some(55),
        vec![entry(5, Some("t1"), "withdrawal", -30, 0, 55, 1)],
    );
    let audited = audit_with(&history, &state, &RETRIES);
    let found: Vec<ViolationKind> = audited.violations.iter().map(|v| v.kind).collect();
    assert!(found.contains(&ViolationKind::EntryMismatch), "{found:?}");
    assert!(found.contains(&ViolationKind::BalanceMismatch), "{found:?}");
    assert_eq!(audited.tallies[0].double_spends, 1);
}

/// A request whose every send was transient or lost is unresolved: counted, not a
/// violation, while its ticket shows nothing executed; an entry for it is flagged.
#[test]
fn an_unresolved_request_is_counted_and_its_ticket_judged() {
    let (mut history, mut state) = clean();
    history.spends[4].attempts = vec![
        attempt(Role::Original, 409, false, problem(409, "account-busy")),
        nth(2, unanswered(Role::Original)),
        nth(
            3,
            attempt(Role::Original, 503, false, problem(503, "lock-lost")),
        ),
        nth(
            4,
            attempt(Role::Original, 429, false, problem(429, "rate-limited")),
        ),
        nth(
            5,
            attempt(Role::Original, 503, false, problem(503, "outcome-unknown")),
        ),
    ];
    let audited = audit_with(&history, &state, &RETRIES);
    assert_eq!(audited.violations, vec![]);
    assert_eq!(
        audited.unresolved,
        Unresolved {
            requests: 2,
            tickets: 2,
            completed: 1
        }
    );

    plant(
        &mut state,
        Some(84),
        vec![entry(5, Some("t5"), "withdrawal", -1, 0, 84, 1)],
    );
    let found: Vec<ViolationKind> = audit_with(&history, &state, &RETRIES)
        .violations
        .iter()
        .map(|violation| violation.kind)
        .collect();
    assert!(found.contains(&ViolationKind::EntryMismatch), "{found:?}");
}

/// A ticket read back must store the outcome its requests were answered with: another
/// outcome is flagged as a mismatch; none at all (still issued, or a ticket the ledger
/// does not know) as an acknowledged outcome lost.
#[test]
fn a_stored_outcome_unlike_the_answer_is_flagged() {
    let moved = json!({ "ticket_id": "t2", "account_id": ACCOUNT, "amount": 500, "balance": 0 });
    for (stored, expected) in [
        (
            ticket_state("completed", Some(201), Some(moved)),
            ViolationKind::StoredOutcomeMismatch,
        ),
        (
            ticket_state("issued", None, None),
            ViolationKind::AcknowledgedOutcomeLost,
        ),
        (
            TicketState::missing(),
            ViolationKind::AcknowledgedOutcomeLost,
        ),
    ] {
        let (history, mut state) = resent_after_no_answer();
        state.tickets.insert("t2".into(), stored.clone());
        let found: Vec<ViolationKind> = audit_with(&history, &state, &RETRIES)
            .violations
            .iter()
            .map(|violation| violation.kind)
            .collect();
        assert_eq!(found, vec![expected], "{stored:?}");
    }
}

/// The clean history with every ticket read back as the ledger holds it, and each
/// acknowledged request resent once after the run ([`Role::Recheck`]), replayed.
fn rechecked() -> (History, FinalState) {
    let (mut history, mut state) = clean();
    for spend in &mut history.spends {
        let given = spend
            .attempts
            .iter()
            .find(|attempt| {
                attempt.role != Role::ChangedDuplicate && matches!(attempt.status, Some(201 | 402))
            })
            .cloned();
        if let Some(given) = given {
            state.tickets.insert(
                spend.ticket.clone(),
                ticket_state("completed", given.status, given.body.clone()),
            );
            let mut recheck = given;
            recheck.role = Role::Recheck;
            recheck.replayed = true;
            spend.attempts.push(recheck);
        }
    }
    (history, state)
}

/// Every acknowledged outcome in the ledger and replayed by a resend after the run passes.
#[test]
fn acknowledged_outcomes_that_replay_pass() {
    let (history, state) = rechecked();
    assert_eq!(audit_with(&history, &state, &RETRIES).violations, vec![]);
}

/// An acknowledged withdrawal the ledger lost — the failover's replica never had it —
/// executes again when resent after the run: flagged by name, as lost (the ticket read
/// back is issued) and as executed again, not as a duplicate of the load.
#[test]
fn an_acknowledged_outcome_lost_and_executed_again_is_flagged() {
    let (mut history, mut state) = rechecked();
    state
        .tickets
        .insert("t1".into(), ticket_state("issued", None, None));
    let again = json!({ "ticket_id": "t1", "account_id": ACCOUNT, "amount": 30, "balance": 55 });
    let recheck = history.spends[0].attempts.last_mut().unwrap();
    recheck.replayed = false;
    recheck.body = Some(again);
    let found = kinds_with_retries(&history, &state);
    assert!(
        found.contains(&ViolationKind::AcknowledgedOutcomeLost),
        "{found:?}"
    );
    assert!(found.contains(&ViolationKind::ExecutedAgain), "{found:?}");
    assert!(!found.contains(&ViolationKind::ExecutedTwice), "{found:?}");
    assert!(!found.contains(&ViolationKind::ReplayMismatch), "{found:?}");
}

/// A resend after the run that finds no ticket (404 `ticket-not-found`) means the ledger
/// lost the ticket with its outcome.
#[test]
fn a_recheck_that_finds_no_ticket_is_an_acknowledged_outcome_lost() {
    let (mut history, mut state) = rechecked();
    state.tickets.insert("t3".into(), TicketState::missing());
    let recheck = history.spends[2].attempts.last_mut().unwrap();
    recheck.status = Some(404);
    recheck.replayed = false;
    recheck.body = Some(problem(404, "ticket-not-found"));
    let found = kinds_with_retries(&history, &state);
    assert!(
        found
            .iter()
            .all(|kind| *kind == ViolationKind::AcknowledgedOutcomeLost),
        "{found:?}"
    );
    assert_eq!(found.len(), 2, "the read-back and the resend: {found:?}");
}

fn kinds_with_retries(history: &History, state: &FinalState) -> Vec<ViolationKind> {
    audit_with(history, state, &RETRIES)
        .violations
        .iter()
        .map(|violation| violation.kind)
        .collect()
}

/// 429 `rate-limited` and 503 `outcome-unknown` are declared transient answers, for spends
/// and ticket requests alike; a 429 of another type is not.
#[test]
fn rate_limits_and_unknown_outcomes_are_declared() {
    let (mut history, state) = clean();
    history.spends[4].attempts[0] =
        attempt(Role::Original, 429, false, problem(429, "rate-limited"));
    history.spends[4].attempts[1] = attempt(
        Role::ConcurrentDuplicate,
        503,
        false,
        problem(503, "outcome-unknown"),
    );
    history.tickets.push(ticket_request(
        Some(429),
        None,
        Some(problem(429, "rate-limited")),
    ));
    history.tickets.push(ticket_request(
        Some(503),
        None,
        Some(problem(503, "outcome-unknown")),
    ));
    assert_eq!(kinds(&history, &state), vec![]);
    history.spends[4].attempts[0] = attempt(Role::Original, 429, false, problem(429, "slow-down"));
    assert_eq!(
        kinds(&history, &state),
        vec![ViolationKind::UndeclaredAnswer]
    );
}

/// A ticket request that got no answer is not a violation when the clients resend it.
#[test]
fn an_unanswered_ticket_request_passes_with_retries() {
    let (mut history, state) = clean();
    history.tickets.push(ticket_request(None, None, None));
    assert_eq!(audit_with(&history, &state, &RETRIES).violations, vec![]);
    assert_eq!(kinds(&history, &state), vec![ViolationKind::Unanswered]);
}

/// An order of 40 placed by the account of `clean()`, paid with two tickets at once: `p1`
/// paid it, `p2` was refused as paid already.
fn order_paid_once() -> (History, FinalState) {
    let (mut history, mut state) = clean();
    let paid = json!({ "order_id": "o1", "ticket_id": "p1", "account_id": ACCOUNT, "amount": 40, "balance": 45, "state": "paid" });
    for (ticket, answer) in [
        ("p1", attempt(Role::Original, 201, false, paid)),
        (
            "p2",
            attempt(
                Role::Original,
                409,
                false,
                problem(409, "order-already-paid"),
            ),
        ),
    ] {
        history
            .tickets
            .push(ticket_request(Some(201), Some(ticket), None));
        history.spends.push(SpendRecord {
            ticket: ticket.into(),
            account: ACCOUNT.into(),
            kind: SpendKind::OrderPayment,
            amount: 40,
            order: Some("o1".into()),
            hold: None,
            expires_in: None,
            attempts: vec![answer],
        });
    }
    let account = state.accounts.get_mut(ACCOUNT).unwrap();
    account.balance = 45;
    let mut payment = entry(5, Some("p1"), "order_payment", -40, 0, 45, 1);
    payment.order_id = Some("o1".into());
    account.entries.push(payment);
    (history, state)
}

#[test]
fn an_order_paid_once_with_the_other_ticket_refused_passes() {
    let (history, state) = order_paid_once();
    assert_eq!(kinds(&history, &state), vec![]);
}

#[test]
fn an_order_paid_by_two_tickets_is_flagged() {
    let (mut history, mut state) = order_paid_once();
    let twice = json!({ "order_id": "o1", "ticket_id": "p2", "account_id": ACCOUNT, "amount": 40, "balance": 5, "state": "paid" });
    history.spends[6].attempts = vec![attempt(Role::Original, 201, false, twice)];
    let account = state.accounts.get_mut(ACCOUNT).unwrap();
    account.balance = 5;
    let mut second = entry(6, Some("p2"), "order_payment", -40, 0, 5, 1);
    second.order_id = Some("o1".into());
    account.entries.push(second);
    assert!(
        kinds(&history, &state).contains(&ViolationKind::OrderPaidTwice),
        "{:#?}",
        audit(&history, &state)
    );
}

#[test]
fn a_refusal_as_paid_for_an_unpaid_order_is_flagged() {
    let (mut history, mut state) = order_paid_once();
    let broke = problem(402, "insufficient-funds");
    history.spends[5].attempts = vec![attempt(Role::Original, 402, false, broke)];
    let account = state.accounts.get_mut(ACCOUNT).unwrap();
    account.balance = 85;
    account.entries.pop();
    assert_eq!(kinds(&history, &state), vec![ViolationKind::OrderMismatch]);
}

/// An account opened with a 201 that the ledger does not know after the run (its reads
/// answered 401 or 404): one acknowledged outcome lost, naming it, and its spends — lost
/// with it — not judged one by one.
#[test]
fn an_account_the_ledger_lost_is_one_acknowledged_outcome_lost() {
    let (history, mut state) = rechecked();
    state.accounts.clear();
    state.tickets.clear();
    state.lost_accounts.push(ACCOUNT.into());
    let found = audit_with(&history, &state, &RETRIES).violations;
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].kind, ViolationKind::AcknowledgedOutcomeLost);
    assert_eq!(found[0].account, ACCOUNT);
}

/// A spend of `kind` on `hold` (or `order`) by `ticket`, answered once with `status` and
/// `body`.
fn on_payment(
    ticket: &str,
    kind: SpendKind,
    amount: i64,
    (hold, order): (Option<&str>, Option<&str>),
    status: u16,
    body: Value,
) -> SpendRecord {
    SpendRecord {
        ticket: ticket.into(),
        account: ACCOUNT.into(),
        kind,
        amount,
        order: order.map(str::to_owned),
        hold: hold.map(str::to_owned),
        expires_in: (kind == SpendKind::Hold).then_some(3600),
        attempts: vec![attempt(Role::Original, status, false, body)],
    }
}

/// Opened with 100: a hold of 50 (h1, by t1) captured in part — 30, by t2 — a void of it
/// refused (t3), a refund of 10 of it (t4), and one of 25 refused as past the payment (t5);
/// a hold of 20 (h2, by t6) still held. Balance 80, available 60.
fn holds_clean() -> (History, FinalState) {
    let hold = (Some("h1"), None);
    let spends = vec![
        on_payment(
            "t1",
            SpendKind::Hold,
            50,
            (None, None),
            201,
            json!({ "hold_id": "h1", "amount": 50, "balance": 100, "available": 50 }),
        ),
        on_payment(
            "t2",
            SpendKind::Capture,
            30,
            hold,
            200,
            json!({ "hold_id": "h1", "captured_amount": 30, "balance": 70, "available": 70 }),
        ),
        on_payment(
            "t3",
            SpendKind::Void,
            0,
            hold,
            409,
            json!({ "type": "/problems/hold-not-held", "state": "captured" }),
        ),
        on_payment(
            "t4",
            SpendKind::Refund,
            10,
            hold,
            201,
            json!({ "amount": 10, "refundable": 20, "balance": 80 }),
        ),
        on_payment(
            "t5",
            SpendKind::Refund,
            25,
            hold,
            409,
            json!({ "type": "/problems/refund-exceeds-payment", "refundable": 20 }),
        ),
        on_payment(
            "t6",
            SpendKind::Hold,
            20,
            (None, None),
            201,
            json!({ "hold_id": "h2", "amount": 20, "balance": 80, "available": 60 }),
        ),
    ];
    let tickets = ["t1", "t2", "t3", "t4", "t5", "t6"]
        .into_iter()
        .map(|ticket| ticket_request(Some(201), Some(ticket), None))
        .collect();
    let history = history_of(0, tickets, spends);
    let mut state = state_of(
        80,
        0,
        vec![
            entry(1, None, "opening", 100, 0, 100, 0),
            entry(2, Some("t2"), "hold_capture", -30, 0, 70, 0),
            entry(3, Some("t4"), "refund", 10, 0, 80, 0),
        ],
    );
    state.accounts.get_mut(ACCOUNT).unwrap().available = Some(60);
    let read =
        |ticket: &str, amount, state: &str, captured, refunded| loadtest::history::HoldRead {
            account: ACCOUNT.into(),
            ticket: ticket.into(),
            amount,
            state: state.into(),
            captured_amount: captured,
            refunded_amount: refunded,
        };
    state
        .holds
        .insert("h1".into(), read("t1", 50, "captured", Some(30), 10));
    state
        .holds
        .insert("h2".into(), read("t6", 20, "held", None, 0));
    (history, state)
}

/// Holds and refunds as the ledger should leave them pass; a hold resolved twice (its
/// capture executed, yet it reads expired), refunds beyond what was captured, and money
/// available that is not the balance less what is held are each flagged.
#[test]
fn holds_resolved_twice_refunds_past_the_payment_and_available_are_flagged() {
    let (history, state) = holds_clean();
    assert_eq!(kinds(&history, &state), Vec::<ViolationKind>::new());

    let mut expired = state.clone();
    expired.holds.get_mut("h1").unwrap().state = "expired".into();
    assert_flagged(
        kinds(&history, &expired),
        &[ViolationKind::HoldResolvedTwice],
    );

    // The refusal of 25 executed after all: 35 back of a capture of 30.
    let mut past = history.clone();
    past.spends[4] = on_payment(
        "t5",
        SpendKind::Refund,
        25,
        (Some("h1"), None),
        201,
        json!({ "amount": 25, "refundable": 0, "balance": 105 }),
    );
    let mut refunded = state.clone();
    plant(
        &mut refunded,
        Some(105),
        vec![entry(4, Some("t5"), "refund", 25, 0, 105, 0)],
    );
    refunded.holds.get_mut("h1").unwrap().refunded_amount = 35;
    refunded.accounts.get_mut(ACCOUNT).unwrap().available = Some(85);
    assert_flagged(kinds(&past, &refunded), &[ViolationKind::RefundedTooMuch]);

    // The ledger forgot the hold still held: all 80 available.
    let mut available = state;
    available.accounts.get_mut(ACCOUNT).unwrap().available = Some(80);
    assert_flagged(
        kinds(&history, &available),
        &[ViolationKind::AvailableMismatch],
    );
}
