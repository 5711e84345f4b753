//! Payouts after the commit: the workers that send each payout to the bank and record the
//! bank's word (`Dispatcher`), and the bank's HTTP API as they use it ([`Bank`]).
//!
//! A payout's spend commits the debit, the payout and its outbox job together (the
//! ledger's `outbox.rs`); only then is the bank called, by whichever instance's worker
//! claims the job. Every call for one payout carries the same `Idempotency-Key`
//! ([`ledger::payouts::bank_key`]), on every attempt, from every instance, so the bank
//! executes it at most once however often it is sent. What comes back decides:
//!
//! - the transfer made (2xx, or the replay of one) → `succeeded`;
//! - the bank's final refusal stored under the key (422 `destination-closed`), or the key
//!   closed → `failed`, and the ledger credits the amount back in the same transaction;
//! - no word (a timeout, a dropped connection, a 5xx) → sent again later with the same
//!   key, after a backoff that doubles with jitter (or the bank's `Retry-After`);
//! - a throttle (429) → sent again later, the same way, but not counted toward
//!   `PAYONCE_PAYOUT_ATTEMPTS`: a bank that asks to wait has not refused, and closing the
//!   key on it would hand the money back while the bank was only pacing its callers. What
//!   bounds a payout that keeps being throttled is its age
//!   (`PAYONCE_PAYOUT_THROTTLE_MAX_AGE`);
//! - a 4xx that left the key free (the bank found the request malformed), past
//!   `PAYONCE_PAYOUT_ATTEMPTS` attempts without a word (throttles not counted), and a
//!   throttle past the age bound: the bank is asked for the transfer by its key. It made
//!   or refused it → settled so. It has none → the key is closed there (after which the
//!   bank never executes it), and only a `closed` answer lets the payout fail and its
//!   money come back. A bank that does not answer leaves the payout pending;
//!   `GET /v1/payouts?status=pending` and the metrics show it.
//!
//! What a worker records — the payout's `last_error` and `failure_reason`, which the
//! account reads and its `payout.failed` event carries — is a reason of payonce's own
//! ("the bank did not answer within the timeout", "the bank answered 503",
//! "the bank refused: destination-closed"), never an HTTP client's error text: that text
//! names the URL, and the bank's address is the operator's business, not the account's.
//! The full error goes to the log.
//!
//! A worker that dies mid-call leaves its job leased; once the lease runs out another
//! instance's worker claims it as the next attempt and sends it again, with the same key.
//! A worker settles or postpones a job only at the attempt it claimed, so a late answer to
//! an old attempt records nothing.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use ledger::payouts::{JobOutcome, Payout, PayoutId, PayoutJob, Settlement, bank_key};
use ledger::{JobKind, Ledger};
use reqwest::StatusCode;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::bank_fault::FirstAttemptFaults;
use crate::metrics::Metrics;
use crate::retry_after;

pub mod config;

/// How payouts are sent: where the bank is, and the schedule.
#[derive(Debug, Clone)]
pub struct PayoutSettings {
    /// The bank's base URL.
    pub bank_url: url::Url,
    /// How long one call to the bank may take.
    pub bank_timeout: Duration,
    /// Workers in this instance.
    pub workers: usize,
    /// How long a claim lasts.
    pub lease: Duration,
    /// The first wait before an attempt is repeated.
    pub retry_base: Duration,
    /// The longest wait between attempts.
    pub retry_max: Duration,
    /// Attempts without the bank's word before the bank is asked by key; throttled
    /// attempts (429) are not counted.
    pub attempts: u32,
    /// How old a payout the bank keeps throttling may grow before the bank is asked by
    /// key: a throttle is not a refusal, so its bound is time, not attempts.
    pub throttle_max_age: Duration,
    /// How often idle workers look for due payouts.
    pub poll: Duration,
    /// A new bank key on every attempt (the demonstration's unsafe recipe) instead of the
    /// payout's one key.
    #[cfg(feature = "demo")]
    pub fresh_key_per_attempt: bool,
}

