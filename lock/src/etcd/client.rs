//! etcd's gRPC API, as much of it as the etcd lock uses: the client `build.rs` generates
//! from payonce's own subset of etcd's proto (`proto/etcd.proto`; why a subset: its
//! header), and a thin [`Etcd`] handle over it with builders for the requests the lock
//! sends. Errors stay gRPC's [`Status`]; `etcd.rs` maps them to [`LockError`]s.

use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use tonic::Status;
use tonic::codec::Streaming;
use tonic::transport::{Channel, Endpoint};

use crate::error::LockError;

/// The generated messages and clients.
#[allow(missing_debug_implementations, clippy::all, clippy::pedantic)]
pub(crate) mod pb {
    tonic::include_proto!("etcdserverpb");
}

use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::maintenance_client::MaintenanceClient;
use pb::range_request::{SortOrder, SortTarget};
use pb::watch_client::WatchClient;
use pb::watch_create_request::FilterType;
use pb::{
    Compare, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest, LeaseGrantResponse,
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, ResponseOp, StatusRequest, TxnRequest, TxnResponse,
    WatchCreateRequest, WatchRequest, WatchResponse, request_op, response_op, watch_request,
};

/// The members to send requests to, checked and bounded in time; connected on first use.
#[derive(Clone, Debug)]
pub(crate) struct Members(Vec<Endpoint>);

impl Members {
    /// `http://host:port` URLs; connecting, and every request up to its answer's headers,
    /// bounded by `timeout`.
    pub(crate) fn new(urls: &[String], timeout: Duration) -> Result<Self, LockError> {
        urls.iter()
            .map(|url| {
                Endpoint::from_shared(url.clone())
                    .map(|endpoint| endpoint.connect_timeout(timeout).timeout(timeout))
                    .map_err(|error| LockError::Invalid(format!("bad etcd member {url}: {error}")))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

/// A connection to an etcd cluster, balanced over its members: cheap to clone, each clone
/// sends on the same connections.
#[derive(Clone, Debug)]
pub(crate) struct Etcd {
    kv: KvClient<Channel>,
    watch: WatchClient<Channel>,
    lease: LeaseClient<Channel>,
    maintenance: MaintenanceClient<Channel>,
}

impl Etcd {
    /// Connects lazily (a cluster that is down shows on first use); must be called inside
    /// a Tokio runtime, which runs the balancer.
    pub(crate) fn connect(members: &Members) -> Self {
        let channel = Channel::balance_list(members.0.clone().into_iter());
        Self {
            kv: KvClient::new(channel.clone()),
            watch: WatchClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            maintenance: MaintenanceClient::new(channel),
        }
    }

    pub(crate) async fn range(&self, range: RangeRequest) -> Result<RangeResponse, Status> {
        Ok(self.kv.clone().range(range).await?.into_inner())
    }

    /// Puts `value` at `key`, on `lease` (0: on none).
    pub(crate) async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: i64,
    ) -> Result<PutResponse, Status> {
        let put = PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
        };
        Ok(self.kv.clone().put(put).await?.into_inner())
    }

    pub(crate) async fn delete(
        &self,
        key: impl Into<Vec<u8>>,
    ) -> Result<DeleteRangeResponse, Status> {
        let delete = DeleteRangeRequest { key: key.into() };
        Ok(self.kv.clone().delete_range(delete).await?.into_inner())
    }

    pub(crate) async fn txn(&self, txn: TxnRequest) -> Result<TxnResponse, Status> {
        Ok(self.kv.clone().txn(txn).await?.into_inner())
    }

    /// A lease of `ttl` seconds, its id picked by etcd.
    pub(crate) async fn grant(&self, ttl: i64) -> Result<LeaseGrantResponse, Status> {
        let grant = LeaseGrantRequest { ttl, id: 0 };
        Ok(self.lease.clone().lease_grant(grant).await?.into_inner())
    }

    /// Ends lease `id` now, deleting every key on it.
    #[cfg(feature = "test-support")]
    pub(crate) async fn revoke(&self, id: i64) -> Result<(), Status> {
        self.lease
            .clone()
            .lease_revoke(pb::LeaseRevokeRequest { id })
            .await?;
        Ok(())
    }

    /// Opens a keep-alive stream for lease `id` with a first keep-alive, and reads its
    /// answer (as [`KeepAlive::renew`] does).
    pub(crate) async fn keep_alive(&self, id: i64) -> Result<(KeepAlive, Option<i64>), Status> {
        let (requests, outgoing) = mpsc::unbounded();
        // Queued before the stream opens: etcd sends the stream's headers only with its
        // first answer, so opening waits for one.
        requests
            .unbounded_send(LeaseKeepAliveRequest { id })
            .map_err(|_| Status::unavailable("the keep-alive stream closed"))?;
        let answers = self.lease.clone().lease_keep_alive(outgoing).await?;
        let mut keeper = KeepAlive {
            id,
            requests,
            answers: answers.into_inner(),
        };
        let first = keeper.answer().await?;
        Ok((keeper, first))
    }

    /// A watch on the deletes of `key` from revision `from` on. Its first message says the
    /// watch was created.
    pub(crate) async fn watch_deletes(
        &self,
        key: impl Into<Vec<u8>>,
        from: i64,
    ) -> Result<Streaming<WatchResponse>, Status> {
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: key.into(),
                    start_revision: from,
                    filters: vec![FilterType::Noput.into()],
                },
            )),
        };
        // The request side stays open for as long as the watch is read: a client that
        // closes it may find its watches ended.
        let requests = futures::stream::iter([create]).chain(futures::stream::pending());
        Ok(self.watch.clone().watch(requests).await?.into_inner())
    }

    /// The answering member's status.
    pub(crate) async fn status(&self) -> Result<(), Status> {
        self.maintenance.clone().status(StatusRequest {}).await?;
        Ok(())
    }
}

