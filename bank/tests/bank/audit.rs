//! `payonce-bank audit`: clean after traffic, and each rule caught after the store was
//! tampered with past the bank.

use crate::on_both_stores;
use crate::support::{Bank, Db, body, key};

/// After transfers, declines and closes the audit is clean (exit 0); after each kind of
/// tampering it names the broken rule (exit 1).
async fn the_audit_catches_tampering(db: Db) {
    let bank = Bank::start(db, &[]).await;
    for (i, destination) in ["acct-1", "acct-2", "acct-1"].into_iter().enumerate() {
        let amount = 100 * (i64::try_from(i).expect("small") + 1);
        assert_eq!(
            bank.transfer(&key(), &body(destination, amount, ""), None)
                .await
                .status,
            201
        );
    }
    bank.transfer(&key(), &body("acct-3", 7, ""), Some("decline"))
        .await;
    bank.close(&key()).await;
    bank.assert_audit_clean("clean — 3 transfers executed, 600 in total")
        .await;
    let store = bank.stop().await;

    // Each tampering, on top of the ones before it: the rule the audit must name, and one
    // it must not name yet.
    let tamperings = [
        (
            "UPDATE bank_destinations SET total = total + 1 WHERE destination = 'acct-2'",
            "destination-total: destination \"acct-2\"",
            Some("grand-total"),
        ),
        (
            "UPDATE bank_totals SET transfers = transfers + 1",
            "grand-total",
            None,
        ),
        // A key executed twice: only possible once the UNIQUE index is gone.
        (
            "DROP INDEX bank_transfers_key;
             INSERT INTO bank_transfers
                 (idempotency_key, state, destination, amount, reference, fingerprint,
                  answer_status, answer_body, created_at)
             SELECT idempotency_key, state, destination, amount, reference, fingerprint,
                    answer_status, answer_body, created_at
             FROM bank_transfers WHERE state = 'executed' AND destination = 'acct-2'",
            "key-executed-once",
            None,
        ),
        (
            "UPDATE bank_transfers SET answer_status = 500 WHERE state = 'declined'",
            "answer-matches-state",
            None,
        ),
    ];
    for (tampering, named, not_yet) in tamperings {
        store.execute(tampering).await;
        let (code, report) = crate::support::audit(&store.url).await;
        assert_eq!(code, 1, "{named}: {report}");
        assert!(report.contains(named), "{named}: {report}");
        if let Some(not_yet) = not_yet {
            assert!(!report.contains(not_yet), "{named}: {report}");
        }
    }
}
on_both_stores!(the_audit_catches_tampering);

/// The audit of a store that does not exist fails (exit 2) rather than audit an empty one.
#[tokio::test]
async fn the_audit_of_a_missing_store_fails() {
    let dir = tempfile::tempdir().expect("a directory");
    let url = format!("sqlite:{}", dir.path().join("none.db").display());
    let (code, _) = crate::support::audit(&url).await;
    assert_eq!(code, 2);
    assert!(!dir.path().join("none.db").exists());
}
