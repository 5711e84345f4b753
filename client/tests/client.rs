//! payonce-client against a real payonce server (the embedded mode, in this process, on
//! a port-0 listener): the crate docs' walkthrough, refusals as problem enums, an order
//! paid once, an answer lost on the way back resent with the same ticket and executed
//! once, an instance down among the base URLs, webhook signatures. One test starts the
//! distributed mode instead — an instance without a bank, which needs the tests' Redis.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Parser;
use payonce_client::types::accounts::{CreatedAccount, NewAccountRequest};
use payonce_client::types::holds::HoldState;
use payonce_client::types::orders::{OrderRequest, OrderState};
use payonce_client::types::tickets::TicketState;
use payonce_client::{Client, Error, ProblemKind, ResendPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A payonce server in the embedded mode; its base URL and the directory it keeps.
async fn server() -> (String, tempfile::TempDir) {
    server_with(&[]).await
}

/// A payonce server in the embedded mode with `flags`.
async fn server_with(flags: &[&str]) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().display().to_string();
    let mut argv = vec!["payonce", "--data-dir", &data_dir];
    argv.extend_from_slice(flags);
    let mut config = api::config::Cli::parse_from(argv).config;
    // The test command exports DATABASE_URL and REDIS_URL; the embedded mode needs neither.
    config.database_url = None;
    config.redis_url = None;
    (serve(&config).await, dir)
}

/// A payonce server in the distributed mode started without a bank (no
/// `PAYONCE_BANK_URL`), so that it refuses payouts: its ledger a SQLite file of its own,
/// its locks in the tests' Redis (`REDIS_URL`, else 127.0.0.1:6379) under a namespace of
/// its own. Its base URL and the directory it keeps.
async fn server_without_a_bank() -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().display().to_string();
    let database = format!("sqlite:{}", dir.path().join("ledger.db").display());
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let namespace = format!("client-tests-{}", uuid::Uuid::new_v4().simple());
    let mut config = api::config::Cli::parse_from([
        "payonce",
        "--data-dir",
        &data_dir,
        "--database-url",
        &database,
        "--redis-url",
        &redis,
        "--redis-namespace",
        &namespace,
    ])
    .config;
    // Whatever the environment names: no bank, and Redis as the one lock service.
    config.bank_url = None;
    config.lock_url = None;
    (serve(&config).await, dir)
}

/// Starts a payonce server with `config` in this process, on a port-0 listener; its base
/// URL.
async fn serve(config: &api::config::Config) -> String {
    let state = api::state::AppState::connect(config)
        .await
        .expect("the service starts");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(api::serve(
        listener,
        state,
        config.request_timeout,
        std::future::pending(),
    ));
    base
}

/// An address nobody listens on: its port was free a moment ago.
fn dead_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

/// A payonce server in the embedded mode with `flags`, and Ada's account opened on it: a
/// client with her key, her account, the base URL and the server's directory.
async fn ada_on(flags: &[&str]) -> (Client, CreatedAccount, String, tempfile::TempDir) {
    let (base, dir) = server_with(flags).await;
    let payonce = Client::new(&base).unwrap();
    let ada = payonce.open_account(&ada_request()).await.unwrap();
    (payonce.with_key(&ada.api_key), ada, base, dir)
}

/// Three tries at most, a millisecond apart at first and five at the most.
fn three_quick_tries() -> ResendPolicy {
    ResendPolicy {
        max_attempts: 3,
        first_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        ..ResendPolicy::default()
    }
}

fn ada_request() -> NewAccountRequest {
    NewAccountRequest {
        name: "Ada".into(),
        balance: 1000,
        points: 5,
    }
}

/// The crate docs' example, run.
#[tokio::test]
async fn one_intent_spends_once_however_often_it_is_sent() {
    let (payonce, ada, _, _dir) = ada_on(&[]).await;

    let mut withdrawal = payonce.withdrawal(ada.id, 300);
    let first = withdrawal.send().await.unwrap();
    let again = withdrawal.send().await.unwrap();
    assert_eq!((first.body.balance, first.replayed), (700, false));
    assert_eq!((&again.body, again.replayed), (&first.body, true));
    assert_eq!(again.ticket, first.ticket);
    assert_eq!(payonce.account(ada.id).await.unwrap().balance, 700);

    let ticket = payonce.ticket(first.ticket).await.unwrap();
    assert_eq!(ticket.state, TicketState::Completed);
    assert_eq!(ticket.response.unwrap().status, 201);

    let drawn = payonce.lottery_draw(ada.id, 2).send().await.unwrap();
    assert_eq!(drawn.body.points_after, 3);

    assert_eq!(payonce.health().await.unwrap().status, "ok");
    let ready = payonce.readiness().await.unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.database.as_str()),
        ("ready", "ok")
    );
}

