//! The reaper: what the retention lets go — unused tickets deleted and used tickets'
//! outcomes pruned once they expired long enough ago (by the database's clock; an outcome
//! a delivery still sends is kept), creation records and webhook requests' records
//! deleted once made long enough ago, one batch of each per call; and, by a retention of
//! their own, webhook deliveries that ended long enough ago, with their attempts. Its
//! statements, which differ between the databases only in how they lock, are in
//! `dialect.rs`.

use std::time::Duration;

use sqlx::{ColumnIndex, Decode, Encode, Executor, Pool, Type};

use crate::db_types::Timestamp;
use crate::dialect::Dialect;
use crate::error::LedgerError;
use crate::model::TicketId;

/// [`Store::reap`](crate::store::Store::reap): reads the clock on `pool`, writes through
/// `writer`. Returns how many unused tickets it deleted, outcomes it pruned and creation
/// records it deleted, at most `batch` of each.
pub(crate) async fn reap<D>(
    pool: &Pool<D>,
    writer: &Pool<D>,
    retention: Duration,
    batch: i64,
) -> Result<(u64, u64, u64), LedgerError>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> i64: Encode<'q, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> TicketId: Decode<'q, D> + Type<D>,
    for<'q> Vec<u8>: Decode<'q, D> + Type<D>,
    usize: ColumnIndex<D::Row>,
{
    let now: Timestamp = sqlx::query_scalar(D::CLOCK).fetch_one(pool).await?;
    let cutoff = before(now, retention);
    // RETURNING counts the rows the same way in both databases.
    let deleted: Vec<TicketId> = sqlx::query_scalar(D::DELETE_UNUSED)
        .bind(cutoff)
        .bind(batch)
        .fetch_all(writer)
        .await?;
    let pruned: Vec<TicketId> = sqlx::query_scalar(D::PRUNE_OUTCOMES)
        .bind(cutoff)
        .bind(now)
        .bind(batch)
        .fetch_all(writer)
        .await?;
    let expired: Vec<Vec<u8>> = sqlx::query_scalar(D::DELETE_OLD_CREATIONS)
        .bind(cutoff)
        .bind(batch)
        .fetch_all(writer)
        .await?;
    let expired_requests: Vec<Vec<u8>> = sqlx::query_scalar(D::DELETE_OLD_REQUESTS)
        .bind(cutoff)
        .bind(batch)
        .fetch_all(writer)
        .await?;
    // Counted together: both free idempotency keys. (A sum at or above the batch only
    // makes the caller come back once more.)
    Ok((
        deleted.len() as u64,
        pruned.len() as u64,
        (expired.len() + expired_requests.len()) as u64,
    ))
}

/// How long the retention keeps something, as a timestamp offset that cannot overflow.
fn before(now: Timestamp, age: Duration) -> Timestamp {
    let age = time::Duration::try_from(age).unwrap_or(time::Duration::MAX);
    Timestamp(
        now.0
            .checked_sub(age)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
    )
}

/// [`Store::reap_finished_jobs`](crate::store::Store::reap_finished_jobs): deletes at most
/// `batch` outbox jobs that finished more than `retention` ago (by the clock on `pool`),
/// through `writer`, with their attempts. Returns how many.
pub(crate) async fn reap_finished_jobs<D>(
    pool: &Pool<D>,
    writer: &Pool<D>,
    retention: Duration,
    batch: i64,
) -> Result<u64, LedgerError>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> i64: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Timestamp: Encode<'q, D> + Decode<'q, D> + Type<D>,
    usize: ColumnIndex<D::Row>,
{
    let now: Timestamp = sqlx::query_scalar(D::CLOCK).fetch_one(pool).await?;
    let deleted: Vec<i64> = sqlx::query_scalar(D::DELETE_FINISHED_JOBS)
        .bind(before(now, retention))
        .bind(batch)
        .fetch_all(writer)
        .await?;
    Ok(deleted.len() as u64)
}
