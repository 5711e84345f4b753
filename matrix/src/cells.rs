//! The table's rows (a lock service, how the application guards with it, and what the
//! load races for), its columns (the faults), and how one cell is run and counted.

use std::future::Future;
use std::time::Duration;

use loadtest::audit::ViolationKind;
use loadtest::client::Api;
use loadtest::retry::RetryPolicy;
use loadtest::run::{FaultPlan, Limit, Mix, RunOptions, RunResult, run};
use serde::Serialize;
use tokio::time::sleep;

use crate::MatrixError;
use crate::cluster::Cluster;
use crate::services::{Servers, Service};

/// A fault the matrix injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Plain concurrency.
    None,
    /// A pause longer than the lease inside the critical section, renewal stopped.
    Pause,
    /// One instance stopped whole (SIGSTOP) past the lease, then continued.
    Sigstop,
    /// A slow call-out inside the critical section.
    SlowCallout,
    /// One instance's clock runs ahead.
    ClockSkew,
    /// One instance is killed and restarted mid-run.
    InstanceKill,
    /// The lock service restarts mid-run.
    StoreRestart,
    /// A master of the lock service is killed mid-run and its replica takes over.
    StoreFailover,
    /// One instance loses its connections to the lock service past the lease.
    Partition,
}

impl Fault {
    /// Every fault, in the table's order.
    pub const ALL: [Fault; 9] = [
        Fault::None,
        Fault::Pause,
        Fault::Sigstop,
        Fault::SlowCallout,
        Fault::ClockSkew,
        Fault::InstanceKill,
        Fault::StoreRestart,
        Fault::StoreFailover,
        Fault::Partition,
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
            Self::StoreRestart => "store-restart",
            Self::StoreFailover => "store-failover",
            Self::Partition => "partition",
        }
    }

    /// Parses a name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|fault| fault.name() == name)
    }
}

/// How the application uses the lock service before it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Guard {
    /// No lock: read, check, write.
    None,
    /// The classic SETNX then EXPIRE recipe; read-check-write.
    SetnxExpire,
    /// The classic GETSET timestamp recipe; read-check-write.
    Getset,
    /// The service's lock trusted alone: read-check-write under it, the fencing token
    /// ignored.
    Unfenced,
    /// The service's fencing token checked by the ledger in the write.
    Fenced,
}

impl Guard {
    /// Every guard, in the table's order.
    pub const ALL: [Guard; 5] = [
        Guard::None,
        Guard::SetnxExpire,
        Guard::Getset,
        Guard::Unfenced,
        Guard::Fenced,
    ];

    /// Its name in the table and on the command line: the name of the strategy it asks
    /// for.
    pub fn name(self) -> &'static str {
        Strategy::from(self).name()
    }

    /// Parses a name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|guard| guard.name() == name)
    }
}

/// The strategy a row asks payonce for, in `Payonce-Strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// No lock at all.
    None,
    /// SETNX then EXPIRE.
    SetnxExpire,
    /// The GETSET timestamp lock.
    Getset,
    /// The instance's lock service, its token ignored.
    Unfenced,
    /// Redlock over three Redis servers, no fencing.
    Redlock,
    /// The instance's lock service with the ledger's fencing check.
    Fenced,
}

impl Strategy {
    /// Its name in `Payonce-Strategy`.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::SetnxExpire => "setnx-expire",
            Self::Getset => "getset",
            Self::Unfenced => "unfenced",
            Self::Redlock => "redlock",
            Self::Fenced => "fenced",
        }
    }
}

/// The strategy a guard asks for from a lock service with fencing tokens (Redlock's
/// unfenced guard is [`Strategy::Redlock`]: see [`Line::strategy`]).
impl From<Guard> for Strategy {
    fn from(guard: Guard) -> Self {
        match guard {
            Guard::None => Self::None,
            Guard::SetnxExpire => Self::SetnxExpire,
            Guard::Getset => Self::Getset,
            Guard::Unfenced => Self::Unfenced,
            Guard::Fenced => Self::Fenced,
        }
    }
}

/// What a cell's load races for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Race {
    /// Withdrawals and lottery draws (and, in fenced rows, order payments) on a few
    /// accounts, under the account's lock: money or points spent twice.
    Spends,
    /// Paid orders and captured holds refunded by two or three requests at once, under the
    /// payment's lock: more given back than was paid. Holds are placed, captured (some of
    /// them as they expire, while the sweepers record expiries) and voided fenced in every
    /// row: those run fenced whatever the strategy, and the database settles a hold once
    /// on its own.
    Refunds,
}

