//! Locks in memcached, in its meta protocol: an item per locked key, added only if absent
//! and given an expiry; released and extended by compare-and-swap on the CAS value the
//! add returned, so a holder never deletes or extends another's lock.
//!
//! - **Grant**: `ms <key> … ME` (add) with the lease as the item's TTL, returning the
//!   item's CAS; then the key's counter is incremented (`ma`, created from the clock in
//!   microseconds if missing) for the fencing token; then the item is rewritten under its
//!   CAS (`ms … C<cas>`), which confirms the lease was still ours after the increment — a
//!   holder whose lease ran out between add and increment gets no grant, so a token is
//!   never handed to a holder that lost its lease before a successor got a lower one.
//!   Three round trips; a grant that fails or is cut short half-way deletes what it
//!   added. **Release** and **extend** look the item up (`mg <key> v c`) and, if it holds
//!   the grant's value (owner token and note), delete it (`md <key> C<cas>`) or rewrite it
//!   with a new TTL under the CAS that look returned: two round trips each. (Not under the
//!   CAS remembered from the grant: memcached's CAS counter starts over after a restart,
//!   and another's item may come to carry the same number.)
//! - **Expiry is in whole seconds**, by memcached's own clock, which ticks once a second:
//!   an item's TTL is the lease rounded up, plus one second, so it never expires before
//!   the lease the holder is told of; a vanished holder's key is free one to two seconds
//!   past its lease.
//! - **Waiting is polling**: memcached cannot notify. One waiter per key per process polls
//!   (the others wait their turn in the process), backing off from 1 ms to 100 ms with
//!   jitter; a release in this process wakes it at once. Across processes, whoever polls
//!   first after a release wins.
//! - **Fencing token**: memcached loses the counter on a restart and may evict it; it
//!   starts again from the clock, so tokens still grow unless the clock stepped back across
//!   the loss, and `raise_fencing` lifts it — exactly as for Redis. It expires about the
//!   idle time ([`LockOptions::idle`]) after the last lease it counted ends, so keys
//!   locked once leave nothing behind: it is created with that TTL, and when a grant finds
//!   less than half the idle time left past its lease, the holder's next renewal or its
//!   release renews it (`mg <counter> T…`; memcached 1.6's increment cannot) — one
//!   request more, about once per half idle time for a key in constant use, none for a
//!   key locked once.
//! - **Lock-delay**: the item outlives the lease by the delay, so a holder that vanished
//!   keeps its key that much longer; a release deletes it at once.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_memcached::{Client, Error as MemcachedError, MetaProtocol, MetaValue, Status};
use async_trait::async_trait;
use deadpool::managed::{self, Metrics, Object, Pool, RecycleError, RecycleResult};
use tokio::time::{Instant, timeout, timeout_at};

use crate::backend::{Ask, DEFAULT_OP_TIMEOUT, Lease, LockBackend, LockOptions, Sessions};
use crate::error::LockError;
use crate::token::{FencingToken, OwnerToken};
use crate::turns::{Poll, Turns};

/// What only [`MemcachedBackend`] is configured with (the rest is [`LockOptions`]).
#[derive(Clone, Debug)]
pub struct MemcachedOptions {
    /// The most connections this process opens.
    pub max_connections: usize,
}

impl Default for MemcachedOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
        }
    }
}

/// The longest TTL memcached takes as seconds from now: 30 days. A larger number is read
/// as a date (Unix time).
const MAX_RELATIVE_TTL: u64 = 30 * 24 * 60 * 60;

/// memcached's longest key.
const MAX_KEY: usize = 250;

/// Opens connections for the pool; a connection an operation left half done is closed,
/// never reused.
#[derive(Debug)]
struct Connector {
    address: String,
}

impl managed::Manager for Connector {
    type Type = Client;
    type Error = MemcachedError;

    async fn create(&self) -> Result<Client, MemcachedError> {
        Client::new(&self.address).await
    }

    async fn recycle(&self, client: &mut Client, _: &Metrics) -> RecycleResult<MemcachedError> {
        if client.is_closed() {
            return Err(RecycleError::message(
                "closed after an incomplete operation",
            ));
        }
        Ok(())
    }
}

