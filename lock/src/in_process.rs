//! Locks that live in one process: the embedded mode's backend. Same contract as Redis —
//! leases expire, waiters are served first come first served by direct hand-off, fencing
//! tokens only grow — with a mutex-guarded map instead of a server.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until};

use crate::backend::{Ask, Lease, LockBackend};
use crate::error::LockError;
use crate::token::{FencingToken, OwnerToken};

/// An in-process lock table.
#[derive(Debug, Default)]
pub struct InProcessBackend {
    /// One entry per key in use lately: the fencing counter outlives the lock itself,
    /// until [`LockBackend::prune_idle`] forgets a key nobody holds or waits for. Never
    /// held across an await.
    keys: Mutex<HashMap<String, KeyState>>,
    /// Chubby's lock-delay: a lock is kept this long past its lease (never past a
    /// release), so a holder that vanished keeps its key for the delay too.
    lock_delay: Duration,
}

#[derive(Debug)]
struct KeyState {
    holder: Option<Holder>,
    /// The last token handed out; `None` until the first grant or raise, when it starts
    /// from the clock (see [`clock_us`]).
    fence: Option<u64>,
    queue: VecDeque<Waiter>,
    /// When the key was last granted, renewed, released, raised or waited for: how long
    /// it has gone unused, once nobody holds or waits for it.
    used_at: Instant,
}

/// The wall clock in microseconds: where a key's fencing counter starts. The table lives
/// only as long as the process, so after a restart the counters start again — from the
/// clock, above every token handed out before (a key is granted at most once per
/// microsecond), unless the clock stepped back across the restart.
fn clock_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

#[derive(Debug)]
struct Holder {
    owner: OwnerToken,
    expires_at: Instant,
    note: String,
}

#[derive(Debug)]
struct Waiter {
    owner: OwnerToken,
    ttl: Duration,
    note: String,
    /// Completed with the fencing token and the grant's instant when the lock is handed to
    /// this waiter.
    grant: oneshot::Sender<(u64, Instant)>,
}

impl KeyState {
    fn new(now: Instant) -> Self {
        Self {
            holder: None,
            fence: None,
            queue: VecDeque::new(),
            used_at: now,
        }
    }

    /// Whether nobody has held or waited for the key in at least `idle_for`.
    fn idle_for(&self, idle_for: Duration, now: Instant) -> bool {
        if self.queue.iter().any(|waiter| !waiter.grant.is_closed()) {
            return false;
        }
        // A lease that ran out unreleased counts as use until it ran out.
        let last_use = match &self.holder {
            Some(holder) if holder.expires_at > now => return false,
            Some(holder) => self.used_at.max(holder.expires_at),
            None => self.used_at,
        };
        now.saturating_duration_since(last_use) >= idle_for
    }

    fn held_by_other(&self, owner: OwnerToken, now: Instant) -> Option<Instant> {
        self.holder
            .as_ref()
            .filter(|holder| holder.owner != owner && holder.expires_at > now)
            .map(|holder| holder.expires_at)
    }

    fn grant(&mut self, owner: OwnerToken, ttl: Duration, note: String, now: Instant) -> u64 {
        let fence = self.fence.map_or_else(clock_us, |fence| fence + 1);
        debug_assert!(
            self.fence.is_none_or(|last| fence > last),
            "a grant's fencing token {fence} is not above the key's last, {:?}",
            self.fence
        );
        self.fence = Some(fence);
        self.used_at = now;
        self.holder = Some(Holder {
            owner,
            expires_at: now + ttl,
            note,
        });
        fence
    }

    /// Gives a free lock to the first waiter still listening. Returns whether anyone got it.
    fn hand_off(&mut self, now: Instant) -> bool {
        self.holder = None;
        self.used_at = now;
        while let Some(waiter) = self.queue.pop_front() {
            if waiter.grant.is_closed() {
                continue;
            }
            let fence = self.grant(waiter.owner, waiter.ttl, waiter.note, now);
            if waiter.grant.send((fence, now)).is_ok() {
                return true;
            }
            self.holder = None;
        }
        false
    }

    /// Frees an expired lease and passes the lock on, as Redis does by expiring the key and
    /// the next waiter's retry.
    fn expire(&mut self, now: Instant) {
        if self
            .holder
            .as_ref()
            .is_some_and(|holder| holder.expires_at <= now)
        {
            self.hand_off(now);
        }
    }
}

