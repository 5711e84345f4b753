//! Locks in Hazelcast's CP Subsystem: each key is a `FencedLock` — linearizable (every
//! step a Raft commit in a CP group of three members), fair (waiters are queued on the
//! group and handed the lock in arrival order), with a fence that only grows — spoken to
//! through payonce's own client of Hazelcast's open client protocol (`frame.rs`: the
//! message framing; `codec.rs`: the messages; `client.rs`: the connection). No maintained
//! Rust client of Hazelcast exists (crates.io has `hazelcast_rest` 0.1.0, of 2016, for
//! the REST API's queues and maps only).
//!
//! - **The session is the lease.** A FencedLock is held by a *CP session* (one per
//!   process per CP group, created on first use) and a thread of it; payonce gives every
//!   grant a thread of its own, so two acquires of one process queue like any others. The
//!   process heartbeats its session at the interval the group asks for; the group ends a
//!   session that went without a heartbeat for its time to live (the members' setting
//!   `session-time-to-live-seconds`) and frees its locks — a crashed, paused or cut-off
//!   holder loses its locks then. `extend` asks no member: it reports what the process
//!   knows — the grant is unreleased and its session provably alive (a heartbeat the group
//!   acknowledged within the time to live); once the group answered that the session
//!   expired, `extend` answers false and the guard's `lost` fires.
//! - **Fencing token**: the key's FencedLock fence (the Raft index of the grant: it grows
//!   with every grant of every lock of the group) plus the *epoch* of the namespace, a CP
//!   `AtomicLong`. The epoch is set once, at the first grant, to the clock in microseconds
//!   less that grant's fence, so tokens read like the clock — the group commits far fewer
//!   than a million entries a second, so they stay below it. Community Edition keeps CP
//!   state in memory only: when every member restarts, locks, fences and epoch are gone,
//!   and the next first grant sets the epoch from the clock again, above every token
//!   handed out before (unless the clock stepped back). `raise_fencing` lifts the epoch
//!   (for every key of the namespace: tokens only grow). Each grant reads the epoch after
//!   the lock is granted, so a raise by any process is seen by every later grant.
//! - **The holder's record**: a CP `AtomicReference` per key holding the holder's fence
//!   and note, written by the grant (`set`, returning the record it replaced) when there is
//!   a note to keep or a lock-delay to honour. `holder_note` reads the lock's owner and the
//!   record: the note is the holder's only when the fences match.
//! - **Lock-delay** (when set): a release clears the record (compare-and-set) before the
//!   unlock. A grant that replaces a record still there knows its predecessor's session
//!   ended without a release, and waits the delay before using the lock (holding it
//!   meanwhile); a `try_acquire` then puts the record back, unlocks, and answers that the
//!   lock is taken.
//! - Per grant: the `tryLock`, then the epoch read and (with a note or a delay) the record
//!   write side by side — two round trips; a release is one (two with a delay).
//! - **Nothing left behind.** The grant runs in a task of its own: a caller that gives up
//!   early (its future dropped) does not stop it, and a grant nobody waits for any more is
//!   released at once. A `tryLock` or an `unlock` whose answer never came (the connection
//!   broke) leaves the lock in an unknown state: a cleaner task unlocks that session and
//!   thread until the member says it holds nothing, past the wait's deadline (after which
//!   no grant can come), or the session ended.
//! - **Not bounded here**: a CP object, once destroyed, can never be created again under
//!   its name, so nothing is pruned — every key ever locked keeps its FencedLock (and its
//!   record) in the CP group's memory. Waiters are capped per process only: the group
//!   does not say how many wait.

mod client;
mod codec;
mod frame;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use self::client::{CallError, Client};
use self::codec::{Endpoint, RaftGroupId, error_code};
use crate::backend::{Ask, DEFAULT_OP_TIMEOUT, Lease, LockBackend, LockOptions, Sessions};
use crate::error::LockError;
use crate::token::{FencingToken, OwnerToken};

/// The CP group locks live in unless the URL names one.
const DEFAULT_GROUP: &str = "default";

/// The cluster name a member takes unless configured otherwise (Hazelcast's own default).
const DEFAULT_CLUSTER: &str = "dev";

/// How long the CP group's lookup, and the creation of a session in it, may take: the
/// first use of a group creates its Raft group (a commit in the metadata group), and the
/// new group answers nothing until it has elected a leader — 2.7 s on a freshly started
/// local cluster, longer on a loaded machine. Once per process and session; a cluster that
/// is down still fails at once (no connection).
const GROUP_START_TIMEOUT: Duration = Duration::from_secs(20);

