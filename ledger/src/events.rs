//! Webhooks in the database (the model is `webhooks.rs`): an event queued for its
//! endpoints inside the transaction of the outcome it announces — a spend's outcome is its
//! own event (the ticket, read back when a delivery is sent), a payout's settlement is
//! written as an `events` row; the endpoints' creation, rotation and deletion; and the
//! outbox's steps for deliveries — claim due ones for a lease, record each attempt's
//! answer and what comes of it, send one again by hand.
//!
//! Deliveries are outbox jobs of kind `webhook`, so they share the payouts' guarantees: a
//! job exists exactly when its event committed, a claim counts the attempt, and a worker
//! records only at the attempt it claimed (a worker whose lease ran out while its receiver
//! dawdled records nothing once another claimed the delivery again).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::{ColumnIndex, Decode, Encode, Executor, FromRow, Row, Type};

use crate::bells::JobKind;
use crate::claims::{Claim, Claimed};
use crate::db_types::{Timestamp, from_row};
use crate::dialect::{Dialect, placeholders, value_rows};
use crate::error::{LedgerError, commit_or_unknown};
use crate::model::{AccountId, ApplyRequest, OutcomeKind, TicketId};
use crate::requests::{Answer, KeptKey, RequestRow};
use crate::sql_store::SqlStore;
use crate::webhooks::{
    Attempt, AttemptAnswer, Delivery, DeliveryJob, DeliveryOutcome, DeliveryStatus, Endpoint,
    EndpointId, Event, EventId, EventType, NewEndpoint, RetryRefused, Subscription, WebhookBacklog,
    event_of_outcome, outcome_data,
};

/// A request sent with an idempotency key, as the ledger keeps it: its key, and how to
/// make the answer it keeps from what it did (the endpoint it made or rotated; nothing
/// for a retry by hand).
pub(crate) struct Keeping<'a> {
    pub key: KeptKey<'a>,
    pub answer: &'a (dyn Fn(Option<&Endpoint>) -> Answer + Send + Sync),
}

macro_rules! endpoint_columns {
    () => {
        "id, account_id, url, event_types, secret_sealed, previous_secret_sealed,
         previous_secret_until, disabled_at, disabled_reason, created_at"
    };
}

const ENDPOINT: &str = concat!(
    "SELECT ",
    endpoint_columns!(),
    " FROM webhook_endpoints WHERE id = $1 AND deleted_at IS NULL"
);

const ENDPOINTS_OF: &str = concat!(
    "SELECT ",
    endpoint_columns!(),
    " FROM webhook_endpoints WHERE account_id = $1 AND deleted_at IS NULL
      ORDER BY created_at, id"
);

const COUNT_ENDPOINTS: &str = "
    SELECT CAST(COUNT(*) AS BIGINT) FROM webhook_endpoints
    WHERE account_id = $1 AND deleted_at IS NULL";

/// Parameters: $1 id, $2 account, $3 url, $4 types, $5 sealed secret, $6 now.
const INSERT_ENDPOINT: &str = "
    INSERT INTO webhook_endpoints (id, account_id, url, event_types, secret_sealed, created_at)
    VALUES ($1, $2, $3, $4, $5, $6)";

const SUBSCRIBE: &str = "
    INSERT INTO webhook_subscriptions (account_id, event_type, endpoint_id) VALUES ($1, $2, $3)";

const UNSUBSCRIBE: &str = "DELETE FROM webhook_subscriptions WHERE endpoint_id = $1";

/// Endpoint $1 of account $2: the secret $3 signs from now; the one before signs too until
/// $4. A rotation during a rotation drops the oldest.
const ROTATE: &str = concat!(
    "UPDATE webhook_endpoints
     SET previous_secret_sealed = secret_sealed, previous_secret_until = $4, secret_sealed = $3
     WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL
     RETURNING ",
    endpoint_columns!()
);

const DELETE_ENDPOINT: &str = "
    UPDATE webhook_endpoints SET deleted_at = $3
    WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL
    RETURNING id";

const DISABLE_ENDPOINT: &str = "
    UPDATE webhook_endpoints SET disabled_at = $2, disabled_reason = $3
    WHERE id = $1 AND disabled_at IS NULL";

/// Ends delivery $1, claimed at attempt $2, at $3 with outcome $4, unsent: its endpoint no
/// longer gets events. (Left as it is when no longer at that attempt, or ended already.)
const END_DELIVERY: &str = "
    UPDATE outbox SET done_at = $3, outcome = $4, lease_until = NULL
    WHERE id = $1 AND attempts = $2 AND outcome IS NULL";

/// Ends endpoint $1's open deliveries at $2 with outcome $3.
const END_OPEN_DELIVERIES: &str = "
    UPDATE outbox SET done_at = $2, outcome = $3, lease_until = NULL
    WHERE endpoint_id = $1 AND done_at IS NULL";

macro_rules! event_columns {
    ($alias:literal) => {
        concat!(
            $alias,
            ".id AS event_id, ",
            $alias,
            ".account_id, ",
            $alias,
            ".type AS event_type, ",
            $alias,
            ".ticket_id, ",
            $alias,
            ".data, ",
            $alias,
            ".created_at AS event_created_at"
        )
    };
}

/// Records the answers of `count` claimed deliveries at $1 (now): for each, the delivery,
/// the attempt it was claimed at, the outcome it ended with (none: tried again later), when
/// it is due again (none: unchanged) and what went wrong. Returns each delivery recorded,
/// with its attempt; one no longer at the attempt given (claimed again, or ended meanwhile)
/// is left as it is.
///
/// One statement for a batch, not one per delivery: each statement that writes the outbox
/// has its checks made ready anew, and per delivery that was the larger part of what
/// PostgreSQL spent on recording.
///
/// This and the other steps of one claimed delivery find it by key, and tell that it is
/// still open by `outcome IS NULL` — the same thing for a delivery (a constraint says so:
/// `outbox_webhook_done_iff_outcome`) — not by `done_at IS NULL`. That condition would let
/// the planner reach the row through the index of open work, whose predicate it is; and
/// with statistics taken when nearly every delivery was done (a long history; a burst of
/// new ones is not analysed again) it did, walking every open delivery for each one it
/// recorded: with 1,000,000 delivered before, a recording took four times as long.
fn record_answers(count: usize) -> String {
    format!(
        "UPDATE outbox
         SET done_at = CASE WHEN v.column3 IS NULL THEN NULL ELSE $1 END,
             outcome = v.column3,
             due_at = COALESCE(v.column4, outbox.due_at),
             last_error = v.column5,
             lease_until = NULL,
             leased_by = CASE WHEN v.column3 IS NULL THEN NULL ELSE outbox.leased_by END
         FROM (VALUES {}) AS v
         WHERE outbox.id = v.column1 AND outbox.attempts = v.column2
           AND outbox.outcome IS NULL
         RETURNING outbox.id, outbox.attempts",
        value_rows(2, count, 5)
    )
}