/// A lock this process holds: its key and the item's value — the grant's owner token and
/// its note. Release and extend look the item up first and act only if it holds that
/// value, under the CAS value that look returned: a CAS value remembered from the grant is
/// not enough, since memcached's CAS counter starts over after a restart and another's
/// item may come to carry the same number.
#[derive(Clone, Debug)]
struct Held {
    item: String,
    value: String,
    /// The key's fencing counter, and a moment before which it surely has not expired:
    /// a renewal that would come close to it renews the counter too.
    counter: String,
    counter_until: Instant,
}

/// The item a grant added, deleted again (if it still holds the grant's value) unless the
/// grant completes — so a grant that fails, runs out of time or is dropped half-way leaves
/// no lock behind to sit out its TTL.
struct Added {
    pool: Pool<Connector>,
    item: String,
    value: String,
    op_timeout: Duration,
    done: bool,
}

impl Drop for Added {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, op_timeout) = (self.pool.clone(), self.op_timeout);
        let (item, value) = (
            std::mem::take(&mut self.item),
            std::mem::take(&mut self.value),
        );
        runtime.spawn(async move {
            // Best effort: if this fails too, the item expires with its TTL.
            let _ = timeout(op_timeout, async {
                let mut client = pool.get().await.ok()?;
                let found = Command::Get {
                    key: &item,
                    flags: &["v", "c"],
                }
                .send(&mut client)
                .await
                .ok()??;
                if found.data.as_deref() != Some(value.as_bytes()) {
                    return None;
                }
                Command::Delete {
                    key: &item,
                    flags: vec![format!("C{}", found.cas?)],
                }
                .send(&mut client)
                .await
                .ok()
            })
            .await;
        });
    }
}

/// Locks in memcached. See the module docs.
pub struct MemcachedBackend {
    pool: Pool<Connector>,
    /// `idle` is counted in whole seconds, at most 30 days.
    options: LockOptions,
    op_timeout: Duration,
    turns: Turns,
    held: Mutex<HashMap<OwnerToken, Held>>,
    /// Requests sent, for benchmarks and tests.
    requests: AtomicU64,
}

impl fmt::Debug for MemcachedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemcachedBackend")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What a request's failure means.
enum Refused {
    /// The server's answer: not stored, exists (CAS mismatch), not found.
    Status(Status),
    /// No answer, or none that makes sense: the store is unavailable.
    Unavailable(LockError),
}

fn unavailable(error: impl fmt::Display) -> Refused {
    Refused::Unavailable(LockError::unavailable(format!("memcached: {error}")))
}

impl From<Refused> for LockError {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::Status(status) => {
                LockError::unavailable(format!("memcached answered {status}"))
            }
            Refused::Unavailable(error) => error,
        }
    }
}

/// A meta answer that carries flags (`NS c0`) comes back as a value with a status: a
/// refusal all the same.
fn refused_by_status(answer: Option<MetaValue>) -> Result<Option<MetaValue>, Refused> {
    match answer.as_ref().and_then(|value| value.status.clone()) {
        None | Some(Status::Stored | Status::Value | Status::Deleted | Status::Touched) => {
            Ok(answer)
        }
        Some(status) => Err(Refused::Status(status)),
    }
}

/// A key as memcached takes it: printable ASCII without spaces; other bytes (and `%`)
/// escaped, so distinct keys stay distinct.
fn escape(key: &str) -> String {
    let mut escaped = String::with_capacity(key.len());
    for byte in key.bytes() {
        if byte.is_ascii_graphic() && byte != b'%' {
            escaped.push(char::from(byte));
        } else {
            escaped.push_str(&format!("%{byte:02X}"));
        }
    }
    escaped
}

/// The clock in microseconds, where a counter starts.
fn clock_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

/// memcached's TTL for a lease: whole seconds, rounded up, plus one for its clock's tick.
fn ttl_flag(lease: Duration) -> String {
    format!(
        "T{}",
        lease.as_secs() + u64::from(lease.subsec_nanos() > 0) + 1
    )
}

/// One meta command, kept so it can be sent again.
enum Command<'a> {
    Set {
        key: &'a str,
        value: &'a [u8],
        flags: Vec<String>,
    },
    Get {
        key: &'a str,
        flags: &'a [&'a str],
    },
    Delete {
        key: &'a str,
        flags: Vec<String>,
    },
    Increment {
        key: &'a str,
        flags: Vec<String>,
    },
    Version,
}