/// How often the cleaner tries again an unlock whose outcome is unknown.
const CLEANUP_EVERY: Duration = Duration::from_millis(250);

/// Locks in Hazelcast's CP Subsystem. See the module docs.
pub struct HazelcastBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Arc<Client>,
    /// The CP group's name, from the URL's path.
    group_name: String,
    options: LockOptions,
    op_timeout: Duration,
    /// The group's id, with the cluster generation it was looked up in.
    group: tokio::sync::Mutex<Option<(u64, RaftGroupId)>>,
    /// The CP session every lock of this process rides on; replaced once it ends.
    session: tokio::sync::Mutex<Option<Arc<CpSession>>>,
    /// The session time to live the group granted, in milliseconds (the one configured
    /// before any session).
    granted_ttl_ms: AtomicU64,
    /// Locks held now, by owner token.
    held: Mutex<HashMap<OwnerToken, Held>>,
    /// Thread ids for grants: each grant is a thread of its own.
    next_thread: AtomicI64,
    closing: CancellationToken,
}

impl fmt::Debug for HazelcastBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HazelcastBackend")
            .field("group", &self.inner.group_name)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl Drop for HazelcastBackend {
    fn drop(&mut self) {
        // Closing the session frees its locks at once, as a process that shuts down
        // cleanly should; the heartbeats stop either way.
        let inner = self.inner.clone();
        inner.closing.cancel();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { inner.close_session().await });
        }
    }
}

/// One CP session of this process.
struct CpSession {
    group: RaftGroupId,
    id: i64,
    ttl: Duration,
    /// The cluster generation it was created in.
    generation: u64,
    /// Until when it provably lives: the sending of the last request the group
    /// acknowledged for it (create or heartbeat), plus its time to live.
    alive_until: Mutex<Instant>,
    /// The group said it expired, or it was closed: its locks are gone for good.
    ended: AtomicBool,
    /// Stops its heartbeats.
    stop: CancellationToken,
}

impl CpSession {
    fn ended(&self, client: &Client) -> bool {
        self.ended.load(Ordering::Acquire) || client.generation() != self.generation
    }

    fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.stop.cancel();
    }

    fn alive_until(&self) -> Instant {
        *self
            .alive_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn acknowledged(&self, sent_at: Instant) {
        let mut until = self
            .alive_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *until = (*until).max(sent_at + self.ttl);
    }
}

/// A lock this process holds.
struct Held {
    session: Arc<CpSession>,
    name: String,
    holder: Endpoint,
    /// The record the grant wrote, which a release clears when there is a lock-delay.
    record: Option<Vec<u8>>,
}

/// A lock whose state is unknown after a request that went unanswered, for the cleaner.
struct Leftover {
    session: Arc<CpSession>,
    name: String,
    holder: Endpoint,
    /// Before this, a `tryLock` may still grant it (the wait's deadline, plus time for the
    /// answer): "not held" is final only after it.
    settled_after: Instant,
}

/// What came of one `tryLock`.
enum Granted {
    Lease(Lease),
    /// Not granted within the wait (or, for a try, held by another).
    No,
    /// The session had ended: ask again with a new one.
    SessionEnded,
}