/// One claimed delivery's answer as [`RECORD_ANSWERS_AT_ONCE`] takes it.
pub(crate) struct AnswerRow<'a> {
    pub job_id: i64,
    /// The attempt the delivery was claimed at.
    pub attempt: i32,
    /// The outcome it ended with; `None`: tried again `retry_after` from now.
    pub outcome: Option<&'static str>,
    pub retry_after: Option<Duration>,
    pub error: Option<&'a str>,
    pub duration_ms: i64,
    pub status: Option<i32>,
    pub body: Option<&'a str>,
}

/// [`record_answers`] and [`insert_attempts`] in one statement, on PostgreSQL, whose WITH
/// may hold the update: each answer's delivery finished or postponed, then the attempts
/// of those recorded inserted; returns each delivery recorded, with its attempt. The
/// answers come as one array per column ($1 delivery, $2 attempt, $3 outcome, $4 the wait
/// before the next attempt in microseconds, $5 what went wrong, $6 duration in ms, $7 the
/// receiver's status, $8 the start of its answer), so the text is the same for a batch of
/// any size and stays prepared; the clock is read in the statement.
///
/// One statement run on its own, where the two took a transaction of five round trips
/// (BEGIN, the clock, the two, COMMIT): with batches of a few answers those round trips,
/// and a commit for each, were most of what recording cost PostgreSQL.
pub(crate) const RECORD_ANSWERS_AT_ONCE: &str = "
    WITH clock AS (SELECT clock_timestamp() AS now),
    answers AS (
        SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[], $5::text[],
                             $6::bigint[], $7::int[], $8::text[])
            AS a (job_id, attempt, outcome, retry_after_us, error, duration_ms, status, body)
    ),
    recorded AS (
        UPDATE outbox
        SET done_at = CASE WHEN a.outcome IS NULL THEN NULL ELSE clock.now END,
            outcome = a.outcome,
            due_at = COALESCE(clock.now + a.retry_after_us * interval '1 microsecond',
                              outbox.due_at),
            last_error = a.error,
            lease_until = NULL,
            leased_by = CASE WHEN a.outcome IS NULL THEN NULL ELSE outbox.leased_by END
        FROM answers a, clock
        WHERE outbox.id = a.job_id AND outbox.attempts = a.attempt
          AND outbox.outcome IS NULL
        RETURNING outbox.id, outbox.attempts
    )
    INSERT INTO webhook_attempts (job_id, attempt, recorded_at, duration_ms, response_status,
                                  error, response_body)
    SELECT a.job_id, a.attempt, clock.now, a.duration_ms, a.status, a.error, a.body
    FROM answers a JOIN recorded r ON r.id = a.job_id AND r.attempts = a.attempt, clock
    RETURNING job_id, attempt";

/// Gives delivery $1, claimed at attempt $2, back unsent: due at $3, the claim's attempt
/// uncounted.
const HAND_BACK_DELIVERY: &str = "
    UPDATE outbox SET attempts = attempts - 1, due_at = $3, lease_until = NULL, leased_by = NULL
    WHERE id = $1 AND attempts = $2 AND outcome IS NULL";

/// Inserts `count` attempts, recorded at $1 (now): for each, the delivery, the attempt,
/// its duration (ms), the receiver's status, what went wrong and the start of the answer.
fn insert_attempts(count: usize) -> String {
    format!(
        "INSERT INTO webhook_attempts (job_id, attempt, recorded_at, duration_ms,
                                       response_status, error, response_body)
         SELECT v.column1, v.column2, $1, v.column3, v.column4, v.column5, v.column6
         FROM (VALUES {}) AS v",
        value_rows(2, count, 6)
    )
}

/// Up to $3 deliveries of endpoint $1 before delivery $2 (none: from the newest), newest
/// first; their events are read apart ([`events_named`]).
const DELIVERIES: &str = "
    SELECT o.id, o.endpoint_id, o.done_at, o.outcome, o.due_at, o.event_id, o.event_type
    FROM outbox o
    WHERE o.endpoint_id = $1 AND o.kind = 'webhook' AND ($2 IS NULL OR o.id < $2)
    ORDER BY o.id DESC
    LIMIT $3";

const REOPEN_DELIVERY: &str = "
    UPDATE outbox SET done_at = NULL, outcome = NULL, due_at = $2, lease_until = NULL,
                      leased_by = NULL
    WHERE id = $1";

/// A delivery is queued as its event commits, so its creation is its event's.
const BACKLOG: &str = "
    SELECT CAST(COUNT(*) AS BIGINT), MIN(o.created_at)
    FROM outbox o
    WHERE o.kind = 'webhook' AND o.done_at IS NULL";

const KEEP_SEALING_KEY: &str = "
    INSERT INTO sealing_keys (name, key, created_at) VALUES ($1, $2, $3)
    ON CONFLICT (name) DO NOTHING";

/// What an attempt's outcome records: the status the delivery ends with, or the wait
/// before its next attempt.
fn ended_or_after(outcome: &DeliveryOutcome) -> (Option<DeliveryStatus>, Option<Duration>) {
    match outcome {
        DeliveryOutcome::Delivered => (Some(DeliveryStatus::Delivered), None),
        DeliveryOutcome::Exhausted => (Some(DeliveryStatus::Exhausted), None),
        DeliveryOutcome::EndpointGone => (Some(DeliveryStatus::EndpointDisabled), None),
        DeliveryOutcome::Retry { after } => (None, Some(*after)),
    }
}

/// The outcome names stored for a delivery that ended.
fn outcome_name(status: DeliveryStatus) -> Option<&'static str> {
    (status != DeliveryStatus::Pending).then(|| status.as_str())
}

/// An endpoint as read.
pub(crate) struct EndpointRow {
    id: EndpointId,
    account_id: AccountId,
    url: String,
    event_types: String,
    secret_sealed: Vec<u8>,
    previous_secret_sealed: Option<Vec<u8>>,
    previous_secret_until: Option<Timestamp>,
    disabled_at: Option<Timestamp>,
    disabled_reason: Option<String>,
    created_at: Timestamp,
    /// When it was deleted: read by a claim alone (the other reads see live endpoints
    /// only, and leave the column out).
    deleted_at: Option<Timestamp>,
}

