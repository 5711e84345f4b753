//! [`LockGuard`]: a held lease plus the watchdog that keeps it alive.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::backend::{Lease, LockBackend};
use crate::error::LockError;
use crate::token::{FencingToken, OwnerToken};

/// A held lock. While it lives, a watchdog task renews the lease every TTL/3; the moment a
/// renewal finds the lock gone or taken (or cannot confirm it before the lease would run
/// out), [`lost`](Self::lost) fires and renewal stops.
///
/// Release it explicitly with [`release`](Self::release). Dropping it stops the watchdog at
/// once and releases in the background, so a cancelled request frees its lock without
/// waiting for the TTL.
///
/// **Reentrancy.** A holder takes the lock again — without waiting, whoever is queued —
/// with [`reenter`](Self::reenter): the new guard shares this grant (the same fencing token)
/// and adds one to its hold count, and the lock is released only when every guard of the
/// grant was released or dropped. The holder is the guard itself, not a task or a thread
/// (async code has no thread to be), so only code that was handed a guard can re-enter:
/// another task of the same process asks for the key like anyone else and waits.
pub struct LockGuard {
    grant: Arc<Grant>,
    /// Set once this guard's hold was given back, after which drop has nothing to do.
    finished: bool,
}

/// One grant of the lock, shared by every guard that re-entered it.
struct Grant {
    lease: Lease,
    backend: Arc<dyn LockBackend>,
    /// Cancelled by the watchdog when the lease is no longer provably ours; the critical
    /// section selects on it to stop before doing anything it could not undo.
    lost: CancellationToken,
    /// The renewal task. Aborted when the last hold ends, on abandon and on drop: a renewal
    /// that outlived its guards would keep a dead holder's lock alive forever.
    watchdog: Mutex<Option<JoinHandle<()>>>,
    /// Guards holding the grant; the lock is released when this returns to zero.
    holds: AtomicUsize,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lease", &self.grant.lease)
            .field("lost", &self.grant.lost.is_cancelled())
            .field("holds", &self.grant.holds.load(Ordering::Acquire))
            .field("finished", &self.finished)
            .finish()
    }
}

impl Grant {
    fn take_watchdog(&self) -> Option<JoinHandle<()>> {
        // The handle is only taken, never held across an await.
        self.watchdog
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }

    async fn stop_watchdog(&self) {
        if let Some(watchdog) = self.take_watchdog() {
            watchdog.abort();
            // Wait until the task is gone, so no renewal is still in flight behind the
            // release that follows.
            let _ = watchdog.await;
        }
    }
}

impl LockGuard {
    pub(crate) fn start(lease: Lease, backend: Arc<dyn LockBackend>) -> Self {
        let lost = CancellationToken::new();
        let watchdog = tokio::spawn(renew(Arc::clone(&backend), lease.clone(), lost.clone()));
        Self {
            grant: Arc::new(Grant {
                lease,
                backend,
                lost,
                watchdog: Mutex::new(Some(watchdog)),
                holds: AtomicUsize::new(1),
            }),
            finished: false,
        }
    }

    /// The locked key.
    pub fn key(&self) -> &str {
        self.grant.lease.key()
    }

    /// This grant's owner token.
    pub fn owner(&self) -> OwnerToken {
        self.grant.lease.owner()
    }

    /// This grant's fencing token: pass it to whatever the lock protects.
    pub fn fencing_token(&self) -> FencingToken {
        self.grant.lease.fencing_token()
    }

    /// The underlying lease.
    pub fn lease(&self) -> &Lease {
        &self.grant.lease
    }

    /// How many guards hold this grant now (1 unless re-entered).
    pub fn holds(&self) -> usize {
        self.grant.holds.load(Ordering::Acquire)
    }

    /// Takes the lock again for the holder, at once: a guard on the same grant, with the
    /// same fencing token, one more hold. `None` if this guard was already released.
    pub fn reenter(&self) -> Option<LockGuard> {
        if self.finished {
            return None;
        }
        self.grant.holds.fetch_add(1, Ordering::AcqRel);
        Some(Self {
            grant: Arc::clone(&self.grant),
            finished: false,
        })
    }

