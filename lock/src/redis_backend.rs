//! Locks in Redis — one server, or a Redis Cluster (`redis_link/`): one script round
//! trip per acquire, release and renewal; waiters sleep until a release hands the lock to
//! them over pub/sub.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use redis::{ErrorKind, FromRedisValue, PushInfo, PushKind, ServerErrorKind, Value};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::backend::{Ask, Lease, LockBackend, LockOptions};
use crate::error::LockError;
use crate::redis_link::{self, Connection, Link};
use crate::token::{FencingToken, OwnerToken};

const HAND_OFF: &str = include_str!("scripts/hand_off.lua");

/// How long one round trip may take unless configured otherwise: Redis answers from
/// memory, so a second is long.
const OP_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest idle time a counter is kept, in milliseconds: 2^52 ms, 142,000 years —
/// forever, as far as anyone can tell, and exact in the scripts' numbers.
const MAX_IDLE_MS: u128 = 1 << 52;

/// A script, called by its SHA; on NOSCRIPT (a restarted server, a replica promoted in a
/// cluster) it is sent whole with EVAL, which also caches it on that node — rather than
/// with SCRIPT LOAD, which a cluster client sends to every node, and which fails while one
/// of them is down.
struct Script {
    code: String,
    sha: String,
}

impl Script {
    fn new(code: String) -> Self {
        let sha = redis::Script::new(&code).get_hash().to_owned();
        Self { code, sha }
    }

    fn command(&self, by: &str, keys: &[String], args: &[&str]) -> redis::Cmd {
        let mut command = redis::cmd(by);
        command
            .arg(if by == "EVAL" { &self.code } else { &self.sha })
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        command
    }

    async fn invoke<T: FromRedisValue>(
        &self,
        connection: &mut Connection,
        keys: &[String],
        args: &[&str],
    ) -> redis::RedisResult<T> {
        match self
            .command("EVALSHA", keys, args)
            .query_async(connection)
            .await
        {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.command("EVAL", keys, args)
                    .query_async(connection)
                    .await
            }
            answer => answer,
        }
    }
}

/// The scripts.
struct Scripts {
    acquire: Script,
    release: Script,
    cancel: Script,
    extend: Script,
    raise_fencing: Script,
}

impl Scripts {
    fn new() -> Self {
        let with_hand_off = |body: &str| Script::new(format!("{HAND_OFF}\n{body}"));
        Self {
            acquire: with_hand_off(include_str!("scripts/acquire.lua")),
            release: with_hand_off(include_str!("scripts/release.lua")),
            cancel: with_hand_off(include_str!("scripts/cancel.lua")),
            extend: Script::new(include_str!("scripts/extend.lua").to_owned()),
            raise_fencing: with_hand_off(include_str!("scripts/raise_fencing.lua")),
        }
    }
}

/// Waiters of this process, by owner token. The connection's push handler completes the
/// one a hand-off message names; a waiter that is gone is simply not found.
#[derive(Default)]
struct Waiters(Mutex<HashMap<OwnerToken, oneshot::Sender<u64>>>);

impl Waiters {
    fn map(&self) -> MutexGuard<'_, HashMap<OwnerToken, oneshot::Sender<u64>>> {
        // Inserts and removes cannot leave the map inconsistent; poisoning carries no news.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Handles a hand-off message, `<owner hex>:<fencing token>`.
    fn deliver(&self, payload: &[u8]) {
        let Some((owner, fence)) = std::str::from_utf8(payload)
            .ok()
            .and_then(|text| text.split_once(':'))
            .and_then(|(owner, fence)| Some((OwnerToken::from_hex(owner)?, fence.parse().ok()?)))
        else {
            tracing::warn!("ignoring a malformed lock hand-off message");
            return;
        };
        if let Some(waiter) = self.map().remove(&owner) {
            let _ = waiter.send(fence);
        }
    }
}

/// A waiter's registration, removed when its acquire call ends however it ends. If the
/// call ends without a grant — its deadline, an error, or its future dropped (a client
/// that went away, an outer timeout) — the cancel script runs in the background, so a
/// queue entry or a hand-off nobody will claim does not hold up the waiters behind for a
/// whole lease.
struct Pending {
    waiters: Arc<Waiters>,
    owner: OwnerToken,
    cleanup: Option<Cleanup>,
}

