//! Once per key: the first request executes, a repeat replays, another body is refused,
//! bad input stores nothing, a crowd under one key executes once; the list.

use futures::future::join_all;
use serde_json::json;

use crate::on_both_stores;
use crate::support::{Bank, Db, body, key};

/// The first request executes (201, no replay mark); the same request again answers the
/// stored answer marked `Idempotent-Replayed: true`; GET by key shows the transfer.
async fn first_executes_and_a_repeat_replays(db: Db) {
    let bank = Bank::start(db, &[]).await;
    let key = key();
    let first = bank
        .transfer(&key, &body("acct-1", 500, "payout 1"), None)
        .await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());
    assert_eq!(first.body["state"], "executed");
    assert_eq!(first.body["amount"], 500);
    assert_eq!(first.body["idempotency_key"], key.as_str());

    let again = bank
        .transfer(&key, &body("acct-1", 500, "payout 1"), None)
        .await;
    assert_eq!(again.status, 201);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);

    let found = bank.get(&format!("/v1/transfers/{key}")).await;
    assert_eq!(found.status, 200);
    assert_eq!(found.body, first.body);
    let missing = bank
        .get(&format!("/v1/transfers/{}", crate::support::key()))
        .await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.problem(), "transfer-not-found");
    assert_eq!(bank.all_transfers().await.len(), 1);
}
on_both_stores!(first_executes_and_a_repeat_replays);

/// The same key with another body is 422 `idempotency-key-reuse` and moves nothing.
async fn a_key_reused_for_another_body_is_refused(db: Db) {
    let bank = Bank::start(db, &[]).await;
    let key = key();
    assert_eq!(
        bank.transfer(&key, &body("acct-1", 500, "r"), None)
            .await
            .status,
        201
    );
    for other in [
        body("acct-1", 501, "r"),
        body("acct-2", 500, "r"),
        body("acct-1", 500, "s"),
    ] {
        let refused = bank.transfer(&key, &other, None).await;
        assert_eq!(refused.status, 422, "{refused:?}");
        assert_eq!(refused.problem(), "idempotency-key-reuse");
        assert!(!refused.replayed());
    }
    let transfers = bank.all_transfers().await;
    assert_eq!(transfers.len(), 1);
    assert_eq!(transfers[0]["amount"], 500);
    bank.assert_audit_clean("1 transfers executed, 500 in total")
        .await;
}
on_both_stores!(a_key_reused_for_another_body_is_refused);

/// Bad input is a 4xx problem and stores nothing: the same key then executes afresh.
#[tokio::test]
async fn bad_input_is_a_problem_and_stores_nothing() {
    let bank = Bank::start(Db::Sqlite, &[]).await;
    let key = key();
    let post = || bank.http.post(bank.url("/v1/transfers"));
    let send = |request: reqwest::RequestBuilder| async move {
        crate::support::Answer::from(request.send().await.expect("an answer")).await
    };

    let no_key = send(post().json(&body("acct-1", 5, ""))).await;
    assert_eq!(
        (no_key.status, no_key.problem()),
        (400, "idempotency-key-missing")
    );
    for bad_key in ["", "has space", &"k".repeat(256), "tab\there"] {
        let answer = send(
            post()
                .header("Idempotency-Key", bad_key)
                .json(&body("acct-1", 5, "")),
        )
        .await;
        assert_eq!(
            (answer.status, answer.problem()),
            (400, "invalid-idempotency-key"),
            "{bad_key:?}"
        );
    }
    let with_key = || post().header("Idempotency-Key", &key);
    let not_json = send(with_key().header("content-type", "text/plain").body("{}")).await;
    assert_eq!(
        (not_json.status, not_json.problem()),
        (415, "unsupported-media-type")
    );
    let malformed = send(
        with_key()
            .header("content-type", "application/json")
            .body("{\"destination\":"),
    )
    .await;
    assert_eq!(
        (malformed.status, malformed.problem()),
        (400, "malformed-request")
    );
    let too_large = send(
        with_key()
            .header("content-type", "application/json")
            .body(format!("{{\"reference\": \"{}\"}}", "x".repeat(20_000))),
    )
    .await;
    assert_eq!(too_large.status, 413);
    for invalid in [
        body("acct-1", 0, ""),
        body("acct-1", -5, ""),
        body("acct-1", 1_000_000_000_001, ""),
        body("", 5, ""),
        body(&"d".repeat(201), 5, ""),
        body("acct-1", 5, &"r".repeat(201)),
        json!({"destination": "acct-1", "amount": "5", "reference": ""}),
        json!({"destination": "acct-1", "amount": 5.5, "reference": ""}),
        json!({"destination": "acct-1", "amount": 5}),
        json!({"destination": "acct-1", "amount": 5, "reference": "", "extra": 1}),
    ] {
        let answer = send(with_key().json(&invalid)).await;
        assert_eq!(
            (answer.status, answer.problem()),
            (422, "invalid-request"),
            "{invalid}"
        );
    }
    let unknown_fault = bank
        .transfer(&key, &body("acct-1", 5, ""), Some("meteor"))
        .await;
    assert_eq!(
        (unknown_fault.status, unknown_fault.problem()),
        (400, "unknown-fault")
    );

    let executed = bank.transfer(&key, &body("acct-1", 5, ""), None).await;
    assert_eq!(executed.status, 201, "{executed:?}");
    assert!(!executed.replayed());
    assert_eq!(bank.all_transfers().await.len(), 1);
}

