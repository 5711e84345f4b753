//! A Hazelcast cluster of the test's own: three members (Hazelcast 5.4.0, the jar
//! `scripts/services.sh` fetches), each a JVM on a free loopback port, configured by
//! `deploy/hazelcast/member.yaml` as the shared cluster is, under a cluster name of its
//! own — for tests that kill, restart, pause or cut off a member, which the shared one
//! must never be. Killed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// Held while members start: a starting JVM takes both cores for seconds, and three
/// clusters of tests starting at once would starve the other servers of the same test
/// run (a Redis Cluster's failover, timed by its nodes' heartbeats, once missed its 30 s).
static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_start_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    STARTING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A private three-member cluster with the CP Subsystem.
#[derive(Debug)]
pub struct HazelcastCluster {
    members: Vec<Member>,
    name: String,
    session_ttl: Duration,
    dir: tempfile::TempDir,
}

#[derive(Debug)]
struct Member {
    port: u16,
    child: Option<Child>,
}

/// Where the Hazelcast jar is: `$HAZELCAST_JAR`, else where `scripts/services.sh` puts it.
pub fn hazelcast_jar() -> PathBuf {
    std::env::var_os("HAZELCAST_JAR").map_or_else(
        || PathBuf::from("/var/lib/payonce/hazelcast/hazelcast-5.4.0.jar"),
        PathBuf::from,
    )
}

/// The member configuration every cluster of payonce's uses.
fn member_config() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/hazelcast/member.yaml")
}

impl HazelcastCluster {
    /// Starts three members whose CP sessions live `session_ttl` (whole seconds, at least
    /// 2) past their last heartbeat, and waits until the CP Subsystem has formed.
    pub fn start(session_ttl: Duration) -> std::io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("payonce-hz-").tempdir()?;
        let mut members = Vec::new();
        for _ in 0..3 {
            let port = loop {
                let port = free_port()?;
                if members.iter().all(|member: &Member| member.port != port) {
                    break port;
                }
            };
            members.push(Member { port, child: None });
        }
        let mut cluster = Self {
            members,
            name: format!("test-{:016x}", rand::random::<u64>()),
            session_ttl: session_ttl.max(Duration::from_secs(2)),
            dir,
        };
        let _starting = one_start_at_a_time();
        for index in 0..3 {
            cluster.spawn(index)?;
        }
        cluster.wait_until_cp_formed(Duration::from_secs(120))?;
        Ok(cluster)
    }

    /// `hazelcast://127.0.0.1:<a>,…/default?cluster=<name>`, every member.
    pub fn url(&self) -> String {
        let ports: Vec<u16> = self.members.iter().map(|member| member.port).collect();
        self.url_of(&ports)
    }

    /// The URL naming only these ports (a proxy's, say) as the members.
    pub fn url_of(&self, ports: &[u16]) -> String {
        let members: Vec<String> = ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!(
            "hazelcast://{}/default?cluster={}",
            members.join(","),
            self.name
        )
    }

    /// The member `index`'s port.
    pub fn port(&self, index: usize) -> u16 {
        self.members[index].port
    }

    /// How long a CP session outlives its last heartbeat here.
    pub fn session_ttl(&self) -> Duration {
        self.session_ttl
    }

    /// Kills member `index` (SIGKILL): its in-memory CP state goes with it.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = signal(&child, "-CONT");
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `index` again on its port, and waits until it answers. Without CP
    /// persistence (Enterprise only) it joins as a new member, not as the CP member it
    /// was: the CP group goes on with the other two.
    pub fn restart(&mut self, index: usize) -> std::io::Result<()> {
        self.kill(index);
        let _starting = one_start_at_a_time();
        self.spawn(index)?;
        let port = self.members[index].port;
        let deadline = Instant::now() + Duration::from_secs(90);
        while Instant::now() < deadline {
            if http_get(port, "/hazelcast/health/ready").is_some_and(|(status, _)| status == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(std::io::Error::other(format!(
            "Hazelcast member on {port} is not ready after a restart"
        )))
    }

    /// Kills every member and starts them all again: a cluster rebuilt from nothing,
    /// every CP session, lock, fence and counter gone (Community Edition keeps none).
    pub fn wipe(&mut self) -> std::io::Result<()> {
        for index in 0..self.members.len() {
            self.kill(index);
        }
        let _starting = one_start_at_a_time();
        for index in 0..self.members.len() {
            self.spawn(index)?;
        }
        self.wait_until_cp_formed(Duration::from_secs(120))
    }

    /// Freezes member `index` (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self, index: usize) -> std::io::Result<()> {
        self.signal(index, "-STOP")
    }

    /// Thaws member `index` (SIGCONT).
    pub fn resume(&self, index: usize) -> std::io::Result<()> {
        self.signal(index, "-CONT")
    }

    fn signal(&self, index: usize, name: &str) -> std::io::Result<()> {
        match &self.members[index].child {
            Some(child) => signal(child, name),
            None => Ok(()),
        }
    }

    fn spawn(&mut self, index: usize) -> std::io::Result<()> {
        let port = self.members[index].port;
        let members: Vec<String> = self
            .members
            .iter()
            .map(|member| format!("127.0.0.1:{}", member.port))
            .collect();
        let log = std::fs::File::create(self.dir.path().join(format!("member-{port}.log")))?;
        let child = Command::new("java")
            // A small heap, the fast-starting compiler, and one processor's worth of
            // compiler and collector threads: a test's cluster lives seconds, and shares
            // the machine with the rest of the test run.
            .args([
                "-Xms64m",
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-XX:ActiveProcessorCount=1",
            ])
            .arg(format!("-Dhazelcast.config={}", member_config().display()))
            .arg(format!("-Dpayonce.cluster={}", self.name))
            .arg(format!("-Dpayonce.port={port}"))
            .arg(format!("-Dpayonce.members={}", members.join(",")))
            .arg(format!(
                "-Dpayonce.session-ttl={}",
                self.session_ttl.as_secs()
            ))
            .arg("-cp")
            .arg(hazelcast_jar())
            .arg("com.hazelcast.core.server.HazelcastMemberStarter")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.members[index].child = Some(child);
        Ok(())
    }

    /// Waits until a member lists three CP members: the CP Subsystem formed.
    fn wait_until_cp_formed(&self, limit: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            for member in &self.members {
                if let Some((200, body)) =
                    http_get(member.port, "/hazelcast/rest/cp-subsystem/members")
                    && body.matches("\"uuid\"").count() >= 3
                {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Err(std::io::Error::other(format!(
            "the Hazelcast CP Subsystem did not form within {limit:?} (logs in {})",
            self.dir.path().display()
        )))
    }
}

impl Drop for HazelcastCluster {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            self.kill(index);
        }
    }
}

fn signal(child: &Child, name: &str) -> std::io::Result<()> {
    let status = Command::new("kill")
        .args([name, &child.id().to_string()])
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("kill {name} failed")))
    }
}

/// A GET of a member's REST endpoint (its client port speaks HTTP too): the status and
/// body, or `None` when it does not answer.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    socket.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        socket,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    let _ = socket.read_to_string(&mut answer);
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())?;
    Some((status, body))
}
