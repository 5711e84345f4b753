//! Webhooks in the ledger: an event per committed outcome, in its transaction, queued for
//! the endpoints that want it (and never for a replay or a refusal before execution);
//! deliveries claimed, fenced by their attempts, ended, sent again by hand; endpoints
//! rotated, disabled by a 410 and deleted.

use std::time::Duration;

use ledger::payouts::{Destination, PayoutId, Settlement};
use ledger::requests::{Keyed, RequestKey};
use ledger::testing::TestDatabase;
use ledger::webhooks::{
    AttemptAnswer, DeliveryJob, DeliveryOutcome, DeliveryStatus, EndpointId, EventType,
    NewEndpoint, RetryRefused, Subscription,
};
use ledger::{AccountId, Amount, ApplyError, Ledger, Operation, Rule};
use serde_json::Value;

use crate::suite::{account, apply, assert_clean, open, withdrawal};

const HOUR: Duration = Duration::from_secs(3600);
const LEASE: Duration = Duration::from_secs(30);

pub async fn endpoint(
    ledger: &Ledger,
    account_id: AccountId,
    types: Option<Vec<EventType>>,
) -> EndpointId {
    let new = NewEndpoint {
        id: EndpointId::random(),
        account_id,
        url: "http://127.0.0.1:9/hooks".to_owned(),
        subscription: Subscription::of(types),
        secret_sealed: vec![7; 40],
    };
    ledger.create_endpoint(&new).await.unwrap().unwrap().id
}

async fn claim_all(ledger: &Ledger, worker: &str) -> Vec<DeliveryJob> {
    ledger.claim_deliveries(worker, LEASE, 100).await.unwrap()
}

fn answered(status: u16) -> AttemptAnswer {
    AttemptAnswer {
        duration: Duration::from_millis(3),
        status: Some(status),
        error: (!(200..300).contains(&status)).then(|| format!("the receiver answered {status}")),
        body: Some("ok".to_owned()),
    }
}

async fn record(ledger: &Ledger, job: &DeliveryJob, status: u16, outcome: DeliveryOutcome) -> bool {
    ledger
        .record_deliveries(&[(job, &answered(status), &outcome)])
        .await
        .unwrap()[0]
}

fn payload(job: &DeliveryJob) -> Value {
    serde_json::from_str(&job.event.payload()).unwrap()
}

/// A ledger with one account (1000), an endpoint of it that wants every event, and one
/// withdrawal of 10: one delivery due to that endpoint.
async fn one_withdrawal_announced(database: &TestDatabase) -> (Ledger, EndpointId) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let hooks = endpoint(&ledger, account_id, None).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    apply(&ledger, account_id, ticket, withdrawal(10), "w10", 1)
        .await
        .unwrap();
    (ledger, hooks)
}