/// Fifty requests at once under one key execute once: one original, 49 replays of it.
async fn concurrent_requests_under_one_key_execute_once(db: Db) {
    let bank = Bank::start(db, &[]).await;
    let key = key();
    let transfer = body("acct-1", 700, "crowd");
    let answers = join_all((0..50).map(|_| bank.transfer(&key, &transfer, None))).await;
    assert!(
        answers.iter().all(|answer| answer.status == 201),
        "{answers:?}"
    );
    assert_eq!(
        answers.iter().filter(|answer| !answer.replayed()).count(),
        1
    );
    assert!(answers.iter().all(|answer| answer.body == answers[0].body));
    assert_eq!(bank.all_transfers().await.len(), 1);
    bank.assert_audit_clean("1 transfers executed, 700 in total")
        .await;
}
on_both_stores!(concurrent_requests_under_one_key_execute_once);

/// Many keys at once: each executes once, the list pages through all of them in id
/// order without a gap or a repeat, and the running totals add up.
async fn the_list_pages_through_every_transfer_in_order(db: Db) {
    let bank = Bank::start(db, &[]).await;
    let keys: Vec<String> = (0..20).map(|_| key()).collect();
    let answers = join_all(keys.iter().enumerate().map(|(i, key)| {
        let destination = format!("acct-{}", i % 3);
        let amount = i64::try_from(i).expect("small") + 1;
        let bank = &bank;
        async move {
            bank.transfer(key, &body(&destination, amount, "listed"), None)
                .await
        }
    }))
    .await;
    assert!(answers.iter().all(|answer| answer.status == 201));
    bank.close(&crate::support::key()).await;

    let listed = bank.all_transfers().await;
    let ids: Vec<i64> = listed
        .iter()
        .map(|t| t["id"].as_i64().expect("an id"))
        .collect();
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");
    let mut listed_keys: Vec<&str> = listed
        .iter()
        .map(|t| t["idempotency_key"].as_str().expect("a key"))
        .collect();
    listed_keys.sort_unstable();
    let mut expected: Vec<&str> = keys.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(listed_keys, expected, "the closed key is no transfer");

    for bad in ["?limit=0", "?limit=1001", "?after=-1", "?limit=x"] {
        let answer = bank.get(&format!("/v1/transfers{bad}")).await;
        assert!(matches!(answer.status, 400 | 422), "{bad}: {answer:?}");
    }
    bank.assert_audit_clean("20 transfers executed, 210 in total")
        .await;
}
on_both_stores!(the_list_pages_through_every_transfer_in_order);

/// The list with `reference=` holds exactly the transfers with that reference, under
/// whichever keys, executed or declined, paged like the whole list — and no other's.
async fn the_list_filters_by_reference(db: Db) {
    let bank = Bank::start(db, &[]).await;
    let mine: Vec<String> = (0..5).map(|_| key()).collect();
    for (at, key) in mine.iter().enumerate() {
        let fault = (at == 4).then_some("decline");
        let answer = bank
            .transfer(key, &body("acct-1", 10, "payout-7"), fault)
            .await;
        assert!(matches!(answer.status, 201 | 422), "{answer:?}");
        let theirs = bank
            .transfer(
                &crate::support::key(),
                &body("acct-1", 10, "payout-8"),
                None,
            )
            .await;
        assert_eq!(theirs.status, 201, "{theirs:?}");
    }
    bank.close(&key()).await;
    let listed = bank
        .listed("/v1/transfers?reference=payout-7&limit=2")
        .await;
    let keys: Vec<&str> = listed
        .iter()
        .map(|t| t["idempotency_key"].as_str().expect("a key"))
        .collect();
    assert_eq!(keys, mine.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(listed.iter().all(|t| t["reference"] == json!("payout-7")));
    assert_eq!(listed[4]["state"], "declined");
    let none = bank.get("/v1/transfers?reference=nobody").await;
    assert_eq!(
        (none.status, &none.body["transfers"]),
        (200, &json!([])),
        "{none:?}"
    );
    assert_eq!(bank.all_transfers().await.len(), 10);
}
on_both_stores!(the_list_filters_by_reference);
