//! A spend as one intent: its ticket taken once, then sent — and sent again with that
//! ticket — until the answer is final.

use std::marker::PhantomData;

use payonce_types::holds::{
    CaptureRequest, HoldPlaced, HoldRefunded, HoldRequest, HoldResolved, MAX_HOLD_SECONDS,
    OrderRefunded, RefundRequest, VoidRequest,
};
use payonce_types::orders::{OrderPaid, PaymentRequest};
use payonce_types::payouts::{PayoutAccepted, PayoutRequest};
use payonce_types::spends::{DrawRequest, Drawn, MoneyMoved, MoneyRequest};
use reqwest::header::{HeaderName, HeaderValue};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use uuid::Uuid;

use crate::Error;
use crate::client::{Call, Client, ExtraHeader};
use crate::problem::ProblemKind;
use crate::resend::{Attempt, Observer, ResendPolicy};

/// What a spend came to.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome<T> {
    /// The answer's body.
    pub body: T,
    /// Its status (201 for a spend, 200 for a capture or a void, 202 for a payout).
    pub status: u16,
    /// Whether it was answered from the outcome stored by an earlier send
    /// (`Idempotent-Replayed: true`): nothing executed this time.
    pub replayed: bool,
    /// The intent's ticket.
    pub ticket: Uuid,
    /// Sends this call made.
    pub attempts: u32,
}

/// One spend. It takes a ticket of its account on its first [`send`](Self::send) and keeps
/// it: every send of the intent, and every resend within one, carries the same ticket, so
/// the spend executes at most once however often it is sent.
#[derive(Debug)]
#[must_use = "an intent does nothing until it is sent"]
pub struct Intent<T> {
    client: Client,
    account: Uuid,
    path: String,
    body: Value,
    ticket: Option<Uuid>,
    policy: ResendPolicy,
    observer: Option<Observer>,
    headers: Vec<ExtraHeader>,
    /// The base the next send goes to, when the client was aimed
    /// ([`Client::starting_at`]): the intent keeps its own turn across its sends.
    base: Option<usize>,
    answer: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Intent<T> {
    pub(crate) fn new(client: Client, account: Uuid, path: String, body: Value) -> Self {
        let policy = client.policy();
        let observer = client.observer().cloned();
        let base = client.start();
        Self {
            client,
            account,
            path,
            body,
            ticket: None,
            policy,
            observer,
            headers: Vec::new(),
            base,
            answer: PhantomData,
        }
    }

    /// Resends by `policy` instead of the client's.
    pub fn with_policy(mut self, policy: ResendPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Spends `ticket` rather than taking one: to finish an intent whose ticket was kept
    /// (in a database, say) by a process that stopped before it learned the outcome.
    pub fn with_ticket(mut self, ticket: Uuid) -> Self {
        self.ticket = Some(ticket);
        self
    }

    /// Calls `observer` with every send of the spend — its answer or its failure — as it
    /// happens, instead of the client's ([`Client::on_attempt`]). The ticket's request is
    /// not one of them: it is the client's call, seen by the client's observer.
    pub fn on_attempt(mut self, observer: impl Fn(&Attempt) + Send + Sync + 'static) -> Self {
        self.observer = Some(Observer::new(observer));
        self
    }

    /// Sends `name: value` with every send of the spend: a header of the caller's own (a
    /// trace's, a test's demonstration fault).
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push(ExtraHeader {
            name,
            value,
            only_to: None,
        });
        self
    }

    /// Sends `name: value` with the sends that go to base URL number `base` only: a
    /// demonstration fault aimed at one instance, which a resend to another must not
    /// carry there.
    pub fn with_header_to(mut self, base: usize, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push(ExtraHeader {
            name,
            value,
            only_to: Some(base),
        });
        self
    }

    /// The intent's ticket, once taken.
    pub fn ticket(&self) -> Option<Uuid> {
        self.ticket
    }

    /// Sends the spend — taking its ticket first, if it has none yet — and resends it with
    /// the same ticket after no answer, a 409 `request-in-progress` or `account-busy`, a
    /// 429 or a 503 (waiting `Retry-After` when the answer says), until the answer is final
    /// or the policy's sends run out. Sending an intent again after an outcome answers the
    /// same outcome, as a replay.
    ///
    /// A refusal stored under the ticket (402; 409 `order-already-paid`, `hold-not-held`,
    /// `refund-exceeds-payment`, `order-not-paid`; 422) is
    /// [`Error::Refused`], and stays the ticket's answer; a 503 `outcome-unknown` is
    /// [`Error::OutcomeUnknown`]; no final answer is [`Error::GaveUp`], with the ticket to
    /// send again with later. A payout to an instance without a bank (503
    /// `payouts-unavailable`) is [`Error::Refused`] at once, not resent: the instance's
    /// configuration, not a passing state ([`Problem::is_resendable`]); nothing was stored
    /// under the ticket.
    ///
    /// [`Problem::is_resendable`]: crate::Problem::is_resendable
    pub async fn send(&mut self) -> Result<Outcome<T>, Error> {
        let ticket = match self.ticket {
            Some(ticket) => ticket,
            None => {
                let ticket = self.client.take_ticket(self.account).await?.ticket_id;
                self.ticket = Some(ticket);
                ticket
            }
        };
        // The ticket makes a resend after no answer safe, whatever the policy says of others.
        let policy = ResendPolicy {
            resend_unanswered: true,
            ..self.policy
        };
        let mut call = Call {
            method: reqwest::Method::POST,
            path: &self.path,
            body: Some(&self.body),
            idempotency_key: Some(ticket),
            headers: &self.headers,
            observer: self.observer.as_ref(),
            base: self.base,
        };
        let sent = self.client.send_with_resends::<T>(&policy, &mut call).await;
        self.base = call.base;
        match sent {
            Ok(answer) => Ok(Outcome {
                body: answer.body,
                status: answer.status,
                replayed: answer.replayed,
                ticket,
                attempts: answer.attempts,
            }),
            Err(Error::Refused(problem)) if problem.kind == ProblemKind::OutcomeUnknown => {
                Err(Error::OutcomeUnknown { ticket, problem })
            }
            Err(Error::GaveUp { attempts, last, .. }) => Err(Error::GaveUp {
                ticket: Some(ticket),
                attempts,
                last,
            }),
            Err(error) => Err(error),
        }
    }
}

/// The spends a client makes into intents. They live here, with [`Intent`], so that the
/// client's module, which an intent sends through, does not need to know of intents.
impl Client {
    /// Withdrawing `amount` (minor units) from the account, as an intent.
    pub fn withdrawal(&self, account: Uuid, amount: i64) -> Intent<MoneyMoved> {
        self.intent(
            account,
            format!("/v1/accounts/{account}/withdrawals"),
            &MoneyRequest { amount },
        )
    }

