//! Test support: a fresh, empty database per test, PostgreSQL or SQLite, and one per
//! benchmark round, dropped after it; a lock held from outside the ledger; a proxy that
//! loses the answer to a COMMIT.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use sqlx::Connection;
use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::{Ledger, LedgerError, LedgerOptions, TicketId};

/// Where the tests' PostgreSQL is: `DATABASE_URL`, else the local server with trust auth.
pub fn postgres_admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with its database name replaced by `database`.
pub fn with_database(url: &str, database: &str) -> Result<String, LedgerError> {
    let mut url = url::Url::parse(url)
        .map_err(|error| LedgerError::Database(sqlx::Error::Configuration(error.into())))?;
    url.set_path(&format!("/{database}"));
    Ok(url.to_string())
}

/// A PostgreSQL database of its own — one benchmark round's, one tool run's — created
/// empty on a server and dropped when done with, so that no round inherits another's
/// tables, bloat or checkpoint debt.
#[derive(Debug)]
pub struct ScratchDatabase {
    admin: String,
    name: String,
    url: String,
}

impl ScratchDatabase {
    /// Creates `<prefix>_<random>` on the server `admin` points at (a URL of any database
    /// there, which the drop connects to as well).
    pub async fn create(admin: &str, prefix: &str) -> Result<Self, LedgerError> {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let mut connection = PgConnection::connect(admin).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut connection)
            .await?;
        connection.close().await?;
        Ok(Self {
            url: with_database(admin, &name)?,
            admin: admin.to_owned(),
            name,
        })
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Drops it, closing whatever connections are still open to it.
    pub async fn drop(self) -> Result<(), LedgerError> {
        let mut connection = PgConnection::connect(&self.admin).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut connection)
        .await?;
        connection.close().await?;
        Ok(())
    }
}

/// A database of one test's own.
#[derive(Debug)]
pub struct TestDatabase {
    url: String,
    /// Keeps the SQLite file's directory alive for the test.
    _dir: Option<tempfile::TempDir>,
}

impl TestDatabase {
    /// A new PostgreSQL database named `payonce_test_<random>` on the tests' server.
    /// `scripts/test.sh` drops leftovers of earlier runs.
    pub async fn postgres() -> Result<Self, LedgerError> {
        let scratch = ScratchDatabase::create(&postgres_admin_url(), "payonce_test").await?;
        Ok(Self {
            url: scratch.url,
            _dir: None,
        })
    }

    /// A new SQLite file in a temporary directory, removed with this value.
    pub fn sqlite() -> Result<Self, std::io::Error> {
        let dir = tempfile::tempdir()?;
        let url = format!("sqlite:{}", dir.path().join("ledger.db").display());
        Ok(Self {
            url,
            _dir: Some(dir),
        })
    }

    /// The database's URL, as `Ledger::open` and `DATABASE_URL` take it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Opens the ledger on it (migrating it on first open).
    pub async fn open(&self) -> Result<Ledger, LedgerError> {
        Ledger::open(&self.url, &LedgerOptions::default()).await
    }

    /// Runs one statement behind the ledger's back, to plant what the audit must find.
    pub async fn execute(&self, statement: &str) -> Result<(), LedgerError> {
        let statement = sqlx::AssertSqlSafe(statement.to_owned());
        if self.url.starts_with("sqlite:") {
            let mut connection = SqliteConnection::connect(&self.url).await?;
            sqlx::query(statement).execute(&mut connection).await?;
        } else {
            let mut connection = PgConnection::connect(&self.url).await?;
            sqlx::query(statement).execute(&mut connection).await?;
        }
        Ok(())
    }

    /// Reads one number behind the ledger's back: the first column of the one row that
    /// `statement` returns.
    pub async fn count(&self, statement: &str) -> Result<i64, LedgerError> {
        let statement = sqlx::AssertSqlSafe(statement.to_owned());
        Ok(if self.url.starts_with("sqlite:") {
            let mut connection = SqliteConnection::connect(&self.url).await?;
            sqlx::query_scalar(statement)
                .fetch_one(&mut connection)
                .await?
        } else {
            let mut connection = PgConnection::connect(&self.url).await?;
            sqlx::query_scalar(statement)
                .fetch_one(&mut connection)
                .await?
        })
    }
}

