//! Webhooks as the ledger holds them: events, the endpoints that want them, and the
//! deliveries between the two.
//!
//! An [`Event`] is written in the transaction of the outcome it announces — a spend's
//! stored outcome (`apply.rs`, and the group commit's statement in `batch.rs`), a payout's
//! settlement (`outbox.rs`) — so an event exists exactly when its outcome committed, and a
//! replay, which commits nothing, writes none. In the same transaction the event is queued
//! for each of its account's live endpoints that subscribes to its type: an outbox job of
//! kind `webhook` (a [`DeliveryJob`] once claimed), leased and fenced by its attempts like
//! a payout's. `events.rs` holds the statements.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::db_types::identifier;
use crate::model::{AccountId, EntryKind, OutcomeKind, TicketId};

/// The most endpoints an account may have at once.
pub const MAX_ENDPOINTS_PER_ACCOUNT: usize = 16;

/// The longest endpoint URL, in characters: short enough that any URL, however escaped in
/// its JSON, leaves the request under the API's 16 KiB body limit.
pub const MAX_URL: usize = 1024;

/// What happened, as an event names it: the contract's own type (`payonce-types`), so
/// the names the ledger stores are the names the API documents.
pub use payonce_types::webhooks::EventType;

/// The event a spend's outcome announces, if any: an operation of entry kind `operation`
/// that came to `outcome`. A payout's acceptance announces nothing: its settlement does.
pub fn event_of_outcome(operation: EntryKind, outcome: OutcomeKind) -> Option<EventType> {
    match (operation, outcome) {
        (EntryKind::Withdrawal, OutcomeKind::Executed) => Some(EventType::WithdrawalSucceeded),
        (EntryKind::Withdrawal, OutcomeKind::RefusedInsufficientFunds) => {
            Some(EventType::WithdrawalRefused)
        }
        (EntryKind::LotteryDraw, OutcomeKind::Executed) => Some(EventType::LotteryDrawn),
        (EntryKind::OrderPayment, OutcomeKind::Executed) => Some(EventType::OrderPaid),
        (EntryKind::HoldCapture, OutcomeKind::Captured) => Some(EventType::HoldCaptured),
        (EntryKind::HoldVoid, OutcomeKind::Voided) => Some(EventType::HoldVoided),
        (EntryKind::Refund, OutcomeKind::Executed) => Some(EventType::RefundSucceeded),
        _ => None,
    }
}

/// Which events an endpoint wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subscription {
    /// Every type, those added later included.
    All,
    /// These, sorted, without repeats, at least one.
    Only(Vec<EventType>),
}

impl Subscription {
    /// The types given, or every type for none given.
    pub fn of(types: Option<Vec<EventType>>) -> Self {
        match types {
            None => Self::All,
            Some(mut types) => {
                types.sort();
                types.dedup();
                Self::Only(types)
            }
        }
    }

    /// The names as stored: space-separated, `*` for all.
    pub(crate) fn stored(&self) -> String {
        match self {
            Self::All => "*".to_owned(),
            Self::Only(types) => types
                .iter()
                .map(|kind| kind.as_str())
                .collect::<Vec<_>>()
                .join(" "),
        }
    }

    /// The rows of `webhook_subscriptions`: one per name.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        match self {
            Self::All => vec!["*"],
            Self::Only(types) => types.iter().map(|kind| kind.as_str()).collect(),
        }
    }

    pub(crate) fn parse_stored(stored: &str) -> Option<Self> {
        if stored == "*" {
            return Some(Self::All);
        }
        stored
            .split(' ')
            .map(EventType::parse)
            .collect::<Option<Vec<_>>>()
            .map(|types| Self::of(Some(types)))
    }

    /// Whether it wants events of `kind`.
    pub fn wants(&self, kind: EventType) -> bool {
        match self {
            Self::All => true,
            Self::Only(types) => types.contains(&kind),
        }
    }
}

identifier! {
    /// An endpoint's identifier.
    pub struct EndpointId;
}

identifier! {
    /// An event's identifier: the `webhook-id` of every delivery of it, on every attempt —
    /// the receiver's key for dropping a repeat.
    pub struct EventId;
}

/// An endpoint to create; its secret is sealed by the caller, who alone holds the key.
#[derive(Clone, Debug)]
pub struct NewEndpoint {
    /// Its id, chosen beforehand.
    pub id: EndpointId,
    /// Whose events it gets.
    pub account_id: AccountId,
    /// Where they are sent (checked by the caller).
    pub url: String,
    /// Which.
    pub subscription: Subscription,
    /// The signing secret, sealed.
    pub secret_sealed: Vec<u8>,
}

