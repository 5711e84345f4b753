//! Webhooks after the commit: the workers that deliver each committed outcome's event to
//! the endpoints that want it ([`dispatch`]), signed as the Standard Webhooks
//! specification has it.
//!
//! The event and its deliveries are written in the outcome's transaction (the ledger's
//! `events.rs`); a delivery is an outbox job, claimed for a lease by whichever instance's
//! dispatcher gets to it first. Every attempt of one event carries the same `webhook-id`
//! (the event's id, the receiver's key for dropping repeats), a fresh
//! `webhook-timestamp`, and a `webhook-signature` under the endpoint's secret — and,
//! during a rotation, under the one before it too. What comes back decides:
//!
//! - 2xx → delivered;
//! - 410 → the endpoint is disabled, and its other deliveries end with it;
//! - 429, 502, 503, 504 → again on the schedule, or after the receiver's `Retry-After`
//!   (at most a day) where it asks for longer — the attempt counts toward the schedule's
//!   end either way;
//! - anything else, or no answer within the timeout → again on the schedule
//!   (`PAYONCE_WEBHOOK_RETRY_SCHEDULE`: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h after the
//!   first attempt, as the specification suggests, each with up to a tenth of jitter);
//!   once it has run out, the delivery is exhausted, until someone sends it again by hand.
//!
//! Each delivery in flight holds one slot of `PAYONCE_WEBHOOK_CONCURRENCY` for at most the
//! timeout, and one endpoint holds at most `PAYONCE_WEBHOOK_PER_ENDPOINT` of them (what a
//! claim brings beyond that goes back, its attempt uncounted), so a receiver that never
//! answers delays no other endpoint's deliveries. Answers are
//! recorded in batches, by one recorder, in one statement each on PostgreSQL. A dispatcher that dies leaves its
//! deliveries leased; when the lease runs out another instance claims them as the next
//! attempt, and the dead one's late word, if any, is not recorded.
//!
//! - `signing.rs`: secrets and signatures; `sealing.rs`: secrets at rest; `guard.rs`:
//!   which addresses deliveries may go to (the SSRF guard).

pub mod config;
pub mod guard;
pub mod inbox;
pub mod sealing;
pub mod signing;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::webhooks::{AttemptAnswer, DeliveryJob, DeliveryOutcome, Endpoint, EndpointId};
use ledger::{Claimed, JobKind, Ledger};
use reqwest::StatusCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::retry_after;
use guard::{Guard, GuardedResolver};
use sealing::Sealer;

/// How webhooks are delivered.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// How long one attempt may take, answer included.
    pub timeout: Duration,
    /// The waits before the second, third, … attempt; past the last, a delivery is
    /// exhausted.
    pub schedule: Vec<Duration>,
    /// Deliveries in flight at once in this instance.
    pub concurrency: usize,
    /// Deliveries to one endpoint in flight at once in this instance.
    pub per_endpoint: usize,
    /// How long a claimed delivery is this instance's before another may take it over.
    pub lease: Duration,
    /// How often an idle dispatcher looks for due deliveries (this instance's own commits
    /// wake it at once).
    pub poll: Duration,
    /// Whether endpoints may be loopback, private or link-local addresses.
    pub allow_private: bool,
    /// When not empty, the only networks endpoints may be in.
    pub allowed_networks: Vec<ipnet::IpNet>,
    /// How long the secret before a rotation keeps signing.
    pub rotation_window: Duration,
}

impl WebhookSettings {
    /// The schedule the Standard Webhooks specification suggests, after the first attempt.
    pub fn standard_schedule() -> Vec<Duration> {
        [5, 300, 1800, 7200, 18_000, 36_000, 36_000]
            .into_iter()
            .map(Duration::from_secs)
            .collect()
    }

    /// What comes after attempt `attempt` (1 for the first) failed: the wait before the
    /// next — the schedule's, with up to a tenth of jitter, or the receiver's
    /// `Retry-After` where it asked for longer — or `None` once the schedule has run out.
    ///
    /// The longer of the two, never the receiver's alone: a balancer that answers `503
    /// Retry-After: 0` through a ten-second deploy would otherwise get every attempt of
    /// the schedule within those seconds, and the delivery would end exhausted.
    pub fn after_failure(&self, attempt: u32, retry_after: Option<Duration>) -> Option<Duration> {
        let scheduled = *self
            .schedule
            .get(usize::try_from(attempt).ok()?.checked_sub(1)?)?;
        let jitter = scheduled.mul_f64(rand::random::<f64>() / 10.0);
        // A receiver cannot park a delivery for a year.
        let asked = retry_after.unwrap_or_default().min(LONGEST_RETRY_AFTER);
        Some((scheduled + jitter).max(asked))
    }
}

