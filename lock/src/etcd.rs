//! Locks in etcd, by the recipe of etcd's own concurrency package and the seeds: every
//! waiter puts a key of its own under the lock's prefix, attached to the process's lease;
//! the key with the lowest create revision holds the lock; each waiter watches only the
//! key created just before its own (a release wakes one waiter, never the herd); release
//! deletes the key.
//!
//! - **The lease is the lease.** One etcd lease per process, kept alive by a keep-alive
//!   stream every third of its TTL. When the process stops keeping it alive (it crashed,
//!   paused, or lost the network for a TTL) etcd revokes it and deletes every key on it:
//!   the process's locks pass to their next waiters. `extend` asks no server: it reports
//!   what the process knows — its key is undeleted (a watch on it says so) and the lease's
//!   last keep-alive was answered. While the keep-alive goes unanswered the lease may still
//!   live, so `extend` fails (the guard retries until its lease would run out, then
//!   declares the lock lost); once the lease ended or the key was deleted, `extend`
//!   answers false and `lost` fires.
//! - **Fencing token**: the holder key's create revision. etcd's revision counts every
//!   change to the whole store and survives restarts, so tokens only grow, with no counter
//!   to lose. Plus the key's *base*, kept in etcd under the lock's prefix:
//!   `raise_fencing` lifts it, for a protected store that has seen higher tokens (from
//!   another lock service, before a switch). It is 0 unless raised.
//! - Per hand-off: the release (one delete), the successor's look at the holder (with the
//!   base, one request) and its watch on its own key — three requests however long the
//!   queue. A waiter that gives up deletes its key, so it never holds up the line.
//! - **Nothing left behind.** Deletes that fail — a release or a give-up while etcd is
//!   unreachable — go to a per-lease cleaner that retries them until they succeed or the
//!   lease ends (which deletes the keys anyway). A create whose answer never came might
//!   still be applied after the cleaner's delete (requests are not ordered), so the
//!   cleaner also leaves a tombstone on the lease that the create's transaction checks
//!   for: whichever comes second, no key is left. Tombstones are deleted after a minute.
//! - **Lock-delay** (when set): a holder leaves a marker key `<key>/held` (on no lease),
//!   deleted in the same transaction as its key on release. A successor that finds the
//!   marker still there knows its predecessor's lease ended without a release, and waits
//!   the delay before using the lock (it holds it meanwhile, so nobody else can); a
//!   `try_acquire` then answers that the lock is taken. One request more per grant.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;

use self::client::pb::{Compare, RangeRequest, RequestOp, TxnRequest, TxnResponse};
use self::client::{Etcd, Members, deleted_or_cancelled};
use crate::backend::{Ask, DEFAULT_OP_TIMEOUT, Lease, LockBackend, LockOptions, Sessions};
use crate::error::LockError;
use crate::open::host_urls;
use crate::token::{FencingToken, OwnerToken};

pub(crate) mod client;

/// What [`EtcdBackend`] keeps of its [`LockOptions`].
#[derive(Clone, Debug)]
struct EtcdOptions {
    /// The lease's TTL (whole seconds, at least etcd's minimum of about 2 s): how long after
    /// this process stops keeping the lease alive its locks are released.
    lease_ttl: Duration,
    /// Upper bound on connecting and on any one request.
    op_timeout: Duration,
    /// The most waiters one key's queue takes; past it an acquire fails at once.
    max_waiters: usize,
    /// Chubby's lock-delay: after a holder's lease ended without a release, its successor
    /// holds the lock but waits this long before using it (see the module docs). Zero by
    /// default: no marker is kept.
    lock_delay: Duration,
}

impl From<&LockOptions> for EtcdOptions {
    fn from(options: &LockOptions) -> Self {
        Self {
            lease_ttl: options.session,
            op_timeout: options.op_timeout_or(DEFAULT_OP_TIMEOUT),
            max_waiters: options.max_waiters,
            lock_delay: options.lock_delay,
        }
    }
}

/// What one look at a lock saw.
struct Look {
    /// When the look was sent: a grant it shows counts its lease from then.
    sent: Instant,
    /// The holder's create revision.
    holder: Option<i64>,
    /// How many keys are in line, the holder's included.
    in_line: i64,
    /// Our own key is still there (when the look asked).
    ours_kept: bool,
    /// The fencing base.
    base: u64,
    /// The marker left by a holder that never released (lock-delay only).
    unreleased: bool,
}

