//! The webhooks section: where endpoints may be, how deliveries are paced and retried,
//! and the key that seals endpoint secrets.

use std::time::Duration;

use clap::Args;
use ipnet::IpNet;

use super::WebhookSettings;
use crate::config::section::{ConfigError, Secret, Shown, config_section, duration, network};

config_section! {
    /// Webhook delivery.
    #[derive(Args, Debug, Clone)]
    pub struct WebhookConfig {
        /// Whether webhook endpoints may be loopback, private or link-local addresses (cloud
        /// metadata addresses never are). Off: a client could otherwise make payonce call
        /// services inside its own network. The tests, the demonstration and the README's
        /// walkthrough set it.
        #[arg(env = "PAYONCE_WEBHOOK_ALLOW_PRIVATE", default_value_t = false)]
        pub webhook_allow_private: bool,
        /// When set, the only networks webhook endpoints may be in (CIDR blocks or addresses,
        /// comma-separated): an egress allow-list on top of the other refusals.
        #[arg(env = "PAYONCE_WEBHOOK_ALLOWED_NETWORKS", value_delimiter = ',', value_parser = network)]
        pub webhook_allowed_networks: Vec<IpNet>,
        /// How long one webhook attempt may take, the receiver's answer included.
        #[arg(env = "PAYONCE_WEBHOOK_TIMEOUT", default_value = "15s", value_parser = duration)]
        pub webhook_timeout: Duration,
        /// The waits before the second, third, … attempt of a webhook delivery,
        /// comma-separated; once they have run out the delivery is exhausted. The default is
        /// the Standard Webhooks specification's (each wait gets up to a tenth of jitter).
        #[arg(env = "PAYONCE_WEBHOOK_RETRY_SCHEDULE", default_value = "5s,5m,30m,2h,5h,10h,10h", value_parser = schedule)]
        pub webhook_retry_schedule: Schedule,
        /// Webhook deliveries in flight at once in this instance: a receiver that never
        /// answers holds one for the timeout.
        #[arg(env = "PAYONCE_WEBHOOK_CONCURRENCY", default_value_t = 64)]
        pub webhook_concurrency: usize,
        /// Webhook deliveries to one endpoint in flight at once in this instance: an endpoint
        /// that never answers holds at most this many slots, and the rest stay free for
        /// everyone else's.
        #[arg(env = "PAYONCE_WEBHOOK_PER_ENDPOINT", default_value_t = 8)]
        pub webhook_per_endpoint: usize,
        /// How long a claimed webhook delivery is this instance's before another may take it
        /// over (an instance that died mid-delivery). At least twice the timeout.
        #[arg(env = "PAYONCE_WEBHOOK_LEASE", default_value = "60s", value_parser = duration)]
        pub webhook_lease: Duration,
        /// The longest an idle instance waits before it looks for due webhook deliveries:
        /// commits that queue some wake it at once (its own, and on PostgreSQL every
        /// instance's, by a notification), and it wakes when the next one it knows of is
        /// due. The poll finds what no bell announced: a dead instance's deliveries once
        /// their leases end.
        #[arg(env = "PAYONCE_WEBHOOK_POLL", default_value = "10s", value_parser = duration)]
        pub webhook_poll: Duration,
        /// How long the secret before a rotation keeps signing beside the new one.
        #[arg(env = "PAYONCE_WEBHOOK_ROTATION_WINDOW", default_value = "24h", value_parser = duration)]
        pub webhook_rotation_window: Duration,
        /// The key that seals webhook secrets in the database: 32 bytes, in hex or base64.
        /// Unset, a key is made once and kept in the database itself (every instance reads
        /// the same): set it to keep a copy of the database alone from signing anything.
        #[arg(env = "PAYONCE_WEBHOOK_KEY", hide_env_values = true)]
        pub webhook_key: Option<Secret>,
    }
    unset {
        webhook_allowed_networks => "(unset: any the guard allows)",
        webhook_key => "(unset: kept in the database)",
    }
}

/// A retry schedule: the waits between attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule(pub Vec<Duration>);

/// `5s,5m,30m`: a schedule (empty for a single attempt).
fn schedule(text: &str) -> Result<Schedule, humantime::DurationError> {
    text.split(',')
        .map(str::trim)
        .filter(|step| !step.is_empty())
        .map(duration)
        .collect::<Result<Vec<_>, _>>()
        .map(Schedule)
}

/// Every wait, even none: an empty schedule is set (a single attempt), not unset.
impl Shown for Schedule {
    fn shown(&self) -> Option<Vec<String>> {
        Some(self.0.iter().filter_map(Shown::shown).flatten().collect())
    }
}

impl WebhookConfig {
    /// A webhook schedule that can work: positive timeout and poll, a lease that outlasts
    /// an attempt and its recording, some concurrency, a key of the right size.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.webhook_timeout.is_zero() || self.webhook_poll.is_zero() {
            return Err(ConfigError::Invalid(
                "PAYONCE_WEBHOOK_TIMEOUT and PAYONCE_WEBHOOK_POLL must be positive".into(),
            ));
        }
        if self.webhook_lease < self.webhook_timeout * 2 {
            // Shorter, another instance would take a delivery over while its receiver is
            // still within the timeout: a duplicate for no reason.
            return Err(ConfigError::Invalid(
                "PAYONCE_WEBHOOK_LEASE must be at least twice PAYONCE_WEBHOOK_TIMEOUT".into(),
            ));
        }
        if self.webhook_concurrency == 0 || self.webhook_concurrency > 4096 {
            return Err(ConfigError::Invalid(
                "PAYONCE_WEBHOOK_CONCURRENCY must be 1 to 4096".into(),
            ));
        }
        if self.webhook_per_endpoint == 0 || self.webhook_per_endpoint > self.webhook_concurrency {
            return Err(ConfigError::Invalid(
                "PAYONCE_WEBHOOK_PER_ENDPOINT must be 1 to PAYONCE_WEBHOOK_CONCURRENCY".into(),
            ));
        }
        if self.webhook_retry_schedule.0.len() > 32 {
            return Err(ConfigError::Invalid(
                "PAYONCE_WEBHOOK_RETRY_SCHEDULE has at most 32 waits".into(),
            ));
        }
        self.key_bytes()?;
        Ok(())
    }

    /// The webhook sealing key `PAYONCE_WEBHOOK_KEY` holds, if set: 32 bytes from hex or
    /// base64.
    pub fn key_bytes(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        use base64::Engine;
        let Some(text) = self.webhook_key.as_ref().map(|key| key.expose().trim()) else {
            return Ok(None);
        };
        let bytes = hex::decode(text)
            .ok()
            .or_else(|| base64::engine::general_purpose::STANDARD.decode(text).ok())
            .filter(|bytes| bytes.len() == 32)
            .ok_or_else(|| {
                ConfigError::Invalid(
                    "PAYONCE_WEBHOOK_KEY must be 32 bytes in hex (64 digits) or base64".into(),
                )
            })?;
        Ok(Some(bytes))
    }

    /// The delivery settings.
    pub fn settings(&self) -> WebhookSettings {
        WebhookSettings {
            timeout: self.webhook_timeout,
            schedule: self.webhook_retry_schedule.0.clone(),
            concurrency: self.webhook_concurrency,
            per_endpoint: self.webhook_per_endpoint,
            lease: self.webhook_lease,
            poll: self.webhook_poll,
            allow_private: self.webhook_allow_private,
            allowed_networks: self.webhook_allowed_networks.clone(),
            rotation_window: self.webhook_rotation_window,
        }
    }
}