/// Each committed outcome writes one event, in its transaction, queued for every endpoint
/// of the account that wants its type; the event carries the stored outcome. A replay, a
/// stale token and another account's endpoints get nothing.
pub async fn every_outcome_announces_its_event_to_the_endpoints_that_want_it(
    database: &TestDatabase,
) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let other = account(&ledger, 1000, 0).await;
    let everything = endpoint(&ledger, account_id, None).await;
    let refusals = endpoint(
        &ledger,
        account_id,
        Some(vec![EventType::WithdrawalRefused]),
    )
    .await;
    let others = endpoint(&ledger, other, None).await;

    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let executed = apply(&ledger, account_id, ticket, withdrawal(100), "w100", 1)
        .await
        .unwrap();
    let replay = apply(&ledger, account_id, ticket, withdrawal(100), "w100", 2)
        .await
        .unwrap();
    assert!(replay.replayed);
    let refused_ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let refused = apply(
        &ledger,
        account_id,
        refused_ticket,
        withdrawal(5000),
        "w5000",
        3,
    )
    .await
    .unwrap();
    assert_eq!(refused.response.status, 402);
    // Refused before execution: nothing committed, nothing announced.
    let stale_ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let stale = apply(&ledger, account_id, stale_ticket, withdrawal(1), "w1", 2).await;
    assert!(
        matches!(stale, Err(ApplyError::StaleToken { .. })),
        "{stale:?}"
    );

    let jobs = claim_all(&ledger, "w").await;
    let mut seen: Vec<(EndpointId, EventType)> = jobs
        .iter()
        .map(|job| (job.endpoint.id, job.event.event_type))
        .collect();
    seen.sort();
    let mut expected = vec![
        (everything, EventType::WithdrawalSucceeded),
        (everything, EventType::WithdrawalRefused),
        (refusals, EventType::WithdrawalRefused),
    ];
    expected.sort();
    assert_eq!(seen, expected);
    assert!(
        jobs.iter()
            .all(|job| job.endpoint.id != others && job.attempt == 1)
    );

    for job in &jobs {
        let body = payload(job);
        let (ticket_id, stored) = match job.event.event_type {
            EventType::WithdrawalSucceeded => (ticket, &executed.response),
            _ => (refused_ticket, &refused.response),
        };
        assert_eq!(job.event.ticket_id, ticket_id);
        assert_eq!(body["type"], job.event.event_type.as_str());
        assert_eq!(body["data"]["account_id"], account_id.0.to_string());
        assert_eq!(body["data"]["ticket_id"], ticket_id.0.to_string());
        assert_eq!(body["data"]["outcome"]["status"], stored.status);
        assert_eq!(body["data"]["outcome"]["body"], stored.body);
    }
    // Two deliveries of one event (to two endpoints) carry the same event.
    let refused_ids: Vec<_> = jobs
        .iter()
        .filter(|job| job.event.event_type == EventType::WithdrawalRefused)
        .map(|job| job.event.id)
        .collect();
    assert_eq!(refused_ids.len(), 2);
    assert_eq!(refused_ids[0], refused_ids[1]);
    assert_eq!(ledger.webhook_backlog().await.unwrap().pending, 3);
    assert_clean(&ledger).await;
}

/// A claim holds a delivery for its lease; once the lease ran out another worker claims it
/// as the next attempt, and only that attempt's word is recorded — with the attempt's
/// answer, listed with the delivery.
pub async fn a_delivery_is_recorded_only_at_the_attempt_it_was_claimed_at(database: &TestDatabase) {
    let (ledger, hooks) = one_withdrawal_announced(database).await;

    let first = ledger
        .claim_deliveries("a", Duration::from_millis(200), 10)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    assert!(claim_all(&ledger, "b").await.is_empty(), "leased");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = claim_all(&ledger, "b").await;
    assert_eq!((second.len(), second[0].attempt), (1, 2));
    assert_eq!(second[0].event, first[0].event);

    assert!(!record(&ledger, &first[0], 204, DeliveryOutcome::Delivered).await);
    assert!(record(&ledger, &second[0], 204, DeliveryOutcome::Delivered).await);
    assert!(!record(&ledger, &second[0], 204, DeliveryOutcome::Delivered).await);

    let listed = ledger.deliveries(hooks, None, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, DeliveryStatus::Delivered);
    assert_eq!(listed[0].next_attempt_at, None);
    assert_eq!(listed[0].attempts.len(), 1);
    assert_eq!(listed[0].attempts[0].attempt, 2);
    assert_eq!(listed[0].attempts[0].answer, answered(204));
    assert_eq!(ledger.webhook_backlog().await.unwrap().pending, 0);
}

