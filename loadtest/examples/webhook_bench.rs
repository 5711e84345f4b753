//! Webhook events delivered per second to a receiver that answers 204 at once, beside the
//! same receiver driven directly by the load generator, in alternating rounds; and the
//! time from an outcome's commit to its event's first arrival, with no faults.
//!
//! ```text
//! cargo run --release -p loadtest --example webhook_bench -- --events 5000 --rounds 5
//! ```
//!
//! - **Delivery**: each round makes a fresh PostgreSQL database, opens `--accounts`
//!   accounts with an endpoint each at the load test's receiver (on loopback; it verifies
//!   every signature with the reference library), and commits `--events` withdrawals
//!   through the ledger while no payonce runs, so their deliveries queue in the outbox.
//!   Then one payonce server starts in this process (PostgreSQL + Redis,
//!   `--concurrency` deliveries in flight); the clock starts at the first delivery and
//!   runs until the receiver has taken every event: payonce's rate of deliveries. The
//!   server then stops and the database is dropped, so that no round's server runs, nor
//!   its database stays, beside the next.
//! - **Baseline**: the same number of signed POSTs, bodies of the same size, sent straight
//!   to a fresh receiver by `--concurrency` client tasks: the receiver's own rate.
//! - **Latency**: then a fresh database and server, and the load test's load (withdrawals,
//!   draws, orders; no payouts) for `--latency-seconds` with a receiver that misbehaves in
//!   no way: each event's time from its commit (its `timestamp`) to its first arrival.
//!
//! - **History** (`--history N`, instead of the two above): the delivery round twice, once
//!   on a database that already holds `N` delivered events (each with its finished
//!   delivery and its attempt, vacuumed, as a database that has run a while holds them)
//!   and once on one that holds none. A claim's cost must not grow with what is finished.
//!   Every delivery round starts just after a `CHECKPOINT`, so that the one the history's
//!   rows set off is not still running through the drain.
//!
//! The two rates alternate in order round by round; the summary gives medians and the
//! median of the per-round ratios.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use api::webhooks::sealing::Sealer;
use api::webhooks::signing;
use clap::Parser;
use ledger::testing::{ScratchDatabase, postgres_admin_url};
use ledger::webhooks::{EndpointId, NewEndpoint, Subscription};
use ledger::{
    AccountId, Amount, ApplyRequest, Execution, Ledger, LedgerOptions, NewAccount, Operation,
};
use loadtest::receiver::{Receiver, ReceiverFaults};
use loadtest::run::{Limit, Mix, RunOptions};

// A server in this process, started and stopped as the API's benchmarks do; it brings the
// allocator the `payonce` binary runs on, for the generator's baseline too.
#[path = "../../api/bench/http.rs"]
mod http;
#[path = "../tests/support/plain_run.rs"]
mod plain_run;

type Fallible<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The sealing key the benchmark's instances share with it (hex, 32 bytes).
const KEY: [u8; 32] = [7; 32];

#[derive(Parser, Debug)]
struct Args {
    /// Events (and baseline requests) per round.
    #[arg(long, default_value_t = 5000)]
    events: usize,
    /// Accounts, each with an endpoint.
    #[arg(long, default_value_t = 50)]
    accounts: usize,
    /// Deliveries in flight (payonce's PAYONCE_WEBHOOK_CONCURRENCY), and the baseline's
    /// client tasks.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// How long the latency phase's load lasts, seconds.
    #[arg(long, default_value_t = 5)]
    latency_seconds: u64,
    /// Rounds; the summary gives medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Compare delivery on a database holding this many delivered events with delivery on
    /// an empty one, instead of payonce with the generator.
    #[arg(long, default_value_t = 0)]
    history: usize,
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
}

fn loopback() -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
}

fn render(execution: &Execution<'_>) -> serde_json::Value {
    serde_json::json!({
        "ticket_id": execution.ticket_id.0,
        "account_id": execution.account_id.0,
        "result": format!("{:?}", execution.result),
    })
}