/// Runs `future` with every lottery draw it makes winning `prize`: the same draws, so that
/// two runs of one set of spends can be compared.
pub async fn with_prize<F: std::future::Future>(
    prize: &'static crate::lottery::Prize,
    future: F,
) -> F::Output {
    crate::lottery::FIXED_PRIZE.scope(prize, future).await
}

/// A transaction of its own that holds a ticket's row lock (PostgreSQL) or the database's
/// write lock (SQLite) until released: what a slow concurrent writer looks like to
/// `apply`.
#[derive(Debug)]
pub struct HeldLock(Held);

#[derive(Debug)]
enum Held {
    Postgres(PgConnection),
    Sqlite(SqliteConnection),
}

impl TestDatabase {
    /// Locks `ticket` in a transaction on a connection outside the ledger's pool.
    pub async fn lock_ticket_elsewhere(&self, ticket: TicketId) -> Result<HeldLock, LedgerError> {
        if self.url.starts_with("sqlite:") {
            let mut connection = SqliteConnection::connect(&self.url).await?;
            sqlx::raw_sql("BEGIN IMMEDIATE")
                .execute(&mut connection)
                .await?;
            Ok(HeldLock(Held::Sqlite(connection)))
        } else {
            let mut connection = PgConnection::connect(&self.url).await?;
            sqlx::raw_sql("BEGIN").execute(&mut connection).await?;
            sqlx::query("SELECT 1 FROM tickets WHERE id = $1 FOR UPDATE")
                .bind(ticket)
                .execute(&mut connection)
                .await?;
            Ok(HeldLock(Held::Postgres(connection)))
        }
    }
}

impl HeldLock {
    /// Commits the holding transaction, letting the waiters in.
    pub async fn release(self) -> Result<(), LedgerError> {
        match self.0 {
            Held::Postgres(mut connection) => {
                sqlx::raw_sql("COMMIT").execute(&mut connection).await?;
            }
            Held::Sqlite(mut connection) => {
                sqlx::raw_sql("COMMIT").execute(&mut connection).await?;
            }
        }
        Ok(())
    }
}

/// A TCP proxy on loopback in front of PostgreSQL that, once armed, cuts the connection
/// carrying the next `COMMIT` (or the next message carrying given bytes, see
/// [`arm_on`](Self::arm_on)): it forwards the message, and when the server's answer
/// arrives it closes both sides instead of relaying it. The transaction did commit; its
/// client cannot know. Everything else passes through untouched.
#[derive(Debug)]
pub struct CommitCutter {
    url: String,
    trigger: Arc<Trigger>,
    cuts: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

/// What the cutter cuts: the answer to a message carrying `pattern`, `armed` more times.
#[derive(Debug, Default)]
struct Trigger {
    pattern: std::sync::Mutex<Vec<u8>>,
    armed: AtomicUsize,
    /// Whether a cut answer is replaced by a FATAL error (the server ending the session)
    /// instead of nothing at all.
    fatal: AtomicBool,
}

impl Trigger {
    /// Whether `chunk` is to be cut (counting it if so).
    fn fires(&self, chunk: &[u8]) -> bool {
        let pattern = self
            .pattern
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        !pattern.is_empty()
            && chunk
                .windows(pattern.len())
                .any(|window| window == pattern.as_slice())
            && self
                .armed
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                    left.checked_sub(1)
                })
                .is_ok()
    }
}

/// A simple-protocol query message carrying `COMMIT` (how sqlx commits): 'Q', its
/// length (4 + 7), the text and its NUL.
const COMMIT_MESSAGE: &[u8] = b"Q\x00\x00\x00\x0bCOMMIT\x00";

