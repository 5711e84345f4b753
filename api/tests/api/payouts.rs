//! Payouts against a real `payonce-bank` (a process of its own, on a free loopback port,
//! with a store of its own): each payout moves money at the bank once, whatever the bank
//! does to the answers; a payout fails and its money comes back only on the bank's word.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    Backend, SendForJson, Shared, TestAccount, TestApp, assert_invalid_request, assert_problem,
    read, spawn_app_with, spawn_with,
};

/// A bank for one test: a `payonce-bank` process of its own (killed when dropped), its
/// store in a directory of its own, and a client to ask it what it did.
pub(crate) struct TestBank {
    pub(crate) url: String,
    process: bank::testing::BankProcess,
    pub(crate) client: reqwest::Client,
}

impl TestBank {
    /// Starts a bank with `flags` beside its address and store.
    async fn start(flags: &[&str]) -> Self {
        let binary = bank::testing::binary_for_tests();
        let process = bank::testing::BankProcess::start(&binary, flags)
            .await
            .expect("payonce-bank starts");
        Self {
            url: process.url(),
            process,
            client: reqwest::Client::new(),
        }
    }

    pub(crate) async fn plain() -> Self {
        Self::start(&[]).await
    }

    /// A bank that meets every transfer request with `fault`; a slow answer takes
    /// `slow_for`.
    async fn always(fault: bank::Fault, slow_for: Duration) -> Self {
        let rate = format!("--fault-{}", fault.name());
        let slow = format!("{}ms", slow_for.as_millis());
        Self::start(&[rate.as_str(), "1", "--slow-for", slow.as_str()]).await
    }

    /// Every transfer the bank holds.
    async fn transfers(&self) -> Vec<Value> {
        let page: Value = self
            .client
            .get(format!("{}/v1/transfers?limit=1000", self.url))
            .send_for_json()
            .await;
        page["transfers"].as_array().cloned().unwrap_or_default()
    }

    /// The bank's own answer for `key`.
    async fn transfer(&self, key: &str) -> (StatusCode, Value) {
        let response = self
            .client
            .get(format!("{}/v1/transfers/{key}", self.url))
            .send()
            .await
            .expect("the bank answers");
        (
            response.status(),
            response.json().await.unwrap_or(Value::Null),
        )
    }

    /// Asks the bank straight for a transfer of `amount` to the test's destination under
    /// `key`, with `reference`.
    pub(crate) async fn make_transfer(
        &self,
        key: &str,
        amount: i64,
        reference: &str,
    ) -> reqwest::Response {
        self.client
            .post(format!("{}/v1/transfers", self.url))
            .header("Idempotency-Key", key)
            .json(&json!({ "destination": "DE89370400440532013000", "amount": amount, "reference": reference }))
            .send()
            .await
            .expect("the bank answers")
    }

    /// `payonce-bank audit` on its store: no key executed twice, the totals add up.
    async fn assert_audit_clean(&self) {
        let audit = tokio::process::Command::new(bank::testing::binary_for_tests())
            .arg("audit")
            .arg("--database-url")
            .arg(self.process.database_url())
            .output()
            .await
            .expect("payonce-bank audit runs");
        assert!(
            audit.status.success(),
            "{}{}",
            String::from_utf8_lossy(&audit.stdout),
            String::from_utf8_lossy(&audit.stderr)
        );
    }

    /// The bank goes away: its process is killed.
    pub(crate) async fn stop(mut self) {
        self.process.kill().await;
    }
}

/// A quick payout schedule: small backoffs, three attempts before the bank is asked by
/// key, idle workers looking every 50 ms.
const QUICK_SCHEDULE: [&str; 8] = [
    "--payout-retry-base",
    "20ms",
    "--payout-retry-max",
    "100ms",
    "--payout-attempts",
    "3",
    "--payout-poll",
    "50ms",
];

/// The flags of an instance that pays out to `bank`, on the quick schedule; each call
/// bounded by `timeout`, each claim by `lease`.
pub(crate) fn paying_to<'a>(bank: &'a TestBank, timeout: &'a str, lease: &'a str) -> Vec<&'a str> {
    paying_to_url(&bank.url, timeout, lease)
}

/// The flags of an instance that pays out to the bank at `url`, as [`paying_to`].
fn paying_to_url<'a>(url: &'a str, timeout: &'a str, lease: &'a str) -> Vec<&'a str> {
    let mut flags = vec![
        "--bank-url",
        url,
        "--bank-timeout",
        timeout,
        "--payout-lease",
        lease,
    ];
    flags.extend(QUICK_SCHEDULE);
    flags
}

impl TestApp {
    async fn pay_out(&self, account: &TestAccount, ticket: &str, amount: i64) -> reqwest::Response {
        self.spend(
            account,
            "payouts",
            ticket,
            json!({ "amount": amount, "destination": "DE89370400440532013000" }),
        )
        .await
    }