/// A payonce server on `database` in this process, delivering to loopback; stopped
/// before its round's database is dropped, so that no round's server outlives it.
async fn serve(args: &Args, database: &str, namespace: &str) -> Fallible<http::Server> {
    let concurrency = args.concurrency.to_string();
    let key = hex::encode(KEY);
    let config = http::config(&[
        "--database-url",
        database,
        "--redis-url",
        &args.redis_url,
        "--redis-namespace",
        namespace,
        "--webhook-allow-private",
        "--webhook-key",
        &key,
        "--webhook-concurrency",
        &concurrency,
        "--webhook-poll",
        "100ms",
    ]);
    http::Server::start(config).await
}

/// A fresh PostgreSQL database for one round (`payonce_bench_<random>`), dropped once `run`
/// is done with it, whatever came of it.
async fn on_scratch<T, F: std::future::Future<Output = Fallible<T>>>(
    run: impl FnOnce(String) -> F,
) -> Fallible<T> {
    let database = ScratchDatabase::create(&postgres_admin_url(), "payonce_bench").await?;
    let result = run(database.url().to_owned()).await;
    database.drop().await?;
    result
}

/// `count` withdrawals of `account` announced to `endpoint` a day ago — each a completed
/// ticket (an outcome is its own event) with its finished delivery and its one attempt,
/// written in bulk; then vacuumed and analysed, as autovacuum leaves a database that has
/// run a while.
async fn delivered_history(
    database: &str,
    account: AccountId,
    endpoint: EndpointId,
    count: usize,
) -> Fallible<()> {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(database).await?;
    sqlx::query(
        "WITH written AS (
             INSERT INTO tickets (id, account_id, created_at, expires_at, operation, fingerprint,
                                  response_status, response_body, completed_at)
             SELECT gen_random_uuid(), $1, now() - interval '1 day', now(), 'withdrawal',
                    'history', 201, '{\"amount\":1}', now() - interval '1 day'
             FROM generate_series(1, $3)
             RETURNING id
         ), queued AS (
             INSERT INTO outbox (kind, event_id, endpoint_id, event_type, due_at, created_at,
                                 done_at, outcome, attempts)
             SELECT 'webhook', id, $2, 'withdrawal.succeeded', now() - interval '1 day',
                    now() - interval '1 day', now() - interval '1 day', 'delivered', 1
             FROM written
             RETURNING id
         )
         INSERT INTO webhook_attempts (job_id, attempt, recorded_at, duration_ms, response_status)
         SELECT id, 1, now() - interval '1 day', 2, 204 FROM queued",
    )
    .bind(account.0)
    .bind(endpoint.0)
    .bind(i64::try_from(count)?)
    .execute(&mut connection)
    .await?;
    sqlx::query("VACUUM ANALYZE tickets, outbox, webhook_attempts")
        .execute(&mut connection)
        .await?;
    Ok(())
}

/// A checkpoint of the whole server (`CHECKPOINT`: a superuser's, or `pg_checkpoint`'s).
async fn checkpoint(database: &str) -> Fallible<()> {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(database).await?;
    sqlx::query("CHECKPOINT").execute(&mut connection).await?;
    Ok(())
}

/// Deliveries per second: events committed while no payonce ran, then drained by one;
/// `history` delivered events already in the database.
async fn delivery_round(args: &Args, round: usize, history: usize) -> Fallible<f64> {
    on_scratch(|database| deliver(args, round, history, database)).await
}

