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
//!
//! # On a running system
//!
//! Payouts are made, sent and settled while this reads, and the two sides cannot be read
//! at one instant. What makes the comparison right anyway is the order in which things
//! happen to one payout: its row commits; only then can a worker send it (its job commits
//! with it); the bank executes it, or refuses it or closes its key for good, before it
//! answers; and only after that answer is the payout settled here. So it reads, in turn:
//!
//! 1. **Every payout, in one statement** ([`Ledger::every_payout`]): one snapshot, so no
//!    payout that commits meanwhile slips between two pages, and each status is as of
//!    that instant.
//! 2. **Then the bank's transfers.** A payout `succeeded` in the snapshot was executed
//!    before the snapshot, so the bank shows its transfer (committed before the first of
//!    the bank's pages was read, it is on the page that holds its id): "the bank has no
//!    transfer for it" is never a race. A payout `failed` in the snapshot will never be executed, so
//!    an executed transfer for it is never a race either. (Read the other way round, a
//!    payout settled between the two reads would be `succeeded` without its transfer.)
//! 3. **Then the payouts named by transfers the snapshot did not know**, one by one by
//!    id. A transfer the bank executed was sent after its payout committed, so when the
//!    bank has been read that payout is there to find: a payout made after the snapshot
//!    and paid out before the bank was read is found now, and compared like the rest,
//!    instead of being "a transfer payonce does not know". Its status, read after the
//!    bank, cannot contradict the bank by timing: a payout settles only on the bank's word
//!    about the one transfer its key can have, which the bank already showed. What stays
//!    unknown is a transfer that names no payout payonce has ever committed.
//!
//! A payout made after the snapshot and not executed when the bank was read is simply not
//! in this reconciliation — nothing about it can disagree yet; the next run sees it.

use std::collections::HashSet;
use std::time::Duration;

use bank::{State, TransferPage, TransferView as Transfer};
use ledger::Ledger;
use ledger::payouts::{Payout, PayoutId, PayoutStatus, bank_key, payout_of_bank_key};
use time::OffsetDateTime;

/// What reconciling found.
#[derive(Debug, Default)]
pub struct Reconciliation {
    /// Payouts compared: those of the snapshot, and those found after it by a transfer.
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

/// Reads every payout, then every transfer, then the payouts of transfers the first read
/// did not know (in that order: see the module's docs), and compares them.
pub async fn reconcile(ledger: &Ledger, bank: &url::Url) -> Result<Reconciliation, String> {
    let mut payouts = ledger
        .every_payout()
        .await
        .map_err(|error| format!("reading the payouts: {error}"))?;
    let transfers = all_transfers(bank).await?;
    let since = committed_since(ledger, &payouts, &transfers).await?;
    payouts.extend(since);
    Ok(compare(&payouts, &transfers, OffsetDateTime::now_utc()))
}

/// The payouts that executed transfers name — by their key or their reference — and that
/// are not in `payouts`: read now, after the bank, each once. (Those that committed after
/// `payouts` was read; a name that is no payout's finds nothing.)
async fn committed_since(
    ledger: &Ledger,
    payouts: &[Payout],
    transfers: &[Transfer],
) -> Result<Vec<Payout>, String> {
    let known: HashSet<PayoutId> = payouts.iter().map(|payout| payout.id).collect();
    let mut named: Vec<PayoutId> = transfers
        .iter()
        .filter(|transfer| transfer.state == State::Executed)
        .flat_map(|transfer| {
            let by_reference = transfer.reference.parse().ok().map(PayoutId);
            [payout_of_bank_key(&transfer.idempotency_key), by_reference]
        })
        .flatten()
        .filter(|id| !known.contains(id))
        .collect();
    named.sort_unstable();
    named.dedup();
    let mut found = Vec::new();
    for id in named {
        let payout = ledger
            .payout(id)
            .await
            .map_err(|error| format!("reading payout {id}: {error}"))?;
        found.extend(payout);
    }
    Ok(found)
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
