//! A replicated Redis loses a master under load — a Redis Cluster (three masters, each with
//! a replica) and Redis Sentinel (a master, two replicas, three sentinels): three payonce
//! instances lock on private servers while the load test's clients spend and resend as
//! real clients do; a master is killed with SIGKILL, a replica takes over without what it
//! had not replicated — locks and fencing counters — and the killed node comes back as a
//! replica. Nothing is spent twice, by the load test's audit and by
//! `payonce audit`; what the clients saw meanwhile is printed.

use std::process::Command;
use std::time::Duration;

use ledger::testing::TestDatabase;
use loadtest::run::{Mix, RunOptions, run};
use matrix::Service;
use matrix::cluster::{Cluster, base_environment};
use matrix::services::Servers;

/// How long the load lasts; the kill comes a quarter of the way in.
const LOAD: Duration = Duration::from_secs(10);

/// Three instances fenced on `service`'s private servers under the load test's load with
/// resends, a master killed a quarter of the way in (and brought back as a replica): the
/// load test's audit and `payonce audit` find nothing spent twice, and the clients' resends
/// (same ticket, next instance) carried them through.
async fn a_master_killed_under_load(service: Service) {
    let _turn = crate::ONE_AT_A_TIME.lock().await;
    let database = TestDatabase::postgres().await.unwrap();
    let mut servers = Servers::start(service.servers()).await.unwrap();
    let mut environment = base_environment(database.url(), Duration::from_secs(1));
    environment.extend(servers.environment(service, false));
    let instances = Cluster::start(&crate::payonce(), vec![environment; 3])
        .await
        .unwrap();
    let options = RunOptions {
        drain: Duration::ZERO,
        ..crate::load(
            instances.targets(),
            (12, 12),
            LOAD,
            // The lock service's failover is under test, not payouts: the instances have no bank.
            Mix {
                payout: 0.0,
                ..Mix::default()
            },
        )
    };
    let fail_over = async {
        tokio::time::sleep(LOAD / 4).await;
        servers.fail_over().await
    };
    let (result, unserved) = tokio::join!(run(options), fail_over);
    let (result, unserved) = (result.unwrap(), unserved.unwrap());

    println!(
        "{}: unserved for {unserved:?}; clients saw {} answers 503 (resent: {} spends, {} \
         ticket requests), {} created, {} replays, {} unresolved",
        service.name(),
        result.counts.unavailable,
        result.counts.retries,
        result.counts.ticket_retries,
        result.counts.created,
        result.counts.replays,
        result.unresolved.requests,
    );
    assert!(result.violations.is_empty(), "{:#?}", result.violations);
    assert!(
        result.tallies.iter().all(|tally| tally.double_spends == 0),
        "{:#?}",
        result.tallies
    );
    assert!(result.counts.created > 0, "{:?}", result.counts);

    let audit = Command::new(crate::payonce())
        .arg("audit")
        .env("DATABASE_URL", database.url())
        .output()
        .unwrap();
    assert!(
        audit.status.success(),
        "payonce audit: {}{}",
        String::from_utf8_lossy(&audit.stdout),
        String::from_utf8_lossy(&audit.stderr)
    );
}

/// A Redis Cluster master killed under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_master_failover_under_load_spends_nothing_twice() {
    a_master_killed_under_load(Service::RedisCluster).await;
}

/// The master behind Redis Sentinel killed under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_failover_under_load_spends_nothing_twice() {
    a_master_killed_under_load(Service::RedisSentinel).await;
}