impl PayoutSettings {
    /// The wait before attempt `attempt + 1`: the base doubled per attempt, with jitter,
    /// at most the maximum — or what the bank asked for, if longer (never past the
    /// maximum). The schedule is `backon`'s; the attempts count lives in the outbox, so
    /// it survives restarts and changes of instance.
    fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let scheduled = ExponentialBuilder::new()
            .with_min_delay(self.retry_base)
            .with_max_delay(self.retry_max)
            .with_jitter()
            .without_max_times()
            .build()
            .nth(attempt.saturating_sub(1) as usize)
            .unwrap_or(self.retry_max);
        scheduled
            .max(retry_after.unwrap_or_default())
            .min(self.retry_max)
    }

    /// Whether `job`'s attempt, which brought no word from the bank, is the one to stop
    /// sending and ask the bank by key: for a throttle, once the payout is older than
    /// `throttle_max_age`; otherwise once the attempts without word, throttles not
    /// counted, reach `attempts`.
    fn gives_up(&self, job: &PayoutJob, throttled: bool) -> bool {
        if throttled {
            job.age() >= self.throttle_max_age
        } else {
            job.attempt.saturating_sub(job.throttled) >= self.attempts
        }
    }
}

/// What payouts need beside the ledger: the bank and the settings. (The ledger's bell
/// wakes an idle worker when a payout is accepted here or elsewhere: `Ledger::rung`.)
#[derive(Debug)]
pub struct Payouts {
    bank: Bank,
    settings: PayoutSettings,
    /// The bank this process serves itself (the embedded mode), kept running as long as
    /// payouts are.
    in_process: Option<bank::ServerHandle>,
    /// The demonstration faults payouts asked of that bank, for their first attempts; none
    /// for a bank at a URL, which is never asked to fail.
    first_attempt_faults: Option<FirstAttemptFaults>,
}

impl Payouts {
    /// Payouts to the bank `settings` names.
    pub fn new(settings: PayoutSettings) -> Result<Self, reqwest::Error> {
        Ok(Self {
            bank: Bank::new(settings.bank_url.clone(), settings.bank_timeout)?,
            settings,
            in_process: None,
            first_attempt_faults: None,
        })
    }

    /// Payouts to a `payonce-bank` served in this process, on a loopback port of its own,
    /// with its store at `database_url` (the embedded mode: a newcomer's payonce pays out
    /// with nothing else running). The demonstration header is on: this bank is for
    /// trying payonce out, not for money. `settings` are made for the bank's address once
    /// it listens.
    pub async fn in_process(
        settings: impl FnOnce(url::Url) -> PayoutSettings,
        database_url: &str,
    ) -> Result<Self, String> {
        let options = bank::BankOptions {
            database_url: database_url.to_owned(),
            demo_header: true,
            ..bank::BankOptions::default()
        };
        let opened = bank::Bank::open(options)
            .await
            .map_err(|error| format!("cannot open the in-process bank: {error}"))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|error| format!("cannot listen for the in-process bank: {error}"))?;
        let server = opened
            .serve(listener)
            .map_err(|error| format!("cannot serve the in-process bank: {error}"))?;
        let bank_url = url::Url::parse(&format!("http://{}", server.addr()))
            .map_err(|error| error.to_string())?;
        tracing::info!(%bank_url, "payouts go to a payonce-bank in this process");
        let mut payouts = Self::new(settings(bank_url)).map_err(|error| error.to_string())?;
        payouts.in_process = Some(server);
        payouts.first_attempt_faults = Some(FirstAttemptFaults::default());
        Ok(payouts)
    }

    /// The settings.
    pub fn settings(&self) -> &PayoutSettings {
        &self.settings
    }

    /// The bank's transfers for `payout`, under whichever keys: those that carry its id
    /// as their reference (every transfer payonce sends for it does), in the bank's order
    /// of commits.
    pub async fn transfers_at_bank(
        &self,
        payout: PayoutId,
    ) -> Result<Vec<bank::TransferView>, String> {
        self.bank
            .transfers_with_reference(&payout.to_string())
            .await
    }

    /// Where a payout's demonstration fault waits for its first attempt: only when the
    /// bank is the one this process serves.
    pub fn first_attempt_faults(&self) -> Option<&FirstAttemptFaults> {
        self.first_attempt_faults.as_ref()
    }
}

