//! Ledger throughput: `apply` withdrawals from concurrent tasks on PostgreSQL, printed beside
//! pgbench running the bare SQL of a withdrawal (bench/withdraw.sql: one conditional UPDATE
//! and one INSERT per transaction, on tables shaped like the ledger's) in the same run.
//!
//! ```text
//! cargo run --release -p ledger --example apply_bench -- --tasks 32 --seconds 15 --rounds 3
//! ```
//!
//! Two workloads: withdrawals spread over 10,000 accounts, and over 10 hot accounts. Each
//! round makes a fresh database, sets up both sides (accounts through the ledger, tickets
//! in bulk, pgbench's tables), vacuums, and runs pgbench and the ledger one after the
//! other, in alternating order. There is no lock: tasks share the hot accounts, and the bench
//! measures the ledger, not lock hand-offs. Each apply carries the next number of one
//! counter as its fencing token, as grants of a lock would; an apply whose token an account
//! had already passed (a later one committed first) is refused as stale, counted, and sent
//! again with a new token, as payonce does. The ledger's group commit reports its batch
//! sizes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use ledger::testing::ScratchDatabase;

#[path = "../bench/batches.rs"]
mod batches;
#[path = "../bench/pgbench.rs"]
mod pgbench;
use ledger::{
    AccountId, Amount, ApplyError, ApplyRequest, Execution, Ledger, LedgerOptions, NewAccount,
    Operation, OperationResult, TicketId,
};
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

#[derive(Parser, Debug)]
struct Args {
    /// Concurrent tasks (and pgbench clients).
    #[arg(long, default_value_t = 32)]
    tasks: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 15.0)]
    seconds: f64,
    /// Rounds; the summary gives medians.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// The server to benchmark (a database of the bench's own is created on it).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// The ledger's group commit: the most spends in one batch (1: each spend alone).
    #[arg(long, default_value_t = LedgerOptions::default().batch_max)]
    batch_max: usize,
    /// The ledger's group commit: batches in flight at once.
    #[arg(long, default_value_t = LedgerOptions::default().batch_workers)]
    batch_workers: usize,
    /// Which workloads to run: `uniform` (10,000 accounts), `hot` (10 hot accounts).
    #[arg(long, value_delimiter = ',', default_values_t = [Workload::Uniform, Workload::Hot])]
    workloads: Vec<Workload>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Workload {
    Uniform,
    Hot,
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Uniform => "uniform",
            Self::Hot => "hot",
        })
    }
}

/// A body shaped like the API's: the numbers as numbers.
fn render(execution: &Execution<'_>) -> Value {
    match *execution.result {
        OperationResult::Applied {
            balance, points, ..
        } => json!({
            "ticket_id": execution.ticket_id,
            "account_id": execution.account_id,
            "balance": balance,
            "points": points,
        }),
        OperationResult::Refused(refusal) => json!({ "refused": format!("{refusal:?}") }),
        // The benchmark spends only: no holds, no refunds.
        OperationResult::HoldChanged { balance, .. }
        | OperationResult::Refunded { balance, .. } => {
            json!({ "balance": balance })
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    println!(
        "ledger bench: tasks={} seconds={} rounds={} batch max={} workers={}",
        args.tasks, args.seconds, args.rounds, args.batch_max, args.batch_workers
    );
    let mut summary = Vec::new();
    for workload in &args.workloads {
        let (label, accounts) = match workload {
            Workload::Uniform => ("10,000 accounts", 10_000_usize),
            Workload::Hot => ("10 hot accounts", 10),
        };
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        let mut ratios = Vec::new();
        for round in 1..=args.rounds {
            // A fresh database each round, so neither side inherits the other's (or an
            // earlier round's) tables, bloat or checkpoint debt.
            let database = ScratchDatabase::create(&args.database_url, "payonce_bench").await?;
            let result = run_round(&args, database.url(), accounts, round).await;
            database.drop().await?;
            let (rate, baseline) = result?;
            println!(
                "round {round}, {label}: ledger apply {rate:.0} applies/s, pgbench {baseline:.0} tx/s, ratio {:.2}",
                rate / baseline
            );
            ours.push(rate);
            theirs.push(baseline);
            ratios.push(rate / baseline);
        }
        summary.push((label, median(ours), median(theirs), median(ratios)));
    }
    println!(
        "summary (medians over {} rounds; target ratio >= 1.3 on 10,000 accounts, >= 2.5 on 10 hot):",
        args.rounds
    );
    for (label, ours, theirs, ratio) in summary {
        println!(
            "  {label:<16} ledger apply {ours:>7.0} applies/s   pgbench bare SQL {theirs:>7.0} tx/s   ratio {ratio:.2}"
        );
    }
    Ok(())
}

/// One round on a fresh database: set both sides up, vacuum, then measure them one after
/// the other — pgbench first in odd rounds, the ledger first in even ones.
async fn run_round(
    args: &Args,
    url: &str,
    accounts: usize,
    round: usize,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let options = LedgerOptions {
        max_connections: u32::try_from(args.tasks)?,
        batch_max: args.batch_max,
        batch_workers: args.batch_workers,
        ..LedgerOptions::default()
    };
    let ledger = Ledger::open_postgres(url, &options).await?;
    let raw = PgPoolOptions::new().max_connections(4).connect(url).await?;
    let ids = create_accounts(&ledger, accounts, args.tasks).await?;
    // More tickets than the fastest run could use: 30,000 a second, twice the fastest seen
    // (the hot accounts on a fast day); running out ends the round with an error.
    let tickets = issue_tickets(&raw, &ids, (args.seconds * 30_000.0) as usize).await?;
    pgbench::create_tables(url, accounts)?;
    sqlx::query("VACUUM ANALYZE").execute(&raw).await?;
    let result = if round % 2 == 1 {
        let baseline = pgbench::run(url, accounts, args.tasks, args.seconds.ceil() as u64)?;
        (measure(&ledger, tickets, args).await?, baseline)
    } else {
        let rate = measure(&ledger, tickets, args).await?;
        (
            rate,
            pgbench::run(url, accounts, args.tasks, args.seconds.ceil() as u64)?,
        )
    };
    raw.close().await;
    ledger.close().await;
    Ok(result)
}

async fn create_accounts(
    ledger: &Ledger,
    count: usize,
    tasks: usize,
) -> Result<Vec<AccountId>, Box<dyn std::error::Error>> {
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (ledger, next) = (ledger.clone(), next.clone());
            tokio::spawn(async move {
                let mut ids = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    let new = NewAccount::new("bench", 1_000_000_000_000, 0)?;
                    ids.push(ledger.create_account(&new).await?.0.id);
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(ids)
            })
        })
        .collect();
    let mut ids = Vec::with_capacity(count);
    for worker in workers {
        ids.extend(worker.await?.map_err(|error| error.to_string())?);
    }
    Ok(ids)
}

