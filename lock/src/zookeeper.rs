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
//! - **Nothing left behind.** A node's name carries a random tag of its waiter
//!   (`lock-<tag>-<sequence>`), so a create whose answer never came (timed out, or the call
//!   was dropped) can still be found and deleted. Deletes that fail — a release or a
//!   give-up while the ensemble is unreachable — go to a per-session cleaner that retries
//!   them until they succeed or the session ends (which deletes the nodes anyway). The
//!   client sends a session's requests in order, so the cleaner's look always follows the
//!   create it is cleaning up after.
//! - **Lock-delay** (when set): a holder leaves a persistent marker `<key>/held`, removed in
//!   the same multi-write as its node on release. A successor that finds the marker still
//!   there knows its predecessor's session ended without a release, and waits the delay
//!   before using the lock (it holds it meanwhile, so nobody else can); a `try_acquire`
//!   then answers that the lock is taken. One request more per grant.
//! - **Idle keys are pruned.** A key's parent node outlives its locks (it carries the
//!   base), so without pruning one persistent node stays per key ever locked — and
//!   ZooKeeper keeps its whole tree in memory. [`LockBackend::prune_idle`] deletes the
//!   parents that stayed empty and unchanged (no lock node created or deleted, no base
//!   written) between two of its passes at least the idle time apart; a parent with a
//!   raised base, or a lock-delay marker left by a holder that vanished, is kept. The
//!   delete is conditioned on the parent being empty and its data unchanged, so a key in
//!   use is never pruned; a process that remembered the parent creates it again.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;
use zookeeper_client::{
    Acls, Client, CreateMode, CreateOptions, EventType, MultiReadResult, SessionState,
};

use crate::backend::{Ask, DEFAULT_OP_TIMEOUT, Lease, LockBackend, LockOptions, Sessions};
use crate::error::LockError;
use crate::token::{FencingToken, OwnerToken};

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
    /// The session timeout the server granted (it may clamp what was asked).
    timeout: Duration,
    /// Deletes to retry, for this session's cleaner.
    leftovers: mpsc::UnboundedSender<Leftover>,
}

/// The session slot: the current session, and when connecting last failed (callers then
/// fail fast for a moment instead of queueing behind connects that cannot succeed).
#[derive(Default)]
struct SessionSlot {
    current: Option<Session>,
    failed_at: Option<Instant>,
}

/// How long after a failed connect callers are answered at once, without a new attempt.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// Parents remembered at most; past it the memory starts over (costing one `mkdir` per
/// key again), so a stream of distinct keys cannot grow it without bound.
const MAX_KNOWN_PARENTS: usize = 10_000;

/// Parents a pruning pass reads, or deletes, in one request.
const PRUNE_BATCH: usize = 256;

/// An empty key parent as a pruning pass saw it: a later pass that finds it the same
/// (no lock node created or deleted since, no base written) knows it stayed unused.
#[derive(Clone, Copy, Debug)]
struct Sighting {
    /// The parent's child version: counts every lock node created or deleted under it.
    cversion: i32,
    /// Its data version: counts every base written.
    version: i32,
    /// When a pass first saw it so.
    since: Instant,
}

/// A lock this process holds.
struct Held {
    session: Session,
    path: String,
    /// Set by the watch on the node when it is deleted (by its session's end, or by hand).
    deleted: Arc<AtomicBool>,
}

/// Which node a leftover is.
#[derive(Debug)]
enum Node {
    /// Its create was never answered: the one under the parent whose name carries this
    /// tag, if any.
    Tagged(String),
    /// This path.
    At(String),
}

/// A node that should be deleted and may not have been: a waiter's that gave up, or a
/// holder's whose release failed.
#[derive(Debug)]
struct Leftover {
    /// The key's parent node.
    parent: String,
    node: Node,
    /// Delete the lock-delay marker with it: a release, not a give-up.
    with_marker: bool,
}