impl Command<'_> {
    async fn send(&self, client: &mut Client) -> Result<Option<MetaValue>, MemcachedError> {
        fn borrowed(flags: &[String]) -> Vec<&str> {
            flags.iter().map(String::as_str).collect()
        }
        match self {
            Self::Set { key, value, flags } => {
                client
                    .meta_set(key, *value, false, None, Some(&borrowed(flags)))
                    .await
            }
            Self::Get { key, flags } => client.meta_get(key, false, None, Some(flags)).await,
            Self::Delete { key, flags } => {
                client
                    .meta_delete(key, false, None, Some(&borrowed(flags)))
                    .await
            }
            Self::Increment { key, flags } => {
                client
                    .meta_increment(key, false, None, None, Some(&borrowed(flags)))
                    .await
            }
            Self::Version => client.version().await.map(|_| None),
        }
    }
}

impl MemcachedBackend {
    /// A backend for `url` (`memcache://host:port`). Connects lazily; must be used inside
    /// a Tokio runtime.
    pub fn open(
        url: &str,
        options: &LockOptions,
        own: MemcachedOptions,
    ) -> Result<Self, LockError> {
        let op_timeout = options.op_timeout_or(DEFAULT_OP_TIMEOUT);
        let address = url
            .strip_prefix("memcache://")
            .or_else(|| url.strip_prefix("memcached://"))
            .ok_or_else(|| LockError::Invalid(format!("not a memcache:// URL: {url}")))?
            .trim_end_matches('/');
        if address.is_empty() || address.contains('/') {
            return Err(LockError::Invalid(format!("bad memcached URL: {url}")));
        }
        let pool = Pool::builder(Connector {
            address: format!("tcp://{address}"),
        })
        .max_size(own.max_connections.max(1))
        .runtime(deadpool::Runtime::Tokio1)
        .wait_timeout(Some(op_timeout))
        .create_timeout(Some(op_timeout))
        .build()
        .map_err(|error| LockError::Invalid(format!("memcached pool: {error}")))?;
        Ok(Self {
            pool,
            options: options.clone(),
            op_timeout,
            turns: Turns::default(),
            held: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
        })
    }

    /// Requests sent so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn held(&self) -> MutexGuard<'_, HashMap<OwnerToken, Held>> {
        // Inserts and removes cannot leave the map inconsistent.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The item that is the lock, and the key's counter.
    fn items(&self, key: &str) -> Result<(String, String), LockError> {
        let escaped = escape(key);
        let item = format!("{}:lock:{escaped}", self.options.namespace);
        if item.len() + 1 > MAX_KEY {
            return Err(LockError::Invalid(format!(
                "a memcached lock key is at most {MAX_KEY} bytes with its namespace"
            )));
        }
        Ok((item, format!("{}:fence:{escaped}", self.options.namespace)))
    }

    /// The TTL flag of the item for a lease: the lease and the lock-delay.
    fn ttl(&self, lease: Duration) -> String {
        ttl_flag(lease.saturating_add(self.options.lock_delay))
    }

    /// The counter's TTL for a lease, in seconds: the lease, the lock-delay and the idle
    /// time, rounded up, plus one for memcached's clock tick; at most 30 days.
    fn counter_ttl(&self, lease: Duration) -> u64 {
        let kept = lease
            .saturating_add(self.options.lock_delay)
            .saturating_add(self.options.idle);
        (kept.as_secs() + u64::from(kept.subsec_nanos() > 0) + 1).min(MAX_RELATIVE_TTL)
    }

    /// Whether a counter that lives `left` more must be renewed for a lease: it would not
    /// outlive the lease by half the idle time.
    fn counter_runs_short(&self, left: Duration, lease: Duration) -> bool {
        let wanted = lease
            .saturating_add(self.options.lock_delay)
            .saturating_add(self.options.idle / 2);
        left < wanted.min(Duration::from_secs(MAX_RELATIVE_TTL / 2))
    }

    /// Renews the counter for a lease (`mg <counter> T…`): how long it lives now,
    /// counted from before the request. Best effort: a counter that expires under a
    /// held lock starts again from the clock, which fencing tolerates.
    async fn keep_counter(&self, counter: &str, lease: Duration) -> Duration {
        let ttl_secs = self.counter_ttl(lease);
        let touched = self
            .request(&Command::Get {
                key: counter,
                flags: &[&format!("T{ttl_secs}")],
            })
            .await;
        match touched {
            // Less the second memcached's clock may round off.
            Ok(_) => Duration::from_secs(ttl_secs.saturating_sub(1)),
            Err(_) => {
                tracing::debug!(counter, "could not renew a memcached fencing counter");
                Duration::ZERO
            }
        }
    }

