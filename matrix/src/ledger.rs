//! The ledger table: the ledger on a three-node PostgreSQL cluster under Patroni
//! (`scripts/ledger-cluster.sh`), with synchronous and with asynchronous replication,
//! under the faults that lose a primary:
//!
//! - `none`: the cluster's baseline;
//! - `primary-kill`: the primary's Patroni and postmaster get SIGKILL — a failover;
//! - `primary-stop`: every process of the primary's node is stopped (SIGSTOP) past
//!   Patroni's TTL, then continued — a zombie primary that wakes to find a successor;
//! - `primary-partition`: the primary's link to the cluster network (etcd, its replicas,
//!   the write endpoint's proxy) is taken down past the TTL and brought back, while the
//!   third payonce instance, whose `DATABASE_URL` is the cluster's side endpoint, still
//!   reaches it — the split brain: an old primary still taking writes;
//! - `replica-kill`: the synchronous standby (asynchronous: a replica) gets SIGKILL —
//!   nothing should notice but a pause while the primary names another standby.
//!
//! Each cell runs the load test's load (resending clients, payouts to a private bank, the
//! recheck of every acknowledged outcome after the run) against three payonce instances
//! on the cluster, injects the fault a fifth of the way in, and counts what the audit and
//! the bank show: acknowledged outcomes lost, tickets executed twice, transfers at the
//! bank for payouts the ledger does not have, and how long writes went unserved. An
//! asynchronous cell that catches nothing is run again, a bounded number of times: a loss
//! needs a commit in the replication lag at the moment of the fault.
//!
//! The lock rows put the locks on the same cluster: PostgreSQL advisory locks through the
//! write endpoint (session locks, which a failover drops) instead of a private Redis.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use loadtest::audit::ViolationKind;
use loadtest::history::{Attempt, Role, SpendRecord};
use loadtest::retry::RetryPolicy;
use loadtest::run::{Limit, Mix, RunOptions, RunResult, run};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::sleep;

use bank::testing::BankProcess;

use crate::MatrixError;
use crate::cluster::{Cluster, base_environment, paying_out_to};
use crate::services::{Servers, Service};

/// How the cluster replicates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Replication {
    /// Patroni's synchronous mode (strict), `synchronous_commit = on`.
    Sync,
    /// Asynchronous streaming replication.
    Async,
}

impl Replication {
    /// Both, in the table's order.
    pub const ALL: [Replication; 2] = [Replication::Sync, Replication::Async];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Async => "async",
        }
    }

    /// One of [`name`](Self::name)'s.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|row| row.name() == name)
    }
}

/// Where the instances' locks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LocksOn {
    /// A private Redis beside the cluster.
    Redis,
    /// PostgreSQL advisory locks on the cluster itself, through the write endpoint.
    #[serde(rename = "postgres-advisory")]
    Cluster,
}

impl LocksOn {
    /// Both, in the table's order.
    pub const ALL: [LocksOn; 2] = [LocksOn::Redis, LocksOn::Cluster];

    /// One of [`name`](Self::name)'s.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|locks| locks.name() == name)
    }

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::Cluster => "postgres-advisory",
        }
    }
}

/// What happens to the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LedgerFault {
    /// No fault: the cluster's baseline.
    None,
    /// SIGKILL to its Patroni and postmaster.
    PrimaryKill,
    /// SIGSTOP to every process of its node past the TTL, then SIGCONT.
    PrimaryStop,
    /// Its cluster link down past the TTL, then up.
    PrimaryPartition,
    /// SIGKILL to the synchronous standby's (or a replica's) Patroni and postmaster.
    ReplicaKill,
}

impl LedgerFault {
    /// Every fault, in the table's order.
    pub const ALL: [LedgerFault; 5] = [
        LedgerFault::None,
        LedgerFault::PrimaryKill,
        LedgerFault::PrimaryStop,
        LedgerFault::PrimaryPartition,
        LedgerFault::ReplicaKill,
    ];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::PrimaryKill => "primary-kill",
            Self::PrimaryStop => "primary-stop",
            Self::PrimaryPartition => "primary-partition",
            Self::ReplicaKill => "replica-kill",
        }
    }

    /// One of [`name`](Self::name)'s.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|fault| fault.name() == name)
    }
}

/// How long a stop or a cut lasts: past the cluster's TTL (10 s) with room for the
/// replica's promotion, so that the old primary comes back to a successor.
const STALL: Duration = Duration::from_secs(15);

/// How many times an asynchronous cell that caught nothing is run.
const ASYNC_TRIES: u32 = 3;

