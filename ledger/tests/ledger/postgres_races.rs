//! Races that only PostgreSQL's row locking allows (SQLite has a single writer): a raw
//! transaction holds a row, the ledger starts a statement that needs it, the raw
//! transaction commits a change, and the ledger must act on the row as it is now.
//!
//! Deterministic: each test waits until the ledger's statement is actually blocked on the
//! row (or, where skipping the row is also correct, has finished) before committing.

use std::time::Duration;

use ledger::testing::TestDatabase;
use ledger::webhooks::{AttemptAnswer, DeliveryOutcome, DeliveryStatus, EndpointId};
use ledger::{AccountId, Ledger, Operation, Reaped, TicketId};
use sqlx::{Connection, PgConnection};
use tokio::task::JoinHandle;

use crate::suite::{account, apply, assert_clean, open, withdrawal};

const HOUR: Duration = Duration::from_secs(3600);

pub async fn connect(database: &TestDatabase) -> PgConnection {
    PgConnection::connect(database.url()).await.unwrap()
}

/// Waits until a session of this test's database waits for a lock (true) or `task` has
/// finished (false); panics after 10 s.
pub async fn blocked_or_finished<T>(monitor: &mut PgConnection, task: &JoinHandle<T>) -> bool {
    for _ in 0..1000 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut *monitor)
        .await
        .unwrap();
        if waiting > 0 {
            return true;
        }
        if task.is_finished() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the ledger neither blocked on the held row nor finished within 10 s");
}

/// What `apply` writes for a withdrawal, done by hand inside `tx`: the move, the entry and
/// the stored outcome (which is its event too).
async fn withdraw_by_hand(
    tx: &mut PgConnection,
    account_id: AccountId,
    ticket: TicketId,
    amount: i64,
    balance_after: i64,
    token: i64,
) {
    let moved = sqlx::query(
        "UPDATE accounts SET balance = balance - $2, fencing_token = $3
         WHERE id = $1 AND balance = $4 + $2",
    )
    .bind(account_id)
    .bind(amount)
    .bind(token)
    .bind(balance_after)
    .execute(&mut *tx)
    .await
    .unwrap();
    assert_eq!(moved.rows_affected(), 1);
    sqlx::query(
        "INSERT INTO entries (account_id, ticket_id, kind, amount, points, balance_after,
                              points_after, fencing_token, created_at)
         VALUES ($1, $2, 'withdrawal', -$3, 0, $4, 0, $5, now())",
    )
    .bind(account_id)
    .bind(ticket)
    .bind(amount)
    .bind(balance_after)
    .bind(token)
    .execute(&mut *tx)
    .await
    .unwrap();
    // (Its event is the stored outcome: nothing more to write.)
    sqlx::query(
        "UPDATE tickets
         SET operation = 'withdrawal', fingerprint = 'by-hand', response_status = 201,
             response_body = '{\"by\": \"hand\"}', completed_at = now()
         WHERE id = $1",
    )
    .bind(ticket)
    .execute(&mut *tx)
    .await
    .unwrap();
}

/// Holds `ticket`'s row in a transaction of its own, starts a reap (retention zero) and
/// waits until it is blocked on the row or has finished; then runs `meanwhile` in that
/// transaction, commits, and returns what the reap did.
async fn reap_while_holding(
    database: &TestDatabase,
    ledger: &Ledger,
    ticket: TicketId,
    meanwhile: impl AsyncFnOnce(&mut PgConnection),
) -> Reaped {
    let mut holder = connect(database).await;
    let mut monitor = connect(database).await;
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("SELECT id FROM tickets WHERE id = $1 FOR UPDATE")
        .bind(ticket)
        .execute(&mut *tx)
        .await
        .unwrap();

    let reaper = tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.reap(Duration::ZERO, 100).await.unwrap() }
    });
    // Blocked (it waits for the row, then re-checks it) or finished (it skipped the held
    // row): both are correct, as long as the reap leaves the row as `meanwhile` made it.
    blocked_or_finished(&mut monitor, &reaper).await;
    meanwhile(&mut tx).await;
    tx.commit().await.unwrap();
    reaper.await.unwrap()
}

/// The reaper picks an expired unused ticket while a transaction that uses it (an `apply`
/// that began before the expiry, another instance with a skewed clock) holds it; the use
/// commits. The reaper must not delete the now-used ticket: that would orphan its entry
/// and lose its outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reaper_spares_a_ticket_used_while_it_was_picked() {
    let database = TestDatabase::postgres().await.unwrap();
    let ledger = open(&database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let ticket = ledger
        .issue_ticket(account_id, Duration::from_millis(10))
        .await
        .unwrap()
        .id;
    tokio::time::sleep(Duration::from_millis(50)).await;

    let reaped = reap_while_holding(&database, &ledger, ticket, async |tx| {
        withdraw_by_hand(tx, account_id, ticket, 100, 900, 1).await;
    })
    .await;
    assert_eq!(reaped.deleted_unused, 0, "{reaped:?}");
    // The ticket stays, completed. (A reaper that waited for the row then goes on to
    // prune its response, which is past this retention of zero: allowed, as the ticket
    // remains a tombstone that never executes again.)
    let outcome = ledger
        .ticket(ticket)
        .await
        .unwrap()
        .expect("the reaper deleted a used ticket")
        .outcome
        .expect("the used ticket lost its outcome");
    assert_eq!(
        (outcome.operation, outcome.fingerprint.as_str()),
        (ledger::EntryKind::Withdrawal, "by-hand")
    );
    assert_clean(&ledger).await;
}