    /// A payout that asks the bank to play `fault` (`Payonce-Bank-Fault`).
    async fn pay_out_with_fault(
        &self,
        account: &TestAccount,
        ticket: &str,
        amount: i64,
        fault: &str,
    ) -> reqwest::Response {
        self.client
            .post(self.url(&format!("/v1/accounts/{}/payouts", account.id)))
            .bearer_auth(&account.key)
            .header("Idempotency-Key", ticket)
            .header("Payonce-Bank-Fault", fault)
            .json(&json!({ "amount": amount, "destination": "DE89370400440532013000" }))
            .send()
            .await
            .expect("request")
    }

    /// What the bank holds for a payout, as payonce asks it.
    async fn at_bank(&self, account: &TestAccount, payout: &str) -> reqwest::Response {
        self.get_as(&account.key, &format!("/v1/payouts/{payout}/bank"))
            .await
    }

    /// The bank's one executed transfer for a settled `payout`, under its key, of its
    /// amount — the transfer the payout recorded.
    async fn assert_one_transfer_at_bank(&self, account: &TestAccount, payout: &Value) {
        let id = payout["payout_id"].as_str().expect("an id");
        let (status, _, held) = read(self.at_bank(account, id).await).await;
        assert_eq!(status, StatusCode::OK, "{held}");
        assert_eq!(
            (&held["payout_id"], &held["bank_key"], &held["executed"]),
            (&payout["payout_id"], &payout["bank_key"], &json!(1)),
            "{held}"
        );
        let transfers = held["transfers"].as_array().expect("transfers");
        assert_eq!(transfers.len(), 1, "{held}");
        let transfer = &transfers[0];
        assert_eq!(
            (
                &transfer["idempotency_key"],
                &transfer["state"],
                &transfer["amount"],
                &transfer["reference"]
            ),
            (
                &payout["bank_key"],
                &json!("executed"),
                &payout["amount"],
                &payout["payout_id"]
            ),
            "{held}"
        );
        assert_eq!(
            payout["bank_transfer_id"].as_str(),
            Some(transfer["id"].to_string().as_str())
        );
    }

    /// How many demonstration faults wait for a payout's first attempt.
    fn faults_waiting(&self) -> usize {
        self.state
            .payouts()
            .and_then(|payouts| payouts.first_attempt_faults())
            .map_or(0, api::bank_fault::FirstAttemptFaults::waiting)
    }

    async fn payout(&self, account: &TestAccount, payout: &str) -> reqwest::Response {
        self.get_as(&account.key, &format!("/v1/payouts/{payout}"))
            .await
    }

