//! The load test's access to the payonce HTTP contract: payonce-client for every request
//! of the contract — aimed at a chosen target, each send observed for the auditor — and
//! a plain HTTP client for what lies outside it (the bank's transfers, `/metrics`,
//! `/healthz`). Nothing else: the load test could drive any implementation of the
//! contract.

use std::time::Duration;

use payonce_client::types::accounts::NewAccountRequest;
use payonce_client::types::orders::OrderRequest;
use payonce_client::types::webhooks::EndpointRequest;
use payonce_client::{Client as Payonce, ResendPolicy};
use reqwest::{Client, StatusCode};
use serde_json::Value;
use uuid::Uuid;

use crate::history::{
    AccountState, BankTransfer, EntryRecord, HoldRead, PayoutState, PayoutStatus, TicketState,
};

/// Errors setting up or reading back (not the answers under test: those are recorded).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A call of the contract did not come to an answer the run can use.
    #[error("{what}: {error}")]
    Payonce {
        /// What was asked.
        what: &'static str,
        /// What went wrong.
        error: payonce_client::Error,
    },
    /// A request outside the contract (the bank, `/metrics`) did not get an answer.
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

impl ClientError {
    /// What a failed call of the contract made while asking `what`, for `map_err`.
    fn payonce(what: &'static str) -> impl Fn(payonce_client::Error) -> Self + Copy {
        move |error| Self::Payonce { what, error }
    }
}

impl ClientError {
    /// Whether the ledger does not know what was asked about (401 for an API key it does
    /// not hold, 404 for an account or ticket): after a run whose ledger failed over, what
    /// a client was told exists and the ledger lost.
    pub fn unknown_to_the_ledger(&self) -> bool {
        match self {
            Self::Payonce { error, .. } => error
                .problem()
                .is_some_and(|problem| matches!(problem.status, 401 | 404)),
            _ => false,
        }
    }
}

/// An id the run holds as text, as the client wants it.
pub fn id(text: &str, what: &'static str) -> Result<Uuid, ClientError> {
    text.parse().map_err(|_| ClientError::Unexpected {
        what,
        status: StatusCode::OK,
        body: format!("{text:?} is not an id"),
    })
}

/// The targets, through payonce-client and a plain HTTP client that share one connection
/// pool.
#[derive(Debug, Clone)]
pub struct Api {
    http: Client,
    payonce: Payonce,
    targets: Vec<String>,
}

impl Api {
    /// A client with a connection pool large enough for `connections` concurrent requests.
    ///
    /// It goes only where the targets say (see [`safety`](crate::safety)): it follows no
    /// redirect (a 3xx is recorded as the answer, like any other), uses no proxy (not even
    /// one from the environment), and connects to `localhost` only on 127.0.0.1 or ::1,
    /// whatever the system's resolver says.
    ///
    /// Setup and read-back calls resend by payonce-client's default policy (or the one
    /// [`resending_by`](Self::resending_by) gives), moving on to the next target after no
    /// answer, a 429 or a 503 (an instance killed during the run must not stop the
    /// read-back); the run's spends and ticket requests resend by its own
    /// ([`RetryPolicy`](crate::retry::RetryPolicy)).
    pub fn new(targets: Vec<String>, connections: usize) -> Result<Self, ClientError> {
        let http = Client::builder()
            .pool_max_idle_per_host(connections.max(1))
            .timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .resolve_to_addrs("localhost", &crate::safety::LOCALHOST)
            .build()?;
        let targets: Vec<String> = targets
            .into_iter()
            .map(|target| target.trim_end_matches('/').to_owned())
            .collect();
        let payonce = targets
            .iter()
            .fold(
                Payonce::builder()
                    .http_client(http.clone())
                    .resend_policy(ResendPolicy::default()),
                |builder, target| builder.base_url(target.as_str()),
            )
            .build()
            .map_err(ClientError::payonce("read the targets"))?;
        Ok(Self {
            http,
            payonce,
            targets,
        })
    }

    /// The same, its setup and read-back calls resending by `policy` instead.
    pub fn resending_by(mut self, policy: ResendPolicy) -> Self {
        self.payonce = self.payonce.with_resend_policy(policy);
        self
    }

    /// The targets.
    pub fn targets(&self) -> &[String] {
        &self.targets
    }

    /// payonce-client, with every target as a base URL in the targets' order (so a base's
    /// index is its target's).
    pub fn payonce(&self) -> &Payonce {
        &self.payonce
    }