/// The reaper picks an old outcome to prune while another instance's reaper holds it and
/// prunes it first. The outcome is pruned once: not counted twice, its pruning time kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reaper_prunes_an_outcome_only_once() {
    let database = TestDatabase::postgres().await.unwrap();
    let ledger = open(&database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let ticket = ledger
        .issue_ticket(account_id, Duration::from_millis(200))
        .await
        .unwrap()
        .id;
    let applied = apply(&ledger, account_id, ticket, withdrawal(100), "w100", 1)
        .await
        .unwrap();
    assert_eq!(applied.response.status, 201);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let reaped = reap_while_holding(&database, &ledger, ticket, async |tx| {
        sqlx::query(
            "UPDATE tickets SET response_body = NULL, pruned_at = '2000-01-01T00:00:00Z'
             WHERE id = $1",
        )
        .bind(ticket)
        .execute(tx)
        .await
        .unwrap();
    })
    .await;
    assert_eq!(reaped.pruned_outcomes, 0, "{reaped:?}");
    let kept: bool =
        sqlx::query_scalar("SELECT pruned_at = '2000-01-01T00:00:00Z' FROM tickets WHERE id = $1")
            .bind(ticket)
            .fetch_one(&mut connect(&database).await)
            .await
            .unwrap();
    assert!(kept, "the outcome was pruned a second time");
    assert_clean(&ledger).await;
}

/// `apply`'s move reads a snapshot in which the balance (0) cannot afford the withdrawal,
/// while a deposit that will afford it holds the account row. Recording the token waits
/// for the row and sees the deposit; the move is retried on that latest row and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_move_is_retried_on_the_latest_row() {
    let database = TestDatabase::postgres().await.unwrap();
    let ledger = open(&database).await;
    let account_id = account(&ledger, 0, 0).await;
    let deposit = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let spend = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;

    // A deposit in flight, written the way `apply` writes it, with an older token than
    // the withdrawal's (1 < 2), so the withdrawal is not stale.
    let mut holder = connect(&database).await;
    let mut monitor = connect(&database).await;
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("UPDATE accounts SET balance = balance + 1000, fencing_token = 1 WHERE id = $1")
        .bind(account_id)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO entries (account_id, ticket_id, kind, amount, points, balance_after,
                              points_after, fencing_token, created_at)
         VALUES ($1, $2, 'deposit', 1000, 0, 1000, 0, 1, now())",
    )
    .bind(account_id)
    .bind(deposit)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE tickets
         SET operation = 'deposit', fingerprint = 'd1000', response_status = 201,
             response_body = '{}', completed_at = now()
         WHERE id = $1",
    )
    .bind(deposit)
    .execute(&mut *tx)
    .await
    .unwrap();

    let withdrawing = tokio::spawn({
        let ledger = ledger.clone();
        async move {
            apply(&ledger, account_id, spend, withdrawal(500), "w500", 2)
                .await
                .unwrap()
        }
    });
    assert!(
        blocked_or_finished(&mut monitor, &withdrawing).await,
        "apply finished without waiting for the deposit: {:?}",
        withdrawing.await
    );
    tx.commit().await.unwrap();

    let applied = withdrawing.await.unwrap();
    assert!(!applied.replayed);
    assert_eq!(applied.response.status, 201, "{}", applied.response.body);
    assert_eq!(applied.response.body["result"], "applied");
    assert_eq!(applied.response.body["balance"], 500);

    let entries = ledger.entries(account_id, None, 10).await.unwrap();
    assert_eq!(entries.len(), 3, "{entries:#?}");
    let last = &entries[2];
    assert_eq!(
        (
            last.ticket_id,
            last.amount,
            last.balance_after,
            last.fencing_token
        ),
        (Some(spend), -500, 500, 2)
    );
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        500
    );
    assert_eq!(ledger.fencing_token(account_id).await.unwrap(), Some(2));
    assert_clean(&ledger).await;
}

/// A gate on the account's row: the first transaction that updates an account from now on
/// stops before the update touches any row — after everything it did before, the clock
/// read with its ticket included — until the test lets go of advisory lock 2. (A
/// statement-level trigger runs before the statement locks a row; the first transaction
/// to take lock 1 is the one held, every later one passes.)
const HOLD_THE_FIRST_ACCOUNT_UPDATE: [&str; 2] = [
    "CREATE FUNCTION hold_the_first_account_update() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
         IF pg_try_advisory_xact_lock(1) THEN
             PERFORM pg_advisory_xact_lock_shared(2);
         END IF;
         RETURN NULL;
     END
     $$",
    "CREATE TRIGGER hold_the_first_account_update BEFORE UPDATE ON accounts
     FOR EACH STATEMENT EXECUTE FUNCTION hold_the_first_account_update()",
];

/// A payout of 100 with `ticket`, under fencing token `token`, as the API applies it.
async fn pay_out(
    ledger: &Ledger,
    account_id: AccountId,
    ticket: TicketId,
    token: u64,
) -> ledger::payouts::PayoutId {
    let id = ledger::payouts::PayoutId::random();
    let operation = ledger::Operation::Payout {
        payout: id,
        amount: ledger::Amount::new(100).unwrap(),
        destination: ledger::payouts::Destination::new("DE89370400440532013000").unwrap(),
    };
    let applied = apply(ledger, account_id, ticket, operation, "p100", token)
        .await
        .unwrap();
    assert_eq!(applied.response.status, 202, "{}", applied.response.body);
    id
}

