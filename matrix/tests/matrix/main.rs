//! The matrix at small sizes, against real lock services, payonce instances and
//! PostgreSQL: unfenced locks show their failures where they are known to, fenced rows
//! never spend twice; and an instance killed under load.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cells;
mod dispatcher;
mod failover;
mod ledger_cluster;
#[path = "../../../loadtest/tests/support/plain_run.rs"]
mod plain_run;
mod retries;
mod webhooks;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use loadtest::run::{Limit, Mix, RunOptions};

/// One test at a time: each starts servers and instances of its own, and the cells'
/// timing (a stall against a lease, a kill against the load) is what is under test — a
/// 2-core machine running several at once would blur it.
pub(crate) static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The payonce binary beside this test's (cargo builds it for the workspace's tests —
/// with the demonstration's strategies under `--all-features`, as
/// `scripts/test.sh` runs them); built here, with them, if a narrower `cargo test` did
/// not.
pub(crate) fn payonce() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .to_path_buf();
    let binary = dir.join("payonce");
    let has_demo = || {
        Command::new(&binary)
            .arg("--version")
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("demo feature"))
    };
    if !has_demo() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = Command::new(cargo)
            .args([
                "build",
                "-p",
                "api",
                "--features",
                "demo",
                "--bin",
                "payonce",
            ])
            .status()
            .unwrap();
        assert!(built.success());
    }
    binary
}

/// The payonce-bank binary beside this test's.
pub(crate) fn bank() -> PathBuf {
    bank::testing::binary_for_tests()
}

/// The tests' load on `targets`: `(accounts, clients)` for `length`, with `mix`; a third
/// of the spends sent again (a fifth of those changed); otherwise a plain run
/// ([`plain_run::plain_run`]). Each test sets what it runs otherwise.
pub(crate) fn load(
    targets: Vec<String>,
    sizes: (usize, usize),
    length: Duration,
    mix: Mix,
) -> RunOptions {
    RunOptions {
        duplicate_fraction: 0.3,
        changed_fraction: 0.2,
        ..plain_run::plain_run(targets, sizes, Limit::Duration(length), mix)
    }
}
