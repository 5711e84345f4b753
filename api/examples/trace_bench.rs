//! What exporting traces costs: HTTP withdrawals/s through a payonce instance that exports
//! every span over OTLP/HTTP, beside one that exports nothing, measured in alternating
//! rounds (the target: at most 10% slower).
//!
//! ```text
//! cargo build --release -p api --features otlp && cargo run --release -p api --example trace_bench -- --seconds 10 --rounds 5
//! ```
//!
//! Each round makes a fresh database and starts two `payonce` processes (the release
//! binary beside this example) in the distributed mode on it — one with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at an OTLP receiver in this process; one
//! without — opens 1,000
//! accounts, issues tickets in bulk, and runs `wrk` (withdrawals of 1, each with its own
//! ticket) against one, then the other: the exporting one first in odd rounds, second in
//! even ones. It prints each round's rates and ratio, the medians, and what the receiver
//! was sent. The receiver reads every export and decodes one in a hundred (a collector
//! runs elsewhere; here it shares the two cores, and decoding every span would bill its
//! work to payonce). Needs `wrk`, PostgreSQL and Redis (`scripts/services.sh`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use clap::Parser;
use ledger::testing::ScratchDatabase;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

#[path = "../bench/http.rs"]
mod http;

#[derive(Parser, Debug)]
struct Args {
    /// wrk connections.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Rounds; the summary gives medians.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Accounts the withdrawals spread over.
    #[arg(long, default_value_t = 1000)]
    accounts: usize,
    #[command(flatten)]
    services: http::Services,
}

use http::BoxError;

/// A `payonce` child process, killed on drop.
struct Instance {
    child: std::process::Child,
    address: String,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The release `payonce` beside this example (`target/release/examples/..`).
fn payonce_binary() -> Result<std::path::PathBuf, BoxError> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(std::path::Path::parent)
        .ok_or("no target directory")?;
    let binary = dir.join("payonce");
    if !binary.exists() {
        return Err(format!(
            "{} is missing: cargo build --release -p api --features otlp",
            binary.display()
        )
        .into());
    }
    Ok(binary)
}

async fn start(
    args: &Args,
    database: &str,
    namespace: &str,
    otlp: Option<&str>,
) -> Result<Instance, BoxError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut command = std::process::Command::new(payonce_binary()?);
    command
        .env("PAYONCE_ADDR", format!("127.0.0.1:{port}"))
        .env("DATABASE_URL", database)
        .env("REDIS_URL", &args.services.redis_url)
        .env("PAYONCE_REDIS_NAMESPACE", namespace)
        .env("PAYONCE_DB_MAX_CONNECTIONS", "32")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if let Some(endpoint) = otlp {
        command.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
    }
    let instance = Instance {
        child: command.spawn()?,
        address: format!("http://127.0.0.1:{port}"),
    };
    let client = reqwest::Client::new();
    for _ in 0..300 {
        if client
            .get(format!("{}/readyz", instance.address))
            .send()
            .await
            .is_ok_and(|response| response.status().is_success())
        {
            return Ok(instance);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("payonce did not become ready".into())
}

/// What the receiver was sent: exports, and the spans of those it decoded.
#[derive(Default)]
struct Received {
    exports: AtomicU64,
    decoded_exports: AtomicU64,
    decoded_spans: AtomicU64,
}

/// An OTLP/HTTP receiver: reads every export, decodes one in a hundred.
async fn receiver() -> Result<(String, Arc<Received>), BoxError> {
    let received = Arc::new(Received::default());
    let counted = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let counted = counted.clone();
            async move {
                let seen = counted.exports.fetch_add(1, Ordering::Relaxed);
                if seen % 100 == 0
                    && let Ok(export) = ExportTraceServiceRequest::decode(body)
                {
                    let spans: usize = export
                        .resource_spans
                        .iter()
                        .flat_map(|resource| &resource.scope_spans)
                        .map(|scope| scope.spans.len())
                        .sum();
                    counted.decoded_exports.fetch_add(1, Ordering::Relaxed);
                    counted
                        .decoded_spans
                        .fetch_add(spans as u64, Ordering::Relaxed);
                }
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((format!("http://{address}"), received))
}

struct Round {
    off: f64,
    on: f64,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    println!(
        "trace bench: connections={} seconds={} rounds={} accounts={}",
        args.connections, args.seconds, args.rounds, args.accounts
    );
    let (endpoint, received) = receiver().await?;
    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        let database =
            ScratchDatabase::create(&args.services.database_url, "payonce_bench").await?;
        let measured = run_round(&args, database.url(), round, &endpoint).await;
        database.drop().await?;
        let measured = measured?;
        println!(
            "round {round}: tracing off {:>6.0} withdrawals/s, exported {:>6.0}/s, ratio {:.3}",
            measured.off,
            measured.on,
            measured.on / measured.off
        );
        rounds.push(measured);
    }
    let median = |pick: &dyn Fn(&Round) -> f64| http::median(&rounds, pick);
    println!("summary (medians over {} rounds):", args.rounds);
    println!(
        "  tracing off      {:>7.0} withdrawals/s",
        median(&|r| r.off)
    );
    println!(
        "  traces exported  {:>7.0} withdrawals/s",
        median(&|r| r.on)
    );
    println!(
        "  exported / off   {:.3} (median of the rounds' ratios; target >= 0.90)",
        median(&|r| r.on / r.off)
    );
    let exports = received.exports.load(Ordering::Relaxed);
    let decoded = received.decoded_exports.load(Ordering::Relaxed).max(1);
    println!(
        "  the receiver was sent {exports} exports, about {:.0} spans each (from the {decoded} it decoded)",
        received.decoded_spans.load(Ordering::Relaxed) as f64 / decoded as f64
    );
    Ok(())
}

async fn run_round(
    args: &Args,
    database: &str,
    round: usize,
    endpoint: &str,
) -> Result<Round, BoxError> {
    let namespace = format!("bench-{}", Uuid::new_v4().simple());
    let off = start(args, database, &namespace, None).await?;
    let on = start(args, database, &namespace, Some(endpoint)).await?;
    let accounts = http::open_accounts(&off.address, args.accounts).await?;
    http::know_keys(&on.address, &accounts).await?;
    let raw = PgPoolOptions::new()
        .max_connections(2)
        .connect(database)
        .await?;
    let per_run = (args.seconds as usize) * 10_000;
    let tickets = http::issue_tickets(&raw, &accounts, 2 * per_run).await?;
    sqlx::query("VACUUM ANALYZE").execute(&raw).await?;
    raw.close().await;
    let (first, second) = tickets.split_at(per_run);
    let measure = |instance: &Instance, tickets| {
        http::wrk(
            &instance.address,
            tickets,
            args.connections,
            args.seconds,
            false,
        )
        .map(|measured| measured.per_sec)
    };
    let (off_rate, on_rate) = if round % 2 == 1 {
        let on_rate = measure(&on, first)?;
        (measure(&off, second)?, on_rate)
    } else {
        let off_rate = measure(&off, first)?;
        (off_rate, measure(&on, second)?)
    };
    Ok(Round {
        off: off_rate,
        on: on_rate,
    })
}
