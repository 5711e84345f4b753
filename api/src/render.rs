//! The bodies stored under a ticket: what the first execution answered, replayed byte for
//! byte (as a JSON value) by every repeat. The ledger calls [`render`] inside its
//! transaction and decides the outcome's kind, and with it the status
//! ([`ledger::OutcomeKind::status`]); this decides the shape.

use axum::http::StatusCode;
use ledger::holds::{Hold, Payment};
use ledger::payouts::{Payout, bank_key};
use ledger::{Execution, Operation, OperationResult, Refusal};
use serde_json::{Map, Value, json};

use crate::error::{problem, problem_with};

pub use payonce_types::holds::{
    HoldPlaced, HoldRefunded, HoldResolved, HoldState, HoldView, OrderRefunded,
};
pub use payonce_types::orders::OrderPaid;
pub use payonce_types::payouts::{PayoutAccepted, PayoutView};
pub use payonce_types::spends::{Drawn, MoneyMoved};

/// The body stored for an execution.
pub fn render(execution: &Execution<'_>) -> Value {
    let ticket_id = execution.ticket_id.0;
    let account_id = execution.account_id.0;
    let body = match (*execution.operation, *execution.result) {
        (
            Operation::Withdrawal(amount) | Operation::Deposit(amount),
            OperationResult::Applied { balance, .. },
        ) => serde_json::to_value(MoneyMoved {
            ticket_id,
            account_id,
            amount: amount.get(),
            balance,
        }),
        (
            Operation::LotteryDraw(points),
            OperationResult::Applied {
                balance,
                points: points_after,
                credit,
                prize,
            },
        ) => serde_json::to_value(Drawn {
            ticket_id,
            account_id,
            prize: prize.map_or("nothing", |prize| prize.label).to_owned(),
            credit,
            points: points.get(),
            points_after,
            balance,
        }),
        (Operation::OrderPayment { order, amount }, OperationResult::Applied { balance, .. }) => {
            serde_json::to_value(OrderPaid {
                order_id: order.0,
                ticket_id,
                account_id,
                amount: amount.get(),
                balance,
                state: "paid".to_owned(),
            })
        }
        (
            Operation::Payout {
                payout,
                amount,
                destination,
            },
            OperationResult::Applied { balance, .. },
        ) => serde_json::to_value(PayoutAccepted {
            payout_id: payout.0,
            ticket_id,
            account_id,
            amount: amount.get(),
            destination: destination.to_string(),
            balance,
            status: "pending".to_owned(),
        }),
        (operation, OperationResult::Refused(refusal)) => {
            return refused(execution, operation, refusal);
        }
        (
            Operation::Hold { .. },
            OperationResult::HoldChanged {
                hold,
                balance,
                available,
            },
        ) => serde_json::to_value(HoldPlaced {
            hold_id: hold.id.0,
            account_id,
            ticket_id,
            amount: hold.amount.get(),
            state: hold_state(hold.state),
            expires_at: hold.expires_at,
            balance,
            available,
        }),
        (
            _,
            OperationResult::HoldChanged {
                hold,
                balance,
                available,
            },
        ) => serde_json::to_value(HoldResolved {
            hold: hold_view(&hold),
            balance,
            available,
        }),
        (
            _,
            OperationResult::Refunded {
                refund,
                refunded_total,
                refundable,
                balance,
            },
        ) => match refund.payment {
            Payment::Order(order) => serde_json::to_value(OrderRefunded {
                refund_id: refund.id.0,
                order_id: order.0,
                ticket_id,
                account_id,
                amount: refund.amount.get(),
                refunded_total,
                refundable,
                balance,
            }),
            Payment::Hold(hold) => serde_json::to_value(HoldRefunded {
                refund_id: refund.id.0,
                hold_id: hold.0,
                ticket_id,
                account_id,
                amount: refund.amount.get(),
                refunded_total,
                refundable,
                balance,
            }),
        },
        // A hold, a capture, a void or a refund never comes to a plain application: the
        // ledger runs them on paths of their own, which answer as above.
        (
            Operation::Hold { .. }
            | Operation::Capture { .. }
            | Operation::Void { .. }
            | Operation::Refund { .. },
            OperationResult::Applied { balance, .. },
        ) => Ok(json!({ "ticket_id": ticket_id, "account_id": account_id, "balance": balance })),
    };
    // Serialising these plain structs cannot fail; keep the outcome storable regardless.
    body.unwrap_or_else(|error| json!({ "error": error.to_string() }))
}

/// A hold as the contract shows it (`GET /v1/holds/{hold_id}`): the fields a hold has in
/// its state, and none it does not.
pub fn hold_view(hold: &Hold) -> HoldView {
    HoldView {
        hold_id: hold.id.0,
        account_id: hold.account_id.0,
        amount: hold.amount.get(),
        state: hold_state(hold.state),
        captured_amount: hold.captured_amount,
        refunded_amount: hold.refunded_amount,
        expires_at: hold.expires_at,
        created_at: hold.created_at,
        resolved_at: hold.resolved_at,
        resolved_by_ticket: hold.resolved_by_ticket.map(|ticket| ticket.0),
    }
}

/// A hold's state as the contract names it.
fn hold_state(state: ledger::holds::HoldState) -> HoldState {
    use ledger::holds::HoldState as Ledger;
    match state {
        Ledger::Held => HoldState::Held,
        Ledger::Captured => HoldState::Captured,
        Ledger::Voided => HoldState::Voided,
        Ledger::Expired => HoldState::Expired,
    }
}

