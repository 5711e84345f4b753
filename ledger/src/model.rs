//! The ledger's vocabulary: identifiers, validated amounts, and what the database holds.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

use crate::db_types::identifier;
use crate::holds::{Hold, HoldId, HoldLifetime, HoldState, Payment, Refund, RefundId};
use crate::lottery::Prize;

/// The largest amount one request may move, in minor units (and the largest number of
/// points one draw may spend).
pub const MAX_AMOUNT: i64 = 1_000_000_000_000;

identifier! {
    /// An account's identifier.
    pub struct AccountId;
}

identifier! {
    /// A ticket's identifier: the idempotency key of one spend.
    pub struct TicketId;
}

identifier! {
    /// An order's identifier.
    pub struct OrderId;
}

identifier! {
    /// A payout's identifier; the bank's idempotency key is derived from it
    /// ([`Payout::bank_key`](crate::payouts::Payout::bank_key)), so every attempt of one payout
    /// carries the same key.
    pub struct PayoutId;
}

/// The most bytes a destination has.
pub const MAX_DESTINATION: usize = 64;

/// The account at the bank a payout goes to: 1 to [`MAX_DESTINATION`] of `A-Z a-z 0-9 .
/// _ : -` (an IBAN, an account number, a provider's account id). Held inline, so an
/// operation that carries one stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Destination {
    bytes: [u8; MAX_DESTINATION],
    len: u8,
}

/// A destination outside the rules of [`Destination`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "destination must be 1 to {MAX_DESTINATION} characters of A-Z, a-z, 0-9, '.', '_', ':' and '-'"
)]
pub struct InvalidDestination;

impl Destination {
    /// The pattern a destination matches, for documents that describe it.
    pub const PATTERN: &'static str = "^[A-Za-z0-9._:-]{1,64}$";

    /// `destination`, if it keeps the rules.
    pub fn new(destination: &str) -> Result<Self, InvalidDestination> {
        let allowed = |byte: &u8| byte.is_ascii_alphanumeric() || b"._:-".contains(byte);
        if destination.is_empty()
            || destination.len() > MAX_DESTINATION
            || !destination.bytes().all(|byte| allowed(&byte))
        {
            return Err(InvalidDestination);
        }
        let mut bytes = [0; MAX_DESTINATION];
        bytes[..destination.len()].copy_from_slice(destination.as_bytes());
        Ok(Self {
            bytes,
            // At most MAX_DESTINATION, checked above.
            len: destination.len() as u8,
        })
    }

    /// The destination as written.
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored (checked in `new`).
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl fmt::Debug for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Destination").field(&self.as_str()).finish()
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Input the ledger refuses before touching the database.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidInput {
    /// An amount outside 1 ..= [`MAX_AMOUNT`].
    #[error("amount must be between 1 and {MAX_AMOUNT}, got {0}")]
    Amount(i64),
    /// Points to spend outside 1 ..= [`MAX_AMOUNT`].
    #[error("points must be between 1 and {MAX_AMOUNT}, got {0}")]
    Points(i64),
    /// An account name that is empty or longer than 100 characters.
    #[error("name must be 1 to 100 characters, got {0}")]
    NameLength(usize),
    /// An account name with a NUL character.
    #[error("name must not contain a NUL character")]
    NameNul,
    /// A negative opening balance.
    #[error("opening balance must not be negative, got {0}")]
    OpeningBalance(i64),
    /// Negative opening points.
    #[error("opening points must not be negative, got {0}")]
    OpeningPoints(i64),
    /// An order description longer than 200 characters.
    #[error("description must be at most 200 characters, got {0}")]
    DescriptionLength(usize),
    /// An order description with a NUL character.
    #[error("description must not contain a NUL character")]
    DescriptionNul,
}

/// Money moved by one request, in minor units: 1 ..= [`MAX_AMOUNT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Amount(i64);

impl Amount {
    /// Validates an amount.
    pub fn new(value: i64) -> Result<Self, InvalidInput> {
        if (1..=MAX_AMOUNT).contains(&value) {
            Ok(Self(value))
        } else {
            Err(InvalidInput::Amount(value))
        }
    }

    /// The number of minor units.
    pub fn get(self) -> i64 {
        self.0
    }

