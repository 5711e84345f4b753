//! The check, in debug builds, that tokens come in order: a waiter handed the lock after
//! a holder of this process released it carries a larger fencing token than that holder.
//!
//! That is what the stores guarantee whatever happens to them. A release the store
//! confirmed (it still held the lock) proves the store kept the grant from then to the
//! release, so the key's counter (or ZooKeeper's zxid, etcd's revision) had passed the
//! holder's token; the next grant draws above it. Tokens in general are not checked
//! against every earlier one: a store that lost its data may hand out lower ones until
//! `raise_fencing` lifts its counter — a replica promoted without the last grants, a
//! server whose clock stepped back across a loss (see the crate docs) — and the process
//! cannot tell that from a bug; only the protected store's fencing check can. A grant
//! whose lease had already run out when it reached us is not checked either: it may have
//! been overtaken, in the store, by the grant it is compared with.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Lease;
use crate::token::FencingToken;

/// The last grant this process was given per key, and whether it was released.
#[derive(Debug, Default)]
pub(crate) struct TokenOrder {
    /// Never held across an await.
    keys: Mutex<HashMap<String, LastGrant>>,
}

#[derive(Debug)]
struct LastGrant {
    token: FencingToken,
    /// When its release came back confirmed; `None` while held (or released unconfirmed).
    released_at: Option<Instant>,
    /// When it was granted or released, for forgetting idle keys.
    used_at: Instant,
}

/// Keys kept at most: past it the map starts again, so a process that never prunes does
/// not grow it without bound (the next grant of each key is then not checked).
const KEPT: usize = 65_536;

impl TokenOrder {
    fn keys(&self) -> MutexGuard<'_, HashMap<String, LastGrant>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `lease` was granted to a call that began at `asked_at`.
    pub(crate) fn granted(&self, lease: &Lease, asked_at: Instant) {
        let now = Instant::now();
        let token = lease.fencing_token();
        let mut keys = self.keys();
        if let Some(last) = keys.get(lease.key()) {
            // The call was waiting when the holder before it released the lock.
            let handed_over = last
                .released_at
                .is_some_and(|released_at| asked_at < released_at);
            let expired = lease.acquired_at() + lease.ttl() <= now;
            debug_assert!(
                !handed_over || expired || token > last.token,
                "key {:?} was handed over with fencing token {token}, not above the releasing holder's {}",
                lease.key(),
                last.token
            );
        }
        if keys.len() >= KEPT {
            keys.clear();
        }
        keys.insert(
            lease.key().to_owned(),
            LastGrant {
                token,
                released_at: None,
                used_at: now,
            },
        );
    }

    /// `lease` was released, and the store said it still held it.
    pub(crate) fn released(&self, lease: &Lease) {
        let now = Instant::now();
        if let Some(last) = self.keys().get_mut(lease.key())
            && last.token == lease.fencing_token()
        {
            last.released_at = Some(now);
            last.used_at = now;
        }
    }

    /// Forgets the keys unused for `idle_for`, as the stores do.
    pub(crate) fn forget_idle(&self, idle_for: Duration) {
        let now = Instant::now();
        self.keys()
            .retain(|_, last| now.saturating_duration_since(last.used_at) < idle_for);
    }
}
