//! `payonce-matrix`: every lock service, fenced and unfenced, and the classic recipes,
//! under every fault — one table, its JSON and a grid chart. `scripts/matrix.sh` runs it
//! on a scratch database.
//!
//! Exit codes: 0 no fenced row spent money twice, 1 one did (a bug), 2 the matrix could
//! not run.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use matrix::dispatcher::{BankFault, DispatchOptions, DispatchRow, Keys};
use matrix::ledger::{self, LedgerFault, LedgerOptions, LedgerRow, LocksOn, Replication};
use matrix::{Fault, Guard, Line, MatrixOptions, Race, Row, Service, report};

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
    /// Only rows racing for these, comma-separated: spends, refunds (default: both).
    #[arg(long, value_delimiter = ',')]
    races: Vec<String>,
    /// Write the rows as JSON: {"rows": [...]}.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where to draw the grid (SVG).
    #[arg(long, default_value = "matrix-chart.svg")]
    chart: PathBuf,
    /// The payonce binary, built with `--features demo,all-locks` (default: the one beside
    /// this program).
    #[arg(long)]
    payonce: Option<PathBuf>,
    /// The payonce-bank binary the dispatcher's rows pay out to (default: the one beside
    /// this program).
    #[arg(long)]
    bank: Option<PathBuf>,
    /// The lock services' table, the payout dispatcher's row pair (one key per payout
    /// against a fresh key per attempt, under the bank's faults), both, or the ledger
    /// table (the ledger on a PostgreSQL cluster losing its primary; run as root, it
    /// starts the cluster with scripts/ledger-cluster.sh).
    #[arg(long, value_enum, default_value_t = Tables::Both)]
    tables: Tables,
    /// The ledger table's replication rows, comma-separated (sync, async; default both).
    #[arg(long, value_delimiter = ',')]
    replication: Vec<String>,
    /// The ledger table's lock rows: redis (a private Redis beside the cluster),
    /// postgres-advisory (advisory locks on the cluster), or both (the default).
    #[arg(long, value_delimiter = ',')]
    ledger_locks: Vec<String>,
    /// The ledger cluster's script (default: scripts/ledger-cluster.sh of this checkout).
    #[arg(long)]
    ledger_cluster: Option<PathBuf>,
    /// PostgreSQL for the instances' ledger; use a scratch database — the unsafe rows
    /// corrupt the accounts they touch, on purpose.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Allow a DATABASE_URL that is not on a loopback address.
    #[arg(long)]
    allow_remote: bool,
}

