//! The bodies stored under a ticket: what the first execution answered, replayed byte for
//! byte (as a JSON value) by every repeat. The ledger calls [`render`] inside its
//! transaction and decides the outcome's kind, and with it the status
//! ([`ledger::OutcomeKind::status`]); this decides the shape.

use axum::http::StatusCode;
use ledger::{Execution, Operation, OperationResult, Refusal};
use serde_json::{Map, Value, json};

use crate::error::{problem, problem_with};

pub use payonce_types::orders::OrderPaid;
pub use payonce_types::payouts::PayoutAccepted;
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
    };
    // Serialising these plain structs cannot fail; keep the outcome storable regardless.
    body.unwrap_or_else(|error| json!({ "error": error.to_string() }))
}

fn refused(execution: &Execution<'_>, operation: Operation, refusal: Refusal) -> Value {
    let status =
        StatusCode::from_u16(execution.kind().status()).unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
    let mut extra = Map::new();
    extra.insert("ticket_id".into(), json!(execution.ticket_id.0));
    extra.insert("account_id".into(), json!(execution.account_id.0));
    let (name, detail) = match (refusal, operation) {
        (Refusal::InsufficientFunds { balance }, Operation::Withdrawal(amount)) => {
            extra.insert("balance".into(), json!(balance));
            extra.insert("amount".into(), json!(amount.get()));
            (
                "insufficient-funds",
                format!(
                    "the balance {balance} does not cover the withdrawal of {}",
                    amount.get()
                ),
            )
        }
        (Refusal::InsufficientFunds { balance }, Operation::OrderPayment { order, amount }) => {
            extra.insert("balance".into(), json!(balance));
            extra.insert("amount".into(), json!(amount.get()));
            extra.insert("order_id".into(), json!(order.0));
            (
                "insufficient-funds",
                format!(
                    "the balance {balance} does not cover the order's {}; the order stays open",
                    amount.get()
                ),
            )
        }
        (Refusal::InsufficientFunds { balance }, Operation::Payout { amount, .. }) => {
            extra.insert("balance".into(), json!(balance));
            extra.insert("amount".into(), json!(amount.get()));
            (
                "insufficient-funds",
                format!(
                    "the balance {balance} does not cover the payout of {}; nothing was sent",
                    amount.get()
                ),
            )
        }
        (Refusal::OrderAlreadyPaid { paid_by }, operation) => {
            if let Operation::OrderPayment { order, .. } = operation {
                extra.insert("order_id".into(), json!(order.0));
            }
            extra.insert("paid_by_ticket".into(), json!(paid_by.0));
            (
                "order-already-paid",
                format!("the order was paid already, by ticket {paid_by}; nothing moved"),
            )
        }
        (Refusal::InsufficientFunds { balance }, _) => {
            extra.insert("balance".into(), json!(balance));
            (
                "insufficient-funds",
                format!("the balance {balance} does not cover this"),
            )
        }
        (Refusal::InsufficientPoints { points }, Operation::LotteryDraw(spend)) => {
            extra.insert("points".into(), json!(points));
            extra.insert("points_needed".into(), json!(spend.get()));
            (
                "insufficient-points",
                format!("{points} points do not cover a draw of {}", spend.get()),
            )
        }
        (Refusal::InsufficientPoints { points }, _) => {
            extra.insert("points".into(), json!(points));
            (
                "insufficient-points",
                format!("{points} points do not cover this"),
            )
        }
        (Refusal::BalanceLimit { balance }, _) => {
            extra.insert("balance".into(), json!(balance));
            (
                "balance-limit",
                format!("the balance {balance} cannot grow by this much (the limit is 2^63 − 1)"),
            )
        }
    };
    problem_with(&problem(status, name, &detail), extra)
}