/// What this process knows of its lease.
#[derive(Debug)]
struct LeaseHealth {
    id: i64,
    /// Until when the lease surely lives: the time the last answered keep-alive (or the
    /// grant) was sent, plus the TTL etcd answered with.
    lives_until: Mutex<Instant>,
    /// Revoked or expired: its keys are gone, for good.
    ended: AtomicBool,
    /// Deletes to retry, for this lease's cleaner.
    leftovers: mpsc::UnboundedSender<Leftover>,
}

impl LeaseHealth {
    fn lives_until(&self) -> Instant {
        *self
            .lives_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// An answer sent at `sent` said the lease has `ttl_secs` seconds left.
    fn confirmed(&self, sent: Instant, ttl_secs: i64) {
        let until = sent + Duration::from_secs(ttl_secs.max(0).unsigned_abs());
        let mut lives_until = self
            .lives_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *lives_until = (*lives_until).max(until);
    }

    /// etcd answered that the lease is gone: its keys are deleted.
    fn end(&self) {
        tracing::warn!("etcd lease ended: its locks are released");
        self.ended.store(true, Ordering::Release);
    }
}

/// The lease slot: the current lease, and when granting one last failed (callers then fail
/// fast for a moment instead of queueing behind grants that cannot succeed).
#[derive(Default)]
struct LeaseSlot {
    current: Option<Arc<LeaseHealth>>,
    failed_at: Option<Instant>,
}

/// How long after a failed grant callers are answered at once, without a new attempt.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// How long a tombstone outlives the cleaner's delete: far past any request's own
/// deadline, after which a create it guards against can no longer be applied.
const TOMBSTONE_KEPT: Duration = Duration::from_secs(60);

/// A key that should be deleted and may not have been.
#[derive(Debug)]
enum Leftover {
    /// A waiter's key whose create was never answered: delete it and leave a tombstone.
    Unanswered { key: String, tombstone: String },
    /// A waiter's key, or a holder's whose release failed (then with its lock-delay
    /// marker, deleted only while the key is there — as a release does).
    Created { key: String, marker: Option<String> },
}

/// A lock this process holds.
struct Held {
    key: String,
    lease: Arc<LeaseHealth>,
    /// Set by the watch on the key when it is deleted (by its lease's end, or by hand).
    deleted: Arc<AtomicBool>,
}

/// Locks in an etcd cluster. See the module docs for the recipe.
pub struct EtcdBackend {
    /// `http://host:port` of every member given.
    endpoints: Vec<String>,
    /// The same, checked, with the op timeout on connecting and on every request.
    members: Members,
    /// Where this deployment's locks live: `<root>/locks/<key>/…`.
    root: String,
    options: EtcdOptions,
    /// Connected lazily, once (connecting needs a Tokio runtime; opening does not).
    client: OnceLock<Etcd>,
    /// The lease every lock of this process rides on; replaced once it ends.
    lease: tokio::sync::Mutex<LeaseSlot>,
    /// Locks held now, by owner token: release and extend find their key here.
    held: Arc<Mutex<HashMap<OwnerToken, Held>>>,
    /// Ends the keep-alive and key watches when the backend goes.
    closing: CancellationToken,
    /// Requests sent, for benchmarks and tests.
    requests: AtomicU64,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.endpoints)
            .field("root", &self.root)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        self.closing.cancel();
    }
}

/// Why a request failed: etcd's answer, or none in time.
fn failed(error: impl fmt::Display) -> LockError {
    LockError::unavailable(format!("etcd: {error}"))
}

