//! A spend as one intent: its ticket taken once, then sent — and sent again with that
//! ticket — until the answer is final.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;
use reqwest::header::{HeaderName, HeaderValue};
use serde::de::DeserializeOwned;
use serde_json::Value;
use uuid::Uuid;

use crate::Error;
use crate::client::{Call, Client, ExtraHeader};
use crate::problem::ProblemKind;

/// How an intent (or any other call) is sent again after no answer or a transient one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResendPolicy {
    /// Sends in all, the first included; 1 turns resends off.
    pub max_attempts: u32,
    /// The wait before the first resend without `Retry-After`; it doubles with each one.
    pub first_backoff: Duration,
    /// The longest wait before a resend, whatever `Retry-After` asks.
    pub max_backoff: Duration,
    /// Whether a send that may have run is sent again: one that got no answer, or an
    /// answer that leaves it open (`503 timeout`, `outcome-unknown`). On by default: every
    /// POST payonce-client sends carries an `Idempotency-Key` (a spend's ticket, a key of
    /// its own for the others), which makes a resend a replay; reads and deletes are safe
    /// to repeat. Off, for requests sent without a key, such an answer is final. A send
    /// whose connection could not be made is sent again either way: it carried nothing.
    pub resend_unanswered: bool,
}

impl Default for ResendPolicy {
    /// Six sends, from 100 ms apart doubling up to 5 s: about 10 s of trying in all.
    fn default() -> Self {
        Self {
            max_attempts: 6,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            resend_unanswered: true,
        }
    }
}

impl ResendPolicy {
    /// Send once, never again.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// The wait after send number `attempt` (1-based): the answer's `Retry-After` when it
    /// had one, else the backoff doubled per send with equal jitter (half fixed, half
    /// random, so clients that failed together do not come back together); never more
    /// than `max_backoff`.
    pub fn wait(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let wait = retry_after.unwrap_or_else(|| {
            let ceiling = self
                .first_backoff
                .saturating_mul(1 << attempt.saturating_sub(1).min(16))
                .min(self.max_backoff);
            ceiling / 2 + ceiling.mul_f64(rand::rng().random::<f64>() / 2.0)
        });
        wait.min(self.max_backoff)
    }
}

/// One send of an intent, as it went: for a caller that records what was sent and
/// answered (a load test's auditor, say). See [`Intent::on_attempt`].
#[derive(Clone, Debug, PartialEq)]
pub struct Attempt {
    /// 1 for the first send of this call (of this [`Intent::send`], for an intent).
    pub number: u32,
    /// Which base URL it went to: its place in the order the builder was given them.
    pub base_index: usize,
    /// The base URL it went to.
    pub base: String,
    /// The answer's status; `None` when no answer came.
    pub status: Option<u16>,
    /// `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// The answer's body (JSON, or the text as a string); `None` without an answer.
    pub body: Option<Value>,
    /// From the send to the answer, or to giving up on one.
    pub latency: Duration,
    /// Why no answer came.
    pub error: Option<String>,
    /// The answer's `Retry-After`.
    pub retry_after: Option<Duration>,
}

/// What an intent calls with each [`Attempt`].
#[derive(Clone)]
pub(crate) struct Observer(Arc<dyn Fn(&Attempt) + Send + Sync>);

impl Observer {
    pub(crate) fn new(observer: impl Fn(&Attempt) + Send + Sync + 'static) -> Self {
        Self(Arc::new(observer))
    }

    pub(crate) fn see(&self, attempt: &Attempt) {
        (self.0)(attempt);
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// What a spend came to.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome<T> {
    /// The answer's body.
    pub body: T,
    /// Its status (201 for a spend, 202 for a payout).
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
    /// A refusal stored under the ticket (402, 409 `order-already-paid`, 422) is
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_with_jitter_and_honour_retry_after_up_to_the_bound() {
        let policy = ResendPolicy::default();
        for attempt in 1..=8 {
            let ceiling = (policy.first_backoff * (1 << (attempt - 1))).min(policy.max_backoff);
            let wait = policy.wait(attempt, None);
            assert!(
                wait >= ceiling / 2 && wait <= ceiling,
                "{attempt}: {wait:?}"
            );
        }
        assert_eq!(
            policy.wait(1, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(
            policy.wait(1, Some(Duration::from_secs(3600))),
            policy.max_backoff
        );
    }
}
