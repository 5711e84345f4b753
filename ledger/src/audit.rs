//! The audit: every invariant of the ledger, checked over the whole database.
//!
//! The SQL here runs unchanged on PostgreSQL and SQLite. Each query returns the rows that
//! break one rule — at most 1,000 of them, enough to diagnose and bounded on a badly broken
//! database. An empty result everywhere means clean. [`Audit::run`] runs them in turn, one
//! named function a rule.

use std::sync::LazyLock;

use serde::Serialize;
use sqlx::{AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, Pool, Type};

use crate::db_types::Timestamp;
use crate::dialect::Dialect;
use crate::error::LedgerError;
use crate::holds::{HoldId, RefundId};
use crate::model::{AccountId, EntryKind, OrderId, OutcomeKind, TicketId};
use crate::payouts::PayoutId;
use crate::webhooks::event_of_outcome;

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which rule.
    pub rule: Rule,
    /// The account concerned, where there is one.
    pub account_id: Option<AccountId>,
    /// The ticket concerned, where there is one.
    pub ticket_id: Option<TicketId>,
    /// What exactly is wrong, with the numbers.
    pub detail: String,
}

/// The ledger's invariants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// Balance and points are never negative.
    NonNegative,
    /// Balance = sum of the account's entries (opening included); likewise points.
    BalanceMatchesEntries,
    /// Each entry's balance_after and points_after are the running sums.
    RunningTotals,
    /// At most one entry per ticket.
    OneEntryPerTicket,
    /// A ticket whose outcome moved money ([`OutcomeKind::moved`]: executed, a payout
    /// accepted) has its entry, on its account, of its kind; any other ticket has none.
    OutcomeMatchesEntry,
    /// Every entry's ticket exists (used tickets are never deleted).
    EntryHasTicket,
    /// Fencing tokens never go backwards: along an account's entries, and the account's
    /// recorded token is at least every entry's (order payments, fenced by their order's
    /// lock, are held to their order's token instead, captures to their hold's).
    FencingTokenOnlyGrows,
    /// An order is paid iff it has exactly one payment entry: of its amount, on its
    /// account, by the ticket the order names, with a token the order recorded.
    OrderPaidOnce,
    /// Exactly one opening entry per account, and it comes first.
    OpeningEntry,
    /// A payout's money moves once each way at most: exactly one debit entry (its ticket,
    /// account and amount); a failed payout exactly one reversal of its amount, and no
    /// other payout any.
    PayoutMovedOnce,
    /// An entry's signs fit its kind (withdrawals take money, deposits add it, draws spend
    /// points and credit nothing negative).
    EntrySigns,
    /// Every outcome that announces an event, committed since the ledger writes them, has
    /// exactly one, of its type, on its account — a spend's outcome of a kind that
    /// announces one ([`event_of_outcome`]) is its own event (its ticket), a settled
    /// payout has one row, a hold recorded expired one `hold.expired` row; every event row
    /// announces such an outcome (none for one that never committed); and every delivery's
    /// event exists.
    EventPerOutcome,
    /// A hold is resolved once and moves money once at most: a captured hold has exactly
    /// one capture entry (its account, the ticket that captured it, the captured amount
    /// out), any other hold none; and an account's `held` is what its holds still held
    /// add up to.
    HoldResolvedOnce,
    /// What a payment's refunds add up to is the order's or the hold's `refunded_amount`,
    /// never above what it paid (the order's amount once paid, the hold's captured
    /// amount); each refund has exactly one entry (its account and ticket, its amount
    /// back), on the account that paid.
    RefundsWithinPayment,
    /// available = balance − the holds held and not expired (by the database's clock),
    /// never negative.
    AvailableNonNegative,
}

const NEGATIVE: &str = "
    SELECT id, balance, points FROM accounts
    WHERE balance < 0 OR points < 0
    LIMIT 1000";

const SUMS: &str = "
    SELECT a.id, a.balance, a.points,
           CAST(COALESCE(SUM(e.amount), 0) AS BIGINT),
           CAST(COALESCE(SUM(e.points), 0) AS BIGINT)
    FROM accounts a LEFT JOIN entries e ON e.account_id = a.id
    GROUP BY a.id, a.balance, a.points
    HAVING a.balance <> COALESCE(SUM(e.amount), 0) OR a.points <> COALESCE(SUM(e.points), 0)
    LIMIT 1000";

