//! What the load test saw: every account it opened, every ticket request and every spend
//! attempt it sent, with the answer. The auditor judges this record against the final
//! state of the ledger.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An account the run opened.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AccountRecord {
    /// Its id.
    pub id: String,
    /// Its API key (never written to the report).
    #[serde(skip_serializing, default)]
    pub key: String,
    /// The balance it was opened with.
    pub opening_balance: i64,
    /// The points it was opened with.
    pub opening_points: i64,
}

/// What a spend does.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum SpendKind {
    /// `POST …/withdrawals`; the amount is money.
    Withdrawal,
    /// `POST …/deposits`; the amount is money.
    Deposit,
    /// `POST …/lottery-draws`; the amount is points.
    LotteryDraw,
    /// `POST /v1/orders/{order}/payments`; the amount is the order's.
    OrderPayment,
    /// `POST …/payouts`; the amount is money, sent on to the bank after the answer.
    Payout,
    /// `POST …/holds`; the amount is money set aside, none moved.
    Hold,
    /// `POST /v1/holds/{hold}/capture`; the amount is the part captured.
    Capture,
    /// `POST /v1/holds/{hold}/void`; no amount (0).
    Void,
    /// `POST /v1/orders/{order}/refunds` or `/v1/holds/{hold}/refunds`; the amount is money
    /// back.
    Refund,
}

impl SpendKind {
    /// The status of an answer that executed it (and of its replays): 202 for a payout,
    /// which the bank has yet to carry out, 201 for everything else.
    pub fn executed_status(self) -> u16 {
        match self {
            Self::Payout => 202,
            Self::Capture | Self::Void => 200,
            _ => 201,
        }
    }

    /// The entry kind the ledger writes for it; none for what moves no money (a hold, a
    /// void).
    pub fn entry_kind(self) -> Option<&'static str> {
        match self {
            Self::Withdrawal => Some("withdrawal"),
            Self::Deposit => Some("deposit"),
            Self::LotteryDraw => Some("lottery_draw"),
            Self::OrderPayment => Some("order_payment"),
            Self::Payout => Some("payout"),
            Self::Capture => Some("hold_capture"),
            Self::Refund => Some("refund"),
            Self::Hold | Self::Void => None,
        }
    }
}

/// The account at the bank every payout of a run goes to.
pub const DESTINATION: &str = "loadtest:destination";

/// Why an attempt was sent.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The first send.
    Original,
    /// The same request, sent at the same time (to another target when there are several).
    ConcurrentDuplicate,
    /// The same request, sent again after the original was answered.
    LateDuplicate,
    /// The same ticket with another amount, after the original was answered: must be 422.
    ChangedDuplicate,
    /// The same request once more after the load, for every ticket whose outcome a client
    /// was given: it must replay that outcome (an acknowledged outcome the ledger lost
    /// would execute again, or find no ticket).
    Recheck,
}

/// One HTTP request of a spend, and its answer. A logical request — one [`Role`] of one
/// ticket — is sent once, or again after a transient answer when the run retries
/// ([`RetryPolicy`](crate::retry::RetryPolicy)); every send is an `Attempt`, numbered.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Attempt {
    /// Why it was sent: which logical request of the ticket this is.
    pub role: Role,
    /// Which send of that request: 1 for the first, 2 for the first retry, and so on.
    #[serde(default = "first")]
    pub attempt: u32,
    /// Which target (index into the run's targets).
    pub target: usize,
    /// The amount (or points) in its body.
    pub amount: i64,
    /// The HTTP status; `None` when no answer came (a transport error).
    pub status: Option<u16>,
    /// Whether it carried `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// The JSON body of the answer.
    pub body: Option<Value>,
    /// Milliseconds since the run started, when it was sent.
    pub sent_at_ms: u64,
    /// How long the answer took, µs.
    pub latency_us: u64,
    /// The transport error, if any.
    pub error: Option<String>,
    /// The answer's `Retry-After`, in seconds: how long the client waited before resending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

/// The first attempt's number, for histories recorded before attempts were numbered.
fn first() -> u32 {
    1
}

