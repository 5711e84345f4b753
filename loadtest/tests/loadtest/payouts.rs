//! Payouts through the auditor: a failed payout's money comes back once, and the bank's
//! transfers are reconciled with the payouts — planted faults are found. A payout refused
//! by a target without a bank is a final answer, judged by its ticket; and a real run
//! against instances without a bank stops its payouts and says why.

use loadtest::audit::{AuditOptions, Unresolved, ViolationKind, audit_with};
use loadtest::history::{
    Attempt, BankTransfer, EntryRecord, FinalState, History, PayoutState, PayoutStatus, Role,
    SpendKind, SpendRecord, TicketState, TransferState,
};
use loadtest::report::{print_summary, write_json};
use loadtest::run::{Mix, RunOptions, run};
use serde_json::json;

use crate::audit::{assert_flagged, history_of, kinds, plant, state_of};
use crate::end_to_end::{Distributed, options};

const ACCOUNT: &str = "a1";

fn accepted(ticket: &str, payout: &str, amount: i64, balance: i64) -> Attempt {
    Attempt {
        role: Role::Original,
        attempt: 1,
        target: 0,
        amount,
        status: Some(202),
        replayed: false,
        body: Some(json!({
            "payout_id": payout, "ticket_id": ticket, "account_id": ACCOUNT, "amount": amount,
            "destination": "d", "balance": balance, "status": "pending"
        })),
        sent_at_ms: 0,
        latency_us: 1000,
        error: None,
        retry_after: None,
    }
}

/// An entry of money only; `payout` names its payout (empty: none).
fn entry(
    id: i64,
    ticket: Option<&str>,
    kind: &str,
    payout: &str,
    amount: i64,
    after: i64,
) -> EntryRecord {
    EntryRecord {
        payout_id: (!payout.is_empty()).then(|| payout.to_owned()),
        ..crate::audit::entry(id, ticket, kind, amount, 0, after, 0)
    }
}

fn payout(id: &str, ticket: &str, amount: i64, status: PayoutStatus) -> PayoutState {
    PayoutState {
        payout_id: id.into(),
        account_id: ACCOUNT.into(),
        ticket_id: ticket.into(),
        amount,
        status,
        bank_key: format!("payonce-{id}"),
        bank_transfer_id: None,
        attempts: 1,
    }
}

fn transfer(
    id: i64,
    key: &str,
    state: TransferState,
    amount: i64,
    reference: &str,
) -> BankTransfer {
    BankTransfer {
        id,
        idempotency_key: key.into(),
        state,
        amount,
        reference: reference.into(),
    }
}

/// Opened with 100: p1 pays out 20 and succeeds, the bank executed it; p2 pays out 10,
/// the bank declined it, and its 10 came back in one reversal.
fn clean() -> (History, FinalState) {
    let spend = |ticket: &str, amount, attempt| SpendRecord {
        ticket: ticket.into(),
        account: ACCOUNT.into(),
        kind: SpendKind::Payout,
        amount,
        order: None,
        hold: None,
        expires_in: None,
        attempts: vec![attempt],
    };
    let history = history_of(
        0,
        Vec::new(),
        vec![
            spend("t1", 20, accepted("t1", "p1", 20, 80)),
            spend("t2", 10, accepted("t2", "p2", 10, 70)),
        ],
    );
    let mut state = state_of(
        80,
        0,
        vec![
            entry(1, None, "opening", "", 100, 100),
            entry(2, Some("t1"), "payout", "p1", -20, 80),
            entry(3, Some("t2"), "payout", "p2", -10, 70),
            entry(4, None, "payout_reversal", "p2", 10, 80),
        ],
    );
    state
        .payouts
        .insert("p1".into(), payout("p1", "t1", 20, PayoutStatus::Succeeded));
    state
        .payouts
        .insert("p2".into(), payout("p2", "t2", 10, PayoutStatus::Failed));
    state.bank = Some(vec![
        transfer(1, "payonce-p1", TransferState::Executed, 20, "p1"),
        transfer(2, "payonce-p2", TransferState::Declined, 10, "p2"),
    ]);
    (history, state)
}

/// The consistent history passes, and the tally says where each payout ended.
#[test]
fn a_clean_payout_history_passes() {
    let (history, state) = clean();
    let audited = audit_with(&history, &state, &AuditOptions::default());
    assert_eq!(audited.violations, vec![]);
    let tally = audited.payouts;
    assert_eq!(
        (tally.payouts, tally.succeeded, tally.failed, tally.pending),
        (2, 1, 1, 0)
    );
    assert_eq!((tally.executed_at_bank, tally.executed_twice), (1, 0));
    assert!(tally.bank_read);
}

