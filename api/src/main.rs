//! The payonce HTTP service. (Being built; see the issue tracker.)

fn main() {
    eprintln!("payonce: not built yet");
    std::process::exit(2);
}