/// An endpoint as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Its id.
    pub id: EndpointId,
    /// Whose events it gets.
    pub account_id: AccountId,
    /// Where they are sent.
    pub url: String,
    /// Which.
    pub subscription: Subscription,
    /// The signing secret, sealed.
    pub secret_sealed: Vec<u8>,
    /// During a rotation, the secret before, sealed, and until when it signs too.
    pub previous_secret: Option<(Vec<u8>, OffsetDateTime)>,
    /// When and why it stopped getting events (its receiver answered 410).
    pub disabled: Option<(OffsetDateTime, String)>,
    /// When it was made.
    pub created_at: OffsetDateTime,
}

/// An event: a committed outcome, announced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Its id.
    pub id: EventId,
    /// The account it happened to.
    pub account_id: AccountId,
    /// What happened.
    pub event_type: EventType,
    /// The ticket of the request it came of.
    pub ticket_id: TicketId,
    /// The `data` object, as JSON text.
    pub data: String,
    /// When its outcome committed, by the database's clock.
    pub created_at: OffsetDateTime,
}

impl Event {
    /// The body every delivery of it sends, byte for byte the same on every attempt:
    /// `{"type": …, "timestamp": …, "data": …}`, as the Standard Webhooks specification
    /// suggests.
    pub fn payload(&self) -> String {
        let timestamp = self
            .created_at
            .format(&Rfc3339)
            .unwrap_or_else(|_| self.created_at.unix_timestamp().to_string());
        format!(
            r#"{{"type":"{}","timestamp":"{timestamp}","data":{}}}"#,
            self.event_type, self.data
        )
    }
}

/// The `data` of an event that announces a spend's stored outcome: the account, the
/// ticket, and the outcome as the ticket stores it (`status`, `body`). The group commit's
/// statement (`batch.rs`) builds the same text in SQL.
pub(crate) fn outcome_data(
    account: AccountId,
    ticket: TicketId,
    status: u16,
    body: &str,
) -> String {
    format!(
        r#"{{"account_id":"{account}","ticket_id":"{ticket}","outcome":{{"status":{status},"body":{body}}}}}"#,
        account = account.0,
        ticket = ticket.0,
    )
}

/// The `data` of a hold's expiry event: the account, the ticket that placed the hold, and
/// the hold as the API shows it (`hold`, rendered by the caller).
pub(crate) fn hold_data(account: AccountId, ticket: TicketId, hold: &str) -> String {
    format!(
        r#"{{"account_id":"{account}","ticket_id":"{ticket}","hold":{hold}}}"#,
        account = account.0,
        ticket = ticket.0,
    )
}

/// The `data` of a payout's settlement event: the account, the payout's ticket, and the
/// payout as the API shows it (`payout`, rendered by the caller).
pub(crate) fn payout_data(account: AccountId, ticket: TicketId, payout: &str) -> String {
    format!(
        r#"{{"account_id":"{account}","ticket_id":"{ticket}","payout":{payout}}}"#,
        account = account.0,
        ticket = ticket.0,
    )
}

/// A delivery claimed by one worker until `lease_until`: as a payout's job, recorded only
/// at the attempt it was claimed at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryJob {
    /// The outbox row: the delivery's id.
    pub job_id: i64,
    /// This claim's number: 1 for the first.
    pub attempt: u32,
    /// Until when the claim is this worker's.
    pub lease_until: OffsetDateTime,
    /// What to send.
    pub event: Event,
    /// Where.
    pub endpoint: Endpoint,
}

/// One attempt's answer, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptAnswer {
    /// How long the attempt took.
    pub duration: Duration,
    /// The receiver's status; `None` when no answer came.
    pub status: Option<u16>,
    /// What went wrong; `None` for a 2xx.
    pub error: Option<String>,
    /// The start of the answer's body.
    pub body: Option<String>,
}

/// What comes of a delivery after an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// The receiver took it (2xx).
    Delivered,
    /// Another attempt, `after` from now.
    Retry {
        /// How long until then.
        after: Duration,
    },
    /// The schedule ran out: no more attempts unless someone asks for one.
    Exhausted,
    /// The receiver said it is gone for good (410): the endpoint is disabled, and its
    /// other deliveries end with it.
    EndpointGone,
}

/// How a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryStatus {
    /// Not delivered yet; attempts go on.
    #[serde(rename = "pending")]
    Pending,
    /// The receiver took it.
    #[serde(rename = "delivered")]
    Delivered,
    /// Every scheduled attempt failed.
    #[serde(rename = "exhausted")]
    Exhausted,
    /// Its endpoint was disabled (a 410) before it was delivered.
    #[serde(rename = "endpoint-disabled")]
    EndpointDisabled,
    /// Its endpoint was deleted before it was delivered.
    #[serde(rename = "endpoint-deleted")]
    EndpointDeleted,
}

