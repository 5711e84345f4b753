//! Withdrawals per second through one payonce instance on PostgreSQL + Redis, printed
//! beside pgbench running the bare SQL of a withdrawal in the same run.
//!
//! ```text
//! cargo run --release -p api --example http_bench -- --connections 32 --seconds 15 --rounds 3
//! ```
//!
//! Each round makes a fresh database and starts one payonce server in this process
//! (distributed mode, a Redis namespace of its own), opens 1,000 accounts through the API,
//! issues tickets in bulk (the fixture; issuing is not what is measured), creates
//! pgbench's tables, and vacuums. It then runs, in alternating order, pgbench with
//! `ledger/bench/withdraw.sql` (one conditional UPDATE plus one INSERT per transaction,
//! `--pgbench-clients`, 32) and `wrk` (`--connections`, 32; two threads) sending
//! withdrawals of 1, each with its own ticket, through HTTP: authentication, the account
//! lock, the ledger's group commit, release — and prints the batch sizes. Then it replays
//! tickets the run used, at one connection, for the replay latency: at the instance that
//! ran them and at a second one that did not. Needs `wrk` and `pgbench`.

use clap::Parser;
use ledger::testing::ScratchDatabase;

#[path = "../../ledger/bench/batches.rs"]
mod batches;
#[path = "../bench/http.rs"]
mod http;
#[path = "../../ledger/bench/pgbench.rs"]
mod pgbench;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

#[derive(Parser, Debug)]
struct Args {
    /// wrk connections.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// pgbench clients (PostgreSQL's 100 connections, shared with payonce's pool, bound
    /// it; 32 is near pgbench's best here).
    #[arg(long, default_value_t = 32)]
    pgbench_clients: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 15)]
    seconds: u64,
    /// Rounds; the summary gives medians.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Accounts the withdrawals spread over.
    #[arg(long, default_value_t = 1000)]
    accounts: usize,
    #[command(flatten)]
    services: http::Services,
    /// Seconds of replays (used tickets sent again, one connection) after each round's
    /// withdrawals; 0: none.
    #[arg(long, default_value_t = 3)]
    replay_seconds: u64,
    /// payonce's PAYONCE_BATCH_MAX (1: no group commit).
    #[arg(long, default_value_t = 64)]
    batch_max: usize,
    /// payonce's PAYONCE_BATCH_WORKERS.
    #[arg(long, default_value_t = 2)]
    batch_workers: usize,
}

struct Round {
    withdrawals_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    pgbench_tps: f64,
    /// Replays at one connection, at the instance that ran them: p50 latency.
    replay_p50_ms: f64,
    /// The same, at another instance.
    replay_elsewhere_p50_ms: f64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    println!(
        "api bench: connections={} pgbench clients={} seconds={} rounds={} accounts={}",
        args.connections, args.pgbench_clients, args.seconds, args.rounds, args.accounts
    );
    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        // A fresh database each round, so neither side inherits the other's (or an
        // earlier round's) tables, bloat or checkpoint debt.
        let database =
            ScratchDatabase::create(&args.services.database_url, "payonce_bench").await?;
        let measured = run_round(&args, database.url(), round).await;
        database.drop().await?;
        rounds.push(measured?);
    }

    let median = |pick: fn(&Round) -> f64| http::median(&rounds, pick);
    let ours = median(|r| r.withdrawals_per_sec);
    let theirs = median(|r| r.pgbench_tps);
    let ratio = median(|r| r.withdrawals_per_sec / r.pgbench_tps);
    println!("summary (medians over {} rounds):", args.rounds);
    println!(
        "  payonce HTTP withdrawals {ours:>7.0}/s   p50 {:.1} ms   p99 {:.1} ms (target <= 20 ms)",
        median(|r| r.p50_ms),
        median(|r| r.p99_ms)
    );
    println!("  pgbench bare SQL         {theirs:>7.0}/s   ratio {ratio:.2} (target >= 0.9)");
    if args.replay_seconds > 0 {
        println!(
            "  replays, one connection  p50 {:.3} ms at the instance that ran them, {:.3} ms at another (target <= 1 ms)",
            median(|r| r.replay_p50_ms),
            median(|r| r.replay_elsewhere_p50_ms)
        );
    }
    Ok(())
}