    /// A number no amount can be, in an amount's place: a stand-in a group commit's
    /// statement replaces (`stand_ins.rs`).
    pub(crate) const fn stand_in(value: i64) -> Self {
        Self(value)
    }
}

/// Points spent by one lottery draw: 1 ..= [`MAX_AMOUNT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct PointsToSpend(i64);

impl PointsToSpend {
    /// Validates a number of points.
    pub fn new(value: i64) -> Result<Self, InvalidInput> {
        if (1..=MAX_AMOUNT).contains(&value) {
            Ok(Self(value))
        } else {
            Err(InvalidInput::Points(value))
        }
    }

    /// The number of points.
    pub fn get(self) -> i64 {
        self.0
    }
}

/// A validated request to open an account.
#[derive(Clone, Debug)]
pub struct NewAccount {
    name: String,
    balance: i64,
    points: i64,
}

impl NewAccount {
    /// Validates the name (1 to 100 characters, no NUL — PostgreSQL cannot store one) and
    /// the opening balance and points (≥ 0).
    pub fn new(name: impl Into<String>, balance: i64, points: i64) -> Result<Self, InvalidInput> {
        let name = name.into();
        let length = name.chars().count();
        if !(1..=100).contains(&length) {
            return Err(InvalidInput::NameLength(length));
        }
        if name.contains('\0') {
            return Err(InvalidInput::NameNul);
        }
        if balance < 0 {
            return Err(InvalidInput::OpeningBalance(balance));
        }
        if points < 0 {
            return Err(InvalidInput::OpeningPoints(points));
        }
        Ok(Self {
            name,
            balance,
            points,
        })
    }

    /// The account's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The opening balance.
    pub fn balance(&self) -> i64 {
        self.balance
    }

    /// The opening points.
    pub fn points(&self) -> i64 {
        self.points
    }
}

/// What a ticket is spent on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Take money out.
    Withdrawal(Amount),
    /// Put money in.
    Deposit(Amount),
    /// Spend points on a draw from the prize table; the prize may credit money.
    LotteryDraw(PointsToSpend),
    /// Pay an order of the account: its amount out, once for the order whatever the
    /// ticket. `amount` is the order's, as the caller read it; the ledger checks it
    /// against the order it locks.
    OrderPayment {
        /// The order.
        order: OrderId,
        /// Its amount.
        amount: Amount,
    },
    /// Send money to an outside bank: the amount out now, and a payout (chosen beforehand,
    /// its id included) that a worker sends to the bank after the commit. Its outcome is
    /// [`OutcomeKind::PayoutAccepted`] (stored as 202), with the payout's live status at
    /// `GET /v1/payouts/{id}`.
    Payout {
        /// The payout's id.
        payout: PayoutId,
        /// Its amount.
        amount: Amount,
        /// The account at the bank.
        destination: Destination,
    },
    /// Set money aside: `amount` counted against the account's available money until the
    /// hold is captured, voided, or expires `expires_in` after it was placed, by the
    /// database's clock. Moves no money; under the account's lock.
    Hold {
        /// The hold's id (chosen beforehand).
        hold: HoldId,
        /// What it sets aside.
        amount: Amount,
        /// How long it lasts.
        expires_in: HoldLifetime,
    },
    /// Capture a held hold: `amount` of it (the whole hold when `None`) out of the
    /// account, the rest released at once. Under the hold's lock.
    Capture {
        /// The hold.
        hold: HoldId,
        /// What to take; at most the hold.
        amount: Option<Amount>,
    },
    /// Void a held hold: all of it released. Under the hold's lock.
    Void {
        /// The hold.
        hold: HoldId,
    },
    /// Give `amount` of a payment back to the account — of a paid order, under the
    /// order's lock, or of a captured hold, under the hold's — never more in all than was
    /// paid.
    Refund {
        /// The refund's id (chosen beforehand).
        refund: RefundId,
        /// What it refunds.
        payment: Payment,
        /// How much.
        amount: Amount,
    },
}

