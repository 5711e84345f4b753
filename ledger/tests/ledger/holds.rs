//! Holds and refunds in the database: the rules it keeps on its own, whoever writes — a
//! hold resolved once, in time by its clock, captured within its amount; refunds within
//! the payment — and the audit's rules over them. The rows are written here by hand, as a
//! writer that skipped the ledger's checks would write them.

use std::time::Duration;

use ledger::holds::{Hold, HoldCounts, HoldId, HoldLifetime, HoldState, Payment, RefundId};
use ledger::testing::TestDatabase;
use ledger::webhooks::EventType;
use ledger::{
    AccountId, Amount, ApplyError, EntryKind, Ledger, NewOrder, Operation, Rule, TicketId,
    Violation,
};

use crate::suite::{account, apply, assert_clean, open};

const HOUR: Duration = Duration::from_secs(3600);

/// An identifier as a literal of the database's type.
fn id(database: &TestDatabase, id: uuid::Uuid) -> String {
    if database.url().starts_with("sqlite:") {
        format!("X'{}'", id.simple())
    } else {
        format!("'{id}'::uuid")
    }
}

/// The database's clock `seconds` from now, as an expression.
fn clock_in(database: &TestDatabase, seconds: i64) -> String {
    if database.url().starts_with("sqlite:") {
        format!("(CAST(unixepoch('now', 'subsec') * 1000000 AS INTEGER) + {seconds} * 1000000)")
    } else {
        format!("(clock_timestamp() + {seconds} * interval '1 second')")
    }
}

async fn ticket(ledger: &Ledger, account_id: AccountId) -> TicketId {
    ledger.issue_ticket(account_id, HOUR).await.unwrap().id
}

/// A hold of `amount` on `account_id`, made by `ticket`, expiring `expires_in` seconds
/// from now (in the past when negative), written by hand; the account's `held` too when
/// `counted`.
async fn plant_hold(
    database: &TestDatabase,
    account_id: AccountId,
    ticket: TicketId,
    amount: i64,
    expires_in: i64,
    counted: bool,
) -> uuid::Uuid {
    let hold = uuid::Uuid::new_v4();
    database
        .execute(&format!(
            "INSERT INTO holds (id, account_id, ticket_id, amount, expires_at, created_at)
             VALUES ({}, {}, {}, {amount}, {}, {})",
            id(database, hold),
            id(database, account_id.0),
            id(database, ticket.0),
            clock_in(database, expires_in),
            clock_in(database, 0),
        ))
        .await
        .unwrap();
    if counted {
        database
            .execute(&format!(
                "UPDATE accounts SET held = held + {amount} WHERE id = {}",
                id(database, account_id.0)
            ))
            .await
            .unwrap();
    }
    hold
}

/// The statement that resolves `hold` as `state`, capturing `captured` (SQL: a number or
/// NULL), by ticket `by`, at the database's clock now — as a writer that skipped the
/// ledger's checks would write it.
fn resolution(
    database: &TestDatabase,
    hold: uuid::Uuid,
    state: &str,
    captured: &str,
    by: TicketId,
) -> String {
    format!(
        "UPDATE holds SET state = '{state}', captured_amount = {captured},
                          resolved_at = {}, resolved_by_ticket = {}
         WHERE id = {}",
        clock_in(database, 0),
        id(database, by.0),
        id(database, hold)
    )
}

fn has(violations: &[Violation], rule: Rule, account_id: AccountId) -> bool {
    violations
        .iter()
        .any(|v| v.rule == rule && v.account_id == Some(account_id))
}

