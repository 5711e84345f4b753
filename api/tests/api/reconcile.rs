//! `payonce reconcile`: the ledger's payouts against a real `payonce-bank` process — the
//! discrepancies planted at the bank are found, and on a running system, while payouts
//! are made, sent and settled between its reads, it finds none that are not there.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::helpers::{Backend, TestAccount, TestApp, spawn_app_with, spawn_with};
use crate::payouts::{TestBank, paying_to};

/// `payonce reconcile --bank URL`: clean (exit 0) when every succeeded payout is at the
/// bank once with its amount and pending ones are listed; a transfer payonce does not
/// know, a second transfer for a payout under a fresh key, or a succeeded payout the bank
/// does not have, each make it exit 1 and say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconcile_finds_what_the_ledger_and_the_bank_disagree_on() {
    let bank = TestBank::plain().await;
    let app = spawn_app_with(Backend::Distributed, &paying_to(&bank, "500ms", "2s")).await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 200).await;
    app.settled(&account, &payout).await;
    let url = app.shared.database.url().to_owned();
    let run = |bank_url: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_payonce"))
            .args(["reconcile", "--bank", bank_url])
            .env("DATABASE_URL", &url)
            .env_remove("REDIS_URL")
            .env_remove("PAYONCE_BANK_URL")
            .output()
            .expect("payonce runs")
    };
    let clean = run(&bank.url);
    let said = String::from_utf8_lossy(&clean.stdout).into_owned();
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{said}{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    assert!(
        said.contains("reconciled: 1 payouts, 1 transfers executed"),
        "{said}"
    );

    // Against a bank that never saw it: the succeeded payout is missing there.
    let empty = TestBank::plain().await;
    let missing = run(&empty.url);
    let said = String::from_utf8_lossy(&missing.stdout).into_owned();
    assert_eq!(missing.status.code(), Some(1), "{said}");
    assert!(said.contains("the bank has no transfer for it"), "{said}");

    // A second transfer for the same payout under a fresh key, and a stranger's.
    for (key, reference) in [("fresh-key-1", payout.as_str()), ("someone-else", "theirs")] {
        let made = bank.make_transfer(key, 200, reference).await;
        assert_eq!(made.status(), StatusCode::CREATED);
    }
    let dirty = run(&bank.url);
    let said = String::from_utf8_lossy(&dirty.stdout).into_owned();
    assert_eq!(dirty.status.code(), Some(1), "{said}");
    assert!(said.contains("executed 2 times at the bank"), "{said}");
    assert!(said.contains("\"someone-else\""), "{said}");

    // A pending payout is listed with its age, and is no mismatch by itself. (The first
    // instance stops: its workers would send it to its bank — instances share the
    // outbox, so they must share the bank.)
    let shared = app.shared.clone();
    app.stop().await;
    let away = TestBank::plain().await;
    let waiting = spawn_with(
        shared,
        &[
            "--bank-url",
            "http://127.0.0.1:9",
            "--payout-retry-base",
            "1m",
            "--payout-retry-max",
            "1m",
        ],
    )
    .await;
    let pending = waiting.accepted_payout(&account, 50).await;
    let listed = run(&away.url);
    let said = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(said.contains(&format!("pending {pending}")), "{said}");
    waiting.stop().await;
    for bank in [bank, empty, away] {
        bank.stop().await;
    }
}

/// A loopback relay in front of the bank that holds the first connection made through it
/// until the test lets it go. Reconcile asks the bank only once it has read the payouts:
/// while the relay holds it, it stands between its two reads.
struct HeldBank {
    url: url::Url,
    arrived: oneshot::Receiver<()>,
    release: oneshot::Sender<()>,
}

impl HeldBank {
    async fn start(bank: &str) -> Self {
        let upstream = url::Url::parse(bank)
            .expect("a URL")
            .socket_addrs(|| None)
            .expect("an address")[0];
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let url =
            url::Url::parse(&format!("http://{}", listener.local_addr().unwrap())).expect("a URL");
        let (arrived_tx, arrived) = oneshot::channel();
        let (release, released) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let mut hold = Some((arrived_tx, released));
            while let Ok((mut caller, _)) = listener.accept().await {
                let held = hold.take();
                tokio::spawn(async move {
                    if let Some((arrived, released)) = held {
                        let _ = arrived.send(());
                        let _ = released.await;
                    }
                    if let Ok(mut bank) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut caller, &mut bank).await;
                    }
                });
            }
        });
        Self {
            url,
            arrived,
            release,
        }
    }
}

/// An instance paying out to `bank`, each call bounded generously: on a loaded machine a
/// tight bound ends payouts `failed` (their key closed unexecuted) — right, but not what
/// these tests are about.
async fn paying_patiently(bank: &TestBank) -> TestApp {
    spawn_app_with(Backend::Distributed, &paying_to(bank, "10s", "30s")).await
}