impl Operation {
    /// The entry kind this operation writes.
    pub fn kind(self) -> EntryKind {
        match self {
            Self::Withdrawal(_) => EntryKind::Withdrawal,
            Self::Deposit(_) => EntryKind::Deposit,
            Self::LotteryDraw(_) => EntryKind::LotteryDraw,
            Self::OrderPayment { .. } => EntryKind::OrderPayment,
            Self::Payout { .. } => EntryKind::Payout,
            Self::Hold { .. } => EntryKind::Hold,
            Self::Capture { .. } => EntryKind::HoldCapture,
            Self::Void { .. } => EntryKind::HoldVoid,
            Self::Refund { .. } => EntryKind::Refund,
        }
    }
}

/// What an entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// The opening balance and points, written with the account.
    Opening,
    /// Money in.
    Deposit,
    /// Money out.
    Withdrawal,
    /// Points out, possibly money in.
    LotteryDraw,
    /// Money out, paying an order.
    OrderPayment,
    /// Money out, to an outside bank.
    Payout,
    /// A payout's money back: the bank refused it for good.
    PayoutReversal,
    /// A hold placed: a ticket's operation only — a hold moves no money, and writes no
    /// entry.
    Hold,
    /// Money out, capturing a hold (all or part of it).
    HoldCapture,
    /// A hold voided: a ticket's operation only, like [`EntryKind::Hold`].
    HoldVoid,
    /// Money back, refunding part or all of a payment: an order's or a captured hold's.
    Refund,
}

impl EntryKind {
    /// The name stored in the database and shown by the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Opening => "opening",
            Self::Deposit => "deposit",
            Self::Withdrawal => "withdrawal",
            Self::LotteryDraw => "lottery_draw",
            Self::OrderPayment => "order_payment",
            Self::Payout => "payout",
            Self::PayoutReversal => "payout_reversal",
            Self::Hold => "hold",
            Self::HoldCapture => "hold_capture",
            Self::HoldVoid => "hold_void",
            Self::Refund => "refund",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Self> {
        [
            Self::Opening,
            Self::Deposit,
            Self::Withdrawal,
            Self::LotteryDraw,
            Self::OrderPayment,
            Self::Payout,
            Self::PayoutReversal,
            Self::Hold,
            Self::HoldCapture,
            Self::HoldVoid,
            Self::Refund,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == name)
    }
}

/// An account as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    /// Its identifier.
    pub id: AccountId,
    /// Its name.
    pub name: String,
    /// Money, in minor units; never negative.
    pub balance: i64,
    /// The balance less every hold that is held and not past its expiry, by the
    /// database's clock when read; never negative.
    pub available: i64,
    /// Points; never negative.
    pub points: i64,
    /// When it was opened.
    pub created_at: OffsetDateTime,
}

/// A response stored under a ticket, replayed for every repeat of the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    /// The HTTP status of the original response.
    pub status: u16,
    /// Its JSON body.
    pub body: Value,
}

/// What a used ticket remembers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The entry kind of the operation that used it.
    pub operation: EntryKind,
    /// The fingerprint of the request that used it.
    pub fingerprint: String,
    /// The stored response; `None` once the retention period dropped it.
    pub response: Option<StoredResponse>,
    /// When it was used.
    pub completed_at: OffsetDateTime,
}

impl Outcome {
    /// What kind of outcome it is ([`OutcomeKind::stored`]); `None` once the retention
    /// dropped the stored response.
    pub fn kind(&self) -> Option<OutcomeKind> {
        let response = self.response.as_ref()?;
        OutcomeKind::stored(self.operation, response.status)
    }
}

/// A ticket: the right to spend once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// Its identifier, sent as the `Idempotency-Key`.
    pub id: TicketId,
    /// The account it was issued to; only that account may use it.
    pub account_id: AccountId,
    /// When it was issued.
    pub created_at: OffsetDateTime,
    /// After this, an unused ticket can no longer be used.
    pub expires_at: OffsetDateTime,
    /// Set once it was used.
    pub outcome: Option<Outcome>,
    /// The database's clock when this copy was read. Expiry is judged by it — never by
    /// an instance's own clock, which may disagree with another instance's, so that every
    /// instance reaches the same verdict and a 410 is final.
    pub read_at: OffsetDateTime,
}

/// Where a ticket is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TicketState {
    /// Issued and usable.
    Issued,
    /// Used; its outcome is stored.
    Completed,
    /// Expired unused.
    Expired,
}

