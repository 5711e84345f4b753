//! Bells: how work queued in the outbox wakes the workers that do it, in this process and
//! in every other instance on the same database — so idle workers sleep instead of polling.
//!
//! [`Bells::ring`] is called after a commit that queued jobs of a kind. It wakes one of
//! this process's waiting workers of that kind at once, and on PostgreSQL it sends a
//! notification on [`CHANNEL`] (`pg_notify`, in a statement of its own after the commit:
//! inside the money's transaction, a NOTIFY would take PostgreSQL's notification lock at
//! every commit, and commits that notify are serialised on it). Rings are coalesced per
//! kind — while one notification is being sent, any number of rings make one more — so a
//! burst of commits costs a statement per round trip, not one each.
//!
//! [`Bells::rung`] is what a worker waits on. The first wait starts the listener: one
//! pooled connection that `LISTEN`s on the channel and wakes this process's workers for
//! what other instances queued (its own notifications, recognised by the sender's mark in
//! the payload, are ignored: they were rung here already). When the listener's connection
//! is lost, it reconnects and wakes every kind: notifications sent meanwhile are gone.
//!
//! A bell is a hint, never the only way work is found: a worker that hears nothing still
//! looks on its poll interval, and sleeps no longer than until the next job it knows of
//! is due (a retry, a backoff).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, mpsc, oneshot};

/// The notification channel every instance listens on.
pub const CHANNEL: &str = "payonce_outbox";

/// A kind of outbox job, each with its own workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobKind {
    /// A payout to send to the bank.
    Payout,
    /// A webhook delivery.
    Webhook,
}

impl JobKind {
    /// Every kind.
    pub const ALL: [Self; 2] = [Self::Payout, Self::Webhook];

    /// The kind's name, as the outbox stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Payout => "payout",
            Self::Webhook => "webhook",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Self::Payout => 0,
            Self::Webhook => 1,
        }
    }
}

/// The bells of one ledger handle (and its clones).
#[derive(Debug)]
pub(crate) struct Bells {
    /// This process's waiting workers, per kind.
    here: [Notify; 2],
    /// Where the instances are told, on PostgreSQL.
    elsewhere: Option<Elsewhere>,
}

#[derive(Debug)]
struct Elsewhere {
    pool: PgPool,
    /// Marks this handle's notifications, so its own listener can skip them.
    sender: String,
    /// Per kind: a notification is wanted and not yet taken by the ringer.
    wanted: Arc<[AtomicBool; 2]>,
    to_ringer: mpsc::UnboundedSender<JobKind>,
    /// Dropped with the handle: the listener stops and gives its connection back.
    _stop_listening: oneshot::Sender<()>,
    /// What the listener stops on; taken when the first worker waits, which starts it.
    stopped: std::sync::Mutex<Option<oneshot::Receiver<()>>>,
}

impl Bells {
    /// Bells for a ledger alone on its database (SQLite: one process): this process only.
    pub(crate) fn here_only() -> Self {
        Self {
            here: [Notify::new(), Notify::new()],
            elsewhere: None,
        }
    }

    /// Bells that reach every instance on `pool`'s PostgreSQL database too.
    pub(crate) fn on_postgres(pool: PgPool) -> Arc<Self> {
        let (to_ringer, queued) = mpsc::unbounded_channel();
        let wanted = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        // A mark no other handle is likely to draw.
        let sender = format!("{:016x}", rand::random::<u64>());
        tokio::spawn(ring_elsewhere(
            pool.clone(),
            sender.clone(),
            Arc::clone(&wanted),
            queued,
        ));
        let (stop_listening, stopped) = oneshot::channel();
        Arc::new(Self {
            here: [Notify::new(), Notify::new()],
            elsewhere: Some(Elsewhere {
                pool,
                sender,
                wanted,
                to_ringer,
                _stop_listening: stop_listening,
                stopped: std::sync::Mutex::new(Some(stopped)),
            }),
        })
    }

    /// Work of `kind` was queued: wakes a worker here, and tells the other instances.
    pub(crate) fn ring(&self, kind: JobKind) {
        self.wake_here(kind);
        if let Some(elsewhere) = &self.elsewhere
            && !elsewhere.wanted[kind.index()].swap(true, Ordering::AcqRel)
        {
            // The ringer ends only with the handle, which is ringing now.
            let _ = elsewhere.to_ringer.send(kind);
        }
    }

    /// Waits until work of `kind` may have been queued, here or by another instance.
    pub(crate) async fn rung(self: &Arc<Self>, kind: JobKind) {
        if let Some(elsewhere) = &self.elsewhere {
            let stopped = elsewhere
                .stopped
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(stopped) = stopped {
                tokio::spawn(listen(
                    elsewhere.pool.clone(),
                    elsewhere.sender.clone(),
                    Arc::downgrade(self),
                    stopped,
                ));
            }
        }
        self.here[kind.index()].notified().await;
    }

    /// Wakes one more of this process's waiting workers of `kind` (or the next to wait).
    pub(crate) fn wake_here(&self, kind: JobKind) {
        self.here[kind.index()].notify_one();
    }

    /// Wakes a worker of every kind here: what was sent while nobody listened is gone.
    fn wake_every_kind_here(&self) {
        JobKind::ALL
            .into_iter()
            .for_each(|kind| self.wake_here(kind));
    }
}

/// Sends the notifications rung, one per kind at a time; ends with the handle.
async fn ring_elsewhere(
    pool: PgPool,
    sender: String,
    wanted: Arc<[AtomicBool; 2]>,
    mut queued: mpsc::UnboundedReceiver<JobKind>,
) {
    while let Some(kind) = queued.recv().await {
        // Taken before the statement: a ring while it runs queues one more.
        wanted[kind.index()].store(false, Ordering::Release);
        let payload = format!("{} {sender}", kind.as_str());
        let sent = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(&payload)
            .execute(&pool)
            .await;
        if let Err(error) = sent {
            // The other instances find the work on their poll instead.
            tracing::debug!(%error, kind = kind.as_str(), "cannot notify the other instances");
        }
    }
}

/// Listens on one pooled connection until the handle is dropped or the pool closes,
/// waking this process's workers for what other instances queued.
async fn listen(
    pool: PgPool,
    sender: String,
    bells_weak: std::sync::Weak<Bells>,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut listener: Option<PgListener> = None;
    loop {
        let heard = async {
            let listening = match listener.as_mut() {
                Some(listening) => listening,
                None => {
                    let mut connected = PgListener::connect_with(&pool).await?;
                    connected.listen(CHANNEL).await?;
                    // Work queued before this connection listened was never heard.
                    listener.insert(connected)
                }
            }
            .try_recv()
            .await?;
            Ok::<_, sqlx::Error>(listening)
        };
        let heard = tokio::select! {
            _ = &mut stopped => return,
            heard = heard => heard,
        };
        let Some(bells) = bells_weak.upgrade() else {
            return;
        };
        match heard {
            Ok(Some(notification)) => {
                let mut words = notification.payload().split(' ');
                let kind = words.next().and_then(JobKind::parse);
                if let Some(kind) = kind
                    && words.next() != Some(sender.as_str())
                {
                    bells.wake_here(kind);
                }
            }
            // The connection was lost (and made again).
            Ok(None) => bells.wake_every_kind_here(),
            Err(sqlx::Error::PoolClosed) => return,
            Err(error) => {
                tracing::debug!(%error, "cannot listen for other instances' work; trying again");
                listener = None;
                drop(bells);
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                let Some(bells) = bells_weak.upgrade() else {
                    return;
                };
                bells.wake_every_kind_here();
            }
        }
    }
}
