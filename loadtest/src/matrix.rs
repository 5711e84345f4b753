//! `loadtest matrix`: every lock strategy under every fault, in one table.
//!
//! Starts its own payonce instances (three, on free loopback ports, in the demonstration
//! mode, against `DATABASE_URL` and `REDIS_URL`) and three private `redis-server`s for
//! Redlock; then, for each strategy × fault, opens fresh accounts and runs the load with
//! `Payonce-Strategy` naming the strategy and the fault applied, and audits. The faults:
//!
//! - `none`: plain concurrency;
//! - `pause`: a tenth of the spends pause inside the critical section for 1.5 s — five
//!   lock TTLs, and longer than the second SETNX + EXPIRE rounds the TTL up to — with
//!   renewal stopped (a stop-the-world pause);
//! - `sigstop`: a real stop of the whole third instance (`kill -STOP`) for five lock TTLs,
//!   then `kill -CONT` — its renewals stop with it, as in a long GC pause or a swapped-out
//!   process; its spends make a 200 ms call-out inside the critical section, so the stop
//!   finds one holding a lock between its read and its write; clients stick to one
//!   instance each in this cell, so the others go on while it sleeps;
//! - `slow-callout`: every spend makes a 20 ms call-out inside the critical section;
//! - `clock-skew`: the first instance's clock runs 5 s ahead (for the timestamp lock);
//! - `instance-kill`: the third instance is killed (SIGKILL) mid-run and restarted;
//! - `redis-wipe`: Redis loses its data mid-run: every key of the matrix's namespace (and
//!   everything on the Redlock nodes) is deleted, as a restart without persistence would.
//!
//! The load in every cell: withdrawals (60%), lottery draws (25%, so points are at stake
//! too) and deposits, a tenth of them duplicated, on accounts funded so that about half the
//! spends are refused (see [`run`](crate::run)).
//!
//! A double spend is an operation that moved money or points twice, or was accepted
//! beyond what was affordable, counted from the ledger's entries
//! ([`AccountTally::double_spends`](crate::audit::AccountTally::double_spends)); an
//! overdraft is an account whose accepted withdrawals (or draws) exceed everything it ever
//! had.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use plotters::prelude::*;
use serde::Serialize;
use tokio::time::{Instant, sleep};

use crate::audit::ViolationKind;
use crate::client::Api;
use crate::retry::RetryPolicy;
use crate::run::{FaultPlan, Limit, Mix, RunOptions, RunResult, run};

/// A fault the matrix injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Plain concurrency.
    None,
    /// A pause longer than the lock TTL inside the critical section.
    Pause,
    /// One instance stopped whole (SIGSTOP) for several lock TTLs, then continued.
    Sigstop,
    /// A slow call-out inside the critical section.
    SlowCallout,
    /// One instance's clock runs ahead.
    ClockSkew,
    /// One instance is killed and restarted mid-run.
    InstanceKill,
    /// Redis loses its data mid-run.
    RedisWipe,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 7] = [
        Fault::None,
        Fault::Pause,
        Fault::Sigstop,
        Fault::SlowCallout,
        Fault::ClockSkew,
        Fault::InstanceKill,
        Fault::RedisWipe,
    ];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Pause => "pause",
            Self::Sigstop => "sigstop",
            Self::SlowCallout => "slow-callout",
            Self::ClockSkew => "clock-skew",
            Self::InstanceKill => "instance-kill",
            Self::RedisWipe => "redis-wipe",
        }
    }

    /// Parses a name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|fault| fault.name() == name)
    }
}

/// A lock strategy payonce's demonstration runs, named in `Payonce-Strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// No lock at all.
    None,
    /// SETNX then EXPIRE, two commands.
    SetnxExpire,
    /// The GETSET timestamp lock.
    Getset,
    /// payonce's lock service, trusted alone (no fencing check).
    Redis,
    /// Redlock over three Redis servers, no fencing.
    Redlock,
    /// payonce's lock with the ledger's fencing check.
    Fenced,
}

