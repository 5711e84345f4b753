//! What synchronous replication costs: HTTP withdrawals through one payonce instance whose
//! ledger is the three-node cluster (`scripts/ledger-cluster.sh up`: Patroni, synchronous
//! replication, HAProxy in front), beside the same on one plain PostgreSQL, in alternating
//! rounds.
//!
//! ```text
//! scripts/ledger-cluster.sh up
//! cargo run --release -p api --example cluster_bench -- --seconds 10 --rounds 5
//! ```
//!
//! Each measurement makes a fresh database on its server, starts one payonce server in
//! this process on it (a Redis namespace of its own), opens the accounts through the API,
//! inserts tickets in bulk (the fixture), vacuums, and drives withdrawals of 1 with `wrk`,
//! each with its own ticket. The plain PostgreSQL goes first in odd rounds, the cluster in
//! even ones. Both share the machine's cores with everything else — on the cluster, with
//! two standbys replaying the primary's WAL — so the ratio is what this machine pays for
//! a commit that waits for a standby's flush, one proxy hop, and the standbys' work. On a
//! cluster started with `up --async` the same run leaves the wait out, and the difference
//! between the two ratios is the wait's share. Needs `wrk`.

use clap::Parser;
use ledger::testing::ScratchDatabase;

#[path = "../bench/http.rs"]
mod http;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

#[derive(Parser, Debug)]
// The shared `--database-url`, with the help it has in this comparison.
#[command(mut_arg("database_url", |arg| arg.help("The plain PostgreSQL it is compared with")))]
struct Args {
    /// The cluster's write endpoint (the last line of `scripts/ledger-cluster.sh up`).
    #[arg(
        long,
        env = "PAYONCE_LEDGER_CLUSTER_URL",
        default_value = "postgres://postgres@127.0.0.1:5440/postgres"
    )]
    cluster_url: String,
    #[command(flatten)]
    services: http::Services,
    /// wrk connections.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Rounds (one measurement of each per round); the summary gives medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Accounts the withdrawals spread over.
    #[arg(long, default_value_t = 1000)]
    accounts: usize,
}

#[tokio::main]
async fn main() -> Result<(), http::BoxError> {
    let args = Args::parse();
    println!(
        "cluster bench: connections={} seconds={} rounds={} accounts={}",
        args.connections, args.seconds, args.rounds, args.accounts
    );
    // Said as the cluster says it: `up --async` runs the same cluster without a
    // synchronous standby, for the part of the cost that is not the wait for one.
    let standbys: (String,) = sqlx::query_as("SELECT current_setting('synchronous_standby_names')")
        .fetch_one(
            &PgPoolOptions::new()
                .max_connections(1)
                .connect(&args.cluster_url)
                .await?,
        )
        .await?;
    let cluster_is = if standbys.0.is_empty() {
        "asynchronous cluster"
    } else {
        "synchronous cluster"
    };
    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        let (plain, cluster) = if round % 2 == 1 {
            let plain = measure(&args, &args.services.database_url).await?;
            (plain, measure(&args, &args.cluster_url).await?)
        } else {
            let cluster = measure(&args, &args.cluster_url).await?;
            (measure(&args, &args.services.database_url).await?, cluster)
        };
        println!(
            "round {round}: {cluster_is} {:.0} withdrawals/s (p50 {:.1} ms, p99 {:.1} ms); \
             one PostgreSQL {:.0}/s (p50 {:.1} ms, p99 {:.1} ms); ratio {:.2}",
            cluster.per_sec,
            cluster.p50_ms,
            cluster.p99_ms,
            plain.per_sec,
            plain.p50_ms,
            plain.p99_ms,
            cluster.per_sec / plain.per_sec
        );
        rounds.push((plain, cluster));
    }
    let median =
        |pick: &dyn Fn(&(http::Withdrawals, http::Withdrawals)) -> f64| http::median(&rounds, pick);
    println!("summary (medians over {} rounds):", args.rounds);
    println!(
        "  {cluster_is:<20} {:>7.0} withdrawals/s   p50 {:.1} ms   p99 {:.1} ms",
        median(&|(_, cluster)| cluster.per_sec),
        median(&|(_, cluster)| cluster.p50_ms),
        median(&|(_, cluster)| cluster.p99_ms)
    );
    println!(
        "  {:<20} {:>7.0} withdrawals/s   p50 {:.1} ms   p99 {:.1} ms",
        "one PostgreSQL",
        median(&|(plain, _)| plain.per_sec),
        median(&|(plain, _)| plain.p50_ms),
        median(&|(plain, _)| plain.p99_ms)
    );
    println!(
        "  ratio {:.2} (median of the rounds' ratios; no target: what the cluster costs here)",
        median(&|(plain, cluster)| cluster.per_sec / plain.per_sec)
    );
    Ok(())
}

/// One measurement on a fresh database of the server at `admin_url`.
async fn measure(args: &Args, admin_url: &str) -> Result<http::Withdrawals, http::BoxError> {
    let database = ScratchDatabase::create(admin_url, "payonce_bench").await?;
    let measured = measure_on(args, database.url()).await;
    database.drop().await?;
    measured
}

async fn measure_on(args: &Args, url: &str) -> Result<http::Withdrawals, http::BoxError> {
    let namespace = format!("bench-{}", Uuid::new_v4().simple());
    let server = http::Server::start(args.services.config(
        url,
        &namespace,
        &["--db-max-connections", "32"],
    ))
    .await?;
    let accounts = http::open_accounts(&server.address, args.accounts).await?;
    let raw = PgPoolOptions::new().max_connections(2).connect(url).await?;
    // Well past the fastest rate seen on one PostgreSQL here; running out fails the round.
    let tickets = http::issue_tickets(&raw, &accounts, (args.seconds as usize) * 20_000).await?;
    sqlx::query("VACUUM ANALYZE").execute(&raw).await?;
    raw.close().await;
    let measured = http::wrk(
        &server.address,
        &tickets,
        args.connections,
        args.seconds,
        false,
    );
    server.stop().await?;
    measured
}
