//! The client: base URLs, a key, the typed calls, and the one loop that sends and resends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use payonce_types::accounts::{AccountView, CreatedAccount, EntriesPage, NewAccountRequest};
use payonce_types::holds::HoldView;
use payonce_types::orders::{OrderRequest, OrderView};
use payonce_types::payouts::{PayoutAtBank, PayoutView, PayoutsPage};
use payonce_types::service::{Health, Readiness};
use payonce_types::tickets::{TicketIssued, TicketView};
use payonce_types::webhooks::{
    DeliveriesPage, EndpointList, EndpointRequest, EndpointWithSecret, InboxView,
};
use reqwest::Method;
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue, RETRY_AFTER};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use url::Url;
use uuid::Uuid;

use crate::Error;
use crate::problem::Problem;
use crate::resend::{Attempt, Observer, ResendPolicy};

/// A client of one payonce service: one base URL, or several instances of it tried in
/// turn — a send that got no answer, a 429 or a 503 goes to the next.
///
/// Cheap to clone; clones share the connection pool. [`Client::with_key`] gives a clone
/// that sends an account's key, [`Client::starting_at`] one that aims at an instance,
/// [`Client::on_attempt`] one whose every send is observed.
#[derive(Clone, Debug)]
pub struct Client {
    shared: Arc<Shared>,
    key: Option<String>,
    /// The base each call starts at, when the caller chose one; else the shared turn.
    start: Option<usize>,
    observer: Option<Observer>,
    policy: ResendPolicy,
}

#[derive(Debug)]
struct Shared {
    http: reqwest::Client,
    /// Each ends with `/`, so that a path joins on.
    bases: Vec<String>,
    /// The base the next send goes to.
    next: AtomicUsize,
}

/// How to build a [`Client`].
#[derive(Debug)]
pub struct ClientBuilder {
    bases: Vec<String>,
    timeout: Duration,
    policy: ResendPolicy,
    http: Option<reqwest::Client>,
}

impl ClientBuilder {
    /// Another instance of the service to send to.
    pub fn base_url(mut self, base: impl Into<String>) -> Self {
        self.bases.push(base.into());
        self
    }

    /// How long one send waits for its answer before it counts as none (10 s unless set).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends through `http` — a `reqwest` client built as the caller needs (no proxy, no
    /// redirects, its own resolver) — instead of one of the client's; its timeout is then
    /// `http`'s, not [`ClientBuilder::timeout`]'s.
    pub fn http_client(mut self, http: reqwest::Client) -> Self {
        self.http = Some(http);
        self
    }

    /// How sends are repeated ([`ResendPolicy::default`] unless set).
    pub fn resend_policy(mut self, policy: ResendPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The client.
    pub fn build(self) -> Result<Client, Error> {
        let bases = self
            .bases
            .iter()
            .map(|base| {
                let url = Url::parse(base)?;
                let text = url.as_str();
                Ok(if text.ends_with('/') {
                    text.to_owned()
                } else {
                    format!("{text}/")
                })
            })
            .collect::<Result<Vec<_>, url::ParseError>>()?;
        if bases.is_empty() {
            return Err(Error::Url(url::ParseError::EmptyHost));
        }
        let http = match self.http {
            Some(http) => http,
            None => reqwest::Client::builder().timeout(self.timeout).build()?,
        };
        Ok(Client {
            shared: Arc::new(Shared {
                http,
                bases,
                next: AtomicUsize::new(0),
            }),
            key: None,
            start: None,
            observer: None,
            policy: self.policy,
        })
    }
}

/// A header an intent adds to its sends: to all, or only to those to one base.
#[derive(Clone, Debug)]
pub(crate) struct ExtraHeader {
    pub name: HeaderName,
    pub value: HeaderValue,
    pub only_to: Option<usize>,
}

/// One call, as [`Client::send_with_resends`] sends it.
pub(crate) struct Call<'a> {
    pub method: Method,
    pub path: &'a str,
    pub body: Option<&'a Value>,
    pub idempotency_key: Option<Uuid>,
    pub headers: &'a [ExtraHeader],
    pub observer: Option<&'a Observer>,
    /// The base the next send goes to when the caller keeps its own turn (counting on past
    /// the last base); `None` follows the client's shared turn.
    pub base: Option<usize>,
}

