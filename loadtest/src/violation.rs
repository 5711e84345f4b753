//! What the audit finds: a broken expectation, its kind, and the way the audit's parts
//! record one. The auditor (`audit.rs`) and its parts for payouts and webhooks all write
//! findings; kept here, those parts sit below the auditor that calls them instead of
//! importing from it.

use serde::Serialize;

/// One broken expectation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which expectation.
    pub kind: ViolationKind,
    /// The account concerned.
    pub account: String,
    /// The ticket concerned, if one.
    pub ticket: Option<String>,
    /// The particulars.
    pub detail: String,
}

/// The expectations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ViolationKind {
    /// A status or problem type the contract does not declare for this request (a 500,
    /// an undeclared 503, a 404 for a valid ticket...).
    UndeclaredAnswer,
    /// A request that got no answer at all (connection refused or reset, a timeout): a
    /// crashing or hanging server, in a run that did not kill one on purpose.
    Unanswered,
    /// More than one attempt of the same request executed.
    ExecutedTwice,
    /// A definitive answer that differs from the ticket's outcome.
    ReplayMismatch,
    /// The ticket, read back after the run, stores another outcome than the one its
    /// requests were answered with.
    StoredOutcomeMismatch,
    /// An outcome a client was given (a 2xx, or a stored refusal) that the ledger no
    /// longer holds: the ticket, read back after the run, is still issued or unknown, or a
    /// resend after the run found no ticket. What a failover to a replica that never got
    /// the commit loses.
    AcknowledgedOutcomeLost,
    /// A resend after the run ([`Role::Recheck`](crate::history::Role::Recheck)) executed
    /// the ticket again instead of replaying the outcome a client had been given: the
    /// ledger lost it, and the money moved twice.
    ExecutedAgain,
    /// A different request under a used ticket was not refused with 422.
    ReuseNotRefused,
    /// The final balance or points differ from what the executed tickets add up to.
    BalanceMismatch,
    /// A ticket that executed has no entry, more than one, or one that does not match it;
    /// or a ticket that did not execute has one.
    EntryMismatch,
    /// An entry for a ticket the run never sent.
    UnknownEntry,
    /// The opening entry does not match the opening balance and points.
    OpeningMismatch,
    /// A balance or points below zero.
    Negative,
    /// The account's entries do not add up to its balance or points.
    EntriesDoNotAddUp,
    /// An entry decided on an older balance or points than the previous entry left: it
    /// overwrote what was written since (a lost update).
    StaleWrite,
    /// An order paid by more than one ticket, or with more than one payment entry.
    OrderPaidTwice,
    /// An order's payments disagree with it: a ticket refused as `order-already-paid`
    /// while the order has no payment, or a payment entry by a ticket that was not
    /// answered 201 when one was.
    OrderMismatch,
    /// A hold resolved more than once: two of its captures and voids executed, or one
    /// executed while the hold reads expired (or still held).
    HoldResolvedTwice,
    /// A hold disagrees with what was done to it: its state, its captured or refunded
    /// amount against the requests that executed.
    HoldMismatch,
    /// A payment's executed refunds add up to more than it paid.
    RefundedTooMuch,
    /// The money available is below zero, or is not the balance less the holds read held.
    AvailableMismatch,
    /// The run has no final state for something it must judge.
    Missing,
    /// A payout the bank executed more than once (under any keys).
    PaidTwice,
    /// A `succeeded` payout with no executed transfer of its amount at the bank.
    MissingAtBank,
    /// A `failed` payout — its money given back — that the bank executed.
    ReversedButExecuted,
    /// A committed outcome whose event the receiver never took.
    EventMissing,
    /// An event for an outcome the run did not commit: a request refused before it
    /// executed, or a transaction that rolled back.
    EventUnexpected,
    /// A delivery whose signature did not verify with its endpoint's secret.
    BadSignature,
    /// One event delivered under more than one `webhook-id`: a receiver could not drop
    /// the repeat.
    EventIdsDiffer,
    /// One `webhook-id` delivered with different bodies.
    EventChanged,
}

/// The auditor's way of recording a finding: kind, ticket, particulars.
pub(crate) type Flag<'a> = dyn FnMut(ViolationKind, Option<&str>, String) + 'a;
