//! Authorize-then-capture pairs per second beside withdrawals per second, through one
//! payonce instance on PostgreSQL + Redis, in alternating rounds.
//!
//! ```text
//! cargo run --release -p api --example holds_bench -- --connections 32 --seconds 10 --rounds 5
//! ```
//!
//! Each round makes a fresh database and starts one payonce server in this process
//! (distributed mode, a Redis namespace of its own), opens 1,000 accounts through the API and
//! issues tickets in bulk (the fixture; issuing is not what is measured). Both works run
//! unmeasured for `--warmup` seconds, and the tables they wrote are vacuumed and analyzed,
//! so that what is measured is a server with history rather than a database's first
//! minutes. Then the same load generator — `--connections` clients in this process, each
//! sending its next request as soon as the last was answered — measures both works in
//! alternating slices of `--slice` seconds (pairs first in odd rounds, withdrawals first in
//! even ones) until each has had `--seconds`; each side's figures add up its slices. The
//! machine's speed swings within a minute, and a slice of each work every few seconds
//! shares those swings between the two sides, where one run of each after the other
//! handed a slow ten seconds to one side alone:
//!
//! - withdrawals of 1, each with its own ticket: a 201 each;
//! - pairs: a hold of 1 placed with one ticket (201), then captured whole with another
//!   ticket of the same account (200) — two requests, two locks (the account's, then the
//!   hold's), two transactions.
//!
//! A pair is two requests, so half the withdrawals' rate is what two withdrawals would cost;
//! the issue's bar is 0.45. Any other answer fails the round. The load generator shares the
//! machine with the server, the same for both sides. Each side also prints the CPU one
//! operation took, and where: PostgreSQL's processes, Redis's, and this process (payonce
//! and its clients), read from `/proc` — the ratio of the rates where the cores are the
//! limit, and which part a pair spends more in than two withdrawals.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use ledger::testing::ScratchDatabase;
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

#[path = "../../ledger/bench/batches.rs"]
mod batches;
#[path = "../bench/http.rs"]
mod http;

use http::BoxError;

#[derive(Parser, Debug)]
struct Args {
    /// Clients sending at once.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Seconds of each work measured per round.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Seconds of one work before the other takes over, within a round.
    #[arg(long, default_value_t = 2.0)]
    slice: f64,
    /// Rounds; the summary gives medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds of each work sent, unmeasured, before the measured ones (see `run_round`).
    #[arg(long, default_value_t = 3)]
    warmup: u64,
    /// Accounts the spends spread over.
    #[arg(long, default_value_t = 1000)]
    accounts: usize,
    #[command(flatten)]
    services: http::Services,
}

/// What one side measured: its slices of a round added up.
struct Measured {
    /// Withdrawals, or pairs, completed per second.
    per_sec: f64,
    /// Latency of one withdrawal, or of one whole pair.
    p50_ms: f64,
    p99_ms: f64,
    /// The CPU one withdrawal, or one whole pair, took, in microseconds (where `/proc` says).
    cpu: Option<http::CpuTaken>,
    /// The group commit's batches in the measured seconds (spends' and holds' together).
    batches: String,
}

struct Round {
    withdrawals: Measured,
    pairs: Measured,
}

/// What a client sends, over and over.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Work {
    Withdrawals,
    Pairs,
}