/// One cell.
#[derive(Clone, Debug, Serialize)]
pub struct LedgerRow {
    /// The replication.
    pub replication: Replication,
    /// Where the locks are.
    pub locks: LocksOn,
    /// The fault.
    pub fault: LedgerFault,
    /// Seconds of load.
    pub seconds: f64,
    /// Spend requests sent (every attempt).
    pub requests: u64,
    /// Outcomes clients were given that the ledger no longer holds.
    pub acknowledged_lost: usize,
    /// Tickets that executed more than once (during the load, or again when resent after
    /// it).
    pub executed_twice: usize,
    /// Executed transfers at the bank for payouts the ledger does not have.
    pub unknown_at_bank: usize,
    /// When the outcomes that were lost had been acknowledged, in seconds from the fault
    /// (earliest, latest): before it, the replication lag took them; after it, a primary
    /// that should no longer have been one gave them.
    pub lost_acknowledged_at: Option<(f64, f64)>,
    /// Double spends the audit counted in the ledger's entries (stale writes past a lock
    /// the failover dropped).
    pub double_spends: u64,
    /// The longest time no spend got a definitive answer, from the fault on.
    pub unserved_seconds: f64,
    /// What clients were told meanwhile: spend attempts answered 5xx, by status and
    /// problem type.
    pub answers_5xx: BTreeMap<String, u64>,
    /// Other audit findings.
    pub other_violations: usize,
    /// Runs it took (an asynchronous cell that catches nothing is run again).
    pub tries: u32,
    /// Why the cell did not run, if it did not.
    pub skipped: Option<String>,
}

impl LedgerRow {
    fn skipped(replication: Replication, locks: LocksOn, fault: LedgerFault, why: String) -> Self {
        Self {
            replication,
            locks,
            fault,
            seconds: 0.0,
            requests: 0,
            acknowledged_lost: 0,
            executed_twice: 0,
            unknown_at_bank: 0,
            lost_acknowledged_at: None,
            double_spends: 0,
            unserved_seconds: 0.0,
            answers_5xx: BTreeMap::new(),
            other_violations: 0,
            tries: 0,
            skipped: Some(why),
        }
    }

    /// Whether an acknowledged outcome was lost, a ticket executed twice, money left for
    /// a payout the ledger lost, or money was spent twice.
    pub fn lost_anything(&self) -> bool {
        self.acknowledged_lost > 0
            || self.executed_twice > 0
            || self.unknown_at_bank > 0
            || self.double_spends > 0
    }
}

/// Spend attempts answered 5xx during a cell, by status and problem type (`503
/// database-unavailable`: nothing was written; `503 outcome-unknown`: the commit was sent
/// and its answer lost; a 500 would be a bug).
fn answers_5xx(result: &RunResult) -> BTreeMap<String, u64> {
    let mut answers = BTreeMap::new();
    for attempt in result
        .history
        .spends
        .iter()
        .flat_map(|spend| &spend.attempts)
    {
        let Some(status @ 500..=599) = attempt.status else {
            continue;
        };
        let kind = attempt
            .problem()
            .and_then(|kind| kind.rsplit('/').next())
            .unwrap_or("(no problem type)");
        *answers.entry(format!("{status} {kind}")).or_insert(0) += 1;
    }
    answers
}

/// What the table needs.
#[derive(Clone, Debug)]
pub struct LedgerOptions<'a> {
    /// The `payonce` binary.
    pub payonce: &'a Path,
    /// The `payonce-bank` binary.
    pub bank: &'a Path,
    /// `scripts/ledger-cluster.sh`.
    pub script: &'a Path,
    /// Seconds of load per cell (at least the fault's stall and the failover).
    pub seconds: f64,
    /// Clients per cell.
    pub clients: usize,
    /// Accounts per cell.
    pub accounts: usize,
}

/// The script's `status`, as much as the matrix reads of it.
#[derive(Debug, Deserialize)]
struct Status {
    members: Vec<Member>,
    write_url: String,
    side_url: String,
}

#[derive(Debug, Deserialize)]
struct Member {
    name: String,
    role: String,
    pid: Option<u32>,
    patroni_pid: Option<u32>,
    namespace: String,
}

/// The ledger cluster, driven through its script.
struct LedgerCluster<'a> {
    script: &'a Path,
}

