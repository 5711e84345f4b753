//! Group commit for holds on PostgreSQL: a hold placed, captured or voided goes through a
//! [`Batcher`](crate::batch::Batcher) of its own, in one statement ([`APPLY_HOLD_STEPS`])
//! with the other steps that arrived together — one round trip and one commit for the lot,
//! as spends have (`batch.rs`). A step the statement does not write (a used ticket, a stale
//! token, a hold not held, money not available, a hold of the account past its expiry)
//! comes back with its ticket as found, and `holding.rs` answers from it or settles it on
//! its transaction path, which stores every refusal.

use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::batch::{Batched, Claim, EarlierWrite, Stored, column, read_answer};
use crate::model::{AccountId, TicketId};
use crate::stand_ins::{
    AVAILABLE_STAND_IN, BALANCE_STAND_IN, EXPIRY_STAND_IN_TEXT, HOLD_AMOUNT_STAND_IN, HoldFill,
    NOW_STAND_IN_TEXT, PLACED_AT_STAND_IN_TEXT, PLACED_BY_STAND_IN_TEXT, filled_hold,
};

/// `$ts` (a TIMESTAMPTZ expression) as the API writes a time: RFC 3339 in UTC, `Z`, with
/// the fraction of a second only as long as it needs (what `time`'s RFC 3339 format gives
/// for the microseconds PostgreSQL keeps; `hold_batch` tests compare the two).
macro_rules! rfc3339 {
    ($ts:literal) => {
        concat!(
            "(to_char(",
            $ts,
            " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') || coalesce('.' || nullif(rtrim(to_char(extract(microseconds FROM ",
            $ts,
            ")::bigint % 1000000, 'FM000000'), '0'), ''), '') || 'Z')"
        )
    };
}

