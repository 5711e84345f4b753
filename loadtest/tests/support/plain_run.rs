//! A load test run with nothing asked of it beyond its load, shared by the load test's
//! tests, its webhook benchmark and the matrix's tests (each includes this file).

use std::time::Duration;

use loadtest::retry::RetryPolicy;
use loadtest::run::{Limit, Mix, RunOptions};

/// `(accounts, clients)` against `targets` until `limit`, with `mix`: no spend sent twice,
/// no progress bar; no headers, faults or bank; each client turning through the targets,
/// every request expected to be answered, the default retries; 30 s to drain; no webhook
/// receiver. Each caller sets what it runs otherwise.
pub fn plain_run(
    targets: Vec<String>,
    (accounts, clients): (usize, usize),
    limit: Limit,
    mix: Mix,
) -> RunOptions {
    RunOptions {
        targets,
        accounts,
        clients,
        limit,
        duplicate_fraction: 0.0,
        changed_fraction: 0.0,
        progress: false,
        mix,
        headers: Vec::new(),
        fault: None,
        bank_fault: None,
        sticky: false,
        expect_unanswered: false,
        retry: RetryPolicy::default(),
        bank: None,
        drain: Duration::from_secs(30),
        webhooks: None,
    }
}
