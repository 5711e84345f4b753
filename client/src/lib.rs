//! A client of payonce that makes the safe retry the easy one.
//!
//! payonce's contract is only as safe as its clients: a spend that got no answer, a 503 or
//! a 409 `request-in-progress` must be sent again **with the same ticket**, and never with a
//! new one — a second ticket is a second spend. Here a spend is an [`Intent`]: it takes its
//! ticket once, then sends, and resends with that ticket (exponential backoff with jitter,
//! `Retry-After` honoured, up to a bound) until the answer is final. Its [`Outcome`] says
//! whether the answer was a replay of an earlier execution. A 503 `outcome-unknown` is not
//! resent: it is reported ([`Error::OutcomeUnknown`]) with the ticket to ask about. Nor is
//! a 503 `payouts-unavailable`: an instance started without a bank says it to every
//! payout until it is restarted with one, so it comes back at once as the refusal it is
//! ([`Error::Refused`]), nothing stored under the ticket. Every other POST — opening an
//! account, placing an order, creating a webhook endpoint, rotating its secret, sending a
//! delivery again — goes with an `Idempotency-Key` of its own, the same on each resend, so
//! a resend after an answer that may have come after the request ran (no answer, `503
//! timeout`) is answered as a replay, never run twice.
//!
//! # Map
//! - [`Client`] (`client.rs`): the typed calls of the whole contract — accounts and
//!   entries, tickets, orders, holds, payouts and what the bank holds for one, webhook
//!   endpoints, deliveries and the demonstration inbox, health and readiness — and the
//!   intents of the spends: withdrawals, deposits, lottery draws, order payments, holds,
//!   their captures and voids, refunds, payouts;
//!   a clone aimed at one instance ([`Client::starting_at`]) or with each send observed
//!   ([`Client::on_attempt`]), as the load test uses it.
//! - [`Intent`], [`Outcome`] (`intent.rs`): one spend and what it came to, and the client's
//!   calls that make one.
//! - [`ResendPolicy`], [`Attempt`] (`resend.rs`): how a call is sent again, and each send
//!   as it went for a caller that records them.
//! - [`Problem`], [`ProblemKind`] (`problem.rs`): the problem types with their fields, and
//!   which of them a resend may change ([`Problem::is_resendable`]).
//! - [`webhooks`]: verifying the signature of a webhook payonce sent.
//! - [`types`]: the contract's bodies, shared with the server (`payonce-types`).
//!
//! # Example
//!
//! ```no_run
//! # async fn walkthrough() -> Result<(), payonce_client::Error> {
//! use payonce_client::Client;
//! use payonce_client::types::accounts::NewAccountRequest;
//!
//! let payonce = Client::new("http://127.0.0.1:8080")?;
//! let ada = payonce
//!     .open_account(&NewAccountRequest { name: "Ada".into(), balance: 1000, points: 5 })
//!     .await?;
//! let payonce = payonce.with_key(&ada.api_key);
//!
//! // One intent, one ticket: however many times it is sent, 300 leave once.
//! let mut withdrawal = payonce.withdrawal(ada.id, 300);
//! let first = withdrawal.send().await?;
//! let again = withdrawal.send().await?;
//! assert_eq!((first.body.balance, first.replayed), (700, false));
//! assert_eq!((again.body, again.replayed), (first.body, true));
//! # Ok(())
//! # }
//! ```
//!
//! The same code runs against a real server in `tests/client.rs`, and as a program in
//! `examples/walkthrough.rs`.

mod client;
mod intent;
mod problem;
mod resend;
pub mod webhooks;

pub use client::{Client, ClientBuilder};
pub use intent::{Intent, Outcome};
pub use payonce_types as types;
pub use problem::{Problem, ProblemKind};
pub use resend::{Attempt, ResendPolicy};
use uuid::Uuid;

/// Why a call did not end with an outcome.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with a problem a resend would only repeat: a refusal (stored
    /// under the ticket, for a spend), a bad request, a missing key, a payout to an
    /// instance without a bank (`payouts-unavailable`: nothing stored).
    #[error("refused: {0}")]
    Refused(Box<Problem>),
    /// The spend's commit may or may not have happened (503 `outcome-unknown`). Ask the
    /// ticket ([`Client::ticket`]), or send the intent again later: with its ticket it
    /// executes at most once either way.
    #[error("the outcome of the spend with ticket {ticket} is unknown: {problem}")]
    OutcomeUnknown {
        /// The intent's ticket.
        ticket: Uuid,
        /// The server's answer.
        problem: Box<Problem>,
    },
    /// Every send allowed by the [`ResendPolicy`] got no final answer; the last error.
    #[error("no final answer after {attempts} attempts; the last: {last}")]
    GaveUp {
        /// The intent's ticket, if one was taken: resend with it, never with a new one.
        ticket: Option<Uuid>,
        /// Sends made.
        attempts: u32,
        /// What the last one got.
        last: Box<Error>,
    },
    /// No answer: the connection was refused, broken, or timed out.
    #[error("no answer: {0}")]
    Transport(#[from] reqwest::Error),
    /// An answer that is not what the contract says.
    #[error("unexpected answer {status}: {body}")]
    Unexpected {
        /// Its status.
        status: u16,
        /// Its body, as text.
        body: String,
    },
    /// A base URL that is not one.
    #[error("not a base URL: {0}")]
    Url(#[from] url::ParseError),
}

impl Error {
    /// The problem the server answered, if it answered one.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Self::Refused(problem) | Self::OutcomeUnknown { problem, .. } => Some(problem),
            Self::GaveUp { last, .. } => last.problem(),
            _ => None,
        }
    }
}
