//! Locks in ZooKeeper, by the recipe of ZooKeeper's documentation and the seeds: every
//! waiter creates an ephemeral sequential znode under the key's parent; the lowest
//! sequence holds the lock; each waiter watches only the node just before its own (a
//! release wakes one waiter, never the herd); release deletes the node.
//!
//! - **The session is the lease.** The nodes are ephemeral: ZooKeeper deletes them when
//!   the process's session ends — closed, or expired because the process stopped
//!   heartbeating (it crashed, paused, or lost the network for longer than the session
//!   timeout). Renewal is the session's own heartbeat, sent by the client for the whole
//!   process; `extend` asks no server, it reports what the process knows: the node is ours
//!   and undeleted (a watch on it says so) and the session connected. While the client is
//!   disconnected the session may still live, so `extend` fails (the guard retries until
//!   its lease would run out, then declares the lock lost); once the session ended, or the
//!   node was deleted, `extend` answers false and `lost` fires.
//! - **Fencing token**: the lock node's creation zxid (`czxid`). Every change to the
//!   ensemble gets the next zxid, and zxids survive restarts, so tokens only grow — with no
//!   counter to lose. Plus the key's *base*, kept in the key's parent node: `raise_fencing`
//!   lifts it, for a protected store that has seen higher tokens than the zxids (tokens
//!   from another lock service, before a switch). It is 0 unless raised.
//! - Per hand-off: the release (one delete), the successor's look at the queue (children
//!   and base in one multi-read) and its watch on its own node — three requests however
//!   long the queue. A waiter that gives up deletes its node, so it never holds up the line.
//! - **Lock-delay** (when set): a holder leaves a persistent marker `<key>/held`, removed in
//!   the same multi-write as its node on release. A successor that finds the marker still
//!   there knows its predecessor's session ended without a release, and waits the delay
//!   before using the lock (it holds it meanwhile, so nobody else can); a `try_acquire`
//!   then answers that the lock is taken. One request more per grant.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;
use zookeeper_client::{
    Acls, Client, CreateMode, CreateOptions, EventType, MultiReadResult, SessionState,
};

use crate::error::LockError;
use crate::service::{Lease, LockBackend, Sessions, check_floor, validate, validate_note};
use crate::token::{FencingToken, OwnerToken};

/// Settings for [`ZooKeeperBackend`].
#[derive(Clone, Debug)]
pub struct ZooKeeperOptions {
    /// The session timeout asked of the server (which clamps it between 2 and 20 ticks by
    /// default): how long after this process stops heartbeating its locks are released.
    pub session_timeout: Duration,
    /// Upper bound on connecting and on any one request.
    pub op_timeout: Duration,
    /// The most waiters one key's queue takes; past it an acquire fails at once.
    pub max_waiters: usize,
    /// Chubby's lock-delay: after a holder's session ended without a release, its
    /// successor holds the lock but waits this long before using it (see the module
    /// docs). Zero by default: no marker is kept.
    pub lock_delay: Duration,
}

impl Default for ZooKeeperOptions {
    fn default() -> Self {
        Self {
            session_timeout: Duration::from_secs(10),
            op_timeout: Duration::from_secs(2),
            max_waiters: crate::service::DEFAULT_MAX_WAITERS,
            lock_delay: Duration::ZERO,
        }
    }
}

/// A key's queue as one multi-read saw it.
struct Queue {
    /// Lock node names, the holder first.
    names: Vec<String>,
    /// The fencing base.
    base: u64,
    /// The holder marker left by a holder that never released (lock-delay only).
    unreleased: bool,
}

/// What this process knows of one ZooKeeper session.
#[derive(Debug)]
struct SessionHealth {
    /// Connected to a server now: heartbeats get through.
    connected: AtomicBool,
    /// Closed or expired: its ephemeral nodes are gone, for good.
    ended: AtomicBool,
}

/// The current session: its client and what is known of its health.
#[derive(Clone)]
struct Session {
    client: Client,
    health: Arc<SessionHealth>,
}