impl<'r, R: Row> FromRow<'r, R> for EndpointRow
where
    &'static str: ColumnIndex<R>,
    EndpointId: Decode<'r, R::Database> + Type<R::Database>,
    AccountId: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    Timestamp: Decode<'r, R::Database> + Type<R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            account_id: row.try_get("account_id")?,
            url: row.try_get("url")?,
            event_types: row.try_get("event_types")?,
            secret_sealed: row.try_get("secret_sealed")?,
            previous_secret_sealed: row.try_get("previous_secret_sealed")?,
            previous_secret_until: row.try_get("previous_secret_until")?,
            disabled_at: row.try_get("disabled_at")?,
            disabled_reason: row.try_get("disabled_reason")?,
            created_at: row.try_get("created_at")?,
            deleted_at: match row.try_get("deleted_at") {
                Err(sqlx::Error::ColumnNotFound(_)) => None,
                read => read?,
            },
        })
    }
}

impl TryFrom<EndpointRow> for Endpoint {
    type Error = LedgerError;

    fn try_from(row: EndpointRow) -> Result<Self, LedgerError> {
        let subscription = Subscription::parse_stored(&row.event_types).ok_or_else(|| {
            LedgerError::Corrupt(format!(
                "webhook endpoint {}: event types {:?}",
                row.id, row.event_types
            ))
        })?;
        Ok(Self {
            id: row.id,
            account_id: row.account_id,
            url: row.url,
            subscription,
            secret_sealed: row.secret_sealed,
            previous_secret: row
                .previous_secret_sealed
                .zip(row.previous_secret_until)
                .map(|(sealed, until)| (sealed, until.0)),
            disabled: row
                .disabled_at
                .zip(row.disabled_reason)
                .map(|(at, reason)| (at.0, reason)),
            created_at: row.created_at.0,
        })
    }
}

from_row! {
    /// An event as read (the columns of `event_columns!`).
    pub(crate) struct EventRow {
        event_id: EventId,
        account_id: AccountId,
        event_type: String,
        ticket_id: TicketId,
        data: String,
        event_created_at: Timestamp,
    }
}

impl TryFrom<EventRow> for Event {
    type Error = LedgerError;

    fn try_from(row: EventRow) -> Result<Self, LedgerError> {
        Ok(Self {
            event_type: EventType::parse(&row.event_type).ok_or_else(|| {
                LedgerError::Corrupt(format!("event {}: type {:?}", row.event_id, row.event_type))
            })?,
            id: row.event_id,
            account_id: row.account_id,
            ticket_id: row.ticket_id,
            data: row.data,
            created_at: row.event_created_at.0,
        })
    }
}

from_row! {
    /// A claimed delivery's outbox columns.
    pub(crate) struct ClaimedRow {
        lease_until: Timestamp,
        id: i64,
        event_id: EventId,
        event_type: String,
        endpoint_id: EndpointId,
        attempts: i32,
    }
}

impl crate::claims::Leased for ClaimedRow {
    fn lease_until(&self) -> Timestamp {
        self.lease_until
    }
}

from_row! {
    /// A delivery as listed: its outbox columns, its event named by id and type.
    pub(crate) struct DeliveryRow {
        id: i64,
        endpoint_id: EndpointId,
        done_at: Option<Timestamp>,
        outcome: Option<String>,
        due_at: Timestamp,
        event_id: EventId,
        event_type: String,
    }
}

from_row! {
    /// An announcing ticket as read for its event: the stored outcome, as text.
    pub(crate) struct AnnouncingRow {
        id: TicketId,
        account_id: AccountId,
        response_status: Option<i32>,
        body: Option<String>,
        completed_at: Option<Timestamp>,
    }
}

/// Tickets' stored outcomes by id, for the events they announce: the body as the text
/// stored (PostgreSQL's `json` keeps it as written).
const ANNOUNCING_TICKETS: &str = "
    SELECT id, account_id, response_status, CAST(response_body AS TEXT) AS body, completed_at
    FROM tickets WHERE id IN ";

/// The events `named` (by id, with the type the delivery carries), by id: an outcome's
/// event, whose id is its ticket's and whose data is the ticket's stored outcome, is read
/// from `tickets`; any other — a payout's settlement, any event older than migration 0013
/// — was written as a row of its own in `events`, read for those the tickets did not
/// name. An event found in neither is left out. Tickets first: nearly every event is an
/// outcome's, and a claim of them then reads once.
async fn events_named<D>(
    connection: &mut D::Connection,
    named: &[(EventId, &str)],
) -> Result<HashMap<EventId, Event>, LedgerError>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> EventId: Encode<'q, D> + Type<D>,
    for<'r> EventRow: FromRow<'r, D::Row>,
    for<'r> AnnouncingRow: FromRow<'r, D::Row>,
{
    let mut named: Vec<(EventId, &str)> = named.to_vec();
    named.sort_unstable();
    named.dedup();
    let mut events = HashMap::new();
    if named.is_empty() {
        return Ok(events);
    }
    let select = format!("{ANNOUNCING_TICKETS}({})", placeholders(1, named.len()));
    let mut query = sqlx::query_as::<_, AnnouncingRow>(sqlx::AssertSqlSafe(select));
    for (id, _) in &named {
        query = query.bind(*id);
    }
    let tickets: HashMap<EventId, AnnouncingRow> = query
        .fetch_all(&mut *connection)
        .await?
        .into_iter()
        .map(|row| (EventId(row.id.0), row))
        .collect();
    for &(id, type_name) in &named {
        let Some(ticket) = tickets.get(&id) else {
            continue;
        };
        events.insert(id, outcome_event(id, type_name, ticket)?);
    }
    let rows_of_their_own: Vec<EventId> = named
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| !events.contains_key(id))
        .collect();
    if rows_of_their_own.is_empty() {
        return Ok(events);
    }
    let select = format!(
        "SELECT {} FROM events e WHERE e.id IN ({})",
        event_columns!("e"),
        placeholders(1, rows_of_their_own.len())
    );
    let mut query = sqlx::query_as::<_, EventRow>(sqlx::AssertSqlSafe(select));
    for id in &rows_of_their_own {
        query = query.bind(*id);
    }
    for row in query.fetch_all(&mut *connection).await? {
        let event = Event::try_from(row)?;
        events.insert(event.id, event);
    }
    Ok(events)
}

