//! The client's walkthrough against a running payonce (`PAYONCE_URL`, by default
//! `http://127.0.0.1:8080` — `cargo run -p api` in another terminal):
//!
//! ```text
//! cargo run -p payonce-client --example walkthrough
//! ```
//!
//! Opens an account, withdraws with one intent sent twice (one execution, one replay),
//! and pays an order with two intents (one pays, the other is refused).

use payonce_client::types::accounts::NewAccountRequest;
use payonce_client::types::orders::OrderRequest;
use payonce_client::{Client, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let base = std::env::var("PAYONCE_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let payonce = Client::new(&base)?;
    let ada = payonce
        .open_account(&NewAccountRequest {
            name: "Ada".into(),
            balance: 1000,
            points: 5,
        })
        .await?;
    println!("opened account {} with 1000", ada.id);
    let payonce = payonce.with_key(&ada.api_key);

    let mut withdrawal = payonce.withdrawal(ada.id, 300);
    let first = withdrawal.send().await?;
    let again = withdrawal.send().await?;
    println!(
        "withdrew 300 with ticket {}: balance {} (replayed: {}); sent again: balance {} (replayed: {})",
        first.ticket, first.body.balance, first.replayed, again.body.balance, again.replayed
    );

    let order = payonce
        .place_order(
            ada.id,
            &OrderRequest {
                amount: 250,
                description: "order #1017".into(),
            },
        )
        .await?;
    let paid = payonce.order_payment(ada.id, order.order_id).send().await?;
    println!(
        "paid order {} with ticket {}: balance {}",
        order.order_id, paid.ticket, paid.body.balance
    );
    match payonce.order_payment(ada.id, order.order_id).send().await {
        Err(Error::Refused(problem)) => println!("a second payment: {problem}"),
        other => println!("a second payment: {other:?}"),
    }
    Ok(())
}
