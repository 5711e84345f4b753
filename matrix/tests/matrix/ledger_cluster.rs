//! The ledger on a PostgreSQL cluster under Patroni (`scripts/ledger-cluster.sh`, each
//! node in a network namespace of its own) loses its primary under the load test's load,
//! with resending clients and payouts to a real bank:
//!
//! - synchronous replication, the primary killed: every outcome a client was given is in
//!   the ledger after the failover and replays when resent, no ticket executed twice, no
//!   transfer at the bank without its payout, nothing else the audit could find;
//! - synchronous replication, the synchronous standby killed: nobody notices — no
//!   request is told the database was unavailable or the outcome unknown, nothing lost;
//! - asynchronous replication, the primary cut off from its cluster while the third
//!   instance still reaches it: the old primary acknowledges writes no replica has, and
//!   the audit names them as acknowledged outcomes lost — the check finds what it is for.
//!
//! Run as root (namespaces); the script installs Patroni and HAProxy if they are missing.
//! The cluster is taken down at the end.

use std::path::Path;
use std::process::Command;

use matrix::ledger::{
    self, LedgerFault, LedgerOptions, LedgerRow, LocksOn, Replication, default_script,
};

/// Takes the cluster down when dropped — at the test's end, and on a panic half-way, so the
/// next run and CI find no namespaces or nodes left over.
struct TakenDown;

impl Drop for TakenDown {
    fn drop(&mut self) {
        let down = Command::new("bash")
            .arg(default_script())
            .arg("down")
            .status();
        assert!(
            std::thread::panicking() || down.is_ok_and(|status| status.success()),
            "ledger-cluster.sh down failed"
        );
    }
}

async fn one_cell(
    replication: Replication,
    fault: LedgerFault,
    payonce: &Path,
    bank: &Path,
) -> LedgerRow {
    let script = default_script();
    let options = LedgerOptions {
        payonce,
        bank,
        script: &script,
        seconds: 20.0,
        clients: 12,
        accounts: 6,
    };
    let mut rows = ledger::run_ledger(
        &options,
        &[(replication, LocksOn::Redis)],
        &[fault],
        |row| {
            eprintln!("{row:?}");
        },
    )
    .await;
    assert_eq!(rows.len(), 1);
    rows.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn synchronous_replication_loses_nothing_and_asynchronous_is_caught_losing() {
    let _turn = crate::ONE_AT_A_TIME.lock().await;
    let (payonce, bank) = (crate::payonce(), crate::bank());
    let taken_down = TakenDown;

    let sync = one_cell(Replication::Sync, LedgerFault::PrimaryKill, &payonce, &bank).await;
    let replica = one_cell(Replication::Sync, LedgerFault::ReplicaKill, &payonce, &bank).await;
    let asynchronous = one_cell(
        Replication::Async,
        LedgerFault::PrimaryPartition,
        &payonce,
        &bank,
    )
    .await;
    drop(taken_down);

    assert_eq!(sync.skipped, None, "{sync:?}");
    assert!(sync.requests > 0, "{sync:?}");
    assert!(!sync.lost_anything(), "{sync:?}");
    assert_eq!(sync.other_violations, 0, "{sync:?}");
    // The kill is noticed only when the leader's key expires: writes wait for it.
    assert!(sync.unserved_seconds > 0.0, "{sync:?}");

    assert_eq!(replica.skipped, None, "{replica:?}");
    assert!(!replica.lost_anything(), "{replica:?}");
    assert_eq!(replica.other_violations, 0, "{replica:?}");
    let database_said = |row: &LedgerRow| {
        row.answers_5xx
            .keys()
            .filter(|answer| {
                answer.ends_with("database-unavailable") || answer.ends_with("outcome-unknown")
            })
            .count()
    };
    assert_eq!(database_said(&replica), 0, "{replica:?}");
    // A primary's loss is told as such.
    assert!(database_said(&sync) > 0, "{sync:?}");

    assert_eq!(asynchronous.skipped, None, "{asynchronous:?}");
    // What the promoted replica never received shows as acknowledged outcomes gone, or as
    // payouts whose records went and that the bank then executed a second time: which of
    // the two a run catches depends on what was in flight when the link was cut.
    assert!(asynchronous.lost_anything(), "{asynchronous:?}");
}
