//! Embeds the migrations: writes `$OUT_DIR/migrations.rs`, one `(version, description,
//! SQL)` a file of `migrations/postgres` and `migrations/sqlite`, in version order, named
//! as sqlx names them (`0003_orders.sql`: version 3, "orders") so that databases migrated
//! before keep their history. Done here rather than by `sqlx::migrate!` because that macro
//! brings sqlx's proc-macro crate, which compiles sqlx, both drivers and SQLite a second
//! time for the compiler's host — a third of a cold release build.

use std::fmt::Write as _;
use std::path::Path;
use std::{env, fs};

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
    let mut out = String::new();
    for database in ["postgres", "sqlite"] {
        let dir = Path::new(&env::var("CARGO_MANIFEST_DIR").expect("set by cargo"))
            .join("../migrations")
            .join(database);
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut files: Vec<(i64, String, String)> = fs::read_dir(&dir)
            .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
            .map(|entry| entry.expect("a readable directory").path())
            .filter_map(|path| {
                let name = path.file_name()?.to_str()?.to_owned();
                let (version, rest) = name.split_once('_')?;
                let description = rest.strip_suffix(".sql")?.replace('_', " ");
                let version = version
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: the name starts with its version"));
                let path = path.canonicalize().expect("the file exists");
                Some((version, description, path.display().to_string()))
            })
            .collect();
        files.sort();
        writeln!(
            out,
            "pub(crate) const {}: &[(i64, &str, &str)] = &[",
            database.to_uppercase()
        )
        .expect("a String takes writes");
        for (version, description, path) in files {
            writeln!(
                out,
                "    ({version}, {description:?}, include_str!({path:?})),"
            )
            .expect("a String takes writes");
        }
        out.push_str("];\n");
    }
    let target = Path::new(&env::var("OUT_DIR").expect("set by cargo")).join("migrations.rs");
    fs::write(&target, out).unwrap_or_else(|error| panic!("{}: {error}", target.display()));
}