/// What the cancel script needs.
struct Cleanup {
    link: Link,
    scripts: Arc<Scripts>,
    keys: [String; 4],
    op_timeout: Duration,
    /// The counter's idle time, ms, for a lease the cancel hands on.
    idle_ms: String,
}

impl Cleanup {
    /// Runs the cancel script in the background: leaves the queue and passes on a grant
    /// that raced with giving up (or that a lost reply never told us about). In the
    /// background because the caller must get its answer by its deadline even when Redis
    /// has gone silent; best effort, since an entry left behind expires at its deadline
    /// and a grant nobody claims at its TTL.
    fn spawn(self, owner: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let cancel = async {
                let mut connection = self.link.connect().await?;
                self.scripts
                    .cancel
                    .invoke::<i64>(&mut connection, &self.keys, &[&owner, &self.idle_ms])
                    .await
            };
            let cancelled = timeout_at(Instant::now() + self.op_timeout, cancel).await;
            if !matches!(cancelled, Ok(Ok(_))) {
                tracing::debug!("could not cancel an abandoned wait; its entry expires by itself");
            }
        });
    }
}

/// A waiting acquire: where the hand-off message arrives, and its registration.
struct Waiter {
    granted: oneshot::Receiver<u64>,
    pending: Pending,
}

impl Pending {
    /// The call was granted the lock: nothing to undo.
    fn settle(&mut self) {
        self.cleanup = None;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.waiters.map().remove(&self.owner);
        if let Some(cleanup) = self.cleanup.take() {
            cleanup.spawn(self.owner.to_hex());
        }
    }
}

/// What one acquire attempt answered.
enum Attempt {
    Granted(FencingToken),
    /// Held by another; we are queued if we wait. Carries how long the current lease has
    /// left.
    Held(Duration),
    /// Held, and the queue is full: not queued.
    QueueFull,
}