/// A retry waits until it is due; a delivery out of attempts ends exhausted and is sent
/// again only by hand — refused while a worker holds it.
pub async fn retries_wait_and_an_exhausted_delivery_is_sent_again_by_hand(database: &TestDatabase) {
    let (ledger, hooks) = one_withdrawal_announced(database).await;

    let job = claim_all(&ledger, "a").await.remove(0);
    let delivery = job.job_id;
    assert_eq!(
        ledger.retry_delivery(hooks, delivery).await.unwrap(),
        Err(RetryRefused::InFlight)
    );
    let later = DeliveryOutcome::Retry {
        after: Duration::from_millis(300),
    };
    assert!(record(&ledger, &job, 500, later).await);
    assert!(claim_all(&ledger, "a").await.is_empty(), "not due yet");
    let pending = ledger.deliveries(hooks, None, 10).await.unwrap().remove(0);
    assert_eq!(pending.status, DeliveryStatus::Pending);
    assert!(pending.next_attempt_at.is_some());
    assert_eq!(pending.attempts[0].answer.status, Some(500));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let job = claim_all(&ledger, "a").await.remove(0);
    assert_eq!(job.attempt, 2);
    assert!(record(&ledger, &job, 503, DeliveryOutcome::Exhausted).await);
    assert_eq!(
        ledger.deliveries(hooks, None, 10).await.unwrap()[0].status,
        DeliveryStatus::Exhausted
    );
    assert!(claim_all(&ledger, "a").await.is_empty());

    assert_eq!(
        ledger.retry_delivery(hooks, delivery).await.unwrap(),
        Ok(())
    );
    assert_eq!(
        ledger
            .retry_delivery(EndpointId::random(), delivery)
            .await
            .unwrap(),
        Err(RetryRefused::NotFound)
    );
    let again = claim_all(&ledger, "a").await.remove(0);
    assert_eq!((again.job_id, again.attempt), (delivery, 3));
    assert!(record(&ledger, &again, 200, DeliveryOutcome::Delivered).await);
    let listed = ledger.deliveries(hooks, None, 10).await.unwrap().remove(0);
    assert_eq!(listed.status, DeliveryStatus::Delivered);
    let numbers: Vec<u32> = listed.attempts.iter().map(|a| a.attempt).collect();
    assert_eq!(numbers, [1, 2, 3]);
}

/// A receiver that answers 410 disables its endpoint: the endpoint's other deliveries end,
/// later outcomes are not queued for it, and nothing of it is sent again by hand.
pub async fn gone_disables_the_endpoint_and_ends_its_deliveries(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let hooks = endpoint(&ledger, account_id, None).await;
    for (n, token) in [(1, 1), (2, 2)] {
        let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
        apply(
            &ledger,
            account_id,
            ticket,
            withdrawal(n),
            &format!("w{n}"),
            token,
        )
        .await
        .unwrap();
    }
    let mut jobs = ledger.claim_deliveries("a", LEASE, 1).await.unwrap();
    assert!(record(&ledger, &jobs.remove(0), 410, DeliveryOutcome::EndpointGone).await);

    let disabled = ledger.endpoint(hooks).await.unwrap().unwrap();
    assert!(disabled.disabled.is_some(), "{disabled:?}");
    let listed = ledger.deliveries(hooks, None, 10).await.unwrap();
    assert!(
        listed
            .iter()
            .all(|delivery| delivery.status == DeliveryStatus::EndpointDisabled),
        "{listed:#?}"
    );
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    apply(&ledger, account_id, ticket, withdrawal(3), "w3", 3)
        .await
        .unwrap();
    assert!(claim_all(&ledger, "a").await.is_empty());
    assert_eq!(ledger.deliveries(hooks, None, 10).await.unwrap().len(), 2);
    assert_eq!(
        ledger.retry_delivery(hooks, listed[0].id).await.unwrap(),
        Err(RetryRefused::EndpointDisabled)
    );
}

/// An account has at most 16 endpoints; a deleted one is gone from the list, gets no more
/// events, and its deliveries not yet made end. Rotating a secret keeps the one before it
/// until the window ends.
pub async fn endpoints_are_bounded_deleted_and_rotated(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let mut made = Vec::new();
    for _ in 0..ledger::webhooks::MAX_ENDPOINTS_PER_ACCOUNT {
        made.push(endpoint(&ledger, account_id, None).await);
    }
    let one_more = NewEndpoint {
        id: EndpointId::random(),
        account_id,
        url: "http://127.0.0.1:9/".to_owned(),
        subscription: Subscription::All,
        secret_sealed: vec![1; 40],
    };
    assert_eq!(ledger.create_endpoint(&one_more).await.unwrap(), None);
    assert_eq!(
        ledger.endpoints(account_id).await.unwrap().len(),
        made.len()
    );

    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    apply(&ledger, account_id, ticket, withdrawal(10), "w10", 1)
        .await
        .unwrap();
    let gone = made[0];
    assert!(ledger.delete_endpoint(account_id, gone).await.unwrap());
    assert!(!ledger.delete_endpoint(account_id, gone).await.unwrap());
    assert!(ledger.endpoint(gone).await.unwrap().is_none());
    let jobs = claim_all(&ledger, "a").await;
    assert_eq!(jobs.len(), made.len() - 1);
    assert!(jobs.iter().all(|job| job.endpoint.id != gone));
    assert!(ledger.create_endpoint(&one_more).await.unwrap().is_some());

    let other = account(&ledger, 0, 0).await;
    let kept = made[1];
    assert_eq!(
        ledger
            .rotate_endpoint_secret(other, kept, &[2; 40], HOUR)
            .await
            .unwrap(),
        None,
        "another account's endpoint"
    );
    let rotated = ledger
        .rotate_endpoint_secret(account_id, kept, &[2; 40], HOUR)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rotated.secret_sealed, vec![2; 40]);
    let (previous, until) = rotated.previous_secret.clone().unwrap();
    assert_eq!(previous, vec![7; 40]);
    assert!(until > rotated.created_at + Duration::from_secs(3000));
    assert_eq!(ledger.endpoint(kept).await.unwrap(), Some(rotated));
}

