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

/// Accounts whose requests are kept; past it, the account that first received longest
/// ago is forgotten. An inbox is what a newcomer watches: it must not grow without end
/// in an instance left running.
pub const ACCOUNTS_KEPT: usize = 1000;

/// `webhook-id`s remembered (to answer only the first of each with `?first=`); past it,
/// the oldest is forgotten — and a repeat of it is answered as a first again, which only
/// costs its delivery one more attempt.
pub const IDS_KEPT: usize = 10_000;

pub use payonce_types::webhooks::InboxEntry;

#[derive(Default)]
struct Boxes {
    received: HashMap<String, VecDeque<InboxEntry>>,
    /// The accounts of `received`, the first to receive first.
    accounts: VecDeque<String>,
    seen: HashSet<(String, String)>,
    /// The entries of `seen`, oldest first.
    seen_order: VecDeque<(String, String)>,
}

impl Boxes {
    /// Remembers that `account` received `webhook_id`: whether it had before.
    fn seen_before(&mut self, account: &str, webhook_id: &str) -> bool {
        let key = (account.to_owned(), webhook_id.to_owned());
        if self.seen.contains(&key) {
            return true;
        }
        if self.seen_order.len() == IDS_KEPT
            && let Some(oldest) = self.seen_order.pop_front()
        {
            self.seen.remove(&oldest);
        }
        self.seen.insert(key.clone());
        self.seen_order.push_back(key);
        false
    }

    /// Keeps `entry` in `account`'s box, within [`KEPT`] and [`ACCOUNTS_KEPT`].
    fn keep(&mut self, account: String, entry: InboxEntry) {
        if !self.received.contains_key(&account) {
            if self.accounts.len() == ACCOUNTS_KEPT
                && let Some(oldest) = self.accounts.pop_front()
            {
                self.received.remove(&oldest);
            }
            self.accounts.push_back(account.clone());
        }
        let kept = self.received.entry(account).or_default();
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back(entry);
    }
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
    let repeat = boxes.seen_before(&account, &webhook_id);
    let answer = match first {
        Some(status) if !repeat => status,
        _ => StatusCode::NO_CONTENT,
    };
    boxes.keep(
        account,
        InboxEntry {
            webhook_id,
            webhook_timestamp: header("webhook-timestamp"),
            webhook_signature: header("webhook-signature"),
            body,
            answered: answer.as_u16(),
            received_at: OffsetDateTime::now_utc(),
        },
    );
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str) -> InboxEntry {
        InboxEntry {
            webhook_id: id.to_owned(),
            webhook_timestamp: String::new(),
            webhook_signature: String::new(),
            body: String::new(),
            answered: 204,
            received_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn what_the_inbox_remembers_is_bounded() {
        let mut boxes = Boxes::default();
        for n in 0..IDS_KEPT + 10 {
            assert!(!boxes.seen_before("a", &n.to_string()));
        }
        assert_eq!(boxes.seen.len(), IDS_KEPT);
        assert_eq!(boxes.seen_order.len(), IDS_KEPT);
        assert!(boxes.seen_before("a", &(IDS_KEPT + 9).to_string()));
        assert!(!boxes.seen_before("a", "0"), "the oldest was forgotten");

        for n in 0..ACCOUNTS_KEPT + 5 {
            for k in 0..3 {
                boxes.keep(n.to_string(), entry(&k.to_string()));
            }
        }
        boxes.keep("0-more".to_owned(), entry("x"));
        for _ in 0..KEPT + 5 {
            boxes.keep("busy".to_owned(), entry("y"));
        }
        assert_eq!(boxes.received.len(), ACCOUNTS_KEPT);
        assert_eq!(boxes.accounts.len(), ACCOUNTS_KEPT);
        assert!(
            !boxes.received.contains_key("0"),
            "the first account went first"
        );
        assert_eq!(boxes.received["busy"].len(), KEPT);
        assert_eq!(boxes.received[&(ACCOUNTS_KEPT + 4).to_string()].len(), 3);
    }
}