impl InProcessBackend {
    /// An empty lock table.
    pub fn new() -> Self {
        Self::default()
    }

    /// With Chubby's lock-delay (see the field).
    pub fn with_lock_delay(self, lock_delay: Duration) -> Self {
        Self { lock_delay, ..self }
    }

    fn table(&self) -> MutexGuard<'_, HashMap<String, KeyState>> {
        // A panic while holding this mutex cannot leave a key half-updated (every update is
        // a few field assignments), so a poisoned table is still consistent.
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many keys the table keeps state for: those held or waited for, and those used
    /// since the last [`LockBackend::prune_idle`] that could forget them.
    pub fn key_count(&self) -> usize {
        self.table().len()
    }
}

#[async_trait]
impl LockBackend for InProcessBackend {
    async fn acquire(&self, ask: Ask<'_>) -> Result<Option<Lease>, LockError> {
        match ask.deadline {
            None => Ok(self.take_if_free(ask.key, ask.ttl, ask.note)),
            Some(deadline) => self.wait_in_line(ask, deadline).await.map(Some),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let now = Instant::now();
        let mut table = self.table();
        let Some(state) = table.get_mut(lease.key()) else {
            return Ok(false);
        };
        let ours = state
            .holder
            .as_ref()
            .is_some_and(|holder| holder.owner == lease.owner());
        if !ours {
            state.expire(now);
            return Ok(false);
        }
        let was_live = state
            .holder
            .as_ref()
            .is_some_and(|holder| holder.expires_at > now);
        state.hand_off(now);
        Ok(was_live)
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<bool, LockError> {
        let now = Instant::now();
        let mut table = self.table();
        let holder = table
            .get_mut(lease.key())
            .and_then(|state| state.holder.as_mut())
            .filter(|holder| holder.owner == lease.owner() && holder.expires_at > now);
        Ok(match holder {
            Some(holder) => {
                holder.expires_at = now + ttl + self.lock_delay;
                true
            }
            None => false,
        })
    }

    async fn raise_fencing(
        &self,
        key: &str,
        floor: FencingToken,
    ) -> Result<FencingToken, LockError> {
        let now = Instant::now();
        let mut table = self.table();
        let state = table
            .entry(key.to_owned())
            .or_insert_with(|| KeyState::new(now));
        let fence = state.fence.unwrap_or_else(clock_us).max(floor.get());
        state.fence = Some(fence);
        state.used_at = now;
        Ok(FencingToken::new(fence))
    }

    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        let now = Instant::now();
        let table = self.table();
        Ok(table
            .get(key)
            .and_then(|state| state.holder.as_ref())
            .filter(|holder| holder.expires_at > now)
            .map(|holder| holder.note.clone()))
    }

    async fn ping(&self) -> Result<(), LockError> {
        Ok(())
    }

    /// Forgets the keys nobody held or waited for in `idle_for`, fencing counters and
    /// all: a key locked again starts its counter from the clock (see the crate docs),
    /// and a lease from before — paused past its TTL and the idle time — finds no entry,
    /// so it can neither release nor extend the new holder's lock.
    async fn prune_idle(&self, idle_for: Duration) -> Result<u64, LockError> {
        let now = Instant::now();
        let mut table = self.table();
        let before = table.len();
        table.retain(|_, state| !state.idle_for(idle_for, now));
        Ok(u64::try_from(before - table.len()).unwrap_or(u64::MAX))
    }
}

impl InProcessBackend {
    /// Takes the lock if it is free and nobody waits for it.
    fn take_if_free(&self, key: &str, ttl: Duration, note: &str) -> Option<Lease> {
        let owner = OwnerToken::random();
        let now = Instant::now();
        let mut table = self.table();
        let state = table
            .entry(key.to_owned())
            .or_insert_with(|| KeyState::new(now));
        state.expire(now);
        if state.held_by_other(owner, now).is_some() || state.hand_off_pending(now) {
            return None;
        }
        let fence = state.grant(owner, ttl + self.lock_delay, note.to_owned(), now);
        Some(Lease::new(key, owner, FencingToken::new(fence), ttl, now))
    }

