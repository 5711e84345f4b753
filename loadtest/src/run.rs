//! The generator: opens accounts, then has `clients` tasks take tickets and spend them —
//! withdrawals, lottery draws and deposits, a fraction sent twice at once (to another
//! target) and again later, some of those with a changed amount — until the duration or
//! the request budget runs out. Then it reads the final state back and audits.
//!
//! # Funding: rounds of accounts
//! Roughly half of all withdrawals and draws should be refused for insufficient funds or
//! points (the interesting case), so an account's opening balance and points must match
//! the spends it will see. The run cannot know that in advance for `--duration` (the rate
//! depends on the machine, the strategy, the fault), so it does not guess: it plays
//! `--accounts` accounts at a time, in **rounds** of [`SPENDS_PER_ACCOUNT`] spends per
//! account, each round on fresh accounts funded for exactly that many ([`opening`]). When
//! a round's spends have all been handed out, the next round's accounts are opened. The
//! rate no longer matters, for `--duration` and `--requests` alike (the last round of a
//! `--requests` run is funded for what is left of the budget). Only the last round of a
//! `--duration` run, cut short by the clock, sees fewer refusals.
//!
//! # Requests and retries
//! Every request of the contract goes through payonce-client, aimed at the plan's target
//! ([`Client::starting_at`](payonce_client::Client::starting_at)). A spend is an
//! [`Intent`](payonce_client::Intent) with the ticket the run took — duplicates, two
//! tickets for one order and a changed amount are intents sent with that ticket on
//! purpose. Clients resend every request that got no answer or a transient one — a spend
//! with the same ticket, a ticket request as it was — as [`RetryPolicy`] says, moving on
//! to the next target after no answer, a 429 or a 503. The client reports each send it makes
//! ([`on_attempt`](payonce_client::Client::on_attempt)); every one is recorded, numbered,
//! and audited. A request that ran out of attempts is unresolved and its ticket, read
//! back, decides (see [`audit`](crate::audit)).
//!
//! # Payouts to targets without a bank
//! A target started without a bank answers every payout 503 `payouts-unavailable`, and
//! will until it is restarted with one: a setting, not a passing state, which the client
//! does not resend. The run takes it as the setting it is: on the first such answer it
//! stops sending payouts — a payout drawn after it goes out as the withdrawal its share
//! was taken from ([`Mix::payout`]), the same amounts, so each round's funding still holds
//! — and its result says when, where and why ([`PayoutsStopped`]). Payouts already on
//! their way are answered the same and recorded like every answer; they stored nothing,
//! and their tickets are read back and judged like those of requests without a
//! definitive answer. Payouts a target with a bank accepted before the stop are drained,
//! read and audited as ever.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use payonce_client::types::payouts::PayoutRequest;
use payonce_client::{Client as Payonce, Intent};
use rand::RngExt;
use reqwest::header::{HeaderName, HeaderValue};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::audit::{
    AccountTally, AuditOptions, PayoutTally, Unresolved, Violation, WebhookTally, audit_with,
};
use crate::client::{Api, ClientError, id};
use crate::history::{
    AccountRecord, Attempt, DESTINATION, FinalState, History, HoldRead, PayoutStatus, Role,
    SpendKind, SpendRecord, TicketAttempt, TicketState,
};
use crate::receiver::{Receipt, Receiver, ReceiverFaults};
use crate::retry::RetryPolicy;

/// When the run stops.
#[derive(Clone, Copy, Debug)]
pub enum Limit {
    /// After this long.
    Duration(Duration),
    /// After this many spends (originals; duplicates come on top).
    Requests(u64),
}

/// How to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Base URLs of the instances.
    pub targets: Vec<String>,
    /// Accounts in play at a time (a fresh set each round: see the module docs).
    pub accounts: usize,
    /// Concurrent clients.
    pub clients: usize,
    /// When to stop.
    pub limit: Limit,
    /// Fraction of spends sent twice at once, and again later.
    pub duplicate_fraction: f64,
    /// Fraction of duplicated spends also sent later with a changed amount (must be 422).
    pub changed_fraction: f64,
    /// Show the progress bar (it hides itself when stderr is not a terminal).
    pub progress: bool,
    /// What share of spends are withdrawals and lottery draws (the rest are deposits).
    pub mix: Mix,
    /// Headers sent with every spend (the demonstration's `Payonce-Strategy`).
    pub headers: Vec<(String, String)>,
    /// A fault to ask for on some spends (the demonstration's `Payonce-Fault`).
    pub fault: Option<FaultPlan>,
    /// A fault of the bank's to ask for on some payouts (`Payonce-Bank-Fault`, which an
    /// embedded-mode payonce passes to its in-process bank on the payout's first call).
    pub bank_fault: Option<BankFaultPlan>,
    /// Each client sends every spend to one target (client number modulo the targets), as
    /// behind a balancer with sticky sessions, instead of turning through them: an
    /// instance that stops answering then holds up only its own clients.
    pub sticky: bool,
    /// Requests may go unanswered: an instance is killed during the run on purpose (the
    /// matrix's instance-kill cell). Otherwise, without retries, every transport error is
    /// a violation.
    pub expect_unanswered: bool,
    /// How clients resend what got no answer or a transient one (with the same ticket).
    /// With retries, an unanswered attempt is not a violation: the request's final answer
    /// is judged, or, if it never got one, what its ticket shows.
    pub retry: RetryPolicy,
    /// The bank the targets pay out to: its transfers are read after the run and
    /// reconciled with the payouts (none: payouts are audited against the ledger only).
    pub bank: Option<String>,
    /// How long to wait, after the load, for the payouts still pending to be settled by
    /// the bank's word — and, with a receiver, for the webhooks still undelivered.
    pub drain: Duration,
    /// A webhook receiver for the run, misbehaving at these rates: every account gets an
    /// endpoint at it, and the audit checks what came against what committed. The
    /// targets must be allowed to deliver to loopback (`PAYONCE_WEBHOOK_ALLOW_PRIVATE`).
    pub webhooks: Option<ReceiverFaults>,
}

/// Spends (originals) per account per round: each round's accounts are funded for this
/// many (see the module docs). Small enough that a short or slow run still spends a
/// round's funds, large enough that balances run down and refusals set in.
pub const SPENDS_PER_ACCOUNT: u64 = 50;

/// Withdrawal amounts, uniform.
const WITHDRAWAL: std::ops::RangeInclusive<i64> = 1..=200;
/// Deposit amounts, uniform.
const DEPOSIT: std::ops::RangeInclusive<i64> = 1..=60;
/// Points per lottery draw, uniform.
const DRAW_POINTS: std::ops::RangeInclusive<i64> = 1..=5;
/// What a point is expected to win, in money (payonce's prize table returns 6.9 per
/// point). Only an estimate for the funding: a service with other prizes shifts the
/// refusal ratio a little, it breaks nothing.
const PRIZE_PER_POINT: f64 = 6.9;

fn mean(range: &std::ops::RangeInclusive<i64>) -> f64 {
    (*range.start() + *range.end()) as f64 / 2.0
}

/// The opening balance and points for an account that will see `spends` spends of `mix`,
/// so that roughly half its withdrawals and half its draws are refused.
///
/// Points: half of what the draws will ask for. Money: 45% of what the withdrawals will
/// ask for, less what deposits and prizes will bring in (never below zero). Refusals come
/// once the balance has run low, and then the small withdrawals still pass, so funding
/// exactly half would refuse somewhat fewer than half; a simulation of the generator's
/// amounts puts 45% at about half refused, for 20 to 1,000 spends per account.
pub fn opening(spends: f64, mix: Mix) -> (i64, i64) {
    let deposit = (1.0 - mix.withdrawal - mix.draw - mix.order - mix.payout - mix.hold).max(0.0);
    let draws = spends * mix.draw;
    // An order is paid once, however many payments it gets: a withdrawal's worth; so is a
    // payout, and a hold (set aside, then captured, voided, expired or refunded in part).
    let asked = spends * (mix.withdrawal + mix.order + mix.payout + mix.hold) * mean(&WITHDRAWAL);
    let income = spends * deposit * mean(&DEPOSIT) + draws * mean(&DRAW_POINTS) * PRIZE_PER_POINT;
    let balance = (0.45 * asked - income).max(0.0).round() as i64;
    let points = (0.5 * draws * mean(&DRAW_POINTS)).round() as i64;
    (balance, points)
}