/// A hold is captured within its amount, before it expires, once; then neither voided nor
/// expired nor captured again; its refunds never pass the capture, and their total only
/// grows. A hold past its expiry cannot be captured or voided, only expired — by the
/// database's clock, whatever the writer believes.
pub async fn the_database_resolves_a_hold_once_in_time_and_within_it(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 100, 0).await;
    let (made, captured_by, other) = (
        ticket(&ledger, account_id).await,
        ticket(&ledger, account_id).await,
        ticket(&ledger, account_id).await,
    );
    let hold = plant_hold(database, account_id, made, 60, 3600, true).await;
    let resolve =
        |state: &str, captured: &str, by: TicketId| resolution(database, hold, state, captured, by);
    let hold = id(database, hold);
    assert!(
        database
            .execute(&resolve("captured", "61", captured_by))
            .await
            .is_err(),
        "a capture above the hold"
    );
    database
        .execute(&resolve("captured", "50", captured_by))
        .await
        .unwrap();
    assert!(
        database
            .execute(&resolve("voided", "NULL", other))
            .await
            .is_err(),
        "a void after the capture"
    );
    assert!(
        database
            .execute(&resolve("captured", "40", other))
            .await
            .is_err(),
        "a second capture"
    );
    assert!(
        database
            .execute(&format!(
                "UPDATE holds SET state = 'expired', captured_amount = NULL,
                                  resolved_by_ticket = NULL, resolved_at = {}
                 WHERE id = {hold}",
                clock_in(database, 7200)
            ))
            .await
            .is_err(),
        "an expiry after the capture"
    );
    let refunded =
        |total: i64| format!("UPDATE holds SET refunded_amount = {total} WHERE id = {hold}");
    assert!(
        database.execute(&refunded(51)).await.is_err(),
        "refunds above the capture"
    );
    database.execute(&refunded(40)).await.unwrap();
    assert!(
        database.execute(&refunded(30)).await.is_err(),
        "the refunded total going back"
    );

    let late = plant_hold(
        database,
        account_id,
        ticket(&ledger, account_id).await,
        10,
        -1,
        false,
    )
    .await;
    let late_resolve =
        |state: &str, captured: &str, by: TicketId| resolution(database, late, state, captured, by);
    let late = id(database, late);
    let now = clock_in(database, 0);
    assert!(
        database
            .execute(&late_resolve("captured", "10", other))
            .await
            .is_err(),
        "a capture after the expiry"
    );
    assert!(
        database
            .execute(&late_resolve("voided", "NULL", other))
            .await
            .is_err(),
        "a void after the expiry"
    );
    database
        .execute(&format!(
            "UPDATE holds SET state = 'expired', resolved_at = {now} WHERE id = {late}"
        ))
        .await
        .unwrap();
}

/// An order's refunds never add up to more than it paid, nothing is refunded of an order
/// not paid, and the total only grows.
pub async fn the_database_refunds_an_order_within_its_payment(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let new = NewOrder::new(Amount::new(100).unwrap(), "an order").unwrap();
    let (paid, open_order) = (
        ledger.create_order(account_id, &new).await.unwrap(),
        ledger.create_order(account_id, &new).await.unwrap(),
    );
    let payment = Operation::OrderPayment {
        order: paid.id,
        amount: paid.amount,
    };
    apply(
        &ledger,
        account_id,
        ticket(&ledger, account_id).await,
        payment,
        "pay",
        1,
    )
    .await
    .unwrap();
    let refunded = |order: uuid::Uuid, total: i64| {
        format!(
            "UPDATE orders SET refunded_amount = {total} WHERE id = {}",
            id(database, order)
        )
    };
    assert!(
        database
            .execute(&refunded(open_order.id.0, 1))
            .await
            .is_err(),
        "a refund of an order not paid"
    );
    assert!(
        database.execute(&refunded(paid.id.0, 101)).await.is_err(),
        "refunds above the payment"
    );
    database.execute(&refunded(paid.id.0, 100)).await.unwrap();
    assert!(
        database.execute(&refunded(paid.id.0, 60)).await.is_err(),
        "the refunded total going back"
    );
}

