//! Configuration: flags and environment variables (every flag has one), the running mode
//! they select, and how they are printed at start-up.
//!
//! The settings come in sections, each beside the subsystem it configures, with its own
//! check and its conversion into the settings that subsystem takes: [`LockConfig`]
//! (`config/lock.rs`), [`LedgerConfig`] (`config/ledger.rs`), [`LimitsConfig`]
//! (`limits/config.rs`), [`PayoutConfig`] (`payouts/config.rs`), [`WebhookConfig`]
//! (`webhooks/config.rs`) and [`TelemetryConfig`] (`config/telemetry.rs`). [`Config`]
//! holds them, the settings that say where things are and how to serve (fields programs
//! set directly: the URLs, the namespace, the request timeout), and the checks across
//! sections.
//! The start-up report ([`Config`]'s `Display`) is generated from the arguments: every
//! argument's environment variable, with the value its section reports (`section.rs`).

pub mod ledger;
pub mod lock;
pub mod section;
pub mod telemetry;

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sha2::{Digest, Sha256};

pub use self::ledger::LedgerConfig;
pub use self::lock::{LockConfig, LockUrl, Strategy};
pub use self::section::{ConfigError, Secret, mask};
use self::section::{Report, Row, config_section, duration};
pub use self::telemetry::TelemetryConfig;
pub use crate::limits::config::LimitsConfig;
pub use crate::payouts::config::{PayoutConfig, PayoutKeys};
pub use crate::webhooks::config::{Schedule, WebhookConfig};

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

