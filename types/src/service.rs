//! The service's own answers: `/healthz`, `/readyz`, and the problem document every error
//! body is.

use serde::{Deserialize, Serialize};

/// Liveness.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    /// Always `ok` when the process answers.
    #[cfg_attr(feature = "openapi", schema(example = "ok"))]
    pub status: String,
}

/// What readiness found.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Readiness {
    /// `ready`.
    #[cfg_attr(feature = "openapi", schema(example = "ready"))]
    pub status: String,
    /// `ok`, or why the database did not answer.
    pub database: String,
    /// `ok`, or why the lock store did not answer.
    pub lock_store: String,
}