impl Strategy {
    /// The strategies, in the table's order: the broken ones, then the real one.
    pub const ALL: [Strategy; 6] = [
        Strategy::None,
        Strategy::SetnxExpire,
        Strategy::Getset,
        Strategy::Redis,
        Strategy::Redlock,
        Strategy::Fenced,
    ];

    /// Its name in the table and in `Payonce-Strategy`.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::SetnxExpire => "setnx-expire",
            Self::Getset => "getset",
            Self::Redis => "redis",
            Self::Redlock => "redlock",
            Self::Fenced => "fenced",
        }
    }

    /// Parses a name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|strategy| strategy.name() == name)
    }
}

/// How to run the matrix.
#[derive(Clone, Debug)]
pub struct MatrixOptions {
    /// The `payonce` binary.
    pub payonce: PathBuf,
    /// PostgreSQL for the instances.
    pub database_url: String,
    /// Redis for the instances' locks.
    pub redis_url: String,
    /// Seconds of load per cell.
    pub seconds: f64,
    /// Clients per cell.
    pub clients: usize,
    /// Accounts per cell (few: contention is the point).
    pub accounts: usize,
    /// Which strategies.
    pub strategies: Vec<Strategy>,
    /// Which faults.
    pub faults: Vec<Fault>,
}

/// One cell of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The strategy.
    pub strategy: Strategy,
    /// The fault.
    pub fault: Fault,
    /// Spend requests sent.
    pub requests: u64,
    /// Operations that moved money or points twice, or were accepted beyond what was
    /// affordable: each withdrawal or lottery draw whose effect a write decided on an
    /// older balance overwrote (its money or points left, yet are there to be spent
    /// again), plus each extra execution of one ticket. Counted by the audit from the
    /// ledger's entries and summed over the cell's accounts; see
    /// [`AccountTally::double_spends`](crate::audit::AccountTally::double_spends).
    pub double_spends: u64,
    /// Money the ledger holds beyond what the accepted operations leave (units spent
    /// without being deducted), summed over the accounts.
    pub money_spent_twice: i64,
    /// Points likewise: points the ledger holds beyond what the accepted draws leave.
    pub points_spent_twice: i64,
    /// Accounts whose accepted withdrawals (or draws) exceed everything they ever had,
    /// plus balances or points seen below zero.
    pub overdrafts: usize,
    /// Writes the ledger refused for carrying an old fencing token during the cell
    /// (`payonce_stale_fencing_tokens_total`, summed over the instances): fencing at work.
    pub stale_fencing_tokens: u64,
    /// Spend requests answered 503 `lock-lost`.
    pub lock_lost: u64,
    /// 409s, 503s, other statuses and unanswered requests.
    pub errors: u64,
    /// Spend requests per second.
    pub throughput: f64,
    /// 99th percentile spend latency, ms.
    pub p99_ms: f64,
    /// Other audit findings (answers outside the contract, missing state).
    pub other_violations: usize,
    /// Why the cell did not run, if it did not.
    pub skipped: Option<String>,
}

/// Why the matrix could not run.
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    /// A process could not be started, or did not come up.
    #[error("{0}")]
    Setup(String),
    /// A cell's run failed.
    #[error(transparent)]
    Run(#[from] crate::run::RunError),
}

/// A child process, killed on drop.
#[derive(Debug)]
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16, MatrixError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|error| MatrixError::Setup(format!("no free port: {error}")))
}

/// The processes the matrix runs, and how to reach them: three payonce instances on free
/// loopback ports (and three `redis-server`s for Redlock, when there is one to start).
/// Everything it started is killed when it is dropped. Public so that tests can kill an
/// instance under load too.
#[derive(Debug)]
pub struct Cluster {
    payonce: PathBuf,
    environment: Vec<(String, String)>,
    ports: Vec<u16>,
    instances: Vec<Process>,
    redlock_urls: Vec<String>,
    _redlock_nodes: Vec<Process>,
    namespace: String,
    redis_url: String,
}