/// A batch of hold steps — placings (`hold`), captures (`hold_capture`) and voids
/// (`hold_void`), at most one per account, ticket and hold — as parallel arrays, in one
/// statement (one implicit transaction). For each it does what `holding.rs`'s transaction
/// does: judges the locked ticket by the database's clock; for a placing, adds the amount
/// to the account's `held` where the money available covers it, under the fencing check of
/// the account's token, and writes the hold; for a capture or a void, resolves the hold
/// while it is held and not expired, under the check of the hold's token, releases it from
/// `held`, and for a capture takes the amount out with its entry; and stores the outcome
/// under the ticket, its event queued as on the transaction path. It writes only the steps
/// that go through.
///
/// - **Locks, in one order**: tickets, then holds, then accounts, each in id order — the
///   order of the transaction path (ticket, hold, account), the sweeper (holds, accounts)
///   and the spends' statement (tickets, accounts). The clock is read once every lock is
///   held, as a capture on the transaction path reads it after its account's lock.
/// - **Looked up by key, whatever the statistics say.** The plan is made once per
///   connection, often while `holds` is small, and kept as it grows: a hold is found one
///   by one through a lateral lookup by id (`OFFSET 0` keeps the planner from making it
///   a join again), always by its primary key, and the accounts by an array of ids, as
///   the spends' statement finds them (by key on all but a small table; see `batch.rs`).
///   As semi-joins, both were planned as scans of the whole table, once per batch.
/// - **Exact `held`.** A step is written only where the account's `held` counts exactly
///   the holds not expired — none of the account's holds is past its expiry by the clock
///   read — so the placing's check against it is exact, and so is the money available
///   the body shows (`balance - held` after). A `held` of 0 in the locked row says so
///   alone: nothing is held. Otherwise it is known from the statement's snapshot only if
///   no hold was placed on the account since it was taken (the account's token, which
///   every placing raises, must be the snapshot's), and then by one range of an index by
///   expiry — `holds_held` (the account's held holds, by expiry since migration 0019) or
///   `holds_expiring`, as the planner picks: either holds there only what the sweeper
///   has yet to record. Anything else goes to the transaction path, which counts the
///   holds.
/// - **The body** arrives rendered with stand-ins (see
///   [`substitutable`](crate::stand_ins::substitutable)) for the balance and the money
///   available after, the clock's reading, and for a capture or a void what only the
///   hold's row knows — its amount, its expiry, when and by which ticket it was placed —
///   replaced by the statement's values, the times formatted as the API formats them
///   ([`rfc3339!`]). Nothing of the hold is read before the statement: one round trip.
///   A hold that is not the account's is not written, and the transaction path says so.
///
/// Parameters: $1 tickets, $2 accounts, $3 kinds, $4 holds, $5 amounts (a placing's; a
/// capture's, 0 for the whole hold; 0 for a void), $6 a placing's lifetime in seconds (0
/// else), $7 fencing tokens (the account's lock's for a placing, the hold's else), $8
/// fingerprints, $9 bodies, $10 statuses, $11 events (NULL: none), $12–$18 the stand-ins
/// of the balance, the money available, the hold's amount, the clock's reading, the
/// expiry, the time of the placing and its ticket. Returns, in the order given, what
/// [`done`](crate::batch) reads: `applied`; the values filled in (`balance_after`,
/// `available_after`, `shown_amount`, `now_text`, `expiry_text`, `placed_at_text`,
/// `placed_by_text`); the ticket's columns as found when not written; `read_at`; the token
/// recorded where the step's lock writes it (`recorded_token`: the account's for a
/// placing, the hold's else; NULL when not locked); and `queued_deliveries`.
const APPLY_HOLD_STEPS: &str = concat!(
    "
    WITH steps AS (
        SELECT *
        FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::uuid[], $5::bigint[],
                    $6::bigint[], $7::bigint[], $8::text[], $9::text[], $10::integer[],
                    $11::text[])
             WITH ORDINALITY AS s (ticket_id, account_id, kind, hold_id, amount, lifetime,
                                   token, fingerprint, body, status, event_type, slot)
    ), locked_tickets AS (
        SELECT t.id, t.account_id, t.expires_at FROM tickets AS t
        WHERE t.id = ANY ($1::uuid[]) AND t.completed_at IS NULL
        ORDER BY t.id FOR UPDATE
    ), locked_holds AS (
        SELECT h.id, h.account_id, h.ticket_id, h.amount, h.state, h.expires_at,
               h.created_at, h.fencing_token
        FROM (SELECT s.hold_id, s.account_id FROM steps AS s
              JOIN locked_tickets AS t ON t.id = s.ticket_id
              WHERE s.kind <> 'hold'
              ORDER BY s.hold_id) AS wanted,
             -- Only the account's own: another's is no hold of its.
             LATERAL (SELECT h.* FROM holds AS h
                      WHERE h.id = wanted.hold_id AND h.account_id = wanted.account_id
                      OFFSET 0) AS h
        ORDER BY h.id FOR NO KEY UPDATE OF h
    ), locked_accounts AS (
        SELECT a.id, a.balance, a.fencing_token, a.held FROM accounts AS a
        WHERE a.id = ANY (ARRAY (SELECT s.account_id FROM steps AS s
                                 JOIN locked_tickets AS t ON t.id = s.ticket_id
                                 LEFT JOIN locked_holds AS h ON h.id = s.hold_id
                                 WHERE s.kind = 'hold' OR h.id IS NOT NULL))
        ORDER BY a.id FOR NO KEY UPDATE
    ), judged AS (
        SELECT clock_timestamp() AS read_at,
               (SELECT count(DISTINCT ticket_id) = count(*)
                       AND count(DISTINCT account_id) = count(*)
                       AND count(DISTINCT hold_id) = count(*) FROM steps) AS distinct_steps
        FROM (SELECT count(*) FROM locked_tickets) AS tickets_locked,
             (SELECT count(*) FROM locked_holds) AS holds_locked,
             (SELECT count(*) FROM locked_accounts) AS accounts_locked
    ), usable AS (
        SELECT s.ticket_id, s.account_id, s.kind, s.hold_id, s.lifetime, s.token,
               s.fingerprint, s.body, s.status, s.event_type, s.slot,
               -- What the step takes out (a capture) or sets aside (a placing).
               CASE WHEN s.kind = 'hold_capture' AND s.amount = 0 THEN h.amount
                    ELSE s.amount END AS amount,
               a.balance, a.held, a.fencing_token AS account_token,
               h.amount AS hold_amount, h.expires_at AS hold_expires_at,
               h.created_at AS placed_at, h.ticket_id AS placed_by, j.read_at
        FROM steps AS s
             JOIN locked_tickets AS t ON t.id = s.ticket_id
             JOIN locked_accounts AS a ON a.id = s.account_id
             LEFT JOIN locked_holds AS h ON h.id = s.hold_id AND h.account_id = s.account_id
             CROSS JOIN judged AS j
        WHERE j.distinct_steps AND t.account_id = s.account_id AND t.expires_at > j.read_at
          -- `held` exact: nothing held at all, or no placing since the snapshot (its
          -- version of the account has the same token) and none of the account's holds
          -- past its expiry. Inside the OR, each lookup is made for its step alone, by key.
          AND (a.held = 0
               OR (EXISTS (SELECT FROM accounts AS seen
                           WHERE seen.id = s.account_id AND seen.fencing_token = a.fencing_token)
                   AND NOT EXISTS (SELECT FROM holds AS x
                                   WHERE x.account_id = s.account_id AND x.state = 'held'
                                     AND x.expires_at <= j.read_at)))
          AND CASE WHEN s.kind = 'hold'
                   THEN s.token > a.fencing_token AND a.balance - s.amount >= a.held
                   ELSE h.state = 'held' AND h.expires_at > j.read_at
                        AND s.token > h.fencing_token AND s.amount <= h.amount
                        AND h.amount <= a.balance AND h.amount <= a.held
              END
    ), moved AS (
        UPDATE accounts AS a
        SET balance = a.balance - CASE WHEN u.kind = 'hold_capture' THEN u.amount ELSE 0 END,
            held = a.held + CASE WHEN u.kind = 'hold' THEN u.amount ELSE -u.hold_amount END,
            fencing_token = CASE WHEN u.kind = 'hold' THEN u.token ELSE a.fencing_token END
        FROM usable AS u
        WHERE a.id = u.account_id AND a.balance = u.balance AND a.held = u.held
          AND a.fencing_token = u.account_token
        RETURNING a.id, a.balance, a.points, a.held
    ), written AS (
        SELECT u.*, m.balance AS balance_after, m.points AS points_after,
               m.balance - m.held AS available_after,
               CASE WHEN u.kind = 'hold' THEN u.read_at + u.lifetime * interval '1 second'
                    ELSE u.hold_expires_at END AS expiry
        FROM usable AS u JOIN moved AS m ON m.id = u.account_id
    ), placed AS (
        INSERT INTO holds (id, account_id, ticket_id, amount, expires_at, created_at)
        SELECT w.hold_id, w.account_id, w.ticket_id, w.amount, w.expiry, w.read_at
        FROM written AS w WHERE w.kind = 'hold'
    ), resolved AS (
        UPDATE holds AS h
        SET state = CASE WHEN w.kind = 'hold_capture' THEN 'captured' ELSE 'voided' END,
            captured_amount = CASE WHEN w.kind = 'hold_capture' THEN w.amount END,
            resolved_at = w.read_at, resolved_by_ticket = w.ticket_id, fencing_token = w.token
        FROM written AS w
        WHERE h.id = w.hold_id AND w.kind <> 'hold'
    ), entries_written AS (
        INSERT INTO entries (account_id, ticket_id, kind, amount, points, balance_after,
                             points_after, fencing_token, created_at, hold_id)
        SELECT w.account_id, w.ticket_id, 'hold_capture', -w.amount, 0, w.balance_after,
               w.points_after, w.token, w.read_at, w.hold_id
        FROM written AS w WHERE w.kind = 'hold_capture'
    ), rendered AS (
        SELECT w.*, coalesce(w.hold_amount, w.amount) AS shown_amount,
               coalesce(w.placed_by, w.ticket_id)::text AS placed_by_text, ",
    rfc3339!("w.read_at"),
    " AS now_text, ",
    rfc3339!("w.expiry"),
    " AS expiry_text, ",
    rfc3339!("coalesce(w.placed_at, w.read_at)"),
    " AS placed_at_text
        FROM written AS w
    ), completed AS (
        UPDATE tickets AS t
        SET operation = r.kind, fingerprint = r.fingerprint, response_status = r.status,
            response_body = replace(replace(replace(replace(replace(replace(replace(r.body,
                                $12, r.balance_after::text), $13, r.available_after::text),
                                $14, r.shown_amount::text), $15, r.now_text),
                                $16, r.expiry_text), $17, r.placed_at_text),
                                $18, r.placed_by_text)::json,
            completed_at = r.read_at
        FROM rendered AS r
        WHERE t.id = r.ticket_id
        RETURNING t.id, r.balance_after, r.available_after, r.shown_amount, r.now_text,
                  r.expiry_text, r.placed_at_text, r.placed_by_text
    ), ",
    crate::batch::queue_written_events!(),
    "
    SELECT c.id IS NOT NULL AS applied, c.balance_after, c.available_after, c.shown_amount,
           c.now_text, c.expiry_text, c.placed_at_text, c.placed_by_text,
           f.id, f.account_id, f.created_at, f.expires_at, f.operation, f.fingerprint,
           f.response_status, f.response_body, f.completed_at,
           j.read_at,
           CASE WHEN s.kind = 'hold' THEN la.fencing_token ELSE lh.fencing_token END
               AS recorded_token,
           EXISTS (SELECT FROM deliveries_queued) AS queued_deliveries
    FROM steps AS s
         LEFT JOIN completed AS c ON c.id = s.ticket_id
         LEFT JOIN LATERAL (SELECT f.* FROM tickets AS f
                            WHERE f.id = s.ticket_id AND f.account_id = s.account_id
                              AND c.id IS NULL OFFSET 0) AS f ON true
         LEFT JOIN locked_accounts AS la ON la.id = s.account_id
         LEFT JOIN locked_holds AS lh ON lh.id = s.hold_id
         CROSS JOIN judged AS j
    ORDER BY s.slot"
);

