//! payonce instances as child processes on free loopback ports: started, killed and
//! restarted, stopped and continued.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::MatrixError;

/// A child process, killed on drop, and the file its standard error goes to (deleted
/// with it).
#[derive(Debug)]
struct Process(Child, PathBuf);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.1);
        // Only a process not yet reaped: its pid may be another's by now.
        if matches!(self.0.try_wait(), Ok(None)) {
            // A stopped process dies of SIGKILL all the same; continue it anyway, so that
            // nothing is left stopped should the kill fail.
            let _ = Command::new("kill")
                .args(["-CONT", &self.0.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn free_port() -> Result<u16, MatrixError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|error| MatrixError::Setup(format!("no free port: {error}")))
}

/// Checks that `payonce` has the demonstration's strategies (the cargo feature `demo`):
/// without them every unsafe cell would be a column of 400s.
pub fn check_payonce(payonce: &Path) -> Result<(), MatrixError> {
    let version = Command::new(payonce)
        .arg("--version")
        .output()
        .map_err(|error| MatrixError::Setup(format!("{}: {error}", payonce.display())))?;
    if String::from_utf8_lossy(&version.stdout).contains("demo feature") {
        Ok(())
    } else {
        Err(MatrixError::Setup(format!(
            "{} is built without the demonstration's strategies: \
             cargo build --release -p api --features demo,all-locks",
            payonce.display()
        )))
    }
}

/// The environment every instance of the matrix shares: the ledger, the lock lease, a
/// namespace of its own, the demonstration mode.
pub fn base_environment(database_url: &str, lock_ttl: Duration) -> Vec<(String, String)> {
    let namespace = format!(
        "matrix-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    vec![
        ("DATABASE_URL".to_owned(), database_url.to_owned()),
        ("PAYONCE_REDIS_NAMESPACE".to_owned(), namespace),
        ("PAYONCE_DEMO".to_owned(), "true".to_owned()),
        (
            "PAYONCE_LOCK_TTL".to_owned(),
            format!("{}ms", lock_ttl.as_millis()),
        ),
        ("PAYONCE_LOCK_WAIT".to_owned(), "2s".to_owned()),
        ("RUST_LOG".to_owned(), "error".to_owned()),
    ]
}

/// The environment of an instance that pays out to the bank at `bank_url`: each call
/// bounded by `timeout`, each claim by `lease`, on a quick schedule (50 ms first backoff,
/// 500 ms at most, idle workers looking every 100 ms) so that a short run drains.
pub fn paying_out_to(bank_url: &str, timeout: Duration, lease: Duration) -> Vec<(String, String)> {
    let human = |duration: Duration| format!("{}ms", duration.as_millis());
    [
        ("PAYONCE_BANK_URL", bank_url.to_owned()),
        ("PAYONCE_BANK_TIMEOUT", human(timeout)),
        ("PAYONCE_PAYOUT_LEASE", human(lease)),
        ("PAYONCE_PAYOUT_RETRY_BASE", "50ms".to_owned()),
        ("PAYONCE_PAYOUT_RETRY_MAX", "500ms".to_owned()),
        ("PAYONCE_PAYOUT_POLL", "100ms".to_owned()),
    ]
    .map(|(name, value)| (name.to_owned(), value))
    .into()
}

/// Waits, at most `within`, until `instance` holds a claim on an outbox job of `kind`
/// (`payout` or `webhook`) it has not finished: a lease not run out on a job not done —
/// a call in flight, to kill it under. Whether it ever did: `true` if so.
pub async fn claims_held(
    database_url: &str,
    instance: &str,
    kind: &str,
    within: Duration,
) -> Result<bool, MatrixError> {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(database_url)
        .await
        .map_err(|error| MatrixError::Setup(format!("the ledger's database: {error}")))?;
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        let (held,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM outbox
             WHERE kind = $2 AND leased_by LIKE $1 AND done_at IS NULL AND lease_until > now()",
        )
        .bind(format!("{instance}/%"))
        .bind(kind)
        .fetch_one(&mut connection)
        .await
        .map_err(|error| MatrixError::Setup(format!("the ledger's outbox: {error}")))?;
        if held > 0 {
            return Ok(true);
        }
        sleep(Duration::from_millis(20)).await;
    }
    Ok(false)
}

/// payonce instances on free loopback ports, each with an environment of its own (and
/// nothing of this process's but `PATH` and `HOME`: a `REDIS_URL` here must not reach
/// them). Killed when dropped. Public so that tests can kill an instance under load too.
#[derive(Debug)]
pub struct Cluster {
    payonce: PathBuf,
    environments: Vec<Vec<(String, String)>>,
    ports: Vec<u16>,
    instances: Vec<Process>,
}

