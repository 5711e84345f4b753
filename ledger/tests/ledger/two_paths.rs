//! One spend, two paths: on PostgreSQL a spend that goes through is written by the group
//! commit's one statement (`batch.rs`; a hold's step by `hold_batch.rs`'s), everything else
//! by the transaction path in Rust (`apply.rs`, `holding.rs`), and SQLite has only the
//! latter. Here one set of spends — withdrawals that go through, refusals for want of money
//! or points or for a balance that would overflow, stale and equal fencing tokens, replays
//! and a reused ticket, lottery draws; holds placed and refused, captured in part and
//! whole, above the hold, voided, resolved twice, of no such hold, replayed and stale;
//! several accounts with several spends each — runs through each path on a fresh database
//! of its own: the group commit in batches of one, the group commit in batches of many
//! (every account's spends of a round in one batch), PostgreSQL's transaction path alone,
//! and SQLite. The answers and everything stored — entries, balances, fencing tokens,
//! holds, stored statuses and bodies, events, queued deliveries — must be equal, byte for
//! byte, once what legitimately differs between two runs (generated ids, the clock) is
//! named by what it belongs to.

use std::collections::BTreeMap;
use std::time::Duration;

use ledger::holds::{HoldId, HoldLifetime};
use ledger::lottery::{PRIZES, Prize};
use ledger::testing::{TestDatabase, with_prize};
use ledger::webhooks::{EndpointId, EventType, NewEndpoint, Subscription};
use ledger::{
    AccountId, Amount, ApplyRequest, Execution, Ledger, LedgerOptions, NewAccount, Operation,
    OperationResult, PointsToSpend, Renderer, TicketId,
};
use serde_json::Value;
use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Row};
use uuid::Uuid;

use crate::postgres_races::{blocked_or_finished, connect};
use crate::suite::render;

const HOUR: Duration = Duration::from_secs(3600);

/// How many accounts spend (each of the four profiles twice).
const ACCOUNTS: usize = 8;

/// What every run stores: the suite's renderer, whose bodies carry every number the ledger
/// decided.
const AS_RENDERED: &Renderer = &render;

/// The same bodies, but a body rendered with the group commit's stand-in balance
/// (`i64::MIN`, see `stand_ins.rs`) also carries that balance as text, which the group
/// commit's text substitution could not tell from the number: the ledger then settles the
/// spend on its transaction path. Only the stand-in body differs, and it is never stored —
/// what is stored is rendered again with the real numbers, exactly as [`AS_RENDERED`].
const DECLINING_THE_GROUP_COMMIT: &Renderer = &declining_the_group_commit;

fn declining_the_group_commit(execution: &Execution<'_>) -> Value {
    let mut body = render(execution);
    if let OperationResult::Applied {
        balance: i64::MIN, ..
    }
    | OperationResult::HoldChanged {
        balance: i64::MIN, ..
    } = *execution.result
    {
        body["stand_in"] = Value::String(i64::MIN.to_string());
    }
    body
}

/// An account of the scenario: what it opens with, the prize its draws win, and which
/// events its endpoint wants (`None`: it has no endpoint).
struct Profile {
    balance: i64,
    points: i64,
    prize: &'static Prize,
    endpoint: Option<Subscription>,
}

