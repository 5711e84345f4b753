//! The dispatcher's row pair: payouts sent on to a real `payonce-bank` by three payonce
//! instances, with payonce's **one key** per payout and with a **fresh key per attempt**
//! (the demonstration's recipe, as clients without a key scheme do), under the faults that
//! leave the caller not knowing whether the bank paid:
//!
//! - `commit-then-drop`: the bank executes a third of the transfers and closes the
//!   connection without answering;
//! - `commit-then-slow`: it executes a third and answers after the caller's timeout;
//! - `instance-kill`: every transfer is answered 600 ms after the bank executed it, and the
//!   third instance is killed (SIGKILL) mid-run once the ledger shows it holding claimed
//!   payouts — with calls in flight — and restarted;
//!   its leased payouts are taken over by the others once their leases end.
//!
//! Each cell has a bank, a Redis and instances of its own. The load test's load is mostly
//! payouts; its audit drains them, then reconciles with the bank: a payout executed twice
//! at the bank (under any keys) is money paid out twice.

use std::path::Path;
use std::time::Duration;

use loadtest::audit::ViolationKind;
use loadtest::retry::RetryPolicy;
use loadtest::run::{Limit, Mix, RunOptions, RunResult, run};
use serde::Serialize;
use tokio::time::sleep;

use bank::testing::BankProcess;

use crate::MatrixError;
use crate::cluster::{Cluster, base_environment, claims_held, paying_out_to};
use crate::services::{Servers, Service};

/// Which key the dispatcher sends each attempt with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Keys {
    /// payonce's: one key per payout, on every attempt.
    OneKey,
    /// A new key on every attempt.
    FreshKeyPerAttempt,
}

impl Keys {
    /// Both, in the table's order.
    pub const ALL: [Keys; 2] = [Keys::OneKey, Keys::FreshKeyPerAttempt];

    /// Its name in the table and in `PAYONCE_PAYOUT_KEYS`.
    pub fn name(self) -> &'static str {
        match self {
            Self::OneKey => "one-key",
            Self::FreshKeyPerAttempt => "fresh-key-per-attempt",
        }
    }
}

/// What goes wrong between a payout's call and its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BankFault {
    /// The bank executes, then drops the connection.
    CommitThenDrop,
    /// The bank executes, then answers after the caller's timeout.
    CommitThenSlow,
    /// The calling instance dies mid-call.
    InstanceKill,
}

impl BankFault {
    /// Every fault, in the table's order.
    pub const ALL: [BankFault; 3] = [
        BankFault::CommitThenDrop,
        BankFault::CommitThenSlow,
        BankFault::InstanceKill,
    ];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::CommitThenDrop => "commit-then-drop",
            Self::CommitThenSlow => "commit-then-slow",
            Self::InstanceKill => "instance-kill",
        }
    }

    /// The bank's flags for it.
    fn bank_flags(self) -> &'static [&'static str] {
        match self {
            Self::CommitThenDrop => &["--fault-commit-then-drop", "0.3"],
            Self::CommitThenSlow => &["--fault-commit-then-slow", "0.3", "--slow-for", "1s"],
            // Every call stays in flight for 600 ms after the money moved: the kill finds
            // some.
            Self::InstanceKill => &["--fault-commit-then-slow", "1", "--slow-for", "600ms"],
        }
    }

    /// The instances' bank timeout and payout lease (at least three timeouts, as payonce
    /// requires).
    fn timeout_and_lease(self) -> (Duration, Duration) {
        match self {
            Self::CommitThenDrop => (Duration::from_millis(500), Duration::from_millis(1500)),
            // Shorter than the bank's slow answer: every slow one times out.
            Self::CommitThenSlow => (Duration::from_millis(300), Duration::from_millis(1000)),
            // Longer than it: only the kill cuts a call short.
            Self::InstanceKill => (Duration::from_secs(1), Duration::from_secs(3)),
        }
    }
}

/// One cell: a key scheme under a fault, and what the bank holds afterwards.
#[derive(Clone, Debug, Serialize)]
pub struct DispatchRow {
    /// The key scheme.
    pub keys: Keys,
    /// The fault.
    pub fault: BankFault,
    /// Seconds of load.
    pub seconds: f64,
    /// Payouts accepted.
    pub payouts: usize,
    /// Of those, `succeeded`.
    pub succeeded: usize,
    /// `failed`, their money given back.
    pub failed: usize,
    /// Still `pending` after the drain.
    pub pending: usize,
    /// Transfers the bank executed for them.
    pub executed_at_bank: usize,
    /// Executions beyond the first of one payout: money paid out twice.
    pub paid_twice: usize,
    /// `succeeded` payouts without an executed transfer at the bank.
    pub missing_at_bank: usize,
    /// `failed` payouts the bank executed.
    pub reversed_but_executed: usize,
    /// The most calls to the bank one payout took.
    pub most_attempts: u32,
    /// Seconds the payouts took to drain after the load.
    pub drain_seconds: f64,
    /// Audit findings other than the three above (answers outside the contract, ledger
    /// findings).
    pub other_violations: usize,
    /// Why the cell did not run, if it did not.
    pub skipped: Option<String>,
}

impl DispatchRow {
    fn skipped(keys: Keys, fault: BankFault, why: String) -> Self {
        Self {
            keys,
            fault,
            seconds: 0.0,
            payouts: 0,
            succeeded: 0,
            failed: 0,
            pending: 0,
            executed_at_bank: 0,
            paid_twice: 0,
            missing_at_bank: 0,
            reversed_but_executed: 0,
            most_attempts: 0,
            drain_seconds: 0.0,
            other_violations: 0,
            skipped: Some(why),
        }
    }

