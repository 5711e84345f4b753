//! `payonce`: serve the API (the default), `payonce audit` the ledger, or `payonce
//! reconcile` its payouts with the bank. What each does is `api::commands`.

use std::process::ExitCode;

use api::config::Cli;
use clap::Parser;

/// mimalloc, not glibc's malloc: under load the service allocates and frees small buffers on
/// every worker thread, where glibc's arenas spent about a tenth of its CPU
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    api::commands::run(Cli::parse()).await
}