    /// The payout once the bank's word is recorded (bounded: 20 s).
    pub(crate) async fn settled(&self, account: &TestAccount, payout: &str) -> Value {
        for _ in 0..400 {
            let (status, _, body) = read(self.payout(account, payout).await).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            if body["status"] != "pending" {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("payout {payout} still pending after 20 s");
    }

    /// Takes a ticket and pays out `amount`: the accepted payout's id.
    pub(crate) async fn accepted_payout(&self, account: &TestAccount, amount: i64) -> String {
        let ticket = self.ticket(account).await;
        let (status, _, body) = read(self.pay_out(account, &ticket, amount).await).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        body["payout_id"].as_str().expect("a payout id").to_owned()
    }
}

/// The happy path on both backends: 202 with `Location` and the payout pending, a replay
/// of the same 202, then `succeeded` with the bank's transfer id — one transfer at the
/// bank under the payout's key, of its amount; the balance down once; the audits clean.
pub async fn a_payout_reaches_the_bank_once(backend: Backend) {
    let bank = TestBank::plain().await;
    let app = spawn_app_with(backend, &paying_to(&bank, "500ms", "2s")).await;
    let account = app.create_account(1000, 0).await;
    let ticket = app.ticket(&account).await;
    let first = app.pay_out(&account, &ticket, 300).await;
    let location = first
        .headers()
        .get("location")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let (status, replayed, body) = read(first).await;
    assert_eq!((status, replayed), (StatusCode::ACCEPTED, false), "{body}");
    let payout = body["payout_id"].as_str().expect("an id").to_owned();
    assert_eq!(location, Some(format!("/v1/payouts/{payout}")));
    assert_eq!(
        (&body["status"], &body["amount"], &body["balance"]),
        (&json!("pending"), &json!(300), &json!(700))
    );
    let again = app.pay_out(&account, &ticket, 300).await;
    assert_eq!(
        again
            .headers()
            .get("location")
            .map(|value| value.as_bytes().to_vec()),
        location.as_ref().map(|l| l.as_bytes().to_vec())
    );
    let (status, replayed, replay) = read(again).await;
    assert_eq!(
        (status, replayed, &replay),
        (StatusCode::ACCEPTED, true, &body)
    );

    let settled = app.settled(&account, &payout).await;
    assert_eq!(settled["status"], "succeeded", "{settled}");
    let key = settled["bank_key"].as_str().expect("the key").to_owned();
    let (status, transfer) = bank.transfer(&key).await;
    assert_eq!(
        (status, &transfer["state"]),
        (StatusCode::OK, &json!("executed"))
    );
    assert_eq!(transfer["amount"], 300);
    assert_eq!(
        settled["bank_transfer_id"].as_str(),
        Some(transfer["id"].to_string().as_str())
    );
    assert_eq!(bank.transfers().await.len(), 1);
    assert_eq!(app.balance(&account).await.0, 700);
    app.assert_audit_clean().await;
    bank.assert_audit_clean().await;
    app.stop().await;
    bank.stop().await;
}

/// Every answer lost after the bank committed (`commit-then-drop`): the payout is sent
/// again with the same key until the attempts run out, then the bank is asked by key —
/// and the transfer it made once is the payout's. Never a second transfer.
pub async fn lost_answers_after_the_commit_pay_once(backend: Backend) {
    let bank = TestBank::always(bank::Fault::CommitThenDrop, Duration::ZERO).await;
    let app = spawn_app_with(backend, &paying_to(&bank, "500ms", "2s")).await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 250).await;
    let settled = app.settled(&account, &payout).await;
    assert_eq!(settled["status"], "succeeded", "{settled}");
    assert_eq!(settled["attempts"], 3, "{settled}");
    assert_eq!(bank.transfers().await.len(), 1);
    app.assert_one_transfer_at_bank(&account, &settled).await;
    assert_eq!(app.balance(&account).await.0, 750);
    app.assert_audit_clean().await;
    bank.assert_audit_clean().await;
    app.stop().await;
    bank.stop().await;
}

/// Answers slower than the bank timeout (`commit-then-slow`): every attempt's outcome is
/// unknown, yet the bank holds one transfer and the payout is succeeded.
pub async fn slow_answers_after_the_commit_pay_once(backend: Backend) {
    let bank = TestBank::always(bank::Fault::CommitThenSlow, Duration::from_secs(2)).await;
    let app = spawn_app_with(backend, &paying_to(&bank, "500ms", "2s")).await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 100).await;
    let settled = app.settled(&account, &payout).await;
    assert_eq!(settled["status"], "succeeded", "{settled}");
    assert_eq!(bank.transfers().await.len(), 1);
    assert_eq!(app.balance(&account).await.0, 900);
    app.assert_audit_clean().await;
    app.stop().await;
    bank.stop().await;
}