/// Which tables to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Tables {
    /// The lock services × faults.
    Locks,
    /// The payout dispatcher's row pair.
    Dispatcher,
    /// Both.
    Both,
    /// The ledger on a PostgreSQL cluster under Patroni, losing its primary.
    Ledger,
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
    if cli.tables == Tables::Ledger {
        return ledger_table(&cli, &options, started).await;
    }
    eprintln!(
        "payonce-matrix: {} rows × {} faults, {} s per cell",
        options.lines.len(),
        options.faults.len(),
        options.seconds
    );
    let tables = async {
        let rows = if cli.tables == Tables::Dispatcher {
            Vec::new()
        } else {
            matrix::run_matrix(&options, |row| print_progress(row, started)).await?
        };
        let dispatcher = if cli.tables == Tables::Locks {
            Vec::new()
        } else {
            let bank = beside_this_program(cli.bank.as_ref(), "payonce-bank");
            let dispatch = DispatchOptions {
                payonce: &options.payonce,
                bank: &bank,
                database_url: &options.database_url,
                seconds: options.seconds.max(2.0),
                clients: options.clients,
                accounts: options.accounts.max(4),
            };
            matrix::dispatcher::run_dispatcher(&dispatch, &BankFault::ALL, |row| {
                print_dispatch_progress(row, started);
            })
            .await
        };
        Ok::<_, matrix::MatrixError>((rows, dispatcher))
    };
    let (rows, dispatcher) = tokio::select! {
        tables = tables => match tables {
            Ok(tables) => tables,
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
    write_reports(&rows, &dispatcher, &cli);
    let verdict = verdict(&rows, &dispatcher);
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
    // The ledger table names its own faults (see `ledger_table`).
    let faults = if cli.tables == Tables::Ledger {
        Fault::ALL.to_vec()
    } else {
        parse_all(&cli.faults, &Fault::ALL, Fault::parse, Fault::name, "fault")?
    };
    let races = parse_all(&cli.races, &Race::ALL, Race::parse, Race::name, "race")?;
    let lines: Vec<Line> = Line::all()
        .into_iter()
        .filter(|line| {
            services.contains(&line.service)
                && guards.contains(&line.guard)
                && races.contains(&line.race)
        })
        .collect();
    let payonce = beside_this_program(cli.payonce.as_ref(), "payonce");
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

/// The ledger table alone: its rows, printed as they finish, the table, its JSON. Exit
/// code 1 if a synchronous row lost anything (the promise), 2 if a cell could not run.
async fn ledger_table(cli: &Cli, options: &MatrixOptions, started: std::time::Instant) -> ExitCode {
    let LedgerChoices {
        replications,
        faults,
        locks,
    } = match ledger_choices(cli) {
        Ok(chosen) => chosen,
        Err(error) => {
            eprintln!("payonce-matrix: {error}");
            return ExitCode::from(2);
        }
    };
    let rows = ledger::rows(&replications, &locks);
    let bank = beside_this_program(cli.bank.as_ref(), "payonce-bank");
    let script = cli
        .ledger_cluster
        .clone()
        .unwrap_or_else(ledger::default_script);
    let ledger_options = LedgerOptions {
        payonce: &options.payonce,
        bank: &bank,
        script: &script,
        // Past the fault's stall (15 s, from a fifth of the way in) with load to spare.
        seconds: cli.seconds.unwrap_or(25.0).max(20.0),
        clients: options.clients,
        accounts: options.accounts.max(4),
    };
    eprintln!(
        "payonce-matrix: ledger table, {} rows × {} faults, {} s per cell",
        rows.len(),
        faults.len(),
        ledger_options.seconds
    );
    let table = tokio::select! {
        table = ledger::run_ledger(&ledger_options, &rows, &faults, |row| {
            print_ledger_row(row, started)
        }) => table,
        () = interrupted() => {
            eprintln!("payonce-matrix: interrupted");
            return ExitCode::from(2);
        }
    };
    let _ = report::print_ledger(&table, &mut std::io::stdout().lock());
    if let Some(path) = &cli.json {
        match report::write_json(&[], &[], &table, path) {
            Ok(()) => println!("json: {}", path.display()),
            Err(error) => eprintln!("payonce-matrix: cannot write {}: {error}", path.display()),
        }
    }
    println!("elapsed: {:.1} s in all", started.elapsed().as_secs_f64());
    ledger_verdict(&table)
}

/// The rows and columns of the ledger table the command line chose.
struct LedgerChoices {
    replications: Vec<Replication>,
    faults: Vec<LedgerFault>,
    locks: Vec<LocksOn>,
}

/// The replications, faults and lock rows of the ledger table the command line chose.
fn ledger_choices(cli: &Cli) -> Result<LedgerChoices, String> {
    let replications = parse_all(
        &cli.replication,
        &Replication::ALL,
        Replication::parse,
        Replication::name,
        "replication",
    )?;
    let faults = parse_all(
        &cli.faults,
        &LedgerFault::ALL,
        LedgerFault::parse,
        LedgerFault::name,
        "fault",
    )?;
    let locks = parse_all(
        &cli.ledger_locks,
        &LocksOn::ALL,
        LocksOn::parse,
        LocksOn::name,
        "lock row",
    )?;
    Ok(LedgerChoices {
        replications,
        faults,
        locks,
    })
}

/// A ledger row as it finishes, on stderr.
fn print_ledger_row(row: &LedgerRow, started: std::time::Instant) {
    eprintln!(
        "  {:<6} {:<17} {:<17} {} lost, {} executed twice, {} unknown at the bank, {:.1} s unserved ({:.0} s)",
        row.replication.name(),
        row.locks.name(),
        row.fault.name(),
        row.acknowledged_lost,
        row.executed_twice,
        row.unknown_at_bank,
        row.unserved_seconds,
        started.elapsed().as_secs_f64(),
    );
    if let Some(why) = &row.skipped {
        eprintln!("    {why}");
    }
}

/// The ledger table's verdict, printed, as the exit code: 2 if a cell could not run, 1 if
/// a synchronous row lost anything.
fn ledger_verdict(table: &[LedgerRow]) -> ExitCode {
    let failed = table.iter().filter(|row| row.skipped.is_some()).count();
    let sync_lost = table
        .iter()
        .any(|row| row.replication == Replication::Sync && row.lost_anything());
    if failed > 0 {
        println!("VERDICT: {failed} cells could not be run (see the table)");
        ExitCode::from(2)
    } else if sync_lost {
        println!(
            "VERDICT: synchronous replication lost an acknowledged outcome or executed one twice — a bug"
        );
        ExitCode::from(1)
    } else {
        println!(
            "VERDICT: synchronous replication lost nothing; the asynchronous rows show what it does"
        );
        ExitCode::SUCCESS
    }
}

/// `given`, or the program `name` in this one's directory.
fn beside_this_program(given: Option<&PathBuf>, name: &str) -> PathBuf {
    given.cloned().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join(name)))
            .unwrap_or_else(|| PathBuf::from(name))
    })
}

