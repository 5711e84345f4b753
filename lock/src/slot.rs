//! A connection whose lock state may be unknown, for the stores whose lock is a
//! session's (PostgreSQL advisory locks, MySQL row locks): the connection a held lock
//! lives on, or one taken for an acquire or a release that may end early.

use sqlx::Database;
use sqlx::pool::PoolConnection;

/// A connection until its lock state is known. Dropped while still there — an acquire
/// or release cut short, a grant abandoned during its lock-delay, a lease forgotten — it
/// is closed (the server then frees whatever its session held), never returned to the
/// pool possibly holding the lock, where the next user of the connection would find
/// itself holding it too.
pub(crate) struct Slot<DB: Database>(pub(crate) Option<PoolConnection<DB>>);

impl<DB: Database> Slot<DB> {
    /// The connection, while it is there.
    pub(crate) fn connection(&mut self) -> &mut PoolConnection<DB> {
        self.0
            .as_mut()
            .expect("a slot's connection is there until handed on")
    }

    /// The lock state is known: the connection may go back to the pool (or be held).
    pub(crate) fn hand_on(mut self) -> PoolConnection<DB> {
        self.0
            .take()
            .expect("a slot's connection is handed on once")
    }
}

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
