//! Creates sent with an idempotency key: where their first answer is kept, and how an
//! account's API key is kept in it without being stored.
//!
//! A create — an account, an order — may carry a client-chosen UUID as its idempotency
//! key. Keys belong to a [`CreateScope`]: the account for orders, the client's address for
//! accounts. The first request with a key creates and stores its answer (status and body)
//! in a `creations` row, in the same transaction as what it created; a repeat with the same
//! fingerprint answers that again, another request under the key is refused.
//!
//! The row is found by [`CreateKey::record_id`], SHA-256 of the scope and the key, so the
//! database never holds the client's key. An account's answer shows its API key, which
//! the ledger stores only as a hash; to show it again on a replay it is stored **sealed**:
//! XORed with a pad of SHA-256 blocks over a domain string, the scope, the key and the new
//! account's id. The pad is a one-time pad from a PRF keyed by the client's idempotency
//! key: someone who reads the database (or a backup) but does not know that key cannot
//! recover the API key — provided the key is unguessable, as a random (version 4) UUID is.
//! Every sealed key has a pad of its own (the account id is in it), even when a client
//! reuses an idempotency key after its row expired.

use std::net::IpAddr;

use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::types::Json;
use uuid::Uuid;

use crate::db_types::from_row;
use crate::error::LedgerError;
use crate::model::{AccountId, OrderId, StoredResponse};

/// Separates the record ids from every other SHA-256 the ledger takes.
const RECORD_DOMAIN: &[u8] = b"payonce/create-record/v1";
/// Separates the pads from the record ids.
const PAD_DOMAIN: &[u8] = b"payonce/create-api-key-pad/v1";

/// Whose idempotency keys a create's key is among: the same UUID in two scopes is two keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateScope {
    /// An account's orders.
    OrdersOf(AccountId),
    /// Accounts opened from one client address.
    AccountsFrom(IpAddr),
    /// An account's requests about its webhook endpoints (`requests.rs`).
    WebhooksOf(AccountId),
}

/// The answer to a create sent with an idempotency key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created<Id> {
    /// What was created: now, or by the first request with the key.
    pub id: Id,
    /// The first answer (for an account, without its API key, which comes beside it).
    pub response: StoredResponse,
    /// True when the key had been used by an earlier request: this is its answer again.
    pub replayed: bool,
}

/// Builds the body stored (and replayed) for what a create made. The ledger decides the
/// status (201); the caller decides the body's shape.
pub type CreateRenderer<T> = dyn Fn(&T) -> Value + Send + Sync;

/// A create's idempotency key in its scope: what its record is stored under and what seals
/// the API key it must give back.
#[derive(Clone, Debug)]
pub(crate) struct CreateKey {
    /// The scope and the key, unambiguously: a tag, fixed-length fields.
    input: Vec<u8>,
}

impl CreateKey {
    pub(crate) fn new(scope: CreateScope, key: Uuid) -> Self {
        let mut input = Vec::with_capacity(34);
        match scope {
            CreateScope::OrdersOf(account) => {
                input.push(b'o');
                input.extend_from_slice(account.0.as_bytes());
            }
            CreateScope::WebhooksOf(account) => {
                input.push(b'w');
                input.extend_from_slice(account.0.as_bytes());
            }
            // A v4 address mapped into v6 is the same client as the bare v4 one.
            CreateScope::AccountsFrom(address) => match address.to_canonical() {
                IpAddr::V4(v4) => {
                    input.push(b'4');
                    input.extend_from_slice(&v4.octets());
                }
                IpAddr::V6(v6) => {
                    input.push(b'6');
                    input.extend_from_slice(&v6.octets());
                }
            },
        }
        input.extend_from_slice(key.as_bytes());
        Self { input }
    }

    /// What the record is stored under: SHA-256 of the scope and the key.
    pub(crate) fn record_id(&self) -> Vec<u8> {
        Sha256::new()
            .chain_update(RECORD_DOMAIN)
            .chain_update(&self.input)
            .finalize()
            .to_vec()
    }

    /// `secret` XORed with the pad for what `created` names. Sealing and unsealing are the
    /// same operation.
    pub(crate) fn seal(&self, created: Uuid, secret: &[u8]) -> Vec<u8> {
        secret
            .chunks(32)
            .zip(0_u32..)
            .flat_map(|(chunk, block)| {
                let pad = Sha256::new()
                    .chain_update(PAD_DOMAIN)
                    .chain_update(&self.input)
                    .chain_update(created.as_bytes())
                    .chain_update(block.to_be_bytes())
                    .finalize();
                chunk
                    .iter()
                    .zip(pad)
                    .map(|(byte, pad)| byte ^ pad)
                    .collect::<Vec<u8>>()
            })
            .collect()
    }
}