impl LedgerCluster<'_> {
    fn script(&self, args: &[&str]) -> Result<String, MatrixError> {
        let output = Command::new("bash")
            .arg(self.script)
            .args(args)
            .output()
            .map_err(|error| MatrixError::Setup(format!("{}: {error}", self.script.display())))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(MatrixError::Setup(format!(
                "ledger-cluster.sh {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }

    /// Up, whole, in `replication`: every member running (a killed one restarted and
    /// caught up).
    async fn up(&self, replication: Replication) -> Result<Status, MatrixError> {
        let args: &[&str] = match replication {
            Replication::Sync => &["up"],
            Replication::Async => &["up", "--async"],
        };
        tokio::task::block_in_place(|| self.script(args))?;
        self.status()
    }

    fn status(&self) -> Result<Status, MatrixError> {
        let text = tokio::task::block_in_place(|| self.script(&["status"]))?;
        serde_json::from_str(&text)
            .map_err(|error| MatrixError::Setup(format!("ledger-cluster.sh status: {error}")))
    }

    /// Injects the fault into the member that is primary now (or, for `replica-kill`,
    /// the synchronous standby, else a replica); returns once it is healed (a killed
    /// member stays dead: the next cell's `up` restarts it).
    async fn inject(&self, fault: LedgerFault) -> Result<(), MatrixError> {
        let status = self.status()?;
        let with_role = |roles: &[&str]| {
            roles
                .iter()
                .find_map(|role| status.members.iter().find(|member| member.role == *role))
        };
        let primary = with_role(&["leader"])
            .ok_or_else(|| MatrixError::Setup("the cluster has no primary".into()))?;
        let kill = |member: &Member| {
            let pids: Vec<String> = [member.patroni_pid, member.pid]
                .into_iter()
                .flatten()
                .map(|pid| pid.to_string())
                .collect();
            run_command("kill", &[&["-KILL".to_owned()], &pids[..]].concat())
        };
        match fault {
            LedgerFault::None => {}
            LedgerFault::PrimaryKill => kill(primary)?,
            LedgerFault::ReplicaKill => kill(
                with_role(&["sync_standby", "replica"])
                    .ok_or_else(|| MatrixError::Setup("the cluster has no replica".into()))?,
            )?,
            LedgerFault::PrimaryStop => {
                let pids = namespace_pids(&primary.namespace)?;
                run_command("kill", &[&["-STOP".to_owned()], &pids[..]].concat())?;
                sleep(STALL).await;
                // Every process that was stopped, even if the list changed meanwhile.
                run_command("kill", &[&["-CONT".to_owned()], &pids[..]].concat())?;
            }
            LedgerFault::PrimaryPartition => {
                let name = primary.name.clone();
                self.script(&["cut", &name])?;
                sleep(STALL).await;
                self.script(&["heal", &name])?;
            }
        }
        Ok(())
    }
}

fn run_command<S: AsRef<str>>(program: &str, args: &[S]) -> Result<(), MatrixError> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let status = Command::new(program)
        .args(&args)
        .status()
        .map_err(|error| MatrixError::Setup(format!("{program}: {error}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(MatrixError::Setup(format!(
            "{program} {} failed",
            args.join(" ")
        )))
    }
}

/// Every process in a network namespace.
fn namespace_pids(namespace: &str) -> Result<Vec<String>, MatrixError> {
    let output = Command::new("ip")
        .args(["netns", "pids", namespace])
        .output()
        .map_err(|error| MatrixError::Setup(format!("ip netns pids: {error}")))?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect())
}

/// The rows: each replication with the locks on each of `locks`, in that order.
pub fn rows(replications: &[Replication], locks: &[LocksOn]) -> Vec<(Replication, LocksOn)> {
    locks
        .iter()
        .flat_map(|&on| {
            replications
                .iter()
                .map(move |&replication| (replication, on))
        })
        .collect()
}

/// Runs every row under every fault; a cell that cannot be run is a row saying why.
pub async fn run_ledger(
    options: &LedgerOptions<'_>,
    rows: &[(Replication, LocksOn)],
    faults: &[LedgerFault],
    mut on_row: impl FnMut(&LedgerRow),
) -> Vec<LedgerRow> {
    let mut table = Vec::new();
    for &(replication, locks) in rows {
        for &fault in faults {
            // Only a lost primary can lose what it acknowledged.
            let may_lose = !matches!(fault, LedgerFault::None | LedgerFault::ReplicaKill);
            let tries = if replication == Replication::Async && may_lose {
                ASYNC_TRIES
            } else {
                1
            };
            let mut row = None;
            for attempt in 1..=tries {
                let mut ran = run_cell(options, replication, locks, fault)
                    .await
                    .unwrap_or_else(|error| {
                        LedgerRow::skipped(replication, locks, fault, format!("failed: {error}"))
                    });
                ran.tries = attempt;
                let done = ran.skipped.is_some() || ran.lost_anything();
                row = Some(ran);
                if done {
                    break;
                }
            }
            if let Some(row) = row {
                on_row(&row);
                table.push(row);
            }
        }
    }
    table
}

