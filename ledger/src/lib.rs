//! The ledger: accounts, tickets and entries, and the one transaction that applies an
//! operation. It knows nothing of Redis or HTTP.
//!
//! # Map
//! - [`Ledger`] (this file): the handle the API holds — open (migrations run on open),
//!   accounts and orders (once per idempotency key, with the `_once` creates), API keys,
//!   tickets, entries, [`Ledger::apply`], [`Ledger::audit`], [`Ledger::reap`].
//! - `store.rs`: the `Store` seam the handle holds, and its one implementation over
//!   [`sqlx`], written once and generic over PostgreSQL and SQLite: the reads and the
//!   simple writes; each longer step is in its own room below.
//! - `sql_store.rs`: `SqlStore` — the pools, and running a statement or a whole write again
//!   when its connection dies.
//! - `dialect.rs`: what differs between the two databases (write transactions, the clock,
//!   row locks, the reaper's statements). `rows.rs`: the rows as the databases hold them,
//!   read into the model's types; the columns; an entry as every writer inserts it.
//! - `apply.rs`: the transaction that applies an operation — through the group commit
//!   first on PostgreSQL, else lock and judge the ticket, move under the fencing check,
//!   write the entry, store the outcome; an order payment under its order's lock.
//! - `batch.rs`: PostgreSQL's group commit — concurrent spends gathered into one statement
//!   ([`Batches`] counts their sizes); `stand_ins.rs`: the body rendered before the
//!   statement said the numbers, with stand-ins it replaces.
//! - `inserts.rs`: the creates' transactions (an account with its opening entry, an order),
//!   each safe to run again after a lost answer.
//! - `model.rs`: identifiers, validated amounts ([`Amount`], [`PointsToSpend`],
//!   [`NewAccount`], [`NewOrder`]), [`Ticket`], [`Order`], [`Entry`], [`Operation`],
//!   outcomes.
//! - `creates.rs`: creates sent with an idempotency key — [`CreateScope`], [`Created`],
//!   where the first answer is kept and how an account's API key is sealed in it.
//! - `payouts.rs`: payouts — money leaving for an outside bank ([`payouts::Payout`], its
//!   job, the bank's [`payouts::Settlement`]); `outbox.rs`: their transactions — the debit
//!   with the payout and its outbox job, and claiming, settling and postponing jobs;
//!   `claims.rs`: the claim every kind of outbox job (payouts, deliveries) is taken with,
//!   and when the next one is due ([`Claimed`]); `bells.rs`: what wakes the jobs' workers
//!   ([`Ledger::ring`], [`Ledger::rung`]) — in this process, and on PostgreSQL in every
//!   instance, by a notification.
//! - [`webhooks`] (`webhooks.rs`): events — a committed outcome, announced — the
//!   endpoints that want them and the deliveries between the two; `events.rs`: their
//!   statements — the deliveries written in the outcome's transaction (a spend's outcome
//!   is its own event; a payout's settlement writes an `events` row), the
//!   endpoints' creation, rotation and deletion, and the outbox's steps for deliveries.
//! - [`holds`] (`holds.rs`): holds and refunds — their identifiers, states and model;
//!   the database holds their rules on its own, and the audit checks them;
//!   `holding.rs`: their transactions — a hold placed, captured, voided, expired;
//!   `hold_batch.rs`: the group commit of holds placed, captured and voided on PostgreSQL.
//! - `lottery.rs`: the prize table.
//! - `audit.rs`: the invariants, the queries that check them, and the audit that runs them.
//! - [`requests`] (`requests.rs`): the webhook endpoints' POSTs sent with an idempotency
//!   key (creation, rotation, a retry by hand) and where their first answer is kept.
//! - `reaper.rs`: what the retention lets go (old tickets, outcomes, creation records, the
//!   webhook requests' records, ended deliveries).
//! - `demo/` (cargo feature `demo` only): the demonstration's unguarded read-check-write,
//!   `Ledger::read_unguarded` and `Ledger::write_unguarded`.
//! - `error.rs`: [`LedgerError`], [`ApplyError`], and the classification of database errors
//!   (unavailable vs. constraint vs. other).
//! - `db_types.rs`, `api_key.rs`: timestamps, JSON text and identifiers as columns of
//!   both databases; key generation and hashing.
//! - `migrations.rs`: the schema's migrations, embedded by `build.rs`.
//!
//! # The transaction that applies an operation
//! `apply(ticket, operation, fingerprint, fencing_token)` runs in one database
//! transaction: it locks the ticket; replays a stored outcome (or refuses a different
//! request under the same ticket); refuses an expired ticket; then moves money and points
//! with one conditional UPDATE that also checks and records the fencing token; writes the
//! entry when something moved; and stores the outcome — success or business refusal —
//! under the ticket. Either all of that commits or none of it does, so there is no moment
//! at which money moved but the outcome was not recorded, or the reverse. On PostgreSQL a
//! spend that goes through does all of that in one statement shared with the spends that
//! arrived with it (`batch.rs`); the others settle on the transaction path. An order
//! payment runs under its order's lock: the transaction locks the order after the ticket,
//! checks and records the order's fencing token, refuses an order paid already (stored,
//! 409), and marks it paid with the entry.