/// A refusal is a problem with its fields, stored under the ticket: sending the intent
/// again answers it again.
#[tokio::test]
async fn refusals_are_problems_with_their_fields() {
    let (payonce, ada, base, _dir) = ada_on(&[]).await;

    let mut too_much = payonce.withdrawal(ada.id, 5000);
    for _ in 0..2 {
        let Err(Error::Refused(problem)) = too_much.send().await else {
            panic!("not refused")
        };
        assert_eq!(problem.status, 402);
        assert_eq!(
            problem.kind,
            ProblemKind::InsufficientFunds {
                balance: 1000,
                amount: Some(5000),
                order_id: None
            }
        );
        assert_eq!(problem.ticket_id, too_much.ticket());
    }
    let Err(Error::Refused(problem)) = payonce.lottery_draw(ada.id, 9).send().await else {
        panic!("not refused")
    };
    assert_eq!(
        problem.kind,
        ProblemKind::InsufficientPoints {
            points: 5,
            points_needed: Some(9)
        }
    );
    // Someone else's key reads nothing.
    let stranger = Client::new(&base)
        .unwrap()
        .with_key("pk_not-a-key-of-this-service");
    let error = stranger.account(ada.id).await.unwrap_err();
    assert_eq!(
        error.problem().map(|problem| &problem.kind),
        Some(&ProblemKind::Unauthenticated)
    );
}

