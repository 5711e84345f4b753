//! What only the distributed mode has: several instances sharing PostgreSQL and Redis,
//! Redis or the database going away, Redis losing its data, and the `payonce audit`
//! command.

use std::time::Duration;

use lock::testing::{RedisServer, free_port};
use reqwest::StatusCode;

use crate::helpers::{
    Backend, PATIENT_SPENDS, SHORT_LEASE_DEMO, Shared, TestApp, assert_problem, read, spawn_app,
    spawn_config, spawn_with, the_next_holder_after_a_paused_one,
    thirty_withdrawals_of_100_from_1000,
};

async fn three_instances() -> Vec<TestApp> {
    three_instances_with(&[]).await
}

async fn three_instances_with(extra: &[&str]) -> Vec<TestApp> {
    let shared = Shared::new(Backend::Distributed).await;
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(spawn_with(shared.clone(), extra).await);
    }
    instances
}

/// 99 concurrent copies of one request spread over three instances: one execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_execute_one_ticket_once() {
    let instances = three_instances().await;
    let ada = instances[0].create_account(10_000, 0).await;
    let ticket = instances[1].ticket(&ada).await;
    let (instances_ref, ada_ref, ticket_ref) = (&instances, &ada, &ticket);
    let results = futures::future::join_all((0..99).map(|i| async move {
        read(
            instances_ref[i % 3]
                .withdraw(ada_ref, ticket_ref, 100)
                .await,
        )
        .await
    }))
    .await;
    let originals: Vec<_> = results
        .iter()
        .filter(|(_, replayed, _)| !replayed)
        .collect();
    assert_eq!(
        originals.len(),
        1,
        "exactly one execution across the instances"
    );
    for (status, _, body) in &results {
        assert_eq!((status, body), (&StatusCode::CREATED, &originals[0].2));
    }
    assert_eq!(instances[2].balance(&ada).await, (9_900, 0));
    instances[0].assert_audit_clean().await;
}

/// Withdrawals with distinct tickets over three instances: exactly the affordable number.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_spend_exactly_the_balance() {
    let instances = three_instances_with(PATIENT_SPENDS).await;
    let ada =
        thirty_withdrawals_of_100_from_1000(&[&instances[0], &instances[1], &instances[2]]).await;
    assert_eq!(instances[1].balance(&ada).await, (0, 0));
    instances[0].assert_audit_clean().await;
}

/// The paused-holder fault across instances: the holder pauses on one instance, the next
/// holder writes through another.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_holder_on_one_instance_cannot_commit_after_another_wrote() {
    let shared = Shared::new(Backend::Distributed).await;
    let first = spawn_with(shared.clone(), SHORT_LEASE_DEMO).await;
    let second = spawn_with(shared, SHORT_LEASE_DEMO).await;
    let (ada, _, (status, _, _)) = the_next_holder_after_a_paused_one(&first, &second).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(first.balance(&ada).await, (300, 0));
    first.assert_audit_clean().await;
}

/// With Redis unreachable, spends are 503 and store nothing; readiness says so; the
/// ticket stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_redis_is_503_and_nothing_is_lost() {
    let shared = Shared::new(Backend::Distributed).await;
    let mut config = shared.config(&[]);
    config.redis_url = Some(format!("redis://127.0.0.1:{}", free_port().unwrap()));
    unreachable_lock_store_is_503_and_nothing_is_lost(spawn_config(shared, config).await).await;
}

/// The same with ZooKeeper unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_zookeeper_is_503_and_nothing_is_lost() {
    let shared = Shared::new(Backend::ZooKeeper).await;
    let mut config = shared.config(&[]);
    config.lock_url = Some(format!("zk://127.0.0.1:{}/t", free_port().unwrap()));
    unreachable_lock_store_is_503_and_nothing_is_lost(spawn_config(shared, config).await).await;
}

/// The same with etcd unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_etcd_is_503_and_nothing_is_lost() {
    let shared = Shared::new(Backend::Etcd).await;
    let mut config = shared.config(&[]);
    config.lock_url = Some(format!("etcd://127.0.0.1:{}/t", free_port().unwrap()));
    unreachable_lock_store_is_503_and_nothing_is_lost(spawn_config(shared, config).await).await;
}

/// The same with the PostgreSQL of the locks unreachable (the ledger's is up).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_lock_database_is_503_and_nothing_is_lost() {
    let shared = Shared::new(Backend::PostgresLocks).await;
    let mut config = shared.config(&[]);
    config.lock_url = Some(format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        free_port().unwrap()
    ));
    unreachable_lock_store_is_503_and_nothing_is_lost(spawn_config(shared, config).await).await;
}

