//! The demonstration inbox: in the embedded mode payonce hosts a webhook receiver of its
//! own, on a loopback port of its own, so that a newcomer sees events arrive with nothing
//! else running (the web page, the README's walkthrough). It keeps what each account's
//! endpoint received — the last [`KEPT`] requests, headers and body as they came — and
//! answers 204; with `?first=503` (or another status from 400 to 599) in the endpoint's
//! URL it answers the first request of each `webhook-id` with that status, so retries show:
//! the same id again, a moment later.
//!
//! It verifies nothing: the secret is the account's, and the web page checks each
//! signature in the browser with it. It is the one loopback address the SSRF guard lets
//! through without `PAYONCE_WEBHOOK_ALLOW_PRIVATE` (its exact address and port, which
//! payonce chose itself).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use time::OffsetDateTime;

/// Requests kept per account.
pub const KEPT: usize = 50;

pub use payonce_types::webhooks::InboxEntry;

#[derive(Default)]
struct Boxes {
    received: HashMap<String, VecDeque<InboxEntry>>,
    seen: HashSet<(String, String)>,
}

/// The running inbox; stops when dropped.
#[derive(Debug)]
pub struct Inbox {
    address: SocketAddr,
    boxes: Arc<Mutex<Boxes>>,
    server: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Boxes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Boxes")
            .field("accounts", &self.received.len())
            .finish()
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.server.abort();
    }
}

#[derive(Deserialize)]
struct Behaviour {
    first: Option<u16>,
}

impl Inbox {
    /// Starts the inbox on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        let boxes = Arc::new(Mutex::new(Boxes::default()));
        let app = axum::Router::new()
            .route("/inbox/{account}", axum::routing::post(receive))
            .with_state(Arc::clone(&boxes));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        tracing::info!(%address, "the demonstration webhook inbox listens");
        Ok(Self {
            address,
            boxes,
            server,
        })
    }

    /// Where it listens: the one loopback address the guard lets through.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The URL an endpoint for `account` is to have.
    pub fn url_for(&self, account: &str) -> String {
        format!("http://{}/inbox/{account}", self.address)
    }

    /// What `account`'s endpoints delivered here, oldest first.
    pub fn received(&self, account: &str) -> Vec<InboxEntry> {
        self.boxes
            .lock()
            .ok()
            .and_then(|boxes| boxes.received.get(account).cloned())
            .map(Vec::from)
            .unwrap_or_default()
    }
}

async fn receive(
    State(boxes): State<Arc<Mutex<Boxes>>>,
    Path(account): Path<String>,
    behaviour: Result<Query<Behaviour>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let webhook_id = header("webhook-id");
    let first = behaviour
        .ok()
        .and_then(|Query(behaviour)| behaviour.first)
        .and_then(|status| StatusCode::from_u16(status).ok())
        .filter(|status| status.is_client_error() || status.is_server_error());
    let Ok(mut boxes) = boxes.lock() else {
        return StatusCode::INTERNAL_SERVER_ERROR;
    };
    let repeat = !boxes.seen.insert((account.clone(), webhook_id.clone()));
    let answer = match first {
        Some(status) if !repeat => status,
        _ => StatusCode::NO_CONTENT,
    };
    let kept = boxes.received.entry(account).or_default();
    if kept.len() == KEPT {
        kept.pop_front();
    }
    kept.push_back(InboxEntry {
        webhook_id,
        webhook_timestamp: header("webhook-timestamp"),
        webhook_signature: header("webhook-signature"),
        body,
        answered: answer.as_u16(),
        received_at: OffsetDateTime::now_utc(),
    });
    answer
}