/// A payout announces its settlement, once, with the payout as the renderer shows it; its
/// acceptance announces nothing.
pub async fn a_payout_announces_its_settlement_once(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    endpoint(&ledger, account_id, None).await;
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let payout = PayoutId::random();
    let operation = Operation::Payout {
        payout,
        amount: Amount::new(300).unwrap(),
        destination: Destination::new("acct-1").unwrap(),
    };
    apply(&ledger, account_id, ticket, operation, "p", 1)
        .await
        .unwrap();
    assert!(
        claim_all(&ledger, "w").await.is_empty(),
        "a 202 announces nothing"
    );

    let job = ledger.claim_payouts("p", LEASE, 1).await.unwrap().remove(0);
    let render = |payout: &ledger::payouts::Payout| serde_json::json!({"payout_id": payout.id.0, "status": payout.status.as_str()});
    let settlement = Settlement::Failed {
        reason: "closed".to_owned(),
    };
    assert!(
        ledger
            .settle_payout(&job, &settlement, &render)
            .await
            .unwrap()
    );
    assert!(
        !ledger
            .settle_payout(&job, &settlement, &render)
            .await
            .unwrap()
    );

    let jobs = claim_all(&ledger, "w").await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].event.event_type, EventType::PayoutFailed);
    assert_eq!(jobs[0].event.ticket_id, ticket);
    let body = payload(&jobs[0]);
    assert_eq!(body["data"]["payout"]["payout_id"], payout.0.to_string());
    assert_eq!(body["data"]["payout"]["status"], "failed");
    assert_clean(&ledger).await;
}

/// The audit finds a settlement announced as something else (its event missing, and an
/// event for an outcome that never was), a settlement with no event at all, and a
/// delivery whose event is nowhere (a withdrawal's outcome is its own event: sent as
/// another type, it is no event).
pub async fn audit_finds_a_missing_event_and_a_stray_one(database: &TestDatabase) {
    let (ledger, _hooks) = one_withdrawal_announced(database).await;
    let delivery = claim_all(&ledger, "w").await.remove(0);
    let account_id = delivery.event.account_id;
    assert_eq!(delivery.event.id.0, delivery.event.ticket_id.0);
    let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
    let operation = Operation::Payout {
        payout: PayoutId::random(),
        amount: Amount::new(300).unwrap(),
        destination: Destination::new("acct-1").unwrap(),
    };
    apply(&ledger, account_id, ticket, operation, "p", 2)
        .await
        .unwrap();
    let job = ledger.claim_payouts("p", LEASE, 1).await.unwrap().remove(0);
    let render = |payout: &ledger::payouts::Payout| serde_json::json!({"payout_id": payout.id.0});
    let settled = Settlement::Succeeded {
        transfer_id: "t-1".to_owned(),
    };
    assert!(ledger.settle_payout(&job, &settled, &render).await.unwrap());
    assert_clean(&ledger).await;

    database
        .execute("UPDATE events SET type = 'withdrawal.succeeded'")
        .await
        .unwrap();
    let violations = ledger.audit().await.unwrap();
    let found: Vec<_> = violations
        .iter()
        .filter(|v| v.rule == Rule::EventPerOutcome && v.ticket_id == Some(ticket))
        .map(|v| v.detail.clone())
        .collect();
    assert_eq!(found.len(), 2, "{violations:#?}");
    assert!(
        found
            .iter()
            .any(|d| d.contains("no payout.succeeded event")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|d| d.contains("withdrawal.succeeded event(s) for no such outcome")),
        "{found:?}"
    );

    database.execute("DELETE FROM events").await.unwrap();
    database
        .execute(&format!(
            "UPDATE outbox SET event_type = 'withdrawal.refused' WHERE id = {}",
            delivery.job_id
        ))
        .await
        .unwrap();
    let violations = ledger.audit().await.unwrap();
    let found: Vec<_> = violations
        .iter()
        .filter(|v| v.rule == Rule::EventPerOutcome)
        .map(|v| v.detail.clone())
        .collect();
    // The settlement without its event, its delivery, and the withdrawal's delivery.
    assert_eq!(found.len(), 3, "{violations:#?}");
    assert!(
        found
            .iter()
            .any(|d| d.contains(&format!("delivery {} sends an event", delivery.job_id))),
        "{found:?}"
    );
}

