//! The bank's audit: what must hold of its tables, checked from outside the requests
//! (`payonce-bank audit`, the tests).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::store::{Store, StoreError};

/// One thing the audit found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which rule: `key-executed-once`, `destination-total`, `grand-total` or
    /// `answer-matches-state`.
    pub rule: &'static str,
    /// What was found.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.rule, self.detail)
    }
}

/// What the audit counted and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditReport {
    /// Executed transfers.
    pub transfers: i64,
    /// Their amounts, summed.
    pub total: i64,
    /// Every broken rule; empty when the bank is clean.
    pub violations: Vec<Violation>,
}

impl AuditReport {
    /// Whether every rule holds.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Keys held by more than one row (the UNIQUE index forbids it; this checks it is there).
const DUPLICATE_KEYS: &str =
    "SELECT idempotency_key, COUNT(*), CAST(COALESCE(SUM(amount), 0) AS BIGINT)
     FROM bank_transfers GROUP BY idempotency_key HAVING COUNT(*) > 1";
/// Each destination's executed transfers: sum and count.
const SUMS_BY_DESTINATION: &str = "SELECT destination, CAST(SUM(amount) AS BIGINT), COUNT(*)
     FROM bank_transfers WHERE state = 'executed' GROUP BY destination";
/// Each destination's running total and count.
const RUNNING_TOTALS: &str = "SELECT destination, total, transfers FROM bank_destinations";
/// Every executed transfer: sum and count, as one row.
const GRAND_SUM: &str = "SELECT 'all', CAST(COALESCE(SUM(amount), 0) AS BIGINT), COUNT(*)
     FROM bank_transfers WHERE state = 'executed'";
/// The grand running total.
const GRAND_TOTAL: &str = "SELECT 'all', total, transfers FROM bank_totals WHERE id = 1";
/// Rows whose stored answer or fields do not fit their state: an executed transfer answers
/// 201, a declined one 422 with a reason, both with their request; a closed key has
/// neither request nor answer.
const MISMATCHED_ANSWERS: &str =
    "SELECT idempotency_key || ' (' || state || ')', id, CAST(COALESCE(answer_status, 0) AS BIGINT)
     FROM bank_transfers
     WHERE NOT (
         (state = 'executed' AND answer_status = 201 AND answer_body IS NOT NULL
          AND amount IS NOT NULL AND destination IS NOT NULL AND fingerprint IS NOT NULL
          AND decline_reason IS NULL)
      OR (state = 'declined' AND answer_status = 422 AND answer_body IS NOT NULL
          AND amount IS NOT NULL AND destination IS NOT NULL AND fingerprint IS NOT NULL
          AND decline_reason IS NOT NULL)
      OR (state = 'closed' AND answer_status IS NULL AND answer_body IS NULL
          AND amount IS NULL AND destination IS NULL)
     )
     ORDER BY id";

/// Checks every rule.
pub(crate) async fn audit(store: &Store) -> Result<AuditReport, StoreError> {
    let mut violations = Vec::new();
    for (key, rows, _) in store.triples(DUPLICATE_KEYS).await? {
        violations.push(Violation {
            rule: "key-executed-once",
            detail: format!("key {key:?} is held by {rows} rows"),
        });
    }

    let sums = by_name(store.triples(SUMS_BY_DESTINATION).await?);
    let running = by_name(store.triples(RUNNING_TOTALS).await?);
    let destinations: BTreeSet<&String> = sums.keys().chain(running.keys()).collect();
    for destination in destinations {
        let summed = sums.get(destination).copied().unwrap_or((0, 0));
        let recorded = running.get(destination).copied().unwrap_or((0, 0));
        if summed != recorded {
            violations.push(Violation {
                rule: "destination-total",
                detail: format!(
                    "destination {destination:?} records {} in {} transfers, its transfers sum to {} in {}",
                    recorded.0, recorded.1, summed.0, summed.1
                ),
            });
        }
    }

    let summed = store.triples(GRAND_SUM).await?;
    let recorded = store.triples(GRAND_TOTAL).await?;
    let (total, transfers) = summed
        .first()
        .map_or((0, 0), |(_, total, count)| (*total, *count));
    match recorded.first() {
        Some((_, recorded_total, recorded_count))
            if (*recorded_total, *recorded_count) == (total, transfers) => {}
        Some((_, recorded_total, recorded_count)) => violations.push(Violation {
            rule: "grand-total",
            detail: format!(
                "the bank records {recorded_total} in {recorded_count} transfers, its transfers sum to {total} in {transfers}"
            ),
        }),
        None => violations.push(Violation {
            rule: "grand-total",
            detail: "the grand total's row is missing".into(),
        }),
    }

    for (row, id, status) in store.triples(MISMATCHED_ANSWERS).await? {
        violations.push(Violation {
            rule: "answer-matches-state",
            detail: format!("row {id}, key {row}, stored status {status}"),
        });
    }

    Ok(AuditReport {
        transfers,
        total,
        violations,
    })
}

fn by_name(rows: Vec<(String, i64, i64)>) -> BTreeMap<String, (i64, i64)> {
    rows.into_iter()
        .map(|(name, total, count)| (name, (total, count)))
        .collect()
}
