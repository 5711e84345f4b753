//! `payonce-bank`: serve the bank, or audit its store. Other programs start it, so its
//! command line is part of its contract (see the crate's README): it prints
//! `listening on ADDR` on stdout once it listens (`--addr 127.0.0.1:0` picks a free port),
//! and logs to stderr.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use bank::{Bank, BankOptions, DEFAULT_DATABASE_URL, FaultRates};
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "payonce-bank",
    version,
    about = "A bank for payonce to pay out through: once per idempotency key, with faults on demand."
)]
struct Cli {
    /// The store: `sqlite:path` or `postgres://…` (its own variable, not DATABASE_URL, so
    /// the bank never opens payonce's database by accident).
    #[arg(long, env = "PAYONCE_BANK_DATABASE_URL", default_value = DEFAULT_DATABASE_URL, global = true)]
    database_url: String,
    #[command(flatten)]
    serve: ServeArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Checks the store: no key executed twice, totals add up. Exit 0 clean, 1 not, 2 when
    /// the store cannot be read.
    Audit,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Where to listen (port 0: any free port; the bound address is printed).
    #[arg(long, env = "PAYONCE_BANK_ADDR", default_value = "127.0.0.1:7700")]
    addr: SocketAddr,
    /// Rate (0–1) of `fail-before`: 500, nothing done.
    #[arg(long, env = "PAYONCE_BANK_FAULT_FAIL_BEFORE", default_value_t = 0.0)]
    fault_fail_before: f64,
    /// Rate (0–1) of `commit-then-drop`: done, then the connection closes without an answer.
    #[arg(
        long,
        env = "PAYONCE_BANK_FAULT_COMMIT_THEN_DROP",
        default_value_t = 0.0
    )]
    fault_commit_then_drop: f64,
    /// Rate (0–1) of `commit-then-slow`: done, answered after --slow-for.
    #[arg(
        long,
        env = "PAYONCE_BANK_FAULT_COMMIT_THEN_SLOW",
        default_value_t = 0.0
    )]
    fault_commit_then_slow: f64,
    /// Rate (0–1) of `decline`: a new key is declined for good (422 destination-closed).
    #[arg(long, env = "PAYONCE_BANK_FAULT_DECLINE", default_value_t = 0.0)]
    fault_decline: f64,
    /// Rate (0–1) of `unavailable`: 503 with Retry-After, nothing done.
    #[arg(long, env = "PAYONCE_BANK_FAULT_UNAVAILABLE", default_value_t = 0.0)]
    fault_unavailable: f64,
    /// Rate (0–1) of `down`: connections closed and refused for --down-for.
    #[arg(long, env = "PAYONCE_BANK_FAULT_DOWN", default_value_t = 0.0)]
    fault_down: f64,
    /// How long `commit-then-slow` holds its answer.
    #[arg(long, env = "PAYONCE_BANK_SLOW_FOR", default_value = "10s", value_parser = humantime::parse_duration)]
    slow_for: Duration,
    /// How long `down` refuses connections.
    #[arg(long, env = "PAYONCE_BANK_DOWN_FOR", default_value = "2s", value_parser = humantime::parse_duration)]
    down_for: Duration,
    /// The `Retry-After` of `unavailable` and of a throttle (whole seconds, at least 1).
    #[arg(long, env = "PAYONCE_BANK_RETRY_AFTER", default_value = "1s", value_parser = humantime::parse_duration)]
    retry_after: Duration,
    /// How many transfer requests are throttled before any is taken: 429 rate-limited
    /// with Retry-After, nothing done.
    #[arg(long, env = "PAYONCE_BANK_THROTTLE_FIRST", default_value_t = 0)]
    throttle_first: u64,
    /// Seeds the fault draw, for a reproducible sequence.
    #[arg(long, env = "PAYONCE_BANK_SEED")]
    seed: Option<u64>,
    /// Heed the `Payonce-Bank-Fault: <fault>` request header (demonstrations and tests;
    /// a real bank has no such thing).
    #[arg(
        long,
        env = "PAYONCE_BANK_DEMO_HEADER",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    demo_header: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Audit) => audit(&cli.database_url).await,
        None => serve(cli.database_url, cli.serve).await,
    }
}

async fn audit(database_url: &str) -> ExitCode {
    let bank = match Bank::open_existing(database_url).await {
        Ok(bank) => bank,
        Err(error) => {
            eprintln!("audit: cannot open the store: {error}");
            return ExitCode::from(2);
        }
    };
    let report = bank.audit().await;
    bank.close().await;
    match report {
        Ok(report) if report.is_clean() => {
            println!(
                "audit: clean — {} transfers executed, {} in total",
                report.transfers, report.total
            );
            ExitCode::SUCCESS
        }
        Ok(report) => {
            for violation in &report.violations {
                println!("{violation}");
            }
            println!("audit: {} violations", report.violations.len());
            ExitCode::from(1)
        }
        Err(error) => {
            eprintln!("audit: cannot read the store: {error}");
            ExitCode::from(2)
        }
    }
}

async fn serve(database_url: String, args: ServeArgs) -> ExitCode {
    let options = BankOptions {
        database_url,
        faults: FaultRates {
            fail_before: args.fault_fail_before,
            commit_then_drop: args.fault_commit_then_drop,
            commit_then_slow: args.fault_commit_then_slow,
            decline: args.fault_decline,
            unavailable: args.fault_unavailable,
            down: args.fault_down,
        },
        seed: args.seed,
        slow_for: args.slow_for,
        down_for: args.down_for,
        retry_after: args.retry_after,
        throttle_first: args.throttle_first,
        demo_header: args.demo_header,
    };
    tracing::info!(
        database = %masked(&options.database_url),
        faults = ?options.faults,
        seed = ?options.seed,
        slow_for = ?options.slow_for,
        down_for = ?options.down_for,
        throttle_first = options.throttle_first,
        demo_header = options.demo_header,
        "starting"
    );
    let bank = match Bank::open(options).await {
        Ok(bank) => bank,
        Err(error) => {
            eprintln!("payonce-bank: {error}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.addr).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("payonce-bank: cannot listen on {}: {error}", args.addr);
            return ExitCode::from(2);
        }
    };
    let handle = match bank.serve(listener) {
        Ok(handle) => handle,
        Err(error) => {
            eprintln!("payonce-bank: {error}");
            return ExitCode::from(2);
        }
    };
    // The contract with whoever started the bank: this line, once, when it listens.
    println!("listening on {}", handle.addr());
    shutdown_signal().await;
    handle.shutdown().await;
    bank.close().await;
    ExitCode::SUCCESS
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// The URL with its password hidden.
fn masked(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}