const RUNNING: &str = "
    SELECT id, account_id, ticket_id, balance_after, points_after,
           running_balance, running_points, fencing_token, previous_token
    FROM (
        SELECT id, account_id, ticket_id, balance_after, points_after, fencing_token,
               CAST(SUM(amount) OVER running AS BIGINT) AS running_balance,
               CAST(SUM(points) OVER running AS BIGINT) AS running_points,
               CASE WHEN kind IN ('order_payment', 'hold_capture', 'refund') THEN NULL
                    ELSE LAG(fencing_token) OVER fenced END AS previous_token
        FROM entries
        WINDOW running AS (PARTITION BY account_id ORDER BY id),
               -- The entries fenced by the account's lock; order payments carry their
               -- order's token, captures their hold's, refunds their order's or hold's:
               -- each from another counter.
               fenced AS (PARTITION BY account_id,
                                       kind IN ('order_payment', 'hold_capture', 'refund')
                          ORDER BY id)
    ) chain
    WHERE balance_after <> running_balance
       OR points_after <> running_points
       OR fencing_token < previous_token
    LIMIT 1000";

const DUPLICATE_ENTRIES: &str = "
    SELECT e.ticket_id, e.account_id, d.entries
    FROM entries e JOIN (
        SELECT ticket_id, CAST(COUNT(*) AS BIGINT) AS entries FROM entries
        WHERE ticket_id IS NOT NULL
        GROUP BY ticket_id
        HAVING COUNT(*) > 1
    ) d ON d.ticket_id = e.ticket_id
    LIMIT 1000";

/// The entry kinds a ticket can be used for.
const SPENT_ON: [EntryKind; 9] = [
    EntryKind::Withdrawal,
    EntryKind::Deposit,
    EntryKind::LotteryDraw,
    EntryKind::OrderPayment,
    EntryKind::Payout,
    EntryKind::Hold,
    EntryKind::HoldCapture,
    EntryKind::HoldVoid,
    EntryKind::Refund,
];

/// SQL: the [`OutcomeKind`] (its name) of ticket `t`'s stored outcome, NULL for an unused
/// ticket (or a pair no outcome is stored as) — [`OutcomeKind::stored`], written out.
fn outcome_kind_of_ticket() -> String {
    let cases: String = SPENT_ON
        .into_iter()
        .flat_map(|operation| {
            OutcomeKind::ALL
                .into_iter()
                .filter(move |kind| kind.can_come_of(operation))
                .map(move |kind| {
                    format!(
                        " WHEN t.operation = '{}' AND t.response_status = {} THEN '{}'",
                        operation.as_str(),
                        kind.status(),
                        kind.as_str()
                    )
                })
        })
        .collect();
    format!("(CASE{cases} END)")
}

/// SQL: the names of `kinds`, for `IN (…)`.
fn names_of(kinds: impl Iterator<Item = OutcomeKind>) -> String {
    kinds
        .map(|kind| format!("'{}'", kind.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

static OUTCOME_VS_ENTRY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT t.id, t.account_id, t.response_status, t.operation, e.id, e.account_id, e.kind
         FROM tickets t LEFT JOIN entries e ON e.ticket_id = t.id
         WHERE COALESCE({kind} IN ({moved}), 1 = 0) <> (e.id IS NOT NULL)
            OR e.account_id <> t.account_id
            OR e.kind <> t.operation
         LIMIT 1000",
        kind = outcome_kind_of_ticket(),
        moved = names_of(OutcomeKind::ALL.into_iter().filter(|kind| kind.moved())),
    )
});

/// SQL: the event type ticket `t`'s stored outcome announces, NULL for none —
/// [`event_of_outcome`] of its operation and kind, written out.
fn event_of_ticket() -> String {
    let kind = outcome_kind_of_ticket();
    let cases: String = SPENT_ON
        .into_iter()
        .flat_map(|operation| {
            OutcomeKind::ALL.into_iter().filter_map(move |outcome| {
                event_of_outcome(operation, outcome).map(|event| (operation, outcome, event))
            })
        })
        .map(|(operation, outcome, event)| {
            format!(
                " WHEN t.operation = '{}' AND {kind} = '{}' THEN '{}'",
                operation.as_str(),
                outcome.as_str(),
                event.as_str()
            )
        })
        .collect();
    format!("CASE{cases} END")
}

const ORPHAN_ENTRIES: &str = "
    SELECT e.id, e.account_id, e.ticket_id
    FROM entries e LEFT JOIN tickets t ON t.id = e.ticket_id
    WHERE e.ticket_id IS NOT NULL AND t.id IS NULL
    LIMIT 1000";

const ACCOUNT_TOKENS: &str = "
    SELECT a.id, a.fencing_token, MAX(e.fencing_token)
    FROM accounts a JOIN entries e
         ON e.account_id = a.id AND e.kind NOT IN ('order_payment', 'hold_capture', 'refund')
    GROUP BY a.id, a.fencing_token
    HAVING MAX(e.fencing_token) > a.fencing_token
    LIMIT 1000";

