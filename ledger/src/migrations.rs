//! The schema's migrations, embedded by `build.rs` and run when a ledger is opened.

use std::borrow::Cow;

use sqlx::SqlStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/migrations.rs"));
}

/// `migrations/postgres`, in version order.
pub(crate) fn postgres() -> Migrator {
    migrator(embedded::POSTGRES)
}

/// `migrations/sqlite`, in version order.
pub(crate) fn sqlite() -> Migrator {
    migrator(embedded::SQLITE)
}

/// Each file as sqlx reads a migrations directory: the checksum of its text, and a file
/// that opens with `-- no-transaction` run outside a transaction.
fn migrator(files: &'static [(i64, &'static str, &'static str)]) -> Migrator {
    Migrator::with_migrations(
        files
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    Cow::Borrowed(description),
                    MigrationType::Simple,
                    SqlStr::from_static(sql),
                    sql.starts_with("-- no-transaction"),
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// What sqlx itself reads from the directory: a database migrated by either keeps its
    /// history (sqlx refuses to go on when an applied migration's checksum changed).
    async fn as_sqlx_reads(directory: &str) -> Vec<(i64, String, Vec<u8>, bool)> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(directory);
        let migrator = Migrator::new(path.as_path())
            .await
            .expect("the directory reads");
        summary(&migrator)
    }

    fn summary(migrator: &Migrator) -> Vec<(i64, String, Vec<u8>, bool)> {
        migrator
            .iter()
            .map(|m| {
                (
                    m.version,
                    m.description.to_string(),
                    m.checksum.to_vec(),
                    m.no_tx,
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn every_file_is_embedded_as_sqlx_would_read_it() {
        for (embedded, directory) in [
            (postgres(), "../migrations/postgres"),
            (sqlite(), "../migrations/sqlite"),
        ] {
            let read = as_sqlx_reads(directory).await;
            assert!(read.len() >= 10, "{directory}: {read:?}");
            assert_eq!(summary(&embedded), read, "{directory}");
        }
    }
}
