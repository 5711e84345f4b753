//! HTTP withdrawals through an in-process payonce, shared by the API's benchmarks
//! (`api/examples/http_bench.rs`, `api/examples/lock_costs.rs`, and the others; each
//! includes this file, as the webhook benchmark does for its server):
//! a server on a port-0 listener, accounts opened through the API, tickets inserted in bulk
//! (the fixture: issuing is not what is measured), and `wrk` sending withdrawals of 1, each
//! with its own ticket (`withdraw.lua`).

#![allow(dead_code)] // Each includer uses its part.

use std::process::Command;
use std::str::FromStr;
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

/// The allocator the `payonce` binary runs on (see `api/src/main.rs`): the server here is
/// in the benchmark's process, so the benchmark chooses it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

// The services a benchmark runs payonce on, flattened into its arguments: `--database-url`
// and `--redis-url` (with `DATABASE_URL` and `REDIS_URL`). Plain comments: a doc comment
// here would become the including command's about text.
#[derive(clap::Args, Debug)]
pub struct Services {
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub database_url: String,
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
}

impl Services {
    /// payonce's configuration ([`config`]) on the PostgreSQL database at `database_url`
    /// and this Redis under `namespace`, then `more` arguments.
    pub fn config(
        &self,
        database_url: &str,
        namespace: &str,
        more: &[&str],
    ) -> api::config::Config {
        let mut args = vec![
            "--database-url",
            database_url,
            "--redis-url",
            &self.redis_url,
            "--redis-namespace",
            namespace,
        ];
        args.extend_from_slice(more);
        config(&args)
    }
}