/// One cell: the cluster up in its mode, a bank, the locks, three instances (the third
/// on the side endpoint); the load with the fault beside it; the audit and the bank.
async fn run_cell(
    options: &LedgerOptions<'_>,
    replication: Replication,
    locks: LocksOn,
    fault: LedgerFault,
) -> Result<LedgerRow, MatrixError> {
    let cluster = LedgerCluster {
        script: options.script,
    };
    let status = cluster.up(replication).await?;
    let bank = BankProcess::start(options.bank, &[])
        .await
        .map_err(MatrixError::Setup)?;
    let redis = match locks {
        LocksOn::Redis => Some(Servers::start(Service::Redis.servers()).await?),
        LocksOn::Cluster => None,
    };
    let environment = |database_url: &str| {
        let mut environment = base_environment(database_url, Duration::from_secs(1));
        match &redis {
            Some(servers) => environment.extend(servers.environment(Service::Redis, false)),
            None => environment.push(("PAYONCE_LOCK_URL".to_owned(), database_url.to_owned())),
        }
        environment.extend(paying_out_to(
            &bank.url(),
            Duration::from_secs(1),
            Duration::from_secs(3),
        ));
        environment
    };
    let instances = Cluster::start(
        options.payonce,
        vec![
            environment(&status.write_url),
            environment(&status.write_url),
            environment(&status.side_url),
        ],
    )
    .await?;
    let load = Duration::from_secs_f64(options.seconds);
    let run_options = cell_load(options, instances.targets(), bank.url(), load);
    let fault_at = load.mul_f64(0.2);
    let injected = async {
        sleep(fault_at).await;
        cluster.inject(fault).await
    };
    let (result, injected) = tokio::join!(run(run_options), injected);
    injected?;
    let result = result?;
    let fault_ms = fault_at.as_millis() as u64;
    let unknown_at_bank = unknown_at_bank(&bank.url(), &result).await?;
    drop(instances);
    Ok(row_of(
        replication,
        locks,
        fault,
        options.seconds,
        &result,
        fault_ms,
        unknown_at_bank,
    ))
}

/// The load of a cell, for `load`: spends and payouts with duplicates, from clients that
/// resend with the same ticket.
fn cell_load(
    options: &LedgerOptions<'_>,
    targets: Vec<String>,
    bank_url: String,
    load: Duration,
) -> RunOptions {
    RunOptions {
        targets,
        accounts: options.accounts,
        clients: options.clients,
        limit: Limit::Duration(load),
        duplicate_fraction: 0.2,
        changed_fraction: 0.0,
        progress: false,
        mix: Mix {
            withdrawal: 0.5,
            draw: 0.1,
            order: 0.1,
            payout: 0.2,
            hold: 0.0,
        },
        headers: Vec::new(),
        fault: None,
        bank_fault: None,
        sticky: false,
        expect_unanswered: false,
        // Resending clients: what a failover left unanswered or `outcome-unknown` is sent
        // again with its ticket, and must replay or execute once.
        retry: RetryPolicy {
            max_attempts: 40,
            ..RetryPolicy::default()
        },
        bank: Some(bank_url),
        drain: Duration::from_secs(60),
        webhooks: None,
    }
}

fn row_of(
    replication: Replication,
    locks: LocksOn,
    fault: LedgerFault,
    seconds: f64,
    result: &RunResult,
    fault_ms: u64,
    unknown_at_bank: usize,
) -> LedgerRow {
    let counted = |kinds: &[ViolationKind]| {
        // Per ticket, or per account for a finding about a whole account (one lost).
        let mut tickets: Vec<(&str, Option<&str>)> = result
            .violations
            .iter()
            .filter(|violation| kinds.contains(&violation.kind))
            .map(|violation| (violation.account.as_str(), violation.ticket.as_deref()))
            .collect();
        tickets.sort();
        tickets.dedup();
        tickets.len()
    };
    let lost = [ViolationKind::AcknowledgedOutcomeLost];
    let twice = [ViolationKind::ExecutedTwice, ViolationKind::ExecutedAgain];
    let named: Vec<ViolationKind> = [&lost[..], &twice[..]].concat();
    LedgerRow {
        replication,
        locks,
        fault,
        seconds,
        requests: result
            .history
            .spends
            .iter()
            .map(|spend| spend.attempts.len() as u64)
            .sum(),
        acknowledged_lost: counted(&lost),
        executed_twice: counted(&twice),
        unknown_at_bank,
        lost_acknowledged_at: lost_acknowledged_at(result, fault_ms),
        double_spends: result.tallies.iter().map(|tally| tally.double_spends).sum(),
        unserved_seconds: unserved_after(result, fault_ms).as_secs_f64(),
        answers_5xx: answers_5xx(result),
        other_violations: result
            .violations
            .iter()
            .filter(|violation| !named.contains(&violation.kind))
            .count(),
        tries: 1,
        skipped: None,
    }
}