impl Ticket {
    /// The ticket's state when it was read.
    pub fn state(&self) -> TicketState {
        if self.outcome.is_some() {
            TicketState::Completed
        } else if self.read_at >= self.expires_at {
            TicketState::Expired
        } else {
            TicketState::Issued
        }
    }

    /// What a request with `fingerprint` may do with this ticket: the one decision both
    /// the API (before taking any lock) and the ledger (inside the transaction, with the
    /// ticket locked) make, so the two can never disagree.
    pub fn judge(&self, fingerprint: &str) -> Judgement<'_> {
        match &self.outcome {
            Some(outcome) if outcome.fingerprint != fingerprint => Judgement::Reused,
            Some(outcome) => match &outcome.response {
                Some(response) => Judgement::Replay(response),
                None => Judgement::Pruned,
            },
            None if self.read_at >= self.expires_at => Judgement::Expired,
            None => Judgement::Usable,
        }
    }
}

/// The verdict of [`Ticket::judge`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judgement<'a> {
    /// Unused and unexpired: the request may execute.
    Usable,
    /// Used by this same request: answer with its stored response.
    Replay(&'a StoredResponse),
    /// Used by a different request (another amount, another endpoint): refuse.
    Reused,
    /// Used, and its stored response is past retention: it never runs again.
    Pruned,
    /// Expired unused.
    Expired,
}

/// One line of an account's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Increasing in the order entries were written.
    pub id: i64,
    /// The account it belongs to.
    pub account_id: AccountId,
    /// The ticket that wrote it; `None` for the opening entry and a payout's reversal.
    pub ticket_id: Option<TicketId>,
    /// What it records.
    pub kind: EntryKind,
    /// Signed change to the balance.
    pub amount: i64,
    /// Signed change to the points.
    pub points: i64,
    /// The balance after this entry.
    pub balance_after: i64,
    /// The points after this entry.
    pub points_after: i64,
    /// The lock fencing token the write carried (0 for the opening entry): of the
    /// account's lock, or for an order payment of the order's.
    pub fencing_token: u64,
    /// The order an order payment paid.
    pub order_id: Option<OrderId>,
    /// The payout a payout's debit or reversal belongs to.
    pub payout_id: Option<PayoutId>,
    /// When it was written.
    pub created_at: OffsetDateTime,
}

/// A new order: an amount of 1 to 10^12 minor units and a description of at most 200
/// characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewOrder {
    amount: Amount,
    description: String,
}

impl NewOrder {
    /// Checks the description's length (the amount is checked by [`Amount`]).
    pub fn new(amount: Amount, description: impl Into<String>) -> Result<Self, InvalidInput> {
        let description = description.into();
        let length = description.chars().count();
        if length > 200 {
            return Err(InvalidInput::DescriptionLength(length));
        }
        if description.contains('\0') {
            return Err(InvalidInput::DescriptionNul);
        }
        Ok(Self {
            amount,
            description,
        })
    }

    /// The amount.
    pub fn amount(&self) -> Amount {
        self.amount
    }

    /// The description.
    pub fn description(&self) -> &str {
        &self.description
    }
}

/// An order: an amount its account pays once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    /// Its identifier.
    pub id: OrderId,
    /// The account that owes it; only that account may read or pay it.
    pub account_id: AccountId,
    /// The amount, in minor units.
    pub amount: Amount,
    /// What it is for (may be empty).
    pub description: String,
    /// The ticket that paid it, once paid.
    pub paid_by_ticket: Option<TicketId>,
    /// When it was paid.
    pub paid_at: Option<OffsetDateTime>,
    /// When it was placed.
    pub created_at: OffsetDateTime,
}

/// Why an operation was refused. Refusals are outcomes: stored under the ticket and
/// replayed, like successes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The balance is below the amount.
    InsufficientFunds {
        /// The balance at the time.
        balance: i64,
    },
    /// The points are below the points to spend.
    InsufficientPoints {
        /// The points at the time.
        points: i64,
    },
    /// The deposit or prize would overflow the balance.
    BalanceLimit {
        /// The balance at the time.
        balance: i64,
    },
    /// The order was paid already, by another ticket.
    OrderAlreadyPaid {
        /// The ticket that paid it.
        paid_by: TicketId,
    },
    /// The hold is not held: captured, voided or expired (a capture, a void, or a refund
    /// of a hold never captured).
    HoldNotHeld {
        /// Its state.
        state: HoldState,
    },
    /// The capture asked for more than the hold.
    CaptureExceedsHold {
        /// The hold's amount.
        held: i64,
    },
    /// The refund asked for more than is still refundable of the payment.
    RefundExceedsPayment {
        /// What is still refundable.
        refundable: i64,
    },
    /// The order is not paid: there is nothing to refund.
    OrderNotPaid,
}

