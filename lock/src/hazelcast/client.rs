//! One connection at a time to a Hazelcast cluster ("unisocket": every member runs a CP
//! request by handing it to its group's Raft leader, so one connection reaches them all).
//! A connection opens with the protocol's `CP2` preamble and `Client.authentication`;
//! then requests go out through one writer task and answers come back through one reader
//! task, matched to their callers by correlation id. When the connection breaks, the next
//! call connects to the next member of the list.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use super::codec::{self, ServerError};
use super::frame::{Assembler, FRAME_HEADER, Frame, Malformed, Message, Request, Uuid};

/// How long after a failed connect callers are answered at once, without a new attempt
/// (so a cluster that is down costs each caller nothing, not a connect timeout each).
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// How often an idle connection says it lives: members close a client connection silent
/// for their heartbeat timeout (60 s by default).
const PING_EVERY: Duration = Duration::from_secs(10);

/// Why a call has no answer to give.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// No answer came: no member could be reached, or the answer did not come in time.
    /// Whether a request that went out took effect is unknown.
    #[error("{0}")]
    NoAnswer(String),
    /// The connection broke before the answer came (the next call connects again).
    /// Whether a request that went out took effect is unknown.
    #[error("{0}")]
    Broken(String),
    /// The member answered with an error.
    #[error("Hazelcast error {}: {} ({})", .0.code, .0.message.as_deref().unwrap_or(""), .0.class_name)]
    Server(ServerError),
    #[error(transparent)]
    Malformed(#[from] Malformed),
}

impl CallError {
    /// The member's error code, when it answered with one.
    pub(crate) fn code(&self) -> Option<i32> {
        match self {
            Self::Server(error) => Some(error.code),
            _ => None,
        }
    }
}

/// Answers waited for, by correlation id.
type Pending = Arc<Mutex<HashMap<i64, oneshot::Sender<Message>>>>;

/// One authenticated connection to a member.
#[derive(Debug)]
struct Connection {
    outgoing: mpsc::UnboundedSender<Vec<u8>>,
    pending: Pending,
    next_correlation: AtomicI64,
    /// Cancelled once the connection broke (or the client went).
    closed: CancellationToken,
    /// The cluster it authenticated with.
    cluster: Option<Uuid>,
}

impl Connection {
    fn is_open(&self) -> bool {
        !self.closed.is_cancelled()
    }

    async fn call(&self, request: &Request, limit: Duration) -> Result<Message, CallError> {
        let correlation = self.next_correlation.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        lock(&self.pending).insert(correlation, answer);
        // Removes the entry however the wait ends (answered, timed out, or dropped).
        let _forget = Forget {
            pending: &self.pending,
            correlation,
        };
        if self.outgoing.send(request.encode(correlation)).is_err() {
            return Err(CallError::Broken("the connection is closed".to_owned()));
        }
        let message = match timeout(limit, answered).await {
            Ok(Ok(message)) => message,
            Ok(Err(_)) => {
                return Err(CallError::Broken(
                    "the connection broke before the answer".to_owned(),
                ));
            }
            Err(_) => {
                return Err(CallError::NoAnswer(format!("no answer within {limit:?}")));
            }
        };
        if message.message_type() == codec::ERROR {
            return Err(CallError::Server(codec::server_error(&message)?));
        }
        if message.message_type() != request.message_type() + 1 {
            return Err(CallError::Malformed(Malformed(format!(
                "answer of type {:#08x} to a request of type {:#08x}",
                message.message_type(),
                request.message_type()
            ))));
        }
        Ok(message)
    }
}

struct Forget<'a> {
    pending: &'a Pending,
    correlation: i64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.pending).remove(&self.correlation);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The connection slot: the current connection, the member to try next, and when
/// connecting last failed.
#[derive(Debug, Default)]
struct Slot {
    current: Option<Arc<Connection>>,
    next_member: usize,
    failed_at: Option<Instant>,
}

