//! The creates' writes: an account with its opening entry, an order, each with the record
//! of its idempotency key when it was sent with one (`creates.rs`). Each is one
//! transaction that recognises what an earlier attempt of its own committed, so that it
//! may run again when its connection dies under it, the COMMIT's answer included.

use serde_json::Value;
use sqlx::types::Json;
use sqlx::{ColumnIndex, Decode, Encode, Executor, FromRow, Type};

use crate::creates::{CreationRow, NewCreation};
use crate::db_types::Timestamp;
use crate::dialect::Dialect;
use crate::error::{LedgerError, ResultExt, commit_or_unknown};
use crate::model::{Account, AccountId, EntryKind, Order, OrderId, TicketId};
use crate::rows::{INSERT_ENTRY, OrderRow, order_columns};
use crate::sql_store::SqlStore;

/// Opens an account, unless its id is taken (by an earlier attempt of the same create,
/// whose commit answer was lost). Parameters: $1 id, $2 name, $3 balance, $4 points, $5
/// API key hash, $6 when. Returns the id if it inserted.
const INSERT_ACCOUNT: &str = "
    INSERT INTO accounts (id, name, balance, points, api_key_hash, fencing_token, created_at)
    VALUES ($1, $2, $3, $4, $5, 0, $6)
    ON CONFLICT (id) DO NOTHING
    RETURNING id";

/// Places an order, unless its id is taken (as for [`INSERT_ACCOUNT`]). Parameters: $1
/// id, $2 account, $3 amount, $4 description, $5 when. Returns the order if it inserted.
pub(crate) const INSERT_ORDER: &str = concat!(
    "INSERT INTO orders (id, account_id, amount, description, fencing_token, created_at)
     VALUES ($1, $2, $3, $4, 0, $5)
     ON CONFLICT (id) DO NOTHING
     RETURNING ",
    order_columns!()
);