/// Tickets for one round, issued in bulk so issuing is not part of the measurement.
async fn issue_tickets(
    raw: &sqlx::PgPool,
    accounts: &[AccountId],
    count: usize,
) -> Result<Vec<(TicketId, AccountId)>, Box<dyn std::error::Error>> {
    let tickets: Vec<(TicketId, AccountId)> = (0..count)
        .map(|_| {
            (
                TicketId::random(),
                accounts[rand::random_range(0..accounts.len())],
            )
        })
        .collect();
    for chunk in tickets.chunks(10_000) {
        let ids: Vec<Uuid> = chunk.iter().map(|(ticket, _)| ticket.0).collect();
        let owners: Vec<Uuid> = chunk.iter().map(|(_, account)| account.0).collect();
        sqlx::query(
            "INSERT INTO tickets (id, account_id, created_at, expires_at)
             SELECT id, account_id, now(), now() + interval '1 day'
             FROM UNNEST($1::uuid[], $2::uuid[]) AS t (id, account_id)",
        )
        .bind(ids)
        .bind(owners)
        .execute(raw)
        .await?;
    }
    Ok(tickets)
}

/// Applies/s that went through, with the stale refusals and the batch sizes seen.
async fn measure(
    ledger: &Ledger,
    tickets: Vec<(TicketId, AccountId)>,
    args: &Args,
) -> Result<f64, Box<dyn std::error::Error>> {
    let tickets = Arc::new(tickets);
    let next = Arc::new(AtomicUsize::new(0));
    let token = Arc::new(AtomicU64::new(1));
    let done = Arc::new(AtomicU64::new(0));
    let stale = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let batches_before = ledger.batches().map(ledger::Batches::counts);
    let started = Instant::now();
    let workers: Vec<_> = (0..args.tasks)
        .map(|_| {
            let (ledger, tickets, next, token, done, stale, stop) = (
                ledger.clone(),
                tickets.clone(),
                next.clone(),
                token.clone(),
                done.clone(),
                stale.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let amount = Operation::Withdrawal(Amount::new(1)?);
                while !stop.load(Ordering::Relaxed) {
                    let Some(&(ticket_id, account_id)) =
                        tickets.get(next.fetch_add(1, Ordering::Relaxed))
                    else {
                        return Err("ran out of tickets; raise the estimate".into());
                    };
                    loop {
                        let request = ApplyRequest {
                            ticket_id,
                            account_id,
                            operation: amount,
                            fingerprint: "POST withdrawal 1",
                            fencing_token: token.fetch_add(1, Ordering::Relaxed),
                        };
                        match ledger.apply(request, &render).await {
                            Ok(applied) if applied.response.status == 201 => break,
                            Ok(applied) => {
                                return Err(
                                    format!("unexpected outcome {:?}", applied.response).into()
                                );
                            }
                            Err(ApplyError::StaleToken { .. }) => {
                                stale.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(error) => return Err(error.into()),
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await?.map_err(|error| error.to_string())?;
    }
    let rate = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    let batches = match (
        batches_before,
        ledger.batches().map(ledger::Batches::counts),
    ) {
        (Some(before), Some(after)) => batches::summary(&before, &after),
        _ => "none".into(),
    };
    println!(
        "  ledger: {rate:.0} applies/s, {} sent again after a stale refusal; group commit: {batches}",
        stale.load(Ordering::Relaxed)
    );
    Ok(rate)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
