//! Abuse limits: how fast one client may open accounts and send unknown keys, and one
//! account may take tickets, place orders and spend. Past a limit the answer is 429
//! `rate-limited` with `Retry-After`, and nothing is stored.
//!
//! A client is its address, and an IPv6 client its /64 ([`client_key`]): the block one
//! subscriber is given, whose 2^64 addresses must not each bring a fresh allowance.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ledger::AccountId;

use crate::error::ApiError;

pub mod config;

/// How fast clients and accounts may go; 0 is no limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rates {
    /// Accounts opened per client, per minute.
    pub accounts_per_minute: u32,
    /// Tickets taken per account, per second.
    pub tickets_per_second: u32,
    /// Spends sent per account, per second.
    pub spends_per_second: u32,
    /// Orders placed per account, per second.
    pub orders_per_second: u32,
    /// Unknown or wrong keys sent per client, per minute.
    pub bad_keys_per_minute: u32,
}

/// The keyed limiters; a limit set to 0 is no limit.
pub struct RateLimits {
    accounts: Option<DefaultKeyedRateLimiter<IpAddr>>,
    tickets: Option<DefaultKeyedRateLimiter<AccountId>>,
    spends: Option<DefaultKeyedRateLimiter<AccountId>>,
    orders: Option<DefaultKeyedRateLimiter<AccountId>>,
    bad_keys: Option<BadKeys>,
}

impl fmt::Debug for RateLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimits")
            .field("accounts", &self.accounts.is_some())
            .field("tickets", &self.tickets.is_some())
            .field("spends", &self.spends.is_some())
            .field("orders", &self.orders.is_some())
            .field("bad_keys", &self.bad_keys.is_some())
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

/// What a client's allowance is kept under: its address, an IPv4 address written as
/// IPv6 (`::ffff:192.0.2.1`) as the IPv4 address, and an IPv6 address as its /64.
pub fn client_key(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => {
            const NETWORK: u128 = !0 << 64;
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & NETWORK))
        }
        v4 => v4,
    }
}

impl RateLimits {
    /// Limiters for `rates`.
    pub fn new(rates: &Rates) -> Self {
        Self {
            accounts: limiter(rates.accounts_per_minute, Quota::per_minute),
            tickets: limiter(rates.tickets_per_second, Quota::per_second),
            spends: limiter(rates.spends_per_second, Quota::per_second),
            orders: limiter(rates.orders_per_second, Quota::per_second),
            bad_keys: BadKeys::per_minute(rates.bad_keys_per_minute),
        }
    }

    /// No limits at all.
    pub fn none() -> Self {
        Self::new(&Rates::default())
    }

    /// One more account opened from `client`.
    pub fn open_account(&self, client: IpAddr) -> Result<(), ApiError> {
        check(self.accounts.as_ref(), &client_key(client))
    }

    /// One more ticket taken by `account`.
    pub fn take_ticket(&self, account: AccountId) -> Result<(), ApiError> {
        check(self.tickets.as_ref(), &account)
    }

    /// One more spend sent by `account`.
    pub fn spend(&self, account: AccountId) -> Result<(), ApiError> {
        check(self.spends.as_ref(), &account)
    }

    /// One more order placed by `account`.
    pub fn place_order(&self, account: AccountId) -> Result<(), ApiError> {
        check(self.orders.as_ref(), &account)
    }

    /// A key from `client` is about to be checked: takes one from the client's allowance
    /// of bad keys — 429 once it is spent, before anything is looked up — and gives it
    /// back if the key proves right ([`KeyCheck::passed`]).
    pub fn check_key(&self, client: IpAddr) -> Result<KeyCheck<'_>, ApiError> {
        let client = client_key(client);
        if let Some(bad_keys) = &self.bad_keys {
            bad_keys.take(client)?;
        }
        Ok(KeyCheck {
            bad_keys: self.bad_keys.as_ref(),
            client,
        })
    }

    /// Forgets keys whose limit is fully refilled, so the limiters hold only the clients
    /// active lately.
    pub fn forget_idle(&self) {
        for limiter in [&self.tickets, &self.spends, &self.orders]
            .into_iter()
            .flatten()
        {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        if let Some(limiter) = &self.accounts {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        if let Some(bad_keys) = &self.bad_keys {
            bad_keys.forget_idle();
        }
    }
}

/// One key check under way, holding one of its client's allowance of bad keys: a key
/// that proves right gives it back ([`Self::passed`]); dropped otherwise — a wrong key,
/// or a look-up that failed — it stays spent.
#[must_use = "a key check that passed gives its allowance back"]
#[derive(Debug)]
pub struct KeyCheck<'a> {
    bad_keys: Option<&'a BadKeys>,
    client: IpAddr,
}

impl KeyCheck<'_> {
    /// The key was right: the allowance is the client's again.
    pub fn passed(self) {
        if let Some(bad_keys) = self.bad_keys {
            bad_keys.give_back(self.client);
        }
    }
}

