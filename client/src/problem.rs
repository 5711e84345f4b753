//! The problems payonce answers (RFC 9457 `application/problem+json`), read into an enum
//! with their fields rather than left as strings.

use std::time::Duration;

use payonce_types::holds::HoldState;
use serde_json::{Map, Value};
use uuid::Uuid;

/// A problem document: what the server answered instead of an outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    /// Which problem, with its own fields.
    pub kind: ProblemKind,
    /// The HTTP status.
    pub status: u16,
    /// Short, the same for every occurrence of the kind.
    pub title: String,
    /// What happened this time.
    pub detail: String,
    /// The ticket, on a refusal stored under it.
    pub ticket_id: Option<Uuid>,
    /// The account, on a refusal stored under a ticket.
    pub account_id: Option<Uuid>,
    /// The answer's `Retry-After`, when it had one.
    pub retry_after: Option<Duration>,
}

/// The problem types of payonce's contract (`/problems/<name>`), each with the fields its
/// body carries. A type this client does not know yet is [`ProblemKind::Other`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// 402: the balance does not cover the spend: the balance, what the spend asked for
    /// (where the body says), and the order for an order payment.
    InsufficientFunds {
        balance: i64,
        amount: Option<i64>,
        order_id: Option<Uuid>,
    },
    /// 402: the points do not cover the draw.
    InsufficientPoints {
        points: i64,
        points_needed: Option<i64>,
    },
    /// 409: the order was paid already, by another ticket.
    OrderAlreadyPaid {
        paid_by_ticket: Uuid,
        order_id: Option<Uuid>,
    },
    /// 409: the hold is not held — captured, voided or expired, as `state` says — so it
    /// cannot be captured or voided (or, unless captured, refunded).
    HoldNotHeld { state: Option<HoldState> },
    /// 422: the capture asks for more than the hold sets aside (`held`).
    CaptureExceedsHold { held: i64 },
    /// 409: the refund asks for more than is still refundable of the payment.
    RefundExceedsPayment { refundable: i64 },
    /// 409: the order is not paid: nothing to refund.
    OrderNotPaid,
    /// 422: the balance cannot grow by this much.
    BalanceLimit { balance: i64 },
    /// 422: this ticket was used for a different request.
    IdempotencyKeyReuse,
    /// 400: a spend without a ticket.
    IdempotencyKeyMissing,
    /// 400: the `Idempotency-Key` is not a ticket id.
    IdempotencyKeyInvalid,
    /// 409: the request with this ticket is still executing; resend it.
    RequestInProgress,
    /// 409: the account is busy with other requests; resend it.
    AccountBusy,
    /// 429: over a rate limit; resend after `Retry-After`.
    RateLimited,
    /// 410: the ticket expired unused.
    TicketExpired,
    /// 410: the outcome was used so long ago it is no longer kept.
    OutcomeExpired,
    /// 404: no such ticket for this account.
    TicketNotFound,
    /// 404: no such account.
    NotFound,
    /// 404: no such order.
    OrderNotFound,
    /// 404: no such payout.
    PayoutNotFound,
    /// 404: no such hold of this account.
    HoldNotFound,
    /// 401: no key, or not a key of this service.
    Unauthenticated,
    /// 403: another account's key.
    Forbidden,
    /// 403: creating money needs the operator's key.
    OperatorKeyRequired,
    /// 422: the body breaks a rule of the contract.
    InvalidRequest,
    /// 400: the body is not JSON.
    MalformedJson,
    /// 400: a malformed path or query.
    BadRequest,
    /// 413: the body is too large.
    PayloadTooLarge,
    /// 415: not `application/json`.
    UnsupportedMediaType,
    /// 503: the commit's outcome is unknown — it may have happened. Ask the ticket.
    OutcomeUnknown,
    /// 503: the lock was lost before the write; nothing was stored.
    LockLost,
    /// 503: the lock service did not answer; nothing was stored.
    LockStoreUnavailable,
    /// 503: the database did not answer; nothing was stored.
    DatabaseUnavailable,
    /// 503: the instance is at its limit of requests in flight.
    Overloaded,
    /// 503: the request took longer than the server allows.
    Timeout,
    /// 503: this instance has no bank to pay out to (a distributed instance without
    /// `PAYONCE_BANK_URL`). Nothing was stored; the ticket is still usable. Not resent: it
    /// is the instance's configuration, and every resend would get it again.
    PayoutsUnavailable,
    /// 503: the bank did not answer.
    BankUnavailable,
    /// 422: the webhook URL is one the server will not call.
    WebhookUrlRefused,
    /// 422: the account has as many webhook endpoints as it may.
    WebhookEndpointLimit,
    /// 404: no such webhook endpoint of this account.
    WebhookEndpointNotFound,
    /// 409: the endpoint is disabled (its receiver answered 410 Gone).
    WebhookEndpointDisabled,
    /// 404: no such delivery.
    DeliveryNotFound,
    /// 409: a worker is sending this delivery right now.
    DeliveryInFlight,
    /// 503: this instance sends no webhooks. Not resent: like `PayoutsUnavailable`, it is
    /// the instance's configuration.
    WebhooksUnavailable,
    /// 405: the path does not take this method.
    MethodNotAllowed,
    /// 503: the instance's database or lock store does not answer (readiness).
    NotReady,
    /// 500: a bug on the server; nothing is known to be stored.
    InternalError,
    /// 400: a bank fault the demonstration does not know (`Payonce-Bank-Fault`).
    BankFaultUnknown,
    /// 422: a bank fault asked of an instance whose bank is not in its process.
    BankFaultRefused,
    /// A problem type this client does not know, with its name and extra fields.
    Other {
        name: String,
        fields: Map<String, Value>,
    },
}