/// A key's name as one path segment: `/` would nest it, `%` escapes.
fn segment(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

/// A key's fencing base as stored (decimal digits; absent or anything else: 0 — the
/// revision alone still grows).
fn parse_base(value: Option<&[u8]>) -> u64 {
    value
        .and_then(|value| std::str::from_utf8(value).ok())
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
}

/// The keys of one lock.
struct Keys {
    /// Every waiter's key starts so; the holder's is the oldest.
    waiters: String,
    /// Tombstones of creates never answered start so.
    tombstones: String,
    /// The fencing base.
    base: String,
    /// The lock-delay marker.
    marker: String,
}

impl EtcdBackend {
    /// A backend for `url`: `etcd://host:port[,host:port…][/root]` (the root defaults to
    /// `/payonce`). Connects lazily; must be used inside a Tokio runtime.
    pub fn open(url: &str, options: &LockOptions) -> Result<Self, LockError> {
        let options = EtcdOptions::from(options);
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| LockError::Invalid(format!("not an etcd:// URL: {url}")))?;
        let (hosts, root) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash..]),
            None => (rest, ""),
        };
        let root = root.trim_end_matches('/');
        let root = if root.is_empty() { "/payonce" } else { root };
        let endpoints = host_urls(hosts, "http://");
        if endpoints.is_empty() {
            return Err(LockError::Invalid(format!("bad etcd URL: {url}")));
        }
        if options.lease_ttl < Duration::from_secs(2) {
            return Err(LockError::Invalid(
                "an etcd lease lasts at least 2 s".to_owned(),
            ));
        }
        Ok(Self {
            members: Members::new(&endpoints, options.op_timeout)?,
            endpoints,
            root: root.to_owned(),
            options: EtcdOptions {
                max_waiters: options.max_waiters.max(1),
                ..options
            },
            client: OnceLock::new(),
            lease: tokio::sync::Mutex::new(LeaseSlot::default()),
            held: Arc::new(Mutex::new(HashMap::new())),
            closing: CancellationToken::new(),
            requests: AtomicU64::new(0),
        })
    }

    /// Requests sent so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The current lease's id, for tests and tools that revoke it from outside; `None`
    /// before the first use.
    pub async fn lease_id(&self) -> Option<i64> {
        self.lease
            .lock()
            .await
            .current
            .as_ref()
            .map(|lease| lease.id)
    }

    fn held(&self) -> MutexGuard<'_, HashMap<OwnerToken, Held>> {
        // Inserts and removes cannot leave the map inconsistent.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn keys(&self, key: &str) -> Keys {
        let prefix = format!("{}/locks/{}/", self.root, segment(key));
        Keys {
            waiters: format!("{prefix}w/"),
            tombstones: format!("{prefix}gone/"),
            base: format!("{prefix}base"),
            marker: format!("{prefix}held"),
        }
    }

    /// Bounds one request by the op timeout and by `deadline`, and counts it.
    async fn request<T>(
        &self,
        deadline: Option<Instant>,
        call: impl Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, LockError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let op_limit = Instant::now() + self.options.op_timeout;
        let limit = deadline.map_or(op_limit, |deadline| deadline.min(op_limit));
        match timeout_at(limit, call).await {
            Ok(result) => result.map_err(failed),
            Err(_) => Err(LockError::unavailable("etcd did not answer in time")),
        }
    }

    /// The connection, opened on first use (lazily: a cluster that is down shows on the
    /// first request).
    fn client(&self) -> Etcd {
        self.client
            .get_or_init(|| Etcd::connect(&self.members))
            .clone()
    }

    /// The live lease, granting a new one (and keeping it alive) if there is none or it
    /// ended. Waits for a grant under way at most the op timeout, and not past `deadline`.
    async fn lease(
        &self,
        client: &Etcd,
        deadline: Option<Instant>,
    ) -> Result<Arc<LeaseHealth>, LockError> {
        let op_limit = Instant::now() + self.options.op_timeout;
        let limit = deadline.map_or(op_limit, |deadline| deadline.min(op_limit));
        let mut slot = timeout_at(limit, self.lease.lock())
            .await
            .map_err(|_| LockError::unavailable("etcd: still granting a lease"))?;
        if let Some(lease) = slot.current.as_ref()
            && !lease.ended.load(Ordering::Acquire)
        {
            return Ok(lease.clone());
        }
        if slot
            .failed_at
            .is_some_and(|failed_at| failed_at.elapsed() < RETRY_PAUSE)
        {
            return Err(LockError::unavailable(
                "etcd could not be reached a moment ago",
            ));
        }
        let ttl = i64::try_from(self.options.lease_ttl.as_secs()).unwrap_or(i64::MAX);
        let sent = Instant::now();
        // Bounded by the op timeout alone, so a failure is etcd's, not a caller's short
        // deadline; the caller gives up at its deadline all the same.
        let grant = self.request(None, client.grant(ttl));
        let granted = match deadline {
            Some(deadline) => timeout_at(deadline, grant)
                .await
                .map_err(|_| LockError::unavailable("etcd: still granting a lease"))?,
            None => grant.await,
        };
        let granted = match granted {
            Ok(granted) => granted,
            Err(error) => {
                slot.failed_at = Some(Instant::now());
                return Err(error);
            }
        };
        let (leftovers, to_clean) = mpsc::unbounded_channel();
        let lease = Arc::new(LeaseHealth {
            id: granted.id,
            lives_until: Mutex::new(sent),
            ended: AtomicBool::new(false),
            leftovers,
        });
        lease.confirmed(sent, granted.ttl);
        tokio::spawn(keep_alive(
            client.clone(),
            lease.clone(),
            self.options.lease_ttl,
            self.closing.clone(),
        ));
        tokio::spawn(clean_up(
            client.clone(),
            lease.clone(),
            to_clean,
            self.options.op_timeout,
            self.closing.clone(),
        ));
        *slot = LeaseSlot {
            current: Some(lease.clone()),
            failed_at: None,
        };
        Ok(lease)
    }

    /// The reads of one look at the lock: the holder (and how many are in line), the
    /// base, with a lock-delay the marker, and (when given) our own key.
    fn look_ops(&self, keys: &Keys, ours: Option<&str>) -> Vec<RequestOp> {
        let mut ops = vec![
            RequestOp::range(holder(&keys.waiters)),
            RequestOp::range(RangeRequest::key(keys.base.clone())),
        ];
        if !self.options.lock_delay.is_zero() {
            ops.push(RequestOp::range(RangeRequest::key(keys.marker.clone())));
        }
        if let Some(ours) = ours {
            ops.push(RequestOp::range(RangeRequest::key(ours).keys_only()));
        }
        ops
    }

    /// What the answers to [`Self::look_ops`] say (they are the last reads of a
    /// transaction).
    fn read_look(&self, answer: &TxnResponse, asked_ours: bool, sent: Instant) -> Look {
        let gets: Vec<_> = answer.ranges().collect();
        let first = |index: usize| gets.get(index).and_then(|get| get.kvs.first());
        let delayed = !self.options.lock_delay.is_zero();
        let ours_at = if delayed { 3 } else { 2 };
        Look {
            sent,
            holder: first(0).map(|kv| kv.create_revision),
            in_line: gets.first().map_or(0, |get| get.count),
            base: parse_base(first(1).map(|kv| kv.value.as_slice())),
            unreleased: delayed && first(2).is_some(),
            ours_kept: !asked_ours || first(ours_at).is_some(),
        }
    }

    /// One look at the lock, ours still in line, in one request.
    async fn look(
        &self,
        client: &Etcd,
        keys: &Keys,
        ours: &str,
        deadline: Option<Instant>,
    ) -> Result<Look, LockError> {
        let txn = TxnRequest::new([], self.look_ops(keys, Some(ours)));
        let sent = Instant::now();
        let answer = self.request(deadline, client.txn(txn)).await?;
        Ok(self.read_look(&answer, true, sent))
    }

    /// Lock-delay at a grant: waits out the delay if the marker says the last holder
    /// never released (not past `deadline`: then the lock is not ours to use, and `false`),
    /// and leaves our own marker.
    async fn honour_lock_delay(
        &self,
        client: &Etcd,
        keys: &Keys,
        unreleased: bool,
        deadline: Option<Instant>,
    ) -> Result<bool, LockError> {
        let delay = self.options.lock_delay;
        if delay.is_zero() {
            return Ok(true);
        }
        if unreleased {
            let Some(deadline) = deadline else {
                return Ok(false);
            };
            let until = Instant::now() + delay;
            if until > deadline {
                sleep_until(deadline).await;
                return Ok(false);
            }
            tracing::info!(
                key = keys.marker,
                ?delay,
                "the last holder never released: waiting out the lock-delay"
            );
            sleep_until(until).await;
        }
        self.request(None, client.put(keys.marker.clone(), "held", 0))
            .await?;
        Ok(true)
    }

    /// Joins the lock's queue: our key, on the lease — unless a cleaner already buried it
    /// — and a look at the holder and the base, in one request.
    async fn join_queue(
        &self,
        call: &Call<'_>,
        client: &Etcd,
        keys: &Keys,
        lease: Arc<LeaseHealth>,
        note: &str,
    ) -> Result<(Place, Look), LockError> {
        let owner = OwnerToken::random();
        let mine = format!("{}{}", keys.waiters, owner.to_hex());
        let tombstone = format!("{}{}", keys.tombstones, owner.to_hex());
        let txn = TxnRequest::new(
            [
                Compare::created_at(mine.clone(), 0),
                Compare::created_at(tombstone.clone(), 0),
            ],
            std::iter::once(RequestOp::put(mine.clone(), note, lease.id))
                .chain(self.look_ops(keys, None)),
        );
        // Before the create is sent: if its answer never comes, the cleaner deletes it.
        let mut queued = Queued {
            leftovers: lease.leftovers.clone(),
            leftover: Some(Leftover::Unanswered {
                key: mine.clone(),
                tombstone,
            }),
        };
        let sent = Instant::now();
        let created = match self.request(call.deadline, client.txn(txn)).await {
            Ok(created) => created,
            Err(error) => {
                // etcd lost the lease (a cluster rebuilt from nothing): a new one for the
                // next call, without waiting for the keep-alive to find out.
                if matches!(&error, LockError::Unavailable { reason } if reason.contains("lease not found"))
                {
                    lease.ended.store(true, Ordering::Release);
                }
                return Err(error);
            }
        };
        queued.created();
        if !created.succeeded {
            return Err(LockError::unavailable(
                "etcd: our key was cleaned up before it was created",
            ));
        }
        let revision = created
            .revision()
            .ok_or_else(|| LockError::unavailable("etcd answered without a revision"))?;
        let seen = self.read_look(&created, false, sent);
        let place = Place {
            owner,
            key: mine,
            revision,
            lease,
            queued,
        };
        Ok((place, seen))
    }

    /// Turns a waiter away when the line is full. Checked once, as it joins: the line
    /// ahead of it only ever shrinks.
    fn check_cap(&self, key: &str, place: &Place, seen: &Look) -> Result<(), LockError> {
        // Everyone in line but the holder, us included.
        let waiters = usize::try_from(seen.in_line - 1).unwrap_or(usize::MAX);
        if seen.holder != Some(place.revision) && waiters > self.options.max_waiters {
            return Err(LockError::QueueFull {
                key: key.to_owned(),
                max_waiters: self.options.max_waiters,
            });
        }
        Ok(())
    }

    /// Waits until the key created just before ours is deleted (at once when there is
    /// none), not past `deadline`: one request to find it, one to watch it.
    async fn wait_for_predecessor(
        &self,
        call: &Call<'_>,
        client: &Etcd,
        keys: &Keys,
        place: &Place,
        deadline: Instant,
    ) -> Result<(), LockError> {
        let before = RangeRequest::prefix(keys.waiters.clone())
            .keys_only()
            .created_by(place.revision - 1)
            .by_creation(true)
            .limit(1);
        let ahead = self
            .request(Some(deadline), client.range(before))
            .await
            .map_err(|error| call.waited_out(error))?;
        let Some(predecessor) = ahead.kvs.first() else {
            return Ok(());
        };
        let after = ahead.revision().unwrap_or(0) + 1;
        tokio::select! {
            gone = self.deleted(client, predecessor.key.clone(), after) => {
                gone.map_err(|error| call.waited_out(error))
            }
            () = sleep_until(deadline) => Err(call.timed_out()),
        }
    }

    /// Our key is the oldest: the lock is ours once any lock-delay is waited out. Watches
    /// the key (so `extend` knows when it goes) and records it as held; the fencing token
    /// is its create revision plus the base.
    async fn grant(
        &self,
        call: &Call<'_>,
        client: &Etcd,
        keys: &Keys,
        mut place: Place,
        seen: &Look,
    ) -> Result<Option<Lease>, LockError> {
        if !self
            .honour_lock_delay(client, keys, seen.unreleased, call.deadline)
            .await?
        {
            // Held by us, but not usable before the caller gives up: `place` hands it on
            // as it drops.
            return match call.deadline {
                None => Ok(None),
                Some(_) => Err(call.timed_out()),
            };
        }
        let deleted = self
            .watch_own(client, &place.key, place.revision, place.lease.clone())
            .await?;
        place.queued.settle();
        let token = seen
            .base
            .saturating_add(place.revision.max(0).unsigned_abs());
        self.held().insert(
            place.owner,
            Held {
                key: place.key,
                lease: place.lease,
                deleted,
            },
        );
        // The lease is the real one: the guard must not count on more.
        let lease_ttl = call.ttl.min(self.options.lease_ttl / 2);
        Ok(Some(Lease::new(
            call.key,
            place.owner,
            FencingToken::new(token),
            lease_ttl,
            seen.sent,
        )))
    }

    /// Completes once `key` is deleted at or after revision `from` (one request: the
    /// watch's creation).
    async fn deleted(&self, client: &Etcd, key: Vec<u8>, from: i64) -> Result<(), LockError> {
        let mut stream = self.request(None, client.watch_deletes(key, from)).await?;
        loop {
            match stream.message().await.map_err(failed)? {
                // Deleted; or the watch was cancelled (its start compacted away): the
                // caller looks at the queue again either way.
                Some(answer) if deleted_or_cancelled(&answer) => return Ok(()),
                Some(_) => {}
                None => return Err(LockError::unavailable("etcd ended a watch")),
            }
        }
    }

    /// Watches our lock key: the flag is set the moment it is deleted. A watch that breaks
    /// (etcd restarting, the connection lost) is opened again from the last revision it
    /// reported, so a delete meanwhile is still seen; one that etcd cancels because that
    /// revision was compacted away can no longer tell, and counts as deleted.
    async fn watch_own(
        &self,
        client: &Etcd,
        key: &str,
        created: i64,
        lease: Arc<LeaseHealth>,
    ) -> Result<Arc<AtomicBool>, LockError> {
        let mut from = created + 1;
        let mut stream = self.request(None, client.watch_deletes(key, from)).await?;
        let deleted = Arc::new(AtomicBool::new(false));
        let flag = deleted.clone();
        let closing = self.closing.clone();
        let (client, key, op_timeout) = (client.clone(), key.to_owned(), self.options.op_timeout);
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    message = stream.message() => message,
                    () = closing.cancelled() => return,
                };
                match message {
                    Ok(Some(answer)) => {
                        if deleted_or_cancelled(&answer) {
                            flag.store(true, Ordering::Release);
                            return;
                        }
                        if let Some(header) = answer.header {
                            from = from.max(header.revision + 1);
                        }
                    }
                    // Broken: open it again, until the lease (and the key with it) ends.
                    _ => loop {
                        if lease.ended.load(Ordering::Acquire) {
                            flag.store(true, Ordering::Release);
                            return;
                        }
                        tokio::select! {
                            () = sleep(Duration::from_millis(200)) => {}
                            () = closing.cancelled() => return,
                        }
                        let reopened = client.watch_deletes(key.clone(), from);
                        if let Ok(Ok(reopened)) = tokio::time::timeout(op_timeout, reopened).await {
                            stream = reopened;
                            break;
                        }
                    },
                }
            }
        });
        Ok(deleted)
    }
}