/// The allowance of bad keys: a token bucket per client, `burst` deep, refilled at
/// `per_second`. Not a governor limiter, because those cannot give a unit back: taking
/// one only once a key proved wrong would let a burst of concurrent guesses all reach the
/// database before the first failure counted. So every check takes one first, and a key
/// that proves right gives it back.
#[derive(Debug)]
struct BadKeys {
    burst: f64,
    per_second: f64,
    /// Per client: the tokens left, as of when. Locked only for arithmetic, never across
    /// an await.
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl BadKeys {
    /// `count` a minute: all at once, or one every `60 s / count`.
    fn per_minute(count: u32) -> Option<Self> {
        (count > 0).then(|| Self {
            burst: f64::from(count),
            per_second: f64::from(count) / 60.0,
            buckets: Mutex::default(),
        })
    }

    /// Adds to `bucket` what it earned since it was last looked at.
    fn refilled(&self, bucket: &mut Bucket, now: Instant) {
        let earned = now.duration_since(bucket.at).as_secs_f64() * self.per_second;
        bucket.tokens = (bucket.tokens + earned).min(self.burst);
        bucket.at = now;
    }

    fn take(&self, client: IpAddr) -> Result<(), ApiError> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = buckets.entry(client).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        self.refilled(bucket, now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        // Whole seconds, rounded up: retrying at the announced time must succeed.
        let wait = ((1.0 - bucket.tokens) / self.per_second).ceil();
        Err(ApiError::RateLimited {
            retry_after: (wait as u64).max(1),
        })
    }

    fn give_back(&self, client: IpAddr) {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(bucket) = buckets.get_mut(&client) {
            self.refilled(bucket, now);
            bucket.tokens = (bucket.tokens + 1.0).min(self.burst);
        }
    }

    fn forget_idle(&self) {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        buckets.retain(|_, bucket| {
            self.refilled(bucket, now);
            bucket.tokens < self.burst
        });
        buckets.shrink_to_fit();
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
        let limits = RateLimits::new(&Rates {
            accounts_per_minute: 3,
            tickets_per_second: 2,
            orders_per_second: 1,
            ..Rates::default()
        });
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
        assert!(limits.place_order(account).is_ok());
        assert!(limits.place_order(account).is_err());
        // 0 is no limit.
        for _ in 0..10_000 {
            assert!(limits.spend(account).is_ok());
            limits.check_key([127, 0, 0, 1].into()).unwrap().passed();
            drop(limits.check_key([127, 0, 0, 1].into()).unwrap());
        }
    }

    #[test]
    fn an_ipv6_client_is_its_slash_64_and_a_mapped_ipv4_address_is_the_ipv4_address() {
        let v6 = |text: &str| text.parse::<IpAddr>().unwrap();
        assert_eq!(
            client_key(v6("2001:db8:1:2:aaaa::1")),
            client_key(v6("2001:db8:1:2:ffff:ffff:ffff:ffff"))
        );
        assert_eq!(client_key(v6("2001:db8:1:2:aaaa::1")), v6("2001:db8:1:2::"));
        assert_ne!(
            client_key(v6("2001:db8:1:2::1")),
            client_key(v6("2001:db8:1:3::1"))
        );
        assert_eq!(client_key(v6("::ffff:192.0.2.1")), v6("192.0.2.1"));
        assert_eq!(client_key(v6("192.0.2.1")), v6("192.0.2.1"));
        assert_ne!(client_key(v6("::1")), client_key(v6("127.0.0.1")));

        // Two addresses of one /64 share one allowance; the next /64 has its own.
        let limits = RateLimits::new(&Rates {
            accounts_per_minute: 2,
            ..Rates::default()
        });
        assert!(limits.open_account(v6("2001:db8:1:2::1")).is_ok());
        assert!(limits.open_account(v6("2001:db8:1:2::2")).is_ok());
        assert!(limits.open_account(v6("2001:db8:1:2:9::3")).is_err());
        assert!(limits.open_account(v6("2001:db8:1:3::1")).is_ok());
    }

    #[test]
    fn bad_keys_spend_the_allowance_and_right_ones_give_it_back() {
        let limits = RateLimits::new(&Rates {
            bad_keys_per_minute: 3,
            ..Rates::default()
        });
        let client: IpAddr = [192, 0, 2, 1].into();
        // Right keys, however many: nothing spent.
        for _ in 0..10 {
            limits.check_key(client).unwrap().passed();
        }
        // Three checks under way at once hold the whole allowance: a fourth is refused
        // before it could reach the database.
        let under_way: Vec<KeyCheck<'_>> =
            (0..3).map(|_| limits.check_key(client).unwrap()).collect();
        match limits.check_key(client) {
            Err(ApiError::RateLimited { retry_after }) => assert!((1..=20).contains(&retry_after)),
            other => panic!("{other:?}"),
        }
        // One proves right, two wrong: one check left.
        let mut under_way = under_way.into_iter();
        under_way.next().unwrap().passed();
        drop(under_way);
        drop(limits.check_key(client).unwrap());
        assert!(limits.check_key(client).is_err());
        // The same client by another spelling; another client has its own allowance.
        assert!(
            limits
                .check_key("::ffff:192.0.2.1".parse().unwrap())
                .is_err()
        );
        assert!(limits.check_key([192, 0, 2, 2].into()).is_ok());
    }
}