/// A creation record to write, in the transaction that writes what it announces.
#[derive(Clone, Debug)]
pub(crate) struct NewCreation<'a> {
    /// [`CreateKey::record_id`].
    pub key_hash: Vec<u8>,
    /// The request's fingerprint.
    pub fingerprint: &'a str,
    /// The answer.
    pub response: StoredResponse,
    /// An account's API key, sealed ([`CreateKey::seal`]); `None` for an order.
    pub sealed_api_key: Option<Vec<u8>>,
}

from_row! {
    /// A creation record as the database holds it.
    pub(crate) struct CreationRow {
        fingerprint: String,
        created_account: Option<AccountId>,
        created_order: Option<OrderId>,
        response_status: i32,
        response_body: Json<Value>,
        sealed_api_key: Option<Vec<u8>>,
    }
}

/// What a found record means to a create that meant to make `ours` with `fingerprint`:
/// its own earlier attempt, whose commit answer was lost (`ours` is what the record
/// announces: answered as the original), the same request again (a replay), or another
/// request under the key (refused). Also the id it announces, and its sealed API key.
pub(crate) fn judge<Id: PartialEq>(
    row: CreationRow,
    ours: Id,
    announced: impl FnOnce(&CreationRow) -> Option<Id>,
    fingerprint: &str,
) -> Result<(Created<Id>, Option<Vec<u8>>), LedgerError> {
    let id = announced(&row).ok_or_else(|| {
        LedgerError::Corrupt("a creation record announces something else".to_owned())
    })?;
    let replayed = if id == ours {
        false
    } else if row.fingerprint == fingerprint {
        true
    } else {
        return Err(LedgerError::CreateKeyReused);
    };
    let status = u16::try_from(row.response_status).map_err(|_| {
        LedgerError::Corrupt(format!("creation record: status {}", row.response_status))
    })?;
    let Json(body) = row.response_body;
    Ok((
        Created {
            id,
            response: StoredResponse { status, body },
            replayed,
        },
        row.sealed_api_key,
    ))
}

impl CreationRow {
    /// The account it announces, if it announces one.
    pub(crate) fn account(&self) -> Option<AccountId> {
        self.created_account
    }

    /// The order it announces, if it announces one.
    pub(crate) fn order(&self) -> Option<OrderId> {
        self.created_order
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    fn key(scope: CreateScope, uuid: Uuid) -> CreateKey {
        CreateKey::new(scope, uuid)
    }

    #[test]
    fn a_sealed_key_opens_with_the_same_key_only() {
        let client = CreateScope::AccountsFrom(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        let (idempotency, account) = (Uuid::new_v4(), Uuid::new_v4());
        let api_key = format!("po_{}", "ab".repeat(32));
        let sealed = key(client, idempotency).seal(account, api_key.as_bytes());
        assert_eq!(sealed.len(), api_key.len());
        assert_ne!(sealed, api_key.as_bytes());
        assert_eq!(
            key(client, idempotency).seal(account, &sealed),
            api_key.as_bytes()
        );
        for (other_key, other_account) in [(Uuid::new_v4(), account), (idempotency, Uuid::new_v4())]
        {
            assert_ne!(
                key(client, other_key).seal(other_account, &sealed),
                api_key.as_bytes()
            );
        }
    }

    #[test]
    fn records_are_the_scopes_own() {
        let idempotency = Uuid::new_v4();
        let account = AccountId(Uuid::new_v4());
        let v4 = Ipv4Addr::new(192, 0, 2, 7);
        let ids = [
            key(CreateScope::OrdersOf(account), idempotency).record_id(),
            key(
                CreateScope::OrdersOf(AccountId(Uuid::new_v4())),
                idempotency,
            )
            .record_id(),
            key(CreateScope::AccountsFrom(IpAddr::V4(v4)), idempotency).record_id(),
            key(
                CreateScope::AccountsFrom(IpAddr::V6(Ipv6Addr::LOCALHOST)),
                idempotency,
            )
            .record_id(),
            key(CreateScope::OrdersOf(account), Uuid::new_v4()).record_id(),
            key(CreateScope::WebhooksOf(account), idempotency).record_id(),
        ];
        for (i, a) in ids.iter().enumerate() {
            assert_eq!(a.len(), 32);
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(
            key(CreateScope::AccountsFrom(IpAddr::V4(v4)), idempotency).record_id(),
            key(
                CreateScope::AccountsFrom(IpAddr::V6(v4.to_ipv6_mapped())),
                idempotency
            )
            .record_id(),
            "a mapped v4 address is the v4 client"
        );
    }
}
