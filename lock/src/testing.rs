//! Test support: private servers on free loopback ports — `redis-server`, a Redis Cluster
//! ([`RedisCluster`], `testing/redis_cluster.rs`), a Hazelcast cluster
//! ([`HazelcastCluster`], `testing/hazelcast.rs`), ZooKeeper, etcd, memcached, MariaDB
//! (PostgreSQL's is the ledger's) — for tests (and the lock services × faults matrix) that
//! must restart, wipe, pause, fail over or count the commands of a server nobody else
//! uses; and a loopback [`Proxy`] that partitions its clients from a server.

pub mod etcd_operator;
mod hazelcast;
mod redis_cluster;
mod redis_sentinel;

pub use hazelcast::{HazelcastCluster, hazelcast_jar};
pub use redis_cluster::RedisCluster;
pub use redis_sentinel::RedisSentinels;

/// The Redis Cluster hash slot of `key` (what `CLUSTER KEYSLOT` answers).
pub fn slot_of(key: &str) -> u16 {
    crate::redis_link::slot(key)
}

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` child process, killed on drop. Keeps nothing on disk.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers.
    pub fn start() -> std::io::Result<Self> {
        let port = free_port()?;
        let server = Self {
            child: spawn(port)?,
            port,
        };
        server.wait_until_up(Duration::from_secs(10))?;
        Ok(server)
    }

    /// Kills the server (its data is gone); `restart` brings one back on the same port.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the server if it runs and starts a fresh one (empty, like a restart without
    /// persistence) on the same port.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.stop();
        self.child = spawn(self.port)?;
        self.wait_until_up(Duration::from_secs(10))
    }

    /// Freezes the server (SIGSTOP): connections stay open and nothing answers, as with a
    /// paused VM or a partition. `resume` thaws it.
    pub fn pause(&self) -> std::io::Result<()> {
        self.signal("-STOP")
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) -> std::io::Result<()> {
        self.signal("-CONT")
    }

    fn signal(&self, signal: &str) -> std::io::Result<()> {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("kill {signal} failed")))
        }
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn wait_until_up(&self, limit: Duration) -> std::io::Result<()> {
        wait_until_up(
            "redis-server",
            self.port,
            limit,
            Duration::from_millis(10),
            listens,
        )
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A paused server must be thawed to die promptly on its own terms; SIGKILL works
        // either way, but the wait below should not depend on it.
        let _ = self.resume();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(port: u16) -> std::io::Result<Child> {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// One `redis-server` of a private cluster or Sentinel setup, in a directory of its own:
/// killed and started again, with the same arguments, as a test's faults need.
#[derive(Debug)]
struct RedisNode {
    port: u16,
    /// What it is started with, each time.
    args: Vec<String>,
    dir: std::path::PathBuf,
    /// `None` once killed.
    child: Option<Child>,
}

impl RedisNode {
    fn spawn(&mut self) -> std::io::Result<()> {
        let child = Command::new("redis-server")
            .current_dir(&self.dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What `redis-cli -p <port> <args>` printed, trimmed.
fn redis_cli(port: u16, args: &[&str]) -> std::io::Result<String> {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Polls `done` every 50 ms until it says yes, for at most `limit`.
fn wait_for(
    limit: Duration,
    mut done: impl FnMut() -> std::io::Result<bool>,
) -> std::io::Result<()> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if done().unwrap_or(false) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(std::io::Error::other(format!(
        "the servers did not settle within {limit:?}"
    )))
}

/// Polls `answers(port)` every `every` until it says yes, for at most `limit`: a server
/// just started is up. `what` names it in the error.
fn wait_until_up(
    what: &str,
    port: u16,
    limit: Duration,
    every: Duration,
    answers: impl Fn(u16) -> bool,
) -> std::io::Result<()> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if answers(port) {
            return Ok(());
        }
        std::thread::sleep(every);
    }
    Err(std::io::Error::other(format!(
        "{what} on port {port} did not start"
    )))
}

/// Something accepts connections on the loopback `port`.
fn listens(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// The MariaDB on the loopback `port` answers a query.
fn mariadb_answers(port: u16) -> bool {
    Command::new("mysql")
        .args(["-h", "127.0.0.1", "-P", &port.to_string(), "-u", "root"])
        .args(["-e", "select 1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A loopback port nothing listens on right now (bound, then released).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A ZooKeeper server of the test's own (Debian's `zookeeper` package), on a free loopback
/// port with its data in a temporary directory: for tests that restart it or end its
/// sessions, which the shared one must never be. Short ticks, so sessions may be as
/// short as 400 ms. Killed on drop.
#[derive(Debug)]
pub struct ZooKeeperServer {
    child: Child,
    port: u16,
    config: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl ZooKeeperServer {
    /// Starts one and waits until it answers.
    pub fn start() -> std::io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("payonce-zk-").tempdir()?;
        let port = free_port()?;
        let config = dir.path().join("zoo.cfg");
        std::fs::write(
            &config,
            format!(
                "tickTime=200\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\nminSessionTimeout=400\nmaxSessionTimeout=60000\n\
                 4lw.commands.whitelist=ruok\n",
                dir.path().join("data").display()
            ),
        )?;
        let child = spawn_zookeeper(&config, dir.path())?;
        let server = Self {
            child,
            port,
            config,
            _dir: dir,
        };
        server.wait_until_up(Duration::from_secs(30))?;
        Ok(server)
    }

    /// Kills the server; its data stays, as on a real restart.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the server if it runs and starts it again on the same port and data.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.stop();
        let dir = self
            .config
            .parent()
            .ok_or_else(|| std::io::Error::other("no data directory"))?;
        self.child = spawn_zookeeper(&self.config, dir)?;
        self.wait_until_up(Duration::from_secs(30))
    }

    /// Kills the server, deletes its data — every node, every session, the zxid — and
    /// starts it again empty on the same port: an ensemble rebuilt from nothing.
    pub fn wipe(&mut self) -> std::io::Result<()> {
        self.stop();
        let dir = self
            .config
            .parent()
            .ok_or_else(|| std::io::Error::other("no data directory"))?;
        std::fs::remove_dir_all(dir.join("data"))?;
        self.child = spawn_zookeeper(&self.config, dir)?;
        self.wait_until_up(Duration::from_secs(30))
    }

    /// `zk://127.0.0.1:<port><root>`.
    pub fn url(&self, root: &str) -> String {
        format!("zk://127.0.0.1:{}{root}", self.port)
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn wait_until_up(&self, limit: Duration) -> std::io::Result<()> {
        let every = Duration::from_millis(50);
        wait_until_up("ZooKeeper", self.port, limit, every, zookeeper_answers)
    }
}