/// One acquire call: what it asked for, and since when it waits.
struct Call<'a> {
    key: &'a str,
    ttl: Duration,
    /// `None`: a try, which never waits.
    deadline: Option<Instant>,
    started: Instant,
}

impl Call<'_> {
    fn timed_out(&self) -> LockError {
        LockError::TimedOut {
            key: self.key.to_owned(),
            waited: self.started.elapsed(),
        }
    }

    /// Once the lock is known to be held, running out of time is a wait that timed out,
    /// not a store that did not answer.
    fn waited_out(&self, error: LockError) -> LockError {
        if self
            .deadline
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            self.timed_out()
        } else {
            error
        }
    }
}

/// Our key in a lock's queue, from its create on.
struct Place {
    owner: OwnerToken,
    /// `<waiters prefix><owner>`.
    key: String,
    /// Its create revision: our place in line and, plus the base, our fencing token.
    revision: i64,
    /// The lease the key is on.
    lease: Arc<LeaseHealth>,
    /// Hands the key to the lease's cleaner unless it is granted.
    queued: Queued,
}

/// A range over `prefix` that returns the oldest key (the holder), and how many there are.
fn holder(prefix: &str) -> RangeRequest {
    RangeRequest::prefix(prefix).by_creation(false).limit(1)
}

