//! The HTTP contract of docs/api.md, checked against real servers on port-0 listeners:
//! PostgreSQL + Redis, and the embedded mode (SQLite + in-process locks).
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Runs each listed case of a module on each listed backend, a test module per backend:
/// `on_backends!(module; test_module => Backend, …; [case, …])` calls
/// `crate::module::case(Backend::…)` in `test_module::case`.
macro_rules! on_backends {
    ($module:ident; $($suite:ident => $backend:ident),+ $(,)?; $cases:tt) => {
        $(on_backends!(@suite $module, $suite, $backend, $cases);)+
    };
    (@suite $module:ident, $suite:ident, $backend:ident, [$($case:ident),* $(,)?]) => {
        mod $suite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    crate::$module::$case(crate::helpers::Backend::$backend).await;
                }
            )*
        }
    };
}

mod abuse;
mod browser;
mod contract;
mod creates;
mod database_restart;
#[cfg(feature = "demo")]
mod demo;
mod distributed;
mod hardening;
mod helpers;
mod holds;
mod late_commit;
mod lock_state;
mod lock_state_sql;
mod openapi;
mod operations;
mod payouts;
mod readme;
mod reconcile;
mod traces;
mod webhooks;

// Each listed webhook case on both backends.
on_backends!(
    webhooks;
    webhooks_on_postgres_and_redis => Distributed,
    webhooks_embedded => Embedded;
    [
        committed_outcomes_arrive_signed_and_replays_send_nothing,
        failures_retry_on_the_schedule_then_exhaust_and_a_retry_by_hand_delivers,
        retry_after_is_honoured_and_gone_disables_the_endpoint,
        a_rotation_signs_with_both_secrets_until_its_window_ends,
        tampered_bodies_old_timestamps_and_wrong_secrets_fail_verification,
        endpoints_refuse_bad_urls_and_belong_to_their_account,
        the_python_reference_library_verifies_and_refuses_as_it_should,
        an_answer_with_a_nul_byte_is_recorded_and_stalls_nothing,
        a_short_retry_after_waits_the_schedule,
        a_silent_endpoint_holds_back_no_other_accounts_events,
        after_a_change_of_sealing_key_a_rotation_signs_again,
        webhook_posts_with_a_key_happen_once,
    ]
);

// Each listed contract case on both backends.
on_backends!(
    contract;
    on_postgres_and_redis => Distributed,
    embedded => Embedded;
    [
        an_order_is_paid_exactly_once,
        concurrent_payments_of_one_order_pay_it_once,
        orders_refuse_bad_input,
        accounts_open_with_a_key_shown_once,
        account_reads_need_the_accounts_own_key,
        entries_list_oldest_first_a_page_at_a_time,
        tickets_show_their_state_and_stored_response,
        spend_without_or_with_a_malformed_idempotency_key_is_400,
        unknown_foreign_or_expired_tickets_are_refused,
        first_request_executes_and_repeats_replay_it,
        refusals_are_stored_and_a_failed_ticket_stays_failed,
        lottery_draws_spend_points_and_replay_the_same_prize,
        a_different_request_under_a_used_ticket_is_422,
        validation_errors_store_nothing,
        duplicate_of_a_running_request_waits_and_replays,
        duplicate_past_the_wait_is_409_request_in_progress,
        busy_account_is_409_account_busy,
        hundred_concurrent_copies_execute_once,
        concurrent_distinct_tickets_spend_exactly_the_balance,
        paused_lock_holder_cannot_commit,
        service_endpoints_answer,
        unknown_routes_and_methods_are_problems,
        graceful_shutdown_finishes_in_flight_requests,
        spends_after_a_restart_succeed_at_once,
    ]
);

// Each listed contract case on the other lock services: the service runs on them as it
// does on Redis. (Cases that pause a holder past its lease are not among them: a ZooKeeper
// session, an etcd lease or a PostgreSQL connection lives on while its process does — the
// fault that takes them is a real process pause, `SIGSTOP`, in the lock services × faults
// matrix.)
on_backends!(
    contract;
    on_redis_cluster => RedisCluster,
    on_zookeeper => ZooKeeper,
    on_etcd => Etcd,
    on_memcached => Memcached,
    on_hazelcast => Hazelcast,
    on_mysql_lock_table => MySqlTable,
    on_mysql_row_locks => MySqlRow,
    on_postgres_advisory_locks => PostgresLocks;
    [
        concurrent_payments_of_one_order_pay_it_once,
        first_request_executes_and_repeats_replay_it,
        refusals_are_stored_and_a_failed_ticket_stays_failed,
        lottery_draws_spend_points_and_replay_the_same_prize,
        duplicate_of_a_running_request_waits_and_replays,
        duplicate_past_the_wait_is_409_request_in_progress,
        busy_account_is_409_account_busy,
        hundred_concurrent_copies_execute_once,
        concurrent_distinct_tickets_spend_exactly_the_balance,
        service_endpoints_answer,
        spends_after_a_restart_succeed_at_once,
    ]
);

// A Redis Cluster's leases are Redis's: a paused holder loses its lock.
on_backends!(
    contract;
    on_redis_cluster_leases => RedisCluster;
    [paused_lock_holder_cannot_commit]
);
