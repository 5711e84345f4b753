//! Holds and refunds: money set aside on an account, then captured (all or part), voided or
//! expired — once — and refunds of a paid order or a captured hold that never add up to
//! more than was paid (DESIGN.md, "Holds and refunds").
//!
//! The database holds the rules on its own (migration 0015, SQLite 0012): a hold resolved
//! once, in time by its clock, captured within its amount; refunds within the payment;
//! each capture and refund one entry. The audit checks them over the whole database
//! ([`Rule::HoldResolvedOnce`](crate::Rule::HoldResolvedOnce),
//! [`Rule::RefundsWithinPayment`](crate::Rule::RefundsWithinPayment),
//! [`Rule::AvailableNonNegative`](crate::Rule::AvailableNonNegative)).

use serde::Serialize;

use crate::db_types::identifier;

identifier! {
    /// A hold's identifier; its lock is keyed by it.
    pub struct HoldId;
}

identifier! {
    /// A refund's identifier.
    pub struct RefundId;
}

/// Where a hold is in its life. A hold past its `expires_at` by the database's clock is
/// expired when read, whether or not the sweeper has recorded it yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldState {
    /// Set aside: counted against the account's available money.
    Held,
    /// Captured, all or part: the captured amount left the account, the rest was released.
    Captured,
    /// Released by a request before it expired.
    Voided,
    /// Released by the clock.
    Expired,
}

impl HoldState {
    /// Every state.
    pub const ALL: [Self; 4] = [Self::Held, Self::Captured, Self::Voided, Self::Expired];

    /// The name stored in the database and shown by the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Captured => "captured",
            Self::Voided => "voided",
            Self::Expired => "expired",
        }
    }

    /// The state named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == name)
    }
}