/// The bank's final refusal (422 `destination-closed`, stored under the key): the payout
/// fails with that reason and its money comes back, once — one reversal entry.
pub async fn a_declined_payout_is_credited_back(backend: Backend) {
    let bank = TestBank::always(bank::Fault::Decline, Duration::ZERO).await;
    let app = spawn_app_with(backend, &paying_to(&bank, "500ms", "2s")).await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 400).await;
    let settled = app.settled(&account, &payout).await;
    assert_eq!(
        (&settled["status"], &settled["failure_reason"]),
        (
            &json!("failed"),
            &json!("the bank refused: destination-closed")
        ),
        "{settled}"
    );
    assert_eq!(app.balance(&account).await.0, 1000);
    let transfers = bank.transfers().await;
    assert_eq!(transfers.len(), 1, "{transfers:?}");
    assert_eq!(
        transfers[0]["state"], "declined",
        "no money moved at the bank"
    );
    let entries: Value = app
        .get_json(
            &account.key,
            &format!("/v1/accounts/{}/entries", account.id),
        )
        .await;
    let kinds: Vec<&str> = entries["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|entry| entry["payout_id"] == json!(payout))
        .map(|entry| entry["kind"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(kinds, ["payout", "payout_reversal"]);
    app.assert_audit_clean().await;
    app.stop().await;
    bank.stop().await;
}

/// A bank that never executes (`fail-before`, 500 every time): after the attempts the bank
/// is asked, has nothing, and the key is closed there — only then does the payout fail
/// and its money come back; the closed key takes no transfer later.
pub async fn a_payout_the_bank_never_made_fails_only_once_its_key_is_closed(backend: Backend) {
    let bank = TestBank::always(bank::Fault::FailBefore, Duration::ZERO).await;
    let app = spawn_app_with(backend, &paying_to(&bank, "500ms", "2s")).await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 600).await;
    let settled = app.settled(&account, &payout).await;
    assert_eq!(settled["status"], "failed", "{settled}");
    assert!(
        settled["failure_reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("closed")),
        "{settled}"
    );
    assert_eq!(app.balance(&account).await.0, 1000);
    let key = settled["bank_key"].as_str().expect("the key");
    let (status, closed) = bank.transfer(key).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{closed}");
    assert!(
        closed["type"]
            .as_str()
            .is_some_and(|kind| kind.ends_with("idempotency-key-closed"))
    );
    // The closed key takes nothing later, even from a request that gets through.
    let late = bank.make_transfer(key, 600, &payout).await;
    assert!(late.status() == StatusCode::CONFLICT || late.status().is_server_error());
    assert!(bank.transfers().await.is_empty());
    app.assert_audit_clean().await;
    app.stop().await;
    bank.stop().await;
}

/// A bank that does not answer at all: the payout stays pending — no reversal without the
/// bank's word — and shows in `?status=pending` and the metrics, with its last error.
pub async fn a_payout_stays_pending_while_the_bank_is_away(backend: Backend) {
    // A port nothing listens on.
    let away = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!("http://{}", away.local_addr().expect("an address"));
    drop(away);
    let app = spawn_app_with(
        backend,
        &[
            "--bank-url",
            &url,
            "--payout-retry-base",
            "20ms",
            "--payout-retry-max",
            "50ms",
            "--payout-attempts",
            "2",
            "--payout-poll",
            "50ms",
        ],
    )
    .await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 100).await;
    let mut shown = Value::Null;
    for _ in 0..200 {
        shown = read(app.payout(&account, &payout).await).await.2;
        if shown["attempts"].as_u64().unwrap_or_default() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(shown["status"], "pending", "{shown}");
    assert!(
        shown["attempts"].as_u64().unwrap_or_default() >= 4,
        "{shown}"
    );
    assert!(shown["last_error"].is_string(), "{shown}");
    assert_eq!(app.balance(&account).await.0, 900);
    let (status, _, pending) =
        read(app.get_as(&account.key, "/v1/payouts?status=pending").await).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        pending["payouts"][0]["payout_id"],
        json!(payout),
        "{pending}"
    );
    let mut counted = 0.0;
    for _ in 0..100 {
        counted = app.metric("payonce_payouts{status=\"pending\"}").await;
        if counted == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(counted, 1.0);
    app.assert_audit_clean().await;
    app.stop().await;
}

/// A gateway on a loopback port of its own in front of `bank`: it swallows every transfer
/// request (no answer, nothing passed on) and passes everything else — look-ups by key,
/// closes — to the bank and its answer back. Every transfer call times out; every
/// question gets the real bank's answer. Its URL.
async fn swallowing_transfers(bank: &TestBank) -> String {
    use axum::http::{Method, StatusCode as AxumStatus, Uri};
    let client = reqwest::Client::new();
    let base = bank.url.clone();
    let gateway = axum::Router::new()
        .route(
            "/v1/transfers",
            axum::routing::post(std::future::pending::<()>),
        )
        .fallback(move |method: Method, uri: Uri, body: axum::body::Bytes| {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let answer = client
                    .request(method, format!("{base}{uri}"))
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .expect("the bank answers");
                let status = AxumStatus::from_u16(answer.status().as_u16()).expect("a status");
                (status, answer.bytes().await.expect("a body"))
            }
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!("http://{}", listener.local_addr().expect("an address"));
    tokio::spawn(async move { axum::serve(listener, gateway).await });
    url
}

/// Asserts `text` (a payout's view, a page of them, an event's body) names nothing of
/// the bank at `bank_url`: neither its URL, nor its host and port, nor its port alone in
/// the payout's own words.
fn assert_names_no_bank(text: &str, bank_url: &str) {
    let address = bank_url.trim_start_matches("http://");
    let port = address.rsplit(':').next().expect("a port");
    for shown in [bank_url, address, "http://", "127.0.0.1"] {
        assert!(!text.contains(shown), "{shown:?} shown: {text}");
    }
    let body: Value = serde_json::from_str(text).expect("JSON");
    let mut reasons = Vec::new();
    collect_reasons(&body, &mut reasons);
    for reason in reasons {
        assert!(!reason.contains(port), "the port {port} in {reason:?}");
    }
}

/// Every `last_error` and `failure_reason` in `value`, however deep.
fn collect_reasons(value: &Value, into: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            for (name, field) in fields {
                match (name.as_str(), field) {
                    ("last_error" | "failure_reason", Value::String(reason)) => {
                        into.push(reason.clone());
                    }
                    _ => collect_reasons(field, into),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_reasons(item, into)),
        _ => {}
    }
}

/// The bank's address never reaches the account. A bank nothing listens on: the pending
/// payout's `last_error`, alone and in the list, says "cannot connect to the bank" and no
/// URL, host or port. A bank behind a gateway that swallows transfers: each call times
/// out, the bank has nothing under the key and closes it, and the failed payout's
/// `failure_reason` — in `GET /v1/payouts` and in its `payout.failed` event — says the
/// bank did not answer within the timeout, and names no address either.
pub async fn the_banks_address_reaches_no_account(backend: Backend) {
    let away = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let away_url = format!("http://{}", away.local_addr().expect("an address"));
    drop(away);
    let mut flags = vec!["--bank-url", away_url.as_str()];
    flags.extend(QUICK_SCHEDULE);
    let app = spawn_app_with(backend, &flags).await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 100).await;
    let mut shown = Value::Null;
    for _ in 0..200 {
        shown = read(app.payout(&account, &payout).await).await.2;
        // Past the attempts: the last one asked the bank by key too, and got no answer.
        if shown["attempts"].as_u64().unwrap_or_default() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(shown["status"], "pending", "{shown}");
    let last_error = shown["last_error"].as_str().unwrap_or_default();
    assert!(
        last_error.starts_with("cannot connect to the bank"),
        "{shown}"
    );
    assert_names_no_bank(&shown.to_string(), &away_url);
    let (status, _, listed) = read(app.get_as(&account.key, "/v1/payouts").await).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["payouts"][0]["payout_id"], json!(payout), "{listed}");
    assert_names_no_bank(&listed.to_string(), &away_url);
    app.stop().await;

    let bank = TestBank::plain().await;
    let gateway = swallowing_transfers(&bank).await;
    let mut flags = vec!["--webhook-allow-private"];
    flags.extend(paying_to_url(&gateway, "300ms", "2s"));
    let app = spawn_app_with(backend, &flags).await;
    let account = app.create_account(1000, 0).await;
    let receiver = crate::webhooks::Receiver::start().await;
    crate::webhooks::create_endpoint(&app, &account, &receiver.url, Some(&["payout.failed"])).await;
    let payout = app.accepted_payout(&account, 400).await;
    let settled = app.settled(&account, &payout).await;
    assert_eq!(
        (&settled["status"], &settled["failure_reason"]),
        (
            &json!("failed"),
            &json!(
                "not made (the bank did not answer within the timeout); the key is closed at the bank"
            )
        ),
        "{settled}"
    );
    assert_names_no_bank(&settled.to_string(), &gateway);
    assert_names_no_bank(&settled.to_string(), &bank.url);
    assert_eq!(app.balance(&account).await.0, 1000);
    let event = receiver.until(1).await[0].json();
    assert_eq!(
        (&event["type"], &event["data"]["payout"]["failure_reason"]),
        (&json!("payout.failed"), &settled["failure_reason"]),
        "{event}"
    );
    assert_names_no_bank(&event.to_string(), &gateway);
    assert_names_no_bank(&event.to_string(), &bank.url);
    assert!(bank.transfers().await.is_empty());
    app.assert_audit_clean().await;
    bank.assert_audit_clean().await;
    app.stop().await;
    bank.stop().await;
}

/// A bank that throttles (429 with `Retry-After`) more times than the attempt budget,
/// then takes the transfer: the throttles count toward no budget, so the payout is sent
/// until it gets through — succeeded once, at the attempt after the last throttle, the
/// money at the bank and not back in the balance.
pub async fn a_bank_that_throttles_past_the_attempts_is_waited_out(backend: Backend) {
    // Five throttles; the quick schedule asks the bank by key after three attempts.
    let bank = TestBank::start(&["--throttle-first", "5"]).await;
    let app = spawn_app_with(backend, &paying_to(&bank, "500ms", "2s")).await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 300).await;
    let settled = app.settled(&account, &payout).await;
    assert_eq!(
        (&settled["status"], &settled["attempts"]),
        (&json!("succeeded"), &json!(6)),
        "{settled}"
    );
    assert_eq!(
        app.balance(&account).await.0,
        700,
        "the money is not returned"
    );
    assert_eq!(bank.transfers().await.len(), 1);
    app.assert_one_transfer_at_bank(&account, &settled).await;
    app.assert_audit_clean().await;
    bank.assert_audit_clean().await;
    app.stop().await;
    bank.stop().await;
}

/// A bank that throttles every transfer: the payout is sent again (more often than the
/// attempt budget) until it is older than `PAYONCE_PAYOUT_THROTTLE_MAX_AGE`; then the bank
/// is asked by key, has nothing, closes the key — and only then does the payout fail and
/// its money come back, with a reason that says the bank kept asking to wait.
pub async fn a_payout_throttled_past_its_age_fails_once_its_key_is_closed(backend: Backend) {
    let bank = TestBank::start(&["--throttle-first", "1000000"]).await;
    let mut flags = paying_to(&bank, "500ms", "2s");
    flags.extend(["--payout-throttle-max-age", "1s"]);
    let app = spawn_app_with(backend, &flags).await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 300).await;
    let settled = app.settled(&account, &payout).await;
    assert_eq!(settled["status"], "failed", "{settled}");
    assert_eq!(
        settled["failure_reason"],
        json!(
            "not made (the bank answered 429 (rate-limited), still asking to wait once the payout was 1s old); the key is closed at the bank"
        ),
        "{settled}"
    );
    assert!(
        settled["attempts"].as_u64().unwrap_or_default() > 3,
        "throttles did not count toward the three attempts: {settled}"
    );
    assert_eq!(app.balance(&account).await.0, 1000);
    let key = settled["bank_key"].as_str().expect("the key");
    let (status, closed) = bank.transfer(key).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{closed}");
    assert!(bank.transfers().await.is_empty());
    app.assert_audit_clean().await;
    bank.assert_audit_clean().await;
    app.stop().await;
    bank.stop().await;
}

