//! One function per behaviour; `main.rs` runs each on both databases.

use std::time::Duration;

use ledger::testing::TestDatabase;
use ledger::{
    AccountId, Amount, Applied, ApplyError, ApplyRequest, EntryKind, Execution, Ledger, NewAccount,
    NewOrder, Operation, OperationResult, Order, PointsToSpend, Refusal, Renderer, Rule, TicketId,
    TicketState,
};
use serde_json::{Value, json};

const HOUR: Duration = Duration::from_secs(3600);

/// A renderer that records everything the ledger decided; a refusal also gets a problem
/// `type` named as the API names it.
pub fn render(execution: &Execution<'_>) -> Value {
    let problem = match *execution.result {
        OperationResult::Applied { .. } => None,
        OperationResult::Refused(Refusal::InsufficientFunds { .. }) => {
            Some("/problems/insufficient-funds")
        }
        OperationResult::Refused(Refusal::InsufficientPoints { .. }) => {
            Some("/problems/insufficient-points")
        }
        OperationResult::Refused(Refusal::BalanceLimit { .. }) => Some("/problems/balance-limit"),
        OperationResult::Refused(Refusal::OrderAlreadyPaid { .. }) => {
            Some("/problems/order-already-paid")
        }
        OperationResult::HoldChanged { .. } | OperationResult::Refunded { .. } => None,
        OperationResult::Refused(Refusal::HoldNotHeld { .. }) => Some("/problems/hold-not-held"),
        OperationResult::Refused(Refusal::CaptureExceedsHold { .. }) => {
            Some("/problems/capture-exceeds-hold")
        }
        OperationResult::Refused(Refusal::RefundExceedsPayment { .. }) => {
            Some("/problems/refund-exceeds-payment")
        }
        OperationResult::Refused(Refusal::OrderNotPaid) => Some("/problems/order-not-paid"),
    };
    let (kind, balance, points, credit, prize) = match *execution.result {
        OperationResult::Applied {
            balance,
            points,
            credit,
            prize,
        } => (
            "applied".to_owned(),
            balance,
            points,
            credit,
            prize.map(|p| p.label),
        ),
        OperationResult::Refused(refusal) => (format!("{refusal:?}"), -1, -1, 0, None),
        OperationResult::HoldChanged {
            hold,
            balance,
            available,
        } => {
            return json!({
                "ticket_id": execution.ticket_id,
                "account_id": execution.account_id,
                "result": "hold",
                "hold_id": hold.id,
                "state": hold.state.as_str(),
                "amount": hold.amount.get(),
                "captured_amount": hold.captured_amount,
                "balance": balance,
                "available": available,
            });
        }
        OperationResult::Refunded {
            refund,
            refunded_total,
            refundable,
            balance,
        } => {
            return json!({
                "ticket_id": execution.ticket_id,
                "account_id": execution.account_id,
                "result": "refunded",
                "refund_id": refund.id,
                "amount": refund.amount.get(),
                "refunded_total": refunded_total,
                "refundable": refundable,
                "balance": balance,
            });
        }
    };
    json!({
        "ticket_id": execution.ticket_id,
        "account_id": execution.account_id,
        "result": kind,
        "balance": balance,
        "points": points,
        "credit": credit,
        "prize": prize,
        "type": problem,
    })
}

const RENDER: &Renderer = &render;

pub async fn open(database: &TestDatabase) -> Ledger {
    database.open().await.unwrap()
}

pub async fn account(ledger: &Ledger, balance: i64, points: i64) -> AccountId {
    let new = NewAccount::new("test", balance, points).unwrap();
    ledger.create_account(&new).await.unwrap().0.id
}

pub fn withdrawal(amount: i64) -> Operation {
    Operation::Withdrawal(Amount::new(amount).unwrap())
}

pub async fn apply(
    ledger: &Ledger,
    account_id: AccountId,
    ticket_id: TicketId,
    operation: Operation,
    fingerprint: &str,
    token: u64,
) -> Result<Applied, ApplyError> {
    ledger
        .apply(
            ApplyRequest {
                ticket_id,
                account_id,
                operation,
                fingerprint,
                fencing_token: token,
            },
            RENDER,
        )
        .await
}

pub async fn assert_clean(ledger: &Ledger) {
    let violations = ledger.audit().await.unwrap();
    assert!(violations.is_empty(), "{violations:#?}");
}

/// Opening an account records the opening balance and points as its first entry.
pub async fn opening_an_account_writes_its_opening_entry(database: &TestDatabase) {
    let ledger = open(database).await;
    let (account, key) = ledger
        .create_account(&NewAccount::new("Ada", 1500, 7).unwrap())
        .await
        .unwrap();
    assert_eq!(
        (account.name.as_str(), account.balance, account.points),
        ("Ada", 1500, 7)
    );
    assert!(key.starts_with("po_") && key.len() > 40);
    assert_eq!(
        ledger.account(account.id).await.unwrap(),
        Some(account.clone())
    );
    let entries = ledger.entries(account.id, None, 10).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].kind, ledger::EntryKind::Opening);
    assert_eq!((entries[0].amount, entries[0].points), (1500, 7));
    assert_eq!(entries[0].ticket_id, None);
    assert_clean(&ledger).await;
}