/// Claims a create's idempotency key with its record, unless the key has one. (On
/// PostgreSQL a record another transaction is writing makes this wait for it.)
/// Parameters: $1 key hash, $2 fingerprint, $3 the account created or NULL, $4 the order
/// created or NULL, $5 status, $6 body, $7 sealed API key or NULL, $8 when. Returns the
/// key hash if it claimed the key.
const CLAIM_CREATION: &str = "
    INSERT INTO creations (key_hash, fingerprint, created_account, created_order,
                           response_status, response_body, sealed_api_key, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
    ON CONFLICT (key_hash) DO NOTHING
    RETURNING key_hash";

/// A creation record, as [`CreationRow`] reads it. Parameter: $1 key hash.
const CREATION: &str = "
    SELECT fingerprint, created_account, created_order, response_status, response_body,
           sealed_api_key
    FROM creations WHERE key_hash = $1";

/// The steps of the creates: each a transaction that recognises what an earlier attempt of
/// its own committed, so that [`SqlStore::again_if_cut`] may run it again.
impl<D> SqlStore<D>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> i64: Encode<'q, D> + Type<D>,
    for<'q> i32: Encode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> Vec<u8>: Encode<'q, D> + Decode<'q, D> + Type<D>,
    usize: ColumnIndex<D::Row>,
    for<'q> AccountId: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> OrderId: Encode<'q, D> + Type<D>,
    TicketId: Type<D>,
    for<'q> Option<TicketId>: Encode<'q, D>,
    for<'q> Option<AccountId>: Encode<'q, D>,
    for<'q> Option<OrderId>: Encode<'q, D>,
    for<'q> Option<Vec<u8>>: Encode<'q, D>,
    for<'q> Timestamp: Encode<'q, D> + Type<D>,
    for<'q> Json<&'q Value>: Encode<'q, D> + Type<D>,
    for<'r> OrderRow: FromRow<'r, D::Row>,
    for<'r> CreationRow: FromRow<'r, D::Row>,
    for<'r> (String, Vec<u8>, Timestamp): FromRow<'r, D::Row>,
{
    /// One attempt of [`Store::create_account`](crate::store::Store::create_account).
    pub(crate) async fn try_create_account(
        &self,
        account: &Account,
        key_hash: &[u8],
        creation: Option<&NewCreation<'_>>,
    ) -> Result<Option<CreationRow>, LedgerError> {
        let now = Timestamp(account.created_at);
        let mut tx = self.begin_write().await?;
        if let Some(creation) = creation
            && let Some(found) = Self::claim(&mut tx, creation, Some(account.id), None, now).await?
        {
            return Ok(Some(found));
        }
        let inserted: Option<AccountId> = sqlx::query_scalar(INSERT_ACCOUNT)
            .bind(account.id)
            .bind(account.name.as_str())
            .bind(account.balance)
            .bind(account.points)
            .bind(key_hash.to_vec())
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .or_constraint()?;
        if inserted.is_none() {
            // An earlier attempt committed it (and its record, which the claim would have
            // found): nothing more to write.
            let found: Option<(String, Vec<u8>, Timestamp)> =
                sqlx::query_as("SELECT name, api_key_hash, created_at FROM accounts WHERE id = $1")
                    .bind(account.id)
                    .fetch_optional(&mut *tx)
                    .await?;
            return match found {
                Some((name, hash, created_at))
                    if name == account.name && hash == key_hash && created_at == now =>
                {
                    Ok(None)
                }
                _ => Err(LedgerError::Corrupt(format!(
                    "account {}: the id is another account's",
                    account.id
                ))),
            };
        }
        sqlx::query(INSERT_ENTRY)
            .bind(account.id)
            .bind(None::<TicketId>)
            .bind(EntryKind::Opening.as_str())
            .bind(account.balance)
            .bind(account.points)
            .bind(account.balance)
            .bind(account.points)
            .bind(0_i64)
            .bind(now)
            .execute(&mut *tx)
            .await
            .or_constraint()?;
        commit_or_unknown(tx).await?;
        Ok(None)
    }

    /// One attempt of [`Store::create_order`](crate::store::Store::create_order) with an idempotency key.
    pub(crate) async fn try_create_order(
        &self,
        order: &Order,
        creation: &NewCreation<'_>,
    ) -> Result<Option<CreationRow>, LedgerError> {
        let now = Timestamp(order.created_at);
        let mut tx = self.begin_write().await?;
        if let Some(found) = Self::claim(&mut tx, creation, None, Some(order.id), now).await? {
            return Ok(Some(found));
        }
        let inserted: Option<OrderRow> = sqlx::query_as(INSERT_ORDER)
            .bind(order.id)
            .bind(order.account_id)
            .bind(order.amount.get())
            .bind(order.description.as_str())
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .or_constraint()?;
        if inserted.is_none() {
            // Our key was free, so no attempt of ours committed: the id is another's.
            return Err(LedgerError::Corrupt(format!(
                "order {}: the id is another order's",
                order.id
            )));
        }
        commit_or_unknown(tx).await?;
        Ok(None)
    }

    /// Claims `creation`'s key for what it announces (`account` or `order`): `None` once
    /// claimed, or the record that held the key already — written by a transaction that
    /// committed (on PostgreSQL one still open is waited for). A record reaped between
    /// the claim and the read is claimed again.
    async fn claim(
        tx: &mut sqlx::Transaction<'static, D>,
        creation: &NewCreation<'_>,
        account: Option<AccountId>,
        order: Option<OrderId>,
        now: Timestamp,
    ) -> Result<Option<CreationRow>, LedgerError> {
        for _ in 0..2 {
            let claimed: Option<Vec<u8>> = sqlx::query_scalar(CLAIM_CREATION)
                .bind(creation.key_hash.clone())
                .bind(creation.fingerprint)
                .bind(account)
                .bind(order)
                .bind(i32::from(creation.response.status))
                .bind(Json(&creation.response.body))
                .bind(creation.sealed_api_key.clone())
                .bind(now)
                .fetch_optional(&mut **tx)
                .await
                .or_constraint()?;
            if claimed.is_some() {
                return Ok(None);
            }
            let found: Option<CreationRow> = sqlx::query_as(CREATION)
                .bind(creation.key_hash.clone())
                .fetch_optional(&mut **tx)
                .await?;
            if found.is_some() {
                return Ok(found);
            }
        }
        Err(LedgerError::Corrupt(
            "a creation record came and went twice while it was claimed".to_owned(),
        ))
    }
}

/// An order read back after its insert found the id taken: ours, written by an earlier
/// attempt whose answer was lost, if it is the same order; else the id is another's.
pub(crate) fn recognise_order(order: &Order, found: Option<Order>) -> Result<(), LedgerError> {
    match found {
        Some(found)
            if found.account_id == order.account_id
                && found.amount == order.amount
                && found.description == order.description
                && found.created_at == order.created_at =>
        {
            Ok(())
        }
        _ => Err(LedgerError::Corrupt(format!(
            "order {}: the id is another order's",
            order.id
        ))),
    }
}
