//! A Redis Cluster loses a master under load: three payonce instances lock on a private
//! cluster (three masters, each with a replica) while the load test's clients spend and
//! resend as real clients do; a master is killed with SIGKILL, its replica takes over
//! without what it had not replicated — locks and fencing counters — and the killed node
//! comes back as a replica. Nothing is spent twice, by the load test's audit and by
//! `payonce audit`; what the clients saw meanwhile is printed.

use std::process::Command;
use std::time::Duration;

use ledger::testing::TestDatabase;
use loadtest::retry::RetryPolicy;
use loadtest::run::{Limit, Mix, RunOptions, run};
use lock::testing::RedisCluster;
use matrix::cluster::{Cluster, base_environment};

/// How long the load lasts; the kill comes a quarter of the way in.
const LOAD: Duration = Duration::from_secs(10);

/// The load test's audit and `payonce audit` find nothing spent twice across the failover,
/// and the clients' resends (same ticket, next instance) carried them through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_failover_under_load_spends_nothing_twice() {
    let _turn = crate::ONE_AT_A_TIME.lock().await;
    let database = TestDatabase::postgres().await.unwrap();
    let redis_cluster = RedisCluster::start().expect("a private Redis Cluster starts");
    let mut environment = base_environment(database.url(), Duration::from_secs(1));
    environment.push(("PAYONCE_LOCK_URL".to_owned(), redis_cluster.url()));
    let instances = Cluster::start(&crate::payonce(), vec![environment; 3])
        .await
        .unwrap();
    let options = RunOptions {
        targets: instances.targets(),
        accounts: 12,
        clients: 12,
        limit: Limit::Duration(LOAD),
        duplicate_fraction: 0.3,
        changed_fraction: 0.2,
        progress: false,
        mix: Mix::default(),
        headers: Vec::new(),
        fault: None,
        sticky: false,
        expect_unanswered: false,
        retry: RetryPolicy::default(),
    };
    let failover = tokio::task::spawn_blocking(move || {
        let mut redis_cluster = redis_cluster;
        std::thread::sleep(LOAD / 4);
        let victim = redis_cluster.masters()?[0];
        let unserved = redis_cluster.fail_over(victim, Duration::from_secs(30))?;
        redis_cluster.restart(victim)?;
        redis_cluster.wait_until_healthy(Duration::from_secs(30))?;
        Ok::<_, std::io::Error>((redis_cluster, unserved))
    });
    let result = run(options).await.unwrap();
    let (redis_cluster, unserved) = failover.await.unwrap().unwrap();

    println!(
        "failover: a master's slots unserved for {unserved:?}; clients saw {} answers 503 \
         (resent: {} spends, {} ticket requests), {} created, {} replays, {} unresolved",
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
    assert!(unserved < Duration::from_secs(30));

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
    drop(instances);
    drop(redis_cluster);
}