    /// payonce-client with an account's key, its calls starting at `target`.
    fn at(&self, target: usize, key: &str) -> Payonce {
        self.payonce.with_key(key).starting_at(target)
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
        let request = NewAccountRequest {
            name: "loadtest".into(),
            balance,
            points,
        };
        let opened = self
            .payonce
            .starting_at(target)
            .open_account(&request)
            .await
            .map_err(ClientError::payonce("open an account"))?;
        Ok((opened.id.to_string(), opened.api_key))
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
        let endpoint = EndpointRequest {
            url: url.to_owned(),
            events: None,
        };
        let created = self
            .at(target, key)
            .create_webhook_endpoint(id(account, "an account")?, &endpoint)
            .await
            .map_err(ClientError::payonce("create a webhook endpoint"))?;
        Ok(created.secret)
    }

    /// Places an order of `amount` for the account: its id.
    pub async fn place_order(
        &self,
        target: usize,
        account: &str,
        key: &str,
        amount: i64,
    ) -> Result<String, ClientError> {
        let order = OrderRequest {
            amount,
            description: "loadtest".into(),
        };
        let placed = self
            .at(target, key)
            .place_order(id(account, "an account")?, &order)
            .await
            .map_err(ClientError::payonce("place an order"))?;
        Ok(placed.order_id.to_string())
    }

    /// An account's balance, points and every entry.
    pub async fn account_state(
        &self,
        target: usize,
        account: &str,
        key: &str,
    ) -> Result<AccountState, ClientError> {
        let payonce = self.at(target, key);
        let account = id(account, "an account")?;
        let read = ClientError::payonce("read an account");
        let view = payonce.account(account).await.map_err(read)?;
        let mut state = AccountState {
            balance: view.balance,
            points: view.points,
            available: Some(view.available),
            entries: Vec::new(),
        };
        let mut after = None;
        loop {
            let page = payonce
                .entries(account, after, Some(1000))
                .await
                .map_err(read)?;
            state
                .entries
                .extend(page.entries.into_iter().map(|entry| EntryRecord {
                    id: entry.id,
                    ticket_id: entry.ticket_id.map(|ticket| ticket.to_string()),
                    kind: entry.kind,
                    order_id: entry.order_id.map(|order| order.to_string()),
                    payout_id: entry.payout_id.map(|payout| payout.to_string()),
                    amount: entry.amount,
                    points: entry.points,
                    balance_after: entry.balance_after,
                    points_after: entry.points_after,
                }));
            match page.next_after {
                Some(next) => after = Some(next),
                None => return Ok(state),
            }
        }
    }

    /// A hold as it reads now (its account and placing ticket left empty: the caller
    /// knows them).
    pub async fn hold_state(
        &self,
        target: usize,
        hold: &str,
        key: &str,
    ) -> Result<HoldRead, ClientError> {
        let view = self
            .at(target, key)
            .hold_state(id(hold, "a hold")?)
            .await
            .map_err(ClientError::payonce("read a hold"))?;
        let state = wire_name(&view.state);
        Ok(HoldRead {
            account: String::new(),
            ticket: String::new(),
            amount: view.amount,
            state,
            captured_amount: view.captured_amount,
            refunded_amount: view.refunded_amount,
        })
    }

    /// A ticket's state and stored response.
    pub async fn ticket_state(
        &self,
        target: usize,
        ticket: &str,
        key: &str,
    ) -> Result<TicketState, ClientError> {
        let view = self
            .at(target, key)
            .ticket(id(ticket, "a ticket")?)
            .await
            .map_err(ClientError::payonce("read a ticket"))?;
        let state = wire_name(&view.state);
        let (status, body) = match view.response {
            Some(stored) => (Some(stored.status), Some(stored.body)),
            None => (None, None),
        };
        Ok(TicketState {
            state,
            status,
            body,
        })
    }

