//! Configuration: flags and environment variables (every flag has one), the running mode
//! they select, and how they are printed at start-up.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

/// `payonce --version`: the version, and whether this build has the demonstration's
/// unsafe strategies (the matrix checks it before it starts instances).
pub const VERSION: &str = if cfg!(feature = "demo") {
    concat!(env!("CARGO_PKG_VERSION"), " (with the demo feature)")
} else {
    env!("CARGO_PKG_VERSION")
};

/// `payonce [serve]`, `payonce audit` or `payonce reconcile`.
#[derive(Parser, Debug, Clone)]
#[command(name = "payonce", version = VERSION, about = "An idempotent payment service.")]
pub struct Cli {
    /// What to do; serving is the default.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Settings shared by every command.
    #[command(flatten)]
    pub config: Config,
}

/// The commands.
#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Serve the HTTP API (the default).
    Serve,
    /// Check every ledger invariant; print what is wrong and exit 1 if anything is.
    Audit {
        /// Print the violations as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Compare the ledger's payouts with the bank's transfers; print what disagrees (and
    /// the pending payouts, with their age) and exit 1 if anything does.
    Reconcile {
        /// The bank's base URL (default: PAYONCE_BANK_URL).
        #[arg(long)]
        bank: Option<String>,
    },
}

fn duration(text: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(text)
}

/// A CIDR block (`10.0.0.0/8`, `fd00::/8`) or one address (`10.0.0.7`: a block of one).
fn proxy_network(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map(|network| network.trunc())
        .map_err(|_| format!("{text:?} is neither a CIDR block (10.0.0.0/8) nor an address"))
}

/// A setting that is a secret: shown as `****` wherever the configuration is printed or
/// debugged.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self(text.to_owned()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(****)")
    }
}

