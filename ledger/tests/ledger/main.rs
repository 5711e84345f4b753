//! The ledger's contract, checked against a fresh PostgreSQL database and a fresh SQLite
//! file per test: the same suite for both.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bells;
mod holds;
mod payouts;
mod postgres_races;
mod stale_statistics;
mod suite;
mod two_paths;
mod webhooks;

macro_rules! suite_for {
    ($database:ident, $open:expr) => {
        mod $database {
            use super::{holds, payouts, suite, webhooks};

            suite_for!(@cases $open, holds;
                the_database_resolves_a_hold_once_in_time_and_within_it,
                the_database_refunds_an_order_within_its_payment,
                audit_finds_holds_and_refunds_out_of_line,
                a_hold_sets_money_aside_and_is_captured_once,
                a_hold_past_its_expiry_is_expired_before_it_is_swept,
                capture_void_and_expiry_of_one_hold_settle_to_one_winner,
                refunds_never_exceed_the_payment,
                concurrent_refunds_never_refund_more_than_was_paid,
                what_becomes_of_a_hold_is_announced_once
            );

            suite_for!(@cases $open, payouts;
                a_payout_debits_once_and_waits_for_the_bank,
                a_payout_the_balance_cannot_cover_is_refused_and_stored,
                a_job_is_claimed_by_one_worker_until_its_lease_runs_out,
                a_succeeded_payout_keeps_its_money_out,
                a_failed_payout_is_credited_back_once,
                a_postponed_job_waits_until_it_is_due,
                an_idle_claim_says_when_the_next_job_is_due,
                throttled_claims_are_counted_apart_and_the_age_is_the_databases,
                payouts_are_listed_and_counted_by_status,
                audit_finds_a_failed_payout_without_its_reversal,
                a_claim_is_recorded_together_each_as_if_alone
            );
            suite_for!(@cases $open, webhooks;
                every_outcome_announces_its_event_to_the_endpoints_that_want_it,
                a_delivery_is_recorded_only_at_the_attempt_it_was_claimed_at,
                retries_wait_and_an_exhausted_delivery_is_sent_again_by_hand,
                gone_disables_the_endpoint_and_ends_its_deliveries,
                endpoints_are_bounded_deleted_and_rotated,
                a_payout_announces_its_settlement_once,
                audit_finds_a_missing_event_and_a_stray_one,
                a_claim_takes_at_most_what_it_asks_for,
                an_answer_with_a_nul_byte_is_recorded_beside_the_others,
                answers_are_recorded_together_each_as_if_alone,
                rotations_under_one_key_rotate_once,
                ended_deliveries_are_reaped_after_the_retention,
                an_outcome_is_kept_while_a_delivery_of_it_is
            );
            suite_for!(@cases $open, suite;
                opening_an_account_writes_its_opening_entry,
                api_keys_authenticate_only_their_account,
                concurrent_distinct_tickets_succeed_exactly_as_far_as_the_money_goes,
                concurrent_uses_of_one_ticket_execute_once,
                stale_fencing_token_writes_nothing,
                fingerprint_mismatch_executes_nothing,
                expired_ticket_is_refused,
                ticket_of_another_account_is_unknown,
                refusals_are_stored_and_stay_refused,
                lottery_draw_replays_the_same_prize,
                deposit_that_would_overflow_is_refused,
                reaper_deletes_expired_tickets_and_prunes_old_outcomes,
                entries_page_oldest_first,
                fencing_token_cannot_be_lowered,
                audit_finds_a_planted_balance_change,
                audit_finds_a_planted_token_regression,
                audit_finds_a_planted_outcome_without_entry,
                an_equal_fencing_token_is_refused,
                expiry_is_judged_after_waiting_for_the_ticket,
                the_stored_body_is_the_renderers_with_the_numbers_after,
                a_body_with_the_balance_in_its_text_is_stored_as_rendered,
                an_order_is_paid_once_whatever_the_ticket,
                an_unaffordable_order_stays_open,
                an_order_payment_is_checked_against_its_order,
                concurrent_payments_of_one_order_pay_once,
                an_order_payment_and_a_withdrawal_cannot_overdraw,
                audit_finds_a_planted_order_paid_without_its_entry,
                creates_with_a_key_answer_once,
                a_create_record_holds_no_key_in_clear,
                the_reaper_frees_create_keys_after_the_retention,
                concurrent_creates_with_one_key_make_one
            );
        }
    };
    (@cases $open:expr, $module:ident; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let database = ($open).await;
                $module::$case(&database).await;
            }
        )*
    };
}

suite_for!(postgres, async {
    ledger::testing::TestDatabase::postgres().await.unwrap()
});
suite_for!(sqlite, async {
    ledger::testing::TestDatabase::sqlite().unwrap()
});

/// The demonstration's unguarded write (cargo feature `demo`), on both databases.
#[cfg(feature = "demo")]
mod demonstration {
    use super::suite;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres_unguarded_read_check_write_loses_an_update() {
        let database = ledger::testing::TestDatabase::postgres().await.unwrap();
        suite::unguarded_read_check_write_loses_an_update(&database).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite_unguarded_read_check_write_loses_an_update() {
        let database = ledger::testing::TestDatabase::sqlite().unwrap();
        suite::unguarded_read_check_write_loses_an_update(&database).await;
    }
}

/// A database that is not there is reported as unavailable, not as some other error.
#[tokio::test]
async fn unreachable_postgres_is_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let options = ledger::LedgerOptions {
        acquire_timeout: std::time::Duration::from_millis(500),
        ..Default::default()
    };
    let error = ledger::Ledger::open(
        &format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        &options,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, ledger::LedgerError::Unavailable(_)),
        "{error:?}"
    );
}
