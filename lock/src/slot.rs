//! The connection a held lock lives on, for the stores whose lock is a session's
//! (PostgreSQL advisory locks, MySQL row locks).

use sqlx::Database;
use sqlx::pool::PoolConnection;

/// A held lock's connection, until the lock is given back. Dropped while still there —
/// a grant abandoned during its lock-delay, a lease forgotten — it is closed, never
/// returned to the pool still holding the lock, where the next user of the connection
/// would find itself holding it too.
pub(crate) struct Slot<DB: Database>(pub(crate) Option<PoolConnection<DB>>);

impl<DB: Database> std::ops::Deref for Slot<DB> {
    type Target = Option<PoolConnection<DB>>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<DB: Database> std::ops::DerefMut for Slot<DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<DB: Database> Drop for Slot<DB> {
    fn drop(&mut self) {
        if let Some(connection) = self.0.take() {
            drop(connection.detach());
        }
    }
}