    /// Depositing `amount` into the account (the operator's key, where one is set), as an
    /// intent.
    pub fn deposit(&self, account: Uuid, amount: i64) -> Intent<MoneyMoved> {
        self.intent(
            account,
            format!("/v1/accounts/{account}/deposits"),
            &MoneyRequest { amount },
        )
    }

    /// A lottery draw spending `points`, as an intent.
    pub fn lottery_draw(&self, account: Uuid, points: i64) -> Intent<Drawn> {
        self.intent(
            account,
            format!("/v1/accounts/{account}/lottery-draws"),
            &DrawRequest { points },
        )
    }

    /// Paying the order from its account, as an intent.
    pub fn order_payment(&self, account: Uuid, order: Uuid) -> Intent<OrderPaid> {
        self.intent(
            account,
            format!("/v1/orders/{order}/payments"),
            &PaymentRequest {},
        )
    }

    /// Paying out from the account to a bank account, as an intent.
    pub fn payout(&self, account: Uuid, payout: &PayoutRequest) -> Intent<PayoutAccepted> {
        self.intent(account, format!("/v1/accounts/{account}/payouts"), payout)
    }

    /// Setting `amount` aside on the account until it is captured, voided, or expires
    /// `expires_in` seconds from now (seven days if `None`), as an intent.
    pub fn hold(&self, account: Uuid, amount: i64, expires_in: Option<i64>) -> Intent<HoldPlaced> {
        self.intent(
            account,
            format!("/v1/accounts/{account}/holds"),
            &HoldRequest {
                amount,
                expires_in: expires_in.unwrap_or(MAX_HOLD_SECONDS),
            },
        )
    }

    /// Capturing the hold of the account — `amount` of it, or all of it if `None`; the
    /// rest released — as an intent. Once: a hold not held any more is refused
    /// ([`ProblemKind::HoldNotHeld`]).
    pub fn capture(&self, account: Uuid, hold: Uuid, amount: Option<i64>) -> Intent<HoldResolved> {
        self.intent(
            account,
            format!("/v1/holds/{hold}/capture"),
            &CaptureRequest { amount },
        )
    }

    /// Voiding the hold of the account, all of it released, as an intent.
    pub fn void(&self, account: Uuid, hold: Uuid) -> Intent<HoldResolved> {
        self.intent(account, format!("/v1/holds/{hold}/void"), &VoidRequest {})
    }

    /// Giving `amount` of the account's paid order back to it, as an intent. Never more in
    /// all than the order paid: past that, [`ProblemKind::RefundExceedsPayment`].
    pub fn order_refund(&self, account: Uuid, order: Uuid, amount: i64) -> Intent<OrderRefunded> {
        self.intent(
            account,
            format!("/v1/orders/{order}/refunds"),
            &RefundRequest { amount },
        )
    }

    /// Giving `amount` of the account's captured hold back to it, as an intent. Never
    /// more in all than was captured.
    pub fn hold_refund(&self, account: Uuid, hold: Uuid, amount: i64) -> Intent<HoldRefunded> {
        self.intent(
            account,
            format!("/v1/holds/{hold}/refunds"),
            &RefundRequest { amount },
        )
    }

    fn intent<T: DeserializeOwned>(
        &self,
        account: Uuid,
        path: String,
        body: &impl Serialize,
    ) -> Intent<T> {
        let body = serde_json::to_value(body).unwrap_or(Value::Null);
        Intent::new(self.clone(), account, path, body)
    }
}
