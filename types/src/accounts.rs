//! `POST /v1/accounts` and `GET /v1/accounts/{id}`.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::integral;

/// A request to open an account.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewAccountRequest {
    /// 1 to 100 characters, none of them NUL.
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 100,
            pattern = "^[^\\u0000]*$",
            example = "Ada"
        )
    )]
    pub name: String,
    /// Opening balance in minor units.
    #[serde(default, deserialize_with = "integral")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, default = 0))]
    pub balance: i64,
    /// Opening points.
    #[serde(default, deserialize_with = "integral")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, default = 0))]
    pub points: i64,
}

/// An account.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AccountView {
    /// Its id.
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// Money, in minor units.
    pub balance: i64,
    /// Points.
    pub points: i64,
    /// When it was opened (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: OffsetDateTime,
}

/// A new account, with its API key: shown this once, stored only as a hash.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedAccount {
    /// Its id.
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// Opening balance.
    pub balance: i64,
    /// Opening points.
    pub points: i64,
    /// Send as `Authorization: Bearer <api_key>`. Not retrievable later — but by
    /// repeating a create sent with an `Idempotency-Key`, within the retention.
    pub api_key: String,
    /// When it was opened (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: OffsetDateTime,
}
