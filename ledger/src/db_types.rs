//! Column types that differ between the two databases, behind one Rust type each; the
//! identifiers as columns; rows read into structs.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::sqlite::{SqliteArgumentsBuffer, SqliteTypeInfo, SqliteValueRef};
use sqlx::{Decode, Encode, Postgres, Sqlite, Type};
use time::OffsetDateTime;

/// A point in time, to the microsecond: `TIMESTAMPTZ` in PostgreSQL, `INTEGER`
/// microseconds since the Unix epoch in SQLite (where text timestamps of varying precision
/// would not compare correctly).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Timestamp(pub OffsetDateTime);

impl Timestamp {
    /// The current time, truncated to what both databases store.
    pub fn now() -> Self {
        Self::truncated(OffsetDateTime::now_utc())
    }

    pub fn truncated(at: OffsetDateTime) -> Self {
        let micros = at.microsecond();
        Self(at.replace_nanosecond(micros * 1000).unwrap_or(at))
    }

    fn micros(self) -> i64 {
        // Within ±292,000 years of 1970 this fits.
        i64::try_from(self.0.unix_timestamp_nanos() / 1000).unwrap_or(i64::MAX)
    }

    fn from_micros(micros: i64) -> Result<Self, BoxDynError> {
        Ok(Self(OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(micros) * 1000,
        )?))
    }
}

impl Type<Postgres> for Timestamp {
    fn type_info() -> PgTypeInfo {
        <OffsetDateTime as Type<Postgres>>::type_info()
    }
}

impl Encode<'_, Postgres> for Timestamp {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <OffsetDateTime as Encode<Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl Decode<'_, Postgres> for Timestamp {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        Ok(Self(<OffsetDateTime as Decode<Postgres>>::decode(value)?))
    }
}

impl Type<Sqlite> for Timestamp {
    fn type_info() -> SqliteTypeInfo {
        <i64 as Type<Sqlite>>::type_info()
    }
}

impl Encode<'_, Sqlite> for Timestamp {
    fn encode_by_ref(&self, buf: &mut SqliteArgumentsBuffer) -> Result<IsNull, BoxDynError> {
        <i64 as Encode<Sqlite>>::encode(self.micros(), buf)
    }
}

impl Decode<'_, Sqlite> for Timestamp {
    fn decode(value: SqliteValueRef<'_>) -> Result<Self, BoxDynError> {
        Self::from_micros(<i64 as Decode<Sqlite>>::decode(value)?)
    }
}

/// A JSON document stored as exactly this text: `JSON` in PostgreSQL, `TEXT` in SQLite.
/// What the group commit's statement stores is its own text too (`batch.rs`), so a body is
/// stored byte for byte the same whichever path wrote it. (sqlx's `Json` is sent to
/// PostgreSQL as `JSONB`, which a `JSON` column keeps as PostgreSQL's rendering of it:
/// keys reordered by length, spaces added.)
#[derive(Clone, Copy, Debug)]
pub(crate) struct JsonText<'a>(pub &'a str);

/// PostgreSQL's `json` type.
const PG_JSON: PgTypeInfo = PgTypeInfo::with_oid(sqlx::postgres::types::Oid(114));

impl Type<Postgres> for JsonText<'_> {
    fn type_info() -> PgTypeInfo {
        PG_JSON
    }
}

impl Encode<'_, Postgres> for JsonText<'_> {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        // A `json` value's binary form is its text.
        <&str as Encode<Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl Type<Sqlite> for JsonText<'_> {
    fn type_info() -> SqliteTypeInfo {
        <str as Type<Sqlite>>::type_info()
    }
}

impl<'q> Encode<'q, Sqlite> for JsonText<'q> {
    fn encode_by_ref(&self, buf: &mut SqliteArgumentsBuffer) -> Result<IsNull, BoxDynError> {
        <&str as Encode<Sqlite>>::encode_by_ref(&self.0, buf)
    }
}