/// Deletes a lock key — and with it its lock-delay marker, if given — only while the key
/// is still there.
fn delete_key(key: &str, marker: Option<&str>) -> TxnRequest {
    TxnRequest::new(
        [Compare::exists(key)],
        std::iter::once(key).chain(marker).map(RequestOp::delete),
    )
}

/// Keeps the lease alive: a keep-alive every third of its TTL. An answer with no TTL left
/// means etcd revoked it (expired, or revoked by hand): it ended. An answered one moves
/// `lives_until` on; unanswered ones (etcd unreachable) do not, and are retried on a new
/// stream.
async fn keep_alive(
    client: Etcd,
    lease: Arc<LeaseHealth>,
    ttl: Duration,
    closing: CancellationToken,
) {
    let period = ttl / 3;
    loop {
        // A new stream, and its first keep-alive.
        let sent = Instant::now();
        let opened = tokio::select! {
            opened = timeout_at(Instant::now() + period, client.keep_alive(lease.id)) => opened,
            () = closing.cancelled() => return,
        };
        let mut keeper = match opened {
            Ok(Ok((keeper, Some(ttl)))) if ttl > 0 => {
                lease.confirmed(sent, ttl);
                keeper
            }
            Ok(Ok((_, Some(_)))) => return lease.end(),
            _ => {
                tokio::select! {
                    () = sleep(period / 4) => continue,
                    () = closing.cancelled() => return,
                }
            }
        };
        loop {
            tokio::select! {
                () = sleep(period) => {}
                () = closing.cancelled() => return,
            }
            let sent = Instant::now();
            match timeout_at(Instant::now() + period, keeper.renew()).await {
                Ok(Ok(Some(ttl))) if ttl > 0 => lease.confirmed(sent, ttl),
                Ok(Ok(Some(_))) => return lease.end(),
                // The stream broke or went quiet: open a new one.
                _ => break,
            }
        }
    }
}