config_section! {
    /// Every setting: those that pick the mode and serve, and the sections. Each flag can
    /// also be given as the environment variable shown.
    #[derive(Args, Debug, Clone)]
    pub struct Config {
        /// Address to listen on.
        #[arg(env = "PAYONCE_ADDR", default_value = "127.0.0.1:8080")]
        pub addr: SocketAddr,
        /// PostgreSQL URL. With REDIS_URL: the distributed mode. With neither: embedded.
        #[arg(env = "DATABASE_URL", value_hint = clap::ValueHint::Url)]
        pub database_url: Option<String>,
        /// Redis URL for the locks. With DATABASE_URL: the distributed mode. (The same as
        /// PAYONCE_LOCK_URL=redis://….)
        #[arg(env = "REDIS_URL", value_hint = clap::ValueHint::Url)]
        pub redis_url: Option<String>,
        /// The lock service, for the distributed mode: `redis://host:port[/db]`,
        /// `zk://host:port[,host:port…][/root]` (ZooKeeper),
        /// `etcd://host:port[,host:port…][/root]`,
        /// `hazelcast://host:port[,host:port…][/<cp-group>][?cluster=<name>]`, and the others
        /// docs/configuration.md lists.
        #[arg(env = "PAYONCE_LOCK_URL", value_hint = clap::ValueHint::Url)]
        pub lock_url: Option<String>,
        /// The bank payouts go to (`payonce-bank` or anything with its contract). Unset in
        /// the embedded mode: payonce starts one in the process, on a loopback port of its own,
        /// with its store beside the ledger's file. Unset in the distributed mode: payouts are
        /// refused (503 `payouts-unavailable`), since instances must share one bank.
        #[arg(env = "PAYONCE_BANK_URL", value_hint = clap::ValueHint::Url)]
        pub bank_url: Option<String>,
        /// Prefix of every Redis key and channel, so deployments can share a Redis.
        #[arg(env = "PAYONCE_REDIS_NAMESPACE", default_value = "payonce")]
        pub redis_namespace: String,
        /// Where the embedded mode keeps its SQLite file.
        #[arg(env = "PAYONCE_DATA_DIR", default_value = "./data")]
        pub data_dir: PathBuf,
        /// Longest a request may take before it is answered 503.
        #[arg(env = "PAYONCE_REQUEST_TIMEOUT", default_value = "30s", value_parser = duration)]
        pub request_timeout: Duration,
        /// This instance's name in the `Payonce-Instance` response header (default: the
        /// listen address).
        #[arg(env = "PAYONCE_INSTANCE")]
        pub instance: Option<String>,
        /// The demonstration mode: honour the `Payonce-Fault` and `Payonce-Strategy` request
        /// headers. Only in a build with the cargo feature `demo` (one without it refuses to
        /// start with this set). Never in production.
        #[arg(env = "PAYONCE_DEMO", default_value_t = false)]
        pub demo: bool,
        /// When set, opening an account with money or points, and every deposit, need
        /// `Authorization: Bearer <this key>`; unset, anyone may (the demonstration). At least
        /// 16 visible ASCII characters. A secret: prefer the environment variable to the flag.
        #[arg(env = "PAYONCE_OPERATOR_KEY", hide_env_values = true)]
        pub operator_key: Option<Secret>,
    }
    sections {
        /// The ledger's database and the lives of tickets.
        pub ledger: LedgerConfig,
        /// The account locks.
        pub lock: LockConfig,
        /// Capacities, rates and the client's address.
        pub limits: LimitsConfig,
        /// The bank and the payout workers.
        pub payouts: PayoutConfig,
        /// Webhook delivery.
        pub webhooks: WebhookConfig,
        /// Logging.
        pub telemetry: TelemetryConfig,
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

impl Mode {
    /// The locks' URL when they are on one Redis server: what the demonstration's recipes
    /// run on.
    pub fn one_redis(&self) -> Option<&LockUrl> {
        match self {
            Self::Distributed { locks, .. } if locks.kind() == ::lock::LockServiceKind::Redis => {
                Some(locks)
            }
            _ => None,
        }
    }
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
            (None, Some(url)) => Ok(Some(LockUrl::redis(url))),
            (None, None) => Ok(None),
        }
    }

    /// Checks the settings that have a range, and that go together: each section's, then
    /// those across sections.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.lock.check()?;
        self.check_timings()?;
        self.limits.check()?;
        self.check_capacities()?;
        self.ledger.check()?;
        crate::payouts::config::bank_url(self.bank_url.as_deref())?;
        self.payouts.check()?;
        self.webhooks.check()?;
        self.check_operator_key()?;
        demonstration_is_built(self.lock.lock_strategy, self.demo, cfg!(feature = "demo"))?;
        self.check_strategy_can_run()
    }

    /// Durations that are positive, and that fit inside each other.
    fn check_timings(&self) -> Result<(), ConfigError> {
        if self.ledger.ticket_ttl.is_zero() || self.request_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "PAYONCE_TICKET_TTL and PAYONCE_REQUEST_TIMEOUT must be positive".into(),
            ));
        }
        if self.lock.lock_wait >= self.request_timeout {
            // Otherwise the request timeout cuts a spend off while it waits for the lock,
            // and the caller gets an outcome-unknown 503 instead of a clear 409.
            return Err(ConfigError::Invalid(
                "PAYONCE_LOCK_WAIT must be shorter than PAYONCE_REQUEST_TIMEOUT".into(),
            ));
        }
        Ok(())
    }

    /// Queues and limits of at least one.
    fn check_capacities(&self) -> Result<(), ConfigError> {
        if self.lock.lock_max_waiters == 0
            || self.limits.max_in_flight == 0
            || self.limits.max_connections == 0
        {
            return Err(ConfigError::Invalid(
                "PAYONCE_LOCK_MAX_WAITERS, PAYONCE_MAX_IN_FLIGHT and PAYONCE_MAX_CONNECTIONS must be at least 1"
                    .into(),
            ));
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
            self.lock.lock_strategy,
            Strategy::Fenced | Strategy::None | Strategy::Unfenced
        );
        if needs_redis && mode.one_redis().is_none() {
            return Err(ConfigError::Invalid(format!(
                "PAYONCE_LOCK_STRATEGY={} needs Redis: set DATABASE_URL and REDIS_URL",
                self.lock.lock_strategy.name()
            )));
        }
        if self.lock.lock_strategy == Strategy::Redlock && self.lock.redlock_urls.len() < 3 {
            return Err(ConfigError::Invalid(
                "PAYONCE_LOCK_STRATEGY=redlock needs PAYONCE_REDLOCK_URLS with at least 3 servers"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The operator key, kept as its digest.
    pub fn operator_key(&self) -> Option<OperatorKey> {
        self.operator_key
            .as_ref()
            .map(|key| OperatorKey::new(key.expose()))
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

impl fmt::Display for Config {
    /// The start-up report: every argument's environment variable with its value, secrets
    /// masked — the arguments that hide their values (`hide_env_values`) show `****`, and
    /// those that take URLs (`ValueHint::Url`) lose their passwords.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rows = Vec::new();
        self.report("config", &mut rows);
        let command = Config::augment_args(clap::Command::new("payonce"));
        for argument in command.get_arguments() {
            let Some(env) = argument.get_env() else {
                continue;
            };
            let id = argument.get_id().as_str();
            let row = rows.iter().find(|row| row.id == id);
            let shown = row.map_or_else(
                || "(not reported)".to_owned(),
                |row| self.shown(argument, row),
            );
            writeln!(f, "  {:<28} {shown}", env.to_string_lossy())?;
        }
        Ok(())
    }
}

impl Config {
    /// How one argument's value shows in the start-up report.
    fn shown(&self, argument: &clap::Arg, row: &Row) -> String {
        let Some(items) = &row.value else {
            if row.id == "instance" {
                // Unset, the header carries the listen address: the report says which.
                return self.instance_name();
            }
            return row.unset.unwrap_or("(unset)").to_owned();
        };
        if argument.is_hide_env_values_set() {
            return "****".to_owned();
        }
        if argument.get_value_hint() == clap::ValueHint::Url {
            return items
                .iter()
                .map(|url| mask(url))
                .collect::<Vec<_>>()
                .join(",");
        }
        items.join(",")
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
                .limits
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
        assert_eq!(parsed.lock.lock_ttl, Duration::from_millis(1500));
        assert_eq!(parsed.ledger.retention, Duration::from_secs(3 * 86_400));
    }

    /// The start-up report as the hand-written one printed it (sorted): the defaults.
    const REPORTED_DEFAULTS: &str = "  DATABASE_URL                 (unset)
  PAYONCE_ACCOUNTS_PER_MINUTE  1200
  PAYONCE_ADDR                 127.0.0.1:0
  PAYONCE_AUDIT_EVERY          1h
  PAYONCE_BAD_KEYS_PER_MINUTE  60
  PAYONCE_BANK_TIMEOUT         2s
  PAYONCE_BANK_URL             (unset)
  PAYONCE_BATCH_MAX            64
  PAYONCE_BATCH_WORKERS        2
  PAYONCE_CLIENT_IP_HEADER     (unset)
  PAYONCE_DATA_DIR             /tmp/cfg/data
  PAYONCE_DB_MAX_CONNECTIONS   16
  PAYONCE_DELIVERY_RETENTION   30days
  PAYONCE_DEMO                 false
  PAYONCE_HEADER_READ_TIMEOUT  10s
  PAYONCE_HOLD_SWEEP           1s
  PAYONCE_INSTANCE             127.0.0.1:0
  PAYONCE_LOCK_DELAY           0s
  PAYONCE_LOCK_IDLE            1h
  PAYONCE_LOCK_MAX_WAITERS     64
  PAYONCE_LOCK_STRATEGY        fenced
  PAYONCE_LOCK_TTL             10s
  PAYONCE_LOCK_URL             (unset)
  PAYONCE_LOCK_WAIT            2s
  PAYONCE_LOG_FORMAT           text
  PAYONCE_MAX_CONNECTIONS      4096
  PAYONCE_MAX_IN_FLIGHT        1024
  PAYONCE_OPERATOR_KEY         (unset)
  PAYONCE_ORDERS_PER_SECOND    200
  PAYONCE_PAYOUT_ATTEMPTS      10
  PAYONCE_PAYOUT_KEYS          one-key
  PAYONCE_PAYOUT_LEASE         30s
  PAYONCE_PAYOUT_POLL          10s
  PAYONCE_PAYOUT_RETRY_BASE    200ms
  PAYONCE_PAYOUT_RETRY_MAX     1m
  PAYONCE_PAYOUT_THROTTLE_MAX_AGE 1h
  PAYONCE_PAYOUT_WORKERS       4
  PAYONCE_REAP_INTERVAL        5m
  PAYONCE_REDIS_NAMESPACE      payonce
  PAYONCE_REDLOCK_URLS         (unset)
  PAYONCE_REQUEST_TIMEOUT      30s
  PAYONCE_RETENTION            7days
  PAYONCE_SPENDS_PER_SECOND    200
  PAYONCE_STARTUP_TIMEOUT      30s
  PAYONCE_TICKETS_PER_SECOND   200
  PAYONCE_TICKET_TTL           1day
  PAYONCE_TRUSTED_PROXIES      (unset)
  PAYONCE_WEBHOOK_ALLOWED_NETWORKS (unset: any the guard allows)
  PAYONCE_WEBHOOK_ALLOW_PRIVATE false
  PAYONCE_WEBHOOK_CONCURRENCY  64
  PAYONCE_WEBHOOK_KEY          (unset: kept in the database)
  PAYONCE_WEBHOOK_LEASE        1m
  PAYONCE_WEBHOOK_PER_ENDPOINT 8
  PAYONCE_WEBHOOK_POLL         10s
  PAYONCE_WEBHOOK_RETRY_SCHEDULE 5s,5m,30m,2h,5h,10h,10h
  PAYONCE_WEBHOOK_ROTATION_WINDOW 1day
  PAYONCE_WEBHOOK_TIMEOUT      15s
  REDIS_URL                    (unset)
";

    /// The start-up report as the hand-written one printed it (sorted): URLs with
    /// passwords, secrets, lists.
    const REPORTED_SETTINGS: &str =
        "  DATABASE_URL                 postgres://app:****@127.0.0.1:1/payonce?sslmode=disable
  PAYONCE_ACCOUNTS_PER_MINUTE  1200
  PAYONCE_ADDR                 127.0.0.1:0
  PAYONCE_AUDIT_EVERY          1h
  PAYONCE_BAD_KEYS_PER_MINUTE  60
  PAYONCE_BANK_TIMEOUT         2s
  PAYONCE_BANK_URL             https://u:****@bank.example/x?token=****
  PAYONCE_BATCH_MAX            64
  PAYONCE_BATCH_WORKERS        2
  PAYONCE_CLIENT_IP_HEADER     x-real-ip
  PAYONCE_DATA_DIR             ./data
  PAYONCE_DB_MAX_CONNECTIONS   16
  PAYONCE_DELIVERY_RETENTION   30days
  PAYONCE_DEMO                 false
  PAYONCE_HEADER_READ_TIMEOUT  10s
  PAYONCE_HOLD_SWEEP           1s
  PAYONCE_INSTANCE             one
  PAYONCE_LOCK_DELAY           0s
  PAYONCE_LOCK_IDLE            1h
  PAYONCE_LOCK_MAX_WAITERS     64
  PAYONCE_LOCK_STRATEGY        fenced
  PAYONCE_LOCK_TTL             1s 500ms
  PAYONCE_LOCK_URL             (unset)
  PAYONCE_LOCK_WAIT            2s
  PAYONCE_LOG_FORMAT           text
  PAYONCE_MAX_CONNECTIONS      4096
  PAYONCE_MAX_IN_FLIGHT        1024
  PAYONCE_OPERATOR_KEY         ****
  PAYONCE_ORDERS_PER_SECOND    200
  PAYONCE_PAYOUT_ATTEMPTS      10
  PAYONCE_PAYOUT_KEYS          one-key
  PAYONCE_PAYOUT_LEASE         30s
  PAYONCE_PAYOUT_POLL          10s
  PAYONCE_PAYOUT_RETRY_BASE    200ms
  PAYONCE_PAYOUT_RETRY_MAX     1m
  PAYONCE_PAYOUT_THROTTLE_MAX_AGE 1h
  PAYONCE_PAYOUT_WORKERS       4
  PAYONCE_REAP_INTERVAL        5m
  PAYONCE_REDIS_NAMESPACE      payonce
  PAYONCE_REDLOCK_URLS         redis://:****@a:1,redis://b:2,redis://c:3
  PAYONCE_REQUEST_TIMEOUT      30s
  PAYONCE_RETENTION            7days
  PAYONCE_SPENDS_PER_SECOND    200
  PAYONCE_STARTUP_TIMEOUT      1s
  PAYONCE_TICKETS_PER_SECOND   200
  PAYONCE_TICKET_TTL           1day
  PAYONCE_TRUSTED_PROXIES      10.0.0.0/8
  PAYONCE_WEBHOOK_ALLOWED_NETWORKS 10.0.0.0/8,192.0.2.7/32
  PAYONCE_WEBHOOK_ALLOW_PRIVATE false
  PAYONCE_WEBHOOK_CONCURRENCY  64
  PAYONCE_WEBHOOK_KEY          ****
  PAYONCE_WEBHOOK_LEASE        1m
  PAYONCE_WEBHOOK_PER_ENDPOINT 8
  PAYONCE_WEBHOOK_POLL         10s
  PAYONCE_WEBHOOK_RETRY_SCHEDULE 1s,1s 500ms
  PAYONCE_WEBHOOK_ROTATION_WINDOW 1day
  PAYONCE_WEBHOOK_TIMEOUT      15s
  REDIS_URL                    redis://:****@127.0.0.1:1
";

    fn sorted_lines(text: &str) -> Vec<&str> {
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        lines
    }

    #[test]
    fn the_report_shows_every_setting_as_before() {
        let defaults = embedded(&["--addr", "127.0.0.1:0", "--data-dir", "/tmp/cfg/data"]);
        assert_eq!(
            sorted_lines(&defaults.to_string()),
            sorted_lines(REPORTED_DEFAULTS)
        );
        let set = config(&[
            "--addr",
            "127.0.0.1:0",
            "--startup-timeout",
            "1s",
            "--database-url",
            "postgres://app:hunter2@127.0.0.1:1/payonce?sslmode=disable",
            "--redis-url",
            "redis://:s3cret@127.0.0.1:1",
            "--operator-key",
            "operator-key-3f9a81c2d7e4",
            "--redlock-urls",
            "redis://:pw@a:1,redis://b:2,redis://c:3",
            "--bank-url",
            "https://u:p@bank.example/x?token=t",
            "--webhook-key",
            "0000000000000000000000000000000000000000000000000000000000000000",
            "--webhook-allowed-networks",
            "10.0.0.0/8,192.0.2.7",
            "--trusted-proxies",
            "10.0.0.0/8",
            "--client-ip-header",
            "x-real-ip",
            "--instance",
            "one",
            "--webhook-retry-schedule",
            "1s,1500ms",
            "--lock-ttl",
            "1500ms",
        ]);
        let mut set = set;
        set.lock_url = None;
        set.redis_namespace = "payonce".into();
        set.data_dir = "./data".into();
        assert_eq!(
            sorted_lines(&set.to_string()),
            sorted_lines(REPORTED_SETTINGS)
        );
        for secret in [
            "hunter2",
            "s3cret",
            "operator-key-3f9a81c2d7e4",
            "000000000000",
        ] {
            assert!(!set.to_string().contains(secret), "{secret}");
        }
    }

    #[test]
    fn every_setting_with_a_variable_is_reported_once() {
        let report = embedded(&[]).to_string();
        let command = Config::augment_args(clap::Command::new("payonce"));
        let variables: Vec<String> = command
            .get_arguments()
            .filter_map(|argument| argument.get_env())
            .map(|env| env.to_string_lossy().into_owned())
            .collect();
        assert_eq!(report.lines().count(), variables.len(), "{report}");
        assert!(!report.contains("(not reported)"), "{report}");
        for variable in variables {
            assert!(
                report.contains(&format!("  {variable} ")),
                "{variable}: {report}"
            );
        }
    }
}