/// The median of `pick` over `rounds` (of an even number, the upper middle one).
pub fn median<T>(rounds: &[T], pick: impl Fn(&T) -> f64) -> f64 {
    let mut values: Vec<f64> = rounds.iter().map(pick).collect();
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// payonce's configuration from `args`, as on its command line (and its environment).
pub fn config(args: &[&str]) -> api::config::Config {
    use clap::Parser;
    api::config::Cli::parse_from(std::iter::once("payonce").chain(args.iter().copied())).config
}

/// A payonce server in this process, stopped by [`Server::stop`].
pub struct Server {
    pub address: String,
    pub state: api::state::AppState,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Starts payonce with `config` on a free loopback port.
    pub async fn start(config: api::config::Config) -> Result<Self, BoxError> {
        let state = api::state::AppState::connect(&config).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(api::serve(
            listener,
            state.clone(),
            config.request_timeout,
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(Self {
            address,
            state,
            stop,
            task,
        })
    }

    /// The sizes of the batches its group commit has sent so far (`ledger::Batches`).
    pub fn batches(&self) -> Vec<(usize, u64)> {
        self.state
            .ledger()
            .batches()
            .map(ledger::Batches::counts)
            .unwrap_or_default()
    }

    /// Stops it and waits until it has.
    pub async fn stop(self) -> Result<(), BoxError> {
        let _ = self.stop.send(());
        self.task.await??;
        Ok(())
    }
}

/// What `wrk` measured.
pub struct Withdrawals {
    pub per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Accounts with balances no bench can exhaust: (id, key).
pub async fn open_accounts(address: &str, count: usize) -> Result<Vec<(Uuid, String)>, BoxError> {
    let client = reqwest::Client::new();
    let mut accounts = Vec::with_capacity(count);
    for chunk in 0..count.div_ceil(32) {
        let requests = (0..32.min(count - chunk * 32)).map(|_| {
            client
                .post(format!("{address}/v1/accounts"))
                .json(&json!({ "name": "bench", "balance": 1_000_000_000_000_000_i64 }))
                .send()
        });
        for response in futures::future::join_all(requests).await {
            let body: Value = response?.json().await?;
            let id = Uuid::from_str(body["id"].as_str().ok_or("no id")?)?;
            accounts.push((id, body["api_key"].as_str().ok_or("no key")?.to_owned()));
        }
    }
    Ok(accounts)
}

/// Reads every account once through `address`, so that instance knows their keys (it
/// keeps the keys it has verified) before it is measured.
pub async fn know_keys(address: &str, accounts: &[(Uuid, String)]) -> Result<(), BoxError> {
    let client = reqwest::Client::new();
    for chunk in accounts.chunks(32) {
        let reads = chunk.iter().map(|(id, key)| {
            client
                .get(format!("{address}/v1/accounts/{id}"))
                .bearer_auth(key)
                .send()
        });
        for response in futures::future::join_all(reads).await {
            response?.error_for_status()?;
        }
    }
    Ok(())
}

/// Tickets inserted straight into the ledger's table, spread over the accounts.
pub async fn issue_tickets(
    raw: &sqlx::PgPool,
    accounts: &[(Uuid, String)],
    count: usize,
) -> Result<Vec<(Uuid, String, Uuid)>, BoxError> {
    let tickets: Vec<(Uuid, String, Uuid)> = (0..count)
        .map(|_| {
            let (account, key) = &accounts[rand_index(accounts.len())];
            (*account, key.clone(), Uuid::new_v4())
        })
        .collect();
    for chunk in tickets.chunks(10_000) {
        let ids: Vec<Uuid> = chunk.iter().map(|t| t.2).collect();
        let owners: Vec<Uuid> = chunk.iter().map(|t| t.0).collect();
        sqlx::query(
            "INSERT INTO tickets (id, account_id, created_at, expires_at)
             SELECT id, account_id, now(), now() + interval '1 day'
             FROM UNNEST($1::uuid[], $2::uuid[]) AS t (id, account_id)",
        )
        .bind(ids)
        .bind(owners)
        .execute(raw)
        .await?;
    }
    Ok(tickets)
}

fn rand_index(len: usize) -> usize {
    (Uuid::new_v4().as_u128() % len as u128) as usize
}

/// `wrk` with `connections` connections (and up to two threads) for `seconds`, each
/// request a withdrawal of 1 with the next of `tickets` — used ones are replayed, and with
/// `wrap` the list starts over when it runs out; fails if any was not a 201 or the
/// tickets ran out.
pub fn wrk(
    address: &str,
    tickets: &[(Uuid, String, Uuid)],
    connections: usize,
    seconds: u64,
    wrap: bool,
) -> Result<Withdrawals, BoxError> {
    let file = std::env::temp_dir().join(format!("payonce-bench-{}.txt", Uuid::new_v4().simple()));
    let lines: String = tickets
        .iter()
        .map(|(account, key, ticket)| format!("{account} {key} {ticket}\n"))
        .collect();
    std::fs::write(&file, lines)?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/withdraw.lua");
    let threads = connections.clamp(1, 2).to_string();
    let output = Command::new("wrk")
        .args([
            "-t",
            &threads,
            "-c",
            &connections.to_string(),
            "-d",
            &format!("{seconds}s"),
        ])
        .args(["--timeout", "10s", "-s", script, address, "--"])
        .arg(&file)
        .arg(&threads)
        .args(wrap.then_some("wrap"))
        .output();
    let _ = std::fs::remove_file(&file);
    let output =
        output.map_err(|error| format!("cannot run wrk ({error}): apt-get install wrk"))?;
    let stdout = String::from_utf8(output.stdout)?;
    let value = |name: &str| -> Result<f64, BoxError> {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .ok_or_else(|| {
                format!(
                    "wrk printed no {name}:\n{stdout}{}",
                    String::from_utf8_lossy(&output.stderr)
                )
                .into()
            })
    };
    let created = value("created")?;
    if value("other")? > 0.0 {
        return Err(format!("some withdrawals failed or tickets ran out:\n{stdout}").into());
    }
    Ok(Withdrawals {
        per_sec: created / Duration::from_secs(seconds).as_secs_f64(),
        p50_ms: value("latency_p50_us")? / 1000.0,
        p99_ms: value("latency_p99_us")? / 1000.0,
    })
}

/// CPU time taken so far, in seconds: by PostgreSQL's processes (the backends that exited
/// included — the postmaster counts its children's time), by Redis's, and by this process
/// (payonce and the load generator in it). Read from `/proc`, so only where the services
/// run on this machine, as the benchmarks run them; `None` where there is no `/proc`.
/// Whatever else those servers do meanwhile counts too (another database's clients, say):
/// the figures are the benchmark's only on an otherwise quiet machine.
///
/// The CPU one operation takes, and where, says which part to make cheaper; set beside
/// another operation's measured in the same round, it gives the ratio of their rates on a
/// machine whose cores are the limit, as these are.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuTaken {
    pub postgres: f64,
    pub redis: f64,
    pub this: f64,
}

impl CpuTaken {
    pub fn now() -> Option<Self> {
        let ticks_per_sec = clock_ticks_per_sec();
        let seconds = |stat: &str, with_children: bool| -> Option<(String, f64)> {
            // `pid (comm) state ppid …`: comm may hold spaces, so fields count from its `)`.
            let (head, rest) = stat.rsplit_once(") ")?;
            let comm = head.split_once(" (")?.1.to_owned();
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // utime and stime are fields 14 and 15 of the line, cutime and cstime 16 and 17.
            let wanted = if with_children { 11..15 } else { 11..13 };
            let ticks: u64 = fields
                .get(wanted)?
                .iter()
                .filter_map(|field| field.parse::<u64>().ok())
                .sum();
            Some((comm, ticks as f64 / ticks_per_sec))
        };
        let mut taken = Self {
            this: seconds(&std::fs::read_to_string("/proc/self/stat").ok()?, false)?.1,
            ..Self::default()
        };
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            if !entry
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
            {
                continue;
            }
            // A process may end between the listing and the read: it is skipped.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            match seconds(&stat, true) {
                Some((comm, spent)) if comm == "postgres" => taken.postgres += spent,
                Some((comm, spent)) if comm == "redis-server" => taken.redis += spent,
                _ => {}
            }
        }
        Some(taken)
    }

    /// What was taken between `earlier` and `self`, in microseconds.
    pub fn since(self, earlier: Self) -> Self {
        let micros = |now: f64, then: f64| (now - then) * 1e6;
        Self {
            postgres: micros(self.postgres, earlier.postgres),
            redis: micros(self.redis, earlier.redis),
            this: micros(self.this, earlier.this),
        }
    }

    /// Each part divided among `operations`.
    pub fn per(self, operations: f64) -> Self {
        let each = |taken: f64| taken / operations.max(1.0);
        Self {
            postgres: each(self.postgres),
            redis: each(self.redis),
            this: each(self.this),
        }
    }

    pub fn total(&self) -> f64 {
        self.postgres + self.redis + self.this
    }
}

impl std::ops::Add for CpuTaken {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            postgres: self.postgres + other.postgres,
            redis: self.redis + other.redis,
            this: self.this + other.this,
        }
    }
}

/// The kernel's clock ticks per second, in which `/proc` counts CPU time (`getconf
/// CLK_TCK`; 100, Linux's value, when that cannot say).
fn clock_ticks_per_sec() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(100.0)
    })
}
