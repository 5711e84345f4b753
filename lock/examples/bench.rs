//! Lock throughput and latency, printed beside the baselines measured in the same run.
//!
//! ```text
//! cargo run --release -p lock --example bench -- --clients 32 --keys 10000 --hold-ms 0 --seconds 10
//! cargo run --release -p lock --example bench -- --clients 32 --keys 1 --hold-ms 1 --seconds 10
//! ```
//!
//! Each of C tasks takes a lock on a random one of K keys, holds it H ms, releases it, and
//! starts over, for S seconds. Baselines, each run in every round:
//! - many keys: the textbook limit — `redis-benchmark` at C connections running
//!   `SET k v NX PX 30000` and then `EVALSHA` of the plain compare-and-delete script (`if
//!   GET == token then DEL`), combined as one pair (1 / (1/set + 1/release)); the same with
//!   `EVAL` of payonce's own release script (larger, and sent whole each time — a figure
//!   that flatters the ratio, kept for comparison with earlier runs); and redis-py's
//!   asyncio `Lock` (`bench/redis_py_lock.py`, if `python3 -c 'import redis'` works);
//! - one key: the serial limit 1 / (hold + one round trip), the round trip being the median
//!   of sequential PINGs.
//!
//! With `--backend redis-cluster` (the cluster `scripts/services.sh` runs), `zookeeper`,
//! `etcd`, `postgres` (advisory locks), `mysql` (a lock table),
//! `mysql-row` (InnoDB row locks), `memcached` or `hazelcast` (the CP Subsystem's
//! FencedLock, on the three members `scripts/services.sh` runs), the backend runs
//! beside payonce's Redis lock in alternating order, with the same clients and keys, and
//! the summary prints both, their ratio, and the requests each sends per acquire+release
//! (counted by the client).
//!
//! The last line is `pairs/s: <median over rounds>`.

use std::process::Command;
use std::time::Duration;

use clap::Parser;
use lock::{LockOptions, LockService};
use tokio::time::Instant;

#[path = "../bench/measure.rs"]
mod measure;
use measure::{BoxError, Load, Run, Urls, counted, median};

#[derive(Parser, Debug)]
struct Args {
    /// Concurrent clients.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Distinct lock keys (1 = one hot key).
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// How long each holder keeps the lock, ms (fractions allowed).
    #[arg(long, default_value_t = 0.0)]
    hold_ms: f64,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Measurement rounds; figures are medians over rounds.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// `redis`, `redis-cluster`, `zookeeper`, `etcd`, `postgres`, `mysql`,
    /// `mysql-row`, `memcached` or `in-process` (no baselines).
    #[arg(long, default_value = "redis")]
    backend: String,
    #[command(flatten)]
    urls: Urls,
    /// Skip the baselines.
    #[arg(long)]
    no_baselines: bool,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let host_port = args
        .urls
        .redis
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let (host, port) = host_port.split_once(':').unwrap_or((&host_port, "6379"));
    println!(
        "lock bench: backend={} clients={} keys={} hold={}ms seconds={} rounds={}",
        args.backend, args.clients, args.keys, args.hold_ms, args.seconds, args.rounds
    );
    if args.backend != "redis" && args.backend != "in-process" {
        return side_by_side(&args).await;
    }
    let redis = args.backend == "redis";
    let locks = if redis {
        lock::open(&args.urls.redis, &LockOptions::default())?
    } else {
        LockService::in_process()
    };
    locks.ping().await?;
    let baselines = redis && !args.no_baselines;