/// Every setting. Each flag can also be given as the environment variable shown.
#[derive(Args, Debug, Clone)]
pub struct Config {
    /// Address to listen on.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub addr: SocketAddr,
    /// PostgreSQL URL. With REDIS_URL: the distributed mode. With neither: embedded.
    #[arg(long, global = true, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Redis URL for the locks. With DATABASE_URL: the distributed mode. (The same as
    /// PAYONCE_LOCK_URL=redis://….)
    #[arg(long, global = true, env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// The lock service, for the distributed mode: `redis://host:port[/db]`,
    /// `zk://host:port[,host:port…][/root]` (ZooKeeper),
    /// `etcd://host:port[,host:port…][/root]`,
    /// `hazelcast://host:port[,host:port…][/<cp-group>][?cluster=<name>]`, and the others
    /// docs/configuration.md lists.
    #[arg(long, global = true, env = "PAYONCE_LOCK_URL")]
    pub lock_url: Option<String>,
    /// Prefix of every Redis key and channel, so deployments can share a Redis.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_REDIS_NAMESPACE",
        default_value = "payonce"
    )]
    pub redis_namespace: String,
    /// Where the embedded mode keeps its SQLite file.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_DATA_DIR",
        default_value = "./data"
    )]
    pub data_dir: PathBuf,
    /// Lease of an account lock; the holder renews it every third of this.
    #[arg(long, global = true, env = "PAYONCE_LOCK_TTL", default_value = "10s", value_parser = duration)]
    pub lock_ttl: Duration,
    /// Chubby's lock-delay: after an account's lock holder vanished without releasing
    /// (crashed, cut off), nobody takes the account for this long past its lease — more
    /// time for a holder that only paused to notice. A released lock is free at once.
    #[arg(long, global = true, env = "PAYONCE_LOCK_DELAY", default_value = "0s", value_parser = duration)]
    pub lock_delay: Duration,
    /// How long a spend waits for a busy account (or for its own duplicate to finish)
    /// before answering 409.
    #[arg(long, global = true, env = "PAYONCE_LOCK_WAIT", default_value = "2s", value_parser = duration)]
    pub lock_wait: Duration,
    /// How long a ticket stays usable.
    #[arg(long, global = true, env = "PAYONCE_TICKET_TTL", default_value = "24h", value_parser = duration)]
    pub ticket_ttl: Duration,
    /// How long after a ticket's expiry its stored outcome is kept (the ticket itself
    /// stays, so it can never run again).
    #[arg(long, global = true, env = "PAYONCE_RETENTION", default_value = "7days", value_parser = duration)]
    pub retention: Duration,
    /// How often expired tickets and old outcomes are reaped.
    #[arg(long, global = true, env = "PAYONCE_REAP_INTERVAL", default_value = "5m", value_parser = duration)]
    pub reap_interval: Duration,
    /// How often each instance audits the whole ledger for its metrics
    /// (`payonce_audit_violations`); `0s` turns it off. Every rule is a scan of its
    /// tables, so on a large ledger keep it rare, or turn it off and run `payonce audit`
    /// from one place on a schedule.
    #[arg(long, global = true, env = "PAYONCE_AUDIT_EVERY", default_value = "1h", value_parser = duration)]
    pub audit_every: Duration,
    /// How long a lock key must have gone unused before the lock service forgets its
    /// state (fencing counter, queue): a store that expires state by itself uses it as the
    /// expiry, the others prune at each reaping. Bounds what the lock service holds when
    /// every order is a key of its own.
    #[arg(long, global = true, env = "PAYONCE_LOCK_IDLE", default_value = "1h", value_parser = duration)]
    pub lock_idle: Duration,
    /// Longest a request may take before it is answered 503.
    #[arg(long, global = true, env = "PAYONCE_REQUEST_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub request_timeout: Duration,
    /// Database connections per instance.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_DB_MAX_CONNECTIONS",
        default_value_t = 16
    )]
    pub db_max_connections: u32,
    /// PostgreSQL: the most spends committed together in one batch (1: each spend its own
    /// transaction).
    #[arg(long, global = true, env = "PAYONCE_BATCH_MAX", default_value_t = 64)]
    pub batch_max: usize,
    /// PostgreSQL: how many batches of spends may be in flight at once (each account's
    /// spends always go in the same one's batches).
    #[arg(
        long,
        global = true,
        env = "PAYONCE_BATCH_WORKERS",
        default_value_t = 2
    )]
    pub batch_workers: usize,
    /// How long to keep trying to reach the database at start-up.
    #[arg(long, global = true, env = "PAYONCE_STARTUP_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub startup_timeout: Duration,
    /// This instance's name in the `Payonce-Instance` response header (default: the
    /// listen address).
    #[arg(long, global = true, env = "PAYONCE_INSTANCE")]
    pub instance: Option<String>,
    /// How spends serialise on an account. `fenced` is the only safe one; the others are
    /// the classic recipes, kept to show how they spend money twice (only in a build with
    /// the cargo feature `demo`).
    #[arg(long, global = true, env = "PAYONCE_LOCK_STRATEGY", value_enum, default_value_t = Strategy::Fenced)]
    pub lock_strategy: Strategy,
    /// The demonstration mode: honour the `Payonce-Fault` and `Payonce-Strategy` request
    /// headers. Only in a build with the cargo feature `demo` (one without it refuses to
    /// start with this set). Never in production.
    #[arg(long, global = true, env = "PAYONCE_DEMO", default_value_t = false)]
    pub demo: bool,
    /// How log lines are written: `text`, human-readable, or `json`, one object per line
    /// with the trace and span ids (traces go to `OTEL_EXPORTER_OTLP_ENDPOINT` when set).
    #[arg(long, global = true, env = "PAYONCE_LOG_FORMAT", value_enum, default_value_t = crate::telemetry::LogFormat::Text)]
    pub log_format: crate::telemetry::LogFormat,
    /// The most spends one account may have waiting for its lock (or asking the lock
    /// store for it) in this instance, and in the lock store's queue across all
    /// instances; past it, a spend is answered 409 account-busy at once.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_LOCK_MAX_WAITERS",
        default_value_t = lock::DEFAULT_MAX_WAITERS
    )]
    pub lock_max_waiters: usize,
    /// The most requests this instance works on at once; past it, 503 overloaded.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_MAX_IN_FLIGHT",
        default_value_t = 1024
    )]
    pub max_in_flight: usize,
    /// The most client connections this instance keeps open; past it, new ones wait to
    /// be accepted. Keep it below the process's file-descriptor limit.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_MAX_CONNECTIONS",
        default_value_t = 4096
    )]
    pub max_connections: usize,
    /// How long a client may take to send a request's head — and how long an idle
    /// keep-alive connection waits for its next request — before it is closed.
    #[arg(long, global = true, env = "PAYONCE_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub header_read_timeout: Duration,
    /// Accounts one client address may open per minute (in a burst, or spread out); 0:
    /// no limit.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_ACCOUNTS_PER_MINUTE",
        default_value_t = 1200
    )]
    pub accounts_per_minute: u32,
    /// Tickets one account may take per second; 0: no limit.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_TICKETS_PER_SECOND",
        default_value_t = 200
    )]
    pub tickets_per_second: u32,
    /// Spends (withdrawals, deposits, draws, replays included) one account may send per
    /// second; 0: no limit.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_SPENDS_PER_SECOND",
        default_value_t = 200
    )]
    pub spends_per_second: u32,
    /// Orders one account may place per second; 0: no limit.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_ORDERS_PER_SECOND",
        default_value_t = 200
    )]
    pub orders_per_second: u32,
    /// Unknown or wrong API keys (or operator keys) one client address may send per
    /// minute (in a burst, or spread out); past it, 429 before the key is looked up. 0:
    /// no limit.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_BAD_KEYS_PER_MINUTE",
        default_value_t = 60
    )]
    pub bad_keys_per_minute: u32,
    /// A header carrying the client's address, set by a proxy in front (`x-real-ip`, or
    /// `x-forwarded-for`); read only from the peers in PAYONCE_TRUSTED_PROXIES, so the
    /// per-address limits count clients instead of the proxy.
    #[arg(long, global = true, env = "PAYONCE_CLIENT_IP_HEADER")]
    pub client_ip_header: Option<String>,
    /// The proxies whose PAYONCE_CLIENT_IP_HEADER is believed: CIDR blocks or addresses,
    /// comma-separated. Any other peer is the client itself, whatever it sends.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_TRUSTED_PROXIES",
        value_delimiter = ',',
        value_parser = proxy_network
    )]
    pub trusted_proxies: Vec<IpNet>,
    /// When set, opening an account with money or points, and every deposit, need
    /// `Authorization: Bearer <this key>`; unset, anyone may (the demonstration). At least
    /// 16 visible ASCII characters. A secret: prefer the environment variable to the flag.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_OPERATOR_KEY",
        hide_env_values = true
    )]
    pub operator_key: Option<Secret>,
    /// Independent Redis servers for the `redlock` strategy (at least 3), comma-separated.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_REDLOCK_URLS",
        value_delimiter = ','
    )]
    pub redlock_urls: Vec<String>,
    /// The bank payouts go to (`payonce-bank` or anything with its contract). Unset in
    /// the embedded mode: payonce starts one in the process, on a loopback port of its own,
    /// with its store beside the ledger's file. Unset in the distributed mode: payouts are
    /// refused (503 `payouts-unavailable`), since instances must share one bank.
    #[arg(long, global = true, env = "PAYONCE_BANK_URL")]
    pub bank_url: Option<String>,
    /// How long one call to the bank may take; past it the attempt's outcome is unknown
    /// and the payout is sent again, with the same key.
    #[arg(long, global = true, env = "PAYONCE_BANK_TIMEOUT", default_value = "2s", value_parser = duration)]
    pub bank_timeout: Duration,
    /// Payout workers in this instance: each claims due payouts and calls the bank.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_PAYOUT_WORKERS",
        default_value_t = 4
    )]
    pub payout_workers: usize,
    /// How long a claimed payout is a worker's before another instance may take it over
    /// (a worker that died mid-call). At least three bank timeouts.
    #[arg(long, global = true, env = "PAYONCE_PAYOUT_LEASE", default_value = "30s", value_parser = duration)]
    pub payout_lease: Duration,
    /// The first wait before a payout is sent again (a timeout, a 5xx, a 429); it doubles
    /// with each attempt, with jitter, up to PAYONCE_PAYOUT_RETRY_MAX — or the bank's
    /// `Retry-After`, when it says one.
    #[arg(long, global = true, env = "PAYONCE_PAYOUT_RETRY_BASE", default_value = "200ms", value_parser = duration)]
    pub payout_retry_base: Duration,
    /// The longest wait between two attempts of a payout.
    #[arg(long, global = true, env = "PAYONCE_PAYOUT_RETRY_MAX", default_value = "1m", value_parser = duration)]
    pub payout_retry_max: Duration,
    /// Attempts without the bank's word after which payonce asks the bank for the
    /// transfer by its key — and, if the bank has none, closes the key there and credits
    /// the money back. A bank that does not answer leaves the payout pending. Attempts
    /// the bank throttled (429) do not count: see PAYONCE_PAYOUT_THROTTLE_MAX_AGE.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_PAYOUT_ATTEMPTS",
        default_value_t = 10
    )]
    pub payout_attempts: u32,
    /// How old a payout may grow while the bank keeps throttling it (429, with or without
    /// `Retry-After`) before payonce asks the bank for it by key, as it does after
    /// PAYONCE_PAYOUT_ATTEMPTS. A bank that asks to wait has not refused, so throttles
    /// count toward no attempt budget; this bounds them by time instead.
    #[arg(long, global = true, env = "PAYONCE_PAYOUT_THROTTLE_MAX_AGE", default_value = "1h", value_parser = duration)]
    pub payout_throttle_max_age: Duration,
    /// How often idle payout workers look for due payouts (new ones of this instance wake
    /// them at once).
    #[arg(long, global = true, env = "PAYONCE_PAYOUT_POLL", default_value = "500ms", value_parser = duration)]
    pub payout_poll: Duration,
    /// The bank's idempotency key per payout: `one-key`, the same on every attempt (the
    /// only safe one), or `fresh-key-per-attempt`, a new key each retry as clients without
    /// a key scheme send — it pays twice; the demonstration's (only in a build with the
    /// cargo feature `demo`).
    #[arg(long, global = true, env = "PAYONCE_PAYOUT_KEYS", value_enum, default_value_t = PayoutKeys::OneKey)]
    pub payout_keys: PayoutKeys,
    /// Whether webhook endpoints may be loopback, private or link-local addresses (cloud
    /// metadata addresses never are). Off: a client could otherwise make payonce call
    /// services inside its own network. The tests, the demonstration and the README's
    /// walkthrough set it.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_WEBHOOK_ALLOW_PRIVATE",
        default_value_t = false
    )]
    pub webhook_allow_private: bool,
    /// When set, the only networks webhook endpoints may be in (CIDR blocks or addresses,
    /// comma-separated): an egress allow-list on top of the other refusals.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_WEBHOOK_ALLOWED_NETWORKS",
        value_delimiter = ',',
        value_parser = proxy_network
    )]
    pub webhook_allowed_networks: Vec<IpNet>,
    /// How long one webhook attempt may take, the receiver's answer included.
    #[arg(long, global = true, env = "PAYONCE_WEBHOOK_TIMEOUT", default_value = "15s", value_parser = duration)]
    pub webhook_timeout: Duration,
    /// The waits before the second, third, … attempt of a webhook delivery,
    /// comma-separated; once they have run out the delivery is exhausted. The default is
    /// the Standard Webhooks specification's (each wait gets up to a tenth of jitter).
    #[arg(
        long,
        global = true,
        env = "PAYONCE_WEBHOOK_RETRY_SCHEDULE",
        default_value = "5s,5m,30m,2h,5h,10h,10h",
        value_parser = schedule
    )]
    pub webhook_retry_schedule: Schedule,
    /// Webhook deliveries in flight at once in this instance: a receiver that never
    /// answers holds one for the timeout.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_WEBHOOK_CONCURRENCY",
        default_value_t = 64
    )]
    pub webhook_concurrency: usize,
    /// Webhook deliveries to one endpoint in flight at once in this instance: an endpoint
    /// that never answers holds at most this many slots, and the rest stay free for
    /// everyone else's.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_WEBHOOK_PER_ENDPOINT",
        default_value_t = 8
    )]
    pub webhook_per_endpoint: usize,
    /// How long a claimed webhook delivery is this instance's before another may take it
    /// over (an instance that died mid-delivery). At least twice the timeout.
    #[arg(long, global = true, env = "PAYONCE_WEBHOOK_LEASE", default_value = "60s", value_parser = duration)]
    pub webhook_lease: Duration,
    /// How often an idle instance looks for due webhook deliveries (its own commits wake
    /// it at once).
    #[arg(long, global = true, env = "PAYONCE_WEBHOOK_POLL", default_value = "250ms", value_parser = duration)]
    pub webhook_poll: Duration,
    /// How long the secret before a rotation keeps signing beside the new one.
    #[arg(long, global = true, env = "PAYONCE_WEBHOOK_ROTATION_WINDOW", default_value = "24h", value_parser = duration)]
    pub webhook_rotation_window: Duration,
    /// The key that seals webhook secrets in the database: 32 bytes, in hex or base64.
    /// Unset, a key is made once and kept in the database itself (every instance reads
    /// the same): set it to keep a copy of the database alone from signing anything.
    #[arg(
        long,
        global = true,
        env = "PAYONCE_WEBHOOK_KEY",
        hide_env_values = true
    )]
    pub webhook_key: Option<String>,
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

