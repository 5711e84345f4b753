//! `loadtest`: drive payonce instances with spends, duplicates and races, then audit.
//!
//! Exit codes: 0 the audit passed, 1 it found violations (each printed), 2 the run could
//! not be carried out.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use loadtest::retry::RetryPolicy;
use loadtest::run::{Limit, Mix, RunOptions};
use loadtest::{healthz, report, run, safety};

#[derive(Parser, Debug)]
#[command(
    name = "loadtest",
    about = "Load-test payonce and prove nothing was spent twice.",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// GET /healthz as fast as the clients can: the generator's own speed.
    Healthz(HealthzArgs),
    /// Every lock strategy under every fault, one table. Starts its own payonce instances
    /// (in the demonstration mode) against DATABASE_URL and REDIS_URL.
    Matrix(MatrixArgs),
}

#[derive(Args, Debug)]
struct MatrixArgs {
    /// Two seconds per cell: the whole matrix in under two minutes.
    #[arg(long)]
    quick: bool,
    /// Seconds of load per cell (default 5, or 2 with --quick).
    #[arg(long)]
    seconds: Option<f64>,
    /// Clients per cell.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Accounts per cell (few: contention is the point).
    #[arg(long, default_value_t = 3)]
    accounts: usize,
    /// Only these strategies, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<String>,
    /// Only these faults, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    faults: Vec<String>,
    /// Write the rows as JSON: {"rows": [...]}.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where to draw the grid (SVG).
    #[arg(long, default_value = "matrix-chart.svg")]
    chart: PathBuf,
    /// The payonce binary (default: the one beside this loadtest).
    #[arg(long)]
    payonce: Option<PathBuf>,
    /// PostgreSQL for the instances; use a scratch database — the unsafe strategies
    /// corrupt the accounts they touch, on purpose.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Redis for the instances' locks.
    #[arg(long, env = "REDIS_URL")]
    redis_url: String,
    /// Allow a DATABASE_URL or REDIS_URL that is not on a loopback address.
    #[arg(long)]
    allow_remote: bool,
}

fn duration(text: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(text)
}

fn fraction(text: &str) -> Result<f64, String> {
    let value: f64 = text.parse().map_err(|error| format!("{error}"))?;
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{value} is not between 0 and 1"))
    }
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Base URLs of the instances, comma-separated.
    #[arg(long, value_delimiter = ',', required = false)]
    targets: Vec<String>,
    /// Accounts in play at a time. Every 50 spends per account, a fresh set is opened,
    /// funded so that about half of those spends are refused.
    #[arg(long, default_value_t = 20)]
    accounts: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Run this long (e.g. 30s).
    #[arg(long, value_parser = duration, conflicts_with = "requests")]
    duration: Option<Duration>,
    /// Or send this many spends (duplicates come on top).
    #[arg(long)]
    requests: Option<u64>,
    /// Write the JSON report (counts, latency, throughput, metrics, violations, history).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Where to draw the chart (SVG).
    #[arg(long, default_value = "loadtest-chart.svg")]
    chart: PathBuf,
    /// Fraction of spends sent twice at once (to another target) and again later.
    #[arg(long, default_value = "0.3", value_parser = fraction)]
    duplicates: f64,
    /// Fraction of duplicated spends also sent later with a changed amount (must be 422).
    #[arg(long, default_value = "0.2", value_parser = fraction)]
    changed: f64,
    /// Sends per request, the first included: a request that got no answer, 409, 429 or
    /// 503 is resent with the same ticket, to the next target, up to this many times in all.
    #[arg(long, default_value_t = RetryPolicy::default().max_attempts,
          value_parser = clap::value_parser!(u32).range(1..), conflicts_with = "no_retry")]
    max_attempts: u32,
    /// The longest wait before a resend: Retry-After is honoured up to it; without one, the
    /// wait starts at 50ms and doubles, with jitter.
    #[arg(long, default_value = "2s", value_parser = duration)]
    max_backoff: Duration,
    /// Send each request once: an unanswered one is then a violation (as before retries).
    #[arg(long)]
    no_retry: bool,
    /// Allow targets that are not loopback addresses.
    #[arg(long)]
    allow_remote: bool,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

impl RunArgs {
    fn retry(&self) -> RetryPolicy {
        if self.no_retry {
            RetryPolicy::none()
        } else {
            RetryPolicy {
                max_attempts: self.max_attempts,
                max_backoff: self.max_backoff,
            }
        }
    }
}

#[derive(Args, Debug)]
struct HealthzArgs {
    /// Base URLs, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    targets: Vec<String>,
    /// Concurrent connections.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// How long.
    #[arg(long, default_value = "10s", value_parser = duration)]
    duration: Duration,
    /// Allow targets that are not loopback addresses.
    #[arg(long)]
    allow_remote: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Healthz(args)) => healthz_command(args).await,
        Some(Command::Matrix(args)) => matrix_command(args).await,
        None => run_command(cli.run).await,
    }
}

