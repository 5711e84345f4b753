//! Payouts dispatched per second at the bank, beside the bank's own rate for transfers
//! created with keys by the same load generator, in alternating rounds; and the time from
//! a payout's 202 to `succeeded` with no faults.
//!
//! ```text
//! cargo run --release -p api --example payout_bench -- --payouts 6000 --rounds 5
//! ```
//!
//! Each round makes a fresh PostgreSQL database for payonce's ledger and a fresh
//! `payonce-bank` (its SQLite store in a temporary directory, served in this process on a
//! loopback port), and starts one payonce server in this process (PostgreSQL + Redis,
//! `--workers` payout workers).
//!
//! - **Dispatch**: `--payouts` payouts are accepted through the API (`--clients` at once)
//!   while the bank is not up yet, so they queue in the outbox (each tried once and put
//!   back for ten minutes); then the bank starts on the port payonce was told, every job is
//!   made due at once, and the clock runs until every payout is `succeeded` — the
//!   workers' rate of transfers at the bank.
//! - **Baseline**: the same number of transfers sent straight to a fresh bank by the same
//!   client tasks (`--clients` at once), each with its own key — the bank's own rate.
//! - **Latency**: then `--latency-payouts` payouts one after another on the idle, running
//!   pair; each payout's time from its 202 to `succeeded` is read from the ledger's clock
//!   (created and settled timestamps).
//!
//! - **With history** (`--history N`, N > 0): the same dispatch again, on a database that
//!   already holds N settled payouts (each with its completed ticket; written by one
//!   statement, then vacuumed and analysed) — a claim's cost must not grow with what is
//!   finished. Printed as its rate against the dispatch on an empty database.
//!
//! The three runs alternate in order round by round (the bank, the dispatch, with history;
//! then the reverse); the summary gives medians and the median of the per-round ratios.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use ledger::testing::ScratchDatabase;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

#[path = "../bench/http.rs"]
mod http;

#[derive(Parser, Debug)]
struct Args {
    /// Payouts (and baseline transfers) per round.
    #[arg(long, default_value_t = 6000)]
    payouts: usize,
    /// Client tasks sending at once.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// payonce's payout workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Payouts sent one after another for the 202-to-succeeded latency.
    #[arg(long, default_value_t = 300)]
    latency_payouts: usize,
    /// Settled payouts already in the database for the "with history" dispatch (0: none
    /// is run).
    #[arg(long, default_value_t = 0)]
    history: usize,
    /// Rounds; the summary gives medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[command(flatten)]
    services: http::Services,
}

struct Round {
    dispatched_per_sec: f64,
    /// The dispatch rate on a database with `--history` settled payouts.
    with_history_per_sec: Option<f64>,
    bank_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// A bank in this process, its store in a temporary directory.
struct Bank {
    server: bank::ServerHandle,
    _store: tempfile::TempDir,
}

async fn start_bank(on: SocketAddr) -> Result<Bank, http::BoxError> {
    let store = tempfile::tempdir()?;
    let opened = bank::Bank::open(bank::BankOptions {
        database_url: format!("sqlite:{}", store.path().join("bank.db").display()),
        ..bank::BankOptions::default()
    })
    .await?;
    let listener = tokio::net::TcpListener::bind(on).await?;
    Ok(Bank {
        server: opened.serve(listener)?,
        _store: store,
    })
}

/// A loopback address free now.
async fn free_address() -> Result<SocketAddr, http::BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    Ok(listener.local_addr()?)
}

/// Runs `count` jobs on `clients` tasks; each job is `job(index)`.
async fn on_clients<F, Fut>(count: usize, clients: usize, job: F) -> Result<(), http::BoxError>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), http::BoxError>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let job = Arc::new(job);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let next = Arc::clone(&next);
            let job = Arc::clone(&job);
            tokio::spawn(async move {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= count {
                        return Ok::<_, http::BoxError>(());
                    }
                    job(index).await?;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// The bank's own rate: `count` transfers with fresh keys, `clients` at once.
async fn baseline(args: &Args) -> Result<f64, http::BoxError> {
    let bank = start_bank(free_address().await?).await?;
    let url = format!("http://{}/v1/transfers", bank.server.addr());
    let client = reqwest::Client::new();
    let started = Instant::now();
    on_clients(args.payouts, args.clients, move |index| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let response = client
                .post(&url)
                .header("Idempotency-Key", format!("bench-{index}-{}", Uuid::new_v4()))
                .json(&json!({ "destination": "DE89370400440532013000", "amount": 1, "reference": "bench" }))
                .send()
                .await?;
            if response.status() != reqwest::StatusCode::CREATED {
                return Err(format!("the bank answered {}", response.status()).into());
            }
            Ok(())
        }
    })
    .await?;
    let rate = args.payouts as f64 / started.elapsed().as_secs_f64();
    bank.server.shutdown().await;
    Ok(rate)
}

