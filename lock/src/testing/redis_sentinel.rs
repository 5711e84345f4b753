//! Redis Sentinel of the test's own: one master and two replicas (private `redis-server`s,
//! nothing on disk), watched by three sentinels (`redis-server --sentinel`, the program
//! Debian's `redis-sentinel` package runs) that fail the master over a second after it
//! stops answering. For tests that kill the master, which shared servers must never see.

use std::time::{Duration, Instant};

use super::{RedisNode, redis_cli, wait_for};

/// The master's name the sentinels watch.
pub const MASTER_NAME: &str = "payonce";

/// Three data nodes and three sentinels, killed on drop.
#[derive(Debug)]
pub struct RedisSentinels {
    nodes: Vec<RedisNode>,
    sentinels: Vec<RedisNode>,
    _dir: tempfile::TempDir,
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for node in self.nodes.iter_mut().chain(&mut self.sentinels) {
            node.kill();
        }
    }
}

impl RedisSentinels {
    /// Starts the master, its two replicas and three sentinels, and waits until every
    /// replica is in sync and every sentinel knows the master, both replicas and the
    /// other two sentinels.
    pub fn start() -> std::io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("payonce-redis-sentinel-")
            .tempdir()?;
        let ports: Vec<u16> = (0..6)
            .map(|_| super::free_port())
            .collect::<std::io::Result<_>>()?;
        let master = ports[0];
        let mut nodes = Vec::new();
        for (index, &port) in ports[..3].iter().enumerate() {
            let mut args: Vec<String> = [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ]
            .map(str::to_owned)
            .to_vec();
            if index > 0 {
                args.extend(["--replicaof".into(), "127.0.0.1".into(), master.to_string()]);
            }
            let node_dir = dir.path().join(format!("node-{port}"));
            std::fs::create_dir(&node_dir)?;
            nodes.push(RedisNode {
                port,
                args,
                dir: node_dir,
                child: None,
            });
        }
        let mut sentinels = Vec::new();
        for &port in &ports[3..] {
            let node_dir = dir.path().join(format!("sentinel-{port}"));
            std::fs::create_dir(&node_dir)?;
            // A master is down after 3 s without an answer: with 1 s, a loaded machine (the
            // whole lock suite on two cores) starved a healthy master that long and the
            // sentinels failed over again in the middle of a test.
            let config = node_dir.join("sentinel.conf");
            std::fs::write(
                &config,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 3000\n\
                     sentinel failover-timeout {MASTER_NAME} 5000\n\
                     sentinel parallel-syncs {MASTER_NAME} 2\n",
                    dir = node_dir.display()
                ),
            )?;
            sentinels.push(RedisNode {
                port,
                args: vec![config.display().to_string(), "--sentinel".into()],
                dir: node_dir,
                child: None,
            });
        }
        let mut setup = Self {
            nodes,
            sentinels,
            _dir: dir,
        };
        for node in setup.nodes.iter_mut().chain(&mut setup.sentinels) {
            node.spawn()?;
        }
        setup.wait_until_settled(Duration::from_secs(30))?;
        Ok(setup)
    }

    /// `redis-sentinel://127.0.0.1:<port>,…/payonce`: the sentinels and the master's name.
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|sentinel| format!("127.0.0.1:{}", sentinel.port))
            .collect();
        format!("redis-sentinel://{}/{MASTER_NAME}", sentinels.join(","))
    }

    /// The port of the master the sentinels name now (as the first live one says).
    pub fn master(&self) -> std::io::Result<u16> {
        let sentinel = self
            .sentinels
            .iter()
            .find(|sentinel| sentinel.child.is_some())
            .ok_or_else(|| std::io::Error::other("every sentinel is down"))?;
        let answer = redis_cli(
            sentinel.port,
            &["SENTINEL", "get-master-addr-by-name", MASTER_NAME],
        )?;
        answer
            .lines()
            .nth(1)
            .and_then(|port| port.trim().parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no master named: {answer:?}")))
    }

    /// Waits until the replica of the master has every write the master made so far.
    pub fn wait_replicated(&self, limit: Duration) -> std::io::Result<()> {
        let master = self.master()?;
        wait_for(limit, || {
            let info = redis_cli(master, &["INFO", "replication"])?;
            let offset = info
                .lines()
                .find_map(|line| line.strip_prefix("master_repl_offset:"))
                .map(str::trim);
            let replicas: Vec<&str> = info
                .lines()
                .filter(|line| line.starts_with("slave") && line.contains("state=online"))
                .filter_map(|line| {
                    line.split(',')
                        .find_map(|part| part.strip_prefix("offset="))
                })
                .collect();
            Ok(!replicas.is_empty() && replicas.iter().all(|replica| Some(*replica) == offset))
        })
    }

    /// Kills the master with SIGKILL (what it had not replicated is lost) and waits until
    /// the sentinels have promoted a replica and it takes writes; returns how long that
    /// took.
    pub fn fail_over(&mut self, limit: Duration) -> std::io::Result<Duration> {
        let old = self.master()?;
        if let Some(node) = self.nodes.iter_mut().find(|node| node.port == old) {
            node.kill();
        }
        let killed_at = Instant::now();
        wait_for(limit, || {
            let new = self.master()?;
            Ok(new != old && redis_cli(new, &["ROLE"])?.starts_with("master"))
        })?;
        Ok(killed_at.elapsed())
    }

    /// Starts the killed data node again, empty (no persistence), as a replica of the new
    /// master — as an operator would — and waits until it is in sync. (Left to come back
    /// as the master it was, it waits for the sentinels to convert it, which they do only
    /// after watching it for several of their 10 s rounds: too slow and too variable for a
    /// test's bound.)
    pub fn restart_killed(&mut self, limit: Duration) -> std::io::Result<()> {
        let master = self.master()?;
        for node in self.nodes.iter_mut().filter(|node| node.child.is_none()) {
            if let Some(at) = node.args.iter().position(|arg| arg == "--replicaof") {
                node.args.drain(at..at + 3);
            }
            node.args
                .extend(["--replicaof".into(), "127.0.0.1".into(), master.to_string()]);
            node.spawn()?;
        }
        // The master the sentinels name, asked afresh each time: on a loaded machine they
        // may fail over once more (a master that did not answer for their 3 s), and then
        // reconfigure every node to follow the new one — the one named at the restart
        // would never see its two replicas again.
        wait_for(limit, || {
            let info = redis_cli(self.master()?, &["INFO", "replication"])?;
            Ok(info.contains("role:master")
                && info.contains("connected_slaves:2")
                && info
                    .lines()
                    .filter(|line| line.starts_with("slave"))
                    .all(|line| line.contains("state=online")))
        })
    }

    fn wait_until_settled(&self, limit: Duration) -> std::io::Result<()> {
        let master = self.nodes[0].port;
        wait_for(limit, || {
            let info = redis_cli(master, &["INFO", "replication"])?;
            if !info.contains("connected_slaves:2") {
                return Ok(false);
            }
            for sentinel in &self.sentinels {
                let known = redis_cli(sentinel.port, &["SENTINEL", "master", MASTER_NAME])?;
                let field = |name: &str| {
                    let mut lines = known.lines();
                    lines.find(|line| line.trim() == name)?;
                    lines.next().map(|value| value.trim().to_owned())
                };
                if field("num-slaves").as_deref() != Some("2")
                    || field("num-other-sentinels").as_deref() != Some("2")
                {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }
}