/// Locks in one Redis server or a Redis Cluster. See the crate docs for the protocol.
pub struct RedisBackend {
    /// Multiplexed connections (RESP3), reconnected on failure; they carry both commands
    /// and this process's wake-up subscriptions.
    link: Link,
    /// Shared with the background clean-ups of abandoned waits.
    scripts: Arc<Scripts>,
    namespace: String,
    /// Names this process's wake-up channels, which releases publish to when they hand a
    /// lock to one of our waiters: `<namespace>:wake:<client id>` on one server; in a
    /// cluster one sharded channel per slot, `<namespace>:wake:{<slot tag>}:<client id>`.
    client_id: String,
    waiters: Arc<Waiters>,
    /// One server: set once the wake-up subscription is confirmed; cleared when the
    /// connection drops (the connection manager resubscribes on reconnect, and the next
    /// waiter makes sure).
    subscribed: Arc<AtomicBool>,
    /// A cluster: the slots whose wake-up channel this process has subscribed to. Never
    /// unsubscribed by us, so a waiter never races an unsubscribe; at most one per slot.
    /// Cleared when a connection drops or the server ends a subscription (a slot moved or
    /// failed over): the cluster client's own resubscription sends one node's channels in
    /// one SSUBSCRIBE, which a node refuses when they span slots, and forgets a channel
    /// the server unsubscribed — so waiters subscribe again themselves, one channel each.
    subscribed_slots: Arc<Mutex<HashSet<u16>>>,
    /// Serialises subscribing so concurrent waiters send one SUBSCRIBE per channel.
    subscribing: tokio::sync::Mutex<()>,
    op_timeout: Duration,
    max_waiters: usize,
    /// Added to every lease on the server (see [`LockOptions::lock_delay`]), never to
    /// the lease the holder is told of.
    lock_delay: Duration,
    /// How long a counter outlives its last lease, ms (see [`LockOptions::idle`]).
    idle_ms: String,
    /// Round trips sent, for benchmarks and tests.
    round_trips: AtomicU64,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("namespace", &self.namespace)
            .field("cluster", &self.link.sharded())
            .field("op_timeout", &self.op_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// A backend for the Redis at `url`: one server (`redis://host:port/db`), a Redis
    /// Cluster (`redis-cluster://host:port[,host:port…]`, any of its nodes), or the master
    /// Redis Sentinel names (`redis-sentinel://host:port[,host:port…]/<master name>`, the
    /// sentinels). Connects lazily; must be called inside a Tokio runtime.
    pub fn open(url: &str, options: &LockOptions) -> Result<Self, LockError> {
        let op_timeout = options.op_timeout_or(OP_TIMEOUT);
        if options.namespace.is_empty() || options.namespace.contains(['|', '{', '}']) {
            // '|' separates queue-entry fields; braces would break the keys' hash tags.
            return Err(LockError::Invalid(format!(
                "namespace {:?} must be non-empty without '|', '{{' or '}}'",
                options.namespace
            )));
        }
        let waiters = Arc::new(Waiters::default());
        let subscribed = Arc::new(AtomicBool::new(false));
        let subscribed_slots = Arc::new(Mutex::new(HashSet::new()));
        let on_push = push_handler(
            Arc::clone(&waiters),
            Arc::clone(&subscribed),
            Arc::clone(&subscribed_slots),
        );
        let link = Link::open(url, op_timeout, on_push, &subscribed)?;
        Ok(Self {
            link,
            scripts: Arc::new(Scripts::new()),
            client_id: OwnerToken::random().to_hex(),
            namespace: options.namespace.clone(),
            waiters,
            subscribed,
            subscribed_slots,
            subscribing: tokio::sync::Mutex::new(()),
            op_timeout,
            max_waiters: options.max_waiters.max(1),
            lock_delay: options.lock_delay,
            idle_ms: millis(options.idle).min(MAX_IDLE_MS).to_string(),
            round_trips: AtomicU64::new(0),
        })
    }

    /// Round trips sent so far (a retried NOSCRIPT counts once).
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// The lock key, fencing counter, queue and waiters of `key`.
    fn keys(&self, key: &str) -> [String; 4] {
        let ns = &self.namespace;
        [
            format!("{ns}:lock:{{{key}}}"),
            format!("{ns}:fence:{{{key}}}"),
            format!("{ns}:waiting:{{{key}}}"),
            format!("{ns}:waiter:{{{key}}}"),
        ]
    }

    /// Bounds one round trip by the op timeout and by `deadline`.
    async fn round_trip<T>(
        &self,
        deadline: Option<Instant>,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LockError> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let op_limit = Instant::now() + self.op_timeout;
        let limit = deadline.map_or(op_limit, |deadline| deadline.min(op_limit));
        match timeout_at(limit, call).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => {
                self.link.failed();
                Err(LockError::from(error))
            }
            Err(_) if limit < op_limit => Err(LockError::unavailable(
                "Redis did not answer before the caller's deadline",
            )),
            Err(_) => {
                self.link.failed();
                Err(LockError::unavailable(format!(
                    "Redis did not answer within {:?}",
                    self.op_timeout
                )))
            }
        }
    }

