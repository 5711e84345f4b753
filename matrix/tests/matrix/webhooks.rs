//! An instance killed (SIGKILL) while it delivers webhooks loses none: its claimed
//! deliveries are taken over by the others once their leases run out, and the load test's
//! receiver gets every committed outcome — some twice, under one `webhook-id`.

use std::time::Duration;

use ledger::testing::TestDatabase;
use loadtest::receiver::ReceiverFaults;
use loadtest::run::{Mix, RunOptions, run};
use lock::testing::RedisServer;
use matrix::cluster::{Cluster, base_environment, claims_held};

/// How long the load lasts.
const LOAD: Duration = Duration::from_secs(3);

/// Three instances (fenced, on a private Redis) delivering to a receiver that answers
/// every delivery 600 ms after it arrived, so that deliveries are always in flight; the
/// third instance is killed once the ledger shows it holding claimed deliveries, and
/// restarted. Leases are 2 s, retries a fraction of a second apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_killed_mid_delivery_loses_no_event() {
    let _turn = crate::ONE_AT_A_TIME.lock().await;
    let database = TestDatabase::postgres().await.unwrap();
    let redis = RedisServer::start().unwrap();
    let mut environment = base_environment(database.url(), Duration::from_secs(1));
    environment.push(("PAYONCE_LOCK_URL".to_owned(), redis.url()));
    for (name, value) in [
        ("PAYONCE_WEBHOOK_ALLOW_PRIVATE", "true"),
        (
            "PAYONCE_WEBHOOK_RETRY_SCHEDULE",
            "100ms,200ms,400ms,800ms,1s,1s,1s",
        ),
        ("PAYONCE_WEBHOOK_TIMEOUT", "1s"),
        ("PAYONCE_WEBHOOK_LEASE", "2s"),
        ("PAYONCE_WEBHOOK_POLL", "100ms"),
    ] {
        environment.push((name.to_owned(), value.to_owned()));
    }
    let mut cluster = Cluster::start(&crate::payonce(), vec![environment; 3])
        .await
        .unwrap();
    let options = RunOptions {
        webhooks: Some(ReceiverFaults {
            slow: 1.0,
            slow_for: Duration::from_millis(600),
            ..ReceiverFaults::default()
        }),
        ..crate::load(
            cluster.targets(),
            (4, 8),
            LOAD,
            // No bank here: no payouts.
            Mix {
                withdrawal: 0.5,
                payout: 0.0,
                ..Mix::default()
            },
        )
    };
    let doomed = cluster.instance(2);
    let database_url = database.url().to_owned();
    let kill = async {
        let held = claims_held(&database_url, &doomed, "webhook", LOAD)
            .await
            .unwrap();
        // The claimed deliveries are on their way: the receiver holds each 600 ms.
        tokio::time::sleep(Duration::from_millis(100)).await;
        cluster
            .kill_and_restart(2, Duration::from_millis(300))
            .await
            .unwrap();
        held
    };
    let (result, held) = tokio::join!(run(options), kill);
    let result = result.unwrap();
    assert!(held, "the instance was killed while it held no delivery");
    assert!(result.violations.is_empty(), "{:#?}", result.violations);
    let tally = &result.webhooks;
    assert!(tally.expected > 0, "{tally:?}");
    assert_eq!(tally.delivered, tally.expected, "{tally:?}");
    // What the killed instance had sent was sent again by another, under the same id.
    assert!(tally.repeats > 0, "no delivery was taken over: {tally:?}");
}