    /// Takes the lock, waiting in line until `deadline`: each look takes the lock if it is
    /// free or joins the queue; between looks we sleep until the hand-off, or until the
    /// holder's lease runs out.
    async fn wait_in_line(&self, ask: Ask<'_>, deadline: Instant) -> Result<Lease, LockError> {
        let owner = OwnerToken::random();
        let mut pending = Pending {
            backend: self,
            key: ask.key,
            owner,
            settled: false,
        };
        let (grant, mut granted) = oneshot::channel();
        let mut place = Place {
            owner,
            grant: Some(grant),
        };
        let lease = |(fence, granted_at)| {
            Lease::new(
                ask.key,
                owner,
                FencingToken::new(fence),
                ask.ttl,
                granted_at,
            )
        };
        loop {
            let now = Instant::now();
            let wake_at = match self.take_or_join(&ask, &mut place, &mut granted, now) {
                Ok(grant) => {
                    pending.settled = true;
                    return Ok(lease(grant));
                }
                Err(wake_at) => wake_at,
            };
            if now >= deadline {
                pending.settled = true;
                return Err(self.give_up(ask.key, owner, ask.started));
            }
            tokio::select! {
                biased;
                grant = &mut granted => {
                    pending.settled = true;
                    return match grant {
                        Ok(grant) => Ok(lease(grant)),
                        // Dropped without a grant: only giving up removes our entry, so this is
                        // unreachable in practice; treat it as a timeout rather than guess.
                        Err(_) => Err(self.give_up(ask.key, owner, ask.started)),
                    };
                }
                () = sleep_until(wake_at.min(deadline)) => {}
            }
        }
    }

    /// One look, under one lock of the table — so a release cannot slip in between "saw it
    /// held" and "joined the queue" and find nobody to wake: the grant (its token and
    /// instant) if the lock came to us or is free, else when to look again.
    fn take_or_join(
        &self,
        ask: &Ask<'_>,
        place: &mut Place,
        granted: &mut oneshot::Receiver<(u64, Instant)>,
        now: Instant,
    ) -> Result<(u64, Instant), Instant> {
        let mut table = self.table();
        let state = table
            .entry(ask.key.to_owned())
            .or_insert_with(|| KeyState::new(now));
        state.expire(now);
        if let Ok(grant) = granted.try_recv() {
            return Ok(grant);
        }
        if state.held_by_other(place.owner, now).is_none()
            && place.grant.is_some()
            && !state.hand_off_pending(now)
        {
            let fence = state.grant(
                place.owner,
                ask.ttl + self.lock_delay,
                ask.note.to_owned(),
                now,
            );
            return Ok((fence, now));
        }
        if let Some(grant) = place.grant.take() {
            state.used_at = now;
            state.queue.push_back(Waiter {
                owner: place.owner,
                // The lease the store keeps, not the one the holder is told of.
                ttl: ask.ttl + self.lock_delay,
                note: ask.note.to_owned(),
                grant,
            });
        }
        // Sleep until the hand-off, or until the current lease would expire (a holder that
        // vanished never hands off).
        Err(state
            .holder
            .as_ref()
            .map_or(now + ask.ttl, |holder| holder.expires_at))
    }

    /// Leaves the queue after the deadline; a grant that raced with giving up is passed on.
    fn give_up(&self, key: &str, owner: OwnerToken, started: Instant) -> LockError {
        let now = Instant::now();
        let mut table = self.table();
        if let Some(state) = table.get_mut(key) {
            state.queue.retain(|waiter| waiter.owner != owner);
            if state
                .holder
                .as_ref()
                .is_some_and(|holder| holder.owner == owner)
            {
                state.hand_off(now);
            }
        }
        LockError::TimedOut {
            key: key.to_owned(),
            waited: now - started,
        }
    }
}

/// A waiter's side of its queue entry: the sender the entry takes when it joins, until
/// then.
struct Place {
    owner: OwnerToken,
    grant: Option<oneshot::Sender<(u64, Instant)>>,
}

/// Cleans up after an acquire call whose future was dropped before it settled: leaves the
/// queue, and passes on a grant that reached it but was never claimed.
struct Pending<'a> {
    backend: &'a InProcessBackend,
    key: &'a str,
    owner: OwnerToken,
    settled: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.settled {
            let _ = self.backend.give_up(self.key, self.owner, Instant::now());
        }
    }
}

impl KeyState {
    /// Whether a free lock must go to a queued waiter first (no barging past the queue).
    /// Hands it over if so.
    fn hand_off_pending(&mut self, now: Instant) -> bool {
        self.queue.retain(|waiter| !waiter.grant.is_closed());
        if self.holder.is_none() && !self.queue.is_empty() {
            return self.hand_off(now);
        }
        false
    }
}