/// Sends one payout from `account` with a fresh ticket; its id.
async fn pay_out(
    client: &reqwest::Client,
    address: &str,
    (account, key): &(Uuid, String),
) -> Result<String, http::BoxError> {
    let ticket: Value = client
        .post(format!("{address}/v1/accounts/{account}/tickets"))
        .bearer_auth(key)
        .send()
        .await?
        .json()
        .await?;
    let ticket = ticket["ticket_id"].as_str().ok_or("no ticket")?.to_owned();
    let answer = client
        .post(format!("{address}/v1/accounts/{account}/payouts"))
        .bearer_auth(key)
        .header("Idempotency-Key", ticket)
        .json(&json!({ "amount": 1, "destination": "DE89370400440532013000" }))
        .send()
        .await?;
    if answer.status() != reqwest::StatusCode::ACCEPTED {
        return Err(format!("payonce answered {}", answer.status()).into());
    }
    let body: Value = answer.json().await?;
    Ok(body["payout_id"].as_str().ok_or("no payout id")?.to_owned())
}

/// Waits until `ledger` holds no pending payout (bounded: 10 minutes).
async fn drained(ledger: &ledger::Ledger) -> Result<(), http::BoxError> {
    let until = Instant::now() + Duration::from_secs(600);
    while Instant::now() < until {
        if ledger.pending_payouts().await?.0 == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err("payouts still pending after 10 minutes".into())
}

/// Writes `count` settled payouts of `account`, each with its completed ticket, as
/// history; then vacuums and analyses what it wrote.
async fn write_history(
    database: &mut PgConnection,
    account: Uuid,
    count: usize,
) -> Result<(), http::BoxError> {
    sqlx::query(
        "WITH written AS (
             INSERT INTO tickets (id, account_id, created_at, expires_at, operation, fingerprint,
                                  response_status, response_body, completed_at)
             SELECT gen_random_uuid(), $1, now(), now() + interval '1 day', 'payout',
                    'history', 202, '{}', now()
             FROM generate_series(1, $2)
             RETURNING id
         )
         INSERT INTO payouts (id, account_id, ticket_id, amount, destination, status,
                              bank_transfer_id, created_at, settled_at, attempts)
         SELECT gen_random_uuid(), $1, id, 1, 'DE89370400440532013000', 'succeeded',
                'history-' || id, now(), now(), 1
         FROM written",
    )
    .bind(account)
    .bind(i64::try_from(count)?)
    .execute(&mut *database)
    .await?;
    sqlx::query("VACUUM ANALYZE tickets, payouts")
        .execute(&mut *database)
        .await?;
    Ok(())
}

