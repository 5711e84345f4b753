//! The bank: the outside party payonce pays out through, played by a small HTTP service
//! with a store of its own. It executes each transfer at most once per idempotency key,
//! answers "did you do it?" by key, closes a key for good on request, lists what it did,
//! audits itself — and, when asked, fails in the ways a real bank's API does.
//!
//! # Map
//! - [`Bank`] (this file): open a store ([`Bank::open`]), serve it on a listener
//!   ([`Bank::serve`], returning a [`ServerHandle`]), audit it ([`Bank::audit`]).
//! - `http.rs`: the routes and handlers, and the problem+json answers.
//! - `server.rs`: the accept loop, serving each connection itself so a fault can drop a
//!   connection without an answer or take the whole listener down; [`ServerHandle`].
//! - `store.rs`: the tables on SQLite or PostgreSQL — the transaction that executes a
//!   transfer, the close, the list.
//! - `faults.rs`: [`Fault`], [`FaultRates`], and the per-request draw.
//! - `model.rs`: [`IdempotencyKey`], [`TransferRequest`], [`TransferView`], the bounds.
//! - `audit.rs`: the invariants and [`AuditReport`].
//! - `main.rs`: the `payonce-bank` command line.
//! - [`testing`] (`testing.rs`, feature `test-support`): the binary started as a process
//!   for other crates' tests and tools.
//!
//! # Once per key
//! A transfer executes in one database transaction that inserts its row under the UNIQUE
//! idempotency key, with its stored answer and its request's fingerprint, and adds the
//! amount to the destination's running total and the grand total. Requests racing on one
//! key are decided by that row: one inserts, the others find it and replay its answer. A
//! declined transfer is stored the same way, so a retry is declined again. Closing a key
//! writes the same row as `closed` when no transfer holds it: from then on nothing ever
//! executes under the key, which is what lets payonce reverse a payout the bank never made.

mod audit;
mod faults;
mod http;
mod model;
mod server;
mod store;
#[cfg(feature = "test-support")]
pub mod testing;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;

pub use audit::{AuditReport, Violation};
pub use faults::{Fault, FaultRates, InvalidRates, UnknownFault};
pub use http::{
    ClosedKey, DESTINATION_CLOSED, FAULT_HEADER, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, MAX_BODY,
    MAX_PAGE, PROBLEM_JSON, TransferPage,
};
pub use model::{
    IdempotencyKey, InvalidInput, MAX_AMOUNT, MAX_DESTINATION, MAX_KEY, MAX_REFERENCE, State,
    TransferBody, TransferRequest, TransferView,
};
pub use server::ServerHandle;
pub use store::StoreError;

use store::Store;

/// Where the bank keeps its store when no URL is given.
pub const DEFAULT_DATABASE_URL: &str = "sqlite:data/payonce-bank.db";

/// How to open and run the bank.
#[derive(Clone, Debug)]
pub struct BankOptions {
    /// `sqlite:path` or `postgres://…`.
    pub database_url: String,
    /// How often each fault strikes a `POST /v1/transfers`.
    pub faults: FaultRates,
    /// Seeds the fault draw (a reproducible sequence); random when none.
    pub seed: Option<u64>,
    /// How long `commit-then-slow` holds its answer.
    pub slow_for: Duration,
    /// How long `down` refuses connections.
    pub down_for: Duration,
    /// The `Retry-After` of `unavailable` and of a throttle.
    pub retry_after: Duration,
    /// How many `POST /v1/transfers` the bank throttles before it takes any: each is
    /// answered 429 `rate-limited` with `Retry-After`, nothing done — a bank pacing its
    /// callers, which asks them to wait and refuses nothing. 0: none.
    pub throttle_first: u64,
    /// Whether a request may name its fault in [`FAULT_HEADER`].
    pub demo_header: bool,
}

impl Default for BankOptions {
    fn default() -> Self {
        Self {
            database_url: DEFAULT_DATABASE_URL.to_owned(),
            faults: FaultRates::default(),
            seed: None,
            slow_for: Duration::from_secs(10),
            down_for: Duration::from_secs(2),
            retry_after: Duration::from_secs(1),
            throttle_first: 0,
            demo_header: false,
        }
    }
}

/// Why the bank could not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The fault rates are not probabilities.
    #[error(transparent)]
    Rates(#[from] InvalidRates),
    /// The store could not open.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An open bank: its store and how it behaves.
#[derive(Debug)]
pub struct Bank {
    store: Store,
    options: BankOptions,
}

impl Bank {
    /// Opens the store at `options.database_url` (a SQLite file and its directory are
    /// created when missing) and applies the migrations.
    pub async fn open(options: BankOptions) -> Result<Self, OpenError> {
        options.faults.validate()?;
        let store = Store::open(&options.database_url, true).await?;
        Ok(Self { store, options })
    }

    /// Opens an existing store to read it (the audit): a missing SQLite file is an error,
    /// not a new empty bank.
    pub async fn open_existing(database_url: &str) -> Result<Self, OpenError> {
        let store = Store::open(database_url, false).await?;
        let options = BankOptions {
            database_url: database_url.to_owned(),
            ..BankOptions::default()
        };
        Ok(Self { store, options })
    }

    /// Serves the bank on `listener` until the handle is shut down.
    pub fn serve(&self, listener: TcpListener) -> std::io::Result<ServerHandle> {
        let (down, down_requests) = mpsc::channel(1);
        let app = http::App {
            store: self.store.clone(),
            faults: faults::Faults::new(self.options.faults, self.options.seed),
            slow_for: self.options.slow_for,
            retry_after: self.options.retry_after,
            throttles_left: AtomicU64::new(self.options.throttle_first),
            demo_header: self.options.demo_header,
            down,
        };
        server::spawn(
            listener,
            http::router(Arc::new(app)),
            down_requests,
            self.options.down_for,
        )
    }

    /// Checks the bank's invariants.
    pub async fn audit(&self) -> Result<AuditReport, StoreError> {
        audit::audit(&self.store).await
    }

    /// Closes the store's connections.
    pub async fn close(&self) {
        self.store.close_pool().await;
    }
}
