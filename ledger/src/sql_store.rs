//! [`SqlStore`]: the ledger's tables in one database, generic over the sqlx database — its
//! pools, and how a statement or a whole write runs again when its connection dies.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use sqlx::{Database, Pool};

use crate::batch::Batcher;
use crate::bells::{Bells, JobKind};
use crate::dialect::Dialect;
use crate::error::{LedgerError, is_dead_connection};
use crate::hold_batch::HoldStep;

/// The ledger's tables in one database.
pub(crate) struct SqlStore<D: Database> {
    /// Reads, and on PostgreSQL writes too.
    pub(crate) pool: Pool<D>,
    /// Write transactions. On SQLite a pool of one connection: writes queue here, in the
    /// process, in arrival order, instead of contending for SQLite's file lock and
    /// polling on SQLITE_BUSY — under a burst that polling starves some writers until
    /// they fail. On PostgreSQL the same pool as reads: row locks serialise its writers.
    pub(crate) writer: Pool<D>,
    /// How often an operation is tried on a fresh connection when the pooled one turns
    /// out to be dead. A database restart kills every pooled connection at once, so this
    /// is one more than the pool holds: the last try always opens a new connection.
    connection_tries: u32,
    /// PostgreSQL's group commit (`batch.rs`): spends go through it first.
    pub(crate) batcher: Option<Batcher>,
    /// Its group commit of holds placed, captured and voided (`hold_batch.rs`).
    pub(crate) hold_batcher: Option<Batcher<HoldStep>>,
    /// Rung after a commit that queued outbox jobs (`bells.rs`).
    pub(crate) bells: Arc<Bells>,
    /// For each kind of outbox job (by [`JobKind::index`]), whether this process's last
    /// claim of it took all it asked for: more is likely due, and the next claim goes
    /// without a look first (`claims.rs`).
    pub(crate) claims_came_full: [AtomicBool; JobKind::ALL.len()],
}

impl<D: Database> SqlStore<D> {
    /// A store on `pool`, writing through `writer` (see the field), ringing `bells`.
    pub(crate) fn new(pool: Pool<D>, writer: Pool<D>, bells: Arc<Bells>) -> Self {
        let connection_tries = pool
            .options()
            .get_max_connections()
            .max(writer.options().get_max_connections())
            + 1;
        Self {
            pool,
            writer,
            connection_tries,
            batcher: None,
            hold_batcher: None,
            bells,
            claims_came_full: Default::default(),
        }
    }

    /// Spends go through `batcher` first, and holds' steps through `hold_batcher`.
    pub(crate) fn with_batchers(self, batcher: Batcher, hold_batcher: Batcher<HoldStep>) -> Self {
        Self {
            batcher: Some(batcher),
            hold_batcher: Some(hold_batcher),
            ..self
        }
    }

    /// Runs `operation`, again on another connection each time it fails because its
    /// connection was dead — never because the database refused it, and never when the
    /// pool could not produce a connection at all (the database is down: the caller
    /// answers 503). Only for operations that are safe to repeat: reads, idempotent
    /// writes, and BEGIN. (A dead connection is dropped by the pool when it is returned:
    /// the pool pings every connection it takes back.)
    pub(crate) async fn on_live_connection<T, F, Fut>(
        &self,
        mut operation: F,
    ) -> Result<T, sqlx::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let mut tries = self.connection_tries;
        loop {
            match operation().await {
                Err(error) if tries > 1 && is_dead_connection(&error) => {
                    tries -= 1;
                    tracing::debug!(%error, "a pooled connection was dead; trying another");
                }
                other => return other,
            }
        }
    }

    /// Opens a write transaction on a live connection.
    pub(crate) async fn begin_write(&self) -> Result<sqlx::Transaction<'static, D>, sqlx::Error>
    where
        D: Dialect,
    {
        self.on_live_connection(|| self.writer.begin_with(D::BEGIN_WRITE))
            .await
    }

    /// Runs `write` — a whole write that recognises what an earlier attempt of its own
    /// committed — again on another connection each time its connection dies under it,
    /// its COMMIT's answer included (as [`on_live_connection`](Self::on_live_connection)
    /// does for single statements). A commit whose every try lost its answer stays
    /// [`LedgerError::OutcomeUnknown`].
    pub(crate) async fn again_if_cut<T, F, Fut>(&self, mut write: F) -> Result<T, LedgerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, LedgerError>>,
    {
        let mut tries = self.connection_tries;
        loop {
            match write().await {
                Err(error) if tries > 1 && error.connection_died() => {
                    tries -= 1;
                    tracing::debug!(%error, "a write's connection died; writing again on another");
                }
                other => return other,
            }
        }
    }
}

impl<D: Database> fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("database", &D::NAME)
            .field("connections", &self.pool.size())
            .finish()
    }
}