/// A payout as the contract shows it: `GET /v1/payouts/{payout_id}`, and the body of its
/// settlement's event (`payout.succeeded`, `payout.failed`).
pub fn payout_view(payout: Payout) -> PayoutView {
    PayoutView {
        payout_id: payout.id.0,
        account_id: payout.account_id.0,
        ticket_id: payout.ticket_id.0,
        amount: payout.amount.get(),
        bank_key: bank_key(payout.id),
        destination: payout.destination,
        status: payout.status.as_str().to_owned(),
        bank_transfer_id: payout.bank_transfer_id,
        failure_reason: payout.failure_reason,
        attempts: payout.attempts,
        last_error: payout.last_error,
        created_at: payout.created_at,
        settled_at: payout.settled_at,
    }
}

/// The problem stored for a refused spend: its name, a detail that says what was short,
/// and the figures behind it.
fn refused(execution: &Execution<'_>, operation: Operation, refusal: Refusal) -> Value {
    let status =
        StatusCode::from_u16(execution.kind().status()).unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
    let mut extra = Map::new();
    extra.insert("ticket_id".into(), json!(execution.ticket_id.0));
    extra.insert("account_id".into(), json!(execution.account_id.0));
    match operation {
        Operation::Capture { hold, .. } | Operation::Void { hold } => {
            extra.insert("hold_id".into(), json!(hold.0));
        }
        Operation::Refund { payment, .. } => {
            let (name, id) = match payment {
                Payment::Order(order) => ("order_id", order.0),
                Payment::Hold(hold) => ("hold_id", hold.0),
            };
            extra.insert(name.into(), json!(id));
        }
        _ => {}
    }
    let (name, detail) = match refusal {
        Refusal::InsufficientFunds { balance } => (
            "insufficient-funds",
            insufficient_funds(balance, operation, &mut extra),
        ),
        Refusal::OrderAlreadyPaid { paid_by } => {
            if let Operation::OrderPayment { order, .. } = operation {
                extra.insert("order_id".into(), json!(order.0));
            }
            extra.insert("paid_by_ticket".into(), json!(paid_by.0));
            (
                "order-already-paid",
                format!("the order was paid already, by ticket {paid_by}; nothing moved"),
            )
        }
        Refusal::InsufficientPoints { points } => (
            "insufficient-points",
            insufficient_points(points, operation, &mut extra),
        ),
        Refusal::HoldNotHeld { state } => {
            extra.insert("state".into(), json!(state.as_str()));
            (
                "hold-not-held",
                format!("the hold is {}; nothing moved", state.as_str()),
            )
        }
        Refusal::CaptureExceedsHold { held } => {
            extra.insert("held".into(), json!(held));
            (
                "capture-exceeds-hold",
                format!("the hold sets aside {held}, less than the capture asks; nothing moved"),
            )
        }
        Refusal::RefundExceedsPayment { refundable } => {
            extra.insert("refundable".into(), json!(refundable));
            (
                "refund-exceeds-payment",
                format!("{refundable} of the payment is still refundable; nothing moved"),
            )
        }
        Refusal::OrderNotPaid => (
            "order-not-paid",
            "the order is not paid: there is nothing to refund".to_owned(),
        ),
        Refusal::BalanceLimit { balance } => {
            extra.insert("balance".into(), json!(balance));
            (
                "balance-limit",
                format!("the balance {balance} cannot grow by this much (the limit is 2^63 − 1)"),
            )
        }
    };
    problem_with(&problem(status, name, &detail), extra)
}

/// `insufficient-funds`: the balance, and the amount it did not cover where the spend has
/// one; the detail.
fn insufficient_funds(
    balance: i64,
    operation: Operation,
    extra: &mut Map<String, Value>,
) -> String {
    extra.insert("balance".into(), json!(balance));
    match operation {
        Operation::Withdrawal(amount) => {
            extra.insert("amount".into(), json!(amount.get()));
            format!(
                "the balance {balance} does not cover the withdrawal of {}",
                amount.get()
            )
        }
        Operation::OrderPayment { order, amount } => {
            extra.insert("amount".into(), json!(amount.get()));
            extra.insert("order_id".into(), json!(order.0));
            format!(
                "the balance {balance} does not cover the order's {}; the order stays open",
                amount.get()
            )
        }
        Operation::Payout { amount, .. } => {
            extra.insert("amount".into(), json!(amount.get()));
            format!(
                "the balance {balance} does not cover the payout of {}; nothing was sent",
                amount.get()
            )
        }
        Operation::Hold { amount, .. } => {
            extra.insert("amount".into(), json!(amount.get()));
            format!(
                "the money available of the balance {balance} does not cover a hold of {}",
                amount.get()
            )
        }
        _ => format!("the balance {balance} does not cover this"),
    }
}

/// `insufficient-points`: the points, and those a draw needed; the detail.
fn insufficient_points(
    points: i64,
    operation: Operation,
    extra: &mut Map<String, Value>,
) -> String {
    extra.insert("points".into(), json!(points));
    match operation {
        Operation::LotteryDraw(spend) => {
            extra.insert("points_needed".into(), json!(spend.get()));
            format!("{points} points do not cover a draw of {}", spend.get())
        }
        _ => format!("{points} points do not cover this"),
    }
}