impl Cluster {
    /// Starts the processes (the instances with `lock_ttl` as their lock lease) and waits
    /// until every instance is ready. Only `payonce`, `database_url` and `redis_url` of
    /// the options are used.
    pub async fn start(options: &MatrixOptions, lock_ttl: Duration) -> Result<Self, MatrixError> {
        // The unsafe strategies exist only in a build with the demonstration: without it
        // every cell would be a column of 400s.
        let version = Command::new(&options.payonce)
            .arg("--version")
            .output()
            .map_err(|error| {
                MatrixError::Setup(format!("{}: {error}", options.payonce.display()))
            })?;
        if !String::from_utf8_lossy(&version.stdout).contains("demo feature") {
            return Err(MatrixError::Setup(format!(
                "{} is built without the demonstration's strategies: \
                 cargo build --release -p api --features demo",
                options.payonce.display()
            )));
        }
        let mut redlock_nodes = Vec::new();
        let mut redlock_urls = Vec::new();
        for _ in 0..3 {
            let port = free_port()?;
            let child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            match child {
                Ok(child) => {
                    redlock_nodes.push(Process(child));
                    redlock_urls.push(format!("redis://127.0.0.1:{port}"));
                }
                // Without redis-server the redlock rows are skipped, not the matrix.
                Err(_) => break,
            }
        }
        if redlock_urls.len() < 3 {
            redlock_nodes.clear();
            redlock_urls.clear();
        }
        let namespace = format!(
            "matrix-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        let mut environment = vec![
            ("DATABASE_URL".to_owned(), options.database_url.clone()),
            ("REDIS_URL".to_owned(), options.redis_url.clone()),
            ("PAYONCE_REDIS_NAMESPACE".to_owned(), namespace.clone()),
            ("PAYONCE_DEMO".to_owned(), "true".to_owned()),
            (
                "PAYONCE_LOCK_TTL".to_owned(),
                format!("{}ms", lock_ttl.as_millis()),
            ),
            ("PAYONCE_LOCK_WAIT".to_owned(), "2s".to_owned()),
            ("RUST_LOG".to_owned(), "error".to_owned()),
        ];
        if !redlock_urls.is_empty() {
            environment.push(("PAYONCE_REDLOCK_URLS".to_owned(), redlock_urls.join(",")));
        }
        let mut cluster = Self {
            payonce: options.payonce.clone(),
            environment,
            ports: Vec::new(),
            instances: Vec::new(),
            redlock_urls,
            _redlock_nodes: redlock_nodes,
            namespace,
            redis_url: options.redis_url.clone(),
        };
        for _ in 0..3 {
            let port = free_port()?;
            cluster.ports.push(port);
            let process = cluster.spawn(port)?;
            cluster.instances.push(process);
        }
        for port in cluster.ports.clone() {
            cluster.wait_ready(port).await?;
        }
        Ok(cluster)
    }

    fn spawn(&self, port: u16) -> Result<Process, MatrixError> {
        Command::new(&self.payonce)
            .envs(self.environment.iter().map(|(name, value)| (name.as_str(), value.as_str())))
            .env("PAYONCE_ADDR", format!("127.0.0.1:{port}"))
            .env("PAYONCE_INSTANCE", format!("matrix-{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(Process)
            .map_err(|error| {
                MatrixError::Setup(format!(
                    "cannot start {} ({error}); build it with `cargo build --release -p api` or pass --payonce",
                    self.payonce.display()
                ))
            })
    }

    async fn wait_ready(&self, port: u16) -> Result<(), MatrixError> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let ready = client
                .get(format!("http://127.0.0.1:{port}/readyz"))
                .send()
                .await;
            if ready.is_ok_and(|answer| answer.status().is_success()) {
                return Ok(());
            }
            sleep(Duration::from_millis(50)).await;
        }
        Err(MatrixError::Setup(format!(
            "the instance on port {port} did not become ready"
        )))
    }

