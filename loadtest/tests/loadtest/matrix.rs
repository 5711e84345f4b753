//! The strategies × faults matrix at small sizes: the broken recipes show their failure
//! where they are known to, and the fenced strategy never spends twice.

use std::path::PathBuf;
use std::process::Command;

use ledger::testing::TestDatabase;
use loadtest::matrix::{Fault, MatrixOptions, Row, Strategy, run_matrix};

/// The payonce binary beside this test's (cargo builds it for the workspace's tests —
/// with the demonstration's strategies under `--all-features`, as `scripts/test.sh` runs
/// them); built here, with them, if a narrower `cargo test` did not.
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

async fn cells(strategy: Strategy, faults: &[Fault]) -> Vec<Row> {
    let database = TestDatabase::postgres().await.unwrap();
    let options = MatrixOptions {
        payonce: payonce(),
        database_url: database.url().to_owned(),
        redis_url: std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
        seconds: 2.0,
        clients: 12,
        accounts: 3,
        strategies: vec![strategy],
        faults: faults.to_vec(),
    };
    run_matrix(&options, |_| {}).await.unwrap()
}

/// No lock: plain concurrency is enough to spend money twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_lock_spends_twice_under_plain_concurrency() {
    let rows = cells(Strategy::None, &[Fault::None]).await;
    assert!(rows[0].double_spends > 0, "{rows:#?}");
    assert!(rows[0].money_spent_twice > 0, "{rows:#?}");
}

/// A Redis lock without fencing spends twice when a holder pauses past its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_lock_without_fencing_spends_twice_under_a_pause() {
    let rows = cells(Strategy::Redis, &[Fault::Pause]).await;
    assert!(rows[0].double_spends > 0, "{rows:#?}");
}

/// A lock without fencing spends twice when a whole instance is stopped (SIGSTOP) past
/// its leases and then continued: its renewals stopped with it, others took its locks,
/// and its stale writes landed when it woke.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_lock_without_fencing_spends_twice_under_sigstop() {
    let rows = cells(Strategy::Redis, &[Fault::Sigstop]).await;
    assert!(rows[0].double_spends > 0, "{rows:#?}");
}

/// The fenced strategy spends nothing twice under any fault, and every answer it gives is
/// one the contract declares. Under the pause, that is fencing's doing — not merely the
/// ledger's conditional update, which alone would also refuse an overdraft: paused holders
/// woke up and wrote with tokens older than their successors', the ledger refused those
/// writes (the instances count them as stale fencing tokens) and the clients were answered
/// 503 `lock-lost`. Without fencing those writes would have landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fenced_never_spends_twice() {
    let rows = cells(Strategy::Fenced, &Fault::ALL).await;
    assert_eq!(rows.len(), Fault::ALL.len());
    for row in &rows {
        assert!(row.requests > 0, "{row:#?}");
        assert_eq!(
            (
                row.double_spends,
                row.overdrafts,
                row.money_spent_twice,
                row.points_spent_twice
            ),
            (0, 0, 0, 0),
            "{row:#?}"
        );
        assert_eq!(row.other_violations, 0, "{row:#?}");
    }
    let pause = rows.iter().find(|row| row.fault == Fault::Pause).unwrap();
    assert!(
        pause.stale_fencing_tokens > 0,
        "fencing never refused a write: {pause:#?}"
    );
    assert!(pause.lock_lost > 0, "no lock-lost answer: {pause:#?}");
    let stopped = rows.iter().find(|row| row.fault == Fault::Sigstop).unwrap();
    assert!(
        stopped.stale_fencing_tokens > 0,
        "fencing never refused a stopped instance's write: {stopped:#?}"
    );
}