/// An account's id and key, with tickets of it: one per withdrawal, two per pair.
struct Spender {
    account: Uuid,
    key: String,
    tickets: Vec<Uuid>,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    println!(
        "holds bench: connections={} seconds={} slice={} rounds={} accounts={}",
        args.connections, args.seconds, args.slice, args.rounds, args.accounts
    );
    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        let database =
            ScratchDatabase::create(&args.services.database_url, "payonce_bench").await?;
        let measured = run_round(&args, database.url(), round).await;
        database.drop().await?;
        let measured = measured?;
        println!(
            "round {round}: withdrawals {:.0}/s (p50 {:.1} ms, p99 {:.1} ms); pairs {:.0}/s (p50 {:.1} ms, p99 {:.1} ms); ratio {:.2}",
            measured.withdrawals.per_sec,
            measured.withdrawals.p50_ms,
            measured.withdrawals.p99_ms,
            measured.pairs.per_sec,
            measured.pairs.p50_ms,
            measured.pairs.p99_ms,
            measured.pairs.per_sec / measured.withdrawals.per_sec
        );
        if let (Some(withdrawal), Some(pair)) = (measured.withdrawals.cpu, measured.pairs.cpu) {
            println!(
                "  CPU per withdrawal {} · per pair {} · ratio by CPU {:.2}",
                cpu_text(&withdrawal),
                cpu_text(&pair),
                withdrawal.total() / pair.total()
            );
        }
        println!(
            "  group commit: withdrawals {} · pairs {}",
            measured.withdrawals.batches, measured.pairs.batches
        );
        rounds.push(measured);
    }
    let median = |pick: fn(&Round) -> f64| http::median(&rounds, pick);
    println!("summary (medians over {} rounds):", args.rounds);
    println!(
        "  withdrawals               {:>7.0}/s   p50 {:.1} ms   p99 {:.1} ms",
        median(|r| r.withdrawals.per_sec),
        median(|r| r.withdrawals.p50_ms),
        median(|r| r.withdrawals.p99_ms)
    );
    println!(
        "  hold-then-capture pairs   {:>7.0}/s   p50 {:.1} ms   p99 {:.1} ms",
        median(|r| r.pairs.per_sec),
        median(|r| r.pairs.p50_ms),
        median(|r| r.pairs.p99_ms)
    );
    println!(
        "  ratio pairs/withdrawals   {:.2} (median of the rounds' ratios; target >= 0.45)",
        median(|r| r.pairs.per_sec / r.withdrawals.per_sec)
    );
    // Medians of each part, over the rounds whose CPU `/proc` told.
    let (withdrawal_cpus, pair_cpus): (Vec<http::CpuTaken>, Vec<http::CpuTaken>) = rounds
        .iter()
        .filter_map(|r| r.withdrawals.cpu.zip(r.pairs.cpu))
        .unzip();
    if !withdrawal_cpus.is_empty() {
        for (name, cpus) in [("withdrawal", &withdrawal_cpus), ("pair", &pair_cpus)] {
            println!(
                "  CPU per {name:<17} PostgreSQL {:.0} µs   Redis {:.0} µs   payonce and its clients {:.0} µs",
                http::median(cpus, |c| c.postgres),
                http::median(cpus, |c| c.redis),
                http::median(cpus, |c| c.this)
            );
        }
        let by_cpu: Vec<f64> = withdrawal_cpus
            .iter()
            .zip(&pair_cpus)
            .map(|(withdrawal, pair)| withdrawal.total() / pair.total())
            .collect();
        println!(
            "  ratio by CPU              {:.2} (a withdrawal's CPU over a pair's: the ratio of the rates where the cores are the limit)",
            http::median(&by_cpu, |ratio| *ratio)
        );
    }
    Ok(())
}

/// One operation's CPU, where it was taken.
fn cpu_text(cpu: &http::CpuTaken) -> String {
    format!(
        "PostgreSQL {:.0} µs, Redis {:.0} µs, payonce and its clients {:.0} µs",
        cpu.postgres, cpu.redis, cpu.this
    )
}