    /// Runs one command on a pooled connection, bounded by the op timeout, counted. A
    /// connection whose command did not complete is closed (the pool drops it). A pooled
    /// connection the server closed since its last use (a restart) fails before any answer:
    /// the command is sent once more, on a new connection.
    async fn request(&self, command: &Command<'_>) -> Result<Option<MetaValue>, Refused> {
        let limit = Instant::now() + self.op_timeout;
        let mut retried = false;
        loop {
            self.requests.fetch_add(1, Ordering::Relaxed);
            let mut client: Object<Connector> = match timeout_at(limit, self.pool.get()).await {
                Ok(Ok(client)) => client,
                Ok(Err(error)) => return Err(unavailable(error)),
                Err(_) => return Err(unavailable("no connection in time")),
            };
            let reused = Object::metrics(&client).recycle_count > 0;
            match timeout_at(limit, command.send(&mut client)).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(MemcachedError::Protocol(Status::Error(kind)))) => {
                    return Err(unavailable(format!("{kind:?}")));
                }
                Ok(Err(MemcachedError::Protocol(status))) => return Err(Refused::Status(status)),
                Ok(Err(MemcachedError::Io(_) | MemcachedError::ConnectionClosed))
                    if reused && !retried =>
                {
                    retried = true;
                    drop(Object::take(client));
                }
                Ok(Err(error)) => return Err(unavailable(error)),
                Err(_) => {
                    // Half done: never hand this connection out again.
                    drop(Object::take(client));
                    return Err(unavailable("no answer in time"));
                }
            }
        }
    }

    /// Adds the lock's item if it is absent: its CAS value, or `None` when it is there.
    async fn add(&self, item: &str, note: &str, ttl: Duration) -> Result<Option<u64>, LockError> {
        let flags = vec![self.ttl(ttl), "ME".to_owned(), "c".to_owned()];
        self.set(item, note, flags, |status| {
            matches!(status, Status::NotStored)
        })
        .await
    }

    /// Rewrites the lock's item under `cas` with a new TTL: its new CAS, or `None` if the
    /// item is not ours any more (gone, or another's).
    async fn rewrite(
        &self,
        item: &str,
        cas: u64,
        note: &str,
        ttl: Duration,
    ) -> Result<Option<u64>, LockError> {
        let flags = vec![self.ttl(ttl), format!("C{cas}"), "c".to_owned()];
        self.set(item, note, flags, |status| {
            matches!(
                status,
                Status::Exists | Status::NotFound | Status::NotStored
            )
        })
        .await
    }

    /// Sets the lock's item to `note` under `flags` (its TTL and the condition): its new
    /// CAS, or `None` when memcached did not store it for a reason `not_stored` accepts.
    async fn set(
        &self,
        item: &str,
        note: &str,
        flags: Vec<String>,
        not_stored: fn(&Status) -> bool,
    ) -> Result<Option<u64>, LockError> {
        let set = self
            .request(&Command::Set {
                key: item,
                value: note.as_bytes(),
                flags,
            })
            .await;
        match set.and_then(refused_by_status) {
            Ok(Some(value)) => value
                .cas
                .map(Some)
                .ok_or_else(|| LockError::unavailable("memcached returned no CAS value")),
            Ok(None) => Err(LockError::unavailable("memcached returned no CAS value")),
            Err(Refused::Status(status)) if not_stored(&status) => Ok(None),
            Err(refused) => Err(refused.into()),
        }
    }

    /// Increments the key's counter (created from the clock if missing, to live the
    /// idle time past the lease): the new value, and how long the counter lives (zero if
    /// it has no expiry: written before counters expired).
    async fn next_token(
        &self,
        counter: &str,
        lease: Duration,
    ) -> Result<(u64, Duration), LockError> {
        let incremented = self
            .request(&Command::Increment {
                key: counter,
                flags: vec![
                    format!("N{}", self.counter_ttl(lease)),
                    format!("J{}", clock_micros()),
                    "v".to_owned(),
                    "t".to_owned(),
                ],
            })
            .await?;
        let lives = incremented
            .as_ref()
            .and_then(|value| u64::try_from(value.ttl_remaining?).ok())
            .map_or(Duration::ZERO, |secs| {
                Duration::from_secs(secs.saturating_sub(1))
            });
        let token = incremented
            .and_then(|value| value.data)
            .and_then(|data| std::str::from_utf8(&data).ok()?.trim().parse().ok())
            .ok_or_else(|| LockError::unavailable("memcached returned no counter"))?;
        Ok((token, lives))
    }

    /// One attempt: the grant's token and how long the counter lives from the attempt
    /// on, or `None` when the lock is held. A counter that runs short is left to the
    /// holder's renewal or release to renew: a request here could be cut off by the
    /// caller's deadline with the lock granted.
    async fn grant(
        &self,
        item: &str,
        counter: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Option<(u64, Duration)>, LockError> {
        let Some(cas) = self.add(item, value, ttl).await? else {
            return Ok(None);
        };
        let mut added = Added {
            pool: self.pool.clone(),
            item: item.to_owned(),
            value: value.to_owned(),
            op_timeout: self.op_timeout,
            done: false,
        };
        let (token, counter_lives) = self.next_token(counter, ttl).await?;
        // Still ours after the increment? (If the lease ran out meanwhile, a successor may
        // hold a lower token already: this grant must not be used.)
        let rewritten = self.rewrite(item, cas, value, ttl).await?;
        added.done = true;
        Ok(rewritten.map(|_| (token, counter_lives)))
    }

    /// The item's CAS value now, if it still holds `value` (the grant is still ours).
    async fn still_ours(&self, item: &str, value: &str) -> Result<Option<u64>, LockError> {
        let found = self
            .request(&Command::Get {
                key: item,
                flags: &["v", "c"],
            })
            .await
            .map_err(LockError::from)?;
        Ok(found
            .filter(|found| found.data.as_deref() == Some(value.as_bytes()))
            .and_then(|found| found.cas))
    }

    /// Deletes the lock's item if it still holds `held`'s value: whether it did. A write
    /// between the look and the delete (our own extend, cancelled mid-way) is looked at
    /// once more.
    async fn delete_if_ours(&self, held: &Held) -> Result<bool, LockError> {
        for _ in 0..2 {
            let Some(cas) = self.still_ours(&held.item, &held.value).await? else {
                return Ok(false);
            };
            let deleted = self
                .request(&Command::Delete {
                    key: &held.item,
                    flags: vec![format!("C{cas}")],
                })
                .await
                .and_then(refused_by_status);
            match deleted {
                Ok(_) => return Ok(true),
                Err(Refused::Status(Status::Exists)) => {}
                Err(Refused::Status(Status::NotFound)) => return Ok(false),
                Err(refused) => return Err(refused.into()),
            }
        }
        Ok(false)
    }
}