impl HazelcastBackend {
    /// Opens `hazelcast://host:port[,host:port…][/<cp-group>][?cluster=<name>]`: the
    /// members to connect to (one at a time, the next when one fails), the CP group the
    /// locks live in (`default`), and the cluster's name (`dev`, Hazelcast's default).
    /// Lock names are `<namespace>/<key>`. Connects on first use.
    pub fn open(url: &str, options: &LockOptions) -> Result<Self, LockError> {
        let invalid = |why: &str| LockError::Invalid(format!("bad Hazelcast URL {url:?}: {why}"));
        let rest = url
            .strip_prefix("hazelcast://")
            .ok_or_else(|| invalid("it starts with hazelcast://"))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (hosts, group) = rest.split_once('/').unwrap_or((rest, ""));
        let group = if group.is_empty() {
            DEFAULT_GROUP
        } else {
            group
        };
        if group.contains(['/', '@']) || group.len() > 64 {
            return Err(invalid("the CP group is one name, without '/' or '@'"));
        }
        let members: Vec<String> = hosts.split(',').map(str::to_owned).collect();
        if members.iter().any(|member| {
            member
                .rsplit_once(':')
                .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
        }) {
            return Err(invalid("each member is host:port"));
        }
        let mut cluster = DEFAULT_CLUSTER.to_owned();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            match pair.split_once('=') {
                Some(("cluster", name)) if !name.is_empty() => cluster = name.to_owned(),
                _ => return Err(invalid("the one parameter is cluster=<name>")),
            }
        }
        let op_timeout = options.op_timeout_or(DEFAULT_OP_TIMEOUT);
        Ok(Self {
            inner: Arc::new(Inner {
                client: Arc::new(Client::new(members, cluster, op_timeout)),
                group_name: group.to_owned(),
                options: options.clone(),
                op_timeout,
                group: tokio::sync::Mutex::new(None),
                session: tokio::sync::Mutex::new(None),
                granted_ttl_ms: AtomicU64::new(
                    u64::try_from(options.session.as_millis()).unwrap_or(u64::MAX),
                ),
                held: Mutex::new(HashMap::new()),
                next_thread: AtomicI64::new(1),
                closing: CancellationToken::new(),
            }),
        })
    }

    /// Requests sent so far.
    pub fn requests(&self) -> u64 {
        self.inner.client.requests()
    }

    /// The current CP session's id, `None` before the first use or once it ended.
    pub async fn session_id(&self) -> Option<i64> {
        let slot = self.inner.session.lock().await;
        slot.as_ref()
            .filter(|session| !session.ended(&self.inner.client))
            .map(|session| session.id)
    }

    /// Stops heartbeating without closing the session, and keeps this backend from
    /// closing it when dropped: as a process that died, for tests of what the group
    /// does with a holder that vanished.
    #[cfg(feature = "test-support")]
    pub async fn vanish(&self) {
        if let Some(session) = self.inner.session.lock().await.take() {
            session.stop.cancel();
        }
    }
}

impl Inner {
    fn name(&self, key: &str) -> String {
        format!("{}/{key}", self.options.namespace)
    }

    fn unavailable(&self, error: &CallError) -> LockError {
        LockError::unavailable(format!("Hazelcast: {error}"))
    }

    /// Sends `request`, and once more on a new connection if the connection broke before
    /// the answer. Every request here may be sent twice: the CP Subsystem answers a
    /// `tryLock` or `unlock` sent again with the same invocation id as it answered the
    /// first (it keeps the id), and the rest are reads, heartbeats, or compare-and-sets
    /// whose callers read again when they fail.
    async fn call(&self, request: &frame::Request) -> Result<frame::Message, CallError> {
        self.call_within(request, self.op_timeout).await
    }

    /// [`Self::call`] with a limit of its own.
    async fn call_within(
        &self,
        request: &frame::Request,
        limit: Duration,
    ) -> Result<frame::Message, CallError> {
        match self.client.call(request, limit).await {
            Err(CallError::Broken(reason)) => {
                tracing::debug!(%reason, "Hazelcast connection broke: sending again");
                self.client.call(request, limit).await
            }
            answered => answered,
        }
    }

    /// The CP group's id, looked up once per cluster.
    async fn group(&self) -> Result<RaftGroupId, LockError> {
        let mut slot = self.group.lock().await;
        let generation = self.client.generation();
        if let Some((seen_in, group)) = slot.as_ref()
            && *seen_in == generation
        {
            return Ok(group.clone());
        }
        let answer = self
            .client
            .call(
                &codec::create_cp_group(&self.group_name),
                self.op_timeout.max(GROUP_START_TIMEOUT),
            )
            .await
            .map_err(|error| self.unavailable(&error))?;
        let group = codec::group_id(&answer).map_err(LockError::unavailable)?;
        // The lookup may have connected to a new cluster: note the generation after it.
        *slot = Some((self.client.generation(), group.clone()));
        Ok(group)
    }