/// What webhooks need beside the ledger: the settings, the sealer of secrets, and the HTTP
/// client behind the guard. (The ledger's bell wakes the dispatcher: `Ledger::rung`.)
#[derive(Debug)]
pub struct Webhooks {
    settings: WebhookSettings,
    sealer: Sealer,
    guard: Guard,
    client: reqwest::Client,
    /// The demonstration inbox, in the embedded mode.
    inbox: Option<inbox::Inbox>,
}

/// The longest `Retry-After` honoured.
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The most of a receiver's answer kept with its attempt.
const ANSWER_KEPT: usize = 1024;

/// Deliveries claimed at once, at most.
const CLAIM_BATCH: usize = 32;

/// Answers recorded in one statement, at most.
const RECORD_BATCH: usize = 64;

/// How long a delivery handed back for its endpoint's cap waits before it is due again:
/// long enough that claims in between take other endpoints' deliveries first, short
/// beside any receiver's timeout.
const HANDED_BACK_WAIT: Duration = Duration::from_secs(1);

/// Deliveries in flight per endpoint, in this instance.
#[derive(Debug, Default)]
struct InFlight(std::sync::Mutex<HashMap<EndpointId, usize>>);

impl InFlight {
    /// Takes one of `endpoint`'s places if it has fewer than `cap` in flight.
    fn take(self: &Arc<Self>, endpoint: EndpointId, cap: usize) -> Option<EndpointPlace> {
        let mut counts = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = counts.entry(endpoint).or_default();
        if *count >= cap {
            return None;
        }
        *count += 1;
        Some(EndpointPlace {
            in_flight: Arc::clone(self),
            endpoint,
        })
    }
}

/// One delivery's place among its endpoint's in flight; given up when dropped.
struct EndpointPlace {
    in_flight: Arc<InFlight>,
    endpoint: EndpointId,
}

impl Drop for EndpointPlace {
    fn drop(&mut self) {
        let mut counts = self
            .in_flight
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = counts.get_mut(&self.endpoint) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.endpoint);
            }
        }
    }
}

impl Webhooks {
    /// Webhooks delivered as `settings` say, with secrets sealed by `sealer`, and the
    /// demonstration inbox where there is one.
    pub fn new(
        settings: WebhookSettings,
        sealer: Sealer,
        inbox: Option<inbox::Inbox>,
    ) -> Result<Self, reqwest::Error> {
        let guard = Guard {
            allow_private: settings.allow_private,
            only: settings.allowed_networks.clone().into(),
            inbox: inbox.as_ref().map(inbox::Inbox::address),
        };
        let client = reqwest::Client::builder()
            .dns_resolver(GuardedResolver::new(guard.clone()))
            // A redirect would lead past the guard; a proxy from the environment too.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .user_agent("payonce-webhooks")
            .pool_max_idle_per_host(settings.concurrency)
            .build()?;
        Ok(Self {
            settings,
            sealer,
            guard,
            client,
            inbox,
        })
    }

    /// The demonstration inbox, in the embedded mode.
    pub fn inbox(&self) -> Option<&inbox::Inbox> {
        self.inbox.as_ref()
    }

    /// The settings.
    pub fn settings(&self) -> &WebhookSettings {
        &self.settings
    }

    /// Seals and opens endpoint secrets.
    pub fn sealer(&self) -> &Sealer {
        &self.sealer
    }

    /// Which addresses deliveries may go to.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The secrets that sign for `endpoint` now: its own, and the one before a rotation
    /// while that still signs and opens. The current secret must open; the one before
    /// need not — after a change of `PAYONCE_WEBHOOK_KEY` it may be sealed under the old
    /// key, and a rotation is then exactly how its owner gets a secret that signs again:
    /// the delivery goes out signed by the new one alone, and the log says why.
    fn signing_secrets(&self, endpoint: &Endpoint) -> Result<Vec<Vec<u8>>, String> {
        let owner = endpoint.id.0.as_bytes();
        let mut secrets = Vec::with_capacity(2);
        if let Some((sealed, until)) = &endpoint.previous_secret
            && *until > time::OffsetDateTime::now_utc()
        {
            match self.sealer.open(owner, sealed) {
                Ok(previous) => secrets.push(previous),
                Err(error) => tracing::warn!(
                    endpoint_id = %endpoint.id,
                    %error,
                    "the endpoint's previous secret does not open (sealed under another PAYONCE_WEBHOOK_KEY?); signing with its current secret alone"
                ),
            }
        }
        secrets.push(
            self.sealer
                .open(owner, &endpoint.secret_sealed)
                .map_err(|e| e.to_string())?,
        );
        Ok(secrets)
    }