/// One line per dispatcher cell as it finishes.
fn print_dispatch_progress(row: &DispatchRow, started: std::time::Instant) {
    match &row.skipped {
        None => eprintln!(
            "  {:<22} {:<17} {:>5} payouts, {} paid twice at the bank ({:.0} s)",
            row.keys.name(),
            row.fault.name(),
            row.payouts,
            row.paid_twice,
            started.elapsed().as_secs_f64(),
        ),
        Some(why) => eprintln!("  {:<22} {:<17} {why}", row.keys.name(), row.fault.name()),
    }
}

/// One line per cell as it finishes.
fn print_progress(row: &Row, started: std::time::Instant) {
    if row.skipped.is_none() {
        eprintln!(
            "  {:<10} {:<13} {:<8} {:<14} {:>6} requests, {} double spends, {} refunded too much, {} stale fencing tokens ({:.0} s)",
            row.service.name(),
            row.guard.name(),
            row.race.name(),
            row.fault.name(),
            row.requests,
            row.double_spends,
            row.refunded_too_much,
            row.stale_fencing_tokens,
            started.elapsed().as_secs_f64(),
        );
        for finding in &row.other_findings {
            eprintln!(
                "    {:?} (account {}, ticket {}): {}",
                finding.kind,
                finding.account,
                finding.ticket.as_deref().unwrap_or("-"),
                finding.detail
            );
        }
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
fn write_reports(rows: &[Row], dispatcher: &[DispatchRow], cli: &Cli) {
    let mut stdout = std::io::stdout().lock();
    if !rows.is_empty() {
        let _ = report::print_table(rows, &mut stdout);
    }
    if !dispatcher.is_empty() {
        let _ = writeln!(stdout);
        let _ = report::print_dispatcher(dispatcher, &mut stdout);
    }
    if let Some(path) = &cli.json {
        match report::write_json(rows, dispatcher, &[], path) {
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
/// twice or refunded past a payment, or payonce's one key paid out wrongly, else 0.
fn verdict(rows: &[Row], dispatcher: &[DispatchRow]) -> ExitCode {
    let fenced_failed = rows
        .iter()
        .any(|row| row.guard == Guard::Fenced && row.spent_twice());
    let one_key_failed = dispatcher
        .iter()
        .any(|row| row.keys == Keys::OneKey && row.paid_wrongly());
    let failed = rows
        .iter()
        .filter(|row| {
            row.skipped
                .as_deref()
                .is_some_and(|why| why.starts_with("failed"))
        })
        .count()
        + dispatcher
            .iter()
            .filter(|row| row.skipped.is_some())
            .count();
    if failed > 0 {
        println!("VERDICT: {failed} cells could not be run (see the table)");
        ExitCode::from(2)
    } else if fenced_failed || one_key_failed {
        println!(
            "VERDICT: a fenced row spent money twice or refunded more than was paid, or one key per payout paid out wrongly — a bug"
        );
        ExitCode::from(1)
    } else {
        println!(
            "VERDICT: no fenced row spent money twice or refunded more than was paid, and one key per payout never paid out twice; \
             the tables show where the others do"
        );
        ExitCode::SUCCESS
    }
}
