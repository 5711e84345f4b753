//! Clients that retry: an instance killed (SIGKILL) mid-run and restarted costs no
//! violation when the clients resend, with the same ticket, what got no answer; without
//! resends, every request the dead instance left unanswered is one. The load pays out too,
//! to a `payonce-bank` of the test's own: the payouts the killed instance had claimed are
//! taken over by the others, and the bank holds each once.

use std::time::Duration;

use bank::testing::BankProcess;
use ledger::testing::TestDatabase;
use loadtest::audit::ViolationKind;
use loadtest::retry::RetryPolicy;
use loadtest::run::{Mix, RunOptions, RunResult, run};
use lock::testing::RedisServer;
use matrix::cluster::{Cluster, base_environment, paying_out_to};

/// How long the load lasts; the kill comes a third of the way in.
const LOAD: Duration = Duration::from_secs(3);

/// Three payonce instances (fenced, on a private Redis, 1 s lock lease: a lock the killed instance held is
/// free again before another instance's wait for it, 2 s, runs out), a short load with
/// `retry`, and the third instance killed with SIGKILL a second in and restarted 300 ms
/// later. Every transfer is answered 200 ms after the bank made it, so the kill finds calls
/// in flight.
async fn killed_mid_run(retry: RetryPolicy) -> RunResult {
    let _turn = crate::ONE_AT_A_TIME.lock().await;
    let database = TestDatabase::postgres().await.unwrap();
    let redis = RedisServer::start().unwrap();
    let slow = ["--fault-commit-then-slow", "1", "--slow-for", "200ms"];
    let bank = BankProcess::start(&crate::bank(), &slow).await.unwrap();
    let mut environment = base_environment(database.url(), Duration::from_secs(1));
    environment.push(("PAYONCE_LOCK_URL".to_owned(), redis.url()));
    environment.extend(paying_out_to(
        &bank.url(),
        Duration::from_secs(1),
        Duration::from_secs(3),
    ));
    let mut cluster = Cluster::start(&crate::payonce(), vec![environment; 3])
        .await
        .unwrap();
    let options = RunOptions {
        retry,
        bank: Some(bank.url()),
        ..crate::load(
            cluster.targets(),
            (4, 8),
            LOAD,
            Mix {
                withdrawal: 0.3,
                payout: 0.15,
                ..Mix::default()
            },
        )
    };
    let kill = async {
        tokio::time::sleep(LOAD / 3).await;
        cluster
            .kill_and_restart(2, Duration::from_millis(300))
            .await
    };
    let (result, killed) = tokio::join!(run(options), kill);
    killed.unwrap();
    result.unwrap()
}

/// The killed instance's unanswered requests — spends and ticket requests — all found
/// their answer on a resend: zero violations, resends happened (each to the next target),
/// and nothing was spent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_retries_an_instance_kill_leaves_no_violation() {
    let result = killed_mid_run(RetryPolicy::default()).await;
    assert!(result.violations.is_empty(), "{:#?}", result.violations);
    let unanswered = result.counts.transport_errors
        + result
            .history
            .tickets
            .iter()
            .filter(|ticket| ticket.status.is_none())
            .count() as u64;
    assert!(
        unanswered > 0,
        "the kill went unnoticed: {:?}",
        result.counts
    );
    assert!(
        result.counts.retries + result.counts.ticket_retries > 0,
        "{:?}",
        result.counts
    );
    let mut resends = 0;
    for spend in &result.history.spends {
        for pair in spend.attempts.windows(2) {
            if pair[1].role == pair[0].role && pair[1].attempt == pair[0].attempt + 1 {
                resends += 1;
                assert_ne!(pair[0].target, pair[1].target, "resent to the same target");
            }
        }
    }
    assert!(
        resends > 0,
        "no spend attempt beyond the first was recorded"
    );
    assert!(
        result.tallies.iter().all(|tally| tally.double_spends == 0),
        "{:#?}",
        result.tallies
    );
    assert!(result.counts.created > 0, "{:?}", result.counts);
    let payouts = &result.payouts;
    assert!(
        payouts.bank_read && payouts.payouts > 0 && payouts.pending == 0,
        "{payouts:?}"
    );
    assert_eq!(payouts.succeeded, payouts.executed_at_bank, "{payouts:?}");
}

/// The same kill with retries off: the requests the dead instance left unanswered are
/// violations — the test above can fail — and they are the only ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_retries_an_instance_kill_leaves_unanswered_requests() {
    let result = killed_mid_run(RetryPolicy::none()).await;
    assert!(
        result
            .violations
            .iter()
            .any(|violation| violation.kind == ViolationKind::Unanswered),
        "{:#?}",
        result.violations
    );
    assert!(
        result
            .violations
            .iter()
            .all(|violation| violation.kind == ViolationKind::Unanswered),
        "{:#?}",
        result.violations
    );
    assert_eq!(
        result.counts.retries + result.counts.ticket_retries,
        0,
        "{:?}",
        result.counts
    );
}