/// A lease's keep-alive stream.
#[derive(Debug)]
pub(crate) struct KeepAlive {
    id: i64,
    requests: mpsc::UnboundedSender<LeaseKeepAliveRequest>,
    answers: Streaming<LeaseKeepAliveResponse>,
}

impl KeepAlive {
    /// One keep-alive: the TTL etcd answers with (0 or less: the lease is gone), or `None`
    /// when the stream ended.
    pub(crate) async fn renew(&mut self) -> Result<Option<i64>, Status> {
        self.requests
            .unbounded_send(LeaseKeepAliveRequest { id: self.id })
            .map_err(|_| Status::unavailable("the keep-alive stream closed"))?;
        self.answer().await
    }

    async fn answer(&mut self) -> Result<Option<i64>, Status> {
        Ok(self.answers.message().await?.map(|answer| answer.ttl))
    }
}

/// Whether a watch answer says the key was deleted — or that the watch was cancelled (its
/// start revision compacted away), after which it can no longer tell.
pub(crate) fn deleted_or_cancelled(answer: &WatchResponse) -> bool {
    answer.canceled
        || answer
            .events
            .iter()
            .any(|event| event.r#type() == pb::event::EventType::Delete)
}

impl RangeRequest {
    /// The one key `key`.
    pub(crate) fn key(key: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.into(),
            ..Self::default()
        }
    }

    /// Every key that starts with `prefix`.
    pub(crate) fn prefix(prefix: impl Into<Vec<u8>>) -> Self {
        let key = prefix.into();
        Self {
            range_end: prefix_end(&key),
            key,
            ..Self::default()
        }
    }

    /// Sorted by create revision: oldest first, or newest first.
    pub(crate) fn by_creation(mut self, newest_first: bool) -> Self {
        self.set_sort_target(SortTarget::Create);
        self.set_sort_order(if newest_first {
            SortOrder::Descend
        } else {
            SortOrder::Ascend
        });
        self
    }

    pub(crate) fn limit(self, limit: i64) -> Self {
        Self { limit, ..self }
    }

    pub(crate) fn keys_only(self) -> Self {
        Self {
            keys_only: true,
            ..self
        }
    }

    #[cfg(feature = "test-support")]
    pub(crate) fn count_only(self) -> Self {
        Self {
            count_only: true,
            ..self
        }
    }

    /// Only keys created at or before `revision`.
    pub(crate) fn created_by(self, revision: i64) -> Self {
        Self {
            max_create_revision: revision,
            ..self
        }
    }
}