/// Claims take at most what they ask for, however many are due and however many workers
/// claim at once; no delivery is claimed by two.
pub async fn a_claim_takes_at_most_what_it_asks_for(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 100_000, 0).await;
    endpoint(&ledger, account_id, None).await;
    for token in 1..=120_u64 {
        let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
        apply(&ledger, account_id, ticket, withdrawal(1), "w1", token)
            .await
            .unwrap();
    }
    let claims = futures::future::join_all((0..6).map(|worker| {
        let ledger = ledger.clone();
        async move {
            ledger
                .claim_deliveries(&format!("w{worker}"), LEASE, 7)
                .await
                .unwrap()
        }
    }))
    .await;
    let mut ids = Vec::new();
    for claim in &claims {
        assert!(claim.len() <= 7, "a claim of 7 took {}", claim.len());
        ids.extend(claim.iter().map(|job| job.job_id));
    }
    let taken = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), taken, "a delivery claimed twice");
    assert!(taken > 0);
}

/// Whatever a receiver answers is recorded — a NUL character included, which a PostgreSQL
/// TEXT column refuses — and in a batch with other accounts' answers, none is lost with
/// it: every delivery of the batch ends, none is claimed and sent again.
pub async fn an_answer_with_a_nul_byte_is_recorded_beside_the_others(database: &TestDatabase) {
    let ledger = open(database).await;
    let strange = account(&ledger, 1000, 0).await;
    let plain = account(&ledger, 1000, 0).await;
    endpoint(&ledger, strange, None).await;
    let plain_endpoint = endpoint(&ledger, plain, None).await;
    for account_id in [strange, plain] {
        let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
        apply(&ledger, account_id, ticket, withdrawal(10), "w10", 1)
            .await
            .unwrap();
    }
    let jobs = claim_all(&ledger, "w").await;
    assert_eq!(jobs.len(), 2);
    let nul = AttemptAnswer {
        body: Some("200 ok\0".to_owned()),
        ..answered(200)
    };
    let refused = AttemptAnswer {
        error: Some("the receiver answered \0 500".to_owned()),
        body: Some("\0".to_owned()),
        ..answered(500)
    };
    let answers: Vec<(&DeliveryJob, &AttemptAnswer, &DeliveryOutcome)> = jobs
        .iter()
        .map(|job| {
            if job.event.account_id == strange {
                (job, &nul, &DeliveryOutcome::Delivered)
            } else {
                (job, &refused, &DeliveryOutcome::Exhausted)
            }
        })
        .collect();
    assert_eq!(
        ledger.record_deliveries(&answers).await.unwrap(),
        [true, true]
    );
    assert!(
        claim_all(&ledger, "w").await.is_empty(),
        "nothing is sent again"
    );
    for job in &jobs {
        let listed = ledger.deliveries(job.endpoint.id, None, 10).await.unwrap();
        let attempt = &listed[0].attempts[0].answer;
        if job.endpoint.id == plain_endpoint {
            assert_eq!(listed[0].status, DeliveryStatus::Exhausted);
            assert_eq!(attempt.body.as_deref(), Some("\u{FFFD}"));
            assert_eq!(
                attempt.error.as_deref(),
                Some("the receiver answered \u{FFFD} 500")
            );
        } else {
            assert_eq!(listed[0].status, DeliveryStatus::Delivered);
            assert_eq!(attempt.body.as_deref(), Some("200 ok\u{FFFD}"));
        }
    }
    assert_clean(&ledger).await;
}