/// The event `id` of type `type_name` that `ticket`'s stored outcome is.
fn outcome_event(
    id: EventId,
    type_name: &str,
    ticket: &AnnouncingRow,
) -> Result<Event, LedgerError> {
    let corrupt = |what: &str| LedgerError::Corrupt(format!("event {id}: {what}"));
    let event_type =
        EventType::parse(type_name).ok_or_else(|| corrupt(&format!("type {type_name:?}")))?;
    let (Some(status), Some(body), Some(completed_at)) = (
        ticket.response_status,
        ticket.body.as_deref(),
        ticket.completed_at,
    ) else {
        return Err(corrupt("its ticket holds no stored outcome"));
    };
    Ok(Event {
        id,
        account_id: ticket.account_id,
        event_type,
        ticket_id: ticket.id,
        data: outcome_data(
            ticket.account_id,
            ticket.id,
            u16::try_from(status).unwrap_or_default(),
            body,
        ),
        created_at: completed_at.0,
    })
}

from_row! {
    /// An attempt as read.
    pub(crate) struct AttemptRow {
        job_id: i64,
        attempt: i32,
        recorded_at: Timestamp,
        duration_ms: i64,
        response_status: Option<i32>,
        error: Option<String>,
        response_body: Option<String>,
    }
}

impl From<AttemptRow> for Attempt {
    fn from(row: AttemptRow) -> Self {
        Self {
            attempt: u32::try_from(row.attempt).unwrap_or_default(),
            recorded_at: row.recorded_at.0,
            answer: AttemptAnswer {
                duration: Duration::from_millis(u64::try_from(row.duration_ms).unwrap_or(0)),
                status: row.response_status.and_then(|s| u16::try_from(s).ok()),
                error: row.error,
                body: row.response_body,
            },
        }
    }
}

from_row! {
    /// A delivery's state, for a retry by hand.
    pub(crate) struct DeliveryStateRow {
        done_at: Option<Timestamp>,
        lease_until: Option<Timestamp>,
        disabled_at: Option<Timestamp>,
        deleted_at: Option<Timestamp>,
    }
}

/// An event to write as a row of its own (a payout's settlement).
pub(crate) struct NewEvent {
    pub account: AccountId,
    pub ticket: TicketId,
    pub kind: EventType,
    /// The `data` object, as sent.
    pub data: String,
}

/// Writes `events`, committed in `tx` at `now`, and queues each for its account's live
/// endpoints that want it — two statements, however many: `true` when it queued any, so
/// the caller rings the webhook workers once it committed. (A function of its own, not a
/// step of the store: the transactions that settle payouts call it with what else they
/// write.)
pub(crate) async fn record_events<D>(
    tx: &mut sqlx::Transaction<'static, D>,
    events: &[NewEvent],
    now: Timestamp,
) -> Result<bool, sqlx::Error>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> AccountId: Encode<'q, D> + Type<D>,
    for<'q> TicketId: Encode<'q, D> + Type<D>,
    for<'q> EventId: Encode<'q, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Type<D>,
    for<'q> i64: Decode<'q, D> + Type<D>,
    usize: sqlx::ColumnIndex<D::Row>,
{
    if events.is_empty() {
        return Ok(false);
    }
    let ids: Vec<EventId> = events.iter().map(|_| EventId::random()).collect();
    // $1 now; then each event's id, account, type, ticket and data.
    let insert = format!(
        "INSERT INTO events (id, account_id, type, ticket_id, data, created_at)
         SELECT v.column1, v.column2, v.column3, v.column4, v.column5, $1
         FROM (VALUES {}) AS v",
        value_rows(2, events.len(), 5)
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(insert)).bind(now);
    for (id, event) in ids.iter().zip(events) {
        query = query
            .bind(*id)
            .bind(event.account)
            .bind(event.kind.as_str())
            .bind(event.ticket)
            .bind(event.data.as_str());
    }
    query.execute(&mut **tx).await?;
    let announced: Vec<(EventId, AccountId, EventType)> = ids
        .iter()
        .zip(events)
        .map(|(id, event)| (*id, event.account, event.kind))
        .collect();
    queue_deliveries(tx, &announced, now).await
}

/// Queues each event (id, account, type) of `announced` for each endpoint of its account
/// that wants it, in `tx`, due at `now` — one statement, however many. `true` when it
/// queued any.
///
/// The subscriptions are read with the dialect's [`SUBSCRIPTIONS_LOCK`](Dialect::SUBSCRIPTIONS_LOCK),
/// which a delete of them waits for.
async fn queue_deliveries<D>(
    tx: &mut sqlx::Transaction<'static, D>,
    announced: &[(EventId, AccountId, EventType)],
    now: Timestamp,
) -> Result<bool, sqlx::Error>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> AccountId: Encode<'q, D> + Type<D>,
    for<'q> EventId: Encode<'q, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Type<D>,
    for<'q> i64: Decode<'q, D> + Type<D>,
    usize: sqlx::ColumnIndex<D::Row>,
{
    // $1 now; then each event's id, account and type.
    let queue = format!(
        "INSERT INTO outbox (kind, event_id, endpoint_id, event_type, due_at, created_at)
         SELECT 'webhook', v.column1, s.endpoint_id, v.column3, $1, $1
         FROM (VALUES {}) AS v
              JOIN webhook_subscriptions s
                   ON s.account_id = v.column2 AND s.event_type IN (v.column3, '*')
         {}
         RETURNING id",
        value_rows(2, announced.len(), 3),
        D::SUBSCRIPTIONS_LOCK
    );
    let mut query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(queue)).bind(now);
    for (id, account, kind) in announced {
        query = query.bind(*id).bind(*account).bind(kind.as_str());
    }
    Ok(!query.fetch_all(&mut **tx).await?.is_empty())
}

/// Announces, in `tx`, the event a spend's outcome of kind `outcome` announces, if it
/// announces one ([`event_of_outcome`]): what every transaction that stores a spend's
/// outcome does before it commits (the group commit's statement does the same in SQL).
/// The event is the ticket's stored outcome, its id the ticket's: no row is written for
/// it, only its deliveries queued. `true` when it queued deliveries.
pub(crate) async fn announce_outcome<D>(
    tx: &mut sqlx::Transaction<'static, D>,
    request: &ApplyRequest<'_>,
    outcome: OutcomeKind,
    now: Timestamp,
) -> Result<bool, sqlx::Error>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> AccountId: Encode<'q, D> + Type<D>,
    for<'q> TicketId: Encode<'q, D> + Type<D>,
    for<'q> EventId: Encode<'q, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Type<D>,
    for<'q> i64: Decode<'q, D> + Type<D>,
    usize: sqlx::ColumnIndex<D::Row>,
{
    let Some(event) = event_of_outcome(request.operation.kind(), outcome) else {
        return Ok(false);
    };
    let announced = (EventId(request.ticket_id.0), request.account_id, event);
    queue_deliveries(tx, &[announced], now).await
}

