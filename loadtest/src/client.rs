//! A client of the payonce HTTP contract — nothing else: the load test could drive any
//! implementation of it.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::history::{
    AccountState, BankTransfer, EntryRecord, PayoutState, PayoutStatus, SpendKind, TicketState,
};

/// Errors setting up or reading back (not the answers under test: those are recorded).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request did not get an answer.
    #[error("{0}")]
    Transport(#[from] reqwest::Error),
    /// An answer the setup cannot work with.
    #[error("{what}: unexpected {status}: {body}")]
    Unexpected {
        /// What was asked.
        what: &'static str,
        /// The status.
        status: StatusCode,
        /// The body.
        body: String,
    },
}

/// The answer to a spend, as recorded.
#[derive(Debug, Clone)]
pub struct Answer {
    /// `None` when no answer came.
    pub status: Option<u16>,
    /// `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// The JSON body.
    pub body: Option<Value>,
    /// How long it took.
    pub latency: Duration,
    /// The transport error.
    pub error: Option<String>,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u64>,
}

impl Answer {
    /// No answer came: the request failed with `error`.
    fn none(started: Instant, error: &reqwest::Error) -> Self {
        Self {
            status: None,
            replayed: false,
            body: None,
            latency: started.elapsed(),
            error: Some(error.to_string()),
            retry_after: None,
        }
    }
}

/// The answer to a ticket request, as recorded.
#[derive(Debug, Clone)]
pub struct TicketAnswer {
    /// `None` when no answer came.
    pub status: Option<u16>,
    /// The ticket, when the answer was 201 with a `ticket_id`.
    pub ticket: Option<String>,
    /// The JSON body.
    pub body: Option<Value>,
    /// How long it took.
    pub latency: Duration,
    /// The transport error, or why the body could not be read.
    pub error: Option<String>,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u64>,
}