impl Problem {
    /// Reads a problem body answered with `status`; `None` if it is not one.
    pub fn from_body(status: u16, body: &Value, retry_after: Option<Duration>) -> Option<Self> {
        let object = body.as_object()?;
        let name = object.get("type")?.as_str()?.strip_prefix("/problems/")?;
        let kind = kind_with_fields(name, object)
            .or_else(|| kind_without_fields(name))
            .unwrap_or_else(|| other(name, object));
        Some(Self {
            kind,
            status,
            title: text(object, "title"),
            detail: text(object, "detail"),
            ticket_id: id(object, "ticket_id"),
            account_id: id(object, "account_id"),
            retry_after,
        })
    }

    /// Whether the server stored nothing and the same request may be sent again with the
    /// same ticket: 409 `request-in-progress` or `account-busy`, 429, and every 503 but
    /// `outcome-unknown` (which [`crate::Intent::send`] reports instead),
    /// `payouts-unavailable` and `webhooks-unavailable`.
    ///
    /// A 503 is resent because it says the instance cannot serve *now* — a store down, the
    /// lock lost, too busy — which passes. `payouts-unavailable` does not pass: it says the
    /// instance was started without a bank, and it answers so until its operator restarts
    /// it with one (`webhooks-unavailable` likewise, of an instance without webhooks). Resending it would only hold the caller up for the whole backoff (a
    /// load test's clients stalled on it, their other spends waiting behind), so it is
    /// final, a refusal like a 4xx: nothing was stored and the ticket is still usable.
    pub fn is_resendable(&self) -> bool {
        match self.kind {
            ProblemKind::OutcomeUnknown
            | ProblemKind::PayoutsUnavailable
            | ProblemKind::WebhooksUnavailable => false,
            ProblemKind::RequestInProgress | ProblemKind::AccountBusy => true,
            _ => matches!(self.status, 429 | 503),
        }
    }
}

/// The kind of a problem type that carries fields of its own; `None` for the others.
fn kind_with_fields(name: &str, object: &Map<String, Value>) -> Option<ProblemKind> {
    let int = |key: &str| object.get(key).and_then(Value::as_i64);
    Some(match name {
        "insufficient-funds" => ProblemKind::InsufficientFunds {
            balance: int("balance").unwrap_or_default(),
            amount: int("amount"),
            order_id: id(object, "order_id"),
        },
        "insufficient-points" => ProblemKind::InsufficientPoints {
            points: int("points").unwrap_or_default(),
            points_needed: int("points_needed"),
        },
        "order-already-paid" => match id(object, "paid_by_ticket") {
            Some(paid_by_ticket) => ProblemKind::OrderAlreadyPaid {
                paid_by_ticket,
                order_id: id(object, "order_id"),
            },
            None => other(name, object),
        },
        "balance-limit" => ProblemKind::BalanceLimit {
            balance: int("balance").unwrap_or_default(),
        },
        "hold-not-held" => ProblemKind::HoldNotHeld {
            state: object
                .get("state")
                .and_then(|state| serde_json::from_value(state.clone()).ok()),
        },
        "capture-exceeds-hold" => ProblemKind::CaptureExceedsHold {
            held: int("held").unwrap_or_default(),
        },
        "refund-exceeds-payment" => ProblemKind::RefundExceedsPayment {
            refundable: int("refundable").unwrap_or_default(),
        },
        _ => return None,
    })
}

