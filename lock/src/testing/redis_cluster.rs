//! A Redis Cluster of the test's own: six private `redis-server`s on loopback (three
//! masters, each with a replica), joined by `redis-cli --cluster create`, keeping nothing
//! on disk but their cluster configuration. For tests that kill a master and watch its
//! replica take over, which a shared cluster must never see.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{RedisNode, redis_cli, wait_for};

use crate::redis_link::slot;

/// How long a master may be unreachable before the cluster fails it over. Short, so a
/// test sees the failover within a few seconds (a real cluster uses 15 s).
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// Six nodes (three masters, three replicas), killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisNode>,
    _dir: tempfile::TempDir,
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

impl RedisCluster {
    /// Starts six nodes on free ports (each with its cluster-bus port, 10000 above, free
    /// too), creates the cluster, and waits until every slot is served and every replica
    /// has synchronised with its master.
    pub fn start() -> std::io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("payonce-redis-cluster-")
            .tempdir()?;
        let mut nodes = Vec::new();
        for port in cluster_ports(6)? {
            let node_dir = dir.path().join(port.to_string());
            std::fs::create_dir(&node_dir)?;
            let mut node = RedisNode {
                port,
                args: [
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    &NODE_TIMEOUT.as_millis().to_string(),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--daemonize",
                    "no",
                ]
                .map(str::to_owned)
                .to_vec(),
                dir: node_dir,
                child: None,
            };
            node.spawn()?;
            nodes.push(node);
        }
        let cluster = Self { nodes, _dir: dir };
        for node in &cluster.nodes {
            wait_for(Duration::from_secs(10), || {
                Ok(redis_cli(node.port, &["PING"])? == "PONG")
            })?;
        }
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if !created.success() {
            return Err(std::io::Error::other("redis-cli --cluster create failed"));
        }
        cluster.wait_until_healthy(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// `redis-cluster://127.0.0.1:<port>,…`: every node, as a client would be configured.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!("redis-cluster://{}", nodes.join(","))
    }

    /// The port of the master that serves `key` now.
    pub fn master_of(&self, key: &str) -> std::io::Result<u16> {
        let wanted = slot(key);
        let view = self.topology()?;
        view.iter()
            .find(|node| {
                node.master
                    && !node.failed
                    && node
                        .slots
                        .iter()
                        .any(|&(from, to)| (from..=to).contains(&wanted))
            })
            .map(|node| node.port)
            .ok_or_else(|| std::io::Error::other(format!("no live master serves slot {wanted}")))
    }

    /// The ports of the live masters that serve slots.
    pub fn masters(&self) -> std::io::Result<Vec<u16>> {
        Ok(self
            .topology()?
            .into_iter()
            .filter(|node| node.master && !node.failed && !node.slots.is_empty())
            .map(|node| node.port)
            .collect())
    }

