//! payonce's lock services × guards × faults matrix: which lock service, used how, spends
//! money twice under which fault — measured, one table.
//!
//! For each lock service it starts private servers on loopback ports (never the shared
//! ones: it restarts and partitions them) and three payonce instances in the
//! demonstration mode over them, against `DATABASE_URL`; then for each row on that service
//! and each fault it opens fresh accounts, runs the load test's load with
//! `Payonce-Strategy` naming the row's strategy, injects the fault, and audits. The load
//! and the audit are the load test's ([`loadtest`], a pure HTTP client of the contract);
//! everything that starts, stops, restarts or cuts off a process lives here.
//!
//! Rows are a [`Service`] and a [`Guard`]: no lock; the classic recipes on Redis
//! (SETNX + EXPIRE, GETSET timestamps); then each service *unfenced* (the application
//! trusts the lock: read, check, write under it) and *fenced* (the ledger checks the
//! service's fencing token in the write). Columns are the [`Fault`]s:
//!
//! - `none`: plain concurrency;
//! - `pause`: a tenth of the spends pause inside the critical section past the lease,
//!   renewal stopped (a stop-the-world pause);
//! - `sigstop`: the third instance stopped whole (`kill -STOP`) past the lease, then
//!   continued; its spends make a 500 ms call-out inside the critical section, so the
//!   stop finds one holding a lock between its read and its write;
//! - `slow-callout`: every spend makes a 20 ms call-out inside the critical section;
//! - `clock-skew`: the first instance's clock runs 5 s ahead (only the timestamp lock
//!   reads it);
//! - `instance-kill`: the third instance is killed (SIGKILL) mid-run and restarted;
//! - `store-restart`: the lock service crashes and restarts mid-run — Redis (without
//!   persistence) and memcached come back empty, ZooKeeper, etcd and the databases keep
//!   their data and lose their sessions, connections and locks;
//! - `partition`: the third instance's connections to the lock service are cut past the
//!   lease (a loopback proxy stops forwarding; the server sees the connections end, the
//!   instance hears nothing), then restored; its spends make a call-out as long as the
//!   partition, so a holder the cut finds is overtaken while it cannot renew.
//!
//! A stall (pause, stop, partition) lasts past each service's own lease bound
//! ([`Service::lease_bound`]) by 1.2 s — at least five lock TTLs.
//!
//! # Map
//! - [`services`] (`services.rs`): the lock services, their private servers and proxies.
//! - [`cluster`] (`cluster.rs`): payonce instances as child processes.
//! - [`cells`] (`cells.rs`): rows, faults, one cell's run and count.
//! - [`dispatcher`] (`dispatcher.rs`): the payout dispatcher's row pair — one key per
//!   payout against a fresh key per attempt — under the bank's faults and an instance
//!   kill, reconciled at a real `payonce-bank`.
//! - [`ledger`] (`ledger.rs`): the ledger table — the ledger on a PostgreSQL cluster under
//!   Patroni (`scripts/ledger-cluster.sh`), synchronous and asynchronous replication, under
//!   the loss of its primary (killed, stopped, partitioned): acknowledged outcomes lost,
//!   tickets executed twice, money at the bank for payouts the ledger lost.
//! - [`report`] (`report.rs`): the tables, the JSON, the grid chart.
//! - `main.rs`: the `payonce-matrix` binary (`scripts/matrix.sh` runs it).

pub mod cells;
pub mod cluster;
pub mod dispatcher;
pub mod ledger;
pub mod report;
pub mod services;

use std::path::PathBuf;

pub use cells::{Fault, Guard, Line, Race, Row, Strategy};
use cells::{LOCK_TTL, Load};
use cluster::Cluster;
use services::Servers;
pub use services::Service;

/// Why the matrix could not run.
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    /// A process could not be started, or did not come up.
    #[error("{0}")]
    Setup(String),
    /// A cell's run failed.
    #[error(transparent)]
    Run(#[from] loadtest::run::RunError),
}

/// How to run the matrix.
#[derive(Clone, Debug)]
pub struct MatrixOptions {
    /// The `payonce` binary (built with the `demo` feature).
    pub payonce: PathBuf,
    /// PostgreSQL for the instances' ledger (a scratch database: the unsafe rows corrupt
    /// the accounts they touch, on purpose).
    pub database_url: String,
    /// Seconds of load per cell (stretched where a fault needs longer).
    pub seconds: f64,
    /// Clients per cell.
    pub clients: usize,
    /// Accounts per cell (few: contention is the point).
    pub accounts: usize,
    /// Which rows, in order.
    pub lines: Vec<Line>,
    /// Which faults.
    pub faults: Vec<Fault>,
}

/// The servers and instances of the service being run.
struct Stage {
    servers: Servers,
    service: Service,
    cluster: Cluster,
}

/// Starts `service`'s servers (or keeps `servers` where they are the right kind) and
/// three instances over them, the third through the proxies.
async fn stage(
    options: &MatrixOptions,
    service: Service,
    servers: Option<Servers>,
) -> Result<Stage, MatrixError> {
    let servers = match servers {
        Some(servers) if servers.kind() == service.servers() => servers,
        _ => Servers::start(service.servers()).await?,
    };
    let base = cluster::base_environment(&options.database_url, LOCK_TTL);
    let environments = (0..3)
        .map(|index| {
            let mut environment = base.clone();
            environment.extend(servers.environment(service, index == cells::STALLED));
            environment
        })
        .collect();
    let cluster = Cluster::start(&options.payonce, environments).await?;
    Ok(Stage {
        servers,
        service,
        cluster,
    })
}

/// Runs the matrix; one row per line × fault, in order. A service whose servers or
/// instances cannot be started (a package missing) has its cells skipped with the reason,
/// not the matrix.
pub async fn run_matrix(
    options: &MatrixOptions,
    mut on_row: impl FnMut(&Row),
) -> Result<Vec<Row>, MatrixError> {
    cluster::check_payonce(&options.payonce)?;
    let load = Load {
        seconds: options.seconds,
        clients: options.clients,
        accounts: options.accounts,
    };
    let mut rows = Vec::new();
    let mut current: Option<Stage> = None;
    let mut broken: Option<(Service, String)> = None;
    for &line in &options.lines {
        // The no-lock and Redlock rows run on the Redis instances.
        let service = match line.service {
            Service::None | Service::Redlock => Service::Redis,
            service => service,
        };
        if current
            .as_ref()
            .is_none_or(|stage| stage.service != service)
            && broken.as_ref().is_none_or(|(failed, _)| *failed != service)
        {
            let servers = current.take().map(|stage| stage.servers);
            match stage(options, service, servers).await {
                Ok(stage) => {
                    current = Some(stage);
                    broken = None;
                }
                Err(error) => broken = Some((service, error.to_string())),
            }
        }
        for &fault in &options.faults {
            let row = match (&mut current, &broken, line.not_applicable(fault)) {
                (_, _, Some(why)) => Row::skipped(line, fault, why),
                (_, Some((_, why)), _) => Row::skipped(line, fault, why),
                (Some(stage), None, None) => {
                    let cell =
                        cells::run_cell(&mut stage.cluster, &mut stage.servers, line, fault, load)
                            .await;
                    match cell {
                        Ok(row) => row,
                        // A cell that could not be run (a server that did not come back, a
                        // run that failed) is a row saying why, not the end of the matrix.
                        Err(error) => Row::skipped(line, fault, &format!("failed: {error}")),
                    }
                }
                (None, None, None) => Row::skipped(line, fault, "nothing was started"),
            };
            on_row(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}