/// The end of the range of keys that start with `prefix`: the prefix with its last byte
/// that is not 0xff raised by one (etcd's own rule; `\0` — every key — when there is none).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&byte| byte < 0xff) {
        Some(last) => {
            let mut end = prefix[..=last].to_vec();
            end[last] += 1;
            end
        }
        None => vec![0],
    }
}

impl RequestOp {
    pub(crate) fn range(range: RangeRequest) -> Self {
        Self {
            request: Some(request_op::Request::RequestRange(range)),
        }
    }

    /// Puts `value` at `key`, on `lease` (0: on none).
    pub(crate) fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> Self {
        Self {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: key.into(),
                value: value.into(),
                lease,
            })),
        }
    }

    pub(crate) fn delete(key: impl Into<Vec<u8>>) -> Self {
        Self {
            request: Some(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest { key: key.into() },
            )),
        }
    }
}

impl Compare {
    /// `key`'s create revision is `revision` (0: the key is absent).
    pub(crate) fn created_at(key: impl Into<Vec<u8>>, revision: i64) -> Self {
        Self::revision(key, CompareTarget::Create, CompareResult::Equal, revision)
    }

    /// `key` exists: its create revision is above 0.
    pub(crate) fn exists(key: impl Into<Vec<u8>>) -> Self {
        Self::revision(key, CompareTarget::Create, CompareResult::Greater, 0)
    }

    /// `key` was last changed at `revision` (0: the key is absent).
    pub(crate) fn changed_at(key: impl Into<Vec<u8>>, revision: i64) -> Self {
        Self::revision(key, CompareTarget::Mod, CompareResult::Equal, revision)
    }

    fn revision(
        key: impl Into<Vec<u8>>,
        target: CompareTarget,
        result: CompareResult,
        revision: i64,
    ) -> Self {
        let union = match target {
            CompareTarget::Mod => TargetUnion::ModRevision(revision),
            _ => TargetUnion::CreateRevision(revision),
        };
        Self {
            result: result.into(),
            target: target.into(),
            key: key.into(),
            target_union: Some(union),
        }
    }
}

impl TxnRequest {
    /// Runs `then` if every one of `when` holds.
    pub(crate) fn new(
        when: impl IntoIterator<Item = Compare>,
        then: impl IntoIterator<Item = RequestOp>,
    ) -> Self {
        Self {
            compare: when.into_iter().collect(),
            success: then.into_iter().collect(),
        }
    }
}

impl TxnResponse {
    /// The store's revision after the transaction.
    pub(crate) fn revision(&self) -> Option<i64> {
        self.header.as_ref().map(|header| header.revision)
    }

    /// The answers to the transaction's ranges, in order.
    pub(crate) fn ranges(&self) -> impl Iterator<Item = &RangeResponse> {
        self.responses
            .iter()
            .filter_map(|response| match &response.response {
                Some(response_op::Response::ResponseRange(range)) => Some(range),
                _ => None,
            })
    }

    /// How many keys the transaction's first op deleted, when it was a delete.
    pub(crate) fn first_deleted(&self) -> Option<i64> {
        match self.responses.first() {
            Some(ResponseOp {
                response: Some(response_op::Response::ResponseDeleteRange(deleted)),
            }) => Some(deleted.deleted),
            _ => None,
        }
    }
}

impl RangeResponse {
    /// The store's revision when the range was read.
    pub(crate) fn revision(&self) -> Option<i64> {
        self.header.as_ref().map(|header| header.revision)
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    /// A prefix's range ends at the prefix with its last byte raised, carrying past 0xff.
    #[test]
    fn prefix_ranges_end_where_etcd_ends_them() {
        assert_eq!(prefix_end(b"/t/w/"), b"/t/w0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }
}