impl Attempt {
    /// The `type` of a problem+json body, if it is one.
    pub fn problem(&self) -> Option<&str> {
        self.body.as_ref()?.get("type")?.as_str()
    }

    /// Whether it was answered 503 `payouts-unavailable`: the target was started without a
    /// bank, and refuses every payout until it is given one.
    pub fn payouts_unavailable(&self) -> bool {
        self.status == Some(503)
            && self
                .problem()
                .is_some_and(|kind| kind.ends_with("/payouts-unavailable"))
    }
}

/// One `POST /v1/accounts/{id}/tickets`, and its answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TicketAttempt {
    /// The account the ticket was asked for.
    pub account: String,
    /// Which send of this ticket request: 1 for the first, 2 for the first retry, and so on.
    #[serde(default = "first")]
    pub attempt: u32,
    /// Which target (index into the run's targets).
    pub target: usize,
    /// The HTTP status; `None` when no answer came (a transport error).
    pub status: Option<u16>,
    /// The ticket it issued (a 201 with a `ticket_id`).
    pub ticket: Option<String>,
    /// The JSON body of an answer other than 201 (kept for the audit's report).
    pub body: Option<Value>,
    /// Milliseconds since the run started, when it was sent.
    pub sent_at_ms: u64,
    /// How long the answer took, µs.
    pub latency_us: u64,
    /// The transport error (or unreadable body), if any.
    pub error: Option<String>,
    /// The answer's `Retry-After`, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl TicketAttempt {
    /// The `type` of a problem+json body, if it is one.
    pub fn problem(&self) -> Option<&str> {
        self.body.as_ref()?.get("type")?.as_str()
    }
}

/// One ticket and every attempt sent with it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SpendRecord {
    /// The ticket.
    pub ticket: String,
    /// The account.
    pub account: String,
    /// What it does.
    pub kind: SpendKind,
    /// The amount of the original request.
    pub amount: i64,
    /// The order an order payment pays, or an order's refund gives back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
    /// The hold a capture, a void or a hold's refund acts on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
    /// A hold's lifetime as asked, seconds (its requests carry it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in: Option<i64>,
    /// Every request sent with this ticket: each logical request's attempts in the order
    /// they were sent (those of concurrent requests are not interleaved).
    pub attempts: Vec<Attempt>,
}

impl SpendRecord {
    /// The last attempt of each logical request (each role), in the order they appear:
    /// the answer each request ended with.
    pub fn final_attempts(&self) -> impl Iterator<Item = &Attempt> {
        self.attempts
            .iter()
            .enumerate()
            .filter_map(|(index, attempt)| {
                let later = self.attempts[index + 1..]
                    .iter()
                    .any(|other| other.role == attempt.role);
                (!later).then_some(attempt)
            })
    }
}

/// Everything the run sent and received.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct History {
    /// The targets, in the order attempts index them.
    pub targets: Vec<String>,
    /// The accounts opened.
    pub accounts: Vec<AccountRecord>,
    /// Every ticket request, answered or not.
    #[serde(default)]
    pub tickets: Vec<TicketAttempt>,
    /// The spends.
    pub spends: Vec<SpendRecord>,
}

/// One ledger entry, as `GET /v1/accounts/{id}/entries` shows it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct EntryRecord {
    /// Its id.
    pub id: i64,
    /// The ticket that wrote it; `None` for the opening entry.
    pub ticket_id: Option<String>,
    /// `opening`, `deposit`, `withdrawal`, `lottery_draw`, `order_payment`, `payout`,
    /// `payout_reversal`, `hold_capture` or `refund`.
    pub kind: String,
    /// The order an `order_payment` paid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_id: Option<String>,
    /// The payout a `payout` or `payout_reversal` belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payout_id: Option<String>,
    /// Signed change to the balance.
    pub amount: i64,
    /// Signed change to the points.
    pub points: i64,
    /// The balance after.
    pub balance_after: i64,
    /// The points after.
    pub points_after: i64,
}

