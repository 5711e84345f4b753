//! Distributed locks with fencing tokens, for serialising work on one resource across many
//! processes.
//!
//! # Map
//! - [`open`] (`open.rs`): the one entry — the lock service a URL names (`redis://`,
//!   `redis-cluster://`, `redis-sentinel://`, `zk://`, `etcd://`, `postgres://`,
//!   `mysql://`, `mysql-row://`, `memcache://`), configured with the [`LockOptions`] every
//!   store takes; [`in_process`] the same without a URL.
//! - [`LockService`] (`service.rs`): what callers hold. `acquire(key, ttl, deadline)` returns
//!   a [`LockGuard`]; `try_acquire` never waits; `raise_fencing` restores token order after
//!   the store lost its data; `acquire_noted` / `holder_note` let a holder say what it is
//!   doing, so a waiter that gives up can tell what it waited behind. It validates every
//!   request once and caps this process's waiters per key.
//! - [`LockBackend`] (`backend.rs`): the trait a store implements, one atomic step per
//!   method, in terms of [`Lease`]s — one `acquire(key, ttl, deadline, note)`, where no
//!   deadline means never wait; [`LockOptions`], the limits (`MIN_TTL`, `MAX_NOTE`, …) and
//!   the checks against them live beside it. Backends trust what they are given.
//! - [`LockGuard`] (`guard.rs`): a held lease plus its watchdog, which renews at TTL/3 and
//!   fires [`LockGuard::lost`] the moment the lease is gone.
//! - The stores, held to one test suite, each importing only the seam (`backend.rs`) and
//!   helpers below it: [`RedisBackend`] (`redis_backend.rs`, scripts in `scripts/*.lua`;
//!   one server, a Redis Cluster or the master Redis Sentinel names, through
//!   `redis_link.rs`), [`InProcessBackend`] (`in_process.rs`), [`ZooKeeperBackend`]
//!   (`zookeeper.rs`), `EtcdBackend` (`etcd.rs`, cargo feature `etcd`),
//!   [`MemcachedBackend`] (`memcached.rs`), [`PostgresBackend`] (`postgres.rs`, advisory
//!   locks), and in `mysql/` (`mod.rs`: the database, naming and upgrade code both share)
//!   [`MySqlTableBackend`] (`table.rs`, a lock table) and [`MySqlRowBackend`] (`row.rs`,
//!   InnoDB row locks). Redis, in-process, memcached and lock-table leases are per grant
//!   (a TTL the guard renews); ZooKeeper's and etcd's are the process's session or lease,
//!   with the store's own zxid or revision as the fencing token; PostgreSQL's and the row
//!   lock's are the holder's connection ([`Sessions`]). `turns.rs`: the per-key line a
//!   process keeps for the stores that take one waiter per key per process, and the
//!   jittered polling of the two that poll (memcached, the lock table); `slot.rs`: a
//!   connection whose lock state is unknown until it is handed on.
//! - [`OwnerToken`] and [`FencingToken`] (`token.rs`); [`LockError`] (`error.rs`).
//! - `Redlock` (`redlock.rs`): the quorum lock over independent Redis servers, and
//!   `recipes` (`recipes.rs`): the classic recipes that fail. Both exist for payonce's
//!   lock services × faults demonstration, behind the cargo feature `demo`; neither hands
//!   out fencing tokens.
//!
//! # Why fencing tokens
//! A lease can run out while its holder is paused (GC, swap, a slow network), and another
//! process then takes the lock. The first holder cannot know this when it wakes. So every
//! grant carries a [`FencingToken`], strictly increasing per key; the store the lock
//! protects records the highest token it accepted and refuses older ones. The lock makes
//! conflicts rare and cheap; the fencing check makes them harmless.
//!
//! # How waiting works in Redis, and why this way
//! A lock is four keys: the lock itself (`<owner>:<token>:<note>` with a TTL), a fencing
//! counter, a queue of waiters scored by arrival (a sorted set) and each waiter's details
//! (a hash). All four expire once the key goes unused (the counter [`LockOptions::idle`]
//! past its last lease), and change only inside Lua scripts, so every step is atomic:
//! - *acquire* takes a free lock with an empty queue in one round trip (INCR the counter,
//!   SET the lock). Otherwise a waiting caller joins the queue in the same script that
//!   found the lock held — there is no gap between "saw it held" and "started waiting"
//!   for a release to fall into — unless the queue already holds the most waiters a key
//!   takes ([`LockError::QueueFull`]: a crowd on one key is turned away at once).
//! - *release* deletes the lock only if it holds the caller's owner token, then **hands it
//!   directly** to the first live waiter: grants it (new fencing token) and PUBLISHes one
//!   message to that waiter's process. One release wakes exactly one waiter, and it wakes
//!   holding the lock, so a hand-off costs one round trip and nobody can barge past the
//!   queue. PUBLISH says how many processes heard it: none means the waiter's process is
//!   gone, and the lock goes to the next waiter at once instead of sitting out a lease.
//! - *cancel* (a waiter gives up) removes one entry in O(log n), so a thousand waiters
//!   giving up at once cost the server little.
//! - Each process subscribes once to its own channel, on the same RESP3 connection as its
//!   commands, before any of its waiters queue; the message names the waiter by owner token.
//!   (In a Redis Cluster, one sharded channel per slot it waits on, which the script
//!   SPUBLISHes to from the lock's own node: see `redis_link.rs`.)
//!
//! [`LockService`] also counts each key's waiters in this process and turns away those
//! past the cap before any round trip.
//!
//! We chose pub/sub with direct hand-off over per-key wake lists (BLPOP): a blocking pop
//! occupies a connection per waiter, while pub/sub costs one subscription per process and
//! leaves the multiplexed connection free. Pub/sub is fire-and-forget, so nothing relies on
//! it alone: every waiter also sleeps at most until the lease it saw runs out and then
//! looks again. That covers a lost message, a reconnect, and a holder that crashed without
//! releasing — its lease expires and the queue is served from the next attempt. A waiter's
//! queue entry carries its deadline, so the entries of waiters that died are skipped.
//!
//! # Fencing tokens that never repeat
//! A key's counter starts from the store's clock in microseconds, then counts up by one
//! per grant. A counter the store lost (Redis restarted without persistence; the embedded
//! mode's process restarted) or forgot once its key went idle (Redis and memcached expire
//! it, the in-process table prunes it: [`LockService::prune_idle`]) starts again from the
//! clock — above every token it handed out before, since a key is granted at most once a
//! microsecond — so no two grants carry the same token unless the store's clock steps back
//! across the loss. The protected
//! store refuses any token not newer than the last it accepted, whatever happens to the
//! clock; [`LockService::raise_fencing`] then lifts the counter above it.
//!
//! # Limits
//! One Redis server: if it restarts without persistence, locks held at that moment are
//! forgotten (two holders may overlap) and counters restart from the clock — the fencing
//! check in the protected store is what keeps that safe. A Redis Cluster or Sentinel
//! (`redis_link.rs`) fails a dead master over to its replica, which may lack the last
//! grants (replication is asynchronous): the same fencing check, and
//! [`LockService::raise_fencing`], keep that safe too.