/// Two intents to pay one order: one pays it, the other is refused with the ticket that
/// did.
#[tokio::test]
async fn an_order_is_paid_by_one_intent_only() {
    let (payonce, ada, _, _dir) = ada_on(&[]).await;
    let order = payonce
        .place_order(
            ada.id,
            &OrderRequest {
                amount: 250,
                description: "order #1017".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(order.state, OrderState::Open);

    let mut first = payonce.order_payment(ada.id, order.order_id);
    let mut second = payonce.order_payment(ada.id, order.order_id);
    let paid = first.send().await.unwrap();
    assert_eq!((paid.body.balance, paid.body.state.as_str()), (750, "paid"));
    let Err(Error::Refused(problem)) = second.send().await else {
        panic!("paid twice")
    };
    assert_eq!(
        problem.kind,
        ProblemKind::OrderAlreadyPaid {
            paid_by_ticket: paid.ticket,
            order_id: Some(order.order_id)
        }
    );
    let order = payonce.order(order.order_id).await.unwrap();
    assert_eq!(
        (order.state, order.paid_by_ticket),
        (OrderState::Paid, Some(paid.ticket))
    );
}

/// A hold taken, part of it captured, part of that refunded — each an intent, sent twice
/// and executed once; a void after the capture and a refund past the capture are refusals
/// with their fields; `available` follows.
#[tokio::test]
async fn a_hold_is_captured_once_and_refunded_within_it() {
    let (payonce, ada, _, _dir) = ada_on(&[]).await;
    let mut hold = payonce.hold(ada.id, 400, Some(3600));
    let placed = hold.send().await.unwrap();
    assert_eq!(
        (placed.status, placed.body.balance, placed.body.available),
        (201, 1000, 600)
    );
    assert!(hold.send().await.unwrap().replayed);
    let hold_id = placed.body.hold_id;
    assert_eq!(payonce.account(ada.id).await.unwrap().available, 600);

    let mut capture = payonce.capture(ada.id, hold_id, Some(250));
    let captured = capture.send().await.unwrap();
    assert_eq!(captured.status, 200);
    assert_eq!(
        (
            captured.body.hold.state,
            captured.body.hold.captured_amount,
            captured.body.balance,
            captured.body.available
        ),
        (HoldState::Captured, Some(250), 750, 750)
    );
    assert!(capture.send().await.unwrap().replayed);
    let Err(Error::Refused(problem)) = payonce.void(ada.id, hold_id).send().await else {
        panic!("voided a captured hold")
    };
    assert_eq!(
        problem.kind,
        ProblemKind::HoldNotHeld {
            state: Some(HoldState::Captured)
        }
    );

    let refunded = payonce
        .hold_refund(ada.id, hold_id, 200)
        .send()
        .await
        .unwrap();
    assert_eq!((refunded.body.refundable, refunded.body.balance), (50, 950));
    let Err(Error::Refused(problem)) = payonce.hold_refund(ada.id, hold_id, 60).send().await else {
        panic!("refunded past the capture")
    };
    assert_eq!(
        problem.kind,
        ProblemKind::RefundExceedsPayment { refundable: 50 }
    );
    let read = payonce.hold_state(hold_id).await.unwrap();
    assert_eq!(
        (read.state, read.refunded_amount),
        (HoldState::Captured, 200)
    );
}

/// A proxy in front of `upstream` that, while `cut` is set, passes one request on, waits
/// for the server's answer, and drops the connection instead of passing the answer back
/// (then clears `cut`): the request executed, the client never heard.
async fn answer_dropping_proxy(upstream: String, cut: Arc<AtomicBool>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let upstream = upstream.trim_start_matches("http://").to_owned();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let upstream = upstream.clone();
            let cut = cut.clone();
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(&upstream).await else {
                    return;
                };
                if cut.swap(false, Ordering::SeqCst) {
                    let mut request = vec![0; 64 * 1024];
                    let read = client.read(&mut request).await.unwrap_or(0);
                    server.write_all(&request[..read]).await.unwrap();
                    let mut answer = [0; 1024];
                    let _ = server.read(&mut answer).await;
                    // Both dropped here: the answer never reaches the client.
                } else {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    address
}

/// The answer to a withdrawal is lost after the server executed it: the intent resends
/// with the same ticket, and learns the outcome as a replay — one execution.
#[tokio::test]
async fn a_lost_answer_is_resent_with_the_same_ticket_and_executes_once() {
    let (direct, ada, base, _dir) = ada_on(&[]).await;
    let ticket = direct.take_ticket(ada.id).await.unwrap().ticket_id;

    let cut = Arc::new(AtomicBool::new(true));
    let proxy = answer_dropping_proxy(base.clone(), cut.clone()).await;
    // Through a reqwest client of the caller's own, each send observed.
    let through_proxy = Client::builder()
        .base_url(&proxy)
        .http_client(reqwest::Client::builder().no_proxy().build().unwrap())
        .build()
        .unwrap()
        .with_key(&ada.api_key);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let outcome = through_proxy
        .withdrawal(ada.id, 300)
        .with_ticket(ticket)
        .on_attempt({
            let seen = seen.clone();
            move |attempt| seen.lock().unwrap().push(attempt.clone())
        })
        .send()
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    assert_eq!(
        (seen[0].number, seen[0].status, seen[0].error.is_some()),
        (1, None, true),
        "the first send got no answer"
    );
    assert_eq!(
        (seen[1].number, seen[1].status, seen[1].replayed),
        (2, Some(201), true)
    );
    assert_eq!(seen[1].body.as_ref().unwrap()["balance"], 700);
    assert!(seen.iter().all(|attempt| attempt.base.starts_with(&proxy)));
    assert!(!cut.load(Ordering::SeqCst), "the first answer was dropped");
    assert_eq!(
        (outcome.attempts, outcome.replayed, outcome.ticket),
        (2, true, ticket)
    );
    assert_eq!(outcome.body.balance, 700);
    assert_eq!(direct.account(ada.id).await.unwrap().balance, 700);
}

/// With an instance that does not answer among the base URLs, sends move on to the next,
/// and a spend executes once.
#[tokio::test]
async fn a_dead_instance_among_the_bases_is_passed_over() {
    let (base, _dir) = server().await;
    let dead = dead_address();
    let payonce = Client::builder()
        .base_url(&dead)
        .base_url(&base)
        .resend_policy(ResendPolicy {
            max_attempts: 4,
            first_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
            ..ResendPolicy::default()
        })
        .build()
        .unwrap();
    let ada = payonce.open_account(&ada_request()).await.unwrap();
    let payonce = payonce.with_key(&ada.api_key);
    let outcome = payonce.withdrawal(ada.id, 100).send().await.unwrap();
    assert_eq!((outcome.body.balance, outcome.replayed), (900, false));

    // Nothing but dead instances: it gives up, saying how often it tried.
    let nowhere = Client::builder()
        .base_url(&dead)
        .resend_policy(three_quick_tries())
        .build()
        .unwrap();
    let Err(Error::GaveUp { attempts, last, .. }) = nowhere.open_account(&ada_request()).await
    else {
        panic!("did not give up")
    };
    assert_eq!(attempts, 3);
    assert!(matches!(*last, Error::Transport(_)), "{last}");
    // A probe asks its one instance once, and says what that one did.
    let probed = nowhere.health().await;
    assert!(matches!(probed, Err(Error::Transport(_))), "{probed:?}");
    let probed = payonce.starting_at(0).readiness().await;
    assert!(matches!(probed, Err(Error::Transport(_))), "{probed:?}");
    assert_eq!(
        payonce.starting_at(1).readiness().await.unwrap().status,
        "ready"
    );
}

/// Over the account's rate of spends (one a second here), the server answers 429 with
/// `Retry-After`: an intent waits that long and resends with its ticket, which then
/// executes. Three at once: all three go through, once each, the later ones after
/// waiting.
#[tokio::test]
async fn rate_limited_spends_wait_retry_after_and_go_through() {
    let (payonce, ada, _, _dir) = ada_on(&["--spends-per-second", "1"]).await;
    let mut intents: Vec<_> = (0..3).map(|_| payonce.withdrawal(ada.id, 100)).collect();
    let started = std::time::Instant::now();
    let sent = futures::future::join_all(intents.iter_mut().map(|intent| async {
        let outcome = intent.send().await.unwrap();
        (outcome, started.elapsed())
    }))
    .await;
    let mut balances: Vec<i64> = sent
        .iter()
        .map(|(outcome, _)| outcome.body.balance)
        .collect();
    balances.sort_unstable();
    assert_eq!(balances, [700, 800, 900], "each executed once");
    assert!(sent.iter().all(|(outcome, _)| !outcome.replayed));
    let resent: Vec<_> = sent
        .iter()
        .filter(|(outcome, _)| outcome.attempts > 1)
        .collect();
    assert!(
        !resent.is_empty(),
        "three at once, one a second: some were limited"
    );
    for (outcome, took) in resent {
        assert!(
            *took >= Duration::from_secs(1),
            "{outcome:?} was resent before Retry-After (1 s): {took:?}"
        );
    }
}

/// A signature made by the specification's rules verifies; another body, another secret,
/// or an old timestamp does not.
#[test]
fn webhook_signatures_are_verified() {
    use payonce_client::webhooks::{HeaderMap, verify};
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let body = br#"{"type":"withdrawal.succeeded"}"#;
    let signed = |timestamp: i64, body: &[u8]| {
        let signature = standardwebhooks::Webhook::new(secret)
            .unwrap()
            .sign("msg_1", timestamp, body)
            .unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", "msg_1".parse().unwrap());
        headers.insert("webhook-timestamp", timestamp.to_string().parse().unwrap());
        headers.insert("webhook-signature", signature.parse().unwrap());
        headers
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    verify(secret, &signed(now, body), body).unwrap();
    assert!(verify(secret, &signed(now, body), b"{}").is_err());
    assert!(verify("whsec_dGhlIG90aGVyIHNlY3JldA==", &signed(now, body), body).is_err());
    assert!(verify(secret, &signed(now - 3600, body), body).is_err());
}

/// Every problem type the server can answer reads into a variant of its own, none into
/// `Other`: the enum is the contract's whole list.
#[test]
fn every_problem_type_of_the_server_has_its_variant() {
    for (name, status, _) in api::error::EXPLANATIONS {
        let body = serde_json::json!({
            "type": format!("/problems/{name}"), "title": "t", "status": status, "detail": "d",
            "balance": 1, "points": 1, "paid_by_ticket": uuid::Uuid::new_v4(),
        });
        let problem = payonce_client::Problem::from_body(*status, &body, None).unwrap();
        assert!(
            !matches!(problem.kind, ProblemKind::Other { .. }),
            "{name} has no variant"
        );
    }
}

/// A payout through the embedded mode's bank: accepted, then settled; the account's
/// entries and payouts show it.
#[tokio::test]
async fn a_payout_is_sent_once_and_settles() {
    let (payonce, ada, _, _dir) = ada_on(&["--payout-poll", "50ms"]).await;
    let mut payout = payonce.payout(
        ada.id,
        &payonce_client::types::payouts::PayoutRequest {
            amount: 200,
            destination: "DE89370400440532013000".into(),
        },
    );
    let accepted = payout.send().await.unwrap();
    assert_eq!((accepted.status, accepted.body.balance), (202, 800));
    assert!(payout.send().await.unwrap().replayed);

    let mut settled = None;
    for _ in 0..200 {
        let state = payonce.payout_state(accepted.body.payout_id).await.unwrap();
        if state.status != "pending" {
            settled = Some(state);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let settled = settled.expect("settled within 10 s");
    assert_eq!(settled.status, "succeeded");
    // The bank holds one transfer for it, executed, under the payout's one key.
    let at_bank = payonce
        .payout_at_bank(accepted.body.payout_id)
        .await
        .unwrap();
    assert_eq!(at_bank.executed, 1);
    assert_eq!(at_bank.bank_key, settled.bank_key);
    assert_eq!(
        at_bank
            .transfers
            .iter()
            .map(|transfer| (
                transfer.state,
                transfer.amount,
                transfer.idempotency_key.as_str()
            ))
            .collect::<Vec<_>>(),
        [(
            payonce_client::types::payouts::BankTransferState::Executed,
            200,
            settled.bank_key.as_str()
        )]
    );
    let listed = payonce
        .payouts(Some("succeeded"), None, None)
        .await
        .unwrap();
    assert_eq!(listed.payouts, [settled]);

    let entries = payonce.entries(ada.id, None, Some(10)).await.unwrap();
    let kinds: Vec<&str> = entries
        .entries
        .iter()
        .map(|entry| entry.kind.as_str())
        .collect();
    assert_eq!(kinds, ["opening", "payout"]);
}

/// A payout to an instance started without a bank is refused at once: 503
/// `payouts-unavailable` is the instance's configuration, not a passing state, so it is
/// sent once — not resent, not after a backoff — and comes back as the problem it is;
/// nothing was stored, and the ticket still spends.
#[tokio::test]
async fn a_payout_to_an_instance_without_a_bank_is_refused_not_resent() {
    let (base, _dir) = server_without_a_bank().await;
    // A policy that would go on resending for half a minute: the refusal must not wait.
    let payonce = Client::builder()
        .base_url(&base)
        .resend_policy(ResendPolicy {
            max_attempts: 6,
            first_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(5),
            resend_unanswered: true,
        })
        .build()
        .unwrap();
    let ada = payonce.open_account(&ada_request()).await.unwrap();
    let payonce = payonce.with_key(&ada.api_key);

    let sends = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = sends.clone();
    let mut payout = payonce
        .payout(
            ada.id,
            &payonce_client::types::payouts::PayoutRequest {
                amount: 200,
                destination: "DE89370400440532013000".into(),
            },
        )
        .on_attempt(move |attempt| seen.lock().unwrap().push(attempt.status));
    let started = std::time::Instant::now();
    let Err(Error::Refused(problem)) = payout.send().await else {
        panic!("not refused")
    };
    let took = started.elapsed();
    assert_eq!(
        (problem.status, &problem.kind),
        (503, &ProblemKind::PayoutsUnavailable)
    );
    assert_eq!(*sends.lock().unwrap(), [Some(503)], "sent once");
    assert!(
        took < Duration::from_secs(2),
        "waited for a resend: {took:?}"
    );

    // Nothing was stored under the ticket: it is still issued, and it spends.
    let ticket = payout.ticket().unwrap();
    assert_eq!(
        payonce.ticket(ticket).await.unwrap().state,
        TicketState::Issued
    );
    let spent = payonce
        .withdrawal(ada.id, 200)
        .with_ticket(ticket)
        .send()
        .await
        .unwrap();
    assert_eq!(
        (spent.status, spent.body.balance, spent.replayed),
        (201, 800, false)
    );
}

/// Webhook endpoints: created with a secret, listed, rotated to a new secret, their
/// deliveries listed after a withdrawal, deleted — and deleted again is a problem.
#[tokio::test]
async fn webhook_endpoints_are_created_listed_rotated_and_deleted() {
    use payonce_client::types::webhooks::{EndpointRequest, EventType};
    let (payonce, ada, _, _dir) = ada_on(&["--webhook-allow-private"]).await;
    let created = payonce
        .create_webhook_endpoint(
            ada.id,
            &EndpointRequest {
                url: "http://127.0.0.1:9/payonce-events".into(),
                events: Some(vec![EventType::WithdrawalSucceeded]),
            },
        )
        .await
        .unwrap();
    assert!(created.secret.starts_with("whsec_"));
    let endpoint = created.endpoint.id;
    let listed = payonce.webhook_endpoints(ada.id).await.unwrap();
    assert_eq!(listed.endpoints, std::slice::from_ref(&created.endpoint));

    let rotated = payonce
        .rotate_webhook_secret(ada.id, endpoint)
        .await
        .unwrap();
    assert_ne!(rotated.secret, created.secret);

    payonce.withdrawal(ada.id, 100).send().await.unwrap();
    let mut deliveries = Vec::new();
    for _ in 0..100 {
        deliveries = payonce
            .webhook_deliveries(endpoint, None, None)
            .await
            .unwrap()
            .deliveries;
        if !deliveries.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(deliveries.len(), 1, "{deliveries:?}");
    assert_eq!(deliveries[0].event_type, EventType::WithdrawalSucceeded);
    // Sent again now (the receiver at port 9 refuses it: it waits for its retry) — unless
    // a worker is sending it at this very moment, which the refusal names.
    match payonce
        .retry_webhook_delivery(endpoint, deliveries[0].id)
        .await
    {
        Ok(()) => {}
        Err(error) => assert_eq!(
            error.problem().map(|problem| &problem.kind),
            Some(&ProblemKind::DeliveryInFlight),
            "{error}"
        ),
    }
    let missing = payonce
        .retry_webhook_delivery(endpoint, deliveries[0].id + 1000)
        .await
        .unwrap_err();
    assert_eq!(
        missing.problem().map(|problem| &problem.kind),
        Some(&ProblemKind::DeliveryNotFound)
    );

    payonce
        .delete_webhook_endpoint(ada.id, endpoint)
        .await
        .unwrap();
    assert!(
        payonce
            .webhook_endpoints(ada.id)
            .await
            .unwrap()
            .endpoints
            .is_empty()
    );
    let again = payonce
        .delete_webhook_endpoint(ada.id, endpoint)
        .await
        .unwrap_err();
    assert_eq!(
        again.problem().map(|problem| &problem.kind),
        Some(&ProblemKind::WebhookEndpointNotFound)
    );
}

/// A server on loopback that answers every request with `status` and `body` and closes;
/// its base URL and the heads of the requests it took, lowercased.
async fn recorder(
    status: &'static str,
    body: String,
) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
    let requests = heard.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (requests, body) = (requests.clone(), body.clone());
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0_u8; 4096];
                // The head, then the body its content-length announces.
                let head = loop {
                    let Ok(read) = socket.read(&mut buffer).await else {
                        return;
                    };
                    if read == 0 {
                        return;
                    }
                    request.extend_from_slice(&buffer[..read]);
                    let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text
                            .lines()
                            .find_map(|line| line.strip_prefix("content-length:"))
                            .and_then(|value| value.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if request.len() >= end + 4 + length {
                            break text[..end].to_owned();
                        }
                    }
                };
                requests.lock().unwrap().push(head);
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (base, heard)
}

/// A client aimed at a base (`starting_at`) sends there first and moves on from there by
/// itself; a header aimed at one base goes with the sends to it only, one for all with
/// every send; the observer says which base each send went to.
#[tokio::test]
async fn an_aimed_intent_starts_where_told_and_aimed_headers_go_there_only() {
    let account = uuid::Uuid::new_v4();
    let ticket = uuid::Uuid::new_v4();
    let (down, heard_down) = recorder(
        "503 Service Unavailable",
        r#"{"type":"/problems/lock-store-unavailable","title":"down","status":503}"#.into(),
    )
    .await;
    let (up, heard_up) = recorder(
        "201 Created",
        format!(r#"{{"ticket_id":"{ticket}","account_id":"{account}","amount":5,"balance":95}}"#),
    )
    .await;
    let payonce = Client::builder()
        .base_url(&down)
        .base_url(&up)
        .resend_policy(three_quick_tries())
        .build()
        .unwrap()
        .with_key("k");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let observed = {
        let seen = seen.clone();
        payonce.on_attempt(move |attempt| seen.lock().unwrap().push(attempt.base_index))
    };
    let aimed = |base: usize| {
        observed
            .starting_at(base)
            .withdrawal(account, 5)
            .with_ticket(ticket)
            .with_header(
                "x-to-all".parse().unwrap(),
                reqwest::header::HeaderValue::from_static("yes"),
            )
            .with_header_to(
                1,
                "x-to-up".parse().unwrap(),
                reqwest::header::HeaderValue::from_static("yes"),
            )
    };

    let outcome = aimed(0).send().await.unwrap();
    assert_eq!((outcome.attempts, outcome.body.balance), (2, 95));
    assert_eq!(
        *seen.lock().unwrap(),
        vec![0, 1],
        "first where told, then on"
    );
    let outcome = aimed(1).send().await.unwrap();
    assert_eq!(outcome.attempts, 1);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![0, 1, 1],
        "the second went to 1 only"
    );

    let (down, up) = (heard_down.lock().unwrap(), heard_up.lock().unwrap());
    assert_eq!((down.len(), up.len()), (1, 2));
    assert!(down[0].contains("x-to-all: yes") && !down[0].contains("x-to-up"));
    assert!(
        up.iter()
            .all(|head| head.contains("x-to-all: yes") && head.contains("x-to-up: yes"))
    );
    let key = format!("idempotency-key: {ticket}");
    assert!(down.iter().chain(up.iter()).all(|head| head.contains(&key)));
}

/// A webhook endpoint's creation carries a key of its own: a send whose connection could
/// not be made goes to the next base (one endpoint is made), and one whose answer was lost
/// after the server made it is sent again and answered as a replay — the same endpoint,
/// the same secret, not a second endpoint.
#[tokio::test]
async fn a_webhook_create_moves_on_from_a_refused_connection_and_replays_a_lost_answer() {
    use payonce_client::types::webhooks::EndpointRequest;
    let (base, _dir) = server_with(&["--webhook-allow-private"]).await;
    let dead = dead_address();
    let payonce = Client::builder()
        .base_url(&dead)
        .base_url(&base)
        .build()
        .unwrap();
    let ada = payonce.open_account(&ada_request()).await.unwrap();
    let payonce = payonce.with_key(&ada.api_key).starting_at(0);
    let endpoint = EndpointRequest {
        url: "http://127.0.0.1:9/payonce-events".into(),
        events: None,
    };
    payonce
        .create_webhook_endpoint(ada.id, &endpoint)
        .await
        .unwrap();
    assert_eq!(
        payonce
            .webhook_endpoints(ada.id)
            .await
            .unwrap()
            .endpoints
            .len(),
        1
    );

    // An answer lost after the server took the request: sent again with the same key,
    // answered as a replay.
    let cut = Arc::new(AtomicBool::new(true));
    let proxy = answer_dropping_proxy(base.clone(), cut.clone()).await;
    let through_proxy = Client::new(&proxy).unwrap().with_key(&ada.api_key);
    let replayed = through_proxy
        .create_webhook_endpoint(ada.id, &endpoint)
        .await
        .unwrap();
    assert!(!cut.load(Ordering::SeqCst), "the first answer was dropped");
    let listed = payonce.webhook_endpoints(ada.id).await.unwrap().endpoints;
    assert_eq!(listed.len(), 2, "the lost one was made once, and not again");
    assert_eq!(listed[1].id, replayed.endpoint.id);
    assert!(replayed.secret.starts_with("whsec_"));
}

/// Each webhook POST goes with an `Idempotency-Key` of its own, the same on every resend:
/// after a `503 timeout` (which may come after the server ran it) the resend is a replay.
/// A client whose policy does not resend what may have run sends a keyless request once
/// on such an answer.
#[tokio::test]
async fn webhook_posts_carry_a_key_and_what_may_have_run_goes_keyless_once() {
    use payonce_client::types::webhooks::EndpointRequest;
    let timeout = r#"{"type":"/problems/timeout","title":"Timeout","status":503,"detail":"the request took too long"}"#;
    let (base, heard) = recorder("503 Service Unavailable", timeout.to_owned()).await;
    let policy = ResendPolicy {
        max_attempts: 3,
        first_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
        ..ResendPolicy::default()
    };
    let payonce = Client::builder()
        .base_url(&base)
        .resend_policy(policy)
        .build()
        .unwrap()
        .with_key("po_test");
    let (account, endpoint) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let request = EndpointRequest {
        url: "https://example.com/hooks".into(),
        events: None,
    };
    let created = payonce.create_webhook_endpoint(account, &request).await;
    assert!(
        matches!(created, Err(Error::GaveUp { attempts: 3, .. })),
        "{created:?}"
    );
    let rotated = payonce.rotate_webhook_secret(account, endpoint).await;
    assert!(
        matches!(rotated, Err(Error::GaveUp { attempts: 3, .. })),
        "{rotated:?}"
    );
    let retried = payonce.retry_webhook_delivery(endpoint, 7).await;
    assert!(
        matches!(retried, Err(Error::GaveUp { attempts: 3, .. })),
        "{retried:?}"
    );
    let heads = heard.lock().unwrap().clone();
    assert_eq!(heads.len(), 9);
    for sends in heads.chunks(3) {
        let key = |head: &String| {
            head.lines()
                .find_map(|line| line.strip_prefix("idempotency-key: "))
                .map(str::to_owned)
        };
        let first = key(&sends[0]).expect("every webhook POST carries a key");
        assert!(sends.iter().all(|head| key(head).as_ref() == Some(&first)));
    }

    let careful = payonce.with_resend_policy(ResendPolicy {
        resend_unanswered: false,
        ..policy
    });
    heard.lock().unwrap().clear();
    let ticket = careful.take_ticket(account).await;
    let Err(Error::Refused(problem)) = ticket else {
        panic!("{ticket:?}");
    };
    assert_eq!(problem.kind, ProblemKind::Timeout);
    assert_eq!(heard.lock().unwrap().len(), 1, "sent once");
}

/// The embedded mode's inbox as a receiver: an endpoint pointed at it gets the
/// withdrawal's event, whose signature — payonce's own — verifies with the endpoint's
/// secret, and not with a changed body or another secret.
#[tokio::test]
async fn events_payonce_sent_verify_with_the_endpoints_secret() {
    use payonce_client::types::webhooks::EndpointRequest;
    use reqwest::header::{HeaderMap, HeaderValue};
    let (payonce, ada, _, _dir) = ada_on(&[]).await;
    let inbox = payonce.webhook_inbox(ada.id).await.unwrap();
    assert!(inbox.received.is_empty());
    let created = payonce
        .create_webhook_endpoint(
            ada.id,
            &EndpointRequest {
                url: inbox.url.clone(),
                events: None,
            },
        )
        .await
        .unwrap();
    let withdrawn = payonce.withdrawal(ada.id, 100).send().await.unwrap();

    let mut received = Vec::new();
    for _ in 0..200 {
        received = payonce.webhook_inbox(ada.id).await.unwrap().received;
        if !received.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let event = received.first().expect("the event arrived within 10 s");
    let event_body: serde_json::Value = serde_json::from_str(&event.body).unwrap();
    assert_eq!(event_body["type"], "withdrawal.succeeded");
    assert_eq!(
        event_body["data"]["ticket_id"],
        withdrawn.ticket.to_string(),
        "{event_body}"
    );

    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("webhook-id", &event.webhook_id),
        ("webhook-timestamp", &event.webhook_timestamp),
        ("webhook-signature", &event.webhook_signature),
    ] {
        headers.insert(name, HeaderValue::from_str(value).unwrap());
    }
    let verify = payonce_client::webhooks::verify;
    verify(&created.secret, &headers, event.body.as_bytes()).unwrap();
    let changed = event.body.replace("100", "900");
    assert!(verify(&created.secret, &headers, changed.as_bytes()).is_err());
    let other = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    assert!(verify(other, &headers, event.body.as_bytes()).is_err());
}