/// The audit finds what the database's own rules cannot see: an account's `held` that is
/// not its holds' sum; holds not yet expired that set aside more than the balance; a
/// refund without its entry, and a payment's refunds that do not add up to what it
/// records. Holds that are in line — one held, one past its expiry and not yet swept —
/// leave it clean.
pub async fn audit_finds_holds_and_refunds_out_of_line(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 100, 0).await;
    plant_hold(
        database,
        account_id,
        ticket(&ledger, account_id).await,
        60,
        3600,
        true,
    )
    .await;
    // Past its expiry: available counts it no more, though `held` still does.
    plant_hold(
        database,
        account_id,
        ticket(&ledger, account_id).await,
        90,
        -1,
        true,
    )
    .await;
    assert_clean(&ledger).await;

    let uncounted = account(&ledger, 100, 0).await;
    plant_hold(
        database,
        uncounted,
        ticket(&ledger, uncounted).await,
        60,
        3600,
        false,
    )
    .await;
    let violations = ledger.audit().await.unwrap();
    assert!(
        has(&violations, Rule::HoldResolvedOnce, uncounted),
        "{violations:#?}"
    );
    assert!(!has(&violations, Rule::HoldResolvedOnce, account_id));

    let overheld = account(&ledger, 100, 0).await;
    for amount in [60, 50] {
        plant_hold(
            database,
            overheld,
            ticket(&ledger, overheld).await,
            amount,
            3600,
            true,
        )
        .await;
    }
    let violations = ledger.audit().await.unwrap();
    assert!(
        has(&violations, Rule::AvailableNonNegative, overheld),
        "{violations:#?}"
    );
    assert!(!has(&violations, Rule::AvailableNonNegative, account_id));

    let refunded = account(&ledger, 1000, 0).await;
    let new = NewOrder::new(Amount::new(100).unwrap(), "an order").unwrap();
    let order = ledger.create_order(refunded, &new).await.unwrap();
    let payment = Operation::OrderPayment {
        order: order.id,
        amount: order.amount,
    };
    apply(
        &ledger,
        refunded,
        ticket(&ledger, refunded).await,
        payment,
        "pay",
        1,
    )
    .await
    .unwrap();
    database
        .execute(&format!(
            "INSERT INTO refunds (id, account_id, ticket_id, order_id, amount, created_at)
             VALUES ({}, {}, {}, {}, 30, {})",
            id(database, uuid::Uuid::new_v4()),
            id(database, refunded.0),
            id(database, ticket(&ledger, refunded).await.0),
            id(database, order.id.0),
            clock_in(database, 0),
        ))
        .await
        .unwrap();
    let violations = ledger.audit().await.unwrap();
    let found: Vec<_> = violations
        .iter()
        .filter(|v| v.rule == Rule::RefundsWithinPayment && v.account_id == Some(refunded))
        .collect();
    assert_eq!(
        found.len(),
        2,
        "the refund without its entry, and the order's total: {violations:#?}"
    );
}

/// A hold as an expiry event shows it, here.
fn show(hold: &Hold) -> serde_json::Value {
    serde_json::json!({"hold_id": hold.id.0, "state": hold.state.as_str()})
}

pub(crate) fn place(amount: i64, seconds: i64) -> (HoldId, Operation) {
    let hold = HoldId::random();
    (
        hold,
        Operation::Hold {
            hold,
            amount: Amount::new(amount).unwrap(),
            expires_in: HoldLifetime::new(seconds).unwrap(),
        },
    )
}

pub(crate) fn capture(hold: HoldId, amount: Option<i64>) -> Operation {
    Operation::Capture {
        hold,
        amount: amount.map(|amount| Amount::new(amount).unwrap()),
    }
}

fn withdrawal(amount: i64) -> Operation {
    Operation::Withdrawal(Amount::new(amount).unwrap())
}

/// Spends `operation` on a fresh ticket of `account_id` under `token`.
pub(crate) async fn spend(
    ledger: &Ledger,
    account_id: AccountId,
    operation: Operation,
    token: u64,
) -> ledger::Applied {
    let ticket = ticket(ledger, account_id).await;
    apply(
        ledger,
        account_id,
        ticket,
        operation,
        &format!("{operation:?}"),
        token,
    )
    .await
    .unwrap()
}

