//! Test support: a fresh, empty database per test, PostgreSQL or SQLite.

use sqlx::Connection;
use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteConnection;

use crate::{Ledger, LedgerError, LedgerOptions};

/// Where the tests' PostgreSQL is: `DATABASE_URL`, else the local server with trust auth.
pub fn postgres_admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with its database name replaced by `database`.
pub fn with_database(url: &str, database: &str) -> Result<String, LedgerError> {
    let mut url = url::Url::parse(url)
        .map_err(|error| LedgerError::Database(sqlx::Error::Configuration(error.into())))?;
    url.set_path(&format!("/{database}"));
    Ok(url.to_string())
}

/// A database of one test's own.
#[derive(Debug)]
pub struct TestDatabase {
    url: String,
    /// Keeps the SQLite file's directory alive for the test.
    _dir: Option<tempfile::TempDir>,
}

impl TestDatabase {
    /// A new PostgreSQL database named `payonce_test_<random>` on the tests' server.
    /// `scripts/test.sh` drops leftovers of earlier runs.
    pub async fn postgres() -> Result<Self, LedgerError> {
        let admin = postgres_admin_url();
        let name = format!("payonce_test_{}", uuid::Uuid::new_v4().simple());
        let mut connection = PgConnection::connect(&admin).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut connection)
            .await?;
        connection.close().await?;
        Ok(Self {
            url: with_database(&admin, &name)?,
            _dir: None,
        })
    }

    /// A new SQLite file in a temporary directory, removed with this value.
    pub fn sqlite() -> Result<Self, std::io::Error> {
        let dir = tempfile::tempdir()?;
        let url = format!("sqlite:{}", dir.path().join("ledger.db").display());
        Ok(Self {
            url,
            _dir: Some(dir),
        })
    }

    /// The database's URL, as `Ledger::open` and `DATABASE_URL` take it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Opens the ledger on it (migrating it on first open).
    pub async fn open(&self) -> Result<Ledger, LedgerError> {
        Ledger::open(&self.url, &LedgerOptions::default()).await
    }

    /// Runs one statement behind the ledger's back, to plant what the audit must find.
    pub async fn execute(&self, statement: &str) -> Result<(), LedgerError> {
        let statement = sqlx::AssertSqlSafe(statement.to_owned());
        if self.url.starts_with("sqlite:") {
            let mut connection = SqliteConnection::connect(&self.url).await?;
            sqlx::query(statement).execute(&mut connection).await?;
        } else {
            let mut connection = PgConnection::connect(&self.url).await?;
            sqlx::query(statement).execute(&mut connection).await?;
        }
        Ok(())
    }
}
