//! `payonce-matrix`: every lock service, fenced and unfenced, and the classic recipes,
//! under every fault — one table, its JSON and a grid chart. `scripts/matrix.sh` runs it
//! on a scratch database.
//!
//! Exit codes: 0 no fenced row spent money twice, 1 one did (a bug), 2 the matrix could
//! not run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use matrix::{Fault, Guard, Line, MatrixOptions, Row, Service, report};

#[derive(Parser, Debug)]
#[command(
    name = "payonce-matrix",
    about = "Every lock service, fenced and unfenced, under every fault: which spends money twice."
)]
struct Cli {
    /// One second of load per cell (cells whose fault outlasts it run longer).
    #[arg(long)]
    quick: bool,
    /// Seconds of load per cell (default 4, or 1 with --quick).
    #[arg(long)]
    seconds: Option<f64>,
    /// Clients per cell.
    #[arg(long, default_value_t = 12)]
    clients: usize,
    /// Accounts per cell (few: contention is the point).
    #[arg(long, default_value_t = 3)]
    accounts: usize,
    /// Only rows on these lock services, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    services: Vec<String>,
    /// Only rows with these guards, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    guards: Vec<String>,
    /// Only these faults, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    faults: Vec<String>,
    /// Write the rows as JSON: {"rows": [...]}.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where to draw the grid (SVG).
    #[arg(long, default_value = "matrix-chart.svg")]
    chart: PathBuf,
    /// The payonce binary, built with `--features demo` (default: the one beside
    /// this program).
    #[arg(long)]
    payonce: Option<PathBuf>,
    /// PostgreSQL for the instances' ledger; use a scratch database — the unsafe rows
    /// corrupt the accounts they touch, on purpose.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Allow a DATABASE_URL that is not on a loopback address.
    #[arg(long)]
    allow_remote: bool,
}

fn parse_all<T: Copy>(
    names: &[String],
    all: &[T],
    parse: impl Fn(&str) -> Option<T>,
    name: impl Fn(T) -> &'static str,
    what: &str,
) -> Result<Vec<T>, String> {
    if names.is_empty() {
        return Ok(all.to_vec());
    }
    names
        .iter()
        .map(|given| {
            parse(given).ok_or_else(|| {
                let known: Vec<_> = all.iter().map(|item| name(*item)).collect();
                format!("unknown {what} {given}; known: {}", known.join(", "))
            })
        })
        .collect()
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let started = std::time::Instant::now();
    let options = match options(&cli) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("payonce-matrix: {error}");
            return ExitCode::from(2);
        }
    };
    eprintln!(
        "payonce-matrix: {} rows × {} faults, {} s per cell",
        options.lines.len(),
        options.faults.len(),
        options.seconds
    );
    let matrix = matrix::run_matrix(&options, |row| print_progress(row, started));
    let rows = tokio::select! {
        rows = matrix => match rows {
            Ok(rows) => rows,
            Err(error) => {
                eprintln!("payonce-matrix: {error}");
                return ExitCode::from(2);
            }
        },
        () = interrupted() => {
            eprintln!("payonce-matrix: interrupted; servers and instances stopped");
            return ExitCode::from(2);
        }
    };
    write_reports(&rows, &cli);
    let verdict = verdict(&rows);
    println!("elapsed: {:.1} s in all", started.elapsed().as_secs_f64());
    verdict
}

/// What the command line asks for: the rows and faults it names, against a loopback
/// database (unless `--allow-remote`).
fn options(cli: &Cli) -> Result<MatrixOptions, String> {
    let as_http = cli
        .database_url
        .replacen("postgres://", "http://", 1)
        .replacen("postgresql://", "http://", 1);
    loadtest::safety::check_targets(&[as_http], cli.allow_remote).map_err(|e| e.to_string())?;
    let services = parse_all(
        &cli.services,
        &Service::ALL,
        Service::parse,
        Service::name,
        "service",
    )?;
    let guards = parse_all(&cli.guards, &Guard::ALL, Guard::parse, Guard::name, "guard")?;
    let faults = parse_all(&cli.faults, &Fault::ALL, Fault::parse, Fault::name, "fault")?;
    let lines: Vec<Line> = Line::all()
        .into_iter()
        .filter(|line| services.contains(&line.service) && guards.contains(&line.guard))
        .collect();
    let payonce = cli.payonce.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("payonce")))
            .unwrap_or_else(|| PathBuf::from("payonce"))
    });
    Ok(MatrixOptions {
        payonce,
        database_url: cli.database_url.clone(),
        seconds: cli.seconds.unwrap_or(if cli.quick { 1.0 } else { 4.0 }),
        clients: cli.clients,
        accounts: cli.accounts,
        lines,
        faults,
    })
}

/// One line per cell as it finishes.
fn print_progress(row: &Row, started: std::time::Instant) {
    if row.skipped.is_none() {
        eprintln!(
            "  {:<10} {:<13} {:<14} {:>6} requests, {} double spends, {} stale fencing tokens ({:.0} s)",
            row.service.name(),
            row.guard.name(),
            row.fault.name(),
            row.requests,
            row.double_spends,
            row.stale_fencing_tokens,
            started.elapsed().as_secs_f64(),
        );
    }
}

/// Completes on ctrl-c or SIGTERM. Ended by a signal, the matrix is dropped — and with it
/// every server and instance it started (the private PostgreSQL, run by pg_ctl, would
/// outlive a plain exit).
async fn interrupted() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async {
            match terminate.as_mut() {
                Some(terminate) => { terminate.recv().await; }
                None => std::future::pending::<()>().await,
            }
        } => {}
    }
}

/// The table on stdout, the JSON where `--json` says, the chart where `--chart` says.
fn write_reports(rows: &[Row], cli: &Cli) {
    let mut stdout = std::io::stdout().lock();
    let _ = report::print_table(rows, &mut stdout);
    if let Some(path) = &cli.json {
        match report::write_json(rows, path) {
            Ok(()) => println!("json: {}", path.display()),
            Err(error) => eprintln!("payonce-matrix: cannot write {}: {error}", path.display()),
        }
    }
    match report::draw_chart(rows, &cli.chart) {
        Ok(()) => println!("chart: {}", cli.chart.display()),
        Err(error) => eprintln!("payonce-matrix: cannot draw the chart: {error}"),
    }
}

/// The exit code, said in words: 2 if a cell could not run, 1 if a fenced row spent money
/// twice, else 0.
fn verdict(rows: &[Row]) -> ExitCode {
    let fenced_failed = rows
        .iter()
        .any(|row| row.guard == Guard::Fenced && row.spent_twice());
    let failed = rows
        .iter()
        .filter(|row| {
            row.skipped
                .as_deref()
                .is_some_and(|why| why.starts_with("failed"))
        })
        .count();
    if failed > 0 {
        println!("VERDICT: {failed} cells could not be run (see the table)");
        ExitCode::from(2)
    } else if fenced_failed {
        println!("VERDICT: a fenced row spent money twice — a bug");
        ExitCode::from(1)
    } else {
        println!("VERDICT: no fenced row spent money twice; the table shows where the others do");
        ExitCode::SUCCESS
    }
}