    /// The current session, or a new one.
    async fn session(self: &Arc<Self>) -> Result<Arc<CpSession>, LockError> {
        let mut slot = self.session.lock().await;
        if let Some(session) = slot.as_ref()
            && !session.ended(&self.client)
        {
            return Ok(session.clone());
        }
        if let Some(old) = slot.take() {
            old.end();
        }
        let group = self.group().await?;
        let sent_at = Instant::now();
        // Its first session may find the group still electing its first leader.
        let answer = self
            .call_within(
                &codec::create_session(&group, self.client.name()),
                self.op_timeout.max(GROUP_START_TIMEOUT),
            )
            .await
            .map_err(|error| self.unavailable(&error))?;
        let grant = codec::session_granted(&answer).map_err(LockError::unavailable)?;
        let ttl = Duration::from_millis(grant.ttl_millis.max(1).unsigned_abs());
        self.granted_ttl_ms
            .store(grant.ttl_millis.max(1).unsigned_abs(), Ordering::Relaxed);
        let session = Arc::new(CpSession {
            group,
            id: grant.id,
            ttl,
            generation: self.client.generation(),
            alive_until: Mutex::new(sent_at + ttl),
            ended: AtomicBool::new(false),
            stop: self.closing.child_token(),
        });
        let heartbeat = Duration::from_millis(grant.heartbeat_millis.max(100).unsigned_abs());
        tokio::spawn(heartbeat_session(
            Arc::downgrade(self),
            session.clone(),
            heartbeat,
        ));
        *slot = Some(session.clone());
        Ok(session)
    }

    async fn close_session(&self) {
        let Some(session) = self.session.lock().await.take() else {
            return;
        };
        session.end();
        let _ = self
            .call(&codec::close_session(&session.group, session.id))
            .await;
    }

