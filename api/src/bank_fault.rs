//! The demonstration's one fault per payout: a payout request may carry
//! `Payonce-Bank-Fault: <fault>` (a fault of the bank crate's, e.g. `commit-then-drop`),
//! and the first attempt of that payout carries it on to the bank — so a person can
//! watch a payout whose first answer the bank drops after it committed, and the retry
//! under the same key get the bank's stored answer.
//!
//! Only the bank payonce serves in its own process (the embedded mode) takes it: that bank
//! is a demonstration, started with its fault header on. A bank at `PAYONCE_BANK_URL` is a
//! real one's stand-in, and payonce never asks a real bank to fail: a payout with the
//! header there is refused (422 `bank-fault-refused`), nothing stored, rather than sent
//! without the fault the client thinks it asked for.
//!
//! The fault is remembered in memory, by payout, from before the payout's transaction
//! (a worker may claim the job the moment it commits) until its first attempt takes it.
//! That is enough for the embedded mode, one process that both accepts and sends every
//! payout; a restart between the two forgets it, and the payout goes without.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use axum::http::HeaderMap;
use ledger::payouts::PayoutId;

use crate::error::ApiError;

/// The fault `headers` ask the bank to play for this payout, if any.
pub fn requested(headers: &HeaderMap) -> Result<Option<bank::Fault>, ApiError> {
    let mut values = headers.get_all(bank::FAULT_HEADER).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => return Ok(None),
        (Some(value), None) => value,
        (Some(_), Some(_)) => return Err(unknown("was sent twice")),
    };
    let name = value.to_str().map_err(|_| unknown("is not ASCII"))?;
    name.trim()
        .parse()
        .map(Some)
        .map_err(|_| unknown(&format!("{name:?} is no fault of the bank's")))
}

fn unknown(what: &str) -> ApiError {
    ApiError::BankFaultUnknown(format!(
        "Payonce-Bank-Fault {what}: a fault is one of {}; nothing was stored, the ticket is still usable",
        names().collect::<Vec<_>>().join(", ")
    ))
}

/// The names [`requested`] accepts, as the OpenAPI document lists them.
pub fn names() -> impl Iterator<Item = &'static str> {
    bank::Fault::ALL.into_iter().map(bank::Fault::name)
}

/// The faults accepted payouts wait to carry on their first attempt.
#[derive(Debug, Default)]
pub struct FirstAttemptFaults {
    /// Never held across an await.
    by_payout: Mutex<HashMap<PayoutId, bank::Fault>>,
}

impl FirstAttemptFaults {
    fn held(&self) -> MutexGuard<'_, HashMap<PayoutId, bank::Fault>> {
        // A panic elsewhere cannot leave the map half-written: each use is one call.
        self.by_payout
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers `fault` for `payout`, which the request is about to create; forgotten
    /// again when the returned guard drops, unless [`Remembered::keep`] says it was.
    pub fn remember(&self, payout: PayoutId, fault: bank::Fault) -> Remembered<'_> {
        self.held().insert(payout, fault);
        Remembered {
            faults: self,
            payout,
            kept: false,
        }
    }

    /// The fault an attempt of `payout` carries: the remembered one on the first attempt,
    /// none after. Either way it is forgotten, so no later attempt carries it.
    pub fn take(&self, payout: PayoutId, attempt: u32) -> Option<bank::Fault> {
        let fault = self.held().remove(&payout);
        fault.filter(|_| attempt == 1)
    }

    /// How many faults wait for a first attempt.
    pub fn waiting(&self) -> usize {
        self.held().len()
    }
}

/// A fault remembered for a payout the request may or may not create.
#[derive(Debug)]
pub struct Remembered<'a> {
    faults: &'a FirstAttemptFaults,
    payout: PayoutId,
    kept: bool,
}

impl Remembered<'_> {
    /// The payout was created: its first attempt takes the fault.
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Remembered<'_> {
    /// A payout this request did not create (a replay, a refusal, an error — even one
    /// that leaves the outcome unknown) has no attempt to take the fault: forget it, so
    /// nothing lingers. At worst a demonstration payout goes without its fault.
    fn drop(&mut self) {
        if !self.kept {
            self.faults.held().remove(&self.payout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(
                bank::FAULT_HEADER,
                HeaderValue::from_str(value).expect("a header value"),
            );
        }
        headers
    }

    /// Each of the bank's faults by its name; none without the header; an unknown name,
    /// or two headers, refused.
    #[test]
    fn the_header_names_one_of_the_banks_faults() {
        assert_eq!(requested(&headers(&[])).ok(), Some(None));
        for fault in bank::Fault::ALL {
            assert_eq!(requested(&headers(&[fault.name()])).ok(), Some(Some(fault)));
        }
        for bad in [&["explode"][..], &[""], &["decline", "down"]] {
            assert!(
                matches!(requested(&headers(bad)), Err(ApiError::BankFaultUnknown(_))),
                "{bad:?}"
            );
        }
    }

    /// The first attempt takes the fault, once; a later attempt never carries it; a
    /// fault whose payout was not created is forgotten.
    #[test]
    fn a_fault_is_for_the_first_attempt_of_a_created_payout_only() {
        let faults = FirstAttemptFaults::default();
        let (one, two, three) = (PayoutId::random(), PayoutId::random(), PayoutId::random());
        faults.remember(one, bank::Fault::CommitThenDrop).keep();
        faults.remember(two, bank::Fault::Decline).keep();
        drop(faults.remember(three, bank::Fault::Down));
        assert_eq!(faults.waiting(), 2);
        assert_eq!(faults.take(one, 1), Some(bank::Fault::CommitThenDrop));
        assert_eq!(faults.take(one, 1), None);
        assert_eq!(faults.take(two, 2), None);
        assert_eq!(faults.take(two, 1), None);
        assert_eq!(faults.take(three, 1), None);
        assert_eq!(faults.waiting(), 0);
    }
}