mod api_key;
mod apply;
mod audit;
mod batch;
mod bells;
mod claims;
mod creates;
mod db_types;
#[cfg(feature = "demo")]
mod demo;
mod dialect;
mod error;
mod events;
mod hold_batch;
mod holding;
pub mod holds;
mod inserts;
pub mod lottery;
mod migrations;
mod model;
mod outbox;
pub mod payouts;
mod reaper;
pub mod requests;
mod rows;
mod sql_store;
mod stand_ins;
mod store;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod webhooks;

use std::net::IpAddr;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

pub use audit::{Rule, Violation};
pub use batch::Batches;
pub use bells::{CHANNEL as BELL_CHANNEL, JobKind};
pub use claims::Claimed;
pub use creates::{CreateRenderer, CreateScope, Created};
#[cfg(feature = "demo")]
pub use demo::{UnguardedPayment, UnguardedRead};
pub use error::{ApplyError, LedgerError};
pub use model::{
    Account, AccountId, Amount, Applied, ApplyRequest, Entry, EntryKind, Execution, InvalidInput,
    Judgement, MAX_AMOUNT, NewAccount, NewOrder, Operation, OperationResult, Order, OrderId,
    Outcome, OutcomeKind, PointsToSpend, Refusal, Renderer, StoredResponse, Ticket, TicketId,
    TicketState,
};

use bells::Bells;
use creates::{CreateKey, NewCreation};
use db_types::Timestamp;
use payouts::{
    JobOutcome, Payout, PayoutCounts, PayoutId, PayoutJob, PayoutRenderer, PayoutStatus, Settlement,
};
use sql_store::SqlStore;
use store::Store;

/// How to open the ledger.
#[derive(Clone, Debug)]
pub struct LedgerOptions {
    /// Pool size (PostgreSQL); SQLite reads with up to 8 connections and writes with one.
    pub max_connections: u32,
    /// How long a request waits for a pooled connection before the database counts as
    /// unavailable.
    pub acquire_timeout: Duration,
    /// SQLite: how long a write may queue for the one writer connection. Writes queue in
    /// arrival order, so a burst is worked off rather than refused; this bounds the queue
    /// by time.
    pub write_queue_timeout: Duration,
    /// PostgreSQL's group commit: the most spends one batch takes (1: every spend is
    /// its own transaction, still one round trip).
    pub batch_max: usize,
    /// PostgreSQL's group commit: how many batches may be in flight at once, each on a
    /// pooled connection; an account's spends always go to the same worker.
    pub batch_workers: usize,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(3),
            write_queue_timeout: Duration::from_secs(20),
            batch_max: 64,
            batch_workers: 2,
        }
    }
}

/// What [`Ledger::reap`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Unused tickets deleted (expired longer than the retention ago).
    pub deleted_unused: u64,
    /// Used tickets whose stored response was dropped (expired longer than the retention
    /// ago); the ticket itself stays, so it can never run again.
    pub pruned_outcomes: u64,
    /// Creation records and webhook requests' records deleted (made longer than the
    /// retention ago): their idempotency keys are free again.
    pub expired_creations: u64,
}

/// The ledger. Cheap to clone; clones share one connection pool and one key cache.
#[derive(Clone, Debug)]
pub struct Ledger {
    store: Arc<dyn Store>,
    database: &'static str,
    /// What wakes the outbox's workers when work is queued (`bells.rs`).
    bells: Arc<Bells>,
    /// API key hash → account. Keys never change and accounts are never deleted, so an
    /// entry can never go stale; this saves a query on every authenticated request.
    /// Unknown keys are not cached.
    keys: moka::sync::Cache<[u8; 32], AccountId>,
}

/// A pooled PostgreSQL connection idle longer than this is pinged before it is used.
const IDLE_BEFORE_PING: Duration = Duration::from_secs(10);

/// How long a PostgreSQL session may sit idle inside a transaction before the server ends
/// it (see [`Ledger::open_postgres`]).
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "60s";

/// The longest a ticket may stay usable: ten years (expiry arithmetic stays far from any
/// timestamp limit).
pub const MAX_TICKET_TTL: Duration = Duration::from_secs(10 * 366 * 24 * 60 * 60);

/// How many API keys each instance remembers.
const KEY_CACHE_CAPACITY: u64 = 100_000;

/// A new account, whole — its id, its creation time — before it is written, with its API
/// key and the key's hash: a write that must be repeated repeats exactly this.
fn opened(new: &NewAccount) -> (Account, String, [u8; 32]) {
    let key = api_key::generate();
    let hash = api_key::hash(&key);
    let account = Account {
        id: AccountId::random(),
        name: new.name().to_owned(),
        balance: new.balance(),
        available: new.balance(),
        points: new.points(),
        created_at: Timestamp::now().0,
    };
    (account, key, hash)
}

/// A new order, whole, before it is written (as [`opened`]).
fn placed(account_id: AccountId, new: &NewOrder) -> Order {
    Order {
        id: OrderId::random(),
        account_id,
        amount: new.amount(),
        description: new.description().to_owned(),
        paid_by_ticket: None,
        paid_at: None,
        created_at: Timestamp::now().0,
    }
}

