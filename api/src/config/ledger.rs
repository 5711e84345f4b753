//! The ledger section: the database's pool and spend batches, how long to wait for it at
//! start-up, and how long tickets and their outcomes live.

use std::time::Duration;

use clap::Args;
use ledger::LedgerOptions;

use crate::config::section::{ConfigError, config_section, duration};

config_section! {
    /// The ledger's database and the lives of tickets.
    #[derive(Args, Debug, Clone)]
    pub struct LedgerConfig {
        /// How long a ticket stays usable.
        #[arg(env = "PAYONCE_TICKET_TTL", default_value = "24h", value_parser = duration)]
        pub ticket_ttl: Duration,
        /// How long after a ticket's expiry its stored outcome is kept (the ticket itself
        /// stays, so it can never run again).
        #[arg(env = "PAYONCE_RETENTION", default_value = "7days", value_parser = duration)]
        pub retention: Duration,
        /// How long a webhook delivery stays listed, and can be sent again by hand, after
        /// it ended; the reaper then deletes it with its attempts.
        #[arg(env = "PAYONCE_DELIVERY_RETENTION", default_value = "30days", value_parser = duration)]
        pub delivery_retention: Duration,
        /// How often expired tickets and old outcomes are reaped.
        #[arg(env = "PAYONCE_REAP_INTERVAL", default_value = "5m", value_parser = duration)]
        pub reap_interval: Duration,
        /// How often each instance records the holds past their expiry as expired (their
        /// release and their `hold.expired` events); `0s` turns it off. A hold past its
        /// expiry is expired to every reader at once, swept or not: the sweep is what
        /// announces it. Sweeps on many instances at once are safe; each costs one index
        /// probe when nothing is due.
        #[arg(env = "PAYONCE_HOLD_SWEEP", default_value = "1s", value_parser = duration)]
        pub hold_sweep: Duration,
        /// How often each instance audits the whole ledger for its metrics
        /// (`payonce_audit_violations`); `0s` turns it off. Every rule is a scan of its
        /// tables, so on a large ledger keep it rare, or turn it off and run `payonce audit`
        /// from one place on a schedule.
        #[arg(env = "PAYONCE_AUDIT_EVERY", default_value = "1h", value_parser = duration)]
        pub audit_every: Duration,
        /// Database connections per instance.
        #[arg(env = "PAYONCE_DB_MAX_CONNECTIONS", default_value_t = 16)]
        pub db_max_connections: u32,
        /// PostgreSQL: the most spends committed together in one batch (1: each spend its own
        /// transaction).
        #[arg(env = "PAYONCE_BATCH_MAX", default_value_t = 64)]
        pub batch_max: usize,
        /// PostgreSQL: how many batches of spends may be in flight at once (each account's
        /// spends always go in the same one's batches), and as many of holds' steps.
        #[arg(env = "PAYONCE_BATCH_WORKERS", default_value_t = 2)]
        pub batch_workers: usize,
        /// How long to keep trying to reach the database at start-up.
        #[arg(env = "PAYONCE_STARTUP_TIMEOUT", default_value = "30s", value_parser = duration)]
        pub startup_timeout: Duration,
    }
}

impl LedgerConfig {
    /// A pool and batches of at least one.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.db_max_connections == 0 {
            return Err(ConfigError::Invalid(
                "PAYONCE_DB_MAX_CONNECTIONS must be at least 1".into(),
            ));
        }
        if self.batch_max == 0 || self.batch_workers == 0 {
            return Err(ConfigError::Invalid(
                "PAYONCE_BATCH_MAX and PAYONCE_BATCH_WORKERS must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The options the ledger opens with.
    pub fn options(&self) -> LedgerOptions {
        LedgerOptions {
            max_connections: self.db_max_connections,
            batch_max: self.batch_max,
            batch_workers: self.batch_workers,
            ..LedgerOptions::default()
        }
    }
}