/// Two payouts of one account: one reads the clock with its ticket, then waits before it
/// takes the account's row; meanwhile the other — under an older fencing token, a holder
/// that outlived its lease — commits, and a page shows it. The first commits after that
/// page, with the earlier `created_at`. The next page, after the one shown, holds it
/// (pages on `created_at` never showed it on any page).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payout_that_commits_after_a_page_is_on_the_next_one() {
    let database = TestDatabase::postgres().await.unwrap();
    let ledger = open(&database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let late_ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let mut gate = connect(&database).await;
    let mut monitor = connect(&database).await;
    sqlx::query("SELECT pg_advisory_lock(2)")
        .execute(&mut gate)
        .await
        .unwrap();
    for statement in HOLD_THE_FIRST_ACCOUNT_UPDATE {
        database.execute(statement).await.unwrap();
    }

    let late = tokio::spawn({
        let ledger = ledger.clone();
        async move { pay_out(&ledger, account_id, late_ticket, 2).await }
    });
    assert!(
        blocked_or_finished(&mut monitor, &late).await,
        "the payout did not stop at the gate: {:?}",
        late.await
    );
    let first = pay_out(&ledger, account_id, ticket, 1).await;
    let page = ledger.payouts(account_id, None, None, 10).await.unwrap();
    assert_eq!(
        page.iter().map(|payout| payout.id).collect::<Vec<_>>(),
        vec![first]
    );
    sqlx::query("SELECT pg_advisory_unlock(2)")
        .execute(&mut gate)
        .await
        .unwrap();
    let late = late.await.unwrap();

    let created = async |id| ledger.payout(id).await.unwrap().unwrap().created_at;
    assert!(
        created(late).await < created(first).await,
        "the late payout read the clock first"
    );
    let next = ledger
        .payouts(account_id, None, Some(first), 10)
        .await
        .unwrap();
    assert_eq!(
        next.iter().map(|payout| payout.id).collect::<Vec<_>>(),
        vec![late],
        "the payout that committed after the page is on the next one"
    );
    let every = ledger.payouts(account_id, None, None, 10).await.unwrap();
    assert_eq!(
        every.iter().map(|payout| payout.id).collect::<Vec<_>>(),
        vec![first, late],
        "in the order they committed"
    );
    assert_clean(&ledger).await;
}

/// A fresh database, a ledger on it through a [`ledger::testing::CommitCutter`], and an
/// account holding 1,000 with one ticket.
async fn behind_a_cutter(
    options: ledger::LedgerOptions,
) -> (
    TestDatabase,
    ledger::testing::CommitCutter,
    Ledger,
    AccountId,
    TicketId,
) {
    let database = TestDatabase::postgres().await.unwrap();
    open(&database).await; // migrated
    let cutter = ledger::testing::CommitCutter::start(database.url())
        .await
        .unwrap();
    let ledger = Ledger::open(cutter.url(), &options).await.unwrap();
    let account_id = account(&ledger, 1000, 0).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    (database, cutter, ledger, account_id, ticket)
}

/// The transaction path (here a refusal, which is stored there): the connection dies after
/// COMMIT was sent and before its answer came back. `apply` cannot know whether it
/// committed, and says so (outcome unknown) instead of calling it unavailable — it did
/// commit, and the same ticket then replays the stored outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_commit_answer_is_outcome_unknown() {
    let (_database, cutter, ledger, account_id, ticket) =
        behind_a_cutter(ledger::LedgerOptions::default()).await;

    cutter.arm();
    let error = apply(&ledger, account_id, ticket, withdrawal(3000), "w3000", 1)
        .await
        .unwrap_err();
    assert_eq!(cutter.cuts(), 1);
    assert!(
        matches!(
            error,
            ledger::ApplyError::Ledger(ledger::LedgerError::OutcomeUnknown(_))
        ),
        "{error:?}"
    );
    let stored = ledger.ticket(ticket).await.unwrap().unwrap();
    assert_eq!(stored.state(), ledger::TicketState::Completed);
    let replayed = apply(&ledger, account_id, ticket, withdrawal(3000), "w3000", 2)
        .await
        .unwrap();
    assert!(replayed.replayed);
    assert_eq!(replayed.response.status, 402);
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        1000
    );
    assert_clean(&ledger).await;
}

/// The batch path (a spend that goes through): the answer to the one statement that
/// spends the ticket is lost. The batch is sent again on another connection, finds the
/// ticket used by this very request, and answers with what was stored — once, whatever
/// the connection did.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_batch_answer_is_asked_again() {
    let (_database, cutter, ledger, account_id, ticket) =
        behind_a_cutter(ledger::LedgerOptions::default()).await;

    cutter.arm_on(ticket.0.as_bytes(), 1);
    let applied = apply(&ledger, account_id, ticket, withdrawal(300), "w300", 1)
        .await
        .unwrap();
    assert_eq!(cutter.cuts(), 1);
    assert_eq!(applied.response.status, 201);
    assert_eq!(
        applied.response.body["balance"], 700,
        "{:?}",
        applied.response
    );
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        700
    );
    assert_clean(&ledger).await;
}