impl Drop for ZooKeeperServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn spawn_zookeeper(config: &std::path::Path, logs: &std::path::Path) -> std::io::Result<Child> {
    // start-foreground execs the JVM, so the child is the server itself.
    Command::new("/usr/share/zookeeper/bin/zkServer.sh")
        .arg("start-foreground")
        .arg(config)
        .env("ZOO_LOG_DIR", logs)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// Whether a ZooKeeper server on `port` says it is fine (`ruok` → `imok`).
fn zookeeper_answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut socket) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = socket.set_read_timeout(Some(Duration::from_secs(1)));
    let mut answer = String::new();
    socket.write_all(b"ruok").is_ok()
        && socket.read_to_string(&mut answer).is_ok()
        && answer == "imok"
}

/// An etcd member of the test's own (Debian's `etcd-server` package), on free loopback
/// ports with its data in a temporary directory: for tests that restart it, which the
/// shared one must never be. Killed on drop.
#[derive(Debug)]
pub struct EtcdServer {
    child: Child,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
}

impl EtcdServer {
    /// Starts one and waits until it answers.
    pub fn start() -> std::io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("payonce-etcd-").tempdir()?;
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let child = spawn_etcd(dir.path(), client_port, peer_port)?;
        let server = Self {
            child,
            client_port,
            peer_port,
            dir,
        };
        server.wait_until_up(Duration::from_secs(30))?;
        Ok(server)
    }

    /// Kills the member; its data stays, as on a real restart.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the member if it runs and starts it again on the same ports and data.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.stop();
        self.child = spawn_etcd(self.dir.path(), self.client_port, self.peer_port)?;
        self.wait_until_up(Duration::from_secs(30))
    }

    /// Kills the member, deletes its data — every key, every lease, the revision — and
    /// starts it again empty on the same ports: a cluster rebuilt from nothing.
    pub fn wipe(&mut self) -> std::io::Result<()> {
        self.stop();
        std::fs::remove_dir_all(self.dir.path().join("data"))?;
        self.child = spawn_etcd(self.dir.path(), self.client_port, self.peer_port)?;
        self.wait_until_up(Duration::from_secs(30))
    }

    /// `etcd://127.0.0.1:<port><root>`.
    pub fn url(&self, root: &str) -> String {
        format!("etcd://127.0.0.1:{}{root}", self.client_port)
    }

    /// The loopback port clients connect to.
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// `http://127.0.0.1:<port>`, as etcd clients take it.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn wait_until_up(&self, limit: Duration) -> std::io::Result<()> {
        let every = Duration::from_millis(50);
        wait_until_up("etcd", self.client_port, limit, every, etcd_is_healthy)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn spawn_etcd(dir: &std::path::Path, client_port: u16, peer_port: u16) -> std::io::Result<Child> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    Command::new("etcd")
        .args(["--name", "test", "--data-dir"])
        .arg(dir.join("data"))
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("test={peer}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// Whether the etcd member on `port` reports itself healthy (`GET /health`).
fn etcd_is_healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut socket) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = socket.set_read_timeout(Some(Duration::from_secs(1)));
    let mut answer = String::new();
    socket
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_ok()
        && socket.read_to_string(&mut answer).is_ok()
        && answer.contains("\"health\":\"true\"")
}

