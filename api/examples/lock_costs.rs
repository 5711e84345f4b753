//! The cost of each lock service, measured in one run on this machine: the table beside the
//! lock services × faults matrix (`scripts/costs.sh` runs this).
//!
//! ```text
//! cargo run --release -p api --features demo,all-locks --example lock_costs -- --seconds 5 --rounds 3
//! ```
//!
//! For each service — Redis, Redlock (three private `redis-server`s; with the `demo`
//! feature), ZooKeeper, etcd, memcached, the MariaDB lock table and row locks, PostgreSQL
//! advisory locks, Hazelcast's FencedLock — each round measures:
//! - uncontended acquire+release pairs/s: 32 clients on 10,000 keys, no hold; the acquire
//!   p50/p99 and the requests each pair sent to the service (counted by the client; on
//!   Redlock, by its servers' SET, EVALSHA and EVAL calls);
//! - hot-key hand-offs/s: 32 clients on one key, each holding it 1 ms, beside the serial
//!   limit 1 / (hold + one loopback round trip, the median Redis PING), and the requests
//!   per hand-off;
//! - HTTP withdrawals/s through one in-process payonce locking with that service (fenced;
//!   a fresh database; 1,000 accounts; `wrk`, 32 connections), and their p99. Redlock has
//!   none: it hands out no fencing token, so payonce's safe path cannot run on it.
//!
//! Services run in one order in odd rounds and the reverse in even ones (the machine's
//! speed drifts within a minute); the summary gives medians. It prints the table, writes
//! `{"services": [...]}` JSON and an SVG chart. Needs the services of
//! `scripts/services.sh`, `wrk` and `redis-server`.

use std::time::Duration;

use clap::Parser;
use ledger::testing::ScratchDatabase;
use serde::Serialize;
use tokio::time::Instant;
use uuid::Uuid;

#[path = "../bench/http.rs"]
mod http;
#[path = "../../lock/bench/measure.rs"]
mod measure;
use measure::{BoxError, Load, Run, Urls, median};

#[derive(Parser, Debug)]
struct Args {
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Rounds; the summary gives medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Lock clients, and wrk connections.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// How long a hot-key holder keeps the lock, ms.
    #[arg(long, default_value_t = 1.0)]
    hold_ms: f64,
    /// Only these services, comma-separated (default: all in this build).
    #[arg(long, value_delimiter = ',')]
    services: Vec<String>,
    /// Write the summary as JSON.
    #[arg(long, default_value = "target/costs/costs.json")]
    json: std::path::PathBuf,
    /// Draw the summary (SVG).
    #[arg(long, default_value = "target/costs/costs.svg")]
    chart: std::path::PathBuf,
    #[command(flatten)]
    urls: Urls,
}

/// Every service this build can measure, in the table's order.
fn all_services() -> Vec<&'static str> {
    let mut services = vec!["redis"];
    if cfg!(feature = "demo") {
        services.push("redlock");
    }
    services.extend([
        "zookeeper",
        "etcd",
        "memcached",
        "mysql",
        "mysql-row",
        "postgres",
        "hazelcast",
    ]);
    services
}

/// One service's figures in one round.
struct Measured {
    pairs: Run,
    requests_per_pair: f64,
    handoffs: Run,
    requests_per_handoff: f64,
    http: Option<http::Withdrawals>,
}