    /// An account's payouts (`GET /v1/payouts`, every page), or only those in `status`.
    pub async fn payouts(
        &self,
        target: usize,
        key: &str,
        status: Option<PayoutStatus>,
    ) -> Result<Vec<PayoutState>, ClientError> {
        let payonce = self.at(target, key);
        let mut payouts = Vec::new();
        let mut after = None;
        loop {
            let page = payonce
                .payouts(status.map(PayoutStatus::name), after, Some(1000))
                .await
                .map_err(ClientError::payonce("list payouts"))?;
            for payout in page.payouts {
                // The contract's names are the status's own (serde's, as `name` gives them).
                let status =
                    serde_json::from_value(Value::String(payout.status.clone())).map_err(|_| {
                        ClientError::Unexpected {
                            what: "list payouts",
                            status: StatusCode::OK,
                            body: format!("a payout in status {:?}", payout.status),
                        }
                    })?;
                payouts.push(PayoutState {
                    payout_id: payout.payout_id.to_string(),
                    account_id: payout.account_id.to_string(),
                    ticket_id: payout.ticket_id.to_string(),
                    amount: payout.amount,
                    status,
                    bank_key: payout.bank_key,
                    bank_transfer_id: payout.bank_transfer_id,
                    attempts: payout.attempts,
                });
            }
            match page.next_after {
                Some(next) => after = Some(next),
                None => return Ok(payouts),
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
                .http
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
        let response = self.http.get(self.url(target, "/metrics")).send().await?;
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
        let response = self.http.get(url).send().await.ok()?;
        let status = response.status().as_u16();
        let _ = response.bytes().await;
        Some(status)
    }
}

/// The name a state enum goes by on the wire (`"held"`, `"completed"`), as the client
/// serializes it; empty for one that is not a plain name.
fn wire_name(state: &impl serde::Serialize) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|state| state.as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use payonce_client::Attempt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::retry::RetryPolicy;

    /// What a scripted server heard: each request's head, in order.
    type Heard = Arc<Mutex<Vec<String>>>;

    /// A server on loopback that answers its n-th connection with the n-th of `script`
    /// (the last one again once the script runs out), and closes it; returns its base URL
    /// and the heads of the requests it took.
    async fn serve(script: Vec<String>) -> (String, Heard) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let heard: Heard = Arc::default();
        let requests = heard.clone();
        tokio::spawn(async move {
            let mut answered = 0;
            while let Ok((mut socket, _)) = listener.accept().await {
                let response = script[answered.min(script.len() - 1)].clone();
                answered += 1;
                let requests = requests.clone();
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
                                requests.lock().unwrap().push(text[..head].to_owned());
                                break;
                            }
                        }
                    }
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        (base, heard)
    }