/// One round on a fresh database: both sides on one server, in the round's order.
async fn run_round(args: &Args, url: &str, round: usize) -> Result<Round, BoxError> {
    let namespace = format!("bench-{}", Uuid::new_v4().simple());
    let server = http::Server::start(args.services.config(
        url,
        &namespace,
        &[
            "--db-max-connections",
            "32",
            "--spends-per-second",
            "1000000",
        ],
    ))
    .await?;
    let accounts = http::open_accounts(&server.address, args.accounts).await?;
    // Far more than either side can spend in its seconds here; running out fails the round.
    let per_account = ((args.seconds + args.warmup) as usize * 30_000).div_ceil(args.accounts);
    let raw = PgPoolOptions::new().max_connections(2).connect(url).await?;
    let spenders = issue(&raw, &accounts, per_account).await?;
    // What the fixture filled, and only that: analyzed empty, `holds` would be planned as a
    // table of no rows — every statement on it a scan of the whole table, with the plans
    // cached for the round — where a table never analyzed is planned on an estimate.
    sqlx::query("VACUUM ANALYZE accounts, tickets, entries")
        .execute(&raw)
        .await?;
    let spenders = Arc::new(spenders);
    // One client for the round: its connections stay open from one slice to the next.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections)
        .build()?;
    // Both works once, unmeasured, then every table they write vacuumed and analyzed: the
    // measured seconds see a ledger that has history, as a server that has run a while
    // does — its connections open, their pages of shared memory mapped, its plans made on
    // tables that are not empty — rather than the first minutes of a fresh database, where
    // the autovacuum analyzes `holds` and `entries` again and again as they grow from
    // nothing and every connection plans its statement anew after each analysis.
    if args.warmup > 0 {
        for work in [Work::Pairs, Work::Withdrawals] {
            let warmup = Duration::from_secs(args.warmup);
            measure(&client, &server.address, &spenders, work, args, warmup).await?;
        }
        sqlx::query("VACUUM ANALYZE accounts, tickets, entries, holds")
            .execute(&raw)
            .await?;
    }
    raw.close().await;

    let order = if round % 2 == 1 {
        [Work::Pairs, Work::Withdrawals]
    } else {
        [Work::Withdrawals, Work::Pairs]
    };
    // Slices of `--slice` seconds (at least a tenth of one), the last one what is left.
    let total = Duration::from_secs(args.seconds);
    let slice = Duration::from_secs_f64(args.slice.max(0.1));
    let mut withdrawals = Tally::new()?;
    let mut pairs = Tally::new()?;
    let mut sent = Duration::ZERO;
    while sent < total {
        let slice = slice.min(total - sent);
        sent += slice;
        for work in order {
            let before = server.batches();
            let measured = measure(&client, &server.address, &spenders, work, args, slice).await?;
            let tally = match work {
                Work::Withdrawals => &mut withdrawals,
                Work::Pairs => &mut pairs,
            };
            tally.add(measured, &before, &server.batches())?;
        }
    }
    server.stop().await?;
    Ok(Round {
        withdrawals: withdrawals.measured(),
        pairs: pairs.measured(),
    })
}

/// One work's slices of a round, added up.
struct Tally {
    seconds: f64,
    latencies: Histogram<u64>,
    /// The CPU the slices took, in microseconds, where `/proc` told it for every one.
    cpu: Option<http::CpuTaken>,
    /// How many batches of each size the slices sent.
    batches: Vec<(usize, u64)>,
}

impl Tally {
    fn new() -> Result<Self, BoxError> {
        Ok(Self {
            seconds: 0.0,
            latencies: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            cpu: Some(http::CpuTaken::default()),
            batches: Vec::new(),
        })
    }

    /// Adds a slice, with the batch counts read before and after it.
    fn add(
        &mut self,
        slice: Slice,
        before: &[(usize, u64)],
        after: &[(usize, u64)],
    ) -> Result<(), BoxError> {
        self.seconds += slice.seconds;
        self.latencies.add(&slice.latencies)?;
        self.cpu = self.cpu.zip(slice.cpu).map(|(sum, cpu)| sum + cpu);
        for (size, count) in batches::sent_between(before, after) {
            match self.batches.iter_mut().find(|(seen, _)| *seen == size) {
                Some((_, sum)) => *sum += count,
                None => self.batches.push((size, count)),
            }
        }
        Ok(())
    }

    fn measured(&self) -> Measured {
        let operations = self.latencies.len() as f64;
        Measured {
            per_sec: operations / self.seconds,
            p50_ms: self.latencies.value_at_quantile(0.5) as f64 / 1000.0,
            p99_ms: self.latencies.value_at_quantile(0.99) as f64 / 1000.0,
            cpu: self.cpu.map(|cpu| cpu.per(operations)),
            batches: batches::summary(&[], &self.batches),
        }
    }
}

/// One slice of one work: each completion's latency, the seconds until the last client
/// was done, and the CPU taken meanwhile (in microseconds).
struct Slice {
    latencies: Histogram<u64>,
    seconds: f64,
    cpu: Option<http::CpuTaken>,
}