/// One service's medians: a row of the table and of the JSON.
#[derive(Serialize)]
struct Summary {
    service: &'static str,
    pairs_per_sec: f64,
    acquire_p50_ms: f64,
    acquire_p99_ms: f64,
    requests_per_pair: f64,
    handoffs_per_sec: f64,
    serial_limit: f64,
    handoffs_of_serial_limit: f64,
    requests_per_handoff: f64,
    http_withdrawals_per_sec: Option<f64>,
    http_p99_ms: Option<f64>,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let services: Vec<&'static str> = if args.services.is_empty() {
        all_services()
    } else {
        let all = all_services();
        args.services
            .iter()
            .map(|name| {
                all.iter()
                    .copied()
                    .find(|known| known == name)
                    .ok_or_else(|| format!("no service {name} in this build; known: {all:?}"))
            })
            .collect::<Result<_, _>>()?
    };
    println!(
        "lock costs: services={services:?} clients={} seconds={} rounds={} hold={}ms",
        args.clients, args.seconds, args.rounds, args.hold_ms
    );
    let urls = &args.urls;
    // Its three servers only when Redlock is measured.
    let redlock = if services.contains(&"redlock") {
        Some(Redlock::start()?)
    } else {
        None
    };
    let mut measured: Vec<Vec<Measured>> = services.iter().map(|_| Vec::new()).collect();
    let mut round_trips = Vec::new();
    for round in 1..=args.rounds {
        let rtt_us = median_ping_us(&args.urls.redis).await?;
        round_trips.push(rtt_us);
        let mut order: Vec<usize> = (0..services.len()).collect();
        if round % 2 == 0 {
            order.reverse();
        }
        for index in order {
            let service = services[index];
            let figures = measure_service(service, &args, urls, redlock.as_ref()).await?;
            println!(
                "round {round}: {service:<9} {:>7.0} pairs/s (p50 {:.3} ms, p99 {:.3} ms, {:.2} requests), {:>5.0} hand-offs/s ({:.2} requests), HTTP {}",
                figures.pairs.pairs_per_sec,
                figures.pairs.p50_us as f64 / 1000.0,
                figures.pairs.p99_us as f64 / 1000.0,
                figures.requests_per_pair,
                figures.handoffs.pairs_per_sec,
                figures.requests_per_handoff,
                figures
                    .http
                    .as_ref()
                    .map_or("n/a".to_owned(), |http| format!(
                        "{:.0} withdrawals/s (p99 {:.1} ms)",
                        http.per_sec, http.p99_ms
                    )),
            );
            measured[index].push(figures);
        }
    }
    let rtt_us = median(round_trips);
    let serial_limit = 1e6 / (args.hold_ms * 1000.0 + rtt_us);
    let summaries: Vec<Summary> = services
        .iter()
        .zip(&measured)
        .map(|(service, runs)| {
            let pick = |value: fn(&Measured) -> f64| median(runs.iter().map(value).collect());
            let http: Vec<&http::Withdrawals> =
                runs.iter().filter_map(|run| run.http.as_ref()).collect();
            let handoffs = pick(|run| run.handoffs.pairs_per_sec);
            Summary {
                service,
                pairs_per_sec: pick(|run| run.pairs.pairs_per_sec),
                acquire_p50_ms: pick(|run| run.pairs.p50_us as f64) / 1000.0,
                acquire_p99_ms: pick(|run| run.pairs.p99_us as f64) / 1000.0,
                requests_per_pair: pick(|run| run.requests_per_pair),
                handoffs_per_sec: handoffs,
                serial_limit,
                handoffs_of_serial_limit: handoffs / serial_limit,
                requests_per_handoff: pick(|run| run.requests_per_handoff),
                http_withdrawals_per_sec: (!http.is_empty())
                    .then(|| median(http.iter().map(|run| run.per_sec).collect())),
                http_p99_ms: (!http.is_empty())
                    .then(|| median(http.iter().map(|run| run.p99_ms).collect())),
            }
        })
        .collect();
    print_table(&summaries, args.rounds, args.hold_ms, rtt_us);
    if let Some(parent) = args.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(
        &args.json,
        serde_json::to_vec_pretty(&serde_json::json!({ "services": summaries }))?,
    )?;
    println!("json: {}", args.json.display());
    draw_chart(&summaries, &args.chart).map_err(|error| error.to_string())?;
    println!("chart: {}", args.chart.display());
    Ok(())
}

fn print_table(summaries: &[Summary], rounds: usize, hold_ms: f64, rtt_us: f64) {
    println!(
        "summary (medians over {rounds} rounds; serial limit 1/({hold_ms} ms hold + {:.3} ms round trip)):",
        rtt_us / 1000.0
    );
    println!(
        "  {:<10} {:>9} {:>8} {:>8} {:>9} {:>10} {:>9} {:>10} {:>13} {:>9}",
        "service",
        "pairs/s",
        "p50 ms",
        "p99 ms",
        "req/pair",
        "hand-offs",
        "of serial",
        "req/hand",
        "HTTP withdr/s",
        "HTTP p99"
    );
    for row in summaries {
        println!(
            "  {:<10} {:>9.0} {:>8.3} {:>8.3} {:>9.2} {:>10.0} {:>9.2} {:>10.2} {:>13} {:>9}",
            row.service,
            row.pairs_per_sec,
            row.acquire_p50_ms,
            row.acquire_p99_ms,
            row.requests_per_pair,
            row.handoffs_per_sec,
            row.handoffs_of_serial_limit,
            row.requests_per_handoff,
            row.http_withdrawals_per_sec
                .map_or("n/a".to_owned(), |rate| format!("{rate:.0}")),
            row.http_p99_ms
                .map_or("n/a".to_owned(), |p99| format!("{p99:.1} ms")),
        );
    }
}