/// A `memcached` of the test's own (Debian's `memcached` package) on a free loopback
/// port, for tests that restart it — which loses everything, as memcached always does.
/// Killed on drop.
#[derive(Debug)]
pub struct MemcachedServer {
    child: Child,
    port: u16,
}

impl MemcachedServer {
    /// Starts one and waits until it answers.
    pub fn start() -> std::io::Result<Self> {
        let port = free_port()?;
        let server = Self {
            child: spawn_memcached(port)?,
            port,
        };
        server.wait_until_up(Duration::from_secs(10))?;
        Ok(server)
    }

    /// Kills the server and starts an empty one on the same port.
    pub fn restart(&mut self) -> std::io::Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn_memcached(self.port)?;
        self.wait_until_up(Duration::from_secs(10))
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `memcache://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("memcache://127.0.0.1:{}", self.port)
    }

    fn wait_until_up(&self, limit: Duration) -> std::io::Result<()> {
        wait_until_up(
            "memcached",
            self.port,
            limit,
            Duration::from_millis(10),
            listens,
        )
    }
}

impl Drop for MemcachedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_memcached(port: u16) -> std::io::Result<Child> {
    let mut command = Command::new("memcached");
    command.args([
        "-l",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-m",
        "16",
    ]);
    // memcached refuses to run as root unless told whom to run as.
    if runs_as_root() {
        command.args(["-u", "root"]);
    }
    command.stdout(Stdio::null()).stderr(Stdio::null()).spawn()
}

/// Whether this process runs as root (uid 0), read from /proc rather than through libc.
fn runs_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find(|line| line.starts_with("Uid:"))
            .and_then(|line| line.split_whitespace().nth(1))
            == Some("0")
    })
}

/// A MariaDB server of the caller's own (Debian's `mariadb-server` package): a fresh data
/// directory (`mariadb-install-db`) in a temporary directory, on a free loopback port,
/// `root` without a password, the `payonce_locks` database created. For tests and
/// demonstrations that restart the server. Killed on drop.
#[derive(Debug)]
pub struct MariaDbServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl MariaDbServer {
    /// Creates the data directory, starts the server and waits until it answers.
    pub fn start() -> std::io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("payonce-mariadb-")
            .tempdir()?;
        let installed = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.path().join("data").display()))
            .args([
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if !installed.success() {
            return Err(std::io::Error::other("mariadb-install-db failed"));
        }
        let port = free_port()?;
        let server = Self {
            child: spawn_mariadb(dir.path(), port)?,
            port,
            dir,
        };
        server.wait_until_up(Duration::from_secs(30))?;
        let created = Command::new("mysql")
            .args(["-h", "127.0.0.1", "-P", &port.to_string(), "-u", "root"])
            .args(["-e", "create database if not exists payonce_locks"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if !created.success() {
            return Err(std::io::Error::other(
                "create database payonce_locks failed",
            ));
        }
        Ok(server)
    }

    /// Kills the server (SIGKILL: every connection, transaction and row lock ends;
    /// committed data stays) and starts it again on the same port and data.
    pub fn restart(&mut self) -> std::io::Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn_mariadb(self.dir.path(), self.port)?;
        self.wait_until_up(Duration::from_secs(30))
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:<port>/payonce_locks`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/payonce_locks", self.port)
    }

    fn wait_until_up(&self, limit: Duration) -> std::io::Result<()> {
        let every = Duration::from_millis(100);
        wait_until_up("MariaDB", self.port, limit, every, mariadb_answers)
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_mariadb(dir: &std::path::Path, port: u16) -> std::io::Result<Child> {
    Command::new("mariadbd")
        .arg("--no-defaults")
        .arg(format!("--datadir={}", dir.join("data").display()))
        .arg(format!("--socket={}", dir.join("mariadb.sock").display()))
        .arg(format!("--port={port}"))
        .args([
            "--bind-address=127.0.0.1",
            "--user=root",
            "--skip-log-bin",
            "--innodb-flush-log-at-trx-commit=0",
            "--max-connections=300",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// A loopback TCP proxy that can be cut, as a network partition between its clients and
/// one server: while whole it forwards both ways; [`cut`](Self::cut) closes the server's
/// side of every connection at once (the server sees its peer gone, as its keepalive
/// would eventually tell it) and leaves the client's side open and silent — what goes in is
/// lost, nothing comes back, and new connections are taken and held the same way; until
/// [`heal`](Self::heal) closes those client sides (the client's next read sees the close)
/// and forwards again. Needs a Tokio runtime; stops with it.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    cut: tokio::sync::watch::Sender<bool>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding to `upstream` on loopback.
    pub async fn start(upstream: u16) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (cut, cuts) = tokio::sync::watch::channel(false);
        let accepting = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut cuts = cuts.clone();
                tokio::spawn(async move {
                    if !*cuts.borrow() {
                        let Ok(mut outbound) =
                            tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                        else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
                            _ = cuts.wait_for(|cut| *cut) => drop(outbound),
                        }
                    }
                    // Cut: the client's side stays open, unanswered, until the heal.
                    let _ = cuts.wait_for(|cut| !*cut).await;
                });
            }
        });
        Ok(Self {
            port,
            cut,
            accepting,
        })
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Partitions the clients from the server (see the type's documentation).
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Ends the partition: held client connections are closed, new ones forwarded.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Proxy {
    /// Stops listening; the connections' tasks end with the watch they wait on.
    fn drop(&mut self) {
        self.accepting.abort();
    }
}
