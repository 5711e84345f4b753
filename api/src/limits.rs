//! Abuse limits: how fast one client address may open accounts, and one account may take
//! tickets and spend. Past a limit the answer is 429 `rate-limited` with `Retry-After`,
//! and nothing is stored.

use std::fmt;
use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU32;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ledger::AccountId;

use crate::error::ApiError;

/// The three keyed limiters; a limit set to 0 is no limit.
pub struct RateLimits {
    accounts: Option<DefaultKeyedRateLimiter<IpAddr>>,
    tickets: Option<DefaultKeyedRateLimiter<AccountId>>,
    spends: Option<DefaultKeyedRateLimiter<AccountId>>,
}

impl fmt::Debug for RateLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimits")
            .field("accounts", &self.accounts.is_some())
            .field("tickets", &self.tickets.is_some())
            .field("spends", &self.spends.is_some())
            .finish()
    }
}

/// A limiter allowing `count` per window — all at once, or spread out, refilled evenly.
fn limiter<K: Hash + Eq + Clone>(
    count: u32,
    per: fn(NonZeroU32) -> Quota,
) -> Option<DefaultKeyedRateLimiter<K>> {
    NonZeroU32::new(count).map(|count| RateLimiter::keyed(per(count)))
}

impl RateLimits {
    /// Limits of `accounts_per_minute` per client address, and `tickets_per_second` and
    /// `spends_per_second` per account.
    pub fn new(accounts_per_minute: u32, tickets_per_second: u32, spends_per_second: u32) -> Self {
        Self {
            accounts: limiter(accounts_per_minute, Quota::per_minute),
            tickets: limiter(tickets_per_second, Quota::per_second),
            spends: limiter(spends_per_second, Quota::per_second),
        }
    }

    /// No limits at all.
    pub fn none() -> Self {
        Self::new(0, 0, 0)
    }

    /// One more account opened from `client`.
    pub fn open_account(&self, client: IpAddr) -> Result<(), ApiError> {
        check(self.accounts.as_ref(), &client)
    }

    /// One more ticket taken by `account`.
    pub fn take_ticket(&self, account: AccountId) -> Result<(), ApiError> {
        check(self.tickets.as_ref(), &account)
    }

    /// One more spend sent by `account`.
    pub fn spend(&self, account: AccountId) -> Result<(), ApiError> {
        check(self.spends.as_ref(), &account)
    }

    /// Forgets keys whose limit is fully refilled, so the limiters hold only the clients
    /// active lately.
    pub fn forget_idle(&self) {
        for limiter in [&self.tickets, &self.spends].into_iter().flatten() {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        if let Some(limiter) = &self.accounts {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }
}

fn check<K: Hash + Eq + Clone>(
    limiter: Option<&DefaultKeyedRateLimiter<K>>,
    key: &K,
) -> Result<(), ApiError> {
    let Some(limiter) = limiter else {
        return Ok(());
    };
    limiter.check_key(key).map_err(|not_until| {
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        // Whole seconds, rounded up: retrying at the announced time must succeed.
        let retry_after = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        ApiError::RateLimited {
            retry_after: retry_after.max(1),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_up_to_the_limit_passes_and_the_next_waits() {
        let limits = RateLimits::new(3, 2, 0);
        let client: IpAddr = [127, 0, 0, 1].into();
        for _ in 0..3 {
            assert!(limits.open_account(client).is_ok());
        }
        match limits.open_account(client) {
            Err(ApiError::RateLimited { retry_after }) => assert!((1..=20).contains(&retry_after)),
            other => panic!("{other:?}"),
        }
        // Another address has its own allowance.
        assert!(limits.open_account([127, 0, 0, 2].into()).is_ok());
        let account = AccountId::random();
        assert!(limits.take_ticket(account).is_ok());
        assert!(limits.take_ticket(account).is_ok());
        assert!(limits.take_ticket(account).is_err());
        // 0 is no limit.
        for _ in 0..10_000 {
            assert!(limits.spend(account).is_ok());
        }
    }
}
