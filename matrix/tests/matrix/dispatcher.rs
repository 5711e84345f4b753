//! The dispatcher's row pair at a small size, against real `payonce-bank` processes: with
//! a fresh key per attempt a payout is paid out twice under every fault; with payonce's
//! one key, never — and every payout ends with the bank's word.

use ledger::testing::TestDatabase;
use matrix::dispatcher::{BankFault, DispatchOptions, DispatchRow, Keys, run_dispatcher};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_key_never_pays_twice_and_a_fresh_key_per_attempt_does() {
    let _turn = crate::ONE_AT_A_TIME.lock().await;
    let database = TestDatabase::postgres().await.unwrap();
    let (payonce, bank) = (crate::payonce(), crate::bank());
    let options = DispatchOptions {
        payonce: &payonce,
        bank: &bank,
        database_url: database.url(),
        seconds: 2.0,
        clients: 8,
        accounts: 4,
    };
    let rows = run_dispatcher(&options, &BankFault::ALL, |row| println!("{row:?}")).await;
    assert_eq!(rows.len(), 6);
    for row in &rows {
        assert!(row.skipped.is_none(), "{row:#?}");
        assert!(row.payouts > 0 && row.executed_at_bank > 0, "{row:#?}");
        assert_eq!(row.pending, 0, "drained: {row:#?}");
        assert_eq!(row.other_violations, 0, "{row:#?}");
        match row.keys {
            Keys::OneKey => assert!(!row.paid_wrongly(), "{row:#?}"),
            Keys::FreshKeyPerAttempt => assert!(row.paid_twice > 0, "{row:#?}"),
        }
    }
    // The kill found payouts mid-call, and another instance took them over.
    let killed: Vec<&DispatchRow> = rows
        .iter()
        .filter(|row| row.fault == BankFault::InstanceKill)
        .collect();
    assert!(
        killed.iter().all(|row| row.most_attempts >= 2),
        "{killed:#?}"
    );
}
