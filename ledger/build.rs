//! `sqlx::migrate!` embeds the migrations at compile time but cannot tell cargo to rebuild
//! when one is added: this does.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