/// Runs this instance's payout workers until `stopping`.
pub async fn dispatch(
    ledger: Ledger,
    payouts: Arc<Payouts>,
    metrics: Arc<Metrics>,
    instance: String,
    stopping: CancellationToken,
) {
    let workers: Vec<_> = (0..payouts.settings.workers)
        .map(|number| {
            let worker = Dispatcher {
                ledger: ledger.clone(),
                payouts: Arc::clone(&payouts),
                metrics: Arc::clone(&metrics),
                name: format!("{instance}/{number}"),
            };
            tokio::spawn(worker.run(stopping.clone()))
        })
        .collect();
    for worker in workers {
        let _ = worker.await;
    }
}

/// Jobs a worker claims at once and sends side by side: a claim is a write transaction,
/// so taking a few per claim spares the database; a few, so one worker does not hold
/// many jobs the others could send.
const CLAIM_BATCH: u32 = 32;

/// One payout worker.
struct Dispatcher {
    ledger: Ledger,
    payouts: Arc<Payouts>,
    metrics: Arc<Metrics>,
    name: String,
}

impl Dispatcher {
    /// Claims due jobs and sends them, until `stopping`; idle, waits for the bell or the
    /// poll interval.
    async fn run(self, stopping: CancellationToken) {
        let settings = &self.payouts.settings;
        loop {
            let claimed = self
                .ledger
                .claim_payouts_or_next(&self.name, settings.lease, CLAIM_BATCH)
                .await;
            let wait = match claimed {
                Ok(claimed) if !claimed.jobs.is_empty() => {
                    let jobs = claimed.jobs;
                    // A full claim may have left more due: another worker takes it.
                    if jobs.len() == CLAIM_BATCH as usize {
                        self.ledger.wake_another(JobKind::Payout);
                    }
                    let outcomes =
                        futures::future::join_all(jobs.iter().map(|job| self.send(job))).await;
                    self.record(&jobs, &outcomes).await;
                    if stopping.is_cancelled() {
                        return;
                    }
                    continue;
                }
                Ok(claimed) => claimed.idle_wait(settings.poll),
                Err(error) => {
                    tracing::warn!(%error, worker = %self.name, "cannot claim payouts");
                    settings.poll
                }
            };
            // Asleep until a payout is accepted (here or elsewhere: the ledger rings), the
            // next attempt known is due, or the poll interval passes.
            tokio::select! {
                () = stopping.cancelled() => return,
                () = self.ledger.rung(JobKind::Payout) => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One attempt of `job`: the transfer sent, and what comes of it.
    async fn send(&self, job: &PayoutJob) -> JobOutcome {
        let key = job.payout.bank_key();
        #[cfg(feature = "demo")]
        let key = if self.payouts.settings.fresh_key_per_attempt {
            crate::demo::fresh_bank_key(&job.payout, job.attempt)
        } else {
            key
        };
        let fault = self
            .payouts
            .first_attempt_faults
            .as_ref()
            .and_then(|faults| faults.take(job.payout.id, job.attempt));
        let answer = self.payouts.bank.transfer(&job.payout, &key, fault).await;
        self.metrics.payout_attempt(answer.outcome());
        let settings = &self.payouts.settings;
        match answer {
            Answer::Made { transfer_id } => {
                JobOutcome::Settled(Settlement::Succeeded { transfer_id })
            }
            Answer::Refused { reason } => JobOutcome::Settled(Settlement::Failed { reason }),
            Answer::NoWord {
                error,
                retry_after,
                key_left_free,
                throttled,
            } => {
                if !key_left_free && !settings.gives_up(job, throttled) {
                    return self.postponed(job, retry_after, error, throttled);
                }
                let error = if throttled {
                    let bound = humantime::format_duration(settings.throttle_max_age);
                    format!("{error}, still asking to wait once the payout was {bound} old")
                } else {
                    error
                };
                self.ask(job, &error, throttled).await
            }
        }
    }

    /// No word for too long (or a request the bank will never take): ask the bank for the
    /// transfer by its key; if it has none, close the key there and fail the payout only
    /// on the bank's `closed`. Any other answer, or none, leaves it pending — as a
    /// throttled attempt still when `throttled` (the attempt's own answer was a 429).
    async fn ask(&self, job: &PayoutJob, error: &str, throttled: bool) -> JobOutcome {
        let key = bank_key(job.payout.id);
        let found = match self.payouts.bank.look_up(&key).await {
            Found::Nothing => self.payouts.bank.close(&key).await,
            found => found,
        };
        match found {
            Found::Made { transfer_id } => {
                JobOutcome::Settled(Settlement::Succeeded { transfer_id })
            }
            Found::Refused { reason } => JobOutcome::Settled(Settlement::Failed { reason }),
            Found::Closed => JobOutcome::Settled(Settlement::Failed {
                reason: format!("not made ({error}); the key is closed at the bank"),
            }),
            Found::NoWord { error: asked } => self.postponed(
                job,
                None,
                format!("{error}; asking the bank: {asked}"),
                throttled,
            ),
            Found::Nothing => self.postponed(
                job,
                None,
                format!("{error}; the bank had no transfer and did not close the key"),
                throttled,
            ),
        }
    }

    /// Another attempt later, after the backoff (or the bank's `Retry-After`).
    fn postponed(
        &self,
        job: &PayoutJob,
        retry_after: Option<Duration>,
        error: String,
        throttled: bool,
    ) -> JobOutcome {
        JobOutcome::Postponed {
            after: self.payouts.settings.backoff(job.attempt, retry_after),
            error,
            throttled,
        }
    }

    /// Records what came of a batch, in one transaction. If that fails, the jobs' leases
    /// run out and another attempt asks the bank again: its answer for each key is the
    /// same.
    async fn record(&self, jobs: &[PayoutJob], outcomes: &[JobOutcome]) {
        let pairs: Vec<(&PayoutJob, &JobOutcome)> = jobs.iter().zip(outcomes).collect();
        match self.ledger.record_payouts(&pairs, &render_payout).await {
            Ok(recorded) => {
                for ((job, outcome), recorded) in pairs.iter().zip(recorded) {
                    match (outcome, recorded) {
                        (_, false) => {
                            tracing::info!(payout = %job.payout.id, attempt = job.attempt, "payout claimed again meanwhile; this attempt's word is not recorded")
                        }
                        (JobOutcome::Settled(settlement), true) => {
                            self.metrics.payout_settled(match settlement {
                                Settlement::Succeeded { .. } => "succeeded",
                                Settlement::Failed { .. } => "failed",
                            });
                            tracing::debug!(payout = %job.payout.id, attempt = job.attempt, ?settlement, "payout settled")
                        }
                        (JobOutcome::Postponed { after, error, .. }, true) => {
                            tracing::info!(payout = %job.payout.id, attempt = job.attempt, wait = ?after, error, "payout not settled; sending it again later")
                        }
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, jobs = jobs.len(), "cannot record the payouts' outcomes; their leases will run out and they are sent again");
            }
        }
    }
}

/// A settled payout as its event (`payout.succeeded`, `payout.failed`) shows it: as
/// `GET /v1/payouts/{payout_id}` does.
fn render_payout(payout: &Payout) -> serde_json::Value {
    serde_json::to_value(crate::render::payout_view(payout.clone()))
        .unwrap_or(serde_json::Value::Null)
}

/// What the bank said to a transfer, as far as the payout goes.
#[derive(Debug)]
enum Answer {
    /// It made the transfer (now, or before: a replay).
    Made { transfer_id: String },
    /// Its final refusal, stored under the key, or the key closed: it never will.
    Refused { reason: String },
    /// No word on this attempt. `key_left_free`: a 4xx that stored nothing — the same
    /// request would be refused again, so the bank is asked rather than sent it again.
    /// `throttled`: a 429 — the bank asked to wait, which is not counted toward giving up.
    NoWord {
        error: String,
        retry_after: Option<Duration>,
        key_left_free: bool,
        throttled: bool,
    },
}

impl Answer {
    fn outcome(&self) -> &'static str {
        match self {
            Self::Made { .. } => "made",
            Self::Refused { .. } => "refused",
            Self::NoWord { .. } => "no_word",
        }
    }
}

/// What the bank holds under a key.
#[derive(Debug)]
enum Found {
    Made {
        transfer_id: String,
    },
    Refused {
        reason: String,
    },
    /// The key is closed: no transfer, and never one.
    Closed,
    /// No transfer yet, and the key is free.
    Nothing,
    NoWord {
        error: String,
    },
}

/// What a look-up or a close answers with 200: the transfer that holds the key, or the
/// key closed with none.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Held {
    Transfer(bank::TransferView),
    Closed(bank::ClosedKey),
}

/// A problem document's name, the last segment of its `type`.
#[derive(Debug, Default, Deserialize)]
struct Problem {
    #[serde(rename = "type", default)]
    kind: String,
}

impl Problem {
    fn name(&self) -> &str {
        self.kind.rsplit('/').next().unwrap_or_default()
    }
}

/// Why a call to the bank brought no answer, as a payout records it: reqwest's own text
/// names the URL — the bank's host and port — and what is recorded reaches the account
/// (`last_error`, `failure_reason`, the `payout.failed` event). The full error, URL and
/// cause, goes to the log for the operator.
fn unanswered(call: &'static str, error: &reqwest::Error) -> &'static str {
    tracing::warn!(call, ?error, "no answer from the bank");
    if error.is_connect() {
        "cannot connect to the bank"
    } else if error.is_timeout() {
        "the bank did not answer within the timeout"
    } else if error.is_decode() {
        "the bank's answer could not be read"
    } else {
        "the connection to the bank ended without an answer"
    }
}

/// A status the bank answered, and its own code for it when it gave one.
fn answered(status: StatusCode, code: Option<&str>) -> String {
    match code {
        Some(code) => format!("the bank answered {} ({code})", status.as_u16()),
        None => format!("the bank answered {}", status.as_u16()),
    }
}

/// The bank's final refusal, in its own code when it gave one.
fn refused(code: Option<&str>) -> String {
    match code {
        Some(code) => format!("the bank refused: {code}"),
        None => "the bank refused".to_owned(),
    }
}

/// The longest code of the bank's that a payout repeats.
const MAX_CODE: usize = 64;

/// The bank's API: transfers by idempotency key.
#[derive(Debug, Clone)]
pub struct Bank {
    client: reqwest::Client,
    base: url::Url,
}

impl Bank {
    /// The bank at `base`, each call bounded by `timeout`.
    pub fn new(base: url::Url, timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()?;
        Ok(Self { client, base })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base.as_str().trim_end_matches('/'))
    }

    /// `raw`, a code from the bank's body (a problem's name, a decline reason), if a
    /// payout may repeat it: a word of letters, digits, `-` and `_` that starts with a
    /// letter — so no URL, no address, no port — and does not name the bank's host. A
    /// bank's code reaches the account; its free text, or anything else, does not.
    fn code<'a>(&self, raw: &'a str) -> Option<&'a str> {
        let mut chars = raw.chars();
        let word = raw.len() <= MAX_CODE
            && chars
                .next()
                .is_some_and(|first| first.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        let names_host = self.base.host_str().is_some_and(|host| {
            raw.to_ascii_lowercase()
                .contains(&host.to_ascii_lowercase())
        });
        (word && !names_host).then_some(raw)
    }

    /// What the bank's transfer says of the payout.
    fn found(&self, transfer: bank::TransferView) -> Found {
        match transfer.state {
            bank::State::Executed => Found::Made {
                transfer_id: transfer.id.to_string(),
            },
            bank::State::Declined => Found::Refused {
                reason: refused(
                    transfer
                        .decline_reason
                        .as_deref()
                        .and_then(|r| self.code(r)),
                ),
            },
            bank::State::Closed => Found::Closed,
        }
    }

    /// Sends `payout` as a transfer, under `key` — asking the bank to play `fault` on it
    /// (the demonstration bank only: `crate::bank_fault`). Traced as `bank.transfer`, with
    /// the W3C trace context sent on.
    #[tracing::instrument(
        name = "bank.transfer",
        skip_all,
        fields(otel.kind = "client", payout_id = %payout.id)
    )]
    async fn transfer(&self, payout: &Payout, key: &str, fault: Option<bank::Fault>) -> Answer {
        let body = serde_json::json!({
            "destination": payout.destination,
            "amount": payout.amount.get(),
            "reference": payout.id.to_string(),
        });
        let mut request = self
            .client
            .post(self.url("/v1/transfers"))
            .header("Idempotency-Key", key)
            .headers(crate::telemetry::trace_headers())
            .json(&body);
        if let Some(fault) = fault {
            request = request.header(bank::FAULT_HEADER, fault.name());
        }
        let sent = request.send().await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => return no_word(unanswered("transfer", &error).to_owned(), None),
        };
        let status = response.status();
        let retry_after = retry_after::requested(&response);
        if status.is_success() {
            return match response.json::<bank::TransferView>().await {
                Ok(transfer) => match self.found(transfer) {
                    Found::Made { transfer_id } => Answer::Made { transfer_id },
                    Found::Refused { reason } => Answer::Refused { reason },
                    _ => no_word(
                        format!("{} without a made transfer", answered(status, None)),
                        None,
                    ),
                },
                Err(error) => no_word(
                    format!(
                        "{}, then: {}",
                        answered(status, None),
                        unanswered("reading the transfer", &error)
                    ),
                    None,
                ),
            };
        }
        let problem: Problem = response.json().await.unwrap_or_default();
        let code = self.code(problem.name());
        match (status, problem.name()) {
            (StatusCode::UNPROCESSABLE_ENTITY, "destination-closed")
            | (StatusCode::CONFLICT, "idempotency-key-closed") => Answer::Refused {
                reason: refused(code),
            },
            (StatusCode::TOO_MANY_REQUESTS, _) => Answer::NoWord {
                error: answered(status, code),
                retry_after,
                key_left_free: false,
                throttled: true,
            },
            (StatusCode::REQUEST_TIMEOUT, _) => no_word(answered(status, code), retry_after),
            // Another body under this key at the bank: not ours to judge by a refusal.
            (_, "idempotency-key-reuse") => no_word(answered(status, code), None),
            (status, _) if status.is_client_error() => Answer::NoWord {
                error: answered(status, code),
                retry_after: None,
                key_left_free: true,
                throttled: false,
            },
            (status, _) => no_word(answered(status, code), retry_after),
        }
    }

    /// The transfers with `reference`, page by page (the list's `reference` filter).
    async fn transfers_with_reference(
        &self,
        reference: &str,
    ) -> Result<Vec<bank::TransferView>, String> {
        let mut transfers = Vec::new();
        let mut after = 0;
        loop {
            let url = format!(
                "{}?reference={}&after={after}&limit={}",
                self.url("/v1/transfers"),
                encode(reference),
                bank::MAX_PAGE
            );
            let response = self
                .client
                .get(url)
                .send()
                .await
                .map_err(|error| format!("asking the bank: {error}"))?;
            let status = response.status();
            if !status.is_success() {
                return Err(format!("the bank answered {status} to its list"));
            }
            let page: bank::TransferPage = response
                .json()
                .await
                .map_err(|error| format!("reading the bank's transfers: {error}"))?;
            // Checked again here: a bank that ignored the filter would list every
            // transfer it holds.
            transfers.extend(
                page.transfers
                    .into_iter()
                    .filter(|transfer| transfer.reference == reference),
            );
            match page.next_after {
                Some(next) => after = next,
                None => return Ok(transfers),
            }
        }
    }

    /// What the bank holds under `key`.
    async fn look_up(&self, key: &str) -> Found {
        let url = self.url(&format!("/v1/transfers/{}", encode(key)));
        self.ask_for_key(self.client.get(url), "look-up").await
    }

    /// Closes `key` at the bank unless a transfer holds it: then the bank never executes
    /// it. Answers what holds the key now.
    async fn close(&self, key: &str) -> Found {
        let url = self.url(&format!("/v1/transfers/{}/close", encode(key)));
        self.ask_for_key(self.client.post(url), "close").await
    }

    /// Sends `request`, a question about one key (the `call`, for the error), and reads
    /// what holds the key from the answer.
    async fn ask_for_key(&self, request: reqwest::RequestBuilder, call: &'static str) -> Found {
        match request.send().await {
            Ok(response) => self.held(response).await,
            Err(error) => Found::NoWord {
                error: unanswered(call, &error).to_owned(),
            },
        }
    }

    /// What a look-up or a close answered.
    async fn held(&self, response: reqwest::Response) -> Found {
        let status = response.status();
        let unreadable = |error: &reqwest::Error| Found::NoWord {
            error: format!(
                "{}, then: {}",
                answered(status, None),
                unanswered("reading what the bank holds", error)
            ),
        };
        let body: serde_json::Value = match response.json().await {
            Ok(body) => body,
            Err(error) => return unreadable(&error),
        };
        if status == StatusCode::OK {
            return match serde_json::from_value::<Held>(body) {
                Ok(Held::Transfer(transfer)) => self.found(transfer),
                Ok(Held::Closed(key)) if key.state == bank::State::Closed => Found::Closed,
                Ok(Held::Closed(key)) => Found::NoWord {
                    error: format!("the bank answered the key as {:?}", key.state),
                },
                Err(error) => {
                    tracing::warn!(%error, "the bank's 200 holds neither a transfer nor a closed key");
                    Found::NoWord {
                        error: format!("{}, but not as its contract says", answered(status, None)),
                    }
                }
            };
        }
        let problem: Problem = serde_json::from_value(body).unwrap_or_default();
        match (status, problem.name()) {
            (StatusCode::NOT_FOUND, "idempotency-key-closed") => Found::Closed,
            (StatusCode::NOT_FOUND, "transfer-not-found") => Found::Nothing,
            (status, name) => Found::NoWord {
                error: answered(status, self.code(name)),
            },
        }
    }
}

