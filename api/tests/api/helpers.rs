//! Starting real payonce servers on port-0 listeners for the tests, against a fresh
//! database each (PostgreSQL + Redis, or embedded SQLite + in-process locks).

use std::sync::Arc;
use std::time::Duration;

use api::config::{Cli, Config};
use api::state::AppState;
use clap::Parser;
use ledger::testing::TestDatabase;
use reqwest::{Client, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// Which mode a test server runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL + Redis.
    Distributed,
    /// SQLite + in-process locks.
    Embedded,
    /// PostgreSQL + a Redis Cluster (`REDIS_CLUSTER_URL`, else 127.0.0.1:7000-7002).
    RedisCluster,
    /// PostgreSQL + ZooKeeper (`ZOOKEEPER_URL`, else 127.0.0.1:2181).
    ZooKeeper,
    /// PostgreSQL + etcd (`ETCD_URL`, else 127.0.0.1:2379).
    Etcd,
    /// PostgreSQL for the ledger and, as advisory locks, for the locks too.
    PostgresLocks,
    /// PostgreSQL + a lock table in MariaDB (`MYSQL_URL`, else root@127.0.0.1:3306).
    MySqlTable,
    /// PostgreSQL + InnoDB row locks in MariaDB.
    MySqlRow,
    /// PostgreSQL + memcached (`MEMCACHED_URL`, else 127.0.0.1:11211).
    Memcached,
    /// PostgreSQL + Hazelcast's CP Subsystem (`HAZELCAST_URL`, else the three members on
    /// 127.0.0.1:5701-5703).
    Hazelcast,
}

/// The database and lock store a group of instances share.
pub struct Shared {
    pub backend: Backend,
    pub database: TestDatabase,
    pub redis_url: String,
    pub namespace: String,
}

impl Shared {
    pub async fn new(backend: Backend) -> Arc<Self> {
        let database = match backend {
            Backend::Embedded => TestDatabase::sqlite().expect("a SQLite file"),
            _ => TestDatabase::postgres().await.expect("a test database"),
        };
        Arc::new(Self {
            backend,
            database,
            redis_url: std::env::var("REDIS_URL")
                .unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
            namespace: format!("test-{:016x}", rand_u64()),
        })
    }

    /// A configuration for one instance; `extra` are more command-line flags.
    pub fn config(&self, extra: &[&str]) -> Config {
        let mut args = vec!["payonce".to_owned(), "--addr".into(), "127.0.0.1:0".into()];
        match self.backend {
            Backend::Distributed => {
                args.extend([
                    "--database-url".into(),
                    self.database.url().to_owned(),
                    "--redis-url".into(),
                    self.redis_url.clone(),
                    "--redis-namespace".into(),
                    self.namespace.clone(),
                ]);
            }
            Backend::RedisCluster => {
                let cluster = std::env::var("REDIS_CLUSTER_URL").unwrap_or_else(|_| {
                    "redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002".into()
                });
                args.extend([
                    "--database-url".into(),
                    self.database.url().to_owned(),
                    "--lock-url".into(),
                    cluster,
                    "--redis-namespace".into(),
                    self.namespace.clone(),
                ]);
            }
            Backend::ZooKeeper => {
                let zookeeper =
                    std::env::var("ZOOKEEPER_URL").unwrap_or_else(|_| "zk://127.0.0.1:2181".into());
                args.extend([
                    "--database-url".into(),
                    self.database.url().to_owned(),
                    "--lock-url".into(),
                    format!("{zookeeper}/payonce-tests/{}", self.namespace),
                ]);
            }
            Backend::Etcd => {
                let etcd =
                    std::env::var("ETCD_URL").unwrap_or_else(|_| "etcd://127.0.0.1:2379".into());
                args.extend([
                    "--database-url".into(),
                    self.database.url().to_owned(),
                    "--lock-url".into(),
                    format!("{etcd}/payonce-tests/{}", self.namespace),
                ]);
            }
            Backend::PostgresLocks => {
                args.extend([
                    "--database-url".into(),
                    self.database.url().to_owned(),
                    "--lock-url".into(),
                    self.database.url().to_owned(),
                    "--redis-namespace".into(),
                    self.namespace.clone(),
                ]);
            }
            Backend::Memcached => {
                let memcached = std::env::var("MEMCACHED_URL")
                    .unwrap_or_else(|_| "memcache://127.0.0.1:11211".into());
                args.extend([
                    "--database-url".into(),
                    self.database.url().to_owned(),
                    "--lock-url".into(),
                    memcached,
                    "--redis-namespace".into(),
                    self.namespace.clone(),
                ]);
            }
            Backend::Hazelcast => {
                let hazelcast = std::env::var("HAZELCAST_URL").unwrap_or_else(|_| {
                    "hazelcast://127.0.0.1:5701,127.0.0.1:5702,127.0.0.1:5703".into()
                });
                args.extend([
                    "--database-url".into(),
                    self.database.url().to_owned(),
                    "--lock-url".into(),
                    hazelcast,
                    "--redis-namespace".into(),
                    self.namespace.clone(),
                ]);
            }
            Backend::MySqlTable | Backend::MySqlRow => {
                let mysql = std::env::var("MYSQL_URL")
                    .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/payonce_locks".into());
                let mysql = if self.backend == Backend::MySqlRow {
                    mysql.replacen("mysql://", "mysql-row://", 1)
                } else {
                    mysql
                };
                args.extend([
                    "--database-url".into(),
                    self.database.url().to_owned(),
                    "--lock-url".into(),
                    mysql,
                    "--redis-namespace".into(),
                    self.namespace.clone(),
                ]);
            }
            Backend::Embedded => {
                // The embedded mode keeps its own file in the test's temporary directory.
                let path = self.database.url().trim_start_matches("sqlite:");
                let dir = std::path::Path::new(path)
                    .parent()
                    .expect("a directory")
                    .display()
                    .to_string();
                args.extend(["--data-dir".into(), dir]);
            }
        }
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let mut config = Cli::parse_from(args).config;
        // The test command exports DATABASE_URL and REDIS_URL: the embedded mode is the one
        // where neither is set, and the other lock services are not Redis.
        match self.backend {
            Backend::Embedded => {
                config.database_url = None;
                config.redis_url = None;
            }
            Backend::Distributed => {}
            _ => config.redis_url = None,
        }
        config
    }
}

