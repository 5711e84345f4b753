//! Is the generator the bottleneck? `GET /healthz` through the load test's HTTP client,
//! beside `wrk` with the same number of connections, against the same payonce server, in
//! the same run.
//!
//! ```text
//! cargo build --release -p api
//! cargo run --release -p loadtest --example generator_bench -- --connections 32 --seconds 10 --rounds 3
//! ```
//!
//! Starts `target/release/payonce` (embedded mode, a temporary data directory, a free
//! loopback port), then each round runs wrk and the generator one after the other, in
//! alternating order. Target: the generator reaches at least 0.7× wrk's rate.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clap::Parser;

#[derive(Parser, Debug)]
struct Args {
    /// Connections, for both.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Rounds; the summary gives medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The payonce binary.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release/payonce"))]
    payonce: PathBuf,
}

/// The server, killed on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let data = std::env::temp_dir().join(format!("payonce-generator-bench-{port}"));
    let _server = Server(
        Command::new(&args.payonce)
            .env("PAYONCE_ADDR", format!("127.0.0.1:{port}"))
            .env("PAYONCE_DATA_DIR", &data)
            .env_remove("DATABASE_URL")
            .env_remove("REDIS_URL")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| {
                format!(
                    "cannot start {} ({error}); build it with `cargo build --release -p api`",
                    args.payonce.display()
                )
            })?,
    );
    let target = format!("http://127.0.0.1:{port}");
    wait_until_up(&target).await?;
    println!(
        "generator bench: connections={} seconds={} rounds={}",
        args.connections, args.seconds, args.rounds
    );

    let mut ratios = Vec::new();
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for round in 1..=args.rounds {
        let (generator, wrk) = if round % 2 == 1 {
            let wrk = wrk(&target, &args)?;
            (generator(&target, &args).await?, wrk)
        } else {
            let generator = generator(&target, &args).await?;
            (generator, wrk(&target, &args)?)
        };
        println!(
            "round {round}: loadtest {generator:.0} req/s, wrk {wrk:.0} req/s, ratio {:.2}",
            generator / wrk
        );
        ours.push(generator);
        theirs.push(wrk);
        ratios.push(generator / wrk);
    }
    println!(
        "summary (medians over {} rounds): loadtest {:.0} req/s, wrk {:.0} req/s, ratio {:.2} (target >= 0.7)",
        args.rounds,
        median(ours),
        median(theirs),
        median(ratios)
    );
    let _ = std::fs::remove_dir_all(data);
    Ok(())
}

async fn wait_until_up(target: &str) -> Result<(), Box<dyn std::error::Error>> {
    let client = reqwest::Client::new();
    for _ in 0..100 {
        if client.get(format!("{target}/healthz")).send().await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the server did not come up".into())
}

async fn generator(target: &str, args: &Args) -> Result<f64, Box<dyn std::error::Error>> {
    let load = loadtest::healthz::hammer(
        vec![target.to_owned()],
        args.connections,
        Duration::from_secs(args.seconds),
    )
    .await?;
    if load.failed > 0 {
        return Err(format!("{} requests failed", load.failed).into());
    }
    Ok(load.rate())
}

fn wrk(target: &str, args: &Args) -> Result<f64, Box<dyn std::error::Error>> {
    let output = Command::new("wrk")
        .args([
            "-t",
            "2",
            "-c",
            &args.connections.to_string(),
            "-d",
            &format!("{}s", args.seconds),
        ])
        .arg(format!("{target}/healthz"))
        .output()
        .map_err(|error| format!("cannot run wrk ({error}): apt-get install wrk"))?;
    let stdout = String::from_utf8(output.stdout)?;
    stdout
        .lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix("Requests/sec:")?
                .trim()
                .parse()
                .ok()
        })
        .ok_or_else(|| format!("wrk printed no rate: {stdout}").into())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
