//! Test support: a fresh store (a SQLite file, or a PostgreSQL database of its own), the
//! real `payonce-bank` binary started on it, and raw HTTP over TCP for the faults that
//! leave no answer.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::Connection;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_payonce-bank");

/// How long anything in a test may take before the test fails instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Which database a test's bank keeps its store in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

/// A fresh, empty store; a PostgreSQL database is dropped again when this is.
#[derive(Debug)]
pub struct Store {
    pub url: String,
    /// The SQLite file's directory.
    _dir: Option<tempfile::TempDir>,
    /// PostgreSQL: the server's URL and the database's name, to drop it.
    postgres: Option<(String, String)>,
}

fn postgres_admin_url() -> String {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| url.starts_with("postgres"))
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

impl Store {
    pub async fn fresh(db: Db) -> Self {
        match db {
            Db::Sqlite => {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let url = format!("sqlite:{}", dir.path().join("bank.db").display());
                Self {
                    url,
                    _dir: Some(dir),
                    postgres: None,
                }
            }
            Db::Postgres => {
                let admin = postgres_admin_url();
                let name = format!("payonce_test_bank_{}", uuid::Uuid::new_v4().simple());
                let mut connection = sqlx::PgConnection::connect(&admin)
                    .await
                    .expect("PostgreSQL at DATABASE_URL");
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut connection)
                    .await
                    .expect("create the test database");
                let _ = connection.close().await;
                let (server, _) = admin.rsplit_once('/').expect("a database URL has a path");
                Self {
                    url: format!("{server}/{name}"),
                    _dir: None,
                    postgres: Some((admin, name)),
                }
            }
        }
    }

    /// Runs statements on the store directly, past the bank (to tamper with it).
    pub async fn execute(&self, sql: &str) {
        if self.url.starts_with("sqlite:") {
            run_statements::<sqlx::SqliteConnection>(&self.url, sql).await;
        } else {
            run_statements::<sqlx::PgConnection>(&self.url, sql).await;
        }
    }
}

/// Runs `sql` on a connection of its own to the store at `url`.
async fn run_statements<C: Connection>(url: &str, sql: &str)
where
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
{
    let mut connection = C::connect(url)
        .await
        .unwrap_or_else(|error| panic!("connect to the store at {url}: {error}"));
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut connection)
        .await
        .expect("run the statements");
    let _ = connection.close().await;
}

impl Store {
    /// PostgreSQL: drops the database under the bank's feet (its connections are ended).
    pub async fn drop_database(&self) {
        let (admin, name) = self.postgres.as_ref().expect("a PostgreSQL store");
        let mut connection = sqlx::PgConnection::connect(admin).await.expect("connect");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE {name} WITH (FORCE)"
        )))
        .execute(&mut connection)
        .await
        .expect("drop the database");
        let _ = connection.close().await;
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let Some((admin, name)) = self.postgres.take() else {
            return;
        };
        // Drop runs outside any runtime the test may still be in: a thread of its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let mut connection = sqlx::PgConnection::connect(&admin).await?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut connection)
                .await?;
                connection.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop the test database {:?}", self.postgres);
        }
    }
}

/// A `payonce-bank` process on a free loopback port.
#[derive(Debug)]
pub struct Bank {
    pub addr: SocketAddr,
    pub store: Store,
    pub http: reqwest::Client,
    child: Child,
}

impl Bank {
    /// The bank on a fresh store, with the demonstration header on and `args` added.
    pub async fn start(db: Db, args: &[&str]) -> Self {
        let store = Store::fresh(db).await;
        Self::start_on(store, args).await
    }