/// [`delivery_round`] on `database`.
async fn deliver(args: &Args, round: usize, history: usize, database: String) -> Fallible<f64> {
    let receiver = Receiver::start(loopback(), ReceiverFaults::default()).await?;
    let ledger = Ledger::open(&database, &LedgerOptions::default()).await?;
    let sealer = Sealer::new(&KEY)?;
    let mut accounts: Vec<AccountId> = Vec::new();
    for _ in 0..args.accounts {
        let new = NewAccount::new("bench", 1_000_000_000, 0)?;
        let account = ledger.create_account(&new).await?.0.id;
        let id = EndpointId::random();
        let secret = signing::new_secret();
        let endpoint = NewEndpoint {
            id,
            account_id: account,
            url: receiver.url_for(&account.0.to_string()),
            subscription: Subscription::All,
            secret_sealed: sealer.seal(id.0.as_bytes(), &secret),
        };
        ledger
            .create_endpoint(&endpoint)
            .await?
            .ok_or("the endpoint limit")?;
        receiver.register(&account.0.to_string(), &signing::shown(&secret));
        if history > 0 && accounts.is_empty() {
            delivered_history(&database, account, id, history).await?;
        }
        accounts.push(account);
    }
    // Each account's withdrawals in order (its fencing tokens grow), the accounts side by
    // side.
    let per_account = args.events.div_ceil(args.accounts);
    let committed = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = accounts
        .iter()
        .map(|account| {
            let (ledger, account, committed) = (ledger.clone(), *account, committed.clone());
            let total = args.events;
            tokio::spawn(async move {
                for token in 1..=per_account as u64 {
                    if committed.fetch_add(1, Ordering::Relaxed) >= total {
                        break;
                    }
                    let ticket = ledger
                        .issue_ticket(account, Duration::from_secs(3600))
                        .await?
                        .id;
                    let request = ApplyRequest {
                        ticket_id: ticket,
                        account_id: account,
                        operation: Operation::Withdrawal(Amount::new(1)?),
                        fingerprint: "bench",
                        fencing_token: token,
                    };
                    ledger.apply(request, &render).await?;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    // Every write so far on disk before the clock runs. A million rows of history start a
    // checkpoint that PostgreSQL spreads over the next minutes, through the drain; forced
    // here, it is over, and both runs start just after one.
    checkpoint(&database).await?;
    let namespace = format!("webhook-bench-{round}-{}", std::process::id());
    let server = serve(args, &database, &namespace).await?;
    // The clock starts with the first delivery: the server's start is not delivering.
    let deadline = Instant::now() + Duration::from_secs(300);
    while receiver.taken() == 0 {
        assert!(Instant::now() < deadline, "nothing was delivered");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    let first = receiver.taken();
    loop {
        // A count, not the receipts: copying them under the receiver's lock every few
        // milliseconds would slow the receiver itself.
        let taken = receiver.taken();
        if taken >= args.events {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{taken} of {} delivered",
            args.events
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    server.stop().await?;
    ledger.close().await;
    let receipts = receiver.receipts();
    assert!(
        receipts.iter().all(|receipt| receipt.verified),
        "a signature did not verify"
    );
    Ok((args.events - first) as f64 / elapsed.as_secs_f64())
}

/// The receiver's own rate: signed POSTs of the same size straight from the generator.
async fn direct_round(args: &Args) -> Fallible<f64> {
    let receiver = Receiver::start(loopback(), ReceiverFaults::default()).await?;
    let account = uuid::Uuid::new_v4().to_string();
    let secret = signing::new_secret();
    receiver.register(&account, &signing::shown(&secret));
    let url = receiver.url_for(&account);
    let body = format!(
        r#"{{"type":"withdrawal.succeeded","timestamp":"2026-11-26T15:00:00.000000Z","data":{{"account_id":"{account}","ticket_id":"{}","outcome":{{"status":201,"body":{{"account_id":"{account}","amount":1,"balance":999999999,"ticket_id":"{}"}}}}}}}}"#,
        uuid::Uuid::new_v4(),
        uuid::Uuid::new_v4()
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let (client, url, body, next) =
                (client.clone(), url.clone(), body.clone(), next.clone());
            let total = args.events;
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    let id = uuid::Uuid::new_v4().to_string();
                    let timestamp = time::OffsetDateTime::now_utc().unix_timestamp();
                    let signature =
                        signing::signature_header([&secret[..]], &id, timestamp, body.as_bytes());
                    let response = client
                        .post(&url)
                        .header("webhook-id", &id)
                        .header("webhook-timestamp", timestamp.to_string())
                        .header("webhook-signature", signature)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await?;
                    assert!(response.status().is_success());
                }
                Ok::<_, reqwest::Error>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed();
    assert!(receiver.receipts().iter().all(|receipt| receipt.verified));
    Ok(args.events as f64 / elapsed.as_secs_f64())
}

/// Commit to first arrival under the load test's load, no faults: (p50, p99, events).
async fn latency(args: &Args) -> Fallible<(Option<u64>, Option<u64>, usize, f64)> {
    on_scratch(|database| latency_on(args, database)).await
}

/// [`latency`] on `database`.
async fn latency_on(
    args: &Args,
    database: String,
) -> Fallible<(Option<u64>, Option<u64>, usize, f64)> {
    let namespace = format!("webhook-bench-latency-{}", std::process::id());
    let server = serve(args, &database, &namespace).await?;
    let result = loadtest::run::run(RunOptions {
        duplicate_fraction: 0.1,
        webhooks: Some(ReceiverFaults::default()),
        ..plain_run::plain_run(
            vec![server.address.clone()],
            (20, 16),
            Limit::Duration(Duration::from_secs(args.latency_seconds)),
            Mix {
                withdrawal: 0.45,
                payout: 0.0,
                ..Mix::default()
            },
        )
    })
    .await?;
    server.stop().await?;
    assert!(result.violations.is_empty(), "{:#?}", result.violations);
    let tally = result.webhooks;
    let spends = result.counts.requests as f64 / result.elapsed.as_secs_f64();
    Ok((
        tally.first_arrival_p50_ms,
        tally.first_arrival_p99_ms,
        tally.delivered,
        spends,
    ))
}

/// Delivery with `--history` delivered events beside delivery with none, alternating.
async fn history_rounds(args: &Args) -> Fallible<()> {
    let (mut with, mut without, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let (kept, fresh) = if round % 2 == 0 {
            let kept = delivery_round(args, round, args.history).await?;
            (kept, delivery_round(args, round, 0).await?)
        } else {
            let fresh = delivery_round(args, round, 0).await?;
            (delivery_round(args, round, args.history).await?, fresh)
        };
        println!(
            "round {}: {kept:.0} events/s with {} delivered before, {fresh:.0} events/s with none; ratio {:.2}",
            round + 1,
            args.history,
            kept / fresh
        );
        with.push(kept);
        without.push(fresh);
        ratios.push(kept / fresh);
    }
    let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let high = ratios.iter().copied().fold(0.0, f64::max);
    println!();
    println!("| what | payonce | baseline | ratio (target) |");
    println!("|---|---|---|---|");
    println!(
        "| events delivered per second, {} queued, {} delivered before | {:.0}/s | the same with none before: {:.0}/s | {:.2}, rounds {low:.2}–{high:.2} (≥ 0.9) |",
        args.events,
        args.history,
        median(&mut with),
        median(&mut without),
        median(&mut ratios)
    );
    Ok(())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() -> Fallible<()> {
    // payonce's own warnings, if any (RUST_LOG to see more).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.history > 0 {
        return history_rounds(&args).await;
    }
    let mut payonce = Vec::new();
    let mut direct = Vec::new();
    let mut ratios = Vec::new();
    for round in 0..args.rounds {
        // Alternating order: the machine's speed drifts within a minute.
        let (delivered, baseline) = if round % 2 == 0 {
            let delivered = delivery_round(&args, round, 0).await?;
            (delivered, direct_round(&args).await?)
        } else {
            let baseline = direct_round(&args).await?;
            (delivery_round(&args, round, 0).await?, baseline)
        };
        println!(
            "round {}: payonce delivered {delivered:.0} events/s; the generator straight to the receiver {baseline:.0} requests/s; ratio {:.2}",
            round + 1,
            delivered / baseline
        );
        payonce.push(delivered);
        direct.push(baseline);
        ratios.push(delivered / baseline);
    }
    let (p50, p99, events, spends) = latency(&args).await?;
    let ms = |value: Option<u64>| value.map_or_else(|| "-".to_owned(), |v| v.to_string());
    let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let high = ratios.iter().copied().fold(0.0, f64::max);
    println!();
    println!("| what | payonce | baseline | ratio (target) |");
    println!("|---|---|---|---|");
    println!(
        "| events delivered per second, {} queued, {} in flight | {:.0}/s | the generator straight to the receiver {:.0}/s | {:.2}, rounds {low:.2}–{high:.2} (≥ 0.5) |",
        args.events,
        args.concurrency,
        median(&mut payonce),
        median(&mut direct),
        median(&mut ratios)
    );
    println!(
        "| commit to first arrival, the load test's load ({spends:.0} spend requests/s), {events} events | p50 {} ms, p99 {} ms | | p99 ≤ 100 ms |",
        ms(p50),
        ms(p99)
    );
    Ok(())
}
