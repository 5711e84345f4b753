//! Per-key turns in this process, for stores without a queue of waiters a process can
//! join cheaply (PostgreSQL and MySQL hold a connection per waiter; memcached and the
//! MySQL lock table can only be polled): one waiter per key at a time goes to the store,
//! the others wait their turn here, first come first served. So a key costs the store at
//! most one waiter per process, and within a process waiters are served in arrival order
//! and a `try_acquire` never passes one of them. Across processes, order is the store's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, OwnedMutexGuard};
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::backend::Ask;
use crate::error::LockError;

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

    /// Polls the store with `attempt` until it grants, or once when `ask` has no
    /// deadline (`Ok(None)` if the lock is held then). Between polls it backs off from
    /// 1 ms to [`MAX_POLL`], jittered so pollers of several processes spread out, never
    /// past the holder's lease (when the store says how long it has left) nor the
    /// deadline — and polls again at once on a local release.
    pub(crate) async fn poll<T, Fut>(
        &self,
        ask: &Ask<'_>,
        mut attempt: impl FnMut() -> Fut,
    ) -> Result<Option<T>, LockError>
    where
        Fut: Future<Output = Result<Poll<T>, LockError>>,
    {
        let mut pause = Duration::from_millis(1);
        loop {
            let left = match attempt().await? {
                Poll::Granted(granted) => return Ok(Some(granted)),
                Poll::Held { left } => left,
            };
            let Some(deadline) = ask.deadline else {
                return Ok(None);
            };
            let jittered = pause.mul_f64(rand::random_range(0.5..1.5));
            let wait = left.map_or(jittered, |left| jittered.min(left));
            tokio::select! {
                () = sleep_until((Instant::now() + wait).min(deadline)) => {}
                () = self.next_release() => {}
            }
            if Instant::now() >= deadline {
                return Err(ask.timed_out());
            }
            pause = (pause * 2).min(MAX_POLL);
        }
    }
}

/// What one poll of a store answered.
pub(crate) enum Poll<T> {
    /// The lock is ours.
    Granted(T),
    /// Another holds it, with `left` of its lease when the store says.
    Held { left: Option<Duration> },
}

/// The longest pause between two polls of one waiter.
const MAX_POLL: Duration = Duration::from_millis(100);

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