/// An account at the end of the run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct AccountState {
    /// Its balance.
    pub balance: i64,
    /// Its points.
    pub points: i64,
    /// The balance less the holds held and not expired, as the ledger answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<i64>,
    /// All its entries, oldest first.
    pub entries: Vec<EntryRecord>,
}

/// A hold the run placed, as `GET /v1/holds/{id}` shows it after the run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct HoldRead {
    /// The account it sets money aside on.
    pub account: String,
    /// The ticket that placed it (the run's; the hold does not show it).
    pub ticket: String,
    /// Minor units held.
    pub amount: i64,
    /// `held`, `captured`, `voided` or `expired`.
    pub state: String,
    /// What a capture took.
    pub captured_amount: Option<i64>,
    /// What its refunds gave back.
    pub refunded_amount: i64,
}

/// A ticket as `GET /v1/tickets/{id}` shows it, read for every ticket of the run: for one
/// the run never got a definitive answer for (every attempt was 409, 429, 503 or lost) its
/// stored outcome decides; for the others it must be the outcome the clients were given.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TicketState {
    /// `issued`, `completed` or `expired`; [`TicketState::MISSING`] when the ledger does
    /// not know the ticket (404).
    pub state: String,
    /// The stored status, once completed.
    pub status: Option<u16>,
    /// The stored body, once completed.
    pub body: Option<Value>,
}

impl TicketState {
    /// The state of a ticket the ledger does not know: one it issued and lost.
    pub const MISSING: &str = "missing";

    /// A ticket the ledger answered 404 for.
    pub fn missing() -> Self {
        Self {
            state: Self::MISSING.to_owned(),
            status: None,
            body: None,
        }
    }
}

/// The ledger at the end of the run, read through the API.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FinalState {
    /// By account id.
    pub accounts: HashMap<String, AccountState>,
    /// Accounts opened during the run (answered 201) that the ledger no longer knows —
    /// their reads answered 401 or 404: lost with everything done on them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_accounts: Vec<String>,
    /// By ticket id, every ticket of the run's spends.
    pub tickets: HashMap<String, TicketState>,
    /// By payout id: every payout of the run's accounts, after the queue drained (or the
    /// drain gave up).
    #[serde(default)]
    pub payouts: HashMap<String, PayoutState>,
    /// What the bank holds for the run's payouts, when the run was given the bank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bank: Option<Vec<BankTransfer>>,
    /// By hold id: every hold the run placed (answered or stored 201).
    #[serde(default)]
    pub holds: HashMap<String, HoldRead>,
    /// What the run's webhook receiver got, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhooks: Option<Vec<crate::receiver::Receipt>>,
}

/// A payout as `GET /v1/payouts` shows it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PayoutState {
    /// Its id.
    pub payout_id: String,
    /// The account it left.
    pub account_id: String,
    /// The ticket that sent it.
    pub ticket_id: String,
    /// Minor units.
    pub amount: i64,
    /// Where it stands.
    pub status: PayoutStatus,
    /// The key every call to the bank carried.
    pub bank_key: String,
    /// The bank's transfer, once succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bank_transfer_id: Option<String>,
    /// Calls made to the bank.
    pub attempts: u32,
}

/// A payout's status, as the contract names them.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PayoutStatus {
    /// The money left the account; the bank has not given its word yet.
    Pending,
    /// The bank made the transfer.
    Succeeded,
    /// The bank refused for good; the money came back.
    Failed,
}

impl PayoutStatus {
    /// Its name in the contract (and in `GET /v1/payouts?status=`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }
}

/// A transfer's state at the bank.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TransferState {
    /// The money moved.
    Executed,
    /// Refused for good; nothing moved.
    Declined,
}

/// A transfer at the bank that names one of the run's payouts as its reference.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BankTransfer {
    /// The bank's id.
    pub id: i64,
    /// The key it was sent with.
    pub idempotency_key: String,
    /// Whether the money moved.
    pub state: TransferState,
    /// Minor units.
    pub amount: i64,
    /// The payout it was for.
    pub reference: String,
}
