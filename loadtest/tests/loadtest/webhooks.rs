//! Webhooks through the auditor: planted faults in what a receiver got are found; and a
//! real run, its receiver failing, throttling, dawdling and hanging on purpose, still gets
//! every committed outcome, signed, and nothing else.

use std::collections::BTreeMap;
use std::time::Duration;

use loadtest::audit::{Violation, ViolationKind};
use loadtest::receiver::{Answered, Receipt, ReceiverFaults};
use loadtest::run::{RunOptions, run};
use loadtest::webhooks::{Expected, audit_webhooks};

use crate::end_to_end::{Distributed, options};

fn receipt(ticket: &str, kind: &str, id: &str, answered: Answered) -> Receipt {
    Receipt {
        account: "a1".into(),
        webhook_id: id.into(),
        event_type: kind.into(),
        ticket_id: ticket.into(),
        verified: true,
        body_hash: 7,
        answered,
        lag_ms: Some(12),
    }
}

fn expected(events: &[(&str, &'static str)]) -> BTreeMap<Expected, String> {
    events
        .iter()
        .map(|(ticket, kind)| (((*ticket).to_owned(), *kind), "a1".to_owned()))
        .collect()
}

fn found(expected: &BTreeMap<Expected, String>, receipts: &[Receipt]) -> Vec<ViolationKind> {
    let mut violations: Vec<Violation> = Vec::new();
    audit_webhooks(expected, receipts, &mut violations);
    violations
        .into_iter()
        .map(|violation| violation.kind)
        .collect()
}

#[test]
fn a_clean_record_passes_with_its_repeats_counted() {
    let want = expected(&[("t1", "withdrawal.succeeded"), ("t2", "withdrawal.refused")]);
    let receipts = vec![
        receipt("t1", "withdrawal.succeeded", "e1", Answered::Failed),
        receipt("t1", "withdrawal.succeeded", "e1", Answered::Took),
        receipt("t1", "withdrawal.succeeded", "e1", Answered::Took),
        receipt("t2", "withdrawal.refused", "e2", Answered::Took),
    ];
    let mut violations = Vec::new();
    let tally = audit_webhooks(&want, &receipts, &mut violations);
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!((tally.expected, tally.delivered, tally.requests), (2, 2, 4));
    assert_eq!((tally.refused_by_receiver, tally.repeats), (1, 1));
    assert_eq!(tally.first_arrival_p99_ms, Some(12));
}

#[test]
fn an_event_never_taken_is_missing() {
    let want = expected(&[("t1", "order.paid"), ("t2", "lottery.drawn")]);
    let receipts = vec![
        receipt("t1", "order.paid", "e1", Answered::Hung),
        receipt("t1", "order.paid", "e1", Answered::Throttled),
    ];
    assert_eq!(
        found(&want, &receipts),
        [ViolationKind::EventMissing, ViolationKind::EventMissing]
    );
}

#[test]
fn an_event_for_an_outcome_never_committed_is_unexpected() {
    let want = expected(&[("t1", "withdrawal.succeeded")]);
    let receipts = vec![
        receipt("t1", "withdrawal.succeeded", "e1", Answered::Took),
        // The same ticket announced as refused too: one of the two never committed.
        receipt("t1", "withdrawal.refused", "e9", Answered::Took),
    ];
    assert_eq!(found(&want, &receipts), [ViolationKind::EventUnexpected]);
}

#[test]
fn a_bad_signature_another_id_or_another_body_is_found() {
    let want = expected(&[("t1", "payout.failed")]);
    let mut forged = receipt("t1", "payout.failed", "e1", Answered::Took);
    forged.verified = false;
    assert_eq!(found(&want, &[forged]), [ViolationKind::BadSignature]);

    let twice = vec![
        receipt("t1", "payout.failed", "e1", Answered::Took),
        receipt("t1", "payout.failed", "e2", Answered::Took),
    ];
    assert_eq!(found(&want, &twice), [ViolationKind::EventIdsDiffer]);

    let mut changed = receipt("t1", "payout.failed", "e1", Answered::Took);
    changed.body_hash = 8;
    let receipts = vec![
        receipt("t1", "payout.failed", "e1", Answered::Failed),
        changed,
    ];
    assert_eq!(found(&want, &receipts), [ViolationKind::EventChanged]);
}

/// Two instances on PostgreSQL + Redis, paying out to the shared bank, a receiver that
/// answers a fifth of the deliveries 500 or 429, dawdles on some and hangs on others:
/// every committed outcome — executions, 402 refusals, draws, order payments, payout
/// settlements — arrives, verified, and nothing else does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_committed_outcome_reaches_a_misbehaving_receiver() {
    let shared = Distributed::new().await;
    let flags = [
        "--webhook-allow-private",
        "--webhook-retry-schedule",
        "100ms,200ms,400ms,800ms,1s,1s,1s,1s",
        "--webhook-timeout",
        "1s",
        "--webhook-lease",
        "3s",
    ];
    let targets = vec![shared.serve(&flags).await, shared.serve(&flags).await];
    let result = run(RunOptions {
        bank: Some(shared.bank.clone()),
        webhooks: Some(ReceiverFaults {
            fail: 0.12,
            throttle: 0.05,
            slow: 0.05,
            slow_for: Duration::from_millis(200),
            hang: 0.03,
        }),
        ..options(targets)
    })
    .await
    .unwrap();
    assert!(result.violations.is_empty(), "{:#?}", result.violations);
    let tally = &result.webhooks;
    assert!(tally.received && tally.expected > 0, "{tally:?}");
    assert_eq!(tally.delivered, tally.expected, "{tally:?}");
    assert!(
        tally.refused_by_receiver > 0,
        "the receiver misbehaved: {tally:?}"
    );
    let receipts = result.final_state.webhooks.as_ref().unwrap();
    for kind in [
        "withdrawal.succeeded",
        "withdrawal.refused",
        "lottery.drawn",
        "payout.succeeded",
    ] {
        assert!(
            receipts.iter().any(|receipt| receipt.event_type == kind),
            "no {kind} came"
        );
    }
}
