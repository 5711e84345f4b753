//! A `payonce-bank` process for other programs' tests and tools (feature `test-support`):
//! the real binary on a free loopback port, killed when dropped — never the bank inside
//! the caller's own process, so what is tested is what is deployed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long the bank may take to say where it listens.
const PATIENCE: Duration = Duration::from_secs(30);

/// A running `payonce-bank`, with a store of its own.
#[derive(Debug)]
pub struct BankProcess {
    addr: SocketAddr,
    database_url: String,
    child: Child,
    /// Where its SQLite store lives; removed when this is dropped.
    _store: tempfile::TempDir,
}

impl BankProcess {
    /// Starts `binary` on `127.0.0.1:0` — the port it picks is read back from the
    /// `listening on ADDR` it prints — on a fresh SQLite store in a temporary directory,
    /// with `args` added (fault rates, `--slow-for`, `--demo-header`...).
    pub async fn start(binary: &Path, args: &[&str]) -> Result<Self, String> {
        let store =
            tempfile::tempdir().map_err(|error| format!("a directory for the store: {error}"))?;
        let database_url = format!("sqlite:{}", store.path().join("bank.db").display());
        let mut child = Command::new(binary)
            .args(["--addr", "127.0.0.1:0", "--database-url", &database_url])
            .args(args)
            .env("RUST_LOG", "warn")
            .env_remove("PAYONCE_BANK_DATABASE_URL")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| {
                format!(
                    "cannot start {} ({error}); build it with `cargo build -p bank`",
                    binary.display()
                )
            })?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .map_err(|_| "payonce-bank did not say where it listens in time".to_owned())?
            .map_err(|error| format!("payonce-bank's stdout: {error}"))?
            .ok_or("payonce-bank exited before it listened")?;
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|addr| addr.parse().ok())
            .ok_or_else(|| format!("payonce-bank printed {line:?}, not `listening on ADDR`"))?;
        // Whatever it prints later is read and dropped: a closed pipe would fail its writes.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self {
            addr,
            database_url,
            child,
            _store: store,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its store.
    pub fn database_url(&self) -> &str {
        &self.database_url
    }

    /// Kills it (SIGKILL): the bank is gone, mid-answer or not.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// The `payonce-bank` binary beside the running test's executable (`target/<profile>/`,
/// where cargo puts the workspace's binaries for its tests), built there first if a
/// narrower `cargo test` did not build it.
pub fn binary_for_tests() -> PathBuf {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("payonce-bank")))
        .unwrap_or_else(|| PathBuf::from("payonce-bank"));
    if !binary.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = std::process::Command::new(cargo)
            .args(["build", "-p", "bank", "--bin", "payonce-bank"])
            .status();
        if !built.is_ok_and(|status| status.success()) {
            eprintln!("could not build payonce-bank for the tests");
        }
    }
    binary
}