const OPENING_COUNT: &str = "
    SELECT a.id, CAST(COUNT(e.id) AS BIGINT)
    FROM accounts a LEFT JOIN entries e ON e.account_id = a.id AND e.kind = 'opening'
    GROUP BY a.id
    HAVING COUNT(e.id) <> 1
    LIMIT 1000";

const OPENING_FIRST: &str = "
    SELECT e.id, e.account_id FROM entries e
    WHERE e.kind = 'opening'
      AND e.id <> (SELECT MIN(x.id) FROM entries x WHERE x.account_id = e.account_id)
    LIMIT 1000";

const SIGNS: &str = "
    SELECT id, account_id, ticket_id, kind, amount, points FROM entries
    WHERE (kind = 'withdrawal' AND (amount >= 0 OR points <> 0))
       OR (kind = 'deposit' AND (amount <= 0 OR points <> 0))
       OR (kind = 'lottery_draw' AND (amount < 0 OR points >= 0))
       OR (kind = 'opening' AND (amount < 0 OR points < 0))
       OR (kind = 'order_payment' AND (amount >= 0 OR points <> 0))
       OR (kind = 'payout' AND (amount >= 0 OR points <> 0))
       OR (kind = 'payout_reversal' AND (amount <= 0 OR points <> 0))
       OR (kind = 'hold_capture' AND (amount >= 0 OR points <> 0))
       OR (kind = 'refund' AND (amount <= 0 OR points <> 0))
    LIMIT 1000";

const HOLDS: &str = "
    SELECT id, account_id, resolved_by_ticket, state, amount, captured_amount, captures,
           matching
    FROM (
        SELECT h.id, h.account_id, h.resolved_by_ticket, h.state, h.amount, h.captured_amount,
               CAST((SELECT COUNT(*) FROM entries e WHERE e.hold_id = h.id) AS BIGINT)
                   AS captures,
               CAST((SELECT COUNT(*) FROM entries e
                     WHERE e.hold_id = h.id AND e.kind = 'hold_capture'
                       AND e.account_id = h.account_id AND e.ticket_id = h.resolved_by_ticket
                       AND e.amount = -h.captured_amount
                       AND e.fencing_token <= h.fencing_token) AS BIGINT) AS matching
        FROM holds h
    ) moved
    WHERE captures <> matching OR captures <> CASE WHEN state = 'captured' THEN 1 ELSE 0 END
    LIMIT 1000";

const HELD: &str = "
    SELECT id, held, holds
    FROM (
        SELECT a.id, a.held,
               CAST(COALESCE((SELECT SUM(h.amount) FROM holds h
                              WHERE h.account_id = a.id AND h.state = 'held'), 0) AS BIGINT)
                   AS holds
        FROM accounts a
    ) counted
    WHERE held <> holds
    LIMIT 1000";

/// Parameters: $1 the database's clock.
const AVAILABLE: &str = "
    SELECT a.id, a.balance, CAST(SUM(h.amount) AS BIGINT)
    FROM accounts a JOIN holds h ON h.account_id = a.id
    WHERE h.state = 'held' AND h.expires_at > $1
    GROUP BY a.id, a.balance
    HAVING a.balance < SUM(h.amount)
    LIMIT 1000";

const REFUNDS: &str = "
    SELECT id, account_id, ticket_id, amount, payer, entries, matching
    FROM (
        SELECT r.id, r.account_id, r.ticket_id, r.amount,
               COALESCE((SELECT o.account_id FROM orders o WHERE o.id = r.order_id),
                        (SELECT h.account_id FROM holds h WHERE h.id = r.hold_id)) AS payer,
               CAST((SELECT COUNT(*) FROM entries e WHERE e.refund_id = r.id) AS BIGINT)
                   AS entries,
               CAST((SELECT COUNT(*) FROM entries e
                     WHERE e.refund_id = r.id AND e.kind = 'refund'
                       AND e.account_id = r.account_id AND e.ticket_id = r.ticket_id
                       AND e.amount = r.amount) AS BIGINT) AS matching
        FROM refunds r
    ) refunded
    WHERE entries <> 1 OR matching <> 1 OR payer IS NULL OR payer <> account_id
    LIMIT 1000";

const ORDER_REFUNDS: &str = "
    SELECT id, account_id, refunded_amount, total, paid
    FROM (
        SELECT o.id, o.account_id, o.refunded_amount,
               CAST(COALESCE((SELECT SUM(r.amount) FROM refunds r WHERE r.order_id = o.id), 0)
                    AS BIGINT) AS total,
               CASE WHEN o.paid_by_ticket IS NULL THEN 0 ELSE o.amount END AS paid
        FROM orders o
    ) refunded
    WHERE refunded_amount <> total OR total > paid
    LIMIT 1000";