/// The kind of a problem type that is its name alone; `None` for a name not among them.
fn kind_without_fields(name: &str) -> Option<ProblemKind> {
    Some(match name {
        "idempotency-key-reuse" => ProblemKind::IdempotencyKeyReuse,
        "idempotency-key-missing" => ProblemKind::IdempotencyKeyMissing,
        "idempotency-key-invalid" => ProblemKind::IdempotencyKeyInvalid,
        "request-in-progress" => ProblemKind::RequestInProgress,
        "account-busy" => ProblemKind::AccountBusy,
        "rate-limited" => ProblemKind::RateLimited,
        "ticket-expired" => ProblemKind::TicketExpired,
        "outcome-expired" => ProblemKind::OutcomeExpired,
        "ticket-not-found" => ProblemKind::TicketNotFound,
        "not-found" => ProblemKind::NotFound,
        "order-not-found" => ProblemKind::OrderNotFound,
        "payout-not-found" => ProblemKind::PayoutNotFound,
        "hold-not-found" => ProblemKind::HoldNotFound,
        "order-not-paid" => ProblemKind::OrderNotPaid,
        "unauthenticated" => ProblemKind::Unauthenticated,
        "forbidden" => ProblemKind::Forbidden,
        "operator-key-required" => ProblemKind::OperatorKeyRequired,
        "invalid-request" => ProblemKind::InvalidRequest,
        "malformed-json" => ProblemKind::MalformedJson,
        "bad-request" => ProblemKind::BadRequest,
        "payload-too-large" => ProblemKind::PayloadTooLarge,
        "unsupported-media-type" => ProblemKind::UnsupportedMediaType,
        "outcome-unknown" => ProblemKind::OutcomeUnknown,
        "lock-lost" => ProblemKind::LockLost,
        "lock-store-unavailable" => ProblemKind::LockStoreUnavailable,
        "database-unavailable" => ProblemKind::DatabaseUnavailable,
        "overloaded" => ProblemKind::Overloaded,
        "timeout" => ProblemKind::Timeout,
        "payouts-unavailable" => ProblemKind::PayoutsUnavailable,
        "bank-unavailable" => ProblemKind::BankUnavailable,
        "webhook-url-refused" => ProblemKind::WebhookUrlRefused,
        "webhook-endpoint-limit" => ProblemKind::WebhookEndpointLimit,
        "webhook-endpoint-not-found" => ProblemKind::WebhookEndpointNotFound,
        "webhook-endpoint-disabled" => ProblemKind::WebhookEndpointDisabled,
        "delivery-not-found" => ProblemKind::DeliveryNotFound,
        "delivery-in-flight" => ProblemKind::DeliveryInFlight,
        "webhooks-unavailable" => ProblemKind::WebhooksUnavailable,
        "method-not-allowed" => ProblemKind::MethodNotAllowed,
        "not-ready" => ProblemKind::NotReady,
        "internal-error" => ProblemKind::InternalError,
        "bank-fault-unknown" => ProblemKind::BankFaultUnknown,
        "bank-fault-refused" => ProblemKind::BankFaultRefused,
        _ => return None,
    })
}

/// The field `key` as text; empty when it is missing or not a string.
fn text(object: &Map<String, Value>, key: &str) -> String {
    object
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// The field `key` as an id, when it is one.
fn id(object: &Map<String, Value>, key: &str) -> Option<Uuid> {
    object
        .get(key)
        .and_then(Value::as_str)
        .and_then(|text| text.parse::<Uuid>().ok())
}

fn other(name: &str, object: &Map<String, Value>) -> ProblemKind {
    let fields = object
        .iter()
        .filter(|(key, _)| {
            !matches!(
                key.as_str(),
                "type" | "title" | "status" | "detail" | "ticket_id" | "account_id"
            )
        })
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    ProblemKind::Other {
        name: name.to_owned(),
        fields,
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.title, self.detail)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_stored_refusal_reads_with_its_numbers_and_ids() {
        let ticket = Uuid::new_v4();
        let body = json!({
            "type": "/problems/insufficient-points", "title": "Insufficient points",
            "status": 402, "detail": "3 points do not cover a draw of 5",
            "ticket_id": ticket, "points": 3, "points_needed": 5,
        });
        let problem = Problem::from_body(402, &body, None).unwrap_or_else(|| panic!("{body}"));
        assert_eq!(
            problem.kind,
            ProblemKind::InsufficientPoints {
                points: 3,
                points_needed: Some(5)
            }
        );
        assert_eq!(problem.ticket_id, Some(ticket));
        assert!(!problem.is_resendable());
    }

    #[test]
    fn transient_problems_are_resendable_but_outcome_unknown_and_payouts_unavailable() {
        for (name, status, resendable) in [
            ("request-in-progress", 409, true),
            ("account-busy", 409, true),
            ("rate-limited", 429, true),
            ("lock-lost", 503, true),
            ("database-unavailable", 503, true),
            ("outcome-unknown", 503, false),
            ("payouts-unavailable", 503, false),
            ("webhooks-unavailable", 503, false),
            ("timeout", 503, true),
            ("idempotency-key-reuse", 422, false),
            ("order-already-paid", 409, false),
        ] {
            let body = json!({"type": format!("/problems/{name}"), "title": "t", "status": status, "detail": "d"});
            let problem =
                Problem::from_body(status, &body, None).unwrap_or_else(|| panic!("{body}"));
            assert_eq!(problem.is_resendable(), resendable, "{name}");
        }
    }

    #[test]
    fn an_unknown_type_keeps_its_name_and_fields() {
        let body = json!({"type": "/problems/new-thing", "title": "t", "status": 400, "detail": "d", "limit": 7});
        let problem = Problem::from_body(400, &body, None).unwrap_or_else(|| panic!("{body}"));
        let ProblemKind::Other { name, fields } = problem.kind else {
            panic!("not Other")
        };
        assert_eq!((name.as_str(), &fields["limit"]), ("new-thing", &json!(7)));
        assert!(Problem::from_body(400, &json!({"error": "x"}), None).is_none());
    }
}