async fn run_command(args: RunArgs) -> ExitCode {
    let limit = match (args.duration, args.requests) {
        (Some(duration), None) => Limit::Duration(duration),
        (None, Some(requests)) => Limit::Requests(requests),
        _ => {
            eprintln!("loadtest: give --duration or --requests (the run must be bounded)");
            return ExitCode::from(2);
        }
    };
    if let Err(error) = safety::check_targets(&args.targets, args.allow_remote) {
        eprintln!("loadtest: {error}");
        return ExitCode::from(2);
    }
    if args.accounts == 0 || args.clients == 0 {
        eprintln!("loadtest: --accounts and --clients must be at least 1");
        return ExitCode::from(2);
    }
    let options = RunOptions {
        retry: args.retry(),
        targets: args.targets,
        accounts: args.accounts,
        clients: args.clients,
        limit,
        duplicate_fraction: args.duplicates,
        changed_fraction: args.changed,
        progress: !args.no_progress,
        mix: Mix::default(),
        headers: Vec::new(),
        fault: None,
        sticky: false,
        expect_unanswered: false,
    };
    let result = match run::run(options).await {
        Ok(result) => result,
        Err(error) => {
            eprintln!("loadtest: {error}");
            return ExitCode::from(2);
        }
    };
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = report::print_summary(&result, &mut stdout) {
        eprintln!("loadtest: {error}");
    }
    if let Some(path) = &args.report {
        match report::write_json(&result, path) {
            Ok(()) => println!("report: {}", path.display()),
            Err(error) => eprintln!("loadtest: cannot write the report: {error}"),
        }
    }
    match report::draw_chart(&result, &args.chart) {
        Ok(()) => println!("chart: {}", args.chart.display()),
        Err(error) => eprintln!("loadtest: cannot draw the chart: {error}"),
    }
    if result.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

async fn healthz_command(args: HealthzArgs) -> ExitCode {
    if let Err(error) = safety::check_targets(&args.targets, args.allow_remote) {
        eprintln!("loadtest: {error}");
        return ExitCode::from(2);
    }
    match healthz::hammer(args.targets, args.clients, args.duration).await {
        Ok(load) => {
            println!(
                "ok {} failed {} in {:.1} s",
                load.ok,
                load.failed,
                load.elapsed.as_secs_f64()
            );
            println!("requests/s: {:.0}", load.rate());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("loadtest: {error}");
            ExitCode::from(2)
        }
    }
}

async fn matrix_command(args: MatrixArgs) -> ExitCode {
    use loadtest::matrix::{self, Fault, MatrixOptions, Strategy};

    let started = std::time::Instant::now();
    for url in [&args.database_url, &args.redis_url] {
        let as_http = url
            .replacen("postgres://", "http://", 1)
            .replacen("postgresql://", "http://", 1)
            .replacen("redis://", "http://", 1);
        if let Err(error) = safety::check_targets(&[as_http], args.allow_remote) {
            eprintln!("loadtest matrix: {error}");
            return ExitCode::from(2);
        }
    }
    let mut strategies = Vec::new();
    for name in &args.strategies {
        match Strategy::parse(name) {
            Some(strategy) => strategies.push(strategy),
            None => {
                let known: Vec<_> = Strategy::ALL
                    .iter()
                    .map(|strategy| strategy.name())
                    .collect();
                eprintln!(
                    "loadtest matrix: unknown strategy {name}; known: {}",
                    known.join(", ")
                );
                return ExitCode::from(2);
            }
        }
    }
    if strategies.is_empty() {
        strategies = Strategy::ALL.to_vec();
    }
    let mut faults = Vec::new();
    for name in &args.faults {
        match Fault::parse(name) {
            Some(fault) => faults.push(fault),
            None => {
                eprintln!("loadtest matrix: unknown fault {name}");
                return ExitCode::from(2);
            }
        }
    }
    if faults.is_empty() {
        faults = Fault::ALL.to_vec();
    }
    let payonce = args.payonce.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("payonce")))
            .unwrap_or_else(|| PathBuf::from("payonce"))
    });
    let options = MatrixOptions {
        payonce,
        database_url: args.database_url,
        redis_url: args.redis_url,
        seconds: args.seconds.unwrap_or(if args.quick { 2.0 } else { 5.0 }),
        clients: args.clients,
        accounts: args.accounts,
        strategies,
        faults,
    };
    eprintln!(
        "loadtest matrix: {} strategies × {} faults, {} s per cell",
        options.strategies.len(),
        options.faults.len(),
        options.seconds
    );
    let rows = match matrix::run_matrix(&options, |row| {
        eprintln!(
            "  {:<13} {:<14} {:>6} requests, {} double spends, {} stale fencing tokens",
            row.strategy.name(),
            row.fault.name(),
            row.requests,
            row.double_spends,
            row.stale_fencing_tokens
        );
    })
    .await
    {
        Ok(rows) => rows,
        Err(error) => {
            eprintln!("loadtest matrix: {error}");
            return ExitCode::from(2);
        }
    };
    let mut stdout = std::io::stdout().lock();
    let _ = matrix::print_table(&rows, &mut stdout);
    if let Some(path) = &args.json {
        match matrix::write_json(&rows, path) {
            Ok(()) => println!("json: {}", path.display()),
            Err(error) => eprintln!("loadtest matrix: cannot write {}: {error}", path.display()),
        }
    }
    match matrix::draw_chart(&rows, &args.chart) {
        Ok(()) => println!("chart: {}", args.chart.display()),
        Err(error) => eprintln!("loadtest matrix: cannot draw the chart: {error}"),
    }
    let fenced_failed = rows.iter().any(|row| {
        row.strategy == Strategy::Fenced && (row.double_spends > 0 || row.overdrafts > 0)
    });
    let verdict = if fenced_failed {
        println!("VERDICT: the fenced strategy spent money twice — a bug");
        ExitCode::from(1)
    } else {
        println!("VERDICT: fenced never spent money twice; the table shows where the others do");
        ExitCode::SUCCESS
    };
    println!("elapsed: {:.1} s in all", started.elapsed().as_secs_f64());
    verdict
}