/// The same with MariaDB unreachable, for the lock table and for row locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_mysql_is_503_and_nothing_is_lost() {
    for (backend, scheme) in [
        (Backend::MySqlTable, "mysql"),
        (Backend::MySqlRow, "mysql-row"),
    ] {
        let shared = Shared::new(backend).await;
        let mut config = shared.config(&[]);
        config.lock_url = Some(format!(
            "{scheme}://root@127.0.0.1:{}/payonce_locks",
            free_port().unwrap()
        ));
        unreachable_lock_store_is_503_and_nothing_is_lost(spawn_config(shared, config).await).await;
    }
}

/// The same with memcached unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_memcached_is_503_and_nothing_is_lost() {
    let shared = Shared::new(Backend::Memcached).await;
    let mut config = shared.config(&[]);
    config.lock_url = Some(format!("memcache://127.0.0.1:{}", free_port().unwrap()));
    unreachable_lock_store_is_503_and_nothing_is_lost(spawn_config(shared, config).await).await;
}

/// The same with no Hazelcast member reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_hazelcast_is_503_and_nothing_is_lost() {
    let shared = Shared::new(Backend::Hazelcast).await;
    let mut config = shared.config(&[]);
    config.lock_url = Some(format!(
        "hazelcast://127.0.0.1:{},127.0.0.1:{}",
        free_port().unwrap(),
        free_port().unwrap()
    ));
    unreachable_lock_store_is_503_and_nothing_is_lost(spawn_config(shared, config).await).await;
}

async fn unreachable_lock_store_is_503_and_nothing_is_lost(app: TestApp) {
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;
    let response = app.withdraw(&ada, &ticket, 100).await;
    assert_problem(
        response,
        StatusCode::SERVICE_UNAVAILABLE,
        "lock-store-unavailable",
    )
    .await;
    let response = app.get("/readyz").await;
    let body = assert_problem(response, StatusCode::SERVICE_UNAVAILABLE, "not-ready").await;
    assert_eq!(
        (body["database"].as_str(), body["lock_store"].as_str()),
        (Some("ok"), Some("unavailable"))
    );
    // The scrape asks as readiness does: what PayonceDependencyDown alerts on.
    assert_eq!(
        app.metric("payonce_dependency_up{dependency=\"lock_store\"}")
            .await,
        0.0
    );
    assert_eq!(
        app.metric("payonce_dependency_up{dependency=\"database\"}")
            .await,
        1.0
    );
    let state = app.shown_ticket(&ada, &ticket).await;
    assert_eq!(state["state"], "issued");
    assert_eq!(app.balance(&ada).await, (1000, 0));
}

/// With the database refusing connections, requests are 503; once it is back, the same
/// ticket executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn database_down_is_503_and_the_ticket_survives() {
    let app = spawn_app(Backend::Distributed).await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;
    let database = app
        .shared
        .database
        .url()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    let admin = ledger::testing::postgres_admin_url();
    let mut control = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
        .await
        .unwrap();
    let run = |sql: String| sqlx::query(sqlx::AssertSqlSafe(sql));
    run(format!(
        "ALTER DATABASE {database} WITH ALLOW_CONNECTIONS false"
    ))
    .execute(&mut control)
    .await
    .unwrap();
    run(format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}'"
    ))
    .execute(&mut control)
    .await
    .unwrap();

    let response = app.withdraw(&ada, &ticket, 100).await;
    assert_problem(
        response,
        StatusCode::SERVICE_UNAVAILABLE,
        "database-unavailable",
    )
    .await;
    let response = app
        .get_as(&ada.key, &format!("/v1/accounts/{}", ada.id))
        .await;
    assert_problem(
        response,
        StatusCode::SERVICE_UNAVAILABLE,
        "database-unavailable",
    )
    .await;
    let response = app.get("/readyz").await;
    assert_problem(response, StatusCode::SERVICE_UNAVAILABLE, "not-ready").await;

    run(format!(
        "ALTER DATABASE {database} WITH ALLOW_CONNECTIONS true"
    ))
    .execute(&mut control)
    .await
    .unwrap();
    let (status, replayed, body) = read(app.withdraw(&ada, &ticket, 100).await).await;
    assert_eq!(
        (status, replayed, body["balance"].as_i64()),
        (StatusCode::CREATED, false, Some(900))
    );
    app.assert_audit_clean().await;
}