/// A key finds its own account and nothing else; the key is not what is stored.
pub async fn api_keys_authenticate_only_their_account(database: &TestDatabase) {
    let ledger = open(database).await;
    let (first, first_key) = ledger
        .create_account(&NewAccount::new("a", 0, 0).unwrap())
        .await
        .unwrap();
    let (second, second_key) = ledger
        .create_account(&NewAccount::new("b", 0, 0).unwrap())
        .await
        .unwrap();
    assert_eq!(
        ledger.authenticate(&first_key).await.unwrap(),
        Some(first.id)
    );
    assert_eq!(
        ledger.authenticate(&second_key).await.unwrap(),
        Some(second.id)
    );
    assert_eq!(ledger.authenticate("po_not-a-key").await.unwrap(), None);
    assert_eq!(ledger.authenticate("").await.unwrap(), None);
}

/// 64 concurrent withdrawals with distinct tickets, each with its own fencing token as 64
/// overlapping lock holders would present them, on an account that can afford exactly
/// 10: whatever order they commit in, no more than the money goes out. Each write that
/// commits after a newer token is refused as stale and stores nothing; the others succeed
/// until the balance is spent and are then stored as insufficient funds.
pub async fn concurrent_distinct_tickets_succeed_exactly_as_far_as_the_money_goes(
    database: &TestDatabase,
) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let mut tickets = Vec::new();
    for _ in 0..64 {
        tickets.push(ledger.issue_ticket(account_id, HOUR).await.unwrap().id);
    }
    let tasks: Vec<_> = tickets
        .iter()
        .zip(1..)
        .map(|(&ticket, token)| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                apply(&ledger, account_id, ticket, withdrawal(100), "w100", token).await
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(match task.await.unwrap() {
            Ok(applied) => {
                assert!(!applied.replayed);
                Some(applied.response.status)
            }
            Err(ApplyError::StaleToken { .. }) => None,
            Err(error) => panic!("{error:?}"),
        });
    }
    let succeeded = statuses.iter().filter(|&&s| s == Some(201)).count();
    let refused = statuses.iter().filter(|&&s| s == Some(402)).count();
    let stale = statuses.iter().filter(|s| s.is_none()).count();
    assert!(succeeded <= 10, "{succeeded} withdrawals of 100 from 1000");
    assert!(succeeded >= 1, "the newest token always writes");
    assert_eq!(succeeded + refused + stale, 64);
    if refused > 0 {
        assert_eq!(succeeded, 10, "refused while money was left");
    }
    // Each outcome is stored under its ticket as what it is, not only answered; a stale
    // write stored nothing.
    for (&ticket, &status) in tickets.iter().zip(&statuses) {
        let Some(status) = status else {
            let stored = ledger.ticket(ticket).await.unwrap().unwrap();
            assert!(stored.outcome.is_none(), "a stale write stored an outcome");
            continue;
        };
        let stored = ledger
            .ticket(ticket)
            .await
            .unwrap()
            .and_then(|ticket| ticket.outcome)
            .and_then(|outcome| outcome.response)
            .unwrap_or_else(|| panic!("ticket {ticket:?} has no stored response"));
        assert_eq!(stored.status, status, "ticket {ticket:?}");
        if status == 402 {
            let problem = stored.body["type"].as_str().unwrap_or_default();
            assert!(
                problem.ends_with("insufficient-funds"),
                "ticket {ticket:?}: {}",
                stored.body
            );
        }
    }
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        1000 - 100 * i64::try_from(succeeded).unwrap()
    );
    assert_eq!(
        ledger.entries(account_id, None, 100).await.unwrap().len(),
        1 + succeeded
    );
    assert_clean(&ledger).await;
}

/// 64 concurrent uses of one ticket: one execution, 63 replays equal to it.
pub async fn concurrent_uses_of_one_ticket_execute_once(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                apply(&ledger, account_id, ticket, withdrawal(100), "w100", 1)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let originals: Vec<_> = results.iter().filter(|r| !r.replayed).collect();
    assert_eq!(originals.len(), 1);
    let original = &originals[0].response;
    assert_eq!(original.status, 201);
    assert!(results.iter().all(|r| &r.response == original));
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        900
    );
    assert_eq!(
        ledger.entries(account_id, None, 100).await.unwrap().len(),
        2
    );
    assert_clean(&ledger).await;
}

/// A holder that paused past its lease comes back with an older fencing token after the
/// next holder committed: it writes nothing and learns the recorded token.
pub async fn stale_fencing_token_writes_nothing(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let paused = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let successor = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let applied = apply(&ledger, account_id, successor, withdrawal(700), "w700", 8)
        .await
        .unwrap();
    assert_eq!(applied.response.status, 201);

    // The balance (300) affords the stale withdrawal: only the fencing check refuses it.
    let error = apply(&ledger, account_id, paused, withdrawal(200), "w200", 7)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            ApplyError::StaleToken {
                presented: 7,
                recorded: 8
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        300
    );
    let entries = ledger.entries(account_id, None, 100).await.unwrap();
    assert_eq!(entries.len(), 2, "{entries:#?}");
    assert!(
        entries.iter().all(|entry| entry.ticket_id != Some(paused)),
        "a stale write left an entry: {entries:#?}"
    );
    let ticket = ledger.ticket(paused).await.unwrap().unwrap();
    assert!(ticket.outcome.is_none(), "a stale write stored an outcome");
    assert_eq!(ticket.state(), TicketState::Issued);
    assert_eq!(ledger.fencing_token(account_id).await.unwrap(), Some(8));
    // The same ticket, retried under a fresh lock, executes once.
    let retried = apply(&ledger, account_id, paused, withdrawal(100), "w100", 9)
        .await
        .unwrap();
    assert_eq!(retried.response.status, 201);
    assert_clean(&ledger).await;
}

