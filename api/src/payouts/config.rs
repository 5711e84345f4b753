//! The payouts section: how the workers call the bank. The bank itself
//! (`PAYONCE_BANK_URL`) is named at the top of the configuration, beside the database,
//! since `payonce reconcile` reads it too; [`bank_url`] checks it.

use std::time::Duration;

use clap::Args;

use super::PayoutSettings;
use crate::config::section::{ConfigError, config_section, duration, mask, shown_by_name};

config_section! {
    /// The payout workers' schedule.
    #[derive(Args, Debug, Clone)]
    pub struct PayoutConfig {
        /// How long one call to the bank may take; past it the attempt's outcome is unknown
        /// and the payout is sent again, with the same key.
        #[arg(env = "PAYONCE_BANK_TIMEOUT", default_value = "2s", value_parser = duration)]
        pub bank_timeout: Duration,
        /// Payout workers in this instance: each claims due payouts and calls the bank.
        #[arg(env = "PAYONCE_PAYOUT_WORKERS", default_value_t = 4)]
        pub payout_workers: usize,
        /// How long a claimed payout is a worker's before another instance may take it over
        /// (a worker that died mid-call). At least three bank timeouts.
        #[arg(env = "PAYONCE_PAYOUT_LEASE", default_value = "30s", value_parser = duration)]
        pub payout_lease: Duration,
        /// The first wait before a payout is sent again (a timeout, a 5xx, a 429); it doubles
        /// with each attempt, with jitter, up to PAYONCE_PAYOUT_RETRY_MAX — or the bank's
        /// `Retry-After`, when it says one.
        #[arg(env = "PAYONCE_PAYOUT_RETRY_BASE", default_value = "200ms", value_parser = duration)]
        pub payout_retry_base: Duration,
        /// The longest wait between two attempts of a payout.
        #[arg(env = "PAYONCE_PAYOUT_RETRY_MAX", default_value = "1m", value_parser = duration)]
        pub payout_retry_max: Duration,
        /// Attempts without the bank's word after which payonce asks the bank for the
        /// transfer by its key — and, if the bank has none, closes the key there and credits
        /// the money back. A bank that does not answer leaves the payout pending. Attempts
        /// the bank throttled (429) do not count: see PAYONCE_PAYOUT_THROTTLE_MAX_AGE.
        #[arg(env = "PAYONCE_PAYOUT_ATTEMPTS", default_value_t = 10)]
        pub payout_attempts: u32,
        /// How old a payout may grow while the bank keeps throttling it (429, with or without
        /// `Retry-After`) before payonce asks the bank for it by key, as it does after
        /// PAYONCE_PAYOUT_ATTEMPTS. A bank that asks to wait has not refused, so throttles
        /// count toward no attempt budget; this bounds them by time instead.
        #[arg(env = "PAYONCE_PAYOUT_THROTTLE_MAX_AGE", default_value = "1h", value_parser = duration)]
        pub payout_throttle_max_age: Duration,
        /// The longest an idle payout worker waits before it looks for due payouts: a payout
        /// accepted wakes one at once (here, and on PostgreSQL on every instance, by a
        /// notification), and a worker wakes when the next attempt it knows of is due. The
        /// poll finds what no bell announced: a dead instance's payouts once their leases
        /// end.
        #[arg(env = "PAYONCE_PAYOUT_POLL", default_value = "10s", value_parser = duration)]
        pub payout_poll: Duration,
        /// The bank's idempotency key per payout: `one-key`, the same on every attempt (the
        /// only safe one), or `fresh-key-per-attempt`, a new key each retry as clients without
        /// a key scheme send — it pays twice; the demonstration's (only in a build with the
        /// cargo feature `demo`).
        #[arg(env = "PAYONCE_PAYOUT_KEYS", value_enum, default_value_t = PayoutKeys::OneKey)]
        pub payout_keys: PayoutKeys,
    }
}

/// Which idempotency key each call to the bank for a payout carries.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayoutKeys {
    /// The payout's key, on every attempt: the bank executes it once.
    OneKey,
    /// A new key on every attempt: a retry after a lost answer pays again.
    FreshKeyPerAttempt,
}

impl PayoutKeys {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::OneKey => "one-key",
            Self::FreshKeyPerAttempt => "fresh-key-per-attempt",
        }
    }
}

shown_by_name!(PayoutKeys);

impl PayoutConfig {
    /// A payout schedule that can work: a lease that outlasts the calls it covers, waits
    /// that grow, some workers.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.bank_timeout.is_zero()
            || self.payout_poll.is_zero()
            || self.payout_throttle_max_age.is_zero()
        {
            return Err(ConfigError::Invalid(
                "PAYONCE_BANK_TIMEOUT, PAYONCE_PAYOUT_POLL and PAYONCE_PAYOUT_THROTTLE_MAX_AGE must be positive".into(),
            ));
        }
        if self.payout_lease < self.bank_timeout * 3 {
            // A lease runs the claim, the call (and the question after a lost answer) and
            // the settlement; shorter, another instance takes a payout over mid-call.
            return Err(ConfigError::Invalid(
                "PAYONCE_PAYOUT_LEASE must be at least three PAYONCE_BANK_TIMEOUTs".into(),
            ));
        }
        if self.payout_retry_base.is_zero() || self.payout_retry_base > self.payout_retry_max {
            return Err(ConfigError::Invalid(
                "PAYONCE_PAYOUT_RETRY_BASE must be positive and at most PAYONCE_PAYOUT_RETRY_MAX"
                    .into(),
            ));
        }
        if self.payout_keys != PayoutKeys::OneKey && !cfg!(feature = "demo") {
            return Err(ConfigError::Invalid(
                "PAYONCE_PAYOUT_KEYS=fresh-key-per-attempt needs a build with the demonstration (cargo build -p api --features demo); this one sends one key per payout"
                    .into(),
            ));
        }
        if self.payout_workers == 0 || self.payout_workers > 64 || self.payout_attempts == 0 {
            return Err(ConfigError::Invalid(
                "PAYONCE_PAYOUT_WORKERS must be 1 to 64, PAYONCE_PAYOUT_ATTEMPTS at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The workers' settings, sending to `bank_url`.
    pub fn settings(&self, bank_url: url::Url) -> PayoutSettings {
        PayoutSettings {
            bank_url,
            bank_timeout: self.bank_timeout,
            workers: self.payout_workers,
            lease: self.payout_lease,
            retry_base: self.payout_retry_base,
            retry_max: self.payout_retry_max,
            attempts: self.payout_attempts,
            throttle_max_age: self.payout_throttle_max_age,
            poll: self.payout_poll,
            #[cfg(feature = "demo")]
            fresh_key_per_attempt: self.payout_keys == PayoutKeys::FreshKeyPerAttempt,
        }
    }
}

/// `PAYONCE_BANK_URL`, when set: a URL payonce can call, http:// or https://.
pub fn bank_url(text: Option<&str>) -> Result<Option<url::Url>, ConfigError> {
    let Some(text) = text else {
        return Ok(None);
    };
    match url::Url::parse(text) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => Ok(Some(parsed)),
        _ => Err(ConfigError::Invalid(format!(
            "PAYONCE_BANK_URL {} is not an http:// or https:// URL",
            mask(text)
        ))),
    }
}