    /// One `tryLock` of `name` for a thread of `session`, waiting up to the ask's
    /// deadline, and what the grant needs after it.
    async fn try_lock(
        self: &Arc<Self>,
        session: &Arc<CpSession>,
        ask: &OwnedAsk,
    ) -> Result<Granted, LockError> {
        let name = self.name(&ask.key);
        let holder = Endpoint {
            session: session.id,
            thread: self.next_thread.fetch_add(1, Ordering::Relaxed),
        };
        let wait = ask.deadline.map_or(Duration::ZERO, |deadline| {
            deadline.saturating_duration_since(Instant::now())
        });
        let asked_at = Instant::now();
        let settled_after = asked_at + wait + self.op_timeout;
        let invocation = random_uuid();
        // Sent again, with the same invocation id, while the connection breaks before the
        // answer: the group answers a repeat as it answered (or will answer) the first.
        let answer = loop {
            let left = ask.deadline.map_or(Duration::ZERO, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            let request = codec::try_lock(
                &session.group,
                &name,
                holder,
                invocation,
                i64::try_from(left.as_millis()).unwrap_or(i64::MAX),
            );
            match self.client.call(&request, left + self.op_timeout).await {
                Err(CallError::Broken(_)) if Instant::now() < settled_after => {
                    sleep(CLEANUP_EVERY).await;
                }
                answered => break answered,
            }
        };
        let fence = match answer.and_then(|answer| Ok(codec::long_answer(&answer)?)) {
            Ok(fence) if fence > 0 => fence,
            Ok(_) => return Ok(Granted::No),
            Err(error) if error.code() == Some(error_code::SESSION_EXPIRED) => {
                session.end();
                return Ok(Granted::SessionEnded);
            }
            Err(error) if error.code() == Some(error_code::WAIT_KEY_CANCELLED) => {
                return Ok(Granted::No);
            }
            Err(error) => {
                // Whether the group granted it is unknown: clean up after it.
                self.leave_behind(Leftover {
                    session: session.clone(),
                    name,
                    holder,
                    settled_after,
                });
                return Err(self.unavailable(&error));
            }
        };
        let held = Held {
            session: session.clone(),
            name,
            holder,
            record: None,
        };
        match self.after_grant(held, fence, ask, asked_at).await {
            Ok(lease) => Ok(lease.map_or(Granted::No, Granted::Lease)),
            Err(error) => Err(error),
        }
    }

    /// What follows a grant: the epoch, the record (note, lock-delay), the lease.
    async fn after_grant(
        self: &Arc<Self>,
        mut held: Held,
        fence: i64,
        ask: &OwnedAsk,
        asked_at: Instant,
    ) -> Result<Option<Lease>, LockError> {
        let group = held.session.group.clone();
        let delay = self.options.lock_delay;
        let record = (!ask.note.is_empty() || !delay.is_zero()).then(|| record(fence, &ask.note));
        let write_record = async {
            match &record {
                None => Ok(None),
                Some(bytes) => {
                    let answer = self
                        .call(&codec::atomic_ref_get_and_set(
                            &group,
                            &held.name,
                            Some(bytes),
                        ))
                        .await?;
                    Ok(codec::data_answer(&answer)?)
                }
            }
        };
        let (epoch, replaced) = tokio::join!(self.epoch(&group, fence), write_record);
        let replaced: Result<Option<Vec<u8>>, CallError> = replaced;
        let (epoch, replaced) = match (epoch, replaced) {
            (Ok(epoch), Ok(replaced)) => (epoch, replaced),
            (Err(error), _) | (_, Err(error)) => {
                self.unlock_or_leave(&held).await;
                return Err(self.unavailable(&error));
            }
        };
        held.record = record;
        // A record that was not cleared: its holder vanished without a release.
        let vanished = replaced
            .as_deref()
            .and_then(parse_record)
            .is_some_and(|(previous, _)| previous != fence);
        if !delay.is_zero() && vanished {
            let ready = Instant::now() + delay;
            if ask.deadline.is_none_or(|deadline| deadline < ready) {
                // Put the vanished holder's record back, so the next grant waits too.
                if let Some(ours) = &held.record {
                    let _ = self
                        .call(&codec::atomic_ref_compare_and_set(
                            &group,
                            &held.name,
                            Some(ours),
                            replaced.as_deref(),
                        ))
                        .await;
                }
                held.record = None;
                self.unlock_or_leave(&held).await;
                return Ok(None);
            }
            sleep_until(ready).await;
        }
        let token = epoch.saturating_add(fence.unsigned_abs());
        let lease = Lease::new(
            ask.key.clone(),
            OwnerToken::random(),
            FencingToken::new(token),
            ask.ttl,
            asked_at,
        );
        self.held_locks().insert(lease.owner(), held);
        Ok(Some(lease))
    }

    /// The namespace's epoch, set at its first grant from the clock (see the module docs).
    async fn epoch(&self, group: &RaftGroupId, fence: i64) -> Result<u64, CallError> {
        self.update_epoch(group, |epoch| {
            if epoch == 0 {
                clock_micros().saturating_sub(fence).max(1)
            } else {
                epoch
            }
        })
        .await
    }

    /// Moves the namespace's epoch to `target(epoch)` (compare-and-set, read again when
    /// another process moved it meanwhile), and returns it: the one read-modify-write both
    /// a grant's first use of the epoch and a raise go through.
    async fn update_epoch(
        &self,
        group: &RaftGroupId,
        target: impl Fn(i64) -> i64,
    ) -> Result<u64, CallError> {
        let name = &self.options.namespace;
        loop {
            let epoch =
                codec::long_answer(&self.call(&codec::atomic_long_get(group, name)).await?)?;
            let wanted = target(epoch);
            if wanted == epoch {
                return Ok(epoch.unsigned_abs());
            }
            let answer = self
                .call(&codec::atomic_long_compare_and_set(
                    group, name, epoch, wanted,
                ))
                .await?;
            if codec::boolean_answer(&answer)? {
                return Ok(wanted.unsigned_abs());
            }
        }
    }

    fn held_locks(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerToken, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Unlocks `held`'s grant: whether it was still held, or an error after which the
    /// cleaner carries on.
    async fn unlock(self: &Arc<Self>, held: &Held) -> Result<bool, LockError> {
        if held.session.ended(&self.client) {
            return Ok(false);
        }
        if let Some(record) = &held.record
            && !self.options.lock_delay.is_zero()
        {
            // Cleared first: a successor that finds it gone knows we released.
            let cleared = self
                .call(&codec::atomic_ref_compare_and_set(
                    &held.session.group,
                    &held.name,
                    Some(record),
                    None,
                ))
                .await;
            if let Err(error) = cleared {
                self.leave_behind(held.leftover(Instant::now()));
                return Err(self.unavailable(&error));
            }
        }
        let unlocked = self
            .call(&codec::unlock(
                &held.session.group,
                &held.name,
                held.holder,
                random_uuid(),
            ))
            .await;
        match unlocked {
            Ok(_) => Ok(true),
            Err(error) if not_held(&error) => Ok(false),
            Err(error) => {
                self.leave_behind(held.leftover(Instant::now()));
                Err(self.unavailable(&error))
            }
        }
    }

    async fn unlock_or_leave(self: &Arc<Self>, held: &Held) {
        if let Err(error) = self.unlock(held).await {
            tracing::debug!(%error, "unlock after a failed grant left to the cleaner");
        }
    }

    /// Hands a lock in an unknown state to a cleaner task of its own.
    fn leave_behind(self: &Arc<Self>, leftover: Leftover) {
        tokio::spawn(clean_up(Arc::downgrade(self), leftover));
    }
}

impl Held {
    fn leftover(&self, settled_after: Instant) -> Leftover {
        Leftover {
            session: self.session.clone(),
            name: self.name.clone(),
            holder: self.holder,
            settled_after,
        }
    }
}

/// The member said the endpoint does not hold the lock (or its session is gone).
fn not_held(error: &CallError) -> bool {
    matches!(
        error.code(),
        Some(
            error_code::ILLEGAL_MONITOR_STATE
                | error_code::LOCK_OWNERSHIP_LOST
                | error_code::SESSION_EXPIRED
        )
    )
}

/// Heartbeats `session` every `every` until it ends or the backend goes. The group's
/// acknowledgement moves the session's provable life on; its answer that the session
/// expired ends it; no answer changes nothing (the next heartbeat may get through).
async fn heartbeat_session(
    backend: std::sync::Weak<Inner>,
    session: Arc<CpSession>,
    every: Duration,
) {
    loop {
        tokio::select! {
            () = session.stop.cancelled() => return,
            () = sleep(every) => {}
        }
        let Some(inner) = backend.upgrade() else {
            return;
        };
        if session.ended(&inner.client) {
            session.end();
            return;
        }
        let sent_at = Instant::now();
        match inner
            .call(&codec::heartbeat_session(&session.group, session.id))
            .await
        {
            Ok(_) => session.acknowledged(sent_at),
            Err(error)
                if matches!(
                    error.code(),
                    Some(error_code::SESSION_EXPIRED | error_code::CP_GROUP_DESTROYED)
                ) =>
            {
                tracing::warn!(session = session.id, "the Hazelcast CP session ended");
                session.end();
                return;
            }
            Err(error) => tracing::debug!(%error, "a CP session heartbeat went unanswered"),
        }
    }
}

/// Unlocks a leftover's endpoint until the member says it holds nothing after the grant
/// could still come, or the session ends (which frees it anyway).
async fn clean_up(backend: std::sync::Weak<Inner>, leftover: Leftover) {
    loop {
        let Some(inner) = backend.upgrade() else {
            return;
        };
        if leftover.session.ended(&inner.client) || inner.closing.is_cancelled() {
            return;
        }
        let unlocked = inner
            .call(&codec::unlock(
                &leftover.session.group,
                &leftover.name,
                leftover.holder,
                random_uuid(),
            ))
            .await;
        let settled = Instant::now() >= leftover.settled_after;
        match unlocked {
            Ok(_) => {
                tracing::debug!(lock = %leftover.name, "released a lock left behind");
                if settled {
                    return;
                }
            }
            Err(error) if not_held(&error) && settled => return,
            Err(_) => {}
        }
        drop(inner);
        sleep(CLEANUP_EVERY).await;
    }
}

/// An acquire's request, owned, for the task that runs the grant.
#[derive(Clone, Debug)]
struct OwnedAsk {
    key: String,
    ttl: Duration,
    deadline: Option<Instant>,
    note: String,
}

#[async_trait]
impl LockBackend for HazelcastBackend {
    async fn acquire(&self, ask: Ask<'_>) -> Result<Option<Lease>, LockError> {
        let owned = OwnedAsk {
            key: ask.key.to_owned(),
            ttl: ask.ttl,
            deadline: ask.deadline,
            note: ask.note.to_owned(),
        };
        let inner = self.inner.clone();
        let (answer, answered) = oneshot::channel();
        // The grant runs on even if this caller stops waiting; a grant nobody takes is
        // released at once.
        tokio::spawn(async move {
            let mut outcome = Ok(Granted::SessionEnded);
            // A session that ended under us is replaced once; a second in a row is an
            // unavailable group, not bad luck.
            for _ in 0..2 {
                outcome = match inner.session().await {
                    Ok(session) => inner.try_lock(&session, &owned).await,
                    Err(error) => Err(error),
                };
                if !matches!(outcome, Ok(Granted::SessionEnded)) {
                    break;
                }
            }
            if let Err(Ok(Granted::Lease(lease))) = answer.send(outcome) {
                let held = inner.held_locks().remove(&lease.owner());
                if let Some(held) = held {
                    inner.unlock_or_leave(&held).await;
                }
            }
        });
        match answered.await {
            Ok(Ok(Granted::Lease(lease))) => Ok(Some(lease)),
            Ok(Ok(Granted::No)) => ask.not_granted(),
            Ok(Ok(Granted::SessionEnded)) => Err(LockError::unavailable(
                "the Hazelcast CP session ended twice in a row",
            )),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(LockError::unavailable("the grant's task ended")),
        }
    }

    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        let inner = &self.inner;
        let group = inner.group().await?;
        let name = inner.name(key);
        let (ownership, holder_record) = (
            codec::lock_ownership(&group, &name),
            codec::atomic_ref_get(&group, &name),
        );
        let (owner, record) = tokio::join!(inner.call(&ownership), inner.call(&holder_record));
        let owner = owner
            .and_then(|answer| Ok(codec::ownership(&answer)?))
            .map_err(|error| inner.unavailable(&error))?;
        if owner.lock_count <= 0 {
            return Ok(None);
        }
        let record = record
            .and_then(|answer| Ok(codec::data_answer(&answer)?))
            .map_err(|error| inner.unavailable(&error))?;
        Ok(Some(
            record
                .as_deref()
                .and_then(parse_record)
                .filter(|(fence, _)| *fence == owner.fence)
                .map(|(_, note)| note)
                .unwrap_or_default(),
        ))
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let held = self.inner.held_locks().remove(&lease.owner());
        match held {
            None => Ok(false),
            Some(held) => self.inner.unlock(&held).await,
        }
    }

    async fn extend(&self, lease: &Lease, _ttl: Duration) -> Result<bool, LockError> {
        let inner = &self.inner;
        let session = match inner.held_locks().get(&lease.owner()) {
            None => return Ok(false),
            Some(held) => held.session.clone(),
        };
        if session.ended(&inner.client) {
            inner.held_locks().remove(&lease.owner());
            return Ok(false);
        }
        if Instant::now() < session.alive_until() {
            Ok(true)
        } else {
            Err(LockError::unavailable(
                "no heartbeat of the Hazelcast CP session was acknowledged within its time to live: it may have ended",
            ))
        }
    }

    async fn raise_fencing(
        &self,
        _key: &str,
        floor: FencingToken,
    ) -> Result<FencingToken, LockError> {
        let inner = &self.inner;
        let group = inner.group().await?;
        let floor = i64::try_from(floor.get()).unwrap_or(i64::MAX);
        let raised = inner
            .update_epoch(&group, |epoch| {
                if epoch == 0 {
                    floor.max(clock_micros())
                } else {
                    epoch.max(floor)
                }
            })
            .await
            .map_err(|error| inner.unavailable(&error))?;
        Ok(FencingToken::new(raised))
    }

    async fn ping(&self) -> Result<(), LockError> {
        // A read of the epoch: the CP group answers only with a majority of its members.
        let inner = &self.inner;
        let group = inner.group().await?;
        inner
            .call(&codec::atomic_long_get(&group, &inner.options.namespace))
            .await
            .map_err(|error| inner.unavailable(&error))?;
        Ok(())
    }

    fn sessions(&self) -> Sessions {
        Sessions::PerProcess {
            timeout: Duration::from_millis(self.inner.granted_ttl_ms.load(Ordering::Relaxed)),
        }
    }
}

/// Microseconds since the Unix epoch, by this machine's clock.
fn clock_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
        })
}