/// What executing an operation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperationResult {
    /// Applied: an entry was written.
    Applied {
        /// The balance after.
        balance: i64,
        /// The points after.
        points: i64,
        /// Money the lottery prize credited (0 otherwise).
        credit: i64,
        /// The prize drawn, for lottery draws.
        prize: Option<&'static Prize>,
    },
    /// Refused for a business reason: nothing moved.
    Refused(Refusal),
    /// A hold placed, captured or voided: the hold as it is now, and the account's balance
    /// and available money after.
    HoldChanged {
        /// The hold.
        hold: Hold,
        /// The balance after.
        balance: i64,
        /// The balance less the holds held and not expired, after.
        available: i64,
    },
    /// A refund made: the refund, what the payment's refunds add up to now and what is
    /// still refundable of it, and the balance after.
    Refunded {
        /// The refund.
        refund: Refund,
        /// What the payment's refunds add up to, this one included.
        refunded_total: i64,
        /// What is still refundable of the payment.
        refundable: i64,
        /// The balance after.
        balance: i64,
    },
}

/// What came of a spend, in the ledger's own terms: what the event it announces, the
/// audit and the API's edge (a payout's `Location`, the problem a refusal renders) decide
/// by, and what its status is chosen from ([`OutcomeKind::status`]). Holds, captures,
/// voids, expiries and refunds will each add their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    /// It went through: money and points moved and an entry was written.
    Executed,
    /// A payout's money left the account and the payout waits for the bank.
    PayoutAccepted,
    /// Refused: the balance does not cover the debit.
    RefusedInsufficientFunds,
    /// Refused: the points do not cover the spend.
    RefusedInsufficientPoints,
    /// Refused: the balance would pass its limit.
    RefusedBalanceLimit,
    /// Refused: the order was paid already, by another ticket.
    RefusedOrderAlreadyPaid,
    /// A hold placed (no money moved).
    Held,
    /// A hold captured: its captured amount left the account.
    Captured,
    /// A hold voided (no money moved).
    Voided,
    /// Refused: the hold is not held (captured, voided or expired).
    RefusedHoldNotHeld,
    /// Refused: the capture asked for more than the hold.
    RefusedCaptureExceedsHold,
    /// Refused: a refund of more than is refundable, of an order not paid, or of a hold
    /// not captured.
    RefusedRefund,
}

impl OutcomeKind {
    /// Every kind.
    pub const ALL: [Self; 12] = [
        Self::Executed,
        Self::PayoutAccepted,
        Self::RefusedInsufficientFunds,
        Self::RefusedInsufficientPoints,
        Self::RefusedBalanceLimit,
        Self::RefusedOrderAlreadyPaid,
        Self::Held,
        Self::Captured,
        Self::Voided,
        Self::RefusedHoldNotHeld,
        Self::RefusedCaptureExceedsHold,
        Self::RefusedRefund,
    ];

    /// The kind of `operation` coming to `result`.
    pub fn of(operation: &Operation, result: &OperationResult) -> Self {
        match (operation, result) {
            (Operation::Payout { .. }, OperationResult::Applied { .. }) => Self::PayoutAccepted,
            (_, OperationResult::Applied { .. }) => Self::Executed,
            (_, OperationResult::Refused(Refusal::InsufficientFunds { .. })) => {
                Self::RefusedInsufficientFunds
            }
            (_, OperationResult::Refused(Refusal::InsufficientPoints { .. })) => {
                Self::RefusedInsufficientPoints
            }
            (_, OperationResult::Refused(Refusal::BalanceLimit { .. })) => {
                Self::RefusedBalanceLimit
            }
            (_, OperationResult::Refused(Refusal::OrderAlreadyPaid { .. })) => {
                Self::RefusedOrderAlreadyPaid
            }
            (Operation::Hold { .. }, OperationResult::HoldChanged { .. }) => Self::Held,
            (Operation::Capture { .. }, OperationResult::HoldChanged { .. }) => Self::Captured,
            (_, OperationResult::HoldChanged { .. }) => Self::Voided,
            (_, OperationResult::Refunded { .. }) => Self::Executed,
            (Operation::Refund { .. }, OperationResult::Refused(_))
            | (
                _,
                OperationResult::Refused(
                    Refusal::RefundExceedsPayment { .. } | Refusal::OrderNotPaid,
                ),
            ) => Self::RefusedRefund,
            (_, OperationResult::Refused(Refusal::HoldNotHeld { .. })) => Self::RefusedHoldNotHeld,
            (_, OperationResult::Refused(Refusal::CaptureExceedsHold { .. })) => {
                Self::RefusedCaptureExceedsHold
            }
        }
    }