    /// Completes when the lock is known (or feared) lost. Select on it in the critical
    /// section.
    pub fn lost(&self) -> WaitForCancellationFuture<'_> {
        self.grant.lost.cancelled()
    }

    /// Whether the watchdog has declared the lock lost.
    pub fn is_lost(&self) -> bool {
        self.grant.lost.is_cancelled()
    }

    /// Gives this guard's hold back. The last hold of the grant stops renewal and deletes
    /// the lock if it is still held, handing it to the next waiter; it returns whether it
    /// was. An earlier hold returns whether the grant is still ours. Calling it again
    /// returns `false`.
    pub async fn release(&mut self) -> Result<bool, LockError> {
        if std::mem::replace(&mut self.finished, true) {
            return Ok(false);
        }
        if self.grant.holds.fetch_sub(1, Ordering::AcqRel) > 1 {
            return Ok(!self.is_lost());
        }
        self.grant.stop_watchdog().await;
        self.grant.backend.release(&self.grant.lease).await
    }

    /// Stops renewing without releasing, as a crashed holder would: the lock stays taken
    /// until its TTL runs out. For fault injection and tests.
    pub async fn abandon(mut self) {
        self.grant.stop_watchdog().await;
        self.finished = true;
    }

    /// Stops renewing but keeps the guard, as a process pause (GC, swap, SIGSTOP) stops
    /// every thread including the watchdog: the lease runs out at its TTL and
    /// [`lost`](Self::lost) does not fire. For fault injection.
    pub async fn stop_renewal(&mut self) {
        self.grant.stop_watchdog().await;
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        if self.grant.holds.fetch_sub(1, Ordering::AcqRel) > 1 {
            return;
        }
        if let Some(watchdog) = self.grant.take_watchdog() {
            watchdog.abort();
        }
        // Without a runtime (process shutting down) the lease simply expires.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let backend = Arc::clone(&self.grant.backend);
            let lease = self.grant.lease.clone();
            runtime.spawn(async move {
                if let Err(error) = backend.release(&lease).await {
                    tracing::debug!(key = lease.key(), %error, "release on drop failed; the lease will expire");
                }
            });
        }
    }
}

/// The watchdog: renews at TTL/3 until the lease is lost; a failed renewal is retried
/// sooner, but only while the lease can still be proven ours.
async fn renew(backend: Arc<dyn LockBackend>, lease: Lease, lost: CancellationToken) {
    let ttl = lease.ttl();
    let period = (ttl / 3).max(Duration::from_millis(1));
    let retry = (period / 4).max(Duration::from_millis(1));
    // A little short of the lease: clocks drift, and `lost` should fire before a successor
    // can be granted the lock, not at the same instant.
    let margin = ttl / 100 + Duration::from_millis(1);
    let mut held_until = lease.acquired_at() + ttl - margin;
    let mut next = lease.acquired_at() + period;
    loop {
        sleep_until(next).await;
        let sent_at = Instant::now();
        match timeout_at(held_until, backend.extend(&lease, ttl)).await {
            Ok(Ok(true)) => {
                held_until = sent_at + ttl - margin;
                next = sent_at + period;
            }
            Ok(Ok(false)) => {
                tracing::warn!(
                    key = lease.key(),
                    "lock lost: renewal found it gone or taken"
                );
                lost.cancel();
                return;
            }
            Ok(Err(error)) => {
                tracing::debug!(key = lease.key(), %error, "renewal failed; retrying");
                next = (Instant::now() + retry).min(held_until);
            }
            Err(_elapsed) => {}
        }
        if Instant::now() >= held_until {
            tracing::warn!(
                key = lease.key(),
                "lock lost: lease ran out before a renewal succeeded"
            );
            lost.cancel();
            return;
        }
    }
}