    async fn script<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[&str],
        deadline: Option<Instant>,
    ) -> Result<T, LockError> {
        self.round_trip(deadline, async {
            let mut connection = self.link.connect().await?;
            script.invoke(&mut connection, keys, args).await
        })
        .await
    }

    /// The channel a release publishes to when it hands the lock `lock_key` to one of our
    /// waiters: on one server this process's channel; in a cluster this process's sharded
    /// channel of the lock's slot, which a script running on that slot may publish to.
    fn wake_channel(&self, lock_key: &str) -> String {
        let (ns, client) = (&self.namespace, &self.client_id);
        if self.link.sharded() {
            let tag = redis_link::slot_tag(redis_link::slot(lock_key));
            format!("{ns}:wake:{{{tag}}}:{client}")
        } else {
            format!("{ns}:wake:{client}")
        }
    }

    /// Whether this process already listens on the wake-up channel of `lock_key`.
    fn subscribed_to(&self, lock_key: &str) -> bool {
        if self.link.sharded() {
            let slots = self
                .subscribed_slots
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            slots.contains(&redis_link::slot(lock_key))
        } else {
            self.subscribed.load(Ordering::Acquire)
        }
    }

    /// Makes sure hand-off messages for our waiters on `lock_key` reach us before any of
    /// them queues: a waiter that queued before the subscription could miss its wake-up.
    async fn ensure_subscribed(&self, lock_key: &str, deadline: Instant) -> Result<(), LockError> {
        if self.subscribed_to(lock_key) {
            return Ok(());
        }
        let Ok(_single) = timeout_at(deadline, self.subscribing.lock()).await else {
            return Err(LockError::unavailable(
                "Redis did not confirm the wake-up subscription in time",
            ));
        };
        if self.subscribed_to(lock_key) {
            return Ok(());
        }
        let channel = self.wake_channel(lock_key);
        self.round_trip(Some(deadline), async {
            self.link.connect().await?.subscribe(&channel).await
        })
        .await?;
        if self.link.sharded() {
            self.subscribed_slots
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .insert(redis_link::slot(lock_key));
        } else {
            self.subscribed.store(true, Ordering::Release);
        }
        Ok(())
    }

    async fn attempt(
        &self,
        keys: &[String; 4],
        owner: &str,
        (ttl, wait): (Duration, Duration),
        note: &str,
        deadline: Option<Instant>,
    ) -> Result<Attempt, LockError> {
        let ttl_ms = millis(ttl + self.lock_delay).to_string();
        let wait_ms = millis(wait).to_string();
        let max_waiters = self.max_waiters.to_string();
        let channel = self.wake_channel(&keys[0]);
        let (status, value): (i64, i64) = self
            .script(
                &self.scripts.acquire,
                keys,
                &[
                    owner,
                    &ttl_ms,
                    &wait_ms,
                    &channel,
                    note,
                    &max_waiters,
                    &self.idle_ms,
                ],
                deadline,
            )
            .await?;
        Ok(match status {
            1 => Attempt::Granted(FencingToken::new(value.max(0).unsigned_abs())),
            -1 => Attempt::QueueFull,
            // PTTL answers -1 for a key without expiry (someone set it by hand): wait a
            // lease length before looking again rather than spin.
            _ => Attempt::Held(
                u64::try_from(value)
                    .ok()
                    .filter(|&ms| ms > 0)
                    .map_or(ttl, Duration::from_millis),
            ),
        })
    }

    /// A lease handed to us over pub/sub counts from our last attempt, the latest moment we
    /// know to precede the grant. After a long wait that would leave the watchdog little
    /// or none of the lease (a waiter with a shorter TTL than the holder it queued behind
    /// would be "lost" at once), so renew it first and count from the renewal. On an error
    /// the caller's [`Pending`] hands the lock on as it drops.
    async fn fresh_lease(&self, lease: Lease) -> Result<Lease, LockError> {
        let ttl = lease.ttl();
        if lease.acquired_at().elapsed() < ttl / 3 {
            return Ok(lease);
        }
        let sent_at = Instant::now();
        if self.extend(&lease, ttl).await? {
            Ok(Lease::new(
                lease.key(),
                lease.owner(),
                lease.fencing_token(),
                ttl,
                sent_at,
            ))
        } else {
            Err(LockError::unavailable(
                "a lock handed to us was gone before we could renew it (Redis lost data?)",
            ))
        }
    }

    /// What [`Cleanup::spawn`] needs to undo an attempt whose answer we did not act on.
    fn cleanup(&self, keys: &[String; 4]) -> Cleanup {
        Cleanup {
            link: self.link.clone(),
            scripts: Arc::clone(&self.scripts),
            keys: keys.clone(),
            op_timeout: self.op_timeout,
            idle_ms: self.idle_ms.clone(),
        }
    }
}