impl Race {
    /// Every race, in the table's order.
    pub const ALL: [Race; 2] = [Race::Spends, Race::Refunds];

    /// Its name in the table and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Spends => "spends",
            Self::Refunds => "refunds",
        }
    }

    /// Parses a name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|race| race.name() == name)
    }
}

/// A row of the table: a lock service, a guard, and what the load races for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Line {
    /// The lock service.
    pub service: Service,
    /// How the application guards its write with it.
    pub guard: Guard,
    /// What the load races for.
    pub race: Race,
}

impl Line {
    /// Every row, in the table's order: no lock, the classic recipes, then each service
    /// unfenced and fenced (Redlock has no fencing token to check); each racing for
    /// spends, then for refunds.
    pub fn all() -> Vec<Line> {
        let mut guarded = vec![
            (Service::None, Guard::None),
            (Service::Redis, Guard::SetnxExpire),
            (Service::Redis, Guard::Getset),
        ];
        for service in Service::ALL {
            match service {
                Service::None => {}
                Service::Redlock => guarded.push((service, Guard::Unfenced)),
                _ => {
                    guarded.push((service, Guard::Unfenced));
                    guarded.push((service, Guard::Fenced));
                }
            }
        }
        guarded
            .into_iter()
            .flat_map(|(service, guard)| {
                Race::ALL.map(|race| Line::new(service, guard).racing(race))
            })
            .collect()
    }

    /// A row racing for spends.
    pub fn new(service: Service, guard: Guard) -> Self {
        Self {
            service,
            guard,
            race: Race::Spends,
        }
    }

    /// This row racing for `race` instead.
    pub fn racing(self, race: Race) -> Self {
        Self { race, ..self }
    }

    /// What payonce is asked for.
    pub fn strategy(self) -> Strategy {
        match (self.service, self.guard) {
            (Service::Redlock, Guard::Unfenced) => Strategy::Redlock,
            (_, guard) => Strategy::from(guard),
        }
    }

    /// The longest a holder that stopped renewing keeps this row's lock with leases of
    /// `ttl` (`None`: as long as its connection lives).
    pub fn lease_bound(self, ttl: Duration) -> Option<Duration> {
        match self.guard {
            // EXPIRE counts whole seconds.
            Guard::SetnxExpire => Some(Duration::from_secs(ttl.as_secs_f64().ceil() as u64)),
            Guard::None | Guard::Getset => Some(ttl),
            Guard::Unfenced | Guard::Fenced => self.service.lease_bound(ttl),
        }
    }

    /// Why `fault` means nothing for this row, if it does not.
    pub fn not_applicable(self, fault: Fault) -> Option<&'static str> {
        match fault {
            Fault::ClockSkew if self.guard != Guard::Getset => {
                Some("nothing in this row reads the instance's clock")
            }
            Fault::Pause
            | Fault::Sigstop
            | Fault::StoreRestart
            | Fault::StoreFailover
            | Fault::Partition
                if self.guard == Guard::None =>
            {
                Some("no lock to outlive or lose")
            }
            Fault::StoreFailover if !Servers::fail_over_applies(self.service.servers()) => {
                Some("one server, no replica to fail over to")
            }
            Fault::StoreRestart
                if matches!(self.service, Service::RedisCluster | Service::RedisSentinel) =>
            {
                Some("a replicated Redis's crash is a failover (store-failover)")
            }
            Fault::Partition
                if matches!(self.service, Service::RedisCluster | Service::RedisSentinel) =>
            {
                Some("no proxy between it and its clients (it tells them the addresses to use)")
            }
            _ => None,
        }
    }
}