/// Answers recorded in one batch each end as they would alone: a delivery, a retry, an
/// exhaustion, a 410 — whose endpoint's other open delivery then ends with it, while its
/// sibling delivered in the same batch stays delivered — and a dead worker's late word
/// for a delivery claimed again since, which is not recorded beside the new claim's.
pub async fn answers_are_recorded_together_each_as_if_alone(database: &TestDatabase) {
    let ledger = open(database).await;
    let mut endpoints = Vec::new();
    for withdrawals in [3, 1, 1, 1] {
        let account_id = account(&ledger, 1000, 0).await;
        endpoints.push(endpoint(&ledger, account_id, None).await);
        for n in 1..=withdrawals {
            let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
            apply(
                &ledger,
                account_id,
                ticket,
                withdrawal(n),
                &format!("w{n}"),
                u64::try_from(n).unwrap(),
            )
            .await
            .unwrap();
        }
    }
    let [gone, retried, exhausted, taken_over] = endpoints[..] else {
        unreachable!()
    };
    // A worker's lease runs out on every delivery; another claims them all again.
    let dead = ledger
        .claim_deliveries("dead", Duration::from_millis(1), 100)
        .await
        .unwrap();
    assert_eq!(dead.len(), 6);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let jobs = claim_all(&ledger, "live").await;
    assert_eq!(jobs.len(), 6);
    assert!(jobs.iter().all(|job| job.attempt == 2));
    let of = |endpoint: EndpointId| -> Vec<&DeliveryJob> {
        jobs.iter()
            .filter(|job| job.endpoint.id == endpoint)
            .collect()
    };
    let late = dead
        .iter()
        .find(|job| job.endpoint.id == taken_over)
        .unwrap();
    let later = DeliveryOutcome::Retry { after: HOUR };
    let (ok, refused, went) = (answered(204), answered(500), answered(410));
    let answers: Vec<(&DeliveryJob, &AttemptAnswer, &DeliveryOutcome)> = vec![
        (of(gone)[0], &went, &DeliveryOutcome::EndpointGone),
        (of(gone)[1], &ok, &DeliveryOutcome::Delivered),
        (of(retried)[0], &refused, &later),
        (of(exhausted)[0], &refused, &DeliveryOutcome::Exhausted),
        (late, &refused, &DeliveryOutcome::Exhausted),
        (of(taken_over)[0], &ok, &DeliveryOutcome::Delivered),
    ];
    assert_eq!(
        ledger.record_deliveries(&answers).await.unwrap(),
        [true, true, true, true, false, true]
    );

    let statuses = |listed: &[ledger::webhooks::Delivery]| -> Vec<DeliveryStatus> {
        let mut statuses: Vec<_> = listed.iter().map(|delivery| delivery.status).collect();
        statuses.sort_by_key(|status| status.as_str());
        statuses
    };
    let listed = ledger.deliveries(gone, None, 10).await.unwrap();
    assert_eq!(
        statuses(&listed),
        [
            DeliveryStatus::Delivered,
            DeliveryStatus::EndpointDisabled,
            DeliveryStatus::EndpointDisabled
        ],
        "{listed:#?}"
    );
    let unanswered = listed
        .iter()
        .find(|delivery| delivery.id == of(gone)[2].job_id)
        .unwrap();
    assert!(unanswered.attempts.is_empty(), "{unanswered:#?}");
    assert!(
        ledger
            .endpoint(gone)
            .await
            .unwrap()
            .unwrap()
            .disabled
            .is_some()
    );

    let pending = ledger
        .deliveries(retried, None, 10)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(pending.status, DeliveryStatus::Pending);
    assert!(pending.next_attempt_at.is_some());
    assert_eq!(pending.attempts.len(), 1);
    assert_eq!(pending.attempts[0].answer, refused);
    assert_eq!(
        ledger.deliveries(exhausted, None, 10).await.unwrap()[0].status,
        DeliveryStatus::Exhausted
    );
    let delivered = ledger
        .deliveries(taken_over, None, 10)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(delivered.status, DeliveryStatus::Delivered);
    let numbers: Vec<u32> = delivered.attempts.iter().map(|a| a.attempt).collect();
    assert_eq!(numbers, [2], "the late word of attempt 1 is not recorded");
    assert_eq!(delivered.attempts[0].answer, ok);

    assert!(
        claim_all(&ledger, "live").await.is_empty(),
        "the retry is not due"
    );
    assert_clean(&ledger).await;
}

