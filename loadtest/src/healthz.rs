//! `GET /healthz` as fast as `clients` connections allow: how fast the generator itself
//! can go, to compare with `wrk` (the generator must not be the bottleneck).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{Api, ClientError};

/// What the load achieved.
#[derive(Debug, Clone, Copy)]
pub struct HealthzLoad {
    /// Answers with 200.
    pub ok: u64,
    /// Anything else, or no answer.
    pub failed: u64,
    /// How long it ran.
    pub elapsed: Duration,
}

impl HealthzLoad {
    /// Answers per second.
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(0.001)
    }
}

/// Sends `GET /healthz` from `clients` tasks for `duration`, spread over the targets.
pub async fn hammer(
    targets: Vec<String>,
    clients: usize,
    duration: Duration,
) -> Result<HealthzLoad, ClientError> {
    let api = Api::new(targets, clients)?;
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let stop = started + duration;
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let (api, ok, failed) = (api.clone(), ok.clone(), failed.clone());
            let url = api.healthz_url(client);
            tokio::spawn(async move {
                let Ok(url) = url else { return };
                while Instant::now() < stop {
                    if api.healthz(url.clone()).await == Some(200) {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    Ok(HealthzLoad {
        ok: ok.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
    })
}
