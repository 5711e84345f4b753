//! An operator at an etcd cluster, for tests: does from outside what a person with
//! `etcdctl` would — revokes a lease, lists, deletes and counts keys — through the same
//! generated gRPC client as the lock (`etcd/client.rs`), but none of the lock's code.

use crate::error::LockError;
use crate::etcd::client::pb::RangeRequest;
use crate::etcd::client::{Etcd, Members};

/// A connection to an etcd cluster that acts as its operator.
#[derive(Clone, Debug)]
pub struct EtcdOperator {
    client: Etcd,
}

/// How long one request may take.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn failed(status: tonic::Status) -> LockError {
    LockError::unavailable(format!("etcd: {status}"))
}

impl EtcdOperator {
    /// Connects (lazily) to the member at `http://host:port`; inside a Tokio runtime.
    pub fn connect(endpoint: &str) -> Result<Self, LockError> {
        let members = Members::new(&[endpoint.to_owned()], TIMEOUT)?;
        Ok(Self {
            client: Etcd::connect(&members),
        })
    }

    /// Ends lease `id` now: etcd deletes every key on it.
    pub async fn revoke_lease(&self, id: i64) -> Result<(), LockError> {
        self.client.revoke(id).await.map_err(failed)
    }

    /// The keys that start with `prefix`, oldest first.
    pub async fn keys_under(&self, prefix: &str) -> Result<Vec<Vec<u8>>, LockError> {
        let range = RangeRequest::prefix(prefix).by_creation(false).keys_only();
        let found = self.client.range(range).await.map_err(failed)?;
        Ok(found.kvs.into_iter().map(|kv| kv.key).collect())
    }

    /// How many keys start with `prefix`.
    pub async fn count_under(&self, prefix: &str) -> Result<i64, LockError> {
        let range = RangeRequest::prefix(prefix).count_only();
        Ok(self.client.range(range).await.map_err(failed)?.count)
    }

    /// Deletes `key`; whether it was there.
    pub async fn delete(&self, key: &[u8]) -> Result<bool, LockError> {
        let deleted = self.client.delete(key).await.map_err(failed)?;
        Ok(deleted.deleted > 0)
    }
}