    /// The instances' base URLs.
    pub fn targets(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|port| format!("http://127.0.0.1:{port}"))
            .collect()
    }

    /// SIGKILL the instance (an index into [`targets`](Self::targets)), wait `down_for`,
    /// start it again on the same port, and wait until it is ready.
    pub async fn kill_and_restart(
        &mut self,
        index: usize,
        down_for: Duration,
    ) -> Result<(), MatrixError> {
        let port = self.ports[index];
        if let Some(process) = self.instances.get_mut(index) {
            let _ = process.0.kill();
            let _ = process.0.wait();
        }
        sleep(down_for).await;
        self.instances[index] = self.spawn(port)?;
        self.wait_ready(port).await
    }

    /// Stops the instance (an index into [`targets`](Self::targets)) whole with SIGSTOP
    /// for `stopped_for`, then continues it with SIGCONT.
    pub async fn stop_for(&self, index: usize, stopped_for: Duration) -> Result<(), MatrixError> {
        let pid = self.instances[index].0.id().to_string();
        let signal = |name: &str| -> Result<(), MatrixError> {
            let sent = Command::new("kill")
                .args([name, &pid])
                .status()
                .map_err(|error| MatrixError::Setup(format!("kill {name}: {error}")))?;
            if sent.success() {
                Ok(())
            } else {
                Err(MatrixError::Setup(format!("kill {name} {pid} failed")))
            }
        };
        signal("-STOP")?;
        sleep(stopped_for).await;
        signal("-CONT")
    }

    /// Loses the lock stores' data: the matrix's keys on REDIS_URL, everything on the
    /// Redlock nodes.
    async fn wipe_redis(&self) -> Result<(), MatrixError> {
        let setup = |error: redis::RedisError| MatrixError::Setup(format!("wiping Redis: {error}"));
        let mut connection = redis::Client::open(self.redis_url.as_str())
            .map_err(setup)?
            .get_multiplexed_async_connection()
            .await
            .map_err(setup)?;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.namespace))
            .query_async(&mut connection)
            .await
            .map_err(setup)?;
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut connection)
                .await
                .map_err(setup)?;
        }
        for url in &self.redlock_urls {
            let mut node = redis::Client::open(url.as_str())
                .map_err(setup)?
                .get_multiplexed_async_connection()
                .await
                .map_err(setup)?;
            let _: () = redis::cmd("FLUSHALL")
                .query_async(&mut node)
                .await
                .map_err(setup)?;
        }
        Ok(())
    }
}

/// The lease the matrix gives the instances: short, so a pause outlives it quickly.
const LOCK_TTL: Duration = Duration::from_millis(300);

/// The stop-the-world pause: longer than any lease in play — the TTL, and the whole second
/// the SETNX + EXPIRE recipe rounds it up to (EXPIRE counts in seconds).
const PAUSE: Duration = Duration::from_millis(1500);

/// The instance the `sigstop` fault stops, and for how long: five lock TTLs.
const STOPPED: usize = 2;
const STOP_FOR: Duration = Duration::from_millis(1500);

