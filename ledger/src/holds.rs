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

/// The longest a hold may last: seven days, as card authorizations commonly do.
pub const MAX_HOLD_SECONDS: u32 = 604_800;

/// How long a hold lasts from its creation, by the database's clock: 1 ..=
/// [`MAX_HOLD_SECONDS`] seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct HoldLifetime(u32);

/// A lifetime outside 1 ..= [`MAX_HOLD_SECONDS`] seconds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expires_in must be between 1 and {MAX_HOLD_SECONDS} seconds, got {0}")]
pub struct InvalidLifetime(pub i64);

impl HoldLifetime {
    /// The longest, and what a hold gets when it names none.
    pub const LONGEST: Self = Self(MAX_HOLD_SECONDS);

    /// `seconds`, if within the bounds.
    pub fn new(seconds: i64) -> Result<Self, InvalidLifetime> {
        u32::try_from(seconds)
            .ok()
            .filter(|seconds| (1..=MAX_HOLD_SECONDS).contains(seconds))
            .map(Self)
            .ok_or(InvalidLifetime(seconds))
    }

    /// As a duration.
    pub fn duration(self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(self.0))
    }
}

/// The payment a refund gives money back from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Payment {
    /// A paid order: refunded under the order's lock.
    Order(crate::OrderId),
    /// A captured hold: refunded under the hold's lock.
    Hold(HoldId),
}

/// A hold as the API shows it. Its `state` is as of the database's clock when it was read:
/// a hold past its expiry is expired, whether or not the sweeper has recorded it yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    /// Its identifier.
    pub id: HoldId,
    /// The account whose money it sets aside.
    pub account_id: crate::AccountId,
    /// The ticket that placed it.
    pub ticket_id: crate::TicketId,
    /// What it sets aside.
    pub amount: crate::Amount,
    /// Where it is in its life.
    pub state: HoldState,
    /// What its capture took, once captured.
    pub captured_amount: Option<i64>,
    /// What its refunds gave back.
    pub refunded_amount: i64,
    /// When it expires unless captured or voided before.
    pub expires_at: time::OffsetDateTime,
    /// When it was placed.
    pub created_at: time::OffsetDateTime,
    /// When it was captured, voided or expired (an expiry not yet swept: its `expires_at`).
    pub resolved_at: Option<time::OffsetDateTime>,
    /// The ticket that captured or voided it.
    pub resolved_by_ticket: Option<crate::TicketId>,
}

/// A refund as made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refund {
    /// Its identifier.
    pub id: RefundId,
    /// The account the money went back to.
    pub account_id: crate::AccountId,
    /// The ticket that made it.
    pub ticket_id: crate::TicketId,
    /// The payment it refunds.
    pub payment: Payment,
    /// What it gave back.
    pub amount: crate::Amount,
    /// When it was made.
    pub created_at: time::OffsetDateTime,
}

/// How a hold is shown in its expiry event (`hold.expired`): as the API shows it
/// (`GET /v1/holds/{hold_id}`).
pub type HoldRenderer = dyn Fn(&Hold) -> serde_json::Value + Send + Sync;

/// The holds held, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HoldCounts {
    /// Holds held and not past their expiry: what they set aside is out of `available`.
    pub held: u64,
    /// Holds past their expiry that no sweep has recorded yet (expired to every reader
    /// already); more than a few for more than a few seconds means no sweeper runs.
    pub overdue: u64,
}