impl Config {
    /// The webhook sealing key `PAYONCE_WEBHOOK_KEY` holds, if set: 32 bytes from hex or
    /// base64.
    pub fn webhook_key_bytes(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        use base64::Engine;
        let Some(text) = self.webhook_key.as_deref().map(str::trim) else {
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

/// The shortest operator key accepted: guesses are bounded per client address
/// (`PAYONCE_BAD_KEYS_PER_MINUTE`), not in total, so the key itself must be hard to guess.
pub const MIN_OPERATOR_KEY: usize = 16;

/// Where the ledger and the locks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// One instance: a SQLite file and in-process locks.
    Embedded {
        /// The ledger's file.
        sqlite_path: PathBuf,
    },
    /// Any number of instances sharing PostgreSQL and a lock service.
    Distributed {
        /// The ledger's database.
        database_url: String,
        /// The locks' service.
        locks: LockUrl,
    },
}

/// A lock service, by its URL's scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockUrl {
    /// `redis://` or `rediss://`.
    Redis(String),
    /// `redis-cluster://host:port[,host:port…]`: a Redis Cluster.
    RedisCluster(String),
    /// `redis-sentinel://host:port[,host:port…]/<master>`: the master Redis Sentinel names.
    RedisSentinel(String),
    /// `zk://`: a ZooKeeper ensemble.
    ZooKeeper(String),
    /// `etcd://`: an etcd cluster.
    Etcd(String),
    /// `postgres://` or `postgresql://`: PostgreSQL advisory locks.
    Postgres(String),
    /// `mysql://`: a lock table in MySQL / MariaDB.
    MySqlTable(String),
    /// `mysql-row://`: InnoDB row locks in MySQL / MariaDB.
    MySqlRow(String),
    /// `memcache://`: a memcached server.
    Memcached(String),
    /// `hazelcast://host:port[,host:port…][/<cp-group>][?cluster=<name>]`: the CP
    /// Subsystem's FencedLock in a Hazelcast cluster.
    Hazelcast(String),
}

impl LockUrl {
    /// Reads a URL by its scheme.
    pub fn parse(url: &str) -> Result<Self, ConfigError> {
        // A service this binary was built without is refused here, before anything
        // connects, naming the cargo feature that builds it.
        if let Ok(kind) = lock::LockServiceKind::of_url(url)
            && let Some(why) = kind.not_built()
        {
            return Err(ConfigError::Invalid(format!("PAYONCE_LOCK_URL: {why}")));
        }
        let scheme = url.split_once("://").map(|(scheme, _)| scheme);
        match scheme {
            Some("redis" | "rediss") => Ok(Self::Redis(url.to_owned())),
            Some("redis-cluster") => Ok(Self::RedisCluster(url.to_owned())),
            Some("redis-sentinel") => Ok(Self::RedisSentinel(url.to_owned())),
            Some("zk") => Ok(Self::ZooKeeper(url.to_owned())),
            Some("etcd") => Ok(Self::Etcd(url.to_owned())),
            Some("postgres" | "postgresql") => Ok(Self::Postgres(url.to_owned())),
            Some("mysql") => Ok(Self::MySqlTable(url.to_owned())),
            Some("mysql-row") => Ok(Self::MySqlRow(url.to_owned())),
            Some("memcache" | "memcached") => Ok(Self::Memcached(url.to_owned())),
            Some("hazelcast") => Ok(Self::Hazelcast(url.to_owned())),
            _ => Err(ConfigError::Invalid(format!(
                "PAYONCE_LOCK_URL must start with redis://, redis-cluster://, redis-sentinel://, zk://, etcd://, postgres://, mysql://, mysql-row://, memcache:// or hazelcast://, got {}",
                mask(url)
            ))),
        }
    }