/// A lock this process holds.
struct Held {
    client: Client,
    path: String,
    health: Arc<SessionHealth>,
    /// Set by the watch on the node when it is deleted (by its session's end, or by hand).
    deleted: Arc<AtomicBool>,
}

/// Locks in a ZooKeeper ensemble. See the module docs for the recipe.
pub struct ZooKeeperBackend {
    /// `host:port[,host:port…]`: where the ensemble is.
    cluster: String,
    /// Where this deployment's locks live: `<root>/locks/<key>/lock-<sequence>`.
    root: String,
    options: ZooKeeperOptions,
    /// The session every lock of this process rides on; replaced once it ends.
    session: tokio::sync::Mutex<Option<Session>>,
    /// Locks held now, by owner token: release and extend find their node here.
    held: Arc<Mutex<HashMap<OwnerToken, Held>>>,
    /// Parents known to exist, so creating them costs requests once per key.
    parents: Mutex<HashSet<String>>,
    /// Ends the session watchers and node watches when the backend goes.
    closing: CancellationToken,
    /// Requests sent, for benchmarks and tests.
    requests: AtomicU64,
}

impl fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("cluster", &self.cluster)
            .field("root", &self.root)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Drop for ZooKeeperBackend {
    fn drop(&mut self) {
        self.closing.cancel();
    }
}

const EPHEMERAL_SEQUENTIAL: CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
const PERSISTENT: CreateOptions<'static> = CreateMode::Persistent.with_acls(Acls::anyone_all());

/// The prefix of every lock node's name; the server appends the sequence.
const NODE_PREFIX: &str = "lock-";

/// Why a request failed: ZooKeeper's answer (kept typed, so callers can tell a node that is
/// not there from an outage), or no answer in time.
#[derive(Debug)]
enum Failure {
    Refused(zookeeper_client::Error),
    NoAnswer,
}

impl Failure {
    fn is(&self, error: &zookeeper_client::Error) -> bool {
        matches!(self, Self::Refused(refused) if refused == error)
    }
}

impl From<zookeeper_client::Error> for Failure {
    fn from(error: zookeeper_client::Error) -> Self {
        Self::Refused(error)
    }
}

/// Everything but a malformed request means the ensemble could not be reached or the
/// session is gone.
impl From<Failure> for LockError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Refused(zookeeper_client::Error::BadArguments(reason)) => {
                LockError::Invalid(reason.to_string())
            }
            Failure::Refused(other) => LockError::unavailable(format!("ZooKeeper: {other}")),
            Failure::NoAnswer => LockError::unavailable("ZooKeeper did not answer in time"),
        }
    }
}

use zookeeper_client::Error::{BadVersion, NoNode};

/// The lock-delay marker of the key under `parent`.
fn marker(parent: &str) -> String {
    format!("{parent}/held")
}