/// What a connection does with a push: hands a hand-off message to its waiter; on a
/// disconnection or an ended subscription, forgets what was subscribed, so the next waiter
/// subscribes again.
fn push_handler(
    waiters: Arc<Waiters>,
    subscribed: Arc<AtomicBool>,
    subscribed_slots: Arc<Mutex<HashSet<u16>>>,
) -> impl Fn(PushInfo) -> Result<(), std::convert::Infallible> + Clone + Send + Sync + 'static {
    move |push: PushInfo| {
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let [_channel, Value::BulkString(payload)] = push.data.as_slice() {
                    waiters.deliver(payload);
                }
            }
            PushKind::Disconnection | PushKind::SUnsubscribe => {
                subscribed.store(false, Ordering::Release);
                subscribed_slots
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .clear();
            }
            _ => {}
        }
        Ok(())
    }
}

/// Whole milliseconds, rounded up so a short wait is not truncated to "don't wait".
fn millis(duration: Duration) -> u128 {
    duration.as_nanos().div_ceil(1_000_000)
}

impl RedisBackend {
    /// Takes the lock if it is free and nobody is queued for it: one script round trip.
    async fn take_if_free(
        &self,
        key: &str,
        ttl: Duration,
        note: &str,
    ) -> Result<Option<Lease>, LockError> {
        let keys = self.keys(key);
        let owner = OwnerToken::random();
        let owner_hex = owner.to_hex();
        let sent_at = Instant::now();
        match self
            .attempt(&keys, &owner_hex, (ttl, Duration::ZERO), note, None)
            .await
        {
            Ok(Attempt::Granted(fence)) => Ok(Some(Lease::new(key, owner, fence, ttl, sent_at))),
            Ok(Attempt::Held(_) | Attempt::QueueFull) => Ok(None),
            Err(error) => {
                // The script may have run and granted us a lock we will never use.
                self.cleanup(&keys).spawn(owner_hex);
                Err(error)
            }
        }
    }

    /// Takes the lock, waiting in the server's queue until `deadline`: each attempt takes
    /// the lock or joins the queue in one script; between attempts we sleep until the
    /// hand-off message, or until the lease we saw runs out.
    async fn wait_in_line(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
        note: &str,
    ) -> Result<Lease, LockError> {
        let started = Instant::now();
        let keys = self.keys(key);
        let owner = OwnerToken::random();
        self.ensure_subscribed(&keys[0], deadline).await?;
        let mut waiter = self.register(owner, &keys);
        let timed_out = || LockError::TimedOut {
            key: key.to_owned(),
            waited: started.elapsed(),
        };
        // Whether Redis has told us the lock is held: only then is running out of time a
        // wait that timed out rather than a lock store that did not answer.
        let mut seen_held = false;
        loop {
            let sent_at = Instant::now();
            if sent_at >= deadline {
                // `waiter` cancels our queue entry as it drops.
                return Err(timed_out());
            }
            let attempt = self
                .attempt_in_line(&keys, owner, (ttl, deadline), sent_at, note)
                .await
                .map_err(|error| {
                    // The script may have run — queued us, or granted us the lock — before
                    // the answer was lost or cut off at the deadline: `waiter` undoes that
                    // as it drops, in the background, so we answer by the deadline.
                    if seen_held && Instant::now() >= deadline {
                        timed_out()
                    } else {
                        error
                    }
                })?;
            let remaining = match attempt {
                Attempt::Granted(fence) => {
                    waiter.pending.settle();
                    return Ok(Lease::new(key, owner, fence, ttl, sent_at));
                }
                Attempt::Held(remaining) => {
                    seen_held = true;
                    remaining
                }
                Attempt::QueueFull => {
                    // Not queued: nothing to undo.
                    waiter.pending.settle();
                    return Err(LockError::QueueFull {
                        key: key.to_owned(),
                        max_waiters: self.max_waiters,
                    });
                }
            };
            // Woken by the hand-off, or when the lease we saw runs out (a holder that
            // vanished never releases), whichever is first.
            let look_again = (Instant::now() + remaining + Duration::from_millis(1)).min(deadline);
            if let Some(fence) = self.handed_over(&mut waiter, look_again).await {
                // The grant came after our last attempt was sent, which is all we know of
                // when: the lease may be partly spent by now.
                let lease = Lease::new(key, owner, FencingToken::new(fence), ttl, sent_at);
                let lease = self.fresh_lease(lease).await?;
                waiter.pending.settle();
                return Ok(lease);
            }
        }
    }

