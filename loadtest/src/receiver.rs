//! The webhook receiver: a real HTTP server on a loopback port that payonce delivers the
//! run's events to (an endpoint per account, `/hooks/{account}`). It verifies each
//! delivery's signature with the Standard Webhooks reference library and the account's
//! secret, records what came ([`Receipt`]), and answers as told — 204 at once, or, at the
//! rates of [`ReceiverFaults`], 500, 429 with `Retry-After`, slowly, or not at all — so the
//! audit can check that every committed outcome was delivered however the receiver
//! behaved.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

/// How often the receiver misbehaves, each a share of the deliveries (drawn per
/// delivery, in this order).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReceiverFaults {
    /// Answered 500.
    pub fail: f64,
    /// Answered 429 with `Retry-After: 1`.
    pub throttle: f64,
    /// Answered 204 after `slow_for`.
    pub slow: f64,
    /// How long a slow answer takes.
    pub slow_for: Duration,
    /// Never answered: the receiver holds the request until payonce gives up on it.
    pub hang: f64,
}

/// What the receiver did with a delivery.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Answered {
    /// 204 (at once, or after a while).
    Took,
    /// 500.
    Failed,
    /// 429.
    Throttled,
    /// Nothing: it hung.
    Hung,
}

/// One delivery as the receiver got it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Receipt {
    /// The account whose endpoint it came to.
    pub account: String,
    /// `webhook-id`.
    pub webhook_id: String,
    /// The event's `type`.
    pub event_type: String,
    /// `data.ticket_id`.
    pub ticket_id: String,
    /// Whether its signature verified with the account's secret (and its timestamp was
    /// fresh), by the reference library.
    pub verified: bool,
    /// A hash of the body: the same event must come with the same body.
    pub body_hash: u64,
    /// What the receiver answered.
    pub answered: Answered,
    /// Milliseconds from the event's commit (its `timestamp`) to its arrival here, by
    /// this machine's clock.
    pub lag_ms: Option<u64>,
}

impl Receipt {
    /// The receiver took it: a delivery, as payonce counts them.
    pub fn taken(&self) -> bool {
        self.answered == Answered::Took
    }
}

#[derive(Default)]
struct Inner {
    secrets: HashMap<String, String>,
    receipts: Vec<Receipt>,
    /// How many of the receipts it took: counted as they come, for a cheap look.
    taken: usize,
}

/// A running receiver; stops when dropped.
#[derive(Clone)]
pub struct Receiver {
    address: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    server: Arc<tokio::task::AbortHandle>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if Arc::strong_count(&self.server) == 1 {
            self.server.abort();
        }
    }
}

#[derive(Clone)]
struct Shared {
    inner: Arc<Mutex<Inner>>,
    faults: ReceiverFaults,
}

impl Receiver {
    /// Starts a receiver on a free port of `ip` (a loopback address: payonce instances on
    /// this machine deliver to it).
    pub async fn start(ip: std::net::IpAddr, faults: ReceiverFaults) -> std::io::Result<Self> {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = axum::Router::new()
            .route("/hooks/{account}", axum::routing::post(receive))
            .with_state(Shared {
                inner: Arc::clone(&inner),
                faults,
            });
        let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
        let address = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            address,
            inner,
            server: Arc::new(server.abort_handle()),
        })
    }

    /// The URL an account's endpoint is to have.
    pub fn url_for(&self, account: &str) -> String {
        format!("http://{}/hooks/{account}", self.address)
    }

    /// Learns the secret `account`'s deliveries are signed with.
    pub fn register(&self, account: &str, secret: &str) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.secrets.insert(account.to_owned(), secret.to_owned());
        }
    }

    /// How many deliveries it took (answered 204) so far.
    pub fn taken(&self) -> usize {
        self.inner
            .lock()
            .map(|inner| inner.taken)
            .unwrap_or_default()
    }

    /// Everything received so far, in order of arrival.
    pub fn receipts(&self) -> Vec<Receipt> {
        self.inner
            .lock()
            .map(|inner| inner.receipts.clone())
            .unwrap_or_default()
    }
}

/// The body's fields the receipt keeps.
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    event_type: String,
    timestamp: String,
    data: Value,
}

async fn receive(
    State(shared): State<Shared>,
    Path(account): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let arrived = time::OffsetDateTime::now_utc();
    let secret = shared
        .inner
        .lock()
        .ok()
        .and_then(|inner| inner.secrets.get(&account).cloned());
    let verified = secret.is_some_and(|secret| {
        standardwebhooks::Webhook::new(&secret)
            .and_then(|hook| hook.verify(body.as_bytes(), &headers))
            .is_ok()
    });
    let envelope: Option<Envelope> = serde_json::from_str(&body).ok();
    let lag_ms = envelope.as_ref().and_then(|envelope| {
        let committed = time::OffsetDateTime::parse(
            &envelope.timestamp,
            &time::format_description::well_known::Rfc3339,
        )
        .ok()?;
        u64::try_from((arrived - committed).whole_milliseconds()).ok()
    });
    let answered = pick(&shared.faults);
    let mut hasher = DefaultHasher::new();
    body.hash(&mut hasher);
    let text = |value: Option<&Value>| value.and_then(Value::as_str).unwrap_or_default().to_owned();
    let receipt = Receipt {
        account,
        webhook_id: headers
            .get("webhook-id")
            .and_then(|id| id.to_str().ok())
            .unwrap_or_default()
            .to_owned(),
        event_type: envelope
            .as_ref()
            .map(|envelope| envelope.event_type.clone())
            .unwrap_or_default(),
        ticket_id: text(envelope.as_ref().and_then(|e| e.data.get("ticket_id"))),
        verified,
        body_hash: hasher.finish(),
        answered: answered.0,
        lag_ms,
    };
    if let Ok(mut inner) = shared.inner.lock() {
        inner.taken += usize::from(receipt.taken());
        inner.receipts.push(receipt);
    }
    match answered {
        (Answered::Failed, _) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        (Answered::Throttled, _) => {
            (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")]).into_response()
        }
        (Answered::Hung, _) => {
            // Held until payonce's timeout drops the connection (or, at the latest, a
            // minute, so a receiver whose client forgot it still ends).
            tokio::time::sleep(Duration::from_secs(60)).await;
            StatusCode::NO_CONTENT.into_response()
        }
        (Answered::Took, Some(delay)) => {
            let until = Instant::now() + delay;
            tokio::time::sleep_until(until).await;
            StatusCode::NO_CONTENT.into_response()
        }
        (Answered::Took, None) => StatusCode::NO_CONTENT.into_response(),
    }
}

/// What to answer, drawn from the faults' shares: and for a slow 204, how long to wait.
fn pick(faults: &ReceiverFaults) -> (Answered, Option<Duration>) {
    let draw: f64 = rand::random();
    let mut edge = faults.fail;
    if draw < edge {
        return (Answered::Failed, None);
    }
    edge += faults.throttle;
    if draw < edge {
        return (Answered::Throttled, None);
    }
    edge += faults.slow;
    if draw < edge {
        return (Answered::Took, Some(faults.slow_for));
    }
    edge += faults.hang;
    if draw < edge {
        return (Answered::Hung, None);
    }
    (Answered::Took, None)
}