/// The holds' group commit: the answer to the statement that places a hold is lost, and
/// then the answer to the one that captures it. Each is sent again on another connection,
/// finds its ticket used by this very step — the hold placed by it, resolved by it — and
/// answers with what was stored: one hold, captured once, the money taken once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_hold_step_answer_is_asked_again() {
    let (_database, cutter, ledger, account_id, ticket) =
        behind_a_cutter(ledger::LedgerOptions::default()).await;
    let hold = ledger::holds::HoldId::random();
    let place = ledger::Operation::Hold {
        hold,
        amount: ledger::Amount::new(300).unwrap(),
        expires_in: ledger::holds::HoldLifetime::new(3600).unwrap(),
    };

    cutter.arm_on(ticket.0.as_bytes(), 1);
    let placed = apply(&ledger, account_id, ticket, place, "h300", 1)
        .await
        .unwrap();
    assert_eq!(cutter.cuts(), 1);
    assert!(!placed.replayed);
    assert_eq!(
        (placed.response.status, &placed.response.body["available"]),
        (201, &serde_json::json!(700)),
        "{:?}",
        placed.response
    );

    let capturing = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let capture = ledger::Operation::Capture { hold, amount: None };
    cutter.arm_on(capturing.0.as_bytes(), 1);
    let captured = apply(&ledger, account_id, capturing, capture, "c", 1)
        .await
        .unwrap();
    assert_eq!(cutter.cuts(), 2);
    assert!(!captured.replayed);
    assert_eq!(
        (
            captured.response.status,
            &captured.response.body["state"],
            &captured.response.body["balance"]
        ),
        (200, &serde_json::json!("captured"), &serde_json::json!(700)),
        "{:?}",
        captured.response
    );
    let found = ledger.hold(hold).await.unwrap().unwrap();
    assert_eq!(
        (found.state, found.captured_amount, found.resolved_by_ticket),
        (
            ledger::holds::HoldState::Captured,
            Some(300),
            Some(capturing)
        )
    );
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        700
    );
    assert_clean(&ledger).await;
}

/// When every connection the batch is sent on is cut after sending, the spend's outcome
/// is unknown — it did commit — and the same ticket then replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_whose_every_answer_is_lost_is_outcome_unknown() {
    let options = ledger::LedgerOptions {
        max_connections: 2,
        ..ledger::LedgerOptions::default()
    };
    let (_database, cutter, ledger, account_id, ticket) = behind_a_cutter(options).await;

    cutter.arm_on(ticket.0.as_bytes(), usize::MAX);
    let error = apply(&ledger, account_id, ticket, withdrawal(300), "w300", 1)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            ledger::ApplyError::Ledger(ledger::LedgerError::OutcomeUnknown(_))
        ),
        "{error:?}"
    );
    assert_eq!(cutter.cuts(), 3, "a try per connection and one more");
    cutter.arm_on(ticket.0.as_bytes(), 0);
    let replayed = apply(&ledger, account_id, ticket, withdrawal(300), "w300", 2)
        .await
        .unwrap();
    assert!(replayed.replayed);
    assert_eq!(replayed.response.status, 201);
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        700
    );
    assert_clean(&ledger).await;
}

/// Spends gathered into one batch keep their own outcomes: the refused ones (no funds)
/// store their refusal and the stale ones write nothing, and neither undoes a neighbour
/// that went through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_keeps_each_spends_own_outcome() {
    let database = TestDatabase::postgres().await.unwrap();
    // One worker, so spends queue behind each other and go in batches.
    let ledger = open_with_one_batch_worker(&database).await;
    let mut spends = Vec::new();
    for kind in ["goes-through", "no-funds", "stale"] {
        for _ in 0..10 {
            let balance = if kind == "no-funds" { 10 } else { 1000 };
            let account_id = account(&ledger, balance, 0).await;
            if kind == "stale" {
                let newer = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
                let deposit = ledger::Operation::Deposit(ledger::Amount::new(1).unwrap());
                apply(&ledger, account_id, newer, deposit, "d1", 100)
                    .await
                    .unwrap();
            }
            let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
            spends.push((kind, account_id, ticket));
        }
    }
    let before = batched_spends(&ledger);
    let tasks: Vec<_> = spends
        .iter()
        .map(|&(kind, account_id, ticket)| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                let outcome = apply(&ledger, account_id, ticket, withdrawal(300), "w300", 50).await;
                (kind, account_id, outcome)
            })
        })
        .collect();
    for task in tasks {
        let (kind, account_id, outcome) = task.await.unwrap();
        let balance = ledger.account(account_id).await.unwrap().unwrap().balance;
        match kind {
            "goes-through" => {
                assert_eq!(outcome.unwrap().response.status, 201);
                assert_eq!(balance, 700);
            }
            "no-funds" => {
                assert_eq!(outcome.unwrap().response.status, 402);
                assert_eq!(balance, 10);
            }
            _ => {
                assert!(
                    matches!(outcome, Err(ledger::ApplyError::StaleToken { .. })),
                    "{outcome:?}"
                );
                assert_eq!(balance, 1001);
            }
        }
    }
    let batches = ledger.batches().unwrap().counts();
    assert!(
        batches.iter().any(|&(size, _)| size > 1),
        "no spends were batched together: {batches:?}"
    );
    assert_eq!(batched_spends(&ledger) - before, 30, "{batches:?}");
    assert_clean(&ledger).await;
}