/// A key as one znode name: `/` would make it a path, `%` escapes.
fn node_name(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

/// The sequence number of a lock node's name, for ordering (names are zero-padded, but to
/// 10 digits or 19, so text order is not enough).
fn sequence(name: &str) -> Option<i64> {
    name.strip_prefix(NODE_PREFIX)?.parse().ok()
}

impl ZooKeeperBackend {
    /// A backend for `url`: `zk://host:port[,host:port…][/root]` (the root defaults to
    /// `/payonce`). Connects lazily; must be used inside a Tokio runtime.
    pub fn open(url: &str, options: ZooKeeperOptions) -> Result<Self, LockError> {
        let rest = url
            .strip_prefix("zk://")
            .ok_or_else(|| LockError::Invalid(format!("not a zk:// URL: {url}")))?;
        let (cluster, root) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash..]),
            None => (rest, ""),
        };
        let root = root.trim_end_matches('/');
        let root = if root.is_empty() { "/payonce" } else { root };
        if cluster.is_empty() || root.contains("//") {
            return Err(LockError::Invalid(format!("bad ZooKeeper URL: {url}")));
        }
        Ok(Self {
            cluster: cluster.to_owned(),
            root: root.to_owned(),
            options: ZooKeeperOptions {
                max_waiters: options.max_waiters.max(1),
                ..options
            },
            session: tokio::sync::Mutex::new(None),
            held: Arc::new(Mutex::new(HashMap::new())),
            parents: Mutex::new(HashSet::new()),
            closing: CancellationToken::new(),
            requests: AtomicU64::new(0),
        })
    }

    /// Requests sent so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The current session, for tests and tools that end it from outside (a client that
    /// connects with it and closes it); `None` before the first use.
    pub async fn session_info(&self) -> Option<zookeeper_client::SessionInfo> {
        let session = self.session.lock().await;
        Some(session.as_ref()?.client.session().clone())
    }

    fn held(&self) -> MutexGuard<'_, HashMap<OwnerToken, Held>> {
        // Inserts and removes cannot leave the map inconsistent.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn parent(&self, key: &str) -> String {
        format!("{}/locks/{}", self.root, node_name(key))
    }

    /// Bounds one request by the op timeout and by `deadline`, and counts it.
    async fn request<T>(
        &self,
        deadline: Option<Instant>,
        call: impl Future<Output = Result<T, zookeeper_client::Error>>,
    ) -> Result<T, Failure> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let op_limit = Instant::now() + self.options.op_timeout;
        let limit = deadline.map_or(op_limit, |deadline| deadline.min(op_limit));
        match timeout_at(limit, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(Failure::NoAnswer),
        }
    }

    /// The live session, connecting a new one if there is none or it ended.
    async fn session(&self) -> Result<Session, LockError> {
        let mut current = self.session.lock().await;
        if let Some(session) = current.as_ref()
            && !session.health.ended.load(Ordering::Acquire)
        {
            return Ok(session.clone());
        }
        let connecting = Client::connector()
            .with_session_timeout(self.options.session_timeout)
            .with_connection_timeout(self.options.op_timeout)
            .connect(&self.cluster);
        let client = self.request(None, connecting).await?;
        let health = Arc::new(SessionHealth {
            connected: AtomicBool::new(true),
            ended: AtomicBool::new(false),
        });
        tokio::spawn(watch_session(
            client.state_watcher(),
            health.clone(),
            self.closing.clone(),
        ));
        let session = Session { client, health };
        *current = Some(session.clone());
        Ok(session)
    }

    /// Creates the key's parent (and the root above it) once.
    async fn ensure_parent(&self, client: &Client, parent: &str) -> Result<(), LockError> {
        let known = self
            .parents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .contains(parent);
        if known {
            return Ok(());
        }
        self.request(None, client.mkdir(parent, &PERSISTENT))
            .await?;
        self.parents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(parent.to_owned());
        Ok(())
    }

    /// The key's queue in order (node names) and its fencing base, in one request.
    async fn queue(
        &self,
        client: &Client,
        parent: &str,
        deadline: Option<Instant>,
    ) -> Result<Queue, Failure> {
        let mut reader = client.new_multi_reader();
        reader.add_get_children(parent).map_err(Failure::from)?;
        reader.add_get_data(parent).map_err(Failure::from)?;
        let delayed = !self.options.lock_delay.is_zero();
        if delayed {
            reader
                .add_get_data(&marker(parent))
                .map_err(Failure::from)?;
        }
        let mut results = self.request(deadline, reader.commit()).await?.into_iter();
        let children = match results.next() {
            Some(MultiReadResult::Children { children }) => children,
            Some(MultiReadResult::Error { err }) => return Err(err.into()),
            _ => Vec::new(),
        };
        let base = match results.next() {
            Some(MultiReadResult::Data { data, .. }) => parse_base(&data),
            Some(MultiReadResult::Error { err }) => return Err(err.into()),
            _ => 0,
        };
        // The marker is there (data) or not (NoNode).
        let unreleased = delayed && matches!(results.next(), Some(MultiReadResult::Data { .. }));
        let mut names: Vec<(i64, String)> = children
            .into_iter()
            .filter_map(|name| Some((sequence(&name)?, name)))
            .collect();
        names.sort();
        Ok(Queue {
            names: names.into_iter().map(|(_, name)| name).collect(),
            base,
            unreleased,
        })
    }

    /// Lock-delay at a grant: waits out the delay if the marker says the last holder
    /// never released (not past `deadline`: then the lock is not ours to use, and `false`),
    /// and leaves our own marker.
    async fn honour_lock_delay(
        &self,
        client: &Client,
        parent: &str,
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
                parent,
                ?delay,
                "the last holder never released: waiting out the lock-delay"
            );
            sleep_until(until).await;
        }
        let marker = marker(parent);
        match self
            .request(None, client.set_data(&marker, b"held", None))
            .await
        {
            Ok(_) => Ok(true),
            Err(failure) if failure.is(&NoNode) => {
                self.request(None, client.create(&marker, b"held", &PERSISTENT))
                    .await?;
                Ok(true)
            }
            Err(failure) => Err(failure.into()),
        }
    }

    /// Takes the lock; waits in line until `deadline`, or never when `deadline` is `None`
    /// (then `Ok(None)` when it is held).
    async fn take(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Option<Instant>,
        note: &str,
    ) -> Result<Option<Lease>, LockError> {
        validate(key, ttl)?;
        validate_note(note)?;
        let started = Instant::now();
        let session = self.session().await?;
        let parent = self.parent(key);
        self.ensure_parent(&session.client, &parent).await?;
        let prefix = format!("{parent}/{NODE_PREFIX}");
        let created = session
            .client
            .create(&prefix, note.as_bytes(), &EPHEMERAL_SEQUENTIAL);
        let (stat, sequence) = self.request(deadline, created).await?;
        let name = format!("{NODE_PREFIX}{sequence}");
        let path = format!("{parent}/{name}");
        let mut node = Queued {
            client: session.client.clone(),
            path: Some(path.clone()),
        };
        // Once the lock was seen held, running out of time is a wait that timed out, not
        // a store that did not answer.
        let mut seen_held = false;
        let timed_out = |failure: Failure, seen_held: bool| match deadline {
            Some(deadline) if seen_held && Instant::now() >= deadline => LockError::TimedOut {
                key: key.to_owned(),
                waited: started.elapsed(),
            },
            _ => failure.into(),
        };
        loop {
            let looked_at = Instant::now();
            let Queue {
                names: queue,
                base,
                unreleased,
            } = self
                .queue(&session.client, &parent, deadline)
                .await
                .map_err(|failure| timed_out(failure, seen_held))?;
            let Some(position) = queue.iter().position(|queued| *queued == name) else {
                return Err(LockError::unavailable(
                    "our ZooKeeper node vanished while queued (the session ended)",
                ));
            };
            if position == 0 {
                if !self
                    .honour_lock_delay(&session.client, &parent, unreleased, deadline)
                    .await?
                {
                    // Held by us, but not usable before the caller gives up: `node` hands
                    // it on as it drops.
                    return match deadline {
                        None => Ok(None),
                        Some(_) => Err(LockError::TimedOut {
                            key: key.to_owned(),
                            waited: started.elapsed(),
                        }),
                    };
                }
                let token = base.saturating_add(stat.czxid.max(0).unsigned_abs());
                let deleted = self.watch_own(&session, &path).await?;
                node.settle();
                let owner = OwnerToken::random();
                self.held().insert(
                    owner,
                    Held {
                        client: session.client.clone(),
                        path,
                        health: session.health.clone(),
                        deleted,
                    },
                );
                // The session is the real lease: the guard must not count on more.
                let lease_ttl = ttl.min(self.options.session_timeout / 2);
                return Ok(Some(Lease::new(
                    key,
                    owner,
                    FencingToken::new(token),
                    lease_ttl,
                    looked_at,
                )));
            }
            let Some(deadline) = deadline else {
                // Trying, not waiting: `node` leaves the queue as it drops.
                return Ok(None);
            };
            if position > self.options.max_waiters {
                return Err(LockError::QueueFull {
                    key: key.to_owned(),
                    max_waiters: self.options.max_waiters,
                });
            }
            seen_held = true;
            let predecessor = format!("{parent}/{}", queue[position - 1]);
            let (exists, watcher) = self
                .request(
                    Some(deadline),
                    session.client.check_and_watch_stat(&predecessor),
                )
                .await
                .map_err(|failure| timed_out(failure, seen_held))?;
            if exists.is_none() {
                continue;
            }
            tokio::select! {
                // Deleted (released, given up, its session ended) — or our own session
                // changed: look at the queue again either way.
                _ = watcher.changed() => {}
                () = sleep_until(deadline) => {
                    return Err(LockError::TimedOut {
                        key: key.to_owned(),
                        waited: started.elapsed(),
                    });
                }
            }
        }
    }

    /// Watches our lock node: the flag is set the moment it is deleted.
    async fn watch_own(&self, session: &Session, path: &str) -> Result<Arc<AtomicBool>, LockError> {
        let (exists, watcher) = self
            .request(None, session.client.check_and_watch_stat(path))
            .await?;
        let deleted = Arc::new(AtomicBool::new(exists.is_none()));
        let flag = deleted.clone();
        let closing = self.closing.clone();
        tokio::spawn(async move {
            tokio::select! {
                event = watcher.changed() => {
                    // NodeDeleted, or a session event: the watch is gone with the session.
                    if event.event_type != EventType::NodeDataChanged {
                        flag.store(true, Ordering::Release);
                    }
                }
                () = closing.cancelled() => {}
            }
        });
        Ok(deleted)
    }
}