/// Locks in a ZooKeeper ensemble. See the module docs for the recipe.
pub struct ZooKeeperBackend {
    /// `host:port[,host:port…]`: where the ensemble is.
    cluster: String,
    /// Where this deployment's locks live: `<root>/locks/<key>/lock-<sequence>`.
    root: String,
    /// `session` is the session timeout asked of the server; `lock_delay` is kept with a
    /// marker (see the module docs).
    options: LockOptions,
    op_timeout: Duration,
    /// The session every lock of this process rides on; replaced once it ends.
    session: tokio::sync::Mutex<SessionSlot>,
    /// The granted session timeout in milliseconds (the one asked, before a session).
    granted_timeout_ms: AtomicU64,
    /// Locks held now, by owner token: release and extend find their node here.
    held: Arc<Mutex<HashMap<OwnerToken, Held>>>,
    /// Parents known to exist, so creating them costs requests once per key.
    parents: Mutex<HashSet<String>>,
    /// The empty parents the last pruning pass saw, by path: at most one per parent.
    sightings: Mutex<HashMap<String, Sighting>>,
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

/// The prefix of every lock node's name; the waiter's tag and `-` follow, and the server
/// appends the sequence.
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

use zookeeper_client::Error::{BadVersion, NoNode, NotEmpty, SessionExpired};

/// The lock-delay marker of the key under `parent`.
fn marker(parent: &str) -> String {
    format!("{parent}/held")
}

/// A key as one znode name: `/` would make it a path, `%` escapes.
fn node_name(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

/// The sequence number of a lock node's name (`lock-<tag>-<sequence>`), for ordering
/// (names are zero-padded, but to 10 digits or 19, and tags differ, so text order is not
/// enough).
fn sequence(name: &str) -> Option<i64> {
    let (_tag, sequence) = name.strip_prefix(NODE_PREFIX)?.rsplit_once('-')?;
    sequence.parse().ok()
}

/// Whether a lock node's name carries `tag`.
fn tagged(name: &str, tag: &str) -> bool {
    name.strip_prefix(NODE_PREFIX)
        .and_then(|rest| rest.rsplit_once('-'))
        .is_some_and(|(named, _)| named == tag)
}

impl ZooKeeperBackend {
    /// A backend for `url`: `zk://host:port[,host:port…][/root]` (the root defaults to
    /// `/payonce`). Connects lazily; must be used inside a Tokio runtime.
    pub fn open(url: &str, options: &LockOptions) -> Result<Self, LockError> {
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
            options: LockOptions {
                max_waiters: options.max_waiters.max(1),
                ..options.clone()
            },
            op_timeout: options.op_timeout_or(DEFAULT_OP_TIMEOUT),
            session: tokio::sync::Mutex::new(SessionSlot::default()),
            granted_timeout_ms: AtomicU64::new(
                u64::try_from(options.session.as_millis()).unwrap_or(u64::MAX),
            ),
            held: Arc::new(Mutex::new(HashMap::new())),
            parents: Mutex::new(HashSet::new()),
            sightings: Mutex::new(HashMap::new()),
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
        let slot = self.session.lock().await;
        Some(slot.current.as_ref()?.client.session().clone())
    }

    fn held(&self) -> MutexGuard<'_, HashMap<OwnerToken, Held>> {
        // Inserts and removes cannot leave the map inconsistent.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn parent(&self, key: &str) -> String {
        format!("{}/{}", self.locks_node(), node_name(key))
    }

    /// The node every key's parent lives under.
    fn locks_node(&self) -> String {
        format!("{}/locks", self.root)
    }

    /// Bounds one request by the op timeout and by `deadline`, and counts it.
    async fn request<T>(
        &self,
        deadline: Option<Instant>,
        call: impl Future<Output = Result<T, zookeeper_client::Error>>,
    ) -> Result<T, Failure> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let op_limit = Instant::now() + self.op_timeout;
        let limit = deadline.map_or(op_limit, |deadline| deadline.min(op_limit));
        match timeout_at(limit, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(Failure::NoAnswer),
        }
    }

