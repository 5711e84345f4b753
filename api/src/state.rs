//! The state every handler shares: the ledger, the locks, the settings, the metrics.

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderValue;
use futures::future::BoxFuture;
use ledger::{Ledger, LedgerError, LedgerOptions};
use lock::LockService;

#[cfg(feature = "demo")]
use crate::config::Strategy;
use crate::config::{Config, ConfigError, Mode, OperatorKey};
#[cfg(feature = "demo")]
use crate::demo::Recipes;
use crate::flights::Flights;
use crate::limits::RateLimits;
use crate::metrics::Metrics;
use crate::payouts::Payouts;
use crate::webhooks::Webhooks;
use crate::webhooks::inbox::Inbox;
use crate::webhooks::sealing::Sealer;

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
    /// How long an ended webhook delivery is kept.
    pub delivery_retention: Duration,
    /// How often the reaper runs.
    pub reap_interval: Duration,
    /// How often holds past their expiry are recorded expired (zero: never).
    pub hold_sweep: Duration,
    /// How often the ledger is audited for the metrics (zero: never).
    pub audit_every: Duration,
    /// How long a lock key goes unused before its state is pruned.
    pub lock_idle: Duration,
    /// The instance's strategy (the demonstration).
    #[cfg(feature = "demo")]
    pub strategy: Strategy,
    /// Whether the `Payonce-Strategy` and `Payonce-Fault` headers are honoured (the
    /// demonstration).
    #[cfg(feature = "demo")]
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
            lock_ttl: config.lock.lock_ttl,
            lock_wait: config.lock.lock_wait,
            ticket_ttl: config.ledger.ticket_ttl,
            retention: config.ledger.retention,
            delivery_retention: config.ledger.delivery_retention,
            reap_interval: config.ledger.reap_interval,
            hold_sweep: config.ledger.hold_sweep,
            audit_every: config.ledger.audit_every,
            lock_idle: config.lock.lock_idle,
            #[cfg(feature = "demo")]
            strategy: config.lock.lock_strategy,
            #[cfg(feature = "demo")]
            demo: config.demo,
            instance: HeaderValue::from_str(&config.instance_name())
                .unwrap_or_else(|_| HeaderValue::from_static("payonce")),
            max_in_flight: config.limits.max_in_flight,
            max_connections: config.limits.max_connections,
            header_read_timeout: config.limits.header_read_timeout,
            client_ip_header: config.limits.client_ip_header(),
            trusted_proxies: config.limits.trusted_proxies.clone(),
            operator_key: config.operator_key(),
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
    /// The bank client could not be set up.
    #[error("cannot set up the bank client: {0}")]
    Bank(String),
    /// The webhook client or the sealing key could not be set up.
    #[error("cannot set up webhooks: {0}")]
    Webhooks(String),
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
    /// The unsafe strategies' locks, for the demonstration (distributed mode on Redis
    /// only).
    #[cfg(feature = "demo")]
    recipes: Recipes,
    /// The bank and the payout workers' settings; `None` where payouts are refused.
    payouts: Option<Arc<Payouts>>,
    /// Webhooks: the sealer of secrets, the guarded client, the settings; `None` in a
    /// state assembled from parts.
    webhooks: Option<Arc<Webhooks>>,
}

impl Inner {
    fn new(ledger: Ledger, locks: LockService, settings: Settings, limits: RateLimits) -> Self {
        Self {
            ledger,
            locks,
            settings,
            metrics: Arc::new(Metrics::new()),
            limits,
            flights: Flights::default(),
            #[cfg(feature = "demo")]
            recipes: Recipes::default(),
            payouts: None,
            webhooks: None,
        }
    }
}

impl AppState {
    /// Assembles the state from its parts (no rate limits).
    pub fn new(ledger: Ledger, locks: LockService, settings: Settings) -> Self {
        Self(Arc::new(Inner::new(
            ledger,
            locks,
            settings,
            RateLimits::none(),
        )))
    }