/// An ErrorResponse of severity FATAL, SQLSTATE 57P01 — what a backend sends when it is
/// terminated or the server shuts down fast, which can happen after its commit.
fn fatal_message() -> Vec<u8> {
    let mut fields = Vec::new();
    for (field, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "57P01"),
        (b'M', "terminating connection due to administrator command"),
    ] {
        fields.push(field);
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let length = u32::try_from(fields.len() + 4).unwrap_or(u32::MAX);
    let mut message = vec![b'E'];
    message.extend_from_slice(&length.to_be_bytes());
    message.extend_from_slice(&fields);
    message
}

impl CommitCutter {
    /// A proxy for the server `database_url` names; [`url`](Self::url) is the same URL
    /// through the proxy.
    pub async fn start(database_url: &str) -> std::io::Result<Self> {
        let mut url = url::Url::parse(database_url).map_err(std::io::Error::other)?;
        let upstream = format!(
            "{}:{}",
            url.host_str().unwrap_or("127.0.0.1"),
            url.port().unwrap_or(5432)
        );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        url.set_host(Some("127.0.0.1"))
            .map_err(std::io::Error::other)?;
        url.set_port(Some(port))
            .map_err(|()| std::io::Error::other("cannot set the port"))?;
        let trigger = Arc::new(Trigger::default());
        let cuts = Arc::new(AtomicUsize::new(0));
        let (accept_trigger, accept_cuts) = (trigger.clone(), cuts.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(relay(
                    client,
                    server,
                    accept_trigger.clone(),
                    accept_cuts.clone(),
                ));
            }
        });
        Ok(Self {
            url: url.to_string(),
            trigger,
            cuts,
            accept,
        })
    }

    /// The database URL through the proxy.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Cuts the next connection that sends a COMMIT.
    pub fn arm(&self) {
        self.arm_on(COMMIT_MESSAGE, 1);
    }

    /// Cuts the next `times` connections that send a message carrying `bytes` — a
    /// ticket's id, say, to cut the answer to the one statement that spends it.
    pub fn arm_on(&self, bytes: &[u8], times: usize) {
        self.trigger.fatal.store(false, Ordering::SeqCst);
        self.set_pattern(bytes, times);
    }

    /// Like [`arm_on`](Self::arm_on), but the answer is relayed up to its ReadyForQuery,
    /// which a FATAL error replaces before the connection closes: the server ended the
    /// session after the statement ran and committed, as PostgreSQL may (a fast shutdown,
    /// a backend terminated while its commit waits for a synchronous standby).
    pub fn arm_fatal_on(&self, bytes: &[u8], times: usize) {
        self.trigger.fatal.store(true, Ordering::SeqCst);
        self.set_pattern(bytes, times);
    }

    fn set_pattern(&self, bytes: &[u8], times: usize) {
        *self
            .trigger
            .pattern
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = bytes.to_vec();
        self.trigger.armed.store(times, Ordering::SeqCst);
    }

    /// How many answers were cut so far.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for CommitCutter {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Relays one connection both ways until either side closes or an answer is cut.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    trigger: Arc<Trigger>,
    cuts: Arc<AtomicUsize>,
) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    // Set before the message goes out, so whatever the server sends next is its answer.
    let cutting = Arc::new(AtomicBool::new(false));
    let upstream_cutting = cutting.clone();
    let downstream_trigger = trigger.clone();
    let upstream = async move {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let read = match from_client.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            let chunk = &buffer[..read];
            if trigger.fires(chunk) {
                upstream_cutting.store(true, Ordering::SeqCst);
                let _ = to_server.write_all(chunk).await;
                // Keep the server side open until the answer was read (below).
                std::future::pending::<()>().await;
            }
            if to_server.write_all(chunk).await.is_err() {
                return;
            }
        }
    };
    let downstream = async move {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let read = match from_server.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            if cutting.load(Ordering::SeqCst) {
                let answer = &buffer[..read];
                if downstream_trigger.fatal.load(Ordering::SeqCst) {
                    // The answer as the server sent it up to its ReadyForQuery ('Z', length
                    // 5, status), which comes after the commit: FATAL in its place.
                    let Some(before_ready) = answer
                        .len()
                        .checked_sub(6)
                        .filter(|&at| answer[at..at + 5] == *b"Z\x00\x00\x00\x05")
                    else {
                        // Not the end of the answer yet.
                        if to_client.write_all(answer).await.is_err() {
                            return;
                        }
                        continue;
                    };
                    cuts.fetch_add(1, Ordering::SeqCst);
                    let mut ended = answer[..before_ready].to_vec();
                    ended.extend_from_slice(&fatal_message());
                    let _ = to_client.write_all(&ended).await;
                } else {
                    // The answer: swallow it.
                    cuts.fetch_add(1, Ordering::SeqCst);
                }
                // And hang up on both.
                let _ = to_client.shutdown().await;
                return;
            }
            if to_client.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    };
    // Either direction ending ends the connection: dropping the halves closes both sockets.
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}