/// Of hold steps an earlier try of their batch may have written, those it did: the hold
/// placed by the step's ticket, or resolved by it. Parameters: $1 tickets, $2 holds.
const EARLIER_HOLD_STEPS: &str = "
    SELECT t.id, t.response_body
    FROM unnest($1::uuid[], $2::uuid[]) AS s (ticket_id, hold_id)
         JOIN holds AS h ON h.id = s.hold_id
                        AND (h.ticket_id = s.ticket_id OR h.resolved_by_ticket = s.ticket_id)
         JOIN tickets AS t ON t.id = s.ticket_id";

/// One step as [`APPLY_HOLD_STEPS`] takes it.
#[derive(Debug)]
pub(crate) struct HoldStep {
    /// Its kind is `hold`, `hold_capture` or `hold_void`.
    pub stored: Stored,
    pub hold_id: uuid::Uuid,
    /// The hold's amount for a placing; the amount captured for a capture, 0 for the whole
    /// hold; 0 for a void.
    pub amount: i64,
    /// A placing's lifetime, in seconds; 0 else.
    pub lifetime: i64,
    pub token: i64,
}

impl Batched for HoldStep {
    fn account(&self) -> AccountId {
        self.stored.account_id
    }

    fn ticket(&self) -> TicketId {
        self.stored.ticket_id
    }

