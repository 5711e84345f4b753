//! The load test's auditor can fail (planted faults in recorded histories are flagged),
//! and a real run against real servers passes it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod audit;
mod end_to_end;
mod operations;
mod payouts;
#[path = "../support/plain_run.rs"]
mod plain_run;
mod webhooks;