/// The earliest and latest time, in seconds from the fault, at which an outcome the
/// ledger lost had been given to a client (its first definitive answer).
fn lost_acknowledged_at(result: &RunResult, fault_ms: u64) -> Option<(f64, f64)> {
    let lost: std::collections::HashSet<&str> = result
        .violations
        .iter()
        .filter(|violation| violation.kind == ViolationKind::AcknowledgedOutcomeLost)
        .filter_map(|violation| violation.ticket.as_deref())
        .collect();
    let times: Vec<f64> = result
        .history
        .spends
        .iter()
        .filter(|spend| lost.contains(spend.ticket.as_str()))
        .filter_map(|spend| {
            spend
                .attempts
                .iter()
                .find(|attempt| acknowledged_during_load(spend, attempt))
        })
        .map(|attempt| {
            (attempt.sent_at_ms as f64 + attempt.latency_us as f64 / 1000.0 - fault_ms as f64)
                / 1000.0
        })
        .collect();
    let earliest = times.iter().copied().reduce(f64::min)?;
    let latest = times.iter().copied().reduce(f64::max)?;
    Some((earliest, latest))
}

/// Whether `attempt`, sent during the load (not the recheck after it), got an answer that
/// settles its ticket: the load test's own judgement of a definitive answer.
fn acknowledged_during_load(spend: &SpendRecord, attempt: &Attempt) -> bool {
    !matches!(attempt.role, Role::Recheck | Role::ChangedDuplicate)
        && loadtest::audit::is_definitive(spend.kind, attempt)
}

/// The longest stretch, from `fault_ms` into the run on, in which no spend of the load
/// got a definitive answer (it executed, or a stored refusal): how long writes were
/// unserved. Answers are placed at the time they came (sent + latency).
fn unserved_after(result: &RunResult, fault_ms: u64) -> Duration {
    let mut answered: Vec<u64> = result
        .history
        .spends
        .iter()
        .flat_map(|spend| {
            spend
                .attempts
                .iter()
                .filter(|attempt| acknowledged_during_load(spend, attempt))
                .map(|attempt| attempt.sent_at_ms + attempt.latency_us / 1000)
        })
        .filter(|&at| at >= fault_ms)
        .collect();
    answered.sort_unstable();
    let mut longest = 0;
    let mut previous = fault_ms;
    for at in answered {
        longest = longest.max(at - previous);
        previous = at;
    }
    Duration::from_millis(longest)
}

/// Executed transfers at the bank whose reference is no payout the ledger shows: money
/// out for a payout whose row a failover lost.
async fn unknown_at_bank(bank: &str, result: &RunResult) -> Result<usize, MatrixError> {
    let known: std::collections::HashSet<&str> = result
        .final_state
        .payouts
        .keys()
        .map(String::as_str)
        .collect();
    let http = reqwest::Client::new();
    let mut unknown = 0;
    let mut after = 0_i64;
    loop {
        let page: Value = http
            .get(format!("{bank}/v1/transfers?after={after}&limit=1000"))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|error| MatrixError::Setup(format!("the bank's transfers: {error}")))?
            .json()
            .await
            .map_err(|error| MatrixError::Setup(format!("the bank's transfers: {error}")))?;
        for transfer in page["transfers"].as_array().into_iter().flatten() {
            let executed = transfer["state"].as_str() == Some("executed");
            let reference = transfer["reference"].as_str().unwrap_or_default();
            if executed && !known.contains(reference) {
                unknown += 1;
            }
        }
        match page["next_after"].as_i64() {
            Some(next) => after = next,
            None => return Ok(unknown),
        }
    }
}

/// `scripts/ledger-cluster.sh` of this checkout.
pub fn default_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ledger-cluster.sh")
}