    fn token(&self) -> i64 {
        self.token
    }

    fn claims(&self) -> impl Iterator<Item = Claim> {
        [
            Claim::Account(self.stored.account_id),
            Claim::Ticket(self.stored.ticket_id),
            Claim::Hold(self.hold_id),
        ]
        .into_iter()
    }

    async fn execute(
        batch: &[&Self],
        connection: &mut sqlx::PgConnection,
    ) -> (Vec<PgRow>, Option<sqlx::Error>) {
        let query = sqlx::query(APPLY_HOLD_STEPS)
            .bind(column(batch, |step| step.stored.ticket_id.0))
            .bind(column(batch, |step| step.stored.account_id.0))
            .bind(column(batch, |step| step.stored.kind))
            .bind(column(batch, |step| step.hold_id))
            .bind(column(batch, |step| step.amount))
            .bind(column(batch, |step| step.lifetime))
            .bind(column(batch, |step| step.token))
            .bind(column(batch, |step| step.stored.fingerprint.as_str()))
            .bind(column(batch, |step| step.stored.body.as_str()))
            .bind(column(batch, |step| i32::from(step.stored.status)))
            .bind(column(batch, |step| step.stored.event))
            .bind(BALANCE_STAND_IN.to_string())
            .bind(AVAILABLE_STAND_IN.to_string())
            .bind(HOLD_AMOUNT_STAND_IN.to_string())
            .bind(NOW_STAND_IN_TEXT)
            .bind(EXPIRY_STAND_IN_TEXT)
            .bind(PLACED_AT_STAND_IN_TEXT)
            .bind(PLACED_BY_STAND_IN_TEXT);
        read_answer(query, batch.len(), connection).await
    }