    /// Registers a waiter for the hand-off message — before the first attempt: the
    /// message may overtake the attempt's own reply.
    fn register(&self, owner: OwnerToken, keys: &[String; 4]) -> Waiter {
        let (grant, granted) = oneshot::channel();
        self.waiters.map().insert(owner, grant);
        Waiter {
            granted,
            pending: Pending {
                waiters: Arc::clone(&self.waiters),
                owner,
                cleanup: Some(self.cleanup(keys)),
            },
        }
    }

    /// One attempt of a waiter: takes the lock, or joins (or keeps its place in) the
    /// queue until `deadline` (its entry says it waits that long from `sent_at`).
    /// Subscribes first, again each time: a reconnect or a failover may have ended the
    /// subscription since the last attempt.
    async fn attempt_in_line(
        &self,
        keys: &[String; 4],
        owner: OwnerToken,
        (ttl, deadline): (Duration, Instant),
        sent_at: Instant,
        note: &str,
    ) -> Result<Attempt, LockError> {
        self.ensure_subscribed(&keys[0], deadline).await?;
        let wait = deadline - sent_at;
        self.attempt(keys, &owner.to_hex(), (ttl, wait), note, Some(deadline))
            .await
    }

    /// The fencing token of a hand-off to `waiter`, or `None` once `look_again` comes
    /// first.
    async fn handed_over(&self, waiter: &mut Waiter, look_again: Instant) -> Option<u64> {
        tokio::select! {
            biased;
            fence = &mut waiter.granted => {
                if let Ok(fence) = fence {
                    return Some(fence);
                }
                // Our registration vanished, which only this call removes: look again.
                let (grant, fresh) = oneshot::channel();
                self.waiters.map().insert(waiter.pending.owner, grant);
                waiter.granted = fresh;
                None
            }
            () = sleep_until(look_again) => None,
        }
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    async fn acquire(&self, ask: Ask<'_>) -> Result<Option<Lease>, LockError> {
        match ask.deadline {
            None => self.take_if_free(ask.key, ask.ttl, ask.note).await,
            Some(deadline) => self
                .wait_in_line(ask.key, ask.ttl, deadline, ask.note)
                .await
                .map(Some),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let keys = self.keys(lease.key());
        let held: i64 = self
            .script(
                &self.scripts.release,
                &keys,
                &[&lease.owner().to_hex(), &self.idle_ms],
                None,
            )
            .await?;
        Ok(held == 1)
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<bool, LockError> {
        let [lock_key, fence_key, ..] = self.keys(lease.key());
        let ttl_ms = millis(ttl + self.lock_delay).to_string();
        let extended: i64 = self
            .script(
                &self.scripts.extend,
                &[lock_key, fence_key],
                &[&lease.owner().to_hex(), &ttl_ms, &self.idle_ms],
                None,
            )
            .await?;
        Ok(extended == 1)
    }

    async fn raise_fencing(
        &self,
        key: &str,
        floor: FencingToken,
    ) -> Result<FencingToken, LockError> {
        let [_, fence_key, _, _] = self.keys(key);
        let counter: i64 = self
            .script(
                &self.scripts.raise_fencing,
                &[fence_key],
                &[&floor.get().to_string(), &self.idle_ms],
                None,
            )
            .await?;
        Ok(FencingToken::new(counter.max(0).unsigned_abs()))
    }

    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        let [lock_key, ..] = self.keys(key);
        let value: Option<String> = self
            .round_trip(None, async {
                let mut connection = self.link.connect().await?;
                redis::cmd("GET")
                    .arg(&lock_key)
                    .query_async(&mut connection)
                    .await
            })
            .await?;
        // "<owner>:<fence>:<note>": the note is everything after the second colon.
        Ok(value.and_then(|value| value.splitn(3, ':').nth(2).map(str::to_owned)))
    }

    async fn ping(&self) -> Result<(), LockError> {
        let _: String = self
            .round_trip(None, async {
                let mut connection = self.link.connect().await?;
                redis::cmd("PING").query_async(&mut connection).await
            })
            .await?;
        Ok(())
    }
}
