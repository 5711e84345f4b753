//! The payonce HTTP service.
//!
//! # Map
//! - `main.rs`: the binary — parses [`config::Cli`], then serves or audits.
//! - [`serve`] (this file): runs the app on a listener until the shutdown future completes,
//!   with the reaper beside it. Tests call it with a port-0 listener.
//! - `config.rs`: flags and environment variables, the mode they select, the start-up
//!   report.
//! - `state.rs`: [`state::AppState`] — ledger, locks, settings, metrics.
//! - `routes/`: the router and its OpenAPI document (`mod.rs`); accounts, tickets, the
//!   spends and their idempotency protocol (`spends.rs`), and the service endpoints.
//! - `extract.rs`: the caller's account, path ids, `Idempotency-Key`, JSON bodies.
//! - `render.rs`: the bodies stored under tickets; `error.rs`: every error as
//!   problem+json; `metrics.rs`: Prometheus metrics.
//! - `demo.rs`: the demonstration — the unsafe lock strategies' read-check-write path and
//!   the injectable faults, reachable only by configuration or under `PAYONCE_DEMO`.

pub mod config;
pub mod demo;
pub mod error;
pub mod extract;
pub mod metrics;
pub mod render;
pub mod routes;
pub mod state;

use std::future::Future;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::state::AppState;

/// Serves the API on `listener` until `shutdown` completes, then lets in-flight requests
/// finish. Reaps expired tickets and old outcomes every `reap_interval` meanwhile.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    request_timeout: std::time::Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stopping = CancellationToken::new();
    let reaper = tokio::spawn(reap(state.clone(), stopping.clone()));
    let app = routes::app(state, request_timeout);
    // Answers are small and latency matters: no Nagle delay on client sockets.
    let listener = listener.tap_io(|socket| {
        if let Err(error) = socket.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
    });
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    stopping.cancel();
    let _ = reaper.await;
    served
}

async fn reap(state: AppState, stopping: CancellationToken) {
    let settings = state.settings().clone();
    loop {
        tokio::select! {
            () = stopping.cancelled() => return,
            () = tokio::time::sleep(settings.reap_interval) => {}
        }
        match state.ledger().reap(settings.retention, 1000).await {
            Ok(reaped) if reaped.deleted_unused + reaped.pruned_outcomes > 0 => {
                tracing::info!(
                    deleted_unused = reaped.deleted_unused,
                    pruned_outcomes = reaped.pruned_outcomes,
                    "reaped tickets"
                );
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "reaping failed; will retry"),
        }
    }
}