    fn answer(status: &str, headers: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\n{headers}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    /// payonce-client at the API's targets, and what it observed.
    fn observed(api: &Api) -> (Payonce, Arc<Mutex<Vec<Attempt>>>) {
        let seen: Arc<Mutex<Vec<Attempt>>> = Arc::default();
        let observer = seen.clone();
        let payonce = api
            .payonce()
            .with_key("k")
            .with_resend_policy(RetryPolicy::none().resend())
            .on_attempt(move |attempt| observer.lock().unwrap().push(attempt.clone()));
        (payonce, seen)
    }

    fn statuses(seen: &Mutex<Vec<Attempt>>) -> Vec<(Option<u16>, Option<Duration>)> {
        let seen = seen.lock().unwrap();
        seen.iter()
            .map(|attempt| (attempt.status, attempt.retry_after))
            .collect()
    }

    /// The 201 of a withdrawal of 1 with `ticket` from the nil account.
    fn withdrawn(ticket: Uuid) -> String {
        answer(
            "201 Created",
            "",
            &format!(
                r#"{{"ticket_id":"{ticket}","account_id":"{}","amount":1,"balance":9}}"#,
                Uuid::nil()
            ),
        )
    }

    /// A withdrawal (with a ticket) and a ticket request sent once each to `target`: the
    /// statuses and `Retry-After`s payonce-client observed.
    async fn withdrawal_and_ticket(target: String) -> Vec<(Option<u16>, Option<Duration>)> {
        let api = Api::new(vec![target], 1).unwrap();
        let (payonce, seen) = observed(&api);
        let _ = payonce
            .withdrawal(Uuid::nil(), 1)
            .with_ticket(Uuid::nil())
            .send()
            .await;
        let _ = payonce.take_ticket(Uuid::nil()).await;
        statuses(&seen)
    }

    /// A target that redirects elsewhere is not followed: the 307 is the recorded answer,
    /// and the place it points to never hears from the client.
    #[tokio::test]
    async fn redirects_are_not_followed() {
        let body = r#"{"ticket_id":"t","account_id":"a","amount":1,"balance":0}"#;
        let (elsewhere, reached) = serve(vec![answer("201 Created", "", body)]).await;
        let (target, _) = serve(vec![answer(
            "307 Temporary Redirect",
            &format!("location: {elsewhere}/v1/accounts/a/withdrawals\r\n"),
            "",
        )])
        .await;
        assert_eq!(
            withdrawal_and_ticket(target).await,
            vec![(Some(307), None); 2]
        );
        assert!(
            reached.lock().unwrap().is_empty(),
            "the redirect was followed"
        );
    }

    /// `localhost` reaches a server on 127.0.0.1 (the pin keeps the URL's port).
    #[tokio::test]
    async fn localhost_is_reached_on_loopback() {
        let (target, reached) = serve(vec![answer("503 Service Unavailable", "", "{}")]).await;
        let api = Api::new(vec![target.replace("127.0.0.1", "localhost")], 1).unwrap();
        let (payonce, seen) = observed(&api);
        let _ = payonce.take_ticket(Uuid::nil()).await;
        assert_eq!(statuses(&seen), vec![(Some(503), None)]);
        assert_eq!(reached.lock().unwrap().len(), 1);
    }

    /// `Retry-After` in seconds is read from a spend's answer and a ticket request's; an
    /// answer without one, or with a date, has none.
    #[tokio::test]
    async fn retry_after_is_read_in_seconds() {
        for (header, expected) in [
            ("retry-after: 3\r\n", Some(Duration::from_secs(3))),
            ("retry-after: Wed, 21 Oct 2015 07:28:00 GMT\r\n", None),
            ("", None),
        ] {
            let (target, _) = serve(vec![answer("409 Conflict", header, "{}")]).await;
            assert_eq!(
                withdrawal_and_ticket(target).await,
                vec![(Some(409), expected); 2]
            );
        }
    }

    /// A 503 `outcome-unknown`, which payonce-client reports rather than resends, is sent
    /// again by the load test with the same ticket — within the run's bound, counted in it
    /// — until an outcome; without retries it is sent once.
    #[tokio::test]
    async fn outcome_unknown_is_sent_again_with_the_same_ticket() {
        let unknown = answer(
            "503 Service Unavailable",
            "",
            r#"{"type":"/problems/outcome-unknown","title":"Outcome unknown","status":503}"#,
        );
        let ticket = Uuid::new_v4();
        let done = withdrawn(ticket);
        for (policy, script, expected) in [
            (
                RetryPolicy {
                    max_attempts: 5,
                    max_backoff: Duration::from_millis(1),
                },
                vec![unknown.clone(), unknown.clone(), done.clone()],
                vec![Some(503), Some(503), Some(201)],
            ),
            (
                RetryPolicy {
                    max_attempts: 2,
                    max_backoff: Duration::from_millis(1),
                },
                vec![unknown.clone(), unknown.clone(), done.clone()],
                vec![Some(503), Some(503)],
            ),
            (
                RetryPolicy::none(),
                vec![unknown.clone(), done.clone()],
                vec![Some(503)],
            ),
        ] {
            let (target, heard) = serve(script).await;
            let api = Api::new(vec![target], 1).unwrap();
            let seen: Arc<Mutex<Vec<Attempt>>> = Arc::default();
            let observer = seen.clone();
            let intent = api
                .payonce()
                .with_key("k")
                .on_attempt(move |attempt| observer.lock().unwrap().push(attempt.clone()))
                .withdrawal(Uuid::nil(), 1)
                .with_ticket(ticket);
            let counter = seen.clone();
            policy
                .send(intent, move || counter.lock().unwrap().len() as u32)
                .await;
            let statuses: Vec<Option<u16>> = statuses(&seen)
                .into_iter()
                .map(|(status, _)| status)
                .collect();
            assert_eq!(statuses, expected, "{policy:?}");
            let heard = heard.lock().unwrap();
            assert_eq!(heard.len(), expected.len());
            let key = format!("idempotency-key: {ticket}");
            assert!(heard.iter().all(|head| head.contains(&key)), "{heard:?}");
        }
    }

    /// The resend after an `outcome-unknown` goes to the next target, as every send after
    /// no answer, a 429 or a 503 does — and a transient 409 stays where it was; the
    /// recorded targets say so.
    #[tokio::test]
    async fn resends_move_on_after_a_503_and_stay_after_a_409() {
        let ticket = Uuid::new_v4();
        let done = withdrawn(ticket);
        let problem = |status: &str, name: &str| {
            answer(
                status,
                "",
                &format!(
                    r#"{{"type":"/problems/{name}","title":"t","status":{}}}"#,
                    &status[..3]
                ),
            )
        };
        let unknown = problem("503 Service Unavailable", "outcome-unknown");
        let busy = problem("409 Conflict", "request-in-progress");
        for (first, expected) in [(unknown, vec![0, 1]), (busy, vec![0, 0])] {
            // Target 0 answers `first`, then the outcome; target 1 the outcome at once.
            let (zero, _) = serve(vec![first, done.clone()]).await;
            let (one, _) = serve(vec![done.clone()]).await;
            let api = Api::new(vec![zero, one], 1).unwrap();
            let seen: Arc<Mutex<Vec<Attempt>>> = Arc::default();
            let observer = seen.clone();
            let intent = api
                .payonce()
                .with_key("k")
                .starting_at(0)
                .on_attempt(move |attempt| observer.lock().unwrap().push(attempt.clone()))
                .withdrawal(Uuid::nil(), 1)
                .with_ticket(ticket);
            let counter = seen.clone();
            let policy = RetryPolicy {
                max_attempts: 5,
                max_backoff: Duration::from_millis(1),
            };
            policy
                .send(intent, move || counter.lock().unwrap().len() as u32)
                .await;
            let targets: Vec<usize> = seen
                .lock()
                .unwrap()
                .iter()
                .map(|attempt| attempt.base_index)
                .collect();
            // After the 409 the resend stays on target 0, which then answers the outcome.
            assert_eq!(targets, expected);
        }
    }
}