/// The ledger on `database` (migrated first) with one group-commit worker, so that
/// concurrent spends queue behind one batch at a time.
async fn open_with_one_batch_worker(database: &TestDatabase) -> Ledger {
    open(database).await; // migrated
    let options = ledger::LedgerOptions {
        batch_workers: 1,
        ..ledger::LedgerOptions::default()
    };
    Ledger::open(database.url(), &options).await.unwrap()
}

/// A withdrawal of 1 from `account` with `ticket`, sent while another session holds the
/// account's row in a transaction left open: returned once the withdrawal's batch waits for
/// that row, with the session (`COMMIT` lets the row go).
async fn withdrawal_blocked_on_its_account(
    database: &TestDatabase,
    ledger: &Ledger,
    account: AccountId,
    ticket: TicketId,
) -> (
    PgConnection,
    JoinHandle<Result<ledger::Applied, ledger::ApplyError>>,
) {
    let mut holder = connect(database).await;
    hold_account(&mut holder, account).await;
    let blocked = tokio::spawn({
        let ledger = ledger.clone();
        async move { apply(&ledger, account, ticket, withdrawal(1), "w1", 1).await }
    });
    let mut monitor = connect(database).await;
    assert!(blocked_or_finished(&mut monitor, &blocked).await);
    (holder, blocked)
}

/// How many spends the group commit sent so far.
fn batched_spends(ledger: &Ledger) -> u64 {
    ledger
        .batches()
        .unwrap()
        .counts()
        .iter()
        .map(|&(size, count)| size as u64 * count)
        .sum()
}

/// Many spends of one account at once, each with its own grant's token, as holders that
/// overlapped would send them: they go in fencing-token order (several in one batch); a
/// spend whose token a newer one already passed is refused as stale and writes nothing; the
/// money adds up, and every entry starts from the balance the one before it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spends_of_one_account_go_in_token_order_and_stale_ones_write_nothing() {
    let database = TestDatabase::postgres().await.unwrap();
    let ledger = open(&database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let mut tickets = Vec::new();
    for _ in 0..20 {
        tickets.push(ledger.issue_ticket(account_id, HOUR).await.unwrap().id);
    }
    let tasks: Vec<_> = tickets
        .into_iter()
        .zip(1_u64..)
        .map(|(ticket, token)| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                apply(&ledger, account_id, ticket, withdrawal(10), "w10", token).await
            })
        })
        .collect();
    let (mut written, mut stale) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(applied) => {
                assert_eq!(applied.response.status, 201);
                written += 1;
            }
            Err(ledger::ApplyError::StaleToken { .. }) => stale += 1,
            Err(error) => panic!("{error:?}"),
        }
    }
    assert_eq!(written + stale, 20);
    assert!(written >= 1);
    let balance = ledger.account(account_id).await.unwrap().unwrap().balance;
    assert_eq!(balance, 1000 - 10 * written);
    assert_clean(&ledger).await;
}

/// Spends of one account that queue together go in one batch, in fencing-token order,
/// each on the balance the one before it left: two withdrawals of 40 from 100 go through
/// (60, then 20 left, each entry and stored body saying so), and a third, which 20 does
/// not cover, is refused with 402 and writes nothing — without undoing the two before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_accounts_spends_in_one_batch_each_see_the_balance_the_last_left() {
    let database = TestDatabase::postgres().await.unwrap();
    // One worker: while its batch waits for a row held below, the others queue for the
    // next batch together.
    let ledger = open_with_one_batch_worker(&database).await;
    let blocker = account(&ledger, 1000, 0).await;
    let account_id = account(&ledger, 100, 0).await;
    let blocker_ticket = ledger.issue_ticket(blocker, HOUR).await.unwrap().id;
    let mut tickets = Vec::new();
    for _ in 0..3 {
        tickets.push(ledger.issue_ticket(account_id, HOUR).await.unwrap().id);
    }

    let (mut holder, blocked) =
        withdrawal_blocked_on_its_account(&database, &ledger, blocker, blocker_ticket).await;
    let before = batched_spends(&ledger);
    let spends: Vec<_> = tickets
        .into_iter()
        .zip(1_u64..)
        .map(|(ticket, token)| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                apply(&ledger, account_id, ticket, withdrawal(40), "w40", token).await
            })
        })
        .collect();
    // The three reach the worker's queue while its batch is blocked.
    tokio::time::sleep(Duration::from_millis(300)).await;
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    assert_eq!(blocked.await.unwrap().unwrap().response.status, 201);

    let mut answers = Vec::new();
    for spend in spends {
        let applied = spend.await.unwrap().unwrap();
        answers.push((
            applied.response.status,
            applied.response.body["balance"].clone(),
        ));
    }
    assert_eq!(
        answers,
        [
            (201, serde_json::json!(60)),
            (201, serde_json::json!(20)),
            (402, serde_json::json!(-1)),
        ]
    );
    let sizes = ledger.batches().unwrap().counts();
    assert!(
        sizes.iter().any(|&(size, _)| size == 3),
        "the three did not go in one batch: {sizes:?}"
    );
    assert_eq!(batched_spends(&ledger) - before, 3, "{sizes:?}");
    let entries = ledger.entries(account_id, None, 10).await.unwrap();
    let after: Vec<i64> = entries.iter().map(|entry| entry.balance_after).collect();
    assert_eq!(after, [100, 60, 20]);
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        20
    );
    assert_clean(&ledger).await;
}