/// The share of each kind of spend (the rest are deposits).
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    /// Withdrawals.
    pub withdrawal: f64,
    /// Lottery draws.
    pub draw: f64,
    /// Orders placed and paid: with one ticket, or — a duplicated one — with two or three
    /// distinct tickets at once, each to another target (two tabs, two taps on "pay").
    pub order: f64,
    /// Payouts to the bank: money leaves like a withdrawal, and the bank is called after.
    /// Taken from the withdrawals' share, and given back to it when the targets turn out to
    /// have no bank (see the module docs).
    pub payout: f64,
    /// Holds: each placed — a third expiring in a second, captured as they expire (racing
    /// the ledger's clock and the sweepers) or left to expire; the rest captured in part,
    /// voided, captured and voided at once, or left held — and a captured one refunded by
    /// two or three requests at once, which together may ask for more than was captured.
    /// Paid orders are refunded likewise.
    pub hold: f64,
}

impl Default for Mix {
    fn default() -> Self {
        Self {
            withdrawal: 0.4,
            draw: 0.2,
            order: 0.05,
            payout: 0.05,
            hold: 0.05,
        }
    }
}

/// A `Payonce-Fault` header to send with a share of the spends.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// The header's value, e.g. `pause=900ms`.
    pub header: String,
    /// The share of spends that carry it.
    pub share: f64,
    /// Only spends sent to this target (index), if set.
    pub target: Option<usize>,
}

/// A `Payonce-Bank-Fault` header to send with a share of the payouts.
#[derive(Clone, Debug)]
pub struct BankFaultPlan {
    /// The bank's fault, e.g. `commit-then-drop`.
    pub fault: String,
    /// The share of payouts that carry it.
    pub share: f64,
}

/// Per-second counts, for the throughput chart.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Second {
    /// Answers 2xx.
    pub ok: u64,
    /// Answers 4xx (402, 409, 422...).
    pub refused: u64,
    /// Answers 5xx and transport errors.
    pub failed: u64,
}

/// Counts by answer.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counts {
    /// Every spend request sent: every attempt, resends included.
    pub requests: u64,
    /// Spend attempts after the first of their logical request: the resends.
    pub retries: u64,
    /// Tickets taken.
    pub tickets: u64,
    /// Ticket requests that ended without a ticket, after any resends (each attempt is
    /// recorded in the history and judged by the audit).
    pub ticket_errors: u64,
    /// Ticket request attempts after the first: the resends.
    pub ticket_retries: u64,
    /// Orders placed, and paid by one ticket or more.
    pub orders: u64,
    /// Orders that could not be placed (nothing was paid for them).
    pub order_errors: u64,
    /// 200 answers: holds captured or voided (executions and replays).
    pub resolved: u64,
    /// 201 answers (executions and replays).
    pub created: u64,
    /// 202 answers: payouts accepted (executions and replays).
    pub accepted: u64,
    /// 402.
    pub payment_required: u64,
    /// 409.
    pub conflict: u64,
    /// 422.
    pub unprocessable: u64,
    /// 429.
    pub rate_limited: u64,
    /// 503.
    pub unavailable: u64,
    /// Any other status.
    pub other: u64,
    /// No answer.
    pub transport_errors: u64,
    /// Answers with `Idempotent-Replayed: true`.
    pub replays: u64,
}

impl Counts {
    fn add(&mut self, attempt: &Attempt) {
        self.requests += 1;
        if attempt.attempt > 1 {
            self.retries += 1;
        }
        match attempt.status {
            Some(200) => self.resolved += 1,
            Some(201) => self.created += 1,
            Some(202) => self.accepted += 1,
            Some(402) => self.payment_required += 1,
            Some(409) => self.conflict += 1,
            Some(422) => self.unprocessable += 1,
            Some(429) => self.rate_limited += 1,
            Some(503) => self.unavailable += 1,
            None => self.transport_errors += 1,
            Some(_) => self.other += 1,
        }
        if attempt.replayed {
            self.replays += 1;
        }
    }

    fn merge(&mut self, other: &Self) {
        self.requests += other.requests;
        self.retries += other.retries;
        self.tickets += other.tickets;
        self.ticket_errors += other.ticket_errors;
        self.ticket_retries += other.ticket_retries;
        self.orders += other.orders;
        self.order_errors += other.order_errors;
        self.resolved += other.resolved;
        self.created += other.created;
        self.accepted += other.accepted;
        self.payment_required += other.payment_required;
        self.conflict += other.conflict;
        self.unprocessable += other.unprocessable;
        self.rate_limited += other.rate_limited;
        self.unavailable += other.unavailable;
        self.other += other.other;
        self.transport_errors += other.transport_errors;
        self.replays += other.replays;
    }
}

/// Everything a run produced.
#[derive(Debug)]
pub struct RunResult {
    /// What was sent and answered.
    pub history: History,
    /// The ledger afterwards.
    pub final_state: FinalState,
    /// What the audit found.
    pub violations: Vec<Violation>,
    /// Each account's tally: what the executed tickets add up to, and what the ledger holds.
    pub tallies: Vec<AccountTally>,
    /// The requests that ended without a definitive answer, and what their tickets show.
    pub unresolved: Unresolved,
    /// How the clients resent.
    pub retry: RetryPolicy,
    /// The payouts, and what the bank holds for them.
    pub payouts: PayoutTally,
    /// The webhooks the receiver got, when the run had one.
    pub webhooks: WebhookTally,
    /// How long the payouts took to drain after the load (none: the run sent none).
    pub drained: Option<Drained>,
    /// Counts by answer.
    pub counts: Counts,
    /// Spend latency, µs.
    pub latency: Histogram<u64>,
    /// Answers per second of the run.
    pub timeline: Vec<Second>,
    /// How long the load lasted.
    pub elapsed: Duration,
    /// Each target's payonce counters afterwards: (target, [(metric, value)]).
    pub metrics: Vec<(String, Vec<(String, f64)>)>,
    /// Why the run stopped sending payouts, if it did: a target had no bank.
    pub payouts_stopped: Option<PayoutsStopped>,
}

/// The run stopped sending payouts: a target answered one 503 `payouts-unavailable` (see
/// the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PayoutsStopped {
    /// When the first payout answered so was sent, in milliseconds of the run.
    pub at_ms: u64,
    /// The target that answered it.
    pub target: String,
    /// The answer's `detail`: the target's own words for why it has no bank.
    pub detail: String,
    /// Payout requests answered 503 `payouts-unavailable`: the first, and those already on
    /// their way.
    pub refused: u64,
    /// Payouts the mix drew after the stop, sent as withdrawals instead.
    pub sent_as_withdrawals: u64,
}

impl PayoutsStopped {
    /// From the payouts the history shows refused for want of a bank, if any was.
    fn from_history(history: &History, sent_as_withdrawals: u64) -> Option<Self> {
        let refused: Vec<&Attempt> = history
            .spends
            .iter()
            .filter(|spend| spend.kind == SpendKind::Payout)
            .flat_map(|spend| &spend.attempts)
            .filter(|attempt| attempt.payouts_unavailable())
            .collect();
        let first = refused.iter().min_by_key(|attempt| attempt.sent_at_ms)?;
        Some(Self {
            at_ms: first.sent_at_ms,
            target: history
                .targets
                .get(first.target)
                .cloned()
                .unwrap_or_default(),
            detail: first
                .body
                .as_ref()
                .and_then(|body| body.get("detail"))
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            refused: refused.len() as u64,
            sent_as_withdrawals,
        })
    }
}