/// A client of one cluster. Cheap to share; the connection is made on first use.
#[derive(Debug)]
pub(crate) struct Client {
    /// `host:port` of each member to try, in turn.
    members: Vec<String>,
    cluster_name: String,
    /// This client's id and name, as the members list it.
    id: Uuid,
    name: String,
    /// Bounds connecting and authenticating.
    connect_timeout: Duration,
    slot: tokio::sync::Mutex<Slot>,
    /// The cluster id of the last connection: when a new connection finds another, every
    /// member restarted, and the CP state (groups, sessions, locks) is new.
    cluster: Mutex<Option<Uuid>>,
    /// Counts the clusters seen: callers that cached CP state compare it.
    generation: AtomicU64,
    /// Requests sent, for benchmarks and tests.
    requests: AtomicU64,
    closing: CancellationToken,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.closing.cancel();
    }
}

impl Client {
    pub(crate) fn new(
        members: Vec<String>,
        cluster_name: String,
        connect_timeout: Duration,
    ) -> Self {
        let id = (rand::random::<u64>(), rand::random::<u64>());
        Self {
            members,
            cluster_name,
            id,
            name: format!("payonce-{:016x}", id.0),
            connect_timeout,
            slot: tokio::sync::Mutex::default(),
            cluster: Mutex::new(None),
            generation: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            closing: CancellationToken::new(),
        }
    }

    /// The name this client gives its CP sessions.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Requests sent so far.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// How many times the cluster was found new (all members restarted): CP state cached
    /// under an older generation is gone.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Sends `request` and waits up to `limit` for its answer.
    pub(crate) async fn call(
        &self,
        request: &Request,
        limit: Duration,
    ) -> Result<Message, CallError> {
        let connection = self.connection().await?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        connection.call(request, limit).await
    }

    async fn connection(&self) -> Result<Arc<Connection>, CallError> {
        let mut slot = self.slot.lock().await;
        if let Some(connection) = slot.current.as_ref().filter(|c| c.is_open()) {
            return Ok(connection.clone());
        }
        if let Some(failed_at) = slot.failed_at
            && failed_at.elapsed() < RECONNECT_PAUSE
        {
            return Err(CallError::NoAnswer(format!(
                "no Hazelcast member of {} could be reached a moment ago",
                self.members.join(",")
            )));
        }
        let mut last_error = String::new();
        for _ in 0..self.members.len() {
            let member = &self.members[slot.next_member % self.members.len()];
            match timeout(self.connect_timeout, self.connect(member)).await {
                Ok(Ok(connection)) => {
                    let connection = Arc::new(connection);
                    self.note_cluster(connection.cluster);
                    slot.current = Some(connection.clone());
                    slot.failed_at = None;
                    return Ok(connection);
                }
                Ok(Err(error)) => last_error = format!("{member}: {error}"),
                Err(_) => {
                    last_error =
                        format!("{member}: no connection within {:?}", self.connect_timeout)
                }
            }
            slot.next_member = slot.next_member.wrapping_add(1);
        }
        slot.failed_at = Some(Instant::now());
        Err(CallError::NoAnswer(format!(
            "no Hazelcast member answers (last: {last_error})"
        )))
    }

    fn note_cluster(&self, cluster: Option<Uuid>) {
        let mut known = lock(&self.cluster);
        if known.is_some() && *known != cluster {
            self.generation.fetch_add(1, Ordering::AcqRel);
            tracing::warn!("the Hazelcast cluster is a new one: its CP state was lost");
        }
        *known = cluster;
    }