/// A worker that stops mid-call (its instance shut down while the bank held the answer)
/// leaves its payout leased; once the lease runs out the other instance sends it again
/// with the same key, and the bank's one transfer is the payout's.
pub async fn an_instance_that_stops_mid_call_is_taken_over() {
    let bank = TestBank::always(bank::Fault::CommitThenSlow, Duration::from_secs(30)).await;
    let shared = Shared::new(Backend::Distributed).await;
    // The first instance's call outlasts it: a long bank timeout, a long lease.
    let first = spawn_with(shared.clone(), &paying_to(&bank, "20s", "1m")).await;
    let account = first.create_account(1000, 0).await;
    let payout = first.accepted_payout(&account, 300).await;
    // The bank has executed it (the answer is held back): the first worker is mid-call.
    for _ in 0..200 {
        if !bank.transfers().await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(bank.transfers().await.len(), 1);
    first.stop().await;
    // Its lease still runs a minute: shorten it by hand, as time passing would.
    shared
        .database
        .execute("UPDATE outbox SET lease_until = now() - interval '1 second'")
        .await
        .expect("the lease ends");
    let second = spawn_with(shared.clone(), &paying_to(&bank, "300ms", "2s")).await;
    let settled = second.settled(&account, &payout).await;
    assert_eq!(settled["status"], "succeeded", "{settled}");
    assert!(
        settled["attempts"].as_u64().unwrap_or_default() >= 2,
        "{settled}"
    );
    assert_eq!(bank.transfers().await.len(), 1);
    second.assert_audit_clean().await;
    second.stop().await;
    bank.stop().await;
}

/// Bad payouts store nothing: an invalid destination or amount is 422, and a distributed
/// instance without a bank refuses payouts (503 `payouts-unavailable`) with the ticket
/// still usable; another account's payout is not found.
pub async fn payouts_refuse_what_they_cannot_do() {
    let app = spawn_app_with(Backend::Distributed, &[]).await;
    let account = app.create_account(1000, 0).await;
    let ticket = app.ticket(&account).await;
    for body in [
        json!({ "amount": 10, "destination": "has space" }),
        json!({ "amount": 10, "destination": "" }),
        json!({ "amount": 0, "destination": "acct" }),
        json!({ "amount": 10 }),
    ] {
        let response = app.spend(&account, "payouts", &ticket, body).await;
        assert_invalid_request(response).await;
    }
    let response = app.pay_out(&account, &ticket, 10).await;
    assert_problem(
        response,
        StatusCode::SERVICE_UNAVAILABLE,
        "payouts-unavailable",
    )
    .await;
    assert_eq!(app.shown_ticket(&account, &ticket).await["state"], "issued");
    app.stop().await;

    let bank = TestBank::plain().await;
    let app = spawn_app_with(Backend::Embedded, &paying_to(&bank, "500ms", "2s")).await;
    let mine = app.create_account(1000, 0).await;
    let other = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&mine, 5).await;
    let response = app.payout(&other, &payout).await;
    assert_problem(response, StatusCode::NOT_FOUND, "payout-not-found").await;
    let response = app.payout(&mine, "not-a-uuid").await;
    assert_problem(response, StatusCode::NOT_FOUND, "payout-not-found").await;
    app.stop().await;
    bank.stop().await;
}