    let mut ours = Vec::new();
    let mut textbook = Vec::new();
    let mut raw = Vec::new();
    let mut python = Vec::new();
    let mut rtts = Vec::new();
    let mut commands_per_pair = Vec::new();
    for round in 1..=args.rounds {
        // redis-benchmark's limits before payonce's lock in odd rounds, after it in even ones.
        let raw_round = baselines && args.keys > 1;
        let limits_now = || raw_limits(host, port, args.clients, args.keys, args.seconds);
        let mut limits = None;
        if raw_round && round % 2 == 1 {
            limits = Some(limits_now()?);
        }
        if raw_round {
            match redis_py(&args) {
                Some(rate) => {
                    println!("round {round}: redis-py asyncio Lock {rate:.0} pairs/s");
                    python.push(rate);
                }
                None => println!("round {round}: redis-py skipped (pip install redis)"),
            }
        }
        if baselines && args.keys == 1 {
            let rtt = median_ping_us(&args.urls.redis).await?;
            println!("round {round}: one round trip (median PING) {rtt:.1} µs");
            rtts.push(rtt);
        }
        let before = if redis {
            measure::command_calls(&args.urls.redis, SCRIPT_CALLS).await?
        } else {
            0
        };
        let run = measure::measure(&locks, load(&args)).await?;
        if redis {
            let pairs = run.pairs as f64;
            let calls = measure::command_calls(&args.urls.redis, SCRIPT_CALLS)
                .await?
                .saturating_sub(before);
            commands_per_pair.push(calls as f64 / pairs);
        }
        println!(
            "round {round}: payonce lock {:.0} pairs/s, acquire p50 {:.3} ms p99 {:.3} ms, mean hold {:.3} ms",
            run.pairs_per_sec,
            run.p50_us as f64 / 1000.0,
            run.p99_us as f64 / 1000.0,
            run.mean_hold_us / 1000.0
        );
        if raw_round && round % 2 == 0 {
            limits = Some(limits_now()?);
        }
        if let Some(limits) = limits {
            println!(
                "round {round}: textbook limit {:.0} pairs/s (redis-benchmark SET NX PX + EVALSHA compare-and-delete), ratio {:.2}; with payonce's release script by EVAL {:.0} pairs/s, ratio {:.2}",
                limits.textbook,
                run.pairs_per_sec / limits.textbook,
                limits.payonce_script,
                run.pairs_per_sec / limits.payonce_script
            );
            textbook.push((limits.textbook, run.pairs_per_sec / limits.textbook));
            raw.push((
                limits.payonce_script,
                run.pairs_per_sec / limits.payonce_script,
            ));
        }
        ours.push(run);
    }

    let rate = median(ours.iter().map(|run| run.pairs_per_sec).collect());
    println!("summary (medians over {} rounds):", args.rounds);
    println!(
        "  payonce lock     {rate:>9.0} pairs/s   acquire p50 {:.3} ms   p99 {:.3} ms",
        median(ours.iter().map(|run| run.p50_us as f64).collect()) / 1000.0,
        median(ours.iter().map(|run| run.p99_us as f64).collect()) / 1000.0,
    );
    if !commands_per_pair.is_empty() {
        println!(
            "  Redis commands per acquire+release (scripts called, server count): {:.2}",
            median(commands_per_pair)
        );
    }
    // Ratios are the median of each round's, the baseline measured beside it.
    let split = |pairs: Vec<(f64, f64)>| -> (f64, f64) {
        let (limits, ratios): (Vec<f64>, Vec<f64>) = pairs.into_iter().unzip();
        (median(limits), median(ratios))
    };
    if !textbook.is_empty() {
        let (limit, ratio) = split(textbook);
        println!(
            "  textbook limit   {limit:>9.0} pairs/s   ratio {ratio:.2} (target >= 0.8)   SET NX PX + EVALSHA compare-and-delete"
        );
    }
    if !raw.is_empty() {
        let (limit, ratio) = split(raw);
        println!(
            "  payonce-script limit {limit:>5.0} pairs/s   ratio {ratio:.2} (target >= 0.5)   SET NX PX + EVAL of payonce's release script (flatters the ratio)"
        );
    }
    if !python.is_empty() {
        let python = median(python);
        println!(
            "  redis-py Lock    {python:>9.0} pairs/s   ratio {:.2} (target >= 3)",
            rate / python
        );
    }
    if !rtts.is_empty() {
        let rtt_us = median(rtts);
        let serial = 1e6 / (args.hold_ms * 1000.0 + rtt_us);
        println!(
            "  serial limit     {serial:>9.0} pairs/s   1/({} ms hold + {:.3} ms round trip)   ratio {:.2} (target >= 0.8)",
            args.hold_ms,
            rtt_us / 1000.0,
            rate / serial
        );
    }
    println!("pairs/s: {rate:.0}");
    Ok(())
}