/// A lock node of ours that is not (yet) a held lock: deleted in the background when the
/// acquire call ends without a grant — the deadline, an error, a try that found the lock
/// held, or the call dropped — so it never holds up the line.
struct Queued {
    client: Client,
    path: Option<String>,
}

impl Queued {
    fn settle(&mut self) {
        self.path = None;
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let Some(path) = self.path.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        runtime.spawn(async move {
            // Best effort: if the session is gone, so is the node.
            let _ = tokio::time::timeout(Duration::from_secs(5), client.delete(&path, None)).await;
        });
    }
}

/// Keeps a session's health up to date until it ends or the backend goes.
async fn watch_session(
    mut states: zookeeper_client::StateWatcher,
    health: Arc<SessionHealth>,
    closing: CancellationToken,
) {
    loop {
        let state = tokio::select! {
            state = states.changed() => state,
            () = closing.cancelled() => return,
        };
        match state {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                health.connected.store(true, Ordering::Release);
            }
            SessionState::Disconnected => health.connected.store(false, Ordering::Release),
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                tracing::warn!(?state, "ZooKeeper session ended: its locks are released");
                health.connected.store(false, Ordering::Release);
                health.ended.store(true, Ordering::Release);
                return;
            }
        }
    }
}

/// A key's fencing base, as its parent node stores it: decimal digits, or nothing (0). A
/// parent written by hand with anything else counts as 0: the zxid alone still grows.
fn parse_base(data: &[u8]) -> u64 {
    std::str::from_utf8(data)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
}

