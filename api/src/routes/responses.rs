//! The error answers many operations share, each written once and served as an OpenAPI
//! response component (`#/components/responses/…`) that the operations refer to.
//!
//! Only answers that read the same on every operation are here. The 409, 429 and 503
//! answers stay with their operations: each says what was stored and when to resend for
//! its own operation, and the document adds `Retry-After` to them (`mod.rs`).

use utoipa::ToResponse;

use crate::error::Problem;

/// Missing or unknown key
#[derive(Debug, ToResponse)]
#[response(content_type = "application/problem+json")]
pub struct Unauthenticated(pub Problem);

/// The key is another account's
#[derive(Debug, ToResponse)]
#[response(content_type = "application/problem+json")]
pub struct OthersAccount(pub Problem);

/// Not an account id
#[derive(Debug, ToResponse)]
#[response(content_type = "application/problem+json")]
pub struct NotAnAccount(pub Problem);

/// No such ticket for this account
#[derive(Debug, ToResponse)]
#[response(content_type = "application/problem+json")]
pub struct NoSuchTicket(pub Problem);

/// Ticket expired unused, or outcome past retention
#[derive(Debug, ToResponse)]
#[response(content_type = "application/problem+json")]
pub struct TicketGone(pub Problem);

/// Body over 16 KiB
#[derive(Debug, ToResponse)]
#[response(content_type = "application/problem+json")]
pub struct BodyTooLarge(pub Problem);

/// Not JSON
#[derive(Debug, ToResponse)]
#[response(content_type = "application/problem+json")]
pub struct NotJson(pub Problem);

/// No or malformed Idempotency-Key, or malformed JSON
#[derive(Debug, ToResponse)]
#[response(content_type = "application/problem+json")]
pub struct MalformedSpend(pub Problem);

/// Malformed JSON, or a malformed Idempotency-Key (`idempotency-key-invalid`)
#[derive(Debug, ToResponse)]
#[response(content_type = "application/problem+json")]
pub struct MalformedCreate(pub Problem);
