//! The lock section: the account locks' timings and queue, the strategy that serialises
//! spends, and the lock service a URL names ([`LockUrl`]).

use std::time::Duration;

use clap::Args;
use lock::{LockOptions, LockServiceKind};

use crate::config::section::{ConfigError, config_section, duration, mask, shown_by_name};

config_section! {
    /// How spends wait for, hold and give up an account's lock.
    #[derive(Args, Debug, Clone)]
    pub struct LockConfig {
        /// Lease of an account lock; the holder renews it every third of this.
        #[arg(env = "PAYONCE_LOCK_TTL", default_value = "10s", value_parser = duration)]
        pub lock_ttl: Duration,
        /// Chubby's lock-delay: after an account's lock holder vanished without releasing
        /// (crashed, cut off), nobody takes the account for this long past its lease — more
        /// time for a holder that only paused to notice. A released lock is free at once.
        #[arg(env = "PAYONCE_LOCK_DELAY", default_value = "0s", value_parser = duration)]
        pub lock_delay: Duration,
        /// How long a spend waits for a busy account (or for its own duplicate to finish)
        /// before answering 409.
        #[arg(env = "PAYONCE_LOCK_WAIT", default_value = "2s", value_parser = duration)]
        pub lock_wait: Duration,
        /// How long a lock key must have gone unused before the lock service forgets its
        /// state (fencing counter, queue): a store that expires state by itself uses it as the
        /// expiry, the others prune at each reaping. Bounds what the lock service holds when
        /// every order is a key of its own.
        #[arg(env = "PAYONCE_LOCK_IDLE", default_value = "1h", value_parser = duration)]
        pub lock_idle: Duration,
        /// How spends serialise on an account. `fenced` is the only safe one; the others are
        /// the classic recipes, kept to show how they spend money twice (only in a build with
        /// the cargo feature `demo`).
        #[arg(env = "PAYONCE_LOCK_STRATEGY", value_enum, default_value_t = Strategy::Fenced)]
        pub lock_strategy: Strategy,
        /// The most spends one account may have waiting for its lock (or asking the lock
        /// store for it) in this instance, and in the lock store's queue across all
        /// instances; past it, a spend is answered 409 account-busy at once.
        #[arg(env = "PAYONCE_LOCK_MAX_WAITERS", default_value_t = lock::DEFAULT_MAX_WAITERS)]
        pub lock_max_waiters: usize,
        /// Independent Redis servers for the `redlock` strategy (at least 3), comma-separated.
        #[arg(env = "PAYONCE_REDLOCK_URLS", value_delimiter = ',', value_hint = clap::ValueHint::Url)]
        pub redlock_urls: Vec<String>,
    }
}

impl LockConfig {
    /// A lease long enough to renew, and idle state kept at least a lease.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.lock_ttl < Duration::from_millis(100) {
            return Err(ConfigError::Invalid(
                "PAYONCE_LOCK_TTL must be at least 100ms".into(),
            ));
        }
        if self.lock_idle < self.lock_ttl {
            // A key idle for less than a lease may still have a holder.
            return Err(ConfigError::Invalid(
                "PAYONCE_LOCK_IDLE must be at least PAYONCE_LOCK_TTL".into(),
            ));
        }
        Ok(())
    }

    /// The options every lock service takes. ZooKeeper's session and etcd's lease last
    /// `PAYONCE_LOCK_TTL`: the time after which a process that stopped heartbeating loses
    /// its locks, as a Redis lock without renewal does. The stores that share a server or a
    /// database with others are namespaced by `namespace` (`PAYONCE_REDIS_NAMESPACE`).
    pub fn options(&self, namespace: &str) -> LockOptions {
        LockOptions {
            namespace: namespace.to_owned(),
            max_waiters: self.lock_max_waiters,
            lock_delay: self.lock_delay,
            idle: self.lock_idle,
            session: self.lock_ttl,
            ..LockOptions::default()
        }
    }
}

/// How spends on one account are kept apart.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// The account lock with fencing tokens, and the ledger's conditional update that
    /// checks them. The default, and the only safe one.
    Fenced,
    /// No lock: read the balance, check it, write the new balance.
    None,
    /// SETNX, then EXPIRE, released with DEL; read-check-write.
    SetnxExpire,
    /// The timestamp lock with GETSET take-over; read-check-write.
    Getset,
    /// The instance's own lock service (whichever PAYONCE_LOCK_URL names), its fencing
    /// token ignored: the application trusts the lock alone; read-check-write.
    Unfenced,
    /// Redlock over PAYONCE_REDLOCK_URLS, no fencing check; read-check-write.
    Redlock,
}

impl Strategy {
    /// Every strategy, safest first.
    pub const ALL: [Strategy; 6] = [
        Strategy::Fenced,
        Strategy::None,
        Strategy::SetnxExpire,
        Strategy::Getset,
        Strategy::Unfenced,
        Strategy::Redlock,
    ];

    /// The name in configuration and headers.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fenced => "fenced",
            Self::None => "none",
            Self::SetnxExpire => "setnx-expire",
            Self::Getset => "getset",
            Self::Unfenced => "unfenced",
            Self::Redlock => "redlock",
        }
    }

    /// Parses a name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|strategy| strategy.name() == name.trim())
    }
}

shown_by_name!(Strategy);

/// A lock service and the URL that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockUrl {
    kind: LockServiceKind,
    url: String,
}

impl LockUrl {
    /// Reads a URL by its scheme.
    pub fn parse(url: &str) -> Result<Self, ConfigError> {
        let Some(kind) = LockServiceKind::of_scheme(url) else {
            return Err(ConfigError::Invalid(format!(
                "PAYONCE_LOCK_URL must start with {}, got {}",
                LockServiceKind::SCHEMES,
                mask(url)
            )));
        };
        // A service this binary was built without is refused here, before anything
        // connects, naming the cargo feature that builds it.
        if let Some(why) = kind.not_built() {
            return Err(ConfigError::Invalid(format!("PAYONCE_LOCK_URL: {why}")));
        }
        Ok(Self {
            kind,
            url: url.to_owned(),
        })
    }

    /// One Redis server (`REDIS_URL`'s).
    pub fn redis(url: &str) -> Self {
        Self {
            kind: LockServiceKind::Redis,
            url: url.to_owned(),
        }
    }

    /// Which service.
    pub fn kind(&self) -> LockServiceKind {
        self.kind
    }

    /// The service's name, as printed.
    pub fn service(&self) -> &'static str {
        self.kind.name()
    }

    /// The service's name as a metric label (`lock_service`).
    pub fn label(&self) -> &'static str {
        self.kind.label()
    }

    /// The URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}