#[async_trait]
impl LockBackend for MemcachedBackend {
    /// Takes the lock: waits for the key's turn in this process, then polls the store
    /// until a grant (or once, without a deadline).
    async fn acquire(&self, ask: Ask<'_>) -> Result<Option<Lease>, LockError> {
        let (item, counter) = self.items(ask.key)?;
        let Some((turn, _turn)) = self
            .turns
            .wait(&item, ask.deadline)
            .await
            .map_err(|()| ask.timed_out())?
        else {
            return Ok(None);
        };
        let owner = OwnerToken::random();
        let value = format!("{} {}", owner.to_hex(), ask.note);
        let (item_ref, counter_ref, value_ref) = (&item, &counter, &value);
        let granted = turn
            .poll(&ask, move || async move {
                let asked_at = Instant::now();
                let grant = self.grant(item_ref, counter_ref, value_ref, ask.ttl);
                let granted = match ask.deadline {
                    // Each step of a grant bounded by the deadline too, not only by the op
                    // timeout: a grant cut short deletes what it added (`Added`).
                    Some(deadline) => timeout_at(deadline, grant)
                        .await
                        .map_err(|_| ask.timed_out())?,
                    None => grant.await,
                };
                Ok(match granted? {
                    Some(granted) => Poll::Granted((granted, asked_at)),
                    None => Poll::Held { left: None },
                })
            })
            .await?;
        let Some(((token, counter_lives), asked_at)) = granted else {
            return Ok(None);
        };
        self.held().insert(
            owner,
            Held {
                item,
                value,
                counter,
                counter_until: asked_at + counter_lives,
            },
        );
        Ok(Some(Lease::new(
            ask.key,
            owner,
            FencingToken::new(token),
            ask.ttl,
            asked_at,
        )))
    }

    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        let (item, _) = self.items(key)?;
        let found = self
            .request(&Command::Get {
                key: &item,
                flags: &["v"],
            })
            .await
            .map_err(LockError::from)?;
        // The value is the owner token, a space, and the note.
        Ok(found.and_then(|value| value.data).map(|value| {
            let value = String::from_utf8_lossy(&value);
            value
                .split_once(' ')
                .map_or_else(String::new, |(_, note)| note.to_owned())
        }))
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(held) = self.held().remove(&lease.owner()) else {
            return Ok(false);
        };
        let deleted = self.delete_if_ours(&held).await;
        // The waiter whose turn it is (if any) polls again now, not at its next pause.
        self.turns.of(&held.item).released();
        if deleted.is_ok()
            && self.counter_runs_short(
                held.counter_until.saturating_duration_since(Instant::now()),
                Duration::ZERO,
            )
        {
            // The key may be locked again at once: its counter lives the idle time on.
            self.keep_counter(&held.counter, Duration::ZERO).await;
        }
        deleted.inspect_err(|_| {
            // Not known released: keep it, so a retry can still release it (else it
            // expires with its TTL).
            self.held().insert(lease.owner(), held.clone());
        })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<bool, LockError> {
        let Some(held) = self.held().get(&lease.owner()).cloned() else {
            return Ok(false);
        };
        let Some(cas) = self.still_ours(&held.item, &held.value).await? else {
            return Ok(false);
        };
        let sent_at = Instant::now();
        if self
            .rewrite(&held.item, cas, &held.value, ttl)
            .await?
            .is_none()
        {
            return Ok(false);
        }
        // A lock held for about half the idle time keeps its counter alive as it renews.
        if self.counter_runs_short(held.counter_until.saturating_duration_since(sent_at), ttl) {
            let counter_lives = self.keep_counter(&held.counter, ttl).await;
            if let Some(kept) = self.held().get_mut(&lease.owner()) {
                kept.counter_until = sent_at + counter_lives;
            }
        }
        Ok(true)
    }