fn random_uuid() -> frame::Uuid {
    // Version 4, variant 1, as Java's UUID.randomUUID makes them.
    let most = (rand::random::<u64>() & !0xF000) | 0x4000;
    let least = (rand::random::<u64>() & !(0xC000 << 48)) | (0x8000 << 48);
    (most, least)
}

/// Hazelcast's serialized form of a byte array, big-endian as its serialization is: a
/// partition hash (0: none), the type id of `byte[]` (-12), the length, the bytes. The
/// members store it and compare it byte for byte, never reading it.
const BYTE_ARRAY_TYPE: i32 = -12;

/// The holder's record: its fence and its note.
fn record(fence: i64, note: &str) -> Vec<u8> {
    let mut payload = Vec::with_capacity(8 + note.len());
    payload.extend_from_slice(&fence.to_be_bytes());
    payload.extend_from_slice(note.as_bytes());
    let mut data = Vec::with_capacity(12 + payload.len());
    data.extend_from_slice(&0_i32.to_be_bytes());
    data.extend_from_slice(&BYTE_ARRAY_TYPE.to_be_bytes());
    data.extend_from_slice(
        &i32::try_from(payload.len())
            .unwrap_or(i32::MAX)
            .to_be_bytes(),
    );
    data.extend_from_slice(&payload);
    data
}

