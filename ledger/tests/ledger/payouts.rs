//! Payouts: the debit with its payout and outbox job in the spend's transaction; the
//! outbox's claims, leases and attempts; the bank's final word settled once; the audit.

use std::time::Duration;

use ledger::payouts::{Destination, JobOutcome, PayoutId, PayoutJob, PayoutStatus, Settlement};
use ledger::testing::TestDatabase;
use ledger::{AccountId, Amount, EntryKind, Ledger, Operation, Rule};

use crate::suite::{account, apply, assert_clean, open};

const HOUR: Duration = Duration::from_secs(3600);
const LEASE: Duration = Duration::from_secs(30);

/// The payout as a settlement's event shows it: its id and status are enough here.
fn render_payout(payout: &ledger::payouts::Payout) -> serde_json::Value {
    serde_json::json!({"payout_id": payout.id.0, "status": payout.status.as_str()})
}

fn payout(amount: i64, destination: &str) -> (PayoutId, Operation) {
    let id = PayoutId::random();
    let operation = Operation::Payout {
        payout: id,
        amount: Amount::new(amount).unwrap(),
        destination: Destination::new(destination).unwrap(),
    };
    (id, operation)
}

/// A payout of `amount` from `account_id` with a fresh ticket, accepted.
async fn paid_out(ledger: &Ledger, account_id: AccountId, amount: i64, token: u64) -> PayoutId {
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let (id, operation) = payout(amount, "DE89370400440532013000");
    let applied = apply(ledger, account_id, ticket, operation, "p", token)
        .await
        .unwrap();
    assert_eq!(applied.response.status, 202);
    id
}

async fn claim_one(ledger: &Ledger, worker: &str) -> PayoutJob {
    let mut jobs = ledger.claim_payouts(worker, LEASE, 10).await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    jobs.remove(0)
}

/// A payout takes the money at once, in the ticket's transaction, with a pending payout
/// and a debit entry that carries it; its outcome is stored as 202 and replayed as such;
/// the bank has not been asked (no attempt yet).
pub async fn a_payout_debits_once_and_waits_for_the_bank(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let (id, operation) = payout(300, "acct-7");
    let first = apply(&ledger, account_id, ticket, operation, "p300", 1)
        .await
        .unwrap();
    assert_eq!((first.response.status, first.replayed), (202, false));
    assert_eq!(first.kind, ledger::OutcomeKind::PayoutAccepted);
    // The same request again, even with another payout id chosen for it: the first's answer.
    let (_, again) = payout(300, "acct-7");
    let replay = apply(&ledger, account_id, ticket, again, "p300", 2)
        .await
        .unwrap();
    assert_eq!(
        (replay.kind, replay.response, replay.replayed),
        (first.kind, first.response, true)
    );

    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        700
    );
    let stored = ledger.payout(id).await.unwrap().unwrap();
    assert_eq!(
        (
            stored.account_id,
            stored.ticket_id,
            stored.amount.get(),
            stored.destination.as_str(),
            stored.status,
            stored.attempts,
        ),
        (account_id, ticket, 300, "acct-7", PayoutStatus::Pending, 0)
    );
    let entries = ledger.entries(account_id, None, 10).await.unwrap();
    let debit = entries.last().unwrap();
    assert_eq!(
        (debit.kind, debit.amount, debit.payout_id, debit.ticket_id),
        (EntryKind::Payout, -300, Some(id), Some(ticket))
    );
    assert_clean(&ledger).await;
}

/// A payout the balance cannot cover writes no payout and no job; its 402 is stored under
/// the ticket like any refusal.
pub async fn a_payout_the_balance_cannot_cover_is_refused_and_stored(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 100, 0).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let (id, operation) = payout(300, "acct-7");
    let refused = apply(&ledger, account_id, ticket, operation, "p300", 1)
        .await
        .unwrap();
    assert_eq!(refused.response.status, 402);
    assert_eq!(refused.kind, ledger::OutcomeKind::RefusedInsufficientFunds);
    let replay = apply(&ledger, account_id, ticket, operation, "p300", 2)
        .await
        .unwrap();
    assert_eq!((replay.response.status, replay.replayed), (402, true));
    assert_eq!(replay.kind, ledger::OutcomeKind::RefusedInsufficientFunds);
    assert_eq!(ledger.payout(id).await.unwrap(), None);
    assert!(
        ledger
            .claim_payouts("w", LEASE, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        100
    );
    assert_clean(&ledger).await;
}