/// Redis loses its data (FLUSHALL): fencing counters restart from the clock, above what
/// the ledger has seen, and spends go on at once. If a counter comes back below it (a
/// server whose clock stepped back), the first grant is refused as stale, the counter is
/// raised, and the spend runs again with a fresh grant inside the same request: one 201,
/// nothing spent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencing_recovers_after_redis_loses_its_data() {
    let redis = RedisServer::start().unwrap();
    let shared = Shared::new(Backend::Distributed).await;
    let mut config = shared.config(&[]);
    config.redis_url = Some(redis.url());
    let app = spawn_config(shared, config).await;
    let ada = app.create_account(1000, 0).await;
    for _ in 0..3 {
        assert_eq!(
            app.withdraw_with_a_new_ticket(&ada, 10).await,
            StatusCode::CREATED
        );
    }
    let mut raw = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();

    let ticket = app.ticket(&ada).await;
    let (status, replayed, body) = read(app.withdraw(&ada, &ticket, 10).await).await;
    assert_eq!(
        (status, replayed, body["balance"].as_i64()),
        (StatusCode::CREATED, false, Some(960))
    );
    assert_eq!(app.metric("payonce_stale_fencing_tokens_total").await, 0.0);
    let (status, replayed, _) = read(app.withdraw(&ada, &ticket, 10).await).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));

    // A counter behind the ledger, as a server whose clock stepped back would leave it.
    let fence = format!("{}:fence:{{lock:account:{}}}", app.shared.namespace, ada.id);
    let _: () = redis::cmd("SET")
        .arg(&fence)
        .arg(1)
        .query_async(&mut raw)
        .await
        .unwrap();
    let ticket = app.ticket(&ada).await;
    let (status, replayed, body) = read(app.withdraw(&ada, &ticket, 10).await).await;
    assert_eq!(
        (status, replayed, body["balance"].as_i64()),
        (StatusCode::CREATED, false, Some(950))
    );
    assert!(app.metric("payonce_stale_fencing_tokens_total").await >= 1.0);
    assert_eq!(app.metric("payonce_locks_lost_total").await, 0.0);
    assert_eq!(app.balance(&ada).await, (950, 0));
    app.assert_audit_clean().await;
}

/// A database without a lock service refuses to start, saying why.
#[tokio::test]
async fn half_distributed_configuration_refuses_to_start() {
    let shared = Shared::new(Backend::Distributed).await;
    let mut config = shared.config(&[]);
    config.redis_url = None;
    config.lock_url = None;
    let error = api::state::AppState::connect(&config).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("PAYONCE_LOCK_URL (or REDIS_URL) is not"),
        "{error}"
    );
}

/// `payonce audit` exits 0 on a clean ledger and 1 (naming the rule) on a broken one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_command_exits_nonzero_on_a_violation() {
    let app = spawn_app(Backend::Distributed).await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;
    app.withdraw(&ada, &ticket, 100).await;
    let url = app.shared.database.url().to_owned();
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_payonce"))
            .arg("audit")
            .env("DATABASE_URL", &url)
            .env_remove("REDIS_URL")
            .output()
            .unwrap()
    };
    let clean = run();
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    assert!(String::from_utf8_lossy(&clean.stdout).contains("audit clean"));
    app.shared
        .database
        .execute("UPDATE accounts SET balance = balance + 1")
        .await
        .unwrap();
    let broken = run();
    assert_eq!(broken.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&broken.stdout).contains("BalanceMatchesEntries"));
}

/// Fencing across a lock store that lost its data, lock and ledger together: a holder
/// granted before Redis lost everything, paused past its lease, writes after a holder
/// granted since — and is refused, whether the lost counter came back above its token
/// (it starts from the clock) or, with a clock that stepped back, on exactly its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grant_from_before_a_wipe_cannot_write_after_a_later_grant() {
    let redis = RedisServer::start().unwrap();
    let shared = Shared::new(Backend::Distributed).await;
    let mut config = shared.config(&[]);
    config.redis_url = Some(redis.url());
    let app = spawn_config(shared, config).await;
    let mut raw = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let locks = app.state.locks();
    let ttl = Duration::from_millis(300);

    for clock_stepped_back in [false, true] {
        let ada = app.create_account(1000, 0).await;
        let key = format!("lock:account:{}", ada.id);
        let paused_ticket = ledger::TicketId(app.ticket(&ada).await.parse().unwrap());
        let later_ticket = ledger::TicketId(app.ticket(&ada).await.parse().unwrap());

        let mut paused = locks.try_acquire(&key, ttl).await.unwrap().expect("free");
        paused.stop_renewal().await;
        let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
        if clock_stepped_back {
            // The counter comes back one below the paused holder's token: the next grant
            // carries exactly its number.
            let fence = format!("{}:fence:{{{key}}}", app.shared.namespace);
            let _: () = redis::cmd("SET")
                .arg(&fence)
                .arg(paused.fencing_token().get() - 1)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
        tokio::time::sleep(ttl * 2).await;
        let mut later = locks
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap()
            .expect("the paused holder's lease ran out");
        if clock_stepped_back {
            assert_eq!(later.fencing_token(), paused.fencing_token());
        } else {
            assert!(later.fencing_token() > paused.fencing_token());
        }
        app.assert_later_grant_wins(
            &ada,
            (later_ticket, &later),
            (paused_ticket, &paused),
            600,
            &format!("clock stepped back: {clock_stepped_back}"),
        )
        .await;
        later.release().await.unwrap();
        assert_eq!(app.balance(&ada).await, (400, 0));
    }
    app.assert_audit_clean().await;
}