/// A key of ours that is not (yet) a held lock: handed to the lease's cleaner when the
/// acquire call ends without a grant — the deadline, an error, a try that found the lock
/// held, or the call dropped — so it never holds up the line.
struct Queued {
    leftovers: mpsc::UnboundedSender<Leftover>,
    leftover: Option<Leftover>,
}

impl Queued {
    /// The create was answered: no tombstone needed.
    fn created(&mut self) {
        if let Some(Leftover::Unanswered { key, .. }) = self.leftover.take() {
            self.leftover = Some(Leftover::Created { key, marker: None });
        }
    }

    /// Granted: the key is a held lock now, not a leftover.
    fn settle(&mut self) {
        self.leftover = None;
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some(leftover) = self.leftover.take() {
            // The cleaner is gone only with its lease, and the key with it.
            let _ = self.leftovers.send(leftover);
        }
    }
}

impl Leftover {
    /// One attempt at the delete; a key already gone counts as deleted.
    async fn remove(&self, client: &Etcd, lease: i64) -> Result<(), tonic::Status> {
        let txn = match self {
            Self::Unanswered { key, tombstone } => TxnRequest::new(
                [],
                [
                    RequestOp::delete(key.clone()),
                    RequestOp::put(tombstone.clone(), "", lease),
                ],
            ),
            Self::Created { key, marker } => delete_key(key, marker.as_deref()),
        };
        client.txn(txn).await?;
        Ok(())
    }
}