    async fn connect(&self, member: &str) -> Result<Connection, CallError> {
        let no_answer = |error: std::io::Error| CallError::NoAnswer(error.to_string());
        let stream = TcpStream::connect(member).await.map_err(no_answer)?;
        stream.set_nodelay(true).map_err(no_answer)?;
        let (mut reader, mut writer) = stream.into_split();
        writer.write_all(b"CP2").await.map_err(no_answer)?;
        let hello = codec::authentication(&self.cluster_name, self.id, &self.name);
        writer
            .write_all(&hello.encode(0))
            .await
            .map_err(no_answer)?;
        let answer = read_message(&mut reader, &mut Assembler::default())
            .await
            .map_err(|error| CallError::NoAnswer(error.to_string()))?;
        if answer.message_type() == codec::ERROR {
            return Err(CallError::Server(codec::server_error(&answer)?));
        }
        let authenticated = codec::authenticated(&answer)?;
        if authenticated.status != 0 {
            return Err(CallError::NoAnswer(format!(
                "the member refused to authenticate (status {}: cluster name {:?} refused, or a version it does not take)",
                authenticated.status, self.cluster_name
            )));
        }
        tracing::debug!(member, version = %authenticated.server_version, "connected to Hazelcast");
        let (outgoing, queued) = mpsc::unbounded_channel();
        let pending = Pending::default();
        let closed = self.closing.child_token();
        tokio::spawn(read_answers(reader, pending.clone(), closed.clone()));
        tokio::spawn(write_requests(writer, queued, closed.clone()));
        tokio::spawn(keep_alive(outgoing.clone(), closed.clone()));
        Ok(Connection {
            outgoing,
            pending,
            next_correlation: AtomicI64::new(1),
            closed,
            cluster: authenticated.cluster,
        })
    }
}

/// Reads one whole message.
async fn read_message(
    reader: &mut OwnedReadHalf,
    assembler: &mut Assembler,
) -> std::io::Result<Message> {
    loop {
        let mut header = [0; FRAME_HEADER];
        reader.read_exact(&mut header).await?;
        let (length, flags) = super::frame::frame_header(header).map_err(std::io::Error::other)?;
        let mut payload = vec![0; length];
        reader.read_exact(&mut payload).await?;
        if let Some(message) = assembler
            .push(Frame { flags, payload })
            .map_err(std::io::Error::other)?
        {
            return Ok(message);
        }
    }
}

/// Hands each answer to its caller until the connection breaks; then every caller still
/// waiting learns it (their senders are dropped).
async fn read_answers(mut reader: OwnedReadHalf, pending: Pending, closed: CancellationToken) {
    let mut assembler = Assembler::default();
    loop {
        let message = tokio::select! {
            () = closed.cancelled() => break,
            message = read_message(&mut reader, &mut assembler) => message,
        };
        match message {
            Ok(message) if message.is_event() => {}
            Ok(message) => {
                if let Some(caller) = lock(&pending).remove(&message.correlation()) {
                    let _ = caller.send(message);
                }
            }
            Err(error) => {
                tracing::debug!(%error, "Hazelcast connection closed");
                break;
            }
        }
    }
    closed.cancel();
    lock(&pending).clear();
}

/// Writes requests in the order they were sent, as many as are queued per flush.
async fn write_requests(
    writer: OwnedWriteHalf,
    mut queued: mpsc::UnboundedReceiver<Vec<u8>>,
    closed: CancellationToken,
) {
    let mut writer = BufWriter::new(writer);
    loop {
        let bytes = tokio::select! {
            () = closed.cancelled() => break,
            bytes = queued.recv() => bytes,
        };
        let Some(bytes) = bytes else { break };
        let mut written = writer.write_all(&bytes).await;
        while written.is_ok()
            && let Ok(more) = queued.try_recv()
        {
            written = writer.write_all(&more).await;
        }
        if written.is_err() || writer.flush().await.is_err() {
            break;
        }
    }
    closed.cancel();
    let _ = writer.shutdown().await;
}

/// Pings now and then, so the member never takes the connection for a dead one.
async fn keep_alive(outgoing: mpsc::UnboundedSender<Vec<u8>>, closed: CancellationToken) {
    // Correlation ids of pings count down from -1, apart from the callers' (which count
    // up from 1); their answers find no caller and are dropped.
    let mut correlation = -1_i64;
    loop {
        tokio::select! {
            () = closed.cancelled() => return,
            () = tokio::time::sleep(PING_EVERY) => {}
        }
        if outgoing.send(codec::ping().encode(correlation)).is_err() {
            return;
        }
        correlation -= 1;
    }
}