/// One cell of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The lock service.
    pub service: Service,
    /// How the application guards its write with it.
    pub guard: Guard,
    /// What the load raced for.
    pub race: Race,
    /// What payonce was asked for (`Payonce-Strategy`).
    pub strategy: Strategy,
    /// The fault.
    pub fault: Fault,
    /// Seconds of load the cell ran (at least the matrix's; longer where the fault
    /// outlasts it).
    pub seconds: f64,
    /// Spend requests sent.
    pub requests: u64,
    /// Operations that moved money or points twice, or were accepted beyond what was
    /// affordable: each withdrawal or lottery draw whose effect a write decided on an
    /// older balance overwrote (its money or points left, yet are there to be spent
    /// again), plus each extra execution of one ticket. Counted by the audit from the
    /// ledger's entries and summed over the cell's accounts; see
    /// [`AccountTally::double_spends`](loadtest::audit::AccountTally::double_spends).
    pub double_spends: u64,
    /// Money the ledger holds beyond what the accepted operations leave (units spent
    /// without being deducted), summed over the accounts.
    pub money_spent_twice: i64,
    /// Points likewise: points the ledger holds beyond what the accepted draws leave.
    pub points_spent_twice: i64,
    /// Accounts whose accepted withdrawals (or draws) exceed everything they ever had,
    /// plus balances or points seen below zero.
    pub overdrafts: usize,
    /// Payments (orders, captured holds) whose executed refunds add up to more than they
    /// paid: money given back twice.
    pub refunded_too_much: usize,
    /// Writes the ledger refused for carrying an old fencing token during the cell
    /// (`payonce_stale_fencing_tokens_total`, summed over the instances): fencing at work.
    pub stale_fencing_tokens: u64,
    /// Spend requests answered 503 `lock-lost`.
    pub lock_lost: u64,
    /// 409s (but `order-already-paid`, `refund-exceeds-payment` and `hold-not-held`, due
    /// answers), 503s, other statuses, unanswered requests, and tickets or orders that
    /// could not be had.
    pub errors: u64,
    /// Spend requests per second.
    pub throughput: f64,
    /// 99th percentile spend latency, ms.
    pub p99_ms: f64,
    /// Other audit findings (answers outside the contract, missing state).
    pub other_violations: usize,
    /// What those findings were (a test's failure, and the JSON, say which).
    pub other_findings: Vec<loadtest::violation::Violation>,
    /// `store-failover`: how long the killed master's slots (or, behind Sentinel, the
    /// master) went unserved, ms.
    pub unserved_ms: Option<u64>,
    /// Why the cell did not run, if it did not.
    pub skipped: Option<String>,
}

impl Row {
    /// A cell that did not run, and why.
    pub fn skipped(line: Line, fault: Fault, why: &str) -> Self {
        Self {
            service: line.service,
            guard: line.guard,
            race: line.race,
            strategy: line.strategy(),
            fault,
            seconds: 0.0,
            requests: 0,
            double_spends: 0,
            money_spent_twice: 0,
            points_spent_twice: 0,
            overdrafts: 0,
            refunded_too_much: 0,
            stale_fencing_tokens: 0,
            lock_lost: 0,
            errors: 0,
            throughput: 0.0,
            p99_ms: 0.0,
            other_violations: 0,
            other_findings: Vec::new(),
            unserved_ms: None,
            skipped: Some(why.to_owned()),
        }
    }

    /// Whether the audit found money or points spent twice, an overdraft, or a payment
    /// refunded past what it paid.
    pub fn spent_twice(&self) -> bool {
        self.double_spends > 0 || self.overdrafts > 0 || self.refunded_too_much > 0
    }

    /// Its line.
    pub fn line(&self) -> Line {
        Line::new(self.service, self.guard).racing(self.race)
    }
}

/// The lease the matrix gives the instances: short, so a stall outlives it quickly.
pub const LOCK_TTL: Duration = Duration::from_millis(300);

/// The instance `sigstop` stops and `partition` cuts off.
pub const STALLED: usize = 2;

/// The longest a holder keeps `line`'s lock without renewing it; the TTL where that is
/// as long as its connection (PostgreSQL).
fn bound(line: Line) -> Duration {
    line.lease_bound(LOCK_TTL).unwrap_or(LOCK_TTL)
}

/// How long a pause, a stop or a partition lasts for `line`: its lease bound and 1.2 s
/// more (at least five lock TTLs).
pub fn stall(line: Line) -> Duration {
    bound(line) + Duration::from_millis(1200)
}

/// The settings of one cell's load.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Seconds of load (stretched where the fault needs longer).
    pub seconds: f64,
    /// Clients.
    pub clients: usize,
    /// Accounts (few: contention is the point).
    pub accounts: usize,
}

