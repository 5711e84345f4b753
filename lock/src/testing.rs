//! Test support: a private `redis-server` on a free loopback port, for tests that must
//! restart, flush or count commands on a Redis nobody else uses.

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
        let started = Instant::now();
        while started.elapsed() < limit {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(std::io::Error::other(format!(
            "redis-server on port {} did not start",
            self.port
        )))
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

/// A loopback port nothing listens on right now (bound, then released).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