impl DeliveryStatus {
    /// Every status.
    pub const ALL: [Self; 5] = [
        Self::Pending,
        Self::Delivered,
        Self::Exhausted,
        Self::EndpointDisabled,
        Self::EndpointDeleted,
    ];

    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Exhausted => "exhausted",
            Self::EndpointDisabled => "endpoint-disabled",
            Self::EndpointDeleted => "endpoint-deleted",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == name)
    }
}

/// One attempt, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// Its number: 1 for the first.
    pub attempt: u32,
    /// When its answer was recorded.
    pub recorded_at: OffsetDateTime,
    /// The answer.
    pub answer: AttemptAnswer,
}

/// A delivery of one event to one endpoint, with its attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Its id.
    pub id: i64,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The event.
    pub event: Event,
    /// How it stands.
    pub status: DeliveryStatus,
    /// When the next attempt is due, while pending.
    pub next_attempt_at: Option<OffsetDateTime>,
    /// Every attempt recorded, first first.
    pub attempts: Vec<Attempt>,
}

/// Why a delivery cannot be sent again by hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryRefused {
    /// No such delivery of that endpoint.
    NotFound,
    /// A worker holds it right now.
    InFlight,
    /// Its endpoint no longer gets events.
    EndpointDisabled,
}

/// Deliveries not done yet, for the metrics: how many, and the oldest one's event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WebhookBacklog {
    /// Deliveries pending.
    pub pending: u64,
    /// When the oldest pending delivery's event committed.
    pub oldest_pending: Option<OffsetDateTime>,
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    #[test]
    fn types_read_back_by_name_and_only_executions_and_refusals_announce() {
        for kind in EventType::ALL {
            assert_eq!(EventType::parse(kind.as_str()), Some(kind));
            assert_eq!(
                serde_json::to_string(&kind).unwrap(),
                format!("\"{}\"", kind.as_str())
            );
        }
        assert_eq!(
            event_of_outcome(EntryKind::Withdrawal, OutcomeKind::RefusedInsufficientFunds),
            Some(EventType::WithdrawalRefused)
        );
        assert_eq!(
            event_of_outcome(EntryKind::Payout, OutcomeKind::PayoutAccepted),
            None
        );
        assert_eq!(
            event_of_outcome(EntryKind::Deposit, OutcomeKind::Executed),
            None
        );
        assert_eq!(
            event_of_outcome(
                EntryKind::LotteryDraw,
                OutcomeKind::RefusedInsufficientPoints
            ),
            None
        );
        assert_eq!(
            event_of_outcome(
                EntryKind::OrderPayment,
                OutcomeKind::RefusedOrderAlreadyPaid
            ),
            None
        );
    }

    #[test]
    fn subscriptions_store_sorted_and_read_back() {
        let some = Subscription::of(Some(vec![
            EventType::PayoutFailed,
            EventType::OrderPaid,
            EventType::PayoutFailed,
        ]));
        assert_eq!(some.stored(), "order.paid payout.failed");
        assert_eq!(
            Subscription::parse_stored(&some.stored()),
            Some(some.clone())
        );
        assert!(some.wants(EventType::OrderPaid) && !some.wants(EventType::LotteryDrawn));
        assert_eq!(Subscription::parse_stored("*"), Some(Subscription::All));
        assert_eq!(Subscription::parse_stored("order.paid nonsense"), None);
    }

    #[test]
    fn the_payload_is_the_envelope_around_the_data_and_parses() {
        let event = Event {
            id: EventId::random(),
            account_id: AccountId(Uuid::nil()),
            event_type: EventType::WithdrawalSucceeded,
            ticket_id: TicketId(Uuid::nil()),
            data: outcome_data(
                AccountId(Uuid::nil()),
                TicketId(Uuid::nil()),
                201,
                r#"{"a":1}"#,
            ),
            created_at: OffsetDateTime::UNIX_EPOCH,
        };
        let parsed: serde_json::Value = serde_json::from_str(&event.payload()).unwrap();
        assert_eq!(parsed["type"], "withdrawal.succeeded");
        assert_eq!(parsed["timestamp"], "1970-01-01T00:00:00Z");
        assert_eq!(parsed["data"]["outcome"]["status"], 201);
        assert_eq!(parsed["data"]["outcome"]["body"]["a"], 1);
        assert_eq!(parsed["data"]["ticket_id"], Uuid::nil().to_string());
    }
}