    /// The live session, connecting a new one if there is none or it ended. Waits for a
    /// connect under way at most the op timeout, and not past `deadline`.
    async fn session(&self, deadline: Option<Instant>) -> Result<Session, LockError> {
        let op_limit = Instant::now() + self.op_timeout;
        let limit = deadline.map_or(op_limit, |deadline| deadline.min(op_limit));
        let mut slot = timeout_at(limit, self.session.lock())
            .await
            .map_err(|_| LockError::unavailable("ZooKeeper: still connecting"))?;
        if let Some(session) = slot.current.as_ref()
            && !session.health.ended.load(Ordering::Acquire)
        {
            return Ok(session.clone());
        }
        if slot
            .failed_at
            .is_some_and(|failed_at| failed_at.elapsed() < RECONNECT_PAUSE)
        {
            return Err(LockError::unavailable(
                "ZooKeeper could not be reached a moment ago",
            ));
        }
        let connecting = Client::connector()
            .with_session_timeout(self.options.session)
            .with_connection_timeout(self.op_timeout)
            .connect(&self.cluster);
        // Bounded by the op timeout alone, so a failure is the ensemble's, not a caller's
        // short deadline; the caller gives up at its deadline all the same.
        let connected = match deadline {
            Some(deadline) => timeout_at(deadline, self.request(None, connecting))
                .await
                .map_err(|_| LockError::unavailable("ZooKeeper: still connecting"))?,
            None => self.request(None, connecting).await,
        };
        let client = match connected {
            Ok(client) => client,
            Err(failure) => {
                slot.failed_at = Some(Instant::now());
                return Err(failure.into());
            }
        };
        let session = self.start_session(client);
        *slot = SessionSlot {
            current: Some(session.clone()),
            failed_at: None,
        };
        Ok(session)
    }

