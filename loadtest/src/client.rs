//! A client of the payonce HTTP contract — nothing else: the load test could drive any
//! implementation of it.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::history::{AccountState, EntryRecord, SpendKind, TicketState};

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
    /// 0 when no answer came.
    pub status: u16,
    /// `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// The JSON body.
    pub body: Option<Value>,
    /// How long it took.
    pub latency: Duration,
    /// The transport error.
    pub error: Option<String>,
}

/// An HTTP client for one or more targets.
#[derive(Debug, Clone)]
pub struct Api {
    client: Client,
    targets: Vec<String>,
}

impl Api {
    /// A client with a connection pool large enough for `connections` concurrent requests.
    pub fn new(targets: Vec<String>, connections: usize) -> Result<Self, ClientError> {
        let client = Client::builder()
            .pool_max_idle_per_host(connections.max(1))
            .timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
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

    /// Takes a ticket.
    pub async fn ticket(
        &self,
        target: usize,
        account: &str,
        key: &str,
    ) -> Result<String, ClientError> {
        let response = self
            .client
            .post(self.url(target, &format!("/v1/accounts/{account}/tickets")))
            .bearer_auth(key)
            .send()
            .await?;
        let body = Self::json(response, "take a ticket", StatusCode::CREATED).await?;
        Ok(body
            .get("ticket_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned())
    }

    /// Sends a spend (with any extra headers) and records whatever comes back.
    #[allow(clippy::too_many_arguments)]
    pub async fn spend(
        &self,
        target: usize,
        account: &str,
        key: &str,
        ticket: &str,
        kind: SpendKind,
        amount: i64,
        headers: &[(&str, &str)],
    ) -> Answer {
        let started = Instant::now();
        let mut request = self
            .client
            .post(self.url(target, &format!("/v1/accounts/{account}/{}", kind.path())))
            .bearer_auth(key)
            .header("idempotency-key", ticket)
            .json(&kind.body(amount));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let sent = request.send().await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => {
                return Answer {
                    status: 0,
                    replayed: false,
                    body: None,
                    latency: started.elapsed(),
                    error: Some(error.to_string()),
                };
            }
        };
        let status = response.status().as_u16();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true");
        let body = response.json::<Value>().await;
        Answer {
            status,
            replayed,
            latency: started.elapsed(),
            error: body.as_ref().err().map(ToString::to_string),
            body: body.ok(),
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

    /// GET /healthz, for the generator benchmark: the status, or 0 on a transport error.
    pub async fn healthz(&self, url: reqwest::Url) -> u16 {
        match self.client.get(url).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let _ = response.bytes().await;
                status
            }
            Err(_) => 0,
        }
    }
}