/// One worker holds a job for its lease: a second claim gets nothing. Once the lease ran
/// out another worker claims it as the next attempt, and the first worker's word on its
/// own attempt is no longer recorded — settling or postponing it writes nothing.
pub async fn a_job_is_claimed_by_one_worker_until_its_lease_runs_out(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let id = paid_out(&ledger, account_id, 250, 1).await;

    let first = ledger
        .claim_payouts("first", Duration::from_millis(300), 10)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    let first = &first[0];
    assert_eq!((first.payout.id, first.attempt), (id, 1));
    assert!(
        ledger
            .claim_payouts("second", LEASE, 10)
            .await
            .unwrap()
            .is_empty()
    );

    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = claim_one(&ledger, "second").await;
    assert_eq!((second.payout.id, second.attempt), (id, 2));
    let late = Settlement::Failed {
        reason: "destination-closed".into(),
    };
    assert!(
        !ledger
            .settle_payout(first, &late, &render_payout)
            .await
            .unwrap()
    );
    assert!(
        !ledger
            .postpone_payout(first, Duration::ZERO, "timeout")
            .await
            .unwrap()
    );
    assert_eq!(
        ledger.payout(id).await.unwrap().unwrap().status,
        PayoutStatus::Pending
    );
    let done = Settlement::Succeeded {
        transfer_id: "tr_1".into(),
    };
    assert!(
        ledger
            .settle_payout(&second, &done, &render_payout)
            .await
            .unwrap()
    );
    assert_eq!(
        ledger.payout(id).await.unwrap().unwrap().attempts,
        2,
        "the attempts are shown"
    );
    assert_clean(&ledger).await;
}

/// The bank made the transfer: the payout is succeeded with the bank's id, the money stays
/// out, and the job is done — claimed by nobody again, settled no second time.
pub async fn a_succeeded_payout_keeps_its_money_out(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let id = paid_out(&ledger, account_id, 400, 1).await;
    let job = claim_one(&ledger, "w").await;
    let done = Settlement::Succeeded {
        transfer_id: "tr_abc".into(),
    };
    assert!(
        ledger
            .settle_payout(&job, &done, &render_payout)
            .await
            .unwrap()
    );
    assert!(
        !ledger
            .settle_payout(&job, &done, &render_payout)
            .await
            .unwrap()
    );
    let settled = ledger.payout(id).await.unwrap().unwrap();
    assert_eq!(
        (
            settled.status,
            settled.bank_transfer_id.as_deref(),
            settled.failure_reason
        ),
        (PayoutStatus::Succeeded, Some("tr_abc"), None)
    );
    assert!(settled.settled_at.is_some());
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        600
    );
    assert!(
        ledger
            .claim_payouts("w", LEASE, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_clean(&ledger).await;
}

/// The bank refused for good: the payout is failed with its reason and, in the same
/// transaction, a reversal entry (no ticket, the payout's) credits the amount back —
/// once, however often the refusal is recorded.
pub async fn a_failed_payout_is_credited_back_once(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let id = paid_out(&ledger, account_id, 400, 1).await;
    // A spend after the payout and before its reversal: the reversal adds to what is there.
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let withdrawal = Operation::Withdrawal(Amount::new(100).unwrap());
    apply(&ledger, account_id, ticket, withdrawal, "w100", 2)
        .await
        .unwrap();
    let job = claim_one(&ledger, "w").await;
    let refused = Settlement::Failed {
        reason: "destination-closed".into(),
    };
    assert!(
        ledger
            .settle_payout(&job, &refused, &render_payout)
            .await
            .unwrap()
    );
    assert!(
        !ledger
            .settle_payout(&job, &refused, &render_payout)
            .await
            .unwrap()
    );
    let settled = ledger.payout(id).await.unwrap().unwrap();
    assert_eq!(
        (settled.status, settled.failure_reason.as_deref()),
        (PayoutStatus::Failed, Some("destination-closed"))
    );
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        900
    );
    let entries = ledger.entries(account_id, None, 10).await.unwrap();
    let reversal = entries.last().unwrap();
    assert_eq!(
        (
            reversal.kind,
            reversal.amount,
            reversal.balance_after,
            reversal.payout_id,
            reversal.ticket_id
        ),
        (EntryKind::PayoutReversal, 400, 900, Some(id), None)
    );
    assert_clean(&ledger).await;
}

