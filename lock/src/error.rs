//! What can go wrong when taking or keeping a lock.

use std::time::Duration;

/// Errors from a lock backend or guard.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock was held by others until the caller's deadline.
    #[error("timed out after {waited:?} waiting for lock `{key}`")]
    TimedOut {
        /// The contended key.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The key already has as many waiters as it takes: the caller was not queued. A
    /// crowd on one key is turned away at once instead of slowing the store for every
    /// other key.
    #[error("lock `{key}` already has {max_waiters} waiters")]
    QueueFull {
        /// The crowded key.
        key: String,
        /// The cap it reached.
        max_waiters: usize,
    },
    /// The lock store could not be reached or did not answer in time. Nothing is known
    /// to have changed; the caller may retry.
    #[error("lock store unavailable: {reason}")]
    Unavailable {
        /// What failed, for logs; never shown to API clients.
        reason: String,
    },
    /// The lock was ours but is not any more (expired, deleted or taken over).
    #[error("lock `{key}` was lost")]
    Lost {
        /// The key whose lease was lost.
        key: String,
    },
    /// The request itself was malformed (a zero TTL, an empty key).
    #[error("invalid lock request: {0}")]
    Invalid(String),
}

impl LockError {
    pub(crate) fn unavailable(reason: impl std::fmt::Display) -> Self {
        Self::Unavailable {
            reason: reason.to_string(),
        }
    }
}

#[cfg(feature = "redis")]
impl From<redis::RedisError> for LockError {
    fn from(error: redis::RedisError) -> Self {
        Self::unavailable(error)
    }
}
