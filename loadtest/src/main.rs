//! `loadtest`: drive payonce instances with spends, duplicates and races, then audit.
//!
//! Exit codes: 0 the audit passed, 1 it found violations (each printed), 2 the run could
//! not be carried out.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use loadtest::receiver::ReceiverFaults;
use loadtest::retry::RetryPolicy;
use loadtest::run::{BankFaultPlan, Limit, Mix, RunOptions};
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

/// The share of spends that are withdrawals or payouts.
const WITHDRAWALS_AND_PAYOUTS: f64 = 0.45;

fn bank_fault(text: &str) -> Result<BankFaultPlan, String> {
    let (fault, share) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=SHARE"))?;
    Ok(BankFaultPlan {
        fault: fault.to_owned(),
        share: fraction(share)?,
    })
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
    /// Sends per request, the first included: a request that got no answer, 409
    /// request-in-progress or account-busy, 429 or 503 (but payouts-unavailable, which is
    /// final) is resent with the same ticket (to the next target after no answer, a 429 or
    /// a 503), up to this many times in all.
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
    /// Fraction of spends that are payouts to the bank (0 for none). A target without a
    /// bank answers them 503 `payouts-unavailable`: on the first, the run sends no more
    /// payouts (their share goes to the withdrawals) and its summary says why.
    #[arg(long, default_value = "0.05", value_parser = fraction)]
    payouts: f64,
    /// Fraction of spends that place a hold (0 for none): a third expire in a second,
    /// captured as they expire or left to expire; the rest captured in part, voided,
    /// captured and voided at once, or left held; a captured one is refunded by two or
    /// three requests at once, and paid orders likewise. Taken from the deposits' share.
    #[arg(long, default_value = "0.05", value_parser = fraction)]
    holds: f64,
    /// The bank the targets pay out to (their PAYONCE_BANK_URL): after the run its
    /// transfers are reconciled with the payouts — none executed twice, none succeeded
    /// yet missing, none given back yet executed. Loopback only, like the targets.
    #[arg(long)]
    bank: Option<String>,
    /// Ask for a fault of the bank's on a share of the payouts, as NAME=SHARE (e.g.
    /// commit-then-drop=0.3): sent as `Payonce-Bank-Fault`, which only an embedded-mode
    /// payonce heeds (its in-process bank plays it on the payout's first call); a bank of
    /// your own takes its faults on its command line.
    #[arg(long, value_parser = bank_fault)]
    bank_fault: Option<BankFaultPlan>,
    /// After the load, wait at most this long for the pending payouts to be settled (and,
    /// with --webhooks, for the undelivered events to arrive).
    #[arg(long, default_value = "30s", value_parser = duration)]
    drain: Duration,
    /// Start a webhook receiver on loopback and give every account an endpoint at it: after
    /// the load (and the drain) the audit checks that every committed outcome was
    /// delivered, signed, and nothing else. The targets must be allowed to deliver to
    /// loopback (PAYONCE_WEBHOOK_ALLOW_PRIVATE=true).
    #[arg(long)]
    webhooks: bool,
    /// The share of deliveries the receiver answers 500.
    #[arg(long, default_value = "0", value_parser = fraction, requires = "webhooks")]
    receiver_fail: f64,
    /// The share it answers 429 with `Retry-After: 1`.
    #[arg(long, default_value = "0", value_parser = fraction, requires = "webhooks")]
    receiver_throttle: f64,
    /// The share it answers slowly (after --receiver-slow-for; keep that under the
    /// targets' PAYONCE_WEBHOOK_TIMEOUT).
    #[arg(long, default_value = "0", value_parser = fraction, requires = "webhooks")]
    receiver_slow: f64,
    /// How long a slow answer takes.
    #[arg(long, default_value = "500ms", value_parser = duration)]
    receiver_slow_for: Duration,
    /// The share it never answers (payonce gives up at its PAYONCE_WEBHOOK_TIMEOUT).
    #[arg(long, default_value = "0", value_parser = fraction, requires = "webhooks")]
    receiver_hang: f64,
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
        None => run_command(cli.run).await,
    }
}

async fn run_command(args: RunArgs) -> ExitCode {
    let (report_to, chart) = (args.report.clone(), args.chart.clone());
    let options = match run_options(args) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("loadtest: {error}");
            return ExitCode::from(2);
        }
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
    if let Some(path) = &report_to {
        match report::write_json(&result, path) {
            Ok(()) => println!("report: {}", path.display()),
            Err(error) => eprintln!("loadtest: cannot write the report: {error}"),
        }
    }
    match report::draw_chart(&result, &chart) {
        Ok(()) => println!("chart: {}", chart.display()),
        Err(error) => eprintln!("loadtest: cannot draw the chart: {error}"),
    }
    if result.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The run the arguments ask for; why not, when they ask for one that must not be run.
fn run_options(args: RunArgs) -> Result<RunOptions, String> {
    let limit = match (args.duration, args.requests) {
        (Some(duration), None) => Limit::Duration(duration),
        (None, Some(requests)) => Limit::Requests(requests),
        _ => return Err("give --duration or --requests (the run must be bounded)".into()),
    };
    check_run_args(&args)?;
    Ok(RunOptions {
        retry: args.retry(),
        targets: args.targets,
        accounts: args.accounts,
        clients: args.clients,
        limit,
        duplicate_fraction: args.duplicates,
        changed_fraction: args.changed,
        progress: !args.no_progress,
        // Payouts take their share from the withdrawals' (the default mix's 45% in all).
        mix: Mix {
            withdrawal: WITHDRAWALS_AND_PAYOUTS - args.payouts,
            payout: args.payouts,
            hold: args.holds,
            ..Mix::default()
        },
        headers: Vec::new(),
        fault: None,
        bank_fault: args.bank_fault,
        sticky: false,
        expect_unanswered: false,
        bank: args.bank,
        drain: args.drain,
        webhooks: args.webhooks.then_some(ReceiverFaults {
            fail: args.receiver_fail,
            throttle: args.receiver_throttle,
            slow: args.receiver_slow,
            slow_for: args.receiver_slow_for,
            hang: args.receiver_hang,
        }),
    })
}

/// Refuses targets that are not loopback (unless allowed), a payouts' share beyond the
/// withdrawals', and a run without accounts or clients.
fn check_run_args(args: &RunArgs) -> Result<(), String> {
    safety::check_targets(&args.targets, args.allow_remote)?;
    if let Some(bank) = &args.bank {
        safety::check_targets(std::slice::from_ref(bank), args.allow_remote)
            .map_err(|error| format!("--bank: {error}"))?;
    }
    if args.payouts > WITHDRAWALS_AND_PAYOUTS {
        return Err(format!(
            "--payouts is at most {WITHDRAWALS_AND_PAYOUTS} (the withdrawals' share)"
        ));
    }
    let deposits = 1.0 - WITHDRAWALS_AND_PAYOUTS - Mix::default().draw - Mix::default().order;
    if args.holds > deposits {
        return Err(format!(
            "--holds is at most {deposits:.2} (the deposits' share)"
        ));
    }
    if args.accounts == 0 || args.clients == 0 {
        return Err("--accounts and --clients must be at least 1".into());
    }
    Ok(())
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
