//! A short real run against real servers passes the audit.

use api::config::{Cli, Config};
use api::state::AppState;
use clap::Parser;
use ledger::testing::TestDatabase;
use loadtest::run::{BankFaultPlan, Limit, Mix, RunOptions, run};

pub fn config(args: &[&str]) -> Config {
    let mut argv = vec!["payonce"];
    argv.extend_from_slice(args);
    Cli::parse_from(argv).config
}

/// Starts one payonce server on a port-0 listener; returns its base URL.
pub async fn serve(config: Config) -> String {
    let state = AppState::connect(&config)
        .await
        .expect("the service starts");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(api::serve(
        listener,
        state,
        config.request_timeout,
        std::future::pending(),
    ));
    address
}

/// The end-to-end tests' load on `targets`: half the spends sent twice (two in five of
/// those changed), bounded by count rather than time, so that each kind in the mix is
/// drawn about as often on a slow machine as on a fast one (a payout is one spend in
/// twenty).
pub fn options(targets: Vec<String>) -> RunOptions {
    RunOptions {
        duplicate_fraction: 0.5,
        changed_fraction: 0.4,
        ..crate::plain_run::plain_run(targets, (4, 8), Limit::Requests(600), Mix::default())
    }
}

/// The bank `scripts/services.sh` runs for the tests (a real `payonce-bank` process).
pub fn shared_bank() -> String {
    std::env::var("PAYONCE_TEST_BANK_URL").unwrap_or_else(|_| "http://127.0.0.1:7700".into())
}

/// What instances of the distributed mode share in a test: a database of their own,
/// Redis under a namespace of their own, and the shared bank.
pub struct Distributed {
    pub database: TestDatabase,
    pub bank: String,
    redis: String,
    namespace: String,
}

impl Distributed {
    pub async fn new() -> Self {
        Self {
            database: TestDatabase::postgres().await.unwrap(),
            bank: shared_bank(),
            redis: std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
            namespace: format!("loadtest-{}", unique()),
        }
    }

    /// Starts an instance on these, paying out to the shared bank, with `extra` flags;
    /// returns its base URL.
    pub async fn serve(&self, extra: &[&str]) -> String {
        let mut flags = vec!["--bank-url", self.bank.as_str()];
        flags.extend_from_slice(extra);
        serve(self.config(&flags)).await
    }

    /// Starts an instance on these without a bank (whatever `PAYONCE_BANK_URL` says): it
    /// refuses every payout, 503 `payouts-unavailable`. Returns its base URL.
    pub async fn serve_without_a_bank(&self) -> String {
        let mut config = self.config(&[]);
        config.bank_url = None;
        serve(config).await
    }

    /// The configuration of an instance on these, with `extra` flags.
    fn config(&self, extra: &[&str]) -> Config {
        let mut flags = vec![
            "--database-url",
            self.database.url(),
            "--redis-url",
            &self.redis,
            "--redis-namespace",
            &self.namespace,
        ];
        flags.extend_from_slice(extra);
        config(&flags)
    }
}

/// Two instances on PostgreSQL + Redis, duplicates sent to both at once, paying out to the
/// shared `payonce-bank`: the audit passes, the run really exercised replays, refusals and
/// reuse, and every payout was settled and is at the bank once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_against_two_instances_passes_the_audit() {
    let shared = Distributed::new().await;
    let targets = vec![shared.serve(&[]).await, shared.serve(&[]).await];
    let result = run(RunOptions {
        bank: Some(shared.bank.clone()),
        ..options(targets)
    })
    .await
    .unwrap();
    assert!(result.violations.is_empty(), "{:#?}", result.violations);
    let payouts = &result.payouts;
    assert!(
        payouts.bank_read && payouts.payouts > 0 && payouts.pending == 0,
        "{payouts:?}, {:?}, stopped: {:?}",
        result.counts,
        result.payouts_stopped
    );
    assert_eq!(payouts.succeeded, payouts.executed_at_bank, "{payouts:?}");
    assert!(result.counts.accepted > 0, "{:?}", result.counts);
    assert!(
        result.counts.created > 0 && result.counts.replays > 0,
        "{:?}",
        result.counts
    );
    assert!(
        result.counts.payment_required > 0,
        "no refusals: {:?}",
        result.counts
    );
    assert!(
        result.counts.unprocessable > 0,
        "no reuse refused: {:?}",
        result.counts
    );
    assert_eq!(
        result.counts.other + result.counts.transport_errors,
        0,
        "{:?}",
        result.counts
    );
    assert_eq!(result.counts.ticket_errors, 0, "{:?}", result.counts);
    assert_eq!(
        result.history.tickets.len() as u64,
        result.counts.tickets,
        "every ticket request is recorded"
    );
    assert!(
        result.tallies.iter().all(|tally| tally.double_spends == 0),
        "{:#?}",
        result.tallies
    );
    // The accounts are funded so that about half the spends are refused.
    let refused = refused_share(&result.history);
    assert!(
        (0.3..=0.7).contains(&refused),
        "{:.2} of the withdrawals and draws refused",
        refused
    );
    let ledger = ledger::Ledger::open(shared.database.url(), &ledger::LedgerOptions::default())
        .await
        .unwrap();
    assert!(ledger.audit().await.unwrap().is_empty());
    let executions: f64 = result
        .metrics
        .iter()
        .flat_map(|(_, metrics)| metrics.iter())
        .filter(|(name, _)| name == "payonce_executions_total")
        .map(|(_, value)| value)
        .sum();
    assert!(
        executions > 0.0,
        "the targets' metrics were read: {:?}",
        result.metrics
    );
}