impl<'a> Call<'a> {
    fn new(client: &'a Client, method: Method, path: &'a str) -> Self {
        Self {
            method,
            path,
            body: None,
            idempotency_key: None,
            headers: &[],
            observer: client.observer.as_ref(),
            base: client.start,
        }
    }
}

/// An answer with an outcome.
pub(crate) struct Answered<T> {
    pub body: T,
    pub status: u16,
    pub replayed: bool,
    pub attempts: u32,
}

/// What one send got: an answer, or none.
#[derive(Debug)]
enum Sent {
    Answer {
        status: u16,
        body: Value,
        replayed: bool,
        retry_after: Option<Duration>,
    },
    None(reqwest::Error),
}

impl Sent {
    /// Whether the next send goes to the next instance: after no answer, a 429 or a 503.
    fn moves_on(&self) -> bool {
        matches!(
            self,
            Self::None(_)
                | Self::Answer {
                    status: 429 | 503,
                    ..
                }
        )
    }

    /// What send number `attempt` comes to under `policy`: a final answer, or an error to
    /// send again after.
    fn verdict<T: DeserializeOwned>(self, policy: &ResendPolicy, attempt: u32) -> Verdict<T> {
        match self {
            // A connection that could not be made carried nothing: sending again is
            // safe even for a call that is not idempotent.
            Self::None(error) if !policy.resend_unanswered && !error.is_connect() => {
                Verdict::Final(Err(Error::Transport(error)))
            }
            Self::None(error) => Verdict::Resend {
                error: Error::Transport(error),
                retry_after: None,
            },
            Self::Answer {
                status,
                body,
                replayed,
                ..
            } if (200..300).contains(&status) => Verdict::Final(match T::deserialize(&body) {
                Ok(parsed) => Ok(Answered {
                    body: parsed,
                    status,
                    replayed,
                    attempts: attempt,
                }),
                Err(_) => Err(Error::Unexpected {
                    status,
                    body: body.to_string(),
                }),
            }),
            Self::Answer {
                status,
                body,
                retry_after,
                ..
            } => problem_verdict(policy, status, &body, retry_after),
        }
    }

    /// The send as an observer sees it.
    fn attempt(&self, number: u32, base_index: usize, base: &str, latency: Duration) -> Attempt {
        let base = base.to_owned();
        match self {
            Self::Answer {
                status,
                body,
                replayed,
                retry_after,
            } => Attempt {
                number,
                base_index,
                base,
                status: Some(*status),
                replayed: *replayed,
                body: Some(body.clone()),
                latency,
                error: None,
                retry_after: *retry_after,
            },
            Self::None(error) => Attempt {
                number,
                base_index,
                base,
                status: None,
                replayed: false,
                body: None,
                latency,
                error: Some(error.to_string()),
                retry_after: None,
            },
        }
    }
}

impl Client {
    /// A client of the service at `base` (`http://127.0.0.1:8080`), with the default
    /// timeout and resend policy.
    pub fn new(base: &str) -> Result<Self, Error> {
        Self::builder().base_url(base).build()
    }

    /// A client to configure: several base URLs, a timeout, a resend policy.
    pub fn builder() -> ClientBuilder {
        ClientBuilder {
            bases: Vec::new(),
            timeout: Duration::from_secs(10),
            policy: ResendPolicy::default(),
            http: None,
        }
    }

    /// This client, sending `key` (an account's API key, or the operator's) as
    /// `Authorization: Bearer`.
    pub fn with_key(&self, key: &str) -> Self {
        Self {
            key: Some(key.to_owned()),
            ..self.clone()
        }
    }

