//! Recorded histories, clean and with planted faults, through the auditor.

use loadtest::audit::{ViolationKind, audit};
use loadtest::history::{
    AccountRecord, AccountState, Attempt, EntryRecord, FinalState, History, Role, SpendKind,
    SpendRecord, TicketState,
};
use serde_json::{Value, json};

const ACCOUNT: &str = "a1";

fn attempt(role: Role, status: u16, replayed: bool, body: Value) -> Attempt {
    Attempt {
        role,
        target: 0,
        amount: 0,
        status,
        replayed,
        body: Some(body),
        sent_at_ms: 0,
        latency_us: 1000,
        error: None,
    }
}

fn problem(status: u16, name: &str) -> Value {
    json!({ "type": format!("/problems/{name}"), "title": name, "status": status, "detail": name })
}

fn entry(
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
    }
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
    let history = History {
        targets: vec!["http://127.0.0.1:1".into()],
        accounts: vec![AccountRecord {
            id: ACCOUNT.into(),
            key: "k".into(),
            opening_balance: 100,
            opening_points: 3,
        }],
        spends: vec![
            SpendRecord {
                ticket: "t1".into(),
                account: ACCOUNT.into(),
                kind: SpendKind::Withdrawal,
                amount: 30,
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
                attempts: vec![attempt(Role::Original, 201, false, drawn)],
            },
            SpendRecord {
                ticket: "t4".into(),
                account: ACCOUNT.into(),
                kind: SpendKind::Deposit,
                amount: 5,
                attempts: vec![attempt(Role::Original, 503, false, problem(503, "timeout"))],
            },
            SpendRecord {
                ticket: "t5".into(),
                account: ACCOUNT.into(),
                kind: SpendKind::Withdrawal,
                amount: 1,
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
    };
    let mut state = FinalState::default();
    state.accounts.insert(
        ACCOUNT.into(),
        AccountState {
            balance: 85,
            points: 1,
            entries: vec![
                entry(1, None, "opening", 100, 3, 100, 3),
                entry(2, Some("t1"), "withdrawal", -30, 0, 70, 3),
                entry(3, Some("t3"), "lottery_draw", 10, -2, 80, 1),
                entry(4, Some("t4"), "deposit", 5, 0, 85, 1),
            ],
        },
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

fn kinds(history: &History, state: &FinalState) -> Vec<ViolationKind> {
    audit(history, state)
        .into_iter()
        .map(|violation| violation.kind)
        .collect()
}

/// A consistent history passes.
#[test]
fn a_clean_history_passes() {
    let (history, state) = clean();
    assert_eq!(audit(&history, &state), vec![]);
}

/// A withdrawal executed twice — a second entry and the money gone — is flagged.
#[test]
fn a_planted_double_spend_is_flagged() {
    let (history, mut state) = clean();
    let account = state.accounts.get_mut(ACCOUNT).unwrap();
    account
        .entries
        .push(entry(5, Some("t1"), "withdrawal", -30, 0, 55, 1));
    account.balance = 55;
    let found = kinds(&history, &state);
    assert!(found.contains(&ViolationKind::EntryMismatch), "{found:?}");
    assert!(found.contains(&ViolationKind::BalanceMismatch), "{found:?}");
}

/// Money that left without any entry (a lost write, a double spend the ledger did not
/// record) is flagged by the balance alone.
#[test]
fn money_missing_without_an_entry_is_flagged() {
    let (history, mut state) = clean();
    state.accounts.get_mut(ACCOUNT).unwrap().balance = 55;
    let found = kinds(&history, &state);
    assert!(found.contains(&ViolationKind::BalanceMismatch), "{found:?}");
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
    let account = state.accounts.get_mut(ACCOUNT).unwrap();
    account
        .entries
        .push(entry(5, Some("t5"), "withdrawal", -1, 0, 84, 1));
    account
        .entries
        .push(entry(6, Some("nobody"), "deposit", 1, 0, 85, 1));
    let found = kinds(&history, &state);
    assert!(found.contains(&ViolationKind::EntryMismatch), "{found:?}");
    assert!(found.contains(&ViolationKind::UnknownEntry), "{found:?}");
}

/// A balance below zero anywhere is flagged.
#[test]
fn negative_balances_are_flagged() {
    let (history, mut state) = clean();
    state.accounts.get_mut(ACCOUNT).unwrap().entries[1].balance_after = -1;
    assert!(kinds(&history, &state).contains(&ViolationKind::Negative));
}