    /// Whether money left twice, or its record disagrees with the bank.
    pub fn paid_wrongly(&self) -> bool {
        self.paid_twice > 0 || self.missing_at_bank > 0 || self.reversed_but_executed > 0
    }

    fn from_run(keys: Keys, fault: BankFault, seconds: f64, result: &RunResult) -> Self {
        let tally = &result.payouts;
        let bank_findings = [
            ViolationKind::PaidTwice,
            ViolationKind::MissingAtBank,
            ViolationKind::ReversedButExecuted,
        ];
        Self {
            keys,
            fault,
            seconds,
            payouts: tally.payouts,
            succeeded: tally.succeeded,
            failed: tally.failed,
            pending: tally.pending,
            executed_at_bank: tally.executed_at_bank,
            paid_twice: tally.executed_twice,
            missing_at_bank: tally.missing_at_bank,
            reversed_but_executed: tally.reversed_but_executed,
            most_attempts: tally.most_attempts,
            drain_seconds: result
                .drained
                .map_or(0.0, |drained| drained.waited.as_secs_f64()),
            other_violations: result
                .violations
                .iter()
                .filter(|violation| !bank_findings.contains(&violation.kind))
                .count(),
            skipped: None,
        }
    }
}

/// What the pair needs: the binaries, the ledger, the load.
#[derive(Clone, Debug)]
pub struct DispatchOptions<'a> {
    /// The `payonce` binary, with the `demo` feature (the fresh-key recipe is in it).
    pub payonce: &'a Path,
    /// The `payonce-bank` binary.
    pub bank: &'a Path,
    /// PostgreSQL for the instances' ledger.
    pub database_url: &'a str,
    /// Seconds of load per cell.
    pub seconds: f64,
    /// Clients per cell.
    pub clients: usize,
    /// Accounts per cell.
    pub accounts: usize,
}

/// Runs every key scheme under every fault in `faults`; a cell that cannot be run is a row
/// saying why.
pub async fn run_dispatcher(
    options: &DispatchOptions<'_>,
    faults: &[BankFault],
    mut on_row: impl FnMut(&DispatchRow),
) -> Vec<DispatchRow> {
    let mut rows = Vec::new();
    for keys in Keys::ALL {
        for &fault in faults {
            let row = run_cell(options, keys, fault)
                .await
                .unwrap_or_else(|error| DispatchRow::skipped(keys, fault, error.to_string()));
            on_row(&row);
            rows.push(row);
        }
    }
    rows
}

/// One cell: a bank with the fault, a private Redis, three instances with the key scheme;
/// the load (with the kill beside it), the drain and the reconciliation.
async fn run_cell(
    options: &DispatchOptions<'_>,
    keys: Keys,
    fault: BankFault,
) -> Result<DispatchRow, MatrixError> {
    let bank = BankProcess::start(options.bank, fault.bank_flags())
        .await
        .map_err(MatrixError::Setup)?;
    let servers = Servers::start(Service::Redis.servers()).await?;
    let (timeout, lease) = fault.timeout_and_lease();
    let mut environment = base_environment(options.database_url, Duration::from_secs(1));
    environment.extend(servers.environment(Service::Redis, false));
    environment.extend(paying_out_to(&bank.url(), timeout, lease));
    environment.push(("PAYONCE_PAYOUT_KEYS".to_owned(), keys.name().to_owned()));
    let mut cluster = Cluster::start(options.payonce, vec![environment; 3]).await?;
    let load = Duration::from_secs_f64(options.seconds);
    let run_options = RunOptions {
        targets: cluster.targets(),
        accounts: options.accounts,
        clients: options.clients,
        limit: Limit::Duration(load),
        duplicate_fraction: 0.2,
        changed_fraction: 0.0,
        progress: false,
        mix: Mix {
            withdrawal: 0.1,
            draw: 0.0,
            order: 0.0,
            payout: 0.6,
            hold: 0.0,
        },
        headers: Vec::new(),
        fault: None,
        bank_fault: None,
        sticky: false,
        expect_unanswered: fault == BankFault::InstanceKill,
        // Clients resend what the killed instance left unanswered; the table counts the
        // bank's side, not the clients' errors.
        retry: RetryPolicy::default(),
        bank: Some(bank.url()),
        drain: Duration::from_secs(30),
        webhooks: None,
    };
    let result = if fault == BankFault::InstanceKill {
        let doomed = cluster.instance(crate::cells::STALLED);
        let kill = async {
            sleep(load.mul_f64(0.3)).await;
            // Killed while it holds claimed payouts, so that the kill finds calls in
            // flight whatever the timing (a kill between two batches would find none);
            // the bank executes a call as it arrives and holds the answer 600 ms, so a
            // moment after the claim the money has moved and the answer has not come.
            claims_held(options.database_url, &doomed, "payout", load.mul_f64(0.5)).await?;
            sleep(Duration::from_millis(100)).await;
            cluster
                .kill_and_restart(crate::cells::STALLED, Duration::from_millis(300))
                .await
        };
        let (result, killed) = tokio::join!(run(run_options), kill);
        killed?;
        result?
    } else {
        run(run_options).await?
    };
    Ok(DispatchRow::from_run(keys, fault, options.seconds, &result))
}