fn rand_u64() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
}

/// A running server.
pub struct TestApp {
    pub address: String,
    pub client: Client,
    pub shared: Arc<Shared>,
    pub state: AppState,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// One server on a fresh database.
pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_with(Shared::new(backend).await, &[]).await
}

/// One server on a fresh database, with extra flags.
pub async fn spawn_app_with(backend: Backend, extra: &[&str]) -> TestApp {
    spawn_with(Shared::new(backend).await, extra).await
}

/// An instance (PostgreSQL + Redis) whose database connections pass through a
/// [`ledger::testing::CommitCutter`], to lose the answers a test chooses.
pub async fn spawn_behind_a_cutter() -> (TestApp, ledger::testing::CommitCutter) {
    let shared = Shared::new(Backend::Distributed).await;
    let cutter = ledger::testing::CommitCutter::start(shared.database.url())
        .await
        .expect("a cutter");
    let mut config = shared.config(&[]);
    config.database_url = Some(cutter.url().to_owned());
    (spawn_config(shared, config).await, cutter)
}

/// One more server on `shared`.
pub async fn spawn_with(shared: Arc<Shared>, extra: &[&str]) -> TestApp {
    let config = shared.config(extra);
    spawn_config(shared, config).await
}

/// A server with exactly this configuration.
pub async fn spawn_config(shared: Arc<Shared>, config: Config) -> TestApp {
    let state = AppState::connect(&config)
        .await
        .expect("the service starts");
    spawn_state(shared, state, &config).await
}

/// A server on state the test assembled itself (to keep a handle on a part of it), with
/// `config`'s request timeout.
pub async fn spawn_state(shared: Arc<Shared>, state: AppState, config: &Config) -> TestApp {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let address = format!("http://{}", listener.local_addr().expect("an address"));
    let (shutdown, stop) = oneshot::channel::<()>();
    let server = tokio::spawn(api::serve(
        listener,
        state.clone(),
        config.request_timeout,
        async move {
            let _ = stop.await;
        },
    ));
    TestApp {
        address,
        client: Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("a client"),
        shared,
        state,
        shutdown: Some(shutdown),
        server: Some(server),
    }
}

/// An account as the tests use it.
#[derive(Clone, Debug)]
pub struct TestAccount {
    pub id: String,
    pub key: String,
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// `GET path` with `key` as the bearer.
    pub async fn get_as(&self, key: &str, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .expect("request")
    }

    /// `GET path`, without credentials.
    pub async fn get(&self, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("request")
    }

    /// `GET url` (a whole URL) with the key of another, fresh account is 403 `forbidden`.
    /// Returns that account.
    pub async fn forbidden_to_another_account(&self, url: &str) -> TestAccount {
        let other = self.create_account(0, 0).await;
        let response = self
            .client
            .get(url)
            .bearer_auth(&other.key)
            .send()
            .await
            .expect("request");
        assert_problem(response, StatusCode::FORBIDDEN, "forbidden").await;
        other
    }