    /// Moves `slot` from the master on `from` to the master on `to`, as `redis-cli
    /// --cluster reshard` does, slowly — the slot stays half-moved for a while and its
    /// keys go one at a time — so clients meet ASK, TRYAGAIN and then MOVED on the way.
    pub fn move_slot(&self, slot: u16, from: u16, to: u16) -> std::io::Result<()> {
        let slot_arg = slot.to_string();
        let (from_id, to_id) = (node_id(from)?, node_id(to)?);
        cli_ok(
            to,
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id],
        )?;
        cli_ok(
            from,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id],
        )?;
        std::thread::sleep(Duration::from_millis(300));
        loop {
            let keys = redis_cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot_arg, "1"])?;
            let Some(key) = keys.lines().next().filter(|key| !key.is_empty()) else {
                break;
            };
            let to_port = to.to_string();
            cli_ok(
                from,
                &[
                    "MIGRATE",
                    "127.0.0.1",
                    &to_port,
                    key,
                    "0",
                    "5000",
                    "REPLACE",
                ],
            )?;
            std::thread::sleep(Duration::from_millis(100));
        }
        for node in self.nodes.iter().filter(|node| node.child.is_some()) {
            // Every node learns the new owner (the two involved first).
            let _ = redis_cli(
                node.port,
                &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id],
            );
        }
        cli_ok(to, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id])?;
        cli_ok(from, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id])?;
        self.wait_until_healthy(Duration::from_secs(10))
    }

    /// Waits until the replica of the master on `port` has every write the master made so
    /// far (their replication offsets agree).
    pub fn wait_replicated(&self, port: u16, limit: Duration) -> std::io::Result<()> {
        wait_for(limit, || {
            let info = redis_cli(port, &["INFO", "replication"])?;
            let field = |name: &str| {
                info.lines()
                    .find_map(|line| line.strip_prefix(name))
                    .map(str::to_owned)
            };
            let (Some(master), Some(replica)) = (field("master_repl_offset:"), field("slave0:"))
            else {
                return Ok(false);
            };
            // slave0:ip=…,port=…,state=online,offset=<n>,lag=…
            let replica_offset = replica
                .split(',')
                .find_map(|part| part.strip_prefix("offset="))
                .map(str::to_owned);
            Ok(replica_offset.as_deref() == Some(master.trim()))
        })
    }

    /// Kills the master on `port` with SIGKILL (what it had not replicated is lost) and
    /// waits until its replica serves its slots; returns how long they went unserved.
    pub fn fail_over(&mut self, port: u16, limit: Duration) -> std::io::Result<Duration> {
        let slots = self
            .topology()?
            .into_iter()
            .find(|node| node.port == port && node.master)
            .map(|node| node.slots)
            .filter(|slots| !slots.is_empty())
            .ok_or_else(|| std::io::Error::other(format!("no master serving slots on {port}")))?;
        let probe = slots[0].0;
        self.kill(port);
        let killed_at = Instant::now();
        wait_for(limit, || {
            Ok(self.topology()?.iter().any(|node| {
                node.port != port
                    && node.master
                    && !node.failed
                    && node
                        .slots
                        .iter()
                        .any(|&(from, to)| (from..=to).contains(&probe))
            }))
        })?;
        self.wait_until_healthy(limit)?;
        Ok(killed_at.elapsed())
    }

    /// Kills the node on `port` with SIGKILL: what it had not replicated is lost.
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|node| node.port == port) {
            node.kill();
        }
    }

    /// Starts a killed node again; it rejoins (as a replica, if its replica took over).
    pub fn restart(&mut self, port: u16) -> std::io::Result<()> {
        let node = self
            .nodes
            .iter_mut()
            .find(|node| node.port == port)
            .ok_or_else(|| std::io::Error::other(format!("no node on port {port}")))?;
        node.kill();
        node.spawn()
    }

    /// Waits until every live node says the cluster is ok (every slot served by a live
    /// master) and every live replica's link to its master is up.
    pub fn wait_until_healthy(&self, limit: Duration) -> std::io::Result<()> {
        wait_for(limit, || {
            for node in self.nodes.iter().filter(|node| node.child.is_some()) {
                let info = redis_cli(node.port, &["CLUSTER", "INFO"])?;
                if !info.contains("cluster_state:ok") {
                    return Ok(false);
                }
                let replication = redis_cli(node.port, &["INFO", "replication"])?;
                if replication.contains("role:slave")
                    && !replication.contains("master_link_status:up")
                {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// Each node as a live node sees it (`CLUSTER NODES`).
    fn topology(&self) -> std::io::Result<Vec<NodeView>> {
        let live = self
            .nodes
            .iter()
            .find(|node| node.child.is_some())
            .ok_or_else(|| std::io::Error::other("every node is down"))?;
        let listing = redis_cli(live.port, &["CLUSTER", "NODES"])?;
        Ok(listing.lines().filter_map(NodeView::parse).collect())
    }
}

/// One line of `CLUSTER NODES`: `<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch>
/// <link> <slot ranges…>`.
struct NodeView {
    port: u16,
    master: bool,
    failed: bool,
    slots: Vec<(u16, u16)>,
}

impl NodeView {
    fn parse(line: &str) -> Option<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let address = fields.get(1)?;
        let port = address
            .split('@')
            .next()?
            .rsplit(':')
            .next()?
            .parse()
            .ok()?;
        let flags = fields.get(2)?;
        let slots = fields
            .iter()
            .skip(8)
            .filter(|range| !range.starts_with('['))
            .filter_map(|range| match range.split_once('-') {
                Some((from, to)) => Some((from.parse().ok()?, to.parse().ok()?)),
                None => range.parse().ok().map(|one| (one, one)),
            })
            .collect();
        Some(Self {
            port,
            master: flags.contains("master"),
            failed: flags.contains("fail"),
            slots,
        })
    }
}

/// `count` free loopback ports whose cluster-bus ports (10000 above) are free too.
fn cluster_ports(count: usize) -> std::io::Result<Vec<u16>> {
    let mut ports = Vec::new();
    for _ in 0..1000 {
        if ports.len() == count {
            break;
        }
        let port = super::free_port()?;
        let bus = u32::from(port) + 10_000;
        let bus_free = u16::try_from(bus)
            .ok()
            .is_some_and(|bus| std::net::TcpListener::bind(("127.0.0.1", bus)).is_ok());
        if bus_free && !ports.contains(&port) {
            ports.push(port);
        }
    }
    if ports.len() < count {
        return Err(std::io::Error::other("no free ports for a Redis Cluster"));
    }
    Ok(ports)
}

/// The cluster node id of the node on `port`.
fn node_id(port: u16) -> std::io::Result<String> {
    let id = redis_cli(port, &["CLUSTER", "MYID"])?;
    if id.is_empty() {
        return Err(std::io::Error::other(format!(
            "no node id from port {port}"
        )));
    }
    Ok(id)
}

/// Runs a command that must answer OK.
fn cli_ok(port: u16, args: &[&str]) -> std::io::Result<()> {
    let answer = redis_cli(port, args)?;
    if answer == "OK" || answer == "NOKEY" {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "{args:?} on {port}: {answer}"
        )))
    }
}