/// A repeat with a different request under a used ticket executes nothing.
pub async fn fingerprint_mismatch_executes_nothing(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    apply(&ledger, account_id, ticket, withdrawal(100), "w100", 1)
        .await
        .unwrap();
    let error = apply(&ledger, account_id, ticket, withdrawal(200), "w200", 2)
        .await
        .unwrap_err();
    assert!(
        matches!(error, ApplyError::FingerprintMismatch),
        "{error:?}"
    );
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        900
    );
    assert_eq!(ledger.fencing_token(account_id).await.unwrap(), Some(1));
    assert_clean(&ledger).await;
}

/// An unused ticket past its expiry cannot be used.
pub async fn expired_ticket_is_refused(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let ticket = ledger
        .issue_ticket(account_id, Duration::from_millis(20))
        .await
        .unwrap()
        .id;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let error = apply(&ledger, account_id, ticket, withdrawal(100), "w100", 1)
        .await
        .unwrap_err();
    assert!(matches!(error, ApplyError::TicketExpired), "{error:?}");
    let ticket = ledger.ticket(ticket).await.unwrap().unwrap();
    assert_eq!(ticket.state(), TicketState::Expired);
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        1000
    );
}

/// A ticket issued to one account is unknown to every other.
pub async fn ticket_of_another_account_is_unknown(database: &TestDatabase) {
    let ledger = open(database).await;
    let owner = account(&ledger, 1000, 0).await;
    let other = account(&ledger, 1000, 0).await;
    let ticket = ledger.issue_ticket(owner, HOUR).await.unwrap().id;
    let error = apply(&ledger, other, ticket, withdrawal(100), "w100", 1)
        .await
        .unwrap_err();
    assert!(matches!(error, ApplyError::UnknownTicket), "{error:?}");
    let error = apply(
        &ledger,
        owner,
        TicketId::random(),
        withdrawal(100),
        "w100",
        1,
    )
    .await
    .unwrap_err();
    assert!(matches!(error, ApplyError::UnknownTicket), "{error:?}");
    assert_eq!(ledger.account(other).await.unwrap().unwrap().balance, 1000);
}

/// A refusal is an outcome: stored, replayed, and final even once the money is there.
pub async fn refusals_are_stored_and_stay_refused(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 50, 0).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let first = apply(&ledger, account_id, ticket, withdrawal(100), "w100", 1)
        .await
        .unwrap();
    assert_eq!(first.response.status, 402);
    assert_eq!(
        first.response.body["result"],
        "InsufficientFunds { balance: 50 }"
    );

    let top_up = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let deposit = Operation::Deposit(Amount::new(500).unwrap());
    assert_eq!(
        apply(&ledger, account_id, top_up, deposit, "d500", 2)
            .await
            .unwrap()
            .response
            .status,
        201
    );

    let again = apply(&ledger, account_id, ticket, withdrawal(100), "w100", 3)
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.response, first.response);
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        550
    );
    assert_clean(&ledger).await;
}

/// A draw spends points, may credit money, and a replay shows the same prize. Not enough
/// points is a stored refusal.
pub async fn lottery_draw_replays_the_same_prize(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 0, 10).await;
    let draw = Operation::LotteryDraw(PointsToSpend::new(4).unwrap());
    let mut credited = 0;
    for round in 0..2 {
        let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
        let first = apply(&ledger, account_id, ticket, draw, "draw4", round + 1)
            .await
            .unwrap();
        assert_eq!(first.response.status, 201);
        let replay = apply(&ledger, account_id, ticket, draw, "draw4", round + 1)
            .await
            .unwrap();
        assert!(replay.replayed);
        assert_eq!(replay.response.body["prize"], first.response.body["prize"]);
        assert_eq!(replay.response, first.response);
        credited += first.response.body["credit"].as_i64().unwrap();
    }
    let account = ledger.account(account_id).await.unwrap().unwrap();
    assert_eq!((account.points, account.balance), (2, credited));

    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let refused = apply(&ledger, account_id, ticket, draw, "draw4", 5)
        .await
        .unwrap();
    assert_eq!(refused.response.status, 402);
    assert_eq!(
        refused.response.body["result"],
        "InsufficientPoints { points: 2 }"
    );
    assert_clean(&ledger).await;
}

/// A deposit that would push the balance past i64 is refused and stored, not an error.
pub async fn deposit_that_would_overflow_is_refused(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, i64::MAX - 10, 0).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let deposit = Operation::Deposit(Amount::new(11).unwrap());
    let refused = apply(&ledger, account_id, ticket, deposit, "d11", 1)
        .await
        .unwrap();
    assert_eq!(refused.response.status, 422);
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let deposit = Operation::Deposit(Amount::new(10).unwrap());
    assert_eq!(
        apply(&ledger, account_id, ticket, deposit, "d10", 2)
            .await
            .unwrap()
            .response
            .status,
        201
    );
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        i64::MAX
    );
    assert_clean(&ledger).await;
}

