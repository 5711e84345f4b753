//! `payonce`: serve the API (the default), `payonce audit` the ledger, or `payonce
//! reconcile` its payouts with the bank. What each does is `api::commands`.

use std::process::ExitCode;

use api::config::Cli;
use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    api::commands::run(Cli::parse()).await
}