/// The group commit's workers take turns sending, but a batch that is stuck holds back no
/// other worker's accounts: while one worker's batch waits for an account row another
/// transaction holds, a spend of an account of the other worker goes through, and the
/// stuck one goes through once the row is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stuck_batch_holds_back_no_other_workers_accounts() {
    let database = TestDatabase::postgres().await.unwrap();
    let ledger = open(&database).await; // the default: two workers
    let worker = |account: AccountId| account.0.as_u64_pair().1 % 2; // as batch.rs picks
    let blocker = account(&ledger, 1000, 0).await;
    let mut other = account(&ledger, 1000, 0).await;
    while worker(other) == worker(blocker) {
        other = account(&ledger, 1000, 0).await;
    }
    let blocker_ticket = ledger.issue_ticket(blocker, HOUR).await.unwrap().id;
    let other_ticket = ledger.issue_ticket(other, HOUR).await.unwrap().id;

    let (mut holder, blocked) =
        withdrawal_blocked_on_its_account(&database, &ledger, blocker, blocker_ticket).await;

    let other_spend = apply(&ledger, other, other_ticket, withdrawal(1), "w1", 1);
    let applied = tokio::time::timeout(Duration::from_secs(5), other_spend)
        .await
        .expect("the other worker's spend waited for the stuck batch")
        .unwrap();
    assert_eq!(applied.response.status, 201);
    assert!(
        !blocked.is_finished(),
        "the blocked spend did not wait for its row"
    );
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    assert_eq!(blocked.await.unwrap().unwrap().response.status, 201);
    for account_id in [blocker, other] {
        let balance = ledger.account(account_id).await.unwrap().unwrap().balance;
        assert_eq!(balance, 999);
    }
    assert_clean(&ledger).await;
}

/// A group commit's statement locks its accounts in id order, as every writer of the
/// ledger does, for spends and hold steps alike: while its batch waits for the row of its
/// highest account, which another transaction holds, every lower one is already locked.
/// (Locked in any other order, two batches that share accounts — a spends' batch and a
/// hold steps' one — could each hold a row the other waits for.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_locks_its_accounts_in_id_order() {
    let spend = || withdrawal(1);
    let placing = || crate::holds::place(1, 3600).1;
    for operation in [&spend as &dyn Fn() -> Operation, &placing] {
        let database = TestDatabase::postgres().await.unwrap();
        // One worker: the batch behind a stuck one takes every spend queued meanwhile.
        let ledger = open_with_one_batch_worker(&database).await;
        let blocker = account(&ledger, 1000, 0).await;
        let mut accounts = Vec::new();
        for _ in 0..8 {
            accounts.push(account(&ledger, 1000, 0).await);
        }
        accounts.sort();
        let highest = *accounts.last().unwrap();

        let mut first_holder = connect(&database).await;
        hold_account(&mut first_holder, blocker).await;
        let stuck = spawn_apply(&ledger, blocker, operation()).await;
        let mut monitor = connect(&database).await;
        assert!(blocked_or_finished(&mut monitor, &stuck).await);
        let mut second_holder = connect(&database).await;
        hold_account(&mut second_holder, highest).await;
        let mut spends = Vec::new();
        for account_id in &accounts {
            spends.push(spawn_apply(&ledger, *account_id, operation()).await);
        }
        // The eight queue behind the stuck batch, then go as one, which waits for the
        // highest account's row.
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::query("COMMIT")
            .execute(&mut first_holder)
            .await
            .unwrap();
        assert_eq!(stuck.await.unwrap().unwrap().response.status, 201);
        assert!(blocked_or_finished(&mut monitor, &spends[7]).await);

        for account_id in &accounts[..7] {
            let free = sqlx::query("SELECT 1 FROM accounts WHERE id = $1 FOR NO KEY UPDATE NOWAIT")
                .bind(account_id)
                .execute(&mut monitor)
                .await;
            assert!(
                free.is_err(),
                "account {account_id} was not locked yet while its batch waited for a higher one"
            );
        }
        sqlx::query("COMMIT")
            .execute(&mut second_holder)
            .await
            .unwrap();
        for spend in spends {
            assert_eq!(spend.await.unwrap().unwrap().response.status, 201);
        }
        assert_clean(&ledger).await;
    }
}

/// Holds `account`'s row in a transaction `holder` leaves open (`COMMIT` lets it go), as
/// a writer of the account does: tickets can still be issued for it (their key check
/// shares the row), the ledger's statements wait.
async fn hold_account(holder: &mut PgConnection, account: AccountId) {
    sqlx::query("BEGIN").execute(&mut *holder).await.unwrap();
    sqlx::query("SELECT 1 FROM accounts WHERE id = $1 FOR NO KEY UPDATE")
        .bind(account)
        .execute(&mut *holder)
        .await
        .unwrap();
}

/// `operation` on `account` with a fresh ticket and token 1, in a task of its own.
async fn spawn_apply(
    ledger: &Ledger,
    account: AccountId,
    operation: Operation,
) -> JoinHandle<Result<ledger::Applied, ledger::ApplyError>> {
    let ticket = ledger.issue_ticket(account, HOUR).await.unwrap().id;
    let ledger = ledger.clone();
    tokio::spawn(async move { apply(&ledger, account, ticket, operation, "op", 1).await })
}