    /// One attempt of `job`: the signed POST, and what its answer makes of the delivery.
    async fn attempt(&self, job: &DeliveryJob) -> (AttemptAnswer, DeliveryOutcome) {
        let started = Instant::now();
        let (status, error, body, retry_after) = match self.post(job).await {
            Ok(answer) => answer,
            Err(error) => (None, Some(error), None, None),
        };
        let answer = AttemptAnswer {
            duration: started.elapsed(),
            status,
            error,
            body,
        };
        let outcome = match status.map(|status| StatusCode::from_u16(status).ok()) {
            Some(Some(status)) if status.is_success() => DeliveryOutcome::Delivered,
            Some(Some(StatusCode::GONE)) => DeliveryOutcome::EndpointGone,
            _ => match self.settings.after_failure(job.attempt, retry_after) {
                Some(after) => DeliveryOutcome::Retry { after },
                None => DeliveryOutcome::Exhausted,
            },
        };
        (answer, outcome)
    }

    /// Sends `job` once: the status, what went wrong (`None` for a 2xx), the start of the
    /// answer, and the `Retry-After` of a 429, 502, 503 or 504.
    /// Traced as `webhook.attempt` (the event and the endpoint by id: an endpoint's URL may
    /// carry a token of its owner's), with the W3C trace context sent on.
    #[allow(clippy::type_complexity)]
    #[tracing::instrument(
        name = "webhook.attempt",
        skip_all,
        fields(otel.kind = "client", event_id = %job.event.id, endpoint_id = %job.endpoint.id)
    )]
    async fn post(
        &self,
        job: &DeliveryJob,
    ) -> Result<
        (
            Option<u16>,
            Option<String>,
            Option<String>,
            Option<Duration>,
        ),
        String,
    > {
        let url = self.guard.url(&job.endpoint.url)?;
        let secrets = self
            .signing_secrets(&job.endpoint)
            .map_err(|error| format!("cannot sign: {error}"))?;
        let payload = job.event.payload();
        let id = job.event.id.to_string();
        let timestamp = time::OffsetDateTime::now_utc().unix_timestamp();
        let signature = signing::signature_header(
            secrets.iter().map(Vec::as_slice),
            &id,
            timestamp,
            payload.as_bytes(),
        );
        let mut response = self
            .client
            .post(url)
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .headers(crate::telemetry::trace_headers())
            .body(payload)
            .send()
            .await
            .map_err(|error| describe(&error))?;
        let status = response.status();
        let retry_after = matches!(status.as_u16(), 429 | 502 | 503 | 504)
            .then(|| retry_after::requested(&response))
            .flatten();
        // The start of the answer only: a receiver cannot make payonce read a gigabyte.
        let mut kept = Vec::new();
        while kept.len() < ANSWER_KEPT {
            match response.chunk().await {
                Ok(Some(chunk)) => kept.extend_from_slice(&chunk),
                Ok(None) | Err(_) => break,
            }
        }
        kept.truncate(ANSWER_KEPT);
        let body = (!kept.is_empty()).then(|| String::from_utf8_lossy(&kept).into_owned());
        let error = (!status.is_success()).then(|| format!("the receiver answered {status}"));
        Ok((Some(status.as_u16()), error, body, retry_after))
    }
}