/// A hold sets money aside: spends and other holds see only what is available; it is
/// captured within its amount, once — the rest released at once, one entry — and then
/// neither voided nor captured again, each refusal stored under its ticket. A token its
/// lock gave before is refused.
pub async fn a_hold_sets_money_aside_and_is_captured_once(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 100, 0).await;
    let (hold, placing) = place(60, 3600);
    let placed = spend(&ledger, account_id, placing, 1).await;
    assert_eq!(placed.response.status, 201, "{}", placed.response.body);
    assert_eq!(placed.response.body["state"], "held");
    assert_eq!(placed.response.body["available"], 40);
    assert_eq!(placed.response.body["balance"], 100);
    let read = ledger.account(account_id).await.unwrap().unwrap();
    assert_eq!((read.balance, read.available), (100, 40));

    let refused = spend(&ledger, account_id, withdrawal(41), 2).await;
    assert_eq!(refused.response.status, 402, "{}", refused.response.body);
    let new = NewOrder::new(Amount::new(41).unwrap(), "an order").unwrap();
    let order = ledger.create_order(account_id, &new).await.unwrap();
    let payment = Operation::OrderPayment {
        order: order.id,
        amount: order.amount,
    };
    let unpaid = spend(&ledger, account_id, payment, 1).await;
    assert_eq!(unpaid.response.status, 402, "{}", unpaid.response.body);
    let withdrawn = spend(&ledger, account_id, withdrawal(40), 3).await;
    assert_eq!(
        withdrawn.response.status, 201,
        "{}",
        withdrawn.response.body
    );
    let (_, another) = place(1, 3600);
    assert_eq!(
        spend(&ledger, account_id, another, 4).await.response.status,
        402
    );

    let over = ticket(&ledger, account_id).await;
    let too_much = apply(&ledger, account_id, over, capture(hold, Some(61)), "c61", 1)
        .await
        .unwrap();
    assert_eq!(too_much.response.status, 422, "{}", too_much.response.body);
    assert_eq!(
        too_much.response.body["type"],
        "/problems/capture-exceeds-hold"
    );
    let replayed = apply(&ledger, account_id, over, capture(hold, Some(61)), "c61", 9)
        .await
        .unwrap();
    assert!(replayed.replayed);
    assert_eq!(replayed.response, too_much.response);

    let captured = spend(&ledger, account_id, capture(hold, Some(50)), 2).await;
    assert_eq!(captured.response.status, 200, "{}", captured.response.body);
    assert_eq!(captured.response.body["state"], "captured");
    assert_eq!(captured.response.body["captured_amount"], 50);
    assert_eq!(captured.response.body["balance"], 10);
    assert_eq!(captured.response.body["available"], 10);

    let voided = spend(&ledger, account_id, Operation::Void { hold }, 3).await;
    assert_eq!(voided.response.status, 409, "{}", voided.response.body);
    assert_eq!(voided.response.body["type"], "/problems/hold-not-held");
    let again = spend(&ledger, account_id, capture(hold, None), 4).await;
    assert_eq!(again.response.status, 409);
    let stale_ticket = ticket(&ledger, account_id).await;
    let stale = apply(
        &ledger,
        account_id,
        stale_ticket,
        capture(hold, None),
        "c",
        4,
    )
    .await;
    assert!(
        matches!(stale, Err(ApplyError::StaleToken { .. })),
        "{stale:?}"
    );

    let read = ledger.hold(hold).await.unwrap().unwrap();
    assert_eq!(read.state, HoldState::Captured);
    assert_eq!(read.captured_amount, Some(50));
    assert!(read.resolved_by_ticket.is_some());
    let entries = ledger.entries(account_id, None, 10).await.unwrap();
    let kinds: Vec<_> = entries.iter().map(|e| (e.kind, e.amount)).collect();
    assert_eq!(
        kinds,
        [
            (EntryKind::Opening, 100),
            (EntryKind::Withdrawal, -40),
            (EntryKind::HoldCapture, -50)
        ]
    );
    let other = account(&ledger, 100, 0).await;
    let theirs_ticket = ticket(&ledger, other).await;
    let theirs = apply(
        &ledger,
        other,
        theirs_ticket,
        Operation::Void { hold },
        "v",
        1,
    )
    .await;
    assert!(matches!(theirs, Err(ApplyError::UnknownHold)), "{theirs:?}");
    assert_clean(&ledger).await;
}

