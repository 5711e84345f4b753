//! The load generator and auditor. (Being built; see the issue tracker.)

fn main() {
    eprintln!("loadtest: not built yet");
    std::process::exit(2);
}