/// The reaper deletes unused tickets long expired and drops outcomes kept past the
/// retention, but a pruned ticket never executes again.
pub async fn reaper_deletes_expired_tickets_and_prunes_old_outcomes(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let unused = ledger
        .issue_ticket(account_id, Duration::from_millis(10))
        .await
        .unwrap()
        .id;
    let used = ledger
        .issue_ticket(account_id, Duration::from_millis(300))
        .await
        .unwrap()
        .id;
    let fresh = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    apply(&ledger, account_id, used, withdrawal(100), "w100", 1)
        .await
        .unwrap();
    // Outcomes are kept for the retention after their ticket's expiry: not yet.
    assert_eq!(
        ledger
            .reap(Duration::from_millis(100), 1)
            .await
            .unwrap()
            .pruned_outcomes,
        0
    );
    tokio::time::sleep(Duration::from_millis(450)).await;

    let reaped = ledger.reap(Duration::from_millis(100), 1).await.unwrap();
    assert_eq!((reaped.deleted_unused, reaped.pruned_outcomes), (1, 1));
    assert!(ledger.ticket(unused).await.unwrap().is_none());
    assert!(ledger.ticket(fresh).await.unwrap().is_some());
    let pruned = ledger.ticket(used).await.unwrap().unwrap();
    assert!(
        pruned
            .outcome
            .as_ref()
            .is_some_and(|outcome| outcome.response.is_none())
    );

    let error = apply(&ledger, account_id, used, withdrawal(100), "w100", 2)
        .await
        .unwrap_err();
    assert!(matches!(error, ApplyError::OutcomePruned), "{error:?}");
    let error = apply(&ledger, account_id, used, withdrawal(5), "w5", 2)
        .await
        .unwrap_err();
    assert!(
        matches!(error, ApplyError::FingerprintMismatch),
        "{error:?}"
    );
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        900
    );
    assert_clean(&ledger).await;
}

/// Entries come oldest first, a page at a time.
pub async fn entries_page_oldest_first(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    for amount in 1..=5 {
        let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
        apply(
            &ledger,
            account_id,
            ticket,
            withdrawal(amount),
            &format!("w{amount}"),
            amount.unsigned_abs(),
        )
        .await
        .unwrap();
    }
    let first = ledger.entries(account_id, None, 4).await.unwrap();
    let rest = ledger
        .entries(account_id, Some(first[3].id), 4)
        .await
        .unwrap();
    let amounts: Vec<i64> = first.iter().chain(&rest).map(|e| e.amount).collect();
    assert_eq!(amounts, [1000, -1, -2, -3, -4, -5]);
    let balances: Vec<i64> = first.iter().chain(&rest).map(|e| e.balance_after).collect();
    assert_eq!(balances, [1000, 999, 997, 994, 990, 985]);
}

async fn used_account(ledger: &Ledger) -> AccountId {
    let account_id = account(ledger, 1000, 0).await;
    for token in 1..=3 {
        let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
        apply(ledger, account_id, ticket, withdrawal(10), "w10", token)
            .await
            .unwrap();
    }
    assert_clean(ledger).await;
    account_id
}

fn has(violations: &[ledger::Violation], rule: Rule, account_id: AccountId) -> bool {
    violations
        .iter()
        .any(|v| v.rule == rule && v.account_id == Some(account_id))
}

/// The account's recorded fencing token only grows: the database itself refuses to lower
/// it, even to a hand-written UPDATE; raising it, or leaving it, is allowed.
pub async fn fencing_token_cannot_be_lowered(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = used_account(&ledger).await;
    assert_eq!(ledger.fencing_token(account_id).await.unwrap(), Some(3));
    let error = database
        .execute("UPDATE accounts SET fencing_token = 2")
        .await
        .unwrap_err();
    assert!(
        matches!(error, ledger::LedgerError::Database(_))
            && error.to_string().contains("only grows"),
        "{error:?}"
    );
    assert_eq!(ledger.fencing_token(account_id).await.unwrap(), Some(3));

    database
        .execute("UPDATE accounts SET fencing_token = 3, name = 'renamed'")
        .await
        .unwrap();
    database
        .execute("UPDATE accounts SET fencing_token = 4")
        .await
        .unwrap();
    assert_eq!(ledger.fencing_token(account_id).await.unwrap(), Some(4));
    assert_clean(&ledger).await;
}

/// Money changed behind the ledger's back is found.
pub async fn audit_finds_a_planted_balance_change(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = used_account(&ledger).await;
    database
        .execute("UPDATE accounts SET balance = balance + 1")
        .await
        .unwrap();
    let violations = ledger.audit().await.unwrap();
    assert!(
        has(&violations, Rule::BalanceMatchesEntries, account_id),
        "{violations:#?}"
    );
}

/// An account whose recorded token went backwards is found.
pub async fn audit_finds_a_planted_token_regression(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = used_account(&ledger).await;
    // The database refuses this (see `fencing_token_cannot_be_lowered`); the audit is for
    // a database where that protection was taken away.
    let disable = if database.url().starts_with("sqlite:") {
        "DROP TRIGGER accounts_fencing_token_only_grows"
    } else {
        "ALTER TABLE accounts DISABLE TRIGGER accounts_fencing_token_only_grows"
    };
    database.execute(disable).await.unwrap();
    database
        .execute("UPDATE accounts SET fencing_token = 1")
        .await
        .unwrap();
    let violations = ledger.audit().await.unwrap();
    assert!(
        has(&violations, Rule::FencingTokenOnlyGrows, account_id),
        "{violations:#?}"
    );
}