fn profiles() -> Vec<Profile> {
    (0..ACCOUNTS)
        .map(|index| {
            let (balance, points, endpoint) = match index % 4 {
                0 => (1000, 50, Some(Subscription::All)),
                1 => (
                    5000,
                    5000,
                    Some(Subscription::of(Some(vec![
                        EventType::WithdrawalRefused,
                        EventType::LotteryDrawn,
                    ]))),
                ),
                2 => (700, 1000, None),
                // Close enough to the limit for a large deposit to be refused.
                _ => (i64::MAX - 100, 20, Some(Subscription::All)),
            };
            Profile {
                balance,
                points,
                prize: &PRIZES[(index + index / 4) % PRIZES.len()],
                endpoint,
            }
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Withdraw(i64),
    Deposit(i64),
    Draw(i64),
    /// A hold of this amount for an hour, placed by the step's ticket.
    Hold(i64),
    /// A capture of the hold the named ticket placed: that amount, or all of it.
    Capture(&'static str, Option<i64>),
    /// A void of the hold the named ticket placed.
    Void(&'static str),
}

impl Op {
    /// The operation, for `account`'s step with `ticket`: a hold is named by the ticket that
    /// placed it, its id made by the run ([`Ids::holds`]).
    fn operation(self, ids: &Ids, account: usize, ticket: &'static str) -> Operation {
        let hold = |placed_by| ids.holds[&(account, placed_by)];
        match self {
            Self::Withdraw(amount) => Operation::Withdrawal(Amount::new(amount).unwrap()),
            Self::Deposit(amount) => Operation::Deposit(Amount::new(amount).unwrap()),
            Self::Draw(points) => Operation::LotteryDraw(PointsToSpend::new(points).unwrap()),
            Self::Hold(amount) => Operation::Hold {
                hold: hold(ticket),
                amount: Amount::new(amount).unwrap(),
                expires_in: HoldLifetime::new(3600).unwrap(),
            },
            Self::Capture(placed_by, amount) => Operation::Capture {
                hold: hold(placed_by),
                amount: amount.map(|amount| Amount::new(amount).unwrap()),
            },
            Self::Void(placed_by) => Operation::Void {
                hold: hold(placed_by),
            },
        }
    }
}

/// One spend of an account: its ticket (by name; a name used again is the same ticket),
/// what it asks, its fingerprint and its fencing token.
type Step = (&'static str, Op, &'static str, u64);

/// Every account's spends, round by round; in the batched run a round's spends of all
/// accounts go in one batch. Within a round an account's tokens grow, and a refusal is
/// its last spend: the spends after a refusal in one batch settle on the transaction path
/// side by side, in no set order, so only a refusal at the end has one right answer.
/// Holds' steps come one a round: one per account goes in a batch, and the next waits
/// for the one before it. A capture's or a void's token is its hold's lock's.
const ROUNDS: [&[Step]; 15] = [
    &[
        ("t1", Op::Withdraw(300), "w300", 10),
        ("t2", Op::Withdraw(300), "w300", 11),
        // 400 or 100 left for the first and third profiles: refused.
        ("t3", Op::Withdraw(600), "w600", 12),
    ],
    &[
        // A replay: the first answer again, whatever the token.
        ("t1", Op::Withdraw(300), "w300", 20),
        ("t4", Op::Draw(10), "d10", 21),
        ("t5", Op::Deposit(50), "p50", 22),
        // Refused for want of points, but for the second profile.
        ("t6", Op::Draw(1000), "d1000", 23),
    ],
    &[
        // Stale: older than the account's token, then equal to it.
        ("t7", Op::Withdraw(1), "w1", 5),
        ("t8", Op::Withdraw(1), "w1", 23),
        // A used ticket with another request: refused, nothing stored.
        ("t2", Op::Withdraw(5), "w5", 30),
        // A stored refusal (or success) replayed.
        ("t3", Op::Withdraw(600), "w600", 31),
        ("t9", Op::Withdraw(1), "w1", 32),
        // Refused for the fourth profile: its balance would pass the limit.
        ("t10", Op::Deposit(1_000_000_000_000), "p1e12", 33),
    ],
    // Back from the deposit of a trillion, where it went through.
    &[("t11", Op::Withdraw(1_000_000_000_000), "w1e12", 34)],
    &[("h1", Op::Hold(100), "h100", 40)],
    // Refused for want of available money, but for the fourth profile.
    &[("h2", Op::Hold(1_000_000), "h1e6", 41)],
    &[("h3", Op::Hold(10), "h10", 42)],
    &[("c1", Op::Capture("h1", Some(40)), "c40", 1)],
    // Captured already: refused, stored.
    &[("c2", Op::Capture("h1", None), "c", 2)],
    // Above the hold for the fourth profile; no such hold for the others.
    &[("c3", Op::Capture("h2", Some(2_000_000)), "c2e6", 1)],
    &[("v1", Op::Void("h2"), "v", 2)],
    // All of the hold.
    &[("c4", Op::Capture("h3", None), "c", 1)],
    // A replay, whatever the token.
    &[("c1", Op::Capture("h1", Some(40)), "c40", 9)],
    // Stale: the hold's lock gave 2 already.
    &[("c5", Op::Capture("h2", None), "c", 1)],
    // Captured: a void is refused, stored.
    &[("v2", Op::Void("h3"), "v", 2)],
];

/// The blocker's ticket of each round.
const BLOCKER_TICKETS: [&str; ROUNDS.len()] = [
    "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "r10", "r11", "r12", "r13", "r14",
];

/// How a run sends its spends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Drive {
    /// One at a time, in order.
    OneByOne,
    /// A round at once, all of it queued behind a batch held up by a row lock, so that the
    /// group commit's one worker takes the whole round in its next batch.
    InRounds,
}

/// The ids one run made, and the name each goes by in the comparison.
struct Ids {
    accounts: Vec<AccountId>,
    prizes: Vec<&'static Prize>,
    blocker: AccountId,
    tickets: BTreeMap<(usize, &'static str), TicketId>,
    /// The hold each placing would make, by account and the ticket that places it (the
    /// blocker's by [`ACCOUNTS`]).
    holds: BTreeMap<(usize, &'static str), HoldId>,
    names: BTreeMap<Uuid, String>,
}

impl Ids {
    /// `text` with every id this run made replaced by its name: the ids are random, the
    /// bytes around them must be equal.
    fn named(&self, text: &str) -> String {
        self.names.iter().fold(text.to_owned(), |text, (id, name)| {
            text.replace(&id.to_string(), &format!("<{name}>"))
        })
    }

    fn name(&self, id: Uuid) -> String {
        self.names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("unnamed {id}"))
    }
}

async fn set_up(ledger: &Ledger) -> Ids {
    let mut names = BTreeMap::new();
    let mut accounts = Vec::new();
    let mut prizes = Vec::new();
    let mut tickets = BTreeMap::new();
    let mut holds = BTreeMap::new();
    for (index, profile) in profiles().into_iter().enumerate() {
        let new = NewAccount::new("parity", profile.balance, profile.points).unwrap();
        let account = ledger.create_account(&new).await.unwrap().0.id;
        names.insert(account.0, format!("a{index}"));
        if let Some(subscription) = profile.endpoint {
            let endpoint = NewEndpoint {
                id: EndpointId::random(),
                account_id: account,
                url: "http://127.0.0.1:9/hooks".to_owned(),
                subscription,
                secret_sealed: vec![7; 40],
            };
            let id = ledger.create_endpoint(&endpoint).await.unwrap().unwrap().id;
            names.insert(id.0, format!("a{index} endpoint"));
        }
        for round in ROUNDS {
            for &(ticket, op, ..) in round {
                if let std::collections::btree_map::Entry::Vacant(slot) =
                    tickets.entry((index, ticket))
                {
                    let id = ledger.issue_ticket(account, HOUR).await.unwrap().id;
                    names.insert(id.0, format!("a{index}/{ticket}"));
                    slot.insert(id);
                }
                if let Op::Hold(_) = op {
                    let hold = HoldId::random();
                    names.insert(hold.0, format!("a{index}/{ticket} hold"));
                    holds.insert((index, ticket), hold);
                }
            }
        }
        accounts.push(account);
        prizes.push(profile.prize);
    }
    let blocker = ledger
        .create_account(&NewAccount::new("blocker", 0, 0).unwrap())
        .await
        .unwrap()
        .0
        .id;
    names.insert(blocker.0, "blocker".to_owned());
    for (round, name) in BLOCKER_TICKETS.into_iter().enumerate() {
        let id = ledger.issue_ticket(blocker, HOUR).await.unwrap().id;
        names.insert(id.0, format!("blocker/{name}"));
        tickets.insert((ACCOUNTS, name), id);
        if let (_, Op::Hold(_), ..) = blocking_step(round) {
            let hold = HoldId::random();
            names.insert(hold.0, format!("blocker/{name} hold"));
            holds.insert((ACCOUNTS, name), hold);
        }
    }
    Ids {
        accounts,
        prizes,
        blocker,
        tickets,
        holds,
        names,
    }
}

/// One spend, answered: its name and the answer, its ids named.
async fn spend(
    ledger: Ledger,
    ids: &Ids,
    account: usize,
    (ticket, op, fingerprint, token): Step,
    render: &'static Renderer,
) -> (String, String) {
    let (account_id, prize) = if account == ACCOUNTS {
        (ids.blocker, &PRIZES[0])
    } else {
        (ids.accounts[account], ids.prizes[account])
    };
    let request = ApplyRequest {
        ticket_id: ids.tickets[&(account, ticket)],
        account_id,
        operation: op.operation(ids, account, ticket),
        fingerprint,
        fencing_token: token,
    };
    let answer = match with_prize(prize, ledger.apply(request, render)).await {
        Ok(applied) => format!(
            "{} replayed={} {}",
            applied.response.status,
            applied.replayed,
            ids.named(&applied.response.body.to_string())
        ),
        Err(error) => format!("{error:?}"),
    };
    (format!("a{account}/{ticket} token {token}"), answer)
}

/// Every round's step on the blocker account: a deposit of 1, or, where the round's steps
/// are holds', a hold of 1 — whose group commit the round must queue behind.
fn blocking_step(round: usize) -> Step {
    let holds = ROUNDS[round]
        .iter()
        .any(|(_, op, ..)| matches!(op, Op::Hold(_) | Op::Capture(..) | Op::Void(_)));
    let (op, fingerprint) = if holds {
        (Op::Hold(1), "h1")
    } else {
        (Op::Deposit(1), "p1")
    };
    (BLOCKER_TICKETS[round], op, fingerprint, round as u64 + 1)
}

/// Runs every round; the answers, by spend.
async fn run(
    ledger: &Ledger,
    database: &TestDatabase,
    ids: &std::sync::Arc<Ids>,
    drive: Drive,
    render: &'static Renderer,
) -> BTreeMap<String, String> {
    let mut answers = BTreeMap::new();
    for (round, steps) in ROUNDS.into_iter().enumerate() {
        if drive == Drive::OneByOne {
            answers
                .extend([spend(ledger.clone(), ids, ACCOUNTS, blocking_step(round), render).await]);
            for account in 0..ACCOUNTS {
                for &step in steps {
                    answers.extend([spend(ledger.clone(), ids, account, step, render).await]);
                }
            }
            continue;
        }
        // The blocker's batch waits for its account's row, held here; meanwhile the round
        // queues behind it and goes in the worker's next batch, whole.
        let mut holder = connect(database).await;
        let mut monitor = connect(database).await;
        let mut tx = holder.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE")
            .bind(ids.blocker)
            .execute(&mut *tx)
            .await
            .unwrap();
        let blocked = tokio::spawn({
            let (ledger, ids) = (ledger.clone(), std::sync::Arc::clone(ids));
            async move { spend(ledger, &ids, ACCOUNTS, blocking_step(round), render).await }
        });
        assert!(blocked_or_finished(&mut monitor, &blocked).await);
        let spends: Vec<_> = (0..ACCOUNTS)
            .flat_map(|account| steps.iter().map(move |&step| (account, step)))
            .map(|(account, step)| {
                let (ledger, ids) = (ledger.clone(), std::sync::Arc::clone(ids));
                tokio::spawn(async move { spend(ledger, &ids, account, step, render).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        tx.commit().await.unwrap();
        answers.extend([blocked.await.unwrap()]);
        for spend in spends {
            answers.extend([spend.await.unwrap()]);
        }
    }
    answers
}

/// What a run stored, read back raw and then named.
#[derive(Debug, PartialEq, Eq)]
struct Stored {
    /// Account → balance, points, fencing token.
    accounts: BTreeMap<String, (i64, i64, i64)>,
    /// Ticket → how it was used: operation, fingerprint, stored status and body (the
    /// stored text), and whether it was used at all. The time of use is not compared (two
    /// runs never share a clock); what else was written at that time is, below.
    tickets: BTreeMap<String, String>,
    /// Account → its entries in the order written (entry ids come from one sequence across
    /// accounts, and accounts' spends interleave differently from run to run; an
    /// account's own order is what an id says), each written at its ticket's time of use.
    entries: BTreeMap<String, Vec<String>>,
    /// "ticket type" → account and data (the stored text); the event's id is random and
    /// named by its ticket and type, its time compared to its ticket's time of use.
    events: BTreeMap<String, String>,
    /// Queued deliveries: event, endpoint, attempts, whether open, and whether due and
    /// made at the event's time (the outbox id, a sequence, is dropped as entry ids are).
    deliveries: Vec<String>,
    /// Hold → its row: account, ticket, amounts, state, token, how long it was placed
    /// for, and whether placed and resolved at the times of use of the tickets that did.
    holds: BTreeMap<String, String>,
}

/// Rows as read, the same from both databases (times in microseconds since the epoch).
#[derive(Default)]
struct Raw {
    accounts: Vec<(Uuid, i64, i64, i64)>,
    tickets: Vec<TicketRaw>,
    entries: Vec<EntryRaw>,
    events: Vec<(Uuid, Uuid, String, Uuid, String, i64)>,
    outbox: Vec<OutboxRaw>,
    holds: Vec<HoldRaw>,
}

/// A hold's row: id, account, ticket, amount, state, captured, refunded, token, expires
/// at, created at, resolved at, resolved by.
type HoldRaw = (
    Uuid,
    Uuid,
    Uuid,
    i64,
    String,
    Option<i64>,
    i64,
    i64,
    i64,
    i64,
    Option<i64>,
    Option<Uuid>,
);

/// An outbox row: kind, event, endpoint, attempts, whether open, due at, made at.
type OutboxRaw = (String, Option<Uuid>, Option<Uuid>, i64, bool, i64, i64);

struct TicketRaw {
    id: Uuid,
    account: Uuid,
    operation: Option<String>,
    fingerprint: Option<String>,
    status: Option<i64>,
    body: Option<String>,
    completed_at: Option<i64>,
}

struct EntryRaw {
    id: i64,
    account: Uuid,
    ticket: Option<Uuid>,
    line: String,
    created_at: i64,
}

/// Reads every table a spend writes, on `$connection`, with `$micros` turning a time
/// column into microseconds since the epoch (the one thing written differently for the
/// two databases).
macro_rules! read_raw {
    ($connection:expr, $micros:expr) => {{
        let micros: fn(&str) -> String = $micros;
        let connection = &mut $connection;
        let mut raw = Raw::default();
        raw.accounts = sqlx::query_as("SELECT id, balance, points, fencing_token FROM accounts")
            .fetch_all(&mut *connection)
            .await
            .unwrap();
        let tickets = format!(
            "SELECT id, account_id, operation, fingerprint, CAST(response_status AS BIGINT),
                    CAST(response_body AS TEXT), {} FROM tickets",
            micros("completed_at")
        );
        for row in sqlx::query(sqlx::AssertSqlSafe(tickets))
            .fetch_all(&mut *connection)
            .await
            .unwrap()
        {
            raw.tickets.push(TicketRaw {
                id: row.get(0),
                account: row.get(1),
                operation: row.get(2),
                fingerprint: row.get(3),
                status: row.get(4),
                body: row.get(5),
                completed_at: row.get(6),
            });
        }
        let entries = format!(
            "SELECT id, account_id, ticket_id, kind, amount, points, balance_after,
                    points_after, fencing_token, order_id, payout_id, {} FROM entries",
            micros("created_at")
        );
        for row in sqlx::query(sqlx::AssertSqlSafe(entries))
            .fetch_all(&mut *connection)
            .await
            .unwrap()
        {
            let (order, payout): (Option<Uuid>, Option<Uuid>) = (row.get(9), row.get(10));
            raw.entries.push(EntryRaw {
                id: row.get(0),
                account: row.get(1),
                ticket: row.get(2),
                line: format!(
                    "{} amount {} points {} after {}/{} token {} order {order:?} payout {payout:?}",
                    row.get::<String, _>(3),
                    row.get::<i64, _>(4),
                    row.get::<i64, _>(5),
                    row.get::<i64, _>(6),
                    row.get::<i64, _>(7),
                    row.get::<i64, _>(8),
                ),
                created_at: row.get(11),
            });
        }
        let events = format!(
            "SELECT id, account_id, type, ticket_id, data, {} FROM events",
            micros("created_at")
        );
        raw.events = sqlx::query_as(sqlx::AssertSqlSafe(events))
            .fetch_all(&mut *connection)
            .await
            .unwrap();
        let outbox = format!(
            "SELECT kind, event_id, endpoint_id, CAST(attempts AS BIGINT), done_at IS NULL,
                    {}, {} FROM outbox",
            micros("due_at"),
            micros("created_at")
        );
        raw.outbox = sqlx::query_as(sqlx::AssertSqlSafe(outbox))
            .fetch_all(&mut *connection)
            .await
            .unwrap();
        let holds = format!(
            "SELECT id, account_id, ticket_id, amount, state, captured_amount, refunded_amount,
                    fencing_token, {}, {}, {}, resolved_by_ticket FROM holds",
            micros("expires_at"),
            micros("created_at"),
            micros("resolved_at")
        );
        raw.holds = sqlx::query_as(sqlx::AssertSqlSafe(holds))
            .fetch_all(&mut *connection)
            .await
            .unwrap();
        raw
    }};
}

async fn read_stored(ledger: &Ledger, database: &TestDatabase, ids: &Ids) -> Stored {
    let mut raw = if database.url().starts_with("sqlite:") {
        let mut connection = SqliteConnection::connect(database.url()).await.unwrap();
        // SQLite keeps times as microseconds already (`db_types.rs`).
        read_raw!(connection, |column| column.to_owned())
    } else {
        let mut connection = PgConnection::connect(database.url()).await.unwrap();
        read_raw!(connection, |column| format!(
            "CAST(EXTRACT(EPOCH FROM {column}) * 1000000 AS BIGINT)"
        ))
    };
    raw.events.extend(delivered_events(ledger, ids).await);
    named(&raw, ids)
}

/// The events the endpoints' deliveries send that have no row of their own (an outcome's
/// event is its ticket), as the ledger builds them, in the columns of an `events` row.
async fn delivered_events(
    ledger: &Ledger,
    ids: &Ids,
) -> Vec<(Uuid, Uuid, String, Uuid, String, i64)> {
    let mut events = BTreeMap::new();
    for (id, name) in &ids.names {
        if !name.ends_with(" endpoint") {
            continue;
        }
        let endpoint = ledger::webhooks::EndpointId(*id);
        for delivery in ledger.deliveries(endpoint, None, 1000).await.unwrap() {
            let event = delivery.event;
            if event.id.0 != event.ticket_id.0 {
                continue; // a row of its own: read with the `events` table
            }
            let micros = event.created_at.unix_timestamp_nanos() / 1000;
            events.insert(
                event.id.0,
                (
                    event.id.0,
                    event.account_id.0,
                    event.event_type.as_str().to_owned(),
                    event.ticket_id.0,
                    event.data,
                    i64::try_from(micros).unwrap(),
                ),
            );
        }
    }
    events.into_values().collect()
}

/// `raw` with every id named and every time replaced by what it equals.
fn named(raw: &Raw, ids: &Ids) -> Stored {
    let used_at: BTreeMap<Uuid, Option<i64>> = raw
        .tickets
        .iter()
        .map(|ticket| (ticket.id, ticket.completed_at))
        .collect();
    let at_use = |ticket: Uuid, at: i64| {
        if used_at.get(&ticket).copied().flatten() == Some(at) {
            "at its use".to_owned()
        } else {
            "NOT at its use".to_owned()
        }
    };
    let accounts = raw
        .accounts
        .iter()
        .map(|&(id, balance, points, token)| (ids.name(id), (balance, points, token)))
        .collect();
    let tickets = raw
        .tickets
        .iter()
        .map(|ticket| {
            let used = format!(
                "of {} as {:?} {:?} stored {:?} {} used {}",
                ids.name(ticket.account),
                ticket.operation,
                ticket.fingerprint,
                ticket.status,
                ticket
                    .body
                    .as_deref()
                    .map_or_else(|| "no body".to_owned(), |body| ids.named(body)),
                ticket.completed_at.is_some(),
            );
            (ids.name(ticket.id), used)
        })
        .collect();
    let mut entries: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    for entry in &raw.entries {
        let line = match entry.ticket {
            Some(ticket) => format!(
                "{} by {}, {}",
                ids.named(&entry.line),
                ids.name(ticket),
                at_use(ticket, entry.created_at)
            ),
            None => ids.named(&entry.line),
        };
        entries
            .entry(ids.name(entry.account))
            .or_default()
            .push((entry.id, line));
    }
    let entries = entries
        .into_iter()
        .map(|(account, mut lines)| {
            lines.sort();
            (account, lines.into_iter().map(|(_, line)| line).collect())
        })
        .collect();
    let mut event_names = BTreeMap::new();
    let mut event_times = BTreeMap::new();
    let events = raw
        .events
        .iter()
        .map(|(id, account, kind, ticket, data, at)| {
            let name = format!("{} {kind}", ids.name(*ticket));
            event_names.insert(*id, name.clone());
            event_times.insert(*id, *at);
            let stored = format!(
                "of {}: {}, {}",
                ids.name(*account),
                ids.named(data),
                at_use(*ticket, *at)
            );
            (name, stored)
        })
        .collect();
    let mut deliveries: Vec<String> = raw
        .outbox
        .iter()
        .map(|(kind, event, endpoint, attempts, open, due_at, created_at)| {
            let event_at = event.and_then(|event| event_times.get(&event).copied());
            format!(
                "{kind} of {:?} to {:?}: attempts {attempts} open {open} due at the event {} made at the event {}",
                event.map(|event| event_names.get(&event).cloned()),
                endpoint.map(|endpoint| ids.name(endpoint)),
                event_at == Some(*due_at),
                event_at == Some(*created_at),
            )
        })
        .collect();
    deliveries.sort();
    let holds = raw
        .holds
        .iter()
        .map(|hold| {
            let &(id, account, ticket, amount, ref state, captured, refunded, token, ..) = hold;
            let (expires_at, created_at, resolved_at, resolved_by) =
                (hold.8, hold.9, hold.10, hold.11);
            let resolved = match (resolved_at, resolved_by) {
                (Some(at), Some(by)) => format!("by {}, {}", ids.name(by), at_use(by, at)),
                (at, by) => format!("at {at:?} by {by:?}"),
            };
            let line = format!(
                "of {} by {}: {amount} {state} captured {captured:?} refunded {refunded} token \
                 {token} for {} s, placed {}, resolved {resolved}",
                ids.name(account),
                ids.name(ticket),
                (expires_at - created_at) as f64 / 1e6,
                at_use(ticket, created_at),
            );
            (ids.name(id), line)
        })
        .collect();
    Stored {
        accounts,
        tickets,
        entries,
        events,
        deliveries,
        holds,
    }
}

/// One run on a fresh database: its answers and what it stored.
async fn run_on(
    database: &TestDatabase,
    options: &LedgerOptions,
    drive: Drive,
    render: &'static Renderer,
) -> (Ledger, BTreeMap<String, String>, Stored) {
    database.open().await.unwrap(); // migrated
    let ledger = Ledger::open(database.url(), options).await.unwrap();
    let ids = std::sync::Arc::new(set_up(&ledger).await);
    let answers = run(&ledger, database, &ids, drive, render).await;
    let stored = read_stored(&ledger, database, &ids).await;
    (ledger, answers, stored)
}

fn batch_sizes(ledger: &Ledger) -> Vec<(usize, u64)> {
    ledger
        .batches()
        .map(|batches| batches.counts())
        .unwrap_or_default()
}

/// Asserts that `other` answered and stored exactly what `reference` did, section by
/// section (so that a difference shows where it is).
fn assert_same(
    reference: &(BTreeMap<String, String>, Stored),
    other: &(BTreeMap<String, String>, Stored),
    what: &str,
) {
    assert_eq!(reference.0, other.0, "{what}: the answers");
    let (reference, other) = (&reference.1, &other.1);
    assert_eq!(reference.accounts, other.accounts, "{what}: the accounts");
    assert_eq!(reference.tickets, other.tickets, "{what}: the tickets");
    assert_eq!(reference.entries, other.entries, "{what}: the entries");
    assert_eq!(reference.events, other.events, "{what}: the events");
    assert_eq!(
        reference.deliveries, other.deliveries,
        "{what}: the deliveries"
    );
    assert_eq!(reference.holds, other.holds, "{what}: the holds");
    assert_eq!(reference, other, "{what}");
}

/// The group commit in batches of one, in batches of many, PostgreSQL's transaction path
/// and SQLite's answer and store the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_path_answers_and_stores_the_same() {
    let one_by_one = TestDatabase::postgres().await.unwrap();
    let singles = LedgerOptions {
        batch_max: 1,
        ..LedgerOptions::default()
    };
    let (ledger, answers, stored) =
        run_on(&one_by_one, &singles, Drive::OneByOne, AS_RENDERED).await;
    let sizes = batch_sizes(&ledger);
    assert!(
        !sizes.is_empty() && sizes.iter().all(|&(size, _)| size == 1),
        "{sizes:?}"
    );
    crate::suite::assert_clean(&ledger).await;
    // The scenario reaches every case it names (else equal runs would prove little).
    for case in [
        "201 replayed=false",
        "201 replayed=true",
        "402 replayed=false",
        "402 replayed=true",
        "422 replayed=false",
        "StaleToken",
        "FingerprintMismatch",
        "200 replayed=false",
        "200 replayed=true",
        "409 replayed=false",
        "UnknownHold",
    ] {
        assert!(
            answers.values().any(|answer| answer.starts_with(case)),
            "no answer {case}: {answers:#?}"
        );
    }
    assert!(!stored.events.is_empty() && !stored.deliveries.is_empty());
    for state in ["held", "captured", "voided"] {
        assert!(
            stored
                .holds
                .values()
                .any(|hold| hold.contains(&format!(" {state} "))),
            "no hold {state}: {:#?}",
            stored.holds
        );
    }
    let reference = (answers, stored);

    // One worker, so that a round queued behind the blocked batch goes as one batch.
    let batched = TestDatabase::postgres().await.unwrap();
    let many = LedgerOptions {
        batch_max: 256,
        batch_workers: 1,
        ..LedgerOptions::default()
    };
    let (ledger, answers, stored) = run_on(&batched, &many, Drive::InRounds, AS_RENDERED).await;
    let sizes: BTreeMap<usize, u64> = batch_sizes(&ledger).into_iter().collect();
    // Every round in a batch of its own: as many batches of a round's size as rounds.
    let mut rounds_of_size: BTreeMap<usize, u64> = BTreeMap::new();
    for round in ROUNDS {
        *rounds_of_size.entry(round.len() * ACCOUNTS).or_default() += 1;
    }
    for (size, rounds) in rounds_of_size {
        assert!(
            sizes.get(&size).copied().unwrap_or(0) >= rounds,
            "{rounds} rounds of {size} spends did not go in a batch each: {sizes:?}"
        );
    }
    crate::suite::assert_clean(&ledger).await;
    assert_same(&reference, &(answers, stored), "batches of many");

    let transactions = TestDatabase::postgres().await.unwrap();
    let (ledger, answers, stored) = run_on(
        &transactions,
        &LedgerOptions::default(),
        Drive::OneByOne,
        DECLINING_THE_GROUP_COMMIT,
    )
    .await;
    let sizes = batch_sizes(&ledger);
    assert!(
        sizes.is_empty(),
        "a spend went to the group commit: {sizes:?}"
    );
    crate::suite::assert_clean(&ledger).await;
    assert_same(&reference, &(answers, stored), "the transaction path");

    let sqlite = TestDatabase::sqlite().unwrap();
    let (ledger, answers, stored) = run_on(
        &sqlite,
        &LedgerOptions::default(),
        Drive::OneByOne,
        AS_RENDERED,
    )
    .await;
    crate::suite::assert_clean(&ledger).await;
    assert_same(&reference, &(answers, stored), "SQLite");
}