/// A hold past its expiry is expired as soon as the database's clock passes it: read so,
/// no longer counted against a spend, no longer captured or voided — before any sweeper
/// ran. The sweeper then records it once, releasing it from `held`.
pub async fn a_hold_past_its_expiry_is_expired_before_it_is_swept(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 100, 0).await;
    let (hold, placing) = place(100, 1);
    assert_eq!(
        spend(&ledger, account_id, placing, 1).await.response.status,
        201
    );
    let held = HoldCounts {
        held: 1,
        overdue: 0,
    };
    assert_eq!(ledger.hold_counts().await.unwrap(), held);
    assert_eq!(
        spend(&ledger, account_id, withdrawal(1), 2)
            .await
            .response
            .status,
        402
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let read = ledger.hold(hold).await.unwrap().unwrap();
    assert_eq!(read.state, HoldState::Expired);
    assert_eq!(read.resolved_at, Some(read.expires_at));
    let account_read = ledger.account(account_id).await.unwrap().unwrap();
    assert_eq!(
        (account_read.balance, account_read.available),
        (100, 100),
        "an expired hold sets nothing aside, swept or not"
    );
    let withdrawn = spend(&ledger, account_id, withdrawal(100), 3).await;
    assert_eq!(
        withdrawn.response.status, 201,
        "{}",
        withdrawn.response.body
    );
    for (operation, token) in [(capture(hold, None), 10), (Operation::Void { hold }, 11)] {
        let refused = spend(&ledger, account_id, operation, token).await;
        assert_eq!(refused.response.status, 409, "{}", refused.response.body);
        assert_eq!(
            refused.response.body["result"],
            "HoldNotHeld { state: Expired }"
        );
    }
    assert_clean(&ledger).await;
    let overdue = HoldCounts {
        held: 0,
        overdue: 1,
    };
    assert_eq!(ledger.hold_counts().await.unwrap(), overdue);

    assert_eq!(ledger.expire_holds(10, &show).await.unwrap(), 1);
    assert_eq!(ledger.expire_holds(10, &show).await.unwrap(), 0);
    assert_eq!(ledger.hold_counts().await.unwrap(), HoldCounts::default());
    let swept = ledger.hold(hold).await.unwrap().unwrap();
    assert_eq!(swept.state, HoldState::Expired);
    assert!(swept.resolved_at.unwrap() >= swept.expires_at);
    assert_clean(&ledger).await;
}