/// Why a run could not be carried out (as opposed to finding violations).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Setup or read-back failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A histogram could not be made or merged.
    #[error("latency histogram: {0}")]
    Histogram(String),
    /// A client task died.
    #[error("a client task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The webhook receiver could not listen.
    #[error("cannot start the webhook receiver: {0}")]
    Receiver(std::io::Error),
    /// A header to send is not one HTTP can carry.
    #[error("not a header: {0}")]
    Header(String),
}

/// What one client task gathered.
struct Gathered {
    tickets: Vec<TicketAttempt>,
    spends: Vec<SpendRecord>,
    counts: Counts,
    latency: Histogram<u64>,
    timeline: Vec<Second>,
}

fn histogram() -> Result<Histogram<u64>, RunError> {
    Histogram::new_with_bounds(1, 120_000_000, 3)
        .map_err(|error| RunError::Histogram(error.to_string()))
}

/// Counters the progress bar reads while the clients run.
#[derive(Default)]
struct Live {
    requests: AtomicU64,
    retries: AtomicU64,
    created: AtomicU64,
    replays: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
}

/// Runs the load, reads the ledger back, and audits.
pub async fn run(options: RunOptions) -> Result<RunResult, RunError> {
    let api = api_for(&options)?;
    let receiver = start_receiver(options.webhooks).await?;
    let rounds = Arc::new(Rounds::new(api.clone(), &options, receiver.clone()));
    // The first round is opened before the clock starts.
    rounds.round(0).await?;

    let Load {
        mut history,
        counts,
        latency,
        timeline,
        elapsed,
        payouts_stopped,
        shared,
    } = drive(&api, &rounds, &options).await?;
    history.accounts = rounds.all().await;
    shared.recheck(&mut history).await;

    let (mut final_state, drained) = the_end(&api, &history, &options).await?;
    if let Some(receiver) = &receiver {
        final_state.webhooks =
            Some(drain_webhooks(receiver, &history, &final_state, options.drain).await);
    }
    let mut metrics = Vec::new();
    for (index, target) in options.targets.iter().enumerate() {
        metrics.push((target.clone(), api.metrics(index).await.unwrap_or_default()));
    }
    let audit = audit_with(
        &history,
        &final_state,
        &AuditOptions {
            unanswered_expected: options.expect_unanswered,
            retries: options.retry.retries(),
        },
    );
    Ok(RunResult {
        history,
        final_state,
        violations: audit.violations,
        tallies: audit.tallies,
        unresolved: audit.unresolved,
        retry: options.retry,
        payouts: audit.payouts,
        webhooks: audit.webhooks,
        drained,
        counts,
        latency,
        timeline,
        elapsed,
        metrics,
        payouts_stopped,
    })
}

/// The client of the run's targets.
fn api_for(options: &RunOptions) -> Result<Api, RunError> {
    let api = Api::new(options.targets.clone(), options.clients * 3)?;
    // A run that resends longer than payonce-client's default (about 10 s of trying) — one
    // that outlasts a database failover, say — opens its later rounds' accounts and reads
    // back as patiently as it spends.
    if options.retry.max_attempts > payonce_client::ResendPolicy::default().max_attempts {
        return Ok(api.resending_by(options.retry.resend()));
    }
    Ok(api)
}

/// The webhook receiver, listening, when the run has one.
async fn start_receiver(faults: Option<ReceiverFaults>) -> Result<Option<Receiver>, RunError> {
    let Some(faults) = faults else {
        return Ok(None);
    };
    Receiver::start(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), faults)
        .await
        .map(Some)
        .map_err(RunError::Receiver)
}

/// What the load itself came to: the clients' sends and answers (without the accounts,
/// which the rounds hold, or the recheck, which comes after), and the state they shared.
struct Load {
    history: History,
    counts: Counts,
    latency: Histogram<u64>,
    timeline: Vec<Second>,
    elapsed: Duration,
    payouts_stopped: Option<PayoutsStopped>,
    shared: Arc<Shared>,
}

/// Runs the clients from the start of the clock until the limit, the progress bar
/// showing them, and gathers what they sent and were answered.
async fn drive(api: &Api, rounds: &Arc<Rounds>, options: &RunOptions) -> Result<Load, RunError> {
    let started = Instant::now();
    let issued = Arc::new(AtomicU64::new(0));
    let live = Arc::new(Live::default());
    let done = Arc::new(AtomicBool::new(false));
    let progress = progress_bar(options);
    let ticker = tokio::spawn(tick(
        progress.clone(),
        live.clone(),
        issued.clone(),
        done.clone(),
        started,
        options.limit,
    ));
    let shared = Arc::new(Shared::new(api, rounds, options, started, issued, live)?);
    let tasks: Vec<_> = (0..options.clients)
        .map(|client| tokio::spawn(client_loop(client, shared.clone())))
        .collect();
    let mut all = Gathered::new()?;
    for task in tasks {
        all.merge(task.await??)?;
    }
    let Gathered {
        tickets,
        spends,
        counts,
        latency,
        timeline,
    } = all;
    let history = History {
        targets: options.targets.clone(),
        tickets,
        spends,
        ..History::default()
    };
    let elapsed = started.elapsed();
    let payouts_stopped = PayoutsStopped::from_history(
        &history,
        shared.payouts_as_withdrawals.load(Ordering::Relaxed),
    );
    done.store(true, Ordering::Relaxed);
    let _ = ticker.await;
    progress.finish_and_clear();
    Ok(Load {
        history,
        counts,
        latency,
        timeline,
        elapsed,
        payouts_stopped,
        shared,
    })
}

/// The run's own headers, as HTTP carries them.
fn own_headers(headers: &[(String, String)]) -> Result<Vec<(HeaderName, HeaderValue)>, RunError> {
    headers
        .iter()
        .map(|(name, value)| {
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                (Ok(name), Ok(value)) => Ok((name, value)),
                _ => Err(RunError::Header(format!("{name}: {value}"))),
            }
        })
        .collect()
}

/// The values of `Payonce-Fault` and `Payonce-Bank-Fault`, when the run sends them.
fn fault_values(
    options: &RunOptions,
) -> Result<(Option<HeaderValue>, Option<HeaderValue>), RunError> {
    // The faults' values are checked before the run: a fault that could not be sent must
    // not let a cell pass without it.
    let value = |text: &str| {
        HeaderValue::from_str(text).map_err(|_| RunError::Header(format!("a fault: {text}")))
    };
    let fault = options
        .fault
        .as_ref()
        .map(|fault| value(&fault.header))
        .transpose()?;
    let bank_fault = options
        .bank_fault
        .as_ref()
        .map(|fault| value(&fault.fault))
        .transpose()?;
    Ok((fault, bank_fault))
}

/// The accounts of each round (see the module docs), opened when a client first needs them.
struct Rounds {
    api: Api,
    accounts: usize,
    limit: Limit,
    mix: Mix,
    /// Open every round on the first target (sticky clients): a round opened on an
    /// instance that stopped answering would hold up every client, not only its own.
    open_on_first: bool,
    opened: tokio::sync::Mutex<Vec<Arc<Vec<AccountRecord>>>>,
    /// The webhook receiver each account gets an endpoint at, if the run has one.
    receiver: Option<Receiver>,
}

impl Rounds {
    fn new(api: Api, options: &RunOptions, receiver: Option<Receiver>) -> Self {
        Self {
            api,
            accounts: options.accounts.max(1),
            limit: options.limit,
            mix: options.mix,
            open_on_first: options.sticky,
            opened: tokio::sync::Mutex::new(Vec::new()),
            receiver,
        }
    }

    /// Spends handed out per round.
    fn size(&self) -> u64 {
        SPENDS_PER_ACCOUNT * self.accounts as u64
    }

    /// The round the `issued`-th spend (counting from 0) belongs to.
    fn of(&self, issued: u64) -> usize {
        (issued / self.size()) as usize
    }

