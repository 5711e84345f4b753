//! The payonce HTTP service.
//!
//! # Map
//! - `main.rs`: the binary — parses [`config::Cli`] and runs [`commands::run`], which
//!   serves, audits or reconciles.
//! - [`serve`] (this file): runs the app on a listener until the shutdown future completes,
//!   with the reaper, the auditor and the holds' sweeper beside it. Tests call it with a
//!   port-0 listener.
//! - `config/`: flags and environment variables, the mode they select, the start-up
//!   report generated from them; the sections of settings live beside their subsystems
//!   (`config/lock.rs`, `config/ledger.rs`, `limits/config.rs`, `payouts/config.rs`,
//!   `webhooks/config.rs`, `config/telemetry.rs`).
//! - `state.rs`: [`state::AppState`] — ledger, locks, settings, metrics.
//! - `routes/`: the router and its OpenAPI document (`mod.rs`), with the error answers
//!   many operations share (`responses.rs`); accounts, tickets, the
//!   spends and their idempotency protocol (`spends.rs`), holds and refunds (`holds.rs`,
//!   spends too), and the service endpoints.
//! - `auth.rs`: who sends a request — the caller's account by its key (`Caller`,
//!   `OwnAccount`), the operator key, and what a wrong key costs; `extract.rs`: the
//!   client's address, path ids, `Idempotency-Key`, JSON bodies.
//! - `limits.rs`: rate limits per client address and per account; `flights.rs`: the
//!   tickets this instance is executing, so duplicates wait for the original locally.
//! - `payouts.rs`: the workers that send payouts to the bank, one key per payout, and
//!   record its word; `reconcile.rs`: `payonce reconcile`, the payouts against the bank;
//!   `bank_fault.rs`: the fault a payout may ask of the embedded mode's demonstration
//!   bank, carried on its first attempt; `retry_after.rs`: the wait a bank or a webhook
//!   receiver asks for.
//! - `webhooks/`: the workers that deliver each committed outcome's event to the
//!   endpoints that want it, signed as the Standard Webhooks specification has it; the
//!   secrets sealed at rest; the SSRF guard.
//! - `render.rs`: the bodies stored under tickets, and a payout as the contract shows it;
//!   `error.rs`: every error as problem+json; `metrics.rs`: Prometheus metrics;
//!   `telemetry.rs`: log lines (text or JSON) and traces (OpenTelemetry, exported over
//!   OTLP when configured, W3C trace context in and out).
//! - `demo.rs`, with the cargo feature `demo` only: the demonstration — the unsafe lock
//!   strategies' read-check-write path (reachable by configuration or, under
//!   `PAYONCE_DEMO`, per request) and the injectable faults. A build without the feature
//!   injects no fault of payonce's own and refuses `PAYONCE_DEMO=true` at start-up (the
//!   one fault it carries is a payout's to the demonstration bank in its own process,
//!   `bank_fault.rs`).

pub mod auth;
pub mod bank_fault;
pub mod commands;
pub mod config;
#[cfg(feature = "demo")]
pub mod demo;
pub mod error;
pub mod extract;
pub mod flights;
pub mod limits;
pub mod metrics;
pub mod payouts;
pub mod reconcile;
pub mod render;
mod retry_after;
pub mod routes;
pub mod state;
pub mod telemetry;
pub mod webhooks;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::Request;
use futures::future::BoxFuture;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::state::{AppState, Settings};

/// Serves the API on `listener` until `shutdown` completes, then lets in-flight requests
/// finish. Reaps expired tickets and old outcomes every `reap_interval` meanwhile, audits
/// the ledger every `audit_every`, records holds past their expiry every `hold_sweep`, and
/// forgets the rate limits of clients gone quiet.
pub fn serve(
    listener: TcpListener,
    state: AppState,
    request_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> BoxFuture<'static, std::io::Result<()>> {
    serving(listener, state, request_timeout, Box::pin(shutdown))
}

/// Boxed so that the server's state machine is compiled here once: an `async fn`'s is
/// compiled again in every crate that awaits it (the binary and each test crate would
/// compile the whole stack — hyper, the router, the workers — once more).
#[inline(never)]
fn serving(
    listener: TcpListener,
    state: AppState,
    request_timeout: Duration,
    shutdown: Shutdown,
) -> BoxFuture<'static, std::io::Result<()>> {
    Box::pin(serve_until(listener, state, request_timeout, shutdown))
}

/// A future to wait for, of one type whatever the caller's.
type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

async fn serve_until(
    listener: TcpListener,
    state: AppState,
    request_timeout: Duration,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    let stopping = CancellationToken::new();
    let reaper = tokio::spawn(reap(state.clone(), stopping.clone()));
    let forgetter = tokio::spawn(forget_idle_clients(state.clone(), stopping.clone()));
    let dispatcher = tokio::spawn(dispatch_payouts(state.clone(), stopping.clone()));
    let deliverer = tokio::spawn(dispatch_webhooks(state.clone(), stopping.clone()));
    let auditor = tokio::spawn(audit(state.clone(), stopping.clone()));
    let sweeper = tokio::spawn(sweep_holds(state.clone(), stopping.clone()));
    let settings = state.settings().clone();
    let app = routes::app(state, request_timeout);
    let served = accept(listener, app, &settings, shutdown).await;
    stopping.cancel();
    let _ = tokio::join!(reaper, forgetter, dispatcher, deliverer, auditor, sweeper);
    served
}

