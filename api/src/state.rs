//! The state every handler shares: the ledger, the locks, the settings, the metrics.

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderValue;
use ledger::{Ledger, LedgerError, LedgerOptions};
use lock::{LockOptions, LockService};

use crate::auth::OperatorKey;
use crate::config::{Config, ConfigError, LockUrl, Mode, Strategy};
use crate::demo::Recipes;
use crate::flights::Flights;
use crate::limits::{RateLimits, Rates};
use crate::metrics::Metrics;

/// The settings handlers read.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Lease of an account lock.
    pub lock_ttl: Duration,
    /// How long a spend waits for its account's lock.
    pub lock_wait: Duration,
    /// How long a new ticket stays usable.
    pub ticket_ttl: Duration,
    /// How long outcomes are kept after their ticket's expiry.
    pub retention: Duration,
    /// How often the reaper runs.
    pub reap_interval: Duration,
    /// How long a lock key goes unused before its state is pruned.
    pub lock_idle: Duration,
    /// The instance's strategy.
    pub strategy: Strategy,
    /// Whether the `Payonce-Strategy` and `Payonce-Fault` headers are honoured.
    pub demo: bool,
    /// This instance's name, sent as `Payonce-Instance`.
    pub instance: HeaderValue,
    /// The most requests worked on at once.
    pub max_in_flight: usize,
    /// The most client connections kept open.
    pub max_connections: usize,
    /// How long a request's head (or an idle connection's next one) may take.
    pub header_read_timeout: Duration,
    /// Where the client's address comes from, behind a proxy.
    pub client_ip_header: Option<axum::http::HeaderName>,
    /// The peers whose `client_ip_header` is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Who alone may create money, when set.
    pub operator_key: Option<OperatorKey>,
}

impl Settings {
    /// The settings in `config`.
    pub fn from_config(config: &Config) -> Self {
        Self {
            lock_ttl: config.lock_ttl,
            lock_wait: config.lock_wait,
            ticket_ttl: config.ticket_ttl,
            retention: config.retention,
            reap_interval: config.reap_interval,
            lock_idle: config.lock_idle,
            strategy: config.lock_strategy,
            demo: config.demo,
            instance: HeaderValue::from_str(&config.instance_name())
                .unwrap_or_else(|_| HeaderValue::from_static("payonce")),
            max_in_flight: config.max_in_flight,
            max_connections: config.max_connections,
            header_read_timeout: config.header_read_timeout,
            // Validated with the rest of the configuration.
            client_ip_header: config
                .client_ip_header
                .as_deref()
                .and_then(|name| axum::http::HeaderName::from_bytes(name.as_bytes()).ok()),
            trusted_proxies: config.trusted_proxies.clone(),
            operator_key: config
                .operator_key
                .as_ref()
                .map(|key| OperatorKey::new(key.expose())),
        }
    }
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Settings that cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The ledger could not be opened.
    #[error("cannot open the ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The lock store could not be set up.
    #[error("cannot set up the locks: {0}")]
    Lock(#[from] lock::LockError),
    /// The data directory could not be created.
    #[error("cannot create the data directory: {0}")]
    DataDir(#[from] std::io::Error),
}

/// Shared by every handler; cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    ledger: Ledger,
    locks: LockService,
    settings: Settings,
    /// Shared with the request-counting middleware, which holds it rather than the state.
    metrics: Arc<Metrics>,
    /// How fast clients may open accounts, take tickets and spend.
    limits: RateLimits,
    /// Tickets this instance is executing: duplicates wait here, not on the lock.
    flights: Flights,
    /// The unsafe strategies' locks, for the demonstration (distributed mode only).
    recipes: Recipes,
}

impl AppState {
    /// Assembles the state from its parts (no rate limits).
    pub fn new(ledger: Ledger, locks: LockService, settings: Settings) -> Self {
        Self::with_parts(
            ledger,
            locks,
            settings,
            RateLimits::none(),
            Recipes::default(),
        )
    }

