//! `payonce reconcile --bank URL`: the ledger's payouts against the bank's transfers.
//!
//! The ledger's audit proves the money inside payonce adds up; this proves the money that
//! left agrees with the bank. Every payout is matched with the bank's transfers by its key
//! ([`ledger::payouts::bank_key`]) and by its reference (the payout's id, which every
//! transfer for it carries — so a transfer sent under any other key for the same payout,
//! as a client with a fresh key per retry would send, shows too):
//!
//! - a `succeeded` payout is at the bank exactly once, executed, under its key, with its
//!   amount and destination, and its transfer id;
//! - a `failed` payout was never executed at the bank (its money came back here);
//! - no payout has more than one executed transfer;
//! - the bank holds no executed transfer payonce does not know;
//! - `pending` payouts are listed with their age (not a fault by themselves: the bank's
//!   word has not come yet).

use std::collections::HashSet;
use std::time::Duration;

use bank::{State, TransferPage, TransferView as Transfer};
use ledger::Ledger;
use ledger::payouts::{Payout, PayoutId, PayoutStatus, bank_key};
use time::OffsetDateTime;

/// What reconciling found.
#[derive(Debug, Default)]
pub struct Reconciliation {
    /// Payouts in the ledger.
    pub payouts: usize,
    /// Executed transfers at the bank.
    pub executed: usize,
    /// What disagrees, one line each.
    pub findings: Vec<String>,
    /// Pending payouts and how long they have waited.
    pub pending: Vec<(PayoutId, Duration)>,
}

impl Reconciliation {
    /// Whether the ledger and the bank agree.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Reads every payout and every transfer, and compares them.
pub async fn reconcile(ledger: &Ledger, bank: &url::Url) -> Result<Reconciliation, String> {
    let payouts = all_payouts(ledger).await?;
    let transfers = all_transfers(bank).await?;
    Ok(compare(&payouts, &transfers, OffsetDateTime::now_utc()))
}

async fn all_payouts(ledger: &Ledger) -> Result<Vec<Payout>, String> {
    let mut all: Vec<Payout> = Vec::new();
    loop {
        let after = all.last().map(|payout| payout.id);
        let page = ledger
            .payouts(None, None, after, 1000)
            .await
            .map_err(|error| format!("reading the payouts: {error}"))?;
        let full = page.len() == 1000;
        all.extend(page);
        if !full {
            return Ok(all);
        }
    }
}

async fn all_transfers(bank: &url::Url) -> Result<Vec<Transfer>, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|error| error.to_string())?;
    let base = bank.as_str().trim_end_matches('/');
    let mut all = Vec::new();
    let mut after: Option<i64> = None;
    loop {
        let mut url = format!("{base}/v1/transfers?limit=1000");
        if let Some(after) = &after {
            url.push_str(&format!("&after={after}"));
        }
        let response = client
            .get(&url)
            .send()
            .await
            .map_err(|error| format!("asking the bank: {error}"))?;
        if !response.status().is_success() {
            return Err(format!("the bank answered {} to {url}", response.status()));
        }
        let page: TransferPage = response
            .json()
            .await
            .map_err(|error| format!("reading the bank's transfers: {error}"))?;
        all.extend(page.transfers);
        match page.next_after {
            Some(next) => after = Some(next),
            None => return Ok(all),
        }
    }
}

fn transfer_id(transfer: &Transfer) -> String {
    transfer.id.to_string()
}

fn compare(payouts: &[Payout], transfers: &[Transfer], now: OffsetDateTime) -> Reconciliation {
    let executed: Vec<&Transfer> = transfers
        .iter()
        .filter(|transfer| transfer.state == State::Executed)
        .collect();
    let mut found = Reconciliation {
        payouts: payouts.len(),
        executed: executed.len(),
        findings: unknown_transfers(payouts, &executed),
        ..Reconciliation::default()
    };
    for payout in payouts {
        let its = transfers_of(payout, &executed);
        if its.len() > 1 {
            found.findings.push(format!(
                "payout {}: executed {} times at the bank (transfers {})",
                payout.id,
                its.len(),
                its.iter()
                    .map(|t| transfer_id(t))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        match payout.status {
            PayoutStatus::Succeeded => found.findings.extend(succeeded_once(payout, &its)),
            PayoutStatus::Failed if !its.is_empty() => found.findings.push(format!(
                "payout {} failed and its money came back, but the bank executed it",
                payout.id
            )),
            PayoutStatus::Failed => {}
            PayoutStatus::Pending => found.pending.push((
                payout.id,
                (now - payout.created_at).try_into().unwrap_or_default(),
            )),
        }
    }
    found
}

/// The executed transfers no payout of payonce's sent: neither under a payout's key nor
/// naming one as their reference.
fn unknown_transfers(payouts: &[Payout], executed: &[&Transfer]) -> Vec<String> {
    let keys: HashSet<String> = payouts.iter().map(|payout| bank_key(payout.id)).collect();
    let ids: HashSet<String> = payouts.iter().map(|payout| payout.id.to_string()).collect();
    executed
        .iter()
        .filter(|transfer| {
            !keys.contains(&transfer.idempotency_key) && !ids.contains(&transfer.reference)
        })
        .map(|transfer| {
            format!(
                "transfer {} under key {:?} ({} to {}): no payout of payonce's",
                transfer_id(transfer),
                transfer.idempotency_key,
                transfer.amount,
                transfer.destination
            )
        })
        .collect()
}

/// A payout's executed transfers: under its key, or naming it as their reference (a
/// transfer sent for it under another key), each once.
fn transfers_of<'t>(payout: &Payout, executed: &[&'t Transfer]) -> Vec<&'t Transfer> {
    let key = bank_key(payout.id);
    let id = payout.id.to_string();
    executed
        .iter()
        .filter(|transfer| transfer.idempotency_key == key || transfer.reference == id)
        .copied()
        .collect()
}

/// A succeeded payout's one transfer: under its key, of its amount and destination, the
/// transfer it recorded. (More than one is reported by the caller.)
fn succeeded_once(payout: &Payout, its: &[&Transfer]) -> Option<String> {
    match its {
        [] => Some(format!(
            "payout {} succeeded, but the bank has no transfer for it",
            payout.id
        )),
        [transfer] => {
            let id = transfer_id(transfer);
            let agrees = transfer.idempotency_key == bank_key(payout.id)
                && transfer.amount == payout.amount.get()
                && transfer.destination == payout.destination
                && payout.bank_transfer_id.as_deref() == Some(id.as_str());
            (!agrees).then(|| {
                format!(
                    "payout {} succeeded as transfer {:?}, but the bank's transfer {id} is {} to {} under {:?}",
                    payout.id,
                    payout.bank_transfer_id,
                    transfer.amount,
                    transfer.destination,
                    transfer.idempotency_key
                )
            })
        }
        _ => None,
    }
}