    /// A session just connected: watches its state, starts its cleaner of leftover nodes,
    /// and notes the timeout the server granted.
    fn start_session(&self, client: Client) -> Session {
        let health = Arc::new(SessionHealth {
            connected: AtomicBool::new(true),
            ended: AtomicBool::new(false),
        });
        tokio::spawn(watch_session(
            client.state_watcher(),
            health.clone(),
            self.closing.clone(),
        ));
        let (leftovers, to_clean) = mpsc::unbounded_channel();
        tokio::spawn(clean_up(
            client.clone(),
            health.clone(),
            to_clean,
            self.op_timeout,
            self.closing.clone(),
        ));
        let timeout = client.session_timeout();
        self.granted_timeout_ms.store(
            u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        Session {
            client,
            health,
            timeout,
            leftovers,
        }
    }

    fn known_parents(&self) -> MutexGuard<'_, HashSet<String>> {
        // Inserts and removes cannot leave the set inconsistent.
        self.parents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Creates the key's parent (and the root above it) once.
    async fn ensure_parent(
        &self,
        client: &Client,
        parent: &str,
        deadline: Option<Instant>,
    ) -> Result<(), LockError> {
        if self.known_parents().contains(parent) {
            return Ok(());
        }
        self.request(deadline, client.mkdir(parent, &PERSISTENT))
            .await?;
        let mut known = self.known_parents();
        if known.len() >= MAX_KNOWN_PARENTS {
            known.clear();
        }
        known.insert(parent.to_owned());
        Ok(())
    }

    /// Creates our lock node under `parent`; if the parent was deleted since it was
    /// remembered (by hand, or a wipe), creates it again and retries once.
    async fn create_node(
        &self,
        client: &Client,
        parent: &str,
        tag: &str,
        note: &str,
        deadline: Option<Instant>,
    ) -> Result<(String, zookeeper_client::Stat), LockError> {
        let prefix = format!("{parent}/{NODE_PREFIX}{tag}-");
        let mut retried = false;
        loop {
            let created = client.create(&prefix, note.as_bytes(), &EPHEMERAL_SEQUENTIAL);
            match self.request(deadline, created).await {
                Ok((stat, sequence)) => {
                    return Ok((format!("{NODE_PREFIX}{tag}-{sequence}"), stat));
                }
                Err(failure) if failure.is(&NoNode) && !retried => {
                    retried = true;
                    self.known_parents().remove(parent);
                    self.ensure_parent(client, parent, deadline).await?;
                }
                Err(failure) => return Err(failure.into()),
            }
        }
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

    /// Joins the key's queue: an ephemeral sequential node of ours, its data the note.
    async fn join_queue(&self, session: &Session, ask: &Ask<'_>) -> Result<Place, LockError> {
        let parent = self.parent(ask.key);
        self.ensure_parent(&session.client, &parent, ask.deadline)
            .await?;
        let owner = OwnerToken::random();
        let tag = owner.to_hex();
        // Before the create is sent: if its answer never comes, the node is found by tag.
        let mut node = Queued {
            leftovers: session.leftovers.clone(),
            leftover: Some(Leftover {
                parent: parent.clone(),
                node: Node::Tagged(tag.clone()),
                with_marker: false,
            }),
        };
        let (name, stat) = self
            .create_node(&session.client, &parent, &tag, ask.note, ask.deadline)
            .await?;
        let path = format!("{parent}/{name}");
        node.created(&path);
        Ok(Place {
            parent,
            owner,
            name,
            path,
            czxid: stat.czxid,
            waited_behind: 0,
            node,
        })
    }

    /// We are first in line: the lock is ours once any lock-delay is honoured. The token
    /// is our node's creation zxid plus the key's base.
    async fn grant(
        &self,
        session: Session,
        mut place: Place,
        ask: &Ask<'_>,
        queue: &Queue,
        looked_at: Instant,
    ) -> Result<Option<Lease>, LockError> {
        if !self
            .honour_lock_delay(
                &session.client,
                &place.parent,
                queue.unreleased,
                ask.deadline,
            )
            .await?
        {
            // Held by us, but not usable before the caller gives up: `place` hands it on
            // as it drops.
            return match ask.deadline {
                None => Ok(None),
                Some(_) => Err(ask.timed_out()),
            };
        }
        // The nodes we waited behind were created before ours, so the zxid that created
        // ours — and with the base, which only rises, our token — is above theirs.
        debug_assert!(
            place.czxid > place.waited_behind,
            "our node's czxid {} is not above that of a node ahead of it, {}",
            place.czxid,
            place.waited_behind
        );
        let token = queue.base.saturating_add(place.czxid.max(0).unsigned_abs());
        let deleted = self.watch_own(&session, &place.path).await?;
        place.node.settle();
        // The session is the real lease: the guard must not count on more.
        let lease_ttl = ask.ttl.min(session.timeout / 2);
        let Place { owner, path, .. } = place;
        self.held().insert(
            owner,
            Held {
                session,
                path,
                deleted,
            },
        );
        Ok(Some(Lease::new(
            ask.key,
            owner,
            FencingToken::new(token),
            lease_ttl,
            looked_at,
        )))
    }

    /// Waits until the node ahead of ours (`ahead`, a path) goes — released, given up,
    /// its session ended — or our own session changes; then the queue is looked at again.
    async fn wait_for_predecessor(
        &self,
        session: &Session,
        place: &mut Place,
        ahead: &str,
        ask: &Ask<'_>,
        deadline: Instant,
    ) -> Result<(), LockError> {
        let (exists, watcher) = self
            .request(Some(deadline), session.client.check_and_watch_stat(ahead))
            .await
            .map_err(|failure| {
                if Instant::now() >= deadline {
                    ask.timed_out()
                } else {
                    LockError::from(failure)
                }
            })?;
        let Some(ahead) = exists else {
            return Ok(());
        };
        place.waited_behind = place.waited_behind.max(ahead.czxid);
        tokio::select! {
            _ = watcher.changed() => Ok(()),
            () = sleep_until(deadline) => Err(ask.timed_out()),
        }
    }

    /// Watches our lock node: the flag is set the moment it is deleted.
    async fn watch_own(&self, session: &Session, path: &str) -> Result<Arc<AtomicBool>, LockError> {
        let (exists, watcher) = self
            .request(None, session.client.check_and_watch_stat(path))
            .await?;
        if exists.is_none() {
            return Err(LockError::unavailable(
                "our ZooKeeper node vanished as the lock was granted (the session ended)",
            ));
        }
        let deleted = Arc::new(AtomicBool::new(false));
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

/// Pruning idle keys (see the module docs).
impl ZooKeeperBackend {
    /// The parents under [`locks_node`](Self::locks_node) that are empty and carry no
    /// base, with their child and data versions: a few requests of [`PRUNE_BATCH`] reads.
    async fn empty_parents(&self, client: &Client) -> Result<Vec<(String, i32, i32)>, Failure> {
        let locks = self.locks_node();
        let names = match self.request(None, client.list_children(&locks)).await {
            Ok(names) => names,
            // Nothing was ever locked here.
            Err(failure) if failure.is(&NoNode) => return Ok(Vec::new()),
            Err(failure) => return Err(failure),
        };
        let mut empty = Vec::new();
        for batch in names.chunks(PRUNE_BATCH) {
            let mut reader = client.new_multi_reader();
            let paths: Vec<String> = batch.iter().map(|name| format!("{locks}/{name}")).collect();
            for path in &paths {
                reader.add_get_data(path)?;
            }
            let results = self.request(None, reader.commit()).await?;
            for (path, result) in paths.into_iter().zip(results) {
                // A parent deleted meanwhile answers an error: nothing to prune.
                if let MultiReadResult::Data { data, stat } = result
                    && stat.num_children == 0
                    && parse_base(&data) == 0
                {
                    empty.push((path, stat.cversion, stat.version));
                }
            }
        }
        Ok(empty)
    }

    /// Remembers this pass's empty parents, keeping when each was first seen so if it has
    /// not changed since; returns those seen so for at least `idle_for`, with the data
    /// version their delete is conditioned on.
    fn sighted(&self, empty: Vec<(String, i32, i32)>, idle_for: Duration) -> Vec<(String, i32)> {
        let now = Instant::now();
        let mut sightings = self
            .sightings
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let before = std::mem::take(&mut *sightings);
        let mut idle = Vec::new();
        for (path, cversion, version) in empty {
            let since = before
                .get(&path)
                .filter(|seen| seen.cversion == cversion && seen.version == version)
                .map_or(now, |seen| seen.since);
            if now.saturating_duration_since(since) >= idle_for {
                idle.push((path.clone(), version));
            }
            // Kept even when about to be deleted: a delete that fails for want of an
            // answer is tried again at the next pass.
            sightings.insert(
                path,
                Sighting {
                    cversion,
                    version,
                    since,
                },
            );
        }
        idle
    }

    /// Deletes `idle` parents, each only if still empty with its data unchanged: one
    /// multi-write per batch; a batch that fails because one of them is in use again (or
    /// gone, or raised) is deleted one by one, skipping those. Returns how many went.
    async fn delete_parents(
        &self,
        client: &Client,
        idle: &[(String, i32)],
    ) -> Result<u64, Failure> {
        let mut deleted = 0;
        for batch in idle.chunks(PRUNE_BATCH) {
            let mut writer = client.new_multi_writer();
            for (path, version) in batch {
                writer.add_delete(path, Some(*version))?;
            }
            let committed = async {
                match writer.commit().await {
                    Ok(_) => Ok(true),
                    Err(zookeeper_client::MultiWriteError::OperationFailed { .. }) => Ok(false),
                    Err(zookeeper_client::MultiWriteError::RequestFailed { source }) => Err(source),
                }
            };
            let gone: Vec<&String> = if self.request(None, committed).await? {
                batch.iter().map(|(path, _)| path).collect()
            } else {
                let mut gone = Vec::new();
                for (path, version) in batch {
                    match self
                        .request(None, client.delete(path, Some(*version)))
                        .await
                    {
                        Ok(()) => gone.push(path),
                        // In use again, raised, or deleted by another pass: not ours to go.
                        Err(failure)
                            if failure.is(&NotEmpty)
                                || failure.is(&BadVersion)
                                || failure.is(&NoNode) => {}
                        Err(failure) => return Err(failure),
                    }
                }
                gone
            };
            let mut known = self.known_parents();
            for path in &gone {
                known.remove(path.as_str());
            }
            deleted += u64::try_from(gone.len()).unwrap_or(u64::MAX);
        }
        Ok(deleted)
    }
}

/// Our node in a key's queue, from its create to the grant.
struct Place {
    parent: String,
    owner: OwnerToken,
    /// The node's name under `parent`, and its path.
    name: String,
    path: String,
    /// The zxid that created it: the fencing token, less the key's base.
    czxid: i64,
    /// The highest creation zxid of a node it waited behind: below its own.
    waited_behind: i64,
    /// Cleans the node up unless it became a held lock.
    node: Queued,
}

impl Place {
    /// How many nodes are ahead of ours.
    fn position_in(&self, queue: &Queue) -> Result<usize, LockError> {
        queue
            .names
            .iter()
            .position(|queued| *queued == self.name)
            .ok_or_else(|| {
                LockError::unavailable(
                    "our ZooKeeper node vanished while queued (the session ended)",
                )
            })
    }
}

/// A lock node of ours that is not (yet) a held lock: handed to the session's cleaner when
/// the acquire call ends without a grant — the deadline, an error, a try that found the
/// lock held, or the call dropped — so it never holds up the line.
struct Queued {
    leftovers: mpsc::UnboundedSender<Leftover>,
    leftover: Option<Leftover>,
}

impl Queued {
    /// The create was answered: the node's path is known.
    fn created(&mut self, path: &str) {
        if let Some(leftover) = self.leftover.as_mut() {
            leftover.node = Node::At(path.to_owned());
        }
    }

    /// Granted: the node is a held lock now, not a leftover.
    fn settle(&mut self) {
        self.leftover = None;
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some(leftover) = self.leftover.take() {
            // The cleaner is gone only with its session, and the node with it.
            let _ = self.leftovers.send(leftover);
        }
    }
}

impl Leftover {
    /// Deletes the node (found by tag if its path is unknown), and the marker with it for
    /// a release. A node already gone counts as deleted.
    async fn remove(&self, client: &Client) -> Result<(), zookeeper_client::Error> {
        let paths = match &self.node {
            Node::At(path) => vec![path.clone()],
            Node::Tagged(tag) => match client.get_children(&self.parent).await {
                Ok((children, _)) => children
                    .into_iter()
                    .filter(|name| tagged(name, tag))
                    .map(|name| format!("{}/{name}", self.parent))
                    .collect(),
                Err(NoNode) => return Ok(()),
                Err(error) => return Err(error),
            },
        };
        for path in paths {
            if self.with_marker {
                let mut writer = client.new_multi_writer();
                writer.add_delete(&marker(&self.parent), None)?;
                writer.add_delete(&path, None)?;
                match writer.commit().await {
                    Ok(_) => continue,
                    // The marker or the node is gone: delete what is left of the node.
                    Err(zookeeper_client::MultiWriteError::OperationFailed {
                        source: NoNode,
                        ..
                    }) => {}
                    Err(error) => return Err(error.into()),
                }
            }
            match client.delete(&path, None).await {
                Ok(()) | Err(NoNode) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
}

/// A session's cleaner: retries each leftover delete, backing off, until it succeeds or
/// the session ends (its ephemeral nodes are deleted then anyway).
async fn clean_up(
    client: Client,
    health: Arc<SessionHealth>,
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
            if health.ended.load(Ordering::Acquire) {
                return;
            }
            match tokio::time::timeout(op_timeout, leftover.remove(&client)).await {
                Ok(Ok(())) => break,
                failed => {
                    tracing::warn!(
                        ?leftover,
                        ?failed,
                        "could not delete a ZooKeeper lock node; retrying"
                    );
                }
            }
            tokio::select! {
                () = sleep(pause) => {}
                () = closing.cancelled() => return,
            }
            pause = (pause * 2).min(Duration::from_secs(2));
        }
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
    /// Takes the lock; waits in line until `deadline`, or never when `deadline` is `None`
    /// (then `Ok(None)` when it is held). The recipe's steps: join the queue (a node of
    /// ours), then look at it until we are first — the grant — or, behind others, check
    /// the cap and wait for the node just ahead of ours to go.
    async fn acquire(&self, ask: Ask<'_>) -> Result<Option<Lease>, LockError> {
        if ask.deadline.is_some_and(|deadline| ask.started >= deadline) {
            // Nothing sent, so nothing to clean up.
            return Err(LockError::TimedOut {
                key: ask.key.to_owned(),
                waited: Duration::ZERO,
            });
        }
        let session = self.session(ask.deadline).await?;
        let mut place = self.join_queue(&session, &ask).await?;
        // Once the lock was seen held, running out of time is a wait that timed out, not
        // a store that did not answer.
        let mut seen_held = false;
        loop {
            let looked_at = Instant::now();
            let queue = self
                .queue(&session.client, &place.parent, ask.deadline)
                .await
                .map_err(|failure| match ask.deadline {
                    Some(deadline) if seen_held && Instant::now() >= deadline => ask.timed_out(),
                    _ => failure.into(),
                })?;
            let position = place.position_in(&queue)?;
            if position == 0 {
                return self.grant(session, place, &ask, &queue, looked_at).await;
            }
            let Some(deadline) = ask.deadline else {
                // Trying, not waiting: `place` leaves the queue as it drops.
                return Ok(None);
            };
            if position > self.options.max_waiters {
                return Err(ask.queue_full(self.options.max_waiters));
            }
            seen_held = true;
            let ahead = format!("{}/{}", place.parent, queue.names[position - 1]);
            self.wait_for_predecessor(&session, &mut place, &ahead, &ask, deadline)
                .await?;
        }
    }

    async fn holder_note(&self, key: &str) -> Result<Option<String>, LockError> {
        let session = self.session(None).await?;
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
        // A node whose watch fired is deleted (the delete below finds nothing, and says
        // so); only a session that ended means nothing is left to ask about.
        if held.session.health.ended.load(Ordering::Acquire) {
            return Ok(false);
        }
        let client = &held.session.client;
        let delayed = !self.options.lock_delay.is_zero();
        let parent = held
            .path
            .rsplit_once('/')
            .map_or_else(String::new, |(parent, _)| parent.to_owned());
        let deleted = if delayed {
            // The node and the lock-delay marker go together: a release, not a vanishing.
            let mut writer = client.new_multi_writer();
            let queued = writer
                .add_delete(&marker(&parent), None)
                .and_then(|()| writer.add_delete(&held.path, None));
            match queued {
                Ok(()) => {
                    let committed = async { Ok(writer.commit().await?) };
                    self.request(None, committed).await.map(|_: Vec<_>| ())
                }
                Err(error) => Err(error.into()),
            }
        } else {
            self.request(None, client.delete(&held.path, None)).await
        };
        match deleted {
            Ok(()) => Ok(true),
            // The session ended (the client learns it as it reconnects for this delete):
            // the server deleted its ephemeral nodes with it, so nothing was ours to free.
            Err(failure) if failure.is(&NoNode) || failure.is(&SessionExpired) => Ok(false),
            Err(failure) => {
                // Not known released: the cleaner deletes it once the ensemble answers, so
                // it does not hold the key for as long as this process lives.
                let _ = held.session.leftovers.send(Leftover {
                    parent,
                    node: Node::At(held.path.clone()),
                    with_marker: delayed,
                });
                Err(failure.into())
            }
        }
    }

    async fn extend(&self, lease: &Lease, _ttl: Duration) -> Result<bool, LockError> {
        let held = self.held();
        let Some(held) = held.get(&lease.owner()) else {
            return Ok(false);
        };
        let health = &held.session.health;
        if held.deleted.load(Ordering::Acquire) || health.ended.load(Ordering::Acquire) {
            return Ok(false);
        }
        if !health.connected.load(Ordering::Acquire) {
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
        let session = self.session(None).await?;
        let parent = self.parent(key);
        self.ensure_parent(&session.client, &parent, None).await?;
        let mut recreated = false;
        loop {
            let (data, stat) = match self.request(None, session.client.get_data(&parent)).await {
                Ok(found) => found,
                // Deleted since it was remembered (by hand, or a wipe): create it again.
                Err(failure) if failure.is(&NoNode) && !recreated => {
                    recreated = true;
                    self.known_parents().remove(&parent);
                    self.ensure_parent(&session.client, &parent, None).await?;
                    continue;
                }
                Err(failure) => return Err(failure.into()),
            };
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
        let session = self.session(None).await?;
        self.request(None, session.client.check_stat("/")).await?;
        Ok(())
    }

    /// Deletes the key parents that stayed empty and unchanged between two passes at
    /// least `idle_for` apart (the first pass only takes note). Lock nodes are ephemeral,
    /// so an empty parent has no holder and no waiter; tokens are zxids, which only grow,
    /// so a key locked again after its parent went still gets a larger token. Parents
    /// that carry a raised base are kept: without it tokens would fall back below the
    /// floor it was raised to.
    async fn prune_idle(&self, idle_for: Duration) -> Result<u64, LockError> {
        let session = self.session(None).await?;
        let empty = self.empty_parents(&session.client).await?;
        let idle = self.sighted(empty, idle_for);
        Ok(self.delete_parents(&session.client, &idle).await?)
    }

    fn sessions(&self) -> Sessions {
        Sessions::PerProcess {
            timeout: Duration::from_millis(self.granted_timeout_ms.load(Ordering::Relaxed)),
        }
    }
}
