//! The pgbench baseline, shared by the ledger's and the API's benchmarks (each includes this
//! file): tables shaped like the ledger's (`schema.sql`) and the bare SQL of a withdrawal —
//! one conditional UPDATE plus one INSERT per transaction (`withdraw.sql`).

use std::process::Command;

const BENCH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../ledger/bench");

/// Creates (or re-creates) pgbench's tables with `accounts` accounts.
pub fn create_tables(url: &str, accounts: usize) -> Result<(), Box<dyn std::error::Error>> {
    let setup = Command::new("psql")
        .args([
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            &format!("accounts={accounts}"),
        ])
        .args(["-f", &format!("{BENCH}/schema.sql"), url])
        .output()?;
    if !setup.status.success() {
        return Err(format!("psql: {}", String::from_utf8_lossy(&setup.stderr)).into());
    }
    Ok(())
}

/// Runs the withdrawal script for `seconds` at `clients` clients (prepared statements, two
/// threads); returns its transactions per second.
pub fn run(
    url: &str,
    accounts: usize,
    clients: usize,
    seconds: u64,
) -> Result<f64, Box<dyn std::error::Error>> {
    let output = Command::new("pgbench")
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &clients.to_string(),
            "-j",
            "2",
        ])
        .args([
            "-T",
            &seconds.to_string(),
            "-D",
            &format!("accounts={accounts}"),
        ])
        .args(["-f", &format!("{BENCH}/withdraw.sql"), url])
        .output()
        .map_err(|error| {
            format!("cannot run pgbench ({error}): apt-get install postgresql-contrib")
        })?;
    let stdout = String::from_utf8(output.stdout)?;
    stdout
        .lines()
        .find_map(|line| {
            line.strip_prefix("tps = ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .ok_or_else(|| {
            format!(
                "pgbench printed no tps: {stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            )
            .into()
        })
}