/// A success stored without its entry (or an entry for a refusal) is found.
pub async fn audit_finds_a_planted_outcome_without_entry(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = used_account(&ledger).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let refused = apply(&ledger, account_id, ticket, withdrawal(5000), "w5000", 4)
        .await
        .unwrap();
    assert_eq!(refused.response.status, 402);
    database
        .execute("UPDATE tickets SET response_status = 201 WHERE response_status = 402")
        .await
        .unwrap();
    let violations = ledger.audit().await.unwrap();
    assert!(
        has(&violations, Rule::OutcomeMatchesEntry, account_id),
        "{violations:#?}"
    );
}

#[cfg(feature = "demo")]
/// The demonstration's read-check-write: two writes decided from the same read both
/// succeed, the second erases the first, and the audit sees it; a ticket completed by
/// another request is not written twice.
pub async fn unguarded_read_check_write_loses_an_update(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 100, 0).await;
    let (first, second) = (
        ledger.issue_ticket(account_id, HOUR).await.unwrap().id,
        ledger.issue_ticket(account_id, HOUR).await.unwrap().id,
    );
    let read = ledger.read_unguarded(account_id).await.unwrap();
    assert_eq!((read.balance, read.points), (100, 0));
    for ticket in [first, second] {
        let written = ledger
            .write_unguarded(ticket, account_id, withdrawal(100), "w100", &read, RENDER)
            .await
            .unwrap()
            .expect("written");
        assert_eq!(written.response.status, 201);
    }
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        0
    );
    let violations = ledger.audit().await.unwrap();
    assert!(
        has(&violations, Rule::BalanceMatchesEntries, account_id),
        "{violations:#?}"
    );
    let again = ledger
        .write_unguarded(first, account_id, withdrawal(100), "w100", &read, RENDER)
        .await
        .unwrap();
    assert!(again.is_none(), "a completed ticket was written again");
}

/// A token equal to the one the account recorded is refused like an older one: two grants
/// carrying one number (a lock store that lost its counters handed it out twice) must not
/// both write, whichever comes second — a move or a business refusal.
pub async fn an_equal_fencing_token_is_refused(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let first = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let second = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let overdraw = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let applied = apply(&ledger, account_id, first, withdrawal(100), "w100", 5)
        .await
        .unwrap();
    assert_eq!(applied.response.status, 201);
    for (ticket, amount) in [(second, 100), (overdraw, 5000)] {
        let error = apply(&ledger, account_id, ticket, withdrawal(amount), "w", 5)
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                ApplyError::StaleToken {
                    presented: 5,
                    recorded: 5
                }
            ),
            "{error:?}"
        );
        let stored = ledger.ticket(ticket).await.unwrap().unwrap();
        assert!(
            stored.outcome.is_none(),
            "a refused write stored an outcome"
        );
    }
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        900
    );
    // The next grant writes.
    let applied = apply(&ledger, account_id, second, withdrawal(100), "w100", 6)
        .await
        .unwrap();
    assert_eq!(applied.response.status, 201);
    assert_clean(&ledger).await;
}

/// Expiry is judged by the database's clock once the ticket is locked, not when the
/// request began: a spend that waits for the ticket's lock past the ticket's expiry is
/// refused as expired (and the refusal is final: nothing is stored, nothing moves).
pub async fn expiry_is_judged_after_waiting_for_the_ticket(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let ticket = ledger
        .issue_ticket(account_id, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(ticket.state(), TicketState::Issued);
    let held = database.lock_ticket_elsewhere(ticket.id).await.unwrap();
    let spend = {
        let ledger = ledger.clone();
        tokio::spawn(async move {
            apply(&ledger, account_id, ticket.id, withdrawal(100), "w100", 1).await
        })
    };
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(!spend.is_finished(), "the spend did not wait for the lock");
    held.release().await.unwrap();
    let error = spend.await.unwrap().unwrap_err();
    assert!(matches!(error, ApplyError::TicketExpired), "{error:?}");
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        1000
    );
    assert_eq!(
        ledger.ticket(ticket.id).await.unwrap().unwrap().state(),
        TicketState::Expired
    );
}

/// The stored body of a spend that went through is the renderer's, with the balance and
/// points after it — filled in by the database on PostgreSQL's one-statement path.
pub async fn the_stored_body_is_the_renderers_with_the_numbers_after(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 10).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let applied = apply(&ledger, account_id, ticket, withdrawal(300), "w300", 1)
        .await
        .unwrap();
    let expected = render(&Execution {
        ticket_id: ticket,
        account_id,
        operation: &withdrawal(300),
        result: &OperationResult::Applied {
            balance: 700,
            points: 10,
            credit: 0,
            prize: None,
        },
    });
    assert_eq!(applied.response.body, expected);
    let stored = ledger.ticket(ticket).await.unwrap().unwrap();
    assert_eq!(stored.outcome.unwrap().response.unwrap().body, expected);

    let draw = Operation::LotteryDraw(PointsToSpend::new(4).unwrap());
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let drawn = apply(&ledger, account_id, ticket, draw, "draw4", 2)
        .await
        .unwrap()
        .response
        .body;
    let credit = drawn["credit"].as_i64().unwrap();
    assert_eq!(
        (&drawn["balance"], &drawn["points"]),
        (&json!(700 + credit), &json!(6)),
        "{drawn}"
    );
    assert_clean(&ledger).await;
}

