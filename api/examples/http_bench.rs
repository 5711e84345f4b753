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
//! 32 clients) and `wrk` (32 connections, 2 threads) sending withdrawals of 1, each with
//! its own ticket, through HTTP: authentication, ticket lookup, the account lock, the
//! ledger transaction, release. Needs `wrk` and `pgbench`.

use std::process::Command;
use std::str::FromStr;
use std::time::Duration;

use clap::Parser;

#[path = "../../ledger/bench/pgbench.rs"]
mod pgbench;
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

#[derive(Parser, Debug)]
struct Args {
    /// wrk connections and pgbench clients.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 15)]
    seconds: u64,
    /// Rounds; the summary gives medians.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Accounts the withdrawals spread over.
    #[arg(long, default_value_t = 1000)]
    accounts: usize,
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
}

struct Round {
    withdrawals_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    pgbench_tps: f64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    println!(
        "api bench: connections={} seconds={} rounds={} accounts={}",
        args.connections, args.seconds, args.rounds, args.accounts
    );
    let mut admin = PgConnection::connect(&args.database_url).await?;
    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        // A fresh database each round, so neither side inherits the other's (or an
        // earlier round's) tables, bloat or checkpoint debt.
        let name = format!("payonce_bench_{}", Uuid::new_v4().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await?;
        let mut url = url::Url::parse(&args.database_url)?;
        url.set_path(&format!("/{name}"));
        let measured = run_round(&args, url.as_str(), round).await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut admin)
        .await?;
        rounds.push(measured?);
    }

    let median = |pick: fn(&Round) -> f64| {
        let mut values: Vec<f64> = rounds.iter().map(pick).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let ours = median(|r| r.withdrawals_per_sec);
    let theirs = median(|r| r.pgbench_tps);
    let ratio = median(|r| r.withdrawals_per_sec / r.pgbench_tps);
    println!("summary (medians over {} rounds):", args.rounds);
    println!(
        "  payonce HTTP withdrawals {ours:>7.0}/s   p50 {:.1} ms   p99 {:.1} ms (target <= 50 ms)",
        median(|r| r.p50_ms),
        median(|r| r.p99_ms)
    );
    println!("  pgbench bare SQL         {theirs:>7.0}/s   ratio {ratio:.2} (target >= 0.4)");
    Ok(())
}

/// One round: set both sides up on a fresh database, vacuum, then measure them one after
/// the other — pgbench first in odd rounds, payonce first in even ones.
async fn run_round(
    args: &Args,
    url: &str,
    round: usize,
) -> Result<Round, Box<dyn std::error::Error>> {
    let cli = api::config::Cli::parse_from([
        "payonce",
        "--database-url",
        url,
        "--redis-url",
        &args.redis_url,
        "--redis-namespace",
        &format!("bench-{}", Uuid::new_v4().simple()),
        "--db-max-connections",
        "32",
    ]);
    let config = cli.config;
    let state = api::state::AppState::connect(&config).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(api::serve(
        listener,
        state,
        config.request_timeout,
        async move {
            let _ = stopped.await;
        },
    ));

    let accounts = open_accounts(&address, args.accounts).await?;
    let raw = PgPoolOptions::new().max_connections(2).connect(url).await?;
    let tickets = issue_tickets(&raw, &accounts, (args.seconds as usize) * 6_000).await?;
    pgbench::create_tables(url, args.accounts)?;
    sqlx::query("VACUUM ANALYZE").execute(&raw).await?;
    raw.close().await;

    let (pgbench_tps, measured) = if round % 2 == 1 {
        let tps = pgbench::run(url, args.accounts, args.connections, args.seconds)?;
        (tps, wrk(&address, &tickets, args)?)
    } else {
        let measured = wrk(&address, &tickets, args)?;
        (
            pgbench::run(url, args.accounts, args.connections, args.seconds)?,
            measured,
        )
    };
    let _ = stop.send(());
    server.await??;
    println!(
        "round {round}: payonce {:.0} withdrawals/s, p50 {:.1} ms, p99 {:.1} ms; pgbench bare SQL {pgbench_tps:.0} tx/s; ratio {:.2}",
        measured.withdrawals_per_sec,
        measured.p50_ms,
        measured.p99_ms,
        measured.withdrawals_per_sec / pgbench_tps
    );
    Ok(Round {
        pgbench_tps,
        ..measured
    })
}

