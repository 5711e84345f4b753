//! Per-key turns in this process, for stores without a queue of waiters a process can
//! join cheaply (PostgreSQL and MySQL hold a connection per waiter; memcached and the
//! MySQL lock table can only be polled): one waiter per key at a time goes to the store,
//! the others wait their turn here, first come first served. So a key costs the store at
//! most one waiter per process, and within a process waiters are served in arrival order
//! and a `try_acquire` never passes one of them. Across processes, order is the store's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Notify, OwnedMutexGuard};
use tokio::time::{Instant, timeout_at};

/// One key's turn, and the signal a local release gives the waiter whose turn it is.
#[derive(Debug, Default)]
pub(crate) struct Turn {
    line: Arc<tokio::sync::Mutex<()>>,
    released: Notify,
}

impl Turn {
    /// Wakes the waiter whose turn it is (if it polls, it tries again at once).
    pub(crate) fn released(&self) {
        self.released.notify_one();
    }

    /// Completes on the next local release (or at once, if one came since the last wait).
    pub(crate) async fn next_release(&self) {
        self.released.notified().await;
    }
}

/// The turns of the keys in use.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    keys: Mutex<HashMap<String, Arc<Turn>>>,
}

/// Turns kept at most before the unused ones are forgotten.
const KEPT: usize = 1024;

impl Turns {
    /// The turn of `key`.
    pub(crate) fn of(&self, key: &str) -> Arc<Turn> {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if keys.len() > KEPT {
            // Forget the turns nobody waits on or holds, so the map stays as small as the
            // keys in use.
            keys.retain(|_, turn| Arc::strong_count(turn) > 1 || Arc::strong_count(&turn.line) > 1);
        }
        keys.entry(key.to_owned()).or_default().clone()
    }

    /// Waits for `key`'s turn until `deadline` (`Err` if it passes first), or, when
    /// `deadline` is `None`, takes it only if nobody of ours is waiting (`Ok(None)` then).
    pub(crate) async fn wait(
        &self,
        key: &str,
        deadline: Option<Instant>,
    ) -> Result<Option<(Arc<Turn>, OwnedMutexGuard<()>)>, ()> {
        let turn = self.of(key);
        let line = turn.line.clone();
        let held = match deadline {
            Some(deadline) => timeout_at(deadline, line.lock_owned())
                .await
                .map_err(|_| ())?,
            None => match line.try_lock_owned() {
                Ok(held) => held,
                Err(_) => return Ok(None),
            },
        };
        Ok(Some((turn, held)))
    }
}