#[async_trait]
impl LockBackend for ZooKeeperBackend {
    async fn try_acquire(
        &self,
        key: &str,
        ttl: Duration,
        note: &str,
    ) -> Result<Option<Lease>, LockError> {
        self.take(key, ttl, None, note).await
    }

    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
        note: &str,
    ) -> Result<Lease, LockError> {
        match self.take(key, ttl, Some(deadline), note).await? {
            Some(lease) => Ok(lease),
            None => Err(LockError::TimedOut {
                key: key.to_owned(),
                waited: Duration::ZERO,
            }),
        }
    }

    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        let session = self.session().await?;
        let parent = self.parent(key);
        let queue = match self.queue(&session.client, &parent, None).await {
            Ok(queue) => queue.names,
            // Never locked here.
            Err(failure) if failure.is(&NoNode) => return Ok(None),
            Err(failure) => return Err(failure.into()),
        };
        let Some(first) = queue.first() else {
            return Ok(None);
        };
        match self
            .request(None, session.client.get_data(&format!("{parent}/{first}")))
            .await
        {
            Ok((note, _)) => Ok(Some(String::from_utf8_lossy(&note).into_owned())),
            // Released between the two requests.
            Err(failure) if failure.is(&NoNode) => Ok(None),
            Err(failure) => Err(failure.into()),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(held) = self.held().remove(&lease.owner()) else {
            return Ok(false);
        };
        if held.deleted.load(Ordering::Acquire) || held.health.ended.load(Ordering::Acquire) {
            return Ok(false);
        }
        let deleted = if self.options.lock_delay.is_zero() {
            self.request(None, held.client.delete(&held.path, None))
                .await
        } else {
            // The node and the lock-delay marker go together: a release, not a vanishing.
            let parent = held.path.rsplit_once('/').map_or("", |(parent, _)| parent);
            let mut writer = held.client.new_multi_writer();
            let queued = writer
                .add_delete(&marker(parent), None)
                .and_then(|()| writer.add_delete(&held.path, None));
            match queued {
                Ok(()) => {
                    let committed = async { Ok(writer.commit().await?) };
                    self.request(None, committed).await.map(|_: Vec<_>| ())
                }
                Err(error) => Err(error.into()),
            }
        };
        match deleted {
            Ok(()) => Ok(true),
            Err(failure) if failure.is(&NoNode) => Ok(false),
            Err(failure) => {
                // Keep it, so a retry can still release it.
                self.held().insert(lease.owner(), held);
                Err(failure.into())
            }
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<bool, LockError> {
        validate(lease.key(), ttl)?;
        let held = self.held();
        let Some(held) = held.get(&lease.owner()) else {
            return Ok(false);
        };
        if held.deleted.load(Ordering::Acquire) || held.health.ended.load(Ordering::Acquire) {
            return Ok(false);
        }
        if !held.health.connected.load(Ordering::Acquire) {
            return Err(LockError::unavailable(
                "disconnected from ZooKeeper: the session may still be alive",
            ));
        }
        Ok(true)
    }

    async fn raise_fencing(
        &self,
        key: &str,
        floor: FencingToken,
    ) -> Result<FencingToken, LockError> {
        check_floor(floor)?;
        let session = self.session().await?;
        let parent = self.parent(key);
        self.ensure_parent(&session.client, &parent).await?;
        loop {
            let (data, stat) = self.request(None, session.client.get_data(&parent)).await?;
            let base = parse_base(&data);
            // The next lock node's czxid is above every zxid so far, pzxid included.
            let latest = stat.pzxid.max(stat.mzxid).max(0).unsigned_abs();
            if base >= floor.get() {
                return Ok(FencingToken::new(base.saturating_add(latest)));
            }
            let written = session.client.set_data(
                &parent,
                floor.get().to_string().as_bytes(),
                Some(stat.version),
            );
            match self.request(None, written).await {
                Ok(stat) => {
                    return Ok(FencingToken::new(
                        floor.get().saturating_add(stat.mzxid.max(0).unsigned_abs()),
                    ));
                }
                // Raised by someone else meanwhile: look again.
                Err(failure) if failure.is(&BadVersion) => {}
                Err(failure) => return Err(failure.into()),
            }
        }
    }

    async fn ping(&self) -> Result<(), LockError> {
        let session = self.session().await?;
        self.request(None, session.client.check_stat("/")).await?;
        Ok(())
    }

    fn sessions(&self) -> Sessions {
        Sessions::PerProcess {
            timeout: self.options.session_timeout,
        }
    }
}