/// A spend whose ticket another transaction is using waits for that ticket; the other
/// commits the use. The spend must answer with that stored outcome and move nothing: the
/// group commit's statement finds the ticket used only after its snapshot was taken, and
/// hands the spend to the transaction path, which judges the ticket again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ticket_used_while_the_spend_waits_for_it_is_replayed() {
    let database = TestDatabase::postgres().await.unwrap();
    let ledger = open(&database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;

    let mut holder = connect(&database).await;
    let mut monitor = connect(&database).await;
    let mut tx = holder.begin().await.unwrap();
    withdraw_by_hand(&mut tx, account_id, ticket, 300, 700, 1).await;
    let spending = tokio::spawn({
        let ledger = ledger.clone();
        async move {
            apply(&ledger, account_id, ticket, withdrawal(300), "by-hand", 2)
                .await
                .unwrap()
        }
    });
    assert!(
        blocked_or_finished(&mut monitor, &spending).await,
        "the spend finished without waiting for its ticket: {:?}",
        spending.await
    );
    tx.commit().await.unwrap();

    let applied = spending.await.unwrap();
    assert!(applied.replayed, "{applied:?}");
    assert_eq!(applied.response.body, serde_json::json!({"by": "hand"}));
    assert!(
        batched_spends(&ledger) > 0,
        "the spend skipped the group commit"
    );
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        700
    );
    assert_eq!(ledger.entries(account_id, None, 10).await.unwrap().len(), 2);
    assert_clean(&ledger).await;
}

/// An order placed without an idempotency key is one statement, committed on its own;
/// its answer is lost. The statement is sent again on another connection, finds the order
/// the first one committed — the same id, account and content — and answers it: one order,
/// no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_answer_to_an_order_insert_is_recognised() {
    let (_database, cutter, ledger, account_id, _) =
        behind_a_cutter(ledger::LedgerOptions::default()).await;
    let description = format!("cut-{}", uuid::Uuid::new_v4().simple());
    let new = ledger::NewOrder::new(ledger::Amount::new(250).unwrap(), &description).unwrap();

    cutter.arm_on(description.as_bytes(), 1);
    let order = ledger.create_order(account_id, &new).await.unwrap();
    assert_eq!(cutter.cuts(), 1);
    assert_eq!(ledger.order(order.id).await.unwrap(), Some(order));
    assert_clean(&ledger).await;
}

/// The COMMIT of an account create sent with an idempotency key loses its answer: the
/// transaction runs again on another connection, finds its own record (the account it
/// announces is the one it meant to open), and answers as the original — with the API
/// key, which works. A repeat of the request replays that answer and that key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_commit_answer_to_a_keyed_create_is_recognised() {
    let (_database, cutter, ledger, _, _) = behind_a_cutter(ledger::LedgerOptions::default()).await;
    let key = uuid::Uuid::new_v4();
    let new = ledger::NewAccount::new("Ada", 100, 0).unwrap();
    let client = std::net::IpAddr::from([127, 0, 0, 1]);
    let render = |account: &ledger::Account| serde_json::json!({ "id": account.id });

    cutter.arm();
    let (first, api_key) = ledger
        .create_account_once(&new, client, key, "ada", &render)
        .await
        .unwrap();
    assert_eq!(cutter.cuts(), 1);
    assert!(!first.replayed);
    assert_eq!(ledger.authenticate(&api_key).await.unwrap(), Some(first.id));
    let (again, same_key) = ledger
        .create_account_once(&new, client, key, "ada", &render)
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(
        (again.id, again.response, same_key),
        (first.id, first.response, api_key)
    );
    assert_clean(&ledger).await;
}

/// Makes every transaction of this database pause (1.5 s) in the statement that writes an
/// outbox row matching `when` (`NEW`, and `OLD` for an update) — after the row is written,
/// before the transaction commits — so a test can run a delete in that window.
async fn pause_after_outbox(admin: &mut PgConnection, operation: &str, when: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE OR REPLACE FUNCTION pause_in_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$;
         CREATE TRIGGER pause_in_outbox AFTER {operation} ON outbox
         FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION pause_in_outbox();"
    )))
    .execute(&mut *admin)
    .await
    .unwrap();
}

async fn no_more_pauses(admin: &mut PgConnection) {
    sqlx::raw_sql("DROP TRIGGER pause_in_outbox ON outbox")
        .execute(&mut *admin)
        .await
        .unwrap();
}

/// Waits until a session of this test's database sleeps in the pause; panics after 10 s.
async fn until_paused(monitor: &mut PgConnection) {
    for _ in 0..1000 {
        let sleeping: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event = 'PgSleep'",
        )
        .fetch_one(&mut *monitor)
        .await
        .unwrap();
        if sleeping > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no transaction paused within 10 s");
}

/// An account with an endpoint and a withdrawal whose delivery to it is queued.
async fn a_spend_with_an_endpoint(database: &TestDatabase) -> (Ledger, AccountId, EndpointId) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let endpoint = crate::webhooks::endpoint(&ledger, account_id, None).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    apply(&ledger, account_id, ticket, withdrawal(10), "w10", 1)
        .await
        .unwrap();
    (ledger, account_id, endpoint)
}

