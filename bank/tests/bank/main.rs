//! The bank's tests: each starts the real `payonce-bank` binary on a loopback port and a
//! fresh store (SQLite, or a PostgreSQL database of its own), and talks HTTP to it.

mod audit;
mod close;
mod faults;
mod support;
mod transfers;
