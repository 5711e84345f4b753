//! [`LockGuard`]: a held lease plus the watchdog that keeps it alive.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::error::LockError;
use crate::service::{Lease, LockBackend};
use crate::token::{FencingToken, OwnerToken};

/// A held lock. While it lives, a watchdog task renews the lease every TTL/3; the moment a
/// renewal finds the lock gone or taken (or cannot confirm it before the lease would run
/// out), [`lost`](Self::lost) fires and renewal stops.
///
/// Release it explicitly with [`release`](Self::release). Dropping it stops the watchdog at
/// once and releases in the background, so a cancelled request frees its lock without
/// waiting for the TTL.
pub struct LockGuard {
    lease: Lease,
    backend: Arc<dyn LockBackend>,
    /// Cancelled by the watchdog when the lease is no longer provably ours; the critical
    /// section selects on it to stop before doing anything it could not undo.
    lost: CancellationToken,
    /// The renewal task. Aborted on release, abandon and drop: a renewal that outlived
    /// its guard would keep a dead holder's lock alive forever.
    watchdog: Option<JoinHandle<()>>,
    /// Set once released or abandoned, after which drop has nothing to do.
    finished: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lease", &self.lease)
            .field("lost", &self.lost.is_cancelled())
            .field("finished", &self.finished)
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn start(lease: Lease, backend: Arc<dyn LockBackend>) -> Self {
        let lost = CancellationToken::new();
        let watchdog = tokio::spawn(renew(Arc::clone(&backend), lease.clone(), lost.clone()));
        Self {
            lease,
            backend,
            lost,
            watchdog: Some(watchdog),
            finished: false,
        }
    }

    /// The locked key.
    pub fn key(&self) -> &str {
        self.lease.key()
    }

    /// This grant's owner token.
    pub fn owner(&self) -> OwnerToken {
        self.lease.owner()
    }

    /// This grant's fencing token: pass it to whatever the lock protects.
    pub fn fencing_token(&self) -> FencingToken {
        self.lease.fencing_token()
    }

    /// The underlying lease.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Completes when the lock is known (or feared) lost. Select on it in the critical
    /// section.
    pub fn lost(&self) -> WaitForCancellationFuture<'_> {
        self.lost.cancelled()
    }

    /// Whether the watchdog has declared the lock lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Stops renewal and deletes the lock if this guard still holds it, handing it to the
    /// next waiter. Returns whether it was still held; calling it again returns `false`.
    pub async fn release(&mut self) -> Result<bool, LockError> {
        self.stop_watchdog().await;
        self.finished = true;
        self.backend.release(&self.lease).await
    }

    /// Stops renewing without releasing, as a crashed holder would: the lock stays taken
    /// until its TTL runs out. For fault injection and tests.
    pub async fn abandon(mut self) {
        self.stop_watchdog().await;
        self.finished = true;
    }

    /// Stops renewing but keeps the guard, as a process pause (GC, swap, SIGSTOP) stops
    /// every thread including the watchdog: the lease runs out at its TTL and
    /// [`lost`](Self::lost) does not fire. For fault injection.
    pub async fn stop_renewal(&mut self) {
        self.stop_watchdog().await;
    }

    async fn stop_watchdog(&mut self) {
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.abort();
            // Wait until the task is gone, so no renewal is still in flight behind the
            // release that follows.
            let _ = watchdog.await;
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.abort();
        }
        if self.finished {
            return;
        }
        // Without a runtime (process shutting down) the lease simply expires.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let backend = Arc::clone(&self.backend);
            let lease = self.lease.clone();
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