fn load(args: &Args) -> Load {
    Load {
        clients: args.clients,
        keys: args.keys,
        hold: Duration::from_secs_f64(args.hold_ms / 1000.0),
        seconds: args.seconds,
    }
}

/// `--backend redis-cluster|zookeeper|etcd|postgres|mysql|mysql-row|memcached|hazelcast`:
/// that service and payonce's Redis lock, measured
/// in alternating order each round, printed side by side.
async fn side_by_side(args: &Args) -> Result<(), BoxError> {
    let name = match args.backend.as_str() {
        "redis-cluster" => "redis-cluster",
        "zookeeper" => "zookeeper",
        "etcd" => "etcd",
        "postgres" => "postgres",
        "mysql" => "mysql",
        "mysql-row" => "mysql-row",
        "memcached" => "memcached",
        "hazelcast" => "hazelcast",
        other => return Err(format!("no backend {other:?}").into()),
    };
    let services = [counted(name, &args.urls)?, counted("redis", &args.urls)?];
    for service in &services {
        service.locks.ping().await?;
    }
    let mut runs: Vec<Vec<(Run, f64)>> = vec![Vec::new(), Vec::new()];
    for round in 1..=args.rounds {
        // Alternate which goes first: the machine's speed drifts within a minute.
        let order: [usize; 2] = if round % 2 == 1 { [0, 1] } else { [1, 0] };
        for index in order {
            let service = &services[index];
            let before = (service.requests)();
            let run = measure::measure(&service.locks, load(args)).await?;
            let pairs = run.pairs as f64;
            let requests = ((service.requests)() - before) as f64 / pairs.max(1.0);
            println!(
                "round {round}: {:<13} {:>9.0} pairs/s, acquire p50 {:.3} ms p99 {:.3} ms, {requests:.2} requests per pair",
                service.name,
                run.pairs_per_sec,
                run.p50_us as f64 / 1000.0,
                run.p99_us as f64 / 1000.0,
            );
            runs[index].push((run, requests));
        }
    }
    println!("summary (medians over {} rounds):", args.rounds);
    let mut rates = Vec::new();
    for (service, runs) in services.iter().zip(&runs) {
        let rate = median(runs.iter().map(|(run, _)| run.pairs_per_sec).collect());
        println!(
            "  {:<13} {rate:>9.0} pairs/s   acquire p50 {:.3} ms   p99 {:.3} ms   {:.2} requests per pair",
            service.name,
            median(runs.iter().map(|(run, _)| run.p50_us as f64).collect()) / 1000.0,
            median(runs.iter().map(|(run, _)| run.p99_us as f64).collect()) / 1000.0,
            median(runs.iter().map(|(_, requests)| *requests).collect()),
        );
        rates.push(rate);
    }
    // The ratio of medians of each round's ratio: robust to a drifting machine.
    let ratios: Vec<f64> = runs[0]
        .iter()
        .zip(&runs[1])
        .map(|((ours, _), (redis, _))| ours.pairs_per_sec / redis.pairs_per_sec)
        .collect();
    println!(
        "  {name} / redis: {:.2} (median of the rounds' ratios)",
        median(ratios)
    );
    println!("pairs/s: {:.0}", rates[0]);
    Ok(())
}

/// The commands payonce's lock sends Redis: its scripts, by EVALSHA (or EVAL, the first
/// time a script is not cached).
const SCRIPT_CALLS: &[&str] = &["evalsha", "eval"];