    /// This client, its calls starting at base URL number `base` (0 is the first the
    /// builder was given; past the last, it counts on from the first) and moving on from
    /// there by themselves after no answer, a 429 or a 503, instead of following the turn all
    /// clones share: for a caller that aims each request at an instance — a load test, a
    /// test of failover. An [`Intent`](crate::Intent) made from it keeps its own turn across
    /// its sends.
    pub fn starting_at(&self, base: usize) -> Self {
        Self {
            start: Some(base),
            ..self.clone()
        }
    }

    /// This client, calling `observer` with every send its calls make — ticket requests,
    /// reads, creates and the sends of its intents alike. An intent's own
    /// [`Intent::on_attempt`](crate::Intent::on_attempt) takes the place of this one for the
    /// intent's sends; the ticket request of an intent that takes its own ticket is the
    /// client's call, and comes here. Each call numbers its sends from 1.
    pub fn on_attempt(&self, observer: impl Fn(&Attempt) + Send + Sync + 'static) -> Self {
        Self {
            observer: Some(Observer::new(observer)),
            ..self.clone()
        }
    }

    /// This client, resending by `policy` instead of the one it was built with.
    pub fn with_resend_policy(&self, policy: ResendPolicy) -> Self {
        Self {
            policy,
            ..self.clone()
        }
    }

    pub(crate) fn start(&self) -> Option<usize> {
        self.start
    }

    pub(crate) fn observer(&self) -> Option<&Observer> {
        self.observer.as_ref()
    }

    pub(crate) fn policy(&self) -> ResendPolicy {
        self.policy
    }

    /// Opens an account. Sent with an `Idempotency-Key` of its own, so a resend after no
    /// answer opens it once and answers the same account and API key.
    pub async fn open_account(&self, request: &NewAccountRequest) -> Result<CreatedAccount, Error> {
        self.create("/v1/accounts", request).await
    }

    /// The account (its key needed).
    pub async fn account(&self, account: Uuid) -> Result<AccountView, Error> {
        self.get(&format!("/v1/accounts/{account}")).await
    }

    /// A fresh ticket of the account. An [`Intent`](crate::Intent) takes its own; this is
    /// for a caller that keeps tickets itself (see
    /// [`Intent::with_ticket`](crate::Intent::with_ticket)).
    pub async fn take_ticket(&self, account: Uuid) -> Result<TicketIssued, Error> {
        // A resend after no answer may issue a second ticket: harmless, an unused ticket
        // only expires.
        let path = format!("/v1/accounts/{account}/tickets");
        let mut call = Call::new(self, Method::POST, &path);
        self.send_with_resends(&self.policy, &mut call)
            .await
            .map(|answered| answered.body)
    }

    /// A ticket, and the response stored under it once used: what an intent whose outcome
    /// is unknown came to.
    pub async fn ticket(&self, ticket: Uuid) -> Result<TicketView, Error> {
        self.get(&format!("/v1/tickets/{ticket}")).await
    }

    /// Places an order for the account to pay once (with an `Idempotency-Key` of its own,
    /// as [`Client::open_account`]).
    pub async fn place_order(
        &self,
        account: Uuid,
        order: &OrderRequest,
    ) -> Result<OrderView, Error> {
        self.create(&format!("/v1/accounts/{account}/orders"), order)
            .await
    }

    /// The order.
    pub async fn order(&self, order: Uuid) -> Result<OrderView, Error> {
        self.get(&format!("/v1/orders/{order}")).await
    }

    /// A page of the account's ledger entries, oldest first: those after entry `after`
    /// (the previous page's `next_after`), at most `limit` (1 to 1000; 100 if `None`).
    pub async fn entries(
        &self,
        account: Uuid,
        after: Option<i64>,
        limit: Option<u32>,
    ) -> Result<EntriesPage, Error> {
        let query = query(&[
            ("after", after.map(|a| a.to_string())),
            ("limit", limit.map(|l| l.to_string())),
        ]);
        self.get(&format!("/v1/accounts/{account}/entries{query}"))
            .await
    }

