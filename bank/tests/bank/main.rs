//! The bank's tests: each starts the real `payonce-bank` binary on a loopback port and a
//! fresh store (SQLite, or a PostgreSQL database of its own), and talks HTTP to it — but
//! for `library.rs`, which starts it in-process as payonce's embedded mode will.

mod audit;
mod close;
mod faults;
mod library;
mod support;
mod transfers;
