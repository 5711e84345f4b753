//! Payouts as the ledger holds them: money that leaves for an outside bank.
//!
//! A payout is a spend ([`Operation::Payout`](crate::Operation::Payout)): its ticket's
//! transaction debits the account, writes the `payout` entry, the payout ([`Payout`],
//! `pending`) and its outbox job ([`PayoutJob`]). The bank is called after that commit, by
//! whichever instance claims the job; [`Settlement`] is what the bank's final word makes
//! of it — `succeeded`, or `failed` with a reversal entry that credits the amount back, in
//! one transaction (`outbox.rs`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::model::{AccountId, Amount, TicketId};
pub use crate::model::{Destination, InvalidDestination, MAX_DESTINATION, PayoutId};

/// Where a payout stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayoutStatus {
    /// Debited here; the bank has not said yet that it made the transfer, or that it never
    /// will.
    Pending,
    /// The bank made the transfer.
    Succeeded,
    /// The bank refused it for good; the amount was credited back.
    Failed,
}

impl PayoutStatus {
    /// Every status.
    pub const ALL: [Self; 3] = [Self::Pending, Self::Succeeded, Self::Failed];

    /// The name stored in the database and shown by the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    /// The status `name` names.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == name)
    }
}

/// A payout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payout {
    /// Its identifier.
    pub id: PayoutId,
    /// The account it was debited from.
    pub account_id: AccountId,
    /// The ticket it was sent with.
    pub ticket_id: TicketId,
    /// The amount, in minor units.
    pub amount: Amount,
    /// The account at the bank.
    pub destination: String,
    /// Where it stands.
    pub status: PayoutStatus,
    /// The bank's id of the transfer, once succeeded.
    pub bank_transfer_id: Option<String>,
    /// The bank's reason, once failed.
    pub failure_reason: Option<String>,
    /// How many times a worker claimed it to ask the bank.
    pub attempts: u32,
    /// What went wrong the last time, if anything (a timeout, the bank's 503).
    pub last_error: Option<String>,
    /// When it was debited.
    pub created_at: OffsetDateTime,
    /// When the bank's final word was recorded.
    pub settled_at: Option<OffsetDateTime>,
}

impl Payout {
    /// The idempotency key every call to the bank for this payout carries: the same on
    /// every attempt, by every instance, forever.
    pub fn bank_key(&self) -> String {
        bank_key(self.id)
    }
}

/// What every payout's bank key starts with.
const BANK_KEY_PREFIX: &str = "payonce-payout-";

/// The bank's idempotency key for payout `id` (see [`Payout::bank_key`]).
pub fn bank_key(id: PayoutId) -> String {
    format!("{BANK_KEY_PREFIX}{id}")
}

/// The payout a bank key is [`bank_key`] of, if it is one.
pub fn payout_of_bank_key(key: &str) -> Option<PayoutId> {
    let id = key.strip_prefix(BANK_KEY_PREFIX)?.parse().ok()?;
    Some(PayoutId(id)).filter(|id| bank_key(*id) == key)
}

/// A payout's job, claimed by one worker until `lease_until`: the worker asks the bank,
/// then settles or postpones the job at `attempt` — and only there: once the lease ran
/// out another worker may have claimed it (a later attempt), and the earlier one's word
/// is not recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayoutJob {
    /// The outbox row.
    pub job_id: i64,
    /// The payout, as claimed.
    pub payout: Payout,
    /// This claim's number: 1 for the first.
    pub attempt: u32,
    /// How many of the claims before this one the bank answered by asking to wait (a
    /// 429): a bank that throttles has not refused, so these do not count toward giving
    /// up by attempts — a payout's age bounds them instead.
    pub throttled: u32,
    /// When this claim was made, by the database's clock (as `created_at` is): the
    /// payout's age at this attempt is the difference.
    pub claimed_at: OffsetDateTime,
    /// Until when the claim is this worker's.
    pub lease_until: OffsetDateTime,
}

impl PayoutJob {
    /// How old the payout was when this claim was made (never negative).
    pub fn age(&self) -> Duration {
        Duration::try_from(self.claimed_at - self.payout.created_at).unwrap_or_default()
    }
}

/// The bank's final word on a payout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// It made the transfer, under this id.
    Succeeded {
        /// The bank's id of the transfer.
        transfer_id: String,
    },
    /// It will never make it (a final refusal, or a key it closed without a transfer):
    /// the amount goes back to the account.
    Failed {
        /// The bank's reason.
        reason: String,
    },
}

/// What came of a claimed job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOutcome {
    /// The bank's final word.
    Settled(Settlement),
    /// No word yet: another attempt `after` from now; `error` is what went wrong.
    Postponed {
        /// How long until the next attempt.
        after: Duration,
        /// What went wrong this time.
        error: String,
        /// The bank asked to wait (a 429): the job's count of throttled claims grows by
        /// this one, which then does not count toward giving up by attempts.
        throttled: bool,
    },
}

/// Renders a payout as its settlement's event shows it (as the API shows the payout).
pub type PayoutRenderer = dyn Fn(&Payout) -> serde_json::Value + Send + Sync;

/// What payouts the store holds, for the metrics and the operators: how many in each
/// status, and the oldest pending one's creation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PayoutCounts {
    /// Pending payouts.
    pub pending: u64,
    /// Succeeded payouts.
    pub succeeded: u64,
    /// Failed payouts.
    pub failed: u64,
    /// When the oldest pending payout was debited.
    pub oldest_pending: Option<OffsetDateTime>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_keep_their_rules_and_read_back_as_written() {
        for good in ["DE89370400440532013000", "acct_1:a-b.c", &"x".repeat(64)] {
            assert_eq!(
                Destination::new(good).map(|d| d.to_string()),
                Ok(good.to_owned())
            );
        }
        for bad in ["", "with space", "ümlaut", &"x".repeat(65), "semi;colon"] {
            assert_eq!(Destination::new(bad), Err(InvalidDestination), "{bad:?}");
        }
        assert_eq!(
            format!("{:?}", Destination::new("a1").unwrap()),
            "Destination(\"a1\")"
        );
    }

    #[test]
    fn statuses_read_back_by_name_and_keys_are_one_per_payout() {
        for status in PayoutStatus::ALL {
            assert_eq!(PayoutStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(PayoutStatus::parse("done"), None);
        let id = PayoutId::random();
        assert_eq!(bank_key(id), bank_key(id));
        assert_ne!(bank_key(id), bank_key(PayoutId::random()));
        assert_eq!(payout_of_bank_key(&bank_key(id)), Some(id));
        let upper = bank_key(id)
            .to_uppercase()
            .replace("PAYONCE-PAYOUT-", "payonce-payout-");
        for other in [
            upper.as_str(),
            "payonce-payout-",
            "fresh-key-1",
            &id.to_string(),
        ] {
            assert_eq!(payout_of_bank_key(other), None, "{other}");
        }
    }
}