/// A response's `Retry-After` in seconds. Its other form, an HTTP date, is not read: the
/// contract sends seconds, and without it the client falls back to its own backoff.
fn retry_after(response: &reqwest::Response) -> Option<u64> {
    response
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// An HTTP client for one or more targets.
#[derive(Debug, Clone)]
pub struct Api {
    client: Client,
    targets: Vec<String>,
}

impl Api {
    /// A client with a connection pool large enough for `connections` concurrent requests.
    ///
    /// It goes only where the targets say (see [`safety`](crate::safety)): it follows no
    /// redirect (a 3xx is recorded as the answer, like any other), uses no proxy (not even
    /// one from the environment), and connects to `localhost` only on 127.0.0.1 or ::1,
    /// whatever the system's resolver says.
    pub fn new(targets: Vec<String>, connections: usize) -> Result<Self, ClientError> {
        let client = Client::builder()
            .pool_max_idle_per_host(connections.max(1))
            .timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .resolve_to_addrs("localhost", &crate::safety::LOCALHOST)
            .build()?;
        let targets = targets
            .into_iter()
            .map(|target| target.trim_end_matches('/').to_owned())
            .collect();
        Ok(Self { client, targets })
    }

    /// The targets.
    pub fn targets(&self) -> &[String] {
        &self.targets
    }

    fn url(&self, target: usize, path: &str) -> String {
        format!("{}{path}", self.targets[target % self.targets.len()])
    }

    async fn json(
        response: reqwest::Response,
        what: &'static str,
        expected: StatusCode,
    ) -> Result<Value, ClientError> {
        let status = response.status();
        if status != expected {
            let body = response.text().await.unwrap_or_default();
            return Err(ClientError::Unexpected { what, status, body });
        }
        Ok(response.json().await?)
    }

    /// Opens an account: (id, key).
    pub async fn open_account(
        &self,
        target: usize,
        balance: i64,
        points: i64,
    ) -> Result<(String, String), ClientError> {
        let response = self
            .client
            .post(self.url(target, "/v1/accounts"))
            .json(&json!({ "name": "loadtest", "balance": balance, "points": points }))
            .send()
            .await?;
        let body = Self::json(response, "open an account", StatusCode::CREATED).await?;
        let field = |name: &str| {
            body.get(name)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Ok((field("id"), field("api_key")))
    }

    /// Creates a webhook endpoint for the account at `url`, for every event type: its
    /// secret.
    pub async fn create_webhook_endpoint(
        &self,
        target: usize,
        account: &str,
        key: &str,
        url: &str,
    ) -> Result<String, ClientError> {
        let response = self
            .client
            .post(self.url(target, &format!("/v1/accounts/{account}/webhook-endpoints")))
            .bearer_auth(key)
            .json(&json!({ "url": url }))
            .send()
            .await?;
        let body = Self::json(response, "create a webhook endpoint", StatusCode::CREATED).await?;
        Ok(body
            .get("secret")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned())
    }

    /// Asks for a ticket, and records whatever comes back.
    pub async fn ticket(&self, target: usize, account: &str, key: &str) -> TicketAnswer {
        let started = Instant::now();
        let sent = self
            .client
            .post(self.url(target, &format!("/v1/accounts/{account}/tickets")))
            .bearer_auth(key)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => {
                return TicketAnswer {
                    status: None,
                    ticket: None,
                    body: None,
                    latency: started.elapsed(),
                    error: Some(error.to_string()),
                    retry_after: None,
                };
            }
        };
        let status = response.status().as_u16();
        let retry_after = retry_after(&response);
        let body = response.json::<Value>().await;
        let ticket = body
            .as_ref()
            .ok()
            .filter(|_| status == 201)
            .and_then(|body| body.get("ticket_id"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        TicketAnswer {
            status: Some(status),
            ticket,
            latency: started.elapsed(),
            error: body.as_ref().err().map(ToString::to_string),
            body: body.ok(),
            retry_after,
        }
    }

    /// Places an order of `amount` for the account: its id.
    pub async fn place_order(
        &self,
        target: usize,
        account: &str,
        key: &str,
        amount: i64,
    ) -> Result<String, ClientError> {
        let response = self
            .client
            .post(self.url(target, &format!("/v1/accounts/{account}/orders")))
            .bearer_auth(key)
            .json(&json!({ "amount": amount, "description": "loadtest" }))
            .send()
            .await?;
        let body = Self::json(response, "place an order", StatusCode::CREATED).await?;
        Ok(body
            .get("order_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned())
    }

    /// Sends a spend (with any extra headers) and records whatever comes back. An order
    /// payment goes to its order (`order`), every other spend to its account.
    #[allow(clippy::too_many_arguments)]
    pub async fn spend(
        &self,
        target: usize,
        account: &str,
        key: &str,
        ticket: &str,
        kind: SpendKind,
        amount: i64,
        order: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let started = Instant::now();
        let path = match order {
            Some(order) => format!("/v1/orders/{order}/{}", kind.path()),
            None => format!("/v1/accounts/{account}/{}", kind.path()),
        };
        let mut request = self
            .client
            .post(self.url(target, &path))
            .bearer_auth(key)
            .header("idempotency-key", ticket)
            .json(&kind.body(amount));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let sent = request.send().await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => return Answer::none(started, &error),
        };
        let status = response.status().as_u16();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true");
        let retry_after = retry_after(&response);
        let body = response.json::<Value>().await;
        Answer {
            status: Some(status),
            replayed,
            latency: started.elapsed(),
            error: body.as_ref().err().map(ToString::to_string),
            body: body.ok(),
            retry_after,
        }
    }

    /// An account's balance, points and every entry.
    pub async fn account_state(
        &self,
        target: usize,
        account: &str,
        key: &str,
    ) -> Result<AccountState, ClientError> {
        let response = self
            .client
            .get(self.url(target, &format!("/v1/accounts/{account}")))
            .bearer_auth(key)
            .send()
            .await?;
        let body = Self::json(response, "read an account", StatusCode::OK).await?;
        let mut state = AccountState {
            balance: body
                .get("balance")
                .and_then(Value::as_i64)
                .unwrap_or(i64::MIN),
            points: body
                .get("points")
                .and_then(Value::as_i64)
                .unwrap_or(i64::MIN),
            entries: Vec::new(),
        };
        let mut after: Option<i64> = None;
        loop {
            let mut url = self.url(
                target,
                &format!("/v1/accounts/{account}/entries?limit=1000"),
            );
            if let Some(after) = after {
                url.push_str(&format!("&after={after}"));
            }
            let response = self.client.get(url).bearer_auth(key).send().await?;
            let page = Self::json(response, "read entries", StatusCode::OK).await?;
            let entries: Vec<EntryRecord> =
                serde_json::from_value(page.get("entries").cloned().unwrap_or(Value::Null))
                    .map_err(|error| ClientError::Unexpected {
                        what: "read entries",
                        status: StatusCode::OK,
                        body: error.to_string(),
                    })?;
            state.entries.extend(entries);
            match page.get("next_after").and_then(Value::as_i64) {
                Some(next) => after = Some(next),
                None => return Ok(state),
            }
        }
    }

    /// The array `field` of a page of a list, read as `T`s (taken out of the page).
    fn listed<T: serde::de::DeserializeOwned>(
        page: &mut Value,
        field: &str,
        what: &'static str,
    ) -> Result<Vec<T>, ClientError> {
        let items = page.get_mut(field).map(Value::take).unwrap_or_default();
        serde_json::from_value(items).map_err(|error| ClientError::Unexpected {
            what,
            status: StatusCode::OK,
            body: error.to_string(),
        })
    }

    /// A ticket's state and stored response.
    pub async fn ticket_state(
        &self,
        target: usize,
        ticket: &str,
        key: &str,
    ) -> Result<TicketState, ClientError> {
        let response = self
            .client
            .get(self.url(target, &format!("/v1/tickets/{ticket}")))
            .bearer_auth(key)
            .send()
            .await?;
        let body = Self::json(response, "read a ticket", StatusCode::OK).await?;
        let stored = body.get("response");
        Ok(TicketState {
            state: body
                .get("state")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            status: stored
                .and_then(|stored| stored.get("status"))
                .and_then(Value::as_u64)
                .and_then(|status| u16::try_from(status).ok()),
            body: stored.and_then(|stored| stored.get("body")).cloned(),
        })
    }

    /// An account's payouts (`GET /v1/payouts`, every page), or only those in `status`.
    pub async fn payouts(
        &self,
        target: usize,
        key: &str,
        status: Option<PayoutStatus>,
    ) -> Result<Vec<PayoutState>, ClientError> {
        let mut payouts = Vec::new();
        let mut after: Option<String> = None;
        loop {
            // A status name and a payout id need no escaping.
            let mut path = "/v1/payouts?limit=1000".to_owned();
            if let Some(status) = status {
                path.push_str(&format!("&status={}", status.name()));
            }
            if let Some(after) = after.take() {
                path.push_str(&format!("&after={after}"));
            }
            let response = self
                .client
                .get(self.url(target, &path))
                .bearer_auth(key)
                .send()
                .await?;
            let mut page = Self::json(response, "list payouts", StatusCode::OK).await?;
            payouts.extend(Self::listed::<PayoutState>(
                &mut page,
                "payouts",
                "read payouts",
            )?);
            match page.get("next_after").and_then(Value::as_str) {
                Some(next) => after = Some(next.to_owned()),
                None => return Ok(payouts),
            }
        }
    }

    /// The transfers the bank at `bank` holds with `reference` — a payout's id — under
    /// whichever keys, in the order it committed them (`GET /v1/transfers?reference=`,
    /// every page). Those of another reference are left out here too, should a bank not
    /// filter.
    pub async fn bank_transfers(
        &self,
        bank: &str,
        reference: &str,
    ) -> Result<Vec<BankTransfer>, ClientError> {
        let bank = bank.trim_end_matches('/');
        let mut transfers = Vec::new();
        let mut after = 0_i64;
        loop {
            // A payout's id (a UUID) needs no escaping.
            let response = self
                .client
                .get(format!(
                    "{bank}/v1/transfers?reference={reference}&after={after}&limit=1000"
                ))
                .send()
                .await?;
            let mut page =
                Self::json(response, "list the bank's transfers", StatusCode::OK).await?;
            let listed: Vec<BankTransfer> =
                Self::listed(&mut page, "transfers", "read the bank's transfers")?;
            transfers.extend(
                listed
                    .into_iter()
                    .filter(|transfer| transfer.reference == reference),
            );
            match page.get("next_after").and_then(Value::as_i64) {
                Some(next) => after = next,
                None => return Ok(transfers),
            }
        }
    }

    /// A target's `/metrics`, as (name, summed value) for the payonce counters.
    pub async fn metrics(&self, target: usize) -> Result<Vec<(String, f64)>, ClientError> {
        let response = self.client.get(self.url(target, "/metrics")).send().await?;
        let status = response.status();
        let text = response.text().await?;
        if status != StatusCode::OK {
            return Err(ClientError::Unexpected {
                what: "read metrics",
                status,
                body: text,
            });
        }
        let mut sums: Vec<(String, f64)> = Vec::new();
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let name = series.split('{').next().unwrap_or(series);
            if !name.ends_with("_total") {
                continue;
            }
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            match sums.iter_mut().find(|(known, _)| known == name) {
                Some((_, sum)) => *sum += value,
                None => sums.push((name.to_owned(), value)),
            }
        }
        Ok(sums)
    }

    /// The parsed URL of a target's `/healthz`, for [`healthz`](Self::healthz) to reuse.
    pub fn healthz_url(&self, target: usize) -> Result<reqwest::Url, ClientError> {
        reqwest::Url::parse(&self.url(target, "/healthz")).map_err(|error| {
            ClientError::Unexpected {
                what: "parse a target",
                status: StatusCode::BAD_REQUEST,
                body: error.to_string(),
            }
        })
    }

    /// GET /healthz, for the generator benchmark: the status, or `None` on a transport
    /// error.
    pub async fn healthz(&self, url: reqwest::Url) -> Option<u16> {
        let response = self.client.get(url).send().await.ok()?;
        let status = response.status().as_u16();
        let _ = response.bytes().await;
        Some(status)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server on loopback that answers every request with `response`; returns its base
    /// URL and how many connections it accepted.
    async fn serve(response: String) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let response = response.clone();
                tokio::spawn(async move {
                    // Read the head and the body the head announces, then answer and close.
                    let mut request = Vec::new();
                    let mut buffer = [0_u8; 4096];
                    loop {
                        let Ok(read) = socket.read(&mut buffer).await else {
                            return;
                        };
                        if read == 0 {
                            return;
                        }
                        request.extend_from_slice(&buffer[..read]);
                        let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
                        if let Some(head) = text.find("\r\n\r\n") {
                            let length = text
                                .lines()
                                .find_map(|line| line.strip_prefix("content-length:"))
                                .and_then(|value| value.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if request.len() >= head + 4 + length {
                                break;
                            }
                        }
                    }
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        (base, accepted)
    }

    /// A target that redirects elsewhere is not followed: the 307 is the recorded answer,
    /// and the place it points to never hears from the client.
    #[tokio::test]
    async fn redirects_are_not_followed() {
        let body = r#"{"ticket_id":"t","account_id":"a","amount":1,"balance":0}"#;
        let (elsewhere, reached) = serve(format!(
            "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ))
        .await;
        let (target, _) = serve(format!(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: {elsewhere}/v1/accounts/a/withdrawals\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        ))
        .await;
        let api = Api::new(vec![target.clone()], 1).unwrap();
        let answer = api
            .spend(0, "a", "k", "t", SpendKind::Withdrawal, 1, None, &[])
            .await;
        assert_eq!(answer.status, Some(307), "{answer:?}");
        let ticket = api.ticket(0, "a", "k").await;
        assert_eq!((ticket.status, ticket.ticket), (Some(307), None));
        assert_eq!(
            reached.load(Ordering::SeqCst),
            0,
            "the redirect was followed"
        );
    }

    /// `localhost` reaches a server on 127.0.0.1 (the pin keeps the URL's port).
    #[tokio::test]
    async fn localhost_is_reached_on_loopback() {
        let (target, reached) = serve(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
                .to_owned(),
        )
        .await;
        let api = Api::new(vec![target.replace("127.0.0.1", "localhost")], 1).unwrap();
        assert_eq!(api.ticket(0, "a", "k").await.status, Some(503));
        assert_eq!(reached.load(Ordering::SeqCst), 1);
    }

    /// `Retry-After` in seconds is read from a spend's answer and a ticket request's; an
    /// answer without one, or with a date, has none.
    #[tokio::test]
    async fn retry_after_is_read_in_seconds() {
        let busy = |retry_after: &str| {
            format!(
                "HTTP/1.1 409 Conflict\r\n{retry_after}content-type: application/problem+json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
            )
        };
        for (header, expected) in [
            ("retry-after: 3\r\n", Some(3)),
            ("retry-after: Wed, 21 Oct 2015 07:28:00 GMT\r\n", None),
            ("", None),
        ] {
            let (target, _) = serve(busy(header)).await;
            let api = Api::new(vec![target], 1).unwrap();
            let answer = api
                .spend(0, "a", "k", "t", SpendKind::Withdrawal, 1, None, &[])
                .await;
            assert_eq!((answer.status, answer.retry_after), (Some(409), expected));
            assert_eq!(api.ticket(0, "a", "k").await.retry_after, expected);
        }
    }
}
