//! The bank as a library, as payonce's embedded mode starts it: in the same process, on a
//! loopback listener of its own.

use bank::{Bank, BankOptions};

use crate::support::{Db, Store, body, key};

/// `Bank::open` and `serve(listener)` run the same service in-process; shutting the
/// handle down stops it listening.
#[tokio::test]
async fn the_bank_serves_in_process_and_shuts_down() {
    let store = Store::fresh(Db::Sqlite).await;
    let bank = Bank::open(BankOptions {
        database_url: store.url.clone(),
        ..BankOptions::default()
    })
    .await
    .expect("open the bank");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let handle = bank.serve(listener).expect("serve");
    let addr = handle.addr();
    let answer = reqwest::Client::new()
        .post(format!("http://{addr}/v1/transfers"))
        .header("Idempotency-Key", key())
        .json(&body("acct-1", 5, "embedded"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(answer.status(), 201);
    handle.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    let report = bank.audit().await.expect("audit");
    assert!(report.is_clean());
    assert_eq!((report.transfers, report.total), (1, 5));
    bank.close().await;
}