const HOLD_REFUNDS: &str = "
    SELECT id, account_id, refunded_amount, total, paid
    FROM (
        SELECT h.id, h.account_id, h.refunded_amount,
               CAST(COALESCE((SELECT SUM(r.amount) FROM refunds r WHERE r.hold_id = h.id), 0)
                    AS BIGINT) AS total,
               COALESCE(h.captured_amount, 0) AS paid
        FROM holds h
    ) refunded
    WHERE refunded_amount <> total OR total > paid
    LIMIT 1000";

const PAYOUTS: &str = "
    SELECT id, account_id, ticket_id, status, amount, debits, all_debits, reversals,
           all_reversals
    FROM (
        SELECT p.id, p.account_id, p.ticket_id, p.status, p.amount,
               CAST((SELECT COUNT(*) FROM entries e
                     WHERE e.payout_id = p.id AND e.kind = 'payout' AND e.ticket_id = p.ticket_id
                       AND e.account_id = p.account_id AND e.amount = -p.amount) AS BIGINT)
                   AS debits,
               CAST((SELECT COUNT(*) FROM entries e
                     WHERE e.payout_id = p.id AND e.kind = 'payout') AS BIGINT) AS all_debits,
               CAST((SELECT COUNT(*) FROM entries e
                     WHERE e.payout_id = p.id AND e.kind = 'payout_reversal'
                       AND e.account_id = p.account_id AND e.amount = p.amount) AS BIGINT)
                   AS reversals,
               CAST((SELECT COUNT(*) FROM entries e
                     WHERE e.payout_id = p.id AND e.kind = 'payout_reversal') AS BIGINT)
                   AS all_reversals
        FROM payouts p
    ) moved
    WHERE debits <> 1 OR all_debits <> 1 OR reversals <> all_reversals
       OR all_reversals <> CASE WHEN status = 'failed' THEN 1 ELSE 0 END
    LIMIT 1000";

const ORDERS: &str = "
    SELECT o.id, o.account_id, e.ticket_id, o.paid_by_ticket, o.amount,
           e.amount, CAST((SELECT COUNT(*) FROM entries x WHERE x.order_id = o.id) AS BIGINT)
    FROM orders o LEFT JOIN entries e ON e.order_id = o.id
    WHERE (o.paid_by_ticket IS NULL) <> (e.id IS NULL)
       OR e.ticket_id <> o.paid_by_ticket
       OR e.amount <> -o.amount
       OR e.account_id <> o.account_id
       OR e.kind <> 'order_payment'
       OR e.fencing_token > o.fencing_token
       OR (SELECT COUNT(*) FROM entries x WHERE x.order_id = o.id) > 1
    LIMIT 1000";

/// The outcomes that announce an event with a row of its own, against the `events` rows:
/// rows where one lacks the other, or their accounts differ, or an outcome has more than
/// one. Those are the payouts settled since `ledger_marks.events`, the holds expired (every
/// one: holds came after events did; the event names the ticket that placed the hold), and
/// the spends' outcomes
/// committed between that mark and `outcome_events` — since then a spend's outcome is its
/// event, its ticket, and a row of an outcome's type is one too many.
static EVENTS: LazyLock<String> =
    LazyLock::new(|| EVENTS_WITH_TYPE_OF_TICKET.replace("{type of ticket t}", &event_of_ticket()));

/// Deliveries whose event is nowhere: neither an `events` row of its type on the
/// endpoint's account, nor a ticket of that account whose outcome announces that type.
static DELIVERIES_WITHOUT_EVENT: LazyLock<String> = LazyLock::new(|| {
    DELIVERIES_WITHOUT_EVENT_WITH_TYPE_OF_TICKET.replace("{type of ticket t}", &event_of_ticket())
});

const DELIVERIES_WITHOUT_EVENT_WITH_TYPE_OF_TICKET: &str = "
    SELECT ep.account_id, o.event_id, o.id
    FROM outbox o JOIN webhook_endpoints ep ON ep.id = o.endpoint_id
    WHERE o.kind = 'webhook'
      AND NOT EXISTS (SELECT 1 FROM events e
                      WHERE e.id = o.event_id AND e.type = o.event_type
                        AND e.account_id = ep.account_id)
      AND NOT EXISTS (SELECT 1 FROM tickets t
                      WHERE t.id = o.event_id AND t.account_id = ep.account_id
                        AND {type of ticket t} = o.event_type)
    LIMIT 1000";