/// Runs one cell on a running cluster over `servers`: the load with the fault beside it,
/// then the row that says what came of it.
pub async fn run_cell(
    cluster: &mut Cluster,
    servers: &mut Servers,
    line: Line,
    fault: Fault,
    load: Load,
) -> Result<Row, MatrixError> {
    let stall = stall(line);
    let base = Duration::from_secs_f64(load.seconds);
    let fault_at = base.mul_f64(0.3);
    let seconds = cell_length(fault, base, fault_at, bound(line));
    let run_options = load_options(
        cluster,
        line,
        fault,
        load,
        seconds,
        fault_plan(fault, stall, line.race),
    );
    let stale_before = stale_tokens(&cluster.targets()).await;
    let mut unserved = None;
    let result = match fault {
        Fault::InstanceKill => {
            let kill = cluster.kill_and_restart(STALLED, Duration::from_millis(300));
            beside(run_options, fault_at, kill).await?
        }
        Fault::Sigstop => beside(run_options, fault_at, cluster.stop_for(STALLED, stall)).await?,
        Fault::Partition => {
            let cut = async {
                servers.partition();
                sleep(stall).await;
                servers.heal();
                Ok(())
            };
            beside(run_options, fault_at, cut).await?
        }
        Fault::StoreRestart => beside(run_options, seconds / 2, servers.restart()).await?,
        Fault::StoreFailover => {
            let fail_over = async {
                unserved = Some(servers.fail_over().await?);
                Ok(())
            };
            beside(run_options, fault_at, fail_over).await?
        }
        _ => run(run_options).await?,
    };
    let mut row = row(line, fault, &result);
    row.seconds = seconds.as_secs_f64();
    row.stale_fencing_tokens = stale_after(&result, &stale_before);
    row.unserved_ms = unserved.map(|unserved| unserved.as_millis() as u64);
    Ok(row)
}

/// How long a cell loads. Where one instance stalls, the others keep loading until its
/// leases have ended and a second more, so that they take over its locks while it cannot
/// write. (A pause needs no more: paused spends are spread over the run, and the run waits
/// for them.) A failover goes on loading until well after the replica took over.
fn cell_length(fault: Fault, base: Duration, fault_at: Duration, bound: Duration) -> Duration {
    match fault {
        Fault::Sigstop | Fault::Partition => base.max(fault_at + bound + Duration::from_secs(1)),
        Fault::StoreFailover => base.max(fault_at + Duration::from_secs(6)),
        _ => base,
    }
}

/// The `Payonce-Fault` header a fault sends, to which share of requests and which
/// instance; none for the faults done to processes and servers from outside.
fn fault_plan(fault: Fault, stall: Duration, race: Race) -> Option<FaultPlan> {
    match fault {
        // A tenth of the spends. Of the refunds, three tenths: only a paused refund whose
        // payment another refund reaches meanwhile can show anything, and a cell sends a
        // few dozen refunds where it sends hundreds of spends.
        Fault::Pause => Some(FaultPlan {
            header: format!("pause={}ms", stall.as_millis()),
            share: match race {
                Race::Spends => 0.1,
                Race::Refunds => 0.3,
            },
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
            header: "slow=500ms".into(),
            share: 1.0,
            target: Some(STALLED),
        }),
        // The instance to be cut off makes a call-out as long as the partition: a holder
        // the cut finds in its critical section cannot renew, its lease ends while the
        // call-out goes on, and its write comes after its successor's — unless it was
        // nearly done. (Renewal goes on trying: this is no pause.)
        Fault::Partition => Some(FaultPlan {
            header: format!("slow={}ms", stall.as_millis()),
            share: 1.0,
            target: Some(STALLED),
        }),
        Fault::None | Fault::InstanceKill | Fault::StoreRestart | Fault::StoreFailover => None,
    }
}

/// The load test's options for a cell of `line` under `fault`.
fn load_options(
    cluster: &Cluster,
    line: Line,
    fault: Fault,
    load: Load,
    seconds: Duration,
    plan: Option<FaultPlan>,
) -> RunOptions {
    let stalls_one = matches!(fault, Fault::Sigstop | Fault::Partition);
    RunOptions {
        targets: cluster.targets(),
        accounts: load.accounts,
        clients: load.clients,
        limit: Limit::Duration(seconds),
        // Where one instance stalls, no copies: a copy sent to it would hold up a client
        // of a running one.
        duplicate_fraction: if stalls_one { 0.0 } else { 0.1 },
        changed_fraction: 0.0,
        progress: false,
        mix: mix(line),
        headers: vec![(
            "payonce-strategy".to_owned(),
            line.strategy().name().to_owned(),
        )],
        fault: plan,
        bank_fault: None,
        // Where one instance stalls, only its own clients wait for it: the others go on,
        // take over its locks and write while it cannot.
        sticky: stalls_one,
        // The killed instance drops what it was answering: expected, in that cell only.
        expect_unanswered: fault == Fault::InstanceKill,
        // Each request is sent once: the table counts the errors each row and fault cause
        // (resends would hide them and stretch the cells past their time).
        retry: RetryPolicy::none(),
        bank: None,
        drain: Duration::ZERO,
        webhooks: None,
    }
}