/// A record's fence and note; `None` for anything else.
fn parse_record(data: &[u8]) -> Option<(i64, String)> {
    let type_id = i32::from_be_bytes(data.get(4..8)?.try_into().ok()?);
    let length = usize::try_from(i32::from_be_bytes(data.get(8..12)?.try_into().ok()?)).ok()?;
    let payload = data.get(12..)?;
    if type_id != BYTE_ARRAY_TYPE || payload.len() != length || length < 8 {
        return None;
    }
    let fence = i64::from_be_bytes(payload[..8].try_into().ok()?);
    let note = String::from_utf8(payload[8..].to_vec()).ok()?;
    Some((fence, note))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_members_group_and_cluster() {
        let options = LockOptions::default();
        let backend =
            HazelcastBackend::open("hazelcast://127.0.0.1:5701,127.0.0.1:5702", &options).unwrap();
        assert_eq!(backend.inner.group_name, "default");
        let backend =
            HazelcastBackend::open("hazelcast://h:5701/locks?cluster=prod", &options).unwrap();
        assert_eq!(backend.inner.group_name, "locks");
        for bad in [
            "hazelcast://",
            "hazelcast://h",
            "hazelcast://h:port",
            "hazelcast://h:5701/a/b",
            "hazelcast://h:5701/a@b",
            "hazelcast://h:5701?cluster=",
            "hazelcast://h:5701?user=x",
            "zk://h:5701",
        ] {
            assert!(
                matches!(
                    HazelcastBackend::open(bad, &options),
                    Err(LockError::Invalid(_))
                ),
                "{bad} was taken"
            );
        }
    }

    #[test]
    fn records_keep_fence_and_note() {
        let data = record(42, "ticket: 7|x");
        assert_eq!(&data[4..8], &(-12_i32).to_be_bytes());
        assert_eq!(parse_record(&data), Some((42, "ticket: 7|x".to_owned())));
        assert_eq!(parse_record(&record(-1, "")), Some((-1, String::new())));
        assert_eq!(parse_record(&data[..data.len() - 1]), None);
        assert_eq!(parse_record(b"short"), None);
    }

    /// What sending again relies on, asked of the real members (the shared cluster,
    /// `HAZELCAST_URL`): a `tryLock` and an `unlock` sent twice with one invocation id each
    /// count once — the repeated grant answers the same fence with one hold, the repeated
    /// unlock answers as the first did and frees nothing more.
    #[tokio::test]
    async fn a_repeated_invocation_counts_once() {
        let url = std::env::var("HAZELCAST_URL").unwrap_or_else(|_| {
            "hazelcast://127.0.0.1:5701,127.0.0.1:5702,127.0.0.1:5703".to_owned()
        });
        let backend = HazelcastBackend::open(&url, &LockOptions::default()).unwrap();
        let inner = backend.inner.clone();
        let session = inner.session().await.unwrap();
        let group = session.group.clone();
        let holder = Endpoint {
            session: session.id,
            thread: inner.next_thread.fetch_add(1, Ordering::Relaxed),
        };
        let name = format!("unit-{:016x}/k", rand::random::<u64>());
        let ownership = || async {
            codec::ownership(
                &inner
                    .call(&codec::lock_ownership(&group, &name))
                    .await
                    .unwrap(),
            )
            .unwrap()
        };
        let grant = random_uuid();
        let mut fences = Vec::new();
        for _ in 0..2 {
            let answer = inner
                .call(&codec::try_lock(&group, &name, holder, grant, 0))
                .await
                .unwrap();
            fences.push(codec::long_answer(&answer).unwrap());
        }
        assert!(fences[0] > 0 && fences[0] == fences[1], "{fences:?}");
        let held = ownership().await;
        assert_eq!((held.lock_count, held.holder), (1, holder));
        let release = random_uuid();
        for _ in 0..2 {
            let answer = inner
                .call(&codec::unlock(&group, &name, holder, release))
                .await
                .unwrap();
            assert!(!codec::boolean_answer(&answer).unwrap(), "still held");
        }
        assert_eq!(ownership().await.lock_count, 0);
    }

    #[test]
    fn invocation_ids_are_version_4() {
        let (most, least) = random_uuid();
        assert_eq!((most >> 12) & 0xF, 4);
        assert_eq!(least >> 62, 0b10);
    }
}