/// `text` as a TEXT column of either database takes it: PostgreSQL refuses a NUL
/// character in TEXT (and the whole transaction with it), so each becomes U+FFFD, as the
/// lossy UTF-8 conversion already made of every byte that was no character. A receiver
/// writes what it likes into its answer; what it writes must never make a row unwritable.
pub(crate) fn recordable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        std::borrow::Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// The webhook steps.
impl<D> SqlStore<D>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> i64: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> i32: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Option<i32>: Encode<'q, D>,
    for<'q> Option<Timestamp>: Encode<'q, D>,
    for<'q> Option<i64>: Encode<'q, D>,
    for<'q> String: Decode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> Option<&'q str>: Encode<'q, D>,
    for<'q> Vec<u8>: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> AccountId: Encode<'q, D> + Type<D>,
    for<'q> TicketId: Encode<'q, D> + Type<D>,
    for<'q> EndpointId: Encode<'q, D> + Type<D>,
    for<'q> EventId: Encode<'q, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Decode<'q, D> + Type<D>,
    usize: ColumnIndex<D::Row>,
    for<'r> EndpointRow: FromRow<'r, D::Row>,
    for<'r> EventRow: FromRow<'r, D::Row>,
    for<'r> AnnouncingRow: FromRow<'r, D::Row>,
    for<'r> ClaimedRow: FromRow<'r, D::Row>,
    for<'r> DeliveryRow: FromRow<'r, D::Row>,
    for<'r> AttemptRow: FromRow<'r, D::Row>,
    for<'r> DeliveryStateRow: FromRow<'r, D::Row>,
    for<'r> (Timestamp,): FromRow<'r, D::Row>,
    for<'r> (i64,): FromRow<'r, D::Row>,
    for<'r> (EndpointId,): FromRow<'r, D::Row>,
    for<'r> (Vec<u8>,): FromRow<'r, D::Row>,
    for<'q> Option<Vec<u8>>: Encode<'q, D>,
    for<'q> uuid::Uuid: Encode<'q, D> + Type<D>,
    for<'q> sqlx::types::Json<&'q serde_json::Value>: Encode<'q, D> + Type<D>,
    for<'r> RequestRow: FromRow<'r, D::Row>,
    for<'r> (i64, Option<Timestamp>): FromRow<'r, D::Row>,
{
    /// Creates an endpoint and its subscriptions, unless its account has `max` already
    /// (`None`). Two creates of one account at once may each see room for one more. With
    /// `keeping`, the answer is kept under its key — or, if the key has an answer already,
    /// nothing is done and that record is returned (`Err`).
    pub(crate) async fn insert_endpoint(
        &self,
        new: &NewEndpoint,
        max: usize,
        keeping: Option<&Keeping<'_>>,
    ) -> Result<Result<Option<Endpoint>, RequestRow>, LedgerError> {
        let mut tx = self.begin_write().await?;
        if let Some(found) = Self::kept(&mut tx, keeping).await? {
            return Ok(Err(found));
        }
        let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *tx).await?;
        let (live,): (i64,) = sqlx::query_as(COUNT_ENDPOINTS)
            .bind(new.account_id)
            .fetch_one(&mut *tx)
            .await?;
        if usize::try_from(live).unwrap_or(usize::MAX) >= max {
            return Ok(Ok(None));
        }
        sqlx::query(INSERT_ENDPOINT)
            .bind(new.id)
            .bind(new.account_id)
            .bind(new.url.as_str())
            .bind(new.subscription.stored().as_str())
            .bind(new.secret_sealed.clone())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        for name in new.subscription.names() {
            sqlx::query(SUBSCRIBE)
                .bind(new.account_id)
                .bind(name)
                .bind(new.id)
                .execute(&mut *tx)
                .await?;
        }
        let endpoint = Endpoint {
            id: new.id,
            account_id: new.account_id,
            url: new.url.clone(),
            subscription: new.subscription.clone(),
            secret_sealed: new.secret_sealed.clone(),
            previous_secret: None,
            disabled: None,
            created_at: now.0,
        };
        if let Some(found) = Self::keep(&mut tx, keeping, Some(&endpoint), now).await? {
            return Ok(Err(found));
        }
        commit_or_unknown(tx).await?;
        Ok(Ok(Some(endpoint)))
    }

    /// A live endpoint by id.
    pub(crate) async fn find_endpoint(
        &self,
        id: EndpointId,
    ) -> Result<Option<Endpoint>, LedgerError> {
        let query = || {
            sqlx::query_as::<_, EndpointRow>(ENDPOINT)
                .bind(id)
                .fetch_optional(&self.pool)
        };
        self.on_live_connection(query)
            .await?
            .map(Endpoint::try_from)
            .transpose()
    }

    /// An account's live endpoints, oldest first.
    pub(crate) async fn list_endpoints(
        &self,
        account: AccountId,
    ) -> Result<Vec<Endpoint>, LedgerError> {
        let query = || {
            sqlx::query_as::<_, EndpointRow>(ENDPOINTS_OF)
                .bind(account)
                .fetch_all(&self.pool)
        };
        self.on_live_connection(query)
            .await?
            .into_iter()
            .map(Endpoint::try_from)
            .collect()
    }

    /// Rotates endpoint `id`'s secret: `sealed` signs from now, the one before until
    /// `window` from now. `None` if the account has no such endpoint.
    pub(crate) async fn rotate_endpoint_secret(
        &self,
        account: AccountId,
        id: EndpointId,
        sealed: &[u8],
        window: Duration,
        keeping: Option<&Keeping<'_>>,
    ) -> Result<Result<Option<Endpoint>, RequestRow>, LedgerError> {
        let mut tx = self.begin_write().await?;
        if let Some(found) = Self::kept(&mut tx, keeping).await? {
            return Ok(Err(found));
        }
        let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *tx).await?;
        let row: Option<EndpointRow> = sqlx::query_as(ROTATE)
            .bind(id)
            .bind(account)
            .bind(sealed.to_vec())
            .bind(Timestamp(now.0 + window))
            .fetch_optional(&mut *tx)
            .await?;
        let Some(endpoint) = row.map(Endpoint::try_from).transpose()? else {
            return Ok(Ok(None));
        };
        if let Some(found) = Self::keep(&mut tx, keeping, Some(&endpoint), now).await? {
            return Ok(Err(found));
        }
        commit_or_unknown(tx).await?;
        Ok(Ok(Some(endpoint)))
    }

    /// The answer kept under `keeping`'s key, if any, read in `tx` before the request does
    /// anything: a replay runs nothing.
    async fn kept(
        tx: &mut sqlx::Transaction<'static, D>,
        keeping: Option<&Keeping<'_>>,
    ) -> Result<Option<RequestRow>, LedgerError> {
        match keeping {
            Some(keeping) => keeping.key.find(tx).await,
            None => Ok(None),
        }
    }

    /// Keeps the answer about `endpoint` (none: a retry's) under `keeping`'s key in `tx`:
    /// `None` once kept, or the record another request with the key committed first (then
    /// `tx` must not commit).
    async fn keep(
        tx: &mut sqlx::Transaction<'static, D>,
        keeping: Option<&Keeping<'_>>,
        endpoint: Option<&Endpoint>,
        now: Timestamp,
    ) -> Result<Option<RequestRow>, LedgerError> {
        let Some(keeping) = keeping else {
            return Ok(None);
        };
        let answer = (keeping.answer)(endpoint);
        keeping.key.keep(tx, &answer, now).await
    }

    /// Deletes endpoint `id` of `account`: no more events for it, and its deliveries not
    /// yet made end. `false` if there was no such endpoint.
    pub(crate) async fn delete_endpoint(
        &self,
        account: AccountId,
        id: EndpointId,
    ) -> Result<bool, LedgerError> {
        let mut tx = self.begin_write().await?;
        let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *tx).await?;
        let deleted: Option<(EndpointId,)> = sqlx::query_as(DELETE_ENDPOINT)
            .bind(id)
            .bind(account)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        if deleted.is_none() {
            return Ok(false);
        }
        Self::stop_endpoint(&mut tx, id, DeliveryStatus::EndpointDeleted, now).await?;
        commit_or_unknown(tx).await?;
        Ok(true)
    }

    /// An endpoint gets no more events, and its deliveries not yet made end as `status`.
    async fn stop_endpoint(
        tx: &mut sqlx::Transaction<'static, D>,
        id: EndpointId,
        status: DeliveryStatus,
        now: Timestamp,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(UNSUBSCRIBE).bind(id).execute(&mut **tx).await?;
        sqlx::query(END_OPEN_DELIVERIES)
            .bind(id)
            .bind(now)
            .bind(outcome_name(status))
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Claims up to `max` due deliveries for `worker`, each for `lease` by the database's
    /// clock, with their events and endpoints.
    pub(crate) async fn claim_deliveries(
        &self,
        worker: &str,
        lease: Duration,
        max: i64,
    ) -> Result<Claimed<DeliveryJob>, LedgerError> {
        let Claim {
            rows: claimed,
            lease_until,
        } = match self
            .claim_due::<ClaimedRow>(JobKind::Webhook, D::CLAIM_DELIVERIES, worker, lease, max)
            .await?
            .claim()
        {
            Ok(claim) => claim,
            Err(nothing) => return Ok(nothing),
        };
        let named: Vec<(EventId, &str)> = claimed
            .iter()
            .map(|row| (row.event_id, row.event_type.as_str()))
            .collect();
        // The events and the endpoints side by side, each on a connection of its own.
        let (mut for_events, mut for_endpoints) =
            futures::try_join!(self.pool.acquire(), self.pool.acquire())?;
        let (events, endpoints) = futures::try_join!(
            events_named::<D>(&mut for_events, &named),
            Self::claimed_endpoints(&mut for_endpoints, &claimed)
        )?;
        drop((for_events, for_endpoints));
        let claimed_at = Timestamp(lease_until.0 - lease);
        let live = self.end_stopped(claimed, &endpoints, claimed_at).await?;
        live.into_iter()
            .map(|row| {
                let missing = |what: &str| {
                    LedgerError::Corrupt(format!("delivery {}: its {what} is missing", row.id))
                };
                Ok(DeliveryJob {
                    job_id: row.id,
                    attempt: u32::try_from(row.attempts).unwrap_or_default(),
                    lease_until: lease_until.0,
                    event: events
                        .get(&row.event_id)
                        .cloned()
                        .ok_or_else(|| missing("event"))?,
                    endpoint: endpoints
                        .get(&row.endpoint_id)
                        .map(|(endpoint, _)| endpoint.clone())
                        .ok_or_else(|| missing("endpoint"))?,
                })
            })
            .collect::<Result<_, _>>()
            .map(Claimed::of)
    }

    /// The endpoints of the `claimed` deliveries, by id, each with why it takes no more
    /// deliveries if it does not (deleted, disabled).
    async fn claimed_endpoints(
        connection: &mut D::Connection,
        claimed: &[ClaimedRow],
    ) -> Result<HashMap<EndpointId, (Endpoint, Option<DeliveryStatus>)>, LedgerError> {
        let mut endpoint_ids: Vec<EndpointId> = claimed.iter().map(|row| row.endpoint_id).collect();
        endpoint_ids.sort();
        endpoint_ids.dedup();
        let select = format!(
            "SELECT {}, deleted_at FROM webhook_endpoints WHERE id IN ({})",
            endpoint_columns!(),
            placeholders(1, endpoint_ids.len())
        );
        let mut query = sqlx::query_as::<_, EndpointRow>(sqlx::AssertSqlSafe(select));
        for id in &endpoint_ids {
            query = query.bind(*id);
        }
        let mut endpoints = HashMap::new();
        for row in query.fetch_all(&mut *connection).await? {
            let stopped = if row.deleted_at.is_some() {
                Some(DeliveryStatus::EndpointDeleted)
            } else if row.disabled_at.is_some() {
                Some(DeliveryStatus::EndpointDisabled)
            } else {
                None
            };
            let endpoint = Endpoint::try_from(row)?;
            endpoints.insert(endpoint.id, (endpoint, stopped));
        }
        Ok(endpoints)
    }

    /// The `claimed` deliveries whose endpoint takes them; the others ended, at `at`.
    ///
    /// A delivery whose endpoint was deleted or disabled is not sent: it ends as the
    /// endpoint did. (A delete ends every open delivery it can see, and the spends'
    /// queueing waits for it, so none should be found here; this makes sure of it.)
    async fn end_stopped(
        &self,
        claimed: Vec<ClaimedRow>,
        endpoints: &HashMap<EndpointId, (Endpoint, Option<DeliveryStatus>)>,
        at: Timestamp,
    ) -> Result<Vec<ClaimedRow>, LedgerError> {
        let (stopped, live): (Vec<_>, Vec<_>) = claimed
            .into_iter()
            .partition(|row| matches!(endpoints.get(&row.endpoint_id), Some((_, Some(_)))));
        if stopped.is_empty() {
            return Ok(live);
        }
        let mut tx = self.begin_write().await?;
        for row in stopped {
            let Some((_, Some(status))) = endpoints.get(&row.endpoint_id) else {
                continue;
            };
            sqlx::query(END_DELIVERY)
                .bind(row.id)
                .bind(row.attempts)
                .bind(at)
                .bind(outcome_name(*status))
                .execute(&mut *tx)
                .await?;
        }
        commit_or_unknown(tx).await?;
        Ok(live)
    }

    /// Records each claimed delivery's attempt and what comes of it — each only if it is
    /// still at the attempt it was claimed at (`false` in its place otherwise, nothing
    /// written for it): on PostgreSQL in one statement, elsewhere in one transaction of two.
    /// A receiver gone for good (410) disables its endpoint and ends the endpoint's other
    /// deliveries, in a transaction with the batch's answers (two statements, and more
    /// per endpoint gone).
    pub(crate) async fn record_deliveries(
        &self,
        outcomes: &[(&DeliveryJob, &AttemptAnswer, &DeliveryOutcome)],
    ) -> Result<Vec<bool>, LedgerError> {
        if outcomes.is_empty() {
            return Ok(Vec::new());
        }
        let texts: Vec<_> = outcomes
            .iter()
            .map(|(_, answer, _)| {
                (
                    answer.error.as_deref().map(recordable),
                    answer.body.as_deref().map(recordable),
                )
            })
            .collect();
        let rows: Vec<AnswerRow<'_>> = outcomes
            .iter()
            .zip(&texts)
            .map(|(&(job, answer, outcome), (error, body))| {
                let (ended, retry_after) = ended_or_after(outcome);
                AnswerRow {
                    job_id: job.job_id,
                    attempt: i32::try_from(job.attempt).unwrap_or(i32::MAX),
                    outcome: ended.and_then(outcome_name),
                    retry_after,
                    error: error.as_deref(),
                    duration_ms: i64::try_from(answer.duration.as_millis()).unwrap_or(i64::MAX),
                    status: answer.status.map(i32::from),
                    body: body.as_deref(),
                }
            })
            .collect();
        // A receiver gone for good disables its endpoint in the answers' transaction; any
        // other batch is one statement where the database can say it in one.
        let gone = outcomes
            .iter()
            .any(|(_, _, outcome)| **outcome == DeliveryOutcome::EndpointGone);
        let at_once = if gone {
            None
        } else {
            // Safe to run again when the connection dies under it: an answer the first
            // try did record is then found recorded, and this batch says it was not.
            self.on_live_connection(|| async {
                match D::record_answers_at_once(&self.writer, &rows) {
                    Some(recording) => recording.await.map(Some),
                    None => Ok(None),
                }
            })
            .await?
        };
        let written: HashSet<(i64, i32)> = match at_once {
            Some(written) => written.into_iter().collect(),
            None => self.record_in_transaction(outcomes, &rows).await?,
        };
        // A later attempt was scheduled: this process's dispatcher, asleep, learns when.
        if outcomes
            .iter()
            .any(|(_, _, outcome)| matches!(outcome, DeliveryOutcome::Retry { .. }))
        {
            self.bells.wake_here(JobKind::Webhook);
        }
        Ok(rows
            .iter()
            .map(|row| written.contains(&(row.job_id, row.attempt)))
            .collect())
    }

    /// [`record_deliveries`](Self::record_deliveries) in one transaction of two statements
    /// ([`record_answers`], [`insert_attempts`]) and one more per endpoint gone: the
    /// deliveries recorded, each with its attempt. `rows` are the `outcomes`' answers.
    async fn record_in_transaction(
        &self,
        outcomes: &[(&DeliveryJob, &AttemptAnswer, &DeliveryOutcome)],
        rows: &[AnswerRow<'_>],
    ) -> Result<HashSet<(i64, i32)>, LedgerError> {
        let mut tx = self.begin_write().await?;
        let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *tx).await?;
        let mut query =
            sqlx::query_as::<_, (i64, i32)>(sqlx::AssertSqlSafe(record_answers(rows.len())))
                .bind(now);
        for row in rows {
            query = query
                .bind(row.job_id)
                .bind(row.attempt)
                .bind(row.outcome)
                .bind(row.retry_after.map(|after| Timestamp(now.0 + after)))
                .bind(row.error);
        }
        let written: HashSet<(i64, i32)> = query.fetch_all(&mut *tx).await?.into_iter().collect();
        let answered: Vec<(&AnswerRow<'_>, &DeliveryOutcome, EndpointId)> = rows
            .iter()
            .zip(outcomes)
            .filter(|(row, _)| written.contains(&(row.job_id, row.attempt)))
            .map(|(row, (job, _, outcome))| (row, *outcome, job.endpoint.id))
            .collect();
        if !answered.is_empty() {
            let mut query =
                sqlx::query(sqlx::AssertSqlSafe(insert_attempts(answered.len()))).bind(now);
            for (row, _, _) in &answered {
                query = query
                    .bind(row.job_id)
                    .bind(row.attempt)
                    .bind(row.duration_ms)
                    .bind(row.status)
                    .bind(row.error)
                    .bind(row.body);
            }
            query.execute(&mut *tx).await?;
        }
        // A receiver gone for good takes its endpoint's other deliveries with it — after
        // the batch's own answers: one of them that did arrive is recorded as it was.
        let mut gone: Vec<EndpointId> = answered
            .iter()
            .filter(|(_, outcome, _)| **outcome == DeliveryOutcome::EndpointGone)
            .map(|(_, _, endpoint)| *endpoint)
            .collect();
        gone.sort_unstable();
        gone.dedup();
        for endpoint in gone {
            Self::disable_gone_endpoint(&mut tx, endpoint, now).await?;
        }
        commit_or_unknown(tx).await?;
        Ok(written)
    }

    /// A receiver gone for good (410): its endpoint disabled at `now`, and the endpoint's
    /// other deliveries ended.
    async fn disable_gone_endpoint(
        tx: &mut sqlx::Transaction<'static, D>,
        endpoint: EndpointId,
        now: Timestamp,
    ) -> Result<(), LedgerError> {
        sqlx::query(DISABLE_ENDPOINT)
            .bind(endpoint)
            .bind(now)
            .bind("the receiver answered 410 Gone")
            .execute(&mut **tx)
            .await?;
        Self::stop_endpoint(tx, endpoint, DeliveryStatus::EndpointDisabled, now).await?;
        Ok(())
    }

    /// Gives claimed deliveries back unsent, due `after` from now, as if never claimed:
    /// their attempts do not count toward the schedule. (Each only if still at the attempt
    /// it was claimed at.)
    pub(crate) async fn hand_back_deliveries(
        &self,
        jobs: &[&DeliveryJob],
        after: Duration,
    ) -> Result<(), LedgerError> {
        let mut tx = self.begin_write().await?;
        let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *tx).await?;
        for job in jobs {
            sqlx::query(HAND_BACK_DELIVERY)
                .bind(job.job_id)
                .bind(i32::try_from(job.attempt).unwrap_or(i32::MAX))
                .bind(Timestamp(now.0 + after))
                .execute(&mut *tx)
                .await?;
        }
        commit_or_unknown(tx).await?;
        // Due again soon: this process's dispatcher, asleep, learns when.
        self.bells.wake_here(JobKind::Webhook);
        Ok(())
    }

    /// Up to `limit` deliveries of `endpoint` before `before` (none: from the newest),
    /// newest first, each with its attempts.
    pub(crate) async fn list_deliveries(
        &self,
        endpoint: EndpointId,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<Delivery>, LedgerError> {
        let query = || {
            sqlx::query_as::<_, DeliveryRow>(DELIVERIES)
                .bind(endpoint)
                .bind(before)
                .bind(limit)
                .fetch_all(&self.pool)
        };
        let rows = self.on_live_connection(query).await?;
        let named: Vec<(EventId, &str)> = rows
            .iter()
            .map(|row| (row.event_id, row.event_type.as_str()))
            .collect();
        let mut events = events_named::<D>(&mut *self.pool.acquire().await?, &named).await?;
        let mut attempts: HashMap<i64, Vec<Attempt>> = HashMap::new();
        if !rows.is_empty() {
            let select = format!(
                "SELECT job_id, attempt, recorded_at, duration_ms, response_status, error,
                        response_body
                 FROM webhook_attempts WHERE job_id IN ({}) ORDER BY job_id, attempt",
                placeholders(1, rows.len())
            );
            let query = || {
                let mut query =
                    sqlx::query_as::<_, AttemptRow>(sqlx::AssertSqlSafe(select.clone()));
                for row in &rows {
                    query = query.bind(row.id);
                }
                query.fetch_all(&self.pool)
            };
            for row in self.on_live_connection(query).await? {
                attempts.entry(row.job_id).or_default().push(row.into());
            }
        }
        rows.into_iter()
            .map(|row| {
                let status = match (row.done_at, row.outcome.as_deref()) {
                    (None, _) => DeliveryStatus::Pending,
                    (Some(_), Some(name)) => DeliveryStatus::parse(name).ok_or_else(|| {
                        LedgerError::Corrupt(format!("delivery {}: outcome {name:?}", row.id))
                    })?,
                    (Some(_), None) => {
                        return Err(LedgerError::Corrupt(format!(
                            "delivery {}: done without an outcome",
                            row.id
                        )));
                    }
                };
                Ok(Delivery {
                    id: row.id,
                    endpoint_id: row.endpoint_id,
                    event: events.remove(&row.event_id).ok_or_else(|| {
                        LedgerError::Corrupt(format!("delivery {}: its event is missing", row.id))
                    })?,
                    status,
                    next_attempt_at: (status == DeliveryStatus::Pending).then_some(row.due_at.0),
                    attempts: attempts.remove(&row.id).unwrap_or_default(),
                })
            })
            .collect()
    }

    /// Sends delivery `delivery` of `endpoint` again, now: whether it was delivered, ran
    /// out of attempts or waits for a later one. Refused while a worker holds it, and once
    /// its endpoint gets no more events.
    pub(crate) async fn reopen_delivery(
        &self,
        endpoint: EndpointId,
        delivery: i64,
        keeping: Option<&Keeping<'_>>,
    ) -> Result<Result<Result<(), RetryRefused>, RequestRow>, LedgerError> {
        let mut tx = self.begin_write().await?;
        if let Some(found) = Self::kept(&mut tx, keeping).await? {
            return Ok(Err(found));
        }
        let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *tx).await?;
        let state: Option<DeliveryStateRow> = sqlx::query_as(D::DELIVERY_STATE)
            .bind(delivery)
            .bind(endpoint)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(state) = state else {
            return Ok(Ok(Err(RetryRefused::NotFound)));
        };
        if state.disabled_at.is_some() || state.deleted_at.is_some() {
            return Ok(Ok(Err(RetryRefused::EndpointDisabled)));
        }
        if state.done_at.is_none() && state.lease_until.is_some_and(|until| until > now) {
            return Ok(Ok(Err(RetryRefused::InFlight)));
        }
        sqlx::query(REOPEN_DELIVERY)
            .bind(delivery)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        if let Some(found) = Self::keep(&mut tx, keeping, None, now).await? {
            return Ok(Err(found));
        }
        commit_or_unknown(tx).await?;
        self.bells.ring(JobKind::Webhook);
        Ok(Ok(Ok(())))
    }

    /// How many deliveries are not done, and when the oldest one's event committed.
    pub(crate) async fn webhook_backlog(&self) -> Result<WebhookBacklog, LedgerError> {
        let query = || sqlx::query_as::<_, (i64, Option<Timestamp>)>(BACKLOG).fetch_one(&self.pool);
        let (pending, oldest) = self.on_live_connection(query).await?;
        Ok(WebhookBacklog {
            pending: u64::try_from(pending).unwrap_or_default(),
            oldest_pending: oldest.map(|at| at.0),
        })
    }

    /// The sealing key stored under `name`; `fresh` is stored first if there is none (the
    /// first instance to ask makes it, every other reads the same).
    pub(crate) async fn sealing_key(
        &self,
        name: &str,
        fresh: &[u8],
    ) -> Result<Vec<u8>, LedgerError> {
        let mut tx = self.begin_write().await?;
        let (now,): (Timestamp,) = sqlx::query_as(D::CLOCK).fetch_one(&mut *tx).await?;
        sqlx::query(KEEP_SEALING_KEY)
            .bind(name)
            .bind(fresh.to_vec())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        let (key,): (Vec<u8>,) = sqlx::query_as("SELECT key FROM sealing_keys WHERE name = $1")
            .bind(name)
            .fetch_one(&mut *tx)
            .await?;
        commit_or_unknown(tx).await?;
        Ok(key)
    }
}