/// [`EVENTS`]' text, with `{type of ticket t}` where the type ticket `t`'s outcome
/// announces goes ([`event_of_ticket`]).
const EVENTS_WITH_TYPE_OF_TICKET: &str = "
    WITH mark AS (SELECT at FROM ledger_marks WHERE name = 'events'),
    rowless AS (SELECT at FROM ledger_marks WHERE name = 'outcome_events'),
    announced AS (
        SELECT t.id AS ticket_id, t.account_id, {type of ticket t} AS type
        FROM tickets t
        WHERE t.completed_at >= (SELECT at FROM mark)
          AND t.completed_at < (SELECT at FROM rowless)
        UNION ALL
        SELECT p.ticket_id, p.account_id,
               CASE p.status WHEN 'succeeded' THEN 'payout.succeeded' ELSE 'payout.failed' END
        FROM payouts p
        WHERE p.status <> 'pending' AND p.settled_at >= (SELECT at FROM mark)
        UNION ALL
        SELECT h.ticket_id, h.account_id, 'hold.expired'
        FROM holds h
        WHERE h.state = 'expired'
    ),
    expected AS (SELECT * FROM announced WHERE type IS NOT NULL),
    counted AS (
        SELECT ticket_id, type, CAST(COUNT(*) AS BIGINT) AS events
        FROM events GROUP BY ticket_id, type
    ),
    joined AS (
        SELECT COALESCE(x.ticket_id, c.ticket_id) AS ticket_id,
               COALESCE(x.type, c.type) AS type, x.account_id AS committed_on,
               COALESCE(c.events, 0) AS events
        FROM expected x FULL OUTER JOIN counted c
             ON c.ticket_id = x.ticket_id AND c.type = x.type
    )
    SELECT (SELECT e.account_id FROM events e
            WHERE e.ticket_id = j.ticket_id AND e.type = j.type
              AND (j.committed_on IS NULL OR e.account_id <> j.committed_on)
            LIMIT 1) AS stray_on,
           j.committed_on, j.ticket_id, j.type, j.events
    FROM joined j
    WHERE j.committed_on IS NULL OR j.events <> 1
       OR EXISTS (SELECT 1 FROM events e
                  WHERE e.ticket_id = j.ticket_id AND e.type = j.type
                    AND e.account_id <> j.committed_on)
    LIMIT 1000";

/// The audit of the database behind one pool.
pub(crate) struct Audit<'p, D: Database> {
    pool: &'p Pool<D>,
}

impl<'p, D: Database> Audit<'p, D> {
    /// The audit of the database behind `pool`.
    pub(crate) fn of(pool: &'p Pool<D>) -> Self {
        Self { pool }
    }
}

/// One violation of `rule`.
fn violation(
    rule: Rule,
    account_id: AccountId,
    ticket_id: Option<TicketId>,
    detail: String,
) -> Violation {
    Violation {
        rule,
        account_id: Some(account_id),
        ticket_id,
        detail,
    }
}