    /// The service's name, as printed.
    pub fn service(&self) -> &'static str {
        match self {
            Self::Redis(_) => "Redis",
            Self::RedisCluster(_) => "Redis Cluster",
            Self::RedisSentinel(_) => "Redis Sentinel",
            Self::ZooKeeper(_) => "ZooKeeper",
            Self::Etcd(_) => "etcd",
            Self::Postgres(_) => "PostgreSQL",
            Self::MySqlTable(_) => "MySQL (lock table)",
            Self::MySqlRow(_) => "MySQL (row locks)",
            Self::Memcached(_) => "memcached",
            Self::Hazelcast(_) => "Hazelcast",
        }
    }

    /// The service's name as a metric label (`lock_service`).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Redis(_) => "redis",
            Self::RedisCluster(_) => "redis_cluster",
            Self::RedisSentinel(_) => "redis_sentinel",
            Self::ZooKeeper(_) => "zookeeper",
            Self::Etcd(_) => "etcd",
            Self::Postgres(_) => "postgres",
            Self::MySqlTable(_) => "mysql_table",
            Self::MySqlRow(_) => "mysql_row",
            Self::Memcached(_) => "memcached",
            Self::Hazelcast(_) => "hazelcast",
        }
    }

    /// The URL.
    pub fn url(&self) -> &str {
        match self {
            Self::Redis(url)
            | Self::RedisCluster(url)
            | Self::RedisSentinel(url)
            | Self::ZooKeeper(url)
            | Self::Etcd(url)
            | Self::Postgres(url)
            | Self::MySqlTable(url)
            | Self::MySqlRow(url)
            | Self::Memcached(url)
            | Self::Hazelcast(url) => url,
        }
    }
}