/// A renderer may put the numbers anywhere, text included: the body is stored as it
/// renders them (on PostgreSQL by the transaction path, since the database cannot fill in
/// a number inside text).
pub async fn a_body_with_the_balance_in_its_text_is_stored_as_rendered(database: &TestDatabase) {
    fn wordy(execution: &Execution<'_>) -> Value {
        let balance = match *execution.result {
            OperationResult::Applied { balance, .. }
            | OperationResult::HoldChanged { balance, .. }
            | OperationResult::Refunded { balance, .. } => balance,
            OperationResult::Refused(_) => -1,
        };
        json!({ "balance": balance, "detail": format!("the balance is now {balance}") })
    }
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let request = ApplyRequest {
        ticket_id: ticket,
        account_id,
        operation: withdrawal(300),
        fingerprint: "w300",
        fencing_token: 1,
    };
    let applied = ledger.apply(request, &wordy).await.unwrap();
    assert_eq!(
        applied.response.body,
        json!({ "balance": 700, "detail": "the balance is now 700" })
    );
    let replayed = ledger.apply(request, &wordy).await.unwrap();
    assert!(replayed.replayed);
    assert_eq!(replayed.response, applied.response);
    assert_clean(&ledger).await;
}

async fn order(ledger: &Ledger, account_id: AccountId, amount: i64) -> Order {
    let new = NewOrder::new(Amount::new(amount).unwrap(), "an order").unwrap();
    ledger.create_order(account_id, &new).await.unwrap()
}

fn payment(order: &Order) -> Operation {
    Operation::OrderPayment {
        order: order.id,
        amount: order.amount,
    }
}

/// An order is paid by the first ticket that pays it; that ticket replays its 201, and
/// every other ticket is refused with 409 — stored under it and replayed, nothing moved.
pub async fn an_order_is_paid_once_whatever_the_ticket(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let placed = order(&ledger, account_id, 300).await;
    let (first, second) = (
        ledger.issue_ticket(account_id, HOUR).await.unwrap().id,
        ledger.issue_ticket(account_id, HOUR).await.unwrap().id,
    );
    let paid = apply(&ledger, account_id, first, payment(&placed), "pay", 1)
        .await
        .unwrap();
    assert_eq!((paid.response.status, paid.replayed), (201, false));
    assert_eq!(paid.response.body["balance"], 700);
    let again = apply(&ledger, account_id, first, payment(&placed), "pay", 2)
        .await
        .unwrap();
    assert_eq!(
        (again.response.clone(), again.replayed),
        (paid.response, true)
    );

    let refused = apply(&ledger, account_id, second, payment(&placed), "pay", 3)
        .await
        .unwrap();
    assert_eq!(refused.response.status, 409, "{}", refused.response.body);
    assert_eq!(
        refused.response.body["type"],
        json!("/problems/order-already-paid")
    );
    let replayed = apply(&ledger, account_id, second, payment(&placed), "pay", 4)
        .await
        .unwrap();
    assert_eq!((replayed.response.status, replayed.replayed), (409, true));

    let read = ledger.order(placed.id).await.unwrap().unwrap();
    assert_eq!(read.paid_by_ticket, Some(first));
    assert!(read.paid_at.is_some());
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        700
    );
    let entries = ledger.entries(account_id, None, 10).await.unwrap();
    let payments: Vec<_> = entries
        .iter()
        .filter(|entry| entry.kind == EntryKind::OrderPayment)
        .collect();
    assert_eq!(payments.len(), 1, "{entries:#?}");
    assert_eq!(
        (
            payments[0].order_id,
            payments[0].ticket_id,
            payments[0].amount
        ),
        (Some(placed.id), Some(first), -300)
    );
    assert_clean(&ledger).await;
}

/// An order the balance does not cover is refused with 402, stored under that ticket; the
/// order stays open and a later ticket pays it once the money is there.
pub async fn an_unaffordable_order_stays_open(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 100, 0).await;
    let placed = order(&ledger, account_id, 300).await;
    let short = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let refused = apply(&ledger, account_id, short, payment(&placed), "pay", 1)
        .await
        .unwrap();
    assert_eq!(refused.response.status, 402);
    assert_eq!(
        ledger
            .order(placed.id)
            .await
            .unwrap()
            .unwrap()
            .paid_by_ticket,
        None
    );
    let top_up = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let deposit = Operation::Deposit(Amount::new(500).unwrap());
    apply(&ledger, account_id, top_up, deposit, "d500", 1)
        .await
        .unwrap();
    let later = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let paid = apply(&ledger, account_id, later, payment(&placed), "pay", 2)
        .await
        .unwrap();
    assert_eq!(paid.response.status, 201, "{}", paid.response.body);
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        300
    );
    assert_clean(&ledger).await;
}

/// Another account's order, or an amount that is not the order's, is no order: nothing is
/// stored and the ticket stays usable. A token the order already saw is stale.
pub async fn an_order_payment_is_checked_against_its_order(database: &TestDatabase) {
    let ledger = open(database).await;
    let owner = account(&ledger, 1000, 0).await;
    let other = account(&ledger, 1000, 0).await;
    let placed = order(&ledger, owner, 300).await;
    let ticket = ledger.issue_ticket(other, HOUR).await.unwrap().id;
    let theirs = apply(&ledger, other, ticket, payment(&placed), "pay", 1).await;
    assert!(
        matches!(theirs, Err(ApplyError::UnknownOrder)),
        "{theirs:?}"
    );
    let ticket = ledger.issue_ticket(owner, HOUR).await.unwrap().id;
    let cheaper = Operation::OrderPayment {
        order: placed.id,
        amount: Amount::new(1).unwrap(),
    };
    let wrong = apply(&ledger, owner, ticket, cheaper, "pay", 1).await;
    assert!(matches!(wrong, Err(ApplyError::UnknownOrder)), "{wrong:?}");
    let paid = apply(&ledger, owner, ticket, payment(&placed), "pay", 5)
        .await
        .unwrap();
    assert_eq!(paid.response.status, 201);
    let late = ledger.issue_ticket(owner, HOUR).await.unwrap().id;
    let stale = apply(&ledger, owner, late, payment(&placed), "pay", 5).await;
    assert!(
        matches!(stale, Err(ApplyError::StaleToken { recorded: 5, .. })),
        "{stale:?}"
    );
    assert!(
        ledger
            .ticket(late)
            .await
            .unwrap()
            .unwrap()
            .outcome
            .is_none()
    );
    assert_clean(&ledger).await;
}

