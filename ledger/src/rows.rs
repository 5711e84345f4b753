//! The rows as the two databases hold them — accounts, orders, tickets, entries — read
//! into the model's types, checked on the way (a row the model cannot hold is
//! [`LedgerError::Corrupt`]); the columns the statements name; and an entry as every
//! writer inserts it.

use serde_json::Value;
use sqlx::types::Json;

use crate::db_types::{Timestamp, from_row};
use crate::error::LedgerError;
use crate::model::{
    Account, AccountId, Amount, Entry, EntryKind, Order, OrderId, Outcome, StoredResponse, Ticket,
    TicketId,
};
use crate::payouts::PayoutId;

/// The columns of a ticket row, as [`TicketRow`] reads them (but `read_at`).
macro_rules! ticket_columns {
    () => {
        "id, account_id, created_at, expires_at, operation, fingerprint, response_status,
         response_body, completed_at"
    };
}
pub(crate) use ticket_columns;

/// The columns of an order, in [`OrderRow`]'s order.
macro_rules! order_columns {
    () => {
        "id, account_id, amount, description, fencing_token, paid_by_ticket, paid_at, created_at,
         refunded_amount"
    };
}
pub(crate) use order_columns;

from_row! {
    pub(crate) struct OrderRow {
        id: OrderId,
        account_id: AccountId,
        pub(crate) amount: i64,
        description: String,
        pub(crate) fencing_token: i64,
        pub(crate) paid_by_ticket: Option<TicketId>,
        paid_at: Option<Timestamp>,
        created_at: Timestamp,
        pub(crate) refunded_amount: i64,
    }
}

impl TryFrom<OrderRow> for Order {
    type Error = LedgerError;

    fn try_from(row: OrderRow) -> Result<Self, LedgerError> {
        Ok(Self {
            id: row.id,
            account_id: row.account_id,
            amount: Amount::new(row.amount).map_err(|_| {
                LedgerError::Corrupt(format!("order {}: amount {}", row.id, row.amount))
            })?,
            description: row.description,
            paid_by_ticket: row.paid_by_ticket,
            paid_at: row.paid_at.map(|at| at.0),
            created_at: row.created_at.0,
        })
    }
}

from_row! {
    pub(crate) struct AccountRow {
        id: AccountId,
        name: String,
        balance: i64,
        available: i64,
        points: i64,
        created_at: Timestamp,
    }
}

impl From<AccountRow> for Account {
    fn from(row: AccountRow) -> Self {
        Self {
            id: row.id,
            name: row.name,
            balance: row.balance,
            available: row.available,
            points: row.points,
            created_at: row.created_at.0,
        }
    }
}

from_row! {
    pub(crate) struct TicketRow {
        id: TicketId,
        pub(crate) account_id: AccountId,
        created_at: Timestamp,
        expires_at: Timestamp,
        operation: Option<String>,
        fingerprint: Option<String>,
        response_status: Option<i32>,
        response_body: Option<Json<Value>>,
        completed_at: Option<Timestamp>,
        /// The database's clock when the row was read.
        read_at: Timestamp,
    }
}

impl TryFrom<TicketRow> for Ticket {
    type Error = LedgerError;

    fn try_from(row: TicketRow) -> Result<Self, LedgerError> {
        let outcome = match (
            row.operation,
            row.fingerprint,
            row.response_status,
            row.completed_at,
        ) {
            (Some(operation), Some(fingerprint), Some(status), Some(completed_at)) => {
                let operation = EntryKind::parse(&operation).ok_or_else(|| {
                    LedgerError::Corrupt(format!("ticket {}: operation {operation:?}", row.id))
                })?;
                let status = u16::try_from(status).map_err(|_| {
                    LedgerError::Corrupt(format!("ticket {}: status {status}", row.id))
                })?;
                Some(Outcome {
                    operation,
                    fingerprint,
                    response: row
                        .response_body
                        .map(|Json(body)| StoredResponse { status, body }),
                    completed_at: completed_at.0,
                })
            }
            (None, None, None, None) => None,
            _ => {
                return Err(LedgerError::Corrupt(format!(
                    "ticket {}: partial outcome",
                    row.id
                )));
            }
        };
        Ok(Self {
            id: row.id,
            account_id: row.account_id,
            created_at: row.created_at.0,
            expires_at: row.expires_at.0,
            outcome,
            read_at: row.read_at.0,
        })
    }
}

from_row! {
    pub(crate) struct EntryRow {
        id: i64,
        account_id: AccountId,
        ticket_id: Option<TicketId>,
        kind: String,
        amount: i64,
        points: i64,
        balance_after: i64,
        points_after: i64,
        fencing_token: i64,
        created_at: Timestamp,
        order_id: Option<OrderId>,
        payout_id: Option<PayoutId>,
    }
}

impl TryFrom<EntryRow> for Entry {
    type Error = LedgerError;

    fn try_from(row: EntryRow) -> Result<Self, LedgerError> {
        Ok(Self {
            id: row.id,
            account_id: row.account_id,
            ticket_id: row.ticket_id,
            kind: EntryKind::parse(&row.kind).ok_or_else(|| {
                LedgerError::Corrupt(format!("entry {}: kind {:?}", row.id, row.kind))
            })?,
            amount: row.amount,
            points: row.points,
            balance_after: row.balance_after,
            points_after: row.points_after,
            fencing_token: u64::try_from(row.fencing_token).map_err(|_| {
                LedgerError::Corrupt(format!("entry {}: token {}", row.id, row.fencing_token))
            })?,
            created_at: row.created_at.0,
            order_id: row.order_id,
            payout_id: row.payout_id,
        })
    }
}

/// An entry, as every writer inserts it. Parameters: $1 account, $2 ticket or NULL, $3 kind,
/// $4 amount, $5 points, $6 balance after, $7 points after, $8 fencing token, $9 when.
pub(crate) const INSERT_ENTRY: &str = "
    INSERT INTO entries (account_id, ticket_id, kind, amount, points, balance_after,
                         points_after, fencing_token, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// A fencing token as the databases store it (a signed 64-bit integer).
pub(crate) fn token_to_sql(token: u64) -> Result<i64, LedgerError> {
    i64::try_from(token)
        .map_err(|_| LedgerError::Corrupt(format!("fencing token {token} exceeds 2^63")))
}