    /// A hold as it is now: `held`, or `captured`, `voided` or `expired` — expired as soon
    /// as the ledger's clock passes `expires_at`, whether or not a sweep has recorded it.
    pub async fn hold_state(&self, hold: Uuid) -> Result<HoldView, Error> {
        self.get(&format!("/v1/holds/{hold}")).await
    }

    /// A payout and where it stands: `pending` until the bank's word, then `succeeded` or
    /// `failed` (its money given back).
    pub async fn payout_state(&self, payout: Uuid) -> Result<PayoutView, Error> {
        self.get(&format!("/v1/payouts/{payout}")).await
    }

    /// What the bank holds for the payout, asked of the bank: its transfers with the
    /// payout's id as their reference, under whichever key — `executed` is 1 once the money
    /// left, and never more.
    pub async fn payout_at_bank(&self, payout: Uuid) -> Result<PayoutAtBank, Error> {
        self.get(&format!("/v1/payouts/{payout}/bank")).await
    }

    /// A page of the key's account's payouts, oldest first: in `status` (`pending`,
    /// `succeeded`, `failed`) if given, after payout `after`, at most `limit`.
    pub async fn payouts(
        &self,
        status: Option<&str>,
        after: Option<Uuid>,
        limit: Option<u32>,
    ) -> Result<PayoutsPage, Error> {
        let query = query(&[
            ("status", status.map(str::to_owned)),
            ("after", after.map(|a| a.to_string())),
            ("limit", limit.map(|l| l.to_string())),
        ]);
        self.get(&format!("/v1/payouts{query}")).await
    }

    /// Creates a webhook endpoint; its `secret` is in this answer (and in a replay's).
    /// Sent with an `Idempotency-Key` of its own, so a resend — after no answer, or a 503
    /// that may come after the create ran — answers the same endpoint and secret instead
    /// of making a second.
    pub async fn create_webhook_endpoint(
        &self,
        account: Uuid,
        endpoint: &EndpointRequest,
    ) -> Result<EndpointWithSecret, Error> {
        self.create(
            &format!("/v1/accounts/{account}/webhook-endpoints"),
            endpoint,
        )
        .await
    }

    /// The account's webhook endpoints, oldest first.
    pub async fn webhook_endpoints(&self, account: Uuid) -> Result<EndpointList, Error> {
        self.get(&format!("/v1/accounts/{account}/webhook-endpoints"))
            .await
    }

    /// Deletes a webhook endpoint. Deleting it again is 404 `webhook-endpoint-not-found` —
    /// which is also what a resend finds when the first delete went through but its answer
    /// was lost: the endpoint is gone either way.
    pub async fn delete_webhook_endpoint(
        &self,
        account: Uuid,
        endpoint: Uuid,
    ) -> Result<(), Error> {
        let path = format!("/v1/accounts/{account}/webhook-endpoints/{endpoint}");
        let mut call = Call::new(self, Method::DELETE, &path);
        self.send_with_resends(&self.policy, &mut call)
            .await
            .map(|answered| answered.body)
    }

    /// Gives the endpoint a new secret (the old one signs too for the rotation window);
    /// the new `secret` is in this answer (and in a replay's). Sent with an
    /// `Idempotency-Key` of its own: a resend rotates once, so the secret the receiver
    /// holds keeps signing through the window.
    pub async fn rotate_webhook_secret(
        &self,
        account: Uuid,
        endpoint: Uuid,
    ) -> Result<EndpointWithSecret, Error> {
        let path = format!("/v1/accounts/{account}/webhook-endpoints/{endpoint}/rotate-secret");
        let mut call = Call {
            idempotency_key: Some(Uuid::new_v4()),
            ..Call::new(self, Method::POST, &path)
        };
        self.send_with_resends(&self.policy, &mut call)
            .await
            .map(|answered| answered.body)
    }