    /// The accounts of a round, opening it (and any before it) if no one has yet.
    async fn round(&self, round: usize) -> Result<Arc<Vec<AccountRecord>>, RunError> {
        let mut opened = self.opened.lock().await;
        while opened.len() <= round {
            let next = opened.len();
            let accounts = self.open(next).await?;
            opened.push(Arc::new(accounts));
        }
        Ok(opened[round].clone())
    }

    /// Every account opened, round after round.
    async fn all(&self) -> Vec<AccountRecord> {
        let opened = self.opened.lock().await;
        opened
            .iter()
            .flat_map(|round| round.iter().cloned())
            .collect()
    }

    /// Opens a round's accounts, funded for its spends: [`SPENDS_PER_ACCOUNT`] each, or
    /// for the last round of a request budget, their share of what is left.
    async fn open(&self, round: usize) -> Result<Vec<AccountRecord>, RunError> {
        let first = round as u64 * self.size();
        let spends = match self.limit {
            Limit::Requests(budget) => budget.saturating_sub(first).min(self.size()),
            Limit::Duration(_) => self.size(),
        };
        let (opening_balance, opening_points) =
            opening(spends as f64 / self.accounts as f64, self.mix);
        let api = &self.api;
        let open_on_first = self.open_on_first;
        let receiver = self.receiver.as_ref();
        let opened = futures::stream::iter(0..self.accounts)
            .map(|index| async move {
                let first = if open_on_first { 0 } else { index };
                let (id, key) = api
                    .open_account(first, opening_balance, opening_points)
                    .await?;
                // The endpoint before any spend: every outcome of the account is announced.
                if let Some(receiver) = receiver {
                    let url = receiver.url_for(&id);
                    let secret = api.create_webhook_endpoint(first, &id, &key, &url).await?;
                    receiver.register(&id, &secret);
                }
                Ok::<_, ClientError>(AccountRecord {
                    id,
                    key,
                    opening_balance,
                    opening_points,
                })
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await;
        Ok(opened.into_iter().collect::<Result<_, _>>()?)
    }
}

/// What every client task shares: the run's settings, clock, budget and live counters.
struct Shared {
    /// payonce-client, resending by the run's policy.
    payonce: Payonce,
    /// The run's own headers, sent with every spend.
    headers: Vec<(HeaderName, HeaderValue)>,
    /// `Payonce-Fault`'s value, for the spends of the faulty share.
    fault: Option<HeaderValue>,
    /// `Payonce-Bank-Fault`'s value, for the payouts of the faulty share.
    bank_fault: Option<HeaderValue>,
    api: Api,
    rounds: Arc<Rounds>,
    options: RunOptions,
    started: Instant,
    stop_at: Option<Instant>,
    budget: Option<u64>,
    issued: Arc<AtomicU64>,
    live: Arc<Live>,
    /// Set on the first payout answered 503 `payouts-unavailable`: the targets have no
    /// bank, so no payout is sent after it (see the module docs).
    payouts_stopped: AtomicBool,
    /// Payouts drawn after the stop, sent as withdrawals instead.
    payouts_as_withdrawals: AtomicU64,
}

/// One spend a client is about to make.
struct Plan {
    account: AccountRecord,
    kind: SpendKind,
    amount: i64,
    /// Its first send goes here; duplicates to the next targets, resends to the next after
    /// no answer, a 429 or a 503.
    target: usize,
    /// Also sent at once to another target, and again later.
    duplicate: bool,
    /// Also sent later with a changed amount.
    changed: bool,
    /// The order an order payment pays or an order's refund gives back.
    order: Option<String>,
    /// The hold a capture, a void or a hold's refund acts on.
    hold: Option<String>,
    /// A hold's lifetime, seconds.
    expires_in: Option<i64>,
}

/// Which round's accounts a client last used, and whose turn (target) is next.
struct Cursor {
    turn: usize,
    round: Option<(usize, Arc<Vec<AccountRecord>>)>,
}

/// One client: takes a ticket, spends it (with its duplicates), records what came back,
/// until the clock or the budget says stop.
async fn client_loop(client: usize, shared: Arc<Shared>) -> Result<Gathered, RunError> {
    let mut gathered = Gathered::new()?;
    let mut cursor = Cursor {
        turn: client,
        round: None,
    };
    while let Some(plan) = shared.next_plan(&mut cursor).await? {
        let Some(ticket) = shared.take_ticket(&plan, &mut gathered).await else {
            // Do not hammer a target that is down.
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        // Asked as late as can be: the stop may have come while the ticket was taken.
        let plan = shared.unless_payouts_stopped(plan);
        let records = match plan.kind {
            SpendKind::OrderPayment => shared.pay_order(&plan, ticket, &mut gathered).await,
            SpendKind::Hold => shared.hold(&plan, ticket, &mut gathered).await,
            _ => vec![shared.spend(&plan, ticket).await],
        };
        for record in records {
            gathered.record(&record, &shared.live);
            gathered.spends.push(record);
        }
    }
    Ok(gathered)
}

impl Shared {
    /// What the clients share, from the clock's start on.
    fn new(
        api: &Api,
        rounds: &Arc<Rounds>,
        options: &RunOptions,
        started: Instant,
        issued: Arc<AtomicU64>,
        live: Arc<Live>,
    ) -> Result<Self, RunError> {
        let (stop_at, budget) = match options.limit {
            Limit::Duration(duration) => (Some(started + duration), None),
            Limit::Requests(requests) => (None, Some(requests)),
        };
        let headers = own_headers(&options.headers)?;
        let (fault, bank_fault) = fault_values(options)?;
        Ok(Self {
            fault,
            bank_fault,
            payonce: api.payonce().with_resend_policy(options.retry.resend()),
            headers,
            api: api.clone(),
            rounds: rounds.clone(),
            options: options.clone(),
            started,
            stop_at,
            budget,
            issued,
            live,
            payouts_stopped: AtomicBool::new(false),
            payouts_as_withdrawals: AtomicU64::new(0),
        })
    }

    /// The next spend to make, or `None` when the run is over.
    async fn next_plan(&self, cursor: &mut Cursor) -> Result<Option<Plan>, RunError> {
        if self.stop_at.is_some_and(|stop| Instant::now() >= stop) {
            return Ok(None);
        }
        let number = self.issued.fetch_add(1, Ordering::Relaxed);
        if self.budget.is_some_and(|budget| number >= budget) {
            return Ok(None);
        }
        let round = self.rounds.of(number);
        let accounts = match &cursor.round {
            Some((known, accounts)) if *known == round => accounts.clone(),
            _ => {
                let accounts = self.rounds.round(round).await?;
                cursor.round = Some((round, accounts.clone()));
                accounts
            }
        };
        if !self.options.sticky {
            cursor.turn += 1;
        }
        Ok(Some(
            self.draw(&accounts, cursor.turn % self.options.targets.len()),
        ))
    }

    /// The plan as the run may still send it: a payout, once the payouts stopped, becomes
    /// the withdrawal its share was taken from (a ticket moves nothing until spent, and
    /// payouts and withdrawals draw the same amounts).
    fn unless_payouts_stopped(&self, mut plan: Plan) -> Plan {
        if plan.kind == SpendKind::Payout && self.payouts_stopped.load(Ordering::Relaxed) {
            plan.kind = SpendKind::Withdrawal;
            self.payouts_as_withdrawals.fetch_add(1, Ordering::Relaxed);
        }
        plan
    }

    /// Draws a spend at random: the account, the kind by the mix, the amount, whether it
    /// is duplicated.
    fn draw(&self, accounts: &[AccountRecord], target: usize) -> Plan {
        let options = &self.options;
        let mut rng = rand::rng();
        let account = accounts[rng.random_range(0..accounts.len())].clone();
        let roll: f64 = rng.random();
        let mix = options.mix;
        let kind = if roll < mix.withdrawal {
            SpendKind::Withdrawal
        } else if roll < mix.withdrawal + mix.draw {
            SpendKind::LotteryDraw
        } else if roll < mix.withdrawal + mix.draw + mix.order {
            SpendKind::OrderPayment
        } else if roll < mix.withdrawal + mix.draw + mix.order + mix.payout {
            SpendKind::Payout
        } else if roll < mix.withdrawal + mix.draw + mix.order + mix.payout + mix.hold {
            SpendKind::Hold
        } else {
            SpendKind::Deposit
        };
        // The funding of each round counts on these ranges (see `opening`).
        let amount = match kind {
            SpendKind::LotteryDraw => rng.random_range(DRAW_POINTS),
            SpendKind::Withdrawal
            | SpendKind::OrderPayment
            | SpendKind::Payout
            | SpendKind::Hold
            | SpendKind::Capture
            | SpendKind::Refund => rng.random_range(WITHDRAWAL),
            SpendKind::Deposit => rng.random_range(DEPOSIT),
            SpendKind::Void => 0,
        };
        let duplicate = rng.random::<f64>() < options.duplicate_fraction;
        let changed = duplicate && rng.random::<f64>() < options.changed_fraction;
        // A third of the holds expire in a second, for the sweeper to race their captures.
        let expires_in = (kind == SpendKind::Hold).then(|| {
            if rng.random::<f64>() < 1.0 / 3.0 {
                1
            } else {
                3600
            }
        });
        Plan {
            account,
            kind,
            amount,
            target,
            duplicate,
            changed,
            order: None,
            hold: None,
            expires_in,
        }
    }

    /// Asks for a ticket — resending by the retry policy, each resend to the next target —
    /// and records every attempt. The ticket, if one was issued. (A resend after a lost
    /// answer may leave that answer's ticket behind, unknown to the run: harmless, a ticket
    /// moves nothing until it is spent.)
    async fn take_ticket(&self, plan: &Plan, gathered: &mut Gathered) -> Option<String> {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let observer = {
            let (seen, started) = (seen.clone(), self.started);
            let account = plan.account.id.clone();
            move |sent: &payonce_client::Attempt| {
                let status = sent.status;
                let ticket = sent
                    .body
                    .as_ref()
                    .filter(|_| status == Some(201))
                    .and_then(|body| body.get("ticket_id"))
                    .and_then(serde_json::Value::as_str)
                    // A ticket that is no id is none: the audit flags the answer.
                    .filter(|ticket| ticket.parse::<uuid::Uuid>().is_ok())
                    .map(str::to_owned);
                let attempt = TicketAttempt {
                    account: account.clone(),
                    attempt: sent.number,
                    target: sent.base_index,
                    status,
                    ticket,
                    // The body of an issued ticket says nothing the record does not.
                    body: sent.body.clone().filter(|_| status != Some(201)),
                    sent_at_ms: sent_at(started, sent.latency),
                    latency_us: sent.latency.as_micros() as u64,
                    error: sent.error.clone(),
                    retry_after: sent.retry_after.map(|wait| wait.as_secs()),
                };
                lock(&seen).push(attempt);
            }
        };
        // What it answers is in what the observer saw: every send, the last one's ticket.
        // (The account's id is the server's own; one that is no id asks for nothing, and
        // counts as a ticket not had.)
        if let Ok(account) = id(&plan.account.id, "an account") {
            let _ = self
                .payonce
                .with_key(&plan.account.key)
                .starting_at(plan.target)
                .on_attempt(observer)
                .take_ticket(account)
                .await;
        }
        let attempts = std::mem::take(&mut *lock(&seen));
        gathered.counts.ticket_retries += attempts.len().saturating_sub(1) as u64;
        let ticket = attempts.last().and_then(|last| last.ticket.clone());
        gathered.tickets.extend(attempts);
        match &ticket {
            Some(_) => gathered.counts.tickets += 1,
            None => {
                gathered.counts.ticket_errors += 1;
                self.live.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        ticket
    }

    /// Spends the ticket: the original, and for a duplicated spend a concurrent copy to the
    /// next target, a late copy, and perhaps a changed one. Each of those is one logical
    /// request, resent by the retry policy.
    async fn spend(&self, plan: &Plan, ticket: String) -> SpendRecord {
        let spending = Spending {
            shared: self,
            plan,
            ticket: &ticket,
            order: plan.order.as_deref(),
            fault: self
                .options
                .fault
                .as_ref()
                .filter(|fault| rand::random::<f64>() < fault.share),
            bank_fault: self.options.bank_fault.as_ref().is_some_and(|faulty| {
                plan.kind == SpendKind::Payout && rand::random::<f64>() < faulty.share
            }),
        };
        let (target, amount) = (plan.target, plan.amount);
        let mut attempts = Vec::new();
        if plan.duplicate {
            let (first, second) = tokio::join!(
                spending.request(Role::Original, target, amount),
                spending.request(Role::ConcurrentDuplicate, target + 1, amount)
            );
            attempts.extend(first.into_iter().chain(second));
            // A payout's later copies are payouts too: none is sent after the stop.
            let stopped =
                plan.kind == SpendKind::Payout && self.payouts_stopped.load(Ordering::Relaxed);
            if !stopped {
                attempts.extend(
                    spending
                        .request(Role::LateDuplicate, target + 2, amount)
                        .await,
                );
            }
            let settled = attempts
                .iter()
                .any(|attempt| crate::audit::is_definitive(plan.kind, attempt));
            // A void's body is always `{}`: it has no other amount to send.
            if plan.changed && settled && !stopped && plan.kind != SpendKind::Void {
                attempts.extend(
                    spending
                        .request(Role::ChangedDuplicate, target + 2, amount + 1)
                        .await,
                );
            }
        } else {
            attempts.extend(spending.request(Role::Original, target, amount).await);
        }
        SpendRecord {
            ticket,
            account: plan.account.id.clone(),
            kind: plan.kind,
            amount: plan.amount,
            order: plan.order.clone(),
            hold: plan.hold.clone(),
            expires_in: plan.expires_in,
            attempts,
        }
    }

    /// Sends every spend whose outcome a client was given once more, after the load, to
    /// the target after the one that gave it, and records the answers as
    /// [`Role::Recheck`] attempts: each must replay that outcome. An outcome the ledger
    /// lost — a failover to a replica that never had it — executes again here, or finds
    /// no ticket; the audit names either.
    async fn recheck(&self, history: &mut History) {
        let accounts: HashMap<&str, &AccountRecord> = history
            .accounts
            .iter()
            .map(|account| (account.id.as_str(), account))
            .collect();
        let rechecks = history
            .spends
            .iter()
            .enumerate()
            .filter_map(|(index, spend)| {
                let acknowledged = spend.attempts.iter().find(|attempt| {
                    attempt.role != Role::ChangedDuplicate
                        && crate::audit::is_definitive(spend.kind, attempt)
                })?;
                let plan = Plan {
                    account: (*accounts.get(spend.account.as_str())?).clone(),
                    kind: spend.kind,
                    amount: spend.amount,
                    target: acknowledged.target + 1,
                    duplicate: false,
                    changed: false,
                    order: spend.order.clone(),
                    hold: spend.hold.clone(),
                    expires_in: spend.expires_in,
                };
                Some((index, plan, spend.ticket.clone()))
            })
            .collect::<Vec<_>>();
        let answered = futures::stream::iter(rechecks)
            .map(|(index, plan, ticket)| async move {
                let spending = Spending {
                    shared: self,
                    plan: &plan,
                    ticket: &ticket,
                    order: plan.order.as_deref(),
                    fault: None,
                    bank_fault: false,
                };
                let attempts = spending
                    .request(Role::Recheck, plan.target, plan.amount)
                    .await;
                (index, attempts)
            })
            .buffer_unordered(self.options.clients.max(1))
            .collect::<Vec<_>>()
            .await;
        for (index, attempts) in answered {
            history.spends[index].attempts.extend(attempts);
        }
    }

    /// Places an order of the plan's amount and pays it: with `ticket` alone, or — a
    /// duplicated plan — with one or two more tickets at once, each payment to the next
    /// target. One record per ticket. An order that could not be placed pays nothing
    /// (the ticket stays unused: it moves nothing).
    async fn pay_order(
        &self,
        plan: &Plan,
        ticket: String,
        gathered: &mut Gathered,
    ) -> Vec<SpendRecord> {
        let account = &plan.account;
        let placed = self
            .api
            .place_order(plan.target, &account.id, &account.key, plan.amount)
            .await;
        let Ok(order) = placed else {
            gathered.counts.order_errors += 1;
            self.live.errors.fetch_add(1, Ordering::Relaxed);
            return Vec::new();
        };
        gathered.counts.orders += 1;
        let mut tickets = vec![ticket];
        if plan.duplicate {
            let more = rand::rng().random_range(1..=2);
            for _ in 0..more {
                if let Some(ticket) = self.take_ticket(plan, gathered).await {
                    tickets.push(ticket);
                }
            }
        }
        let payments = tickets.iter().enumerate().map(|(index, ticket)| {
            let spending = Spending {
                shared: self,
                plan,
                ticket,
                order: Some(&order),
                fault: None,
                bank_fault: false,
            };
            async move {
                spending
                    .request(Role::Original, plan.target + index, plan.amount)
                    .await
            }
        });
        let answered = futures::future::join_all(payments).await;
        let mut records = tickets
            .into_iter()
            .zip(answered)
            .map(|(ticket, attempts)| SpendRecord {
                ticket,
                account: account.id.clone(),
                kind: SpendKind::OrderPayment,
                amount: plan.amount,
                order: Some(order.clone()),
                hold: None,
                expires_in: None,
                attempts,
            })
            .collect::<Vec<_>>();
        // A paid order is refunded, half the time, by two requests at once.
        let paid = records.iter().any(|record| executed(record).is_some());
        if paid && rand::random::<f64>() < 0.5 {
            let mut refunds = self
                .refunds(plan, plan.amount, Some(&order), None, gathered)
                .await;
            records.append(&mut refunds);
        }
        records
    }

    /// Places a hold with `ticket` (the plan's amount and lifetime) and does to it what a
    /// roll says. A one-second hold is captured as it expires, or left to expire. A longer
    /// one is captured in part; voided; captured and voided at once, with two tickets to
    /// two targets; or left held. A captured hold is refunded by two or three requests at
    /// once. One record per ticket.
    async fn hold(&self, plan: &Plan, ticket: String, gathered: &mut Gathered) -> Vec<SpendRecord> {
        let placed = self.spend(plan, ticket).await;
        let Some(hold) =
            executed(&placed).and_then(|body| body.get("hold_id")?.as_str().map(str::to_owned))
        else {
            return vec![placed];
        };
        let short = plan.expires_in == Some(1);
        let mut records = vec![placed];
        let roll: f64 = rand::random();
        let part = rand::rng().random_range(1..=plan.amount);
        let on_hold = |kind: SpendKind, amount: i64, target: usize| Plan {
            account: plan.account.clone(),
            kind,
            amount,
            target,
            duplicate: plan.duplicate,
            changed: plan.changed,
            order: None,
            hold: Some(hold.clone()),
            expires_in: None,
        };
        let capture = on_hold(SpendKind::Capture, part, plan.target + 1);
        let void = on_hold(SpendKind::Void, 0, plan.target + 2);
        if short {
            // A one-second hold is there to race its expiry: captured at it, give or take a
            // tenth of a second (the ledger's clock decides, and a sweeper may come first),
            // or left to expire.
            if roll < 0.5
                && let Some(ticket) = self.take_ticket(&capture, gathered).await
            {
                let wait = rand::rng().random_range(850..1150);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                records.push(self.spend(&capture, ticket).await);
            }
        } else if roll < 0.4 {
            if let Some(ticket) = self.take_ticket(&capture, gathered).await {
                records.push(self.spend(&capture, ticket).await);
            }
        } else if roll < 0.6 {
            if let Some(ticket) = self.take_ticket(&void, gathered).await {
                records.push(self.spend(&void, ticket).await);
            }
        } else if roll < 0.85 {
            let tickets = (
                self.take_ticket(&capture, gathered).await,
                self.take_ticket(&void, gathered).await,
            );
            if let (Some(first), Some(second)) = tickets {
                let (captured, voided) =
                    tokio::join!(self.spend(&capture, first), self.spend(&void, second));
                records.extend([captured, voided]);
            }
        }
        let captured = records
            .iter()
            .filter(|record| record.kind == SpendKind::Capture)
            .find_map(|record| executed(record)?.get("captured_amount")?.as_i64());
        if let Some(captured) = captured {
            let mut refunds = self
                .refunds(plan, captured, None, Some(&hold), gathered)
                .await;
            records.append(&mut refunds);
        }
        records
    }

    /// Two or three refunds of a payment of `paid` (an order's or a hold's) sent at once,
    /// each with its own ticket to another target, each of a random part of it: together
    /// they often ask for more than was paid.
    async fn refunds(
        &self,
        plan: &Plan,
        paid: i64,
        order: Option<&str>,
        hold: Option<&str>,
        gathered: &mut Gathered,
    ) -> Vec<SpendRecord> {
        let count = rand::rng().random_range(2..=3);
        let mut planned = Vec::new();
        for index in 0..count {
            let refund = Plan {
                account: plan.account.clone(),
                kind: SpendKind::Refund,
                amount: rand::rng().random_range(1..=paid),
                target: plan.target + index,
                duplicate: plan.duplicate && index == 0,
                changed: false,
                order: order.map(str::to_owned),
                hold: hold.map(str::to_owned),
                expires_in: None,
            };
            if let Some(ticket) = self.take_ticket(&refund, gathered).await {
                planned.push((refund, ticket));
            }
        }
        futures::future::join_all(
            planned
                .into_iter()
                .map(|(refund, ticket)| async move { self.spend(&refund, ticket).await }),
        )
        .await
    }
}

/// One ticket being spent: what each of its logical requests needs.
struct Spending<'a> {
    shared: &'a Shared,
    plan: &'a Plan,
    ticket: &'a str,
    /// The order, for an order payment.
    order: Option<&'a str>,
    /// The `Payonce-Fault` this spend asks for, if it is one of the faulty share.
    fault: Option<&'a FaultPlan>,
    /// Whether this payout asks for the run's `Payonce-Bank-Fault` (it is one of the
    /// faulty share): sent with every request of the ticket (payonce heeds it once, for the
    /// payout the ticket's execution made).
    bank_fault: bool,
}

impl Spending<'_> {
    /// One logical request: an intent with the spend's ticket, sent to `target` and resent
    /// (to the next target after no answer, a 429 or a 503) while the answers are transient
    /// and the policy allows. Every attempt, in order.
    async fn request(&self, role: Role, target: usize, amount: i64) -> Vec<Attempt> {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let observer = {
            let (seen, started) = (seen.clone(), self.shared.started);
            move |sent: &payonce_client::Attempt| {
                let mut seen = lock(&seen);
                // Numbered across the intent's sends: a resend after `outcome-unknown` is
                // the same request's next attempt.
                let number = seen.len() as u32 + 1;
                seen.push(attempt(role, number, amount, started, sent));
            }
        };
        let ids = (
            id(&self.plan.account.id, "an account"),
            id(self.ticket, "a ticket"),
            self.order.map(|order| id(order, "an order")).transpose(),
            self.plan
                .hold
                .as_deref()
                .map(|hold| id(hold, "a hold"))
                .transpose(),
        );
        // The ids are the server's own, and the ticket was read as one: none fails here.
        let (Ok(account), Ok(ticket), Ok(order), Ok(hold)) = ids else {
            return Vec::new();
        };
        let payonce = self
            .shared
            .payonce
            .with_key(&self.plan.account.key)
            .starting_at(target)
            .on_attempt(observer);
        let sent = || lock(&seen).len() as u32;
        match (self.plan.kind, order, hold) {
            (SpendKind::OrderPayment, Some(order), _) => {
                self.send(payonce.order_payment(account, order), ticket, &sent)
                    .await;
            }
            (SpendKind::Withdrawal, ..) => {
                self.send(payonce.withdrawal(account, amount), ticket, &sent)
                    .await;
            }
            (SpendKind::Deposit, ..) => {
                self.send(payonce.deposit(account, amount), ticket, &sent)
                    .await;
            }
            (SpendKind::LotteryDraw, ..) => {
                self.send(payonce.lottery_draw(account, amount), ticket, &sent)
                    .await;
            }
            (SpendKind::Payout, ..) => {
                let payout = PayoutRequest {
                    amount,
                    destination: DESTINATION.to_owned(),
                };
                self.send(payonce.payout(account, &payout), ticket, &sent)
                    .await;
            }
            (SpendKind::Hold, ..) => {
                let hold = payonce.hold(account, amount, self.plan.expires_in);
                self.send(hold, ticket, &sent).await;
            }
            (SpendKind::Refund, Some(order), _) => {
                self.send(payonce.order_refund(account, order, amount), ticket, &sent)
                    .await;
            }
            (SpendKind::Refund, None, Some(hold)) => {
                let refund = payonce.hold_refund(account, hold, amount);
                self.send(refund, ticket, &sent).await;
            }
            (SpendKind::Capture, _, Some(hold)) => {
                let capture = payonce.capture(account, hold, Some(amount));
                self.send(capture, ticket, &sent).await;
            }
            (SpendKind::Void, _, Some(hold)) => {
                self.send(payonce.void(account, hold), ticket, &sent).await;
            }
            // An order payment without its order is never planned, nor a capture, a void
            // or a refund without what it acts on.
            (SpendKind::OrderPayment, None, _)
            | (SpendKind::Capture | SpendKind::Void | SpendKind::Refund, _, None) => {}
        }
        let attempts = std::mem::take(&mut *lock(&seen));
        if self.plan.kind == SpendKind::Payout && attempts.iter().any(Attempt::payouts_unavailable)
        {
            self.shared.payouts_stopped.store(true, Ordering::Relaxed);
        }
        attempts
    }

    /// Sends the intent with the spend's ticket and headers, by the run's policy.
    async fn send<T: DeserializeOwned>(
        &self,
        intent: Intent<T>,
        ticket: uuid::Uuid,
        sent: &impl Fn() -> u32,
    ) {
        let mut intent = intent.with_ticket(ticket);
        for (name, value) in &self.shared.headers {
            intent = intent.with_header(name.clone(), value.clone());
        }
        if self.bank_fault
            && let Some(value) = self.shared.bank_fault.clone()
        {
            intent = intent.with_header(HeaderName::from_static("payonce-bank-fault"), value);
        }
        // A fault aimed at one target goes only with the sends to it: a resend that moved
        // on to another must not carry it there.
        if let Some(fault) = self.fault
            && let Some(value) = self.shared.fault.clone()
        {
            let name = HeaderName::from_static("payonce-fault");
            intent = match fault.target {
                Some(only) => intent.with_header_to(only, name, value),
                None => intent.with_header(name, value),
            };
        }
        self.shared.options.retry.send(intent, sent).await;
    }
}

/// The body of the answer that executed the spend, if one did (a replay of it counts).
fn executed(record: &SpendRecord) -> Option<&serde_json::Value> {
    record
        .attempts
        .iter()
        .find(|attempt| attempt.status == Some(record.kind.executed_status()))
        .and_then(|attempt| attempt.body.as_ref())
}

/// The mutex's contents, even if a holder panicked (the records are plain data).
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// When a send that took `latency` and just ended went out, in milliseconds of the run.
fn sent_at(started: Instant, latency: Duration) -> u64 {
    started.elapsed().saturating_sub(latency).as_millis() as u64
}

impl Gathered {
    fn new() -> Result<Self, RunError> {
        Ok(Self {
            tickets: Vec::new(),
            spends: Vec::new(),
            counts: Counts::default(),
            latency: histogram()?,
            timeline: Vec::new(),
        })
    }

    /// Adds what another client gathered: its records, counts, latencies and seconds.
    fn merge(&mut self, other: Gathered) -> Result<(), RunError> {
        self.tickets.extend(other.tickets);
        self.spends.extend(other.spends);
        self.counts.merge(&other.counts);
        self.latency
            .add(&other.latency)
            .map_err(|error| RunError::Histogram(error.to_string()))?;
        if self.timeline.len() < other.timeline.len() {
            self.timeline
                .resize(other.timeline.len(), Second::default());
        }
        for (total, second) in self.timeline.iter_mut().zip(&other.timeline) {
            total.ok += second.ok;
            total.refused += second.refused;
            total.failed += second.failed;
        }
        Ok(())
    }

    /// Counts a spend's attempts: by answer, latency, second of the run, and live.
    fn record(&mut self, record: &SpendRecord, live: &Live) {
        for attempt in &record.attempts {
            self.counts.add(attempt);
            self.latency.saturating_record(attempt.latency_us.max(1));
            let second = (attempt.sent_at_ms / 1000) as usize;
            if self.timeline.len() <= second {
                self.timeline.resize(second + 1, Second::default());
            }
            let slot = &mut self.timeline[second];
            match attempt.status {
                Some(200..=299) => slot.ok += 1,
                Some(400..=499) => slot.refused += 1,
                _ => slot.failed += 1,
            }
            live.requests.fetch_add(1, Ordering::Relaxed);
            if attempt.attempt > 1 {
                live.retries.fetch_add(1, Ordering::Relaxed);
            }
            match attempt.status {
                Some(200..=202) => live.created.fetch_add(1, Ordering::Relaxed),
                Some(400..=499) => live.refused.fetch_add(1, Ordering::Relaxed),
                _ => live.errors.fetch_add(1, Ordering::Relaxed),
            };
            if attempt.replayed {
                live.replays.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A send of a spend, as the history records it.
fn attempt(
    role: Role,
    number: u32,
    amount: i64,
    started: Instant,
    sent: &payonce_client::Attempt,
) -> Attempt {
    Attempt {
        role,
        attempt: number,
        target: sent.base_index,
        amount,
        status: sent.status,
        replayed: sent.replayed,
        body: sent.body.clone(),
        sent_at_ms: sent_at(started, sent.latency),
        latency_us: sent.latency.as_micros() as u64,
        error: sent.error.clone(),
        retry_after: sent.retry_after.map(|wait| wait.as_secs()),
    }
}

/// Reads every account (balance, points, entries) and every ticket of the run's spends:
/// the stored outcome decides a ticket the run never got a definitive answer for, and must
/// be the one the clients were given for every other (a ticket the ledger does not know is
/// read as [`TicketState::missing`]).
async fn read_back(api: &Api, history: &History) -> Result<FinalState, RunError> {
    // A hold expiring in a second, placed as the load ended, would read held in its
    // account's `available` and expired a moment later: everything is read once every such
    // hold is surely past its expiry, so that the accounts and the holds agree.
    let short_holds = history
        .spends
        .iter()
        .any(|spend| spend.kind == SpendKind::Hold && spend.expires_in == Some(1));
    if short_holds {
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let mut state = FinalState::default();
    let accounts = futures::stream::iter(history.accounts.iter().enumerate())
        .map(|(index, account)| async move {
            let read = api.account_state(index, &account.id, &account.key).await?;
            Ok::<_, ClientError>((account.id.clone(), read))
        })
        .buffered(8)
        .collect::<Vec<_>>()
        .await;
    for (account, read) in history.accounts.iter().zip(accounts) {
        match read {
            Ok((id, read)) => {
                state.accounts.insert(id, read);
            }
            Err(error) if error.unknown_to_the_ledger() => {
                state.lost_accounts.push(account.id.clone());
            }
            Err(error) => return Err(error.into()),
        }
    }

    let keys: std::collections::HashMap<&str, &str> = history
        .accounts
        .iter()
        .map(|account| (account.id.as_str(), account.key.as_str()))
        .collect();
    let tickets = futures::stream::iter(history.spends.iter().enumerate())
        .map(|(index, spend)| {
            let key = keys
                .get(spend.account.as_str())
                .copied()
                .unwrap_or_default();
            async move {
                let read = match api.ticket_state(index, &spend.ticket, key).await {
                    // The ticket, or its account with its key, lost.
                    Err(error) if error.unknown_to_the_ledger() => TicketState::missing(),
                    read => read?,
                };
                Ok::<_, ClientError>((spend.ticket.clone(), read))
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    for ticket in tickets {
        let (id, read) = ticket?;
        state.tickets.insert(id, read);
    }
    read_holds(api, history, &keys, &mut state).await?;
    Ok(state)
}

/// Reads every hold the run placed — its placing ticket answered or stores 201 — into
/// `state` (after the wait in [`read_back`], so that each reads as it will stay).
async fn read_holds(
    api: &Api,
    history: &History,
    keys: &std::collections::HashMap<&str, &str>,
    state: &mut FinalState,
) -> Result<(), RunError> {
    let placed: Vec<(&SpendRecord, String)> = history
        .spends
        .iter()
        .filter(|spend| spend.kind == SpendKind::Hold)
        .filter_map(|spend| {
            let answered = executed(spend).cloned();
            let stored = state
                .tickets
                .get(&spend.ticket)
                .filter(|ticket| ticket.status == Some(201))
                .and_then(|ticket| ticket.body.clone());
            let hold = answered.or(stored)?.get("hold_id")?.as_str()?.to_owned();
            Some((spend, hold))
        })
        .collect();
    let reads = futures::stream::iter(placed.into_iter().enumerate())
        .map(|(index, (spend, hold))| {
            let key = keys
                .get(spend.account.as_str())
                .copied()
                .unwrap_or_default();
            async move {
                let read = api.hold_state(index, &hold, key).await?;
                Ok::<_, ClientError>((
                    hold,
                    HoldRead {
                        account: spend.account.clone(),
                        ticket: spend.ticket.clone(),
                        ..read
                    },
                ))
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    for read in reads {
        let (hold, read) = read?;
        state.holds.insert(hold, read);
    }
    Ok(())
}

/// The final state, once the payouts (if the run sent any) have drained: every account,
/// the tickets to judge, the payouts, and the bank's transfers for them.
async fn the_end(
    api: &Api,
    history: &History,
    options: &RunOptions,
) -> Result<(FinalState, Option<Drained>), RunError> {
    let paid_out = history
        .spends
        .iter()
        .any(|spend| spend.kind == SpendKind::Payout);
    let drained = if paid_out {
        Some(drain_payouts(api, &history.accounts, options.drain).await)
    } else {
        None
    };
    let mut final_state = read_back(api, history).await?;
    if paid_out {
        let bank = options.bank.as_deref();
        read_payouts(api, &history.accounts, bank, &mut final_state).await?;
    }
    Ok((final_state, drained))
}

/// Waits, at most `drain`, until the receiver took every event the run's committed
/// outcomes call for (deliveries go on after the load: retries, a backlog); then what it
/// got.
async fn drain_webhooks(
    receiver: &Receiver,
    history: &History,
    state: &FinalState,
    drain: Duration,
) -> Vec<Receipt> {
    let expected = crate::webhooks::expected_events(history, state);
    let started = Instant::now();
    loop {
        let receipts = receiver.receipts();
        let taken: std::collections::HashSet<(&str, &str)> = receipts
            .iter()
            .filter(|receipt| receipt.taken())
            .map(|receipt| (receipt.ticket_id.as_str(), receipt.event_type.as_str()))
            .collect();
        let all_in = expected
            .keys()
            .all(|(ticket, kind)| taken.contains(&(ticket.as_str(), *kind)));
        if all_in || started.elapsed() >= drain {
            // A moment more for repeats and strays already on their way.
            tokio::time::sleep(Duration::from_millis(300)).await;
            return receiver.receipts();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How the wait for the payouts to settle ended.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Drained {
    /// How long it waited.
    #[serde(rename = "waited_ms", serialize_with = "as_millis")]
    pub waited: Duration,
    /// Payouts still pending when it stopped: 0 unless the bank never gave its word for
    /// them within the run's `drain`.
    pub pending: usize,
}

fn as_millis<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(duration.as_millis() as u64)
}

/// Waits, at most `drain`, until none of the run's accounts has a payout pending: after
/// the load the dispatcher goes on sending them to the bank, and a failed one's money
/// comes back only when the bank's word is recorded — the audit must see the end.
async fn drain_payouts(api: &Api, accounts: &[AccountRecord], drain: Duration) -> Drained {
    let started = Instant::now();
    loop {
        let pending = futures::stream::iter(accounts.iter().enumerate())
            .map(|(index, account)| async move {
                match api
                    .payouts(index, &account.key, Some(PayoutStatus::Pending))
                    .await
                {
                    Ok(pending) => pending.len(),
                    // An account the ledger lost has nothing left to wait for.
                    Err(error) if error.unknown_to_the_ledger() => 0,
                    // One that cannot be read counts as pending: the wait goes on.
                    Err(_) => 1,
                }
            })
            .buffer_unordered(8)
            .fold(0, |total, pending| async move { total + pending })
            .await;
        if pending == 0 || started.elapsed() >= drain {
            return Drained {
                waited: started.elapsed(),
                pending,
            };
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads every payout of the run's accounts into `state`, and, given the bank, the
/// bank's transfers whose reference is one of them (asked payout by payout).
async fn read_payouts(
    api: &Api,
    accounts: &[AccountRecord],
    bank: Option<&str>,
    state: &mut FinalState,
) -> Result<(), RunError> {
    let read = futures::stream::iter(accounts.iter().enumerate())
        .map(|(index, account)| async move { api.payouts(index, &account.key, None).await })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    for payouts in read {
        let payouts = match payouts {
            Ok(payouts) => payouts,
            // An account the ledger lost (read back as such) shows no payouts.
            Err(error) if error.unknown_to_the_ledger() => continue,
            Err(error) => return Err(error.into()),
        };
        for payout in payouts {
            state.payouts.insert(payout.payout_id.clone(), payout);
        }
    }
    if let Some(bank) = bank {
        // Payout by payout: the bank may hold many other callers' transfers.
        let read = futures::stream::iter(state.payouts.keys())
            .map(|payout| api.bank_transfers(bank, payout))
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
        let mut transfers = Vec::new();
        for found in read {
            transfers.extend(found?);
        }
        transfers.sort_by_key(|transfer| transfer.id);
        state.bank = Some(transfers);
    }
    Ok(())
}

fn progress_bar(options: &RunOptions) -> ProgressBar {
    let bar = match options.limit {
        Limit::Duration(duration) => ProgressBar::new(duration.as_secs().max(1)),
        Limit::Requests(requests) => ProgressBar::new(requests),
    };
    if !options.progress {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let template = match options.limit {
        Limit::Duration(_) => "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len}s  {msg}",
        Limit::Requests(_) => "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} spends  {msg}",
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

async fn tick(
    bar: ProgressBar,
    live: Arc<Live>,
    issued: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    started: Instant,
    limit: Limit,
) {
    while !done.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let requests = live.requests.load(Ordering::Relaxed);
        let rate = requests as f64 / started.elapsed().as_secs_f64().max(0.001);
        bar.set_message(format!(
            "{requests} requests · {rate:.0}/s · {} ok · {} replays · {} refused · {} errors · {} resends",
            live.created.load(Ordering::Relaxed),
            live.replays.load(Ordering::Relaxed),
            live.refused.load(Ordering::Relaxed),
            live.errors.load(Ordering::Relaxed),
            live.retries.load(Ordering::Relaxed),
        ));
        match limit {
            Limit::Duration(_) => bar.set_position(started.elapsed().as_secs()),
            Limit::Requests(budget) => bar.set_position(issued.load(Ordering::Relaxed).min(budget)),
        }
    }
}