async fn measure_service(
    service: &'static str,
    args: &Args,
    urls: &Urls,
    redlock: Option<&Redlock>,
) -> Result<Measured, BoxError> {
    let uncontended = Load {
        clients: args.clients,
        keys: 10_000,
        hold: Duration::ZERO,
        seconds: args.seconds as f64,
    };
    let hot = Load {
        keys: 1,
        hold: Duration::from_secs_f64(args.hold_ms / 1000.0),
        ..uncontended
    };
    if let (true, Some(redlock)) = (service == "redlock", redlock) {
        let (pairs, requests_per_pair) = redlock.measure(uncontended).await?;
        let (handoffs, requests_per_handoff) = redlock.measure(hot).await?;
        return Ok(Measured {
            pairs,
            requests_per_pair,
            handoffs,
            requests_per_handoff,
            http: None,
        });
    }
    let counted = measure::counted(service, urls)?;
    counted.locks.ping().await?;
    let counted_run = async |load: Load| -> Result<(Run, f64), BoxError> {
        let before = (counted.requests)();
        let run = measure::measure(&counted.locks, load).await?;
        let pairs = run.pairs as f64;
        Ok((run, ((counted.requests)() - before) as f64 / pairs.max(1.0)))
    };
    let (pairs, requests_per_pair) = counted_run(uncontended).await?;
    let (handoffs, requests_per_handoff) = counted_run(hot).await?;
    drop(counted);
    let http = http_withdrawals(service, args, urls).await?;
    Ok(Measured {
        pairs,
        requests_per_pair,
        handoffs,
        requests_per_handoff,
        http: Some(http),
    })
}

/// HTTP withdrawals through one payonce locking with `service`, on a fresh database.
async fn http_withdrawals(
    service: &str,
    args: &Args,
    urls: &Urls,
) -> Result<http::Withdrawals, BoxError> {
    let run = Uuid::new_v4().simple().to_string();
    let lock_url = match service {
        "redis" => urls.redis.clone(),
        "zookeeper" => format!("{}/payonce-costs-{run}", urls.zookeeper),
        "etcd" => format!("{}/payonce-costs-{run}", urls.etcd),
        "memcached" => urls.memcached.clone(),
        "mysql" => urls.mysql.clone(),
        "mysql-row" => urls.mysql.replacen("mysql://", "mysql-row://", 1),
        "postgres" => urls.postgres.clone(),
        "hazelcast" => urls.hazelcast.clone(),
        other => return Err(format!("no HTTP run for {other}").into()),
    };
    let database = ScratchDatabase::create(&args.urls.postgres, "payonce_costs").await?;
    let url = database.url();
    let measured = async {
        let mut config = http::config(&[
            "--database-url",
            url,
            "--redis-namespace",
            &format!("costs-{run}"),
            "--db-max-connections",
            "32",
        ]);
        // The service under measurement, whatever REDIS_URL this process was given.
        config.redis_url = None;
        config.lock_url = Some(lock_url);
        let server = http::Server::start(config).await?;
        let accounts = http::open_accounts(&server.address, 1000).await?;
        let raw = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(url)
            .await?;
        let tickets = http::issue_tickets(&raw, &accounts, (args.seconds as usize) * 6_000).await?;
        sqlx::query("VACUUM ANALYZE").execute(&raw).await?;
        raw.close().await;
        let measured = http::wrk(&server.address, &tickets, args.clients, args.seconds, false);
        server.stop().await?;
        measured
    }
    .await;
    database.drop().await?;
    measured
}

/// Redlock over three private `redis-server`s (with the `demo` feature; otherwise never
/// measured), its requests counted by the servers.
struct Redlock {
    #[cfg(feature = "demo")]
    nodes: Vec<lock::testing::RedisServer>,
    #[cfg(feature = "demo")]
    redlock: std::sync::Arc<lock::Redlock>,
}

impl Redlock {
    #[cfg(feature = "demo")]
    fn start() -> Result<Self, BoxError> {
        let nodes: Vec<_> = (0..3)
            .map(|_| lock::testing::RedisServer::start())
            .collect::<Result<_, _>>()?;
        let urls: Vec<String> = nodes.iter().map(|node| node.url()).collect();
        let redlock = std::sync::Arc::new(lock::Redlock::open(&urls, "costs")?);
        Ok(Self { nodes, redlock })
    }

    #[cfg(not(feature = "demo"))]
    fn start() -> Result<Self, BoxError> {
        Ok(Self {})
    }