    /// A page of the endpoint's deliveries, newest first, each with its attempts: those
    /// before delivery `before`, at most `limit` (1 to 100; 20 if `None`).
    pub async fn webhook_deliveries(
        &self,
        endpoint: Uuid,
        before: Option<i64>,
        limit: Option<u32>,
    ) -> Result<DeliveriesPage, Error> {
        let query = query(&[
            ("before", before.map(|b| b.to_string())),
            ("limit", limit.map(|l| l.to_string())),
        ]);
        self.get(&format!(
            "/v1/webhook-endpoints/{endpoint}/deliveries{query}"
        ))
        .await
    }

    /// Sends a webhook delivery again now (202). Refused while a worker is sending it
    /// ([`ProblemKind::DeliveryInFlight`](crate::ProblemKind::DeliveryInFlight)) and after
    /// the endpoint was disabled. Sent with an `Idempotency-Key` of its own: a resend
    /// queues no second attempt.
    pub async fn retry_webhook_delivery(&self, endpoint: Uuid, delivery: i64) -> Result<(), Error> {
        let path = format!("/v1/webhook-endpoints/{endpoint}/deliveries/{delivery}/retry");
        let mut call = Call {
            idempotency_key: Some(Uuid::new_v4()),
            ..Call::new(self, Method::POST, &path)
        };
        self.send_with_resends(&self.policy, &mut call)
            .await
            .map(|answered| answered.body)
    }

    /// The account's demonstration inbox — where to point an endpoint, and what came there,
    /// headers and body as payonce sent them (for [`webhooks::verify`](crate::webhooks::verify)).
    /// Only an instance in the embedded mode has one.
    pub async fn webhook_inbox(&self, account: Uuid) -> Result<InboxView, Error> {
        self.get(&format!("/v1/accounts/{account}/webhook-inbox"))
            .await
    }

    /// Whether the instance the next send goes to is alive (`GET /healthz`), asked once:
    /// a probe of one instance must not answer for another. No answer is
    /// [`Error::Transport`].
    pub async fn health(&self) -> Result<Health, Error> {
        self.probe("/healthz").await
    }

    /// Whether the instance the next send goes to can serve — its database and lock store
    /// answer (`GET /readyz`) — asked once, as [`Client::health`]. Not ready is
    /// [`Error::Refused`] with the 503's problem.
    pub async fn readiness(&self) -> Result<Readiness, Error> {
        self.probe("/readyz").await
    }

    /// One GET, never resent; what it got, not wrapped in [`Error::GaveUp`].
    async fn probe<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        let mut call = Call::new(self, Method::GET, path);
        match self
            .send_with_resends(&ResendPolicy::none(), &mut call)
            .await
        {
            Ok(answered) => Ok(answered.body),
            Err(Error::GaveUp { last, .. }) => Err(*last),
            Err(error) => Err(error),
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        let mut call = Call::new(self, Method::GET, path);
        self.send_with_resends(&self.policy, &mut call)
            .await
            .map(|answered| answered.body)
    }

    async fn create<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, Error> {
        let body = serde_json::to_value(body).unwrap_or(Value::Null);
        let mut call = Call {
            body: Some(&body),
            idempotency_key: Some(Uuid::new_v4()),
            ..Call::new(self, Method::POST, path)
        };
        self.send_with_resends(&self.policy, &mut call)
            .await
            .map(|answered| answered.body)
    }

