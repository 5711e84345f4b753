//! Holds and refunds over HTTP, in both modes: a hold sets money aside and is captured
//! once; a void and a capture of one hold sent together settle to one; two refunds of 60
//! on a payment of 100 sent together give one 201 and one 409 with 40 refundable — all
//! stored under their tickets and replayed, the ledger's audit clean after.

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{
    Backend, TestAccount, TestApp, assert_problem, read, spawn_app, spawn_app_with,
};
use crate::webhooks::{Receiver, create_endpoint};

impl TestApp {
    /// POSTs `body` to `path` with `account`'s key and `ticket`.
    async fn post_spend(
        &self,
        account: &TestAccount,
        path: &str,
        ticket: &str,
        body: Value,
    ) -> Response {
        self.client
            .post(self.url(path))
            .bearer_auth(&account.key)
            .header("idempotency-key", ticket)
            .json(&body)
            .send()
            .await
            .expect("request")
    }

    /// Places a hold of `amount` lasting `seconds`: its id.
    async fn hold(&self, account: &TestAccount, amount: i64, seconds: i64) -> String {
        let ticket = self.ticket(account).await;
        let (status, _, body) = read(
            self.post_spend(
                account,
                &format!("/v1/accounts/{}/holds", account.id),
                &ticket,
                json!({ "amount": amount, "expires_in": seconds }),
            )
            .await,
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["hold_id"].as_str().expect("hold id").to_owned()
    }
}

async fn a_hold_is_placed_captured_once_and_refunded_within_it(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(100, 0).await;
    let ticket = app.ticket(&ada).await;
    let placing = json!({ "amount": 60, "expires_in": 3600 });
    let path = format!("/v1/accounts/{}/holds", ada.id);
    let (status, replayed, placed) =
        read(app.post_spend(&ada, &path, &ticket, placing.clone()).await).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{placed}");
    assert_eq!(placed["state"], "held");
    assert_eq!(
        (placed["balance"].as_i64(), placed["available"].as_i64()),
        (Some(100), Some(40))
    );
    let (status, replayed, again) = read(app.post_spend(&ada, &path, &ticket, placing).await).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(again, placed);
    let hold = placed["hold_id"].as_str().unwrap().to_owned();
    let account = app
        .get_json(&ada.key, &format!("/v1/accounts/{}", ada.id))
        .await;
    assert_eq!(account["available"], 40, "{account}");

    // The money held is not there for a withdrawal.
    let refused = app.withdraw(&ada, &app.ticket(&ada).await, 41).await;
    assert_problem(refused, StatusCode::PAYMENT_REQUIRED, "insufficient-funds").await;

    let capture = format!("/v1/holds/{hold}/capture");
    let too_much = app
        .post_spend(
            &ada,
            &capture,
            &app.ticket(&ada).await,
            json!({ "amount": 61 }),
        )
        .await;
    let problem = assert_problem(
        too_much,
        StatusCode::UNPROCESSABLE_ENTITY,
        "capture-exceeds-hold",
    )
    .await;
    assert_eq!(problem["held"], 60, "{problem}");
    let (status, _, captured) = read(
        app.post_spend(
            &ada,
            &capture,
            &app.ticket(&ada).await,
            json!({ "amount": 45 }),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{captured}");
    assert_eq!(captured["state"], "captured");
    assert_eq!(captured["captured_amount"], 45);
    assert_eq!(
        (captured["balance"].as_i64(), captured["available"].as_i64()),
        (Some(55), Some(55))
    );
    let void = app
        .post_spend(
            &ada,
            &format!("/v1/holds/{hold}/void"),
            &app.ticket(&ada).await,
            json!({}),
        )
        .await;
    let problem = assert_problem(void, StatusCode::CONFLICT, "hold-not-held").await;
    assert_eq!(problem["state"], "captured", "{problem}");

    let read_back = app.get_json(&ada.key, &format!("/v1/holds/{hold}")).await;
    assert_eq!(read_back["state"], "captured", "{read_back}");
    assert_eq!(read_back["captured_amount"], 45);

    let refunds = format!("/v1/holds/{hold}/refunds");
    let (status, _, refunded) = read(
        app.post_spend(
            &ada,
            &refunds,
            &app.ticket(&ada).await,
            json!({ "amount": 40 }),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{refunded}");
    assert_eq!(
        (
            refunded["refundable"].as_i64(),
            refunded["balance"].as_i64()
        ),
        (Some(5), Some(95))
    );
    let over = app
        .post_spend(
            &ada,
            &refunds,
            &app.ticket(&ada).await,
            json!({ "amount": 6 }),
        )
        .await;
    let problem = assert_problem(over, StatusCode::CONFLICT, "refund-exceeds-payment").await;
    assert_eq!(problem["refundable"], 5, "{problem}");

    let other = app.create_account(100, 0).await;
    let theirs = app.get(&format!("/v1/holds/{hold}")).await;
    assert_eq!(theirs.status(), StatusCode::UNAUTHORIZED);
    let theirs = app.get_as(&other.key, &format!("/v1/holds/{hold}")).await;
    assert_problem(theirs, StatusCode::NOT_FOUND, "hold-not-found").await;
    app.assert_audit_clean().await;
}

/// "Refund twice at once": two refunds of 60 on an order of 100, sent together — one
/// 201, one 409 with 40 refundable, and one refund entry.
async fn two_refunds_at_once_one_fits(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(1000, 0).await;
    let order: Value = app
        .client
        .post(app.url(&format!("/v1/accounts/{}/orders", ada.id)))
        .bearer_auth(&ada.key)
        .json(&json!({ "amount": 100 }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    let pay = app
        .post_spend(
            &ada,
            &format!("/v1/orders/{order_id}/payments"),
            &app.ticket(&ada).await,
            json!({}),
        )
        .await;
    assert_eq!(pay.status(), StatusCode::CREATED);
    let path = format!("/v1/orders/{order_id}/refunds");
    let (first, second) = (app.ticket(&ada).await, app.ticket(&ada).await);
    let (a, b) = tokio::join!(
        app.post_spend(&ada, &path, &first, json!({ "amount": 60 })),
        app.post_spend(&ada, &path, &second, json!({ "amount": 60 })),
    );
    let (a, b) = (read(a).await, read(b).await);
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(
        statuses,
        [StatusCode::CREATED, StatusCode::CONFLICT],
        "{a:?} {b:?}"
    );
    let refused = if a.0 == StatusCode::CONFLICT {
        &a.2
    } else {
        &b.2
    };
    assert_eq!(refused["refundable"], 40, "{refused}");
    assert!(
        refused["type"]
            .as_str()
            .unwrap()
            .ends_with("refund-exceeds-payment")
    );
    let entries = app
        .get_json(&ada.key, &format!("/v1/accounts/{}/entries", ada.id))
        .await;
    let refunds = entries["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|entry| entry["kind"] == "refund")
        .count();
    assert_eq!(refunds, 1, "{entries}");
    app.assert_audit_clean().await;
}

/// A void and a capture of one hold sent together: exactly one 200.
async fn a_void_and_a_capture_at_once_settle_to_one(backend: Backend) {
    let app = spawn_app(backend).await;
    let ada = app.create_account(100, 0).await;
    let hold = app.hold(&ada, 50, 3600).await;
    let (capture_ticket, void_ticket) = (app.ticket(&ada).await, app.ticket(&ada).await);
    let (capture, void) = (
        format!("/v1/holds/{hold}/capture"),
        format!("/v1/holds/{hold}/void"),
    );
    let (captured, voided) = tokio::join!(
        app.post_spend(&ada, &capture, &capture_ticket, json!({})),
        app.post_spend(&ada, &void, &void_ticket, json!({})),
    );
    let mut statuses = [captured.status(), voided.status()];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::OK, StatusCode::CONFLICT]);
    app.assert_audit_clean().await;
}

/// A hold left to expire: expired to a reader at once, and no longer captured; the sweep
/// records it once — one `hold.expired` delivery, showing the hold as `GET` does and naming
/// the ticket that placed it — and counts it in the metrics. Its capture and void, had they
/// come in time, would have announced themselves; a refusal announces nothing.
async fn an_expiry_is_recorded_once_and_announced(backend: Backend) {
    let app = spawn_app_with(
        backend,
        &["--webhook-allow-private", "--hold-sweep", "200ms"],
    )
    .await;
    let receiver = Receiver::start().await;
    let ada = app.create_account(100, 0).await;
    create_endpoint(&app, &ada, &receiver.url, None).await;
    let hold = app.hold(&ada, 40, 1).await;
    let read_back = app.get_json(&ada.key, &format!("/v1/holds/{hold}")).await;
    assert_eq!(read_back["state"], "held", "{read_back}");

    let received = receiver.until(1).await;
    let event = received[0].json();
    assert_eq!(event["type"], "hold.expired", "{event}");
    let read_back = app.get_json(&ada.key, &format!("/v1/holds/{hold}")).await;
    assert_eq!(read_back["state"], "expired", "{read_back}");
    assert_eq!(event["data"]["hold"], read_back);
    assert_eq!(event["data"]["account_id"], ada.id);
    let placing = app
        .get_json(
            &ada.key,
            &format!(
                "/v1/tickets/{}",
                event["data"]["ticket_id"].as_str().unwrap()
            ),
        )
        .await;
    assert_eq!(placing["response"]["body"]["hold_id"], hold, "{placing}");

    let late = app
        .post_spend(
            &ada,
            &format!("/v1/holds/{hold}/capture"),
            &app.ticket(&ada).await,
            json!({}),
        )
        .await;
    let problem = assert_problem(late, StatusCode::CONFLICT, "hold-not-held").await;
    assert_eq!(problem["state"], "expired", "{problem}");
    let account = app
        .get_json(&ada.key, &format!("/v1/accounts/{}", ada.id))
        .await;
    assert_eq!(
        (account["balance"].as_i64(), account["available"].as_i64()),
        (Some(100), Some(100))
    );

    // A few sweeps more: nothing more is recorded or sent.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(receiver.received().len(), 1, "{:#?}", receiver.received());
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("payonce_holds_expired_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("payonce_holds{state=\"overdue\"} 0\n"),
        "{metrics}"
    );
    app.assert_audit_clean().await;
}

/// On PostgreSQL a placing, a capture and a void each go through the group commit — one
/// statement a step, counted in `payonce_ledger_batch_size` — and what their answers show of
/// the hold, filled in by that statement, is what reading the hold shows: its times as the
/// API writes them, to the microsecond.
async fn hold_steps_ride_the_group_commit_and_answer_as_the_hold_reads(backend: Backend) {
    /// A capture's or a void's answer without the account's numbers: the hold it shows.
    fn the_hold(answer: &Value) -> Value {
        let mut hold = answer.clone();
        let fields = hold.as_object_mut().expect("an object");
        fields.remove("balance");
        fields.remove("available");
        hold
    }
    /// The batches sent so far (none shown before the first).
    async fn batches(app: &TestApp) -> u64 {
        let metrics = app.get("/metrics").await.text().await.unwrap();
        metrics
            .lines()
            .find_map(|line| line.strip_prefix("payonce_ledger_batch_size_count "))
            .map_or(0, |count| count.parse().expect("a count"))
    }
    let app = spawn_app(backend).await;
    let ada = app.create_account(100, 0).await;
    let before = batches(&app).await;
    let (status, _, placed) = read(
        app.post_spend(
            &ada,
            &format!("/v1/accounts/{}/holds", ada.id),
            &app.ticket(&ada).await,
            json!({ "amount": 60, "expires_in": 3600 }),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{placed}");
    let hold = placed["hold_id"].as_str().unwrap().to_owned();
    let held = app.get_json(&ada.key, &format!("/v1/holds/{hold}")).await;
    assert_eq!(placed["expires_at"], held["expires_at"], "{placed} {held}");

    let (status, _, captured) = read(
        app.post_spend(
            &ada,
            &format!("/v1/holds/{hold}/capture"),
            &app.ticket(&ada).await,
            json!({}),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{captured}");
    let read_back = app.get_json(&ada.key, &format!("/v1/holds/{hold}")).await;
    assert_eq!(the_hold(&captured), read_back);
    assert_eq!(captured["captured_amount"], 60, "{captured}");
    assert_eq!(
        (captured["balance"].as_i64(), captured["available"].as_i64()),
        (Some(40), Some(40))
    );

    let other = app.hold(&ada, 30, 3600).await;
    let (status, _, voided) = read(
        app.post_spend(
            &ada,
            &format!("/v1/holds/{other}/void"),
            &app.ticket(&ada).await,
            json!({}),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{voided}");
    let read_back = app.get_json(&ada.key, &format!("/v1/holds/{other}")).await;
    assert_eq!(the_hold(&voided), read_back);
    assert_eq!(batches(&app).await, before + 4, "a statement each");
    app.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_steps_ride_the_group_commit_on_postgres() {
    hold_steps_ride_the_group_commit_and_answer_as_the_hold_reads(Backend::Distributed).await;
}

macro_rules! in_both_modes {
    ($($test:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(crate::helpers::Backend::Embedded).await;
                }
            )*
        }
        mod distributed {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(crate::helpers::Backend::Distributed).await;
                }
            )*
        }
    };
}

in_both_modes!(
    a_hold_is_placed_captured_once_and_refunded_within_it,
    two_refunds_at_once_one_fits,
    a_void_and_a_capture_at_once_settle_to_one,
    an_expiry_is_recorded_once_and_announced,
);