    fn written_body(&self, row: &PgRow) -> Result<String, sqlx::Error> {
        let fill = HoldFill {
            balance: row.try_get("balance_after")?,
            available: row.try_get("available_after")?,
            hold_amount: row.try_get("shown_amount")?,
            now: row.try_get("now_text")?,
            expiry: row.try_get("expiry_text")?,
            placed_at: row.try_get("placed_at_text")?,
            placed_by: row.try_get("placed_by_text")?,
        };
        Ok(filled_hold(&self.stored.body, &fill))
    }

    async fn earlier_writes(
        connection: &mut sqlx::PgConnection,
        items: &[&Self],
    ) -> Result<Vec<EarlierWrite>, sqlx::Error> {
        sqlx::query_as(EARLIER_HOLD_STEPS)
            .bind(column(items, |step| step.stored.ticket_id.0))
            .bind(column(items, |step| step.hold_id))
            .fetch_all(connection)
            .await
    }
}

#[cfg(test)]
mod tests {
    use sqlx::postgres::PgPoolOptions;
    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;

    use crate::db_types::Timestamp;

    /// The statement's times are the API's: for every number of trailing zeros in the
    /// microseconds, the database's text is what `time` writes for the value it reads.
    #[tokio::test]
    async fn the_statements_times_are_written_as_the_api_writes_them() {
        let Ok(url) = std::env::var("DATABASE_URL") else {
            panic!("DATABASE_URL must name the test database");
        };
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .unwrap();
        let moments = [
            "2026-11-28 15:30:00+00",
            "2026-11-28 15:30:00.5+00",
            "2026-11-28 15:30:00.05+00",
            "2026-11-28 15:30:00.123456+00",
            "2026-11-28 15:30:00.120000+00",
            "2026-11-28 15:30:00.000001+00",
            "1999-01-02 03:04:05.6789+05:30",
            "2030-12-31 23:59:59.999999-08",
        ];
        for moment in moments {
            let (value, text): (Timestamp, String) = sqlx::query_as(concat!(
                "SELECT t, ",
                rfc3339!("t"),
                " FROM (SELECT $1::timestamptz AS t) AS m"
            ))
            .bind(moment)
            .fetch_one(&pool)
            .await
            .unwrap();
            let expected: OffsetDateTime = value.0;
            assert_eq!(text, expected.format(&Rfc3339).unwrap(), "{moment}");
        }
    }
}