impl Ledger {
    fn with_store(store: Arc<dyn Store>, database: &'static str, bells: Arc<Bells>) -> Self {
        Self {
            store,
            database,
            bells,
            keys: moka::sync::Cache::new(KEY_CACHE_CAPACITY),
        }
    }
}

impl Ledger {
    /// Opens the ledger at `url` — `postgres://…` or `sqlite:path` — and applies the
    /// migrations.
    pub async fn open(url: &str, options: &LedgerOptions) -> Result<Self, LedgerError> {
        if url.starts_with("sqlite:") {
            let connect = SqliteConnectOptions::from_str(url)?.create_if_missing(true);
            Self::open_sqlite_with(connect, options).await
        } else {
            Self::open_postgres(url, options).await
        }
    }

    /// Opens a PostgreSQL ledger and applies the migrations.
    pub async fn open_postgres(url: &str, options: &LedgerOptions) -> Result<Self, LedgerError> {
        // A holder that pauses inside a transaction (GC, SIGSTOP, a stalled network) keeps
        // its row locks — the account, the ticket — and blocks every later writer of that
        // account until TCP notices the peer is gone, which can take many minutes. With
        // this, the server ends a session left idle inside a transaction for 60 s: the
        // transaction rolls back (nothing half-done commits), the locks are released, and
        // the paused holder's next statement fails as unavailable. The ledger's
        // transactions never wait on anything between their statements, so a healthy
        // client is nowhere near this. (statement_timeout is deliberately not set.)
        //
        // Generic plans: every statement of the ledger is parameterised and finds its rows
        // by key, so one plan per statement fits every call. Left to choose, the server
        // keeps planning the group commit's large statement afresh at every call (its
        // custom plans look cheaper than the generic one for small batches), which costs
        // more than running it.
        let connect = PgConnectOptions::from_str(url)?.options([
            (
                "idle_in_transaction_session_timeout",
                IDLE_IN_TRANSACTION_TIMEOUT,
            ),
            ("plan_cache_mode", "force_generic_plan"),
        ]);
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            // Pinging every connection before use would add a round trip to every
            // statement; only a connection that sat idle long enough to have been cut
            // (a database restart, a proxy timeout) is checked first. A broken one that
            // slips through fails its request with 503, which is safe to retry.
            .test_before_acquire(false)
            .before_acquire(|connection, meta| {
                Box::pin(async move {
                    if meta.idle_for < IDLE_BEFORE_PING {
                        return Ok(true);
                    }
                    Ok(sqlx::Connection::ping(connection).await.is_ok())
                })
            })
            .connect_with(connect)
            .await?;
        migrations::postgres().run(&pool).await?;
        let bells = Bells::on_postgres(pool.clone());
        let shape = batch::Shape {
            max: options.batch_max.max(1),
            workers: options.batch_workers,
            // As for BEGIN (`SqlStore::new`): a restart kills every pooled connection.
            tries: options.max_connections + 1,
        };
        // Holds placed, captured and voided go through a group commit of their own, with
        // as many workers; the sizes of both are counted together.
        let sizes = Arc::new(batch::Batches::new(shape.max));
        let batcher =
            batch::Batcher::start(pool.clone(), Arc::clone(&bells), shape, Arc::clone(&sizes));
        let hold_batcher = batch::Batcher::start(pool.clone(), Arc::clone(&bells), shape, sizes);
        let store = SqlStore::new(pool.clone(), pool, Arc::clone(&bells))
            .with_batchers(batcher, hold_batcher);
        Ok(Self::with_store(Arc::new(store), "postgres", bells))
    }