    /// `POST path` with `key` as the bearer and no body.
    pub async fn post_as(&self, key: &str, path: &str) -> Response {
        self.client
            .post(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .expect("request")
    }

    /// `GET path` with `key` as the bearer: the JSON body.
    pub async fn get_json(&self, key: &str, path: &str) -> Value {
        self.get_as(key, path).await.json().await.expect("json")
    }

    /// Stops the server and waits until it has finished in-flight requests.
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.expect("server task").expect("server result");
        }
    }

    pub async fn create_account(&self, balance: i64, points: i64) -> TestAccount {
        let response = self
            .client
            .post(self.url("/v1/accounts"))
            .json(&json!({ "name": "test", "balance": balance, "points": points }))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), StatusCode::CREATED);
        let body: Value = response.json().await.expect("json");
        TestAccount {
            id: body["id"].as_str().expect("id").to_owned(),
            key: body["api_key"].as_str().expect("key").to_owned(),
        }
    }

    /// The ticket as `GET /v1/tickets/{id}` shows it to its account (asserting a 200).
    pub async fn shown_ticket(&self, account: &TestAccount, ticket: &str) -> Value {
        let (status, _, shown) = read(
            self.get_as(&account.key, &format!("/v1/tickets/{ticket}"))
                .await,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{shown}");
        shown
    }

    /// The OpenAPI document the server serves.
    pub async fn openapi(&self) -> Value {
        self.client
            .get(self.url("/openapi.json"))
            .send_for_json()
            .await
    }

    /// Withdraws `amount` straight through the ledger under a fencing `token` of the
    /// test's choosing, as a lock holder granted it would: how tests show which grants
    /// the ledger takes and which it refuses as stale.
    pub async fn withdraw_under_token(
        &self,
        account: &TestAccount,
        ticket: ledger::TicketId,
        amount: i64,
        token: u64,
    ) -> Result<ledger::Applied, ledger::ApplyError> {
        let fingerprint = format!("withdraw {amount}");
        self.state
            .ledger()
            .apply(
                ledger::ApplyRequest {
                    ticket_id: ticket,
                    account_id: ledger::AccountId(account.id.parse().expect("an account id")),
                    operation: ledger::Operation::Withdrawal(
                        ledger::Amount::new(amount).expect("an amount"),
                    ),
                    fingerprint: &fingerprint,
                    fencing_token: token,
                },
                &api::render::render,
            )
            .await
    }

    /// Fencing at the ledger: a withdrawal of `amount` under the later grant's token is
    /// written, and one under the earlier grant's token (on another ticket) is refused as
    /// stale. `what` names the case in a failure.
    pub async fn assert_later_grant_wins(
        &self,
        account: &TestAccount,
        later: (ledger::TicketId, &lock::LockGuard),
        earlier: (ledger::TicketId, &lock::LockGuard),
        amount: i64,
        what: &str,
    ) {
        let (later, earlier) = (
            (later.0, later.1.fencing_token().get()),
            (earlier.0, earlier.1.fencing_token().get()),
        );
        let written = self
            .withdraw_under_token(account, later.0, amount, later.1)
            .await
            .expect("the later grant writes");
        assert_eq!(written.response.status, 201, "{what}");
        let refused = self
            .withdraw_under_token(account, earlier.0, amount, earlier.1)
            .await
            .expect_err("the earlier grant is refused");
        assert!(
            matches!(refused, ledger::ApplyError::StaleToken { .. }),
            "{what}: {refused:?}"
        );
    }

    pub async fn ticket(&self, account: &TestAccount) -> String {
        let response = self
            .post_as(
                &account.key,
                &format!("/v1/accounts/{}/tickets", account.id),
            )
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let body: Value = response.json().await.expect("json");
        body["ticket_id"].as_str().expect("ticket").to_owned()
    }

    /// POSTs a spend (`withdrawals`, `deposits` or `lottery-draws`) with a JSON body.
    pub async fn spend(
        &self,
        account: &TestAccount,
        what: &str,
        ticket: &str,
        body: Value,
    ) -> Response {
        self.client
            .post(self.url(&format!("/v1/accounts/{}/{what}", account.id)))
            .bearer_auth(&account.key)
            .header("idempotency-key", ticket)
            .json(&body)
            .send()
            .await
            .expect("request")
    }

    pub async fn withdraw(&self, account: &TestAccount, ticket: &str, amount: i64) -> Response {
        self.spend(account, "withdrawals", ticket, json!({ "amount": amount }))
            .await
    }

    /// Takes a ticket and withdraws `amount` with it; the answer's status.
    pub async fn withdraw_with_a_new_ticket(
        &self,
        account: &TestAccount,
        amount: i64,
    ) -> StatusCode {
        let ticket = self.ticket(account).await;
        self.withdraw(account, &ticket, amount).await.status()
    }

    /// A withdrawal with extra headers (the demonstration's `Payonce-Strategy` and
    /// `Payonce-Fault`), ready to send.
    pub fn withdrawal(
        &self,
        account: &TestAccount,
        ticket: &str,
        amount: i64,
        headers: &[(&str, &str)],
    ) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(self.url(&format!("/v1/accounts/{}/withdrawals", account.id)))
            .bearer_auth(&account.key)
            .header("idempotency-key", ticket)
            .json(&json!({ "amount": amount }));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
    }

    /// Sends a withdrawal with extra headers in the background — for a request that pauses
    /// while the test sends others.
    pub fn spawn_withdrawal(
        &self,
        account: &TestAccount,
        ticket: &str,
        amount: i64,
        headers: &[(&str, &str)],
    ) -> tokio::task::JoinHandle<Response> {
        let request = self.withdrawal(account, ticket, amount, headers);
        tokio::spawn(async move { request.send().await.expect("request") })
    }

    pub async fn balance(&self, account: &TestAccount) -> (i64, i64) {
        let body: Value = self
            .get_json(&account.key, &format!("/v1/accounts/{}", account.id))
            .await;
        (
            body["balance"].as_i64().expect("balance"),
            body["points"].as_i64().expect("points"),
        )
    }

    pub async fn assert_audit_clean(&self) {
        let violations = self.state.ledger().audit().await.expect("audit runs");
        assert!(violations.is_empty(), "{violations:#?}");
    }

    /// Asserts the ledger's audit finds `rule` broken (`case` says which run, if it fails).
    /// Only the demonstration's unguarded writes break one.
    #[cfg(feature = "demo")]
    pub async fn assert_audit_finds(&self, rule: ledger::Rule, case: &str) {
        let violations = self.state.ledger().audit().await.expect("audit runs");
        assert!(
            violations.iter().any(|violation| violation.rule == rule),
            "{case}: {violations:#?}"
        );
    }

    /// A metric's value from `/metrics` (summed over labels).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").await.text().await.expect("text");
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .filter(|line| {
                line.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits until `count` spends in all have taken their account's lock (the lock-wait
    /// histogram counts one per grant) — rather than guessing how long a request takes
    /// to get there on a loaded machine.
    pub async fn until_locks_taken(&self, count: f64) {
        for _ in 0..1000 {
            if self.metric("payonce_lock_wait_seconds_count").await >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{count} locks were not taken within 10 s");
    }
}

/// Spends that wait up to 20 s for their account's lock: for the tests that queue many on
/// one account to count outcomes. Under the default 2 s, the last in a queue of thirty
/// is answered 409 `account-busy` whenever the machine is slow enough — a true answer, but
/// not what those tests examine.
pub const PATIENT_SPENDS: &[&str] = &["--lock-wait", "20s"];

/// 30 withdrawals of 100 at once from an account of 1000, each with a ticket of its own,
/// spread over `instances` in turn (spawned with [`PATIENT_SPENDS`]): exactly the
/// affordable 10 are 201 and the other 20 are 402. Returns the account.
pub async fn thirty_withdrawals_of_100_from_1000(instances: &[&TestApp]) -> TestAccount {
    let ada = instances[0].create_account(1000, 0).await;
    let mut tickets = Vec::new();
    for i in 0..30 {
        tickets.push(instances[i % instances.len()].ticket(&ada).await);
    }
    let ada_ref = &ada;
    let results = futures::future::join_all(tickets.iter().enumerate().map(|(i, ticket)| {
        let instance = instances[i % instances.len()];
        async move { read(instance.withdraw(ada_ref, ticket, 100).await).await }
    }))
    .await;
    let answered = |wanted: StatusCode| {
        results
            .iter()
            .filter(|(status, _, _)| *status == wanted)
            .count()
    };
    assert_eq!(
        (
            answered(StatusCode::CREATED),
            answered(StatusCode::PAYMENT_REQUIRED)
        ),
        (10, 20),
        "{results:?}"
    );
    ada
}

/// The demonstration with a short lease: 300 ms, and spends that wait up to 5 s for their
/// lock.
pub const SHORT_LEASE_DEMO: &[&str] = &["--demo", "--lock-ttl", "300ms", "--lock-wait", "5s"];

/// The paused-holder fault: on a fresh account of 1000, a withdrawal of 700 pauses 1.2 s
/// inside its critical section (through `paused_on`), past its 300 ms lease; 100 ms in, the
/// next withdrawal of 700 on another ticket goes through `next_on`. The paused request is
/// answered 503 `lock-lost`. Returns the account, the paused request's ticket and the next
/// request's answer.
pub async fn the_next_holder_after_a_paused_one(
    paused_on: &TestApp,
    next_on: &TestApp,
) -> (TestAccount, String, (StatusCode, bool, Value)) {
    let ada = paused_on.create_account(1000, 0).await;
    let (paused_ticket, next_ticket) = (paused_on.ticket(&ada).await, paused_on.ticket(&ada).await);
    let paused = paused_on.spawn_withdrawal(
        &ada,
        &paused_ticket,
        700,
        &[("payonce-fault", "pause=1200ms")],
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let next = read(next_on.withdraw(&ada, &next_ticket, 700).await).await;
    assert_problem(
        paused.await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
        "lock-lost",
    )
    .await;
    (ada, paused_ticket, next)
}

/// The body of a response whose content type starts with `content_type`.
pub async fn text_of_type(response: Response, content_type: &str) -> String {
    let shown = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(shown.starts_with(content_type), "{shown}");
    response.text().await.expect("text")
}

/// A request sent for its JSON body.
pub trait SendForJson {
    /// Sends the request and reads its body as JSON.
    fn send_for_json<T: serde::de::DeserializeOwned>(self) -> impl Future<Output = T> + Send;
}

impl SendForJson for reqwest::RequestBuilder {
    async fn send_for_json<T: serde::de::DeserializeOwned>(self) -> T {
        self.send()
            .await
            .expect("request")
            .json()
            .await
            .expect("json")
    }
}

/// Status, replay header and JSON body of a response.
pub async fn read(response: Response) -> (StatusCode, bool, Value) {
    let status = response.status();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|value| value == "true");
    let body = response.json().await.unwrap_or(Value::Null);
    (status, replayed, body)
}

/// Asserts a 422 `invalid-request`.
pub async fn assert_invalid_request(response: Response) -> Value {
    assert_problem(
        response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid-request",
    )
    .await
}

/// Asserts a problem+json answer of this status and name.
pub async fn assert_problem(response: Response, status: StatusCode, name: &str) -> Value {
    assert_eq!(response.status(), status, "expected {status} {name}");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let retry_after = response.headers().get("retry-after").cloned();
    let body: Value = response.json().await.expect("a JSON body");
    assert_eq!(content_type, "application/problem+json", "{body}");
    assert!(
        body["type"]
            .as_str()
            .is_some_and(|kind| kind.ends_with(name)),
        "expected type ending {name}: {body}"
    );
    assert_eq!(body["status"], status.as_u16(), "{body}");
    assert!(
        body["title"].is_string() && body["detail"].is_string(),
        "{body}"
    );
    let stored_refusals = [
        "order-already-paid",
        "webhook-endpoint-disabled",
        "hold-not-held",
        "refund-exceeds-payment",
        "order-not-paid",
    ];
    if stored_refusals.contains(&name) {
        // A stored outcome, final: retrying changes nothing, so nothing says when to.
        assert!(retry_after.is_none(), "{name} with Retry-After");
    } else if status == StatusCode::CONFLICT || status == StatusCode::SERVICE_UNAVAILABLE {
        assert!(retry_after.is_some(), "{status} without Retry-After");
    }
    body
}

impl TestApp {
    /// How many rows `table` holds, read from the instance's database directly.
    pub async fn count(&self, table: &str) -> i64 {
        let query = format!("SELECT count(*) FROM {table}");
        if self.shared.backend == Backend::Embedded {
            // The embedded mode keeps its own file beside the test database's.
            let path = self.shared.database.url().trim_start_matches("sqlite:");
            let file = std::path::Path::new(path)
                .parent()
                .expect("a directory")
                .join("payonce.sqlite3");
            let mut connection = <sqlx::SqliteConnection as sqlx::Connection>::connect(&format!(
                "sqlite:{}",
                file.display()
            ))
            .await
            .expect("the embedded database");
            sqlx::query_scalar(sqlx::AssertSqlSafe(query))
                .fetch_one(&mut connection)
                .await
                .expect("a count")
        } else {
            let mut connection =
                <sqlx::PgConnection as sqlx::Connection>::connect(self.shared.database.url())
                    .await
                    .expect("the test database");
            sqlx::query_scalar(sqlx::AssertSqlSafe(query))
                .fetch_one(&mut connection)
                .await
                .expect("a count")
        }
    }
}