/// What `redis-benchmark` does at the same connection count, as acquire+release pairs.
struct RawLimits {
    /// SET NX PX, then EVALSHA of the plain compare-and-delete.
    textbook: f64,
    /// SET NX PX, then EVAL of payonce's release script.
    payonce_script: f64,
}

/// The plain release: delete the lock only if it holds our token.
const COMPARE_AND_DELETE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// redis-benchmark: SET NX PX, then each release, at the same connection count.
fn raw_limits(
    host: &str,
    port: &str,
    clients: usize,
    keys: u64,
    seconds: f64,
) -> Result<RawLimits, BoxError> {
    let release = format!(
        "{}\n{}",
        include_str!("../src/scripts/hand_off.lua"),
        include_str!("../src/scripts/release.lua")
    );
    // About `seconds` of work in all at the rates seen on a 2-core machine.
    let requests = ((seconds * 40_000.0) as u64).max(10_000).to_string();
    let run = |command: &[&str]| -> Result<f64, BoxError> {
        let output = Command::new("redis-benchmark")
            .args([
                "-h",
                host,
                "-p",
                port,
                "-c",
                &clients.to_string(),
                "-n",
                &requests,
            ])
            .args(["-r", &keys.to_string(), "--csv"])
            .args(command)
            .output()?;
        let csv = String::from_utf8(output.stdout)?;
        // The last line ends in rps and six latency columns; the test name before them may
        // span lines (a script's text), so count from the end.
        let rate = csv
            .lines()
            .last()
            .and_then(|line| line.split(',').rev().nth(6))
            .map(|field| field.trim_matches('"').parse::<f64>())
            .ok_or("redis-benchmark printed no result")??;
        Ok(rate)
    };
    let loaded = Command::new("redis-cli")
        .args(["-h", host, "-p", port, "SCRIPT", "LOAD", COMPARE_AND_DELETE])
        .output()?;
    let sha = String::from_utf8(loaded.stdout)?.trim().to_owned();
    if sha.len() != 40 {
        return Err(format!("redis-cli SCRIPT LOAD printed {sha:?}").into());
    }
    let set = run(&[
        "SET",
        "rawbench:lock:{__rand_int__}",
        "v",
        "NX",
        "PX",
        "30000",
    ])?;
    let plain = run(&[
        "EVALSHA",
        &sha,
        "1",
        "rawbench:lock:{__rand_int__}",
        "00000000000000000000000000000000",
    ])?;
    let ours = run(&[
        "EVAL",
        &release,
        "4",
        "rawbench:lock:{__rand_int__}",
        "rawbench:fence:{__rand_int__}",
        "rawbench:waiting:{__rand_int__}",
        "rawbench:waiter:{__rand_int__}",
        "00000000000000000000000000000000",
        "3600000",
    ])?;
    let pair = |release: f64| 1.0 / (1.0 / set + 1.0 / release);
    Ok(RawLimits {
        textbook: pair(plain),
        payonce_script: pair(ours),
    })
}

fn redis_py(args: &Args) -> Option<f64> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/redis_py_lock.py");
    let output = Command::new("python3")
        .arg(script)
        .args([
            "--url",
            &args.urls.redis,
            "--clients",
            &args.clients.to_string(),
        ])
        .args([
            "--keys",
            &args.keys.to_string(),
            "--hold-ms",
            &args.hold_ms.to_string(),
        ])
        .args(["--seconds", &args.seconds.to_string()])
        .output()
        .ok()?;
    let stdout = String::from_utf8(output.stdout).ok()?;
    stdout
        .lines()
        .last()?
        .strip_prefix("pairs/s: ")?
        .parse()
        .ok()
}

async fn median_ping_us(url: &str) -> Result<f64, BoxError> {
    let mut connection = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut samples = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let sent = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut connection).await?;
        samples.push(sent.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(samples))
}