/// A failed send, said plainly: a timeout, a refused connection, a refused address.
fn describe(error: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut text = if error.is_timeout() {
        "no answer within the timeout".to_owned()
    } else if error.is_connect() {
        "cannot connect".to_owned()
    } else {
        "the request failed".to_owned()
    };
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A finished attempt, on its way to be recorded.
type Finished = (DeliveryJob, AttemptAnswer, DeliveryOutcome);

/// Runs this instance's deliveries until `stopping`: claims due deliveries while slots
/// are free, sends each in a task of its own, and records the answers in batches.
pub async fn dispatch(
    ledger: Ledger,
    webhooks: Arc<Webhooks>,
    metrics: Arc<Metrics>,
    instance: String,
    stopping: CancellationToken,
) {
    let settings = webhooks.settings.clone();
    // One recorder: while it records a batch, the answers that come in wait for the
    // next, so the batches grow with the rate and each costs one statement. (Four
    // recorders, each with its share, made batches of about five.)
    let (finished, answers) = mpsc::channel::<Finished>(settings.concurrency.max(1) * 2);
    let recorder = tokio::spawn(record(ledger.clone(), answers, Arc::clone(&metrics)));
    let dispatcher = Dispatcher {
        slots: Arc::new(Semaphore::new(settings.concurrency)),
        in_flight: Arc::new(InFlight::default()),
        worker: format!("{instance}/webhooks"),
        ledger,
        webhooks,
        settings,
        finished,
    };
    while let Some(permits) = dispatcher.free_slots(&stopping).await {
        let claimed = dispatcher.claim(permits.len()).await;
        let wait = claimed.idle_wait(dispatcher.settings.poll);
        let (sent, over_cap) = dispatcher.send(claimed.jobs, permits).await;
        dispatcher.hand_back(&over_cap).await;
        if sent == 0 {
            // Asleep until work is queued (a commit here or elsewhere rings) or put back
            // (a retry scheduled, a delivery handed back: the ledger wakes this process's
            // dispatcher, which then learns when it is due), the next job known is due,
            // or the poll interval passes.
            tokio::select! {
                () = stopping.cancelled() => break,
                () = dispatcher.ledger.rung(JobKind::Webhook) => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
    // Attempts in flight finish (each within the timeout) and are recorded; past a short
    // wait they are left to their leases. (The dispatcher holds the recorder's sender.)
    drop(dispatcher);
    let _ = tokio::time::timeout(Duration::from_secs(2), recorder).await;
}

/// What the dispatcher's rounds share: where deliveries are claimed and sent, the slots
/// for attempts in flight (all, and per endpoint), and the recorder's sender.
struct Dispatcher {
    ledger: Ledger,
    webhooks: Arc<Webhooks>,
    settings: WebhookSettings,
    slots: Arc<Semaphore>,
    in_flight: Arc<InFlight>,
    finished: mpsc::Sender<Finished>,
    worker: String,
}

impl Dispatcher {
    /// Waits for a free slot, then takes as many more as are free (up to a claim's
    /// batch); `None` once stopping.
    async fn free_slots(&self, stopping: &CancellationToken) -> Option<Vec<OwnedSemaphorePermit>> {
        let first = tokio::select! {
            () = stopping.cancelled() => return None,
            permit = Arc::clone(&self.slots).acquire_owned() => permit.ok()?,
        };
        let mut permits = vec![first];
        while permits.len() < CLAIM_BATCH {
            match Arc::clone(&self.slots).try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        Some(permits)
    }

    /// Claims up to `count` due deliveries (none when the database cannot say).
    async fn claim(&self, count: usize) -> Claimed<DeliveryJob> {
        let claimed = self
            .ledger
            .claim_deliveries_or_next(
                &self.worker,
                self.settings.lease,
                u32::try_from(count).unwrap_or(1),
            )
            .await;
        claimed.unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot claim webhook deliveries");
            Claimed {
                jobs: Vec::new(),
                next_due_in: None,
            }
        })
    }

    /// Sends each claimed job in a task of its own, in the slots taken; how many went,
    /// and the jobs over their endpoint's share.
    async fn send(
        &self,
        jobs: Vec<DeliveryJob>,
        mut permits: Vec<OwnedSemaphorePermit>,
    ) -> (usize, Vec<DeliveryJob>) {
        let mut sent = 0_usize;
        let mut over_cap = Vec::new();
        for job in jobs {
            // One endpoint gets at most its share of the slots: a receiver that never
            // answers must not hold every slot for the timeout while other accounts'
            // events wait. What is over its share goes back, its attempt uncounted.
            let Some(place) = self
                .in_flight
                .take(job.endpoint.id, self.settings.per_endpoint)
            else {
                over_cap.push(job);
                continue;
            };
            // A claimed job is sent, never left to its lease: were there more than the
            // slots taken, each waits for a slot.
            let permit = match permits.pop() {
                Some(permit) => permit,
                None => match Arc::clone(&self.slots).acquire_owned().await {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
            };
            let webhooks = Arc::clone(&self.webhooks);
            let finished = self.finished.clone();
            sent += 1;
            tokio::spawn(async move {
                let (answer, outcome) = webhooks.attempt(&job).await;
                drop(place);
                let _ = finished.send((job, answer, outcome)).await;
                drop(permit);
            });
        }
        (sent, over_cap)
    }

    /// Gives the jobs over their endpoint's share back, their attempts uncounted.
    async fn hand_back(&self, over_cap: &[DeliveryJob]) {
        let handed_back: Vec<&DeliveryJob> = over_cap.iter().collect();
        if let Err(error) = self
            .ledger
            .hand_back_deliveries(&handed_back, HANDED_BACK_WAIT)
            .await
        {
            tracing::warn!(%error, deliveries = handed_back.len(), "cannot hand back deliveries over their endpoint's cap; they wait for their leases");
        }
    }
}

/// Records finished attempts, as many as have come in (up to a batch) at a time.
async fn record(ledger: Ledger, mut answers: mpsc::Receiver<Finished>, metrics: Arc<Metrics>) {
    let mut batch: Vec<Finished> = Vec::with_capacity(RECORD_BATCH);
    while answers.recv_many(&mut batch, RECORD_BATCH).await > 0 {
        let rows: Vec<_> = batch
            .iter()
            .map(|(job, answer, outcome)| (job, answer, outcome))
            .collect();
        match ledger.record_deliveries(&rows).await {
            Ok(recorded) => {
                let now = time::OffsetDateTime::now_utc();
                for ((job, answer, outcome), recorded) in batch.iter().zip(recorded) {
                    if !recorded {
                        tracing::info!(
                            delivery = job.job_id,
                            attempt = job.attempt,
                            "delivery claimed again or ended meanwhile; this attempt's answer is not recorded"
                        );
                        continue;
                    }
                    metrics.webhook_attempt(result_name(outcome));
                    if *outcome == DeliveryOutcome::Delivered {
                        let lag = (now - job.event.created_at).try_into().unwrap_or_default();
                        metrics.webhook_delivered(lag);
                    } else {
                        tracing::debug!(delivery = job.job_id, attempt = job.attempt, error = ?answer.error, ?outcome, "webhook not delivered");
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, deliveries = batch.len(), "cannot record webhook attempts; their leases will run out and they are sent again");
            }
        }
        batch.clear();
    }
}

/// The metric's name for what came of an attempt.
fn result_name(outcome: &DeliveryOutcome) -> &'static str {
    match outcome {
        DeliveryOutcome::Delivered => "delivered",
        DeliveryOutcome::Retry { .. } => "retried",
        DeliveryOutcome::Exhausted => "exhausted",
        DeliveryOutcome::EndpointGone => "endpoint_gone",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(schedule: Vec<Duration>) -> WebhookSettings {
        WebhookSettings {
            timeout: Duration::from_secs(15),
            schedule,
            concurrency: 8,
            per_endpoint: 2,
            lease: Duration::from_secs(60),
            poll: Duration::from_millis(500),
            allow_private: false,
            allowed_networks: Vec::new(),
            rotation_window: Duration::from_secs(3600),
        }
    }

    #[test]
    fn the_schedule_runs_out_and_retry_after_is_honoured_within_it() {
        let standard = settings(WebhookSettings::standard_schedule());
        let first = standard.after_failure(1, None).unwrap();
        assert!(first >= Duration::from_secs(5) && first <= Duration::from_millis(5500));
        let fifth = standard.after_failure(5, None).unwrap();
        assert!(fifth >= Duration::from_secs(18_000) && fifth <= Duration::from_secs(19_800));
        assert!(standard.after_failure(7, None).is_some());
        assert_eq!(
            standard.after_failure(8, None),
            None,
            "eight attempts in all"
        );
        assert_eq!(
            standard.after_failure(1, Some(Duration::from_secs(120))),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            standard.after_failure(1, Some(Duration::from_secs(10_000_000))),
            Some(LONGEST_RETRY_AFTER)
        );
        // A Retry-After shorter than the schedule's step waits the step.
        let after_zero = standard.after_failure(2, Some(Duration::ZERO)).unwrap();
        assert!(after_zero >= Duration::from_secs(300), "{after_zero:?}");
        let after_one = standard
            .after_failure(1, Some(Duration::from_secs(1)))
            .unwrap();
        assert!(after_one >= Duration::from_secs(5), "{after_one:?}");
        assert_eq!(
            standard.after_failure(8, Some(Duration::from_secs(1))),
            None
        );
        let none = settings(Vec::new());
        assert_eq!(none.after_failure(1, None), None, "one attempt only");
    }
}
