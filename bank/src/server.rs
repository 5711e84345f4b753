//! The accept loop: it serves each connection itself (not `axum::serve`) because two
//! faults act on connections — `commit-then-drop` closes one without an answer
//! ([`ConnectionKill`]), and `down` closes the listener and every connection, then
//! listens again on the same address after a while.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Closes the connection a request came on, without another byte: every request carries
/// its connection's in its extensions.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionKill(CancellationToken);

impl ConnectionKill {
    /// Drops the connection (the request's handler is dropped with it).
    pub(crate) fn drop_connection(&self) {
        self.0.cancel();
    }
}

/// A running bank: its address, and the way to stop it.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    /// Cancels the accept loop and, through child tokens, every connection.
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl ServerHandle {
    /// The address the bank listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening and closes every connection (answers in flight are dropped).
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        if let Err(error) = self.task.await {
            tracing::error!(%error, "the accept loop failed");
        }
    }
}

/// Starts the accept loop on `listener`.
pub(crate) fn spawn(
    listener: TcpListener,
    router: Router,
    down: mpsc::Receiver<()>,
    down_for: Duration,
) -> std::io::Result<ServerHandle> {
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run(
        listener,
        addr,
        router,
        down,
        down_for,
        shutdown.clone(),
    ));
    Ok(ServerHandle {
        addr,
        shutdown,
        task,
    })
}

/// Why [`listen_until_down`] returned.
enum Stopped {
    Down,
    Shutdown,
}

async fn run(
    listener: TcpListener,
    addr: SocketAddr,
    router: Router,
    mut down: mpsc::Receiver<()>,
    down_for: Duration,
    shutdown: CancellationToken,
) {
    let mut listener = listener;
    loop {
        if let Stopped::Shutdown = listen_until_down(listener, &router, &mut down, &shutdown).await
        {
            return;
        }
        tracing::warn!(?down_for, "down: refusing connections");
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(down_for) => {}
        }
        // A `down` drawn by a request that was in flight when the bank went down is
        // the same outage.
        while down.try_recv().is_ok() {}
        listener = loop {
            match TcpListener::bind(addr).await {
                Ok(listener) => break listener,
                Err(error) => {
                    tracing::warn!(%error, %addr, "cannot listen again yet");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
            }
        };
        tracing::info!(%addr, "up again");
    }
}

/// Accepts connections until a `down` or the shutdown; then closes the listener first
/// (new connections are refused from then on) and every connection it accepted after.
async fn listen_until_down(
    listener: TcpListener,
    router: &Router,
    down: &mut mpsc::Receiver<()>,
    shutdown: &CancellationToken,
) -> Stopped {
    let connections = shutdown.child_token();
    let stopped = loop {
        tokio::select! {
            () = shutdown.cancelled() => break Stopped::Shutdown,
            Some(()) = down.recv() => break Stopped::Down,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(serve_connection(stream, router.clone(), connections.child_token()));
                }
                Err(error) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    };
    drop(listener);
    connections.cancel();
    stopped
}

/// Serves one connection until it ends or `kill` fires; on `kill` the connection is
/// dropped as it stands — no response, not even a partial one.
async fn serve_connection(stream: TcpStream, router: Router, kill: CancellationToken) {
    let _ = stream.set_nodelay(true);
    let for_requests = ConnectionKill(kill.clone());
    let service = tower::service_fn(move |mut request: Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(for_requests.clone());
        let router = router.clone();
        async move { router.oneshot(request).await }
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let connection =
        builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    tokio::select! {
        result = connection => {
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended with an error");
            }
        }
        () = kill.cancelled() => {}
    }
}