    /// The bank on `store`, with the demonstration header on and `args` added.
    pub async fn start_on(store: Store, args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args([
                "--addr",
                "127.0.0.1:0",
                "--database-url",
                &store.url,
                "--demo-header",
            ])
            .args(args)
            .env("RUST_LOG", "warn")
            .env_remove("PAYONCE_BANK_DATABASE_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start payonce-bank");
        let stdout = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        tokio::time::timeout(PATIENCE, BufReader::new(stdout).read_line(&mut line))
            .await
            .expect("payonce-bank says where it listens in time")
            .expect("read its stdout");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("payonce-bank printed {line:?}, not `listening on ADDR`"))
            .parse()
            .expect("an address");
        Self {
            addr,
            store,
            http: reqwest::Client::builder()
                .timeout(PATIENCE)
                .build()
                .expect("a client"),
            child,
        }
    }

    /// Stops the process and hands back its store.
    pub async fn stop(mut self) -> Store {
        let _ = self.child.kill().await;
        self.store
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `POST /v1/transfers` under `key`, with the demonstration header when `fault` is set.
    pub async fn transfer(&self, key: &str, body: &Value, fault: Option<&str>) -> Answer {
        let mut request = self
            .http
            .post(self.url("/v1/transfers"))
            .header("Idempotency-Key", key)
            .json(body);
        if let Some(fault) = fault {
            request = request.header("Payonce-Bank-Fault", fault);
        }
        Answer::from(request.send().await.expect("the bank answers")).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        Answer::from(
            self.http
                .get(self.url(path))
                .send()
                .await
                .expect("the bank answers"),
        )
        .await
    }

    pub async fn close(&self, key: &str) -> Answer {
        let path = format!("/v1/transfers/{key}/close");
        Answer::from(
            self.http
                .post(self.url(&path))
                .send()
                .await
                .expect("the bank answers"),
        )
        .await
    }

    /// Every transfer, through the list, page by page.
    pub async fn all_transfers(&self) -> Vec<Value> {
        self.listed("/v1/transfers?limit=3").await
    }

    /// Every transfer `list` (the list's path with its query, less `after`) names,
    /// following `next_after` page by page.
    pub async fn listed(&self, list: &str) -> Vec<Value> {
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let page = self.get(&format!("{list}&after={after}")).await;
            assert_eq!(page.status, 200, "{page:?}");
            all.extend(
                page.body["transfers"]
                    .as_array()
                    .expect("transfers")
                    .iter()
                    .cloned(),
            );
            match page.body["next_after"].as_i64() {
                Some(next) => after = next,
                None => return all,
            }
        }
    }

    /// Runs `payonce-bank audit` on the bank's store (see [`audit`]).
    pub async fn audit(&self) -> (i32, String) {
        audit(&self.store.url).await
    }

    /// Asserts the audit of its store passes, and that its report says `says`.
    pub async fn assert_audit_clean(&self, says: &str) {
        let (code, report) = self.audit().await;
        assert_eq!(code, 0, "{report}");
        assert!(report.contains(says), "{report}");
    }

    /// Sends `request` as raw bytes and reads until the bank closes the connection: what
    /// came back (nothing, for the faults that drop the answer).
    pub async fn raw(&self, request: &str) -> Vec<u8> {
        let mut stream = TcpStream::connect(self.addr).await.expect("connect");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut received = Vec::new();
        // A connection closed with unread bytes is reset rather than ended: either way,
        // what counts is what arrived before.
        let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut received))
            .await
            .expect("the bank closes the connection in time");
        received
    }
}

/// Runs `payonce-bank audit --database-url URL`: its exit code, and its stdout followed
/// by its stderr.
pub async fn audit(url: &str) -> (i32, String) {
    let output = Command::new(BIN)
        .args(["audit", "--database-url", url])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run the audit");
    (
        output.status.code().expect("an exit code"),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// A raw `POST /v1/transfers` that closes the connection after its answer.
pub fn raw_transfer(key: &str, body: &Value, fault: &str) -> String {
    let body = body.to_string();
    format!(
        "POST /v1/transfers HTTP/1.1\r\nHost: bank\r\nIdempotency-Key: {key}\r\n\
         Payonce-Bank-Fault: {fault}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// An answer: status, headers, and the body as JSON (null when it is none).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    pub async fn from(response: reqwest::Response) -> Self {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.expect("a body");
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Self {
            status,
            headers,
            body,
        }
    }

    /// A header's value, if it is there and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether the answer is marked as a replay.
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true")
    }

    /// The problem's name, from its `type`.
    pub fn problem(&self) -> &str {
        assert_eq!(
            self.headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/problem+json"),
            "{self:?}"
        );
        self.body["type"]
            .as_str()
            .and_then(|kind| kind.strip_prefix("/problems/"))
            .unwrap_or_default()
    }
}

/// A transfer's body.
pub fn body(destination: &str, amount: i64, reference: &str) -> Value {
    json!({"destination": destination, "amount": amount, "reference": reference})
}

/// A key no other test uses.
pub fn key() -> String {
    format!("payout-{}", uuid::Uuid::new_v4())
}

/// Generates the test `$name` once on each store, from `async fn $name(db: Db)`.
#[macro_export]
macro_rules! on_both_stores {
    ($name:ident) => {
        mod $name {
            /// On SQLite.
            #[tokio::test]
            async fn sqlite() {
                super::$name($crate::support::Db::Sqlite).await;
            }

            /// On PostgreSQL.
            #[tokio::test]
            async fn postgres() {
                super::$name($crate::support::Db::Postgres).await;
            }
        }
    };
}