/// A second transfer for one payout — another key, as a fresh key per attempt makes it —
/// is money paid out twice.
#[test]
fn a_payout_executed_twice_at_the_bank_is_flagged() {
    let (history, mut state) = clean();
    if let Some(bank) = state.bank.as_mut() {
        bank.push(transfer(3, "fresh-key", TransferState::Executed, 20, "p1"));
    }
    assert_eq!(kinds(&history, &state), vec![ViolationKind::PaidTwice]);
    let tally = audit_with(&history, &state, &AuditOptions::default()).payouts;
    assert_eq!(tally.executed_twice, 1);
}

/// A failed payout whose money came back, yet the bank executed it.
#[test]
fn a_reversed_payout_the_bank_executed_is_flagged() {
    let (history, mut state) = clean();
    if let Some(bank) = state.bank.as_mut() {
        bank[1].state = TransferState::Executed;
    }
    assert_eq!(
        kinds(&history, &state),
        vec![ViolationKind::ReversedButExecuted]
    );
}

/// A succeeded payout the bank does not hold — or holds for another amount.
#[test]
fn a_succeeded_payout_missing_at_the_bank_is_flagged() {
    let (history, mut state) = clean();
    if let Some(bank) = state.bank.as_mut() {
        bank[0].amount = 21;
    }
    assert_eq!(kinds(&history, &state), vec![ViolationKind::MissingAtBank]);
    if let Some(bank) = state.bank.as_mut() {
        bank.remove(0);
    }
    assert_eq!(kinds(&history, &state), vec![ViolationKind::MissingAtBank]);
}

/// A failed payout without its reversal: the money did not come back.
#[test]
fn a_failed_payout_without_its_reversal_is_flagged() {
    let (history, mut state) = clean();
    let account = state.accounts.get_mut(ACCOUNT).unwrap();
    account.entries.pop();
    account.balance = 70;
    assert_flagged(
        kinds(&history, &state),
        &[ViolationKind::EntryMismatch, ViolationKind::BalanceMismatch],
    );
}

/// A reversal for a payout that succeeded gives money back that left: flagged, as is one
/// naming no payout of the run.
#[test]
fn a_reversal_of_a_succeeded_payout_is_flagged() {
    for (payout, amount, balance, expected) in [
        ("p1", 20, 100, ViolationKind::EntryMismatch),
        ("p9", 5, 85, ViolationKind::UnknownEntry),
    ] {
        let (history, mut state) = clean();
        plant(
            &mut state,
            Some(balance),
            vec![entry(5, None, "payout_reversal", payout, amount, balance)],
        );
        assert_flagged(kinds(&history, &state), &[expected]);
    }
}

/// A payout's answer is 202: a withdrawal answered 202 is not declared, nor a payout
/// answered 201.
#[test]
fn a_payout_is_answered_202_and_nothing_else_is() {
    let (mut history, state) = clean();
    history.spends[0].attempts[0].status = Some(201);
    assert!(kinds(&history, &state).contains(&ViolationKind::UndeclaredAnswer));
    let (mut history, state) = clean();
    history.spends[0].kind = SpendKind::Withdrawal;
    assert!(kinds(&history, &state).contains(&ViolationKind::UndeclaredAnswer));
}

/// A payout to a target without a bank: 503 `payouts-unavailable`, from the original and
/// its concurrent copy, each sent once.
fn refused_for_want_of_a_bank(ticket: &str, amount: i64) -> SpendRecord {
    let refused = |role, target| Attempt {
        role,
        attempt: 1,
        target,
        amount,
        status: Some(503),
        replayed: false,
        body: Some(json!({
            "type": "/problems/payouts-unavailable", "title": "Payouts unavailable",
            "status": 503, "detail": "payouts are not set up on this instance"
        })),
        sent_at_ms: 5,
        latency_us: 800,
        error: None,
        retry_after: None,
    };
    SpendRecord {
        ticket: ticket.into(),
        account: ACCOUNT.into(),
        kind: SpendKind::Payout,
        amount,
        order: None,
        hold: None,
        expires_in: None,
        attempts: vec![
            refused(Role::Original, 0),
            refused(Role::ConcurrentDuplicate, 1),
        ],
    }
}

