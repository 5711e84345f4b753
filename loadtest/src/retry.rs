//! Clients that retry, as real ones do: a request that got no answer, or a transient one
//! (409 `request-in-progress` / `account-busy`, 429 `rate-limited`, 503 — `lock-lost`, a
//! store down, `timeout`), is sent again with the same ticket. That is what tickets are
//! for: the server stores nothing for those answers, so the ticket still executes at most
//! once, and the resend learns its outcome.
//!
//! payonce-client does the resending: each spend is an [`Intent`] with the ticket the run
//! took, resent by the [`ResendPolicy`] made from the run's [`RetryPolicy`] — waiting the
//! answer's `Retry-After` when it has one, else an exponential backoff with jitter, and
//! moving on to the next target after no answer, a 429 or a 503, as a client behind a load
//! balancer would after an instance died. The load test goes one step further than the
//! client does by itself: a 503 `outcome-unknown`, which the client reports rather than
//! resends, is sent again too, within the same bound — the ticket makes that safe, and
//! the resend, at the next target, learns the outcome. An answer that is no problem
//! document (a 503 from something in between, say) is final, as it is for the client:
//! the auditor judges it. So is a 503 `payouts-unavailable`, which the client returns at
//! once: a target without a bank says it to every payout, and the run, told so, stops
//! sending payouts (see `run.rs`).

use std::time::Duration;

use payonce_client::{Intent, ResendPolicy};
use serde::de::DeserializeOwned;

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

    /// payonce-client's policy for it: [`FIRST_BACKOFF`] doubled per resend with equal
    /// jitter up to `max_backoff`, and a send that got no answer sent again.
    pub fn resend(&self) -> ResendPolicy {
        ResendPolicy {
            max_attempts: self.max_attempts.max(1),
            first_backoff: FIRST_BACKOFF,
            max_backoff: self.max_backoff,
            resend_unanswered: true,
        }
    }

    /// Sends one logical request — `intent`, its ticket given — until its answer is final
    /// or `max_attempts` sends were made: the client's resends, and after a 503
    /// `outcome-unknown` the intent sent again. `sent` tells how many sends were made so
    /// far (the intent's observer counts them); the answers are what it observed.
    pub async fn send<T: DeserializeOwned>(&self, intent: Intent<T>, sent: impl Fn() -> u32) {
        let policy = self.resend();
        let mut intent = intent.with_policy(policy);
        loop {
            let answer = intent.send().await;
            let made = sent();
            match answer {
                Err(payonce_client::Error::OutcomeUnknown { .. }) if made < policy.max_attempts => {
                    intent = intent.with_policy(ResendPolicy {
                        max_attempts: policy.max_attempts - made,
                        ..policy
                    });
                    tokio::time::sleep(policy.wait(made, None)).await;
                }
                _ => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's policy carries the bound and the cap; one attempt sends once.
    #[test]
    fn the_clients_policy_keeps_the_bound_and_the_cap() {
        let policy = RetryPolicy::default().resend();
        assert_eq!(
            (
                policy.max_attempts,
                policy.max_backoff,
                policy.first_backoff
            ),
            (5, Duration::from_secs(2), FIRST_BACKOFF)
        );
        assert!(policy.resend_unanswered);
        assert_eq!(RetryPolicy::none().resend().max_attempts, 1);
        assert!(!RetryPolicy::none().retries());
        assert_eq!(
            policy.wait(1, Some(Duration::from_secs(3600))),
            policy.max_backoff
        );
    }
}