/// Defines an identifier: a UUID in a newtype, compared, hashed and (de)serialised as the
/// UUID, shown as it, with `random()` for a fresh one — and a column of either database,
/// the UUID it holds: what `#[derive(sqlx::Type)] #[sqlx(transparent)]` would write,
/// without sqlx's proc-macro crate and the second compile of sqlx it brings (see
/// `build.rs`). The doc comment written before `struct` is the type's own.
macro_rules! identifier {
    ($(#[$meta:meta])* $vis:vis struct $id:ident;) => {
        $(#[$meta])*
        #[derive(
            Clone,
            Copy,
            Debug,
            PartialEq,
            Eq,
            Hash,
            PartialOrd,
            Ord,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        #[serde(transparent)]
        $vis struct $id(pub ::uuid::Uuid);

        impl $id {
            /// A fresh random identifier.
            pub fn random() -> Self {
                Self(::uuid::Uuid::new_v4())
            }
        }

        impl ::std::fmt::Display for $id {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                ::std::fmt::Display::fmt(&self.0, f)
            }
        }

        impl<DB: ::sqlx::Database> ::sqlx::Type<DB> for $id
        where
            ::uuid::Uuid: ::sqlx::Type<DB>,
        {
            fn type_info() -> DB::TypeInfo {
                <::uuid::Uuid as ::sqlx::Type<DB>>::type_info()
            }

            fn compatible(ty: &DB::TypeInfo) -> bool {
                <::uuid::Uuid as ::sqlx::Type<DB>>::compatible(ty)
            }
        }

        impl<'q, DB: ::sqlx::Database> ::sqlx::Encode<'q, DB> for $id
        where
            ::uuid::Uuid: ::sqlx::Encode<'q, DB>,
        {
            fn encode_by_ref(
                &self,
                buf: &mut <DB as ::sqlx::Database>::ArgumentBuffer,
            ) -> Result<::sqlx::encode::IsNull, ::sqlx::error::BoxDynError> {
                <::uuid::Uuid as ::sqlx::Encode<'q, DB>>::encode_by_ref(&self.0, buf)
            }

            fn produces(&self) -> Option<DB::TypeInfo> {
                <::uuid::Uuid as ::sqlx::Encode<'q, DB>>::produces(&self.0)
            }

            fn size_hint(&self) -> usize {
                <::uuid::Uuid as ::sqlx::Encode<'q, DB>>::size_hint(&self.0)
            }
        }

        impl<'r, DB: ::sqlx::Database> ::sqlx::Decode<'r, DB> for $id
        where
            ::uuid::Uuid: ::sqlx::Decode<'r, DB>,
        {
            fn decode(
                value: <DB as ::sqlx::Database>::ValueRef<'r>,
            ) -> Result<Self, ::sqlx::error::BoxDynError> {
                Ok(Self(<::uuid::Uuid as ::sqlx::Decode<'r, DB>>::decode(value)?))
            }
        }

        impl ::sqlx::postgres::PgHasArrayType for $id {
            fn array_type_info() -> ::sqlx::postgres::PgTypeInfo {
                <::uuid::Uuid as ::sqlx::postgres::PgHasArrayType>::array_type_info()
            }
        }
    };
}

pub(crate) use identifier;

/// A struct read from a row by column name, one field a column of the same name, on
/// either database — what `#[derive(sqlx::FromRow)]` would write (see `identifier`).
macro_rules! from_row {
    ($(#[$meta:meta])* $vis:vis struct $name:ident {
        $($(#[$field_meta:meta])* $field_vis:vis $field:ident: $ty:ty),* $(,)?
    }) => {
        $(#[$meta])*
        $vis struct $name {
            $($(#[$field_meta])* $field_vis $field: $ty),*
        }

        impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for $name
        where
            &'static str: sqlx::ColumnIndex<R>,
            $($ty: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,)*
        {
            fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
                Ok(Self {
                    $($field: row.try_get(stringify!($field))?),*
                })
            }
        }
    };
}

pub(crate) use from_row;
