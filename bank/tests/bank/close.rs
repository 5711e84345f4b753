//! Closing a key: "not there, and never will be" — what payonce needs to hear before it
//! reverses a payout.

use futures::future::join_all;

use crate::on_both_stores;
use crate::support::{Bank, Db, body, key};

/// A key closed with no transfer stays closed: closing again answers the same, a POST
/// under it executes nothing (409 `idempotency-key-closed`), GET answers 404 with the
/// same problem, and the list shows nothing.
async fn a_closed_key_never_executes(db: Db) {
    let bank = Bank::start(db, &[]).await;
    let key = key();
    let closed = bank.close(&key).await;
    assert_eq!(closed.status, 200, "{closed:?}");
    assert_eq!(closed.body["state"], "closed");
    assert_eq!(closed.body["idempotency_key"], key.as_str());
    let again = bank.close(&key).await;
    assert_eq!((again.status, &again.body), (200, &closed.body));

    let refused = bank.transfer(&key, &body("acct-1", 5, ""), None).await;
    assert_eq!(
        (refused.status, refused.problem()),
        (409, "idempotency-key-closed")
    );
    let dropped = bank
        .raw(&crate::support::raw_transfer(
            &key,
            &body("acct-1", 5, ""),
            "commit-then-drop",
        ))
        .await;
    assert!(dropped.is_empty());
    let found = bank.get(&format!("/v1/transfers/{key}")).await;
    assert_eq!(
        (found.status, found.problem()),
        (404, "idempotency-key-closed")
    );
    assert!(bank.all_transfers().await.is_empty());
    bank.assert_audit_clean("0 transfers executed").await;
}
on_both_stores!(a_closed_key_never_executes);

/// Closing a key that holds a transfer (executed or declined) answers the transfer and
/// changes nothing: a retry of the transfer still replays.
async fn closing_a_used_key_answers_its_transfer(db: Db) {
    let bank = Bank::start(db, &[]).await;
    let executed_key = key();
    let executed = bank
        .transfer(&executed_key, &body("acct-1", 5, ""), None)
        .await;
    let closed = bank.close(&executed_key).await;
    assert_eq!((closed.status, &closed.body), (200, &executed.body));
    let retried = bank
        .transfer(&executed_key, &body("acct-1", 5, ""), None)
        .await;
    assert_eq!((retried.status, retried.replayed()), (201, true));

    let declined_key = key();
    bank.transfer(&declined_key, &body("acct-1", 5, ""), Some("decline"))
        .await;
    let closed = bank.close(&declined_key).await;
    assert_eq!(closed.status, 200);
    assert_eq!(closed.body["state"], "declined");
}
on_both_stores!(closing_a_used_key_answers_its_transfer);

/// A close and a create racing on one key: exactly one wins, and both agree which — the
/// transfer executed and the close answered it, or the key closed and the create was
/// refused. Over thirty keys at once.
async fn a_close_racing_a_create_has_one_winner(db: Db) {
    let bank = Bank::start(db, &[]).await;
    let keys: Vec<String> = (0..30).map(|_| key()).collect();
    let outcomes = join_all(keys.iter().map(|key| {
        let bank = &bank;
        async move {
            let transfer = body("acct-1", 3, "race");
            tokio::join!(bank.transfer(key, &transfer, None), bank.close(key))
        }
    }))
    .await;
    let mut executed = 0;
    for (created, closed) in &outcomes {
        match (created.status, closed.body["state"].as_str()) {
            (201, Some("executed")) => {
                executed += 1;
                assert_eq!(closed.body, created.body);
            }
            (409, Some("closed")) => assert_eq!(created.problem(), "idempotency-key-closed"),
            other => panic!("no single winner: {other:?} {created:?} {closed:?}"),
        }
    }
    assert_eq!(bank.all_transfers().await.len(), executed);
    bank.assert_audit_clean(&format!(
        "{executed} transfers executed, {} in total",
        executed * 3
    ))
    .await;
}
on_both_stores!(a_close_racing_a_create_has_one_winner);