/// The embedded mode passes too, its payouts going to the bank it serves itself — asked to
/// commit and then drop its answer on every first call: each is sent again with its key,
/// met with the bank's stored answer, and paid once. A fifth of the spends are payouts and
/// every one carries the fault, so the resends the test asserts on do not hang on a draw
/// (at the default mix's 5 % a three-second run made three payouts, and half of three is
/// none one time in eight).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_against_the_embedded_mode_passes_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let mut embedded = config(&["--data-dir", &dir.path().display().to_string()]);
    // The test command exports DATABASE_URL and REDIS_URL; the embedded mode needs neither.
    embedded.database_url = None;
    embedded.redis_url = None;
    let result = run(RunOptions {
        bank_fault: Some(BankFaultPlan {
            fault: "commit-then-drop".into(),
            share: 1.0,
        }),
        mix: Mix {
            withdrawal: 0.2,
            payout: 0.2,
            ..Mix::default()
        },
        ..options(vec![serve(embedded).await])
    })
    .await
    .unwrap();
    assert!(result.violations.is_empty(), "{:#?}", result.violations);
    assert!(result.counts.replays > 0);
    assert!(result.payouts.most_attempts >= 2, "{:?}", result.payouts);
    assert_eq!(result.counts.ticket_errors, 0, "{:?}", result.counts);
    assert!(
        result.payouts.payouts > 0 && result.payouts.pending == 0,
        "{:?}",
        result.payouts
    );
}

/// Holds and refunds across two instances: holds placed, captured in part, voided,
/// captured and voided at once, captured as a one-second hold expires while the sweepers
/// (every 200 ms, on both instances) record expiries; captured holds and paid orders
/// refunded by two or three requests at once — with duplicates and resends like every
/// spend, and a webhook receiver. The audit passes (nothing resolved twice, no refund total
/// above its payment, available never negative, every event of it delivered), and the run
/// really saw each way a hold ends and refunds refused for going past the payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn holds_and_refunds_pass_the_audit() {
    use loadtest::history::SpendKind;

    let shared = Distributed::new().await;
    let flags = ["--hold-sweep", "200ms", "--webhook-allow-private"];
    let targets = vec![shared.serve(&flags).await, shared.serve(&flags).await];
    let result = run(RunOptions {
        mix: Mix {
            withdrawal: 0.2,
            draw: 0.0,
            order: 0.2,
            payout: 0.0,
            hold: 0.5,
        },
        webhooks: Some(loadtest::receiver::ReceiverFaults::default()),
        ..crate::plain_run::plain_run(targets, (4, 8), Limit::Requests(300), Mix::default())
    })
    .await
    .unwrap();
    assert!(result.violations.is_empty(), "{:#?}", result.violations);
    let history = &result.history;
    let answered = |kind: SpendKind, status: u16, problem: &str| {
        history
            .spends
            .iter()
            .filter(|spend| spend.kind == kind)
            .filter(|spend| {
                spend.attempts.iter().any(|attempt| {
                    attempt.status == Some(status)
                        && (problem.is_empty()
                            || attempt
                                .problem()
                                .is_some_and(|kind| kind.ends_with(problem)))
                })
            })
            .count()
    };
    let seen = [
        ("holds placed", answered(SpendKind::Hold, 201, "")),
        ("captures", answered(SpendKind::Capture, 200, "")),
        ("voids", answered(SpendKind::Void, 200, "")),
        (
            "resolutions refused",
            answered(SpendKind::Capture, 409, "hold-not-held")
                + answered(SpendKind::Void, 409, "hold-not-held"),
        ),
        ("refunds", answered(SpendKind::Refund, 201, "")),
        (
            "refunds refused past the payment",
            answered(SpendKind::Refund, 409, "refund-exceeds-payment"),
        ),
    ];
    let expired = result
        .final_state
        .holds
        .values()
        .filter(|hold| hold.state == "expired")
        .count();
    println!("{seen:?}, {expired} holds expired");
    for (what, count) in seen {
        assert!(count > 0, "no {what}: {seen:?}");
    }
    assert!(expired > 0, "no hold expired");
    let ledger = ledger::Ledger::open(shared.database.url(), &ledger::LedgerOptions::default())
        .await
        .unwrap();
    assert!(ledger.audit().await.unwrap().is_empty());
}

/// The share of withdrawals and draws whose outcome was a refusal (402), among those with
/// a definitive outcome.
fn refused_share(history: &loadtest::history::History) -> f64 {
    use loadtest::history::{Role, SpendKind};
    let (mut settled, mut refused) = (0_u32, 0_u32);
    for spend in history
        .spends
        .iter()
        .filter(|spend| spend.kind != SpendKind::Deposit)
    {
        let outcome = spend
            .attempts
            .iter()
            .filter(|attempt| attempt.role != Role::ChangedDuplicate)
            .find(|attempt| matches!(attempt.status, Some(201 | 202 | 402)));
        if let Some(outcome) = outcome {
            settled += 1;
            refused += u32::from(outcome.status == Some(402));
        }
    }
    f64::from(refused) / f64::from(settled.max(1))
}

pub fn unique() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}
