//! The webhook endpoints' POSTs sent with an idempotency key — an endpoint's creation, a
//! rotation of its secret, a delivery sent again by hand — and where their first answer is
//! kept: a `webhook_requests` row, written in the transaction of what it answers.
//!
//! The same promise as the creates' (`creates.rs`), for requests that are not spends: the
//! first request with a key runs and stores its answer; a repeat with the same fingerprint
//! gets that answer again and runs nothing — a rotation sent twice rotates once, so the
//! secret the receiver holds keeps signing through its window; another request under the
//! key is refused. Only what ran is stored: a refusal (no such endpoint, the account's
//! limit, a delivery in flight) leaves the key free.
//!
//! Keys are the account's ([`CreateScope::WebhooksOf`]); the row is found by their
//! SHA-256, never the key. A secret the answer showed is stored sealed as an account's API
//! key is: XORed with a pad derived from the client's key and the row's own `request_id`
//! (fresh for every row, so no two sealed secrets share a pad).
//!
//! A request's transaction reads the key's record first (a replay runs nothing, even past
//! a limit the first one filled), does its work, then claims the key. On PostgreSQL a
//! concurrent request with the same key is waited for at the claim; the loser rolls back
//! all it did and answers the winner's record.

use serde_json::Value;
use sqlx::types::Json;
use sqlx::{Encode, Executor, FromRow, Type};
use uuid::Uuid;

use crate::creates::{CreateKey, CreateScope};
use crate::db_types::{Timestamp, from_row};
use crate::dialect::Dialect;
use crate::error::{LedgerError, ResultExt};
use crate::model::AccountId;

/// A request's idempotency key, with what identifies the request under it.
#[derive(Clone, Copy, Debug)]
pub struct RequestKey<'a> {
    /// Whose keys it is among.
    pub account: AccountId,
    /// The client's key.
    pub key: Uuid,
    /// The request's fingerprint (method, path, canonical body).
    pub fingerprint: &'a str,
}

/// What a request sent with a key came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keyed<T> {
    /// It ran now (and, where it did something, its answer is stored under the key).
    Ran(T),
    /// An earlier request with the key ran; nothing ran now. Its answer, with the secret it
    /// showed.
    Replayed(KeptAnswer),
}

/// A kept answer, as a replay gives it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptAnswer {
    /// The status it was answered with.
    pub status: u16,
    /// Its body, without the secret.
    pub body: Value,
    /// The secret it showed, opened with the client's key; `None` where it showed none.
    pub secret: Option<String>,
}

/// The answer to keep for a request that ran: its status, its body without the secret, and
/// the secret it shows.
#[derive(Clone, Debug)]
pub(crate) struct Answer {
    pub status: u16,
    pub body: Value,
    pub secret: Option<String>,
}

/// Parameters: $1 key hash, $2 fingerprint, $3 request id, $4 status, $5 body, $6 sealed
/// secret or NULL, $7 when. Returns the key hash if it claimed the key. (On PostgreSQL a
/// record another transaction is writing makes this wait for it.)
const CLAIM_REQUEST: &str = "
    INSERT INTO webhook_requests (key_hash, fingerprint, request_id, response_status,
                                  response_body, sealed_secret, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    ON CONFLICT (key_hash) DO NOTHING
    RETURNING key_hash";

/// Parameter: $1 key hash.
const REQUEST: &str = "
    SELECT fingerprint, request_id, response_status, response_body, sealed_secret
    FROM webhook_requests WHERE key_hash = $1";

from_row! {
    /// A kept request as read.
    pub(crate) struct RequestRow {
        fingerprint: String,
        request_id: Uuid,
        response_status: i32,
        response_body: Json<Value>,
        sealed_secret: Option<Vec<u8>>,
    }
}

/// A request's key as the ledger keeps it: the record's id, and what seals its secret.
pub(crate) struct KeptKey<'a> {
    key: CreateKey,
    hash: Vec<u8>,
    fingerprint: &'a str,
}

impl<'a> KeptKey<'a> {
    pub(crate) fn new(request: &RequestKey<'a>) -> Self {
        let key = CreateKey::new(CreateScope::WebhooksOf(request.account), request.key);
        let hash = key.record_id();
        Self {
            key,
            hash,
            fingerprint: request.fingerprint,
        }
    }

    /// The record under the key, read in `tx`, if there is one.
    pub(crate) async fn find<D>(
        &self,
        tx: &mut sqlx::Transaction<'static, D>,
    ) -> Result<Option<RequestRow>, LedgerError>
    where
        D: Dialect,
        for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
        for<'q> Vec<u8>: Encode<'q, D> + Type<D>,
        for<'r> RequestRow: FromRow<'r, D::Row>,
    {
        Ok(sqlx::query_as(REQUEST)
            .bind(self.hash.clone())
            .fetch_optional(&mut **tx)
            .await?)
    }

    /// Keeps `answer` under the key, in `tx`: `None` once claimed, or the record another
    /// request with the key committed first.
    pub(crate) async fn keep<D>(
        &self,
        tx: &mut sqlx::Transaction<'static, D>,
        answer: &Answer,
        now: Timestamp,
    ) -> Result<Option<RequestRow>, LedgerError>
    where
        D: Dialect,
        for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
        for<'q> Vec<u8>: Encode<'q, D> + Type<D>,
        for<'q> Option<Vec<u8>>: Encode<'q, D>,
        for<'q> &'q str: Encode<'q, D> + Type<D>,
        for<'q> Uuid: Encode<'q, D> + Type<D>,
        for<'q> i32: Encode<'q, D> + Type<D>,
        for<'q> Json<&'q Value>: Encode<'q, D> + Type<D>,
        for<'q> Timestamp: Encode<'q, D> + Type<D>,
        for<'r> RequestRow: FromRow<'r, D::Row>,
        for<'r> (Vec<u8>,): FromRow<'r, D::Row>,
    {
        let request_id = Uuid::new_v4();
        let sealed = answer
            .secret
            .as_ref()
            .map(|secret| self.key.seal(request_id, secret.as_bytes()));
        let claimed: Option<(Vec<u8>,)> = sqlx::query_as(CLAIM_REQUEST)
            .bind(self.hash.clone())
            .bind(self.fingerprint)
            .bind(request_id)
            .bind(i32::from(answer.status))
            .bind(Json(&answer.body))
            .bind(sealed)
            .bind(now)
            .fetch_optional(&mut **tx)
            .await
            .or_constraint()?;
        if claimed.is_some() {
            return Ok(None);
        }
        self.find(tx).await?.map(Some).ok_or_else(|| {
            LedgerError::Corrupt("a request's record came and went while it was claimed".into())
        })
    }

    /// What a found record answers this request: its answer again, if it is the same
    /// request; refused ([`LedgerError::CreateKeyReused`]) if it is another.
    pub(crate) fn replay(&self, row: RequestRow) -> Result<KeptAnswer, LedgerError> {
        if row.fingerprint != self.fingerprint {
            return Err(LedgerError::CreateKeyReused);
        }
        let status = u16::try_from(row.response_status).map_err(|_| {
            LedgerError::Corrupt(format!("request record: status {}", row.response_status))
        })?;
        let secret = row
            .sealed_secret
            .map(|sealed| {
                String::from_utf8(self.key.seal(row.request_id, &sealed)).map_err(|_| {
                    LedgerError::Corrupt("request record: a sealed secret that is no text".into())
                })
            })
            .transpose()?;
        let Json(body) = row.response_body;
        Ok(KeptAnswer {
            status,
            body,
            secret,
        })
    }
}
