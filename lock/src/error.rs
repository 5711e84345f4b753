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

impl From<redis::RedisError> for LockError {
    fn from(error: redis::RedisError) -> Self {
        Self::unavailable(error)
    }
}