    fn with_parts(
        ledger: Ledger,
        locks: LockService,
        settings: Settings,
        limits: RateLimits,
        recipes: Recipes,
    ) -> Self {
        Self(Arc::new(Inner {
            ledger,
            locks,
            settings,
            metrics: Arc::new(Metrics::new()),
            limits,
            flights: Flights::default(),
            recipes,
        }))
    }

    /// Opens the ledger (retrying while the database is unreachable, up to the start-up
    /// timeout) and sets up the locks, in the mode the configuration selects.
    pub async fn connect(config: &Config) -> Result<Self, StartError> {
        config.validate()?;
        let options = LedgerOptions {
            max_connections: config.db_max_connections,
            batch_max: config.batch_max,
            batch_workers: config.batch_workers,
            ..LedgerOptions::default()
        };
        let (ledger, locks, recipes) = match config.mode()? {
            Mode::Embedded { sqlite_path } => {
                if let Some(dir) = sqlite_path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                let ledger = Ledger::open_sqlite(&sqlite_path, &options).await?;
                let locks = lock::in_process(&lock_options(config));
                (ledger, locks, Recipes::default())
            }
            Mode::Distributed {
                database_url,
                locks,
            } => {
                let ledger =
                    open_with_retries(&database_url, &options, config.startup_timeout).await?;
                let (locks, recipes) = lock_service(&locks, config)?;
                (ledger, locks, recipes)
            }
        };
        let limits = RateLimits::new(&Rates {
            accounts_per_minute: config.accounts_per_minute,
            tickets_per_second: config.tickets_per_second,
            spends_per_second: config.spends_per_second,
            orders_per_second: config.orders_per_second,
            bad_keys_per_minute: config.bad_keys_per_minute,
        });
        Ok(Self::with_parts(
            ledger,
            locks,
            Settings::from_config(config),
            limits,
            recipes,
        ))
    }

    /// The ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.0.ledger
    }

    /// The account locks.
    pub fn locks(&self) -> &LockService {
        &self.0.locks
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.0.settings
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    /// The metrics, for a part of the service that outlives a borrow of the state.
    pub fn shared_metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.0.metrics)
    }

    /// The rate limits.
    pub fn limits(&self) -> &RateLimits {
        &self.0.limits
    }

    /// The tickets being executed.
    pub fn flights(&self) -> &Flights {
        &self.0.flights
    }

    /// The unsafe strategies' locks.
    pub fn recipes(&self) -> &Recipes {
        &self.0.recipes
    }
}

/// The lock options every lock service takes. ZooKeeper's session and etcd's lease last
/// `PAYONCE_LOCK_TTL`: the time after which a process that stopped heartbeating loses its
/// locks, as a Redis lock without renewal does. The stores that share a server or a
/// database with others are namespaced by `PAYONCE_REDIS_NAMESPACE`.
fn lock_options(config: &Config) -> LockOptions {
    LockOptions {
        namespace: config.redis_namespace.clone(),
        max_waiters: config.lock_max_waiters,
        lock_delay: config.lock_delay,
        idle: config.lock_idle,
        session: config.lock_ttl,
        ..LockOptions::default()
    }
}

/// The lock service `url` names, and the demonstration's recipes where they can run (they
/// are Redis recipes, on one server of their own).
fn lock_service(url: &LockUrl, config: &Config) -> Result<(LockService, Recipes), StartError> {
    let locks = lock::open(url.url(), &lock_options(config))?;
    let recipes = match url {
        LockUrl::Redis(url) => Recipes::open(url, &config.redlock_urls, &config.redis_namespace)?,
        _ => Recipes::default(),
    };
    Ok((locks, recipes))
}

/// A database that is still starting (docker-compose, a restart) is retried; anything
/// else fails at once.
async fn open_with_retries(
    url: &str,
    options: &LedgerOptions,
    timeout: Duration,
) -> Result<Ledger, LedgerError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match Ledger::open(url, options).await {
            Err(LedgerError::Unavailable(error)) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(%error, "database not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            result => return result,
        }
    }
}