    /// Sends the call, and sends it again by `policy` while there is no answer or a
    /// resendable problem, always with the same idempotency key; the first final answer.
    /// A call that keeps its own turn (`call.base`) is left pointing at the base its next
    /// send would go to.
    pub(crate) async fn send_with_resends<T: DeserializeOwned>(
        &self,
        policy: &ResendPolicy,
        call: &mut Call<'_>,
    ) -> Result<Answered<T>, Error> {
        let attempts = policy.max_attempts.max(1);
        let bases = &self.shared.bases;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let index = call
                .base
                .unwrap_or_else(|| self.shared.next.load(Ordering::Relaxed))
                % bases.len();
            let started = Instant::now();
            let sent = self.send_to(index, call).await;
            if let Some(observer) = call.observer {
                observer.see(&sent.attempt(attempt, index, &bases[index], started.elapsed()));
            }
            // No answer, a 429 or a 503: the next send — this call's, or for an aimed call
            // the caller's own next one (after an `outcome-unknown`, say) — goes to the
            // next instance.
            let move_on = sent.moves_on();
            if move_on && let Some(base) = &mut call.base {
                *base = index + 1;
            }
            let (error, retry_after) = match sent.verdict(policy, attempt) {
                Verdict::Final(answer) => return answer,
                Verdict::Resend { error, retry_after } => (error, retry_after),
            };
            if attempt >= attempts {
                return Err(Error::GaveUp {
                    ticket: None,
                    attempts: attempt,
                    last: Box::new(error),
                });
            }
            if move_on && call.base.is_none() {
                self.shared.next.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(policy.wait(attempt, retry_after)).await;
        }
    }

    /// One send of the call to base number `index`.
    async fn send_to(&self, index: usize, call: &Call<'_>) -> Sent {
        let base = &self.shared.bases[index];
        let mut request = self.shared.http.request(
            call.method.clone(),
            format!("{base}{}", call.path.trim_start_matches('/')),
        );
        if let Some(key) = &self.key {
            request = request.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        if let Some(key) = call.idempotency_key {
            request = request.header("idempotency-key", key.to_string());
        }
        for header in call.headers {
            if header
                .only_to
                .is_none_or(|only| only % self.shared.bases.len() == index)
            {
                request = request.header(header.name.clone(), header.value.clone());
            }
        }
        if let Some(body) = call.body {
            request = request.json(body);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => return Sent::None(error),
        };
        let status = response.status().as_u16();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true");
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        // An answer whose body broke off is no answer: what it said is unknown.
        match response.bytes().await {
            Ok(bytes) => Sent::Answer {
                status,
                // An empty body (204) reads as null, which `()` takes.
                body: if bytes.is_empty() {
                    Value::Null
                } else {
                    serde_json::from_slice(&bytes)
                        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
                },
                replayed,
                retry_after,
            },
            Err(error) => Sent::None(error),
        }
    }
}

/// What one send comes to: the call's answer, or an error it is sent again after.
enum Verdict<T> {
    Final(Result<Answered<T>, Error>),
    Resend {
        error: Error,
        retry_after: Option<Duration>,
    },
}

/// The verdict on a problem answer: resent when the problem is resendable and, for a call
/// that may not be resent after it may have run, does not leave open that it ran.
fn problem_verdict<T>(
    policy: &ResendPolicy,
    status: u16,
    body: &Value,
    retry_after: Option<Duration>,
) -> Verdict<T> {
    match Problem::from_body(status, body, retry_after) {
        // An answer that means "it may have run" is, for a call that must not run twice
        // and has no key to make a resend a replay, as final as no answer: a `503 timeout`
        // comes after the handler may have committed.
        Some(problem)
            if problem.is_resendable() && (policy.resend_unanswered || !may_have_run(&problem)) =>
        {
            Verdict::Resend {
                error: Error::Refused(Box::new(problem)),
                retry_after,
            }
        }
        Some(problem) => Verdict::Final(Err(Error::Refused(Box::new(problem)))),
        None => Verdict::Final(Err(Error::Unexpected {
            status,
            body: body.to_string(),
        })),
    }
}

/// Whether a problem answer leaves open that the request ran: the server's (or a proxy's)
/// timeout, which can come after the handler committed, and a lost commit answer.
fn may_have_run(problem: &Problem) -> bool {
    matches!(
        problem.kind,
        crate::ProblemKind::Timeout | crate::ProblemKind::OutcomeUnknown
    )
}

/// `?name=value&…` of the parameters that are set; empty if none is.
fn query(parameters: &[(&str, Option<String>)]) -> String {
    let mut url = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in parameters {
        if let Some(value) = value {
            url.append_pair(name, value);
        }
    }
    let query = url.finish();
    if query.is_empty() {
        query
    } else {
        format!("?{query}")
    }
}