/// A capture, a void and the sweeper's expiry of one hold, at once, as its expiry comes:
/// exactly one resolves it, whichever; the others find it resolved. Many times over.
pub async fn capture_void_and_expiry_of_one_hold_settle_to_one_winner(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1_000_000, 0).await;
    let mut outcomes = std::collections::BTreeMap::<&str, usize>::new();
    for round in 0..12_u64 {
        let (hold, placing) = place(10, 1);
        assert_eq!(
            spend(&ledger, account_id, placing, round + 1)
                .await
                .response
                .status,
            201
        );
        let (capture_ticket, void_ticket) = (
            ticket(&ledger, account_id).await,
            ticket(&ledger, account_id).await,
        );
        // Aim at the expiry: a second after placing, give or take the round's own delay.
        tokio::time::sleep(Duration::from_millis(900 + round * 15)).await;
        let (captured, voided, expired) = tokio::join!(
            apply(
                &ledger,
                account_id,
                capture_ticket,
                capture(hold, None),
                "c",
                1
            ),
            apply(
                &ledger,
                account_id,
                void_ticket,
                Operation::Void { hold },
                "v",
                2
            ),
            ledger.expire_holds(10, &show),
        );
        let expired = expired.unwrap();
        let won = |answer: Result<ledger::Applied, ApplyError>| match answer {
            Ok(applied) => applied.response.status == 200,
            // The lower token, after the higher one wrote: not a winner.
            Err(ApplyError::StaleToken { .. }) => false,
            Err(error) => panic!("{error:?}"),
        };
        let (captured, voided) = (won(captured), won(voided));
        // The sweeper skips a hold whose row another transaction still holds — here a
        // refused capture's, its rollback not yet sent when its answer came back — and a
        // later sweep records it. Sweep until one does (a hold captured or voided, never).
        let mut swept = 0;
        if !captured && !voided {
            for _ in 0..100 {
                swept += ledger.expire_holds(10, &show).await.unwrap();
                if expired + swept > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let read = ledger.hold(hold).await.unwrap().unwrap();
        let winners =
            usize::from(captured) + usize::from(voided) + usize::from(expired + swept == 1);
        assert_eq!(winners, 1, "round {round}: {read:?}");
        assert!(expired + swept <= 1);
        let state = match (captured, voided) {
            (true, _) => "captured",
            (_, true) => "voided",
            _ => "expired",
        };
        assert_eq!(read.state.as_str(), state);
        *outcomes.entry(state).or_default() += 1;
    }
    assert_eq!(outcomes.values().sum::<usize>(), 12, "{outcomes:?}");
    println!("winners over 12 rounds: {outcomes:?}");
    assert_clean(&ledger).await;
}

fn refund(payment: Payment, amount: i64) -> Operation {
    Operation::Refund {
        refund: RefundId::random(),
        payment,
        amount: Amount::new(amount).unwrap(),
    }
}

/// Refunds of a paid order and of a captured hold: partial, repeated, never more in all
/// than was paid — each refusal (409, with what is still refundable) stored and replayed;
/// nothing refunded of an order not paid, or of a hold not captured. Each refund is an
/// entry of its own.
pub async fn refunds_never_exceed_the_payment(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let new = NewOrder::new(Amount::new(100).unwrap(), "an order").unwrap();
    let (order, unpaid) = (
        ledger.create_order(account_id, &new).await.unwrap(),
        ledger.create_order(account_id, &new).await.unwrap(),
    );
    let payment = Operation::OrderPayment {
        order: order.id,
        amount: order.amount,
    };
    assert_eq!(
        spend(&ledger, account_id, payment, 1).await.response.status,
        201
    );
    let not_paid = spend(&ledger, account_id, refund(Payment::Order(unpaid.id), 1), 1).await;
    assert_eq!(not_paid.response.status, 409);
    assert_eq!(not_paid.response.body["type"], "/problems/order-not-paid");

    let paid = Payment::Order(order.id);
    let first = spend(&ledger, account_id, refund(paid, 60), 2).await;
    assert_eq!(first.response.status, 201, "{}", first.response.body);
    assert_eq!(first.response.body["refunded_total"], 60);
    assert_eq!(first.response.body["refundable"], 40);
    assert_eq!(first.response.body["balance"], 960);
    let over_ticket = ticket(&ledger, account_id).await;
    let over = apply(&ledger, account_id, over_ticket, refund(paid, 60), "r60", 3)
        .await
        .unwrap();
    assert_eq!(over.response.status, 409, "{}", over.response.body);
    assert_eq!(
        over.response.body["type"],
        "/problems/refund-exceeds-payment"
    );
    assert_eq!(
        over.response.body["result"],
        "RefundExceedsPayment { refundable: 40 }"
    );
    let again = apply(&ledger, account_id, over_ticket, refund(paid, 60), "r60", 9)
        .await
        .unwrap();
    assert!(again.replayed);
    let rest = spend(&ledger, account_id, refund(paid, 40), 4).await;
    assert_eq!(rest.response.status, 201);
    assert_eq!(rest.response.body["refundable"], 0);
    assert_eq!(rest.response.body["balance"], 1000);
    assert_eq!(
        spend(&ledger, account_id, refund(paid, 1), 5)
            .await
            .response
            .status,
        409
    );

    let (hold, placing) = place(50, 3600);
    assert_eq!(
        spend(&ledger, account_id, placing, 1).await.response.status,
        201
    );
    let not_captured = spend(&ledger, account_id, refund(Payment::Hold(hold), 1), 1).await;
    assert_eq!(not_captured.response.status, 409);
    assert_eq!(
        not_captured.response.body["type"],
        "/problems/hold-not-held"
    );
    assert_eq!(
        spend(&ledger, account_id, capture(hold, Some(30)), 2)
            .await
            .response
            .status,
        200
    );
    let captured = Payment::Hold(hold);
    assert_eq!(
        spend(&ledger, account_id, refund(captured, 31), 3)
            .await
            .response
            .status,
        409
    );
    let back = spend(&ledger, account_id, refund(captured, 30), 4).await;
    assert_eq!(back.response.status, 201, "{}", back.response.body);
    assert_eq!(back.response.body["balance"], 1000);
    assert_eq!(
        ledger.hold(hold).await.unwrap().unwrap().refunded_amount,
        30
    );

    let refunds = ledger
        .entries(account_id, None, 20)
        .await
        .unwrap()
        .into_iter()
        .filter(|entry| entry.kind == EntryKind::Refund)
        .map(|entry| entry.amount)
        .collect::<Vec<_>>();
    assert_eq!(refunds, [60, 40, 30]);
    assert_clean(&ledger).await;
}

/// Refunds of one payment sent at once, each with its own ticket and token, and no lock
/// between them: never more in all than was paid — the rest are refused (409) or,
/// carrying a token older than one written, stale. (Under the order's lock, as the API
/// sends them, they take turns, and exactly as many succeed as fit.)
pub async fn concurrent_refunds_never_refund_more_than_was_paid(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let new = NewOrder::new(Amount::new(100).unwrap(), "an order").unwrap();
    let order = ledger.create_order(account_id, &new).await.unwrap();
    let payment = Operation::OrderPayment {
        order: order.id,
        amount: order.amount,
    };
    assert_eq!(
        spend(&ledger, account_id, payment, 1).await.response.status,
        201
    );
    let mut tickets = Vec::new();
    for _ in 0..8 {
        tickets.push(ticket(&ledger, account_id).await);
    }
    let answers = futures::future::join_all(tickets.iter().zip(2_u64..).map(|(ticket, token)| {
        apply(
            &ledger,
            account_id,
            *ticket,
            refund(Payment::Order(order.id), 30),
            "r30",
            token,
        )
    }))
    .await;
    let mut refunded = 0;
    for answer in answers {
        match answer {
            Ok(applied) if applied.response.status == 201 => refunded += 30,
            Ok(applied) => assert_eq!(applied.response.status, 409, "{}", applied.response.body),
            Err(ApplyError::StaleToken { .. }) => {}
            Err(error) => panic!("{error:?}"),
        }
    }
    assert!((30..=90).contains(&refunded), "refunded {refunded}");
    let entries = ledger.entries(account_id, None, 50).await.unwrap();
    let total: i64 = entries
        .iter()
        .filter(|entry| entry.kind == EntryKind::Refund)
        .map(|entry| entry.amount)
        .sum();
    assert_eq!(total, refunded);
    assert_clean(&ledger).await;
}

/// What becomes of a hold is announced in the transaction that decides it: a capture, a
/// void and a refund as their tickets' outcomes (`hold.captured`, `hold.voided`,
/// `refund.succeeded`), an expiry as an event of its own, written by the sweep that records
/// it and naming the ticket that placed the hold. Placing a hold, or a refusal, announces
/// nothing; a second sweep, nothing more.
pub async fn what_becomes_of_a_hold_is_announced_once(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    crate::webhooks::endpoint(&ledger, account_id, None).await;

    let (captured, placing) = place(100, 3600);
    assert_eq!(
        spend(&ledger, account_id, placing, 1).await.response.status,
        201
    );
    let capture_ticket = ticket(&ledger, account_id).await;
    let capture = apply(
        &ledger,
        account_id,
        capture_ticket,
        capture(captured, Some(60)),
        "c",
        1,
    )
    .await
    .unwrap();
    assert_eq!(capture.response.status, 200, "{}", capture.response.body);
    let refund_ticket = ticket(&ledger, account_id).await;
    let refunded = apply(
        &ledger,
        account_id,
        refund_ticket,
        refund(Payment::Hold(captured), 20),
        "r",
        2,
    )
    .await
    .unwrap();
    assert_eq!(refunded.response.status, 201, "{}", refunded.response.body);
    let refused = spend(&ledger, account_id, refund(Payment::Hold(captured), 50), 3).await;
    assert_eq!(refused.response.status, 409);

    let (voided, placing) = place(50, 3600);
    assert_eq!(
        spend(&ledger, account_id, placing, 2).await.response.status,
        201
    );
    let void_ticket = ticket(&ledger, account_id).await;
    let void = apply(
        &ledger,
        account_id,
        void_ticket,
        Operation::Void { hold: voided },
        "v",
        1,
    )
    .await
    .unwrap();
    assert_eq!(void.response.status, 200);

    let (expiring, placing) = place(30, 1);
    let placing_ticket = ticket(&ledger, account_id).await;
    let placed = apply(&ledger, account_id, placing_ticket, placing, "p", 3)
        .await
        .unwrap();
    assert_eq!(placed.response.status, 201);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(ledger.expire_holds(10, &show).await.unwrap(), 1);
    assert_eq!(ledger.expire_holds(10, &show).await.unwrap(), 0);

    let jobs = ledger
        .claim_deliveries("w", Duration::from_secs(30), 100)
        .await
        .unwrap();
    let mut seen: Vec<(EventType, ledger::TicketId)> = jobs
        .iter()
        .map(|job| (job.event.event_type, job.event.ticket_id))
        .collect();
    seen.sort();
    let mut expected = vec![
        (EventType::HoldCaptured, capture_ticket),
        (EventType::RefundSucceeded, refund_ticket),
        (EventType::HoldVoided, void_ticket),
        (EventType::HoldExpired, placing_ticket),
    ];
    expected.sort();
    assert_eq!(seen, expected);
    for job in &jobs {
        let body: serde_json::Value = serde_json::from_str(&job.event.payload()).unwrap();
        assert_eq!(body["data"]["account_id"], account_id.0.to_string());
        match job.event.event_type {
            EventType::HoldExpired => {
                assert_eq!(
                    body["data"]["hold"],
                    show(&ledger.hold(expiring).await.unwrap().unwrap())
                );
                assert_eq!(body["data"]["hold"]["state"], "expired");
            }
            EventType::HoldCaptured => {
                assert_eq!(body["data"]["outcome"]["status"], 200);
                assert_eq!(body["data"]["outcome"]["body"], capture.response.body);
            }
            EventType::HoldVoided => {
                assert_eq!(body["data"]["outcome"]["body"], void.response.body);
            }
            _ => {
                assert_eq!(body["data"]["outcome"]["status"], 201);
                assert_eq!(body["data"]["outcome"]["body"], refunded.response.body);
            }
        }
    }
    assert_clean(&ledger).await;
}