/// The embedded mode without `PAYONCE_BANK_URL` pays out to a bank of its own, in the
/// process: a newcomer's payout succeeds with nothing else running.
pub async fn the_embedded_mode_pays_out_to_a_bank_of_its_own() {
    let app = spawn_app_with(Backend::Embedded, &["--payout-poll", "50ms"]).await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 123).await;
    let settled = app.settled(&account, &payout).await;
    assert_eq!(settled["status"], "succeeded", "{settled}");
    assert_eq!(app.balance(&account).await.0, 877);
    app.stop().await;
}

/// The embedded mode's demonstration: `Payonce-Bank-Fault: commit-then-drop` on a payout
/// makes its in-process bank execute the first attempt and drop the answer; the second
/// attempt, under the same key, gets the stored answer — succeeded at attempt 2, the
/// balance down once. A replay of the request adds no fault, and the next payout without
/// the header goes through at its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_demonstration_fault_strikes_the_first_attempt_only() {
    let app = spawn_app_with(Backend::Embedded, &QUICK_SCHEDULE).await;
    let account = app.create_account(1000, 0).await;
    let ticket = app.ticket(&account).await;
    let (status, replayed, accepted) = read(
        app.pay_out_with_fault(&account, &ticket, 300, "commit-then-drop")
            .await,
    )
    .await;
    assert_eq!(
        (status, replayed),
        (StatusCode::ACCEPTED, false),
        "{accepted}"
    );
    let payout = accepted["payout_id"].as_str().expect("an id").to_owned();
    let settled = app.settled(&account, &payout).await;
    assert_eq!(
        (&settled["status"], &settled["attempts"]),
        (&json!("succeeded"), &json!(2)),
        "one attempt struck, the next replayed: {settled}"
    );
    assert!(settled["last_error"].is_null(), "{settled}");
    app.assert_one_transfer_at_bank(&account, &settled).await;
    assert_eq!(app.balance(&account).await.0, 700);
    assert_eq!(app.faults_waiting(), 0, "the first attempt took the fault");

    let (status, replayed, replay) = read(
        app.pay_out_with_fault(&account, &ticket, 300, "decline")
            .await,
    )
    .await;
    assert_eq!(
        (status, replayed, &replay),
        (StatusCode::ACCEPTED, true, &accepted)
    );
    assert_eq!(app.faults_waiting(), 0, "a replay's fault is not kept");
    let plain = app.accepted_payout(&account, 100).await;
    let settled = app.settled(&account, &plain).await;
    assert_eq!(
        (&settled["status"], &settled["attempts"]),
        (&json!("succeeded"), &json!(1)),
        "{settled}"
    );
    assert_eq!(app.balance(&account).await.0, 600);
    app.assert_audit_clean().await;
    app.stop().await;
}