impl<D> Audit<'_, D>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'r> i64: Decode<'r, D> + Type<D>,
    for<'r> i32: Decode<'r, D> + Type<D>,
    for<'r> String: Decode<'r, D> + Type<D>,
    for<'r> AccountId: Decode<'r, D> + Type<D>,
    for<'r> TicketId: Decode<'r, D> + Type<D>,
    for<'r> OrderId: Decode<'r, D> + Type<D>,
    for<'r> PayoutId: Decode<'r, D> + Type<D>,
    for<'r> HoldId: Decode<'r, D> + Type<D>,
    for<'r> RefundId: Decode<'r, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Decode<'q, D> + Type<D>,
    usize: ColumnIndex<D::Row>,
{
    /// Checks every rule; what breaks them, rule by rule in this order.
    pub(crate) async fn run(&self) -> Result<Vec<Violation>, LedgerError> {
        let mut found = self.non_negative().await?;
        found.extend(self.balance_matches_entries().await?);
        found.extend(self.running_totals_and_token_order().await?);
        found.extend(self.one_entry_per_ticket().await?);
        found.extend(self.outcome_matches_entry().await?);
        found.extend(self.entry_has_ticket().await?);
        found.extend(self.account_token_covers_entries().await?);
        found.extend(self.opening_entry().await?);
        found.extend(self.entry_signs().await?);
        found.extend(self.order_paid_once().await?);
        found.extend(self.payout_moved_once().await?);
        found.extend(self.event_per_outcome().await?);
        found.extend(self.hold_resolved_once().await?);
        found.extend(self.refunds_within_payment().await?);
        found.extend(self.available_non_negative().await?);
        Ok(found)
    }

    /// [`Rule::EventPerOutcome`].
    async fn event_per_outcome(&self) -> Result<Vec<Violation>, LedgerError> {
        type Row = (Option<AccountId>, Option<AccountId>, TicketId, String, i64);
        let rows: Vec<Row> = sqlx::query_as(AssertSqlSafe(EVENTS.as_str()))
            .fetch_all(self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(stray_on, committed_on, ticket, kind, events)| {
                let (account, detail) = match (committed_on, stray_on, events) {
                    (Some(account), _, 0) => (
                        account,
                        format!("the outcome was committed but no {kind} event was"),
                    ),
                    (None, Some(account), _) => (
                        account,
                        format!("{events} {kind} event(s) for no such outcome"),
                    ),
                    (Some(account), Some(other), _) => (
                        account,
                        format!("a {kind} event of this outcome is on account {}", other.0),
                    ),
                    (Some(account), None, n) => {
                        (account, format!("{n} {kind} events for one outcome"))
                    }
                    (None, None, _) => return None,
                };
                Some(violation(
                    Rule::EventPerOutcome,
                    account,
                    Some(ticket),
                    detail,
                ))
            })
            .chain(self.deliveries_without_event().await?)
            .collect())
    }

    /// [`Rule::EventPerOutcome`]'s other half: what a delivery sends exists.
    async fn deliveries_without_event(&self) -> Result<Vec<Violation>, LedgerError> {
        let rows: Vec<(AccountId, TicketId, i64)> =
            sqlx::query_as(AssertSqlSafe(DELIVERIES_WITHOUT_EVENT.as_str()))
                .fetch_all(self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .map(|(account, event, delivery)| {
                violation(
                    Rule::EventPerOutcome,
                    account,
                    Some(event),
                    format!("delivery {delivery} sends an event that is nowhere"),
                )
            })
            .collect())
    }

    /// [`Rule::NonNegative`].
    async fn non_negative(&self) -> Result<Vec<Violation>, LedgerError> {
        let rows: Vec<(AccountId, i64, i64)> =
            sqlx::query_as(NEGATIVE).fetch_all(self.pool).await?;
        Ok(rows
            .into_iter()
            .map(|(account, balance, points)| {
                violation(
                    Rule::NonNegative,
                    account,
                    None,
                    format!("balance {balance}, points {points}"),
                )
            })
            .collect())
    }

    /// [`Rule::BalanceMatchesEntries`].
    async fn balance_matches_entries(&self) -> Result<Vec<Violation>, LedgerError> {
        let rows: Vec<(AccountId, i64, i64, i64, i64)> =
            sqlx::query_as(SUMS).fetch_all(self.pool).await?;
        Ok(rows
            .into_iter()
            .map(|(account, balance, points, sum_amount, sum_points)| {
                violation(
                    Rule::BalanceMatchesEntries,
                    account,
                    None,
                    format!(
                        "balance {balance} but entries sum to {sum_amount}; points {points} but entries sum to {sum_points}"
                    ),
                )
            })
            .collect())
    }

    /// [`Rule::RunningTotals`], and [`Rule::FencingTokenOnlyGrows`] along an account's
    /// entries: one walk along each account's entries checks both, entry by entry.
    async fn running_totals_and_token_order(&self) -> Result<Vec<Violation>, LedgerError> {
        type Running = (
            i64,
            AccountId,
            Option<TicketId>,
            i64,
            i64,
            i64,
            i64,
            i64,
            Option<i64>,
        );
        let rows: Vec<Running> = sqlx::query_as(RUNNING).fetch_all(self.pool).await?;
        let mut found = Vec::new();
        for (
            entry,
            account,
            ticket,
            balance_after,
            points_after,
            running_balance,
            running_points,
            token,
            previous,
        ) in rows
        {
            if balance_after != running_balance || points_after != running_points {
                found.push(violation(
                    Rule::RunningTotals,
                    account,
                    ticket,
                    format!(
                        "entry {entry}: balance_after {balance_after} (running sum {running_balance}), points_after {points_after} (running sum {running_points})"
                    ),
                ));
            }
            if let Some(previous) = previous.filter(|previous| token < *previous) {
                found.push(violation(
                    Rule::FencingTokenOnlyGrows,
                    account,
                    ticket,
                    format!("entry {entry}: fencing token {token} after {previous}"),
                ));
            }
        }
        Ok(found)
    }

    /// [`Rule::OneEntryPerTicket`].
    async fn one_entry_per_ticket(&self) -> Result<Vec<Violation>, LedgerError> {
        let rows: Vec<(TicketId, AccountId, i64)> = sqlx::query_as(DUPLICATE_ENTRIES)
            .fetch_all(self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(ticket, account, count)| {
                violation(
                    Rule::OneEntryPerTicket,
                    account,
                    Some(ticket),
                    format!("{count} entries"),
                )
            })
            .collect())
    }

    /// [`Rule::OutcomeMatchesEntry`].
    async fn outcome_matches_entry(&self) -> Result<Vec<Violation>, LedgerError> {
        type Pair = (
            TicketId,
            AccountId,
            Option<i32>,
            Option<String>,
            Option<i64>,
            Option<AccountId>,
            Option<String>,
        );
        let rows: Vec<Pair> = sqlx::query_as(AssertSqlSafe(OUTCOME_VS_ENTRY.as_str()))
            .fetch_all(self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(ticket, account, status, operation, entry, entry_account, entry_kind)| {
                    let detail = match entry {
                        None => format!("stored status {status:?} but no entry"),
                        Some(entry) => format!(
                            "stored status {status:?} for {operation:?}, but entry {entry} is {entry_kind:?} on account {entry_account:?}"
                        ),
                    };
                    violation(Rule::OutcomeMatchesEntry, account, Some(ticket), detail)
                },
            )
            .collect())
    }

    /// [`Rule::EntryHasTicket`].
    async fn entry_has_ticket(&self) -> Result<Vec<Violation>, LedgerError> {
        let rows: Vec<(i64, AccountId, TicketId)> =
            sqlx::query_as(ORPHAN_ENTRIES).fetch_all(self.pool).await?;
        Ok(rows
            .into_iter()
            .map(|(entry, account, ticket)| {
                violation(
                    Rule::EntryHasTicket,
                    account,
                    Some(ticket),
                    format!("entry {entry} names a ticket that does not exist"),
                )
            })
            .collect())
    }

    /// [`Rule::FencingTokenOnlyGrows`] between an account and its entries: the token the
    /// account records is at least every one its entries carry.
    async fn account_token_covers_entries(&self) -> Result<Vec<Violation>, LedgerError> {
        let rows: Vec<(AccountId, i64, i64)> =
            sqlx::query_as(ACCOUNT_TOKENS).fetch_all(self.pool).await?;
        Ok(rows
            .into_iter()
            .map(|(account, recorded, highest)| {
                violation(
                    Rule::FencingTokenOnlyGrows,
                    account,
                    None,
                    format!("account records token {recorded} but an entry carries {highest}"),
                )
            })
            .collect())
    }

    /// [`Rule::OpeningEntry`]: exactly one opening entry per account, and it is the first.
    async fn opening_entry(&self) -> Result<Vec<Violation>, LedgerError> {
        let counts: Vec<(AccountId, i64)> =
            sqlx::query_as(OPENING_COUNT).fetch_all(self.pool).await?;
        let late: Vec<(i64, AccountId)> =
            sqlx::query_as(OPENING_FIRST).fetch_all(self.pool).await?;
        let miscounted = counts.into_iter().map(|(account, count)| {
            violation(
                Rule::OpeningEntry,
                account,
                None,
                format!("{count} opening entries"),
            )
        });
        let not_first = late.into_iter().map(|(entry, account)| {
            violation(
                Rule::OpeningEntry,
                account,
                None,
                format!("opening entry {entry} is not the account's first"),
            )
        });
        Ok(miscounted.chain(not_first).collect())
    }

    /// [`Rule::EntrySigns`].
    async fn entry_signs(&self) -> Result<Vec<Violation>, LedgerError> {
        let rows: Vec<(i64, AccountId, Option<TicketId>, String, i64, i64)> =
            sqlx::query_as(SIGNS).fetch_all(self.pool).await?;
        Ok(rows
            .into_iter()
            .map(|(entry, account, ticket, kind, amount, points)| {
                violation(
                    Rule::EntrySigns,
                    account,
                    ticket,
                    format!("entry {entry}: {kind} with amount {amount}, points {points}"),
                )
            })
            .collect())
    }

    /// [`Rule::PayoutMovedOnce`].
    async fn payout_moved_once(&self) -> Result<Vec<Violation>, LedgerError> {
        type Moved = (
            PayoutId,
            AccountId,
            TicketId,
            String,
            i64,
            i64,
            i64,
            i64,
            i64,
        );
        let rows: Vec<Moved> = sqlx::query_as(PAYOUTS).fetch_all(self.pool).await?;
        Ok(rows
            .into_iter()
            .map(
                |(payout, account, ticket, status, amount, debits, all_debits, reversals, all_reversals)| {
                    violation(
                        Rule::PayoutMovedOnce,
                        account,
                        Some(ticket),
                        format!(
                            "payout {payout} of {amount}, {status}: {all_debits} debit entries ({debits} matching), {all_reversals} reversals ({reversals} matching)"
                        ),
                    )
                },
            )
            .collect())
    }

    /// [`Rule::OrderPaidOnce`].
    async fn order_paid_once(&self) -> Result<Vec<Violation>, LedgerError> {
        type Paid = (
            OrderId,
            AccountId,
            Option<TicketId>,
            Option<TicketId>,
            i64,
            Option<i64>,
            i64,
        );
        let rows: Vec<Paid> = sqlx::query_as(ORDERS).fetch_all(self.pool).await?;
        Ok(rows
            .into_iter()
            .map(
                |(order, account, ticket, paid_by, amount, entry_amount, payments)| {
                    let state =
                        paid_by.map_or("open".to_owned(), |paid_by| format!("paid by {paid_by}"));
                    violation(
                        Rule::OrderPaidOnce,
                        account,
                        ticket.or(paid_by),
                        format!(
                            "order {order} of {amount}, {state}: {payments} payment entries (this one's amount {entry_amount:?})"
                        ),
                    )
                },
            )
            .collect())
    }

    /// [`Rule::HoldResolvedOnce`].
    async fn hold_resolved_once(&self) -> Result<Vec<Violation>, LedgerError> {
        type Moved = (
            HoldId,
            AccountId,
            Option<TicketId>,
            String,
            i64,
            Option<i64>,
            i64,
            i64,
        );
        let rows: Vec<Moved> = sqlx::query_as(HOLDS).fetch_all(self.pool).await?;
        let mut found: Vec<Violation> = rows
            .into_iter()
            .map(
                |(hold, account, ticket, state, amount, captured, captures, matching)| {
                    violation(
                        Rule::HoldResolvedOnce,
                        account,
                        ticket,
                        format!(
                            "hold {hold} of {amount}, {state} (captured {captured:?}): {captures} capture entries, {matching} of them its capture's"
                        ),
                    )
                },
            )
            .collect();
        let held: Vec<(AccountId, i64, i64)> = sqlx::query_as(HELD).fetch_all(self.pool).await?;
        found.extend(held.into_iter().map(|(account, held, holds)| {
            violation(
                Rule::HoldResolvedOnce,
                account,
                None,
                format!("held {held}, but its holds still held add up to {holds}"),
            )
        }));
        Ok(found)
    }

    /// [`Rule::RefundsWithinPayment`].
    async fn refunds_within_payment(&self) -> Result<Vec<Violation>, LedgerError> {
        type Refunded = (
            RefundId,
            AccountId,
            TicketId,
            i64,
            Option<AccountId>,
            i64,
            i64,
        );
        let rows: Vec<Refunded> = sqlx::query_as(REFUNDS).fetch_all(self.pool).await?;
        let mut found: Vec<Violation> = rows
            .into_iter()
            .map(|(refund, account, ticket, amount, payer, entries, matching)| {
                let payer = payer.map_or("no payment".to_owned(), |payer| payer.to_string());
                violation(
                    Rule::RefundsWithinPayment,
                    account,
                    Some(ticket),
                    format!(
                        "refund {refund} of {amount}, of a payment by {payer}: {entries} entries, {matching} of them its own"
                    ),
                )
            })
            .collect();
        let orders: Vec<(OrderId, AccountId, i64, i64, i64)> =
            sqlx::query_as(ORDER_REFUNDS).fetch_all(self.pool).await?;
        found.extend(orders.into_iter().map(|(order, account, recorded, total, paid)| {
            violation(
                Rule::RefundsWithinPayment,
                account,
                None,
                format!("order {order} paid {paid}: refunds add up to {total}, it records {recorded}"),
            )
        }));
        let holds: Vec<(HoldId, AccountId, i64, i64, i64)> =
            sqlx::query_as(HOLD_REFUNDS).fetch_all(self.pool).await?;
        found.extend(holds.into_iter().map(|(hold, account, recorded, total, paid)| {
            violation(
                Rule::RefundsWithinPayment,
                account,
                None,
                format!("hold {hold} captured {paid}: refunds add up to {total}, it records {recorded}"),
            )
        }));
        Ok(found)
    }

    /// [`Rule::AvailableNonNegative`], by the database's clock.
    async fn available_non_negative(&self) -> Result<Vec<Violation>, LedgerError> {
        let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(self.pool).await?;
        let rows: Vec<(AccountId, i64, i64)> = sqlx::query_as(AVAILABLE)
            .bind(now)
            .fetch_all(self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(account, balance, held)| {
                violation(
                    Rule::AvailableNonNegative,
                    account,
                    None,
                    format!("balance {balance}, but holds not yet expired set aside {held}"),
                )
            })
            .collect())
    }
}