/// Accounts with balances no bench can exhaust: (id, key).
async fn open_accounts(
    address: &str,
    count: usize,
) -> Result<Vec<(Uuid, String)>, Box<dyn std::error::Error>> {
    let client = reqwest::Client::new();
    let mut accounts = Vec::with_capacity(count);
    for chunk in 0..count.div_ceil(32) {
        let requests = (0..32.min(count - chunk * 32)).map(|_| {
            client
                .post(format!("{address}/v1/accounts"))
                .json(&json!({ "name": "bench", "balance": 1_000_000_000_000_000_i64 }))
                .send()
        });
        for response in futures::future::join_all(requests).await {
            let body: Value = response?.json().await?;
            let id = Uuid::from_str(body["id"].as_str().ok_or("no id")?)?;
            accounts.push((id, body["api_key"].as_str().ok_or("no key")?.to_owned()));
        }
    }
    Ok(accounts)
}

/// Tickets inserted straight into the ledger's table, spread over the accounts.
async fn issue_tickets(
    raw: &sqlx::PgPool,
    accounts: &[(Uuid, String)],
    count: usize,
) -> Result<Vec<(Uuid, String, Uuid)>, Box<dyn std::error::Error>> {
    let tickets: Vec<(Uuid, String, Uuid)> = (0..count)
        .map(|_| {
            let (account, key) = &accounts[rand_index(accounts.len())];
            (*account, key.clone(), Uuid::new_v4())
        })
        .collect();
    for chunk in tickets.chunks(10_000) {
        let ids: Vec<Uuid> = chunk.iter().map(|t| t.2).collect();
        let owners: Vec<Uuid> = chunk.iter().map(|t| t.0).collect();
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

fn rand_index(len: usize) -> usize {
    (Uuid::new_v4().as_u128() % len as u128) as usize
}

fn wrk(
    address: &str,
    tickets: &[(Uuid, String, Uuid)],
    args: &Args,
) -> Result<Round, Box<dyn std::error::Error>> {
    let file = std::env::temp_dir().join(format!("payonce-bench-{}.txt", Uuid::new_v4().simple()));
    let lines: String = tickets
        .iter()
        .map(|(account, key, ticket)| format!("{account} {key} {ticket}\n"))
        .collect();
    std::fs::write(&file, lines)?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/withdraw.lua");
    let output = Command::new("wrk")
        .args([
            "-t",
            "2",
            "-c",
            &args.connections.to_string(),
            "-d",
            &format!("{}s", args.seconds),
        ])
        .args(["--timeout", "10s", "-s", script, address, "--"])
        .arg(&file)
        .arg("2")
        .output();
    let _ = std::fs::remove_file(&file);
    let output =
        output.map_err(|error| format!("cannot run wrk ({error}): apt-get install wrk"))?;
    let stdout = String::from_utf8(output.stdout)?;
    let value = |name: &str| -> Result<f64, Box<dyn std::error::Error>> {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .ok_or_else(|| {
                format!(
                    "wrk printed no {name}:\n{stdout}{}",
                    String::from_utf8_lossy(&output.stderr)
                )
                .into()
            })
    };
    let created = value("created")?;
    if value("other")? > 0.0 {
        return Err(format!("some withdrawals failed or tickets ran out:\n{stdout}").into());
    }
    Ok(Round {
        withdrawals_per_sec: created / Duration::from_secs(args.seconds).as_secs_f64(),
        p50_ms: value("latency_p50_us")? / 1000.0,
        p99_ms: value("latency_p99_us")? / 1000.0,
        pgbench_tps: 0.0,
    })
}