/// A payout refused for want of a bank ends there — not unresolved — and its ticket,
/// read back, decides: still issued, it has no entry and moved nothing. The same answer to
/// a withdrawal is not declared.
#[test]
fn a_payout_refused_for_want_of_a_bank_is_final_and_judged_by_its_ticket() {
    let (mut history, mut state) = clean();
    history.spends.push(refused_for_want_of_a_bank("t3", 30));
    let issued = TicketState {
        state: "issued".into(),
        status: None,
        body: None,
    };
    state.tickets.insert("t3".into(), issued);
    let audited = audit_with(&history, &state, &AuditOptions::default());
    assert_eq!(audited.violations, vec![]);
    assert_eq!(audited.unresolved, Unresolved::default());

    let mut withdrawal = history.clone();
    if let Some(spend) = withdrawal.spends.last_mut() {
        spend.kind = SpendKind::Withdrawal;
    }
    assert!(kinds(&withdrawal, &state).contains(&ViolationKind::UndeclaredAnswer));
}

/// A ticket whose payout requests all ended refused for want of a bank, yet which the
/// read-back shows executed (another target accepted it): the stored outcome is judged
/// like any other, and a payout with no entry is found.
#[test]
fn a_refused_payout_whose_ticket_executed_after_all_needs_its_entry() {
    let (mut history, mut state) = clean();
    history.spends.push(refused_for_want_of_a_bank("t3", 30));
    let executed = TicketState {
        state: "completed".into(),
        status: Some(202),
        body: accepted("t3", "p3", 30, 50).body,
    };
    state.tickets.insert("t3".into(), executed);
    assert_flagged(
        kinds(&history, &state),
        &[ViolationKind::EntryMismatch, ViolationKind::BalanceMismatch],
    );
}

/// Against instances started without a bank, the run stops sending payouts on the first
/// 503 `payouts-unavailable`: the payouts already on their way are refused, each sent once
/// and none left unresolved; the rest of the payouts' share goes out as withdrawals; the
/// audit passes; and the summary and the JSON report say why payouts stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_against_instances_without_a_bank_stops_its_payouts_and_says_why() {
    let shared = Distributed::new().await;
    let targets = vec![
        shared.serve_without_a_bank().await,
        shared.serve_without_a_bank().await,
    ];
    let options = options(targets.clone());
    let clients = options.clients;
    let result = run(RunOptions {
        // A fifth of the spends drawn as payouts: many are drawn after the stop.
        mix: Mix {
            withdrawal: 0.2,
            payout: 0.2,
            ..Mix::default()
        },
        ..options
    })
    .await
    .unwrap();
    assert!(result.violations.is_empty(), "{:#?}", result.violations);
    assert_eq!(result.unresolved, Unresolved::default());

    let stopped = result.payouts_stopped.clone().expect("payouts stopped");
    assert!(targets.contains(&stopped.target), "{stopped:?}");
    assert!(stopped.detail.contains("PAYONCE_BANK_URL"), "{stopped:?}");
    assert!(stopped.sent_as_withdrawals > 0, "{stopped:?}");
    // Only the payouts on their way before the first refusal was known were sent — one at
    // most per client — and each request once: every one refused.
    let payouts: Vec<&SpendRecord> = result
        .history
        .spends
        .iter()
        .filter(|spend| spend.kind == SpendKind::Payout)
        .collect();
    assert!(
        !payouts.is_empty() && payouts.len() <= clients,
        "{} payouts sent",
        payouts.len()
    );
    let attempts: Vec<&Attempt> = payouts.iter().flat_map(|payout| &payout.attempts).collect();
    assert!(
        attempts
            .iter()
            .all(|attempt| attempt.payouts_unavailable() && attempt.attempt == 1),
        "{attempts:#?}"
    );
    assert_eq!(stopped.refused, attempts.len() as u64);
    assert_eq!((result.counts.accepted, result.payouts.payouts), (0, 0));

    let mut summary = Vec::new();
    print_summary(&result, &mut summary).unwrap();
    let summary = String::from_utf8(summary).unwrap();
    let line = summary
        .lines()
        .find(|line| line.starts_with("payouts stopped"))
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(
        line.contains("has no bank") && line.contains(&stopped.detail),
        "{line}"
    );
    assert!(summary.contains("AUDIT PASSED"), "{summary}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    write_json(&result, &path).unwrap();
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(report["payouts_stopped"]["detail"], json!(stopped.detail));
    assert_eq!(report["payouts_stopped"]["refused"], json!(stopped.refused));
}
