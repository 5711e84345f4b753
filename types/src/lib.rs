//! The bodies of payonce's HTTP contract, in one place for the server (the `api` crate)
//! and its clients: what a request sends and what an answer carries. The server's OpenAPI
//! document is generated from these very types (with the feature `openapi`), so the
//! document, the server and a Rust client cannot disagree on a field.
//!
//! # Map
//! - [`accounts`]: opening an account, reading one, and its entries.
//! - [`tickets`]: a ticket issued, and a ticket with the response stored under it.
//! - [`spends`]: withdrawals, deposits and lottery draws — what is sent, what they answer.
//! - [`orders`]: placing an order and paying it once.
//! - [`payouts`]: a payout sent, its answer, where it stands, and what the bank holds for
//!   it.
//! - [`webhooks`]: webhook endpoints, their deliveries, the event types, the embedded
//!   mode's demonstration inbox.
//! - [`service`]: liveness and readiness.
//! - [`integral`]: how amounts are read — an integral number such as `250.0` counts.
//!
//! Every request type refuses unknown fields, as the server does; answer types read
//! whatever the server adds later.

pub mod accounts;
pub mod holds;
pub mod integral;
pub mod orders;
pub mod payouts;
pub mod service;
pub mod spends;
pub mod tickets;
pub mod webhooks;

pub use integral::integral;