/// Rotations sent at once under one idempotency key rotate once: one runs, the others get
/// its answer (the same secret) and change nothing — the secret before it is the one the
/// endpoint was made with. Another request under the key is refused; once the retention
/// has passed, the reaper frees the key.
pub async fn rotations_under_one_key_rotate_once(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let endpoint_id = endpoint(&ledger, account_id, None).await;
    let key = uuid::Uuid::new_v4();
    let rotate = |sealed: u8, fingerprint: &'static str| {
        let ledger = ledger.clone();
        async move {
            let request = RequestKey {
                account: account_id,
                key,
                fingerprint,
            };
            let render = |endpoint: &ledger::webhooks::Endpoint| serde_json::json!({ "id": endpoint.id.0.to_string() });
            ledger
                .rotate_endpoint_secret_once(
                    endpoint_id,
                    &[sealed; 40],
                    HOUR,
                    &request,
                    &render,
                    &format!("whsec_{sealed}"),
                )
                .await
        }
    };
    let answers = futures::future::join_all((1..=5).map(|n| rotate(n, "rotate"))).await;
    let mut ran = Vec::new();
    let mut replayed = Vec::new();
    for answer in answers {
        match answer.unwrap() {
            Keyed::Ran(Some(endpoint)) => ran.push(endpoint),
            Keyed::Ran(None) => panic!("the endpoint is there"),
            Keyed::Replayed(kept) => replayed.push(kept),
        }
    }
    assert_eq!(ran.len(), 1, "one rotation ran");
    let winner = ran[0].secret_sealed[0];
    for kept in &replayed {
        assert_eq!(kept.status, 200);
        assert_eq!(
            kept.secret.as_deref(),
            Some(format!("whsec_{winner}").as_str())
        );
        assert_eq!(kept.body["id"], endpoint_id.0.to_string());
    }
    let stored = ledger.endpoint(endpoint_id).await.unwrap().unwrap();
    assert_eq!(stored.secret_sealed, vec![winner; 40]);
    assert_eq!(
        stored.previous_secret.map(|(sealed, _)| sealed),
        Some(vec![7; 40]),
        "the secret before is the first one: no second rotation dropped it"
    );
    assert!(matches!(
        rotate(9, "another request").await,
        Err(ledger::LedgerError::CreateKeyReused)
    ));

    ledger.reap(Duration::ZERO, 100).await.unwrap();
    assert!(
        matches!(rotate(9, "another request").await, Ok(Keyed::Ran(Some(_)))),
        "the reaper freed the key"
    );
}