/// Payments of one order with distinct tickets and no lock at all (as when the order's
/// lock failed), each with its own token: the order is paid once; every other attempt is
/// refused (409) or stale; the money moved once.
pub async fn concurrent_payments_of_one_order_pay_once(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 10_000, 0).await;
    let placed = order(&ledger, account_id, 300).await;
    let mut tasks = Vec::new();
    for token in 1..=12_u64 {
        let ledger = ledger.clone();
        let placed = placed.clone();
        let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
        tasks.push(tokio::spawn(async move {
            apply(&ledger, account_id, ticket, payment(&placed), "pay", token).await
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(applied) => statuses.push(applied.response.status),
            Err(ApplyError::StaleToken { .. }) => statuses.push(0),
            Err(error) => panic!("{error}"),
        }
    }
    assert_eq!(
        statuses.iter().filter(|&&s| s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| [201, 409, 0].contains(s)),
        "{statuses:?}"
    );
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        9_700
    );
    assert_clean(&ledger).await;
}

/// A withdrawal (under the account's lock) and an order payment (under the order's) of
/// one account at once, together more than the balance: one goes through, the other is
/// refused for funds; the account is never overdrawn.
pub async fn an_order_payment_and_a_withdrawal_cannot_overdraw(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 500, 0).await;
    let placed = order(&ledger, account_id, 300).await;
    let (pay, take) = (
        ledger.issue_ticket(account_id, HOUR).await.unwrap().id,
        ledger.issue_ticket(account_id, HOUR).await.unwrap().id,
    );
    let paying = tokio::spawn({
        let ledger = ledger.clone();
        async move { apply(&ledger, account_id, pay, payment(&placed), "pay", 1).await }
    });
    let withdrawing = tokio::spawn({
        let ledger = ledger.clone();
        async move { apply(&ledger, account_id, take, withdrawal(300), "w300", 1).await }
    });
    let mut statuses = [
        paying.await.unwrap().unwrap().response.status,
        withdrawing.await.unwrap().unwrap().response.status,
    ];
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 402]);
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        200
    );
    assert_clean(&ledger).await;
}

/// The audit sees an order marked paid with no payment entry, and a payment entry whose
/// order says another ticket paid it.
pub async fn audit_finds_a_planted_order_paid_without_its_entry(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    order(&ledger, account_id, 300).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let refused = apply(&ledger, account_id, ticket, withdrawal(5000), "w5000", 1)
        .await
        .unwrap();
    assert_eq!(refused.response.status, 402);
    assert_clean(&ledger).await;
    database
        .execute(
            "UPDATE orders SET paid_by_ticket = (SELECT id FROM tickets), paid_at = created_at",
        )
        .await
        .unwrap();
    let violations = ledger.audit().await.unwrap();
    assert!(
        has(&violations, Rule::OrderPaidOnce, account_id),
        "{violations:#?}"
    );
}

/// What the API stores for an order: the order as created.
fn order_body(order: &Order) -> Value {
    json!({ "order_id": order.id, "amount": order.amount.get(), "description": order.description })
}

/// What the API stores for an account: the account, without its key.
fn account_body(account: &ledger::Account) -> Value {
    json!({ "id": account.id, "name": account.name, "balance": account.balance })
}

fn client(last: u8) -> std::net::IpAddr {
    std::net::IpAddr::from([10, 0, 0, last])
}

/// A create with an idempotency key is made once: a repeat with the same fingerprint gets
/// the first answer (and for an account the same API key, which authenticates it); another
/// fingerprint is refused and creates nothing; the same key in another scope (another
/// account's orders, another client's accounts) is another key.
pub async fn creates_with_a_key_answer_once(database: &TestDatabase) {
    let ledger = open(database).await;
    let key = uuid::Uuid::new_v4();
    let new = NewAccount::new("Ada", 500, 3).unwrap();

    let (first, api_key) = ledger
        .create_account_once(&new, client(1), key, "ada", &account_body)
        .await
        .unwrap();
    assert!(!first.replayed);
    assert_eq!(first.response.status, 201);
    assert_eq!(first.response.body["id"], json!(first.id));
    let (again, same_key) = ledger
        .create_account_once(&new, client(1), key, "ada", &account_body)
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!((again.id, &again.response), (first.id, &first.response));
    assert_eq!(same_key, api_key);
    let fresh = open(database).await; // no key cache: the database answers
    assert_eq!(fresh.authenticate(&same_key).await.unwrap(), Some(first.id));
    let reused = ledger
        .create_account_once(&new, client(1), key, "bob", &account_body)
        .await
        .unwrap_err();
    assert!(
        matches!(reused, ledger::LedgerError::CreateKeyReused),
        "{reused:?}"
    );
    let (elsewhere, other_key) = ledger
        .create_account_once(&new, client(2), key, "ada", &account_body)
        .await
        .unwrap();
    assert!(!elsewhere.replayed);
    assert_ne!((elsewhere.id, &other_key), (first.id, &api_key));

    let account_id = first.id;
    let placed = NewOrder::new(Amount::new(300).unwrap(), "order #1").unwrap();
    let order = ledger
        .create_order_once(account_id, &placed, key, "o300", &order_body)
        .await
        .unwrap();
    assert!(!order.replayed);
    let shown = ledger.order(order.id).await.unwrap().unwrap();
    assert_eq!(order.response.body, order_body(&shown));
    let again = ledger
        .create_order_once(account_id, &placed, key, "o300", &order_body)
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!((again.id, &again.response), (order.id, &order.response));
    let other = NewOrder::new(Amount::new(301).unwrap(), "order #1").unwrap();
    let reused = ledger
        .create_order_once(account_id, &other, key, "o301", &order_body)
        .await
        .unwrap_err();
    assert!(
        matches!(reused, ledger::LedgerError::CreateKeyReused),
        "{reused:?}"
    );
    let theirs = ledger
        .create_order_once(elsewhere.id, &placed, key, "o300", &order_body)
        .await
        .unwrap();
    assert!(!theirs.replayed);
    assert_ne!(theirs.id, order.id);
    assert_clean(&ledger).await;
}