    /// Whether money or points moved: an outcome of this kind has its entry, any other
    /// none.
    pub fn moved(self) -> bool {
        matches!(self, Self::Executed | Self::PayoutAccepted | Self::Captured)
    }

    /// The HTTP status an outcome of this kind is answered, stored and announced with:
    /// 201 executed, 202 a payout accepted, 402 not enough money or points, 422 a balance
    /// that would overflow, 409 an order paid already; 201 a hold placed, 200 one captured
    /// or voided, 409 one not held, 422 a capture above the hold, 409 a refund refused.
    ///
    /// The one place a kind meets a status. The status is stored with the response (a
    /// replay answers it as stored), so the kind of a stored outcome is read back from it
    /// by [`OutcomeKind::stored`], its inverse, and from nowhere else: the events, the
    /// audit and the API decide by the kind.
    pub fn status(self) -> u16 {
        match self {
            Self::Executed => 201,
            Self::PayoutAccepted => 202,
            Self::RefusedInsufficientFunds | Self::RefusedInsufficientPoints => 402,
            Self::RefusedBalanceLimit => 422,
            Self::RefusedOrderAlreadyPaid => 409,
            Self::Held => 201,
            Self::Captured | Self::Voided => 200,
            Self::RefusedHoldNotHeld | Self::RefusedRefund => 409,
            Self::RefusedCaptureExceedsHold => 422,
        }
    }

    /// Whether an operation of entry kind `operation` can come to this kind. Within one
    /// operation no two kinds share a status, which is what lets [`OutcomeKind::stored`]
    /// tell them apart.
    pub fn can_come_of(self, operation: EntryKind) -> bool {
        use EntryKind as E;
        match self {
            Self::Executed => matches!(
                operation,
                E::Deposit | E::Withdrawal | E::LotteryDraw | E::OrderPayment | E::Refund
            ),
            Self::PayoutAccepted => operation == E::Payout,
            // What takes from the money available: a draw spends points only.
            Self::RefusedInsufficientFunds => {
                matches!(
                    operation,
                    E::Withdrawal | E::OrderPayment | E::Payout | E::Hold
                )
            }
            Self::RefusedInsufficientPoints => operation == E::LotteryDraw,
            // What credits money: a deposit, a draw's prize, a refund.
            Self::RefusedBalanceLimit => {
                matches!(operation, E::Deposit | E::LotteryDraw | E::Refund)
            }
            Self::RefusedOrderAlreadyPaid => operation == E::OrderPayment,
            Self::Held => operation == E::Hold,
            Self::Captured | Self::RefusedCaptureExceedsHold => operation == E::HoldCapture,
            Self::Voided => operation == E::HoldVoid,
            Self::RefusedHoldNotHeld => matches!(operation, E::HoldCapture | E::HoldVoid),
            Self::RefusedRefund => operation == E::Refund,
        }
    }

    /// The kind of an outcome of `operation` stored with `status`; `None` for a pair no
    /// outcome is stored as.
    pub fn stored(operation: EntryKind, status: u16) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.status() == status && kind.can_come_of(operation))
    }

    /// Its name, as the audit's statements spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::PayoutAccepted => "payout_accepted",
            Self::RefusedInsufficientFunds => "refused_insufficient_funds",
            Self::RefusedInsufficientPoints => "refused_insufficient_points",
            Self::RefusedBalanceLimit => "refused_balance_limit",
            Self::RefusedOrderAlreadyPaid => "refused_order_already_paid",
            Self::Held => "held",
            Self::Captured => "captured",
            Self::Voided => "voided",
            Self::RefusedHoldNotHeld => "refused_hold_not_held",
            Self::RefusedCaptureExceedsHold => "refused_capture_exceeds_hold",
            Self::RefusedRefund => "refused_refund",
        }
    }
}