/// `per_account` tickets for each account, inserted straight into the ledger's table.
async fn issue(
    raw: &sqlx::PgPool,
    accounts: &[(Uuid, String)],
    per_account: usize,
) -> Result<Vec<std::sync::Mutex<Spender>>, BoxError> {
    let mut spenders = Vec::with_capacity(accounts.len());
    for (account, key) in accounts {
        let tickets: Vec<Uuid> = (0..per_account).map(|_| Uuid::new_v4()).collect();
        sqlx::query(
            "INSERT INTO tickets (id, account_id, created_at, expires_at)
             SELECT id, $2, now(), now() + interval '1 day' FROM UNNEST($1::uuid[]) AS t (id)",
        )
        .bind(&tickets)
        .bind(account)
        .execute(raw)
        .await?;
        spenders.push(std::sync::Mutex::new(Spender {
            account: *account,
            key: key.clone(),
            tickets,
        }));
    }
    Ok(spenders)
}

/// `count` unused tickets of the next account in turn, with the account.
fn take(
    spenders: &[std::sync::Mutex<Spender>],
    turn: &AtomicUsize,
    count: usize,
) -> Result<(Uuid, String, Vec<Uuid>), BoxError> {
    let index = turn.fetch_add(1, Ordering::Relaxed) % spenders.len();
    let mut spender = spenders[index]
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if spender.tickets.len() < count {
        return Err("the tickets ran out: raise the fixture".into());
    }
    let at = spender.tickets.len() - count;
    let tickets = spender.tickets.split_off(at);
    Ok((spender.account, spender.key.clone(), tickets))
}

/// `work` sent by `args.connections` clients for `duration`: each completion's latency,
/// the time until the last client was done, and the CPU taken meanwhile.
async fn measure(
    client: &reqwest::Client,
    address: &str,
    spenders: &Arc<Vec<std::sync::Mutex<Spender>>>,
    work: Work,
    args: &Args,
    duration: Duration,
) -> Result<Slice, BoxError> {
    let turn = Arc::new(AtomicUsize::new(0));
    let cpu_before = http::CpuTaken::now();
    let started = Instant::now();
    let deadline = started + duration;
    let clients = (0..args.connections).map(|_| {
        let (client, spenders, turn) = (client.clone(), spenders.clone(), turn.clone());
        let address = address.to_owned();
        tokio::spawn(async move {
            let mut latencies = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            while Instant::now() < deadline {
                let sent = Instant::now();
                match work {
                    Work::Withdrawals => {
                        let (account, key, tickets) = take(&spenders, &turn, 1)?;
                        let url = format!("{address}/v1/accounts/{account}/withdrawals");
                        expect(&client, &url, &key, tickets[0], json!({"amount": 1}), 201).await?;
                    }
                    Work::Pairs => {
                        let (account, key, tickets) = take(&spenders, &turn, 2)?;
                        let url = format!("{address}/v1/accounts/{account}/holds");
                        let body = json!({"amount": 1, "expires_in": 3600});
                        let placed = expect(&client, &url, &key, tickets[0], body, 201).await?;
                        let hold = placed["hold_id"].as_str().ok_or("no hold id")?;
                        let url = format!("{address}/v1/holds/{hold}/capture");
                        expect(&client, &url, &key, tickets[1], json!({}), 200).await?;
                    }
                }
                latencies.record(u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX))?;
            }
            Ok::<_, BoxError>(latencies)
        })
    });
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for finished in futures::future::join_all(clients).await {
        all.add(finished??)?;
    }
    Ok(Slice {
        seconds: started.elapsed().as_secs_f64(),
        cpu: http::CpuTaken::now()
            .zip(cpu_before)
            .map(|(after, before)| after.since(before)),
        latencies: all,
    })
}

/// POSTs `body` to `url` with `key` and `ticket`; its body, if the answer is `status`.
async fn expect(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    ticket: Uuid,
    body: Value,
    status: u16,
) -> Result<Value, BoxError> {
    let response = client
        .post(url)
        .bearer_auth(key)
        .header("idempotency-key", ticket.to_string())
        .json(&body)
        .send()
        .await?;
    let answered = response.status().as_u16();
    let body: Value = response.json().await?;
    if answered != status {
        return Err(format!("{url} answered {answered}, not {status}: {body}").into());
    }
    Ok(body)
}