/// A PostgreSQL server of the test's own — `initdb` into a temporary directory, listening
/// on a free loopback port — for tests that restart or stop the database, which the shared
/// one must never be. Stopped at once on drop. Uses the newest server installed under
/// `/usr/lib/postgresql`; as root, runs it as the `postgres` user (PostgreSQL refuses to
/// run as root).
#[derive(Debug)]
pub struct PrivatePostgres {
    dir: tempfile::TempDir,
    bin: std::path::PathBuf,
    port: u16,
    as_postgres: bool,
}

impl PrivatePostgres {
    /// Creates the cluster and starts it, waiting until it accepts connections.
    pub fn start() -> std::io::Result<Self> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")?
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let version: u32 = entry.file_name().to_str()?.parse().ok()?;
                Some((version, entry.path().join("bin")))
            })
            .max()
            .map(|(_, bin)| bin)
            .ok_or_else(|| std::io::Error::other("no PostgreSQL under /usr/lib/postgresql"))?;
        let dir = tempfile::Builder::new().prefix("payonce-pg-").tempdir()?;
        let as_postgres = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|output| output.stdout.starts_with(b"0\n"));
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let server = Self {
            dir,
            bin,
            port,
            as_postgres,
        };
        if as_postgres {
            server.run("chown", &["-R", "postgres:", &server.dir()])?;
        }
        let data = server.data();
        let initdb = server.bin.join("initdb").display().to_string();
        server.run(
            &initdb,
            &[
                "-D",
                &data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        server.pg_ctl(&["start"])?;
        Ok(server)
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server the way an operator would (`pg_ctl stop -m fast`: sessions are
    /// ended, in-flight transactions roll back).
    pub fn stop(&self) -> std::io::Result<()> {
        self.pg_ctl(&["stop", "-m", "fast"])
    }

    /// Starts it again, returning once it accepts connections.
    pub fn start_again(&self) -> std::io::Result<()> {
        self.pg_ctl(&["start"])
    }

    /// Stops it as a crash would (`pg_ctl stop -m immediate`: every session ends without a
    /// goodbye; committed data stays) and starts it again.
    pub fn crash_and_restart(&self) -> std::io::Result<()> {
        self.pg_ctl(&["stop", "-m", "immediate"])?;
        self.start_again()
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn dir(&self) -> String {
        self.dir.path().display().to_string()
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn pg_ctl(&self, action: &[&str]) -> std::io::Result<()> {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c full_page_writes=off",
            self.port,
            self.dir()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        let pg_ctl = self.bin.join("pg_ctl").display().to_string();
        let data = self.data();
        let mut args = vec!["-D", &data, "-l", &log, "-o", &options, "-w", "-t", "60"];
        args.extend_from_slice(action);
        self.run(&pg_ctl, &args)
    }

    fn run(&self, program: &str, args: &[&str]) -> std::io::Result<()> {
        let mut command = if self.as_postgres && program != "chown" {
            let mut command = std::process::Command::new("runuser");
            command.args(["-u", "postgres", "--", program]);
            command
        } else {
            std::process::Command::new(program)
        };
        let output = command.args(args).output()?;
        if output.status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "{program} {args:?} failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )))
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate"]);
    }
}
