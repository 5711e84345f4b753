//! Clients that retry, as real ones do: a request that got no answer, or a transient one
//! (409 `request-in-progress` / `account-busy`, 429 `rate-limited`, 503 — `lock-lost`, a
//! store down, `timeout`, `outcome-unknown`), is sent again with the same ticket. That is
//! what tickets are for: the server stores nothing for those answers, so the ticket still
//! executes at most once, and the resend learns its outcome.
//!
//! Each resend waits first — the answer's `Retry-After` when it has one, else an
//! exponential backoff with jitter — and may go to another target, as a client behind a
//! load balancer would after an instance died.

use std::future::Future;
use std::time::Duration;

use crate::history::{Attempt, TicketAttempt};

/// The first backoff without `Retry-After`; it doubles with each attempt.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// How a client resends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Sends per logical request, the first included; 1 turns retries off.
    pub max_attempts: u32,
    /// The longest wait before a resend, whatever `Retry-After` asks: a load test must not
    /// stall on a server that asks for an hour.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// What the policy needs to know of an answer.
pub trait Resendable {
    /// The status; `None` when no answer came.
    fn status(&self) -> Option<u16>;
    /// The answer's `Retry-After`, in seconds.
    fn retry_after(&self) -> Option<u64>;
}

impl Resendable for Attempt {
    fn status(&self) -> Option<u16> {
        self.status
    }
    fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }
}

impl Resendable for TicketAttempt {
    fn status(&self) -> Option<u16> {
        self.status
    }
    fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }
}

/// Whether an answer says "nothing was stored, send it again": no answer at all, 409, 429
/// or 503. Every other answer is final — a definitive outcome, or a refusal that a resend
/// would only repeat.
pub fn is_resendable(status: Option<u16>) -> bool {
    matches!(status, None | Some(409 | 429 | 503))
}

impl RetryPolicy {
    /// No retries: each logical request is sent once (the load test before it retried).
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Whether a request may be sent more than once.
    pub fn retries(&self) -> bool {
        self.max_attempts > 1
    }

    /// How long to wait after attempt `number` (1-based) before the next: `Retry-After`
    /// when the answer had one, else `FIRST_BACKOFF` doubled per attempt with equal
    /// jitter (half fixed, half random, so clients that failed together do not resend
    /// together); never more than `max_backoff` — payonce-client's own wait.
    pub fn backoff(&self, number: u32, retry_after: Option<u64>) -> Duration {
        payonce_client::ResendPolicy {
            max_attempts: self.max_attempts,
            first_backoff: FIRST_BACKOFF,
            max_backoff: self.max_backoff,
            resend_unanswered: true,
        }
        .wait(number, retry_after.map(Duration::from_secs))
    }

    /// Sends one logical request — `send(number)` sends attempt `number`, 1-based — until
    /// an answer is final or the attempts run out, waiting [`backoff`](Self::backoff)
    /// between them. Returns every attempt, in order.
    pub async fn send<T, F, Fut>(&self, mut send: F) -> Vec<T>
    where
        T: Resendable,
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut attempts = Vec::new();
        for number in 1..=self.max_attempts.max(1) {
            let attempt = send(number).await;
            let again = number < self.max_attempts && is_resendable(attempt.status());
            let wait = self.backoff(number, attempt.retry_after());
            attempts.push(attempt);
            if !again {
                break;
            }
            tokio::time::sleep(wait).await;
        }
        attempts
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::history::Role;

    fn answer(number: u32, status: Option<u16>) -> Attempt {
        Attempt {
            role: Role::Original,
            attempt: number,
            target: number as usize,
            amount: 1,
            status,
            replayed: false,
            body: None,
            sent_at_ms: 0,
            latency_us: 1,
            error: None,
            retry_after: None,
        }
    }

    /// A policy that waits no longer than a millisecond, so the tests run at once.
    fn quick(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            max_backoff: Duration::from_millis(1),
        }
    }

    /// The statuses sent by `policy` when the server answers `script` in turn.
    async fn sent(policy: RetryPolicy, script: &[Option<u16>]) -> Vec<(u32, Option<u16>)> {
        let calls = RefCell::new(0_usize);
        policy
            .send(|number| {
                let status = script[*calls.borrow()];
                *calls.borrow_mut() += 1;
                async move { answer(number, status) }
            })
            .await
            .into_iter()
            .map(|attempt| (attempt.attempt, attempt.status))
            .collect()
    }

    /// Transient answers are resent, numbered, until a final one.
    #[tokio::test]
    async fn transient_answers_are_resent_until_a_final_one() {
        let script = [None, Some(503), Some(409), Some(429), Some(201)];
        assert_eq!(
            sent(quick(5), &script).await,
            vec![
                (1, None),
                (2, Some(503)),
                (3, Some(409)),
                (4, Some(429)),
                (5, Some(201))
            ]
        );
    }

    /// A final answer — an outcome or a refusal a resend would only repeat — is not resent.
    #[tokio::test]
    async fn final_answers_are_not_resent() {
        for status in [201, 402, 422, 400, 404, 500] {
            assert_eq!(
                sent(quick(5), &[Some(status), Some(201)]).await,
                vec![(1, Some(status))]
            );
        }
    }

    /// The attempts are bounded; and with one attempt (`--no-retry`) nothing is resent.
    #[tokio::test]
    async fn attempts_are_bounded() {
        assert_eq!(sent(quick(3), &[None; 5]).await.len(), 3);
        assert_eq!(sent(RetryPolicy::none(), &[None; 5]).await, vec![(1, None)]);
    }

    /// `Retry-After` is honoured, up to the cap.
    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.backoff(1, Some(1)), Duration::from_secs(1));
        assert_eq!(policy.backoff(1, Some(3600)), policy.max_backoff);
    }

    /// Without `Retry-After` the wait doubles per attempt, jittered within its upper half,
    /// and stops growing at the cap.
    #[test]
    fn the_backoff_doubles_with_jitter_up_to_the_cap() {
        let policy = RetryPolicy::default();
        for number in 1..=4 {
            let ceiling = FIRST_BACKOFF * (1 << (number - 1));
            let waits: Vec<Duration> = (0..50).map(|_| policy.backoff(number, None)).collect();
            assert!(
                waits
                    .iter()
                    .all(|wait| (ceiling / 2..=ceiling).contains(wait)),
                "attempt {number}: {waits:?}"
            );
            assert!(
                waits.iter().any(|wait| *wait != waits[0]),
                "no jitter: {waits:?}"
            );
        }
        assert!(policy.backoff(30, None) <= policy.max_backoff);
    }
}