/// Accepts connections — at most `max_connections` open at once: past it, the next one
/// waits in the listen backlog — and serves each with HTTP/1.1 under a timer: a client
/// that sends its request head too slowly, or leaves a keep-alive connection idle too
/// long, is disconnected after `header_read_timeout`, so slow clients cannot hold
/// connections forever. (HTTP/2 is not offered: an idle HTTP/2 connection answers pings
/// and stays open, which would break that promise; a proxy in front may speak it.)
async fn accept(
    listener: TcpListener,
    app: Router,
    settings: &Settings,
    mut shutdown: Shutdown,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(settings.max_connections));
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout);
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            permit = Arc::clone(&connections).acquire_owned() => permit.map_err(std::io::Error::other)?,
        };
        let (socket, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: wait a moment rather than spin.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Answers are small and latency matters: no Nagle delay on client sockets.
        if let Err(error) = socket.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        let service = app.clone().map_request(move |mut request: Request<_>| {
            request
                .extensions_mut()
                .insert(ConnectInfo::<SocketAddr>(peer));
            request
        });
        let connection = builder
            .serve_connection(TokioIo::new(socket), TowerToHyperService::new(service))
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, %peer, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    // Finishes in-flight requests and closes idle connections.
    graceful.shutdown().await;
    Ok(())
}

/// The name this instance's workers claim payouts and deliveries under: its
/// `Payonce-Instance` name.
fn worker_name(state: &AppState) -> String {
    state
        .settings()
        .instance
        .to_str()
        .unwrap_or("payonce")
        .to_owned()
}

/// The payout workers (`payouts.rs`), until `stopping`. Nothing where the instance has no
/// bank.
async fn dispatch_payouts(state: AppState, stopping: CancellationToken) {
    let Some(payouts) = state.payouts().cloned() else {
        return;
    };
    payouts::dispatch(
        state.ledger().clone(),
        payouts,
        state.shared_metrics(),
        worker_name(&state),
        stopping,
    )
    .await;
}

/// The webhook deliveries (`webhooks/`), until `stopping`.
async fn dispatch_webhooks(state: AppState, stopping: CancellationToken) {
    let Some(webhooks) = state.webhooks().cloned() else {
        return;
    };
    webhooks::dispatch(
        state.ledger().clone(),
        webhooks,
        state.shared_metrics(),
        worker_name(&state),
        stopping,
    )
    .await;
}

/// Rate limits of clients that went quiet are forgotten, so the limiters stay small.
async fn forget_idle_clients(state: AppState, stopping: CancellationToken) {
    loop {
        tokio::select! {
            () = stopping.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
        state.limits().forget_idle();
    }
}

/// Records the holds past their expiry as expired every `hold_sweep`: each released, with
/// its `hold.expired` event showing the hold as `GET /v1/holds/{hold_id}` does. Every
/// instance sweeps; the ledger expires each hold once, and skips one a capture or a void
/// is deciding.
async fn sweep_holds(state: AppState, stopping: CancellationToken) {
    let every = state.settings().hold_sweep;
    if every.is_zero() {
        return;
    }
    let show = |hold: &ledger::holds::Hold| {
        serde_json::to_value(render::hold_view(hold)).unwrap_or_default()
    };
    loop {
        tokio::select! {
            () = stopping.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match state.ledger().expire_holds(500, &show).await {
            Ok(0) => {}
            Ok(expired) => {
                tracing::debug!(expired, "recorded holds expired");
                state.metrics().holds_expired(expired);
            }
            Err(error) => tracing::warn!(%error, "sweeping expired holds failed; will retry"),
        }
    }
}

/// Audits the whole ledger every `audit_every`, for `payonce_audit_violations`: the one
/// metric that says money is safe rather than that things look normal. A violation is
/// logged with its rule and numbers, as `payonce audit` prints it.
async fn audit(state: AppState, stopping: CancellationToken) {
    let every = state.settings().audit_every;
    if every.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            () = stopping.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match state.ledger().audit().await {
            Ok(violations) => {
                for violation in &violations {
                    tracing::error!(
                        rule = ?violation.rule,
                        account_id = ?violation.account_id,
                        ticket_id = ?violation.ticket_id,
                        detail = %violation.detail,
                        "the ledger audit found a broken invariant"
                    );
                }
                state.metrics().audited(violations.len());
            }
            Err(error) => tracing::warn!(%error, "the ledger audit could not run; will retry"),
        }
    }
}

async fn reap(state: AppState, stopping: CancellationToken) {
    let settings = state.settings().clone();
    loop {
        tokio::select! {
            () = stopping.cancelled() => return,
            () = tokio::time::sleep(settings.reap_interval) => {}
        }
        match state.ledger().reap(settings.retention, 1000).await {
            Ok(reaped) if reaped != ledger::Reaped::default() => {
                tracing::info!(
                    deleted_unused = reaped.deleted_unused,
                    pruned_outcomes = reaped.pruned_outcomes,
                    expired_creations = reaped.expired_creations,
                    "reaped tickets and creation records"
                );
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "reaping failed; will retry"),
        }
        match state
            .ledger()
            .reap_finished_jobs(settings.delivery_retention, 1000)
            .await
        {
            Ok(0) => {}
            Ok(deliveries) => tracing::info!(deliveries, "reaped ended webhook deliveries"),
            Err(error) => tracing::warn!(%error, "reaping deliveries failed; will retry"),
        }
        match state.locks().prune_idle(settings.lock_idle).await {
            Ok(0) => {}
            Ok(forgotten) => tracing::info!(forgotten, "pruned idle lock keys"),
            Err(error) => tracing::warn!(%error, "pruning lock keys failed; will retry"),
        }
    }
}