/// A lease's cleaner: retries each leftover delete, backing off, until it succeeds or the
/// lease ends (its keys are deleted then anyway); deletes tombstones once they are no
/// longer needed.
async fn clean_up(
    client: Etcd,
    lease: Arc<LeaseHealth>,
    mut leftovers: mpsc::UnboundedReceiver<Leftover>,
    op_timeout: Duration,
    closing: CancellationToken,
) {
    loop {
        let leftover = tokio::select! {
            leftover = leftovers.recv() => leftover,
            () = closing.cancelled() => return,
        };
        let Some(leftover) = leftover else { return };
        let mut pause = Duration::from_millis(100);
        loop {
            if lease.ended.load(Ordering::Acquire) {
                return;
            }
            match tokio::time::timeout(op_timeout, leftover.remove(&client, lease.id)).await {
                Ok(Ok(())) => break,
                failed => {
                    tracing::warn!(
                        ?leftover,
                        ?failed,
                        "could not delete an etcd lock key; retrying"
                    );
                }
            }
            tokio::select! {
                () = sleep(pause) => {}
                () = closing.cancelled() => return,
            }
            pause = (pause * 2).min(Duration::from_secs(2));
        }
        if let Leftover::Unanswered { tombstone, .. } = leftover {
            let client = client.clone();
            let closing = closing.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = sleep(TOMBSTONE_KEPT) => {
                        // Best effort: it goes with the lease otherwise.
                        let _ = tokio::time::timeout(op_timeout, client.delete(tombstone)).await;
                    }
                    () = closing.cancelled() => {}
                }
            });
        }
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    /// Takes the lock, in named steps: [join the queue](Self::join_queue) (our key, and a
    /// look at the line, in one request), [check the cap](Self::check_cap) on waiters,
    /// then — until our key is the oldest — [wait for the key ahead of
    /// ours](Self::wait_for_predecessor) and look again, and [grant](Self::grant). Waits
    /// until the call's deadline, or never when it has none (then `Ok(None)` when the lock
    /// is held).
    async fn acquire(&self, ask: Ask<'_>) -> Result<Option<Lease>, LockError> {
        let Ask {
            key,
            ttl,
            deadline,
            note,
            started,
        } = ask;
        let call = Call {
            key,
            ttl,
            deadline,
            started,
        };
        if deadline.is_some_and(|deadline| call.started >= deadline) {
            // Nothing sent, so nothing to clean up.
            return Err(LockError::TimedOut {
                key: key.to_owned(),
                waited: Duration::ZERO,
            });
        }
        let client = self.client();
        let lease = self.lease(&client, deadline).await?;
        let keys = self.keys(key);
        let (place, mut seen) = self.join_queue(&call, &client, &keys, lease, note).await?;
        if deadline.is_some() {
            self.check_cap(key, &place, &seen)?;
        }
        loop {
            if !seen.ours_kept {
                return Err(LockError::unavailable(
                    "our etcd key vanished while queued (the lease ended)",
                ));
            }
            if seen.holder == Some(place.revision) {
                return self.grant(&call, &client, &keys, place, &seen).await;
            }
            let Some(deadline) = deadline else {
                // Trying, not waiting: `place` leaves the queue as it drops.
                return Ok(None);
            };
            self.wait_for_predecessor(&call, &client, &keys, &place, deadline)
                .await?;
            seen = self
                .look(&client, &keys, &place.key, Some(deadline))
                .await
                .map_err(|error| call.waited_out(error))?;
        }
    }

    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        let keys = self.keys(key);
        let found = self
            .request(None, self.client().range(holder(&keys.waiters)))
            .await?;
        Ok(found
            .kvs
            .first()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(held) = self.held().remove(&lease.owner()) else {
            return Ok(false);
        };
        // A key whose watch fired is deleted (the delete below finds nothing, and says
        // so); only a lease that ended means nothing is left to ask about.
        if held.lease.ended.load(Ordering::Acquire) {
            return Ok(false);
        }
        // With a lock-delay, the key and the marker go together — and only while the key
        // is still there: a holder whose lease was revoked under it did not release, and
        // must not erase the marker that tells its successor so.
        let marker = if self.options.lock_delay.is_zero() {
            None
        } else {
            held.key
                .rsplit_once("/w/")
                .map(|(prefix, _)| format!("{prefix}/held"))
        };
        let txn = delete_key(&held.key, marker.as_deref());
        match self.request(None, self.client().txn(txn)).await {
            // Whether our key (the first delete) was still there.
            Ok(done) => Ok(done.first_deleted().is_some_and(|deleted| deleted > 0)),
            Err(error) => {
                // Not known released: the cleaner deletes it once etcd answers, so it does
                // not hold the key for as long as this process lives.
                let _ = held.lease.leftovers.send(Leftover::Created {
                    key: held.key,
                    marker,
                });
                Err(error)
            }
        }
    }

    async fn extend(&self, lease: &Lease, _ttl: Duration) -> Result<bool, LockError> {
        let held = self.held();
        let Some(held) = held.get(&lease.owner()) else {
            return Ok(false);
        };
        if held.deleted.load(Ordering::Acquire) || held.lease.ended.load(Ordering::Acquire) {
            return Ok(false);
        }
        // Sure only while the lease surely outlives the guard's next lease period.
        if Instant::now() + lease.ttl() > held.lease.lives_until() {
            return Err(LockError::unavailable(
                "etcd did not answer the lease's keep-alive: it may still be alive",
            ));
        }
        Ok(true)
    }

    async fn raise_fencing(
        &self,
        key: &str,
        floor: FencingToken,
    ) -> Result<FencingToken, LockError> {
        let client = self.client();
        let keys = self.keys(key);
        loop {
            let found = self
                .request(None, client.range(RangeRequest::key(keys.base.clone())))
                .await?;
            let revision = found.revision().unwrap_or(0);
            let stored = found.kvs.first();
            let base = parse_base(stored.map(|kv| kv.value.as_slice()));
            // The next key's create revision is above every revision so far.
            let latest = revision.max(0).unsigned_abs();
            if base >= floor.get() {
                return Ok(FencingToken::new(base.saturating_add(latest)));
            }
            let seen = stored.map_or(0, |kv| kv.mod_revision);
            let txn = TxnRequest::new(
                [Compare::changed_at(keys.base.clone(), seen)],
                [RequestOp::put(
                    keys.base.clone(),
                    floor.get().to_string(),
                    0,
                )],
            );
            let written = self.request(None, client.txn(txn)).await?;
            if written.succeeded {
                let revision = written.revision().unwrap_or(0);
                return Ok(FencingToken::new(
                    floor.get().saturating_add(revision.max(0).unsigned_abs()),
                ));
            }
            // Raised by someone else meanwhile: look again.
        }
    }

    async fn ping(&self) -> Result<(), LockError> {
        self.request(None, self.client().status()).await?;
        Ok(())
    }

    fn sessions(&self) -> Sessions {
        Sessions::PerProcess {
            timeout: self.options.lease_ttl,
        }
    }
}