    async fn raise_fencing(
        &self,
        key: &str,
        floor: FencingToken,
    ) -> Result<FencingToken, LockError> {
        let (_, counter) = self.items(key)?;
        loop {
            let found = self
                .request(&Command::Get {
                    key: &counter,
                    flags: &["v", "c"],
                })
                .await
                .map_err(LockError::from)?;
            let current = found.as_ref().and_then(|value| {
                std::str::from_utf8(value.data.as_deref()?)
                    .ok()?
                    .trim()
                    .parse::<u64>()
                    .ok()
            });
            let target = match current {
                Some(current) if current >= floor.get() => return Ok(FencingToken::new(current)),
                Some(_) => floor.get(),
                None => floor.get().max(clock_micros()),
            };
            // Written only if unchanged since read (or still absent): else look again.
            // (A counter that is there but unreadable is overwritten under its CAS too.)
            let mode = match found.as_ref().and_then(|value| value.cas) {
                Some(cas) => format!("C{cas}"),
                None => "ME".to_owned(),
            };
            let target_text = target.to_string();
            // Kept the idle time, as a counter is past a lease.
            let written = self
                .request(&Command::Set {
                    key: &counter,
                    value: target_text.as_bytes(),
                    flags: vec![mode, format!("T{}", self.counter_ttl(Duration::ZERO))],
                })
                .await;
            match written.and_then(refused_by_status) {
                Ok(_) => return Ok(FencingToken::new(target)),
                Err(Refused::Status(Status::Exists | Status::NotStored | Status::NotFound)) => {}
                Err(refused) => return Err(refused.into()),
            }
        }
    }

    async fn ping(&self) -> Result<(), LockError> {
        self.request(&Command::Version)
            .await
            .map_err(LockError::from)?;
        Ok(())
    }

    fn sessions(&self) -> Sessions {
        Sessions::PerGrant
    }

    fn expiry_granularity(&self) -> Duration {
        Duration::from_secs(1)
    }
}