/// The database holds neither the client's idempotency key nor an account's API key:
/// the record is found by a hash, the API key is sealed, and the stored answer has no key.
pub async fn a_create_record_holds_no_key_in_clear(database: &TestDatabase) {
    let ledger = open(database).await;
    let key = uuid::Uuid::new_v4();
    let new = NewAccount::new("Ada", 0, 0).unwrap();
    let (_, api_key) = ledger
        .create_account_once(&new, client(1), key, "ada", &account_body)
        .await
        .unwrap();
    let query = "SELECT key_hash, sealed_api_key, CAST(response_body AS TEXT) FROM creations";
    let rows: Vec<(Vec<u8>, Option<Vec<u8>>, String)> = if database.url().starts_with("sqlite:") {
        let mut connection = <sqlx::SqliteConnection as sqlx::Connection>::connect(database.url())
            .await
            .unwrap();
        sqlx::query_as(query)
            .fetch_all(&mut connection)
            .await
            .unwrap()
    } else {
        let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(database.url())
            .await
            .unwrap();
        sqlx::query_as(query)
            .fetch_all(&mut connection)
            .await
            .unwrap()
    };
    let [(key_hash, Some(sealed), body)] = rows.as_slice() else {
        panic!("one record with a sealed key: {rows:?}");
    };
    let secret = &api_key.as_bytes()[3..]; // the random part, after `po_`
    for stored in [key_hash.as_slice(), sealed.as_slice(), body.as_bytes()] {
        assert!(
            !stored.windows(16).any(|window| window == key.as_bytes()),
            "the idempotency key is stored"
        );
        assert!(
            !stored
                .windows(8)
                .any(|window| secret.windows(8).any(|part| part == window)),
            "part of the API key is stored in clear"
        );
        assert!(!String::from_utf8_lossy(stored).contains(&key.to_string()));
    }
    assert_eq!(sealed.len(), api_key.len());
}

/// The reaper deletes creation records older than the retention: their keys are free
/// again, and a later create under one makes something new (not a replay, not refused).
pub async fn the_reaper_frees_create_keys_after_the_retention(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let key = uuid::Uuid::new_v4();
    let placed = NewOrder::new(Amount::new(300).unwrap(), "").unwrap();
    let first = ledger
        .create_order_once(account_id, &placed, key, "o300", &order_body)
        .await
        .unwrap();
    assert_eq!(ledger.reap(HOUR, 10).await.unwrap().expired_creations, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let reaped = ledger.reap(Duration::from_millis(100), 1).await.unwrap();
    assert_eq!(reaped.expired_creations, 1);
    let other = NewOrder::new(Amount::new(5).unwrap(), "").unwrap();
    let second = ledger
        .create_order_once(account_id, &other, key, "o5", &order_body)
        .await
        .unwrap();
    assert!(!second.replayed);
    assert_ne!(second.id, first.id);
    // The first order stays: only its record went.
    assert!(ledger.order(first.id).await.unwrap().is_some());
    assert_clean(&ledger).await;
}

/// Concurrent creates with one idempotency key and one request make one order: the first
/// to claim the key places it, every other answers its answer as a replay.
pub async fn concurrent_creates_with_one_key_make_one(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 0, 0).await;
    let key = uuid::Uuid::new_v4();
    let placed = NewOrder::new(Amount::new(300).unwrap(), "once").unwrap();
    let answers = futures::future::join_all((0..16).map(|_| {
        let (ledger, placed) = (ledger.clone(), placed.clone());
        tokio::spawn(async move {
            ledger
                .create_order_once(account_id, &placed, key, "o300", &order_body)
                .await
                .unwrap()
        })
    }))
    .await;
    let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
    let originals: Vec<_> = answers.iter().filter(|answer| !answer.replayed).collect();
    assert_eq!(originals.len(), 1, "{answers:?}");
    for answer in &answers {
        assert_eq!(
            (answer.id, &answer.response),
            (originals[0].id, &originals[0].response)
        );
    }
    assert!(ledger.order(originals[0].id).await.unwrap().is_some());
    assert_clean(&ledger).await;
}