/// Runs `payonce reconcile`'s comparison in a task of its own, against `bank`.
fn reconciling(
    app: &TestApp,
    bank: &url::Url,
) -> tokio::task::JoinHandle<Result<api::reconcile::Reconciliation, String>> {
    let ledger = app.state.ledger().clone();
    let bank = bank.clone();
    tokio::spawn(async move { api::reconcile::reconcile(&ledger, &bank).await })
}

/// Between reconcile's two reads — the payouts, then the bank — a payout is made and
/// paid out, and two strangers' transfers are planted at the bank. The bank's transfer
/// for the new payout is that payout's, looked up by its id and compared like the others
/// — not a transfer payonce does not know; the strangers' are, one naming nothing, one
/// naming an id that is no payout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payout_made_between_the_two_reads_is_no_stranger() {
    let bank = TestBank::plain().await;
    let app = paying_patiently(&bank).await;
    let account = app.create_account(1000, 0).await;
    let before = app.accepted_payout(&account, 100).await;
    app.settled(&account, &before).await;

    let held = HeldBank::start(&bank.url).await;
    let run = reconciling(&app, &held.url);
    held.arrived.await.expect("reconcile asks the bank");
    let between = app.accepted_payout(&account, 200).await;
    assert_eq!(app.settled(&account, &between).await["status"], "succeeded");
    let nobody = uuid::Uuid::new_v4().to_string();
    for (key, reference) in [("someone-else", "theirs"), ("a-stranger", nobody.as_str())] {
        let made = bank.make_transfer(key, 5, reference).await;
        assert_eq!(made.status(), StatusCode::CREATED);
    }
    let _ = held.release.send(());

    let found = run.await.expect("it ran").expect("it reconciles");
    assert_eq!((found.payouts, found.executed), (2, 4), "{found:#?}");
    assert_eq!(found.findings.len(), 2, "{found:#?}");
    for key in ["\"someone-else\"", "\"a-stranger\""] {
        assert!(
            found
                .findings
                .iter()
                .any(|finding| finding.contains(key) && finding.ends_with("no payout of payonce's")),
            "{found:#?}"
        );
    }
    assert!(found.pending.is_empty(), "{found:#?}");
    app.stop().await;
    bank.stop().await;
}

/// Accounts pay out as fast as they can while reconcile runs again and again: no run
/// finds anything (no payout made, sent or settled between its reads is taken for a
/// discrepancy), and none misses a payout accepted before it began. Once every payout
/// is settled, a last run counts each of them, and each succeeded one executed once at
/// the bank.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconcile_agrees_while_payouts_are_made() {
    let bank = TestBank::plain().await;
    let app = paying_patiently(&bank).await;
    let bank_url = url::Url::parse(&bank.url).expect("a URL");
    let mut accounts = Vec::new();
    for _ in 0..4 {
        accounts.push(app.create_account(1_000_000, 0).await);
    }
    let accepted = AtomicUsize::new(0);
    let done = AtomicBool::new(false);

    let payers = {
        let (app, accepted, done) = (&app, &accepted, &done);
        accounts.iter().map(move |account| async move {
            let mut made = Vec::new();
            while !done.load(Ordering::SeqCst) {
                made.push(app.accepted_payout(account, 1).await);
                accepted.fetch_add(1, Ordering::SeqCst);
            }
            made
        })
    };
    let reconciler = async {
        let started = Instant::now();
        let mut runs = 0;
        while runs < 20 || started.elapsed() < Duration::from_secs(3) {
            let before = accepted.load(Ordering::SeqCst);
            let found = api::reconcile::reconcile(app.state.ledger(), &bank_url)
                .await
                .expect("it reconciles");
            assert!(found.is_clean(), "run {runs}: {:#?}", found.findings);
            assert!(
                found.payouts >= before,
                "run {runs} missed payouts accepted before it: {found:#?}"
            );
            runs += 1;
        }
        done.store(true, Ordering::SeqCst);
        runs
    };
    let (made, runs) = tokio::join!(futures::future::join_all(payers), reconciler);
    let made: Vec<(&TestAccount, String)> = accounts
        .iter()
        .zip(made)
        .flat_map(|(account, made)| made.into_iter().map(move |payout| (account, payout)))
        .collect();
    assert!(
        made.len() > runs,
        "payouts were made while it ran: {} in {runs} runs",
        made.len()
    );

    let mut succeeded = 0;
    for (account, payout) in &made {
        if app.settled(account, payout).await["status"] == "succeeded" {
            succeeded += 1;
        }
    }
    let found = api::reconcile::reconcile(app.state.ledger(), &bank_url)
        .await
        .expect("it reconciles");
    assert!(found.is_clean(), "{:#?}", found.findings);
    assert_eq!((found.payouts, found.executed), (made.len(), succeeded));
    assert!(found.pending.is_empty(), "{found:#?}");
    app.stop().await;
    bank.stop().await;
}