/// A postponed job is not claimed before it is due, keeps its error for the operators, and
/// comes back as the next attempt once due, its error with it.
pub async fn a_postponed_job_waits_until_it_is_due(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let id = paid_out(&ledger, account_id, 100, 1).await;
    let job = claim_one(&ledger, "w").await;
    assert!(
        ledger
            .postpone_payout(&job, Duration::from_millis(400), "bank answered 503")
            .await
            .unwrap()
    );
    assert!(
        ledger
            .claim_payouts("w", LEASE, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let waiting = ledger.payout(id).await.unwrap().unwrap();
    assert_eq!(
        (waiting.attempts, waiting.last_error.as_deref()),
        (1, Some("bank answered 503"))
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = claim_one(&ledger, "w").await;
    assert_eq!((again.payout.id, again.attempt), (id, 2));
    assert_eq!(
        (again.payout.attempts, again.payout.last_error.as_deref()),
        (2, Some("bank answered 503")),
        "the claimed payout shows its attempts and its last error as a read of it does"
    );
}

/// A claim that finds nothing due says when the first job not in flight will be — what
/// an idle worker sleeps until — by the database's clock; nothing at all open, no time.
pub async fn an_idle_claim_says_when_the_next_job_is_due(database: &TestDatabase) {
    let ledger = open(database).await;
    let nothing = ledger.claim_payouts_or_next("w", LEASE, 10).await.unwrap();
    assert!(nothing.jobs.is_empty());
    assert_eq!(nothing.next_due_in, None);

    let account_id = account(&ledger, 1000, 0).await;
    paid_out(&ledger, account_id, 100, 1).await;
    let claimed = ledger.claim_payouts_or_next("w", LEASE, 10).await.unwrap();
    assert_eq!(claimed.jobs.len(), 1);
    // In flight: not what a worker waits for (its lease ends in 30 s).
    let in_flight = ledger.claim_payouts_or_next("w", LEASE, 10).await.unwrap();
    assert!(in_flight.jobs.is_empty());
    assert_eq!(in_flight.next_due_in, None);

    let wait = Duration::from_secs(60);
    assert!(
        ledger
            .postpone_payout(&claimed.jobs[0], wait, "bank answered 503")
            .await
            .unwrap()
    );
    let later = ledger.claim_payouts_or_next("w", LEASE, 10).await.unwrap();
    assert!(later.jobs.is_empty());
    let next = later.next_due_in.expect("a job is due later");
    assert!(
        next > wait - Duration::from_secs(30) && next <= wait,
        "{next:?}"
    );
}

/// A postponement the bank asked for (a throttle) counts the job's throttled claims,
/// beside its attempts, and a plain one does not; each claim says when it was made by the
/// database's clock, so the payout's age at it is never negative.
pub async fn throttled_claims_are_counted_apart_and_the_age_is_the_databases(
    database: &TestDatabase,
) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let id = paid_out(&ledger, account_id, 100, 1).await;
    let mut job = claim_one(&ledger, "w").await;
    assert_eq!((job.attempt, job.throttled), (1, 0));
    assert!(job.claimed_at >= job.payout.created_at);
    assert!(job.age() < LEASE, "{:?}", job.age());
    for (throttled, expected) in [(true, (2, 1)), (true, (3, 2)), (false, (4, 2))] {
        let outcome = JobOutcome::Postponed {
            after: Duration::ZERO,
            error: "the bank answered 429 (rate-limited)".into(),
            throttled,
        };
        let recorded = ledger
            .record_payouts(&[(&job, &outcome)], &render_payout)
            .await
            .unwrap();
        assert_eq!(recorded, [true]);
        let next = claim_one(&ledger, "w").await;
        assert_eq!(
            (next.payout.id, next.attempt, next.throttled),
            (id, expected.0, expected.1)
        );
        assert!(next.claimed_at >= job.claimed_at);
        job = next;
    }
}

/// An account's payouts list in the order they were made, by status, a page at a time;
/// every account's at once, as they stand; the counts say how many stand in each status
/// and since when the oldest pending one waits.
pub async fn payouts_are_listed_and_counted_by_status(database: &TestDatabase) {
    let ledger = open(database).await;
    let mine = account(&ledger, 1000, 0).await;
    let other = account(&ledger, 1000, 0).await;
    let mut ids = Vec::new();
    for (token, amount) in [(1, 10), (2, 20), (3, 30)] {
        ids.push(paid_out(&ledger, mine, amount, token).await);
    }
    let others = paid_out(&ledger, other, 40, 1).await;
    let job = ledger
        .claim_payouts("w", LEASE, 10)
        .await
        .unwrap()
        .into_iter()
        .find(|job| job.payout.id == ids[1])
        .unwrap();
    let done = Settlement::Succeeded {
        transfer_id: "tr".into(),
    };
    assert!(
        ledger
            .settle_payout(&job, &done, &render_payout)
            .await
            .unwrap()
    );

    let listed = |account, status, after, limit| {
        let ledger = &ledger;
        async move {
            ledger
                .payouts(account, status, after, limit)
                .await
                .unwrap()
                .into_iter()
                .map(|payout| payout.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(mine, None, None, 10).await, ids);
    assert_eq!(
        listed(mine, Some(PayoutStatus::Pending), None, 10).await,
        vec![ids[0], ids[2]]
    );
    assert_eq!(listed(mine, None, Some(ids[0]), 1).await, vec![ids[1]]);
    assert_eq!(listed(mine, None, Some(ids[2]), 10).await, vec![]);
    assert_eq!(listed(other, None, None, 10).await, vec![others]);
    let every: Vec<_> = ledger
        .every_payout()
        .await
        .unwrap()
        .into_iter()
        .map(|payout| (payout.id, payout.status))
        .collect();
    let pending = PayoutStatus::Pending;
    assert_eq!(
        every,
        vec![
            (ids[0], pending),
            (ids[1], PayoutStatus::Succeeded),
            (ids[2], pending),
            (others, pending)
        ]
    );
    let counts = ledger.payout_counts().await.unwrap();
    assert_eq!((counts.pending, counts.succeeded, counts.failed), (3, 1, 0));
    let oldest = ledger.payout(ids[0]).await.unwrap().unwrap().created_at;
    assert_eq!(counts.oldest_pending, Some(oldest));
}

/// A payout marked failed by hand, without the reversal its refusal writes, breaks the
/// audit's payout rule.
pub async fn audit_finds_a_failed_payout_without_its_reversal(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    paid_out(&ledger, account_id, 100, 1).await;
    assert_clean(&ledger).await;
    database
        .execute(
            "UPDATE payouts SET status = 'failed', failure_reason = 'made up', settled_at = created_at",
        )
        .await
        .unwrap();
    let violations = ledger.audit().await.unwrap();
    assert!(
        violations
            .iter()
            .any(|v| v.rule == Rule::PayoutMovedOnce && v.account_id == Some(account_id)),
        "{violations:#?}"
    );
}

/// A worker records its whole claim in one call: a success, a refusal (its money back
/// with a reversal entry), a postponement, and one whose job moved on (claimed again at
/// a later attempt) — each as if alone, and the settlements' events queued for the
/// account's endpoint. Recorded again, the settlements find their jobs gone.
pub async fn a_claim_is_recorded_together_each_as_if_alone(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    crate::webhooks::endpoint(&ledger, account_id, None).await;
    let mut ids = Vec::new();
    for (token, amount) in [(1, 100), (2, 200), (3, 300), (4, 50)] {
        ids.push(paid_out(&ledger, account_id, amount, token).await);
    }
    let jobs = ledger.claim_payouts("w", LEASE, 10).await.unwrap();
    assert_eq!(jobs.len(), 4);
    let job_of = |id: PayoutId| jobs.iter().find(|job| job.payout.id == id).unwrap();
    // The fourth's job was claimed again (its lease ran out): the worker's claim is stale.
    let mut stale = job_of(ids[3]).clone();
    stale.attempt = 0;
    let outcomes = [
        JobOutcome::Settled(Settlement::Succeeded {
            transfer_id: "t-1".into(),
        }),
        JobOutcome::Settled(Settlement::Failed {
            reason: "closed".into(),
        }),
        JobOutcome::Postponed {
            after: Duration::ZERO,
            error: "no answer".into(),
            throttled: false,
        },
        JobOutcome::Settled(Settlement::Succeeded {
            transfer_id: "t-4".into(),
        }),
    ];
    let pairs: Vec<(&PayoutJob, &JobOutcome)> = vec![
        (job_of(ids[0]), &outcomes[0]),
        (job_of(ids[1]), &outcomes[1]),
        (job_of(ids[2]), &outcomes[2]),
        (&stale, &outcomes[3]),
    ];
    let recorded = ledger.record_payouts(&pairs, &render_payout).await.unwrap();
    assert_eq!(recorded, [true, true, true, false]);

    let shown = |id: PayoutId| {
        let ledger = ledger.clone();
        async move { ledger.payout(id).await.unwrap().unwrap() }
    };
    let succeeded = shown(ids[0]).await;
    assert_eq!(
        (
            succeeded.status,
            succeeded.bank_transfer_id.as_deref(),
            succeeded.attempts
        ),
        (PayoutStatus::Succeeded, Some("t-1"), 1)
    );
    let failed = shown(ids[1]).await;
    assert_eq!(
        (failed.status, failed.failure_reason.as_deref()),
        (PayoutStatus::Failed, Some("closed"))
    );
    assert_eq!(shown(ids[2]).await.status, PayoutStatus::Pending);
    assert_eq!(shown(ids[3]).await.status, PayoutStatus::Pending);
    // 1000 − 100 − 200 − 300 − 50, and the refused 200 back.
    assert_eq!(
        ledger.account(account_id).await.unwrap().unwrap().balance,
        550
    );
    let events: Vec<_> = ledger
        .claim_deliveries("hooks", LEASE, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|delivery| (delivery.event.ticket_id, delivery.event.event_type))
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(events.contains(&(
        succeeded.ticket_id,
        ledger::webhooks::EventType::PayoutSucceeded
    )));
    assert!(events.contains(&(failed.ticket_id, ledger::webhooks::EventType::PayoutFailed)));

    let again = ledger
        .record_payouts(&pairs[..2], &render_payout)
        .await
        .unwrap();
    assert_eq!(again, [false, false]);
    assert_clean(&ledger).await;
}