    /// Opens the ledger (retrying while the database is unreachable, up to the start-up
    /// timeout) and sets up the locks, in the mode the configuration selects.
    ///
    /// Boxed so that its state machine — the ledger's opening and migrations, the lock
    /// service's connection, the embedded bank — is compiled once, in this library, rather
    /// than again in every crate that awaits it.
    #[inline(never)]
    pub fn connect(config: &Config) -> BoxFuture<'_, Result<Self, StartError>> {
        Box::pin(Self::connecting(config))
    }

    async fn connecting(config: &Config) -> Result<Self, StartError> {
        config.validate()?;
        let options = config.ledger.options();
        let lock_options = config.lock.options(&config.redis_namespace);
        let mode = config.mode()?;
        let lock_label = match &mode {
            Mode::Embedded { .. } => "in_process",
            Mode::Distributed { locks, .. } => locks.label(),
        };
        let (ledger, locks) = match mode {
            Mode::Embedded { sqlite_path } => {
                if let Some(dir) = sqlite_path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                let ledger = Ledger::open_sqlite(&sqlite_path, &options).await?;
                let locks = lock::in_process(&lock_options);
                (ledger, locks)
            }
            Mode::Distributed {
                database_url,
                locks,
            } => {
                let ledger =
                    open_with_retries(&database_url, &options, config.ledger.startup_timeout)
                        .await?;
                (ledger, lock::open(locks.url(), &lock_options)?)
            }
        };
        let limits = RateLimits::new(&config.limits.rates());
        let inner = Inner {
            metrics: Arc::new(Metrics::for_lock_service(lock_label)),
            ..Inner::new(ledger, locks, Settings::from_config(config), limits)
        };
        #[cfg(feature = "demo")]
        let inner = Inner {
            recipes: recipes(config)?,
            ..inner
        };
        let webhooks = webhooks(config, &inner.ledger).await?;
        let inner = Inner {
            payouts: payouts(config).await?.map(Arc::new),
            webhooks: Some(Arc::new(webhooks)),
            ..inner
        };
        Ok(Self(Arc::new(inner)))
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

    /// Payouts: the bank and the workers' settings, where this instance has a bank.
    pub fn payouts(&self) -> Option<&Arc<Payouts>> {
        self.0.payouts.as_ref()
    }

    /// Webhooks, where the state was connected from a configuration.
    pub fn webhooks(&self) -> Option<&Arc<Webhooks>> {
        self.0.webhooks.as_ref()
    }

    /// The tickets being executed.
    pub fn flights(&self) -> &Flights {
        &self.0.flights
    }

    /// The unsafe strategies' locks.
    #[cfg(feature = "demo")]
    pub fn recipes(&self) -> &Recipes {
        &self.0.recipes
    }
}

/// The recipes `config` can run: they are recipes on one Redis server, so only in the
/// distributed mode on plain Redis (none on a cluster, a Sentinel or another store).
#[cfg(feature = "demo")]
fn recipes(config: &Config) -> Result<Recipes, StartError> {
    match config.mode()?.one_redis() {
        Some(locks) => Ok(Recipes::open(
            locks.url(),
            &config.lock.redlock_urls,
            &config.redis_namespace,
        )?),
        None => Ok(Recipes::default()),
    }
}

/// Payouts as the configuration sets them up: to `PAYONCE_BANK_URL`; without one, in the
/// embedded mode to a bank in this process (its store beside the ledger's file), and in
/// the distributed mode none — instances must share one bank, and one in each would not
/// be one.
async fn payouts(config: &Config) -> Result<Option<Payouts>, StartError> {
    let settings = |bank_url| config.payouts.settings(bank_url);
    let bank_url = crate::payouts::config::bank_url(config.bank_url.as_deref())?;
    match (bank_url, config.mode()?) {
        (Some(bank_url), _) => Payouts::new(settings(bank_url))
            .map(Some)
            .map_err(|error| StartError::Bank(error.to_string())),
        (None, Mode::Embedded { sqlite_path }) => {
            let store = sqlite_path.with_file_name("payonce-bank.db");
            Payouts::in_process(settings, &format!("sqlite:{}", store.display()))
                .await
                .map(Some)
                .map_err(StartError::Bank)
        }
        (None, Mode::Distributed { .. }) => Ok(None),
    }
}

/// The name the database keeps the webhook sealing key under, when
/// `PAYONCE_WEBHOOK_KEY` is not set.
const SEALING_KEY_NAME: &str = "webhook-secrets";

/// Webhooks as the configuration sets them up, with their sealing key: the configured
/// one, else the database's (made by the first instance that asks).
async fn webhooks(config: &Config, ledger: &Ledger) -> Result<Webhooks, StartError> {
    let key = match config.webhooks.key_bytes()? {
        Some(key) => key,
        None => {
            let fresh: [u8; 32] = rand::random();
            ledger.sealing_key(SEALING_KEY_NAME, &fresh).await?
        }
    };
    let sealer = Sealer::new(&key).map_err(StartError::Webhooks)?;
    let settings = config.webhooks.settings();
    // The embedded mode hosts a demonstration inbox, as it hosts a bank.
    let inbox = match config.mode()? {
        Mode::Embedded { .. } => Some(
            Inbox::start()
                .await
                .map_err(|error| StartError::Webhooks(format!("the inbox: {error}")))?,
        ),
        Mode::Distributed { .. } => None,
    };
    Webhooks::new(settings, sealer, inbox).map_err(|error| StartError::Webhooks(error.to_string()))
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