/// Everything a renderer needs to build the response body stored under the ticket.
#[derive(Clone, Copy, Debug)]
pub struct Execution<'a> {
    /// The ticket used.
    pub ticket_id: TicketId,
    /// The account.
    pub account_id: AccountId,
    /// What was asked.
    pub operation: &'a Operation,
    /// What happened.
    pub result: &'a OperationResult,
}

impl Execution<'_> {
    /// What kind of outcome this is.
    pub fn kind(&self) -> OutcomeKind {
        OutcomeKind::of(self.operation, self.result)
    }
}

/// Builds the JSON body stored (and replayed) for an execution. The ledger decides the
/// outcome's kind ([`Execution::kind`]), and with it the status ([`OutcomeKind::status`]);
/// the caller decides the body's shape.
pub type Renderer = dyn Fn(&Execution<'_>) -> Value + Send + Sync;

/// The answer to `apply`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// What kind of outcome it is.
    pub kind: OutcomeKind,
    /// The stored response.
    pub response: StoredResponse,
    /// True when the ticket had already been used and this is its stored outcome.
    pub replayed: bool,
}

/// A request to apply one operation under one ticket.
#[derive(Clone, Copy, Debug)]
pub struct ApplyRequest<'a> {
    /// The ticket to spend.
    pub ticket_id: TicketId,
    /// The account the request was authenticated for.
    pub account_id: AccountId,
    /// What to do.
    pub operation: Operation,
    /// Identifies the request (method, path, canonical body); a repeat with another
    /// fingerprint is refused.
    pub fingerprint: &'a str,
    /// The fencing token of the lock the caller holds on the account.
    pub fencing_token: u64,
}

impl ApplyRequest<'_> {
    /// What the renderer is given when this request came to `result`.
    pub(crate) fn execution<'r>(&'r self, result: &'r OperationResult) -> Execution<'r> {
        Execution {
            ticket_id: self.ticket_id,
            account_id: self.account_id,
            operation: &self.operation,
            result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_outcome_reads_back_as_the_kind_it_was_stored_as() {
        let spent_on = [
            EntryKind::Withdrawal,
            EntryKind::Deposit,
            EntryKind::LotteryDraw,
            EntryKind::OrderPayment,
            EntryKind::Payout,
            EntryKind::Hold,
            EntryKind::HoldCapture,
            EntryKind::HoldVoid,
            EntryKind::Refund,
        ];
        for operation in spent_on {
            for kind in OutcomeKind::ALL {
                let read_back = OutcomeKind::stored(operation, kind.status());
                if kind.can_come_of(operation) {
                    assert_eq!(read_back, Some(kind), "{operation:?}");
                } else {
                    assert_ne!(read_back, Some(kind), "{operation:?}");
                }
            }
        }
        assert_eq!(OutcomeKind::stored(EntryKind::Withdrawal, 200), None);
    }

    #[test]
    fn a_payouts_success_is_its_acceptance_and_only_it_executions_and_captures_moved_money() {
        let amount = Amount::new(5).unwrap();
        let applied = OperationResult::Applied {
            balance: 0,
            points: 0,
            credit: 0,
            prize: None,
        };
        let payout = Operation::Payout {
            payout: PayoutId::random(),
            amount,
            destination: Destination::new("a1").unwrap(),
        };
        assert_eq!(
            OutcomeKind::of(&payout, &applied),
            OutcomeKind::PayoutAccepted
        );
        assert_eq!(
            OutcomeKind::of(&Operation::Withdrawal(amount), &applied),
            OutcomeKind::Executed
        );
        let moved: Vec<_> = OutcomeKind::ALL
            .into_iter()
            .filter(|kind| kind.moved())
            .collect();
        assert_eq!(
            moved,
            [
                OutcomeKind::Executed,
                OutcomeKind::PayoutAccepted,
                OutcomeKind::Captured
            ],
            "a hold placed or voided moves no money"
        );
    }
}