async fn dispatch_and_latency(
    args: &Args,
    database_url: &str,
    history: usize,
) -> Result<(f64, f64, f64), http::BoxError> {
    let bank_address = free_address().await?;
    let bank_url = format!("http://{bank_address}");
    let workers = args.workers.to_string();
    let server = http::Server::start(args.services.config(
        database_url,
        &format!("payout-bench-{}", Uuid::new_v4().simple()),
        &[
            "--bank-url",
            &bank_url,
            "--payout-workers",
            &workers,
            // Queued while the bank is away, each payout is tried once and put back for ten
            // minutes (not tried again and again: that churn is not what is measured); the
            // drain then makes them all due at once.
            "--payout-retry-base",
            "10m",
            "--payout-retry-max",
            "10m",
            "--payout-attempts",
            "1000000",
            "--payout-poll",
            "20ms",
            "--spends-per-second",
            "1000000",
            "--tickets-per-second",
            "1000000",
        ],
    ))
    .await?;
    let accounts = Arc::new(http::open_accounts(&server.address, 100).await?);
    let mut database = PgConnection::connect(database_url).await?;
    if history > 0 {
        write_history(&mut database, accounts[0].0, history).await?;
    }
    let client = reqwest::Client::new();
    // Queue them while the bank is away.
    let address = server.address.clone();
    let (queued_client, queued_accounts) = (client.clone(), Arc::clone(&accounts));
    on_clients(args.payouts, args.clients, move |index| {
        let (client, accounts, address) = (
            queued_client.clone(),
            Arc::clone(&queued_accounts),
            address.clone(),
        );
        async move {
            pay_out(&client, &address, &accounts[index % accounts.len()]).await?;
            Ok(())
        }
    })
    .await?;
    let ledger = server.state.ledger().clone();
    let until = Instant::now() + Duration::from_secs(300);
    loop {
        let (untried,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM outbox WHERE attempts = 0 OR lease_until IS NOT NULL",
        )
        .fetch_one(&mut database)
        .await?;
        if untried == 0 {
            break;
        }
        if Instant::now() > until {
            return Err("payouts not tried once within 5 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // As autovacuum would have by now on a database in use: a fresh one's tables have no
    // statistics, and its planner would scan them whole.
    sqlx::query("VACUUM ANALYZE outbox, payouts")
        .execute(&mut database)
        .await?;
    // Every write so far on disk before the clock runs. The history's rows start a
    // checkpoint that PostgreSQL spreads over the next minutes, through the drain; forced
    // here (a superuser's, or `pg_checkpoint`'s), it is over, and every run starts just
    // after one.
    sqlx::query("CHECKPOINT").execute(&mut database).await?;
    let bank = start_bank(bank_address).await?;
    // The clock starts once the jobs are due: making them so is the bench's setup (one
    // UPDATE of every job), not the dispatchers' work.
    sqlx::query("UPDATE outbox SET due_at = now() WHERE done_at IS NULL")
        .execute(&mut database)
        .await?;
    // And the idle workers told, as a commit that queues payouts tells them.
    sqlx::query("SELECT pg_notify($1, 'payout')")
        .bind(ledger::BELL_CHANNEL)
        .execute(&mut database)
        .await?;
    let started = Instant::now();
    drained(&ledger).await?;
    let dispatched = args.payouts as f64 / started.elapsed().as_secs_f64();

    // The latency, one payout at a time on the idle pair.
    let mut ids = Vec::with_capacity(args.latency_payouts);
    for index in 0..args.latency_payouts {
        ids.push(pay_out(&client, &server.address, &accounts[index % accounts.len()]).await?);
        drained(&ledger).await?;
    }
    let mut histogram = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    for id in ids {
        let payout = ledger
            .payout(ledger::payouts::PayoutId(Uuid::parse_str(&id)?))
            .await?
            .ok_or("a payout went missing")?;
        let settled = payout.settled_at.ok_or("a payout is not settled")?;
        let micros = (settled - payout.created_at).whole_microseconds().max(1);
        histogram.record(u64::try_from(micros)?)?;
    }
    server.stop().await?;
    bank.server.shutdown().await;
    Ok((
        dispatched,
        histogram.value_at_quantile(0.5) as f64 / 1000.0,
        histogram.value_at_quantile(0.99) as f64 / 1000.0,
    ))
}

#[tokio::main]
async fn main() -> Result<(), http::BoxError> {
    let args = Args::parse();
    println!(
        "payout bench: payouts={} clients={} workers={} rounds={}",
        args.payouts, args.clients, args.workers, args.rounds
    );
    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        // Alternate the order, so that none always meets the cooler machine: the bank
        // alone, then the dispatch, then with history in odd rounds; the reverse in even
        // ones.
        let with_history = || async {
            match args.history {
                0 => Ok::<_, http::BoxError>(None),
                history => Ok(Some(dispatch_on_scratch(&args, history).await?.0)),
            }
        };
        let (bank_per_sec, (dispatched_per_sec, p50_ms, p99_ms), with_history_per_sec) =
            if round % 2 == 1 {
                let bank = baseline(&args).await?;
                let dispatched = dispatch_on_scratch(&args, 0).await?;
                (bank, dispatched, with_history().await?)
            } else {
                let with_history = with_history().await?;
                let dispatched = dispatch_on_scratch(&args, 0).await?;
                (baseline(&args).await?, dispatched, with_history)
            };
        let measured = Round {
            dispatched_per_sec,
            with_history_per_sec,
            bank_per_sec,
            p50_ms,
            p99_ms,
        };
        println!(
            "round {round}: payonce dispatched {:>6.0} payouts/s   bank alone {:>6.0} transfers/s   ratio {:.2}   202→succeeded p50 {:.1} ms p99 {:.1} ms",
            measured.dispatched_per_sec,
            measured.bank_per_sec,
            measured.dispatched_per_sec / measured.bank_per_sec,
            measured.p50_ms,
            measured.p99_ms
        );
        if let Some(with_history) = measured.with_history_per_sec {
            println!(
                "         with {} settled before: {with_history:>6.0} payouts/s   ratio to an empty database {:.2}",
                args.history,
                with_history / measured.dispatched_per_sec
            );
        }
        rounds.push(measured);
    }
    let median = |pick: fn(&Round) -> f64| http::median(&rounds, pick);
    println!("summary (medians over {} rounds):", args.rounds);
    println!(
        "  payonce dispatched {:>6.0} payouts/s   bank alone {:>6.0} transfers/s   ratio {:.2} (target >= 0.9)",
        median(|r| r.dispatched_per_sec),
        median(|r| r.bank_per_sec),
        median(|r| r.dispatched_per_sec / r.bank_per_sec)
    );
    println!(
        "  202 → succeeded p50 {:.1} ms   p99 {:.1} ms (target <= 50 ms)",
        median(|r| r.p50_ms),
        median(|r| r.p99_ms)
    );
    if args.history > 0 {
        println!(
            "  with {} settled before: {:>6.0} payouts/s   ratio to an empty database {:.2} (target >= 0.9)",
            args.history,
            median(|r| r.with_history_per_sec.unwrap_or_default()),
            median(|r| r.with_history_per_sec.unwrap_or_default() / r.dispatched_per_sec)
        );
    }
    Ok(())
}

/// [`dispatch_and_latency`] on a fresh database, with `history` settled payouts in it.
async fn dispatch_on_scratch(
    args: &Args,
    history: usize,
) -> Result<(f64, f64, f64), http::BoxError> {
    let database = ScratchDatabase::create(&args.services.database_url, "payonce_bench").await?;
    let measured = dispatch_and_latency(args, database.url(), history).await?;
    database.drop().await?;
    Ok(measured)
}
