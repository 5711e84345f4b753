//! What the `payonce` binary runs: serve the API (the default), `payonce audit` the
//! ledger, or `payonce reconcile` its payouts with the bank.
//!
//! [`run`] hands the binary one boxed future, made here. An `async fn`'s state machine is
//! compiled again in every crate that awaits it, so a binary awaiting `serve`, `connect`
//! and the audit directly would compile the server's whole graph a second time, after
//! this library: the largest step of a cold release build. Behind a plain function that
//! boxes it, the graph is compiled once.

use std::process::ExitCode;

use futures::future::LocalBoxFuture;

use ledger::{Ledger, LedgerOptions};

use crate::config::{Cli, Command, Config, Mode, Strategy};
use crate::state::AppState;

/// Logs, then runs the command `cli` names, then flushes the traces still batched.
#[inline(never)]
pub fn run(cli: Cli) -> LocalBoxFuture<'static, ExitCode> {
    Box::pin(async move {
        let telemetry = match crate::telemetry::init(cli.config.telemetry.log_format) {
            Ok(telemetry) => telemetry,
            Err(error) => {
                eprintln!("payonce: logging and tracing: {error}");
                return ExitCode::FAILURE;
            }
        };
        let code = match cli.command.unwrap_or(Command::Serve) {
            Command::Serve => match serve(&cli.config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("payonce: {error}");
                    ExitCode::FAILURE
                }
            },
            Command::Audit { json } => audit(&cli.config, json).await,
            Command::Reconcile { bank } => reconcile(&cli.config, bank).await,
        };
        // The spans still batched go out before the process does (the exporter blocks).
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        code
    })
}

async fn serve(config: &Config) -> Result<(), Box<dyn std::error::Error>> {
    // Refused before anything is printed or warned about (an unsafe strategy in a build
    // without the demonstration, say).
    config.validate()?;
    let mode = config.mode()?;
    eprintln!(
        "payonce {} starting in the {} mode with:\n{config}",
        env!("CARGO_PKG_VERSION"),
        match mode {
            Mode::Embedded { .. } => "embedded (SQLite + in-process locks)".to_owned(),
            Mode::Distributed { locks, .. } =>
                format!("distributed (PostgreSQL + {})", locks.service()),
        }
    );
    if config.demo {
        tracing::warn!(
            "DEMONSTRATION MODE: the Payonce-Fault and Payonce-Strategy headers are honoured. Never in production."
        );
    }
    if config.lock.lock_strategy != Strategy::Fenced {
        tracing::warn!(
            strategy = config.lock.lock_strategy.name(),
            "UNSAFE LOCK STRATEGY: spends are not fenced; money can be spent twice. Demonstration only."
        );
    }
    let state = AppState::connect(config).await?;
    let listener = tokio::net::TcpListener::bind(config.addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "listening");
    crate::serve(listener, state, config.request_timeout, shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Completes on ctrl-c or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutting down: finishing in-flight requests");
}

/// The ledger a command reads: `DATABASE_URL`'s, or the embedded file — which must exist
/// (opening would create an empty ledger, and an empty ledger is clean: better to say
/// plainly that there is nothing here).
async fn existing_ledger(config: &Config, command: &str) -> Result<Ledger, ExitCode> {
    let url = match (&config.database_url, config.mode()) {
        (Some(url), _) => url.clone(),
        (None, Ok(Mode::Embedded { sqlite_path })) => {
            if !sqlite_path.exists() {
                eprintln!(
                    "payonce {command}: no embedded ledger at {} (set PAYONCE_DATA_DIR, or DATABASE_URL)",
                    sqlite_path.display()
                );
                return Err(ExitCode::from(2));
            }
            format!("sqlite:{}", sqlite_path.display())
        }
        (None, _) => {
            eprintln!("payonce {command}: set DATABASE_URL (or run where the embedded data lives)");
            return Err(ExitCode::from(2));
        }
    };
    Ledger::open(&url, &LedgerOptions::default())
        .await
        .map_err(|error| {
            eprintln!("payonce {command}: cannot open the ledger: {error}");
            ExitCode::from(2)
        })
}

/// `payonce reconcile`: exit 0 when the ledger's payouts and the bank's transfers agree,
/// 1 listing what disagrees, 2 when either cannot be read.
async fn reconcile(config: &Config, bank: Option<String>) -> ExitCode {
    let Some(bank) = bank.or_else(|| config.bank_url.clone()) else {
        eprintln!("payonce reconcile: name the bank: --bank URL (or PAYONCE_BANK_URL)");
        return ExitCode::from(2);
    };
    let Ok(bank) = url::Url::parse(&bank) else {
        eprintln!("payonce reconcile: {bank} is not a URL");
        return ExitCode::from(2);
    };
    let ledger = match existing_ledger(config, "reconcile").await {
        Ok(ledger) => ledger,
        Err(code) => return code,
    };
    let found = match crate::reconcile::reconcile(&ledger, &bank).await {
        Ok(found) => found,
        Err(error) => {
            eprintln!("payonce reconcile: {error}");
            return ExitCode::from(2);
        }
    };
    for finding in &found.findings {
        println!("MISMATCH {finding}");
    }
    for (payout, age) in &found.pending {
        println!(
            "pending {payout}: waiting {:.1} s for the bank's word",
            age.as_secs_f64()
        );
    }
    println!(
        "{}: {} payouts, {} transfers executed at the bank, {} pending, {} mismatches",
        if found.is_clean() {
            "reconciled"
        } else {
            "NOT RECONCILED"
        },
        found.payouts,
        found.executed,
        found.pending.len(),
        found.findings.len()
    );
    if found.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `payonce audit`: exit 0 when every invariant holds, 1 listing the violations, 2 when
/// the audit could not run.
async fn audit(config: &Config, json: bool) -> ExitCode {
    let ledger = match existing_ledger(config, "audit").await {
        Ok(ledger) => ledger,
        Err(code) => return code,
    };
    let violations = match ledger.audit().await {
        Ok(violations) => violations,
        Err(error) => {
            eprintln!("payonce audit: {error}");
            return ExitCode::from(2);
        }
    };
    if json {
        match serde_json::to_string_pretty(&violations) {
            Ok(text) => println!("{text}"),
            Err(error) => {
                eprintln!("payonce audit: {error}");
                return ExitCode::from(2);
            }
        }
    } else if violations.is_empty() {
        println!(
            "audit clean: every invariant holds ({} database)",
            ledger.database()
        );
    } else {
        for violation in &violations {
            let account = violation
                .account_id
                .map(|id| id.to_string())
                .unwrap_or_default();
            let ticket = violation
                .ticket_id
                .map(|id| id.to_string())
                .unwrap_or_default();
            println!(
                "VIOLATION {:?} account={account} ticket={ticket}: {}",
                violation.rule, violation.detail
            );
        }
        println!("{} violation(s)", violations.len());
    }
    if violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