/// A key in a path.
fn encode(key: &str) -> String {
    url::form_urlencoded::byte_serialize(key.as_bytes()).collect()
}

fn no_word(error: String, retry_after: Option<Duration>) -> Answer {
    Answer::NoWord {
        error,
        retry_after,
        key_left_free: false,
        throttled: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PayoutSettings {
        PayoutSettings {
            bank_url: url::Url::parse("http://127.0.0.1:1").expect("a URL"),
            bank_timeout: Duration::from_secs(1),
            workers: 1,
            lease: Duration::from_secs(3),
            retry_base: Duration::from_millis(100),
            retry_max: Duration::from_secs(5),
            attempts: 5,
            throttle_max_age: Duration::from_secs(600),
            poll: Duration::from_millis(100),
            #[cfg(feature = "demo")]
            fresh_key_per_attempt: false,
        }
    }

    #[test]
    fn waits_grow_with_the_attempts_within_the_bounds_and_honour_the_bank() {
        let settings = settings();
        for attempt in 1..=20 {
            let wait = settings.backoff(attempt, None);
            assert!(
                wait >= settings.retry_base.min(settings.retry_max),
                "{attempt}: {wait:?}"
            );
            assert!(wait <= settings.retry_max, "{attempt}: {wait:?}");
        }
        // The tenth wait is past the base doubled eight times (over 25 s) but capped.
        assert_eq!(settings.backoff(10, None), settings.retry_max);
        // The bank's Retry-After is honoured when longer, and still capped.
        assert!(settings.backoff(1, Some(Duration::from_secs(2))) >= Duration::from_secs(2));
        assert_eq!(
            settings.backoff(1, Some(Duration::from_secs(60))),
            settings.retry_max
        );
    }

    /// A job at `attempt`, `throttled` of the claims before it throttled, claimed when
    /// the payout was `age` old.
    fn job(attempt: u32, throttled: u32, age: Duration) -> PayoutJob {
        let created_at = time::OffsetDateTime::UNIX_EPOCH;
        PayoutJob {
            job_id: 1,
            payout: Payout {
                id: PayoutId::random(),
                account_id: ledger::AccountId(uuid::Uuid::new_v4()),
                ticket_id: ledger::TicketId(uuid::Uuid::new_v4()),
                amount: ledger::Amount::new(100).expect("an amount"),
                destination: "acct-1".to_owned(),
                status: ledger::payouts::PayoutStatus::Pending,
                bank_transfer_id: None,
                failure_reason: None,
                attempts: attempt,
                last_error: None,
                created_at,
                settled_at: None,
            },
            attempt,
            throttled,
            claimed_at: created_at + age,
            lease_until: created_at + age + Duration::from_secs(3),
        }
    }

    #[test]
    fn throttles_count_toward_the_age_bound_and_not_the_attempts() {
        let settings = settings();
        let young = Duration::from_secs(1);
        // Five attempts without word, none throttled: the budget is spent.
        assert!(!settings.gives_up(&job(4, 0, young), false));
        assert!(settings.gives_up(&job(5, 0, young), false));
        // Twenty claims of which sixteen were throttled: four without word, then this one.
        assert!(!settings.gives_up(&job(20, 16, young), false));
        assert!(settings.gives_up(&job(21, 16, young), false));
        // A throttle gives up by age alone, however many attempts came before.
        assert!(!settings.gives_up(&job(500, 499, young), true));
        assert!(!settings.gives_up(&job(2, 1, Duration::from_secs(599)), true));
        assert!(settings.gives_up(&job(2, 1, Duration::from_secs(600)), true));
    }
}
