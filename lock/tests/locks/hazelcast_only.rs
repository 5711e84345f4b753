//! What only Hazelcast's CP Subsystem can show: sessions that end, members that go.

use std::time::Duration;

use lock::testing::HazelcastCluster;
use lock::{LockOptions, LockService};

use crate::Store;

const SECOND: Duration = Duration::from_secs(1);

/// The shared cluster (`scripts/services.sh` starts three members on 5701-5703), under a
/// namespace of the test's own.
pub fn shared_hazelcast() -> LockService {
    let url = std::env::var("HAZELCAST_URL")
        .unwrap_or_else(|_| "hazelcast://127.0.0.1:5701,127.0.0.1:5702,127.0.0.1:5703".to_owned());
    lock::open(
        &url,
        &LockOptions {
            namespace: format!("test-{:016x}", rand::random::<u64>()),
            op_timeout: Some(Duration::from_secs(5)),
            ..LockOptions::default()
        },
    )
    .expect("a valid Hazelcast URL")
}

/// A cluster of the test's own. Its data loss is real: every member killed and started
/// again, and Community Edition keeps no CP state across that. The same service goes on
/// (its client finds a new cluster and starts over).
pub struct PrivateCluster {
    pub cluster: HazelcastCluster,
    pub locks: LockService,
}

impl PrivateCluster {
    pub fn start() -> Self {
        let cluster = HazelcastCluster::start(4 * SECOND).expect("a Hazelcast cluster starts");
        let locks = open(&cluster.url());
        Self { cluster, locks }
    }
}

impl Store for PrivateCluster {
    fn service(&self) -> LockService {
        self.locks.clone()
    }

    async fn lose_data(&mut self) -> LockService {
        self.cluster.wipe().expect("the cluster starts again");
        crate::zookeeper_only::wait_until_granting(&self.locks).await;
        self.locks.clone()
    }
}

fn open(url: &str) -> LockService {
    lock::open(
        url,
        &LockOptions {
            op_timeout: Some(5 * SECOND),
            ..LockOptions::default()
        },
    )
    .expect("a valid Hazelcast URL")
}