/// One round: set both sides up on a fresh database, vacuum, then measure them one after
/// the other — pgbench first in odd rounds, payonce first in even ones.
async fn run_round(
    args: &Args,
    url: &str,
    round: usize,
) -> Result<Round, Box<dyn std::error::Error>> {
    let namespace = format!("bench-{}", Uuid::new_v4().simple());
    let (batch_max, batch_workers) = (args.batch_max.to_string(), args.batch_workers.to_string());
    let config = || {
        args.services.config(
            url,
            &namespace,
            &[
                "--db-max-connections",
                "32",
                "--batch-max",
                &batch_max,
                "--batch-workers",
                &batch_workers,
            ],
        )
    };
    let server = http::Server::start(config())
        .await
        .map_err(|error| error.to_string())?;
    let address = server.address.clone();

    let accounts = http::open_accounts(&address, args.accounts)
        .await
        .map_err(|error| error.to_string())?;
    let raw = PgPoolOptions::new().max_connections(2).connect(url).await?;
    // Twice the fastest rate seen (about 9,700 withdrawals/s at 128 connections); running
    // out fails the round.
    let tickets = http::issue_tickets(&raw, &accounts, (args.seconds as usize) * 20_000)
        .await
        .map_err(|error| error.to_string())?;
    pgbench::create_tables(url, args.accounts)?;
    sqlx::query("VACUUM ANALYZE").execute(&raw).await?;
    raw.close().await;

    let batches = || server.batches();
    // Replays of tickets the run used: the first four fifths of what it spent, which both
    // wrk threads (taking every other line) have used. Sent to the instance that ran them
    // at once (it remembers the last seconds' tickets and looks them up first), and to
    // another instance, which does not: there a replay takes the free account lock and
    // the ledger's statement answers it — the path of every replay that arrives at a
    // different instance, or later.
    let used = |measured: &Round| {
        &tickets[..((measured.withdrawals_per_sec * args.seconds as f64 * 0.8) as usize)
            .min(tickets.len())]
    };
    let (pgbench_tps, measured, before, after, replays_here) = if round % 2 == 1 {
        let tps = pgbench::run(url, args.accounts, args.pgbench_clients, args.seconds)?;
        let before = batches();
        let measured = measure(&address, &tickets, args)?;
        let after = batches();
        let replays = replay(&address, used(&measured), args)?;
        (tps, measured, before, after, replays)
    } else {
        let before = batches();
        let measured = measure(&address, &tickets, args)?;
        let after = batches();
        let replays = replay(&address, used(&measured), args)?;
        (
            pgbench::run(url, args.accounts, args.pgbench_clients, args.seconds)?,
            measured,
            before,
            after,
            replays,
        )
    };
    println!(
        "round {round}: payonce {:.0} withdrawals/s, p50 {:.1} ms, p99 {:.1} ms; pgbench bare SQL {pgbench_tps:.0} tx/s; ratio {:.2}",
        measured.withdrawals_per_sec,
        measured.p50_ms,
        measured.p99_ms,
        measured.withdrawals_per_sec / pgbench_tps
    );
    println!("  group commit: {}", batches::summary(&before, &after));
    let replays_elsewhere = if args.replay_seconds > 0 {
        let other = http::Server::start(config())
            .await
            .map_err(|error| error.to_string())?;
        http::know_keys(&other.address, &accounts)
            .await
            .map_err(|error| error.to_string())?;
        let replays = replay(&other.address, used(&measured), args)?;
        other.stop().await.map_err(|error| error.to_string())?;
        replays
    } else {
        None
    };
    let mut p50 = [0.0; 2];
    for ((instance, replays), p50) in [
        ("the instance that ran them", replays_here),
        ("another instance", replays_elsewhere),
    ]
    .into_iter()
    .zip(&mut p50)
    {
        if let Some(replays) = replays {
            println!(
                "  replays at {instance}, one connection: {:.0}/s, p50 {:.3} ms, p99 {:.3} ms",
                replays.per_sec, replays.p50_ms, replays.p99_ms
            );
            *p50 = replays.p50_ms;
        }
    }
    let [replay_p50_ms, replay_elsewhere_p50_ms] = p50;
    server.stop().await.map_err(|error| error.to_string())?;
    Ok(Round {
        pgbench_tps,
        replay_p50_ms,
        replay_elsewhere_p50_ms,
        ..measured
    })
}

/// Used tickets sent again through `address` at one connection; `None` if replays are off.
fn replay(
    address: &str,
    used: &[(Uuid, String, Uuid)],
    args: &Args,
) -> Result<Option<http::Withdrawals>, Box<dyn std::error::Error>> {
    if args.replay_seconds == 0 {
        return Ok(None);
    }
    Ok(Some(
        http::wrk(address, used, 1, args.replay_seconds, true)
            .map_err(|error| error.to_string())?,
    ))
}

fn measure(
    address: &str,
    tickets: &[(Uuid, String, Uuid)],
    args: &Args,
) -> Result<Round, Box<dyn std::error::Error>> {
    let measured = http::wrk(address, tickets, args.connections, args.seconds, false)
        .map_err(|error| error.to_string())?;
    Ok(Round {
        withdrawals_per_sec: measured.per_sec,
        p50_ms: measured.p50_ms,
        p99_ms: measured.p99_ms,
        pgbench_tps: 0.0,
        replay_p50_ms: 0.0,
        replay_elsewhere_p50_ms: 0.0,
    })
}