/// What a cell of `line` spends. The instances have no bank (the dispatcher has rows of its
/// own): no payouts.
fn mix(line: Line) -> Mix {
    match line.race {
        // Order payments run fenced under the order's lock whatever the row, and take
        // their amount off the balance relatively. An unguarded spend of the same account,
        // holding the account's lock, writes back a balance it read before such a payment
        // and so gives the payment's money back: a flaw of the unguarded write that no lock
        // on the account can prevent, which would show in every unfenced cell, `none`
        // included. So only fenced rows pay orders here.
        Race::Spends => Mix {
            withdrawal: 0.6,
            draw: 0.25,
            order: if line.guard == Guard::Fenced {
                0.05
            } else {
                0.0
            },
            payout: 0.0,
            hold: 0.0,
        },
        // Only what moves money relatively (order payments, holds and their captures,
        // refunds' credits), so that nothing but a refund decided on a stale read can go
        // wrong: orders paid and, half of them, refunded by two or three requests at once;
        // holds placed and captured, voided or left to expire, the captured ones refunded
        // likewise.
        Race::Refunds => Mix {
            withdrawal: 0.0,
            draw: 0.0,
            order: 0.9,
            payout: 0.0,
            hold: 0.1,
        },
    }
}

/// The load, with `fault` injected `after` its start beside it.
async fn beside(
    options: RunOptions,
    after: Duration,
    fault: impl Future<Output = Result<(), MatrixError>>,
) -> Result<RunResult, MatrixError> {
    let injected = async {
        sleep(after).await;
        fault.await
    };
    let (result, injected) = tokio::join!(run(options), injected);
    injected?;
    Ok(result?)
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
const LEDGER_FINDINGS: [ViolationKind; 11] = [
    ViolationKind::ExecutedTwice,
    ViolationKind::BalanceMismatch,
    ViolationKind::EntryMismatch,
    ViolationKind::EntriesDoNotAddUp,
    ViolationKind::UnknownEntry,
    ViolationKind::StaleWrite,
    ViolationKind::Negative,
    ViolationKind::RefundedTooMuch,
    // An unguarded refund of a hold writes its refunded total over another's: the hold
    // then reads less refunded than its refunds gave back.
    ViolationKind::HoldMismatch,
    ViolationKind::HoldResolvedTwice,
    ViolationKind::AvailableMismatch,
];

/// A cell's row, from its run (the stale fencing tokens, read from the instances around
/// the run, and the seconds are left at 0).
pub fn row(line: Line, fault: Fault, result: &RunResult) -> Row {
    let negative = result
        .violations
        .iter()
        .filter(|v| v.kind == ViolationKind::Negative)
        .count();
    let counts = &result.counts;
    // Spend answers of one status and problem type.
    let answered = |status: u16, problem: &str| {
        result
            .history
            .spends
            .iter()
            .flat_map(|spend| &spend.attempts)
            .filter(|attempt| {
                attempt.status == Some(status)
                    && attempt.problem().is_some_and(|t| t.ends_with(problem))
            })
            .count() as u64
    };
    let lock_lost = answered(503, "lock-lost");
    let other_findings: Vec<_> = result
        .violations
        .iter()
        .filter(|v| !LEDGER_FINDINGS.contains(&v.kind))
        .cloned()
        .collect();
    // A duplicated order paid with a second ticket is refused by design, as are a refund
    // past what is still refundable and a capture or a void of a hold already settled:
    // answers, not errors.
    let refused_by_design = answered(409, "order-already-paid")
        + answered(409, "refund-exceeds-payment")
        + answered(409, "hold-not-held");
    Row {
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
        refunded_too_much: result
            .violations
            .iter()
            .filter(|v| v.kind == ViolationKind::RefundedTooMuch)
            .count(),
        lock_lost,
        errors: counts.conflict.saturating_sub(refused_by_design)
            + counts.order_errors
            + counts.unavailable
            + counts.other
            + counts.transport_errors
            + counts.ticket_errors,
        throughput: counts.requests as f64 / result.elapsed.as_secs_f64().max(0.001),
        p99_ms: result.latency.value_at_quantile(0.99) as f64 / 1000.0,
        other_violations: other_findings.len(),
        other_findings,
        skipped: None,
        ..Row::skipped(line, fault, "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guards keep their names, each the name of the strategy it asks for, save
    /// Redlock's unfenced row, which asks for Redlock.
    #[test]
    fn a_guard_is_named_as_the_strategy_it_asks_for() {
        assert_eq!(
            Guard::ALL.map(Guard::name),
            ["none", "setnx-expire", "getset", "unfenced", "fenced"]
        );
        for line in Line::all() {
            let strategy = line.strategy();
            if line.service == Service::Redlock && line.guard == Guard::Unfenced {
                assert_eq!(strategy, Strategy::Redlock);
            } else {
                assert_eq!(strategy.name(), line.guard.name());
            }
        }
    }
}