/// A spend queues a delivery for an endpoint; before it commits, the endpoint is deleted.
/// The delete must not answer while that delivery can still go out: it ends it (the
/// delete waits for the spend's commit). Without that the delivery stays open and goes to
/// a URL its owner deleted, for its whole schedule. Both ways a spend commits: the group
/// commit's statement (an executed withdrawal) and the transaction path (a refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_endpoint_deleted_while_a_spend_queues_for_it_is_sent_nothing() {
    let database = TestDatabase::postgres().await.unwrap();
    let ledger = open(&database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let mut admin = connect(&database).await;
    pause_after_outbox(&mut admin, "INSERT", "NEW.kind = 'webhook'").await;
    for (amount, status) in [(10, 201), (5000, 402)] {
        let endpoint = crate::webhooks::endpoint(&ledger, account_id, None).await;
        let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
        let spend = {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                apply(
                    &ledger,
                    account_id,
                    ticket,
                    withdrawal(amount),
                    "w",
                    1 + amount.unsigned_abs(),
                )
                .await
            })
        };
        until_paused(&mut admin).await;
        let deleted = ledger.delete_endpoint(account_id, endpoint).await.unwrap();
        assert!(deleted);
        assert_eq!(spend.await.unwrap().unwrap().response.status, status);

        let listed = ledger.deliveries(endpoint, None, 10).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:#?}");
        assert_eq!(
            listed[0].status,
            DeliveryStatus::EndpointDeleted,
            "{amount}"
        );
    }
    no_more_pauses(&mut admin).await;
    assert!(
        ledger
            .claim_deliveries("w", HOUR, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_clean(&ledger).await;
}

/// A delivery sent again by hand is reopened; before that commits, its endpoint is
/// deleted. The delivery ends with the endpoint: none stays open for a deleted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delivery_reopened_while_its_endpoint_is_deleted_ends_with_it() {
    let database = TestDatabase::postgres().await.unwrap();
    let (ledger, account_id, endpoint) = a_spend_with_an_endpoint(&database).await;
    let job = ledger
        .claim_deliveries("w", HOUR, 10)
        .await
        .unwrap()
        .remove(0);
    let answer = AttemptAnswer {
        duration: Duration::from_millis(1),
        status: Some(204),
        error: None,
        body: None,
    };
    ledger
        .record_deliveries(&[(&job, &answer, &DeliveryOutcome::Delivered)])
        .await
        .unwrap();

    let mut admin = connect(&database).await;
    pause_after_outbox(
        &mut admin,
        "UPDATE",
        "OLD.done_at IS NOT NULL AND NEW.done_at IS NULL",
    )
    .await;
    let retry = {
        let ledger = ledger.clone();
        tokio::spawn(async move { ledger.retry_delivery(endpoint, job.job_id).await })
    };
    until_paused(&mut admin).await;
    assert!(ledger.delete_endpoint(account_id, endpoint).await.unwrap());
    assert_eq!(retry.await.unwrap().unwrap(), Ok(()));
    no_more_pauses(&mut admin).await;

    let listed = ledger.deliveries(endpoint, None, 10).await.unwrap();
    assert_eq!(listed[0].status, DeliveryStatus::EndpointDeleted);
    assert!(
        ledger
            .claim_deliveries("w", HOUR, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A delivery found open for an endpoint that was deleted (made so by hand here) is not
/// handed to a worker: the claim ends it as the endpoint ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_ends_a_delivery_of_a_deleted_endpoint_unsent() {
    let database = TestDatabase::postgres().await.unwrap();
    let (ledger, _, endpoint) = a_spend_with_an_endpoint(&database).await;
    let mut admin = connect(&database).await;
    sqlx::query("UPDATE webhook_endpoints SET deleted_at = now() WHERE id = $1")
        .bind(endpoint.0)
        .execute(&mut admin)
        .await
        .unwrap();
    assert!(
        ledger
            .claim_deliveries("w", HOUR, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let listed = ledger.deliveries(endpoint, None, 10).await.unwrap();
    assert_eq!(listed[0].status, DeliveryStatus::EndpointDeleted);
    assert!(listed[0].attempts.is_empty());
}

/// A server that refuses writes as read-only — a primary just demoted to a standby, or a
/// replica a proxy still routes to during a failover — is unavailable (503, nothing
/// written, safe to resend), not a database error (500). Once it takes writes again the
/// same ticket executes, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_only_server_is_unavailable_and_the_ticket_still_executes() {
    let database = TestDatabase::postgres().await.unwrap();
    let ledger = open(&database).await;
    let account_id = account(&ledger, 100, 0).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;

    let mut admin = connect(&database).await;
    set_read_only(&mut admin, true).await;
    let refused = apply(&ledger, account_id, ticket, withdrawal(30), "w30", 1).await;
    assert!(
        matches!(
            refused,
            Err(ledger::ApplyError::Ledger(
                ledger::LedgerError::Unavailable(_)
            ))
        ),
        "{refused:?}"
    );
    let issued = ledger.issue_ticket(account_id, HOUR).await;
    assert!(
        matches!(issued, Err(ledger::LedgerError::Unavailable(_))),
        "{issued:?}"
    );

    set_read_only(&mut admin, false).await;
    let applied = apply(&ledger, account_id, ticket, withdrawal(30), "w30", 1)
        .await
        .unwrap();
    assert!(!applied.replayed, "{applied:?}");
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        70
    );
    assert_clean(&ledger).await;
}

/// Makes every new session of the test's database read-only, or writable again, and ends
/// the ledger's pooled sessions so that it reconnects into the new default — the way a
/// failover cuts its connections and the proxy reconnects them to a standby.
async fn set_read_only(admin: &mut PgConnection, read_only: bool) {
    let setting = if read_only { "on" } else { "off" };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET default_transaction_read_only = off; \
         DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = {setting}', \
         current_database()); END $$; \
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid();"
    )))
    .execute(admin)
    .await
    .unwrap();
}