mod backend;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod guard;
mod in_process;
mod memcached;
mod mysql;
mod open;
mod postgres;
#[cfg(feature = "demo")]
pub mod recipes;
mod redis_backend;
mod redis_link;
#[cfg(feature = "demo")]
mod redlock;
mod service;
mod slot;
mod token;
mod turns;
mod zookeeper;

#[cfg(feature = "test-support")]
pub mod testing;

pub use backend::{
    DEFAULT_MAX_WAITERS, DEFAULT_OP_TIMEOUT, Lease, LockBackend, LockOptions, MAX_FENCING_FLOOR,
    MAX_NOTE, MAX_TTL, MIN_TTL, Sessions,
};
pub use error::LockError;
#[cfg(feature = "etcd")]
pub use etcd::EtcdBackend;
pub use guard::LockGuard;
pub use in_process::InProcessBackend;
pub use memcached::{MemcachedBackend, MemcachedOptions};
pub use mysql::row::{MySqlRowBackend, MySqlRowOptions};
pub use mysql::table::{MySqlTableBackend, MySqlTableOptions};
pub use open::{in_process, open};
pub use postgres::{PostgresBackend, PostgresOptions};
pub use redis_backend::RedisBackend;
#[cfg(feature = "demo")]
pub use redlock::{Redlock, RedlockGuard};
pub use service::LockService;
pub use token::{FencingToken, OwnerToken};
pub use zookeeper::ZooKeeperBackend;