    #[cfg(feature = "demo")]
    async fn measure(&self, load: Load) -> Result<(Run, f64), BoxError> {
        let before = self.commands().await?;
        let (acquiring, releasing) = (self.redlock.clone(), self.redlock.clone());
        let run = measure::pairs(
            load,
            move |key| {
                let redlock = acquiring.clone();
                async move {
                    let (ttl, deadline) = measure::patient();
                    Ok(redlock.acquire(&key, ttl, deadline).await?)
                }
            },
            move |guard| {
                let redlock = releasing.clone();
                async move {
                    redlock.release(&guard).await;
                    Ok(())
                }
            },
        )
        .await?;
        let commands = self.commands().await?.saturating_sub(before);
        let pairs = run.pairs as f64;
        Ok((run, commands as f64 / pairs.max(1.0)))
    }

    #[cfg(not(feature = "demo"))]
    async fn measure(&self, _load: Load) -> Result<(Run, f64), BoxError> {
        Err("Redlock needs the demo feature".into())
    }

    /// Requests the nodes have been sent, summed: the calls of SET (grants) and of
    /// EVALSHA and EVAL (releases) in `INFO commandstats` — not the commands the release
    /// script runs inside the server, which the other services' counts do not include
    /// either.
    #[cfg(feature = "demo")]
    async fn commands(&self) -> Result<u64, BoxError> {
        let mut total = 0;
        for node in &self.nodes {
            total += measure::command_calls(&node.url(), &["set", "evalsha", "eval"]).await?;
        }
        Ok(total)
    }
}

/// The median of 1,000 sequential PINGs to Redis: one loopback round trip.
async fn median_ping_us(url: &str) -> Result<f64, BoxError> {
    let mut connection = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut samples = Vec::with_capacity(1000);
    for _ in 0..1000 {
        let sent = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut connection).await?;
        samples.push(sent.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(samples))
}

/// Three bar panels — pairs/s, hand-offs/s (with the serial limit), HTTP withdrawals/s —
/// one bar per service.
fn draw_chart(
    summaries: &[Summary],
    path: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    type Pick = fn(&Summary) -> Option<f64>;
    let panels: [(&str, Pick); 3] = [
        ("uncontended acquire+release pairs/s (32 clients)", |row| {
            Some(row.pairs_per_sec)
        }),
        ("hot-key hand-offs/s (32 waiters, 1 ms hold)", |row| {
            Some(row.handoffs_per_sec)
        }),
        ("HTTP withdrawals/s through payonce (fenced)", |row| {
            row.http_withdrawals_per_sec
        }),
    ];
    let (left, bar_h, bar_w, panel_gap) = (110_i32, 20_i32, 420_i32, 40_i32);
    let panel_h = bar_h * summaries.len() as i32 + 30;
    let height = 50 + (panel_h + panel_gap) * panels.len() as i32;
    let root = SVGBackend::new(path, (640, height as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    root.draw(&Text::new(
        "What each lock service costs (medians, one run, one machine)",
        (10, 10),
        ("sans-serif", 18).into_font(),
    ))?;
    let font = ("sans-serif", 13).into_font();
    for (index, (title, pick)) in panels.iter().enumerate() {
        let top = 45 + index as i32 * (panel_h + panel_gap);
        root.draw(&Text::new(*title, (10, top), font.clone()))?;
        let serial = summaries.first().map_or(0.0, |row| row.serial_limit);
        let mut max = summaries
            .iter()
            .filter_map(pick)
            .fold(f64::MIN_POSITIVE, f64::max);
        if index == 1 {
            max = max.max(serial);
        }
        for (line, row) in summaries.iter().enumerate() {
            let y = top + 22 + line as i32 * bar_h;
            root.draw(&Text::new(row.service, (10, y + 2), font.clone()))?;
            let (width, label) = match pick(row) {
                Some(value) => (
                    ((value / max) * f64::from(bar_w)) as i32,
                    format!("{value:.0}"),
                ),
                None => (0, "n/a".to_owned()),
            };
            root.draw(&Rectangle::new(
                [(left, y), (left + width.max(1), y + bar_h - 4)],
                RGBColor(70, 120, 180).filled(),
            ))?;
            root.draw(&Text::new(label, (left + width + 6, y + 2), font.clone()))?;
        }
        if index == 1 {
            let x = left + ((serial / max) * f64::from(bar_w)) as i32;
            root.draw(&PathElement::new(
                vec![(x, top + 18), (x, top + panel_h - 6)],
                RED.stroke_width(2),
            ))?;
            root.draw(&Text::new(
                format!("serial limit {serial:.0}"),
                (x - 60, top + panel_h - 4),
                font.clone().color(&RED),
            ))?;
        }
    }
    root.present()?;
    Ok(())
}