    /// Opens (creating if needed) a SQLite ledger file and applies the migrations.
    pub async fn open_sqlite(path: &Path, options: &LedgerOptions) -> Result<Self, LedgerError> {
        let connect = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true);
        Self::open_sqlite_with(connect, options).await
    }

    async fn open_sqlite_with(
        connect: SqliteConnectOptions,
        options: &LedgerOptions,
    ) -> Result<Self, LedgerError> {
        let connect = connect
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        // One writer (see `SqlStore::writer`); it runs the migrations before any reader
        // connects.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.write_queue_timeout)
            .connect_with(connect.clone())
            .await?;
        migrations::sqlite().run(&writer).await?;
        // Read-only: a write sent to a reader by mistake fails at once, instead of
        // contending for the file lock beside the writer and waiting out the busy timeout.
        let readers = SqlitePoolOptions::new()
            .max_connections(options.max_connections.clamp(1, 8))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect.read_only(true))
            .await?;
        let bells = Arc::new(Bells::here_only());
        let store = SqlStore::new(readers, writer, Arc::clone(&bells));
        Ok(Self::with_store(Arc::new(store), "sqlite", bells))
    }

    /// `"postgres"` or `"sqlite"`.
    pub fn database(&self) -> &'static str {
        self.database
    }

    /// Opens an account with its opening entry. Returns it and its API key, which is
    /// not stored and cannot be shown again.
    pub async fn create_account(&self, new: &NewAccount) -> Result<(Account, String), LedgerError> {
        let (account, key, hash) = opened(new);
        self.store
            .create_account(&account, hash.to_vec(), None)
            .await?;
        self.keys.insert(hash, account.id);
        Ok((account, key))
    }

    /// Opens an account as [`create_account`](Self::create_account) does, once per
    /// idempotency `key` of the `client`'s (see `creates.rs`): the first request with the
    /// key opens it and stores `render`'s body under the key, in the same transaction; a
    /// repeat with the same `fingerprint` gets that answer again, the same API key beside
    /// it — kept sealed by the key, never in clear; another fingerprint is
    /// [`LedgerError::CreateKeyReused`]. Returns the answer and the API key.
    pub async fn create_account_once(
        &self,
        new: &NewAccount,
        client: IpAddr,
        key: uuid::Uuid,
        fingerprint: &str,
        render: &CreateRenderer<Account>,
    ) -> Result<(Created<AccountId>, String), LedgerError> {
        let (account, api_key, hash) = opened(new);
        let once = CreateKey::new(CreateScope::AccountsFrom(client), key);
        let creation = NewCreation {
            key_hash: once.record_id(),
            fingerprint,
            response: StoredResponse {
                status: 201,
                body: render(&account),
            },
            sealed_api_key: Some(once.seal(account.id.0, api_key.as_bytes())),
        };
        let found = self
            .store
            .create_account(&account, hash.to_vec(), Some(&creation))
            .await?;
        let Some(found) = found else {
            self.keys.insert(hash, account.id);
            return Ok((
                Created {
                    id: account.id,
                    response: creation.response,
                    replayed: false,
                },
                api_key,
            ));
        };
        let (created, sealed) =
            creates::judge(found, account.id, |row| row.account(), fingerprint)?;
        let sealed = sealed.ok_or_else(|| {
            LedgerError::Corrupt(format!("account {}: no sealed API key", created.id))
        })?;
        let api_key = String::from_utf8(once.seal(created.id.0, &sealed)).map_err(|_| {
            LedgerError::Corrupt(format!("account {}: unreadable sealed API key", created.id))
        })?;
        Ok((created, api_key))
    }

    /// The account of an API key this instance remembers, without asking the database:
    /// `None` for a key it has not seen (or has forgotten), known or not.
    pub fn remembered(&self, api_key: &str) -> Option<AccountId> {
        self.keys.get(&api_key::hash(api_key))
    }

    /// The account an API key belongs to, if any.
    pub async fn authenticate(&self, api_key: &str) -> Result<Option<AccountId>, LedgerError> {
        let hash = api_key::hash(api_key);
        if let Some(account) = self.keys.get(&hash) {
            return Ok(Some(account));
        }
        let found = self.store.authenticate(hash.to_vec()).await?;
        if let Some(account) = found {
            self.keys.insert(hash, account);
        }
        Ok(found)
    }

    /// An account.
    pub async fn account(&self, id: AccountId) -> Result<Option<Account>, LedgerError> {
        self.store.account(id).await
    }

    /// The highest fencing token the account has accepted: after the lock store lost its
    /// data, its counter is raised to this.
    pub async fn fencing_token(&self, id: AccountId) -> Result<Option<u64>, LedgerError> {
        self.store.fencing_token(id).await
    }

    /// Issues a ticket to an account, usable for `ttl` from now by the database's clock
    /// (at most [`MAX_TICKET_TTL`]).
    pub async fn issue_ticket(
        &self,
        account_id: AccountId,
        ttl: Duration,
    ) -> Result<Ticket, LedgerError> {
        self.store
            .issue_ticket(account_id, ttl.min(MAX_TICKET_TTL))
            .await
    }

    /// A ticket and, once used, its outcome.
    pub async fn ticket(&self, id: TicketId) -> Result<Option<Ticket>, LedgerError> {
        self.store.ticket(id).await
    }

    /// Places an order for `account_id` to pay once.
    pub async fn create_order(
        &self,
        account_id: AccountId,
        new: &NewOrder,
    ) -> Result<Order, LedgerError> {
        let order = placed(account_id, new);
        self.store.create_order(&order, None).await?;
        Ok(order)
    }

    /// Places an order as [`create_order`](Self::create_order) does, once per idempotency
    /// `key` of the account's: the first request with the key places it and stores
    /// `render`'s body under the key, in the same transaction; a repeat with the same
    /// `fingerprint` gets that answer again; another fingerprint is
    /// [`LedgerError::CreateKeyReused`].
    pub async fn create_order_once(
        &self,
        account_id: AccountId,
        new: &NewOrder,
        key: uuid::Uuid,
        fingerprint: &str,
        render: &CreateRenderer<Order>,
    ) -> Result<Created<OrderId>, LedgerError> {
        let order = placed(account_id, new);
        let once = CreateKey::new(CreateScope::OrdersOf(account_id), key);
        let creation = NewCreation {
            key_hash: once.record_id(),
            fingerprint,
            response: StoredResponse {
                status: 201,
                body: render(&order),
            },
            sealed_api_key: None,
        };
        match self.store.create_order(&order, Some(&creation)).await? {
            None => Ok(Created {
                id: order.id,
                response: creation.response,
                replayed: false,
            }),
            Some(found) => Ok(creates::judge(found, order.id, |row| row.order(), fingerprint)?.0),
        }
    }

    /// An order, paid or open.
    pub async fn order(&self, id: OrderId) -> Result<Option<Order>, LedgerError> {
        self.store.order(id).await
    }

    /// Up to `limit` of an account's entries with ids above `after`, oldest first.
    pub async fn entries(
        &self,
        account_id: AccountId,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<Entry>, LedgerError> {
        self.store
            .entries(account_id, after.unwrap_or(0), i64::from(limit))
            .await
    }

    /// Applies an operation under a ticket, in one transaction (see the crate docs).
    /// `render` builds the response body stored under the ticket. Traced as
    /// `ledger.apply`; on PostgreSQL its group commit's batch is a span of its own,
    /// `ledger.batch`, linked to every spend it carried.
    #[tracing::instrument(name = "ledger.apply", skip_all, fields(fencing_token = request.fencing_token))]
    pub async fn apply(
        &self,
        request: ApplyRequest<'_>,
        render: &Renderer,
    ) -> Result<Applied, ApplyError> {
        self.store.apply(&request, render).await
    }

    /// A hold, as of the database's clock: one past its expiry is expired, whether or not
    /// the sweeper has recorded it yet.
    pub async fn hold(&self, id: holds::HoldId) -> Result<Option<holds::Hold>, LedgerError> {
        self.store.hold(id).await
    }

    /// Records every held hold past its expiry as expired, by the database's clock, in
    /// transactions of up to `batch`, each hold released from its account's `held` and its
    /// `hold.expired` event written with it (`render` shows the hold as the API does); how
    /// many. Safe on any number of instances at once: each hold is expired once, and never
    /// one a capture or a void holds.
    pub async fn expire_holds(
        &self,
        batch: u32,
        render: &holds::HoldRenderer,
    ) -> Result<u64, LedgerError> {
        let batch = i64::from(batch.max(1));
        let mut total = 0;
        loop {
            let expired = self.store.expire_holds(batch, render).await?.len() as u64;
            total += expired;
            if expired < batch.unsigned_abs() {
                return Ok(total);
            }
        }
    }

    /// How many holds are held, and how many of them are past their expiry but not yet
    /// recorded expired by a sweep.
    pub async fn hold_counts(&self) -> Result<holds::HoldCounts, LedgerError> {
        self.store.hold_counts().await
    }

    /// A payout, pending or settled.
    pub async fn payout(&self, id: PayoutId) -> Result<Option<Payout>, LedgerError> {
        self.store.payout(id).await
    }

    /// Up to `limit` of `account`'s payouts after `after`, in `status` where given: pages
    /// in the order the payouts committed (their debit entries' order), so paging on never
    /// passes over a payout that commits late — one whose transaction read the clock
    /// before another's but committed after it (`outbox.rs`, `PAYOUTS`). One account at a
    /// time: payouts of different accounts commit in no order a page could follow; read
    /// every account's with [`every_payout`](Self::every_payout).
    pub async fn payouts(
        &self,
        account: AccountId,
        status: Option<PayoutStatus>,
        after: Option<PayoutId>,
        limit: u32,
    ) -> Result<Vec<Payout>, LedgerError> {
        self.store
            .payouts(account, status, after, i64::from(limit))
            .await
    }

    /// Every payout, as of one instant, oldest first: one statement, whose snapshot holds
    /// every payout committed before it began — where pages, each a snapshot of its own,
    /// can pass over one that commits between them. What `payonce reconcile` compares
    /// with the bank.
    pub async fn every_payout(&self) -> Result<Vec<Payout>, LedgerError> {
        self.store.every_payout().await
    }

    /// How many payouts are pending, and since when the oldest: what a metric reads every
    /// few seconds, on the partial index of pending payouts (`payout_counts` counts every
    /// payout).
    pub async fn pending_payouts(
        &self,
    ) -> Result<(u64, Option<time::OffsetDateTime>), LedgerError> {
        self.store.pending_payouts().await
    }

    /// How many payouts stand in each status, and since when the oldest pending one.
    pub async fn payout_counts(&self) -> Result<PayoutCounts, LedgerError> {
        self.store.payout_counts().await
    }

    /// Claims up to `max` due payout jobs for `worker`, each for `lease` by the
    /// database's clock: another claim takes a job only once its lease ran out.
    pub async fn claim_payouts(
        &self,
        worker: &str,
        lease: Duration,
        max: u32,
    ) -> Result<Vec<PayoutJob>, LedgerError> {
        Ok(self.claim_payouts_or_next(worker, lease, max).await?.jobs)
    }

    /// [`Ledger::claim_payouts`], and when none was due, how long until one is: what an
    /// idle worker sleeps for.
    pub async fn claim_payouts_or_next(
        &self,
        worker: &str,
        lease: Duration,
        max: u32,
    ) -> Result<Claimed<PayoutJob>, LedgerError> {
        self.store
            .claim_payouts(worker, lease, i64::from(max))
            .await
    }

    /// Work of `kind` was queued (a commit wrote outbox jobs): wakes a worker of this
    /// process and, on PostgreSQL, the other instances' (`bells.rs`).
    pub fn ring(&self, kind: JobKind) {
        self.bells.ring(kind);
    }

    /// Wakes one more of this process's waiting workers of `kind`: a worker that found more
    /// work than it takes at once calls for help.
    pub fn wake_another(&self, kind: JobKind) {
        self.bells.wake_here(kind);
    }

    /// Waits until work of `kind` may have been queued, here or elsewhere. A hint only:
    /// workers still look on their poll interval.
    pub async fn rung(&self, kind: JobKind) {
        self.bells.rung(kind).await;
    }

    /// Records the bank's final word on a claimed job — the payout settled and, for a
    /// refusal, the amount credited back with a reversal entry, in one transaction.
    /// `false` when the job was claimed again or settled meanwhile: nothing was written.
    /// `render` makes the payout as the settlement's event shows it.
    pub async fn settle_payout(
        &self,
        job: &PayoutJob,
        settlement: &Settlement,
        render: &PayoutRenderer,
    ) -> Result<bool, LedgerError> {
        let outcome = JobOutcome::Settled(settlement.clone());
        let recorded = self
            .store
            .record_payouts(&[(job, &outcome)], render)
            .await?;
        Ok(recorded.first().copied().unwrap_or(false))
    }

    /// Puts a claimed job back for another attempt `after` from now, noting `error`;
    /// `false` as for [`settle_payout`](Self::settle_payout).
    pub async fn postpone_payout(
        &self,
        job: &PayoutJob,
        after: Duration,
        error: &str,
    ) -> Result<bool, LedgerError> {
        let outcome = JobOutcome::Postponed {
            after,
            error: error.to_owned(),
            throttled: false,
        };
        let recorded = self
            .store
            .record_payouts(&[(job, &outcome)], &|_: &Payout| serde_json::Value::Null)
            .await?;
        Ok(recorded.first().copied().unwrap_or(false))
    }

    /// Records what came of several claimed jobs, in one transaction (a worker's batch):
    /// for each, whether it was recorded (`false`: claimed again or settled meanwhile).
    /// `render` makes a settled payout as its event (`payout.succeeded`, `payout.failed`)
    /// shows it: as the API does.
    pub async fn record_payouts(
        &self,
        outcomes: &[(&PayoutJob, &JobOutcome)],
        render: &PayoutRenderer,
    ) -> Result<Vec<bool>, LedgerError> {
        self.store.record_payouts(outcomes, render).await
    }

    /// Creates a webhook endpoint, unless its account has
    /// [`MAX_ENDPOINTS_PER_ACCOUNT`](webhooks::MAX_ENDPOINTS_PER_ACCOUNT) already (`None`).
    pub async fn create_endpoint(
        &self,
        new: &webhooks::NewEndpoint,
    ) -> Result<Option<webhooks::Endpoint>, LedgerError> {
        let created = self
            .store
            .create_endpoint(new, webhooks::MAX_ENDPOINTS_PER_ACCOUNT, None)
            .await?;
        Ok(created.unwrap_or(None))
    }

    /// Creates a webhook endpoint as [`create_endpoint`](Self::create_endpoint) does, once
    /// per idempotency key of the account's ([`requests`]): the first request with the key
    /// creates it and keeps `render`'s body and `secret` under the key, in the same
    /// transaction; a repeat with the same fingerprint gets them again and creates nothing;
    /// another fingerprint is [`LedgerError::CreateKeyReused`]. A refusal (the limit) keeps
    /// nothing.
    pub async fn create_endpoint_once(
        &self,
        new: &webhooks::NewEndpoint,
        key: &requests::RequestKey<'_>,
        render: &(dyn Fn(&webhooks::Endpoint) -> serde_json::Value + Send + Sync),
        secret: &str,
    ) -> Result<requests::Keyed<Option<webhooks::Endpoint>>, LedgerError> {
        let answer = |endpoint: Option<&webhooks::Endpoint>| requests::Answer {
            status: 201,
            body: endpoint.map(render).unwrap_or_default(),
            secret: Some(secret.to_owned()),
        };
        let keeping = events::Keeping {
            key: requests::KeptKey::new(key),
            answer: &answer,
        };
        let created = self
            .store
            .create_endpoint(new, webhooks::MAX_ENDPOINTS_PER_ACCOUNT, Some(&keeping))
            .await?;
        keyed(&keeping, created)
    }

    /// A webhook endpoint, unless deleted.
    pub async fn endpoint(
        &self,
        id: webhooks::EndpointId,
    ) -> Result<Option<webhooks::Endpoint>, LedgerError> {
        self.store.endpoint(id).await
    }

    /// An account's webhook endpoints, oldest first.
    pub async fn endpoints(
        &self,
        account: AccountId,
    ) -> Result<Vec<webhooks::Endpoint>, LedgerError> {
        self.store.endpoints(account).await
    }

    /// Rotates an endpoint's secret: `sealed` signs from now on, and the secret before it
    /// signs too for `window`. `None` if `account` has no such endpoint.
    pub async fn rotate_endpoint_secret(
        &self,
        account: AccountId,
        id: webhooks::EndpointId,
        sealed: &[u8],
        window: Duration,
    ) -> Result<Option<webhooks::Endpoint>, LedgerError> {
        let rotated = self
            .store
            .rotate_endpoint_secret(account, id, sealed, window, None)
            .await?;
        Ok(rotated.unwrap_or(None))
    }

    /// Rotates an endpoint's secret as
    /// [`rotate_endpoint_secret`](Self::rotate_endpoint_secret) does, once per idempotency
    /// key of the account's: a repeat with the same fingerprint rotates nothing and gets
    /// the first answer (`render`'s body, and `secret`) again — so a rotation sent twice
    /// leaves the secret the receiver holds signing through its window.
    pub async fn rotate_endpoint_secret_once(
        &self,
        id: webhooks::EndpointId,
        sealed: &[u8],
        window: Duration,
        key: &requests::RequestKey<'_>,
        render: &(dyn Fn(&webhooks::Endpoint) -> serde_json::Value + Send + Sync),
        secret: &str,
    ) -> Result<requests::Keyed<Option<webhooks::Endpoint>>, LedgerError> {
        let answer = |endpoint: Option<&webhooks::Endpoint>| requests::Answer {
            status: 200,
            body: endpoint.map(render).unwrap_or_default(),
            secret: Some(secret.to_owned()),
        };
        let keeping = events::Keeping {
            key: requests::KeptKey::new(key),
            answer: &answer,
        };
        let rotated = self
            .store
            .rotate_endpoint_secret(key.account, id, sealed, window, Some(&keeping))
            .await?;
        keyed(&keeping, rotated)
    }

    /// Deletes an endpoint of `account`: it gets no more events, and its deliveries not
    /// yet made end. `false` if there was none.
    pub async fn delete_endpoint(
        &self,
        account: AccountId,
        id: webhooks::EndpointId,
    ) -> Result<bool, LedgerError> {
        self.store.delete_endpoint(account, id).await
    }

    /// Claims up to `max` due webhook deliveries for `worker`, each for `lease` by the
    /// database's clock.
    pub async fn claim_deliveries(
        &self,
        worker: &str,
        lease: Duration,
        max: u32,
    ) -> Result<Vec<webhooks::DeliveryJob>, LedgerError> {
        Ok(self
            .claim_deliveries_or_next(worker, lease, max)
            .await?
            .jobs)
    }

    /// [`Ledger::claim_deliveries`], and when none was due, how long until one is.
    pub async fn claim_deliveries_or_next(
        &self,
        worker: &str,
        lease: Duration,
        max: u32,
    ) -> Result<Claimed<webhooks::DeliveryJob>, LedgerError> {
        self.store
            .claim_deliveries(worker, lease, i64::from(max))
            .await
    }

    /// Records claimed deliveries' attempts and what comes of them, in one transaction:
    /// for each, whether it was recorded (`false`: claimed again or ended meanwhile).
    ///
    /// A batch the database refuses is recorded again one delivery at a time, so a row
    /// that cannot be written never undoes the others — deliveries of other endpoints and
    /// accounts, which would otherwise be claimed and sent again forever. A delivery the
    /// database refuses even alone is recorded without its answer's text. (A batch that
    /// failed for want of the database, or whose commit went unanswered, is not: one by
    /// one would fail the same way, or meet rows the batch did write.)
    pub async fn record_deliveries(
        &self,
        outcomes: &[(
            &webhooks::DeliveryJob,
            &webhooks::AttemptAnswer,
            &webhooks::DeliveryOutcome,
        )],
    ) -> Result<Vec<bool>, LedgerError> {
        let refused = match self.store.record_deliveries(outcomes).await {
            Err(error @ (LedgerError::Database(_) | LedgerError::Constraint { .. })) => error,
            answer => return answer,
        };
        tracing::warn!(error = %refused, deliveries = outcomes.len(), "the database refused a batch of webhook attempts; recording them one by one");
        let mut recorded = Vec::with_capacity(outcomes.len());
        for &(job, answer, outcome) in outcomes {
            let alone = match self
                .store
                .record_deliveries(&[(job, answer, outcome)])
                .await
            {
                Err(LedgerError::Database(_) | LedgerError::Constraint { .. }) => {
                    let bare = webhooks::AttemptAnswer {
                        error: Some("the answer could not be recorded".to_owned()),
                        body: None,
                        ..answer.clone()
                    };
                    self.store
                        .record_deliveries(&[(job, &bare, outcome)])
                        .await?
                }
                answer => answer?,
            };
            recorded.extend(alone);
        }
        Ok(recorded)
    }

    /// Gives claimed deliveries back unsent, due `after` from now; their claims do not
    /// count as attempts. (A dispatcher that claimed more for one endpoint than it lets
    /// that endpoint have in flight.)
    pub async fn hand_back_deliveries(
        &self,
        jobs: &[&webhooks::DeliveryJob],
        after: Duration,
    ) -> Result<(), LedgerError> {
        if jobs.is_empty() {
            return Ok(());
        }
        self.store.hand_back_deliveries(jobs, after).await
    }

    /// Up to `limit` deliveries of an endpoint before delivery `before`, newest first,
    /// with their attempts.
    pub async fn deliveries(
        &self,
        endpoint: webhooks::EndpointId,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<webhooks::Delivery>, LedgerError> {
        self.store
            .deliveries(endpoint, before, i64::from(limit))
            .await
    }

    /// Sends a delivery of `endpoint` again, now, whatever became of it.
    pub async fn retry_delivery(
        &self,
        endpoint: webhooks::EndpointId,
        delivery: i64,
    ) -> Result<Result<(), webhooks::RetryRefused>, LedgerError> {
        let retried = self.store.retry_delivery(endpoint, delivery, None).await?;
        Ok(retried.unwrap_or(Err(webhooks::RetryRefused::NotFound)))
    }

    /// Sends a delivery again as [`retry_delivery`](Self::retry_delivery) does, once per
    /// idempotency key of the account's: a repeat with the same fingerprint sends nothing
    /// more and gets the first answer (202) again.
    pub async fn retry_delivery_once(
        &self,
        endpoint: webhooks::EndpointId,
        delivery: i64,
        key: &requests::RequestKey<'_>,
    ) -> Result<requests::Keyed<Result<(), webhooks::RetryRefused>>, LedgerError> {
        let answer = |_: Option<&webhooks::Endpoint>| requests::Answer {
            status: 202,
            body: serde_json::Value::Null,
            secret: None,
        };
        let keeping = events::Keeping {
            key: requests::KeptKey::new(key),
            answer: &answer,
        };
        let retried = self
            .store
            .retry_delivery(endpoint, delivery, Some(&keeping))
            .await?;
        keyed(&keeping, retried)
    }

    /// How many deliveries are not done, and since when the oldest one's event.
    pub async fn webhook_backlog(&self) -> Result<webhooks::WebhookBacklog, LedgerError> {
        self.store.webhook_backlog().await
    }

    /// The key stored under `name` in the database; `fresh` is stored first when there
    /// is none, so every instance on one database reads the same.
    pub async fn sealing_key(&self, name: &str, fresh: &[u8]) -> Result<Vec<u8>, LedgerError> {
        self.store.sealing_key(name, fresh).await
    }

    /// The sizes of the batches PostgreSQL's group commit sent so far — of spends and of
    /// holds' steps, counted together; `None` on SQLite.
    pub fn batches(&self) -> Option<&Batches> {
        self.store.batches()
    }

    /// Checks every invariant over the whole database; empty means clean.
    pub async fn audit(&self) -> Result<Vec<Violation>, LedgerError> {
        self.store.audit().await
    }

    /// Deletes unused tickets that expired more than `retention` ago, and drops the stored
    /// responses of used tickets that expired more than `retention` ago — so an outcome is
    /// kept for at least `retention` after its ticket was used. Used tickets themselves
    /// stay, so they never run again. Deletes the records of creates made more than
    /// `retention` ago, freeing their idempotency keys. Works in batches of `batch` until
    /// none are left.
    pub async fn reap(&self, retention: Duration, batch: u32) -> Result<Reaped, LedgerError> {
        let batch = i64::from(batch.max(1));
        let mut total = Reaped::default();
        loop {
            let (deleted, pruned, expired) = self.store.reap(retention, batch).await?;
            total.deleted_unused += deleted;
            total.pruned_outcomes += pruned;
            total.expired_creations += expired;
            if [deleted, pruned, expired]
                .iter()
                .all(|count| *count < batch.unsigned_abs())
            {
                return Ok(total);
            }
        }
    }

    /// Deletes the outbox jobs that finished more than `retention` ago: webhook deliveries
    /// that ended (delivered, exhausted, or ended with their endpoint), with their
    /// attempts — from then on they are neither listed nor sent again by hand. (A payout's
    /// job leaves as the payout settles; the payout stays whole.) Works in batches of
    /// `batch` until none are left; returns how many it deleted.
    pub async fn reap_finished_jobs(
        &self,
        retention: Duration,
        batch: u32,
    ) -> Result<u64, LedgerError> {
        let batch = i64::from(batch.max(1));
        let mut total = 0;
        loop {
            let deleted = self.store.reap_finished_jobs(retention, batch).await?;
            total += deleted;
            if deleted < batch.unsigned_abs() {
                return Ok(total);
            }
        }
    }

    /// Checks that the database answers.
    pub async fn ping(&self) -> Result<(), LedgerError> {
        self.store.ping().await
    }

    /// Closes the connections (after in-flight work finishes).
    pub async fn close(&self) {
        self.store.close().await;
    }
}

/// What a request sent with a key came to: what it did, or the answer an earlier request
/// with the key kept ([`requests::KeptKey::replay`]).
fn keyed<T>(
    keeping: &events::Keeping<'_>,
    done: Result<T, requests::RequestRow>,
) -> Result<requests::Keyed<T>, LedgerError> {
    match done {
        Ok(done) => Ok(requests::Keyed::Ran(done)),
        Err(found) => keeping.key.replay(found).map(requests::Keyed::Replayed),
    }
}