/// `Payonce-Bank-Fault` is refused before anything is stored: a name the bank does not
/// know (400 `bank-fault-unknown`), and any fault at all on an instance whose bank is at
/// `PAYONCE_BANK_URL` (422 `bank-fault-refused`) — that bank, though it would heed the
/// header, never gets it; the ticket then pays out plainly, at the first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_demonstration_fault_is_refused_unless_the_bank_is_in_process() {
    let app = spawn_app_with(Backend::Embedded, &QUICK_SCHEDULE).await;
    let account = app.create_account(1000, 0).await;
    let ticket = app.ticket(&account).await;
    for bad in ["explode", "", "commit-then-drop, decline"] {
        let response = app.pay_out_with_fault(&account, &ticket, 10, bad).await;
        assert_problem(response, StatusCode::BAD_REQUEST, "bank-fault-unknown").await;
    }
    assert_eq!(app.shown_ticket(&account, &ticket).await["state"], "issued");
    assert_eq!(app.faults_waiting(), 0);
    app.stop().await;

    let bank = TestBank::start(&["--demo-header"]).await;
    let app = spawn_app_with(Backend::Embedded, &paying_to(&bank, "500ms", "2s")).await;
    let account = app.create_account(1000, 0).await;
    let ticket = app.ticket(&account).await;
    let response = app
        .pay_out_with_fault(&account, &ticket, 10, "commit-then-drop")
        .await;
    assert_problem(
        response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "bank-fault-refused",
    )
    .await;
    assert_eq!(app.shown_ticket(&account, &ticket).await["state"], "issued");
    assert_eq!(app.balance(&account).await.0, 1000);
    assert!(bank.transfers().await.is_empty());
    let (status, _, accepted) = read(app.pay_out(&account, &ticket, 10).await).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let payout = accepted["payout_id"].as_str().expect("an id");
    let settled = app.settled(&account, payout).await;
    assert_eq!(
        (&settled["status"], &settled["attempts"]),
        (&json!("succeeded"), &json!(1)),
        "{settled}"
    );
    assert_eq!(bank.transfers().await.len(), 1);
    app.assert_audit_clean().await;
    app.stop().await;
    bank.stop().await;
}

