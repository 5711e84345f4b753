//! How a call is sent again, and each send as it went: what the client's send loop and an
//! intent share, kept apart from both so that neither has to reach into the other for it.

use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;
use serde_json::Value;

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
/// answered (a load test's auditor, say). See
/// [`Intent::on_attempt`](crate::Intent::on_attempt).
#[derive(Clone, Debug, PartialEq)]
pub struct Attempt {
    /// 1 for the first send of this call (of this [`Intent::send`](crate::Intent::send), for
    /// an intent).
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
