//! The payonce load test: a pure HTTP client of the contract that hammers one or more
//! instances with spends, duplicates and races, then proves from the ledger — read back
//! through the API — that nothing was spent twice and no outcome a client was given was
//! lost.
//!
//! # Map
//! - `main.rs`: the `loadtest` binary — `loadtest [run]` and `loadtest healthz`.
//! - [`run`] (`run.rs`): the generator — accounts, clients, duplicates, holds with their
//!   captures, voids and refunds racing each other and the clock, the recheck of
//!   every acknowledged outcome after the load, the read-back; payouts stopped when a
//!   target turns out to have no bank.
//! - [`audit`] (`audit.rs`): the auditor, a pure function of the history and the final
//!   state, so tests can plant faults in recorded histories.
//! - [`violation`] (`violation.rs`): what the audit finds, which the auditor and its
//!   parts for payouts and webhooks all record.
//! - [`payouts`] (`payouts.rs`): the audit of payouts — reversals, and the bank's
//!   transfers reconciled with them.
//! - `holds.rs`: the audit of holds and refunds — each hold resolved at most once and
//!   reading what executed, refunds within their payment, available never negative.
//! - [`receiver`] (`receiver.rs`): the webhook receiver — a real HTTP server on loopback
//!   that verifies signatures and misbehaves on demand; [`webhooks`] (`webhooks.rs`): the
//!   audit of what it got against the outcomes the run committed.
//! - [`history`] (`history.rs`): what was sent and answered, and the final state.
//! - [`client`] (`client.rs`): the HTTP calls, nothing more.
//! - [`retry`] (`retry.rs`): clients that resend, with the same ticket, what got no answer
//!   or a transient one — bounded attempts, backoff, another target.
//! - [`report`] (`report.rs`): the summary table, the JSON report, the SVG chart; each
//!   says why payouts stopped, when they did.
//! - [`safety`] (`safety.rs`): loopback targets only, unless `--allow-remote`.
//! - [`healthz`] (`healthz.rs`): the generator benchmark's load — `GET /healthz` as fast as
//!   the clients can.
//!
//! Starting servers, restarting services and cutting networks is not the load test's
//! business: the lock services × faults matrix that does it is the `matrix` crate, which
//! uses this one's load and audit.

pub mod audit;
pub mod client;
pub mod healthz;
pub mod history;
mod holds;
pub mod payouts;
pub mod receiver;
pub mod report;
pub mod retry;
pub mod run;
pub mod safety;
pub mod violation;
pub mod webhooks;