/// `GET /v1/payouts/{id}/bank` is the payout's account's: another account's payout, or
/// none, is 404, no key 401; a bank that does not answer is 503 `bank-unavailable`, and
/// while the bank has not made the payout it holds nothing for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bank_view_is_the_payouts_account_and_says_when_the_bank_is_away() {
    let bank = TestBank::plain().await;
    let app = spawn_app_with(Backend::Embedded, &paying_to(&bank, "500ms", "2s")).await;
    let mine = app.create_account(1000, 0).await;
    let other = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&mine, 5).await;
    let settled = app.settled(&mine, &payout).await;
    app.assert_one_transfer_at_bank(&mine, &settled).await;
    let response = app.at_bank(&other, &payout).await;
    assert_problem(response, StatusCode::NOT_FOUND, "payout-not-found").await;
    let response = app.at_bank(&mine, &uuid::Uuid::new_v4().to_string()).await;
    assert_problem(response, StatusCode::NOT_FOUND, "payout-not-found").await;
    let response = app.get(&format!("/v1/payouts/{payout}/bank")).await;
    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    app.stop().await;
    bank.stop().await;

    // A port nothing listens on: the payout stays pending, and the bank cannot be asked.
    let away = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!("http://{}", away.local_addr().expect("an address"));
    drop(away);
    let mut flags = vec!["--bank-url", url.as_str()];
    flags.extend(QUICK_SCHEDULE);
    let app = spawn_app_with(Backend::Embedded, &flags).await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 100).await;
    let response = app.at_bank(&account, &payout).await;
    assert_problem(
        response,
        StatusCode::SERVICE_UNAVAILABLE,
        "bank-unavailable",
    )
    .await;
    assert_eq!(
        read(app.payout(&account, &payout).await).await.2["status"],
        "pending"
    );
    app.stop().await;

    // A bank that never made it (every request fails before anything is done): nothing.
    let refusing = TestBank::always(bank::Fault::FailBefore, Duration::ZERO).await;
    let app = spawn_app_with(Backend::Embedded, &paying_to(&refusing, "500ms", "2s")).await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 100).await;
    let (status, _, held) = read(app.at_bank(&account, &payout).await).await;
    assert_eq!(
        (status, &held["executed"], &held["transfers"]),
        (StatusCode::OK, &json!(0), &json!([])),
        "{held}"
    );
    app.stop().await;
    refusing.stop().await;
}

// Each listed case on both backends.
on_backends!(
    payouts;
    on_postgres_and_redis => Distributed,
    embedded => Embedded;
    [
        a_payout_reaches_the_bank_once,
        lost_answers_after_the_commit_pay_once,
        slow_answers_after_the_commit_pay_once,
        a_declined_payout_is_credited_back,
        a_payout_the_bank_never_made_fails_only_once_its_key_is_closed,
        a_payout_stays_pending_while_the_bank_is_away,
        the_banks_address_reaches_no_account,
        a_bank_that_throttles_past_the_attempts_is_waited_out,
        a_payout_throttled_past_its_age_fails_once_its_key_is_closed,
    ]
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_instances_payout_is_taken_over() {
    an_instance_that_stops_mid_call_is_taken_over().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_payouts_store_nothing() {
    payouts_refuse_what_they_cannot_do().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_mode_pays_out_without_a_bank_url() {
    the_embedded_mode_pays_out_to_a_bank_of_its_own().await;
}

/// The demonstration's unsafe recipe (`PAYONCE_PAYOUT_KEYS=fresh-key-per-attempt`): a new
/// key on every attempt, every answer dropped after the bank committed — the bank pays on
/// each attempt, and when payonce then asks for the payout's own key it finds nothing and
/// gives the money back too. `payonce reconcile` says both. (The one-key dispatcher under
/// the same bank: `lost_answers_after_the_commit_pay_once`.)
#[cfg(feature = "demo")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fresh_key_per_attempt_pays_on_every_attempt() {
    let bank = TestBank::always(bank::Fault::CommitThenDrop, Duration::ZERO).await;
    let mut flags = paying_to(&bank, "500ms", "2s");
    flags.extend(["--payout-keys", "fresh-key-per-attempt"]);
    let app = spawn_app_with(Backend::Distributed, &flags).await;
    let account = app.create_account(1000, 0).await;
    let payout = app.accepted_payout(&account, 100).await;
    let settled = app.settled(&account, &payout).await;
    let transfers = bank.transfers().await;
    assert_eq!(transfers.len(), 3, "one per attempt: {transfers:?}");
    assert!(transfers.iter().all(|t| t["reference"] == json!(payout)));
    let (_, _, held) = read(app.at_bank(&account, &payout).await).await;
    assert_eq!(held["executed"], 3, "the bank's view shows each: {held}");
    assert_eq!(settled["status"], "failed", "{settled}");
    assert_eq!(
        app.balance(&account).await.0,
        1000,
        "and the money came back too"
    );
    let bank_url = url::Url::parse(&bank.url).expect("a URL");
    let found = api::reconcile::reconcile(app.state.ledger(), &bank_url)
        .await
        .expect("it reconciles");
    let said = found.findings.join("\n");
    assert!(said.contains("executed 3 times at the bank"), "{said}");
    assert!(
        said.contains("failed and its money came back, but the bank executed it"),
        "{said}"
    );
    app.stop().await;
    bank.stop().await;
}