/// An ended delivery is kept for the retention — listed, and sent again by hand — and then
/// reaped with its attempts; one still open, or open again because it was sent again by
/// hand, is never reaped.
pub async fn ended_deliveries_are_reaped_after_the_retention(database: &TestDatabase) {
    let (ledger, hooks) = one_withdrawal_announced(database).await;
    let delivered = claim_all(&ledger, "a").await.remove(0);
    assert!(record(&ledger, &delivered, 200, DeliveryOutcome::Delivered).await);
    let account_id = delivered.event.account_id;
    for (amount, token) in [(11, 2), (12, 3)] {
        let ticket = ledger.issue_ticket(account_id, HOUR).await.unwrap().id;
        apply(&ledger, account_id, ticket, withdrawal(amount), "w", token)
            .await
            .unwrap();
    }
    let mut claimed = claim_all(&ledger, "a").await;
    assert_eq!(claimed.len(), 2);
    let exhausted = claimed.remove(0);
    assert!(record(&ledger, &exhausted, 503, DeliveryOutcome::Exhausted).await);
    let open_one = claimed.remove(0).job_id;

    assert_eq!(ledger.reap_finished_jobs(HOUR, 10).await.unwrap(), 0);
    assert_eq!(ledger.deliveries(hooks, None, 10).await.unwrap().len(), 3);

    // The exhausted one is sent again by hand: open once more, so kept.
    assert_eq!(
        ledger
            .retry_delivery(hooks, exhausted.job_id)
            .await
            .unwrap(),
        Ok(())
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A batch of one: the reaper comes back until nothing is left.
    assert_eq!(
        ledger
            .reap_finished_jobs(Duration::from_millis(10), 1)
            .await
            .unwrap(),
        1,
        "only the delivered one ended long enough ago"
    );
    let mut kept: Vec<i64> = ledger
        .deliveries(hooks, None, 10)
        .await
        .unwrap()
        .iter()
        .map(|delivery| delivery.id)
        .collect();
    kept.sort_unstable();
    assert_eq!(kept, [exhausted.job_id, open_one]);
    assert_eq!(
        ledger
            .retry_delivery(hooks, delivered.job_id)
            .await
            .unwrap(),
        Err(RetryRefused::NotFound),
        "a reaped delivery is gone"
    );
    let attempts_of =
        |job: i64| format!("SELECT COUNT(*) FROM webhook_attempts WHERE job_id = {job}");
    assert_eq!(
        database
            .count(&attempts_of(delivered.job_id))
            .await
            .unwrap(),
        0,
        "its attempts went with it"
    );
    assert_eq!(
        database
            .count(&attempts_of(exhausted.job_id))
            .await
            .unwrap(),
        1
    );
    assert_clean(&ledger).await;
}

/// How many stored outcomes a reaping with no retention prunes.
async fn outcomes_pruned(ledger: &Ledger) -> u64 {
    ledger
        .reap(Duration::ZERO, 100)
        .await
        .unwrap()
        .pruned_outcomes
}

/// An outcome is its own event: the reaper keeps a ticket's stored outcome, past its
/// retention, while a delivery of it is kept (it can still be sent again by hand, byte for
/// byte), and prunes it once the delivery is reaped.
pub async fn an_outcome_is_kept_while_a_delivery_of_it_is(database: &TestDatabase) {
    let ledger = open(database).await;
    let account_id = account(&ledger, 1000, 0).await;
    let hooks = endpoint(&ledger, account_id, None).await;
    let ticket = ledger
        .issue_ticket(account_id, Duration::from_millis(400))
        .await
        .unwrap()
        .id;
    apply(&ledger, account_id, ticket, withdrawal(10), "w10", 1)
        .await
        .unwrap();
    let first = claim_all(&ledger, "a").await.remove(0);
    assert_eq!(first.event.id.0, ticket.0, "the event's id is its ticket's");
    assert!(record(&ledger, &first, 200, DeliveryOutcome::Delivered).await);
    tokio::time::sleep(Duration::from_millis(500)).await;

    assert_eq!(outcomes_pruned(&ledger).await, 0);
    assert_eq!(
        ledger.retry_delivery(hooks, first.job_id).await.unwrap(),
        Ok(())
    );
    let again = claim_all(&ledger, "a").await.remove(0);
    assert_eq!(again.event, first.event);
    assert_eq!(payload(&again), payload(&first));
    assert_eq!(payload(&again)["data"]["outcome"]["status"], 201);
    assert!(record(&ledger, &again, 200, DeliveryOutcome::Delivered).await);
    // Finished before the reaper's cutoff, which SQLite's clock reads to the millisecond.
    tokio::time::sleep(Duration::from_millis(5)).await;

    assert_eq!(
        ledger
            .reap_finished_jobs(Duration::ZERO, 100)
            .await
            .unwrap(),
        1
    );
    assert_eq!(outcomes_pruned(&ledger).await, 1);
    assert_clean(&ledger).await;
}
