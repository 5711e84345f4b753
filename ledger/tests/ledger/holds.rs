//! Holds and refunds in the database: the rules it keeps on its own, whoever writes — a
//! hold resolved once, in time by its clock, captured within its amount; refunds within
//! the payment — and the audit's rules over them. The rows are written here by hand, as a
//! writer that skipped the ledger's checks would write them.

use std::time::Duration;

use ledger::testing::TestDatabase;
use ledger::{AccountId, Amount, Ledger, NewOrder, Operation, Rule, TicketId, Violation};

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
    let hold = id(database, hold);
    let now = clock_in(database, 0);
    let resolve = |state: &str, captured: &str, by: TicketId| {
        format!(
            "UPDATE holds SET state = '{state}', captured_amount = {captured},
                              resolved_at = {now}, resolved_by_ticket = {}
             WHERE id = {hold}",
            id(database, by.0)
        )
    };
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
    let late = id(database, late);
    let late_resolve = |state: &str, captured: &str, by: TicketId| {
        format!(
            "UPDATE holds SET state = '{state}', captured_amount = {captured},
                              resolved_at = {now}, resolved_by_ticket = {}
             WHERE id = {late}",
            id(database, by.0)
        )
    };
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
