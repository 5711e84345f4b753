//! The limits section: how much one instance takes on at once, how fast clients and
//! accounts may go, and where a client's address comes from behind a proxy.

use std::time::Duration;

use clap::Args;
use ipnet::IpNet;

use super::Rates;
use crate::config::section::{ConfigError, config_section, duration, network};

config_section! {
    /// Capacities, rates and the client's address.
    #[derive(Args, Debug, Clone)]
    pub struct LimitsConfig {
        /// The most requests this instance works on at once; past it, 503 overloaded.
        #[arg(env = "PAYONCE_MAX_IN_FLIGHT", default_value_t = 1024)]
        pub max_in_flight: usize,
        /// The most client connections this instance keeps open; past it, new ones wait to
        /// be accepted. Keep it below the process's file-descriptor limit.
        #[arg(env = "PAYONCE_MAX_CONNECTIONS", default_value_t = 4096)]
        pub max_connections: usize,
        /// How long a client may take to send a request's head — and how long an idle
        /// keep-alive connection waits for its next request — before it is closed.
        #[arg(env = "PAYONCE_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = duration)]
        pub header_read_timeout: Duration,
        /// Accounts one client address may open per minute (in a burst, or spread out); 0:
        /// no limit.
        #[arg(env = "PAYONCE_ACCOUNTS_PER_MINUTE", default_value_t = 1200)]
        pub accounts_per_minute: u32,
        /// Tickets one account may take per second; 0: no limit.
        #[arg(env = "PAYONCE_TICKETS_PER_SECOND", default_value_t = 200)]
        pub tickets_per_second: u32,
        /// Spends (withdrawals, deposits, draws, replays included) one account may send per
        /// second; 0: no limit.
        #[arg(env = "PAYONCE_SPENDS_PER_SECOND", default_value_t = 200)]
        pub spends_per_second: u32,
        /// Orders one account may place per second; 0: no limit.
        #[arg(env = "PAYONCE_ORDERS_PER_SECOND", default_value_t = 200)]
        pub orders_per_second: u32,
        /// Unknown or wrong API keys (or operator keys) one client address may send per
        /// minute (in a burst, or spread out); past it, 429 before the key is looked up. 0:
        /// no limit.
        #[arg(env = "PAYONCE_BAD_KEYS_PER_MINUTE", default_value_t = 60)]
        pub bad_keys_per_minute: u32,
        /// A header carrying the client's address, set by a proxy in front (`x-real-ip`, or
        /// `x-forwarded-for`); read only from the peers in PAYONCE_TRUSTED_PROXIES, so the
        /// per-address limits count clients instead of the proxy.
        #[arg(env = "PAYONCE_CLIENT_IP_HEADER")]
        pub client_ip_header: Option<String>,
        /// The proxies whose PAYONCE_CLIENT_IP_HEADER is believed: CIDR blocks or addresses,
        /// comma-separated. Any other peer is the client itself, whatever it sends.
        #[arg(env = "PAYONCE_TRUSTED_PROXIES", value_delimiter = ',', value_parser = network)]
        pub trusted_proxies: Vec<IpNet>,
    }
}

impl LimitsConfig {
    /// A positive head timeout; a client-address header believed only from named
    /// proxies, and named proxies coming with the header they set.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.header_read_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "PAYONCE_HEADER_READ_TIMEOUT must be positive".into(),
            ));
        }
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
            (Some(_), true) => Err(ConfigError::Invalid(
                "PAYONCE_CLIENT_IP_HEADER needs PAYONCE_TRUSTED_PROXIES: the proxies (CIDR blocks) whose header is believed".into(),
            )),
            (None, false) => Err(ConfigError::Invalid(
                "PAYONCE_TRUSTED_PROXIES is set but PAYONCE_CLIENT_IP_HEADER is not: name the header the proxies set".into(),
            )),
            _ => Ok(()),
        }
    }

    /// The rate limits.
    pub fn rates(&self) -> Rates {
        Rates {
            accounts_per_minute: self.accounts_per_minute,
            tickets_per_second: self.tickets_per_second,
            spends_per_second: self.spends_per_second,
            orders_per_second: self.orders_per_second,
            bad_keys_per_minute: self.bad_keys_per_minute,
        }
    }

    /// The header the client's address comes in, behind a proxy (checked to be a header
    /// name by [`Self::check`]).
    pub fn client_ip_header(&self) -> Option<axum::http::HeaderName> {
        self.client_ip_header
            .as_deref()
            .and_then(|name| axum::http::HeaderName::from_bytes(name.as_bytes()).ok())
    }
}