impl Cluster {
    /// Starts one instance per environment and waits until every one is ready.
    pub async fn start(
        payonce: &Path,
        environments: Vec<Vec<(String, String)>>,
    ) -> Result<Self, MatrixError> {
        let mut cluster = Self {
            payonce: payonce.to_owned(),
            environments,
            ports: Vec::new(),
            instances: Vec::new(),
        };
        for index in 0..cluster.environments.len() {
            let port = free_port()?;
            cluster.ports.push(port);
            let process = cluster.spawn(index)?;
            cluster.instances.push(process);
        }
        for index in 0..cluster.ports.len() {
            cluster.wait_ready(index).await?;
        }
        Ok(cluster)
    }

    fn spawn(&self, index: usize) -> Result<Process, MatrixError> {
        let port = self.ports[index];
        // Not a pipe: one nobody reads would fill and stall the instance. A file of each
        // start's own: the one it replaces deletes its file when it is dropped.
        let log = std::env::temp_dir().join(format!(
            "payonce-matrix-{port}-{:08x}.log",
            rand::random::<u32>()
        ));
        let stderr = std::fs::File::create(&log)
            .map_err(|error| MatrixError::Setup(format!("{}: {error}", log.display())))?;
        let mut command = Command::new(&self.payonce);
        command.env_clear();
        for name in ["PATH", "HOME"] {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command
            .envs(
                self.environments[index]
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_str())),
            )
            .env("PAYONCE_ADDR", format!("127.0.0.1:{port}"))
            .env("PAYONCE_INSTANCE", self.instance(index))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map(|child| Process(child, log))
            .map_err(|error| {
                MatrixError::Setup(format!(
                    "cannot start {} ({error}); build it with \
                     `cargo build --release -p api --features demo,all-locks` or pass --payonce",
                    self.payonce.display()
                ))
            })
    }

    async fn wait_ready(&mut self, index: usize) -> Result<(), MatrixError> {
        let port = self.ports[index];
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let ready = client
                .get(format!("http://127.0.0.1:{port}/readyz"))
                .send()
                .await;
            if ready.is_ok_and(|answer| answer.status().is_success()) {
                return Ok(());
            }
            // An instance that exited says why on its standard error.
            if let Ok(Some(_)) = self.instances[index].0.try_wait() {
                let why = std::fs::read_to_string(&self.instances[index].1).unwrap_or_default();
                return Err(MatrixError::Setup(format!(
                    "the instance on port {port} exited: {}",
                    why.lines().last().unwrap_or("no message").trim()
                )));
            }
            sleep(Duration::from_millis(50)).await;
        }
        Err(MatrixError::Setup(format!(
            "the instance on port {port} did not become ready"
        )))
    }

    /// The name an instance (an index into [`targets`](Self::targets)) goes by
    /// (`PAYONCE_INSTANCE`): its payout workers' leases carry it.
    pub fn instance(&self, index: usize) -> String {
        format!("matrix-{}", self.ports[index])
    }

    /// The instances' base URLs.
    pub fn targets(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|port| format!("http://127.0.0.1:{port}"))
            .collect()
    }

    /// SIGKILL the instance (an index into [`targets`](Self::targets)), wait `down_for`,
    /// start it again on the same port, and wait until it is ready.
    pub async fn kill_and_restart(
        &mut self,
        index: usize,
        down_for: Duration,
    ) -> Result<(), MatrixError> {
        if let Some(process) = self.instances.get_mut(index) {
            let _ = process.0.kill();
            let _ = process.0.wait();
        }
        sleep(down_for).await;
        self.instances[index] = self.spawn(index)?;
        self.wait_ready(index).await
    }

    /// Stops the instance (an index into [`targets`](Self::targets)) whole with SIGSTOP
    /// for `stopped_for`, then continues it with SIGCONT.
    pub async fn stop_for(&self, index: usize, stopped_for: Duration) -> Result<(), MatrixError> {
        let pid = self.instances[index].0.id().to_string();
        let signal = |name: &str| -> Result<(), MatrixError> {
            let sent = Command::new("kill")
                .args([name, &pid])
                .status()
                .map_err(|error| MatrixError::Setup(format!("kill {name}: {error}")))?;
            if sent.success() {
                Ok(())
            } else {
                Err(MatrixError::Setup(format!("kill {name} {pid} failed")))
            }
        };
        signal("-STOP")?;
        sleep(stopped_for).await;
        signal("-CONT")
    }
}