/// Settings that cannot work together.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A database without a lock service, or the reverse.
    #[error(
        "{set} is set but {unset} is not: the distributed mode needs both, the embedded mode neither"
    )]
    HalfDistributed {
        /// The one that is set.
        set: &'static str,
        /// The one that is missing.
        unset: &'static str,
    },
    /// A setting out of range.
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// The mode the URLs select.
    pub fn mode(&self) -> Result<Mode, ConfigError> {
        let locks = self.lock_service()?;
        match (&self.database_url, locks) {
            (None, None) => Ok(Mode::Embedded {
                sqlite_path: self.data_dir.join("payonce.sqlite3"),
            }),
            (Some(database_url), Some(locks)) => Ok(Mode::Distributed {
                database_url: database_url.clone(),
                locks,
            }),
            (Some(_), None) => Err(ConfigError::HalfDistributed {
                set: "DATABASE_URL",
                unset: "PAYONCE_LOCK_URL (or REDIS_URL)",
            }),
            (None, Some(_)) => Err(ConfigError::HalfDistributed {
                set: if self.lock_url.is_some() {
                    "PAYONCE_LOCK_URL"
                } else {
                    "REDIS_URL"
                },
                unset: "DATABASE_URL",
            }),
        }
    }

    /// The lock service the URLs name: `PAYONCE_LOCK_URL`, or `REDIS_URL` for Redis.
    fn lock_service(&self) -> Result<Option<LockUrl>, ConfigError> {
        match (&self.lock_url, &self.redis_url) {
            (Some(lock_url), Some(redis_url)) if lock_url != redis_url => {
                Err(ConfigError::Invalid(
                    "REDIS_URL and PAYONCE_LOCK_URL name different lock services: set one".into(),
                ))
            }
            (Some(url), _) => LockUrl::parse(url).map(Some),
            (None, Some(url)) => Ok(Some(LockUrl::Redis(url.clone()))),
            (None, None) => Ok(None),
        }
    }

    /// Checks the settings that have a range, and that go together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_timings()?;
        self.check_capacities()?;
        self.check_payouts()?;
        self.check_client_address()?;
        self.check_operator_key()?;
        demonstration_is_built(self.lock_strategy, self.demo, cfg!(feature = "demo"))?;
        self.check_strategy_can_run()
    }

    /// Durations that are positive, and that fit inside each other.
    fn check_timings(&self) -> Result<(), ConfigError> {
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
        if self.ticket_ttl.is_zero() || self.request_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "PAYONCE_TICKET_TTL and PAYONCE_REQUEST_TIMEOUT must be positive".into(),
            ));
        }
        if self.lock_wait >= self.request_timeout {
            // Otherwise the request timeout cuts a spend off while it waits for the lock,
            // and the caller gets an outcome-unknown 503 instead of a clear 409.
            return Err(ConfigError::Invalid(
                "PAYONCE_LOCK_WAIT must be shorter than PAYONCE_REQUEST_TIMEOUT".into(),
            ));
        }
        if self.header_read_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "PAYONCE_HEADER_READ_TIMEOUT must be positive".into(),
            ));
        }
        Ok(())
    }

    /// A webhook schedule that can work: positive timeout and poll, a lease that outlasts
    /// an attempt and its recording, some concurrency, a key of the right size.
    fn check_webhooks(&self) -> Result<(), ConfigError> {
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
        self.webhook_key_bytes()?;
        Ok(())
    }

    /// A bank URL payonce can call, and a payout schedule that can work: a lease that
    /// outlasts the calls it covers, waits that grow.
    fn check_payouts(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.bank_url {
            match url::Url::parse(url) {
                Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "PAYONCE_BANK_URL {} is not an http:// or https:// URL",
                        mask(url)
                    )));
                }
            }
        }
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
        self.check_webhooks()?;
        if self.payout_workers == 0 || self.payout_workers > 64 || self.payout_attempts == 0 {
            return Err(ConfigError::Invalid(
                "PAYONCE_PAYOUT_WORKERS must be 1 to 64, PAYONCE_PAYOUT_ATTEMPTS at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Limits and pools of at least one.
    fn check_capacities(&self) -> Result<(), ConfigError> {
        if self.lock_max_waiters == 0 || self.max_in_flight == 0 || self.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "PAYONCE_LOCK_MAX_WAITERS, PAYONCE_MAX_IN_FLIGHT and PAYONCE_MAX_CONNECTIONS must be at least 1"
                    .into(),
            ));
        }
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

    /// A client-address header is believed only from named proxies, and named proxies
    /// come with the header they set.
    fn check_client_address(&self) -> Result<(), ConfigError> {
        if let Some(header) = &self.client_ip_header
            && axum::http::HeaderName::from_bytes(header.as_bytes()).is_err()
        {
            return Err(ConfigError::Invalid(format!(
                "PAYONCE_CLIENT_IP_HEADER {header:?} is not a header name"
            )));
        }
        match (&self.client_ip_header, self.trusted_proxies.is_empty()) {
            // A header believed from any peer lets a client that reaches the instance
            // directly name a new address with each request; one set but read from no
            // peer would silently count every client as the proxy.
            (Some(_), true) => {
                return Err(ConfigError::Invalid(
                    "PAYONCE_CLIENT_IP_HEADER needs PAYONCE_TRUSTED_PROXIES: the proxies (CIDR blocks) whose header is believed".into(),
                ));
            }
            (None, false) => {
                return Err(ConfigError::Invalid(
                    "PAYONCE_TRUSTED_PROXIES is set but PAYONCE_CLIENT_IP_HEADER is not: name the header the proxies set".into(),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// An operator key long enough not to be guessed.
    fn check_operator_key(&self) -> Result<(), ConfigError> {
        if let Some(key) = &self.operator_key
            && (key.expose().len() < MIN_OPERATOR_KEY
                || !key.expose().bytes().all(|byte| byte.is_ascii_graphic()))
        {
            return Err(ConfigError::Invalid(format!(
                "PAYONCE_OPERATOR_KEY must be at least {MIN_OPERATOR_KEY} visible ASCII characters, without spaces"
            )));
        }
        Ok(())
    }

    /// The strategy's lock service is there: the recipes need Redis, Redlock three.
    fn check_strategy_can_run(&self) -> Result<(), ConfigError> {
        let mode = self.mode()?;
        let needs_redis = !matches!(
            self.lock_strategy,
            Strategy::Fenced | Strategy::None | Strategy::Unfenced
        );
        let on_redis = matches!(
            mode,
            Mode::Distributed {
                locks: LockUrl::Redis(_),
                ..
            }
        );
        if needs_redis && !on_redis {
            return Err(ConfigError::Invalid(format!(
                "PAYONCE_LOCK_STRATEGY={} needs Redis: set DATABASE_URL and REDIS_URL",
                self.lock_strategy.name()
            )));
        }
        if self.lock_strategy == Strategy::Redlock && self.redlock_urls.len() < 3 {
            return Err(ConfigError::Invalid(
                "PAYONCE_LOCK_STRATEGY=redlock needs PAYONCE_REDLOCK_URLS with at least 3 servers"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The name in the `Payonce-Instance` header.
    pub fn instance_name(&self) -> String {
        self.instance
            .clone()
            .unwrap_or_else(|| self.addr.to_string())
    }
}

/// Whether what the configuration asks of the demonstration is in this build
/// (`demo_built`, the cargo feature `demo`): the unsafe strategies and the demonstration
/// mode (`demo`) are; a build without it has neither, nor any fault injection.
fn demonstration_is_built(
    strategy: Strategy,
    demo: bool,
    demo_built: bool,
) -> Result<(), ConfigError> {
    if demo_built {
        return Ok(());
    }
    if strategy != Strategy::Fenced {
        return Err(ConfigError::Invalid(format!(
            "PAYONCE_LOCK_STRATEGY={} needs a build with the demonstration's strategies \
             (cargo build -p api --features demo); this one has only the fenced strategy",
            strategy.name()
        )));
    }
    if demo {
        return Err(ConfigError::Invalid(
            "PAYONCE_DEMO=true needs a build with the demonstration (cargo build -p api \
             --features demo); this one has no fault injection and no demonstration headers"
                .into(),
        ));
    }
    Ok(())
}

/// The operator key, kept only as its SHA-256 digest: nothing here can print or log the
/// key, and comparing digests of equal length takes the same time whichever byte of a
/// guess is wrong.
#[derive(Clone)]
pub struct OperatorKey([u8; 32]);

impl OperatorKey {
    /// The key's digest.
    pub fn new(key: &str) -> Self {
        Self(Sha256::digest(key.as_bytes()).into())
    }

    /// Whether `key` is the operator key, in constant time: every byte of the two digests
    /// is compared, however early they differ.
    pub fn matches(&self, key: &str) -> bool {
        let offered: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        offered
            .iter()
            .zip(self.0)
            .fold(0, |differ, (offered, own)| differ | (offered ^ own))
            == 0
    }
}

impl fmt::Debug for OperatorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OperatorKey(****)")
    }
}

/// A URL with its secrets replaced, for printing: the password in the authority, and
/// query parameters that carry one (`?password=…`, which PostgreSQL URLs accept, and
/// anything else that looks like a secret).
pub fn mask(url: &str) -> String {
    let secret = |name: &str| {
        let name = name.to_ascii_lowercase();
        ["password", "passwd", "secret", "token", "key"]
            .iter()
            .any(|word| name.contains(word))
    };
    let Ok(mut parsed) = url::Url::parse(url) else {
        // A URL naming several hosts (`zk://a:2181,b:2181/root`) is not one `url` can
        // parse; shown as it is unless it could carry a password (in its authority or a
        // query parameter).
        let query = url.split_once('?').map_or("", |(_, query)| query);
        let named_secret = query
            .split('&')
            .any(|pair| secret(pair.split('=').next().unwrap_or(pair)));
        if !url.contains('@') && !named_secret {
            return url.to_owned();
        }
        return "<unparseable URL>".to_owned();
    };
    if parsed.password().is_some() {
        // Only fails for URLs that cannot have a password, which this one has.
        let _ = parsed.set_password(Some("****"));
    }
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(name, value)| {
                let value = if secret(&name) {
                    "****".to_owned()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

impl fmt::Display for Config {
    /// The start-up report: every setting, secrets masked.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let human = |d: Duration| humantime::format_duration(d).to_string();
        let unset = || "(unset)".to_owned();
        let rows = [
            ("PAYONCE_ADDR", self.addr.to_string()),
            (
                "DATABASE_URL",
                self.database_url.as_deref().map_or_else(unset, mask),
            ),
            (
                "REDIS_URL",
                self.redis_url.as_deref().map_or_else(unset, mask),
            ),
            (
                "PAYONCE_LOCK_URL",
                self.lock_url.as_deref().map_or_else(unset, mask),
            ),
            ("PAYONCE_REDIS_NAMESPACE", self.redis_namespace.clone()),
            ("PAYONCE_DATA_DIR", self.data_dir.display().to_string()),
            ("PAYONCE_LOCK_TTL", human(self.lock_ttl)),
            ("PAYONCE_LOCK_DELAY", human(self.lock_delay)),
            ("PAYONCE_LOCK_WAIT", human(self.lock_wait)),
            ("PAYONCE_TICKET_TTL", human(self.ticket_ttl)),
            ("PAYONCE_RETENTION", human(self.retention)),
            ("PAYONCE_REAP_INTERVAL", human(self.reap_interval)),
            ("PAYONCE_AUDIT_EVERY", human(self.audit_every)),
            ("PAYONCE_LOCK_IDLE", human(self.lock_idle)),
            ("PAYONCE_REQUEST_TIMEOUT", human(self.request_timeout)),
            (
                "PAYONCE_DB_MAX_CONNECTIONS",
                self.db_max_connections.to_string(),
            ),
            ("PAYONCE_BATCH_MAX", self.batch_max.to_string()),
            ("PAYONCE_BATCH_WORKERS", self.batch_workers.to_string()),
            ("PAYONCE_STARTUP_TIMEOUT", human(self.startup_timeout)),
            ("PAYONCE_INSTANCE", self.instance_name()),
            (
                "PAYONCE_LOCK_STRATEGY",
                self.lock_strategy.name().to_owned(),
            ),
            ("PAYONCE_DEMO", self.demo.to_string()),
            (
                "PAYONCE_LOG_FORMAT",
                match self.log_format {
                    crate::telemetry::LogFormat::Text => "text",
                    crate::telemetry::LogFormat::Json => "json",
                }
                .to_owned(),
            ),
            (
                "PAYONCE_LOCK_MAX_WAITERS",
                self.lock_max_waiters.to_string(),
            ),
            ("PAYONCE_MAX_IN_FLIGHT", self.max_in_flight.to_string()),
            ("PAYONCE_MAX_CONNECTIONS", self.max_connections.to_string()),
            (
                "PAYONCE_HEADER_READ_TIMEOUT",
                human(self.header_read_timeout),
            ),
            (
                "PAYONCE_ACCOUNTS_PER_MINUTE",
                self.accounts_per_minute.to_string(),
            ),
            (
                "PAYONCE_TICKETS_PER_SECOND",
                self.tickets_per_second.to_string(),
            ),
            (
                "PAYONCE_SPENDS_PER_SECOND",
                self.spends_per_second.to_string(),
            ),
            (
                "PAYONCE_ORDERS_PER_SECOND",
                self.orders_per_second.to_string(),
            ),
            (
                "PAYONCE_BAD_KEYS_PER_MINUTE",
                self.bad_keys_per_minute.to_string(),
            ),
            (
                "PAYONCE_CLIENT_IP_HEADER",
                self.client_ip_header.clone().unwrap_or_else(unset),
            ),
            (
                "PAYONCE_TRUSTED_PROXIES",
                if self.trusted_proxies.is_empty() {
                    unset()
                } else {
                    self.trusted_proxies
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                },
            ),
            (
                "PAYONCE_OPERATOR_KEY",
                self.operator_key
                    .as_ref()
                    .map_or_else(unset, |_| "****".to_owned()),
            ),
            (
                "PAYONCE_REDLOCK_URLS",
                if self.redlock_urls.is_empty() {
                    unset()
                } else {
                    self.redlock_urls
                        .iter()
                        .map(|url| mask(url))
                        .collect::<Vec<_>>()
                        .join(",")
                },
            ),
            (
                "PAYONCE_BANK_URL",
                self.bank_url.as_deref().map_or_else(unset, mask),
            ),
            ("PAYONCE_BANK_TIMEOUT", human(self.bank_timeout)),
            ("PAYONCE_PAYOUT_WORKERS", self.payout_workers.to_string()),
            ("PAYONCE_PAYOUT_LEASE", human(self.payout_lease)),
            ("PAYONCE_PAYOUT_RETRY_BASE", human(self.payout_retry_base)),
            ("PAYONCE_PAYOUT_RETRY_MAX", human(self.payout_retry_max)),
            ("PAYONCE_PAYOUT_ATTEMPTS", self.payout_attempts.to_string()),
            (
                "PAYONCE_PAYOUT_THROTTLE_MAX_AGE",
                human(self.payout_throttle_max_age),
            ),
            ("PAYONCE_PAYOUT_POLL", human(self.payout_poll)),
            ("PAYONCE_PAYOUT_KEYS", self.payout_keys.name().to_owned()),
            (
                "PAYONCE_WEBHOOK_ALLOW_PRIVATE",
                self.webhook_allow_private.to_string(),
            ),
            (
                "PAYONCE_WEBHOOK_ALLOWED_NETWORKS",
                if self.webhook_allowed_networks.is_empty() {
                    "(unset: any the guard allows)".to_owned()
                } else {
                    self.webhook_allowed_networks
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                },
            ),
            ("PAYONCE_WEBHOOK_TIMEOUT", human(self.webhook_timeout)),
            (
                "PAYONCE_WEBHOOK_RETRY_SCHEDULE",
                self.webhook_retry_schedule
                    .0
                    .iter()
                    .map(|step| human(*step))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            (
                "PAYONCE_WEBHOOK_CONCURRENCY",
                self.webhook_concurrency.to_string(),
            ),
            (
                "PAYONCE_WEBHOOK_PER_ENDPOINT",
                self.webhook_per_endpoint.to_string(),
            ),
            ("PAYONCE_WEBHOOK_LEASE", human(self.webhook_lease)),
            ("PAYONCE_WEBHOOK_POLL", human(self.webhook_poll)),
            (
                "PAYONCE_WEBHOOK_ROTATION_WINDOW",
                human(self.webhook_rotation_window),
            ),
            (
                "PAYONCE_WEBHOOK_KEY",
                self.webhook_key.as_ref().map_or_else(
                    || "(unset: kept in the database)".to_owned(),
                    |_| "****".to_owned(),
                ),
            ),
        ];
        for (name, value) in rows {
            writeln!(f, "  {name:<28} {value}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_operator_key_matches_and_it_never_shows() {
        let key = OperatorKey::new("operator-key-3f9a81c2d7e4");
        assert!(key.matches("operator-key-3f9a81c2d7e4"));
        for other in [
            "",
            "operator-key-3f9a81c2d7e",
            "operator-key-3f9a81c2d7e4 ",
            "x",
        ] {
            assert!(!key.matches(other), "{other:?}");
        }
        assert_eq!(format!("{key:?}"), "OperatorKey(****)");
    }

    fn config(args: &[&str]) -> Config {
        let mut argv = vec!["payonce"];
        argv.extend_from_slice(args);
        Cli::parse_from(argv).config
    }

    #[test]
    fn no_urls_is_embedded_both_is_distributed_one_is_refused() {
        // Set the fields directly: the test command exports DATABASE_URL and REDIS_URL.
        let with = |database: Option<&str>, redis: Option<&str>| {
            let mut config = config(&[]);
            config.database_url = database.map(str::to_owned);
            config.redis_url = redis.map(str::to_owned);
            config.lock_url = None;
            config.mode()
        };
        assert!(matches!(with(None, None), Ok(Mode::Embedded { .. })));
        let both = with(Some("postgres://db"), Some("redis://r"));
        assert!(matches!(both, Ok(Mode::Distributed { .. })));
        let error = with(Some("postgres://db"), None).unwrap_err();
        assert!(error.to_string().contains("REDIS_URL) is not"), "{error}");
        let error = with(None, Some("redis://r")).unwrap_err();
        assert!(error.to_string().contains("DATABASE_URL is not"), "{error}");
    }

    #[test]
    fn a_build_without_the_demonstration_has_only_the_fenced_strategy_and_no_demo_mode() {
        assert!(demonstration_is_built(Strategy::Fenced, false, false).is_ok());
        for strategy in Strategy::ALL {
            for demo in [false, true] {
                assert!(demonstration_is_built(strategy, demo, true).is_ok());
                if strategy != Strategy::Fenced || demo {
                    let refused = demonstration_is_built(strategy, demo, false)
                        .unwrap_err()
                        .to_string();
                    assert!(refused.contains("--features demo"), "{refused}");
                }
            }
        }
        let refused = demonstration_is_built(Strategy::Fenced, true, false)
            .unwrap_err()
            .to_string();
        assert!(refused.starts_with("PAYONCE_DEMO=true needs"), "{refused}");
        // This build's own answer, through the whole validation.
        let mut config = config(&["--lock-strategy", "none"]);
        (config.database_url, config.redis_url, config.lock_url) = (None, None, None);
        assert_eq!(config.validate().is_ok(), cfg!(feature = "demo"));
        let mut demo_mode = self::config(&[]);
        (
            demo_mode.database_url,
            demo_mode.redis_url,
            demo_mode.lock_url,
        ) = (None, None, None);
        demo_mode.demo = true;
        assert_eq!(demo_mode.validate().is_ok(), cfg!(feature = "demo"));
        let mut fresh_keys = self::config(&["--payout-keys", "fresh-key-per-attempt"]);
        (
            fresh_keys.database_url,
            fresh_keys.redis_url,
            fresh_keys.lock_url,
        ) = (None, None, None);
        assert_eq!(fresh_keys.validate().is_ok(), cfg!(feature = "demo"));
    }

    #[test]
    fn the_lock_url_names_the_service_by_its_scheme() {
        let with = |lock_url: &str| {
            let mut config = config(&[]);
            config.database_url = Some("postgres://db".into());
            config.redis_url = None;
            config.lock_url = Some(lock_url.into());
            config.mode()
        };
        for (url, service) in [
            ("redis://127.0.0.1:6379", "Redis"),
            (
                "redis-cluster://127.0.0.1:7000,127.0.0.1:7001",
                "Redis Cluster",
            ),
            (
                "redis-sentinel://127.0.0.1:26379,127.0.0.1:26380/payonce",
                "Redis Sentinel",
            ),
            ("zk://127.0.0.1:2181,127.0.0.2:2181/payonce", "ZooKeeper"),
            ("etcd://127.0.0.1:2379", "etcd"),
            (
                "hazelcast://127.0.0.1:5701,127.0.0.1:5702/default?cluster=dev",
                "Hazelcast",
            ),
        ] {
            match with(url) {
                Ok(Mode::Distributed { locks, .. }) => {
                    assert_eq!((locks.service(), locks.url()), (service, url));
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        let error = with("consul://127.0.0.1:8500").unwrap_err();
        assert!(
            error.to_string().contains("PAYONCE_LOCK_URL must"),
            "{error}"
        );
        // Both variables, naming different services, are refused.
        let mut both = config(&[]);
        both.database_url = Some("postgres://db".into());
        both.redis_url = Some("redis://r".into());
        both.lock_url = Some("zk://z:2181".into());
        assert!(both.mode().is_err());
    }

    #[test]
    fn printed_settings_mask_passwords() {
        let printed = config(&[
            "--database-url",
            "postgres://app:hunter2@db:5432/payonce",
            "--redis-url",
            "redis://:s3cret@redis:6379",
        ])
        .to_string();
        assert!(
            !printed.contains("hunter2") && !printed.contains("s3cret"),
            "{printed}"
        );
        assert!(
            printed.contains("postgres://app:****@db:5432/payonce"),
            "{printed}"
        );
        let masked = mask("postgres://app@db/payonce?password=hunter2&sslmode=disable");
        assert!(!masked.contains("hunter2"), "{masked}");
        assert!(masked.contains("sslmode=disable"), "{masked}");
        let ensemble = "zk://10.0.0.1:2181,10.0.0.2:2181/payonce";
        assert_eq!(mask(ensemble), ensemble);
        assert_eq!(mask("zk://user:hunter2@a:1,b:2/x"), "<unparseable URL>");
        let members = "hazelcast://a:5701,b:5701/default?cluster=dev";
        assert_eq!(mask(members), members);
        assert_eq!(
            mask("hazelcast://a:5701,b:5701/default?cluster=dev&password=x"),
            "<unparseable URL>"
        );
    }

    #[test]
    fn the_operator_key_is_never_printed() {
        let key = "operator-key-3f9a81c2d7e4";
        let parsed = config(&["--operator-key", key]);
        for shown in [parsed.to_string(), format!("{parsed:?}")] {
            assert!(!shown.contains(key), "{shown}");
        }
        assert!(
            parsed
                .to_string()
                .contains("PAYONCE_OPERATOR_KEY         ****")
        );
        let mut short = embedded(&[]);
        short.operator_key = Some("too-short".parse().unwrap());
        let refused = short.validate().unwrap_err().to_string();
        assert!(refused.contains("at least 16"), "{refused}");
        short.operator_key = Some("sixteen chars but spaces".parse().unwrap());
        assert!(short.validate().is_err());
        short.operator_key = Some(key.parse().unwrap());
        assert!(short.validate().is_ok());
    }

    /// A configuration in the embedded mode (the test command exports the URLs).
    fn embedded(args: &[&str]) -> Config {
        let mut config = config(args);
        (config.database_url, config.redis_url, config.lock_url) = (None, None, None);
        config
    }

    #[test]
    fn the_address_header_is_read_only_from_trusted_proxies() {
        let proxied = embedded(&[
            "--client-ip-header",
            "x-forwarded-for",
            "--trusted-proxies",
            "10.0.0.0/8, 192.0.2.7,fd00::/8",
        ]);
        assert!(proxied.validate().is_ok());
        assert_eq!(
            proxied
                .trusted_proxies
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["10.0.0.0/8", "192.0.2.7/32", "fd00::/8"]
        );
        assert!(
            proxied
                .to_string()
                .contains("10.0.0.0/8,192.0.2.7/32,fd00::/8")
        );
        let refused = embedded(&["--client-ip-header", "x-real-ip"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(refused.contains("PAYONCE_TRUSTED_PROXIES"), "{refused}");
        assert!(
            embedded(&["--trusted-proxies", "10.0.0.0/8"])
                .validate()
                .is_err()
        );
        for bad in ["10.0.0.0/33", "proxy.example", "10.0.0/8", ""] {
            let mut argv = vec!["payonce", "--trusted-proxies"];
            argv.push(bad);
            let error = Cli::try_parse_from(argv).unwrap_err().to_string();
            assert!(error.contains("CIDR"), "{bad}: {error}");
        }
    }

    #[test]
    fn durations_read_as_people_write_them() {
        let parsed = config(&["--lock-ttl", "1500ms", "--retention", "3days"]);
        assert_eq!(parsed.lock_ttl, Duration::from_millis(1500));
        assert_eq!(parsed.retention, Duration::from_secs(3 * 86_400));
    }
}