/// Runs the matrix; one row per strategy × fault, in order.
pub async fn run_matrix(
    options: &MatrixOptions,
    mut on_row: impl FnMut(&Row),
) -> Result<Vec<Row>, MatrixError> {
    let mut cluster = Cluster::start(options, LOCK_TTL).await?;
    let mut rows = Vec::new();
    for &strategy in &options.strategies {
        for &fault in &options.faults {
            let row = if strategy == Strategy::Redlock && cluster.redlock_urls.is_empty() {
                skipped(
                    strategy,
                    fault,
                    "redis-server not found for the Redlock nodes",
                )
            } else {
                run_cell(&mut cluster, options, strategy, fault).await?
            };
            on_row(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

fn skipped(strategy: Strategy, fault: Fault, why: &str) -> Row {
    Row {
        strategy,
        fault,
        requests: 0,
        double_spends: 0,
        money_spent_twice: 0,
        points_spent_twice: 0,
        overdrafts: 0,
        stale_fencing_tokens: 0,
        lock_lost: 0,
        errors: 0,
        throughput: 0.0,
        p99_ms: 0.0,
        other_violations: 0,
        skipped: Some(why.to_owned()),
    }
}

async fn run_cell(
    cluster: &mut Cluster,
    options: &MatrixOptions,
    strategy: Strategy,
    fault: Fault,
) -> Result<Row, MatrixError> {
    let seconds = Duration::from_secs_f64(options.seconds);
    let plan = match fault {
        Fault::Pause => Some(FaultPlan {
            header: format!("pause={}ms", PAUSE.as_millis()),
            share: 0.1,
            target: None,
        }),
        Fault::SlowCallout => Some(FaultPlan {
            header: "slow=20ms".into(),
            share: 1.0,
            target: None,
        }),
        Fault::ClockSkew => Some(FaultPlan {
            header: "clock-offset=5s".into(),
            share: 1.0,
            target: Some(0),
        }),
        // The instance to be stopped spends most of its time inside critical sections,
        // between its read and its write, so the stop finds it there.
        Fault::Sigstop => Some(FaultPlan {
            header: "slow=200ms".into(),
            share: 1.0,
            target: Some(STOPPED),
        }),
        Fault::None | Fault::InstanceKill | Fault::RedisWipe => None,
    };
    let run_options = RunOptions {
        targets: cluster.targets(),
        accounts: options.accounts,
        clients: options.clients,
        limit: Limit::Duration(seconds),
        // Under sigstop, no copies: a copy sent to the stopped instance would hold up a
        // client of a running one.
        duplicate_fraction: if fault == Fault::Sigstop { 0.0 } else { 0.1 },
        changed_fraction: 0.0,
        progress: false,
        mix: Mix {
            withdrawal: 0.6,
            draw: 0.25,
        },
        headers: vec![("payonce-strategy".to_owned(), strategy.name().to_owned())],
        fault: plan,
        // Under sigstop, only the stopped instance's own clients wait for it: the others
        // go on, take over its locks and write while it sleeps.
        sticky: fault == Fault::Sigstop,
        // The killed instance drops what it was answering: expected, in that cell only.
        expect_unanswered: fault == Fault::InstanceKill,
        // Each request is sent once: the table counts the errors each strategy and fault
        // cause (resends would hide them and stretch the cells past their time).
        retry: RetryPolicy::none(),
    };
    let stale_before = stale_tokens(&cluster.targets()).await;
    let result = match fault {
        Fault::InstanceKill => {
            let load = run(run_options);
            let kill = async {
                sleep(seconds.mul_f64(0.3)).await;
                cluster
                    .kill_and_restart(2, Duration::from_millis(300))
                    .await
            };
            let (result, killed) = tokio::join!(load, kill);
            killed?;
            result?
        }
        Fault::Sigstop => {
            let load = run(run_options);
            let stop = async {
                sleep(seconds.mul_f64(0.3)).await;
                cluster.stop_for(STOPPED, STOP_FOR).await
            };
            let (result, stopped) = tokio::join!(load, stop);
            stopped?;
            result?
        }
        Fault::RedisWipe => {
            let load = run(run_options);
            let wipe = async {
                sleep(seconds / 2).await;
                cluster.wipe_redis().await
            };
            let (result, wiped) = tokio::join!(load, wipe);
            wiped?;
            result?
        }
        _ => run(run_options).await?,
    };
    let mut row = row(strategy, fault, &result);
    row.stale_fencing_tokens = stale_after(&result, &stale_before);
    Ok(row)
}

const STALE_TOKENS: &str = "payonce_stale_fencing_tokens_total";

/// Each target's stale-token counter now (0 for a target that does not answer).
async fn stale_tokens(targets: &[String]) -> Vec<f64> {
    let Ok(api) = Api::new(targets.to_vec(), 1) else {
        return vec![0.0; targets.len()];
    };
    let mut counters = Vec::new();
    for target in 0..targets.len() {
        let metrics = api.metrics(target).await.unwrap_or_default();
        counters.push(counter(&metrics, STALE_TOKENS));
    }
    counters
}

fn counter(metrics: &[(String, f64)], name: &str) -> f64 {
    metrics
        .iter()
        .find(|(metric, _)| metric == name)
        .map_or(0.0, |(_, value)| *value)
}

/// The stale tokens counted during the run: each target's counter after, less before (an
/// instance restarted during the run counts from zero again).
fn stale_after(result: &RunResult, before: &[f64]) -> u64 {
    result
        .metrics
        .iter()
        .enumerate()
        .map(|(index, (_, metrics))| {
            let after = counter(metrics, STALE_TOKENS);
            let before = before.get(index).copied().unwrap_or(0.0);
            if after >= before {
                after - before
            } else {
                after
            }
        })
        .sum::<f64>()
        .round() as u64
}

/// The audit's findings that are about the ledger's money and points (the rest are about
/// answers: undeclared, unanswered, mismatched replays, missing state).
const LEDGER_FINDINGS: [ViolationKind; 7] = [
    ViolationKind::ExecutedTwice,
    ViolationKind::BalanceMismatch,
    ViolationKind::EntryMismatch,
    ViolationKind::EntriesDoNotAddUp,
    ViolationKind::UnknownEntry,
    ViolationKind::StaleWrite,
    ViolationKind::Negative,
];

/// A cell's row, from its run (the stale fencing tokens, read from the instances around
/// the run, are left at 0).
pub fn row(strategy: Strategy, fault: Fault, result: &RunResult) -> Row {
    let negative = result
        .violations
        .iter()
        .filter(|v| v.kind == ViolationKind::Negative)
        .count();
    let counts = &result.counts;
    let lock_lost = result
        .history
        .spends
        .iter()
        .flat_map(|spend| &spend.attempts)
        .filter(|attempt| {
            attempt.status == Some(503)
                && attempt.problem().is_some_and(|t| t.ends_with("lock-lost"))
        })
        .count() as u64;
    Row {
        strategy,
        fault,
        requests: counts.requests,
        double_spends: result.tallies.iter().map(|tally| tally.double_spends).sum(),
        money_spent_twice: result
            .tallies
            .iter()
            .map(|tally| (tally.final_balance - tally.expected_balance).max(0))
            .sum(),
        points_spent_twice: result
            .tallies
            .iter()
            .map(|tally| (tally.final_points - tally.expected_points).max(0))
            .sum(),
        overdrafts: result
            .tallies
            .iter()
            .filter(|tally| tally.expected_balance < 0 || tally.expected_points < 0)
            .count()
            + negative,
        stale_fencing_tokens: 0,
        lock_lost,
        errors: counts.conflict
            + counts.unavailable
            + counts.other
            + counts.transport_errors
            + counts.ticket_errors,
        throughput: counts.requests as f64 / result.elapsed.as_secs_f64().max(0.001),
        p99_ms: result.latency.value_at_quantile(0.99) as f64 / 1000.0,
        other_violations: result
            .violations
            .iter()
            .filter(|v| !LEDGER_FINDINGS.contains(&v.kind))
            .count(),
        skipped: None,
    }
}

/// The table.
pub fn print_table(rows: &[Row], out: &mut impl std::io::Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<13} {:<14} {:>8} {:>13} {:>11} {:>12} {:>10} {:>12} {:>7} {:>8} {:>8}  note",
        "strategy",
        "fault",
        "requests",
        "double spends",
        "money twice",
        "points twice",
        "overdrafts",
        "stale tokens",
        "errors",
        "req/s",
        "p99 ms",
    )?;
    writeln!(out, "{}", "-".repeat(140))?;
    for row in rows {
        let note = match (&row.skipped, row.other_violations) {
            (Some(why), _) => format!("skipped: {why}"),
            (None, 0) => String::new(),
            (None, other) => format!("{other} other audit findings"),
        };
        writeln!(
            out,
            "{:<13} {:<14} {:>8} {:>13} {:>11} {:>12} {:>10} {:>12} {:>7} {:>8.0} {:>8.1}  {}",
            row.strategy.name(),
            row.fault.name(),
            row.requests,
            row.double_spends,
            row.money_spent_twice,
            row.points_spent_twice,
            row.overdrafts,
            row.stale_fencing_tokens,
            row.errors,
            row.throughput,
            row.p99_ms,
            note
        )?;
    }
    Ok(())
}

/// `{"rows": [...]}`.
pub fn write_json(rows: &[Row], path: &Path) -> std::io::Result<()> {
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(
        path,
        serde_json::to_vec_pretty(&serde_json::json!({ "rows": rows }))?,
    )
}

/// The matrix as a grid: one cell per strategy × fault, red with the count where the audit
/// found double spends, green where it found none, grey where the cell was skipped.
pub fn draw_chart(rows: &[Row], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent)?;
    }
    let mut strategies: Vec<Strategy> = Vec::new();
    let mut faults: Vec<Fault> = Vec::new();
    for row in rows {
        if !strategies.contains(&row.strategy) {
            strategies.push(row.strategy);
        }
        if !faults.contains(&row.fault) {
            faults.push(row.fault);
        }
    }
    let (cell_w, cell_h, left, top) = (180, 48, 130, 70);
    let width = left + cell_w * faults.len() as u32 + 20;
    let height = top + cell_h * strategies.len() as u32 + 40;
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = ("sans-serif", 20).into_font();
    root.draw(&Text::new(
        "Double spends found by the audit, per strategy × fault",
        (10, 10),
        title,
    ))?;
    let label = ("sans-serif", 15).into_font();
    for (column, fault) in faults.iter().enumerate() {
        let x = left + column as u32 * cell_w;
        root.draw(&Text::new(
            fault.name(),
            (x as i32 + 8, top as i32 - 24),
            label.clone(),
        ))?;
    }
    for (line, strategy) in strategies.iter().enumerate() {
        let y = top + line as u32 * cell_h;
        root.draw(&Text::new(
            strategy.name(),
            (10, y as i32 + 16),
            label.clone(),
        ))?;
        for (column, fault) in faults.iter().enumerate() {
            let x = left + column as u32 * cell_w;
            let found = rows
                .iter()
                .find(|row| row.strategy == *strategy && row.fault == *fault);
            let (color, text) = match found {
                Some(row) if row.skipped.is_some() => {
                    (RGBColor(200, 200, 200), "skipped".to_owned())
                }
                Some(row) if row.double_spends > 0 || row.overdrafts > 0 => (
                    RGBColor(220, 70, 60),
                    format!(
                        "{} double spends|{} money, {} pts",
                        row.double_spends, row.money_spent_twice, row.points_spent_twice
                    ),
                ),
                Some(_) => (RGBColor(70, 160, 90), "none".to_owned()),
                None => (RGBColor(240, 240, 240), String::new()),
            };
            root.draw(&Rectangle::new(
                [
                    (x as i32, y as i32),
                    ((x + cell_w - 4) as i32, (y + cell_h - 4) as i32),
                ],
                color.filled(),
            ))?;
            for (line, part) in text.split('|').enumerate() {
                let position = (x as i32 + 8, y as i32 + 8 + 17 * line as i32);
                root.draw(&Text::new(
                    part.to_owned(),
                    position,
                    label.clone().color(&WHITE),
                ))?;
            }
        }
    }
    root.present()?;
    Ok(())
}
